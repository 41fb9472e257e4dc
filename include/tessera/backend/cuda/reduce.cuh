// Reductions on CUDA devices, reading the expression through its evaluator (nothing stored):
// a full reduction runs the row kernel below, the one reductions along a dimension run, so each
// expression compiles one kernel for it: contiguous operands (or operands laid out alike in
// another order) are one row of n elements (16-byte loads, cut over one wave of blocks, the
// slices merged by a warp); strided ones are rows along their innermost merged dimension, whose
// partials a one-block launch merges (small kernels, where cub::DeviceReduce compiled a policy's
// tile kernels for each: most of a unit's ptxas time); reductions along a dimension fold
// each row with a group of lanes sized to the row (16-byte loads where every operand allows them,
// a batch of loads in flight per lane), or, when the kept dimensions are the contiguous ones,
// give neighbouring lanes neighbouring outputs; either cuts long rows over several blocks when
// the outputs are too few to fill the device (reduce_plan.hpp: the arithmetic, tested on the
// CPU). Softmax runs one block per row. Operators are shared with the CPU
// (backend/cpu/reduce.hpp). Included only by nvcc-compiled units.
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA_KERNELS
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/util_ptx.cuh>

#include "tessera/backend/backends.hpp"
#include "tessera/backend/cpu/reduce.hpp"
#include "tessera/backend/cuda/executor.cuh"
#include "tessera/backend/cuda/reduce_plan.hpp"
#include "tessera/backend/evaluator.hpp"
#include "tessera/backend/functors.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/memory.hpp"

