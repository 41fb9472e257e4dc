// How the CUDA backend cuts a reduction into blocks, lanes and loads, and how each thread folds
// its values: plain host and device arithmetic, apart from the kernels (backend/cuda/reduce.cuh),
// so that CPU tests can check that every element is read exactly once, in the order the kernels
// fold it, and what the fold gives.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "tessera/backend/cpu/strided_loop.hpp"
#include "tessera/core/config.hpp"
#include "tessera/core/shape.hpp"

namespace tessera::backend::cuda {

// ---- what one thread folds (host and device: CPU tests run it) -------------------------------

/// Pairwise combination of one thread's blocks of values (the device twin of cpu::cascade). An
/// exact operator (max, min, argmax, integer sums) has nothing to round, so it keeps one
/// accumulator instead of the levels (less local memory per thread).
template <class Op, bool Exact = Op::exact>
struct device_cascade {
  using acc_type = typename Op::acc_type;
  static constexpr int levels = 40;  // 2^40 blocks: more than any row
  acc_type level[levels];
  std::uint64_t pushes = 0;

  TESSERA_HOST_DEVICE void push(acc_type block) {
    std::uint64_t carry = pushes++;
    int k = 0;
    for (; carry & 1; carry >>= 1, ++k) block = Op::merge(level[k], block);
    level[k] = block;
  }
  /// The merge of every block pushed, earlier blocks on the left: the levels from the highest set
  /// one down (a loop over all 40 read the stack frame 40 times per thread and result).
  TESSERA_HOST_DEVICE acc_type result() const {
    acc_type total = Op::identity();
    int top = -1;
    for (std::uint64_t rest = pushes; rest != 0; rest >>= 1) ++top;
    for (int k = top; k >= 0; --k) {
      if ((pushes >> k) & 1) total = Op::merge(total, level[k]);
    }
    return total;
  }
};

template <class Op>
struct device_cascade<Op, true> {
  using acc_type = typename Op::acc_type;
  acc_type total = Op::identity();
  TESSERA_HOST_DEVICE void push(acc_type block) { total = Op::merge(total, block); }
  TESSERA_HOST_DEVICE acc_type result() const { return total; }
};

/// Values a thread folds before its block joins its cascade.
inline constexpr int thread_block_values = 16;

/// Folds a thread's values, in the order they come (positions increasing), thread_block_values
/// at a time into its cascade.
template <class Op>
struct thread_fold {
  using acc_type = typename Op::acc_type;
  device_cascade<Op> sums;
  acc_type block = Op::identity();
  int filled = 0;

  TESSERA_HOST_DEVICE void add(const acc_type& value) {
    block = Op::step(block, value);
    if (++filled == thread_block_values) flush();
  }
  /// N values at once (N divides thread_block_values, and the fold's earlier values came N at a
  /// time): one check for the cascade, not N.
  template <int N>
  TESSERA_HOST_DEVICE void add_run(const acc_type (&values)[N]) {
    static_assert(thread_block_values % N == 0, "a run must divide a block");
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < N; ++k) block = Op::step(block, values[k]);
    filled += N;
    if (filled == thread_block_values) flush();
  }
  TESSERA_HOST_DEVICE void flush() {
    sums.push(block);
    block = Op::identity();
    filled = 0;
  }
  TESSERA_HOST_DEVICE acc_type result() {
    sums.push(block);
    return sums.result();
  }
};

// ---- how the work is cut ----------------------------------------------------------------------

/// A full reduction read as rows by reduce_rows_kernel, the kernel that reductions along a
/// dimension use: the operands' dimensions merged (first put in memory order, so that operands
/// laid out alike in any order, all channels_last, make one run; unless `keep_order`: argmax and
/// argmin need each element's row-major position, which is then row * extent + position), the
/// last merged dimension along the rows and the others kept. Row o's kept index is o in
/// row-major order over `kept`; `strides` holds each operand's strides over the kept dimensions
/// then the row's (rank kept_rank + 1). Contiguous operands make one row of every element.
template <std::size_t L>
struct full_reduction_rows {
  int kept_rank = 0;
  std::int64_t kept[max_dims] = {};
  std::int64_t extent = 1;
  std::int64_t rows = 1;
  std::array<Strides, L> strides;

