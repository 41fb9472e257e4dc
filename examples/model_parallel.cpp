// Model parallelism as in PyTorch's "Single-Machine Model Parallel Best Practices" tutorial: a
// toy model whose first layer lives on one device and whose last layer lives on another, the
// activations moved between them with a differentiable `.to(i)` inside the traced function. Here
// the two devices are virtual CPU devices (TESSERA_CPU_DEVICES=2; with one device both stages
// share it). The same model on a single device, from the same initial weights, gives the same
// losses: the split changes where the work runs, not what it computes.
#include <cmath>
#include <cstdio>

#include "tessera/tessera.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

// net1 on `first`, net2 on `second`; forward moves the hidden activations across.
struct ToyModel : nn::Module {
  nn::Linear<float> net1, net2;
  int second;
  ToyModel(int first_device, int second_device)
      : net1(10, 10, true, first_device), net2(10, 5, true, second_device), second(second_device) {
    register_module("net1", net1);
    register_module("net2", net2);
  }
  ag::Var<float> forward(const ag::Var<float>& x) const {
    const ag::Var<float> hidden = ts::relu(net1(x));
    return net2(hidden.to(second));  // the copy's gradient flows back to the first device
  }
};

// Trains `model` for `steps` SGD steps on fixed data (drawn on cpu:0, the targets then moved to
// the last stage's device) and returns the losses.
std::vector<float> train(ToyModel& model, int steps) {
  ts::manual_seed(1);
  const auto inputs = ts::randn<float>({20, 10}, 0);
  const auto labels = ts::randn<float>({20, 5}, 0).to(model.second);
  auto step = ag::compile(
      [&](ag::Var<float> x, ag::Var<float> y) { return nn::mse_loss(model.forward(x), y); },
      ag::input<float>({20, 10}, 0), ag::input<float>({20, 5}, model.second));
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.1});
  std::vector<float> losses;
  for (int i = 0; i < steps; ++i) {
    sgd.zero_grad();
    losses.push_back(step.forward(inputs, labels).item());
    step.backward();
    sgd.step();
  }
  return losses;
}

int main() {
  const int last = ts::cpu::device_count() > 1 ? 1 : 0;
  std::printf("net1 on cpu:0, net2 on cpu:%d\n", last);

  ts::manual_seed(0);
  ToyModel split(0, last);
  ToyModel single(0, 0);
  single.load_state_dict(split.state_dict());  // the same initial weights, all on cpu:0

  const auto split_losses = train(split, 10);
  const auto single_losses = train(single, 10);
  double largest = 0;
  for (std::size_t i = 0; i < split_losses.size(); ++i) {
    std::printf("step %zu: loss %.5f (one device: %.5f)\n", i,
                static_cast<double>(split_losses[i]), static_cast<double>(single_losses[i]));
    largest = std::max(largest, std::abs(static_cast<double>(split_losses[i] - single_losses[i])));
  }
  std::printf("net2.weight is on %s; largest loss difference from one device: %g\n",
              split.net2.weight().value().device().str().c_str(), largest);
  const bool fell = split_losses.back() < split_losses.front();
  return largest <= 1e-6 && fell ? 0 : 1;
}
