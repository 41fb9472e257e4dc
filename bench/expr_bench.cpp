// Expression benchmarks against their baselines in the same run; the ratios are printed at the
// end as throughputs relative to the baseline (baseline time / time: 1.00 is as fast).
// matmul: 1024 x 1024 float products through ts::matmul (CBLAS path), raw cblas_sgemm on the
// same buffers, the built-in kernel (backend::cpu::gemm_fallback) on the same buffers, and Eigen
// when it was found. Every contender uses cpu::num_threads() threads (OpenBLAS is set to it).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tessera/backend/cpu/gemm.hpp"
#include "tessera/backend/cpu/parallel.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/tensor/factories.hpp"

#if TESSERA_BENCH_EIGEN
#include <Eigen/Core>
#endif

namespace ts = tessera;

namespace {

// ---- matmul ------------------------------------------------------------------------------------

constexpr std::int64_t matmul_size = 1024;

// Operands and an output, filled once; every contender reads and writes the same buffers.
struct matmul_operands {
  ts::Tensor<float> a, b, c;
  matmul_operands() {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> values(static_cast<std::size_t>(matmul_size * matmul_size));
    for (auto& v : values) v = u(rng);
    a = ts::from_vector<float>(values, {matmul_size, matmul_size});
    for (auto& v : values) v = u(rng);
    b = ts::from_vector<float>(values, {matmul_size, matmul_size});
    c = ts::zeros<float>({matmul_size, matmul_size});
  }
};

matmul_operands& operands() {
  static matmul_operands instance;
  return instance;
}

void set_flops(benchmark::State& state) {
  const double n = static_cast<double>(matmul_size);
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * n * n * n / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = static_cast<double>(ts::cpu::num_threads());
}

// ts::matmul as users call it: checks, layout analysis, a new output tensor from the pool, then
// cblas_sgemm (the built-in kernel when the build has no BLAS).
void BM_matmul_tessera(benchmark::State& state) {
  auto& x = operands();
  for (auto _ : state) {
    auto out = ts::matmul(x.a, x.b);
    benchmark::DoNotOptimize(out.data());
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);

// ts::matmul of transposed views (Trans x Trans): no copies, the same cblas_sgemm underneath.
void BM_matmul_tessera_transposed(benchmark::State& state) {
  auto& x = operands();
  for (auto _ : state) {
    auto out = ts::matmul(x.b.t(), x.a.t());
    benchmark::DoNotOptimize(out.data());
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_tessera_transposed)->UseRealTime()->Unit(benchmark::kMillisecond);

// The built-in kernel on the same buffers, called directly (as ts::matmul does without a BLAS).
void BM_matmul_fallback(benchmark::State& state) {
  auto& x = operands();
  namespace cpu = ts::backend::cpu;
  const std::int64_t n = matmul_size;
  for (auto _ : state) {
    cpu::gemm_fallback<float>({1, n, n, n}, {x.a.data(), 0, n, 1}, {x.b.data(), 0, n, 1},
                              {x.c.data(), 0, n});
    benchmark::ClobberMemory();
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_fallback)->UseRealTime()->Unit(benchmark::kMillisecond);

#if TESSERA_GEMM_HAS_BLAS
// The baseline: cblas_sgemm on the same buffers, row-major, no transposes.
void BM_matmul_openblas(benchmark::State& state) {
  auto& x = operands();
  const int n = static_cast<int>(matmul_size);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, x.a.data(), n, x.b.data(),
                n, 0.0f, x.c.data(), n);
    benchmark::ClobberMemory();
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_openblas)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

#if TESSERA_BENCH_EIGEN
// Eigen's own GEMM on the same buffers (row-major maps), threaded by OpenMP like Tessera.
void BM_matmul_eigen(benchmark::State& state) {
  auto& x = operands();
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Index n = matmul_size;
  Eigen::Map<const matrix> a(x.a.data(), n, n), b(x.b.data(), n, n);
  Eigen::Map<matrix> c(x.c.data(), n, n);
  Eigen::setNbThreads(ts::cpu::num_threads());
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::ClobberMemory();
  }
  set_flops(state);
}
BENCHMARK(BM_matmul_eigen)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

// ---- reporting ---------------------------------------------------------------------------------

// Console output as usual, plus each benchmark's real time per iteration for the ratios: the
// median when repetitions are asked for, else the single run. Real time, because the contenders
// are multi-threaded (CPU time counts the main thread only).
class recording_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const std::string name = run.run_name.function_name;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (median || (run.run_type == Run::RT_Iteration && !medians_.count(name))) {
        results[name] = run.GetAdjustedRealTime();
        if (median) medians_.insert(name);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> results;  // in each run's time unit

 private:
  std::set<std::string> medians_;
};

// One line of the summary: "label = baseline time / contender time" (a throughput ratio).
struct ratio_line {
  const char* label;
  const char* contender;
  const char* baseline;
};

// Add a line here for each new contender/baseline pair.
const ratio_line ratio_lines[] = {
    {"matmul / openblas", "BM_matmul_tessera", "BM_matmul_openblas"},
    {"matmul of transposed views / openblas", "BM_matmul_tessera_transposed", "BM_matmul_openblas"},
    {"fallback / openblas", "BM_matmul_fallback", "BM_matmul_openblas"},
    {"eigen / openblas", "BM_matmul_eigen", "BM_matmul_openblas"},
    {"fallback / eigen", "BM_matmul_fallback", "BM_matmul_eigen"},
};

void print_ratio(const std::map<std::string, double>& results, const ratio_line& line) {
  auto contender = results.find(line.contender);
  auto baseline = results.find(line.baseline);
  if (contender == results.end() || baseline == results.end() || contender->second <= 0) return;
  std::printf("%s = %.2f\n", line.label, baseline->second / contender->second);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
#if TESSERA_GEMM_HAS_BLAS && defined(OPENBLAS_VERSION)
  // The same threads for OpenBLAS as for Tessera's loops (ts::matmul does this on its own too).
  openblas_set_num_threads(ts::cpu::num_threads());
#endif
  recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  std::printf("\nthroughput ratios (baseline time / time; %d threads everywhere):\n",
              ts::cpu::num_threads());
  for (const ratio_line& line : ratio_lines) print_ratio(reporter.results, line);
#if !TESSERA_GEMM_HAS_BLAS
  std::printf("openblas: no BLAS at configure time (TESSERA_WITH_BLAS found none)\n");
#endif
#if !TESSERA_BENCH_EIGEN
  std::printf("eigen: Eigen3 not found at configure time\n");
#endif
  return 0;
}
