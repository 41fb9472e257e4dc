// The pool_resource test suite, written once and instantiated for every upstream (like RMM's
// mr_ref_test.hpp): tests/memory/pool_test.cpp runs it over host memory and a limit adaptor over
// host memory, tests/cuda/memory_test.cu over cudaMalloc and cudaMallocAsync. Expected values are
// worked out by hand from PyTorch's size policy, never read back from the code.
//
// A fixture type F provides:
//   using pool_type;                          the pool_resource under test
//   static constexpr bool has_limit;          whether pool_type has set_limit (limit adaptor)
//   static std::unique_ptr<pool_type> make(); a fresh pool
//   static tessera::Device device();          the device it is made for
//   static void fill(void*, size_t, uint8_t); writes a byte pattern into device memory
//   static bool holds(const void*, size_t, uint8_t);  checks it is still there
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/memory/pool.hpp"
#include "memory/units.hpp"

namespace pool_suite {

using tessera::memory::MemoryStats;
using memory_test_units::KiB;
using memory_test_units::MiB;

// PyTorch's rounding, written out here independently of size_policy.hpp.
inline std::size_t expected_round(std::size_t bytes) {
  if (bytes <= 512) return 512;
  return (bytes + 511) / 512 * 512;
}

inline std::int64_t i64(std::size_t value) { return static_cast<std::int64_t>(value); }

template <class F>
void rounding_and_reservation() {
  SECTION("4, 512, 516 and 4096 bytes (1, 128, 129, 1024 floats) account 512, 512, 1024, 4096") {
    auto pool = F::make();
    const std::size_t requests[] = {4, 512, 516, 4096};
    const std::int64_t rounded[] = {512, 512, 1024, 4096};
    std::vector<void*> pointers;
    std::int64_t expected_allocated = 0;
    std::int64_t expected_requested = 0;
    for (int i = 0; i < 4; ++i) {
      pointers.push_back(pool->allocate(requests[i]));
      REQUIRE(pointers.back() != nullptr);
      expected_allocated += rounded[i];
      expected_requested += i64(requests[i]);
      MemoryStats stats = pool->stats();
      CHECK(stats.allocated_bytes.current == expected_allocated);
      CHECK(stats.requested_bytes.current == expected_requested);
      CHECK(stats.allocations.current == i + 1);
      // All four fit in the first 2 MiB small segment.
      CHECK(stats.reserved_bytes.current == i64(2 * MiB));
      CHECK(stats.segments.current == 1);
      CHECK(stats.reserved_bytes.current >= stats.allocated_bytes.current);
    }
    CHECK(pool->stats().allocated_bytes.current == 512 + 512 + 1024 + 4096);
    CHECK(pool->stats().small_pool.allocated_bytes.current == 6144);
    CHECK(pool->stats().large_pool.allocated_bytes.current == 0);
    for (int i = 0; i < 4; ++i) pool->deallocate(pointers[i], requests[i]);
    MemoryStats stats = pool->stats();
    CHECK(stats.allocated_bytes.current == 0);
    CHECK(stats.requested_bytes.current == 0);
    CHECK(stats.allocated_bytes.allocated == 6144);
    CHECK(stats.allocated_bytes.freed == 6144);
    CHECK(stats.allocated_bytes.peak == 6144);
    CHECK(stats.reserved_bytes.current == i64(2 * MiB));  // cached, not returned
  }
  SECTION("the first small allocation reserves exactly one 2 MiB segment") {
    auto pool = F::make();
    void* p = pool->allocate(1);
    CHECK(pool->stats().reserved_bytes.current == i64(2 * MiB));
    CHECK(pool->stats().small_pool.reserved_bytes.current == i64(2 * MiB));
    CHECK(pool->stats().allocated_bytes.current == 512);
    // 1 MiB is still small: it fits in the same segment.
    void* q = pool->allocate(1 * MiB);
    CHECK(pool->stats().reserved_bytes.current == i64(2 * MiB));
    CHECK(pool->stats().segments.current == 1);
    pool->deallocate(q, 1 * MiB);
    pool->deallocate(p, 1);
  }
  SECTION("a 1.5 MiB request reserves a 20 MiB segment and is split from it") {
    auto pool = F::make();
    void* p = pool->allocate(1536 * KiB);
    MemoryStats stats = pool->stats();
    CHECK(stats.reserved_bytes.current == i64(20 * MiB));
    CHECK(stats.large_pool.reserved_bytes.current == i64(20 * MiB));
    CHECK(stats.small_pool.reserved_bytes.current == 0);
    CHECK(stats.allocated_bytes.current == i64(1536 * KiB));
    CHECK(stats.inactive_split_bytes.current == i64(20 * MiB - 1536 * KiB));
    CHECK(stats.inactive_split.current == 1);
    // A second medium request comes from the rest of the same segment.
    void* q = pool->allocate(3 * MiB);
    CHECK(pool->stats().reserved_bytes.current == i64(20 * MiB));
    CHECK(static_cast<char*>(q) == static_cast<char*>(p) + 1536 * KiB);
    pool->deallocate(q, 3 * MiB);
    pool->deallocate(p, 1536 * KiB);
    CHECK(pool->stats().inactive_split_bytes.current == 0);
  }
  SECTION("a 12 MiB request reserves exactly 12 MiB") {
    auto pool = F::make();
    void* p = pool->allocate(12 * MiB);
    CHECK(pool->stats().reserved_bytes.current == i64(12 * MiB));
    CHECK(pool->stats().allocated_bytes.current == i64(12 * MiB));
    pool->deallocate(p, 12 * MiB);
  }
  SECTION("an 11 MiB request reserves 12 MiB and, unsplit (1 MiB rest), allocates all 12") {
    auto pool = F::make();
    void* p = pool->allocate(11 * MiB);
    MemoryStats stats = pool->stats();
    CHECK(stats.reserved_bytes.current == i64(12 * MiB));
    CHECK(stats.allocated_bytes.current == i64(12 * MiB));
    CHECK(stats.requested_bytes.current == i64(11 * MiB));
    CHECK(stats.inactive_split_bytes.current == 0);
    pool->deallocate(p, 11 * MiB);
  }
  SECTION("0 bytes: nullptr and nothing accounted; deallocate(nullptr) is a no-op") {
    auto pool = F::make();
    CHECK(pool->allocate(0) == nullptr);
    pool->deallocate(nullptr, 0);
    CHECK(pool->stats() == MemoryStats{});
  }
}

template <class F>
void peaks() {
  auto pool = F::make();
  void* a = pool->allocate(3000);   // 3072
  void* b = pool->allocate(10000);  // 10240
  pool->deallocate(a, 3000);
  MemoryStats stats = pool->stats();
  CHECK(stats.allocated_bytes.current == 10240);
  CHECK(stats.allocated_bytes.peak == 3072 + 10240);
  pool->reset_peak();
  stats = pool->stats();
  CHECK(stats.allocated_bytes.peak == 10240);
  CHECK(stats.reserved_bytes.peak == i64(2 * MiB));
  CHECK(stats.small_pool.allocated_bytes.peak == 10240);
  CHECK(stats.allocations.peak == 1);
  void* c = pool->allocate(512);
  CHECK(pool->stats().allocated_bytes.peak == 10240 + 512);
  pool->deallocate(c, 512);
  pool->deallocate(b, 10000);
  CHECK(pool->stats().allocated_bytes.peak == 10240 + 512);
  CHECK(pool->stats().allocated_bytes.allocated == 3072 + 10240 + 512);
}

template <class F>
void empty_cache_keeps_non_releasable() {
  auto pool = F::make();
  void* small_live = pool->allocate(512);    // small segment, stays live
  void* small_freed = pool->allocate(4096);  // same segment
  void* large_freed = pool->allocate(12 * MiB);
  void* medium_freed = pool->allocate(2 * MiB);  // a 20 MiB segment
  pool->deallocate(small_freed, 4096);
  pool->deallocate(large_freed, 12 * MiB);
  pool->deallocate(medium_freed, 2 * MiB);
  MemoryStats stats = pool->stats();
  CHECK(stats.reserved_bytes.current == i64(2 * MiB + 12 * MiB + 20 * MiB));
  CHECK(stats.segments.current == 3);
  // The live 512 B block pins its segment: the rest of it is non-releasable.
  CHECK(stats.inactive_split_bytes.current == i64(2 * MiB - 512));
  CHECK(stats.inactive_split.current == 1);

  pool->empty_cache();
  stats = pool->stats();
  CHECK(stats.reserved_bytes.current == i64(2 * MiB));
  CHECK(stats.segments.current == 1);
  CHECK(stats.allocated_bytes.current == 512);
  CHECK(stats.inactive_split_bytes.current == i64(2 * MiB - 512));
  CHECK(stats.reserved_bytes.freed == i64(12 * MiB + 20 * MiB));
  CHECK(stats.num_device_free == 2);

  pool->deallocate(small_live, 512);
  CHECK(pool->stats().inactive_split_bytes.current == 0);
  pool->empty_cache();
  stats = pool->stats();
  CHECK(stats.reserved_bytes.current == 0);
  CHECK(stats.segments.current == 0);
  CHECK(stats.num_device_alloc == 3);
  CHECK(stats.num_device_free == 3);
}

template <class F>
void split_and_merge() {
  SECTION("small pool: four 512 KiB blocks fill a segment; freed in any order they merge") {
    auto pool = F::make();
    void* p[4];
    for (auto& q : p) q = pool->allocate(512 * KiB);
    for (int i = 1; i < 4; ++i) {
      CHECK(static_cast<char*>(p[i]) == static_cast<char*>(p[0]) + i * 512 * KiB);
    }
    CHECK(pool->stats().segments.current == 1);
    CHECK(pool->stats().inactive_split.current == 0);  // the segment is exactly full
    pool->deallocate(p[1], 512 * KiB);                 // the middle
    CHECK(pool->stats().inactive_split.current == 1);
    CHECK(pool->stats().inactive_split_bytes.current == i64(512 * KiB));
    pool->deallocate(p[2], 512 * KiB);  // merges with p[1]
    CHECK(pool->stats().inactive_split.current == 1);
    CHECK(pool->stats().inactive_split_bytes.current == i64(1 * MiB));
    pool->deallocate(p[0], 512 * KiB);
    pool->deallocate(p[3], 512 * KiB);  // the whole segment is one free block again
    CHECK(pool->stats().inactive_split.current == 0);
    CHECK(pool->stats().inactive_split_bytes.current == 0);
    // Two 1 MiB requests take the whole segment, front first, without a new segment.
    void* a = pool->allocate(1 * MiB);
    void* b = pool->allocate(1 * MiB);
    CHECK(a == p[0]);
    CHECK(static_cast<char*>(b) == static_cast<char*>(p[0]) + 1 * MiB);
    CHECK(pool->stats().segments.current == 1);
    CHECK(pool->stats().num_device_alloc == 1);
    pool->deallocate(a, 1 * MiB);
    pool->deallocate(b, 1 * MiB);
  }
  SECTION("large pool: free the middle, then its neighbours: the 20 MiB segment is whole again") {
    auto pool = F::make();
    void* a = pool->allocate(3 * MiB);
    void* b = pool->allocate(3 * MiB);
    void* c = pool->allocate(3 * MiB);
    CHECK(pool->stats().reserved_bytes.current == i64(20 * MiB));
    CHECK(static_cast<char*>(b) == static_cast<char*>(a) + 3 * MiB);
    CHECK(static_cast<char*>(c) == static_cast<char*>(a) + 6 * MiB);
    pool->deallocate(b, 3 * MiB);
    pool->deallocate(a, 3 * MiB);
    pool->deallocate(c, 3 * MiB);
    MemoryStats stats = pool->stats();
    CHECK(stats.inactive_split.current == 0);
    CHECK(stats.large_pool.inactive_split_bytes.current == 0);
    // 19 MiB takes the whole 20 MiB block (a 1 MiB rest is not split off): same address, no new
    // segment, and all 20 MiB count as allocated.
    void* whole = pool->allocate(19 * MiB);
    CHECK(whole == a);
    stats = pool->stats();
    CHECK(stats.segments.current == 1);
    CHECK(stats.num_device_alloc == 1);
    CHECK(stats.allocated_bytes.current == i64(20 * MiB));
    pool->deallocate(whole, 19 * MiB);
  }
}

template <class F>
void best_fit() {
  auto pool = F::make();
  // Free blocks of 1 KiB, 4 KiB and 2 KiB (in that address order), kept apart by live separators.
  void* one = pool->allocate(1 * KiB);
  void* sep1 = pool->allocate(512);
  void* four = pool->allocate(4 * KiB);
  void* sep2 = pool->allocate(512);
  void* two = pool->allocate(2 * KiB);
  void* sep3 = pool->allocate(512);
  pool->deallocate(one, 1 * KiB);
  pool->deallocate(four, 4 * KiB);
  pool->deallocate(two, 2 * KiB);
  CHECK(pool->stats().inactive_split.current == 4);  // three holes and the segment's tail
  void* p = pool->allocate(1536);
  CHECK(p == two);
  void* q = pool->allocate(3 * KiB);  // the 4 KiB hole beats the tail of the segment
  CHECK(q == four);
  void* r = pool->allocate(1 * KiB);  // exact fit
  CHECK(r == one);
  for (auto [pointer, bytes] : {std::pair{p, std::size_t{1536}},
                                {q, 3 * KiB},
                                {r, 1 * KiB},
                                {sep1, 512},
                                {sep2, 512},
                                {sep3, 512}}) {
    pool->deallocate(pointer, bytes);
  }
  CHECK(pool->stats().allocated_bytes.current == 0);
  CHECK(pool->stats().inactive_split.current == 0);
}

template <class F>
void bad_input() {
  auto pool = F::make();
  void* p = pool->allocate(1000);
  MemoryStats before = pool->stats();
  int local = 0;
  CHECK_THROWS_AS(pool->deallocate(&local, 4), std::invalid_argument);
  CHECK_THROWS_WITH(pool->deallocate(&local, 4), Catch::Contains(F::device().str()));
  CHECK_THROWS_AS(pool->deallocate(p, 999), std::invalid_argument);
  CHECK_THROWS_WITH(pool->deallocate(p, 999), Catch::Contains("1000") && Catch::Contains("999"));
  CHECK_THROWS_AS(pool->record_stream(&local, {}), std::invalid_argument);
  CHECK(pool->stats() == before);
  pool->deallocate(p, 1000);
  CHECK_THROWS_AS(pool->deallocate(p, 1000), std::invalid_argument);  // double free
  // Beyond any memory: refused at once, counted as an OOM, nothing else changes.
  before = pool->stats();
  CHECK_THROWS_AS(pool->allocate(std::size_t{1} << 63), tessera::out_of_memory_error);
  MemoryStats after = pool->stats();
  CHECK(after.num_ooms == before.num_ooms + 1);
  after.num_ooms = before.num_ooms;
  CHECK(after == before);
}

template <class F>
void limit_and_oom() {
  if constexpr (F::has_limit) {
    SECTION("a request over the limit throws, says why, and changes nothing") {
      auto pool = F::make();
      void* small = pool->allocate(512);  // 2 MiB reserved
      pool->set_limit(4 * MiB);
      CHECK(pool->limit() == 4 * MiB);
      MemoryStats before = pool->stats();
      // 3 MiB needs a 20 MiB segment: 2 + 20 > 4. Nothing cached can be released (the small
      // segment holds a live block), so the retry fails too.
      std::string message;
      try {
        (void)pool->allocate(3 * MiB);
        FAIL("no out_of_memory_error");
      } catch (const tessera::out_of_memory_error& e) {
        message = e.what();
      }
      CHECK_THAT(message, Catch::Contains("Tried to allocate 3.00 MiB"));
      CHECK_THAT(message, Catch::Contains(F::device().str()));
      CHECK_THAT(message, Catch::Contains("4.00 MiB limit"));
      CHECK_THAT(message, Catch::Contains("512 B allocated"));
      CHECK_THAT(message, Catch::Contains("2.00 MiB reserved"));
      MemoryStats after = pool->stats();
      CHECK(after.num_ooms == before.num_ooms + 1);
      CHECK(after.num_alloc_retries == before.num_alloc_retries + 1);
      CHECK(after.allocated_bytes == before.allocated_bytes);
      // Everything else is exactly as before.
      after.num_ooms = before.num_ooms;
      after.num_alloc_retries = before.num_alloc_retries;
      CHECK(after == before);
      // A later small request still succeeds from the cached segment.
      void* next = pool->allocate(64 * KiB);
      CHECK(next != nullptr);
      CHECK(pool->stats().allocated_bytes.current == i64(512 + 64 * KiB));
      pool->deallocate(next, 64 * KiB);
      pool->deallocate(small, 512);
    }
    SECTION("OOM at the upstream: cached segments are released and the retry succeeds") {
      auto pool = F::make();
      pool->set_limit(22 * MiB);
      // Eight 1 MiB requests fill four small segments; freed, they stay cached (8 MiB). Small
      // segments cannot serve a large request.
      void* blocks[8];
      for (auto& b : blocks) b = pool->allocate(1 * MiB);
      for (auto& b : blocks) pool->deallocate(b, 1 * MiB);
      void* small = pool->allocate(512);  // pins one cached segment
      CHECK(pool->stats().reserved_bytes.current == i64(8 * MiB));
      // 16 MiB: 8 + 16 > 22, but releasing the three unpinned segments leaves 2 + 16 <= 22.
      void* big = pool->allocate(16 * MiB);
      MemoryStats stats = pool->stats();
      CHECK(stats.num_alloc_retries == 1);
      CHECK(stats.num_ooms == 0);
      CHECK(stats.reserved_bytes.current == i64(18 * MiB));
      CHECK(stats.segments.current == 2);
      CHECK(stats.num_device_free == 3);
      CHECK(stats.allocated_bytes.current == i64(512 + 16 * MiB));
      pool->deallocate(big, 16 * MiB);
      pool->deallocate(small, 512);
    }
    SECTION("lowering the limit below reserved empties the cache first") {
      auto pool = F::make();
      void* keep = pool->allocate(512);
      void* big = pool->allocate(12 * MiB);
      pool->deallocate(big, 12 * MiB);
      CHECK(pool->stats().reserved_bytes.current == i64(14 * MiB));
      pool->set_limit(8 * MiB);
      CHECK(pool->stats().reserved_bytes.current == i64(2 * MiB));
      CHECK_THROWS_AS(pool->allocate(12 * MiB), tessera::out_of_memory_error);
      pool->set_limit(tessera::memory::no_limit);
      void* again = pool->allocate(12 * MiB);
      pool->deallocate(again, 12 * MiB);
      pool->deallocate(keep, 512);
    }
  }
}

// Thousands of random allocations and frees checked against a shadow model after every step.
template <class F>
void randomized(std::uint64_t seed = 20240607, int steps = 3000) {
  auto pool = F::make();
  struct live {
    std::size_t bytes;
    std::uint8_t pattern;
  };
  std::map<char*, live> shadow;  // by address, to check that live blocks never overlap
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(0.0, std::log(4.0 * MiB));
  std::int64_t small_allocated = 0;
  std::int64_t large_rounded = 0;
  std::int64_t requested = 0;
  std::int64_t large_count = 0;
  std::uint8_t next_pattern = 1;

  auto check_stats = [&] {
    MemoryStats s = pool->stats();
    REQUIRE(s.allocations.current == i64(shadow.size()));
    REQUIRE(s.requested_bytes.current == requested);
    // Small-pool blocks are always split to their rounded size: exact.
    REQUIRE(s.small_pool.allocated_bytes.current == small_allocated);
    // A large block keeps a rest of up to 1 MiB unsplit (PyTorch's rule), so it is between the
    // rounded size and 1 MiB more.
    REQUIRE(s.large_pool.allocated_bytes.current >= large_rounded);
    REQUIRE(s.large_pool.allocated_bytes.current <= large_rounded + large_count * i64(1 * MiB));
    REQUIRE(s.allocated_bytes.current ==
            s.small_pool.allocated_bytes.current + s.large_pool.allocated_bytes.current);
    REQUIRE(s.active_bytes.current == s.allocated_bytes.current);
    REQUIRE(s.reserved_bytes.current >= s.allocated_bytes.current + s.inactive_split_bytes.current);
    REQUIRE(s.reserved_bytes.current % i64(2 * MiB) == 0);
    REQUIRE(s.allocated_bytes.current == s.allocated_bytes.allocated - s.allocated_bytes.freed);
    REQUIRE(s.reserved_bytes.current == s.reserved_bytes.allocated - s.reserved_bytes.freed);
  };

  auto free_one = [&](std::map<char*, live>::iterator it) {
    const std::size_t bytes = it->second.bytes;
    REQUIRE(F::holds(it->first, bytes, it->second.pattern));
    pool->deallocate(it->first, bytes);
    const std::size_t rounded = expected_round(bytes);
    requested -= i64(bytes);
    if (rounded <= 1 * MiB) {
      small_allocated -= i64(rounded);
    } else {
      large_rounded -= i64(rounded);
      --large_count;
    }
    shadow.erase(it);
  };

  for (int step = 0; step < steps; ++step) {
    const bool do_alloc = shadow.empty() || (shadow.size() < 64 && (rng() % 100) < 55);
    if (do_alloc) {
      const auto bytes =
          std::max<std::size_t>(1, static_cast<std::size_t>(std::exp(log_size(rng))));
      char* p = static_cast<char*>(pool->allocate(bytes));
      REQUIRE(p != nullptr);
      REQUIRE(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
      const std::size_t rounded = expected_round(bytes);
      // [p, p + rounded) must not overlap a live block.
      auto after = shadow.lower_bound(p);
      if (after != shadow.end()) REQUIRE(p + rounded <= after->first);
      if (after != shadow.begin()) {
        auto before = std::prev(after);
        REQUIRE(before->first + expected_round(before->second.bytes) <= p);
      }
      F::fill(p, bytes, next_pattern);
      shadow.emplace(p, live{bytes, next_pattern});
      next_pattern = static_cast<std::uint8_t>(next_pattern % 251 + 1);
      requested += i64(bytes);
      if (rounded <= 1 * MiB) {
        small_allocated += i64(rounded);
      } else {
        large_rounded += i64(rounded);
        ++large_count;
      }
    } else {
      auto it = shadow.begin();
      std::advance(it, static_cast<long>(rng() % shadow.size()));
      free_one(it);
    }
    check_stats();
    if (step % 997 == 0) {
      pool->empty_cache();  // must never touch live blocks
      check_stats();
    }
  }
  while (!shadow.empty()) {
    free_one(shadow.begin());
    check_stats();
  }
  MemoryStats s = pool->stats();
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.active_bytes.current == 0);
  CHECK(s.inactive_split_bytes.current == 0);
  CHECK(s.inactive_split.current == 0);
  pool->empty_cache();
  s = pool->stats();
  CHECK(s.reserved_bytes.current == 0);
  CHECK(s.segments.current == 0);
  CHECK(s.num_device_alloc == s.num_device_free);
}

}  // namespace pool_suite

