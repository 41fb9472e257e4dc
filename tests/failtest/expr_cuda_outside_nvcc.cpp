// expect: this translation unit must be compiled by nvcc
// A g++-compiled file may hold cuda tensors, but evaluating an expression of them launches a
// kernel, which only nvcc can compile (DESIGN §2): the static_assert says so.
#include "tessera/tessera.hpp"

int main() {
  tessera::Tensor<float, tessera::cuda> x;
  tessera::Tensor<float, tessera::cuda> y = tessera::exp(x) + 1;
  return y.dim();
}
