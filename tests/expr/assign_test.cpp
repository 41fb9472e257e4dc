// Evaluation of expressions (expr/assign.hpp) on the CPU: the four ways a statement runs
// (`Tensor<T> y = e`, `y = e`, `y op= e`, `ts::eval`), outputs that are views, aliasing between
// the output and the operands, one executor pass per statement, no allocation but the output,
// errors that name both shapes or both devices and leave the output untouched, undefined
// operands, and expressions that own their operands.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "expr/elementwise_reference.hpp"
#include "tessera/tessera.hpp"

namespace assign_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
using Catch::Matchers::Contains;
using expr_test::as_doubles;
using expr_test::check_close;
using expr_test::check_equal;
using expr_test::sample;
using expr_test::sigmoid_ref;
using expr_test::tabulate;
using expr_test::values;

namespace {
std::int64_t allocations() { return ts::memory::stats(ts::Device{}).allocations.allocated; }

/// Launches and allocations (on cpu:0) made while running fn.
template <class Fn>
std::pair<std::int64_t, std::int64_t> cost_of(Fn&& fn) {
  const auto launches = ts::profiler::kernel_launches();
  const auto allocated = allocations();
  fn();
  return {ts::profiler::kernel_launches() - launches, allocations() - allocated};
}
}  // namespace

TEST_CASE("Tensor<T> y = e makes a new tensor, converting to T", "[expr][assign]") {
  const auto a = ts::from_vector<float>({1.25f, -2.5f, 3.75f, 0.5f}, {2, 2});
  const auto b = ts::from_vector<float>({3.0f, -1.0f}, {2});
  ts::Tensor<float> f = a * b + 1;
  CHECK(f.shape() == ts::Shape{2, 2});
  CHECK(f.is_contiguous());
  check_equal(as_doubles(f), {4.75, 3.5, 12.25, 0.5});
  ts::Tensor<double> d = a / 3;  // computed in float, then widened
  check_equal(as_doubles(d),
              {double(1.25f / 3), double(-2.5f / 3), double(3.75f / 3), double(0.5f / 3)});
  ts::Tensor<std::int32_t> i = a * 2;  // truncated toward zero
  check_equal(as_doubles(i), {2, -5, 7, 1});
  ts::Tensor<ts::half> h = a / 3;  // rounded once from the float result
  check_equal(as_doubles(h),
              {double(float(ts::half(1.25f / 3))), double(float(ts::half(-2.5f / 3))),
               double(float(ts::half(3.75f / 3))), double(float(ts::half(0.5f / 3)))});
  ts::Tensor<bool> nonzero = a - 0.5;
  check_equal(as_doubles(nonzero), {1, 1, 1, 0});
  // On the operands' device (cpu:1 here).
  const auto on1 = ts::full<float>({3}, 2.0f, 1);
  ts::Tensor<float> y1 = on1 * on1;
  CHECK(y1.device() == ts::Device::parse("cpu:1"));
  check_equal(as_doubles(y1), {4, 4, 4});
  CHECK(ts::eval(on1 + 1).device() == ts::Device::parse("cpu:1"));
  // eval of a tensor is a copy, not a handle.
  auto copy = ts::eval(a);
  CHECK_FALSE(copy.shares_storage_with(a));
  check_equal(as_doubles(copy), as_doubles(a));
}

