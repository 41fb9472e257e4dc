// Tests of memory/host_memory_resource.hpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>

#include "tessera/memory/host_memory_resource.hpp"
#include "tessera/memory/resource.hpp"

namespace host_memory_resource_test {  // one namespace per test file: unity builds compile several together

namespace mem = tessera::memory;
static_assert(mem::memory_resource<mem::host_memory_resource>);

TEST_CASE("host_memory_resource: 256-byte aligned, writable memory", "[memory][host]") {
  mem::host_memory_resource resource;
  for (std::size_t bytes : {1, 255, 256, 4096, 3 * 1024 * 1024 + 7}) {
    void* p = resource.allocate(bytes, {});
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    std::memset(p, 0xab, bytes);
    resource.deallocate(p, bytes, {});
  }
  CHECK(resource.capacity() > 0);  // Linux reports physical memory
}

}  // namespace host_memory_resource_test
