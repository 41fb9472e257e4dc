// Threads for CPU work: parallel_for splits an index range over OpenMP threads. A thread driving a
// device alone uses every core; devices that Tessera's runtime drives at once share them
// (tessera::cpu::num_threads; set_num_threads per process or per device). Each driving thread has
// its own OpenMP team. Without OpenMP (no -fopenmp) everything runs on the caller.
// One out-of-line function (detail::run_chunks) holds the OpenMP region for every caller; a loop
// body reaches it through a function pointer, so each body is compiled once, not once inside the
// region and again for the serial path.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <type_traits>

#include "tessera/core/device.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

// Kept out of line and not cloned per constant argument (GCC's IPA-CP would otherwise make a copy
// of the OpenMP region for each body at -O3, which is what the function pointer is there to avoid).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define TESSERA_CPU_OUT_OF_LINE __attribute__((noinline, noclone))
#else
#define TESSERA_CPU_OUT_OF_LINE __attribute__((noinline))
#endif

namespace tessera {

namespace backend::cpu {

namespace detail {

/// body(context, chunk, first, last): one chunk of a range, type-erased.
using chunk_body = void (*)(void* context, std::int64_t chunk, std::int64_t first,
                            std::int64_t last);

/// Chunks for n items of `grain`: one per thread while each gets a grain, 1 for a serial run
/// (too little work, or already inside a parallel region: nested calls run on their thread).
inline std::int64_t planned_chunks(std::int64_t n, std::int64_t grain) {
#if defined(_OPENMP)
  const std::int64_t chunks =
      std::min<std::int64_t>(tessera::cpu::num_threads(), n / std::max<std::int64_t>(grain, 1));
  return chunks > 1 && !omp_in_parallel() ? chunks : 1;
#else
  (void)n;
  (void)grain;
  return 1;
#endif
}

/// Calls body on chunk c = 0 .. chunks-1, the range [begin + n*c/chunks, begin + n*(c+1)/chunks)
/// (empty chunks skipped), chunks on OpenMP threads when there is more than one. The ranges
/// depend only on `chunks`, not on how many threads OpenMP grants. The first exception thrown is
/// rethrown on the caller.
TESSERA_CPU_OUT_OF_LINE inline void run_chunks(std::int64_t begin, std::int64_t end,
                                               std::int64_t chunks, chunk_body body,
                                               void* context) {
  const std::int64_t n = end - begin;
  if (n <= 0) return;
  chunks = std::clamp<std::int64_t>(chunks, 1, n);
#if defined(_OPENMP)
  if (chunks > 1) {
    std::exception_ptr failure;
    std::atomic<bool> failed{false};
#pragma omp parallel num_threads(static_cast<int>(chunks))
    {
      const std::int64_t threads = omp_get_num_threads();
      for (std::int64_t chunk = omp_get_thread_num(); chunk < chunks; chunk += threads) {
        const std::int64_t first = begin + n * chunk / chunks;
        const std::int64_t last = begin + n * (chunk + 1) / chunks;
        try {
          if (first < last) body(context, chunk, first, last);
        } catch (...) {
          if (!failed.exchange(true)) failure = std::current_exception();
        }
      }
    }
    if (failure) std::rethrow_exception(failure);
    return;
  }
#endif
  body(context, 0, begin, end);
}

/// fn(chunk, first, last) through run_chunks.
template <class Fn>
void run_chunks(std::int64_t begin, std::int64_t end, std::int64_t chunks, Fn& fn) {
  run_chunks(
      begin, end, chunks,
      [](void* context, std::int64_t chunk, std::int64_t first, std::int64_t last) {
        (*static_cast<Fn*>(context))(chunk, first, last);
      },
      const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
}

}  // namespace detail

/// Calls fn(first, last) on disjoint sub-ranges covering [begin, end), in parallel when the range
/// holds at least two grains of work. Each call gets a contiguous range, so per-thread partial
/// results come out in index order. Exceptions thrown by fn are rethrown on the caller (the first
/// one). Nested calls run serially inside the outer thread.
template <class Fn>
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, Fn&& fn) {
  const std::int64_t n = end - begin;
  if (n <= 0) return;
  auto body = [&fn](std::int64_t, std::int64_t first, std::int64_t last) { fn(first, last); };
  detail::run_chunks(begin, end, detail::planned_chunks(n, grain), body);
}

/// Number of chunks parallel_for would use for n items of `grain` (1 when it would run serially).
inline std::int64_t parallel_chunks(std::int64_t n, std::int64_t grain) {
#if defined(_OPENMP)
  return std::max<std::int64_t>(
      1, std::min<std::int64_t>(tessera::cpu::num_threads(), n / std::max<std::int64_t>(grain, 1)));
#else
  (void)n;
  (void)grain;
  return 1;
#endif
}

}  // namespace backend::cpu
}  // namespace tessera