TEST_CASE("y = e writes into y's storage when the shapes match, else rebinds", "[expr][assign]") {
  const auto a = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto y = ts::zeros<float>({2, 3});
  const auto alias = y;                // another handle to the same storage
  const auto row = y.narrow(0, 1, 1);  // a view
  y = a * 10;
  CHECK(y.shares_storage_with(alias));
  check_equal(as_doubles(alias), {10, 20, 30, 40, 50, 60});
  check_equal(as_doubles(row), {40, 50, 60});
  // A dtype conversion on the way in.
  auto i = ts::zeros<std::int32_t>({2, 3});
  i = a / 4;
  check_equal(as_doubles(i), {0, 0, 0, 1, 1, 1});
  // Another shape: y now names a new tensor; the old storage keeps its values.
  y = a.narrow(1, 0, 1) + 1;
  CHECK(y.shape() == ts::Shape{2, 1});
  CHECK_FALSE(y.shares_storage_with(alias));
  check_equal(as_doubles(y), {2, 5});
  check_equal(as_doubles(alias), {10, 20, 30, 40, 50, 60});
  // An undefined tensor takes the result.
  ts::Tensor<double> u;
  u = a * 0.5;
  CHECK(u.defined());
  check_equal(as_doubles(u), {0.5, 1, 1.5, 2, 2.5, 3});
  // A same-shaped output on another device than the expression is an error, not a rebind.
  auto on1 = ts::zeros<float>({2, 3}, 1);
  CHECK_THROWS_AS(on1 = a + 1, ts::device_mismatch_error);
}

TEST_CASE("compound assignment runs in place, with broadcasting and conversion", "[expr][assign]") {
  auto y = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const auto alias = y;
  const auto r = ts::from_vector<float>({1, 10, 100}, {3});
  y += r;
  check_equal(as_doubles(alias), {2, 12, 103, 5, 15, 106});
  y -= 2;
  check_equal(as_doubles(alias), {0, 10, 101, 3, 13, 104});
  y *= ts::from_vector<double>({2, -1}, {2, 1});  // computed in double, stored as float
  check_equal(as_doubles(alias), {0, 20, 202, -3, -13, -104});
  y /= ts::from_vector<std::int32_t>({4}, {1});
  check_equal(as_doubles(alias), {0, 5, 50.5, -0.75, -3.25, -26});
  y += ts::exp(r * 0) * 0.5 + ts::full<float>({}, 0.25f);  // an expression operand
  check_equal(as_doubles(alias), {0.75, 5.75, 51.25, 0, -2.5, -25.25});
  // Integer tensors take integer results; int8 wraps.
  auto i = ts::from_vector<std::int32_t>({7, -3}, {2});
  i *= 3;
  i -= ts::from_vector<std::int64_t>({1, 1}, {2});
  check_equal(as_doubles(i), {20, -10});
  auto small = ts::from_vector<std::int8_t>({100}, {1});
  small += 100;
  CHECK(small.item() == -56);
  // half: computed in float, rounded once.
  auto h = ts::from_vector<ts::half>({ts::half(1.0f), ts::half(2048.0f)}, {2});
  h += 1.5;
  check_equal(as_doubles(h), {2.5, 2050});  // 2049.5 rounds to 2050: half's spacing is 2 there
  // An rvalue view, in place.
  auto z = ts::zeros<float>({3, 4});
  z.narrow(1, 1, 2) += 1;
  z.t().narrow(0, 3, 1) -= ts::from_vector<float>({1, 2, 3}, {3});
  check_equal(as_doubles(z), {0, 1, 1, -1, 0, 1, 1, -2, 0, 1, 1, -3});
  // A [3, 1] output with its size-1 dimension's stride: still in place.
  auto column = ts::from_vector<float>({1, 2, 3}, {3, 1});
  const auto column_alias = column;
  column += column;
  check_equal(as_doubles(column_alias), {2, 4, 6});
}

TEST_CASE("outputs that are views receive the values in their own layout", "[expr][assign]") {
  const auto a = sample<float>({4, 3}, 1);
  const auto b = sample<float>({3, 4}, 2);
  const values va(a), vb(b);
  auto y = ts::zeros<float>({4, 3});
  y.t() = b * 2 + a.t();  // y[i][j] = 2 b[j][i] + a[i][j]
  const values vy(y);
  for (std::int64_t i = 0; i < 4; ++i) {
    for (std::int64_t j = 0; j < 3; ++j) {
      const float expected =
          static_cast<float>(vb.data[j * 4 + i]) * 2 + static_cast<float>(va.data[i * 3 + j]);
      CHECK(vy.data[i * 3 + j] == expected);
    }
  }
  // Writing every other element through a stride-2 view of a [3, 4, 2] tensor.
  auto wide = ts::zeros<float>({3, 4, 2});
  wide.select(2, 0) = b + 1;
  const values vw(wide);
  for (std::int64_t k = 0; k < 24; ++k) {
    CHECK(vw.data[k] == (k % 2 == 0 ? static_cast<float>(vb.data[k / 2]) + 1.0f : 0.0f));
  }
}

