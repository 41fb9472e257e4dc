// Pipeline parallelism, the experiment of PyTorch's "Single-Machine Model Parallel Best
// Practices" tutorial scaled to this machine: one model trained three ways on two devices, then
// the split-size sweep that shows the pipeline's trade-off (small micro-batches fill the
// pipeline, large ones use each device better).
//
//   1. one device: the whole model on cpu:0;
//   2. model parallel: the first half on cpu:0, the second on cpu:1, the whole batch at once
//      (one device works while the other waits);
//   3. pipelined: the same two stages, the batch cut into micro-batches of `split_size` samples
//      (the tutorial's knob: x.split(split_size), so a size that does not divide the batch
//      leaves a smaller last micro-batch), so both devices work at once
//      (ts::parallel::Pipeline with .split_size, GPipe schedule).
//
// The tutorial's model is ResNet-50 at 224x224 on two GPUs; here it is torchvision's ResNet-18
// layout on small random images (argument 3, default 32x32) on two virtual CPU devices
// (TESSERA_CPU_DEVICES=2), each driven by its own thread with one core. The model is
// ResNet::blocks() (stem, eight blocks, head), cut where ts::parallel::balance_by_time finds the
// two stages closest to equal time (each block timed, forward and backward, on one micro-batch).
// Results go to a JSON file (argument 1, default pipeline_results.json) that bench/plot.py draws
// as split_size_tradeoff.png and pipeline_comparison.png. Argument 2 is the number of timed runs
// per configuration (default 3; the figures in bench/RESULTS.md use more). Times are printed per
// training step; the JSON holds the time of `steps` steps.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tessera/models/resnet.hpp"
#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace par = tessera::parallel;

constexpr int classes = 10;
constexpr std::int64_t batch = 32;
constexpr int steps = 2;  // training steps per timed run

/// ResNet-18 as ten modules (stem, eight blocks, head), the same initial weights every time.
auto make_model() {
  ts::manual_seed(0);
  return ts::models::resnet18<float>(classes).blocks();
}
using Model = decltype(make_model());

struct Timing {
  double mean = 0, stddev = 0;
  double first_loss = 0, last_loss = 0;
};

// Mean and standard deviation over `runs` of the time of `steps` SGD steps of `program`.
template <class Program>
Timing time_training(Program& program, Model& model, const ts::Tensor<float>& x,
                     const ts::Tensor<std::int64_t>& y, int runs) {
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.01});
  auto step = [&] {
    sgd.zero_grad();
    const double loss = program.forward(x, y).item();
    program.backward();
    sgd.step();
    return loss;
  };
  Timing t;
  t.first_loss = step();  // warm-up: arenas, gradients
  std::vector<double> seconds;
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) t.last_loss = step();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  for (double s : seconds) t.mean += s / runs;
  for (double s : seconds) t.stddev += (s - t.mean) * (s - t.mean) / std::max(1, runs - 1);
  t.stddev = std::sqrt(t.stddev);
  return t;
}

