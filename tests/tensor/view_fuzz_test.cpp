// A seeded fuzz test of shapes and views against PyTorch (tests/oracles/views_torch.py, through
// Debian's python3-torch): random start shapes with zero extents, random chains of permute,
// transpose, narrow, select, view, reshape, expand, unsqueeze, squeeze, flatten and contiguous
// with arguments that are sometimes out of range, negative or huge (element counts that
// overflow 64 bits). Tessera must refuse exactly the steps PyTorch refuses (with a Tessera
// error, leaving the tensor as it was), and otherwise give PyTorch's shape and elements.
// TESSERA_RANDOM_SEED changes the seed; the chain count bounds the time (about a second).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/tessera.hpp"

#ifndef TESSERA_ORACLE_PYTHON
#define TESSERA_ORACLE_PYTHON "/usr/bin/python3"
#endif

namespace view_fuzz_test {

namespace ts = tessera;

struct step {
  std::string op;
  std::vector<std::int64_t> args;
};
struct chain {
  std::vector<std::int64_t> start;
  std::vector<step> steps;
};

// 3 * W * 3 wraps to 6 modulo 2^64: a view argument that an unchecked product would accept.
constexpr std::int64_t W = 6148914691236517206;

class generator {
 public:
  explicit generator(std::uint64_t seed) : random_(seed) {}

  chain make() {
    chain c;
    const int rank = pick(1, 4);
    for (int d = 0; d < rank; ++d) c.start.push_back(pick(0, 9) == 0 ? 0 : pick(1, 4));
    std::vector<std::int64_t> shape = c.start;  // tracked loosely, to aim most steps in range
    const int length = pick(1, 6);
    for (int i = 0; i < length; ++i) c.steps.push_back(make_step(shape));
    return c;
  }

 private:
  int pick(int low, int high) { return std::uniform_int_distribution<int>(low, high)(random_); }
  bool rarely() { return pick(0, 7) == 0; }
  std::int64_t dim_of(const std::vector<std::int64_t>& shape, int extra = 0) {
    const int rank = static_cast<int>(shape.size()) + extra;
    if (rarely() || rank == 0) return pick(-rank - 2, rank + 1);  // sometimes out of range
    return pick(-rank, rank - 1);
  }
  static std::int64_t numel(const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }

  step make_step(std::vector<std::int64_t>& shape) {
    const int rank = static_cast<int>(shape.size());
    switch (pick(0, 10)) {
      case 0: {  // permute
        std::vector<std::int64_t> order(static_cast<std::size_t>(rank));
        for (int d = 0; d < rank; ++d) order[static_cast<std::size_t>(d)] = d;
        std::shuffle(order.begin(), order.end(), random_);
        if (rarely() && rank > 1) order[0] = order[1];  // a repeated dimension
        std::vector<std::int64_t> next;
        for (auto d : order) next.push_back(shape[static_cast<std::size_t>(d)]);
        shape = next;
        return {"permute", order};
      }
      case 1: {
        const auto a = dim_of(shape), b = dim_of(shape);
        return {"transpose", {a, b}};
      }
      case 2: {
        const auto d = dim_of(shape);
        const std::int64_t extent =
            d >= -rank && d < rank ? shape[static_cast<std::size_t>(d < 0 ? d + rank : d)] : 3;
        std::int64_t start = pick(0, static_cast<int>(extent));
        std::int64_t length = pick(0, static_cast<int>(extent - start));
        if (rarely()) start = -pick(1, 4);
        if (rarely()) length = pick(0, 1) ? INT64_MAX : extent + 1;
        if (d >= -rank && d < rank && start >= 0 && length <= extent - start) {
          shape[static_cast<std::size_t>(d < 0 ? d + rank : d)] = length;
        }
        return {"narrow", {d, start, length}};
      }
      case 3: {
        const auto d = dim_of(shape);
        const std::int64_t extent =
            d >= -rank && d < rank ? shape[static_cast<std::size_t>(d < 0 ? d + rank : d)] : 2;
        const std::int64_t index = pick(static_cast<int>(-extent - 1), static_cast<int>(extent));
        if (d >= -rank && d < rank && index >= -extent && index < extent) {
          shape.erase(shape.begin() + (d < 0 ? d + rank : d));
        }
        return {"select", {d, index}};
      }
      case 4:
      case 5: {  // view or reshape to a regrouping of the element count
        std::vector<std::int64_t> target;
        std::int64_t remaining = numel(shape);
        const int parts = pick(1, 3);
        for (int i = 0; i + 1 < parts; ++i) {
          std::int64_t f = 1;
          for (std::int64_t k : {2, 3, 4}) {
            if (remaining % k == 0 && pick(0, 1)) {
              f = k;
              break;
            }
          }
          target.push_back(f);
          remaining = f == 0 ? remaining : remaining / f;
        }
        target.push_back(remaining);
        if (pick(0, 2) == 0) target[static_cast<std::size_t>(pick(0, parts - 1))] = -1;
        if (rarely()) target = {3, W, 3};                  // overflowing element count
        else if (rarely()) target.push_back(pick(2, 3));  // wrong element count
        if (std::count(target.begin(), target.end(), W) == 0 &&
            std::count(target.begin(), target.end(), -1) == 0 && numel(target) == numel(shape)) {
          shape = target;
        }
        return {pick(0, 1) ? "view" : "reshape", target};
      }
      case 6: {  // expand: leading new dimensions and extent-1 dimensions grown
        std::vector<std::int64_t> target;
        if (pick(0, 1)) target.push_back(pick(1, 3));
        for (auto e : shape) target.push_back(e == 1 ? pick(1, 3) : (pick(0, 3) == 0 ? -1 : e));
        if (rarely() && !target.empty()) target.back() += 1;  // not expandable
        return {"expand", target};
      }
      case 7: {
        const auto d = dim_of(shape, 1);
        return {"unsqueeze", {d}};
      }
      case 8: {
        const auto d = dim_of(shape);
        return {"squeeze", {d}};
      }
      case 9: {
        const auto a = dim_of(shape), b = dim_of(shape);
        return {"flatten", {a, b}};
      }
      default:
        return {"contiguous", {}};
    }
  }

