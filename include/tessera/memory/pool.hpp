// pool_resource: PyTorch's caching allocator (CUDACachingAllocator) as a template over its
// upstream, size policy and stream policy. Segments taken from the upstream are split into blocks,
// freed blocks merge with free neighbours and are found again best-fit in O(log n); statistics keep
// PyTorch's meaning. Every device's pool (memory::allocate) is one of these.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/detail/block.hpp"
#include "tessera/memory/detail/object_pool.hpp"
#include "tessera/memory/detail/pointer_map.hpp"
#include "tessera/memory/format.hpp"
#include "tessera/memory/resource.hpp"
#include "tessera/memory/size_policy.hpp"
#include "tessera/memory/stats.hpp"
#include "tessera/memory/stream_policy.hpp"

namespace tessera::memory {

namespace detail {
/// The start of a pool's out-of-memory message: the request and the device. With oom_pool_state,
/// one body for every pool type (the upstream's part of the message is the pool's own).
inline std::string oom_request(std::size_t bytes, Device device) {
  return "Out of memory. Tried to allocate " + format_bytes(bytes) + " (device " + device.str();
}
/// The end of a pool's out-of-memory message: what the pool holds.
inline std::string oom_pool_state(const MemoryStats& stats) {
  const auto reserved = static_cast<std::size_t>(stats.reserved_bytes.current);
  const auto active = static_cast<std::size_t>(stats.active_bytes.current);
  return "; " + format_bytes(static_cast<std::size_t>(stats.allocated_bytes.current)) +
         " allocated; " + format_bytes(reserved) + " reserved in total by Tessera; " +
         format_bytes(reserved - active) + " free in reserved segments)";
}
}  // namespace detail

/// A caching pool over `Upstream`.
///
/// - Requests are rounded by `SizePolicy` (default: PyTorch's 512-byte granularity) and served
///   from a small pool (2 MiB segments) or a large pool (20 MiB segments, or the request rounded up
///   to 2 MiB); free blocks are found best-fit by (stream, size, address) and split when the
///   policy allows; freed blocks merge with free neighbours.
/// - When the upstream reports out of memory, every fully free segment is returned to it and the
///   allocation retried once (num_alloc_retries); if that fails too, out_of_memory_error is thrown
///   (num_ooms) and the pool is as before, less the released segments.
/// - With a stream policy that tracks streams (CUDA), a block is reused without synchronisation
///   only on the stream it was allocated on; record_stream marks other streams that use it, and
///   on free it waits for events recorded on those streams before rejoining the pool.
/// - Thread-safe: one mutex per pool. Bookkeeping (blocks, set nodes, the pointer map) is
///   recycled, so a warm pool makes no heap calls.
template <memory_resource Upstream, size_policy SizePolicy = pytorch_size_policy,
          stream_policy StreamPolicy = default_stream_policy_t<Upstream>>
class pool_resource {
 public:
  using upstream_type = Upstream;
  using size_policy_type = SizePolicy;
  using stream_policy_type = StreamPolicy;

  /// Requests above this many bytes (2^62, more than any machine has) are refused as OOM at once,
  /// so that rounding cannot overflow.
  static constexpr std::size_t max_request = std::size_t{1} << 62;

  /// A pool for `device` (named in messages; CUDA stream policies create their events there)
  /// taking segments from `upstream`.
  explicit pool_resource(Device device = {}, Upstream upstream = Upstream{},
                         SizePolicy size_policy = SizePolicy{})
      : upstream_(std::move(upstream)),
        size_policy_(std::move(size_policy)),
        stream_policy_(device),
        device_(device),
        small_blocks_(detail::node_allocator<detail::block*>(nodes_)),
        large_blocks_(detail::node_allocator<detail::block*>(nodes_)) {}

  pool_resource(const pool_resource&) = delete;
  pool_resource& operator=(const pool_resource&) = delete;

  /// Returns every segment to the upstream, live blocks included (as RMM's pools do): memory from
  /// this pool must not be used after it is destroyed.
  ~pool_resource() {
    if constexpr (StreamPolicy::tracks_streams) {
      for (pending_event& pending : pending_) {
        try {
          stream_policy_.synchronize(pending.event);
        } catch (...) {  // a destructor cannot report it; the memory is returned regardless
        }
        stream_policy_.release(pending.event);
      }
    }
    segments_.for_each([this](const void* pointer, const segment_info& segment) {
      try {
        upstream_.deallocate(const_cast<void*>(pointer), segment.size, segment.stream);
      } catch (...) {  // e.g. a CUDA context already torn down at exit
      }
    });
  }

