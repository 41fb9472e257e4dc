// Traced programs against PyTorch (tests/oracles/nn_torch.py, section "autograd"): an MLP with
// BatchNorm1d in training mode and cross entropy over int64 targets given as a program input
// (loss, every parameter's gradient, the running statistics after the forward), and the same
// model in evaluation mode with mse_loss; float32 and float64.
#include <catch2/catch.hpp>

#include <string>

#include "nn/torch_oracle.hpp"
#include "tessera/tessera.hpp"

namespace torch_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

namespace {

template <class T>
struct Net : nn::Module {
  nn::Linear<T> fc1{5, 8};
  nn::BatchNorm1d<T> bn{8};
  nn::Linear<T> fc2{8, 3};
  Net() {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc2(ts::relu(bn(fc1(x))));
  }
};

template <class T>
void check_against_torch(const char* dtype, double rtol, double atol) {
  static const torch_oracle::file oracle("autograd");
  const std::string tag = std::string("mlp.") + dtype + ".";
  Net<T> net;
  for (auto& [name, p] : net.named_parameters()) {
    p.value().template as<T>().copy_(oracle.tensor<T>(tag + name));
  }
  const auto x = oracle.tensor<T>(tag + "x");
  const auto targets = oracle.tensor<std::int64_t>(tag + "targets");
  SECTION("training mode, cross entropy, targets as an input") {
    auto program = ag::compile(
        [&](ag::Var<T> input, ag::Var<std::int64_t> labels) {
          return nn::cross_entropy(net.forward(input), labels);
        },
        ag::input<T>({6, 5}), ag::input<std::int64_t>({6}));
    const auto loss = program.forward(x, targets);
    torch_oracle::check_close(loss.clone(), oracle.at(tag + "loss"), rtol, atol);
    program.backward();
    for (auto& [name, p] : net.named_parameters()) {
      INFO(name);
      torch_oracle::check_close(p.grad().template as<T>(), oracle.at(tag + "grad." + name), rtol, atol);
    }
    torch_oracle::check_close(net.bn.running_mean().value(), oracle.at(tag + "running_mean"), rtol, atol);
    torch_oracle::check_close(net.bn.running_var().value(), oracle.at(tag + "running_var"), rtol, atol);
    CHECK(net.bn.num_batches_tracked().value().item() == 1);
    // A target out of range is an error at forward, naming it.
    auto bad = targets.clone();
    bad.data()[2] = 3;
    CHECK_THROWS_WITH(program.forward(x, bad), Catch::Contains("target 3 is out of range for 3 classes"));
  }
  SECTION("evaluation mode, mse") {
    // The running statistics PyTorch had after its training forward.
    net.bn.running_mean().value().copy_(oracle.tensor<T>(tag + "running_mean"));
    net.bn.running_var().value().copy_(oracle.tensor<T>(tag + "running_var"));
    net.eval();
    const auto target = oracle.tensor<T>(tag + "target");
    auto program = ag::compile(
        [&](ag::Var<T> input, ag::Var<T> wanted) { return nn::mse_loss(net.forward(input), wanted); },
        ag::input<T>({6, 5}), ag::input<T>({6, 3}));
    torch_oracle::check_close(program.forward(x, target).clone(), oracle.at(tag + "eval_loss"), rtol, atol);
    program.backward();
    for (auto& [name, p] : net.named_parameters()) {
      INFO(name);
      torch_oracle::check_close(p.grad().template as<T>(), oracle.at(tag + "eval_grad." + name), rtol, atol);
    }
  }
}

}  // namespace

TEST_CASE("a traced MLP with BatchNorm1d matches PyTorch in float32", "[autograd][torch]") {
  check_against_torch<float>("float32", 2e-5, 1e-6);
}

TEST_CASE("a traced MLP with BatchNorm1d matches PyTorch in float64", "[autograd][torch]") {
  check_against_torch<double>("float64", 1e-12, 1e-14);
}

TEST_CASE("traced Dropout: a fresh mask each forward, scaled, identity in eval", "[autograd]") {
  nn::Dropout drop(0.25);
  const auto ones = ts::ones<float>({64, 64});
  auto keep = ag::compile([&](ag::Var<float> x) { return drop(x * 1.0); }, ag::input<float>({64, 64}),
                          ag::Options{.mode = ag::Mode::inference});
  const auto a = keep.forward(ones).to_vector();
  const auto b = keep.forward(ones).to_vector();
  std::size_t zeros = 0;
  for (float v : a) {
    CHECK((v == 0.0f || v == Approx(1.0f / 0.75f)));
    zeros += v == 0.0f;
  }
  // 4096 draws at p = 0.25: mean 1024, sd 27.7; within 5 sd.
  CHECK(std::abs(static_cast<double>(zeros) - 1024.0) < 5 * 27.7);
  CHECK(a != b);  // a new mask each forward
  // The gradient flows through the kept elements only, scaled: for y = dropout(x * w) with
  // x = w = 1, dL/dw of L = sum(y) is y itself.
  nn::Parameter<float> w(ts::ones<float>({64, 64}));
  auto training = ag::compile(
      [&](ag::Var<float> x) {
        ag::Var<float> y = drop(x * w.like(x));
        return std::tuple{ts::sum(y), y};
      },
      ag::input<float>({64, 64}));
  const auto [loss, y] = training.forward(ones);
  const auto kept = y.to_vector();
  training.backward();
  CHECK(w.grad().to_vector() == kept);
  drop.eval();
  auto identity = ag::compile([&](ag::Var<float> x) { return drop(x * 1.0); }, ag::input<float>({4}),
                              ag::Options{.mode = ag::Mode::inference});
  const auto x = ts::from_vector<float>({1, 2, 3, 4}, {4});
  CHECK(identity.forward(x).to_vector() == x.to_vector());
}

}  // namespace torch_test