namespace tessera::backend::cuda {

/// Kernel parameters are limited to 4 KiB on older drivers; the evaluator travels by value.
template <class T>
inline constexpr bool fits_kernel_parameters = sizeof(T) <= 4096;

/// Scratch memory of `bytes` from the current CUDA device's pool, freed on `stream` when it goes.
inline memory::detail::scratch_buffer stream_scratch(std::size_t bytes, stream_ref stream) {
  return {Device{DeviceType::cuda, tessera::cuda::current_device()}, bytes, stream};
}

// ---- merging partials ------------------------------------------------------------------------

template <class Op>
struct merge_fn {
  __host__ __device__ typename Op::acc_type operator()(const typename Op::acc_type& a,
                                                       const typename Op::acc_type& b) const {
    return Op::merge(a, b);
  }
};

// device_cascade and thread_fold, what each thread's fold computes: reduce_plan.hpp.

/// One block merges `count` partials (a strided full reduction's rows and slices; in order per
/// thread) and writes the result. It depends on the operator and the output only, not on the
/// expression.
template <class Op, class Finish, class Out>
__global__ void __launch_bounds__(threads_per_block)
    reduce_partials_kernel(Out* out, const typename Op::acc_type* partials, std::int64_t count,
                           std::int64_t n) {
  using acc_type = typename Op::acc_type;
  using block_reduce = cub::BlockReduce<acc_type, threads_per_block>;
  __shared__ typename block_reduce::TempStorage temporary;
  thread_fold<Op> fold;
  for (std::int64_t b = threadIdx.x; b < count; b += blockDim.x) fold.add(partials[b]);
  const acc_type total = block_reduce(temporary).Reduce(fold.result(), merge_fn<Op>{});
  if (threadIdx.x == 0) *out = Finish::template apply<Out>(total, n);
}

template <class Out>
__global__ void write_value_kernel(Out* out, Out value) {
  *out = value;
}

/// Launches reduce_partials_kernel over `count` block partials; reports a failed launch. One body
/// per (Op, Finish, Out), whatever the expression.
template <class Op, class Finish, class Out>
void merge_block_partials(Out* out, const typename Op::acc_type* partials, std::int64_t count,
                          std::int64_t n, stream_ref stream) {
  reduce_partials_kernel<Op, Finish, Out>
      <<<1, threads_per_block, 0, stream.native()>>>(out, partials, count, n);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

// ---- rows: one output (or one softmax row) per position of the kept dimensions
// -------------------

/// The kept dimensions (merged) and the reduced one; the output's strides over them for softmax.
struct row_layout {
  int kept_rank = 0;
  std::int64_t kept[max_dims] = {};
  std::int64_t out_strides[max_dims] = {};
  std::int64_t extent = 0;
  std::int64_t out_step = 0;  // the output's stride along the reduced dimension
  // Row o's positions (Op::lift's index: argmax's answer) start at o * position_step: 0 along a
  // dimension, the row's extent for a full reduction's rows (row-major positions).
  std::int64_t position_step = 0;
};

/// The value an expression's evaluator gives, as read_as<V> makes it (rounded to V, in V's
/// compute type): for the vectorised loads, which get the evaluator's own results.
template <class V, class Evaluator, class R>
__device__ opmath_t<V> as_read(const R& value) {
  if constexpr (requires { typename Evaluator::value_type; }) {
    if constexpr (std::is_same_v<typename Evaluator::value_type, V>) {
      return static_cast<opmath_t<V>>(value);
    } else {
      return static_cast<opmath_t<V>>(store_cast<V>(value));
    }
  } else {
    return static_cast<opmath_t<V>>(store_cast<V>(value));
  }
}

/// Where row o's elements are: through row_access after bind_row of o's kept index (the kept
/// dimensions in row-major order). One source for every layout, contiguous or not, so each
/// expression compiles one kernel per kind of reduction. The kept index is taken apart by a
/// loop to kept_rank, not unrolled to max_dims (the index goes to local memory, the evaluator
/// stays in registers): once per row, and the unrolled divisions were an eighth of each kernel.
template <class Evaluator>
struct row_source {
  Evaluator evaluator;
  row_layout layout;

  __device__ Evaluator row(std::int64_t o) const {
    Evaluator placed = evaluator;
    std::int64_t index[max_dims] = {};
#pragma unroll 1
    for (int d = layout.kept_rank - 1; d >= 0; --d) {
      index[d] = o % layout.kept[d];
      o /= layout.kept[d];
    }
    placed.bind_row(index);
    return placed;
  }
  /// Element r of the row `placed` (what row() gave).
  template <class V>
  __device__ opmath_t<V> get(const Evaluator& placed, std::int64_t r) const {
    return read_as<V>(placed, row_access{r});
  }
  /// W consecutive elements of the row `placed` from position r (16-byte loads; vectorisable(W)
  /// holds).
  template <class V, int W>
  __device__ void get_vector(const Evaluator& placed, std::int64_t r, opmath_t<V> (&out)[W]) const {
    typename Evaluator::result_type raw[W];
    placed.get_vector(row_vector_access<W>{r}, raw);
#pragma unroll
    for (int k = 0; k < W; ++k) out[k] = as_read<V, Evaluator>(raw[k]);
  }
  /// Whether every row allows loads of `vector` elements at positions that are multiples of it.
  bool vectorisable(int vector) const { return evaluator.is_row_aligned(vector); }
  /// Offset of row o's first element in a contiguous output of the input's shape (softmax).
  __device__ std::int64_t out_offset(std::int64_t o) const {
    std::int64_t offset = 0;
#pragma unroll 1
    for (int d = layout.kept_rank - 1; d >= 0; --d) {
      offset += (o % layout.kept[d]) * layout.out_strides[d];
      o /= layout.kept[d];
    }
    return offset;
  }
};

/// Merges `value` across the `width` lanes of its group (a power of two up to 32, groups aligned
/// in the warp) by a butterfly: every lane gets the group's result. Every lane of the warp calls it.
template <class Op>
__device__ typename Op::acc_type merge_across_lanes(typename Op::acc_type value, int width) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int offset = width / 2; offset > 0; offset /= 2) {
    const auto other = cub::ShuffleIndex<32>(value, lane ^ offset, 0xffffffffu);
    // The lower lane's value first, so that every lane merges in the same order.
    value = (lane & offset) ? Op::merge(other, value) : Op::merge(value, other);
  }
  return value;
}

