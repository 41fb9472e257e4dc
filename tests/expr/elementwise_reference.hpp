// Test helpers for the elementwise expression tests: deterministic sample tensors, values as
// double in row-major order (read back with to_vector, so the layout under test never enters the
// reference), NumPy broadcasting done by index arithmetic, and a comparison that reports the
// first mismatching element. The references themselves are written in each test with std::
// functions in double.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/tessera.hpp"

namespace expr_test {

namespace ts = tessera;

/// A value of any dtype as double (half and bfloat16 through their exact float value).
template <class T>
double to_double(T value) {
  if constexpr (std::is_same_v<T, ts::half> || std::is_same_v<T, ts::bfloat16>) {
    return static_cast<double>(static_cast<float>(value));
  } else {
    return static_cast<double>(value);
  }
}

/// A tensor's values (row-major, logical order) and shape, as the reference reads them.
struct values {
  std::vector<double> data;
  ts::Shape shape;

  /// Reads the whole storage as one contiguous 1-D tensor and walks the view's strides here, so
  /// that no strided copy of the code under test stands between a view and its reference.
  template <class T, class K>
  explicit values(const ts::Tensor<T, K>& tensor) : shape(tensor.shape()) {
    const auto count = static_cast<std::int64_t>(tensor.storage().bytes() / sizeof(T));
    const auto storage =
        ts::Tensor<T, K>(tensor.storage(), ts::Shape{count}, ts::Strides{1}, 0).to_vector();
    for (std::int64_t flat = 0; flat < shape.numel(); ++flat) {
      std::int64_t offset = tensor.storage_offset();
      for (std::int64_t d = shape.size() - 1, rest = flat; d >= 0; --d) {
        offset += rest % shape[static_cast<int>(d)] * tensor.strides()[static_cast<int>(d)];
        rest /= shape[static_cast<int>(d)];
      }
      data.push_back(to_double(static_cast<T>(storage.at(static_cast<std::size_t>(offset)))));
    }
  }

  /// The element that output element `flat` (row-major in `out`) reads under NumPy broadcasting.
  double at(const ts::Shape& out, std::int64_t flat) const {
    std::int64_t offset = 0;
    std::int64_t stride = 1;
    for (int d = out.size() - 1; d >= 0; --d) {
      const std::int64_t index = flat % out[d];
      flat /= out[d];
      const int mine = shape.size() - out.size() + d;
      if (mine < 0) continue;
      if (shape[mine] != 1) offset += index * stride;
      stride *= shape[mine];
    }
    return data.at(static_cast<std::size_t>(offset));
  }
};

/// Numbers in [lo, hi] from a small LCG, the same for the same seed.
inline std::vector<double> numbers(std::int64_t n, std::uint64_t seed, double lo, double hi) {
  std::vector<double> out(static_cast<std::size_t>(n));
  std::uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& v : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const double unit = static_cast<double>(state >> 11) * 0x1.0p-53;
    v = lo + (hi - lo) * unit;
  }
  return out;
}

/// A contiguous tensor of `shape` with values drawn from [lo, hi] (rounded into T).
template <class T>
ts::Tensor<T> sample(const ts::Shape& shape, std::uint64_t seed, double lo = -3.0, double hi = 3.0,
                     int device = -1) {
  std::vector<T> host;
  for (double v : numbers(shape.numel(), seed, lo, hi)) {
    if constexpr (std::is_integral_v<T>) {
      host.push_back(static_cast<T>(std::floor(v)));
    } else {
      host.push_back(static_cast<T>(v));
    }
  }
  return ts::from_vector<T>(host, shape, device);
}

/// Values whose magnitude is in [lo, hi], with random signs (denominators away from zero).
template <class T>
ts::Tensor<T> sample_away_from_zero(const ts::Shape& shape, std::uint64_t seed, double lo = 0.5,
                                    double hi = 3.0) {
  std::vector<T> host;
  const auto signs = numbers(shape.numel(), seed + 1000, -1.0, 1.0);
  const auto magnitudes = numbers(shape.numel(), seed, lo, hi);
  for (std::size_t i = 0; i < magnitudes.size(); ++i) {
    host.push_back(static_cast<T>(signs[i] < 0 ? -magnitudes[i] : magnitudes[i]));
  }
  return ts::from_vector<T>(host, shape);
}

/// A tensor's values as double (row-major).
template <class T, class K>
std::vector<double> as_doubles(const ts::Tensor<T, K>& tensor) {
  return values(tensor).data;
}

