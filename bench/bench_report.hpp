// Shared reporting for the benchmarks: a console reporter that also records each benchmark's
// real time (the median when repetitions are asked for) and GB/s, and summary lines of
// "baseline time / contender time" ratios with the goals; the benchmarks' seeded random
// data; and the round trip of a cache line between two threads (where a VM's cores are).
#pragma once

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tessera/tensor.hpp"

#if defined(TESSERA_BLAS) && TESSERA_BLAS
#include <cblas.h>
#if defined(_OPENMP)
#include <omp.h>
#endif
#endif

namespace tessera::bench {

#if defined(TESSERA_BLAS) && TESSERA_BLAS
/// OpenBLAS's threads on the calling thread set for a scope (a row of raw sgemm calls), and the
/// thread's own setting put back after it. With OpenBLAS's OpenMP build that setting is the
/// thread's OpenMP count. Putting back another count (the share as it is now) once left
/// Tessera's next products on the thread with the wrong count, when Tessera remembered what it
/// had set instead of reading it (a pipeline stage's GEMMs on two threads beside the other
/// stage's: serialised steps); a build without OpenMP in Tessera still remembers
/// (backend/cpu/gemm.hpp).
class blas_threads_scope {
 public:
  explicit blas_threads_scope(int threads) { openblas_set_num_threads(threads); }
  ~blas_threads_scope() { openblas_set_num_threads(before_); }
  blas_threads_scope(const blas_threads_scope&) = delete;
  blas_threads_scope& operator=(const blas_threads_scope&) = delete;

 private:
  static int current() {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return openblas_get_num_threads();
#endif
  }
  int before_ = current();
};
#endif

// Real time, because the contenders are multi-threaded (CPU time counts the main thread only).
class recording_reporter : public benchmark::ConsoleReporter {
 public:
  // Colours only on a terminal, so that redirected output stays plain text.
  recording_reporter() : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_Defaults : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      // Under the function's name, and for rows with arguments also under "name/args" (the
      // rows of one function then stay apart; the last row is the plain name's).
      const std::string& name = run.run_name.function_name;
      if (!run.run_name.args.empty()) record(run, name + "/" + run.run_name.args);
      record(run, name);
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> results;    // in each run's time unit
  std::map<std::string, double> bandwidth;  // GB/s, for those that report it
  std::map<std::string, std::map<std::string, double>> counters;  // every user counter, by name

 private:
  void record(const Run& run, const std::string& name) {
    const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
    if (median || (run.run_type == Run::RT_Iteration && !medians_.count(name))) {
      results[name] = run.GetAdjustedRealTime();
      if (auto rate = run.counters.find("GB/s"); rate != run.counters.end()) {
        bandwidth[name] = rate->second.value;
      }
      for (const auto& [key, counter] : run.counters) counters[name][key] = counter.value;
      if (median) medians_.insert(name);
    }
  }
  std::set<std::string> medians_;
};

/// One ratio of a summary line: "text = baseline time / contender time", with a goal (a
/// throughput ratio to reach; 0 for none).
struct comparison {
  std::string text;
  std::string contender;
  std::string baseline;
  double goal = 0;
};
struct summary_line {
  std::string label;
  std::vector<comparison> comparisons;
};

inline void print_summary(const std::map<std::string, double>& results, const summary_line& line) {
  std::string text;
  for (const comparison& c : line.comparisons) {
    auto contender = results.find(c.contender);
    auto baseline = results.find(c.baseline);
    if (contender == results.end() || baseline == results.end() || contender->second <= 0) continue;
    const double ratio = baseline->second / contender->second;
    char part[200];
    if (c.goal > 0) {
      std::snprintf(part, sizeof part, "%s = %.2f (goal >= %.2g: %s)", c.text.c_str(), ratio,
                    c.goal, ratio >= c.goal ? "met" : "MISSED");
    } else {
      std::snprintf(part, sizeof part, "%s = %.2f", c.text.c_str(), ratio);
    }
    text += (text.empty() ? "" : "; ") + std::string(part);
  }
  if (!text.empty()) std::printf("%s: %s\n", line.label.c_str(), text.c_str());
}

/// Round trip of one cache line between two threads spinning on it, in ns (median of 3 runs of
/// 100000 round trips). On a VM it tells where the host put the vCPUs: on this project's CI
/// machine about 50 ns when they share a cache, about 320 ns when they do not, and then every
/// parallel speedup measured in the same minutes is lower (bench/RESULTS.md, "What the bimodal
/// step is").
inline double core_round_trip_ns() {
  std::vector<double> runs;
  for (int run = 0; run < 3; ++run) {
    constexpr int trips = 100000;
    alignas(64) std::atomic<int> line{0};
    std::thread other([&line] {
      for (int i = 0; i < trips; ++i) {
        while (line.load(std::memory_order_acquire) != 2 * i + 1) {
        }
        line.store(2 * i + 2, std::memory_order_release);
      }
    });
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < trips; ++i) {
      line.store(2 * i + 1, std::memory_order_release);
      while (line.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    other.join();
    runs.push_back(seconds / trips * 1e9);
  }
  std::sort(runs.begin(), runs.end());
  return runs[1];
}

/// An integer from the environment variable `name`, or `fallback` when it is unset.
inline std::int64_t env_int(const char* name, std::int64_t fallback) {
  const char* env = std::getenv(name);
  return env ? std::atoll(env) : fallback;
}

/// The median of `values` (the mean of the middle two for an even count; 0 when empty).
inline double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// Prints core_round_trip_ns() with `when` (e.g. "before the rows").
inline void print_core_round_trip(const char* when) {
  std::printf("inter-core round trip %s: %.0f ns (a cache line between two threads)\n", when,
              core_round_trip_ns());
  std::fflush(stdout);
}

/// A float tensor of `shape` with values uniform in [-1, 1) from std::mt19937(seed): the same
/// data in every run and for every contender.
inline Tensor<float> random_tensor(const Shape& shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> values(static_cast<std::size_t>(shape.numel()));
  for (auto& v : values) v = dist(rng);
  return from_vector<float>(values, shape);
}

}  // namespace tessera::bench