  /// For `shape` (at least one element) and the operands' strides over it (0 where broadcast).
  static full_reduction_rows make(const Shape& shape, const std::array<Strides, L>& leaf_strides,
                                  bool keep_order) {
    constexpr int N = static_cast<int>(L);
    const cpu::strided_layout<N> merged =
        keep_order || N == 0 ? cpu::strided_layout<N>(shape, leaf_strides)
                             : cpu::strided_layout<N>::in_memory_order(shape, leaf_strides);
    full_reduction_rows plan;
    const int rank = merged.shape.size();
    if (rank == 0) {  // one element: a row of one, read at offset 0
      for (Strides& strides : plan.strides) strides = Strides{0};
      return plan;
    }
    plan.kept_rank = rank - 1;
    plan.extent = merged.shape[rank - 1];
    for (int d = 0; d < plan.kept_rank; ++d) {
      plan.kept[d] = merged.shape[d];
      plan.rows *= merged.shape[d];
    }
    plan.strides = merged.strides;
    return plan;
  }
};

/// Cuts `count` positions into about `wanted` slices of a whole number of `granule`s; writes the
/// slice length and the number of (non-empty) slices, at least 1.
TESSERA_HOST_DEVICE inline void cut_slices(std::int64_t count, std::int64_t wanted,
                                           std::int64_t granule, std::int64_t& slice,
                                           std::int64_t& splits) {
  slice = (count + wanted - 1) / wanted;
  slice = (slice + granule - 1) / granule * granule;
  splits = slice > 0 ? (count + slice - 1) / slice : 1;
  if (splits < 1) splits = 1;
}

/// Values a lane reads before it folds them (one batch: its loads are in flight together).
inline constexpr int reduce_batch_values = 16;

/// A reduction along rows (the reduced dimension innermost in each row, as sum(x, -1)): each row
/// is folded by a group of `group` lanes (a power of two up to the block), `rows_per_block` rows
/// per block; a row too long for the device's lanes is cut into `splits` slices folded by
/// different blocks, whose partials a second pass merges. A lane reads `vector` consecutive
/// elements per load (16-byte loads where every operand is aligned, else 1).
struct row_reduction_plan {
  std::int64_t outputs = 0;
  std::int64_t extent = 0;
  int vector = 1;
  int group = 1;
  int rows_per_block = 1;
  std::int64_t splits = 1;
  std::int64_t slice = 0;  // elements of a row per split: a multiple of group * batch values

  /// `block` threads per block (a power of two), `resident_threads` the lanes the device keeps
  /// busy at once (resident_threads_of the kernel): a group is the widest up to `widest` (a power
  /// of two up to block) that still gives each lane a batch, widened while the rows leave the
  /// device idle (up to block, down to 4 values per lane), and a row is split over blocks while
  /// the blocks still fit the device at once (one wave: a second, partial wave costs a whole
  /// block's latency for a sliver of the work) and each lane keeps 64 values. Reductions take
  /// widest = a warp: when the rows fill the device, a warp per row merges by shuffles alone and
  /// each lane keeps more loads in flight (PyTorch's inner-dimension reductions do the same, at
  /// 0.87 of copy on an H200 for 8192 rows of 3136 floats); elementwise rows take the block. A
  /// positive `lanes` (a power of two up to block: backends::cuda::reduction_row_lanes, for
  /// cuda_bench's sweep) sets the group instead.
  TESSERA_HOST_DEVICE static row_reduction_plan make(std::int64_t outputs, std::int64_t extent,
                                                     int vector, int block,
                                                     std::int64_t resident_threads, int widest,
                                                     int lanes = 0) {
    row_reduction_plan plan;
    plan.outputs = outputs;
    plan.extent = extent;
    plan.vector = vector;
    if (widest > block) widest = block;
    int group = 1;
    while (group < widest && std::int64_t{group} * 2 * reduce_batch_values <= extent) group *= 2;
    if (outputs * group < resident_threads) {
      std::int64_t wanted = 1;
      while (wanted < block && outputs * wanted < resident_threads) wanted *= 2;
      while (group < wanted && std::int64_t{group} * 2 * 4 <= extent) group *= 2;
    }
    if (lanes > 0) group = lanes;
    plan.group = group;
    plan.rows_per_block = block / group;
    std::int64_t splits = 1;
    if (group == block && outputs * group < resident_threads) {
      const std::int64_t by_device = resident_threads / (outputs * group);
      const std::int64_t by_work = extent / (std::int64_t{group} * 64);
      splits = by_device < by_work ? by_device : by_work;
      if (splits < 1) splits = 1;
    }
    const std::int64_t granule = std::int64_t{group} * reduce_batch_values;
    cut_slices(extent, splits, granule, plan.slice, plan.splits);
    return plan;
  }
  /// Blocks of work: row blocks times splits (a grid-stride loop goes over them).
  TESSERA_HOST_DEVICE std::int64_t tiles() const {
    return (outputs + rows_per_block - 1) / rows_per_block * splits;
  }
  TESSERA_HOST_DEVICE std::int64_t first(std::int64_t split) const { return split * slice; }
  TESSERA_HOST_DEVICE std::int64_t last(std::int64_t split) const {
    const std::int64_t end = (split + 1) * slice;
    return end < extent ? end : extent;
  }

