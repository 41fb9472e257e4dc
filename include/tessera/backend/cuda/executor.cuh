// The CUDA executor: one kernel per assignment. When the output and every operand are contiguous
// with the output's shape (or laid out alike in another dense order: channels_last tensors) and
// aligned, a grid-stride loop in which each thread moves 16 bytes of output per step with vector
// loads and stores; every other case walks the merged layout's rows (dimensions in the output's
// memory order; the row is the last): a group of lanes per row places each operand once per row,
// then moves 16 bytes per load where the output and the operands step by 1 (or 0, broadcast)
// along the row, else one element at a time (row_reduction_plan sizes the groups). The evaluator
// is passed by value, so its size is checked against the kernel-parameter limit.
// Included only by nvcc-compiled units.
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA_KERNELS
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/backend/cuda/elementwise_plan.hpp"
#include "tessera/backend/cuda/reduce_plan.hpp"
#include "tessera/backend/evaluator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/stream.hpp"

namespace tessera::backend::cuda {

/// The kernels a launch chooses among. fastest: each layout's own (the vector kernel for a dense
/// run, the rows kernel for the rest; a full reduction of strided operands merges its rows'
/// partials in a second kernel): what a unit's fused expressions and the library's layers
/// compile. fewest: one kernel that covers every layout (the rows kernel; a full reduction only
/// of operands that make one dense run): copies within one dtype (one per
/// element size) and the reductions and softmax of the library's primitives, the hundreds of
/// (functor, dtype) kernels that g++ units evaluate CUDA expressions with, one operation at a time
/// (expr/detail/op_by_op.hpp), where a second kernel per layout doubled their build for a path
/// that is not the fast one anyway. compact (elementwise only): the vector kernel for a dense run,
/// else the rows kernel one element at a time (no 16-byte path and no batch of loads: a quarter of
/// the full rows kernel's code): conversions between dtypes and fills, whose strided forms are
/// rare (a transposed half tensor converted to float, a fill of a slice), and the primitives'
/// elementwise operations (whole tensors, mostly); with the full rows kernel they were a fifth of
/// the library's main unit's PTX and two thirds of the primitives'.
enum class kernel_choice { fastest, fewest, compact };

/// Elements per thread a grid is sized for (each thread then has several loads in flight).
inline constexpr int elements_per_thread = 4;
inline constexpr int threads_per_block = 256;

/// Elements per 16-byte access of the output type (at least 1, at most 8).
template <class T>
inline constexpr int vector_elements = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));

/// Stores V values of T at `to` (global memory, aligned to their 16 bytes) as one 16-byte store
/// (st.global.v4, through CUDA's __stwb: the default caching). An aligned_vector or a uint4
/// stored as itself is split into its members, and LLVM's load/store vectoriser, which should
/// merge them again, gives up where the pointer comes from a loop's induction variable: the rows
/// kernel's batch became four st.global.f32 per vector when its scalar path became a rolled loop.
template <class T, int V>
__device__ void store_vector(T* to, const aligned_vector<T, V>& values) {
  if constexpr (sizeof(values) == sizeof(uint4)) {
    uint4 bits;
    memcpy(&bits, &values, sizeof(bits));
    __stwb(reinterpret_cast<uint4*>(to), bits);
  } else {
    *reinterpret_cast<aligned_vector<T, V>*>(to) = values;
  }
}

/// The contiguous path with 16-byte vector loads and stores: each thread handles V consecutive
/// elements per step (the output and every operand are aligned to V elements; checked on the host).
template <int V, class T, class Evaluator>
__global__ void __launch_bounds__(threads_per_block)
    vector_kernel(T* out, Evaluator evaluator, std::int64_t n) {
  using result_type = typename Evaluator::result_type;
  const std::int64_t vectors = n / V;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       v < vectors; v += stride) {
    result_type values[V];
    evaluator.get_vector(vector_access<V>{v * V}, values);
    aligned_vector<T, V> stored;
#pragma unroll
    for (int k = 0; k < V; ++k) stored.values[k] = store_cast<T>(values[k]);
    *reinterpret_cast<aligned_vector<T, V>*>(out + v * V) = stored;
  }
  // The tail (fewer than V elements) by the first threads.
  const std::int64_t tail = vectors * V + static_cast<std::int64_t>(blockIdx.x) * blockDim.x +
                            threadIdx.x;
  if (tail < n) out[tail] = store_cast<T>(evaluator.get(linear_access{tail}));
}

