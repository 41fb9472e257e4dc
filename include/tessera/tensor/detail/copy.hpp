// Element copies between any two devices and dtypes, and fills, on raw strided memory. The
// tensor layer (copy_, to, contiguous, cat, fill_) calls only these two functions. They run on the
// expression engine's executors (a cast of one operand, or a constant), so a copy is one pass like
// any fused statement. CUDA needs nvcc for kernels: a g++ unit in compiled mode calls the
// library's (instantiated at the end of this file); a g++ unit header-only stages the bytes
// through the host and runs the CPU executor, so it can still copy CUDA tensors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/backend/evaluator.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/memory.hpp"
#if TESSERA_CUDA_KERNELS
#include "tessera/backend/cuda/executor.cuh"
#endif

namespace tessera::detail {

/// Element range [first, last) that a strided view touches, relative to its data pointer.
struct element_span {
  std::int64_t first = 0;
  std::int64_t last = 0;
};

inline element_span span_of(const Shape& shape, const Strides& strides) {
  element_span span;
  if (shape.numel() == 0) return span;
  for (int d = 0; d < shape.size(); ++d) {
    std::int64_t reach = strides[d] * (shape[d] - 1);
    (reach < 0 ? span.first : span.last) += reach;
  }
  span.last += 1;
  return span;
}

/// Raw strided operand: element pointer, device and strides (in elements).
template <class T>
struct strided_ref {
  T* data;
  Device device;
  Strides strides;
};

using memory::detail::scratch_buffer;

/// The evaluator of a copy from `src` to dtype To: the stored values themselves for one dtype
/// (bits unchanged, signalling NaNs included), else a conversion through the compute type.
template <class To, class From>
TESSERA_HOST_DEVICE auto copy_evaluator(const From* src, const Strides& strides, int rank) {
  if constexpr (std::is_same_v<To, From>) {
    return backend::leaf_evaluator<From, From>(src, strides, rank);
  } else {
    using leaf = backend::leaf_evaluator<From>;
    return backend::cast_evaluator<To, leaf>{leaf(src, strides, rank)};
  }
}

/// The unsigned integer of `Bytes` bytes. A copy or a fill within one dtype moves bits, so the
/// dtypes of one size share their code (float and int32; half, bfloat16 and int16; ...): on the
/// CPU one loop per element size, on CUDA one kernel (every nvcc unit compiles the copies and
/// fills that the library's inline functions name, for every dtype: bench/RESULTS.md, issue 45).
/// Defined for 1, 2, 4 and 8 bytes only (every dtype's size).
template <std::size_t Bytes>
struct bits_of;
template <>
struct bits_of<1> {
  using type = std::uint8_t;
};
template <>
struct bits_of<2> {
  using type = std::uint16_t;
};
template <>
struct bits_of<4> {
  using type = std::uint32_t;
};
template <>
struct bits_of<8> {
  using type = std::uint64_t;
};
template <std::size_t Bytes>
using bits_t = typename bits_of<Bytes>::type;

/// Calls fn(index) for each row of `shape` (every dimension but the last; `index` holds the row's
/// outer indices), the rows cut over the CPU device's threads as the executor cuts them.
template <class Fn>
void for_each_row(const Shape& shape, Fn&& fn) {
  const std::int64_t inner = shape[shape.size() - 1];
  backend::cpu::execute_loop(0, shape.numel() / inner,
                             std::max<std::int64_t>(1, backend::cpu::grain_size / inner),
                             [&](std::int64_t first_row, std::int64_t last_row) {
                               std::int64_t index[max_dims] = {};
                               backend::cpu::first_row_index(shape, first_row, index);
                               for (std::int64_t row = first_row; row < last_row; ++row) {
                                 fn(static_cast<const std::int64_t*>(index));
                                 backend::cpu::next_row_index(shape, index);
                               }
                             });
}

/// dst = To(src) over `shape` on the CPU in one threaded pass (counted as one launch), the
/// dimensions in the output's memory order and merged as the executor's: one run (split over its
/// elements), or rows. Elements that step by one on both sides are a loop the compiler vectorises
/// (memcpy within one dtype), others are copied one by one. Copies and conversions are this loop
/// rather than the executor's general one (its unit-stride blocks and splats, built for
/// expressions of several operands): the library names a conversion for every pair of dtypes.
/// The values are copy_evaluator's: bits within one dtype, the executor's conversion between two.
template <class To, class From>
void cpu_copy_elements(To* dst, const Strides& dst_strides, const From* src,
                       const Strides& src_strides, const Shape& shape) {
  profiler::count_launch();
  const std::int64_t n = shape.numel();
  if (n == 0) return;
  // `count` elements that step by one on both sides.
  const auto run = [](To* to, const From* from, std::int64_t count) {
    if constexpr (std::is_same_v<To, From>) {
      std::memcpy(to, from, sizeof(To) * static_cast<std::size_t>(count));
    } else {
      const auto source = copy_evaluator<To>(from, Strides{}, 0);
      for (std::int64_t i = 0; i < count; ++i) {
        to[i] = backend::store_cast<To>(source.get(backend::linear_access{i}));
      }
    }
  };
  // `count` elements `step` apart in `from` (0: one value for all, a fill), `stride` apart in `to`.
  const auto strided = [](To* to, std::int64_t stride, const From* from, std::int64_t step,
                          std::int64_t count) {
    const auto source = copy_evaluator<To>(from, Strides{step}, 1);
    if (step == 0 && stride == 1) {
      std::fill_n(to, count, backend::store_cast<To>(source.get(backend::row_access{0})));
      return;
    }
    for (std::int64_t i = 0; i < count; ++i) {
      to[i * stride] = backend::store_cast<To>(source.get(backend::row_access{i}));
    }
  };
  using layout_type = backend::cpu::strided_layout<2>;
  const auto layout = layout_type::in_memory_order(shape, {dst_strides, src_strides});
  const int rank = layout.shape.size();
  if (rank == 0) {  // one element (extents of 1 only)
    strided(dst, 0, src, 0, 1);
    return;
  }
  const std::int64_t inner = layout.shape[rank - 1];
  const std::int64_t dst_inner = layout.strides[0][rank - 1];
  const std::int64_t src_inner = layout.strides[1][rank - 1];
  // `count` elements along the innermost merged dimension from `to` and `from`.
  const auto segment = [&](To* to, const From* from, std::int64_t count) {
    if (dst_inner == 1 && src_inner == 1) {
      run(to, from, count);
    } else {
      strided(to, dst_inner, from, src_inner, count);
    }
  };
  if (rank == 1) {  // one run, dense or not: split over its elements
    backend::cpu::execute_loop(
        0, n, backend::cpu::grain_size, [&](std::int64_t first, std::int64_t last) {
          segment(dst + first * dst_inner, src + first * src_inner, last - first);
        });
    return;
  }
  for_each_row(layout.shape, [&](const std::int64_t* index) {
    segment(dst + backend::cpu::row_offset(layout.strides[0], rank, index),
            src + backend::cpu::row_offset(layout.strides[1], rank, index), inner);
  });
}

/// dst = To(src) over `shape` on the CPU (one pass); within one dtype the bits of its size.
template <class To, class From>
void cpu_convert(To* dst, const Strides& dst_strides, const From* src, const Strides& src_strides,
                 const Shape& shape) {
  if constexpr (std::is_same_v<To, From>) {
    using U = bits_t<sizeof(To)>;
    cpu_copy_elements(reinterpret_cast<U*>(dst), dst_strides, reinterpret_cast<const U*>(src),
                      src_strides, shape);
  } else {
    cpu_copy_elements(dst, dst_strides, src, src_strides, shape);
  }
}

/// dst = the bits `value` over `shape` on the CPU (one threaded pass, counted as one launch): the
/// dimensions of dst merged in its memory order, one run split over its elements or rows.
template <class U>
void cpu_fill_bits(U* dst, const Strides& dst_strides, const Shape& shape, U value) {
  profiler::count_launch();
  const std::int64_t n = shape.numel();
  if (n == 0) return;
  const auto layout = backend::cpu::strided_layout<1>::in_memory_order(shape, {dst_strides});
  const int rank = layout.shape.size();
  if (rank == 0) {
    dst[0] = value;
    return;
  }
  const std::int64_t inner = layout.shape[rank - 1];
  const std::int64_t step = layout.strides[0][rank - 1];
  const auto fill = [step, value](U* to, std::int64_t count) {
    if (step == 1) {
      std::fill_n(to, count, value);
    } else {
      for (std::int64_t i = 0; i < count; ++i) to[i * step] = value;
    }
  };
  if (rank == 1) {  // one run: split over its elements
    backend::cpu::execute_loop(
        0, n, backend::cpu::grain_size,
        [&](std::int64_t first, std::int64_t last) { fill(dst + first * step, last - first); });
    return;
  }
  for_each_row(layout.shape, [&](const std::int64_t* index) {
    fill(dst + backend::cpu::row_offset(layout.strides[0], rank, index), inner);
  });
}

/// dst = value over `shape` on the CPU (one pass): the bits of value, one loop per element size.
template <class T>
void cpu_fill(T* dst, const Strides& dst_strides, const Shape& shape, T value) {
  using U = bits_t<sizeof(T)>;
  U bits;
  std::memcpy(&bits, &value, sizeof(U));
  cpu_fill_bits(reinterpret_cast<U*>(dst), dst_strides, shape, bits);
}

#if TESSERA_CUDA
/// Copies raw bytes between any two devices (host memory of any virtual CPU device is one space),
/// on the current streams of the CUDA devices involved, after the work queued there:
/// - within one CUDA device: asynchronous on its current stream (ordered with later kernels);
/// - between two CUDA devices: on the destination's current stream, which first waits for the
///   source's; then waited for, so that neither block can be reused while the copy runs;
/// - between host and device: on the device's current stream, then waited for (the host side may
///   be read or freed as soon as this returns). Copies from pinned memory that need not wait are
///   copy_from_pinned's.
inline void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                       std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
  } else if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
    const Stream destination = current_stream(dst_device);
    destination.wait_stream(current_stream(src_device));
    DeviceGuard<tessera::cuda> guard(dst_device.index);
    TESSERA_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes,
                                           destination.native()));
    destination.synchronize();
  } else {
    // cudaMemcpyDefault infers the direction from unified addressing.
    const Device cuda_side = dst_device.is_cuda() ? dst_device : src_device;
    const Stream stream = current_stream(cuda_side);
    DeviceGuard<tessera::cuda> guard(cuda_side.index);
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream.native()));
    if (dst_device.is_cpu() || src_device.is_cpu()) stream.synchronize();
  }
}

