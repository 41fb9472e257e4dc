// The machinery of private pools (memory/mem_pool.hpp: MemPool and use_mem_pool, PyTorch's
// torch.cuda.MemPool and torch.cuda.use_mem_pool): a private pool's state, the pools alive (which
// memory::deallocate asks who owns a pointer), and each thread's stack of use_mem_pool scopes,
// which memory::allocate serves first. A private pool takes its segments from its device's pool
// through memory::allocate, so the device's statistics count them as allocated; it keeps them
// until it is gone and every block it handed out is freed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/detail/device_registry.hpp"
#include "tessera/memory/detail/history.hpp"
#include "tessera/memory/device_memory_resource.hpp"

namespace tessera::memory::detail {

/// One private pool: its resource (a pool over the device's pool), counted by the MemPool handles,
/// the use_mem_pool scopes and the live blocks it handed out; the last one frees it, and the pool's
/// segments go back to the device's pool.
struct private_pool_state {
  std::atomic<std::int64_t> references{1};
  Device device;
  std::unique_ptr<device_memory_resource> resource;
  /// True when `pointer` is a live block of `resource` (set by the code that made the resource,
  /// which knows its type).
  bool (*owns)(device_memory_resource& resource, const void* pointer) = nullptr;
};

/// The deepest use_mem_pool nesting a thread may have.
inline constexpr int max_pool_scopes = 16;

/// The calling thread's open use_mem_pool scopes, innermost last (trivial types: no guard on
/// each access).
struct pool_scope_stack {
  private_pool_state* pools[max_pool_scopes];
  int depth;
};
inline thread_local pool_scope_stack pool_scopes{};

/// The private pools alive in the process, for the deallocations that must find their owner.
class private_pool_registry {
 public:
  static private_pool_registry& instance() {
    static private_pool_registry* registry = new private_pool_registry();  // as device_registry
    return *registry;
  }
  void add(private_pool_state* pool) {
    std::lock_guard lock(mutex_);
    pools_.push_back(pool);
    private_pools_live.fetch_add(1, std::memory_order_release);
    slow_allocation_paths.fetch_add(1, std::memory_order_release);
  }
  void remove(private_pool_state* pool) noexcept {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < pools_.size(); ++i) {
      if (pools_[i] == pool) {
        pools_[i] = pools_.back();
        pools_.pop_back();
        private_pools_live.fetch_sub(1, std::memory_order_release);
        slow_allocation_paths.fetch_sub(1, std::memory_order_release);
        return;
      }
    }
  }
  /// The live pool of `device` that handed out `pointer` (with a reference taken), or nullptr.
  private_pool_state* owner_of(Device device, const void* pointer) noexcept {
    std::lock_guard lock(mutex_);
    for (private_pool_state* pool : pools_) {
      if (pool->device == device && pool->owns(*pool->resource, pointer)) {
        pool->references.fetch_add(1, std::memory_order_relaxed);
        return pool;
      }
    }
    return nullptr;
  }

 private:
  std::mutex mutex_;
  std::vector<private_pool_state*> pools_;
};

