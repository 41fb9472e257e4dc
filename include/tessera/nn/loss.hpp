// Losses (torch.nn.functional's, also under ts::nn::functional): mse_loss, l1_loss,
// smooth_l1_loss and binary_cross_entropy_with_logits, mean-reduced; cross_entropy and nll_loss
// with PyTorch's options (reduction, ignore_index, label_smoothing, class weights). They are
// written with the expression functions only (no loops over data), so they run eagerly on
// tensors and fuse their elementwise parts into their reductions. The first four trace unchanged
// on autograd Vars; traced cross_entropy and nll_loss are one node (their expressions and
// gradients would otherwise be compiled in every training program's unit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/autograd/ops.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/expr/reduce.hpp"
#include "tessera/nn/detail/operand.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/factories.hpp"

namespace tessera::nn {

namespace detail {

// Throws shape_error naming the loss and both shapes when input and target differ, and
// device_mismatch_error naming the loss and both devices when they are on different ordinals
// (the expression's own error would name its internal operation, "sub").
template <class A, class B>
void check_operands(const A& input, const B& target, const char* loss) {
  if constexpr (requires {
                  input.shape();
                  target.shape();
                }) {
    if (input.shape() != target.shape()) {
      throw shape_error(std::string(loss) + ": the input has shape " + input.shape().str() +
                        " and the target " + target.shape().str() + "; they must be equal");
    }
  }
  if constexpr (requires {
                  { input.device() } -> std::convertible_to<Device>;
                  { target.device() } -> std::convertible_to<Device>;
                }) {
    if (input.device() != target.device()) {
      throw device_mismatch_error(std::string(loss) + ": the input is on " +
                                  input.device().str() + " and the target on " +
                                  target.device().str() + "; move the target with .to(" +
                                  std::to_string(input.device().index) + ")");
    }
  }
}

}  // namespace detail

/// mean((input - target)^2) as a 0-dim tensor (torch.nn.functional.mse_loss, reduction "mean"),
/// in one pass over both operands (tensors or lazy expressions). Throws shape_error naming both
/// shapes when they differ (PyTorch broadcasts them with a warning that the result is likely
/// wrong; here it is an error), dtype_error for integer operands.
template <class A, class B>
auto mse_loss(const A& input, const B& target) {
  detail::check_operands(input, target, "mse_loss");
  const auto difference = input - target;
  return mean(difference * difference);
}


/// mean(|input - target|) (torch.nn.functional.l1_loss, reduction "mean"), in one pass; eager on
/// tensors and expressions, traced on Vars (the gradient is sign(input - target) / n, 0 where
/// they are equal, as PyTorch's). shape_error naming both shapes when they differ.
template <class A, class B>
auto l1_loss(const A& input, const B& target) {
  detail::check_operands(input, target, "l1_loss");
  return mean(abs(input - target));
}

/// torch.nn.functional.smooth_l1_loss (reduction "mean"): per element 0.5 d^2 / beta where
/// |d| < beta, else |d| - 0.5 beta, with d = input - target; beta = 0 is l1_loss, its gradient
/// included (0 where input == target, as torch's l1_loss; torch's smooth_l1 kernel gives -1/n
/// there). std::invalid_argument for beta < 0 (PyTorch's error), shape_error for different
/// shapes.
template <class A, class B>
auto smooth_l1_loss(const A& input, const B& target, double beta = 1.0) {
  detail::check_operands(input, target, "smooth_l1_loss");
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
  detail::check_operands(input, target, "binary_cross_entropy_with_logits");
  return mean(maximum(input, 0.0) - input * target + log(1.0 + exp(-abs(input))));
}

/// How cross_entropy and nll_loss reduce the per-sample losses (torch's `reduction`): `none`
/// gives one loss per sample ([N]); `sum` their sum; `mean` their weighted mean, the sum divided
/// by the summed class weights of the targets that are not ignored (their count without weights).
enum class Reduction { none, mean, sum };

/// torch.nn.functional.cross_entropy's options (class-index targets), in its order.
///   reduction        Reduction::mean (default), sum or none.
///   ignore_index     targets equal to it add nothing to the loss, to the mean's denominator or
///                    to the gradient (their gradient row is 0); default -100, as PyTorch's.
///   label_smoothing  eps in [0, 1]: the target distribution is (1 - eps) one_hot + eps / C; with
///                    weights each class's share is weighted too, as in PyTorch.
///   weight           a rescaling of each class: a tensor [C] of the logits' dtype on their
///                    device; undefined (the default) for all 1.
struct CrossEntropyArgs {
  Reduction reduction = Reduction::mean;
  std::int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  AnyTensor weight{};
};

/// torch.nn.functional.nll_loss's options: as CrossEntropyArgs, without label smoothing.
struct NllLossArgs {
  Reduction reduction = Reduction::mean;
  std::int64_t ignore_index = -100;
  AnyTensor weight{};
};

namespace detail {

/// The options of a class-index loss (cross_entropy or nll_loss) as its kernels use them.
struct class_loss_options {
  bool from_logits = true;  // cross_entropy (log_softmax first), or nll_loss (log-probabilities)
  Reduction reduction = Reduction::mean;
  std::int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  bool weighted = false;

