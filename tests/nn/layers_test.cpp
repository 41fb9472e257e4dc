// Layers and losses against PyTorch (tests/oracles/nn_torch.py, run by this test): Linear (2-D
// and 3-D inputs, with and without bias), BatchNorm1d in training (three steps: outputs and
// running statistics) and evaluation mode for [N, C] and [N, C, L], momentum None, affine off and
// no running statistics, mse_loss and cross_entropy (huge logits included), in float32 and
// float64. Dropout's statistics (mask fraction, scaling, identity in eval) and the layers' errors
// are checked against their definitions.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nn/torch_oracle.hpp"
#include "tessera/tessera.hpp"

namespace layers_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace nn = tessera::nn;

namespace {

const torch_oracle::file& oracle() {
  static const torch_oracle::file file("layers");
  return file;
}

/// float32 results are a few roundings from PyTorch's; float64 ones agree to ~1e-15.
template <class T>
constexpr double rel_tol = std::is_same_v<T, float> ? 2e-6 : 1e-13;
template <class T>
constexpr double abs_tol = std::is_same_v<T, float> ? 2e-6 : 1e-13;

template <class T>
std::string dtype_tag() {
  return std::is_same_v<T, float> ? "float32" : "float64";
}

template <class T>
void check_linear(bool bias) {
  const std::string tag = std::string(bias ? "linear." : "linear_nobias.") + dtype_tag<T>();
  INFO(tag);
  nn::Linear<T> layer(7, 3, bias);
  ts::StateDict dict{{"weight", oracle().tensor<T>(tag + ".weight")}};
  if (bias) dict.insert("bias", oracle().tensor<T>(tag + ".bias"));
  layer.load_state_dict(dict);
  ts::Tensor<T> y2 = layer(oracle().tensor<T>(tag + ".x2"));
  torch_oracle::check_close(y2, oracle().at(tag + ".y2"), rel_tol<T>, abs_tol<T>);
  ts::Tensor<T> y3 = layer(oracle().tensor<T>(tag + ".x3"));
  torch_oracle::check_close(y3, oracle().at(tag + ".y3"), rel_tol<T>, abs_tol<T>);
  // A transposed (non-contiguous) input gives the same result.
  auto xt = oracle().tensor<T>(tag + ".x2").t().contiguous().t();
  ts::Tensor<T> yt = layer(xt);
  torch_oracle::check_close(yt, oracle().at(tag + ".y2"), rel_tol<T>, abs_tol<T>);
}

struct batchnorm_case {
  const char* name;
  std::optional<double> momentum;
  bool affine;
  bool track_running_stats;
};

template <class T>
void check_batchnorm(const batchnorm_case& c) {
  const std::string tag = std::string(c.name) + "." + dtype_tag<T>();
  INFO(tag);
  nn::BatchNorm1d<T> bn(4, 1e-5, c.momentum, c.affine, c.track_running_stats);
  if (c.affine) {
    bn.weight().value().copy_(oracle().tensor<T>(tag + ".weight"));
    bn.bias().value().copy_(oracle().tensor<T>(tag + ".bias"));
  }
  bn.train();
  for (int step = 0; step < 3; ++step) {
    const std::string prefix = tag + ".train" + std::to_string(step);
    INFO("training step " << step);
    ts::Tensor<T> y = bn(oracle().tensor<T>(prefix + ".x"));
    torch_oracle::check_close(y, oracle().at(prefix + ".y"), rel_tol<T> * 4, abs_tol<T> * 4);
    if (c.track_running_stats) {
      torch_oracle::check_close(bn.running_mean().value(), oracle().at(prefix + ".running_mean"),
                                rel_tol<T>, abs_tol<T> * 4);
      torch_oracle::check_close(bn.running_var().value(), oracle().at(prefix + ".running_var"),
                                rel_tol<T> * 4, abs_tol<T> * 4);
      CHECK(bn.num_batches_tracked().value().item() ==
            static_cast<std::int64_t>(oracle().at(prefix + ".num_batches_tracked").values[0]));
    } else {
      CHECK_FALSE(bn.running_mean().defined());
    }
  }
  bn.eval();
  ts::Tensor<T> y = bn(oracle().tensor<T>(tag + ".eval.x"));
  torch_oracle::check_close(y, oracle().at(tag + ".eval.y"), rel_tol<T> * 4, abs_tol<T> * 4);
}

const batchnorm_case batchnorm_cases[] = {
    {"bn2", 0.1, true, true},
    {"bn3", 0.1, true, true},
    {"bn_cumulative", std::nullopt, true, true},
    {"bn_noaffine", 0.3, false, true},
    {"bn_nostats", 0.1, true, false},
};

}  // namespace

TEMPLATE_TEST_CASE("Linear matches torch.nn.Linear", "[layers][oracle]", float, double) {
  check_linear<TestType>(true);
  check_linear<TestType>(false);
}

