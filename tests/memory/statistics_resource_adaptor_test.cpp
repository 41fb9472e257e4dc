// Tests of memory/statistics_resource_adaptor.hpp.
#include <catch2/catch.hpp>

#include "tessera/memory/host_memory_resource.hpp"
#include "tessera/memory/limit_resource_adaptor.hpp"
#include "tessera/memory/statistics_resource_adaptor.hpp"

namespace statistics_resource_adaptor_test {  // one namespace per test file: unity builds compile several together

namespace mem = tessera::memory;

TEST_CASE("statistics_resource_adaptor: bytes and calls", "[memory][statistics]") {
  mem::statistics_resource_adaptor<mem::host_memory_resource> resource;
  void* a = resource.allocate(100, {});
  void* b = resource.allocate(300, {});
  resource.deallocate(a, 100, {});
  auto counters = resource.get_counters();
  CHECK(counters.bytes.current == 300);
  CHECK(counters.bytes.peak == 400);
  CHECK(counters.bytes.allocated == 400);
  CHECK(counters.bytes.freed == 100);
  CHECK(counters.allocations.current == 1);
  CHECK(counters.allocations.peak == 2);
  resource.reset_peak();
  CHECK(resource.get_counters().bytes.peak == 300);
  resource.deallocate(b, 300, {});
  CHECK(resource.get_counters().allocations.current == 0);
}

TEST_CASE("statistics_resource_adaptor: a failed allocation is not counted; limits pass through",
          "[memory][statistics]") {
  mem::statistics_resource_adaptor<mem::limit_resource_adaptor<mem::host_memory_resource>> resource;
  resource.set_limit(1000);
  CHECK(resource.limit() == 1000);
  CHECK_THROWS_AS(resource.allocate(2000, {}), tessera::out_of_memory_error);
  CHECK(resource.get_counters().allocations.allocated == 0);
}

}  // namespace statistics_resource_adaptor_test
