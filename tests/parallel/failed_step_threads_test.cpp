// A training step of DataParallel or of a Pipeline that fails leaves every object as it was
// (issue 46, section 4): a device's or a micro-batch's failure (a gradient hook that throws, out
// of memory, a label out of range) must not leave the other devices' or micro-batches' gradients
// in the module, move BatchNorm's running statistics or the random generators, and the next
// step gives the numbers of a twin trained without the failed attempt (float64, exact: the same
// operations in the same order). On virtual CPU devices (TESSERA_CPU_DEVICES=4 for this folder);
// labelled `threads`, so the TSan build runs it.
#include <catch2/catch.hpp>

#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "element_check.hpp"
#include "parallel/training_data.hpp"
#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace failed_step_threads_test {

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace par = tessera::parallel;

using Catch::Contains;
using training_data::inputs_of;
using training_data::labels_of;

auto make_mlp() {
  return nn::Sequential(nn::Linear<double>(6, 16), nn::ReLU{}, nn::Linear<double>(16, 8),
                        nn::Tanh{}, nn::Linear<double>(8, 3));
}

auto make_net() {  // BatchNorm's statistics and Dropout's draws: what a forward moves
  return nn::Sequential(nn::Linear<double>(6, 16), nn::BatchNorm1d<double>(16), nn::ReLU{},
                        nn::Dropout(0.25), nn::Linear<double>(16, 8), nn::Tanh{},
                        nn::Linear<double>(8, 3));
}

auto loss_of = [](auto& model, ag::Var<double> in, ag::Var<std::int64_t> labels) {
  return nn::cross_entropy(model(in), labels);
};

// Every parameter's value and gradient (reading a gradient writes the zeros zero_grad left
// unwritten; "none" is an empty list), then every buffer's value, as float64.
std::vector<std::vector<double>> state_of(const nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (const auto& p : m.parameters()) {
    out.push_back(p.value().as<double, ts::cpu>().to_vector());
    const ts::AnyTensor g = p.grad();
    out.push_back(g.defined() ? g.as<double, ts::cpu>().to_vector() : std::vector<double>{});
  }
  for (const auto& b : m.buffers()) {
    out.push_back(
        b.value().visit([](const auto& t) { return t.template to<double>().to_vector(); }));
  }
  return out;
}

// The same values, element for element (one assertion per tensor).
void check_same(const std::vector<std::vector<double>>& got,
                const std::vector<std::vector<double>>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t t = 0; t < got.size(); ++t) {
    INFO("tensor " << t << " (parameters' values and gradients, then buffers)");
    REQUIRE(got[t].size() == want[t].size());
    tessera_test::check_each(
        got[t].size(), [&](std::size_t i) { return got[t][i] == want[t][i]; },
        [&](std::ostream& os, std::size_t i) { os << got[t][i] << ", expected " << want[t][i]; });
  }
}

// Whether each parameter has a gradient (read without writing zeros).
std::vector<bool> has_grad(const nn::Module& m) {
  std::vector<bool> out;
  for (const auto& p : m.parameters()) {
    out.push_back(p.as<double, ts::cpu>().slot()->grad.defined());
  }
  return out;
}

std::vector<ts::philox_state> generators(int devices) {
  std::vector<ts::philox_state> out;
  for (int d = 0; d < devices; ++d) {
    out.push_back(ts::default_generator(ts::Device{ts::DeviceType::cpu, d}).state());
  }
  return out;
}

struct injected_failure : std::runtime_error {
  injected_failure() : std::runtime_error("injected failure") {}
};

