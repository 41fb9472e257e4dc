// The vectorisable float exp, tanh and sigmoid (backend/cpu/vector_math.hpp) against float64
// std::exp / std::tanh: dense sweeps over every float with a stride of a few ulp, run through
// ts::exp(tensor) etc. so the executor's vectorised loop is what is measured, the special values
// (+-0, +-inf, NaN, the overflow and underflow edges, subnormals), every half and bfloat16 value,
// and fused expressions. Errors are in ulp of float at the float64 reference (the spacing of
// floats there; 2^-149 in the subnormal range).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "tessera/tessera.hpp"

namespace vector_math_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace vm = ts::detail::vector_math;

namespace {

constexpr float float_inf = std::numeric_limits<float>::infinity();
constexpr float float_nan = std::numeric_limits<float>::quiet_NaN();

// Bounds asserted (the maxima measured over *every* float of the sweep ranges with g++ 12 -O3,
// SSE2: exp 0.990, tanh 1.330, sigmoid 2.825; with -march=native (FMA contraction) 1.001, 1.302,
// 2.705 at a stride of 23). Libm's sigmoid as 1 / (1 + expf(-x)) measures 2.47 the same way.
constexpr double exp_bound_ulp = 1.5;
constexpr double tanh_bound_ulp = 2.0;
constexpr double sigmoid_bound_ulp = 3.0;

/// |got - reference| in ulp of float at the reference. A reference beyond float's range must
/// give exactly +-inf (and a finite reference a finite result).
double ulp_error(float got, double reference) {
  if (std::isnan(reference)) return std::isnan(got) ? 0.0 : float_inf;
  const auto rounded = static_cast<float>(reference);
  if (std::isinf(rounded) || std::isinf(got)) return got == rounded ? 0.0 : float_inf;
  int exponent = 0;
  std::frexp(std::fabs(reference), &exponent);  // |reference| = m * 2^exponent, m in [0.5, 1)
  const double ulp = std::ldexp(1.0, std::max(exponent - 24, -149));
  return std::fabs(static_cast<double>(got) - reference) / ulp;
}

/// Floats ordered as integers: k >= 0 is the float with bits k, k < 0 is -(float with bits -k).
float float_at(std::int64_t k) {
  return k >= 0 ? std::bit_cast<float>(static_cast<std::uint32_t>(k))
                : std::bit_cast<float>(static_cast<std::uint32_t>(-k) | 0x80000000u);
}
std::int64_t key_of(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  return (bits >> 31) != 0 ? -static_cast<std::int64_t>(bits & 0x7fffffffu)
                           : static_cast<std::int64_t>(bits);
}

struct sweep_result {
  double worst_ulp = 0;
  float worst_at = 0;
  std::int64_t points = 0;
};

/// Every `stride`-th float of [lo, hi] (and hi), in blocks of 2^20, through `function` (an
/// expression on a tensor, evaluated by the executor), against `reference` in double.
template <class Function, class Reference>
sweep_result sweep(float lo, float hi, std::int64_t stride, Function&& function,
                   Reference&& reference) {
  sweep_result result;
  const std::int64_t first = key_of(lo);
  const std::int64_t last = key_of(hi);
  constexpr std::int64_t block = std::int64_t{1} << 20;
  std::vector<float> inputs;
  for (std::int64_t k = first; k <= last;) {
    inputs.clear();
    for (; k <= last && static_cast<std::int64_t>(inputs.size()) < block; k += stride) {
      inputs.push_back(float_at(k));
    }
    if (k > last) inputs.push_back(hi);
    const auto x = ts::from_vector<float>(inputs, {static_cast<std::int64_t>(inputs.size())});
    const ts::Tensor<float> y = function(x);
    const std::vector<float> got = y.to_vector();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const double error = ulp_error(got[i], reference(static_cast<double>(inputs[i])));
      if (error > result.worst_ulp || std::isnan(error)) {
        result.worst_ulp = error;
        result.worst_at = inputs[i];
      }
    }
    result.points += static_cast<std::int64_t>(inputs.size());
  }
  return result;
}

