// The recorded operations: the Var methods (views, copies between ordinals, a Var made from an
// expression of Vars) and the ts:: overloads (sum, mean, max, min, softmax, log_softmax, matmul,
// cat, rand_like, on_forward) that record nodes while tracing. The nodes and their derivatives
// are in autograd/detail/: fused_node.hpp (fused elementwise expressions), reduction_nodes.hpp,
// matmul_node.hpp, movement_nodes.hpp (views, cat, copies), stateful_nodes.hpp (rand, effects),
// on the bases of gradient.hpp.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/derivative.hpp"
#include "tessera/autograd/detail/fused_node.hpp"
#include "tessera/autograd/detail/gradient.hpp"
#include "tessera/autograd/detail/matmul_node.hpp"
#include "tessera/autograd/detail/movement_nodes.hpp"
#include "tessera/autograd/detail/reduction_nodes.hpp"
#include "tessera/autograd/detail/stateful_nodes.hpp"
#include "tessera/core/random.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/expr/reduce.hpp"
#include "tessera/tensor/cat.hpp"
#include "tessera/tensor/factories.hpp"

namespace tessera::autograd::detail {

/// Calls fn(shape, strides) for every Var and tensor leaf of a symbolic expression (a Var as the
/// expression reads it: a Var read in another shape than its value's counts as contiguous).
template <class E, class Fn>
void for_each_operand_layout(const E& e, graph& g, Fn&& fn) {
  if constexpr (is_var<E>::value) {
    const value_info& info = g.values[static_cast<std::size_t>(e.id())];
    if (info.shape == e.shape()) {
      fn(info.shape, info.strides);
    } else {
      fn(e.shape(), e.shape().contiguous_strides());
    }
  } else if constexpr (requires { e.tensor; }) {
    fn(e.tensor.shape(), e.tensor.strides());
  } else if constexpr (requires { e.operand; }) {
    for_each_operand_layout(e.operand, g, fn);
  } else if constexpr (requires { e.condition; }) {
    for_each_operand_layout(e.condition, g, fn);
    for_each_operand_layout(e.left, g, fn);
    for_each_operand_layout(e.right, g, fn);
  } else if constexpr (requires { e.left; }) {
    for_each_operand_layout(e.left, g, fn);
    for_each_operand_layout(e.right, g, fn);
  }
}

/// The layout of a fused expression's value, eager's rule (result_memory_format in
/// expr/assign.hpp): channels_last when it is 4-d and every operand of its shape is laid out
/// channels_last; broadcast operands and numbers have no say.
template <class E>
memory_format result_memory_format(const E& e, graph& g) {
  const Shape& shape = e.shape();
  if (shape.size() != 4) return memory_format::contiguous_format;
  bool channels_last = false, other = false;
  for_each_operand_layout(e, g, [&](const Shape& operand, const Strides& strides) {
    if (operand != shape) return;
    (tessera::detail::is_channels_last_like(operand, strides) ? channels_last : other) = true;
  });
  return channels_last && !other ? memory_format::channels_last : memory_format::contiguous_format;
}

/// Records a fused node for expression `e`, producing a value of dtype T laid out in `format`
/// (preserve_format: result_memory_format's choice).
template <class T, class K, class E>
Var<T, K> bind_expression(const E& e, memory_format format = memory_format::preserve_format) {
  graph* g = graph_of(e);
  const Device device = tessera::detail::device_of(e, "autograd");
  if (format == memory_format::preserve_format) format = result_memory_format(e, *g);
  auto n = std::make_unique<fused_node<T, K, E>>(e);
  auto* raw = n.get();
  const int id = g->add_node(std::move(n), e.shape(), scalar_type_of<T>, device, format);
  raw->trace_backward(g);
  return Var<T, K>(g, id, g->values[static_cast<std::size_t>(id)].shape);
}

/// A Var for an operand of a non-elementwise op: itself, its bound expression, or a constant.
template <class X>
auto to_var(const X& x, graph* g) {
  if constexpr (is_var<X>::value) {
    return x;
  } else if constexpr (tessera::detail::symbolic_expression<X>) {
    return bind_expression<typename X::value_type, typename X::device_kind>(x);
  } else {
    static_assert(tessera::detail::is_tensor<X>::value,
                  "autograd: an operand must be a Var, an expression of Vars or a Tensor");
    using T = typename X::value_type;
    using K = typename X::device_kind;
    const int id = g->add_constant(x);
    return Var<T, K>(g, id, x.shape());
  }
}

template <class T, class K>
Var<T, K> add_view(const Var<T, K>& x, std::unique_ptr<view_node<T, K>> n, const Shape& shape,
                   const Strides& strides, std::int64_t offset) {
  graph* g = x.graph();
  const int id = g->add_view(std::move(n), shape, strides, offset);
  return Var<T, K>(g, id, shape);
}

}  // namespace tessera::autograd::detail

