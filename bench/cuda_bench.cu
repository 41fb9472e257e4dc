// CUDA benchmarks (issues 16 and 11), on one GPU, each against its baseline in the same run:
// - bandwidth: the fused expressions `y = a*2 + b*c` and `sum(a * b)` over 2^26 floats, sums over
//   the last dimension of [32, 256, 3136] (plain and with a broadcast operand) and a broadcast
//   subtraction, and `a + b` and that sum as the library's primitives run them for g++ units,
//   against a device-to-device copy (cudaMemcpyAsync: the card's bandwidth, bytes read plus
//   written);
// - the pool: a tensor created and destroyed (ts::empty on cuda:0) against cudaMalloc/cudaFree
//   and cudaMallocAsync/cudaFreeAsync of the same size;
// - matmul: ts::matmul of 4096 x 4096 floats against cublasSgemm on the same buffers;
// - training steps (forward, backward, SGD with momentum): MLPs, ResNet-50's convolution layers
//   (forward + both gradients, cuDNN and im2col + cuBLAS), BatchNorm2d + ReLU, and ResNet-50
//   steps at 224 x 224 (batch 8 and 32 on cuDNN, batch 8 on im2col + cuBLAS), with each step's
//   peak memory and where its time goes (forward, backward, optimiser, launches). Their PyTorch 2
//   baselines come from bench/cuda_torch_baseline.py, run just before on the same GPU: give its
//   JSON in TESSERA_TORCH_BASELINE and the ratios torch / tessera are printed with the others;
// - the host's time per cuDNN convolution call (forward, both gradients, the old per-call
//   descriptors, an eager F::conv2d) against an empty kernel launch (issue 41's goal: <= 10 us).
// Kernel rows are timed with CUDA events (manual time); training steps with the host clock, as
// each ends in the loss's item(), which waits for the GPU. Each benchmark checks what it
// computed against a float64 reference on the CPU (a sample of elements) and aborts on a
// mismatch: a benchmark that computes nothing must not report a time.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bench_report.hpp"
#include "cuda_bench_common.hpp"
#include "resnet50_layers.hpp"
#include "tessera/models/resnet.hpp"
#include "tessera/tessera.hpp"
#include "tessera/tools/profile.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

namespace {

const ts::Device gpu0 = ts::Device::parse("cuda:0");
using ts::bench::check_cuda;
using ts::bench::fail;
using ts::bench::time_with_events;
using ts::bench::torch_rows;

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- bandwidth ---------------------------------------------------------------------------------

constexpr std::int64_t n = std::int64_t{1} << 26;  // 256 MiB per float array

/// Deterministic values in [-1, 1) without a random generator (2^26 of them quickly).
float value_at(std::int64_t i, std::uint32_t seed) {
  const std::uint32_t h = (static_cast<std::uint32_t>(i) + seed * 0x9e3779b9u) * 2654435761u;
  return static_cast<float>(h >> 8) / static_cast<float>(1u << 23) - 1.0f;
}

ts::Tensor<float, ts::cuda> filled(std::uint32_t seed) {
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = value_at(i, seed);
  return ts::from_vector<float>(values, {n}).cuda();
}

struct arrays {
  ts::Tensor<float, ts::cuda> a = filled(1), b = filled(2), c = filled(3), y = filled(4);
};
arrays& bandwidth_arrays() {
  static arrays instance;
  return instance;
}

/// Checks 4096 spread elements of y (on the GPU) against `reference(i)`.
template <class R>
void check_sample(const char* what, const ts::Tensor<float, ts::cuda>& y, R reference) {
  const auto host = y.cpu().to_vector();
  for (std::int64_t i = 0; i < n; i += n / 4096 + 7) {
    const double expected = reference(i);
    const double actual = host[static_cast<std::size_t>(i)];
    if (!(std::abs(actual - expected) <= 1e-5 * (1 + std::abs(expected)))) {
      fail(std::string(what) + ": element " + std::to_string(i) + " is " + std::to_string(actual) +
           ", expected " + std::to_string(expected));
    }
  }
}

void BM_copy_device_to_device(benchmark::State& state) {
  auto& x = bandwidth_arrays();
  time_with_events(state, [&] {
    check_cuda(cudaMemcpyAsync(x.y.data(), x.a.data(), n * sizeof(float), cudaMemcpyDeviceToDevice,
                               nullptr),
               "cudaMemcpyAsync");
  });
  check_sample(__func__, x.y, [](std::int64_t i) { return double(value_at(i, 1)); });
  set_bytes(state, 2.0 * n * sizeof(float));
}
BENCHMARK(BM_copy_device_to_device)->UseManualTime()->Unit(benchmark::kMillisecond);

// y = a*2 + b*c: three arrays read, one written, one kernel.
void BM_mul_add_tessera(benchmark::State& state) {
  auto& x = bandwidth_arrays();
  time_with_events(state, [&] { x.y = x.a * 2 + x.b * x.c; });
  check_sample(__func__, x.y, [](std::int64_t i) {
    return 2.0 * value_at(i, 1) + double(value_at(i, 2)) * value_at(i, 3);
  });
  set_bytes(state, 4.0 * n * sizeof(float));
}
BENCHMARK(BM_mul_add_tessera)->UseManualTime()->Unit(benchmark::kMillisecond);

// sum(a * b): two arrays read, a fused reduction.
void BM_sum_product_tessera(benchmark::State& state) {
  auto& x = bandwidth_arrays();
  ts::Tensor<float, ts::cuda> total;
  time_with_events(state, [&] { total = ts::sum(x.a * x.b); });
  double expected = 0;
  for (std::int64_t i = 0; i < n; ++i) expected += double(value_at(i, 1)) * value_at(i, 2);
  const double actual = total.item();
  if (!(std::abs(actual - expected) <= 1e-4 * (1 + std::abs(expected)) + 1e-2)) {
    fail("sum(a * b) is " + std::to_string(actual) + ", expected " + std::to_string(expected));
  }
  set_bytes(state, 2.0 * n * sizeof(float));
}
BENCHMARK(BM_sum_product_tessera)->UseManualTime()->Unit(benchmark::kMillisecond);

// Sums over the last dimension of [32, 256, 3136] (ResNet-50's batch-norm sums at batch 32), plain
// and with an operand broadcast along it, and the broadcast subtraction alone.
const ts::Shape rows_shape{32, 256, 3136};
struct row_operands {
  ts::Tensor<float> x_host = ts::bench::random_tensor(rows_shape, 8);
  ts::Tensor<float> m_host = ts::bench::random_tensor({1, 256, 1}, 9);
  ts::Tensor<float, ts::cuda> x = x_host.cuda(), m = m_host.cuda();
  ts::Tensor<float, ts::cuda> d = ts::empty<float, ts::cuda>(rows_shape, 0);
};
row_operands& row_data() {
  static row_operands instance;
  return instance;
}

void BM_row_sum(benchmark::State& state) {
  auto& r = row_data();
  const int form = static_cast<int>(state.range(0));
  ts::Tensor<float, ts::cuda> out;
  time_with_events(state, [&] {
    if (form == 0) out = ts::sum(r.x, 2);
    if (form == 1) out = ts::sum(r.x * r.x, 2);
    if (form == 2) out = ts::sum((r.x - r.m) * (r.x - r.m), 2);
  });
  const auto host = out.cpu().to_vector();
  const float* x = r.x_host.data();
  const std::int64_t length = rows_shape[2], channels = rows_shape[1];
  for (std::int64_t row = 0; row < rows_shape[0] * channels; row += 997) {
    const double mean = r.m_host.data()[row % channels];
    double expected = 0;
    for (std::int64_t i = 0; i < length; ++i) {
      const double v = x[row * length + i];
      expected += form == 0 ? v : form == 1 ? v * v : (v - mean) * (v - mean);
    }
    const double actual = host[static_cast<std::size_t>(row)];
    if (!(std::abs(actual - expected) <= 1e-4 * (1 + std::abs(expected)))) {
      fail("row sum form " + std::to_string(form) + ", row " + std::to_string(row) + ": " +
           std::to_string(actual) + ", expected " + std::to_string(expected));
    }
  }
  set_bytes(state, static_cast<double>(rows_shape.numel()) * sizeof(float));
  state.SetLabel(form == 0 ? "sum(x, 2)" : form == 1 ? "sum(x * x, 2)" : "sum((x - m)^2, 2)");
}
BENCHMARK(BM_row_sum)->Arg(0)->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMillisecond);

