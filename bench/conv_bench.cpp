// conv_bench: convolutions and a ResNet-50 training step against LibTorch (Debian's build, which
// convolves with oneDNN) in the same run.
//
// - conv_<layer>: forward + backward (input and weight gradients) of ResNet-50's layer shapes at
//   batch 8, as a compiled program of sum(conv(x) * g), against torch::conv2d with autograd; and
//   gemm_<layer>: the three GEMMs of the same sizes alone (forward, weight gradient, input
//   gradient, one per pass of the CPU loops: an image, or several when an image is small), so
//   "GEMM share" = gemm time / conv time says how much of the convolution is GEMM (im2col,
//   col2im and the rest make up the remainder).
// - conv_nhwc_<layer> (three layers): the same forward + backward with x, the weight, g and
//   every gradient channels_last (NHWC), against the NCHW row of the same layer in the same run
//   and against LibTorch on channels_last tensors.
// - resnet50_step: a ResNet-50 training step (forward, backward, SGD with momentum) at batch 8,
//   224x224, Tessera's compiled program against LibTorch's eager autograd, same weights and data;
//   the first losses are checked to agree.
// - peak memory of that step: each run in a child process (fork, before any thread exists) from
//   a fresh start, reporting its peak resident set growth (VmHWM - VmRSS at start), the same
//   measure for both; Tessera's pool peak is printed beside it.
//
// - with TESSERA_CONV_BENCH_PAIRS=N: N ResNet-50 steps of each in alternation, after the rows,
//   then for each layer N pairs of 3 calls of each in alternation.
//
// Arguments: Google Benchmark's (e.g. --benchmark_filter=conv_). TESSERA_CONV_BENCH_SIZE=N
// scales the ResNet input (default 224) for a quick run.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench_report.hpp"
#include "resnet50_layers.hpp"
#include "tessera/models/resnet.hpp"
#include "tessera/tessera.hpp"

#if TESSERA_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

