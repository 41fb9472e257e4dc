// tests/cuda_gxx/programs.hpp compiled by nvcc: the same programs as training_test.cpp's g++ unit,
// with this unit's expressions fused into kernels of its own, for that test to compare with.
#include <vector>

#include "cuda_gxx/run_result.hpp"
#include "tessera/tessera.hpp"

namespace nvcc_twin {
namespace ts = tessera;
#include "cuda_gxx/programs.hpp"
}  // namespace nvcc_twin

namespace cuda_gxx_test {
run_result nvcc_train_mlp(int steps) {
  return nvcc_twin::train_mlp<tessera::cuda>(steps);
}
run_result nvcc_train_conv(int steps) {
  return nvcc_twin::train_conv<tessera::cuda>(steps);
}
std::vector<double> nvcc_eager_expressions() {
  return nvcc_twin::eager_expressions<tessera::cuda>();
}
}  // namespace cuda_gxx_test
