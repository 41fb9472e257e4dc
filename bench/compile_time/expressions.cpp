// The compile-time probe: includes everything and evaluates a few fused expressions. Compiled by
// bench/compile_time.sh; the budget is 5 s with g++ -O2 on the CI machine.
#include <tessera/tessera.hpp>
namespace ts = tessera;
int main() {
  auto a = ts::rand<float>({1000}); auto b = ts::rand<float>({1000});
  ts::Tensor<float> y = a * 2 + b * a;
  ts::Tensor<float> z = ts::sigmoid(a * b + y) * ts::tanh(b);
  z += 1;
  return static_cast<int>(z.numel());
}
