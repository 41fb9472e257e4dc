// expect: satisfaction of .+operand<B>.+with B = std::vector<float
// An operand must be a tensor, an expression or a number; the compiler names the `operand`
// concept and the offending type instead of failing deep inside the expression machinery.
#include <vector>

#include "tessera/tessera.hpp"

int main() {
  auto a = tessera::ones<float>({2});
  auto e = a + std::vector<float>{1.0f, 2.0f};
  return static_cast<int>(e.shape().size());
}
