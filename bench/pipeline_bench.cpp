// Pipeline parallelism on two virtual CPU devices, one core each: a training step (forward,
// backward) of a 7-layer MLP (1024 wide, batch 256, cross_entropy) cut into two stages,
//   - model parallel: the two stages, one chunk (one device works at a time);
//   - pipelined: GPipe with 4, 8 and 16 micro-batches, 1F1B with 8;
// against, in the same run,
//   - the whole model on one device with one core (what each stage's device has);
//   - the same micro-batches one after the other on one device (the work a pipeline spreads):
//     a perfect two-stage pipeline of M micro-batches takes (M + 1) / (2M) of it when the
//     stages are equal, so measured / that is the cost of the bubble's imperfection, the
//     hand-offs and two cores sharing caches and memory;
//   - two threads running each stage's matrix products at once on their own data, no pipeline
//     (the physical limit of two cores on this work).
// And the seed's kind of model: ResNet-18 (torchvision's layout, 32x32 and 64x64 images, batch
// 32) on one device, model parallel and GPipe with 4 and 8 micro-batches; and the seed's own model,
// ResNet-50 (128x128 images, batch 32, its blocks cut by balance_by_time), the same plus GPipe 16
// and its 8 micro-batches in turn on one device (its bubble against the ideal). With
// TESSERA_PIPELINE_BENCH_PAIRS=N, N ResNet-50 steps model parallel and GPipe 8 in alternation
// after the rows (the median of the pairs' ratios, robust to this VM's slow and fast minutes);
// TESSERA_PIPELINE_BENCH_PAIRS_BATCH and _CHUNKS change the pairs' batch (32) and micro-batches (8).
// Prints the speedups (goal: pipelined at its best split >= 1.6 x model parallel) and the plans'
// peak memory per stage, GPipe against 1F1B.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_report.hpp"
#include "tessera/models/resnet.hpp"
#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

#if TESSERA_BLAS
#include <cblas.h>
#endif

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace par = tessera::parallel;

namespace {

constexpr int width = 1024;
constexpr std::int64_t batch = 256;

auto make_model() {
  ts::manual_seed(0);
  return nn::Sequential(nn::Linear<float>(width, width), nn::ReLU{},
                        nn::Linear<float>(width, width), nn::ReLU{},
                        nn::Linear<float>(width, width), nn::ReLU{},
                        nn::Linear<float>(width, width), nn::ReLU{},
                        nn::Linear<float>(width, width), nn::ReLU{},
                        nn::Linear<float>(width, width), nn::ReLU{}, nn::Linear<float>(width, 10));
}

struct data {
  ts::Tensor<float> x = ts::randn<float>({batch, width});
  ts::Tensor<std::int64_t> y = labels();
  static ts::Tensor<std::int64_t> labels() {
    std::vector<std::int64_t> v(static_cast<std::size_t>(batch));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>(i % 10);
    return ts::from_vector<std::int64_t>(v, {batch});
  }
};

auto loss_fn = [](auto out, auto labels) { return nn::cross_entropy(out, labels); };

std::map<std::string, std::vector<par::StagePlan>>& plans() {
  static std::map<std::string, std::vector<par::StagePlan>> p;
  return p;
}
// Per stage, the pool's peak_allocated during one step, above what was live before it.
std::map<std::string, std::vector<std::size_t>>& measured_peaks() {
  static std::map<std::string, std::vector<std::size_t>> p;
  return p;
}

// A pipeline of `stages` (1: the whole model on cpu:0; 2: layers 0-5 on cpu:0, 6-12 on cpu:1)
// over `chunks` micro-batches, timed per training step.
void pipeline_step(benchmark::State& state, int stages, int chunks, par::Schedule schedule,
                   const char* name) {
  // One core per device: one device alone gets one core too.
  ts::cpu::set_num_threads(stages == 1 ? 1 : 2);
  const data d;
  auto model = make_model();
  par::Pipeline pipe(model, {.balance = stages == 1 ? std::vector<int>{13} : std::vector<int>{6, 7},
                             .chunks = chunks,
                             .schedule = schedule,
                             .checkpoint = par::Checkpoint::never});
  auto step = pipe.compile(loss_fn, ag::input<float>({batch, width}),
                           ag::input<std::int64_t>({batch}));
  step.forward(d.x, d.y);  // warm-up: gradients, the pool's blocks
  step.backward();
  for (auto _ : state) {
    step.forward(d.x, d.y);
    step.backward();
  }
  plans()[name] = step.plan();
  std::vector<std::size_t> peaks;
  std::vector<std::size_t> before;
  for (int s = 0; s < stages; ++s) {
    ts::memory::reset_peak(pipe.device(s));
    before.push_back(ts::memory::allocated(pipe.device(s)));
  }
  step.forward(d.x, d.y);
  step.backward();
  for (int s = 0; s < stages; ++s) {
    peaks.push_back(ts::memory::peak_allocated(pipe.device(s)) - before[static_cast<std::size_t>(s)]);
  }
  measured_peaks()[name] = peaks;
  ts::cpu::set_num_threads(ts::cpu::core_count());
}

// The seed's model: torchvision's ResNet-18 layout, batch 32, timed per step. On 32x32 images as
// ResNet::sequential() (stem, layer1..4, head), stages {3, 3}; on 64x64 images as
// ResNet::blocks() (stem, eight blocks, head), stages from balance_by_time: at 32x32, layer3 and
// layer4 see 2x2 and 1x1 maps, so their cost is reading their weights, which every micro-batch pays
// again, and they make the second stage the longer one. (1 stage: everything on cpu:0.)
constexpr std::int64_t resnet_batch = 32;

// Class i % 10 for sample i.
ts::Tensor<std::int64_t> class_labels(std::int64_t count) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>(i % 10);
  return ts::from_vector<std::int64_t>(v, {count});
}

