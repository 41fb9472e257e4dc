// Convolution, pooling, BatchNorm2d and a ResNet on a CUDA device (compiled by nvcc: the
// device-agnostic im2col/col2im, the pooling passes and the batch-norm reductions run as CUDA
// kernels, the GEMMs on cuBLAS), against the same computation on the CPU, which tests/nn and
// tests/models check against PyTorch and torchvision. float64, so the two agree to rounding.
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/models/resnet.hpp"
#include "tessera/tessera.hpp"

namespace cuda_conv_test {  // one namespace per file: a unity build

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;
namespace F = tessera::nn::functional;

template <class KA, class KB>
void check_close(const ts::Tensor<double, KA>& actual, const ts::Tensor<double, KB>& expected,
                 double tol = 1e-10) {
  REQUIRE(actual.shape() == expected.shape());
  const auto a = actual.to_vector();
  const auto e = expected.to_vector();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(a[i] - e[i]) <= tol * (1 + std::abs(e[i])))) ++bad;
  }
  INFO(bad << " of " << a.size() << " elements differ");
  CHECK(bad == 0);
}

struct conv_case {
  std::int64_t n, c, h, w, o;
  nn::Int2 kernel;
  nn::Conv2dOptions options;
};

TEST_CASE("conv2d on CUDA matches the CPU: forward and every gradient", "[cuda][conv]") {
  const conv_case cases[] = {
      {2, 3, 9, 8, 4, 3, {.padding = 1}},
      {2, 4, 9, 9, 6, 3, {.stride = 2, .padding = 1, .groups = 2, .bias = false}},
      {3, 6, 5, 4, 4, 1, {}},
      {2, 3, 15, 13, 5, 7, {.stride = 2, .padding = 3, .dilation = 1}},
      {2, 3, 9, 8, 4, {2, 3}, {.stride = {2, 1}, .padding = {0, 1}, .dilation = {1, 2}}},
  };
  for (const auto& c : cases) {
    INFO("input [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "], kernel "
                   << c.kernel.str());
    ts::manual_seed(11);
    nn::Conv2d<double> cpu_conv(c.c, c.o, c.kernel, c.options);
    auto gpu_conv = nn::to<ts::cuda>(cpu_conv, 0);
    const auto x = ts::randn<double>({c.n, c.c, c.h, c.w});
    const ts::Tensor<double> y_cpu = cpu_conv(x);
    const auto g = ts::randn<double>(y_cpu.shape());
    check_close(gpu_conv(x.to<ts::cuda>(0)), y_cpu);
    auto run = [&](auto& conv, const auto& input, const auto& grad) {
      using K = typename std::remove_cvref_t<decltype(input)>::device_kind;
      auto spec = ag::input<double, K>(input.shape(), 0);
      spec.requires_grad = true;
      auto program = ag::compile(
          [&](const auto& v, const auto& gv) { return ts::sum(conv(v) * gv); }, spec,
          ag::input<double, K>(grad.shape(), 0));
      conv.zero_grad();
      program.forward(input, grad);
      program.backward();
      return std::pair{program.input_grad(0).template as<double, K>().clone(),
                       conv.weight().grad().clone()};
    };
    const auto [dx_cpu, dw_cpu] = run(cpu_conv, x, g);
    const auto [dx_gpu, dw_gpu] = run(gpu_conv, x.to<ts::cuda>(0), g.to<ts::cuda>(0));
    check_close(dx_gpu, dx_cpu);
    check_close(dw_gpu, dw_cpu);
  }
}

TEST_CASE("pooling on CUDA matches the CPU", "[cuda][pool]") {
  ts::manual_seed(12);
  const auto x = ts::randn<double>({2, 3, 9, 8});
  const auto xg = x.to<ts::cuda>(0);
  check_close(F::max_pool2d(xg, 3, {.stride = 2, .padding = 1}),
              F::max_pool2d(x, 3, {.stride = 2, .padding = 1}));
  check_close(F::avg_pool2d(xg, 3, {.stride = 2, .padding = 1, .ceil_mode = true}),
              F::avg_pool2d(x, 3, {.stride = 2, .padding = 1, .ceil_mode = true}));
  check_close(F::adaptive_avg_pool2d(xg, {3, 2}), F::adaptive_avg_pool2d(x, {3, 2}));
  check_close(F::adaptive_avg_pool2d(xg, 1), F::adaptive_avg_pool2d(x, 1));
  auto grad = [](const auto& input) {
    using K = typename std::remove_cvref_t<decltype(input)>::device_kind;
    auto spec = ag::input<double, K>(input.shape(), 0);
    spec.requires_grad = true;
    auto program = ag::compile(
        [&](const auto& v) {
          return ts::sum(F::max_pool2d(v, 3, {.stride = 2, .padding = 1}) * 2.0) +
                 ts::sum(F::avg_pool2d(v, 2) * 3.0);
        },
        spec);
    program.forward(input);
    program.backward();
    return program.input_grad(0).template as<double, K>().clone();
  };
  check_close(grad(xg), grad(x));
}

TEST_CASE("a ResNet-18 training step on CUDA matches the CPU", "[cuda][resnet]") {
  ts::manual_seed(13);
  auto cpu_model = ts::models::resnet18<double>(4);
  auto gpu_model = nn::to<ts::cuda>(cpu_model, 0);
  const auto x = ts::randn<double>({2, 3, 32, 32});
  const auto labels = ts::from_vector<std::int64_t>({1, 3}, {2});
  auto step = [&](auto& model, const auto& input, const auto& y) {
    using K = typename std::remove_cvref_t<decltype(input)>::device_kind;
    auto program = ag::compile(
        [&](const auto& v, const auto& t) { return ts::nn::cross_entropy(model(v), t); },
        ag::input<double, K>(input.shape(), 0), ag::input<std::int64_t, K>(y.shape(), 0));
    model.zero_grad();
    const double loss = program.forward(input, y).item();
    program.backward();
    return loss;
  };
  const double loss_cpu = step(cpu_model, x, labels);
  const double loss_gpu = step(gpu_model, x.to<ts::cuda>(0), labels.to<ts::cuda>(0));
  CHECK(loss_gpu == Approx(loss_cpu).epsilon(1e-10));
  check_close(gpu_model.conv1().weight().grad(), cpu_model.conv1().weight().grad());
  check_close(gpu_model.fc().weight().grad(), cpu_model.fc().weight().grad());
  check_close(gpu_model.bn1().running_mean().value(), cpu_model.bn1().running_mean().value());
  gpu_model.eval();
  cpu_model.eval();
  check_close(gpu_model(x.to<ts::cuda>(0)), cpu_model(x));
}

}  // namespace cuda_conv_test
