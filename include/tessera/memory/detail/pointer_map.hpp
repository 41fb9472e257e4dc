// Pointer -> value hash map for the pool's live blocks: open addressing with linear probing and
// backward-shift deletion, so lookups touch one cache line and nothing is allocated per insert.
// `reserve(n)` is the only call that may throw; inserts after it cannot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace tessera::memory::detail {

/// Keys are non-null pointers (null marks an empty slot). Not thread-safe.
template <class Value>
class pointer_map {
 public:
  pointer_map() = default;
  pointer_map(const pointer_map&) = delete;
  pointer_map& operator=(const pointer_map&) = delete;

  std::size_t size() const noexcept { return size_; }

  /// Makes room for `count` entries at a load factor of at most 1/2. Throws std::bad_alloc.
  void reserve(std::size_t count) {
    if (count * 2 <= capacity_) return;
    std::size_t capacity = capacity_ == 0 ? 64 : capacity_;
    while (count * 2 > capacity) capacity *= 2;
    rehash(capacity);
  }

  /// The value stored for `key`, or nullptr.
  Value* find(const void* key) noexcept {
    if (capacity_ == 0) return nullptr;
    for (std::size_t i = index(key);; i = (i + 1) & (capacity_ - 1)) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == nullptr) return nullptr;
    }
  }

  /// Inserts a key that is not present. Precondition: reserve(size() + 1).
  void insert(const void* key, Value value) noexcept {
    std::size_t i = index(key);
    while (slots_[i].key != nullptr) i = (i + 1) & (capacity_ - 1);
    slots_[i].key = key;
    slots_[i].value = std::move(value);
    ++size_;
  }

  /// Removes `key` if present; returns whether it was.
  bool erase(const void* key) noexcept {
    if (capacity_ == 0) return false;
    std::size_t mask = capacity_ - 1;
    std::size_t i = index(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == nullptr) return false;
      i = (i + 1) & mask;
    }
    // Backward shift: move later entries of the probe run into the hole unless that would put
    // them before their home slot.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask; slots_[j].key != nullptr; j = (j + 1) & mask) {
      std::size_t home = index(slots_[j].key);
      if (((j - home) & mask) >= ((j - hole) & mask)) {
        slots_[hole] = std::move(slots_[j]);
        hole = j;
      }
    }
    slots_[hole].key = nullptr;
    --size_;
    return true;
  }

  template <class Function>
  void for_each(Function&& function) {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].key != nullptr) function(slots_[i].key, slots_[i].value);
    }
  }

 private:
  struct slot {
    const void* key = nullptr;
    Value value{};
  };

  std::size_t index(const void* key) const noexcept {
    // Pool pointers are 512-byte aligned, so the low bits carry nothing; a Fibonacci multiply
    // spreads the rest over the top bits.
    auto bits = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(key));
    return static_cast<std::size_t>((bits * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void rehash(std::size_t capacity) {
    auto slots = std::make_unique<slot[]>(capacity);
    std::unique_ptr<slot[]> old = std::exchange(slots_, std::move(slots));
    std::size_t old_capacity = std::exchange(capacity_, capacity);
    shift_ = 64;
    for (std::size_t c = capacity; c > 1; c >>= 1) --shift_;
    size_ = 0;
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].key != nullptr) insert(old[i].key, std::move(old[i].value));
    }
  }

  std::unique_ptr<slot[]> slots_;
  std::size_t capacity_ = 0;
  std::size_t size_ = 0;
  unsigned shift_ = 64;
};

}  // namespace tessera::memory::detail
