// Training through DataParallel::compile on virtual CPU devices (TESSERA_CPU_DEVICES=4 for this
// folder), against one device over the whole batch: for 1, 2 and 3 devices and batch sizes 1, 2,
// 7 and 64, the loss, the gradients and the parameters after 3 SGD and 3 Adam steps equal the
// one-device run's (float64: 1e-12, the summation order differs; float: 1e-5). With BatchNorm1d
// each device normalises its piece with the piece's statistics (as PyTorch's DataParallel), so
// there the reference is the pieces run one by one on one device, their gradients weighted by
// size; only the module's running statistics move. After the first step no step allocates.
// Labelled `threads`, so the TSan build runs it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/training_data.hpp"
#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace data_parallel_training_threads_test {

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace par = tessera::parallel;

using training_data::inputs_of;
using training_data::labels_of;

template <class T>
auto make_mlp(std::int64_t hidden = 16) {
  return nn::Sequential(nn::Linear<T>(6, hidden), nn::ReLU{}, nn::Linear<T>(hidden, 8), nn::Tanh{},
                        nn::Linear<T>(8, 3));
}

template <class T>
std::vector<std::vector<double>> values_and_grads(const nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (const auto& p : m.parameters()) {
    out.push_back(p.value().template as<T, ts::cpu>().template to<double>().to_vector());
    const ts::AnyTensor g = p.grad();
    out.push_back(g.defined() ? g.template as<T, ts::cpu>().template to<double>().to_vector()
                              : std::vector<double>{});
  }
  return out;
}

using training_data::check_close;

template <class T, class Optimizer, class Options>
void compare_with_one_device(const std::vector<int>& ids, std::int64_t batch, Options options,
                             double tol, std::int64_t hidden = 16) {
  INFO(ids.size() << " devices, batch " << batch << ", hidden width " << hidden);
  const auto x = inputs_of<T>(batch, 6, static_cast<int>(batch));
  const auto y = labels_of(batch, static_cast<int>(batch));
  auto loss_of = [](auto& model, ag::Var<T> in, ag::Var<std::int64_t> labels) {
    return nn::cross_entropy(model(in), labels);
  };

  ts::manual_seed(21);
  auto single = make_mlp<T>(hidden);
  auto step = ag::compile(
      [&](ag::Var<T> in, ag::Var<std::int64_t> labels) { return loss_of(single, in, labels); },
      ag::input<T>({batch, 6}), ag::input<std::int64_t>({batch}));
  Optimizer single_opt(single.parameters(), options);

  ts::manual_seed(21);
  auto model = nn::to<ts::cpu>(make_mlp<T>(hidden), ids[0]);  // the same values, on device_ids[0]
  par::DataParallel dp(model, ids);
  auto dp_step = dp.compile(loss_of, ag::input<T>({batch, 6}), ag::input<std::int64_t>({batch}));
  CHECK(dp_step.devices() == static_cast<int>(std::min<std::int64_t>(batch, std::ssize(ids))));
  Optimizer dp_opt(model.parameters(), options);

  // Allocations on every device (cpu:0 included, where the one-device run is).
  auto allocations = [&] {
    std::int64_t count = 0;
    for (int id = 0; id < ts::cpu::device_count(); ++id) {
      count += ts::memory::stats(ts::Device{ts::DeviceType::cpu, id}).allocations.allocated;
    }
    return count;
  };
  for (int i = 0; i < 3; ++i) {
    const auto before_single = allocations();
    single_opt.zero_grad();
    const double want = static_cast<double>(step.forward(x, y).item());
    step.backward();
    single_opt.step();
    const auto single_allocations = allocations() - before_single;
    const auto before = allocations();
    dp_opt.zero_grad();
    const double got = static_cast<double>(dp_step.forward(x, y).item());
    dp_step.backward();
    dp_opt.step();
    // After the first step neither allocates: not the one-device program (cross_entropy checks
    // its targets' range in place) and not DataParallel (pieces, replicas' parameters and the
    // gradients' sum all go into tensors made at the first step).
    if (i > 0) {
      CHECK(single_allocations == 0);
      CHECK(allocations() - before == 0);
    }
    CHECK(std::abs(got - want) <= tol * (1.0 + std::abs(want)));
    check_close(values_and_grads<T>(model), values_and_grads<T>(single), tol);
  }
}

TEST_CASE("DataParallel training equals one device over the whole batch (float64)",
          "[parallel][dp][training]") {
  for (const std::vector<int>& ids : {std::vector<int>{0}, {0, 1}, {0, 1, 2}}) {
    for (const std::int64_t batch : {1, 2, 7, 64}) {
      compare_with_one_device<double, ts::optim::SGD>(
          ids, batch, ts::optim::SGDOptions{.lr = 0.1, .momentum = 0.9}, 1e-12);
      compare_with_one_device<double, ts::optim::Adam>(ids, batch,
                                                       ts::optim::AdamOptions{.lr = 0.01}, 1e-12);
    }
  }
}

