// Pipeline parallelism (torchgpipe's GPipe, and 1F1B) on virtual CPU devices
// (TESSERA_CPU_DEVICES=4 for this folder). Against the unsplit model on one device over the whole
// batch (float64, 1e-12): the loss and every gradient, for both schedules x the three checkpoint
// modes, 2 and 3 stages, 1, 2 and 5 chunks of a batch of 11 (micro-batches 11 / 6+5 / 3+3+3+2).
// split_size (the tutorial's knob) cuts as x.split does: the same numbers as the equal chunks,
// and a last micro-batch no chunks can give (5+5+1) against the unsplit model.
// With Dropout, a checkpointed micro-batch's recomputation draws the forward's numbers again
// (checkpointed and not give the same gradients). With BatchNorm1d each micro-batch is
// normalised with its own statistics: the reference is the micro-batches run one by one on one
// device. 1F1B keeps fewer micro-batches per stage than GPipe, measured by the pool's
// peak_allocated. Bad options and inputs throw naming the values; a failing stage stops the
// others and its error is the one thrown. Labelled `threads`, so the TSan build runs it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/optim/grad_scaler.hpp"
#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"
#include "parallel/training_data.hpp"

namespace pipeline_threads_test {

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace par = tessera::parallel;

using training_data::inputs_of;
using training_data::labels_of;

// One Sequential type for most cases (each type compiles the pipeline once more).
auto make_mlp(int hidden = 16, int narrow = 8) {
  return nn::Sequential(nn::Linear<double>(6, hidden), nn::ReLU{},
                        nn::Linear<double>(hidden, narrow), nn::Tanh{},
                        nn::Linear<double>(narrow, narrow), nn::ReLU{},
                        nn::Linear<double>(narrow, 3));
}

std::vector<std::vector<double>> grads_of(const nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (const auto& p : m.parameters()) {
    const ts::AnyTensor g = p.grad();
    out.push_back(g.defined() ? g.as<double, ts::cpu>().to_vector() : std::vector<double>{});
  }
  return out;
}

using training_data::check_close;

const char* name_of(par::Schedule s) { return s == par::Schedule::gpipe ? "gpipe" : "1f1b"; }
const char* name_of(par::Checkpoint c) {
  return c == par::Checkpoint::always        ? "always"
         : c == par::Checkpoint::except_last ? "except_last"
                                             : "never";
}

auto loss_fn = [](auto out, auto labels) { return nn::cross_entropy(out, labels); };

// The unsplit model's loss and gradients over the batch (x, y): a replica of `seq` on cpu:0.
template <class Seq>
std::pair<double, std::vector<std::vector<double>>> unsplit(const Seq& seq,
                                                            const ts::Tensor<double>& x,
                                                            const ts::Tensor<std::int64_t>& y) {
  auto reference = par::replicate(seq, 0);
  auto program = ag::compile(
      [&](ag::Var<double> in, ag::Var<std::int64_t> labels) {
        return nn::cross_entropy(reference(in), labels);
      },
      ag::input<double>(x.shape()), ag::input<std::int64_t>(y.shape()));
  const double loss = program.forward(x, y).item();
  program.backward();
  return {loss, grads_of(reference)};
}

TEST_CASE("pipeline gradients equal the unsplit model's for every schedule and checkpoint mode",
          "[parallel][pipeline]") {
  const std::int64_t batch = 11;
  const auto x = inputs_of<double>(batch, 6, 1);
  const auto y = labels_of(batch, 2);
  for (const std::vector<int>& balance : {std::vector<int>{3, 4}, std::vector<int>{2, 2, 3}}) {
    for (par::Schedule schedule : {par::Schedule::gpipe, par::Schedule::one_f_one_b}) {
      for (par::Checkpoint checkpoint :
           {par::Checkpoint::always, par::Checkpoint::except_last, par::Checkpoint::never}) {
        for (int chunks : {1, 2, 5}) {
          INFO(balance.size() << " stages, " << name_of(schedule) << ", checkpoint "
                              << name_of(checkpoint) << ", " << chunks << " chunks");
          ts::manual_seed(7);
          auto seq = make_mlp();
          const auto [ref_loss, ref_grads] = unsplit(seq, x, y);

          par::Pipeline pipe(seq, {.balance = balance,
                                   .chunks = chunks,
                                   .schedule = schedule,
                                   .checkpoint = checkpoint});
          CHECK(seq.get<0>().weight().value().device_index() == 0);
          CHECK(seq.get<6>().weight().value().device_index() ==
                static_cast<int>(balance.size()) - 1);
          auto program = pipe.compile(loss_fn, ag::input<double>({batch, 6}),
                                      ag::input<std::int64_t>({batch}));
          CHECK(program.micro_batches() == (chunks == 5 ? 4 : chunks));
          for (int step = 0; step < 2; ++step) {  // the second step accumulates
            const double loss = program.forward(x, y).item();
            CHECK(loss == Approx(ref_loss).epsilon(1e-12));
            program.backward();
          }
          auto twice = ref_grads;
          for (auto& g : twice) {
            for (double& v : g) v *= 2;
          }
          check_close(grads_of(seq), twice, 1e-12);
          const auto& plan = pipe.plan();
          REQUIRE(plan.size() == balance.size());
          for (std::size_t s = 0; s < plan.size(); ++s) {
            CHECK(plan[s].device.index == static_cast<int>(s));
            CHECK(plan[s].peak_bytes >= plan[s].micro_batch_bytes);
            if (schedule == par::Schedule::one_f_one_b) {
              CHECK(plan[s].max_in_flight <=
                    static_cast<int>(balance.size()) - static_cast<int>(s));
            } else {
              CHECK(plan[s].max_in_flight == program.micro_batches());
            }
          }
        }
      }
    }
  }
}

TEST_CASE("split_size cuts the batch as x.split(split_size): the chunks form's numbers",
          "[parallel][pipeline]") {
  const std::int64_t batch = 11;
  const auto x = inputs_of<double>(batch, 6, 14);
  const auto y = labels_of(batch, 15);
  // x.split(split_size) of 11 samples, and the chunks that cut the same (0: none does).
  struct Case {
    std::int64_t split_size;
    std::vector<std::int64_t> sizes;
    int chunks;
  };
  const Case cases[] = {{3, {3, 3, 3, 2}, 4}, {6, {6, 5}, 2}, {11, {11}, 1}, {20, {11}, 1},
                        {5, {5, 5, 1}, 0},    {2, {2, 2, 2, 2, 2, 1}, 6}};
  for (par::Schedule schedule : {par::Schedule::gpipe, par::Schedule::one_f_one_b}) {
    for (const Case& c : cases) {
      INFO(name_of(schedule) << ", split_size " << c.split_size);
      ts::manual_seed(16);
      auto seq = make_mlp();
      const auto [ref_loss, ref_grads] = unsplit(seq, x, y);
      auto by_chunks = par::replicate(seq, 0);

      par::Pipeline pipe(seq,
                         {.balance = {3, 4}, .split_size = c.split_size, .schedule = schedule});
      CHECK(pipe.options().split_size == c.split_size);
      CHECK_FALSE(pipe.options().chunks.has_value());
      auto program = pipe.compile(loss_fn, ag::input<double>({batch, 6}),
                                  ag::input<std::int64_t>({batch}));
      CHECK(program.micro_batch_sizes() == c.sizes);
      const double loss = program.forward(x, y).item();
      program.backward();
      CHECK(loss == Approx(ref_loss).epsilon(1e-12));
      check_close(grads_of(seq), ref_grads, 1e-12);
      // Inference cuts the same way: the unsplit model's output.
      const auto out = pipe(x).to_vector();
      const auto expected = by_chunks(x).to_vector();
      REQUIRE(out.size() == expected.size());
      for (std::size_t i = 0; i < out.size(); ++i) {
        CHECK(out[i] == Approx(expected[i]).epsilon(1e-14));
      }
      if (c.chunks == 0) continue;
      // The same micro-batches by chunks: the same programs, so bit for bit the same numbers.
      par::Pipeline chunked(by_chunks,
                            {.balance = {3, 4}, .chunks = c.chunks, .schedule = schedule});
      auto chunked_program = chunked.compile(loss_fn, ag::input<double>({batch, 6}),
                                             ag::input<std::int64_t>({batch}));
      CHECK(chunked_program.micro_batch_sizes() == c.sizes);
      CHECK(chunked_program.forward(x, y).item() == loss);
      chunked_program.backward();
      check_close(grads_of(by_chunks), grads_of(seq), 0);
    }
  }
}

TEST_CASE("pipeline inference: pipe(x) computes the model's output on the last device",
          "[parallel][pipeline]") {
  const auto x = inputs_of<double>(9, 6, 3);
  auto seq = make_mlp();
  auto reference = par::replicate(seq, 0);
  const auto expected = reference(x).to_vector();
  par::Pipeline pipe(seq, {.balance = {1, 3, 3}, .devices = {2, 0, 3}, .chunks = 4});
  const auto out = pipe(x);
  CHECK(out.device_index() == 3);
  CHECK(out.shape() == ts::Shape{9, 3});
  const auto got = out.to_vector();
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expected[i]).epsilon(1e-14));
  // A batch smaller than chunks: fewer micro-batches, the same output.
  const auto small = inputs_of<double>(2, 6, 4);
  const auto small_expected = reference(small).to_vector();
  const auto small_got = pipe(small).to_vector();
  for (std::size_t i = 0; i < small_got.size(); ++i) {
    CHECK(small_got[i] == Approx(small_expected[i]).epsilon(1e-14));
  }
}

