// Lazy expression nodes. `a * 2 + b` builds a tree of these; nothing runs until the tree is
// assigned (expr/assign.hpp), which happens in one executor pass. Nodes hold their operands by
// value (tensors are handles), so an expression never dangles. Each node knows at compile time its
// dtype (PyTorch's promotion) and device kind, and checks at construction that its operands
// broadcast and live on one device, so errors point at the statement that caused them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/backend/evaluator.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/promotion.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/expr/functors.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera {

/// The device kind of an operand that fits any device (a scalar).
struct any_kind {};

namespace detail {

// ---- operand kinds --------------------------------------------------------------------------

/// A C++ number usable as a scalar operand ("wrapped number" in PyTorch's promotion).
template <class S>
concept scalar_operand = std::is_arithmetic_v<S> || std::is_same_v<S, half> ||
                         std::is_same_v<S, bfloat16>;

template <class E>
concept node_type = requires { typename E::expression_node_tag; };  // leaves included

/// The common device kind of two operands. Mixing cpu and cuda is a compile error.
template <class KA, class KB>
struct common_kind {
  static_assert(std::is_same_v<KA, KB>,
                "Tessera: an expression mixes a tensor on the cpu with a tensor on cuda. Move one "
                "operand first, e.g. x.to<tessera::cuda>(i) or x.to<tessera::cpu>(i), so that every "
                "operand of the expression is on the same kind of device.");
  using type = KA;
};
template <class K>
struct common_kind<any_kind, K> {
  using type = K;
};
template <class K>
struct common_kind<K, any_kind> {
  using type = K;
};
template <>
struct common_kind<any_kind, any_kind> {
  using type = any_kind;
};

/// merge_device's error, out of line.
[[noreturn, gnu::cold]] TESSERA_API void throw_devices_differ(Device first, Device second,
                                                              const char* operation);
#if TESSERA_DEFINITIONS
TESSERA_API void throw_devices_differ(Device first, Device second, const char* operation) {
  throw device_mismatch_error(std::string(operation) + ": operands are on different devices, " +
                              first.str() + " and " + second.str());
}
#endif  // TESSERA_DEFINITIONS

/// Records `mine` as the expression's device in `device`, or throws device_mismatch_error naming
/// both when another leaf already put a different one there.
inline void merge_device(std::optional<Device>& device, Device mine, const char* operation) {
  if (!device) {
    device = mine;
  } else if (*device != mine) {
    throw_devices_differ(*device, mine, operation);
  }
}

// ---- leaves ---------------------------------------------------------------------------------

/// A tensor operand.
template <class T, class K>
struct tensor_leaf {
  using expression_node_tag = void;
  using value_type = T;
  using device_kind = K;
  using evaluator_type = backend::leaf_evaluator<T>;
  static constexpr int leaf_count = 1;
  static constexpr bool is_scalar = false;
  static constexpr bool is_symbolic = false;

  Tensor<T, K> tensor;

  const Shape& shape() const noexcept { return tensor.shape(); }
  /// Records this leaf's device in `device`, or throws device_mismatch_error naming both.
  void check_device(std::optional<Device>& device, const char* operation) const {
    if (!tensor.defined()) {
      throw error(std::string(operation) + ": an operand is an undefined tensor");
    }
    merge_device(device, tensor.device(), operation);
  }
  void collect_strides(const Shape& out, Strides* strides, int& next) const {
    strides[next++] = expand_strides(tensor.shape(), tensor.strides(), out, "expression");
  }
  evaluator_type evaluator(const Strides* strides, int rank, int& next) const {
    return evaluator_type(tensor.data(), strides[next++], rank);
  }
  template <class Fn>
  void for_each_tensor(Fn&& fn) const {
    fn(tensor);
  }
};

/// A scalar operand, held in its own C++ type; converted to the consuming node's compute type.
template <class S>
struct scalar_leaf {
  using expression_node_tag = void;
  using value_type = S;
  using device_kind = any_kind;
  using evaluator_type = backend::scalar_evaluator<S>;
  static constexpr int leaf_count = 0;
  static constexpr bool is_scalar = true;
  static constexpr bool is_symbolic = false;

  S value;

