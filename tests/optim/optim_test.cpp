// SGD, Adam and AdamW (optim/) against PyTorch: 5-step trajectories from the same initial values
// and the same gradients (tests/oracles/nn_torch.py runs torch.optim on them), with a parameter
// skipped at one step, in float32 and float64. Then what the optimisers allocate (state made at
// the first step: SGD with momentum one buffer per parameter, Adam two, three with amsgrad,
// plain SGD none; later steps and zero_grad nothing), one pass per parameter, option checks as
// PyTorch's, errors, parameters moved by Module::to, non-contiguous gradients, half precision.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/torch_oracle.hpp"
#include "tessera/tessera.hpp"

namespace optim_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace nn = tessera::nn;
namespace optim = tessera::optim;

namespace {

const ts::Device cpu0 = ts::Device::parse("cpu:0");

const torch_oracle::file& oracle() {
  static const torch_oracle::file file("optim");
  return file;
}

// The same table as OPTIMISERS in nn_torch.py.
std::unique_ptr<optim::Optimizer> make_optimiser(const std::string& name,
                                                 std::vector<nn::ParameterRef> params) {
  using std::make_unique;
  if (name == "sgd") return make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1});
  if (name == "sgd_momentum") {
    return make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  }
  if (name == "sgd_dampening") {
    return make_unique<optim::SGD>(
        params, optim::SGDOptions{.lr = 0.05, .momentum = 0.8, .dampening = 0.3});
  }
  if (name == "sgd_weight_decay") {
    return make_unique<optim::SGD>(
        params, optim::SGDOptions{.lr = 0.1, .momentum = 0.5, .weight_decay = 0.05});
  }
  if (name == "sgd_nesterov") {
    return make_unique<optim::SGD>(
        params,
        optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  }
  if (name == "sgd_maximize") {
    return make_unique<optim::SGD>(params,
                                   optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .maximize = true});
  }
  if (name == "adam") return make_unique<optim::Adam>(params, optim::AdamOptions{.lr = 0.01});
  if (name == "adam_weight_decay") {
    return make_unique<optim::Adam>(params, optim::AdamOptions{.lr = 0.02, .weight_decay = 0.1});
  }
  if (name == "adam_amsgrad") {
    return make_unique<optim::Adam>(
        params, optim::AdamOptions{.lr = 0.02, .betas = {0.8, 0.9}, .amsgrad = true});
  }
  if (name == "adam_betas") {
    return make_unique<optim::Adam>(
        params, optim::AdamOptions{.lr = 0.05, .betas = {0.5, 0.6}, .eps = 1e-3});
  }
  if (name == "adamw") return make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 0.01});
  if (name == "adamw_amsgrad") {
    return make_unique<optim::AdamW>(
        params, optim::AdamWOptions{.lr = 0.02, .weight_decay = 0.1, .amsgrad = true});
  }
  throw std::logic_error("unknown optimiser " + name);
}

const char* const optimiser_names[] = {
    "sgd",          "sgd_momentum", "sgd_dampening", "sgd_weight_decay",
    "sgd_nesterov", "sgd_maximize", "adam",          "adam_weight_decay",
    "adam_amsgrad", "adam_betas",   "adamw",         "adamw_amsgrad"};

template <class T>
void check_trajectory(const std::string& name) {
  const std::string tag = name + "." + (std::is_same_v<T, float> ? "float32" : "float64");
  INFO(tag);
  nn::Parameter<T> p0(oracle().tensor<T>(tag + ".p0.init"));
  nn::Parameter<T> p1(oracle().tensor<T>(tag + ".p1.init"));
  const nn::Parameter<T>* params[] = {&p0, &p1};
  auto optimiser = make_optimiser(name, {p0, p1});
  // float32: a few roundings per step from PyTorch's (which may fuse multiply-adds); float64:
  // the same operations in the same order, so agreement to a few ulps.
  const double rel = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  const double abs = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    for (int i = 0; i < 2; ++i) {
      const std::string grad = tag + ".p" + std::to_string(i) + ".grad" + std::to_string(step);
      params[i]->grad() = oracle().contains(grad) ? oracle().tensor<T>(grad) : ts::Tensor<T>();
    }
    optimiser->step();
    for (int i = 0; i < 2; ++i) {
      INFO("parameter " << i);
      torch_oracle::check_close(
          params[i]->value(),
          oracle().at(tag + ".p" + std::to_string(i) + ".step" + std::to_string(step)), rel, abs);
    }
  }
  // Parameter 1 had no gradient at step 2: Adam counts its steps separately.
  if (auto* adam = dynamic_cast<optim::Adam*>(optimiser.get())) {
    CHECK(adam->step_count(0) == 5);
    CHECK(adam->step_count(1) == 4);
  }
}

