// The elementwise operators and functions (expr/node.hpp, operators.hpp, functors.hpp) on the
// CPU: every one against a float64 reference computed here with std:: functions from the
// operands' values, under broadcasting in every position, with scalars on both sides, on
// non-contiguous operands and outputs, at sizes that are not multiples of any vector width, and on
// empty and 0-dim tensors. half and bfloat16 are in elementwise_half_test.cpp; dtype rules,
// integer semantics, NaN, where and cast in elementwise_dtype_test.cpp; evaluation (assignment,
// aliasing, one pass, allocation, errors) in assign_test.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "expr/elementwise_reference.hpp"
#include "tessera/tessera.hpp"

namespace elementwise_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
using expr_test::broadcast_cases;
using expr_test::check_all_binary;
using expr_test::check_all_unary;
using expr_test::check_close;
using expr_test::expect_binary;
using expr_test::maximum_ref;
using expr_test::minimum_ref;
using expr_test::quarters;
using expr_test::relu_ref;
using expr_test::sample;
using expr_test::sample_away_from_zero;
using expr_test::sigmoid_ref;
using expr_test::tabulate;
using expr_test::values;

TEST_CASE("binary operators and functions broadcast in every position", "[expr]") {
  std::uint64_t seed = 1;
  for (const auto& c : broadcast_cases) {
    INFO("shapes " << c.a << " and " << c.b);
    const auto a = quarters<float>(c.a, seed++);
    const auto b = sample_away_from_zero<float>(c.b, seed++);
    const auto p = sample<float>(c.a, seed++, 0.25, 3.0);
    check_all_binary(a, b, p, c.out);
  }
  // The operands swapped: a quarter-valued b meets ties with a.
  const auto a = quarters<double>({3, 1}, 101);
  const auto b = quarters<double>({1, 4}, 102);
  expect_binary(
      ts::eval(a == b), a, b, {3, 4}, [](double x, double y) { return double(x == y); }, 0);
  expect_binary(
      ts::eval(b <= a), b, a, {3, 4}, [](double x, double y) { return double(x <= y); }, 0);
}

TEST_CASE("double operands compute in double", "[expr]") {
  const auto a = quarters<double>({4, 1}, 7);
  const auto b = sample_away_from_zero<double>({3}, 8);
  const auto p = sample<double>({4, 1}, 9, 0.25, 3.0);
  check_all_binary(a, b, p, {4, 3});
}

