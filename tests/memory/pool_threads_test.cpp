// Thread-safety of memory/pool.hpp and the registry: many threads allocating and freeing on one
// device at once (run under ThreadSanitizer in CI, label `threads`).
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/memory/host_memory_resource.hpp"
#include "tessera/memory/limit_resource_adaptor.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/memory/pool.hpp"

namespace pool_threads_test {  // one namespace per test file: unity builds compile several together

namespace mem = tessera::memory;
using tessera::Device;
using tessera::DeviceType;

namespace {
constexpr int num_threads = 8;
constexpr std::size_t MiB = 1024 * 1024;

// Marks the first and last 64 bytes of a block (cheap enough for TSan, and any overlap of two
// blocks that the pool hands out must cover one of the ends).
void mark(void* p, std::size_t bytes, unsigned char pattern) {
  auto* b = static_cast<unsigned char*>(p);
  std::memset(b, pattern, std::min<std::size_t>(64, bytes));
  if (bytes > 64) std::memset(b + bytes - 64, pattern, 64);
}
bool marked(const void* p, std::size_t bytes, unsigned char pattern) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < std::min<std::size_t>(64, bytes); ++i) {
    if (b[i] != pattern || b[bytes - 1 - i] != pattern) return false;
  }
  return true;
}

// Each thread keeps a ring of live blocks, freeing one and allocating another at every step.
template <class Allocate, class Deallocate>
void churn(int thread, int steps, Allocate&& allocate, Deallocate&& deallocate,
           std::atomic<int>& corrupted, std::atomic<long>& ooms) {
  struct slot {
    void* pointer = nullptr;
    std::size_t bytes = 0;
    unsigned char pattern = 0;
  };
  std::vector<slot> ring(16);
  std::mt19937_64 rng(1234 + static_cast<unsigned>(thread));
  std::uniform_real_distribution<double> log_size(0.0, std::log(4.0 * MiB));
  for (int step = 0; step < steps; ++step) {
    slot& s = ring[static_cast<std::size_t>(step) % ring.size()];
    if (s.pointer != nullptr) {
      if (!marked(s.pointer, s.bytes, s.pattern)) ++corrupted;
      deallocate(s.pointer, s.bytes);
      s.pointer = nullptr;
    }
    std::size_t bytes = std::max<std::size_t>(1, static_cast<std::size_t>(std::exp(log_size(rng))));
    try {
      s.pointer = allocate(bytes);
    } catch (const tessera::out_of_memory_error&) {
      ++ooms;
      continue;
    }
    s.bytes = bytes;
    s.pattern = static_cast<unsigned char>(thread * 31 + step % 7 + 1);
    mark(s.pointer, bytes, s.pattern);
  }
  for (slot& s : ring) {
    if (s.pointer == nullptr) continue;
    if (!marked(s.pointer, s.bytes, s.pattern)) ++corrupted;
    deallocate(s.pointer, s.bytes);
  }
}
}  // namespace

TEST_CASE("registry: concurrent first use creates one pool per device", "[memory][threads]") {
  std::vector<std::thread> threads;
  std::vector<mem::device_memory_resource*> seen(num_threads);
  for (int t = 0; t < num_threads; ++t) {
    threads.emplace_back([t, &seen] {
      seen[static_cast<std::size_t>(t)] = &mem::get_device_resource(Device{DeviceType::cpu, 1});
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto* resource : seen) CHECK(resource == seen[0]);
}

TEST_CASE("memory: 8 threads allocate and free on cpu:0 at once", "[memory][threads]") {
  const Device cpu0{DeviceType::cpu, 0};
  mem::empty_cache(cpu0);
  const mem::MemoryStats before = mem::stats(cpu0);
  constexpr int steps = 3000;
  std::atomic<int> corrupted{0};
  std::atomic<long> ooms{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) {
    threads.emplace_back([&, t] {
      churn(
          t, steps, [&](std::size_t n) { return mem::allocate(cpu0, n); },
          [&](void* p, std::size_t n) { mem::deallocate(cpu0, p, n); }, corrupted, ooms);
    });
  }
  // A reader of statistics at the same time.
  std::thread reader([&] {
    while (!done.load()) {
      mem::MemoryStats s = mem::stats(cpu0);
      if (s.allocated_bytes.current > s.reserved_bytes.current) ++corrupted;
      (void)mem::summary(cpu0);
    }
  });
  for (auto& thread : threads) thread.join();
  done = true;
  reader.join();
  CHECK(corrupted == 0);
  CHECK(ooms == 0);
  const mem::MemoryStats after = mem::stats(cpu0);
  CHECK(after.allocated_bytes.current == 0);
  CHECK(after.active_bytes.current == 0);
  CHECK(after.inactive_split_bytes.current == 0);
  CHECK(after.allocations.allocated - before.allocations.allocated == num_threads * steps);
  CHECK(after.allocations.freed - before.allocations.freed == num_threads * steps);
  CHECK(mem::allocated(cpu0) == 0);
  mem::empty_cache(cpu0);
  CHECK(mem::reserved(cpu0) == 0);
}

TEST_CASE("pool: threads hitting a moving limit get OOMs, never corruption", "[pool][threads]") {
  mem::pool_resource<mem::limit_resource_adaptor<mem::host_memory_resource>> pool{
      Device{DeviceType::cpu, 0}};
  constexpr int steps = 1500;
  std::atomic<int> corrupted{0};
  std::atomic<long> ooms{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) {
    threads.emplace_back([&, t] {
      churn(
          t, steps, [&](std::size_t n) { return pool.allocate(n); },
          [&](void* p, std::size_t n) { pool.deallocate(p, n); }, corrupted, ooms);
    });
  }
  std::thread limiter([&] {
    for (int i = 0; !done.load(); ++i) {
      pool.set_limit(i % 2 == 0 ? 64 * MiB : mem::no_limit);
      std::this_thread::yield();
    }
  });
  for (auto& thread : threads) thread.join();
  done = true;
  limiter.join();
  CHECK(corrupted == 0);
  mem::MemoryStats s = pool.stats();
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.num_ooms == ooms.load());
  CHECK(s.allocations.allocated == num_threads * steps - ooms.load());
  pool.empty_cache();
  CHECK(pool.stats().reserved_bytes.current == 0);
  CHECK(pool.upstream().held() == 0);
}

}  // namespace pool_threads_test