  const Shape& shape() const noexcept {
    static const Shape scalar_shape;
    return scalar_shape;
  }
  void check_device(std::optional<Device>&, const char*) const {}
  void collect_strides(const Shape&, Strides*, int&) const {}
  evaluator_type evaluator(const Strides*, int, int&) const { return {value}; }
  template <class Fn>
  void for_each_tensor(Fn&&) const {}
};

/// Wraps an operand as a node: tensors become tensor_leaf, numbers scalar_leaf.
template <class X>
auto as_node(const X& x) {
  if constexpr (node_type<X>) {
    return x;
  } else if constexpr (is_tensor<X>::value) {
    return tensor_leaf<typename X::value_type, typename X::device_kind>{x};
  } else {
    static_assert(scalar_operand<X>, "Tessera: an operand is neither a tensor, an expression nor a number");
    return scalar_leaf<X>{x};
  }
}
template <class X>
using node_of = decltype(as_node(std::declval<const X&>()));

/// Node type N made from the operand `x` as a node's member is: a node of type N copied or moved
/// once, anything else through as_node. Returned as a prvalue, so that a member initialised from
/// it is constructed in place (one copy of each tensor handle a node holds, not a copy and a move
/// through a parameter: expression building is much of a unit's host code).
template <class N, class X>
N node_from(X&& x) {
  if constexpr (std::is_same_v<std::remove_cvref_t<X>, N>) {
    return std::forward<X>(x);
  } else {
    return as_node(x);
  }
}

// ---- type rules -----------------------------------------------------------------------------

/// The dtype two operands compute in: tensor-tensor promotion, or the tensor's dtype when a
/// scalar of the same or lower category joins (a float scalar does not promote a half tensor).
template <class S>
using scalar_default_t =
    std::conditional_t<std::is_same_v<S, bool>, bool,
                       std::conditional_t<is_floating_point_v<S>, float, std::int64_t>>;

template <class A, class B>
struct promoted {
  using type = std::conditional_t<
      A::is_scalar && B::is_scalar,
      // Two numbers (where(c, 1.0, 0.0)): PyTorch's default dtypes, float32 and int64.
      promote_t<scalar_default_t<typename A::value_type>, scalar_default_t<typename B::value_type>>,
      std::conditional_t<
          A::is_scalar, promote_scalar_t<typename B::value_type, typename A::value_type>,
          std::conditional_t<B::is_scalar,
                             promote_scalar_t<typename A::value_type, typename B::value_type>,
                             promote_t<typename A::value_type, typename B::value_type>>>>;
};

/// Integer and bool operands of `/` or of float functions compute in float32, as in PyTorch.
template <class T>
using floating_of = std::conditional_t<is_floating_point_v<T>, T, float>;

/// How a functor maps its compute type to its result dtype.
enum class result_rule { same, boolean, floating };

template <class Op>
inline constexpr result_rule rule_of = result_rule::same;
template <> inline constexpr result_rule rule_of<ops::less> = result_rule::boolean;
template <> inline constexpr result_rule rule_of<ops::less_equal> = result_rule::boolean;
template <> inline constexpr result_rule rule_of<ops::greater> = result_rule::boolean;
template <> inline constexpr result_rule rule_of<ops::greater_equal> = result_rule::boolean;
template <> inline constexpr result_rule rule_of<ops::equal> = result_rule::boolean;
template <> inline constexpr result_rule rule_of<ops::not_equal> = result_rule::boolean;
template <> inline constexpr result_rule rule_of<ops::divide> = result_rule::floating;
template <> inline constexpr result_rule rule_of<ops::exp> = result_rule::floating;
template <> inline constexpr result_rule rule_of<ops::log> = result_rule::floating;
template <> inline constexpr result_rule rule_of<ops::sqrt> = result_rule::floating;
template <> inline constexpr result_rule rule_of<ops::rsqrt> = result_rule::floating;
template <> inline constexpr result_rule rule_of<ops::sin> = result_rule::floating;
template <> inline constexpr result_rule rule_of<ops::cos> = result_rule::floating;
template <> inline constexpr result_rule rule_of<ops::tanh> = result_rule::floating;
template <> inline constexpr result_rule rule_of<ops::sigmoid> = result_rule::floating;

/// (compute dtype, result dtype) of Op applied to operands promoted to T.
template <class Op, class T>
struct op_types {
  using compute = std::conditional_t<rule_of<Op> == result_rule::floating, floating_of<T>, T>;
  using result = std::conditional_t<rule_of<Op> == result_rule::boolean, bool, compute>;
};
template <class U, class T>
struct op_types<ops::cast_to<U>, T> {
  using compute = T;
  using result = U;
};

// ---- evaluators of nodes ----------------------------------------------------------------------

template <class Op, class Compute, class Child>
struct unary_evaluator {
  using result_type = decltype(Op{}(std::declval<opmath_t<Compute>>()));
  static constexpr int leaf_count = Child::leaf_count;
  Child child;