auto loss_of = [](auto out, auto labels) { return nn::cross_entropy(out, labels); };

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "pipeline_results.json";
  const int runs = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
  const std::int64_t size = argc > 3 ? std::max(32, std::atoi(argv[3])) : 32;
  ts::manual_seed(1);
  const ts::Shape input_shape{batch, 3, size, size};
  const auto x = ts::randn<float>(input_shape);
  std::vector<std::int64_t> label_values(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < label_values.size(); ++i) {
    label_values[i] = static_cast<std::int64_t>(i % classes);
  }
  const auto y = ts::from_vector<std::int64_t>(label_values, {batch});

  // 1. One device, one core: what each device of the pipeline has.
  ts::cpu::set_num_threads(1);
  Model single = make_model();
  auto single_program = ag::compile(
      [&](ag::Var<float> in, ag::Var<std::int64_t> labels) {
        return nn::cross_entropy(single(in), labels);
      },
      ag::input<float>(input_shape), ag::input<std::int64_t>({batch}));
  const Timing one = time_training(single_program, single, x, y, runs);
  std::printf("one device:         %6.1f ms/step +- %5.1f (loss %.4f -> %.4f)\n",
              one.mean * 1e3 / steps, one.stddev * 1e3 / steps, one.first_loss, one.last_loss);
  if (ts::cpu::device_count() < 2) {
    std::printf("Model parallel and pipelined runs need two devices: run with "
                "TESSERA_CPU_DEVICES=2.\n");
    return 0;
  }
  // Back to every core: the pipeline's two threads take one each.
  ts::cpu::set_num_threads(ts::cpu::core_count());

  // The two stages: each block timed on a micro-batch of 8 samples with one stage's share of
  // the cores, then the cut whose slower stage is fastest.
  const std::vector<int> balance =
      par::balance_by_time(2, make_model(), ts::randn<float>({8, 3, size, size}));
  std::printf("balance_by_time: %d blocks on cpu:0, %d on cpu:1\n", balance[0], balance[1]);

  // 2. Model parallel (two stages, no micro-batches) and 3. pipelined, for each split size.
  auto run_pipeline = [&](std::int64_t split_size) {
    Model model = make_model();
    par::Pipeline pipe(model, {.balance = balance,
                               .split_size = split_size,
                               .checkpoint = par::Checkpoint::never});
    auto program = pipe.compile(loss_of, ag::input<float>(input_shape),
                                ag::input<std::int64_t>({batch}));
    return time_training(program, model, x, y, runs);
  };
  const Timing model_parallel = run_pipeline(batch);
  std::printf("model parallel:     %6.1f ms/step +- %5.1f (loss %.4f -> %.4f)\n",
              model_parallel.mean * 1e3 / steps, model_parallel.stddev * 1e3 / steps,
              model_parallel.first_loss, model_parallel.last_loss);
  // The tutorial's sweep (split_size 1 to 60 of a batch of 120 there; 1 to 32 of 32 here), with
  // sizes that do not divide the batch: 3 gives ten micro-batches of 3 and one of 2. 32 is one
  // micro-batch, i.e. the model parallel run above. A micro-batch of one sample trains BatchNorm
  // on one sample, which at 32x32 leaves layer4 one value per channel: refused, as by PyTorch
  // ("expected more than 1 value per channel when training"), so split 1 runs from 64x64 on
  // (argument 3).
  std::vector<int> splits;
  std::vector<Timing> pipelined;
  int best = 0;
  for (int split : {1, 3, 5, 8, 12, 16, 32}) {
    const std::int64_t micro_batches = (batch + split - 1) / split;
    const std::int64_t last = batch - (micro_batches - 1) * split;
    if (last == 1 && size < 64) {
      std::printf("pipelined split %2d: skipped at %lldx%lld (BatchNorm would see one value per "
                  "channel in layer4; run with size 64)\n",
                  split, static_cast<long long>(size), static_cast<long long>(size));
      continue;
    }
    splits.push_back(split);
    pipelined.push_back(micro_batches == 1 ? model_parallel : run_pipeline(split));
    const Timing& t = pipelined.back();
    std::printf("pipelined split %2d: %6.1f ms/step +- %5.1f (%2lld micro-batch%s, the last of "
                "%2lld; loss %.4f -> %.4f)%s\n",
                split, t.mean * 1e3 / steps, t.stddev * 1e3 / steps,
                static_cast<long long>(micro_batches), micro_batches == 1 ? "" : "es",
                static_cast<long long>(last), t.first_loss, t.last_loss,
                micro_batches == 1 ? ": the model-parallel run" : "");
    if (t.mean < pipelined[static_cast<std::size_t>(best)].mean) {
      best = static_cast<int>(pipelined.size()) - 1;
    }
  }
  const Timing& fastest = pipelined[static_cast<std::size_t>(best)];
  std::printf("best split %d: %.2fx the model-parallel speed, %.2fx one device's\n",
              splits[static_cast<std::size_t>(best)], model_parallel.mean / fastest.mean,
              one.mean / fastest.mean);

  std::FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return 1;
  }
  std::fprintf(out, "{\n  \"model\": \"resnet18 %lldx%lld\", \"batch\": %lld, \"steps\": %d, \"runs\": %d,\n",
               static_cast<long long>(size), static_cast<long long>(size),
               static_cast<long long>(batch), steps, runs);
  std::fprintf(out, "  \"balance\": [%d, %d],\n", balance[0], balance[1]);
  std::fprintf(out, "  \"one_device\": {\"mean\": %.6f, \"std\": %.6f},\n", one.mean, one.stddev);
  std::fprintf(out, "  \"model_parallel\": {\"mean\": %.6f, \"std\": %.6f},\n",
               model_parallel.mean, model_parallel.stddev);
  std::fprintf(out, "  \"best_split\": %d,\n  \"pipelined\": [\n", splits[static_cast<std::size_t>(best)]);
  for (std::size_t i = 0; i < splits.size(); ++i) {
    std::fprintf(out, "    {\"split\": %d, \"mean\": %.6f, \"std\": %.6f}%s\n", splits[i],
                 pipelined[i].mean, pipelined[i].stddev, i + 1 < splits.size() ? "," : "");
  }
  std::fprintf(out, "  ]\n}\n");
  std::fclose(out);
  std::printf("wrote %s (draw it with: /usr/bin/python3 bench/plot.py %s)\n", path.c_str(), path.c_str());
  return 0;
}
