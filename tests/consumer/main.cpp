// A user's program, written the way the README tells users to: one include, `ts::`. Built twice
// by tests/consumer/CMakeLists.txt: header-only (tessera::tessera) and in compiled mode
// (tessera::compiled, which nvcc builds when Tessera has CUDA: then this g++ unit also trains on
// a GPU when one is there).
#include <tessera/tessera.hpp>

#include <iostream>
#include <string>
#include <vector>

namespace ts = tessera;

namespace {

// True when the mse loss of `layer(x)` against zeros falls over five SGD steps; says why not.
// The autograd program, the module registry and the optimiser are what tessera::compiled holds,
// so the compiled-mode build really links against it.
template <ts::DeviceKind K>
bool loss_falls(const ts::Tensor<float>& host_x, const std::string& who) {
  auto x = host_x.to<K>(0);
  ts::nn::Linear<float, K> layer(3, 1, true, 0);
  auto step = ts::autograd::compile(
      [&](ts::autograd::Var<float, K> in) {
        return ts::nn::mse_loss(layer.forward(in), ts::zeros<float, K>({2, 1}, 0));
      },
      ts::autograd::input<float, K>({2, 3}, 0));
  ts::optim::SGD sgd(layer.parameters(), {.lr = 0.01});  // stable for inputs up to ~10
  float first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    sgd.zero_grad();
    last = step.forward(x).item();
    if (i == 0) first = last;
    step.backward();
    sgd.step();
  }
  if (!(last < first)) {
    std::cerr << who << ": the loss did not fall (" << first << " -> " << last << ")\n";
    return false;
  }
  std::cout << who << ": loss " << first << " -> " << last << "\n";
  return true;
}

}  // namespace

int main() {
#if defined(TESSERA_COMPILED) && TESSERA_COMPILED
  const std::string who = "consumer (compiled mode)";
#else
  const std::string who = "consumer";
#endif
  const auto host = ts::Device::parse("cpu");
  std::cout << who << ": " << host.str() << " (" << ts::cpu::device_count()
            << " virtual), cuda " << (ts::cuda::is_available() ? "available" : "not available")
            << "\n";
  auto x = ts::arange<float>(6).reshape({2, 3});
  const std::vector<float> expected{0, 1, 2, 3, 4, 5};
  if (x.shape() != ts::Shape{2, 3} || x.to_vector() != expected) {
    std::cerr << who << ": arange(6).reshape({2, 3}) is wrong\n";
    return 1;
  }
  if (!loss_falls<ts::cpu>(x, who + " on cpu:0")) return 1;
#if TESSERA_CUDA && defined(TESSERA_COMPILED) && TESSERA_COMPILED
  // A g++ unit evaluates CUDA expressions through the kernels of tessera::compiled.
  if (ts::cuda::is_available()) {
    if (!loss_falls<ts::cuda>(x, who + " on cuda:0")) return 1;
  } else {
    std::cout << who << ": no GPU, the CUDA step is skipped\n";
  }
#endif
  std::cout << who << ": ok\n";
  return 0;
}
