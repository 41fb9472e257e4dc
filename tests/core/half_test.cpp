// tessera::half and tessera::bfloat16 on the host. The conversions are checked bit for bit against
// numpy (tests/oracles/half_reference.py writes the data; CTest runs it first as fixture
// oracles.half); tests/core/half_cuda_oracle_test.cpp checks both types against the CUDA toolkit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/core/half.hpp"

namespace half_test {  // one namespace per test file: unity builds compile several together

// An alias, not `using tessera::half;`: with CUDA, cuda_fp16.h declares a global `half`.
namespace ts = tessera;

namespace {

// Reads a little-endian raw array written by half_reference.py. Missing data is a failure, not a
// skip: a test that cannot see its oracle has checked nothing.
template <class T>
std::vector<T> read_oracle(const std::string& name) {
  const char* directory = std::getenv("TESSERA_ORACLE_DIR");
  if (directory == nullptr) {
    FAIL("TESSERA_ORACLE_DIR is not set; run this test through ctest (fixture oracles.half)");
  }
  const std::string path = std::string(directory) + "/" + name;
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) {
    FAIL("oracle file " << path << " is missing; run tests/oracles/half_reference.py " << directory
                        << " (ctest does so as fixture oracles.half)");
  }
  const auto bytes = static_cast<std::size_t>(file.tellg());
  REQUIRE(bytes % sizeof(T) == 0);
  std::vector<T> values(bytes / sizeof(T));
  file.seekg(0);
  file.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(bytes));
  REQUIRE(file.good());
  static_assert(std::endian::native == std::endian::little, "the oracle files are little-endian");
  return values;
}

std::string hex(std::uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

float float_of_bits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

std::uint32_t bits_of_float(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Compares 16-bit results with the oracle's. numpy keeps a NaN's payload without setting the
// quiet bit (0x7f800001 -> 0x7c01); Tessera promises a quiet NaN of the same sign, so NaNs are
// compared on that promise and everything else bit for bit.
struct mismatch_log {
  std::size_t count = 0;
  std::string first;

  void check_half(std::uint64_t input_bits, std::uint16_t actual, std::uint16_t expected) {
    const bool expected_nan = (expected & 0x7fffu) > 0x7c00u;
    const bool ok = expected_nan ? ((actual & 0x7fffu) > 0x7c00u && (actual & 0x0200u) != 0 &&
                                    (actual & 0x8000u) == (expected & 0x8000u))
                                 : actual == expected;
    record(ok, input_bits, actual, expected);
  }

  void record(bool ok, std::uint64_t input_bits, std::uint16_t actual, std::uint16_t expected) {
    if (ok) return;
    if (count < 10) {
      first += "input " + hex(input_bits) + ": got " + hex(actual) + ", expected " + hex(expected) +
               "\n";
    }
    ++count;
  }
};

}  // namespace

TEST_CASE("half and bfloat16 have the layout of __half and __nv_bfloat16", "[half]") {
  STATIC_REQUIRE(sizeof(ts::half) == 2);
  STATIC_REQUIRE(alignof(ts::half) == 2);
  STATIC_REQUIRE(sizeof(ts::bfloat16) == 2);
  STATIC_REQUIRE(alignof(ts::bfloat16) == 2);
  STATIC_REQUIRE(std::is_trivially_copyable_v<ts::half>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<ts::bfloat16>);
  STATIC_REQUIRE(std::is_standard_layout_v<ts::half>);
  STATIC_REQUIRE(std::is_standard_layout_v<ts::bfloat16>);
  STATIC_REQUIRE(ts::half{}.bits() == 0);
  STATIC_REQUIRE(ts::bfloat16{}.bits() == 0);
  ts::half values[3];
  CHECK(values[2].bits() == 0);
}

TEST_CASE("which conversions are implicit", "[half]") {
  STATIC_REQUIRE(std::is_convertible_v<float, ts::half>);
  STATIC_REQUIRE(std::is_convertible_v<ts::half, float>);
  STATIC_REQUIRE(std::is_convertible_v<float, ts::bfloat16>);
  STATIC_REQUIRE(std::is_convertible_v<ts::bfloat16, float>);
  // Everything else needs T(x): an implicit detour through float would round twice.
  STATIC_REQUIRE_FALSE(std::is_convertible_v<double, ts::half>);
  STATIC_REQUIRE_FALSE(std::is_convertible_v<int, ts::half>);
  STATIC_REQUIRE_FALSE(std::is_convertible_v<double, ts::bfloat16>);
  STATIC_REQUIRE_FALSE(std::is_convertible_v<ts::half, ts::bfloat16>);
  STATIC_REQUIRE(std::is_constructible_v<ts::half, double>);
  STATIC_REQUIRE(std::is_constructible_v<ts::half, std::int64_t>);
  STATIC_REQUIRE(std::is_constructible_v<ts::half, bool>);
  STATIC_REQUIRE(std::is_constructible_v<ts::bfloat16, std::uint8_t>);
  // Through float: exact, then one rounding.
  STATIC_REQUIRE(std::is_constructible_v<ts::half, ts::bfloat16>);
  STATIC_REQUIRE(std::is_constructible_v<double, ts::half>);
  STATIC_REQUIRE(std::is_constructible_v<int, ts::bfloat16>);
}

TEST_CASE("half -> float matches numpy for all 65536 bit patterns", "[half][oracle]") {
  const auto expected = read_oracle<std::uint32_t>("half_to_float.u32");
  REQUIRE(expected.size() == 65536);
  mismatch_log log;
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const float value = ts::half::from_bits(static_cast<std::uint16_t>(bits));
    if (bits_of_float(value) != expected[bits] && log.count < 10) {
      log.first += "half " + hex(bits) + ": got " + hex(bits_of_float(value)) + ", expected " +
                   hex(expected[bits]) + "\n";
    }
    log.count += bits_of_float(value) != expected[bits] ? 1 : 0;
  }
  INFO(log.first);
  CHECK(log.count == 0);
}

