// The memory layer on CUDA devices (compiled by nvcc, one translation unit for all CUDA memory
// tests): the shared pool suite over cudaMalloc, cudaMallocAsync and pinned host memory; stream
// ordering with real streams and events; the cuda:N registry; a real device OOM.
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "memory/host_fixtures.hpp"
#include "memory/pool_suite.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/memory/cuda_async_memory_resource.hpp"
#include "tessera/memory/cuda_memory_resource.hpp"
#include "tessera/memory/limit_resource_adaptor.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/memory/pinned_host_memory_resource.hpp"
#include "tessera/memory/pool.hpp"

namespace cuda_memory_test {  // one namespace per file: a unity build

namespace mem = tessera::memory;
using pool_suite::KiB;
using pool_suite::MiB;
using tessera::Device;
using tessera::DeviceType;
using tessera::stream_ref;

namespace cuda_fixtures {

inline const Device cuda0{DeviceType::cuda, 0};

inline void fill(void* p, std::size_t bytes, std::uint8_t pattern) {
  TESSERA_CUDA_CHECK(cudaMemset(p, pattern, bytes));
}
inline bool holds(const void* p, std::size_t bytes, std::uint8_t pattern) {
  std::vector<unsigned char> host(bytes);
  TESSERA_CUDA_CHECK(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost));
  for (unsigned char byte : host) {
    if (byte != pattern) return false;
  }
  return true;
}

struct cuda_malloc {
  using pool_type = mem::pool_resource<mem::limit_resource_adaptor<mem::cuda_memory_resource>>;
  static constexpr bool has_limit = true;
  static Device device() { return cuda0; }
  static std::unique_ptr<pool_type> make() {
    return std::make_unique<pool_type>(
        cuda0,
        mem::limit_resource_adaptor<mem::cuda_memory_resource>(mem::cuda_memory_resource(0)));
  }
  static void fill(void* p, std::size_t n, std::uint8_t v) { cuda_fixtures::fill(p, n, v); }
  static bool holds(const void* p, std::size_t n, std::uint8_t v) {
    return cuda_fixtures::holds(p, n, v);
  }
};

struct async {
  using pool_type = mem::pool_resource<mem::cuda_async_memory_resource>;
  static constexpr bool has_limit = false;
  static Device device() { return cuda0; }
  static std::unique_ptr<pool_type> make() {
    return std::make_unique<pool_type>(cuda0, mem::cuda_async_memory_resource(0));
  }
  static void fill(void* p, std::size_t n, std::uint8_t v) {
    cuda_fixtures::fill(p, n, v);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());  // stream-ordered memory: finish before reading
  }
  static bool holds(const void* p, std::size_t n, std::uint8_t v) {
    return cuda_fixtures::holds(p, n, v);
  }
};

struct pinned {
  using pool_type = mem::pool_resource<mem::pinned_host_memory_resource>;
  static constexpr bool has_limit = false;
  static Device device() { return Device{DeviceType::cpu, 0}; }
  static std::unique_ptr<pool_type> make() { return std::make_unique<pool_type>(device()); }
  static void fill(void* p, std::size_t n, std::uint8_t v) { host_fixtures::fill(p, n, v); }
  static bool holds(const void* p, std::size_t n, std::uint8_t v) {
    return host_fixtures::holds(p, n, v);
  }
};

}  // namespace cuda_fixtures

TESSERA_POOL_SUITE("[cuda][pool]", cuda_fixtures::cuda_malloc, cuda_fixtures::async,
                   cuda_fixtures::pinned)

namespace {

// Keeps a stream busy for about `milliseconds`, so that events recorded after it stay pending.
__global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

long long cycles_for(int milliseconds) {
  int khz = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  return static_cast<long long>(khz) * milliseconds;
}

struct stream_pair {
  cudaStream_t first = nullptr;
  cudaStream_t second = nullptr;
  stream_pair() {
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  }
  ~stream_pair() {
    (void)cudaStreamDestroy(first);
    (void)cudaStreamDestroy(second);
  }
};

}  // namespace

TEST_CASE("cuda pool: a block used on another stream waits for that stream's work",
          "[cuda][pool][streams]") {
  stream_pair streams;
  auto pool = cuda_fixtures::cuda_malloc::make();
  void* p = pool->allocate(4096, streams.first);
  void* keep = pool->allocate(512, streams.first);
  spin<<<1, 1, 0, streams.second>>>(cycles_for(200));
  TESSERA_CUDA_CHECK(cudaGetLastError());
  pool->record_stream(p, streams.second);
  pool->deallocate(p, 4096, streams.first);
  mem::MemoryStats stats = pool->stats();
  CHECK(stats.allocated_bytes.current == 512);
  CHECK(stats.active_bytes.current == 4096 + 512);

  void* q = pool->allocate(4096, streams.first);
  CHECK(q != p);  // the kernel on the second stream is still running
  pool->deallocate(q, 4096, streams.first);

  TESSERA_CUDA_CHECK(cudaStreamSynchronize(streams.second));
  void* r = pool->allocate(4096, streams.first);
  CHECK(r == p);
  CHECK(pool->stats().active_bytes.current == 4096 + 512);
  pool->deallocate(r, 4096, streams.first);
  pool->deallocate(keep, 512, streams.first);
  CHECK(pool->stats().active_bytes.current == 0);
}

