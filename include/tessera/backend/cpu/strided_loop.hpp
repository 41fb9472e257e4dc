// Dimension merging for strided loops: a shape and N operands' strides with every pair of
// dimensions that all operands step through as one merged, and extent-1 dimensions dropped. The
// CPU and CUDA executors walk the merged layout, so a transposed or broadcast operand costs as
// few index computations as its layout allows.
#pragma once

#include <array>
#include <cstdint>

#include "tessera/core/shape.hpp"

namespace tessera::backend::cpu {

/// A shape and N operands' strides (in elements) with mergeable dimensions merged.
template <int N>
struct strided_layout {
  Shape shape;
  std::array<Strides, N> strides;

  strided_layout(const Shape& s, const std::array<Strides, N>& st) : shape(s), strides(st) {
    coalesce();
  }

  /// Merges dimension i into i+1 (row-major, i+1 inner) when every operand steps through i as
  /// if it were part of i+1, and drops dimensions of extent 1.
  void coalesce() {
    Shape merged_shape;
    std::array<Strides, N> merged{};
    for (int d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      if (merged_shape.size() > 0) {
        int last = merged_shape.size() - 1;
        bool mergeable = true;
        for (int k = 0; k < N; ++k) {
          if (merged[k][last] != strides[k][d] * shape[d]) mergeable = false;
        }
        if (mergeable) {
          merged_shape[last] *= shape[d];
          for (int k = 0; k < N; ++k) merged[k][last] = strides[k][d];
          continue;
        }
      }
      merged_shape.push_back(shape[d]);
      for (int k = 0; k < N; ++k) merged[k].push_back(strides[k][d]);
    }
    shape = merged_shape;
    strides = merged;
  }
};

}  // namespace tessera::backend::cpu