/// Copies `bytes` from pinned host memory at `src` (inside the pinned block at `pinned_block`)
/// to CUDA memory at `dst` on `dst_device`'s current stream, without waiting: the copy is ordered
/// with the work queued on that stream, and the pinned block gets the stream recorded, so that it
/// is not handed out again before the copy is done (PyTorch's non_blocking copy from pinned
/// memory). The host must not write the source before synchronising with the stream.
inline void copy_from_pinned(void* dst, Device dst_device, const void* src,
                             const void* pinned_block, std::size_t bytes) {
  if (bytes == 0) return;
  const Stream stream = current_stream(dst_device);
  memory::detail::pinned_record_stream(const_cast<void*>(pinned_block), dst_device, stream.ref());
  DeviceGuard<tessera::cuda> guard(dst_device.index);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream.native()));
}
#endif

#if TESSERA_CUDA_KERNELS
/// dst = src on the current CUDA device and stream, one dtype: cudaMemcpyAsync when both are one
/// dense run laid out alike (row-major, or channels_last both: the copy engine's bandwidth is
/// the reference), else the rows kernel over the bits (one kernel per element size).
template <class T>
void copy_within_cuda(T* dst, const Strides& dst_strides, const T* src, const Strides& src_strides,
                      const Shape& shape) {
  using U = bits_t<sizeof(T)>;
  Strides strides[2] = {dst_strides, src_strides};
  if (backend::cuda::merge_elementwise(shape, strides, 2).dense) {
    if (dst == src) return;  // the same run: nothing moves
    profiler::count_launch();
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src,
                                       sizeof(T) * static_cast<std::size_t>(shape.numel()),
                                       cudaMemcpyDeviceToDevice, current_cuda_stream().native()));
    return;
  }
  const U* bits = reinterpret_cast<const U*>(src);
  backend::cuda::execute<backend::cuda::kernel_choice::fewest>(
      reinterpret_cast<U*>(dst), dst_strides, shape, std::array<Strides, 1>{src_strides},
      [&](const Strides* operand_strides, int rank) {
        return backend::leaf_evaluator<U, U>(bits, operand_strides[0], rank);
      });
}

