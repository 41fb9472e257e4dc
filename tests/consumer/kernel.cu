// A user's own CUDA unit (nvcc): its expression is fused into one kernel compiled here. Runs the
// same expression on the CPU, and on cuda:0 when there is a GPU, against hand-computed values.
#include <tessera/tessera.hpp>

#include <cstdio>
#include <vector>

namespace ts = tessera;

template <ts::DeviceKind K>
bool check(const char* where) {
  auto a = ts::arange<float, K>(0, 4, 1, 0);
  auto b = ts::full<float, K>({4}, 2.0f, 0);
  ts::Tensor<float, K> y = ts::relu(a * b - 3.0f) + a;  // one fused kernel
  ts::Tensor<float, K> s = ts::sum(a * b);              // one fused reduction
  const std::vector<float> expected{0, 1, 3, 6};       // relu({-3, -1, 1, 3}) + {0, 1, 2, 3}
  const bool ok = y.template to<ts::cpu>().to_vector() == expected &&
                  s.template to<ts::cpu>().item() == 12.0f;
  std::printf("consumer_cuda: %s %s\n", where, ok ? "ok" : "WRONG");
  return ok;
}

int main() {
  if (!check<ts::cpu>("cpu:0")) return 1;
  if (!ts::cuda::is_available()) {
    std::printf("consumer_cuda: no GPU, the CUDA expression is skipped\n");
    return 0;
  }
  return check<ts::cuda>("cuda:0") ? 0 : 1;
}