  /// Allocates `bytes` for work on `stream`. Returns nullptr for 0 bytes (nothing is accounted).
  /// The block holds round_size(bytes) bytes (512-byte granularity) and is 512-byte aligned if
  /// the upstream is. Throws out_of_memory_error (after releasing the cache and retrying once)
  /// with the request, device, capacity, limit, allocated and reserved bytes; std::bad_alloc if
  /// the bookkeeping cannot grow; upstream errors other than OOM pass through. On any error the
  /// pool is as it was, except for the released cache and the OOM counters.
  void* allocate(std::size_t bytes, stream_ref stream = {}) {
    if (bytes == 0) return nullptr;
    stream = normalize(stream);
    std::lock_guard lock(mutex_);
    reserve_bookkeeping();
    if constexpr (StreamPolicy::tracks_streams) process_events();
    if (bytes > max_request) {
      ++stats_.num_ooms;
      throw out_of_memory_error(oom_message(bytes));
    }
    const std::size_t size = size_policy_.round_size(bytes);
    const bool small = size_policy_.is_small(size);
    detail::block* found = take_free_block(small, stream, size);
    if (found == nullptr) found = allocate_segment(bytes, size, small, stream);
    return hand_out(found, bytes, size);
  }

  /// Frees memory from allocate. `bytes` must be the size passed to allocate; `stream` is where
  /// the memory was last used (a stream other than the allocation's counts as record_stream).
  /// nullptr is a no-op. Throws std::invalid_argument, naming the pointer and the device, for a
  /// pointer this pool did not hand out (or already freed) or a wrong size; the pool is unchanged.
  void deallocate(void* pointer, std::size_t bytes, stream_ref stream = {}) {
    if (pointer == nullptr) return;
    std::lock_guard lock(mutex_);
    detail::block* b = find_allocated(pointer, "deallocate");
    if (bytes != b->requested) {
      throw std::invalid_argument("pool_resource::deallocate on " + device_.str() + ": " +
                                  pointer_text(pointer) + " was allocated with " +
                                  std::to_string(b->requested) + " bytes, not " +
                                  std::to_string(bytes));
    }
    nodes_.reserve(1);
    if constexpr (StreamPolicy::tracks_streams) {
      stream = normalize(stream);
      add_stream_use(b, stream);
      if (!b->stream_uses.empty()) record_events(b);
    }
    allocated_blocks_.erase(pointer);
    b->allocated = false;
    for_pools(b->small, [&](PoolStats& s) {
      s.allocations.decrease(1);
      s.allocated_bytes.decrease(static_cast<std::int64_t>(b->size));
      s.requested_bytes.decrease(static_cast<std::int64_t>(b->requested));
    });
    b->requested = 0;
    if (b->event_count == 0) free_block(b);
  }

  /// Marks the block at `pointer` as used by work on `stream` (PyTorch's record_stream): when it
  /// is freed, it rejoins the pool only after the work queued on `stream` until then is done.
  /// A no-op for nullptr and for host stream policies (host work is synchronous), which still
  /// check the pointer. Throws std::invalid_argument for a pointer this pool did not hand out.
  void record_stream(void* pointer, stream_ref stream) {
    if (pointer == nullptr) return;
    std::lock_guard lock(mutex_);
    detail::block* b = find_allocated(pointer, "record_stream");
    if constexpr (StreamPolicy::tracks_streams) add_stream_use(b, stream);
  }

  /// Returns every fully free segment to the upstream, after waiting for pending stream events.
  /// Segments that still hold a live block stay ("non-releasable" memory).
  void empty_cache() {
    std::lock_guard lock(mutex_);
    nodes_.reserve(pending_.size() + 1);
    release_cached_blocks();
  }

  /// A copy of the statistics.
  MemoryStats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  /// peak = current for every statistic.
  void reset_peak() {
    std::lock_guard lock(mutex_);
    stats_.reset_peak();
  }
  /// Zeroes running totals and event counters (PyTorch reset_accumulated_memory_stats).
  void reset_accumulated() {
    std::lock_guard lock(mutex_);
    stats_.reset_accumulated();
  }

