// DistributedDataParallel (distributed/distributed_data_parallel.hpp) under mpirun with 2 and 3
// ranks. The reference is computed by every rank on its own: the same model trained by one
// process on the whole global batch (float64). DDP ranks start from different initial values
// (their own seeds), so the reference's equality also checks the broadcast from rank 0. Small
// bucket caps make several buckets, so the overlapped all-reduces and their order are exercised.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "parallel/training_data.hpp"
#include "tessera/distributed.hpp"
#include "tessera/tessera.hpp"

namespace distributed_data_parallel_test {

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace par = tessera::parallel;
namespace dist = tessera::distributed;

using training_data::check_close;
using training_data::inputs_of;
using training_data::labels_of;

auto make_mlp(int hidden = 16) {
  return nn::Sequential(nn::Linear<double>(6, hidden), nn::ReLU{}, nn::Linear<double>(hidden, 8),
                        nn::Tanh{}, nn::Linear<double>(8, 3));
}

std::vector<std::vector<double>> values_and_grads(const nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (const auto& p : m.parameters()) {
    out.push_back(p.value().as<double>().to_vector());
    const ts::AnyTensor g = p.grad();
    out.push_back(g.defined() ? g.as<double>().to_vector() : std::vector<double>{});
  }
  return out;
}

auto loss_of = [](auto& model, ag::Var<double> in, ag::Var<std::int64_t> labels) {
  return nn::cross_entropy(model.forward(in), labels);
};

// The device ts::distributed::init bound this rank to (reference programs run there).
int here() { return ts::cpu::current_device(); }

// Rows [rank * n, (rank + 1) * n) of the global batch.
template <class T>
ts::Tensor<T> rows_of(const ts::Tensor<T>& global, int rank, std::int64_t n) {
  return global.narrow(0, rank * n, n).contiguous();
}

// A few bytes per bucket: every Linear's weight and bias in buckets of their own or paired.
const par::DistributedDataParallelOptions small_buckets{.bucket_cap_mb = 0.0006,
                                                        .first_bucket_mb = 0.0001};

void train_and_compare(par::DistributedDataParallelOptions options) {
  dist::ProcessGroup pg;
  const std::int64_t local = 4;
  const std::int64_t global = local * pg.size();
  const auto x = inputs_of<double>(global, 6, 3);
  const auto y = labels_of(global, 3);

  ts::manual_seed(100);  // rank 0's seed: the reference starts where DDP's broadcast puts it
  auto single = make_mlp();
  auto step = ag::compile([&](ag::Var<double> in, ag::Var<std::int64_t> labels) {
    return loss_of(single, in, labels);
  }, ag::input<double>({global, 6}, here()), ag::input<std::int64_t>({global}, here()));
  ts::optim::SGD single_opt(single.parameters(), {.lr = 0.1, .momentum = 0.9});

  ts::manual_seed(100 + static_cast<std::uint64_t>(pg.rank()));
  auto model = make_mlp();
  par::DistributedDataParallel ddp(model, options);
  REQUIRE(ddp.buckets().size() >= 3);
  auto ddp_step = ddp.compile(loss_of, ag::input<double>({local, 6}),
                              ag::input<std::int64_t>({local}));
  ts::optim::SGD ddp_opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});

  for (int i = 0; i < 3; ++i) {
    INFO("step " << i << ", rank " << pg.rank());
    single_opt.zero_grad();
    const double want = static_cast<double>(step.forward(x, y).item());
    step.backward();
    ddp_opt.zero_grad();
    const double mine = static_cast<double>(
        ddp_step.forward(rows_of(x, pg.rank(), local), rows_of(y, pg.rank(), local)).item());
    ddp_step.backward();
    if (options.overlap) {
      CHECK(ddp_step.buckets_started_during_backward() >= 2);
    } else {
      CHECK(ddp_step.buckets_started_during_backward() == 0);
    }
    // The global loss is the ranks' mean of their means (equal batches).
    auto losses = ts::from_vector<double>({mine}, {1});
    pg.all_reduce(losses, par::ReduceOp::avg);
    CHECK(std::abs(losses.item() - want) <= 1e-12 * (1 + std::abs(want)));
    check_close(values_and_grads(model), values_and_grads(single), 1e-12);
    single_opt.step();
    ddp_opt.step();
  }
  check_close(values_and_grads(model), values_and_grads(single), 1e-12);
}

