// channels_last (NHWC) tensors on a CUDA device, against the same computation on NCHW tensors on
// the CPU in float64 (tests/nn/channels_last_test.cpp checks the CPU's NHWC layers against those,
// tests/nn against PyTorch): fused expressions over NHWC operands give NHWC results in one launch
// (every assignment is one launch, whichever kernel; that NHWC operands merge into one dense run,
// which the executor gives the vector path, is checked on the CPU: strided_loop_test's
// in_memory_order cases); BatchNorm2d (training, evaluation, the fused ReLU) and the pools keep
// NHWC; a convolution whose input and weight are NHWC is handed to cuDNN as NHWC (no layout copy:
// no kernel of Tessera's runs around it), forward and backward.
// A whole ResNet-18 step in channels_last: conv_test.cu; batch norm's kernels: batch_norm_test.cu.
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

#include "channels_last_support.hpp"
#include "tessera/tessera.hpp"

namespace cuda_channels_last_test {  // one namespace per file: a unity build

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;
namespace F = tessera::nn::functional;
using tessera_test::check_close;
using tessera_test::nhwc_strides;
using ts::memory_format;

constexpr double tol64 = 1e-10;
constexpr double tol32 = 2e-5;

/// a, b NHWC on cuda:0 in T: relu(a * 2 + b) - m into a new tensor (NHWC, one launch: the
/// statement is not split into passes over a layout copy), into an
/// NCHW one, and over narrowed NHWC operands (not dense: the rows kernel).
template <class T>
void check_nhwc_expression(const ts::Tensor<double>& a, const ts::Tensor<double>& b,
                           const ts::Tensor<double>& m, double tol) {
  const ts::Tensor<double> expected = ts::relu(a * 2.0 + b) - m;
  const auto ag_ = a.to<T>().contiguous(memory_format::channels_last).template to<ts::cuda>(0);
  const auto bg = b.to<T>().contiguous(memory_format::channels_last).template to<ts::cuda>(0);
  const auto mg = m.to<T>().template to<ts::cuda>(0);
  REQUIRE(ag_.is_contiguous(memory_format::channels_last));
  ts::cuda::synchronize(0);
  const auto launches = ts::profiler::kernel_launches();
  const ts::Tensor<T, ts::cuda> y = ts::relu(ag_ * T(2.0f) + bg) - mg;
  CHECK(ts::profiler::kernel_launches() - launches == 1);
  CHECK(y.strides() == nhwc_strides(y.shape()));
  check_close(y, expected, tol);
  ts::Tensor<T, ts::cuda> z = ts::empty<T, ts::cuda>(a.shape(), 0);
  z = ts::relu(ag_ * T(2.0f) + bg) - mg;
  CHECK(z.is_contiguous());
  check_close(z, expected, tol);
  const ts::Tensor<T, ts::cuda> part = ag_.narrow(3, 1, 4) + bg.narrow(3, 2, 4);
  check_close(part, a.narrow(3, 1, 4) + b.narrow(3, 2, 4), tol);
}

TEST_CASE("cuda: expressions over NHWC tensors give NHWC results in one launch",
          "[cuda][channels_last][expr]") {
  ts::manual_seed(3);
  const auto a = ts::randn<double>({2, 8, 5, 6});
  const auto b = ts::randn<double>({2, 8, 5, 6});
  const auto m = ts::randn<double>({1, 8, 1, 1});
  SECTION("float") { check_nhwc_expression<float>(a, b, m, tol32); }
  // half: 16-byte vectors of 8 elements; results rounded to half (2^-11 relative).
  SECTION("half") { check_nhwc_expression<ts::half>(a, b, m, 8e-3); }
}

TEST_CASE("cuda: BatchNorm2d on NHWC input: train, eval and the fused ReLU",
          "[cuda][channels_last][batchnorm]") {
  nn::BatchNorm2d<double> reference(6, {.momentum = 0.3});
  nn::BatchNorm2d<double, ts::cuda> bn(6, {.momentum = 0.3}, 0);
  ts::manual_seed(5);
  const auto w = ts::randn<double>({6});
  const auto b = ts::randn<double>({6});
  reference.weight().value().copy_(w);
  reference.bias().value().copy_(b);
  bn.weight().value().copy_(w);
  bn.bias().value().copy_(b);
  for (int step = 0; step < 2; ++step) {
    INFO("training step " << step);
    const ts::Tensor<double> x = ts::randn<double>({3, 6, 7, 5}) * (step + 1.0);
    const auto xg = x.contiguous(memory_format::channels_last).to<ts::cuda>(0);
    const ts::Tensor<double> expected = reference(x);
    const ts::Tensor<double, ts::cuda> y = bn(xg);
    CHECK(y.strides() == nhwc_strides(x.shape()));
    check_close(y, expected, tol64);
    check_close(bn.running_mean().value(), reference.running_mean().value(), tol64);
    check_close(bn.running_var().value(), reference.running_var().value(), tol64);
    const ts::Tensor<double> relu_expected = reference.forward_relu(x);
    const ts::Tensor<double, ts::cuda> relu_y = bn.forward_relu(xg);
    CHECK(relu_y.strides() == nhwc_strides(x.shape()));
    check_close(relu_y, relu_expected, tol64);
  }
  reference.eval();
  bn.eval();
  const auto x = ts::randn<double>({2, 6, 3, 4});
  const ts::Tensor<double, ts::cuda> y = bn(x.contiguous(memory_format::channels_last).cuda(0));
  CHECK(y.strides() == nhwc_strides(x.shape()));
  check_close(y, reference(x), tol64);
}

TEST_CASE("cuda: pooling on NHWC input gives NHWC output", "[cuda][channels_last][pool]") {
  ts::manual_seed(7);
  const auto x = ts::randn<double>({2, 5, 9, 8});
  const auto xg = x.contiguous(memory_format::channels_last).to<ts::cuda>(0);
  auto check_layer = [&](const auto& layer, const char* name) {
    INFO(name);
    const ts::Tensor<double> expected = layer(x);
    const ts::Tensor<double, ts::cuda> y = layer(xg);
    CHECK(y.strides() == nhwc_strides(expected.shape()));
    check_close(y, expected, tol64);
  };
  check_layer(nn::MaxPool2d(3, {.stride = 2, .padding = 1}), "max 3x3/2 pad 1");
  check_layer(nn::AvgPool2d(3, {.stride = 2, .padding = 1, .ceil_mode = true}), "avg ceil");
  check_layer(nn::AdaptiveAvgPool2d({3, 2}), "adaptive 3x2");
  check_layer(nn::AdaptiveAvgPool2d(1), "global");
}

TEST_CASE("cuda: Conv2d on NHWC input and weight: cuDNN on NHWC in float, gradients in double",
          "[cuda][channels_last][conv]") {
  struct conv_case {
    const char* name;
    std::int64_t in, out;
    nn::Int2 kernel;
    nn::Conv2dOptions options;
  };
  const conv_case cases[] = {
      {"3x3", 8, 16, 3, {.padding = 1, .bias = false}},
      {"3x3 stride 2, bias", 8, 8, 3, {.stride = 2, .padding = 1}},
      {"1x1", 16, 8, 1, {.bias = false}},
      {"7x7 stem", 3, 8, 7, {.stride = 2, .padding = 3, .bias = false}},
      {"grouped", 8, 8, 3, {.padding = 1, .groups = 2, .bias = false}},
  };
  for (const conv_case& c : cases) {
    INFO(c.name);
    ts::manual_seed(9);
    nn::Conv2d<double> conv(c.in, c.out, c.kernel, c.options);
    const auto x = ts::randn<double>({2, c.in, 12, 10});
    const ts::Tensor<double> expected = conv(x);
    auto gpu = nn::to<ts::cuda>(conv, 0);
    gpu.to(memory_format::channels_last);
    const auto xg = x.contiguous(memory_format::channels_last).to<ts::cuda>(0);
    // double: GEMMs on NCHW copies (cuDNN is not given NHWC double problems, as in PyTorch).
    const ts::Tensor<double, ts::cuda> y = gpu(xg);
    CHECK(y.strides() == nhwc_strides(expected.shape()));
    check_close(y, expected, tol64);
    // float: cuDNN reads and writes NHWC itself, no layout copy (the bias is one addition), with
    // fp32 products (TF32 off by default), to float's precision.
    auto gpu32 = nn::to<float>(gpu);
    gpu32.to(memory_format::channels_last);
    const auto xg32 = xg.to<float>();
    ts::cuda::synchronize(0);
    const auto launches = ts::profiler::kernel_launches();
    const ts::Tensor<float, ts::cuda> y32 = gpu32(xg32);
    if (ts::backends::cudnn::is_available()) {
      CHECK(ts::profiler::kernel_launches() - launches == (c.options.bias ? 1 : 0));
    }
    CHECK(y32.strides() == nhwc_strides(expected.shape()));
    check_close(y32, expected, tol32);

    // Gradients through a program traced on an NHWC input (the spec says so): the CPU NCHW
    // program's; double on the GEMM path's copies, float through cuDNN's NHWC gradients.
    const auto g = ts::randn<double>(expected.shape());
    auto gradients = [&](auto& layer, const auto& input, const auto& seed, memory_format format) {
      using T = typename std::remove_cvref_t<decltype(input)>::value_type;
      using K = typename std::remove_cvref_t<decltype(input)>::device_kind;
      auto spec = ag::input<T, K>(input.shape(), 0, format);
      spec.requires_grad = true;
      auto program =
          ag::compile([&](const auto& v, const auto& s) { return ts::sum(layer(v) * s); }, spec,
                      ag::input<T, K>(seed.shape(), 0, format));
      layer.zero_grad();
      program.forward(input, seed);
      program.backward();
      std::vector<ts::Tensor<double>> out{
          program.input_grad(0).template as<T, K>().template to<ts::cpu>().template to<double>()};
      for (const auto& [name, p] : layer.named_parameters()) {
        out.push_back(p.grad().template as<T, K>().template to<ts::cpu>().template to<double>());
      }
      return out;
    };
    const auto want = gradients(conv, x, g, memory_format::contiguous_format);
    const auto g_nhwc = g.contiguous(memory_format::channels_last).to<ts::cuda>(0);
    const auto got = gradients(gpu, xg, g_nhwc, memory_format::channels_last);
    const auto got32 = gradients(gpu32, xg32, g_nhwc.to<float>(), memory_format::channels_last);
    REQUIRE(got.size() == want.size());
    REQUIRE(got32.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      INFO("gradient " << i);
      check_close(got[i], want[i], tol64);
      // Sums of up to 2 * 12 * 10 float products: a few float ulps of the largest terms.
      check_close(got32[i], want[i], 1e-4);
    }
  }
}

}  // namespace cuda_channels_last_test
