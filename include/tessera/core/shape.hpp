// Shape: up to max_dims (8) extents held by value, so tensors and expression nodes copy it
// without allocating. Also used for strides. `-1` in a requested shape is inferred by
// Shape::infer; negative dimension indices count from the end (normalize_dim).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"

namespace tessera {

class Shape {
 public:
  using value_type = std::int64_t;

  constexpr Shape() = default;
  Shape(std::initializer_list<std::int64_t> extents) { assign(extents.begin(), extents.end()); }
  explicit Shape(std::span<const std::int64_t> extents) { assign(extents.begin(), extents.end()); }
  explicit Shape(const std::vector<std::int64_t>& extents) {
    assign(extents.begin(), extents.end());
  }
  /// `rank` copies of `value` (e.g. Shape::filled(3, 1) = [1, 1, 1]).
  static Shape filled(int rank, std::int64_t value) {
    check_rank(rank);
    Shape s;
    s.rank_ = rank;
    for (int i = 0; i < rank; ++i) s.extents_[i] = value;
    return s;
  }

  TESSERA_HOST_DEVICE constexpr int size() const noexcept { return rank_; }
  TESSERA_HOST_DEVICE constexpr int rank() const noexcept { return rank_; }
  TESSERA_HOST_DEVICE constexpr bool empty() const noexcept { return rank_ == 0; }
  TESSERA_HOST_DEVICE constexpr std::int64_t operator[](int i) const noexcept {
    return extents_[i];
  }
  TESSERA_HOST_DEVICE constexpr std::int64_t& operator[](int i) noexcept { return extents_[i]; }
  const std::int64_t* begin() const noexcept { return extents_; }
  const std::int64_t* end() const noexcept { return extents_ + rank_; }
  std::int64_t* begin() noexcept { return extents_; }
  std::int64_t* end() noexcept { return extents_ + rank_; }
  std::int64_t back() const noexcept { return extents_[rank_ - 1]; }

  /// Product of the extents (1 for a 0-dim shape). Only meaningful for a shape without -1.
  TESSERA_HOST_DEVICE constexpr std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= extents_[i];
    return n;
  }

  void push_back(std::int64_t extent) {
    check_rank(rank_ + 1);
    extents_[rank_++] = extent;
  }
  void insert(int position, std::int64_t extent) {
    check_rank(rank_ + 1);
    for (int i = rank_; i > position; --i) extents_[i] = extents_[i - 1];
    extents_[position] = extent;
    ++rank_;
  }
  void erase(int position) {
    for (int i = position; i + 1 < rank_; ++i) extents_[i] = extents_[i + 1];
    --rank_;
  }

  /// Maps a possibly negative dimension index into [0, rank) (for rank 0, -1 and 0 map to 0 when
  /// `allow_scalar`). Throws shape_error naming the dimension and the rank.
  int normalize_dim(std::int64_t dim, const char* operation = "dim") const {
    return normalize_dim(dim, rank_, operation);
  }
  static int normalize_dim(std::int64_t dim, int rank, const char* operation = "dim") {
    if (dim < -rank || dim >= rank) throw_dim_out_of_range(dim, rank, operation);
    return static_cast<int>(dim < 0 ? dim + rank : dim);
  }

  /// Resolves one `-1` so that the product equals `numel`. Throws shape_error (naming the shape
  /// and the element count) for two -1, other negative extents, or a product that cannot match.
  Shape infer(std::int64_t numel, const char* operation = "view") const;

  /// Throws shape_error naming the operation and the shape when an extent is negative, or when
  /// the shape is too large for 64-bit arithmetic: its element count, a row-major stride (the
  /// product of the extents, each counted as at least 1) or its size at `element_bytes` per
  /// element does not fit in int64. Every tensor Tessera makes passes this check, so numel(),
  /// strides and byte sizes computed later cannot overflow.
  /// Inline (every tensor made passes here); the error's message is built out of line.
  void check_size(const char* operation, std::size_t element_bytes = 1) const {
    bool bad = false;
    std::int64_t product = static_cast<std::int64_t>(element_bytes);
    for (int i = 0; i < rank_; ++i) {
      bad |= extents_[i] < 0;
      bad |= __builtin_mul_overflow(product, std::max<std::int64_t>(extents_[i], 1), &product);
    }
    if (bad) [[unlikely]] {
      throw_size_error(operation, element_bytes);
    }
  }