TEST_CASE("DDP training equals one process over the whole batch", "[ddp]") {
  train_and_compare(small_buckets);
}

TEST_CASE("DDP with the reduction after backward (overlap off) gives the same", "[ddp]") {
  auto options = small_buckets;
  options.overlap = false;
  train_and_compare(options);
}

TEST_CASE("DDP's default buckets: one first bucket of at most 1 MiB, reverse order", "[ddp]") {
  ts::manual_seed(1);
  // 784-1024-10: fc2 (10x1024 + 10, 41 KB) is last registered, first in the first bucket; fc1's
  // weight (3.2 MB) does not fit in 1 MiB, so it starts the second.
  auto model = nn::Sequential(nn::Linear<float>(784, 1024), nn::ReLU{}, nn::Linear<float>(1024, 10));
  par::DistributedDataParallel ddp(model);
  const auto buckets = ddp.buckets();
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].parameters == std::vector<std::string>{"2.bias", "2.weight", "0.bias"});
  CHECK(buckets[1].parameters == std::vector<std::string>{"0.weight"});
  CHECK(buckets[1].numel == 784 * 1024);
  // Each gradient is a view into its bucket: the three of bucket 0 share one buffer, at their
  // offsets in bucket order (2.bias first), and 0.weight has a buffer of its own.
  const auto parameters = model.parameters();  // 0.weight, 0.bias, 2.weight, 2.bias
  const ts::AnyTensor w0 = parameters[0].grad(), b0 = parameters[1].grad(),
                      w2 = parameters[2].grad(), b2 = parameters[3].grad();
  REQUIRE((w0.defined() && b0.defined() && w2.defined() && b2.defined()));
  CHECK(b2.storage().is_same(w2.storage()));
  CHECK(b2.storage().is_same(b0.storage()));
  CHECK_FALSE(w0.storage().is_same(b0.storage()));
  CHECK(w0.numel() == 784 * 1024);
  const auto* first = static_cast<const float*>(b2.data_ptr());
  CHECK(static_cast<const float*>(w2.data_ptr()) == first + 10);
  CHECK(static_cast<const float*>(b0.data_ptr()) == first + 10 + 10 * 1024);
}

TEST_CASE("no_sync accumulates locally; the next backward reduces the sum", "[ddp]") {
  dist::ProcessGroup pg;
  const std::int64_t micro = 3;  // two micro-batches per rank and step
  const std::int64_t global = 2 * micro * pg.size();
  const auto x = inputs_of<double>(global, 6, 5);
  const auto y = labels_of(global, 5);

  // Reference: the sum of two micro-batch means on every rank, averaged over the ranks, is twice
  // the global batch's mean gradient.
  ts::manual_seed(7);
  auto single = make_mlp();
  auto step = ag::compile([&](ag::Var<double> in, ag::Var<std::int64_t> labels) {
    return loss_of(single, in, labels) * 2.0;
  }, ag::input<double>({global, 6}, here()), ag::input<std::int64_t>({global}, here()));
  ts::optim::SGD single_opt(single.parameters(), {.lr = 0.05});
  // And each rank's first micro-batch alone, for the gradient that no_sync must leave local.
  auto first_only = ag::compile([&](ag::Var<double> in, ag::Var<std::int64_t> labels) {
    return loss_of(single, in, labels);
  }, ag::input<double>({micro, 6}, here()), ag::input<std::int64_t>({micro}, here()));

  ts::manual_seed(7);
  auto model = make_mlp();
  par::DistributedDataParallel ddp(model, small_buckets);
  auto ddp_step = ddp.compile(loss_of, ag::input<double>({micro, 6}),
                              ag::input<std::int64_t>({micro}));
  ts::optim::SGD ddp_opt(model.parameters(), {.lr = 0.05});

  for (int i = 0; i < 3; ++i) {
    INFO("step " << i << ", rank " << pg.rank());
    const auto first_x = rows_of(x, 2 * pg.rank(), micro);
    const auto first_y = rows_of(y, 2 * pg.rank(), micro);
    ddp_opt.zero_grad();
    {
      auto guard = ddp.no_sync();
      ddp_step.forward(first_x, first_y);
      ddp_step.backward();
    }
    // Local only: this rank's first micro-batch gradient, not averaged.
    single_opt.zero_grad();
    first_only.forward(first_x, first_y);
    first_only.backward();
    check_close(values_and_grads(model), values_and_grads(single), 1e-12);

    ddp_step.forward(rows_of(x, 2 * pg.rank() + 1, micro), rows_of(y, 2 * pg.rank() + 1, micro));
    ddp_step.backward();
    single_opt.zero_grad();
    step.forward(x, y);
    step.backward();
    check_close(values_and_grads(model), values_and_grads(single), 1e-12);
    single_opt.step();
    ddp_opt.step();
  }
}

