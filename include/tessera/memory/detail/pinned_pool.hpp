// The process-wide pool of pinned host memory behind Tensor::pin_memory and the DataLoader's
// pin_memory (memory::pinned_stats, memory::pinned_empty_cache): a pool_resource over
// pinned_host_memory_resource whose frees wait for the CUDA streams recorded on a block, as
// PyTorch's CachingHostAllocator does, so that a block is not handed out again while an
// asynchronous copy from or to it runs. Compiled where TESSERA_DEFINITIONS is 1; CUDA builds only
// (elsewhere pinning throws device_error and the statistics stay 0). memory.hpp declares these
// functions and includes this header after them.
#pragma once

#include <cstddef>

#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/stats.hpp"

#if TESSERA_DEFINITIONS && TESSERA_CUDA
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tessera/memory/pinned_host_memory_resource.hpp"
#include "tessera/memory/pool.hpp"
#include "tessera/memory/size_policy.hpp"
#include "tessera/memory/stream_policy.hpp"
#endif

#if TESSERA_DEFINITIONS

namespace tessera::memory::detail {

#if TESSERA_CUDA
/// The pinned pool's stream policy. Pinned memory serves copies to and from every CUDA device,
/// and an event must be created on the device of the stream it is recorded on, so the pool's
/// "streams" are keys naming a (device, stream) pair: interned once per pair (a handful in a
/// program) and never freed, so that a key stays valid in blocks that name it. Each device's
/// events are a cuda_stream_policy's (its free list, and its wait for a stream destroyed since
/// it was recorded). A block's own stream is a key that no copy uses (host_key), so every stream
/// a copy records is "another stream" and gets an event: host allocation is not ordered with any
/// stream, unlike cudaMalloc's.
class pinned_stream_policy {
 public:
  static constexpr bool tracks_streams = true;
  struct event_type {
    cudaEvent_t event = nullptr;
    int device = 0;
  };

  explicit pinned_stream_policy(Device) {}

  /// The key of the blocks themselves (never recorded).
  static stream_ref host_key() noexcept {
    static char key;
    return stream_ref{static_cast<void*>(&key)};
  }
  /// The key of `stream` on CUDA device `device`.
  static stream_ref key(int device, stream_ref stream) {
    static std::mutex mutex;
    static auto* keys = new std::map<std::pair<int, void*>, stream_key*>();  // leaked: see above
    std::lock_guard lock(mutex);
    stream_key*& entry = (*keys)[{device, stream.handle}];
    if (entry == nullptr) entry = new stream_key{device, stream};
    return stream_ref{static_cast<void*>(entry)};
  }

  /// Records an event on the stream a key names; throws cuda_error.
  event_type record(stream_ref key) {
    const stream_key& named = *static_cast<const stream_key*>(key.handle);
    if (devices_.size() <= static_cast<std::size_t>(named.device)) {
      devices_.resize(static_cast<std::size_t>(named.device) + 1);
    }
    auto& events = devices_[static_cast<std::size_t>(named.device)];
    if (!events) {
      events = std::make_unique<cuda_stream_policy>(Device{DeviceType::cuda, named.device});
    }
    return {events->record(named.stream), named.device};
  }
  bool query(event_type event) { return of(event).query(event.event); }
  void synchronize(event_type event) { of(event).synchronize(event.event); }
  void release(event_type event) noexcept { of(event).release(event.event); }

 private:
  struct stream_key {
    int device;
    stream_ref stream;
  };
  // The policy of an event's device (record made it).
  cuda_stream_policy& of(event_type event) const noexcept {
    return *devices_[static_cast<std::size_t>(event.device)];
  }
  std::vector<std::unique_ptr<cuda_stream_policy>> devices_;
};

using pinned_pool_resource =
    pool_resource<pinned_host_memory_resource, pytorch_size_policy, pinned_stream_policy>;

/// The pool, created on first use (thread-safe) and leaked on purpose, as the device pools are:
/// pinned tensors destroyed during static destruction must still find it.
inline pinned_pool_resource& pinned_pool() {
  static pinned_pool_resource* pool = new pinned_pool_resource(Device{});
  return *pool;
}
#endif  // TESSERA_CUDA

TESSERA_API void* pinned_allocate(std::size_t bytes) {
#if TESSERA_CUDA
  if (!cuda::is_available()) {
    throw device_error(
        "pin_memory: Cannot access accelerator device when none is available (no CUDA device "
        "is present)");
  }
  return pinned_pool().allocate(bytes, pinned_stream_policy::host_key());
#else
  (void)bytes;
  throw device_error(
      "pin_memory: Cannot access accelerator device when none is available (Tessera was built "
      "without CUDA support)");
#endif
}

TESSERA_API void pinned_deallocate(void* pointer, std::size_t bytes) noexcept {
#if TESSERA_CUDA
  if (pointer == nullptr) return;
  try {
    pinned_pool().deallocate(pointer, bytes, pinned_stream_policy::host_key());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: freeing pinned host memory failed: %s\n", e.what());
    std::terminate();
  }
#else
  (void)pointer;
  (void)bytes;
#endif
}

TESSERA_API void pinned_record_stream(void* pointer, Device device, stream_ref stream) {
#if TESSERA_CUDA
  if (pointer == nullptr) return;
  pinned_pool().record_stream(pointer, pinned_stream_policy::key(device.index, stream));
#else
  (void)pointer;
  (void)device;
  (void)stream;
#endif
}

}  // namespace tessera::memory::detail

namespace tessera::memory {

TESSERA_API MemoryStats pinned_stats() {
#if TESSERA_CUDA
  if (cuda::is_available()) return detail::pinned_pool().stats();
#endif
  return MemoryStats{};
}

TESSERA_API void pinned_empty_cache() {
#if TESSERA_CUDA
  if (cuda::is_available()) detail::pinned_pool().empty_cache();
#endif
}

}  // namespace tessera::memory
#endif  // TESSERA_DEFINITIONS
