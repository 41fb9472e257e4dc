// Batch normalisation's per-channel reductions on CUDA, for contiguous [N, C, L] float and double
// tensors: the batch's statistics in one pass over x (each thread sums its values' deviations
// from its first one, and threads, blocks and slices merge as (count, mean, m2) moments), and the
// backward's two sums, of g and of g * (x - mean) (g masked by y > 0 when ReLU follows), in one
// pass over g and x: blocks over (channel, slice), or a warp per channel for channels of few
// values; when a channel is cut into several slices, they write partials and a second launch (a
// thread per channel) merges them into the [C] results, else they write the results. How a
// channel is cut is channel_reduction_plan (reduce_plan.hpp, tested on the CPU).
// nn/detail/batch_norm.hpp calls these on CUDA devices; elsewhere it runs the same arithmetic as
// fused expressions. Included only by nvcc-compiled units.
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA_KERNELS
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include "tessera/backend/cpu/reduce.hpp"
#include "tessera/backend/cuda/executor.cuh"
#include "tessera/backend/cuda/reduce.cuh"
#include "tessera/backend/cuda/reduce_plan.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/stream.hpp"

namespace tessera::backend::cuda {

/// Bytes of the partials a channel reduction of `channels` channels needs (channel_partial_slots,
/// 24 bytes each).
inline std::size_t channel_partials_bytes(std::int64_t channels) {
  return static_cast<std::size_t>(channel_partial_slots(channels)) * sizeof(moments<double>);
}

/// Where position j = n * L + l of channel c is, from the channel's first element.
struct channel_positions {
  std::int64_t inner = 1;     // L
  std::int64_t row_step = 1;  // C * L: from one n to the next
  bool narrow = true;         // positions fit 32 bits: one 32-bit division per load

  __device__ std::int64_t offset(std::int64_t j) const {
    std::int64_t n;
    if (narrow) {
      n = static_cast<std::int64_t>(static_cast<std::uint32_t>(j) /
                                    static_cast<std::uint32_t>(inner));
    } else {
      n = j / inner;
    }
    return n * row_step + (j - n * inner);
  }
};

/// Calls visit.run(values[N]) on lane `lane`'s values (of plan.lanes) of channel slice `split`,
/// in increasing positions: runs of 16 (four 16-byte loads, or 16 single loads), then of 4 (one
/// load), then single values. load.get<W>(offset, out) reads W consecutive elements.
template <class Load, class Visit>
__device__ void channel_walk(const channel_reduction_plan& plan, std::int64_t split, int lane,
                             const channel_positions& where, Load&& load, Visit&& visit) {
  const std::int64_t begin = plan.first(split);
  const std::int64_t end = plan.last(split);
  const std::int64_t threads = plan.lanes;
  if (plan.vector == 4) {
    const std::int64_t vector_end = begin + (end - begin) / 4 * 4;
    const std::int64_t step = threads * 4;
    std::int64_t j = begin + static_cast<std::int64_t>(lane) * 4;
    for (; j + 3 * step + 4 <= vector_end; j += 4 * step) {
      typename std::remove_cvref_t<Load>::value_type values[16];
#pragma unroll
      for (int k = 0; k < 4; ++k) load.template get<4>(where.offset(j + k * step), values + 4 * k);
      visit.template run<16>(values);
    }
    for (; j + 4 <= vector_end; j += step) {
      typename std::remove_cvref_t<Load>::value_type values[4];
      load.template get<4>(where.offset(j), values);
      visit.template run<4>(values);
    }
    for (std::int64_t q = vector_end + lane; q < end; q += threads) {
      typename std::remove_cvref_t<Load>::value_type values[1];
      load.template get<1>(where.offset(q), values);
      visit.template run<1>(values);
    }
  } else {
    std::int64_t j = begin + lane;
    for (; j + 15 * threads < end; j += 16 * threads) {
      typename std::remove_cvref_t<Load>::value_type values[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) load.template get<1>(where.offset(j + k * threads), values + k);
      visit.template run<16>(values);
    }
    for (; j < end; j += threads) {
      typename std::remove_cvref_t<Load>::value_type values[1];
      load.template get<1>(where.offset(j), values);
      visit.template run<1>(values);
    }
  }
}

/// The values of up to three tensors at one offset (x; or g, x and y), as A.
template <class T, class A, int Tensors>
struct channel_load {
  struct value_type {
    A v[Tensors];
  };
  const T* data[Tensors];

