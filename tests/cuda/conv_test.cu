// Convolution, pooling, BatchNorm2d and a ResNet on a CUDA device (compiled by nvcc: cuDNN's
// convolutions where the build has it, and the device-agnostic im2col/col2im with GEMMs on
// cuBLAS with cuDNN switched off; the pooling passes and the batch-norm reductions as CUDA
// kernels), against the same computation on the CPU, which tests/nn and tests/models check
// against PyTorch and torchvision. float64, so the two agree to rounding; float checks that
// cuDNN keeps fp32 products unless TF32 is allowed, that each call's choice (heuristics or
// benchmark mode's timing) is made once per key, and that its kept execution plan is what runs. The whole executable reports itself skipped
// without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
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

/// Sets backends::cudnn::enabled for a scope (read when a convolution is traced or called).
class cudnn_enabled {
 public:
  explicit cudnn_enabled(bool on) : previous_(ts::backends::cudnn::enabled.load()) {
    ts::backends::cudnn::enabled = on;
  }
  ~cudnn_enabled() { ts::backends::cudnn::enabled = previous_; }
  cudnn_enabled(const cudnn_enabled&) = delete;
  cudnn_enabled& operator=(const cudnn_enabled&) = delete;

 private:
  bool previous_;
};

/// Sets one of the backends switches for a scope and puts the previous value back.
template <class T>
class switch_scope {
 public:
  switch_scope(std::atomic<T>& setting, T value) : setting_(setting), previous_(setting.load()) {
    setting_ = value;
  }
  ~switch_scope() { setting_ = previous_; }
  switch_scope(const switch_scope&) = delete;
  switch_scope& operator=(const switch_scope&) = delete;

 private:
  std::atomic<T>& setting_;
  T previous_;
};

/// The problem of conv2d(x, conv.weight) with conv's options, as cuDNN is asked it.
template <class T, class K>
ts::backend::cuda::conv2d_problem problem_of(const nn::Conv2d<T, K>& conv, const ts::Shape& x) {
  const ts::Shape w = conv.weight().value().shape();
  const nn::Conv2dOptions& o = conv.options();
  const nn::Conv2dArgs args{o.stride, o.padding, o.dilation, o.groups};
  const auto g = nn::detail::conv2d_geometry_of("test", x, w, nullptr, args);
  return g.problem();
}

