// Var<T, Kind>: a symbolic tensor. Tracing a function of Vars records a graph of values and nodes
// (nothing is computed); autograd/program.hpp compiles that graph into a Program with a memory
// plan. A Var is also an expression leaf, so `a * b + c` of Vars builds the same lazy expression
// tree as for tensors; binding it (to a Var, or as the operand of a non-elementwise op) records
// one fused node that keeps the expression's type.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/parameter.hpp"
#include "tessera/core/memory_format.hpp"
#include "tessera/expr/node.hpp"
#include "tessera/tensor/any_tensor.hpp"

namespace tessera::autograd {

template <Dtype T, DeviceKind K = cpu>
class Var;

/// Training keeps what backward needs; inference keeps nothing for backward (a smaller plan).
enum class Mode { training, inference };

/// A product a program hands to its caller (Program::on_parameter_product): the contribution
/// target (+)= x @ y of a matmul's backward to the gradient of parameter `index`, the
/// parameter's only contribution; `accumulate`: add into target (else overwrite it).
struct ParameterProduct {
  std::size_t index = 0;
  AnyTensor target, x, y;
  bool accumulate = false;
};

namespace detail {

using tessera::detail::symbolic_expression;

/// What a value is.
enum class value_role {
  input,      // bound to forward's arguments
  parameter,  // bound to a parameter slot's value
  constant,   // a tensor captured while tracing
  computed,   // written by a node into the arena
  view,       // shares the storage of another value (its base)
  gradient,   // the gradient of a computed or view value (arena)
  parameter_gradient  // a parameter slot's grad (outside the arena)
};

struct value_info {
  Shape shape;
  // Dense (contiguous or channels_last) except for views and bound tensors' own; an arena value
  // or gradient is laid out by these strides in its block.
  Strides strides;
  std::int64_t offset = 0;  // views: element offset from the base's first element
  ScalarType dtype = ScalarType::float32;
  Device device;
  value_role role = value_role::computed;
  int producer = -1;  // node writing it (computed, view)
  int base = -1;      // view: the value it views; gradients: the value they are the gradient of
  int grad = -1;      // the id of this value's gradient, when it has one
  bool requires_grad = false;
  bool transposed_matrix = false;  // a view that is exactly base.t() of a 2-D base
  std::string name;

