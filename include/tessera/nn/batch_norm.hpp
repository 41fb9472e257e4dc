// BatchNorm1d<T, Kind> (torch.nn.BatchNorm1d) over inputs [N, C] or [N, C, L] and BatchNorm2d
// (torch.nn.BatchNorm2d) over [N, C, H, W]: in training they normalise with the batch's
// statistics (biased variance) and update the running statistics with PyTorch's momentum rule
// (unbiased variance); in evaluation mode they use the running ones. Keys: weight, bias,
// running_mean, running_var, num_batches_tracked.
//
// A compiled Program reads the module's mode at every forward (module.train() / eval() take
// effect on the next run): the statistics node computes the batch's statistics or copies the
// running ones, the running statistics move only in training, and backward follows the
// statistics its forward used. forward_relu fuses a following ReLU.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tessera/expr/assign.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/expr/reduce.hpp"
#include "tessera/nn/detail/batch_norm.hpp"
#include "tessera/nn/detail/conv_nodes.hpp"
#include "tessera/nn/detail/operand.hpp"
#include "tessera/nn/module.hpp"
#include "tessera/tensor/factories.hpp"

namespace tessera::nn {

/// BatchNorm's arguments after num_features (PyTorch's names and defaults; momentum
/// std::nullopt is PyTorch's None, the cumulative average).
struct BatchNormOptions {
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

namespace detail {

/// The statistics [3, C] (mean, 1 / sqrt(var + eps), var) of a traced batch norm: the batch's
/// or the running ones, as the module's mode says at each forward. No gradient flows through
/// it: batch_norm_apply_node's backward includes the statistics' dependence on x.
template <class T, class K, class BN>
class batch_norm_stats_node final : public autograd::detail::node {
 public:
  batch_norm_stats_node(int x, BN bn, Shape view) : bn_(std::move(bn)), view_(std::move(view)) {
    inputs = {x};
  }
  const char* name() const override { return "batch_norm_stats"; }
  std::size_t forward_scratch() const override { return batch_norm_stats_workspace<T, K>(view_); }
  // The module's mode chooses the kernels (batch or running statistics) and the effect's update.
  std::int64_t prepare_replay(autograd::detail::value_table&) override {
    return (bn_.uses_batch_statistics() ? 1 : 0) + (bn_.is_training() ? 2 : 0);
  }
  void forward(autograd::detail::value_table& table) override {
    const Tensor<T, K> x3 = dense_value<T, K>(table, inputs[0]).view(view_);
    Tensor<T, K> stats = table.template get<T, K>(output);
    if (bn_.uses_batch_statistics()) {
      if (bn_.is_training() && view_[0] * view_[2] <= 1) {
        throw error("BatchNorm: expected more than 1 value per channel when training, got " +
                    std::to_string(view_[0] * view_[2]));
      }
      workspace ws = scratch_of(table);
      batch_norm_batch_stats(x3, stats, bn_.eps(), ws);
    } else {
      batch_norm_running_stats(bn_.running_mean().value(), bn_.running_var().value(), stats,
                               bn_.eps());
    }
  }