TEST_CASE("isnan, isinf and isfinite agree with the float of every half", "[half][oracle]") {
  const auto expected = read_oracle<std::uint32_t>("half_to_float.u32");
  REQUIRE(expected.size() == 65536);
  std::size_t wrong = 0;
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const ts::half value = ts::half::from_bits(static_cast<std::uint16_t>(bits));
    const float reference = float_of_bits(expected[bits]);
    wrong += tessera::isnan(value) != std::isnan(reference) ? 1 : 0;
    wrong += tessera::isinf(value) != std::isinf(reference) ? 1 : 0;
    wrong += tessera::isfinite(value) != std::isfinite(reference) ? 1 : 0;
  }
  CHECK(wrong == 0);
}

TEST_CASE("float -> half matches numpy (round trips, ties, overflow, random)", "[half][oracle]") {
  const auto inputs = read_oracle<std::uint32_t>("float_to_half.in.u32");
  const auto expected = read_oracle<std::uint16_t>("float_to_half.out.u16");
  REQUIRE(inputs.size() == expected.size());
  // 65536 round trips + 3 x 2 x 31743 ties and neighbours + 400000 random, at least.
  REQUIRE(inputs.size() > 65536 + 6 * 31743 + 400000);
  mismatch_log log;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    log.check_half(inputs[i], ts::half(float_of_bits(inputs[i])).bits(), expected[i]);
  }
  INFO(log.first);
  CHECK(log.count == 0);
}

TEST_CASE("double -> half matches numpy, rounding once", "[half][oracle]") {
  const auto inputs = read_oracle<std::uint64_t>("double_to_half.in.u64");
  const auto expected = read_oracle<std::uint16_t>("double_to_half.out.u16");
  REQUIRE(inputs.size() == expected.size());
  REQUIRE(inputs.size() > 5 * 2 * 31743 + 400000);
  mismatch_log log;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    double value;
    std::memcpy(&value, &inputs[i], sizeof value);
    log.check_half(inputs[i], ts::half(value).bits(), expected[i]);
  }
  INFO(log.first);
  CHECK(log.count == 0);
}