/// Rows along the reduced dimension (row_reduction_plan): a group of plan.group lanes folds one
/// row, or one slice of it, reading plan.vector elements per load and a batch of loads at a
/// time; a group of more than a warp merges its warps through shared memory. Without `partials`
/// the group's first lane writes the result, else its partial (merged by
/// reduce_split_partials_kernel, or for a strided full reduction's rows by reduce_partials_kernel).
template <class Op, class V, class Finish, class Out, class Rows>
__global__ void __launch_bounds__(threads_per_block)
    reduce_rows_kernel(Out* out, typename Op::acc_type* partials, Rows rows,
                       row_reduction_plan plan) {
  using acc_type = typename Op::acc_type;
  __shared__ acc_type warp_results[threads_per_block / 32];
  const int group = plan.group;
  const int lane = static_cast<int>(threadIdx.x) % group;
  const std::int64_t tiles = plan.tiles();
  for (std::int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::int64_t split = tile % plan.splits;
    const std::int64_t o =
        tile / plan.splits * plan.rows_per_block + static_cast<int>(threadIdx.x) / group;
    acc_type total = Op::identity();
    if (o < plan.outputs) {
      const auto placed = rows.row(o);
      const std::int64_t base = o * rows.layout.position_step;
      thread_fold<Op> fold;
      if (plan.vector == 4) {
        plan.walk(
            split, lane,
            [&](std::int64_t p, std::int64_t step) {
              constexpr int loads = reduce_batch_values / 4;
              acc_type values[reduce_batch_values];
              opmath_t<V> loaded[loads][4];
#pragma unroll
              for (int k = 0; k < loads; ++k)
                rows.template get_vector<V, 4>(placed, p + k * step, loaded[k]);
#pragma unroll
              for (int k = 0; k < loads; ++k) {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                  values[k * 4 + j] = Op::lift(loaded[k][j], base + p + k * step + j);
              }
              // Lane order: positions increase within a load, then from load to load.
              fold.add_run(values);
            },
            [&](std::int64_t p) {
              opmath_t<V> loaded[4];
              rows.template get_vector<V, 4>(placed, p, loaded);
              acc_type values[4];
#pragma unroll
              for (int j = 0; j < 4; ++j) values[j] = Op::lift(loaded[j], base + p + j);
              fold.add_run(values);
            },
            [&](std::int64_t p) { fold.add(Op::lift(rows.template get<V>(placed, p), base + p)); });
      } else {
        plan.walk(
            split, lane,
            [&](std::int64_t p, std::int64_t step) {
              acc_type values[reduce_batch_values];
#pragma unroll
              for (int k = 0; k < reduce_batch_values; ++k) {
                values[k] =
                    Op::lift(rows.template get<V>(placed, p + k * step), base + p + k * step);
              }
              fold.add_run(values);
            },
            [&](std::int64_t p) { fold.add(Op::lift(rows.template get<V>(placed, p), base + p)); },
            [&](std::int64_t p) { fold.add(Op::lift(rows.template get<V>(placed, p), base + p)); });
      }
      total = fold.result();
    }
    total = merge_across_lanes<Op>(total, group < 32 ? group : 32);
    if (group > 32) {
      const int warp = static_cast<int>(threadIdx.x) / 32;
      if (threadIdx.x % 32 == 0) warp_results[warp] = total;
      __syncthreads();
      if (lane == 0) {
        total = warp_results[warp];
        for (int w = 1; w < group / 32; ++w) total = Op::merge(total, warp_results[warp + w]);
      }
      __syncthreads();  // warp_results is reused by the next tile
    }
    if (lane == 0 && o < plan.outputs) {
      if (partials == nullptr) {
        out[o] = Finish::template apply<Out>(total, plan.extent);
      } else {
        partials[o * plan.splits + split] = total;
      }
    }
  }
}

