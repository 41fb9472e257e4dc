// expect: negation, the '-' operator, on a bool tensor is not supported
// -x on a bool tensor is refused at compile time, as PyTorch refuses it at run time.
#include "tessera/tessera.hpp"

int main() {
  auto mask = tessera::zeros<bool>({3});
  tessera::Tensor<bool> negated = -mask;
  return static_cast<int>(negated.numel());
}