  /// The positions lane `lane` reads in slice `split` of a row, in the order it folds them:
  /// batch(p, step) for reduce_batch_values / vector loads of `vector` elements at p, p + step,
  /// ...; single(p) for one load of `vector` at p; scalar(p) for one element (the slice's last
  /// elements that fill no whole load). Positions increase along a lane.
  template <class Batch, class Single, class Scalar>
  TESSERA_HOST_DEVICE void walk(std::int64_t split, int lane, Batch&& batch, Single&& single,
                                Scalar&& scalar) const {
    const std::int64_t begin = first(split);
    const std::int64_t end = last(split);
    const std::int64_t vector_end = begin + (end - begin) / vector * vector;
    const std::int64_t step = std::int64_t{group} * vector;
    const int loads = reduce_batch_values / vector;
    std::int64_t p = begin + std::int64_t{lane} * vector;
    for (; p + (loads - 1) * step + vector <= vector_end; p += loads * step) batch(p, step);
    for (; p + vector <= vector_end; p += step) single(p);
    for (std::int64_t q = vector_end + lane; q < end; q += group) scalar(q);
  }
};

/// A reduction whose kept dimensions are the contiguous ones (sum(x, 0) of a matrix): a block's
/// `columns` lanes take neighbouring outputs (their loads coalesce) and its `lanes` rows of
/// threads take interleaved positions along the reduced dimension; with few outputs the reduced
/// dimension is cut into `splits` slices folded by different blocks, merged by a second pass.
struct column_reduction_plan {
  std::int64_t outputs = 0;
  std::int64_t extent = 0;
  int columns = 32;
  int lanes = 8;
  std::int64_t splits = 1;
  std::int64_t slice = 0;  // positions per split: a multiple of lanes

  TESSERA_HOST_DEVICE static column_reduction_plan make(std::int64_t outputs, std::int64_t extent,
                                                        int block,
                                                        std::int64_t resident_threads) {
    column_reduction_plan plan;
    plan.outputs = outputs;
    plan.extent = extent;
    plan.columns = 32;
    plan.lanes = block / 32;
    const std::int64_t threads = column_blocks(outputs, plan.columns) * block;
    std::int64_t splits = 1;
    if (threads < resident_threads) {
      const std::int64_t by_device = resident_threads / threads;  // one wave (row_reduction_plan)
      const std::int64_t by_work = extent / (std::int64_t{plan.lanes} * 32);
      splits = by_device < by_work ? by_device : by_work;
      if (splits < 1) splits = 1;
    }
    cut_slices(extent, splits, plan.lanes, plan.slice, plan.splits);
    return plan;
  }
  TESSERA_HOST_DEVICE static std::int64_t column_blocks(std::int64_t outputs, int columns) {
    return (outputs + columns - 1) / columns;
  }
  TESSERA_HOST_DEVICE std::int64_t tiles() const {
    return column_blocks(outputs, columns) * splits;
  }
  TESSERA_HOST_DEVICE std::int64_t first(std::int64_t split) const { return split * slice; }
  TESSERA_HOST_DEVICE std::int64_t last(std::int64_t split) const {
    const std::int64_t end = (split + 1) * slice;
    return end < extent ? end : extent;
  }
};

