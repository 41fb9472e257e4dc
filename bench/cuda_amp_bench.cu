// Mixed precision on one GPU (issue 42), each row against its baseline in the same run:
// - matmul of 8192 x 8192 half and bfloat16 matrices (ts::matmul: tensor cores through cuBLAS,
//   sums in fp32) against cublasGemmEx on the same buffers (goal: >= 0.9 of its speed);
// - the MLP step 4096-4096-4096-4096-1024 at batch 2048 (mse loss in float, SGD with momentum
//   and fp32 master weights) in float, half (with a GradScaler) and bfloat16: the 16-bit steps
//   against the float one (goal: >= 1.6x);
// - ResNet-50 training steps at 224 x 224, batch 32 and 128, in half (with a GradScaler) and
//   bfloat16, BatchNorm and the loss in float (models::resnet50<T>), cuDNN with
//   backends::cudnn::benchmark, SGD with momentum, with their peak memory; in the channels-last
//   memory format (the model's convolution weights, the input and so every activation NHWC, as
//   PyTorch's recipe), and at batch 32 also in NCHW, to show what the layout gives.
// PyTorch's rows come from `bench/cuda_torch_baseline.py --amp` (autocast, channels_last,
// cudnn.benchmark, GradScaler for fp16; and the same step captured in a CUDA graph), run just
// before on the same GPU; give its JSON, and the plain baseline's for PyTorch's float32 steps, in
// TESSERA_TORCH_BASELINE (files separated by ':') and the ratios torch / tessera are printed.
// Every row checks what it computed against float64 on the CPU first and stops on a mismatch.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_report.hpp"
#include "cuda_bench_common.hpp"
#include "tessera/models/resnet.hpp"
#include "tessera/tessera.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

namespace {

using ts::bench::check_cuda;
using ts::bench::fail;
using ts::bench::time_with_events;

const ts::Device gpu0 = ts::Device::parse("cuda:0");

/// A row's 16-bit dtype: argument 0 is half (PyTorch's fp16), 1 bfloat16.
template <class F>
void with_dtype(std::int64_t index, F&& body) {
  if (index == 0) {
    body(ts::half{});
  } else {
    body(ts::bfloat16{});
  }
}
const char* torch_dtype(std::int64_t index) { return index == 0 ? "fp16" : "bf16"; }

/// The unit roundoff of a dtype (2^-11 for half, 2^-8 for bfloat16, 2^-24 for float).
template <class T>
constexpr double unit_roundoff = std::is_same_v<T, ts::half>       ? 1.0 / 2048
                                 : std::is_same_v<T, ts::bfloat16> ? 1.0 / 256
                                                                   : 1.0 / 16777216;

// ---- matmul ------------------------------------------------------------------------------------

constexpr std::int64_t gemm_size = 8192;

template <class T>
struct gemm_operands {
  ts::Tensor<T> a_host = ts::bench::random_tensor({gemm_size, gemm_size}, 5).to<T>();
  ts::Tensor<T> b_host = ts::bench::random_tensor({gemm_size, gemm_size}, 6).to<T>();
  ts::Tensor<T, ts::cuda> a = a_host.cuda(), b = b_host.cuda();
  ts::Tensor<T, ts::cuda> c = ts::zeros<T, ts::cuda>({gemm_size, gemm_size}, 0);
};
template <class T>
gemm_operands<T>& gemm_operands_of() {
  static gemm_operands<T> instance;
  return instance;
}

/// Checks 32 entries of the product against float64 sums of the same 16-bit operands: the
/// result is rounded once to T (u of the entry) after fp32 sums.
template <class T>
void check_gemm(const char* what, const ts::Tensor<T, ts::cuda>& c) {
  auto& x = gemm_operands_of<T>();
  const auto out = c.cpu().to_vector();
  const T* a = x.a_host.data();
  const T* b = x.b_host.data();
  for (std::int64_t k = 0; k < 32; ++k) {
    const std::int64_t i = (k * 613) % gemm_size, j = (k * 1597 + 11) % gemm_size;
    double expected = 0, magnitude = 0;
    for (std::int64_t l = 0; l < gemm_size; ++l) {
      const double p = static_cast<double>(static_cast<float>(a[i * gemm_size + l])) *
                       static_cast<double>(static_cast<float>(b[l * gemm_size + j]));
      expected += p;
      magnitude += std::abs(p);
    }
    const double actual = static_cast<float>(out[static_cast<std::size_t>(i * gemm_size + j)]);
    const double bound = 2 * unit_roundoff<T> * std::abs(expected) + 1e-5 * magnitude;
    if (!(std::abs(actual - expected) <= bound)) {
      fail(std::string(what) + ": entry " + std::to_string(i) + "," + std::to_string(j) + " is " +
           std::to_string(actual) + ", float64 reference " + std::to_string(expected));
    }
  }
}

// ts::matmul as users call it: a new output from the pool, then cuBLAS.
void BM_matmul_16bit(benchmark::State& state) {
  with_dtype(state.range(0), [&](auto tag) {
    using T = decltype(tag);
    auto& x = gemm_operands_of<T>();
    ts::Tensor<T, ts::cuda> out;
    time_with_events(state, [&] { out = ts::matmul(x.a, x.b); });
    check_gemm<T>("BM_matmul_16bit", out);
  });
  ts::bench::set_square_matmul_flops(state, gemm_size);
  state.SetLabel(torch_dtype(state.range(0)));
}
BENCHMARK(BM_matmul_16bit)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// The baseline: cublasGemmEx on the same buffers (row-major C = A B as column-major
// C^T = B^T A^T), fp32 compute, cuBLAS's default algorithm choice.
void BM_matmul_16bit_cublas(benchmark::State& state) {
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) fail("cublasCreate failed");
  with_dtype(state.range(0), [&](auto tag) {
    using T = decltype(tag);
    auto& x = gemm_operands_of<T>();
    const cudaDataType_t type = std::is_same_v<T, ts::half> ? CUDA_R_16F : CUDA_R_16BF;
    const int m = static_cast<int>(gemm_size);
    const float one = 1, zero = 0;
    time_with_events(state, [&] {
      if (cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, x.b.data(), type, m,
                       x.a.data(), type, m, &zero, x.c.data(), type, m, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        fail("cublasGemmEx failed");
      }
    });
    check_gemm<T>("BM_matmul_16bit_cublas", x.c);
  });
  cublasDestroy(handle);
  ts::bench::set_square_matmul_flops(state, gemm_size);
  state.SetLabel(torch_dtype(state.range(0)));
}
BENCHMARK(BM_matmul_16bit_cublas)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- MLP steps ---------------------------------------------------------------------------------