TEMPLATE_TEST_CASE("BatchNorm1d matches torch.nn.BatchNorm1d in both modes", "[layers][oracle]",
                   float, double) {
  for (const auto& c : batchnorm_cases) check_batchnorm<TestType>(c);
}

TEMPLATE_TEST_CASE("mse_loss and cross_entropy match torch.nn.functional", "[loss][oracle]", float,
                   double) {
  using T = TestType;
  const std::string d = dtype_tag<T>();
  {
    const auto a = oracle().tensor<T>("mse." + d + ".a");
    const auto b = oracle().tensor<T>("mse." + d + ".b");
    torch_oracle::check_close(nn::mse_loss(a, b), oracle().at("mse." + d + ".loss"), rel_tol<T>,
                              abs_tol<T>);
    // Lazy operands fuse into the loss's one pass: mse(a * 1 + 0, b) is the same loss.
    torch_oracle::check_close(nn::mse_loss(a * 1 + 0, b), oracle().at("mse." + d + ".loss"),
                              rel_tol<T>, abs_tol<T>);
  }
  for (const std::string name : {"ce", "ce_large"}) {
    INFO(name);
    const auto logits = oracle().tensor<T>(name + "." + d + ".logits");
    const auto targets = oracle().tensor<std::int64_t>(name + "." + d + ".targets");
    const auto loss = nn::cross_entropy(logits, targets);
    CHECK(loss.dim() == 0);
    CHECK(std::isfinite(static_cast<double>(loss.item())));
    torch_oracle::check_close(loss, oracle().at(name + "." + d + ".loss"), rel_tol<T>, abs_tol<T>);
  }
}

TEST_CASE("cross_entropy and mse_loss errors", "[loss]") {
  const auto logits = ts::randn<float>({3, 4});
  const auto bad = ts::from_vector<std::int64_t>({0, 4, 1}, {3});
  CHECK_THROWS_WITH(nn::cross_entropy(logits, bad),
                    Catch::Contains("target 4 is out of range for 4 classes"));
  const auto negative = ts::from_vector<std::int64_t>({0, -1, 1}, {3});
  CHECK_THROWS_WITH(nn::cross_entropy(logits, negative), Catch::Contains("target -1"));
  CHECK_THROWS_AS(nn::cross_entropy(logits, ts::zeros<std::int64_t>({2})), ts::shape_error);
  CHECK_THROWS_AS(nn::cross_entropy(ts::randn<float>({3}), ts::zeros<std::int64_t>({3})),
                  ts::shape_error);
  CHECK_THROWS_WITH(nn::mse_loss(ts::zeros<float>({2, 3}), ts::zeros<float>({3})),
                    Catch::Contains("[2, 3]") && Catch::Contains("[3]"));
  // An empty batch gives NaN, as in PyTorch.
  CHECK(
      std::isnan(nn::cross_entropy(ts::zeros<float>({0, 4}), ts::zeros<std::int64_t>({0})).item()));
  // The hand-computed case: uniform logits give log(C).
  CHECK(nn::cross_entropy(ts::zeros<double>({2, 5}), ts::from_vector<std::int64_t>({1, 3}, {2}))
            .item() == Approx(std::log(5.0)).epsilon(1e-15));
}

TEST_CASE("layer errors name the shapes", "[layers]") {
  nn::Linear<float> lin(3, 2);
  CHECK_THROWS_WITH(lin(ts::zeros<float>({4, 5})),
                    Catch::Contains("Linear: expected an input of shape [N, 3]") &&
                        Catch::Contains("got [4, 5]"));
  CHECK_THROWS_AS(lin(ts::zeros<float>({3})), ts::shape_error);
  CHECK_THROWS_AS(nn::Linear<float>(-1, 2), std::invalid_argument);

  nn::BatchNorm1d<float> bn(3);
  CHECK_THROWS_WITH(bn(ts::zeros<float>({4, 5})),
                    Catch::Contains("[N, 3]") && Catch::Contains("got [4, 5]"));
  // PyTorch's check: one value per channel cannot be normalised in training; nothing changes.
  CHECK_THROWS_WITH(bn(ts::zeros<float>({1, 3})), Catch::Contains("more than 1 value per channel"));
  CHECK(bn.num_batches_tracked().value().item() == 0);
  bn.eval();
  ts::Tensor<float> single = bn(ts::ones<float>({1, 3}));  // fine in eval mode
  CHECK(single.to_vector()[0] == Approx(1.0 / std::sqrt(1.0 + 1e-5)));
  CHECK_THROWS_AS(nn::BatchNorm1d<float>(3, 1e-5, 1.5), std::invalid_argument);
}

