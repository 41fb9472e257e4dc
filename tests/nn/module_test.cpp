// The Module machinery (nn/module.hpp, parameter.hpp, buffer.hpp, sequential.hpp): registration
// names and order, state_dict keys, load_state_dict (strict errors, the data-parallel prefix both
// ways, nothing changed on error), to(i) in place and to<Kind>, train/eval, zero_grad, copying
// modules (handles that alias, never dangle), parameter allocation sizes, and a user model.
// Expected names and orders are PyTorch's (written out by hand from torch.nn behaviour).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/tessera.hpp"

namespace module_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace nn = tessera::nn;

namespace {

const ts::Device cpu0 = ts::Device::parse("cpu:0");
const ts::Device cpu1 = ts::Device::parse("cpu:1");

template <class Items>
std::vector<std::string> names_of(const Items& items) {
  std::vector<std::string> names;
  for (const auto& item : items) names.push_back(item.first);
  return names;
}

std::vector<std::string> keys_of(const ts::StateDict& dict) { return dict.keys(); }

template <class T>
std::vector<T> values(const ts::AnyTensor& t) {
  return t.as<T>().to_vector();
}

// A user model in a few lines: members, a constructor that registers them, a templated forward.
template <class K = ts::cpu>
struct Net : nn::Module {
  nn::Linear<float, K> fc1{4, 8};
  nn::BatchNorm1d<float, K> bn{8};
  nn::Linear<float, K> fc2{8, 3};
  nn::ReLU relu;

  Net() : Module("Net") {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
  }
  template <class X>
  auto forward(const X& x) const {
    return fc2(relu(bn(fc1(x))));
  }
};

// A model with its own parameter and buffer next to a child.
struct Custom : nn::Module {
  nn::Parameter<float> scale{ts::full<float>({2}, 2.0f)};
  nn::Buffer<float> counter{ts::zeros<float>({1})};
  nn::Linear<float> inner{2, 2};
  Custom() : Module("Custom") {
    register_module("inner", inner);
    register_parameter("scale", scale);
    register_buffer("counter", counter);
  }
};

// What a data-parallel wrapper looks like to load_state_dict: the model is its child "module".
struct Wrapper : nn::Module {
  Net<> module;
  Wrapper() : Module("Wrapper") { register_module("module", module); }
};

}  // namespace