 private:
  BN bn_;
  Shape view_;
};

/// y = x * scale + shift (ReLU fused on request) from the statistics node's [3, C]; backward
/// gives x, weight and bias their gradients, through the batch statistics when the forward
/// used them.
template <class T, class K, class BN>
class batch_norm_apply_node final : public autograd::detail::node {
 public:
  batch_norm_apply_node(int x, int stats, int w, int b, BN bn, Shape view, bool relu_after)
      : bn_(std::move(bn)), view_(std::move(view)), relu_(relu_after), affine_(w >= 0) {
    inputs = {x, stats};
    if (affine_) inputs.insert(inputs.end(), {w, b});
  }
  const char* name() const override { return relu_ ? "batch_norm_relu" : "batch_norm"; }
  std::size_t forward_scratch() const override { return batch_norm_apply_workspace<T>(view_); }
  // backward follows the statistics forward used (batch_), which the module's mode chooses.
  std::int64_t prepare_replay(autograd::detail::value_table&) override {
    batch_ = bn_.uses_batch_statistics();
    return batch_ ? 1 : 0;
  }
  void forward(autograd::detail::value_table& table) override {
    batch_ = bn_.uses_batch_statistics();
    const Tensor<T, K> x3 = dense_value<T, K>(table, inputs[0]).view(view_);
    const Tensor<T, K> stats = table.template get<T, K>(inputs[1]);
    Tensor<T, K> y3 = table.template get<T, K>(output).view(view_);
    workspace ws = scratch_of(table);
    if (affine_) {
      const Tensor<T, K> w = table.template get<T, K>(inputs[2]);
      const Tensor<T, K> b = table.template get<T, K>(inputs[3]);
      batch_norm_apply(x3, stats, &w, &b, relu_, y3, ws);
    } else {
      batch_norm_apply<T, K>(x3, stats, nullptr, nullptr, relu_, y3, ws);
    }
  }
  std::vector<int> inplace_candidates() const override { return {inputs[0]}; }
  void finalize(const std::vector<autograd::detail::value_info>& values) override {
    auto needs = [&](int id) { return values[static_cast<std::size_t>(id)].requires_grad; };
    needs_x_ = needs(inputs[0]);
    needs_w_ = affine_ && needs(inputs[2]);
    needs_b_ = affine_ && needs(inputs[3]);
  }
  std::vector<int> contributions() const override {
    std::vector<int> out;
    if (needs_x_) out.push_back(inputs[0]);
    if (needs_w_) out.push_back(inputs[2]);
    if (needs_b_) out.push_back(inputs[3]);
    return out;
  }
  std::vector<int> backward_reads() const override {
    if (!needs_x_ && !needs_w_ && !needs_b_) return {};
    std::vector<int> values{inputs[0], inputs[1]};
    if (affine_) values.push_back(inputs[2]);
    if (relu_) values.push_back(output);
    return autograd::detail::encode_reads(values, {output});
  }
  std::size_t backward_scratch() const override {
    return batch_norm_backward_workspace<T, K>(view_);
  }
  void backward(autograd::detail::value_table& table,
                const std::vector<char>& accumulate) override {
    const Tensor<T, K> x3 = dense_value<T, K>(table, inputs[0]).view(view_);
    const Tensor<T, K> stats = table.template get<T, K>(inputs[1]);
    const Tensor<T, K> g3 = table.template grad<T, K>(output).view(view_);
    const Tensor<T, K> y3 = relu_ ? table.template get<T, K>(output).view(view_) : Tensor<T, K>();
    Tensor<T, K> w, dx3, dw, db;
    if (affine_) w = table.template get<T, K>(inputs[2]);
    std::size_t next = 0;
    bool ax = false, aw = false, ab = false;
    if (needs_x_) dx3 = table.template grad<T, K>(inputs[0]).view(view_), ax = accumulate[next++] != 0;
    if (needs_w_) dw = table.template grad<T, K>(inputs[2]), aw = accumulate[next++] != 0;
    if (needs_b_) db = table.template grad<T, K>(inputs[3]), ab = accumulate[next++] != 0;
    workspace ws = scratch_of(table);
    batch_norm_backward(x3, stats, affine_ ? &w : nullptr, y3, relu_, batch_, g3,
                        needs_x_ ? &dx3 : nullptr, ax, needs_w_ ? &dw : nullptr, aw,
                        needs_b_ ? &db : nullptr, ab, ws);
  }