TEST_CASE("conversions are constant expressions", "[half]") {
  STATIC_REQUIRE(ts::half(1.0f).bits() == 0x3c00);
  STATIC_REQUIRE(ts::half(-2.0f).bits() == 0xc000);
  STATIC_REQUIRE(ts::half(65504.0f).bits() == 0x7bff);
  STATIC_REQUIRE(ts::half(65520.0f).bits() == 0x7c00);  // the tie above max rounds to inf
  STATIC_REQUIRE(ts::half(-0.0f).bits() == 0x8000);
  STATIC_REQUIRE(static_cast<float>(ts::half::from_bits(0x0001)) == 5.9604644775390625e-08f);
  STATIC_REQUIRE(ts::bfloat16(1.0f).bits() == 0x3f80);
  STATIC_REQUIRE(ts::bfloat16(3.0e38f).bits() == 0x7f62);
  STATIC_REQUIRE(static_cast<float>(ts::bfloat16::from_bits(0x4049)) == 3.140625f);
  STATIC_REQUIRE(ts::half(0.1).bits() == 0x2e66);
  STATIC_REQUIRE(ts::bfloat16(1e-40).bits() == 0x0001);  // bfloat16 keeps float's subnormals
}

TEST_CASE("integers convert rounding once to nearest even", "[half]") {
  CHECK(ts::half(0).bits() == 0x0000);
  CHECK(ts::half(true).bits() == 0x3c00);
  CHECK(ts::half(false).bits() == 0x0000);
  CHECK(static_cast<float>(ts::half(std::uint8_t{255})) == 255.0f);
  CHECK(static_cast<float>(ts::half(std::int8_t{-128})) == -128.0f);
  CHECK(static_cast<float>(ts::half(2049)) == 2048.0f);  // tie, to even
  CHECK(static_cast<float>(ts::half(2051)) == 2052.0f);  // tie, to even
  CHECK(static_cast<float>(ts::half(65519)) == 65504.0f);
  CHECK(tessera::isinf(ts::half(65520)));
  CHECK(ts::half(std::numeric_limits<std::int64_t>::min()).bits() == 0xfc00);
  CHECK(ts::half(std::numeric_limits<std::uint64_t>::max()).bits() == 0x7c00);
  // 2^24 + 2^16 + 1 is just above the tie 2^24 + 2^16 between two bfloat16s; float alone would
  // round it onto the tie (and then to even, 2^24).
  CHECK(static_cast<float>(ts::bfloat16(16777216 + 65536 + 1)) == 16777216.0f + 131072.0f);
  CHECK(static_cast<float>(ts::bfloat16(16777216 + 65536)) == 16777216.0f);
  CHECK(static_cast<float>(ts::bfloat16(-(16777216 + 65536 + 1))) == -(16777216.0f + 131072.0f));
  CHECK(static_cast<float>(ts::bfloat16(std::numeric_limits<std::int64_t>::max())) ==
        9223372036854775808.0f);
  CHECK(static_cast<int>(ts::half(7.75f)) == 7);
}

