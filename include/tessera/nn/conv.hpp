// Conv2d<T, Kind> (torch.nn.Conv2d) over NCHW inputs, and the pooling layers MaxPool2d,
// AvgPool2d and AdaptiveAvgPool2d (plain classes: no parameters). The forwards call
// ts::nn::functional, so the same body runs eagerly on tensors and traces on autograd Vars.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/nn/functional.hpp"
#include "tessera/nn/init.hpp"
#include "tessera/nn/module.hpp"

namespace tessera::nn {

/// Conv2d's arguments after the kernel size (PyTorch's names and defaults; padding_mode is
/// always 'zeros').
struct Conv2dOptions {
  Int2 stride = 1;
  Int2 padding = 0;
  Int2 dilation = 1;
  std::int64_t groups = 1;
  bool bias = true;
};

/// A 2-D convolution: weight [out_channels, in_channels / groups, kH, kW], bias [out_channels].
template <Dtype T, DeviceKind K = cpu>
class Conv2d : public Module {
  static_assert(is_floating_point_v<T>, "Conv2d<T>: T must be a floating-point dtype");

 public:
  using value_type = T;
  using device_kind = K;

  /// Allocates the weight (and bias) on ordinal `device` of kind K (-1: the current one) and
  /// initialises them as PyTorch does: kaiming_uniform_(weight, a = sqrt(5)) and bias
  /// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels / groups * kH * kW. Throws
  /// std::invalid_argument for non-positive sizes or groups not dividing both channel counts.
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, Int2 kernel_size,
         const Conv2dOptions& options = {}, int device = -1)
      : Module("Conv2d"),
        in_channels_(in_channels),
        out_channels_(out_channels),
        kernel_size_(kernel_size),
        options_(options) {
    if (in_channels <= 0 || out_channels <= 0 || kernel_size.h <= 0 || kernel_size.w <= 0 ||
        options.groups <= 0 || in_channels % options.groups != 0 ||
        out_channels % options.groups != 0 || options.stride.h <= 0 || options.stride.w <= 0 ||
        options.dilation.h <= 0 || options.dilation.w <= 0 || options.padding.h < 0 ||
        options.padding.w < 0) {
      throw std::invalid_argument(
          "Conv2d: expected positive channels and kernel_size, groups dividing in_channels and "
          "out_channels, stride and dilation >= 1, padding >= 0; got " + describe());
    }
    weight_.value() = empty<T, K>(
        {out_channels, in_channels / options.groups, kernel_size.h, kernel_size.w}, device);
    if (options.bias) bias_.value() = empty<T, K>({out_channels}, device);
    if (!detail::initialization_skipped()) reset_parameters();
    register_parameter("weight", weight_);
    if (options.bias) register_parameter("bias", bias_);
  }
  Conv2d(const Conv2d&) = default;

  /// Draws new initial values, as the constructor does (PyTorch's reset_parameters).
  void reset_parameters() {
    init::kaiming_uniform_(weight_.value(), std::sqrt(5.0));
    if (options_.bias) {
      const double fan_in = static_cast<double>(in_channels_ / options_.groups * kernel_size_.h *
                                                kernel_size_.w);
      const double bound = 1.0 / std::sqrt(fan_in);
      init::uniform_(bias_.value(), -bound, bound);
    }
  }

