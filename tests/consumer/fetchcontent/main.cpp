// Tessera pulled in with FetchContent, used the way the README tells users to.
#include <tessera/tessera.hpp>

#include <iostream>

namespace ts = tessera;

int main() {
  const auto device = ts::Device::parse("cpu:0");
  auto x = ts::arange<float>(6).reshape({2, 3});
  std::cout << "on " << device.str() << ":\n" << x << "\n";
  const std::vector<float> expected{0, 1, 2, 3, 4, 5};
  if (x.shape() != ts::Shape{2, 3} || x.to_vector() != expected) {
    std::cerr << "fetchcontent consumer: arange(6).reshape({2, 3}) is wrong\n";
    return 1;
  }
  // A training step: the autograd program, the module and the optimiser are what the compiled
  // mode (tessera::compiled) compiles in its library, so this links against it there.
  ts::nn::Linear<float> layer(3, 1);
  auto step = ts::autograd::compile(
      [&](ts::autograd::Var<float> in) { return ts::nn::mse_loss(layer.forward(in), ts::zeros<float>({2, 1})); },
      ts::autograd::input<float>({2, 3}));
  ts::optim::SGD sgd(layer.parameters(), {.lr = 0.1});
  float first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    sgd.zero_grad();
    last = step.forward(x).item();
    if (i == 0) first = last;
    step.backward();
    sgd.step();
  }
  if (!(last < first)) {
    std::cerr << "fetchcontent consumer: the loss did not fall (" << first << " -> " << last << ")\n";
    return 1;
  }
  std::cout << "fetchcontent consumer: ok\n";
  return 0;
}
