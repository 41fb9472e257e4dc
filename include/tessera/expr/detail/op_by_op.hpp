// Evaluating an expression one operation at a time. A unit that cannot compile kernels (g++)
// but links tessera::compiled built with CUDA evaluates any expression on CUDA tensors this way:
// each step is a *primitive*, one functor applied to tensors of one dtype (or to a tensor and a
// number), which the library runs with a kernel of its own; the values between steps go to
// temporary tensors. The result is PyTorch's eager one (each intermediate rounded to its dtype);
// a unit compiled by nvcc fuses the whole expression into one kernel instead.
//
// The decomposition is written for any device kind and any way of running a primitive, so the
// CPU tests check it against the fused evaluation (tests/expr/op_by_op_test.cpp).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "tessera/backend/cpu/reduce.hpp"
#include "tessera/expr/detail/merged_operands.hpp"
#include "tessera/expr/node.hpp"
#include "tessera/tensor/detail/copy.hpp"

namespace tessera::detail::op_by_op {

template <class... Ts>
struct type_list {};

template <class T, class List>
inline constexpr bool contains_v = false;
template <class T, class... Ts>
inline constexpr bool contains_v<T, type_list<Ts...>> = (std::is_same_v<T, Ts> || ...);

// ---- the primitives --------------------------------------------------------------------------
//
// For a dtype P on device kind K, the primitives are (L = tensor_leaf<P, K>, S = a number held as
// opmath_t<P>, scalar_leaf<S>):
//   unary_expr<Op, L>                      Op a unary functor allowed for P;
//   binary_expr<Op, L, L>, <Op, L, S>      Op a binary functor allowed for P;
//   binary_expr<Op, S, L>                  the same for the non-commutative subtract, divide,
//                                          power (a comparison with the number first is turned
//                                          around: 2 < x is x > 2);
//   where_expr<tensor_leaf<bool, K>, X, Y> X and Y each L or S.
// Casts and copies are not primitives: they are tensor/detail/copy.hpp's convert_on_device.

using floating_dtypes = type_list<float, double, half, bfloat16>;
// int8 and int16 are left out (a g++ unit's expressions on them need nvcc): each integer dtype
// adds 35 primitives, two kernels each, to the library's build.
using integer_dtypes = type_list<std::int64_t, std::int32_t, std::uint8_t>;
using floating_unary_ops =
    type_list<ops::negate, ops::exp, ops::log, ops::sqrt, ops::rsqrt, ops::abs, ops::sin, ops::cos,
              ops::tanh, ops::sigmoid, ops::relu>;
using integer_unary_ops = type_list<ops::negate, ops::abs, ops::relu>;
using binary_ops = type_list<ops::add, ops::subtract, ops::multiply, ops::divide, ops::less,
                             ops::less_equal, ops::greater, ops::greater_equal, ops::equal,
                             ops::not_equal, ops::maximum, ops::minimum, ops::power>;
/// bool: every binary functor but subtract (which PyTorch refuses for bool too).
using bool_binary_ops = type_list<ops::add, ops::multiply, ops::divide, ops::less, ops::less_equal,
                                  ops::greater, ops::greater_equal, ops::equal, ops::not_equal,
                                  ops::maximum, ops::minimum, ops::power>;
/// Binary functors that need their number-first form (the others commute or turn around).
using number_first_ops = type_list<ops::subtract, ops::divide, ops::power>;

template <class P>
inline constexpr bool floating_dtype_v = contains_v<P, floating_dtypes>;
template <class P>
inline constexpr bool integer_dtype_v = contains_v<P, integer_dtypes>;

template <class P>
inline constexpr bool primitive_dtype_v =
    floating_dtype_v<P> || integer_dtype_v<P> || std::is_same_v<P, bool>;
template <class Op, class P>
inline constexpr bool unary_allowed_v = floating_dtype_v<P>  ? contains_v<Op, floating_unary_ops>
                                        : integer_dtype_v<P> ? contains_v<Op, integer_unary_ops>
                                                             : false;
template <class Op, class P>
inline constexpr bool binary_allowed_v = std::is_same_v<P, bool> ? contains_v<Op, bool_binary_ops>
                                         : primitive_dtype_v<P>  ? contains_v<Op, binary_ops>
                                                                 : false;

/// The number operand of a primitive of dtype P.
template <class P>
using number_of = scalar_leaf<opmath_t<P>>;

/// The comparison that gives the same answer with its operands swapped (x > 2 for 2 < x).
template <class Op>
struct swapped {
  using type = Op;  // add, multiply, equal, not_equal, maximum, minimum commute
};
template <>
struct swapped<ops::less> {
  using type = ops::greater;
};
template <>
struct swapped<ops::greater> {
  using type = ops::less;
};
template <>
struct swapped<ops::less_equal> {
  using type = ops::greater_equal;
};
template <>
struct swapped<ops::greater_equal> {
  using type = ops::less_equal;
};

/// True when E is a primitive (above) for device kind K.
template <class E, class K>
struct is_primitive : std::false_type {};
template <class Op, class P, class K>
struct is_primitive<unary_expr<Op, tensor_leaf<P, K>>, K>
    : std::bool_constant<unary_allowed_v<Op, P>> {};
template <class Op, class P, class K>
struct is_primitive<binary_expr<Op, tensor_leaf<P, K>, tensor_leaf<P, K>>, K>
    : std::bool_constant<binary_allowed_v<Op, P>> {};
template <class Op, class P, class K>
struct is_primitive<binary_expr<Op, tensor_leaf<P, K>, number_of<P>>, K>
    : std::bool_constant<binary_allowed_v<Op, P>> {};
template <class Op, class P, class K>
struct is_primitive<binary_expr<Op, number_of<P>, tensor_leaf<P, K>>, K>
    : std::bool_constant<binary_allowed_v<Op, P> && contains_v<Op, number_first_ops>> {};
template <class X, class Y, class K>
struct is_primitive<where_expr<tensor_leaf<bool, K>, X, Y>, K> {
  using P = typename where_expr<tensor_leaf<bool, K>, X, Y>::value_type;
  template <class V>
  static constexpr bool operand =
      std::is_same_v<V, tensor_leaf<P, K>> || std::is_same_v<V, number_of<P>>;
  static constexpr bool value = primitive_dtype_v<P> && operand<X> && operand<Y>;
};
template <class E, class K>
inline constexpr bool is_primitive_v = is_primitive<E, K>::value;

// ---- reductions ------------------------------------------------------------------------------
//
// A reduction of a tensor of dtype V is a primitive when its operator, finish and output are one
// of ts::sum's, mean's, max's, min's, argmax's or argmin's for V; softmax and log_softmax of a
// floating V are.

template <class Op, class Finish, class Out, class V>
inline constexpr bool reduction_allowed_v = [] {
  using compute = opmath_t<V>;
  if constexpr (!primitive_dtype_v<V>) {
    return false;
  } else if constexpr (std::is_same_v<Op, backend::sum_op<accumulate_t<V>>>) {
    if constexpr (std::is_same_v<Finish, backend::finish_mean>) {
      return floating_dtype_v<V> && std::is_same_v<Out, V>;
    } else {
      return std::is_same_v<Finish, backend::finish_value> &&
             std::is_same_v<Out, std::conditional_t<is_floating_point_v<V>, V, std::int64_t>>;
    }
  } else if constexpr (std::is_same_v<Op, backend::max_op<compute>> ||
                       std::is_same_v<Op, backend::min_op<compute>>) {
    return std::is_same_v<Finish, backend::finish_value> && std::is_same_v<Out, V>;
  } else if constexpr (std::is_same_v<Op, backend::arg_op<compute, true>> ||
                       std::is_same_v<Op, backend::arg_op<compute, false>>) {
    return std::is_same_v<Finish, backend::finish_index> && std::is_same_v<Out, std::int64_t>;
  } else {
    return false;
  }
}();

// ---- decomposition ---------------------------------------------------------------------------

template <class N>
inline constexpr bool is_leaf_v = false;
template <class T, class K>
inline constexpr bool is_leaf_v<tensor_leaf<T, K>> = true;
template <class S>
inline constexpr bool is_leaf_v<scalar_leaf<S>> = true;

template <class N>
inline constexpr bool is_number_v = false;
template <class S>
inline constexpr bool is_number_v<scalar_leaf<S>> = true;

/// A node without tensors (numbers combined), computed on the host as a number of its dtype's
/// compute type.
template <class N>
auto host_value(const N& node) {
  int next = 0;
  const auto evaluator = node.evaluator(nullptr, 0, next);
  return scalar_leaf<opmath_t<typename N::value_type>>{
      static_cast<opmath_t<typename N::value_type>>(
          backend::store_cast<typename N::value_type>(evaluator.get(backend::linear_access{0})))};
}

template <class K, class Run, class T, class N>
void evaluate(const Tensor<T, K>& out, const N& node, Run& run);

/// The value of `node` as a leaf: a tensor or a number as it is, a node without tensors as a
/// number, any other node evaluated into a new tensor of its dtype.
template <class K, class Run, class N>
auto leaf_of(const N& node, Run& run) {
  if constexpr (is_leaf_v<N>) {
    return node;
  } else if constexpr (std::is_same_v<typename N::device_kind, any_kind>) {
    return host_value(node);
  } else {
    using V = typename N::value_type;
    auto value = Tensor<V, K>::empty_on(node.shape(), device_of(node, "evaluate"));
    evaluate(value, node, run);
    return tensor_leaf<V, K>{std::move(value)};
  }
}

/// `leaf` as an operand of dtype P: a tensor converted to P (a new tensor unless it is P
/// already), a number converted to opmath_t<P>.
template <class P, class K, class L>
auto as_operand(const L& leaf) {
  if constexpr (is_number_v<L>) {
    return number_of<P>{static_cast<opmath_t<P>>(leaf.value)};
  } else if constexpr (std::is_same_v<typename L::value_type, P>) {
    return leaf;
  } else {
    const auto& from = leaf.tensor;
    auto converted = Tensor<P, K>::empty_on(from.shape(), from.device());
    convert_on_device(
        strided_ref<P>{converted.data(), converted.device(), converted.strides()},
        strided_ref<const typename L::value_type>{from.data(), from.device(), from.strides()},
        from.shape());
    return tensor_leaf<P, K>{std::move(converted)};
  }
}

/// out = leaf (converted to T, broadcast to out's shape).
template <class T, class K, class L>
void store_leaf(const Tensor<T, K>& out, const L& leaf) {
  if constexpr (is_number_v<L>) {
    fill_strided(strided_ref<T>{out.data(), out.device(), out.strides()}, out.shape(),
                 backend::store_cast<T>(leaf.value));
  } else {
    using V = typename L::value_type;
    const Strides strides =
        expand_strides(leaf.tensor.shape(), leaf.tensor.strides(), out.shape(), "evaluate");
    convert_on_device(strided_ref<T>{out.data(), out.device(), out.strides()},
                      strided_ref<const V>{leaf.tensor.data(), leaf.tensor.device(), strides},
                      out.shape());
  }
}

/// Runs primitive `p` into `out`: straight in when out has p's dtype, else through a tensor of
/// p's dtype converted into out.
template <class K, class Run, class T, class E>
void run_into(const Tensor<T, K>& out, const E& p, Run& run) {
  static_assert(is_primitive_v<E, K>,
                "Tessera: a step of an expression evaluated one operation at a time is not one of "
                "the compiled library's primitives (expr/detail/op_by_op.hpp)");
  using V = typename E::value_type;
  if constexpr (std::is_same_v<V, T>) {
    run(out, p);
  } else {
    auto value = Tensor<V, K>::empty_on(p.shape(), out.device());
    run(value, p);
    store_leaf(out, tensor_leaf<V, K>{std::move(value)});
  }
}

template <class Op, class A, class B, class P, class K, class Run, class T>
void run_binary(const Tensor<T, K>& out, const A& a, const B& b, Run& run) {
  if constexpr (is_number_v<A> && !contains_v<Op, number_first_ops>) {
    run_into(out, binary_expr<typename swapped<Op>::type, B, A>(b, a), run);
  } else {
    run_into(out, binary_expr<Op, A, B>(a, b), run);
  }
}

/// out = node (out's shape is node's, or one it broadcasts to), one primitive at a time. `run(t,
/// p)` runs primitive p into tensor t of p's dtype and shape.
template <class K, class Run, class T, class N>
void evaluate(const Tensor<T, K>& out, const N& node, Run& run) {
  if constexpr (is_leaf_v<N>) {
    store_leaf(out, node);
  } else if constexpr (is_cast<N>::value) {
    // cast<U>(a): a's value rounded through U, then converted to out's dtype (one conversion
    // when that is U).
    using U = typename N::value_type;
    const auto a = leaf_of<K>(node.operand, run);
    if constexpr (std::is_same_v<U, T> && !is_number_v<decltype(a)>) {
      store_leaf(out, a);
    } else {
      store_leaf(out, as_operand<U, K>(a));
    }
  } else if constexpr (is_unary<N>::value) {
    using Op = typename is_unary<N>::op;
    const auto a = leaf_of<K>(node.operand, run);
    using P = typename std::remove_cvref_t<decltype(node.operand)>::value_type;
    if constexpr (is_number_v<decltype(a)>) {
      store_leaf(out, host_value(unary_expr<Op, number_of<P>>(as_operand<P, K>(a))));
    } else {
      run_into(out, unary_expr<Op, tensor_leaf<P, K>>(as_operand<P, K>(a)), run);
    }
  } else if constexpr (is_binary<N>::value) {
    using Op = typename is_binary<N>::op;
    using P = typename N::promoted_type;
    const auto a = as_operand<P, K>(leaf_of<K>(node.left, run));
    const auto b = as_operand<P, K>(leaf_of<K>(node.right, run));
    run_binary<Op, std::remove_cvref_t<decltype(a)>, std::remove_cvref_t<decltype(b)>, P>(out, a, b,
                                                                                          run);
  } else {
    static_assert(is_where<N>::value, "Tessera: an expression node of an unknown kind");
    using P = typename N::value_type;
    const auto c = leaf_of<K>(node.condition, run);
    const auto a = as_operand<P, K>(leaf_of<K>(node.left, run));
    const auto b = as_operand<P, K>(leaf_of<K>(node.right, run));
    if constexpr (is_number_v<decltype(c)>) {
      // A number as the condition picks one operand everywhere (broadcast to out's shape).
      if (backend::store_cast<bool>(c.value)) {
        store_leaf(out, a);
      } else {
        store_leaf(out, b);
      }
    } else {
      const auto condition = as_operand<bool, K>(c);
      run_into(out,
               where_expr<tensor_leaf<bool, K>, std::remove_cvref_t<decltype(a)>,
                          std::remove_cvref_t<decltype(b)>>(condition, a, b),
               run);
    }
  }
}

}  // namespace tessera::detail::op_by_op

