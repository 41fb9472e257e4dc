// Programs built from nn modules: tracing a user-written model, the memory plan (no allocator
// calls in warm steps, inference smaller than training, checkpointing lowers the peak and keeps
// the gradients, max_batch_size agrees with the measured peak), gradient accumulation, gradient
// hooks, model parallelism with to(i), fusion counts and the errors of forward/backward.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/autograd.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/nn.hpp"
#include "tessera/optim.hpp"
#include "tessera/tensor/factories.hpp"

namespace program_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

namespace {

template <class T = float>
ts::Tensor<T> random_tensor(const ts::Shape& shape, std::uint32_t seed, int device = 0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<T> values(static_cast<std::size_t>(shape.numel()));
  for (auto& v : values) v = static_cast<T>(dist(rng));
  return ts::from_vector<T>(values, shape, device);
}

/// A model written as users write one: members, registration, a templated forward.
template <class T = float>
struct Mlp : nn::Module {
  nn::Linear<T> fc1, fc2;
  Mlp(int in, int hidden, int out, int device = 0)
      : fc1(in, hidden, true, device), fc2(hidden, out, true, device) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc2(ts::relu(fc1(x)));
  }
};

/// Sum of |a - b| over two parameter lists' gradients.
double grad_difference(const std::vector<nn::ParameterRef>& a, const std::vector<nn::ParameterRef>& b) {
  double total = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto ga = a[i].grad().as<float>().to_vector();
    const auto gb = b[i].grad().as<float>().to<ts::cpu>(0).to_vector();
    for (std::size_t k = 0; k < ga.size(); ++k) total += std::abs(double(ga[k]) - double(gb[k]));
  }
  return total;
}

}  // namespace

TEST_CASE("a user-written model traces: loss and gradients match finite differences of the eager "
          "forward", "[autograd][program]") {
  ts::manual_seed(7);
  Mlp<double> model(5, 7, 3);
  const auto x = random_tensor<double>({4, 5}, 1);
  const auto y = random_tensor<double>({4, 3}, 2);
  auto program = ag::compile(
      [&](ag::Var<double> input, ag::Var<double> target) {
        return nn::mse_loss(model.forward(input), target);
      },
      ag::input<double>({4, 5}), ag::input<double>({4, 3}));
  const double traced = program.forward(x, y).item();
  const double eager = nn::mse_loss(model.forward(x), y).item();
  CHECK(traced == Approx(eager).epsilon(1e-12));
  program.backward();
  for (auto& [name, p] : model.named_parameters()) {
    auto value = p.value().as<double>();
    const auto analytic = p.grad().as<double>().to_vector();
    double* data = value.data();
    for (std::int64_t i = 0; i < value.numel(); ++i) {
      const double saved = data[i];
      data[i] = saved + 1e-6;
      const double up = nn::mse_loss(model.forward(x), y).item();
      data[i] = saved - 1e-6;
      const double down = nn::mse_loss(model.forward(x), y).item();
      data[i] = saved;
      INFO(name << "[" << i << "]");
      CHECK(analytic[static_cast<std::size_t>(i)] == Approx((up - down) / 2e-6).margin(1e-7).epsilon(1e-6));
    }
  }
}

TEST_CASE("warm training steps make no allocator calls", "[autograd][program][memory]") {
  const ts::Device device{ts::DeviceType::cpu, 1};
  Mlp<float> model(16, 32, 4, 1);
  const auto x = random_tensor({8, 16}, 3, 1);
  const auto y = random_tensor({8, 4}, 4, 1);
  auto program = ag::compile(
      [&](ag::Var<float> input, ag::Var<float> target) {
        return nn::mse_loss(model.forward(input), target);
      },
      ag::input<float>({8, 16}, 1), ag::input<float>({8, 4}, 1));
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  double first = 0;
  for (int step = 0; step < 2; ++step) {  // warm-up: the arena, the gradients, the momentum
    sgd.zero_grad();
    const double loss = program.forward(x, y).item();
    if (step == 0) first = loss;
    program.backward();
    sgd.step();
  }
  const auto before = ts::memory::stats(device);
  double last = 0;
  for (int step = 0; step < 5; ++step) {
    sgd.zero_grad();
    last = program.forward(x, y).item();
    program.backward();
    sgd.step();
  }
  const auto after = ts::memory::stats(device);
  CHECK(after.allocations.allocated == before.allocations.allocated);
  CHECK(after.allocated_bytes.current == before.allocated_bytes.current);
  CHECK(last < first);  // it trains
}

