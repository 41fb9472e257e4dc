// Modules, losses and optimisers on a CUDA device (compiled by nvcc, so the expressions, the
// reductions and the optimisers' update kernels run there), against the same computation on the
// CPU, which tests/nn and tests/optim check against PyTorch: Linear, BatchNorm1d in both modes,
// Dropout's statistics, mse_loss and cross_entropy, SGD/Adam/AdamW trajectories, the state the
// first step allocates on the device, and moving modules between cpu and cuda; one_hot on the
// device against hand-written rows (tests/nn/one_hot_test.cpp checks the CPU).
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include "skip.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace cuda_nn_optim_test {  // one namespace per file: a unity build

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;

namespace {

const ts::Device cuda0{ts::DeviceType::cuda, 0};

template <class T, class K>
std::vector<double> values_of(const ts::Tensor<T, K>& t) {
  std::vector<double> out;
  for (T v : t.to_vector()) out.push_back(static_cast<double>(v));
  return out;
}

template <class TA, class KA, class TB, class KB>
void check_close(const ts::Tensor<TA, KA>& actual, const ts::Tensor<TB, KB>& expected, double rel,
                 double abs) {
  REQUIRE(actual.shape() == expected.shape());
  const auto a = values_of(actual);
  const auto e = values_of(expected);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(a[i] - e[i]) <= abs + rel * std::abs(e[i]))) ++bad;
  }
  INFO(bad << " of " << a.size() << " elements differ");
  CHECK(bad == 0);
}

template <class K = ts::cpu>
struct Net : nn::Module {
  nn::Linear<float, K> fc1{16, 32};
  nn::BatchNorm1d<float, K> bn{32};
  nn::Linear<float, K> fc2{32, 5};
  Net() : Module("Net") {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc2(ts::relu(bn(fc1(x))));
  }
};

}  // namespace

TEST_CASE("a model on cuda computes what it computes on the cpu", "[cuda][nn]") {
  ts::manual_seed(1);
  Net<> cpu_net;
  auto gpu_net = nn::to<ts::cuda>(cpu_net, 0);
  static_assert(std::is_same_v<decltype(gpu_net), Net<ts::cuda>>);
  for (const auto& [key, value] : gpu_net.state_dict()) CHECK(value.device() == cuda0);

  for (int step = 0; step < 3; ++step) {  // training: batch statistics, running stats updated
    const auto x = ts::randn<float>({64, 16});
    ts::Tensor<float> expected = cpu_net.forward(x);
    ts::Tensor<float, ts::cuda> actual = gpu_net.forward(x.cuda(0));
    check_close(actual, expected, 1e-4, 1e-5);
  }
  check_close(gpu_net.bn.running_var().value(), cpu_net.bn.running_var().value(), 1e-5, 1e-6);
  CHECK(gpu_net.bn.num_batches_tracked().value().item() == 3);
  cpu_net.eval();
  gpu_net.eval();
  const auto x = ts::randn<float>({8, 16});
  ts::Tensor<float> expected = cpu_net.forward(x);
  ts::Tensor<float, ts::cuda> actual = gpu_net.forward(x.cuda(0));
  check_close(actual, expected, 1e-4, 1e-5);

  // Losses (cross_entropy's reference by hand in float64: CPU max/min reductions are not
  // instantiated in this nvcc unit).
  const std::vector<std::int64_t> labels{0, 1, 2, 3, 4, 0, 1, 2};
  const auto targets = ts::from_vector<std::int64_t>(labels, {8});
  const auto logits = values_of(expected);
  double reference = 0;
  for (std::size_t n = 0; n < labels.size(); ++n) {
    double top = logits[n * 5];
    for (int c = 1; c < 5; ++c) top = std::max(top, logits[n * 5 + c]);
    double total = 0;
    for (int c = 0; c < 5; ++c) total += std::exp(logits[n * 5 + c] - top);
    reference += top + std::log(total) - logits[n * 5 + static_cast<std::size_t>(labels[n])];
  }
  reference /= static_cast<double>(labels.size());
  CHECK(nn::cross_entropy(actual, targets.cuda(0)).item() == Approx(reference).epsilon(1e-5));
  CHECK_THROWS_WITH(nn::cross_entropy(actual, ts::eval(targets + 5).cuda(0)),
                    Catch::Contains("out of range for 5 classes"));
  CHECK(nn::mse_loss(actual, actual * 0.5f).item() ==
        Approx(nn::mse_loss(expected, expected * 0.5f).item()).epsilon(1e-5));

  // And back to the cpu, and in place on the device.
  auto back = nn::to<ts::cpu>(gpu_net, 0);
  CHECK(back.fc1.weight().value().to_vector() == cpu_net.fc1.weight().value().to_vector());
  const auto parameters = gpu_net.parameters();
  gpu_net.to(0);
  CHECK(gpu_net.parameters() == parameters);
}

