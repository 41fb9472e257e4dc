// Shared reporting for the benchmarks: a console reporter that also records each benchmark's
// real time (the median when repetitions are asked for) and GB/s, and summary lines of
// "baseline time / contender time" ratios with the goals; and the benchmarks' seeded
// random data.
#pragma once

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::bench {

// Real time, because the contenders are multi-threaded (CPU time counts the main thread only).
class recording_reporter : public benchmark::ConsoleReporter {
 public:
  // Colours only on a terminal, so that redirected output stays plain text.
  recording_reporter() : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_Defaults : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const std::string name = run.run_name.function_name;
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
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> results;    // in each run's time unit
  std::map<std::string, double> bandwidth;  // GB/s, for those that report it
  std::map<std::string, std::map<std::string, double>> counters;  // every user counter, by name

 private:
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