std::int64_t allocation_count() { return ts::memory::stats(cpu0).allocations.allocated; }

/// Three parameters whose rounded sizes are 512, 4096 and 1024 bytes, each with a gradient.
struct three_parameters {
  nn::Parameter<float> a{ts::randn<float>({3, 4})};
  nn::Parameter<float> b{ts::randn<float>({1000})};
  nn::Parameter<float> c{ts::randn<float>({129})};
  three_parameters() {
    a.grad() = ts::randn<float>({3, 4});
    b.grad() = ts::randn<float>({1000});
    c.grad() = ts::randn<float>({129});
  }
  std::vector<nn::ParameterRef> refs() const { return {a, b, c}; }
  static constexpr std::int64_t rounded_bytes = 512 + 4096 + 1024;
};

/// Allocations and bytes a call makes on cpu:0 (and kernel passes).
struct usage {
  std::int64_t allocations, bytes, passes;
};
template <class Fn>
usage measure(Fn&& fn) {
  const auto count = allocation_count();
  const auto bytes = static_cast<std::int64_t>(ts::memory::allocated(cpu0));
  const auto passes = ts::profiler::kernel_launches();
  fn();
  return {allocation_count() - count,
          static_cast<std::int64_t>(ts::memory::allocated(cpu0)) - bytes,
          ts::profiler::kernel_launches() - passes};
}

}  // namespace

TEST_CASE("SGD, Adam and AdamW follow torch.optim's trajectories", "[optim][oracle]") {
  for (const char* name : optimiser_names) {
    check_trajectory<float>(name);
    check_trajectory<double>(name);
  }
}

