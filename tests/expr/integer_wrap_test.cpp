// Integer overflow in elementwise +, -, * and unary - (and abs) wraps modulo 2^N, as PyTorch's
// results do, instead of being undefined behaviour (expr/functors.hpp computes signed integers in
// the unsigned type). The reference is exact integer arithmetic in 128 bits reduced modulo 2^N
// here. Run under UBSan by the sanitizer build, where a signed overflow would abort.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "tessera/tessera.hpp"

namespace integer_wrap_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

namespace {

__extension__ typedef __int128 wide;

/// v modulo 2^N, as a value of T (N = T's width), computed on the mathematical value.
template <class T>
T wrap(wide v) {
  constexpr int bits = std::numeric_limits<T>::digits + (std::numeric_limits<T>::is_signed ? 1 : 0);
  const wide modulus = wide{1} << bits;
  wide r = v % modulus;
  if (r < 0) r += modulus;
  if (std::numeric_limits<T>::is_signed && r > wide{std::numeric_limits<T>::max()}) r -= modulus;
  return static_cast<T>(r);
}

/// Operands that overflow every way: the extremes, their neighbours, and a few middling values.
template <class T>
std::vector<T> edge_values() {
  using limits = std::numeric_limits<T>;
  std::vector<T> v = {
      limits::max(), limits::min(), T(limits::max() - 1),     T(limits::min() + 1),    T(0), T(1),
      T(-1),         T(2),          T(limits::max() / 2 + 1), T(limits::min() / 2 - 1)};
  if (!limits::is_signed) v = {limits::max(), T(0), T(1), T(2), T(limits::max() / 2 + 1)};
  return v;
}

template <class T>
void check_wrapping() {
  const std::vector<T> edges = edge_values<T>();
  const auto n = static_cast<std::int64_t>(edges.size());
  // Every pair, as [n, 1] with [n] (broadcast, strided path) and as two contiguous [n * n]
  // tensors, repeated past the vector width (the linear, vectorised path).
  std::vector<T> left, right;
  for (int repeat = 0; repeat < 7; ++repeat) {
    for (T a : edges) {
      for (T b : edges) {
        left.push_back(a);
        right.push_back(b);
      }
    }
  }
  const auto count = static_cast<std::int64_t>(left.size());
  const auto a = ts::from_vector<T>(left, {count});
  const auto b = ts::from_vector<T>(right, {count});
  const auto column = ts::from_vector<T>(edges, {n, 1});
  const auto row = ts::from_vector<T>(edges, {n});

  const auto expect = [&](const ts::Tensor<T>& got, auto reference, const char* name) {
    INFO(name);
    const std::vector<T> values = got.to_vector();
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const T expected = reference(wide{left[i]}, wide{right[i]});
      if (values[i] != expected && bad++ == 0) {
        FAIL_CHECK(name << " at " << +left[i] << ", " << +right[i] << ": got " << +values[i]
                        << ", expected " << +expected);
      }
    }
    CHECK(bad == 0);
  };
  expect(
      ts::eval(a + b), [](wide x, wide y) { return wrap<T>(x + y); }, "a + b");
  expect(
      ts::eval(a - b), [](wide x, wide y) { return wrap<T>(x - y); }, "a - b");
  expect(
      ts::eval(a * b), [](wide x, wide y) { return wrap<T>(x * y); }, "a * b");
  expect(
      ts::eval(-a), [](wide x, wide) { return wrap<T>(-x); }, "-a");
  expect(
      ts::eval(a * b - (a + b) * 3),
      [](wide x, wide y) {
        // Wrapping is a ring homomorphism: wrap each step or only the end, the same.
        return wrap<T>(x * y - (x + y) * 3);
      },
      "a * b - (a + b) * 3");
  if constexpr (std::numeric_limits<T>::is_signed) {
    expect(
        ts::eval(ts::abs(a)), [](wide x, wide) { return wrap<T>(x < 0 ? -x : x); }, "abs(a)");
  }

  // Broadcast (the strided loop): column [n, 1] op row [n] is every pair once.
  const ts::Tensor<T> sum = column + row;
  const ts::Tensor<T> product = column * row;
  const std::vector<T> s = sum.to_vector(), p = product.to_vector();
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      const wide x = edges[static_cast<std::size_t>(i)], y = edges[static_cast<std::size_t>(j)];
      bad += s[static_cast<std::size_t>(i * n + j)] != wrap<T>(x + y);
      bad += p[static_cast<std::size_t>(i * n + j)] != wrap<T>(x * y);
    }
  }
  CHECK(bad == 0);

  // In place, and with a number (which does not promote the tensor's dtype).
  auto y = ts::full<T>({3}, std::numeric_limits<T>::max());
  y += 1;
  CHECK(y.to_vector() == std::vector<T>(3, wrap<T>(wide{std::numeric_limits<T>::max()} + 1)));
  y *= 3;
  CHECK(y.to_vector() == std::vector<T>(3, wrap<T>((wide{std::numeric_limits<T>::max()} + 1) * 3)));
}

}  // namespace

TEST_CASE("signed and unsigned integer arithmetic wraps modulo 2^N", "[expr][integer]") {
  SECTION("int8") { check_wrapping<std::int8_t>(); }
  SECTION("int16") { check_wrapping<std::int16_t>(); }
  SECTION("int32") { check_wrapping<std::int32_t>(); }
  SECTION("int64") { check_wrapping<std::int64_t>(); }
  SECTION("uint8") { check_wrapping<std::uint8_t>(); }
}

TEST_CASE("the familiar cases", "[expr][integer]") {
  constexpr auto int32_max = std::numeric_limits<std::int32_t>::max();
  constexpr auto int32_min = std::numeric_limits<std::int32_t>::min();
  constexpr auto int64_max = std::numeric_limits<std::int64_t>::max();
  constexpr auto int64_min = std::numeric_limits<std::int64_t>::min();
  CHECK(ts::eval(ts::full<std::int32_t>({}, int32_max) + 1).item() == int32_min);
  CHECK(ts::eval(ts::full<std::int32_t>({}, int32_min) - 1).item() == int32_max);
  CHECK(ts::eval(-ts::full<std::int32_t>({}, int32_min)).item() == int32_min);
  CHECK(ts::eval(ts::full<std::int32_t>({}, 65536) * 65536).item() == 0);
  CHECK(ts::eval(ts::full<std::int64_t>({}, int64_max) + 1).item() == int64_min);
  CHECK(ts::eval(ts::full<std::int64_t>({}, int64_min) * -1).item() == int64_min);
  CHECK(ts::eval(ts::abs(ts::full<std::int64_t>({}, int64_min))).item() == int64_min);
  CHECK(ts::eval(ts::full<std::int8_t>({}, 127) + 1).item() == -128);
  CHECK(ts::eval(ts::full<std::int16_t>({}, -32768) * -1).item() == -32768);
  CHECK(ts::eval(ts::full<std::uint8_t>({}, 255) + 1).item() == 0);
  // int32 with an int64 tensor computes in int64: no wrap.
  CHECK(ts::eval(ts::full<std::int32_t>({}, int32_max) + ts::full<std::int64_t>({}, 1)).item() ==
        std::int64_t{int32_max} + 1);
}

}  // namespace integer_wrap_test
