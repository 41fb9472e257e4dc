// Per-thread caches of small freed blocks in front of the CPU devices' pools (as jemalloc's and
// tcmalloc's thread caches): a thread that frees a small block of its current device keeps it,
// and its next request of the same size takes it back without the pool's lock (blocks of other
// devices go back to their pool). Two threads creating and destroying tensors on one device then
// do not meet on the pool's mutex.
//
// Statistics keep PyTorch's meaning:
// - A cached block is still allocated as far as the pool knows. The memory:: functions subtract
//   every thread's cached blocks from the current values and add the cache's hand-outs and frees
//   to the running totals, so `allocated` is exact.
// - A request the cache cannot serve first returns this thread's cached blocks to the pool
//   ("flush"), and every memory:: query or control call flushes the calling thread's cache of that
//   device. So the pool sees this thread's memory as it is whenever it counts a peak, and with one
//   thread every statistic, peaks included, is what it was without the cache. With several
//   threads a peak can include blocks cached by other threads: at most max_cached_bytes per thread
//   and device, never less than the true peak.
// - A thread's caches are flushed when it exits. empty_cache releases the calling thread's cached
//   blocks; blocks cached by other threads stay until those threads make a request their cache
//   cannot serve, call a memory:: function on the device, or exit.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/memory/device_memory_resource.hpp"
#include "tessera/memory/stats.hpp"

namespace tessera::memory::detail {

/// Blocks, rounded bytes and requested bytes: an amount of cached or handed-out memory.
struct tally {
  std::int64_t blocks = 0, bytes = 0, requested = 0;
  tally& operator+=(const tally& other) noexcept {
    blocks += other.blocks;
    bytes += other.bytes;
    requested += other.requested;
    return *this;
  }
  tally& operator-=(const tally& other) noexcept {
    blocks -= other.blocks;
    bytes -= other.bytes;
    requested -= other.requested;
    return *this;
  }
};

/// How many times a device's resource was installed (device_registry::replace adds one): a cache
/// that recorded the value with its resource knows the resource is still installed while the
/// value is unchanged, without looking it up.
inline std::atomic<std::uint64_t> resource_generation{0};

/// One thread's cache for one device.
class device_thread_cache {
 public:
  /// Rounded sizes up to this many bytes are cached: one bin per 512-byte class.
  static constexpr std::size_t max_block = device_memory_resource::thread_cache_max_block;
  static constexpr std::size_t granularity = 512;
  static constexpr std::size_t bins = max_block / granularity;
  static constexpr std::size_t per_bin = 4;
  static_assert(granularity == pytorch_size_policy::min_block_size,
                "a cached block is the request rounded up as the host pools round it");
  /// At most this many (rounded) bytes stay cached per thread and device.
  static constexpr std::int64_t max_cached_bytes = 1 << 20;

  /// What other threads read to correct the statistics: running totals of the blocks kept, handed
  /// out and flushed, so that a hand-out or a free updates three of them. Written by the owning
  /// thread only (load + store with release, no read-modify-write: plain moves on x86), read with
  /// acquire loads.
  struct counters {
    std::atomic<std::int64_t> put_blocks{0}, put_bytes{0}, put_requested{0};
    std::atomic<std::int64_t> hit_blocks{0}, hit_bytes{0}, hit_requested{0};
    std::atomic<std::int64_t> flushed_blocks{0}, flushed_bytes{0}, flushed_requested{0};

    /// Blocks the cache handed out so far.
    tally hits() const noexcept {
      return {hit_blocks.load(std::memory_order_acquire), hit_bytes.load(std::memory_order_acquire),
              hit_requested.load(std::memory_order_acquire)};
    }
    /// Blocks waiting in the cache now: kept, less handed out and flushed. The puts are read
    /// last: every block handed out or flushed was kept first, and the acquire loads make those
    /// puts visible, so no figure is ever negative.
    tally cached() const noexcept {
      tally out = hits();
      out += {flushed_blocks.load(std::memory_order_acquire),
              flushed_bytes.load(std::memory_order_acquire),
              flushed_requested.load(std::memory_order_acquire)};
      const tally kept{put_blocks.load(std::memory_order_acquire),
                       put_bytes.load(std::memory_order_acquire),
                       put_requested.load(std::memory_order_acquire)};
      tally left = kept;
      left -= out;
      return left;
    }
  };

