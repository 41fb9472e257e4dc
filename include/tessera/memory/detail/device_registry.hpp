// The per-device registry behind the memory:: functions (memory/memory.hpp): one resource slot
// per device, filled on first use with the device's default pool, and the lookups every memory::
// function makes (the device check, the calling thread's cache flushed, the statistics as users
// see them). Also the allocation path without the memory history, which memory::allocate and the
// history's recorder (detail/history.hpp) both take, and the count of devices that record.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/detail/thread_cache.hpp"
#include "tessera/memory/device_memory_resource.hpp"
#include "tessera/memory/format.hpp"
#include "tessera/memory/stats.hpp"

namespace tessera::memory::detail {

/// The resource a device gets unless the user installs another.
TESSERA_API std::unique_ptr<device_memory_resource> make_default_device_resource(Device device);

/// One resource slot per device, read without locking on the hot path.
class device_registry {
 public:
  static device_registry& instance() {
    // Leaked on purpose (as PyTorch's allocator is): tensors destroyed during static destruction
    // must still find their pool. LeakSanitizer sees it as reachable, not as a leak.
    static device_registry* registry = new device_registry();
    return *registry;
  }

  /// The resource of an existing device, created on first use.
  device_memory_resource& get(Device device) {
    device_memory_resource* resource = slot(device).load(std::memory_order_acquire);
    if (resource != nullptr) return *resource;
    return create(device);
  }

  /// get()'s first use of a device, out of line so that get() inlines into every allocation.
  device_memory_resource& create(Device device);

  /// Installs `resource` for an existing device and returns the previous one (nullptr if none
  /// was created yet). Throws tessera::error if the previous one has live allocations.
  std::unique_ptr<device_memory_resource> replace(
      Device device, std::unique_ptr<device_memory_resource> resource) {
    std::lock_guard lock(mutex_);
    device_memory_resource* previous = slot(device).load(std::memory_order_acquire);
    if (previous != nullptr) {
      MemoryStats stats = previous->stats();
      if (stats.active.current != 0) {
        throw error("memory::set_device_resource(" + device.str() + "): the current resource has " +
                    std::to_string(stats.active.current) + " live allocation(s) (" +
                    format_bytes(static_cast<std::size_t>(stats.active_bytes.current)) +
                    "); free them before replacing it");
      }
    }
    // The generation first: a thread that reads the new resource from the slot then also reads
    // the new generation, so its cache cannot take the old resource for the installed one.
    resource_generation.fetch_add(1, std::memory_order_acq_rel);
    slot(device).store(resource.release(), std::memory_order_release);
    return std::unique_ptr<device_memory_resource>(previous);
  }

 private:
  using slot_type = std::atomic<device_memory_resource*>;

  device_registry()
      : cpu_(new slot_type[static_cast<std::size_t>(cpu::device_count())]()),
        cuda_(new slot_type[static_cast<std::size_t>(cuda::device_count())]()) {}

  slot_type& slot(Device device) noexcept {
    return device.is_cpu() ? cpu_[device.index] : cuda_[device.index];
  }

