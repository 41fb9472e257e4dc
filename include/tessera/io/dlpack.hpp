// DLPack exchange (https://dmlc.github.io/dlpack/latest/): `ts::to_dlpack` lends a tensor to
// PyTorch, CuPy, JAX, NumPy or MatX and `ts::from_dlpack` views theirs, with no copy either way.
// Opt-in: tessera.hpp does not include this header. It needs a dlpack.h: link the CMake target
// tessera::dlpack (the system's libdlpack-dev, or TESSERA_DLPACK_INCLUDE_DIR), or include one
// (LibTorch's <ATen/dlpack.h>, CuPy's) before this header.
//
// Devices. A CUDA tensor is {kDLCUDA, ordinal}. A CPU tensor is {kDLCPU, 0} whatever its virtual
// device: the virtual CPU devices share the host's memory, and DLPack says a CPU device_id is 0.
// On the way in, a CPU tensor lands on the calling thread's current CPU device (or the one named),
// and the producer's CPU device_id is ignored.
#pragma once

#if !defined(DLPACK_DLPACK_H_)  // the guard of every dlpack.h, whoever ships it
#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>  // DLPack's own layout: Debian's libdlpack-dev, CuPy's include dir
#elif __has_include(<ATen/dlpack.h>)
#include <ATen/dlpack.h>  // LibTorch's copy
#elif __has_include(<dlpack.h>)
#include <dlpack.h>  // a directory holding the file itself (TESSERA_DLPACK_INCLUDE_DIR)
#else
#error \
    "tessera/io/dlpack.hpp needs dlpack.h: install libdlpack-dev (Debian), link the CMake \
target tessera::dlpack, or set TESSERA_DLPACK_INCLUDE_DIR to a directory with dlpack/dlpack.h"
#endif
#endif

#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/tensor/storage.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera {

