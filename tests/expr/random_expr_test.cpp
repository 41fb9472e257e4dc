// Random expression trees against numpy. A seeded generator builds trees (depth up to 4) of the
// elementwise operators and functions over float32, float64 and int32 tensors of broadcast-
// compatible shapes (contiguous, transposed, narrowed, permuted, expanded, 0-dim) and scalars on
// either side, evaluates each with Tessera, and writes the inputs and each tree's text to a
// directory. tests/oracles/expr_numpy.py evaluates the same trees in float64 with numpy, applies
// PyTorch's dtype rules from its own table, and bounds the rounding error of the dtype each node
// computes in; this test then compares dtype, shape and every value within that bound.
//
// Each tree node is one Tessera statement: its operands are leaves or the materialised results
// of child nodes, and the guarded forms (`x / (abs(y) + 1)`, `log(abs(x) + 1)`, ...) fuse two or
// three operations. Results are written either to a new tensor or through a permuted view of a
// reversed-shape buffer, so later nodes read non-contiguous operands too. Domains are kept where
// float32 and float64 agree: denominators >= 1, logarithms and roots of values >= 1, exp of
// values <= 3, and magnitudes below 1e7 (int32 never overflows). Comparisons of computed floats
// that the error bound cannot decide are skipped by the oracle, not guessed.
//
// Seed: TESSERA_RANDOM_SEED (default 20240601). The oracle needs Debian's python3 with numpy
// (TESSERA_ORACLE_PYTHON); without it this test fails.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "expr/elementwise_reference.hpp"
#include "tessera/tessera.hpp"

