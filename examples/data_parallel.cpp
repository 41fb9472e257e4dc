// PyTorch's "Optional: Data Parallelism" tutorial in Tessera: a model that prints the sizes it
// sees, wrapped in DataParallel over every device (virtual CPU devices here: run it with
// TESSERA_CPU_DEVICES=2), so each replica reports its piece of the batch; then the same wrapper
// trains the model through a compiled program, the batch split over the devices at every step.
#include <cstdio>

#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

// A model with a default constructor, so that DataParallel can make replicas of it.
struct Model : nn::Module {
  nn::Linear<float> fc;
  Model(int input_size = 5, int output_size = 2) : fc(input_size, output_size) {
    register_module("fc", fc);
  }
  template <class X>
  auto forward(const X& x) const {
    auto output = fc(x);
    // Traced programs print once, when compiled; eager calls every time.
    std::printf("\tIn Model: input size %s output size %s\n", x.shape().str().c_str(),
                output.shape().str().c_str());
    return output;
  }
};

int main() {
  const std::int64_t input_size = 5, output_size = 2, batch_size = 30, data_size = 100;
  const int devices = ts::cpu::device_count();
  if (devices > 1) std::printf("Let's use %d devices!\n", devices);

  ts::manual_seed(0);
  Model model(input_size, output_size);
  ts::parallel::DataParallel dp(model);  // every device; the model stays on cpu:0

  // The tutorial's random data set, in batches of 30 (the last one has 10).
  const auto data = ts::randn<float>({data_size, input_size});
  for (std::int64_t first = 0; first < data_size; first += batch_size) {
    const auto input = data.narrow(0, first, std::min(batch_size, data_size - first));
    const ts::Tensor<float> output = dp(input);
    std::printf("Outside: input size %s output_size %s\n", input.shape().str().c_str(),
                output.shape().str().c_str());
  }

  // Training: labels from a fixed rule, cross entropy, SGD; the batch split over the devices.
  std::vector<std::int64_t> rule(static_cast<std::size_t>(batch_size));
  const auto inputs = data.narrow(0, 0, batch_size).contiguous();
  const std::vector<float> values = inputs.to_vector();
  for (std::size_t i = 0; i < rule.size(); ++i) rule[i] = values[i * 5] + values[i * 5 + 1] > 0;
  const auto labels = ts::from_vector<std::int64_t>(rule, {batch_size});
  auto step = dp.compile(
      [](Model& m, ag::Var<float> x, ag::Var<std::int64_t> y) {
        return nn::cross_entropy(m.forward(x), y);
      },
      ag::input<float>({batch_size, input_size}), ag::input<std::int64_t>({batch_size}));
  std::printf("Training over %d device(s), pieces of", step.devices());
  for (std::int64_t size : step.split_sizes()) std::printf(" %lld", static_cast<long long>(size));
  std::printf(" samples\n");
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.5});
  float first_loss = 0, loss = 0;
  for (int i = 0; i < 50; ++i) {
    sgd.zero_grad();
    loss = step.forward(inputs, labels).item();
    step.backward();
    sgd.step();
    if (i == 0) first_loss = loss;
    if (i % 10 == 0 || i == 49) std::printf("step %2d: loss %.4f\n", i, static_cast<double>(loss));
  }
  // The checkpoint carries PyTorch's `module.` prefix, as torch.nn.DataParallel's does.
  std::printf("state dict keys: ");
  for (const auto& [key, value] : dp.state_dict()) std::printf("%s ", key.c_str());
  std::printf("\n");
  if (!(loss < 0.5f * first_loss)) {
    std::printf("the loss did not fall: %.4f -> %.4f\n", static_cast<double>(first_loss),
                static_cast<double>(loss));
    return 1;
  }
  return 0;
}
