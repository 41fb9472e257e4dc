// Optimiser state (SGD, Adam, AdamW state_dict / load_state_dict, saved with ts::save): training
// that stops after 3 steps, saves the model, the optimiser and a scheduler to safetensors files,
// and resumes in fresh objects gives the same bits as 6 steps without stopping; a state that does
// not fit is refused, naming the entry, and changes nothing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/tessera.hpp"

namespace state_dict_test {

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace optim = tessera::optim;

auto make_mlp() {
  return nn::Sequential(nn::Linear<float>(5, 8), nn::ReLU{}, nn::Linear<float>(8, 3));
}

std::vector<std::vector<float>> values(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& p : m.parameters()) out.push_back(p.value().as<float>().to_vector());
  return out;
}

template <class Opt, class Options>
void resume_is_bit_identical(Options options, const char* name) {
  INFO(name);
  const ts::Tensor<float> x = ts::eval(ts::arange<float>(0, 40).view({8, 5}) / 40.0f);
  const auto y = ts::from_vector<std::int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  auto loss = [&](auto& model) {
    return ag::compile([&](ag::Var<float> in) { return nn::cross_entropy(model.forward(in), y); },
                       ag::input<float>({8, 5}));
  };
  auto train = [&](auto& program, Opt& opt, auto& scheduler, int steps) {
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      program.forward(x);
      program.backward();
      opt.step();
      scheduler.step();
    }
  };

  ts::manual_seed(4);
  auto straight = make_mlp();
  auto straight_program = loss(straight);
  Opt straight_opt(straight.parameters(), options);
  optim::StepLR straight_schedule(straight_opt, 2, 0.5);
  train(straight_program, straight_opt, straight_schedule, 6);

  ts::manual_seed(4);
  auto first = make_mlp();
  auto first_program = loss(first);
  Opt first_opt(first.parameters(), options);
  optim::StepLR first_schedule(first_opt, 2, 0.5);
  train(first_program, first_opt, first_schedule, 3);
  const auto dir = std::filesystem::temp_directory_path();
  const std::string tag = std::string("tessera_resume_") + name;
  ts::save(first.state_dict(), (dir / (tag + "_model.safetensors")).string());
  ts::save(first_opt.state_dict(), (dir / (tag + "_optim.safetensors")).string());
  ts::save(first_schedule.state_dict(), (dir / (tag + "_sched.safetensors")).string());

  ts::manual_seed(99);  // other initial values: everything must come from the files
  auto resumed = make_mlp();
  auto resumed_program = loss(resumed);
  Opt resumed_opt(resumed.parameters(), options);
  optim::StepLR resumed_schedule(resumed_opt, 2, 0.5);
  resumed.load_state_dict(ts::load((dir / (tag + "_model.safetensors")).string()));
  resumed_opt.load_state_dict(ts::load((dir / (tag + "_optim.safetensors")).string()));
  resumed_schedule.load_state_dict(ts::load((dir / (tag + "_sched.safetensors")).string()));
  train(resumed_program, resumed_opt, resumed_schedule, 3);
  CHECK(values(resumed) == values(straight));  // bit for bit
  CHECK(resumed_opt.options().lr == straight_opt.options().lr);
  for (const char* suffix : {"_model", "_optim", "_sched"}) {
    std::filesystem::remove(dir / (tag + suffix + ".safetensors"));
  }
}

TEST_CASE("resuming from saved optimiser state gives the same bits", "[optim][state]") {
  resume_is_bit_identical<optim::SGD>(
      optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true}, "sgd");
  resume_is_bit_identical<optim::Adam>(optim::AdamOptions{.lr = 0.01, .amsgrad = true}, "adam");
  resume_is_bit_identical<optim::AdamW>(optim::AdamWOptions{.lr = 0.01}, "adamw");
}

TEST_CASE("a state that does not fit is refused and changes nothing", "[optim][state]") {
  ts::manual_seed(1);
  auto model = make_mlp();
  optim::Adam adam(model.parameters(), {.lr = 0.01});
  for (const auto& p : model.parameters()) p.set_grad(p.value().visit([](auto t) -> ts::AnyTensor { return t.clone(); }));
  adam.step();
  ts::StateDict good = adam.state_dict();
  CHECK(good.contains("state.0.exp_avg"));
  CHECK(good.contains("state.3.step"));
  CHECK(good.at("param_groups.0.lr").as<double>().item() == 0.01);

  ts::StateDict wrong_shape = good;
  wrong_shape.insert("state.1.exp_avg", ts::zeros<float>({7}));
  const auto before = adam.exp_avg(1).as<float>().to_vector();
  CHECK_THROWS_WITH(adam.load_state_dict(wrong_shape),
                    Catch::Contains("state.1.exp_avg has shape [7], parameter 1 [8]"));
  CHECK(adam.exp_avg(1).as<float>().to_vector() == before);

  ts::StateDict extra = good;
  extra.insert("state.9.exp_avg", ts::zeros<float>({3}));
  CHECK_THROWS_WITH(adam.load_state_dict(extra), Catch::Contains("state.9.exp_avg names no parameter"));

  ts::StateDict no_lr = good;
  no_lr.erase("param_groups.0.lr");
  CHECK_THROWS_WITH(adam.load_state_dict(no_lr), Catch::Contains("no entry param_groups.0.lr"));

  optim::SGD sgd(model.parameters(), {.lr = 0.5});
  CHECK_THROWS_WITH(sgd.load_state_dict(good), Catch::Contains("param_groups.0.momentum"));
  CHECK(sgd.options().lr == 0.5);
}

}  // namespace state_dict_test