  template <class Access>
  TESSERA_HOST_DEVICE result_type get(Access a) const {
    return Op{}(static_cast<opmath_t<Compute>>(child.get(a)));
  }
  TESSERA_HOST_DEVICE void bind_row(const std::int64_t* index) { child.bind_row(index); }
  void bind_unit_row(const std::int64_t* index, backend::unit_splats& splats) {
    child.bind_unit_row(index, splats);
  }
  void advance_unit(std::int64_t n) { child.advance_unit(n); }
  template <class VectorAccess, int V>
  TESSERA_HOST_DEVICE void get_vector(VectorAccess a, result_type (&out)[V]) const {
    typename Child::result_type in[V];
    child.get_vector(a, in);
    for (int k = 0; k < V; ++k) out[k] = Op{}(static_cast<opmath_t<Compute>>(in[k]));
  }
  bool is_aligned(int vector) const { return child.is_aligned(vector); }
  bool is_row_aligned(int vector) const { return child.is_row_aligned(vector); }
};

template <class Op, class Compute, class Left, class Right>
struct binary_evaluator {
  using result_type =
      decltype(Op{}(std::declval<opmath_t<Compute>>(), std::declval<opmath_t<Compute>>()));
  static constexpr int leaf_count = Left::leaf_count + Right::leaf_count;
  Left left;
  Right right;

  template <class Access>
  TESSERA_HOST_DEVICE result_type get(Access a) const {
    using C = opmath_t<Compute>;
    return Op{}(static_cast<C>(left.get(a)), static_cast<C>(right.get(a)));
  }
  TESSERA_HOST_DEVICE void bind_row(const std::int64_t* index) {
    left.bind_row(index);
    right.bind_row(index);
  }
  void bind_unit_row(const std::int64_t* index, backend::unit_splats& splats) {
    left.bind_unit_row(index, splats);
    right.bind_unit_row(index, splats);
  }
  void advance_unit(std::int64_t n) {
    left.advance_unit(n);
    right.advance_unit(n);
  }
  template <class VectorAccess, int V>
  TESSERA_HOST_DEVICE void get_vector(VectorAccess a, result_type (&out)[V]) const {
    using C = opmath_t<Compute>;
    typename Left::result_type l[V];
    typename Right::result_type r[V];
    left.get_vector(a, l);
    right.get_vector(a, r);
    for (int k = 0; k < V; ++k) out[k] = Op{}(static_cast<C>(l[k]), static_cast<C>(r[k]));
  }
  bool is_aligned(int vector) const { return left.is_aligned(vector) && right.is_aligned(vector); }
  bool is_row_aligned(int vector) const {
    return left.is_row_aligned(vector) && right.is_row_aligned(vector);
  }
};

template <class Compute, class Condition, class Left, class Right>
struct where_evaluator {
  using result_type = opmath_t<Compute>;
  static constexpr int leaf_count =
      Condition::leaf_count + Left::leaf_count + Right::leaf_count;
  Condition condition;
  Left left;
  Right right;

  template <class Access>
  TESSERA_HOST_DEVICE result_type get(Access a) const {
    // Both branches are evaluated (no divergence), as PyTorch's where does.
    const auto l = static_cast<result_type>(left.get(a));
    const auto r = static_cast<result_type>(right.get(a));
    return backend::store_cast<bool>(condition.get(a)) ? l : r;
  }
  TESSERA_HOST_DEVICE void bind_row(const std::int64_t* index) {
    condition.bind_row(index);
    left.bind_row(index);
    right.bind_row(index);
  }
  void bind_unit_row(const std::int64_t* index, backend::unit_splats& splats) {
    condition.bind_unit_row(index, splats);
    left.bind_unit_row(index, splats);
    right.bind_unit_row(index, splats);
  }
  void advance_unit(std::int64_t n) {
    condition.advance_unit(n);
    left.advance_unit(n);
    right.advance_unit(n);
  }
  template <class VectorAccess, int V>
  TESSERA_HOST_DEVICE void get_vector(VectorAccess a, result_type (&out)[V]) const {
    typename Condition::result_type c[V];
    typename Left::result_type l[V];
    typename Right::result_type r[V];
    condition.get_vector(a, c);
    left.get_vector(a, l);
    right.get_vector(a, r);
    for (int k = 0; k < V; ++k) {
      out[k] = backend::store_cast<bool>(c[k]) ? static_cast<result_type>(l[k])
                                               : static_cast<result_type>(r[k]);
    }
  }
  bool is_aligned(int vector) const {
    return condition.is_aligned(vector) && left.is_aligned(vector) && right.is_aligned(vector);
  }
  bool is_row_aligned(int vector) const {
    return condition.is_row_aligned(vector) && left.is_row_aligned(vector) &&
           right.is_row_aligned(vector);
  }
};

template <class X>
Device device_of(const X& node, const char* operation) {
  std::optional<Device> device;
  node.check_device(device, operation);
  return device.value_or(Device{});
}

}  // namespace detail