// Two layers, of which the loss may use only the first.
struct TwoHeads : nn::Module {
  nn::Linear<double> used{6, 3}, unused{6, 3};
  TwoHeads() : nn::Module("TwoHeads") {
    register_module("used", used);
    register_module("unused", unused);
  }
  template <class X>
  auto forward(const X& x) const {
    return used(x);
  }
};

TEST_CASE("a parameter without a gradient is named, or reduced when asked", "[ddp]") {
  dist::ProcessGroup pg;
  const auto x = rows_of(inputs_of<double>(4 * pg.size(), 6, 9), pg.rank(), 4);
  const auto y = rows_of(labels_of(4 * pg.size(), 9), pg.rank(), 4);
  {
    TwoHeads model;
    par::DistributedDataParallel ddp(model);
    auto step = ddp.compile(loss_of, ag::input<double>({4, 6}), ag::input<std::int64_t>({4}));
    step.forward(x, y);
    CHECK_THROWS_WITH(step.backward(),
                      Catch::Contains("parameter unused.bias received no gradient") &&
                          Catch::Contains("find_unused_parameters"));
  }
  {
    TwoHeads model;
    par::DistributedDataParallel ddp(model, {.find_unused_parameters = true});
    auto step = ddp.compile(loss_of, ag::input<double>({4, 6}), ag::input<std::int64_t>({4}));
    step.forward(x, y);
    step.backward();
    // The unused head's gradient stays zero; the used one's is the ranks' average, the same on
    // every rank (checked against rank 0's through a broadcast).
    CHECK(model.unused.weight().grad().to_vector() == std::vector<double>(18, 0.0));
    auto grad = model.used.weight().grad().clone();
    auto rank0 = grad.clone();
    pg.broadcast(rank0, 0);
    CHECK(grad.to_vector() == rank0.to_vector());
  }
}

TEST_CASE("a parameter one rank does not use gets the ranks' average, step after step",
          "[ddp]") {
  // zero_grad leaves a gradient's zeros unwritten; rank 0 never writes the unused head's, and
  // its bucket still holds the last step's average unless DDP writes the zeros before reducing.
  dist::ProcessGroup pg;
  const std::int64_t n = 4;
  const auto global_x = inputs_of<double>(n * pg.size(), 6, 11);
  const auto x = rows_of(global_x, pg.rank(), n);
  const auto y = rows_of(labels_of(n * pg.size(), 12), pg.rank(), n);
  const bool both = pg.rank() != 0;
  TwoHeads model;
  par::DistributedDataParallel ddp(model, {.find_unused_parameters = true});
  auto step = ddp.compile(
      [both](TwoHeads& m, ag::Var<double> in, ag::Var<std::int64_t> labels) -> ag::Var<double> {
        if (both) return nn::cross_entropy(m.used(in), labels) + ts::sum(m.unused(in));
        return nn::cross_entropy(m.used(in), labels);
      },
      ag::input<double>({n, 6}), ag::input<std::int64_t>({n}));
  // d sum(x W^T + b) / dW[i][j] = sum of x[., j] over the rows, / db[i] = n: averaged over the
  // ranks, where rank 0 adds nothing.
  const auto all = global_x.to_vector();
  std::vector<double> want_weight(18, 0.0);
  for (std::int64_t row = n; row < n * pg.size(); ++row) {
    for (std::size_t i = 0; i < 3; ++i) {
      for (std::size_t j = 0; j < 6; ++j) {
        want_weight[i * 6 + j] += all[static_cast<std::size_t>(row) * 6 + j] / pg.size();
      }
    }
  }
  const double want_bias = static_cast<double>(n * (pg.size() - 1)) / pg.size();
  for (int i = 0; i < 3; ++i) {
    model.zero_grad();
    step.forward(x, y);
    step.backward();
    const auto weight = model.unused.weight().grad().to_vector();
    const auto bias = model.unused.bias().grad().to_vector();
    for (std::size_t k = 0; k < weight.size(); ++k) {
      CHECK(weight[k] == Approx(want_weight[k]).margin(1e-12));
    }
    for (const double b : bias) CHECK(b == Approx(want_bias).margin(1e-12));
  }
}