namespace detail::dlpack {

// Type codes and device types as numbers: a dlpack.h older than 0.8 has no kDLBool, and a
// producer may send codes this header does not name.
inline constexpr std::uint8_t code_int = 0;
inline constexpr std::uint8_t code_uint = 1;
inline constexpr std::uint8_t code_float = 2;
inline constexpr std::uint8_t code_bfloat = 4;
inline constexpr std::uint8_t code_bool = 6;  // kDLBool, DLPack 0.8 and later
inline constexpr int device_cpu = 1;
inline constexpr int device_cuda = 2;
inline constexpr int device_cuda_host = 3;

#if (defined(DLPACK_VERSION) && DLPACK_VERSION >= 80) || defined(DLPACK_MAJOR_VERSION)
inline constexpr bool header_has_bool = true;
#else
inline constexpr bool header_has_bool = false;
#endif

/// The DLPack dtype of T. bool is kDLBool where the header has it; with an older header it is
/// kDLUInt 8, the bytes 0 and 1 (LibTorch 1.13 has no bool in DLPack: it reads them as uint8).
template <Dtype T>
constexpr DLDataType dtype_of() noexcept {
  constexpr auto bits = static_cast<std::uint8_t>(sizeof(T) * 8);
  std::uint8_t code = code_int;
  if constexpr (std::same_as<T, bool>) {
    code = header_has_bool ? code_bool : code_uint;
  } else if constexpr (std::same_as<T, bfloat16>) {
    code = code_bfloat;
  } else if constexpr (std::same_as<T, half> || std::is_floating_point_v<T>) {
    code = code_float;
  } else if constexpr (std::is_unsigned_v<T>) {
    code = code_uint;
  }
  return DLDataType{code, bits, 1};
}

/// True when a DLPack dtype holds T's values: its own dtype, and for bool also kDLBool and
/// kDLUInt 8 (what producers without kDLBool send).
template <Dtype T>
constexpr bool accepts(DLDataType dtype) noexcept {
  constexpr DLDataType own = dtype_of<T>();
  if (dtype.lanes != 1) return false;
  if constexpr (std::same_as<T, bool>) {
    return dtype.bits == 8 && (dtype.code == code_bool || dtype.code == code_uint);
  }
  return dtype.code == own.code && dtype.bits == own.bits;
}

inline std::string code_name(std::uint8_t code) {
  switch (code) {
    case 0:
      return "kDLInt";
    case 1:
      return "kDLUInt";
    case 2:
      return "kDLFloat";
    case 3:
      return "kDLOpaqueHandle";
    case 4:
      return "kDLBfloat";
    case 5:
      return "kDLComplex";
    case 6:
      return "kDLBool";
    default:
      return "an unknown code";
  }
}

/// "kDLFloat (code 2), 64 bits, 1 lane".
inline std::string describe(DLDataType dtype) {
  return code_name(dtype.code) + " (code " + std::to_string(dtype.code) + "), " +
         std::to_string(dtype.bits) + " bits, " + std::to_string(dtype.lanes) +
         (dtype.lanes == 1 ? " lane" : " lanes");
}

/// "kDLCUDA (2), device_id 1".
inline std::string describe(DLDevice device) {
  const char* name = "an unknown device type";
  switch (static_cast<int>(device.device_type)) {
    case 1:
      name = "kDLCPU";
      break;
    case 2:
      name = "kDLCUDA";
      break;
    case 3:
      name = "kDLCUDAHost";
      break;
    case 4:
      name = "kDLOpenCL";
      break;
    case 7:
      name = "kDLVulkan";
      break;
    case 8:
      name = "kDLMetal";
      break;
    case 9:
      name = "kDLVPI";
      break;
    case 10:
      name = "kDLROCM";
      break;
    case 11:
      name = "kDLROCMHost";
      break;
    case 12:
      name = "kDLExtDev";
      break;
    case 13:
      name = "kDLCUDAManaged";
      break;
    case 14:
      name = "kDLOneAPI";
      break;
    case 15:
      name = "kDLWebGPU";
      break;
    case 16:
      name = "kDLHexagon";
      break;
    default:
      break;
  }
  return std::string(name) + " (" + std::to_string(static_cast<int>(device.device_type)) +
         "), device_id " + std::to_string(device.device_id);
}

/// What to_dlpack hands out: the DLManagedTensor, the arrays its DLTensor points to, and a handle
/// to the tensor's storage that keeps the bytes alive until the consumer calls the deleter.
struct exported_tensor {
  DLManagedTensor managed{};
  Storage storage;
  std::int64_t shape[max_dims] = {};
  std::int64_t strides[max_dims] = {};
};

inline void delete_exported(DLManagedTensor* self) noexcept {
  delete static_cast<exported_tensor*>(self->manager_ctx);
}

/// Storage::from_blob's release function for an imported tensor: the producer's deleter.
inline void release_imported(void* context) noexcept {
  auto* managed = static_cast<DLManagedTensor*>(context);
  if (managed->deleter != nullptr) managed->deleter(managed);
}

/// "0x7f12345678" for a message.
inline std::string pointer_str(const void* pointer) {
  char buffer[2 + 2 * sizeof(std::uintptr_t) + 1];
  const auto end = std::to_chars(buffer + 2, buffer + sizeof buffer,
                                 reinterpret_cast<std::uintptr_t>(pointer), 16)
                       .ptr;
  buffer[0] = '0';
  buffer[1] = 'x';
  return std::string(buffer, end);
}

/// The checks of from_dlpack, then the tensor. `cpu_device` is the CPU ordinal for Kind = cpu.
template <Dtype T, DeviceKind Kind>
Tensor<T, Kind> import(DLManagedTensor* managed, int cpu_device) {
  const char* type_name = dtype_name<T>();
  const std::string where = std::string("from_dlpack<") + type_name + ", " + Kind::name + ">: ";
  if (managed == nullptr) throw error(where + "the DLManagedTensor pointer is null");
  const DLTensor& dl = managed->dl_tensor;

  if (dl.dtype.lanes != 1) {
    throw dtype_error(where + "the DLPack tensor's dtype has " + std::to_string(dl.dtype.lanes) +
                      " lanes (" + describe(dl.dtype) +
                      "); a Tessera tensor holds one value per element (lanes 1)");
  }
  if (!accepts<T>(dl.dtype)) {
    throw dtype_error(where + "the DLPack tensor's dtype is " + describe(dl.dtype) + ", not " +
                      type_name + " (" + describe(dtype_of<T>()) + ")");
  }

  const int device_type = static_cast<int>(dl.device.device_type);
  Device device;
  if constexpr (std::same_as<Kind, cpu>) {
    if (device_type != device_cpu && device_type != device_cuda_host) {
      throw device_error(where + "the DLPack tensor is on " + describe(dl.device) +
                         ", not in host memory (kDLCPU or kDLCUDAHost)" +
                         (device_type == device_cuda ? "; use from_dlpack<T, ts::cuda>" : ""));
    }
    device = Device{DeviceType::cpu, cpu_device};
  } else {
    if (device_type != device_cuda) {
      throw device_error(where + "the DLPack tensor is on " + describe(dl.device) +
                         ", not on a CUDA device (kDLCUDA)" +
                         (device_type == device_cpu || device_type == device_cuda_host
                              ? "; use from_dlpack<T, ts::cpu>"
                              : ""));
    }
    device = Device{DeviceType::cuda, dl.device.device_id};
  }
  if (const int count = device_count(device.type); device.index < 0 || device.index >= count) {
    throw device_error(where + "device " + device.str() +
                       " does not exist: " + std::to_string(count) + " " + to_string(device.type) +
                       (count == 1 ? " device is" : " devices are") + " available");
  }

  if (dl.ndim < 0 || dl.ndim > max_dims) {
    throw shape_error(where + "the DLPack tensor has " + std::to_string(dl.ndim) +
                      " dimensions; Tessera supports 0 to " + std::to_string(max_dims));
  }
  if (dl.ndim > 0 && dl.shape == nullptr) {
    throw error(where + "the DLPack tensor has " + std::to_string(dl.ndim) +
                " dimensions and a null shape pointer");
  }
  const Shape shape =
      Shape(std::span<const std::int64_t>(dl.shape, static_cast<std::size_t>(dl.ndim)));
  shape.check_size("from_dlpack", sizeof(T));
  const Strides strides =
      dl.strides == nullptr
          ? shape.contiguous_strides()
          : Strides(std::span<const std::int64_t>(dl.strides, static_cast<std::size_t>(dl.ndim)));
  for (int d = 0; d < shape.size(); ++d) {
    if (strides[d] < 0) {
      throw shape_error(where + "stride " + std::to_string(strides[d]) + " of dimension " +
                        std::to_string(d) + " (shape " + shape.str() + ", strides " +
                        strides.str() + ") is negative; Tessera views have no negative strides");
    }
  }

  const std::int64_t numel = shape.numel();
  if (dl.data == nullptr && numel > 0) {
    throw error(where + "the DLPack tensor's data pointer is null, and its shape " + shape.str() +
                " holds " + std::to_string(numel) + " elements");
  }
  if (dl.byte_offset % sizeof(T) != 0) {
    throw error(where + "byte_offset " + std::to_string(dl.byte_offset) +
                " is not a multiple of the element size (" + std::to_string(sizeof(T)) + " bytes)");
  }
  if (reinterpret_cast<std::uintptr_t>(dl.data) % alignof(T) != 0) {
    throw error(where + "the data pointer " + pointer_str(dl.data) + " is not aligned to " +
                std::to_string(alignof(T)) + " bytes (the alignment of " + type_name + ")");
  }
  // The bytes the view reaches from `data`: byte_offset, then up to its last element.
  constexpr auto limit = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  bool overflow = dl.byte_offset > limit;
  std::int64_t last = 0;  // index of the last element reached, from the first
  for (int d = 0; d < shape.size() && numel > 0; ++d) {
    std::int64_t step = 0;
    overflow |= __builtin_mul_overflow(shape[d] - 1, strides[d], &step);
    overflow |= __builtin_add_overflow(last, step, &last);
  }
  std::int64_t bytes = 0;
  if (numel > 0) {
    overflow |= __builtin_add_overflow(last, 1, &last);
    overflow |= __builtin_mul_overflow(last, static_cast<std::int64_t>(sizeof(T)), &bytes);
  }
  overflow |= __builtin_add_overflow(bytes, static_cast<std::int64_t>(dl.byte_offset), &bytes);
  if (overflow) {
    throw shape_error(where + "shape " + shape.str() + " with strides " + strides.str() +
                      " and byte_offset " + std::to_string(dl.byte_offset) +
                      " reaches past 2^63 bytes");
  }

  // No element, no pointer: a null data pointer takes no offset.
  const std::int64_t offset =
      dl.data == nullptr ? 0 : static_cast<std::int64_t>(dl.byte_offset / sizeof(T));
  // The last call that may throw: from here on the tensor owns `managed`.
  Storage storage = Storage::from_blob(device, dl.data, static_cast<std::size_t>(bytes),
                                       &release_imported, managed);
  return Tensor<T, Kind>(std::move(storage), shape, strides, offset);
}

}  // namespace detail::dlpack