const std::vector<int> mlp_widths = {4096, 4096, 4096, 4096, 1024};
constexpr std::int64_t mlp_batch = 2048;

template <class T>
struct Mlp : nn::Module {
  std::vector<nn::Linear<T, ts::cuda>> layers;
  Mlp() {
    layers.reserve(mlp_widths.size());
    for (std::size_t i = 0; i + 1 < mlp_widths.size(); ++i) {
      layers.emplace_back(mlp_widths[i], mlp_widths[i + 1]);
      register_module(std::to_string(i), layers.back());
    }
  }
  template <class X>
  auto forward(const X& x) const {
    ag::Var<T, ts::cuda> h = layers[0](x);
    for (std::size_t i = 1; i < layers.size(); ++i) h = layers[i](ts::relu(h));
    return h;
  }
};

/// One MLP training step in T on cuda:0: the loss in float; half through a GradScaler (PyTorch's
/// fp16 recipe), bfloat16 and float without (a disabled scaler passes every call through).
template <class T>
struct mlp_trainer {
  explicit mlp_trainer(bool with_epilogues) : epilogues(with_epilogues) {}
  bool epilogues;  // false: the bias and ReLU as passes of their own (the A/B rows)
  Mlp<T> model;
  ts::Tensor<T> x_host = ts::bench::random_tensor({mlp_batch, mlp_widths.front()}, 1).to<T>();
  ts::Tensor<float> y_host = ts::bench::random_tensor({mlp_batch, mlp_widths.back()}, 2);
  ts::Tensor<T, ts::cuda> x = x_host.cuda();
  ts::Tensor<float, ts::cuda> y = y_host.cuda();
  ag::Program<ts::Tensor<float, ts::cuda>> program = ag::compile(
      [this](const ag::Var<T, ts::cuda>& input, const ag::Var<float, ts::cuda>& target) {
        return nn::mse_loss(ts::cast<float>(model.forward(input)), target);
      },
      ag::input<T, ts::cuda>(x.shape()), ag::input<float, ts::cuda>(y.shape()),
      ag::Options{.epilogues = epilogues});
  ts::optim::SGD sgd{model.parameters(), {.lr = 0.01, .momentum = 0.9}};
  ts::optim::GradScaler scaler{{.enabled = std::is_same_v<T, ts::half>}};