namespace tessera::autograd {

template <Dtype T, DeviceKind K>
template <class E>
requires tessera::detail::symbolic_expression<E> &&
    (!detail::is_var<E>::value)Var<T, K>::Var(const E& expression)
    : Var(detail::bind_expression<T, K>(expression)) {}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::view(const Shape& shape) const {
  const auto& me = info();
  const Shape target = shape.infer(numel(), "view");
  auto strides = tessera::detail::view_strides(me.shape, me.strides, target);
  if (!strides) {
    throw shape_error("view: the Var of shape " + me.shape.str() + " and strides " +
                      me.strides.str() + " cannot be viewed as " + target.str() +
                      " without a copy; use reshape");
  }
  return detail::add_view(
      *this, std::make_unique<detail::view_node<T, K>>(id(), detail::view_kind::view, target),
      target, *strides, 0);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::reshape(const Shape& shape) const {
  const auto& me = info();
  const Shape target = shape.infer(numel(), "reshape");
  if (tessera::detail::view_strides(me.shape, me.strides, target)) return view(target);
  return Var<T, K>(cast<T>(*this)).view(target);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::transpose(std::int64_t a, std::int64_t b) const {
  const auto& me = info();
  const int da = Shape::normalize_dim(a, me.shape.size(), "transpose");
  const int db = Shape::normalize_dim(b, me.shape.size(), "transpose");
  Shape shape = me.shape;
  Strides strides = me.strides;
  std::swap(shape[da], shape[db]);
  std::swap(strides[da], strides[db]);
  const bool matrix = me.shape.size() == 2;  // `me` dangles once the view is added
  auto out = detail::add_view(
      *this,
      std::make_unique<detail::view_node<T, K>>(id(), detail::view_kind::transpose, shape, da, db),
      shape, strides, 0);
  if (matrix && da != db) {
    graph_->values[static_cast<std::size_t>(out.id())].transposed_matrix = true;
  }
  return out;
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::t() const {
  if (dim() > 2) {
    throw shape_error("t: expects a Var of at most 2 dimensions, got shape " + shape_.str() +
                      "; use transpose(a, b)");
  }
  if (dim() < 2) return *this;
  return transpose(0, 1);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::permute(const Shape& dims) const {
  const auto& me = info();
  if (dims.size() != me.shape.size()) {
    throw shape_error("permute: " + std::to_string(dims.size()) +
                      " dimensions given for a Var of shape " + me.shape.str());
  }
  Shape shape, strides, order;
  std::vector<bool> seen(static_cast<std::size_t>(me.shape.size()), false);
  for (int i = 0; i < dims.size(); ++i) {
    const int d = Shape::normalize_dim(dims[i], me.shape.size(), "permute");
    if (seen[static_cast<std::size_t>(d)]) {
      throw shape_error("permute: dimension " + std::to_string(d) + " appears twice in " +
                        dims.str());
    }
    seen[static_cast<std::size_t>(d)] = true;
    shape.push_back(me.shape[d]);
    strides.push_back(me.strides[d]);
    order.push_back(d);
  }
  auto n = std::make_unique<detail::view_node<T, K>>(id(), detail::view_kind::permute, shape);
  n->permutation_ = order;
  return detail::add_view(*this, std::move(n), shape, strides, 0);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const {
  const auto& me = info();
  const int d = Shape::normalize_dim(dim, me.shape.size(), "narrow");
  const std::int64_t extent = me.shape[d];
  const std::int64_t first = start < 0 ? start + extent : start;
  if (first < 0 || first > extent || length < 0 || first + length > extent) {
    throw shape_error("narrow: start " + std::to_string(start) + " and length " +
                      std::to_string(length) + " are out of range for dimension " +
                      std::to_string(d) + " of shape " + me.shape.str());
  }
  Shape shape = me.shape;
  shape[d] = length;
  return detail::add_view(*this,
                          std::make_unique<detail::view_node<T, K>>(id(), detail::view_kind::narrow,
                                                                    shape, d, first, length),
                          shape, me.strides, first * me.strides[d]);
}

template <Dtype T, DeviceKind K>
std::vector<Var<T, K>> Var<T, K>::split(std::int64_t split_size, std::int64_t dim) const {
  const int d = Shape::normalize_dim(dim, shape_.size(), "split");
  if (split_size <= 0) {
    throw shape_error("split: split_size must be positive, got " + std::to_string(split_size));
  }
  std::vector<Var> pieces;
  for (std::int64_t start = 0; start < shape_[d]; start += split_size) {
    pieces.push_back(narrow(d, start, std::min(split_size, shape_[d] - start)));
  }
  return pieces;
}

template <Dtype T, DeviceKind K>
std::vector<Var<T, K>> Var<T, K>::chunk(std::int64_t chunks, std::int64_t dim) const {
  if (chunks <= 0)
    throw shape_error("chunk: chunks must be positive, got " + std::to_string(chunks));
  const int d = Shape::normalize_dim(dim, shape_.size(), "chunk");
  return split(std::max<std::int64_t>(1, (shape_[d] + chunks - 1) / chunks), d);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::unsqueeze(std::int64_t dim) const {
  Shape shape = shape_;
  const int d = Shape::normalize_dim(dim, shape_.size() + 1, "unsqueeze");
  shape.insert(d, 1);
  return view(shape);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::squeeze(std::int64_t dim) const {
  const int d = Shape::normalize_dim(dim, shape_.size(), "squeeze");
  if (shape_[d] != 1) return *this;
  Shape shape = shape_;
  shape.erase(d);
  return view(shape);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::flatten(std::int64_t start, std::int64_t end) const {
  if (dim() == 0) return reshape({1});
  const int s = Shape::normalize_dim(start, shape_.size(), "flatten");
  const int e = Shape::normalize_dim(end, shape_.size(), "flatten");
  if (s > e) throw shape_error("flatten: start dimension comes after end dimension");
  Shape shape;
  for (int d = 0; d < s; ++d) shape.push_back(shape_[d]);
  std::int64_t merged = 1;
  for (int d = s; d <= e; ++d) merged *= shape_[d];
  shape.push_back(merged);
  for (int d = e + 1; d < shape_.size(); ++d) shape.push_back(shape_[d]);
  return reshape(shape);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::to(int index) const {
  const Device target = resolve_device<K>(index);
  if (target == device()) return *this;
  detail::graph* g = graph_;
  auto n = std::make_unique<detail::copy_node<T, K>>(id_, shape_);
  const int out = g->add_node(std::move(n), shape_, scalar_type_of<T>, target);
  return Var(g, out, shape_);
}

template <Dtype T, DeviceKind K>
template <DeviceKind K2>
Var<T, K2> Var<T, K>::to(int index) const {
  if constexpr (std::is_same_v<K, K2>) {
    return to(index);
  } else {
    const Device target = resolve_device<K2>(index);
    auto n = std::make_unique<detail::copy_node<T, K, K2>>(id_, shape_);
    const int out = graph_->add_node(std::move(n), shape_, scalar_type_of<T>, target);
    return Var<T, K2>(graph_, out, shape_);
  }
}

/// Uniform random numbers in [0, 1) of `x`'s dtype (floating), shape and device, drawn anew at
/// every forward (a traced ts::rand: dropout masks).
template <class X>
requires tessera::detail::symbolic_expression<X>
auto rand_like(const X& x) {
  using T = tessera::detail::floating_of<typename X::value_type>;
  using K = typename X::device_kind;
  detail::graph* g = detail::graph_of(x);
  const Device device = tessera::detail::device_of(x, "rand_like");
  const int id = g->add_node(std::make_unique<detail::rand_node<T, K>>(), x.shape(),
                             scalar_type_of<T>, device);
  return Var<T, K>(g, id, x.shape());
}

namespace detail {
/// on_forward's node, returned so that the library can say its effect may be replayed by a CUDA
/// graph (effect_node::set_capture_blocker).
template <class Fn, class... Vs>
effect_node& record_effect(Fn effect, const Vs&... vars) {
  static_assert(sizeof...(Vs) > 0, "on_forward: give at least one Var");
  graph* g = std::get<0>(std::tie(vars...)).graph();
  std::vector<int> ids{vars.id()...};
  auto call = [effect = std::move(effect), vars...](const value_table& table) mutable {
    effect(table.template get<typename Vs::value_type, typename Vs::device_kind>(vars.id())...);
  };
  const Device device = std::get<0>(std::tie(vars...)).device();
  auto node = std::make_unique<effect_node>(std::move(ids), std::move(call));
  effect_node& recorded = *node;
  g->add_node(std::move(node), Shape{0}, ScalarType::float32, device);
  return recorded;
}
}  // namespace detail

/// Calls `effect(tensors...)` with the current tensors of `vars` at every forward, after they are
/// computed (e.g. BatchNorm's running statistics); it takes no part in backward. A program with
/// such an effect runs without CUDA graphs (Options::cuda_graph): a replay would skip it.
template <class Fn, class... Vs>
void on_forward(Fn effect, const Vs&... vars) {
  detail::record_effect(std::move(effect), vars...);
}

}  // namespace tessera::autograd

namespace tessera {

/// Traced reductions, softmax and matmul: the same names as for tensors.
namespace autograd::detail {
template <class E>
using var_of = Var<typename E::value_type, typename E::device_kind>;

template <class Out, bool Mean, class E>
auto record_reduce(const E& e, int dim, bool keepdim) {
  using K = typename E::device_kind;
  graph* g = graph_of(e);
  const Device device = tessera::detail::device_of(e, Mean ? "mean" : "sum");
  Shape shape = dim < 0 ? Shape{} : tessera::detail::reduced_shape(e.shape(), dim, keepdim);
  auto n = std::make_unique<reduce_node<Out, K, E, Mean>>(e, dim, keepdim);
  auto* raw = n.get();
  const int id = g->add_node(std::move(n), shape, scalar_type_of<Out>, device);
  raw->trace_backward(g);
  return Var<Out, K>(g, id, shape);
}

template <bool Max, class E>
auto record_extremum(const E& e, std::int64_t dim, bool keepdim, bool full) {
  using T = typename E::value_type;
  using K = typename E::device_kind;
  graph* g = graph_of(e);
  const auto x = to_var(e, g);
  const char* name = Max ? "max" : "min";
  if (x.numel() == 0) tessera::detail::throw_empty_reduction(name, x.shape());
  const int d = full ? -1 : tessera::detail::reduction_dim(x.shape(), dim, name);
  const Shape shape = full ? Shape{} : tessera::detail::reduced_shape(x.shape(), d, keepdim);
  auto n = std::make_unique<extremum_node<T, K, Max>>(x.id(), x.shape(), x.dim() == 0 ? -1 : d);
  const int id = g->add_node(std::move(n), shape, scalar_type_of<T>, x.device());
  return Var<T, K>(g, id, shape);
}

template <bool Log, class E>
auto record_softmax(const E& e, std::int64_t dim) {
  using T = tessera::detail::floating_of<typename E::value_type>;
  using K = typename E::device_kind;
  graph* g = graph_of(e);
  const Var<T, K> x = [&] {
    if constexpr (std::is_same_v<typename E::value_type, T>) {
      return to_var(e, g);
    } else {
      return Var<T, K>(cast<T>(e));
    }
  }();
  const int d = tessera::detail::reduction_dim(x.shape(), dim, Log ? "log_softmax" : "softmax");
  auto n = std::make_unique<softmax_node<T, K, Log>>(x.id(), x.shape(), d);
  const int id = g->add_node(std::move(n), x.shape(), scalar_type_of<T>, x.device());
  return Var<T, K>(g, id, x.shape());
}
}  // namespace autograd::detail

template <class E>
requires detail::symbolic_expression<E>
auto sum(const E& e) {
  return autograd::detail::record_reduce<detail::sum_result_t<typename E::value_type>, false>(
      e, -1, false);
}
template <class E>
requires detail::symbolic_expression<E>
auto sum(const E& e, std::int64_t dim, bool keepdim = false) {
  if (e.shape().size() == 0) return sum(e);
  const int d = detail::reduction_dim(e.shape(), dim, "sum");
  return autograd::detail::record_reduce<detail::sum_result_t<typename E::value_type>, false>(
      e, d, keepdim);
}
template <class E>
requires detail::symbolic_expression<E>
auto mean(const E& e) {
  static_assert(is_floating_point_v<typename E::value_type>,
                "mean: the input is not floating point; cast first, e.g. mean(ts::cast<float>(x))");
  return autograd::detail::record_reduce<typename E::value_type, true>(e, -1, false);
}
template <class E>
requires detail::symbolic_expression<E>
auto mean(const E& e, std::int64_t dim, bool keepdim = false) {
  static_assert(is_floating_point_v<typename E::value_type>,
                "mean: the input is not floating point; cast first, e.g. mean(ts::cast<float>(x))");
  if (e.shape().size() == 0) return mean(e);
  const int d = detail::reduction_dim(e.shape(), dim, "mean");
  return autograd::detail::record_reduce<typename E::value_type, true>(e, d, keepdim);
}
// max and min of everything (0-dim) or along a dim; the gradient goes to the extreme elements.
#define TESSERA_TRACED_EXTREMUM(name, is_max)                                                    \
  template <class E>                                                                             \
  requires detail::symbolic_expression<E>                                                        \
  auto name(const E& e) { return autograd::detail::record_extremum<is_max>(e, 0, false, true); } \
  template <class E>                                                                             \
  requires detail::symbolic_expression<E>                                                        \
  auto name(const E& e, std::int64_t dim, bool keepdim = false) {                                \
    return autograd::detail::record_extremum<is_max>(e, dim, keepdim, false);                    \
  }
TESSERA_TRACED_EXTREMUM(max, true)
TESSERA_TRACED_EXTREMUM(min, false)
#undef TESSERA_TRACED_EXTREMUM

template <class E>
requires detail::symbolic_expression<E>
auto softmax(const E& e, std::int64_t dim) {
  return autograd::detail::record_softmax<false>(e, dim);
}
template <class E>
requires detail::symbolic_expression<E>
auto log_softmax(const E& e, std::int64_t dim) {
  return autograd::detail::record_softmax<true>(e, dim);
}

/// matmul of Vars (or expressions of Vars, bound first; a Tensor operand is a constant).
template <class A, class B>
requires(detail::symbolic_expression<A> || detail::symbolic_expression<B>) auto matmul(const A& a,
                                                                                       const B& b) {
  autograd::detail::graph* g = [&] {
    if constexpr (detail::symbolic_expression<A>) {
      return autograd::detail::graph_of(a);
    } else {
      return autograd::detail::graph_of(b);
    }
  }();
  const auto va = autograd::detail::to_var(a, g);
  const auto vb = autograd::detail::to_var(b, g);
  using TA = typename decltype(va)::value_type;
  using TB = typename decltype(vb)::value_type;
  using K = typename decltype(va)::device_kind;
  static_assert(std::is_same_v<K, typename decltype(vb)::device_kind>,
                "matmul: the operands are on different device kinds (cpu and cuda); move one "
                "with .to<tessera::cuda>(i) or .to<tessera::cpu>(i) first");
  static_assert(std::is_same_v<TA, TB>, "matmul: both operands must have the same dtype");
  const Shape out_shape = detail::matmul_result_shape(va.shape(), vb.shape());
  if (va.device() != vb.device()) {
    throw device_mismatch_error("matmul: expected both operands on the same device, got " +
                                va.device().str() + " and " + vb.device().str());
  }
  const bool batched_a = va.dim() == 3, batched_b = vb.dim() == 3;
  if ((batched_a && batched_b && va.size(0) != vb.size(0)) || (!batched_a && batched_b)) {
    throw shape_error(
        "matmul: autograd supports [m, k] x [k, n], [B, m, k] x [B, k, n] and "
        "[B, m, k] x [k, n]; got " +
        va.shape().str() + " and " + vb.shape().str());
  }
  if (batched_a && !batched_b && vb.info().requires_grad &&
      !tessera::detail::view_strides(va.shape(), va.info().strides,
                                     Shape{va.size(0) * va.size(1), va.size(2)})) {
    throw shape_error("matmul: the batched left operand of shape " + va.shape().str() +
                      " must be viewable as a matrix for the shared right operand's gradient; "
                      "use reshape or contiguous layouts");
  }
  // A transposed matrix operand is read through its base (see matmul_node).
  auto unwrap = [&](const auto& v) {
    const auto& info = v.info();
    if (info.role == autograd::detail::value_role::view && info.transposed_matrix) {
      return std::pair{info.base, true};
    }
    return std::pair{v.id(), false};
  };
  const auto [ida, ta] = unwrap(va);
  const auto [idb, tb] = unwrap(vb);
  auto n = std::make_unique<autograd::detail::matmul_node<TA, K>>(
      ida, ta, idb, tb, g->values[static_cast<std::size_t>(ida)].shape,
      g->values[static_cast<std::size_t>(idb)].shape);
  const int id = g->add_node(std::move(n), out_shape, scalar_type_of<TA>, va.device());
  return autograd::Var<TA, K>(g, id, out_shape);
}

/// cat of Vars along `dim`.
template <Dtype T, DeviceKind K>
autograd::Var<T, K> cat(const std::vector<autograd::Var<T, K>>& vars, std::int64_t dim = 0) {
  if (vars.empty()) throw shape_error("cat: expects at least one Var");
  autograd::detail::graph* g = vars[0].graph();
  const Shape& first = vars[0].shape();
  const int d = Shape::normalize_dim(dim, first.size(), "cat");
  Shape out = first;
  out[d] = 0;
  std::vector<int> ids;
  std::vector<std::int64_t> sizes;
  for (const auto& v : vars) {
    if (v.graph() != g) throw error("cat: the Vars belong to different traces");
    if (v.device() != vars[0].device()) {
      throw device_mismatch_error("cat: Vars on different devices, " + vars[0].device().str() +
                                  " and " + v.device().str());
    }
    for (int k = 0; k < first.size(); ++k) {
      if (k != d && (v.dim() != first.size() || v.shape()[k] != first[k])) {
        throw shape_error("cat: shapes " + first.str() + " and " + v.shape().str() +
                          " differ outside dimension " + std::to_string(d));
      }
    }
    out[d] += v.shape()[d];
    ids.push_back(v.id());
    sizes.push_back(v.shape()[d]);
  }
  auto n = std::make_unique<autograd::detail::cat_node<T, K>>(ids, sizes, d);
  const int id = g->add_node(std::move(n), out, scalar_type_of<T>, vars[0].device());
  return autograd::Var<T, K>(g, id, out);
}

}  // namespace tessera
