// Storage: the reference-counted buffer behind tensors. Copying a Storage (and so a Tensor) bumps
// an atomic count; the last handle returns the bytes to its device's pool (or, for memory another
// library owns, calls that library's release function). Views share storage.
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
/// Where a block's bytes come from, and so where the last handle returns them.
enum class storage_origin : std::uint8_t {
  pool,      // the device's pool (memory::allocate)
  pinned,    // the pinned host pool (memory::detail::pinned_allocate)
  external,  // another library's memory (Storage::from_blob): its release function is called
};

struct storage_block {
  std::atomic<std::int64_t> references{1};
  void* data = nullptr;
  std::size_t bytes = 0;
  // The device as two whole words, not a Device (a byte and an int): a tensor freed right after
  // it was made reads back what was just written, and an 8-byte read of a byte store and an int
  // store cannot be forwarded from the store buffer (a stall measured at a third of a
  // create+destroy's time).
  std::int32_t device_type = 0;
  std::int32_t device_index = 0;
  stream_ref stream;
  storage_origin origin = storage_origin::pool;
  // storage_origin::external: called once with `release_context` by the last handle.
  void (*release_external)(void* context) noexcept = nullptr;
  void* release_context = nullptr;
  // Storage::alias: the block whose bytes these are (one reference held); nullptr otherwise,
  // and in every block a thread keeps for reuse.
  storage_block* owner = nullptr;

  Device device() const noexcept {
    return Device{static_cast<DeviceType>(device_type), device_index};
  }
};

[[noreturn, gnu::noinline, gnu::cold]] inline void throw_alias_error(Device owner,
                                                                     Device device) {
  throw device_error("Storage::alias: only CPU storage can be aliased on a CPU device; the "
                     "owner is on " + owner.str() + ", the alias would be on " + device.str());
}

/// The calling thread's spare storage blocks (up to `capacity`), so that creating and destroying
/// a tensor costs no heap call once a thread has freed one: a block freed by any thread is kept
/// by that thread. A free block links to the next through its `data` field.
class storage_block_cache {
 public:
  static constexpr int capacity = 64;

  /// A block with one reference and no data; the caller sets the other fields.
  static storage_block* take() {
    if (storage_block_cache* cache = local(); cache != nullptr && cache->head_ != nullptr) {
      storage_block* block = cache->head_;
      cache->head_ = static_cast<storage_block*>(block->data);
      --cache->count_;
      block->references.store(1, std::memory_order_relaxed);
      block->data = nullptr;
      return block;
    }
    return new storage_block;
  }
  static void give_back(storage_block* block) noexcept {
    storage_block_cache* cache = local();
    if (cache == nullptr || cache->count_ == capacity) {
      delete block;
      return;
    }
    block->data = cache->head_;
    cache->head_ = block;
    ++cache->count_;
  }

  storage_block_cache(const storage_block_cache&) = delete;
  storage_block_cache& operator=(const storage_block_cache&) = delete;

 private:
  storage_block_cache() = default;
  ~storage_block_cache() {
    current() = nullptr;
    destroyed() = true;
    while (head_ != nullptr) delete std::exchange(head_, static_cast<storage_block*>(head_->data));
  }
  // nullptr once the thread's cache is destroyed (a tensor held by another thread_local object
  // and freed after it goes straight to the heap). Once the cache exists, one read of a
  // trivially destructible thread_local (no guard check on every tensor).
  static storage_block_cache* local() noexcept {
    if (storage_block_cache* cache = current()) [[likely]] {
      return cache;
    }
    return first_use();
  }
  [[gnu::noinline]] static storage_block_cache* first_use() noexcept {
    if (destroyed()) return nullptr;
    thread_local storage_block_cache cache;
    current() = &cache;
    return &cache;
  }
  // Trivially destructible: readable during thread exit.
  static storage_block_cache*& current() noexcept {
    thread_local storage_block_cache* value = nullptr;
    return value;
  }
  static bool& destroyed() noexcept {
    thread_local bool value = false;
    return value;
  }

