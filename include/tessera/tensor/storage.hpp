// Storage: the reference-counted buffer behind tensors. Copying a Storage (and so a Tensor) bumps
// an atomic count; the last handle returns the bytes to its device's pool. Views share storage.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "tessera/core/device.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/memory.hpp"

namespace tessera {

namespace detail {
struct storage_block {
  std::atomic<std::int64_t> references{1};
  void* data = nullptr;
  std::size_t bytes = 0;
  Device device;
  stream_ref stream;
};
}  // namespace detail

class Storage {
 public:
  Storage() = default;

  /// Allocates `bytes` on `device` from its pool (0 bytes allocates nothing). Throws
  /// out_of_memory_error, or device_error for a device that does not exist.
  static Storage allocate(Device device, std::size_t bytes, stream_ref stream = {}) {
    void* data = memory::allocate(device, bytes, stream);
    auto* block = new (std::nothrow) detail::storage_block;
    if (block == nullptr) {
      memory::deallocate(device, data, bytes, stream);
      throw std::bad_alloc();
    }
    block->data = data;
    block->bytes = bytes;
    block->device = device;
    block->stream = stream;
    return Storage(block);
  }

  Storage(const Storage& other) noexcept : block_(other.block_) { retain(); }
  Storage(Storage&& other) noexcept : block_(std::exchange(other.block_, nullptr)) {}
  Storage& operator=(const Storage& other) noexcept {
    if (block_ != other.block_) {
      Storage copy(other);
      swap(copy);
    }
    return *this;
  }
  Storage& operator=(Storage&& other) noexcept {
    Storage moved(std::move(other));
    swap(moved);
    return *this;
  }
  ~Storage() { release(); }

  void swap(Storage& other) noexcept { std::swap(block_, other.block_); }

  bool defined() const noexcept { return block_ != nullptr; }
  void* data() const noexcept { return block_ ? block_->data : nullptr; }
  std::size_t bytes() const noexcept { return block_ ? block_->bytes : 0; }
  Device device() const noexcept { return block_ ? block_->device : Device{}; }
  stream_ref stream() const noexcept { return block_ ? block_->stream : stream_ref{}; }
  /// Number of handles (tensors, views) sharing this storage.
  std::int64_t use_count() const noexcept {
    return block_ ? block_->references.load(std::memory_order_relaxed) : 0;
  }
  /// True when both handles share one buffer.
  bool is_same(const Storage& other) const noexcept { return block_ == other.block_; }

 private:
  explicit Storage(detail::storage_block* block) noexcept : block_(block) {}
  void retain() noexcept {
    if (block_) block_->references.fetch_add(1, std::memory_order_relaxed);
  }
  void release() noexcept {
    if (block_ && block_->references.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      memory::deallocate(block_->device, block_->data, block_->bytes, block_->stream);
      delete block_;
    }
    block_ = nullptr;
  }

  detail::storage_block* block_ = nullptr;
};

}  // namespace tessera