TEST_CASE("the inference plan is smaller than the training plan and computes the same",
          "[autograd][program][memory]") {
  Mlp<float> model(32, 64, 10);
  auto fn = [&](ag::Var<float> input) { return ts::sum(model.forward(input)); };
  auto training = ag::compile(fn, ag::input<float>({16, 32}));
  auto inference = ag::compile(fn, ag::input<float>({16, 32}), ag::Options{.mode = ag::Mode::inference});
  INFO(training.memory_report() << inference.memory_report());
  CHECK(inference.plan().planned_bytes < training.plan().planned_bytes);
  CHECK(inference.plan().gradients == 0);
  CHECK(inference.plan().naive_bytes < training.plan().naive_bytes);
  CHECK(training.plan().planned_bytes < training.plan().naive_bytes);
  const auto x = random_tensor({16, 32}, 5);
  CHECK(inference.forward(x).item() == Approx(training.forward(x).item()).epsilon(1e-6));
  CHECK_THROWS_WITH(inference.backward(), Catch::Contains("Mode::inference"));
}

TEST_CASE("checkpointing lowers the planned peak of a deep MLP and keeps the gradients",
          "[autograd][program][memory]") {
  ts::manual_seed(11);
  std::vector<nn::Linear<float>> layers;
  for (int i = 0; i < 12; ++i) layers.emplace_back(64, 64);
  auto fn = [&](ag::Var<float> input) {
    ag::Var<float> h = input;
    for (const auto& layer : layers) h = ts::tanh(layer(h));
    return ts::mean(h * h);
  };
  auto plain = ag::compile(fn, ag::input<float>({128, 64}));
  auto checkpointed = ag::compile(fn, ag::input<float>({128, 64}), ag::Options{.checkpoint = {.segments = 4}});
  INFO(plain.memory_report() << checkpointed.memory_report());
  CHECK(checkpointed.plan().recomputed_steps > 0);
  CHECK(checkpointed.plan().planned_bytes < plain.plan().planned_bytes);
  const auto x = random_tensor({128, 64}, 6);
  std::vector<nn::ParameterRef> params;
  for (auto& layer : layers) {
    for (auto& p : layer.parameters()) params.push_back(p);
  }
  auto gradients = [&](auto& program) {
    for (auto& layer : layers) layer.zero_grad();
    const double loss = program.forward(x).item();
    program.backward();
    std::vector<float> all;
    for (auto& p : params) {
      const auto g = p.grad().as<float>().to_vector();
      all.insert(all.end(), g.begin(), g.end());
    }
    return std::pair{loss, all};
  };
  const auto [loss_plain, grad_plain] = gradients(plain);
  const auto [loss_checkpointed, grad_checkpointed] = gradients(checkpointed);
  CHECK(loss_plain == loss_checkpointed);
  CHECK(grad_plain == grad_checkpointed);  // recomputation is deterministic: bit-identical
}

TEST_CASE("recompute segments: the automatic cut plans both and keeps the smaller arena",
          "[autograd][program][memory]") {
  // A wide head and a long narrow tail: cut by node count, the first segment holds the head's
  // large values; cut by bytes, it ends inside the head. The plans differ; the automatic one
  // is the smaller, and every cut gives the plain program's gradients bit for bit.
  ts::manual_seed(12);
  std::vector<nn::Linear<float>> layers;
  layers.emplace_back(128, 128);
  layers.emplace_back(128, 128);
  layers.emplace_back(128, 8);
  for (int i = 0; i < 9; ++i) layers.emplace_back(8, 8);
  auto fn = [&](ag::Var<float> input) {
    ag::Var<float> h = input;
    for (const auto& layer : layers) h = ts::tanh(layer(h));
    return ts::mean(h * h);
  };
  using Balance = ag::Checkpoint::Balance;
  auto with = [&](Balance balance) {
    return ag::compile(fn, ag::input<float>({256, 128}),
                       ag::Options{.checkpoint = {.segments = 2, .balance = balance}});
  };
  auto plain = ag::compile(fn, ag::input<float>({256, 128}));
  auto by_nodes = with(Balance::nodes);
  auto by_bytes = with(Balance::bytes);
  auto automatic = with(Balance::automatic);
  INFO(by_nodes.memory_report() << by_bytes.memory_report() << automatic.memory_report());
  CHECK(by_nodes.plan().segments_by == Balance::nodes);
  CHECK(by_bytes.plan().segments_by == Balance::bytes);
  CHECK(by_nodes.plan().planned_bytes != by_bytes.plan().planned_bytes);
  const std::size_t smaller =
      std::min(by_nodes.plan().planned_bytes, by_bytes.plan().planned_bytes);
  CHECK(automatic.plan().planned_bytes == smaller);
  CHECK(automatic.plan().segments_by ==
        (by_bytes.plan().planned_bytes < by_nodes.plan().planned_bytes ? Balance::bytes
                                                                       : Balance::nodes));
  CHECK(automatic.plan().recomputed_steps > 0);
  CHECK(automatic.memory_report().find("segments of equal") != std::string::npos);

  const auto x = random_tensor({256, 128}, 7);
  auto gradients = [&](auto& program) {
    for (auto& layer : layers) layer.zero_grad();
    const double loss = program.forward(x).item();
    program.backward();
    std::vector<float> all{static_cast<float>(loss)};
    for (auto& layer : layers) {
      for (auto& p : layer.parameters()) {
        const auto g = p.grad().as<float>().to_vector();
        all.insert(all.end(), g.begin(), g.end());
      }
    }
    return all;
  };
  const auto want = gradients(plain);
  CHECK(gradients(by_nodes) == want);
  CHECK(gradients(by_bytes) == want);
  CHECK(gradients(automatic) == want);
}

