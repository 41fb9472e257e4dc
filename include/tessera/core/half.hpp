// The 16-bit float dtypes: tessera::half (IEEE binary16) and tessera::bfloat16 (float's exponent,
// 8-bit significand). Both store their bits in one uint16_t, layout-compatible with CUDA's __half
// and __nv_bfloat16, convert exactly to float and round to nearest even from float, double and
// integers with the same portable bit code on host and device; arithmetic is done in float.
#pragma once

#include <concepts>
#include <cstdint>
#include <iosfwd>
#include <limits>
#include <type_traits>

#include "tessera/core/config.hpp"

#if TESSERA_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace tessera {

namespace detail {

// __builtin_bit_cast rather than std::bit_cast: it is constexpr in g++, clang and nvcc device code
// without --expt-relaxed-constexpr, and needs no <bit>.
TESSERA_HOST_DEVICE constexpr std::uint32_t float_bits(float value) noexcept {
  return __builtin_bit_cast(std::uint32_t, value);
}
TESSERA_HOST_DEVICE constexpr float float_from_bits(std::uint32_t bits) noexcept {
  return __builtin_bit_cast(float, bits);
}
TESSERA_HOST_DEVICE constexpr std::uint64_t double_bits(double value) noexcept {
  return __builtin_bit_cast(std::uint64_t, value);
}

// Rounds `value >> shift` to nearest even (0 < shift < 64).
TESSERA_HOST_DEVICE constexpr std::uint64_t shift_right_round_even(std::uint64_t value,
                                                                   int shift) noexcept {
  const std::uint64_t kept = value >> shift;
  const std::uint64_t rest = value & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t halfway = std::uint64_t{1} << (shift - 1);
  return kept + ((rest > halfway || (rest == halfway && (kept & 1))) ? 1 : 0);
}

// Narrowing double -> float -> 16 bits would round twice and can miss the nearest value. Rounding
// the first step to odd (truncate, then set the last bit if anything was cut off) keeps enough
// information for the second step to round correctly, since float carries >= 2 more bits than
// either 16-bit format (Boldo & Melquiond, "When double rounding is odd", 2005).
TESSERA_HOST_DEVICE constexpr float double_to_float_round_odd(double value) noexcept {
  const std::uint64_t bits = double_bits(value);
  const std::uint32_t sign = static_cast<std::uint32_t>(bits >> 32) & 0x80000000u;
  const std::uint64_t magnitude = bits & 0x7fffffffffffffffull;
  const int exponent = static_cast<int>(magnitude >> 52);
  const std::uint64_t mantissa = magnitude & 0xfffffffffffffull;
  if (exponent == 0x7ff) {  // inf stays inf; NaN stays a quiet NaN with its top payload bits
    if (mantissa == 0) return float_from_bits(sign | 0x7f800000u);
    return float_from_bits(sign | 0x7fc00000u | static_cast<std::uint32_t>(mantissa >> 29));
  }
  if (magnitude == 0) return float_from_bits(sign);
  const int unbiased = exponent - 1023;
  if (unbiased > 127) return float_from_bits(sign | 0x7f7fffffu);  // odd, and above any target max
  if (unbiased >= -126) {
    const auto kept = static_cast<std::uint32_t>(mantissa >> 29);
    const std::uint32_t sticky = (mantissa & 0x1fffffffull) != 0 ? 1u : 0u;
    return float_from_bits(sign | (static_cast<std::uint32_t>(unbiased + 127) << 23) | kept |
                           sticky);
  }
  // Float subnormal range: count units of 2^-149.
  const std::uint64_t significand = exponent == 0 ? mantissa : (mantissa | (1ull << 52));
  const int scale = exponent == 0 ? -1022 : unbiased;
  const int shift = -97 - scale;
  if (shift >= 64) return float_from_bits(sign | 1u);
  const auto kept = static_cast<std::uint32_t>(significand >> shift);
  const std::uint32_t sticky = (significand & ((1ull << shift) - 1)) != 0 ? 1u : 0u;
  return float_from_bits(sign | kept | sticky);
}

// Integers above 2^24 are not exact in float; rounding to odd keeps the 16-bit result correct.
TESSERA_HOST_DEVICE constexpr float uint64_to_float_round_odd(std::uint64_t value) noexcept {
  if (value < (1ull << 24)) return static_cast<float>(value);
  int width = 24;
  while (width < 64 && (value >> width) != 0) ++width;
  const int shift = width - 24;
  const auto kept = static_cast<std::uint32_t>(value >> shift);
  const std::uint32_t sticky = (value & ((1ull << shift) - 1)) != 0 ? 1u : 0u;
  return float_from_bits((static_cast<std::uint32_t>(width - 1 + 127) << 23) |
                         ((kept | sticky) & 0x7fffffu));
}

template <std::integral I>
TESSERA_HOST_DEVICE constexpr float integer_to_float_round_odd(I value) noexcept {
  if constexpr (std::same_as<I, bool>) {
    return value ? 1.0f : 0.0f;
  } else if constexpr (std::is_signed_v<I>) {
    // Negate in unsigned arithmetic so the most negative value does not overflow.
    const bool negative = value < 0;
    const auto magnitude = negative ? std::uint64_t{0} - static_cast<std::uint64_t>(value)
                                    : static_cast<std::uint64_t>(value);
    const float result = uint64_to_float_round_odd(magnitude);
    return negative ? -result : result;
  } else {
    return uint64_to_float_round_odd(static_cast<std::uint64_t>(value));
  }
}

/// float -> binary16 bits, round to nearest even; NaN stays a quiet NaN with its sign and top
/// payload bits (as x86 F16C does).
TESSERA_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float value) noexcept {
  const std::uint32_t bits = float_bits(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {
    if (magnitude == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 (0x477ff000) is halfway between 65504 (odd significand) and 2^16: ties go to inf.
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  if (magnitude >= 0x38800000u) {  // normal half: rebias the exponent from 127 to 15
    return static_cast<std::uint16_t>(sign | shift_right_round_even(magnitude - 0x38000000u, 13));
  }
  // Half subnormal (or zero): count units of 2^-24. Below 2^-25 everything rounds to zero.
  const int exponent = static_cast<int>(magnitude >> 23);
  if (exponent < 102) return sign;
  const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  return static_cast<std::uint16_t>(sign | shift_right_round_even(significand, 126 - exponent));
}

/// binary16 bits -> float (exact; NaN payloads are kept).
TESSERA_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return float_from_bits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return float_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return float_from_bits(sign);
  // Subnormal half: normalise; every one is a normal float.
  std::uint32_t float_exponent = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --float_exponent;
  }
  return float_from_bits(sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13));
}

/// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN with its sign and top
/// payload bits.
TESSERA_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float value) noexcept {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  // Adding 0x7fff (+1 when the kept part is odd) carries exactly when rounding goes up; the carry
  // into the exponent also turns values above the largest bfloat16 into inf.
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/// bfloat16 bits -> float (exact).
TESSERA_HOST_DEVICE constexpr float bfloat16_bits_to_float(std::uint16_t bits) noexcept {
  return float_from_bits(static_cast<std::uint32_t>(bits) << 16);
}

// The operators shared by half and bfloat16, as hidden friends found through this base. Mixed
// overloads (with float, double, integers) exist because T converts to float and float converts
// to T: without them `h + 1.0f` would be ambiguous. The results follow C++ (and c10::Half):
// T op T -> T, T op float -> float, T op double -> double, T op integer -> T.
template <class T>
struct float16_operators {
#define TESSERA_FLOAT16_BINARY_OPERATOR(op)                                         \
  friend TESSERA_HOST_DEVICE constexpr T operator op(T a, T b) noexcept {           \
    return T(static_cast<float>(a) op static_cast<float>(b));                       \
  }                                                                                 \
  friend TESSERA_HOST_DEVICE constexpr float operator op(T a, float b) noexcept {   \
    return static_cast<float>(a) op b;                                              \
  }                                                                                 \
  friend TESSERA_HOST_DEVICE constexpr float operator op(float a, T b) noexcept {   \
    return a op static_cast<float>(b);                                              \
  }                                                                                 \
  friend TESSERA_HOST_DEVICE constexpr double operator op(T a, double b) noexcept { \
    return static_cast<double>(static_cast<float>(a)) op b;                         \
  }                                                                                 \
  friend TESSERA_HOST_DEVICE constexpr double operator op(double a, T b) noexcept { \
    return a op static_cast<double>(static_cast<float>(b));                         \
  }                                                                                 \
  template <std::integral I>                                                        \
  friend TESSERA_HOST_DEVICE constexpr T operator op(T a, I b) noexcept {           \
    return a op T(b);                                                               \
  }                                                                                 \
  template <std::integral I>                                                        \
  friend TESSERA_HOST_DEVICE constexpr T operator op(I a, T b) noexcept {           \
    return T(a) op b;                                                               \
  }
  TESSERA_FLOAT16_BINARY_OPERATOR(+)
  TESSERA_FLOAT16_BINARY_OPERATOR(-)
  TESSERA_FLOAT16_BINARY_OPERATOR(*)
  TESSERA_FLOAT16_BINARY_OPERATOR(/)
#undef TESSERA_FLOAT16_BINARY_OPERATOR

  friend TESSERA_HOST_DEVICE constexpr T operator-(T a) noexcept {
    return T::from_bits(static_cast<std::uint16_t>(a.bits() ^ 0x8000u));
  }
  friend TESSERA_HOST_DEVICE constexpr T operator+(T a) noexcept { return a; }

  // Compound assignment rounds the float (or double) result back to T once.
#define TESSERA_FLOAT16_COMPOUND_OPERATOR(op)                                  \
  template <class U>                                                           \
  requires std::is_arithmetic_v<U> || std::same_as<U, T>                       \
  friend TESSERA_HOST_DEVICE constexpr T& operator op##=(T& a, U b) noexcept { \
    a = T(a op b);                                                             \
    return a;                                                                  \
  }
  TESSERA_FLOAT16_COMPOUND_OPERATOR(+)
  TESSERA_FLOAT16_COMPOUND_OPERATOR(-)
  TESSERA_FLOAT16_COMPOUND_OPERATOR(*)
  TESSERA_FLOAT16_COMPOUND_OPERATOR(/)
#undef TESSERA_FLOAT16_COMPOUND_OPERATOR

  // Comparisons are not declared: T converts to float, and the built-in float comparisons give
  // IEEE semantics (NaN != NaN, -0 == +0) for T op T, T op float, T op int, ... alike.

  /// Prints the value as its float would print.
  template <class CharT, class Traits>
  friend std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os,
                                                       T value) {
    return os << static_cast<float>(value);
  }
};

}  // namespace detail

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 significand bits; max 65504, subnormals down to
/// 2^-24. Converts implicitly from float (rounding to nearest even) and to float (exactly);
/// from double and integers only explicitly (`half(x)`, `static_cast<half>(x)`), each rounded
/// once to nearest even. `half h = 1.0;` does not compile on purpose: an implicit path through
/// float would round twice. With CUDA, cuda_fp16.h declares a global `half` (CUDA's __half), so
/// spell it tessera::half (or through a namespace alias) rather than `using tessera::half;`.
struct half : detail::float16_operators<half> {
  half() = default;

