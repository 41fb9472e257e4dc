// What a trainable tensor is to the tracer: a value and its gradient, shared by every handle to it
// (nn::Parameter, the optimisers, compiled Programs). A Program binds the slot's current value
// each time it runs, so `module.to(i)` or `load_state_dict` that replace or overwrite the value are
// seen by programs and optimisers built before them.
#pragma once

#include "tessera/tensor/tensor.hpp"

namespace tessera::autograd {

template <Dtype T, DeviceKind K>
struct parameter_slot {
  Tensor<T, K> value;
  /// Undefined until the first backward (or optimiser) gives it a gradient; backward adds to it.
  /// Read it through gradient(): after zero_grad() its zeros may not be written yet.
  Tensor<T, K> grad;
  bool requires_grad = true;
  /// Set by zero_grad(): `grad` is zero in meaning but its memory is not written. A program's
  /// backward then writes the parameter's first gradient contribution instead of adding it to
  /// zeros (no pass over the buffer to zero it and none to read the zeros back), and gradient()
  /// writes the zeros for any other reader. The buffer is kept (no allocation at the next step).
  bool grad_zero = false;

  /// The gradient, its zeros written first when zero_grad() left them unwritten.
  Tensor<T, K>& gradient() {
    if (grad_zero) {
      grad.zero_();
      grad_zero = false;
    }
    return grad;
  }
  /// The gradient is zero from now on (nothing when there is none).
  void zero_grad() noexcept { grad_zero = grad.defined(); }
  /// Replaces the gradient by `g` (shared), or clears it.
  void set_grad(Tensor<T, K> g) noexcept {
    grad = std::move(g);
    grad_zero = false;
  }
};

}  // namespace tessera::autograd