  template <int W>
  __device__ void get(std::int64_t offset, value_type* out) const {
#pragma unroll
    for (int t = 0; t < Tensors; ++t) {
      if constexpr (W == 4) {
        const auto loaded = *reinterpret_cast<const aligned_vector<T, 4>*>(data[t] + offset);
#pragma unroll
        for (int k = 0; k < 4; ++k) out[k].v[t] = static_cast<A>(loaded.values[k]);
      } else {
        out[0].v[t] = data[t] == nullptr ? A(0) : static_cast<A>(data[t][offset]);
      }
    }
  }
};

/// A slice's sums for the backward: of g and of g * (x - mean).
struct gradient_partial {
  double g = 0;
  double gx = 0;
};
static_assert(sizeof(gradient_partial) <= sizeof(moments<double>),
              "channel_partials_bytes reserves a moments<double> per slice");

template <class A>
struct moments_merge {
  __device__ moments<A> operator()(const moments<A>& a, const moments<A>& b) const {
    return merge_moments(a, b);
  }
};

/// A thread's values of x: deviations from its first value, summed (cascades, as every
/// reduction) with their squares.
template <class A>
struct moments_visit {
  thread_fold<sum_op<A>> sum, squares;
  A shift = 0;
  A count = 0;

  template <int N, class V>
  __device__ void run(const V (&values)[N]) {
    if (count == 0) shift = values[0].v[0];
    A d[N], d2[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      d[k] = values[k].v[0] - shift;
      d2[k] = d[k] * d[k];
    }
    add(sum, d);
    add(squares, d2);
    count += N;
  }
  template <int N>
  __device__ static void add(thread_fold<sum_op<A>>& fold, const A (&values)[N]) {
    if constexpr (N == 1) {
      fold.add(values[0]);
    } else {
      fold.add_run(values);
    }
  }
};

/// stats [3, C] of channel c from its moments: mean, 1 / sqrt(var + eps), var (biased).
template <class T>
__device__ void write_statistics(const moments<double>& m, std::int64_t c, std::int64_t channels,
                                 double eps, T* stats) {
  const double var = m.count > 0 ? m.m2 / m.count : 0.0;
  stats[c] = static_cast<T>(m.mean);
  stats[channels + c] = static_cast<T>(1.0 / ::sqrt(var + eps));
  stats[2 * channels + c] = static_cast<T>(var);
}

/// A channel slice's moments into `partials`, or, when the channel is one slice (plan.splits ==
/// 1), its statistics straight into `stats` (no merging launch).
template <class T, class A>
__global__ void __launch_bounds__(threads_per_block)
    batch_norm_moments_kernel(channel_load<T, A, 1> x, channel_positions where,
                              channel_reduction_plan plan, moments<double>* partials, double eps,
                              T* stats) {
  using block_reduce = cub::BlockReduce<moments<A>, threads_per_block>;
  using warp_reduce = cub::WarpReduce<moments<A>>;
  __shared__ typename block_reduce::TempStorage temporary;
  __shared__ typename warp_reduce::TempStorage warp_temporary[threads_per_block / 32];
  const int group = static_cast<int>(threadIdx.x) / plan.lanes;
  const int lane = static_cast<int>(threadIdx.x) % plan.lanes;
  const std::int64_t c = plan.channel_of(blockIdx.x, group);
  const std::int64_t split = plan.split_of(blockIdx.x);
  moments_visit<A> visit;
  if (c < plan.channels) {
    channel_load<T, A, 1> channel = x;
    channel.data[0] += c * where.inner;
    channel_walk(plan, split, lane, where, channel, visit);
  }
  const moments<A> mine = moments<A>::from_shifted_sums(visit.count, visit.shift,
                                                        visit.sum.result(), visit.squares.result());
  // A block folds one channel slice, or each warp one channel (plan.lanes == 32).
  const moments<A> total =
      plan.lanes == threads_per_block
          ? block_reduce(temporary).Reduce(mine, moments_merge<A>{})
          : warp_reduce(warp_temporary[group]).Reduce(mine, moments_merge<A>{});
  if (lane == 0 && c < plan.channels) {
    const moments<double> m{static_cast<double>(total.count), static_cast<double>(total.mean),
                            static_cast<double>(total.m2)};
    if (plan.splits == 1) {
      write_statistics(m, c, plan.channels, eps, stats);  // what the merge of one slice gives
    } else {
      partials[c * plan.splits + split] = m;
    }
  }
}

/// One thread per channel: merges its slices' moments (in slice order, in double) and writes
/// stats [3, C]: mean, 1 / sqrt(var + eps), var (biased).
template <class T>
__global__ void __launch_bounds__(threads_per_block)
    batch_norm_statistics_kernel(const moments<double>* partials, std::int64_t channels,
                                 std::int64_t splits, double eps, T* stats) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       c < channels; c += stride) {
    moments<double> m;
    for (std::int64_t s = 0; s < splits; ++s) m = merge_moments(m, partials[c * splits + s]);
    write_statistics(m, c, channels, eps, stats);
  }
}