/// Outputs along the contiguous kept dimensions (column_reduction_plan): a block's plan.columns
/// lanes take neighbouring outputs and its plan.lanes rows of threads interleaved positions of
/// one slice of the reduced dimension; the rows of threads merge in shared memory, in row order.
template <class Op, class V, class Finish, class Out, class Rows>
__global__ void __launch_bounds__(threads_per_block)
    reduce_columns_kernel(Out* out, typename Op::acc_type* partials, Rows rows,
                          column_reduction_plan plan) {
  using acc_type = typename Op::acc_type;
  __shared__ acc_type column_results[threads_per_block];
  const int column = static_cast<int>(threadIdx.x) % plan.columns;
  const int row = static_cast<int>(threadIdx.x) / plan.columns;
  const std::int64_t tiles = plan.tiles();
  for (std::int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::int64_t split = tile % plan.splits;
    const std::int64_t o = tile / plan.splits * plan.columns + column;
    acc_type total = Op::identity();
    if (o < plan.outputs) {
      const auto placed = rows.row(o);
      thread_fold<Op> fold;
      const std::int64_t end = plan.last(split);
      const std::int64_t step = plan.lanes;
      std::int64_t r = plan.first(split) + row;
      for (; r + (reduce_batch_values - 1) * step < end; r += reduce_batch_values * step) {
        acc_type values[reduce_batch_values];
#pragma unroll
        for (int k = 0; k < reduce_batch_values; ++k) {
          values[k] = Op::lift(rows.template get<V>(placed, r + k * step), r + k * step);
        }
        fold.add_run(values);
      }
      for (; r < end; r += step) fold.add(Op::lift(rows.template get<V>(placed, r), r));
      total = fold.result();
    }
    column_results[threadIdx.x] = total;
    __syncthreads();
    if (row == 0) {
      for (int k = 1; k < plan.lanes; ++k) {
        total = Op::merge(total, column_results[k * plan.columns + column]);
      }
      if (o < plan.outputs) {
        if (plan.splits == 1) {
          out[o] = Finish::template apply<Out>(total, plan.extent);
        } else {
          partials[o * plan.splits + split] = total;
        }
      }
    }
    __syncthreads();  // column_results is reused by the next tile
  }
}

/// The second pass of a split reduction: a group of `group` lanes per output (1, or 32 for many
/// splits: a full reduction's or a long row's few outputs, each cut into hundreds of slices)
/// merges its splits' partials and writes the result. Lane l folds splits l, l + group, ... in
/// order and the group's lanes merge by a butterfly (merge_across_lanes), so no thread reads
/// hundreds of partials one after another; with a group of one a thread folds every split in
/// order. One kernel per (Op, Finish, Out), whatever the expression (it was two, a thread and a
/// warp per output, with the same results).
template <class Op, class Finish, class Out>
__global__ void __launch_bounds__(threads_per_block)
    reduce_split_partials_kernel(Out* out, const typename Op::acc_type* partials,
                                 std::int64_t outputs, std::int64_t splits, std::int64_t extent,
                                 int group) {
  const int groups_per_block = threads_per_block / group;
  const int lane = static_cast<int>(threadIdx.x) % group;
  const std::int64_t groups = static_cast<std::int64_t>(gridDim.x) * groups_per_block;
  // o depends on the group alone: every lane of a warp takes the same trips (the shuffles).
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * groups_per_block +
                        static_cast<int>(threadIdx.x) / group;
       o < outputs; o += groups) {
    thread_fold<Op> fold;
    for (std::int64_t s = lane; s < splits; s += group) fold.add(partials[o * splits + s]);
    const typename Op::acc_type total = merge_across_lanes<Op>(fold.result(), group);
    if (lane == 0) out[o] = Finish::template apply<Out>(total, extent);
  }
}

/// Splits a merge kernel's thread reads one after another before it takes a warp per output.
inline constexpr std::int64_t warp_merge_splits = 32;

inline unsigned blocks_for(std::int64_t work, std::int64_t per_block) {
  const std::int64_t wanted = (work + per_block - 1) / per_block;
  const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count()) * 16;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(wanted, cap)));
}

/// backends::cuda::reduction_row_lanes, checked: 0 or a power of two up to the block.
inline int row_lanes_setting() {
  const int lanes = backends::cuda::reduction_row_lanes.load(std::memory_order_relaxed);
  if (lanes < 0 || lanes > threads_per_block || (lanes & (lanes - 1)) != 0) {
    throw std::invalid_argument("Tessera: backends::cuda::reduction_row_lanes is " +
                                std::to_string(lanes) +
                                "; it must be 0 (the plan's choice) or a power of two up to " +
                                std::to_string(threads_per_block));
  }
  return lanes;
}

