// replicate() and DataParallel's eager forward on virtual CPU devices (TESSERA_CPU_DEVICES=4 for
// this folder): a replica is an independent deep copy; dp(x) on 1, 2 and 3 devices, batch sizes
// 1, 2, 7 and 64, equals the module applied to the whole batch on one device (float64, 1e-12:
// the pieces' rows are computed independently of each other); BatchNorm in training mode
// normalises each piece with its own statistics and only the module's running statistics move;
// state dicts carry PyTorch's `module.` prefix and load both ways through a safetensors file;
// 0-dim outputs are gathered as one value per device (hand-computed); bad arguments throw
// naming the values. Labelled `threads`, so the TSan build runs it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace data_parallel_threads_test {

namespace ts = tessera;
namespace nn = tessera::nn;
namespace par = tessera::parallel;

// Deterministic inputs: x[i, j] from a small integer hash, so every run and device agrees.
ts::Tensor<double> batch_of(std::int64_t rows, std::int64_t columns, int seed = 0) {
  std::vector<double> values(static_cast<std::size_t>(rows * columns));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const int hashed = (static_cast<int>(i) * 7919 + seed * 104729) % 2001 - 1000;
    values[i] = static_cast<double>(hashed) / 400.0;
  }
  return ts::from_vector<double>(values, {rows, columns});
}

// Any state dict entry's values as double (parameters are double; num_batches_tracked int64).
std::vector<double> values_of(const ts::AnyTensor& t) {
  return t.visit([](auto typed) { return typed.template to<double>().to_vector(); });
}

auto make_model() {
  return nn::Sequential(nn::Linear<double>(6, 16), nn::ReLU{}, nn::BatchNorm1d<double>(16),
                        nn::Linear<double>(16, 3));
}
using Model = decltype(make_model());

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
  }
}

TEST_CASE("replicate makes an independent deep copy on another ordinal", "[parallel][dp]") {
  ts::manual_seed(7);
  auto model = make_model();
  model.eval();
  auto copy = par::replicate(model, 2);
  const auto mine = model.state_dict();
  const auto theirs = copy.state_dict();
  REQUIRE(theirs.size() == mine.size());
  auto m = mine.begin();
  for (auto t = theirs.begin(); t != theirs.end(); ++t, ++m) {
    INFO(t->first);
    CHECK(t->first == m->first);
    CHECK(t->second.device() == ts::Device{ts::DeviceType::cpu, 2});
    CHECK(!t->second.storage().is_same(m->second.storage()));
    CHECK(values_of(t->second) == values_of(m->second));
  }
  CHECK(!copy.is_training());
  // Same device: still a copy (ts::nn::to would return the module itself).
  auto same = par::replicate(model, 0);
  same.get<0>().weight().value().fill_(0.0);
  CHECK(model.get<0>().weight().value().to_vector() != std::vector<double>(96, 0.0));
  CHECK_THROWS_AS(par::replicate(model, 9), ts::device_error);
}

TEST_CASE("on CPU devices the replicas' parameters are the module's bytes, not copies",
          "[parallel][dp]") {
  // A model without buffers: nothing of it needs a copy on the replicas' devices.
  auto model = nn::Sequential(nn::Linear<double>(300, 200), nn::ReLU{}, nn::Linear<double>(200, 4));
  const ts::Device cpu1{ts::DeviceType::cpu, 1};
  const auto before = ts::memory::allocated(cpu1);
  par::DataParallel dp(model, {0, 1});
  CHECK(ts::memory::allocated(cpu1) == before);  // 481 KB of parameters were it copies
  // The replica computes with the module's current values: a change to the module (what an
  // optimiser's step does) is in the next output, with nothing copied at the call.
  const auto x = ts::from_vector<double>(std::vector<double>(2 * 300, 0.5), {2, 300});
  model.get<2>().bias().value().fill_(3.0);
  model.get<2>().weight().value().fill_(0.0);
  const auto y = dp(x).to_vector();  // row 0 on cpu:0, row 1 on the replica on cpu:1
  CHECK(y == std::vector<double>(8, 3.0));
}

