// BatchNorm1d<T, Kind> (torch.nn.BatchNorm1d) over inputs [N, C] or [N, C, L] and BatchNorm2d
// (torch.nn.BatchNorm2d) over [N, C, H, W]: in training they normalise with the batch's
// statistics (biased variance) and update the running statistics with PyTorch's momentum rule
// (unbiased variance); in evaluation mode they use the running ones. Keys: weight, bias,
// running_mean, running_var, num_batches_tracked.
//
// A compiled Program takes the module's mode when it is compiled (training: batch statistics
// and their gradient; evaluation: the running statistics as constants): the two are different
// graphs with different memory plans. Compile one program per mode; ts::nn::compile_eval does
// the evaluation one in one line.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tessera/expr/assign.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/expr/reduce.hpp"
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
    if (num_features < 0 || !(eps >= 0.0) || (momentum && !(*momentum >= 0 && *momentum <= 1))) {
      throw std::invalid_argument(
          std::string(layer) + ": expected num_features >= 0, eps >= 0 and momentum in [0, 1], got " +
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

  /// Normalises x ([N, C] or [N, C, L]; [N, C, H, W] for BatchNorm2d; a tensor or a lazy expression of tensors) per channel;
  /// returns a new tensor. In training mode with running statistics, also updates
  /// running_mean, running_var (in place) and num_batches_tracked. Throws shape_error for
  /// another shape (naming it and C), and tessera::error for a training batch with one value
  /// per channel (PyTorch's check), before changing anything.
  template <class X>
  auto forward(const X& x) const {
    if constexpr (detail::is_eager_v<X>) {
      using Input = detail::eager_tensor_t<X>;
      static_assert(std::is_same_v<typename Input::value_type, T>,
                    "BatchNorm<T>: the input's dtype is not T; convert it with .to<T>()");
      static_assert(std::is_same_v<typename Input::device_kind, K>,
                    "BatchNorm<T, Kind>: the input is on another device kind than the layer");
      const Input input = detail::materialize(x);
      const Shape& shape = input.shape();
      const Shape stat_shape = statistics_shape(shape);
      const std::int64_t per_channel = num_features_ > 0 ? input.numel() / num_features_ : 0;

      Tensor<T, K> mean, var;
      if (is_training() || !track_running_stats_) {
        if (is_training() && per_channel <= 1) {
          throw error(std::string(layer) +
                      ": expected more than 1 value per channel when training, got an input of "
                      "shape " + shape.str());
        }
        mean = channel_mean(input);
        var = channel_mean((input - mean) * (input - mean));  // biased, for normalising
        if (is_training() && track_running_stats_) update_running_stats(mean, var, per_channel);
      } else {
        mean = running_mean_.value().view(stat_shape);
        var = running_var_.value().view(stat_shape);
      }
      if (affine_) {
        return Input((input - mean) * rsqrt(var + eps_) * weight_.value().view(stat_shape) +
                     bias_.value().view(stat_shape));
      }
      return Input((input - mean) * rsqrt(var + eps_));
    } else {
      // Traced: the same formulas on Vars (their derivatives come from the autograd); the
      // running statistics are updated by an effect that runs at every forward. Training or
      // evaluation mode is the module's mode when the program is compiled.
      using V = autograd::Var<T, K>;
      static_assert(std::is_same_v<typename X::value_type, T> &&
                        std::is_same_v<typename X::device_kind, K>,
                    "BatchNorm<T, Kind>: the input's dtype or device kind is not the layer's");
      const V input = x;
      const Shape& shape = input.shape();
      const Shape stat_shape = statistics_shape(shape);
      const std::int64_t per_channel = num_features_ > 0 ? input.numel() / num_features_ : 0;
      auto affine = [&](const auto& normalised) {
        if (affine_) {
          return V(normalised * weight_.like(input).view(stat_shape) +
                   bias_.like(input).view(stat_shape));
        }
        return V(normalised);
      };
      if (is_training() || !track_running_stats_) {
        if (is_training() && per_channel <= 1) {
          throw error(std::string(layer) +
                      ": expected more than 1 value per channel when training, got an input of "
                      "shape " + shape.str());
        }
        const V mean = traced_channel_mean(input);
        const V centered = input - mean;
        const V var = traced_channel_mean(centered * centered);  // biased, for normalising
        if (is_training() && track_running_stats_) {
          const batch_norm self = *this;  // a handle: the same buffers
          autograd::on_forward(
              [self, per_channel](const Tensor<T, K>& m, const Tensor<T, K>& v) {
                self.update_running_stats(m, v, per_channel);
              },
              mean, var);
        }
        return affine(centered * rsqrt(var + eps_));
      } else {
        // The running statistics as they are at each forward (constants share their storage).
        const Tensor<T, K> mean = running_mean_.value().view(stat_shape);
        const Tensor<T, K> var = running_var_.value().view(stat_shape);
        return affine((input - mean) * rsqrt(var + eps_));
      }
    }
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

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
  /// The shape of the per-channel statistics ([1, C], [1, C, 1] or [1, C, 1, 1]) for an input
  /// of `shape`; throws shape_error naming the shape and C for any other input.
  Shape statistics_shape(const Shape& shape) const {
    const std::string c = std::to_string(num_features_);
    if constexpr (Rank4) {
      if (shape.size() != 4 || shape[1] != num_features_) {
        throw shape_error(std::string(layer) + "(" + c + "): expected an input of shape [N, " +
                          c + ", H, W], got " + shape.str());
      }
      return Shape{1, num_features_, 1, 1};
    } else {
      if ((shape.size() != 2 && shape.size() != 3) || shape[1] != num_features_) {
        throw shape_error(std::string(layer) + "(" + c + "): expected an input of shape [N, " +
                          c + "] or [N, " + c + ", L], got " + shape.str());
      }
      return shape.size() == 2 ? Shape{1, num_features_} : Shape{1, num_features_, 1};
    }
  }

  /// The mean over every dimension but 1 (the last ones first, then the batch), kept.
  template <class E>
  static Tensor<T, K> channel_mean(const E& e) {
    const int rank = e.shape().size();
    if (rank == 2) return mean(e, 0, true);
    Tensor<T, K> m = mean(e, rank - 1, true);
    for (int d = rank - 2; d >= 2; --d) m = mean(m, d, true);
    return mean(m, 0, true);
  }

  template <class E>
  static autograd::Var<T, K> traced_channel_mean(const E& e) {
    const int rank = e.shape().size();
    if (rank == 2) return mean(e, 0, true);
    autograd::Var<T, K> m = mean(e, rank - 1, true);
    for (int d = rank - 2; d >= 2; --d) m = mean(m, d, true);
    return mean(m, 0, true);
  }

  void update_running_stats(const Tensor<T, K>& batch_mean, const Tensor<T, K>& batch_var,
                            std::int64_t per_channel) const {
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
  /// An independent copy on `device` (of kind K2).
  template <DeviceKind K2>
  BatchNorm2d<T, K2> copy_to(Device device) const {
    return detail::converted<K2>(*this, device, [&] {
      return BatchNorm2d<T, K2>(this->num_features(), this->eps(), this->momentum(),
                                this->affine(), this->track_running_stats(), device.index);
    });
  }
};

}  // namespace tessera::nn