 private:
  BN bn_;
  Shape view_;
  bool relu_;
  bool affine_;
  bool batch_ = true;
  bool needs_x_ = false, needs_w_ = false, needs_b_ = false;
};

/// Batch normalisation over the channel dimension 1 of inputs of rank 2 or 3 (Rank4 false:
/// BatchNorm1d) or rank 4 (BatchNorm2d).
template <Dtype T, DeviceKind K, bool Rank4>
class batch_norm : public Module {
  static_assert(is_floating_point_v<T>, "BatchNorm<T>: T must be a floating-point dtype");
  static constexpr const char* layer = Rank4 ? "BatchNorm2d" : "BatchNorm1d";

 public:
  using value_type = T;
  using device_kind = K;

  /// `num_features` channels C. `momentum` weighs the newest batch in the running statistics;
  /// std::nullopt gives the cumulative average (1 / num_batches_tracked), as PyTorch's None.
  /// `affine`: learn a per-channel weight (ones) and bias (zeros). `track_running_stats`: keep
  /// running_mean (zeros), running_var (ones) and num_batches_tracked (0, int64); without them
  /// batch statistics are used in both modes. Throws std::invalid_argument for a negative
  /// num_features or eps, or a momentum outside [0, 1].
  explicit batch_norm(std::int64_t num_features, double eps = 1e-5,
                      std::optional<double> momentum = 0.1, bool affine = true,
                      bool track_running_stats = true, int device = -1)
      : Module(layer),
        num_features_(num_features),
        eps_(eps),
        momentum_(momentum),
        affine_(affine),
        track_running_stats_(track_running_stats) {
    // No channels is refused here, by name: such a layer normalises nothing, and an error in
    // its forward would not say why.
    if (num_features < 1 || !(eps >= 0.0) || (momentum && !(*momentum >= 0 && *momentum <= 1))) {
      throw std::invalid_argument(
          std::string(layer) + ": expected num_features >= 1, eps >= 0 and momentum in [0, 1], got " +
          std::to_string(num_features) + ", " + std::to_string(eps) + " and " +
          (momentum ? std::to_string(*momentum) : std::string("none")));
    }
    const Shape channels{num_features};
    if (affine) {
      weight_.value() = ones<T, K>(channels, device);
      bias_.value() = zeros<T, K>(channels, device);
      register_parameter("weight", weight_);
      register_parameter("bias", bias_);
    }
    if (track_running_stats) {
      running_mean_.value() = zeros<T, K>(channels, device);
      running_var_.value() = ones<T, K>(channels, device);
      num_batches_tracked_.value() = zeros<std::int64_t, K>(Shape{}, device);
      register_buffer("running_mean", running_mean_);
      register_buffer("running_var", running_var_);
      register_buffer("num_batches_tracked", num_batches_tracked_);
    }
  }
  /// The same with the arguments by name: BatchNorm2d<float>(64, {.momentum = 0.01}).
  batch_norm(std::int64_t num_features, const BatchNormOptions& options, int device = -1)
      : batch_norm(num_features, options.eps, options.momentum, options.affine,
                   options.track_running_stats, device) {}
  batch_norm(const batch_norm&) = default;

  /// Normalises x ([N, C] or [N, C, L]; [N, C, H, W] for BatchNorm2d; a tensor, a lazy
  /// expression of tensors, an autograd Var or an expression of Vars) per channel. Eager: returns
  /// a new tensor; in training mode with running statistics, also updates running_mean,
  /// running_var (in place) and num_batches_tracked. Traced: the mode is read at every run of
  /// the program (module.train() / eval() take effect on the next forward; the gradient follows
  /// the statistics that forward used). Throws shape_error for another shape (naming it and C),
  /// and tessera::error for a training batch with one value per channel (PyTorch's check),
  /// before changing anything.
  template <class X>
  auto forward(const X& x) const {
    return normalise(x, false);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }
  /// relu(forward(x)) as one pass, whose backward keeps the output instead of a second
  /// activation (ResNet's blocks use it).
  template <class X>
  auto forward_relu(const X& x) const {
    return normalise(x, true);
  }