TEST_CASE("state is made at the first step: Adam two buffers, SGD momentum one, plain SGD none",
          "[optim][memory]") {
  SECTION("Adam") {
    three_parameters p;
    optim::Adam adam(p.refs());
    const auto first = measure([&] { adam.step(); });
    CHECK(first.allocations == 2 * 3);
    CHECK(first.bytes == 2 * three_parameters::rounded_bytes);
    CHECK(first.passes == 3);  // one fused pass per parameter
    const auto second = measure([&] { adam.step(); });
    CHECK(second.allocations == 0);
    CHECK(second.bytes == 0);
    CHECK(second.passes == 3);
    CHECK(adam.exp_avg(1).shape() == ts::Shape{1000});
    CHECK(adam.exp_avg_sq(2).dtype() == ts::ScalarType::float32);
    CHECK_FALSE(adam.max_exp_avg_sq(0).defined());
  }
  SECTION("Adam with amsgrad: three") {
    three_parameters p;
    optim::Adam adam(p.refs(), {.amsgrad = true});
    const auto first = measure([&] { adam.step(); });
    CHECK(first.allocations == 3 * 3);
    CHECK(first.bytes == 3 * three_parameters::rounded_bytes);
  }
  SECTION("AdamW") {
    three_parameters p;
    optim::AdamW adamw(p.refs());
    CHECK(adamw.options().weight_decay == 1e-2);
    CHECK(measure([&] { adamw.step(); }).allocations == 2 * 3);
  }
  SECTION("SGD with momentum") {
    three_parameters p;
    optim::SGD sgd(p.refs(), {.lr = 0.1, .momentum = 0.9});
    const auto first = measure([&] { sgd.step(); });
    CHECK(first.allocations == 3);
    CHECK(first.bytes == three_parameters::rounded_bytes);
    CHECK(first.passes == 3);
    // The first step sets the buffer to the gradient itself (no dampening), as PyTorch.
    CHECK(sgd.momentum_buffer(1).as<float>().to_vector() == p.b.grad().to_vector());
    CHECK(measure([&] { sgd.step(); }).allocations == 0);
  }
  SECTION("plain SGD") {
    three_parameters p;
    optim::SGD sgd(p.refs(), {.lr = 0.1});
    const auto first = measure([&] { sgd.step(); });
    CHECK(first.allocations == 0);
    CHECK(first.bytes == 0);
    CHECK(first.passes == 3);
    CHECK_FALSE(sgd.momentum_buffer(0).defined());
  }
  SECTION("a parameter without a gradient gets no state and no pass") {
    three_parameters p;
    p.b.grad() = ts::Tensor<float>();
    const auto b_before = p.b.value().to_vector();
    optim::Adam adam(p.refs());
    const auto first = measure([&] { adam.step(); });
    CHECK(first.allocations == 2 * 2);
    CHECK(first.passes == 2);
    CHECK(adam.step_count(1) == 0);
    CHECK_FALSE(adam.exp_avg(1).defined());
    CHECK(p.b.value().to_vector() == b_before);
  }
  SECTION("zero_grad zeroes in place and allocates nothing") {
    three_parameters p;
    optim::SGD sgd(p.refs(), {.lr = 0.1});
    const auto storage = p.b.grad().storage();
    const auto used = measure([&] { sgd.zero_grad(); });
    CHECK(used.allocations == 0);
    CHECK(used.bytes == 0);
    CHECK(p.b.grad().storage().is_same(storage));
    CHECK(ts::max(ts::abs(p.b.grad())).item() == 0.0f);
  }
}

