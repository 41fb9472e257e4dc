// The multi-device runtime against its physical limits, in one run (two virtual CPU devices):
// - all_reduce (sum) of 64 MiB of float over cpu:0 and cpu:1: bus bandwidth (NCCL's definition,
//   algorithm bandwidth x 2(n-1)/n) over the bandwidth of a 64 MiB memcpy; against the same
//   reduction as one hand-written loop on the same two threads (its STREAM-style limit); and the
//   speedup over the same reduction done by one thread;
// - tensor create + destroy (4 KiB) from 2 threads on one device against malloc/free from 2
//   threads;
// - one training step (forward, backward, SGD) of an MLP 784-1024-10 at batch 256 against the
//   same step's five matrix products done by raw cblas_sgemm calls (the GEMM limit), default
//   environment and threads; and against LibTorch's eager step (same weights, data and loss)
//   when LibTorch is found;
// - DataParallel training step over 2 devices with 1 thread each against one device with one
//   thread, and the share of its time spent outside the replicas' programs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "bench_report.hpp"
#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

#if TESSERA_BLAS
#include <cblas.h>
#endif
#if TESSERA_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

namespace {

constexpr std::int64_t all_reduce_floats = std::int64_t{16} << 20;  // 64 MiB
constexpr auto all_reduce_bytes = static_cast<double>(all_reduce_floats * 4);

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

void memcpy_64mib(benchmark::State& state) {
  std::vector<float> src(static_cast<std::size_t>(all_reduce_floats), 1.0f);
  std::vector<float> dst(static_cast<std::size_t>(all_reduce_floats), 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), static_cast<std::size_t>(all_reduce_bytes));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, all_reduce_bytes);
}

// Bus bandwidth: size / time x 2(n-1)/n, n = 2 members (NCCL's tests' definition).
void all_reduce_2_devices(benchmark::State& state) {
  ts::parallel::Communicator<ts::cpu> comm({0, 1});
  std::vector<ts::Tensor<float>> tensors{ts::full<float>({all_reduce_floats}, 1.0f, 0),
                                         ts::full<float>({all_reduce_floats}, 2.0f, 1)};
  for (auto _ : state) {
    comm.all_reduce(tensors);
    benchmark::ClobberMemory();
  }
  set_bytes(state, all_reduce_bytes * 2.0 * (2 - 1) / 2);
}

// The all_reduce's work written by hand: the two devices' threads (the same DeviceThreads the
// communicator uses) each take half of the elements and run a[i] = b[i] = a[i] + b[i] over it,
// one loop the compiler vectorises: both buffers read once and written once, the least traffic
// an in-place all_reduce can make. The STREAM-style reference for the all_reduce.
void hand_all_reduce_2_threads(benchmark::State& state) {
  ts::parallel::DeviceThreads<ts::cpu> threads({0, 1});
  std::vector<float> a(static_cast<std::size_t>(all_reduce_floats));
  std::vector<float> b(static_cast<std::size_t>(all_reduce_floats));
  const std::int64_t half = all_reduce_floats / 2;
  auto each_half = [&](auto&& body) {
    threads.run([&](int member) {
      const std::int64_t first = member * half;
      body(a.data() + first, b.data() + first, member == 0 ? half : all_reduce_floats - half);
    });
  };
  // Each half first touched by the thread that reduces it, as the communicator's tensors are.
  each_half([](float* x, float* y, std::int64_t n) {
    std::fill(x, x + n, 1.0f);
    std::fill(y, y + n, 2.0f);
  });
  for (auto _ : state) {
    each_half([](float* __restrict x, float* __restrict y, std::int64_t n) {
      for (std::int64_t i = 0; i < n; ++i) x[i] = y[i] = x[i] + y[i];
    });
    benchmark::ClobberMemory();
  }
  set_bytes(state, all_reduce_bytes * 2.0 * (2 - 1) / 2);
}