/// A thread's values of (g, x, y): sums of g and of g * (x - mean), g masked by y > 0 when y is
/// given (ReLU after the batch norm).
template <class A>
struct gradient_visit {
  thread_fold<sum_op<A>> sum_g, sum_gx;
  A mean = 0;
  bool relu = false;

  template <int N, class V>
  __device__ void run(const V (&values)[N]) {
    A g[N], gx[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const A masked = relu && !(values[k].v[2] > A(0)) ? A(0) : values[k].v[0];
      g[k] = masked;
      gx[k] = masked * (values[k].v[1] - mean);
    }
    moments_visit<A>::add(sum_g, g);
    moments_visit<A>::add(sum_gx, gx);
  }
};

/// A channel slice's sums into `partials`, or, when the channel is one slice, straight into
/// sum_g[c] and sum_gx[c] (no merging launch).
template <class T, class A>
__global__ void __launch_bounds__(threads_per_block)
    batch_norm_gradient_sums_kernel(channel_load<T, A, 3> gxy, const T* mean,
                                    channel_positions where, channel_reduction_plan plan,
                                    gradient_partial* partials, T* sum_g_out, T* sum_gx_out) {
  using block_reduce = cub::BlockReduce<A, threads_per_block>;
  using warp_reduce = cub::WarpReduce<A>;
  __shared__ typename block_reduce::TempStorage temporary;
  __shared__ typename warp_reduce::TempStorage warp_temporary[threads_per_block / 32];
  const int group = static_cast<int>(threadIdx.x) / plan.lanes;
  const int lane = static_cast<int>(threadIdx.x) % plan.lanes;
  const std::int64_t c = plan.channel_of(blockIdx.x, group);
  const std::int64_t split = plan.split_of(blockIdx.x);
  gradient_visit<A> visit;
  if (c < plan.channels) {
    channel_load<T, A, 3> channel = gxy;
    const bool relu = channel.data[2] != nullptr;
    for (int t = 0; t < 3; ++t) {
      if (channel.data[t] != nullptr) channel.data[t] += c * where.inner;
    }
    // Without ReLU, y is not read: its slot points at g (a value loaded and ignored would cost a
    // pass over memory; reading g's again hits the cache lines just loaded).
    if (!relu) channel.data[2] = channel.data[0];
    visit.mean = static_cast<A>(mean[c]);
    visit.relu = relu;
    channel_walk(plan, split, lane, where, channel, visit);
  }
  A sum_g, sum_gx;
  if (plan.lanes == threads_per_block) {
    sum_g = block_reduce(temporary).Sum(visit.sum_g.result());
    __syncthreads();  // the temporary storage is reused
    sum_gx = block_reduce(temporary).Sum(visit.sum_gx.result());
  } else {  // a warp per channel
    sum_g = warp_reduce(warp_temporary[group]).Sum(visit.sum_g.result());
    __syncwarp();
    sum_gx = warp_reduce(warp_temporary[group]).Sum(visit.sum_gx.result());
  }
  if (lane == 0 && c < plan.channels) {
    const gradient_partial sums{static_cast<double>(sum_g), static_cast<double>(sum_gx)};
    if (plan.splits == 1) {  // what the finishing launch's sum of one slice gives
      sum_g_out[c] = static_cast<T>(sums.g);
      sum_gx_out[c] = static_cast<T>(sums.gx);
    } else {
      partials[c * plan.splits + split] = sums;
    }
  }
}