  std::size_t bytes() const {
    return static_cast<std::size_t>(shape.numel()) * element_size(dtype);
  }
  /// channels_last for a 4-d value laid out channels_last (dense or not; ambiguous layouts count
  /// as contiguous), contiguous_format otherwise: Tensor::suggest_memory_format's rule.
  memory_format suggest_memory_format() const {
    return tessera::detail::is_channels_last_like(shape, strides)
               ? memory_format::channels_last
               : memory_format::contiguous_format;
  }
};

/// The dense strides of `shape` in `format`: channels_last only for a 4-d shape, the contiguous
/// ones otherwise.
inline Strides dense_strides(const Shape& shape, memory_format format) {
  if (format == memory_format::channels_last && shape.size() == 4) {
    return tessera::detail::strides_for(shape, format, "autograd");
  }
  return shape.contiguous_strides();
}

class value_table;

/// Binding of a parameter slot, type-erased.
struct parameter_binding {
  std::shared_ptr<void> slot;  // keeps the slot alive
  const void* identity = nullptr;
  std::function<AnyTensor()> value;
  // The slot's grad for a backward, created when undefined, and whether it is zero unwritten
  // (created, or after zero_grad): then the first contribution writes it, and written() says so.
  std::function<std::pair<AnyTensor, bool>()> grad_for_backward;
  std::function<void()> written;
  std::function<bool()> has_grad;
  // Undoes a failed backward's effect on the slot: `created` (the slot had no gradient before):
  // no gradient again; else zero unwritten again (the values, when there were some, are copied
  // back by the program).
  std::function<void(bool created)> unwrite;
  // Options::gradients_in_arena, called with `slot`: makes `grad` (a buffer of the program's
  // arena, of the parameter's dtype, device, shape and layout) the slot's gradient, zero
  // unwritten; and lets go of a gradient that is zero unwritten (the slot has none after).
  // Function pointers: nothing more for a user's unit to instantiate per parameter type.
  void (*adopt_grad)(void* slot, const AnyTensor& grad) = nullptr;
  void (*drop_zero_grad)(void* slot) = nullptr;
  int value_id = -1;
};

/// A recorded operation. Nodes read their inputs from and write their output to a value_table.
class node {
 public:
  // TESSERA_API (inline) header-only, so that no unit takes the destructor as node's key function
  // and emits the vtable; in compiled mode the library holds both.
  TESSERA_API virtual ~node();
  virtual const char* name() const = 0;
  /// Computes the output from the inputs.
  virtual void forward(value_table& table) = 0;
  /// True when the output is a view of inputs[0] (no buffer of its own).
  virtual bool is_view() const { return false; }
  /// Called once tracing is over: builds what backward needs for the inputs that require grad.
  virtual void finalize(const std::vector<value_info>& values) { (void)values; }
  /// The values whose gradients backward writes, in the order it writes them (repeats allowed).
  virtual std::vector<int> contributions() const { return {}; }
  /// Forward values and gradients backward reads (so they are kept alive until then).
  virtual std::vector<int> backward_reads() const { return {}; }
  /// Scratch bytes backward needs for the duration of the step.
  virtual std::size_t backward_scratch() const { return 0; }
  /// Scratch bytes forward (and its recomputation) needs for the duration of the step.
  virtual std::size_t forward_scratch() const { return 0; }
  /// Adds this node's contributions to its inputs' gradients; `accumulate[i]` tells contribution
  /// i whether its gradient already holds something (add) or not (overwrite).
  virtual void backward(value_table& table, const std::vector<char>& accumulate) {
    (void)table;
    (void)accumulate;
  }
  /// An input whose buffer the output may take over when it dies here (elementwise, same shape).
  virtual std::vector<int> inplace_candidates() const { return {}; }
  /// True when backward writes its last contribution's gradient elementwise from the output's
  /// gradient (same shape, same element size, read at the same index) after every other read of
  /// it: that gradient may then take over the output gradient's buffer when it dies here.
  virtual bool backward_in_place() const { return false; }
  /// The value on whose device the scratch lives.
  virtual int scratch_value() const { return output; }
  /// False for nodes that must run once per forward (random numbers, side effects): checkpointing
  /// keeps their outputs instead of recomputing them.
  virtual bool recomputable() const { return true; }
  /// True for nodes that only act on the world (running statistics): Program::recompute skips them.
  virtual bool is_effect() const { return false; }
  /// Why a CUDA graph cannot replay this node's forward (Options::cuda_graph), or nullptr when it
  /// can: a replay runs only the kernels captured once, none of the node's host code.
  virtual const char* capture_blocker() const { return nullptr; }
  /// Before a CUDA graph of the forward is captured or replayed: the host's checks of the inputs
  /// that forward makes by reading device values (which a capture cannot), and the choices of
  /// kernels that depend on them or on host state. Returns a key of those choices: a replay needs
  /// the key of the capture, else the program captures again. Throws as forward would, before
  /// anything runs.
  virtual std::int64_t prepare_replay(value_table& table) {
    (void)table;
    return 0;
  }

  /// An elementwise node a matrix product before it can apply as its epilogue (cuBLASLt's bias
  /// and ReLU epilogues on CUDA): `operand` + `bias` (bias a row vector, added to every row),
  /// then ReLU when `relu`; or ReLU alone of `operand` (bias -1). operand -1: not one.
  struct epilogue_form {
    int operand = -1;
    int bias = -1;
    bool relu = false;
  };
  virtual epilogue_form epilogue() const { return {}; }
  /// For a matrix product whose output the following elementwise nodes take over (in place):
  /// adds `bias` to its rows (bias < 0: none) and then applies ReLU (`relu`) as part of its
  /// forward, when it can. False when this node cannot (the plan then folds nothing).
  virtual bool take_epilogue(int bias, bool relu) {
    (void)bias;
    (void)relu;
    return false;
  }
  /// True when the last forward applied the epilogue take_epilogue agreed to (a product whose
  /// library call declined falls back to the plain product, and the folded nodes run).
  virtual bool epilogue_applied() const { return false; }