// The same in-place reduction of two buffers done by the calling thread alone.
void all_reduce_one_thread(benchmark::State& state) {
  auto a = ts::full<float>({all_reduce_floats}, 1.0f, 0);
  auto b = ts::full<float>({all_reduce_floats}, 2.0f, 1);
  const float* sources[] = {a.data(), b.data()};
  float* targets[] = {a.data(), b.data()};
  for (auto _ : state) {
    ts::parallel::detail::reduce_elements(ts::parallel::ReduceOp::sum, sources, 2, targets, 2, 0,
                                          all_reduce_floats);
    benchmark::ClobberMemory();
  }
  set_bytes(state, all_reduce_bytes * 2.0 * (2 - 1) / 2);
}

constexpr std::int64_t small_floats = 1024;  // 4 KiB

void tensor_create_destroy(benchmark::State& state) {
  for (auto _ : state) {
    auto t = ts::empty<float>({small_floats}, 0);
    benchmark::DoNotOptimize(t.data());
  }
}

void malloc_free(benchmark::State& state) {
  for (auto _ : state) {
    void* p = std::malloc(small_floats * sizeof(float));
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}

// MLP 784-1024-10, batch 256: Linear, ReLU, Linear, cross entropy, SGD.
struct mlp {
  nn::Linear<float> fc1{784, 1024}, fc2{1024, 10};
  template <class X>
  auto forward(const X& x) const {
    return fc2(ts::relu(fc1(x)));
  }
  std::vector<nn::ParameterRef> parameters() const {
    return {fc1.weight(), fc1.bias(), fc2.weight(), fc2.bias()};
  }
};
constexpr std::int64_t batch = 256;

// Class i % 10 for sample i.
std::vector<std::int64_t> mlp_labels() {
  std::vector<std::int64_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int64_t>(i % 10);
  return labels;
}

void mlp_step_tessera(benchmark::State& state) {
  ts::manual_seed(0);
  mlp net;
  const auto x = ts::randn<float>({batch, 784});
  const auto targets = ts::from_vector<std::int64_t>(mlp_labels(), {batch});
  auto step = ag::compile([&](ag::Var<float> in) { return nn::cross_entropy(net.forward(in), targets); },
                          ag::input<float>({batch, 784}));
  ts::optim::SGD sgd(net.parameters(), {.lr = 0.01});
  for (auto _ : state) {
    sgd.zero_grad();
    benchmark::DoNotOptimize(step.forward(x).data());
    step.backward();
    sgd.step();
  }
}

// DataParallel: an MLP 784-1024-1024-10 training step (forward and backward, cross entropy) at
// batch 256 on one device with one thread, against DataParallel over cpu:0 and cpu:1 with one
// thread each (the machine's 2 cores), and against the two replicas' own programs run at once on
// their pre-split pieces (the part of a DataParallel step that is not scatter, copies of the
// parameters into the replicas and the gradients' reduction).
struct mlp_deep {
  nn::Sequential<nn::Linear<float>, nn::ReLU, nn::Linear<float>, nn::ReLU, nn::Linear<float>> net{
      nn::Linear<float>(784, 1024), nn::ReLU{}, nn::Linear<float>(1024, 1024), nn::ReLU{},
      nn::Linear<float>(1024, 10)};
};
auto deep_loss = [](auto& model, ag::Var<float> in, ag::Var<std::int64_t> labels) {
  return nn::cross_entropy(model(in), labels);
};

// One device with one thread: the whole batch in one compiled program.
struct dp_one_device {
  mlp_deep m;
  ts::Tensor<float> x;
  ts::Tensor<std::int64_t> y;
  ag::Program<ts::Tensor<float>> step;
  dp_one_device()
      : m(seeded()),
        x(ts::randn<float>({batch, 784})),
        y(ts::from_vector<std::int64_t>(mlp_labels(), {batch})),
        step(ag::compile([this](ag::Var<float> in, ag::Var<std::int64_t> labels) {
          return deep_loss(m.net, in, labels);
        }, ag::input<float>({batch, 784}), ag::input<std::int64_t>({batch}))) {}
  static mlp_deep seeded() {
    ts::manual_seed(0);
    return mlp_deep{};
  }
  void run() {
    m.net.zero_grad();
    benchmark::DoNotOptimize(step.forward(x, y).data());
    step.backward();
  }
  // The thread counts it runs with (and restores).
  void begin() { ts::cpu::set_num_threads(1); }
  void end() { ts::cpu::set_num_threads(ts::cpu::core_count()); }
};

// One thread for each device, whatever else runs (the main thread's own loops, zero_grad here,
// run on cpu:0's one thread too, so no OpenMP team of two spins beside the devices' threads).
void one_thread_per_device(int threads) {
  ts::cpu::set_num_threads(threads, 0);
  ts::cpu::set_num_threads(threads, 1);
}

// A DataParallel step over cpu:0 and cpu:1; with `replicas_only`, just the two replicas' own
// programs, run at once on pieces split beforehand (no copies of pieces, no hand-off between
// forward and backward, no sums of biases). The weights' gradients are computed by both
// programs into the module's (DataParallel's fused products), so that work is in both rows.
struct dp_two_devices {
  mlp_deep m;
  ts::Tensor<float> x;
  ts::Tensor<std::int64_t> y;
  ts::parallel::DataParallel<decltype(mlp_deep::net)> dp;
  decltype(dp.compile(deep_loss, ag::input<float>({1, 784}), ag::input<std::int64_t>({1}))) step;
  std::vector<ts::Tensor<float>> xs;
  std::vector<ts::Tensor<std::int64_t>> ys;
  ts::parallel::DeviceThreads<ts::cpu> threads{{0, 1}};
  bool replicas_only;
  explicit dp_two_devices(bool replicas_only_)
      : m(dp_one_device::seeded()),
        x(ts::randn<float>({batch, 784})),
        y(ts::from_vector<std::int64_t>(mlp_labels(), {batch})),
        dp(m.net, {0, 1}),
        step(dp.compile(deep_loss, ag::input<float>({batch, 784}),
                        ag::input<std::int64_t>({batch}))),
        replicas_only(replicas_only_) {
    const std::int64_t half = batch / 2;
    xs = {x.narrow(0, 0, half).contiguous(), x.narrow(0, half, half).to(1)};
    ys = {y.narrow(0, 0, half).contiguous(), y.narrow(0, half, half).to(1)};
  }
  void run() {
    if (!replicas_only) {
      dp.module().zero_grad();
      benchmark::DoNotOptimize(step.forward(x, y).data());
      step.backward();
    } else {
      threads.run([&](int member) {
        const auto i = static_cast<std::size_t>(member);
        benchmark::DoNotOptimize(step.program(member).forward(xs[i], ys[i]).data());
        step.program(member).backward();
      });
    }
  }
  void begin() { one_thread_per_device(1); }
  void end() { one_thread_per_device(0); }
};

// A row of Google Benchmark: Work made, then run under its thread counts (begin, end).
template <class Work, class... Args>
void timed_rows(benchmark::State& state, Args... args) {
  Work work(args...);
  work.begin();
  for (auto _ : state) work.run();
  work.end();
}

#if TESSERA_BLAS
// The physical limit of the DataParallel rows: the step's eight matrix products (3 forward, 5
// backward) as raw cblas_sgemm calls, the whole batch on one thread against two threads doing a
// half batch each at once. How well two of this machine's cores scale on this GEMM work bounds
// what any data-parallel split can reach.
struct deep_gemms {
  explicit deep_gemms(int rows)
      : b(rows), x(static_cast<std::size_t>(rows) * 784, 0.5f), w1(1024 * 784, 0.01f),
        h1(static_cast<std::size_t>(rows) * 1024), w2(1024 * 1024, 0.01f),
        h2(static_cast<std::size_t>(rows) * 1024), w3(10 * 1024, 0.01f),
        o(static_cast<std::size_t>(rows) * 10, 0.1f), g1(static_cast<std::size_t>(rows) * 1024),
        g2(static_cast<std::size_t>(rows) * 1024), dw(1024 * 1024) {}
  void run() {
    const auto n = CblasNoTrans;
    const auto t = CblasTrans;
    const auto r = CblasRowMajor;
    cblas_sgemm(r, n, t, b, 1024, 784, 1, x.data(), 784, w1.data(), 784, 0, h1.data(), 1024);
    cblas_sgemm(r, n, t, b, 1024, 1024, 1, h1.data(), 1024, w2.data(), 1024, 0, h2.data(), 1024);
    cblas_sgemm(r, n, t, b, 10, 1024, 1, h2.data(), 1024, w3.data(), 1024, 0, o.data(), 10);
    cblas_sgemm(r, t, n, 10, 1024, b, 1, o.data(), 10, h2.data(), 1024, 0, dw.data(), 1024);
    cblas_sgemm(r, n, n, b, 1024, 10, 1, o.data(), 10, w3.data(), 1024, 0, g2.data(), 1024);
    cblas_sgemm(r, t, n, 1024, 1024, b, 1, g2.data(), 1024, h1.data(), 1024, 0, dw.data(), 1024);
    cblas_sgemm(r, n, n, b, 1024, 1024, 1, g2.data(), 1024, w2.data(), 1024, 0, g1.data(), 1024);
    cblas_sgemm(r, t, n, 1024, 784, b, 1, g1.data(), 1024, x.data(), 784, 0, dw.data(), 784);
  }
  int b;
  std::vector<float> x, w1, h1, w2, h2, w3, o, g1, g2, dw;
};

struct gemm_limit_one_thread {
  explicit gemm_limit_one_thread(std::int64_t rows = batch) : work(static_cast<int>(rows)) {}
  deep_gemms work;
  void run() {
    work.run();
    benchmark::ClobberMemory();
  }
  void begin() { scope = std::make_unique<ts::bench::blas_threads_scope>(1); }
  void end() { scope.reset(); }
  std::unique_ptr<ts::bench::blas_threads_scope> scope;
};

struct gemm_limit_two_threads {
  std::vector<deep_gemms> work{2, deep_gemms(static_cast<int>(batch / 2))};
  ts::parallel::DeviceThreads<ts::cpu> threads{{0, 1}};
  gemm_limit_two_threads() {
    threads.run([](int) { openblas_set_num_threads(1); });  // each member's thread, its own
  }
  void run() {
    threads.run([&](int member) { work[static_cast<std::size_t>(member)].run(); });
    benchmark::ClobberMemory();
  }
  // The caller is member 0.
  void begin() { scope = std::make_unique<ts::bench::blas_threads_scope>(1); }
  void end() { scope.reset(); }
  std::unique_ptr<ts::bench::blas_threads_scope> scope;
};
#endif

/// Rounds of the paired DataParallel measurement (TESSERA_PARALLEL_BENCH_PAIRS, default 0: off).
/// Each round times `steps` steps of every DataParallel row one after another, so that the
/// ratios of a round come from the same minutes of the VM (its speed moves in phases of
/// seconds); prints each round's times and the medians of the rounds' ratios.
void paired_dp_rounds(int rounds, int steps) {
  using clock = std::chrono::steady_clock;
  dp_one_device one;
  dp_two_devices two(false);
  dp_two_devices replicas(true);
#if TESSERA_BLAS
  gemm_limit_one_thread g1;
  gemm_limit_two_threads g2;
  gemm_limit_one_thread g_half(batch / 2);  // a member's calls with the other core idle
#endif
  auto time = [&](auto& work) {
    work.begin();
    work.run();  // one step first: the thread counts just changed
    const auto t0 = clock::now();
    for (int i = 0; i < steps; ++i) work.run();
    const auto t1 = clock::now();
    work.end();
    return std::chrono::duration<double, std::milli>(t1 - t0).count() / steps;
  };
  std::vector<double> speedups, outside, limits, shares, interference;
  std::printf("\nDataParallel rows, %d rounds of %d steps each in alternation (ms: one device, "
              "two devices, replicas only, sgemm one thread, sgemm two threads, sgemm half batch "
              "one thread alone):\n",
              rounds, steps);
  for (int r = 0; r < rounds; ++r) {
    const double t_one = time(one), t_two = time(two), t_replicas = time(replicas);
    speedups.push_back(t_one / t_two);
    outside.push_back(1.0 - t_replicas / t_two);
    std::printf("  %.2f %.2f %.2f", t_one, t_two, t_replicas);
#if TESSERA_BLAS
    const double t_g1 = time(g1), t_g2 = time(g2), t_half = time(g_half);
    limits.push_back(t_g1 / t_g2);
    shares.push_back(speedups.back() / limits.back());
    interference.push_back(t_g2 / t_half);
    std::printf(" %.2f %.2f %.2f", t_g1, t_g2, t_half);
#endif
    std::printf("\n");
  }
  const double speedup = ts::bench::median_of(speedups);
  const double out = ts::bench::median_of(outside);
  std::printf("  medians of the rounds: speedup of 2 devices x 1 thread over 1 device x 1 thread "
              "= %.2f (goal >= 1.8: %s; range %.2f-%.2f); outside the replicas' programs = "
              "%.1f%% (goal <= 10%%: %s)\n",
              speedup, speedup >= 1.8 ? "met" : "MISSED",
              *std::min_element(speedups.begin(), speedups.end()),
              *std::max_element(speedups.begin(), speedups.end()), 100 * out,
              out <= 0.10 ? "met" : "MISSED");
  if (!limits.empty()) {
    std::printf("  sgemm calls alone, 2 threads over 1 (the split's limit) = %.2f; DataParallel "
                "reaches %.0f%% of it\n",
                ts::bench::median_of(limits), 100 * ts::bench::median_of(shares));
    std::printf("  a half batch's sgemm calls take %.2fx as long with the other core running its "
                "own half as with that core idle (1.00: the cores do not slow each other)\n",
                ts::bench::median_of(interference));
  }
}

#if TESSERA_BENCH_TORCH
// The same step in LibTorch 1.13 eager mode (autograd, F::cross_entropy, SGD), the same initial
// weights and data; LibTorch runs on its own OpenMP threads (at::set_num_threads: every core).
void mlp_step_torch(benchmark::State& state) {
  ts::manual_seed(0);
  mlp net;
  const auto x = ts::randn<float>({batch, 784});
  auto to_torch = [](const ts::Tensor<float>& t) {
    const std::vector<float> values = t.to_vector();
    std::vector<std::int64_t> sizes(t.shape().begin(), t.shape().end());
    return torch::from_blob(const_cast<float*>(values.data()), sizes, torch::kFloat32).clone();
  };
  torch::nn::Linear fc1(784, 1024), fc2(1024, 10);
  {
    torch::NoGradGuard no_grad;
    fc1->weight.copy_(to_torch(net.fc1.weight().value()));
    fc1->bias.copy_(to_torch(net.fc1.bias().value()));
    fc2->weight.copy_(to_torch(net.fc2.weight().value()));
    fc2->bias.copy_(to_torch(net.fc2.bias().value()));
  }
  const torch::Tensor tx = to_torch(x);
  const torch::Tensor targets = torch::arange(batch, torch::kInt64).remainder(10);
  std::vector<torch::Tensor> params{fc1->weight, fc1->bias, fc2->weight, fc2->bias};
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.01));
  {  // the same loss as Tessera's step from the same state, or the comparison means nothing
    const auto tessera_targets = ts::from_vector<std::int64_t>(mlp_labels(), {batch});
    auto step = ag::compile(
        [&](ag::Var<float> in) { return nn::cross_entropy(net.forward(in), tessera_targets); },
        ag::input<float>({batch, 784}));
    const double ours = step.forward(x).item();
    const double theirs = torch::nn::functional::cross_entropy(
                              fc2->forward(torch::relu(fc1->forward(tx))), targets)
                              .item<float>();
    if (std::abs(ours - theirs) > 1e-4 * std::abs(theirs)) {
      std::fprintf(stderr, "mlp_step_torch: loss %.7g (tessera) vs %.7g (torch)\n", ours, theirs);
      std::abort();
    }
  }
  for (auto _ : state) {
    sgd.zero_grad();
    torch::Tensor loss =
        torch::nn::functional::cross_entropy(fc2->forward(torch::relu(fc1->forward(tx))), targets);
    loss.backward();
    sgd.step();
    benchmark::DoNotOptimize(loss.data_ptr());
  }
}
#endif