  /// A cached block of exactly `bytes` (rounded: `rounded`) from `resource`, or nullptr.
  void* take(device_memory_resource& resource, std::size_t bytes, std::size_t rounded) noexcept {
    if (resource_ != &resource) return nullptr;
    return take(bytes, rounded);
  }

  /// A cached block of exactly `bytes`, or nullptr, without asking which resource is installed
  /// (the hit path of every CPU tensor, memory::detail::allocate_cached): a cache holding blocks
  /// holds them from its device's installed resource, which set_device_resource cannot replace
  /// while they live (the pool counts them as live allocations).
  [[gnu::always_inline]] void* take(std::size_t bytes) noexcept {
    if (bytes > max_block) return nullptr;
    const std::size_t rounded =
        bytes <= granularity ? granularity : (bytes + granularity - 1) & ~(granularity - 1);
    return take(bytes, rounded);
  }

  /// Keeps a freed block if there is room; false: the caller frees it to the pool.
  [[gnu::always_inline]] bool put(device_memory_resource& resource, void* pointer,
                                  std::size_t bytes, std::size_t rounded) noexcept {
    if (resource_ != &resource) {
      if (cached_bytes_ != 0) flush();  // the device's resource was replaced: start over
      resource_ = &resource;
    }
    // `resource` is installed now (it cannot be replaced while the block freed here is live).
    generation_ = resource_generation.load(std::memory_order_acquire);
    split_limit_ = resource.thread_cache_split_limit();
    return keep(pointer, bytes, rounded);
  }

  /// put() into the resource this cache last served, if it is still installed (its generation
  /// unchanged): the hit path of a CPU tensor's release (memory::detail::deallocate_cached),
  /// without looking the resource up. false: the caller frees the block another way.
  [[gnu::always_inline]] bool put(void* pointer, std::size_t bytes) noexcept {
    if (resource_ == nullptr ||
        generation_ != resource_generation.load(std::memory_order_acquire)) {
      return false;
    }
    const std::size_t rounded = device_memory_resource::thread_cached_size(bytes, split_limit_);
    return rounded != 0 && keep(pointer, bytes, rounded);
  }

  /// Returns every cached block to the resource it came from.
  void flush() noexcept {
    if (cached_bytes_ == 0) return;
    tally flushed;
    for (std::size_t bin = 0; bin < bins; ++bin) {
      for (std::size_t i = 0; i < counts_[bin]; ++i) {
        resource_->deallocate(entries_[bin][i].pointer, entries_[bin][i].bytes, stream_ref{});
        flushed += {1, static_cast<std::int64_t>((bin + 1) * granularity),
                    static_cast<std::int64_t>(entries_[bin][i].bytes)};
      }
      counts_[bin] = 0;
    }
    cached_bytes_ = 0;
    bump(counters_.flushed_blocks, flushed.blocks);
    bump(counters_.flushed_bytes, flushed.bytes);
    bump(counters_.flushed_requested, flushed.requested);
  }

  const counters& statistics() const noexcept { return counters_; }

 private:
  struct entry {
    void* pointer;
    std::size_t bytes;
  };

  // Keeps a block of resource_ if there is room.
  [[gnu::always_inline]] bool keep(void* pointer, std::size_t bytes, std::size_t rounded) noexcept {
    const std::size_t bin = rounded / granularity - 1;
    if (counts_[bin] == per_bin ||
        cached_bytes_ + static_cast<std::int64_t>(rounded) > max_cached_bytes) {
      return false;
    }
    entries_[bin][counts_[bin]++] = entry{pointer, bytes};
    cached_bytes_ += static_cast<std::int64_t>(rounded);
    bump(counters_.put_blocks, 1);
    bump(counters_.put_bytes, static_cast<std::int64_t>(rounded));
    bump(counters_.put_requested, static_cast<std::int64_t>(bytes));
    return true;
  }

  [[gnu::always_inline]] void* take(std::size_t bytes, std::size_t rounded) noexcept {
    const std::size_t bin = rounded / granularity - 1;
    entry* first = entries_[bin].data();
    for (std::size_t i = counts_[bin]; i-- > 0;) {
      if (first[i].bytes != bytes) continue;
      void* pointer = first[i].pointer;
      first[i] = first[--counts_[bin]];
      cached_bytes_ -= static_cast<std::int64_t>(rounded);
      bump(counters_.hit_blocks, 1);
      bump(counters_.hit_bytes, static_cast<std::int64_t>(rounded));
      bump(counters_.hit_requested, static_cast<std::int64_t>(bytes));
      return pointer;
    }
    return nullptr;
  }
  [[gnu::always_inline]] static void bump(std::atomic<std::int64_t>& counter,
                                          std::int64_t amount) noexcept {
    counter.store(counter.load(std::memory_order_relaxed) + amount, std::memory_order_release);
  }

