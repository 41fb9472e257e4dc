// The operands of the library's CUDA primitives (expr/detail/op_by_op.hpp): the forms of a
// primitive that differ only in which operands are numbers run one kernel.
#pragma once

#include <optional>
#include <type_traits>

#include "tessera/backend/evaluator.hpp"
#include "tessera/expr/node.hpp"

namespace tessera::detail::op_by_op {

// ---- one kernel per functor -------------------------------------------------------------------
//
// The library runs the forms of a primitive that differ only in which operands are numbers
// (x + y, x + 2, 2 - x; where(c, x, y), where(c, x, 0)...) with one kernel: each tensor or number
// operand of dtype P becomes an operand_leaf, whose evaluator chooses at run time (145 fewer
// (functor, dtype, form) kernels of each family in tessera::compiled; bench/RESULTS.md, issue 45).

/// A tensor of dtype P on device kind K, or a number held as opmath_t<P> (the tensor undefined).
template <class P, class K>
struct operand_leaf {
  using expression_node_tag = void;
  using value_type = P;
  using device_kind = K;
  using evaluator_type = backend::operand_evaluator<P>;
  static constexpr int leaf_count = 1;
  static constexpr bool is_scalar = false;
  static constexpr bool is_symbolic = false;

  Tensor<P, K> tensor;  // undefined for a number
  opmath_t<P> number{};

  const Shape& shape() const noexcept {
    static const Shape number_shape;
    return tensor.defined() ? tensor.shape() : number_shape;
  }
  void check_device(std::optional<Device>& device, const char* operation) const {
    if (tensor.defined()) merge_device(device, tensor.device(), operation);
  }
  // A number takes row-major strides (its evaluator never reads them): with stride 0 it would
  // keep x + 2 on a dense x from being one dense run, the vector kernel's case.
  void collect_strides(const Shape& out, Strides* strides, int& next) const {
    strides[next++] = tensor.defined()
                          ? expand_strides(tensor.shape(), tensor.strides(), out, "expression")
                          : out.contiguous_strides();
  }
  evaluator_type evaluator(const Strides* strides, int rank, int& next) const {
    evaluator_type e;
    if (tensor.defined()) {
      e.leaf = backend::leaf_evaluator<P>(tensor.data(), strides[next], rank);
    } else {
      e.number = number;
      e.is_number = true;
    }
    ++next;
    return e;
  }
  template <class Fn>
  void for_each_tensor(Fn&& fn) const {
    if (tensor.defined()) fn(tensor);
  }
};

/// A primitive's tensor or number operand of dtype P (a tensor_leaf<P, K>, or a scalar_leaf of
/// opmath_t<P>) as an operand_leaf.
template <class P, class K, class L>
operand_leaf<P, K> operand_of(const L& leaf) {
  if constexpr (std::is_same_v<L, scalar_leaf<opmath_t<P>>>) {
    return {Tensor<P, K>(), leaf.value};
  } else {
    static_assert(std::is_same_v<L, tensor_leaf<P, K>>);
    return {leaf.tensor, opmath_t<P>{}};
  }
}

/// Primitive `p` with its tensor and number operands as operand_leaf: the same values, from the
/// kernel that every form of p's functor and dtype shares. A unary primitive has no number form
/// and stays as it is.
template <class K, class E>
auto merged_operands(const E& p) {
  if constexpr (is_binary<E>::value) {
    using Op = typename is_binary<E>::op;
    using P = typename E::promoted_type;
    return binary_expr<Op, operand_leaf<P, K>, operand_leaf<P, K>>(operand_of<P, K>(p.left),
                                                                   operand_of<P, K>(p.right));
  } else if constexpr (is_where<E>::value) {
    using P = typename E::value_type;
    return where_expr<tensor_leaf<bool, K>, operand_leaf<P, K>, operand_leaf<P, K>>(
        p.condition, operand_of<P, K>(p.left), operand_of<P, K>(p.right));
  } else {
    return p;
  }
}

}  // namespace tessera::detail::op_by_op
