// The compile-time probe of a CUDA training program (issue 45): a two-layer MLP on cuda:0,
// cross_entropy, a compiled autograd program, Adam, three steps. Compiled by nvcc (header-only,
// and in compiled mode: budgets 60 s and 30 s of CPU) and, as a .cpp unit, by g++ linking
// tessera::compiled built with CUDA (budget 8 s).
#include <tessera/tessera.hpp>
namespace ts = tessera;
int main() {
  ts::nn::Sequential net(ts::nn::Linear<float, ts::cuda>(64, 128, true, 0), ts::nn::ReLU(),
                         ts::nn::Linear<float, ts::cuda>(128, 10, true, 0));
  auto program = ts::autograd::compile(
      [&](auto x, auto y) { return ts::nn::cross_entropy(net(x), y); },
      ts::autograd::input<float, ts::cuda>({32, 64}, 0),
      ts::autograd::input<std::int64_t, ts::cuda>({32}, 0));
  ts::optim::Adam opt(net.parameters(), {.lr = 1e-3});
  auto x = ts::randn<float, ts::cuda>({32, 64}, 0);
  auto y = ts::zeros<std::int64_t, ts::cuda>({32}, 0);
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    (void)program.forward(x, y);
    program.backward();
    opt.step();
  }
}
