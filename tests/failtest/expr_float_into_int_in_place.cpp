// expect: in-place operation.s result type cannot be cast to the tensor.s dtype
// As in PyTorch, an in-place operation cannot store a floating result into an integer tensor
// (int_tensor += 0.5 would silently truncate): a static_assert names the rule.
#include <cstdint>

#include "tessera/tessera.hpp"

int main() {
  auto counts = tessera::zeros<std::int32_t>({3});
  counts += 0.5;
  return static_cast<int>(counts.numel());
}
