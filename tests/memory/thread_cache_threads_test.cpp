// The per-thread caches in front of the CPU pools (memory/detail/thread_cache.hpp): a thread's
// freed small block serves its next request of that size without the pool, and the statistics
// stay those of PyTorch's allocator. The expected figures are the 512-byte rounding worked out by
// hand. Runs under ThreadSanitizer in CI (label `threads`).
#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/memory/memory.hpp"

namespace thread_cache_threads_test {

namespace mem = tessera::memory;
using tessera::Device;
using tessera::DeviceType;

const Device cpu1{DeviceType::cpu, 1};

// A thread caches the blocks of its current device only: the tests' threads drive cpu:1.
void drive_cpu1() { tessera::cpu::set_device(1); }

// A clean start: nothing cached by this thread, nothing live, every segment returned.
void clean() {
  drive_cpu1();
  mem::empty_cache(cpu1);
  REQUIRE(mem::allocated(cpu1) == 0);
  REQUIRE(mem::reserved(cpu1) == 0);
  mem::reset_peak(cpu1);
  mem::reset_accumulated(cpu1);
}

TEST_CASE("one thread: a freed small block serves the next request of its size",
          "[memory][threads]") {
  clean();
  const auto& counters = tessera::memory::detail::thread_cache::local()->of(1).statistics();
  const std::int64_t hits_before = counters.hit_blocks.load();
  const std::int64_t hit_bytes_before = counters.hit_bytes.load();
  void* a = mem::allocate(cpu1, 4000);  // 4096 counted
  mem::deallocate(cpu1, a, 4000);
  void* b = mem::allocate(cpu1, 4000);  // no query in between (queries flush the cache)
  CHECK(b == a);
  CHECK(counters.hit_blocks.load() - hits_before == 1);
  CHECK(counters.hit_bytes.load() - hit_bytes_before == 4096);
  CHECK(mem::allocated(cpu1) == 4096);
  mem::deallocate(cpu1, b, 4000);
  // Two hand-outs and two frees, whichever served them.
  const mem::MemoryStats s = mem::stats(cpu1);
  CHECK(s.allocations.allocated == 2);
  CHECK(s.allocations.freed == 2);
  CHECK(s.allocated_bytes.allocated == 2 * 4096);
  CHECK(s.requested_bytes.allocated == 2 * 4000);
  CHECK(s.requested_bytes.freed == 2 * 4000);
  CHECK(s.allocations.current == 0);
  CHECK(s.active_bytes.current == 0);
  CHECK(s.small_pool.allocated_bytes.current == 0);
  CHECK(s.small_pool.allocations.allocated == 2);
  mem::empty_cache(cpu1);
  CHECK(mem::reserved(cpu1) == 0);
}

TEST_CASE("one thread: peaks are those without a cache", "[memory][threads]") {
  clean();
  void* a = mem::allocate(cpu1, 10000);  // 10240
  mem::deallocate(cpu1, a, 10000);       // cached
  void* c = mem::allocate(cpu1, 3000);   // 3072: a miss returns the cached block first
  CHECK(mem::peak_allocated(cpu1) == 10240);
  void* d = mem::allocate(cpu1, 3000);
  CHECK(mem::peak_allocated(cpu1) == 10240);
  void* e = mem::allocate(cpu1, 6000);  // 6144: 3072 * 2 + 6144 = 12288 live
  CHECK(mem::peak_allocated(cpu1) == 12288);
  mem::deallocate(cpu1, c, 3000);
  mem::deallocate(cpu1, d, 3000);
  void* f = mem::allocate(cpu1, 3000);  // a hit: 9216 live, the peak stays
  CHECK(mem::allocated(cpu1) == 9216);
  CHECK(mem::peak_allocated(cpu1) == 12288);
  mem::deallocate(cpu1, e, 6000);
  mem::deallocate(cpu1, f, 3000);
  CHECK(mem::allocated(cpu1) == 0);
  CHECK(mem::stats(cpu1).allocations.allocated == 5);
  mem::empty_cache(cpu1);
  CHECK(mem::reserved(cpu1) == 0);
}

TEST_CASE("large blocks bypass the cache", "[memory][threads]") {
  clean();
  void* big = mem::allocate(cpu1, 100000);  // above 64 KiB
  mem::deallocate(cpu1, big, 100000);
  const mem::MemoryStats s = mem::stats(cpu1);
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.inactive_split_bytes.current == 0);  // the block went back and merged at once
  mem::empty_cache(cpu1);
  CHECK(mem::reserved(cpu1) == 0);
}

