// Memory statistics with PyTorch's meaning (torch.cuda.memory_stats) and the summary table
// (torch.cuda.memory_summary). The pool keeps them because "allocated" means rounded block sizes,
// which only the pool knows; memory::stats(d) and memory::summary(d) read them per device.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>

#include "tessera/core/device.hpp"

namespace tessera::memory {

/// One statistic: its current value, the peak of current since the last reset_peak, and the
/// running totals of increases (`allocated`) and decreases (`freed`), so that
/// current == allocated - freed until reset_accumulated.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t amount) noexcept {
    current += amount;
    allocated += amount;
    peak = std::max(peak, current);
  }
  void decrease(std::int64_t amount) noexcept {
    current -= amount;
    freed += amount;
  }
  void reset_peak() noexcept { peak = current; }
  void reset_accumulated() noexcept {
    allocated = 0;
    freed = 0;
  }
  friend bool operator==(const Stat&, const Stat&) = default;
};

/// The statistics of one pool of blocks (PyTorch's "all", "small_pool" or "large_pool" entries).
/// Byte counts are in bytes; the others count blocks or segments.
struct PoolStats {
  Stat allocated_bytes;       ///< rounded sizes of the blocks handed out and not yet freed
  Stat reserved_bytes;        ///< bytes held from the upstream (segments)
  Stat active_bytes;          ///< allocated, plus freed blocks still waiting for stream events
  Stat inactive_split_bytes;  ///< free bytes in segments that also hold an active block
  Stat requested_bytes;       ///< the sizes callers asked for, before rounding
  Stat allocations;           ///< blocks handed out and not yet freed
  Stat segments;              ///< segments held from the upstream
  Stat active;                ///< active blocks (allocations plus blocks waiting for events)
  Stat inactive_split;        ///< free blocks in segments that also hold an active block

  template <class Function>
  void for_each(Function&& function) {
    for (Stat* stat : {&allocated_bytes, &reserved_bytes, &active_bytes, &inactive_split_bytes,
                       &requested_bytes, &allocations, &segments, &active, &inactive_split}) {
      function(*stat);
    }
  }
  friend bool operator==(const PoolStats&, const PoolStats&) = default;
};

/// All statistics of a device's pool: the fields of PoolStats for all blocks, the same for the
/// small pool (requests up to 1 MiB) and the large pool, and the event counters.
struct MemoryStats : PoolStats {
  PoolStats small_pool;
  PoolStats large_pool;
  std::int64_t num_ooms = 0;           ///< out_of_memory_error thrown
  std::int64_t num_alloc_retries = 0;  ///< upstream allocations retried after releasing the cache
  std::int64_t num_device_alloc = 0;   ///< segments obtained from the upstream
  std::int64_t num_device_free = 0;    ///< segments returned to the upstream

  /// peak = current for every statistic (PyTorch reset_peak_memory_stats).
  void reset_peak() noexcept {
    for (PoolStats* pool : pools()) pool->for_each([](Stat& stat) { stat.reset_peak(); });
  }
  /// Zeroes the running totals and the event counters (PyTorch reset_accumulated_memory_stats).
  void reset_accumulated() noexcept {
    for (PoolStats* pool : pools()) pool->for_each([](Stat& stat) { stat.reset_accumulated(); });
    num_ooms = num_alloc_retries = num_device_alloc = num_device_free = 0;
  }
  friend bool operator==(const MemoryStats&, const MemoryStats&) = default;

 private:
  std::array<PoolStats*, 3> pools() noexcept {
    return {static_cast<PoolStats*>(this), &small_pool, &large_pool};
  }
};