TEST_CASE("scalars on either side of every binary operator", "[expr]") {
  const auto t = quarters<float>({2, 3}, 11);
  const auto nz = sample_away_from_zero<float>({2, 3}, 12);
  const auto pos = sample<float>({2, 3}, 13, 0.25, 3.0);
  const ts::Shape s{2, 3};
  const values vt(t);
  const values vnz(nz);
  const values vpos(pos);
  auto expect = [&](const auto& result, const values& v, auto ref, double tol = 2e-6) {
    REQUIRE(result.shape() == s);
    check_close(values(result).data, tabulate(s, [&](std::int64_t i) { return ref(v.data[i]); }),
                tol, tol * 1e-3);
  };
  // A double scalar does not promote a float tensor (PyTorch's wrapped numbers).
  static_assert(std::is_same_v<decltype(ts::eval(t + 2.5)), ts::Tensor<float>>);
  static_assert(std::is_same_v<decltype(ts::eval(2.5 + t)), ts::Tensor<float>>);
  static_assert(std::is_same_v<decltype(ts::eval(t * 2)), ts::Tensor<float>>);
  static_assert(std::is_same_v<decltype(ts::eval(0.5 < t)), ts::Tensor<bool>>);
  // clang-format off
  { INFO("t + 2.5"); expect(ts::eval(t + 2.5), vt, [](double x) { return x + 2.5; }); }
  { INFO("2.5 + t"); expect(ts::eval(2.5 + t), vt, [](double x) { return 2.5 + x; }); }
  { INFO("t - 1"); expect(ts::eval(t - 1), vt, [](double x) { return x - 1; }); }
  { INFO("1 - t"); expect(ts::eval(1 - t), vt, [](double x) { return 1 - x; }); }
  { INFO("t * 0.5"); expect(ts::eval(t * 0.5), vt, [](double x) { return x * 0.5; }); }
  { INFO("3 * t"); expect(ts::eval(3 * t), vt, [](double x) { return 3 * x; }); }
  { INFO("t / 4"); expect(ts::eval(t / 4), vt, [](double x) { return x / 4; }); }
  { INFO("4.0 / nz"); expect(ts::eval(4.0 / nz), vnz, [](double x) { return 4.0 / x; }); }
  { INFO("pow(pos, 2.0)"); expect(ts::eval(ts::pow(pos, 2.0)), vpos, [](double x) { return x * x; }); }
  { INFO("pow(pos, 0.5)"); expect(ts::eval(ts::pow(pos, 0.5)), vpos, [](double x) { return std::sqrt(x); }); }
  { INFO("pow(2.0, t)"); expect(ts::eval(ts::pow(2.0, t)), vt, [](double x) { return std::pow(2.0, x); }); }
  { INFO("maximum(t, 0.25)"); expect(ts::eval(ts::maximum(t, 0.25)), vt, [](double x) { return maximum_ref(x, 0.25); }, 0); }
  { INFO("maximum(0.25, t)"); expect(ts::eval(ts::maximum(0.25, t)), vt, [](double x) { return maximum_ref(0.25, x); }, 0); }
  { INFO("minimum(t, -0.5)"); expect(ts::eval(ts::minimum(t, -0.5)), vt, [](double x) { return minimum_ref(x, -0.5); }, 0); }
  { INFO("minimum(1, t)"); expect(ts::eval(ts::minimum(1, t)), vt, [](double x) { return minimum_ref(1, x); }, 0); }
  { INFO("t < 0.5"); expect(ts::eval(t < 0.5), vt, [](double x) { return double(x < 0.5); }, 0); }
  { INFO("0.5 < t"); expect(ts::eval(0.5 < t), vt, [](double x) { return double(0.5 < x); }, 0); }
  { INFO("t <= 0.5"); expect(ts::eval(t <= 0.5), vt, [](double x) { return double(x <= 0.5); }, 0); }
  { INFO("0 >= t"); expect(ts::eval(0 >= t), vt, [](double x) { return double(0 >= x); }, 0); }
  { INFO("t > 0"); expect(ts::eval(t > 0), vt, [](double x) { return double(x > 0); }, 0); }
  { INFO("t == 0.25"); expect(ts::eval(t == 0.25), vt, [](double x) { return double(x == 0.25); }, 0); }
  { INFO("1 == t"); expect(ts::eval(1 == t), vt, [](double x) { return double(1 == x); }, 0); }
  { INFO("t != 0.5"); expect(ts::eval(t != 0.5), vt, [](double x) { return double(x != 0.5); }, 0); }
  // clang-format on
  // A scalar that is not representable in float is rounded once, to float, as PyTorch does.
  const auto one = ts::full<float>({1}, 1.0f);
  CHECK(ts::eval(one * 0.1).item() == 0.1f);
  CHECK(ts::eval(one + 1e-9).item() == 1.0f);
}

TEST_CASE("unary functions match std:: in double", "[expr]") {
  SECTION("float") { check_all_unary(sample<float>({3, 5}, 21, -4.0, 4.0)); }
  SECTION("double") { check_all_unary(sample<double>({17}, 22, -4.0, 4.0)); }
}

TEST_CASE("fused trees of several levels evaluate as written", "[expr]") {
  const auto a = sample<float>({3, 4}, 31);
  const auto b = sample<float>({4}, 32);
  const auto c = sample<float>({3, 1}, 33);
  const auto d = sample<float>({2, 3, 4}, 34);
  const values va(a), vb(b), vc(c), vd(d);
  const ts::Shape out{2, 3, 4};
  {
    INFO("sigmoid(a * b + c) * tanh(d)");
    ts::Tensor<float> y = ts::sigmoid(a * b + c) * ts::tanh(d);
    REQUIRE(y.shape() == out);
    check_close(values(y).data,
                tabulate(out,
                         [&](std::int64_t i) {
                           return sigmoid_ref(va.at(out, i) * vb.at(out, i) + vc.at(out, i)) *
                                  std::tanh(vd.at(out, i));
                         }),
                1e-5, 1e-7);
  }
  {
    INFO("where(a > b, exp(-abs(a)), pow(b, 2) - 1) / (1 + relu(c)) - d");
    ts::Tensor<float> y =
        ts::where(a > b, ts::exp(-ts::abs(a)), ts::pow(b, 2) - 1) / (1 + ts::relu(c)) - d;
    REQUIRE(y.shape() == out);
    check_close(values(y).data,
                tabulate(out,
                         [&](std::int64_t i) {
                           const double x = va.at(out, i), z = vb.at(out, i);
                           const double branch = x > z ? std::exp(-std::fabs(x)) : z * z - 1;
                           return branch / (1 + relu_ref(vc.at(out, i))) - vd.at(out, i);
                         }),
                1e-5, 1e-6);
  }
  {
    INFO("mixed dtypes inside one tree: (i + e * a) / (abs(a) + 1) with int32 i, double e");
    const auto i = sample<std::int32_t>({4}, 35, -5.0, 5.0);
    const auto e = sample<double>({3, 1}, 36);
    const values vi(i), ve(e);
    auto y = ts::eval((i + e * a) / (ts::abs(a) + 1) + ts::sqrt(ts::maximum(i, 0)));
    static_assert(std::is_same_v<decltype(y), ts::Tensor<double>>);
    const ts::Shape s{3, 4};
    REQUIRE(y.shape() == s);
    check_close(values(y).data,
                tabulate(s,
                         [&](std::int64_t k) {
                           const double x = va.at(s, k);
                           return (vi.at(s, k) + ve.at(s, k) * x) / (std::fabs(x) + 1) +
                                  std::sqrt(std::max(vi.at(s, k), 0.0));
                         }),
                1e-6, 1e-7);  // sqrt of an int computes in float32, as in PyTorch
  }
}