TEST_CASE("options are checked as PyTorch checks them", "[optim]") {
  nn::Parameter<float> p(ts::zeros<float>({2}));
  const std::vector<nn::ParameterRef> params{p};
  using optim::SGD;
  CHECK_THROWS_WITH(SGD(params, {.momentum = 0.9}), Catch::Contains("learning rate is not set"));
  CHECK_THROWS_WITH(SGD(params, {.lr = -0.1}), Catch::Contains("invalid learning rate"));
  CHECK_THROWS_WITH(SGD(params, {.lr = 0.1, .momentum = -1}), Catch::Contains("invalid momentum"));
  CHECK_THROWS_WITH(SGD(params, {.lr = 0.1, .weight_decay = -1}),
                    Catch::Contains("invalid weight_decay"));
  CHECK_THROWS_WITH(SGD(params, {.lr = 0.1, .nesterov = true}),
                    Catch::Contains("Nesterov momentum requires a momentum and zero dampening"));
  CHECK_THROWS_WITH(SGD(params, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                    Catch::Contains("Nesterov"));
  CHECK_NOTHROW(SGD(params, {.lr = 0.0}));

  using optim::Adam;
  CHECK_THROWS_WITH(Adam(params, {.lr = -1}), Catch::Contains("Adam: invalid learning rate"));
  CHECK_THROWS_WITH(Adam(params, {.eps = -1e-8}), Catch::Contains("invalid epsilon"));
  CHECK_THROWS_WITH(Adam(params, {.betas = {1.0, 0.999}}),
                    Catch::Contains("invalid beta parameter at index 0"));
  CHECK_THROWS_WITH(Adam(params, {.betas = {0.9, -0.1}}),
                    Catch::Contains("invalid beta parameter at index 1"));
  CHECK_THROWS_WITH(Adam(params, {.weight_decay = -1}), Catch::Contains("invalid weight_decay"));
  CHECK_THROWS_WITH(optim::AdamW(params, {.lr = std::nan("")}),
                    Catch::Contains("AdamW: invalid learning rate"));
  CHECK_NOTHROW(Adam(params, {.betas = {0.0, 0.0}}));

  // Parameter lists.
  CHECK_THROWS_WITH(Adam(std::vector<nn::ParameterRef>{}), Catch::Contains("empty parameter list"));
  CHECK_THROWS_WITH(Adam(std::vector<optim::ParamGroup>{}), Catch::Contains("empty parameter list"));
  CHECK_THROWS_WITH(Adam({p, p}), Catch::Contains("parameter 1 appears more than once"));
  CHECK_THROWS_WITH(Adam({nn::ParameterRef()}), Catch::Contains("empty reference"));

  // Options changed between steps are checked at the next step.
  Adam adam(params);
  adam.options().lr = -1;
  p.grad() = ts::ones<float>({2});
  CHECK_THROWS_AS(adam.step(), std::invalid_argument);
  CHECK(p.value().to_vector() == std::vector<float>{0, 0});
}

TEST_CASE("step errors name the optimiser and the parameter; nothing is updated", "[optim]") {
  nn::Parameter<float> good(ts::zeros<float>({2}));
  nn::Parameter<float> bad(ts::zeros<float>({3}));
  good.grad() = ts::ones<float>({2});
  bad.grad() = ts::ones<float>({4});
  optim::SGD sgd({bad, good}, {.lr = 1.0});
  CHECK_THROWS_WITH(sgd.step(), Catch::Contains("SGD: parameter 0 has shape [3] but its "
                                                "gradient [4]"));
  CHECK(good.value().to_vector() == std::vector<float>{0, 0});

  bad.grad() = ts::ones<float>({3}, 1);
  CHECK_THROWS_AS(sgd.step(), ts::device_mismatch_error);

  nn::Parameter<std::int32_t> integer(ts::zeros<std::int32_t>({2}));
  integer.grad() = ts::ones<std::int32_t>({2});
  optim::Adam adam({integer});
  CHECK_THROWS_WITH(adam.step(), Catch::Contains("Adam: parameter 0 has dtype int32; optimisers "
                                                 "update floating-point parameters only"));

  auto base = ts::zeros<float>({4, 3});
  nn::Parameter<float> strided(base.t());
  strided.grad() = ts::ones<float>({3, 4});
  optim::SGD strided_sgd({strided}, {.lr = 1.0});
  CHECK_THROWS_WITH(strided_sgd.step(), Catch::Contains("is not dense") &&
                                            Catch::Contains("contiguous or channels_last"));
}

TEST_CASE("channels_last parameters update in place as contiguous ones, state laid out alike",
          "[optim][channels_last]") {
  using ts::memory_format;
  const auto start = ts::randn<double>({3, 4, 2, 5});
  // The NHWC parameter's gradients come NCHW and NHWC; its layout changes back and forth.
  nn::Parameter<double> a(start.contiguous(memory_format::channels_last)), b(start.clone());
  nn::Parameter<double> c(start.contiguous(memory_format::channels_last)), d(start.clone());
  optim::SGD sgd_a({a}, {.lr = 0.1, .momentum = 0.9}), sgd_b({b}, {.lr = 0.1, .momentum = 0.9});
  optim::Adam adam_c({c}, {.lr = 0.1}), adam_d({d}, {.lr = 0.1});
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    const auto grad = ts::randn<double>({3, 4, 2, 5});
    a.grad() = step % 2 == 0 ? grad : grad.contiguous(memory_format::channels_last);
    c.grad() = a.grad();
    b.grad() = grad;
    d.grad() = grad;
    sgd_a.step(), sgd_b.step(), adam_c.step(), adam_d.step();
    CHECK(a.value().is_contiguous(memory_format::channels_last));
    CHECK(a.value().to_vector() == b.value().to_vector());
    CHECK(c.value().to_vector() == d.value().to_vector());
    // The state is the contiguous run's, element for element, in the parameter's layout.
    const auto momentum = sgd_a.state_dict().at("state.0.momentum_buffer").as<double>();
    CHECK(momentum.is_contiguous(memory_format::channels_last));
    CHECK(momentum.to_vector() ==
          sgd_b.state_dict().at("state.0.momentum_buffer").as<double>().to_vector());
    CHECK(adam_c.state_dict().at("state.0.exp_avg_sq").as<double>().to_vector() ==
          adam_d.state_dict().at("state.0.exp_avg_sq").as<double>().to_vector());
    if (step == 1) {  // contiguous again (Module::to's way): the state follows at the next step
      nn::ParameterRef(c).set_value(c.value().contiguous());
    }
  }
  CHECK(c.value().is_contiguous());
}

