// Tensor factories: empty, zeros, ones, full, arange, rand, randn, from_vector, empty_like and
// zeros_like. Each takes the dtype and device kind as template arguments and an ordinal (-1: the
// kind's current device); empty and the *_like ones also a memory format.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/backend/cuda/random.cuh"
#include "tessera/core/random.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera {

/// An uninitialised contiguous tensor. Throws shape_error for a negative extent and device_error
/// for an ordinal that does not exist.
template <Dtype T, DeviceKind K = cpu>
Tensor<T, K> empty(const Shape& shape, int device = -1) {
  return Tensor<T, K>::empty_on(shape, resolve_device<K>(device));
}

/// An uninitialised dense tensor laid out in `format` (`ts::memory_format::channels_last` for
/// a 4-d [N, C, H, W] tensor stored NHWC). Throws shape_error for channels_last on a shape that
/// is not 4-d and tessera::error for preserve_format, before anything is allocated.
template <Dtype T, DeviceKind K = cpu>
Tensor<T, K> empty(const Shape& shape, memory_format format, int device = -1) {
  return Tensor<T, K>::empty_on(shape, resolve_device<K>(device), format);
}

/// An uninitialised tensor with `like`'s shape, dtype and device, in `format`; preserve_format
/// (the default, as PyTorch's empty_like) keeps a channels_last tensor's layout (see
/// Tensor::clone).
template <Dtype T, DeviceKind K>
Tensor<T, K> empty_like(const Tensor<T, K>& like,
                        memory_format format = memory_format::preserve_format) {
  if (!like.defined()) detail::throw_undefined("empty_like");
  return Tensor<T, K>::empty_on(like.shape(), like.device(),
                                detail::resolve_format(format, like.shape(), like.strides()));
}

/// empty_like filled with zeros.
template <Dtype T, DeviceKind K>
Tensor<T, K> zeros_like(const Tensor<T, K>& like,
                        memory_format format = memory_format::preserve_format) {
  auto out = empty_like(like, format);
  out.zero_();
  return out;
}

/// A tensor filled with `value` (a number converted to T; one that does not fit T, as NaN for an
/// integer dtype, throws tessera::error before anything is allocated, as PyTorch's full).
template <Dtype T, DeviceKind K = cpu, class S = T>
  requires std::is_arithmetic_v<S> || std::is_same_v<S, half> || std::is_same_v<S, bfloat16>
Tensor<T, K> full(const Shape& shape, S value, int device = -1) {
  const T converted = checked_scalar<T>(value, "full");
  auto out = empty<T, K>(shape, device);
  out.fill_(converted);
  return out;
}

template <Dtype T, DeviceKind K = cpu>
Tensor<T, K> zeros(const Shape& shape, int device = -1) {
  return full<T, K>(shape, T(0), device);
}

template <Dtype T, DeviceKind K = cpu>
Tensor<T, K> ones(const Shape& shape, int device = -1) {
  return full<T, K>(shape, T(1), device);
}

/// A tensor holding `values` in row-major order. Throws shape_error when their count does not
/// match the shape (nothing is allocated then).
template <Dtype T, DeviceKind K = cpu>
Tensor<T, K> from_vector(const std::vector<T>& values, const Shape& shape, int device = -1) {
  detail::check_value_count(values.size(), shape, "from_vector");
  auto out = empty<T, K>(shape, device);
  if constexpr (std::is_same_v<T, bool>) {
    auto host = std::make_unique<bool[]>(values.size());
    std::copy(values.begin(), values.end(), host.get());
    out.copy_from_host(host.get());
  } else {
    out.copy_from_host(values.data());
  }
  return out;
}

/// 1-D tensor of start, start + step, ... up to but excluding end (PyTorch's arange; values are
/// computed as start + i * step in double, then converted).
template <Dtype T, DeviceKind K = cpu>
Tensor<T, K> arange(double start, double end, double step = 1.0, int device = -1) {
  if (step == 0.0 || !std::isfinite(start) || !std::isfinite(end) || !std::isfinite(step)) {
    throw error("arange: start " + std::to_string(start) + ", end " + std::to_string(end) +
                " and step " + std::to_string(step) + " must be finite with a non-zero step");
  }
  if ((end - start) / step < 0) {
    throw error("arange: end " + std::to_string(end) + " cannot be reached from start " +
                std::to_string(start) + " with step " + std::to_string(step));
  }
  const double steps = std::ceil((end - start) / step);
  // 2^62 elements: beyond any memory, and exactly representable, so the cast below is defined.
  if (!(steps < 0x1p62)) {
    throw shape_error("arange: start " + detail::number_str(start) + ", end " +
                      detail::number_str(end) + " and step " + detail::number_str(step) +
                      " give " + detail::number_str(steps) + " elements, too many for a tensor");
  }
  const auto count = static_cast<std::int64_t>(steps);
  // Written into a CPU tensor from the pool (limits and statistics apply), then moved.
  Tensor<T, cpu> values = empty<T, cpu>({count}, std::is_same_v<K, cpu> ? device : -1);
  T* out = values.data();
  for (std::int64_t i = 0; i < count; ++i) {
    out[i] = backend::store_cast<T>(start + static_cast<double>(i) * step);
  }
  if constexpr (std::is_same_v<K, cpu>) {
    return values;
  } else {
    return values.template to<K>(device);
  }
}