TEST_CASE("Dropout on cuda: mask fraction and scaling", "[cuda][nn]") {
  nn::Dropout dropout(0.25);
  const auto y = dropout(ts::ones<float, ts::cuda>({1 << 20}, 0));
  std::size_t zeros = 0, wrong = 0;
  for (float v : y.to_vector()) {
    if (v == 0.0f) {
      ++zeros;
    } else if (v != static_cast<float>(1.0 / 0.75)) {
      ++wrong;
    }
  }
  CHECK(wrong == 0);
  const double n = 1 << 20;
  CHECK(std::abs(zeros / n - 0.25) < 5 * std::sqrt(0.25 * 0.75 / n));
}

TEST_CASE("one_hot on cuda: the rows on the labels' device, bad labels named", "[cuda][nn]") {
  namespace F = nn::functional;
  const auto labels = ts::from_vector<std::int64_t>({3, 0, 1, 1, 2, 0}, {2, 3}).cuda(0);
  const ts::Tensor<std::int64_t, ts::cuda> inferred = F::one_hot(labels);  // max 3: 4 classes
  CHECK(inferred.device() == cuda0);
  CHECK(inferred.shape() == ts::Shape{2, 3, 4});
  CHECK(inferred.to_vector() == std::vector<std::int64_t>{0, 0, 0, 1,  //
                                                          1, 0, 0, 0,  //
                                                          0, 1, 0, 0,  //
                                                          0, 1, 0, 0,  //
                                                          0, 0, 1, 0,  //
                                                          1, 0, 0, 0});
  const auto wide = F::one_hot(labels.transpose(0, 1), 5);  // [[3, 1], [0, 2], [1, 0]]
  CHECK(wide.shape() == ts::Shape{3, 2, 5});
  CHECK(wide.to_vector() == std::vector<std::int64_t>{0, 0, 0, 1, 0,  //
                                                      0, 1, 0, 0, 0,  //
                                                      1, 0, 0, 0, 0,  //
                                                      0, 0, 1, 0, 0,  //
                                                      0, 1, 0, 0, 0,  //
                                                      1, 0, 0, 0, 0});
  CHECK(F::one_hot(ts::from_vector<std::int64_t>({}, {0}).cuda(0), 3).shape() ==
        ts::Shape{0, 3});
  CHECK_THROWS_WITH(F::one_hot(labels, 3), Catch::Contains("label 3 at position [0, 0]") &&
                                               Catch::Contains("num_classes 3"));
  const auto negative = ts::from_vector<std::int64_t>({0, 4, -2}, {3}).cuda(0);
  CHECK_THROWS_WITH(F::one_hot(negative), Catch::Contains("label -2 at position [2]"));
  CHECK(negative.to_vector() == std::vector<std::int64_t>{0, 4, -2});
}