  device_memory_resource* resource_ = nullptr;
  std::uint64_t generation_ = 0;  // resource_generation when resource_ was last known installed
  std::size_t split_limit_ = 0;   // resource_'s thread_cache_split_limit (read here: one load less)
  std::int64_t cached_bytes_ = 0;
  std::array<std::uint8_t, bins> counts_{};
  std::array<std::array<entry, per_bin>, bins> entries_{};
  counters counters_;
};

/// Every live thread's caches, so that statistics can add them up; leaked like the device
/// registry (threads may exit during static destruction).
class thread_cache_registry {
 public:
  TESSERA_API static thread_cache_registry& instance();

  /// `s` (the pool's statistics of CPU device `index`) as its users see them: other threads'
  /// cached blocks are not allocated, and the caches' hand-outs and frees are in the totals.
  TESSERA_API void correct(int index, MemoryStats& s);
  /// After reset_accumulated: the caches' hand-outs so far no longer count.
  TESSERA_API void reset_accumulated(int index);

  using thread_caches = std::vector<std::unique_ptr<device_thread_cache>>;

  /// Puts `cache` at `index` of a thread's caches, under the lock (the registry reads them).
  TESSERA_API void install(thread_caches* caches, std::size_t index,
                           std::unique_ptr<device_thread_cache> cache);
  TESSERA_API void add(thread_caches* caches);
  /// A thread exits: its (flushed) caches go; their hand-outs stay in the totals.
  TESSERA_API void remove(thread_caches* caches) noexcept;

 private:
  static void adjust(Stat& stat, std::int64_t cached, std::int64_t hits) noexcept {
    stat.current -= cached;
    stat.allocated += hits;
    stat.freed += hits + cached;
  }

  TESSERA_API tally& baseline_of(int index);

  // Calls fn(counters) for every live thread's cache of CPU device `index` (lock held).
  template <class Fn>
  void for_each_cache(int index, Fn&& fn) const {
    const auto i = static_cast<std::size_t>(index);
    for (const thread_caches* caches : caches_) {
      if (i < caches->size() && (*caches)[i] != nullptr) fn((*caches)[i]->statistics());
    }
  }

  std::mutex mutex_;
  std::vector<thread_caches*> caches_;
  std::vector<tally> baselines_;
};

/// The calling thread's caches, one per CPU device (created on first use), flushed at exit.
class thread_cache {
 public:
  /// The calling thread's caches; nullptr while the thread's thread_local objects are being
  /// destroyed after them (a tensor freed then goes straight to the pool). Once they exist, one
  /// read of a trivially destructible thread_local (no guard check on every allocation).
  [[gnu::always_inline]] static thread_cache* local() {
    if (thread_cache* cache = current()) [[likely]] {
      return cache;
    }
    return first_use();
  }

  /// The cache of CPU device `index`.
  device_thread_cache& of(int index) {
    const auto i = static_cast<std::size_t>(index);
    if (i < caches_.size() && caches_[i] != nullptr) return *caches_[i];
    return create(i);
  }
  /// The calling thread's cache of CPU device `index` if it has one, without creating anything:
  /// the hit path, where the last device asked for comes from one thread_local read (a chain of
  /// dependent loads, thread_local -> caches -> vector -> cache, was most of a tensor's release).
  [[gnu::always_inline]] static device_thread_cache* find_local(int index) noexcept {
    const hot_cache& last = hot();
    if (last.index == index) [[likely]] {
      return last.cache;
    }
    return find_local_slow(index);
  }

  /// The cache of CPU device `index` if this thread has one.
  [[gnu::always_inline]] device_thread_cache* find(int index) noexcept {
    const auto i = static_cast<std::size_t>(index);
    return i < caches_.size() ? caches_[i].get() : nullptr;
  }

  thread_cache(const thread_cache&) = delete;
  thread_cache& operator=(const thread_cache&) = delete;

