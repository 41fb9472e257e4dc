// Compile-time derivatives of elementwise expressions. backprop(e, g, emit) walks the expression
// tree of `e` from the root, carrying the upstream gradient `g` (itself an expression), and at
// every Var leaf calls emit(leaf, gradient expression): the chain rule unrolled into expression
// types, so each leaf's gradient is one fused kernel that recomputes what it needs from the
// expression's inputs (nothing in between is stored). rebind() turns a symbolic expression into
// the same expression over the run-time tensors of its Vars, for the ordinary executor.
#pragma once

#include <type_traits>
#include <vector>

#include "tessera/autograd/var.hpp"
#include "tessera/expr/operators.hpp"

namespace tessera::autograd::detail {

using tessera::binary_expr;
using tessera::unary_expr;
using tessera::where_expr;
using tessera::detail::scalar_leaf;
using tessera::detail::tensor_leaf;

using tessera::detail::is_binary;
using tessera::detail::is_cast;
using tessera::detail::is_unary;
using tessera::detail::is_where;

/// True when a Var of floating dtype (a possible gradient target) is a leaf of E.
template <class E>
constexpr bool has_float_var() {
  if constexpr (is_var<E>::value) {
    return is_floating_point_v<typename E::value_type>;
  } else if constexpr (is_unary<E>::value) {
    return has_float_var<std::remove_cvref_t<decltype(std::declval<E>().operand)>>();
  } else if constexpr (is_binary<E>::value) {
    return has_float_var<std::remove_cvref_t<decltype(std::declval<E>().left)>>() ||
           has_float_var<std::remove_cvref_t<decltype(std::declval<E>().right)>>();
  } else if constexpr (is_where<E>::value) {
    return has_float_var<std::remove_cvref_t<decltype(std::declval<E>().left)>>() ||
           has_float_var<std::remove_cvref_t<decltype(std::declval<E>().right)>>();
  } else {
    return false;
  }
}

/// Calls fn(var) for every Var leaf of `e`, left to right.
template <class E, class Fn>
void for_each_var(const E& e, Fn&& fn) {
  if constexpr (is_var<E>::value) {
    fn(e);
  } else if constexpr (is_unary<E>::value) {
    for_each_var(e.operand, fn);
  } else if constexpr (is_binary<E>::value) {
    for_each_var(e.left, fn);
    for_each_var(e.right, fn);
  } else if constexpr (is_where<E>::value) {
    for_each_var(e.condition, fn);
    for_each_var(e.left, fn);
    for_each_var(e.right, fn);
  }
}

/// `e` with every Var leaf replaced by a tensor leaf over the value's (or gradient's) run-time
/// tensor from `table`.
template <class E>
auto rebind(const E& e, const value_table& table) {
  if constexpr (is_var<E>::value) {
    using T = typename E::value_type;
    using K = typename E::device_kind;
    return tensor_leaf<T, K>{table.template get<T, K>(e.id(), e.shape(), e.is_grad())};
  } else if constexpr (is_unary<E>::value) {
    auto operand = rebind(e.operand, table);
    return unary_expr<typename is_unary<E>::op, decltype(operand)>(std::move(operand));
  } else if constexpr (is_binary<E>::value) {
    auto left = rebind(e.left, table);
    auto right = rebind(e.right, table);
    return binary_expr<typename is_binary<E>::op, decltype(left), decltype(right)>(
        std::move(left), std::move(right));
  } else if constexpr (is_where<E>::value) {
    auto condition = rebind(e.condition, table);
    auto left = rebind(e.left, table);
    auto right = rebind(e.right, table);
    return where_expr<decltype(condition), decltype(left), decltype(right)>(
        std::move(condition), std::move(left), std::move(right));
  } else {
    return e;  // tensor and scalar leaves
  }
}

// ---- building derivative expressions (operands are nodes already) -----------------------------

template <class Op, class A, class B>
auto bin(const A& a, const B& b) {
  return binary_expr<Op, A, B>(a, b);
}
template <class Op, class A>
auto un(const A& a) {
  return unary_expr<Op, A>(a);
}
inline scalar_leaf<double> lit(double value) { return scalar_leaf<double>{value}; }
template <class C, class A, class B>
auto select(const C& c, const A& a, const B& b) {
  return where_expr<C, A, B>(c, a, b);
}

template <class E, class G, class Emit>
void backprop(const E& e, const G& g, Emit& emit);

/// g times the derivative of Op at a.
template <class Op, class A, class G>
auto unary_gradient(const A& a, const G& g) {
  if constexpr (std::is_same_v<Op, ops::negate>) {
    return un<ops::negate>(g);
  } else if constexpr (std::is_same_v<Op, ops::exp>) {
    return bin<ops::multiply>(g, un<ops::exp>(a));
  } else if constexpr (std::is_same_v<Op, ops::log>) {
    return bin<ops::divide>(g, a);
  } else if constexpr (std::is_same_v<Op, ops::sqrt>) {
    return bin<ops::divide>(g, bin<ops::multiply>(lit(2.0), un<ops::sqrt>(a)));
  } else if constexpr (std::is_same_v<Op, ops::rsqrt>) {
    // d/da a^-1/2 = -1/2 a^-3/2 = -1/2 rsqrt(a) / a
    return bin<ops::multiply>(g, bin<ops::multiply>(lit(-0.5), bin<ops::divide>(un<ops::rsqrt>(a), a)));
  } else if constexpr (std::is_same_v<Op, ops::sin>) {
    return bin<ops::multiply>(g, un<ops::cos>(a));
  } else if constexpr (std::is_same_v<Op, ops::cos>) {
    return bin<ops::multiply>(g, un<ops::negate>(un<ops::sin>(a)));
  } else if constexpr (std::is_same_v<Op, ops::tanh>) {
    const auto t = un<ops::tanh>(a);
    return bin<ops::multiply>(g, bin<ops::subtract>(lit(1.0), bin<ops::multiply>(t, t)));
  } else if constexpr (std::is_same_v<Op, ops::sigmoid>) {
    const auto s = un<ops::sigmoid>(a);
    return bin<ops::multiply>(g, bin<ops::multiply>(s, bin<ops::subtract>(lit(1.0), s)));
  } else if constexpr (std::is_same_v<Op, ops::relu>) {
    // PyTorch's threshold_backward: zero where the input is not positive.
    return select(bin<ops::greater>(a, lit(0.0)), g, lit(0.0));
  } else if constexpr (std::is_same_v<Op, ops::abs>) {
    // sign(a) * g, with sign(0) = 0 as torch.sgn.
    return select(bin<ops::greater>(a, lit(0.0)), g,
                  select(bin<ops::less>(a, lit(0.0)), un<ops::negate>(g), lit(0.0)));
  } else {
    static_assert(std::is_same_v<Op, void>, "autograd: no derivative rule for this function");
  }
}

/// True for the functions PyTorch differentiates from their result (relu's threshold_backward,
/// sigmoid_backward, tanh_backward, exp's): a fused node whose expression is one of them applied
/// last reads its own output in backward instead of recomputing the function from its inputs, so
/// the inputs need not outlive the forward (Linear -> ReLU keeps the ReLU's output, which the next
/// product keeps anyway, and not the pre-activation beside it).
template <class Op>
inline constexpr bool differentiated_from_result =
    std::is_same_v<Op, ops::relu> || std::is_same_v<Op, ops::sigmoid> ||
    std::is_same_v<Op, ops::tanh> || std::is_same_v<Op, ops::exp>;

/// g times the derivative of Op written with its result y (differentiated_from_result).
template <class Op, class Y, class G>
auto result_gradient(const Y& y, const G& g) {
  if constexpr (std::is_same_v<Op, ops::relu>) {
    // Zero where the result is not positive: where the input is not (relu keeps NaN).
    return select(bin<ops::greater>(y, lit(0.0)), g, lit(0.0));
  } else if constexpr (std::is_same_v<Op, ops::sigmoid>) {
    return bin<ops::multiply>(g, bin<ops::multiply>(y, bin<ops::subtract>(lit(1.0), y)));
  } else if constexpr (std::is_same_v<Op, ops::tanh>) {
    return bin<ops::multiply>(g, bin<ops::subtract>(lit(1.0), bin<ops::multiply>(y, y)));
  } else {
    static_assert(std::is_same_v<Op, ops::exp>);
    return bin<ops::multiply>(g, y);
  }
}

template <class Op, class L, class R, class G, class Emit>
void binary_backprop(const L& l, const R& r, const G& g, Emit& emit) {
  constexpr bool left = has_float_var<L>();
  constexpr bool right = has_float_var<R>();
  if constexpr (std::is_same_v<Op, ops::add>) {
    if constexpr (left) backprop(l, g, emit);
    if constexpr (right) backprop(r, g, emit);
  } else if constexpr (std::is_same_v<Op, ops::subtract>) {
    if constexpr (left) backprop(l, g, emit);
    if constexpr (right) backprop(r, un<ops::negate>(g), emit);
  } else if constexpr (std::is_same_v<Op, ops::multiply>) {
    if constexpr (left) backprop(l, bin<ops::multiply>(g, r), emit);
    if constexpr (right) backprop(r, bin<ops::multiply>(g, l), emit);
  } else if constexpr (std::is_same_v<Op, ops::divide>) {
    if constexpr (left) backprop(l, bin<ops::divide>(g, r), emit);
    if constexpr (right) {
      backprop(r, un<ops::negate>(bin<ops::divide>(bin<ops::multiply>(g, l), bin<ops::multiply>(r, r))),
               emit);
    }
  } else if constexpr (std::is_same_v<Op, ops::power>) {
    // PyTorch's pow_backward: zero where the exponent is 0; pow_backward_exponent: zero where
    // the base is 0 and the exponent is not negative.
    if constexpr (left) {
      backprop(l,
               select(bin<ops::equal>(r, lit(0.0)), lit(0.0),
                      bin<ops::multiply>(
                          g, bin<ops::multiply>(
                                 r, bin<ops::power>(l, bin<ops::subtract>(r, lit(1.0)))))),
               emit);
    }
    if constexpr (right) {
      backprop(r,
               select(bin<ops::multiply>(bin<ops::equal>(l, lit(0.0)),
                                         bin<ops::greater_equal>(r, lit(0.0))),
                      lit(0.0),
                      bin<ops::multiply>(g, bin<ops::multiply>(bin<ops::power>(l, r),
                                                               un<ops::log>(l)))),
               emit);
    }
  } else if constexpr (std::is_same_v<Op, ops::maximum> || std::is_same_v<Op, ops::minimum>) {
    // The larger (smaller) operand gets the gradient; ties split it evenly, as PyTorch.
    using wins = std::conditional_t<std::is_same_v<Op, ops::maximum>, ops::greater, ops::less>;
    const auto half = bin<ops::multiply>(g, lit(0.5));
    if constexpr (left) {
      backprop(l, select(bin<ops::equal>(l, r), half, select(bin<wins>(l, r), g, lit(0.0))), emit);
    }
    if constexpr (right) {
      backprop(r, select(bin<ops::equal>(l, r), half, select(bin<wins>(r, l), g, lit(0.0))), emit);
    }
  }
  // Comparisons: no gradient (their result is bool).
}

template <class E, class G, class Emit>
void backprop(const E& e, const G& g, Emit& emit) {
  if constexpr (!has_float_var<E>()) {
    return;
  } else if constexpr (is_var<E>::value) {
    emit(e, g);
  } else if constexpr (is_cast<E>::value) {
    // A cast to a floating dtype passes the gradient through (converted where it is stored);
    // a cast to an integer or bool cuts it, as in PyTorch.
    if constexpr (is_floating_point_v<typename is_cast<E>::target>) backprop(e.operand, g, emit);
  } else if constexpr (is_unary<E>::value) {
    backprop(e.operand, unary_gradient<typename is_unary<E>::op>(e.operand, g), emit);
  } else if constexpr (is_binary<E>::value) {
    binary_backprop<typename is_binary<E>::op>(e.left, e.right, g, emit);
  } else if constexpr (is_where<E>::value) {
    if constexpr (has_float_var<std::remove_cvref_t<decltype(e.left)>>()) {
      backprop(e.left, select(e.condition, g, lit(0.0)), emit);
    }
    if constexpr (has_float_var<std::remove_cvref_t<decltype(e.right)>>()) {
      backprop(e.right, select(e.condition, lit(0.0), g), emit);
    }
  }
}

}  // namespace tessera::autograd::detail
