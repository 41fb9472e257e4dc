// ts::models' ResNets against torchvision (tests/oracles/nn_torch.py, section "resnet"): the
// state-dict keys and shapes of resnet18 and resnet50 one to one, in PyTorch's order; a
// Bottleneck with a strided downsample and a BasicBlock, loaded from safetensors files that
// PyTorch wrote, in training mode (output, the input's and every parameter's gradient, the
// running statistics after the step) and in evaluation mode, in float64; a bfloat16 ResNet-18
// (BatchNorm kept in float) against the float64 model with its rounded weights.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "nn/torch_oracle.hpp"
#include "tessera/models/resnet.hpp"
#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace resnet_test {

namespace ts = tessera;
namespace ag = tessera::autograd;

namespace {

const torch_oracle::file& oracle() {
  static const torch_oracle::file file("resnet");
  return file;
}

/// (key, shape) pairs of a module's state dict, in order.
std::vector<std::pair<std::string, ts::Shape>> entries(const ts::StateDict& dict) {
  std::vector<std::pair<std::string, ts::Shape>> out;
  for (const auto& key : dict.keys()) out.emplace_back(key, dict.at(key).shape());
  return out;
}

std::vector<std::pair<std::string, ts::Shape>> torchvision_entries(const std::string& model) {
  std::vector<std::pair<std::string, ts::Shape>> out;
  const std::string prefix = model + ".key.";
  for (const auto& name : oracle().names_with_prefix(prefix)) {
    ts::Shape shape;
    for (double extent : oracle().at(name).values) shape.push_back(static_cast<std::int64_t>(extent));
    out.emplace_back(name.substr(prefix.size()), shape);
  }
  return out;
}

template <class Block>
void check_block(const std::string& tag, Block block) {
  INFO(tag);
  const std::string file = oracle().path().string() + "." + tag + ".safetensors";
  block.load_state_dict(ts::load(file));
  const auto x = oracle().tensor<double>(tag + ".x");
  const auto gy = oracle().tensor<double>(tag + ".gy");
  auto spec = ag::input<double>(x.shape());
  spec.requires_grad = true;
  auto program = ag::compile(
      [&](const auto& v, const auto& g) {
        ag::Var<double> y = block(v);
        return std::tuple{ts::sum(y * g), y};
      },
      spec, ag::input<double>(gy.shape()));
  block.zero_grad();
  const auto [loss, y] = program.forward(x, gy);
  program.backward();
  constexpr double tol = 1e-10;
  torch_oracle::check_close(y, oracle().at(tag + ".y"), tol, tol);
  torch_oracle::check_close(program.input_grad(0).template as<double>(), oracle().at(tag + ".dx"), tol, tol);
  for (const auto& [key, parameter] : block.named_parameters()) {
    INFO("gradient of " << key);
    torch_oracle::check_close(parameter.grad().template as<double>(),
                              oracle().at(tag + ".grad." + key), tol, tol);
  }
  const ts::StateDict after = block.state_dict();
  for (const auto& name : oracle().names_with_prefix(tag + ".after.")) {
    const std::string key = name.substr((tag + ".after.").size());
    INFO("buffer " << key);
    if (key.size() > 19 && key.substr(key.size() - 19) == "num_batches_tracked") {
      CHECK(after.at(key).as<std::int64_t>().item() == 1);
    } else {
      torch_oracle::check_close(after.at(key).as<double>(), oracle().at(name), tol, tol);
    }
  }
  block.eval();
  const ts::Tensor<double> eval_y = block(x);
  torch_oracle::check_close(eval_y, oracle().at(tag + ".eval_y"), tol, tol);
}

}  // namespace

TEST_CASE("ResNet state dicts match torchvision's keys and shapes one to one", "[resnet][oracle]") {
  const auto r18 = ts::models::resnet18<float>(10);
  CHECK(entries(r18.state_dict()) == torchvision_entries("resnet18"));
  const auto r50 = ts::models::resnet50<float>(10);
  const auto expected = torchvision_entries("resnet50");
  CHECK(expected.size() == 320);
  CHECK(entries(r50.state_dict()) == expected);
}

TEST_CASE("Bottleneck and BasicBlock match torchvision's, weights through safetensors",
          "[resnet][oracle]") {
  check_block("bottleneck", ts::models::Bottleneck<double>(16, 8, 2));
  check_block("basic", ts::models::BasicBlock<double>(6, 6, 1));
}