  std::mutex mutex_;
  // Never freed, as the registry (and no unique_ptr<T[]> for every unit to compile).
  slot_type* cpu_;
  slot_type* cuda_;
};

/// resource_of's error, out of line (the check itself inlines into every allocation).
[[noreturn, gnu::cold]] TESSERA_API void throw_no_such_device(Device device, const char* operation);

/// The resource of `device`; a device that does not exist is a device_error naming the operation
/// and the device.
inline device_memory_resource& resource_of(Device device, const char* operation) {
  if (device.index < 0 || device.index >= device_count(device.type)) {
    throw_no_such_device(device, operation);
  }
  return device_registry::instance().get(device);
}

/// Returns the calling thread's cached blocks of `device` to its pool (memory/detail/
/// thread_cache.hpp): done before every query and control call, so that one thread sees exactly
/// the statistics it would without the cache.
inline void flush_thread_cache(Device device) noexcept {
  if (!device.is_cpu()) return;
  if (thread_cache* caches = thread_cache::local()) {
    if (device_thread_cache* cache = caches->find(device.index)) cache->flush();
  }
}

/// The resource of `device` with the calling thread's cache of it flushed.
inline device_memory_resource& flushed_resource_of(Device device, const char* operation) {
  device_memory_resource& resource = resource_of(device, operation);
  flush_thread_cache(device);
  return resource;
}

/// The statistics as users see them: the pool's, less the blocks waiting in other threads'
/// caches, plus the caches' hand-outs and frees in the running totals.
inline MemoryStats user_stats(Device device, const char* operation) {
  MemoryStats stats = flushed_resource_of(device, operation).stats();
  if (device.is_cpu()) thread_cache_registry::instance().correct(device.index, stats);
  return stats;
}

/// How many devices record their history (memory::record_history). allocate and deallocate read
/// it with one relaxed load and take the recording path only when it is not 0.
inline std::atomic<int> devices_recording{0};

/// How many private pools (memory::MemPool) are alive (detail/private_pool.hpp).
inline std::atomic<int> private_pools_live{0};

/// devices_recording + private_pools_live: allocate, deallocate and the CPU thread-cache fast path
/// read this one word with one relaxed load, and take their cold paths only when it is not 0.
inline std::atomic<int> slow_allocation_paths{0};

/// The same count for each CPU device alone (its history recording plus its private pools): when
/// slow_allocation_paths is not 0, the thread-cache fast paths read their device's word, so a CPU
/// device whose word is 0 keeps them while other devices record or have private pools. A fixed
/// array (4 KiB, zero before any code runs), so that reading it needs no guard.
inline std::atomic<int> cpu_slow_allocation_paths[tessera::detail::max_cpu_devices]{};

/// Counts one slow path more (`change` 1) or less (-1) on `device`, in both words.
inline void add_slow_allocation_path(Device device, int change) noexcept {
  if (device.is_cpu()) {
    cpu_slow_allocation_paths[device.index].fetch_add(change, std::memory_order_release);
  }
  slow_allocation_paths.fetch_add(change, std::memory_order_release);
}

/// True when CPU device `index` must leave its thread-cache fast path to memory::allocate and
/// deallocate: while it records its history or has a private pool. With nothing recording and no
/// private pool anywhere it reads the one global word, as before per-device words (reading the
/// device's word alone measured slower on alloc_bench's 4 KiB tensor row). An index that is no
/// device reads some device's word (the mask): harmless, as such an index has no thread cache
/// (the fast paths then find none) and is never the thread's current device.
[[gnu::always_inline]] inline bool cpu_slow_allocation_path(int index) noexcept {
  static_assert((tessera::detail::max_cpu_devices & (tessera::detail::max_cpu_devices - 1)) == 0,
                "the mask below needs a power of two");
  const auto slot = static_cast<unsigned>(index) &
                    static_cast<unsigned>(tessera::detail::max_cpu_devices - 1);
  if (slow_allocation_paths.load(std::memory_order_relaxed) == 0) [[likely]] {
    return false;
  }
  return cpu_slow_allocation_paths[slot].load(std::memory_order_relaxed) != 0;
}

/// allocate, deallocate and empty_cache while some device records its history; they record only
/// for a device that does (memory/detail/history.hpp). Cold and never inlined: inlined, they
/// took the place of the allocation path itself in its callers (alloc_bench's pool row lost 5 %).
[[gnu::cold]] TESSERA_API void* recorded_allocate(Device device, std::size_t bytes,
                                                  stream_ref stream);
[[gnu::cold]] TESSERA_API void recorded_deallocate(Device device, void* pointer, std::size_t bytes,
                                                   stream_ref stream) noexcept;
[[gnu::cold]] TESSERA_API void record_empty_cache(Device device);

#if TESSERA_DEFINITIONS
TESSERA_API std::unique_ptr<device_memory_resource> make_default_device_resource(Device device) {
  if (device.is_cpu()) return std::make_unique<device_resource_adaptor<host_pool_resource>>(device);
#if TESSERA_CUDA
  return std::make_unique<device_resource_adaptor<cuda_pool_resource>>(
      device, limit_resource_adaptor<cuda_memory_resource>(cuda_memory_resource(device.index)));
#else
  throw device_error("no memory resource for " + device.str() +
                     ": CUDA support is not compiled in");
#endif
}

TESSERA_API void throw_no_such_device(Device device, const char* operation) {
  try {
    check_device(device);
  } catch (const device_error& e) {
    throw device_error(std::string("memory::") + operation + ": " + e.what());
  }
  std::abort();  // unreachable: the device does not exist
}

[[gnu::noinline]] TESSERA_API device_memory_resource& device_registry::create(Device device) {
  std::lock_guard lock(mutex_);
  device_memory_resource* resource = slot(device).load(std::memory_order_acquire);
  if (resource != nullptr) return *resource;  // another thread created it meanwhile
  std::unique_ptr<device_memory_resource> created = make_default_device_resource(device);
  slot(device).store(created.get(), std::memory_order_release);
  return *created.release();
}

/// allocate without the history (the allocation path itself). Always inlined into allocate, as it
/// was before the history, so that allocate's callers inline the same code as then.
[[gnu::always_inline]] inline void* allocate_unrecorded(Device device, std::size_t bytes,
                                                        stream_ref stream) {
  device_memory_resource& resource = resource_of(device, "allocate");
  if (bytes == 0) return nullptr;
  if (device.is_cpu()) {
    if (thread_cache* caches = thread_cache::local()) {
      if (device_thread_cache* cache = caches->find(device.index)) {
        if (const std::size_t rounded = resource.thread_cached_size(bytes)) {
          if (void* pointer = cache->take(resource, bytes, rounded)) return pointer;
        }
        cache->flush();  // the pool then counts its peaks with this thread's memory as it is
      }
    }
  }
  return resource.allocate(bytes, stream);
}

/// deallocate without the history (always inlined into deallocate, as allocate_unrecorded).
[[gnu::always_inline]] inline void deallocate_unrecorded(Device device, void* pointer,
                                                         std::size_t bytes,
                                                         stream_ref stream) noexcept {
  if (pointer == nullptr) return;
  device_memory_resource& resource = resource_of(device, "deallocate");
  // Only the device the thread drives (its current one) is cached: a block freed by another
  // device's thread (a tensor handed from one pipeline stage to the next) goes back to the pool,
  // where its own device's thread finds it, instead of waiting in a cache that device never
  // allocates from (and counting in its peaks).
  if (device.is_cpu() && device.index == tessera::detail::current_cpu_device_slot()) {
    if (const std::size_t rounded = resource.thread_cached_size(bytes)) {
      try {
        thread_cache* caches = thread_cache::local();
        if (caches != nullptr && caches->of(device.index).put(resource, pointer, bytes, rounded)) {
          return;
        }
      } catch (const std::bad_alloc&) {  // no cache for this thread: the pool takes the block
      }
    }
  }
  resource.deallocate(pointer, bytes, stream);
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::memory::detail
