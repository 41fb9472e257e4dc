// Options::cuda_graph on a GPU (autograd/detail/graph_replay.hpp): a program whose forward and
// backward replay CUDA graphs trains bit for bit as the same program without them (Adam with a
// learning-rate change between steps, BatchNorm's running statistics, cross_entropy; a
// convolutional net on cuDNN with SGD and momentum), captures again when a module switches to
// eval(), checks bad targets before a replay (throwing, nothing run), replays dropout in
// training with the masks the plain program draws (a new seed reaching the graph), and runs as
// usual, saying why, where a replay cannot (BatchNorm with momentum None).
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/tessera.hpp"

namespace cuda_graph_test {  // one namespace per file: a unity build

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;

namespace {

struct Trajectory {
  std::vector<float> losses;
  std::vector<float> state;  // parameters and buffers after the last step
  std::string status;
};

template <class T>
void append(std::vector<float>& out, const ts::Tensor<T, ts::cuda>& t) {
  for (const T v : t.contiguous().cpu(0).to_vector()) out.push_back(static_cast<float>(v));
}

/// The model's parameters and BatchNorm's running statistics after the last step, and the
/// program's CUDA graph status.
template <class Net, class Program>
void finish(Trajectory& t, Net& net, const Program& program) {
  for (const auto& [name, p] : net.named_parameters()) {
    (void)name;
    append(t.state, p.value().template as<float, ts::cuda>());
  }
  append(t.state, net.bn.running_mean().value());
  append(t.state, net.bn.running_var().value());
  t.status = program.cuda_graphs();
}

struct Mlp : nn::Module {
  nn::Linear<float, ts::cuda> fc1{10, 32, true, 0};
  nn::BatchNorm1d<float, ts::cuda> bn;
  nn::Linear<float, ts::cuda> fc2{32, 5, true, 0};
  explicit Mlp(std::optional<double> momentum) : Module("Mlp"), bn(32, 1e-5, momentum, true, true, 0) {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc2(ts::relu(bn(fc1(x))));
  }
};

/// Steps of an MLP with BatchNorm1d, cross_entropy and Adam; the learning rate drops at step 3;
/// `bad_target_at`: a step whose targets hold 7 (five classes), which with graphs must throw and
/// change nothing, and which the plain program skips; `eval_from`: the steps from which the model
/// runs in eval mode (forward only).
Trajectory train_mlp(bool graphs, std::optional<double> momentum, int steps, int bad_target_at = -1,
                     int eval_from = 1 << 30) {
  ts::manual_seed(21);
  Mlp net(momentum);
  auto program = ag::compile(
      [&](ag::Var<float, ts::cuda> x, ag::Var<std::int64_t, ts::cuda> y) {
        return nn::cross_entropy(net.forward(x), y);
      },
      ag::input<float, ts::cuda>({16, 10}, 0), ag::input<std::int64_t, ts::cuda>({16}, 0),
      ag::Options{.cuda_graph = graphs});
  ts::optim::Adam adam(net.parameters(), {.lr = 1e-2});
  std::vector<std::int64_t> classes(16);
  for (std::size_t n = 0; n < classes.size(); ++n) classes[n] = static_cast<std::int64_t>(n % 5);
  const auto labels = ts::from_vector<std::int64_t, ts::cuda>(classes, {16}, 0);
  classes[3] = 7;
  const auto bad = ts::from_vector<std::int64_t, ts::cuda>(classes, {16}, 0);
  Trajectory t;
  for (int step = 0; step < steps; ++step) {
    if (step == 3) adam.set_group_lr(0, 2e-3);
    const auto x = ts::randn<float, ts::cuda>({16, 10}, 0);
    if (step == bad_target_at) {
      // The program with graphs checks the targets before anything runs, so it must go on as the
      // plain program that never saw this call (whose own forward would have moved BatchNorm's
      // running statistics before its loss node threw).
      if (graphs) CHECK_THROWS_WITH(program.forward(x, bad), Catch::Contains("7"));
      continue;
    }
    if (step == eval_from) net.eval();
    if (step >= eval_from) {
      t.losses.push_back(program.forward(x, labels).cpu(0).item());
      continue;
    }
    adam.zero_grad();
    t.losses.push_back(program.forward(x, labels).cpu(0).item());
    program.backward();
    adam.step();
  }
  finish(t, net, program);
  return t;
}

struct ConvNet : nn::Module {
  nn::Conv2d<float, ts::cuda> conv{3, 8, 3, {.padding = 1}, 0};
  nn::BatchNorm2d<float, ts::cuda> bn{8, 1e-5, 0.1, true, true, 0};
  nn::Linear<float, ts::cuda> fc{8 * 4 * 4, 4, true, 0};
  nn::MaxPool2d pool{2};
  ConvNet() : Module("ConvNet") {
    register_module("conv", conv);
    register_module("bn", bn);
    register_module("fc", fc);
  }
  template <class X>
  auto forward(const X& x) const {
    const auto h = pool(ts::relu(bn(conv(x))));
    return fc(h.view({h.size(0), 8 * 4 * 4}));
  }
};

/// `in_arena`: Options::gradients_in_arena (the parameters' gradients in the program's arena).
Trajectory train_conv(bool graphs, int steps, bool in_arena = false) {
  ts::manual_seed(22);
  ConvNet net;
  auto program = ag::compile(
      [&](ag::Var<float, ts::cuda> x, ag::Var<std::int64_t, ts::cuda> y) {
        return nn::cross_entropy(net.forward(x), y);
      },
      ag::input<float, ts::cuda>({4, 3, 8, 8}, 0), ag::input<std::int64_t, ts::cuda>({4}, 0),
      ag::Options{.cuda_graph = graphs, .gradients_in_arena = in_arena});
  ts::optim::SGD sgd(net.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
  const auto labels = ts::from_vector<std::int64_t, ts::cuda>({0, 1, 2, 3}, {4}, 0);
  Trajectory t;
  for (int step = 0; step < steps; ++step) {
    const auto x = ts::randn<float, ts::cuda>({4, 3, 8, 8}, 0);
    sgd.zero_grad();
    t.losses.push_back(program.forward(x, labels).cpu(0).item());
    program.backward();
    sgd.step();
  }
  finish(t, net, program);
  return t;
}

struct DropoutMlp : nn::Module {
  nn::Linear<float, ts::cuda> fc1{10, 32, true, 0};
  nn::Dropout dropout{0.3};
  nn::Linear<float, ts::cuda> fc2{32, 5, true, 0};
  DropoutMlp() : Module("DropoutMlp") {
    register_module("fc1", fc1);
    register_module("dropout", dropout);
    register_module("fc2", fc2);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc2(dropout(ts::relu(fc1(x))));
  }
};

/// Steps of an MLP with dropout in training and SGD; the inputs are drawn from the same generator
/// between the steps, and ts::manual_seed(99) comes before step `reseed_at`.
Trajectory train_dropout(bool graphs, int steps, int reseed_at) {
  ts::manual_seed(23);
  DropoutMlp net;
  auto program = ag::compile(
      [&](ag::Var<float, ts::cuda> x, ag::Var<std::int64_t, ts::cuda> y) {
        return nn::cross_entropy(net.forward(x), y);
      },
      ag::input<float, ts::cuda>({16, 10}, 0), ag::input<std::int64_t, ts::cuda>({16}, 0),
      ag::Options{.cuda_graph = graphs});
  ts::optim::SGD sgd(net.parameters(), {.lr = 0.1, .momentum = 0.9});
  std::vector<std::int64_t> classes(16);
  for (std::size_t n = 0; n < classes.size(); ++n) classes[n] = static_cast<std::int64_t>(n % 5);
  const auto labels = ts::from_vector<std::int64_t, ts::cuda>(classes, {16}, 0);
  Trajectory t;
  for (int step = 0; step < steps; ++step) {
    if (step == reseed_at) ts::manual_seed(99);
    const auto x = ts::randn<float, ts::cuda>({16, 10}, 0);
    sgd.zero_grad();
    t.losses.push_back(program.forward(x, labels).cpu(0).item());
    program.backward();
    sgd.step();
  }
  for (const auto& [name, p] : net.named_parameters()) {
    (void)name;
    append(t.state, p.value().template as<float, ts::cuda>());
  }
  t.status = program.cuda_graphs();
  return t;
}

void require_same(const Trajectory& graphed, const Trajectory& plain) {
  REQUIRE(graphed.losses.size() == plain.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i) {
    INFO("step " << i);
    CHECK(graphed.losses[i] == plain.losses[i]);
  }
  REQUIRE(graphed.state.size() == plain.state.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < plain.state.size(); ++i) differ += graphed.state[i] != plain.state[i];
  INFO(differ << " of " << plain.state.size() << " parameter and buffer values differ");
  CHECK(differ == 0);
}

/// cuDNN's deterministic algorithms for a scope (bit-for-bit comparisons of two runs).
struct deterministic_cudnn {
  bool before = ts::backends::cudnn::deterministic.load();
  deterministic_cudnn() { ts::backends::cudnn::deterministic = true; }
  ~deterministic_cudnn() { ts::backends::cudnn::deterministic = before; }
};

}  // namespace

TEST_CASE("an MLP replaying CUDA graphs trains as without them", "[cuda][graph]") {
  const Trajectory plain = train_mlp(false, 0.1, 6);
  const Trajectory graphed = train_mlp(true, 0.1, 6);
  require_same(graphed, plain);
  // Step 1 warms up, step 2 captures the forward and the backward, steps 3-6 replay both.
  CHECK(graphed.status == "replaying: 2 capture(s), 10 launch(es)");
  CHECK(plain.status.rfind("off", 0) == 0);
}

TEST_CASE("a convolutional net replaying CUDA graphs trains as without them", "[cuda][graph]") {
  deterministic_cudnn deterministic;
  const Trajectory plain = train_conv(false, 5);
  const Trajectory graphed = train_conv(true, 5);
  require_same(graphed, plain);
  CHECK(graphed.status == "replaying: 2 capture(s), 8 launch(es)");
}

TEST_CASE("gradients in the arena train as without, with and without CUDA graphs",
          "[cuda][graph]") {
  deterministic_cudnn deterministic;
  const Trajectory plain = train_conv(false, 5);
  require_same(train_conv(false, 5, true), plain);
  // The gradients keep their arena addresses from step to step: captured once, as without.
  const Trajectory graphed = train_conv(true, 5, true);
  require_same(graphed, plain);
  CHECK(graphed.status == "replaying: 2 capture(s), 8 launch(es)");
}

TEST_CASE("bad targets before a replay throw and run nothing; eval() captures again",
          "[cuda][graph]") {
  // Step 4's targets hold 7: forward throws before the graph runs, and the program goes on as
  // the plain one that skipped that step.
  const Trajectory plain = train_mlp(false, 0.1, 8, 4, 6);
  const Trajectory graphed = train_mlp(true, 0.1, 8, 4, 6);
  require_same(graphed, plain);
  // Steps 0 (warm-up), 1 (2 captures, 2 launches), 2, 3 and 5 (6 launches); 4 threw; 6 and 7
  // in eval mode, forward only: a new capture of the forward and its launch, then a replay.
  CHECK(graphed.status == "replaying: 3 capture(s), 10 launch(es)");
}

TEST_CASE("dropout in training replays with the plain program's masks, a new seed too",
          "[cuda][graph]") {
  // The masks' fills read their seed and first counter block from device memory, written before
  // each launch from the generator's offset: the same numbers as drawn without graphs, in the
  // same order as the inputs drawn between the steps.
  const Trajectory plain = train_dropout(false, 7, 4);
  const Trajectory graphed = train_dropout(true, 7, 4);
  require_same(graphed, plain);
  // Step 0 warms up; step 1 captures the forward and the backward and launches both; steps 2-6
  // replay them (the new seed at step 4 needs no new capture).
  CHECK(graphed.status == "replaying: 2 capture(s), 12 launch(es)");

  // An inference program that returns the mask applied: each replay a new mask, as the plain
  // program's; eval() replays ones.
  nn::Dropout dropout(0.5);
  const auto x = ts::ones<float, ts::cuda>({256}, 0);
  auto masks = [&](bool graphs, std::string& status) {
    auto program = ag::compile([&](ag::Var<float, ts::cuda> v) { return dropout(v); },
                               ag::input<float, ts::cuda>({256}, 0),
                               ag::Options{.mode = ag::Mode::inference, .cuda_graph = graphs});
    ts::manual_seed(5);
    std::vector<std::vector<float>> out;
    for (int i = 0; i < 4; ++i) out.push_back(program.forward(x).cpu(0).to_vector());
    dropout.eval();
    out.push_back(program.forward(x).cpu(0).to_vector());
    dropout.train();
    status = program.cuda_graphs();
    return out;
  };
  std::string plain_status, graphed_status;
  const auto expected = masks(false, plain_status);
  const auto got = masks(true, graphed_status);
  CHECK(got == expected);
  CHECK(got[2] != got[3]);  // a new mask at each replay
  CHECK(got[4] == std::vector<float>(256, 1.0f));
  // Calls 0 (warm-up), 1 (capture), 2, 3: 3 launches; eval() captures again and launches.
  CHECK(graphed_status == "replaying: 2 capture(s), 4 launch(es)");
}

TEST_CASE("what a CUDA graph cannot replay runs as usual and is named", "[cuda][graph]") {
  const Trajectory plain = train_mlp(false, std::nullopt, 4);
  const Trajectory graphed = train_mlp(true, std::nullopt, 4);
  require_same(graphed, plain);
  CHECK(graphed.status ==
        "not used: BatchNorm with momentum None (its cumulative average reads the batch count on "
        "the host)");
}

}  // namespace cuda_graph_test
