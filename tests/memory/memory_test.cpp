// Tests of memory/memory.hpp: the per-device registry and the memory:: functions. CTest runs this
// with TESSERA_CPU_DEVICES=2; the registry is process-wide, so every test leaves its devices as it
// found them (nothing live, cache empty, no limit).
#include <catch2/catch.hpp>

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/tensor.hpp"
#include "memory/units.hpp"

namespace memory_test {  // one namespace per test file: unity builds compile several together

namespace mem = tessera::memory;
using tessera::Device;
using tessera::DeviceType;

using memory_test_units::cpu0;
using memory_test_units::cpu1;
using memory_test_units::KiB;
using memory_test_units::MiB;

namespace {

void require_two_cpu_devices() {
  INFO("run through CTest, or with TESSERA_CPU_DEVICES=2");
  REQUIRE(tessera::cpu::device_count() == 2);
}

void require_clean(Device device) {
  mem::empty_cache(device);
  REQUIRE(mem::allocated(device) == 0);
  REQUIRE(mem::reserved(device) == 0);
}
}  // namespace

TEST_CASE("memory: allocations are accounted with PyTorch's rounding", "[memory]") {
  require_two_cpu_devices();
  require_clean(cpu0);
  const std::size_t requests[] = {4, 512, 516, 4096};  // 1, 128, 129, 1024 floats
  const std::size_t rounded[] = {512, 512, 1024, 4096};
  void* pointers[4];
  std::size_t expected = 0;
  for (int i = 0; i < 4; ++i) {
    pointers[i] = mem::allocate(cpu0, requests[i]);
    expected += rounded[i];
    CHECK(mem::allocated(cpu0) == expected);
    CHECK(mem::reserved(cpu0) == 2 * MiB);
  }
  CHECK(mem::stats(cpu0).requested_bytes.current == 4 + 512 + 516 + 4096);
  for (int i = 0; i < 4; ++i) mem::deallocate(cpu0, pointers[i], requests[i]);
  CHECK(mem::allocated(cpu0) == 0);
  CHECK(mem::reserved(cpu0) == 2 * MiB);
  mem::empty_cache(cpu0);
  CHECK(mem::reserved(cpu0) == 0);
}

TEST_CASE("memory: 0 bytes allocate nothing; freeing nullptr is a no-op", "[memory]") {
  require_clean(cpu0);
  const mem::MemoryStats before = mem::stats(cpu0);
  CHECK(mem::allocate(cpu0, 0) == nullptr);
  mem::deallocate(cpu0, nullptr, 0);
  mem::record_stream(cpu0, nullptr, {});
  CHECK(mem::stats(cpu0) == before);
}

TEST_CASE("memory: every virtual CPU device has its own pool and statistics", "[memory]") {
  require_two_cpu_devices();
  require_clean(cpu0);
  require_clean(cpu1);
  void* a = mem::allocate(cpu0, 12 * MiB);
  void* b = mem::allocate(cpu1, 1000);
  CHECK(mem::allocated(cpu0) == 12 * MiB);
  CHECK(mem::allocated(cpu1) == 1024);
  CHECK(mem::reserved(cpu1) == 2 * MiB);
  CHECK(&mem::get_device_resource(cpu0) != &mem::get_device_resource(cpu1));
  CHECK(mem::get_device_resource(cpu1).device() == cpu1);
  mem::deallocate(cpu1, b, 1000);
  CHECK(mem::allocated(cpu0) == 12 * MiB);
  mem::deallocate(cpu0, a, 12 * MiB);
  mem::empty_cache(cpu0);
  CHECK(mem::reserved(cpu0) == 0);
  CHECK(mem::reserved(cpu1) == 2 * MiB);
  mem::empty_cache(cpu1);
}

TEST_CASE("memory: a device that does not exist is a device_error naming it", "[memory]") {
  const Device cpu5{DeviceType::cpu, 5};
  int local = 0;
  auto names_cpu5 = Catch::Contains("cpu:5");
  CHECK_THROWS_AS(mem::allocate(cpu5, 16), tessera::device_error);
  CHECK_THROWS_WITH(mem::allocate(cpu5, 16), names_cpu5 && Catch::Contains("memory::allocate"));
  CHECK_THROWS_WITH(mem::allocated(cpu5), names_cpu5);
  CHECK_THROWS_WITH(mem::peak_allocated(cpu5), names_cpu5);
  CHECK_THROWS_WITH(mem::reset_peak(cpu5), names_cpu5);
  CHECK_THROWS_WITH(mem::reserved(cpu5), names_cpu5);
  CHECK_THROWS_WITH(mem::empty_cache(cpu5), names_cpu5);
  CHECK_THROWS_WITH(mem::stats(cpu5), names_cpu5);
  CHECK_THROWS_WITH(mem::summary(cpu5), names_cpu5);
  CHECK_THROWS_WITH(mem::set_limit(cpu5, 1), names_cpu5);
  CHECK_THROWS_WITH(mem::limit(cpu5), names_cpu5);
  CHECK_THROWS_WITH(mem::record_stream(cpu5, &local, {}), names_cpu5);
  CHECK_THROWS_AS(mem::allocated(Device{DeviceType::cpu, -1}), tessera::device_error);
  if (!tessera::cuda::is_available()) {
    CHECK_THROWS_WITH(mem::allocate(Device{DeviceType::cuda, 0}, 16), Catch::Contains("cuda:0"));
  }
}

TEST_CASE("memory: peak_allocated and reset_peak", "[memory]") {
  require_clean(cpu0);
  mem::reset_peak(cpu0);
  void* a = mem::allocate(cpu0, 3 * MiB);
  void* b = mem::allocate(cpu0, 100);
  mem::deallocate(cpu0, a, 3 * MiB);
  CHECK(mem::peak_allocated(cpu0) == 3 * MiB + 512);
  CHECK(mem::peak_reserved(cpu0) == 22 * MiB);
  mem::reset_peak(cpu0);
  CHECK(mem::peak_allocated(cpu0) == 512);
  CHECK(mem::peak_reserved(cpu0) == 22 * MiB);  // still reserved (cached)
  mem::deallocate(cpu0, b, 100);
  mem::empty_cache(cpu0);
  mem::reset_peak(cpu0);
  CHECK(mem::peak_reserved(cpu0) == 0);
}

TEST_CASE("memory: empty_cache keeps segments with live blocks", "[memory]") {
  require_clean(cpu0);
  void* live = mem::allocate(cpu0, 512);
  void* freed = mem::allocate(cpu0, 12 * MiB);
  mem::deallocate(cpu0, freed, 12 * MiB);
  CHECK(mem::reserved(cpu0) == 14 * MiB);
  mem::empty_cache(cpu0);
  CHECK(mem::reserved(cpu0) == 2 * MiB);
  CHECK(mem::stats(cpu0).inactive_split_bytes.current == static_cast<std::int64_t>(2 * MiB - 512));
  mem::deallocate(cpu0, live, 512);
  mem::empty_cache(cpu0);
  CHECK(mem::reserved(cpu0) == 0);
}

TEST_CASE("memory: under a limit smaller than a segment, requests that fit are served",
          "[memory]") {
  require_two_cpu_devices();
  require_clean(cpu1);
  // The small pool's segments are 2 MiB: under a 1 MiB limit a 400-byte request takes a segment
  // of its own rounded size instead (issue: a limit means "this many bytes").
  mem::set_limit(cpu1, 1 * MiB);
  void* a = mem::allocate(cpu1, 400);
  CHECK(mem::allocated(cpu1) == 512);
  CHECK(mem::reserved(cpu1) == 512);
  void* b = mem::allocate(cpu1, 600 * KiB);
  CHECK(mem::allocated(cpu1) == 512 + 600 * KiB);
  CHECK(mem::reserved(cpu1) == 512 + 600 * KiB);
  // 512 + 600 KiB + 500 KiB is over 1 MiB: refused, and nothing changes.
  CHECK_THROWS_AS(mem::allocate(cpu1, 500 * KiB), tessera::out_of_memory_error);
  CHECK(mem::reserved(cpu1) == 512 + 600 * KiB);
  {  // A tensor too: the report's case, a 400-byte tensor under a 1 MiB limit.
    auto t = tessera::zeros<float>({100}, 1);
    CHECK(t.to_vector() == std::vector<float>(100, 0.0f));
    CHECK(mem::allocated(cpu1) == 512 + 600 * KiB + 512);
  }
  mem::deallocate(cpu1, b, 600 * KiB);
  mem::deallocate(cpu1, a, 400);
  CHECK(mem::allocated(cpu1) == 0);
  mem::set_limit(cpu1, mem::no_limit);
  mem::empty_cache(cpu1);
  CHECK(mem::reserved(cpu1) == 0);
  mem::reset_accumulated(cpu1);
  mem::reset_peak(cpu1);
}

TEST_CASE("memory: a limit turns a large request into an OOM that changes nothing", "[memory]") {
  require_two_cpu_devices();
  require_clean(cpu1);
  CHECK(mem::limit(cpu1) == mem::no_limit);
  void* small = mem::allocate(cpu1, 512);
  mem::set_limit(cpu1, 1 * MiB);  // below the 2 MiB already reserved: memory in use stays
  CHECK(mem::limit(cpu1) == 1 * MiB);
  const mem::MemoryStats before = mem::stats(cpu1);
  std::string message;
  try {
    (void)mem::allocate(cpu1, 2 * MiB);
    FAIL("no out_of_memory_error");
  } catch (const tessera::out_of_memory_error& e) {
    message = e.what();
  }
  // The example of DESIGN §3.2, on cpu:1.
  CHECK_THAT(message, Catch::Contains("Tried to allocate 2.00 MiB (device cpu:1; "));
  CHECK_THAT(message, Catch::Contains("; 1.00 MiB limit; 512 B allocated; 2.00 MiB reserved in "
                                      "total by Tessera; 2.00 MiB free in reserved segments)"));
  mem::MemoryStats after = mem::stats(cpu1);
  CHECK(after.num_ooms == before.num_ooms + 1);
  CHECK(after.num_alloc_retries == before.num_alloc_retries + 1);
  CHECK(mem::allocated(cpu1) == 512);
  after.num_ooms = before.num_ooms;
  after.num_alloc_retries = before.num_alloc_retries;
  CHECK(after == before);
  // Small requests are still served from the segment already reserved.
  void* next = mem::allocate(cpu1, 100 * KiB);
  CHECK(mem::allocated(cpu1) == 512 + 100 * KiB);
  CHECK_THAT(mem::summary(cpu1), Catch::Contains("OOMs: 1"));
  mem::deallocate(cpu1, next, 100 * KiB);
  mem::deallocate(cpu1, small, 512);
  mem::set_limit(cpu1, mem::no_limit);
  CHECK(mem::limit(cpu1) == mem::no_limit);
  mem::reset_accumulated(cpu1);
  CHECK(mem::stats(cpu1).num_ooms == 0);
  mem::empty_cache(cpu1);
}

TEST_CASE("memory: lowering the limit below reserved empties the cache first", "[memory]") {
  require_clean(cpu0);
  void* p = mem::allocate(cpu0, 12 * MiB);
  mem::deallocate(cpu0, p, 12 * MiB);
  CHECK(mem::reserved(cpu0) == 12 * MiB);
  mem::set_limit(cpu0, 4 * MiB);
  CHECK(mem::reserved(cpu0) == 0);
  mem::set_limit(cpu0, mem::no_limit);
}

TEST_CASE("memory: summary names the device and has PyTorch's rows", "[memory]") {
  require_two_cpu_devices();
  void* p = mem::allocate(cpu1, 4096);
  const std::string text = mem::summary(cpu1);
  CHECK_THAT(text, Catch::Contains("device cpu:1"));
  CHECK_THAT(text,
             Catch::Contains("Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed"));
  for (const char* row :
       {"Allocated memory", "Active memory", "Requested memory", "Reserved memory",
        "Non-releasable memory", "Allocations", "Active allocs", "Reserved segments",
        "Non-releasable allocs", "from large pool", "from small pool"}) {
    CHECK_THAT(text, Catch::Contains(row));
  }
  mem::deallocate(cpu1, p, 4096);
  mem::empty_cache(cpu1);
}

TEST_CASE("memory: record_stream on a CPU device only checks the pointer", "[memory]") {
  void* p = mem::allocate(cpu0, 100);
  mem::record_stream(cpu0, p, tessera::stream_ref{reinterpret_cast<void*>(0x10)});
  int local = 0;
  CHECK_THROWS_AS(mem::record_stream(cpu0, &local, {}), std::invalid_argument);
  CHECK_THROWS_WITH(mem::record_stream(cpu0, &local, {}), Catch::Contains("cpu:0"));
  mem::deallocate(cpu0, p, 100);
  CHECK(mem::stats(cpu0).active_bytes.current == 0);
  mem::empty_cache(cpu0);
}

namespace {
// 4 KiB pages in one pool of 64 KiB segments: visibly different from PyTorch's policy.
struct page_policy {
  std::size_t round_size(std::size_t bytes) const { return (bytes + 4095) / 4096 * 4096; }
  bool is_small(std::size_t) const { return true; }
  std::size_t segment_size(std::size_t size) const { return size < 65536 ? 65536 : size; }
  bool should_split(bool, std::size_t block, std::size_t size) const { return block > size; }
  bool may_use(std::size_t, std::size_t) const { return true; }
};
}  // namespace

TEST_CASE("memory: set_device_resource installs another pool for a device", "[memory]") {
  require_two_cpu_devices();
  require_clean(cpu1);
  auto installed = mem::make_pool_resource(cpu1, mem::host_memory_resource{}, page_policy{});
  std::unique_ptr<mem::device_memory_resource> previous =
      mem::set_device_resource(cpu1, std::move(installed));
  void* p = mem::allocate(cpu1, 1);
  CHECK(mem::allocated(cpu1) == 4096);
  CHECK(mem::reserved(cpu1) == 65536);
  CHECK(mem::allocated(cpu0) == 0);  // other devices are untouched

  SECTION("not while it has live allocations") {
    auto another = mem::make_pool_resource(cpu1, mem::host_memory_resource{});
    CHECK_THROWS_AS(mem::set_device_resource(cpu1, std::move(another)), tessera::error);
    CHECK(mem::allocated(cpu1) == 4096);
  }
  SECTION("set_limit on a resource without a limit is refused") {
    CHECK_THROWS_AS(mem::set_limit(cpu1, 1), std::invalid_argument);
    CHECK(mem::limit(cpu1) == mem::no_limit);
  }
  SECTION("a null resource or one made for another device is refused") {
    CHECK_THROWS_AS(mem::set_device_resource(cpu1, nullptr), std::invalid_argument);
    CHECK_THROWS_WITH(
        mem::set_device_resource(cpu1, mem::make_pool_resource(cpu0, mem::host_memory_resource{})),
        Catch::Contains("cpu:0") && Catch::Contains("cpu:1"));
    CHECK(mem::allocated(cpu1) == 4096);
  }
  mem::deallocate(cpu1, p, 1);
  auto mine = mem::set_device_resource(
      cpu1,
      previous ? std::move(previous) : mem::make_pool_resource(cpu1, mem::host_memory_resource{}));
  REQUIRE(mine != nullptr);
  CHECK(mine->stats().reserved_bytes.current == 65536);
  CHECK(mem::reserved(cpu1) == 0);
}

}  // namespace memory_test
