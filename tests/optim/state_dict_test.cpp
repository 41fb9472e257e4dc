// Optimiser state (SGD, Adam, AdamW state_dict / load_state_dict, saved with ts::save): training
// that stops after 3 steps, saves the model, the optimiser and a scheduler to safetensors files,
// and resumes in fresh objects gives the same bits as 6 steps without stopping; a state that does
// not fit is refused, naming the entry, and changes nothing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
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

using Model = decltype(make_mlp());

auto compile_loss(Model& model) {
  return ag::compile(
      [&model](ag::Var<float> in, ag::Var<std::int64_t> labels) {
        return nn::cross_entropy(model.forward(in), labels);
      },
      ag::input<float>({8, 5}), ag::input<std::int64_t>({8}));
}

// A model made from `seed`, its training program, an optimiser and a StepLR over it.
template <class Opt>
struct training_run {
  template <class Options>
  training_run(std::uint64_t seed, const Options& options)
      : model((ts::manual_seed(seed), make_mlp())),
        program(compile_loss(model)),
        opt(model.parameters(), options),
        schedule(opt, 2, 0.5) {}
  training_run(const training_run&) = delete;  // the program holds a reference to `model`

  void train(int steps, const ts::Tensor<float>& x, const ts::Tensor<std::int64_t>& y) {
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      program.forward(x, y);
      program.backward();
      opt.step();
      schedule.step();
    }
  }

  Model model;
  decltype(compile_loss(std::declval<Model&>())) program;
  Opt opt;
  optim::StepLR<Opt> schedule;
};

template <class Opt, class Options>
void resume_is_bit_identical(Options options, const char* name) {
  INFO(name);
  const ts::Tensor<float> x = ts::eval(ts::arange<float>(0, 40).view({8, 5}) / 40.0f);
  const auto y = ts::from_vector<std::int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});

  training_run<Opt> straight(4, options);
  straight.train(6, x, y);

  training_run<Opt> first(4, options);
  first.train(3, x, y);
  const auto dir = std::filesystem::temp_directory_path();
  const std::string tag = std::string("tessera_resume_") + name;
  const auto path = [&](const char* what) { return (dir / (tag + what)).string(); };
  ts::save(first.model.state_dict(), path("_model.safetensors"));
  ts::save(first.opt.state_dict(), path("_optim.safetensors"));
  ts::save(first.schedule.state_dict(), path("_sched.safetensors"));

  training_run<Opt> resumed(99, options);  // other initial values: all must come from the files
  resumed.model.load_state_dict(ts::load(path("_model.safetensors")));
  resumed.opt.load_state_dict(ts::load(path("_optim.safetensors")));
  resumed.schedule.load_state_dict(ts::load(path("_sched.safetensors")));
  resumed.train(3, x, y);
  CHECK(values(resumed.model) == values(straight.model));  // bit for bit
  CHECK(resumed.opt.options().lr == straight.opt.options().lr);
  for (const char* what : {"_model.safetensors", "_optim.safetensors", "_sched.safetensors"}) {
    std::filesystem::remove(path(what));
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

TEST_CASE("parameter groups resume bit for bit and must match", "[optim][state][groups]") {
  const ts::Tensor<float> x = ts::eval(ts::arange<float>(0, 40).view({8, 5}) / 40.0f);
  const auto y = ts::from_vector<std::int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  struct grouped {
    explicit grouped(std::uint64_t seed)
        : model((ts::manual_seed(seed), make_mlp())),
          program(compile_loss(model)),
          opt({{.params = model.get<0>().parameters(), .lr = 0.05},
               {.params = model.get<2>().parameters(), .weight_decay = 0.01}},
              {.lr = 0.01, .betas = {0.8, 0.9}}),
          schedule(opt, 2, 0.5) {}
    void train(int steps, const ts::Tensor<float>& in, const ts::Tensor<std::int64_t>& labels) {
      for (int i = 0; i < steps; ++i) {
        opt.zero_grad();
        program.forward(in, labels);
        program.backward();
        opt.step();
        schedule.step();
      }
    }
    Model model;
    decltype(compile_loss(std::declval<Model&>())) program;
    optim::Adam opt;
    optim::StepLR<optim::Adam> schedule;
  };
  grouped straight(4);
  straight.train(6, x, y);
  grouped first(4);
  first.train(3, x, y);
  const ts::StateDict opt_state = first.opt.state_dict();
  CHECK(opt_state.at("param_groups.1.params").as<std::int64_t>().to_vector() ==
        std::vector<std::int64_t>{2, 3});
  CHECK(opt_state.at("param_groups.0.lr").as<double>().item() == 0.05 * 0.5);
  grouped resumed(99);
  resumed.model.load_state_dict(first.model.state_dict());
  resumed.opt.load_state_dict(opt_state);
  resumed.schedule.load_state_dict(first.schedule.state_dict());
  resumed.train(3, x, y);
  CHECK(values(resumed.model) == values(straight.model));  // bit for bit
  CHECK(resumed.schedule.get_last_lrs() == straight.schedule.get_last_lrs());

  // One group where the state has two: refused, nothing changed.
  auto model = make_mlp();
  optim::Adam single(model.parameters(), {.lr = 0.3});
  CHECK_THROWS_WITH(single.load_state_dict(opt_state),
                    Catch::Contains("2 parameter group(s)") && Catch::Contains("has 1"));
  CHECK(single.options().lr == 0.3);
  // Groups that split the parameters differently: refused, naming the entry.
  optim::Adam other({{.params = model.get<0>().parameters()},
                     {.params = model.get<2>().parameters()}});
  ts::StateDict moved = opt_state;
  moved.insert("param_groups.1.params", ts::from_vector<std::int64_t>({1, 2}, {2}));
  CHECK_THROWS_WITH(other.load_state_dict(moved), Catch::Contains("param_groups.1.params"));
}

}  // namespace state_dict_test