// ---- nodes ----------------------------------------------------------------------------------

/// Op applied to one operand.
template <class Op, class A>
struct unary_expr {
  using expression_node_tag = void;
  using compute_type = typename detail::op_types<Op, typename A::value_type>::compute;
  using value_type = typename detail::op_types<Op, typename A::value_type>::result;
  using device_kind = typename A::device_kind;
  using evaluator_type = detail::unary_evaluator<Op, compute_type, typename A::evaluator_type>;
  static constexpr int leaf_count = A::leaf_count;
  static constexpr bool is_scalar = false;
  static constexpr bool is_symbolic = A::is_symbolic;

  A operand;

  template <class X>
  explicit unary_expr(X&& a) : operand(detail::node_from<A>(std::forward<X>(a))) {}
  const Shape& shape() const noexcept { return operand.shape(); }
  void check_device(std::optional<Device>& device, const char* operation) const {
    operand.check_device(device, operation);
  }
  void collect_strides(const Shape& out, Strides* strides, int& next) const {
    operand.collect_strides(out, strides, next);
  }
  evaluator_type evaluator(const Strides* strides, int rank, int& next) const {
    return {operand.evaluator(strides, rank, next)};
  }
  template <class Fn>
  void for_each_tensor(Fn&& fn) const {
    operand.for_each_tensor(fn);
  }
};

/// Op applied to two broadcast operands.
template <class Op, class A, class B>
struct binary_expr {
  using expression_node_tag = void;
  using promoted_type = typename detail::promoted<A, B>::type;
  using compute_type = typename detail::op_types<Op, promoted_type>::compute;
  using value_type = typename detail::op_types<Op, promoted_type>::result;
  using device_kind =
      typename detail::common_kind<typename A::device_kind, typename B::device_kind>::type;
  using evaluator_type = detail::binary_evaluator<Op, compute_type, typename A::evaluator_type,
                                                  typename B::evaluator_type>;
  static constexpr int leaf_count = A::leaf_count + B::leaf_count;
  static constexpr bool is_scalar = false;
  static constexpr bool is_symbolic = A::is_symbolic || B::is_symbolic;

  A left;
  B right;
  Shape shape_;

  /// Throws shape_error (both shapes) when the operands do not broadcast, and
  /// device_mismatch_error (both devices) when they are on different ordinals.
  template <class X, class Y>
  binary_expr(X&& a, Y&& b)
      : left(detail::node_from<A>(std::forward<X>(a))),
        right(detail::node_from<B>(std::forward<Y>(b))),
        shape_(broadcast_shapes(left.shape(), right.shape(), Op::name)) {
    std::optional<Device> device;
    check_device(device, Op::name);
  }
  const Shape& shape() const noexcept { return shape_; }
  void check_device(std::optional<Device>& device, const char* operation) const {
    left.check_device(device, operation);
    right.check_device(device, operation);
  }
  void collect_strides(const Shape& out, Strides* strides, int& next) const {
    left.collect_strides(out, strides, next);
    right.collect_strides(out, strides, next);
  }
  evaluator_type evaluator(const Strides* strides, int rank, int& next) const {
    auto l = left.evaluator(strides, rank, next);
    auto r = right.evaluator(strides, rank, next);
    return {l, r};
  }
  template <class Fn>
  void for_each_tensor(Fn&& fn) const {
    left.for_each_tensor(fn);
    right.for_each_tensor(fn);
  }
};