namespace tessera::detail::op_by_op {

// ---- reductions of expressions ---------------------------------------------------------------

/// The output dtype of the primitive reduction (Op, Finish) of V (its ts:: function's).
template <class Op, class Finish, class V>
using reduction_output_t = std::conditional_t<
    std::is_same_v<Finish, backend::finish_index>, std::int64_t,
    std::conditional_t<std::is_same_v<Finish, backend::finish_value> &&
                           std::is_same_v<Op, backend::sum_op<accumulate_t<V>>>,
                       std::conditional_t<is_floating_point_v<V>, V, std::int64_t>, V>>;

/// A reduction (Op, Finish) of `node` into `out`: the node evaluated one operation at a time into
/// a tensor of its dtype V (what a fused reduction reads: the values a tensor of V would hold),
/// then `reduce(t, leaf)` runs the primitive reduction of that tensor into t, a tensor of the
/// primitive's output dtype (out itself when it has that dtype).
template <class Op, class Finish, class K, class Run, class Reduce, class Out, class N>
void reduce(const Tensor<Out, K>& out, const N& node, Run& run, Reduce& reduce_leaf) {
  using V = typename N::value_type;
  using R = reduction_output_t<Op, Finish, V>;
  static_assert(reduction_allowed_v<Op, Finish, R, V>,
                "Tessera: this reduction is not one of the compiled library's primitives "
                "(expr/detail/op_by_op.hpp)");
  const auto leaf = leaf_of<K>(node, run);
  static_assert(!is_number_v<std::remove_cvref_t<decltype(leaf)>>,
                "Tessera: a reduction of an expression without tensors");
  if constexpr (std::is_same_v<R, Out>) {
    reduce_leaf(out, leaf);
  } else {
    auto value = Tensor<R, K>::empty_on(out.shape(), out.device());
    reduce_leaf(value, leaf);
    store_leaf(out, tensor_leaf<R, K>{std::move(value)});
  }
}

/// softmax (or log_softmax) of `node` into `out` (of floating_of<V>): the node evaluated into a
/// tensor of out's dtype, then `softmax(out, leaf)`, the primitive of a floating tensor.
template <class K, class Run, class Softmax, class F, class N>
void softmax(const Tensor<F, K>& out, const N& node, Run& run, Softmax& softmax_leaf) {
  using V = typename N::value_type;
  static_assert(floating_dtype_v<F>, "Tessera: softmax into a non-floating tensor");
  if constexpr (std::is_same_v<V, F>) {
    softmax_leaf(out, leaf_of<K>(node, run));
  } else {
    // An integer or bool input: its values as F (exact where F holds them, as the fused read).
    auto value = Tensor<F, K>::empty_on(node.shape(), out.device());
    evaluate(value, node, run);
    softmax_leaf(out, tensor_leaf<F, K>{std::move(value)});
  }
}

}  // namespace tessera::detail::op_by_op