TEST_CASE("an output that aliases an operand reads the operand's old values", "[expr][assign]") {
  const std::vector<float> start = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  SECTION("y = y.t() + 0 transposes a square y") {
    auto y = ts::from_vector<float>(start, {3, 3});
    y = y.t() + 0;
    check_equal(as_doubles(y), {1, 4, 7, 2, 5, 8, 3, 6, 9});
  }
  SECTION("y += y.t() adds the old transpose") {
    auto y = ts::from_vector<float>(start, {3, 3});
    y += y.t();
    check_equal(as_doubles(y), {2, 6, 10, 6, 10, 14, 10, 14, 18});
  }
  SECTION("y += y doubles in one pass") {
    auto y = ts::from_vector<float>(start, {3, 3});
    const auto [launches, allocated] = cost_of([&] { y += y; });
    check_equal(as_doubles(y), {2, 4, 6, 8, 10, 12, 14, 16, 18});
    CHECK(launches == 1);
    CHECK(allocated == 0);
  }
  SECTION("v = v * 2 through a view of y") {
    auto y = ts::from_vector<float>(start, {3, 3});
    auto v = y.narrow(0, 1, 2);
    v = v * 2;
    check_equal(as_doubles(y), {1, 2, 3, 8, 10, 12, 14, 16, 18});
  }
  SECTION("y += y[0] adds the old first row to every row") {
    auto y = ts::from_vector<float>(start, {3, 3});
    y += y[0];
    check_equal(as_doubles(y), {2, 4, 6, 5, 7, 9, 8, 10, 12});
  }
  SECTION("a shifted overlapping view: y[:, 1:] = y[:, :2] + 10") {
    auto y = ts::from_vector<float>(start, {3, 3});
    y.narrow(1, 1, 2) = y.narrow(1, 0, 2) + 10;
    check_equal(as_doubles(y), {1, 11, 12, 4, 14, 15, 7, 17, 18});
  }
  SECTION("the transpose written into itself: y.t() = y * 1") {
    auto y = ts::from_vector<float>(start, {3, 3});
    y.t() = y * 1;
    check_equal(as_doubles(y), {1, 4, 7, 2, 5, 8, 3, 6, 9});
  }
}

