// Fused expressions: one statement is one pass (one CPU loop here, one CUDA kernel on a GPU),
// with broadcasting and PyTorch's type promotion; reductions that read an expression without
// materialising it; a matmul; the launch counter; and the error a device mismatch gives.
#include <iostream>

#include "tessera/tessera.hpp"

namespace ts = tessera;

int main() {
  ts::manual_seed(0);
  auto a = ts::rand<float>({2, 3});
  auto b = ts::rand<float>({2, 3});
  auto bias = ts::arange<float>(0, 3);  // shape [3]: broadcasts over the rows
  std::cout << "a = " << a << "\nbias = " << bias << "\n";

  // Lazy until assigned: this whole line is one pass over the data.
  ts::profiler::reset_kernel_launches();
  ts::Tensor<float> y = ts::sigmoid(a * b + bias) * ts::tanh(a) - 0.5f;
  const auto passes = ts::profiler::kernel_launches();  // read before printing (a copy is a pass)
  std::cout << "y = sigmoid(a * b + bias) * tanh(a) - 0.5 = " << y << "\n";
  std::cout << "passes for that statement: " << passes << "\n";
  if (passes != 1) return 1;

  // In place, into y's storage; views see the result.
  auto first_row = y[0];
  y += 1;
  std::cout << "after y += 1, y[0] = " << first_row << "\n";

  // Type promotion as in PyTorch: int with float gives float, / is true division.
  auto counts = ts::arange<std::int32_t>(0, 4);
  auto halves = ts::eval(counts / 2);
  std::cout << "int32 / 2 = " << halves << " (dtype " << halves.dtype() << ")\n";
  auto mask = ts::eval(a > 0.5f);
  std::cout << "a > 0.5 = " << mask << "\n";
  std::cout << "where(a > 0.5, a, 0) = " << ts::eval(ts::where(a > 0.5f, a, 0.0f)) << "\n";

  // Reductions read the expression directly: no temporary for a * b.
  std::cout << "sum(a * b) = " << ts::sum(a * b).item() << "\n";
  std::cout << "mean over dim 1 = " << ts::mean(a, 1) << "\n";
  std::cout << "max over dim 0, keepdim = " << ts::max(a, 0, true) << "\n";
  std::cout << "argmax over dim 1 = " << ts::argmax(a, 1) << "\n";
  std::cout << "softmax over dim 1 = " << ts::softmax(a, 1) << "\n";

  // Matrix products honour transposed views without copying them.
  auto w = ts::rand<float>({3, 4});
  std::cout << "matmul(a, w) = " << ts::matmul(a, w) << "\n";
  std::cout << "matmul(w.t(), a.t()) = " << ts::matmul(w.t(), a.t()) << "\n";

  // Operands on different ordinals are an error naming both devices (two virtual CPU devices).
  if (ts::cpu::device_count() >= 2) {
    auto elsewhere = b.to(1);
    try {
      auto bad = a + elsewhere;
      std::cout << "unexpected: built " << bad.shape() << "\n";
      return 1;
    } catch (const ts::device_mismatch_error& e) {
      std::cout << "a + b.to(1) -> device_mismatch_error: " << e.what() << "\n";
    }
  }
  // Shapes that do not broadcast name both shapes.
  try {
    auto bad = a + ts::ones<float>({4});
    std::cout << "unexpected: built " << bad.shape() << "\n";
    return 1;
  } catch (const ts::shape_error& e) {
    std::cout << "a + ones({4}) -> shape_error: " << e.what() << "\n";
  }
  return 0;
}
