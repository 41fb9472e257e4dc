// The node of a fused elementwise expression of Vars (autograd/ops.hpp records it): its forward
// is one executor pass, and each input's gradient another, from the expression's compile-time
// derivative (autograd/derivative.hpp).
#pragma once

#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/detail/gradient.hpp"
#include "tessera/autograd/var.hpp"
#include "tessera/expr/assign.hpp"

namespace tessera::autograd::detail {

/// A fused elementwise expression: forward is one executor pass, each input's gradient another.
template <class T, class K, class E>
class fused_node final : public expression_backward_node {
 public:
  explicit fused_node(E e) : expression_(std::move(e)) { inputs = distinct_vars(expression_); }
  const char* name() const override { return "fused"; }
  // Out of the class (not inline): where the node's type is compiled in tessera::compiled
  // (an extern template), a unit that records it instantiates none of its kernels (nvcc's
  // front end instantiates a class's inline virtual functions even then).
  void trace_backward(graph* g);
  void forward(value_table& table) override;
  std::vector<int> inplace_candidates() const override {
    std::vector<int> ids;
    for_each_var(expression_, [&](const auto& var) {
      using L = std::remove_cvref_t<decltype(var)>;
      if (!var.is_grad() && sizeof(typename L::value_type) == sizeof(T) &&
          var.shape() == expression_.shape()) {
        ids.push_back(var.id());
      }
    });
    return ids;
  }
  void finalize(const std::vector<value_info>& values) override {
    expression_backward_node::finalize(values);
    // Each job is one elementwise pass reading the upstream gradient at the output's index.
    in_place_ = gradients_.move_in_place_job_last(expression_.shape(), sizeof(T));
  }
  bool backward_in_place() const override { return in_place_; }
  epilogue_form epilogue() const override { return epilogue_of(expression_); }

 private:
  template <class X>
  static constexpr bool is_value_var = std::is_same_v<X, Var<T, K>>;

  // `y + b`, `b + y` (b a row vector: [n] or [1, n] beside y's [m, n]), ReLU of either, or ReLU
  // of a value: what a product before this node may apply as its epilogue.
  template <class X>
  static epilogue_form epilogue_of(const X& e) {
    using tessera::detail::is_binary;
    using tessera::detail::is_unary;
    if constexpr (is_unary<X>::value) {
      if constexpr (std::is_same_v<typename is_unary<X>::op, ops::relu>) {
        using Operand = std::remove_cvref_t<decltype(e.operand)>;
        if constexpr (is_value_var<Operand>) {
          if (e.operand.dim() == 2) return {e.operand.id(), -1, true};
        } else {
          epilogue_form inner = epilogue_of(e.operand);
          if (inner.bias >= 0 && !inner.relu) {
            inner.relu = true;
            return inner;
          }
        }
      }
    } else if constexpr (is_binary<X>::value) {
      using L = std::remove_cvref_t<decltype(e.left)>;
      using R = std::remove_cvref_t<decltype(e.right)>;
      if constexpr (std::is_same_v<typename is_binary<X>::op, ops::add> && is_value_var<L> &&
                    is_value_var<R>) {
        auto row = [](const Shape& bias, const Shape& full) {
          return full.size() == 2 && ((bias.size() == 1 && bias[0] == full[1]) ||
                                      (bias.size() == 2 && bias[0] == 1 && bias[1] == full[1]));
        };
        const Shape& full = e.shape();
        if (e.left.shape() == full && row(e.right.shape(), full)) {
          return {e.left.id(), e.right.id(), false};
        }
        if (e.right.shape() == full && row(e.left.shape(), full)) {
          return {e.right.id(), e.left.id(), false};
        }
      }
    }
    return {};
  }

  // True when E is a function differentiated from its result (derivative.hpp) applied last to
  // an expression of the node's dtype (a cast in between keeps the usual rule).
  static constexpr bool from_result() {
    if constexpr (tessera::detail::is_unary<E>::value) {
      using Operand = std::remove_cvref_t<decltype(std::declval<E>().operand)>;
      return differentiated_from_result<typename tessera::detail::is_unary<E>::op> &&
             std::is_same_v<typename Operand::value_type, T>;
    } else {
      return false;
    }
  }

  E expression_;
  bool in_place_ = false;
};

template <class T, class K, class E>
void fused_node<T, K, E>::forward(value_table& table) {
  tessera::detail::run_expression(table.template get<T, K>(output), rebind(expression_, table));
}

template <class T, class K, class E>
void fused_node<T, K, E>::trace_backward(graph* g) {
  if constexpr (is_floating_point_v<T>) {
    const Var<T, K> upstream(g, output, expression_.shape(), true);
    if constexpr (from_result()) {
      // relu, sigmoid, tanh or exp applied last: its derivative from the node's own output
      // (PyTorch's rule), the rest of the expression from its inputs as usual.
      gradients_.build(expression_.operand,
                       result_gradient<typename tessera::detail::is_unary<E>::op>(
                           Var<T, K>(g, output, expression_.shape()), upstream));
    } else {
      gradients_.build(expression_, upstream);
    }
  }
}

}  // namespace tessera::autograd::detail
