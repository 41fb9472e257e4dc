// The run-time interface of a device's resource. Pools over different upstreams (host memory,
// cudaMalloc, cudaMallocAsync) have different types; the per-device registry holds them through
// this small abstract class, and device_resource_adaptor turns any pool_resource into one. The
// pools devices get unless the user installs another are named at the end.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/core/device.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/cuda_memory_resource.hpp"
#include "tessera/memory/host_memory_resource.hpp"
#include "tessera/memory/limit_resource_adaptor.hpp"
#include "tessera/memory/pool.hpp"
#include "tessera/memory/resource.hpp"
#include "tessera/memory/stats.hpp"

namespace tessera::memory {

/// What the memory:: functions need from a device's resource. Implementations must be
/// thread-safe. Sizes are in bytes.
class device_memory_resource {
 public:
  virtual ~device_memory_resource() = default;

  /// Memory for work on `stream`; nullptr for 0 bytes. Throws out_of_memory_error.
  virtual void* allocate(std::size_t bytes, stream_ref stream) = 0;
  /// Frees memory from allocate (same `bytes`); nullptr is a no-op.
  virtual void deallocate(void* pointer, std::size_t bytes, stream_ref stream) = 0;
  /// Marks memory from allocate as used by work on `stream` (see pool_resource::record_stream).
  virtual void record_stream(void* pointer, stream_ref stream) = 0;
  /// The device this resource serves.
  virtual Device device() const = 0;
  /// Blocks of at most this many (rounded) bytes may wait in a thread's cache.
  static constexpr std::size_t thread_cache_max_block = 64 * 1024;
  /// The rounded size a freed block of `bytes` counts as in the statistics, if it may wait in
  /// the freeing thread's cache (memory/detail/thread_cache.hpp) for that thread's next request of
  /// `bytes`; 0 if not. Pools of host memory with PyTorch's size policy say yes up to
  /// thread_cache_max_block (their small blocks are exactly the request rounded up to 512 bytes);
  /// pools that track streams (CUDA) never. Not virtual: it runs on every CPU allocation and free
  /// (an indirect call there measured at a fifth of a tensor's create+destroy), so a resource
  /// states its answer once, with enable_thread_cache.
  std::size_t thread_cached_size(std::size_t bytes) const noexcept {
    return thread_cached_size(bytes, thread_cache_split_limit_);
  }
  /// thread_cached_size for a resource whose enable_thread_cache limit is `split_limit` (0: none).
  static std::size_t thread_cached_size(std::size_t bytes, std::size_t split_limit) noexcept {
    if (bytes > thread_cache_max_block) return 0;
    constexpr std::size_t block = pytorch_size_policy::min_block_size;
    const std::size_t rounded = bytes < block ? block : block * ((bytes + block - 1) / block);
    return rounded < split_limit ? rounded : 0;
  }
  /// The limit given to enable_thread_cache (0: no block waits in a thread cache).
  std::size_t thread_cache_split_limit() const noexcept { return thread_cache_split_limit_; }
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void reset_accumulated() = 0;
  /// Returns cached, fully free memory to the upstream.
  virtual void empty_cache() = 0;
  /// The statistics as a table (format_summary). Not virtual: a virtual function is compiled in
  /// every unit that makes a resource, and the table's formatting is a third of that code.
  std::string summary() const { return format_summary(stats(), device()); }
  /// Caps reserved bytes (no_limit: none). Throws std::invalid_argument if this resource has no
  /// limit.
  virtual void set_limit(std::size_t bytes) {
    throw std::invalid_argument("set_limit(" + std::to_string(bytes) + "): the resource of " +
                                device().str() +
                                " has no limit (install a pool over limit_resource_adaptor)");
  }
  /// The cap on reserved bytes, or no_limit.
  virtual std::size_t limit() const { return no_limit; }

 protected:
  device_memory_resource() = default;
  device_memory_resource(const device_memory_resource&) = default;
  device_memory_resource& operator=(const device_memory_resource&) = default;

  /// For a resource whose blocks below `split_limit` bytes are exactly the request rounded up to
  /// 512 bytes and belong to no stream (host pools with PyTorch's size policy): such blocks may
  /// wait in thread caches (thread_cached_size). Called by the constructor of such a resource.
  void enable_thread_cache(std::size_t split_limit) noexcept {
    thread_cache_split_limit_ = split_limit;
  }

 private:
  std::size_t thread_cache_split_limit_ = 0;  // 0: no block waits in a thread cache
};

/// Wraps a pool-like resource (a pool_resource<...>, constructed in place from the arguments) as
/// a device_memory_resource. set_limit/limit are forwarded when the pool has them.
template <class Pool>
class device_resource_adaptor final : public device_memory_resource {
 public:
  template <class... Args>
  explicit device_resource_adaptor(Args&&... args) : pool_(std::forward<Args>(args)...) {
    if constexpr (requires {
                    requires !Pool::stream_policy_type::tracks_streams;
                    requires std::is_same_v<typename Pool::size_policy_type, pytorch_size_policy>;
                  }) {
      // A small block of a host pool is exactly round_size(bytes) (always split at 512 bytes).
      enable_thread_cache(pool_.size_policy().max_split_size);
    }
  }

  void* allocate(std::size_t bytes, stream_ref stream) override {
    return pool_.allocate(bytes, stream);
  }
  void deallocate(void* pointer, std::size_t bytes, stream_ref stream) override {
    pool_.deallocate(pointer, bytes, stream);
  }
  void record_stream(void* pointer, stream_ref stream) override {
    pool_.record_stream(pointer, stream);
  }
  Device device() const override { return pool_.device(); }
  MemoryStats stats() const override { return pool_.stats(); }
  void reset_peak() override { pool_.reset_peak(); }
  void reset_accumulated() override { pool_.reset_accumulated(); }
  void empty_cache() override { pool_.empty_cache(); }
  void set_limit(std::size_t bytes) override {
    if constexpr (requires { pool_.set_limit(bytes); }) {
      pool_.set_limit(bytes);
    } else {
      device_memory_resource::set_limit(bytes);
    }
  }
  std::size_t limit() const override {
    if constexpr (requires { pool_.limit(); }) {
      return pool_.limit();
    } else {
      return no_limit;
    }
  }

  Pool& pool() noexcept { return pool_; }
  const Pool& pool() const noexcept { return pool_; }

 private:
  Pool pool_;
};

/// A device resource: a pool_resource<Upstream, SizePolicy> for `device` over `upstream`, e.g.
/// `make_pool_resource(Device::parse("cuda:0"), cuda_async_memory_resource{0})` for
/// memory::set_device_resource.
template <memory_resource Upstream, size_policy SizePolicy = pytorch_size_policy,
          stream_policy StreamPolicy = default_stream_policy_t<Upstream>>
std::unique_ptr<device_memory_resource> make_pool_resource(Device device, Upstream upstream,
                                                           SizePolicy policy = SizePolicy{}) {
  return std::make_unique<
      device_resource_adaptor<pool_resource<Upstream, SizePolicy, StreamPolicy>>>(
      device, std::move(upstream), std::move(policy));
}

/// The pool every virtual CPU device gets: PyTorch's policy over aligned host memory, with a
/// limit (none by default) so OOM behaviour can be tested on the CPU.
using host_pool_resource = pool_resource<limit_resource_adaptor<host_memory_resource>>;
#if TESSERA_CUDA
/// The pool every CUDA device gets: PyTorch's policy and stream events over cudaMalloc.
using cuda_pool_resource = pool_resource<limit_resource_adaptor<cuda_memory_resource>>;
#endif

}  // namespace tessera::memory
