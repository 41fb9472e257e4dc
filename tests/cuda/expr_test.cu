// Elementwise expressions on CUDA tensors (compiled by nvcc, so the CUDA executor's kernels run):
// each operator and function once under broadcasting with a non-contiguous operand, against
// float64 references computed on the host from the operands' values; dtype mixing, half and
// cast rounding, NaN, the linear and rows kernels at odd and large sizes (grid-stride loop and
// its unrolled tail; rows with per-channel operands, 16-byte and scalar paths, split rows), view outputs, aliasing, one kernel per statement and no allocation but the
// output, errors. The 4-KiB kernel-parameter limit is a static_assert, so it has no run-time
// test. The executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "expr/elementwise_reference.hpp"
#include "tessera/tessera.hpp"

namespace cuda_expr_test {  // one namespace per file: a unity build

namespace ts = tessera;
using expr_test::as_doubles;
using expr_test::check_close;
using expr_test::check_equal;
using expr_test::maximum_ref;
using expr_test::minimum_ref;
using expr_test::relu_ref;
using expr_test::sigmoid_ref;
using expr_test::tabulate;
using expr_test::values;

namespace {
template <class T>
ts::Tensor<T, ts::cuda> on_gpu(const ts::Shape& shape, std::uint64_t seed, double lo = -3.0,
                               double hi = 3.0) {
  return expr_test::sample<T>(shape, seed, lo, hi).cuda();
}
const ts::Device gpu0 = ts::Device::parse("cuda:0");
std::int64_t gpu_allocations() { return ts::memory::stats(gpu0).allocations.allocated; }
}  // namespace

TEST_CASE("cuda: every operator and function with broadcasting and a transposed operand",
          "[cuda][expr]") {
  const auto a = on_gpu<float>({4, 3}, 1).t();     // [3, 4], strided
  const auto b = on_gpu<float>({4}, 2, 0.5, 3.0);  // positive, broadcast
  const auto c = on_gpu<float>({2, 1, 4}, 3);      // leading dimension
  const values va(a), vb(b), vc(c);
  const ts::Shape s{2, 3, 4};
  const auto zero = a * 0 + c * 0;  // broadcasts a one-operand function to [2, 3, 4]
  auto expect = [&](const auto& result, auto ref, double rel) {
    REQUIRE(result.is_cuda());
    REQUIRE(result.shape() == s);
    check_close(
        values(result).data,
        tabulate(s, [&](std::int64_t i) { return ref(va.at(s, i), vb.at(s, i), vc.at(s, i)); }),
        rel, rel * 1e-2);
  };
  // clang-format off
  { INFO("+ -"); expect(ts::eval(a + c - b), [](double x, double y, double z) { return x + z - y; }, 1e-6); }
  { INFO("* /"); expect(ts::eval(a * c / b), [](double x, double y, double z) { return x * z / y; }, 1e-6); }
  { INFO("unary -"); expect(ts::eval(-a + zero), [](double x, double, double) { return -x; }, 0); }
  { INFO("pow"); expect(ts::eval(ts::pow(b, a) + zero), [](double x, double y, double) { return std::pow(y, x); }, 4e-6); }
  { INFO("maximum"); expect(ts::eval(ts::maximum(a, c)), [](double x, double, double z) { return maximum_ref(x, z); }, 0); }
  { INFO("minimum"); expect(ts::eval(ts::minimum(c, a)), [](double x, double, double z) { return minimum_ref(z, x); }, 0); }
  { INFO("exp"); expect(ts::eval(ts::exp(a) + zero), [](double x, double, double) { return std::exp(x); }, 4e-6); }
  { INFO("log"); expect(ts::eval(ts::log(b) + zero), [](double, double y, double) { return std::log(y); }, 4e-6); }
  { INFO("sqrt"); expect(ts::eval(ts::sqrt(b) + zero), [](double, double y, double) { return std::sqrt(y); }, 4e-6); }
  { INFO("rsqrt"); expect(ts::eval(ts::rsqrt(b) + zero), [](double, double y, double) { return 1 / std::sqrt(y); }, 4e-6); }
  { INFO("abs"); expect(ts::eval(ts::abs(a) + zero), [](double x, double, double) { return std::fabs(x); }, 0); }
  { INFO("sin"); expect(ts::eval(ts::sin(a) + zero), [](double x, double, double) { return std::sin(x); }, 4e-6); }
  { INFO("cos"); expect(ts::eval(ts::cos(c) + zero), [](double, double, double z) { return std::cos(z); }, 4e-6); }
  { INFO("tanh"); expect(ts::eval(ts::tanh(a) + zero), [](double x, double, double) { return std::tanh(x); }, 4e-6); }
  { INFO("sigmoid"); expect(ts::eval(ts::sigmoid(c) + zero), [](double, double, double z) { return sigmoid_ref(z); }, 4e-6); }
  { INFO("relu"); expect(ts::eval(ts::relu(a) + zero), [](double x, double, double) { return relu_ref(x); }, 0); }
  { INFO("<"); expect(ts::eval(a < c), [](double x, double, double z) { return double(x < z); }, 0); }
  { INFO("<="); expect(ts::eval(a <= c), [](double x, double, double z) { return double(x <= z); }, 0); }
  { INFO(">"); expect(ts::eval(a > c), [](double x, double, double z) { return double(x > z); }, 0); }
  { INFO(">="); expect(ts::eval(a >= c), [](double x, double, double z) { return double(x >= z); }, 0); }
  { INFO("=="); expect(ts::eval(a == c + 0 * b), [](double x, double, double z) { return double(x == z); }, 0); }
  { INFO("!="); expect(ts::eval(a != c), [](double x, double, double z) { return double(x != z); }, 0); }
  { INFO("where"); expect(ts::eval(ts::where(a > c, a, 0.5) + b * 0), [](double x, double, double z) { return x > z ? x : 0.5; }, 0); }
  { INFO("scalar on the left"); expect(ts::eval(2.0 / b + zero), [](double, double y, double) { return 2.0 / y; }, 1e-6); }
  { INFO("fused"); expect(ts::eval(ts::sigmoid(a * b + c) * ts::tanh(c)), [](double x, double y, double z) { return sigmoid_ref(x * y + z) * std::tanh(z); }, 1e-5); }
  // clang-format on
}

TEST_CASE("cuda: dtype mixing, half, cast rounding and NaN", "[cuda][expr]") {
  const auto f32 = ts::from_vector<float>({1.5f, -2.25f, 3.0f}, {3}).cuda();
  const auto f64 = ts::from_vector<double>({0.1, 0.2, -0.3}, {3}).cuda();
  const auto i32 = ts::from_vector<std::int32_t>({7, -7, 1}, {3}).cuda();
  const auto i8 = ts::from_vector<std::int8_t>({-100, 127, -128}, {3}).cuda();
  const auto u8 = ts::from_vector<std::uint8_t>({200, 255, 0}, {3}).cuda();
  const auto b = ts::from_vector<bool>({true, false, true}, {3}).cuda();
  auto sum = ts::eval(f32 + f64);
  static_assert(std::is_same_v<decltype(sum), ts::Tensor<double, ts::cuda>>);
  check_equal(as_doubles(sum), {double(1.5f) + 0.1, double(-2.25f) + 0.2, double(3.0f) - 0.3});
  auto quotient = ts::eval(i32 / ts::from_vector<std::int32_t>({2, 2, 0}, {3}).cuda());
  static_assert(std::is_same_v<decltype(quotient), ts::Tensor<float, ts::cuda>>);
  check_equal(as_doubles(quotient), {3.5, -3.5, std::numeric_limits<double>::infinity()});
  auto wide = ts::eval(i8 + u8);
  static_assert(std::is_same_v<decltype(wide), ts::Tensor<std::int16_t, ts::cuda>>);
  check_equal(as_doubles(wide), {100, 382, -128});
  auto counts = ts::eval(b + 1);
  static_assert(std::is_same_v<decltype(counts), ts::Tensor<std::int64_t, ts::cuda>>);
  check_equal(as_doubles(counts), {2, 1, 2});
  check_equal(as_doubles(ts::eval(ts::pow(i32, 3))), {343, -343, 1});
  // half computes in float and rounds once.
  const auto h =
      ts::from_vector<ts::half>({ts::half(2048.0f), ts::half(0.1f), ts::half(-3.0f)}, {3}).cuda();
  auto hs = ts::eval(h + 1 + 1);
  static_assert(std::is_same_v<decltype(hs), ts::Tensor<ts::half, ts::cuda>>);
  check_equal(as_doubles(hs), {2050, double(float(ts::half(float(ts::half(0.1f)) + 2.0f))), -1});
  // cast<half> rounds as ts::half does (ties to even, overflow to infinity).
  std::vector<float> host = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65519.0f, 65520.0f, 3e-8f};
  for (double v : expr_test::numbers(1000, 7, -70000.0, 70000.0))
    host.push_back(static_cast<float>(v));
  const auto x = ts::from_vector<float>(host, {static_cast<std::int64_t>(host.size())}).cuda();
  ts::Tensor<float, ts::cuda> rounded = ts::cast<float>(ts::cast<ts::half>(x));
  std::vector<double> expected;
  for (float v : host) expected.push_back(static_cast<float>(ts::half(v)));
  check_equal(as_doubles(rounded), expected);
  ts::Tensor<float, ts::cuda> brounded = ts::cast<ts::bfloat16>(x) * 1;
  expected.clear();
  for (float v : host) expected.push_back(static_cast<float>(ts::bfloat16(v)));
  check_equal(as_doubles(brounded), expected);
  // NaN propagates through maximum, minimum and relu on the device too.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto p = ts::from_vector<float>({NAN, 1.0f, -2.0f}, {3}).cuda();
  const auto q = ts::from_vector<float>({1.0f, NAN, 3.0f}, {3}).cuda();
  check_equal(as_doubles(ts::eval(ts::maximum(p, q))), {nan, nan, 3.0});
  check_equal(as_doubles(ts::eval(ts::minimum(p, q))), {nan, nan, -2.0});
  check_equal(as_doubles(ts::eval(ts::relu(p))), {nan, 1.0, 0.0});
  check_equal(as_doubles(ts::eval(p != p)), {1, 0, 0});
}

