// Evaluation: where a lazy expression becomes a tensor. `Tensor<T, K> y = e;`, `y = e;`,
// `y += e;` and `ts::eval(e)` each run one executor pass (one CUDA kernel or one CPU loop) that
// reads every operand and writes the output once; nothing else is allocated but the output,
// which is channels_last when the operands of its shape are (result_memory_format).
#pragma once

#include <array>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/expr/operators.hpp"
#if TESSERA_CUDA_KERNELS
#include "tessera/backend/cuda/executor.cuh"
#include "tessera/expr/detail/merged_operands.hpp"
#endif
#if TESSERA_CUDA_OP_BY_OP
#include "tessera/expr/detail/op_by_op.hpp"
#endif

namespace tessera {

namespace detail {

template <class>
inline constexpr bool always_false = false;

#if TESSERA_CUDA
/// Runs primitive `p` (expr/detail/op_by_op.hpp) into `out`, a tensor of p's dtype on a CUDA
/// device: compiled for every primitive in tessera::compiled (by nvcc), and only declared to the
/// units that evaluate CUDA expressions one operation at a time.
template <class T, class E>
void run_cuda_primitive(const Tensor<T, cuda>& out, const E& p);
#endif

#if TESSERA_CUDA_KERNELS
/// `node` into `out` on CUDA as one kernel of this unit. A name of its own, defined only where
/// nvcc compiles kernels: run_expression has another body in a unit that evaluates op by op
/// (g++ with tessera::compiled), and the linker keeps one body per name, so the library's
/// primitives, which must launch their kernel, never call run_expression (that body would hand
/// the primitive back to them, forever).
/// Choice: backend::cuda::kernel_choice (compact for the primitives).
template <backend::cuda::kernel_choice Choice = backend::cuda::kernel_choice::fastest, class T,
          class E>
void run_expression_kernel(const Tensor<T, cuda>& out, const E& node) {
  DeviceGuard<cuda> guard(out.device_index());
  backend::cuda::execute<Choice>(out.data(), out.strides(), out.shape(),
                                 leaf_strides_of(node, out.shape()), evaluator_factory(node));
}
#endif

/// Runs `node` into `out` (shapes already agree: every operand broadcasts to out's shape).
template <class T, class K, class E>
void run_expression(const Tensor<T, K>& out, const E& node) {
  if constexpr (std::is_same_v<K, cpu>) {
    backend::cpu::execute(out.data(), out.strides(), out.shape(), leaf_strides_of(node, out.shape()),
                          evaluator_factory(node));
  } else {
#if TESSERA_CUDA_KERNELS
    run_expression_kernel(out, node);
#elif TESSERA_CUDA_OP_BY_OP
    // No kernels here: the library's, one operation at a time.
    auto run = [](const auto& into, const auto& p) { run_cuda_primitive(into, p); };
    op_by_op::evaluate<K>(out, node, run);
#else
    static_assert(always_false<E>,
                  "Tessera: evaluating an expression on cuda tensors launches a CUDA kernel, so "
                  "this translation unit must be compiled by nvcc (a .cu file, or "
                  "set_source_files_properties(file.cpp PROPERTIES LANGUAGE CUDA)), or link "
                  "tessera::compiled, which runs it one operation at a time.");
#endif
  }
}

#if TESSERA_CUDA_KERNELS
/// The library's body of each CUDA primitive (tessera::compiled instantiates them, nvcc compiling
/// cmake/tessera_cuda_primitives.cpp): the vector kernel for a dense run, else the rows kernel one
/// element at a time (kernel_choice::compact), for the forms of a functor and dtype at once
/// (op_by_op::merged_operands).
template <class T, class E>
void run_cuda_primitive(const Tensor<T, cuda>& out, const E& p) {
  run_expression_kernel<backend::cuda::kernel_choice::compact>(out,
                                                               op_by_op::merged_operands<cuda>(p));
}
#endif

/// out += e in one pass, without `+=`'s aliasing check: for buffers carved from one storage (a
/// program's arena, a workspace), where that check would see an overlap where there is none and
/// evaluate aside. Each element of out is read before it is written, so e may read out itself.
template <class T, class K, class E>
void add_into(const Tensor<T, K>& out, const E& e) {
  run_expression(out, make_binary<ops::add>(out, e));
}

/// True when writing `out` while reading `node` could read already-written elements: an operand
/// shares out's storage but is not exactly out's own elements in out's order.
template <class T, class K, class E>
bool aliases_output(const Tensor<T, K>& out, const E& node) {
  bool unsafe = false;
  node.for_each_tensor([&](const auto& tensor) {
    if (!tensor.storage().is_same(out.storage())) return;
    using U = typename std::remove_cvref_t<decltype(tensor)>::value_type;
    bool same_elements =
        sizeof(U) == sizeof(T) &&
        static_cast<const void*>(tensor.data()) == static_cast<const void*>(out.data());
    const Strides expanded = expand_strides(tensor.shape(), tensor.strides(), out.shape());
    for (int d = 0; same_elements && d < out.dim(); ++d) {
      // An extent-1 dimension is never stepped through, so its stride does not matter (and
      // expand_strides writes 0 there): y += 1 on a [3, 1] tensor is still in place.
      if (out.shape()[d] != 1 && expanded[d] != out.strides()[d]) same_elements = false;
    }
    if (!same_elements) unsafe = true;
  });
  return unsafe;
}

/// The memory format of a new tensor holding the expression's values: channels_last when the
/// result is 4-d and the operands of the result's shape are all laid out channels_last (dense or
/// not: suggest_memory_format), so that NHWC in gives NHWC out, as PyTorch's TensorIterator
/// does; contiguous_format otherwise. Operands that broadcast (a bias [1, C, 1, 1]) and numbers
/// have no say.
template <class E>
memory_format result_memory_format(const E& node) {
  const Shape& shape = node.shape();
  if (shape.size() != 4) return memory_format::contiguous_format;
  bool channels_last = false;
  bool other = false;
  node.for_each_tensor([&](const auto& tensor) {
    if (tensor.shape() != shape) return;
    (tensor.suggest_memory_format() == memory_format::channels_last ? channels_last : other) = true;
  });
  return channels_last && !other ? memory_format::channels_last
                                 : memory_format::contiguous_format;
}

/// A new tensor of dtype T holding the expression's values (in result_memory_format).
template <class T, class K, class E>
Tensor<T, K> evaluate_as(const E& node) {
  static_assert(std::is_same_v<typename E::device_kind, K>,
                "Tessera: the expression's operands are on another kind of device than the tensor "
                "it is assigned to; move it with .to<...>() after evaluating it");
  auto out = Tensor<T, K>::empty_on(node.shape(), device_of(node, "evaluate"),
                                    result_memory_format(node));
  run_expression(out, node);
  return out;
}

/// out's elements = the expression's values (converted to T), in one pass. The expression must
/// broadcast to out's shape and live on out's device; out must not be an expanded view (error).
template <class T, class K, class E>
void evaluate_into(Tensor<T, K>& out, const E& node, const char* operation) {
  const Device device = device_of(node, operation);
  if (device != out.device()) {
    throw device_mismatch_error(std::string(operation) + ": the output is on " +
                                out.device().str() + " but the expression is on " + device.str());
  }
  if (broadcast_shapes(out.shape(), node.shape(), operation) != out.shape()) {
    throw shape_error(std::string(operation) + ": an output of shape " + out.shape().str() +
                      " cannot hold the result of shape " + node.shape().str());
  }
  check_not_expanded(out.shape(), out.strides(), operation);
  if (aliases_output(out, node)) {
    // Reading and writing one buffer in different orders: evaluate aside, then copy (2 passes).
    out.copy_(evaluate_as<T, K>(node));
    return;
  }
  run_expression(out, node);
}

/// PyTorch's rule for in-place results: float cannot go into an integer tensor, nor a non-bool
/// into a bool tensor.
template <class Result, class Out>
inline constexpr bool can_cast_v =
    !(is_floating_point_v<Result> && !is_floating_point_v<Out>) &&
    !(std::is_same_v<Out, bool> && !std::is_same_v<Result, bool>);

template <class Op, class T, class K, class B>
Tensor<T, K>& compound_assign(Tensor<T, K>& out, const B& operand, const char* operation) {
  if (!out.defined()) throw error(std::string(operation) + ": the tensor is undefined");
  auto node = make_binary<Op>(out, operand);
  using result = typename decltype(node)::value_type;
  static_assert(can_cast_v<result, T>,
                "Tessera: an in-place operation's result type cannot be cast to the tensor's "
                "dtype (e.g. float into an integer tensor), as in PyTorch; use y = cast<T>(...) "
                "or compute into a floating tensor");
  evaluate_into(out, node, operation);
  return out;
}

}  // namespace detail

template <Dtype T, DeviceKind Kind>
template <detail::expression_node E>
Tensor<T, Kind>::Tensor(const E& expression) : Tensor(detail::evaluate_as<T, Kind>(expression)) {}

template <Dtype T, DeviceKind Kind>
template <detail::expression_node E>
Tensor<T, Kind>& Tensor<T, Kind>::operator=(const E& expression) & {
  if (defined() && expression.shape() == shape_) {
    detail::evaluate_into(*this, expression, "assign");
  } else {
    *this = detail::evaluate_as<T, Kind>(expression);
  }
  return *this;
}

template <Dtype T, DeviceKind Kind>
template <detail::expression_node E>
Tensor<T, Kind>&& Tensor<T, Kind>::operator=(const E& expression) && {
  static_assert(std::is_same_v<typename E::device_kind, Kind>,
                "Tessera: the expression's operands are on another kind of device than the view "
                "it is assigned to; evaluate it and copy it with .copy_(...) or .to<...>()");
  require_defined("assign");
  detail::evaluate_into(*this, expression, "assign");
  return std::move(*this);
}

/// The expression's values in a new tensor of its own dtype, on its device (one pass).
template <Expression E>
auto eval(const E& expression) {
  if constexpr (detail::is_tensor<E>::value) {
    return expression.clone();
  } else {
    return detail::evaluate_as<typename E::value_type, typename E::device_kind>(expression);
  }
}

#define TESSERA_COMPOUND_ASSIGNMENT(symbol, functor)                                     \
  template <Dtype T, DeviceKind K, class B>                                              \
    requires detail::operand<B>                                                          \
  Tensor<T, K>& operator symbol(Tensor<T, K>& out, const B& operand) {                   \
    return detail::compound_assign<ops::functor>(out, operand, #symbol);                 \
  }                                                                                      \
  template <Dtype T, DeviceKind K, class B>                                              \
    requires detail::operand<B>                                                          \
  Tensor<T, K>& operator symbol(Tensor<T, K>&& out, const B& operand) {                  \
    return detail::compound_assign<ops::functor>(out, operand, #symbol);                 \
  }
/// In place, into the tensor's storage (views see it): y += e, y -= e, y *= e, y /= e.
TESSERA_COMPOUND_ASSIGNMENT(+=, add)
TESSERA_COMPOUND_ASSIGNMENT(-=, subtract)
TESSERA_COMPOUND_ASSIGNMENT(*=, multiply)
TESSERA_COMPOUND_ASSIGNMENT(/=, divide)
#undef TESSERA_COMPOUND_ASSIGNMENT

}  // namespace tessera