 private:
  // The device find_local found last and its cache (none: index -1).
  struct hot_cache {
    int index = -1;
    device_thread_cache* cache = nullptr;
  };
  [[gnu::noinline]] static device_thread_cache* find_local_slow(int index) noexcept {
    thread_cache* caches = current();
    device_thread_cache* cache = caches != nullptr ? caches->find(index) : nullptr;
    if (cache != nullptr) hot() = hot_cache{index, cache};
    return cache;
  }

  // Trivially destructible, so they can be read while other thread_local objects are destroyed:
  // the last cache found, the thread's caches while they live, and whether they were destroyed.
  static hot_cache& hot() noexcept {
    thread_local hot_cache value;
    return value;
  }
  static thread_cache*& current() noexcept {
    thread_local thread_cache* value = nullptr;
    return value;
  }
  static bool& destroyed() noexcept {
    thread_local bool value = false;
    return value;
  }
  [[gnu::noinline]] static thread_cache* first_use() {
    if (destroyed()) return nullptr;
    thread_local thread_cache cache;
    return &cache;
  }

  TESSERA_API thread_cache();
  TESSERA_API ~thread_cache();

  TESSERA_API device_thread_cache& create(std::size_t i);

  thread_cache_registry::thread_caches caches_;
};

// Out of line in compiled mode: the registry's bookkeeping is no hot path.
#if TESSERA_DEFINITIONS
TESSERA_API thread_cache_registry& thread_cache_registry::instance() {
  static thread_cache_registry* registry = new thread_cache_registry();
  return *registry;
}
TESSERA_API void thread_cache_registry::correct(int index, MemoryStats& s) {
  std::lock_guard lock(mutex_);
  tally cached, hits = baseline_of(index);  // exited threads' hits, less those before a reset
  for_each_cache(index, [&](const device_thread_cache::counters& c) {
    cached += c.cached();
    hits += c.hits();
  });
  for (PoolStats* pool : {static_cast<PoolStats*>(&s), &s.small_pool}) {
    adjust(pool->allocations, cached.blocks, hits.blocks);
    adjust(pool->active, cached.blocks, hits.blocks);
    adjust(pool->allocated_bytes, cached.bytes, hits.bytes);
    adjust(pool->active_bytes, cached.bytes, hits.bytes);
    adjust(pool->requested_bytes, cached.requested, hits.requested);
  }
}
TESSERA_API void thread_cache_registry::reset_accumulated(int index) {
  std::lock_guard lock(mutex_);
  tally& base = baseline_of(index);
  base = tally{};
  for_each_cache(index, [&](const device_thread_cache::counters& c) { base -= c.hits(); });
}
TESSERA_API void thread_cache_registry::install(thread_caches* caches, std::size_t index,
                                                std::unique_ptr<device_thread_cache> cache) {
  std::lock_guard lock(mutex_);
  baseline_of(static_cast<int>(index));  // remove() may not allocate
  if (index >= caches->size()) caches->resize(index + 1);
  (*caches)[index] = std::move(cache);
}
TESSERA_API void thread_cache_registry::add(thread_caches* caches) {
  std::lock_guard lock(mutex_);
  caches_.push_back(caches);
}
TESSERA_API void thread_cache_registry::remove(thread_caches* caches) noexcept {
  std::lock_guard lock(mutex_);
  for (std::size_t index = 0; index < caches->size(); ++index) {
    // install() sized the baselines for every index a thread has a cache for.
    if ((*caches)[index] != nullptr) baselines_[index] += (*caches)[index]->statistics().hits();
  }
  caches_.erase(std::find(caches_.begin(), caches_.end(), caches));
}
TESSERA_API tally& thread_cache_registry::baseline_of(int index) {
  if (static_cast<std::size_t>(index) >= baselines_.size()) {
    baselines_.resize(static_cast<std::size_t>(index) + 1);
  }
  return baselines_[static_cast<std::size_t>(index)];
}

TESSERA_API thread_cache::thread_cache() {
  thread_cache_registry::instance().add(&caches_);
  current() = this;
}
TESSERA_API thread_cache::~thread_cache() {
  for (auto& cache : caches_) {
    if (cache != nullptr) cache->flush();
  }
  hot() = hot_cache{};
  current() = nullptr;
  destroyed() = true;
  thread_cache_registry::instance().remove(&caches_);
}
TESSERA_API device_thread_cache& thread_cache::create(std::size_t i) {
  thread_cache_registry::instance().install(&caches_, i, std::make_unique<device_thread_cache>());
  return *caches_[i];
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::memory::detail
