// core/promotion.hpp against PyTorch's answers. The expected table is torch.promote_types for
// every pair of Tessera's dtypes, transcribed from c10/core/ScalarType.cpp (_promoteTypesLookup)
// and PyTorch's type promotion docs, not computed from Tessera's rules.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tessera/core/promotion.hpp"

namespace promotion_test {  // one namespace per test file: unity builds compile several together

// An alias, not `using tessera::half;`: with CUDA, cuda_fp16.h declares a global `half`.
namespace ts = tessera;

namespace {

using tessera::ScalarType;

// Row and column order of the table below.
using dtypes = std::tuple<float, double, ts::half, ts::bfloat16, std::int8_t, std::uint8_t,
                          std::int16_t, std::int32_t, std::int64_t, bool>;
constexpr std::size_t dtype_count = std::tuple_size_v<dtypes>;

constexpr ScalarType f4 = ScalarType::float32;
constexpr ScalarType f8 = ScalarType::float64;
constexpr ScalarType f2 = ScalarType::float16;
constexpr ScalarType bf = ScalarType::bfloat16;
constexpr ScalarType i1 = ScalarType::int8;
constexpr ScalarType u1 = ScalarType::uint8;
constexpr ScalarType i2 = ScalarType::int16;
constexpr ScalarType i4 = ScalarType::int32;
constexpr ScalarType i8 = ScalarType::int64;
constexpr ScalarType b1 = ScalarType::boolean;

// torch.promote_types(row, column).
constexpr std::array<std::array<ScalarType, dtype_count>, dtype_count> expected_promotion{{
    //        f4  f8  f2  bf  i1  u1  i2  i4  i8  b1
    /* f4 */ {f4, f8, f4, f4, f4, f4, f4, f4, f4, f4},
    /* f8 */ {f8, f8, f8, f8, f8, f8, f8, f8, f8, f8},
    /* f2 */ {f4, f8, f2, f4, f2, f2, f2, f2, f2, f2},
    /* bf */ {f4, f8, f4, bf, bf, bf, bf, bf, bf, bf},
    /* i1 */ {f4, f8, f2, bf, i1, i2, i2, i4, i8, i1},
    /* u1 */ {f4, f8, f2, bf, i2, u1, i2, i4, i8, u1},
    /* i2 */ {f4, f8, f2, bf, i2, i2, i2, i4, i8, i2},
    /* i4 */ {f4, f8, f2, bf, i4, i4, i4, i4, i8, i4},
    /* i8 */ {f4, f8, f2, bf, i8, i8, i8, i8, i8, i8},
    /* b1 */ {f4, f8, f2, bf, i1, u1, i2, i4, i8, b1},
}};

template <std::size_t row, std::size_t column>
constexpr bool promote_t_matches_table() {
  using a = std::tuple_element_t<row, dtypes>;
  using b = std::tuple_element_t<column, dtypes>;
  return tessera::scalar_type_of<tessera::promote_t<a, b>> == expected_promotion[row][column];
}

template <std::size_t... cells>
constexpr bool all_promote_t_match_table(std::index_sequence<cells...>) {
  return (promote_t_matches_table<cells / dtype_count, cells % dtype_count>() && ...);
}

std::string describe(ScalarType a, ScalarType b) {
  return std::string(tessera::name(a)) + " with " + tessera::name(b);
}

// Cell by cell at run time, so that a failure names the pair.
template <std::size_t cell>
void check_cell() {
  constexpr std::size_t row = cell / dtype_count;
  constexpr std::size_t column = cell % dtype_count;
  using a = std::tuple_element_t<row, dtypes>;
  using b = std::tuple_element_t<column, dtypes>;
  constexpr ScalarType compile_time = tessera::scalar_type_of<tessera::promote_t<a, b>>;
  const ScalarType run_time =
      tessera::promote_types(tessera::scalar_type_of<a>, tessera::scalar_type_of<b>);
  INFO(describe(tessera::scalar_type_of<a>, tessera::scalar_type_of<b>));
  CHECK(compile_time == expected_promotion[row][column]);
  CHECK(run_time == compile_time);
  CHECK(run_time == expected_promotion[row][column]);
}

template <std::size_t... cells>
void check_cells(std::index_sequence<cells...>) {
  (check_cell<cells>(), ...);
}

}  // namespace

TEST_CASE("promote_t matches torch.promote_types for all 100 pairs", "[promotion]") {
  STATIC_REQUIRE(all_promote_t_match_table(std::make_index_sequence<dtype_count * dtype_count>{}));
}

TEST_CASE("run-time promote_types agrees with promote_t and the table", "[promotion]") {
  check_cells(std::make_index_sequence<dtype_count * dtype_count>{});
}

TEST_CASE("promotion is symmetric", "[promotion]") {
  for (std::size_t row = 0; row < dtype_count; ++row) {
    for (std::size_t column = 0; column < dtype_count; ++column) {
      CHECK(expected_promotion[row][column] == expected_promotion[column][row]);
    }
  }
}

TEST_CASE("the documented pairs", "[promotion]") {
  STATIC_REQUIRE(std::is_same_v<tessera::promote_t<std::int8_t, std::uint8_t>, std::int16_t>);
  STATIC_REQUIRE(std::is_same_v<tessera::promote_t<std::uint8_t, std::int16_t>, std::int16_t>);
  STATIC_REQUIRE(std::is_same_v<tessera::promote_t<ts::half, ts::bfloat16>, float>);
  STATIC_REQUIRE(std::is_same_v<tessera::promote_t<std::int64_t, ts::half>, ts::half>);
  STATIC_REQUIRE(std::is_same_v<tessera::promote_t<bool, bool>, bool>);
  STATIC_REQUIRE(std::is_same_v<tessera::promote_t<bool, std::uint8_t>, std::uint8_t>);
  STATIC_REQUIRE(std::is_same_v<tessera::promote_t<float, double>, double>);
}

TEST_CASE("result_type_t folds promote_t", "[promotion]") {
  STATIC_REQUIRE(std::is_same_v<tessera::result_type_t<ts::half>, ts::half>);
  STATIC_REQUIRE(
      std::is_same_v<tessera::result_type_t<std::int8_t, std::uint8_t, bool>, std::int16_t>);
  STATIC_REQUIRE(
      std::is_same_v<tessera::result_type_t<ts::half, std::int64_t, ts::bfloat16>, float>);
  STATIC_REQUIRE(std::is_same_v<tessera::result_type_t<bool, bool, std::int32_t, double>, double>);
}

TEST_CASE("promote_scalar_t: the scalar counts only from a higher category", "[promotion]") {
  using tessera::promote_scalar_t;
  // PyTorch: torch.ones(2, dtype=...) + python_number.
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<bool, int>, std::int64_t>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<bool, bool>, bool>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<bool, double>, float>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<bool, float>, float>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<std::int32_t, double>, float>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<std::uint8_t, float>, float>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<std::int64_t, ts::half>, float>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<std::int32_t, std::int64_t>, std::int32_t>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<std::uint8_t, int>, std::uint8_t>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<std::int8_t, bool>, std::int8_t>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<ts::half, double>, ts::half>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<ts::half, float>, ts::half>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<ts::bfloat16, double>, ts::bfloat16>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<ts::half, int>, ts::half>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<float, double>, float>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<double, float>, double>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<float, const double&>, float>);
  STATIC_REQUIRE(std::is_same_v<promote_scalar_t<std::int16_t, unsigned long long>, std::int16_t>);

