#include <catch2/catch.hpp>

#include "tessera/autograd.hpp"
#include "tessera/tensor/factories.hpp"

namespace ts = tessera;
namespace ag = tessera::autograd;

TEST_CASE("smoke") {
  auto w = std::make_shared<ag::parameter_slot<double, ts::cpu>>();
  w->value = ts::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto program = ag::compile(
      [&](ag::Var<double> x) {
        auto W = ag::parameter(w, x);
        ag::Var<double> h = ts::relu(ts::matmul(x, W.t()) + 1.0);
        return ts::mean(h * h);
      },
      ag::input<double>({4, 3}));
  auto x = ts::from_vector<double>({1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, {4, 3});
  auto loss = program.forward(x);
  program.backward();
  INFO(program.memory_report());
  CHECK(loss.item() > 0);
  CHECK(w->grad.defined());
}