TEST_CASE("ResNet-18 trains: the loss of a fixed batch falls with SGD", "[resnet]") {
  ts::manual_seed(3);
  auto model = ts::models::resnet18<float>(4);
  const auto x = ts::randn<float>({4, 3, 32, 32});
  const auto labels = ts::from_vector<std::int64_t>({0, 1, 2, 3}, {4});
  auto step = ag::compile(
      [&](const auto& v, const auto& y) { return ts::nn::cross_entropy(model(v), y); },
      ag::input<float>(x.shape()), ag::input<std::int64_t>(labels.shape()));
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    sgd.zero_grad();
    last = step.forward(x, labels).item();
    if (i == 0) first = last;
    step.backward();
    sgd.step();
  }
  INFO("loss " << first << " -> " << last);
  CHECK(first == Approx(std::log(4.0)).epsilon(0.5));
  CHECK(last < 0.5 * first);
}

/// ||actual - expected|| / ||expected||, in float64.
template <class A, class B>
double relative_error(const A& actual, const B& expected) {
  const auto a = actual.to_vector();
  const auto b = expected.to_vector();
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    diff += (x - y) * (x - y);
    norm += y * y;
  }
  return std::sqrt(diff / norm);
}

TEST_CASE("a bfloat16 ResNet keeps BatchNorm in float and tracks the float64 model",
          "[resnet][amp]") {
  // nn::to<ts::bfloat16>(resnet18): convolutions and fc in bfloat16, BatchNorm in float. Against
  // the float64 model holding the same (rounded) weights, on the same (rounded) input, one traced
  // training step and one in evaluation mode: the tolerances are multiples of bfloat16's unit
  // roundoff u = 2^-8.
  using bf16 = ts::bfloat16;
  constexpr double u = 1.0 / 256;
  ts::manual_seed(11);
  const auto model = ts::models::resnet18<double>(10);
  auto low = ts::nn::to<bf16>(model);
  static_assert(std::is_same_v<decltype(low), ts::models::ResNet18<bf16>>);
  static_assert(
      std::is_same_v<std::remove_cvref_t<decltype(low.bn1())>, ts::nn::BatchNorm2d<float>>);
  static_assert(
      std::is_same_v<decltype(ts::models::resnet50<ts::half>()), ts::models::ResNet50<ts::half>>);
  // The weights rounded to nearest even; BatchNorm's values as they were, in float.
  const auto w = model.fc().weight().value().to_vector();
  const auto wl = low.fc().weight().value().to_vector();
  for (std::size_t k = 0; k < w.size(); k += 97) {
    CHECK(static_cast<double>(wl[k]) == static_cast<double>(bf16(w[k])));
  }
  CHECK(low.layer4().get<1>().state_dict().at("bn2.running_var").dtype() ==
        ts::ScalarType::float32);
  auto back = ts::nn::to<double>(low);  // the float64 model with the rounded weights

  const auto x = ts::randn<double>({4, 3, 32, 32}).to<bf16>();
  const auto labels = ts::from_vector<std::int64_t>({0, 3, 5, 9}, {4});
  auto program = ag::compile(
      [&](const ag::Var<bf16>& v, const ag::Var<std::int64_t>& y) {
        return ts::nn::cross_entropy(ts::cast<float>(low(v)), y);  // the loss in float
      },
      ag::input<bf16>(x.shape()), ag::input<std::int64_t>(labels.shape()));
  auto reference =
      ag::compile([&](const ag::Var<double>& v,
                      const ag::Var<std::int64_t>& y) { return ts::nn::cross_entropy(back(v), y); },
                  ag::input<double>(x.shape()), ag::input<std::int64_t>(labels.shape()));
  // Training mode: the batch's statistics. Over 4 values a channel in layer4 (1x1 planes) batch
  // norm's backward cancels most of its terms, so the gradients are compared in evaluation mode.
  const float loss = program.forward(x, labels).item();
  const double expected = reference.forward(x.to<double>(), labels).item();
  CHECK(std::abs(loss - expected) <= 4 * u * expected);
  // The running statistics moved in float as the float64 model's did.
  CHECK(relative_error(low.bn1().running_mean().value(), back.bn1().running_mean().value()) <=
        4 * u);
  CHECK(relative_error(low.layer4().get<1>().state_dict().at("bn2.running_var").as<float>(),
                       back.layer4().get<1>().state_dict().at("bn2.running_var").as<double>()) <=
        4 * u);
  // Evaluation mode (the same programs: the mode is read at each forward): the logits, and the
  // gradients through every layer's backward in bfloat16.
  low.eval();
  back.eval();
  const double eval_error = relative_error(low(x), back(x.to<double>()));
  INFO("logits in evaluation mode: relative error " << eval_error);
  CHECK(eval_error <= 8 * u);
  (void)program.forward(x, labels);
  program.backward();
  (void)reference.forward(x.to<double>(), labels);
  reference.backward();
  const double fc_error = relative_error(low.fc().weight().grad(), back.fc().weight().grad());
  const double conv_error =
      relative_error(low.conv1().weight().grad(), back.conv1().weight().grad());
  const double bn_error = relative_error(low.bn1().weight().grad(), back.bn1().weight().grad());
  INFO("gradients' relative errors: fc.weight " << fc_error << ", conv1.weight " << conv_error
                                                << ", bn1.weight " << bn_error);
  // float32 against float64 gives about 10 of its own u for these three; storing every
  // activation and gradient in bfloat16 adds to it: about 2, 39 and 26 u measured.
  CHECK(fc_error <= 8 * u);
  CHECK(conv_error <= 64 * u);
  CHECK(bn_error <= 64 * u);
}

