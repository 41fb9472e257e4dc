// Expression benchmarks against their baselines in the same run, all on ts::cpu::num_threads()
// threads; the ratios are printed at the end as throughputs relative to each baseline (baseline
// time / Tessera time: 1.00 is as fast, higher is better for Tessera).
// - Fused elementwise, 2^24 floats: `y = a*2 + b*c` and `y = sigmoid(a*b + c) * tanh(d)` into a
//   preallocated y (one pass, no allocation), against a hand-written OpenMP loop over the same
//   buffers (the bandwidth / compute limit), Eigen's Tensor module on a ThreadPoolDevice, and
//   LibTorch eager; a STREAM-style copy (y[i] = a[i]) as the machine's bandwidth reference.
// - Reduction: ts::sum(a * b) against OpenMP `reduction(+:acc)` loops, Eigen and LibTorch.
// - Broadcast: y[4096, 4096] = x + row[4096].
// - matmul: 1024 x 1024 float products through ts::matmul (CBLAS path), raw cblas_sgemm on the
//   same buffers, the built-in kernel (backend::cpu::gemm_fallback) and Eigen's GEMM.
// Each benchmark checks its output against a float64 reference after its timed loop and aborts
// on a mismatch: a benchmark that computes nothing must not report a time.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench_report.hpp"
#include "tessera/backend/cpu/gemm.hpp"
#include "tessera/backend/cpu/thread_pool.hpp"
#include "tessera/expr.hpp"
#include "tessera/tensor/factories.hpp"

#if defined(_OPENMP)
#include <omp.h>
// The hand loops' pragmas only where OpenMP is on (unknown pragmas are warnings, hence errors).
#define TESSERA_BENCH_OMP(text) _Pragma(text)
#else
#define TESSERA_BENCH_OMP(text)
#endif

#if TESSERA_BENCH_EIGEN
#define EIGEN_USE_THREADS  // ThreadPoolDevice
#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>
#endif

#if TESSERA_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace ts = tessera;