TEST_CASE("DataParallel's forward equals the module on the whole batch", "[parallel][dp]") {
  for (const std::vector<int>& ids : {std::vector<int>{0}, {0, 1}, {0, 1, 2}, {2, 0, 3}}) {
    for (const std::int64_t batch : {1, 2, 7, 64}) {
      INFO(ids.size() << " devices starting with cpu:" << ids[0] << ", batch " << batch);
      ts::manual_seed(11);
      auto model = nn::to<ts::cpu>(make_model(), ids[0]);
      model.eval();
      // Running statistics away from their defaults, so that eval mode uses them visibly.
      model.get<2>().running_mean().value().fill_(0.25);
      model.get<2>().running_var().value().fill_(2.0);
      const auto x = batch_of(batch, 6, static_cast<int>(batch)).to(ids[0]);
      const auto want = ts::Tensor<double>(model(x)).to_vector();
      par::DataParallel dp(model, ids);
      const ts::Tensor<double> got = dp(x);
      CHECK(got.shape() == ts::Shape{batch, 3});
      CHECK(got.device_index() == ids[0]);
      check_close(got.to_vector(), want, 1e-12);
      // Again, after the module's weights change: the replicas take the new values.
      model.get<3>().bias().value().fill_(1.5);
      const auto want2 = ts::Tensor<double>(model(x)).to_vector();
      check_close(dp(x).to_vector(), want2, 1e-12);
    }
  }
}

TEST_CASE("DataParallel's replicas follow a parameter rebound or moved away and back",
          "[parallel][dp][failure]") {
  ts::manual_seed(12);
  auto model = make_model();
  model.eval();
  const auto x = batch_of(8, 6, 3);
  par::DataParallel dp(model, {0, 1, 2});
  check_close(dp(x).to_vector(), ts::Tensor<double>(model(x)).to_vector(), 1e-12);
  // The weight rebound to another tensor (the Parameter docs allow it): before, the replicas kept
  // reading the old one and the outputs differed from model(x) by about 0.85.
  model.get<3>().weight().value() = batch_of(3, 16, 5).to(0);
  check_close(dp(x).to_vector(), ts::Tensor<double>(model(x)).to_vector(), 1e-12);
  // The module moved away and back: every tensor is a new one on cpu:0.
  model.to(1);
  model.to(0);
  model.get<0>().bias().value().fill_(0.75);
  check_close(dp(x).to_vector(), ts::Tensor<double>(model(x)).to_vector(), 1e-12);
  // Moved away for good: the module is not on device_ids[0] any more, and the call says so.
  model.to(1);
  CHECK_THROWS_AS(dp(x.to(1)), ts::device_mismatch_error);
}

TEST_CASE("a DataParallel forward that fails on one device leaves the module's statistics",
          "[parallel][dp][failure]") {
  ts::manual_seed(13);
  auto model = make_model();  // training mode: BatchNorm moves its running statistics
  par::DataParallel dp(model, {0, 1, 2});
  (void)dp(batch_of(9, 6, 1));  // pieces of 3: fine, the statistics move
  const auto mean = values_of(model.get<2>().running_mean().value());
  const auto tracked = values_of(model.get<2>().num_batches_tracked().value());
  // 5 rows over 3 devices: pieces 2, 2, 1; the last one has one value per channel, which
  // BatchNorm refuses in training. The module's own piece ran first and had moved its
  // statistics and counted the batch.
  CHECK_THROWS_WITH(dp(batch_of(5, 6, 2)), Catch::Contains("more than 1 value per channel"));
  CHECK(values_of(model.get<2>().running_mean().value()) == mean);
  CHECK(values_of(model.get<2>().num_batches_tracked().value()) == tracked);
  // And the next good call moves them once.
  (void)dp(batch_of(9, 6, 3));
  CHECK(values_of(model.get<2>().num_batches_tracked().value())[0] == tracked[0] + 1);
}

