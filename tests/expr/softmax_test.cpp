// ts::softmax and ts::log_softmax on CPU against float64 results computed here by hand-written
// loops over the inputs' logical values (to_vector): every dimension of 1-D to 4-D inputs, negative
// dimensions, non-contiguous inputs and lazy expressions, every floating dtype and integer inputs,
// large values, -inf and rows of -inf, 0-dim and empty inputs, several threads, one pass that
// allocates only the output, and the errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "element_check.hpp"
#include "tessera/expr.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/tensor/factories.hpp"

namespace softmax_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr float finf = std::numeric_limits<float>::infinity();

template <class T>
double to_double(T value) {
  if constexpr (std::is_same_v<T, ts::half> || std::is_same_v<T, ts::bfloat16>) {
    return static_cast<double>(static_cast<float>(value));
  } else {
    return static_cast<double>(value);
  }
}

template <class T>
std::vector<double> values_of(const ts::Tensor<T>& t) {
  std::vector<double> out;
  for (T v : t.to_vector()) out.push_back(to_double(v));
  return out;
}

// Uniform in [-scale, scale), rounded to T.
template <class T>
ts::Tensor<T> random_tensor(const ts::Shape& shape, std::mt19937& rng, float scale = 4.0f) {
  std::vector<T> values(static_cast<std::size_t>(shape.numel()));
  std::uniform_real_distribution<float> u(-scale, scale);
  for (auto& v : values) v = T(u(rng));
  return ts::from_vector<T>(values, shape);
}

// softmax (or log_softmax) of row-major values `x` of `shape` along `dim`, in float64.
std::vector<double> reference(const std::vector<double>& x, const ts::Shape& shape, int dim,
                              bool log) {
  std::int64_t outer = 1, inner = 1;
  const std::int64_t extent = shape.size() == 0 ? 1 : shape[dim];
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (int d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<double> out(x.size());
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      auto at = [&](std::int64_t r) {
        return static_cast<std::size_t>((o * extent + r) * inner + i);
      };
      double m = -inf;
      for (std::int64_t r = 0; r < extent; ++r) m = std::max(m, x[at(r)]);
      double s = 0;
      for (std::int64_t r = 0; r < extent; ++r) s += std::exp(x[at(r)] - m);
      for (std::int64_t r = 0; r < extent; ++r) {
        out[at(r)] = log ? x[at(r)] - m - std::log(s) : std::exp(x[at(r)] - m) / s;
      }
    }
  }
  return out;
}

template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, ts::half>) return std::ldexp(1.0, -11);
  if constexpr (std::is_same_v<T, ts::bfloat16>) return std::ldexp(1.0, -8);
  if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -24);
  return std::ldexp(1.0, -53);
}

// Probabilities have a small relative error (exp and the row sum in the compute type, one
// rounding to the output dtype); log-probabilities an absolute one, relative to the magnitudes of
// x - max and log(sum).
template <class In, class F>
void check_softmax(const ts::Tensor<F>& got, const std::vector<double>& x, const ts::Shape& shape,
                   int dim, bool log) {
  REQUIRE(got.shape() == shape);
  const auto want = reference(x, shape, dim, log);
  const auto values = values_of(got);
  const double compute = std::is_same_v<F, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  // exp(x - m) amplifies the error of x - m by |x - m|.
  const double spread = 64.0;
  tessera_test::check_each(
      values.size(),
      [&](std::size_t i) {
        if (std::isnan(want[i])) return std::isnan(values[i]);
        if (std::isinf(want[i])) return values[i] == want[i];
        if (log) {
          return std::abs(values[i] - want[i]) <= 2 * unit_roundoff<F>() * std::abs(want[i]) +
                                                       spread * compute * (std::abs(want[i]) + 16);
        }
        return std::abs(values[i] - want[i]) <=
               (2 * unit_roundoff<F>() + spread * compute) * std::abs(want[i]) + 1e-300;
      },
      [&](std::ostream& out, std::size_t i) {
        out << "got " << values[i] << ", want " << want[i] << " (dim " << dim << ", log " << log
            << ")";
      });
}

// Both functions along every dimension (both spellings) of `x`, whose logical values are `values`.
template <class T, class X>
void check_every_dim(const X& x, const std::vector<double>& values, const ts::Shape& shape) {
  for (int dim = 0; dim < std::max(shape.size(), 1); ++dim) {
    const int rank = std::max(shape.size(), 1);
    for (const int spelled : {dim, dim - rank}) {
      INFO("shape " << shape << ", dim " << spelled);
      check_softmax<T>(ts::softmax(x, spelled), values, shape, dim, false);
      check_softmax<T>(ts::log_softmax(x, spelled), values, shape, dim, true);
    }
  }
}