/// Lends `tensor` through DLPack with no copy: the returned DLManagedTensor views the tensor's
/// elements (shape, strides in elements, dtype, device) and holds a handle to its storage, so
/// the bytes stay alive, whatever happens to `tensor`, until the consumer calls its deleter (once).
/// `data` points at the first element and byte_offset is 0, as PyTorch, CuPy and NumPy write them
/// (LibTorch 1.13's fromDLPack ignores byte_offset). CPU tensors, pinned ones included, are
/// {kDLCPU, 0}; CUDA tensors {kDLCUDA, ordinal}. Nothing is synchronised: the consumer must order
/// its work after the work queued on the tensor (e.g. ts::cuda::synchronize(ordinal)). bool is
/// kDLBool with a DLPack 0.8+ header, else kDLUInt 8. Throws tessera::error for an undefined
/// tensor, std::bad_alloc when the holder cannot be allocated.
template <Dtype T, DeviceKind Kind>
DLManagedTensor* to_dlpack(const Tensor<T, Kind>& tensor) {
  if (!tensor.defined()) {
    throw error(std::string("to_dlpack: the Tensor<") + dtype_name<T>() + ", " + Kind::name +
                "> is undefined (default-constructed)");
  }
  auto holder = std::make_unique<detail::dlpack::exported_tensor>();
  holder->storage = tensor.storage();
  for (int d = 0; d < tensor.dim(); ++d) {
    holder->shape[d] = tensor.shape()[d];
    holder->strides[d] = tensor.strides()[d];
  }
  DLTensor& dl = holder->managed.dl_tensor;
  dl.data = tensor.storage().data() == nullptr ? nullptr : static_cast<void*>(tensor.data());
  if constexpr (std::same_as<Kind, cuda>) {
    dl.device =
        DLDevice{static_cast<DLDeviceType>(detail::dlpack::device_cuda), tensor.device_index()};
  } else {
    dl.device = DLDevice{static_cast<DLDeviceType>(detail::dlpack::device_cpu), 0};
  }
  dl.ndim = tensor.dim();
  dl.dtype = detail::dlpack::dtype_of<T>();
  dl.shape = holder->shape;
  dl.strides = holder->strides;
  dl.byte_offset = 0;
  holder->managed.manager_ctx = holder.get();
  holder->managed.deleter = &detail::dlpack::delete_exported;
  return &holder.release()->managed;
}