  /// The convolution of x [N, in_channels, H, W] (a tensor, a lazy expression of tensors, or an
  /// autograd Var / expression of Vars). Throws shape_error naming this layer, the expected and
  /// the actual shape.
  template <class X>
  auto forward(const X& x) const {
    static_assert(std::is_same_v<typename std::remove_cvref_t<X>::value_type, T>,
                  "Conv2d<T>: the input's dtype is not the layer's T; convert it with .to<T>()");
    static_assert(std::is_same_v<typename std::remove_cvref_t<X>::device_kind, K>,
                  "Conv2d<T, Kind>: the input is on another device kind than the layer");
    const Conv2dArgs args{options_.stride, options_.padding, options_.dilation, options_.groups};
    const auto& w = weight_.like(x);  // a tensor (eager) or the parameter's Var (traced)
    using W = std::remove_cvref_t<decltype(w)>;
    if (options_.bias) {
      const auto& b = bias_.like(x);
      return detail::conv2d_call<X, W, W>("Conv2d" + describe(), x, w, &b, args);
    }
    return detail::conv2d_call<X, W, W>("Conv2d" + describe(), x, w, nullptr, args);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

  const Parameter<T, K>& weight() const noexcept { return weight_; }
  /// Undefined value when built with bias = false.
  const Parameter<T, K>& bias() const noexcept { return bias_; }
  std::int64_t in_channels() const noexcept { return in_channels_; }
  std::int64_t out_channels() const noexcept { return out_channels_; }
  Int2 kernel_size() const noexcept { return kernel_size_; }
  const Conv2dOptions& options() const noexcept { return options_; }

  using Module::to;
  /// This layer on ordinal `index` of kind K2 (see ts::nn::to).
  template <DeviceKind K2>
  Conv2d<T, K2> to(int index = -1) const {
    return nn::to<K2>(*this, index);
  }
  /// An independent copy on `device` (of kind K2).
  template <DeviceKind K2>
  Conv2d<T, K2> copy_to(Device device) const {
    return detail::converted<K2>(*this, device, [&] {
      return Conv2d<T, K2>(in_channels_, out_channels_, kernel_size_, options_, device.index);
    });
  }
  /// This layer in dtype U (see ts::nn::to<Dtype>): an independent copy, values converted.
  template <Dtype U>
  Conv2d<U, K> to() const {
    return nn::to<U>(*this);
  }
  template <Dtype U>
  Conv2d<U, K> copy_as() const {
    const Device device = weight_.value().device();
    return detail::converted_as<K>(*this, device, [&] {
      return Conv2d<U, K>(in_channels_, out_channels_, kernel_size_, options_, device.index);
    });
  }

  /// PyTorch's repr after the class name: "(3, 64, kernel_size=(7, 7), stride=(2, 2), ...)".
  std::string describe() const {
    std::string s = "(" + std::to_string(in_channels_) + ", " + std::to_string(out_channels_) +
                    ", kernel_size=" + kernel_size_.str() + ", stride=" + options_.stride.str();
    if (!(options_.padding == Int2(0))) s += ", padding=" + options_.padding.str();
    if (!(options_.dilation == Int2(1))) s += ", dilation=" + options_.dilation.str();
    if (options_.groups != 1) s += ", groups=" + std::to_string(options_.groups);
    if (!options_.bias) s += ", bias=False";
    return s + ")";
  }

 private:
  std::int64_t in_channels_;
  std::int64_t out_channels_;
  Int2 kernel_size_;
  Conv2dOptions options_;
  Parameter<T, K> weight_;
  Parameter<T, K> bias_;
};

/// torch.nn.MaxPool2d(kernel_size, stride = kernel_size, padding = 0, dilation = 1,
/// ceil_mode = false). No indices are returned.
struct MaxPool2d {
  Int2 kernel_size = 1;
  MaxPool2dArgs args{};

  MaxPool2d() = default;
  explicit MaxPool2d(Int2 kernel, const MaxPool2dArgs& a = {}) : kernel_size(kernel), args(a) {}

  template <class X>
  auto forward(const X& x) const {
    return detail::max_pool2d_call("MaxPool2d(kernel_size=" + kernel_size.str() + ")", x,
                                   kernel_size, args);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }
};

/// torch.nn.AvgPool2d(kernel_size, stride = kernel_size, padding = 0, ceil_mode = false,
/// count_include_pad = true, divisor_override = none).
struct AvgPool2d {
  Int2 kernel_size = 1;
  AvgPool2dArgs args{};

  AvgPool2d() = default;
  explicit AvgPool2d(Int2 kernel, const AvgPool2dArgs& a = {}) : kernel_size(kernel), args(a) {}

  template <class X>
  auto forward(const X& x) const {
    return detail::avg_pool2d_call("AvgPool2d(kernel_size=" + kernel_size.str() + ")", x,
                                   kernel_size, args);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }
};

/// torch.nn.AdaptiveAvgPool2d(output_size): [N, C, H, W] to [N, C, output_size].
struct AdaptiveAvgPool2d {
  Int2 output_size = 1;

  AdaptiveAvgPool2d() = default;
  explicit AdaptiveAvgPool2d(Int2 size) : output_size(size) {}

  template <class X>
  auto forward(const X& x) const {
    return detail::adaptive_avg_pool2d_call(
        "AdaptiveAvgPool2d(output_size=" + output_size.str() + ")", x, output_size);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }
};

}  // namespace tessera::nn
