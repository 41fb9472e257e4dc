// An installed Tessera, used the way the README tells users to: one include, `ts::`.
#include <tessera/tessera.hpp>

#include <iostream>

namespace ts = tessera;

int main() {
  const ts::Device host = ts::Device::parse("cpu");
  std::cout << "devices: " << host.str() << " (" << ts::cpu::device_count() << " virtual), cuda "
            << (ts::cuda::is_available() ? "available" : "not available") << "\n";

  auto x = ts::ones<float>({2, 3});
  std::cout << x << "\n";
  if (x.numel() != 6 || x.to_vector() != std::vector<float>(6, 1.0f)) {
    std::cerr << "find_package consumer: ones({2, 3}) is wrong\n";
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
    std::cerr << "find_package consumer: the loss did not fall (" << first << " -> " << last << ")\n";
    return 1;
  }
  std::cout << "find_package consumer: ok\n";
  return 0;
}