  /// Rounds to nearest even (implicit, like c10::Half). A template taking exactly float, so
  /// that a double or an int cannot reach it implicitly through a standard conversion.
  template <std::same_as<float> F>
  TESSERA_HOST_DEVICE constexpr half(F value) noexcept : bits_(detail::float_to_half_bits(value)) {}
  /// Rounds to nearest even, once.
  TESSERA_HOST_DEVICE explicit constexpr half(double value) noexcept
      : bits_(detail::float_to_half_bits(detail::double_to_float_round_odd(value))) {}
  /// Rounds to nearest even, once; bool gives 0 or 1.
  template <std::integral I>
  TESSERA_HOST_DEVICE explicit constexpr half(I value) noexcept
      : bits_(detail::float_to_half_bits(detail::integer_to_float_round_odd(value))) {}

  /// The value whose binary16 encoding is `bits`.
  TESSERA_HOST_DEVICE static constexpr half from_bits(std::uint16_t bits) noexcept {
    half result;
    result.bits_ = bits;
    return result;
  }
  /// The binary16 encoding.
  TESSERA_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// Exact.
  TESSERA_HOST_DEVICE constexpr operator float() const noexcept {
    return detail::half_bits_to_float(bits_);
  }

#if TESSERA_CUDA
  /// From CUDA's type (same bits).
  TESSERA_HOST_DEVICE constexpr half(__half value) noexcept
      : bits_(__builtin_bit_cast(std::uint16_t, value)) {}
  /// To CUDA's type (same bits). Explicit: an implicit one would make T op T ambiguous with
  /// cuda_fp16.h's operators.
  TESSERA_HOST_DEVICE explicit constexpr operator __half() const noexcept {
    return __builtin_bit_cast(__half, bits_);
  }
#endif

