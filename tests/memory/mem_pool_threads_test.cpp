// Private pools used from several threads at once (memory/mem_pool.hpp): each thread's scope
// serves only that thread, blocks freed on another thread find their pool (looked up in the
// device's table of segments while other threads change it), and the counts add up (run under
// ThreadSanitizer by CI's tsan stage).
#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/memory/mem_pool.hpp"
#include "tessera/memory/memory.hpp"
#include "memory/units.hpp"

namespace mem_pool_threads_test {  // one namespace per test file: unity builds

namespace mem = tessera::memory;
using memory_test_units::cpu0;
using memory_test_units::cpu1;
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

TEST_CASE("threads free private and ordinary blocks while the pool's segments come and go",
          "[mem_pool][threads]") {
  for (const tessera::Device device : {cpu0, cpu1}) {
    mem::empty_cache(device);
    REQUIRE(mem::allocated(device) == 0);
    mem::reset_accumulated(device);
  }
  constexpr int producers = 2;
  constexpr int consumers = 3;
  constexpr int blocks_per_producer = 64;
  constexpr std::size_t private_bytes = 1 * MiB;  // two to a 2 MiB segment: one new every other
  constexpr std::size_t plain_bytes = 1536;
  mem::MemPool pool(cpu0);
  std::mutex mutex;
  std::condition_variable ready;
  std::vector<void*> queue;
  int producers_done = 0;
  auto produce = [&] {
    mem::use_mem_pool scope(pool);
    for (int i = 0; i < blocks_per_producer; ++i) {
      void* block = mem::allocate(cpu0, private_bytes);
      {
        std::lock_guard lock(mutex);
        queue.push_back(block);
      }
      ready.notify_one();
    }
    std::lock_guard lock(mutex);
    ++producers_done;
    ready.notify_all();
  };
  auto consume = [&] {
    for (int freed = 0;; ++freed) {
      void* block = nullptr;
      {
        std::unique_lock lock(mutex);
        ready.wait(lock, [&] { return !queue.empty() || producers_done == producers; });
        if (queue.empty()) return;
        block = queue.back();
        queue.pop_back();
      }
      // An ordinary block of each device around the private free (no scope on this thread).
      void* plain_cpu0 = mem::allocate(cpu0, plain_bytes);
      void* plain_cpu1 = mem::allocate(cpu1, plain_bytes);
      mem::deallocate(cpu0, block, private_bytes);
      mem::deallocate(cpu1, plain_cpu1, plain_bytes);
      mem::deallocate(cpu0, plain_cpu0, plain_bytes);
      if (freed % 4 == 3) pool.empty_cache();  // free segments go back while others come
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < producers; ++i) threads.emplace_back(produce);
  for (int i = 0; i < consumers; ++i) threads.emplace_back(consume);
  for (std::thread& thread : threads) thread.join();

  const mem::MemoryStats stats = pool.stats();
  CHECK(stats.allocations.current == 0);
  CHECK(stats.allocations.allocated == producers * blocks_per_producer);
  CHECK(stats.allocations.freed == producers * blocks_per_producer);
  CHECK(stats.allocated_bytes.freed ==
        static_cast<std::int64_t>(producers * blocks_per_producer * private_bytes));
  // Every ordinary block went back to its own device's pool.
  const mem::MemoryStats other = mem::stats(cpu1);
  CHECK(other.allocations.current == 0);
  CHECK(other.allocations.allocated == producers * blocks_per_producer);
  CHECK(other.allocations.freed == producers * blocks_per_producer);
  pool.empty_cache();
  CHECK(pool.stats().reserved_bytes.current == 0);
  for (const tessera::Device device : {cpu0, cpu1}) {
    mem::empty_cache(device);
    CHECK(mem::allocated(device) == 0);
    CHECK(mem::reserved(device) == 0);
  }
}

}  // namespace mem_pool_threads_test
