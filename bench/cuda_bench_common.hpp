// What the CUDA benchmark programs (cuda_bench.cu, cuda_amp_bench.cu) share: stopping on a CUDA
// error or a wrong result, timing a body with CUDA events, and reading PyTorch's rows from the
// JSON files bench/cuda_torch_baseline.py writes. Included by nvcc-compiled benchmarks only.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "tessera/memory/memory.hpp"

namespace tessera::bench {

/// Stops the program, naming the call, when a CUDA runtime call failed.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

/// Stops the program with `what`: a benchmark that computed something wrong reports no time.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "cuda benchmark: %s\n", what.c_str());
  std::exit(1);
}

/// Times each iteration of `body` with events on the legacy default stream (Tessera's current
/// stream unless a StreamGuard says otherwise), after one warm-up call. The device is idle when
/// `start` is recorded, so the time includes the host's issue of the body up to its first launch;
/// the counter host_us is the host's time in body() per iteration: when it is near the measured
/// time, the row measures the host, not the kernel (ncu's duration, device_check's ncu_rows, then
/// says what the kernel takes).
template <class F>
void time_with_events(benchmark::State& state, F&& body) {
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  body();
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  using clock = std::chrono::steady_clock;
  clock::duration host{};
  std::int64_t iterations = 0;
  for (auto _ : state) {
    check_cuda(cudaEventRecord(start, nullptr), "cudaEventRecord");
    const auto issue = clock::now();
    body();
    host += clock::now() - issue;
    ++iterations;
    check_cuda(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    state.SetIterationTime(ms / 1e3);
  }
  if (iterations > 0) {
    state.counters["host_us"] =
        std::chrono::duration<double, std::micro>(host).count() / static_cast<double>(iterations);
  }
  check_cuda(cudaEventDestroy(start), "cudaEventDestroy");
  check_cuda(cudaEventDestroy(stop), "cudaEventDestroy");
}

/// The counter TFLOP/s of a square matrix product of `size` (2 size^3 operations an iteration).
inline void set_square_matmul_flops(benchmark::State& state, std::int64_t size) {
  const double m = static_cast<double>(size);
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * m * m * m / 1e12, benchmark::Counter::kIsIterationInvariantRate);
}

/// The body of a ResNet training-step row (1000 classes, random weights): the device's peak reset,
/// one step whose loss must be about log(1000) = 6.9 (5 to 9), the timed steps, then the counters
/// peak_MiB (the peak of allocated memory over `allocated_before`, what was allocated before the
/// model was made, as the torch baseline measures it) and arena_MiB (the program's plan).
template <class Step>
void time_resnet_steps(benchmark::State& state, Step& step, Device device,
                       std::size_t allocated_before, std::size_t planned_bytes) {
  memory::reset_peak(device);
  const float first = step();
  if (!(first > 5.0f && first < 9.0f)) fail("resnet50 first loss " + std::to_string(first));
  for (auto _ : state) benchmark::DoNotOptimize(step());
  constexpr double mib = 1024.0 * 1024.0;
  state.counters["peak_MiB"] =
      static_cast<double>(memory::peak_allocated(device) - allocated_before) / mib;
  state.counters["arena_MiB"] = static_cast<double>(planned_bytes) / mib;
}

/// PyTorch's rows ({"row": milliseconds, ...}) from the JSON files bench/cuda_torch_baseline.py
/// wrote, named in TESSERA_TORCH_BASELINE (several separated by ':'; a later file's row wins).
/// Empty when the variable is not set.
inline std::map<std::string, double> torch_rows() {
  std::map<std::string, double> rows;
  const char* paths = std::getenv("TESSERA_TORCH_BASELINE");
  if (paths == nullptr) return rows;
  std::stringstream list(paths);
  std::string path;
  while (std::getline(list, path, ':')) {
    if (path.empty()) continue;
    std::ifstream in(path);
    if (!in) fail("cannot read " + path + " (TESSERA_TORCH_BASELINE)");
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    std::size_t at = 0;
    while ((at = s.find('"', at)) != std::string::npos) {
      const std::size_t end = s.find('"', at + 1);
      const std::size_t colon = s.find(':', end);
      if (end == std::string::npos || colon == std::string::npos) break;
      rows[s.substr(at + 1, end - at - 1)] = std::strtod(s.c_str() + colon + 1, nullptr);
      at = s.find_first_of(",}", colon);
      if (at == std::string::npos) break;
    }
  }
  return rows;
}

}  // namespace tessera::bench