double sigmoid_reference(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// One value through the executor (the scalar path: a 1-element tensor).
template <class Function>
float through_tensor(Function&& function, float x) {
  return ts::Tensor<float>(function(ts::full<float>({1}, x))).item();
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

}  // namespace

TEST_CASE("float exp within 1.5 ulp of float64 exp, subnormal results included",
          "[expr][vector_math]") {
  const auto exp_of = [](const ts::Tensor<float>& x) { return ts::exp(x); };
  const auto exp_ref = [](double x) { return std::exp(x); };
  // Results from 0 (x < -103.97) through the subnormals (x < -87.34) to +float_inf (x > 88.7228).
  const auto all = sweep(-106.0f, 90.0f, 97, exp_of, exp_ref);
  INFO("worst " << all.worst_ulp << " ulp at x = " << all.worst_at << " over " << all.points);
  CHECK(all.points > 20'000'000);
  CHECK(all.worst_ulp <= exp_bound_ulp);
  // Every float near the edges: the underflow to 0, the first subnormal results, the overflow,
  // and the ends of the polynomial's range (|r| near ln2 / 2).
  for (const auto& [lo, hi] :
       {std::pair{-104.5f, -103.5f}, std::pair{-87.5f, -87.2f}, std::pair{88.6f, 88.8f},
        std::pair{-0.35f, -0.34f}, std::pair{0.34f, 0.35f}}) {
    const auto edge = sweep(lo, hi, 1, exp_of, exp_ref);
    INFO("[" << lo << ", " << hi << "]: worst " << edge.worst_ulp << " ulp at " << edge.worst_at);
    CHECK(edge.worst_ulp <= exp_bound_ulp);
  }
}

TEST_CASE("float exp special values", "[expr][vector_math]") {
  const auto exp_of = [](const ts::Tensor<float>& x) { return ts::exp(x); };
  CHECK(through_tensor(exp_of, 0.0f) == 1.0f);
  CHECK(through_tensor(exp_of, -0.0f) == 1.0f);
  CHECK(through_tensor(exp_of, float_inf) == float_inf);
  CHECK(same_bits(through_tensor(exp_of, -float_inf), 0.0f));
  CHECK(std::isnan(through_tensor(exp_of, float_nan)));
  CHECK(std::isnan(through_tensor(exp_of, -float_nan)));
  CHECK(through_tensor(exp_of, std::numeric_limits<float>::max()) == float_inf);
  CHECK(same_bits(through_tensor(exp_of, std::numeric_limits<float>::lowest()), 0.0f));
  CHECK(through_tensor(exp_of, std::numeric_limits<float>::denorm_min()) == 1.0f);
  const auto near_zero =
      sweep(-1e-6f, 1e-6f, 1 << 12, exp_of, [](double x) { return std::exp(x); });
  CHECK(near_zero.worst_ulp <= exp_bound_ulp);
  // The largest float with a finite exp, and the next one.
  const float last_finite =
      88.7228317f;  // exp = 3.40280e38; the next float's exp rounds to float_inf
  REQUIRE(std::isfinite(static_cast<float>(std::exp(double{last_finite}))));
  REQUIRE(std::isinf(static_cast<float>(std::exp(double{std::nextafter(last_finite, float_inf)}))));
  CHECK(through_tensor(exp_of, last_finite) == static_cast<float>(std::exp(double{last_finite})));
  CHECK(through_tensor(exp_of, std::nextafter(last_finite, float_inf)) == float_inf);
  // The smallest subnormal, and below half of it: 0.
  CHECK(through_tensor(exp_of, -103.27893f) == std::numeric_limits<float>::denorm_min());
  CHECK(through_tensor(exp_of, -103.98f) == 0.0f);
  // The scalar function (no executor) agrees.
  CHECK(ulp_error(vm::exp(-100.0f), std::exp(-100.0)) <= exp_bound_ulp);
  CHECK(std::isnan(vm::exp(float_nan)));
}

TEST_CASE("float tanh within 2 ulp, odd, exactly +-1 for large |x|", "[expr][vector_math]") {
  const auto tanh_of = [](const ts::Tensor<float>& x) { return ts::tanh(x); };
  const auto tanh_ref = [](double x) { return std::tanh(x); };
  const auto all = sweep(-20.0f, 20.0f, 97, tanh_of, tanh_ref);
  INFO("worst " << all.worst_ulp << " ulp at x = " << all.worst_at << " over " << all.points);
  CHECK(all.points > 20'000'000);
  CHECK(all.worst_ulp <= tanh_bound_ulp);
  // Every float around the switch from the polynomial to the exp form (0.625), and near 0.
  const auto edge = sweep(0.6f, 0.65f, 1, tanh_of, tanh_ref);
  CHECK(edge.worst_ulp <= tanh_bound_ulp);
  const auto tiny = sweep(-1e-30f, 1e-30f, 1 << 10, tanh_of, tanh_ref);
  CHECK(tiny.worst_ulp <= tanh_bound_ulp);

  CHECK(same_bits(through_tensor(tanh_of, 0.0f), 0.0f));
  CHECK(same_bits(through_tensor(tanh_of, -0.0f), -0.0f));
  CHECK(through_tensor(tanh_of, float_inf) == 1.0f);
  CHECK(through_tensor(tanh_of, -float_inf) == -1.0f);
  CHECK(std::isnan(through_tensor(tanh_of, float_nan)));
  for (float x : {9.1f, 10.0f, 50.0f, 1e30f, std::numeric_limits<float>::max()}) {
    INFO("x = " << x);
    CHECK(through_tensor(tanh_of, x) == 1.0f);
    CHECK(through_tensor(tanh_of, -x) == -1.0f);
  }
  CHECK(through_tensor(tanh_of, std::numeric_limits<float>::denorm_min()) ==
        std::numeric_limits<float>::denorm_min());
  // Odd bit for bit.
  for (float x : {0.1f, 0.6249f, 0.625f, 1.0f, 3.3f, 8.9f}) {
    CHECK(same_bits(vm::tanh(-x), -vm::tanh(x)));
  }
}

TEST_CASE("float sigmoid within 3 ulp, subnormal tail kept", "[expr][vector_math]") {
  const auto sigmoid_of = [](const ts::Tensor<float>& x) { return ts::sigmoid(x); };
  const auto all = sweep(-110.0f, 110.0f, 97, sigmoid_of, sigmoid_reference);
  INFO("worst " << all.worst_ulp << " ulp at x = " << all.worst_at << " over " << all.points);
  CHECK(all.points > 20'000'000);
  CHECK(all.worst_ulp <= sigmoid_bound_ulp);

  CHECK(through_tensor(sigmoid_of, 0.0f) == 0.5f);
  CHECK(through_tensor(sigmoid_of, -0.0f) == 0.5f);
  CHECK(same_bits(through_tensor(sigmoid_of, -float_inf), 0.0f));
  CHECK(through_tensor(sigmoid_of, float_inf) == 1.0f);
  CHECK(std::isnan(through_tensor(sigmoid_of, float_nan)));
  CHECK(through_tensor(sigmoid_of, 20.0f) == 1.0f);  // 1 - 2e-9 rounds to 1
  // Subnormal: sigmoid(-95) = 5.5e-42, not 0 as 1 / (1 + expf(95)) = 1 / float_inf gives.
  CHECK(ulp_error(through_tensor(sigmoid_of, -95.0f), sigmoid_reference(-95.0)) <= 1.0);
  CHECK(through_tensor(sigmoid_of, -95.0f) > 0.0f);
}

TEST_CASE("half and bfloat16 exp, tanh, sigmoid: every value within 1 ulp of the dtype",
          "[expr][vector_math][half]") {
  // Computed in float and rounded once when stored: within 0.5 ulp of the dtype plus float's
  // few ulp, so 1 ulp of the dtype (its spacing at the reference; 2^-24 for half subnormals).
  const auto check = [](auto tag, int mantissa_bits, int min_exponent, double largest) {
    using T = decltype(tag);
    std::vector<T> inputs;
    for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
      const T value = T::from_bits(static_cast<std::uint16_t>(bits));
      if (std::isfinite(static_cast<float>(value))) inputs.push_back(value);
    }
    const auto x = ts::from_vector<T>(inputs, {static_cast<std::int64_t>(inputs.size())});
    const auto unit = [&](double reference) {
      int exponent = 0;
      std::frexp(std::fabs(reference), &exponent);
      if (reference == 0) return std::ldexp(1.0, min_exponent);
      return std::ldexp(1.0, std::max(exponent - 1 - mantissa_bits, min_exponent));
    };
    const auto expect = [&](const ts::Tensor<T>& y, auto reference, const char* name) {
      const std::vector<T> got = y.to_vector();
      int failures = 0;
      for (std::size_t i = 0; i < inputs.size() && failures < 5; ++i) {
        const double r = reference(static_cast<double>(static_cast<float>(inputs[i])));
        const double g = static_cast<float>(got[i]);
        // Beyond the largest value plus half its spacing the result is float_inf.
        const bool overflow = r >= largest + unit(largest) / 2;
        const bool ok = overflow ? std::isinf(g) : std::fabs(g - r) <= unit(r);
        if (!ok) {
          ++failures;
          FAIL_CHECK(name << "(" << static_cast<float>(inputs[i]) << ") = " << g << ", expected "
                          << r);
        }
      }
    };
    expect(
        ts::exp(x), [](double v) { return std::exp(v); }, "exp");
    expect(
        ts::tanh(x), [](double v) { return std::tanh(v); }, "tanh");
    expect(ts::sigmoid(x), sigmoid_reference, "sigmoid");
  };
  SECTION("half") { check(ts::half{}, 10, -24, 65504.0); }
  SECTION("bfloat16") { check(ts::bfloat16{}, 7, -133, 0x1.fep127); }
}

