// Training-step benchmark: forward, backward and an SGD-with-momentum step of an MLP, through a
// compiled ts::autograd Program against LibTorch 1.13's eager autograd, same threads, same
// initial weights and data. MLP 64-128-10 at batch 1, 32 and 256, and 784-1024-1024-10 at batch
// 256 (ReLU between layers, mse_loss against a random target). Before timing, one step of each
// from the same state must give the same loss (else the benchmark aborts: it would measure
// different work). Also printed: each program's memory plan (planned arena against one buffer per
// value, the inference plan against the training plan) and what checkpointing saves and costs on
// the large MLP (segments = 2: planned bytes and step time with and without). And mixed precision:
// the same MLPs at batch 256 with half weights (fp32 master weights in the optimiser, the loss in
// float, GradScaler), against the float step.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_report.hpp"
#include "tessera/autograd.hpp"
#include "tessera/backend/cpu/thread_pool.hpp"
#include "tessera/nn.hpp"
#include "tessera/optim.hpp"
#include "tessera/tensor/factories.hpp"

#if TESSERA_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

namespace {

struct config {
  std::string name;
  std::vector<int> widths;  // input, hidden..., output
  int batch;
};

const std::vector<config>& configs() {
  static const std::vector<config> all = {
      {"mlp64_b1", {64, 128, 10}, 1},
      {"mlp64_b32", {64, 128, 10}, 32},
      {"mlp64_b256", {64, 128, 10}, 256},
      {"mlp784_b256", {784, 1024, 1024, 10}, 256},
  };
  return all;
}

/// An MLP of Linear layers of dtype T with ReLU between them (a user model with a templated
/// forward). MlpOf<ts::half> is the mixed-precision one (fp32 masters in the optimiser, the loss
/// computed in float, loss scaling).
template <class T>
struct MlpOf : nn::Module {
  std::vector<nn::Linear<T>> layers;
  explicit MlpOf(const std::vector<int>& widths) {
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.emplace_back(widths[i], widths[i + 1]);
      register_module(std::to_string(i), layers.back());
    }
  }
  template <class X>
  auto forward(const X& x) const {
    ag::Var<T> h = layers[0](x);
    for (std::size_t i = 1; i < layers.size(); ++i) h = layers[i](ts::relu(h));
    return h;
  }
};
using Mlp = MlpOf<float>;
using HalfMlp = MlpOf<ts::half>;

using ts::bench::random_tensor;

/// A Tessera training setup: the model, its program, the optimiser and the data.
struct tessera_trainer {
  Mlp model;
  ts::Tensor<float> x, y;
  ag::Program<ts::Tensor<float>> program;
  ts::optim::SGD sgd;
  tessera_trainer(const config& c, ag::Options options)
      : model(c.widths),
        x(random_tensor({c.batch, c.widths.front()}, 1)),
        y(random_tensor({c.batch, c.widths.back()}, 2)),
        program(ag::compile(
            [this](ag::Var<float> input, ag::Var<float> target) {
              return nn::mse_loss(model.forward(input), target);
            },
            ag::input<float>(x.shape()), ag::input<float>(y.shape()), options)),
        sgd(model.parameters(), {.lr = 0.01, .momentum = 0.9}) {}
  float step() {
    sgd.zero_grad();
    const float loss = program.forward(x, y).item();
    program.backward();
    sgd.step();
    return loss;
  }
};

/// tessera_trainer's step in half precision, with SGD (momentum) on fp32 masters and GradScaler.
struct half_trainer {
  HalfMlp model;
  ts::Tensor<ts::half> x;
  ts::Tensor<float> y;
  ag::Program<ts::Tensor<float>> program;
  ts::optim::SGD sgd;
  ts::optim::GradScaler scaler;
  explicit half_trainer(const config& c)
      : model(c.widths),
        x(random_tensor({c.batch, c.widths.front()}, 1).to<ts::half>()),
        y(random_tensor({c.batch, c.widths.back()}, 2)),
        program(ag::compile(
            [this](ag::Var<ts::half> input, ag::Var<float> target) {
              return nn::mse_loss(ts::cast<float>(model.forward(input)), target);
            },
            ag::input<ts::half>(x.shape()), ag::input<float>(y.shape()))),
        sgd(model.parameters(), {.lr = 0.01, .momentum = 0.9}) {}
  float step() {
    sgd.zero_grad();
    const float loss = program.forward(x, y).item();
    program.backward(scaler);
    scaler.step(sgd);
    scaler.update();
    return loss;
  }
};