struct thread_count_scope {
  explicit thread_count_scope(int threads) : saved(ts::cpu::num_threads()) {
    ts::cpu::set_num_threads(threads);
  }
  ~thread_count_scope() { ts::cpu::set_num_threads(saved); }
  int saved;
};

}  // namespace

TEMPLATE_TEST_CASE("softmax and log_softmax along every dimension match float64 loops", "[softmax]",
                   float, double, ts::half, ts::bfloat16) {
  std::mt19937 rng(3);
  for (const ts::Shape& shape : std::vector<ts::Shape>{{7}, {5, 6}, {3, 4, 5}, {2, 3, 4, 5}}) {
    auto x = random_tensor<TestType>(shape, rng);
    check_every_dim<TestType>(x, values_of(x), shape);
    STATIC_REQUIRE(std::is_same_v<decltype(ts::softmax(x, 0)), ts::Tensor<TestType>>);
  }
}

TEST_CASE("softmax rows sum to one", "[softmax]") {
  std::mt19937 rng(5);
  auto x = random_tensor<float>({6, 9, 11}, rng, 20.0f);
  for (int dim = 0; dim < 3; ++dim) {
    const auto p = values_of(ts::softmax(x, dim));
    const ts::Shape shape = x.shape();
    std::int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; ++d) outer *= shape[d];
    for (int d = dim + 1; d < 3; ++d) inner *= shape[d];
    for (std::int64_t o = 0; o < outer; ++o) {
      for (std::int64_t i = 0; i < inner; ++i) {
        double total = 0;
        for (std::int64_t r = 0; r < shape[dim]; ++r) {
          const double v = p[static_cast<std::size_t>((o * shape[dim] + r) * inner + i)];
          CHECK(v >= 0.0);
          total += v;
        }
        CHECK(std::abs(total - 1.0) < 1e-5);
      }
    }
  }
}

TEST_CASE("softmax of non-contiguous inputs and of expressions", "[softmax]") {
  std::mt19937 rng(7);
  auto base = random_tensor<float>({4, 5, 6}, rng);
  for (const auto& v : {base.transpose(0, 2), base.permute({1, 2, 0}), base.narrow(2, 1, 4),
                        random_tensor<float>({1, 6}, rng).expand({5, 6})}) {
    INFO("shape " << v.shape() << ", strides " << v.strides());
    check_every_dim<float>(v, values_of(v), v.shape());
  }
  auto a = random_tensor<float>({6, 5}, rng);
  auto row = random_tensor<float>({5}, rng);
  const auto va = values_of(a), vr = values_of(row);
  std::vector<double> expression;
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 5; ++j) {
      expression.push_back(va[static_cast<std::size_t>(i * 5 + j)] * 2.0 +
                           vr[static_cast<std::size_t>(j)]);
    }
  }
  check_every_dim<float>(a * 2.0f + row, expression, ts::Shape{6, 5});
  std::vector<double> transposed(30);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 5; ++j)
      transposed[static_cast<std::size_t>(j * 6 + i)] = va[static_cast<std::size_t>(i * 5 + j)];
  check_every_dim<float>(a.t() * 1.0f, transposed, ts::Shape{5, 6});
}

TEST_CASE("integer inputs give float32 probabilities", "[softmax]") {
  auto x = ts::from_vector<std::int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto p = ts::softmax(x, 1);
  STATIC_REQUIRE(std::is_same_v<decltype(p), ts::Tensor<float>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::log_softmax(x > 2, 0)), ts::Tensor<float>>);
  check_softmax<std::int32_t>(p, {1, 2, 3, 4, 5, 6}, {2, 3}, 1, false);
  check_softmax<std::int32_t>(ts::log_softmax(x, 0), {1, 2, 3, 4, 5, 6}, {2, 3}, 0, true);
}

