// Tests of memory::record_history and memory::export_timeline (memory/detail/history.hpp): a known
// sequence of allocations and frees is exported and the JSON checked field by field by Debian's
// python (tests/oracles/memory_timeline_check.py) against byte counts this file computes itself
// from PyTorch's rules (512-byte blocks, 2 MiB small segments, 20 MiB large ones).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "memory/units.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/tensor.hpp"

#ifndef TESSERA_ORACLE_SCRIPTS
#error \
    "TESSERA_ORACLE_SCRIPTS (the folder of memory_timeline_check.py) must be defined by the build"
#endif
#ifndef TESSERA_ORACLE_PYTHON
#define TESSERA_ORACLE_PYTHON "/usr/bin/python3"
#endif

namespace history_test {  // one namespace per test file: unity builds compile several together

namespace mem = tessera::memory;
using memory_test_units::cpu0;
using memory_test_units::cpu1;
using memory_test_units::MiB;
using tessera::Device;

namespace {

std::filesystem::path scratch(const std::string& name) {
  const char* oracle_dir = std::getenv("TESSERA_ORACLE_DIR");
  const auto directory =
      (oracle_dir ? std::filesystem::path(oracle_dir) : std::filesystem::temp_directory_path()) /
      "memory_history";
  std::filesystem::create_directories(directory);
  return directory / name;
}

std::size_t rounded(std::size_t bytes) { return (bytes + 511) / 512 * 512; }

std::string hex(const void* pointer) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", pointer);
  return text;
}

/// The events a test expects, in memory_timeline_check.py's format.
struct expectation {
  std::string text;
  explicit expectation(Device device) { text = "device " + device.str() + " start 0 0\n"; }
  void add(const char* name, std::size_t size, const void* address, std::size_t allocated,
           std::string reserved = "-") {
    text += std::string(name) + " " + std::to_string(size) + " " +
            (address != nullptr ? hex(address) : "-") + " " + std::to_string(allocated) + " " +
            reserved + "\n";
  }
};

/// Exports `device`'s timeline and runs the checker on it with `expected`.
void export_and_check(Device device, const expectation& expected, const std::string& stem) {
  const auto trace = scratch(stem + ".json");
  const auto wanted = scratch(stem + ".expected");
  mem::export_timeline(device, trace.string());
  std::ofstream(wanted) << expected.text;
  const std::string command = std::string(TESSERA_ORACLE_PYTHON) + " \"" + TESSERA_ORACLE_SCRIPTS +
                              "/memory_timeline_check.py\" \"" + trace.string() + "\" \"" +
                              wanted.string() + "\"";
  INFO(command);
  REQUIRE(std::system(command.c_str()) == 0);
}

void require_clean(Device device) {
  INFO("run through CTest, or with TESSERA_CPU_DEVICES=2");
  REQUIRE(tessera::cpu::device_count() == 2);
  mem::empty_cache(device);
  REQUIRE(mem::allocated(device) == 0);
  REQUIRE(mem::reserved(device) == 0);
}

}  // namespace

TEST_CASE("memory history: bad input names the values", "[memory][history]") {
  const Device cpu5{tessera::DeviceType::cpu, 5};
  CHECK_THROWS_WITH(mem::record_history(cpu5, true),
                    Catch::Contains("record_history") && Catch::Contains("cpu:5"));
  CHECK_THROWS_AS(mem::export_timeline(cpu5, "x.json"), tessera::device_error);
  CHECK_THROWS_AS(mem::record_history(cpu1, true, 0), std::invalid_argument);
  // cpu:1 has recorded nothing yet in this process.
  CHECK_THROWS_WITH(mem::export_timeline(cpu1, "never.json"),
                    Catch::Contains("no memory history of cpu:1") &&
                        Catch::Contains("record_history(cpu:1, true)"));
  mem::record_history(cpu1, true);
  mem::record_history(cpu1, false);
  CHECK_THROWS_AS(mem::export_timeline(cpu1, "/nonexistent-directory/trace.json"),
                  tessera::io_error);
  CHECK_THROWS_WITH(mem::export_timeline(cpu1, "/nonexistent-directory/trace.json"),
                    Catch::Contains("/nonexistent-directory/trace.json") &&
                        Catch::Contains("No such file or directory"));
}

