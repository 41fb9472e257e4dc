// l1_loss, smooth_l1_loss, binary_cross_entropy_with_logits, and cross_entropy's and nll_loss's
// options (nn/loss.hpp) against PyTorch (tests/oracles/nn_torch.py, section "losses"): the eager
// loss, and the loss and the input's gradient from a compiled program (the traced form), in
// float64 (1e-12) and float32 (1e-5); beta = 0 is l1 (gradient included); logits of +-40 stay
// finite; cross_entropy's and nll_loss's option sets in each reduction, -inf logits, all targets
// ignored (NaN, as PyTorch); bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/torch_oracle.hpp"
#include "tessera/tessera.hpp"

namespace loss_test {

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

const torch_oracle::file& oracle() {
  static const torch_oracle::file file("losses");
  return file;
}

template <class T>
constexpr double tolerance = std::is_same_v<T, double> ? 1e-12 : 1e-5;

// The loss `name` of `input` against `target`: eager, then traced with the input's gradient.
template <class T, class Loss>
void check(const std::string& name, const ts::Tensor<T>& input, const ts::Tensor<T>& target,
           Loss loss, std::string gradient_of = "") {
  if (gradient_of.empty()) gradient_of = name;
  const std::string d = std::is_same_v<T, double> ? "float64" : "float32";
  INFO(name << " " << d);
  const auto& want = oracle().at("loss." + d + "." + name);
  torch_oracle::check_close(ts::Tensor<T>(loss(input, target)), want, tolerance<T>, tolerance<T>);
  auto program = ag::compile([&](ag::Var<T> x) { return loss(x, target); },
                             ag::input_spec<T>{input.shape(), 0, true});
  torch_oracle::check_close(program.forward(input), want, tolerance<T>, tolerance<T>);
  program.backward();
  torch_oracle::check_close(program.input_grad(0).template as<T>(),
                            oracle().at("loss." + d + "." + gradient_of + ".grad"), tolerance<T>,
                            tolerance<T>);
}

TEMPLATE_TEST_CASE("l1, smooth l1 and BCE with logits match torch.nn.functional", "[loss][oracle]",
                   float, double) {
  using T = TestType;
  const std::string d = std::is_same_v<T, double> ? "float64" : "float32";
  const auto a = oracle().tensor<T>("loss." + d + ".a");
  const auto b = oracle().tensor<T>("loss." + d + ".b");
  const auto logits = oracle().tensor<T>("loss." + d + ".logits");
  const auto soft = oracle().tensor<T>("loss." + d + ".soft");
  check<T>("l1", a, b, [](const auto& x, const auto& y) { return nn::l1_loss(x, y); });
  check<T>("smooth1", a, b,
           [](const auto& x, const auto& y) { return nn::smooth_l1_loss(x, y, 1.0); });
  check<T>("smooth05", a, b,
           [](const auto& x, const auto& y) { return nn::smooth_l1_loss(x, y, 0.5); });
  // beta = 0 is l1_loss, gradient included. Where input == target exactly (element 2 of the
  // oracle's data) torch's smooth_l1 kernel gives -1/n and its l1_loss 0; Tessera gives l1's.
  check<T>(
      "smooth0", a, b, [](const auto& x, const auto& y) { return nn::smooth_l1_loss(x, y, 0.0); },
      "l1");
  check<T>("bce", logits, soft,
           [](const auto& x, const auto& y) { return nn::binary_cross_entropy_with_logits(x, y); });
}

TEST_CASE("the new losses refuse bad input, naming it", "[loss]") {
  const auto a = ts::zeros<float>({2, 3});
  CHECK_THROWS_WITH(nn::l1_loss(a, ts::zeros<float>({3})),
                    Catch::Contains("l1_loss: the input has shape [2, 3] and the target [3]"));
  CHECK_THROWS_WITH(nn::smooth_l1_loss(a, a, -1.0), Catch::Contains("beta -1"));
  CHECK_THROWS_WITH(nn::binary_cross_entropy_with_logits(a, ts::zeros<float>({2, 2})),
                    Catch::Contains("binary_cross_entropy_with_logits"));
}

// ---- cross_entropy and nll_loss ----------------------------------------------------------------

// An option set of nn_torch.py's CE_CASES / NLL_CASES (the same names and values).
struct class_case {
  const char* name;
  const char* input;    // oracle array: "logits", "masked" (-inf logits) or "log_probs", or the
                        // [N, C, d...] "logits_nd", "logits_3d", "log_probs_nd"
  const char* targets;  // "targets" (in [0, 5)) or "ignored" (with -100s); "targets_nd", ...
  bool weighted;
  std::int64_t ignore_index;
  double label_smoothing;
  const char* v = "v";  // Reduction::none's weights, of the targets' shape
};

const class_case cross_entropy_cases[] = {
    {"plain", "logits", "targets", false, -100, 0.0},
    {"ignore", "logits", "ignored", false, -100, 0.0},
    {"weight", "logits", "targets", true, -100, 0.0},
    {"smooth", "logits", "targets", false, -100, 0.1},
    {"weight_smooth", "logits", "targets", true, -100, 0.3},
    {"all", "logits", "ignored", true, -100, 0.25},
    {"in_range", "logits", "targets", true, 2, 0.3},
    {"masked", "masked", "ignored", true, -100, 0.0},
    {"masked_smooth", "masked", "ignored", false, -100, 0.2},
    {"nd_plain", "logits_nd", "targets_nd", false, -100, 0.0, "v_nd"},
    {"nd_all", "logits_nd", "ignored_nd", true, -100, 0.25, "v_nd"},
    {"nd_3d", "logits_3d", "ignored_3d", true, -100, 0.0, "v_3d"},
    {"nd_unit", "logits_unit", "ignored_unit", true, -100, 0.1, "v_unit"},
};
const class_case nll_cases[] = {
    {"plain", "log_probs", "targets", false, -100, 0.0},
    {"weight_ignore", "log_probs", "ignored", true, -100, 0.0},
    {"in_range", "log_probs", "targets", false, 2, 0.0},
    {"nd_weight_ignore", "log_probs_nd", "ignored_nd", true, -100, 0.0, "v_nd"},
};

const char* reduction_name(nn::Reduction r) {
  return r == nn::Reduction::none ? "none" : r == nn::Reduction::sum ? "sum" : "mean";
}

// As torch_oracle::check_close, where equal infinities (a smoothed loss over a -inf logit) and
// NaNs match too.
template <class T>
void check_same(const ts::Tensor<T>& actual, const std::vector<double>& expected,
                double tolerance) {
  REQUIRE(static_cast<std::size_t>(actual.numel()) == expected.size());
  const auto values = actual.to_vector();
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double a = static_cast<double>(values[i]), e = expected[i];
    INFO("element " << i << ": tessera " << a << ", torch " << e);
    CHECK((a == e || (std::isnan(a) && std::isnan(e)) ||
           std::abs(a - e) <= tolerance * (1 + std::abs(e))));
  }
}

