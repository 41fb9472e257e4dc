// A unit compiled by g++, not nvcc, that trains on a CUDA device: it links tessera::compiled,
// which nvcc compiled, so the library's layers, losses and optimisers run the library's kernels,
// and this unit's own expressions run one operation at a time (expr/detail/op_by_op.hpp). Each
// program (tests/cuda_gxx/programs.hpp) is checked against the same program on the CPU (which
// tests/nn, tests/optim and tests/autograd check against PyTorch) and against nvcc_twin.cu, the
// same source compiled by nvcc. Without a GPU the executable reports itself skipped; CI still
// builds and links it, so every kernel this unit needs is in the library.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "cuda_gxx/run_result.hpp"
#include "tessera/tessera.hpp"

static_assert(!TESSERA_CUDA_KERNELS && TESSERA_CUDA_OP_BY_OP,
              "tests/cuda_gxx: this file is compiled by g++ and links tessera::compiled");

namespace cuda_gxx_test {
namespace ts = tessera;
namespace gxx {
#include "cuda_gxx/programs.hpp"
}  // namespace gxx

// nvcc_twin.cu: the same programs on CUDA, compiled by nvcc.
run_result nvcc_train_mlp(int steps);
run_result nvcc_train_conv(int steps);
std::vector<double> nvcc_eager_expressions();

/// Elements of `actual` that are not within abs + rel * |expected| of `expected`.
std::size_t differing(const std::vector<double>& actual, const std::vector<double>& expected,
                      double rel, double abs) {
  REQUIRE(actual.size() == expected.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (!(std::abs(actual[i] - expected[i]) <= abs + rel * std::abs(expected[i]))) ++bad;
  }
  return bad;
}

void check_runs(const run_result& gpu, const run_result& cpu, const run_result& nvcc) {
  // Against the CPU: other summation orders (cuBLAS, cuDNN, the reductions' trees).
  CHECK(differing(gpu.losses, cpu.losses, 1e-4, 1e-6) == 0);
  CHECK(differing(gpu.parameters, cpu.parameters, 1e-3, 1e-5) == 0);
  // Against nvcc's build: the same kernels for the library's work; fused expressions compute
  // the same float values as the steps one at a time.
  CHECK(differing(gpu.losses, nvcc.losses, 1e-6, 1e-7) == 0);
  CHECK(differing(gpu.parameters, nvcc.parameters, 1e-5, 1e-7) == 0);
}

TEST_CASE("g++ unit: an MLP trains with Adam on cuda", "[cuda_gxx]") {
  const auto launches = ts::profiler::kernel_launches();
  const auto gpu = gxx::train_mlp<ts::cuda>(6);
  CHECK(ts::profiler::kernel_launches() > launches);  // the work ran as kernels
  check_runs(gpu, gxx::train_mlp<ts::cpu>(6), nvcc_train_mlp(6));
}

TEST_CASE("g++ unit: a convolutional net with batch norm and dropout trains with SGD on cuda",
          "[cuda_gxx]") {
  // Compared with the CPU at 1e-4: fp32 products, not cuDNN's TF32 (on by default, as PyTorch's;
  // about 1e-3). The switch is a plain atomic, set from this g++ unit.
  struct fp32_convolutions {
    bool previous = ts::backends::cudnn::allow_tf32.exchange(false);
    ~fp32_convolutions() { ts::backends::cudnn::allow_tf32 = previous; }
  } scope;
  check_runs(gxx::train_conv<ts::cuda>(4), gxx::train_conv<ts::cpu>(4), nvcc_train_conv(4));
}

TEST_CASE("g++ unit: dropout with CUDA graphs gives the plain program's masks", "[cuda_gxx]") {
  // The masks are drawn on the host in a g++ unit, which a graph cannot replay: the program
  // runs without graphs (or, where the linker took nvcc_twin.cu's kernel fill for this unit's,
  // replays it); either way each call's mask is the plain program's.
  ts::nn::Dropout dropout(0.5);
  const auto x = ts::ones<float, ts::cuda>({256}, 0);
  auto masks = [&](bool graphs, std::string& status) {
    auto program = ts::autograd::compile(
        [&](ts::autograd::Var<float, ts::cuda> v) { return dropout(v); },
        ts::autograd::input<float, ts::cuda>({256}, 0),
        ts::autograd::Options{.mode = ts::autograd::Mode::inference, .cuda_graph = graphs});
    ts::manual_seed(5);
    std::vector<std::vector<float>> out;
    for (int i = 0; i < 4; ++i) out.push_back(program.forward(x).cpu(0).to_vector());
    status = program.cuda_graphs();
    return out;
  };
  std::string plain_status, status;
  const auto expected = masks(false, plain_status);
  CHECK(masks(true, status) == expected);
  CHECK(expected[2] != expected[3]);
  INFO(status);
  CHECK(
      (status.find("drawn on the host") != std::string::npos || status.rfind("replaying", 0) == 0));
}

TEST_CASE("g++ unit: its own expressions on cuda, one operation at a time", "[cuda_gxx]") {
  const auto gpu = gxx::eager_expressions<ts::cuda>();
  CHECK(differing(gpu, gxx::eager_expressions<ts::cpu>(), 1e-5, 1e-6) == 0);
  CHECK(differing(gpu, nvcc_eager_expressions(), 1e-6, 1e-7) == 0);
}

}  // namespace cuda_gxx_test