  const char* name() const { return from_logits ? "cross_entropy" : "nll_loss"; }
  /// cross_entropy(logits, targets) with the default options: while no target is ignored, the
  /// mean of -log_softmax at the targets, computed by its own (original, fastest) path.
  bool plain() const {
    return from_logits && reduction == Reduction::mean && !weighted && label_smoothing == 0;
  }
};

[[noreturn]] inline void throw_target_out_of_range(const char* who, std::int64_t target,
                                                   std::int64_t classes,
                                                   std::int64_t ignore_index) {
  throw error(std::string(who) + ": target " + std::to_string(target) + " is out of range for " +
              std::to_string(classes) + " classes (expected 0 <= target < " +
              std::to_string(classes) + ", or the ignore_index " + std::to_string(ignore_index) +
              ")");
}

/// check_targets by reductions on the device (CUDA's way; generic, so that CPU tests run it).
template <class K>
bool check_targets_by_reductions(const Tensor<std::int64_t, K>& targets, std::int64_t classes,
                                 std::int64_t ignore_index, const char* who) {
  std::int64_t lowest = min(targets).item();
  std::int64_t highest = max(targets).item();
  if (lowest >= 0 && highest < classes) return ignore_index >= lowest && ignore_index <= highest;
  // Some target is outside [0, C): it must be ignore_index. The extremes of the others:
  lowest =
      min(where(targets == ignore_index, std::numeric_limits<std::int64_t>::max(), targets)).item();
  highest =
      max(where(targets == ignore_index, std::numeric_limits<std::int64_t>::min(), targets)).item();
  if (lowest <= highest) {  // not all ignored
    if (lowest < 0) throw_target_out_of_range(who, lowest, classes, ignore_index);
    if (highest >= classes) throw_target_out_of_range(who, highest, classes, ignore_index);
  }
  return true;
}

/// Throws tessera::error naming the value, the class count and ignore_index when a target other
/// than ignore_index is outside [0, C). Returns whether some target may equal ignore_index: exact
/// on CPU; on CUDA (two reductions, a third pair only when a target is outside [0, C)) true when
/// ignore_index lies within the targets' range.
template <class K>
bool check_targets(const Tensor<std::int64_t, K>& targets, std::int64_t classes,
                   std::int64_t ignore_index, const char* who) {
  if (targets.numel() == 0) return false;
  if constexpr (std::is_same_v<K, cpu>) {
    // Read in place (targets are contiguous inputs), so that a training step allocates nothing.
    const Tensor<std::int64_t, cpu> c = targets.contiguous();
    const std::int64_t* begin = c.data();
    const std::int64_t* end = begin + c.numel();
    const auto [low, high] = std::minmax_element(begin, end);
    if (*low >= 0 && *high < classes) {
      return ignore_index >= *low && ignore_index <= *high &&
             std::find(begin, end, ignore_index) != end;
    }
    for (const std::int64_t* p = begin; p != end; ++p) {
      if (*p != ignore_index && (*p < 0 || *p >= classes)) {
        throw_target_out_of_range(who, *p, classes, ignore_index);
      }
    }
    return true;
  } else {
    return check_targets_by_reductions(targets, classes, ignore_index, who);
  }
}

/// Checks the options that do not depend on the data: label_smoothing in [0, 1]
/// (std::invalid_argument), the weight a tensor [C] of dtype T on `device` (dtype_error,
/// device_mismatch_error, shape_error, each naming both sides). Returns the weight, typed
/// (undefined when there is none).
template <class T, class K>
Tensor<T, K> checked_class_weight(const class_loss_options& o, const AnyTensor& weight,
                                  std::int64_t classes, Device device) {
  const std::string who = o.name();
  if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1)) {
    std::ostringstream text;
    text << who << ": label_smoothing " << o.label_smoothing << " must be between 0 and 1";
    throw std::invalid_argument(text.str());
  }
  if (!weight.defined()) return {};
  const char* input = o.from_logits ? "logits" : "log-probabilities";
  if (weight.dtype() != scalar_type_of<T>) {
    throw dtype_error(who + ": the weight has dtype " + name(weight.dtype()) + " and the " + input +
                      " " + name(scalar_type_of<T>) + "; they must be equal");
  }
  if (weight.device() != device) {
    throw device_mismatch_error(who + ": the weight is on " + weight.device().str() + " and the " +
                                input + " on " + device.str() + "; they must be on one device");
  }
  if (weight.shape() != Shape{classes}) {
    throw shape_error(who + ": the weight has shape " + weight.shape().str() + " for " +
                      std::to_string(classes) + " classes; expected [" + std::to_string(classes) +
                      "]");
  }
  return weight.as<T, K>();
}