TEST_CASE("an elementwise node's input gradient takes over its upstream gradient's buffer",
          "[autograd][program][memory]") {
  // loss = sum(tanh(x @ W) @ v), v a constant column. At tanh's backward step its upstream
  // gradient g ([64, 64], from the second matmul) dies, and the gradient of x @ W is written from
  // it elementwise. Sharing g's buffer, that step holds two [64, 64] buffers (x @ W, which tanh's
  // derivative reads, and g) instead of three; every other step holds at most two.
  const std::int64_t n = 64;
  auto w = std::make_shared<ag::parameter_slot<double, ts::cpu>>();
  w->value = random_tensor<double>({n, n}, 21);
  const auto v = random_tensor<double>({n, 1}, 23);
  auto program = ag::compile(
      [&](ag::Var<double> x) {
        return ts::sum(ts::matmul(ts::tanh(ts::matmul(x, ag::parameter(w, x))), v));
      },
      ag::input<double>({n, n}));
  const std::size_t buffer = static_cast<std::size_t>(n * n) * sizeof(double);
  INFO(program.memory_report());
  CHECK(program.plan().in_place >= 1);
  CHECK(program.plan().planned_bytes >= 2 * buffer);
  CHECK(program.plan().planned_bytes < 3 * buffer);
  // The gradient is still right: dW = x^T ((1 v^T) * (1 - tanh(x W)^2)), in double here.
  const auto x = random_tensor<double>({n, n}, 22);
  program.forward(x);
  program.backward();
  const auto xs = x.to_vector();
  const auto ws = w->value.to_vector();
  const auto vs = v.to_vector();
  std::vector<double> y(static_cast<std::size_t>(n * n));
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double m = 0;
      for (std::int64_t k = 0; k < n; ++k) {
        m += xs[static_cast<std::size_t>(i * n + k)] * ws[static_cast<std::size_t>(k * n + j)];
      }
      y[static_cast<std::size_t>(i * n + j)] = std::tanh(m);
    }
  }
  const auto dw = w->grad.to_vector();
  double worst = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    for (std::int64_t j = 0; j < n; ++j) {
      double expected = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double t = y[static_cast<std::size_t>(i * n + j)];
        expected +=
            xs[static_cast<std::size_t>(i * n + k)] * vs[static_cast<std::size_t>(j)] * (1 - t * t);
      }
      worst = std::max(worst, std::abs(dw[static_cast<std::size_t>(k * n + j)] - expected));
    }
  }
  CHECK(worst < 1e-10);
}

TEST_CASE("max_batch_size agrees with the peak measured while running at that batch",
          "[autograd][program][memory]") {
  const ts::Device device{ts::DeviceType::cpu, 1};
  Mlp<float> model(64, 256, 10, 1);
  auto fn = [&](ag::Var<float> input, ag::Var<float> target) {
    return nn::mse_loss(model.forward(input), target);
  };
  const std::size_t budget = 3u << 20;  // 3 MiB
  const std::int64_t batch =
      ag::max_batch_size(fn, ag::input<float>({1, 64}, 1), ag::input<float>({1, 10}, 1), budget);
  REQUIRE(batch > 1);
  auto program = ag::compile(fn, ag::input<float>({batch, 64}, 1), ag::input<float>({batch, 10}, 1));
  auto larger = ag::compile(fn, ag::input<float>({batch + 1, 64}, 1), ag::input<float>({batch + 1, 10}, 1));
  CHECK(program.plan().peak_bytes <= budget);
  CHECK(larger.plan().peak_bytes > budget);
  // Measure: nothing else lives on cpu:1 but the model (and its gradients once they exist).
  const auto x = random_tensor({batch, 64}, 8, 1);
  const auto y = random_tensor({batch, 10}, 9, 1);
  ts::memory::reset_peak(device);
  program.forward(x, y);
  program.backward();
  INFO(program.memory_report());
  CHECK(ts::memory::peak_allocated(device) == program.plan().peak_bytes);
  CHECK(ts::memory::peak_allocated(device) <= budget);
  // With Adam's two buffers per parameter the batch is smaller.
  const std::int64_t with_adam = ag::max_batch_size(
      fn, ag::input<float>({1, 64}, 1), ag::input<float>({1, 10}, 1), ag::Budget{.bytes = budget, .optimizer_buffers = 2});
  CHECK(with_adam < batch);
  CHECK(ag::max_batch_size(fn, ag::input<float>({1, 64}, 1), ag::input<float>({1, 10}, 1), std::size_t{1024}) == 0);
}