namespace random_expr_test {  // one namespace per test file: unity builds compile several together

#ifndef TESSERA_ORACLE_SCRIPTS
#error "TESSERA_ORACLE_SCRIPTS (the folder of expr_numpy.py) must be defined by the build"
#endif
#ifndef TESSERA_ORACLE_PYTHON
#define TESSERA_ORACLE_PYTHON "/usr/bin/python3"
#endif

namespace ts = tessera;

namespace {

using value = std::variant<ts::Tensor<float>, ts::Tensor<double>, ts::Tensor<std::int32_t>,
                           ts::Tensor<bool>, double, std::int64_t>;

template <class X>
inline constexpr bool is_numeric_tensor =
    std::is_same_v<X, ts::Tensor<float>> || std::is_same_v<X, ts::Tensor<double>> ||
    std::is_same_v<X, ts::Tensor<std::int32_t>>;
template <class X>
inline constexpr bool is_scalar = std::is_same_v<X, double> || std::is_same_v<X, std::int64_t>;
/// Operand pairs a binary node takes: two numeric tensors, or one and a scalar.
template <class X, class Y>
inline constexpr bool binary_pair = (is_numeric_tensor<X> && is_numeric_tensor<Y>) ||
                                    (is_numeric_tensor<X> && is_scalar<Y>) ||
                                    (is_scalar<X> && is_numeric_tensor<Y>);

/// Magnitudes above this are avoided, so int32 never overflows and int32 -> float32 is exact.
constexpr double magnitude_limit = 1e7;

struct node {
  std::string text;  // the tree in the oracle's s-expression syntax
  value result;
  double bound = 0;  // an upper bound on the magnitude of the node's values
  bool is_tensor() const { return result.index() < 4; }
};

/// Writes an expression's values into a tensor: a new one, or (permuted == true) a permuted view
/// of a buffer of the reversed shape, which later nodes then read as a non-contiguous operand.
template <class E>
value materialize(const E& expression, bool permuted) {
  using T = typename E::value_type;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, std::int32_t> || std::is_same_v<T, bool>,
                "the generator only produces these dtypes");
  const ts::Shape shape = expression.shape();
  if (!permuted || shape.size() < 2) return ts::Tensor<T>(expression);
  ts::Shape reversed;
  ts::Shape order;
  for (int d = shape.size() - 1; d >= 0; --d) {
    reversed.push_back(shape[d]);
    order.push_back(d);
  }
  auto view = ts::empty<T>(reversed).permute(order);
  REQUIRE(view.shape() == shape);
  view = expression;  // same shape: evaluated into the view's storage
  return view;
}

template <class Fn>
value apply_unary(const value& x, bool permuted, Fn&& fn) {
  return std::visit(
      [&](const auto& a) -> value {
        using A = std::remove_cvref_t<decltype(a)>;
        if constexpr (is_numeric_tensor<A>) {
          return materialize(fn(a), permuted);
        } else {
          throw std::logic_error("a unary node needs a numeric tensor operand");
        }
      },
      x);
}

template <class Fn>
value apply_binary(const value& x, const value& y, bool permuted, Fn&& fn) {
  return std::visit(
      [&](const auto& a, const auto& b) -> value {
        using A = std::remove_cvref_t<decltype(a)>;
        using B = std::remove_cvref_t<decltype(b)>;
        if constexpr (binary_pair<A, B>) {
          return materialize(fn(a, b), permuted);
        } else {
          throw std::logic_error("a binary node needs a numeric tensor and a tensor or scalar");
        }
      },
      x, y);
}

/// Like apply_binary, for nodes whose operands are always tensors (subtrees, never scalars).
template <class Fn>
value apply_tensors(const value& x, const value& y, bool permuted, Fn&& fn) {
  return std::visit(
      [&](const auto& a, const auto& b) -> value {
        using A = std::remove_cvref_t<decltype(a)>;
        using B = std::remove_cvref_t<decltype(b)>;
        if constexpr (is_numeric_tensor<A> && is_numeric_tensor<B>) {
          return materialize(fn(a, b), permuted);
        } else {
          throw std::logic_error("this node needs two numeric tensors");
        }
      },
      x, y);
}

value apply_where(const value& c, const value& x, const value& y, bool permuted) {
  const auto& condition = std::get<ts::Tensor<bool>>(c);
  return apply_binary(x, y, permuted,
                      [&](const auto& a, const auto& b) { return ts::where(condition, a, b); });
}

std::string number_text(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

class generator {
 public:
  generator(std::uint64_t seed, const std::vector<node>& leaves) : rng_(seed), leaves_(leaves) {}

  node numeric(int depth) {
    if (depth >= max_depth || (depth > 0 && uniform() < 0.15 + 0.2 * depth)) {
      return leaves_[pick(leaves_.size())];
    }
    const double r = uniform();
    if (r < 0.35) return unary(depth);
    if (r < 0.80) return binary(depth);
    if (r < 0.90) return power(depth);
    return where(depth);
  }

  node boolean(int depth) {
    static const char* const names[] = {"lt", "le", "gt", "ge", "eq", "ne"};
    auto [x, y] = operands(depth);
    const int which = static_cast<int>(pick(6));
    const bool permuted = coin();
    value result = std::visit(
        [&](const auto& a, const auto& b) -> value {
          using A = std::remove_cvref_t<decltype(a)>;
          using B = std::remove_cvref_t<decltype(b)>;
          if constexpr (binary_pair<A, B>) {
            return compare(which, a, b, permuted);
          } else {
            throw std::logic_error("a comparison needs a numeric tensor and a tensor or scalar");
          }
        },
        x.result, y.result);
    return {std::string("(") + names[which] + " " + x.text + " " + y.text + ")", std::move(result),
            1.0};
  }

  bool coin() { return uniform() < 0.5; }

 private:
  static constexpr int max_depth = 4;

  template <class A, class B>
  static value compare(int which, const A& a, const B& b, bool permuted) {
    switch (which) {
      case 0:
        return materialize(a < b, permuted);
      case 1:
        return materialize(a <= b, permuted);
      case 2:
        return materialize(a > b, permuted);
      case 3:
        return materialize(a >= b, permuted);
      case 4:
        return materialize(a == b, permuted);
      default:
        return materialize(a != b, permuted);
    }
  }

  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  std::size_t pick(std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_);
  }

  node scalar() {
    static const double floats[] = {2.5, -1.5, 0.5, 3.0, -0.25};
    static const std::int64_t ints[] = {2, 3, -1, -2, 1};
    if (coin()) {
      const double v = floats[pick(5)];
      return {"(f " + number_text(v) + ")", v, std::fabs(v)};
    }
    const std::int64_t v = ints[pick(5)];
    return {"(i " + std::to_string(v) + ")", v, std::fabs(static_cast<double>(v))};
  }

  /// Two operands of a binary node: subtrees, or a scalar on one side (never both).
  std::pair<node, node> operands(int depth) {
    const double r = uniform();
    if (r < 0.15) return {scalar(), numeric(depth + 1)};
    if (r < 0.35) return {numeric(depth + 1), scalar()};
    return {numeric(depth + 1), numeric(depth + 1)};
  }

  node unary(int depth) {
    node x = numeric(depth + 1);
    const bool permuted = coin();
    const double b = x.bound;
    auto make = [&](const char* name, double bound, auto fn) {
      return node{std::string("(") + name + " " + x.text + ")", apply_unary(x.result, permuted, fn),
                  bound};
    };
    switch (pick(13)) {
      case 0:
        return make("neg", b, [](const auto& a) { return -a; });
      case 1:
        return make("abs", b, [](const auto& a) { return ts::abs(a); });
      case 2:
        return make("relu", b, [](const auto& a) { return ts::relu(a); });
      case 3:
        return make("exp", 20.1, [](const auto& a) { return ts::exp(ts::minimum(a, 3.0)); });
      case 4:
        return make("log", std::log(b + 1), [](const auto& a) { return ts::log(ts::abs(a) + 1); });
      case 5:
        return make("sqrt", std::sqrt(b + 1),
                    [](const auto& a) { return ts::sqrt(ts::abs(a) + 1); });
      case 6:
        return make("rsqrt", 1.0, [](const auto& a) { return ts::rsqrt(ts::abs(a) + 1); });
      case 7:
        return make("sin", 1.0, [](const auto& a) { return ts::sin(a); });
      case 8:
        return make("cos", 1.0, [](const auto& a) { return ts::cos(a); });
      case 9:
        return make("tanh", 1.0, [](const auto& a) { return ts::tanh(a); });
      case 10:
        return make("sigmoid", 1.0, [](const auto& a) { return ts::sigmoid(a); });
      case 11:
        return make("castf", b, [](const auto& a) { return ts::cast<float>(a); });
      default:
        return make("castd", b, [](const auto& a) { return ts::cast<double>(a); });
    }
  }

  node binary(int depth) {
    auto [x, y] = operands(depth);
    const bool permuted = coin();
    const double bx = x.bound;
    const double by = y.bound;
    auto make = [&](const char* name, double bound, auto fn) {
      return node{std::string("(") + name + " " + x.text + " " + y.text + ")",
                  apply_binary(x.result, y.result, permuted, fn), bound};
    };
    int which = static_cast<int>(pick(6));
    // Fall back to operations that keep magnitudes in range.
    if (which == 2 && bx * by > magnitude_limit) which = 0;
    if (which <= 1 && bx + by > magnitude_limit) which = 3;
    if (which == 5 && !y.is_tensor() && bx / by > magnitude_limit) which = 3;
    switch (which) {
      case 0:
        return make("add", bx + by, [](const auto& a, const auto& b) { return a + b; });
      case 1:
        return make("sub", bx + by, [](const auto& a, const auto& b) { return a - b; });
      case 2:
        return make("mul", bx * by, [](const auto& a, const auto& b) { return a * b; });
      case 3:
        return make("max", std::max(bx, by),
                    [](const auto& a, const auto& b) { return ts::maximum(a, b); });
      case 4:
        return make("min", std::max(bx, by),
                    [](const auto& a, const auto& b) { return ts::minimum(a, b); });
      default:
        // Denominators stay >= 1 (a tensor d becomes abs(d) + 1; scalars are never 0).
        return make("div", y.is_tensor() ? bx : bx / by, [](const auto& a, const auto& b) {
          if constexpr (is_scalar<std::remove_cvref_t<decltype(b)>>) {
            return a / b;
          } else {
            return a / (ts::abs(b) + 1);
          }
        });
    }
  }

  node power(int depth) {
    const bool permuted = coin();
    node x = numeric(depth + 1);
    const double b = x.bound;
    switch (pick(3)) {
      case 0: {  // pow(x, k): integral for int32 x
        const std::int64_t k = (std::pow(b, 3) <= magnitude_limit && coin()) ? 3 : 2;
        if (std::pow(b, static_cast<double>(k)) > magnitude_limit) return x;
        return {"(powi " + x.text + " (i " + std::to_string(k) + "))",
                apply_unary(x.result, permuted, [k](const auto& a) { return ts::pow(a, k); }),
                std::pow(b, static_cast<double>(k))};
      }
      case 1: {  // pow(abs(x) + 1, s)
        static const double exponents[] = {0.5, 2.0, -1.5};
        const double s = exponents[pick(3)];
        const double bound = std::pow(b + 1, std::max(s, 0.0));
        if (bound > magnitude_limit) return x;
        return {"(powf " + x.text + " (f " + number_text(s) + "))",
                apply_unary(x.result, permuted,
                            [s](const auto& a) { return ts::pow(ts::abs(a) + 1, s); }),
                bound};
      }
      default: {  // pow(abs(x) + 1, minimum(abs(y), 2.0))
        node y = numeric(depth + 1);
        const double bound = (b + 1) * (b + 1);
        if (bound > magnitude_limit) return x;
        return {"(powt " + x.text + " " + y.text + ")",
                apply_tensors(x.result, y.result, permuted,
                              [](const auto& a, const auto& e) {
                                return ts::pow(ts::abs(a) + 1, ts::minimum(ts::abs(e), 2.0));
                              }),
                bound};
      }
    }
  }

  node where(int depth) {
    node c = boolean(depth + 1);
    auto [x, y] = operands(depth);
    const bool permuted = coin();
    return {"(where " + c.text + " " + x.text + " " + y.text + ")",
            apply_where(c.result, x.result, y.result, permuted), std::max(x.bound, y.bound)};
  }

  std::mt19937_64 rng_;
  const std::vector<node>& leaves_;
};

// ---- inputs ---------------------------------------------------------------------------------

template <class T>
ts::Tensor<T> filled(const ts::Shape& shape, std::uint64_t seed) {
  if constexpr (std::is_integral_v<T>) {
    return expr_test::sample<T>(shape, seed, -3.0, 4.0);  // floor: -3 .. 3
  } else {
    return expr_test::sample<T>(shape, seed, -4.0, 4.0);
  }
}

template <class T>
node leaf(int id, const ts::Tensor<T>& tensor) {
  double bound = 0;
  for (double v : expr_test::values(tensor).data) bound = std::max(bound, std::fabs(v));
  return {"(t " + std::to_string(id) + ")", tensor, bound};
}

/// The leaves: every shape broadcasts to [3, 4, 5]; most are views.
std::vector<node> make_leaves() {
  std::vector<node> leaves;
  int id = 0;
  auto add = [&](const auto& tensor) { leaves.push_back(leaf(id++, tensor)); };
  add(filled<float>({3, 4, 5}, 1));                          // contiguous
  add(filled<float>({5, 4}, 2).t());                         // [4, 5] transposed
  add(filled<double>({9}, 3).narrow(0, 2, 5));               // [5] narrowed
  add(filled<double>({5, 3, 4}, 4).permute({1, 2, 0}));      // [3, 4, 5] permuted
  add(filled<std::int32_t>({3, 1, 5}, 5));                   // size-1 middle dimension
  add(filled<std::int32_t>({4, 8}, 6).narrow(1, 2, 5));      // [4, 5] narrowed
  add(filled<float>({4, 1}, 7));                             // [4, 1]
  add(filled<float>({1, 4, 1}, 8).expand({3, 4, 5}));        // expanded, stride 0
  add(filled<double>({}, 9));                                // 0-dim
  add(filled<std::int32_t>({1, 4, 1}, 10));                  // [1, 4, 1]
  add(filled<float>({5, 4, 3}, 11).transpose(0, 2));         // [3, 4, 5] reversed
  add(filled<std::int32_t>({3, 5, 4}, 12).transpose(1, 2));  // [3, 4, 5]
  add(filled<double>({3, 4, 5}, 13));                        // contiguous double
  add(filled<float>({1}, 14));                               // [1]
  return leaves;
}

const char* dtype_name(const value& v) {
  return std::visit(
      [](const auto& x) -> const char* {
        using X = std::remove_cvref_t<decltype(x)>;
        if constexpr (is_scalar<X>) {
          return "scalar";
        } else {
          return ts::name(X::dtype());
        }
      },
      v);
}

expr_test::values values_of(const value& v) {
  return std::visit(
      [](const auto& x) -> expr_test::values {
        using X = std::remove_cvref_t<decltype(x)>;
        if constexpr (is_scalar<X>) {
          throw std::logic_error("a tree's result is a tensor");
        } else {
          return expr_test::values(x);
        }
      },
      v);
}

void write_values(std::ostream& out, const expr_test::values& v, const char* dtype) {
  out << dtype << ' ' << v.shape.size();
  for (int d = 0; d < v.shape.size(); ++d) out << ' ' << v.shape[d];
  out << '\n';
  for (std::size_t i = 0; i < v.data.size(); ++i) out << (i ? " " : "") << number_text(v.data[i]);
  out << '\n';
}

struct reference {
  std::string dtype;
  ts::Shape shape;
  std::vector<double> values;
  std::vector<double> bounds;
  std::vector<int> unsafe;
};

std::vector<double> parse_numbers(const std::string& line) {
  std::vector<double> out;
  std::istringstream in(line);
  std::string token;
  while (in >> token) out.push_back(std::strtod(token.c_str(), nullptr));
  return out;
}

std::vector<reference> read_references(const std::filesystem::path& file, std::size_t count) {
  std::ifstream in(file);
  std::vector<reference> out;
  std::string header;
  while (out.size() < count && std::getline(in, header)) {
    reference r;
    std::istringstream h(header);
    int rank = 0;
    h >> r.dtype >> rank;
    for (int d = 0; d < rank; ++d) {
      std::int64_t extent = 0;
      h >> extent;
      r.shape.push_back(extent);
    }
    std::string line;
    std::getline(in, line);
    r.values = parse_numbers(line);
    std::getline(in, line);
    r.bounds = parse_numbers(line);
    std::getline(in, line);
    for (double u : parse_numbers(line)) r.unsafe.push_back(static_cast<int>(u));
    out.push_back(std::move(r));
  }
  return out;
}

std::filesystem::path work_directory() {
  const char* oracle_dir = std::getenv("TESSERA_ORACLE_DIR");
  std::filesystem::path base =
      oracle_dir ? std::filesystem::path(oracle_dir) : std::filesystem::temp_directory_path();
  return base / "expr_random";
}

}  // namespace

