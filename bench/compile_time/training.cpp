// The compile-time probe of a user's smallest training program (issue 9): a Sequential MLP,
// cross_entropy, a compiled autograd program, Adam, three steps. Budget: 8 s of CPU, g++ -O2.
#include <tessera/tessera.hpp>
namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
int main() {
  auto model = nn::Sequential(nn::Linear<float>(784, 128), nn::ReLU{}, nn::Linear<float>(128, 10));
  auto step = ag::compile(
      [&](ag::Var<float> x, ag::Var<std::int64_t> y) { return nn::cross_entropy(model.forward(x), y); },
      ag::input<float>({64, 784}), ag::input<std::int64_t>({64}));
  ts::optim::Adam adam(model.parameters(), {.lr = 1e-3});
  const auto x = ts::randn<float>({64, 784});
  const auto y = ts::zeros<std::int64_t>({64});
  float loss = 0;
  for (int i = 0; i < 3; ++i) {
    adam.zero_grad();
    loss = step.forward(x, y).item();
    step.backward();
    adam.step();
  }
  return loss > 0 ? 0 : 1;
}