TEST_CASE("other threads' cached blocks are not allocated; they return when the thread exits",
          "[memory][threads]") {
  clean();
  std::mutex mutex;
  std::condition_variable changed;
  int stage = 0;
  std::thread worker([&] {
    drive_cpu1();
    void* p = mem::allocate(cpu1, 1000);  // 1024
    void* q = mem::allocate(cpu1, 1000);
    mem::deallocate(cpu1, p, 1000);  // both cached by the worker
    mem::deallocate(cpu1, q, 1000);
    void* r = mem::allocate(cpu1, 1000);  // a hit
    mem::deallocate(cpu1, r, 1000);
    std::unique_lock lock(mutex);
    stage = 1;
    changed.notify_all();
    changed.wait(lock, [&] { return stage == 2; });
  });
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return stage == 1; });
  }
  // The worker is parked with two blocks cached.
  mem::MemoryStats s = mem::stats(cpu1);
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.allocations.current == 0);
  CHECK(s.requested_bytes.current == 0);
  CHECK(s.allocations.allocated == 3);
  CHECK(s.allocations.freed == 3);
  CHECK(s.reserved_bytes.current == 2 * 1024 * 1024);  // one small segment
  mem::empty_cache(cpu1);  // the worker's blocks keep their segment
  CHECK(mem::reserved(cpu1) == 2 * 1024 * 1024);
  {
    std::lock_guard lock(mutex);
    stage = 2;
  }
  changed.notify_all();
  worker.join();
  s = mem::stats(cpu1);
  CHECK(s.allocations.allocated == 3);
  CHECK(s.allocations.freed == 3);
  CHECK(s.allocated_bytes.allocated == 3 * 1024);
  mem::empty_cache(cpu1);
  CHECK(mem::reserved(cpu1) == 0);
  mem::reset_accumulated(cpu1);
  CHECK(mem::stats(cpu1).allocations.allocated == 0);
}

TEST_CASE("two threads churn one device; totals add up", "[memory][threads]") {
  clean();
  constexpr int steps = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([t] {
      drive_cpu1();
      std::vector<void*> live(4, nullptr);
      for (int i = 0; i < steps; ++i) {
        const std::size_t bytes = 512u * static_cast<std::size_t>(1 + (i + t) % 3);
        void*& slot = live[static_cast<std::size_t>(i) % live.size()];
        if (slot != nullptr) {
          mem::deallocate(cpu1, slot, 512u * static_cast<std::size_t>(1 + (i - 4 + t) % 3));
        }
        slot = mem::allocate(cpu1, bytes);
        static_cast<unsigned char*>(slot)[bytes - 1] = static_cast<unsigned char>(i);
      }
      for (std::size_t k = 0; k < live.size(); ++k) {
        const int i = steps - 4 + static_cast<int>(k);
        mem::deallocate(cpu1, live[k], 512u * static_cast<std::size_t>(1 + (i + t) % 3));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const mem::MemoryStats s = mem::stats(cpu1);
  CHECK(s.allocations.allocated == 2 * steps);
  CHECK(s.allocations.freed == 2 * steps);
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.requested_bytes.current == 0);
  // Every byte handed out: each thread cycles through 512, 1024 and 1536.
  std::int64_t bytes = 0;
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < steps; ++i) bytes += 512 * (1 + (i + t) % 3);
  }
  CHECK(s.allocated_bytes.allocated == bytes);
  CHECK(s.allocated_bytes.freed == bytes);
  mem::empty_cache(cpu1);
  CHECK(mem::reserved(cpu1) == 0);
}

TEST_CASE("a block of another device than the thread's goes back to its pool at once",
          "[memory][threads]") {
  clean();
  const auto& counters = tessera::memory::detail::thread_cache::local()->of(1).statistics();
  const std::int64_t hits_before = counters.hit_blocks.load();
  tessera::cpu::set_device(0);  // this thread now drives cpu:0 (a pipeline stage's neighbour)
  void* a = mem::allocate(cpu1, 4000);
  mem::deallocate(cpu1, a, 4000);  // not cached: the pool has it back
  void* b = mem::allocate(cpu1, 4000);
  CHECK(counters.hit_blocks.load() == hits_before);
  mem::deallocate(cpu1, b, 4000);
  drive_cpu1();
  const mem::MemoryStats s = mem::stats(cpu1);
  CHECK(s.allocations.allocated == 2);
  CHECK(s.allocations.freed == 2);
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.small_pool.allocations.allocated == 2);
  mem::empty_cache(cpu1);
  CHECK(mem::reserved(cpu1) == 0);
}

}  // namespace thread_cache_threads_test