/// Any other layout, a row at a time: the merged layout's last dimension is the row; a group of
/// plan.group lanes writes one row (or one slice of it), after placing every operand at the row's
/// start once (bind_row: the divisions are per row, not per element). With plan.vector == V the
/// output and every operand step by 1 along the row (an operand broadcast along it, by 0) and
/// are aligned, and each lane moves V elements per load and store; else one element at a time.
template <int V, class T, class Evaluator>
__global__ void __launch_bounds__(threads_per_block)
    rows_kernel(T* out, Evaluator evaluator, strided_layout_args layout, row_reduction_plan plan) {
  const int lane = static_cast<int>(threadIdx.x) % plan.group;
  const int kept_rank = layout.rank - 1;
  const std::int64_t out_step = kept_rank >= 0 ? layout.out_strides[kept_rank] : 0;
  const std::int64_t tiles = plan.tiles();
  for (std::int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::int64_t split = tile % plan.splits;
    const std::int64_t row =
        tile / plan.splits * plan.rows_per_block + static_cast<int>(threadIdx.x) / plan.group;
    if (row >= plan.outputs) continue;
    std::int64_t index[max_dims] = {};
    std::int64_t out_offset = 0;
    std::int64_t rest = row;
#pragma unroll 1
    for (int d = kept_rank - 1; d >= 0; --d) {
      index[d] = rest % layout.sizes[d];
      rest /= layout.sizes[d];
      out_offset += index[d] * layout.out_strides[d];
    }
    Evaluator placed = evaluator;
    placed.bind_row(index);
    T* out_row = out + out_offset;
    auto scalar = [&](std::int64_t p) {
      out_row[p * out_step] = store_cast<T>(placed.get(row_access{p}));
    };
    if (V > 1 && plan.vector == V) {
      auto one = [&](std::int64_t p) {
        typename Evaluator::result_type values[V];
        placed.get_vector(row_vector_access<V>{p}, values);
        aligned_vector<T, V> stored;
#pragma unroll
        for (int k = 0; k < V; ++k) stored.values[k] = store_cast<T>(values[k]);
        store_vector(out_row + p, stored);
      };
      plan.walk(
          split, lane,
          [&](std::int64_t p, std::int64_t step) {
            constexpr int loads = reduce_batch_values / V;
            typename Evaluator::result_type values[loads][V];
#pragma unroll
            for (int k = 0; k < loads; ++k) placed.get_vector(row_vector_access<V>{p + k * step}, values[k]);
#pragma unroll
            for (int k = 0; k < loads; ++k) {
              aligned_vector<T, V> stored;
#pragma unroll
              for (int j = 0; j < V; ++j) stored.values[j] = store_cast<T>(values[k][j]);
              store_vector(out_row + p + k * step, stored);
            }
          },
          one, scalar);
    } else {
      // One element at a time, the positions plan.walk gives a lane with vector 1, in one rolled
      // loop. Each element's store may alias the next element's loads (nothing tells the
      // compiler otherwise), so its loads cannot start before that store is issued: copies of the
      // loop body (cicc unrolls a loop of constant count 16 fully) keep no more loads in flight
      // and only multiply the kernel's code (15 more copies of the expression per kernel; PTX
      // checked on the add of two float tensors: ld, ld, st, 16 times in order).
      const std::int64_t end = plan.last(split);
#pragma unroll 1
      for (std::int64_t p = plan.first(split) + lane; p < end; p += plan.group) scalar(p);
    }
  }
}

/// Streaming multiprocessors of the current device (cached per device).
inline int multiprocessor_count() {
  static std::mutex mutex;
  static std::vector<int> counts;
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (counts.size() <= static_cast<std::size_t>(device)) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device));
  }
  return counts[device];
}

/// Threads of `kernel` (a __global__ function, launched with threads_per_block threads and no
/// dynamic shared memory) the current device keeps resident at once: its SMs times the blocks of
/// the kernel each SM holds for the kernel's registers and shared memory
/// (cudaOccupancyMaxActiveBlocksPerMultiprocessor), cached in `cached` (one slot per device, 0:
/// not asked yet) without a lock (it is asked at every launch). The reduction plans size their
/// grids by it, so that a reduction cut into slices is one wave of blocks (SMs * 2048 assumed 8
/// blocks an SM where the kernels' 60-96 registers a thread leave 2-4). Out of line: one body for
/// every kernel (resident_threads_of below keeps only the cache per kernel).
inline constexpr int resident_cached_devices = 64;
[[gnu::noinline]] inline std::int64_t resident_threads(const void* kernel,
                                                       std::atomic<std::int64_t>* cached) {
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  const bool caches = device >= 0 && device < resident_cached_devices;
  if (caches) {
    if (const std::int64_t threads = cached[device].load(std::memory_order_relaxed); threads > 0) {
      return threads;
    }
  }
  int blocks = 0;
  const cudaError_t status =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads_per_block, 0);
  if (status != cudaSuccess) {
    // Cleared, so that the next launch's check does not report it against a kernel that ran.
    (void)cudaGetLastError();
    TESSERA_CUDA_CHECK(status);
  }
  const std::int64_t threads =
      static_cast<std::int64_t>(multiprocessor_count()) * std::max(blocks, 1) * threads_per_block;
  if (caches) cached[device].store(threads, std::memory_order_relaxed);
  return threads;
}

