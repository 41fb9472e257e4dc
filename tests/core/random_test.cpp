// Tests for core/random.hpp: Philox known answers, the (seed, offset, index) mapping, the
// statistics of the uniform and normal fills, and the per-device generators.
// Statistical thresholds are set at about the 1e-6 false-failure level and the seeds are fixed,
// so these tests are deterministic.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tessera/core/random.hpp"

namespace random_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

namespace {

constexpr std::uint64_t seed_a = 0x0123456789abcdefULL;
constexpr std::uint64_t seed_b = 0x0123456789abcdeeULL;  // differs from seed_a in one bit

template <class T>
std::vector<T> uniform_fill(std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                            double low = 0.0, double high = 1.0) {
  std::vector<T> out(static_cast<std::size_t>(n));
  ts::fill_uniform(out.data(), n, seed, offset, low, high);
  return out;
}

template <class T>
std::vector<T> normal_fill(std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                           double mean = 0.0, double stddev = 1.0) {
  std::vector<T> out(static_cast<std::size_t>(n));
  ts::fill_normal(out.data(), n, seed, offset, mean, stddev);
  return out;
}

// A stand-in for half/bfloat16: constructible from float only, so it must take the float path.
struct float_only {
  explicit float_only(float v) : value(v) {}
  float_only(double) = delete;
  float_only() = default;
  float value = 0.0f;
};

template <class T>
double mean_of(const std::vector<T>& v) {
  double sum = 0.0;
  for (T x : v) sum += static_cast<double>(x);
  return sum / static_cast<double>(v.size());
}

template <class T>
double variance_of(const std::vector<T>& v) {
  const double mean = mean_of(v);
  double sum = 0.0;
  for (T x : v) sum += (static_cast<double>(x) - mean) * (static_cast<double>(x) - mean);
  return sum / static_cast<double>(v.size() - 1);
}

// Pearson correlation of consecutive elements: catches lanes or Box–Muller pairs that leak.
template <class T>
double lag1_correlation(const std::vector<T>& v) {
  const double mean = mean_of(v);
  const double variance = variance_of(v);
  double sum = 0.0;
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    sum += (static_cast<double>(v[i]) - mean) * (static_cast<double>(v[i + 1]) - mean);
  }
  return sum / static_cast<double>(v.size() - 1) / variance;
}

// Chi-square statistic of v (values in [0, 1)) over `bins` equal bins.
template <class T>
double chi_square_uniform(const std::vector<T>& v, int bins) {
  std::vector<double> counts(static_cast<std::size_t>(bins), 0.0);
  for (T x : v) counts[static_cast<std::size_t>(static_cast<double>(x) * bins)] += 1.0;
  const double expected = static_cast<double>(v.size()) / bins;
  double chi2 = 0.0;
  for (double c : counts) chi2 += (c - expected) * (c - expected) / expected;
  return chi2;
}

// Kolmogorov–Smirnov statistic of v against the standard normal distribution.
template <class T>
double ks_normal(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  const double n = static_cast<double>(v.size());
  double d = 0.0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double cdf = 0.5 * std::erfc(-static_cast<double>(v[i]) / std::sqrt(2.0));
    d = std::max({d, static_cast<double>(i + 1) / n - cdf, cdf - static_cast<double>(i) / n});
  }
  return d;
}

// Critical values at false-failure probability 1e-6 (one- or two-sided as noted).
// KS: sqrt(-ln(alpha / 2) / 2) / sqrt(n) with alpha = 1e-6 (asymptotic Kolmogorov distribution).
double ks_critical(std::size_t n) {
  return std::sqrt(-std::log(0.5e-6) / 2.0) / std::sqrt(static_cast<double>(n));
}
// Chi-square with 99 degrees of freedom, Wilson–Hilferty with z = 4.753 (upper) / -4.753 (lower).
constexpr double chi2_99_upper = 181.0;
constexpr double chi2_99_lower = 45.6;

constexpr std::int64_t million = 1 << 20;

}  // namespace