TEST_CASE("cuda: linear and rows kernels at odd and large sizes", "[cuda][expr]") {
  for (std::int64_t n : {1, 3, 1023, 1025, 65537, (1 << 20) + 3}) {
    INFO("n = " << n);
    const auto a = on_gpu<float>({n}, 10 + n);
    const auto b = on_gpu<float>({n}, 11 + n);
    const values va(a), vb(b);
    ts::Tensor<float, ts::cuda> y = a * b + 1;  // linear kernel
    check_close(values(y).data,
                tabulate({n}, [&](std::int64_t i) { return va.data[i] * vb.data[i] + 1; }), 1e-6,
                1e-6);
    const auto strided = on_gpu<double>({n, 2}, 12 + n).select(1, 1);  // strided kernel
    const values vs(strided);
    auto z = ts::eval(strided - a);
    check_close(values(z).data,
                tabulate({n}, [&](std::int64_t i) { return vs.data[i] - va.data[i]; }), 1e-12,
                1e-12);
  }
  // A permuted 3-D operand and a transposed output together.
  const auto c = on_gpu<float>({5, 7, 3}, 20).permute({2, 0, 1});  // [3, 5, 7]
  const auto d = on_gpu<float>({7}, 21);
  const values vc(c), vd(d);
  auto out = ts::zeros<float, ts::cuda>({7, 5, 3});
  out.permute({2, 1, 0}) = c * d;
  const values vo(out);
  for (std::int64_t i = 0; i < 3; ++i) {
    for (std::int64_t j = 0; j < 5; ++j) {
      for (std::int64_t k = 0; k < 7; ++k) {
        CHECK(vo.data[k * 15 + j * 3 + i] ==
              static_cast<float>(vc.data[i * 35 + j * 7 + k]) * static_cast<float>(vd.data[k]));
      }
    }
  }
  // 0-dim and empty.
  CHECK(ts::eval(ts::full<float, ts::cuda>({}, 2.0f) * 3).item() == 6.0f);
  CHECK(ts::eval(ts::empty<float, ts::cuda>({0, 3}) + d.narrow(0, 0, 3)).shape() ==
        ts::Shape{0, 3});
}

