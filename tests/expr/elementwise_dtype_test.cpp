// Dtypes in elementwise expressions: PyTorch's promotion for tensors, scalars and functions
// (checked with static_assert and by value), integer semantics (true division, pow, abs,
// wrap-around, comparisons), NaN in maximum/minimum/relu and the comparisons, where with scalar
// branches, and cast rounding (against ts::half / ts::bfloat16, whose conversions are tested
// exhaustively against numpy in tests/core).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "expr/elementwise_reference.hpp"
#include "tessera/tessera.hpp"

namespace elementwise_dtype_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
using expr_test::as_doubles;
using expr_test::check_close;
using expr_test::check_equal;
using expr_test::sample;
using expr_test::tabulate;
using expr_test::values;

// The dtype an expression evaluates to (its value_type, which ts::eval and Tensor<T> y = e use;
// reading it does not instantiate an executor, which keeps this file's compile time down).
#define EXPECT_DTYPE(expression, T)                                                                \
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(expression)>::value_type, T>, \
                #expression " should have dtype " #T)

namespace {
const double not_a_number = std::numeric_limits<double>::quiet_NaN();
const double infinity = std::numeric_limits<double>::infinity();
}  // namespace

TEST_CASE("result dtypes follow PyTorch's promotion", "[expr][dtype]") {
  const auto f32 = ts::from_vector<float>({1.5f, -2.25f, 3.0f}, {3});
  const auto f64 = ts::from_vector<double>({0.1, 0.2, -0.3}, {3});
  const auto f16 =
      ts::from_vector<ts::half>({ts::half(0.5f), ts::half(-1.0f), ts::half(2.0f)}, {3});
  const auto bf16 = ts::from_vector<ts::bfloat16>(
      {ts::bfloat16(0.5f), ts::bfloat16(1.0f), ts::bfloat16(-2.0f)}, {3});
  const auto i8 = ts::from_vector<std::int8_t>({-100, 127, -128}, {3});
  const auto u8 = ts::from_vector<std::uint8_t>({200, 255, 0}, {3});
  const auto i32 = ts::from_vector<std::int32_t>({7, -7, 2}, {3});
  const auto i64 = ts::from_vector<std::int64_t>({3, -4, 1000}, {3});
  const auto b = ts::from_vector<bool>({true, false, true}, {3});

  // Two tensors: torch.promote_types.
  EXPECT_DTYPE(f32 + f64, double);
  EXPECT_DTYPE(i32 + f32, float);
  EXPECT_DTYPE(i64 + f16, ts::half);
  EXPECT_DTYPE(i64 * bf16, ts::bfloat16);
  EXPECT_DTYPE(f16 + bf16, float);
  EXPECT_DTYPE(f16 - f32, float);
  EXPECT_DTYPE(b + i32, std::int32_t);
  EXPECT_DTYPE(b * f16, ts::half);
  EXPECT_DTYPE(i8 + u8, std::int16_t);
  EXPECT_DTYPE(u8 - i32, std::int32_t);
  EXPECT_DTYPE(i32 + i64, std::int64_t);
  EXPECT_DTYPE(b + b, bool);
  EXPECT_DTYPE(ts::maximum(i32, f64), double);
  EXPECT_DTYPE(ts::pow(i32, i64), std::int64_t);
  // A tensor with a number: the number counts only when its category is higher.
  EXPECT_DTYPE(f16 + 2.5, ts::half);
  EXPECT_DTYPE(f32 * 2.5, float);
  EXPECT_DTYPE(i32 + 2.5, float);
  EXPECT_DTYPE(i64 * 0.5, float);
  EXPECT_DTYPE(i8 + 1000, std::int8_t);
  EXPECT_DTYPE(u8 * std::int64_t{3}, std::uint8_t);
  EXPECT_DTYPE(b + 1, std::int64_t);
  EXPECT_DTYPE(b * 1.5, float);
  EXPECT_DTYPE(b + true, bool);
  EXPECT_DTYPE(f64 + 1.0f, double);
  EXPECT_DTYPE(i32 + ts::half(1.0f), float);
  // True division and the floating functions of integers give float32.
  EXPECT_DTYPE(i32 / i32, float);
  EXPECT_DTYPE(i64 / 2, float);
  EXPECT_DTYPE(b / b, float);
  EXPECT_DTYPE(f16 / i32, ts::half);
  EXPECT_DTYPE(ts::exp(i32), float);
  EXPECT_DTYPE(ts::sqrt(i64), float);
  EXPECT_DTYPE(ts::sigmoid(u8), float);
  EXPECT_DTYPE(ts::tanh(b), float);
  EXPECT_DTYPE(ts::sin(f16), ts::half);
  EXPECT_DTYPE(ts::log(f64), double);
  // abs, neg and relu keep the dtype; comparisons give bool.
  EXPECT_DTYPE(ts::abs(i32), std::int32_t);
  EXPECT_DTYPE(-i8, std::int8_t);
  EXPECT_DTYPE(ts::relu(i64), std::int64_t);
  EXPECT_DTYPE(ts::relu(bf16), ts::bfloat16);
  EXPECT_DTYPE(i32 < f64, bool);
  EXPECT_DTYPE(f16 == 0.5, bool);
  // pow keeps integers integral unless a float joins.
  EXPECT_DTYPE(ts::pow(i32, 2), std::int32_t);
  EXPECT_DTYPE(ts::pow(i32, 0.5), float);
  EXPECT_DTYPE(ts::pow(2, i64), std::int64_t);
  EXPECT_DTYPE(ts::pow(2.0, i64), float);
  // where promotes its branches; two numbers give PyTorch's default dtypes.
  EXPECT_DTYPE(ts::where(b, i32, f32), float);
  EXPECT_DTYPE(ts::where(b, 1, 0), std::int64_t);
  EXPECT_DTYPE(ts::where(b, 1.0, 0), float);
  EXPECT_DTYPE(ts::where(b, f16, 2.5), ts::half);
  EXPECT_DTYPE(ts::where(b, i8, 1), std::int8_t);
  EXPECT_DTYPE(ts::cast<std::int8_t>(f32), std::int8_t);
  EXPECT_DTYPE(ts::cast<ts::half>(i32) + 1, ts::half);

  // ts::eval gives a tensor of that dtype.
  static_assert(std::is_same_v<decltype(ts::eval(i8 + u8)), ts::Tensor<std::int16_t>>);
  static_assert(std::is_same_v<decltype(ts::eval(b + 1)), ts::Tensor<std::int64_t>>);
  static_assert(std::is_same_v<decltype(ts::eval(i64 + f16)), ts::Tensor<ts::half>>);

  // The values are computed in the promoted type.
  check_equal(as_doubles(ts::eval(f32 + f64)),
              {double(1.5f) + 0.1, double(-2.25f) + 0.2, double(3.0f) - 0.3});
  check_equal(as_doubles(ts::eval(i32 + f32)), {8.5, -9.25, 5.0});
  check_close(as_doubles(ts::eval(i64 + f16)), {3.5, -5.0, 1002.0}, 1e-3);
  check_equal(as_doubles(ts::eval(i8 + u8)), {100, 382, -128});  // no wrap in int16
  check_equal(as_doubles(ts::eval(b + i32)), {8, -7, 3});
  check_equal(as_doubles(ts::eval(b + 1)), {2, 1, 2});
  check_equal(as_doubles(ts::eval(b + b)), {1, 0, 1});  // logical or, as torch.add on bool
  check_equal(as_doubles(ts::eval(b * b)), {1, 0, 1});
  check_equal(as_doubles(ts::eval(b * 1.5)), {1.5, 0, 1.5});
  check_equal(as_doubles(ts::eval(i32 + 2.5)), {9.5, -4.5, 4.5});
  check_equal(as_doubles(ts::eval(f16 + 2.5)), {3.0, 1.5, 4.5});
  check_close(as_doubles(ts::eval(f16 + bf16)), {1.0, 0.0, 0.0}, 0);
  check_equal(as_doubles(ts::eval(ts::maximum(i32, f64))), {7, 0.2, 2});
  check_equal(as_doubles(ts::eval(ts::where(b, i32, f32))), {7, -2.25, 2});
  check_equal(as_doubles(ts::eval(ts::where(b, 1, 0))), {1, 0, 1});
  check_equal(as_doubles(ts::eval(ts::where(b, f16, 2.5))), {0.5, 2.5, 2.0});
  // A float scalar that a half tensor cannot hold exactly is not rounded to half first.
  CHECK(static_cast<float>(ts::eval(ts::full<ts::half>({1}, ts::half(1.0f)) * 0.1).item()) ==
        static_cast<float>(ts::half(0.1f)));
}

