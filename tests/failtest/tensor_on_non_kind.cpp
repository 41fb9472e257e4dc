// expect: satisfaction of .+DeviceKind<Kind>.+with Kind = tpu
// The second template argument of Tensor is a device kind (tessera::cpu or tessera::cuda).
#include "tessera/tensor.hpp"

struct tpu {};

int main() {
  tessera::Tensor<float, tpu> t;
  return t.defined() ? 1 : 0;
}