/// The rows of a reduction as reduce_rows_kernel reads them: the row layout, each leaf's strides
/// over the kept dimensions then the row's, and for a full reduction how many rows make its
/// result (see full_reduction_rows); for one along a dimension whether the kept dimensions are
/// the contiguous ones (see split_layout).
template <std::size_t L>
struct bound_rows {
  row_layout layout;
  std::array<Strides, L> strides;
  std::int64_t rows = 1;
  bool kept_is_inner = false;
};

// The layout work below is out of line: one body per operand count, shared by every expression
// (the templates that take an evaluator keep only it and their launches).

/// The rows along dimension `dim` (the output's strides `out_strides`).
template <std::size_t L>
[[gnu::noinline]] bound_rows<L> rows_along(const Shape& shape, int dim, const Strides& out_strides,
                                           const std::array<Strides, L>& leaf_strides) {
  bound_rows<L> rows;
  rows.layout.extent = shape[dim];
  const cpu::split_layout<L> split(shape, dim, out_strides, leaf_strides);
  rows.layout.kept_rank = split.kept.shape.size();
  for (int d = 0; d < rows.layout.kept_rank; ++d) {
    rows.layout.kept[d] = split.kept.shape[d];
    rows.layout.out_strides[d] = split.kept.strides[0][d];
  }
  rows.layout.out_step = split.stride[0];
  rows.strides = split.dim_innermost();
  rows.kept_is_inner = split.kept_is_inner();
  return rows;
}

/// The rows of a full reduction (full_reduction_rows; row-major positions when `positional`).
template <std::size_t L>
[[gnu::noinline]] bound_rows<L> rows_of_all(const Shape& shape,
                                            const std::array<Strides, L>& leaf_strides,
                                            bool positional) {
  const auto plan = full_reduction_rows<L>::make(shape, leaf_strides, positional);
  bound_rows<L> rows;
  rows.layout.kept_rank = plan.kept_rank;
  for (int d = 0; d < plan.kept_rank; ++d) rows.layout.kept[d] = plan.kept[d];
  rows.layout.extent = plan.extent;
  rows.layout.out_step = 1;
  rows.layout.position_step = plan.extent;
  rows.strides = plan.strides;
  rows.rows = plan.rows;
  return rows;
}

[[gnu::noinline]] inline row_reduction_plan plan_reduce_rows(std::int64_t outputs,
                                                             std::int64_t extent, int vector,
                                                             std::int64_t resident_threads,
                                                             int lanes) {
  return row_reduction_plan::make(outputs, extent, vector, threads_per_block, resident_threads, 32,
                                  lanes);
}

[[gnu::noinline]] inline column_reduction_plan plan_reduce_columns(std::int64_t outputs,
                                                                   std::int64_t extent,
                                                                   std::int64_t resident_threads) {
  return column_reduction_plan::make(outputs, extent, threads_per_block, resident_threads);
}

/// Calls launch(rows, kept_is_inner) with the rows along dimension `dim`: bind_row over the
/// merged kept dimensions; kept_is_inner tells whether the kept dimensions are the contiguous
/// ones (see split_layout). Every kernel_choice takes the same source.
template <kernel_choice Choice, std::size_t L, class MakeEvaluator, class Launch>
void with_rows(const Shape& shape, int dim, const Strides& out_strides,
               const std::array<Strides, L>& leaf_strides, MakeEvaluator& make_evaluator,
               Launch&& launch) {
  static_assert(Choice != kernel_choice::compact, "kernel_choice::compact is elementwise only");
  const bound_rows<L> rows = rows_along(shape, dim, out_strides, leaf_strides);
  auto evaluator = make_evaluator(rows.strides.data(), rows.layout.kept_rank + 1);
  launch(row_source<decltype(evaluator)>{evaluator, rows.layout}, rows.kept_is_inner);
}