TEST_CASE("integer semantics", "[expr][dtype]") {
  SECTION("division is true division to float") {
    const auto n = ts::from_vector<std::int32_t>({7, -7, 1, 0, -1, 9}, {6});
    const auto d = ts::from_vector<std::int32_t>({2, 2, 0, 0, 0, 3}, {6});
    check_equal(as_doubles(ts::eval(n / d)), {3.5, -3.5, infinity, not_a_number, -infinity, 3.0});
    check_equal(as_doubles(ts::eval(n / 4)), {1.75, -1.75, 0.25, 0, -0.25, 2.25});
    check_equal(as_doubles(ts::eval(3 / d.narrow(0, 0, 2))), {1.5, 1.5});
    const auto i64 = ts::from_vector<std::int64_t>({-9, 10}, {2});
    check_close(as_doubles(ts::eval(i64 / 3)), {-3.0, 10.0 / 3}, 1e-7);
    // In place: an integer tensor cannot take a float result (tests/failtest), a float one can.
    auto f = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {6});
    f /= d + 1;
    check_close(as_doubles(f), {1.0 / 3, 2.0 / 3, 3.0, 4.0, 5.0, 1.5}, 1e-7);
  }
  SECTION("pow of integers") {
    const auto base = ts::from_vector<std::int32_t>({2, 3, -2, 2000, 1, -1, 0, 5}, {8});
    check_equal(as_doubles(ts::eval(ts::pow(base, 2))), {4, 9, 4, 4000000, 1, 1, 0, 25});
    check_equal(as_doubles(ts::eval(ts::pow(base, 3))),
                {8, 27, -8, 8000000000.0 - 4294967296.0 * 2, 1, -1, 0, 125});
    const auto exponent = ts::from_vector<std::int32_t>({10, 0, 5, 1, -3, -3, 0, -1}, {8});
    // Negative exponents: 0 except for bases 1 and -1 (PyTorch's integer pow).
    check_equal(as_doubles(ts::eval(ts::pow(base, exponent))), {1024, 1, -32, 2000, 1, -1, 1, 0});
    const auto three = ts::full<std::int64_t>({1}, 3);
    check_equal(as_doubles(ts::eval(ts::pow(three, 39))), {4052555153018976267.0});
    CHECK(ts::eval(ts::pow(three, 39)).item() == 4052555153018976267LL);
    check_equal(as_doubles(ts::eval(ts::pow(2, ts::arange<std::int64_t>(5)))), {1, 2, 4, 8, 16});
    check_close(as_doubles(ts::eval(ts::pow(base.narrow(0, 0, 2), 0.5))),
                {std::sqrt(2.0), std::sqrt(3.0)}, 1e-7);
    // int8 wraps as PyTorch's int8 pow does: 2^7 = -128.
    const auto two8 = ts::full<std::int8_t>({1}, 2);
    CHECK(ts::eval(ts::pow(two8, 7)).item() == -128);
  }
  SECTION("abs, negation and relu of integers") {
    const auto x = ts::from_vector<std::int32_t>({-3, 0, 5, -2147483647}, {4});
    check_equal(as_doubles(ts::eval(ts::abs(x))), {3, 0, 5, 2147483647});
    check_equal(as_doubles(ts::eval(-x)), {3, 0, -5, 2147483647});
    check_equal(as_doubles(ts::eval(ts::relu(x))), {0, 0, 5, 0});
    const auto i8 = ts::from_vector<std::int8_t>({-128, -5, 7}, {3});
    check_equal(as_doubles(ts::eval(ts::abs(i8))), {-128, 5, 7});  // wraps, as torch.abs
    const auto u8 = ts::from_vector<std::uint8_t>({0, 3, 255}, {3});
    check_equal(as_doubles(ts::eval(ts::abs(u8))), {0, 3, 255});
    check_equal(as_doubles(ts::eval(-u8)), {0, 253, 1});
  }
  SECTION("narrow integer types wrap") {
    const auto a = ts::from_vector<std::int8_t>({100, -100, 127}, {3});
    check_equal(as_doubles(ts::eval(a + a)), {-56, 56, -2});
    const auto u = ts::from_vector<std::uint8_t>({3, 16, 200}, {3});
    check_equal(as_doubles(ts::eval(u - 5)), {254, 11, 195});
    check_equal(as_doubles(ts::eval(u * u)), {9, 0, 64});
  }
  SECTION("comparisons of integers, with floats and with bool") {
    const auto i = ts::from_vector<std::int32_t>({1, 2, 3}, {3});
    const auto j = ts::from_vector<std::int64_t>({3, 2, 1}, {3});
    check_equal(as_doubles(ts::eval(i < j)), {1, 0, 0});
    check_equal(as_doubles(ts::eval(i <= j)), {1, 1, 0});
    check_equal(as_doubles(ts::eval(i == j)), {0, 1, 0});
    check_equal(as_doubles(ts::eval(i != 2)), {1, 0, 1});
    check_equal(as_doubles(ts::eval(i < 2.5)), {1, 1, 0});
    check_equal(as_doubles(ts::eval(i > 1.5f)), {0, 1, 1});
    // 2^24 + 1 compared with a float scalar computes in float32, as PyTorch does.
    const auto big = ts::full<std::int32_t>({1}, 16777217);
    CHECK(ts::eval(big == 16777216.0).item());
    CHECK_FALSE(ts::eval(big == 16777216).item());
    const auto b = ts::from_vector<bool>({true, false}, {2});
    check_equal(as_doubles(ts::eval(b < 1)), {0, 1});
    check_equal(as_doubles(ts::eval(b == true)), {1, 0});
  }
  SECTION("maximum and minimum of integers") {
    const auto i = ts::from_vector<std::int32_t>({-4, 9, 0}, {3});
    check_equal(as_doubles(ts::eval(ts::maximum(i, 0))), {0, 9, 0});
    check_equal(as_doubles(ts::eval(ts::minimum(i, ts::full<std::int64_t>({1}, 1)))), {-4, 1, 0});
  }
}