TEST_CASE("a checkpointed micro-batch's recomputation draws the forward's random numbers again",
          "[parallel][pipeline]") {
  const std::int64_t batch = 8;
  const auto x = inputs_of<double>(batch, 6, 5);
  const auto y = labels_of(batch, 6);
  std::vector<std::vector<double>> grads[3];
  double losses[3] = {0, 0, 0};
  for (int run = 0; run < 3; ++run) {  // never, always, and without dropout
    ts::manual_seed(11);
    const double p = run == 2 ? 0.0 : 0.5;
    auto seq = nn::Sequential(nn::Linear<double>(6, 16), nn::Dropout(p),
                              nn::Linear<double>(16, 16), nn::Dropout(p),
                              nn::Linear<double>(16, 3));
    par::Pipeline pipe(seq, {.balance = {2, 3},
                             .chunks = 4,
                             .checkpoint = run == 0 ? par::Checkpoint::never
                                                    : par::Checkpoint::always});
    auto program = pipe.compile(loss_fn, ag::input<double>({batch, 6}),
                                ag::input<std::int64_t>({batch}));
    ts::manual_seed(12);
    losses[run] = program.forward(x, y).item();
    program.backward();
    grads[run] = grads_of(seq);
  }
  CHECK(losses[1] == Approx(losses[0]).epsilon(1e-14));
  check_close(grads[1], grads[0], 1e-14);
  // Dropout did change the numbers (the same weights without it give another loss).
  CHECK(std::abs(losses[2] - losses[0]) > 1e-6);
}