TEST_CASE("a compiled DataParallel backward that throws on one device changes no gradient",
          "[parallel][dp][failure]") {
  const std::int64_t batch = 7;
  const std::vector<int> ids{0, 1, 2};
  const auto x = inputs_of<double>(batch, 6, 3);
  const auto y = labels_of(batch, 4);
  for (const bool accumulate : {false, true}) {
    for (int failing : {0, 1, 2}) {
      for (int call : {1, 3}) {
        INFO((accumulate ? "accumulated gradients" : "zero_grad before each step")
             << ", device " << failing << " throws at its gradient hook's call " << call);
        // The twin: two good steps.
        ts::manual_seed(21);
        auto twin = nn::to<ts::cpu>(make_mlp(), 0);
        par::DataParallel twin_dp(twin, ids);
        auto twin_step = twin_dp.compile(loss_of, ag::input<double>({batch, 6}),
                                         ag::input<std::int64_t>({batch}));
        ts::optim::SGD twin_opt(twin.parameters(), {.lr = 0.1, .momentum = 0.9});
        std::vector<std::vector<std::vector<double>>> want;
        for (int step = 0; step < 2; ++step) {
          if (!accumulate) twin_opt.zero_grad();
          (void)twin_step.forward(x, y);
          twin_step.backward();
          twin_opt.step();
          want.push_back(state_of(twin));
        }

        ts::manual_seed(21);
        auto model = nn::to<ts::cpu>(make_mlp(), 0);
        par::DataParallel dp(model, ids);
        auto dp_step =
            dp.compile(loss_of, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
        ts::optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
        bool armed = false;
        int calls = 0;
        // A hook that checks each gradient (as one that refuses NaN would) throws on one device
        // once that device has written some of its gradients.
        dp_step.program(failing).on_gradient_ready([&](const ag::GradientReady&) {
          if (armed && ++calls == call) throw injected_failure();
        });
        if (!accumulate) opt.zero_grad();
        (void)dp_step.forward(x, y);
        dp_step.backward();
        opt.step();
        const auto after_first = state_of(model);
        check_same(after_first, want[0]);

        if (!accumulate) opt.zero_grad();  // unwritten zeros: the common case
        (void)dp_step.forward(x, y);
        armed = true;
        CHECK_THROWS_AS(dp_step.backward(), injected_failure);
        armed = false;
        // The gradients as they were: zeros after zero_grad, the first step's when accumulated.
        auto expected = after_first;
        if (!accumulate) {
          for (std::size_t k = 1; k < expected.size(); k += 2) {
            expected[k].assign(expected[k].size(), 0.0);
          }
        }
        check_same(state_of(model), expected);
        // A backward without a forward that succeeded since is refused, changing nothing.
        CHECK_THROWS_WITH(dp_step.backward(), Contains("needs a forward that succeeded first"));
        // The step again, as the twin's second.
        if (!accumulate) opt.zero_grad();
        (void)dp_step.forward(x, y);
        dp_step.backward();
        opt.step();
        check_same(state_of(model), want[1]);
      }
    }
  }
}

TEST_CASE("a compiled DataParallel backward out of memory on one device leaves no gradient",
          "[parallel][dp][failure][memory]") {
  // The first backward makes the gradients: the module's on cpu:0, the replicas' on their
  // devices. With a limit on cpu:1 the replica's cannot be made; the module's, made by device
  // 0 and partly written, must go again.
  const std::int64_t batch = 8;
  const std::vector<int> ids{0, 1};
  const ts::Device cpu1{ts::DeviceType::cpu, 1};
  const auto x = inputs_of<double>(batch, 6, 5);
  const auto y = labels_of(batch, 6);
  auto make_wide = [] {  // a weight gradient of 12 MB: a segment of its own in the pool
    return nn::Sequential(nn::Linear<double>(6, 250000), nn::ReLU{}, nn::Linear<double>(250000, 3));
  };
  ts::manual_seed(8);
  auto twin = nn::to<ts::cpu>(make_wide(), 0);
  par::DataParallel twin_dp(twin, ids);
  auto twin_step =
      twin_dp.compile(loss_of, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  (void)twin_step.forward(x, y);
  twin_step.backward();
  const auto want = state_of(twin);

  ts::manual_seed(8);
  auto model = nn::to<ts::cpu>(make_wide(), 0);
  par::DataParallel dp(model, ids);
  auto dp_step =
      dp.compile(loss_of, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  const auto before = state_of(model);
  int failures = 0;
  for (std::size_t limit = 0;; limit += std::size_t{1} << 20) {
    REQUIRE(limit <= (std::size_t{64} << 20));
    (void)dp_step.forward(x, y);
    ts::memory::empty_cache(cpu1);
    ts::memory::set_limit(cpu1, ts::memory::allocated(cpu1) + limit);
    bool failed = false;
    try {
      dp_step.backward();
    } catch (const ts::out_of_memory_error&) {
      failed = true;
    }
    ts::memory::set_limit(cpu1, ts::memory::no_limit);
    if (!failed) break;
    ++failures;
    CHECK(has_grad(model) == std::vector<bool>(4, false));  // none, as before
    check_same(state_of(model), before);
  }
  CHECK(failures > 0);
  check_same(state_of(model), want);  // then one backward, as the twin's
}

TEST_CASE("a compiled DataParallel forward with a bad label on one device moves nothing",
          "[parallel][dp][failure]") {
  const std::int64_t batch = 9;  // pieces 3, 3, 3: the last one's labels hold a 7
  const std::vector<int> ids{0, 1, 2};
  const auto x = inputs_of<double>(batch, 6, 7);
  const auto y = labels_of(batch, 8);
  auto bad = y.clone();
  bad.narrow(0, 7, 1).fill_(7);
  ts::manual_seed(4);
  auto twin = nn::to<ts::cpu>(make_net(), 0);
  par::DataParallel twin_dp(twin, ids);
  auto twin_step =
      twin_dp.compile(loss_of, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  ts::manual_seed(5);
  const double want_loss = twin_step.forward(x, y).item();
  twin_step.backward();
  const auto want = state_of(twin);

  ts::manual_seed(4);
  auto model = nn::to<ts::cpu>(make_net(), 0);
  par::DataParallel dp(model, ids);
  auto dp_step =
      dp.compile(loss_of, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  ts::manual_seed(5);
  const auto before = state_of(model);
  const auto drawn = generators(3);
  CHECK_THROWS_WITH(dp_step.forward(x, bad), Contains("target 7 is out of range for 3 classes"));
  // Device 0's piece ran: its BatchNorm statistics and batch count, and the Dropout draws,
  // are put back.
  check_same(state_of(model), before);
  CHECK(generators(3) == drawn);
  CHECK_THROWS_WITH(dp_step.backward(), Contains("needs a forward that succeeded first"));
  check_same(state_of(model), before);
  CHECK_THROWS_WITH(dp_step.program(3), Contains("device 3 of a program over 3 devices"));
  CHECK(dp_step.forward(x, y).item() == want_loss);
  dp_step.backward();
  check_same(state_of(model), want);
}

TEST_CASE("an eager DataParallel forward that fails puts the random generators back",
          "[parallel][dp][failure]") {
  // Pieces 2, 2, 1 of a batch of 5: BatchNorm refuses the piece of one sample on device 2
  // after devices 0 and 1 drew their Dropout masks.
  ts::manual_seed(6);
  auto model = nn::to<ts::cpu>(make_net(), 0);
  par::DataParallel dp(model, {0, 1, 2});
  const auto x = inputs_of<double>(5, 6, 9);
  const auto before = state_of(model);
  const auto drawn = generators(3);
  CHECK_THROWS_AS(dp(x), ts::error);
  check_same(state_of(model), before);
  CHECK(generators(3) == drawn);
}

TEST_CASE("a pipeline's inference whose last micro-batch fails moves no statistics",
          "[parallel][pipeline][failure]") {
  // split_size 2 of a batch of 5: micro-batches 2, 2, 1; BatchNorm (training) refuses the last.
  ts::manual_seed(9);
  auto seq = make_net();
  par::Pipeline pipe(seq, {.balance = {4, 3}, .split_size = 2});
  const auto x = inputs_of<double>(5, 6, 10);
  const auto before = state_of(seq);
  const auto drawn = generators(2);
  CHECK_THROWS_AS(pipe(x), ts::error);
  check_same(state_of(seq), before);
  CHECK(generators(2) == drawn);
}

// A pipeline of make_net over cpu:0 and cpu:1, four micro-batches of 3 (checkpointed but the
// last), trained with SGD; `failing` labels make micro-batch 2 throw on the last stage, after
// micro-batches 0 and 1 have run their forwards (and, with 1F1B, their backwards).
void check_failed_pipeline_step(par::Schedule schedule, bool accumulate) {
  const std::int64_t batch = 12;
  const auto x = inputs_of<double>(batch, 6, 11);
  const auto y = labels_of(batch, 12);
  auto bad = y.clone();
  bad.narrow(0, 7, 1).fill_(5);  // micro-batch 2 holds rows 6, 7, 8
  const par::PipelineOptions options{.balance = {4, 3}, .chunks = 4, .schedule = schedule};
  auto pipe_loss = [](auto out, auto labels) { return nn::cross_entropy(out, labels); };

  auto run_step = [&](auto& program, ts::optim::SGD& opt, const ts::Tensor<std::int64_t>& labels) {
    if (!accumulate) opt.zero_grad();
    const double loss = program.forward(x, labels).item();
    program.backward();
    opt.step();
    return loss;
  };

  ts::manual_seed(13);
  auto twin = make_net();
  par::Pipeline twin_pipe(twin, options);
  auto twin_program =
      twin_pipe.compile(pipe_loss, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  ts::optim::SGD twin_opt(twin.parameters(), {.lr = 0.1, .momentum = 0.9});
  ts::manual_seed(14);
  std::vector<double> want_loss;
  std::vector<std::vector<std::vector<double>>> want;
  for (int step = 0; step < 2; ++step) {
    want_loss.push_back(run_step(twin_program, twin_opt, y));
    want.push_back(state_of(twin));
  }

  ts::manual_seed(13);
  auto seq = make_net();
  par::Pipeline pipe(seq, options);
  auto program =
      pipe.compile(pipe_loss, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  ts::optim::SGD opt(seq.parameters(), {.lr = 0.1, .momentum = 0.9});
  ts::manual_seed(14);
  CHECK(run_step(program, opt, y) == want_loss[0]);
  const auto after_first = state_of(seq);
  check_same(after_first, want[0]);

  if (!accumulate) opt.zero_grad();
  const auto drawn = generators(2);
  CHECK_THROWS_WITH(
      [&] {
        (void)program.forward(x, bad);
        program.backward();
      }(),
      Contains("target 5 is out of range for 3 classes"));
  auto expected = after_first;
  if (!accumulate) {
    for (std::size_t k = 1; k < 2 * seq.parameters().size(); k += 2) {
      expected[k].assign(expected[k].size(), 0.0);
    }
  }
  check_same(state_of(seq), expected);
  CHECK(generators(2) == drawn);
  CHECK_THROWS_WITH(program.backward(), Contains("needs a forward first"));

  CHECK(run_step(program, opt, y) == want_loss[1]);
  check_same(state_of(seq), want[1]);
}

TEST_CASE("a 1F1B pipeline step that fails in a micro-batch changes nothing",
          "[parallel][pipeline][failure]") {
  for (const bool accumulate : {false, true}) {
    INFO((accumulate ? "accumulated gradients" : "zero_grad before each step"));
    check_failed_pipeline_step(par::Schedule::one_f_one_b, accumulate);
  }
}

TEST_CASE("a GPipe forward that fails in a micro-batch changes nothing",
          "[parallel][pipeline][failure]") {
  check_failed_pipeline_step(par::Schedule::gpipe, true);
}

TEST_CASE("a GPipe backward out of memory on the first stage changes no gradient",
          "[parallel][pipeline][failure][memory]") {
  // The last stage (cpu:1) runs its micro-batches' backwards and sends their input gradients;
  // the first stage (cpu:0) cannot recompute a checkpointed micro-batch or make its gradients.
  const std::int64_t batch = 12;
  const ts::Device cpu0{ts::DeviceType::cpu, 0};
  const auto x = inputs_of<double>(batch, 6, 15);
  const auto y = labels_of(batch, 16);
  auto make_wide = [] {
    return nn::Sequential(nn::Linear<double>(6, 50000), nn::ReLU{}, nn::Linear<double>(50000, 8),
                          nn::Tanh{}, nn::Linear<double>(8, 3));
  };
  const par::PipelineOptions options{.balance = {2, 3}, .chunks = 3};
  auto pipe_loss = [](auto out, auto labels) { return nn::cross_entropy(out, labels); };
  ts::manual_seed(17);
  auto twin = make_wide();
  par::Pipeline twin_pipe(twin, options);
  auto twin_program =
      twin_pipe.compile(pipe_loss, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  (void)twin_program.forward(x, y);
  twin_program.backward();
  (void)twin_program.forward(x, y);
  twin_program.backward();  // accumulated twice
  const auto want = state_of(twin);

  ts::manual_seed(17);
  auto seq = make_wide();
  par::Pipeline pipe(seq, options);
  auto program =
      pipe.compile(pipe_loss, ag::input<double>({batch, 6}), ag::input<std::int64_t>({batch}));
  (void)program.forward(x, y);
  program.backward();
  const auto before = state_of(seq);
  int failures = 0;
  for (std::size_t limit = 0;; limit += std::size_t{1} << 20) {
    REQUIRE(limit <= (std::size_t{64} << 20));
    (void)program.forward(x, y);
    ts::memory::empty_cache(cpu0);
    ts::memory::set_limit(cpu0, ts::memory::allocated(cpu0) + limit);
    bool failed = false;
    try {
      program.backward();
    } catch (const ts::out_of_memory_error&) {
      failed = true;
    }
    ts::memory::set_limit(cpu0, ts::memory::no_limit);
    if (!failed) break;
    ++failures;
    check_same(state_of(seq), before);
  }
  CHECK(failures > 0);
  check_same(state_of(seq), want);
}

}  // namespace failed_step_threads_test
