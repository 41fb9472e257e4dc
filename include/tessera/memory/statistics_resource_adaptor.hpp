// Counts what passes to an upstream: bytes and calls, each a Stat {current, peak, allocated,
// freed}. The pool's own statistics describe blocks; this adaptor, placed under a pool, shows the
// traffic to the upstream (how often the cache missed). Like RMM's statistics_resource_adaptor.
#pragma once

#include <cstddef>
#include <mutex>
#include <utility>

#include "tessera/core/stream.hpp"
#include "tessera/memory/resource.hpp"
#include "tessera/memory/stats.hpp"
#include "tessera/memory/stream_policy.hpp"

namespace tessera::memory {

template <memory_resource Upstream>
class statistics_resource_adaptor {
 public:
  using upstream_type = Upstream;
  using stream_policy = default_stream_policy_t<Upstream>;

  /// The counters: `bytes` in bytes, `allocations` in calls (current = outstanding ones).
  struct counters {
    Stat bytes;
    Stat allocations;
    friend bool operator==(const counters&, const counters&) = default;
  };

  explicit statistics_resource_adaptor(Upstream upstream = Upstream{})
      : upstream_(std::move(upstream)) {}
  /// Moves the upstream and the counters; only meant for building a resource before use.
  statistics_resource_adaptor(statistics_resource_adaptor&& other) noexcept
      : upstream_(std::move(other.upstream_)), counters_(other.counters_) {}
  statistics_resource_adaptor(const statistics_resource_adaptor&) = delete;
  statistics_resource_adaptor& operator=(const statistics_resource_adaptor&) = delete;
  statistics_resource_adaptor& operator=(statistics_resource_adaptor&&) = delete;

  /// Allocates from the upstream and counts the call once it succeeded.
  void* allocate(std::size_t bytes, stream_ref stream = {}) {
    void* pointer = upstream_.allocate(bytes, stream);
    std::lock_guard lock(mutex_);
    counters_.bytes.increase(static_cast<std::int64_t>(bytes));
    counters_.allocations.increase(1);
    return pointer;
  }

  /// Returns memory to the upstream and counts the call.
  void deallocate(void* pointer, std::size_t bytes, stream_ref stream = {}) {
    upstream_.deallocate(pointer, bytes, stream);
    std::lock_guard lock(mutex_);
    counters_.bytes.decrease(static_cast<std::int64_t>(bytes));
    counters_.allocations.decrease(1);
  }

  /// A copy of the counters.
  counters get_counters() const {
    std::lock_guard lock(mutex_);
    return counters_;
  }
  /// peak = current for both counters.
  void reset_peak() {
    std::lock_guard lock(mutex_);
    counters_.bytes.reset_peak();
    counters_.allocations.reset_peak();
  }

  /// Forwarded to the upstream when it has a limit (so a pool over this adaptor keeps set_limit).
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
  Upstream upstream_;
  mutable std::mutex mutex_;
  counters counters_;
};

}  // namespace tessera::memory