// cross_entropy or nll_loss (Loss) with one option set and reduction: eager, then traced with the
// targets a program input; for Reduction::none the traced loss is sum(loss * v), the gradient
// that of torch's loss.backward(v).
template <class T, class Loss>
void check_class_loss(const std::string& loss_name, const class_case& c, nn::Reduction reduction,
                      Loss loss) {
  const std::string d = std::is_same_v<T, double> ? "float64" : "float32";
  const std::string key =
      "ce." + d + "." + loss_name + "." + c.name + "." + reduction_name(reduction);
  INFO(key);
  const auto x = oracle().tensor<T>("ce." + d + "." + c.input);
  const auto targets = oracle().tensor<std::int64_t>("ce." + d + "." + c.targets);
  const auto weight = oracle().tensor<T>("ce." + d + ".weight");
  const auto v = oracle().tensor<T>("ce." + d + "." + c.v);
  const ts::AnyTensor w = c.weighted ? ts::AnyTensor(weight) : ts::AnyTensor();
  const auto& want = oracle().at(key);
  check_same(ts::Tensor<T>(loss(x, targets, reduction, c, w)), want.values, tolerance<T>);

  auto program = ag::compile(
      [&](ag::Var<T> input, ag::Var<std::int64_t> y) -> ag::Var<T> {
        const ag::Var<T> l = loss(input, y, reduction, c, w);
        if (reduction == nn::Reduction::none) return ts::sum(l * v);
        return l;
      },
      ag::input_spec<T>{x.shape(), 0, true}, ag::input<std::int64_t>(targets.shape()));
  double expected = want.values[0];
  if (reduction == nn::Reduction::none) {
    const auto vs = v.to_vector();
    expected = 0;
    for (std::size_t i = 0; i < vs.size(); ++i) expected += want.values[i] * vs[i];
  }
  for (int run = 0; run < 2; ++run) {
    check_same(program.forward(x, targets), {expected}, tolerance<T>);
    program.backward();
    check_same(program.input_grad(0).template as<T>(), oracle().at(key + ".grad").values,
               tolerance<T>);
  }
}