TEST_CASE("conv2d on CUDA matches the CPU: forward and every gradient", "[cuda][conv]") {
  const conv_case cases[] = {
      {2, 3, 9, 8, 4, 3, {.padding = 1}},
      {2, 4, 9, 9, 6, 3, {.stride = 2, .padding = 1, .groups = 2, .bias = false}},
      {3, 6, 5, 4, 4, 1, {}},
      {2, 3, 15, 13, 5, 7, {.stride = 2, .padding = 3, .dilation = 1}},
      {2, 3, 9, 8, 4, {2, 3}, {.stride = {2, 1}, .padding = {0, 1}, .dilation = {1, 2}}},
      {2, 8, 10, 7, 8, 3, {.padding = 1, .groups = 8}},  // depthwise
  };
  // cuDNN (where the build has it), then im2col + cuBLAS.
  for (const bool use_cudnn : {true, false}) {
    const cudnn_enabled scope(use_cudnn);
    for (const auto& c : cases) {
      INFO((use_cudnn ? "cuDNN" : "im2col + cuBLAS")
           << ": input [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "], kernel "
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
        auto program =
            ag::compile([&](const auto& v, const auto& gv) { return ts::sum(conv(v) * gv); }, spec,
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
      if (c.options.bias) check_close(gpu_conv.bias().grad(), cpu_conv.bias().grad());
      // What ran: cuDNN's algorithms when it is on and built in (double is among its dtypes).
      const auto chosen =
          ts::backend::cuda::conv2d_choose<double>(0, problem_of(cpu_conv, x.shape()));
      CHECK(chosen.usable == (use_cudnn && ts::backends::cudnn::is_available()));
    }
  }
}

TEST_CASE("conv2d on CUDA: a layer used twice accumulates its gradients", "[cuda][conv]") {
  for (const bool use_cudnn : {true, false}) {
    INFO((use_cudnn ? "cuDNN" : "im2col + cuBLAS"));
    const cudnn_enabled scope(use_cudnn);
    ts::manual_seed(14);
    nn::Conv2d<double> cpu_conv(4, 4, 3, {.stride = 1, .padding = 1});
    auto gpu_conv = nn::to<ts::cuda>(cpu_conv, 0);
    const auto x = ts::randn<double>({2, 4, 7, 6});
    const auto g1 = ts::randn<double>({2, 4, 7, 6});
    const auto g2 = ts::randn<double>({2, 4, 7, 6});
    // x feeds the layer twice, and the first output feeds it again: dx, dW and db each receive
    // several contributions (cuDNN's beta = 1).
    auto run = [&](auto& conv, const auto& input, const auto& a, const auto& b) {
      using K = typename std::remove_cvref_t<decltype(input)>::device_kind;
      auto spec = ag::input<double, K>(input.shape(), 0);
      spec.requires_grad = true;
      auto program = ag::compile(
          [&](const auto& v, const auto& av, const auto& bv) {
            const auto y = conv(v);
            return ts::sum(y * av) + ts::sum(conv(v) * bv) + ts::sum(conv(y) * av);
          },
          spec, ag::input<double, K>(a.shape(), 0), ag::input<double, K>(b.shape(), 0));
      conv.zero_grad();
      program.forward(input, a, b);
      program.backward();
      return std::tuple{program.input_grad(0).template as<double, K>().clone(),
                        conv.weight().grad().clone(), conv.bias().grad().clone()};
    };
    const auto [dx_cpu, dw_cpu, db_cpu] = run(cpu_conv, x, g1, g2);
    const auto [dx_gpu, dw_gpu, db_gpu] =
        run(gpu_conv, x.to<ts::cuda>(0), g1.to<ts::cuda>(0), g2.to<ts::cuda>(0));
    check_close(dx_gpu, dx_cpu);
    check_close(dw_gpu, dw_cpu);
    check_close(db_gpu, db_cpu);
  }
}

TEST_CASE("conv2d on CUDA in float keeps fp32 products (no TF32 unless allowed)", "[cuda][conv]") {
  // 3x3 over 64 channels: 576 products per output. fp32 products summed in float stay within
  // about 1e-6 of the float64 result; TF32's 10-bit mantissas give about 1e-3.
  // backends::cudnn::allow_tf32 is on by default (PyTorch's), so each part sets it.
  ts::manual_seed(15);
  nn::Conv2d<double> reference(64, 32, 3, {.padding = 1});
  const auto x = ts::randn<double>({4, 64, 14, 14});
  const ts::Tensor<double> expected = reference(x);
  auto conv = nn::to<ts::cuda>(nn::to<float>(reference), 0);
  const auto want = expected.to_vector();
  for (const bool tf32 : {false, true}) {
    const switch_scope<bool> scope(ts::backends::cudnn::allow_tf32, tf32);
    const ts::Tensor<float, ts::cuda> y = conv(x.to<float>().to<ts::cuda>(0));
    const auto got = y.to<double>().to<ts::cpu>().to_vector();
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    INFO((tf32 ? "TF32 allowed" : "fp32 products")
         << ": largest error " << worst << " for outputs up to " << scale);
    // With TF32 cuDNN may still pick an FMA algorithm: only the bound changes.
    CHECK(worst <= (tf32 ? 4e-3 : 2e-5) * scale);
  }
}

TEST_CASE("conv2d on CUDA with cuDNN: deterministic algorithms and no workspace", "[cuda][conv]") {
  const switch_scope<bool> fp32(ts::backends::cudnn::allow_tf32, false);  // compared at 1e-4
  ts::manual_seed(16);
  nn::Conv2d<float> cpu_conv(16, 32, 3, {.stride = 2, .padding = 1});
  auto gpu_conv = nn::to<ts::cuda>(cpu_conv, 0);
  const auto x = ts::randn<float>({8, 16, 28, 28});
  const auto g = ts::randn<float>({8, 32, 14, 14});
  auto weight_grad = [&]() {
    auto program = ag::compile(
        [&](const auto& v, const auto& gv) { return ts::sum(gpu_conv(v) * gv); },
        ag::input<float, ts::cuda>(x.shape(), 0), ag::input<float, ts::cuda>(g.shape(), 0));
    gpu_conv.zero_grad();
    program.forward(x.to<ts::cuda>(0), g.to<ts::cuda>(0));
    program.backward();
    return gpu_conv.weight().grad().to<ts::cpu>().to_vector();
  };
  {
    // Two programs with deterministic algorithms give the same bits.
    ts::backends::cudnn::deterministic = true;
    const auto first = weight_grad();
    const auto second = weight_grad();
    ts::backends::cudnn::deterministic = false;
    CHECK(first == second);
  }
  // No workspace at all: cuDNN's algorithms that need none, or im2col + cuBLAS; the same values.
  const std::size_t limit = ts::backends::cudnn::workspace_limit.load();
  ts::backends::cudnn::workspace_limit = 0;
  const auto chosen = ts::backend::cuda::conv2d_choose<float>(0, problem_of(cpu_conv, x.shape()));
  const auto none = weight_grad();
  ts::backends::cudnn::workspace_limit = limit;
  CHECK(chosen.forward_bytes == 0);
  CHECK(chosen.backward_data_bytes == 0);
  CHECK(chosen.backward_filter_bytes == 0);
  auto cpu_program =
      ag::compile([&](const auto& v, const auto& gv) { return ts::sum(cpu_conv(v) * gv); },
                  ag::input<float>(x.shape()), ag::input<float>(g.shape()));
  cpu_conv.zero_grad();
  cpu_program.forward(x, g);
  cpu_program.backward();
  const auto expected = cpu_conv.weight().grad().to_vector();
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, double(std::abs(none[i] - expected[i])));
    scale = std::max(scale, double(std::abs(expected[i])));
  }
  INFO("largest error " << worst << " for gradients up to " << scale);
  CHECK(worst <= 1e-4 * scale);
}

