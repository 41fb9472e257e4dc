// Optimisers and schedulers under failures and hostile state (issue 46): a step that fails (a bad
// gradient, out of memory) changes no parameter and no state, and GradScaler's unscaling out of
// memory no gradient; a loaded step count or epoch that is not a whole number in range is refused
// with nothing loaded; CosineAnnealingLR with a T_max near 2^63 (its period 2 * T_max
// overflowed) gives PyTorch's closed form.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

#include "tessera/tessera.hpp"

namespace optim_failure_test {  // one namespace per test file: unity builds compile several

namespace ts = tessera;
namespace nn = tessera::nn;
namespace optim = tessera::optim;
using Catch::Contains;

struct three {
  nn::Parameter<float> a{ts::from_vector<float>({1, 2, 3, 4}, {4})};
  nn::Parameter<float> b{ts::from_vector<float>({5, 6}, {2})};
  nn::Parameter<float> c{ts::from_vector<float>({7, 8, 9}, {3})};
  std::vector<nn::ParameterRef> refs() { return {a, b, c}; }
  void set_grads() {
    a.grad() = ts::full<float>({4}, 0.5f);
    b.grad() = ts::full<float>({2}, 0.25f);
    c.grad() = ts::full<float>({3}, -1.0f);
  }
  std::vector<std::vector<float>> values() const {
    return {a.value().to_vector(), b.value().to_vector(), c.value().to_vector()};
  }
};

TEST_CASE("a step with a wrong-shaped gradient updates no parameter and makes no state",
          "[optim][failure]") {
  three p;
  p.set_grads();
  p.b.grad() = ts::zeros<float>({5});  // the second parameter's gradient: wrong shape
  const auto before = p.values();
  optim::Adam adam(p.refs(), {.lr = 0.1});
  CHECK_THROWS_WITH(adam.step(), Contains("parameter 1 has shape [2] but its gradient [5]"));
  CHECK(p.values() == before);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK_FALSE(adam.exp_avg(i).defined());
    CHECK(adam.step_count(i) == 0);
  }
  optim::SGD sgd(p.refs(), {.lr = 0.1, .momentum = 0.9});
  CHECK_THROWS_AS(sgd.step(), ts::shape_error);
  CHECK(p.values() == before);
  for (std::size_t i = 0; i < 3; ++i) CHECK_FALSE(sgd.momentum_buffer(i).defined());
  // Mended, the step runs; the first parameter's update is PyTorch's first Adam step:
  // p - lr * sign(g) (m / sqrt(v) = g / |g| at step 1, bias-corrected).
  p.b.grad() = ts::full<float>({2}, 0.25f);
  adam.step();
  const auto a = p.a.value().to_vector();
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i] == Approx(static_cast<double>(i) + 1 - 0.1).epsilon(1e-6));
  }
  CHECK(adam.step_count(0) == 1);
}

TEST_CASE("Adam's and SGD's first step out of memory changes no parameter and makes no state",
          "[optim][failure][memory]") {
  const ts::Device cpu1 = ts::Device::parse("cpu:1");
  // Three parameters of 12 MiB on cpu:1: each buffer takes a segment of its own (the pool's
  // requests of 10 MiB and more), so a limit can let the first buffers be made and refuse one.
  const std::int64_t n = 3 << 20;
  nn::Parameter<float> a{ts::full<float>({n}, 1.0f, 1)}, b{ts::full<float>({n}, 2.0f, 1)},
      c{ts::full<float>({n}, 3.0f, 1)};
  for (auto* q : {&a, &b, &c}) q->grad() = ts::full<float>({n}, 0.5f, 1);
  const std::vector<nn::ParameterRef> refs{a, b, c};
  auto sums = [&] {
    return std::vector<double>{ts::sum(a.value()).item(), ts::sum(b.value()).item(),
                               ts::sum(c.value()).item()};
  };
  const auto before = sums();
  for (const bool use_adam : {true, false}) {
    CAPTURE(use_adam);
    int failures = 0, partial = 0;
    auto attempt = [&](auto& opt) {
      for (std::size_t limit = 0; limit <= (std::size_t{96} << 20); limit += std::size_t{4} << 20) {
        ts::memory::empty_cache(cpu1);
        ts::memory::set_limit(cpu1, ts::memory::allocated(cpu1) + limit);
        bool failed = false;
        try {
          opt.step();
        } catch (const ts::out_of_memory_error&) {
          failed = true;
        }
        ts::memory::set_limit(cpu1, ts::memory::no_limit);
        if (!failed) return;
        ++failures;
        if (limit >= (std::size_t{12} << 20)) ++partial;  // a buffer fitted, a later one did not
        CHECK(sums() == before);
        const ts::StateDict state = opt.state_dict();
        for (int i = 0; i < 3; ++i) {
          CHECK_FALSE(state.contains("state." + std::to_string(i) + ".exp_avg"));
          CHECK_FALSE(state.contains("state." + std::to_string(i) + ".momentum_buffer"));
        }
      }
    };
    if (use_adam) {
      optim::Adam adam(refs, {.lr = 0.1});
      attempt(adam);
    } else {
      optim::SGD sgd(refs, {.lr = 0.1, .momentum = 0.9});
      attempt(sgd);
    }
    CHECK(partial > 0);
    // The step that fitted moved every element by lr * 0.5 (SGD) or about lr (Adam's first).
    const double moved = use_adam ? 0.1 : 0.05;
    const auto after = sums();
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(after[i] == Approx(before[i] - moved * static_cast<double>(n)).epsilon(1e-5));
    }
    a.value().fill_(1.0f);
    b.value().fill_(2.0f);
    c.value().fill_(3.0f);
  }
}

