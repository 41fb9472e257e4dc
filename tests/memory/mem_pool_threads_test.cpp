// Private pools used from several threads at once (memory/mem_pool.hpp): each thread's scope
// serves only that thread, blocks freed on another thread find their pool, and the counts add up
// (run under ThreadSanitizer by CI's tsan stage).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/memory/mem_pool.hpp"
#include "tessera/memory/memory.hpp"
#include "memory/units.hpp"

namespace mem_pool_threads_test {  // one namespace per test file: unity builds

namespace mem = tessera::memory;
using memory_test_units::cpu0;
using memory_test_units::MiB;

TEST_CASE("threads with private pools of their own, and one without", "[mem_pool][threads]") {
  mem::empty_cache(cpu0);
  REQUIRE(mem::allocated(cpu0) == 0);
  constexpr int rounds = 200;
  constexpr std::size_t bytes = 1536;  // 3 x 512: no rounding
  mem::MemPool first(cpu0);
  mem::MemPool second(cpu0);
  std::vector<void*> handed_over(rounds, nullptr);
  auto worker = [&](mem::MemPool& pool, bool hand_over) {
    mem::use_mem_pool scope(pool);
    for (int i = 0; i < rounds; ++i) {
      void* p = mem::allocate(cpu0, bytes);
      if (hand_over) {
        handed_over[static_cast<std::size_t>(i)] = p;  // freed by the main thread below
      } else {
        mem::deallocate(cpu0, p, bytes);
      }
    }
  };
  std::vector<void*> plain;
  std::thread a(worker, std::ref(first), true);
  std::thread b(worker, std::ref(second), false);
  for (int i = 0; i < rounds; ++i) plain.push_back(mem::allocate(cpu0, bytes));  // no scope
  a.join();
  b.join();
  CHECK(first.stats().allocations.current == rounds);
  CHECK(first.stats().allocated_bytes.current == static_cast<std::int64_t>(rounds * bytes));
  CHECK(second.stats().allocations.current == 0);
  CHECK(second.stats().allocations.peak == 1);
  // The main thread's blocks came from the device's pool, and the first pool's blocks go back to
  // it from this thread, which has no scope.
  for (void* p : handed_over) mem::deallocate(cpu0, p, bytes);
  CHECK(first.stats().allocations.current == 0);
  for (void* p : plain) mem::deallocate(cpu0, p, bytes);
  first.empty_cache();
  second.empty_cache();
  mem::empty_cache(cpu0);
  CHECK(mem::allocated(cpu0) == 0);
  CHECK(mem::reserved(cpu0) == 0);
}

}  // namespace mem_pool_threads_test
