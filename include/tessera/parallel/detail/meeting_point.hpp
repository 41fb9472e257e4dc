// meeting_point: the barrier DataParallel's devices meet at in a training step (the fused weight
// products of parallel/detail/overlapped_reduction.hpp), with abort() so that a device that
// throws releases the others instead of leaving them waiting.
#pragma once

#include <atomic>
#include <cstdint>

#include "tessera/parallel/device_threads.hpp"

namespace tessera::parallel::detail {

/// Thrown in a device's thread when another device's failure ends a meeting_point's wait.
struct meeting_aborted {};

/// A barrier for a fixed team of threads that spins briefly, then sleeps; abort() releases every
/// waiter (now and until reset()) with meeting_aborted, so a device that throws cannot leave the
/// others waiting for it.
class meeting_point {
 public:
  void arrive_and_wait(int count) {
    const std::uint32_t seen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      generation_.notify_all();
    } else {
      auto moved = [&] {
        return generation_.load(std::memory_order_acquire) != seen ||
               aborted_.load(std::memory_order_acquire);
      };
      while (!spin_until(moved)) {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    if (aborted_.load(std::memory_order_acquire)) throw meeting_aborted{};
  }
  void abort() {
    aborted_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
  }
  /// Between uses, with no thread inside.
  void reset() {
    arrived_.store(0, std::memory_order_relaxed);
    aborted_.store(false, std::memory_order_relaxed);
  }

 private:
  std::atomic<int> arrived_{0};
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> aborted_{false};
};

}  // namespace tessera::parallel::detail
