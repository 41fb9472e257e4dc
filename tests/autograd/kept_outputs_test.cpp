// What a Program hands out keeps its values (issue 46, section 1): losses kept across steps, an
// inference output kept across forwards, an input gradient kept across a backward, each equal to
// the value it had when it was returned; keeping one costs one copy of it, and dropping them
// costs nothing (no allocation). Before, a result was the program's output buffer and the next
// run overwrote it.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "tessera/tessera.hpp"

namespace kept_outputs_test {  // one namespace per test file: unity builds compile several

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

ts::Tensor<float> random_tensor(const ts::Shape& shape, std::uint32_t seed, int device = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<std::size_t>(shape.numel()));
  for (float& v : values) v = normal(rng);
  return ts::from_vector<float>(values, shape, device);
}

struct Net : nn::Module {
  nn::Linear<float> fc1, fc2;
  explicit Net(int device = 0)
      : Module("Net"), fc1(16, 32, true, device), fc2(32, 4, true, device) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc2(ts::relu(fc1(x)));
  }
};

TEST_CASE("losses kept across training steps keep their values", "[autograd][program][kept]") {
  ts::manual_seed(5);
  Net model;
  const auto x = random_tensor({8, 16}, 1), y = random_tensor({8, 4}, 2);
  auto program = ag::compile(
      [&](ag::Var<float> in, ag::Var<float> target) {
        return nn::mse_loss(model.forward(in), target);
      },
      ag::input<float>({8, 16}), ag::input<float>({8, 4}));
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.05});
  std::vector<ts::Tensor<float>> losses;
  std::vector<float> when_returned;
  for (int step = 0; step < 6; ++step) {
    sgd.zero_grad();
    losses.push_back(program.forward(x, y));  // as a PyTorch user keeps them
    when_returned.push_back(losses.back().item());
    program.backward();
    sgd.step();
  }
  for (std::size_t i = 0; i < losses.size(); ++i) {
    CAPTURE(i);
    CHECK(losses[i].item() == when_returned[i]);
  }
  CHECK(when_returned.back() < when_returned.front());  // it trains: the values differ
  // The same training with nothing kept gives the same losses: keeping changes no number.
  ts::manual_seed(5);
  Net again;
  auto program2 = ag::compile(
      [&](ag::Var<float> in, ag::Var<float> target) {
        return nn::mse_loss(again.forward(in), target);
      },
      ag::input<float>({8, 16}), ag::input<float>({8, 4}));
  ts::optim::SGD sgd2(again.parameters(), {.lr = 0.05});
  for (int step = 0; step < 6; ++step) {
    sgd2.zero_grad();
    CHECK(program2.forward(x, y).item() == when_returned[static_cast<std::size_t>(step)]);
    program2.backward();
    sgd2.step();
  }
}

TEST_CASE("an inference output kept across forwards keeps its values; dropped ones cost nothing",
          "[autograd][program][kept][memory]") {
  const ts::Device device{ts::DeviceType::cpu, 1};
  ts::manual_seed(6);
  Net model(1);
  auto program = ag::compile([&](ag::Var<float> in) { return model.forward(in); },
                             ag::input<float>({64, 16}, 1),
                             ag::Options{.mode = ag::Mode::inference});
  const auto a = random_tensor({64, 16}, 3, 1), b = random_tensor({64, 16}, 4, 1);
  // The reference: the eager model on each input.
  const auto eager_a = ts::Tensor<float>(model.forward(a)).to_vector();
  const auto eager_b = ts::Tensor<float>(model.forward(b)).to_vector();
  (void)program.forward(a);  // warm-up: the arena
  const auto warm = ts::memory::stats(device);
  for (int i = 0; i < 3; ++i) (void)program.forward(i % 2 ? a : b);  // nothing kept
  CHECK(ts::memory::stats(device).allocations.allocated == warm.allocations.allocated);
  const auto out_a = program.forward(a);
  const auto before_keep = ts::memory::stats(device);
  const auto out_b = program.forward(b);  // out_a is still held: it moves to a copy
  const auto after_keep = ts::memory::stats(device);
  CHECK(after_keep.allocations.allocated == before_keep.allocations.allocated + 1);
  CHECK(after_keep.allocated_bytes.current ==
        before_keep.allocated_bytes.current + std::int64_t{64 * 4 * sizeof(float)});
  const auto va = out_a.to_vector(), vb = out_b.to_vector();
  REQUIRE(va.size() == eager_a.size());
  for (std::size_t i = 0; i < va.size(); ++i) {
    CHECK(va[i] == Approx(eager_a[i]).epsilon(1e-5));
    CHECK(vb[i] == Approx(eager_b[i]).epsilon(1e-5));
  }
  // A view of a kept result follows it to its copy.
  const auto row = out_b.narrow(0, 3, 1);
  (void)program.forward(a);
  CHECK(row.to_vector() == std::vector<float>(vb.begin() + 12, vb.begin() + 16));
  CHECK(out_b.to_vector() == vb);
  // release(): results already returned keep their values and memory.
  program.release();
  CHECK(out_b.to_vector() == vb);
}

TEST_CASE("an input gradient kept across the next run keeps its values",
          "[autograd][program][kept]") {
  ts::manual_seed(7);
  Net model;
  auto spec = ag::input<float>({8, 16});
  spec.requires_grad = true;
  auto program = ag::compile(
      [&](ag::Var<float> in) { return ts::sum(model.forward(in) * model.forward(in)); }, spec);
  const auto a = random_tensor({8, 16}, 5), b = random_tensor({8, 16}, 6);
  (void)program.forward(a);
  program.backward();
  const auto grad_a = program.input_grad(0);
  const auto kept = grad_a.as<float>().to_vector();
  (void)program.forward(b);
  program.backward();
  const auto grad_b = program.input_grad(0).as<float>().to_vector();
  CHECK(grad_a.as<float>().to_vector() == kept);
  CHECK(grad_b != kept);  // the inputs differ, so do the gradients
  // And the program's numbers are unchanged by the keeping: a again gives the first gradient.
  (void)program.forward(a);
  program.backward();
  CHECK(program.input_grad(0).as<float>().to_vector() == kept);
}

}  // namespace kept_outputs_test