TEST_CASE("NaN propagates through maximum, minimum and relu; comparisons are false",
          "[expr][dtype]") {
  const auto x = ts::from_vector<float>({NAN, 1.0f, NAN, -2.0f, 0.0f}, {5});
  const auto y = ts::from_vector<float>({1.0f, NAN, NAN, 3.0f, -0.0f}, {5});
  check_equal(as_doubles(ts::eval(ts::maximum(x, y))),
              {not_a_number, not_a_number, not_a_number, 3.0, 0.0});
  check_equal(as_doubles(ts::eval(ts::minimum(x, y))),
              {not_a_number, not_a_number, not_a_number, -2.0, 0.0});
  check_equal(as_doubles(ts::eval(ts::maximum(x, 0.5))),
              {not_a_number, 1.0, not_a_number, 0.5, 0.5});
  check_equal(as_doubles(ts::eval(ts::minimum(0.5, y))),
              {0.5, not_a_number, not_a_number, 0.5, -0.0});
  check_equal(as_doubles(ts::eval(ts::relu(x))), {not_a_number, 1.0, not_a_number, 0.0, 0.0});
  check_equal(as_doubles(ts::eval(x < y)), {0, 0, 0, 1, 0});
  check_equal(as_doubles(ts::eval(x >= y)), {0, 0, 0, 0, 1});
  check_equal(as_doubles(ts::eval(x == x)), {0, 1, 0, 1, 1});
  check_equal(as_doubles(ts::eval(x != x)), {1, 0, 1, 0, 0});
  check_equal(as_doubles(ts::eval(ts::abs(x))), {not_a_number, 1.0, not_a_number, 2.0, 0.0});
  // where passes a NaN through from the branch it selects, and can replace NaN.
  check_equal(as_doubles(ts::eval(ts::where(x > -1, x, 7))), {7, 1.0, 7, 7, 0.0});
  check_equal(as_doubles(ts::eval(ts::where(y >= -1, x, y))),
              {not_a_number, not_a_number, not_a_number, -2.0, 0.0});
  check_equal(as_doubles(ts::eval(ts::where(x != x, 0, x))), {0, 1.0, 0, -2.0, 0.0});
  // Half computes in float: NaN survives the round trip.
  const auto h = x.to<ts::half>();
  check_equal(as_doubles(ts::eval(ts::maximum(h, ts::half(0.0f)))),
              {not_a_number, 1.0, not_a_number, 0.0, 0.0});
  check_equal(as_doubles(ts::eval(ts::relu(h))), {not_a_number, 1.0, not_a_number, 0.0, 0.0});
  // Domain edges of the functions give IEEE results.
  const auto edge = ts::from_vector<double>({-1.0, 0.0, INFINITY, -INFINITY}, {4});
  check_equal(as_doubles(ts::eval(ts::log(edge))),
              {not_a_number, -infinity, infinity, not_a_number});
  check_equal(as_doubles(ts::eval(ts::sqrt(edge))), {not_a_number, 0.0, infinity, not_a_number});
  check_equal(as_doubles(ts::eval(ts::rsqrt(edge))), {not_a_number, infinity, 0.0, not_a_number});
  check_equal(as_doubles(ts::eval(ts::exp(edge))), {std::exp(-1.0), 1.0, infinity, 0.0});
  check_equal(as_doubles(ts::eval(ts::sigmoid(edge))),
              {1.0 / (1.0 + std::exp(1.0)), 0.5, 1.0, 0.0});
  check_equal(as_doubles(ts::eval(ts::tanh(edge))), {std::tanh(-1.0), 0.0, 1.0, -1.0});
  check_equal(as_doubles(ts::eval(1.0 / edge)), {-1.0, infinity, 0.0, -0.0});
}