TEST_CASE("accumulating four quarter batches (loss / 4) gives the full batch's gradients",
          "[autograd][program]") {
  Mlp<float> model(6, 12, 3);
  auto fn = [&](ag::Var<float> input, ag::Var<float> target) {
    return nn::mse_loss(model.forward(input), target);
  };
  const auto x = random_tensor({16, 6}, 10);
  const auto y = random_tensor({16, 3}, 12);
  auto full = ag::compile(fn, ag::input<float>({16, 6}), ag::input<float>({16, 3}));
  full.forward(x, y);
  model.zero_grad();
  full.forward(x, y);
  full.backward();
  std::vector<std::vector<float>> reference;
  for (auto& p : model.parameters()) reference.push_back(p.grad().as<float>().to_vector());
  auto quarter = ag::compile(
      [&](ag::Var<float> input, ag::Var<float> target) { return nn::mse_loss(model.forward(input), target) * 0.25; },
      ag::input<float>({4, 6}), ag::input<float>({4, 3}));
  model.zero_grad();
  for (int i = 0; i < 4; ++i) {
    quarter.forward(x.narrow(0, 4 * i, 4).contiguous(), y.narrow(0, 4 * i, 4).contiguous());
    quarter.backward();
  }
  auto params = model.parameters();
  for (std::size_t k = 0; k < params.size(); ++k) {
    const auto got = params[k].grad().as<float>().to_vector();
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(reference[k][i]).margin(1e-6));
  }
}

TEST_CASE("zero_grad keeps each gradient's buffer and leaves its zeros to the next writer",
          "[autograd][program]") {
  nn::Linear<double> fc(3, 2);
  nn::Linear<double> spare(3, 2);  // no program uses it
  auto once = ag::compile([&](ag::Var<double> a) { return ts::sum(fc(a)); },
                          ag::input<double>({4, 3}));
  // The weight used twice: two contributions to each gradient in one backward.
  auto twice = ag::compile(
      [&](ag::Var<double> a, ag::Var<double> b) { return ts::sum(fc(a)) + ts::sum(fc(b)); },
      ag::input<double>({4, 3}), ag::input<double>({4, 3}));
  const auto x = random_tensor<double>({4, 3}, 31);
  const auto z = random_tensor<double>({4, 3}, 32);
  // d sum(x W^T + b) / dW[i][j] = sum_n x[n][j] and / db[i] = 4, in double from the inputs.
  auto dw_of = [](const ts::Tensor<double>& in, double times) {
    const auto v = in.to_vector();
    std::vector<double> dw(6, 0.0);
    for (std::size_t i = 0; i < 2; ++i) {
      for (std::size_t n = 0; n < 4; ++n) {
        for (std::size_t j = 0; j < 3; ++j) dw[i * 3 + j] += times * v[n * 3 + j];
      }
    }
    return dw;
  };
  auto check = [](const ts::Tensor<double>& got, const std::vector<double>& want) {
    const auto g = got.to_vector();
    REQUIRE(g.size() == want.size());
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(want[i]).margin(1e-12));
  };
  once.forward(x);
  once.backward();  // new gradients: written by their first contribution
  check(fc.weight().grad(), dw_of(x, 1));
  check(fc.bias().grad(), {4, 4});
  once.forward(x);
  once.backward();  // added
  check(fc.weight().grad(), dw_of(x, 2));
  check(fc.bias().grad(), {8, 8});

  const ts::Tensor<double> held = fc.weight().grad();  // shares the buffer
  fc.zero_grad();
  spare.zero_grad();
  CHECK_FALSE(spare.weight().grad().defined());  // no gradient: none made
  check(held, dw_of(x, 2));  // nothing written yet
  once.forward(x);
  once.backward();  // written, not added to the old values
  check(fc.weight().grad(), dw_of(x, 1));
  check(fc.bias().grad(), {4, 4});
  CHECK(fc.weight().grad().data() == held.data());  // in the same buffer

  fc.zero_grad();
  twice.forward(x, z);
  twice.backward();  // the first contribution writes, the second adds
  std::vector<double> both = dw_of(x, 1);
  const std::vector<double> from_z = dw_of(z, 1);
  for (std::size_t i = 0; i < both.size(); ++i) both[i] += from_z[i];
  check(fc.weight().grad(), both);
  check(fc.bias().grad(), {8, 8});

  // Read before any backward writes them, the gradients are zeros: through the typed handle,
  // through ParameterRef (what the optimisers read: an SGD step moves nothing), and in handles
  // sharing the buffer once they are written.
  fc.zero_grad();
  const std::vector<double> weight_before = fc.weight().value().to_vector();
  ts::optim::SGD sgd(fc.parameters(), {.lr = 0.5});
  sgd.step();
  CHECK(fc.weight().value().to_vector() == weight_before);
  check(held, std::vector<double>(6, 0.0));
  check(fc.bias().grad(), {0, 0});
  sgd.zero_grad();
  once.forward(x);
  once.backward();
  check(fc.weight().grad(), dw_of(x, 1));
}