TEST_CASE("BatchNorm in a stage normalises each micro-batch with its own statistics",
          "[parallel][pipeline]") {
  const std::int64_t batch = 10;
  const auto x = inputs_of<double>(batch, 6, 8);
  const auto y = labels_of(batch, 9);
  auto seq = nn::Sequential(nn::Linear<double>(6, 8), nn::BatchNorm1d<double>(8), nn::ReLU{},
                            nn::Linear<double>(8, 3));
  auto reference = par::replicate(seq, 0);
  // The reference: micro-batches of 4, 4 and 2 one after the other on one device, each loss
  // weighted by its share of the batch.
  const std::int64_t sizes[] = {4, 4, 2};
  std::int64_t offset = 0;
  double ref_loss = 0;
  for (std::int64_t size : sizes) {
    const double weight = static_cast<double>(size) / static_cast<double>(batch);
    auto program = ag::compile(
        [&](ag::Var<double> in, ag::Var<std::int64_t> labels) {
          return nn::cross_entropy(reference(in), labels) * weight;
        },
        ag::input<double>({size, 6}), ag::input<std::int64_t>({size}));
    ref_loss += program.forward(x.narrow(0, offset, size), y.narrow(0, offset, size)).item();
    program.backward();
    offset += size;
  }
  for (par::Checkpoint checkpoint : {par::Checkpoint::never, par::Checkpoint::always}) {
    INFO("checkpoint " << name_of(checkpoint));
    auto model = par::replicate(seq, 0);
    par::Pipeline pipe(model, {.balance = {2, 2},
                               .chunks = 3,
                               .schedule = par::Schedule::one_f_one_b,
                               .checkpoint = checkpoint});
    auto program = pipe.compile(loss_fn, ag::input<double>({batch, 6}),
                                ag::input<std::int64_t>({batch}));
    CHECK(program.forward(x, y).item() == Approx(ref_loss).epsilon(1e-12));
    program.backward();
    check_close(grads_of(model), grads_of(reference), 1e-12);
    // Running statistics moved once per micro-batch, as in the reference (recomputation does
    // not move them again).
    const auto& bn = model.get<1>();
    const auto& ref_bn = reference.get<1>();
    check_close({bn.running_mean().value().to_vector(), bn.running_var().value().to_vector()},
                {ref_bn.running_mean().value().to_vector(),
                 ref_bn.running_var().value().to_vector()},
                1e-12);
    CHECK(bn.num_batches_tracked().value().item() == 3);
  }
}