/// One thread per channel: adds its slices' sums (in slice order, in double) into sum_g[c] and
/// sum_gx[c].
template <class T>
__global__ void __launch_bounds__(threads_per_block)
    batch_norm_gradient_finish_kernel(const gradient_partial* partials, std::int64_t channels,
                                      std::int64_t splits, T* sum_g, T* sum_gx) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       c < channels; c += stride) {
    double g = 0, gx = 0;
    for (std::int64_t s = 0; s < splits; ++s) {
      g += partials[c * splits + s].g;
      gx += partials[c * splits + s].gx;
    }
    sum_g[c] = static_cast<T>(g);
    sum_gx[c] = static_cast<T>(gx);
  }
}

// ---- the same reductions over channels_last tensors ------------------------------------------
// x as [M, C] row-major (the channel innermost): a warp reads 32 neighbouring channels of one
// position at once (channels_last_reduction_plan), each thread folds its channel's values at
// positions row_lane, row_lane + row_lanes, ... of its slice, four loads in flight, and the
// block's rows of threads merge through shared memory. The partials, their layout and the
// merging launches are the NCHW kernels'.

/// Calls visit.run on thread (column, row_lane)'s values of its channel in slice `split`, four
/// positions at a time, then one; load.get<1>(offset, out) reads the value at `offset` elements
/// from the channel's first (offset = position * C).
template <class Load, class Visit>
__device__ void channels_last_walk(const channels_last_reduction_plan& plan, std::int64_t split,
                                   int row_lane, Load&& load, Visit&& visit) {
  using value_type = typename std::remove_cvref_t<Load>::value_type;
  const std::int64_t end = plan.last(split);
  const std::int64_t step = plan.row_lanes;
  std::int64_t p = plan.first(split) + row_lane;
  for (; p + 3 * step < end; p += 4 * step) {
    value_type values[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) load.template get<1>((p + k * step) * plan.channels, values + k);
    visit.template run<4>(values);
  }
  for (; p < end; p += step) {
    value_type values[1];
    load.template get<1>(p * plan.channels, values);
    visit.template run<1>(values);
  }
}

/// Where this thread works in a channels_last reduction: its column (channel within the block's
/// group of 32), its row of threads, its channel (>= plan.channels: none) and its slice.
struct channels_last_lane {
  int column, row_lane;
  std::int64_t channel, split;
  __device__ explicit channels_last_lane(const channels_last_reduction_plan& plan)
      : column(static_cast<int>(threadIdx.x) % channels_last_reduction_plan::columns),
        row_lane(static_cast<int>(threadIdx.x) / channels_last_reduction_plan::columns),
        channel(plan.channel_of(blockIdx.x, static_cast<int>(threadIdx.x))),
        split(plan.split_of(blockIdx.x)) {}
};

/// batch_norm_moments_kernel for channels_last x: a channel slice's moments into `partials`, or
/// the statistics straight into `stats` when there is one slice.
template <class T, class A>
__global__ void __launch_bounds__(threads_per_block)
    batch_norm_moments_channels_last_kernel(const T* x, channels_last_reduction_plan plan,
                                            moments<double>* partials, double eps, T* stats) {
  __shared__ A merged[3][threads_per_block];  // count, mean, m2 (a __shared__ array of moments<A>
                                              // would need its constructor run)
  const channels_last_lane lane(plan);
  const int column = lane.column, row_lane = lane.row_lane;
  const std::int64_t c = lane.channel, split = lane.split;
  moments_visit<A> visit;
  if (c < plan.channels) {
    channels_last_walk(plan, split, row_lane, channel_load<T, A, 1>{{x + c}}, visit);
  }
  const moments<A> mine = moments<A>::from_shifted_sums(visit.count, visit.shift,
                                                        visit.sum.result(), visit.squares.result());
  merged[0][threadIdx.x] = mine.count;
  merged[1][threadIdx.x] = mine.mean;
  merged[2][threadIdx.x] = mine.m2;
  __syncthreads();
  if (row_lane != 0 || c >= plan.channels) return;
  moments<A> total = mine;
  for (int r = 1; r < plan.row_lanes; ++r) {
    const int k = r * channels_last_reduction_plan::columns + column;
    moments<A> other;
    other.count = merged[0][k];
    other.mean = merged[1][k];
    other.m2 = merged[2][k];
    total = merge_moments(total, other);
  }
  const moments<double> m{static_cast<double>(total.count), static_cast<double>(total.mean),
                          static_cast<double>(total.m2)};
  if (plan.splits == 1) {
    write_statistics(m, c, plan.channels, eps, stats);
  } else {
    partials[c * plan.splits + split] = m;
  }
}

