// Learning-rate schedulers (optim/lr_scheduler.hpp) against PyTorch's (tests/oracles/nn_torch.py,
// section "schedulers"): the rate after construction and after each of 30 steps, bit for bit
// (both compute the same chained formula in float64); the optimiser's own rate follows; state
// round trip; bad arguments.
#include <catch2/catch.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/torch_oracle.hpp"
#include "tessera/tessera.hpp"

namespace lr_scheduler_test {

namespace ts = tessera;
namespace optim = tessera::optim;

const torch_oracle::file& oracle() {
  static const torch_oracle::file file("schedulers");
  return file;
}

template <class Opt, class Scheduler>
void follow(Opt& opt, Scheduler& scheduler, const std::string& name) {
  const std::vector<double>& want = oracle().at(name + ".lr").values;
  REQUIRE(want.size() == 31);
  std::vector<double> got{scheduler.get_last_lr()};
  for (int i = 0; i < 30; ++i) {
    scheduler.step();
    got.push_back(scheduler.get_last_lr());
    REQUIRE(opt.options().lr == scheduler.get_last_lr());
  }
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(name << " step " << i);
    CHECK(got[i] == want[i]);
  }
  CHECK(scheduler.last_epoch() == 30);
}

struct one_parameter {
  ts::nn::Parameter<double> p{ts::zeros<double>({2})};
  std::vector<ts::nn::ParameterRef> list() const { return {p}; }
};

TEST_CASE("StepLR, CosineAnnealingLR and LinearLR give PyTorch's rates", "[optim][schedulers]") {
  one_parameter a, b, c, d;
  optim::SGD sgd1(a.list(), {.lr = 0.1}), sgd2(b.list(), {.lr = 0.1}), sgd3(c.list(), {.lr = 0.1});
  optim::Adam adam(d.list(), {.lr = 0.01});
  optim::StepLR step(sgd1, 3, 0.5);
  optim::CosineAnnealingLR cosine(sgd2, 7, 0.001);
  optim::LinearLR linear(sgd3, 0.25, 1.0, 6);
  optim::LinearLR linear_default(adam);
  follow(sgd1, step, "step");
  follow(sgd2, cosine, "cosine");
  follow(sgd3, linear, "linear");
  follow(adam, linear_default, "linear_default");
}

TEST_CASE("a scheduler's state resumes its sequence", "[optim][schedulers]") {
  one_parameter a, b;
  optim::SGD first(a.list(), {.lr = 0.1}), second(b.list(), {.lr = 0.1});
  optim::CosineAnnealingLR reference(first, 7, 0.001);
  for (int i = 0; i < 9; ++i) reference.step();
  optim::CosineAnnealingLR resumed(second, 7, 0.001);
  resumed.load_state_dict(reference.state_dict());
  second.load_state_dict(first.state_dict());  // the rate lives in the optimiser's state
  for (int i = 0; i < 10; ++i) {
    reference.step();
    resumed.step();
    CHECK(resumed.get_last_lr() == reference.get_last_lr());
  }
  CHECK_THROWS_WITH(resumed.load_state_dict(ts::StateDict{}), Catch::Contains("last_epoch"));
}

TEST_CASE("schedulers refuse bad arguments as PyTorch does", "[optim][schedulers]") {
  one_parameter a;
  optim::SGD sgd(a.list(), {.lr = 0.1});
  CHECK_THROWS_WITH(optim::StepLR(sgd, 0), Catch::Contains("step_size 0"));
  CHECK_THROWS_WITH(optim::CosineAnnealingLR(sgd, 0), Catch::Contains("T_max 0"));
  CHECK_THROWS_WITH(optim::LinearLR(sgd, 0.0), Catch::Contains("start_factor 0"));
  CHECK_THROWS_WITH(optim::LinearLR(sgd, 0.5, 1.5), Catch::Contains("end_factor 1.5"));
  CHECK(sgd.options().lr == 0.1);  // nothing changed
}

}  // namespace lr_scheduler_test
