// Tests of memory/pool.hpp: the shared suite over host upstreams, then what only the CPU can
// test deterministically: the stream/event logic under a hand-driven event policy, and upstreams
// that fail in chosen ways.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <new>
#include <set>
#include <stdexcept>

#include "memory/host_fixtures.hpp"
#include "memory/pool_suite.hpp"
#include "tessera/memory/host_memory_resource.hpp"
#include "tessera/memory/limit_resource_adaptor.hpp"
#include "tessera/memory/pool.hpp"
#include "tessera/memory/statistics_resource_adaptor.hpp"

namespace pool_test {  // one namespace per test file: unity builds compile several together

using tessera::Device;
using tessera::DeviceType;
using tessera::stream_ref;
namespace mem = tessera::memory;
using pool_suite::i64;
using pool_suite::KiB;
using pool_suite::MiB;
using memory_test_units::cpu0;

TESSERA_POOL_SUITE("[pool]", host_fixtures::host, host_fixtures::limited_host)

namespace {


// Events that complete only when the test says so: lets the CUDA stream logic run on the CPU.
struct manual_stream_policy {
  static constexpr bool tracks_streams = true;
  using event_type = int;

  explicit manual_stream_policy(Device) {}
  int record(stream_ref stream) {
    int event = ++last_event;
    pending.emplace(event, stream);
    return event;
  }
  bool query(int event) { return completed.count(event) != 0; }
  void synchronize(int event) {
    completed.insert(event);
    ++synchronizations;
  }
  void release(int event) noexcept { pending.erase(event); }
  /// The work queued on `stream` so far is done.
  void complete(stream_ref stream) {
    for (auto [event, on] : pending) {
      if (on == stream) completed.insert(event);
    }
  }
  int pending_on(stream_ref stream) const {
    int count = 0;
    for (auto [event, on] : pending) count += on == stream;
    return count;
  }