TEST_CASE("where selects with broadcasting, expression conditions and scalar branches",
          "[expr][dtype]") {
  const auto c = ts::from_vector<bool>({true, false, true}, {3, 1});
  const auto a = expr_test::sample<float>({1, 4}, 91);
  const auto b = expr_test::sample<float>({4}, 92);
  const values vc(c), va(a), vb(b);
  const ts::Shape s{3, 4};
  check_equal(as_doubles(ts::eval(ts::where(c, a, b))), tabulate(s, [&](std::int64_t i) {
                return vc.at(s, i) != 0 ? va.at(s, i) : vb.at(s, i);
              }));
  // A comparison as the condition: where(a > b, a, b) is the maximum.
  check_equal(as_doubles(ts::eval(ts::where(a > b, a, b))),
              tabulate({1, 4}, [&](std::int64_t i) { return std::max(va.data[i], vb.data[i]); }));
  // Scalar branches on either side, and both.
  check_equal(as_doubles(ts::eval(ts::where(c, a, 0))),
              tabulate(s, [&](std::int64_t i) { return vc.at(s, i) != 0 ? va.at(s, i) : 0.0; }));
  check_equal(as_doubles(ts::eval(ts::where(c, -0.5, b))),
              tabulate(s, [&](std::int64_t i) { return vc.at(s, i) != 0 ? -0.5 : vb.at(s, i); }));
  check_equal(as_doubles(ts::eval(ts::where(c, 1.0, 0.0))), {1, 0, 1});
  check_equal(as_doubles(ts::eval(ts::where(a < 0, -1, 1))),
              tabulate({1, 4}, [&](std::int64_t i) { return va.data[i] < 0 ? -1.0 : 1.0; }));
  // Integer and float branches meet in float.
  const auto i = ts::from_vector<std::int32_t>({5, 6, 7}, {3, 1});
  check_equal(as_doubles(ts::eval(ts::where(c, i, 2.5))), {5, 2.5, 7});
  // Both branches are evaluated (no short-circuit), so a NaN in the other branch is harmless.
  const auto x = ts::from_vector<float>({-1.0f, 4.0f}, {2});
  check_equal(as_doubles(ts::eval(ts::where(x > 0, ts::sqrt(x), 0))), {0.0, 2.0});
}

