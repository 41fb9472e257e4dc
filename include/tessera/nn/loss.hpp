// Losses: mse_loss, l1_loss, smooth_l1_loss, binary_cross_entropy_with_logits and cross_entropy
// (torch.nn.functional), mean-reduced. They are written with the expression functions only (no
// loops over data), so they run eagerly on tensors and fuse their elementwise parts into their
// reductions. All but cross_entropy trace unchanged on autograd Vars;
// traced cross_entropy is one node (its expressions and their gradients would otherwise be
// compiled in every training program's unit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
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

namespace detail {

// Throws shape_error naming the loss and both shapes when input and target differ.
template <class A, class B>
void check_same_shape(const A& input, const B& target, const char* loss) {
  if constexpr (requires {
                  input.shape();
                  target.shape();
                }) {
    if (input.shape() != target.shape()) {
      throw shape_error(std::string(loss) + ": the input has shape " + input.shape().str() +
                        " and the target " + target.shape().str() + "; they must be equal");
    }
  }
}

}  // namespace detail

/// mean(|input - target|) (torch.nn.functional.l1_loss, reduction "mean"), in one pass; eager on
/// tensors and expressions, traced on Vars (the gradient is sign(input - target) / n, 0 where
/// they are equal, as PyTorch's). shape_error naming both shapes when they differ.
template <class A, class B>
auto l1_loss(const A& input, const B& target) {
  detail::check_same_shape(input, target, "l1_loss");
  return mean(abs(input - target));
}

/// torch.nn.functional.smooth_l1_loss (reduction "mean"): per element 0.5 d^2 / beta where
/// |d| < beta, else |d| - 0.5 beta, with d = input - target; beta = 0 is l1_loss, its gradient
/// included (0 where input == target, as torch's l1_loss; torch's smooth_l1 kernel gives -1/n
/// there). std::invalid_argument for beta < 0 (PyTorch's error), shape_error for different
/// shapes.
template <class A, class B>
auto smooth_l1_loss(const A& input, const B& target, double beta = 1.0) {
  detail::check_same_shape(input, target, "smooth_l1_loss");
  if (!(beta >= 0)) {
    throw std::invalid_argument("smooth_l1_loss: beta " + std::to_string(beta) +
                                " must be non-negative");
  }
  const auto d = input - target;
  const auto a = abs(d);
  // beta = 0: the first branch never holds (|d| < 0), and the second is |d|: l1_loss.
  return mean(where(a < beta, d * d * (0.5 / (beta > 0 ? beta : 1.0)), a - 0.5 * beta));
}

/// torch.nn.functional.binary_cross_entropy_with_logits (reduction "mean"): per element
/// max(x, 0) - x y + log(1 + exp(-|x|)), the form that neither overflows for large |x| nor
/// loses the small term; its gradient is sigmoid(x) - y (over n). Targets may be any value in
/// [0, 1] (soft labels). shape_error for different shapes.
template <class A, class B>
auto binary_cross_entropy_with_logits(const A& input, const B& target) {
  detail::check_same_shape(input, target, "binary_cross_entropy_with_logits");
  return mean(maximum(input, 0.0) - input * target + log(1.0 + exp(-abs(input))));
}