TEST_CASE("a ResNet replicates onto another device and computes the same", "[resnet]") {
  // CTest runs this with TESSERA_CPU_DEVICES=2; fewer devices is a failure, not a skip.
  REQUIRE(ts::cpu::device_count() >= 2);
  ts::manual_seed(5);
  auto model = ts::models::resnet18<double>(3);
  const auto x = ts::randn<double>({2, 3, 32, 32});
  // Give the running statistics values of their own (training steps), then compare in eval.
  (void)model(x);
  (void)model(x * 2.0);
  model.eval();
  auto replica = ts::parallel::replicate(model, 1);
  CHECK(replica.conv1().weight().value().device() == ts::Device::parse("cpu:1"));
  CHECK_FALSE(replica.is_training());
  const auto expected = model(x).to_vector();
  const auto actual = replica(x.to(1)).to_vector();
  CHECK(actual == expected);
  // Independent: a change to the copy leaves the original alone.
  replica.fc().bias().value().fill_(7.0);
  CHECK(model(x).to_vector() == expected);
}

TEST_CASE("sequential() and blocks() are the model's layers, flat, sharing its parameters",
          "[resnet]") {
  ts::manual_seed(6);
  auto model = ts::models::resnet18<double>(3);
  const auto x = ts::randn<double>({2, 3, 32, 32});
  // Training mode: each forward normalises with the batch's statistics, so the running
  // statistics the forwards update (shared buffers) do not change the outputs.
  const auto expected = model(x).to_vector();
  auto six = model.sequential();
  auto flat = model.blocks();
  STATIC_REQUIRE(decltype(six)::size() == 6);
  STATIC_REQUIRE(decltype(flat)::size() == 10);  // stem, 2 + 2 + 2 + 2 blocks, head
  CHECK(six(x).to_vector() == expected);
  CHECK(flat(x).to_vector() == expected);
  CHECK(flat.parameters().size() == model.parameters().size());
  const auto keys = flat.state_dict().keys();
  const auto has = [&](const std::string& key) {
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  };
  CHECK(keys.front() == "0.conv1.weight");
  CHECK(has("1.conv2.weight"));         // layer1.0
  CHECK(has("3.downsample.0.weight"));  // layer2.0, the first block with a stride
  CHECK(has("8.bn2.running_var"));      // layer4.1
  CHECK(has("9.fc.bias"));
  CHECK_FALSE(has("2.downsample.0.weight"));
  // Shared: a change to the model's parameter is the flat modules' too.
  model.fc().bias().value().fill_(0.5);
  const auto changed = model(x).to_vector();
  CHECK(changed != expected);
  CHECK(flat(x).to_vector() == changed);
  CHECK(six(x).to_vector() == changed);
  // replicate (what balance_by_time times) copies every piece, the stem and the head included:
  // the same outputs on another device, and a change to the copy stays there.
  auto copy = ts::parallel::replicate(flat, 1);
  CHECK(copy(x.to(1)).to_vector() == changed);
  copy.state_dict().at("9.fc.bias").as<double>().fill_(9.0);
  copy.state_dict().at("0.conv1.weight").as<double>().fill_(0.0);
  CHECK(flat(x).to_vector() == changed);
  CHECK(copy(x.to(1)).to_vector() != changed);
}

}  // namespace resnet_test
