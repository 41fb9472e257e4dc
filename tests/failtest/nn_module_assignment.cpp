// expect: use of deleted function.*operator=
// Modules are handles registered by their parents: assigning one would re-point a member behind
// the parent's registry, so assignment is deleted (copies alias instead).
#include "tessera/tessera.hpp"

int main() {
  tessera::nn::Linear<float> a(3, 2), b(3, 2);
  a = b;
  return 0;
}
