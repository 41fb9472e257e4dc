// Options::gradients_in_arena: the parameters' gradients are buffers of the program's arena,
// planned from the backward step that first writes them. Checked: the gradients against a float64
// backward written out here, training steps equal to the same program's without the option, the
// peak lower than without it and equal to the plan's, and what the next forward does with a
// gradient zero_grad() cleared (let go of), one that accumulates (copied out of the arena) and one
// a caller keeps (keeps its values), and release() and the program's end (the gradients keep
// their values, the arena is freed).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tessera/tessera.hpp"

namespace gradients_in_arena_test {  // one namespace per test file: unity builds compile several

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

constexpr int device = 1;  // cpu:1: nothing else of the suite lives there (TESSERA_CPU_DEVICES=2)
constexpr std::int64_t batch = 1024, in = 64, hidden = 512, out = 64;

ts::Tensor<float> random_tensor(const ts::Shape& shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<std::size_t>(shape.numel()));
  for (float& v : values) v = normal(rng);
  return ts::from_vector<float>(values, shape, device);
}

struct Mlp : nn::Module {
  nn::Linear<float> fc1, fc2;
  explicit Mlp(std::uint64_t seed) : fc1(make(in, hidden, seed)), fc2(make(hidden, out, seed + 1)) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  static nn::Linear<float> make(std::int64_t from, std::int64_t to, std::uint64_t seed) {
    ts::manual_seed(seed);
    return nn::Linear<float>(from, to, true, device);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc2(ts::relu(fc1(x)));
  }
};

auto compile(Mlp& model, bool in_arena) {
  return ag::compile(
      [&model](ag::Var<float> x, ag::Var<float> t) { return nn::mse_loss(model.forward(x), t); },
      ag::input<float>({batch, in}, device), ag::input<float>({batch, out}, device),
      ag::Options{.gradients_in_arena = in_arena});
}

std::vector<double> to_double(const ts::Tensor<float>& t) {
  const std::vector<float> v = t.contiguous().to_vector();
  return {v.begin(), v.end()};
}

/// The MLP's gradients (dW1, db1, dW2, db2) of mean((fc2(relu(fc1(x))) - t)^2), in float64.
std::vector<std::vector<double>> reference_gradients(const Mlp& m, const ts::Tensor<float>& xt,
                                                     const ts::Tensor<float>& tt) {
  const auto x = to_double(xt), t = to_double(tt);
  const auto w1 = to_double(m.fc1.weight().value()), b1 = to_double(m.fc1.bias().value());
  const auto w2 = to_double(m.fc2.weight().value()), b2 = to_double(m.fc2.bias().value());
  std::vector<double> a1(batch * hidden), d_o(batch * out), dh(batch * hidden, 0.0);
  std::vector<double> dw1(hidden * in, 0.0), db1(hidden, 0.0), dw2(out * hidden, 0.0),
      db2(out, 0.0);
  for (std::int64_t n = 0; n < batch; ++n) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      double s = b1[j];
      for (std::int64_t i = 0; i < in; ++i) s += x[n * in + i] * w1[j * in + i];
      a1[n * hidden + j] = s;
    }
    for (std::int64_t k = 0; k < out; ++k) {
      double s = b2[k];
      for (std::int64_t j = 0; j < hidden; ++j)
        s += std::max(a1[n * hidden + j], 0.0) * w2[k * hidden + j];
      d_o[n * out + k] = 2.0 * (s - t[n * out + k]) / static_cast<double>(batch * out);
    }
  }
  for (std::int64_t n = 0; n < batch; ++n) {
    for (std::int64_t k = 0; k < out; ++k) {
      const double g = d_o[n * out + k];
      db2[k] += g;
      for (std::int64_t j = 0; j < hidden; ++j) {
        dw2[k * hidden + j] += g * std::max(a1[n * hidden + j], 0.0);
        dh[n * hidden + j] += g * w2[k * hidden + j];
      }
    }
    for (std::int64_t j = 0; j < hidden; ++j) {
      const double g = a1[n * hidden + j] > 0 ? dh[n * hidden + j] : 0.0;
      db1[j] += g;
      for (std::int64_t i = 0; i < in; ++i) dw1[j * in + i] += g * x[n * in + i];
    }
  }
  return {dw1, db1, dw2, db2};
}