TEST_CASE("memory history: a known sequence, exported as a trace with exact counters",
          "[memory][history]") {
  require_clean(cpu0);
  mem::record_history(cpu0, true);
  expectation expected(cpu0);
  std::size_t allocated = 0;
  // cpu:0 is this thread's current device: small frees wait in its thread cache, and the
  // timeline still counts them as freed (as memory::allocated does).
  void* a = mem::allocate(cpu0, 100);
  allocated += rounded(100);
  expected.add("allocate", 100, a, allocated, std::to_string(2 * MiB));  // a small segment
  void* b = mem::allocate(cpu0, 3000);
  allocated += rounded(3000);
  expected.add("allocate", 3000, b, allocated, std::to_string(2 * MiB));
  void* c = mem::allocate(cpu0, MiB + 1);  // the large pool: a 20 MiB segment
  allocated += rounded(MiB + 1);
  expected.add("allocate", MiB + 1, c, allocated, std::to_string(22 * MiB));
  {
    auto t = tessera::empty<float>({129}, 0);  // a tensor's storage: 516 bytes
    allocated += rounded(516);
    expected.add("allocate", 516, t.data(), allocated, std::to_string(22 * MiB));
    expected.add("free", 516, t.data(), allocated - rounded(516), std::to_string(22 * MiB));
    allocated -= rounded(516);
  }
  mem::deallocate(cpu0, a, 100);
  allocated -= rounded(100);
  expected.add("free", 100, a, allocated, std::to_string(22 * MiB));
  mem::deallocate(cpu0, c, MiB + 1);
  allocated -= rounded(MiB + 1);
  expected.add("free", MiB + 1, c, allocated, std::to_string(22 * MiB));
  mem::deallocate(cpu0, b, 3000);
  allocated -= rounded(3000);
  expected.add("free", 3000, b, allocated, std::to_string(22 * MiB));
  CHECK(allocated == 0);
  mem::empty_cache(cpu0);
  expected.add("empty_cache", 0, nullptr, 0, "0");
  // Refused under a limit: recorded with its size, nothing allocated.
  mem::set_limit(cpu0, MiB);
  CHECK_THROWS_AS(mem::allocate(cpu0, 4 * MiB), tessera::out_of_memory_error);
  mem::set_limit(cpu0, mem::no_limit);
  expected.add("out_of_memory", 4 * MiB, nullptr, 0, "0");
  mem::record_history(cpu0, false);
  mem::deallocate(cpu0, mem::allocate(cpu0, 64), 64);  // not recorded: the history is off
  export_and_check(cpu0, expected, "sequence");
  require_clean(cpu0);
}

TEST_CASE("memory history keeps the last max_events events", "[memory][history]") {
  require_clean(cpu1);
  mem::record_history(cpu1, true, 3);
  std::vector<void*> blocks;
  for (std::size_t i = 1; i <= 5; ++i) blocks.push_back(mem::allocate(cpu1, i * 512));
  mem::record_history(cpu1, false);
  // The start and the first two allocations are dropped: the counters start at the third one.
  expectation expected(cpu1);
  expected.text =
      "device cpu:1 start " + std::to_string(6 * 512) + " " + std::to_string(2 * MiB) + "\n";
  expected.add("allocate", 3 * 512, blocks[2], 6 * 512);
  expected.add("allocate", 4 * 512, blocks[3], 10 * 512);
  expected.add("allocate", 5 * 512, blocks[4], 15 * 512);
  const auto trace = scratch("ring.json");
  mem::export_timeline(cpu1, trace.string());
  std::ifstream in(trace);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"dropped_events\":3") != std::string::npos);
  for (std::size_t i = 1; i <= 5; ++i) mem::deallocate(cpu1, blocks[i - 1], i * 512);
  require_clean(cpu1);
}

TEST_CASE("memory history of two devices allocating on two threads at once", "[memory][history]") {
  require_clean(cpu0);
  require_clean(cpu1);
  mem::record_history(cpu0, true);
  mem::record_history(cpu1, true);
  std::vector<expectation> expected{expectation(cpu0), expectation(cpu1)};
  auto work = [&](int index) {
    tessera::cpu::set_device(index);
    const Device device{tessera::DeviceType::cpu, index};
    std::vector<std::pair<void*, std::size_t>> live;
    std::size_t allocated = 0;
    for (std::size_t i = 0; i < 200; ++i) {
      // Sizes from 1 byte to 96 KiB: thread-cached and pooled blocks, a free every third step.
      const std::size_t bytes = 1 + (i * 7919 + static_cast<std::size_t>(index) * 131) % (96 << 10);
      void* pointer = mem::allocate(device, bytes);
      allocated += rounded(bytes);
      expected[static_cast<std::size_t>(index)].add("allocate", bytes, pointer, allocated);
      live.emplace_back(pointer, bytes);
      if (i % 3 == 2) {
        const auto [freed, freed_bytes] = live[live.size() / 2];
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2));
        mem::deallocate(device, freed, freed_bytes);
        allocated -= rounded(freed_bytes);
        expected[static_cast<std::size_t>(index)].add("free", freed_bytes, freed, allocated);
      }
    }
    for (const auto& [pointer, bytes] : live) {
      mem::deallocate(device, pointer, bytes);
      allocated -= rounded(bytes);
      expected[static_cast<std::size_t>(index)].add("free", bytes, pointer, allocated);
    }
  };
  std::thread first(work, 0);
  std::thread second(work, 1);
  first.join();
  second.join();
  mem::record_history(cpu0, false);
  mem::record_history(cpu1, false);
  export_and_check(cpu0, expected[0], "thread0");
  export_and_check(cpu1, expected[1], "thread1");
  require_clean(cpu0);
  require_clean(cpu1);
}

}  // namespace history_test
