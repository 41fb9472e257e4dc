// expect: matmul: the operands are on different device kinds .cpu and cuda.. move one with .+ first
// Device kinds are types: a product of a cpu tensor and a cuda tensor does not compile (move one
// operand first). Creating the tensors is fine; only the call to matmul is rejected.
#include "tessera/expr/matmul.hpp"

int main() {
  tessera::Tensor<float, tessera::cpu> a;
  tessera::Tensor<float, tessera::cuda> b;
  auto c = tessera::matmul(a, b);
  return c.defined() ? 1 : 0;
}
