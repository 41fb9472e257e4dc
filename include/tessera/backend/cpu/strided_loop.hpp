// The CPU's N-dimensional strided loop: visits every index of a shape once and hands the callback
// the element offset of each operand. Dimensions that are contiguous in every operand are merged
// first, so a contiguous copy runs as one flat loop the compiler can vectorise. Tensor copies,
// conversions and fills run on it; the expression engine's CPU executor builds on it too.
#pragma once

#include <array>
#include <cstdint>
#include <tuple>

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

/// Calls fn(offset_0, ..., offset_{N-1}) for every index of `shape` in row-major order, where
/// offset_k is the index's element offset in operand k (strides in elements, may be 0 for a
/// broadcast operand or negative). Nothing is called for an empty shape.
template <int N, class Fn>
void for_each_offset(const Shape& shape, const std::array<Strides, N>& strides, Fn&& fn) {
  if (shape.numel() == 0) return;
  strided_layout<N> layout(shape, strides);
  const int rank = layout.shape.size();
  if (rank == 0) {
    std::apply([&](auto... zero) { fn(zero...); }, std::array<std::int64_t, N>{});
    return;
  }
  const std::int64_t inner = layout.shape[rank - 1];
  std::array<std::int64_t, N> inner_stride{};
  for (int k = 0; k < N; ++k) inner_stride[k] = layout.strides[k][rank - 1];

  std::int64_t index[max_dims] = {};
  std::array<std::int64_t, N> base{};
  const std::int64_t outer = layout.shape.numel() / inner;
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      std::apply([&](auto... b) { fn(b...); }, base);
      for (int k = 0; k < N; ++k) base[k] += inner_stride[k];
    }
    for (int k = 0; k < N; ++k) base[k] -= inner_stride[k] * inner;
    // Odometer increment over the outer dimensions.
    for (int d = rank - 2; d >= 0; --d) {
      if (++index[d] < layout.shape[d]) {
        for (int k = 0; k < N; ++k) base[k] += layout.strides[k][d];
        break;
      }
      for (int k = 0; k < N; ++k) base[k] -= layout.strides[k][d] * (layout.shape[d] - 1);
      index[d] = 0;
    }
  }
}

/// dst[i] = static_cast<To>(src[i]) over a strided index space; the loop behind copy_ and to<U>().
template <class To, class From>
void convert(To* dst, const Strides& dst_strides, const From* src, const Strides& src_strides,
             const Shape& shape) {
  for_each_offset<2>(shape, {dst_strides, src_strides}, [&](std::int64_t d, std::int64_t s) {
    if constexpr (std::is_same_v<To, bool>) {
      dst[d] = static_cast<float>(src[s]) != 0.0f;
    } else {
      dst[d] = static_cast<To>(src[s]);
    }
  });
}

/// dst[i] = value over a strided index space.
template <class T>
void fill(T* dst, const Strides& dst_strides, const Shape& shape, T value) {
  for_each_offset<1>(shape, {dst_strides}, [&](std::int64_t d) { dst[d] = value; });
}

}  // namespace tessera::backend::cpu