// The same sums with the row plan's group forced (backends::cuda::reduction_row_lanes): which
// width of lanes per row reaches the copy's bandwidth on this GPU (the plan's own choice for
// these rows is 32 lanes since c41a42f, a warp per row, 98 values each, no shared-memory merge;
// 128 lanes, 24 values each, before). Args: form, lanes.
void BM_row_sum_lanes(benchmark::State& state) {
  ts::backends::cuda::reduction_row_lanes = static_cast<int>(state.range(1));
  BM_row_sum(state);
  ts::backends::cuda::reduction_row_lanes = 0;
}
BENCHMARK(BM_row_sum_lanes)
    ->ArgsProduct({{0, 2}, {32, 64, 128, 256}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The library's primitives, which a g++ unit's own expressions run on, one operation at a time:
// y = a + b (elementwise primitives take kernel_choice::compact: the vector kernel for a dense
// run, as the fused form, and the rows kernel one element at a time for the rest; one kernel for
// the tensor and number forms of a functor) against the fused form (BM_add_tessera), and sum(x, 2)
// of rows_shape through the bound-row source (kernel_choice::fewest) against BM_row_sum/0's
// linear one.
void BM_add_tessera(benchmark::State& state) {
  auto& x = bandwidth_arrays();
  const bool primitive = state.range(0) == 1;
  time_with_events(state, [&] {
    if (primitive) {
      ts::detail::run_cuda_primitive(x.y, ts::detail::make_binary<ts::ops::add>(x.a, x.b));
    } else {
      x.y = x.a + x.b;
    }
  });
  check_sample(__func__, x.y,
               [](std::int64_t i) { return double(value_at(i, 1)) + double(value_at(i, 2)); });
  set_bytes(state, 3.0 * n * sizeof(float));
  state.SetLabel(primitive ? "primitive (compact)" : "fused (fastest)");
}
BENCHMARK(BM_add_tessera)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// Copies and conversions (tensor/detail/copy.hpp), n elements as an 8192 x 8192 matrix:
// 0: y.copy_(a) within one dtype over a dense run, cudaMemcpyAsync;
// 1: a transposed float matrix made row-major, the rows kernel over the bits;
// 2: float to half over a dense run, the vector kernel;
// 3: float to half from a transposed view, the rows kernel one element at a time
//    (kernel_choice::compact, what conversions compile besides the vector kernel).
void BM_copy_tessera(benchmark::State& state) {
  auto& x = bandwidth_arrays();
  const int form = static_cast<int>(state.range(0));
  constexpr std::int64_t side = 8192;
  static_assert(side * side == n);
  const auto a = x.a.view({side, side});
  auto y = x.y.view({side, side});
  auto h = ts::empty<ts::half, ts::cuda>({side, side}, 0);
  time_with_events(state, [&] {
    switch (form) {
      case 0:
        y.copy_(a);
        break;
      case 1:
        y.copy_(a.t());
        break;
      case 2:
        h.copy_(a);
        break;
      default:
        h.copy_(a.t());
        break;
    }
  });
  const bool transposed = form == 1 || form == 3;
  const auto source = [&](std::int64_t i) {
    const std::int64_t row = i / side, column = i % side;
    return value_at(transposed ? column * side + row : i, 1);
  };
  if (form < 2) {
    check_sample(__func__, x.y, [&](std::int64_t i) { return double(source(i)); });
  } else {
    const auto host = h.cpu().to_vector();
    for (std::int64_t i = 0; i < n; i += n / 4096 + 7) {
      const float expected = static_cast<float>(ts::half(source(i)));
      if (static_cast<float>(host[static_cast<std::size_t>(i)]) != expected) {
        fail(std::string(__func__) + ": element " + std::to_string(i) + " is " +
             std::to_string(static_cast<float>(host[static_cast<std::size_t>(i)])) + ", expected " +
             std::to_string(expected));
      }
    }
  }
  set_bytes(state, double(n) * (form < 2 ? 2 * sizeof(float) : sizeof(float) + sizeof(ts::half)));
  const char* labels[] = {"dense copy (cudaMemcpyAsync)", "transposed copy (rows kernel)",
                          "dense float->half (vector kernel)",
                          "transposed float->half (compact rows)"};
  state.SetLabel(labels[form]);
}
BENCHMARK(BM_copy_tessera)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_row_sum_primitive(benchmark::State& state) {
  auto& r = row_data();
  auto out = ts::empty<float, ts::cuda>({rows_shape[0], rows_shape[1]}, 0);
  const ts::detail::tensor_leaf<float, ts::cuda> leaf{r.x};
  time_with_events(state, [&] {
    ts::detail::reduce_dim_cuda_primitive<ts::backend::sum_op<float>, ts::backend::finish_value>(
        out, leaf, 2, "sum");
  });
  const auto host = out.cpu().to_vector();
  const float* x = r.x_host.data();
  const std::int64_t length = rows_shape[2];
  for (std::int64_t row = 0; row < rows_shape[0] * rows_shape[1]; row += 997) {
    double expected = 0;
    for (std::int64_t i = 0; i < length; ++i) expected += x[row * length + i];
    const double actual = host[static_cast<std::size_t>(row)];
    if (!(std::abs(actual - expected) <= 1e-4 * (1 + std::abs(expected)))) {
      fail("primitive row sum, row " + std::to_string(row) + ": " + std::to_string(actual) +
           ", expected " + std::to_string(expected));
    }
  }
  set_bytes(state, static_cast<double>(rows_shape.numel()) * sizeof(float));
}
BENCHMARK(BM_row_sum_primitive)->UseManualTime()->Unit(benchmark::kMillisecond);

// d = x - m with m [1, 256, 1] broadcast: fused (Arg 0), and as the library's primitive (Arg 1:
// not one dense run, so the compact rows kernel, one element at a time).
void BM_broadcast_subtract(benchmark::State& state) {
  auto& r = row_data();
  const bool primitive = state.range(0) == 1;
  time_with_events(state, [&] {
    if (primitive) {
      ts::detail::run_cuda_primitive(r.d, ts::detail::make_binary<ts::ops::subtract>(r.x, r.m));
    } else {
      r.d = r.x - r.m;
    }
  });
  state.SetLabel(primitive ? "primitive (compact)" : "fused (fastest)");
  const auto host = r.d.cpu().to_vector();
  for (std::int64_t i = 0; i < rows_shape.numel(); i += 9973) {
    const double expected =
        double(r.x_host.data()[i]) - r.m_host.data()[(i / rows_shape[2]) % rows_shape[1]];
    if (host[static_cast<std::size_t>(i)] != static_cast<float>(expected)) {
      fail("x - m: element " + std::to_string(i) + " is " +
           std::to_string(host[static_cast<std::size_t>(i)]));
    }
  }
  set_bytes(state, 2.0 * static_cast<double>(rows_shape.numel()) * sizeof(float));
}
BENCHMARK(BM_broadcast_subtract)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- the pool ----------------------------------------------------------------------------------

void BM_alloc_tessera(benchmark::State& state) {
  const std::int64_t count = state.range(0) / 4;
  for (auto _ : state) {
    auto t = ts::empty<float, ts::cuda>({count}, 0);
    benchmark::DoNotOptimize(t.data());
  }
}
BENCHMARK(BM_alloc_tessera)->Arg(4 << 10)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();

void BM_alloc_cudamalloc(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    benchmark::DoNotOptimize(p);
    check_cuda(cudaFree(p), "cudaFree");
  }
}
BENCHMARK(BM_alloc_cudamalloc)->Arg(4 << 10)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();

void BM_alloc_cudamallocasync(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    check_cuda(cudaMallocAsync(&p, bytes, nullptr), "cudaMallocAsync");
    benchmark::DoNotOptimize(p);
    check_cuda(cudaFreeAsync(p, nullptr), "cudaFreeAsync");
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}
BENCHMARK(BM_alloc_cudamallocasync)->Arg(4 << 10)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();

// ---- matmul ------------------------------------------------------------------------------------

constexpr std::int64_t matmul_size = 4096;

struct matmul_operands {
  ts::Tensor<float> a_host = ts::bench::random_tensor({matmul_size, matmul_size}, 5);
  ts::Tensor<float> b_host = ts::bench::random_tensor({matmul_size, matmul_size}, 6);
  ts::Tensor<float, ts::cuda> a = a_host.cuda(), b = b_host.cuda();
  ts::Tensor<float, ts::cuda> c = ts::zeros<float, ts::cuda>({matmul_size, matmul_size}, 0);
};
matmul_operands& operands() {
  static matmul_operands instance;
  return instance;
}

/// Checks 64 entries of the product against float64 sums.
void check_product(const char* what, const ts::Tensor<float, ts::cuda>& c) {
  auto& x = operands();
  const auto out = c.cpu().to_vector();
  const float* a = x.a_host.data();
  const float* b = x.b_host.data();
  for (std::int64_t k = 0; k < 64; ++k) {
    const std::int64_t i = (k * 613) % matmul_size, j = (k * 1597 + 11) % matmul_size;
    double expected = 0;
    for (std::int64_t l = 0; l < matmul_size; ++l) {
      expected += double(a[i * matmul_size + l]) * b[l * matmul_size + j];
    }
    const double actual = out[static_cast<std::size_t>(i * matmul_size + j)];
    if (!(std::abs(actual - expected) <= 1e-3 * (1 + std::abs(expected)))) {
      fail(std::string(what) + ": entry " + std::to_string(i) + "," + std::to_string(j) + " is " +
           std::to_string(actual) + ", expected " + std::to_string(expected));
    }
  }
}

// ts::matmul as users call it: a new output from the pool, then cuBLAS.
void BM_matmul_tessera(benchmark::State& state) {
  auto& x = operands();
  ts::Tensor<float, ts::cuda> out;
  time_with_events(state, [&] { out = ts::matmul(x.a, x.b); });
  check_product(__func__, out);
  ts::bench::set_square_matmul_flops(state, matmul_size);
}
BENCHMARK(BM_matmul_tessera)->UseManualTime()->Unit(benchmark::kMillisecond);

// The baseline: cublasSgemm on the same buffers (row-major C = A B as column-major C^T = B^T A^T),
// default math mode (no TF32, as Tessera's float matmul).
void BM_matmul_cublas(benchmark::State& state) {
  auto& x = operands();
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) fail("cublasCreate failed");
  const int m = static_cast<int>(matmul_size);
  const float one = 1, zero = 0;
  time_with_events(state, [&] {
    if (cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, x.b.data(), m, x.a.data(), m,
                    &zero, x.c.data(), m) != CUBLAS_STATUS_SUCCESS) {
      fail("cublasSgemm failed");
    }
  });
  check_product(__func__, x.c);
  cublasDestroy(handle);
  ts::bench::set_square_matmul_flops(state, matmul_size);
}
BENCHMARK(BM_matmul_cublas)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- training steps ----------------------------------------------------------------------------

