// Debug counters and the profiler's hook. kernel_launches() counts executor passes (CUDA kernels
// and CPU loops alike) so tests can check that a fused statement runs as one pass. A `range`
// reports a named stretch of work to the calling thread's recorder, when one records (a
// ts::tools::Profile, tessera/tools/profile.hpp): compiled programs report each node's forward
// and backward, the optimisers their steps. With nothing recording a range costs one
// thread-local load.
#pragma once

#include <atomic>
#include <cstdint>

#include "tessera/core/device.hpp"

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

/// Where a thread's ranges go while it records (tools::Profile's recording scope implements it).
/// begin and end come in nested pairs on one thread; end must not throw.
class recorder {
 public:
  /// `name` and `phase` are copied (they need not outlive the call); `device`'s current stream
  /// is where a CUDA range's time is taken.
  virtual void begin(const char* name, const char* phase, Device device) = 0;
  virtual void end() noexcept = 0;

 protected:
  ~recorder() = default;
};

namespace detail {
inline recorder*& thread_recorder() noexcept {
  thread_local recorder* current = nullptr;
  return current;
}
}  // namespace detail

/// The calling thread's recorder, or nullptr when nothing records on it.
inline recorder* active_recorder() noexcept { return detail::thread_recorder(); }

/// Reports the stretch from its construction to its destruction as `name` (with `phase`, e.g.
/// "forward") on `device` to the thread's recorder, if one records (PyTorch's record_function):
/// the host's time, and for a CUDA device the time between two events on its current stream.
class range {
 public:
  explicit range(const char* name, Device device = Device{}) : range(name, "", device) {}
  range(const char* name, const char* phase, Device device) : recorder_(active_recorder()) {
    if (recorder_ != nullptr) recorder_->begin(name, phase, device);
  }
  ~range() {
    if (recorder_ != nullptr) recorder_->end();
  }
  range(const range&) = delete;
  range& operator=(const range&) = delete;

 private:
  recorder* recorder_;
};

}  // namespace tessera::profiler