  /// True when a forward now normalises with the batch's statistics (training, or no running
  /// statistics kept).
  bool uses_batch_statistics() const { return is_training() || !track_running_stats_; }

  /// Running statistics back to mean 0, variance 1, no batches.
  void reset_running_stats() {
    if (!track_running_stats_) return;
    running_mean_.value().zero_();
    running_var_.value().fill_(T(1));
    num_batches_tracked_.value().zero_();
  }

  /// Undefined values when affine is false.
  const Parameter<T, K>& weight() const noexcept { return weight_; }
  const Parameter<T, K>& bias() const noexcept { return bias_; }
  /// Undefined values when track_running_stats is false.
  const Buffer<T, K>& running_mean() const noexcept { return running_mean_; }
  const Buffer<T, K>& running_var() const noexcept { return running_var_; }
  const Buffer<std::int64_t, K>& num_batches_tracked() const noexcept {
    return num_batches_tracked_;
  }
  std::int64_t num_features() const noexcept { return num_features_; }
  double eps() const noexcept { return eps_; }
  std::optional<double> momentum() const noexcept { return momentum_; }
  bool affine() const noexcept { return affine_; }
  bool track_running_stats() const noexcept { return track_running_stats_; }

 protected:
  /// The [N, C, L] view of an input of `shape` (L = 1 for [N, C], H * W for [N, C, H, W]) after
  /// the checks: shape_error naming the shape and C for another shape; tessera::error for a
  /// training batch with one value per channel (PyTorch's check).
  Shape checked_view(const Shape& shape) const {
    const std::string c = std::to_string(num_features_);
    if constexpr (Rank4) {
      if (shape.size() != 4 || shape[1] != num_features_) {
        throw shape_error(std::string(layer) + "(" + c + "): expected an input of shape [N, " +
                          c + ", H, W], got " + shape.str());
      }
    } else {
      if ((shape.size() != 2 && shape.size() != 3) || shape[1] != num_features_) {
        throw shape_error(std::string(layer) + "(" + c + "): expected an input of shape [N, " +
                          c + "] or [N, " + c + ", L], got " + shape.str());
      }
    }
    const Shape view = batch_norm_view(shape);
    if (is_training() && view[0] * view[2] <= 1) {
      throw error(std::string(layer) +
                  ": expected more than 1 value per channel when training, got an input of "
                  "shape " + shape.str());
    }
    return view;
  }