 private:
  std::uint16_t bits_ = 0;
};

/// bfloat16: float's 8-bit exponent with an 8-bit significand (7 stored); same range as float,
/// including its subnormals. Conversions as for half: implicit from and to float, explicit from
/// double and integers, all rounded once to nearest even.
struct bfloat16 : detail::float16_operators<bfloat16> {
  bfloat16() = default;

  /// Rounds to nearest even (implicit, like c10::BFloat16); exactly float, as for half.
  template <std::same_as<float> F>
  TESSERA_HOST_DEVICE constexpr bfloat16(F value) noexcept
      : bits_(detail::float_to_bfloat16_bits(value)) {}
  /// Rounds to nearest even, once.
  TESSERA_HOST_DEVICE explicit constexpr bfloat16(double value) noexcept
      : bits_(detail::float_to_bfloat16_bits(detail::double_to_float_round_odd(value))) {}
  /// Rounds to nearest even, once; bool gives 0 or 1.
  template <std::integral I>
  TESSERA_HOST_DEVICE explicit constexpr bfloat16(I value) noexcept
      : bits_(detail::float_to_bfloat16_bits(detail::integer_to_float_round_odd(value))) {}

  /// The value whose bfloat16 encoding is `bits`.
  TESSERA_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept {
    bfloat16 result;
    result.bits_ = bits;
    return result;
  }
  /// The bfloat16 encoding (the top 16 bits of the float).
  TESSERA_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// Exact.
  TESSERA_HOST_DEVICE constexpr operator float() const noexcept {
    return detail::bfloat16_bits_to_float(bits_);
  }

#if TESSERA_CUDA
  /// From CUDA's type (same bits).
  TESSERA_HOST_DEVICE constexpr bfloat16(__nv_bfloat16 value) noexcept
      : bits_(__builtin_bit_cast(std::uint16_t, value)) {}
  /// To CUDA's type (same bits). Explicit for the same reason as half's.
  TESSERA_HOST_DEVICE explicit constexpr operator __nv_bfloat16() const noexcept {
    return __builtin_bit_cast(__nv_bfloat16, bits_);
  }
#endif

 private:
  std::uint16_t bits_ = 0;
};

static_assert(sizeof(half) == 2 && alignof(half) == 2, "half must match __half's layout");
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2,
              "bfloat16 must match __nv_bfloat16's layout");
static_assert(std::is_trivially_copyable_v<half> && std::is_trivially_copyable_v<bfloat16>);
#if TESSERA_CUDA
static_assert(sizeof(half) == sizeof(__half) && alignof(half) == alignof(__half));
static_assert(sizeof(bfloat16) == sizeof(__nv_bfloat16) &&
              alignof(bfloat16) == alignof(__nv_bfloat16));
#endif

// half op bfloat16 gives float, as PyTorch promotes them; without these it would be ambiguous.
#define TESSERA_MIXED_FLOAT16_OPERATOR(op)                                       \
  TESSERA_HOST_DEVICE constexpr float operator op(half a, bfloat16 b) noexcept { \
    return static_cast<float>(a) op static_cast<float>(b);                       \
  }                                                                              \
  TESSERA_HOST_DEVICE constexpr float operator op(bfloat16 a, half b) noexcept { \
    return static_cast<float>(a) op static_cast<float>(b);                       \
  }
TESSERA_MIXED_FLOAT16_OPERATOR(+)
TESSERA_MIXED_FLOAT16_OPERATOR(-)
TESSERA_MIXED_FLOAT16_OPERATOR(*)
TESSERA_MIXED_FLOAT16_OPERATOR(/)
#undef TESSERA_MIXED_FLOAT16_OPERATOR

