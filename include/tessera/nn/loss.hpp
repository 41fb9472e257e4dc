// Losses: mse_loss and cross_entropy (torch.nn.functional), mean-reduced. Both are written with
// the expression functions only (no loops over data), so they run eagerly on tensors, fuse their
// elementwise parts into their reductions, and trace unchanged on autograd Vars.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/autograd/ops.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/expr/reduce.hpp"
#include "tessera/nn/detail/operand.hpp"
#include "tessera/tensor/factories.hpp"

namespace tessera::nn {

/// mean((input - target)^2) as a 0-dim tensor (torch.nn.functional.mse_loss, reduction "mean"),
/// in one pass over both operands (tensors or lazy expressions). Throws shape_error naming both
/// shapes when they differ (PyTorch broadcasts them with a warning that the result is likely
/// wrong; here it is an error), dtype_error for integer operands.
template <class A, class B>
auto mse_loss(const A& input, const B& target) {
  if constexpr (requires {
                  input.shape();
                  target.shape();
                }) {
    if (input.shape() != target.shape()) {
      throw shape_error("mse_loss: the input has shape " + input.shape().str() +
                        " and the target " + target.shape().str() + "; they must be equal");
    }
  }
  const auto difference = input - target;
  return mean(difference * difference);
}

/// The mean over the batch of -log softmax(logits)[n, targets[n]] as a 0-dim tensor
/// (torch.nn.functional.cross_entropy with class-index targets and reduction "mean").
/// `logits` is [N, C] (a tensor or a lazy expression), `targets` int64 [N] on the same device.
/// Numerically stable for any logits (log_softmax subtracts each row's maximum). An empty batch
/// gives NaN, as in PyTorch.
///
/// Throws shape_error naming both shapes for other shapes, and (eagerly) tessera::error naming
/// the value and C when a target is outside [0, C), before computing anything. ignore_index,
/// class weights and label smoothing are not supported.
template <class L, class Targets>
auto cross_entropy(const L& logits, const Targets& targets) {
  static_assert(std::is_same_v<typename Targets::value_type, std::int64_t>,
                "cross_entropy: the targets are class indices of dtype int64 (a Tensor<int64_t> or, "
                "traced, a Var<int64_t>)");
  using K = typename Targets::device_kind;
  const Shape& shape = logits.shape();
  if (shape.size() != 2 || targets.dim() != 1 || targets.size(0) != shape[0]) {
    throw shape_error("cross_entropy: expected logits [N, C] and targets [N], got logits " +
                      shape.str() + " and targets " + targets.shape().str());
  }
  const std::int64_t batch = shape[0];
  const std::int64_t classes = shape[1];
  auto check_range = [classes](const Tensor<std::int64_t, K>& t) {
    if (t.numel() == 0) return;
    std::int64_t lowest = 0, highest = 0;
    if constexpr (std::is_same_v<K, cpu>) {
      // Read in place (targets are contiguous inputs), so that a training step allocates nothing.
      const Tensor<std::int64_t, cpu> c = t.contiguous();
      const auto [low, high] = std::minmax_element(c.data(), c.data() + c.numel());
      lowest = *low;
      highest = *high;
    } else {
      lowest = min(t).item();
      highest = max(t).item();
    }
    if (lowest < 0 || highest >= classes) {
      throw error("cross_entropy: target " + std::to_string(lowest < 0 ? lowest : highest) +
                  " is out of range for " + std::to_string(classes) +
                  " classes (expected 0 <= target < " + std::to_string(classes) + ")");
    }
  };
  if constexpr (tessera::detail::is_tensor<Targets>::value) {
    if constexpr (detail::is_eager_v<L>) check_range(targets);
  } else {
    // Traced targets: checked at every forward, before the loss is computed from them.
    autograd::on_forward(check_range, targets);
  }
  const auto log_probabilities = log_softmax(logits, 1);
  // The target's column of each row, picked by a one-hot comparison fused into the row sums.
  const auto columns =
      arange<std::int64_t, K>(0, static_cast<double>(classes), 1.0, targets.device_index());
  const auto one_hot = columns == targets.view({batch, 1});
  return mean(sum(where(one_hot, -log_probabilities, 0), 1));
}

}  // namespace tessera::nn
