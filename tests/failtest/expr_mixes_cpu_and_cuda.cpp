// expect: mixes a tensor on the cpu with a tensor on cuda.+x.to<tessera::cuda>
// One expression cannot read a cpu tensor and a cuda tensor: the kinds are types, so this is a
// compile error whose static_assert says how to move an operand (DESIGN §1.1).
#include "tessera/tessera.hpp"

int main() {
  tessera::Tensor<float, tessera::cpu> on_cpu;
  tessera::Tensor<float, tessera::cuda> on_cuda;
  auto mixed = on_cpu * 2 + on_cuda;
  return mixed.shape().size();
}