  int last_event = 0;
  int synchronizations = 0;
  std::map<int, stream_ref> pending;
  std::set<int> completed;
};
static_assert(mem::stream_policy<manual_stream_policy>);

using stream_pool =
    mem::pool_resource<mem::host_memory_resource, mem::pytorch_size_policy, manual_stream_policy>;
using limited_stream_pool =
    mem::pool_resource<mem::limit_resource_adaptor<mem::host_memory_resource>,
                       mem::pytorch_size_policy, manual_stream_policy>;

const stream_ref stream_a{reinterpret_cast<void*>(0x1000)};
const stream_ref stream_b{reinterpret_cast<void*>(0x2000)};

}  // namespace

TEST_CASE("pool streams: a free block is reused without events only on its own stream",
          "[pool][streams]") {
  stream_pool pool{cpu0};
  void* p = pool.allocate(4096, stream_a);
  pool.deallocate(p, 4096, stream_a);
  void* q = pool.allocate(4096, stream_b);  // the free block belongs to stream A
  CHECK(q != p);
  CHECK(pool.stats().segments.current == 2);
  void* r = pool.allocate(4096, stream_a);
  CHECK(r == p);
  CHECK(pool.stream_policy().pending.empty());
  pool.deallocate(q, 4096, stream_b);
  pool.deallocate(r, 4096, stream_a);
}

TEST_CASE("pool streams: record_stream delays reuse until the other stream's work is done",
          "[pool][streams]") {
  stream_pool pool{cpu0};
  void* p = pool.allocate(4096, stream_a);
  void* keep = pool.allocate(512, stream_a);  // keeps the segment split
  pool.record_stream(p, stream_b);
  pool.record_stream(p, stream_b);  // once is enough
  pool.record_stream(p, stream_a);  // its own stream needs no event
  pool.deallocate(p, 4096, stream_a);
  CHECK(pool.stream_policy().pending_on(stream_b) == 1);
  CHECK(pool.stream_policy().pending.size() == 1);

  mem::MemoryStats stats = pool.stats();
  CHECK(stats.allocated_bytes.current == 512);
  CHECK(stats.active_bytes.current == 4096 + 512);  // freed but still in use by stream B
  CHECK(stats.active.current == 2);
  CHECK(stats.allocations.current == 1);

  void* q = pool.allocate(4096, stream_a);
  CHECK(q != p);  // p is not back yet
  pool.deallocate(q, 4096, stream_a);

  pool.stream_policy().complete(stream_b);
  void* r = pool.allocate(4096, stream_a);  // events are polled at each allocate
  CHECK(r == p);
  CHECK(pool.stream_policy().pending.empty());
  stats = pool.stats();
  CHECK(stats.active_bytes.current == 4096 + 512);
  CHECK(stats.allocated_bytes.current == 4096 + 512);
  pool.deallocate(r, 4096, stream_a);
  pool.deallocate(keep, 512, stream_a);
  stats = pool.stats();
  CHECK(stats.active_bytes.current == 0);
  CHECK(stats.inactive_split.current == 0);
}

TEST_CASE("pool streams: deallocating on another stream counts as a use of it", "[pool][streams]") {
  stream_pool pool{cpu0};
  void* p = pool.allocate(1000, stream_a);
  pool.deallocate(p, 1000, stream_b);
  CHECK(pool.stream_policy().pending_on(stream_b) == 1);
  CHECK(pool.stats().active_bytes.current == 1024);
  pool.stream_policy().complete(stream_b);
  void* q = pool.allocate(1000, stream_a);
  CHECK(q == p);
  pool.deallocate(q, 1000, stream_a);
}

TEST_CASE("pool streams: empty_cache waits for pending events, then releases the segment",
          "[pool][streams]") {
  stream_pool pool{cpu0};
  void* p = pool.allocate(12 * MiB, stream_a);
  pool.record_stream(p, stream_b);
  pool.deallocate(p, 12 * MiB, stream_a);
  pool.empty_cache();
  CHECK(pool.stream_policy().synchronizations == 1);
  mem::MemoryStats stats = pool.stats();
  CHECK(stats.reserved_bytes.current == 0);
  CHECK(stats.active_bytes.current == 0);
  CHECK(stats.active.current == 0);
}

TEST_CASE("pool streams: the OOM retry waits for pending events and reuses their memory",
          "[pool][streams]") {
  limited_stream_pool pool{cpu0};
  pool.set_limit(20 * MiB);
  void* p = pool.allocate(12 * MiB, stream_a);
  pool.record_stream(p, stream_b);
  pool.deallocate(p, 12 * MiB, stream_a);
  // 12 + 12 > 20: the pending block must be waited for and its segment released.
  void* q = pool.allocate(12 * MiB, stream_a);
  CHECK(q != nullptr);
  mem::MemoryStats stats = pool.stats();
  CHECK(stats.num_alloc_retries == 1);
  CHECK(stats.num_ooms == 0);
  CHECK(stats.reserved_bytes.current == i64(12 * MiB));
  CHECK(pool.stream_policy().synchronizations == 1);
  pool.deallocate(q, 12 * MiB, stream_a);
}

TEST_CASE("pool: host stream policy treats every stream as one", "[pool][streams]") {
  mem::pool_resource<mem::host_memory_resource> pool{cpu0};
  void* p = pool.allocate(4096, stream_a);
  pool.record_stream(p, stream_b);  // nothing to wait for: host work is synchronous
  pool.deallocate(p, 4096, stream_b);
  CHECK(pool.stats().active_bytes.current == 0);
  void* q = pool.allocate(4096, stream_b);
  CHECK(q == p);
  pool.deallocate(q, 4096);
}

namespace {
// An upstream that fails on demand: with `oom`, `bad_alloc` or another error.
struct failing_upstream {
  enum class mode { none, oom, bad_alloc, other };
  mode* failure;
  void* allocate(std::size_t bytes, stream_ref stream) {
    switch (*failure) {
      case mode::oom:
        throw tessera::out_of_memory_error("failing_upstream: no memory");
      case mode::bad_alloc:
        throw std::bad_alloc();
      case mode::other:
        throw std::runtime_error("failing_upstream: broken");
      case mode::none:
        break;
    }
    return mem::host_memory_resource{}.allocate(bytes, stream);
  }
  void deallocate(void* p, std::size_t bytes, stream_ref stream) {
    mem::host_memory_resource{}.deallocate(p, bytes, stream);
  }
};
}  // namespace

TEST_CASE("pool: upstream failures", "[pool]") {
  failing_upstream::mode failure = failing_upstream::mode::none;
  mem::pool_resource<failing_upstream> pool{cpu0, failing_upstream{&failure}};
  void* p = pool.allocate(100);
  mem::MemoryStats before = pool.stats();

  SECTION("std::bad_alloc from the upstream is an OOM: released cache, one retry, then the error") {
    failure = failing_upstream::mode::bad_alloc;
    CHECK_THROWS_AS(pool.allocate(5 * MiB), tessera::out_of_memory_error);
    mem::MemoryStats after = pool.stats();
    CHECK(after.num_ooms == 1);
    CHECK(after.num_alloc_retries == 1);
  }
  SECTION("any other error passes through unchanged, with nothing counted") {
    failure = failing_upstream::mode::other;
    CHECK_THROWS_WITH(pool.allocate(5 * MiB), "failing_upstream: broken");
    CHECK(pool.stats() == before);
  }
  SECTION("a request the cache can serve never reaches the upstream") {
    failure = failing_upstream::mode::oom;
    void* q = pool.allocate(100 * KiB);
    CHECK(q != nullptr);
    pool.deallocate(q, 100 * KiB);
  }
  failure = failing_upstream::mode::none;
  pool.deallocate(p, 100);
}

TEST_CASE("pool: statistics_resource_adaptor underneath counts the traffic to the upstream",
          "[pool]") {
  mem::pool_resource<mem::statistics_resource_adaptor<mem::host_memory_resource>> pool{cpu0};
  for (int i = 0; i < 100; ++i) {
    void* p = pool.allocate(64 * KiB);
    pool.deallocate(p, 64 * KiB);
  }
  auto counters = pool.upstream().get_counters();
  CHECK(counters.allocations.allocated == 1);  // one segment served all hundred
  CHECK(counters.bytes.current == i64(2 * MiB));
  pool.empty_cache();
  counters = pool.upstream().get_counters();
  CHECK(counters.bytes.current == 0);
  CHECK(counters.allocations.freed == 1);
}

TEST_CASE("pool: a custom size policy changes rounding and segments", "[pool]") {
  // 4 KiB pages, everything in one pool of 64 KiB segments.
  struct page_policy {
    std::size_t round_size(std::size_t bytes) const { return (bytes + 4095) / 4096 * 4096; }
    bool is_small(std::size_t) const { return true; }
    std::size_t segment_size(std::size_t size) const { return size < 65536 ? 65536 : size; }
    bool should_split(bool, std::size_t block, std::size_t size) const { return block > size; }
    bool may_use(std::size_t, std::size_t) const { return true; }
  };
  mem::pool_resource<mem::host_memory_resource, page_policy> pool{cpu0};
  void* p = pool.allocate(1);
  CHECK(pool.stats().allocated_bytes.current == 4096);
  CHECK(pool.stats().reserved_bytes.current == 65536);
  pool.deallocate(p, 1);
}

}  // namespace pool_test