template <class T, class K>
struct Mlp : nn::Module {
  std::vector<nn::Linear<T, K>> layers;
  explicit Mlp(const std::vector<int>& widths) {
    layers.reserve(widths.size());
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.emplace_back(widths[i], widths[i + 1]);
      register_module(std::to_string(i), layers.back());
    }
  }
  template <class X>
  auto forward(const X& x) const {
    ag::Var<T, K> h = layers[0](x);
    for (std::size_t i = 1; i < layers.size(); ++i) h = layers[i](ts::relu(h));
    return h;
  }
};

struct mlp_config {
  std::string name;
  std::vector<int> widths;
  std::int64_t batch;
};

/// One MLP training step on cuda:0 (mse loss, SGD with momentum), the data made on the CPU.
struct mlp_trainer {
  Mlp<float, ts::cuda> model;
  ts::Tensor<float, ts::cuda> x, y;
  ag::Program<ts::Tensor<float, ts::cuda>> program;
  ts::optim::SGD sgd;
  /// `epilogues` false: the products do not take the bias and ReLU (ag::Options::epilogues), the
  /// same step as before the fold, for the A/B row.
  explicit mlp_trainer(const mlp_config& c, bool epilogues = true)
      : model(c.widths),
        x(ts::bench::random_tensor({c.batch, c.widths.front()}, 1).cuda()),
        y(ts::bench::random_tensor({c.batch, c.widths.back()}, 2).cuda()),
        program(ag::compile(
            [this](ag::Var<float, ts::cuda> input, ag::Var<float, ts::cuda> target) {
              return nn::mse_loss(model.forward(input), target);
            },
            ag::input<float, ts::cuda>(x.shape()), ag::input<float, ts::cuda>(y.shape()),
            ag::Options{.epilogues = epilogues})),
        sgd(model.parameters(), {.lr = 0.01, .momentum = 0.9}) {}
  float step() {
    sgd.zero_grad();
    const float loss = program.forward(x, y).item();
    program.backward();
    sgd.step();
    return loss;
  }
};