/// arange(0, end).
template <Dtype T, DeviceKind K = cpu>
Tensor<T, K> arange(double end) {
  return arange<T, K>(0.0, end, 1.0, -1);
}

namespace detail {
// The numbers depend only on (seed, offset, element index), so a CPU and a CUDA tensor of the
// same seed and shape hold the same numbers (uniform ones bit for bit, normal ones to a few ulp:
// core/random.hpp).
/// Counter blocks a CPU thread fills at a time.
inline constexpr std::int64_t random_blocks_per_chunk = 4096;

/// Fills `out` with `fill` (uniform_fill<T> or normal_fill<T>), element i in row-major order
/// getting number i, reserving the counter blocks from its device's generator. `out` is a
/// handle: the storage it shares is what gets filled. A contiguous CPU tensor is filled in place
/// by the thread pool; a contiguous CUDA tensor by a kernel in a unit nvcc compiles
/// (backend/cuda/random.cuh), on the current stream; anything else is drawn in a contiguous
/// buffer (host memory, or device memory under nvcc) and copied in.
template <Dtype T, DeviceKind K, class Fill>
void fill_random_(Tensor<T, K> out, const Fill& fill) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  Generator& generator = default_generator(out.device());
  const auto count = static_cast<std::uint64_t>(n);
  const std::uint64_t blocks = blocks_needed<T>(count);
  // Seed and offset are read under one lock, so a concurrent manual_seed cannot mix them; inside
  // a CUDA graph's capture they come from device memory at each launch (reserve_draw).
  const philox_draw state = generator.reserve_draw(blocks);
  if constexpr (!(std::is_same_v<K, cuda> && TESSERA_CUDA_KERNELS)) {
    if (state.device_state != nullptr) {
      throw error("random numbers for " + out.device().str() +
                  " drawn on the host (on the CPU, or in a unit not compiled by nvcc) cannot be "
                  "captured in a CUDA graph");
    }
  }
  if constexpr (std::is_same_v<K, cpu>) {
    if (out.is_contiguous()) {
      T* data = out.data();
      backend::cpu::execute_loop(0, static_cast<std::int64_t>(blocks), random_blocks_per_chunk,
                                 [&](std::int64_t first, std::int64_t last) {
                                   fill_blocks(data, count, state.seed, state.offset, fill,
                                               static_cast<std::uint64_t>(first),
                                               static_cast<std::uint64_t>(last));
                                 });
      return;
    }
  }
#if TESSERA_CUDA_KERNELS
  if constexpr (std::is_same_v<K, cuda>) {
    DeviceGuard<cuda> guard(out.device_index());
    if (out.is_contiguous()) {
      backend::cuda::random_fill(out.data(), n, state, fill);
    } else {
      Tensor<T, K> dense = Tensor<T, K>::empty_on(out.shape(), out.device());
      backend::cuda::random_fill(dense.data(), n, state, fill);
      out.copy_(dense);
    }
    return;
  }
#endif
  std::vector<T> host(static_cast<std::size_t>(n));
  fill_blocks(host.data(), count, state.seed, state.offset, fill, 0, blocks);
  out.copy_from_host(host.data());
}

/// `out` (any layout) filled as rand fills a new tensor of its shape.
template <Dtype T, DeviceKind K>
void fill_uniform_(Tensor<T, K> out) {
  fill_random_(std::move(out), uniform_fill<T>{uniform_transform<random_compute_t<T>>(0.0, 1.0)});
}

template <Dtype T, DeviceKind K, class Fill>
Tensor<T, K> random_tensor(const char* operation, const Shape& shape, int device,
                           const Fill& fill) {
  static_assert(is_floating_point(scalar_type_of<T>),
                "rand/randn make floating-point tensors: use float, double, half or bfloat16");
  shape.check_non_negative(operation);
  auto out = Tensor<T, K>::empty_on(shape, resolve_device<K>(device));
  fill_random_(out, fill);
  return out;
}
}  // namespace detail

/// Uniform numbers in [0, 1) from the device's Philox generator (see manual_seed).
template <Dtype T, DeviceKind K = cpu>
Tensor<T, K> rand(const Shape& shape, int device = -1) {
  return detail::random_tensor<T, K>(
      "rand", shape, device, uniform_fill<T>{uniform_transform<random_compute_t<T>>(0.0, 1.0)});
}

/// Standard normal numbers from the device's Philox generator (Box-Muller).
template <Dtype T, DeviceKind K = cpu>
Tensor<T, K> randn(const Shape& shape, int device = -1) {
  return detail::random_tensor<T, K>(
      "randn", shape, device, normal_fill<T>{normal_transform<random_compute_t<T>>(0.0, 1.0)});
}

}  // namespace tessera