template <class Model>
void resnet_run(benchmark::State& state, Model model, std::int64_t side, std::vector<int> balance,
                int chunks, std::int64_t batch_size = resnet_batch) {
  ts::manual_seed(1);
  const auto x = ts::randn<float>({batch_size, 3, side, side});
  const auto y = class_labels(batch_size);
  ts::cpu::set_num_threads(balance.size() == 1 ? 1 : 2);
  par::Pipeline pipe(
      model,
      {.balance = std::move(balance), .chunks = chunks, .checkpoint = par::Checkpoint::never});
  auto step = pipe.compile(loss_fn, ag::input<float>(x.shape()),
                           ag::input<std::int64_t>(y.shape()));
  step.forward(x, y);  // warm-up
  step.backward();
  for (auto _ : state) {
    step.forward(x, y);
    step.backward();
  }
  ts::cpu::set_num_threads(ts::cpu::core_count());
}

void resnet_step(benchmark::State& state, int stages, int chunks) {
  ts::manual_seed(0);
  resnet_run(state, ts::models::resnet18<float>(10).sequential(), 32,
             stages == 1 ? std::vector<int>{6} : std::vector<int>{3, 3}, chunks);
}

// A model's blocks() (stem, every block, head) on side x side images, the stages from
// balance_by_time on one micro-batch (the run's label says which).
template <class Model>
void blocks_step(benchmark::State& state, const Model& net, std::int64_t side,
                 std::int64_t batch_size, int stages, int chunks) {
  auto model = net.blocks();
  std::vector<int> balance{static_cast<int>(model.size())};
  if (stages == 2) {
    ts::manual_seed(2);
    const auto sample = ts::randn<float>({(batch_size + chunks - 1) / chunks, 3, side, side});
    balance = par::balance_by_time(2, model, sample);
    state.SetLabel("balance {" + std::to_string(balance[0]) + ", " + std::to_string(balance[1]) +
                   "}");
  }
  resnet_run(state, std::move(model), side, std::move(balance), chunks, batch_size);
}

void resnet_blocks_step(benchmark::State& state, int stages, int chunks) {
  ts::manual_seed(0);
  blocks_step(state, ts::models::resnet18<float>(10), 64, resnet_batch, stages, chunks);
}

// The seed's own model: torchvision's ResNet-50 (Bottleneck blocks), 10 classes, on 128x128
// images at batch 32 (the seed: 224x224, batch 120, on GPUs; a step here at 224 takes seconds).
constexpr std::int64_t resnet50_side = 128;
void resnet50_blocks_step(benchmark::State& state, int stages, int chunks) {
  ts::manual_seed(0);
  blocks_step(state, ts::models::resnet50<float>(10), resnet50_side, resnet_batch, stages, chunks);
}

