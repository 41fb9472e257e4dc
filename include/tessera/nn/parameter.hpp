// Parameter<T, Kind>: a trainable tensor of a module, as a shared handle over the autograd's
// parameter_slot (value, gradient, requires_grad). Copies alias, so a module, its copies, the
// optimisers and compiled Programs all see one value: `module.to(i)` and `load_state_dict`
// replace or overwrite it there. ParameterRef erases the dtype and device kind; it is what
// `module.parameters()` returns and what the optimisers take.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/autograd/ops.hpp"
#include "tessera/autograd/parameter.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn {

namespace detail {
template <class>
inline constexpr bool always_false = false;

/// A value given to a slot through a type-erased handle: same dtype and device kind as the slot
/// (dtype_error / device_mismatch_error naming `what` otherwise); undefined is allowed.
template <Dtype T, DeviceKind K>
Tensor<T, K> typed_for_slot(const AnyTensor& tensor, const std::string& what) {
  if (!tensor.defined()) return {};
  if (tensor.dtype() != scalar_type_of<T>) {
    throw dtype_error(what + ": got dtype " + name(tensor.dtype()) + ", expected " +
                      dtype_name<T>());
  }
  if (tensor.device().type != K::type) {
    throw device_mismatch_error(what + ": got a tensor on " + tensor.device().str() +
                                ", expected a " + K::name + " device");
  }
  return tensor.as<T, K>();
}
}  // namespace detail

/// A trainable tensor: `.value()`, `.grad()` (undefined until a backward or an optimiser test
/// gives it one), `.requires_grad()`. A shared handle: copies alias the same slot, and a handle
/// is never re-pointed (no assignment: assign to `.value()` instead), so a module's registry and
/// its members cannot drift apart.
template <Dtype T, DeviceKind K = cpu>
class Parameter {
 public:
  using value_type = T;
  using device_kind = K;
  using slot_type = autograd::parameter_slot<T, K>;

  /// A parameter with an undefined value (a Linear without bias holds one and never registers it).
  Parameter() : slot_(std::make_shared<slot_type>()) {}

  /// A parameter holding `value` (shared, not copied).
  explicit Parameter(Tensor<T, K> value, bool requires_grad = true)
      : slot_(std::make_shared<slot_type>()) {
    slot_->value = std::move(value);
    slot_->requires_grad = requires_grad;
  }

  /// A handle to an existing slot (the autograd and ParameterRef::as make these). Throws
  /// tessera::error for a null slot.
  explicit Parameter(std::shared_ptr<slot_type> slot) : slot_(std::move(slot)) {
    if (!slot_) throw error("Parameter: the slot is null");
  }

  // Copying aliases; there is deliberately no move (a moved-from handle would be empty) and no
  // assignment (see the class comment).
  Parameter(const Parameter&) = default;
  Parameter& operator=(const Parameter&) = delete;

  /// The value. The handle is shared, so this is a reference into the slot even on a const
  /// handle (as `*shared_ptr`): `p.value() = t` makes every handle see t.
  Tensor<T, K>& value() const noexcept { return slot_->value; }
  /// The gradient: undefined until a backward (or a caller) sets it; backward adds into it.
  /// After zero_grad() this writes the zeros that zero_grad() left unwritten.
  Tensor<T, K>& grad() const { return slot_->gradient(); }
  /// The gradient is zero from now on, its buffer kept. Nothing is written now: the next
  /// backward writes the gradient instead of adding it, and grad() writes zeros when read first.
  /// A Tensor handle to the gradient taken before keeps the values it had (as in PyTorch, whose
  /// zero_grad sets gradients to None). Nothing happens when there is no gradient.
  void zero_grad() const noexcept { slot_->zero_grad(); }
  bool requires_grad() const noexcept { return slot_->requires_grad; }
  /// Sets requires_grad (PyTorch's requires_grad_); returns this handle.
  const Parameter& requires_grad_(bool on = true) const noexcept {
    slot_->requires_grad = on;
    return *this;
  }
  bool defined() const noexcept { return slot_->value.defined(); }

