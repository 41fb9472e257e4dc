// The operators and functions that build expressions: + - * / and unary -, comparisons (giving
// bool), exp log sqrt rsqrt abs sin cos tanh sigmoid relu, pow, maximum, minimum, where, cast<U>.
// Operands are tensors, expressions or numbers, at least one not a number; results broadcast
// (NumPy rules) and promote (PyTorch rules). Nothing is computed until assignment.
#pragma once

#include "tessera/expr/node.hpp"

namespace tessera {

namespace detail {
template <class X>
concept operand = any_expression<X> || scalar_operand<X>;

template <class A, class B>
concept binary_operands = operand<A> && operand<B> && (any_expression<A> || any_expression<B>);

template <class Op, class A, class B>
auto make_binary(const A& a, const B& b) {
  return binary_expr<Op, node_of<A>, node_of<B>>(a, b);
}
template <class Op, class A>
auto make_unary(const A& a) {
  return unary_expr<Op, node_of<A>>(a);
}
}  // namespace detail

#define TESSERA_BINARY_OPERATOR(symbol, functor)             \
  template <class A, class B>                                \
    requires detail::binary_operands<A, B>                   \
  auto operator symbol(const A& a, const B& b) {             \
    return detail::make_binary<ops::functor>(a, b);          \
  }
TESSERA_BINARY_OPERATOR(+, add)
TESSERA_BINARY_OPERATOR(-, subtract)
TESSERA_BINARY_OPERATOR(*, multiply)
TESSERA_BINARY_OPERATOR(/, divide)
TESSERA_BINARY_OPERATOR(<, less)
TESSERA_BINARY_OPERATOR(<=, less_equal)
TESSERA_BINARY_OPERATOR(>, greater)
TESSERA_BINARY_OPERATOR(>=, greater_equal)
TESSERA_BINARY_OPERATOR(==, equal)
TESSERA_BINARY_OPERATOR(!=, not_equal)
#undef TESSERA_BINARY_OPERATOR

#define TESSERA_BINARY_FUNCTION(name, functor)      \
  template <class A, class B>                       \
    requires detail::binary_operands<A, B>          \
  auto name(const A& a, const B& b) {               \
    return detail::make_binary<ops::functor>(a, b); \
  }
/// Elementwise a^b (pow(e, 2.0), pow(2.0, e) or pow(e1, e2)). An integer tensor raised to a
/// negative integer number throws tessera::error, as in PyTorch (a tensor of exponents gives
/// PyTorch's integer results: 1 and -1 keep a magnitude of 1, other bases give 0).
template <class A, class B>
  requires detail::binary_operands<A, B>
auto pow(const A& a, const B& b) {
  using Base = typename detail::node_of<A>::value_type;
  if constexpr (std::is_integral_v<B> && !std::is_same_v<B, bool> && std::is_integral_v<Base>) {
    if (b < 0) {
      throw error("pow: integers to negative integer powers are not allowed (exponent " +
                  std::to_string(b) + " for a base of dtype " + dtype_name<Base>() + ")");
    }
  }
  return detail::make_binary<ops::power>(a, b);
}
/// Elementwise maximum (NaN propagates).
TESSERA_BINARY_FUNCTION(maximum, maximum)
/// Elementwise minimum (NaN propagates).
TESSERA_BINARY_FUNCTION(minimum, minimum)
#undef TESSERA_BINARY_FUNCTION

template <class A>
  requires detail::any_expression<A>
auto operator-(const A& a) {
  static_assert(!std::is_same_v<typename detail::node_of<A>::value_type, bool>,
                "Tessera: negation, the '-' operator, on a bool tensor is not supported (as in "
                "PyTorch); use x == false for the logical negation");
  return detail::make_unary<ops::negate>(a);
}

#define TESSERA_UNARY_FUNCTION(name)               \
  template <class A>                               \
    requires detail::any_expression<A>             \
  auto name(const A& a) {                          \
    return detail::make_unary<ops::name>(a);       \
  }
TESSERA_UNARY_FUNCTION(exp)
TESSERA_UNARY_FUNCTION(log)
TESSERA_UNARY_FUNCTION(sqrt)
TESSERA_UNARY_FUNCTION(rsqrt)
TESSERA_UNARY_FUNCTION(abs)
TESSERA_UNARY_FUNCTION(sin)
TESSERA_UNARY_FUNCTION(cos)
TESSERA_UNARY_FUNCTION(tanh)
TESSERA_UNARY_FUNCTION(sigmoid)
TESSERA_UNARY_FUNCTION(relu)
#undef TESSERA_UNARY_FUNCTION

/// where(condition, a, b): a where condition holds, else b (all three broadcast; a and b may be
/// numbers).
template <class C, class A, class B>
  requires detail::any_expression<C> && detail::operand<A> && detail::operand<B>
auto where(const C& condition, const A& a, const B& b) {
  return where_expr<detail::node_of<C>, detail::node_of<A>, detail::node_of<B>>(condition, a, b);
}

/// cast<U>(e): e converted to dtype U (half/bfloat16 round to nearest even; bool is non-zero).
template <Dtype U, class A>
  requires detail::any_expression<A>
auto cast(const A& a) {
  return cast_expr<U, detail::node_of<A>>(a);
}

}  // namespace tessera