TEST_CASE("cuda: rows with per-channel operands (batch norm's apply), 16-byte and scalar paths",
          "[cuda][expr]") {
  // [N, C, L] * scale[1, C, 1] + shift[1, C, 1]: the rows kernel with 16-byte loads when L is a
  // multiple of the vector (float: 4, half: 8, double: 2), one element at a time when it is not,
  // and a row split over blocks (few rows, long ones).
  for (const ts::Shape& shape :
       std::vector<ts::Shape>{{4, 8, 3136}, {4, 8, 49}, {2, 3, 12544}, {1, 2, 1 << 20}, {3, 5, 6}}) {
    INFO("shape " << shape);
    const std::int64_t c = shape[1], l = shape[2];
    const auto x = on_gpu<float>(shape, 30);
    const auto scale = on_gpu<float>({1, c, 1}, 31);
    const auto shift = on_gpu<float>({1, c, 1}, 32);
    const values vx(x), vs(scale), vb(shift);
    auto channel = [&](std::int64_t i) { return i / l % c; };
    auto y = ts::eval(ts::relu(x * scale + shift));
    check_close(values(y).data, tabulate(shape, [&](std::int64_t i) {
                  return relu_ref(static_cast<float>(vx.data[i] * vs.data[channel(i)]) +
                                  vb.data[channel(i)]);
                }),
                1e-6, 1e-6);
    // Half output (8 per 16-byte store) and double (2 per store) of the same expression.
    auto h = ts::Tensor<ts::half, ts::cuda>(x * scale + shift);
    check_close(values(h).data, tabulate(shape, [&](std::int64_t i) {
                  return static_cast<float>(vx.data[i] * vs.data[channel(i)]) + vb.data[channel(i)];
                }),
                1e-3, 1e-3);
    auto d = ts::Tensor<double, ts::cuda>(x - shift);
    check_close(values(d).data, tabulate(shape, [&](std::int64_t i) {
                  return static_cast<double>(static_cast<float>(vx.data[i] - vb.data[channel(i)]));
                }),
                1e-12, 1e-12);
    // Into a view whose rows are not aligned (a narrowed output): the scalar path.
    auto wide = ts::zeros<float, ts::cuda>({shape[0], c, l + 1});
    wide.narrow(2, 1, l) = x - shift;
    const values vw(wide);
    for (std::int64_t i = 0; i < shape.numel(); i += 97) {
      const std::int64_t row = i / l, at = i % l;
      CHECK(vw.data[row * (l + 1) + at + 1] ==
            static_cast<float>(vx.data[i] - vb.data[channel(i)]));
    }
  }
}

