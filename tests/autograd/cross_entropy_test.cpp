// Traced cross_entropy (one autograd node): its loss and its logits' gradient against a float64
// reference computed here, with the gradient added into an existing one, with the targets a
// program input or a tensor captured as a constant, and its errors at forward.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "element_check.hpp"
#include "tessera/autograd.hpp"
#include "tessera/nn.hpp"
#include "tessera/tensor/factories.hpp"

namespace cross_entropy_test {  // one namespace per file: a unity build

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

struct reference {
  double loss = 0;
  std::vector<double> grad;  // d loss / d logits, row-major [N, C]
};

/// mean_n(-log softmax(x)[n, t_n]) and its gradient (softmax(x) - one_hot) / N, in double.
reference cross_entropy_reference(const std::vector<double>& x, const std::vector<std::int64_t>& t,
                                  std::int64_t n, std::int64_t c) {
  reference r;
  r.grad.assign(x.size(), 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    double m = -INFINITY;
    for (std::int64_t j = 0; j < c; ++j) m = std::max(m, x[static_cast<std::size_t>(i * c + j)]);
    double s = 0;
    for (std::int64_t j = 0; j < c; ++j) s += std::exp(x[static_cast<std::size_t>(i * c + j)] - m);
    const auto target = static_cast<std::size_t>(i * c + t[static_cast<std::size_t>(i)]);
    r.loss -= (x[target] - m - std::log(s)) / static_cast<double>(n);
    for (std::int64_t j = 0; j < c; ++j) {
      const auto k = static_cast<std::size_t>(i * c + j);
      r.grad[k] = (std::exp(x[k] - m) / s - (k == target ? 1.0 : 0.0)) / static_cast<double>(n);
    }
  }
  return r;
}

template <class T>
void check_close(const ts::Tensor<T>& actual, const std::vector<double>& expected, double rtol,
                 double atol) {
  const auto a = actual.contiguous();
  REQUIRE(static_cast<std::size_t>(a.numel()) == expected.size());
  tessera_test::check_each(
      expected.size(),
      [&](std::size_t i) {
        return std::abs(static_cast<double>(a.data()[i]) - expected[i]) <=
               atol + rtol * std::abs(expected[i]);
      },
      [&](std::ostream& out, std::size_t i) {
        out << static_cast<double>(a.data()[i]) << " vs " << expected[i];
      });
}

TEMPLATE_TEST_CASE("traced cross_entropy matches a float64 reference", "[autograd][loss]", float,
                   double) {
  using T = TestType;
  const double rtol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  const std::int64_t n = 7, c = 5;
  std::mt19937 rng(11);
  std::normal_distribution<double> normal(0.0, 3.0);
  std::vector<T> values(static_cast<std::size_t>(n * c));
  for (auto& v : values) v = static_cast<T>(normal(rng));
  values[3] = static_cast<T>(80);  // a large logit: log_softmax must subtract the row's maximum
  std::vector<double> x64(values.begin(), values.end());
  const std::vector<std::int64_t> labels{0, 4, 2, 2, 1, 3, 0};
  const auto logits = ts::from_vector<T>(values, {n, c});
  const auto targets = ts::from_vector<std::int64_t>(labels, {n});
  const reference expected = cross_entropy_reference(x64, labels, n, c);

  const ag::input_spec<T> logits_spec{{n, c}, 0, true};  // backward computes its gradient

  SECTION("targets as an input, logits an expression; input gradients are overwritten") {
    auto program = ag::compile(
        [](ag::Var<T> x, ag::Var<std::int64_t> y) { return nn::cross_entropy(x * 1.0, y); },
        logits_spec, ag::input<std::int64_t>({n}));
    for (int run = 0; run < 2; ++run) {
      check_close(program.forward(logits, targets).clone(), {expected.loss}, rtol, 1e-12);
      program.backward();
      check_close(program.input_grad(0).template as<T>(), expected.grad, rtol, 1e-12);
    }
  }
  SECTION("a parameter's gradient accumulates over two backward passes") {
    auto weights = std::make_shared<ag::parameter_slot<T, ts::cpu>>();
    weights->value = ts::from_vector<T>(values, {n, c});
    auto program = ag::compile(
        [&](ag::Var<std::int64_t> y) {
          // A parameter of the targets' graph (the Var only names the graph).
          return nn::cross_entropy(ag::parameter(weights, y), y);
        },
        ag::input<std::int64_t>({n}));
    check_close(program.forward(targets).clone(), {expected.loss}, rtol, 1e-12);
    program.backward();
    program.forward(targets);
    program.backward();
    std::vector<double> twice = expected.grad;
    for (double& v : twice) v *= 2;
    check_close(weights->grad, twice, rtol, 1e-12);
  }
  SECTION("targets captured as a constant tensor") {
    auto program =
        ag::compile([&](ag::Var<T> x) { return nn::cross_entropy(x, targets); }, logits_spec);
    check_close(program.forward(logits).clone(), {expected.loss}, rtol, 1e-12);
    program.backward();
    check_close(program.input_grad(0).template as<T>(), expected.grad, rtol, 1e-12);
  }
}

TEST_CASE("traced cross_entropy checks its targets at every forward", "[autograd][loss]") {
  auto program =
      ag::compile([](ag::Var<float> x, ag::Var<std::int64_t> y) { return nn::cross_entropy(x, y); },
                  ag::input_spec<float>{{3, 4}, 0, true}, ag::input<std::int64_t>({3}));
  const auto logits = ts::zeros<float>({3, 4});
  // Uniform logits: every row's loss is log 4.
  CHECK(program.forward(logits, ts::from_vector<std::int64_t>({0, 1, 3}, {3})).item() ==
        Approx(std::log(4.0)).epsilon(1e-6));
  CHECK_THROWS_WITH(program.forward(logits, ts::from_vector<std::int64_t>({0, 4, 1}, {3})),
                    Catch::Contains("target 4 is out of range for 4 classes"));
  CHECK_THROWS_WITH(program.forward(logits, ts::from_vector<std::int64_t>({-1, 0, 1}, {3})),
                    Catch::Contains("target -1"));
  CHECK_THROWS_WITH(
      ag::compile(
          [](ag::Var<float> x) { return nn::cross_entropy(x, ts::zeros<std::int64_t>({2})); },
          ag::input<float>({3, 4})),
      Catch::Contains("expected logits [N, C] and targets [N]"));
}

}  // namespace cross_entropy_test
