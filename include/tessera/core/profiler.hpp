// Debug counters. kernel_launches() counts executor passes (CUDA kernels and CPU loops alike) so
// tests can check that a fused statement runs as one pass.
#pragma once

#include <atomic>
#include <cstdint>

namespace tessera::profiler {

namespace detail {
inline std::atomic<std::int64_t>& launch_counter() {
  static std::atomic<std::int64_t> launches{0};
  return launches;
}
}  // namespace detail

/// Executor passes since the program started (or since reset_kernel_launches()).
inline std::int64_t kernel_launches() {
  return detail::launch_counter().load(std::memory_order_relaxed);
}
inline void reset_kernel_launches() { detail::launch_counter().store(0, std::memory_order_relaxed); }
/// Called by the executors, once per pass.
inline void count_launch() { detail::launch_counter().fetch_add(1, std::memory_order_relaxed); }

}  // namespace tessera::profiler