  /// Throws shape_error when an extent is negative (factories call this).
  void check_non_negative(const char* operation) const;

  /// Row-major (C-contiguous) strides of this shape, in elements.
  Shape contiguous_strides() const {
    std::int64_t values[max_dims];
    std::int64_t stride = 1;
    for (int i = rank_ - 1; i >= 0; --i) {
      values[i] = stride;
      stride *= std::max<std::int64_t>(extents_[i], 1);
    }
    Shape strides;
    strides.rank_ = rank_;
    strides.store_extents(values, rank_);
    return strides;
  }

  std::vector<std::int64_t> to_vector() const { return {begin(), end()}; }

  /// "[2, 3]" (PyTorch prints torch.Size([2, 3]); the bare list reads better in messages).
  std::string str() const;

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

 private:
  template <class It>
  void assign(It first, It last) {
    auto n = std::distance(first, last);
    check_rank(static_cast<int>(n));
    rank_ = static_cast<int>(n);
    std::int64_t values[max_dims];
    std::copy(first, last, values);
    store_extents(values, rank_);
  }
  // extents_ = values[0, n) and zeros, written sixteen bytes at a time. A Shape is copied sixteen
  // bytes at a time, and a load that spans two smaller stores cannot take its data from them
  // (store-to-load forwarding fails): copying a shape just built from eight-byte stores stalled
  // for a fifth of a tensor's create+destroy.
  void store_extents(const std::int64_t* values, int n) noexcept {
    static_assert(max_dims % 2 == 0);
#if defined(__GNUC__)
    using pair = std::int64_t __attribute__((vector_size(16)));
    for (int i = 0; i < max_dims; i += 2) {
      const pair two = {i < n ? values[i] : 0, i + 1 < n ? values[i + 1] : 0};
      std::memcpy(extents_ + i, &two, sizeof two);
    }
#else
    for (int i = 0; i < max_dims; ++i) extents_[i] = i < n ? values[i] : 0;
#endif
  }
  static void check_rank(int rank) {
    if (rank > max_dims) throw_too_many_dims(rank);
  }
  [[noreturn, gnu::cold]] static void throw_dim_out_of_range(std::int64_t dim, int rank,
                                                             const char* operation);
  [[noreturn, gnu::cold]] static void throw_too_many_dims(int rank);
  // check_size's error: the negative extent, else the overflow.
  [[noreturn, gnu::cold]] void throw_size_error(const char* operation,
                                                std::size_t element_bytes) const;

  std::int64_t extents_[max_dims] = {};
  int rank_ = 0;
};

/// Strides are held in the same fixed-capacity container, in elements.
using Strides = Shape;

/// NumPy/PyTorch broadcasting: the shape both operands expand to (aligned at the last
/// dimension; each pair of extents must be equal or contain a 1). Throws shape_error printing
/// both shapes.
TESSERA_API Shape broadcast_shapes(const Shape& a, const Shape& b,
                                   const char* operation = "broadcast");

/// Strides that read a view of shape `from` (strides `strides`) as if it had the broadcast shape
/// `to`: stride 0 where an extent is 1 or missing. Throws shape_error when `from` does not
/// broadcast to `to`.
TESSERA_API Strides expand_strides(const Shape& from, const Strides& strides, const Shape& to,
                                   const char* operation = "expand");

#if TESSERA_DEFINITIONS
TESSERA_API void Shape::throw_dim_out_of_range(std::int64_t dim, int rank, const char* operation) {
  throw shape_error(std::string(operation) + ": dimension " + std::to_string(dim) +
                    " is out of range for a tensor of " + std::to_string(rank) +
                    " dimensions (expected [" + std::to_string(-rank) + ", " +
                    std::to_string(rank - 1) + "])");
}