TEST_CASE("a non-contiguous gradient updates as its contiguous copy would", "[optim]") {
  const auto start = ts::randn<double>({4, 3});
  const auto grad = ts::randn<double>({3, 4});
  nn::Parameter<double> a(start.clone()), b(start.clone());
  a.grad() = grad.t();  // a transposed view
  b.grad() = grad.t().contiguous();
  optim::Adam adam_a({a}, {.lr = 0.1}), adam_b({b}, {.lr = 0.1});
  adam_a.step();
  adam_b.step();
  CHECK(a.value().to_vector() == b.value().to_vector());
}

TEST_CASE("the optimiser follows its parameters through Module::to and load_state_dict",
          "[optim][module]") {
  REQUIRE(ts::cpu::device_count() >= 2);
  nn::Linear<double> moved(3, 2), reference(3, 2);
  reference.load_state_dict(moved.state_dict());
  optim::Adam adam_moved(moved.parameters(), {.lr = 0.05});
  optim::Adam adam_reference(reference.parameters(), {.lr = 0.05});
  ts::manual_seed(5);
  for (int step = 0; step < 4; ++step) {
    const auto gw = ts::randn<double>({2, 3});
    const auto gb = ts::randn<double>({2});
    if (step == 2) moved.to(1);  // state made on cpu:0 follows the parameters
    moved.weight().grad() = gw.to(moved.weight().device().index);
    moved.bias().grad() = gb.to(moved.bias().device().index);
    reference.weight().grad() = gw;
    reference.bias().grad() = gb;
    adam_moved.step();
    adam_reference.step();
  }
  CHECK(moved.weight().device().index == 1);
  CHECK(adam_moved.exp_avg(0).device().index == 1);
  CHECK(moved.weight().value().to_vector() == reference.weight().value().to_vector());

  // Values loaded into the module after the optimiser was made are the ones it steps.
  nn::Linear<float> lin(2, 2, false);
  optim::SGD sgd(lin.parameters(), {.lr = 1.0});
  lin.load_state_dict({{"weight", ts::full<float>({2, 2}, 3.0f)}});
  lin.weight().grad() = ts::ones<float>({2, 2});
  sgd.step();
  CHECK(lin.weight().value().to_vector() == std::vector<float>(4, 2.0f));
}

TEST_CASE("half and bfloat16 parameters update in float", "[optim]") {
  ts::manual_seed(9);
  const auto start = ts::randn<float>({64});
  const auto grad = ts::randn<float>({64});
  // The float64 run, from the same (half-rounded) values.
  nn::Parameter<double> reference(start.to<ts::half>().to<double>());
  nn::Parameter<ts::half> h(start.to<ts::half>());
  nn::Parameter<ts::bfloat16> bf(start.to<ts::bfloat16>().to<ts::bfloat16>());
  nn::Parameter<double> bf_reference(start.to<ts::bfloat16>().to<double>());
  optim::Adam adam_ref({reference, bf_reference}, {.lr = 0.01});
  optim::Adam adam_low({h, bf}, {.lr = 0.01});
  for (int step = 0; step < 3; ++step) {
    reference.grad() = grad.to<ts::half>().to<double>();
    bf_reference.grad() = grad.to<ts::bfloat16>().to<double>();
    h.grad() = grad.to<ts::half>();
    bf.grad() = grad.to<ts::bfloat16>();
    adam_ref.step();
    adam_low.step();
  }
  const auto expected = reference.value().to_vector();
  const auto expected_bf = bf_reference.value().to_vector();
  const auto actual = h.value().to_vector();
  const auto actual_bf = bf.value().to_vector();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    // The update is ~0.03; rounding the moments and the parameter to half or bfloat16 costs a
    // few of their ulps.
    CHECK(std::abs(static_cast<double>(actual[i]) - expected[i]) <=
          4 * 0x1p-11 * std::abs(expected[i]) + 1e-3);
    CHECK(std::abs(static_cast<double>(actual_bf[i]) - expected_bf[i]) <=
          4 * 0x1p-8 * std::abs(expected_bf[i]) + 1e-2);
  }
}