TEST_CASE("float -> bfloat16 special values", "[half]") {
  // The independent bit-exact check is half_cuda_oracle_test; these are the documented corners.
  CHECK(ts::bfloat16(std::numeric_limits<float>::infinity()).bits() == 0x7f80);
  CHECK(ts::bfloat16(-std::numeric_limits<float>::infinity()).bits() == 0xff80);
  CHECK(ts::bfloat16(std::numeric_limits<float>::max()).bits() == 0x7f80);  // overflows on rounding
  CHECK(ts::bfloat16(-0.0f).bits() == 0x8000);
  CHECK(ts::bfloat16(float_of_bits(0x7f800001)).bits() == 0x7fc0);  // signalling NaN made quiet
  CHECK(ts::bfloat16(float_of_bits(0xff812345)).bits() == 0xffc1);  // sign and top payload kept
  CHECK(ts::bfloat16(float_of_bits(0x3f808000)).bits() == 0x3f80);  // tie, to even (down)
  CHECK(ts::bfloat16(float_of_bits(0x3f818000)).bits() == 0x3f82);  // tie, to even (up)
  CHECK(ts::bfloat16(float_of_bits(0x3f808001)).bits() == 0x3f81);
  CHECK(ts::bfloat16(float_of_bits(0x00000001)).bits() == 0x0000);
  CHECK(ts::bfloat16(float_of_bits(0x00008000)).bits() == 0x0000);  // tie, to even
  CHECK(ts::bfloat16(float_of_bits(0x00018000)).bits() == 0x0002);
}

TEST_CASE("numeric_limits", "[half]") {
  using half_limits = std::numeric_limits<ts::half>;
  using bfloat16_limits = std::numeric_limits<ts::bfloat16>;
  STATIC_REQUIRE(half_limits::is_specialized);
  STATIC_REQUIRE(half_limits::is_iec559);
  STATIC_REQUIRE(half_limits::has_infinity && half_limits::has_quiet_NaN);
  STATIC_REQUIRE(half_limits::digits == 11);
  STATIC_REQUIRE(bfloat16_limits::digits == 8);
  STATIC_REQUIRE(bfloat16_limits::max_exponent == std::numeric_limits<float>::max_exponent);
  STATIC_REQUIRE(bfloat16_limits::min_exponent == std::numeric_limits<float>::min_exponent);
  // Decimal values from IEEE 754-2008 binary16 and the bfloat16 format description.
  CHECK(static_cast<float>(half_limits::max()) == 65504.0f);
  CHECK(static_cast<float>(half_limits::lowest()) == -65504.0f);
  CHECK(static_cast<float>(half_limits::min()) == 6.103515625e-05f);
  CHECK(static_cast<float>(half_limits::epsilon()) == 0.0009765625f);
  CHECK(static_cast<float>(half_limits::round_error()) == 0.5f);
  CHECK(static_cast<float>(half_limits::denorm_min()) == 5.9604644775390625e-08f);
  CHECK(std::isinf(static_cast<float>(half_limits::infinity())));
  CHECK(std::isnan(static_cast<float>(half_limits::quiet_NaN())));
  CHECK(std::isnan(static_cast<float>(half_limits::signaling_NaN())));
  CHECK(static_cast<float>(bfloat16_limits::max()) == 3.38953138925153547590470800371487866880e38f);
  CHECK(static_cast<float>(bfloat16_limits::lowest()) ==
        -3.38953138925153547590470800371487866880e38f);
  CHECK(static_cast<float>(bfloat16_limits::min()) == std::numeric_limits<float>::min());
  CHECK(static_cast<float>(bfloat16_limits::epsilon()) == 0.0078125f);
  CHECK(static_cast<float>(bfloat16_limits::denorm_min()) == 9.18354961579912115600575419705e-41f);
  CHECK(std::isinf(static_cast<float>(bfloat16_limits::infinity())));
  CHECK(std::isnan(static_cast<float>(bfloat16_limits::quiet_NaN())));
  // epsilon is the gap above 1, max is below the overflow threshold, as the definitions say.
  CHECK(static_cast<float>(ts::half(1.0f + static_cast<float>(half_limits::epsilon()))) > 1.0f);
  CHECK(ts::bfloat16(1.0f + static_cast<float>(bfloat16_limits::epsilon()) / 2).bits() == 0x3f80);
}

