// How the CUDA backend cuts a full reduction into blocks: plain host and device arithmetic,
// apart from the kernels (backend/cuda/reduce.cuh) so that CPU tests can check that the blocks'
// slices cover every element exactly once.
#pragma once

#include <cstdint>

#include "tessera/core/config.hpp"

namespace tessera::backend::cuda {

/// Elements per thread below which a full reduction uses fewer blocks: enough that a thread's
/// loads are in flight together and its block's merge is a small part of its work.
inline constexpr std::int64_t full_reduction_min_per_thread = 32;

/// A full reduction of n elements: `blocks` blocks of `width` threads, block b folding elements
/// [first(b), last(b, n)); with more than one block, a second, one-block launch merges their
/// partials.
struct full_reduction_plan {
  std::int64_t blocks = 1;
  std::int64_t chunk = 0;

  /// At most max_blocks blocks, and with several blocks at least min_per_thread elements per
  /// thread (width, max_blocks and min_per_thread positive). Each slice is a whole multiple of the
  /// block's width, so every thread's elements follow one pattern; the last slice takes the rest.
  TESSERA_HOST_DEVICE static full_reduction_plan make(std::int64_t n, std::int64_t width,
                                                      std::int64_t max_blocks,
                                                      std::int64_t min_per_thread) {
    full_reduction_plan plan;
    const std::int64_t per_block = min_per_thread * width;
    std::int64_t blocks = n / per_block;
    if (blocks > max_blocks) blocks = max_blocks;
    if (blocks < 1) blocks = 1;
    const std::int64_t chunk = ((n + blocks - 1) / blocks + width - 1) / width * width;
    plan.chunk = chunk;
    plan.blocks = chunk > 0 ? (n + chunk - 1) / chunk : 1;
    return plan;
  }
  TESSERA_HOST_DEVICE std::int64_t first(std::int64_t block) const { return block * chunk; }
  TESSERA_HOST_DEVICE std::int64_t last(std::int64_t block, std::int64_t n) const {
    const std::int64_t end = (block + 1) * chunk;
    return end < n ? end : n;
  }
};

}  // namespace tessera::backend::cuda
