// Dropout(p): in training, zeroes each element with probability p (a mask drawn from the device's
// Philox generator) and scales the others by 1 / (1 - p); in evaluation mode it is the identity
// (torch.nn.Dropout). A Module so that a parent's train()/eval() reaches it. A compiled program
// reads the mode at every forward: its mask node draws a new mask in training and is all ones in
// evaluation.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tessera/autograd/ops.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/nn/detail/operand.hpp"
#include "tessera/nn/module.hpp"
#include "tessera/tensor/factories.hpp"

namespace tessera::nn {

namespace detail {

/// The traced mask of Dropout(p): at each forward, in training, 0 with probability p and
/// 1 / (1 - p) otherwise, from uniform numbers of the device's generator; in evaluation, ones.
/// Never recomputed (checkpointing keeps it).
template <class T, class K, class M>
class dropout_mask_node final : public autograd::detail::node {
 public:
  dropout_mask_node(M module, double p) : module_(std::move(module)), p_(p) {}
  const char* name() const override { return "dropout_mask"; }
  bool recomputable() const override { return false; }
  // In eval mode the mask is ones: a replay may run it. In training, a CUDA graph replays the
  // mask's fill with a new offset at each launch where a kernel draws it (nvcc's units).
  const char* capture_blocker() const override {
    if (!module_.is_training()) return nullptr;
    return autograd::detail::random_capture_blocker<K>() != nullptr
               ? "dropout in training mode (its mask drawn on the host: on the CPU, or in a unit "
                 "not compiled by nvcc)"
               : nullptr;
  }
  std::int64_t prepare_replay(autograd::detail::value_table&) override {
    return module_.is_training() ? 1 : 0;
  }
  void forward(autograd::detail::value_table& table) override {
    auto out = table.template get<T, K>(output);
    if (!module_.is_training()) {
      out.fill_(T(1));
      return;
    }
    tessera::detail::fill_uniform_(out);  // as ts::rand draws them
    tessera::detail::run_expression(out, where(out < p_, 0.0, 1.0 / (1.0 - p_)));
  }

 private:
  M module_;
  double p_;
};

}  // namespace detail

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
      // The mask is laid out as the input, so that the result is too, as PyTorch's (a
      // channels_last input gives a channels_last output); its numbers go by element, so it is
      // the mask a contiguous input of the same seed gets.
      const memory_format format =
          input.is_contiguous(memory_format::channels_last) &&
                  input.suggest_memory_format() == memory_format::channels_last
              ? memory_format::channels_last
              : memory_format::contiguous_format;
      if (p_ == 1.0) return zeros_like(input, format);
      auto uniform = empty<random_compute_t<T>, K>(input.shape(), format, input.device_index());
      tessera::detail::fill_uniform_(uniform);
      return Input(where(uniform < p_, 0, input * (1.0 / (1.0 - p_))));
    } else {
      // Traced: x times a mask node that reads the mode at every forward (a new mask in
      // training, ones in evaluation; never recomputed by checkpointing).
      using T = tessera::detail::floating_of<typename X::value_type>;
      using K = typename X::device_kind;
      using V = autograd::Var<T, K>;
      if (p_ == 0.0) return V(x);
      autograd::detail::graph* g = autograd::detail::graph_of(x);
      const Device device = tessera::detail::device_of(x, "Dropout");
      // The mask laid out as x's fused value would be (channels_last for a channels_last x), so
      // that x * mask keeps x's layout.
      const memory_format format = autograd::detail::result_memory_format(x, *g);
      const int id =
          g->add_node(std::make_unique<detail::dropout_mask_node<T, K, Dropout>>(*this, p_),
                      x.shape(), scalar_type_of<T>, device, format);
      return V(x * V(g, id, x.shape()));
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
