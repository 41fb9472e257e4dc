// Buffer<T, Kind>: a module's tensor that is state but not trained (BatchNorm's running
// statistics), as a shared handle so that `module.to(i)`, which replaces it, and
// `load_state_dict`, which overwrites it, are seen through every copy of the module. BufferRef
// erases the dtype and device kind (what `module.buffers()` returns).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "tessera/nn/parameter.hpp"

namespace tessera::nn {

namespace detail {
template <Dtype T, DeviceKind K>
struct buffer_slot {
  Tensor<T, K> value;
};
}  // namespace detail

/// A module's non-trainable state tensor. Copies alias; no assignment (assign to `.value()`).
template <Dtype T, DeviceKind K = cpu>
class Buffer {
 public:
  using value_type = T;
  using device_kind = K;
  using slot_type = detail::buffer_slot<T, K>;

  /// A buffer with an undefined value.
  Buffer() : slot_(std::make_shared<slot_type>()) {}
  /// A buffer holding `value` (shared, not copied).
  explicit Buffer(Tensor<T, K> value) : slot_(std::make_shared<slot_type>()) {
    slot_->value = std::move(value);
  }
  explicit Buffer(std::shared_ptr<slot_type> slot) : slot_(std::move(slot)) {
    if (!slot_) throw error("Buffer: the slot is null");
  }
  Buffer(const Buffer&) = default;
  Buffer& operator=(const Buffer&) = delete;

  /// The value (a reference into the shared slot, as for Parameter).
  Tensor<T, K>& value() const noexcept { return slot_->value; }
  bool defined() const noexcept { return slot_->value.defined(); }
  const std::shared_ptr<slot_type>& slot() const noexcept { return slot_; }
  bool is_same(const Buffer& other) const noexcept { return slot_ == other.slot_; }

 private:
  std::shared_ptr<slot_type> slot_;
};

/// A Buffer of any dtype and device kind. Identity is the slot (`id()`, `==`).
class BufferRef {
 public:
  BufferRef() = default;

  template <Dtype T, DeviceKind K>
  BufferRef(const Buffer<T, K>& buffer)  // NOLINT: implicit, as Tensor -> AnyTensor
      : slot_(buffer.slot()),
        get_(&get_value<T, K>),
        set_(&set_value<T, K>),
        dtype_(scalar_type_of<T>),
        kind_(K::type) {}

  bool defined() const noexcept { return slot_ != nullptr; }
  ScalarType dtype() const noexcept { return dtype_; }
  DeviceType device_type() const noexcept { return kind_; }

  /// The current value (shares storage); undefined when there is none.
  AnyTensor value() const {
    check("value");
    return get_(slot_.get());
  }
  /// Replaces the value (same dtype and kind, else dtype_error / device_mismatch_error).
  void set_value(const AnyTensor& value) const {
    check("set_value");
    set_(slot_.get(), value);
  }

  /// The typed handle (same slot); dtype_error / device_mismatch_error on a mismatch.
  template <Dtype T, DeviceKind K = cpu>
  Buffer<T, K> as() const {
    check("as");
    if (scalar_type_of<T> != dtype_) {
      throw dtype_error(std::string("BufferRef::as: the buffer has dtype ") + name(dtype_) +
                        ", not " + dtype_name<T>());
    }
    if (K::type != kind_) {
      throw device_mismatch_error(std::string("BufferRef::as: the buffer is typed for ") +
                                  to_string(kind_) + ", not " + K::name);
    }
    return Buffer<T, K>(std::static_pointer_cast<detail::buffer_slot<T, K>>(slot_));
  }

  const void* id() const noexcept { return slot_.get(); }
  friend bool operator==(const BufferRef& a, const BufferRef& b) noexcept {
    return a.slot_ == b.slot_;
  }

 private:
  template <Dtype T, DeviceKind K>
  static AnyTensor get_value(const void* s) {
    const auto& v = static_cast<const detail::buffer_slot<T, K>*>(s)->value;
    return v.defined() ? AnyTensor(v) : AnyTensor();
  }
  template <Dtype T, DeviceKind K>
  static void set_value(void* s, const AnyTensor& v) {
    static_cast<detail::buffer_slot<T, K>*>(s)->value =
        detail::typed_for_slot<T, K>(v, "BufferRef::set_value");
  }
  void check(const char* operation) const {
    if (!slot_) throw error(std::string("BufferRef::") + operation + ": the reference is empty");
  }

  std::shared_ptr<void> slot_;
  AnyTensor (*get_)(const void*) = nullptr;
  void (*set_)(void*, const AnyTensor&) = nullptr;
  ScalarType dtype_ = ScalarType::float32;
  DeviceType kind_ = DeviceType::cpu;
};

}  // namespace tessera::nn