  storage_block* head_ = nullptr;
  int count_ = 0;
};
}  // namespace detail

class Storage {
 public:
  Storage() = default;

  /// Allocates `bytes` on `device` from its pool (0 bytes allocates nothing). Throws
  /// out_of_memory_error, or device_error for a device that does not exist.
  static Storage allocate(Device device, std::size_t bytes, stream_ref stream = {}) {
    return make(device, bytes, stream, detail::storage_origin::pool, [&] {
      if (void* data = memory::detail::allocate_cached(device, bytes)) return data;
      return memory::allocate(device, bytes, stream);
    });
  }

  /// Allocates `bytes` of pinned (page-locked) host memory for CPU device `device` from the
  /// process-wide pinned pool (memory::pinned_stats), the source of asynchronous copies to CUDA
  /// devices. Throws device_error without CUDA support or a CUDA device, out_of_memory_error.
  static Storage allocate_pinned(Device device, std::size_t bytes) {
    return make(device, bytes, stream_ref{}, detail::storage_origin::pinned,
                [&] { return memory::detail::pinned_allocate(bytes); });
  }

  /// A handle to `bytes` bytes at `data` on `device` that another library owns (PyTorch's
  /// from_blob with a deleter; DLPack's from_dlpack uses it): Tessera's pools neither count nor
  /// free them; when the last handle goes, `release(context)` is called, exactly once, on the
  /// thread that drops it (nothing when `release` is nullptr). Throws device_error for a device
  /// that does not exist (std::bad_alloc when no handle can be made); when it throws, `release` is
  /// not called and the memory is still the caller's.
  static Storage from_blob(Device device, void* data, std::size_t bytes,
                           void (*release)(void* context) noexcept, void* context) {
    check_device(device);
    detail::storage_block* block = detail::storage_block_cache::take();
    block->data = data;
    block->bytes = bytes;
    block->device_type = static_cast<std::int32_t>(device.type);
    block->device_index = device.index;
    block->stream = stream_ref{};
    block->origin = detail::storage_origin::external;
    block->release_external = release;
    block->release_context = context;
    return Storage(block);
  }

  /// A handle on CPU device `device` to the bytes of `owner` (a CPU storage), which it keeps
  /// alive: virtual CPU devices share the host's memory, so one device's code may read another's
  /// bytes in place (DataParallel's replicas read the module's parameters so, with nothing copied
  /// at each step). The bytes stay counted in the owner's pool. Throws device_error naming the
  /// devices when either is not a CPU device.
  static Storage alias(const Storage& owner, Device device) {
    if (!device.is_cpu() || (owner.defined() && !owner.device().is_cpu())) {
      detail::throw_alias_error(owner.device(), device);
    }
    if (!owner.defined()) return Storage{};
    detail::storage_block* block = detail::storage_block_cache::take();
    owner.block_->references.fetch_add(1, std::memory_order_relaxed);
    block->data = owner.block_->data;
    block->bytes = owner.block_->bytes;
    block->device_type = static_cast<std::int32_t>(device.type);
    block->device_index = device.index;
    block->stream = stream_ref{};
    block->origin = detail::storage_origin::pool;
    block->owner = owner.block_;
    return Storage(block);
  }

  /// A handle block of its own on `bytes` bytes at `byte_offset` in `owner`, on owner's device,
  /// keeping `owner` alive. A Program hands out its results through one: its use_count() says
  /// whether a user still holds them, and reown() moves them all to a copy before the program
  /// writes those bytes again.
  static Storage share(const Storage& owner, std::size_t byte_offset, std::size_t bytes) {
    if (!owner.defined()) return Storage{};
    detail::storage_block* block = detail::storage_block_cache::take();
    owner.block_->references.fetch_add(1, std::memory_order_relaxed);
    block->data = static_cast<char*>(owner.block_->data) + byte_offset;
    block->bytes = bytes;
    block->device_type = owner.block_->device_type;
    block->device_index = owner.block_->device_index;
    block->stream = stream_ref{};
    block->origin = detail::storage_origin::pool;
    block->owner = owner.block_;
    return Storage(block);
  }