/// The first loss in float64 on the CPU, from the model's initial weights and the same data.
double mlp_first_loss_reference(const mlp_config& c, const Mlp<float, ts::cuda>& model) {
  ts::Tensor<double> h = ts::cast<double>(ts::bench::random_tensor({c.batch, c.widths.front()}, 1));
  for (std::size_t i = 0; i < model.layers.size(); ++i) {
    if (i > 0) h = ts::relu(h);
    const ts::Tensor<double> w = ts::cast<double>(model.layers[i].weight().value().cpu());
    const ts::Tensor<double> b = ts::cast<double>(model.layers[i].bias().value().cpu());
    h = ts::matmul(h, w.t()) + b;
  }
  const ts::Tensor<double> y =
      ts::cast<double>(ts::bench::random_tensor({c.batch, c.widths.back()}, 2));
  const ts::Tensor<double> d = h - y;
  return ts::sum(d * d).item() / static_cast<double>(d.numel());
}

const std::vector<mlp_config>& mlp_configs() {
  static const std::vector<mlp_config> all = {
      {"mlp784_b256", {784, 1024, 1024, 10}, 256},
      {"mlp4096_b2048", {4096, 4096, 4096, 4096, 1024}, 2048},
  };
  return all;
}

/// One MLP row: the first loss checked against float64, then the timed steps.
void run_mlp_row(benchmark::State& state, const mlp_config& c, bool epilogues = true) {
  mlp_trainer trainer(c, epilogues);
  if (epilogues && trainer.program.plan().epilogues != static_cast<int>(c.widths.size()) - 1) {
    fail(c.name + ": " + std::to_string(trainer.program.plan().epilogues) +
         " products with an epilogue, expected one per layer");
  }
  const double reference = mlp_first_loss_reference(c, trainer.model);
  const float first = trainer.step();
  if (!(std::abs(first - reference) <= 1e-4 * (1 + reference))) {
    fail(c.name + ": first loss " + std::to_string(first) + ", float64 reference " +
         std::to_string(reference));
  }
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step());
}

