// Dimension merging for strided loops: a shape and N operands' strides with every pair of
// dimensions that all operands step through as one merged, and extent-1 dimensions dropped. The
// CPU and CUDA executors walk the merged layout, so a transposed or broadcast operand costs as
// few index computations as its layout allows. memory_order puts the dimensions in the order
// the operands lie in memory first, so that operands laid out alike in any order (channels_last
// tensors) are walked in storage order, merged into one run.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "tessera/core/shape.hpp"

namespace tessera::backend::cpu {

/// The dimensions 0..rank-1 ordered outermost first by memory (PyTorch's TensorIterator order):
/// dimension a goes inside b when the first operand that steps through both with different
/// strides (stride 0, a broadcast, says nothing) has the smaller stride in a. Stable: undecided
/// pairs keep the logical order, so row-major operands keep it. `count` operands' strides.
inline std::array<int, max_dims> memory_order(int rank, const Strides* strides, int count) {
  auto inside = [strides, count](int a, int b) {
    for (int k = 0; k < count; ++k) {
      const Strides& s = strides[k];
      const std::int64_t sa = s[a] < 0 ? -s[a] : s[a];
      const std::int64_t sb = s[b] < 0 ? -s[b] : s[b];
      if (sa == 0 || sb == 0 || sa == sb) continue;
      return sa < sb;
    }
    return false;
  };
  std::array<int, max_dims> order{};
  for (int d = 0; d < rank; ++d) order[d] = d;
  for (int i = 1; i < rank; ++i) {  // insertion sort: stable, and rank is at most 8
    for (int j = i; j > 0 && inside(order[j - 1], order[j]); --j) {
      std::swap(order[j - 1], order[j]);
    }
  }
  return order;
}

template <std::size_t M>
std::array<int, max_dims> memory_order(int rank, const std::array<Strides, M>& strides) {
  return memory_order(rank, strides.data(), static_cast<int>(M));
}

/// Merges dimension i into i+1 (row-major, i+1 inner) when every one of `count` operands steps
/// through i as if it were part of i+1, and drops dimensions of extent 1: `shape` and
/// `strides[0 .. count)` in place. Not a template, so that executors over any number of operands
/// share it.
inline void coalesce_layout(Shape& shape, Strides* strides, int count) {
  int rank = 0;  // dimensions kept so far, written over the front of shape and strides
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (rank > 0) {
      bool mergeable = true;
      for (int k = 0; k < count; ++k) {
        if (strides[k][rank - 1] != strides[k][d] * shape[d]) mergeable = false;
      }
      if (mergeable) {
        shape[rank - 1] *= shape[d];
        for (int k = 0; k < count; ++k) strides[k][rank - 1] = strides[k][d];
        continue;
      }
    }
    shape[rank] = shape[d];
    for (int k = 0; k < count; ++k) strides[k][rank] = strides[k][d];
    ++rank;
  }
  // Rebuilt from the kept dimensions: the extents past the rank are zero, as in a new shape.
  shape = Shape(std::span<const std::int64_t>(shape.begin(), rank));
  for (int k = 0; k < count; ++k) {
    strides[k] = Strides(std::span<const std::int64_t>(strides[k].begin(), rank));
  }
}

/// Puts the dimensions of `shape` and `strides[0 .. count)` in memory_order (operand 0 deciding
/// first), in place.
inline void permute_to_memory_order(Shape& shape, Strides* strides, int count) {
  const int rank = shape.size();
  const std::array<int, max_dims> order = memory_order(rank, strides, count);
  const Shape logical = shape;
  for (int d = 0; d < rank; ++d) shape[d] = logical[order[d]];
  for (int k = 0; k < count; ++k) {
    const Strides before = strides[k];
    for (int d = 0; d < rank; ++d) strides[k][d] = before[order[d]];
  }
}

/// A shape and N operands' strides (in elements) with mergeable dimensions merged.
template <int N>
struct strided_layout {
  Shape shape;
  std::array<Strides, N> strides;

  strided_layout(const Shape& s, const std::array<Strides, N>& st) : shape(s), strides(st) {
    coalesce();
  }

  /// The layout with the dimensions first put in memory_order of the operands (operand 0, the
  /// output, deciding first), then merged: for elementwise loops, where any order of the
  /// elements gives the same result. A channels_last output with channels_last operands becomes
  /// one run of unit stride.
  static strided_layout in_memory_order(const Shape& s, const std::array<Strides, N>& st) {
    Shape permuted = s;
    std::array<Strides, N> permuted_strides = st;
    permute_to_memory_order(permuted, permuted_strides.data(), N);
    return strided_layout(permuted, permuted_strides);
  }

  /// Merges dimension i into i+1 (row-major, i+1 inner) when every operand steps through i as
  /// if it were part of i+1, and drops dimensions of extent 1.
  void coalesce() { coalesce_layout(shape, strides.data(), N); }
};

}  // namespace tessera::backend::cpu