namespace {

int num_threads() { return ts::cpu::num_threads(); }

// benchmark::DoNotOptimize on a local copy: applied to a member, GCC 12 with Google Benchmark
// 1.7.1 can bind the asm operand to a stack temporary (see alloc_bench.cpp).
inline void keep(const void* pointer) {
  benchmark::DoNotOptimize(pointer);
  benchmark::ClobberMemory();
}
inline void keep_value(float value) { benchmark::DoNotOptimize(value); }

// Bytes read and written per call, reported as a rate: the "GB/s" column (10^9 bytes).
void set_traffic(benchmark::State& state, double bytes) {
  state.counters["GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = static_cast<double>(num_threads());
}

// Aborts when `got` is not within `tolerance` (relative, absolute below 1) of `expected`; NaN
// (the poison written before a run) never is. `index` is the element checked, -1 for a sum.
void expect_close(const char* benchmark, std::int64_t index, double got, double expected,
                  double tolerance) {
  if (std::abs(got - expected) <= tolerance * std::max(1.0, std::abs(expected))) return;
  const std::string what = index < 0 ? "the sum" : "element " + std::to_string(index);
  std::fprintf(stderr, "\n%s: wrong result: %s is %.9g, expected %.9g\n", benchmark, what.c_str(),
               got, expected);
  std::abort();
}

// Checks about 4000 elements spread over the whole output (every thread's part), last included.
template <class Reference>
void check_output(const char* benchmark, const float* y, std::int64_t count, Reference&& reference,
                  double tolerance = 1e-5) {
  for (std::int64_t i = 0; i < count; i += 4099) {
    expect_close(benchmark, i, y[i], reference(i), tolerance);
  }
  expect_close(benchmark, count - 1, y[count - 1], reference(count - 1), tolerance);
}

// NaN in every output element, so a contender that writes nothing fails its check.
void poison(const ts::Tensor<float>& y) {
  std::fill(y.data(), y.data() + y.numel(), std::numeric_limits<float>::quiet_NaN());
}

#if TESSERA_BENCH_EIGEN
// Eigen's Tensor module over the same buffers, on a pool of the same number of threads.
struct eigen_context {
  Eigen::ThreadPool pool{num_threads()};
  Eigen::ThreadPoolDevice device{&pool, num_threads()};
};
Eigen::ThreadPoolDevice& eigen_device() {
  static eigen_context context;
  return context.device;
}
template <int Rank>
using eigen_map = Eigen::TensorMap<Eigen::Tensor<float, Rank, Eigen::RowMajor, Eigen::Index>>;
template <int Rank>
using eigen_const_map =
    Eigen::TensorMap<Eigen::Tensor<const float, Rank, Eigen::RowMajor, Eigen::Index>>;
#endif

#if TESSERA_BENCH_TORCH
// A LibTorch tensor over a Tessera tensor's buffer (no copy).
at::Tensor torch_view(const ts::Tensor<float>& t) {
  std::vector<std::int64_t> sizes(t.shape().begin(), t.shape().end());
  return torch::from_blob(t.data(), sizes, torch::kFloat32);
}
#endif

// ---- fused elementwise expressions, 2^24 floats ----------------------------------------------

constexpr std::int64_t n = std::int64_t{1} << 24;
constexpr double float_bytes = sizeof(float);

struct elementwise_operands {
  ts::Tensor<float> a = ts::rand<float>({n});
  ts::Tensor<float> b = ts::rand<float>({n});
  ts::Tensor<float> c = ts::rand<float>({n});
  ts::Tensor<float> d = ts::rand<float>({n});
  ts::Tensor<float> y = ts::empty<float>({n});
};
elementwise_operands& elementwise() {
  static elementwise_operands instance;
  return instance;
}

// float64 references of the two expressions at element i.
double mul_add_reference(std::int64_t i) {
  const auto& x = elementwise();
  return 2.0 * x.a.data()[i] + double{x.b.data()[i]} * x.c.data()[i];
}
double gate_reference(std::int64_t i) {
  const auto& x = elementwise();
  const double z = double{x.a.data()[i]} * x.b.data()[i] + x.c.data()[i];
  return 1.0 / (1.0 + std::exp(-z)) * std::tanh(double{x.d.data()[i]});
}

// The bandwidth reference: read one array, write another (2 x 4 bytes per element).
void BM_stream_copy(benchmark::State& state) {
  auto& x = elementwise();
  const float* a = x.a.data();
  float* y = x.y.data();
  const int threads = num_threads();
  poison(x.y);
  for (auto _ : state) {
    TESSERA_BENCH_OMP("omp parallel for num_threads(threads)")
    for (std::int64_t i = 0; i < n; ++i) y[i] = a[i];
    keep(y);
  }
  (void)threads;  // unused without OpenMP
  check_output(
      __func__, y, n, [&](std::int64_t i) { return double{a[i]}; }, 0.0);
  set_traffic(state, 2 * n * float_bytes);
}
BENCHMARK(BM_stream_copy)->UseRealTime()->Unit(benchmark::kMillisecond);

// y = a*2 + b*c: three arrays read, one written (16 bytes per element).
constexpr double mul_add_bytes = 4 * n * float_bytes;

void BM_mul_add_tessera(benchmark::State& state) {
  auto& x = elementwise();
  poison(x.y);
  for (auto _ : state) {
    x.y = x.a * 2 + x.b * x.c;
    keep(x.y.data());
  }
  check_output(__func__, x.y.data(), n, mul_add_reference);
  set_traffic(state, mul_add_bytes);
}
BENCHMARK(BM_mul_add_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_mul_add_hand_loop(benchmark::State& state) {
  auto& x = elementwise();
  const float *a = x.a.data(), *b = x.b.data(), *c = x.c.data();
  float* y = x.y.data();
  const int threads = num_threads();
  poison(x.y);
  for (auto _ : state) {
    TESSERA_BENCH_OMP("omp parallel for num_threads(threads)")
    for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] * 2.0f + b[i] * c[i];
    keep(y);
  }
  (void)threads;
  check_output(__func__, y, n, mul_add_reference);
  set_traffic(state, mul_add_bytes);
}
BENCHMARK(BM_mul_add_hand_loop)->UseRealTime()->Unit(benchmark::kMillisecond);

#if TESSERA_BENCH_EIGEN
void BM_mul_add_eigen(benchmark::State& state) {
  auto& x = elementwise();
  eigen_const_map<1> a(x.a.data(), n), b(x.b.data(), n), c(x.c.data(), n);
  eigen_map<1> y(x.y.data(), n);
  auto& device = eigen_device();
  poison(x.y);
  for (auto _ : state) {
    y.device(device) = a * 2.0f + b * c;
    keep(y.data());
  }
  check_output(__func__, x.y.data(), n, mul_add_reference);
  set_traffic(state, mul_add_bytes);
}
BENCHMARK(BM_mul_add_eigen)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

#if TESSERA_BENCH_TORCH
// Eager, as PyTorch users write it: each operator is a pass with a new result tensor.
void BM_mul_add_torch(benchmark::State& state) {
  auto& x = elementwise();
  c10::InferenceMode inference;
  const at::Tensor a = torch_view(x.a), b = torch_view(x.b), c = torch_view(x.c);
  at::Tensor y;
  for (auto _ : state) {
    y = a * 2 + b * c;
    keep(y.data_ptr());
  }
  check_output(__func__, y.data_ptr<float>(), n, mul_add_reference);
  set_traffic(state, mul_add_bytes);
}
BENCHMARK(BM_mul_add_torch)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

// y = sigmoid(a*b + c) * tanh(d): four arrays read, one written (20 bytes per element), and an
// exp and a tanh per element, which make it compute-bound on few cores.
constexpr double gate_bytes = 5 * n * float_bytes;

void BM_gate_tessera(benchmark::State& state) {
  auto& x = elementwise();
  poison(x.y);
  for (auto _ : state) {
    x.y = ts::sigmoid(x.a * x.b + x.c) * ts::tanh(x.d);
    keep(x.y.data());
  }
  check_output(__func__, x.y.data(), n, gate_reference);
  set_traffic(state, gate_bytes);
}
BENCHMARK(BM_gate_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_gate_hand_loop(benchmark::State& state) {
  auto& x = elementwise();
  const float *a = x.a.data(), *b = x.b.data(), *c = x.c.data(), *d = x.d.data();
  float* y = x.y.data();
  const int threads = num_threads();
  poison(x.y);
  for (auto _ : state) {
    TESSERA_BENCH_OMP("omp parallel for num_threads(threads)")
    for (std::int64_t i = 0; i < n; ++i) {
      y[i] = 1.0f / (1.0f + std::exp(-(a[i] * b[i] + c[i]))) * std::tanh(d[i]);
    }
    keep(y);
  }
  (void)threads;
  check_output(__func__, y, n, gate_reference);
  set_traffic(state, gate_bytes);
}
BENCHMARK(BM_gate_hand_loop)->UseRealTime()->Unit(benchmark::kMillisecond);

#if TESSERA_BENCH_EIGEN
void BM_gate_eigen(benchmark::State& state) {
  auto& x = elementwise();
  eigen_const_map<1> a(x.a.data(), n), b(x.b.data(), n), c(x.c.data(), n), d(x.d.data(), n);
  eigen_map<1> y(x.y.data(), n);
  auto& device = eigen_device();
  poison(x.y);
  for (auto _ : state) {
    y.device(device) = (a * b + c).sigmoid() * d.tanh();
    keep(y.data());
  }
  check_output(__func__, x.y.data(), n, gate_reference);
  set_traffic(state, gate_bytes);
}
BENCHMARK(BM_gate_eigen)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

#if TESSERA_BENCH_TORCH
void BM_gate_torch(benchmark::State& state) {
  auto& x = elementwise();
  c10::InferenceMode inference;
  const at::Tensor a = torch_view(x.a), b = torch_view(x.b), c = torch_view(x.c),
                   d = torch_view(x.d);
  at::Tensor y;
  for (auto _ : state) {
    y = torch::sigmoid(a * b + c) * torch::tanh(d);
    keep(y.data_ptr());
  }
  check_output(__func__, y.data_ptr<float>(), n, gate_reference);
  set_traffic(state, gate_bytes);
}
BENCHMARK(BM_gate_torch)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

// ---- reduction: sum(a * b) over 2^24 floats ---------------------------------------------------

constexpr double sum_bytes = 2 * n * float_bytes;

// The float64 sum of a[i] * b[i], computed once.
double sum_reference() {
  static const double value = [] {
    const auto& x = elementwise();
    double total = 0;
    for (std::int64_t i = 0; i < n; ++i) total += double{x.a.data()[i]} * x.b.data()[i];
    return total;
  }();
  return value;
}

// Checks a float sum of the 2^24 products against the float64 sum. Blocked or pairwise sums
// (Tessera, Eigen, LibTorch) stay within 1e-3. The hand loops add values near 0.25 into one float
// accumulator per thread (per lane with simd), which drifts: 0.7% with 2 threads and 2.2% with
// 1 thread here, hence their 5%. Either still tells the whole sum from part of it or none.
void check_sum(const char* benchmark, float got, double tolerance = 1e-3) {
  expect_close(benchmark, -1, got, sum_reference(), tolerance);
}
constexpr double hand_loop_sum_tolerance = 5e-2;

void BM_sum_product_tessera(benchmark::State& state) {
  const auto& x = elementwise();
  float s = 0;
  for (auto _ : state) {
    s = ts::sum(x.a * x.b).item();
    keep_value(s);
  }
  check_sum(__func__, s);
  set_traffic(state, sum_bytes);
}
BENCHMARK(BM_sum_product_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);

// As the issue words it: `reduction(+:acc)`, scalar adds in order within each thread (GCC does
// not reorder float additions to vectorise without permission).
void BM_sum_product_hand_loop(benchmark::State& state) {
  const auto& x = elementwise();
  const float *a = x.a.data(), *b = x.b.data();
  const int threads = num_threads();
  float s = 0;
  for (auto _ : state) {
    float acc = 0;
    TESSERA_BENCH_OMP("omp parallel for reduction(+ : acc) num_threads(threads)")
    for (std::int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
    s = acc;
    keep_value(s);
  }
  (void)threads;
  check_sum(__func__, s, hand_loop_sum_tolerance);
  set_traffic(state, sum_bytes);
}
BENCHMARK(BM_sum_product_hand_loop)->UseRealTime()->Unit(benchmark::kMillisecond);

// The same loop with `simd`: vector accumulators, the reduction's bandwidth limit.
void BM_sum_product_hand_loop_simd(benchmark::State& state) {
  const auto& x = elementwise();
  const float *a = x.a.data(), *b = x.b.data();
  const int threads = num_threads();
  float s = 0;
  for (auto _ : state) {
    float acc = 0;
    TESSERA_BENCH_OMP("omp parallel for simd reduction(+ : acc) num_threads(threads)")
    for (std::int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
    s = acc;
    keep_value(s);
  }
  (void)threads;
  check_sum(__func__, s, hand_loop_sum_tolerance);
  set_traffic(state, sum_bytes);
}
BENCHMARK(BM_sum_product_hand_loop_simd)->UseRealTime()->Unit(benchmark::kMillisecond);

#if TESSERA_BENCH_EIGEN
void BM_sum_product_eigen(benchmark::State& state) {
  const auto& x = elementwise();
  eigen_const_map<1> a(x.a.data(), n), b(x.b.data(), n);
  Eigen::Tensor<float, 0, Eigen::RowMajor, Eigen::Index> total;
  auto& device = eigen_device();
  float s = 0;
  for (auto _ : state) {
    total.device(device) = (a * b).sum();
    s = total();
    keep_value(s);
  }
  check_sum(__func__, s);
  set_traffic(state, sum_bytes);
}
BENCHMARK(BM_sum_product_eigen)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

#if TESSERA_BENCH_TORCH
// (a * b).sum() stores a * b first: LibTorch has no fused product-sum in eager mode.
void BM_sum_product_torch(benchmark::State& state) {
  const auto& x = elementwise();
  c10::InferenceMode inference;
  const at::Tensor a = torch_view(x.a), b = torch_view(x.b);
  float s = 0;
  for (auto _ : state) {
    s = (a * b).sum().item<float>();
    keep_value(s);
  }
  check_sum(__func__, s);
  set_traffic(state, sum_bytes);
}
BENCHMARK(BM_sum_product_torch)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

// ---- broadcast: y[4096, 4096] = x + row[4096] ------------------------------------------------

constexpr std::int64_t side = 4096;
constexpr double broadcast_bytes = (2 * side * side + side) * float_bytes;

struct broadcast_operands {
  ts::Tensor<float> x = ts::rand<float>({side, side});
  ts::Tensor<float> row = ts::rand<float>({side});
  ts::Tensor<float> y = ts::empty<float>({side, side});
};
broadcast_operands& broadcast() {
  static broadcast_operands instance;
  return instance;
}
double broadcast_reference(std::int64_t i) {
  const auto& x = broadcast();
  return double{x.x.data()[i]} + x.row.data()[i % side];
}

void BM_broadcast_add_tessera(benchmark::State& state) {
  auto& x = broadcast();
  poison(x.y);
  for (auto _ : state) {
    x.y = x.x + x.row;
    keep(x.y.data());
  }
  check_output(__func__, x.y.data(), side * side, broadcast_reference);
  set_traffic(state, broadcast_bytes);
}
BENCHMARK(BM_broadcast_add_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_broadcast_add_hand_loop(benchmark::State& state) {
  auto& x = broadcast();
  const float *in = x.x.data(), *row = x.row.data();
  float* y = x.y.data();
  const int threads = num_threads();
  poison(x.y);
  for (auto _ : state) {
    TESSERA_BENCH_OMP("omp parallel for num_threads(threads)")
    for (std::int64_t r = 0; r < side; ++r) {
      const float* in_row = in + r * side;
      float* y_row = y + r * side;
      for (std::int64_t j = 0; j < side; ++j) y_row[j] = in_row[j] + row[j];
    }
    keep(y);
  }
  (void)threads;
  check_output(__func__, y, side * side, broadcast_reference);
  set_traffic(state, broadcast_bytes);
}
BENCHMARK(BM_broadcast_add_hand_loop)->UseRealTime()->Unit(benchmark::kMillisecond);

#if TESSERA_BENCH_EIGEN
void BM_broadcast_add_eigen(benchmark::State& state) {
  auto& x = broadcast();
  eigen_const_map<2> in(x.x.data(), side, side), row(x.row.data(), 1, side);
  eigen_map<2> y(x.y.data(), side, side);
  const Eigen::array<Eigen::Index, 2> rows{side, 1};
  auto& device = eigen_device();
  poison(x.y);
  for (auto _ : state) {
    y.device(device) = in + row.broadcast(rows);
    keep(y.data());
  }
  check_output(__func__, x.y.data(), side * side, broadcast_reference);
  set_traffic(state, broadcast_bytes);
}
BENCHMARK(BM_broadcast_add_eigen)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

#if TESSERA_BENCH_TORCH
void BM_broadcast_add_torch(benchmark::State& state) {
  auto& x = broadcast();
  c10::InferenceMode inference;
  const at::Tensor in = torch_view(x.x), row = torch_view(x.row);
  at::Tensor y;
  for (auto _ : state) {
    y = in + row;
    keep(y.data_ptr());
  }
  check_output(__func__, y.data_ptr<float>(), side * side, broadcast_reference);
  set_traffic(state, broadcast_bytes);
}
BENCHMARK(BM_broadcast_add_torch)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

// ---- a channel's scale and shift: y = relu(x * scale[1, C, 1] + shift[1, C, 1]) ------------------
// BatchNorm2d's pass with its ReLU over [8, 256, 56 * 56]: the scale and shift are broadcast along
// each row, which the CPU executor runs in blocks with the broadcast operands copied (before,
// this layout took the scalar strided loop).

constexpr std::int64_t affine_n = 8, affine_c = 256, affine_hw = 56 * 56;
constexpr double affine_bytes = 2.0 * affine_n * affine_c * affine_hw * float_bytes;

struct affine_operands {
  ts::Tensor<float> x = ts::randn<float>({affine_n, affine_c, affine_hw});
  ts::Tensor<float> scale = ts::randn<float>({1, affine_c, 1});
  ts::Tensor<float> shift = ts::randn<float>({1, affine_c, 1});
  ts::Tensor<float> y = ts::empty<float>({affine_n, affine_c, affine_hw});
};
affine_operands& affine() {
  static affine_operands instance;
  return instance;
}
double affine_reference(std::int64_t i) {
  const auto& x = affine();
  const std::int64_t c = i / affine_hw % affine_c;
  const double v = double{x.x.data()[i]} * x.scale.data()[c] + x.shift.data()[c];
  return v > 0 ? v : 0;
}

void BM_channel_affine_tessera(benchmark::State& state) {
  auto& x = affine();
  poison(x.y);
  for (auto _ : state) {
    x.y = ts::relu(x.x * x.scale + x.shift);
    keep(x.y.data());
  }
  check_output(__func__, x.y.data(), affine_n * affine_c * affine_hw, affine_reference);
  set_traffic(state, affine_bytes);
}
BENCHMARK(BM_channel_affine_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_channel_affine_hand_loop(benchmark::State& state) {
  auto& x = affine();
  const float *in = x.x.data(), *scale = x.scale.data(), *shift = x.shift.data();
  float* y = x.y.data();
  const int threads = num_threads();
  poison(x.y);
  for (auto _ : state) {
    TESSERA_BENCH_OMP("omp parallel for num_threads(threads)")
    for (std::int64_t r = 0; r < affine_n * affine_c; ++r) {
      const float a = scale[r % affine_c], b = shift[r % affine_c];
      const float* in_row = in + r * affine_hw;
      float* y_row = y + r * affine_hw;
      for (std::int64_t j = 0; j < affine_hw; ++j) {
        const float v = in_row[j] * a + b;
        y_row[j] = v > 0 ? v : 0;
      }
    }
    keep(y);
  }
  (void)threads;
  check_output(__func__, y, affine_n * affine_c * affine_hw, affine_reference);
  set_traffic(state, affine_bytes);
}
BENCHMARK(BM_channel_affine_hand_loop)->UseRealTime()->Unit(benchmark::kMillisecond);

#if TESSERA_BENCH_TORCH
void BM_channel_affine_torch(benchmark::State& state) {
  auto& x = affine();
  c10::InferenceMode inference;
  const at::Tensor in = torch_view(x.x), scale = torch_view(x.scale), shift = torch_view(x.shift);
  at::Tensor y;
  for (auto _ : state) {
    y = at::relu(in * scale + shift);
    keep(y.data_ptr());
  }
  check_output(__func__, y.data_ptr<float>(), affine_n * affine_c * affine_hw, affine_reference);
  set_traffic(state, affine_bytes);
}
BENCHMARK(BM_channel_affine_torch)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

// ---- matmul ------------------------------------------------------------------------------------

constexpr std::int64_t matmul_size = 1024;

// Operands and an output, filled once; every contender reads and writes the same buffers.
struct matmul_operands {
  ts::Tensor<float> a, b, c;
  matmul_operands() {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> values(static_cast<std::size_t>(matmul_size * matmul_size));
    for (auto& v : values) v = u(rng);
    a = ts::from_vector<float>(values, {matmul_size, matmul_size});
    for (auto& v : values) v = u(rng);
    b = ts::from_vector<float>(values, {matmul_size, matmul_size});
    c = ts::zeros<float>({matmul_size, matmul_size});
  }
};

matmul_operands& operands() {
  static matmul_operands instance;
  return instance;
}

void set_flops(benchmark::State& state) {
  const double n = static_cast<double>(matmul_size);
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * n * n * n / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = static_cast<double>(ts::cpu::num_threads());
}

// ts::matmul as users call it: checks, layout analysis, a new output tensor from the pool, then
// cblas_sgemm (the built-in kernel when the build has no BLAS).
void BM_matmul_tessera(benchmark::State& state) {
  auto& x = operands();
  for (auto _ : state) {
    auto out = ts::matmul(x.a, x.b);
    benchmark::DoNotOptimize(out.data());
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);

// ts::matmul of transposed views (Trans x Trans): no copies, the same cblas_sgemm underneath.
void BM_matmul_tessera_transposed(benchmark::State& state) {
  auto& x = operands();
  for (auto _ : state) {
    auto out = ts::matmul(x.b.t(), x.a.t());
    benchmark::DoNotOptimize(out.data());
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_tessera_transposed)->UseRealTime()->Unit(benchmark::kMillisecond);

// The built-in kernel on the same buffers, called directly (as ts::matmul does without a BLAS).
void BM_matmul_fallback(benchmark::State& state) {
  auto& x = operands();
  namespace cpu = ts::backend::cpu;
  const std::int64_t n = matmul_size;
  for (auto _ : state) {
    cpu::gemm_fallback<float>({1, n, n, n}, {x.a.data(), 0, n, 1}, {x.b.data(), 0, n, 1},
                              {x.c.data(), 0, n});
    benchmark::ClobberMemory();
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_fallback)->UseRealTime()->Unit(benchmark::kMillisecond);

#if TESSERA_GEMM_HAS_BLAS
// The baseline: cblas_sgemm on the same buffers, row-major, no transposes.
void BM_matmul_openblas(benchmark::State& state) {
  auto& x = operands();
  const int n = static_cast<int>(matmul_size);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, x.a.data(), n, x.b.data(),
                n, 0.0f, x.c.data(), n);
    benchmark::ClobberMemory();
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_openblas)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

#if TESSERA_BENCH_EIGEN
// Eigen's own GEMM on the same buffers (row-major maps), threaded by OpenMP like Tessera.
void BM_matmul_eigen(benchmark::State& state) {
  auto& x = operands();
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Index n = matmul_size;
  Eigen::Map<const matrix> a(x.a.data(), n, n), b(x.b.data(), n, n);
  Eigen::Map<matrix> c(x.c.data(), n, n);
  Eigen::setNbThreads(ts::cpu::num_threads());
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::ClobberMemory();
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_eigen)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

// ---- reporting ---------------------------------------------------------------------------------

using tessera::bench::comparison;
using tessera::bench::print_summary;
using tessera::bench::recording_reporter;
using tessera::bench::summary_line;

// Add a comparison here for each new contender/baseline pair.
const std::vector<summary_line>& summary_lines() {
  static const std::vector<summary_line> lines = {
      {"a*2+b*c",
       {{"tessera / hand loop", "BM_mul_add_tessera", "BM_mul_add_hand_loop", 0.9},
        {"tessera / eigen", "BM_mul_add_tessera", "BM_mul_add_eigen", 1.0},
        {"tessera / torch", "BM_mul_add_tessera", "BM_mul_add_torch", 4.0}}},
      {"sigmoid(a*b+c)*tanh(d)",
       {{"tessera / hand loop", "BM_gate_tessera", "BM_gate_hand_loop", 0.9},
        {"tessera / eigen", "BM_gate_tessera", "BM_gate_eigen", 1.0},
        {"tessera / torch", "BM_gate_tessera", "BM_gate_torch", 4.0}}},
      {"sum(a*b)",
       {{"tessera / hand loop", "BM_sum_product_tessera", "BM_sum_product_hand_loop", 0.85},
        {"tessera / hand loop (omp simd)", "BM_sum_product_tessera",
         "BM_sum_product_hand_loop_simd", 0},
        {"tessera / eigen", "BM_sum_product_tessera", "BM_sum_product_eigen", 0},
        {"tessera / torch", "BM_sum_product_tessera", "BM_sum_product_torch", 2.0}}},
      {"x[4096,4096]+row[4096]",
       {{"tessera / hand loop", "BM_broadcast_add_tessera", "BM_broadcast_add_hand_loop", 0.9},
        {"tessera / eigen", "BM_broadcast_add_tessera", "BM_broadcast_add_eigen", 1.0},
        {"tessera / torch", "BM_broadcast_add_tessera", "BM_broadcast_add_torch", 4.0}}},
      {"relu(x[8,256,3136]*scale[256]+shift[256])",
       {{"tessera / hand loop", "BM_channel_affine_tessera", "BM_channel_affine_hand_loop", 0.9},
        {"tessera / torch", "BM_channel_affine_tessera", "BM_channel_affine_torch", 0}}},
      {"matmul",
       {{"matmul / openblas", "BM_matmul_tessera", "BM_matmul_openblas", 0.95},
        {"matmul of transposed views / openblas", "BM_matmul_tessera_transposed",
         "BM_matmul_openblas", 0.95},
        {"fallback / openblas", "BM_matmul_fallback", "BM_matmul_openblas", 0.3},
        {"eigen / openblas", "BM_matmul_eigen", "BM_matmul_openblas", 0},
        {"fallback / eigen", "BM_matmul_fallback", "BM_matmul_eigen", 0}}},
  };
  return lines;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The same threads for every contender: Tessera's loops use cpu::num_threads(); the hand loops
  // name it in their pragmas; Eigen's pool is built with it.
  const int threads = ts::cpu::num_threads();
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#endif
#if TESSERA_BENCH_TORCH
  at::set_num_threads(threads);
#endif
#if TESSERA_GEMM_HAS_BLAS && defined(OPENBLAS_VERSION)
  // ts::matmul does this on its own too.
  openblas_set_num_threads(threads);
#endif
  recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  if (!reporter.bandwidth.empty()) {
    std::printf("\nbandwidth (GB/s = 10^9 bytes read + written per second):\n");
    for (const auto& [name, rate] : reporter.bandwidth)
      std::printf("  %-32s %7.2f\n", name.c_str(), rate);
  }
  std::printf(
      "\nthroughput ratios (baseline time / tessera time, higher is better for tessera; "
      "%d threads everywhere):\n",
      threads);
  for (const summary_line& line : summary_lines()) print_summary(reporter.results, line);
#if !defined(_OPENMP)
  std::printf("openmp: built without OpenMP; every contender but LibTorch ran on one thread\n");
#endif
#if !TESSERA_GEMM_HAS_BLAS
  std::printf("openblas: no BLAS at configure time (TESSERA_WITH_BLAS found none)\n");
#endif
#if !TESSERA_BENCH_EIGEN
  std::printf("eigen: Eigen3 not found at configure time\n");
#endif
#if !TESSERA_BENCH_TORCH
  std::printf("torch: LibTorch not found at configure time\n");
#endif
  return 0;
}