/// batch_norm_gradient_sums_kernel for channels_last g, x (and y): a channel slice's sums into
/// `partials`, or straight into sum_g[c] and sum_gx[c] when there is one slice.
template <class T, class A>
__global__ void __launch_bounds__(threads_per_block)
    batch_norm_gradient_sums_channels_last_kernel(channel_load<T, A, 3> gxy, const T* mean,
                                                  channels_last_reduction_plan plan,
                                                  gradient_partial* partials, T* sum_g_out,
                                                  T* sum_gx_out) {
  __shared__ A merged_g[threads_per_block];
  __shared__ A merged_gx[threads_per_block];
  const channels_last_lane lane(plan);
  const int column = lane.column, row_lane = lane.row_lane;
  const std::int64_t c = lane.channel, split = lane.split;
  gradient_visit<A> visit;
  if (c < plan.channels) {
    channel_load<T, A, 3> channel = gxy;
    const bool relu = channel.data[2] != nullptr;
    for (int t = 0; t < 3; ++t) {
      if (channel.data[t] != nullptr) channel.data[t] += c;
    }
    if (!relu) channel.data[2] = channel.data[0];  // not read for its value (see the NCHW kernel)
    visit.mean = static_cast<A>(mean[c]);
    visit.relu = relu;
    channels_last_walk(plan, split, row_lane, channel, visit);
  }
  merged_g[threadIdx.x] = visit.sum_g.result();
  merged_gx[threadIdx.x] = visit.sum_gx.result();
  __syncthreads();
  if (row_lane != 0 || c >= plan.channels) return;
  A sum_g = merged_g[column], sum_gx = merged_gx[column];
  for (int r = 1; r < plan.row_lanes; ++r) {
    sum_g += merged_g[r * channels_last_reduction_plan::columns + column];
    sum_gx += merged_gx[r * channels_last_reduction_plan::columns + column];
  }
  if (plan.splits == 1) {
    sum_g_out[c] = static_cast<T>(sum_g);
    sum_gx_out[c] = static_cast<T>(sum_gx);
  } else {
    partials[c * plan.splits + split] =
        gradient_partial{static_cast<double>(sum_g), static_cast<double>(sum_gx)};
  }
}

/// The plan of `Kernel` (one of the channels_last reductions) over [positions, channels].
template <auto Kernel>
channels_last_reduction_plan channels_last_plan(std::int64_t positions, std::int64_t channels) {
  return channels_last_reduction_plan::make(channels, positions, threads_per_block,
                                            resident_threads_of<Kernel>());
}

/// The plan and positions of `Kernel`'s channel reduction over [n, c, l] tensors at `pointers`
/// (16-byte loads when l is a multiple of 4 and every pointer allows them).
template <auto Kernel, class T>
channel_reduction_plan channel_plan(std::int64_t n, std::int64_t c, std::int64_t l,
                                    std::initializer_list<const T*> pointers,
                                    channel_positions& where) {
  bool aligned = l % 4 == 0;
  for (const T* p : pointers) {
    aligned = aligned && (p == nullptr ||
                          reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * 4) == 0);
  }
  where.inner = l;
  where.row_step = c * l;
  where.narrow = n * l <= static_cast<std::int64_t>(UINT32_MAX);
  return channel_reduction_plan::make(c, n * l, aligned ? 4 : 1, threads_per_block,
                                      resident_threads_of<Kernel>());
}