/// Instantiates the whole suite for the fixture types given (a Catch2 TEMPLATE_TEST_CASE each).
#define TESSERA_POOL_SUITE(tag, ...)                                                               \
  TEMPLATE_TEST_CASE("pool: rounding and reservation follow PyTorch's policy", tag, __VA_ARGS__) { \
    pool_suite::rounding_and_reservation<TestType>();                                              \
  }                                                                                                \
  TEMPLATE_TEST_CASE("pool: peak and reset_peak", tag, __VA_ARGS__) {                              \
    pool_suite::peaks<TestType>();                                                                 \
  }                                                                                                \
  TEMPLATE_TEST_CASE("pool: empty_cache returns free segments, keeps non-releasable ones", tag,    \
                     __VA_ARGS__) {                                                                \
    pool_suite::empty_cache_keeps_non_releasable<TestType>();                                      \
  }                                                                                                \
  TEMPLATE_TEST_CASE("pool: split and merge", tag, __VA_ARGS__) {                                  \
    pool_suite::split_and_merge<TestType>();                                                       \
  }                                                                                                \
  TEMPLATE_TEST_CASE("pool: best fit", tag, __VA_ARGS__) { pool_suite::best_fit<TestType>(); }     \
  TEMPLATE_TEST_CASE("pool: bad input is refused and changes nothing", tag, __VA_ARGS__) {         \
    pool_suite::bad_input<TestType>();                                                             \
  }                                                                                                \
  TEMPLATE_TEST_CASE("pool: limit, OOM and the retry ladder", tag, __VA_ARGS__) {                  \
    pool_suite::limit_and_oom<TestType>();                                                         \
  }                                                                                                \
  TEMPLATE_TEST_CASE("pool: randomized allocations against a shadow model", tag, __VA_ARGS__) {    \
    pool_suite::randomized<TestType>();                                                            \
  }