TEST_CASE("a gradient hook fires once per parameter when its gradient is final",
          "[autograd][program]") {
  Mlp<float> model(4, 8, 2);
  auto program = ag::compile([&](ag::Var<float> input) { return ts::sum(model.forward(input)); },
                             ag::input<float>({3, 4}));
  std::vector<int> calls(program.parameter_count(), 0);
  std::vector<std::vector<float>> seen(program.parameter_count());
  program.on_gradient_ready([&](const ag::GradientReady& ready) {
    ++calls[ready.index];
    seen[ready.index] = ready.grad.as<float>().to_vector();
  });
  model.zero_grad();
  program.forward(random_tensor({3, 4}, 13));
  program.backward();
  CHECK(calls == std::vector<int>(program.parameter_count(), 1));
  // The reported gradient is the final one: the parameter's .grad() after backward.
  std::size_t matched = 0;
  for (auto& p : model.parameters()) {
    const auto g = p.grad().as<float>().to_vector();
    for (const auto& s : seen) matched += s == g ? 1 : 0;
  }
  CHECK(matched == program.parameter_count());
}

TEST_CASE("a backward that throws part-way puts every gradient back as it was",
          "[autograd][program][failure]") {
  Mlp<double> model(4, 8, 2);
  auto program = ag::compile([&](ag::Var<double> input) { return ts::sum(model.forward(input)); },
                             ag::input<double>({3, 4}));
  // The hook throws at the last gradient to be final: by then the others are written.
  bool fail = false;
  std::size_t readied = 0;
  program.on_gradient_ready([&](const ag::GradientReady&) {
    if (fail && ++readied == program.parameter_count()) throw std::runtime_error("hook failed");
  });
  const auto x = random_tensor<double>({3, 4}, 21);
  auto failing_backward = [&] {
    fail = true;
    readied = 0;
    program.forward(x);
    CHECK_THROWS_WITH(program.backward(), "hook failed");
    fail = false;
    CHECK(readied == program.parameter_count());  // every other gradient was written first
  };
  auto grads = [&] {
    std::vector<std::vector<double>> out;
    for (auto& p : model.parameters()) out.push_back(p.grad().as<double>().to_vector());
    return out;
  };

  // No gradient before: none after.
  failing_backward();
  for (auto& p : model.parameters()) CHECK_FALSE(p.grad().defined());
  // The backward needs a new forward (it may have used the forward's buffers).
  CHECK_THROWS_WITH(program.backward(), Catch::Contains("call forward first"));

  // Reference gradients in double from a backward that succeeds: d sum(fc2(relu(fc1 x))).
  program.forward(x);
  program.backward();
  const auto once = grads();
  // Accumulating onto values: the values come back exactly, and the next backward adds to them.
  failing_backward();
  CHECK(grads() == once);
  program.forward(x);
  program.backward();
  auto twice = grads();
  for (std::size_t k = 0; k < twice.size(); ++k) {
    for (std::size_t i = 0; i < twice[k].size(); ++i) {
      CHECK(twice[k][i] == Approx(2 * once[k][i]).margin(1e-12));
    }
  }
  // After zero_grad: zeros (unwritten) again, and the next backward writes, not adds.
  model.zero_grad();
  failing_backward();
  for (const auto& g : grads()) CHECK(g == std::vector<double>(g.size(), 0.0));
  model.zero_grad();
  failing_backward();
  program.forward(x);
  program.backward();
  CHECK(grads() == once);

  // Options::restore_gradients = false keeps no copy: the zero and none states still come back
  // (they cost nothing); accumulated values are left part-written.
  Mlp<double> other(4, 8, 2);
  auto plain = ag::compile([&](ag::Var<double> input) { return ts::sum(other.forward(input)); },
                           ag::input<double>({3, 4}), ag::Options{.restore_gradients = false});
  bool fail_plain = true;
  plain.on_gradient_ready([&](const ag::GradientReady& ready) {
    if (fail_plain && ready.index == 0) throw std::runtime_error("hook failed");
  });
  plain.forward(x);
  CHECK_THROWS_WITH(plain.backward(), "hook failed");
  for (auto& p : other.parameters()) CHECK_FALSE(p.grad().defined());
  // An accumulating backward copies each of the four gradients first, unless turned off.
  fail_plain = false;
  auto accumulating_launches = [&](auto& compiled) {
    compiled.forward(x);
    compiled.backward();  // makes the gradients
    compiled.forward(x);
    const auto before = ts::profiler::kernel_launches();
    compiled.backward();  // adds to them
    return ts::profiler::kernel_launches() - before;
  };
  auto restoring = ag::compile([&](ag::Var<double> input) { return ts::sum(other.forward(input)); },
                               ag::input<double>({3, 4}));
  CHECK(accumulating_launches(restoring) == accumulating_launches(plain) + 4);
}

