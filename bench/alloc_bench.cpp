// Allocation speed: buffers of random sizes (512 B to 4 MiB, pre-generated with a fixed seed)
// created and destroyed with 32 alive at a time: a ring of 32 slots, each iteration frees one slot
// and allocates a new size into it. One iteration = one free + one allocation. Compared in the same
// run: Tessera's device pool (memory::allocate/deallocate on cpu:0), malloc/free, and LibTorch's
// torch::empty({n}, kUInt8) on the CPU when LibTorch was found. The ratios are printed at the end.
// The *_mem_pool_elsewhere rows repeat the pool and tensor rows while a MemPool (holding a block,
// so one segment) lives on cpu:1: what a process pays on its other devices while, e.g., a CUDA
// graph's private pool is alive (run with TESSERA_CPU_DEVICES=2; skipped with one device).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/memory/mem_pool.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/tensor/factories.hpp"

#if TESSERA_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace {

constexpr std::size_t ring_size = 32;
constexpr std::size_t num_sizes = 1 << 14;  // a power of two, cycled through

// Sizes uniform in [512 B, 4 MiB], the same sequence for every contender.
const std::vector<std::size_t>& sizes() {
  static const std::vector<std::size_t> values = [] {
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<std::size_t> size(512, std::size_t{4} << 20);
    std::vector<std::size_t> v(num_sizes);
    for (auto& s : v) s = size(rng);
    return v;
  }();
  return values;
}

// benchmark::DoNotOptimize on a local copy. Applied to the ring slot itself (`s.pointer`), GCC 12
// with Google Benchmark 1.7.1 ("+m,r" asm constraint) bound the asm operand to a stack temporary
// and dropped the store into the ring, so a stale pointer was freed later.
inline void* keep(void* pointer) {
  benchmark::DoNotOptimize(pointer);
  return pointer;
}

struct slot {
  void* pointer = nullptr;
  std::size_t bytes = 0;
};

// A MemPool on cpu:1 holding one block while it lives, or nothing with a single CPU device.
class mem_pool_elsewhere {
 public:
  static constexpr std::size_t block_bytes = 4096;
  mem_pool_elsewhere() {
    if (tessera::cpu::device_count() < 2) return;
    pool_ = std::make_unique<tessera::memory::MemPool>(device_);
    tessera::memory::use_mem_pool scope(*pool_);
    block_ = tessera::memory::allocate(device_, block_bytes);
  }
  ~mem_pool_elsewhere() {
    if (block_ != nullptr) tessera::memory::deallocate(device_, block_, block_bytes);
  }
  bool alive() const { return pool_ != nullptr; }

 private:
  tessera::Device device_{tessera::DeviceType::cpu, 1};
  std::unique_ptr<tessera::memory::MemPool> pool_;
  void* block_ = nullptr;
};

// Runs the row `body` while a mem_pool_elsewhere lives (an error without a second CPU device).
void with_mem_pool_elsewhere(benchmark::State& state, void (*body)(benchmark::State&)) {
  mem_pool_elsewhere other;
  if (!other.alive()) {
    state.SkipWithError("needs TESSERA_CPU_DEVICES=2");
    return;
  }
  body(state);
}

void BM_tessera_pool(benchmark::State& state) {
  const tessera::Device cpu0{tessera::DeviceType::cpu, 0};
  namespace mem = tessera::memory;
  const auto& sz = sizes();
  slot ring[ring_size];
  std::size_t next = 0;
  for (auto& s : ring) {
    s.bytes = sz[next++ % num_sizes];
    s.pointer = mem::allocate(cpu0, s.bytes);
  }
  std::size_t i = 0;
  for (auto _ : state) {
    slot& s = ring[i++ % ring_size];
    mem::deallocate(cpu0, s.pointer, s.bytes);
    s.bytes = sz[next++ % num_sizes];
    s.pointer = keep(mem::allocate(cpu0, s.bytes));
  }
  for (auto& s : ring) mem::deallocate(cpu0, s.pointer, s.bytes);
  state.counters["reserved_MiB"] = static_cast<double>(mem::reserved(cpu0)) / (1 << 20);
  mem::empty_cache(cpu0);
}
BENCHMARK(BM_tessera_pool);

void BM_tessera_pool_mem_pool_elsewhere(benchmark::State& state) {
  with_mem_pool_elsewhere(state, BM_tessera_pool);
}
BENCHMARK(BM_tessera_pool_mem_pool_elsewhere);

void BM_malloc(benchmark::State& state) {
  const auto& sz = sizes();
  slot ring[ring_size];
  std::size_t next = 0;
  for (auto& s : ring) {
    s.bytes = sz[next++ % num_sizes];
    s.pointer = std::malloc(s.bytes);
  }
  std::size_t i = 0;
  for (auto _ : state) {
    slot& s = ring[i++ % ring_size];
    std::free(s.pointer);
    s.bytes = sz[next++ % num_sizes];
    s.pointer = keep(std::malloc(s.bytes));
  }
  for (auto& s : ring) std::free(s.pointer);
}
BENCHMARK(BM_malloc);