namespace {

using layer = ts::bench::conv_layer;
const std::vector<layer>& layers() { return ts::bench::resnet50_conv_layers(); }
constexpr std::int64_t batch = 8;
using ts::bench::out_extent;

/// A layer that Tessera runs as Winograd F(2x2, 3x3) on CPU at batch 8 (its forward and both
/// gradients; the library's own choice): its rows are also timed on the im2col path.
bool winograd_layer(const layer& l) {
  const nn::Conv2dArgs args{.stride = l.stride, .padding = l.padding};
  return nn::detail::conv2d_winograd<float, ts::cpu>(nn::detail::conv2d_geometry_of(
      "conv2d", ts::Shape{batch, l.c, l.hw, l.hw}, ts::Shape{l.o, l.c, l.k, l.k}, nullptr, args));
}

/// Makes the convolutions traced in its lifetime run as im2col + GEMM (no Winograd).
struct without_winograd {
  std::int64_t saved = nn::detail::conv2d_winograd_min_channels();
  without_winograd() { nn::detail::conv2d_winograd_min_channels() = INT64_MAX; }
  ~without_winograd() { nn::detail::conv2d_winograd_min_channels() = saved; }
  without_winograd(const without_winograd&) = delete;
  without_winograd& operator=(const without_winograd&) = delete;
};

using ts::bench::random_tensor;

/// The layers also timed channels_last (conv_nhwc_ rows): a Winograd 3x3, a 1x1 and a stride-2
/// 3x3 layer of ResNet-50.
bool nhwc_layer(const layer& l) {
  return l.name == "3x3_64_56" || l.name == "1x1_256to64_56" || l.name == "3x3s2_128_56";
}

/// A convolution layer's forward and backward as a compiled program, with x, g, the weight and
/// the program's values laid out in `format` (contiguous_format or channels_last).
struct tessera_conv {
  nn::Conv2d<float> conv;
  ts::Tensor<float> x, g;
  ag::Program<ts::Tensor<float>> program;
  explicit tessera_conv(const layer& l,
                        ts::memory_format format = ts::memory_format::contiguous_format)
      : conv(l.c, l.o, l.k, {.stride = l.stride, .padding = l.padding, .bias = false}),
        x(random_tensor({batch, l.c, l.hw, l.hw}, 1).contiguous(format)),
        g(random_tensor({batch, l.o, out_extent(l), out_extent(l)}, 2).contiguous(format)),
        program(ag::compile(
            [this](const ag::Var<float>& input, const ag::Var<float>& grad) {
              return ts::sum(conv(input) * grad);
            },
            [&] {
              conv.to(format);  // before tracing: the program binds the weight as laid out
              auto spec = ag::input<float>(x.shape(), 0, format);
              spec.requires_grad = true;
              return spec;
            }(),
            ag::input<float>(g.shape(), 0, format))) {}
  float step() {
    conv.zero_grad();
    const float value = program.forward(x, g).item();
    program.backward();
    return value;
  }
};

/// The GEMMs of a convolution layer alone, on preallocated operands, as the CPU loops run them:
/// per pass (one image, or several side by side when an image has few output positions), or per
/// chunk of output rows when the layer cuts its images into chunks.
struct conv_gemms {
  ts::Tensor<float> w, col, y, dw, dcol;
  std::vector<std::int64_t> calls;  // the columns of each call's three GEMMs
  explicit conv_gemms(const layer& l) {
    const std::int64_t k = l.c * l.k * l.k, side = out_extent(l);
    const auto g = nn::detail::conv2d_geometry_of(
        "conv_gemms", ts::Shape{batch, l.c, l.hw, l.hw}, ts::Shape{l.o, l.c, l.k, l.k}, nullptr,
        {.stride = l.stride, .padding = l.padding});
    for (std::int64_t first = 0; first < batch; first += g.cpu_pass) {
      if (g.cpu_chunk == 0) {
        calls.push_back(std::min(g.cpu_pass, batch - first) * side * side);
        continue;
      }
      for (std::int64_t row = 0; row < side; row += g.cpu_chunk) {
        calls.push_back(std::min(g.cpu_chunk, side - row) * side);
      }
    }
    const std::int64_t most = *std::max_element(calls.begin(), calls.end());
    w = random_tensor({l.o, k}, 3);
    col = random_tensor({k, most}, 4);
    y = random_tensor({l.o, most}, 5);
    dw = ts::zeros<float>({l.o, k});
    dcol = ts::zeros<float>({k, most});
  }
  void run() {
    for (const std::int64_t columns : calls) {
      auto y_pass = y.narrow(1, 0, columns);
      auto dcol_pass = dcol.narrow(1, 0, columns);
      const auto col_pass = col.narrow(1, 0, columns);
      ts::detail::matmul_into(y_pass, w, col_pass);
      ts::detail::matmul_into(dw, y_pass, col_pass.t(), true);
      ts::detail::matmul_into(dcol_pass, w.t(), y_pass);
    }
  }
};

#if TESSERA_BENCH_TORCH
torch::Tensor to_torch(const ts::AnyTensor& any) {
  const auto t = any.as<float>().contiguous();
  std::vector<int64_t> sizes;
  for (int d = 0; d < t.dim(); ++d) sizes.push_back(t.size(d));
  return torch::from_blob(const_cast<float*>(t.data()), sizes, torch::kFloat32).clone();
}

struct torch_conv {
  torch::Tensor x, w, g;
  layer l;
  /// `channels_last`: x, w and g (and so the gradients) in torch's ChannelsLast format.
  torch_conv(const layer& layer_, const tessera_conv& source, bool channels_last = false)
      : l(layer_) {
    const auto format =
        channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
    x = to_torch(source.x).contiguous(format).requires_grad_();
    w = to_torch(source.conv.weight().value()).contiguous(format).requires_grad_();
    g = to_torch(source.g).contiguous(format);
  }
  float step() {
    x.mutable_grad() = torch::Tensor();
    w.mutable_grad() = torch::Tensor();
    auto y = torch::conv2d(x, w, {}, l.stride, l.padding);
    auto loss = (y * g).sum();
    loss.backward();
    return loss.item<float>();
  }
};

// torchvision's ResNet-50 in LibTorch, with the same module names as Tessera's (and
// torchvision's), so parameters and buffers copy over by key.
struct TorchBottleneckImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};
  TorchBottleneckImpl(int64_t inplanes, int64_t planes, int64_t stride) {
    using torch::nn::Conv2dOptions;
    conv1 = register_module("conv1", torch::nn::Conv2d(Conv2dOptions(inplanes, planes, 1).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(planes));
    conv2 = register_module(
        "conv2", torch::nn::Conv2d(Conv2dOptions(planes, planes, 3).stride(stride).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(planes));
    conv3 = register_module("conv3", torch::nn::Conv2d(Conv2dOptions(planes, planes * 4, 1).bias(false)));
    bn3 = register_module("bn3", torch::nn::BatchNorm2d(planes * 4));
    if (stride != 1 || inplanes != planes * 4) {
      downsample = register_module(
          "downsample",
          torch::nn::Sequential(
              torch::nn::Conv2d(Conv2dOptions(inplanes, planes * 4, 1).stride(stride).bias(false)),
              torch::nn::BatchNorm2d(planes * 4)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = torch::relu(bn2(conv2(out)));
    out = bn3(conv3(out));
    return torch::relu(out + (downsample ? downsample->forward(x) : x));
  }
};
TORCH_MODULE(TorchBottleneck);

struct TorchResNet50Impl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
  explicit TorchResNet50Impl(int64_t classes) {
    conv1 = register_module(
        "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(64));
    int64_t inplanes = 64;
    auto make = [&](int64_t planes, int blocks, int64_t stride) {
      torch::nn::Sequential seq;
      for (int i = 0; i < blocks; ++i) {
        seq->push_back(TorchBottleneck(i == 0 ? inplanes : planes * 4, planes, i == 0 ? stride : 1));
      }
      inplanes = planes * 4;
      return seq;
    };
    layer1 = register_module("layer1", make(64, 3, 1));
    layer2 = register_module("layer2", make(128, 4, 2));
    layer3 = register_module("layer3", make(256, 6, 2));
    layer4 = register_module("layer4", make(512, 3, 2));
    fc = register_module("fc", torch::nn::Linear(2048, classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 3, 2, 1);
    x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
    return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
};
TORCH_MODULE(TorchResNet50);
#endif

constexpr std::int64_t classes = 10;

std::int64_t image_size() { return ts::bench::env_int("TESSERA_CONV_BENCH_SIZE", 224); }

struct tessera_resnet {
  ts::models::ResNet50<float> model{classes};
  ts::Tensor<float> x = random_tensor({batch, 3, image_size(), image_size()}, 7);
  ts::Tensor<std::int64_t> labels = [] {
    std::vector<std::int64_t> values;
    for (std::int64_t i = 0; i < batch; ++i) values.push_back(i % classes);
    return ts::from_vector<std::int64_t>(values, {batch});
  }();
  ag::Program<ts::Tensor<float>> program{ag::compile(
      [this](const ag::Var<float>& input, const ag::Var<std::int64_t>& target) {
        return nn::cross_entropy(model(input), target);
      },
      ag::input<float>(x.shape()), ag::input<std::int64_t>(labels.shape()))};
  ts::optim::SGD sgd{model.parameters(), {.lr = 0.01, .momentum = 0.9}};
  float step() {
    sgd.zero_grad();
    const float loss = program.forward(x, labels).item();
    program.backward();
    sgd.step();
    return loss;
  }
};

#if TESSERA_BENCH_TORCH
struct torch_resnet {
  TorchResNet50 model{classes};
  torch::Tensor x, labels;
  std::unique_ptr<torch::optim::SGD> sgd;
  explicit torch_resnet(const tessera_resnet& source) {
    const ts::StateDict state = source.model.state_dict();
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) item.value().copy_(to_torch(state.at(item.key())));
    for (auto& item : model->named_buffers()) {
      if (item.key().find("num_batches_tracked") == std::string::npos) {
        item.value().copy_(to_torch(state.at(item.key())));
      }
    }
    x = to_torch(source.x);
    labels = torch::arange(0, batch, torch::kInt64) % classes;
    sgd = std::make_unique<torch::optim::SGD>(model->parameters(),
                                              torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  float step() {
    sgd->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), labels);
    loss.backward();
    sgd->step();
    return loss.item<float>();
  }
};

void check_close(const char* what, float mine, float theirs, float tolerance) {
  if (!(std::abs(mine - theirs) <= tolerance * (1 + std::abs(theirs)))) {
    std::fprintf(stderr, "conv_bench: %s: Tessera's %.8g differs from LibTorch's %.8g\n", what,
                 mine, theirs);
    std::abort();
  }
}
#endif

void register_benchmarks(int threads) {
  // Tessera's rows first, LibTorch's last: once LibTorch has run in a process, what runs after
  // it is slower (bench/RESULTS.md, "LibTorch last"), so no Tessera row may follow one of its
  // steps, its correctness checks included (they run in LibTorch's rows).
  for (const layer& l : layers()) {
    benchmark::RegisterBenchmark(("conv_tessera_" + l.name).c_str(), [l](benchmark::State& state) {
      ts::manual_seed(1);
      tessera_conv conv(l);
      float value = conv.step();
      for (auto _ : state) value = conv.step();
      benchmark::DoNotOptimize(value);
    })->UseRealTime()->Unit(benchmark::kMillisecond);
    if (winograd_layer(l)) {
      benchmark::RegisterBenchmark(("conv_tessera_im2col_" + l.name).c_str(),
                                   [l](benchmark::State& state) {
                                     ts::manual_seed(1);
                                     const auto conv = [&] {
                                       const without_winograd im2col;
                                       return std::make_unique<tessera_conv>(l);
                                     }();
                                     float value = conv->step();
                                     for (auto _ : state) value = conv->step();
                                     benchmark::DoNotOptimize(value);
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
    if (nhwc_layer(l)) {
      benchmark::RegisterBenchmark(("conv_nhwc_tessera_" + l.name).c_str(),
                                   [l](benchmark::State& state) {
                                     ts::manual_seed(1);
                                     tessera_conv conv(l, ts::memory_format::channels_last);
                                     float value = conv.step();
                                     for (auto _ : state) value = conv.step();
                                     benchmark::DoNotOptimize(value);
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark(("conv_gemm_" + l.name).c_str(), [l](benchmark::State& state) {
      conv_gemms gemms(l);
      gemms.run();
      for (auto _ : state) gemms.run();
    })->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("resnet50_step_tessera", [](benchmark::State& state) {
    ts::manual_seed(1);
    tessera_resnet net;
    float loss = net.step();
    for (auto _ : state) loss = net.step();
    if (!std::isfinite(loss)) state.SkipWithError("the loss is not finite");
  })->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(3);
#if TESSERA_BENCH_TORCH
  for (const layer& l : layers()) {
    const std::string name = "conv_torch_" + l.name;
    benchmark::RegisterBenchmark(name.c_str(), [l, threads](benchmark::State& state) {
      at::set_num_threads(threads);
      ts::manual_seed(1);
      tessera_conv source(l);
      torch_conv conv(l, source);
      float value = conv.step();
      check_close(l.name.c_str(), source.step(), value, 1e-3f);
      for (auto _ : state) value = conv.step();
      benchmark::DoNotOptimize(value);
    })->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  for (const layer& l : layers()) {
    if (!nhwc_layer(l)) continue;
    const std::string name = "conv_nhwc_torch_" + l.name;
    benchmark::RegisterBenchmark(
        name.c_str(),
        [l, threads](benchmark::State& state) {
          at::set_num_threads(threads);
          ts::manual_seed(1);
          tessera_conv source(l, ts::memory_format::channels_last);
          torch_conv conv(l, source, /*channels_last=*/true);
          float value = conv.step();
          check_close(("channels_last " + l.name).c_str(), source.step(), value, 1e-3f);
          if (!conv.x.grad().is_contiguous(torch::MemoryFormat::ChannelsLast)) {
            state.SkipWithError("LibTorch's input gradient is not channels_last");
          }
          for (auto _ : state) value = conv.step();
          benchmark::DoNotOptimize(value);
        })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("resnet50_step_torch", [threads](benchmark::State& state) {
    at::set_num_threads(threads);
    ts::manual_seed(1);
    tessera_resnet source;
    torch_resnet net(source);
    float loss = net.step();
    check_close("resnet50 first loss", source.step(), loss, 2e-3f);
    for (auto _ : state) loss = net.step();
    if (!std::isfinite(loss)) state.SkipWithError("the loss is not finite");
  })->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(3);
#else
  (void)threads;
#endif
}

#if TESSERA_BENCH_TORCH
/// Rounds of the paired measurements (TESSERA_CONV_BENCH_PAIRS, default 0: off).
int paired_rounds() {
  return static_cast<int>(ts::bench::env_int("TESSERA_CONV_BENCH_PAIRS", 0));
}

/// Times `steps` calls of mine() and then of theirs(), `rounds` times in alternation, so that
/// both sides of a pair run in the same minutes of the VM; prints each pair and the median of
/// the pairs' ratios (theirs / mine). False when a value is not finite.
template <class Mine, class Theirs>
bool paired(const std::string& title, int rounds, int steps, Mine&& mine, Theirs&& theirs) {
  using clock = std::chrono::steady_clock;
  std::vector<double> mine_ms, theirs_ms, ratios;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = clock::now();
    float a = 0, b = 0;
    for (int i = 0; i < steps; ++i) a = mine();
    const auto t1 = clock::now();
    for (int i = 0; i < steps; ++i) b = theirs();
    const auto t2 = clock::now();
    if (!std::isfinite(a) || !std::isfinite(b)) {
      std::printf("%s: a value is not finite (%g, %g)\n", title.c_str(), a, b);
      return false;
    }
    mine_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / steps);
    theirs_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count() / steps);
    ratios.push_back(theirs_ms.back() / mine_ms.back());
  }
  std::printf("\n%s, %d pairs in alternation (tessera ms / torch ms):", title.c_str(), rounds);
  for (int r = 0; r < rounds; ++r) std::printf(" %.1f/%.1f", mine_ms[r], theirs_ms[r]);
  const double ratio = ts::bench::median_of(ratios);
  std::printf("\n  median of the pairs' torch / tessera = %.2f (goal >= 1: %s)\n", ratio,
              ratio >= 1.0 ? "met" : "MISSED");
  return true;
}

/// ResNet-50 steps of Tessera and LibTorch in alternation, in one process (same weights and data,
/// one warm-up step each); the per-pair times show which side's steps change speed.
void paired_resnet_steps(int rounds) {
  // LibTorch's own default here is one thread (OpenMP's setting on this thread when LibTorch
  // starts); the rows above set it, and so must this.
  at::set_num_threads(ts::cpu::num_threads());
  ts::manual_seed(1);
  tessera_resnet mine;
  torch_resnet theirs(mine);
  theirs.step();
  mine.step();
  paired("ResNet-50 training step", rounds, 1, [&] { return mine.step(); },
         [&] { return theirs.step(); });
}

/// Each layer's forward + backward, Tessera's and LibTorch's in alternation (`rounds` pairs of
/// 3 calls each): the layer rows run Tessera's and LibTorch's minutes apart.
void paired_layer_steps(int rounds) {
  at::set_num_threads(ts::cpu::num_threads());
  for (const layer& l : layers()) {
    ts::manual_seed(1);
    tessera_conv mine(l);
    torch_conv theirs(l, mine);
    theirs.step();
    mine.step();
    if (!paired("conv " + l.name + " (batch 8, forward + backward)", rounds, 3,
                [&] { return mine.step(); }, [&] { return theirs.step(); })) {
      return;
    }
  }
}
#endif

/// Resident set in bytes: VmRSS (now) or VmHWM (peak) from /proc/self/status.
std::size_t resident(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::string(field).size())) * 1024;
  }
  return 0;
}

/// What a child measured: its peak RSS growth from `from` (bytes; 0: from its start) and one more
/// figure (Tessera: the pool's peak).
struct child_result {
  double from = 0;
  double extra = 0;
};

/// Runs `work` (two training steps) in a child process; returns its peak RSS growth and the
/// extra figure it sends back.
template <class Work>
std::pair<double, double> in_child(Work work) {
  int fds[2];
  if (pipe(fds) != 0) return {0, 0};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const double start = static_cast<double>(resident("VmRSS:"));
    const child_result r = work();
    const double from = r.from > 0 ? r.from : start;
    double out[2] = {static_cast<double>(resident("VmHWM:")) - from, r.extra};
    if (write(fds[1], out, sizeof out) != static_cast<ssize_t>(sizeof out)) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  double out[2] = {0, 0};
  const ssize_t got = read(fds[0], out, sizeof out);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != static_cast<ssize_t>(sizeof out) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return {0, 0};
  }
  return {out[0], out[1]};
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const int threads = ts::cpu::num_threads();

  // Peak memory first, in children forked before this process starts any thread.
  const auto mine = in_child([] {
    tessera_resnet net;
    net.step();
    net.step();
    return child_result{0, static_cast<double>(ts::memory::peak_allocated(ts::Device::parse("cpu:0")))};
  });
#if TESSERA_BENCH_TORCH
  const auto theirs = in_child([] {
    at::set_num_threads(ts::cpu::num_threads());
    tessera_resnet source;  // the weights and data; alive throughout, measured from after it
    const double before = static_cast<double>(resident("VmRSS:"));
    torch_resnet net(source);
    net.step();
    net.step();
    return child_result{before, 0};
  });
#endif

  ts::bench::print_core_round_trip("before the rows");
  register_benchmarks(threads);
  ts::bench::recording_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  ts::bench::print_core_round_trip("after the rows");

  std::printf("\nratios (baseline time / tessera time, higher is better for tessera; %d threads):\n",
              threads);
  for (const layer& l : layers()) {
    // The GEMM share (the im2col GEMMs alone / the layer) is the im2col path's: Winograd does
    // fewer products than those GEMMs.
    const std::string im2col =
        winograd_layer(l) ? "conv_tessera_im2col_" + l.name : "conv_tessera_" + l.name;
    std::vector<ts::bench::comparison> rows = {
        {"torch / tessera", "conv_tessera_" + l.name, "conv_torch_" + l.name, 1.0}};
    if (winograd_layer(l)) {
      rows.push_back({"im2col / Winograd", "conv_tessera_" + l.name, im2col, 0.0});
    }
    rows.push_back(
        {winograd_layer(l) ? "GEMM share of the im2col path" : "GEMM share (gemm / conv)", im2col,
         "conv_gemm_" + l.name, l.k == 3 ? 0.8 : 0.0});
    ts::bench::print_summary(reporter.results,
                             {"conv " + l.name + " (batch 8, forward + backward)", rows});
    if (nhwc_layer(l)) {
      ts::bench::print_summary(
          reporter.results,
          {"conv " + l.name + " channels_last (batch 8, forward + backward)",
           {{"NCHW / NHWC (tessera)", "conv_nhwc_tessera_" + l.name, "conv_tessera_" + l.name, 0.0},
            {"torch NHWC / tessera NHWC", "conv_nhwc_tessera_" + l.name,
             "conv_nhwc_torch_" + l.name, 1.0}}});
    }
  }
  ts::bench::print_summary(reporter.results,
                           {"ResNet-50 training step (batch 8, " + std::to_string(image_size()) +
                                "x" + std::to_string(image_size()) + ")",
                            {{"torch / tessera", "resnet50_step_tessera", "resnet50_step_torch", 1.0}}});
  std::printf("\npeak memory of two ResNet-50 training steps (RSS growth in a fresh process):\n");
  std::printf("  tessera %.1f MiB (its pool's peak allocated: %.1f MiB)\n", mine.first / 1048576.0,
              mine.second / 1048576.0);
#if TESSERA_BENCH_TORCH
  std::printf("  torch   %.1f MiB\n", theirs.first / 1048576.0);
  if (mine.first > 0 && theirs.first > 0) {
    const double ratio = mine.first / theirs.first;
    std::printf("  tessera / torch = %.2f (goal <= 0.8: %s)\n", ratio, ratio <= 0.8 ? "met" : "MISSED");
  }
  if (paired_rounds() > 0) {
    paired_resnet_steps(paired_rounds());
    paired_layer_steps(paired_rounds());
  }
#else
  std::printf("torch: LibTorch not found at configure time\n");
#endif
  return 0;
}