TEST_CASE("1F1B keeps at most stages - i micro-batches on stage i, fewer than GPipe",
          "[parallel][pipeline][memory]") {
  const std::int64_t batch = 64;
  const auto x = inputs_of<double>(batch, 6, 10);
  const auto y = labels_of(batch, 11);
  std::size_t peaks[2][3] = {};
  for (par::Schedule schedule : {par::Schedule::gpipe, par::Schedule::one_f_one_b}) {
    INFO(name_of(schedule));
    auto seq = make_mlp(64, 64);
    par::Pipeline pipe(seq, {.balance = {2, 2, 3},
                             .chunks = 8,
                             .schedule = schedule,
                             .checkpoint = par::Checkpoint::never});
    auto program = pipe.compile(loss_fn, ag::input<double>({batch, 6}),
                                ag::input<std::int64_t>({batch}));
    program.forward(x, y);  // warm-up: gradients are created at the first backward
    program.backward();
    // Zero, so the step measured keeps no copy of them (a step that accumulates onto earlier
    // gradients copies them first, to put them back if it fails).
    seq.zero_grad();
    std::size_t before[3];
    for (int s = 0; s < 3; ++s) {
      ts::memory::reset_peak(pipe.device(s));
      before[s] = ts::memory::allocated(pipe.device(s));
    }
    program.forward(x, y);
    program.backward();
    const int row = schedule == par::Schedule::gpipe ? 0 : 1;
    for (int s = 0; s < 3; ++s) {
      INFO("stage " << s);
      const std::size_t peak = ts::memory::peak_allocated(pipe.device(s)) - before[s];
      peaks[row][s] = peak;
      const auto& plan = pipe.plan()[static_cast<std::size_t>(s)];
      // One micro-batch's worth (micro_batch_bytes): its arena, its inputs and the gradient of
      // its output that the next stage sends back.
      const int kept = schedule == par::Schedule::gpipe ? 8 : 3 - s;
      CHECK(plan.max_in_flight == kept);
      CHECK(peak <= static_cast<std::size_t>(kept) * plan.micro_batch_bytes);
      CHECK(peak >= static_cast<std::size_t>(kept) * (plan.micro_batch_bytes / 2));
    }
  }
  for (int s = 0; s < 3; ++s) CHECK(peaks[1][s] < peaks[0][s]);
}

