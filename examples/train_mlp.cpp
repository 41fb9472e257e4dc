// Train a user-defined model on synthetic data until the loss falls, save it as safetensors,
// load it into a fresh model and check that the predictions agree.
//
// The model is a plain struct: Linear members, a constructor that registers them (PyTorch's
// names: fc1.weight, ...), and a templated forward that serves both eager tensors (prediction)
// and autograd Vars (the compiled training step).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "tessera/tessera.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

struct Net : nn::Module {
  nn::Linear<float> fc1{2, 32}, fc2{32, 32}, fc3{32, 3};
  Net() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc3(ts::relu(fc2(ts::relu(fc1(x)))));
  }
};

int main() {
  ts::manual_seed(0);
  // Three classes of points in the plane: which of three rays a point is closest to in angle.
  const int n = 256;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> points;
  std::vector<std::int64_t> labels;
  for (int i = 0; i < n; ++i) {
    const float x = uniform(rng), y = uniform(rng);
    points.push_back(x);
    points.push_back(y);
    const double angle = std::atan2(y, x) + M_PI;  // [0, 2 pi)
    labels.push_back(static_cast<std::int64_t>(angle / (2 * M_PI / 3)) % 3);
  }
  const auto inputs = ts::from_vector<float>(points, {n, 2});
  const auto targets = ts::from_vector<std::int64_t>(labels, {n});

  Net model;
  // The training step, traced once: cross entropy of the model's logits.
  auto step = ag::compile(
      [&](ag::Var<float> x) { return nn::cross_entropy(model.forward(x), targets); },
      ag::input<float>({n, 2}));
  ts::optim::Adam adam(model.parameters(), {.lr = 0.01});
  std::printf("%s\n", step.memory_report().c_str());

  double first = 0, loss = 0;
  for (int epoch = 0; epoch < 300; ++epoch) {
    adam.zero_grad();
    loss = step.forward(inputs).item();
    step.backward();
    adam.step();
    if (epoch == 0) first = loss;
    if (epoch % 50 == 0) std::printf("epoch %3d  loss %.4f\n", epoch, loss);
  }
  std::printf("loss %.4f -> %.4f\n", first, loss);
  if (!(loss < 0.5 * first)) {
    std::printf("the loss did not fall enough\n");
    return 1;
  }

  // Accuracy with the eager forward (no graph: the inference path).
  const auto predicted = ts::argmax(model.forward(inputs), 1).to_vector();
  int correct = 0;
  for (int i = 0; i < n; ++i) correct += predicted[static_cast<std::size_t>(i)] == labels[static_cast<std::size_t>(i)];
  std::printf("training accuracy %.1f%%\n", 100.0 * correct / n);

  // Save, load into a fresh model, compare.
  const auto path = (std::filesystem::temp_directory_path() / "tessera_train_mlp.safetensors").string();
  ts::save(model.state_dict(), path);
  Net restored;
  restored.load_state_dict(ts::load(path));
  const auto a = model.forward(inputs).to_vector();
  const auto b = restored.forward(inputs).to_vector();
  std::printf("saved to %s and reloaded: predictions %s\n", path.c_str(),
              a == b ? "identical" : "DIFFER");
  std::filesystem::remove(path);
  return a == b ? 0 : 1;
}