TEST_CASE("non-contiguous operands: transposed, narrowed, permuted, expanded", "[expr]") {
  const auto base_t = sample<float>({4, 3}, 41);
  const auto a = base_t.t();                                       // [3, 4], strides {1, 3}
  const auto b = sample<float>({3, 8}, 42).narrow(1, 2, 4);        // [3, 4], strides {8, 1}
  const auto c = sample<float>({4, 2, 3}, 43).permute({1, 2, 0});  // [2, 3, 4]
  const auto d = sample<float>({3, 1}, 44).expand({3, 4});         // [3, 4], strides {1, 0}
  const auto e = sample<double>({6}, 45).narrow(0, 1, 4);          // [4], offset 1
  const auto g = sample<float>({2, 4, 6}, 46).narrow(2, 1, 3).transpose(1, 2);  // [2, 3, 4]
  REQUIRE_FALSE(a.is_contiguous());
  REQUIRE_FALSE(b.is_contiguous());
  REQUIRE_FALSE(c.is_contiguous());
  REQUIRE_FALSE(d.is_contiguous());
  REQUIRE_FALSE(g.is_contiguous());
  const values va(a), vb(b), vc(c), vd(d), ve(e), vg(g);
  {
    INFO("a * b + d");
    const ts::Shape s{3, 4};
    ts::Tensor<float> y = a * b + d;
    check_close(values(y).data,
                tabulate(s, [&](std::int64_t i) { return va.data[i] * vb.data[i] + vd.data[i]; }),
                1e-6, 1e-7);
  }
  {
    INFO("c + a - g * e (broadcast over permuted and transposed 3-D views)");
    const ts::Shape s{2, 3, 4};
    auto y = ts::eval(c + a - g * e);
    static_assert(std::is_same_v<decltype(y), ts::Tensor<double>>);
    REQUIRE(y.shape() == s);
    check_close(
        values(y).data,
        tabulate(
            s, [&](std::int64_t i) { return vc.data[i] + va.at(s, i) - vg.data[i] * ve.at(s, i); }),
        1e-6, 1e-6);  // c + a is a float node, rounded in float
  }
  {
    INFO("exp(c) / (1 + abs(d)) with a 3-D permuted and a 2-D expanded operand");
    const ts::Shape s{2, 3, 4};
    ts::Tensor<float> y = ts::exp(c) / (1 + ts::abs(d));
    check_close(
        values(y).data,
        tabulate(
            s, [&](std::int64_t i) { return std::exp(vc.data[i]) / (1 + std::fabs(vd.at(s, i))); }),
        2e-6, 1e-7);
  }
  {
    INFO("a column of a matrix (stride 8) with a row (stride 1)");
    const auto m = sample<float>({5, 8}, 47);
    const auto column = m.narrow(1, 3, 1);  // [5, 1], stride 8
    const auto row = m.narrow(0, 2, 1);     // [1, 8]
    const values vcol(column), vrow(row);
    const ts::Shape s{5, 8};
    ts::Tensor<float> y = column * row - m;
    const values vm(m);
    check_close(
        values(y).data,
        tabulate(s, [&](std::int64_t i) { return vcol.at(s, i) * vrow.at(s, i) - vm.data[i]; }),
        1e-6, 1e-7);
  }
}

