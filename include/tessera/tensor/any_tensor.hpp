// AnyTensor: a type-erased tensor handle (dtype and device known at run time) that every
// Tensor<T, Kind> converts to. Modules, optimisers and checkpoints store these; `as<T, Kind>()`
// gets the typed tensor back, sharing storage.
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>
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

  /// A view of dtype `type` over `storage`, on its device: the type-erased form of Tensor's
  /// (storage, shape, strides, offset) constructor. The caller makes sure that the elements lie
  /// inside the storage.
  AnyTensor(ScalarType type, Storage storage, const Shape& shape, const Strides& strides,
            std::int64_t storage_offset)
      : storage_(std::move(storage)),
        shape_(shape),
        strides_(strides),
        offset_(storage_offset),
        dtype_(type),
        device_(storage_.device()) {}

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

  /// Copies `src`'s elements into this tensor's (the same dtype, else dtype_error naming both,
  /// and a shape that broadcasts to this one's; any two devices, of either kind): the type-erased
  /// form of Tensor::copy_. The bits of each element move (a copy within one dtype), so it is
  /// compiled once per element size, not per dtype.
  template <std::same_as<AnyTensor> A>
  void copy_(const A& src) const {
    if (!src.defined()) throw error("AnyTensor::copy_: the source is undefined");
    if (src.dtype() != dtype_) {
      throw dtype_error(std::string("AnyTensor::copy_: the source has dtype ") + name(src.dtype()) +
                        ", this tensor " + name(dtype_));
    }
    visit_bits([&](auto typed) {
      using B = typename decltype(typed)::value_type;
      if (src.device().is_cuda()) {
        typed.copy_(Tensor<B, cuda>(src.storage_, src.shape_, src.strides_, src.offset_));
      } else {
        typed.copy_(Tensor<B, cpu>(src.storage_, src.shape_, src.strides_, src.offset_));
      }
    });
  }

  /// A copy with storage of its own on the same device, laid out as Tensor::clone lays it out
  /// (channels_last kept, every other layout contiguous). Copies bits, as copy_.
  template <int = 0>
  AnyTensor clone() const {
    if (!defined()) throw error("AnyTensor::clone: the tensor is undefined");
    return visit_bits([&](const auto& typed) -> AnyTensor {
      const auto copy = typed.clone();
      return AnyTensor(dtype_, copy.storage(), copy.shape(), copy.strides(), copy.storage_offset());
    });
  }

  /// Writes `value` converted to this tensor's dtype (as static_cast does) into every element.
  /// Converts once per dtype on the host and fills bits, compiled once per element size.
  template <std::same_as<double> D>
  void fill_(D value) const {
    if (!defined()) throw error("AnyTensor::fill_: the tensor is undefined");
    unsigned char bytes[8] = {};
    visit_dtype(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T converted = static_cast<T>(value);
      std::memcpy(bytes, static_cast<const void*>(&converted), sizeof(T));
    });
    visit_bits([&](auto typed) {
      typename decltype(typed)::value_type bits;
      std::memcpy(&bits, bytes, sizeof(bits));
      typed.fill_(bits);
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
  /// Calls fn(Tensor<B, K>) over this tensor's elements read as B, the integer dtype of their size
  /// (uint8, int16, int32, int64): what copies and fills within one dtype need (they move bits).
  template <class Fn>
  decltype(auto) visit_bits(Fn&& fn) const {
    switch (element_size(dtype_)) {
      case 1:
        return visit_kind<std::uint8_t>(fn);
      case 2:
        return visit_kind<std::int16_t>(fn);
      case 4:
        return visit_kind<std::int32_t>(fn);
      default:
        return visit_kind<std::int64_t>(fn);
    }
  }
  template <class B, class Fn>
  decltype(auto) visit_kind(Fn& fn) const {
    if (device_.is_cuda()) return fn(Tensor<B, cuda>(storage_, shape_, strides_, offset_));
    return fn(Tensor<B, cpu>(storage_, shape_, strides_, offset_));
  }

  Storage storage_;
  Shape shape_;
  Strides strides_;
  std::int64_t offset_ = 0;
  ScalarType dtype_ = ScalarType::float32;
  Device device_;
};

}  // namespace tessera