#if TESSERA_BLAS
// The step's five products: h = x W1^T, o = h W2^T; dW2 = g^T h, dh = g W2, dW1 = dh^T x.
void mlp_step_gemm_limit(benchmark::State& state) {
  std::vector<float> x(batch * 784, 0.5f), w1(1024 * 784, 0.01f), h(batch * 1024), w2(10 * 1024, 0.01f),
      o(batch * 10), g(batch * 10, 0.1f), dw2(10 * 1024), dh(batch * 1024), dw1(1024 * 784);
  const int b = static_cast<int>(batch);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, 1024, 784, 1.0f, x.data(), 784, w1.data(), 784, 0.0f, h.data(), 1024);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, 10, 1024, 1.0f, h.data(), 1024, w2.data(), 1024, 0.0f, o.data(), 10);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 10, 1024, b, 1.0f, g.data(), 10, h.data(), 1024, 0.0f, dw2.data(), 1024);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, 1024, 10, 1.0f, g.data(), 10, w2.data(), 1024, 0.0f, dh.data(), 1024);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 1024, 784, b, 1.0f, dh.data(), 1024, x.data(), 784, 0.0f, dw1.data(), 784);
    benchmark::ClobberMemory();
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  // Two virtual CPU devices unless the caller chose otherwise (read once, at first use).
  setenv("TESSERA_CPU_DEVICES", "2", 0);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RegisterBenchmark("memcpy_64MiB", memcpy_64mib)->UseRealTime();
  benchmark::RegisterBenchmark("all_reduce_2_devices", all_reduce_2_devices)->UseRealTime();
  benchmark::RegisterBenchmark("hand_all_reduce_2_threads", hand_all_reduce_2_threads)->UseRealTime();
  benchmark::RegisterBenchmark("all_reduce_one_thread", all_reduce_one_thread)->UseRealTime();
  benchmark::RegisterBenchmark("tensor_create_destroy", tensor_create_destroy)->Threads(2)->UseRealTime();
  benchmark::RegisterBenchmark("malloc_free", malloc_free)->Threads(2)->UseRealTime();
  benchmark::RegisterBenchmark("mlp784_step_tessera", mlp_step_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);