TEST_CASE("arithmetic is float arithmetic rounded back", "[half]") {
  STATIC_REQUIRE(std::is_same_v<decltype(ts::half() + ts::half()), ts::half>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::half() * 2), ts::half>);
  STATIC_REQUIRE(std::is_same_v<decltype(2 * ts::half()), ts::half>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::half() + 1.0f), float>);
  STATIC_REQUIRE(std::is_same_v<decltype(1.0f - ts::half()), float>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::half() / 2.0), double>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::half() + ts::bfloat16()), float>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::bfloat16() - ts::bfloat16()), ts::bfloat16>);
  STATIC_REQUIRE(std::is_same_v<decltype(-ts::bfloat16()), ts::bfloat16>);

  CHECK(static_cast<float>(ts::half(2048.0f) + ts::half(1.0f)) ==
        2048.0f);  // 2049 is a tie, to even
  CHECK(static_cast<float>(ts::half(2048.0f) + ts::half(3.0f)) == 2052.0f);
  CHECK((ts::half(1.0f) / ts::half(3.0f)).bits() == 0x3555);  // numpy: float16(1/3)
  CHECK((ts::half(0.1f) + ts::half(0.2f)).bits() == 0x34cc);  // numpy: a tie, to even
  CHECK(tessera::isinf(ts::half(60000.0f) + ts::half(60000.0f)));
  CHECK(static_cast<float>(ts::bfloat16(256.0f) + ts::bfloat16(1.0f)) == 256.0f);
  CHECK(static_cast<float>(ts::bfloat16(1.0f) / ts::bfloat16(3.0f)) == 0.333984375f);
  CHECK(static_cast<float>(ts::half(1.5f) * 2) == 3.0f);
  CHECK(ts::half(1.5f) + 0.25f == 1.75f);

  ts::half h(1.0f);
  h += 1;
  h *= ts::half(3.0f);
  h -= 0.5f;
  h /= 2.0;
  CHECK(static_cast<float>(h) == 2.75f);
  ts::bfloat16 b(10.0f);
  b += ts::bfloat16(0.03125f);  // 10.03125 needs 9 bits: rounds back to 10
  CHECK(static_cast<float>(b) == 10.0f);

  CHECK((-ts::half(2.0f)).bits() == 0xc000);
  CHECK((-ts::half(0.0f)).bits() == 0x8000);
  CHECK((-ts::bfloat16::from_bits(0x7fc0)).bits() == 0xffc0);
}

TEST_CASE("comparisons follow IEEE", "[half]") {
  const ts::half nan = std::numeric_limits<ts::half>::quiet_NaN();
  CHECK_FALSE(nan == nan);
  CHECK(nan != nan);
  CHECK_FALSE(nan < ts::half(1.0f));
  CHECK_FALSE(nan > ts::half(1.0f));
  CHECK(ts::half(0.0f) == ts::half(-0.0f));
  CHECK(ts::half(1.0f) < ts::half(1.0009765625f));
  CHECK(ts::half(1.0f) == 1);
  CHECK(ts::half(1.0f) == 1.0);
  CHECK(ts::half(-1.0f) < 0.0f);
  CHECK(ts::bfloat16(2.0f) > ts::half(1.0f));
  const ts::bfloat16 bnan = std::numeric_limits<ts::bfloat16>::quiet_NaN();
  CHECK(bnan != bnan);
  CHECK(ts::bfloat16(-0.0f) == ts::bfloat16(0.0f));
  CHECK(ts::bfloat16(1.0f) <= ts::bfloat16(1.0f));
}

TEST_CASE("operator<< prints like float", "[half]") {
  std::ostringstream out;
  out << ts::half(1.5f) << ' ' << ts::half(65504.0f) << ' ' << ts::half(-0.0f) << ' '
      << std::numeric_limits<ts::half>::infinity() << ' ' << ts::bfloat16(3.140625f) << ' '
      << std::setprecision(3) << ts::half(0.1f);
  std::ostringstream reference;
  reference << 1.5f << ' ' << 65504.0f << ' ' << -0.0f << ' '
            << std::numeric_limits<float>::infinity() << ' ' << 3.140625f << ' '
            << std::setprecision(3) << 0.0999755859375f;
  CHECK(out.str() == reference.str());
  CHECK(out.str().substr(0, 15) == "1.5 65504 -0 in");
}

}  // namespace half_test