  // The value's queries, for convenience.
  const Shape& shape() const noexcept { return slot_->value.shape(); }
  std::int64_t size(std::int64_t dim) const { return slot_->value.size(dim); }
  int dim() const noexcept { return slot_->value.dim(); }
  std::int64_t numel() const noexcept { return slot_->value.numel(); }
  Device device() const noexcept { return slot_->value.device(); }

  /// The parameter as an operand of an expression whose input is `x`: the value itself when x is
  /// a tensor or a lazy expression of tensors (eager code). Layers write `w.like(x)` so that the
  /// same forward traces when x is an autograd Var (there this gives the parameter's Var).
  template <class X>
  decltype(auto) like(const X& x) const {
    (void)x;
    if constexpr (tessera::detail::is_tensor<X>::value || tessera::detail::expression_node<X>) {
      return static_cast<const Tensor<T, K>&>(slot_->value);
    } else if constexpr (tessera::detail::symbolic_expression<X>) {
      return autograd::parameter(slot_, x);
    } else {
      static_assert(detail::always_false<X>,
                    "Parameter::like: the input is neither a tensor, an expression of tensors, an "
                    "autograd Var nor an expression of Vars");
    }
  }

  /// The shared slot, for the autograd (it binds the slot's value each time a Program runs).
  const std::shared_ptr<slot_type>& slot() const noexcept { return slot_; }
  /// True when both handles share one slot.
  bool is_same(const Parameter& other) const noexcept { return slot_ == other.slot_; }

 private:
  std::shared_ptr<slot_type> slot_;
};

/// A Parameter of any dtype and device kind (what `module.parameters()` returns and the
/// optimisers take). Shares the slot: `.value()` and `.grad()` are AnyTensor handles to the
/// current tensors (undefined when there is none). Identity is the slot: `id()` and `==`.
class ParameterRef {
 public:
  /// An empty reference (`defined()` is false; everything else throws).
  ParameterRef() = default;

  template <Dtype T, DeviceKind K>
  ParameterRef(const Parameter<T, K>& parameter)  // NOLINT: implicit, as Tensor -> AnyTensor
      : slot_(parameter.slot()), ops_(&ops_for<T, K>), dtype_(scalar_type_of<T>), kind_(K::type) {}

  bool defined() const noexcept { return slot_ != nullptr; }
  ScalarType dtype() const noexcept { return dtype_; }
  /// The device kind the parameter is typed for (its value lives on a device of this kind).
  DeviceType device_type() const noexcept { return kind_; }
  /// The value's device. Throws tessera::error for an empty reference or an undefined value.
  Device device() const { return defined_value("device").device(); }
  Shape shape() const { return value().shape(); }
  std::int64_t numel() const { return value().numel(); }

  /// The current value (shares storage). Undefined when the parameter has no value.
  AnyTensor value() const { return ops().value(slot_.get()); }
  /// The current gradient (shares storage); undefined when there is none. Writes the zeros that
  /// zero_grad() left unwritten.
  AnyTensor grad() const { return ops().grad(slot_.get()); }
  /// The gradient is zero from now on, its buffer kept (see Parameter::zero_grad).
  void zero_grad() const { ops().zero_grad(slot_.get()); }
  /// Replaces the gradient by `grad` (shared, not copied), or clears it when `grad` is
  /// undefined. Throws dtype_error, device_mismatch_error or shape_error, naming both values,
  /// when it does not match the parameter's value.
  void set_grad(const AnyTensor& grad) const {
    if (grad.defined()) {
      const AnyTensor current = defined_value("set_grad");
      if (grad.device() != current.device()) {
        throw device_mismatch_error("ParameterRef::set_grad: the gradient is on " +
                                    grad.device().str() + ", the parameter on " +
                                    current.device().str());
      }
      if (grad.shape() != current.shape()) {
        throw shape_error("ParameterRef::set_grad: the gradient has shape " + grad.shape().str() +
                          ", the parameter " + current.shape().str());
      }
    }
    ops().set_grad(slot_.get(), grad);
  }
  bool requires_grad() const { return ops().requires_grad(slot_.get()); }
  void requires_grad_(bool on = true) const { ops().set_requires_grad(slot_.get(), on); }

