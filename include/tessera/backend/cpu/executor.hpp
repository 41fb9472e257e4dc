// The CPU executor: runs one evaluator over an output in one pass (one "launch"), threaded with
// execute_loop (on the thread pool, as parallel_for), the loop other CPU work runs on too. When the
// output and every operand are contiguous with the output's shape it loops over a linear index
// the compiler can vectorise; otherwise it merges dimensions (strided_layout) and walks rows: one
// dot product per row to place each operand, then a strided inner loop.
// Compute-bound expressions (exp, tanh, sigmoid) get their linear loop built twice on x86-64,
// for SSE2 and for AVX2, picked at load time by the CPU (GCC's target_clones).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "tessera/backend/cpu/strided_loop.hpp"
#include "tessera/backend/cpu/thread_pool.hpp"
#include "tessera/backend/evaluator.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/shape.hpp"

namespace tessera::backend::cpu {

/// True when `strides` lay `shape` out row-major without gaps (extent-1 dimensions may have any
/// stride; a shape with no elements is row-major whatever its strides, as PyTorch's contiguity):
/// the condition for walking an operand with a linear index.
inline bool is_row_major(const Shape& shape, const Strides& strides) {
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return true;
  }
  std::int64_t expected = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

/// Elements per task: below this a loop runs on one thread (thread start-up costs about as much).
inline constexpr std::int64_t grain_size = 32768;

/// Calls fn(first, last) on disjoint contiguous sub-ranges covering [begin, end), on the CPU
/// device's threads when the range holds at least two grains of `grain` items (nested calls run
/// on the caller's thread). The executor's one way to run a loop: execute() runs its passes with
/// it, and code above the backend that is not an expression (convolution's im2col and col2im,
/// Winograd's transforms) runs its loops with it rather than with the thread pool. Counts no
/// launch. The first exception fn throws is rethrown here.
// On the pool's run_chunks as parallel_for is, rather than a call to parallel_for: a call level
// more moves GCC's inlining decisions in the code around every loop; this way each loop compiles
// as it did through parallel_for.
template <class Fn>
void execute_loop(std::int64_t begin, std::int64_t end, std::int64_t grain, Fn&& fn) {
  const std::int64_t n = end - begin;
  if (n <= 0) return;
  auto body = [&fn](std::int64_t, std::int64_t first, std::int64_t last) { fn(first, last); };
  detail::run_chunks(begin, end, detail::planned_chunks(n, grain), body);
}

/// True when an evaluator type holds an operation marked `static constexpr bool compute_bound`
/// (backend/functors.hpp marks exp, tanh and sigmoid): a template argument, at any depth.
template <class T>
concept marked_compute_bound = requires {
  requires T::compute_bound;
};
template <class T>
struct is_compute_bound : std::bool_constant<marked_compute_bound<T>> {};
template <template <class...> class Template, class... Arguments>
struct is_compute_bound<Template<Arguments...>>
    : std::bool_constant<(is_compute_bound<Arguments>::value || ...)> {};

/// The contiguous loop: out[i] = evaluator at i for i in [first, last). Vectorised by the
/// compiler (-O3, or -O2 -ftree-vectorize -fvect-cost-model=dynamic).
template <class T, class Evaluator>
void linear_loop(T* out, const Evaluator evaluator, std::int64_t first, std::int64_t last) {
  for (std::int64_t i = first; i < last; ++i) {
    out[i] = store_cast<T>(evaluator.get(linear_access{i}));
  }
}

// The same loop built three times, for AVX-512, AVX2 and the baseline (SSE2), the CPU picking
// one when the program loads (GCC's target_clones): sigmoid(a*b + c) * tanh(d) takes 4.5, 2.1
// and 1.2 ns per element on one core of the CI machine (AMD EPYC, Zen 4). Without FMA contraction
// (fp-contract=off; AVX-512 would allow it), so all clones round alike and results do not depend on
// the machine. GCC only (the form checked with GCC 12), not under nvcc, and off with
// -DTESSERA_NO_TARGET_CLONES. Off under ThreadSanitizer too: a clone's ifunc resolver runs while
// the dynamic loader relocates the program, before the TSan runtime exists, and its instrumented
// entry crashes there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    !defined(TESSERA_NO_TARGET_CLONES) && !defined(__SANITIZE_THREAD__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define TESSERA_CPU_TARGET_CLONES 1
#endif
#endif
#ifndef TESSERA_CPU_TARGET_CLONES
#define TESSERA_CPU_TARGET_CLONES 0
#endif
#if TESSERA_CPU_TARGET_CLONES
template <class T, class Evaluator>
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off"))) void
linear_loop_cloned(T* out, const Evaluator evaluator, std::int64_t first, std::int64_t last) {
  for (std::int64_t i = first; i < last; ++i) {
    out[i] = store_cast<T>(evaluator.get(linear_access{i}));
  }
}
#endif

/// The index over the outer dimensions of row `row` of `shape` (the last dimension's stays 0).
inline void first_row_index(const Shape& shape, std::int64_t row, std::int64_t* index) {
  for (int d = shape.size() - 2; d >= 0; --d) {
    index[d] = row % shape[d];
    row /= shape[d];
  }
}

/// Moves `index` to the next row: an odometer over the outer dimensions.
inline void next_row_index(const Shape& shape, std::int64_t* index) {
  for (int d = shape.size() - 2; d >= 0; --d) {
    if (++index[d] < shape[d]) return;
    index[d] = 0;
  }
}

/// The offset of the row at `index` for `strides`.
inline std::int64_t row_offset(const Strides& strides, int rank, const std::int64_t* index) {
  std::int64_t offset = 0;
  for (int d = 0; d + 1 < rank; ++d) offset += index[d] * strides[d];
  return offset;
}

/// Elements per block of the unit-stride path: a broadcast leaf's copies fill one block.
inline constexpr std::int64_t unit_block = backend::unit_splats::slot_bytes / 8;

/// The strided path's rows when the output and every operand step by 1 or 0 along them (a
/// channel's scale and shift over an NCHW tensor, a bias over rows): each row in blocks whose
/// operands all read element i at row[i] (broadcast ones from copies of their value), a loop
/// the compiler vectorises as the contiguous one. The general row loop indexes each operand by
/// a stride known only at run time and stays scalar.
template <class T, int N, class Evaluator>
void execute_unit_rows(T* out, const strided_layout<N>& layout, std::int64_t rows,
                       const Evaluator& prototype) {
  const int rank = layout.shape.size();
  const std::int64_t inner = layout.shape[rank - 1];
  execute_loop(0, rows, std::max<std::int64_t>(1, grain_size / inner),
               [&](std::int64_t first_row, std::int64_t last_row) {
                 auto evaluator = prototype;
                 alignas(64) unsigned char storage[N * backend::unit_splats::slot_bytes];
                 std::int64_t index[max_dims] = {};
                 first_row_index(layout.shape, first_row, index);
                 for (std::int64_t row = first_row; row < last_row; ++row) {
                   const std::int64_t out_offset = row_offset(layout.strides[0], rank, index);
                   backend::unit_splats splats{storage, std::min(inner, unit_block)};
                   evaluator.bind_unit_row(index, splats);
                   T* out_row = out + out_offset;
                   for (std::int64_t start = 0; start < inner; start += unit_block) {
                     const std::int64_t count = std::min(unit_block, inner - start);
                     T* block = out_row + start;
                     for (std::int64_t i = 0; i < count; ++i) {
                       block[i] = store_cast<T>(evaluator.get(backend::unit_access{i}));
                     }
                     evaluator.advance_unit(unit_block);
                   }
                   next_row_index(layout.shape, index);
                 }
               });
}

/// out[index] = store_cast<T>(evaluator.get(index)) for every index of `shape`.
/// `leaf_strides` holds each operand's strides already expanded to `shape` (0 where broadcast),
/// in the order the factory consumes them; make_evaluator(strides, rank) builds the evaluator
/// for the (possibly merged) layout it is given. Counts one launch.
template <class T, std::size_t L, class MakeEvaluator>
void execute(T* out, const Strides& out_strides, const Shape& shape,
             const std::array<Strides, L>& leaf_strides, MakeEvaluator&& make_evaluator) {
  profiler::count_launch();
  const std::int64_t n = shape.numel();
  if (n == 0) return;

  bool linear = is_row_major(shape, out_strides);
  for (const Strides& strides : leaf_strides) linear = linear && is_row_major(shape, strides);
  if (linear) {
    const auto evaluator = make_evaluator(leaf_strides.data(), shape.size());
    execute_loop(0, n, grain_size, [&](std::int64_t first, std::int64_t last) {
#if TESSERA_CPU_TARGET_CLONES
      if constexpr (is_compute_bound<std::remove_cvref_t<decltype(evaluator)>>::value) {
        linear_loop_cloned(out, evaluator, first, last);
      } else {
        linear_loop(out, evaluator, first, last);
      }
#else
      linear_loop(out, evaluator, first, last);
#endif
    });
    return;
  }

  std::array<Strides, L + 1> all;
  all[0] = out_strides;
  std::copy(leaf_strides.begin(), leaf_strides.end(), all.begin() + 1);
  const strided_layout<static_cast<int>(L + 1)> layout(shape, all);
  const int rank = layout.shape.size();
  if (rank == 0) {  // a single element behind unusual strides
    const auto evaluator = make_evaluator(layout.strides.data() + 1, 0);
    out[0] = store_cast<T>(evaluator.get(index_access{nullptr}));
    return;
  }
  const std::int64_t inner = layout.shape[rank - 1];
  const std::int64_t rows = n / inner;
  const std::int64_t out_inner = layout.strides[0][rank - 1];
  const auto prototype = make_evaluator(layout.strides.data() + 1, rank);
  bool unit = out_inner == 1 && inner >= unit_block / 8;
  for (std::size_t k = 1; k <= L; ++k) {
    const std::int64_t stride = layout.strides[k][rank - 1];
    unit = unit && (stride == 0 || stride == 1);
  }
  if (unit) {
    execute_unit_rows(out, layout, rows, prototype);
    return;
  }
  execute_loop(0, rows, std::max<std::int64_t>(1, grain_size / inner),
               [&](std::int64_t first_row, std::int64_t last_row) {
                 auto evaluator = prototype;
                 std::int64_t index[max_dims] = {};
                 first_row_index(layout.shape, first_row, index);
                 for (std::int64_t row = first_row; row < last_row; ++row) {
                   const std::int64_t out_offset = row_offset(layout.strides[0], rank, index);
                   evaluator.bind_row(index);
                   T* out_row = out + out_offset;
                   for (std::int64_t i = 0; i < inner; ++i) {
                     out_row[i * out_inner] = store_cast<T>(evaluator.get(row_access{i}));
                   }
                   next_row_index(layout.shape, index);
                 }
               });
}

}  // namespace tessera::backend::cpu