TEST_CASE("one executor pass per statement", "[expr][assign]") {
  const auto a = sample<float>({64, 33}, 11);
  const auto b = sample<float>({33}, 12);
  const auto c = sample<float>({64, 1}, 13);
  const auto d = sample<float>({33, 64}, 14).t();
  const values va(a), vb(b), vc(c), vd(d);
  const ts::Shape s{64, 33};
  ts::profiler::reset_kernel_launches();
  CHECK(ts::profiler::kernel_launches() == 0);
  // Building an expression runs nothing.
  auto expression = ts::sigmoid(a * b + c) * ts::tanh(d);
  CHECK(ts::profiler::kernel_launches() == 0);
  {
    std::optional<ts::Tensor<float>> y;
    const auto [launches, allocated] =
        cost_of([&] { y.emplace(ts::sigmoid(a * b + c) * ts::tanh(d)); });  // Tensor<float> y = e
    CHECK(launches == 1);
    CHECK(allocated == 1);
    check_close(as_doubles(*y),
                tabulate(s,
                         [&](std::int64_t i) {
                           return sigmoid_ref(va.data[i] * vb.at(s, i) + vc.at(s, i)) *
                                  std::tanh(vd.data[i]);
                         }),
                1e-5, 1e-7);
  }
  auto y = ts::zeros<float>(s);
  {
    const auto [launches, allocated] = cost_of([&] { y += expression; });
    CHECK(launches == 1);
    CHECK(allocated == 0);
  }
  {
    const auto [launches, allocated] = cost_of([&] { y = a * 2 - d; });
    CHECK(launches == 1);
    CHECK(allocated == 0);
  }
  {
    const auto [launches, allocated] = cost_of([&] { y.t() = ts::exp(d.t()) + b.view({33, 1}); });
    CHECK(launches == 1);
    CHECK(allocated == 0);
    // Per element: float exp is within 1.5 ulp (expr/detail/vector_math.hpp) and the sum is
    // rounded once (0.5 ulp of the result); a relative bound on the result alone would not
    // hold where exp(d) and b nearly cancel.
    const auto ulp = [](double x) { return std::ldexp(1.0, std::max(std::ilogb(x), -126) - 23); };
    const std::vector<double> got = as_doubles(y);
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < s.numel(); ++i) {
      const double e = std::exp(vd.data[i]);
      const double reference = e + vb.at(s, i);
      const double bound = 1.5 * ulp(e) + 0.5 * ulp(reference) + 1e-12;
      bad += std::fabs(got[static_cast<std::size_t>(i)] - reference) > bound;
    }
    CHECK(bad == 0);
  }
  {
    const auto [launches, allocated] =
        cost_of([&] { CHECK(ts::eval(ts::where(a > c, a, c)).numel() == 64 * 33); });
    CHECK(launches == 1);
    CHECK(allocated == 1);
  }
  {
    auto column = ts::zeros<float>({64, 1});
    const auto [launches, allocated] = cost_of([&] { column -= c * 2; });
    CHECK(launches == 1);
    CHECK(allocated == 0);
  }
}

TEST_CASE("nothing is allocated but the output", "[expr][assign]") {
  const auto a = sample<double>({100, 100}, 21);
  const auto b = sample<float>({100}, 22);
  const auto base = ts::memory::allocated(ts::Device{});
  {
    const auto [launches, allocated] = cost_of([&] {
      ts::Tensor<double> y = ts::sqrt(ts::abs(a.t() * b) + 1) / (ts::exp(b) + a);
      CHECK(ts::memory::allocated(ts::Device{}) - base ==
            80384);  // 80000 B rounded up to a multiple of 512
    });
    CHECK(launches == 1);
    CHECK(allocated == 1);
  }
  CHECK(ts::memory::allocated(ts::Device{}) == base);
  auto y = ts::zeros<double>({100, 100});
  const auto [launches, allocated] = cost_of([&] {
    y *= ts::where(a > 0, a, b * 2) - 1;
    y = ts::cast<ts::half>(a) + b;
  });
  CHECK(launches == 2);
  CHECK(allocated == 0);
}

