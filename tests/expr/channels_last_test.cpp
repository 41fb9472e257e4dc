// Elementwise expressions and reductions over channels_last (NHWC) tensors on the CPU: values
// against float64 references computed here from the logical (row-major) values, the result's
// layout (expr/assign.hpp's result_memory_format) against hand-written strides, and one pass
// per statement.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "expr/elementwise_reference.hpp"
#include "tessera/tessera.hpp"

namespace channels_last_test {

namespace ts = tessera;
using expr_test::check_close;
using expr_test::check_equal;
using expr_test::sample;
using expr_test::values;
using ts::memory_format;

namespace {
const ts::Shape shape{2, 3, 4, 5};
const ts::Strides nhwc{60, 1, 15, 3};
const ts::Strides nchw{60, 20, 5, 1};
}  // namespace

TEST_CASE("an expression of channels_last tensors is channels_last, in one pass",
          "[channels_last]") {
  const auto a = sample<float>(shape, 1);
  const auto b = sample<float>(shape, 2);
  const auto a_ref = values(a).data;  // logical values, read before any layout change
  const auto b_ref = values(b).data;
  const auto a_cl = a.contiguous(memory_format::channels_last);
  const auto b_cl = b.contiguous(memory_format::channels_last);
  const auto launches = ts::profiler::kernel_launches();
  ts::Tensor<float> y = ts::relu(a_cl * 2.0f - b_cl) + 1.0f;
  CHECK(ts::profiler::kernel_launches() - launches == 1);
  CHECK(y.strides() == nhwc);
  std::vector<double> expected;
  for (std::size_t i = 0; i < a_ref.size(); ++i) {
    const double v =
        static_cast<double>(static_cast<float>(a_ref[i]) * 2.0f - static_cast<float>(b_ref[i]));
    expected.push_back(std::max(v, 0.0) + 1.0);
  }
  check_close(values(y).data, expected, 1e-6);
  // Assigned to an existing tensor, the result takes that tensor's layout.
  auto z = ts::zeros<float>(shape);
  z = a_cl + b_cl;
  CHECK(z.strides() == nchw);
  std::vector<double> sums;
  for (std::size_t i = 0; i < a_ref.size(); ++i) {
    sums.push_back(
        static_cast<double>(static_cast<float>(a_ref[i]) + static_cast<float>(b_ref[i])));
  }
  check_equal(values(z).data, sums);
  CHECK(ts::eval(a_cl + b_cl).strides() == nhwc);
}

TEST_CASE("operands that broadcast do not decide the layout; mixed layouts give contiguous",
          "[channels_last]") {
  const auto x = sample<double>(shape, 3);
  const auto bias = sample<double>({1, 3, 1, 1}, 4);
  const auto x_ref = values(x).data;
  const auto bias_ref = values(bias).data;
  const auto x_cl = x.contiguous(memory_format::channels_last);
  ts::Tensor<double> y = x_cl * bias + 0.5;
  CHECK(y.strides() == nhwc);
  check_equal(values(y).data, expr_test::tabulate(shape, [&](std::int64_t i) {
                const std::int64_t c = i / 20 % 3;
                return x_ref[static_cast<std::size_t>(i)] * bias_ref[static_cast<std::size_t>(c)] +
                       0.5;
              }));
  // An NHWC and an NCHW operand of the result's shape: contiguous (values still right).
  ts::Tensor<double> mixed = x_cl - x;
  CHECK(mixed.strides() == nchw);
  check_equal(values(mixed).data, std::vector<double>(120, 0.0));
  // Not 4-d: contiguous.
  ts::Tensor<double> flat = ts::sum(x_cl, 3) * 1.0;  // [2, 3, 4]
  CHECK(flat.strides() == ts::Strides{12, 4, 1});
  // A narrowed NHWC view (not dense) still gives an NHWC result.
  const auto part = x_cl.narrow(3, 1, 3);  // [2, 3, 4, 3]
  ts::Tensor<double> doubled = part * 2.0;
  CHECK(doubled.strides() == ts::Strides{36, 1, 9, 3});
  check_equal(values(doubled).data, expr_test::tabulate({2, 3, 4, 3}, [&](std::int64_t i) {
                const std::int64_t w = i % 3 + 1, rest = i / 3;  // rest = (n, c, h)
                return 2.0 * x_ref[static_cast<std::size_t>(rest * 5 + w)];
              }));
}

TEST_CASE("in-place updates keep the target's layout", "[channels_last]") {
  const auto x = sample<float>(shape, 5);
  const auto x_ref = values(x).data;
  auto y = x.contiguous(memory_format::channels_last);
  const auto storage = y.storage().data();
  y += x;  // an NCHW operand into an NHWC target
  y *= 0.5f;
  CHECK(y.strides() == nhwc);
  CHECK(y.storage().data() == storage);
  std::vector<double> expected;
  for (double v : x_ref)
    expected.push_back(static_cast<double>((static_cast<float>(v) * 2.0f) * 0.5f));
  check_equal(values(y).data, expected);
}

TEST_CASE("reductions over channels_last tensors equal the float64 reference", "[channels_last]") {
  const auto x = sample<float>(shape, 6);
  const auto ref = values(x).data;
  const auto x_cl = x.contiguous(memory_format::channels_last);
  auto at = [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
    return ref[static_cast<std::size_t>(((n * 3 + c) * 4 + h) * 5 + w)];
  };
  double total = 0, magnitude = 0;
  for (double v : ref) total += v, magnitude += std::fabs(v);
  CHECK(std::fabs(static_cast<double>(ts::sum(x_cl).item()) - total) <= 1e-6 * magnitude);
  for (int dim = 0; dim < 4; ++dim) {
    const auto s = ts::sum(x_cl, dim);
    const auto m = ts::max(x_cl, dim, /*keepdim=*/true);
    std::vector<double> sum_ref, max_ref;
    for (std::int64_t n = 0; n < (dim == 0 ? 1 : 2); ++n)
      for (std::int64_t c = 0; c < (dim == 1 ? 1 : 3); ++c)
        for (std::int64_t h = 0; h < (dim == 2 ? 1 : 4); ++h)
          for (std::int64_t w = 0; w < (dim == 3 ? 1 : 5); ++w) {
            double acc = 0, best = -INFINITY;
            for (std::int64_t k = 0; k < shape[dim]; ++k) {
              const double v =
                  at(dim == 0 ? k : n, dim == 1 ? k : c, dim == 2 ? k : h, dim == 3 ? k : w);
              acc += v;
              best = std::max(best, v);
            }
            sum_ref.push_back(acc);
            max_ref.push_back(best);
          }
    check_close(values(s).data, sum_ref, 1e-6, 1e-5);
    check_equal(values(m).data, max_ref);
  }
  // Over the channels of each pixel (softmax along C, batch norm's statistics).
  const auto sm = ts::softmax(x_cl, 1);
  std::vector<double> sm_ref(120);
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t w = 0; w < 5; ++w) {
        double z = 0;
        for (std::int64_t c = 0; c < 3; ++c) z += std::exp(at(n, c, h, w));
        for (std::int64_t c = 0; c < 3; ++c)
          sm_ref[static_cast<std::size_t>(((n * 3 + c) * 4 + h) * 5 + w)] =
              std::exp(at(n, c, h, w)) / z;
      }
  check_close(values(sm).data, sm_ref, 1e-5, 1e-7);
}

}  // namespace channels_last_test