TEST_CASE("cast rounds as the element types do", "[expr][dtype]") {
  // Ties at 1 + 2^-11 and 1 + 3 * 2^-11 (round to even), the largest half, its overflow
  // threshold, a subnormal, negative values and random floats.
  std::vector<float> host = {1.0f + 0x1p-11f,
                             1.0f + 3 * 0x1p-11f,
                             65504.0f,
                             65519.0f,
                             65520.0f,
                             1e-6f,
                             3e-8f,
                             -2.5f,
                             0.1f,
                             -0.0f};
  for (double v : expr_test::numbers(200, 101, -70000.0, 70000.0))
    host.push_back(static_cast<float>(v));
  for (double v : expr_test::numbers(200, 102, -1.0, 1.0)) host.push_back(static_cast<float>(v));
  const auto x = ts::from_vector<float>(host, {static_cast<std::int64_t>(host.size())});
  {
    INFO("cast<half> then cast<float> equals float(ts::half(x))");
    ts::Tensor<float> y = ts::cast<float>(ts::cast<ts::half>(x));
    std::vector<double> expected;
    for (float v : host) expected.push_back(static_cast<float>(ts::half(v)));
    check_equal(as_doubles(y), expected);
    // The numbers numpy.float16 gives for the hand-picked cases.
    CHECK(y.to_vector()[0] == 1.0f);
    CHECK(y.to_vector()[1] == 1.0f + 0x1p-9f);
    CHECK(y.to_vector()[3] == 65504.0f);
    CHECK(std::isinf(y.to_vector()[4]));
    CHECK(y.to_vector()[6] == 0x1p-25f * 2);  // 3e-8 rounds to the smallest subnormal, 2^-24
  }
  {
    INFO("cast<bfloat16> then cast<float> equals float(ts::bfloat16(x))");
    ts::Tensor<float> y = ts::cast<float>(ts::cast<ts::bfloat16>(x));
    std::vector<double> expected;
    for (float v : host) expected.push_back(static_cast<float>(ts::bfloat16(v)));
    check_equal(as_doubles(y), expected);
  }
  {
    INFO("a cast inside a fused tree rounds there: cast<half>(x) * 3 is half(float(half(x)) * 3)");
    auto y = ts::eval(ts::cast<ts::half>(x) * 3);
    static_assert(std::is_same_v<decltype(y), ts::Tensor<ts::half>>);
    std::vector<double> expected;
    for (float v : host) {
      expected.push_back(static_cast<float>(ts::half(static_cast<float>(ts::half(v)) * 3.0f)));
    }
    check_equal(as_doubles(y), expected);
  }
  const auto f = ts::from_vector<float>({-2.7f, -0.5f, 0.5f, 2.7f, 0.0f}, {5});
  check_equal(as_doubles(ts::eval(ts::cast<std::int32_t>(f))), {-2, 0, 0, 2, 0});  // truncation
  check_equal(
      as_doubles(ts::eval(ts::cast<bool>(ts::from_vector<float>({0.0f, -0.0f, 0.1f, NAN}, {4})))),
      {0, 0, 1, 1});
  check_equal(as_doubles(ts::eval(
                  ts::cast<std::uint8_t>(ts::from_vector<std::int32_t>({300, -1, 7}, {3})))),
              {44, 255, 7});
  const auto d = ts::from_vector<double>({0.1, 1e30}, {2});
  check_equal(as_doubles(ts::eval(ts::cast<float>(d))), {double(0.1f), double(1e30f)});
  check_equal(as_doubles(ts::eval(ts::cast<double>(ts::cast<float>(d)) - d)),
              {double(0.1f) - 0.1, double(1e30f) - 1e30});
}

}  // namespace elementwise_dtype_test