  CHECK(tessera::promote_scalar_type(ScalarType::boolean, ScalarType::int64) == ScalarType::int64);
  CHECK(tessera::promote_scalar_type(ScalarType::int8, ScalarType::float64) == ScalarType::float32);
  CHECK(tessera::promote_scalar_type(ScalarType::bfloat16, ScalarType::float64) ==
        ScalarType::bfloat16);
  CHECK(tessera::promote_scalar_type(ScalarType::int32, ScalarType::int64) == ScalarType::int32);
}

TEST_CASE("dtype categories and accumulation types", "[promotion]") {
  STATIC_REQUIRE(tessera::is_floating_point_v<ts::half>);
  STATIC_REQUIRE(tessera::is_floating_point_v<ts::bfloat16>);
  STATIC_REQUIRE(tessera::is_floating_point_v<float>);
  STATIC_REQUIRE(tessera::is_floating_point_v<double>);
  STATIC_REQUIRE_FALSE(tessera::is_floating_point_v<std::int32_t>);
  STATIC_REQUIRE_FALSE(tessera::is_floating_point_v<bool>);
  STATIC_REQUIRE(tessera::is_integral_dtype_v<std::int8_t>);
  STATIC_REQUIRE(tessera::is_integral_dtype_v<std::uint8_t>);
  STATIC_REQUIRE(tessera::is_integral_dtype_v<std::int64_t>);
  STATIC_REQUIRE_FALSE(tessera::is_integral_dtype_v<bool>);
  STATIC_REQUIRE(tessera::is_integral_dtype_v<bool, true>);
  STATIC_REQUIRE_FALSE(tessera::is_integral_dtype_v<ts::half>);
  STATIC_REQUIRE_FALSE(tessera::is_integral_dtype_v<float, true>);

  STATIC_REQUIRE(std::is_same_v<tessera::accumulate_t<ts::half>, float>);
  STATIC_REQUIRE(std::is_same_v<tessera::accumulate_t<ts::bfloat16>, float>);
  STATIC_REQUIRE(std::is_same_v<tessera::accumulate_t<float>, float>);
  STATIC_REQUIRE(std::is_same_v<tessera::accumulate_t<double>, double>);
  STATIC_REQUIRE(std::is_same_v<tessera::accumulate_t<bool>, std::int64_t>);
  STATIC_REQUIRE(std::is_same_v<tessera::accumulate_t<std::uint8_t>, std::int64_t>);
  STATIC_REQUIRE(std::is_same_v<tessera::accumulate_t<std::int32_t>, std::int64_t>);
}

}  // namespace promotion_test