/// Work buffers of the general class-index loss (contiguous; eager: new tensors, traced: the
/// node's scratch).
template <class T, class K>
struct class_loss_buffers {
  Tensor<T, K> rows;   // [N] per-sample losses (forward, sum and mean), coefficient sums (backward)
  Tensor<T, K> hit;    // [C] the target class's coefficient, w_c ((1 - eps) + eps / C)
  Tensor<T, K> off;    // [C] every other class's, w_c eps / C
  Tensor<T, K> total;  // [] the mean's denominator
  Tensor<T, K> scale;  // [] backward of the mean: the upstream gradient over the denominator
};

/// b.hit and b.off from the weight and label_smoothing (their [1, C] views are returned).
template <class T, class K>
std::pair<Tensor<T, K>, Tensor<T, K>> class_coefficients(const class_loss_buffers<T, K>& b,
                                                         const Tensor<T, K>& weight,
                                                         const class_loss_options& o) {
  const std::int64_t c = weight.numel();
  const double share = c > 0 ? o.label_smoothing / static_cast<double>(c) : 0.0;
  tessera::detail::run_expression(b.hit, weight * (1.0 - o.label_smoothing + share));
  tessera::detail::run_expression(b.off, weight * share);
  return {b.hit.view({1, c}), b.off.view({1, c})};
}

/// b.total = sum_n w_{t_n} over the samples not ignored (t: the targets as [N, 1]).
template <class T, class K>
void class_loss_denominator(const class_loss_buffers<T, K>& b, const Tensor<std::int64_t, K>& t,
                            const Tensor<std::int64_t, K>& columns, const Tensor<T, K>& weight,
                            const class_loss_options& o) {
  using sum = backend::sum_op<accumulate_t<T>>;
  tessera::detail::reduce_all_into<sum, backend::finish_value, T>(
      b.total,
      where(t == o.ignore_index, 0, where(columns == t, weight.view({1, weight.numel()}), 0)),
      o.name());
}

/// The general class-index loss (any options; cross_entropy's plain() case has its own path).
/// Per sample n with target t not ignored, the loss is
///   -sum_c log_probs[n, c] w_c ((1 - eps) [c == t] + eps / C)
///     = (1 - eps) w_t (-log_probs[n, t]) + eps / C sum_c w_c (-log_probs[n, c]),
/// PyTorch's mix of label smoothing and class weights (0 for ignored samples); `mean` divides
/// the sum by sum_n w_{t_n} over the samples not ignored (0 / 0 = NaN when there are none, as
/// PyTorch). `weight` is [C] (ones when none was given), `columns` 0 .. C - 1, `out` [] or [N].
template <class T, class K>
void class_loss_forward(const Tensor<T, K>& out, const Tensor<T, K>& log_probs,
                        const Tensor<std::int64_t, K>& targets,
                        const Tensor<std::int64_t, K>& columns, const Tensor<T, K>& weight,
                        const class_loss_options& o, const class_loss_buffers<T, K>& b) {
  const auto t = targets.view({log_probs.size(0), 1});
  const auto [hit, off] = class_coefficients(b, weight, o);
  // A zero coefficient gives 0, not 0 * inf: a logit of -inf off the target costs nothing
  // without label smoothing, as in PyTorch.
  const auto terms =
      where(t == o.ignore_index, 0,
            where(columns == t, -log_probs * hit, where(off == 0, 0, -log_probs * off)));
  using sum = backend::sum_op<accumulate_t<T>>;
  using tessera::detail::as_node;
  if (o.reduction == Reduction::none) {
    tessera::detail::reduce_dim_into<sum, backend::finish_value, T>(out, terms, 1, o.name());
    return;
  }
  tessera::detail::reduce_dim_into<sum, backend::finish_value, T>(b.rows, terms, 1, o.name());
  tessera::detail::reduce_all_into<sum, backend::finish_value, T>(out, as_node(b.rows), o.name());
  if (o.reduction == Reduction::mean) {
    class_loss_denominator(b, t, columns, weight, o);
    tessera::detail::run_expression(out, as_node(out) / as_node(b.total));
  }
}