#if TESSERA_BLAS
  benchmark::RegisterBenchmark("mlp784_step_gemm_limit", mlp_step_gemm_limit)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif
  benchmark::RegisterBenchmark("dp_step_one_device", timed_rows<dp_one_device>)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("dp_step_two_devices", timed_rows<dp_two_devices, bool>, false)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("dp_step_replicas_only", timed_rows<dp_two_devices, bool>, true)->UseRealTime()->Unit(benchmark::kMillisecond);
#if TESSERA_BLAS
  benchmark::RegisterBenchmark("dp_gemm_limit_one_thread", timed_rows<gemm_limit_one_thread>)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("dp_gemm_limit_two_threads", timed_rows<gemm_limit_two_threads>)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif
  // LibTorch last: after its first step the raw sgemm calls run about 2x slower in this process
  // (measured: 8.6 ms against 4.6 ms), so nothing is timed after it.
#if TESSERA_BENCH_TORCH
  benchmark::RegisterBenchmark("mlp784_step_torch", mlp_step_torch)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif
  ts::bench::print_core_round_trip("before the rows");
  // Before the rows: LibTorch's row slows the sgemm calls after it.
  if (const auto rounds = ts::bench::env_int("TESSERA_PARALLEL_BENCH_PAIRS", 0); rounds > 0) {
    paired_dp_rounds(static_cast<int>(rounds),
                     static_cast<int>(ts::bench::env_int("TESSERA_PARALLEL_BENCH_STEPS", 20)));
  }
  ts::bench::recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  ts::bench::print_core_round_trip("after the rows");
  std::printf("\nratios (baseline time / measured time; %d cores, %d CPU devices, %d threads alone):\n",
              ts::cpu::core_count(), ts::cpu::device_count(), ts::cpu::num_threads());
  // Time ratios equal bandwidth ratios here: bus bandwidth / memcpy bandwidth.
  const double busbw = reporter.bandwidth.count("all_reduce_2_devices")
                           ? reporter.bandwidth["all_reduce_2_devices"] : 0;
  const double copybw = reporter.bandwidth.count("memcpy_64MiB")
                            ? reporter.bandwidth["memcpy_64MiB"] : 0;
  if (busbw > 0 && copybw > 0) {
    std::printf("all_reduce 64 MiB, 2 devices: bus bandwidth %.2f GB/s / memcpy %.2f GB/s = %.2f "
                "(goal >= 0.8: %s)\n",
                busbw / 1e9, copybw / 1e9, busbw / copybw, busbw / copybw >= 0.8 ? "met" : "MISSED");
  }
  const std::vector<ts::bench::summary_line> lines = {
      {"all_reduce 64 MiB",
       {{"hand-written loop on 2 threads / tessera", "all_reduce_2_devices",
         "hand_all_reduce_2_threads", 0},
        {"speedup of 2 devices over one thread", "all_reduce_2_devices",
         "all_reduce_one_thread", 0}}},
      {"create+destroy 4 KiB, 2 threads, one device",
       {{"malloc/free time / tessera time", "tensor_create_destroy",
         "malloc_free", 1.0}}},
      {"MLP 784-1024-10 step, batch 256",
       {{"GEMM limit / tessera (goal: tessera <= 1.15 x the limit)", "mlp784_step_tessera",
         "mlp784_step_gemm_limit", 1 / 1.15},
        {"libtorch / tessera", "mlp784_step_tessera", "mlp784_step_torch", 0}}},
  };
  for (const auto& line : lines) ts::bench::print_summary(reporter.results, line);
  const auto& r = reporter.results;
  if (r.count("dp_step_one_device") && r.count("dp_step_two_devices") &&
      r.count("dp_step_replicas_only")) {
    const double speedup = r.at("dp_step_one_device") / r.at("dp_step_two_devices");
    const double outside = 1.0 - r.at("dp_step_replicas_only") / r.at("dp_step_two_devices");
    std::printf("DataParallel MLP 784-1024-1024-10 step, batch 256, 2 devices x 1 thread: "
                "speedup over 1 device x 1 thread = %.2f (goal >= 1.8: %s); time outside the "
                "replicas' programs = %.1f%% of the step (goal <= 10%%: %s)\n",
                speedup, speedup >= 1.8 ? "met" : "MISSED", 100 * outside,
                outside <= 0.10 ? "met" : "MISSED");
    if (r.count("dp_gemm_limit_one_thread") && r.count("dp_gemm_limit_two_threads")) {
      const double limit = r.at("dp_gemm_limit_one_thread") / r.at("dp_gemm_limit_two_threads");
      std::printf("  its sgemm calls alone, 2 threads x half batch over 1 thread x whole batch = "
                  "%.2f (this machine's limit for the split); DataParallel reaches %.0f%% of "
                  "it\n",
                  limit, 100 * speedup / limit);
    }
  }
  return 0;
}
