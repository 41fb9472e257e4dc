// Threads for CPU work: parallel_for splits an index range over OpenMP threads. Each virtual CPU
// device gets its share of the cores by default (cores / TESSERA_CPU_DEVICES), settable with
// tessera::cpu::set_num_threads. Without OpenMP (no -fopenmp) everything runs on the caller.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

#include "tessera/core/device.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace tessera {

namespace backend::cpu {

/// Calls fn(first, last) on disjoint sub-ranges covering [begin, end), in parallel when the range
/// holds at least two grains of work. Each call gets a contiguous range, so per-thread partial
/// results come out in index order. Exceptions thrown by fn are rethrown on the caller (the first
/// one). Nested calls run serially inside the outer thread.
template <class Fn>
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, Fn&& fn) {
  const std::int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t max_threads = std::min<std::int64_t>(tessera::cpu::num_threads(), n / grain);
#if defined(_OPENMP)
  if (max_threads > 1 && !omp_in_parallel()) {
    std::exception_ptr failure;
    std::atomic<bool> failed{false};
#pragma omp parallel num_threads(static_cast<int>(max_threads))
    {
      const std::int64_t threads = omp_get_num_threads();
      const std::int64_t thread = omp_get_thread_num();
      const std::int64_t first = begin + n * thread / threads;
      const std::int64_t last = begin + n * (thread + 1) / threads;
      try {
        if (first < last) fn(first, last);
      } catch (...) {
        if (!failed.exchange(true)) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    return;
  }
#else
  (void)max_threads;
#endif
  fn(begin, end);
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