TEST_CASE("philox4x32_10 matches Random123's known-answer vectors", "[random]") {
  using ts::philox_block;
  using ts::philox_key;
  // Random123 kat_vectors, philox4x32 with 10 rounds.
  CHECK(ts::philox4x32_10(philox_block{{0, 0, 0, 0}}, philox_key{{0, 0}}) ==
        philox_block{{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  CHECK(ts::philox4x32_10(philox_block{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
                          philox_key{{0xffffffffu, 0xffffffffu}}) ==
        philox_block{{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  CHECK(ts::philox4x32_10(philox_block{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                          philox_key{{0xa4093822u, 0x299f31d0u}}) ==
        philox_block{{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
  // constexpr: the same function can run at compile time (and so, on a device).
  static_assert(ts::philox4x32_10(philox_block{{0, 0, 0, 0}}, philox_key{{0, 0}}).x[3] ==
                0x9b00dbd8u);
}

TEST_CASE("philox_at builds the counter from the block and the key from the seed", "[random]") {
  const std::uint64_t seed = 0x299f31d0a4093822ULL;
  const std::uint64_t block = 0x85a308d3243f6a88ULL;
  const ts::philox_block expected =
      ts::philox4x32_10(ts::philox_block{{0x243f6a88u, 0x85a308d3u, 0, 0}},
                        ts::philox_key{{0xa4093822u, 0x299f31d0u}});
  CHECK(ts::philox_at(seed, block) == expected);
  for (std::uint64_t i = 0; i < 4; ++i) {
    CHECK(ts::philox_uint32(seed, block, i) == expected.x[i]);
    CHECK(ts::philox_uint32(seed, block - 1, 4 + i) == expected.x[i]);
  }
}

TEST_CASE("element functions follow the documented block and lane mapping", "[random]") {
  const std::uint64_t offset = 17;
  for (std::uint64_t i = 0; i < 64; ++i) {
    const ts::philox_block r4 = ts::philox_at(seed_a, offset + i / 4);
    CHECK(ts::uniform_float(seed_a, offset, i) == static_cast<float>(r4.x[i % 4] >> 8) * 0x1p-24f);

    const ts::philox_block r2 = ts::philox_at(seed_a, offset + i / 2);
    const std::uint64_t low = r2.x[2 * (i % 2)];
    const std::uint64_t high = r2.x[2 * (i % 2) + 1];
    CHECK(ts::uniform_double(seed_a, offset, i) ==
          static_cast<double>(((high << 32) | low) >> 11) * 0x1p-53);

    // Box–Muller float: lanes (0,1) -> elements 4k, 4k+1; lanes (2,3) -> 4k+2, 4k+3.
    const unsigned pair = (i % 4) < 2 ? 0 : 2;
    const float radius =
        std::sqrt(-2.0f * std::log(static_cast<float>((r4.x[pair] >> 8) + 1) * 0x1p-24f));
    const float angle =
        6.28318530717958647692f * (static_cast<float>(r4.x[pair + 1] >> 8) * 0x1p-24f);
    CHECK(ts::normal_float(seed_a, offset, i) ==
          radius * (i % 2 == 0 ? std::cos(angle) : std::sin(angle)));

    // Box–Muller double: u1 from lanes (0,1), u2 from lanes (2,3); 2k cos, 2k+1 sin.
    const std::uint64_t u1_bits = (std::uint64_t{r2.x[1]} << 32) | r2.x[0];
    const std::uint64_t u2_bits = (std::uint64_t{r2.x[3]} << 32) | r2.x[2];
    const double radius_d =
        std::sqrt(-2.0 * std::log(static_cast<double>((u1_bits >> 11) + 1) * 0x1p-53));
    const double angle_d = 6.28318530717958647692 * (static_cast<double>(u2_bits >> 11) * 0x1p-53);
    CHECK(ts::normal_double(seed_a, offset, i) ==
          radius_d * (i % 2 == 0 ? std::cos(angle_d) : std::sin(angle_d)));
  }
}

TEST_CASE("blocks_needed rounds up per dtype", "[random]") {
  STATIC_REQUIRE(ts::blocks_needed<float>(0) == 0);
  STATIC_REQUIRE(ts::blocks_needed<float>(1) == 1);
  STATIC_REQUIRE(ts::blocks_needed<float>(4) == 1);
  STATIC_REQUIRE(ts::blocks_needed<float>(5) == 2);
  STATIC_REQUIRE(ts::blocks_needed<float_only>(9) == 3);
  STATIC_REQUIRE(ts::blocks_needed<double>(3) == 2);
  STATIC_REQUIRE(ts::blocks_needed<double>(4) == 2);
  STATIC_REQUIRE(ts::blocks_needed(std::numeric_limits<std::uint64_t>::max(), 4) ==
                 std::numeric_limits<std::uint64_t>::max() / 4 + 1);
}

TEST_CASE("fills equal the element functions, for every lane and a ragged end", "[random]") {
  const std::uint64_t offset = 1000;
  const std::int64_t n = 1031;  // not a multiple of 4
  const auto uf = uniform_fill<float>(n, seed_a, offset);
  const auto ud = uniform_fill<double>(n, seed_a, offset);
  const auto nf = normal_fill<float>(n, seed_a, offset);
  const auto nd = normal_fill<double>(n, seed_a, offset);
  const auto sf = uniform_fill<float>(n, seed_a, offset, -3.0, 5.0);
  const auto sd = normal_fill<double>(n, seed_a, offset, 2.0, 0.5);
  const ts::uniform_transform<float> range(-3.0, 5.0);
  const ts::normal_transform<double> shift(2.0, 0.5);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::uint64_t>(i);
    const auto j = static_cast<std::size_t>(i);
    REQUIRE(uf[j] == ts::uniform_float(seed_a, offset, k));
    REQUIRE(ud[j] == ts::uniform_double(seed_a, offset, k));
    REQUIRE(nf[j] == ts::normal_float(seed_a, offset, k));
    REQUIRE(nd[j] == ts::normal_double(seed_a, offset, k));
    REQUIRE(sf[j] == ts::uniform_value<float>(seed_a, offset, k, range));
    REQUIRE(sd[j] == ts::normal_value<double>(seed_a, offset, k, shift));
  }
}

TEST_CASE("fills are deterministic and depend on the seed", "[random]") {
  CHECK(uniform_fill<float>(4096, seed_a, 0) == uniform_fill<float>(4096, seed_a, 0));
  CHECK(normal_fill<double>(4096, seed_a, 3) == normal_fill<double>(4096, seed_a, 3));

  // One bit of seed changes (almost) every value.
  const auto a = uniform_fill<float>(4096, seed_a, 0);
  const auto b = uniform_fill<float>(4096, seed_b, 0);
  std::size_t equal = 0;
  for (std::size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i];
  CHECK(equal < 10);  // 24-bit values: about 4096 / 2^24 expected

  // So does the offset.
  const auto c = uniform_fill<float>(4096, seed_a, 1 << 20);
  equal = 0;
  for (std::size_t i = 0; i < a.size(); ++i) equal += a[i] == c[i];
  CHECK(equal < 10);

  // The high word of the seed is part of the key, not dropped.
  CHECK(uniform_fill<double>(64, 1, 0) != uniform_fill<double>(64, 1 | (1ULL << 40), 0));
  // And the high word of the block is part of the counter.
  CHECK(ts::philox_at(seed_a, 5) != ts::philox_at(seed_a, 5 | (1ULL << 33)));
}

TEST_CASE("a longer fill starts with a shorter one (prefix property)", "[random]") {
  const auto short_f = uniform_fill<float>(13, seed_a, 7);
  const auto long_f = uniform_fill<float>(1000, seed_a, 7);
  CHECK(std::equal(short_f.begin(), short_f.end(), long_f.begin()));

  const auto short_n = normal_fill<float>(13, seed_a, 7);
  const auto long_n = normal_fill<float>(1000, seed_a, 7);
  CHECK(std::equal(short_n.begin(), short_n.end(), long_n.begin()));

  const auto short_d = normal_fill<double>(7, seed_a, 7);
  const auto long_d = normal_fill<double>(1000, seed_a, 7);
  CHECK(std::equal(short_d.begin(), short_d.end(), long_d.begin()));

  const auto short_u = uniform_fill<double>(7, seed_a, 7);
  const auto long_u = uniform_fill<double>(1000, seed_a, 7);
  CHECK(std::equal(short_u.begin(), short_u.end(), long_u.begin()));
}

TEST_CASE("a fill at offset k is the tail of a fill at offset 0", "[random]") {
  const std::uint64_t k = 25;  // blocks
  SECTION("float: 4 values per block") {
    const auto whole = normal_fill<float>(400, seed_a, 0);
    const auto tail = normal_fill<float>(400 - 4 * k, seed_a, k);
    CHECK(std::equal(tail.begin(), tail.end(), whole.begin() + 4 * k));
    const auto whole_u = uniform_fill<float>(400, seed_a, 0);
    const auto tail_u = uniform_fill<float>(400 - 4 * k, seed_a, k);
    CHECK(std::equal(tail_u.begin(), tail_u.end(), whole_u.begin() + 4 * k));
  }
  SECTION("double: 2 values per block") {
    const auto whole = uniform_fill<double>(400, seed_a, 0);
    const auto tail = uniform_fill<double>(400 - 2 * k, seed_a, k);
    CHECK(std::equal(tail.begin(), tail.end(), whole.begin() + 2 * k));
    const auto whole_n = normal_fill<double>(400, seed_a, 0);
    const auto tail_n = normal_fill<double>(400 - 2 * k, seed_a, k);
    CHECK(std::equal(tail_n.begin(), tail_n.end(), whole_n.begin() + 2 * k));
  }
  SECTION("successive fills reserving blocks_needed equal one big fill") {
    ts::Generator generator;
    generator.manual_seed(seed_a);
    std::vector<float> pieces;
    for (std::int64_t n : {5, 8, 3, 16}) {
      const std::int64_t rounded = static_cast<std::int64_t>(4 * ts::blocks_needed<float>(n));
      const ts::philox_state s = generator.reserve_state(ts::blocks_needed<float>(n));
      auto piece = uniform_fill<float>(rounded, s.seed, s.offset);
      pieces.insert(pieces.end(), piece.begin(), piece.end());
    }
    CHECK(generator.offset() == 2 + 2 + 1 + 4);
    CHECK(pieces == uniform_fill<float>(static_cast<std::int64_t>(pieces.size()), seed_a, 0));
  }
}

TEST_CASE("half-like dtypes are generated in float", "[random]") {
  std::vector<float_only> out(10);
  ts::fill_uniform(out.data(), 10, seed_a, 3, 0.0, 1.0);
  std::vector<float_only> normals(10);
  ts::fill_normal(normals.data(), 10, seed_a, 3, 0.0, 1.0);
  for (std::uint64_t i = 0; i < 10; ++i) {
    CHECK(out[i].value == ts::uniform_float(seed_a, 3, i));
    CHECK(normals[i].value == ts::normal_float(seed_a, 3, i));
  }
}

TEST_CASE("uniform values are in [0, 1), including at the extreme words", "[random]") {
  CHECK(ts::detail::unit_float(0xffffffffu) < 1.0f);
  CHECK(ts::detail::unit_float(0xffffffffu) == 1.0f - 0x1p-24f);
  CHECK(ts::detail::unit_float(0u) == 0.0f);
  CHECK(ts::detail::unit_double(~std::uint64_t{0}) < 1.0);
  CHECK(ts::detail::unit_double(~std::uint64_t{0}) == 1.0 - 0x1p-53);
  CHECK(ts::detail::unit_float_open_zero(0u) == 0x1p-24f);
  CHECK(ts::detail::unit_float_open_zero(0xffffffffu) == 1.0f);
  CHECK(ts::detail::unit_double_open_zero(0u) == 0x1p-53);
  CHECK(ts::detail::unit_double_open_zero(~std::uint64_t{0}) == 1.0);
}

TEST_CASE("uniform float statistics over 1M samples", "[random][statistics]") {
  const auto v = uniform_fill<float>(million, 20240611, 0);
  CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x >= 0.0f && x < 1.0f; }));
  // Standard errors: mean sqrt(1/12/n) = 2.8e-4; variance sqrt((1/80 - 1/144)/n) = 7.3e-5;
  // correlation 1/sqrt(n) = 9.8e-4. Thresholds are about 6 standard errors.
  CHECK(std::abs(mean_of(v) - 0.5) < 1.7e-3);
  CHECK(std::abs(variance_of(v) - 1.0 / 12.0) < 4.5e-4);
  CHECK(std::abs(lag1_correlation(v)) < 6e-3);
  const double chi2 = chi_square_uniform(v, 100);
  CHECK(chi2 < chi2_99_upper);
  CHECK(chi2 > chi2_99_lower);
}

TEST_CASE("uniform double statistics over 1M samples", "[random][statistics]") {
  const auto v = uniform_fill<double>(million, 987654321, 11);
  CHECK(std::all_of(v.begin(), v.end(), [](double x) { return x >= 0.0 && x < 1.0; }));
  CHECK(std::abs(mean_of(v) - 0.5) < 1.7e-3);
  CHECK(std::abs(variance_of(v) - 1.0 / 12.0) < 4.5e-4);
  CHECK(std::abs(lag1_correlation(v)) < 6e-3);
  const double chi2 = chi_square_uniform(v, 100);
  CHECK(chi2 < chi2_99_upper);
  CHECK(chi2 > chi2_99_lower);
  // The low bits are random too: the 53-bit values are not just 32-bit ones widened.
  std::size_t odd_at_2_pow_53 = 0;
  for (double x : v) odd_at_2_pow_53 += static_cast<std::uint64_t>(x * 0x1p53) & 1u;
  CHECK(std::abs(static_cast<double>(odd_at_2_pow_53) / static_cast<double>(v.size()) - 0.5) <
        3e-3);
}

TEST_CASE("transforms by a power of two skip the fma call and give its bits", "[random]") {
  // Every 24-bit uniform u a fill makes (a stride through them) and normal-like values over
  // +-6, for ranges and stds that are powers of two (plain arithmetic) and others (fma).
  const double scales[] = {1.0, 2.0, 0.5, 0x1p-40, 0x1p40, 3.0, 0.1};
  for (double scale : scales) {
    for (double low : {0.0, -1.0, 0.3, -0.0}) {
      const ts::uniform_transform<float> u(low, low + scale);
      const ts::normal_transform<float> z(low, scale);
      const ts::uniform_transform<double> ud(low, low + scale);
      CHECK(z.exact == (scale != 3.0 && scale != 0.1));
      std::int64_t differ = 0;
      for (std::uint32_t k = 0; k < (1u << 24); k += 4099) {
        const float v = static_cast<float>(k) * 0x1p-24f;
        const float expected = std::fma(u.range, v, u.low);
        differ += u(v) != (expected < u.high ? expected : u.low);
        const double vd = static_cast<double>(k) * 0x1p-24 + 0x1p-50;
        const double expected_d = std::fma(ud.range, vd, ud.low);
        differ += ud(vd) != (expected_d < ud.high ? expected_d : ud.low);
        const float w = (static_cast<float>(k) * 0x1p-24f - 0.5f) * 12.0f;
        differ += z(w) != std::fma(z.stddev, w, z.mean);
      }
      CHECK(differ == 0);
    }
  }
  // rand's and randn's own transforms take the plain form; others the fma.
  CHECK(ts::uniform_transform<float>(0.0, 1.0).exact);
  CHECK(ts::uniform_transform<double>(0.0, 1.0).exact);
  CHECK(ts::normal_transform<float>(0.0, 1.0).exact);
  CHECK_FALSE(ts::uniform_transform<float>(0.0, 3.0).exact);
  CHECK_FALSE(ts::normal_transform<double>(0.0, 0.1).exact);
}

TEST_CASE("uniform fills honour [low, high)", "[random]") {
  const auto f = uniform_fill<float>(100000, seed_a, 0, -3.0, 5.0);
  CHECK(std::all_of(f.begin(), f.end(), [](float x) { return x >= -3.0f && x < 5.0f; }));
  CHECK(std::abs(mean_of(f) - 1.0) < 0.05);
  const auto d = uniform_fill<double>(100000, seed_a, 0, 1e6, 1e6 + 1.0);
  CHECK(std::all_of(d.begin(), d.end(), [](double x) { return x >= 1e6 && x < 1e6 + 1.0; }));
  // A range where float rounding of fma(range, u, low) reaches high for u close to 1.
  const ts::uniform_transform<float> narrow(1.0, 1.0 + 0x1p-23);
  CHECK(narrow(1.0f - 0x1p-24f) < narrow.high);
  CHECK(narrow(0.0f) == 1.0f);
  // low == high is allowed (every value is low), as in PyTorch.
  CHECK(uniform_fill<float>(5, seed_a, 0, 2.0, 2.0) == std::vector<float>(5, 2.0f));
}

TEST_CASE("bad fill arguments throw before writing", "[random]") {
  std::vector<float> out(4, 42.0f);
  CHECK_THROWS_AS(ts::fill_uniform(out.data(), -1, seed_a, 0, 0.0, 1.0), std::invalid_argument);
  CHECK_THROWS_WITH(ts::fill_uniform(out.data(), 4, seed_a, 0, 1.0, 0.0),
                    Catch::Contains("low = 1") && Catch::Contains("high = 0"));
  CHECK_THROWS_AS(ts::fill_uniform(out.data(), 4, seed_a, 0, 0.0, INFINITY), std::invalid_argument);
  CHECK_THROWS_AS(ts::fill_uniform(out.data(), 4, seed_a, 0, -3e38, 3e38),
                  std::invalid_argument);  // high - low overflows float
  CHECK_THROWS_WITH(ts::fill_normal(out.data(), 4, seed_a, 0, 0.0, -1.0),
                    Catch::Contains("std = -1"));
  CHECK_THROWS_AS(ts::fill_normal(out.data(), 4, seed_a, 0, NAN, 1.0), std::invalid_argument);
  CHECK(out == std::vector<float>(4, 42.0f));
  // n = 0 writes nothing and is fine.
  CHECK_NOTHROW(ts::fill_normal(out.data(), 0, seed_a, 0, 0.0, 1.0));
}

TEST_CASE("normal float statistics over 1M samples", "[random][statistics]") {
  const auto v = normal_fill<float>(million, 31337, 0);
  // Standard errors: mean 1/sqrt(n) = 9.8e-4; std 1/sqrt(2n) = 6.9e-4.
  CHECK(std::abs(mean_of(v)) < 6e-3);
  CHECK(std::abs(std::sqrt(variance_of(v)) - 1.0) < 4.5e-3);
  CHECK(std::abs(lag1_correlation(v)) < 6e-3);
  CHECK(ks_normal(v) < ks_critical(v.size()));
}

TEST_CASE("normal double statistics over 1M samples", "[random][statistics]") {
  const auto v = normal_fill<double>(million, 4242, 5);
  CHECK(std::abs(mean_of(v)) < 6e-3);
  CHECK(std::abs(std::sqrt(variance_of(v)) - 1.0) < 4.5e-3);
  CHECK(std::abs(lag1_correlation(v)) < 6e-3);
  CHECK(ks_normal(v) < ks_critical(v.size()));
  // mean and std are applied as mean + std * z.
  const auto shifted = normal_fill<double>(1000, 4242, 5, -2.0, 3.0);
  for (std::size_t i = 0; i < shifted.size(); ++i) {
    REQUIRE(shifted[i] == std::fma(3.0, v[i], -2.0));
  }
}

TEST_CASE("normal values are finite for every radius word", "[random][edge]") {
  // The radius depends only on the top 24 bits of its lane: try all 2^24 of them, so no seed can
  // produce log(0), NaN or infinity (the angle only feeds a bounded sin or cos).
  bool all_finite = true;
  float largest = 0.0f;
  for (std::uint32_t top = 0; top < (1u << 24); ++top) {
    const float radius = ts::detail::box_muller_radius(ts::detail::unit_float_open_zero(top << 8));
    all_finite = all_finite && std::isfinite(radius) && radius >= 0.0f;
    largest = std::max(largest, radius);
  }
  CHECK(all_finite);
  CHECK(largest < 5.8f);
  CHECK(largest > 5.7f);  // reached at the smallest u1, 2^-24: sqrt(48 ln 2) = 5.768
  for (std::uint32_t radius_word : {0u, 0xffu, 0x100u, 0xffffffffu}) {
    for (std::uint32_t angle : {0u, 0x40000000u, 0xffffffffu}) {
      for (bool sin_branch : {false, true}) {
        const float z = ts::detail::box_muller_float(radius_word, angle, sin_branch);
        REQUIRE(std::isfinite(z));
        REQUIRE(std::abs(z) < 5.8f);
      }
    }
  }

  // Doubles: the smallest and largest u1 and a spread of angles.
  for (std::uint32_t low : {0u, 0x7ffu, 0x800u, 0xffffffffu}) {
    for (std::uint32_t high : {0u, 1u, 0x80000000u, 0xffffffffu}) {
      for (std::uint32_t angle : {0u, 0x12345678u, 0xffffffffu}) {
        for (bool sin_branch : {false, true}) {
          const double z = ts::detail::box_muller_double(
              ts::philox_block{{low, high, angle, angle ^ 0x55555555u}}, sin_branch);
          REQUIRE(std::isfinite(z));
          REQUIRE(std::abs(z) < 8.6);
        }
      }
    }
  }

  // And 4M samples from the real stream.
  const auto f = normal_fill<float>(million * 2, seed_b, 0);
  CHECK(std::all_of(f.begin(), f.end(), [](float x) { return std::isfinite(x); }));
  const auto d = normal_fill<double>(million * 2, seed_b, 0);
  CHECK(std::all_of(d.begin(), d.end(), [](double x) { return std::isfinite(x); }));
}

TEST_CASE("Generator reserves disjoint block ranges", "[random][generator]") {
  ts::Generator generator(ts::Device{}, 5);
  CHECK(generator.seed() == 5);
  CHECK(generator.offset() == 0);
  CHECK(generator.reserve(3) == 0);
  CHECK(generator.reserve(0) == 3);
  CHECK(generator.reserve(10) == 3);
  CHECK(generator.offset() == 13);
  CHECK(generator.reserve_state(1) == ts::philox_state{5, 13});

  const ts::philox_state saved = generator.state();
  generator.manual_seed(6);
  CHECK(generator.state() == ts::philox_state{6, 0});
  generator.set_state(saved);
  CHECK(generator.state() == saved);
  generator.set_offset(100);
  CHECK(generator.offset() == 100);

  CHECK(ts::Generator().seed() == ts::default_seed);
  CHECK(ts::default_seed == 67280421310721ULL);  // PyTorch's default_rng_seed_val
}

TEST_CASE("Generator: fills captured in a CUDA graph draw from device state, relative to it",
          "[random][generator]") {
  ts::Generator generator(ts::Device{}, 5);
  generator.set_offset(40);
  // Outside a capture: reserve_state's seed and offset, no device state.
  const ts::philox_draw before = generator.reserve_draw(2);
  CHECK(before.seed == 5);
  CHECK(before.offset == 40);
  CHECK(before.device_state == nullptr);

  const std::uint64_t device_state[2] = {0, 0};  // stands for two uint64 of device memory
  generator.begin_graph_capture(device_state);
  CHECK_THROWS_AS(generator.begin_graph_capture(device_state), std::logic_error);
  // This thread's fills: offsets counted from the capture's base, the generator left alone.
  const ts::philox_draw first = generator.reserve_draw(3);
  const ts::philox_draw second = generator.reserve_draw(7);
  CHECK(first.device_state == device_state);
  CHECK(second.device_state == device_state);
  CHECK(first.offset == 0);
  CHECK(second.offset == 3);
  CHECK(generator.offset() == 42);
  // Another generator, and another thread on this one, draw as usual meanwhile.
  ts::Generator other(ts::Device{}, 9);
  CHECK(other.reserve_draw(4).device_state == nullptr);
  CHECK(other.end_graph_capture() == 0);  // not capturing there: nothing ended
  ts::philox_draw elsewhere;
  std::thread([&] { elsewhere = generator.reserve_draw(5); }).join();
  CHECK(elsewhere.device_state == nullptr);
  CHECK(elsewhere.offset == 42);
  CHECK(generator.offset() == 47);
  // The blocks a launch reserves, then as usual again.
  CHECK(generator.end_graph_capture() == 10);
  CHECK(generator.end_graph_capture() == 0);
  const ts::philox_draw after = generator.reserve_draw(1);
  CHECK(after.device_state == nullptr);
  CHECK(after.offset == 47);
  // A replay's numbers are the uncaptured fills': base + each fill's place in the capture.
  generator.begin_graph_capture(device_state);
  CHECK(generator.reserve_draw(6).offset == 0);
  CHECK(generator.end_graph_capture() == 6);
}

TEST_CASE("Generator::reserve is atomic across threads", "[random][generator]") {
  ts::Generator generator;
  constexpr int threads = 4;
  constexpr int per_thread = 5000;
  std::vector<std::vector<std::uint64_t>> got(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i)
        got[static_cast<std::size_t>(t)].push_back(generator.reserve(2));
    });
  }
  for (auto& w : workers) w.join();
  std::set<std::uint64_t> starts;
  for (const auto& g : got) starts.insert(g.begin(), g.end());
  CHECK(starts.size() == threads * per_thread);
  CHECK(*starts.rbegin() == 2 * (threads * per_thread - 1));
  CHECK(generator.offset() == 2 * threads * per_thread);
}

TEST_CASE("default generators: one per device, seeded together", "[random][generator]") {
  REQUIRE(ts::cpu::device_count() >= 2);  // CTest runs with TESSERA_CPU_DEVICES=2
  const ts::Device cpu0{ts::DeviceType::cpu, 0};
  const ts::Device cpu1{ts::DeviceType::cpu, 1};
  ts::Generator& g0 = ts::default_generator(cpu0);
  ts::Generator& g1 = ts::default_generator(cpu1);
  CHECK(&g0 != &g1);
  CHECK(&g0 == &ts::default_generator(cpu0));
  CHECK(&g1 == &ts::default_generator(cpu1));
  CHECK(g0.device() == cpu0);
  CHECK(g1.device() == cpu1);

  ts::manual_seed(1234);
  CHECK(ts::initial_seed() == 1234);
  CHECK(g0.state() == ts::philox_state{1234, 0});
  CHECK(g1.state() == ts::philox_state{1234, 0});

  CHECK(g0.reserve(7) == 0);
  CHECK(g0.offset() == 7);
  CHECK(g1.offset() == 0);  // generators advance independently

  ts::manual_seed(99);
  CHECK(g0.state() == ts::philox_state{99, 0});
  CHECK(g1.state() == ts::philox_state{99, 0});

  // Same seed, same reservation sequence: same numbers on both devices.
  const ts::philox_state s0 = g0.reserve_state(ts::blocks_needed<float>(10));
  const ts::philox_state s1 = g1.reserve_state(ts::blocks_needed<float>(10));
  CHECK(uniform_fill<float>(10, s0.seed, s0.offset) == uniform_fill<float>(10, s1.seed, s1.offset));
}

TEST_CASE("default_generator rejects devices that do not exist", "[random][generator]") {
  CHECK_THROWS_AS(ts::default_generator(ts::Device{ts::DeviceType::cpu, 5}), ts::device_error);
  CHECK_THROWS_WITH(ts::default_generator(ts::Device{ts::DeviceType::cpu, 5}),
                    Catch::Contains("cpu:5"));
  CHECK_THROWS_AS(ts::default_generator(ts::Device{ts::DeviceType::cpu, -1}), ts::device_error);
  const int cuda_count = ts::cuda::device_count();
  CHECK_THROWS_WITH(ts::default_generator(ts::Device{ts::DeviceType::cuda, cuda_count}),
                    Catch::Contains("cuda:" + std::to_string(cuda_count)));
}

}  // namespace random_test