/// A Tensor viewing the memory a DLPack producer lends (at::toDLPack, CuPy's toDlpack, ...), with
/// no copy: its shape, its strides (NULL: compact row-major) and byte_offset are kept. The
/// producer's deleter is called exactly once, when the last Tessera handle to that storage goes
/// (views and copies of the handle included); the bytes are the producer's, never counted in or
/// returned to Tessera's pools. CPU: kDLCPU or kDLCUDAHost memory, on the calling thread's current
/// CPU device (the producer's device_id is ignored); CUDA: kDLCUDA memory, on ordinal device_id.
/// bool accepts kDLBool and kDLUInt 8 (whose bytes must be 0 or 1).
///
/// Ownership: on return the tensor owns `managed`. When it throws, it has not taken it: the
/// caller still owns `managed` and calls its deleter (PyTorch's rule). Throws dtype_error for a
/// dtype code or bits other than T's, or lanes other than 1; device_error for a device type that
/// is not Kind's, or an ordinal that does not exist; shape_error for more than 8 dimensions, a
/// negative extent or stride, or a view past 2^63 bytes; tessera::error for a null pointer or a
/// byte_offset that is not a multiple of sizeof(T) (or data not aligned for T). Each message
/// names the values.
template <Dtype T, DeviceKind Kind = cpu>
Tensor<T, Kind> from_dlpack(DLManagedTensor* managed) {
  if constexpr (std::same_as<Kind, cpu>) {
    return detail::dlpack::import <T, Kind>(managed, cpu::current_device());
  } else {
    return detail::dlpack::import <T, Kind>(managed, -1);
  }
}

/// The same, on CPU device `device` (a virtual CPU device of this process).
template <Dtype T, DeviceKind Kind = cpu>
requires std::same_as<Kind, cpu> Tensor<T, Kind> from_dlpack(DLManagedTensor* managed, int device) {
  return detail::dlpack::import <T, Kind>(managed, device);
}

}  // namespace tessera
