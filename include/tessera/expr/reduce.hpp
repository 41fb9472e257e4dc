// Reductions of expressions: sum, mean, max, min (of every element, or along one dimension),
// argmax, argmin, softmax and log_softmax. Each takes a tensor or a lazy expression and runs one
// backend pass that reads the expression through its evaluator, so `ts::sum(a * b)` allocates
// only its result. This header owns shapes, dims, dtypes and errors; the loops live in
// backend/cpu/reduce.hpp and backend/cuda/reduce.cuh.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/backend/cpu/reduce.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/promotion.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/expr/node.hpp"
#if TESSERA_CUDA_KERNELS
#include "tessera/backend/cuda/reduce.cuh"
#endif
#if TESSERA_CUDA_OP_BY_OP
#include "tessera/expr/detail/op_by_op.hpp"
#endif

namespace tessera {

namespace detail {

#if TESSERA_CUDA
/// The primitive reductions (expr/detail/op_by_op.hpp) of a tensor on a CUDA device: compiled in
/// tessera::compiled (by nvcc), only declared to the units that evaluate CUDA expressions one
/// operation at a time.
template <class Op, class Finish, class Out, class V>
void reduce_all_cuda_primitive(const Tensor<Out, cuda>& out, const tensor_leaf<V, cuda>& leaf,
                               const char* operation);
template <class Op, class Finish, class Out, class V>
void reduce_dim_cuda_primitive(const Tensor<Out, cuda>& out, const tensor_leaf<V, cuda>& leaf,
                               int dim, const char* operation);
template <bool Log, class F>
void softmax_cuda_primitive(const Tensor<F, cuda>& out, const tensor_leaf<F, cuda>& leaf,
                            std::int64_t dim, const char* operation);
#endif

/// torch.sum's dtype: integer and bool inputs sum to int64, floating inputs keep their dtype.
template <class V>
using sum_result_t = std::conditional_t<is_floating_point_v<V>, V, std::int64_t>;

template <class>
inline constexpr bool reduce_always_false = false;
#define TESSERA_REDUCE_NEEDS_NVCC(what)                                                      \
  "Tessera: " what " an expression on cuda tensors launches CUDA kernels, so this translation " \
  "unit must be compiled by nvcc (a .cu file, or set_source_files_properties(file.cpp "        \
  "PROPERTIES LANGUAGE CUDA)), or link tessera::compiled, which runs it one operation at a "   \
  "time."

/// Maps `dim` into [0, rank); a 0-dim input takes 0 and -1, as in PyTorch. Throws shape_error
/// naming the dimension, the rank and the shape.
TESSERA_API int reduction_dim(const Shape& shape, std::int64_t dim, const char* operation);

/// The shape of a reduction along `dim`: that dimension removed, or kept with extent 1.
inline Shape reduced_shape(const Shape& shape, int dim, bool keepdim) {
  Shape out = shape;
  if (shape.size() == 0) return out;
  if (keepdim) {
    out[dim] = 1;
  } else {
    out.erase(dim);
  }
  return out;
}

[[noreturn]] inline void throw_empty_reduction(const char* operation, const Shape& shape) {
  throw shape_error(std::string(operation) + ": cannot reduce the empty input of shape " +
                    shape.str() + " (" + operation + " of no elements is undefined)");
}
[[noreturn]] inline void throw_empty_dim(const char* operation, const Shape& shape, int dim) {
  throw shape_error(std::string(operation) + ": cannot reduce dimension " + std::to_string(dim) +
                    " of size 0 (shape " + shape.str() + "; " + operation +
                    " of no elements is undefined)");
}

template <class V>
void require_floating(const char* operation) {
  if constexpr (!is_floating_point_v<V>) {
    throw dtype_error(std::string(operation) + ": input dtype " + dtype_name<V>() +
                      " is not floating point; cast first, e.g. " + operation +
                      "(ts::cast<float>(x))");
  }
}

/// The rows softmax runs over: the node's shape and leaf strides, a 0-dim input as a row of one
/// element.
template <class Node>
std::pair<Shape, std::array<Strides, Node::leaf_count>> softmax_rows(const Node& node) {
  auto strides = leaf_strides_of(node);
  if (node.shape().size() > 0) return {node.shape(), strides};
  for (auto& s : strides) s = Strides{0};
  return {Shape{1}, strides};
}

#if TESSERA_CUDA_KERNELS
// The CUDA kernels of the reductions below, under names of their own, defined only where nvcc
// compiles kernels (the library's primitives call them; see run_expression_kernel in
// expr/assign.hpp for why they cannot call the reductions themselves).
// Choice: backend::cuda::kernel_choice (fewest for the primitives).
template <class Op, class Finish,
          backend::cuda::kernel_choice Choice = backend::cuda::kernel_choice::fastest, class Out,
          class Node>
void reduce_all_kernel(const Tensor<Out, cuda>& out, const Node& node, Device device) {
  DeviceGuard<cuda> guard(device.index);
  backend::cuda::reduce_all<Op, typename Node::value_type, Finish, Choice>(
      out.data(), node.shape(), leaf_strides_of(node), evaluator_factory(node));
}
template <class Op, class Finish,
          backend::cuda::kernel_choice Choice = backend::cuda::kernel_choice::fastest, class Out,
          class Node>
void reduce_dim_kernel(const Tensor<Out, cuda>& out, const Node& node, int dim, Device device) {
  DeviceGuard<cuda> guard(device.index);
  backend::cuda::reduce_dim<Op, typename Node::value_type, Finish, Choice>(
      out.data(), node.shape(), dim, leaf_strides_of(node), evaluator_factory(node));
}
template <bool Log, backend::cuda::kernel_choice Choice = backend::cuda::kernel_choice::fastest,
          class F, class Node>
void softmax_kernel(const Tensor<F, cuda>& out, const Node& node, int d, Device device) {
  const auto [row_shape, row_strides] = softmax_rows(node);
  DeviceGuard<cuda> guard(device.index);
  backend::cuda::softmax<Log, typename Node::value_type, Choice>(
      out.data(), row_shape, d, row_strides, evaluator_factory(node));
}
#endif

/// A full reduction of `node` into `out` (one element, on the node's device).
template <class Op, class Finish, class Out, class Node>
void reduce_all_into(const Tensor<Out, typename Node::device_kind>& out, const Node& node,
                     const char* operation) {
  using K = typename Node::device_kind;
  using V = typename Node::value_type;
  const Device device = device_of(node, operation);
  if constexpr (std::is_same_v<K, cpu>) {
    backend::cpu::reduce_all<Op, V, Finish>(out.data(), node.shape(), leaf_strides_of(node),
                                            evaluator_factory(node));
  } else {
#if TESSERA_CUDA_KERNELS
    reduce_all_kernel<Op, Finish>(out, node, device);
#elif TESSERA_CUDA_OP_BY_OP
    (void)device;
    auto run = [](const auto& into, const auto& p) { run_cuda_primitive(into, p); };
    auto reduce = [operation](const auto& into, const auto& leaf) {
      reduce_all_cuda_primitive<Op, Finish>(into, leaf, operation);
    };
    op_by_op::reduce<Op, Finish, K>(out, node, run, reduce);
#else
    (void)device;
    static_assert(reduce_always_false<Node>, TESSERA_REDUCE_NEEDS_NVCC("reducing"));
#endif
  }
}

/// A full reduction of `node` into a new 0-dim tensor of dtype Out.
template <class Op, class Finish, class Out, class Node>
Tensor<Out, typename Node::device_kind> reduce_all(const Node& node, const char* operation) {
  using K = typename Node::device_kind;
  auto out = Tensor<Out, K>::empty_on(Shape{}, device_of(node, operation));
  reduce_all_into<Op, Finish, Out>(out, node, operation);
  return out;
}

/// A reduction of `node` along `dim` (already normalised) into `out`: contiguous, on the node's
/// device, holding the reduced elements (with or without the kept extent-1 dimension).
template <class Op, class Finish, class Out, class Node>
void reduce_dim_into(const Tensor<Out, typename Node::device_kind>& out, const Node& node, int dim,
                     const char* operation) {
  using K = typename Node::device_kind;
  using V = typename Node::value_type;
  const Shape& shape = node.shape();
  if (shape.size() == 0) return reduce_all_into<Op, Finish, Out>(out, node, operation);
  const Device device = device_of(node, operation);
  if constexpr (std::is_same_v<K, cpu>) {
    backend::cpu::reduce_dim<Op, V, Finish>(out.data(), shape, dim, leaf_strides_of(node),
                                            evaluator_factory(node));
  } else {
#if TESSERA_CUDA_KERNELS
    reduce_dim_kernel<Op, Finish>(out, node, dim, device);
#elif TESSERA_CUDA_OP_BY_OP
    (void)device;
    auto run = [](const auto& into, const auto& p) { run_cuda_primitive(into, p); };
    auto reduce = [dim, operation](const auto& into, const auto& leaf) {
      reduce_dim_cuda_primitive<Op, Finish>(into, leaf, dim, operation);
    };
    op_by_op::reduce<Op, Finish, K>(out, node, run, reduce);
#else
    (void)device;
    static_assert(reduce_always_false<Node>, TESSERA_REDUCE_NEEDS_NVCC("reducing"));
#endif
  }
}

/// A reduction of `node` along `dim` (already normalised) into a new tensor of dtype Out.
template <class Op, class Finish, class Out, class Node>
Tensor<Out, typename Node::device_kind> reduce_dim(const Node& node, int dim, bool keepdim,
                                                   const char* operation) {
  using K = typename Node::device_kind;
  const Shape& shape = node.shape();
  if (shape.size() == 0) return reduce_all<Op, Finish, Out>(node, operation);
  auto out =
      Tensor<Out, K>::empty_on(reduced_shape(shape, dim, keepdim), device_of(node, operation));
  reduce_dim_into<Op, Finish, Out>(out, node, dim, operation);
  return out;
}

/// softmax (or log_softmax) of `node` along `dim` into `out`: contiguous, of the node's shape.
template <bool Log, class Node>
void softmax_into(const Tensor<floating_of<typename Node::value_type>, typename Node::device_kind>& out,
                  const Node& node, std::int64_t dim, const char* operation) {
  using K = typename Node::device_kind;
  using V = typename Node::value_type;
  const int d = reduction_dim(node.shape(), dim, operation);
  const Device device = device_of(node, operation);  // the operands' devices agree, or it throws
  if constexpr (std::is_same_v<K, cpu>) {
    (void)device;
    const auto [row_shape, row_strides] = softmax_rows(node);
    backend::cpu::softmax<Log, V>(out.data(), row_shape, d, row_strides, evaluator_factory(node));
  } else {
#if TESSERA_CUDA_KERNELS
    softmax_kernel<Log>(out, node, d, device);
#elif TESSERA_CUDA_OP_BY_OP
    auto run = [](const auto& into, const auto& p) { run_cuda_primitive(into, p); };
    auto softmax = [dim, operation](const auto& into, const auto& leaf) {
      softmax_cuda_primitive<Log>(into, leaf, dim, operation);
    };
    op_by_op::softmax<K>(out, node, run, softmax);
#else
    static_assert(reduce_always_false<Node>, TESSERA_REDUCE_NEEDS_NVCC("softmax of"));
#endif
  }
}

template <bool Log, class Node>
auto softmax_of(const Node& node, std::int64_t dim, const char* operation) {
  using K = typename Node::device_kind;
  using F = floating_of<typename Node::value_type>;
  reduction_dim(node.shape(), dim, operation);
  auto out = Tensor<F, K>::empty_on(node.shape(), device_of(node, operation));
  softmax_into<Log>(out, node, dim, operation);
  return out;
}

#undef TESSERA_REDUCE_NEEDS_NVCC

#if TESSERA_CUDA_KERNELS
template <class Op, class Finish, class Out, class V>
void reduce_all_cuda_primitive(const Tensor<Out, cuda>& out, const tensor_leaf<V, cuda>& leaf,
                               const char* operation) {
  // kernel_choice::fewest compiles no merge of a strided full reduction's rows: a tensor whose
  // elements are not one dense run is copied contiguous first, then read as one row.
  constexpr auto fewest = backend::cuda::kernel_choice::fewest;
  const Device device = device_of(leaf, operation);
  if (backend::cuda::full_reduction_rows<1>::make(leaf.shape(), leaf_strides_of(leaf),
                                                  backend::positional_op<Op>)
          .rows == 1) {
    reduce_all_kernel<Op, Finish, fewest>(out, leaf, device);
  } else {
    reduce_all_kernel<Op, Finish, fewest>(out, tensor_leaf<V, cuda>{leaf.tensor.contiguous()},
                                          device);
  }
}
template <class Op, class Finish, class Out, class V>
void reduce_dim_cuda_primitive(const Tensor<Out, cuda>& out, const tensor_leaf<V, cuda>& leaf,
                               int dim, const char* operation) {
  if (leaf.shape().size() == 0) {
    reduce_all_cuda_primitive<Op, Finish>(out, leaf, operation);
  } else {
    reduce_dim_kernel<Op, Finish, backend::cuda::kernel_choice::fewest>(out, leaf, dim,
                                                                        device_of(leaf, operation));
  }
}
template <bool Log, class F>
void softmax_cuda_primitive(const Tensor<F, cuda>& out, const tensor_leaf<F, cuda>& leaf,
                            std::int64_t dim, const char* operation) {
  softmax_kernel<Log, backend::cuda::kernel_choice::fewest>(
      out, leaf, reduction_dim(leaf.shape(), dim, operation), device_of(leaf, operation));
}
#endif

#if TESSERA_DEFINITIONS
TESSERA_API int reduction_dim(const Shape& shape, std::int64_t dim, const char* operation) {
  const int rank = shape.size();
  const int span = rank == 0 ? 1 : rank;
  if (dim < -span || dim >= span) {
    throw shape_error(std::string(operation) + ": dimension " + std::to_string(dim) +
                      " is out of range for a tensor of " + std::to_string(rank) +
                      " dimensions (shape " + shape.str() + "; expected [" + std::to_string(-span) +
                      ", " + std::to_string(span - 1) + "])");
  }
  return static_cast<int>(dim < 0 ? dim + span : dim);
}
#endif  // TESSERA_DEFINITIONS

}  // namespace detail

// ---- sum and mean ---------------------------------------------------------------------------

/// Sum of every element of `e` (a tensor or a lazy expression, read once and never stored), as a
/// 0-dim tensor. Integer and bool inputs give int64, floating inputs keep their dtype (as
/// torch.sum). Accumulates in accumulate_t (float for half, bfloat16 and float, double for
/// double, int64 for integers) by blocked pairwise summation, so float error grows like log n.
/// The sum of no elements is 0.
template <Expression E>
auto sum(const E& e) {
  const auto node = detail::as_node(e);
  using V = typename decltype(node)::value_type;
  return detail::reduce_all<backend::sum_op<accumulate_t<V>>, backend::finish_value,
                            detail::sum_result_t<V>>(node, "sum");
}

/// Sum along dimension `dim` (negative counts from the end); the dimension is removed, or kept
/// with extent 1 when `keepdim`. Dtypes as sum(e). Throws shape_error for a dimension out of range.
template <Expression E>
auto sum(const E& e, std::int64_t dim, bool keepdim = false) {
  const auto node = detail::as_node(e);
  using V = typename decltype(node)::value_type;
  const int d = detail::reduction_dim(node.shape(), dim, "sum");
  return detail::reduce_dim<backend::sum_op<accumulate_t<V>>, backend::finish_value,
                            detail::sum_result_t<V>>(node, d, keepdim, "sum");
}

/// Mean of every element as a 0-dim tensor of the input's floating dtype (sum accumulated as in
/// sum(e), then divided). The mean of no elements is NaN. Throws dtype_error for integer or bool
/// inputs, as torch.mean does: cast first.
template <Expression E>
auto mean(const E& e) {
  const auto node = detail::as_node(e);
  using V = typename decltype(node)::value_type;
  using K = typename decltype(node)::device_kind;
  detail::require_floating<V>("mean");
  if constexpr (is_floating_point_v<V>) {
    return detail::reduce_all<backend::sum_op<accumulate_t<V>>, backend::finish_mean, V>(node,
                                                                                         "mean");
  } else {
    return Tensor<float, K>();  // not reached: require_floating threw
  }
}

/// Mean along dimension `dim` (keepdim as in sum). NaN where the dimension is empty; dtype_error
/// for integer or bool inputs.
template <Expression E>
auto mean(const E& e, std::int64_t dim, bool keepdim = false) {
  const auto node = detail::as_node(e);
  using V = typename decltype(node)::value_type;
  using K = typename decltype(node)::device_kind;
  detail::require_floating<V>("mean");
  const int d = detail::reduction_dim(node.shape(), dim, "mean");
  if constexpr (is_floating_point_v<V>) {
    return detail::reduce_dim<backend::sum_op<accumulate_t<V>>, backend::finish_mean, V>(
        node, d, keepdim, "mean");
  } else {
    (void)d;
    return Tensor<float, K>();  // not reached: require_floating threw
  }
}

// ---- max and min ----------------------------------------------------------------------------

#define TESSERA_EXTREMUM(name, op)                                                                 \
  template <Expression E>                                                                          \
  auto name(const E& e) {                                                                          \
    const auto node = detail::as_node(e);                                                          \
    using V = typename decltype(node)::value_type;                                                 \
    if (node.shape().numel() == 0) detail::throw_empty_reduction(#name, node.shape());             \
    return detail::reduce_all<backend::op<opmath_t<V>>, backend::finish_value, V>(node, #name);    \
  }                                                                                                \
  template <Expression E>                                                                          \
  auto name(const E& e, std::int64_t dim, bool keepdim = false) {                                  \
    const auto node = detail::as_node(e);                                                          \
    using V = typename decltype(node)::value_type;                                                 \
    const Shape& shape = node.shape();                                                             \
    const int d = detail::reduction_dim(shape, dim, #name);                                        \
    if (shape.size() > 0 && shape[d] == 0) detail::throw_empty_dim(#name, shape, d);               \
    return detail::reduce_dim<backend::op<opmath_t<V>>, backend::finish_value, V>(node, d,         \
                                                                                  keepdim, #name); \
  }

/// max(e): the largest element as a 0-dim tensor of e's dtype; NaN if any element is NaN (as
/// torch.max). max(e, dim, keepdim = false): the largest along `dim` (the values only; argmax
/// gives the positions). Throws shape_error for an empty input or an empty dimension, naming the
/// shape, and for a dimension out of range.
TESSERA_EXTREMUM(max, max_op)
/// min(e) and min(e, dim, keepdim = false): as max, the smallest.
TESSERA_EXTREMUM(min, min_op)
#undef TESSERA_EXTREMUM

// ---- argmax and argmin ----------------------------------------------------------------------

#define TESSERA_ARG_EXTREMUM(name, greatest)                                                 \
  template <Expression E>                                                                    \
  Tensor<std::int64_t, typename detail::node_of<E>::device_kind> name(const E& e) {          \
    const auto node = detail::as_node(e);                                                    \
    using V = typename decltype(node)::value_type;                                           \
    if (node.shape().numel() == 0) detail::throw_empty_reduction(#name, node.shape());       \
    return detail::reduce_all<backend::arg_op<opmath_t<V>, greatest>, backend::finish_index, \
                              std::int64_t>(node, #name);                                    \
  }                                                                                          \
  template <Expression E>                                                                    \
  Tensor<std::int64_t, typename detail::node_of<E>::device_kind> name(                       \
      const E& e, std::int64_t dim, bool keepdim = false) {                                  \
    const auto node = detail::as_node(e);                                                    \
    using V = typename decltype(node)::value_type;                                           \
    const Shape& shape = node.shape();                                                       \
    const int d = detail::reduction_dim(shape, dim, #name);                                  \
    if (shape.size() > 0 && shape[d] == 0) detail::throw_empty_dim(#name, shape, d);         \
    return detail::reduce_dim<backend::arg_op<opmath_t<V>, greatest>, backend::finish_index, \
                              std::int64_t>(node, d, keepdim, #name);                        \
  }

/// argmax(e): the position of the largest element in row-major order (the flattened index, as
/// torch.argmax without dim), as a 0-dim int64 tensor. argmax(e, dim, keepdim = false): the
/// position along `dim`. The first of equal values wins; NaN counts as the largest. Throws
/// shape_error for an empty input or dimension, and for a dimension out of range.
TESSERA_ARG_EXTREMUM(argmax, true)
/// argmin(e) and argmin(e, dim, keepdim = false): as argmax, the smallest.
TESSERA_ARG_EXTREMUM(argmin, false)
#undef TESSERA_ARG_EXTREMUM

// ---- softmax --------------------------------------------------------------------------------

/// softmax(e, dim): exp(x) / sum(exp(x)) along `dim`, same shape, computed stably as
/// exp(x - max) / sum(exp(x - max)) in float (double for double) and stored in e's floating dtype
/// (float32 for integer inputs). -inf gives probability 0; a row of only -inf gives NaN, as in
/// PyTorch. The expression is read (three times per row) but never stored. Throws shape_error
/// for a dimension out of range.
template <Expression E>
auto softmax(const E& e, std::int64_t dim) {
  return detail::softmax_of<false>(detail::as_node(e), dim, "softmax");
}

/// log_softmax(e, dim): x - max - log(sum(exp(x - max))) along `dim`, as softmax.
template <Expression E>
auto log_softmax(const E& e, std::int64_t dim) {
  return detail::softmax_of<true>(detail::as_node(e), dim, "log_softmax");
}

}  // namespace tessera