  std::vector<int> inputs;
  int output = -1;
  /// The product whose epilogue does this elementwise node's work (the plan's fold,
  /// memory_plan.hpp): forward skips it when that product applied it. Null: not folded.
  const node* folded_into = nullptr;
};

/// The run-time tensors of a program's values. A gradient is looked up by the value it belongs to.
class value_table {
 public:
  // Program::on_parameter_product's hook (empty: none); [gradient value id] -> the parameter
  // whose gradient it is when one step contributes to it, else -1 (the products the hook is
  // offered; set by the program's schedule); [parameter]: the hook took its product in this
  // backward (cleared when each backward starts).
  std::function<bool(tessera::autograd::ParameterProduct& product)> product_hook;
  std::vector<int> product_parameter;
  std::vector<char> product_taken;
  /// Offers the product target (+)= x @ y, a contribution to the gradient of `value`, to the
  /// program's hook when it is a parameter's only contribution; false: the caller computes it.
  template <class T, class K>
  bool hand_over_product(int value, const Tensor<T, K>& target, const Tensor<T, K>& x,
                         const Tensor<T, K>& y, bool accumulate) {
    if (!product_hook) return false;
    const int gradient = grad_of[static_cast<std::size_t>(value)];
    const int p = gradient < 0 ? -1 : product_parameter[static_cast<std::size_t>(gradient)];
    if (p < 0) return false;
    tessera::autograd::ParameterProduct product{static_cast<std::size_t>(p), target, x, y,
                                                accumulate};
    if (!product_hook(product)) return false;
    product_taken[static_cast<std::size_t>(p)] = 1;
    return true;
  }
  std::vector<AnyTensor> tensors;
  std::vector<int> grad_of;   // value id -> gradient value id (-1: none)
  // The current step's scratch: bytes [scratch_begin, scratch_end) of the arena `scratch`;
  // scratch_offset is where the next scratch tensor goes.
  Storage scratch;
  std::int64_t scratch_begin = 0;
  std::int64_t scratch_end = 0;
  std::int64_t scratch_offset = 0;
  /// True while the program captures a CUDA graph of its steps: nodes then skip the checks they
  /// made in prepare_replay (which read device values on the host) and keep its choices.
  bool capturing = false;

  const AnyTensor& value(int id) const { return tensors[static_cast<std::size_t>(id)]; }
  const AnyTensor& gradient(int id) const {
    return tensors[static_cast<std::size_t>(grad_of[static_cast<std::size_t>(id)])];
  }
  template <class T, class K>
  Tensor<T, K> typed(const AnyTensor& t, const Shape& shape) const {
    Tensor<T, K> typed(t.storage(), t.shape(), t.strides(), t.storage_offset());
    if (typed.shape() != shape) return typed.view(shape);
    return typed;
  }
  template <class T, class K>
  Tensor<T, K> get(int id, const Shape& shape, bool is_grad) const {
    return typed<T, K>(is_grad ? gradient(id) : value(id), shape);
  }
  template <class T, class K>
  Tensor<T, K> get(int id) const {
    const AnyTensor& t = value(id);
    return Tensor<T, K>(t.storage(), t.shape(), t.strides(), t.storage_offset());
  }
  template <class T, class K>
  Tensor<T, K> grad(int id) const {
    const AnyTensor& t = gradient(id);
    return Tensor<T, K>(t.storage(), t.shape(), t.strides(), t.storage_offset());
  }
  /// A contiguous scratch tensor of `shape` carved from the step's scratch bytes.
  template <class T, class K>
  Tensor<T, K> scratch_tensor(const Shape& shape) {
    constexpr std::int64_t align = 64;
    const std::int64_t start = (scratch_offset + align - 1) / align * align;
    const std::int64_t bytes = shape.numel() * static_cast<std::int64_t>(sizeof(T));
    if (start + bytes > scratch_end) {
      throw error("autograd: internal error: a node asked for more scratch than it planned");
    }
    scratch_offset = start + bytes;
    return Tensor<T, K>(scratch, shape, shape.contiguous_strides(),
                        start / static_cast<std::int64_t>(sizeof(T)));
  }
};

/// Scratch bytes for a tensor of `shape` and dtype T, as scratch_tensor carves them.
template <class T>
std::size_t scratch_bytes(const Shape& shape) {
  return static_cast<std::size_t>(shape.numel()) * sizeof(T) + 64;
}

/// The graph being traced: values and nodes, in the order they were recorded.
class graph {
 public:
  std::vector<value_info> values;
  std::vector<std::unique_ptr<node>> nodes;
  std::vector<parameter_binding> parameters;
  std::vector<AnyTensor> constants;  // by value id (undefined for others)