  /// Sets the upstream's cap on reserved bytes (no_limit removes it); when reserved memory is
  /// above the new cap, the cache is emptied first. Only for upstreams with a limit.
  void set_limit(std::size_t bytes) requires requires(Upstream& upstream) {
    upstream.set_limit(bytes);
  }
  {
    std::lock_guard lock(mutex_);
    if (static_cast<std::size_t>(stats_.reserved_bytes.current) > bytes) {
      nodes_.reserve(pending_.size() + 1);
      release_cached_blocks();
    }
    upstream_.set_limit(bytes);
  }
  /// The upstream's cap in bytes, or no_limit.
  std::size_t limit() const requires requires(const Upstream& upstream) { upstream.limit(); }
  { return upstream_.limit(); }
  /// The upstream's capacity in bytes, when it has one.
  std::size_t capacity() const requires requires(const Upstream& upstream) { upstream.capacity(); }
  { return upstream_.capacity(); }

  Device device() const noexcept { return device_; }
  /// The upstream. Allocating from it directly bypasses the pool's accounting.
  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }
  const SizePolicy& size_policy() const noexcept { return size_policy_; }
  StreamPolicy& stream_policy() noexcept { return stream_policy_; }

 private:
  using block = detail::block;
  using free_set = std::set<block*, detail::block_order, detail::node_allocator<block*>>;
  using event_type = typename StreamPolicy::event_type;

  struct pending_event {
    event_type event;
    block* owner;
  };
  struct segment_info {
    std::size_t size = 0;
    stream_ref stream;
  };

  static stream_ref normalize(stream_ref stream) noexcept {
    // Host work is synchronous: every stream is the default one, so any free block fits.
    if constexpr (StreamPolicy::tracks_streams) {
      return stream;
    } else {
      (void)stream;
      return {};
    }
  }

  template <class Function>
  void for_pools(bool small, Function&& function) noexcept {
    function(static_cast<PoolStats&>(stats_));
    function(small ? stats_.small_pool : stats_.large_pool);
  }

  free_set& pool_of(bool small) noexcept { return small ? small_blocks_ : large_blocks_; }

  // The only fallible bookkeeping, done before anything changes: at most two new blocks
  // (a segment and a split-off rest), one set node per block that can rejoin a free set, one map
  // entry and one segment record.
  void reserve_bookkeeping() {
    blocks_.reserve(2);
    nodes_.reserve(pending_.size() + 2);
    allocated_blocks_.reserve(allocated_blocks_.size() + 1);
    segments_.reserve(segments_.size() + 1);
  }