TEMPLATE_TEST_CASE("optimisers on cuda follow the cpu trajectory", "[cuda][optim]", float, double) {
  using T = TestType;
  const double rel = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  ts::manual_seed(2);
  const auto start = ts::randn<T>({300, 7});
  for (int kind = 0; kind < 4; ++kind) {
    INFO("optimiser " << kind);
    nn::Parameter<T> host(start.clone());
    nn::Parameter<T, ts::cuda> device(start.cuda(0));
    auto make = [&](std::vector<nn::ParameterRef> p) -> std::unique_ptr<ts::optim::Optimizer> {
      switch (kind) {
        case 0:
          return std::make_unique<ts::optim::SGD>(
              p, ts::optim::SGDOptions{
                     .lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
        case 1:
          return std::make_unique<ts::optim::Adam>(p, ts::optim::AdamOptions{.lr = 0.01});
        case 2:
          return std::make_unique<ts::optim::Adam>(
              p, ts::optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
        default:
          return std::make_unique<ts::optim::AdamW>(p, ts::optim::AdamWOptions{});
      }
    };
    auto on_host = make({host});
    auto on_device = make({device});
    for (int step = 0; step < 5; ++step) {
      const auto grad = ts::randn<T>({300, 7});
      host.grad() = grad;
      device.grad() = grad.cuda(0);
      const auto count = ts::memory::stats(cuda0).allocations.allocated;
      const auto launches = ts::profiler::kernel_launches();
      on_device->step();
      CHECK(ts::profiler::kernel_launches() - launches == 1);
      const auto made = ts::memory::stats(cuda0).allocations.allocated - count;
      if (step == 0) {
        CHECK(made == (kind == 0 ? 1 : kind == 2 ? 3 : 2));
      } else {
        CHECK(made == 0);
      }
      on_host->step();
    }
    check_close(device.value(), host.value(), rel, rel);
  }
}

TEST_CASE("an optimiser step on cuda updates many parameters in a few launches, as on the cpu",
          "[cuda][optim]") {
  // 130 parameters of ResNet-like sizes (weights, channel vectors, odd lengths), float and double
  // mixed, one of them a non-contiguous gradient (made contiguous for the step: the temporary
  // must outlive the queued launch); SGD with momentum and Adam, three steps, against the same
  // optimiser on the CPU (tests/optim checks the CPU against torch.optim).
  ts::manual_seed(6);
  for (int kind = 0; kind < 2; ++kind) {
    INFO("optimiser " << kind);
    std::vector<nn::Parameter<float>> host_f;
    std::vector<nn::Parameter<float, ts::cuda>> device_f;
    std::vector<nn::Parameter<double>> host_d;
    std::vector<nn::Parameter<double, ts::cuda>> device_d;
    for (int k = 0; k < 130; ++k) {
      const std::int64_t n = k % 4 == 0 ? 64 * 9 * 7 : k % 4 == 1 ? 256 : 4097 + k;
      if (k % 5 == 4) {
        const auto start = ts::randn<double>({n});
        host_d.emplace_back(start.clone());
        device_d.emplace_back(start.cuda(0));
      } else {
        const auto start = ts::randn<float>({n});
        host_f.emplace_back(start.clone());
        device_f.emplace_back(start.cuda(0));
      }
    }
    std::vector<nn::ParameterRef> on_host, on_device;
    for (auto& p : host_f) on_host.push_back(p);
    for (auto& p : host_d) on_host.push_back(p);
    for (auto& p : device_f) on_device.push_back(p);
    for (auto& p : device_d) on_device.push_back(p);
    auto make = [&](std::vector<nn::ParameterRef> p) -> std::unique_ptr<ts::optim::Optimizer> {
      if (kind == 0) {
        return std::make_unique<ts::optim::SGD>(
            p, ts::optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
      }
      return std::make_unique<ts::optim::Adam>(p, ts::optim::AdamOptions{.lr = 0.01});
    };
    auto host_opt = make(on_host);
    auto device_opt = make(on_device);
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = 0; i < host_f.size(); ++i) {
        const auto grad = ts::randn<float>(host_f[i].value().shape());
        host_f[i].grad() = grad;
        device_f[i].grad() = grad.cuda(0);
      }
      for (std::size_t i = 0; i < host_d.size(); ++i) {
        const auto grad = ts::randn<double>(host_d[i].value().shape());
        host_d[i].grad() = grad;
        device_d[i].grad() = grad.cuda(0);
      }
      // One gradient that is a strided view on the device.
      const std::int64_t n0 = device_f[0].value().numel();
      const auto wide = ts::randn<float>({n0, 2});
      host_f[0].grad() = wide.select(1, 1).contiguous();
      device_f[0].grad() = wide.cuda(0).select(1, 1);
      const auto launches = ts::profiler::kernel_launches();
      device_opt->step();
      // Two rule types (float, double): a few launches each, not one per parameter.
      CHECK(ts::profiler::kernel_launches() - launches <= 12);
      host_opt->step();
    }
    for (std::size_t i = 0; i < host_f.size(); ++i) {
      INFO("float parameter " << i);
      check_close(device_f[i].value(), host_f[i].value(), 1e-5, 1e-5);
    }
    for (std::size_t i = 0; i < host_d.size(); ++i) {
      INFO("double parameter " << i);
      check_close(device_d[i].value(), host_d[i].value(), 1e-13, 1e-13);
    }
  }
}

TEST_CASE("GradScaler on cuda unscales many gradients in a few launches, as on the cpu",
          "[cuda][optim][amp]") {
  // 130 parameters (float, half and bfloat16 mixed, one non-contiguous gradient), SGD through a
  // GradScaler on the device and on the CPU (tests/optim checks the CPU's scaler against torch's):
  // the unscaled gradients are the CPU's bit for bit (one float multiply, rounded once), the
  // unscaling takes a few multi-tensor launches rather than one per gradient, and a step with an
  // inf in one bfloat16 gradient is skipped and backs the scale off on both.
  ts::manual_seed(8);
  std::vector<nn::Parameter<float>> host_f;
  std::vector<nn::Parameter<float, ts::cuda>> device_f;
  std::vector<nn::Parameter<ts::half>> host_h;
  std::vector<nn::Parameter<ts::half, ts::cuda>> device_h;
  std::vector<nn::Parameter<ts::bfloat16>> host_b;
  std::vector<nn::Parameter<ts::bfloat16, ts::cuda>> device_b;
  for (int k = 0; k < 130; ++k) {
    const std::int64_t n = k % 4 == 0 ? 64 * 9 * 7 : k % 4 == 1 ? 256 : 4097 + k;
    const auto start = ts::randn<float>({n});
    if (k % 5 == 3) {
      host_h.emplace_back(start.to<ts::half>());
      device_h.emplace_back(start.to<ts::half>().cuda(0));
    } else if (k % 5 == 4) {
      host_b.emplace_back(start.to<ts::bfloat16>());
      device_b.emplace_back(start.to<ts::bfloat16>().cuda(0));
    } else {
      host_f.emplace_back(start.clone());
      device_f.emplace_back(start.cuda(0));
    }
  }
  std::vector<nn::ParameterRef> on_host, on_device;
  for (auto& p : host_f) on_host.push_back(p);
  for (auto& p : host_h) on_host.push_back(p);
  for (auto& p : host_b) on_host.push_back(p);
  for (auto& p : device_f) on_device.push_back(p);
  for (auto& p : device_h) on_device.push_back(p);
  for (auto& p : device_b) on_device.push_back(p);
  ts::optim::SGD host_opt(on_host, {.lr = 0.05, .momentum = 0.9});
  ts::optim::SGD device_opt(on_device, {.lr = 0.05, .momentum = 0.9});
  ts::optim::GradScaler host_scaler({.init_scale = 1024.0});
  ts::optim::GradScaler device_scaler({.init_scale = 1024.0});
  auto set_gradients = [&](bool inject_inf) {
    for (std::size_t i = 0; i < host_f.size(); ++i) {
      const auto grad = ts::eval(ts::randn<float>(host_f[i].value().shape()) * 1024.0f);
      host_f[i].grad() = grad;
      device_f[i].grad() = grad.cuda(0);
    }
    for (std::size_t i = 0; i < host_h.size(); ++i) {
      const auto grad =
          ts::eval(ts::cast<ts::half>(ts::randn<float>(host_h[i].value().shape()) * 1024.0f));
      host_h[i].grad() = grad;
      device_h[i].grad() = grad.cuda(0);
    }
    for (std::size_t i = 0; i < host_b.size(); ++i) {
      auto grad =
          ts::eval(ts::cast<ts::bfloat16>(ts::randn<float>(host_b[i].value().shape()) * 1024.0f));
      if (inject_inf && i == 17) grad.narrow(0, 100, 1).fill_(ts::bfloat16(INFINITY));
      host_b[i].grad() = grad;
      device_b[i].grad() = grad.cuda(0);
    }
    // One gradient that is a strided view on the device.
    const std::int64_t n0 = device_f[0].value().numel();
    const auto wide = ts::eval(ts::randn<float>({n0, 2}) * 1024.0f);
    host_f[0].grad() = wide.select(1, 1).contiguous();
    device_f[0].grad() = wide.cuda(0).select(1, 1);
  };
  // Equal values (an inf equals an inf), element by element.
  auto check_same = [](const auto& actual, const auto& expected) {
    const auto a = values_of(actual);
    const auto e = values_of(expected);
    REQUIRE(a.size() == e.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < a.size(); ++i) bad += a[i] == e[i] ? 0 : 1;
    INFO(bad << " of " << a.size() << " elements differ");
    CHECK(bad == 0);
  };
  auto check_gradients = [&] {
    for (std::size_t i = 0; i < host_f.size(); ++i) {
      INFO("float parameter " << i);
      check_same(device_f[i].grad(), host_f[i].grad());
    }
    for (std::size_t i = 0; i < host_h.size(); ++i) {
      INFO("half parameter " << i);
      check_same(device_h[i].grad(), host_h[i].grad());
    }
    for (std::size_t i = 0; i < host_b.size(); ++i) {
      INFO("bfloat16 parameter " << i);
      check_same(device_b[i].grad(), host_b[i].grad());
    }
  };
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    const bool inject_inf = step == 1;
    set_gradients(inject_inf);
    host_scaler.unscale_(host_opt);
    const auto launches = ts::profiler::kernel_launches();
    device_scaler.unscale_(device_opt);
    // Three rule types (float, half, bfloat16), each a launch or two, plus the flag's zeroing.
    CHECK(ts::profiler::kernel_launches() - launches <= 8);
    check_gradients();
    CHECK(host_scaler.step(host_opt) == !inject_inf);
    CHECK(device_scaler.step(device_opt) == !inject_inf);
    host_scaler.update();
    device_scaler.update();
    CHECK(device_scaler.get_scale() == host_scaler.get_scale());
    CHECK(device_scaler.get_scale() == (step >= 1 ? 512.0 : 1024.0));
  }
  // SGD on the device and the host: the same parameters to float tolerance (the fp32 masters'
  // arithmetic is tests/optim's; here only the scaler's part must agree).
  for (std::size_t i = 0; i < host_f.size(); ++i) {
    INFO("float parameter " << i);
    check_close(device_f[i].value(), host_f[i].value(), 1e-5, 1e-5);
  }
  for (std::size_t i = 0; i < host_b.size(); ++i) {
    INFO("bfloat16 parameter " << i);
    check_close(device_b[i].value(), host_b[i].value(), 1e-2, 1e-2);
  }
}

// Var::to<Kind>: one program whose first layer runs on the CPU and second on the GPU, the
// activations copied to the GPU and the output back (both directions; the copy's input also feeds
// the loss directly, so one gradient copied back is added to another), trained with Adam: the
// loss, every gradient (on its parameter's device) and the parameters after 3 steps are those of
// the same model on the CPU (float64; tests/nn checks the CPU against PyTorch).
struct HostThenDevice : nn::Module {
  nn::Linear<double> a{16, 32};
  nn::Linear<double, ts::cuda> b{32, 5};
  HostThenDevice() : Module("HostThenDevice") {
    register_module("a", a);
    register_module("b", b);
  }
};

TEST_CASE("a program split between the cpu and a gpu trains as on the cpu", "[cuda][autograd]") {
  ts::manual_seed(4);
  HostThenDevice split;
  nn::Linear<double> a = nn::to<ts::cpu>(split.a, 0);
  nn::Linear<double> b = nn::to<ts::cpu>(split.b, 0);
  CHECK(split.b.weight().value().device() == cuda0);

  auto split_step = ag::compile([&](ag::Var<double> x, ag::Var<double> y) {
    const ag::Var<double> h = ts::relu(split.a(x));
    const ag::Var<double, ts::cuda> on_gpu = split.b(h.to<ts::cuda>(0));
    const ag::Var<double> back = on_gpu.to<ts::cpu>(0);
    return nn::mse_loss(back + h.narrow(1, 0, 5), y);
  }, ag::input<double>({64, 16}), ag::input<double>({64, 5}));
  auto host_step = ag::compile([&](ag::Var<double> x, ag::Var<double> y) {
    const ag::Var<double> h = ts::relu(a(x));
    return nn::mse_loss(b(h) + h.narrow(1, 0, 5), y);
  }, ag::input<double>({64, 16}), ag::input<double>({64, 5}));

  std::vector<nn::ParameterRef> split_parameters{split.a.weight(), split.a.bias(),
                                                 split.b.weight(), split.b.bias()};
  std::vector<nn::ParameterRef> host_parameters{a.weight(), a.bias(), b.weight(), b.bias()};
  ts::optim::Adam split_adam(split_parameters, {.lr = 0.01});
  ts::optim::Adam host_adam(host_parameters, {.lr = 0.01});
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    const auto x = ts::randn<double>({64, 16});
    const auto y = ts::randn<double>({64, 5});
    split_adam.zero_grad();
    host_adam.zero_grad();
    CHECK(split_step.forward(x, y).item() == Approx(host_step.forward(x, y).item()).epsilon(1e-12));
    split_step.backward();
    host_step.backward();
    check_close(split.a.weight().grad(), a.weight().grad(), 1e-10, 1e-12);
    check_close(split.a.bias().grad(), a.bias().grad(), 1e-10, 1e-12);
    CHECK(split.b.weight().grad().device() == cuda0);
    check_close(split.b.weight().grad(), b.weight().grad(), 1e-10, 1e-12);
    check_close(split.b.bias().grad(), b.bias().grad(), 1e-10, 1e-12);
    split_adam.step();
    host_adam.step();
  }
  check_close(split.a.weight().value(), a.weight().value(), 1e-10, 1e-12);
  check_close(split.b.weight().value(), b.weight().value(), 1e-10, 1e-12);
}

