// What a layer's forward computes on. Eager inputs are tensors or lazy expressions of tensors (a
// lazy input is evaluated once, in one pass, where a layer needs a tensor: matmul, views);
// anything else is symbolic (autograd Vars and their expressions) and passes through unchanged,
// so one forward body serves eager calls and tracing.
#pragma once

#include <type_traits>

#include "tessera/expr/assign.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn::detail {

/// True for a tensor or a lazy expression of tensors (eager values), false for symbolic ones.
template <class X>
inline constexpr bool is_eager_v = tessera::detail::is_tensor<std::remove_cvref_t<X>>::value ||
                                   tessera::detail::expression_node<std::remove_cvref_t<X>>;

/// `x` as a layer's operand: a lazy expression of tensors evaluated into a tensor, everything
/// else (tensors, symbolic values) as it is.
template <class X>
decltype(auto) materialize(const X& x) {
  if constexpr (tessera::detail::expression_node<X>) {
    return tessera::eval(x);
  } else {
    return (x);
  }
}

/// The tensor type a lazy expression of tensors evaluates to (the tensor itself for a tensor).
template <class X>
using eager_tensor_t = std::remove_cvref_t<decltype(materialize(std::declval<const X&>()))>;

}  // namespace tessera::nn::detail