/// Per-channel reductions of an [N, C, L] tensor (batch norm's statistics and gradient sums):
/// channel c's N * L elements, at positions j = n * L + l, are folded by `lanes` threads: a whole
/// block (lanes == block) whose channel may be cut into `splits` slices, one block each, or, for
/// channels of fewer than block * 16 values (ResNet's 7x7 and 14x14 planes at small batches), one
/// warp per channel and block / 32 channels per block, so that no lane idles over a value or two
/// and a block's reduction is a warp's. Lanes take `vector` consecutive positions at a time
/// (16-byte loads when L is a multiple of vector and the tensors are aligned: a load then never
/// crosses from one n to the next). A second launch merges a channel's slices when there are
/// several.
struct channel_reduction_plan {
  static constexpr std::int64_t max_splits = 32;  // bounds the partials a caller reserves
  static constexpr int warp = 32;
  std::int64_t channels = 0;
  std::int64_t count = 0;  // elements per channel, N * L
  int vector = 1;
  int lanes = 256;            // threads per channel slice: the block, or a warp
  int channels_per_block = 1;  // block / lanes
  std::int64_t splits = 1;
  std::int64_t slice = 0;  // positions per split: a multiple of lanes * vector

  /// A warp per channel below block * 16 values; else a block, split while the slices' blocks
  /// still fit the device at once (`resident_threads`: resident_threads_of the kernel; one wave,
  /// as row_reduction_plan), each thread keeping 16 values a slice.
  TESSERA_HOST_DEVICE static channel_reduction_plan make(std::int64_t channels, std::int64_t count,
                                                         int vector, int block,
                                                         std::int64_t resident_threads) {
    channel_reduction_plan plan;
    plan.channels = channels;
    plan.count = count;
    plan.vector = vector;
    plan.lanes = block > warp && count < std::int64_t{block} * 16 ? warp : block;
    plan.channels_per_block = block / plan.lanes;
    std::int64_t splits = 1;
    if (plan.lanes == block && channels * block < resident_threads) {
      const std::int64_t by_device = resident_threads / (channels * block);  // one wave
      const std::int64_t by_work = count / (std::int64_t{block} * 16);
      splits = by_device < by_work ? by_device : by_work;
      if (splits > max_splits) splits = max_splits;
      if (splits < 1) splits = 1;
    }
    const std::int64_t granule = std::int64_t{plan.lanes} * vector;
    cut_slices(count, splits, granule, plan.slice, plan.splits);
    return plan;
  }
  /// Blocks of the grid: groups of channels_per_block channels, times the splits.
  TESSERA_HOST_DEVICE std::int64_t blocks() const {
    return (channels + channels_per_block - 1) / channels_per_block * splits;
  }
  /// The channel and the split that lane group `group` of block `block` folds (channel >= channels:
  /// none, in the last block).
  TESSERA_HOST_DEVICE std::int64_t channel_of(std::int64_t block, int group) const {
    return block / splits * channels_per_block + group;
  }
  TESSERA_HOST_DEVICE std::int64_t split_of(std::int64_t block) const { return block % splits; }
  TESSERA_HOST_DEVICE std::int64_t first(std::int64_t split) const { return split * slice; }
  TESSERA_HOST_DEVICE std::int64_t last(std::int64_t split) const {
    const std::int64_t end = (split + 1) * slice;
    return end < count ? end : count;
  }
};

/// Per-channel reductions of a channels_last tensor, seen as [M, C] row-major (M = N * H * W
/// positions, the channel innermost): a block's `columns` (32) lanes take neighbouring channels,
/// so a warp's loads of one position are one run of 32 channels, and its `row_lanes` rows of
/// threads take interleaved positions; the positions are cut into `splits` slices, one block
/// each, while the channel groups alone leave the device idle (each thread keeping at least 16
/// positions a slice, and within channel_partial_slots). Partials are laid out as
/// channel_reduction_plan's (channel c, split s at c * splits + s), so the same second launch
/// merges them.
/// Partials a per-channel reduction of `channels` channels may write: max_splits slices a
/// channel, and at least 32768 in all, so that few channels laid out channels_last (64, at
/// ResNet's first batch norm) can still be cut into enough slices to fill the device.
TESSERA_HOST_DEVICE inline std::int64_t channel_partial_slots(std::int64_t channels) {
  const std::int64_t by_channel = channels * channel_reduction_plan::max_splits;
  return by_channel > 32768 ? by_channel : 32768;
}