/// The gradient of class_loss_forward's loss with respect to its input, written into
/// `gradient` [N, C] (added when `accumulate`). Cross entropy (with respect to the logits,
/// `work` [N, C] their softmax on entry): (softmax * sum_c coefficient - coefficient) * g per
/// sample; nll_loss (with respect to the log-probabilities; `work` [N, C] scratch): -w_t g at
/// each target. Ignored samples' rows are 0. `upstream` is the output's gradient, [] or [N].
/// `work` is overwritten when `accumulate`.
template <class T, class K>
void class_loss_backward(const Tensor<T, K>& gradient, bool accumulate, const Tensor<T, K>& work,
                         const Tensor<T, K>& upstream, const Tensor<std::int64_t, K>& targets,
                         const Tensor<std::int64_t, K>& columns, const Tensor<T, K>& weight,
                         const class_loss_options& o, const class_loss_buffers<T, K>& b) {
  const std::int64_t n = gradient.size(0);
  const auto t = targets.view({n, 1});
  const auto [hit, off] = class_coefficients(b, weight, o);
  using sum = backend::sum_op<accumulate_t<T>>;
  using tessera::detail::as_node;
  // The upstream gradient of each sample, broadcast along the classes: [N, 1] or [1, 1].
  Tensor<T, K> g;
  if (o.reduction == Reduction::none) {
    g = upstream.view({n, 1});
  } else if (o.reduction == Reduction::sum) {
    g = upstream.view({1, 1});
  } else {
    class_loss_denominator(b, t, columns, weight, o);
    tessera::detail::run_expression(b.scale, as_node(upstream) / as_node(b.total));
    g = b.scale.view({1, 1});
  }
  // One pass writes the gradient, into `gradient` or, to be added to it, into `work` (each
  // element reads only its own probability): one executor instantiation, not two.
  const Tensor<T, K>& into = accumulate ? work : gradient;
  if (o.from_logits) {
    const auto coefficients = where(columns == t, hit, off);
    tessera::detail::reduce_dim_into<sum, backend::finish_value, T>(b.rows, coefficients, 1,
                                                                    o.name());
    tessera::detail::run_expression(
        into, where(t == o.ignore_index, 0, (work * b.rows.view({n, 1}) - coefficients) * g));
  } else {
    tessera::detail::run_expression(
        into, where(t == o.ignore_index, 0, where(columns == t, -hit * g, 0)));
  }
  if (accumulate) tessera::detail::add_into(gradient, work);
}