/// `expected` computed element by element: out[i] = fn(i) for the row-major index i of `shape`.
template <class Fn>
std::vector<double> tabulate(const ts::Shape& shape, Fn&& fn) {
  std::vector<double> out(static_cast<std::size_t>(shape.numel()));
  for (std::int64_t i = 0; i < shape.numel(); ++i) out[static_cast<std::size_t>(i)] = fn(i);
  return out;
}

/// Counts elements where |actual - expected| > abs_tol + rel * |expected| (NaN matches NaN,
/// infinities must match exactly) and reports the first one.
inline void check_close(const std::vector<double>& actual, const std::vector<double>& expected,
                        double rel, double abs_tol = 0.0) {
  REQUIRE(actual.size() == expected.size());
  std::size_t bad = 0;
  std::ostringstream first;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i];
    const double e = expected[i];
    bool ok;
    if (std::isnan(e) || std::isnan(a)) {
      ok = std::isnan(e) && std::isnan(a);
    } else if (std::isinf(e) || std::isinf(a)) {
      ok = a == e;
    } else {
      ok = std::fabs(a - e) <= abs_tol + rel * std::fabs(e);
    }
    if (!ok && bad++ == 0) {
      first.precision(17);
      first << "element " << i << ": got " << a << ", expected " << e;
    }
  }
  INFO(bad << " of " << actual.size() << " elements differ; first " << first.str());
  CHECK(bad == 0);
}

/// Exact comparison (integers, booleans, values that must round identically).
inline void check_equal(const std::vector<double>& actual, const std::vector<double>& expected) {
  check_close(actual, expected, 0.0, 0.0);
}

/// Relative tolerance appropriate to the result dtype of one rounding step plus libm's error.
template <class T>
constexpr double tolerance() {
  if constexpr (std::is_same_v<T, ts::half>) {
    return 1e-3;
  } else if constexpr (std::is_same_v<T, ts::bfloat16>) {
    return 1e-2;
  } else if constexpr (std::is_same_v<T, float>) {
    return 2e-6;
  } else if constexpr (std::is_same_v<T, double>) {
    return 1e-14;
  } else {
    return 0.0;
  }
}

// ---- shared checks ----------------------------------------------------------------------

inline double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double relu_ref(double x) { return std::isnan(x) ? x : (x > 0 ? x : 0.0); }
inline double maximum_ref(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::nan("") : (a > b ? a : b);
}
inline double minimum_ref(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::nan("") : (a < b ? a : b);
}

struct broadcast_case {
  ts::Shape a;
  ts::Shape b;
  ts::Shape out;  // written out by hand
};

// Every position broadcasting can take: equal shapes, [3,1] with [1,4], a missing leading
// dimension on either side, size-1 dimensions in both operands, 0-dim operands, leading-dim
// broadcasting of a 2-D operand against a 4-D one.
inline const std::vector<broadcast_case> broadcast_cases = {
    {{2, 3}, {2, 3}, {2, 3}},
    {{3, 1}, {1, 4}, {3, 4}},
    {{4}, {2, 3, 4}, {2, 3, 4}},
    {{2, 3, 4}, {4}, {2, 3, 4}},
    {{1, 3, 1}, {2, 1, 5}, {2, 3, 5}},
    {{2, 1, 1, 3}, {4, 1}, {2, 1, 4, 3}},
    {{5, 1}, {2, 1, 1}, {2, 5, 1}},
    {{}, {2, 3}, {2, 3}},
    {{2, 3}, {}, {2, 3}},
    {{1}, {3, 1}, {3, 1}},
    {{}, {}, {}},
};

/// result = build(a, b) must have shape c.out and the values ref(a_i, b_i) (broadcast), within
/// rel (or exactly when rel is 0).
template <class R, class A, class B, class Ref>
void expect_binary(const ts::Tensor<R>& result, const ts::Tensor<A>& a, const ts::Tensor<B>& b,
                   const ts::Shape& out, Ref ref, double rel) {
  REQUIRE(result.shape() == out);
  const values va(a);
  const values vb(b);
  const auto expected =
      tabulate(out, [&](std::int64_t i) { return ref(va.at(out, i), vb.at(out, i)); });
  check_close(values(result).data, expected, rel, rel * 1e-3);
}