TEST_CASE("fused expressions with exp, tanh, sigmoid on float, double and strided operands",
          "[expr][vector_math]") {
  for (std::int64_t n : {1, 3, 5, 17, 1023, 70001}) {
    INFO("n = " << n);
    std::vector<float> a(static_cast<std::size_t>(n)), b(a.size()), c(a.size() * 2);
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = -6.0f + 12.0f * static_cast<float>((i * 7919) % 1000) / 1000.0f;
      b[i] = 0.5f + static_cast<float>((i * 104729) % 997) / 997.0f;
      c[2 * i] = -3.0f + 6.0f * static_cast<float>((i * 31) % 101) / 101.0f;
      c[2 * i + 1] = float_nan;  // never read: c is the stride-2 view below
    }
    const auto ta = ts::from_vector<float>(a, {n});
    const auto tb = ts::from_vector<float>(b, {n});
    const auto tc = ts::from_vector<float>(c, {n, 2}).select(1, 0);
    const ts::Tensor<float> y = ts::sigmoid(ta * tb + tc) * ts::tanh(ta) + ts::exp(tc);
    const std::vector<float> got = y.to_vector();
    double worst = 0;  // error relative to the terms' magnitude, 1 + 1 + e^c
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double z = double{a[i]} * b[i] + c[2 * i];
      const double reference =
          sigmoid_reference(z) * std::tanh(double{a[i]}) + std::exp(double{c[2 * i]});
      worst = std::max(worst, std::fabs(got[i] - reference) / (2.0 + std::exp(double{c[2 * i]})));
    }
    // A few float roundings (2^-24 each) and the functions' few ulp: well within 1e-6.
    CHECK(worst <= 1e-6);
    // double keeps std::exp.
    const auto ad = ts::from_vector<double>(std::vector<double>(a.begin(), a.end()), {n});
    const std::vector<double> e = ts::eval(ts::exp(ad)).to_vector();
    bool all_equal = true;
    for (std::size_t i = 0; i < a.size(); ++i)
      all_equal = all_equal && e[i] == std::exp(double{a[i]});
    CHECK(all_equal);
  }
}

TEST_CASE("the executor's loop (an AVX2 clone where the CPU has it) rounds as the plain code",
          "[expr][vector_math]") {
  // Not an accuracy reference (the sweeps above are): a check that the loop's clones, built for
  // another instruction set, give the same bits as the functions compiled for the baseline, so
  // results do not depend on the machine.
  std::vector<float> inputs;
  for (std::int64_t k = key_of(-110.0f); k <= key_of(110.0f); k += 2099)
    inputs.push_back(float_at(k));
  const auto x = ts::from_vector<float>(inputs, {static_cast<std::int64_t>(inputs.size())});
  const std::vector<float> e = ts::eval(ts::exp(x)).to_vector();
  const std::vector<float> t = ts::eval(ts::tanh(x)).to_vector();
  const std::vector<float> s = ts::eval(ts::sigmoid(x)).to_vector();
  std::int64_t differences = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    differences += !same_bits(e[i], vm::exp(inputs[i])) + !same_bits(t[i], vm::tanh(inputs[i])) +
                   !same_bits(s[i], vm::sigmoid(inputs[i]));
  }
  CHECK(inputs.size() > 1'000'000);
  CHECK(differences == 0);
}

}  // namespace vector_math_test