/// The traced cross_entropy or nll_loss: one node for log_softmax (cross_entropy), the pick of
/// each row's target and the reduction, so that a program's unit compiles none of it (it is a
/// fixed function of T and K, built once per unit at most, and once per program for float on
/// CPU in compiled mode); the options are the node's. Targets are checked at every forward,
/// before anything is computed.
///
/// cross_entropy with the default options, while no target is ignored (the common case): the
/// original path. Forward: log_softmax into scratch, the target's column of each row summed (a
/// one-hot comparison fused into the row sums), the mean. Backward: (softmax(x) - one_hot) * g
/// / N, softmax recomputed from the logits rather than kept. Any other case:
/// class_loss_forward and class_loss_backward.
template <class T, class K>
class cross_entropy_node final : public autograd::detail::single_input_node {
 public:
  /// `batch` samples of `classes` classes; for an input [N, C, d...] (PyTorch's K-dimensional
  /// form, `k_dimensional`) `samples` = N and `spatial` = d1 * ... * dk, every position a sample
  /// (batch = N * spatial): the node moves the classes last into scratch in its forward and back
  /// in its gradient, so the kernels below see [N * spatial, C].
  cross_entropy_node(int input, int targets, std::int64_t batch, std::int64_t classes,
                     Device device, const class_loss_options& options, Tensor<T, K> weight,
                     bool k_dimensional, std::int64_t samples, std::int64_t spatial)
      : batch_(batch),
        classes_(classes),
        k_dimensional_(k_dimensional),
        samples_(samples),
        spatial_(spatial),
        options_(options),
        columns_(arange<std::int64_t, K>(0, static_cast<double>(classes), 1.0, device.index)),
        weight_(weight.defined() ? std::move(weight)
                                 : full<T, K>(Shape{classes}, 1.0, device.index)) {
    inputs = {input, targets};
  }
  const char* name() const override { return options_.name(); }
  std::size_t forward_scratch() const override {
    using autograd::detail::scratch_bytes;
    return (options_.from_logits ? scratch_bytes<T>(Shape{batch_, classes_}) : 0) +
           (k_dimensional_ ? scratch_bytes<T>(Shape{batch_, classes_}) : 0) +
           scratch_bytes<T>(Shape{batch_}) + 2 * scratch_bytes<T>(Shape{classes_}) +
           scratch_bytes<T>(Shape{});
  }
  // forward and backward out of the class, as autograd's fused_node's: a unit that records the
  // node for float (compiled in tessera::compiled) then instantiates none of its kernels.
  void forward(autograd::detail::value_table& table) override;
  // The targets' check (which reads them on the host) and the path it chooses, before a CUDA
  // graph of the forward is captured or replayed.
  std::int64_t prepare_replay(autograd::detail::value_table& table) override {
    const auto targets = samples_of(table.template get<std::int64_t, K>(inputs[1]));
    const bool ignored = check_targets(targets, classes_, options_.ignore_index, name());
    plain_ = options_.plain() && !ignored;
    return plain_ ? 1 : 0;
  }
  std::vector<int> saved() const override {
    // nll_loss's gradient does not read its input.
    return options_.from_logits ? std::vector<int>{inputs[0], inputs[1]}
                                : std::vector<int>{inputs[1]};
  }
  std::size_t backward_scratch() const override {
    using autograd::detail::scratch_bytes;
    return scratch_bytes<T>(Shape{batch_, classes_}) + scratch_bytes<T>(Shape{batch_}) +
           2 * scratch_bytes<T>(Shape{classes_}) + 2 * scratch_bytes<T>(Shape{}) +
           (k_dimensional_ ? 2 * scratch_bytes<T>(Shape{batch_, classes_}) : 0);
  }
  void backward(autograd::detail::value_table& table, const std::vector<char>& accumulate) override;

 private:
  // Targets or per-sample values [N, d...] as [N * d] (the samples in order).
  template <class U>
  Tensor<U, K> samples_of(const Tensor<U, K>& t) const {
    return k_dimensional_ && t.dim() > 0 ? t.view({batch_}) : t;
  }
  // The input [N, C, d...] as rows [N * d, C] (a copy into scratch), or the input [N, C] itself.
  Tensor<T, K> rows_of(autograd::detail::value_table& table, const Tensor<T, K>& x) const {
    if (!k_dimensional_) return x;
    auto rows = table.template scratch_tensor<T, K>(Shape{batch_, classes_});
    rows.view({samples_, spatial_, classes_})
        .copy_(x.reshape({samples_, classes_, spatial_}).permute({0, 2, 1}));
    return rows;
  }
  // The rows' gradient [N * d, C] written (or added) into the input's [N, C, d...].
  void move_back(const Tensor<T, K>& input_gradient, const Tensor<T, K>& rows,
                 bool accumulate) const {
    auto target = input_gradient.view({samples_, classes_, spatial_});
    const auto source = rows.view({samples_, spatial_, classes_}).permute({0, 2, 1});
    if (accumulate) {
      tessera::detail::add_into(target, source);
    } else {
      target.copy_(source);
    }
  }

  auto one_hot(const Tensor<std::int64_t, K>& targets) const {
    return columns_ == targets.view({batch_, 1});
  }

  std::int64_t batch_;  // samples: N, or N * d for [N, C, d...]
  std::int64_t classes_;
  bool k_dimensional_;    // the input is [N, C, d...] (even with every d 1)
  std::int64_t samples_;  // N
  std::int64_t spatial_;  // d1 * ... * dk; 1 for [N, C]
  class_loss_options options_;
  Tensor<std::int64_t, K> columns_;  // 0 .. C-1, made once when traced
  Tensor<T, K> weight_;              // [C]; ones when none was given
  bool plain_ = false;               // the last forward took the plain path (so does backward)
};

