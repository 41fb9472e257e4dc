// DistributedDataParallel against one process, in one run, under mpirun:
//
//     mpirun -np 2 build/bench/ddp_bench          (as root: --allow-run-as-root)
//
// - one training step (forward, backward, SGD with momentum) of an MLP 784-1024-1024-10 over a
//   global batch of 512: one process with one thread on the whole batch (rank 0, while the other
//   ranks wait) against DDP over every rank with one thread each on its share: the scaling
//   efficiency T(1 process) / (P x T(DDP)), goal >= 0.85;
// - the overlap: DDP with the buckets' all-reduces during backward (the default), forced after
//   backward (overlap = false), and the same rank-local step with no reduction (no_sync): the
//   share of the communication the overlap hides, (T_after - T_during) / (T_after - T_local);
// - all_reduce (average) of the model's 7.2 MiB of gradients alone, against a memcpy of the same
//   size on one rank (the memory-bandwidth reference).
// Every benchmark runs a fixed number of iterations on every rank (the ranks' collectives must
// match); rank 0 reports. Each process gets its share of the cores from ts::distributed::init.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "bench_report.hpp"
#include "tessera/distributed.hpp"
#include "tessera/tessera.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace par = tessera::parallel;
namespace dist = tessera::distributed;

namespace {

constexpr std::int64_t global_batch = 512;
constexpr int iterations = 20;

auto make_mlp() {
  return nn::Sequential(nn::Linear<float>(784, 1024), nn::ReLU{}, nn::Linear<float>(1024, 1024),
                        nn::ReLU{}, nn::Linear<float>(1024, 10));
}

auto loss_of = [](auto& model, ag::Var<float> x, ag::Var<std::int64_t> y) {
  return nn::cross_entropy(model.forward(x), y);
};

ts::Tensor<std::int64_t> labels(std::int64_t n) {
  std::vector<std::int64_t> values(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::int64_t>(i % 10);
  return ts::from_vector<std::int64_t>(values, {n});
}

// What the benchmarks share, made once by main on every rank (in the same order: DDP's
// construction is collective).
struct setup {
  using Model = decltype(make_mlp());
  int here = ts::cpu::current_device();
  std::int64_t local = global_batch / dist::world_size();
  ts::Tensor<float> x_all = ts::bench::random_tensor({global_batch, 784}, 1).to(here);
  ts::Tensor<std::int64_t> y_all = labels(global_batch).to(here);
  ts::Tensor<float> x = x_all.narrow(0, dist::rank() * local, local).contiguous();
  ts::Tensor<std::int64_t> y = y_all.narrow(0, dist::rank() * local, local).contiguous();

  Model single = make_mlp();
  Model model = make_mlp();
  Model model_after = make_mlp();
  Model model_small = make_mlp();
  std::optional<par::DistributedDataParallel<Model>> ddp, ddp_after, ddp_small;
};
std::unique_ptr<setup> shared;

template <class Step, class Optimizer>
void train_steps(benchmark::State& state, Step& step, Optimizer& opt,
                 const ts::Tensor<float>& x, const ts::Tensor<std::int64_t>& y) {
  for (auto _ : state) {
    opt.zero_grad();
    benchmark::DoNotOptimize(step.forward(x, y).item());
    step.backward();
    opt.step();
  }
}

void BM_one_process_whole_batch(benchmark::State& state) {
  setup& s = *shared;
  dist::ProcessGroup pg;
  if (pg.rank() == 0) {
    auto step = ag::compile([&](ag::Var<float> x, ag::Var<std::int64_t> y) {
      return loss_of(s.single, x, y);
    }, ag::input<float>({global_batch, 784}, s.here), ag::input<std::int64_t>({global_batch}, s.here));
    ts::optim::SGD opt(s.single.parameters(), {.lr = 0.01, .momentum = 0.9});
    train_steps(state, step, opt, s.x_all, s.y_all);
  } else {
    for (auto _ : state) {
    }
  }
  pg.barrier();
}

void ddp_steps(benchmark::State& state, par::DistributedDataParallel<setup::Model>& ddp,
               setup::Model& model, bool local_only) {
  setup& s = *shared;
  auto step = ddp.compile(loss_of, ag::input<float>({s.local, 784}),
                          ag::input<std::int64_t>({s.local}));
  ts::optim::SGD opt(model.parameters(), {.lr = 0.01, .momentum = 0.9});
  if (local_only) {
    auto no_reduction = ddp.no_sync();
    train_steps(state, step, opt, s.x, s.y);
  } else {
    train_steps(state, step, opt, s.x, s.y);
  }
  dist::ProcessGroup().barrier();
}

void BM_ddp(benchmark::State& state) { ddp_steps(state, *shared->ddp, shared->model, false); }
void BM_ddp_reduce_after_backward(benchmark::State& state) {
  ddp_steps(state, *shared->ddp_after, shared->model_after, false);
}
void BM_ddp_2mb_buckets(benchmark::State& state) {
  ddp_steps(state, *shared->ddp_small, shared->model_small, false);
}
void BM_ddp_local_step_no_reduction(benchmark::State& state) {
  ddp_steps(state, *shared->ddp, shared->model, true);
}

std::int64_t gradient_elements() {
  std::int64_t n = 0;
  for (const auto& p : shared->model.parameters()) n += p.numel();
  return n;
}

void BM_all_reduce_gradients(benchmark::State& state) {
  dist::ProcessGroup pg;
  auto t = ts::ones<float>({gradient_elements()});
  for (auto _ : state) pg.all_reduce(t, par::ReduceOp::avg);
  state.SetBytesProcessed(state.iterations() * t.numel() * 4);
  pg.barrier();
}

void BM_memcpy_gradients(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(gradient_elements());
  std::vector<float> from(n, 1.0f), to(n);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), n * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n) * 4);
  dist::ProcessGroup().barrier();
}

