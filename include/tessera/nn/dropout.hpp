// Dropout(p): in training, zeroes each element with probability p (a mask drawn from the device's
// Philox generator) and scales the others by 1 / (1 - p); in evaluation mode it is the identity
// (torch.nn.Dropout). A Module so that a parent's train()/eval() reaches it.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>

#include "tessera/expr/assign.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/nn/detail/operand.hpp"
#include "tessera/nn/module.hpp"
#include "tessera/tensor/factories.hpp"

namespace tessera::nn {

class Dropout : public Module {
 public:
  /// Throws std::invalid_argument unless 0 <= p <= 1 (PyTorch's check).
  explicit Dropout(double p = 0.5) : Module("Dropout"), p_(p) {
    if (!(p >= 0.0 && p <= 1.0)) {
      throw std::invalid_argument("Dropout: the probability p must be between 0 and 1, got " +
                                  std::to_string(p));
    }
  }
  Dropout(const Dropout&) = default;

  /// Training: a new tensor where each element is 0 with probability p and x / (1 - p)
  /// otherwise (p = 1 gives zeros). Evaluation mode, or p = 0: the input itself (a lazy input is
  /// evaluated). The mask comes from uniform numbers of the input's device generator (one fill
  /// of the input's size), so ts::manual_seed makes it reproducible.
  template <class X>
  auto forward(const X& x) const {
    if constexpr (detail::is_eager_v<X>) {
      using Input = detail::eager_tensor_t<X>;
      using T = typename Input::value_type;
      using K = typename Input::device_kind;
      static_assert(is_floating_point_v<T>,
                    "Dropout: the input must be floating point (float, double, half, bfloat16)");
      Input input = detail::materialize(x);
      if (!is_training() || p_ == 0.0) return input;
      if (p_ == 1.0) return input.new_zeros(input.shape());
      const auto uniform = rand<random_compute_t<T>, K>(input.shape(), input.device_index());
      return Input(where(uniform < p_, 0, input * (1.0 / (1.0 - p_))));
    } else {
      // Traced: a mask of uniform numbers drawn anew at every forward (never recomputed by
      // checkpointing). Training or evaluation mode is the module's mode at compile time.
      using T = tessera::detail::floating_of<typename X::value_type>;
      using V = autograd::Var<T, typename X::device_kind>;
      if (!is_training() || p_ == 0.0) return V(x);
      if (p_ == 1.0) return V(x * 0.0);
      return V(where(autograd::rand_like(x) < p_, 0.0, x * (1.0 / (1.0 - p_))));
    }
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

  double p() const noexcept { return p_; }

 private:
  double p_;
};

}  // namespace tessera::nn
