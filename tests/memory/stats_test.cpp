// Tests of memory/stats.hpp: Stat arithmetic and the summary table's layout and units.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "tessera/memory/stats.hpp"

namespace stats_test {  // one namespace per test file: unity builds compile several together

namespace mem = tessera::memory;

TEST_CASE("Stat: current, peak and running totals", "[memory][stats]") {
  mem::Stat stat;
  stat.increase(10);
  stat.increase(5);
  stat.decrease(12);
  CHECK(stat == mem::Stat{3, 15, 15, 12});
  stat.reset_peak();
  CHECK(stat.peak == 3);
  stat.reset_accumulated();
  CHECK(stat == mem::Stat{3, 3, 0, 0});
}

TEST_CASE("MemoryStats: reset_peak and reset_accumulated cover every pool", "[memory][stats]") {
  mem::MemoryStats stats;
  stats.allocated_bytes.increase(4096);
  stats.small_pool.allocated_bytes.increase(4096);
  stats.large_pool.segments.increase(1);
  stats.allocated_bytes.decrease(4096);
  stats.small_pool.allocated_bytes.decrease(4096);
  stats.num_ooms = 2;
  stats.reset_peak();
  CHECK(stats.allocated_bytes.peak == 0);
  CHECK(stats.small_pool.allocated_bytes.peak == 0);
  CHECK(stats.large_pool.segments.peak == 1);
  stats.reset_accumulated();
  CHECK(stats.small_pool.allocated_bytes.allocated == 0);
  CHECK(stats.large_pool.segments.allocated == 0);
  CHECK(stats.num_ooms == 0);
}

TEST_CASE("format_summary: PyTorch's layout, rows and units", "[memory][stats]") {
  mem::MemoryStats stats;
  // 2 MiB of small-pool reservation, 1536 B allocated in it.
  for (mem::PoolStats* pool : {static_cast<mem::PoolStats*>(&stats), &stats.small_pool}) {
    pool->reserved_bytes.increase(2 * 1024 * 1024);
    pool->segments.increase(1);
    pool->allocated_bytes.increase(1536);
    pool->allocations.increase(2);
  }
  stats.num_ooms = 3;
  stats.num_alloc_retries = 4;
  const std::string text = mem::format_summary(stats, tessera::Device{tessera::DeviceType::cpu, 1});
  CHECK_THAT(text, Catch::Contains("Tessera memory summary, device cpu:1"));
  CHECK_THAT(text, Catch::Contains("OOMs: 3"));
  CHECK_THAT(text, Catch::Contains("alloc retries: 4"));
  CHECK_THAT(text,
             Catch::Contains(
                 "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "));
  for (const char* row :
       {"Allocated memory", "Active memory", "Requested memory", "Reserved memory",
        "Non-releasable memory", "Allocations", "Active allocs", "Reserved segments",
        "Non-releasable allocs", "from large pool", "from small pool"}) {
    CHECK_THAT(text, Catch::Contains(row));
  }
  // 1536 B stays in bytes (below 768 KiB); 2 MiB moves to KiB (2048) and no further.
  CHECK_THAT(text,
             Catch::Contains(
                 "| Allocated memory      |   1536 B   |   1536 B   |   1536 B   |      0 B   |"));
  CHECK_THAT(text,
             Catch::Contains(
                 "| Reserved memory       |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |"));
  CHECK_THAT(text,
             Catch::Contains(
                 "|       from large pool |      0 KiB |      0 KiB |      0 KiB |      0 B   |"));
  CHECK_THAT(text,
             Catch::Contains(
                 "| Allocations           |       2    |       2    |       2    |       0    |"));
  // Every line is the 75-column box plus its borders.
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) CHECK(line.size() == 77);
}

}  // namespace stats_test