TEST_CASE("named_parameters and state_dict use PyTorch's names and order", "[module]") {
  Net<> net;
  CHECK(names_of(net.named_parameters()) == std::vector<std::string>{"fc1.weight", "fc1.bias",
                                                                     "bn.weight", "bn.bias",
                                                                     "fc2.weight", "fc2.bias"});
  CHECK(net.parameters().size() == 6);
  CHECK(names_of(net.named_buffers()) ==
        std::vector<std::string>{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"});
  // state_dict: per module its parameters, then its buffers, then its children.
  CHECK(keys_of(net.state_dict()) ==
        std::vector<std::string>{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                                 "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
                                 "fc2.weight", "fc2.bias"});
  CHECK(names_of(net.named_children()) == std::vector<std::string>{"fc1", "bn", "fc2"});
  CHECK(names_of(net.named_modules()) == std::vector<std::string>{"", "fc1", "bn", "fc2"});

  // Own parameters come before children's whatever the registration order (PyTorch's order).
  Custom custom;
  CHECK(names_of(custom.named_parameters()) ==
        std::vector<std::string>{"scale", "inner.weight", "inner.bias"});
  CHECK(keys_of(custom.state_dict()) ==
        std::vector<std::string>{"scale", "counter", "inner.weight", "inner.bias"});
  CHECK(names_of(custom.named_parameters(false)) == std::vector<std::string>{"scale"});

  // The state dict shares storage with the module (as PyTorch's detached views).
  auto dict = net.state_dict();
  CHECK(dict.at("fc1.weight").storage().is_same(net.fc1.weight().value().storage()));
  CHECK(dict.at("bn.num_batches_tracked").dtype() == ts::ScalarType::int64);
  CHECK(dict.at("bn.num_batches_tracked").dim() == 0);
}

TEST_CASE("Sequential names children by position, plain layers included", "[module][sequential]") {
  auto seq = nn::Sequential(nn::Linear<float>(4, 8), nn::ReLU{}, nn::Dropout(0.1),
                            nn::Linear<float>(8, 2, false), nn::Flatten{});
  static_assert(
      std::is_same_v<decltype(seq), nn::Sequential<nn::Linear<float>, nn::ReLU, nn::Dropout,
                                                   nn::Linear<float>, nn::Flatten>>);
  static_assert(decltype(seq)::size() == 5);
  CHECK(names_of(seq.named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "3.weight"});
  CHECK(names_of(seq.named_children()) == std::vector<std::string>{"0", "2", "3"});
  CHECK(seq.get<3>().weight().shape() == ts::Shape{2, 8});

  // Nested: the inner Sequential is child "1".
  auto nested = nn::Sequential(nn::Linear<float>(2, 2), nn::Sequential(nn::Linear<float>(2, 2)));
  CHECK(keys_of(nested.state_dict()) ==
        std::vector<std::string>{"0.weight", "0.bias", "1.0.weight", "1.0.bias"});

  // The forward chains the layers: compare with the layers applied by hand.
  auto x = ts::randn<float>({3, 4});
  seq.eval();
  ts::Tensor<float> y = seq(x);
  ts::Tensor<float> hidden = ts::relu(seq.get<0>()(x));
  ts::Tensor<float> expected = seq.get<3>()(hidden);
  CHECK(y.to_vector() == expected.to_vector());
}

TEST_CASE("registration errors name the problem", "[module]") {
  Custom custom;
  nn::Linear<float> other(2, 2);
  CHECK_THROWS_WITH(custom.register_module("inner", other),
                    Catch::Contains("'inner' is already registered in Custom"));
  CHECK_THROWS_WITH(custom.register_module("a.b", other), Catch::Contains("contains '.'"));
  CHECK_THROWS_WITH(custom.register_module("", other), Catch::Contains("name is empty"));
  nn::Parameter<float> p(ts::zeros<float>({1}));
  CHECK_THROWS_WITH(custom.register_parameter("counter", p),
                    Catch::Contains("'counter' is already registered"));
  // A module cannot contain itself.
  Custom outer;
  outer.register_module("child", custom);
  CHECK_THROWS_WITH(custom.register_module("parent", outer), Catch::Contains("its own descendant"));
  CHECK_THROWS_WITH(custom.register_module("self", custom), Catch::Contains("its own descendant"));
  CHECK(custom.named_children().size() == 1);
}

TEST_CASE("a parameter shared by two children is listed once, saved under both names", "[module]") {
  struct Tied : nn::Module {
    nn::Linear<float> a{3, 3}, b{3, 3};
    Tied() {
      register_module("a", a);
      register_module("b", b);
      register_module("a_again", a);
    }
  } tied;
  CHECK(names_of(tied.named_parameters()) ==
        std::vector<std::string>{"a.weight", "a.bias", "b.weight", "b.bias"});
  CHECK(tied.state_dict().size() == 6);
  CHECK(tied.state_dict().contains("a_again.weight"));
  CHECK(names_of(tied.named_modules()) == std::vector<std::string>{"", "a", "b"});
}

TEST_CASE("load_state_dict copies in place and keeps parameter identity", "[module][load]") {
  Net<> source, target;
  source.train();
  ts::Tensor<float> trained = source.forward(ts::randn<float>({6, 4}));  // moves bn's statistics
  (void)trained;
  const auto weight_storage = target.fc1.weight().value().storage();
  const void* weight_id = nn::ParameterRef(target.fc1.weight()).id();
  target.load_state_dict(source.state_dict());
  CHECK(target.fc1.weight().value().storage().is_same(weight_storage));
  CHECK(nn::ParameterRef(target.fc1.weight()).id() == weight_id);
  for (const auto& [key, value] : source.state_dict()) {
    INFO(key);
    const auto mine = target.state_dict().at(key);
    if (value.dtype() == ts::ScalarType::int64) {
      CHECK(values<std::int64_t>(mine) == values<std::int64_t>(value));
    } else {
      CHECK(values<float>(mine) == values<float>(value));
    }
  }
  CHECK(values<std::int64_t>(target.state_dict().at("bn.num_batches_tracked")) ==
        std::vector<std::int64_t>{1});
  // The source is a copy, not an alias.
  target.fc1.weight().value().fill_(7.0f);
  CHECK(source.fc1.weight().value().to_vector()[0] != 7.0f);
}

TEST_CASE("strict load lists every missing and unexpected key; nothing changes on error",
          "[module][load]") {
  Net<> net;
  std::map<std::string, std::vector<float>> before;
  for (const auto& [key, value] : net.state_dict()) {
    if (value.dtype() == ts::ScalarType::float32) before[key] = values<float>(value);
  }
  auto unchanged = [&] {
    for (const auto& [key, value] : before) {
      INFO(key);
      CHECK(values<float>(net.state_dict().at(key)) == value);
    }
  };

  // A dict of another model: fc2 missing, a layer the model has not.
  ts::StateDict partial;
  Net<> other;
  for (const auto& [key, value] : other.state_dict()) {
    if (key.rfind("fc2.", 0) != 0) partial.insert(key, value);
  }
  partial.insert("fc3.weight", ts::zeros<float>({2, 2}));
  partial.insert("extra", ts::zeros<float>({1}));
  try {
    net.load_state_dict(partial);
    FAIL("no error");
  } catch (const ts::error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK_THAT(message, Catch::Contains("into Net"));
    CHECK_THAT(message, Catch::Contains("missing key(s): \"fc2.weight\", \"fc2.bias\""));
    CHECK_THAT(message, Catch::Contains("unexpected key(s): \"fc3.weight\", \"extra\""));
  }
  unchanged();  // fc1 and bn were loadable but not loaded

  // Non-strict: the keys that match are loaded, the others ignored.
  net.load_state_dict(partial, false);
  CHECK(values<float>(net.state_dict().at("fc1.weight")) ==
        values<float>(other.state_dict().at("fc1.weight")));
  CHECK(values<float>(net.state_dict().at("fc2.weight")) == before["fc2.weight"]);
}

TEST_CASE("shape and dtype mismatches name the key and both shapes or dtypes", "[module][load]") {
  nn::Linear<float> lin(3, 2);
  const auto weight = lin.weight().value().to_vector();
  ts::StateDict wrong_shape{{"weight", ts::zeros<float>({2, 4})}, {"bias", ts::zeros<float>({2})}};
  CHECK_THROWS_AS(lin.load_state_dict(wrong_shape), ts::shape_error);
  CHECK_THROWS_WITH(lin.load_state_dict(wrong_shape),
                    Catch::Contains("size mismatch for weight: shape [2, 4] in the state dict, "
                                    "[2, 3] in the module"));
  // Non-strict loading still refuses a mismatch, and loads nothing (not even the good bias).
  CHECK_THROWS_AS(lin.load_state_dict(wrong_shape, false), ts::shape_error);
  CHECK(lin.weight().value().to_vector() == weight);
  CHECK(lin.bias().value().to_vector() != std::vector<float>{0, 0});

  ts::StateDict wrong_dtype{{"weight", ts::zeros<double>({2, 3})}, {"bias", ts::zeros<float>({2})}};
  CHECK_THROWS_AS(lin.load_state_dict(wrong_dtype), ts::dtype_error);
  CHECK_THROWS_WITH(lin.load_state_dict(wrong_dtype),
                    Catch::Contains("dtype mismatch for weight: float64 in the state dict, "
                                    "float32 in the module"));
  CHECK(lin.weight().value().to_vector() == weight);
}

TEST_CASE("a DataParallel-saved dict loads into the plain model, and the other way round",
          "[module][load]") {
  Net<> plain;
  Wrapper wrapped;
  CHECK(keys_of(wrapped.state_dict())[0] == "module.fc1.weight");

  // Prefixed dict -> plain model.
  plain.load_state_dict(wrapped.state_dict());
  CHECK(values<float>(plain.state_dict().at("fc2.bias")) ==
        values<float>(wrapped.state_dict().at("module.fc2.bias")));

  // Plain dict -> prefixed model.
  Net<> fresh;
  wrapped.load_state_dict(fresh.state_dict());
  CHECK(values<float>(wrapped.state_dict().at("module.fc1.weight")) ==
        values<float>(fresh.state_dict().at("fc1.weight")));

  // Strict errors report the dict's own key names.
  ts::StateDict prefixed;
  for (const auto& [key, value] : fresh.state_dict()) prefixed.insert("module." + key, value);
  prefixed.erase("module.fc2.bias");
  prefixed.insert("module.head.weight", ts::zeros<float>({1}));
  CHECK_THROWS_WITH(plain.load_state_dict(prefixed),
                    Catch::Contains("missing key(s): \"fc2.bias\"") &&
                        Catch::Contains("unexpected key(s): \"module.head.weight\""));
}

TEST_CASE("load_state_dict takes tensors from another device", "[module][load]") {
  nn::Linear<float> lin(3, 2);
  nn::Linear<float> far(3, 2, true, 1);
  lin.load_state_dict(far.state_dict());
  CHECK(lin.weight().device() == cpu0);
  CHECK(lin.weight().value().to_vector() == far.weight().value().to_vector());
}

TEST_CASE("to(i) moves in place: same parameter slots, values on the new device", "[module][to]") {
  REQUIRE(ts::cpu::device_count() >= 2);  // TESSERA_CPU_DEVICES=2
  Net<> net;
  net.fc1.weight().grad() = ts::ones<float>({8, 4});
  const auto parameters = net.parameters();
  const auto weight = net.fc1.weight().value().to_vector();
  const auto running_var = net.bn.running_var().value().to_vector();
  const auto before1 = ts::memory::allocated(cpu1);

  net.to(1);
  CHECK(net.parameters() == parameters);  // identity: the same slots
  for (const auto& p : net.parameters()) CHECK(p.device() == cpu1);
  for (const auto& b : net.buffers()) CHECK(b.value().device() == cpu1);
  CHECK(net.fc1.weight().value().to_vector() == weight);
  CHECK(net.fc1.weight().grad().device() == cpu1);  // the gradient moves along
  CHECK(net.fc1.weight().grad().to_vector() == std::vector<float>(32, 1.0f));
  CHECK(net.bn.running_var().value().to_vector() == running_var);
  CHECK(ts::memory::allocated(cpu1) > before1);

  // A forward on the new device; an input left on cpu:0 is a device mismatch.
  ts::Tensor<float> y = net.forward(ts::randn<float>({5, 4}, 1));
  CHECK(y.device() == cpu1);
  CHECK_THROWS_AS(net.forward(ts::randn<float>({5, 4}, 0)), ts::device_mismatch_error);

  // An ordinal that does not exist moves nothing.
  CHECK_THROWS_AS(net.to(5), ts::device_error);
  for (const auto& p : net.parameters()) CHECK(p.device() == cpu1);
  net.to(0);
  CHECK(net.fc1.weight().device() == cpu0);
}

TEST_CASE("to<Kind>(i) returns a converted module; an alias when nothing would move",
          "[module][to]") {
  Net<> net;
  net.fc1.weight().requires_grad_(false);
  net.bn.eval();
  ts::Tensor<float> warm = net.forward(ts::randn<float>({4, 4}));
  (void)warm;

  // Already there: the same module, as Tensor::to.
  auto same = nn::to<ts::cpu>(net, 0);
  static_assert(std::is_same_v<decltype(same), Net<ts::cpu>>);
  CHECK(same.is_same(net));

  // Another ordinal: an independent copy with the values, flags and modes.
  const auto draws = ts::default_generator(cpu1).offset();
  auto replica = nn::to<ts::cpu>(net, 1);
  CHECK(ts::default_generator(cpu1).offset() == draws);  // initialisation was skipped
  CHECK_FALSE(replica.is_same(net));
  CHECK(replica.fc1.weight().device() == cpu1);
  CHECK(replica.bn.running_mean().value().device() == cpu1);
  CHECK(replica.fc1.weight().value().to_vector() == net.fc1.weight().value().to_vector());
  CHECK_FALSE(replica.fc1.weight().requires_grad());
  CHECK(replica.fc2.weight().requires_grad());
  CHECK(replica.is_training());
  CHECK_FALSE(replica.bn.is_training());
  replica.fc2.bias().value().fill_(3.0f);
  CHECK(net.fc2.bias().value().to_vector() != std::vector<float>(3, 3.0f));

  // The same input gives the same output on both replicas.
  auto x = ts::randn<float>({5, 4});
  net.eval();
  replica.eval();
  ts::Tensor<float> a = net.forward(x);
  replica.fc2.load_state_dict(net.fc2.state_dict());
  ts::Tensor<float> b = replica.forward(x.to(1));
  CHECK(a.to_vector() == b.to_vector());

  // Layers convert with their member to<Kind>; a Sequential converts every layer.
  nn::Linear<float> lin(3, 2);
  auto lin1 = lin.to<ts::cpu>(1);
  static_assert(std::is_same_v<decltype(lin1), nn::Linear<float, ts::cpu>>);
  CHECK(lin1.weight().device() == cpu1);
  auto seq = nn::Sequential(nn::Linear<float>(2, 3), nn::ReLU{}, nn::BatchNorm1d<float>(3));
  auto seq1 = seq.to<ts::cpu>(1);
  CHECK(keys_of(seq1.state_dict()) == keys_of(seq.state_dict()));
  for (const auto& [key, value] : seq1.state_dict()) CHECK(value.device() == cpu1);

  // The CUDA types exist whether or not a GPU does; without one the conversion throws.
  using CudaNet = ts::nn::rebind_kind_t<Net<>, ts::cuda>;
  static_assert(std::is_same_v<CudaNet, Net<ts::cuda>>);
  static_assert(
      std::is_same_v<
          ts::nn::rebind_kind_t<decltype(seq), ts::cuda>,
          nn::Sequential<nn::Linear<float, ts::cuda>, nn::ReLU, nn::BatchNorm1d<float, ts::cuda>>>);
  if (!ts::cuda::is_available()) {
    CHECK_THROWS_AS(nn::to<ts::cuda>(net, 0), ts::device_error);
    CHECK_THROWS_AS(lin.to<ts::cuda>(0), ts::device_error);
  }
}

TEST_CASE("train and eval reach every descendant", "[module]") {
  Net<> net;
  CHECK(net.is_training());
  net.eval();
  CHECK_FALSE(net.is_training());
  CHECK_FALSE(net.fc1.is_training());
  CHECK_FALSE(net.bn.is_training());
  net.bn.train();
  CHECK(net.bn.is_training());
  CHECK_FALSE(net.is_training());
  net.train();
  CHECK(net.fc2.is_training());
  auto seq = nn::Sequential(nn::Dropout(0.5), nn::Linear<float>(2, 2));
  seq.eval();
  CHECK_FALSE(seq.get<0>().is_training());
}

TEST_CASE("zero_grad zeroes existing gradients in place and allocates nothing", "[module]") {
  Net<> net;
  net.fc1.weight().grad() = ts::ones<float>({8, 4});
  net.fc2.bias().grad() = ts::full<float>({3}, 5.0f);
  const auto grad_storage = net.fc1.weight().grad().storage();
  const auto running_mean = net.bn.running_mean().value().to_vector();
  net.bn.running_mean().value().fill_(2.0f);
  const auto count = ts::memory::stats(cpu0).allocations.allocated;
  const auto bytes = ts::memory::allocated(cpu0);
  net.zero_grad();
  CHECK(ts::memory::stats(cpu0).allocations.allocated == count);
  CHECK(ts::memory::allocated(cpu0) == bytes);
  CHECK(net.fc1.weight().grad().storage().is_same(grad_storage));
  CHECK(net.fc1.weight().grad().to_vector() == std::vector<float>(32, 0.0f));
  CHECK(net.fc2.bias().grad().to_vector() == std::vector<float>(3, 0.0f));
  CHECK_FALSE(net.fc2.weight().grad().defined());  // no gradient stays no gradient
  CHECK(net.bn.running_mean().value().to_vector() == std::vector<float>(8, 2.0f));  // buffers kept
  (void)running_mean;
}

TEST_CASE("modules are handles: copies alias, nothing dangles, nothing is re-pointed",
          "[module][copy]") {
  static_assert(std::is_copy_constructible_v<Net<>>);
  static_assert(!std::is_copy_assignable_v<Net<>>);
  static_assert(!std::is_copy_assignable_v<nn::Linear<float>>);
  static_assert(!std::is_copy_assignable_v<nn::Parameter<float>>);
  static_assert(std::is_copy_assignable_v<nn::ParameterRef>);

  std::vector<nn::ParameterRef> original_parameters;
  std::vector<Net<>> models;
  {
    Net<> net;
    original_parameters = net.parameters();
    Net<> copy = net;               // copy: aliases
    Net<> moved = std::move(copy);  // a move copies the handle too: `copy` stays usable
    CHECK(copy.parameters() == original_parameters);
    CHECK(moved.parameters() == original_parameters);
    CHECK(moved.is_same(net));
    moved.eval();
    CHECK_FALSE(net.bn.is_training());
    moved.fc1.weight().value().fill_(1.5f);
    CHECK(net.fc1.weight().value().to_vector() == std::vector<float>(32, 1.5f));
    models.push_back(net);
    models.push_back(std::move(net));
    for (int i = 0; i < 10; ++i) models.push_back(models.front());  // vector growth copies
  }
  // The originals are gone; the copies' registries and members still agree.
  for (auto& model : models) {
    CHECK(model.parameters() == original_parameters);
    CHECK(nn::ParameterRef(model.fc1.weight()) == original_parameters[0]);
    ts::Tensor<float> y = model.forward(ts::randn<float>({2, 4}));
    CHECK(y.shape() == ts::Shape{2, 3});
  }
  // A Sequential built from layers shares them with the caller's copies.
  nn::Linear<float> layer(2, 2);
  auto seq = nn::Sequential(layer);
  CHECK(seq.parameters()[0] == nn::ParameterRef(layer.weight()));
}

TEST_CASE("ParameterRef: values, gradients, typed access and identity", "[module][parameter]") {
  nn::Parameter<float> p(ts::arange<float>(0, 6).view({2, 3}));
  nn::ParameterRef ref = p;
  CHECK(ref.dtype() == ts::ScalarType::float32);
  CHECK(ref.device_type() == ts::DeviceType::cpu);
  CHECK(ref.shape() == ts::Shape{2, 3});
  CHECK(ref.numel() == 6);
  CHECK(ref.value().storage().is_same(p.value().storage()));
  CHECK_FALSE(ref.grad().defined());
  CHECK(ref.requires_grad());
  ref.requires_grad_(false);
  CHECK_FALSE(p.requires_grad());

  ref.set_grad(ts::ones<float>({2, 3}));
  CHECK(p.grad().to_vector() == std::vector<float>(6, 1.0f));
  CHECK_THROWS_AS(ref.set_grad(ts::ones<float>({3, 2})), ts::shape_error);
  CHECK_THROWS_AS(ref.set_grad(ts::ones<double>({2, 3})), ts::dtype_error);
  CHECK_THROWS_AS(ref.set_grad(ts::ones<float>({2, 3}, 1)), ts::device_mismatch_error);
  ref.set_grad(ts::AnyTensor());
  CHECK_FALSE(p.grad().defined());

  auto typed = ref.as<float>();
  CHECK(typed.is_same(p));
  CHECK_THROWS_AS(ref.as<double>(), ts::dtype_error);
  CHECK_THROWS_AS((ref.as<float, ts::cuda>()), ts::device_mismatch_error);
  nn::ParameterRef copy = ref;
  CHECK(copy == ref);
  CHECK(copy.id() == ref.id());
  CHECK_FALSE(nn::ParameterRef(nn::Parameter<float>(ts::zeros<float>({1}))) == ref);
  CHECK(std::hash<nn::ParameterRef>{}(copy) == std::hash<nn::ParameterRef>{}(ref));
  CHECK_THROWS_AS(nn::ParameterRef().value(), ts::error);

  // like(x) gives the value for eager inputs (tensors and lazy expressions).
  auto x = ts::ones<float>({2, 3});
  CHECK(p.like(x).storage().is_same(p.value().storage()));
  CHECK(p.like(x * 2).storage().is_same(p.value().storage()));
}

TEST_CASE("parameters allocate exactly their rounded sizes", "[module][memory]") {
  const auto base = ts::memory::allocated(cpu0);
  const auto count = ts::memory::stats(cpu0).allocations.allocated;
  {
    nn::Linear<float> one(1, 1, false);  // 4 bytes -> one 512-byte block
    CHECK(ts::memory::allocated(cpu0) - base == 512);
    CHECK(ts::memory::stats(cpu0).allocations.allocated - count == 1);
  }
  CHECK(ts::memory::allocated(cpu0) == base);
  {
    nn::Linear<float> wide(129, 1, false);  // 516 bytes -> 1024
    CHECK(ts::memory::allocated(cpu0) - base == 1024);
  }
  {
    nn::Linear<float> with_bias(129, 1);  // 1024 + 512
    CHECK(ts::memory::allocated(cpu0) - base == 1536);
    nn::Linear<double> big(64, 32);  // 16 KiB weight + 256 B bias -> 16384 + 512
    CHECK(ts::memory::allocated(cpu0) - base == 1536 + 16384 + 512);
  }
  CHECK(ts::memory::allocated(cpu0) == base);
}

TEST_CASE("Linear's initialisation is PyTorch's bound from the seeded Philox stream",
          "[module][init]") {
  ts::manual_seed(7);
  nn::Linear<double> a(50, 40);
  ts::manual_seed(7);
  nn::Linear<double> b(50, 40);
  CHECK(a.weight().value().to_vector() == b.weight().value().to_vector());
  CHECK(a.bias().value().to_vector() == b.bias().value().to_vector());

  // Weight then bias are uniform fills of the generator's stream, mapped to [-1/sqrt(50), ...).
  ts::manual_seed(7);
  const auto u = ts::rand<double>({40 * 50 + 40}).to_vector();
  const double bound = 1.0 / std::sqrt(50.0);
  const auto w = a.weight().value().to_vector();
  const auto bias = a.bias().value().to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    worst = std::max(worst, std::abs(w[i] - (-bound + 2 * bound * u[i])));
  }
  CHECK(worst < 1e-15);
  // The bias draws after the weight's blocks (2 doubles per block, 2000 is even).
  worst = 0;
  for (std::size_t i = 0; i < bias.size(); ++i) {
    worst = std::max(worst, std::abs(bias[i] - (-bound + 2 * bound * u[w.size() + i])));
  }
  CHECK(worst < 1e-15);
  // The spread: every value within the bound, and the sample variance near bound^2 / 3.
  double sum = 0, squares = 0;
  for (double v : w) {
    CHECK(std::abs(v) < bound);
    sum += v;
    squares += v * v;
  }
  const double n = static_cast<double>(w.size());
  const double variance = squares / n - (sum / n) * (sum / n);
  CHECK(variance == Approx(bound * bound / 3).epsilon(0.1));

  // Another seed, other values.
  ts::manual_seed(8);
  nn::Linear<double> c(50, 40);
  CHECK(c.weight().value().to_vector() != a.weight().value().to_vector());
}

TEST_CASE("nn::to<half> converts a model; BatchNorm stays float and converts at its boundary",
          "[module][amp]") {
  namespace ag = tessera::autograd;
  ts::manual_seed(12);
  auto model = nn::Sequential(nn::Linear<float>(6, 8), nn::BatchNorm1d<float>(8), nn::ReLU{},
                              nn::Linear<float>(8, 3));
  auto low = nn::to<ts::half>(model);
  static_assert(
      std::is_same_v<decltype(low), nn::Sequential<nn::Linear<ts::half>, nn::BatchNorm1d<float>,
                                                   nn::ReLU, nn::Linear<ts::half>>>);
  static_assert(
      std::is_same_v<decltype(model.get<0>().to<ts::bfloat16>()), nn::Linear<ts::bfloat16>>);
  static_assert(std::is_same_v<decltype(model.to<double>()),
                               nn::Sequential<nn::Linear<double>, nn::BatchNorm1d<float>, nn::ReLU,
                                              nn::Linear<double>>>);
  // The values rounded to nearest even; BatchNorm copied as it is, and independent.
  const auto w = model.get<3>().weight().value().to_vector();
  const auto wh = low.get<3>().weight().value().to_vector();
  REQUIRE(wh.size() == w.size());
  for (std::size_t k = 0; k < w.size(); ++k) {
    CHECK(static_cast<float>(wh[k]) == static_cast<float>(ts::half(w[k])));
  }
  CHECK(low.get<1>().running_var().value().to_vector() == std::vector<float>(8, 1.0f));
  low.get<1>().weight().value().fill_(2.0f);
  CHECK(model.get<1>().weight().value().to_vector() == std::vector<float>(8, 1.0f));
  model.eval();
  CHECK_FALSE(nn::to<ts::half>(model).get<1>().is_training());  // modes kept
  model.train();

  // Eager forward (training mode: batch statistics) against float64 from the half model's
  // own values.
  const ts::Tensor<ts::half> x = ts::randn<float>({5, 6}).to<ts::half>();
  const ts::Tensor<ts::half> y = low(x);
  auto doubles = [](const auto& t) {
    std::vector<double> out;
    for (const auto& v : t.to_vector()) out.push_back(static_cast<double>(static_cast<float>(v)));
    return out;
  };
  const auto xd = doubles(x), w1 = doubles(low.get<0>().weight().value()),
             b1 = doubles(low.get<0>().bias().value()), w2 = doubles(low.get<3>().weight().value()),
             b2 = doubles(low.get<3>().bias().value());
  std::vector<double> h(5 * 8), out(5 * 3);
  for (int n = 0; n < 5; ++n) {
    for (int j = 0; j < 8; ++j) {
      double sum = b1[static_cast<std::size_t>(j)];
      for (int i = 0; i < 6; ++i)
        sum += xd[static_cast<std::size_t>(n * 6 + i)] * w1[static_cast<std::size_t>(j * 6 + i)];
      h[static_cast<std::size_t>(n * 8 + j)] = sum;
    }
  }
  for (int j = 0; j < 8; ++j) {  // batch statistics, biased variance, eps 1e-5, weight 2, bias 0
    double mean = 0, var = 0;
    for (int n = 0; n < 5; ++n) mean += h[static_cast<std::size_t>(n * 8 + j)] / 5;
    for (int n = 0; n < 5; ++n) {
      const double d = h[static_cast<std::size_t>(n * 8 + j)] - mean;
      var += d * d / 5;
    }
    for (int n = 0; n < 5; ++n) {
      double& v = h[static_cast<std::size_t>(n * 8 + j)];
      v = std::max(0.0, 2.0 * (v - mean) / std::sqrt(var + 1e-5));
    }
  }
  for (int n = 0; n < 5; ++n) {
    for (int k = 0; k < 3; ++k) {
      double sum = b2[static_cast<std::size_t>(k)];
      for (int j = 0; j < 8; ++j)
        sum += h[static_cast<std::size_t>(n * 8 + j)] * w2[static_cast<std::size_t>(k * 8 + j)];
      out[static_cast<std::size_t>(n * 3 + k)] = sum;
    }
  }
  const auto got = doubles(y);
  REQUIRE(got.size() == out.size());
  for (std::size_t k = 0; k < out.size(); ++k) {
    INFO("element " << k);
    CHECK(std::abs(got[k] - out[k]) <= 2e-2 * (1 + std::abs(out[k])));  // half roundings
  }
  CHECK(low.get<1>().num_batches_tracked().value().item() == 1);  // the float statistics moved
  const auto mean = low.get<1>().running_mean().value().to_vector();
  CHECK(std::any_of(mean.begin(), mean.end(), [](float v) { return v != 0.0f; }));

  // Traced training of the half model (float BatchNorm inside) with the scaler.
  low.get<1>().weight().value().fill_(1.0f);
  auto step = ag::compile(
      [&low](ag::Var<ts::half> in, ag::Var<std::int64_t> labels) {
        return nn::cross_entropy(ts::cast<float>(low.forward(in)), labels);
      },
      ag::input<ts::half>({16, 6}), ag::input<std::int64_t>({16}));
  ts::optim::Adam adam(low.parameters(), {.lr = 0.02});
  ts::optim::GradScaler scaler;
  const ts::Tensor<ts::half> inputs = ts::randn<float>({16, 6}).to<ts::half>();
  std::vector<std::int64_t> labels(16);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int64_t>(i % 3);
  const auto targets = ts::from_vector<std::int64_t>(labels, {16});
  float first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    adam.zero_grad();
    last = step.forward(inputs, targets).item();
    if (i == 0) first = last;
    step.backward(scaler);
    scaler.step(adam);
    scaler.update();
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5f * first);
  CHECK(adam.master_weight(0).dtype() == ts::ScalarType::float32);  // Linear<half>'s weight
  CHECK_FALSE(adam.master_weight(2).defined());                     // BatchNorm's float weight
  CHECK(low.get<1>().weight().value().to_vector() != std::vector<float>(8, 1.0f));
}

}  // namespace module_test