TEST_CASE("cuda pool: free blocks are reused only on their own stream", "[cuda][pool][streams]") {
  stream_pair streams;
  auto pool = cuda_fixtures::cuda_malloc::make();
  void* p = pool->allocate(4096, streams.first);
  pool->deallocate(p, 4096, streams.first);
  void* q = pool->allocate(4096, streams.second);
  CHECK(q != p);
  CHECK(pool->stats().segments.current == 2);
  void* r = pool->allocate(4096, streams.first);
  CHECK(r == p);
  pool->deallocate(q, 4096, streams.second);
  pool->deallocate(r, 4096, streams.first);
}

TEST_CASE("cuda pool: empty_cache waits for pending events", "[cuda][pool][streams]") {
  stream_pair streams;
  auto pool = cuda_fixtures::cuda_malloc::make();
  void* p = pool->allocate(12 * MiB, streams.first);
  spin<<<1, 1, 0, streams.second>>>(cycles_for(50));
  TESSERA_CUDA_CHECK(cudaGetLastError());
  pool->record_stream(p, streams.second);
  pool->deallocate(p, 12 * MiB, streams.first);
  pool->empty_cache();
  mem::MemoryStats stats = pool->stats();
  CHECK(stats.reserved_bytes.current == 0);
  CHECK(stats.active_bytes.current == 0);
}

TEST_CASE("cuda pool: a request beyond the device is an OOM that names it", "[cuda][pool]") {
  auto pool = cuda_fixtures::cuda_malloc::make();
  const std::size_t capacity = mem::cuda_memory_resource(0).capacity();
  void* small = pool->allocate(512);
  const mem::MemoryStats before = pool->stats();
  std::string message;
  try {
    (void)pool->allocate(2 * capacity);
    FAIL("no out_of_memory_error");
  } catch (const tessera::out_of_memory_error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("cuda:0") && Catch::Contains("total capacity") &&
                          Catch::Contains(mem::format_bytes(2 * capacity)));
  mem::MemoryStats after = pool->stats();
  CHECK(after.num_ooms == before.num_ooms + 1);
  after.num_ooms = before.num_ooms;
  after.num_alloc_retries = before.num_alloc_retries;
  CHECK(after == before);
  // The failed cudaMalloc left no sticky error behind.
  CHECK(cudaGetLastError() == cudaSuccess);
  void* next = pool->allocate(1 * MiB);
  pool->deallocate(next, 1 * MiB);
  pool->deallocate(small, 512);
}

TEST_CASE("memory: cuda:0 has a pool with the CPU's accounting", "[cuda][memory]") {
  const Device cuda0{DeviceType::cuda, 0};
  mem::empty_cache(cuda0);
  const std::size_t base = mem::allocated(cuda0);
  void* a = mem::allocate(cuda0, 4);
  void* b = mem::allocate(cuda0, 516);
  CHECK(mem::allocated(cuda0) == base + 512 + 1024);
  CHECK(mem::reserved(cuda0) >= mem::allocated(cuda0));
  CHECK_THAT(mem::summary(cuda0), Catch::Contains("device cuda:0"));
  const Device missing{DeviceType::cuda, tessera::cuda::device_count()};
  CHECK_THROWS_WITH(mem::allocated(missing), Catch::Contains(missing.str()));

  mem::set_limit(cuda0, mem::reserved(cuda0));
  CHECK_THROWS_WITH(mem::allocate(cuda0, 64 * MiB), Catch::Contains("limit"));
  mem::set_limit(cuda0, mem::no_limit);
  mem::deallocate(cuda0, a, 4);
  mem::deallocate(cuda0, b, 516);
  CHECK(mem::allocated(cuda0) == base);
}

TEST_CASE("memory: a cudaMallocAsync pool can be installed for a CUDA device", "[cuda][memory]") {
  if (tessera::cuda::device_count() < 2) return;  // keep cuda:0's pool for the other tests
  const Device cuda1{DeviceType::cuda, 1};
  mem::empty_cache(cuda1);
  auto previous = mem::set_device_resource(
      cuda1, mem::make_pool_resource(cuda1, mem::cuda_async_memory_resource(1)));
  void* p = mem::allocate(cuda1, 1000);
  CHECK(mem::allocated(cuda1) == 1024);
  mem::deallocate(cuda1, p, 1000);
  auto mine = mem::set_device_resource(
      cuda1, previous ? std::move(previous)
                      : mem::make_pool_resource(
                            cuda1, mem::limit_resource_adaptor<mem::cuda_memory_resource>(
                                       mem::cuda_memory_resource(1))));
  CHECK(mine != nullptr);
}

}  // namespace cuda_memory_test
