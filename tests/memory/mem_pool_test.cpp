// Tests of memory/mem_pool.hpp: private pools (PyTorch's MemPool and use_mem_pool) on the virtual
// CPU devices. Expected figures follow PyTorch's size policy: a request up to 1 MiB is rounded up
// to 512 bytes and served from a 2 MiB segment; the device's pool serves that 2 MiB segment as a
// large block from a 20 MiB segment of its own. Every test leaves the devices as it found them.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/memory/mem_pool.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/tensor.hpp"
#include "memory/units.hpp"

namespace mem_pool_test {  // one namespace per test file: unity builds compile several together

namespace mem = tessera::memory;
namespace ts = tessera;
using memory_test_units::cpu0;
using memory_test_units::cpu1;
using memory_test_units::KiB;
using memory_test_units::MiB;

namespace {

constexpr auto small_segment = static_cast<std::int64_t>(2 * MiB);   // PyTorch's kSmallBuffer
constexpr auto large_segment = static_cast<std::int64_t>(20 * MiB);  // its kLargeBuffer

void require_clean(ts::Device device) {
  mem::empty_cache(device);
  REQUIRE(mem::allocated(device) == 0);
  REQUIRE(mem::reserved(device) == 0);
}

std::int64_t pool_allocated(const mem::MemPool& pool) {
  return pool.stats().allocated_bytes.current;
}
std::int64_t pool_reserved(const mem::MemPool& pool) {
  return pool.stats().reserved_bytes.current;
}

}  // namespace

TEST_CASE("allocations in a use_mem_pool scope come from the private pool", "[mem_pool]") {
  REQUIRE(ts::cpu::device_count() == 2);
  require_clean(cpu0);
  {
    mem::MemPool pool(cpu0);
    CHECK(pool.device() == cpu0);
    CHECK(pool_reserved(pool) == 0);  // nothing taken before the first allocation
    CHECK(mem::allocated(cpu0) == 0);
    {
      mem::use_mem_pool scope(pool);
      ts::Storage tensor_bytes = ts::Storage::allocate(cpu0, 1000);  // a tensor's storage
      void* raw = mem::allocate(cpu0, 3000);                          // the library's scratch
      CHECK(pool_allocated(pool) == 1024 + 3072);
      CHECK(pool.stats().allocations.current == 2);
      CHECK(pool_reserved(pool) == small_segment);
      // The device's pool counts the private pool's segment, not its blocks.
      CHECK(mem::allocated(cpu0) == static_cast<std::size_t>(small_segment));
      CHECK(mem::reserved(cpu0) == static_cast<std::size_t>(large_segment));
      mem::deallocate(cpu0, raw, 3000);
      CHECK(pool_allocated(pool) == 1024);
    }
    CHECK(pool_allocated(pool) == 0);  // the storage went back to the pool at the scope's end
    CHECK(pool_reserved(pool) == small_segment);
    CHECK(mem::allocated(cpu0) == static_cast<std::size_t>(small_segment));
  }
  // The last handle gone and nothing live: the segment went back to the device's pool.
  CHECK(mem::allocated(cpu0) == 0);
  require_clean(cpu0);
}

TEST_CASE("a private pool reuses its own blocks and no one else's", "[mem_pool]") {
  require_clean(cpu0);
  mem::MemPool pool(cpu0);
  void* first = nullptr;
  {
    mem::use_mem_pool scope(pool);
    first = mem::allocate(cpu0, 4096);
    mem::deallocate(cpu0, first, 4096);
    void* again = mem::allocate(cpu0, 4096);
    CHECK(again == first);  // its freed block, from its own segment
    mem::deallocate(cpu0, again, 4096);
  }
  // Outside the scope the device's pool serves, and the private pool's free block is not taken.
  void* outside = mem::allocate(cpu0, 4096);
  CHECK(outside != first);
  CHECK(pool_allocated(pool) == 0);
  CHECK(pool.stats().allocations.peak == 1);
  CHECK(mem::allocated(cpu0) == static_cast<std::size_t>(small_segment) + 4096);
  mem::deallocate(cpu0, outside, 4096);
  pool.empty_cache();  // its free segment back to the device's pool, the pool still alive
  CHECK(pool_reserved(pool) == 0);
  CHECK(mem::allocated(cpu0) == 0);
  require_clean(cpu0);
}

TEST_CASE("a private pool outlives its handles while its blocks live", "[mem_pool]") {
  require_clean(cpu0);
  std::optional<ts::Tensor<float, ts::cpu>> kept;
  {
    mem::MemPool pool(cpu0);
    mem::use_mem_pool scope(pool);
    kept = ts::full<float, ts::cpu>({256}, 2.5f, 0);
    CHECK(pool_allocated(pool) == 1024);
    CHECK(pool.use_count() == 3);  // the handle, the scope, the block
  }
  // The pool's handle and scope are gone; the tensor still reads its values from the pool's
  // segment, which the device's pool still counts.
  CHECK(mem::allocated(cpu0) == static_cast<std::size_t>(small_segment));
  for (std::int64_t i = 0; i < 256; ++i) REQUIRE(kept->data()[i] == 2.5f);
  kept.reset();
  CHECK(mem::allocated(cpu0) == 0);
  require_clean(cpu0);
}

TEST_CASE("use_mem_pool scopes are per thread and per device, and nest", "[mem_pool]") {
  require_clean(cpu0);
  require_clean(cpu1);
  {
    mem::MemPool outer(cpu0);
    mem::MemPool inner(cpu0);
    mem::use_mem_pool outer_scope(outer);
    void* a = mem::allocate(cpu0, 512);
    void* b = nullptr;
    {
      mem::use_mem_pool inner_scope(inner);
      b = mem::allocate(cpu0, 512);
      CHECK(pool_allocated(inner) == 512);
      CHECK(pool_allocated(outer) == 512);
    }
    void* c = mem::allocate(cpu0, 512);  // the outer scope again
    CHECK(pool_allocated(outer) == 1024);
    // Another device: its own pool serves, whatever this thread's scopes on cpu:0.
    void* other_device = mem::allocate(cpu1, 512);
    CHECK(mem::allocated(cpu1) == 512);
    // Another thread: the device's pool serves it.
    void* other_thread = nullptr;
    std::thread([&] { other_thread = mem::allocate(cpu0, 512); }).join();
    CHECK(pool_allocated(outer) == 1024);
    CHECK(mem::allocated(cpu0) == static_cast<std::size_t>(2 * small_segment) + 512);
    for (void* p : {a, b, c, other_thread}) mem::deallocate(cpu0, p, 512);
    mem::deallocate(cpu1, other_device, 512);
    CHECK(pool_allocated(outer) == 0);
    CHECK(pool_allocated(inner) == 0);
  }
  require_clean(cpu0);
  require_clean(cpu1);
}

TEST_CASE("a free on a device without a private pool goes to that device's pool", "[mem_pool]") {
  require_clean(cpu0);
  require_clean(cpu1);
  mem::reset_accumulated(cpu1);
  {
    mem::MemPool pool(cpu0);
    mem::use_mem_pool scope(pool);
    void* private_block = mem::allocate(cpu0, 4096);
    void* plain = mem::allocate(cpu1, 4096);  // the scope is cpu:0's: cpu:1's pool serves
    CHECK(mem::allocated(cpu1) == 4096);
    mem::deallocate(cpu1, plain, 4096);
    const mem::MemoryStats other = mem::stats(cpu1);
    CHECK(other.allocations.current == 0);
    CHECK(other.allocations.allocated == 1);
    CHECK(other.allocations.freed == 1);
    CHECK(other.allocated_bytes.freed == 4096);
    CHECK(pool.stats().allocations.current == 1);  // the private pool saw nothing of it
    CHECK(pool.stats().allocations.freed == 0);
    mem::deallocate(cpu0, private_block, 4096);
    CHECK(pool.stats().allocations.freed == 1);
  }
  require_clean(cpu0);
  require_clean(cpu1);
}

TEST_CASE("a CPU device without a private pool keeps its thread cache while another has one",
          "[mem_pool]") {
  ts::DeviceGuard<ts::cpu> drive(1);  // a thread caches the blocks of its current device only
  require_clean(cpu0);
  require_clean(cpu1);
  mem::MemPool pool(cpu0);
  {
    mem::use_mem_pool scope(pool);  // cpu:0's scope: cpu:1 is not affected
    void* warm = mem::allocate(cpu1, 4000);
    mem::deallocate(cpu1, warm, 4000);  // kept in this thread's cache of cpu:1
    const auto& counters = mem::detail::thread_cache::local()->of(1).statistics();
    const std::int64_t hits_before = counters.hit_blocks.load();
    const std::int64_t puts_before = counters.put_blocks.load();
    // The inlined fast paths of a tensor's storage serve cpu:1 from the cache.
    void* again = mem::detail::allocate_cached(cpu1, 4000);
    CHECK(again == warm);
    CHECK(counters.hit_blocks.load() - hits_before == 1);
    REQUIRE(again != nullptr);
    CHECK(mem::detail::deallocate_cached(cpu1, again, 4000));
    CHECK(counters.put_blocks.load() - puts_before == 1);
    CHECK(mem::allocated(cpu1) == 0);  // the query returns the cached block to the pool
    CHECK(pool.stats().allocations.allocated == 0);
  }
  {
    // cpu:0 has the private pool: its fast paths give way to memory::allocate and deallocate,
    // which serve the scope from the private pool.
    ts::DeviceGuard<ts::cpu> drive_cpu0(0);
    mem::use_mem_pool scope(pool);
    CHECK(mem::detail::allocate_cached(cpu0, 4000) == nullptr);
    void* block = mem::allocate(cpu0, 4000);
    CHECK(pool_allocated(pool) == 4096);
    CHECK_FALSE(mem::detail::deallocate_cached(cpu0, block, 4000));
    mem::deallocate(cpu0, block, 4000);
    CHECK(pool_allocated(pool) == 0);
    CHECK(pool.stats().allocations.freed == 1);
  }
  pool.empty_cache();
  require_clean(cpu0);
  require_clean(cpu1);
}

TEST_CASE("frees find their pool among many segments, and not after a segment went back",
          "[mem_pool]") {
  require_clean(cpu0);
  constexpr std::size_t bytes = 1 * MiB;  // two blocks to a 2 MiB segment
  mem::MemPool first(cpu0);
  mem::MemPool second(cpu0);
  std::vector<void*> first_blocks;
  std::vector<void*> second_blocks;
  std::vector<void*> plain_blocks;
  for (int i = 0; i < 6; ++i) {  // the two pools' segments and the device's blocks interleaved
    {
      mem::use_mem_pool scope(first);
      first_blocks.push_back(mem::allocate(cpu0, bytes));
    }
    {
      mem::use_mem_pool scope(second);
      second_blocks.push_back(mem::allocate(cpu0, bytes));
    }
    plain_blocks.push_back(mem::allocate(cpu0, bytes));
  }
  CHECK(pool_reserved(first) == 3 * small_segment);
  CHECK(pool_reserved(second) == 3 * small_segment);
  // Freed in an order unlike the allocations' (last, first, middle ...), outside any scope.
  for (std::size_t i : {5, 0, 3, 1, 4, 2}) {
    mem::deallocate(cpu0, second_blocks[i], bytes);
    mem::deallocate(cpu0, plain_blocks[i], bytes);
    mem::deallocate(cpu0, first_blocks[i], bytes);
  }
  CHECK(first.stats().allocations.freed == 6);
  CHECK(second.stats().allocations.freed == 6);
  CHECK(first.stats().allocations.current == 0);
  CHECK(second.stats().allocations.current == 0);
  // Only the pools' segments are left allocated on the device.
  CHECK(mem::allocated(cpu0) == static_cast<std::size_t>(6 * small_segment));

  first.empty_cache();
  second.empty_cache();
  CHECK(mem::allocated(cpu0) == 0);

  // A segment given back is the device's again: a block the device's pool makes of it is freed
  // there, not to the pool that held it (which would refuse it and end the program).
  require_clean(cpu0);
  void* segment_begin = nullptr;
  {
    mem::use_mem_pool scope(first);
    segment_begin = mem::allocate(cpu0, bytes);  // the first block of a new segment
    mem::deallocate(cpu0, segment_begin, bytes);
  }
  first.empty_cache();
  // Best fit, lowest address: the segment's memory, at the start of the device's free 20 MiB.
  void* reused = mem::allocate(cpu0, 2 * MiB);
  CHECK(reused == segment_begin);
  mem::deallocate(cpu0, reused, 2 * MiB);
  CHECK(mem::allocated(cpu0) == 0);
  CHECK(first.stats().allocations.allocated == 7);
  CHECK(first.stats().allocations.freed == 7);
  require_clean(cpu0);
}

TEST_CASE("private pool errors name the device and leave the scopes as they were", "[mem_pool]") {
  const ts::Device missing{ts::DeviceType::cpu, 5};
  CHECK_THROWS_AS(mem::MemPool(missing), ts::device_error);
  CHECK_THROWS_WITH(mem::MemPool(missing), Catch::Contains("cpu:5"));

  require_clean(cpu0);
  {
    mem::MemPool pool(cpu0);
    std::vector<std::optional<mem::use_mem_pool>> scopes(16);
    for (auto& scope : scopes) scope.emplace(pool);
    CHECK_THROWS_WITH(mem::use_mem_pool(pool), Catch::Contains("16 scopes open"));
    CHECK(pool.use_count() == 17);  // the failed scope took no reference
    // Scopes ended out of order still leave the thread's stack consistent.
    scopes[3].reset();
    scopes.back().reset();
    void* p = mem::allocate(cpu0, 512);
    CHECK(pool_allocated(pool) == 512);
    mem::deallocate(cpu0, p, 512);
    for (auto& scope : scopes) scope.reset();
    void* q = mem::allocate(cpu0, 512);  // no scope: the device's pool
    CHECK(pool_allocated(pool) == 0);
    mem::deallocate(cpu0, q, 512);
    CHECK(pool.use_count() == 1);
  }
  require_clean(cpu0);
}

TEST_CASE("a private pool keeps its free segments when the device runs out of memory",
          "[mem_pool]") {
  // A CUDA graph captured in a private pool replays blocks that are free in the pool's books:
  // an out-of-memory on the device must not give them back (PyTorch's graph pools neither).
  require_clean(cpu0);
  mem::set_limit(cpu0, static_cast<std::size_t>(large_segment));
  {
    mem::MemPool pool(cpu0);
    {
      mem::use_mem_pool scope(pool);
      void* small = mem::allocate(cpu0, 1000);  // a 2 MiB segment of the pool
      mem::deallocate(cpu0, small, 1000);       // free in the pool's books, still its own
      CHECK(pool_reserved(pool) == small_segment);
      // 19 MiB needs a 20 MiB segment of the pool (or 19 MiB), which the device's pool, capped
      // at the 20 MiB segment it holds the pool's 2 MiB in, could give only with those back.
      CHECK_THROWS_AS(mem::allocate(cpu0, 19 * MiB), ts::out_of_memory_error);
      CHECK(pool_reserved(pool) == small_segment);  // kept
      CHECK(mem::allocated(cpu0) == static_cast<std::size_t>(small_segment));
      void* again = mem::allocate(cpu0, 1000);  // the same block, from the kept segment
      CHECK(pool_reserved(pool) == small_segment);
      mem::deallocate(cpu0, again, 1000);
    }
    // Its own empty_cache() still gives the segment back.
    pool.empty_cache();
    CHECK(pool_reserved(pool) == 0);
  }
  mem::set_limit(cpu0, mem::no_limit);
  require_clean(cpu0);
}

}  // namespace mem_pool_test