#if TESSERA_BENCH_TORCH
/// The same MLP in LibTorch, with the Tessera model's initial weights.
struct torch_trainer {
  std::vector<torch::nn::Linear> layers;
  torch::Tensor x, y;
  std::unique_ptr<torch::optim::SGD> sgd;
  torch_trainer(const config& c, Mlp& source, const ts::Tensor<float>& tx,
                const ts::Tensor<float>& ty) {
    std::vector<torch::Tensor> params;
    auto to_torch = [](const ts::Tensor<float>& t) {
      const auto values = t.to_vector();
      std::vector<int64_t> sizes;
      for (int d = 0; d < t.dim(); ++d) sizes.push_back(t.size(d));
      return torch::from_blob(const_cast<float*>(values.data()), sizes, torch::kFloat32).clone();
    };
    for (std::size_t i = 0; i + 1 < c.widths.size(); ++i) {
      layers.emplace_back(torch::nn::LinearOptions(c.widths[i], c.widths[i + 1]));
      torch::NoGradGuard no_grad;
      layers.back()->weight.copy_(to_torch(source.layers[i].weight().value()));
      layers.back()->bias.copy_(to_torch(source.layers[i].bias().value()));
      params.push_back(layers.back()->weight);
      params.push_back(layers.back()->bias);
    }
    x = to_torch(tx);
    y = to_torch(ty);
    sgd = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  float step() {
    sgd->zero_grad();
    torch::Tensor h = layers[0]->forward(x);
    for (std::size_t i = 1; i < layers.size(); ++i) h = layers[i]->forward(torch::relu(h));
    torch::Tensor loss = torch::mse_loss(h, y);
    loss.backward();
    sgd->step();
    return loss.item<float>();
  }
};

void check_same_loss(const char* what, float mine, float theirs) {
  if (!(std::abs(mine - theirs) <= 1e-4f * (1 + std::abs(theirs)))) {
    std::fprintf(stderr, "train_bench: %s: Tessera's loss %.8g differs from LibTorch's %.8g\n", what,
                 mine, theirs);
    std::abort();
  }
}
#endif

void register_benchmarks() {
  for (const config& c : configs()) {
    benchmark::RegisterBenchmark(("train_tessera_" + c.name).c_str(), [c](benchmark::State& state) {
      ts::manual_seed(42);
      tessera_trainer trainer(c, {});
      const float first = trainer.step();
#if TESSERA_BENCH_TORCH
      {
        ts::manual_seed(42);
        tessera_trainer fresh(c, {});
        torch_trainer reference(c, fresh.model, fresh.x, fresh.y);
        check_same_loss(c.name.c_str(), fresh.step(), reference.step());
      }
#endif
      float loss = first;
      for (auto _ : state) loss = trainer.step();
      if (!std::isfinite(loss)) state.SkipWithError("the loss is not finite");
      state.counters["batch"] = c.batch;
    })->UseRealTime()->Unit(benchmark::kMicrosecond);
#if TESSERA_BENCH_TORCH
    benchmark::RegisterBenchmark(("train_torch_" + c.name).c_str(), [c](benchmark::State& state) {
      ts::manual_seed(42);
      tessera_trainer source(c, {});
      torch_trainer trainer(c, source.model, source.x, source.y);
      float loss = trainer.step();
      for (auto _ : state) loss = trainer.step();
      if (!std::isfinite(loss)) state.SkipWithError("the loss is not finite");
      state.counters["batch"] = c.batch;
    })->UseRealTime()->Unit(benchmark::kMicrosecond);
#endif
  }
  for (const config& c : configs()) {
    if (c.batch < 256) continue;
    benchmark::RegisterBenchmark(("train_tessera_half_" + c.name).c_str(), [c](benchmark::State& state) {
      ts::manual_seed(42);
      half_trainer trainer(c);
      float loss = trainer.step();
      for (auto _ : state) loss = trainer.step();
      if (!std::isfinite(loss)) state.SkipWithError("the loss is not finite");
      state.counters["batch"] = c.batch;
    })->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  const config& large = configs().back();
  benchmark::RegisterBenchmark(("train_tessera_checkpointed_" + large.name).c_str(),
                               [large](benchmark::State& state) {
                                 ts::manual_seed(42);
                                 tessera_trainer trainer(large, {.checkpoint = {.segments = 2}});
                                 float loss = trainer.step();
                                 for (auto _ : state) loss = trainer.step();
                                 if (!std::isfinite(loss)) state.SkipWithError("not finite");
                               })
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

void print_plans() {
  std::printf("\nmemory plans (bytes; planned = one arena, naive = a buffer per value):\n");
  for (const config& c : configs()) {
    ts::manual_seed(42);
    tessera_trainer training(c, {});
    tessera_trainer inference(c, {.mode = ag::Mode::inference});
    tessera_trainer checkpointed(c, {.checkpoint = {.segments = 2}});
    const auto& t = training.program.plan();
    const auto& i = inference.program.plan();
    const auto& k = checkpointed.program.plan();
    std::printf(
        "  %-12s training: planned %9zu / naive %9zu = %.2f; inference planned %9zu (%.2f of "
        "training); checkpointed (2 segments) planned %9zu (%.2f of training)\n",
        c.name.c_str(), t.planned_bytes, t.naive_bytes,
        double(t.planned_bytes) / double(t.naive_bytes), i.planned_bytes,
        double(i.planned_bytes) / double(t.planned_bytes), k.planned_bytes,
        double(k.planned_bytes) / double(t.planned_bytes));
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const int threads = ts::cpu::num_threads();
#if TESSERA_BENCH_TORCH
  at::set_num_threads(threads);
#endif
  register_benchmarks();
  ts::bench::recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  std::printf(
      "\nthroughput ratios (baseline time / tessera time, higher is better for tessera; %d "
      "threads everywhere):\n",
      threads);
  std::vector<ts::bench::summary_line> lines;
  for (const config& c : configs()) {
    const double goal = c.batch <= 32 ? 3.0 : (c.name == configs().back().name ? 1.2 : 0.0);
    lines.push_back({"training step " + c.name,
                     {{"tessera / torch", "train_tessera_" + c.name, "train_torch_" + c.name, goal}}});
  }
  for (const config& c : configs()) {
    if (c.batch < 256) continue;
    // Reported on CPU (half arithmetic is emulated there, and half GEMM has no BLAS); the goal,
    // 1.6x, is for GPUs.
    lines.push_back({"half step " + c.name,
                     {{"float / half", "train_tessera_half_" + c.name, "train_tessera_" + c.name, 0}}});
  }
  lines.push_back({"checkpointing " + configs().back().name,
                   {{"step time plain / checkpointed",
                     "train_tessera_checkpointed_" + configs().back().name,
                     "train_tessera_" + configs().back().name, 0}}});
  for (const auto& line : lines) ts::bench::print_summary(reporter.results, line);
  print_plans();
#if !TESSERA_BENCH_TORCH
  std::printf("torch: LibTorch not found at configure time\n");
#endif
  return 0;
}