TESSERA_API Shape Shape::infer(std::int64_t numel, const char* operation) const {
  Shape out = *this;
  int unknown = -1;
  std::int64_t known = 1;
  for (int i = 0; i < rank_; ++i) {
    if (extents_[i] == -1) {
      if (unknown >= 0) {
        throw shape_error(std::string(operation) + ": only one dimension can be inferred in " +
                          str());
      }
      unknown = i;
    } else if (extents_[i] < 0) {
      throw shape_error(std::string(operation) + ": invalid extent " + std::to_string(extents_[i]) +
                        " in " + str());
    } else if (__builtin_mul_overflow(known, extents_[i], &known)) {
      throw shape_error(std::string(operation) + ": shape " + str() +
                        " is invalid for input of size " + std::to_string(numel) +
                        " (its element count does not fit in a 64-bit integer)");
    }
  }
  if (unknown >= 0) {
    if (known == 0 || numel % known != 0) {
      throw shape_error(std::string(operation) + ": shape " + str() +
                        " is invalid for input of size " + std::to_string(numel));
    }
    out.extents_[unknown] = numel / known;
  } else if (known != numel) {
    throw shape_error(std::string(operation) + ": shape " + str() +
                      " is invalid for input of size " + std::to_string(numel));
  }
  return out;
}

TESSERA_API void Shape::throw_size_error(const char* operation, std::size_t element_bytes) const {
  check_non_negative(operation);
  std::int64_t product = static_cast<std::int64_t>(element_bytes);
  for (int i = 0; i < rank_; ++i) {
    if (__builtin_mul_overflow(product, std::max<std::int64_t>(extents_[i], 1), &product)) {
      throw shape_error(
          std::string(operation) + ": shape " + str() + " is too large: its element count" +
          (element_bytes > 1
               ? " or size in bytes (" + std::to_string(element_bytes) + " per element)"
               : std::string()) +
          " does not fit in a 64-bit integer");
    }
  }
  // Not reached: check_size calls this only when one of the two checks above fails.
  throw shape_error(std::string(operation) + ": shape " + str() + " is invalid");
}

TESSERA_API void Shape::check_non_negative(const char* operation) const {
  for (int i = 0; i < rank_; ++i) {
    if (extents_[i] < 0) {
      throw shape_error(std::string(operation) + ": negative extent " +
                        std::to_string(extents_[i]) + " in shape " + str());
    }
  }
}

TESSERA_API std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(extents_[i]);
  }
  return s + "]";
}

TESSERA_API void Shape::throw_too_many_dims(int rank) {
  throw shape_error("Shape: " + std::to_string(rank) + " dimensions requested; at most " +
                    std::to_string(max_dims) + " are supported");
}

TESSERA_API Shape broadcast_shapes(const Shape& a, const Shape& b, const char* operation) {
  const int rank = std::max(a.size(), b.size());
  Shape out = Shape::filled(rank, 1);
  for (int i = 0; i < rank; ++i) {
    const int ia = a.size() - rank + i;
    const int ib = b.size() - rank + i;
    const std::int64_t ea = ia >= 0 ? a[ia] : 1;
    const std::int64_t eb = ib >= 0 ? b[ib] : 1;
    if (ea != eb && ea != 1 && eb != 1) {
      throw shape_error(std::string(operation) + ": shapes " + a.str() + " and " + b.str() +
                        " cannot be broadcast (dimension " + std::to_string(i) + ": " +
                        std::to_string(ea) + " vs " + std::to_string(eb) + ")");
    }
    out[i] = ea == 1 ? eb : ea;
  }
  return out;
}

TESSERA_API Strides expand_strides(const Shape& from, const Strides& strides, const Shape& to,
                                   const char* operation) {
  if (from.size() > to.size()) {
    throw shape_error(std::string(operation) + ": shape " + from.str() +
                      " cannot be broadcast to " + to.str());
  }
  Strides out = Shape::filled(to.size(), 0);
  for (int i = 0; i < to.size(); ++i) {
    const int j = from.size() - to.size() + i;
    if (j < 0) continue;
    if (from[j] == to[i]) {
      out[i] = to[i] == 1 ? 0 : strides[j];
    } else if (from[j] != 1) {
      throw shape_error(std::string(operation) + ": shape " + from.str() +
                        " cannot be broadcast to " + to.str() + " (dimension " + std::to_string(i) +
                        ": " + std::to_string(from[j]) + " vs " + std::to_string(to[i]) + ")");
    }
  }
  return out;
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera
