// Tests of memory/limit_resource_adaptor.hpp.
#include <catch2/catch.hpp>

#include "tessera/core/error.hpp"
#include "tessera/memory/host_memory_resource.hpp"
#include "tessera/memory/limit_resource_adaptor.hpp"
#include "tessera/memory/resource.hpp"
#include "tessera/memory/stream_policy.hpp"

namespace limit_resource_adaptor_test {  // one namespace per test file: unity builds compile several together

namespace mem = tessera::memory;
using limited = mem::limit_resource_adaptor<mem::host_memory_resource>;
static_assert(mem::memory_resource<limited>);
static_assert(std::is_same_v<limited::stream_policy, mem::host_stream_policy>);

TEST_CASE("limit_resource_adaptor: no limit by default", "[memory][limit]") {
  limited resource;
  CHECK(resource.limit() == mem::no_limit);
  void* p = resource.allocate(1 << 20, {});
  CHECK(resource.held() == 1 << 20);
  resource.deallocate(p, 1 << 20, {});
  CHECK(resource.held() == 0);
}

TEST_CASE("limit_resource_adaptor: over the cap is an OOM that changes nothing",
          "[memory][limit]") {
  limited resource(mem::host_memory_resource{}, 3000);
  void* a = resource.allocate(2000, {});
  CHECK_THROWS_AS(resource.allocate(1001, {}), tessera::out_of_memory_error);
  CHECK_THROWS_WITH(resource.allocate(1001, {}), Catch::Contains("1001 B") &&
                                                     Catch::Contains("2.93 KiB") &&
                                                     Catch::Contains("1.95 KiB held"));
  CHECK(resource.held() == 2000);
  void* b = resource.allocate(1000, {});  // exactly at the cap
  CHECK(resource.held() == 3000);
  resource.deallocate(b, 1000, {});
  SECTION("raising the cap at run time") {
    resource.set_limit(mem::no_limit);
    void* c = resource.allocate(1 << 20, {});
    resource.deallocate(c, 1 << 20, {});
  }
  SECTION("lowering it below what is held refuses new memory only") {
    resource.set_limit(1000);
    CHECK_THROWS_AS(resource.allocate(1, {}), tessera::out_of_memory_error);
    CHECK(resource.held() == 2000);
  }
  resource.deallocate(a, 2000, {});
  CHECK(resource.held() == 0);
}

}  // namespace limit_resource_adaptor_test