namespace detail {

/// Throws tessera::error naming the value and the class count when a target is outside [0, C).
template <class K>
void check_targets(const Tensor<std::int64_t, K>& targets, std::int64_t classes) {
  if (targets.numel() == 0) return;
  std::int64_t lowest = 0, highest = 0;
  if constexpr (std::is_same_v<K, cpu>) {
    // Read in place (targets are contiguous inputs), so that a training step allocates nothing.
    const Tensor<std::int64_t, cpu> c = targets.contiguous();
    const auto [low, high] = std::minmax_element(c.data(), c.data() + c.numel());
    lowest = *low;
    highest = *high;
  } else {
    lowest = min(targets).item();
    highest = max(targets).item();
  }
  if (lowest < 0 || highest >= classes) {
    throw error("cross_entropy: target " + std::to_string(lowest < 0 ? lowest : highest) +
                " is out of range for " + std::to_string(classes) +
                " classes (expected 0 <= target < " + std::to_string(classes) + ")");
  }
}

/// The traced cross_entropy: one node for log_softmax, the pick of each row's target and the
/// mean, so that a program's unit compiles none of it (it is a fixed function of T and K, built
/// once per unit at most, and once per program for float on CPU in compiled mode). Forward:
/// log_softmax into scratch, the target's column of each row summed (a one-hot comparison fused
/// into the row sums), the mean. Backward: (softmax(x) - one_hot) * g / N, softmax recomputed
/// from the logits rather than kept. Targets are checked at every forward, before anything is
/// computed.
template <class T, class K>
class cross_entropy_node final : public autograd::detail::single_input_node {
 public:
  cross_entropy_node(int logits, int targets, std::int64_t batch, std::int64_t classes,
                     Device device)
      : batch_(batch),
        classes_(classes),
        columns_(arange<std::int64_t, K>(0, static_cast<double>(classes), 1.0, device.index)) {
    inputs = {logits, targets};
  }
  const char* name() const override { return "cross_entropy"; }
  std::size_t forward_scratch() const override {
    return autograd::detail::scratch_bytes<T>(Shape{batch_, classes_}) +
           autograd::detail::scratch_bytes<T>(Shape{batch_});
  }
  void forward(autograd::detail::value_table& table) override {
    const auto x = table.template get<T, K>(inputs[0]);
    const auto targets = table.template get<std::int64_t, K>(inputs[1]);
    check_targets(targets, classes_);
    auto log_probabilities = table.template scratch_tensor<T, K>(Shape{batch_, classes_});
    auto rows = table.template scratch_tensor<T, K>(Shape{batch_});
    tessera::detail::softmax_into<true>(log_probabilities, tessera::detail::as_node(x), 1,
                                        "cross_entropy");
    using sum = backend::sum_op<accumulate_t<T>>;
    tessera::detail::reduce_dim_into<sum, backend::finish_value, T>(
        rows, where(one_hot(targets), -log_probabilities, 0), 1, "cross_entropy");
    tessera::detail::reduce_all_into<sum, backend::finish_mean, T>(
        table.template get<T, K>(output), tessera::detail::as_node(rows), "cross_entropy");
  }
  std::vector<int> saved() const override { return {inputs[0], inputs[1]}; }
  std::size_t backward_scratch() const override {
    return autograd::detail::scratch_bytes<T>(Shape{batch_, classes_});
  }
  void backward(autograd::detail::value_table& table,
                const std::vector<char>& accumulate) override {
    if (!needs_) return;
    const auto x = table.template get<T, K>(inputs[0]);
    const auto targets = table.template get<std::int64_t, K>(inputs[1]);
    const auto g = table.template grad<T, K>(output);
    auto p = table.template scratch_tensor<T, K>(Shape{batch_, classes_});
    tessera::detail::softmax_into<false>(p, tessera::detail::as_node(x), 1, "cross_entropy");
    const double scale = 1.0 / static_cast<double>(batch_);
    autograd::detail::store_gradient(table.template grad<T, K>(inputs[0]),
                                     where(one_hot(targets), p - 1, p) * g * scale,
                                     accumulate[0] != 0, table);
  }

 private:
  auto one_hot(const Tensor<std::int64_t, K>& targets) const {
    return columns_ == targets.view({batch_, 1});
  }

  std::int64_t batch_;
  std::int64_t classes_;
  Tensor<std::int64_t, K> columns_;  // 0 .. C-1, made once when traced
};

}  // namespace detail

/// The mean over the batch of -log softmax(logits)[n, targets[n]] as a 0-dim tensor
/// (torch.nn.functional.cross_entropy with class-index targets and reduction "mean").
/// `logits` is [N, C] (a tensor or a lazy expression), `targets` int64 [N] on the same device.
/// Numerically stable for any logits (log_softmax subtracts each row's maximum). An empty batch
/// gives NaN, as in PyTorch.
///
/// Eager (tensors and their expressions): one fused pass per reduction. Traced (Vars and their
/// expressions; targets a Var or a tensor): one autograd node (detail::cross_entropy_node).
///
/// Throws shape_error naming both shapes for other shapes, and tessera::error naming the value
/// and C when a target is outside [0, C) (eagerly, or traced at every forward), before
/// computing anything. ignore_index, class weights and label smoothing are not supported.
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
  if constexpr (detail::is_eager_v<L>) {
    static_assert(tessera::detail::is_tensor<Targets>::value,
                  "cross_entropy: eager logits take a tensor of targets");
    detail::check_targets(targets, classes);
    const auto log_probabilities = log_softmax(logits, 1);
    // The target's column of each row, picked by a one-hot comparison fused into the row sums.
    const auto columns =
        arange<std::int64_t, K>(0, static_cast<double>(classes), 1.0, targets.device_index());
    const auto one_hot = columns == targets.view({batch, 1});
    return mean(sum(where(one_hot, -log_probabilities, 0), 1));
  } else {
    using T = tessera::detail::floating_of<typename L::value_type>;
    autograd::detail::graph* g = autograd::detail::graph_of(logits);
    const auto x = [&] {
      if constexpr (std::is_same_v<typename L::value_type, T>) {
        return autograd::detail::to_var(logits, g);
      } else {
        return autograd::Var<T, K>(cast<T>(logits));
      }
    }();
    const auto t = autograd::detail::to_var(targets, g);
    auto n = std::make_unique<detail::cross_entropy_node<T, K>>(x.id(), t.id(), batch, classes,
                                                                x.device());
    const int id = g->add_node(std::move(n), Shape{}, scalar_type_of<T>, x.device());
    return autograd::Var<T, K>(g, id, Shape{});
  }
}

}  // namespace tessera::nn