TEST_CASE("pipeline with a GradScaler: the scale times the unsplit model's gradients, and an "
          "inf on a stage skips the step everywhere",
          "[parallel][pipeline][amp]") {
  const std::int64_t batch = 8;
  const auto x = inputs_of<double>(batch, 6, 3);
  const auto y = labels_of(batch, 4);
  for (par::Schedule schedule : {par::Schedule::gpipe, par::Schedule::one_f_one_b}) {
    INFO(name_of(schedule));
    ts::manual_seed(9);
    auto seq = make_mlp();
    const auto want = unsplit(seq, x, y).second;
    auto scaled_want = want;
    for (auto& g : scaled_want) {
      for (double& v : g) v *= 1024.0;
    }

    par::Pipeline pipe(seq, {.balance = {3, 4}, .chunks = 2, .schedule = schedule});
    auto program =
        pipe.compile(loss_fn, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
    ts::optim::SGD sgd(seq.parameters(), {.lr = 0.5});  // over both stages' devices
    ts::optim::GradScaler scaler({.init_scale = 1024.0});
    if (schedule == par::Schedule::one_f_one_b) {
      program.forward(x, y);  // its backwards ran unscaled: backward(scaler) is refused
      CHECK_THROWS_WITH(program.backward(scaler),
                        Catch::Contains("one_f_one_b") && Catch::Contains("forward(scaler"));
      program.backward();
      sgd.zero_grad();
      program.forward(scaler, x, y);
      program.backward(scaler);
    } else {
      program.forward(x, y);
      program.backward(scaler);
    }
    check_close(grads_of(seq), scaled_want, 1e-12);
    scaler.unscale_(sgd);
    check_close(grads_of(seq), want, 1e-12);
    CHECK(scaler.step(sgd));
    scaler.update();
    CHECK(scaler.get_scale() == 1024.0);

    // An inf in one sample: every stage's gradients are non-finite, the step is skipped for
    // every parameter (on both devices) and the scale backs off.
    std::vector<std::vector<double>> before;
    for (const auto& p : seq.parameters()) before.push_back(p.value().as<double, ts::cpu>().to_vector());
    auto bad = x.clone();
    bad[5][2].fill_(std::numeric_limits<double>::infinity());
    sgd.zero_grad();
    program.forward(scaler, bad, y);
    program.backward();
    CHECK_FALSE(scaler.step(sgd));
    scaler.update();
    CHECK(scaler.get_scale() == 512.0);
    std::size_t i = 0;
    for (const auto& p : seq.parameters()) {
      CHECK(p.value().as<double, ts::cpu>().to_vector() == before[i++]);
    }
  }
}

TEST_CASE("pipeline options and inputs are checked, naming the values", "[parallel][pipeline]") {
  auto seq = make_mlp();
  using Pipe = par::Pipeline<decltype(seq)>;
  CHECK_THROWS_WITH(Pipe(seq, {.balance = {3, 3}}),
                    Catch::Contains("module: 7") && Catch::Contains("sum of balance: 6"));
  CHECK_THROWS_WITH(Pipe(seq, {.balance = {}}), Catch::Contains("sum of balance: 0"));
  CHECK_THROWS_WITH(Pipe(seq, {.balance = {7, 0}}), Catch::Contains("[7, 0]"));
  CHECK_THROWS_WITH(Pipe(seq, {.balance = {1, 1, 1, 1, 1, 2}}),
                    Catch::Contains("devices: 4") && Catch::Contains("stages: 6"));
  CHECK_THROWS_WITH(Pipe(seq, {.balance = {3, 4}, .devices = {1}}),
                    Catch::Contains("devices: [1]") && Catch::Contains("stages: 2"));
  CHECK_THROWS_WITH(Pipe(seq, {.balance = {3, 4}, .chunks = 0}), Catch::Contains("chunks: 0"));
  CHECK_THROWS_WITH(Pipe(seq, {.balance = {3, 4}, .split_size = 0}),
                    Catch::Contains("split_size: 0"));
  CHECK_THROWS_WITH(Pipe(seq, {.balance = {3, 4}, .chunks = 2, .split_size = 3}),
                    Catch::Contains("not both") && Catch::Contains("chunks: 2") &&
                        Catch::Contains("split_size: 3"));
  CHECK_THROWS_WITH(Pipe(seq, {.balance = {3, 4}, .chunks = 1, .split_size = 1}),
                    Catch::Contains("chunks: 1") && Catch::Contains("split_size: 1"));
  CHECK_THROWS_AS(Pipe(seq, {.balance = {3, 4}, .devices = {1, 1}}), std::invalid_argument);
  CHECK_THROWS_AS(Pipe(seq, {.balance = {3, 4}, .devices = {0, 9}}), ts::device_error);
  // Nothing moved by a refused pipeline.
  CHECK(seq.get<6>().weight().value().device_index() == 0);

  {  // neither chunks nor split_size: one micro-batch
    auto one = par::replicate(seq, 0);
    par::Pipeline<decltype(one)> whole(one, {.balance = {3, 4}});
    CHECK(whole.options().chunks == 1);
    CHECK(whole.compile(loss_fn, ag::input<double>({6, 6}), ag::input<std::int64_t>({6}))
              .micro_batch_sizes() == std::vector<std::int64_t>{6});
  }
  par::Pipeline pipe(seq, {.balance = {3, 4}, .chunks = 4});
  auto program =
      pipe.compile(loss_fn, ag::input<double>({6, 6}), ag::input<std::int64_t>({6}));
  CHECK(program.micro_batch_sizes() == std::vector<std::int64_t>{2, 2, 2});
  CHECK_THROWS_WITH(program.forward(inputs_of<double>(5, 6, 1), labels_of(6, 1)),
                    Catch::Contains("[5, 6]") && Catch::Contains("[6, 6]"));
  CHECK_THROWS_WITH(program.backward(), Catch::Contains("forward first"));
  CHECK_THROWS_WITH(pipe.compile(loss_fn, ag::input<double>({6, 6}),
                                 ag::input<std::int64_t>({5})),
                    Catch::Contains("[6, 6]") && Catch::Contains("[5]"));

  // An eager call whose input stage 0 refuses throws that error; the pipeline works afterwards
  // (a failure on a later stage while an earlier one waits: the Tripwire case below).
  CHECK_THROWS_AS(pipe(inputs_of<double>(6, 5, 1)), ts::shape_error);
  const auto out = pipe(inputs_of<double>(6, 6, 1));
  CHECK(out.shape() == ts::Shape{6, 3});
  const double loss = program.forward(inputs_of<double>(6, 6, 2), labels_of(6, 3)).item();
  CHECK(std::isfinite(loss));
  program.backward();
}

// A layer that throws while the program runs, when armed (an effect of its traced forward).
struct Tripwire {
  std::shared_ptr<bool> armed = std::make_shared<bool>(false);
  ag::Var<double> forward(const ag::Var<double>& x) const {
    ag::on_forward(
        [armed = armed](const ts::Tensor<double>&) {
          if (*armed) throw std::runtime_error("tripwire on the last stage");
        },
        x);
    return x;
  }
};

TEST_CASE("a stage that fails while another waits for it: the failing stage's error is thrown",
          "[parallel][pipeline]") {
  const auto x = inputs_of<double>(8, 6, 12);
  const auto y = labels_of(8, 13);
  auto seq = nn::Sequential(nn::Linear<double>(6, 8), nn::ReLU{}, nn::Linear<double>(8, 3),
                            Tripwire{});
  const std::shared_ptr<bool> armed = seq.get<3>().armed;
  // 1F1B: stage 0 (the calling thread, member 0) runs two forwards and then waits for the
  // first gradient, which stage 1 never sends: it stops with "another stage failed", and the
  // error thrown must be stage 1's.
  par::Pipeline pipe(seq, {.balance = {2, 2},
                           .chunks = 4,
                           .schedule = par::Schedule::one_f_one_b,
                           .checkpoint = par::Checkpoint::never});
  auto program = pipe.compile(loss_fn, ag::input<double>({8, 6}), ag::input<std::int64_t>({8}));
  const double loss = program.forward(x, y).item();
  program.backward();
  const auto grads = grads_of(seq);
  seq.zero_grad();
  *armed = true;
  CHECK_THROWS_WITH(program.forward(x, y), Catch::Contains("tripwire on the last stage"));
  // Usable afterwards, with the same numbers.
  *armed = false;
  seq.zero_grad();
  CHECK(program.forward(x, y).item() == loss);
  program.backward();
  check_close(grads_of(seq), grads, 0);
}

TEST_CASE("pipeline losses kept over the steps keep their values", "[parallel][pipeline]") {
  const std::int64_t batch = 12;
  const auto x = inputs_of<double>(batch, 6, 21);
  const auto y = labels_of(batch, 22);
  for (par::Schedule schedule : {par::Schedule::gpipe, par::Schedule::one_f_one_b}) {
    INFO(name_of(schedule));
    ts::manual_seed(23);
    auto seq = make_mlp();
    par::Pipeline pipe(seq, {.balance = {3, 4}, .chunks = 3, .schedule = schedule});
    auto program =
        pipe.compile(loss_fn, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
    ts::optim::SGD opt(seq.parameters(), {.lr = 0.5});
    std::vector<ts::Tensor<double>> losses;
    std::vector<double> returned;
    for (int i = 0; i < 4; ++i) {
      opt.zero_grad();
      losses.push_back(program.forward(x, y));
      returned.push_back(losses.back().item());
      program.backward();
      opt.step();
    }
    for (std::size_t i = 0; i < losses.size(); ++i) {
      INFO("step " << i);
      CHECK(losses[i].item() == returned[i]);
      if (i > 0) CHECK(returned[i] < returned[i - 1]);
    }
  }
}

TEST_CASE("a pipeline whose layers cannot all move (out of memory) moves none of them",
          "[parallel][pipeline][memory]") {
  // Stage 1 (cpu:1) holds a Linear of 4 MB, which fits the limit, then one of 12 MB, which
  // does not: the first must not stay moved.
  auto seq = nn::Sequential(nn::Linear<float>(6, 1000), nn::Linear<float>(1000, 1000),
                            nn::Linear<float>(1000, 3000));
  const auto weights = [&] {
    return std::vector<ts::AnyTensor>{seq.get<0>().weight().value(), seq.get<1>().weight().value(),
                                      seq.get<1>().bias().value(), seq.get<2>().weight().value()};
  };
  const auto before = weights();
  const ts::Device cpu1{ts::DeviceType::cpu, 1};
  ts::memory::empty_cache(cpu1);
  ts::memory::set_limit(cpu1, ts::memory::allocated(cpu1) + (std::size_t{7} << 20));
  CHECK_THROWS_AS(par::Pipeline(seq, {.balance = {1, 2}}), ts::out_of_memory_error);
  ts::memory::set_limit(cpu1, ts::memory::no_limit);
  const auto after = weights();
  for (std::size_t i = 0; i < before.size(); ++i) {
    INFO("tensor " << i);
    CHECK(after[i].device() == ts::Device{ts::DeviceType::cpu, 0});
    CHECK(after[i].storage().is_same(before[i].storage()));  // the very tensors, not copies
  }
  par::Pipeline pipe(seq, {.balance = {1, 2}});  // with room, it moves
  CHECK(seq.get<1>().weight().value().device() == cpu1);
}

}  // namespace pipeline_threads_test