  int add_value(value_info info);
  /// Records `n` producing a new value of dtype `dtype` and `shape` on `device`, dense in `format`
  /// (channels_last applies to 4-d shapes only; others are contiguous).
  int add_node(std::unique_ptr<node> n, const Shape& shape, ScalarType dtype, Device device,
               memory_format format = memory_format::contiguous_format);
  /// Records a view node: its output shares the storage of inputs[0].
  int add_view(std::unique_ptr<node> n, const Shape& shape, const Strides& strides,
               std::int64_t offset);
  /// A tensor captured while tracing, used by a node (not by an expression, which holds it).
  template <class T, class K>
  int add_constant(const Tensor<T, K>& tensor) {
    if (!tensor.defined()) throw error("autograd: an operand is an undefined tensor");
    value_info info;
    info.shape = tensor.shape();
    info.strides = tensor.strides();
    info.dtype = scalar_type_of<T>;
    info.device = tensor.device();
    info.role = value_role::constant;
    info.name = "constant";
    const int id = add_value(std::move(info));
    constants[static_cast<std::size_t>(id)] = tensor;
    return id;
  }
  /// The value of parameter `slot`, recorded once however often it is used.
  template <class T, class K>
  int add_parameter(const std::shared_ptr<parameter_slot<T, K>>& slot) {
    if (!slot) throw error("autograd: a parameter handle is empty");
    for (const auto& p : parameters) {
      if (p.identity == slot.get()) return p.value_id;
    }
    if (!slot->value.defined()) throw error("autograd: a parameter has no value (undefined tensor)");
    value_info info;
    info.shape = slot->value.shape();
    // A parameter made channels_last (Module::to) is traced as it is laid out.
    const bool channels_last = slot->value.is_contiguous(memory_format::channels_last) &&
                               slot->value.suggest_memory_format() == memory_format::channels_last;
    info.strides = dense_strides(info.shape, channels_last ? memory_format::channels_last
                                                           : memory_format::contiguous_format);
    info.dtype = scalar_type_of<T>;
    info.device = slot->value.device();
    info.role = value_role::parameter;
    info.requires_grad = slot->requires_grad && is_floating_point_v<T>;
    info.name = "parameter " + std::to_string(parameters.size());
    parameter_binding binding;
    binding.slot = slot;
    binding.identity = slot.get();
    parameter_slot<T, K>* raw = slot.get();
    binding.value = [raw]() -> AnyTensor { return raw->value; };
    binding.grad_for_backward = [raw]() -> std::pair<AnyTensor, bool> {
      if (!raw->grad.defined()) {
        // Laid out as the parameter is (PyTorch's rule for a new .grad).
        raw->grad = Tensor<T, K>::empty_on(raw->value.shape(), raw->value.device(),
                                           raw->value.suggest_memory_format());
        raw->grad_zero = true;
      }
      return {raw->grad, raw->grad_zero};
    };
    binding.written = [raw] { raw->grad_zero = false; };
    binding.has_grad = [raw] { return raw->grad.defined(); };
    binding.unwrite = [raw](bool created) {
      if (created) raw->grad = Tensor<T, K>{};
      raw->grad_zero = !created;
    };
    binding.adopt_grad = [](void* s, const AnyTensor& grad) {
      auto* typed = static_cast<parameter_slot<T, K>*>(s);
      typed->grad = grad.as<T, K>();
      typed->grad_zero = true;
    };
    binding.drop_zero_grad = [](void* s) {
      auto* typed = static_cast<parameter_slot<T, K>*>(s);
      if (!typed->grad_zero) return;
      typed->grad = Tensor<T, K>{};
      typed->grad_zero = false;
    };
    binding.value_id = add_value(std::move(info));
    parameters.push_back(std::move(binding));
    return parameters.back().value_id;
  }
};

template <class X>
struct is_var : std::false_type {};
template <class T, class K>
struct is_var<Var<T, K>> : std::true_type {};

#if TESSERA_DEFINITIONS
// Not `= default`: nvcc would make it the key function (config.hpp).
TESSERA_API node::~node() {}

TESSERA_API int graph::add_value(value_info info) {
  values.push_back(std::move(info));
  constants.emplace_back();
  return static_cast<int>(values.size()) - 1;
}

TESSERA_API int graph::add_node(std::unique_ptr<node> n, const Shape& shape, ScalarType dtype,
                                Device device, memory_format format) {
  value_info info;
  info.shape = shape;
  info.strides = dense_strides(shape, format);
  info.dtype = dtype;
  info.device = device;
  info.role = value_role::computed;
  info.producer = static_cast<int>(nodes.size());
  for (int input : n->inputs) {
    if (values[static_cast<std::size_t>(input)].requires_grad) info.requires_grad = true;
  }
  if (!is_floating_point(dtype)) info.requires_grad = false;
  const int id = add_value(std::move(info));
  n->output = id;
  nodes.push_back(std::move(n));
  return id;
}

TESSERA_API int graph::add_view(std::unique_ptr<node> n, const Shape& shape, const Strides& strides,
                                std::int64_t offset) {
  const value_info& base = values[static_cast<std::size_t>(n->inputs[0])];
  value_info info;
  info.shape = shape;
  info.strides = strides;
  info.offset = base.offset + offset;
  info.dtype = base.dtype;
  info.device = base.device;
  info.role = value_role::view;
  info.producer = static_cast<int>(nodes.size());
  info.base = n->inputs[0];
  info.requires_grad = base.requires_grad;
  const int id = add_value(std::move(info));
  n->output = id;
  nodes.push_back(std::move(n));
  return id;
}
#endif  // TESSERA_DEFINITIONS

/// The graph of the first Var leaf of a symbolic expression.
template <class E>
graph* graph_of(const E& e);

}  // namespace detail

/// A symbolic tensor of dtype T on a device of kind K: a value of a traced graph. The operators and
/// functions of tensors apply; nothing is computed until the compiled Program runs.
template <Dtype T, DeviceKind K>
class Var {
 public:
  // The expression-leaf interface (expr/node.hpp): Vars are leaves of symbolic expressions.
  using expression_node_tag = void;
  using value_type = T;
  using device_kind = K;
  using evaluator_type = backend::leaf_evaluator<T>;
  static constexpr int leaf_count = 1;
  static constexpr bool is_scalar = false;
  static constexpr bool is_symbolic = true;