/// dst = value on the current CUDA device and stream: cudaMemsetAsync for zero bits over one dense
/// run, else the executor over the bits (one pair of kernels per element size, kernel_choice::
/// compact: the vector kernel for a dense run, one element at a time into a strided view).
template <class T>
void fill_within_cuda(T* dst, const Strides& dst_strides, const Shape& shape, T value) {
  using U = bits_t<sizeof(T)>;
  U bits;
  std::memcpy(&bits, &value, sizeof(U));
  if (bits == 0) {
    Strides strides = dst_strides;
    if (backend::cuda::merge_elementwise(shape, &strides, 1).dense) {
      profiler::count_launch();
      TESSERA_CUDA_CHECK(cudaMemsetAsync(dst, 0,
                                         sizeof(T) * static_cast<std::size_t>(shape.numel()),
                                         current_cuda_stream().native()));
      return;
    }
  }
  backend::cuda::execute<backend::cuda::kernel_choice::compact>(
      reinterpret_cast<U*>(dst), dst_strides, shape, std::array<Strides, 0>{},
      [&](const Strides*, int) { return backend::scalar_evaluator<U>{bits}; });
}
#endif

/// dst = To(src) over `shape` when both operands are on the same device.
template <class To, class From>
void convert_on_device(strided_ref<To> dst, strided_ref<const From> src, const Shape& shape) {
  if (dst.device.is_cpu()) {
    cpu_convert(dst.data, dst.strides, src.data, src.strides, shape);
    return;
  }
#if TESSERA_CUDA_KERNELS
  DeviceGuard<tessera::cuda> guard(dst.device.index);
  if constexpr (std::is_same_v<To, From>) {
    copy_within_cuda(dst.data, dst.strides, src.data, src.strides, shape);
  } else {
    // A conversion: the vector kernel for a dense run, else one element at a time.
    backend::cuda::execute<backend::cuda::kernel_choice::compact>(
        dst.data, dst.strides, shape, std::array<Strides, 1>{src.strides},
        [&](const Strides* strides, int rank) {
          return copy_evaluator<To>(src.data, strides[0], rank);
        });
  }
#elif TESSERA_CUDA
  // Not compiled by nvcc: stage both spans through the host and run the CPU loop.
  element_span src_span = span_of(shape, src.strides);
  element_span dst_span = span_of(shape, dst.strides);
  std::int64_t src_count = src_span.last - src_span.first;
  std::int64_t dst_count = dst_span.last - dst_span.first;
  auto src_host = std::make_unique<From[]>(static_cast<std::size_t>(src_count));
  auto dst_host = std::make_unique<To[]>(static_cast<std::size_t>(dst_count));
  copy_bytes(src_host.get(), Device{}, src.data + src_span.first, src.device,
             sizeof(From) * static_cast<std::size_t>(src_count));
  // A view keeps the elements between its own: they are read first.
  if (!backend::cpu::is_row_major(shape, dst.strides)) {
    copy_bytes(dst_host.get(), Device{}, dst.data + dst_span.first, dst.device,
               sizeof(To) * static_cast<std::size_t>(dst_count));
  }
  cpu_convert(dst_host.get() - dst_span.first, dst.strides, src_host.get() - src_span.first,
              src.strides, shape);
  copy_bytes(dst.data + dst_span.first, dst.device, dst_host.get(), Device{},
             sizeof(To) * static_cast<std::size_t>(dst_count));
#else
  throw device_error("copy on " + dst.device.str() + ": Tessera was built without CUDA support");
#endif
}