TEST_CASE("non-contiguous outputs: transposed, narrowed and permuted views", "[expr]") {
  const auto a = sample<float>({3, 4}, 51);
  const auto b = sample<float>({4}, 52);
  const values va(a), vb(b);
  {
    INFO("y.t() = a * 2 + b");
    auto y = ts::zeros<float>({4, 3});
    y.t() = a * 2 + b;
    const values vy(y);
    for (std::int64_t i = 0; i < 4; ++i) {
      for (std::int64_t j = 0; j < 3; ++j) {
        const double expected = va.data[j * 4 + i] * 2 + vb.data[i];
        CHECK(vy.data[i * 3 + j] == Approx(expected).epsilon(1e-6));
      }
    }
  }
  {
    INFO("z.narrow(1, 2, 4) += a, other columns untouched");
    auto z = ts::full<float>({3, 8}, 7.0f);
    z.narrow(1, 2, 4) += a;
    const values vz(z);
    for (std::int64_t i = 0; i < 3; ++i) {
      for (std::int64_t j = 0; j < 8; ++j) {
        const double expected =
            (j >= 2 && j < 6) ? 7.0f + static_cast<float>(va.data[i * 4 + j - 2]) : 7.0;
        CHECK(vz.data[i * 8 + j] == expected);
      }
    }
  }
  {
    INFO("w.permute({1, 2, 0}) = c + 1 for a [4, 2, 3] w");
    const auto c = sample<float>({2, 3, 4}, 53);
    const values vc(c);
    auto w = ts::zeros<float>({4, 2, 3});
    w.permute({1, 2, 0}) = c + 1;
    const values vw(w);
    for (std::int64_t i = 0; i < 2; ++i) {
      for (std::int64_t j = 0; j < 3; ++j) {
        for (std::int64_t k = 0; k < 4; ++k) {
          CHECK(vw.data[k * 6 + i * 3 + j] ==
                static_cast<float>(vc.data[i * 12 + j * 4 + k]) + 1.0f);
        }
      }
    }
  }
  {
    INFO("a row of y, selected, written with a broadcast 0-dim operand");
    auto y = ts::zeros<double>({3, 4});
    y[1] = b * ts::full<double>({}, 3.0);
    const values vy(y);
    for (std::int64_t j = 0; j < 12; ++j) {
      CHECK(vy.data[j] == (j / 4 == 1 ? vb.data[j % 4] * 3.0 : 0.0));
    }
  }
}

TEST_CASE("sizes that are not multiples of any vector width", "[expr]") {
  for (std::int64_t n : {1, 3, 7, 17, 1023, 1025, 65537}) {
    INFO("n = " << n);
    const auto a = sample<float>({n}, 60 + n);
    const auto b = sample<float>({n}, 61 + n);
    const auto c = sample<float>({n}, 62 + n);
    const values va(a), vb(b), vc(c);
    const ts::Shape s{n};
    // Contiguous operands: the linear (vectorisable) loop.
    ts::Tensor<float> y = a * b + c;
    check_close(values(y).data,
                tabulate(s, [&](std::int64_t i) { return va.data[i] * vb.data[i] + vc.data[i]; }),
                1e-6, 1e-6);
    // A stride-2 operand and a broadcast one: the strided loop.
    const auto strided = sample<float>({n, 2}, 63 + n).select(1, 1);
    const auto one = sample<float>({1}, 64);
    const values vs(strided), vone(one);
    ts::Tensor<float> z = strided - one * a;
    check_close(values(z).data,
                tabulate(s, [&](std::int64_t i) { return vs.data[i] - vone.data[0] * va.data[i]; }),
                1e-6, 1e-6);
  }
}

