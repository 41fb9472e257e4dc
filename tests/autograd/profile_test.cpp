// ts::tools::Profile over compiled programs on the CPU (tessera/tools/profile.hpp): each node's
// forward and backward and each optimiser step is one call of its row, as many per step as the
// program has such nodes; a range's time is the time it took (a sleep of known length); nested
// ranges and recording scopes; nothing is recorded outside a scope; a node that throws still
// ends its range. CUDA ranges (events on the device's stream): tests/cuda/profile_test.cu.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "profile_support.hpp"
#include "tessera/tessera.hpp"
#include "tessera/tools/profile.hpp"

namespace profile_test {  // one namespace per test file: unity builds

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;

namespace {

using tessera_test::calls;
using tessera_test::find;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

}  // namespace

TEST_CASE("profile: a program's nodes, once per step each, and the optimiser's step", "[profile]") {
  // Two products and a sum: forward matmul twice and sum once a step; backward the same nodes.
  ts::manual_seed(1);
  nn::Linear<float> first(6, 5, false), second(5, 3, false);
  auto program =
      ag::compile([&](ag::Var<float> x) { return ts::sum(second.forward(first.forward(x))); },
                  ag::input<float>({4, 6}));
  std::vector<nn::ParameterRef> parameters = first.parameters();
  for (const auto& p : second.parameters()) parameters.push_back(p);
  ts::optim::SGD sgd(parameters, {.lr = 0.01});
  const auto x = ts::randn<float>({4, 6});
  auto step = [&] {
    sgd.zero_grad();
    (void)program.forward(x);
    program.backward();
    sgd.step();
  };
  step();  // outside any recording: not counted

  ts::tools::Profile profile;
  constexpr int steps = 3;
  {
    auto recording = profile.record();
    for (int i = 0; i < steps; ++i) step();
  }
  step();  // the scope has ended
  const auto rows = profile.rows();
  INFO(profile.table());
  CHECK(calls(rows, "matmul", "forward") == 2 * steps);
  CHECK(calls(rows, "matmul", "backward") == 2 * steps);
  CHECK(calls(rows, "sum", "forward") == steps);
  CHECK(calls(rows, "sum", "backward") == steps);
  CHECK(calls(rows, "SGD", "step") == steps);
  for (const auto& row : rows) {
    CAPTURE(row.name, row.phase);
    CHECK(row.device == ts::Device{});
    CHECK(row.host_ms >= 0);
    CHECK(row.device_ms == row.host_ms);  // the CPU's work is synchronous
    CHECK(row.share > 0);
    CHECK(row.share <= 1.0);
  }
  // Largest device time first.
  for (std::size_t i = 1; i < rows.size(); ++i) CHECK(rows[i - 1].device_ms >= rows[i].device_ms);
  // Without a range of the user's around them, the nodes and the step are the outermost ranges:
  // their shares add up to one.
  double shares = 0;
  for (const auto& row : rows) shares += row.share;
  CHECK(shares == Approx(1.0).epsilon(1e-9));
  const std::string table = profile.table();
  CHECK(table.find("matmul") != std::string::npos);
  CHECK(table.find("outermost ranges on cpu:0") != std::string::npos);
}

TEST_CASE("profile: a range's time is the time it takes; nested ranges and shares", "[profile]") {
  ts::tools::Profile profile;
  {
    auto recording = profile.record();
    for (int i = 0; i < 2; ++i) {
      const ts::profiler::range outer("step");
      sleep_ms(5);
      {
        const ts::profiler::range inner("load", "data", ts::Device{});
        sleep_ms(20);
      }
    }
  }
  const auto rows = profile.rows();
  INFO(profile.table());
  REQUIRE(rows.size() == 2);
  const auto* step = find(rows, "step", "");
  const auto* load = find(rows, "load", "data");
  REQUIRE(step != nullptr);
  REQUIRE(load != nullptr);
  CHECK(step->calls == 2);
  CHECK(load->calls == 2);
  // Sleeps are at least as long as asked; the bound above is loose for a loaded machine.
  CHECK(load->host_ms >= 40.0);
  CHECK(load->host_ms < 40.0 + 2000.0);
  CHECK(step->host_ms >= load->host_ms + 10.0);
  CHECK(step->share == 1.0);  // the only outermost range
  CHECK(load->share == Approx(load->host_ms / step->host_ms));
  CHECK(load->share < 1.0);

  // reset() forgets; recording goes on afterwards.
  profile.reset();
  CHECK(profile.rows().empty());
  {
    auto recording = profile.record();
    const ts::profiler::range again("again");
  }
  const auto after = profile.rows();
  REQUIRE(after.size() == 1);
  CHECK(after[0].name == "again");
  CHECK(after[0].calls == 1);
}

TEST_CASE("profile: recording scopes nest; nothing is recorded outside them", "[profile]") {
  ts::tools::Profile outer, inner;
  { const ts::profiler::range before("before"); }
  CHECK(ts::profiler::active_recorder() == nullptr);
  {
    auto a = outer.record();
    { const ts::profiler::range one("one"); }
    {
      auto b = inner.record();  // takes over until it ends
      { const ts::profiler::range two("two"); }
    }
    { const ts::profiler::range three("three"); }
  }
  CHECK(ts::profiler::active_recorder() == nullptr);
  { const ts::profiler::range after("after"); }
  const auto o = outer.rows();
  const auto i = inner.rows();
  CHECK(calls(o, "one", "") == 1);
  CHECK(calls(o, "three", "") == 1);
  CHECK(calls(o, "two", "") == 0);
  CHECK(calls(i, "two", "") == 1);
  CHECK(o.size() == 2);
  CHECK(i.size() == 1);
}

TEST_CASE("profile: a node that throws still ends its range", "[profile]") {
  ts::manual_seed(2);
  nn::Linear<float> fc(4, 3);
  auto program =
      ag::compile([&](ag::Var<float> x,
                      ag::Var<std::int64_t> y) { return nn::cross_entropy(fc.forward(x), y); },
                  ag::input<float>({2, 4}), ag::input<std::int64_t>({2}));
  const auto x = ts::randn<float>({2, 4});
  const auto bad = ts::from_vector<std::int64_t>({0, 7}, {2});  // 7: not one of 3 classes
  ts::tools::Profile profile;
  {
    auto recording = profile.record();
    {
      const ts::profiler::range outer("outer");
      CHECK_THROWS_WITH(program.forward(x, bad), Catch::Contains("7"));
    }
    // Had the throwing node's range stayed open, this one would be nested in it.
    const ts::profiler::range probe("probe");
    sleep_ms(1);
  }
  const auto rows = profile.rows();
  INFO(profile.table());
  const auto* outer = find(rows, "outer", "");
  const auto* probe = find(rows, "probe", "");
  REQUIRE(outer != nullptr);
  REQUIRE(probe != nullptr);
  CHECK(outer->calls == 1);
  CHECK(probe->calls == 1);
  CHECK(outer->share + probe->share == Approx(1.0).epsilon(1e-9));
  // The node that threw was recorded (inside "outer").
  CHECK(calls(rows, "cross_entropy", "forward") == 1);
}

}  // namespace profile_test