/// ResNet-50's steps model parallel and pipelined (GPipe, `chunks` micro-batches) in alternation,
/// in one process (two models with the same weights, the same data, one warm-up step each, each
/// cut by balance_by_time on what its stages see: the whole batch, one micro-batch). Both sides
/// of a pair run in the same seconds of this noisy VM, so the median of the pairs' ratios
/// compares the schedules, not the minutes in which each row happened to run.
void paired_resnet50_steps(int rounds, std::int64_t batch_size, int chunks) {
  using clock = std::chrono::steady_clock;
  ts::cpu::set_num_threads(2);
  ts::manual_seed(1);
  const auto x = ts::randn<float>({batch_size, 3, resnet50_side, resnet50_side});
  const auto y = class_labels(batch_size);
  ts::manual_seed(0);
  auto whole_model = ts::models::resnet50<float>(10).blocks();
  ts::manual_seed(0);
  auto micro_model = ts::models::resnet50<float>(10).blocks();
  ts::manual_seed(2);
  const std::vector<int> whole_cut = par::balance_by_time(2, whole_model, x);
  const std::vector<int> micro_cut = par::balance_by_time(
      2, micro_model, x.narrow(0, 0, (batch_size + chunks - 1) / chunks).contiguous());
  par::Pipeline serial(whole_model, {.balance = whole_cut, .chunks = 1,
                                     .checkpoint = par::Checkpoint::never});
  par::Pipeline piped(micro_model, {.balance = micro_cut, .chunks = chunks,
                                    .checkpoint = par::Checkpoint::never});
  auto serial_step = serial.compile(loss_fn, ag::input<float>(x.shape()),
                                    ag::input<std::int64_t>(y.shape()));
  auto piped_step = piped.compile(loss_fn, ag::input<float>(x.shape()),
                                  ag::input<std::int64_t>(y.shape()));
  // One step: its time in ms and its loss.
  auto run = [&](auto& step) {
    const auto t0 = clock::now();
    const float loss = step.forward(x, y).item();
    step.backward();
    return std::pair{std::chrono::duration<double, std::milli>(clock::now() - t0).count(), loss};
  };
  const float first_serial = run(serial_step).second;
  const float first_piped = run(piped_step).second;
  // The same weights and data; the losses differ a little, since BatchNorm normalises each
  // micro-batch with its own statistics.
  if (!std::isfinite(first_serial) || !std::isfinite(first_piped)) {
    std::printf("paired ResNet-50 steps: a loss is not finite (%g, %g)\n",
                static_cast<double>(first_serial), static_cast<double>(first_piped));
    return;
  }
  std::vector<double> ratios;
  std::printf("\nResNet-50 (%lldx%lld, batch %lld) steps, %d pairs in alternation, model parallel "
              "{%d, %d} ms / gpipe %d {%d, %d} ms:",
              static_cast<long long>(resnet50_side), static_cast<long long>(resnet50_side),
              static_cast<long long>(batch_size), rounds, whole_cut[0], whole_cut[1], chunks,
              micro_cut[0], micro_cut[1]);
  for (int r = 0; r < rounds; ++r) {
    const double a = run(serial_step).first;
    const double b = run(piped_step).first;
    std::printf(" %.0f/%.0f", a, b);
    ratios.push_back(a / b);
  }
  const double median = ts::bench::median_of(ratios);
  const auto [low, high] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf("\n  model parallel / pipelined: median of the pairs %.2f (goal >= 1.6: %s), "
              "range %.2f-%.2f\n",
              median, median >= 1.6 ? "met" : "MISSED", *low, *high);
  ts::cpu::set_num_threads(ts::cpu::core_count());
}

#if TESSERA_BLAS
// Each stage's matrix products for the whole batch (forward; backward with the input's gradient
// except for stage 0's first layer), stage 0's on one thread and stage 1's on another at once.
struct stage_gemms {
  stage_gemms(int layers, bool first)
      : layers(layers), first(first),
        w(static_cast<std::size_t>(width) * width, 0.01f),
        a(static_cast<std::size_t>(layers + 1), std::vector<float>(batch * width, 0.5f)),
        g(batch * width, 0.1f), dw(static_cast<std::size_t>(width) * width) {}
  void run() {
    const auto r = CblasRowMajor;
    const int b = static_cast<int>(batch);
    for (int l = 0; l < layers; ++l) {
      cblas_sgemm(r, CblasNoTrans, CblasTrans, b, width, width, 1, a[static_cast<std::size_t>(l)].data(), width, w.data(),
                  width, 0, a[static_cast<std::size_t>(l) + 1].data(), width);
    }
    for (int l = layers - 1; l >= 0; --l) {
      cblas_sgemm(r, CblasTrans, CblasNoTrans, width, width, b, 1, g.data(), width,
                  a[static_cast<std::size_t>(l)].data(), width, 0, dw.data(), width);
      if (l > 0 || !first) {
        cblas_sgemm(r, CblasNoTrans, CblasNoTrans, b, width, width, 1, g.data(), width, w.data(),
                    width, 0, a[static_cast<std::size_t>(l)].data(), width);
      }
    }
  }
  int layers;
  bool first;
  std::vector<float> w;
  std::vector<std::vector<float>> a;
  std::vector<float> g, dw;
};

