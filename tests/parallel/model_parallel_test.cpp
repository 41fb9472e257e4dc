// Model parallelism through Var::to(i) (TESSERA_CPU_DEVICES=4 for this folder): a model whose
// stages live on cpu:0, then cpu:1, then cpu:0 again, trained through one compiled program, gives
// the loss, the gradients (each on its parameter's device) and the updated parameters of the same
// model on one device, exactly (float64; the same operations in the same order, only copies
// added), and the copies' gradients flow back in both directions.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "tessera/tessera.hpp"

namespace model_parallel_test {

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;

struct ThreeStages : nn::Module {
  nn::Linear<double> a, b, c;
  int middle;
  ThreeStages(int first, int second)
      : a(6, 12, true, first), b(12, 12, true, second), c(12, 4, true, first), middle(second) {
    register_module("a", a);
    register_module("b", b);
    register_module("c", c);
  }
  ag::Var<double> forward(const ag::Var<double>& x) const {
    const ag::Var<double> h = ts::tanh(a(x));
    const ag::Var<double> g = ts::relu(b(h.to(middle)));  // cpu:0 -> cpu:1
    return c(g.to<ts::cpu>(0));                            // cpu:1 -> cpu:0 (the kind named)
  }
};

TEST_CASE("a model split over two devices trains as on one device", "[parallel][model]") {
  ts::manual_seed(2);
  ThreeStages split(0, 1);
  ThreeStages single(0, 0);
  single.load_state_dict(split.state_dict());
  CHECK(split.b.weight().value().device() == ts::Device{ts::DeviceType::cpu, 1});

  std::vector<double> xs(8 * 6), ys(8 * 4);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<double>(i % 7) / 3.0 - 1.0;
  for (std::size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<double>(i % 5) / 4.0;
  const auto x = ts::from_vector<double>(xs, {8, 6});
  const auto y = ts::from_vector<double>(ys, {8, 4});

  auto compile_for = [&](ThreeStages& m) {
    return ag::compile([&m](ag::Var<double> in, ag::Var<double> target) {
      return nn::mse_loss(m.forward(in), target);
    }, ag::input<double>({8, 6}), ag::input<double>({8, 4}));
  };
  auto split_step = compile_for(split);
  auto single_step = compile_for(single);
  ts::optim::Adam split_adam(split.parameters(), {.lr = 0.05});
  ts::optim::Adam single_adam(single.parameters(), {.lr = 0.05});
  for (int i = 0; i < 3; ++i) {
    split_adam.zero_grad();
    single_adam.zero_grad();
    CHECK(split_step.forward(x, y).item() == single_step.forward(x, y).item());
    split_step.backward();
    single_step.backward();
    const auto split_parameters = split.parameters();
    const auto single_parameters = single.parameters();
    for (std::size_t p = 0; p < split_parameters.size(); ++p) {
      INFO("step " << i << ", parameter " << p);
      const ts::AnyTensor g = split_parameters[p].grad();
      CHECK(g.device() == split_parameters[p].value().device());
      const auto moved = g.as<double, ts::cpu>().to(0).to_vector();
      CHECK(moved == single_parameters[p].grad().as<double, ts::cpu>().to_vector());
    }
    split_adam.step();
    single_adam.step();
  }
  CHECK(split.b.weight().value().to(0).to_vector() == single.b.weight().value().to_vector());
}

}  // namespace model_parallel_test
