// half and bfloat16 in elementwise expressions: every binary operator and unary function
// against float64 references within the dtypes' tolerances (fp16 rel 1e-3, bf16 rel 1e-2),
// mixing with float, and the single rounding of a fused statement (computed in float).
#include <catch2/catch.hpp>

#include <cstdint>
#include <type_traits>

#include "expr/elementwise_reference.hpp"
#include "tessera/tessera.hpp"

namespace elementwise_half_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
using expr_test::check_all_binary;
using expr_test::check_all_unary;
using expr_test::check_close;
using expr_test::expect_binary;
using expr_test::quarters;
using expr_test::sample;
using expr_test::sample_away_from_zero;
using expr_test::tabulate;
using expr_test::values;

TEST_CASE("half and bfloat16 operands within tolerance", "[expr][half]") {
  SECTION("half") {
    const auto a = quarters<ts::half>({3, 4}, 71);
    const auto b = sample_away_from_zero<ts::half>({4}, 72);
    const auto p = sample<ts::half>({3, 4}, 73, 0.25, 3.0);
    check_all_binary(a, b, p, {3, 4});
    check_all_unary(sample<ts::half>({4, 4}, 23, -4.0, 4.0));
    const auto f = sample<float>({3, 1}, 74);
    expect_binary(
        ts::eval(a + f), a, f, {3, 4}, [](double x, double y) { return x + y; }, 1e-6);
    // A fused statement computes in float and rounds once when stored: 2048 + 1 + 1 is 2050,
    // where rounding after each operation (eager PyTorch) would give 2048.
    const auto big = ts::full<ts::half>({1}, ts::half(2048.0f));
    const auto one = ts::full<ts::half>({1}, ts::half(1.0f));
    CHECK(static_cast<float>(ts::eval(big + one + one).item()) == 2050.0f);
  }
  SECTION("bfloat16") {
    const auto a = quarters<ts::bfloat16>({2, 1, 3}, 75);
    const auto b = sample_away_from_zero<ts::bfloat16>({5, 1}, 76);
    const auto p = sample<ts::bfloat16>({2, 1, 3}, 77, 0.25, 3.0);
    check_all_binary(a, b, p, {2, 5, 3});
    check_all_unary(sample<ts::bfloat16>({2, 9}, 24, -4.0, 4.0));
  }
}

TEST_CASE("half storage at sizes that are not multiples of a vector width", "[expr][half]") {
  for (std::int64_t n : {1, 7, 17, 1025, 65537}) {
    INFO("n = " << n);
    const auto a = sample<ts::half>({n}, 160 + n);
    const auto b = sample<ts::bfloat16>({n}, 161 + n);
    const auto c = sample<float>({n, 2}, 162 + n).select(1, 0);  // stride 2
    const values va(a), vb(b), vc(c);
    ts::Tensor<ts::half> y = a * 2 - ts::tanh(a);
    check_close(
        values(y).data,
        tabulate({n}, [&](std::int64_t i) { return va.data[i] * 2 - std::tanh(va.data[i]); }), 1e-3,
        1e-4);
    auto z = ts::eval(a * b + c);  // half with bfloat16 computes in float
    static_assert(std::is_same_v<decltype(z), ts::Tensor<float>>);
    check_close(values(z).data,
                tabulate({n}, [&](std::int64_t i) { return va.data[i] * vb.data[i] + vc.data[i]; }),
                1e-6, 1e-6);
  }
}

}  // namespace elementwise_half_test