void stage_gemms_two_threads(benchmark::State& state) {
  std::vector<stage_gemms> work{stage_gemms(3, true), stage_gemms(3, false)};
  par::DeviceThreads<ts::cpu> threads({0, 1});
  const ts::bench::blas_threads_scope one_thread(1);  // the caller is member 0
  threads.run([](int) { openblas_set_num_threads(1); });  // the other member's thread, its own
  for (auto _ : state) {
    threads.run([&](int member) { work[static_cast<std::size_t>(member)].run(); });
    benchmark::ClobberMemory();
  }
}
void stage_gemms_one_thread(benchmark::State& state) {
  std::vector<stage_gemms> work{stage_gemms(3, true), stage_gemms(3, false)};
  const ts::bench::blas_threads_scope one_thread(1);
  for (auto _ : state) {
    work[0].run();
    work[1].run();
    benchmark::ClobberMemory();
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  setenv("TESSERA_CPU_DEVICES", "2", 0);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  auto add = [](const char* name, int stages, int chunks, par::Schedule schedule) {
    benchmark::RegisterBenchmark(name, pipeline_step, stages, chunks, schedule, name)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  add("one_device", 1, 1, par::Schedule::gpipe);
  add("one_device_4_micro", 1, 4, par::Schedule::gpipe);
  add("one_device_8_micro", 1, 8, par::Schedule::gpipe);
  add("one_device_16_micro", 1, 16, par::Schedule::gpipe);
  add("model_parallel", 2, 1, par::Schedule::gpipe);
  add("gpipe_4", 2, 4, par::Schedule::gpipe);
  add("gpipe_8", 2, 8, par::Schedule::gpipe);
  add("gpipe_16", 2, 16, par::Schedule::gpipe);
  add("1f1b_8", 2, 8, par::Schedule::one_f_one_b);
  auto add_resnet = [](const char* name, void (*step)(benchmark::State&, int, int), int stages,
                       int chunks) {
    benchmark::RegisterBenchmark(name, step, stages, chunks)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  add_resnet("resnet18_one_device", resnet_step, 1, 1);
  add_resnet("resnet18_model_parallel", resnet_step, 2, 1);
  add_resnet("resnet18_gpipe_4", resnet_step, 2, 4);
  add_resnet("resnet18_gpipe_8", resnet_step, 2, 8);
  add_resnet("resnet18_64_one_device", resnet_blocks_step, 1, 1);
  add_resnet("resnet18_64_model_parallel", resnet_blocks_step, 2, 1);
  add_resnet("resnet18_64_gpipe_4", resnet_blocks_step, 2, 4);
  add_resnet("resnet18_64_gpipe_8", resnet_blocks_step, 2, 8);
  add_resnet("resnet50_one_device", resnet50_blocks_step, 1, 1);
  add_resnet("resnet50_model_parallel", resnet50_blocks_step, 2, 1);
  add_resnet("resnet50_gpipe_4", resnet50_blocks_step, 2, 4);
  add_resnet("resnet50_gpipe_8", resnet50_blocks_step, 2, 8);
  add_resnet("resnet50_gpipe_16", resnet50_blocks_step, 2, 16);
  add_resnet("resnet50_one_device_8_micro", resnet50_blocks_step, 1, 8);
#if TESSERA_BLAS
  benchmark::RegisterBenchmark("stage_gemms_one_thread", stage_gemms_one_thread)
      ->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("stage_gemms_two_threads", stage_gemms_two_threads)
      ->UseRealTime()->Unit(benchmark::kMillisecond);
#endif
  ts::bench::print_core_round_trip("before the rows");
  ts::bench::recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  ts::bench::print_core_round_trip("after the rows");
  const auto& r = reporter.results;
  std::printf("\nratios (baseline time / measured time; %d cores, 2 CPU devices, one core each):\n",
              ts::cpu::core_count());
  const char* pipelined[] = {"gpipe_4", "gpipe_8", "gpipe_16", "1f1b_8"};
  std::string best;
  for (const char* name : pipelined) {
    if (r.count(name) && (best.empty() || r.at(name) < r.at(best))) best = name;
  }
  std::vector<ts::bench::summary_line> lines = {
      {"pipelined (best: " + best + ") vs model parallel",
       {{"model parallel / pipelined (goal >= 1.6)", best, "model_parallel", 1.6},
        {"one device / pipelined", best, "one_device", 0}}},
      {"model parallel vs one device",
       {{"one device / model parallel", "model_parallel", "one_device", 0}}},
      {"two threads on the stages' GEMMs",
       {{"one thread / two threads (the limit)", "stage_gemms_two_threads",
         "stage_gemms_one_thread", 0}}},
  };
  // The ResNet rows: each layout, pipelined with 4, 8 (and 16) micro-batches.
  struct layout {
    std::string prefix, label;
    std::vector<const char*> chunks;
  };
  const layout layouts[] = {
      {"resnet18", "ResNet-18 (32x32, batch 32)", {"4", "8"}},
      {"resnet18_64", "ResNet-18 (64x64, batch 32, blocks, balance_by_time)", {"4", "8"}},
      {"resnet50", "ResNet-50 (128x128, batch 32, blocks, balance_by_time)", {"4", "8", "16"}}};
  for (const auto& [prefix, label, chunk_list] : layouts) {
    for (const char* chunks : chunk_list) {
      const std::string pipelined = prefix + "_gpipe_" + chunks;
      lines.push_back(
          {label + ": pipelined (gpipe " + chunks + ") vs model parallel",
           {{"model parallel / pipelined (goal >= 1.6)", pipelined, prefix + "_model_parallel",
             1.6},
            {"one device / pipelined", pipelined, prefix + "_one_device", 0}}});
    }
  }
  for (const auto& line : lines) ts::bench::print_summary(r, line);
  // The bubble: the same micro-batches in turn on one device, against the pipeline.
  const std::pair<std::string, int> bubbles[] = {{"", 4}, {"", 8}, {"", 16}, {"resnet50_", 8}};
  for (const auto& [prefix, m] : bubbles) {
    const std::string serial = prefix + "one_device_" + std::to_string(m) + "_micro";
    const std::string pipe = prefix + "gpipe_" + std::to_string(m);
    if (!r.count(serial) || !r.count(pipe)) continue;
    const double ideal = r.at(serial) * (m + 1) / (2.0 * m);
    std::printf("%sgpipe %2d micro-batches: %.1f ms; ideal (M + K - 1) / (M K) x serial %.1f ms "
                "= %.1f ms; measured / ideal = %.2f; speedup over the serial micro-batches %.2f "
                "(ideal %.2f)\n",
                prefix.c_str(), m, r.at(pipe), r.at(serial), ideal, r.at(pipe) / ideal,
                r.at(serial) / r.at(pipe), 2.0 * m / (m + 1));
  }
  if (plans().count("gpipe_8") && plans().count("1f1b_8")) {
    for (std::size_t s = 0; s < 2; ++s) {
      const auto& g = plans()["gpipe_8"][s];
      const auto& o = plans()["1f1b_8"][s];
      std::printf("stage %zu planned peak, 8 micro-batches: gpipe %.1f MiB (%d in flight), 1f1b "
                  "%.1f MiB (%d in flight): 1f1b / gpipe = %.2f\n",
                  s, static_cast<double>(g.peak_bytes) / (1 << 20), g.max_in_flight,
                  static_cast<double>(o.peak_bytes) / (1 << 20), o.max_in_flight,
                  static_cast<double>(o.peak_bytes) / static_cast<double>(g.peak_bytes));
      const double mg = static_cast<double>(measured_peaks()["gpipe_8"][s]);
      const double mo = static_cast<double>(measured_peaks()["1f1b_8"][s]);
      std::printf("stage %zu measured peak_allocated during a step: gpipe %.1f MiB, 1f1b %.1f MiB: "
                  "1f1b / gpipe = %.2f\n",
                  s, mg / (1 << 20), mo / (1 << 20), mo / mg);
    }
  }
  using ts::bench::env_int;
  const auto rounds = static_cast<int>(env_int("TESSERA_PIPELINE_BENCH_PAIRS", 0));
  if (rounds > 0) {
    paired_resnet50_steps(rounds, env_int("TESSERA_PIPELINE_BENCH_PAIRS_BATCH", resnet_batch),
                          static_cast<int>(env_int("TESSERA_PIPELINE_BENCH_PAIRS_CHUNKS", 8)));
  }
  return 0;
}