  template <class X>
  auto normalise(const X& x, bool relu_after) const {
    using In = typename std::remove_cvref_t<X>::value_type;
    if constexpr (!std::is_same_v<In, T> && is_floating_point_v<In> && is_floating_point_v<T>) {
      // Another floating dtype (a float BatchNorm in a half model, nn::to<ts::half>):
      // normalised in T, given back in the input's dtype. The casts are expressions: the one in
      // is the elementwise pass that makes the T input the statistics read (fused with x's own
      // expression when x is one), the one out fuses into the next consumer (traced) or is one
      // pass (eager).
      auto y = normalise(tessera::cast<T>(x), relu_after);
      if constexpr (nn::detail::is_eager_v<X>) {
        return tessera::eval(tessera::cast<In>(y));
      } else {
        return tessera::cast<In>(y);
      }
    } else {
      return normalise_same(x, relu_after);
    }
  }
  template <class X>
  auto normalise_same(const X& x, bool relu_after) const {
    static_assert(std::is_same_v<typename std::remove_cvref_t<X>::value_type, T>,
                  "BatchNorm<T>: the input's dtype is not T; convert it with .to<T>()");
    static_assert(std::is_same_v<typename std::remove_cvref_t<X>::device_kind, K>,
                  "BatchNorm<T, Kind>: the input is on another device kind than the layer");
    if constexpr (nn::detail::is_eager_v<X>) {
      const Tensor<T, K> input = nn::detail::materialize(x);
      const Shape& shape = input.shape();
      const Shape view = checked_view(shape);
      // A channels_last input is normalised in place of its layout (its [N, C, H * W] view has
      // the channel innermost) and gives a channels_last output, as PyTorch.
      const memory_format format = input.suggest_memory_format();
      const Tensor<T, K> x3 = input.contiguous(format).view(view);
      Tensor<T, K> stats = Tensor<T, K>::empty_on(Shape{3, num_features_}, input.device());
      workspace ws = eager_workspace(input.device(), batch_norm_stats_workspace<T, K>(view) +
                                                         batch_norm_apply_workspace<T>(view));
      // Every allocation before the running statistics move: a failure (out of memory) leaves
      // the module as it was.
      Tensor<T, K> y = Tensor<T, K>::empty_on(shape, input.device(), format);
      Tensor<T, K> y3 = y.view(view);
      if (uses_batch_statistics()) {
        batch_norm_batch_stats(x3, stats, eps_, ws);
      } else {
        batch_norm_running_stats(running_mean_.value(), running_var_.value(), stats, eps_);
      }
      const Tensor<T, K>& w = weight_.value();
      const Tensor<T, K>& b = bias_.value();
      batch_norm_apply(x3, stats, affine_ ? &w : nullptr, affine_ ? &b : nullptr, relu_after, y3,
                       ws);
      if (uses_batch_statistics() && is_training() && track_running_stats_) {
        update_running_stats(stats.select(0, 0), stats.select(0, 2), view[0] * view[2]);
      }
      return y;
    } else {
      using V = autograd::Var<T, K>;
      // A channels_last input gives a channels_last output (its [N, C, H * W] view has the
      // channel innermost), as eager.
      const V bound(x);
      const memory_format format = var_format(bound);
      const V input = dense_var(bound, format);
      const Shape& shape = input.shape();
      const Shape view = checked_view(shape);
      autograd::detail::graph* g = input.graph();
      const Shape stats_shape{3, num_features_};
      const int stats_id = g->add_node(
          std::make_unique<batch_norm_stats_node<T, K, batch_norm>>(input.id(), *this, view),
          stats_shape, scalar_type_of<T>, input.device());
      g->values[static_cast<std::size_t>(stats_id)].requires_grad = false;
      const V stats(g, stats_id, stats_shape);
      if (track_running_stats_) {
        const batch_norm self = *this;  // a handle: the same buffers and mode
        const std::int64_t count = view[0] * view[2];
        autograd::detail::effect_node& effect = autograd::detail::record_effect(
            [self, count](const Tensor<T, K>& s) {
              if (self.is_training()) self.update_running_stats(s.select(0, 0), s.select(0, 2), count);
            },
            stats);
        // With a momentum the update is device work only; the cumulative average (momentum
        // None) reads the batch count on the host.
        effect.set_capture_blocker(
            momentum_ ? nullptr
                      : "BatchNorm with momentum None (its cumulative average reads the batch "
                        "count on the host)");
      }
      int w = -1, b = -1;
      if (affine_) {
        w = V(weight_.like(input)).id();
        b = V(bias_.like(input)).id();
      }
      return record(input,
                    std::make_unique<batch_norm_apply_node<T, K, batch_norm>>(
                        input.id(), stats_id, w, b, *this, view, relu_after),
                    shape, format);
    }
  }

 public:
  /// Moves the running statistics by one batch's mean and biased variance (rows of [3, C]
  /// statistics or [C] tensors) over `count` values per channel, with PyTorch's momentum rule.
  void update_running_stats(const Tensor<T, K>& batch_mean, const Tensor<T, K>& batch_var,
                            std::int64_t per_channel) const {
    if (per_channel <= 1) return;
    Tensor<std::int64_t, K> tracked = num_batches_tracked_.value();
    tracked += 1;
    // PyTorch's exponential_average_factor: the momentum, or 1/n for the cumulative average.
    const double factor = momentum_ ? *momentum_ : 1.0 / static_cast<double>(tracked.item());
    const double unbiased = static_cast<double>(per_channel) / static_cast<double>(per_channel - 1);
    Tensor<T, K> running_mean = running_mean_.value();
    Tensor<T, K> running_var = running_var_.value();
    const Shape channels{num_features_};
    running_mean = running_mean * (1.0 - factor) + batch_mean.view(channels) * factor;
    running_var = running_var * (1.0 - factor) + batch_var.view(channels) * (factor * unbiased);
  }