TEST_CASE("a product hook is offered each weight's product when it is the gradient's only one",
          "[autograd][program]") {
  // fc1 is applied twice (two contributions: never offered); fc2's weight has one product. The
  // hook computes what it takes in float64 loops from the operands it is given, so the gradients
  // match the program's own only if target, x, y and accumulate are what the product needs.
  ts::manual_seed(6);
  nn::Linear<double> fc1(4, 4), fc2(4, 3);
  auto build = [&] {
    return ag::compile(
        [&](ag::Var<double> input) {
          return ts::sum(ts::tanh(fc2(ts::relu(fc1(ts::tanh(fc1(input)))))));
        },
        ag::input<double>({5, 4}));
  };
  const auto x = ts::randn<double>({5, 4});
  auto gradients = [&] {
    std::vector<std::vector<double>> out;
    for (nn::Linear<double>* fc : {&fc1, &fc2}) {
      out.push_back(fc->weight().grad().to_vector());
      out.push_back(fc->bias().grad().to_vector());
    }
    return out;
  };
  auto check_same = [](const std::vector<std::vector<double>>& got,
                       const std::vector<std::vector<double>>& expected) {
    REQUIRE(got.size() == expected.size());
    for (std::size_t t = 0; t < got.size(); ++t) {
      REQUIRE(got[t].size() == expected[t].size());
      for (std::size_t i = 0; i < got[t].size(); ++i) {
        CHECK(std::abs(got[t][i] - expected[t][i]) <= 1e-12 * (1 + std::abs(expected[t][i])));
      }
    }
  };
  auto plain = build();
  auto hooked = build();
  std::vector<std::size_t> offered;
  std::vector<const void*> targets;  // the gradient buffers the hook was handed
  bool take = true;
  hooked.on_parameter_product([&](ag::ParameterProduct& product) {
    offered.push_back(product.index);
    targets.push_back(product.target.data_ptr());
    if (!take) return false;
    const auto xs = product.x.as<double>().to_vector();
    const auto ys = product.y.as<double>().to_vector();
    const std::int64_t m = product.x.shape()[0], k = product.x.shape()[1], n = product.y.shape()[1];
    REQUIRE(product.target.shape() == ts::Shape{m, n});
    std::vector<double> out = product.target.as<double>().to_vector();
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double v = 0;
        for (std::int64_t q = 0; q < k; ++q) {
          v += xs[static_cast<std::size_t>(i * k + q)] * ys[static_cast<std::size_t>(q * n + j)];
        }
        auto& o = out[static_cast<std::size_t>(i * n + j)];
        o = product.accumulate ? o + v : v;
      }
    }
    product.target.as<double>().copy_(ts::from_vector<double>(out, {m, n}));
    return true;
  });
  // A parameter whose product the hook took gets no ready call: the program did not write it.
  std::vector<std::size_t> ready;
  hooked.on_gradient_ready([&](const ag::GradientReady& r) { ready.push_back(r.index); });
  // From zero gradients, two backwards: the second adds to the first's gradients.
  auto two_backwards = [&](auto& program) {
    fc1.zero_grad();
    fc2.zero_grad();
    for (int round = 0; round < 2; ++round) {
      program.forward(x);
      program.backward();
    }
    return gradients();
  };
  const auto want = two_backwards(plain);
  check_same(two_backwards(hooked), want);
  // Offered: fc2's weight only (fc1's has two contributions, the biases are sums), once per
  // backward, as the parameter the program numbers after fc1's weight and bias (first use).
  REQUIRE(offered.size() == 2);
  CHECK(offered == std::vector<std::size_t>{2, 2});
  const void* fc2_weight_grad = fc2.weight().grad().data();
  CHECK(targets == std::vector<const void*>(2, fc2_weight_grad));
  const auto count = [&](std::size_t index) {
    return std::count(ready.begin(), ready.end(), index);
  };
  CHECK(ready.size() == 2 * (hooked.parameter_count() - 1));
  CHECK(count(2) == 0);
  CHECK(count(0) == 2);
  // Declined: the program computes the product itself, and says so when it is final.
  take = false;
  ready.clear();
  check_same(two_backwards(hooked), want);
  CHECK(offered.size() == 4);
  CHECK(ready.size() == 2 * hooked.parameter_count());
  CHECK(count(2) == 2);
}

TEST_CASE("model parallel: a differentiable to(i) between virtual CPU devices", "[autograd][program]") {
  ts::manual_seed(3);
  nn::Linear<float> first(5, 6, true, 0), second(6, 2, true, 1);
  nn::Linear<float> first_ref(5, 6, true, 0), second_ref(6, 2, true, 0);
  first_ref.load_state_dict(first.state_dict());
  second_ref.load_state_dict(second.state_dict());
  const auto x = random_tensor({4, 5}, 14);
  auto split = ag::compile(
      [&](ag::Var<float> input) {
        return ts::sum(ts::tanh(second(ag::Var<float>(ts::tanh(first(input))).to(1))));
      },
      ag::input<float>({4, 5}));
  auto single = ag::compile(
      [&](ag::Var<float> input) { return ts::sum(ts::tanh(second_ref(ts::tanh(first_ref(input))))); },
      ag::input<float>({4, 5}));
  const auto loss = split.forward(x);
  CHECK(loss.device() == ts::Device(ts::DeviceType::cpu, 1));
  CHECK(loss.item() == Approx(single.forward(x).item()).epsilon(1e-6));
  split.backward();
  single.backward();
  CHECK(grad_difference(first_ref.parameters(), first.parameters()) < 1e-5);
  CHECK(grad_difference(second_ref.parameters(), second.parameters()) < 1e-5);
}