  float step() {
    sgd.zero_grad();
    const float loss = program.forward(x, y).item();
    program.backward(scaler);
    scaler.step(sgd);
    scaler.update();
    return loss;
  }

  /// The first loss in float64 on the CPU, from the model's initial (T) weights and input.
  double first_loss_reference() const {
    ts::Tensor<double> h = ts::cast<double>(x_host);
    for (std::size_t i = 0; i < model.layers.size(); ++i) {
      if (i > 0) h = ts::relu(h);
      const ts::Tensor<double> w = ts::cast<double>(model.layers[i].weight().value().cpu());
      const ts::Tensor<double> b = ts::cast<double>(model.layers[i].bias().value().cpu());
      h = ts::matmul(h, w.t()) + b;
    }
    const ts::Tensor<double> d = h - ts::cast<double>(y_host);
    return ts::sum(d * d).item() / static_cast<double>(d.numel());
  }
};

/// Argument 0 float, 1 half, 2 bfloat16 (second: epilogues on or off): the first loss against
/// float64 (within 16 u of the dtype, four layers' outputs rounded to it, plus 1e-4 for fp32 sums
/// of 4096 products), then the timed steps.
void BM_mlp_step(benchmark::State& state) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    ts::manual_seed(3);
    mlp_trainer<T> trainer(state.range(1) != 0);
    const double reference = trainer.first_loss_reference();
    const float first = trainer.step();
    if (!(std::abs(first - reference) <= (16 * unit_roundoff<T> + 1e-4) * reference)) {
      fail("MLP step: first loss " + std::to_string(first) + ", float64 reference " +
           std::to_string(reference));
    }
    for (auto _ : state) benchmark::DoNotOptimize(trainer.step());
  };
  const std::int64_t dtype = state.range(0);
  if (dtype == 0) {
    run(float{});
    state.SetLabel("float");
  } else {
    with_dtype(dtype - 1, run);
    state.SetLabel(torch_dtype(dtype - 1));
  }
}
// Arguments: dtype (as above), epilogues (1: the products take the bias and ReLU; 0: passes).
BENCHMARK(BM_mlp_step)
    ->ArgsProduct({{0, 1, 2}, {1, 0}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- ResNet-50 steps ---------------------------------------------------------------------------

constexpr std::int64_t resnet_classes = 1000;

/// A ResNet-50 training step at batch range(0) in dtype range(1) (0 half with a GradScaler, 1
/// bfloat16) and layout range(2) (1 channels_last: the model's 4-d parameters and the input NHWC,
/// so the program plans every activation NHWC; 0 NCHW), BatchNorm and the loss in float, cuDNN
/// with backends::cudnn::benchmark (each convolution's engine timed when the program is traced),
/// SGD with momentum and fp32 masters. peak_MiB: the peak of allocated memory over what was
/// allocated before the model was made, as the torch baseline measures it; skipped: steps the
/// GradScaler skipped (inf or NaN gradients while the scale settles).
void BM_resnet50_step_16bit(benchmark::State& state) {
  const std::int64_t images = state.range(0);
  const ts::memory_format format = state.range(2) == 1 ? ts::memory_format::channels_last
                                                        : ts::memory_format::contiguous_format;
  const bool saved_benchmark = ts::backends::cudnn::benchmark.load();
  ts::backends::cudnn::benchmark = true;  // read when the program is traced
  with_dtype(state.range(1), [&](auto tag) {
    using T = decltype(tag);
    const std::size_t allocated_before = ts::memory::allocated(gpu0);
    auto model = ts::models::resnet50<T, ts::cuda>(resnet_classes, 0);
    model.to(format);
    const auto x =
        ts::bench::random_tensor({images, 3, 224, 224}, 7).to<T>().cuda().contiguous(format);
    std::vector<std::int64_t> label_values;
    for (std::int64_t i = 0; i < images; ++i) label_values.push_back(i % resnet_classes);
    const auto labels = ts::from_vector<std::int64_t>(label_values, {images}).cuda();
    auto program = ag::compile(
        [&](const ag::Var<T, ts::cuda>& input, const ag::Var<std::int64_t, ts::cuda>& target) {
          return nn::cross_entropy(ts::cast<float>(model(input)), target);
        },
        ag::input<T, ts::cuda>(x.shape(), 0, format),
        ag::input<std::int64_t, ts::cuda>(labels.shape()),
        // As PyTorch's zero_grad() (set_to_none), which its peak memory row counts on.
        ag::Options{.gradients_in_arena = true});
    ts::optim::SGD sgd(model.parameters(), {.lr = 0.01, .momentum = 0.9});
    ts::optim::GradScaler scaler({.enabled = std::is_same_v<T, ts::half>});
    std::int64_t skipped = 0, steps = 0;
    auto step = [&] {
      sgd.zero_grad();
      const float loss = program.forward(x, labels).item();
      program.backward(scaler);
      skipped += scaler.step(sgd) ? 0 : 1;
      ++steps;
      scaler.update();
      return loss;
    };
    ts::bench::time_resnet_steps(state, step, gpu0, allocated_before, program.plan().planned_bytes);
    state.counters["skipped"] = static_cast<double>(skipped);
    state.counters["steps"] = static_cast<double>(steps);
  });
  ts::backends::cudnn::benchmark = saved_benchmark;
  state.SetLabel(std::string(torch_dtype(state.range(1))) +
                 (state.range(2) == 1 ? " channels_last" : " NCHW"));
}
BENCHMARK(BM_resnet50_step_16bit)
    ->Args({32, 0, 1})
    ->Args({32, 1, 1})
    ->Args({128, 0, 1})
    ->Args({128, 1, 1})
    ->Args({32, 0, 0})
    ->Args({32, 1, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  if (!ts::cuda::is_available()) {
    std::printf("cuda_amp_bench: no CUDA device is available; nothing to measure\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  ts::bench::recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  auto results = reporter.results;  // milliseconds
  const auto torch = ts::bench::torch_rows();
  for (const auto& [row, ms] : torch) results["torch/" + row] = ms;
  std::printf("\n");
  for (std::int64_t d = 0; d < 2; ++d) {
    const std::string arg = "/" + std::to_string(d);
    const std::string name = torch_dtype(d);
    ts::bench::print_summary(
        results,
        {"matmul 8192 " + name,
         {{"cublasGemmEx / ts::matmul", "BM_matmul_16bit" + arg, "BM_matmul_16bit_cublas" + arg,
           0.9},
          {"torch / tessera", "BM_matmul_16bit" + arg, "torch/matmul_8192_" + name, 1.0}}});
    const std::string mlp = "BM_mlp_step/" + std::to_string(d + 1) + "/1";
    ts::bench::print_summary(
        results,
        {"MLP step 4096 batch 2048 " + name,
         {{"float step / " + name + " step", mlp, "BM_mlp_step/0/1", 1.6},
          {"torch AMP / tessera", mlp, "torch/mlp_step_amp_" + name + "/mlp4096_b2048", 1.0},
          {"bias and ReLU as passes / as epilogue", mlp,
           "BM_mlp_step/" + std::to_string(d + 1) + "/0", 0}}});
    for (const char* images : {"32", "128"}) {
      const std::string row = std::string("BM_resnet50_step_16bit/") + images + arg + "/1";
      const std::string torch_row = "resnet50_step_amp_" + name + "_b" + images;
      std::vector<ts::bench::comparison> rows = {
          {"torch AMP / tessera", row, "torch/" + torch_row, 1.0},
          {"torch AMP CUDA graph / tessera", row, "torch/" + torch_row + "_graph", 0},
          {"torch float32 / tessera", row, std::string("torch/resnet50_step_b") + images, 0},
          {"torch float32 TF32 / tessera", row,
           std::string("torch/resnet50_step_tf32_b") + images, 0}};
      if (std::string(images) == "32") {
        rows.push_back({"NCHW step / channels_last step", row,
                        std::string("BM_resnet50_step_16bit/") + images + arg + "/0", 0});
      }
      ts::bench::print_summary(
          results, {std::string("ResNet-50 step batch ") + images + " " + name + " channels_last",
                    rows});
      const std::string torch_peak = torch_row + "_peak_MiB";
      if (torch.count(torch_peak) && reporter.counters.count(row)) {
        const double ours = reporter.counters[row]["peak_MiB"];
        std::printf(
            "ResNet-50 step batch %s %s peak memory: %.0f MiB, torch %.0f MiB: %.2f of "
            "torch's (goal <= 1.0)\n",
            images, name.c_str(), ours, torch.at(torch_peak), ours / torch.at(torch_peak));
      }
    }
  }
  benchmark::Shutdown();
  return 0;
}
