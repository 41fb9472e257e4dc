// tessera::half and tessera::bfloat16 against the CUDA toolkit's host-side conversions
// (__float2half_rn, __float2bfloat16_rn, __double2bfloat16, __ll2bfloat16_rn, ... from
// cuda_fp16.h / cuda_bf16.h, compiled by the host compiler; no GPU and no cudart involved).
// tests/oracles.cmake adds the toolkit's include directory. CUDA turns every NaN into 0x7fff, so
// for NaN inputs the check is Tessera's own promise: a quiet NaN with the input's sign.
#include <catch2/catch.hpp>

#if __has_include(<cuda_bf16.h>) && __has_include(<cuda_fp16.h>)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/core/half.hpp"

namespace half_cuda_oracle_test {  // one namespace per test file: unity builds compile several together

namespace {

// cuda_fp16.h declares a global `half` (and cuda_bf16.h `nv_bfloat16`); spell Tessera's in full.
using tessera_half = tessera::half;
using tessera_bfloat16 = tessera::bfloat16;

template <class To, class From>
To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

std::uint16_t cuda_bits(__half value) { return static_cast<__half_raw>(value).x; }
std::uint16_t cuda_bits(__nv_bfloat16 value) { return static_cast<__nv_bfloat16_raw>(value).x; }
__half cuda_half(std::uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half(raw);
}
__nv_bfloat16 cuda_bfloat16(std::uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __nv_bfloat16(raw);
}

std::string hex(std::uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

struct format {
  std::uint16_t exponent_mask;  // all-ones exponent: inf/NaN
  std::uint16_t quiet_bit;
};
constexpr format half_format{0x7c00, 0x0200};
constexpr format bfloat16_format{0x7f80, 0x0040};

struct mismatch_log {
  std::size_t count = 0;
  std::size_t checked = 0;
  std::string first;

  // `input_negative` is the input's sign: CUDA's canonical NaN has none, Tessera keeps it.
  void check(format f, std::uint64_t input_bits, bool input_negative, std::uint16_t actual,
             std::uint16_t expected) {
    ++checked;
    const bool expected_nan = (expected & 0x7fffu) > f.exponent_mask;
    const bool ok = expected_nan
                        ? ((actual & 0x7fffu) > f.exponent_mask && (actual & f.quiet_bit) != 0 &&
                           ((actual & 0x8000u) != 0) == input_negative)
                        : actual == expected;
    if (ok) return;
    if (count < 10) {
      first += "input " + hex(input_bits) + ": got " + hex(actual) + ", expected " + hex(expected) +
               "\n";
    }
    ++count;
  }
};

void check_float(mismatch_log& half_log, mismatch_log& bfloat16_log, std::uint32_t bits) {
  const auto value = bit_cast<float>(bits);
  const bool negative = (bits >> 31) != 0;
  half_log.check(half_format, bits, negative, tessera_half(value).bits(),
                 cuda_bits(__float2half_rn(value)));
  bfloat16_log.check(bfloat16_format, bits, negative, tessera_bfloat16(value).bits(),
                     cuda_bits(__float2bfloat16_rn(value)));
}

void check_double(mismatch_log& half_log, mismatch_log& bfloat16_log, double value) {
  const auto bits = bit_cast<std::uint64_t>(value);
  const bool negative = (bits >> 63) != 0;
  half_log.check(half_format, bits, negative, tessera_half(value).bits(),
                 cuda_bits(__double2half(value)));
  bfloat16_log.check(bfloat16_format, bits, negative, tessera_bfloat16(value).bits(),
                     cuda_bits(__double2bfloat16(value)));
}

// The CUDA host code converts through float and back with a cast that is undefined at 2^63, so
// integers stay below 2^62 in magnitude.
template <class I>
void check_integer(mismatch_log& half_log, mismatch_log& bfloat16_log, I value) {
  const auto wide = static_cast<long long>(value);
  const auto bits = static_cast<std::uint64_t>(wide);
  half_log.check(half_format, bits, wide < 0, tessera_half(value).bits(),
                 cuda_bits(__ll2half_rn(wide)));
  bfloat16_log.check(bfloat16_format, bits, wide < 0, tessera_bfloat16(value).bits(),
                     cuda_bits(__ll2bfloat16_rn(wide)));
}

#define TESSERA_REPORT(log)       \
  do {                            \
    INFO(#log ": " << log.first); \
    CHECK(log.count == 0);        \
  } while (false)

}  // namespace

TEST_CASE("half -> float matches __half2float for all 65536 bit patterns", "[half][cuda_oracle]") {
  std::size_t wrong = 0;
  std::string first;
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const float actual = tessera_half::from_bits(static_cast<std::uint16_t>(bits));
    const float expected = __half2float(cuda_half(static_cast<std::uint16_t>(bits)));
    // CUDA's host code returns a canonical NaN; Tessera keeps the payload (as numpy does).
    const bool ok = expected != expected
                        ? actual != actual && std::signbit(actual) == ((bits & 0x8000u) != 0)
                        : bit_cast<std::uint32_t>(actual) == bit_cast<std::uint32_t>(expected);
    if (!ok && wrong++ < 10) first += hex(bits) + " ";
  }
  INFO("wrong for " << first);
  CHECK(wrong == 0);
}

TEST_CASE("bfloat16 -> float matches __bfloat162float for all 65536 bit patterns",
          "[bfloat16][cuda_oracle]") {
  std::size_t wrong = 0;
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const float actual = tessera_bfloat16::from_bits(static_cast<std::uint16_t>(bits));
    const float expected = __bfloat162float(cuda_bfloat16(static_cast<std::uint16_t>(bits)));
    wrong += bit_cast<std::uint32_t>(actual) != bit_cast<std::uint32_t>(expected) ? 1 : 0;
  }
  CHECK(wrong == 0);
}

TEST_CASE("float -> half and bfloat16 match __float2half_rn and __float2bfloat16_rn",
          "[half][bfloat16][cuda_oracle]") {
  mismatch_log half_log;
  mismatch_log bfloat16_log;
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    // Every bfloat16 value, every midpoint between neighbours (the last one is the overflow
    // threshold) and the floats one ulp either side of it.
    for (std::uint32_t k = 0; k < 65536; ++k) check_float(half_log, bfloat16_log, k << 16);
    for (std::uint32_t k = 0; k < 0x7f80; ++k) {
      const std::uint32_t midpoint = sign | (k << 16) | 0x8000u;
      for (std::uint32_t bits : {midpoint - 1, midpoint, midpoint + 1}) {
        check_float(half_log, bfloat16_log, bits);
      }
    }
    // Every half value, every midpoint between finite neighbours (and 65520, above max), +-1 ulp.
    for (std::uint32_t k = 0; k <= 0x7c00; ++k) {
      const float low = __half2float(cuda_half(static_cast<std::uint16_t>(k)));
      check_float(half_log, bfloat16_log, sign | bit_cast<std::uint32_t>(low));
      if (k == 0x7c00) break;
      const float high =
          k == 0x7bff ? 65536.0f : __half2float(cuda_half(static_cast<std::uint16_t>(k + 1)));
      const auto midpoint = bit_cast<std::uint32_t>(
          static_cast<float>((static_cast<double>(low) + static_cast<double>(high)) / 2));
      for (std::uint32_t bits : {midpoint - 1, midpoint, midpoint + 1}) {
        check_float(half_log, bfloat16_log, sign | bits);
      }
    }
    // Float subnormals and the smallest normals.
    for (std::uint32_t bits = 0; bits < 0x01000000u; bits += 97) {
      check_float(half_log, bfloat16_log, sign | bits);
    }
  }
  // Infinities and NaNs with assorted payloads, both signs.
  for (std::uint32_t bits :
       {0x7f800000u, 0xff800000u, 0x7f800001u, 0xff800001u, 0x7fc00000u, 0xffc00000u, 0x7fffffffu,
        0xffffffffu, 0x7fa00000u, 0x7f808000u, 0x7f802000u, 0xffc12345u, 0x7f810000u}) {
    check_float(half_log, bfloat16_log, bits);
  }
  std::mt19937_64 random(0x5eed'0001);
  for (int i = 0; i < 1'000'000; ++i) {
    check_float(half_log, bfloat16_log, static_cast<std::uint32_t>(random()));
  }
  CHECK(bfloat16_log.checked > 2 * (65536 + 3 * 0x7f80) + 1'000'000);
  TESSERA_REPORT(half_log);
  TESSERA_REPORT(bfloat16_log);
}

TEST_CASE("double -> half and bfloat16 match __double2half and __double2bfloat16",
          "[half][bfloat16][cuda_oracle]") {
  mismatch_log half_log;
  mismatch_log bfloat16_log;
  // Midpoints of both formats, nudged by one double ulp and by 2^-30 relative: a conversion that
  // went through float would see the nudged values as exact ties.
  std::vector<double> midpoints;
  for (std::uint32_t k = 0; k < 0x7f80; ++k) {
    midpoints.push_back(static_cast<double>(bit_cast<float>((k << 16) | 0x8000u)));
  }
  for (std::uint32_t k = 0; k < 0x7c00; ++k) {
    const double low = __half2float(cuda_half(static_cast<std::uint16_t>(k)));
    const double high =
        k == 0x7bff ? 65536.0 : __half2float(cuda_half(static_cast<std::uint16_t>(k + 1)));
    midpoints.push_back((low + high) / 2);
  }
  for (double midpoint : midpoints) {
    for (double sign : {1.0, -1.0}) {
      const double value = sign * midpoint;
      for (double nudged :
           {value, std::nextafter(value, -2 * value), std::nextafter(value, 2 * value),
            value * (1 + 0x1p-30), value * (1 - 0x1p-30)}) {
        check_double(half_log, bfloat16_log, nudged);
      }
    }
  }
  constexpr double inf = std::numeric_limits<double>::infinity();
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  for (double value : {0.0, -0.0, inf, -inf, nan, -nan, 1e300, -1e300, 5e-324, 0x1p-149, 0x1p-150,
                       0x1.8p-150, 0x1p-126, 3.4028235677973366e38}) {
    check_double(half_log, bfloat16_log, value);
  }
  std::mt19937_64 random(0x5eed'0002);
  std::uniform_real_distribution<double> exponent(-140.0, 130.0);
  for (int i = 0; i < 300'000; ++i) {
    check_double(half_log, bfloat16_log, bit_cast<double>(random()));
    check_double(half_log, bfloat16_log, (random() & 1 ? -1.0 : 1.0) * std::exp2(exponent(random)));
  }
  TESSERA_REPORT(half_log);
  TESSERA_REPORT(bfloat16_log);
}

TEST_CASE("integers -> half and bfloat16 match __ll2half_rn and __ll2bfloat16_rn",
          "[half][bfloat16][cuda_oracle]") {
  mismatch_log half_log;
  mismatch_log bfloat16_log;
  for (int value = -70000; value <= 70000; ++value) check_integer(half_log, bfloat16_log, value);
  for (int value = -128; value <= 127; ++value) {
    check_integer(half_log, bfloat16_log, static_cast<std::int8_t>(value));
    check_integer(half_log, bfloat16_log, static_cast<std::uint8_t>(value + 128));
  }
  check_integer(half_log, bfloat16_log, true);
  check_integer(half_log, bfloat16_log, false);
  check_integer(half_log, bfloat16_log, std::numeric_limits<std::int16_t>::min());
  check_integer(half_log, bfloat16_log, std::numeric_limits<std::int32_t>::min());
  check_integer(half_log, bfloat16_log, std::numeric_limits<std::int32_t>::max());
  std::mt19937_64 random(0x5eed'0003);
  for (int i = 0; i < 300'000; ++i) {
    // A random width, then values at and next to the bfloat16 ties of that width.
    const int width = 1 + static_cast<int>(random() % 62);
    const auto magnitude = static_cast<std::int64_t>(random() >> (64 - width));
    const std::int64_t value = random() & 1 ? -magnitude : magnitude;
    check_integer(half_log, bfloat16_log, value);
    if (width > 9) {
      const int cut = width - 8;
      const std::int64_t tie = ((magnitude >> cut) << cut) | (std::int64_t{1} << (cut - 1));
      for (std::int64_t nudged : {tie - 1, tie, tie + 1}) {
        check_integer(half_log, bfloat16_log, nudged);
        check_integer(half_log, bfloat16_log, -nudged);
      }
    }
    check_integer(half_log, bfloat16_log, static_cast<std::int32_t>(value));
  }
  TESSERA_REPORT(half_log);
  TESSERA_REPORT(bfloat16_log);
}

#else

TEST_CASE("the CUDA toolkit's cuda_fp16.h and cuda_bf16.h are needed", "[cuda_oracle]") {
  FAIL(
      "cuda_bf16.h / cuda_fp16.h not found: install the CUDA toolkit (headers only are needed) "
      "or set TESSERA_CUDA_FP16_INCLUDE_DIR; this test is the independent oracle for "
      "tessera::half and tessera::bfloat16");
}

#endif

}  // namespace half_cuda_oracle_test