TEST_CASE("an elementwise expression and its gradients are fused", "[autograd][program]") {
  auto w = std::make_shared<ag::parameter_slot<float, ts::cpu>>();
  auto b = std::make_shared<ag::parameter_slot<float, ts::cpu>>();
  w->value = random_tensor({64}, 15);
  b->value = random_tensor({64}, 16);
  auto program = ag::compile(
      [&](ag::Var<float> x) {
        auto W = ag::parameter(w, x);
        auto B = ag::parameter(b, x);
        return ts::sum(ts::sigmoid(x * W + B) * ts::tanh(x));
      },
      ag::input<float>({32, 64}));
  const auto x = random_tensor({32, 64}, 17);
  const auto before = ts::profiler::kernel_launches();
  program.forward(x);
  // The sum reads the six-op expression directly: one pass, nothing stored in between.
  CHECK(ts::profiler::kernel_launches() - before == 1);
  CHECK(program.plan().activations <= 64);  // the 0-dim loss only
  program.backward();  // the first backward also creates the gradients (zeros)
  program.forward(x);
  const auto mid = ts::profiler::kernel_launches();
  program.backward();
  // The seed, then per parameter one fused reduction of its gradient expression over the batch
  // dim and one pass adding it into .grad() (backward accumulates); first, since it accumulates,
  // a copy of each gradient to put back should the backward fail (Options::restore_gradients).
  CHECK(ts::profiler::kernel_launches() - mid == 2 + 5);
}

TEST_CASE("forward checks its inputs and backward needs a forward", "[autograd][program]") {
  Mlp<float> model(4, 8, 2);
  auto program = ag::compile([&](ag::Var<float> input) { return ts::sum(model.forward(input)); },
                             ag::input<float>({3, 4}));
  CHECK_THROWS_WITH(program.backward(), Catch::Contains("call forward first"));
  CHECK_THROWS_AS(program.forward(random_tensor({2, 4}, 1)), ts::shape_error);
  CHECK_THROWS_WITH(program.forward(random_tensor({2, 4}, 1)),
                    Catch::Contains("input 0") && Catch::Contains("[2, 4]") && Catch::Contains("[3, 4]"));
  CHECK_THROWS_WITH(program.forward(random_tensor<double>({3, 4}, 1)),
                    Catch::Contains("input 0") && Catch::Contains("float64") && Catch::Contains("float32"));
  CHECK_THROWS_WITH(program.forward(random_tensor({3, 4}, 1, 1)),
                    Catch::Contains("input 0") && Catch::Contains("cpu:1") && Catch::Contains("cpu:0"));
  program.forward(random_tensor({3, 4}, 1));
  program.backward();
  CHECK_THROWS_WITH(program.backward(), Catch::Contains("call forward first"));
  CHECK_THROWS_WITH(ag::compile([&](ag::Var<float> input) { return model.forward(input); }, ag::input<float>({3, 4})),
                    Catch::Contains("must have one element") && Catch::Contains("[3, 2]"));
}

}  // namespace program_test

