// The DataLoader against the training step it feeds, in one run:
// - BM_step: one training step (forward, backward, SGD) of an MLP 784-1024-10 at batch 256 on
//   batches already in memory, a different one each step (the step alone);
// - BM_step_with_loader_2_workers: the same step on the next batch of a DataLoader (TensorDataset of
//   8192 examples, shuffled, 2 workers): the time over BM_step is what the step waits for data
//   (stall share = 1 - T(step) / T(step with loader), goal <= 2 %); _0_workers: batches loaded
//   by the loop's own thread (the serial reference). Its counter wait_share is the share of the
//   loop's time spent inside the loader's calls (taking the next batch, moving past it): the
//   time the step waits for data itself, without the slowdown of sharing the cores with the
//   workers, which the stall share includes;
// - BM_loader: the loader alone (batches per second it can deliver), and BM_loader_0_workers.
// Default environment: the step's loops and BLAS use every core; the workers share them.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench_report.hpp"
#include "tessera/data.hpp"
#include "tessera/tessera.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

namespace {

constexpr std::int64_t examples = 8192, batch = 256;

ts::data::TensorDataset<float, std::int64_t> make_dataset() {
  std::vector<std::int64_t> labels(examples);
  for (std::int64_t i = 0; i < examples; ++i) labels[static_cast<std::size_t>(i)] = i % 10;
  return ts::data::TensorDataset<float, std::int64_t>(
      ts::bench::random_tensor({examples, 784}, 3),
      ts::from_vector<std::int64_t>(labels, {examples}));
}

auto make_mlp() {
  return nn::Sequential(nn::Linear<float>(784, 1024), nn::ReLU{}, nn::Linear<float>(1024, 10));
}
using Model = decltype(make_mlp());
auto compile_step(Model& model) {
  return ag::compile(
      [&model](ag::Var<float> x, ag::Var<std::int64_t> y) {
        return nn::cross_entropy(model.forward(x), y);
      },
      ag::input<float>({batch, 784}), ag::input<std::int64_t>({batch}));
}

struct training {
  Model model = make_mlp();
  decltype(compile_step(std::declval<Model&>())) step = compile_step(model);
  ts::optim::SGD sgd{model.parameters(), {.lr = 0.01, .momentum = 0.9}};

  void run(const ts::Tensor<float>& x, const ts::Tensor<std::int64_t>& y) {
    sgd.zero_grad();
    benchmark::DoNotOptimize(step.forward(x, y).item());
    step.backward();
    sgd.step();
  }
};

void BM_step(benchmark::State& state) {
  // Every batch of the epoch made beforehand, visited in turn: the step reads data as cold as
  // the loader's (the same batch each time would stay in cache).
  training t;
  const auto dataset = make_dataset();
  const auto [x, y] = dataset.tensors();
  std::vector<ts::Tensor<float>> xs;
  std::vector<ts::Tensor<std::int64_t>> ys;
  for (std::int64_t first = 0; first + batch <= examples; first += batch) {
    xs.push_back(x.narrow(0, first, batch).contiguous());
    ys.push_back(y.narrow(0, first, batch).contiguous());
  }
  std::size_t k = 0;
  for (auto _ : state) {
    t.run(xs[k], ys[k]);
    k = (k + 1) % xs.size();
  }
}

// Batches forever: a new epoch when one ends (drop_last keeps every batch full). Sets the
// counter wait_share: the time in the loader's calls over the loop's time.
template <class Fn>
void over_batches(benchmark::State& state, int workers, Fn fn) {
  using clock = std::chrono::steady_clock;
  ts::data::DataLoader loader(make_dataset(), {.batch_size = batch, .shuffle = true,
                                               .drop_last = true, .num_workers = workers});
  std::optional<decltype(loader.begin())> it;
  clock::duration waited{};
  const auto start = clock::now();
  for (auto _ : state) {
    const auto before = clock::now();
    if (!it || *it == loader.end()) it.emplace(loader.begin());
    auto [x, y] = **it;
    const auto got = clock::now();
    fn(x, y);
    const auto done = clock::now();
    ++*it;
    waited += (got - before) + (clock::now() - done);
  }
  const std::chrono::duration<double> total = clock::now() - start;
  state.counters["wait_share"] = std::chrono::duration<double>(waited).count() / total.count();
}

void step_with_loader(benchmark::State& state, int workers) {
  training t;
  over_batches(state, workers, [&](const auto& x, const auto& y) { t.run(x, y); });
}
void BM_step_with_loader_2_workers(benchmark::State& state) { step_with_loader(state, 2); }
void BM_step_with_loader_0_workers(benchmark::State& state) { step_with_loader(state, 0); }

void BM_loader(benchmark::State& state) {
  over_batches(state, static_cast<int>(state.range(0)),
               [](const auto& x, const auto&) { benchmark::DoNotOptimize(x.data()); });
}

}  // namespace

BENCHMARK(BM_step)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_step_with_loader_2_workers)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_step_with_loader_0_workers)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_loader)->Arg(0)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  ts::bench::recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const auto& r = reporter.results;
  const auto step = r.find("BM_step");
  for (const char* workers : {"2", "0"}) {
    const auto fed = r.find(std::string("BM_step_with_loader_") + workers + "_workers");
    if (step == r.end() || fed == r.end() || fed->second <= 0) continue;
    const double stall = 1.0 - step->second / fed->second;
    std::printf("stall share of a step fed by a loader with %s workers: %.1f%%%s\n", workers,
                100.0 * stall,
                std::string(workers) == "2" ? (stall <= 0.02 ? " (goal <= 2%: met)"
                                                              : " (goal <= 2%: MISSED)")
                                            : "");
    const auto counters = reporter.counters.find(fed->first);
    if (counters != reporter.counters.end() && counters->second.count("wait_share")) {
      std::printf("  of which waiting inside the loader's calls: %.2f%% of the loop's time\n",
                  100.0 * counters->second.at("wait_share"));
    }
  }
  return 0;
}