// Whole tensors: ts::empty<uint8_t>({n}) on cpu:0, the same bytes as torch::empty's kUInt8 below.
// A tensor is a refcounted storage handle plus shape and strides on top of the pool's block.
void BM_tessera_empty(benchmark::State& state) {
  const auto& sz = sizes();
  std::vector<tessera::Tensor<std::uint8_t>> ring(ring_size);
  std::size_t next = 0;
  for (auto& t : ring)
    t = tessera::empty<std::uint8_t>({static_cast<std::int64_t>(sz[next++ % num_sizes])});
  std::size_t i = 0;
  for (auto _ : state) {
    auto& t = ring[i++ % ring_size];
    t = tessera::Tensor<std::uint8_t>();  // free first, as the other contenders do
    t = tessera::empty<std::uint8_t>({static_cast<std::int64_t>(sz[next++ % num_sizes])});
    (void)keep(t.data());
  }
  ring.clear();
  tessera::memory::empty_cache(tessera::Device{});
}
BENCHMARK(BM_tessera_empty);

void BM_tessera_empty_mem_pool_elsewhere(benchmark::State& state) {
  with_mem_pool_elsewhere(state, BM_tessera_empty);
}
BENCHMARK(BM_tessera_empty_mem_pool_elsewhere);

// One small tensor, ts::empty<float>({1024}) (4 KiB), created and destroyed: the thread cache's
// hit path (memory::detail::allocate_cached and deallocate_cached), alone and with the MemPool.
void BM_tessera_empty_4KiB(benchmark::State& state) {
  for (auto _ : state) {
    auto t = tessera::empty<float>({1024});
    (void)keep(t.data());
  }
  tessera::memory::empty_cache(tessera::Device{});
}
BENCHMARK(BM_tessera_empty_4KiB);

void BM_tessera_empty_4KiB_mem_pool_elsewhere(benchmark::State& state) {
  with_mem_pool_elsewhere(state, BM_tessera_empty_4KiB);
}
BENCHMARK(BM_tessera_empty_4KiB_mem_pool_elsewhere);

#if TESSERA_BENCH_TORCH
void BM_torch_empty(benchmark::State& state) {
  const auto& sz = sizes();
  std::vector<at::Tensor> ring(ring_size);
  std::size_t next = 0;
  for (auto& t : ring)
    t = torch::empty({static_cast<std::int64_t>(sz[next++ % num_sizes])}, torch::kUInt8);
  std::size_t i = 0;
  for (auto _ : state) {
    at::Tensor& t = ring[i++ % ring_size];
    t.reset();  // free first, as the other contenders do
    t = torch::empty({static_cast<std::int64_t>(sz[next++ % num_sizes])}, torch::kUInt8);
    (void)keep(t.data_ptr());
  }
}
BENCHMARK(BM_torch_empty);
#endif

// Console output as usual, plus each benchmark's time per iteration for the ratios: the median
// when repetitions are asked for, else the single run. Real (wall) and CPU time are both kept; on a
// busy machine CPU time is the steadier of the two (every contender is single-threaded).
class recording_reporter : public benchmark::ConsoleReporter {
 public:
  struct times {
    double real = 0;
    double cpu = 0;
  };
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const std::string name = run.run_name.function_name;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (median || (run.run_type == Run::RT_Iteration && !medians_.count(name))) {
        results[name] = {run.GetAdjustedRealTime(), run.GetAdjustedCPUTime()};
        if (median) medians_.insert(name);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, times> results;  // in each run's time unit (ns by default)

 private:
  std::set<std::string> medians_;
};

void print_ratio(const std::map<std::string, recording_reporter::times>& results, const char* label,
                 const char* a, const char* b) {
  auto x = results.find(a);
  auto y = results.find(b);
  if (x == results.end() || y == results.end() || y->second.real <= 0 || y->second.cpu <= 0) {
    return;
  }
  std::printf("%s = %.2f (real time), %.2f (CPU time)\n", label, x->second.real / y->second.real,
              x->second.cpu / y->second.cpu);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  std::printf("\nper alloc+free pair (32 live, sizes 512 B..4 MiB):\n");
  print_ratio(reporter.results, "tessera / malloc", "BM_tessera_pool", "BM_malloc");
  print_ratio(reporter.results, "torch / tessera", "BM_torch_empty", "BM_tessera_pool");
  print_ratio(reporter.results, "tessera tensor / malloc", "BM_tessera_empty", "BM_malloc");
  print_ratio(reporter.results, "torch / tessera tensor", "BM_torch_empty", "BM_tessera_empty");
  print_ratio(reporter.results, "pool, MemPool on cpu:1 / none", "BM_tessera_pool_mem_pool_elsewhere",
              "BM_tessera_pool");
  print_ratio(reporter.results, "tensor, MemPool on cpu:1 / none",
              "BM_tessera_empty_mem_pool_elsewhere", "BM_tessera_empty");
  print_ratio(reporter.results, "4 KiB tensor, MemPool on cpu:1 / none",
              "BM_tessera_empty_4KiB_mem_pool_elsewhere", "BM_tessera_empty_4KiB");
#if !TESSERA_BENCH_TORCH
  std::printf("torch / tessera: LibTorch not found at configure time\n");
#endif
  return 0;
}