/// The ten binary operators and three binary functions on two float tensors a and b (b away
/// from zero), a positive base p for pow.
template <class T>
void check_all_binary(const ts::Tensor<T>& a, const ts::Tensor<T>& b, const ts::Tensor<T>& p,
                      const ts::Shape& out) {
  constexpr double rel = expr_test::tolerance<T>();
  static_assert(std::is_same_v<decltype(ts::eval(a + b)), ts::Tensor<T>>);
  static_assert(std::is_same_v<decltype(ts::eval(a < b)), ts::Tensor<bool>>);
  // clang-format off
  { INFO("+"); expect_binary(ts::eval(a + b), a, b, out, [](double x, double y) { return x + y; }, rel); }
  { INFO("-"); expect_binary(ts::eval(a - b), a, b, out, [](double x, double y) { return x - y; }, rel); }
  { INFO("*"); expect_binary(ts::eval(a * b), a, b, out, [](double x, double y) { return x * y; }, rel); }
  { INFO("/"); expect_binary(ts::eval(a / b), a, b, out, [](double x, double y) { return x / y; }, rel); }
  { INFO("pow"); expect_binary(ts::eval(ts::pow(p, b)), p, b, out, [](double x, double y) { return std::pow(x, y); }, 2 * rel); }
  { INFO("maximum"); expect_binary(ts::eval(ts::maximum(a, b)), a, b, out, maximum_ref, 0.0); }
  { INFO("minimum"); expect_binary(ts::eval(ts::minimum(a, b)), a, b, out, minimum_ref, 0.0); }
  { INFO("<"); expect_binary(ts::eval(a < b), a, b, out, [](double x, double y) { return double(x < y); }, 0.0); }
  { INFO("<="); expect_binary(ts::eval(a <= b), a, b, out, [](double x, double y) { return double(x <= y); }, 0.0); }
  { INFO(">"); expect_binary(ts::eval(a > b), a, b, out, [](double x, double y) { return double(x > y); }, 0.0); }
  { INFO(">="); expect_binary(ts::eval(a >= b), a, b, out, [](double x, double y) { return double(x >= y); }, 0.0); }
  { INFO("=="); expect_binary(ts::eval(a == b), a, b, out, [](double x, double y) { return double(x == y); }, 0.0); }
  { INFO("!="); expect_binary(ts::eval(a != b), a, b, out, [](double x, double y) { return double(x != y); }, 0.0); }
  // clang-format on
}

/// Values rounded to a quarter, so that == and <= meet ties.
template <class T>
ts::Tensor<T> quarters(const ts::Shape& shape, std::uint64_t seed) {
  std::vector<T> host;
  for (double v : expr_test::numbers(shape.numel(), seed, -2.0, 2.0)) {
    host.push_back(static_cast<T>(std::round(v * 4) / 4));
  }
  return ts::from_vector<T>(host, shape);
}

/// Each unary function of `x` (any floating dtype) against std:: in double, within T's
/// tolerance; domain-restricted functions get |x| + 0.25.
template <class T>
void check_all_unary(const ts::Tensor<T>& x) {
  constexpr double rel = expr_test::tolerance<T>();
  const double abs_tol = rel * 1e-2;
  const values v(x);
  auto expect = [&](const auto& result, auto ref) {
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(result)>, ts::Tensor<T>>);
    REQUIRE(result.shape() == x.shape());
    check_close(values(result).data,
                tabulate(x.shape(), [&](std::int64_t i) { return ref(v.data[i]); }), rel, abs_tol);
  };
  auto positive = [](double a) { return std::fabs(a) + 0.25; };
  // clang-format off
  { INFO("neg"); expect(ts::eval(-x), [](double a) { return -a; }); }
  { INFO("exp"); expect(ts::eval(ts::exp(x)), [](double a) { return std::exp(a); }); }
  { INFO("log"); expect(ts::eval(ts::log(ts::abs(x) + 0.25)), [&](double a) { return std::log(positive(a)); }); }
  { INFO("sqrt"); expect(ts::eval(ts::sqrt(ts::abs(x) + 0.25)), [&](double a) { return std::sqrt(positive(a)); }); }
  { INFO("rsqrt"); expect(ts::eval(ts::rsqrt(ts::abs(x) + 0.25)), [&](double a) { return 1 / std::sqrt(positive(a)); }); }
  { INFO("abs"); expect(ts::eval(ts::abs(x)), [](double a) { return std::fabs(a); }); }
  { INFO("sin"); expect(ts::eval(ts::sin(x)), [](double a) { return std::sin(a); }); }
  { INFO("cos"); expect(ts::eval(ts::cos(x)), [](double a) { return std::cos(a); }); }
  { INFO("tanh"); expect(ts::eval(ts::tanh(x)), [](double a) { return std::tanh(a); }); }
  { INFO("sigmoid"); expect(ts::eval(ts::sigmoid(x)), sigmoid_ref); }
  { INFO("relu"); expect(ts::eval(ts::relu(x)), relu_ref); }
  // clang-format on
}

}  // namespace expr_test