TEST_CASE("Dropout: mask fraction, scaling, identity in eval", "[layers][dropout]") {
  ts::manual_seed(11);
  const double p = 0.3;
  nn::Dropout dropout(p);
  CHECK(dropout.p() == p);
  const auto x = ts::rand<float>({1000, 1000}) + 0.5f;  // values in [0.5, 1.5), never 0
  ts::Tensor<float> input = x;
  ts::Tensor<float> y = dropout(input);
  const auto in = input.to_vector();
  const auto out = y.to_vector();
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  std::size_t zeros = 0, wrong = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0.0f) {
      ++zeros;
    } else if (out[i] != in[i] * scale) {
      ++wrong;
    }
  }
  CHECK(wrong == 0);  // kept elements are exactly x / (1 - p) (x * (1/(1-p)) in float)
  // The dropped fraction is Binomial(n, p) / n: within 5 standard deviations of p.
  const double n = static_cast<double>(out.size());
  const double fraction = static_cast<double>(zeros) / n;
  CHECK(std::abs(fraction - p) < 5 * std::sqrt(p * (1 - p) / n));
  // The mean is preserved in expectation.
  CHECK(ts::mean(y).item() == Approx(ts::mean(input).item()).epsilon(0.01));

  // Another call draws another mask; the same seed repeats it.
  ts::Tensor<float> again = dropout(input);
  CHECK(again.to_vector() != out);
  ts::manual_seed(11);
  ts::Tensor<float> x2 = ts::rand<float>({1000, 1000}) + 0.5f;
  CHECK(dropout(x2).to_vector() == out);

  // Evaluation mode and p = 0: the input itself; p = 1: zeros.
  dropout.eval();
  ts::Tensor<float> same = dropout(input);
  CHECK(same.storage().is_same(input.storage()));
  nn::Dropout none(0.0);
  CHECK(none(input).storage().is_same(input.storage()));
  nn::Dropout all(1.0);
  CHECK(ts::max(ts::abs(all(input))).item() == 0.0f);
  // Under a parent's eval() too.
  auto seq = nn::Sequential(nn::Dropout(0.9), nn::Flatten{});
  seq.eval();
  ts::Tensor<float> through = seq(input);
  CHECK(through.to_vector() == in);

  // Double and half inputs, a lazy input.
  nn::Dropout half_drop(0.5);
  const auto h = half_drop(ts::ones<ts::half>({4096}));
  std::size_t kept = 0;
  for (auto v : h.to_vector()) {
    CHECK((static_cast<float>(v) == 0.0f || static_cast<float>(v) == 2.0f));
    kept += static_cast<float>(v) == 2.0f;
  }
  CHECK(std::abs(static_cast<double>(kept) / 4096 - 0.5) < 5 * std::sqrt(0.25 / 4096));
  const auto dd = nn::Dropout(0.25)(ts::ones<double>({8}) * 2.0);
  for (double v : dd.to_vector()) CHECK((v == 0.0 || v == 2.0 / 0.75));

  CHECK_THROWS_AS(nn::Dropout(1.5), std::invalid_argument);
  CHECK_THROWS_AS(nn::Dropout(-0.1), std::invalid_argument);
}

TEST_CASE("Flatten merges dimensions as a view", "[layers][flatten]") {
  const auto x = ts::arange<float>(0, 24).view({2, 3, 4});
  const auto y = nn::Flatten{}(x);
  CHECK(y.shape() == ts::Shape{2, 12});
  CHECK(y.storage().is_same(x.storage()));
  CHECK(nn::Flatten(0)(x).shape() == ts::Shape{24});
  CHECK(nn::Flatten(0, 1)(x).shape() == ts::Shape{6, 4});
  CHECK(nn::Flatten(-2)(x).shape() == ts::Shape{2, 12});
  // A transposed input needs a copy; the values follow row-major order as PyTorch's.
  const auto t = nn::Flatten{}(x.transpose(1, 2));
  CHECK(t.shape() == ts::Shape{2, 12});
  CHECK(t.to_vector()[1] == 4.0f);
  CHECK_THROWS_AS(nn::Flatten(2, 1)(x), ts::shape_error);
  CHECK_THROWS_AS(nn::Flatten(5)(x), ts::shape_error);
}

TEST_CASE("a small model trains: the loss falls with SGD on eager tensors", "[layers]") {
  // Without autograd yet the gradient of a linear model under mse is written out by hand:
  // d/dW mean((xW^T + b - t)^2) = 2/(N*O) (y - t)^T x.
  ts::manual_seed(3);
  nn::Linear<double> model(4, 2);
  const auto x = ts::randn<double>({64, 4});
  const auto true_w = ts::randn<double>({2, 4});
  ts::Tensor<double> target = ts::matmul(x, true_w.t()) + 0.5;
  ts::optim::SGD optimiser(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    ts::Tensor<double> y = model(x);
    last = nn::mse_loss(y, target).item();
    if (step == 0) first = last;
    ts::Tensor<double> residual = (y - target) * (2.0 / (64 * 2));
    model.weight().grad() = ts::matmul(residual.t().contiguous(), x);
    model.bias().grad() = ts::sum(residual, 0);
    optimiser.step();
  }
  CHECK(last < first * 1e-3);
}

}  // namespace layers_test