struct channels_last_reduction_plan {
  static constexpr int columns = 32;
  std::int64_t channels = 0;
  std::int64_t positions = 0;  // M
  int row_lanes = 8;           // block / columns
  std::int64_t splits = 1;
  std::int64_t slice = 0;  // positions per split: a multiple of row_lanes

  TESSERA_HOST_DEVICE static channels_last_reduction_plan make(std::int64_t channels,
                                                               std::int64_t positions, int block,
                                                               std::int64_t resident_threads) {
    channels_last_reduction_plan plan;
    plan.channels = channels;
    plan.positions = positions;
    plan.row_lanes = block / columns;
    const std::int64_t groups = (channels + columns - 1) / columns;
    std::int64_t splits = 1;
    if (groups * block < resident_threads) {
      const std::int64_t by_device = resident_threads / (groups * block);  // one wave
      const std::int64_t by_work = positions / (std::int64_t{plan.row_lanes} * 16);
      splits = by_device < by_work ? by_device : by_work;
      const std::int64_t by_slots = channel_partial_slots(channels) / channels;
      if (splits > by_slots) splits = by_slots;
      if (splits < 1) splits = 1;
    }
    cut_slices(positions, splits, plan.row_lanes, plan.slice, plan.splits);
    return plan;
  }
  /// Blocks of the grid: channel groups times splits.
  TESSERA_HOST_DEVICE std::int64_t blocks() const {
    return (channels + columns - 1) / columns * splits;
  }
  /// The channel that lane `thread` of block `block` folds (>= channels: none), and its split.
  TESSERA_HOST_DEVICE std::int64_t channel_of(std::int64_t block, int thread) const {
    return block / splits * columns + thread % columns;
  }
  TESSERA_HOST_DEVICE std::int64_t split_of(std::int64_t block) const { return block % splits; }
  TESSERA_HOST_DEVICE std::int64_t first(std::int64_t split) const { return split * slice; }
  TESSERA_HOST_DEVICE std::int64_t last(std::int64_t split) const {
    const std::int64_t end = (split + 1) * slice;
    return end < positions ? end : positions;
  }
};

/// How batch norm's elementwise passes (batch_norm.cuh, channel_map_kernel) walk an [n, c, l]
/// tensor whose pointers are `aligned` to `vector` elements: 16-byte steps of vector elements of
/// one channel (l a multiple of vector), of vector neighbouring channels (l == 1 and c a multiple
/// of vector: channels_last, [N * H * W, C, 1]), or one element at a time.
enum class channel_map_form { shared_channel, neighbouring_channels, single };
TESSERA_HOST_DEVICE inline channel_map_form choose_channel_map(std::int64_t c, std::int64_t l,
                                                               int vector, bool aligned) {
  if (!aligned || vector <= 1) return channel_map_form::single;
  if (l % vector == 0) return channel_map_form::shared_channel;
  if (l == 1 && c % vector == 0) return channel_map_form::neighbouring_channels;
  return channel_map_form::single;
}

/// A set of values summarised for the mean and variance: count, mean, and the sum of squared
/// deviations from the mean (m2). Merging two is Chan, Golub and LeVeque's update, exact in
/// exact arithmetic and free of the cancellation of sum-of-squares formulas.
template <class A>
struct moments {
  A count = 0;
  A mean = 0;
  A m2 = 0;

  /// The moments of values x_i = shift + d_i from sum(d) and sum(d^2) of `count` values: one pass
  /// over a thread's few values, whose shift is its first value (so d stays small).
  TESSERA_HOST_DEVICE static moments from_shifted_sums(A count, A shift, A sum, A sum_squares) {
    moments m;
    if (count > 0) {
      const A mean_shift = sum / count;
      m.count = count;
      m.mean = shift + mean_shift;
      const A m2 = sum_squares - sum * mean_shift;
      m.m2 = m2 > 0 ? m2 : A(0);
    }
    return m;
  }
};

template <class A>
TESSERA_HOST_DEVICE moments<A> merge_moments(const moments<A>& a, const moments<A>& b) {
  const A count = a.count + b.count;
  if (count == 0) return a;
  const A delta = b.mean - a.mean;
  const A weight = b.count / count;
  moments<A> m;
  m.count = count;
  m.mean = a.mean + delta * weight;
  m.m2 = a.m2 + b.m2 + delta * delta * a.count * weight;
  return m;
}

}  // namespace tessera::backend::cuda