/// dst = To(src) elementwise over `shape`, for operands on any two devices (src strides may be 0
/// for broadcast dimensions). Partial overlap of dst and src is the caller's to resolve.
template <class To, class From>
void copy_strided(strided_ref<To> dst, strided_ref<const From> src, const Shape& shape) {
  if (shape.numel() == 0) return;
  const bool same_space = dst.device == src.device || (dst.device.is_cpu() && src.device.is_cpu());
  if (same_space) {
    convert_on_device(strided_ref<To>{dst.data, dst.device, dst.strides},
                      strided_ref<const From>{src.data, dst.device, src.strides}, shape);
    return;
  }
#if TESSERA_CUDA
  const Strides dense = shape.contiguous_strides();
  const std::size_t count = static_cast<std::size_t>(shape.numel());
  // 1. src, contiguous, on its own device (skipped when it already is).
  const From* packed = src.data;
  std::unique_ptr<scratch_buffer> packed_buffer;
  if (!backend::cpu::is_row_major(shape, src.strides)) {
    packed_buffer = std::make_unique<scratch_buffer>(src.device, count * sizeof(From));
    convert_on_device(strided_ref<From>{static_cast<From*>(packed_buffer->data), src.device, dense},
                      src, shape);
    packed = static_cast<const From*>(packed_buffer->data);
  }
  // 2. The bytes across, straight into dst when it is contiguous and of the same dtype.
  if constexpr (std::is_same_v<To, From>) {
    if (backend::cpu::is_row_major(shape, dst.strides)) {
      copy_bytes(dst.data, dst.device, packed, src.device, count * sizeof(From));
      return;
    }
  }
  scratch_buffer moved(dst.device, count * sizeof(From));
  copy_bytes(moved.data, dst.device, packed, src.device, count * sizeof(From));
  // 3. Convert and scatter on dst's device.
  convert_on_device(
      dst, strided_ref<const From>{static_cast<const From*>(moved.data), dst.device, dense}, shape);
#else
  throw device_error("copy from " + src.device.str() + " to " + dst.device.str() +
                     ": Tessera was built without CUDA support");
#endif
}