/// where(condition, a, b): a where condition is true, else b; all three broadcast.
template <class C, class A, class B>
struct where_expr {
  using expression_node_tag = void;
  using value_type = typename detail::promoted<A, B>::type;
  using device_kind = typename detail::common_kind<
      typename C::device_kind,
      typename detail::common_kind<typename A::device_kind, typename B::device_kind>::type>::type;
  using evaluator_type = detail::where_evaluator<value_type, typename C::evaluator_type,
                                                 typename A::evaluator_type,
                                                 typename B::evaluator_type>;
  static constexpr int leaf_count = C::leaf_count + A::leaf_count + B::leaf_count;
  static constexpr bool is_scalar = false;
  static constexpr bool is_symbolic = C::is_symbolic || A::is_symbolic || B::is_symbolic;

  C condition;
  A left;
  B right;
  Shape shape_;

  template <class X, class Y, class Z>
  where_expr(X&& c, Y&& a, Z&& b)
      : condition(detail::node_from<C>(std::forward<X>(c))),
        left(detail::node_from<A>(std::forward<Y>(a))),
        right(detail::node_from<B>(std::forward<Z>(b))),
        shape_(broadcast_shapes(condition.shape(),
                                broadcast_shapes(left.shape(), right.shape(), "where"), "where")) {
    std::optional<Device> device;
    check_device(device, "where");
  }
  const Shape& shape() const noexcept { return shape_; }
  void check_device(std::optional<Device>& device, const char* operation) const {
    condition.check_device(device, operation);
    left.check_device(device, operation);
    right.check_device(device, operation);
  }
  void collect_strides(const Shape& out, Strides* strides, int& next) const {
    condition.collect_strides(out, strides, next);
    left.collect_strides(out, strides, next);
    right.collect_strides(out, strides, next);
  }
  evaluator_type evaluator(const Strides* strides, int rank, int& next) const {
    auto c = condition.evaluator(strides, rank, next);
    auto l = left.evaluator(strides, rank, next);
    auto r = right.evaluator(strides, rank, next);
    return {c, l, r};
  }
  template <class Fn>
  void for_each_tensor(Fn&& fn) const {
    condition.for_each_tensor(fn);
    left.for_each_tensor(fn);
    right.for_each_tensor(fn);
  }
};

/// cast<U>(e): e's values converted to U (rounded through U).
template <class U, class A>
using cast_expr = unary_expr<ops::cast_to<U>, A>;

namespace detail {
/// Which node an expression is, and its functor (derivatives, op-by-op evaluation).
template <class E>
struct is_unary : std::false_type {};
template <class Op, class A>
struct is_unary<unary_expr<Op, A>> : std::true_type {
  using op = Op;
};
template <class E>
struct is_binary : std::false_type {};
template <class Op, class A, class B>
struct is_binary<binary_expr<Op, A, B>> : std::true_type {
  using op = Op;
};
template <class E>
struct is_where : std::false_type {};
template <class C, class A, class B>
struct is_where<where_expr<C, A, B>> : std::true_type {};
template <class E>
struct is_cast : std::false_type {};
template <class U, class A>
struct is_cast<unary_expr<ops::cast_to<U>, A>> : std::true_type {
  using target = U;
};

/// What an executor takes of a node: a maker of its evaluator for leaf strides laid out in `rank`
/// dimensions...
template <class Node>
auto evaluator_factory(const Node& node) {
  return [&node](const Strides* leaf_strides, int rank) {
    int position = 0;
    return node.evaluator(leaf_strides, rank, position);
  };
}

/// ...and its leaves' strides expanded to `shape` (the output's; by default the node's own).
template <class Node>
std::array<Strides, Node::leaf_count> leaf_strides_of(const Node& node, const Shape& shape) {
  std::array<Strides, Node::leaf_count> strides;
  int next = 0;
  node.collect_strides(shape, strides.data(), next);
  return strides;
}
template <class Node>
std::array<Strides, Node::leaf_count> leaf_strides_of(const Node& node) {
  return leaf_strides_of(node, node.shape());
}
}  // namespace detail

/// A tensor or a lazy expression of tensors.
template <class E>
concept Expression = detail::is_tensor<std::remove_cvref_t<E>>::value ||
                     detail::expression_node<std::remove_cvref_t<E>>;

namespace detail {
/// An expression with at least one autograd Var leaf (autograd/var.hpp): operators build it as
/// they build any expression, and the tracer records it as one fused node; it is never run.
template <class E>
concept symbolic_expression = node_type<std::remove_cvref_t<E>> &&
                              !std::remove_cvref_t<E>::is_scalar &&
                              std::remove_cvref_t<E>::is_symbolic;
/// What the operators and functions accept as a non-number operand.
template <class E>
concept any_expression = Expression<E> || symbolic_expression<E>;
}  // namespace detail

}  // namespace tessera