/// Drops one reference; the last one unregisters the pool and frees it (its segments go back to
/// the device's pool).
inline void release_private_pool(private_pool_state* pool) noexcept {
  if (pool->references.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  private_pool_registry::instance().remove(pool);
  delete pool;
}

/// The innermost use_mem_pool scope of the calling thread for `device`, or nullptr.
inline private_pool_state* scoped_pool(Device device) noexcept {
  const pool_scope_stack& scopes = pool_scopes;
  for (int i = scopes.depth - 1; i >= 0; --i) {
    if (scopes.pools[i]->device == device) return scopes.pools[i];
  }
  return nullptr;
}

/// memory::allocate and deallocate while a private pool is alive or a device records its history
/// (slow_allocation_paths): the private pools first, then the device's pool with the history.
/// Cold and never inlined, as recorded_allocate.
[[gnu::cold]] TESSERA_API void* allocate_slow(Device device, std::size_t bytes, stream_ref stream);
[[gnu::cold]] TESSERA_API void deallocate_slow(Device device, void* pointer, std::size_t bytes,
                                               stream_ref stream) noexcept;
/// allocate_slow's first stop: a block of the calling thread's scoped pool for `device`, or
/// nullptr when it has none (or for 0 bytes).
TESSERA_API void* allocate_private(Device device, std::size_t bytes, stream_ref stream);
/// deallocate_slow's first stop: true when a private pool owned
/// `pointer` and took it back.
TESSERA_API bool deallocate_private(Device device, void* pointer, std::size_t bytes,
                                    stream_ref stream) noexcept;
/// memory::record_stream's: true when a private pool owns `pointer` and recorded the stream.
TESSERA_API bool record_stream_private(Device device, void* pointer, stream_ref stream);

/// memory::allocate and deallocate without the private pools: the device's pool, with the
/// history when the device records it.
TESSERA_API void* device_pool_allocate(Device device, std::size_t bytes, stream_ref stream);
TESSERA_API void device_pool_deallocate(Device device, void* pointer, std::size_t bytes,
                                        stream_ref stream) noexcept;

/// The upstream of a private pool: its device's pool (so the device's statistics, limit and
/// history count the private pool's segments).
template <class StreamPolicy>
struct device_pool_upstream {
  using stream_policy = StreamPolicy;
  Device device;
  void* allocate(std::size_t bytes, stream_ref stream) {
    return device_pool_allocate(device, bytes, stream);
  }
  void deallocate(void* pointer, std::size_t bytes, stream_ref stream) {
    device_pool_deallocate(device, pointer, bytes, stream);
  }
};

#if TESSERA_DEFINITIONS
TESSERA_API void* device_pool_allocate(Device device, std::size_t bytes, stream_ref stream) {
  if (devices_recording.load(std::memory_order_relaxed) != 0) {
    return recorded_allocate(device, bytes, stream);
  }
  return allocate_unrecorded(device, bytes, stream);
}

TESSERA_API void device_pool_deallocate(Device device, void* pointer, std::size_t bytes,
                                        stream_ref stream) noexcept {
  if (devices_recording.load(std::memory_order_relaxed) != 0) {
    recorded_deallocate(device, pointer, bytes, stream);
    return;
  }
  deallocate_unrecorded(device, pointer, bytes, stream);
}

TESSERA_API void* allocate_slow(Device device, std::size_t bytes, stream_ref stream) {
  if (private_pools_live.load(std::memory_order_relaxed) != 0) {
    if (void* pointer = allocate_private(device, bytes, stream)) return pointer;
  }
  return device_pool_allocate(device, bytes, stream);
}

TESSERA_API void deallocate_slow(Device device, void* pointer, std::size_t bytes,
                                 stream_ref stream) noexcept {
  if (private_pools_live.load(std::memory_order_relaxed) != 0 &&
      deallocate_private(device, pointer, bytes, stream)) {
    return;
  }
  device_pool_deallocate(device, pointer, bytes, stream);
}

TESSERA_API void* allocate_private(Device device, std::size_t bytes, stream_ref stream) {
  private_pool_state* pool = scoped_pool(device);
  if (pool == nullptr || bytes == 0) return nullptr;
  void* pointer = pool->resource->allocate(bytes, stream);
  pool->references.fetch_add(1, std::memory_order_relaxed);  // the block's
  return pointer;
}

TESSERA_API bool deallocate_private(Device device, void* pointer, std::size_t bytes,
                                    stream_ref stream) noexcept {
  if (pointer == nullptr) return false;
  private_pool_state* pool = private_pool_registry::instance().owner_of(device, pointer);
  if (pool == nullptr) return false;
  // A wrong size throws, which terminates (noexcept), as a bad free does in memory::deallocate.
  pool->resource->deallocate(pointer, bytes, stream);
  release_private_pool(pool);  // owner_of's reference
  release_private_pool(pool);  // the block's
  return true;
}

TESSERA_API bool record_stream_private(Device device, void* pointer, stream_ref stream) {
  if (pointer == nullptr) return false;
  private_pool_state* pool = private_pool_registry::instance().owner_of(device, pointer);
  if (pool == nullptr) return false;
  struct reference {
    private_pool_state* pool;
    ~reference() { release_private_pool(pool); }
  } held{pool};
  pool->resource->record_stream(pointer, stream);
  return true;
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::memory::detail