  /// For a block made by share() or alias(): every handle of it now reads `fresh` (bytes at
  /// least this block's, filled by the caller) instead of the owner's bytes, and the owner is
  /// let go. The caller makes sure no handle is being read meanwhile.
  void reown(Storage fresh) noexcept {
    detail::storage_block* old_owner = std::exchange(block_->owner, fresh.block_);
    block_->data = fresh.block_->data;
    fresh.block_ = nullptr;  // its reference moved into owner
    Storage dropped(old_owner);
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
  Device device() const noexcept { return block_ ? block_->device() : Device{}; }
  stream_ref stream() const noexcept { return block_ ? block_->stream : stream_ref{}; }
  /// True for a handle made by alias().
  bool is_alias() const noexcept { return block_ != nullptr && block_->owner != nullptr; }
  /// True for storage from allocate_pinned.
  bool is_pinned() const noexcept {
    return block_ != nullptr && block_->origin == detail::storage_origin::pinned;
  }
  /// True for storage from from_blob (memory another library owns).
  bool is_external() const noexcept {
    return block_ != nullptr && block_->origin == detail::storage_origin::external;
  }
  /// Number of handles (tensors, views) sharing this storage.
  std::int64_t use_count() const noexcept {
    return block_ ? block_->references.load(std::memory_order_relaxed) : 0;
  }
  /// True when both handles share one buffer.
  bool is_same(const Storage& other) const noexcept { return block_ == other.block_; }

 private:
  explicit Storage(detail::storage_block* block) noexcept : block_(block) {}
  // A block from the thread's cache holding what `allocate_data()` returns (the block goes back
  // to the cache if it throws).
  template <class AllocateData>
  [[gnu::always_inline]] static Storage make(Device device, std::size_t bytes, stream_ref stream,
                                             detail::storage_origin origin,
                                             AllocateData allocate_data) {
    detail::storage_block* block = detail::storage_block_cache::take();
    void* data = nullptr;
    try {
      data = allocate_data();
    } catch (...) {
      detail::storage_block_cache::give_back(block);
      throw;
    }
    block->data = data;
    block->bytes = bytes;
    block->device_type = static_cast<std::int32_t>(device.type);
    block->device_index = device.index;
    block->stream = stream;
    block->origin = origin;
    return Storage(block);
  }
  void retain() noexcept {
    if (block_) block_->references.fetch_add(1, std::memory_order_relaxed);
  }
  // The sole handle (count 1, read with acquire) frees without an atomic read-modify-write: no
  // other thread can hold a handle to copy from, so the count cannot change meanwhile.
  void release() noexcept {
    if (block_ && (block_->references.load(std::memory_order_acquire) == 1 ||
                   block_->references.fetch_sub(1, std::memory_order_acq_rel) == 1)) {
      if (block_->owner != nullptr) [[unlikely]] {
        Storage owner(std::exchange(block_->owner, nullptr));  // released at the end of scope
      } else if (block_->origin != detail::storage_origin::pool) [[unlikely]] {
        if (block_->origin == detail::storage_origin::pinned) {
          memory::detail::pinned_deallocate(block_->data, block_->bytes);
        } else if (block_->release_external != nullptr) {
          block_->release_external(block_->release_context);
        }
      } else if (!memory::detail::deallocate_cached(block_->device(), block_->data,
                                                    block_->bytes)) {
        memory::deallocate(block_->device(), block_->data, block_->bytes, block_->stream);
      }
      detail::storage_block_cache::give_back(block_);
    }
    block_ = nullptr;
  }

  detail::storage_block* block_ = nullptr;
};

}  // namespace tessera