 protected:

  std::int64_t num_features_;
  double eps_;
  std::optional<double> momentum_;
  bool affine_;
  bool track_running_stats_;
  Parameter<T, K> weight_;
  Parameter<T, K> bias_;
  Buffer<T, K> running_mean_;
  Buffer<T, K> running_var_;
  Buffer<std::int64_t, K> num_batches_tracked_;
};

}  // namespace detail

/// torch.nn.BatchNorm1d(num_features, eps, momentum, affine, track_running_stats) over [N, C] or
/// [N, C, L].
template <Dtype T, DeviceKind K = cpu>
class BatchNorm1d : public detail::batch_norm<T, K, false> {
 public:
  using detail::batch_norm<T, K, false>::batch_norm;
  BatchNorm1d(const BatchNorm1d&) = default;

  using Module::to;
  /// This layer on ordinal `index` of kind K2 (see ts::nn::to).
  template <DeviceKind K2>
  BatchNorm1d<T, K2> to(int index = -1) const {
    return nn::to<K2>(*this, index);
  }
  /// An independent copy on `device` (of kind K2).
  template <DeviceKind K2>
  BatchNorm1d<T, K2> copy_to(Device device) const {
    return detail::converted<K2>(*this, device, [&] {
      return BatchNorm1d<T, K2>(this->num_features(), this->eps(), this->momentum(),
                                this->affine(), this->track_running_stats(), device.index);
    });
  }
  /// Under ts::nn::to<Dtype> the layer keeps its dtype (keeps_dtype): an independent copy.
  template <Dtype U>
  BatchNorm1d copy_as() const {
    return copy_to<K>(detail::module_device(*this));
  }
};

/// torch.nn.BatchNorm2d(num_features, eps, momentum, affine, track_running_stats) over
/// [N, C, H, W]: statistics per channel over N, H and W.
template <Dtype T, DeviceKind K = cpu>
class BatchNorm2d : public detail::batch_norm<T, K, true> {
 public:
  using detail::batch_norm<T, K, true>::batch_norm;
  BatchNorm2d(const BatchNorm2d&) = default;

  using Module::to;
  /// This layer on ordinal `index` of kind K2 (see ts::nn::to).
  template <DeviceKind K2>
  BatchNorm2d<T, K2> to(int index = -1) const {
    return nn::to<K2>(*this, index);
  }
  /// Under ts::nn::to<Dtype> the layer keeps its dtype (keeps_dtype): an independent copy.
  template <Dtype U>
  BatchNorm2d copy_as() const {
    return copy_to<K>(detail::module_device(*this));
  }
  /// An independent copy on `device` (of kind K2).
  template <DeviceKind K2>
  BatchNorm2d<T, K2> copy_to(Device device) const {
    return detail::converted<K2>(*this, device, [&] {
      return BatchNorm2d<T, K2>(this->num_features(), this->eps(), this->momentum(),
                                this->affine(), this->track_running_stats(), device.index);
    });
  }
};

/// BatchNorm stays in its dtype when a model is converted (ts::nn::to<ts::half>), the seed's
/// advice for half-precision training: its statistics in float.
template <Dtype T, DeviceKind K>
struct keeps_dtype<BatchNorm1d<T, K>> : std::true_type {};
template <Dtype T, DeviceKind K>
struct keeps_dtype<BatchNorm2d<T, K>> : std::true_type {};

}  // namespace tessera::nn