void register_mlp_rows() {
  for (const mlp_config& c : mlp_configs()) {
    benchmark::RegisterBenchmark(("mlp_step_tessera/" + c.name).c_str(),
                                 [c](benchmark::State& state) { run_mlp_row(state, c); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    // The same step with the bias and ReLU as passes of their own: what the epilogues save.
    benchmark::RegisterBenchmark(("mlp_step_tessera_no_epilogue/" + c.name).c_str(),
                                 [c](benchmark::State& state) { run_mlp_row(state, c, false); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// ResNet-50's convolution layers (resnet50_layers.hpp, as conv_bench times them on the CPU),
// forward and both gradients at batch 8, as the compiled program of sum(conv(x) * g).
using layer = ts::bench::conv_layer;
const std::vector<layer>& layers() { return ts::bench::resnet50_conv_layers(); }
constexpr std::int64_t batch = 8;
using ts::bench::out_extent;

struct conv_trainer {
  nn::Conv2d<float, ts::cuda> conv;
  ts::Tensor<float> x_host, g_host;
  ts::Tensor<float, ts::cuda> x, g;
  ag::Program<ts::Tensor<float, ts::cuda>> program;
  explicit conv_trainer(const layer& l)
      : conv(l.c, l.o, l.k, {.stride = l.stride, .padding = l.padding, .bias = false}),
        x_host(ts::bench::random_tensor({batch, l.c, l.hw, l.hw}, 1)),
        g_host(ts::bench::random_tensor({batch, l.o, out_extent(l), out_extent(l)}, 2)),
        x(x_host.cuda()),
        g(g_host.cuda()),
        program(ag::compile(
            [this](const ag::Var<float, ts::cuda>& input, const ag::Var<float, ts::cuda>& grad) {
              return ts::sum(conv(input) * grad);
            },
            [&] {
              auto spec = ag::input<float, ts::cuda>(x.shape());
              spec.requires_grad = true;
              return spec;
            }(),
            ag::input<float, ts::cuda>(g.shape()))) {}
  float step() {
    conv.zero_grad();
    const float value = program.forward(x, g).item();
    program.backward();
    return value;
  }
  /// The forward value against the CPU's float64 convolution of the same weights and data.
  void check(const std::string& what, const layer& l) {
    const ts::Tensor<double> w = ts::cast<double>(conv.weight().value().cpu());
    const ts::Tensor<double> x64 = ts::cast<double>(x_host);
    const ts::Tensor<double> g64 = ts::cast<double>(g_host);
    const ts::Tensor<double> y =
        nn::functional::conv2d(x64, w, {.stride = l.stride, .padding = l.padding});
    const double expected = ts::sum(y * g64).item();
    const double actual = step();
    if (!(std::abs(actual - expected) <= 1e-4 * (1 + std::abs(expected)))) {
      fail(what + ": sum(conv(x) * g) is " + std::to_string(actual) + ", float64 reference " +
           std::to_string(expected));
    }
  }
};

/// One convolution row on cuDNN or on im2col + cuBLAS (the switch is read when the program is
/// traced), its value checked against float64 first.
void run_conv_row(benchmark::State& state, const layer& l, bool cudnn, const std::string& name) {
  const bool saved = ts::backends::cudnn::enabled.load();
  ts::backends::cudnn::enabled = cudnn;
  conv_trainer trainer(l);
  trainer.check(name, l);
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step());
  ts::backends::cudnn::enabled = saved;
}

void register_conv_rows() {
  for (const layer& l : layers()) {
    for (const bool cudnn : {true, false}) {
      const std::string name = std::string(cudnn ? "conv_cudnn/" : "conv_im2col_cublas/") + l.name;
      benchmark::RegisterBenchmark(
          name.c_str(),
          [l, cudnn, name](benchmark::State& state) { run_conv_row(state, l, cudnn, name); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// BatchNorm2d (training mode) and ReLU, forward and the gradients of x, weight and bias, as the
// compiled program of sum(relu(bn(x)) * g): ResNet-50's shapes after the stem and in layer1, and
// its short planes (layer3's 14x14, layer4's 7x7: 31 of its 53 batch norms), where a channel has
// few values and PyTorch's cuDNN batch norm may win (issue 41: the faster per shape).
struct bn_shape {
  std::string name;
  std::int64_t c, hw;
};
const std::vector<bn_shape>& bn_shapes() {
  static const std::vector<bn_shape> all = {{"64_112", 64, 112},
                                            {"256_56", 256, 56},
                                            {"256_14", 256, 14},
                                            {"1024_14", 1024, 14},
                                            {"2048_7", 2048, 7}};
  return all;
}

/// Fails the run unless `actual`, the forward value sum(relu(bn(x)) * g) of a batch norm in
/// training with weight 1 and bias 0 (PyTorch's initialisation), eps 1e-5, is float64's.
void check_bn_relu(const std::string& what, double actual, const ts::Tensor<float>& x_host,
                   const ts::Tensor<float>& g_host) {
  const ts::Tensor<double> x64 = ts::cast<double>(x_host);
  const ts::Tensor<double> mean = ts::mean(ts::mean(ts::mean(x64, 0, true), 2, true), 3, true);
  const ts::Tensor<double> centred = x64 - mean;
  const ts::Tensor<double> var =
      ts::mean(ts::mean(ts::mean(centred * centred, 0, true), 2, true), 3, true);
  const ts::Tensor<double> y = ts::relu(centred / ts::sqrt(var + 1e-5));
  const double expected = ts::sum(y * ts::cast<double>(g_host)).item();
  if (!(std::abs(actual - expected) <= 1e-3 * (1 + std::abs(expected)))) {
    fail(what + ": sum(relu(bn(x)) * g) is " + std::to_string(actual) + ", float64 reference " +
         std::to_string(expected));
  }
}

void BM_batchnorm_relu(benchmark::State& state) {
  const bn_shape& b = bn_shapes()[static_cast<std::size_t>(state.range(0))];
  nn::BatchNorm2d<float, ts::cuda> bn(b.c);
  const auto x_host = ts::bench::random_tensor({batch, b.c, b.hw, b.hw}, 3);
  const auto g_host = ts::bench::random_tensor({batch, b.c, b.hw, b.hw}, 4);
  const auto x = x_host.cuda();
  const auto g = g_host.cuda();
  auto spec = ag::input<float, ts::cuda>(x.shape());
  spec.requires_grad = true;
  auto program = ag::compile(
      [&](const ag::Var<float, ts::cuda>& input, const ag::Var<float, ts::cuda>& grad) {
        return ts::sum(ts::relu(bn(input)) * grad);
      },
      spec, ag::input<float, ts::cuda>(g.shape()));
  auto step = [&] {
    bn.zero_grad();
    const float value = program.forward(x, g).item();
    program.backward();
    return value;
  };
  check_bn_relu("batchnorm " + b.name, step(), x_host, g_host);
  for (auto _ : state) benchmark::DoNotOptimize(step());
  state.SetLabel(b.name);
}
// Every shape of bn_shapes().
BENCHMARK(BM_batchnorm_relu)
    ->DenseRange(0, static_cast<int>(bn_shapes().size()) - 1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

#if TESSERA_CUDNN
// The same computation with cuDNN's batch norm in place of Tessera's kernels (issue 41: "measure
// cuDNN's batch norm against your kernels and use the faster per shape"): the legacy calls
// PyTorch makes for BatchNorm2d in training (cudnnBatchNormalizationForwardTraining and
// cudnnBatchNormalizationBackward, mode SPATIAL), the loss sum(relu(y) * g) and the ReLU's
// backward (g where y > 0) as Tessera's fused kernels, as the program above runs them. Its
// forward value is checked against the same float64 reference.
void BM_batchnorm_relu_cudnn(benchmark::State& state) {
  const bn_shape& b = bn_shapes()[static_cast<std::size_t>(state.range(0))];
  const ts::Shape shape{batch, b.c, b.hw, b.hw};
  const auto x_host = ts::bench::random_tensor(shape, 3);
  const auto g_host = ts::bench::random_tensor(shape, 4);
  const auto x = x_host.cuda();
  const auto g = g_host.cuda();
  auto y = ts::empty<float, ts::cuda>(shape, 0);
  auto dy = ts::empty<float, ts::cuda>(shape, 0);
  auto dx = ts::empty<float, ts::cuda>(shape, 0);
  const auto weight = ts::ones<float, ts::cuda>({b.c}, 0);
  const auto bias = ts::zeros<float, ts::cuda>({b.c}, 0);
  auto running_mean = ts::zeros<float, ts::cuda>({b.c}, 0);
  auto running_var = ts::ones<float, ts::cuda>({b.c}, 0);
  auto saved_mean = ts::empty<float, ts::cuda>({b.c}, 0);
  auto saved_inv_std = ts::empty<float, ts::cuda>({b.c}, 0);
  auto weight_grad = ts::empty<float, ts::cuda>({b.c}, 0);
  auto bias_grad = ts::empty<float, ts::cuda>({b.c}, 0);
  cudnnHandle_t handle = nullptr;
  TESSERA_CUDNN_CHECK(cudnnCreate(&handle));
  TESSERA_CUDNN_CHECK(cudnnSetStream(handle, ts::detail::current_cuda_stream().native()));
  cudnnTensorDescriptor_t x_desc = nullptr, bn_desc = nullptr;
  TESSERA_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc));
  TESSERA_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bn_desc));
  TESSERA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                                 static_cast<int>(batch), static_cast<int>(b.c),
                                                 static_cast<int>(b.hw), static_cast<int>(b.hw)));
  TESSERA_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn_desc, x_desc, CUDNN_BATCHNORM_SPATIAL));
  const float one = 1.0f, zero = 0.0f;
  constexpr double eps = 1e-5;
  auto step = [&] {
    TESSERA_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
        handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x_desc, x.data(), x_desc, y.data(), bn_desc,
        weight.data(), bias.data(), 0.1, running_mean.data(), running_var.data(), eps,
        saved_mean.data(), saved_inv_std.data()));
    const float value = ts::sum(ts::relu(y) * g).item();
    dy = ts::where(y > 0.0f, g, 0.0f);
    TESSERA_CUDNN_CHECK(cudnnBatchNormalizationBackward(
        handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, x_desc, x.data(), x_desc,
        dy.data(), x_desc, dx.data(), bn_desc, weight.data(), weight_grad.data(),
        bias_grad.data(), eps, saved_mean.data(), saved_inv_std.data()));
    return value;
  };
  check_bn_relu("batchnorm (cuDNN) " + b.name, step(), x_host, g_host);
  for (auto _ : state) benchmark::DoNotOptimize(step());
  cudnnDestroyTensorDescriptor(bn_desc);
  cudnnDestroyTensorDescriptor(x_desc);
  cudnnDestroy(handle);
  state.SetLabel(b.name);
}
BENCHMARK(BM_batchnorm_relu_cudnn)
    ->DenseRange(0, static_cast<int>(bn_shapes().size()) - 1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
#endif

constexpr std::int64_t resnet_classes = 1000;

/// A ResNet-50 training step at batch state.range(0), on cuDNN (range(1) == 1), on cuDNN with
/// backends::cudnn::benchmark (2: each convolution call's engine timed when the program is traced),
/// on cuDNN with the program's forward and backward replayed as CUDA graphs (3:
/// Options::cuda_graph) or on im2col + cuBLAS (0). peak_MiB is the peak of allocated memory over what was allocated before the model was made
/// (the other rows' buffers), as the torch baseline measures it.
void BM_resnet50_step_tessera(benchmark::State& state) {
  const std::int64_t images = state.range(0);
  const bool saved_cudnn = ts::backends::cudnn::enabled.load();
  const bool saved_benchmark = ts::backends::cudnn::benchmark.load();
  ts::backends::cudnn::enabled = state.range(1) != 0;  // read when the program is traced
  ts::backends::cudnn::benchmark = state.range(1) == 2;
  const std::size_t allocated_before = ts::memory::allocated(gpu0);
  auto model = ts::models::resnet50<float, ts::cuda>(resnet_classes, 0);
  const auto x = ts::bench::random_tensor({images, 3, 224, 224}, 7).cuda();
  std::vector<std::int64_t> label_values;
  for (std::int64_t i = 0; i < images; ++i) label_values.push_back(i % resnet_classes);
  const auto labels = ts::from_vector<std::int64_t>(label_values, {images}).cuda();
  auto program = ag::compile(
      [&](const ag::Var<float, ts::cuda>& input, const ag::Var<std::int64_t, ts::cuda>& target) {
        return nn::cross_entropy(model(input), target);
      },
      ag::input<float, ts::cuda>(x.shape()), ag::input<std::int64_t, ts::cuda>(labels.shape()),
      // The gradients in the arena: PyTorch's zero_grad() frees them before the forward (its
      // default, set_to_none), which its peak memory row counts on.
      ag::Options{.cuda_graph = state.range(1) == 3, .gradients_in_arena = true});
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.01, .momentum = 0.9});
  auto step = [&] {
    sgd.zero_grad();
    const float loss = program.forward(x, labels).item();
    program.backward();
    sgd.step();
    return loss;
  };
  ts::bench::time_resnet_steps(state, step, gpu0, allocated_before, program.plan().planned_bytes);
  // Where a step's time goes, over 5 steps: each phase to its end on the GPU, the host's time to
  // issue the backward (when it is most of the backward, the step is bound by the host), and the
  // kernel launches (executor passes) per step.
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  double forward = 0, backward = 0, backward_issue = 0, optimiser = 0, optimiser_issue = 0;
  const std::int64_t launches_before = ts::profiler::kernel_launches();
#if TESSERA_CUDNN
  const auto cudnn_before = ts::backend::cuda::conv2d_cudnn_calls();
#endif
  constexpr int steps = 5;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = clock::now();
    sgd.zero_grad();
    benchmark::DoNotOptimize(program.forward(x, labels).item());
    const auto t1 = clock::now();
    program.backward();
    const auto t2 = clock::now();
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto t3 = clock::now();
    sgd.step();
    const auto t3_issued = clock::now();
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto t4 = clock::now();
    forward += ms(t1 - t0) / steps;
    backward_issue += ms(t2 - t1) / steps;
    backward += ms(t3 - t1) / steps;
    optimiser += ms(t4 - t3) / steps;
    optimiser_issue += ms(t3_issued - t3) / steps;
  }
  state.counters["fwd_ms"] = forward;
  state.counters["bwd_ms"] = backward;
  state.counters["bwd_issue_ms"] = backward_issue;
  state.counters["sgd_ms"] = optimiser;
  // The host's share of the step that Options::cuda_graph leaves outside its graphs.
  state.counters["sgd_issue_ms"] = optimiser_issue;
  state.counters["launches"] =
      static_cast<double>(ts::profiler::kernel_launches() - launches_before) / steps;
