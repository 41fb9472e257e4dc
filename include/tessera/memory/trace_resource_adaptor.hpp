// Records what passes to an upstream (allocations, frees, refused requests) with a timestamp, in
// a bounded ring buffer: under a pool it shows when segments were taken and returned, over a pool
// every block request (a small relative of PyTorch's _record_memory_history). Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/resource.hpp"
#include "tessera/memory/stream_policy.hpp"

namespace tessera::memory {

/// One traced call.
struct trace_event {
  enum class action : std::uint8_t {
    allocate,       ///< the upstream returned memory at `address`
    deallocate,     ///< the memory at `address` was returned to the upstream
    out_of_memory,  ///< the upstream refused `bytes` for lack of memory
  };
  action what = action::allocate;
  std::uintptr_t address = 0;  // an address, not a pointer: freed memory must not be reachable
  std::size_t bytes = 0;
  stream_ref stream;
  std::chrono::steady_clock::time_point time;
};

template <memory_resource Upstream>
class trace_resource_adaptor {
 public:
  using upstream_type = Upstream;
  using stream_policy = default_stream_policy_t<Upstream>;

  /// Wraps `upstream`, keeping the last `capacity` events (> 0; std::invalid_argument otherwise).
  explicit trace_resource_adaptor(Upstream upstream = Upstream{}, std::size_t capacity = 4096)
      : upstream_(std::move(upstream)) {
    init(capacity);
  }
  /// Builds the upstream in place (for upstreams that cannot move, such as a pool_resource).
  template <class... Args>
  explicit trace_resource_adaptor(std::in_place_t, std::size_t capacity, Args&&... args)
      : upstream_(std::forward<Args>(args)...) {
    init(capacity);
  }
  /// Moves the upstream and the events; only meant for building a resource before use.
  trace_resource_adaptor(trace_resource_adaptor&& other) noexcept requires
      std::is_nothrow_move_constructible_v<Upstream> : upstream_(std::move(other.upstream_)),
                                                       ring_(std::move(other.ring_)),
                                                       next_(other.next_),
                                                       count_(other.count_) {}
  trace_resource_adaptor(const trace_resource_adaptor&) = delete;
  trace_resource_adaptor& operator=(const trace_resource_adaptor&) = delete;

  /// Allocates from the upstream and records the call (or the refusal, then rethrows).
  void* allocate(std::size_t bytes, stream_ref stream = {}) {
    void* pointer = nullptr;
    try {
      pointer = upstream_.allocate(bytes, stream);
    } catch (const out_of_memory_error&) {
      record(trace_event::action::out_of_memory, 0, bytes, stream);
      throw;
    } catch (const std::bad_alloc&) {
      record(trace_event::action::out_of_memory, 0, bytes, stream);
      throw;
    }
    record(trace_event::action::allocate, reinterpret_cast<std::uintptr_t>(pointer), bytes, stream);
    return pointer;
  }

  /// Returns memory to the upstream and records the call.
  void deallocate(void* pointer, std::size_t bytes, stream_ref stream = {}) {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    upstream_.deallocate(pointer, bytes, stream);
    record(trace_event::action::deallocate, address, bytes, stream);
  }

  /// The recorded events, oldest first (at most `capacity`).
  std::vector<trace_event> events() const {
    std::lock_guard lock(mutex_);
    std::vector<trace_event> ordered;
    ordered.reserve(count_);
    const std::size_t first = (next_ + ring_.size() - count_) % ring_.size();
    for (std::size_t i = 0; i < count_; ++i) ordered.push_back(ring_[(first + i) % ring_.size()]);
    return ordered;
  }
  /// Forgets the recorded events.
  void clear() noexcept {
    std::lock_guard lock(mutex_);
    count_ = 0;
  }

  void set_limit(std::size_t bytes) requires requires(Upstream& upstream) {
    upstream.set_limit(bytes);
  }
  { upstream_.set_limit(bytes); }
  std::size_t limit() const requires requires(const Upstream& upstream) { upstream.limit(); }
  { return upstream_.limit(); }
  std::size_t capacity() const requires requires(const Upstream& upstream) { upstream.capacity(); }
  { return upstream_.capacity(); }
  std::size_t free_capacity() const requires requires(const Upstream& upstream) {
    upstream.free_capacity();
  }
  { return upstream_.free_capacity(); }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

 private:
  void init(std::size_t capacity) {
    if (capacity == 0) {
      throw std::invalid_argument("trace_resource_adaptor: the capacity must be at least 1 event");
    }
    ring_.resize(capacity);
  }

  void record(trace_event::action what, std::uintptr_t address, std::size_t bytes,
              stream_ref stream) noexcept {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mutex_);
    ring_[next_] = trace_event{what, address, bytes, stream, now};
    next_ = (next_ + 1) % ring_.size();
    if (count_ < ring_.size()) ++count_;
  }

  Upstream upstream_;
  mutable std::mutex mutex_;
  std::vector<trace_event> ring_;  // sized once: recording never allocates
  std::size_t next_ = 0;
  std::size_t count_ = 0;
};

}  // namespace tessera::memory