TEST_CASE("modules that differ between ranks are refused on every rank, naming the first",
          "[ddp]") {
  dist::ProcessGroup pg;
  // Rank 1's middle layer is 6 -> 12 instead of 6 -> 16.
  auto model = make_mlp(pg.rank() == 1 ? 12 : 16);
  try {
    par::DistributedDataParallel ddp(model);
    FAIL("no error");
  } catch (const ts::shape_error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find("0.weight is float64 [16, 6] on rank 0 but float64 [12, 6] on rank 1") !=
          std::string::npos);
  }
  // A different number of parameters.
  try {
    if (pg.rank() == 1) {
      par::DistributedDataParallel ddp(nn::Sequential(nn::Linear<double>(6, 3)));
    } else {
      par::DistributedDataParallel ddp(make_mlp());
    }
    FAIL("no error");
  } catch (const ts::shape_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("have from 2 to 6 parameters and buffers"));
  }
  pg.barrier();
}

TEST_CASE("DDP's state dict has PyTorch's module. prefix and loads into a plain module", "[ddp]") {
  ts::manual_seed(3 + static_cast<std::uint64_t>(dist::rank()));
  auto model = make_mlp();
  par::DistributedDataParallel ddp(model);
  const ts::StateDict saved = ddp.state_dict();
  for (const auto& [key, value] : saved) CHECK(key.rfind("module.", 0) == 0);
  auto plain = make_mlp();
  plain.load_state_dict(saved);
  const auto loaded = plain.parameters();
  const auto original = model.parameters();
  REQUIRE(loaded.size() == original.size());
  for (std::size_t i = 0; i < loaded.size(); ++i) {
    CHECK(loaded[i].value().as<double>().to_vector() ==
          original[i].value().as<double>().to_vector());
  }
  // Every rank holds rank 0's values after the construction.
  for (const auto& p : model.parameters()) {
    auto mine = p.value().as<double>().clone();
    auto theirs = mine.clone();
    dist::ProcessGroup().broadcast(theirs, 0);
    CHECK(mine.to_vector() == theirs.to_vector());
  }
}

TEST_CASE("DDP backward(scaler): scaled averaged gradients; an inf on one rank skips every rank",
          "[ddp][amp]") {
  dist::ProcessGroup pg;
  ts::manual_seed(7);
  auto model = make_mlp();
  par::DistributedDataParallel ddp(model, small_buckets);
  auto step = ddp.compile(loss_of, ag::input<double>({4, 6}), ag::input<std::int64_t>({4}));
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.1});
  const auto x = inputs_of<double>(4, 6, 10 + pg.rank());
  const auto y = labels_of(4, 10 + pg.rank());
  step.forward(x, y);
  step.backward();
  const auto plain = values_and_grads(model);
  sgd.zero_grad();
  ts::optim::GradScaler scaler({.init_scale = 256.0});
  step.forward(x, y);
  step.backward(scaler);
  const auto scaled = values_and_grads(model);
  for (std::size_t i = 1; i < plain.size(); i += 2) {
    for (std::size_t k = 0; k < plain[i].size(); ++k) CHECK(scaled[i][k] == plain[i][k] * 256.0);
  }
  CHECK(scaler.step(sgd));
  scaler.update();

  // Rank 1's batch holds an infinity: its gradients are NaN, the all-reduce spreads them, and
  // every rank's scaler skips the step and backs off.
  auto bad = x.clone();
  if (pg.rank() == 1) bad[0][0].fill_(std::numeric_limits<double>::infinity());
  const auto before = values_and_grads(model);
  sgd.zero_grad();
  step.forward(bad, y);
  step.backward(scaler);
  CHECK_FALSE(scaler.step(sgd));
  scaler.update();
  CHECK(scaler.get_scale() == 128.0);
  const auto after = values_and_grads(model);
  for (std::size_t i = 0; i < before.size(); i += 2) CHECK(after[i] == before[i]);  // values
}

}  // namespace distributed_data_parallel_test
