// expect: rand/randn make floating-point tensors
// Random factories draw floating-point numbers; asking for integers is a compile error.
#include "tessera/tensor.hpp"

int main() {
  auto t = tessera::rand<int>({2, 2});
  return static_cast<int>(t.numel());
}