TEMPLATE_TEST_CASE("cross_entropy's and nll_loss's options match torch.nn.functional",
                   "[loss][oracle]", float, double) {
  using T = TestType;
  const auto cross_entropy = [](const auto& x, const auto& y, nn::Reduction r, const class_case& c,
                                const ts::AnyTensor& w) {
    return nn::functional::cross_entropy(x, y,
                                         {.reduction = r,
                                          .ignore_index = c.ignore_index,
                                          .label_smoothing = c.label_smoothing,
                                          .weight = w});
  };
  const auto nll_loss = [](const auto& x, const auto& y, nn::Reduction r, const class_case& c,
                           const ts::AnyTensor& w) {
    return nn::functional::nll_loss(x, y,
                                    {.reduction = r, .ignore_index = c.ignore_index, .weight = w});
  };
  for (const nn::Reduction r : {nn::Reduction::mean, nn::Reduction::sum, nn::Reduction::none}) {
    for (const class_case& c : cross_entropy_cases) check_class_loss<T>("ce", c, r, cross_entropy);
    for (const class_case& c : nll_cases) check_class_loss<T>("nll", c, r, nll_loss);
  }
}

TEST_CASE("cross_entropy(logits, targets): one program, targets with and without ignored ones",
          "[loss][oracle]") {
  // The node's plain path (no target ignored) and its general one, chosen at each forward.
  const auto x = oracle().tensor<double>("ce.float64.logits");
  auto program = ag::compile(
      [](ag::Var<double> a, ag::Var<std::int64_t> y) { return nn::cross_entropy(a, y); },
      ag::input_spec<double>{x.shape(), 0, true}, ag::input<std::int64_t>({7}));
  for (const char* c : {"plain", "ignore", "plain"}) {
    INFO(c);
    const bool ignore = std::string(c) == "ignore";
    const auto targets =
        oracle().tensor<std::int64_t>(ignore ? "ce.float64.ignored" : "ce.float64.targets");
    const std::string key = std::string("ce.float64.ce.") + c + ".mean";
    check_same(nn::cross_entropy(x, targets), oracle().at(key).values, 1e-12);
    check_same(program.forward(x, targets), oracle().at(key).values, 1e-12);
    program.backward();
    check_same(program.input_grad(0).as<double>(), oracle().at(key + ".grad").values, 1e-12);
  }
}

TEST_CASE("cross_entropy's and nll_loss's general path add into a parameter's gradient",
          "[loss][oracle]") {
  // Two backward passes: twice torch's gradient (the second one adds); [N, C] and [N, C, d...].
  const auto weight = oracle().tensor<double>("ce.float64.weight");
  for (const bool nd : {false, true}) {
    const std::string suffix = nd ? "_nd" : "";
    const auto targets = oracle().tensor<std::int64_t>("ce.float64.ignored" + suffix);
    for (const bool from_logits : {true, false}) {
      INFO((from_logits ? "cross_entropy" : "nll_loss") << suffix);
      auto slot = std::make_shared<ag::parameter_slot<double, ts::cpu>>();
      slot->value = oracle().tensor<double>(
          (from_logits ? "ce.float64.logits" : "ce.float64.log_probs") + suffix);
      auto program = ag::compile(
          [&](ag::Var<std::int64_t> y) -> ag::Var<double> {
            const auto x = ag::parameter(slot, y);
            if (from_logits) {
              return nn::cross_entropy(x, y, {.label_smoothing = 0.25, .weight = weight});
            }
            return nn::nll_loss(x, y, {.weight = weight});
          },
          ag::input<std::int64_t>(targets.shape()));
      const std::string key =
          from_logits ? (nd ? "ce.float64.ce.nd_all.mean" : "ce.float64.ce.all.mean")
                      : "ce.float64.nll." + std::string(nd ? "nd_" : "") + "weight_ignore.mean";
      for (int run = 0; run < 2; ++run) {
        check_same(program.forward(targets), oracle().at(key).values, 1e-12);
        program.backward();
      }
      std::vector<double> twice = oracle().at(key + ".grad").values;
      for (double& v : twice) v *= 2;
      check_same(slot->grad, twice, 1e-12);
    }
  }
}