TEST_CASE("rows with operands broadcast along them (the unit-stride row loop)", "[expr]") {
  // Rows whose operands step by 1 or 0 run in blocks of 128 with the broadcast ones read from
  // copies of their value: rows of 15 (the general loop), 16, 128, 129 and 300 elements (blocks
  // and a partial one), float, double, int32 and bool operands, and an output that is one of
  // the operands.
  for (std::int64_t inner : {15, 16, 128, 129, 300}) {
    INFO("row of " << inner);
    const ts::Shape s{3, 5, inner};
    const auto x = sample<float>(s, 70 + inner);
    const auto scale = sample<float>({1, 5, 1}, 71);
    const auto shift = sample<double>({5, 1}, 72);
    const values vx(x), vscale(scale), vshift(shift);
    {
      INFO("relu(x * scale + shift), a channel's scale and shift (BatchNorm's pass)");
      ts::Tensor<float> y = ts::relu(x * scale + shift);
      check_close(values(y).data,
                  tabulate(s,
                           [&](std::int64_t i) {
                             return std::max(vx.data[i] * vscale.at(s, i) + vshift.at(s, i), 0.0);
                           }),
                  1e-6, 1e-6);
    }
    {
      INFO("double rows times a broadcast double (8-byte copies)");
      const auto xd = sample<double>(s, 73 + inner);
      const values vxd(xd);
      auto y = ts::eval(xd * shift - scale);
      static_assert(std::is_same_v<decltype(y), ts::Tensor<double>>);
      check_close(
          values(y).data,
          tabulate(s,
                   [&](std::int64_t i) { return vxd.data[i] * vshift.at(s, i) - vscale.at(s, i); }),
          1e-6, 1e-6);  // scale is float; the product is double
    }
    {
      INFO("where(mask, int32 rows, broadcast int32) with a bool mask broadcast over the rows");
      const auto ints = sample<std::int32_t>({4, inner}, 74 + inner, -50, 50);
      const auto other = sample<std::int32_t>({4, 1}, 75, -50, 50);
      const ts::Tensor<bool> mask = sample<float>({1, inner}, 76) > 0.0f;
      const values vi(ints), vo(other), vm(mask);
      const ts::Shape s2{4, inner};
      ts::Tensor<std::int32_t> y = ts::where(mask, ints, other);
      check_close(
          values(y).data,
          tabulate(s2,
                   [&](std::int64_t i) { return vm.at(s2, i) != 0 ? vi.data[i] : vo.at(s2, i); }),
          0, 0);
    }
    {
      INFO("narrowed rows (a gap between rows) plus a bias row");
      const auto wide = sample<float>({6, inner + 7}, 77 + inner).narrow(1, 3, inner);
      const auto bias = sample<float>({inner}, 78);
      const values vw(wide), vb(bias);
      const ts::Shape s2{6, inner};
      ts::Tensor<float> y = wide + bias;
      check_close(values(y).data,
                  tabulate(s2, [&](std::int64_t i) { return vw.data[i] + vb.at(s2, i); }), 1e-6,
                  1e-6);
    }
    {
      INFO("in place: y -= scale, y an operand of its own statement");
      ts::Tensor<float> y = x.clone();
      y -= scale;
      check_close(values(y).data,
                  tabulate(s, [&](std::int64_t i) { return vx.data[i] - vscale.at(s, i); }), 1e-6,
                  1e-6);
    }
  }
}

TEST_CASE("empty and 0-dim tensors", "[expr]") {
  const auto s0 = ts::full<float>({}, 3.0f);
  const auto s1 = ts::full<float>({}, -0.5f);
  auto y = ts::eval(s0 * s1 + 1);
  CHECK(y.shape() == ts::Shape{});
  CHECK(y.item() == -0.5f);
  CHECK(ts::eval(ts::exp(s1)).item() == Approx(std::exp(-0.5)).epsilon(1e-6));
  const auto m = sample<float>({2, 3}, 81);
  auto z = ts::eval(m - s0);
  CHECK(z.shape() == ts::Shape{2, 3});
  const values vm(m);
  check_close(values(z).data, tabulate({2, 3}, [&](std::int64_t i) { return vm.data[i] - 3.0; }),
              1e-6);
  auto acc = ts::full<std::int64_t>({}, 5);
  acc += 2;
  CHECK(acc.item() == 7);

  const auto e0 = ts::empty<float>({0});
  const auto e230 = ts::empty<float>({2, 0, 3});
  CHECK(ts::eval(e0 + e0).shape() == ts::Shape{0});
  CHECK(ts::eval(e0 * ts::ones<float>({1})).shape() == ts::Shape{0});
  CHECK(ts::eval(ts::exp(e230) + ts::ones<double>({3})).shape() == ts::Shape{2, 0, 3});
  CHECK(ts::eval(ts::ones<float>({4, 1, 1, 1}) - e230).shape() == ts::Shape{4, 2, 0, 3});
  CHECK(ts::eval(e0 < 1).shape() == ts::Shape{0});
  CHECK(ts::eval(e0 + s0).numel() == 0);
  auto empty_out = ts::empty<float>({0, 4});
  empty_out += 1;
  empty_out = ts::ones<float>({4}) * 2 + e0.view({0, 1});
  CHECK(empty_out.shape() == ts::Shape{0, 4});
  CHECK_THROWS_AS(e0 + ts::ones<float>({2}), ts::shape_error);
}

}  // namespace elementwise_test
