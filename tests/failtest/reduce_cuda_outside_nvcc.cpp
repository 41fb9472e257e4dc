// expect: reducing an expression on cuda tensors launches CUDA kernels
// A g++-compiled file may hold cuda tensors, but reducing one runs CUB and Tessera's row kernels,
// which only nvcc can compile (DESIGN §2): the static_assert says so.
#include "tessera/tessera.hpp"

int main() {
  tessera::Tensor<float, tessera::cuda> x;
  auto total = tessera::sum(x * 2.0f, 0);
  return total.dim();
}
