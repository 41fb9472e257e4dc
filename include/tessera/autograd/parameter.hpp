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
  Tensor<T, K> grad;
  bool requires_grad = true;
};

}  // namespace tessera::autograd