TEST_CASE("DataParallel training with gradients of several blocks (the devices share their sums)",
          "[parallel][dp][training]") {
  // A hidden width of 3000: weights of 18000 and 24000 elements, three blocks of the reduction
  // each (8192 elements a block), which the device whose backward ends first helps to sum; the
  // replicas' parameters copied by all devices, each a share of the bytes.
  for (const std::vector<int>& ids : {std::vector<int>{0, 1}, {0, 1, 2}, {2, 0, 3}}) {
    compare_with_one_device<double, ts::optim::SGD>(
        ids, 7, ts::optim::SGDOptions{.lr = 0.1, .momentum = 0.9}, 1e-12, 3000);
  }
}

TEST_CASE("DataParallel training equals one device over the whole batch (float)",
          "[parallel][dp][training]") {
  compare_with_one_device<float, ts::optim::Adam>({0, 1, 2}, 64, ts::optim::AdamOptions{.lr = 0.01},
                                                  1e-5);
  compare_with_one_device<float, ts::optim::SGD>({1, 3}, 7, ts::optim::SGDOptions{.lr = 0.1}, 1e-5);
}

TEST_CASE("DataParallel training with BatchNorm: each piece its own statistics",
          "[parallel][dp][training]") {
  const std::int64_t batch = 10;  // pieces 4, 3, 3
  const auto x = inputs_of<double>(batch, 6, 3);
  const auto y = labels_of(batch, 3);
  auto make = [] {
    return nn::Sequential(nn::Linear<double>(6, 8), nn::BatchNorm1d<double>(8), nn::ReLU{},
                          nn::Linear<double>(8, 3));
  };
  ts::manual_seed(4);
  auto model = make();
  ts::manual_seed(4);
  auto reference = make();
  ts::manual_seed(4);
  auto first_piece_only = make();  // for the running statistics

  // Reference: each piece on one device, its mean loss weighted by its share.
  const std::vector<std::int64_t> sizes{4, 3, 3};
  double want_loss = 0;
  std::int64_t first = 0;
  for (const std::int64_t size : sizes) {
    auto piece = ag::compile(
        [&](ag::Var<double> in, ag::Var<std::int64_t> labels) {
          return nn::cross_entropy(reference(in), labels) *
                 (static_cast<double>(size) / static_cast<double>(batch));
        },
        ag::input<double>({size, 6}), ag::input<std::int64_t>({size}));
    want_loss += piece.forward(x.narrow(0, first, size), y.narrow(0, first, size)).item();
    piece.backward();
    first += size;
  }
  auto once = ag::compile([&](ag::Var<double> in) { return ts::sum(first_piece_only(in)); },
                          ag::input<double>({4, 6}));
  (void)once.forward(x.narrow(0, 0, 4));

  par::DataParallel dp(model, {0, 1, 2});
  auto dp_step =
      dp.compile([](auto& m, ag::Var<double> in,
                    ag::Var<std::int64_t> labels) { return nn::cross_entropy(m(in), labels); },
                 ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  CHECK(dp_step.split_sizes() == sizes);
  const double got_loss = dp_step.forward(x, y).item();
  dp_step.backward();
  CHECK(std::abs(got_loss - want_loss) <= 1e-12 * (1 + std::abs(want_loss)));
  // Gradients: the reference accumulated the three pieces' weighted gradients.
  std::vector<std::vector<double>> got, want;
  for (const auto& p : model.parameters()) {
    got.push_back(p.grad().as<double, ts::cpu>().to_vector());
  }
  for (const auto& p : reference.parameters()) {
    want.push_back(p.grad().as<double, ts::cpu>().to_vector());
  }
  check_close(got, want, 1e-12);
  // Running statistics: one update, from the first piece (device_ids[0]'s), as in PyTorch.
  check_close({model.get<1>().running_mean().value().to_vector(),
               model.get<1>().running_var().value().to_vector()},
              {first_piece_only.get<1>().running_mean().value().to_vector(),
               first_piece_only.get<1>().running_var().value().to_vector()},
              1e-15);
}

// One Linear applied twice: its weight's gradient has two contributions, so the devices sum it
// in shared blocks after their products (10000 elements: two blocks), while every other
// weight's gradient is one product, which the devices compute into the module's gradient at once.
struct TwiceNet : nn::Module {
  nn::Linear<double> in, shared, out;
  TwiceNet() : in(6, 100), shared(100, 100), out(100, 3) {
    register_module("in", in);
    register_module("shared", shared);
    register_module("out", out);
  }
  template <class X>
  auto forward(const X& x) const {
    return out(ts::relu(shared(ts::tanh(shared(ts::relu(in(x)))))));
  }
};

TEST_CASE("DataParallel: a weight used twice, and gradients accumulated over two backwards",
          "[parallel][dp][training]") {
  auto loss_of = [](auto& m, ag::Var<double> in, ag::Var<std::int64_t> labels) {
    return nn::cross_entropy(m.forward(in), labels);
  };
  const std::int64_t batch = 9;
  const auto x1 = inputs_of<double>(batch, 6, 5), x2 = inputs_of<double>(batch, 6, 6);
  const auto y1 = labels_of(batch, 5), y2 = labels_of(batch, 6);
  ts::manual_seed(8);
  TwiceNet single;
  auto step = ag::compile(
      [&](ag::Var<double> in, ag::Var<std::int64_t> labels) { return loss_of(single, in, labels); },
      ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  // No zero_grad between: the second backward adds to the first's gradients.
  const double want1 = step.forward(x1, y1).item();
  step.backward();
  const double want2 = step.forward(x2, y2).item();
  step.backward();
  for (const std::vector<int>& ids : {std::vector<int>{0, 1}, {2, 0, 1}}) {
    INFO(ids.size() << " devices");
    ts::manual_seed(8);
    TwiceNet model = nn::to<ts::cpu>(TwiceNet{}, ids[0]);
    par::DataParallel dp(model, ids);
    auto dp_step =
        dp.compile(loss_of, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
    const double got1 = dp_step.forward(x1, y1).item();
    dp_step.backward();
    const double got2 = dp_step.forward(x2, y2).item();
    dp_step.backward();
    CHECK(std::abs(got1 - want1) <= 1e-12 * (1 + std::abs(want1)));
    CHECK(std::abs(got2 - want2) <= 1e-12 * (1 + std::abs(want2)));
    check_close(values_and_grads<double>(dp.module()), values_and_grads<double>(single), 1e-12);
  }
}

TEST_CASE("DataParallel: a device whose backward throws releases the others; the next step works",
          "[parallel][dp][errors]") {
  // Device 1's gradient hook throws at the last layer's first gradient, while device 0 goes on
  // to the next layers' weight products, which wait for every device: they must give up, and
  // the caller gets device 1's error, not a hang or a stand-in.
  auto loss_of = [](auto& m, ag::Var<double> in, ag::Var<std::int64_t> labels) {
    return nn::cross_entropy(m(in), labels);
  };
  const auto x = inputs_of<double>(8, 6, 9);
  const auto y = labels_of(8, 9);
  ts::manual_seed(3);
  auto single = make_mlp<double>();
  auto step = ag::compile(
      [&](ag::Var<double> in, ag::Var<std::int64_t> labels) { return loss_of(single, in, labels); },
      ag::input<double>({8, 6}), ag::input<std::int64_t>({8}));
  ts::manual_seed(3);
  auto model = make_mlp<double>();
  par::DataParallel dp(model, {0, 1});
  auto dp_step = dp.compile(loss_of, ag::input<double>({8, 6}), ag::input<std::int64_t>({8}));
  bool fail = true;
  dp_step.program(1).on_gradient_ready([&fail](const ag::GradientReady&) {
    if (fail) throw std::runtime_error("a hook on device 1 failed");
  });
  (void)dp_step.forward(x, y);
  CHECK_THROWS_WITH(dp_step.backward(), "a hook on device 1 failed");
  fail = false;
  model.zero_grad();
  (void)dp_step.forward(x, y);
  dp_step.backward();
  (void)step.forward(x, y);
  step.backward();
  check_close(values_and_grads<double>(model), values_and_grads<double>(single), 1e-12);
}

TEST_CASE("a DataParallel program refuses a module parameter rebound since compile",
          "[parallel][dp][errors]") {
  ts::manual_seed(2);
  auto model = make_mlp<double>();
  par::DataParallel dp(model, {0, 1});
  auto loss_of = [](auto& m, ag::Var<double> in, ag::Var<std::int64_t> labels) {
    return nn::cross_entropy(m(in), labels);
  };
  auto step = dp.compile(loss_of, ag::input<double>({8, 6}), ag::input<std::int64_t>({8}));
  const auto x = inputs_of<double>(8, 6, 1);
  const auto y = labels_of(8, 1);
  (void)step.forward(x, y);
  // Before, the replica trained on the old weight: gradients off by 0.12-0.15, no error.
  model.get<2>().weight().value() = inputs_of<double>(8, 16, 4);
  CHECK_THROWS_WITH(step.forward(x, y),
                    Catch::Contains("'2.weight'") && Catch::Contains("compile the program again"));
  // Compiled again, it trains on the current tensors: its loss is the one-device loss.
  auto again = dp.compile(loss_of, ag::input<double>({8, 6}), ag::input<std::int64_t>({8}));
  auto one = ag::compile(
      [&](ag::Var<double> in, ag::Var<std::int64_t> labels) { return loss_of(model, in, labels); },
      ag::input<double>({8, 6}), ag::input<std::int64_t>({8}));
  CHECK(again.forward(x, y).item() == Approx(one.forward(x, y).item()).epsilon(1e-12));
}

TEST_CASE("DataParallel programs refuse inputs of the wrong shape", "[parallel][dp][errors]") {
  ts::manual_seed(1);
  auto model = make_mlp<float>();
  par::DataParallel dp(model, {0, 1});
  auto loss_of = [](auto& m, ag::Var<float> in, ag::Var<std::int64_t> labels) {
    return nn::cross_entropy(m(in), labels);
  };
  auto step = dp.compile(loss_of, ag::input<float>({8, 6}), ag::input<std::int64_t>({8}));
  CHECK_THROWS_WITH(step.forward(inputs_of<float>(7, 6, 0), labels_of(8, 0)),
                    Catch::Contains("input 0 has shape [7, 6]") && Catch::Contains("[8, 6]"));
  CHECK_THROWS_WITH(dp.compile(loss_of, ag::input<float>({8, 6}), ag::input<std::int64_t>({5})),
                    Catch::Contains("disagree on the batch") && Catch::Contains("[5]"));
}

TEST_CASE("DataParallel backward(scaler): the scale times backward()'s summed gradients",
          "[parallel][dp][amp]") {
  ts::manual_seed(4);
  auto model = make_mlp<double>();
  par::DataParallel dp(model, {0, 1});
  auto loss_of = [](auto& m, ag::Var<double> in, ag::Var<std::int64_t> labels) {
    return nn::cross_entropy(m(in), labels);
  };
  auto step = dp.compile(loss_of, ag::input<double>({8, 6}), ag::input<std::int64_t>({8}));
  const auto x = inputs_of<double>(8, 6, 2);
  const auto y = labels_of(8, 2);
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.1});
  step.forward(x, y);
  step.backward();
  const auto plain = values_and_grads<double>(model);
  sgd.zero_grad();
  ts::optim::GradScaler scaler({.init_scale = 1024.0});
  step.forward(x, y);
  step.backward(scaler);
  const auto scaled = values_and_grads<double>(model);
  for (std::size_t i = 1; i < plain.size(); i += 2) {  // the gradients
    REQUIRE(scaled[i].size() == plain[i].size());
    for (std::size_t k = 0; k < plain[i].size(); ++k) CHECK(scaled[i][k] == plain[i][k] * 1024.0);
  }
  scaler.unscale_(sgd);
  CHECK(values_and_grads<double>(model) == plain);  // exact: a power of two
  CHECK(scaler.step(sgd));
}

TEST_CASE("DataParallel: losses kept over the steps keep their values",
          "[parallel][dp][training]") {
  // losses.push_back(dp_step.forward(x, y)), as PyTorch users keep them: each kept loss is the
  // value it had when returned (they were one buffer, which every forward overwrote), and a loss
  // dropped at once still costs no allocation.
  auto loss_of = [](auto& m, ag::Var<double> in, ag::Var<std::int64_t> labels) {
    return nn::cross_entropy(m(in), labels);
  };
  const auto x = inputs_of<double>(8, 6, 12);
  const auto y = labels_of(8, 12);
  ts::manual_seed(5);
  auto model = make_mlp<double>();
  par::DataParallel dp(model, {0, 1});
  auto dp_step = dp.compile(loss_of, ag::input<double>({8, 6}), ag::input<std::int64_t>({8}));
  ts::optim::SGD opt(model.parameters(), {.lr = 0.5});
  std::vector<ts::Tensor<double>> losses;
  std::vector<double> returned;
  for (int i = 0; i < 4; ++i) {
    opt.zero_grad();
    losses.push_back(dp_step.forward(x, y));
    returned.push_back(losses.back().item());
    dp_step.backward();
    opt.step();
  }
  for (std::size_t i = 0; i < losses.size(); ++i) {
    INFO("step " << i);
    CHECK(losses[i].item() == returned[i]);
    if (i > 0) CHECK(returned[i] < returned[i - 1]);  // the values differ: training goes on
  }
  losses.clear();  // none held: the next forwards write the same tensor again
  const auto allocated =
      ts::memory::stats(ts::Device{ts::DeviceType::cpu, 0}).allocations.allocated;
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    (void)dp_step.forward(x, y).item();
    dp_step.backward();
    opt.step();
  }
  CHECK(ts::memory::stats(ts::Device{ts::DeviceType::cpu, 0}).allocations.allocated == allocated);
}

}  // namespace data_parallel_training_threads_test