/// True for NaN (any payload, either sign).
TESSERA_HOST_DEVICE constexpr bool isnan(half value) noexcept {
  return (value.bits() & 0x7fffu) > 0x7c00u;
}
TESSERA_HOST_DEVICE constexpr bool isnan(bfloat16 value) noexcept {
  return (value.bits() & 0x7fffu) > 0x7f80u;
}
/// True for +inf and -inf.
TESSERA_HOST_DEVICE constexpr bool isinf(half value) noexcept {
  return (value.bits() & 0x7fffu) == 0x7c00u;
}
TESSERA_HOST_DEVICE constexpr bool isinf(bfloat16 value) noexcept {
  return (value.bits() & 0x7fffu) == 0x7f80u;
}
/// True unless NaN or infinite.
TESSERA_HOST_DEVICE constexpr bool isfinite(half value) noexcept {
  return (value.bits() & 0x7c00u) != 0x7c00u;
}
TESSERA_HOST_DEVICE constexpr bool isfinite(bfloat16 value) noexcept {
  return (value.bits() & 0x7f80u) != 0x7f80u;
}

}  // namespace tessera

namespace std {

template <>
class numeric_limits<tessera::half> {
 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr float_denorm_style has_denorm = denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  // clang-format off
  TESSERA_HOST_DEVICE static constexpr tessera::half min() noexcept { return tessera::half::from_bits(0x0400); }
  TESSERA_HOST_DEVICE static constexpr tessera::half max() noexcept { return tessera::half::from_bits(0x7bff); }
  TESSERA_HOST_DEVICE static constexpr tessera::half lowest() noexcept { return tessera::half::from_bits(0xfbff); }
  TESSERA_HOST_DEVICE static constexpr tessera::half epsilon() noexcept { return tessera::half::from_bits(0x1400); }
  TESSERA_HOST_DEVICE static constexpr tessera::half round_error() noexcept { return tessera::half::from_bits(0x3800); }
  TESSERA_HOST_DEVICE static constexpr tessera::half infinity() noexcept { return tessera::half::from_bits(0x7c00); }
  TESSERA_HOST_DEVICE static constexpr tessera::half quiet_NaN() noexcept { return tessera::half::from_bits(0x7e00); }
  TESSERA_HOST_DEVICE static constexpr tessera::half signaling_NaN() noexcept { return tessera::half::from_bits(0x7d00); }
  TESSERA_HOST_DEVICE static constexpr tessera::half denorm_min() noexcept { return tessera::half::from_bits(0x0001); }
  // clang-format on
};

template <>
class numeric_limits<tessera::bfloat16> {
 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr float_denorm_style has_denorm = denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_to_nearest;
  // Not one of IEEE 754's interchange formats (c10::BFloat16 says the same), though it follows
  // IEEE arithmetic rules.
  static constexpr bool is_iec559 = false;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  // clang-format off
  TESSERA_HOST_DEVICE static constexpr tessera::bfloat16 min() noexcept { return tessera::bfloat16::from_bits(0x0080); }
  TESSERA_HOST_DEVICE static constexpr tessera::bfloat16 max() noexcept { return tessera::bfloat16::from_bits(0x7f7f); }
  TESSERA_HOST_DEVICE static constexpr tessera::bfloat16 lowest() noexcept { return tessera::bfloat16::from_bits(0xff7f); }
  TESSERA_HOST_DEVICE static constexpr tessera::bfloat16 epsilon() noexcept { return tessera::bfloat16::from_bits(0x3c00); }
  TESSERA_HOST_DEVICE static constexpr tessera::bfloat16 round_error() noexcept { return tessera::bfloat16::from_bits(0x3f00); }
  TESSERA_HOST_DEVICE static constexpr tessera::bfloat16 infinity() noexcept { return tessera::bfloat16::from_bits(0x7f80); }
  TESSERA_HOST_DEVICE static constexpr tessera::bfloat16 quiet_NaN() noexcept { return tessera::bfloat16::from_bits(0x7fc0); }
  TESSERA_HOST_DEVICE static constexpr tessera::bfloat16 signaling_NaN() noexcept { return tessera::bfloat16::from_bits(0x7fa0); }
  TESSERA_HOST_DEVICE static constexpr tessera::bfloat16 denorm_min() noexcept { return tessera::bfloat16::from_bits(0x0001); }
  // clang-format on
};

}  // namespace std
