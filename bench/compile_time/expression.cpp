// The compile-time probe of one fused expression (issue 9): budget 4 s of CPU, g++ -O2.
#include <tessera/tessera.hpp>
namespace ts = tessera;
int main() {
  auto a = ts::rand<float>({1000});
  auto b = ts::rand<float>({1000});
  ts::Tensor<float> y = ts::sigmoid(a * b + 1.0f) * ts::tanh(b);
  return static_cast<int>(y.numel());
}