namespace tessera::detail::op_by_op {

// ---- the list ----------------------------------------------------------------------------------

/// Calls, for every primitive on device kind K: visit.template elementwise<E>() for each
/// elementwise primitive E, visit.template reduction<Op, Finish, Out, V>() for each reduction of a
/// tensor of V, and visit.template softmax<Log, F>() for softmax and log_softmax of a tensor of F.
/// tessera::compiled instantiates what it visits; the CPU tests run it.
template <class K, class Visit>
void for_each_primitive(Visit& visit);

template <class K, class P, class Op, class Visit>
void visit_unary_op(Visit& visit) {
  if constexpr (unary_allowed_v<Op, P>)
    visit.template elementwise<unary_expr<Op, tensor_leaf<P, K>>>();
}

template <class K, class P, class Visit, class... Ops>
void visit_unary(Visit& visit, type_list<Ops...>) {
  (visit_unary_op<K, P, Ops>(visit), ...);
}

template <class K, class P, class Op, class Visit>
void visit_binary_op(Visit& visit) {
  if constexpr (binary_allowed_v<Op, P>) {
    using L = tensor_leaf<P, K>;
    using S = number_of<P>;
    visit.template elementwise<binary_expr<Op, L, L>>();
    visit.template elementwise<binary_expr<Op, L, S>>();
    if constexpr (contains_v<Op, number_first_ops>) {
      visit.template elementwise<binary_expr<Op, S, L>>();
    }
  }
}

template <class K, class P, class Visit, class... Ops>
void visit_binary(Visit& visit, type_list<Ops...>) {
  (visit_binary_op<K, P, Ops>(visit), ...);
}

template <class K, class P, class Visit>
void visit_dtype(Visit& visit) {
  using L = tensor_leaf<P, K>;
  using S = number_of<P>;
  using C = tensor_leaf<bool, K>;
  visit_unary<K, P>(visit, floating_unary_ops{});
  visit_binary<K, P>(visit, binary_ops{});
  visit.template elementwise<where_expr<C, L, L>>();
  visit.template elementwise<where_expr<C, L, S>>();
  visit.template elementwise<where_expr<C, S, L>>();
  if constexpr (std::is_same_v<typename where_expr<C, S, S>::value_type, P>) {
    // Two numbers give bool, int64 or float32 (PyTorch's default dtypes) only.
    visit.template elementwise<where_expr<C, S, S>>();
  }
  using sum = backend::sum_op<accumulate_t<P>>;
  using compute = opmath_t<P>;
  visit.template reduction<sum, backend::finish_value,
                           reduction_output_t<sum, backend::finish_value, P>, P>();
  if constexpr (floating_dtype_v<P>) {
    visit.template reduction<sum, backend::finish_mean, P, P>();
    visit.template softmax<false, P>();
    visit.template softmax<true, P>();
  }
  visit.template reduction<backend::max_op<compute>, backend::finish_value, P, P>();
  visit.template reduction<backend::min_op<compute>, backend::finish_value, P, P>();
  visit
      .template reduction<backend::arg_op<compute, true>, backend::finish_index, std::int64_t, P>();
  visit.template reduction<backend::arg_op<compute, false>, backend::finish_index, std::int64_t,
                           P>();
}

template <class K, class Visit, class... Ps>
void visit_dtypes(Visit& visit, type_list<Ps...>) {
  (visit_dtype<K, Ps>(visit), ...);
}

template <class K, class Visit>
void for_each_primitive(Visit& visit) {
  visit_dtypes<K>(visit, floating_dtypes{});
  visit_dtypes<K>(visit, integer_dtypes{});
  visit_dtype<K, bool>(visit);
}

}  // namespace tessera::detail::op_by_op