#if TESSERA_CUDNN
  // cuDNN calls per step through kept plans and through the legacy API (the slow host path).
  const auto cudnn_after = ts::backend::cuda::conv2d_cudnn_calls();
  state.counters["plan_calls"] = static_cast<double>(cudnn_after.plan - cudnn_before.plan) / steps;
  state.counters["legacy_calls"] =
      static_cast<double>(cudnn_after.legacy - cudnn_before.legacy) / steps;
#endif
  // Where the step's time goes by node (ts::tools::Profile: events around each node on the
  // program's stream), once per row: at every batch and variant what ncu's kernel list gives at
  // batch 8 only. "share" is of the step range's device time.
  static std::set<std::pair<std::int64_t, std::int64_t>> profiled;
  if (profiled.insert({images, state.range(1)}).second) {
    ts::tools::Profile profile;
    {
      auto recording = profile.record();
      for (int i = 0; i < 3; ++i) {
        const ts::profiler::range whole("step", gpu0);
        step();
      }
    }
    std::printf("resnet50 step batch %lld, variant %lld (range(1)), by node over 3 steps:\n%s",
                static_cast<long long>(images), static_cast<long long>(state.range(1)),
                profile.table(18).c_str());
  }
  if (state.range(1) == 3) {
    std::printf("resnet50 step batch %lld, Options::cuda_graph: %s\n",
                static_cast<long long>(images), program.cuda_graphs().c_str());
  }
  ts::backends::cudnn::enabled = saved_cudnn;
  ts::backends::cudnn::benchmark = saved_benchmark;
}
BENCHMARK(BM_resnet50_step_tessera)
    ->Args({8, 1})
    ->Args({8, 0})
    ->Args({32, 1})
    ->Args({8, 2})
    ->Args({32, 2})
    ->Args({8, 3})
    ->Args({32, 3})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- host time per convolution call ------------------------------------------------------------
// What the host spends to issue one cuDNN convolution through Tessera (issue 41, item 3: goal
// <= 10 us), against launching an empty kernel: host_calls calls of a small problem enqueued back
// to back and timed with the host clock; the device is synchronised after each batch, outside
// the timing. A call keeps the GPU busy a few microseconds and a batch queues at most a few
// hundred launches, so the launch queue never fills and the host is what is measured.

constexpr int host_calls = 100;

__global__ void empty_kernel() {}

template <class Body>
void time_host_calls(benchmark::State& state, Body&& body) {
  using clock = std::chrono::steady_clock;
  body();  // first use: handles, lazy module loading
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  for (auto _ : state) {
    const auto start = clock::now();
    for (int i = 0; i < host_calls; ++i) body();
    const auto stop = clock::now();
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
  }
  state.counters["calls"] = host_calls;
}

void BM_host_per_call_empty_kernel(benchmark::State& state) {
  time_host_calls(state, [] { empty_kernel<<<1, 1>>>(); });
}
BENCHMARK(BM_host_per_call_empty_kernel)->UseManualTime()->Unit(benchmark::kMicrosecond);