#if TESSERA_CUDNN
TEST_CASE("conv2d on CUDA with cuDNN: each call's choice is made once and kept", "[cuda][conv]") {
  using ts::backend::cuda::conv2d_choose;
  const ts::backend::cuda::conv2d_problem p{2, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 12, 12};
  const auto first = conv2d_choose<float>(0, p);
  REQUIRE(first.usable);
  // The same key: the same process-wide entries, whose descriptors a call reuses.
  const auto again = conv2d_choose<float>(0, p);
  CHECK(again.forward_call == first.forward_call);
  CHECK(again.backward_data_call == first.backward_data_call);
  CHECK(again.backward_filter_call == first.backward_filter_call);
  // An eager forward chooses only the forward, and finds the same entry.
  const auto eager = conv2d_choose<float>(0, p, false);
  CHECK(eager.forward_call == first.forward_call);
  CHECK(eager.backward_data_call == nullptr);
  // Another switch setting is another key; double ignores allow_tf32.
  {
    const switch_scope<bool> tf32(ts::backends::cudnn::allow_tf32,
                                  !ts::backends::cudnn::allow_tf32.load());
    CHECK(conv2d_choose<float>(0, p).forward_call != first.forward_call);
    const auto d1 = conv2d_choose<double>(0, p);
    const switch_scope<bool> back(ts::backends::cudnn::allow_tf32,
                                  !ts::backends::cudnn::allow_tf32.load());
    CHECK(conv2d_choose<double>(0, p).forward_call == d1.forward_call);
  }
  {
    const switch_scope<bool> timed(ts::backends::cudnn::benchmark, true);
    const auto b = conv2d_choose<float>(0, p);
    CHECK(b.usable);
    CHECK(b.forward_call != first.forward_call);
    CHECK(conv2d_choose<float>(0, p).forward_call == b.forward_call);
  }
}
#endif

