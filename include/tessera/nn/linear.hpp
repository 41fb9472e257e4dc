// Linear<T, Kind>: y = x W^T + b (torch.nn.Linear), with PyTorch's default initialisation drawn
// from Tessera's Philox generator. The forward is written with ts::matmul, .t() and Parameter::like
// only, so the same body runs eagerly on tensors and traces on autograd Vars.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/expr/matmul.hpp"
#include "tessera/nn/detail/operand.hpp"
#include "tessera/nn/init.hpp"
#include "tessera/nn/module.hpp"

namespace tessera::nn {

/// A fully connected layer: weight [out_features, in_features], bias [out_features].
template <Dtype T, DeviceKind K = cpu>
class Linear : public Module {
 public:
  using value_type = T;
  using device_kind = K;

  /// Allocates the weight (and the bias) on ordinal `device` of kind K (-1: the current one),
  /// exactly their sizes from the device pool, and initialises them as PyTorch does:
  /// kaiming_uniform_(weight, a = sqrt(5)) and bias U(-1/sqrt(in), 1/sqrt(in)), that is both
  /// U(-1/sqrt(in_features), 1/sqrt(in_features)), from the device's generator (see
  /// ts::manual_seed). Throws std::invalid_argument for a negative size, device_error for an
  /// ordinal that does not exist.
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true, int device = -1)
      : Module("Linear"), in_features_(in_features), out_features_(out_features), has_bias_(bias) {
    if (in_features < 0 || out_features < 0) {
      throw std::invalid_argument("Linear: in_features (" + std::to_string(in_features) +
                                  ") and out_features (" + std::to_string(out_features) +
                                  ") must not be negative");
    }
    weight_.value() = empty<T, K>({out_features, in_features}, device);
    if (bias) bias_.value() = empty<T, K>({out_features}, device);
    if (!detail::initialization_skipped()) reset_parameters();
    register_parameter("weight", weight_);
    if (bias) register_parameter("bias", bias_);
  }

  Linear(const Linear&) = default;

  /// Draws new initial values, as the constructor does (PyTorch's reset_parameters).
  void reset_parameters() {
    init::kaiming_uniform_(weight_.value(), std::sqrt(5.0));
    if (has_bias_) {
      const double bound =
          in_features_ > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features_)) : 0.0;
      init::uniform_(bias_.value(), -bound, bound);
    }
  }

  /// x W^T + b for x of shape [N, in_features] or [B, N, in_features] (a tensor, a lazy
  /// expression of tensors, or, when traced, an autograd Var). Eager: returns a new tensor
  /// (the bias is added in place into the product: no second buffer). Throws shape_error naming
  /// the input's shape when its last dimension is not in_features.
  template <class X>
  auto forward(const X& x) const {
    decltype(auto) input = detail::materialize(x);
    if constexpr (detail::is_eager_v<X>) {
      using Input = detail::eager_tensor_t<X>;
      static_assert(std::is_same_v<typename Input::value_type, T>,
                    "Linear<T>: the input's dtype is not the layer's T; convert it with .to<T>()");
      static_assert(std::is_same_v<typename Input::device_kind, K>,
                    "Linear<T, Kind>: the input is on another device kind than the layer; move "
                    "one of them (x.to<Kind>(i), or ts::nn::to<Kind>(layer, i))");
      check_input(input.shape());
    }
    auto y = matmul(input, weight_.like(input).t());
    if (has_bias_) y = y + bias_.like(input);
    return y;
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

  const Parameter<T, K>& weight() const noexcept { return weight_; }
  /// The bias; its value is undefined for a layer built with bias = false.
  const Parameter<T, K>& bias() const noexcept { return bias_; }
  std::int64_t in_features() const noexcept { return in_features_; }
  std::int64_t out_features() const noexcept { return out_features_; }
  bool has_bias() const noexcept { return has_bias_; }

  using Module::to;
  /// This layer on ordinal `index` of kind K2 (see ts::nn::to): the same layer when it is
  /// already there, otherwise a new one holding copies of the values.
  template <DeviceKind K2>
  Linear<T, K2> to(int index = -1) const {
    return nn::to<K2>(*this, index);
  }
  /// An independent copy on `device` (of kind K2).
  template <DeviceKind K2>
  Linear<T, K2> copy_to(Device device) const {
    return detail::converted<K2>(*this, device, [&] {
      return Linear<T, K2>(in_features_, out_features_, has_bias_, device.index);
    });
  }
  /// This layer in dtype U (see ts::nn::to<Dtype>): an independent copy, values converted.
  template <Dtype U>
  Linear<U, K> to() const {
    return nn::to<U>(*this);
  }
  template <Dtype U>
  Linear<U, K> copy_as() const {
    const Device device = weight_.value().device();
    return detail::converted_as<K>(*this, device, [&] {
      return Linear<U, K>(in_features_, out_features_, has_bias_, device.index);
    });
  }

 private:
  void check_input(const Shape& shape) const {
    if ((shape.size() != 2 && shape.size() != 3) || shape[shape.size() - 1] != in_features_) {
      throw shape_error("Linear: expected an input of shape [N, " + std::to_string(in_features_) +
                        "] or [B, N, " + std::to_string(in_features_) + "], got " + shape.str() +
                        " (in_features = " + std::to_string(in_features_) + ")");
    }
  }

  std::int64_t in_features_;
  std::int64_t out_features_;
  bool has_bias_;
  Parameter<T, K> weight_;
  Parameter<T, K> bias_;
};

}  // namespace tessera::nn
