// A cap on the bytes held from an upstream, settable at run time: memory::set_limit on a device
// sets the cap of the adaptor under its pool, which lets OOM behaviour be tested on any machine.
// Like RMM's limiting_resource_adaptor; thread-safe (atomics), so several pools may share one.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/format.hpp"
#include "tessera/memory/resource.hpp"
#include "tessera/memory/stream_policy.hpp"

namespace tessera::memory {

template <memory_resource Upstream>
class limit_resource_adaptor {
 public:
  using upstream_type = Upstream;
  using stream_policy = default_stream_policy_t<Upstream>;

  /// Wraps `upstream` with a cap of `limit` bytes (no_limit: none).
  explicit limit_resource_adaptor(Upstream upstream = Upstream{}, std::size_t limit = no_limit)
      : upstream_(std::move(upstream)), limit_(limit) {}
  /// Moves the upstream and the counters; only meant for building a resource before use.
  limit_resource_adaptor(limit_resource_adaptor&& other) noexcept
      : upstream_(std::move(other.upstream_)),
        limit_(other.limit_.load()),
        held_(other.held_.load()) {}
  limit_resource_adaptor(const limit_resource_adaptor&) = delete;
  limit_resource_adaptor& operator=(const limit_resource_adaptor&) = delete;
  limit_resource_adaptor& operator=(limit_resource_adaptor&&) = delete;

  /// Allocates from the upstream if the bytes held would stay within the limit; otherwise throws
  /// out_of_memory_error naming the request, the limit and the bytes held. Upstream errors pass
  /// through, with nothing counted.
  void* allocate(std::size_t bytes, stream_ref stream = {}) {
    std::size_t before = held_.fetch_add(bytes, std::memory_order_relaxed);
    std::size_t cap = limit_.load(std::memory_order_relaxed);
    if (before + bytes > cap || before + bytes < before) {
      held_.fetch_sub(bytes, std::memory_order_relaxed);
      throw out_of_memory_error("limit_resource_adaptor: allocating " + format_bytes(bytes) +
                                " would exceed the limit of " + format_bytes(cap) + " (" +
                                format_bytes(before) + " held)");
    }
    try {
      return upstream_.allocate(bytes, stream);
    } catch (...) {
      held_.fetch_sub(bytes, std::memory_order_relaxed);
      throw;
    }
  }

  /// Returns memory to the upstream and stops counting it.
  void deallocate(void* pointer, std::size_t bytes, stream_ref stream = {}) {
    upstream_.deallocate(pointer, bytes, stream);
    held_.fetch_sub(bytes, std::memory_order_relaxed);
  }

  /// Sets the cap in bytes (no_limit removes it). Memory already held above a lower cap stays
  /// held; only new allocations are refused.
  void set_limit(std::size_t bytes) noexcept { limit_.store(bytes, std::memory_order_relaxed); }
  /// The cap in bytes, or no_limit.
  std::size_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }
  /// Bytes currently held from the upstream through this adaptor.
  std::size_t held() const noexcept { return held_.load(std::memory_order_relaxed); }

  /// The upstream's capacity, when it has one.
  std::size_t capacity() const requires requires(const Upstream& upstream) { upstream.capacity(); }
  { return upstream_.capacity(); }
  /// The upstream's free capacity, when it has one.
  std::size_t free_capacity() const requires requires(const Upstream& upstream) {
    upstream.free_capacity();
  }
  { return upstream_.free_capacity(); }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }

 private:
  Upstream upstream_;
  std::atomic<std::size_t> limit_;
  std::atomic<std::size_t> held_{0};
};

}  // namespace tessera::memory