namespace detail {
// PyTorch's _format_size: the unit is chosen from the "all" row (`reference`) so a column's
// sub-rows read in the same unit; a unit is moved up while the reference is >= 768 of them.
inline std::string summary_size(std::int64_t value, std::int64_t reference) {
  static constexpr const char* units[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  double scaled_reference = static_cast<double>(reference);
  while (unit < 5 && scaled_reference >= 768.0 * 1024.0) {
    value /= 1024;
    scaled_reference /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%6lld %s", static_cast<long long>(value), units[unit]);
  return text;
}

// PyTorch's _format_count: "", K, M, moving up at 750,000 of the reference.
inline std::string summary_count(std::int64_t value, std::int64_t reference) {
  static constexpr const char* units[] = {" ", "K", "M"};
  int unit = 0;
  double scaled_reference = static_cast<double>(reference);
  while (unit < 2 && scaled_reference >= 750.0 * 1000.0) {
    value /= 1000;
    scaled_reference /= 1000.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%7lld %s ", static_cast<long long>(value), units[unit]);
  return text;
}

inline std::string summary_line(std::string text) {
  constexpr std::size_t width = 75;  // PyTorch's box
  if (text.size() < width) text.append(width - text.size(), ' ');
  return "|" + text + "|\n";
}
}  // namespace detail

/// The statistics as a table in the layout of torch.cuda.memory_summary(): a title naming the
/// device, the OOM and retry counts, then for each metric the current, peak, total allocated and
/// total freed values, for all blocks and from the large and small pools.
inline std::string format_summary(const MemoryStats& stats, Device device) {
  const std::string rule(75, '-');
  const std::string double_rule(75, '=');
  std::string out;
  out += "|" + double_rule + "|\n";
  std::string title = "Tessera memory summary, device " + device.str();
  out += detail::summary_line(std::string((75 - std::min<std::size_t>(title.size(), 75)) / 2, ' ') +
                              title);
  out += "|" + rule + "|\n";
  char counts[128];
  std::snprintf(counts, sizeof counts, "            OOMs: %-12lld |          alloc retries: %-8lld",
                static_cast<long long>(stats.num_ooms),
                static_cast<long long>(stats.num_alloc_retries));
  out += detail::summary_line(counts);
  out += "|" + double_rule + "|\n";
  out += detail::summary_line(
      "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");

  // An alias, not `Stat PoolStats::*stat`: nvcc's host pass re-emits that declarator with
  // parentheses that g++ then warns about.
  using stat_member = Stat PoolStats::*;
  struct metric {
    const char* name;
    stat_member stat;
    bool bytes;
  };
  static constexpr metric metrics[] = {
      {"Allocated memory", &PoolStats::allocated_bytes, true},
      {"Active memory", &PoolStats::active_bytes, true},
      {"Requested memory", &PoolStats::requested_bytes, true},
      {"Reserved memory", &PoolStats::reserved_bytes, true},
      {"Non-releasable memory", &PoolStats::inactive_split_bytes, true},
      {"Allocations", &PoolStats::allocations, false},
      {"Active allocs", &PoolStats::active, false},
      {"Reserved segments", &PoolStats::segments, false},
      {"Non-releasable allocs", &PoolStats::inactive_split, false},
  };
  for (const metric& m : metrics) {
    out += "|" + rule + "|\n";
    const Stat& all = stats.*m.stat;
    struct row {
      const char* label;
      const Stat* stat;
    };
    const row rows[] = {{m.name, &all},
                        {"      from large pool", &(stats.large_pool.*m.stat)},
                        {"      from small pool", &(stats.small_pool.*m.stat)}};
    for (const row& r : rows) {
      auto cell = [&](std::int64_t value, std::int64_t reference) {
        return m.bytes ? detail::summary_size(value, reference)
                       : detail::summary_count(value, reference);
      };
      char label[32];
      std::snprintf(label, sizeof label, " %-21s ", r.label);
      out += detail::summary_line(std::string(label) + "| " + cell(r.stat->current, all.current) +
                                  " | " + cell(r.stat->peak, all.peak) + " | " +
                                  cell(r.stat->allocated, all.allocated) + " | " +
                                  cell(r.stat->freed, all.freed) + " ");
    }
  }
  out += "|" + double_rule + "|\n";
  return out;
}

}  // namespace tessera::memory