/// The second pass of a split reduction over `partials` (outputs * splits accumulators): a warp
/// per output for many splits, else a thread per output; reports a failed launch. One body per
/// (Op, Finish, Out), whatever the expression.
template <class Op, class Finish, class Out>
void merge_split_partials(Out* out, const typename Op::acc_type* partials, std::int64_t outputs,
                          std::int64_t splits, std::int64_t extent, stream_ref stream) {
  const int group = splits >= warp_merge_splits ? 32 : 1;
  reduce_split_partials_kernel<Op, Finish, Out>
      <<<blocks_for(outputs, threads_per_block / group), threads_per_block, 0, stream.native()>>>(
          out, partials, outputs, splits, extent, group);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

/// Runs launch(partials) for a reduction of `outputs` results cut into `splits` slices each:
/// with one split, partials is null and the kernel writes the results; with several, partials
/// (outputs * splits accumulators from the device's pool, freed on `stream`) are merged by a
/// second launch.
template <class Op, class Finish, class Out, class Launch>
void with_split_partials(Out* out, std::int64_t outputs, std::int64_t splits,
                         std::int64_t extent, stream_ref stream, Launch&& launch) {
  using acc_type = typename Op::acc_type;
  if (splits == 1) {
    launch(static_cast<acc_type*>(nullptr));
    TESSERA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const auto scratch =
      stream_scratch(static_cast<std::size_t>(outputs * splits) * sizeof(acc_type), stream);
  auto* partials = static_cast<acc_type*>(scratch.data);
  launch(partials);
  TESSERA_CUDA_CHECK(cudaGetLastError());
  merge_split_partials<Op, Finish, Out>(out, partials, outputs, splits, extent, stream);
}

/// reduce_rows_kernel over `outputs` rows of `extent` elements (row_reduction_plan: a warp per
/// row while the rows fill the device; `vector` 4 where every row allows 16-byte loads; `lanes`
/// forced or 0), with the second launch that merges split rows.
template <class Op, class V, class Finish, class Out, class Rows>
void launch_reduce_rows(Out* out, const Rows& rows, std::int64_t outputs, std::int64_t extent,
                        int vector, int lanes, stream_ref stream) {
  static_assert(fits_kernel_parameters<Rows>,
                "Tessera: this expression is too large to pass to one CUDA kernel "
                "(over 4 KiB of parameters); split the statement into two");
  using acc_type = typename Op::acc_type;
  const row_reduction_plan plan =
      plan_reduce_rows(outputs, extent, vector,
                       resident_threads_of<&reduce_rows_kernel<Op, V, Finish, Out, Rows>>(), lanes);
  with_split_partials<Op, Finish>(
      out, outputs, plan.splits, extent, stream, [&](acc_type* partials) {
        reduce_rows_kernel<Op, V, Finish>
            <<<blocks_for(plan.tiles(), 1), threads_per_block, 0, stream.native()>>>(out, partials,
                                                                                     rows, plan);
      });
}

/// reduce_rows_kernel over `outputs` rows of `extent` elements that make one result: each row's
/// partials (row_reduction_plan's slices of it), merged by one block (reduce_partials_kernel;
/// Finish gets the element count n).
template <class Op, class V, class Finish, class Out, class Rows>
void launch_reduce_rows_to_one(Out* out, const Rows& rows, std::int64_t outputs,
                               std::int64_t extent, std::int64_t n, int vector, stream_ref stream) {
  using acc_type = typename Op::acc_type;
  const row_reduction_plan plan =
      plan_reduce_rows(outputs, extent, vector,
                       resident_threads_of<&reduce_rows_kernel<Op, V, Finish, Out, Rows>>(), 0);
  const std::int64_t count = outputs * plan.splits;
  const auto scratch = stream_scratch(static_cast<std::size_t>(count) * sizeof(acc_type), stream);
  auto* partials = static_cast<acc_type*>(scratch.data);
  reduce_rows_kernel<Op, V, Finish>
      <<<blocks_for(plan.tiles(), 1), threads_per_block, 0, stream.native()>>>(out, partials, rows,
                                                                               plan);
  TESSERA_CUDA_CHECK(cudaGetLastError());
  merge_block_partials<Op, Finish, Out>(out, partials, count, n, stream);
}

/// CUDA twin of backend::cpu::reduce_all: *out (device memory) = Finish(Op over every element),
/// on the current device and `stream`. Counts one launch (two kernels when the input is large
/// or strided). Every layout runs the expression's one reduce_rows_kernel (full_reduction_rows):
/// operands that merge into one run of unit stride are one row; others are rows along their
/// innermost merged dimension, merged by a second launch. kernel_choice::fewest takes only
/// operands that make one row (std::logic_error otherwise), so that no merge kernel of block
/// partials is compiled for it.
template <class Op, class V, class Finish, kernel_choice Choice = kernel_choice::fastest, class Out,
          std::size_t L, class MakeEvaluator>
void reduce_all(Out* out, const Shape& shape, const std::array<Strides, L>& leaf_strides,
                MakeEvaluator&& make_evaluator,
                stream_ref stream = tessera::detail::current_cuda_stream()) {
  static_assert(Choice != kernel_choice::compact, "kernel_choice::compact is elementwise only");
  profiler::count_launch();
  const std::int64_t n = shape.numel();
  if (n == 0) {
    write_value_kernel<<<1, 1, 0, stream.native()>>>(
        out, Finish::template apply<Out>(Op::identity(), 0));
    TESSERA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const bound_rows<L> bound = rows_of_all(shape, leaf_strides, positional_op<Op>);
  auto evaluator = make_evaluator(bound.strides.data(), bound.layout.kept_rank + 1);
  const row_source<decltype(evaluator)> rows{evaluator, bound.layout};
  const int vector = rows.vectorisable(4) ? 4 : 1;
  if (bound.rows == 1) {
    launch_reduce_rows<Op, V, Finish>(out, rows, 1, bound.layout.extent, vector, 0, stream);
    return;
  }
  if constexpr (Choice == kernel_choice::fewest) {
    // No merge of block partials in the fewest set: its callers (the primitives) pass operands
    // that make one row.
    throw std::logic_error(
        "Tessera: a full reduction with kernel_choice::fewest of operands that do not make one "
        "dense run (shape " +
        shape.str() + "); make them contiguous first");
  } else {
    launch_reduce_rows_to_one<Op, V, Finish>(out, rows, bound.rows, bound.layout.extent, n, vector,
                                             stream);
  }
}

/// CUDA twin of backend::cpu::reduce_dim (out is contiguous over the kept dimensions). Rows along
/// the reduced dimension (it is innermost, or no kept dimension is contiguous) run
/// reduce_rows_kernel, with 16-byte loads where every operand allows them; kept dimensions that
/// are the contiguous ones run reduce_columns_kernel. Either splits long rows over blocks when
/// the outputs are too few to fill the device (a second kernel merges the partials). One launch.
template <class Op, class V, class Finish, kernel_choice Choice = kernel_choice::fastest, class Out,
          std::size_t L, class MakeEvaluator>
void reduce_dim(Out* out, const Shape& shape, int dim, const std::array<Strides, L>& leaf_strides,
                MakeEvaluator&& make_evaluator,
                stream_ref stream = tessera::detail::current_cuda_stream()) {
  profiler::count_launch();
  const std::int64_t extent = shape[dim];
  std::int64_t outputs = 1;
  for (int d = 0; d < shape.size(); ++d) {
    if (d != dim) outputs *= shape[d];
  }
  if (outputs == 0) return;
  with_rows<Choice>(
      shape, dim, Shape::filled(shape.size(), 0), leaf_strides, make_evaluator,
      [&](auto rows, bool kept_is_inner) {
        static_assert(fits_kernel_parameters<decltype(rows)>,
                      "Tessera: this expression is too large to pass to one CUDA kernel "
                      "(over 4 KiB of parameters); split the statement into two");
        if (kept_is_inner) {
          using acc_type = typename Op::acc_type;
          const column_reduction_plan plan = plan_reduce_columns(
              outputs, extent,
              resident_threads_of<&reduce_columns_kernel<Op, V, Finish, Out, decltype(rows)>>());
          with_split_partials<Op, Finish>(
              out, outputs, plan.splits, extent, stream, [&](acc_type* partials) {
                reduce_columns_kernel<Op, V, Finish>
                    <<<blocks_for(plan.tiles(), 1), threads_per_block, 0, stream.native()>>>(
                        out, partials, rows, plan);
              });
          return;
        }
        launch_reduce_rows<Op, V, Finish>(out, rows, outputs, extent, rows.vectorisable(4) ? 4 : 1,
                                          row_lanes_setting(), stream);
      });
}

// ---- softmax --------------------------------------------------------------------------------

/// One block per row: the row's max, then sum exp(x - max) (cub::BlockReduce each), then the
/// outputs. The expression is read three times, never stored.
template <bool Log, class V, class F, class Rows>
__global__ void __launch_bounds__(threads_per_block)
    softmax_rows_kernel(F* out, Rows rows, std::int64_t count) {
  using A = opmath_t<F>;
  using block_reduce = cub::BlockReduce<A, threads_per_block>;
  __shared__ typename block_reduce::TempStorage temporary;
  __shared__ A row_max;
  __shared__ A row_sum;
  const std::int64_t extent = rows.layout.extent;
  for (std::int64_t o = blockIdx.x; o < count; o += gridDim.x) {
    const auto placed = rows.row(o);
    auto x = [&](std::int64_t r) { return static_cast<A>(rows.template get<V>(placed, r)); };
    A m = max_op<A>::identity();
    for (std::int64_t r = threadIdx.x; r < extent; r += blockDim.x) m = max_op<A>::merge(m, x(r));
    const A block_max = block_reduce(temporary).Reduce(m, merge_fn<max_op<A>>{});
    if (threadIdx.x == 0) row_max = block_max;
    __syncthreads();
    m = row_max;
    device_cascade<sum_op<A>> sums;
    A block = A(0);
    int filled = 0;
    for (std::int64_t r = threadIdx.x; r < extent; r += blockDim.x) {
      block += ops::exp{}(A(x(r) - m));
      if (++filled == thread_block_values) {
        sums.push(block);
        block = A(0);
        filled = 0;
      }
    }
    sums.push(block);
    const A block_sum = block_reduce(temporary).Sum(sums.result());
    if (threadIdx.x == 0) row_sum = block_sum;
    __syncthreads();
    const A s = row_sum;
    F* out_row = out + rows.out_offset(o);
    const std::int64_t step = rows.layout.out_step;
    if constexpr (Log) {
      const A log_s = ops::log{}(s);
      for (std::int64_t r = threadIdx.x; r < extent; r += blockDim.x) {
        out_row[r * step] = store_cast<F>(A(x(r) - m - log_s));
      }
    } else {
      for (std::int64_t r = threadIdx.x; r < extent; r += blockDim.x) {
        out_row[r * step] = store_cast<F>(A(ops::exp{}(A(x(r) - m)) / s));
      }
    }
    __syncthreads();  // row_max, row_sum and the temporary storage are reused by the next row
  }
}

/// CUDA twin of backend::cpu::softmax (out contiguous with the input's shape). One launch.
template <bool Log, class V, kernel_choice Choice = kernel_choice::fastest, class F, std::size_t L,
          class MakeEvaluator>
void softmax(F* out, const Shape& shape, int dim, const std::array<Strides, L>& leaf_strides,
             MakeEvaluator&& make_evaluator,
             stream_ref stream = tessera::detail::current_cuda_stream()) {
  profiler::count_launch();
  const std::int64_t n = shape.numel();
  if (n == 0) return;
  const std::int64_t rows_count = n / shape[dim];
  with_rows<Choice>(
      shape, dim, shape.contiguous_strides(), leaf_strides, make_evaluator, [&](auto rows, bool) {
        static_assert(fits_kernel_parameters<decltype(rows)>,
                      "Tessera: this expression is too large to pass to one CUDA kernel "
                      "(over 4 KiB of parameters); split the statement into two");
        softmax_rows_kernel<Log, V>
            <<<blocks_for(rows_count, 1), threads_per_block, 0, stream.native()>>>(out, rows,
                                                                                   rows_count);
        TESSERA_CUDA_CHECK(cudaGetLastError());
      });
}

}  // namespace tessera::backend::cuda
#endif