template <class T, class K>
void cross_entropy_node<T, K>::forward(autograd::detail::value_table& table) {
  const auto targets = samples_of(table.template get<std::int64_t, K>(inputs[1]));
  // A capture keeps prepare_replay's check and choice (the check reads the targets on the host).
  if (!table.capturing) {
    const bool ignored = check_targets(targets, classes_, options_.ignore_index, name());
    plain_ = options_.plain() && !ignored;
  }
  const auto x = rows_of(table, table.template get<T, K>(inputs[0]));
  const auto out = samples_of(table.template get<T, K>(output));
  Tensor<T, K> log_probabilities = x;
  if (options_.from_logits) {
    log_probabilities = table.template scratch_tensor<T, K>(Shape{batch_, classes_});
    tessera::detail::softmax_into<true>(log_probabilities, tessera::detail::as_node(x), 1, name());
  }
  auto rows = table.template scratch_tensor<T, K>(Shape{batch_});
  if (plain_) {
    using sum = backend::sum_op<accumulate_t<T>>;
    tessera::detail::reduce_dim_into<sum, backend::finish_value, T>(
        rows, where(one_hot(targets), -log_probabilities, 0), 1, "cross_entropy");
    tessera::detail::reduce_all_into<sum, backend::finish_mean, T>(
        out, tessera::detail::as_node(rows), "cross_entropy");
    return;
  }
  class_loss_buffers<T, K> b;
  b.rows = rows;
  b.hit = table.template scratch_tensor<T, K>(Shape{classes_});
  b.off = table.template scratch_tensor<T, K>(Shape{classes_});
  b.total = table.template scratch_tensor<T, K>(Shape{});
  class_loss_forward(out, log_probabilities, targets, columns_, weight_, options_, b);
}

template <class T, class K>
void cross_entropy_node<T, K>::backward(autograd::detail::value_table& table,
                                        const std::vector<char>& accumulate) {
  if (!needs_) return;
  const auto targets = samples_of(table.template get<std::int64_t, K>(inputs[1]));
  const auto g = samples_of(table.template grad<T, K>(output));
  // The input's gradient, or for [N, C, d...] its rows [N * d, C] in scratch, moved into it
  // at the end.
  const auto input_gradient = table.template grad<T, K>(inputs[0]);
  const bool moved = k_dimensional_;
  const auto gradient =
      moved ? table.template scratch_tensor<T, K>(Shape{batch_, classes_}) : input_gradient;
  const bool add = accumulate[0] != 0 && !moved;
  // The softmax of the logits (cross_entropy), or the gradient's scratch (nll_loss).
  const auto p = table.template scratch_tensor<T, K>(Shape{batch_, classes_});
  if (options_.from_logits) {
    const auto x = rows_of(table, table.template get<T, K>(inputs[0]));
    tessera::detail::softmax_into<false>(p, tessera::detail::as_node(x), 1, name());
  }
  if (plain_) {
    const double scale = 1.0 / static_cast<double>(batch_);
    autograd::detail::store_gradient(gradient, where(one_hot(targets), p - 1, p) * g * scale, add,
                                     table);
    if (moved) move_back(input_gradient, gradient, accumulate[0] != 0);
    return;
  }
  class_loss_buffers<T, K> b;
  b.rows = table.template scratch_tensor<T, K>(Shape{batch_});
  b.hit = table.template scratch_tensor<T, K>(Shape{classes_});
  b.off = table.template scratch_tensor<T, K>(Shape{classes_});
  b.total = table.template scratch_tensor<T, K>(Shape{});
  b.scale = table.template scratch_tensor<T, K>(Shape{});
  class_loss_backward(gradient, add, p, g, targets, columns_, weight_, options_, b);
  if (moved) move_back(input_gradient, gradient, accumulate[0] != 0);
}

/// The device of an eager operand: the logits' own, or the targets' for a lazy expression.
template <class L, class Targets>
Device eager_device(const L& logits, const Targets& targets) {
  if constexpr (requires { logits.device(); }) {
    return logits.device();
  } else {
    return targets.device();
  }
}

