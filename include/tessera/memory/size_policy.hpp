// Size policies of pool_resource: how a request is rounded, which pool (small or large) serves
// it, how large a segment to take from the upstream, and when a free block may be split. The
// default copies PyTorch's CUDACachingAllocator, which is well tuned for tensors on GPUs and reads
// the same on the CPU, so statistics mean the same on every device.
#pragma once

#include <concepts>
#include <cstddef>
#include <limits>

namespace tessera::memory {

/// What pool_resource needs from a size policy. `round_size(bytes)` is the block size for a
/// request (a multiple of 512); `is_small(size)` picks the pool; `segment_size(size)` is what to
/// take from the upstream; `should_split(small, block, size)` decides whether the rest of a free
/// block of `block` bytes is split off; `may_use(block, size)` may refuse a free block (oversize).
template <class P>
concept size_policy = requires(const P& policy, std::size_t bytes, bool small) {
  { policy.round_size(bytes) } -> std::same_as<std::size_t>;
  { policy.is_small(bytes) } -> std::same_as<bool>;
  { policy.segment_size(bytes) } -> std::same_as<std::size_t>;
  { policy.should_split(small, bytes, bytes) } -> std::same_as<bool>;
  { policy.may_use(bytes, bytes) } -> std::same_as<bool>;
};

/// PyTorch's policy (c10/cuda/CUDACachingAllocator.cpp) without power-of-two rounding divisions.
struct pytorch_size_policy {
  static constexpr std::size_t KiB = 1024;
  static constexpr std::size_t MiB = 1024 * KiB;

  /// Granularity and minimum block size (kMinBlockSize).
  static constexpr std::size_t min_block_size = 512;
  /// Requests up to this size are served from the small pool (kSmallSize).
  static constexpr std::size_t small_size = 1 * MiB;
  /// Segment size of the small pool (kSmallBuffer): 2 MiB, the GPU page size; see PyTorch #17120.
  static constexpr std::size_t small_buffer = 2 * MiB;
  /// Requests below this (and above small_size) share one large_buffer segment (kMinLargeAlloc).
  static constexpr std::size_t min_large_alloc = 10 * MiB;
  /// Segment size for medium requests (kLargeBuffer); packing 1-10 MiB tensors into 20 MiB
  /// segments cut Mask R-CNN's memory by 10-20% (PyTorch #17120).
  static constexpr std::size_t large_buffer = 20 * MiB;
  /// Larger requests get a segment of their size rounded up to this (kRoundLarge).
  static constexpr std::size_t round_large = 2 * MiB;

  /// Blocks of at least this size are never split, and requests below it never take them
  /// (PyTorch's max_split_size_mb; unlimited by default, as in PyTorch).
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();

  /// `bytes` rounded up to a multiple of 512 (at least 512). `bytes` must be at most
  /// SIZE_MAX - 2 MiB (the pool refuses larger requests before asking).
  std::size_t round_size(std::size_t bytes) const noexcept {
    if (bytes < min_block_size) return min_block_size;
    return min_block_size * ((bytes + min_block_size - 1) / min_block_size);
  }
  bool is_small(std::size_t size) const noexcept { return size <= small_size; }
  std::size_t segment_size(std::size_t size) const noexcept {
    if (size <= small_size) return small_buffer;
    if (size < min_large_alloc) return large_buffer;
    return round_large * ((size + round_large - 1) / round_large);
  }
  /// Small pool: split when at least one minimum block remains; large pool: when more than
  /// small_size remains (a smaller rest would only serve small requests, which never come here).
  bool should_split(bool small, std::size_t block_size, std::size_t size) const noexcept {
    std::size_t remaining = block_size - size;
    if (small) return remaining >= min_block_size;
    return size < max_split_size && remaining > small_size;
  }
  /// Oversize rule: a request below max_split_size never takes an oversize block, and an oversize
  /// request takes a cached block only if it wastes less than large_buffer.
  bool may_use(std::size_t block_size, std::size_t size) const noexcept {
    if (size < max_split_size && block_size >= max_split_size) return false;
    if (size >= max_split_size && block_size >= size + large_buffer) return false;
    return true;
  }
};

}  // namespace tessera::memory