/// stats [3, C] (mean, 1 / sqrt(var + eps), var) of x [n, c, l] (n * l > 0), contiguous, or
/// the [N, C, H * W] view of a dense channels_last tensor when `channels_last` (the column
/// kernel over [n * l, c]), with `partials` device memory of channel_partials_bytes(c). Counts
/// one launch (a second kernel merges when a channel is cut).
template <class T>
void batch_norm_statistics(const T* x, std::int64_t n, std::int64_t c, std::int64_t l, T* stats,
                           double eps, void* partials, bool channels_last = false,
                           stream_ref stream = tessera::detail::current_cuda_stream()) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "batch_norm_statistics: float or double");
  profiler::count_launch();
  if (c == 0) return;
  auto* parts = static_cast<moments<double>*>(partials);
  std::int64_t splits = 1;
  if (channels_last) {
    const auto plan = channels_last_plan<&batch_norm_moments_channels_last_kernel<T, T>>(n * l, c);
    batch_norm_moments_channels_last_kernel<T, T>
        <<<static_cast<unsigned>(plan.blocks()), threads_per_block, 0, stream.native()>>>(
            x, plan, parts, eps, stats);
    splits = plan.splits;
  } else {
    channel_positions where;
    const auto plan = channel_plan<&batch_norm_moments_kernel<T, T>, T>(n, c, l, {x}, where);
    batch_norm_moments_kernel<T, T>
        <<<static_cast<unsigned>(plan.blocks()), threads_per_block, 0, stream.native()>>>(
            channel_load<T, T, 1>{{x}}, where, plan, parts, eps, stats);
    splits = plan.splits;
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
  if (splits == 1) return;  // the moments kernel wrote the statistics
  batch_norm_statistics_kernel<T>
      <<<blocks_for(c, threads_per_block), threads_per_block, 0, stream.native()>>>(
          parts, c, splits, eps, stats);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

/// sum_g[c] = sum of g, sum_gx[c] = sum of g * (x - mean[c]) over n and l, for g, x (and y, or
/// null: g is masked by y > 0 when given) [n, c, l], all contiguous, or all channels_last views
/// when `channels_last` (as batch_norm_statistics), with `partials` device memory of
/// channel_partials_bytes(c). Counts one launch (a second kernel merges when a channel is cut).
template <class T>
void batch_norm_gradient_sums(const T* g, const T* x, const T* y, const T* mean, std::int64_t n,
                              std::int64_t c, std::int64_t l, T* sum_g, T* sum_gx, void* partials,
                              bool channels_last = false,
                              stream_ref stream = tessera::detail::current_cuda_stream()) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "batch_norm_gradient_sums: float or double");
  profiler::count_launch();
  if (c == 0) return;
  auto* parts = static_cast<gradient_partial*>(partials);
  std::int64_t splits = 1;
  if (channels_last) {
    const auto plan =
        channels_last_plan<&batch_norm_gradient_sums_channels_last_kernel<T, T>>(n * l, c);
    batch_norm_gradient_sums_channels_last_kernel<T, T>
        <<<static_cast<unsigned>(plan.blocks()), threads_per_block, 0, stream.native()>>>(
            channel_load<T, T, 3>{{g, x, y}}, mean, plan, parts, sum_g, sum_gx);
    splits = plan.splits;
  } else {
    channel_positions where;
    const auto plan =
        channel_plan<&batch_norm_gradient_sums_kernel<T, T>, T>(n, c, l, {g, x, y}, where);
    batch_norm_gradient_sums_kernel<T, T>
        <<<static_cast<unsigned>(plan.blocks()), threads_per_block, 0, stream.native()>>>(
            channel_load<T, T, 3>{{g, x, y}}, mean, where, plan, parts, sum_g, sum_gx);
    splits = plan.splits;
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
  if (splits == 1) return;  // the sums kernel wrote them
  batch_norm_gradient_finish_kernel<T>
      <<<blocks_for(c, threads_per_block), threads_per_block, 0, stream.native()>>>(
          parts, c, splits, sum_g, sum_gx);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

// ---- the elementwise passes over [N, C, L] with per-channel factors -------------------------
// Batch norm's apply (y = x * scale + shift, ReLU after when asked) and input gradient (dx = g *
// scale - a - (x - mean) * b) as one thread per V consecutive elements of the flat tensor, the
// channel of each V computed with one division (V = 16 bytes of T when L is a multiple of it and
// every pointer is 16-byte aligned: V elements then never cross a channel; else V = 1). The
// generic row kernel placed every operand of the 15-operand expression once per row of L, which
// over ResNet's short planes (L = 49 to 784) cost 3-6x the bytes' time (ncu, 2026-11-27).

/// The channel of flat position i of an [N, C, L] tensor: (i / L) % C, in 32 bits when the
/// positions fit.
struct channel_of_position {
  std::int64_t inner = 1;     // L
  std::int64_t channels = 1;  // C
  bool narrow = true;         // N * C * L < 2^32

  __device__ std::int64_t operator()(std::int64_t i) const {
    if (narrow) {
      const auto row = static_cast<std::uint32_t>(i) / static_cast<std::uint32_t>(inner);
      return static_cast<std::int64_t>(row % static_cast<std::uint32_t>(channels));
    }
    return (i / inner) % channels;
  }
};

template <int V, class T>
__device__ void load_values(const T* p, T (&values)[V]) {
  if constexpr (V == 1) {
    values[0] = *p;
  } else {
    const auto loaded = *reinterpret_cast<const aligned_vector<T, V>*>(p);
#pragma unroll
    for (int k = 0; k < V; ++k) values[k] = loaded.values[k];
  }
}

template <int V, class T>
__device__ void store_values(T* p, const T (&values)[V]) {
  if constexpr (V == 1) {
    *p = values[0];
  } else {
    aligned_vector<T, V> stored;
#pragma unroll
    for (int k = 0; k < V; ++k) stored.values[k] = values[k];
    *reinterpret_cast<aligned_vector<T, V>*>(p) = stored;
  }
}

/// y = x * scale + shift (ReLU after when `relu`): scale = invstd * w, shift = b - mean * scale
/// (without w and b: scale = invstd, shift = -(mean * invstd)); stats [3, C] as
/// batch_norm_statistics writes them.
template <class T>
struct batch_norm_apply_map {
  T* y;
  const T* x;
  const T* mean;
  const T* invstd;
  const T* w;  // null: not affine (b null too)
  const T* b;
  bool relu;

  __device__ void factors(std::int64_t c, T& scale, T& shift) const {
    if (w != nullptr) {
      scale = invstd[c] * w[c];
      shift = b[c] - mean[c] * scale;
    } else {
      scale = invstd[c];
      shift = -(mean[c] * invstd[c]);
    }
  }
  /// V elements from i, of channel c (Step 0: [N, C, L] with L a multiple of V) or of channels
  /// c, c + 1, ... (Step 1: channels_last, [M, C, 1] with C a multiple of V).
  template <int V, int Step>
  __device__ void run(std::int64_t i, std::int64_t c) const {
    T scale[V], shift[V];
    factors(c, scale[0], shift[0]);
#pragma unroll
    for (int k = 1; k < V; ++k) {
      if constexpr (Step == 0) {
        scale[k] = scale[0];
        shift[k] = shift[0];
      } else {
        factors(c + k, scale[k], shift[k]);
      }
    }
    T values[V];
    load_values<V>(x + i, values);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const T v = values[k] * scale[k] + shift[k];
      // torch.relu's NaN: passed on.
      values[k] = relu && !(v > T(0) || v != v) ? T(0) : v;
    }
    store_values<V>(y + i, values);
  }
};

