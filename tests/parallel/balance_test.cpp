// balance_by_time (tessera/parallel/balance.hpp): the cut of measured costs against every cut
// enumerated (the smallest slowest stage), the cut of a model whose one heavy layer outweighs
// the rest thirty times over, the model left as it was (parameters, gradients, BatchNorm's
// running statistics, the generator), and bad arguments named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <vector>

#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace balance_test {

namespace ts = tessera;
namespace nn = tessera::nn;
namespace par = tessera::parallel;

// The smallest largest stage over every cut of `costs` into `partitions` non-empty stages.
double best_by_enumeration(const std::vector<double>& costs, int partitions) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> stages;
  std::function<void(std::size_t, int, double)> cut = [&](std::size_t first, int left,
                                                          double worst) {
    if (left == 1) {
      double last = 0;
      for (std::size_t i = first; i < costs.size(); ++i) last += costs[i];
      best = std::min(best, std::max(worst, last));
      return;
    }
    double sum = 0;
    for (std::size_t end = first + 1; end + static_cast<std::size_t>(left - 1) <= costs.size();
         ++end) {
      sum += costs[end - 1];
      cut(end, left - 1, std::max(worst, sum));
    }
  };
  cut(0, partitions, 0.0);
  return best;
}

TEST_CASE("balance_costs finds the cut with the smallest slowest stage", "[parallel][balance]") {
  std::uint32_t state = 12345;  // integer costs, so that every order of summation is exact
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<double>((state >> 16) % 100 + 1);
  };
  for (int layers = 1; layers <= 9; ++layers) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<double> costs;
      for (int i = 0; i < layers; ++i) costs.push_back(next());
      for (int partitions = 1; partitions <= layers; ++partitions) {
        const std::vector<int> balance = par::detail::balance_costs(costs, partitions);
        REQUIRE(static_cast<int>(balance.size()) == partitions);
        double worst = 0;
        std::size_t layer = 0;
        for (int stage : balance) {
          REQUIRE(stage >= 1);
          double sum = 0;
          for (int i = 0; i < stage; ++i) sum += costs[layer++];
          worst = std::max(worst, sum);
        }
        REQUIRE(layer == costs.size());
        CHECK(worst == best_by_enumeration(costs, partitions));
      }
    }
  }
  // A known case: the heavy layer alone, the light ones together.
  CHECK(par::detail::balance_costs({1, 1, 10, 1, 1, 1}, 2) == std::vector<int>{3, 3});
  CHECK(par::detail::balance_costs({10, 1, 1, 1}, 2) == std::vector<int>{1, 3});
  CHECK(par::detail::balance_costs({1, 2, 3}, 3) == std::vector<int>{1, 1, 1});
  // Equal cuts: the one whose last stage starts earliest.
  CHECK(par::detail::balance_costs({1, 1, 1}, 2) == std::vector<int>{1, 2});
}

// Layer 6 (512 x 4096 on 64 samples, about 134 M multiply-adds each way, in the BLAS) outweighs
// the six before it together (about 0.6 M, and 64 x 512 elementwise) some two hundred times, so
// it stays the heaviest in the sanitizer builds too, where Tessera's own loops run unoptimised
// and the BLAS does not (at 512 x 512, the ASan -O0 build once timed the six light layers above
// it and cut {5, 2}).
auto make_model() {
  return nn::Sequential(nn::Linear<double>(16, 16), nn::BatchNorm1d<double>(16), nn::Dropout(0.5),
                        nn::ReLU{}, nn::Linear<double>(16, 512), nn::ReLU{},
                        nn::Linear<double>(512, 4096));
}

// A state dict entry's values (float64 parameters and statistics, the int64 batch count).
std::vector<double> values_of(const ts::AnyTensor& tensor) {
  return tensor.visit([](const auto& typed) {
    std::vector<double> out;
    for (auto v : typed.to_vector()) out.push_back(static_cast<double>(v));
    return out;
  });
}

TEST_CASE("balance_by_time gives the heavy layer a stage and leaves the model as it was",
          "[parallel][balance]") {
  ts::manual_seed(3);
  auto model = make_model();
  const auto sample = ts::randn<double>({64, 16}, 1);
  const ts::StateDict before = model.state_dict();
  std::vector<std::vector<double>> values;
  for (const auto& [key, value] : before) {
    values.push_back(values_of(value));
  }
  const auto generator_before = ts::default_generator(ts::Device::parse("cpu:1")).state();

  // 0.1 s: some tens of rounds, so that the medians hold on a busy machine.
  CHECK(par::balance_by_time(2, model, sample, 0.1) == std::vector<int>{6, 1});
  CHECK(par::balance_by_time(1, model, sample, 0.0) == std::vector<int>{7});
  const std::vector<int> three = par::balance_by_time(3, model, sample, 0.1);
  REQUIRE(three.size() == 3);
  CHECK(three[2] == 1);  // the heavy layer alone in the last stage
  CHECK(three[0] + three[1] == 6);

  // Nothing of the model changed: values, devices, gradients; nor the sample device's generator.
  const ts::StateDict after = model.state_dict();
  REQUIRE(after.size() == before.size());
  std::size_t k = 0;
  for (const auto& [key, value] : after) {
    CHECK(value.device() == ts::Device::parse("cpu:0"));
    CHECK(values_of(value) == values[k++]);
  }
  for (const auto& p : model.parameters()) CHECK_FALSE(p.grad().defined());
  CHECK(ts::default_generator(ts::Device::parse("cpu:1")).state() == generator_before);
}

TEST_CASE("balance_by_time names bad arguments", "[parallel][balance]") {
  auto model = make_model();
  const auto sample = ts::randn<double>({8, 16});
  CHECK_THROWS_WITH(par::balance_by_time(0, model, sample),
                    Catch::Contains("0 partitions for 7 layers"));
  CHECK_THROWS_WITH(par::balance_by_time(8, model, sample),
                    Catch::Contains("8 partitions for 7 layers"));
  CHECK_THROWS_AS(par::balance_by_time(2, model, sample, -1.0), std::invalid_argument);
  CHECK_THROWS_WITH(par::balance_by_time(2, model, ts::Tensor<double>{}),
                    Catch::Contains("undefined"));
  CHECK_THROWS_WITH(par::balance_by_time(2, model, ts::zeros<double>({})),
                    Catch::Contains("0-dim"));
  // A sample the first layer cannot take: the layer's own error.
  CHECK_THROWS_AS(par::balance_by_time(2, model, ts::zeros<double>({8, 15})), ts::shape_error);
}

}  // namespace balance_test