/// resident_threads for `Kernel`, with its own cache.
template <auto Kernel>
std::int64_t resident_threads_of() {
  static std::atomic<std::int64_t> cached[resident_cached_devices];
  return resident_threads(reinterpret_cast<const void*>(Kernel), cached);
}

inline unsigned grid_for(std::int64_t n) {
  // Enough blocks to fill every SM several times over; the grid-stride loop covers the rest.
  const std::int64_t wanted = (n + threads_per_block * elements_per_thread - 1) /
                              (threads_per_block * elements_per_thread);
  const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count()) * 8;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(wanted, cap)));
}

/// The vector path over n dense elements (the output and every operand step by 1 in one
/// order); false when the pointers are not aligned to whole vectors (the caller takes the rows
/// kernel then).
template <class T, class Evaluator>
bool execute_dense(T* out, const Evaluator& evaluator, std::int64_t n, stream_ref stream) {
  constexpr int V = vector_elements<T>;
  const bool vectorisable = V > 1 && n >= V &&
                            reinterpret_cast<std::uintptr_t>(out) % (sizeof(T) * V) == 0 &&
                            evaluator.is_aligned(V);
  if (!vectorisable) return false;
  vector_kernel<V>
      <<<grid_for(n / V * elements_per_thread), threads_per_block, 0, stream.native()>>>(
          out, evaluator, n);
  TESSERA_CUDA_CHECK(cudaGetLastError());
  return true;
}

/// CUDA twin of backend::cpu::execute, on the current device and `stream`. Counts one launch.
/// One evaluator over the merged layout (merge_elementwise): a dense run takes the vector path
/// when aligned (kernel_choice::fastest); everything else, and a dense run that is not, takes
/// the rows kernel over the same evaluator (a run of unit stride reads the same elements through
/// linear and vector access as through rows, 16 bytes at a time when aligned).
template <kernel_choice Choice = kernel_choice::fastest, class T, std::size_t L,
          class MakeEvaluator>
void execute(T* out, const Strides& out_strides, const Shape& shape,
             const std::array<Strides, L>& leaf_strides, MakeEvaluator&& make_evaluator,
             stream_ref stream = tessera::detail::current_cuda_stream()) {
  profiler::count_launch();
  const std::int64_t n = shape.numel();
  if (n == 0) return;
  std::array<Strides, L + 1> strides;
  strides[0] = out_strides;
  std::copy(leaf_strides.begin(), leaf_strides.end(), strides.begin() + 1);
  const elementwise_layout layout = merge_elementwise(shape, strides.data(), L + 1);
  auto evaluator = make_evaluator(strides.data() + 1, layout.args.rank);
  static_assert(sizeof(evaluator) <= 4096,
                "Tessera: this expression is too large to pass to one CUDA kernel (over 4 KiB "
                "of parameters); split the statement into two assignments");
  if constexpr (Choice != kernel_choice::fewest) {
    if (layout.dense && execute_dense(out, evaluator, n, stream)) return;
  }
  constexpr int V = Choice == kernel_choice::compact ? 1 : vector_elements<T>;
  const bool vectorisable = V > 1 && layout.rows_allow_vector(V) &&
                            reinterpret_cast<std::uintptr_t>(out) % (sizeof(T) * V) == 0 &&
                            evaluator.is_row_aligned(V);
  const rows_launch launch = plan_rows(
      layout.args, n, vectorisable ? V : 1, threads_per_block,
      resident_threads_of<&rows_kernel<V, T, decltype(evaluator)>>(), multiprocessor_count());
  rows_kernel<V><<<launch.grid, threads_per_block, 0, stream.native()>>>(out, evaluator,
                                                                         layout.args, launch.plan);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tessera::backend::cuda
#endif