/// The eager loss of `input` [batch, classes] (a tensor or a lazy expression) and its targets
/// [batch] on `device`.
template <class T, class K, class L>
Tensor<T, K> eager_class_loss(const L& input, const Tensor<std::int64_t, K>& targets,
                              const class_loss_options& o, const AnyTensor& weight,
                              std::int64_t batch, std::int64_t classes, Device device) {
  Tensor<T, K> w = checked_class_weight<T, K>(o, weight, classes, device);
  const bool ignored = check_targets(targets, classes, o.ignore_index, o.name());
  const auto columns = arange<std::int64_t, K>(0, static_cast<double>(classes), 1.0, device.index);
  if (o.plain() && !ignored) {
    const auto log_probabilities = log_softmax(input, 1);
    // The target's column of each row, picked by a one-hot comparison fused into the row sums.
    const auto one_hot = columns == targets.view({batch, 1});
    return Tensor<T, K>(mean(sum(where(one_hot, -log_probabilities, 0), 1)));
  }
  Tensor<T, K> log_probabilities;
  if (o.from_logits) {
    log_probabilities = log_softmax(input, 1);
  } else {
    log_probabilities = materialize(input);
  }
  if (!w.defined()) w = full<T, K>(Shape{classes}, 1.0, device.index);
  class_loss_buffers<T, K> b;
  b.rows = Tensor<T, K>::empty_on(Shape{batch}, device);
  b.hit = Tensor<T, K>::empty_on(Shape{classes}, device);
  b.off = Tensor<T, K>::empty_on(Shape{classes}, device);
  b.total = Tensor<T, K>::empty_on(Shape{}, device);
  auto out =
      Tensor<T, K>::empty_on(o.reduction == Reduction::none ? Shape{batch} : Shape{}, device);
  class_loss_forward(out, log_probabilities, targets, columns, w, o, b);
  return out;
}

/// cross_entropy and nll_loss: checks, then eager (the loss as a tensor) or traced (one node).
template <class L, class Targets>
auto class_loss(const L& input, const Targets& targets, const class_loss_options& o,
                const AnyTensor& weight) {
  static_assert(std::is_same_v<typename Targets::value_type, std::int64_t>,
                "cross_entropy, nll_loss: the targets are class indices of dtype int64 (a "
                "Tensor<int64_t> or, traced, a Var<int64_t>)");
  using K = typename Targets::device_kind;
  using T = tessera::detail::floating_of<typename L::value_type>;
  const Shape& shape = input.shape();
  // [N, C] with targets [N], or PyTorch's K-dimensional form [N, C, d1, ..., dk] with targets
  // [N, d1, ..., dk]: every position a sample.
  const int rank = static_cast<int>(shape.size());
  bool fits =
      rank >= 2 && static_cast<int>(targets.dim()) == rank - 1 && targets.size(0) == shape[0];
  std::int64_t spatial = 1;
  for (int d = 2; fits && d < rank; ++d) {
    fits = targets.size(d - 1) == shape[d];
    spatial *= shape[d];
  }
  if (!fits) {
    throw shape_error(std::string(o.name()) + ": expected " +
                      (o.from_logits ? "logits" : "log-probabilities") +
                      " [N, C] and targets [N], or [N, C, d1, ...] and targets [N, d1, ...], got " +
                      (o.from_logits ? "logits " : "log-probabilities ") + shape.str() +
                      " and targets " + targets.shape().str());
  }
  const std::int64_t batch = shape[0] * spatial;  // samples (no overflow: both shapes exist)
  const std::int64_t classes = shape[1];
  if constexpr (is_eager_v<L>) {
    static_assert(tessera::detail::is_tensor<Targets>::value,
                  "cross_entropy, nll_loss: eager inputs take a tensor of targets");
    const Device device = eager_device(input, targets);
    if (targets.device() != device) {
      throw device_mismatch_error(std::string(o.name()) + ": the " +
                                  (o.from_logits ? "logits are" : "log-probabilities are") +
                                  " on " + device.str() + " and the targets on " +
                                  targets.device().str() + "; move the targets with .to(" +
                                  std::to_string(device.index) + ")");
    }
    if (rank > 2) {
      // The classes moved last, [N * d, C]: the [N, C] loss over every position, then the
      // per-position losses [N, d...] for Reduction::none.
      auto rows = Tensor<T, K>::empty_on(Shape{batch, classes}, device);
      rows.view({shape[0], spatial, classes})
          .copy_(materialize(input).reshape({shape[0], classes, spatial}).permute({0, 2, 1}));
      auto out =
          eager_class_loss<T, K>(rows, targets.reshape({batch}), o, weight, batch, classes, device);
      return o.reduction == Reduction::none ? out.view(targets.shape()) : out;
    }
    return eager_class_loss<T, K>(input, targets, o, weight, batch, classes, device);
  } else {
    autograd::detail::graph* g = autograd::detail::graph_of(input);
    const auto x = [&] {
      if constexpr (std::is_same_v<typename L::value_type, T>) {
        return autograd::detail::to_var(input, g);
      } else {
        return autograd::Var<T, K>(cast<T>(input));
      }
    }();
    Tensor<T, K> w = checked_class_weight<T, K>(o, weight, classes, x.device());
    const auto t = autograd::detail::to_var(targets, g);
    auto n = std::make_unique<cross_entropy_node<T, K>>(
        x.id(), t.id(), batch, classes, x.device(), o, std::move(w), rank > 2, shape[0], spatial);
    const Shape out_shape = o.reduction == Reduction::none ? targets.shape() : Shape{};
    const int id = g->add_node(std::move(n), out_shape, scalar_type_of<T>, x.device());
    return autograd::Var<T, K>(g, id, out_shape);
  }
}

}  // namespace detail

