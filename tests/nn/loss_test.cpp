// l1_loss, smooth_l1_loss and binary_cross_entropy_with_logits (nn/loss.hpp) against PyTorch
// (tests/oracles/nn_torch.py, section "losses"): the eager loss, and the loss and the input's
// gradient from a compiled program (the traced form), in float64 (1e-12) and float32 (1e-5);
// beta = 0 is l1 (gradient included); logits of +-40 stay finite; bad input.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

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

TEMPLATE_TEST_CASE("l1, smooth l1 and BCE with logits match torch.nn.functional",
                   "[loss][oracle]", float, double) {
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
  check<T>("bce", logits, soft, [](const auto& x, const auto& y) {
    return nn::binary_cross_entropy_with_logits(x, y);
  });
}

TEST_CASE("the new losses refuse bad input, naming it", "[loss]") {
  const auto a = ts::zeros<float>({2, 3});
  CHECK_THROWS_WITH(nn::l1_loss(a, ts::zeros<float>({3})),
                    Catch::Contains("l1_loss: the input has shape [2, 3] and the target [3]"));
  CHECK_THROWS_WITH(nn::smooth_l1_loss(a, a, -1.0), Catch::Contains("beta -1"));
  CHECK_THROWS_WITH(nn::binary_cross_entropy_with_logits(a, ts::zeros<float>({2, 2})),
                    Catch::Contains("binary_cross_entropy_with_logits"));
}

}  // namespace loss_test