TEST_CASE("cuda: assignment, aliasing, one kernel and one allocation per statement",
          "[cuda][expr]") {
  const auto a = on_gpu<float>({64, 33}, 30);
  const auto b = on_gpu<float>({33}, 31);
  const auto c = on_gpu<float>({64, 1}, 32);
  const auto d = on_gpu<float>({33, 64}, 33).t();
  const values va(a), vb(b), vc(c), vd(d);
  const ts::Shape s{64, 33};
  ts::cuda::synchronize(0);
  auto launches = ts::profiler::kernel_launches();
  auto allocated = gpu_allocations();
  ts::Tensor<float, ts::cuda> y = ts::sigmoid(a * b + c) * ts::tanh(d);
  CHECK(ts::profiler::kernel_launches() - launches == 1);
  CHECK(gpu_allocations() - allocated == 1);
  check_close(values(y).data,
              tabulate(s,
                       [&](std::int64_t i) {
                         return sigmoid_ref(va.data[i] * vb.at(s, i) + vc.at(s, i)) *
                                std::tanh(vd.data[i]);
                       }),
              1e-5, 1e-7);
  launches = ts::profiler::kernel_launches();
  allocated = gpu_allocations();
  y += ts::exp(d) - c;
  y.t() -= b.view({33, 1}) * 0;  // a transposed output, in place
  CHECK(ts::profiler::kernel_launches() - launches == 2);
  CHECK(gpu_allocations() - allocated == 0);
  // Aliasing: the old values are read.
  auto square = ts::arange<float, ts::cuda>(9).view({3, 3});
  square = square.t() + 0;
  check_equal(as_doubles(square), {0, 3, 6, 1, 4, 7, 2, 5, 8});
  square += square.t();
  check_equal(as_doubles(square), {0, 4, 8, 4, 8, 12, 8, 12, 16});
  // On the output's device; errors name both shapes / both devices.
  CHECK(ts::eval(a + 1).device() == gpu0);
  CHECK_THROWS_WITH(a + b.narrow(0, 0, 4),
                    Catch::Matchers::Contains("[64, 33]") && Catch::Matchers::Contains("[4]"));
  if (ts::cuda::device_count() >= 2) {
    const auto other = on_gpu<float>({33}, 34).to(1);
    CHECK_THROWS_AS(a + other, ts::device_mismatch_error);
    CHECK_THROWS_WITH(a + other,
                      Catch::Matchers::Contains("cuda:0") && Catch::Matchers::Contains("cuda:1"));
    ts::Tensor<float, ts::cuda> on1 = other * 2;  // runs on cuda:1
    CHECK(on1.device_index() == 1);
    const values vother(other);
    check_close(as_doubles(on1), tabulate({33}, [&](std::int64_t i) { return 2 * vother.data[i]; }),
                0);
  }
}

}  // namespace cuda_expr_test
