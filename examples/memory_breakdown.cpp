// Where the memory of a training step goes, step by step: parameters, inputs, the planned arena
// of activations and temporaries (allocated once, at the first forward), parameter gradients (at
// the first backward) and optimiser state (at the first step); then what the plan says before
// running anything: inference against training, checkpointing, and the largest batch that fits
// a budget.
#include <cstdio>

#include "tessera/tessera.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

struct Mlp : nn::Module {
  nn::Linear<float> fc1, fc2, fc3;
  explicit Mlp(int device) : fc1(784, 512, true, device), fc2(512, 512, true, device), fc3(512, 10, true, device) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc3(ts::relu(fc2(ts::relu(fc1(x)))));
  }
};

namespace {
void show(const char* what, ts::Device d) {
  std::printf("%-44s allocated %10s  (%lld allocations)\n", what,
              ts::memory::format_bytes(ts::memory::allocated(d)).c_str(),
              static_cast<long long>(ts::memory::stats(d).allocations.current));
}
}  // namespace

int main() {
  const ts::Device d = ts::Device::parse("cpu:0");
  const std::int64_t batch = 64;
  show("start", d);
  Mlp model(0);
  show("model: parameters", d);
  const auto x = ts::randn<float>({batch, 784});
  const auto y = ts::randn<float>({batch, 10});
  show("+ a batch of inputs and targets", d);

  auto loss_of = [&](ag::Var<float> input, ag::Var<float> target) {
    return nn::mse_loss(model.forward(input), target);
  };
  auto program = ag::compile(loss_of, ag::input<float>({batch, 784}), ag::input<float>({batch, 10}));
  show("+ compiled program (nothing allocated yet)", d);
  ts::optim::Adam adam(model.parameters(), {.lr = 1e-3});
  program.forward(x, y);
  show("+ first forward: the planned arena", d);
  program.backward();
  show("+ first backward: parameter gradients", d);
  adam.step();
  show("+ first Adam step: two state buffers each", d);
  const auto before = ts::memory::stats(d).allocations.allocated;
  for (int i = 0; i < 3; ++i) {
    adam.zero_grad();
    program.forward(x, y);
    program.backward();
    adam.step();
  }
  std::printf("three more steps made %lld allocator calls\n\n",
              static_cast<long long>(ts::memory::stats(d).allocations.allocated - before));

  std::printf("training plan:\n%s\n", program.memory_report().c_str());
  auto inference = ag::compile(loss_of, ag::input<float>({batch, 784}), ag::input<float>({batch, 10}),
                               ag::Options{.mode = ag::Mode::inference});
  std::printf("inference plan: arena %s (training: %s)\n",
              ts::memory::format_bytes(inference.plan().planned_bytes).c_str(),
              ts::memory::format_bytes(program.plan().planned_bytes).c_str());
  auto checkpointed = ag::compile(loss_of, ag::input<float>({batch, 784}), ag::input<float>({batch, 10}),
                                  ag::Options{.checkpoint = {.segments = 2}});
  std::printf("checkpointed (2 segments): arena %s, %d forward steps recomputed in backward\n\n",
              ts::memory::format_bytes(checkpointed.plan().planned_bytes).c_str(),
              checkpointed.plan().recomputed_steps);

  for (std::size_t mib : {16, 32, 128}) {
    const std::size_t budget = mib << 20;
    const auto plain = ag::max_batch_size(loss_of, ag::input<float>({1, 784}), ag::input<float>({1, 10}),
                                          ag::Budget{.bytes = budget, .optimizer_buffers = 2});
    const auto with_checkpoints = ag::max_batch_size(
        loss_of, ag::input<float>({1, 784}), ag::input<float>({1, 10}),
        ag::Budget{.bytes = budget, .optimizer_buffers = 2, .options = {.checkpoint = {.segments = 2}}});
    std::printf("budget %4zu MiB with Adam: largest batch %lld (checkpointed: %lld)\n", mib,
                static_cast<long long>(plain), static_cast<long long>(with_checkpoints));
  }
  return 0;
}