/// dx = g * scale - a - (x - mean) * b (or added to dx), scale = invstd * w (invstd without w),
/// a = scale * sum_g / M, b = scale * invstd^2 * sum_gx / M (M = N * L); with the running
/// statistics (`batch` false) dx = g * scale. g is masked by y > 0 when y is given (ReLU after).
/// dx may be g's buffer (each element is read before it is written, by the same thread).
template <class T>
struct batch_norm_input_gradient_map {
  T* dx;
  const T* g;
  const T* x;
  const T* y;  // null: no ReLU after
  const T* mean;
  const T* invstd;
  const T* w;  // null: not affine
  const T* sum_g;
  const T* sum_gx;
  T inverse_count;
  bool batch;
  bool accumulate;

  /// V elements from i, of channel c (Step 0) or of channels c, c + 1, ... (Step 1), as
  /// batch_norm_apply_map::run.
  template <int V, int Step>
  __device__ void run(std::int64_t i, std::int64_t c) const {
    T scale[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const std::int64_t ck = c + k * Step;
      scale[k] = Step == 0 && k > 0 ? scale[0] : (w != nullptr ? invstd[ck] * w[ck] : invstd[ck]);
    }
    T gv[V];
    load_values<V>(g + i, gv);
    if (y != nullptr) {
      T yv[V];
      load_values<V>(y + i, yv);
#pragma unroll
      for (int k = 0; k < V; ++k) gv[k] = yv[k] > T(0) ? gv[k] : T(0);
    }
    T out[V];
    if (batch) {
      T a[V], b[V], m[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (Step == 0 && k > 0) {
          a[k] = a[0];
          b[k] = b[0];
          m[k] = m[0];
        } else {
          const std::int64_t ck = c + k * Step;
          a[k] = scale[k] * sum_g[ck] * inverse_count;
          b[k] = scale[k] * invstd[ck] * invstd[ck] * sum_gx[ck] * inverse_count;
          m[k] = mean[ck];
        }
      }
      T xv[V];
      load_values<V>(x + i, xv);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = gv[k] * scale[k] - a[k] - (xv[k] - m[k]) * b[k];
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = gv[k] * scale[k];
    }
    if (accumulate) {
      T before[V];
      load_values<V>(dx + i, before);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = before[k] + out[k];
    }
    store_values<V>(dx + i, out);
  }
};