TEST_CASE("errors name both shapes or both devices and leave the output as it was",
          "[expr][assign]") {
  const auto a = ts::ones<float>({2, 3});
  const auto b = ts::ones<float>({4});
  SECTION("shapes that do not broadcast throw when the expression is built") {
    CHECK_THROWS_WITH(a + b, Contains("[2, 3]") && Contains("[4]"));
    CHECK_THROWS_AS(a * b, ts::shape_error);
    CHECK_THROWS_AS(ts::maximum(b, a), ts::shape_error);
    CHECK_THROWS_AS(ts::where(a > 0, a, b), ts::shape_error);
    CHECK_THROWS_WITH(ts::where(b > 0, a, a), Contains("[4]") && Contains("[2, 3]"));
    CHECK_THROWS_AS(ts::exp(a) - (b + 1), ts::shape_error);
  }
  SECTION("an output that cannot hold the result") {
    auto y = ts::full<float>({3}, 5.0f);
    CHECK_THROWS_WITH(y += a, Contains("[3]") && Contains("[2, 3]"));
    CHECK_THROWS_AS(y += a, ts::shape_error);
    check_equal(as_doubles(y), {5, 5, 5});
    auto z = ts::full<float>({2, 3}, 5.0f);
    CHECK_THROWS_AS(z.narrow(1, 0, 2) -= a, ts::shape_error);
    check_equal(as_doubles(z), {5, 5, 5, 5, 5, 5});
  }
  SECTION("operands on different ordinals") {
    REQUIRE(ts::cpu::device_count() >= 2);
    const auto on1 = ts::ones<float>({2, 3}, 1);
    CHECK_THROWS_AS(a + on1, ts::device_mismatch_error);
    CHECK_THROWS_WITH(a + on1, Contains("cpu:0") && Contains("cpu:1"));
    CHECK_THROWS_WITH(ts::exp(on1) * (a + 1), Contains("cpu:0") && Contains("cpu:1"));
    CHECK_THROWS_AS(ts::where(a > 0, on1, 0), ts::device_mismatch_error);
    auto y = ts::full<float>({2, 3}, 5.0f);
    CHECK_THROWS_WITH(y += on1, Contains("cpu:0") && Contains("cpu:1"));
    CHECK_THROWS_WITH(y = on1 * 2, Contains("cpu:0") && Contains("cpu:1"));
    check_equal(as_doubles(y), {5, 5, 5, 5, 5, 5});
    // Scalars fit any device.
    ts::Tensor<float> ok = on1 * 2 + 1;
    CHECK(ok.device_index() == 1);
  }
  SECTION("an expanded output would write one element several times") {
    auto x = ts::from_vector<float>({1, 2}, {2});
    auto expanded = x.expand({3, 2});
    CHECK_THROWS_AS(expanded += 1, ts::error);
    CHECK_THROWS_WITH(expanded = x.expand({3, 2}) * 3, Contains("[3, 2]"));
    check_equal(as_doubles(x), {1, 2});
  }
}

TEST_CASE("undefined tensors as operands throw", "[expr][assign]") {
  const ts::Tensor<float> undefined;
  const auto a = ts::ones<float>({2});
  CHECK_THROWS_AS(undefined + a, ts::error);
  CHECK_THROWS_WITH(a * undefined, Contains("undefined"));
  CHECK_THROWS_AS(undefined < 1, ts::error);
  CHECK_THROWS_AS(ts::where(a > 0, undefined, a), ts::error);
  CHECK_THROWS_WITH(ts::eval(ts::exp(undefined)), Contains("undefined"));
  CHECK_THROWS_AS(ts::Tensor<float>(-undefined), ts::error);
  ts::Tensor<float> target;
  CHECK_THROWS_WITH(target += 1, Contains("undefined"));
  auto y = ts::ones<float>({2});
  CHECK_THROWS_AS(y += undefined, ts::error);
  CHECK_THROWS_AS(y = ts::abs(undefined) + a, ts::error);
  check_equal(as_doubles(y), {1, 1});
}

TEST_CASE("expressions own their operands and read them when evaluated", "[expr][assign]") {
  auto make = [] {
    auto t = ts::from_vector<float>({1, 2, 3}, {3});
    return ts::exp(t * 0) + t * 2;  // t goes out of scope here; the expression keeps it
  };
  const auto expression = make();
  check_equal(as_doubles(ts::eval(expression)), {3, 5, 7});
  check_equal(as_doubles(ts::eval(expression)), {3, 5, 7});
  // Lazy: the values are read at evaluation, so a change before it is seen.
  auto a = ts::from_vector<float>({1, 2}, {2});
  const auto later = a + 1;
  a.fill_(10.0f);
  check_equal(as_doubles(ts::eval(later)), {11, 11});
}

