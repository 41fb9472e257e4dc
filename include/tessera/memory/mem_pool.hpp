// Private memory pools, PyTorch's torch.cuda.MemPool and torch.cuda.use_mem_pool: a MemPool is a
// pool of its own on one device, and while a use_mem_pool scope is open on a thread, everything
// that thread allocates on that device (tensors, a Program's arenas, the library's scratch) comes
// from it. Its blocks are reused only among its own allocations, whatever the rest of the program
// frees or allocates: what a captured CUDA graph needs (the addresses it replays stay its own),
// and a way to keep one phase's memory apart from another's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/memory/detail/private_pool.hpp"
#include "tessera/memory/device_memory_resource.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/memory/pool.hpp"
#include "tessera/memory/stats.hpp"
#include "tessera/memory/stream_policy.hpp"

namespace tessera::memory {

class use_mem_pool;

namespace detail {

/// The pool a MemPool of `device` gets: PyTorch's size policy, the device kind's stream policy,
/// segments from the device's pool.
template <class StreamPolicy>
private_pool_state* make_private_pool(Device device) {
  using pool_type = pool_resource<device_pool_upstream<StreamPolicy>, pytorch_size_policy,
                                  StreamPolicy>;
  auto state = std::make_unique<private_pool_state>();
  state->device = device;
  state->resource = std::make_unique<device_resource_adaptor<pool_type>>(
      device, device_pool_upstream<StreamPolicy>{device, state.get()});
  private_pool_registry::instance().add(state.get());
  return state.release();
}

/// MemPool's class; a template (of nothing) so that a unit that does not use it instantiates none
/// of its pool.
template <int = 0>
class mem_pool {
 public:
  /// A private pool on `device` (which must exist: device_error otherwise). It takes no memory
  /// until something allocates in a use_mem_pool scope.
  explicit mem_pool(Device device) {
    check_device(device);
    if (device.is_cpu()) {
      state_ = make_private_pool<host_stream_policy>(device);
    } else {
#if TESSERA_CUDA
      state_ = make_private_pool<cuda_stream_policy>(device);
#else
      throw device_error("memory::MemPool(" + device.str() + "): CUDA support is not compiled in");
#endif
    }
  }
  mem_pool(const mem_pool& other) noexcept : state_(other.state_) { retain(); }
  mem_pool& operator=(const mem_pool& other) noexcept {
    mem_pool copy(other);
    std::swap(state_, copy.state_);
    return *this;
  }
  /// The handle goes; the pool lives on while a scope uses it or a block it handed out is alive,
  /// and then returns its segments to the device's pool.
  ~mem_pool() {
    if (state_ != nullptr) release_private_pool(state_);
  }

  Device device() const noexcept { return state_->device; }
  /// The pool's own statistics (PyTorch's meanings, as memory::stats): its segments as reserved,
  /// its live blocks as allocated.
  MemoryStats stats() const { return state_->resource->stats(); }
  /// Returns its segments that hold no live block to the device's pool.
  void empty_cache() { state_->resource->empty_cache(); }
  /// Handles, open scopes and live blocks that keep the pool alive (PyTorch's MemPool.use_count
  /// counts the first two).
  std::int64_t use_count() const noexcept {
    return state_->references.load(std::memory_order_relaxed);
  }

 private:
  void retain() noexcept { state_->references.fetch_add(1, std::memory_order_relaxed); }
  friend class tessera::memory::use_mem_pool;
  private_pool_state* state_ = nullptr;
};

}  // namespace detail

/// A private pool on one device (PyTorch's torch.cuda.MemPool); copies are handles to the same
/// pool. Allocate from it inside a use_mem_pool scope.
using MemPool = detail::mem_pool<>;

/// While it lives, the calling thread's allocations on `pool.device()` come from `pool` (PyTorch's
/// `with torch.cuda.use_mem_pool(pool):`). Other threads and other devices are not affected;
/// scopes nest (the innermost for a device wins). Blocks allocated in the scope go back to the
/// pool when freed, in the scope or after it. Throws tessera::error when the thread already has
/// 16 scopes open.
class use_mem_pool {
 public:
  explicit use_mem_pool(MemPool& pool) : pool_(pool.state_) {
    detail::pool_scope_stack& scopes = detail::pool_scopes;
    if (scopes.depth == detail::max_pool_scopes) {
      throw error("memory::use_mem_pool(" + pool.device().str() + "): this thread already has " +
                  std::to_string(detail::max_pool_scopes) + " scopes open");
    }
    pool_->references.fetch_add(1, std::memory_order_relaxed);
    scopes.pools[scopes.depth++] = pool_;
  }
  use_mem_pool(const use_mem_pool&) = delete;
  use_mem_pool& operator=(const use_mem_pool&) = delete;
  ~use_mem_pool() {
    // Normally the innermost; a scope ended out of order is taken out where it is.
    detail::pool_scope_stack& scopes = detail::pool_scopes;
    for (int i = scopes.depth - 1; i >= 0; --i) {
      if (scopes.pools[i] == pool_) {
        for (int j = i; j + 1 < scopes.depth; ++j) scopes.pools[j] = scopes.pools[j + 1];
        --scopes.depth;
        break;
      }
    }
    detail::release_private_pool(pool_);
  }

 private:
  detail::private_pool_state* pool_;
};

}  // namespace tessera::memory