/// map.run<V, Step>(i, channel) for every V consecutive elements of the flat [N, C, L] tensor
/// (n of them in all, a multiple of V), grid-stride: Step 0 when the V elements share a channel
/// (L a multiple of V), 1 when they are V neighbouring channels (L == 1: channels_last, C a
/// multiple of V).
template <int V, int Step, class Map>
__global__ void __launch_bounds__(threads_per_block)
    channel_map_kernel(Map map, std::int64_t n, channel_of_position channel) {
  const std::int64_t vectors = n / V;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       v < vectors; v += stride) {
    const std::int64_t i = v * V;
    map.template run<V, Step>(i, channel(i));
  }
}

/// Launches channel_map_kernel over [n, c, l] with 16-byte steps when the layout allows them
/// (choose_channel_map) and every pointer is aligned. Counts one launch.
template <class T, class Map>
void launch_channel_map(const Map& map, std::int64_t n, std::int64_t c, std::int64_t l,
                        std::initializer_list<const T*> pointers, stream_ref stream) {
  profiler::count_launch();
  const std::int64_t total = n * c * l;
  if (total == 0) return;
  constexpr int V = vector_elements<T>;
  bool aligned = true;
  for (const T* p : pointers) {
    aligned = aligned && (p == nullptr ||
                          reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * V) == 0);
  }
  const channel_of_position channel{l, c, total <= static_cast<std::int64_t>(UINT32_MAX)};
  const unsigned vector_grid = grid_for(total / V * elements_per_thread);
  switch (choose_channel_map(c, l, V, aligned)) {
    case channel_map_form::shared_channel:
      channel_map_kernel<V, 0>
          <<<vector_grid, threads_per_block, 0, stream.native()>>>(map, total, channel);
      break;
    case channel_map_form::neighbouring_channels:
      channel_map_kernel<V, 1>
          <<<vector_grid, threads_per_block, 0, stream.native()>>>(map, total, channel);
      break;
    case channel_map_form::single:
      channel_map_kernel<1, 0>
          <<<grid_for(total), threads_per_block, 0, stream.native()>>>(map, total, channel);
      break;
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

/// y = x * scale + shift per channel, ReLU after when `relu` (batch_norm_apply_map), for
/// contiguous x, y [n, c, l]; stats [3, C] contiguous; w, b [C] or null. Counts one launch.
template <class T>
void batch_norm_apply_channels(const T* x, const T* stats, const T* w, const T* b, bool relu,
                               std::int64_t n, std::int64_t c, std::int64_t l, T* y,
                               stream_ref stream = tessera::detail::current_cuda_stream()) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "batch_norm_apply_channels: float or double");
  const batch_norm_apply_map<T> map{y, x, stats, stats + c, w, b, relu};
  launch_channel_map<T>(map, n, c, l, {x, y}, stream);
}

/// dx (or dx +=, `accumulate`) of batch norm for contiguous g, x, dx (and y when ReLU follows,
/// else null) [n, c, l] (batch_norm_input_gradient_map); stats [3, C]; w [C] or null; sum_g,
/// sum_gx [C] as batch_norm_gradient_sums wrote them (read only when `batch`). Counts one launch.
template <class T>
void batch_norm_input_gradient(const T* g, const T* x, const T* y, const T* stats, const T* w,
                               const T* sum_g, const T* sum_gx, bool batch, bool accumulate,
                               std::int64_t n, std::int64_t c, std::int64_t l, T* dx,
                               stream_ref stream = tessera::detail::current_cuda_stream()) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "batch_norm_input_gradient: float or double");
  const T inverse_count = n * l > 0 ? static_cast<T>(1.0 / static_cast<double>(n * l)) : T(0);
  const batch_norm_input_gradient_map<T> map{dx,    g,     x,           y,     stats,     stats + c,
                                             w,     sum_g, sum_gx,      inverse_count, batch,
                                             accumulate};
  launch_channel_map<T>(map, n, c, l, {g, x, y, dx}, stream);
}

}  // namespace tessera::backend::cuda
#endif