TEST_CASE("cross_entropy and nll_loss with every target ignored: NaN mean, as PyTorch", "[loss]") {
  const auto x = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const auto ignored = ts::from_vector<std::int64_t>({-100, -100}, {2});
  const auto weight = ts::from_vector<float>({1, 2, 3}, {3});
  CHECK(std::isnan(nn::cross_entropy(x, ignored).item()));
  CHECK(
      std::isnan(nn::cross_entropy(x, ignored, {.label_smoothing = 0.5, .weight = weight}).item()));
  CHECK(std::isnan(nn::nll_loss(x, ignored).item()));
  CHECK(nn::cross_entropy(x, ignored, {.reduction = nn::Reduction::sum}).item() == 0);
  CHECK(nn::cross_entropy(x, ignored, {.reduction = nn::Reduction::none}).to_vector() ==
        std::vector<float>{0, 0});
  // Traced: NaN loss, a zero gradient (torch's too).
  auto program = ag::compile(
      [&](ag::Var<float> a, ag::Var<std::int64_t> y) {
        return nn::cross_entropy(a, y, {.label_smoothing = 0.1, .weight = weight});
      },
      ag::input_spec<float>{{2, 3}, 0, true}, ag::input<std::int64_t>({2}));
  CHECK(std::isnan(program.forward(x, ignored).item()));
  program.backward();
  CHECK(program.input_grad(0).as<float>().to_vector() == std::vector<float>(6, 0.0f));
}