  /// An empty Var (belongs to no graph).
  Var() = default;
  /// Value `id` of `graph`; `is_grad` reads the value's gradient instead; `shape` is how the
  /// value is read (its own shape, or a view of it with the same elements).
  Var(detail::graph* graph, int id, Shape shape, bool is_grad = false)
      : graph_(graph), id_(id), shape_(std::move(shape)), is_grad_(is_grad) {}
  /// Binds a symbolic expression: records one fused node computing it (values converted to T).
  /// Defined in autograd/ops.hpp.
  template <class E>
    requires tessera::detail::symbolic_expression<E> && (!detail::is_var<E>::value)
  Var(const E& expression);  // NOLINT: implicit, as Tensor's

  bool defined() const noexcept { return graph_ != nullptr; }
  detail::graph* graph() const noexcept { return graph_; }
  int id() const noexcept { return id_; }
  bool is_grad() const noexcept { return is_grad_; }

  const Shape& shape() const noexcept { return shape_; }
  int dim() const noexcept { return shape_.size(); }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::int64_t size(std::int64_t dim) const {
    return shape_[shape_.normalize_dim(dim, "size")];
  }
  Device device() const { return info().device; }
  int device_index() const { return device().index; }
  const detail::value_info& info() const {
    if (!graph_) throw error("autograd: the Var is empty (default-constructed)");
    return graph_->values[static_cast<std::size_t>(id_)];
  }