TEST_CASE("assignment to a temporary view writes through, with broadcasting", "[expr][assign]") {
  // y[3, 4] = 0..11; each section writes into part of it and compares the whole of y with a
  // float64 reference computed here element by element.
  std::vector<double> start(12);
  for (std::size_t k = 0; k < start.size(); ++k) start[k] = static_cast<double>(k);
  auto y = ts::from_vector<float>(std::vector<float>(start.begin(), start.end()), {3, 4});
  const auto alias = y;
  std::vector<double> expected = start;
  const auto at = [&](std::int64_t i, std::int64_t j) -> double& {
    return expected[static_cast<std::size_t>(i * 4 + j)];
  };
  const auto col = ts::from_vector<float>({0.5f, -1.25f, 3.0f}, {3, 1});
  const auto row = ts::from_vector<float>({1, 2, 3, 4}, {4});

  SECTION("an expression broadcast over the view's columns: y[:, 1:3] = col * 2 + 1") {
    const auto [launches, allocated] = cost_of([&] { y.narrow(1, 1, 2) = col * 2 + 1; });
    for (std::int64_t i = 0; i < 3; ++i) {
      for (std::int64_t j = 1; j < 3; ++j) at(i, j) = values(col).data[i] * 2 + 1;
    }
    CHECK(launches == 1);  // one pass into the view, nothing allocated
    CHECK(allocated == 0);
  }
  SECTION("a row broadcast over a row view: y[1:2] = exp(row * 0.5)") {
    y.narrow(0, 1, 1) = ts::exp(row * 0.5);
    for (std::int64_t j = 0; j < 4; ++j) at(1, j) = std::exp(values(row).data[j] * 0.5);
    // exp within 1.5 ulp (1.8e-7 relative); the other rows exactly as they were.
    check_close(as_doubles(alias), expected, 1.8e-7);
    for (std::int64_t j = 0; j < 4; ++j) at(1, j) = values(alias.select(0, 1)).data[j];
  }
  SECTION("a strided view of the transpose: y.t()[3] = col.view(3) - 1") {
    y.t().select(0, 3) = col.view({3}) - 1;
    for (std::int64_t i = 0; i < 3; ++i) at(i, 3) = values(col).data[i] - 1;
  }
  SECTION("the view reads its own storage: y[:, 1:] = y[:, 0:1] * 3 (old column 0)") {
    y.narrow(1, 1, 3) = y.narrow(1, 0, 1) * 3;
    for (std::int64_t i = 0; i < 3; ++i) {
      for (std::int64_t j = 1; j < 4; ++j) at(i, j) = start[static_cast<std::size_t>(i * 4)] * 3;
    }
  }
  SECTION("a tensor is copied in, broadcasting: y[:, 0:2] = col") {
    y.narrow(1, 0, 2) = col;
    for (std::int64_t i = 0; i < 3; ++i) at(i, 0) = at(i, 1) = values(col).data[i];
  }
  SECTION("a tensor of another dtype and device: y[2] = int64 row on cpu:1") {
    REQUIRE(ts::cpu::device_count() >= 2);
    y[2] = ts::from_vector<std::int64_t>({-7, 8, -9, 10}, {4}, 1);
    at(2, 0) = -7, at(2, 1) = 8, at(2, 2) = -9, at(2, 3) = 10;
  }
  SECTION("a tensor overlapping the view: y[:, 1:] = y[:, 0:3] (old values)") {
    y.narrow(1, 1, 3) = y.narrow(1, 0, 3);
    for (std::int64_t i = 0; i < 3; ++i) {
      for (std::int64_t j = 1; j < 4; ++j)
        at(i, j) = start[static_cast<std::size_t>(i * 4 + j - 1)];
    }
  }
  SECTION("numbers fill the view, converted: y[:, 3] = 0.5; y[0] = 7") {
    y.select(1, 3) = 0.5;
    y[0] = 7;
    for (std::int64_t i = 0; i < 3; ++i) at(i, 3) = 0.5;
    for (std::int64_t j = 0; j < 4; ++j) at(0, j) = 7;
  }
  check_equal(as_doubles(alias), expected);

  SECTION("an int32 view takes a float number truncated, as fill_") {
    auto i = ts::zeros<std::int32_t>({2, 2});
    i.narrow(0, 1, 1) = -2.75;
    check_equal(as_doubles(i), {0, 0, -2, -2});
  }
  SECTION("a half view takes an expression rounded once") {
    auto h = ts::zeros<ts::half>({2, 3});
    h.narrow(1, 0, 2) = col.narrow(0, 0, 2) / 3;
    const double third = static_cast<float>(ts::half(0.5f / 3)),
                 minus = static_cast<float>(ts::half(-1.25f / 3));
    check_equal(as_doubles(h), {third, third, 0, minus, minus, 0});
  }
}