TEST_CASE("a pipeline over two gpus gives the one-device loss and gradients",
          "[cuda][parallel][skippable]") {
  // Activations and gradients cross devices on the pipeline's copy streams (one per direction
  // and device) while both devices compute: a missing wait would show as wrong numbers.
  if (ts::cuda::device_count() < 2) {
    TESSERA_SKIP("fewer than two GPUs: the two-stage CUDA pipeline was not run");
  }
  namespace par = tessera::parallel;
  const std::int64_t batch = 11;
  ts::manual_seed(12);
  const auto x = ts::randn<double>({batch, 6});
  std::vector<std::int64_t> label_values;
  for (std::int64_t i = 0; i < batch; ++i) label_values.push_back((i * 7) % 3);
  const auto y = ts::from_vector<std::int64_t>(label_values, {batch});
  for (par::Schedule schedule : {par::Schedule::gpipe, par::Schedule::one_f_one_b}) {
    for (par::Checkpoint checkpoint : {par::Checkpoint::always, par::Checkpoint::never}) {
      for (int chunks : {1, 5}) {
        INFO((schedule == par::Schedule::gpipe ? "gpipe" : "1f1b")
             << (checkpoint == par::Checkpoint::always ? ", checkpointed, " : ", ") << chunks
             << " chunks");
        ts::manual_seed(7);
        auto host = nn::Sequential(nn::Linear<double>(6, 64), nn::ReLU{},
                                   nn::Linear<double>(64, 32), nn::Tanh{},
                                   nn::Linear<double>(32, 3));
        auto reference = ag::compile(
            [&](ag::Var<double> in, ag::Var<std::int64_t> labels) {
              return nn::cross_entropy(host(in), labels);
            },
            ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
        const double expected_loss = reference.forward(x, y).item();
        reference.backward();

        auto seq = nn::to<ts::cuda>(host, 0);
        par::Pipeline pipe(seq, {.balance = {2, 3}, .devices = {0, 1}, .chunks = chunks,
                                 .schedule = schedule, .checkpoint = checkpoint});
        CHECK(seq.get<4>().weight().value().device_index() == 1);
        auto program = pipe.compile(
            [](auto out, auto labels) { return nn::cross_entropy(out, labels); },
            ag::input<double, ts::cuda>({batch, 6}), ag::input<std::int64_t, ts::cuda>({batch}));
        const double loss = program.forward(x.cuda(0), y.cuda(1)).item();
        CHECK(loss == Approx(expected_loss).epsilon(1e-12));
        program.backward();
        const auto got = seq.parameters();
        const auto want = host.parameters();
        REQUIRE(got.size() == want.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          INFO("parameter " << i);
          check_close(got[i].grad().as<double, ts::cuda>(), want[i].grad().as<double, ts::cpu>(),
                      1e-10, 1e-12);
        }
        // Inference through the same stages: pipe(x) on the last device.
        const auto out = pipe(x.cuda(0));
        CHECK(out.device_index() == 1);
        check_close(out, host(x), 1e-10, 1e-12);
      }
    }
  }
}

}  // namespace cuda_nn_optim_test
