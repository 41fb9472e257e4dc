// Random fills on CUDA devices (ts::rand, ts::randn, nn::init, Dropout's mask): a thread per
// counter block writes that block's values with the same uniform_fill / normal_fill code the
// CPU's loops run (core/random.hpp), so a CUDA tensor gets the CPU's uniform numbers bit for bit
// and its normals to a few ulp, without drawing them on the host and copying them over.
// Included only by nvcc-compiled units.
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA_KERNELS
#include <algorithm>
#include <cstdint>

#include "tessera/backend/cuda/executor.cuh"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/random.hpp"
#include "tessera/core/stream.hpp"

namespace tessera::backend::cuda {

/// Thread t of the grid writes counter blocks t, t + grid, ... of a fill of n elements. With a
/// device state (a fill captured in a CUDA graph: philox_draw), the seed and the base offset are
/// read from it when the kernel runs, and `offset` counts from that base.
template <class T, class Fill>
__global__ void __launch_bounds__(threads_per_block)
    random_fill_kernel(T* out, std::uint64_t n, std::uint64_t seed, std::uint64_t offset,
                       const std::uint64_t* device_state, std::uint64_t blocks, Fill fill) {
  if (device_state != nullptr) {
    seed = device_state[0];
    offset += device_state[1];
  }
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < blocks; b += stride) {
    fill.block(out, n, seed, offset, b);
  }
}

/// Writes the n elements of `fill` drawn as `draw` says (from counter block draw.offset of
/// draw.seed, or of the device state's) into contiguous device memory `out` on the current
/// device, on `stream`. Counts one launch.
template <class T, class Fill>
void random_fill(T* out, std::int64_t n, const philox_draw& draw, const Fill& fill,
                 stream_ref stream = tessera::detail::current_cuda_stream()) {
  profiler::count_launch();
  if (n <= 0) return;
  const auto count = static_cast<std::uint64_t>(n);
  const std::uint64_t blocks = blocks_needed<T>(count);
  const std::uint64_t wanted = (blocks + threads_per_block - 1) / threads_per_block;
  const auto cap = static_cast<std::uint64_t>(multiprocessor_count()) * 8;
  const auto grid = static_cast<unsigned>(std::max<std::uint64_t>(1, std::min(wanted, cap)));
  random_fill_kernel<<<grid, threads_per_block, 0, stream.native()>>>(
      out, count, draw.seed, draw.offset, draw.device_state, blocks, fill);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tessera::backend::cuda
#endif