TEST_CASE("softmax is stable for large values and handles -inf as PyTorch does", "[softmax]") {
  auto large = ts::from_vector<float>({1000, 1001, 1002, -1000, 0, 1000}, {2, 3});
  check_softmax<float>(ts::softmax(large, 1), values_of(large), {2, 3}, 1, false);
  check_softmax<float>(ts::log_softmax(large, 1), values_of(large), {2, 3}, 1, true);
  check_softmax<float>(ts::softmax(large, 0), values_of(large), {2, 3}, 0, false);
  for (float v : ts::softmax(large * 80.0f, 1).to_vector()) CHECK(std::isfinite(v));
  auto big_half = ts::from_vector<ts::half>({ts::half(60000.0f), ts::half(65000.0f)}, {2});
  const auto p = values_of(ts::softmax(big_half, 0));
  CHECK(p[0] == 0.0);
  CHECK(p[1] == 1.0);

  auto x = ts::from_vector<float>({0, -finf, 1, -finf, -finf, -finf}, {2, 3});
  const auto probabilities = ts::softmax(x, 1).to_vector();
  CHECK(probabilities[1] == 0.0f);
  CHECK(std::abs(probabilities[0] + probabilities[2] - 1.0f) < 1e-6f);
  for (int i = 3; i < 6; ++i) CHECK(std::isnan(probabilities[static_cast<std::size_t>(i)]));
  const auto logs = ts::log_softmax(x, 1).to_vector();
  CHECK(logs[1] == -finf);
  CHECK(std::isfinite(logs[0]));
  for (int i = 3; i < 6; ++i) CHECK(std::isnan(logs[static_cast<std::size_t>(i)]));
  const auto nan_row =
      ts::softmax(ts::from_vector<float>({1, std::nanf(""), 2}, {3}), 0).to_vector();
  for (float v : nan_row) CHECK(std::isnan(v));
}

TEST_CASE("softmax of 0-dim, empty and size-1 dimensions", "[softmax]") {
  auto scalar = ts::full<float>({}, 3.0f);
  CHECK(ts::softmax(scalar, 0).dim() == 0);
  CHECK(ts::softmax(scalar, 0).item() == 1.0f);
  CHECK(ts::softmax(scalar, -1).item() == 1.0f);
  CHECK(ts::log_softmax(scalar, 0).item() == 0.0f);
  CHECK(ts::softmax(ts::zeros<float>({0, 4}), 1).shape() == ts::Shape{0, 4});
  CHECK(ts::softmax(ts::zeros<float>({3, 0}), 1).shape() == ts::Shape{3, 0});
  CHECK(ts::log_softmax(ts::zeros<float>({0, 4}), 0).shape() == ts::Shape{0, 4});
  CHECK(ts::softmax(ts::ones<float>({3, 1}), 1).to_vector() == std::vector<float>{1, 1, 1});
  CHECK(ts::log_softmax(ts::ones<float>({1, 3}), 0).to_vector() == std::vector<float>{0, 0, 0});
}

TEST_CASE("larger softmax inputs cross tiles and threads", "[softmax][threads]") {
  std::mt19937 rng(9);
  for (const int threads : {1, 3}) {
    thread_count_scope scope(threads);
    for (const ts::Shape& shape : std::vector<ts::Shape>{{3, 5000}, {300, 270}, {20, 3, 700}}) {
      INFO("threads " << threads << ", shape " << shape);
      auto x = random_tensor<float>(shape, rng);
      check_every_dim<float>(x, values_of(x), shape);
      auto t = x.transpose(0, shape.size() - 1);
      check_every_dim<float>(t, values_of(t), t.shape());
    }
  }
}

TEST_CASE("softmax allocates only its output and runs one pass", "[softmax][fusion]") {
  std::mt19937 rng(11);
  auto a = random_tensor<float>({200, 300}, rng);
  auto row = random_tensor<float>({300}, rng);
  const ts::Device d = a.device();
  auto check_one_pass = [&](auto&& run, const char* what) {
    INFO(what);
    const auto allocations = ts::memory::stats(d).allocations.allocated;
    const auto launches = ts::profiler::kernel_launches();
    auto result = run();
    CHECK(ts::memory::stats(d).allocations.allocated == allocations + 1);
    CHECK(ts::profiler::kernel_launches() == launches + 1);
    CHECK(result.numel() == a.numel());
  };
  check_one_pass([&] { return ts::softmax(a * 2.0f + row, 1); }, "softmax, last dimension");
  check_one_pass([&] { return ts::softmax(a - row, 0); }, "softmax, first dimension");
  check_one_pass([&] { return ts::log_softmax((a.t() * 3.0f), 1); }, "log_softmax, strided");
  check_one_pass([&] { return ts::log_softmax(a, -2); }, "log_softmax, first dimension");
}

TEST_CASE("softmax errors name the dimension and the rank", "[softmax][errors]") {
  auto x = ts::ones<float>({2, 3});
  CHECK_THROWS_AS(ts::softmax(x, 2), ts::shape_error);
  CHECK_THROWS_WITH(ts::softmax(x, 2), Catch::Contains("softmax: dimension 2 is out of range for "
                                                       "a tensor of 2 dimensions"));
  CHECK_THROWS_WITH(ts::log_softmax(x * x, -3), Catch::Contains("log_softmax: dimension -3"));
  CHECK_THROWS_WITH(ts::softmax(ts::full<float>({}, 1.0f), 1), Catch::Contains("0 dimensions"));
}

}  // namespace softmax_test