TEST_CASE("parameter groups with their own lr and weight_decay follow torch, schedulers too",
          "[optim][groups]") {
  static const torch_oracle::file groups_oracle("param_groups");
  for (const std::string name : {"sgd", "adam"}) {
    INFO(name);
    const std::string tag = "groups." + name;
    std::vector<nn::Parameter<float>> p;
    for (int i = 0; i < 3; ++i) {
      p.emplace_back(groups_oracle.tensor<float>(tag + ".p" + std::to_string(i) + ".init"));
    }
    const std::vector<optim::ParamGroup> groups{{.params = {p[0], p[1]}, .lr = 0.01},
                                                {.params = {p[2]}, .weight_decay = 0.1}};
    auto run = [&](auto& opt, auto& schedule) {
      REQUIRE(opt.param_group_count() == 2);
      CHECK(opt.group_of(1) == 0);
      CHECK(opt.group_of(2) == 1);
      for (int step = 0; step < 6; ++step) {
        INFO("step " << step);
        const std::string s = std::to_string(step);
        for (int i = 0; i < 3; ++i) {
          p[static_cast<std::size_t>(i)].grad() =
              groups_oracle.tensor<float>(tag + ".p" + std::to_string(i) + ".grad" + s);
        }
        opt.step();
        schedule.step();
        for (int i = 0; i < 3; ++i) {
          torch_oracle::check_close(p[static_cast<std::size_t>(i)].value(),
                                    groups_oracle.at(tag + ".p" + std::to_string(i) + ".step" + s),
                                    1e-6, 1e-7);
        }
        const auto& rates = groups_oracle.at(tag + ".lr" + s).values;
        CHECK(schedule.get_last_lrs() == rates);  // bit for bit
        CHECK(opt.group_lr(0) == rates[0]);
        CHECK(opt.group_lr(1) == rates[1]);
      }
    };
    if (name == "sgd") {
      optim::SGD sgd(groups, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
      CHECK(sgd.group_options(0).lr == 0.01);
      CHECK(sgd.group_options(0).weight_decay == 1e-3);
      CHECK(sgd.group_options(1).lr == 0.1);
      CHECK(sgd.group_options(1).weight_decay == 0.1);
      optim::StepLR schedule(sgd, 2, 0.5);
      run(sgd, schedule);
      CHECK(sgd.options().lr == schedule.get_last_lrs()[1]);  // group 1 follows options().lr
    } else {
      optim::Adam adam(groups, {.lr = 0.02, .weight_decay = 1e-3});
      optim::CosineAnnealingLR schedule(adam, 4, 1e-3);
      run(adam, schedule);
    }
  }
  nn::Parameter<float> a(ts::ones<float>({2})), b(ts::ones<float>({2}));
  CHECK_THROWS_WITH(optim::SGD({{.params = {a}}, {.params = {}}}, {.lr = 0.1}),
                    Catch::Contains("parameter group 1 has no parameters"));
  CHECK_THROWS_WITH(optim::Adam({{.params = {a}, .lr = -1.0}}),
                    Catch::Contains("parameter group 0") && Catch::Contains("-1"));
  CHECK_THROWS_WITH(optim::SGD({{.params = {a, b}}, {.params = {a}}}, {.lr = 0.1}),
                    Catch::Contains("parameter 2 appears more than once"));
}

}  // namespace optim_test
