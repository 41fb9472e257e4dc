// ts::nn::functional: convolution and pooling as functions (torch.nn.functional's names and
// arguments). Each takes tensors (eager: a new tensor, its workspace from the device pool for the
// call) or autograd Vars (traced: a node whose workspace is part of the program's memory plan).
// one_hot (tensors only: labels have no gradient) lives in nn/one_hot.hpp, included here.
//
//     auto y = ts::nn::functional::conv2d(x, w, b, {.stride = 2, .padding = 1});
//     auto p = ts::nn::functional::max_pool2d(y, 3, {.stride = 2, .padding = 1});
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "tessera/nn/detail/conv2d.hpp"
#include "tessera/nn/detail/conv2d_nhwc.hpp"
#include "tessera/nn/detail/conv_nodes.hpp"
#include "tessera/nn/detail/operand.hpp"
#include "tessera/nn/detail/pool2d.hpp"
#include "tessera/nn/one_hot.hpp"

namespace tessera::nn::detail {

template <class X>
using value_of_t = typename std::remove_cvref_t<X>::value_type;
template <class X>
using kind_of_t = typename std::remove_cvref_t<X>::device_kind;

inline void check_same_device(const std::string& who, Device a, Device b, const char* what) {
  if (a != b) {
    throw device_mismatch_error(who + ": expected the input and the " + what +
                                " on the same device, got " + a.str() + " and " + b.str());
  }
}

/// channels_last when the input or the weight is laid out channels_last (PyTorch's rule for
/// convolutions), contiguous_format otherwise.
template <class T, class K>
memory_format conv2d_output_format(const Tensor<T, K>& x, const Tensor<T, K>& w) {
  return x.suggest_memory_format() == memory_format::channels_last ||
                 w.suggest_memory_format() == memory_format::channels_last
             ? memory_format::channels_last
             : memory_format::contiguous_format;
}

/// conv2d of x, w and an optional bias (nullptr: none; B void when there is no bias type),
/// named `who` in errors.
template <class X, class W, class B>
auto conv2d_call(const std::string& who, const X& x_in, const W& w_in, const B* b_in,
                 const Conv2dArgs& args) {
  using T = value_of_t<X>;
  using K = kind_of_t<X>;
  static_assert(is_floating_point_v<T>, "conv2d: the input must be floating point");
  static_assert(std::is_same_v<value_of_t<W>, T> && std::is_same_v<kind_of_t<W>, K>,
                "conv2d: the weight's dtype or device kind is not the input's");
  if constexpr (!std::is_same_v<B, void>) {
    static_assert(std::is_same_v<value_of_t<B>, T> && std::is_same_v<kind_of_t<B>, K>,
                  "conv2d: the bias's dtype or device kind is not the input's");
  }
  if constexpr (is_eager_v<X> && is_eager_v<W>) {
    const Tensor<T, K> x = materialize(x_in);
    const Tensor<T, K> w = materialize(w_in);
    Shape bias_shape;
    Tensor<T, K> b;
    if constexpr (!std::is_same_v<B, void>) {
      if (b_in != nullptr) {
        b = materialize(*b_in);
        bias_shape = b.shape();
        check_same_device(who, x.device(), b.device(), "bias");
      }
    }
    check_same_device(who, x.device(), w.device(), "weight");
    conv2d_geometry g =
        conv2d_geometry_of(who, x.shape(), w.shape(), b_in ? &bias_shape : nullptr, args);
    // channels_last in (input or weight) gives channels_last out, as PyTorch's convolution: x, w
    // and y NHWC-dense (conv2d_forward runs them natively, through cuDNN, or on NCHW copies).
    const memory_format format = conv2d_output_format(x, w);
    g.channels_last = format == memory_format::channels_last;
    conv2d_choose_cudnn<T, K>(g, x.device(), /*with_backward=*/false);  // the forward only
    const Tensor<T, K> xd = x.contiguous(format);  // x itself when already so
    const Tensor<T, K> wd = w.contiguous(format);
    Tensor<T, K> y = Tensor<T, K>::empty_on(g.output_shape(), x.device(), format);
    workspace ws = eager_workspace(x.device(), conv2d_forward_workspace<T, K>(g));
    conv2d_forward(g, xd, wd, b_in ? &b : nullptr, y, ws);
    return y;
  } else {
    autograd::detail::graph* graph = [&] {
      if constexpr (!is_eager_v<X>) {
        return autograd::detail::graph_of(x_in);
      } else {
        return autograd::detail::graph_of(w_in);
      }
    }();
    // PyTorch's rule, as eager: channels_last when the input or the weight is.
    const auto x_var = autograd::detail::to_var(x_in, graph);
    const auto w_var = autograd::detail::to_var(w_in, graph);
    const memory_format format = var_format(x_var) == memory_format::channels_last ||
                                         var_format(w_var) == memory_format::channels_last
                                     ? memory_format::channels_last
                                     : memory_format::contiguous_format;
    const auto x = dense_var(x_var, format);
    const auto w = dense_var(w_var, format);
    check_same_device(who, x.device(), w.device(), "weight");
    int bias_id = -1;
    Shape bias_shape;
    if constexpr (!std::is_same_v<B, void>) {
      if (b_in != nullptr) {
        const auto b = contiguous_var(autograd::detail::to_var(*b_in, graph));
        check_same_device(who, x.device(), b.device(), "bias");
        bias_id = b.id();
        bias_shape = b.shape();
      }
    }
    conv2d_geometry g =
        conv2d_geometry_of(who, x.shape(), w.shape(), b_in ? &bias_shape : nullptr, args);
    g.channels_last = format == memory_format::channels_last;  // before cuDNN's choice: its key
    conv2d_choose_cudnn<T, K>(g, x.device());  // kept by the node: its plan's workspace
    return record(x, std::make_unique<conv2d_node<T, K>>(x.id(), w.id(), bias_id, g),
                  g.output_shape(), format);
  }
}

template <class X>
auto max_pool2d_call(const std::string& who, const X& x_in, Int2 kernel,
                     const MaxPool2dArgs& a) {
  using T = value_of_t<X>;
  using K = kind_of_t<X>;
  static_assert(is_floating_point_v<T>, "max_pool2d: the input must be floating point");
  if constexpr (is_eager_v<X>) {
    const Tensor<T, K> x = materialize(x_in);
    const pool2d_geometry g =
        pool2d_geometry_of(who, x.shape(), kernel, a.stride, a.padding, a.dilation, a.ceil_mode);
    Tensor<T, K> y = Tensor<T, K>::empty_on(g.output_shape(), x.device(), pool2d_format(x));
    workspace ws = eager_workspace(x.device(), max_pool2d_forward_workspace<T>(g));
    max_pool2d_forward(g, x, y, ws);
    return y;
  } else {
    const auto x = autograd::detail::to_var(x_in, autograd::detail::graph_of(x_in));
    const pool2d_geometry g =
        pool2d_geometry_of(who, x.shape(), kernel, a.stride, a.padding, a.dilation, a.ceil_mode);
    // Pooling keeps its input's layout (as eager's pool2d_format).
    return record(x, std::make_unique<max_pool2d_node<T, K>>(x.id(), g), g.output_shape(),
                  var_format(x));
  }
}

template <class X>
auto avg_pool2d_call(const std::string& who, const X& x_in, Int2 kernel, const AvgPool2dArgs& a) {
  using T = value_of_t<X>;
  using K = kind_of_t<X>;
  static_assert(is_floating_point_v<T>, "avg_pool2d: the input must be floating point");
  if (a.divisor_override < 0) {
    throw shape_error(who + ": divisor_override must be positive, got " +
                      std::to_string(a.divisor_override));
  }
  if constexpr (is_eager_v<X>) {
    const Tensor<T, K> x = materialize(x_in);
    const pool2d_geometry g =
        pool2d_geometry_of(who, x.shape(), kernel, a.stride, a.padding, 1, a.ceil_mode);
    Tensor<T, K> y = Tensor<T, K>::empty_on(g.output_shape(), x.device(), pool2d_format(x));
    workspace ws = eager_workspace(x.device(), avg_pool2d_workspace<T>(g));
    avg_pool2d_forward(g, a, x, y, ws);
    return y;
  } else {
    const auto x = autograd::detail::to_var(x_in, autograd::detail::graph_of(x_in));
    const pool2d_geometry g =
        pool2d_geometry_of(who, x.shape(), kernel, a.stride, a.padding, 1, a.ceil_mode);
    return record(x, std::make_unique<avg_pool2d_node<T, K>>(x.id(), g, a), g.output_shape(),
                  var_format(x));
  }
}

template <class X>
auto adaptive_avg_pool2d_call(const std::string& who, const X& x_in, Int2 output_size) {
  using T = value_of_t<X>;
  using K = kind_of_t<X>;
  static_assert(is_floating_point_v<T>, "adaptive_avg_pool2d: the input must be floating point");
  if constexpr (is_eager_v<X>) {
    const Tensor<T, K> x = materialize(x_in);
    const adaptive_geometry g = adaptive_geometry_of(who, x.shape(), output_size);
    Tensor<T, K> y = Tensor<T, K>::empty_on(g.output_shape(), x.device(), pool2d_format(x));
    workspace ws = eager_workspace(x.device(), adaptive_avg_pool2d_workspace<T>(g));
    adaptive_avg_pool2d_forward(g, x, y, ws);
    return y;
  } else {
    const auto x = autograd::detail::to_var(x_in, autograd::detail::graph_of(x_in));
    const adaptive_geometry g = adaptive_geometry_of(who, x.shape(), output_size);
    return record(x, std::make_unique<adaptive_avg_pool2d_node<T, K>>(x.id(), g), g.output_shape(),
                  var_format(x));
  }
}

}  // namespace tessera::nn::detail

