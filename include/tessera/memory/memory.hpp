// The per-device memory functions (DESIGN §3.2): one caching pool per device, created lazily,
// with PyTorch's statistics (memory::allocated, reserved, stats, summary ...), a limit for
// testing OOM on any machine, and the allocate/deallocate/record_stream calls the tensor layer
// makes. Every function takes a tessera::Device and throws device_error if it does not exist.
// The registry they reach the devices' resources through is detail/device_registry.hpp; the
// memory history and the pinned pool are defined in detail/ headers included at the end.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/cuda_memory_resource.hpp"
#include "tessera/memory/detail/device_registry.hpp"
#include "tessera/memory/detail/private_pool.hpp"
#include "tessera/memory/detail/thread_cache.hpp"
#include "tessera/memory/device_memory_resource.hpp"
#include "tessera/memory/format.hpp"
#include "tessera/memory/host_memory_resource.hpp"
#include "tessera/memory/limit_resource_adaptor.hpp"
#include "tessera/memory/pool.hpp"
#include "tessera/memory/resource.hpp"
#include "tessera/memory/stats.hpp"

namespace tessera::memory {

namespace detail {

// The hit path of a CPU tensor's storage (tensor/storage.hpp), inlined where storage is made and
// released, in header-only and compiled use alike: a block of the calling thread's cache without
// a call. Each says when it cannot serve (no cache yet, another device, the device recording its
// history or having a private pool, a size not cached); memory::allocate and deallocate then do,
// with every check. Measured: the calls of the general path (allocate, deallocate, the cache's
// take and put) were half of a create+destroy in a large translation unit, where GCC stops
// inlining them.

/// A block of exactly `bytes` for CPU device `device` from the calling thread's cache, or nullptr.
[[gnu::always_inline]] inline void* allocate_cached(Device device, std::size_t bytes) noexcept {
  if (device.type != DeviceType::cpu || cpu_slow_allocation_path(device.index)) return nullptr;
  device_thread_cache* cache = thread_cache::find_local(device.index);
  return cache != nullptr ? cache->take(bytes) : nullptr;
}

/// Keeps the freed block `pointer` of `bytes` of CPU device `device` in the calling thread's
/// cache when deallocate would (the thread's current device, a cached size); false otherwise.
[[gnu::always_inline]] inline bool deallocate_cached(Device device, void* pointer,
                                                     std::size_t bytes) noexcept {
  if (device.type != DeviceType::cpu ||
      device.index != tessera::detail::current_cpu_device_slot() ||
      cpu_slow_allocation_path(device.index)) {
    return false;
  }
  device_thread_cache* cache = thread_cache::find_local(device.index);
  return cache != nullptr && cache->put(pointer, bytes);
}

}  // namespace detail

/// The resource serving `device` (its pool, unless set_device_resource installed another).
inline device_memory_resource& get_device_resource(Device device) {
  return detail::flushed_resource_of(device, "get_device_resource");
}

/// Installs `resource` for `device` (e.g. make_pool_resource over cuda_async_memory_resource, or a
/// pool with another size policy) and returns the previous one, or nullptr if the device had not
/// used its default one yet. Do it before the device allocates: throws tessera::error if the
/// current resource has live allocations, std::invalid_argument for a null resource or one made
/// for another device, device_error for a device that does not exist. Must not race with
/// allocations on the same device.
inline std::unique_ptr<device_memory_resource> set_device_resource(
    Device device, std::unique_ptr<device_memory_resource> resource) {
  detail::flushed_resource_of(device, "set_device_resource");
  if (resource == nullptr) {
    throw std::invalid_argument("memory::set_device_resource(" + device.str() +
                                "): the resource is null");
  }
  if (resource->device() != device) {
    throw std::invalid_argument("memory::set_device_resource(" + device.str() +
                                "): the resource was made for " + resource->device().str());
  }
  return detail::device_registry::instance().replace(device, std::move(resource));
}

/// Allocates `bytes` on `device` for work on `stream` from the device's pool. Returns nullptr for
/// 0 bytes (nothing is accounted, as PyTorch's empty tensors). Throws out_of_memory_error after
/// releasing cached segments and retrying once; device_error for a device that does not exist.
///
/// On CPU devices a small request is first served from the calling thread's cache of blocks it
/// freed on its current device (no lock); a request the cache cannot serve returns the cached
/// blocks to the pool first.
TESSERA_API void* allocate(Device device, std::size_t bytes, stream_ref stream = {});

/// Frees memory from allocate: `bytes` as passed to allocate, `stream` the stream it was last used
/// on. nullptr is a no-op. A pointer or size that the device's pool did not hand out is a bug that
/// terminates the program with a message naming the pointer and the device.
TESSERA_API void deallocate(Device device, void* pointer, std::size_t bytes,
                            stream_ref stream = {}) noexcept;

namespace detail {
/// Temporary buffer from a device's pool, returned on scope exit (on `stream`, the stream that
/// used it: the pool hands it out again only after that work). The library's scratch for copies
/// through the host and reductions' partials.
struct scratch_buffer {
  Device device;
  std::size_t bytes = 0;
  stream_ref stream;
  void* data = nullptr;
  scratch_buffer(Device d, std::size_t n, stream_ref s = {})
      : device(d), bytes(n), stream(s), data(allocate(d, n, s)) {}
  ~scratch_buffer() { deallocate(device, data, bytes, stream); }
  scratch_buffer(const scratch_buffer&) = delete;
  scratch_buffer& operator=(const scratch_buffer&) = delete;
};
}  // namespace detail

/// Marks memory from allocate as used by work on `stream`, so that on free it rejoins the pool
/// only after that work is done (PyTorch's Tensor.record_stream). On CPU devices, whose work is
/// synchronous, it only checks the pointer. Throws std::invalid_argument for a pointer the pool
/// did not hand out; nullptr is a no-op.
inline void record_stream(Device device, void* pointer, stream_ref stream) {
  if (detail::private_pools_live.load(std::memory_order_relaxed) != 0) [[unlikely]] {
    if (detail::record_stream_private(device, pointer, stream)) return;
  }
  detail::resource_of(device, "record_stream").record_stream(pointer, stream);
}

/// Bytes in live blocks, rounded to the 512-byte granularity (PyTorch memory_allocated).
inline std::size_t allocated(Device device) {
  return static_cast<std::size_t>(
      detail::user_stats(device, "allocated").allocated_bytes.current);
}

/// The peak of allocated(device) since the start or the last reset_peak (max_memory_allocated).
inline std::size_t peak_allocated(Device device) {
  return static_cast<std::size_t>(
      detail::user_stats(device, "peak_allocated").allocated_bytes.peak);
}

/// Bytes held from the upstream: live blocks plus the cache (PyTorch memory_reserved).
inline std::size_t reserved(Device device) {
  return static_cast<std::size_t>(
      detail::user_stats(device, "reserved").reserved_bytes.current);
}

/// The peak of reserved(device) since the start or the last reset_peak (max_memory_reserved).
inline std::size_t peak_reserved(Device device) {
  return static_cast<std::size_t>(
      detail::user_stats(device, "peak_reserved").reserved_bytes.peak);
}

/// Sets every statistic's peak to its current value (reset_peak_memory_stats).
inline void reset_peak(Device device) {
  detail::flushed_resource_of(device, "reset_peak").reset_peak();
}

/// Zeroes the running totals and the OOM/retry counters (reset_accumulated_memory_stats).
inline void reset_accumulated(Device device) {
  detail::flushed_resource_of(device, "reset_accumulated").reset_accumulated();
  if (device.is_cpu()) detail::thread_cache_registry::instance().reset_accumulated(device.index);
}

/// Returns every fully free segment of the device's pool to its upstream (empty_cache). Segments
/// holding a live block stay reserved ("non-releasable").
/// Blocks cached by other threads (memory/detail/thread_cache.hpp) stay until those threads make
/// a request their cache cannot serve, call a memory:: function on the device, or exit.
inline void empty_cache(Device device) {
  detail::flushed_resource_of(device, "empty_cache").empty_cache();
  if (detail::devices_recording.load(std::memory_order_relaxed) != 0) {
    detail::record_empty_cache(device);
  }
}

/// All statistics of the device's pool (memory_stats).
inline MemoryStats stats(Device device) { return detail::user_stats(device, "stats"); }

/// The statistics as a table like torch.cuda.memory_summary(), titled with the device.
inline std::string summary(Device device) {
  return format_summary(detail::user_stats(device, "summary"), device);
}

/// Caps the bytes the device's pool may reserve; an allocation that would need more is an OOM.
/// A cap below reserved() empties the cache first; memory in use above it stays. no_limit removes
/// the cap. Throws std::invalid_argument if the device's resource has no limit.
inline void set_limit(Device device, std::size_t bytes) {
  detail::flushed_resource_of(device, "set_limit").set_limit(bytes);
}

/// The device's cap on reserved bytes, or no_limit (SIZE_MAX) when there is none.
inline std::size_t limit(Device device) { return detail::resource_of(device, "limit").limit(); }

/// Starts (`on`) or stops recording the memory history of `device`: while it is on, every
/// allocate and deallocate on the device (every tensor's storage, workspaces, copies' staging) and
/// every refused request and empty_cache is recorded with its time (steady clock), size, address
/// and the device's allocated and reserved bytes after it (PyTorch's _record_memory_history).
/// Starting discards the previous history; stopping keeps it for export_timeline. At most
/// `max_events` events are kept (the oldest are dropped, and counted). While on, the device's
/// allocations and frees pass one at a time through the history's lock. Throws device_error for
/// a device that does not exist, std::invalid_argument for max_events == 0 when starting.
TESSERA_API void record_history(Device device, bool on, std::size_t max_events = 1 << 20);

/// Writes the memory history of `device` to `path` as Chrome trace-event JSON, which
/// ui.perfetto.dev and chrome://tracing open: two counter tracks, "<device> allocated" and
/// "<device> reserved" (bytes), and an instant event per allocation, free, refused request and
/// empty_cache with its size, address and the bytes after it. Times are steady-clock
/// microseconds. Recording may still be on. Throws device_error for a device that does not exist,
/// tessera::error if record_history was never started on it, io_error if `path` cannot be
/// written.
TESSERA_API void export_timeline(Device device, const std::string& path);

/// Statistics of the process-wide pool of pinned (page-locked) host memory behind
/// Tensor::pin_memory and DataLoaderOptions::pin_memory, with memory::stats's meanings: a block
/// freed while a copy recorded on it may still run counts as free in allocated_bytes at once, and
/// is handed out again only after that copy. All 0 without CUDA support or a CUDA device.
TESSERA_API MemoryStats pinned_stats();

/// Returns every fully free segment of the pinned pool to the system (cudaFreeHost), after waiting
/// for the copies recorded on freed blocks (empty_cache for pinned memory). A no-op without CUDA
/// support or a CUDA device.
TESSERA_API void pinned_empty_cache();

namespace detail {
/// `bytes` of pinned host memory from the pinned pool (nullptr for 0). Throws device_error
/// ("Cannot access accelerator device when none is available", as PyTorch) without CUDA support
/// or a CUDA device, out_of_memory_error when the host cannot pin that much.
TESSERA_API void* pinned_allocate(std::size_t bytes);
/// Frees memory from pinned_allocate; it is handed out again once the copies recorded on it
/// (pinned_record_stream) are done. nullptr is a no-op.
TESSERA_API void pinned_deallocate(void* pointer, std::size_t bytes) noexcept;
/// Marks the pinned block at `pointer` (as pinned_allocate returned it) as used by work queued on
/// `stream` of CUDA device `device`: when it is freed, it is reused only after that work.
TESSERA_API void pinned_record_stream(void* pointer, Device device, stream_ref stream);
}  // namespace detail

#if TESSERA_DEFINITIONS
TESSERA_API void* allocate(Device device, std::size_t bytes, stream_ref stream) {
  if (detail::slow_allocation_paths.load(std::memory_order_relaxed) != 0) [[unlikely]] {
    return detail::allocate_slow(device, bytes, stream);
  }
  return detail::allocate_unrecorded(device, bytes, stream);
}

TESSERA_API void deallocate(Device device, void* pointer, std::size_t bytes,
                            stream_ref stream) noexcept {
  if (detail::slow_allocation_paths.load(std::memory_order_relaxed) != 0) [[unlikely]] {
    detail::deallocate_slow(device, pointer, bytes, stream);
    return;
  }
  detail::deallocate_unrecorded(device, pointer, bytes, stream);
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::memory

// The history's recorder and export (their definitions, where TESSERA_DEFINITIONS is 1).
#include "tessera/memory/detail/history.hpp"
// The pinned host pool (its definitions, where TESSERA_DEFINITIONS is 1).
#include "tessera/memory/detail/pinned_pool.hpp"