#if TESSERA_CUDNN
/// The small problem the host-cost rows call: [1, 16, 14, 14] * [16, 16, 3, 3], padding 1.
struct host_cost_problem {
  ts::backend::cuda::conv2d_problem p{1, 16, 14, 14, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 14, 14};
  ts::Tensor<float, ts::cuda> x = ts::bench::random_tensor({1, 16, 14, 14}, 8).cuda();
  ts::Tensor<float, ts::cuda> w = ts::bench::random_tensor({16, 16, 3, 3}, 9).cuda();
  ts::Tensor<float, ts::cuda> y = ts::empty<float, ts::cuda>({1, 16, 14, 14});
  ts::backend::cuda::conv2d_algorithms a = ts::backend::cuda::conv2d_choose<float>(0, p);
  std::size_t workspace_bytes =
      std::max({a.forward_bytes, a.backward_data_bytes, a.backward_filter_bytes, std::size_t{1}});
  void* workspace = ts::memory::allocate(gpu0, workspace_bytes);
  host_cost_problem() {
    if (!a.usable) fail("host cost rows: cuDNN does not take the small problem");
    // What the rows call computes the convolution (against float64 on the CPU).
    ts::backend::cuda::conv2d_forward<float>(0, p, a, x.data(), w.data(), y.data(), workspace);
    const ts::Tensor<double> x64 = ts::cast<double>(x.cpu());
    const ts::Tensor<double> w64 = ts::cast<double>(w.cpu());
    const ts::Tensor<double> expected = nn::functional::conv2d(x64, w64, {.padding = 1});
    const auto got = y.cpu().to_vector();
    const auto want = expected.to_vector();
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (!(std::abs(got[i] - want[i]) <= 1e-4 * (1 + std::abs(want[i])))) {
        fail("host cost rows: element " + std::to_string(i) + " is " + std::to_string(got[i]) +
             ", float64 reference " + std::to_string(want[i]));
      }
    }
  }
  ~host_cost_problem() { ts::memory::deallocate(gpu0, workspace, workspace_bytes); }
};

/// range(0): 0 forward, 1 input gradient, 2 weight gradient, each as a compiled program's node
/// calls it (the chosen entry kept, the workspace given); range(1): 0 its kept execution plan
/// (the default), 1 cuDNN's legacy call (backends::cudnn::legacy_api), for comparison.
void BM_host_per_call_cudnn(benchmark::State& state) {
  host_cost_problem h;
  namespace cu = ts::backend::cuda;
  const bool legacy = state.range(1) != 0;
  const bool saved = ts::backends::cudnn::legacy_api.exchange(legacy);
  const std::int64_t engine = state.range(0) == 0   ? h.a.forward_engine
                              : state.range(0) == 1 ? h.a.backward_data_engine
                                                    : h.a.backward_filter_engine;
  if (!legacy && engine < 0) fail("host cost rows: no execution plan for the small problem");
  const auto before = cu::conv2d_cudnn_calls();
  switch (state.range(0)) {
    case 0:
      time_host_calls(state, [&] {
        cu::conv2d_forward<float>(0, h.p, h.a, h.x.data(), h.w.data(), h.y.data(), h.workspace);
      });
      break;
    case 1:
      time_host_calls(state, [&] {
        cu::conv2d_backward_data<float>(0, h.p, h.a, h.y.data(), h.w.data(), h.x.data(), false,
                                        h.workspace);
      });
      break;
    default:
      time_host_calls(state, [&] {
        cu::conv2d_backward_filter<float>(0, h.p, h.a, h.x.data(), h.y.data(), h.w.data(), false,
                                          h.workspace);
      });
  }
  const auto after = cu::conv2d_cudnn_calls();
  ts::backends::cudnn::legacy_api = saved;
  // What ran is what the row says.
  if ((legacy ? after.plan - before.plan : after.legacy - before.legacy) != 0) {
    fail(std::string("host cost rows: a call ran ") + (legacy ? "a plan" : "the legacy call"));
  }
}
BENCHMARK(BM_host_per_call_cudnn)
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

/// The forward as Tessera called it before the cache: the four descriptors built and destroyed
/// around each cudnnConvolutionForward. Tells apart the descriptors' share and cuDNN's own.
void BM_host_per_call_cudnn_fresh_descriptors(benchmark::State& state) {
  host_cost_problem h;
  namespace cu = ts::backend::cuda;
  cudnnHandle_t handle = nullptr;
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) fail("cudnnCreate");
  time_host_calls(state, [&] {
    const cu::detail::conv2d_descriptors d(h.p, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT,
                                           static_cast<cudnnMathType_t>(h.a.forward_math));
    const float alpha = 1, beta = 0;
    if (cudnnConvolutionForward(handle, &alpha, d.x, h.x.data(), d.w, h.w.data(), d.conv,
                                static_cast<cudnnConvolutionFwdAlgo_t>(h.a.forward), h.workspace,
                                h.a.forward_bytes, &beta, d.y,
                                h.y.data()) != CUDNN_STATUS_SUCCESS) {
      fail("cudnnConvolutionForward");
    }
  });
  cudnnDestroy(handle);
}
BENCHMARK(BM_host_per_call_cudnn_fresh_descriptors)->UseManualTime()->Unit(benchmark::kMicrosecond);

/// An eager ts::nn::functional::conv2d on tensors: the geometry, the cache lookup, the output
/// and workspace from the pool, and the call.
void BM_host_per_call_conv2d_eager(benchmark::State& state) {
  host_cost_problem h;
  time_host_calls(
      state, [&] { benchmark::DoNotOptimize(nn::functional::conv2d(h.x, h.w, {.padding = 1})); });
}
BENCHMARK(BM_host_per_call_conv2d_eager)->UseManualTime()->Unit(benchmark::kMicrosecond);
#endif