TEST_CASE("DataParallel splits evenly, gathers on output_device, along dim", "[parallel][dp]") {
  ts::manual_seed(3);
  auto model = make_model();
  model.eval();
  // Outputs on cpu:3 (not a member), input on cpu:1 (not the first member).
  par::DataParallel dp(model, {0, 1, 2}, 3);
  const auto x = batch_of(5, 6).to(1);
  const ts::Tensor<double> y = dp(x);
  CHECK(y.device_index() == 3);
  check_close(y.to_vector(), ts::Tensor<double>(model(x.to(0))).to_vector(), 1e-12);
  CHECK(dp.output_device() == 3);
  CHECK(dp.device_ids() == std::vector<int>{0, 1, 2});

  // dim 1: a layer that maps [N] columns of a [F, N] input (Linear on the transpose is not a
  // model; use an elementwise one, which works on any split).
  par::DataParallel<nn::ReLU, ts::cpu> columns(nn::ReLU{}, {0, 1}, -1, 1);
  const ts::Tensor<double> z = batch_of(3, 5) - 1.0;
  const ts::Tensor<double> relu_z = ts::relu(z);
  CHECK(columns(z).to_vector() == relu_z.to_vector());
}

TEST_CASE("DataParallel in training mode: BatchNorm uses each piece's statistics",
          "[parallel][dp]") {
  ts::manual_seed(5);
  auto model = make_model();
  model.train();
  const auto x = batch_of(9, 6, 2);
  // Reference: the module on each piece (sizes 3, 3, 3) in turn, from the same starting state.
  auto reference = par::replicate(model, 0);
  std::vector<double> want;
  for (std::int64_t first : {0, 3, 6}) {
    for (double v : ts::Tensor<double>(reference(x.narrow(0, first, 3))).to_vector()) {
      want.push_back(v);
    }
  }
  // The reference module's running statistics moved three times; DataParallel's only once (the
  // replicas' updates are dropped, as in PyTorch): compare with one update on piece 0.
  auto once = par::replicate(model, 0);
  (void)ts::Tensor<double>(once(x.narrow(0, 0, 3)));

  par::DataParallel dp(model, {0, 1, 2});
  check_close(dp(x).to_vector(), want, 1e-12);
  check_close(model.get<2>().running_mean().value().to_vector(),
              once.get<2>().running_mean().value().to_vector(), 1e-15);
  check_close(model.get<2>().running_var().value().to_vector(),
              once.get<2>().running_var().value().to_vector(), 1e-15);
}

// The mean of its input (a plain layer: a replica's 0-dim output).
struct Mean {
  ts::Tensor<double> forward(const ts::Tensor<double>& x) const { return ts::mean(x); }
};
// A 0-dim sum for a piece of one row, else the rows' sums: outputs of different ranks.
struct SumOfRows {
  ts::Tensor<double> forward(const ts::Tensor<double>& x) const {
    return x.size(0) == 1 ? ts::sum(x) : ts::sum(x, 1);
  }
};

