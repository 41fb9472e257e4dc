// ResNet training on random data: torchvision's ResNet-50 (or ResNet-18), compiled once into a
// static-graph program, trained a few SGD steps on one fixed batch of random images and labels.
// Prints the loss and time of each step, where the steps after the first spend their time by
// node (ts::tools::Profile), the program's memory plan and the pool's statistics.
// The loss of a fixed batch must fall; the program exits 1 otherwise.
//
//   resnet50                                  # CI size: ResNet-18, 64x64, batch 8, 4 steps
//   resnet50 --model resnet50 --size 224 --batch 8 --steps 3     # the real thing
//   resnet50 --save resnet.safetensors        # a state dict torchvision's model loads
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tessera/models/resnet.hpp"
#include "tessera/tessera.hpp"
#include "tessera/tools/profile.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;

namespace {

struct Settings {
  std::string model = "resnet18";
  std::int64_t size = 64;
  std::int64_t batch = 8;
  int steps = 4;
  std::int64_t classes = 10;
  std::string save;
};

template <class Model>
int train(Model model, const Settings& s) {
  const ts::Device device = ts::Device::parse("cpu:0");
  std::printf("%s: %zu parameter tensors, %s of parameters; batch %lld at %lldx%lld\n",
              s.model.c_str(), model.parameters().size(),
              ts::memory::format_bytes(ts::memory::allocated(device)).c_str(),
              static_cast<long long>(s.batch), static_cast<long long>(s.size),
              static_cast<long long>(s.size));
  const auto images = ts::randn<float>({s.batch, 3, s.size, s.size});
  std::vector<std::int64_t> label_values;
  for (std::int64_t i = 0; i < s.batch; ++i) label_values.push_back(i % s.classes);
  const auto labels = ts::from_vector<std::int64_t>(label_values, {s.batch});

  auto step = ag::compile(
      [&](const auto& x, const auto& y) { return ts::nn::cross_entropy(model(x), y); },
      ag::input<float>(images.shape()), ag::input<std::int64_t>(labels.shape()));
  std::printf("\nmemory plan of the training step:\n%s\n", step.memory_report().c_str());
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.02, .momentum = 0.9});

  double first = 0, last = 0;
  auto run_step = [&](int i) {
    const auto start = std::chrono::steady_clock::now();
    const ts::profiler::range whole("step", device);
    sgd.zero_grad();
    last = step.forward(images, labels).item();
    step.backward();
    sgd.step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i == 0) first = last;
    std::printf("step %d  loss %.4f  %.3f s\n", i, last, seconds);
  };
  run_step(0);  // the first step allocates the program's arena
  // Where the later steps spend their time, by node (torch.profiler's table).
  ts::tools::Profile profile;
  {
    auto recording = profile.record();
    for (int i = 1; i < s.steps; ++i) run_step(i);
  }
  std::printf("\nsteps 1-%d by node:\n%s", s.steps - 1, profile.table(12).c_str());
  std::printf("\npeak allocated %s (planned peak of the step %s)\n",
              ts::memory::format_bytes(ts::memory::peak_allocated(device)).c_str(),
              ts::memory::format_bytes(step.plan().peak_bytes).c_str());
  std::printf("%s\n", ts::memory::summary(device).c_str());
  if (!s.save.empty()) {
    ts::save(model.state_dict(), s.save);
    std::printf("saved the state dict to %s\n", s.save.c_str());
  }
  if (!(std::isfinite(last) && last < first)) {
    std::printf("the loss did not fall: %.4f -> %.4f\n", first, last);
    return 1;
  }
  std::printf("loss %.4f -> %.4f\n", first, last);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char* flag) -> const char* {
      if (std::strcmp(argv[i], flag) != 0 || i + 1 >= argc) return nullptr;
      return argv[++i];
    };
    if (const char* v = value("--model")) {
      s.model = v;
    } else if (const char* v = value("--size")) {
      s.size = std::atoll(v);
    } else if (const char* v = value("--batch")) {
      s.batch = std::atoll(v);
    } else if (const char* v = value("--steps")) {
      s.steps = std::atoi(v);
    } else if (const char* v = value("--save")) {
      s.save = v;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--model resnet18|resnet50] [--size N] [--batch B] [--steps S] "
                   "[--save FILE]\n", argv[0]);
      return 2;
    }
  }
  if (s.size < 32 || s.batch < 1 || s.steps < 2) {
    std::fprintf(stderr, "expected --size >= 32, --batch >= 1 and --steps >= 2\n");
    return 2;
  }
  ts::manual_seed(0);
  if (s.model == "resnet50") return train(ts::models::resnet50<float>(s.classes), s);
  if (s.model == "resnet18") return train(ts::models::resnet18<float>(s.classes), s);
  std::fprintf(stderr, "unknown model %s (resnet18 or resnet50)\n", s.model.c_str());
  return 2;
}
