// The machinery of private pools (memory/mem_pool.hpp: MemPool and use_mem_pool, PyTorch's
// torch.cuda.MemPool and torch.cuda.use_mem_pool): a private pool's state, the pools alive and the
// segments they hold (where memory::deallocate finds who owns a pointer), and each thread's stack
// of use_mem_pool scopes, which memory::allocate serves first. A private pool takes its segments
// from its device's pool through memory::allocate, so the device's statistics count them as
// allocated; it keeps them until it is gone and every block it handed out is freed.
//
// Finding the owner of a freed pointer costs no lock and nothing on a device without a private
// pool. Each device has a count of its live private pools and a table of the segments they hold
// ([begin, end) and the pool, sorted, immutable once published through an atomic pointer). A free
// on a device whose count is 0 goes straight to the device's pool; otherwise it binary-searches
// the table: a pointer inside a private segment is that pool's block (the device's pool hands out
// no other block overlapping a segment it lent), any other is the device's. A segment is entered
// before the pool hands out a block of it and taken out before it goes back to the device's pool,
// so a free, which happens after its allocation, sees the table as it was then or later.
// The registry's mutex orders the writers: each copies the table with one segment more or less,
// publishes the copy and retires the old one, which it deletes only when no reader is inside a
// table (each device counts the lookups in progress: a reader counts itself in before loading the
// pointer, so a writer that reads 0 after publishing knows every later reader loads the new one).
// Tables retired while lookups run wait for the next change on the device; a segment is 2 MiB at
// least, so they are few.
#pragma once

#include <algorithm>
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

/// A segment a private pool holds from its device's pool: [begin, end).
struct private_segment {
  std::uintptr_t begin;
  std::uintptr_t end;
  private_pool_state* pool;
};

/// The segments of one device's private pools, sorted by address; never changed once published.
struct private_segment_table {
  std::vector<private_segment> segments;

  /// The pool whose segment holds `address`, or nullptr.
  private_pool_state* find(std::uintptr_t address) const noexcept;
};

/// The private pools of one device, as a free sees them.
struct device_private_pools {
  /// Private pools alive on the device: a free reads the table only when this is not 0.
  std::atomic<int> live{0};
  /// Lookups inside a table now (see the header's opening comment).
  std::atomic<int> readers{0};
  std::atomic<const private_segment_table*> table{nullptr};
  /// Replaced tables that a lookup may still read (under the registry's mutex).
  std::vector<const private_segment_table*> retired;
};

/// The private pools alive in the process and their segments, per device.
class private_pool_registry {
 public:
  static private_pool_registry& instance() {
    static private_pool_registry* registry = new private_pool_registry();  // as device_registry
    return *registry;
  }
  void add(private_pool_state* pool);
  void remove(private_pool_state* pool) noexcept;

  /// Enters the segment [pointer, pointer + bytes) that `pool` took from its device's pool.
  /// Throws std::bad_alloc (the table is copied), with nothing changed.
  void add_segment(private_pool_state* pool, const void* pointer, std::size_t bytes);

  /// Takes out the segment that begins at `pointer`, before it goes back to the device's pool.
  /// Copying the table may throw std::bad_alloc, which in the pools' noexcept paths terminates.
  void remove_segment(Device device, const void* pointer);

  /// The live pool of `device` whose segment holds `pointer`, or nullptr: without a lock, and
  /// without reading the table when the device has no private pool. The pool stays alive while
  /// the caller uses it only through a reference of its own: a live block of the pool has one,
  /// so a free or record_stream of a live block may use it (any other pointer is a bug).
  private_pool_state* owner_of(Device device, const void* pointer) noexcept;

 private:
  private_pool_registry();

  int count(DeviceType type) const noexcept {
    return type == DeviceType::cpu ? cpu_count_ : cuda_count_;
  }
  device_private_pools& of(Device device) noexcept {
    return device.is_cpu() ? cpu_[device.index] : cuda_[device.index];
  }

  /// Installs `next` (nullptr: no segment) and retires the table it replaces; deletes the retired
  /// tables when no lookup is inside one. Under mutex_, with room reserved in `retired`.
  static void publish(device_private_pools& pools, const private_segment_table* next) noexcept;