/// The largest |a - b| / (1 + |b|) over the elements.
double worst_error(const ts::Tensor<float>& a, const std::vector<double>& b) {
  const auto v = to_double(a);
  REQUIRE(v.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    worst = std::max(worst, std::abs(v[i] - b[i]) / (1 + std::abs(b[i])));
  }
  return worst;
}

/// How many elements of the two tensors differ (bit for bit, as floats).
std::int64_t differences(const ts::Tensor<float>& a, const ts::Tensor<float>& b) {
  const auto va = a.contiguous().to_vector(), vb = b.contiguous().to_vector();
  if (va.size() != vb.size()) return -1;
  std::int64_t count = 0;
  for (std::size_t i = 0; i < va.size(); ++i) count += va[i] != vb[i];
  return count;
}

std::vector<ts::Tensor<float>> gradients(const Mlp& m) {
  return {m.fc1.weight().grad(), m.fc1.bias().grad(), m.fc2.weight().grad(), m.fc2.bias().grad()};
}

TEST_CASE("gradients in the arena: float64 gradients, the same steps as without, a lower peak",
          "[autograd][program][memory]") {
  const ts::Device cpu1{ts::DeviceType::cpu, device};
  const auto x = random_tensor({batch, in}, 1);
  const auto t = random_tensor({batch, out}, 2);
  Mlp plain_model(7), arena_model(7);
  const auto plain_params = plain_model.parameters();
  const auto arena_params = arena_model.parameters();
  REQUIRE(plain_params.size() == 4);
  for (std::size_t i = 0; i < plain_params.size(); ++i) {
    REQUIRE(differences(arena_params[i].as<float, ts::cpu>().value(),
                        plain_params[i].as<float, ts::cpu>().value()) == 0);
  }
  auto plain = compile(plain_model, false);
  auto arena = compile(arena_model, true);
  INFO(arena.memory_report());
  CHECK(arena.plan().gradients == 0);
  CHECK(plain.plan().gradients > 0);
  CHECK(arena.plan().peak_bytes < plain.plan().peak_bytes);

  // One step each, its peak measured. Nothing else lives on cpu:1 but the two models (each
  // plan counts its own parameters), the inputs, and what the programs hold.
  const auto reference = reference_gradients(arena_model, x, t);
  const std::size_t other_model = plain.plan().parameters;
  ts::memory::reset_peak(cpu1);
  (void)plain.forward(x, t);
  plain.backward();
  const std::size_t plain_peak = ts::memory::peak_allocated(cpu1);
  plain.release();  // its arena (its gradients stay: they are the model's)
  ts::memory::reset_peak(cpu1);
  (void)arena.forward(x, t);
  arena.backward();
  const std::size_t arena_peak = ts::memory::peak_allocated(cpu1);
  CHECK(plain_peak == plain.plan().peak_bytes + other_model);
  CHECK(arena_peak == arena.plan().peak_bytes + other_model + plain.plan().gradients);
  CHECK(arena_peak - plain.plan().gradients < plain_peak);

  const auto arena_grads = gradients(arena_model);
  const auto plain_grads = gradients(plain_model);
  for (std::size_t i = 0; i < reference.size(); ++i) {
    CAPTURE(i);
    CHECK(worst_error(arena_grads[i], reference[i]) < 1e-5);
    CHECK(differences(arena_grads[i], plain_grads[i]) == 0);
  }

  // Three SGD steps with momentum and a learning-rate change: the same parameters bit for bit.
  ts::optim::SGD plain_sgd(plain_model.parameters(), {.lr = 0.05, .momentum = 0.9});
  ts::optim::SGD arena_sgd(arena_model.parameters(), {.lr = 0.05, .momentum = 0.9});
  plain_sgd.step();
  arena_sgd.step();
  for (int step = 0; step < 3; ++step) {
    if (step == 2) {
      plain_sgd.set_group_lr(0, 0.01);
      arena_sgd.set_group_lr(0, 0.01);
    }
    plain_sgd.zero_grad();
    arena_sgd.zero_grad();
    const float plain_loss = plain.forward(x, t).item();
    const float arena_loss = arena.forward(x, t).item();
    CHECK(plain_loss == arena_loss);
    plain.backward();
    arena.backward();
    plain_sgd.step();
    arena_sgd.step();
  }
  for (std::size_t i = 0; i < plain_params.size(); ++i) {
    CAPTURE(i);
    CHECK(differences(arena_params[i].as<float, ts::cpu>().value(),
                      plain_params[i].as<float, ts::cpu>().value()) == 0);
  }
}