TEST_CASE("assignment to a named tensor keeps handle semantics", "[expr][assign]") {
  auto y = ts::zeros<float>({2, 3});
  const auto x = ts::ones<float>({4});
  auto view = y.narrow(1, 0, 1);
  view = x;  // the name `view` now refers to x; y is untouched
  CHECK(view.shares_storage_with(x));
  CHECK(view.shape() == ts::Shape{4});
  check_equal(as_doubles(y), {0, 0, 0, 0, 0, 0});
  y = x;  // y is another handle to x, as `y = x` in Python
  CHECK(y.shares_storage_with(x));
  auto z = ts::zeros<float>({2});
  ts::Tensor<float>& named = z;
  named = ts::full<float>({3}, 2.0f);  // through a reference: still a rebind
  CHECK(z.shape() == ts::Shape{3});
}

TEST_CASE("assignment to a temporary view: errors name both shapes and write nothing",
          "[expr][assign]") {
  auto y = ts::full<float>({3, 4}, 5.0f);
  const std::vector<double> fives(12, 5.0);
  SECTION("an expression that does not broadcast to the view") {
    CHECK_THROWS_AS(y.narrow(1, 0, 2) = ts::ones<float>({3, 3}) * 2, ts::shape_error);
    CHECK_THROWS_WITH(y.narrow(1, 0, 2) = ts::ones<float>({3, 3}) * 2,
                      Contains("[3, 2]") && Contains("[3, 3]"));
    // Broadcasting goes one way only: the view [3, 1] cannot take a [3, 2] result.
    CHECK_THROWS_WITH(y.narrow(1, 0, 1) = ts::ones<float>({3, 2}) + 1,
                      Contains("[3, 1]") && Contains("[3, 2]"));
  }
  SECTION("a tensor that does not broadcast to the view") {
    CHECK_THROWS_AS(y.narrow(1, 0, 2) = ts::ones<float>({4}), ts::shape_error);
    CHECK_THROWS_WITH(y[0] = ts::ones<double>({3}), Contains("[3]") && Contains("[4]"));
  }
  SECTION("an expression on another ordinal") {
    REQUIRE(ts::cpu::device_count() >= 2);
    CHECK_THROWS_WITH(y.narrow(0, 0, 1) = ts::ones<float>({4}, 1) * 2,
                      Contains("cpu:0") && Contains("cpu:1"));
  }
  SECTION("an expanded view would write one element several times") {
    auto x = ts::full<float>({4}, 5.0f);
    CHECK_THROWS_AS(x.expand({3, 4}) = ts::ones<float>({3, 4}) * 2, ts::error);
    check_equal(as_doubles(x), {5, 5, 5, 5});
  }
  SECTION("an undefined temporary") {
    CHECK_THROWS_WITH(ts::Tensor<float>() = ts::ones<float>({2}) + 1, Contains("undefined"));
    CHECK_THROWS_WITH(ts::Tensor<float>() = ts::ones<float>({2}), Contains("undefined"));
    CHECK_THROWS_WITH(ts::Tensor<float>() = 1.0f, Contains("undefined"));
  }
  check_equal(as_doubles(y), fives);
}

}  // namespace assign_test