  /// Expression-leaf interface: records this leaf's device or throws device_mismatch_error.
  void check_device(std::optional<Device>& device, const char* operation) const {
    tessera::detail::merge_device(device, this->device(), operation);
  }

  // Views and copies: defined in autograd/ops.hpp.
  Var view(const Shape& shape) const;
  Var reshape(const Shape& shape) const;
  Var transpose(std::int64_t a, std::int64_t b) const;
  Var t() const;
  Var permute(const Shape& dims) const;
  Var narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  std::vector<Var> split(std::int64_t split_size, std::int64_t dim = 0) const;
  std::vector<Var> chunk(std::int64_t chunks, std::int64_t dim = 0) const;
  Var unsqueeze(std::int64_t dim) const;
  Var squeeze(std::int64_t dim) const;
  Var flatten(std::int64_t start = 0, std::int64_t end = -1) const;
  /// A differentiable copy to ordinal `index` of the same kind (model parallelism).
  Var to(int index) const;
  /// A differentiable copy to ordinal `index` (-1: the current one) of kind K2, e.g.
  /// `h.to<ts::cuda>(0)` inside a CPU program: a model split between the host and a GPU. The
  /// gradient is copied back; host <-> device copies wait for their stream.
  template <DeviceKind K2>
  Var<T, K2> to(int index = -1) const;

 private:
  detail::graph* graph_ = nullptr;
  int id_ = -1;
  Shape shape_;
  bool is_grad_ = false;
};

/// A placeholder for an input of a compiled function: dtype T, device kind K, a shape and an
/// ordinal. `requires_grad`: backward also computes the gradient with respect to this input
/// (Program::input_grad; floating dtypes only), as for a stage of a pipeline. `memory_format`:
/// the layout the program is traced for (channels_last: a 4-d input laid out NHWC, so that the
/// layers after it keep NHWC; its gradient is NHWC too). A tensor bound in another layout is
/// still read through its own strides (layers that need a dense layout copy it).
template <Dtype T, DeviceKind K = cpu>
struct input_spec {
  using value_type = T;
  using device_kind = K;
  Shape shape;
  int device = 0;
  bool requires_grad = false;
  tessera::memory_format memory_format = tessera::memory_format::contiguous_format;
};

/// input<float>({32, 784}): an input of that dtype, shape and device;
/// input<float>({32, 3, 224, 224}, 0, ts::memory_format::channels_last): an NHWC image batch
/// (channels_last needs a 4-d shape: compile throws shape_error otherwise).
template <Dtype T, DeviceKind K = cpu>
input_spec<T, K> input(const Shape& shape, int device = 0,
                       tessera::memory_format format = tessera::memory_format::contiguous_format) {
  return input_spec<T, K>{shape, device, false, format};
}

/// The Var of a parameter slot in the graph that `like` (a Var or a symbolic expression) belongs
/// to; recorded once per slot.
template <class T, class K, class X>
  requires tessera::detail::symbolic_expression<X>
Var<T, K> parameter(const std::shared_ptr<parameter_slot<T, K>>& slot, const X& like) {
  detail::graph* g = detail::graph_of(like);
  const int id = g->add_parameter(slot);
  return Var<T, K>(g, id, g->values[static_cast<std::size_t>(id)].shape);
}

namespace detail {

template <class E>
graph* graph_of(const E& e) {
  if constexpr (is_var<E>::value) {
    if (!e.graph()) throw error("autograd: an operand is an empty Var");
    return e.graph();
  } else if constexpr (requires { e.operand; }) {
    return graph_of(e.operand);
  } else if constexpr (requires { e.condition; }) {
    if constexpr (std::remove_cvref_t<decltype(e.condition)>::is_symbolic) {
      return graph_of(e.condition);
    } else if constexpr (std::remove_cvref_t<decltype(e.left)>::is_symbolic) {
      return graph_of(e.left);
    } else {
      return graph_of(e.right);
    }
  } else {
    if constexpr (std::remove_cvref_t<decltype(e.left)>::is_symbolic) {
      return graph_of(e.left);
    } else {
      return graph_of(e.right);
    }
  }
}

}  // namespace detail

}  // namespace tessera::autograd