namespace program_test {
namespace {

/// y = relu(x W^T + b) in float64 loops, and the vector-Jacobian products for a given dy.
struct linear_relu_reference {
  std::vector<double> y, dx, dw, db;
  linear_relu_reference(const std::vector<double>& x, const std::vector<double>& w,
                        const std::vector<double>& b, const std::vector<double>& dy, int n,
                        int in, int out)
      : y(static_cast<std::size_t>(n * out)),
        dx(static_cast<std::size_t>(n * in)),
        dw(static_cast<std::size_t>(out * in)),
        db(static_cast<std::size_t>(out)) {
    for (int r = 0; r < n; ++r) {
      for (int o = 0; o < out; ++o) {
        double z = b[static_cast<std::size_t>(o)];
        for (int k = 0; k < in; ++k) {
          z += x[static_cast<std::size_t>(r * in + k)] * w[static_cast<std::size_t>(o * in + k)];
        }
        y[static_cast<std::size_t>(r * out + o)] = z > 0 ? z : 0;
        const double dz = z > 0 ? dy[static_cast<std::size_t>(r * out + o)] : 0;
        db[static_cast<std::size_t>(o)] += dz;
        for (int k = 0; k < in; ++k) {
          dw[static_cast<std::size_t>(o * in + k)] += dz * x[static_cast<std::size_t>(r * in + k)];
          dx[static_cast<std::size_t>(r * in + k)] += dz * w[static_cast<std::size_t>(o * in + k)];
        }
      }
    }
  }
};

void check_close(const std::vector<double>& actual, const std::vector<double>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    CHECK(actual[i] == Approx(expected[i]).margin(1e-12).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("backward(grad) seeds a non-scalar result, and input_grad gives the input's gradient",
          "[autograd][program]") {
  nn::Linear<double> fc(5, 3);
  const auto x = random_tensor<double>({4, 5}, 21);
  const auto dy = random_tensor<double>({4, 3}, 22);
  auto spec = ag::input<double>({4, 5});
  spec.requires_grad = true;
  auto program = ag::compile([&](ag::Var<double> in) { return ts::relu(fc(in)); }, spec,
                             ag::Options{.seed_gradient = true});
  const linear_relu_reference ref(x.to_vector(), fc.weight().value().to_vector(),
                                  fc.bias().value().to_vector(), dy.to_vector(), 4, 5, 3);
  for (int run = 0; run < 2; ++run) {  // input gradients are overwritten, parameters' accumulate
    check_close(program.forward(x).to_vector(), ref.y);
    program.backward(dy);
    check_close(program.input_grad(0).as<double>().to_vector(), ref.dx);
  }
  std::vector<double> twice_dw = ref.dw, twice_db = ref.db;
  for (double& v : twice_dw) v *= 2;
  for (double& v : twice_db) v *= 2;
  check_close(fc.weight().grad().to_vector(), twice_dw);
  check_close(fc.bias().grad().to_vector(), twice_db);

  // After release the arena is gone; the next forward allocates it again and computes the same.
  const ts::Device device{ts::DeviceType::cpu, 0};
  const std::size_t held = ts::memory::allocated(device);
  program.release();
  CHECK(ts::memory::allocated(device) < held);
  fc.zero_grad();
  check_close(program.forward(x).to_vector(), ref.y);
  program.backward(dy);
  check_close(fc.weight().grad().to_vector(), ref.dw);
  check_close(program.input_grad(0).as<double>().to_vector(), ref.dx);

  // Misuse: backward() without the gradient, a gradient of another shape, an input without grad.
  CHECK_THROWS_WITH(program.backward(), Catch::Contains("backward(grad)"));
  program.forward(x);
  CHECK_THROWS_WITH(program.backward(random_tensor<double>({3, 4}, 1)),
                    Catch::Contains("[3, 4]") && Catch::Contains("[4, 3]"));
  auto loss_program =
      ag::compile([&](ag::Var<double> in) { return ts::sum(fc(in)); }, ag::input<double>({4, 5}));
  loss_program.forward(x);
  CHECK_THROWS_WITH(loss_program.backward(dy), Catch::Contains("seed_gradient"));
  loss_program.backward();
  CHECK_THROWS_WITH(loss_program.input_grad(0), Catch::Contains("requires_grad"));
  CHECK_THROWS_AS(loss_program.input_grad(1), std::out_of_range);
}

TEST_CASE("recompute runs the forward again without applying effects a second time",
          "[autograd][program]") {
  nn::BatchNorm1d<double> bn(3);
  const auto x = random_tensor<double>({6, 3}, 31);
  auto program = ag::compile([&](ag::Var<double> in) { return ts::sum(bn(in) * in); },
                             ag::input<double>({6, 3}));
  const double loss = program.forward(x).item();
  program.release();  // a checkpointed forward keeps only its input
  CHECK(program.recompute(x).item() == Approx(loss).epsilon(1e-14));
  program.backward();
  // Running statistics were updated once (momentum 0.1 from zeros/ones) with the batch's mean
  // and unbiased variance, computed here in float64.
  const auto xs = x.to_vector();
  // The weight's gradient is sum over rows of xhat * x (d/dweight of sum(bn(x) * x)).
  const auto mean = bn.running_mean().value().to_vector();
  const auto var = bn.running_var().value().to_vector();
  const auto weight_grad = bn.weight().grad().to_vector();
  for (int c = 0; c < 3; ++c) {
    double m = 0, v = 0;
    for (int r = 0; r < 6; ++r) m += xs[static_cast<std::size_t>(r * 3 + c)] / 6;
    for (int r = 0; r < 6; ++r) {
      const double d = xs[static_cast<std::size_t>(r * 3 + c)] - m;
      v += d * d / 5;
    }
    CHECK(mean[static_cast<std::size_t>(c)] == Approx(0.1 * m).epsilon(1e-12));
    CHECK(var[static_cast<std::size_t>(c)] == Approx(0.9 + 0.1 * v).epsilon(1e-12));
    double expected = 0;
    for (int r = 0; r < 6; ++r) {
      const double xr = xs[static_cast<std::size_t>(r * 3 + c)];
      expected += (xr - m) / std::sqrt(v * 5 / 6 + 1e-5) * xr;
    }
    CHECK(weight_grad[static_cast<std::size_t>(c)] == Approx(expected).epsilon(1e-12));
  }
  CHECK(bn.num_batches_tracked().value().item() == 1);
}

}  // namespace program_test