/// torch.nn.functional.cross_entropy with class-index targets: -log softmax(logits)[n, t_n] per
/// sample, mixed with label smoothing and rescaled by class weights as `args` says
/// (CrossEntropyArgs: reduction, ignore_index, label_smoothing, weight; PyTorch's semantics and
/// defaults, so cross_entropy(logits, targets) is the mean over the batch, targets of -100
/// ignored). `logits` is [N, C] (a tensor or a lazy expression), `targets` int64 [N] on the same
/// device; or PyTorch's K-dimensional form, logits [N, C, d1, ..., dk] and targets
/// [N, d1, ..., dk] (e.g. a segmentation map: every position is a sample, and the mean is over
/// all of them). Returns a 0-dim loss, or the targets' shape for Reduction::none. Numerically
/// stable for any logits (log_softmax subtracts each row's maximum). The mean over no sample (an
/// empty batch, every target ignored, or their weights summing to 0) is NaN, as in PyTorch; the
/// gradient rows of ignored samples are 0.
///
/// Eager (tensors and their expressions): a tensor, in a few fused passes. Traced (Vars and their
/// expressions; targets a Var or a tensor): one autograd node (detail::cross_entropy_node)
/// holding the options, differentiable with respect to the logits.
///
/// Throws, before computing anything: shape_error naming both shapes for other shapes;
/// std::invalid_argument for label_smoothing outside [0, 1]; dtype_error, device_mismatch_error
/// or shape_error for a weight that is not [C] of the logits' dtype on their device; and
/// tessera::error naming the value, C and ignore_index when a target other than ignore_index is
/// outside [0, C) (eagerly, or traced at every forward).
template <class L, class Targets>
auto cross_entropy(const L& logits, const Targets& targets, const CrossEntropyArgs& args = {}) {
  detail::class_loss_options o;
  o.reduction = args.reduction;
  o.ignore_index = args.ignore_index;
  o.label_smoothing = args.label_smoothing;
  o.weighted = args.weight.defined();
  return detail::class_loss(logits, targets, o, args.weight);
}

/// torch.nn.functional.nll_loss: -w[t_n] log_probs[n, t_n] per sample, for log-probabilities
/// [N, C] (a tensor, a lazy expression or, traced, a Var: log_softmax's output), targets int64
/// [N], or [N, C, d1, ...] and [N, d1, ...] as cross_entropy; NllLossArgs gives the reduction,
/// ignore_index and class weights with cross_entropy's meaning (cross_entropy(x, t, args) is
/// nll_loss(log_softmax(x, 1), t, args) without label smoothing). Traced, one autograd node,
/// differentiable with respect to the log-probabilities. Throws as cross_entropy does.
template <class L, class Targets>
auto nll_loss(const L& log_probs, const Targets& targets, const NllLossArgs& args = {}) {
  static_assert(is_floating_point_v<typename L::value_type>,
                "nll_loss: the log-probabilities must be floating point");
  detail::class_loss_options o;
  o.from_logits = false;
  o.reduction = args.reduction;
  o.ignore_index = args.ignore_index;
  o.weighted = args.weight.defined();
  return detail::class_loss(log_probs, targets, o, args.weight);
}

/// The losses under torch.nn.functional's names too (ts::nn::functional::cross_entropy, ...).
namespace functional {
using nn::binary_cross_entropy_with_logits;
using nn::cross_entropy;
using nn::CrossEntropyArgs;
using nn::l1_loss;
using nn::mse_loss;
using nn::nll_loss;
using nn::NllLossArgs;
using nn::Reduction;
using nn::smooth_l1_loss;
}  // namespace functional

}  // namespace tessera::nn