TEST_CASE(
    "gradients in the arena: cleared ones are let go of, accumulated and kept ones keep "
    "their values",
    "[autograd][program][memory]") {
  const ts::Device cpu1{ts::DeviceType::cpu, device};
  const auto x1 = random_tensor({batch, in}, 3), t1 = random_tensor({batch, out}, 4);
  const auto x2 = random_tensor({batch, in}, 5), t2 = random_tensor({batch, out}, 6);
  Mlp model(11);
  const auto first = reference_gradients(model, x1, t1);
  const auto second = reference_gradients(model, x2, t2);
  auto program = compile(model, true);

  // Two backward calls without zero_grad: the second adds to the first (which the second
  // forward copied out of the arena before reusing it).
  (void)program.forward(x1, t1);
  program.backward();
  const ts::Tensor<float> kept = model.fc2.weight().grad();  // a handle a caller keeps
  (void)program.forward(x2, t2);
  program.backward();
  for (std::size_t i = 0; i < first.size(); ++i) {
    std::vector<double> sum(first[i].size());
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] = first[i][k] + second[i][k];
    CAPTURE(i);
    CHECK(worst_error(gradients(model)[i], sum) < 1e-5);
  }
  // The kept handle shows the accumulated gradient (the slot's buffer, as without the option),
  // not the bytes the second forward wrote over the arena: against the float64 sums.
  {
    std::vector<double> sum(first[2].size());
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] = first[2][k] + second[2][k];
    CHECK(worst_error(kept, sum) < 1e-5);
  }

  // zero_grad, then a forward: the gradients are let go of (none until backward, as after
  // PyTorch's zero_grad); a handle kept before holds the values it had.
  const ts::Tensor<float> before = model.fc1.weight().grad().clone();
  const ts::Tensor<float> held = model.fc1.weight().grad();
  model.zero_grad();
  (void)program.forward(x1, t1);
  CHECK_FALSE(model.fc1.weight().grad().defined());
  CHECK_FALSE(model.fc2.bias().grad().defined());
  CHECK(differences(held, before) == 0);
  program.backward();
  CHECK(differences(held, before) == 0);
  for (std::size_t i = 0; i < first.size(); ++i) {
    CAPTURE(i);
    CHECK(worst_error(gradients(model)[i], first[i]) < 1e-5);
  }

  // release(): the gradients keep their values, copied out of the arena, which is freed.
  const std::size_t with_arena = ts::memory::allocated(cpu1);
  program.release();
  const std::size_t released = ts::memory::allocated(cpu1);
  CHECK(released < with_arena);
  for (std::size_t i = 0; i < first.size(); ++i) {
    CAPTURE(i);
    CHECK(worst_error(gradients(model)[i], first[i]) < 1e-5);
  }

  // The program's end: its arena goes back, the gradients stay.
  {
    auto other = compile(model, true);
    model.zero_grad();
    (void)other.forward(x2, t2);
    other.backward();
  }
  for (std::size_t i = 0; i < second.size(); ++i) {
    CAPTURE(i);
    CHECK(worst_error(gradients(model)[i], second[i]) < 1e-5);
  }
  CHECK(ts::memory::allocated(cpu1) <= released);
}

}  // namespace gradients_in_arena_test
