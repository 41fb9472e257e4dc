// CUDA counterparts of backend/cpu/strided_loop.hpp: one grid-stride kernel that converts or
// fills a strided index space. Included only by translation units compiled by nvcc; a g++ unit
// reaches CUDA memory through the runtime API (tensor/detail/copy.hpp stages through the host).
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA_KERNELS
#include <array>
#include <cstdint>
#include <type_traits>

#include "tessera/backend/cpu/strided_loop.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/core/stream.hpp"

namespace tessera::backend::cuda {

/// Maps a linear (row-major) index to N operands' element offsets; passed to kernels by value.
template <int N>
struct offset_calculator {
  int rank = 0;
  std::int64_t sizes[max_dims] = {};
  std::int64_t strides[N][max_dims] = {};

  offset_calculator(const Shape& shape, const std::array<Strides, N>& operand_strides) {
    cpu::strided_layout<N> layout(shape, operand_strides);
    rank = layout.shape.size();
    for (int d = 0; d < rank; ++d) {
      sizes[d] = layout.shape[d];
      for (int k = 0; k < N; ++k) strides[k][d] = layout.strides[k][d];
    }
  }

  __device__ void offsets(std::int64_t linear, std::int64_t (&out)[N]) const {
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      std::int64_t i = linear % sizes[d];
      linear /= sizes[d];
      for (int k = 0; k < N; ++k) out[k] += i * strides[k][d];
    }
  }
};

template <class To, class From>
__global__ void convert_kernel(To* dst, const From* src, offset_calculator<2> calc, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t offset[2];
    calc.offsets(i, offset);
    if constexpr (std::is_same_v<To, bool>) {
      dst[offset[0]] = static_cast<float>(src[offset[1]]) != 0.0f;
    } else {
      dst[offset[0]] = static_cast<To>(src[offset[1]]);
    }
  }
}

template <class T>
__global__ void fill_kernel(T* dst, offset_calculator<1> calc, std::int64_t n, T value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t offset[1];
    calc.offsets(i, offset);
    dst[offset[0]] = value;
  }
}

inline unsigned grid_size(std::int64_t n, unsigned block) {
  // Enough blocks for one element per thread, capped: the grid-stride loop covers the rest.
  std::int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

/// dst = To(src) elementwise over `shape`, both on the current device, on `stream`.
template <class To, class From>
void convert(To* dst, const Strides& dst_strides, const From* src, const Strides& src_strides,
             const Shape& shape, stream_ref stream) {
  std::int64_t n = shape.numel();
  if (n == 0) return;
  constexpr unsigned block = 256;
  convert_kernel<<<grid_size(n, block), block, 0, stream.native()>>>(
      dst, src, offset_calculator<2>(shape, {dst_strides, src_strides}), n);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

/// dst = value elementwise over `shape` on the current device, on `stream`.
template <class T>
void fill(T* dst, const Strides& dst_strides, const Shape& shape, T value, stream_ref stream) {
  std::int64_t n = shape.numel();
  if (n == 0) return;
  constexpr unsigned block = 256;
  fill_kernel<<<grid_size(n, block), block, 0, stream.native()>>>(
      dst, offset_calculator<1>(shape, {dst_strides}), n, value);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tessera::backend::cuda
#endif
