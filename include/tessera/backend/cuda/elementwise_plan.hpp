// How the CUDA executor (backend/cuda/executor.cuh) lays out an assignment and cuts it into rows:
// plain host arithmetic, apart from the kernels, so that CPU tests check it, and one body for
// every expression (the executor's template keeps only what depends on the expression: its
// evaluator and its kernels).
#pragma once

#include <algorithm>
#include <cstdint>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/backend/cpu/strided_loop.hpp"
#include "tessera/backend/cuda/reduce_plan.hpp"
#include "tessera/core/shape.hpp"

namespace tessera::backend::cuda {

/// A merged layout as the kernels take it: sizes, and the output's strides (in elements).
struct strided_layout_args {
  int rank = 0;
  std::int64_t sizes[max_dims] = {};
  std::int64_t out_strides[max_dims] = {};
};

/// An assignment's layout as the executor launches it.
struct elementwise_layout {
  strided_layout_args args;  // the merged sizes and the output's strides, for the rows kernel
  bool dense = false;        // one run of unit stride for the output and every operand

  /// Whether the output's layout lets the rows kernel store `vector` elements at a time: unit
  /// stride along the row, and rows that start at multiples of `vector` (the output's pointer
  /// and the operands are the caller's to check).
  bool rows_allow_vector(int vector) const {
    if (args.rank == 0 || args.out_strides[args.rank - 1] != 1) return false;
    for (int d = 0; d + 1 < args.rank; ++d) {
      if (args.out_strides[d] % vector != 0) return false;
    }
    return true;
  }
};

/// Merges `strides[0 .. count)` (the output's first, then the operands', expanded to `shape`) in
/// place, as the CPU executor does: in the output's memory order, so that operands laid out
/// alike in another order than row-major (all channels_last) become one dense run; all
/// row-major merge as they are, without the sort. Out of line: one body, not one per expression.
[[gnu::noinline]] inline elementwise_layout merge_elementwise(const Shape& shape, Strides* strides,
                                                              int count) {
  bool linear = true;
  for (int k = 0; k < count; ++k) linear = linear && cpu::is_row_major(shape, strides[k]);
  Shape merged = shape;
  if (!linear) cpu::permute_to_memory_order(merged, strides, count);
  cpu::coalesce_layout(merged, strides, count);
  elementwise_layout layout;
  layout.args.rank = merged.size();
  for (int d = 0; d < layout.args.rank; ++d) {
    layout.args.sizes[d] = merged[d];
    layout.args.out_strides[d] = strides[0][d];
  }
  layout.dense = layout.args.rank == 1;
  for (int k = 0; k < count; ++k) layout.dense = layout.dense && strides[k][0] == 1;
  return layout;
}

/// The rows kernel's plan and grid over `layout` (n elements): a row per position of the merged
/// layout's other dimensions (one row of one element for a 0-dim layout), `vector` elements per
/// load, `block` threads per block, `resident` the kernel's resident threads; at most 16 blocks
/// per multiprocessor (a grid-stride loop covers the rest).
struct rows_launch {
  row_reduction_plan plan;
  unsigned grid = 1;
};
[[gnu::noinline]] inline rows_launch plan_rows(const strided_layout_args& layout, std::int64_t n,
                                               int vector, int block, std::int64_t resident,
                                               int multiprocessors) {
  const std::int64_t extent = layout.rank > 0 ? layout.sizes[layout.rank - 1] : 1;
  rows_launch launch;
  launch.plan = row_reduction_plan::make(n / extent, extent, vector, block, resident, block);
  const std::int64_t cap = std::int64_t{multiprocessors} * 16;
  launch.grid =
      static_cast<unsigned>(std::max<std::int64_t>(1, std::min(launch.plan.tiles(), cap)));
  return launch;
}

}  // namespace tessera::backend::cuda
