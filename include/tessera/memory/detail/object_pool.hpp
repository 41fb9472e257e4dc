// Recycled objects for the pool's bookkeeping (blocks and free-set nodes), so that allocate and
// deallocate make no heap calls once warm. `reserve(n)` is the only call that may throw; after it,
// n acquisitions are guaranteed, which lets the pool do all fallible work before changing state.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <vector>

#include "tessera/core/config.hpp"

namespace tessera::memory::detail {

/// Default-constructed T objects handed out and taken back; never destroyed before the pool.
/// Not thread-safe (the owning pool holds its mutex).
template <class T>
class object_pool {
 public:
  object_pool() = default;
  object_pool(const object_pool&) = delete;
  object_pool& operator=(const object_pool&) = delete;

  /// Makes sure `count` objects can be acquired without allocating. Throws std::bad_alloc.
  void reserve(std::size_t count) {
    if (holds(count)) return;
    std::size_t chunk = std::max<std::size_t>(count - free_.size(), next_chunk_);
    next_chunk_ = std::min<std::size_t>(next_chunk_ * 2, 4096);
    auto objects = std::make_unique<T[]>(chunk);
    free_.reserve(total_ + chunk);  // release() then never allocates
    chunks_.reserve(chunks_.size() + 1);
    for (std::size_t i = 0; i < chunk; ++i) free_.push_back(&objects[i]);
    total_ += chunk;
    chunks_.push_back(std::move(objects));
  }
  /// True when `count` objects can be acquired without allocating.
  bool holds(std::size_t count) const noexcept { return free_.size() >= count; }
  /// An object (as it was when released). Precondition: reserve(1) since the last acquire.
  T* acquire() noexcept {
    T* object = free_.back();
    free_.pop_back();
    return object;
  }
  void release(T* object) noexcept { free_.push_back(object); }

 private:
  std::vector<std::unique_ptr<T[]>> chunks_;
  std::vector<T*> free_;
  std::size_t total_ = 0;
  std::size_t next_chunk_ = 64;
};

/// Fixed-size, 16-byte-aligned slots for the nodes of a node-based container (std::set).
class node_arena {
 public:
  static constexpr std::size_t slot_size = 64;
  struct alignas(16) slot {
    unsigned char bytes[slot_size];
  };

  void reserve(std::size_t count) {
    if (!slots_.holds(count)) [[unlikely]] {
      grow(count);
    }
  }
  void* allocate() noexcept { return slots_.acquire(); }
  void deallocate(void* pointer) noexcept { slots_.release(static_cast<slot*>(pointer)); }

 private:
  // Out of line in compiled mode: object_pool<slot>::reserve, compiled once.
  TESSERA_API void grow(std::size_t count);

  object_pool<slot> slots_;
};

#if TESSERA_DEFINITIONS
TESSERA_API void node_arena::grow(std::size_t count) { slots_.reserve(count); }
#endif  // TESSERA_DEFINITIONS

/// An allocator drawing single nodes from a node_arena (other sizes go to operator new), so that
/// a std::set insertion after `arena.reserve(1)` cannot throw.
template <class T>
class node_allocator {
 public:
  using value_type = T;

  explicit node_allocator(node_arena& arena) noexcept : arena_(&arena) {}
  template <class U>
  node_allocator(const node_allocator<U>& other) noexcept : arena_(other.arena()) {}

  T* allocate(std::size_t count) {
    if (count == 1 && sizeof(T) <= node_arena::slot_size && alignof(T) <= 16) {
      return static_cast<T*>(arena_->allocate());
    }
    return static_cast<T*>(::operator new (count * sizeof(T), std::align_val_t{alignof(T)}));
  }
  void deallocate(T* pointer, std::size_t count) noexcept {
    if (count == 1 && sizeof(T) <= node_arena::slot_size && alignof(T) <= 16) {
      arena_->deallocate(pointer);
    } else {
      ::operator delete (pointer, std::align_val_t{alignof(T)});
    }
  }
  node_arena* arena() const noexcept { return arena_; }

  template <class U>
  friend bool operator==(const node_allocator& a, const node_allocator<U>& b) noexcept {
    return a.arena() == b.arena();
  }

 private:
  node_arena* arena_;
};

}  // namespace tessera::memory::detail
