// expect: Linear<T>: the input's dtype is not the layer's T; convert it with .to<T>\(\)
// A layer's dtype is a type: a float64 input to a float32 Linear is a compile error that says how
// to convert it, not a run-time dtype_error from inside matmul.
#include "tessera/tessera.hpp"

int main() {
  tessera::nn::Linear<float> layer(3, 2);
  auto y = layer(tessera::zeros<double>({4, 3}));
  return y.dim();
}
