// ts::tools::Profile on a GPU (tessera/tools/profile.hpp): a CUDA program's nodes are timed by
// events on the device's stream (one call per node and step, as on the CPU), a range around a
// copy of known size takes at least the time the GPU's bandwidth allows, the nodes inside a step
// range add up to no more than the step, and with Options::cuda_graph the replays are timed as
// "cuda_graph" launches while the ranges begun inside the capture are counted as not timed.
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "profile_support.hpp"
#include "tessera/tessera.hpp"
#include "tessera/tools/profile.hpp"

namespace cuda_profile_test {  // one namespace per file: a unity build

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;

namespace {

using tessera_test::calls;
using tessera_test::find;

}  // namespace

TEST_CASE("cuda profile: nodes timed on the device, inside a step range", "[cuda][profile]") {
  const ts::Device gpu{ts::DeviceType::cuda, 0};
  ts::manual_seed(5);
  nn::Linear<float, ts::cuda> first(256, 512, false, 0), second(512, 64, false, 0);
  auto program = ag::compile(
      [&](ag::Var<float, ts::cuda> x) { return ts::sum(second.forward(first.forward(x))); },
      ag::input<float, ts::cuda>({1024, 256}, 0));
  std::vector<nn::ParameterRef> parameters = first.parameters();
  for (const auto& p : second.parameters()) parameters.push_back(p);
  ts::optim::SGD sgd(parameters, {.lr = 0.01});
  const auto x = ts::randn<float, ts::cuda>({1024, 256}, 0);
  auto step = [&] {
    sgd.zero_grad();
    (void)program.forward(x);
    program.backward();
    sgd.step();
  };
  step();
  ts::tools::Profile profile;
  constexpr int steps = 3;
  {
    auto recording = profile.record();
    for (int i = 0; i < steps; ++i) {
      const ts::profiler::range whole("step", gpu);
      step();
    }
  }
  const auto rows = profile.rows();
  INFO(profile.table());
  CHECK(calls(rows, "step", "") == steps);
  CHECK(calls(rows, "matmul", "forward") == 2 * steps);
  CHECK(calls(rows, "matmul", "backward") == 2 * steps);
  CHECK(calls(rows, "sum", "forward") == steps);
  CHECK(calls(rows, "SGD", "step") == steps);
  const auto* whole = find(rows, "step", "");
  REQUIRE(whole != nullptr);
  CHECK(whole->share == 1.0);
  double inside = 0;
  for (const auto& row : rows) {
    CAPTURE(row.name, row.phase);
    CHECK(row.device == gpu);
    CHECK(row.device_ms >= 0);
    if (row.name != "step") inside += row.device_ms;
  }
  // The nodes and the optimiser's step lie within the step ranges on the same stream.
  CHECK(inside <= whole->device_ms * 1.0001 + 1e-3);
  // A 1024 x 256 x 512 product is 268 MFLOP: some microseconds at least.
  const auto* product = find(rows, "matmul", "forward");
  REQUIRE(product != nullptr);
  CHECK(product->device_ms > 0);
}

TEST_CASE("cuda profile: a copy's range takes at least its bytes over the bandwidth",
          "[cuda][profile]") {
  const ts::Device gpu{ts::DeviceType::cuda, 0};
  const std::int64_t n = std::int64_t{1} << 26;  // 256 MiB read, 256 MiB written
  const auto a = ts::ones<float, ts::cuda>({n}, 0);
  auto b = ts::empty<float, ts::cuda>({n}, 0);
  ts::tools::Profile profile;
  {
    auto recording = profile.record();
    const ts::profiler::range copy("copy", gpu);
    b = a * 2.0f;
  }
  const auto rows = profile.rows();
  REQUIRE(rows.size() == 1);
  // 512 MiB moved: at least 0.1 ms at 5.5 TB/s (more than any GPU of today).
  CHECK(rows[0].device_ms > 512.0 * 1024 * 1024 / 5.5e12 * 1e3);
  CHECK(rows[0].device_ms < 5000.0);
  CHECK(b.cpu(0).to_vector()[static_cast<std::size_t>(n - 1)] == 2.0f);
}

TEST_CASE("cuda profile: graph replays are timed as cuda_graph launches", "[cuda][profile]") {
  ts::manual_seed(6);
  nn::Linear<float, ts::cuda> fc(32, 8, true, 0);
  auto program =
      ag::compile([&](ag::Var<float, ts::cuda> x) { return ts::sum(ts::relu(fc.forward(x))); },
                  ag::input<float, ts::cuda>({64, 32}, 0), ag::Options{.cuda_graph = true});
  ts::optim::SGD sgd(fc.parameters(), {.lr = 0.01});
  const auto x = ts::randn<float, ts::cuda>({64, 32}, 0);
  ts::tools::Profile profile;
  constexpr int steps = 5;
  {
    auto recording = profile.record();
    for (int i = 0; i < steps; ++i) {
      sgd.zero_grad();
      (void)program.forward(x);
      program.backward();
      sgd.step();
    }
  }
  const auto rows = profile.rows();
  const std::string table = profile.table();
  INFO(table << program.cuda_graphs());
  REQUIRE(program.cuda_graphs().rfind("replaying", 0) == 0);
  // Run 1 is ordinary, run 2 captures and launches, runs 3-5 launch.
  CHECK(calls(rows, "cuda_graph", "forward") == steps - 1);
  CHECK(calls(rows, "cuda_graph", "backward") == steps - 1);
  CHECK(calls(rows, "matmul", "forward") == 1);  // the ordinary run's; the capture's not timed
  CHECK(table.find("captured into a CUDA graph: not timed") != std::string::npos);
  const auto* replay = find(rows, "cuda_graph", "forward");
  REQUIRE(replay != nullptr);
  CHECK(replay->device_ms > 0);
}

}  // namespace cuda_profile_test