  std::mt19937_64 random_;
};

ts::Tensor<double> apply(const ts::Tensor<double>& t, const step& s) {
  const auto& a = s.args;
  auto shape_of = [&] {
    ts::Shape out;
    for (auto e : a) out.push_back(e);
    return out;
  };
  if (s.op == "permute") return t.permute(shape_of());
  if (s.op == "transpose") return t.transpose(a[0], a[1]);
  if (s.op == "narrow") return t.narrow(a[0], a[1], a[2]);
  if (s.op == "select") return t.select(a[0], a[1]);
  if (s.op == "view") return t.view(shape_of());
  if (s.op == "reshape") return t.reshape(shape_of());
  if (s.op == "expand") return t.expand(shape_of());
  if (s.op == "unsqueeze") return t.unsqueeze(a[0]);
  if (s.op == "squeeze") return t.squeeze(a[0]);
  if (s.op == "flatten") return t.flatten(a[0], a[1]);
  return t.contiguous();
}

std::string text_of(const chain& c) {
  std::ostringstream out;
  out << "start";
  for (auto e : c.start) out << ' ' << e;
  for (const auto& s : c.steps) {
    out << " | " << s.op;
    for (auto v : s.args) out << ' ' << v;
  }
  return out.str();
}

TEST_CASE("random chains of views agree with PyTorch", "[tensor][views][oracle][fuzz]") {
  const char* seed_text = std::getenv("TESSERA_RANDOM_SEED");
  const std::uint64_t seed = seed_text ? std::strtoull(seed_text, nullptr, 10) : 20261123ULL;
  INFO("seed " << seed << " (set TESSERA_RANDOM_SEED to change it)");
  constexpr int chain_count = 400;
  generator generate(seed);
  std::vector<chain> chains;
  for (int i = 0; i < chain_count; ++i) chains.push_back(generate.make());

  const char* oracle_dir = std::getenv("TESSERA_ORACLE_DIR");
  const auto directory = (oracle_dir ? std::filesystem::path(oracle_dir)
                                     : std::filesystem::temp_directory_path()) /
                         "view_fuzz";
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  {
    std::ofstream out(directory / "chains.txt");
    for (const auto& c : chains) out << text_of(c) << '\n';
  }
  const std::string command = std::string(TESSERA_ORACLE_PYTHON) + " \"" + TESSERA_ORACLE_SCRIPTS +
                              "/views_torch.py\" \"" + directory.string() + "\"";
  REQUIRE(std::system(command.c_str()) == 0);
  std::ifstream answers(directory / "torch.txt");

  int refused = 0;
  for (const auto& c : chains) {
    std::string answer;
    REQUIRE(std::getline(answers, answer));
    INFO("chain: " << text_of(c) << "\ntorch: " << answer);
    ts::Shape start;
    for (auto e : c.start) start.push_back(e);
    std::vector<double> iota(static_cast<std::size_t>(start.numel()));
    for (std::size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<double>(i);
    ts::Tensor<double> t = ts::from_vector<double>(iota, start);

    int failed_at = -1;
    for (std::size_t i = 0; i < c.steps.size(); ++i) {
      const ts::Shape before = t.shape();
      try {
        t = apply(t, c.steps[i]);
      } catch (const ts::error&) {
        CHECK(t.shape() == before);  // the tensor is as it was
        failed_at = static_cast<int>(i);
        break;
      }
    }
    std::istringstream words(answer);
    std::string status;
    words >> status;
    if (status == "error") {
      int step_index = -1;
      words >> step_index;
      CHECK(failed_at == step_index);
      ++refused;
      continue;
    }
    REQUIRE(failed_at == -1);
    int rank = 0;
    words >> rank;
    ts::Shape expected_shape;
    for (int d = 0; d < rank; ++d) {
      std::int64_t e = 0;
      words >> e;
      expected_shape.push_back(e);
    }
    std::string colon;
    words >> colon;
    std::vector<double> expected;
    for (double v; words >> v;) expected.push_back(v);
    CHECK(t.shape() == expected_shape);
    CHECK(t.contiguous().to_vector() == expected);
  }
  // Both kinds of chain are exercised.
  CHECK(refused > chain_count / 10);
  CHECK(refused < chain_count * 9 / 10);
}

}  // namespace view_fuzz_test
