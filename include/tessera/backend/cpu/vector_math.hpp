// Float exp, tanh and sigmoid that the compiler vectorises inside the CPU executor's loops
// without -ffast-math (checked with GCC 12 at -O3; -O2's cost model vectorises no loop of unknown
// length): straight-line arithmetic, integer bit tricks for 2^n, and selects instead of
// branches, so the calls inline into packed SSE/AVX code where libm's expf/tanhf would stay
// scalar calls. The functors (backend/functors.hpp) use them for float (and half/bfloat16, which
// compute in float) on the host; double keeps std::, CUDA device code keeps ::expf and friends.
//
// Accuracy, in ulp of float at the exact value (2^-149 in the subnormal range), asserted by
// tests/backend/vector_math_test.cpp over every 97th float of the ranges and every float near the
// edges (the maxima over *every* float, g++ 12 -O3 SSE2, in brackets):
//   exp:     <= 1.5 ulp (0.99), subnormal results included (2^n is applied as two factors, so
//            they are rounded once); x < -103.97 gives +0 and x > 88.7228 gives +inf, as the
//            correctly rounded result; NaN in, NaN out.
//   tanh:    <= 2 ulp (1.33); odd (tanh(-x) == -tanh(x) bit for bit, -0 stays -0); |x| >= 9.1
//            gives exactly +-1.
//   sigmoid: <= 3 ulp (2.83; libm's 1 / (1 + expf(-x)) measures 2.47), subnormal results
//            included (x < -88.7 keeps its tail where 1 / (1 + expf(-x)) flushes to 0);
//            sigmoid(-inf) = 0, sigmoid(+inf) = 1.
// log is not here: softmax and log_softmax take one log per row, not per element.
#pragma once

#include <bit>
#include <cstdint>

namespace tessera::detail::vector_math {

// Why no `c ? a : b` on computed floats and no float comparisons: under the default
// -ftrapping-math GCC will not if-convert a select whose arm holds a float operation that may
// trap (the optimiser sinks the operation into the arm), nor a float comparison, so the loop
// stays scalar ("control flow in loop"). Tests are integer comparisons of bit patterns and
// selects are bit masks; both vectorise.

inline std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float float_of(std::uint32_t bits) { return std::bit_cast<float>(bits); }

/// condition ? a : b as a bit mask (both already computed).
inline float select(bool condition, float a, float b) {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
  return float_of((bits_of(a) & mask) | (bits_of(b) & ~mask));
}

/// True for NaN (any payload, either sign), with integer arithmetic only.
inline bool is_nan(float x) { return (bits_of(x) & 0x7fffffffu) > 0x7f800000u; }

/// exp(x) for x already in [-104, 88.75] (not NaN): x = n ln2 + r with |r| <= ln2/2
/// (Cody-Waite: ln2 in two parts, the first with 9 significant bits so n * ln2_hi is exact),
/// exp(r) by a degree-7 polynomial (Cephes' expf coefficients), then 2^n built in the exponent
/// field. With `two_factors`, as 2^(n/2) * 2^(n - n/2), so that results between 2^128 (overflow)
/// and 2^-149 (the smallest subnormal) are each rounded once; without, n must be in [-126, 127].
template <bool two_factors>
inline float exp_in_range(float x) {
  // n = round(x / ln2) by adding 1.5 * 2^23 (floats in [2^23, 2^24) are integers).
  constexpr float log2e = 1.44269504088896341f;
  constexpr float shifter = 12582912.0f;
  const float shifted = x * log2e + shifter;
  const std::int32_t n = static_cast<std::int32_t>(bits_of(shifted) - bits_of(shifter));
  const float nf = shifted - shifter;
  constexpr float ln2_hi = 0.693359375f;
  constexpr float ln2_lo = -2.12194440e-4f;
  float r = x - nf * ln2_hi;
  r = r - nf * ln2_lo;
  // exp(r) = 1 + r + r^2 * P(r) on [-0.35, 0.35].
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float exp_r = (p * (r * r) + r) + 1.0f;
  if constexpr (two_factors) {
    // n1 = floor(n / 2) (arithmetic shift, defined in C++20).
    const std::int32_t n1 = n >> 1;
    const std::int32_t n2 = n - n1;
    const float scale1 = float_of(static_cast<std::uint32_t>(n1 + 127) << 23);
    const float scale2 = float_of(static_cast<std::uint32_t>(n2 + 127) << 23);
    return exp_r * scale1 * scale2;
  } else {
    return exp_r * float_of(static_cast<std::uint32_t>(n + 127) << 23);
  }
}

/// exp(x) for float, every x: clamped to [-104, 88.75] (below -103.98 the result rounds to +0,
/// above 88.7228 it overflows to +inf, and both ends still do so after the clamp), NaN put back.
inline float exp(float x) {
  // On the bit pattern: a negative float below -104 has a larger pattern than -104's.
  const std::uint32_t b = bits_of(x);
  const bool negative = (b >> 31) != 0;
  float clamped = select(negative && b > 0xc2d00000u, -104.0f, x);
  clamped = select(!negative && b > 0x42b18000u, 88.75f, clamped);  // 88.75
  return select(is_nan(x), x, exp_in_range<true>(clamped));
}

/// tanh(x) for float, computed on |x| and given x's sign (so it is odd and -0 stays -0):
/// |x| < 0.625: x + x^3 P(x^2) (Cephes' tanhf coefficients); otherwise 1 - 2 / (exp(2|x|) + 1)
/// with |x| clamped to 9.5, where the result is already 1 in float.
inline float tanh(float x) {
  const std::uint32_t b = bits_of(x);
  const std::uint32_t sign = b & 0x80000000u;
  const std::uint32_t magnitude_bits = b & 0x7fffffffu;
  const float a = float_of(magnitude_bits);
  const float z = a * a;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * a + a;
  // 9.5: tanh rounds to 1 from 9.01 on (2 e^(-2|x|) < 2^-25); also keeps exp finite, and
  // clamps +inf and NaN (NaN is put back below).
  const float clamped = select(magnitude_bits > 0x41180000u, 9.5f, a);
  const float e = exp_in_range<false>(clamped + clamped);  // 2^n with n in [0, 28]
  const float large = 1.0f - 2.0f / (e + 1.0f);
  const float magnitude = select(magnitude_bits < 0x3f200000u, small, large);  // 0.625
  const float result = float_of(bits_of(magnitude) | sign);
  return select(magnitude_bits > 0x7f800000u, x, result);
}

/// sigmoid(x) = 1 / (1 + exp(-x)) for float, as e = exp(-|x|) (never overflows): 1 / (1 + e)
/// for x >= 0 and e / (1 + e) for x < 0, so large negative x keeps its relative accuracy and
/// its subnormal tail instead of flushing through 1 / (1 + inf).
inline float sigmoid(float x) {
  const std::uint32_t b = bits_of(x);
  const std::uint32_t minus_magnitude = b | 0x80000000u;  // -|x|
  const float e =
      exp_in_range<true>(select(minus_magnitude > 0xc2d00000u, -104.0f, float_of(minus_magnitude)));
  const float s = 1.0f / (1.0f + e);
  return select(is_nan(x), x, select((b >> 31) != 0, e * s, s));
}

}  // namespace tessera::detail::vector_math
