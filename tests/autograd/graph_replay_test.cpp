// Options::cuda_graph where no CUDA graph can run (autograd/detail/graph_replay.hpp): a CPU
// program with the option trains exactly as without it (the same steps on the same values, bit
// for bit) and says why it uses no graph; the nodes' capture blockers name what a replay could
// not run. The replays themselves are checked on a GPU by tests/cuda/graph_test.cu.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/tessera.hpp"

namespace graph_replay_test {  // one namespace per test file: unity builds

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;

namespace {

struct Net : nn::Module {
  nn::Linear<float> fc1{6, 12};
  nn::BatchNorm1d<float> bn{12};
  nn::Linear<float> fc2{12, 4};
  Net() : Module("Net") {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc2(ts::relu(bn(fc1(x))));
  }
};

struct Run {
  std::vector<float> losses;
  std::vector<float> parameters;
  std::string status_before, status_after;
};

Run train(bool graphs) {
  ts::manual_seed(5);
  Net net;
  auto program = ag::compile(
      [&](ag::Var<float> x, ag::Var<std::int64_t> y) { return nn::cross_entropy(net.forward(x), y); },
      ag::input<float>({8, 6}), ag::input<std::int64_t>({8}), ag::Options{.cuda_graph = graphs});
  ts::optim::Adam adam(net.parameters(), {.lr = 0.01});
  Run run;
  run.status_before = program.cuda_graphs();
  const auto labels = ts::from_vector<std::int64_t>({0, 1, 2, 3, 3, 2, 1, 0}, {8});
  for (int step = 0; step < 4; ++step) {
    if (step == 2) adam.set_group_lr(0, 0.002);  // a learning-rate change between steps
    const auto x = ts::randn<float>({8, 6});
    adam.zero_grad();
    run.losses.push_back(program.forward(x, labels).item());
    program.backward();
    adam.step();
  }
  run.status_after = program.cuda_graphs();
  for (const auto& [name, parameter] : net.named_parameters()) {
    (void)name;
    for (float v : parameter.value().as<float, ts::cpu>().to_vector()) run.parameters.push_back(v);
  }
  return run;
}

}  // namespace

TEST_CASE("cuda_graph on a CPU program trains as without it and says why", "[autograd][graph]") {
  const Run plain = train(false);
  const Run graphed = train(true);
  CHECK(plain.status_before.rfind("off", 0) == 0);
  CHECK(graphed.status_before == "not run yet");
  CHECK(graphed.status_after == "not used: the program is not on one CUDA device");
  REQUIRE(graphed.losses.size() == plain.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i) CHECK(graphed.losses[i] == plain.losses[i]);
  CHECK(graphed.parameters == plain.parameters);
  // The loss moved: the steps ran (and at the learning rates given).
  CHECK(plain.losses.back() != plain.losses.front());
}

TEST_CASE("what a CUDA graph cannot replay is named by its node", "[autograd][graph]") {
  // Random numbers: drawn from the generator's offset on the host at each run.
  ag::detail::rand_node<float, ts::cpu> random;
  REQUIRE(random.capture_blocker() != nullptr);
  CHECK(std::string(random.capture_blocker()).find("random numbers") != std::string::npos);

  // on_forward effects run host code at every forward; the library clears the blocker of those
  // that only queue device work (BatchNorm's running statistics with a momentum).
  ag::detail::effect_node effect({0}, [](const ag::detail::value_table&) {});
  REQUIRE(effect.capture_blocker() != nullptr);
  CHECK(std::string(effect.capture_blocker()).find("on_forward") != std::string::npos);
  effect.set_capture_blocker(nullptr);
  CHECK(effect.capture_blocker() == nullptr);

  // Dropout: a blocker in training (its mask is random), none in eval (ones), and the mode is
  // part of the replay key, so a switch captures again.
  nn::Dropout dropout(0.5);
  nn::detail::dropout_mask_node<float, ts::cpu, nn::Dropout> mask(dropout, 0.5);
  ag::detail::value_table table;
  REQUIRE(mask.capture_blocker() != nullptr);
  CHECK(std::string(mask.capture_blocker()).find("dropout in training") != std::string::npos);
  const std::int64_t training_key = mask.prepare_replay(table);
  dropout.eval();
  CHECK(mask.capture_blocker() == nullptr);
  CHECK(mask.prepare_replay(table) != training_key);
}

}  // namespace graph_replay_test