/// The host-cost rows' summary: microseconds per call, against the empty launch and the goal.
void print_host_per_call(const std::map<std::string, double>& results) {
  const auto empty = results.find("BM_host_per_call_empty_kernel");
  if (empty == results.end()) return;
  std::printf("host time per call (%d calls enqueued, small problem): empty kernel launch %.2f us",
              host_calls, empty->second / host_calls);
  const std::pair<const char*, const char*> rows[] = {
      {"cuDNN forward", "BM_host_per_call_cudnn/0/0"},
      {"input gradient", "BM_host_per_call_cudnn/1/0"},
      {"weight gradient", "BM_host_per_call_cudnn/2/0"},
      {"legacy calls: forward", "BM_host_per_call_cudnn/0/1"},
      {"input gradient", "BM_host_per_call_cudnn/1/1"},
      {"weight gradient", "BM_host_per_call_cudnn/2/1"},
      {"forward with descriptors built per call", "BM_host_per_call_cudnn_fresh_descriptors"},
      {"eager F::conv2d", "BM_host_per_call_conv2d_eager"}};
  double worst = 0;
  for (const auto& [what, row] : rows) {
    const auto it = results.find(row);
    if (it == results.end()) continue;
    std::printf("; %s %.2f us", what, it->second / host_calls);
    const std::string name = row;
    if (name.rfind("BM_host_per_call_cudnn/", 0) == 0 && name.substr(name.size() - 2) == "/0") {
      worst = std::max(worst, it->second / host_calls);
    }
  }
  if (worst > 0) std::printf(" (goal <= 10 us per cuDNN call: %s)", worst <= 10 ? "met" : "MISSED");
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (!ts::cuda::is_available()) {
    std::printf("cuda_bench: no CUDA device is available; nothing to measure\n");
    return 0;
  }
  // Float32 with TF32 off for matmul and cuDNN, as bench/cuda_torch_baseline.py sets PyTorch
  // (cuDNN's switch is on by default in both).
  ts::backends::cuda::matmul::allow_tf32 = false;
  ts::backends::cudnn::allow_tf32 = false;
  register_mlp_rows();
  register_conv_rows();
  benchmark::Initialize(&argc, argv);
  ts::bench::recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  auto results = reporter.results;  // milliseconds, but the pool rows: nanoseconds
  auto& bw = reporter.bandwidth;
  const double copy = bw.count("BM_copy_device_to_device") ? bw["BM_copy_device_to_device"] : 0;
  std::printf("\n");
  std::vector<std::string> bandwidth_rows = {"BM_mul_add_tessera",
                                             "BM_sum_product_tessera",
                                             "BM_row_sum/0",
                                             "BM_row_sum/1",
                                             "BM_row_sum/2",
                                             "BM_broadcast_subtract/0",
                                             "BM_broadcast_subtract/1",
                                             "BM_add_tessera/0",
                                             "BM_add_tessera/1",
                                             "BM_row_sum_primitive",
                                             "BM_copy_tessera/0",
                                             "BM_copy_tessera/1",
                                             "BM_copy_tessera/2",
                                             "BM_copy_tessera/3"};
  for (const char* form : {"0", "2"}) {
    for (const char* lanes : {"32", "64", "128", "256"}) {
      bandwidth_rows.push_back(std::string("BM_row_sum_lanes/") + form + "/" + lanes);
    }
  }
  for (const std::string& row : bandwidth_rows) {
    if (copy > 0 && bw.count(row)) {
      std::printf("%s: %.0f GB/s = %.2f of the device-to-device copy (%.0f GB/s)\n", row.c_str(),
                  bw[row], bw[row] / copy, copy);
    }
  }
  for (const char* size : {"4096", "1048576", "67108864"}) {
    const std::string s = std::string("/") + size;
    ts::bench::print_summary(
        results,
        {std::string("create+destroy ") + size + " bytes",
         {{"cudaMalloc+cudaFree / pool", "BM_alloc_tessera" + s, "BM_alloc_cudamalloc" + s, 1.0},
          {"cudaMallocAsync+cudaFreeAsync / pool", "BM_alloc_tessera" + s,
           "BM_alloc_cudamallocasync" + s, 1.0}}});
  }
  ts::bench::print_summary(
      results, {"matmul 4096 float",
                {{"cuBLAS / ts::matmul", "BM_matmul_tessera", "BM_matmul_cublas", 0.95}}});
  for (const layer& l : layers()) {
    ts::bench::print_summary(
        results,
        {"conv " + l.name + " (fwd+bwd, batch 8)",
         {{"im2col+cuBLAS / cuDNN", "conv_cudnn/" + l.name, "conv_im2col_cublas/" + l.name, 0}}});
  }
  for (std::size_t i = 0; i < bn_shapes().size(); ++i) {
    const std::string index = std::to_string(i);
    ts::bench::print_summary(results, {"batchnorm2d+relu " + bn_shapes()[i].name,
                                       {{"cuDNN's batch norm / Tessera's",
                                         "BM_batchnorm_relu/" + index,
                                         "BM_batchnorm_relu_cudnn/" + index, 1.0}}});
  }
  for (const mlp_config& c : mlp_configs()) {
    ts::bench::print_summary(
        results, {"MLP step " + c.name + ", bias and ReLU",
                  {{"as passes / as the products' epilogue", "mlp_step_tessera/" + c.name,
                    "mlp_step_tessera_no_epilogue/" + c.name, 0}}});
  }
  print_host_per_call(results);
  const auto torch = torch_rows();
  if (!torch.empty()) {
    for (const auto& [row, ms] : torch) results["torch/" + row] = ms;
    for (const mlp_config& c : mlp_configs()) {
      ts::bench::print_summary(
          results,
          {"MLP step " + c.name,
           {{"torch / tessera", "mlp_step_tessera/" + c.name, "torch/mlp_step/" + c.name, 1.0}}});
    }
    for (const layer& l : layers()) {
      ts::bench::print_summary(
          results, {"conv " + l.name,
                    {{"torch / tessera", "conv_cudnn/" + l.name, "torch/conv/" + l.name, 1.0}}});
    }
    for (std::size_t i = 0; i < bn_shapes().size(); ++i) {
      const std::string& name = bn_shapes()[i].name;
      ts::bench::print_summary(results,
                               {"batchnorm2d+relu " + name,
                                {{"torch / tessera", "BM_batchnorm_relu/" + std::to_string(i),
                                  "torch/bn_relu/" + name, 1.0}}});
    }
    ts::bench::print_summary(
        results, {"matmul 4096 float",
                  {{"torch / tessera", "BM_matmul_tessera", "torch/matmul_4096", 1.0}}});
    for (const char* images : {"8", "32"}) {
      const std::string row = std::string("BM_resnet50_step_tessera/") + images + "/1";
      const std::string torch_row = std::string("resnet50_step_b") + images;
      ts::bench::print_summary(results, {std::string("ResNet-50 step batch ") + images,
                                         {{"torch / tessera", row, "torch/" + torch_row, 1.0}}});
      // PyTorch's step captured whole in a CUDA graph, against Tessera's step as it runs today.
      ts::bench::print_summary(
          results, {std::string("ResNet-50 step batch ") + images,
                    {{"torch CUDA graph / tessera", row, "torch/" + torch_row + "_graph", 0}}});
      // Tessera's forward and backward replayed as CUDA graphs, against PyTorch eager and
      // PyTorch's whole step captured.
      const std::string graph_row = std::string("BM_resnet50_step_tessera/") + images + "/3";
      ts::bench::print_summary(
          results, {std::string("ResNet-50 step batch ") + images + ", Options::cuda_graph",
                    {{"torch / tessera", graph_row, "torch/" + torch_row, 1.0},
                     {"torch CUDA graph / tessera", graph_row, "torch/" + torch_row + "_graph", 1.0}}});
      // Both sides with cudnn.benchmark on (each convolution's engine timed once).
      ts::bench::print_summary(
          results, {std::string("ResNet-50 step batch ") + images + ", cudnn.benchmark on",
                    {{"torch / tessera", std::string("BM_resnet50_step_tessera/") + images + "/2",
                      "torch/" + torch_row + "_benchmark", 1.0}}});
      const std::string torch_peak = torch_row + "_peak_MiB";
      if (torch.count(torch_peak) && reporter.counters.count(row)) {
        const double ours = reporter.counters[row]["peak_MiB"];
        std::printf(
            "ResNet-50 step batch %s peak memory: %.0f MiB, torch %.0f MiB: %.2f of "
            "torch's (goal <= 0.8)\n",
            images, ours, torch.at(torch_peak), ours / torch.at(torch_peak));
      }
    }
  }
  benchmark::Shutdown();
  return 0;
}