namespace tessera::nn::functional {

/// torch.nn.functional.conv2d without a bias: x [N, C, H, W], weight [O, C / groups, KH, KW].
/// Throws shape_error naming the shapes (a 4-D input, C matching, groups dividing the channels,
/// the dilated kernel fitting the padded input), device_mismatch_error for operands on
/// different ordinals.
template <class X, class W>
auto conv2d(const X& x, const W& weight, const Conv2dArgs& args = {}) {
  return detail::conv2d_call<X, W, void>("conv2d", x, weight, nullptr, args);
}

/// torch.nn.functional.conv2d with a bias [O].
template <class X, class W, class B>
  requires(!std::is_same_v<std::remove_cvref_t<B>, Conv2dArgs>)
auto conv2d(const X& x, const W& weight, const B& bias, const Conv2dArgs& args = {}) {
  return detail::conv2d_call<X, W, B>("conv2d", x, weight, &bias, args);
}

/// torch.nn.functional.max_pool2d (padding with -inf; the gradient goes to the first maximum of
/// each window).
template <class X>
auto max_pool2d(const X& x, Int2 kernel_size, const MaxPool2dArgs& args = {}) {
  return detail::max_pool2d_call("max_pool2d", x, kernel_size, args);
}

/// torch.nn.functional.avg_pool2d.
template <class X>
auto avg_pool2d(const X& x, Int2 kernel_size, const AvgPool2dArgs& args = {}) {
  return detail::avg_pool2d_call("avg_pool2d", x, kernel_size, args);
}

/// torch.nn.functional.adaptive_avg_pool2d: output [N, C, output_size.h, output_size.w], each
/// cell the mean of rows [floor(i H / oh), ceil((i + 1) H / oh)) and likewise for columns.
template <class X>
auto adaptive_avg_pool2d(const X& x, Int2 output_size) {
  return detail::adaptive_avg_pool2d_call("adaptive_avg_pool2d", x, output_size);
}

/// relu(a + b) for a residual connection (ResNet's blocks). Traced, its backward masks the
/// gradient with the output, so neither summand is kept for it (relu(a + b) as an expression
/// keeps both). a and b: tensors, Vars or expressions of them, of one shape, dtype and device.
template <class A, class B>
auto add_relu(const A& a, const B& b) {
  using T = detail::value_of_t<A>;
  using K = detail::kind_of_t<A>;
  static_assert(std::is_same_v<detail::value_of_t<B>, T> && std::is_same_v<detail::kind_of_t<B>, K>,
                "add_relu: both operands need the same dtype and device kind");
  if constexpr (detail::is_eager_v<A> && detail::is_eager_v<B>) {
    return Tensor<T, K>(relu(a + b));
  } else {
    autograd::detail::graph* g = [&] {
      if constexpr (!detail::is_eager_v<A>) {
        return autograd::detail::graph_of(a);
      } else {
        return autograd::detail::graph_of(b);
      }
    }();
    const auto va = autograd::detail::to_var(a, g);
    const auto vb = autograd::detail::to_var(b, g);
    if (va.shape() != vb.shape()) {
      throw shape_error("add_relu: expected operands of one shape, got " + va.shape().str() +
                        " and " + vb.shape().str());
    }
    if (va.device() != vb.device()) {
      throw device_mismatch_error("add_relu: expected operands on one device, got " +
                                  va.device().str() + " and " + vb.device().str());
    }
    // channels_last when both summands are, as the expression's rule (eager).
    const memory_format format = detail::var_format(va) == memory_format::channels_last &&
                                         detail::var_format(vb) == memory_format::channels_last
                                     ? memory_format::channels_last
                                     : memory_format::contiguous_format;
    return detail::record(va, std::make_unique<detail::add_relu_node<T, K>>(va.id(), vb.id()),
                          va.shape(), format);
  }
}

}  // namespace tessera::nn::functional