TEST_CASE("cross_entropy and nll_loss refuse bad options and targets, naming them", "[loss]") {
  const auto x = ts::zeros<float>({3, 4});
  const auto y = ts::from_vector<std::int64_t>({0, 3, -100}, {3});
  const auto weight = ts::from_vector<float>({1, 2, 3, 4}, {4});
  CHECK_THROWS_AS(nn::cross_entropy(x, y, {.label_smoothing = 1.5}), std::invalid_argument);
  CHECK_THROWS_WITH(nn::cross_entropy(x, y, {.label_smoothing = 1.5}),
                    Catch::Contains("cross_entropy: label_smoothing 1.5 must be between 0 and 1"));
  CHECK_THROWS_WITH(nn::cross_entropy(x, y, {.label_smoothing = -0.25}),
                    Catch::Contains("label_smoothing -0.25"));
  CHECK_THROWS_AS(nn::cross_entropy(x, y, {.weight = ts::ones<float>({3})}), ts::shape_error);
  CHECK_THROWS_WITH(nn::cross_entropy(x, y, {.weight = ts::ones<float>({3})}),
                    Catch::Contains("the weight has shape [3] for 4 classes; expected [4]"));
  CHECK_THROWS_WITH(nn::nll_loss(x, y, {.weight = ts::ones<float>({2, 2})}),
                    Catch::Contains("nll_loss: the weight has shape [2, 2]"));
  CHECK_THROWS_AS(nn::cross_entropy(x, y, {.weight = ts::ones<double>({4})}), ts::dtype_error);
  CHECK_THROWS_WITH(nn::cross_entropy(x, y, {.weight = ts::ones<double>({4})}),
                    Catch::Contains("the weight has dtype float64 and the logits float32"));
  REQUIRE(ts::cpu::device_count() >= 2);  // TESSERA_CPU_DEVICES=2
  CHECK_THROWS_AS(nn::cross_entropy(x, y, {.weight = ts::ones<float>({4}, 1)}),
                  ts::device_mismatch_error);
  CHECK_THROWS_WITH(nn::cross_entropy(x, y, {.weight = ts::ones<float>({4}, 1)}),
                    Catch::Contains("the weight is on cpu:1 and the logits on cpu:0"));
  CHECK_THROWS_WITH(nn::cross_entropy(x, ts::from_vector<std::int64_t>({0, 4, -100}, {3})),
                    Catch::Contains("cross_entropy: target 4 is out of range for 4 classes "
                                    "(expected 0 <= target < 4, or the ignore_index -100)"));
  // -100 is a target like any other when ignore_index is something else.
  CHECK_THROWS_WITH(nn::nll_loss(x, y, {.ignore_index = 1}),
                    Catch::Contains("nll_loss: target -100 is out of range"));
  CHECK_THROWS_AS(nn::cross_entropy(x, ts::zeros<std::int64_t>({3, 1})), ts::shape_error);
  CHECK_THROWS_WITH(
      nn::nll_loss(x, ts::zeros<std::int64_t>({2})),
      Catch::Contains("nll_loss: expected log-probabilities [N, C] and targets [N]") &&
          Catch::Contains("got log-probabilities [3, 4] and targets [2]"));
  // The [N, C, d...] form: the targets must be [N, d...].
  const auto x4 = ts::zeros<float>({2, 4, 3, 5});
  CHECK_THROWS_WITH(nn::cross_entropy(x4, ts::zeros<std::int64_t>({2, 5, 3})),
                    Catch::Contains("[N, C, d1, ...] and targets [N, d1, ...], got logits "
                                    "[2, 4, 3, 5] and targets [2, 5, 3]"));
  CHECK_THROWS_AS(nn::cross_entropy(x4, ts::zeros<std::int64_t>({2, 3})), ts::shape_error);
  CHECK_THROWS_AS(nn::cross_entropy(ts::zeros<float>({4}), ts::zeros<std::int64_t>({})),
                  ts::shape_error);
  CHECK_THROWS_WITH(nn::cross_entropy(x4, ts::full<std::int64_t>({2, 3, 5}, 4)),
                    Catch::Contains("target 4 is out of range for 4 classes"));
  // Nothing was changed, and a traced loss checks its targets at every forward, working after.
  CHECK(weight.to_vector() == std::vector<float>{1, 2, 3, 4});
  CHECK_THROWS_WITH(ag::compile(
                        [&](ag::Var<float> a) {
                          return nn::cross_entropy(a, y, {.weight = ts::ones<float>({5})});
                        },
                        ag::input<float>({3, 4})),
                    Catch::Contains("the weight has shape [5] for 4 classes"));
  auto program = ag::compile(
      [&](ag::Var<float> a, ag::Var<std::int64_t> t) {
        return nn::cross_entropy(a, t, {.reduction = nn::Reduction::sum, .weight = weight});
      },
      ag::input_spec<float>{{3, 4}, 0, true}, ag::input<std::int64_t>({3}));
  // Uniform logits: a loss of w[t] log 4 per sample not ignored.
  const double expected = (1 + 4) * std::log(4.0);
  CHECK(program.forward(x, y).item() == Approx(expected).epsilon(1e-6));
  CHECK_THROWS_WITH(program.forward(x, ts::from_vector<std::int64_t>({0, -1, 2}, {3})),
                    Catch::Contains("target -1 is out of range"));
  CHECK(program.forward(x, y).item() == Approx(expected).epsilon(1e-6));
}

TEST_CASE("cross_entropy's target check by reductions (its CUDA form) on CPU", "[loss]") {
  using nn::detail::check_targets_by_reductions;
  const auto t = [](std::vector<std::int64_t> v) {
    const auto n = static_cast<std::int64_t>(v.size());
    return ts::from_vector<std::int64_t>(std::move(v), {n});
  };
  CHECK_FALSE(check_targets_by_reductions(t({0, 3, 1}), 4, -100, "cross_entropy"));
  CHECK(check_targets_by_reductions(t({0, 3, -100}), 4, -100, "cross_entropy"));
  CHECK(check_targets_by_reductions(t({-100, -100}), 4, -100, "cross_entropy"));
  CHECK(check_targets_by_reductions(t({0, 3, 1}), 4, 2, "cross_entropy"));  // may be ignored
  CHECK_THROWS_WITH(check_targets_by_reductions(t({0, 7, -100}), 4, -100, "cross_entropy"),
                    Catch::Contains("target 7 is out of range for 4 classes"));
  CHECK_THROWS_WITH(check_targets_by_reductions(t({0, -5, -100}), 4, -100, "nll_loss"),
                    Catch::Contains("nll_loss: target -5"));
}

}  // namespace loss_test