class silent_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

BENCHMARK(BM_one_process_whole_batch)->Iterations(iterations)->Repetitions(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ddp)->Iterations(iterations)->Repetitions(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ddp_reduce_after_backward)->Iterations(iterations)->Repetitions(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ddp_2mb_buckets)->Iterations(iterations)->Repetitions(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ddp_local_step_no_reduction)->Iterations(iterations)->Repetitions(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_all_reduce_gradients)->Iterations(iterations)->Repetitions(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_memcpy_gradients)->Iterations(iterations)->Repetitions(3)->UseRealTime()->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  dist::Session session;
  const int ranks = dist::world_size();
  if (global_batch % ranks != 0) {
    if (dist::rank() == 0) std::printf("ddp_bench: the process count must divide %lld\n",
                                       static_cast<long long>(global_batch));
    return 1;
  }
  ts::manual_seed(5);
  shared = std::make_unique<setup>();
  shared->ddp.emplace(shared->model);
  shared->ddp_after.emplace(shared->model_after,
                            par::DistributedDataParallelOptions{.overlap = false});
  shared->ddp_small.emplace(shared->model_small,
                            par::DistributedDataParallelOptions{.bucket_cap_mb = 2});
  if (dist::rank() == 0) {
    std::printf("%d processes, %d thread(s) each, global batch %lld (%lld per process), %zu "
                "buckets\n",
                ranks, ts::cpu::num_threads(), static_cast<long long>(global_batch),
                static_cast<long long>(shared->local), shared->ddp->buckets().size());
  }
  benchmark::Initialize(&argc, argv);
  ts::bench::recording_reporter reporter;
  silent_reporter silent;
  if (dist::rank() == 0) {
    benchmark::RunSpecifiedBenchmarks(&reporter);
  } else {
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  if (dist::rank() == 0) {
    const auto& r = reporter.results;
    auto at = [&](const char* name) {
      auto it = r.find(name);
      return it == r.end() ? 0.0 : it->second;
    };
    const double one = at("BM_one_process_whole_batch"), during = at("BM_ddp"),
                 after = at("BM_ddp_reduce_after_backward"),
                 local = at("BM_ddp_local_step_no_reduction");
    if (one > 0 && during > 0) {
      const double efficiency = one / (ranks * during);
      std::printf("scaling: %d processes x 1 thread vs 1 x 1, global batch %lld: speedup %.2f, "
                  "efficiency %.2f (goal >= 0.85: %s)\n",
                  ranks, static_cast<long long>(global_batch), one / during, efficiency,
                  efficiency >= 0.85 ? "met" : "MISSED");
    }
    if (after > local && local > 0) {
      std::printf("overlap: step %.2f ms with the all-reduces during backward, %.2f ms after it, "
                  "%.2f ms without reduction: %.0f%% of the communication hidden\n",
                  during, after, local, 100.0 * (after - during) / (after - local));
    }
    ts::bench::print_summary(r, {"all_reduce of the gradients vs memcpy of them",
                                 {{"memcpy time / all_reduce time", "BM_all_reduce_gradients",
                                   "BM_memcpy_gradients", 0}}});
  }
  shared.reset();
  return 0;
}