/// dst = value over `shape`.
template <class T>
void fill_strided(strided_ref<T> dst, const Shape& shape, T value) {
  if (shape.numel() == 0) return;
  if (dst.device.is_cpu()) {
    cpu_fill(dst.data, dst.strides, shape, value);
    return;
  }
#if TESSERA_CUDA_KERNELS
  DeviceGuard<tessera::cuda> guard(dst.device.index);
  fill_within_cuda(dst.data, dst.strides, shape, value);
#elif TESSERA_CUDA
  // Not compiled by nvcc: fill the span on the host and copy it over.
  element_span span = span_of(shape, dst.strides);
  std::size_t count = static_cast<std::size_t>(span.last - span.first);
  auto host = std::make_unique<T[]>(count);
  // A view keeps the elements between its own: they are read first.
  if (!backend::cpu::is_row_major(shape, dst.strides)) {
    copy_bytes(host.get(), Device{}, dst.data + span.first, dst.device, count * sizeof(T));
  }
  cpu_fill(host.get() - span.first, dst.strides, shape, value);
  copy_bytes(dst.data + span.first, dst.device, host.get(), Device{}, count * sizeof(T));
#else
  throw device_error("fill on " + dst.device.str() + ": Tessera was built without CUDA support");
#endif
}

}  // namespace tessera::detail

// Compiled mode (core/config.hpp): the copies and fills between every pair of the dtypes that
// expressions on CUDA tensors use in g++ units (expr/detail/op_by_op.hpp's: int8 and int16 are
// left out) are compiled once, in tessera::compiled (with CUDA by nvcc, so a g++ unit's copies of
// CUDA tensors run the library's kernels rather than staging through the host).
#define TESSERA_CONVERT_TO(To, From)                                              \
  TESSERA_INSTANTIATE(void tessera::detail::convert_on_device<To, From>(          \
      tessera::detail::strided_ref<To>, tessera::detail::strided_ref<const From>, \
      const tessera::Shape&))
#define TESSERA_CONVERT_FROM(From)                                                                 \
  TESSERA_CONVERT_TO(float, From)                                                                  \
  TESSERA_CONVERT_TO(double, From)                                                                 \
  TESSERA_CONVERT_TO(tessera::half, From)                                                          \
  TESSERA_CONVERT_TO(tessera::bfloat16, From)                                                      \
  TESSERA_CONVERT_TO(std::int64_t, From)                                                           \
  TESSERA_CONVERT_TO(std::int32_t, From)                                                           \
  TESSERA_CONVERT_TO(std::uint8_t, From)                                                           \
  TESSERA_CONVERT_TO(bool, From)                                                                   \
  TESSERA_INSTANTIATE(void tessera::detail::fill_strided<From>(tessera::detail::strided_ref<From>, \
                                                               const tessera::Shape&, From))
TESSERA_CONVERT_FROM(float)
TESSERA_CONVERT_FROM(double)
TESSERA_CONVERT_FROM(tessera::half)
TESSERA_CONVERT_FROM(tessera::bfloat16)
TESSERA_CONVERT_FROM(std::int64_t)
TESSERA_CONVERT_FROM(std::int32_t)
TESSERA_CONVERT_FROM(std::uint8_t)
TESSERA_CONVERT_FROM(bool)
#undef TESSERA_CONVERT_FROM
#undef TESSERA_CONVERT_TO
