// AnyTensor: a type-erased tensor handle (dtype and device known at run time) that every
// Tensor<T, Kind> converts to. Modules, optimisers and checkpoints store these; `as<T, Kind>()`
// gets the typed tensor back, sharing storage.
#pragma once

#include <concepts>
#include <ostream>
#include <string>
#include <utility>

#include "tessera/tensor/print.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera {

class AnyTensor {
 public:
  /// An undefined handle.
  AnyTensor() = default;

  /// Type-erases `tensor` (shares its storage).
  template <Dtype T, DeviceKind K>
  AnyTensor(const Tensor<T, K>& tensor)  // NOLINT: implicit by design, as the contract says
      : storage_(tensor.storage()),
        shape_(tensor.shape()),
        strides_(tensor.strides()),
        offset_(tensor.storage_offset()),
        dtype_(scalar_type_of<T>),
        device_(tensor.device()) {}

  bool defined() const noexcept { return storage_.defined(); }
  ScalarType dtype() const noexcept { return dtype_; }
  Device device() const noexcept { return device_; }
  const Shape& shape() const noexcept { return shape_; }
  const Strides& strides() const noexcept { return strides_; }
  int dim() const noexcept { return shape_.size(); }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::size_t nbytes() const noexcept {
    return static_cast<std::size_t>(numel()) * element_size(dtype_);
  }
  bool is_contiguous() const noexcept { return backend::cpu::is_row_major(shape_, strides_); }
  const Storage& storage() const noexcept { return storage_; }
  std::int64_t storage_offset() const noexcept { return offset_; }
  /// Address of the first element (device memory for CUDA tensors).
  void* data_ptr() const noexcept {
    return static_cast<char*>(storage_.data()) +
           offset_ * static_cast<std::int64_t>(element_size(dtype_));
  }

  /// The typed tensor (same storage). Throws dtype_error naming both dtypes when T is not this
  /// tensor's dtype, device_mismatch_error when Kind is not its device kind.
  template <Dtype T, DeviceKind K = cpu>
  Tensor<T, K> as() const {
    if (!defined()) throw error("AnyTensor::as: the tensor is undefined");
    if (scalar_type_of<T> != dtype_) {
      throw dtype_error(std::string("AnyTensor::as: the tensor has dtype ") + name(dtype_) +
                        ", not " + name(scalar_type_of<T>));
    }
    if (K::type != device_.type) {
      throw device_mismatch_error("AnyTensor::as: the tensor is on " + device_.str() +
                                  ", not on a " + K::name + " device");
    }
    return Tensor<T, K>(storage_, shape_, strides_, offset_);
  }

  /// Calls fn(Tensor<T, K>) with this tensor's dtype and device kind.
  template <class Fn>
  decltype(auto) visit(Fn&& fn) const {
    return visit_dtype(dtype_, [&](auto tag) -> decltype(auto) {
      using T = typename decltype(tag)::type;
      if (device_.is_cuda()) return fn(as<T, cuda>());
      return fn(as<T, cpu>());
    });
  }

  // to() and operator<< instantiate a conversion or a printer for every dtype and device kind:
  // as templates they are compiled only in the units that call them, not in every unit that
  // includes this header (about a second of compile time otherwise).

  /// A copy on `device` (a handle to the same storage when it is already there).
  template <std::same_as<Device> D>
  AnyTensor to(D device) const {
    return visit([&](const auto& t) -> AnyTensor {
      if (device.is_cuda()) return t.template to<cuda>(device.index);
      return t.template to<cpu>(device.index);
    });
  }

  /// Copies `src`'s elements into this tensor's (the same dtype and element layout, checked by
  /// the caller; any two devices, of either kind): the type-erased form of Tensor::copy_.
  template <std::same_as<AnyTensor> A>
  void copy_(const A& src) const {
    visit([&](auto typed) {
      using T = typename decltype(typed)::value_type;
      if (src.device().is_cuda()) {
        typed.copy_(src.template as<T, cuda>());
      } else {
        typed.copy_(src.template as<T, cpu>());
      }
    });
  }

  /// A copy converted to dtype `type` (a handle to the same storage when it already has it).
  template <std::same_as<ScalarType> S>
  AnyTensor to(S type) const {
    return visit([&](const auto& t) -> AnyTensor {
      return visit_dtype(type, [&](auto tag) -> AnyTensor {
        return t.template to<typename decltype(tag)::type>();
      });
    });
  }

  template <class CharT, class Traits>
  friend std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os,
                                                       const AnyTensor& t) {
    if (!t.defined()) return os << "tensor(undefined)";
    t.visit([&](const auto& typed) { os << typed; });
    return os;
  }

 private:
  Storage storage_;
  Shape shape_;
  Strides strides_;
  std::int64_t offset_ = 0;
  ScalarType dtype_ = ScalarType::float32;
  Device device_;
};

}  // namespace tessera