TEST_CASE("GradScaler's unscale_ out of memory leaves every gradient as it was",
          "[optim][failure][memory][amp]") {
  // Three gradients on cpu:1 that are strided views (every other element of [n, 2]): unscaling
  // makes a contiguous copy of each (12 MiB: a segment of its own), so a limit can let the first
  // copies be made and refuse a later one. Nothing may be unscaled then, not even the first.
  const ts::Device cpu1 = ts::Device::parse("cpu:1");
  const std::int64_t n = 3 << 20;
  nn::Parameter<float> a{ts::zeros<float>({n}, 1)}, b{ts::zeros<float>({n}, 1)},
      c{ts::zeros<float>({n}, 1)};
  for (auto* q : {&a, &b, &c}) q->grad() = ts::full<float>({n, 2}, 8.0f, 1).select(1, 0);
  optim::SGD sgd({a, b, c}, {.lr = 0.1});
  auto sums = [&] {
    return std::vector<double>{ts::sum(a.grad()).item(), ts::sum(b.grad()).item(),
                               ts::sum(c.grad()).item()};
  };
  const std::vector<double> before(3, 8.0 * static_cast<double>(n));
  REQUIRE(sums() == before);
  int partial = 0;
  bool fitted = false;
  for (std::size_t limit = 0; limit <= (std::size_t{96} << 20); limit += std::size_t{4} << 20) {
    optim::GradScaler scaler({.init_scale = 4.0});
    ts::memory::empty_cache(cpu1);
    ts::memory::set_limit(cpu1, ts::memory::allocated(cpu1) + limit);
    bool failed = false;
    try {
      scaler.unscale_(sgd);
    } catch (const ts::out_of_memory_error&) {
      failed = true;
    }
    ts::memory::set_limit(cpu1, ts::memory::no_limit);
    if (!failed) {
      fitted = true;
      break;
    }
    if (limit >= (std::size_t{12} << 20)) ++partial;  // a copy fitted, a later one did not
    CHECK(sums() == before);
  }
  CHECK(partial > 0);
  REQUIRE(fitted);
  // The unscale that fitted divided every gradient by the scale, in place through the views.
  CHECK(sums() == std::vector<double>(3, 2.0 * static_cast<double>(n)));
}

TEST_CASE("a loaded step count that is not a whole number in range is refused, nothing loaded",
          "[optim][failure][state]") {
  three p;
  p.set_grads();
  optim::Adam adam(p.refs(), {.lr = 0.1});
  adam.step();
  const ts::StateDict good = adam.state_dict();
  for (const double bad : {-1.0, std::nan(""), 1e30, 2.5, std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    ts::StateDict state = good;
    state.insert("state.1.step", ts::from_vector<double>({bad}, ts::Shape{}));
    CHECK_THROWS_WITH(adam.load_state_dict(state),
                      Contains("state.1.step") && Contains("not a whole number of steps"));
    CHECK(adam.step_count(1) == 1);
  }
  ts::StateDict later = good;
  later.insert("state.1.step", ts::from_vector<double>({41}, ts::Shape{}));
  adam.load_state_dict(later);
  CHECK(adam.step_count(1) == 41);
}

TEST_CASE("a scheduler's loaded epoch that is not a whole number in range is refused",
          "[optim][failure][schedulers]") {
  three p;
  optim::SGD sgd(p.refs(), {.lr = 0.1});
  optim::StepLR schedule(sgd, 2, 0.5);
  schedule.step();
  const ts::StateDict good = schedule.state_dict();
  for (const double bad : {-2.0, std::nan(""), 1e30, 0.5}) {
    CAPTURE(bad);
    ts::StateDict state = good;
    state.insert("last_epoch", ts::from_vector<double>({bad}, ts::Shape{}));
    CHECK_THROWS_WITH(schedule.load_state_dict(state),
                      Contains("last_epoch") && Contains("not a whole number of steps"));
    CHECK(schedule.last_epoch() == 1);
  }
}

TEST_CASE("CosineAnnealingLR with T_max near 2^63 follows PyTorch's closed form",
          "[optim][failure][schedulers]") {
  three p;
  optim::SGD sgd(p.refs(), {.lr = 0.1});
  const std::int64_t t_max = std::numeric_limits<std::int64_t>::max();
  optim::CosineAnnealingLR schedule(sgd, t_max, 0.001);
  for (int epoch = 1; epoch <= 5; ++epoch) {
    schedule.step();
    // eta_min + (base - eta_min) (1 + cos(pi epoch / T_max)) / 2: the rate barely moves.
    const double expected =
        0.001 + (0.1 - 0.001) *
                    (1 + std::cos(std::numbers::pi * epoch / static_cast<double>(t_max))) / 2;
    CHECK(sgd.options().lr == Approx(expected).epsilon(1e-12));
  }
  // And the restart rule at a small T_max still matches PyTorch's recurrence: after T_max steps
  // the rate is eta_min, after 2 T_max it is back at the base rate.
  optim::SGD small(p.refs(), {.lr = 0.1});
  optim::CosineAnnealingLR cosine(small, 3, 0.0);
  for (int i = 0; i < 3; ++i) cosine.step();
  CHECK(small.options().lr == Approx(0.0).margin(1e-12));
  for (int i = 0; i < 3; ++i) cosine.step();
  CHECK(small.options().lr == Approx(0.1).epsilon(1e-9));
}

}  // namespace optim_failure_test