  std::mutex mutex_;
  int cpu_count_;
  int cuda_count_;
  // Never freed, as the registry itself.
  device_private_pools* cpu_;
  device_private_pools* cuda_;
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
/// history count the private pool's segments), each segment entered in the registry's table of
/// `pool`'s device while the pool holds it.
template <class StreamPolicy>
struct device_pool_upstream {
  using stream_policy = StreamPolicy;
  /// The private pool does not give its free segments back when the device runs out of memory
  /// (pool_resource::allocate_segment): a CUDA graph captured in it replays them.
  static constexpr bool keeps_free_segments = true;
  Device device;
  private_pool_state* pool;
  void* allocate(std::size_t bytes, stream_ref stream) {
    void* pointer = device_pool_allocate(device, bytes, stream);
    if (pointer == nullptr) return nullptr;
    try {
      private_pool_registry::instance().add_segment(pool, pointer, bytes);
    } catch (...) {
      device_pool_deallocate(device, pointer, bytes, stream);
      throw;
    }
    return pointer;
  }
  void deallocate(void* pointer, std::size_t bytes, stream_ref stream) {
    // Out of the table first: once back, the device's pool may hand the memory out again.
    private_pool_registry::instance().remove_segment(device, pointer);
    device_pool_deallocate(device, pointer, bytes, stream);
  }
};

#if TESSERA_DEFINITIONS
// The registry's and the tables' members (out of the classes: a unit in compiled mode then
// instantiates nothing they use).

TESSERA_API private_pool_state* private_segment_table::find(std::uintptr_t address) const noexcept {
  // The first segment that begins after `address`; the one before it may hold it.
  const auto after = std::upper_bound(
      segments.begin(), segments.end(), address,
      [](std::uintptr_t a, const private_segment& segment) { return a < segment.begin; });
  if (after == segments.begin()) return nullptr;
  const private_segment& before = *(after - 1);
  return address < before.end ? before.pool : nullptr;
}

TESSERA_API private_pool_registry::private_pool_registry()
    : cpu_count_(cpu::device_count()),
      cuda_count_(cuda::device_count()),
      cpu_(new device_private_pools[static_cast<std::size_t>(cpu_count_)]),
      cuda_(new device_private_pools[static_cast<std::size_t>(cuda_count_)]) {}

TESSERA_API void private_pool_registry::add(private_pool_state* pool) {
  std::lock_guard lock(mutex_);
  of(pool->device).live.fetch_add(1, std::memory_order_release);
  private_pools_live.fetch_add(1, std::memory_order_release);
  add_slow_allocation_path(pool->device, 1);
}

TESSERA_API void private_pool_registry::remove(private_pool_state* pool) noexcept {
  std::lock_guard lock(mutex_);
  of(pool->device).live.fetch_sub(1, std::memory_order_release);
  private_pools_live.fetch_sub(1, std::memory_order_release);
  add_slow_allocation_path(pool->device, -1);
}

TESSERA_API void private_pool_registry::add_segment(private_pool_state* pool, const void* pointer,
                                                    std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(pointer);
  std::lock_guard lock(mutex_);
  device_private_pools& pools = of(pool->device);
  const private_segment_table* current = pools.table.load(std::memory_order_relaxed);
  auto next = std::make_unique<private_segment_table>();
  if (current != nullptr) next->segments = current->segments;
  const auto after = std::upper_bound(
      next->segments.begin(), next->segments.end(), begin,
      [](std::uintptr_t a, const private_segment& segment) { return a < segment.begin; });
  next->segments.insert(after, private_segment{begin, begin + bytes, pool});
  pools.retired.reserve(pools.retired.size() + 1);
  publish(pools, next.release());
}

TESSERA_API void private_pool_registry::remove_segment(Device device, const void* pointer) {
  const auto begin = reinterpret_cast<std::uintptr_t>(pointer);
  std::lock_guard lock(mutex_);
  device_private_pools& pools = of(device);
  const private_segment_table* current = pools.table.load(std::memory_order_relaxed);
  if (current == nullptr) return;
  auto next = std::make_unique<private_segment_table>();
  next->segments.reserve(current->segments.size());
  for (const private_segment& segment : current->segments) {
    if (segment.begin != begin) next->segments.push_back(segment);
  }
  if (next->segments.size() == current->segments.size()) return;  // not a segment of the table
  pools.retired.reserve(pools.retired.size() + 1);
  publish(pools, next->segments.empty() ? nullptr : next.release());
}

TESSERA_API private_pool_state* private_pool_registry::owner_of(Device device,
                                                                const void* pointer) noexcept {
  if (device.index < 0 || device.index >= count(device.type)) return nullptr;
  device_private_pools& pools = of(device);
  if (pools.live.load(std::memory_order_relaxed) == 0) return nullptr;
  // seq_cst, paired with publish(): see the header's opening comment.
  pools.readers.fetch_add(1, std::memory_order_seq_cst);
  const private_segment_table* table = pools.table.load(std::memory_order_seq_cst);
  private_pool_state* owner =
      table != nullptr ? table->find(reinterpret_cast<std::uintptr_t>(pointer)) : nullptr;
  pools.readers.fetch_sub(1, std::memory_order_release);
  return owner;
}

TESSERA_API void private_pool_registry::publish(device_private_pools& pools,
                                                const private_segment_table* next) noexcept {
  const private_segment_table* previous = pools.table.load(std::memory_order_relaxed);
  pools.table.store(next, std::memory_order_seq_cst);
  if (previous != nullptr) pools.retired.push_back(previous);
  // A lookup that loaded a retired table counted itself in before; 0 here (read after the
  // store) means each such lookup is done, and any later one loads `next` or a newer table.
  if (pools.readers.load(std::memory_order_seq_cst) == 0) {
    for (const private_segment_table* table : pools.retired) delete table;
    pools.retired.clear();
  }
}

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
  release_private_pool(pool);  // the block's
  return true;
}

TESSERA_API bool record_stream_private(Device device, void* pointer, stream_ref stream) {
  if (pointer == nullptr) return false;
  private_pool_state* pool = private_pool_registry::instance().owner_of(device, pointer);
  if (pool == nullptr) return false;
  // Throws std::invalid_argument for a pointer in the pool's segments that is no live block.
  pool->resource->record_stream(pointer, stream);
  return true;
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::memory::detail
