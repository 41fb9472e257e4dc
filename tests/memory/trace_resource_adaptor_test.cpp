// Tests of memory/trace_resource_adaptor.hpp.
#include <catch2/catch.hpp>

#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/memory/host_memory_resource.hpp"
#include "tessera/memory/limit_resource_adaptor.hpp"
#include "tessera/memory/pool.hpp"
#include "tessera/memory/trace_resource_adaptor.hpp"

namespace trace_resource_adaptor_test {  // one namespace per test file: unity builds compile several together

namespace mem = tessera::memory;
using action = mem::trace_event::action;

TEST_CASE("trace_resource_adaptor under a pool records segments taken and returned",
          "[memory][trace]") {
  mem::pool_resource<mem::trace_resource_adaptor<mem::host_memory_resource>> pool;
  void* a = pool.allocate(100);
  void* b = pool.allocate(200);  // same segment: no upstream call
  pool.deallocate(a, 100);
  pool.deallocate(b, 200);
  pool.empty_cache();
  auto events = pool.upstream().events();
  REQUIRE(events.size() == 2);
  CHECK(events[0].what == action::allocate);
  CHECK(events[0].bytes == 2 * 1024 * 1024);
  CHECK(events[1].what == action::deallocate);
  CHECK(events[1].address == events[0].address);
  CHECK(events[0].time <= events[1].time);
}

TEST_CASE("trace_resource_adaptor records refusals and keeps only the last events",
          "[memory][trace]") {
  mem::trace_resource_adaptor<mem::limit_resource_adaptor<mem::host_memory_resource>> traced(
      mem::limit_resource_adaptor<mem::host_memory_resource>{}, 2);
  traced.set_limit(1000);
  CHECK_THROWS_AS(traced.allocate(2000, {}), tessera::out_of_memory_error);
  void* p = traced.allocate(10, {});
  traced.deallocate(p, 10, {});
  auto events = traced.events();
  REQUIRE(events.size() == 2);  // the refusal fell out of the ring
  CHECK(events[0].what == action::allocate);
  CHECK(events[1].what == action::deallocate);
  traced.clear();
  CHECK(traced.events().empty());
  CHECK_THROWS_AS(mem::trace_resource_adaptor<mem::host_memory_resource>({}, 0),
                  std::invalid_argument);
}

TEST_CASE("trace_resource_adaptor over a pool records every block request", "[memory][trace]") {
  using pool_type = mem::pool_resource<mem::host_memory_resource>;
  mem::trace_resource_adaptor<pool_type> traced(std::in_place, 16);
  void* p = traced.allocate(4, {});
  traced.deallocate(p, 4, {});
  auto events = traced.events();
  REQUIRE(events.size() == 2);
  CHECK(events[0].bytes == 4);
  CHECK(traced.upstream().stats().allocated_bytes.allocated == 512);
}

}  // namespace trace_resource_adaptor_test
