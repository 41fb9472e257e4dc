// Both consumer programs train a Linear layer a few SGD steps through a compiled program: the
// autograd program, the module registry and the optimiser are what tessera::compiled compiles in
// its library, so the compiled-mode consumer really links against it.
#pragma once

#include <tessera/tessera.hpp>

#include <iostream>

// True when the mse loss of `layer(x)` against zeros falls over five SGD steps; says why not.
inline bool loss_falls(const tessera::Tensor<float>& x, const char* who) {
  namespace ts = tessera;
  ts::nn::Linear<float> layer(3, 1);
  auto step = ts::autograd::compile(
      [&](ts::autograd::Var<float> in) {
        return ts::nn::mse_loss(layer.forward(in), ts::zeros<float>({2, 1}));
      },
      ts::autograd::input<float>({2, 3}));
  ts::optim::SGD sgd(layer.parameters(), {.lr = 0.01});  // stable for inputs up to ~10
  float first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    sgd.zero_grad();
    last = step.forward(x).item();
    if (i == 0) first = last;
    step.backward();
    sgd.step();
  }
  if (!(last < first)) {
    std::cerr << who << ": the loss did not fall (" << first << " -> " << last << ")\n";
    return false;
  }
  return true;
}