TEST_CASE("random expression trees agree with numpy", "[expr][oracle]") {
  const char* seed_text = std::getenv("TESSERA_RANDOM_SEED");
  const std::uint64_t seed = seed_text ? std::strtoull(seed_text, nullptr, 10) : 20240601ULL;
  constexpr int tree_count = 300;
  INFO("seed " << seed << " (set TESSERA_RANDOM_SEED to change it)");

  const auto leaves = make_leaves();
  generator generate(seed, leaves);
  std::vector<node> trees;
  for (int i = 0; i < tree_count; ++i) {
    trees.push_back(generate.coin() && generate.coin() && generate.coin() ? generate.boolean(0)
                                                                          : generate.numeric(0));
  }

  const auto directory = work_directory();
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  {
    std::ofstream out(directory / "leaves.txt");
    out << leaves.size() << '\n';
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      write_values(out, values_of(leaves[i].result), dtype_name(leaves[i].result));
    }
    std::ofstream tree_file(directory / "trees.txt");
    std::ofstream results(directory / "tessera.txt");  // for a human reading a failure
    for (const auto& tree : trees) {
      tree_file << tree.text << '\n';
      write_values(results, values_of(tree.result), dtype_name(tree.result));
    }
  }

  const std::string command = std::string(TESSERA_ORACLE_PYTHON) + " \"" + TESSERA_ORACLE_SCRIPTS +
                              "/expr_numpy.py\" \"" + directory.string() + "\"";
  INFO("oracle: " << command);
  const int status = std::system(command.c_str());
  REQUIRE(status == 0);  // fails without python3 or numpy: the oracle is required
  const auto references = read_references(directory / "numpy.txt", trees.size());
  REQUIRE(references.size() == trees.size());

  std::int64_t elements = 0;
  std::int64_t checked = 0;
  std::int64_t nodes_of_each_dtype[4] = {};
  for (std::size_t t = 0; t < trees.size(); ++t) {
    const auto& tree = trees[t];
    const auto& ref = references[t];
    INFO("tree " << t << ": " << tree.text);
    const std::string dtype = dtype_name(tree.result);
    CHECK(dtype == ref.dtype);  // Tessera's promotion against the oracle's table of PyTorch's
    ++nodes_of_each_dtype[tree.result.index()];
    const auto actual = values_of(tree.result);
    REQUIRE(actual.shape == ref.shape);
    REQUIRE(ref.values.size() == actual.data.size());
    std::size_t bad = 0;
    std::ostringstream first;
    first.precision(17);
    for (std::size_t i = 0; i < actual.data.size(); ++i) {
      ++elements;
      if (ref.unsafe[i]) continue;
      ++checked;
      const double a = actual.data[i];
      const double e = ref.values[i];
      const bool ok = dtype == "float32" || dtype == "float64"
                          ? std::fabs(a - e) <= 2 * ref.bounds[i] + 1e-300
                          : a == e;
      if (!ok && bad++ == 0) {
        first << "element " << i << ": tessera " << a << ", numpy " << e << ", bound "
              << ref.bounds[i];
      }
    }
    INFO(bad << " elements differ; first " << first.str());
    CHECK(bad == 0);
  }
  INFO(checked << " of " << elements << " elements were decidable");
  CHECK(checked > elements * 9 / 10);
  // The generator reaches every result dtype.
  CHECK(nodes_of_each_dtype[0] > 0);
  CHECK(nodes_of_each_dtype[1] > 0);
  CHECK(nodes_of_each_dtype[2] > 0);
  CHECK(nodes_of_each_dtype[3] > 0);
}

}  // namespace random_expr_test