  /// The typed handle (same slot). Throws dtype_error naming both dtypes, or
  /// device_mismatch_error naming both kinds, when T or K is not this parameter's.
  template <Dtype T, DeviceKind K = cpu>
  Parameter<T, K> as() const {
    if (!slot_) throw error("ParameterRef::as: the reference is empty");
    if (scalar_type_of<T> != dtype_) {
      throw dtype_error(std::string("ParameterRef::as: the parameter has dtype ") + name(dtype_) +
                        ", not " + dtype_name<T>());
    }
    if (K::type != kind_) {
      throw device_mismatch_error(std::string("ParameterRef::as: the parameter is typed for ") +
                                  to_string(kind_) + ", not " + K::name);
    }
    return Parameter<T, K>(std::static_pointer_cast<autograd::parameter_slot<T, K>>(slot_));
  }

  /// The slot's address: equal for every handle to the same parameter.
  const void* id() const noexcept { return slot_.get(); }
  friend bool operator==(const ParameterRef& a, const ParameterRef& b) noexcept {
    return a.slot_ == b.slot_;
  }

  /// Replaces the value (same dtype and kind; for Module::to and the autograd). Throws
  /// dtype_error / device_mismatch_error otherwise.
  void set_value(const AnyTensor& value) const { ops().set_value(slot_.get(), value); }

 private:
  struct slot_ops {
    AnyTensor (*value)(const void*);
    void (*set_value)(void*, const AnyTensor&);
    AnyTensor (*grad)(void*);
    void (*set_grad)(void*, const AnyTensor&);
    void (*zero_grad)(void*);
    bool (*requires_grad)(const void*);
    void (*set_requires_grad)(void*, bool);
  };

  template <Dtype T, DeviceKind K>
  static constexpr slot_ops ops_for = {
      [](const void* s) -> AnyTensor {
        const auto& v = static_cast<const autograd::parameter_slot<T, K>*>(s)->value;
        return v.defined() ? AnyTensor(v) : AnyTensor();
      },
      [](void* s, const AnyTensor& v) {
        static_cast<autograd::parameter_slot<T, K>*>(s)->value =
            detail::typed_for_slot<T, K>(v, "ParameterRef::set_value");
      },
      [](void* s) -> AnyTensor {
        const auto& g = static_cast<autograd::parameter_slot<T, K>*>(s)->gradient();
        return g.defined() ? AnyTensor(g) : AnyTensor();
      },
      [](void* s, const AnyTensor& g) {
        static_cast<autograd::parameter_slot<T, K>*>(s)->set_grad(
            detail::typed_for_slot<T, K>(g, "ParameterRef::set_grad"));
      },
      [](void* s) { static_cast<autograd::parameter_slot<T, K>*>(s)->zero_grad(); },
      [](const void* s) {
        return static_cast<const autograd::parameter_slot<T, K>*>(s)->requires_grad;
      },
      [](void* s, bool on) { static_cast<autograd::parameter_slot<T, K>*>(s)->requires_grad = on; },
  };

  const slot_ops& ops() const {
    if (!slot_) throw error("ParameterRef: the reference is empty");
    return *ops_;
  }
  AnyTensor defined_value(const char* operation) const {
    AnyTensor v = value();
    if (!v.defined()) {
      throw error(std::string("ParameterRef::") + operation + ": the parameter has no value");
    }
    return v;
  }

  std::shared_ptr<void> slot_;
  const slot_ops* ops_ = nullptr;
  ScalarType dtype_ = ScalarType::float32;
  DeviceType kind_ = DeviceType::cpu;
};

}  // namespace tessera::nn

template <>
struct std::hash<tessera::nn::ParameterRef> {
  std::size_t operator()(const tessera::nn::ParameterRef& p) const noexcept {
    return std::hash<const void*>{}(p.id());
  }
};