#if TESSERA_CUDNN
TEST_CASE("conv2d on CUDA with cuDNN runs kept execution plans; the legacy calls what they cannot",
          "[cuda][conv]") {
  // Every call of a traced convolution runs the execution plan made when its entry was built
  // (backend/cuda/cudnn_plan.hpp); backends::cudnn::legacy_api and buffers that are not 16-byte
  // aligned run cuDNN's legacy calls. Each way, the values are the CPU's in float64.
  using ts::backend::cuda::conv2d_cudnn_calls;
  const switch_scope<bool> fp32(ts::backends::cudnn::allow_tf32, false);
  ts::manual_seed(19);
  nn::Conv2d<double> reference(8, 16, 3, {.padding = 1});
  auto gpu_conv = nn::to<ts::cuda>(nn::to<float>(reference), 0);
  const auto x = ts::randn<double>({4, 8, 10, 10});
  const auto g = ts::randn<double>({4, 16, 10, 10});
  const auto chosen =
      ts::backend::cuda::conv2d_choose<float>(0, problem_of(gpu_conv, x.shape()));
  REQUIRE(chosen.usable);
  CHECK(chosen.forward_engine >= 0);
  CHECK(chosen.backward_data_engine >= 0);
  CHECK(chosen.backward_filter_engine >= 0);

  // The reference: the same step on the CPU in float64.
  auto spec_cpu = ag::input<double>(x.shape());
  spec_cpu.requires_grad = true;
  auto cpu_program = ag::compile(
      [&](const auto& v, const auto& gv) { return ts::sum(reference(v) * gv); }, spec_cpu,
      ag::input<double>(g.shape()));
  reference.zero_grad();
  cpu_program.forward(x, g);
  cpu_program.backward();
  const auto dx_want = cpu_program.input_grad(0).as<double, ts::cpu>().to_vector();
  const auto dw_want = reference.weight().grad().to_vector();
  auto close = [](const std::vector<double>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    INFO("largest error " << worst << " for values up to " << scale);
    CHECK(worst <= 2e-5 * scale);
  };
  auto steps = [&](int count) {
    auto spec = ag::input<float, ts::cuda>(x.shape(), 0);
    spec.requires_grad = true;
    auto program = ag::compile(
        [&](const auto& v, const auto& gv) { return ts::sum(gpu_conv(v) * gv); }, spec,
        ag::input<float, ts::cuda>(g.shape(), 0));
    const auto xg = x.to<float>().to<ts::cuda>(0);
    const auto gg = g.to<float>().to<ts::cuda>(0);
    for (int i = 0; i < count; ++i) {
      gpu_conv.zero_grad();
      program.forward(xg, gg);
      program.backward();
    }
    close(program.input_grad(0).as<float, ts::cuda>().to<double>().to<ts::cpu>().to_vector(),
          dx_want);
    close(gpu_conv.weight().grad().to<double>().to<ts::cpu>().to_vector(), dw_want);
  };
  {
    const auto before = conv2d_cudnn_calls();
    steps(2);
    const auto after = conv2d_cudnn_calls();
    CHECK(after.plan - before.plan == 6);  // forward, input and weight gradients, twice
    CHECK(after.legacy == before.legacy);
  }
  {
    const switch_scope<bool> legacy(ts::backends::cudnn::legacy_api, true);
    const auto before = conv2d_cudnn_calls();
    steps(1);
    const auto after = conv2d_cudnn_calls();
    CHECK(after.legacy - before.legacy == 3);
    CHECK(after.plan == before.plan);
  }
  {
    // Benchmark mode times the plans of each call (up to 12 engines) and keeps the fastest: a
    // new key, a plan again, and the values the CPU's.
    const switch_scope<bool> timed(ts::backends::cudnn::benchmark, true);
    const auto timed_choice =
        ts::backend::cuda::conv2d_choose<float>(0, problem_of(gpu_conv, x.shape()));
    REQUIRE(timed_choice.usable);
    CHECK(timed_choice.forward_call != chosen.forward_call);
    CHECK(timed_choice.forward_engine >= 0);
    CHECK(timed_choice.backward_data_engine >= 0);
    CHECK(timed_choice.backward_filter_engine >= 0);
    const auto before = conv2d_cudnn_calls();
    steps(1);
    const auto after = conv2d_cudnn_calls();
    CHECK(after.plan - before.plan == 3);
    CHECK(after.legacy == before.legacy);
  }
  {
    // An input that starts 300 bytes into its buffer (the second of five images of 75 floats).
    const auto images = ts::randn<double>({5, 3, 5, 5});
    const auto w = ts::randn<double>({4, 3, 3, 3});
    const ts::Tensor<double> want = F::conv2d(images.narrow(0, 1, 2), w, {.padding = 1});
    const auto on_gpu = images.to<float>().to<ts::cuda>(0);
    const auto view = on_gpu.narrow(0, 1, 2);
    REQUIRE(reinterpret_cast<std::uintptr_t>(view.data()) % 16 != 0);
    const auto before = conv2d_cudnn_calls();
    const ts::Tensor<float, ts::cuda> y =
        F::conv2d(view, w.to<float>().to<ts::cuda>(0), {.padding = 1});
    const auto after = conv2d_cudnn_calls();
    CHECK(after.legacy - before.legacy == 1);
    close(y.to<double>().to<ts::cpu>().to_vector(), want.to_vector());
  }
}
#endif