  static std::string pointer_text(const void* pointer) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", pointer);
    return text;
  }

  block* find_allocated(void* pointer, const char* operation) {
    block** entry = allocated_blocks_.find(pointer);
    if (entry == nullptr) {
      throw std::invalid_argument(std::string("pool_resource::") + operation + " on " +
                                  device_.str() + ": " + pointer_text(pointer) +
                                  " is not a live allocation of this pool (foreign or already "
                                  "freed)");
    }
    return *entry;
  }

  // Best fit on the same stream: the first block of (stream, >= size) in address order.
  block* take_free_block(bool small, stream_ref stream, std::size_t size) noexcept {
    free_set& pool = pool_of(small);
    auto it = pool.lower_bound(detail::block_key{stream, size, nullptr});
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    if (!size_policy_.may_use((*it)->size, size)) return nullptr;
    block* b = *it;
    pool.erase(it);
    return b;
  }

  void* upstream_allocate(std::size_t bytes, stream_ref stream) {
    try {
      return upstream_.allocate(bytes, stream);
    } catch (const out_of_memory_error&) {
      return nullptr;
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
  }

  // PyTorch's malloc ladder after a cache miss: a new segment; on OOM, release every cached
  // segment and retry once; then a segment of just the rounded request when the policy's segment
  // is larger (so that under memory::set_limit a request that fits is served: a 400-byte tensor
  // under a 1 MiB limit, where the small pool's segment is 2 MiB); then give up.
  block* allocate_segment(std::size_t bytes, std::size_t size, bool small, stream_ref stream) {
    std::size_t segment = size_policy_.segment_size(size);
    void* memory = upstream_allocate(segment, stream);
    if (memory == nullptr) {
      // A private pool keeps its free segments (keeps_free_segments): a captured CUDA graph
      // replays the addresses of blocks that are free in the pool's books (PyTorch's graph pools
      // are not released either). Its empty_cache() still releases them.
      if constexpr (!requires { requires Upstream::keeps_free_segments; }) release_cached_blocks();
      ++stats_.num_alloc_retries;
      // Blocks whose events completed during the release may fit now.
      if (block* b = take_free_block(small, stream, size)) return b;
      memory = upstream_allocate(segment, stream);
      if (memory == nullptr && segment > size) {
        segment = size;
        memory = upstream_allocate(segment, stream);
      }
      if (memory == nullptr) {
        ++stats_.num_ooms;
        throw out_of_memory_error(oom_message(bytes));
      }
    }
    block* b = blocks_.acquire();
    b->pointer = static_cast<char*>(memory);
    b->size = segment;
    b->requested = 0;
    b->stream = stream;
    b->prev = b->next = nullptr;
    b->small = small;
    b->allocated = false;
    b->event_count = 0;
    b->stream_uses.clear();
    segments_.insert(memory, segment_info{segment, stream});
    for_pools(small, [&](PoolStats& s) {
      s.reserved_bytes.increase(static_cast<std::int64_t>(segment));
      s.segments.increase(1);
    });
    ++stats_.num_device_alloc;
    return b;
  }

  // Splits `b` (no longer in a free set) if the policy says so and hands out its front.
  void* hand_out(block* b, std::size_t bytes, std::size_t size) noexcept {
    const bool small = b->small;
    const bool already_split = b->is_split();
    if (size_policy_.should_split(small, b->size, size)) {
      block* rest = blocks_.acquire();
      rest->pointer = b->pointer + size;
      rest->size = b->size - size;
      rest->requested = 0;
      rest->stream = b->stream;
      rest->small = small;
      rest->allocated = false;
      rest->event_count = 0;
      rest->stream_uses.clear();
      rest->prev = b;
      rest->next = b->next;
      if (b->next != nullptr) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      pool_of(small).insert(rest);
      for_pools(small, [&](PoolStats& s) {
        if (already_split) {
          // An inactive piece of a split segment shrinks by `size`.
          s.inactive_split_bytes.decrease(static_cast<std::int64_t>(size));
        } else {
          // A whole free segment becomes split: its rest is a new inactive piece.
          s.inactive_split_bytes.increase(static_cast<std::int64_t>(rest->size));
          s.inactive_split.increase(1);
        }
      });
    } else if (already_split) {
      for_pools(small, [&](PoolStats& s) {
        s.inactive_split_bytes.decrease(static_cast<std::int64_t>(b->size));
        s.inactive_split.decrease(1);
      });
    }
    b->allocated = true;
    b->requested = bytes;
    allocated_blocks_.insert(b->pointer, b);
    for_pools(small, [&](PoolStats& s) {
      s.allocations.increase(1);
      s.allocated_bytes.increase(static_cast<std::int64_t>(b->size));
      s.active.increase(1);
      s.active_bytes.increase(static_cast<std::int64_t>(b->size));
      s.requested_bytes.increase(static_cast<std::int64_t>(bytes));
    });
    return b->pointer;
  }

  // Returns an inactive block (no pending events) to its free set, merged with free neighbours.
  void free_block(block* b) noexcept {
    const std::size_t original_size = b->size;
    const bool small = b->small;
    std::int64_t net_blocks = 0;
    std::int64_t net_bytes = 0;
    for (block* neighbour : {b->prev, b->next}) {
      if (neighbour == nullptr || neighbour->allocated || neighbour->event_count > 0) continue;
      free_set& pool = pool_of(small);
      pool.erase(
          pool.find(neighbour));  // find + erase(iterator): one descent, not equal_range's two
      if (neighbour == b->prev) {
        b->pointer = neighbour->pointer;
        b->prev = neighbour->prev;
        if (b->prev != nullptr) b->prev->next = b;
      } else {
        b->next = neighbour->next;
        if (b->next != nullptr) b->next->prev = b;
      }
      b->size += neighbour->size;
      net_blocks -= 1;
      net_bytes -= static_cast<std::int64_t>(neighbour->size);
      blocks_.release(neighbour);
    }
    pool_of(small).insert(b);
    if (b->is_split()) {
      net_blocks += 1;
      net_bytes += static_cast<std::int64_t>(b->size);
    }
    for_pools(small, [&](PoolStats& s) {
      if (net_blocks > 0) s.inactive_split.increase(net_blocks);
      if (net_blocks < 0) s.inactive_split.decrease(-net_blocks);
      if (net_bytes > 0) s.inactive_split_bytes.increase(net_bytes);
      if (net_bytes < 0) s.inactive_split_bytes.decrease(-net_bytes);
      s.active.decrease(1);
      s.active_bytes.decrease(static_cast<std::int64_t>(original_size));
    });
  }

  void add_stream_use(block* b, stream_ref stream) {
    if (stream == b->stream) return;
    if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) != b->stream_uses.end()) {
      return;
    }
    b->stream_uses.push_back(stream);
  }

  // One event per stream the block was used on; all or none are recorded.
  void record_events(block* b) {
    pending_.reserve(pending_.size() + b->stream_uses.size());
    std::size_t recorded = 0;
    try {
      for (stream_ref stream : b->stream_uses) {
        pending_.push_back(pending_event{stream_policy_.record(stream), b});
        ++recorded;
      }
    } catch (...) {
      for (; recorded > 0; --recorded) {
        stream_policy_.release(pending_.back().event);
        pending_.pop_back();
      }
      throw;
    }
    b->event_count = static_cast<int>(b->stream_uses.size());
    b->stream_uses.clear();
  }

  // Moves blocks whose events have all completed back to the free sets (PyTorch process_events).
  void process_events() {
    for (std::size_t i = 0; i < pending_.size();) {
      if (!stream_policy_.query(pending_[i].event)) {
        ++i;
        continue;
      }
      complete_event(i);
    }
  }

  void synchronize_and_free_events() {
    while (!pending_.empty()) {
      stream_policy_.synchronize(pending_.back().event);
      complete_event(pending_.size() - 1);
    }
  }

  void complete_event(std::size_t index) noexcept {
    block* owner = pending_[index].owner;
    stream_policy_.release(pending_[index].event);
    pending_[index] = pending_.back();
    pending_.pop_back();
    if (--owner->event_count == 0) free_block(owner);
  }

  // Returns every unsplit free block (a whole free segment) to the upstream.
  void release_cached_blocks() {
    if constexpr (StreamPolicy::tracks_streams) synchronize_and_free_events();
    for (free_set* pool : {&small_blocks_, &large_blocks_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        block* b = *it;
        if (b->is_split()) {
          ++it;
          continue;
        }
        upstream_.deallocate(b->pointer, b->size, b->stream);
        it = pool->erase(it);
        segments_.erase(b->pointer);
        for_pools(b->small, [&](PoolStats& s) {
          s.reserved_bytes.decrease(static_cast<std::int64_t>(b->size));
          s.segments.decrease(1);
        });
        ++stats_.num_device_free;
        blocks_.release(b);
      }
    }
  }

  std::string oom_message(std::size_t bytes) const {
    std::string message = detail::oom_request(bytes, device_);
    if constexpr (requires { upstream_.capacity(); }) {
      try {
        if (std::size_t capacity = upstream_.capacity(); capacity > 0) {
          message += "; " + format_bytes(capacity) + " total capacity";
        }
      } catch (...) {  // the capacity is a courtesy; the OOM is what must be reported
      }
    }
    if constexpr (requires { upstream_.free_capacity(); }) {
      try {
        message += "; " + format_bytes(upstream_.free_capacity()) + " free on the device";
      } catch (...) {
      }
    }
    if constexpr (requires { upstream_.limit(); }) {
      if (std::size_t cap = upstream_.limit(); cap != no_limit) {
        message += "; " + format_bytes(cap) + " limit";
      }
    }
    message += detail::oom_pool_state(stats_);
    return message;
  }

  mutable std::mutex mutex_;
  Upstream upstream_;
  SizePolicy size_policy_;
  StreamPolicy stream_policy_;
  Device device_;
  detail::object_pool<block> blocks_;
  detail::node_arena nodes_;  // before the sets, which return their nodes to it
  free_set small_blocks_;
  free_set large_blocks_;
  detail::pointer_map<block*> allocated_blocks_;
  detail::pointer_map<segment_info> segments_;
  std::vector<pending_event> pending_;
  MemoryStats stats_;
};

}  // namespace tessera::memory
