// Activation layers: ReLU, Sigmoid and Tanh as plain classes (no parameters, no state, not
// registered), so `Sequential(Linear, ReLU, Linear)` costs nothing for them. Their forward returns
// the lazy expression, which the next layer fuses into its own pass.
#pragma once

#include "tessera/expr/operators.hpp"

namespace tessera::nn {

/// max(x, 0), elementwise (torch.nn.ReLU).
struct ReLU {
  template <class X>
  auto forward(const X& x) const {
    return relu(x);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }
};

/// 1 / (1 + exp(-x)), elementwise (torch.nn.Sigmoid).
struct Sigmoid {
  template <class X>
  auto forward(const X& x) const {
    return sigmoid(x);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }
};

/// tanh(x), elementwise (torch.nn.Tanh).
struct Tanh {
  template <class X>
  auto forward(const X& x) const {
    return tanh(x);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }
};

}  // namespace tessera::nn