TEST_CASE("conv2d on CUDA with cuDNN benchmark mode matches the CPU", "[cuda][conv]") {
  // backends::cudnn::benchmark: every candidate of each call is timed once (cudnnFind*Ex on
  // scratch buffers from the pool) and the fastest kept; the values are the CPU's.
  const switch_scope<bool> timed(ts::backends::cudnn::benchmark, true);
  const conv_case cases[] = {
      {2, 3, 9, 8, 4, 3, {.padding = 1}},
      {2, 4, 9, 9, 6, 3, {.stride = 2, .padding = 1, .groups = 2, .bias = false}},
      {2, 8, 10, 7, 8, 3, {.padding = 1, .groups = 8}},
  };
  for (const auto& c : cases) {
    INFO("input [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "], kernel "
                   << c.kernel.str());
    ts::manual_seed(18);
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
      auto program =
          ag::compile([&](const auto& v, const auto& gv) { return ts::sum(conv(v) * gv); }, spec,
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

TEST_CASE("conv2d on CUDA in half through cuDNN", "[cuda][conv]") {
  // Half inputs, float sums: against float64 on the same (half-rounded) values.
  ts::manual_seed(17);
  const auto x = ts::randn<double>({2, 8, 9, 9}).to<ts::half>().to<double>();
  const auto w = ts::eval(ts::randn<double>({16, 8, 3, 3}) * 0.2).to<ts::half>().to<double>();
  const ts::Tensor<double> expected = F::conv2d(x, w, {.padding = 1});
  const ts::Tensor<ts::half, ts::cuda> y =
      F::conv2d(x.to<ts::half>().to<ts::cuda>(0), w.to<ts::half>().to<ts::cuda>(0), {.padding = 1});
  const auto got = y.to<double>().to<ts::cpu>().to_vector();
  const auto want = expected.to_vector();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    // One rounding to half of the float sum: 2^-11 relative, plus the float sum's error.
    if (!(std::abs(got[i] - want[i]) <= 1e-3 * (1 + std::abs(want[i])))) ++bad;
  }
  INFO(bad << " of " << want.size() << " outputs differ");
  CHECK(bad == 0);
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
  // NCHW, and channels_last: the GPU model made NHWC (Module::to) and its program traced on an
  // NHWC input, so every activation and gradient is planned NHWC, cuDNN runs on NHWC and batch
  // norm on its channels_last kernels; both against the CPU's NCHW float64 step.
  const auto format =
      GENERATE(ts::memory_format::contiguous_format, ts::memory_format::channels_last);
  INFO("GPU layout " << (format == ts::memory_format::channels_last ? "NHWC" : "NCHW"));
  ts::manual_seed(13);
  auto cpu_model = ts::models::resnet18<double>(4);
  auto gpu_model = nn::to<ts::cuda>(cpu_model, 0);
  gpu_model.to(format);
  // Batch 4 at 64x64: layer4's batch norms then normalise 16 values per channel. At batch 2 and
  // 32x32 they normalise 2, and the gradients are so ill-conditioned that a 1e-15 relative change
  // of the input moves conv1's weight gradient by 1e-7 on the CPU alone (the GPU's summation
  // order then differs beyond any tolerance); here that change moves it by 1e-14.
  const auto x = ts::randn<double>({4, 3, 64, 64});
  const auto labels = ts::from_vector<std::int64_t>({1, 3, 0, 2}, {4});
  auto step = [&](auto& model, const auto& input, const auto& y, ts::memory_format layout) {
    using K = typename std::remove_cvref_t<decltype(input)>::device_kind;
    auto program = ag::compile(
        [&](const auto& v, const auto& t) { return ts::nn::cross_entropy(model(v), t); },
        ag::input<double, K>(input.shape(), 0, layout), ag::input<std::int64_t, K>(y.shape(), 0));
    model.zero_grad();
    const double loss = program.forward(input, y).item();
    program.backward();
    return loss;
  };
  const double loss_cpu = step(cpu_model, x, labels, ts::memory_format::contiguous_format);
  const double loss_gpu =
      step(gpu_model, x.contiguous(format).to<ts::cuda>(0), labels.to<ts::cuda>(0), format);
  CHECK(loss_gpu == Approx(loss_cpu).epsilon(1e-10));
  // Every parameter's gradient, named, so that a failure says which layer's backward differs.
  const auto gpu_parameters = gpu_model.named_parameters();
  const auto cpu_parameters = cpu_model.named_parameters();
  REQUIRE(gpu_parameters.size() == cpu_parameters.size());
  for (std::size_t i = 0; i < gpu_parameters.size(); ++i) {
    INFO("gradient of " << cpu_parameters[i].first);
    REQUIRE(gpu_parameters[i].first == cpu_parameters[i].first);
    const auto grad = gpu_parameters[i].second.grad().as<double, ts::cuda>();
    if (grad.dim() == 4) CHECK(grad.is_contiguous(format));  // a gradient in its weight's layout
    check_close(grad, cpu_parameters[i].second.grad().as<double, ts::cpu>());
  }
  check_close(gpu_model.bn1().running_mean().value(), cpu_model.bn1().running_mean().value());
  check_close(gpu_model.bn1().running_var().value(), cpu_model.bn1().running_var().value());
  gpu_model.eval();
  cpu_model.eval();
  check_close(gpu_model(x.contiguous(format).to<ts::cuda>(0)), cpu_model(x));
}

TEMPLATE_TEST_CASE("a 16-bit ResNet-18 on CUDA tracks the float64 model with its rounded weights",
                   "[cuda][resnet][amp]", ts::half, ts::bfloat16) {
  // nn::to<T>: convolutions (cuDNN, tensor-core math) and fc in T, BatchNorm in float; against the
  // float64 model on the CPU holding the same rounded weights and input (tests/models checks the
  // same on the CPU). Tolerances in T's unit roundoff u: the loss within 4 u in training mode; in
  // evaluation mode (batch norm's backward over few values per channel is ill-conditioned in
  // training, see above) the logits within 8 u and the gradients of fc, conv1 and bn1 within
  // 8, 128 and 128 u (every activation and gradient stored in T: about 2, 40-90 and 25-50 u on
  // the CPU).
  using T = TestType;
  const double u = std::is_same_v<T, ts::half> ? 1.0 / 2048 : 1.0 / 256;
  ts::manual_seed(14);
  const auto rounded = nn::to<T>(ts::models::resnet18<double>(4));
  auto reference = nn::to<double>(rounded);
  auto model = nn::to<ts::cuda>(rounded, 0);
  const auto x = ts::randn<double>({4, 3, 64, 64}).to<T>();
  const auto labels = ts::from_vector<std::int64_t>({1, 3, 0, 2}, {4});
  auto low = ag::compile(
      [&](const ag::Var<T, ts::cuda>& v, const ag::Var<std::int64_t, ts::cuda>& y) {
        return ts::nn::cross_entropy(ts::cast<float>(model(v)), y);
      },
      ag::input<T, ts::cuda>(x.shape(), 0), ag::input<std::int64_t, ts::cuda>(labels.shape(), 0));
  auto exact = ag::compile(
      [&](const ag::Var<double>& v, const ag::Var<std::int64_t>& y) {
        return ts::nn::cross_entropy(reference(v), y);
      },
      ag::input<double>(x.shape()), ag::input<std::int64_t>(labels.shape()));
  const auto x_gpu = x.template to<ts::cuda>(0);
  const auto labels_gpu = labels.to<ts::cuda>(0);
  const double loss = low.forward(x_gpu, labels_gpu).item();
  const double expected = exact.forward(x.template to<double>(), labels).item();
  CHECK(std::abs(loss - expected) <= 4 * u * expected);
  auto relative_error = [](const auto& actual, const auto& wanted) {
    const auto a = actual.template to<double>().template to<ts::cpu>().to_vector();
    const auto b = wanted.to_vector();
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < b.size(); ++i) {
      diff += (a[i] - b[i]) * (a[i] - b[i]);
      norm += b[i] * b[i];
    }
    return std::sqrt(diff / norm);
  };
  CHECK(relative_error(model.bn1().running_mean().value(),
                       reference.bn1().running_mean().value()) <= 4 * u);
  model.eval();
  reference.eval();
  CHECK(relative_error(model(x_gpu), reference(x.template to<double>())) <= 8 * u);
  (void)low.forward(x_gpu, labels_gpu);
  low.backward();
  (void)exact.forward(x.template to<double>(), labels);
  exact.backward();
  const double fc = relative_error(model.fc().weight().grad(), reference.fc().weight().grad());
  const double conv1 =
      relative_error(model.conv1().weight().grad(), reference.conv1().weight().grad());
  const double bn1 = relative_error(model.bn1().weight().grad(), reference.bn1().weight().grad());
  INFO("gradients' relative errors in u: fc.weight " << fc / u << ", conv1.weight " << conv1 / u
                                                     << ", bn1.weight " << bn1 / u);
  CHECK(fc <= 8 * u);
  CHECK(conv1 <= 128 * u);
  CHECK(bn1 <= 128 * u);
}

}  // namespace cuda_conv_test