TEST_CASE("DataParallel gathers 0-dim outputs as one value per device, as PyTorch",
          "[parallel][dp]") {
  // Linear(2, 1) with weight [0.5, -1] and bias 3, then the mean: the rows [1, 2], [3, 4],
  // [5, 6], [7, 8] give 1.5, 0.5, -0.5, -1.5.
  auto model = nn::Sequential(nn::Linear<double>(2, 1), Mean{});
  model.get<0>().weight().value().copy_(ts::from_vector<double>({0.5, -1.0}, {1, 2}));
  model.get<0>().bias().value().fill_(3.0);
  const auto x = ts::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});

  par::DataParallel two(model, {0, 1});
  const ts::Tensor<double> per_device = two(x);  // rows 0-1 on cpu:0, 2-3 on cpu:1
  CHECK(per_device.shape() == ts::Shape{2});
  CHECK(per_device.device_index() == 0);
  CHECK(per_device.to_vector() == std::vector<double>{1.0, -1.0});
  // A batch of one uses one device: one value.
  const ts::Tensor<double> one_row = two(x.narrow(0, 0, 1));
  CHECK(one_row.shape() == ts::Shape{1});
  CHECK(one_row.to_vector() == std::vector<double>{1.5});

  par::DataParallel three(model, {0, 1, 2}, 3);  // pieces of 2, 1 and 1 rows, gathered on cpu:3
  const ts::Tensor<double> on_three = three(x);
  CHECK(on_three.device_index() == 3);
  CHECK(on_three.to_vector() == std::vector<double>{1.0, -0.5, -1.5});

  // One device id: the module's own 0-dim output (PyTorch calls the module directly).
  par::DataParallel single(model, {0});
  const ts::Tensor<double> whole = single(x.narrow(0, 0, 3));
  CHECK(whole.dim() == 0);
  CHECK(whole.item() == 0.5);

  // Split along dim 1: the scalars still make a vector. Columns {0, 1} and {2}.
  par::DataParallel<Mean, ts::cpu> columns(Mean{}, {0, 1}, -1, 1);
  const auto wide = ts::from_vector<double>({1, 2, 4, 8, 16, 32}, {2, 3});
  CHECK(columns(wide).to_vector() == std::vector<double>{(1.0 + 2 + 8 + 16) / 4, (4.0 + 32) / 2});

  // A 0-dim output beside a 1-d one: the shape error names both.
  par::DataParallel<SumOfRows, ts::cpu> mixed(SumOfRows{}, {0, 1});
  CHECK_THROWS_WITH(mixed(x.narrow(0, 0, 3)),
                    Catch::Contains("[2]") && Catch::Contains("[]") &&
                        Catch::Contains("cannot be concatenated"));
  CHECK(mixed(x).to_vector() == std::vector<double>{3, 7, 11, 15});
}

TEST_CASE("DataParallel's state dict carries the module. prefix and loads both ways",
          "[parallel][dp][io]") {
  ts::manual_seed(9);
  auto model = make_model();
  par::DataParallel dp(model, {0, 1});
  const auto dict = dp.state_dict();
  CHECK(dict.contains("module.0.weight"));
  CHECK(dict.contains("module.2.running_mean"));
  CHECK(dict.size() == model.state_dict().size());

  const auto file = std::filesystem::temp_directory_path() / "tessera_dp_test.safetensors";
  ts::save(dict, file.string());
  // Into a plain module: the prefix is stripped.
  ts::manual_seed(1234);
  auto plain = make_model();
  plain.load_state_dict(ts::load(file.string()));
  CHECK(plain.get<0>().weight().value().to_vector() == model.get<0>().weight().value().to_vector());
  // A plain module's dict into a DataParallel: the prefix is added.
  plain.get<3>().bias().value().fill_(-2.0);
  ts::save(plain.state_dict(), file.string());
  dp.load_state_dict(ts::load(file.string()));
  CHECK(model.get<3>().bias().value().to_vector() == std::vector<double>(3, -2.0));
  std::filesystem::remove(file);
}

TEST_CASE("DataParallel refuses bad arguments, naming the values", "[parallel][dp][errors]") {
  auto model = make_model();  // on cpu:0
  CHECK_THROWS_AS(par::DataParallel(model, std::vector<int>{}), std::invalid_argument);
  CHECK_THROWS_WITH(par::DataParallel(model, {0, 7}),
                    Catch::Contains("member 1") && Catch::Contains("cpu:7"));
  CHECK_THROWS_AS(par::DataParallel(model, {0, 0}), std::invalid_argument);
  CHECK_THROWS_WITH(par::DataParallel(model, {1, 0}),
                    Catch::Contains("0.weight is on cpu:0") &&
                        Catch::Contains("device_ids[0] is cpu:1"));
  CHECK_THROWS_AS(par::DataParallel(model, {1, 0}), ts::device_mismatch_error);
  CHECK_THROWS_AS(par::DataParallel(model, {0, 1}, 9), ts::device_error);
  par::DataParallel dp(model, {0, 1}, -1, 1);
  CHECK_THROWS_WITH(dp(ts::zeros<double>({4})),
                    Catch::Contains("DataParallel") && Catch::Contains("dimension 1"));
  par::DataParallel all(model);  // every virtual device
  CHECK(all.device_ids().size() == static_cast<std::size_t>(ts::cpu::device_count()));
}

}  // namespace data_parallel_threads_test
