// Mixed precision (optim/grad_scaler.hpp, the optimisers' fp32 master weights): GradScaler's
// scale sequence, growth tracker and skipped steps against torch's GradScaler (its own control
// flow; tests/oracles/nn_torch.py, section "grad_scaler") over 12 steps with injected inf, NaN
// and an overflow; half parameters updated through fp32 masters as torch's SGD and Adam update
// float32 ones (section "master_weights"); Program::backward(scaler) seeds the scale; a half MLP
// trained with the scaler tracks the float run; resuming (model, optimiser with its masters,
// scaler) is bit-identical; misuse and bad state are refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/torch_oracle.hpp"
#include "tessera/tessera.hpp"

namespace grad_scaler_test {

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
namespace optim = tessera::optim;

const torch_oracle::file& scaler_oracle() {
  static const torch_oracle::file file("grad_scaler");
  return file;
}

const torch_oracle::file& master_oracle() {
  static const torch_oracle::file file("master_weights");
  return file;
}

// A float tensor against an oracle array: torch's CPU kernels may fuse a multiply-add (AVX2
// FMA) where Tessera's portable loop rounds twice, so the last bit may differ.
void check_float(const ts::Tensor<float>& actual, const torch_oracle::array& expected) {
  torch_oracle::check_close(actual, expected, 1e-6, 1e-7);
}

TEST_CASE("GradScaler follows torch's scale, tracker and skipped steps", "[optim][amp]") {
  const auto& oracle = scaler_oracle();
  nn::Parameter<float> p0(oracle.tensor<float>("scaler.p0.init"));
  nn::Parameter<float> p1(oracle.tensor<float>("scaler.p1.init"));
  optim::SGD sgd({p0, p1}, {.lr = 0.1, .momentum = 0.9});
  optim::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});
  const auto& scales = oracle.at("scaler.scale").values;
  const auto& trackers = oracle.at("scaler.tracker").values;
  const auto& stepped = oracle.at("scaler.stepped").values;
  int skipped = 0;
  for (int step = 0; step < 12; ++step) {
    INFO("step " << step);
    const std::string s = std::to_string(step);
    p0.grad() = oracle.tensor<float>("scaler.p0.grad" + s);
    p1.grad() = oracle.tensor<float>("scaler.p1.grad" + s);
    const bool did_step = scaler.step(sgd);
    CHECK(did_step == (stepped[static_cast<std::size_t>(step)] != 0));
    skipped += did_step ? 0 : 1;
    scaler.update();
    CHECK(scaler.get_scale() == scales[static_cast<std::size_t>(step)]);
    CHECK(static_cast<double>(scaler.growth_tracker()) == trackers[static_cast<std::size_t>(step)]);
    check_float(p0.value(), oracle.at("scaler.p0.step" + s));
    check_float(p1.value(), oracle.at("scaler.p1.step" + s));
  }
  CHECK(skipped == 4);  // inf, NaN, -inf and the overflowed scaled gradient
  const auto& state = oracle.at("scaler.state").values;
  const ts::StateDict dict = scaler.state_dict();
  CHECK(dict.at("scale").as<double>().item() == state[0]);
  CHECK(dict.at("growth_factor").as<double>().item() == state[1]);
  CHECK(dict.at("backoff_factor").as<double>().item() == state[2]);
  CHECK(dict.at("growth_interval").as<double>().item() == state[3]);
  CHECK(dict.at("_growth_tracker").as<double>().item() == state[4]);
}

TEST_CASE("half parameters are updated through fp32 masters as torch updates float ones",
          "[optim][amp]") {
  const auto& oracle = master_oracle();
  for (const std::string name : {"sgd", "adam"}) {
    INFO(name);
    const std::string tag = "master." + name;
    nn::Parameter<ts::half> p0(oracle.tensor<float>(tag + ".p0.init").to<ts::half>());
    nn::Parameter<ts::half> p1(oracle.tensor<float>(tag + ".p1.init").to<ts::half>());
    std::unique_ptr<optim::Optimizer> opt;
    if (name == "sgd") {
      opt = std::make_unique<optim::SGD>(std::vector<nn::ParameterRef>{p0, p1},
                                         optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    } else {
      opt = std::make_unique<optim::Adam>(std::vector<nn::ParameterRef>{p0, p1},
                                          optim::AdamOptions{.lr = 0.01});
    }
    CHECK_FALSE(opt->master_weight(0).defined());
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      const std::string s = std::to_string(step);
      p0.grad() = oracle.tensor<float>(tag + ".p0.grad" + s).to<ts::half>();  // exact: half values
      p1.grad() = oracle.tensor<float>(tag + ".p1.grad" + s).to<ts::half>();
      opt->step();
      for (int i = 0; i < 2; ++i) {
        const std::string p = tag + ".p" + std::to_string(i);
        const ts::AnyTensor master = opt->master_weight(static_cast<std::size_t>(i));
        REQUIRE(master.dtype() == ts::ScalarType::float32);
        const ts::AnyTensor low = (i == 0 ? p0 : p1).value();
        torch_oracle::check_close(master.as<float>(), oracle.at(p + ".master" + s), 1e-6, 1e-7);
        // The half rounding of (nearly) the same master: equal, or one half ulp apart where the
        // master sits on a rounding boundary.
        torch_oracle::check_close(low.as<ts::half>().to<float>(), oracle.at(p + ".low" + s),
                                  0x1p-10, 1e-7);
      }
    }
    // A value written into the 16-bit parameter between steps is what the next step starts
    // from (load_state_dict of the module, a user's copy_).
    p0.value().fill_(ts::half(2.0f));
    p0.grad().zero_();
    p1.grad().zero_();
    opt->step();
    if (name == "sgd") {  // momentum goes on moving it; from 2, not from the old master
      const auto master = opt->master_weight(0).as<float>().to_vector();
      const auto buffer =
          dynamic_cast<optim::SGD&>(*opt).momentum_buffer(0).as<float>().to_vector();
      for (std::size_t k = 0; k < master.size(); ++k) {
        CHECK(master[k] == 2.0f - 0.05f * buffer[k]);
      }
    }
  }
}

// A 16-32-4 MLP of dtype T, its loss program (cross_entropy of the logits cast to float), Adam.
template <class T>
using mlp = nn::Sequential<nn::Linear<T>, nn::ReLU, nn::Linear<T>>;

template <class T>
auto compile_loss(mlp<T>& model) {
  return ag::compile(
      [&model](ag::Var<T> in, ag::Var<std::int64_t> labels) {
        return nn::cross_entropy(ts::cast<float>(model.forward(in)), labels);
      },
      ag::input<T>({64, 16}), ag::input<std::int64_t>({64}));
}

template <class T>
struct mlp_run {
  explicit mlp_run(const std::vector<ts::Tensor<float>>& weights)
      : model(nn::Linear<T>(16, 32), nn::ReLU{}, nn::Linear<T>(32, 4)),
        program(compile_loss(model)),
        opt(model.parameters(), {.lr = 0.01}) {
    std::size_t i = 0;
    for (const auto& p : model.parameters()) {
      p.value().copy_(ts::AnyTensor(weights.at(i++).template to<T>()));
    }
  }
  mlp_run(const mlp_run&) = delete;  // the program holds a reference to `model`

  float step(const ts::Tensor<T>& x, const ts::Tensor<std::int64_t>& y, optim::GradScaler* scaler) {
    opt.zero_grad();
    const float loss = program.forward(x, y).item();
    if (scaler != nullptr) {
      program.backward(*scaler);
      scaler->step(opt);
      scaler->update();
    } else {
      program.backward();
      opt.step();
    }
    return loss;
  }

  mlp<T> model;
  decltype(compile_loss(std::declval<mlp<T>&>())) program;
  optim::Adam opt;
};

struct data {
  std::vector<ts::Tensor<float>> weights;
  ts::Tensor<float> x;
  ts::Tensor<std::int64_t> y;
};

data make_data() {
  ts::manual_seed(31);
  data d;
  // Initial weights representable in half, so both runs start from the same values.
  d.weights = {ts::randn<float>({32, 16}) * 0.25f, ts::randn<float>({32}) * 0.1f,
               ts::randn<float>({4, 32}) * 0.18f, ts::randn<float>({4}) * 0.1f};
  for (auto& w : d.weights) w = w.to<ts::half>().to<float>();
  d.x = ts::randn<float>({64, 16}).to<ts::half>().to<float>();
  // Labels from a fixed linear rule, so the task can be learned.
  const auto scores = ts::eval(ts::matmul(d.x, ts::randn<float>({16, 4}))).to_vector();
  std::vector<std::int64_t> labels(64);
  for (std::size_t r = 0; r < 64; ++r) {
    std::size_t best = 0;
    for (std::size_t c = 1; c < 4; ++c) {
      if (scores[r * 4 + c] > scores[r * 4 + best]) best = c;
    }
    labels[r] = static_cast<std::int64_t>(best);
  }
  d.y = ts::from_vector<std::int64_t>(labels, {64});
  return d;
}

TEST_CASE("backward(scaler) seeds the scale; half training with GradScaler tracks float",
          "[optim][amp]") {
  const data d = make_data();
  SECTION("the gradients of backward(scaler) are the scale times those of backward()") {
    mlp_run<float> plain(d.weights), scaled(d.weights);
    optim::GradScaler scaler({.init_scale = 4096.0});
    plain.program.forward(d.x, d.y);
    plain.program.backward();
    scaled.program.forward(d.x, d.y);
    scaled.program.backward(scaler);
    const auto a = plain.model.parameters(), b = scaled.model.parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto g = a[i].grad().as<float>().to_vector();
      const auto h = b[i].grad().as<float>().to_vector();
      for (std::size_t k = 0; k < g.size(); ++k) CHECK(h[k] == g[k] * 4096.0f);  // power of 2
    }
    scaler.unscale_(scaled.opt);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(b[i].grad().as<float>().to_vector() == a[i].grad().as<float>().to_vector());
    }
  }
  SECTION("50 steps in half with fp32 masters and loss scaling stay within 1e-2 of float") {
    mlp_run<float> full(d.weights);
    mlp_run<ts::half> low(d.weights);
    optim::GradScaler scaler;  // 65536, growth every 2000 steps: PyTorch's defaults
    const ts::Tensor<ts::half> x_half = d.x.to<ts::half>();
    float first = 0, loss_float = 0, loss_half = 0;
    int skipped = 0;
    for (int step = 0; step < 50; ++step) {
      const double scale = scaler.get_scale();
      loss_float = full.step(d.x, d.y, nullptr);
      loss_half = low.step(x_half, d.y, &scaler);
      if (scaler.get_scale() < scale) ++skipped;
      if (step == 0) first = loss_float;
    }
    INFO("float loss " << first << " -> " << loss_float << ", half " << loss_half << ", " << skipped
                       << " steps skipped");
    CHECK(loss_float < 0.5f * first);  // it learned
    CHECK(std::abs(loss_half - loss_float) <= 1e-2f);
    CHECK(skipped <= 3);  // a few back-offs, then clean steps (the recipe works)
    CHECK(low.opt.master_weight(0).dtype() == ts::ScalarType::float32);
  }
}

TEST_CASE("resuming half training (masters and scaler) from files gives the same bits",
          "[optim][amp][state]") {
  const data d = make_data();
  const ts::Tensor<ts::half> x = d.x.to<ts::half>();
  const optim::GradScalerOptions options{.init_scale = 256.0, .growth_interval = 2};
  auto half_values = [](const nn::Module& m) {
    std::vector<std::vector<float>> out;
    for (const auto& p : m.parameters())
      out.push_back(p.value().as<ts::half>().to<float>().to_vector());
    return out;
  };
  mlp_run<ts::half> straight(d.weights);
  optim::GradScaler straight_scaler(options);
  for (int i = 0; i < 6; ++i) straight.step(x, d.y, &straight_scaler);

  mlp_run<ts::half> first(d.weights);
  optim::GradScaler first_scaler(options);
  for (int i = 0; i < 3; ++i) first.step(x, d.y, &first_scaler);
  const auto dir = std::filesystem::temp_directory_path();
  const auto path = [&](const char* what) {
    return (dir / (std::string("tessera_amp_resume_") + what + ".safetensors")).string();
  };
  ts::save(first.model.state_dict(), path("model"));
  ts::save(first.opt.state_dict(), path("optim"));
  ts::save(first_scaler.state_dict(), path("scaler"));
  CHECK(first.opt.state_dict().contains("state.0.master_weight"));

  std::vector<ts::Tensor<float>> other = d.weights;
  for (auto& w : other) w = ts::eval(w * 0.5f);
  mlp_run<ts::half> resumed(other);
  optim::GradScaler resumed_scaler({.init_scale = 8.0});
  resumed.model.load_state_dict(ts::load(path("model")));
  resumed.opt.load_state_dict(ts::load(path("optim")));
  resumed_scaler.load_state_dict(ts::load(path("scaler")));
  CHECK(resumed_scaler.get_scale() == first_scaler.get_scale());
  for (int i = 0; i < 3; ++i) resumed.step(x, d.y, &resumed_scaler);
  CHECK(half_values(resumed.model) == half_values(straight.model));  // bit for bit
  CHECK(resumed.opt.master_weight(0).as<float>().to_vector() ==
        straight.opt.master_weight(0).as<float>().to_vector());
  CHECK(resumed_scaler.get_scale() == straight_scaler.get_scale());
  CHECK(resumed_scaler.growth_tracker() == straight_scaler.growth_tracker());
  for (const char* what : {"model", "optim", "scaler"}) std::filesystem::remove(path(what));
}

TEST_CASE("GradScaler unscales contiguous and channels_last gradients in place, strided via a copy",
          "[optim][amp][channels_last]") {
  // Gradients on cpu:1 in three layouts, element i (row-major) of value (i % 7 - 3) * 64; the
  // scale 64 divides them exactly, so the reference is (i % 7 - 3), compared for equality.
  const ts::Device cpu1 = ts::Device::parse("cpu:1");
  // 12 MiB each (over 10 MiB: segments of their own size, no room left in them for a copy).
  const ts::Shape shape{16, 48, 64, 64};
  const std::int64_t n = shape.numel();
  auto values = [&](float times) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = float(i % 7 - 3) * times;
    return v;
  };
  auto pattern = [&](float times) { return ts::from_vector<float>(values(times), shape, 1); };
  // Elements (row-major) that differ from values(times): 0 when all are equal.
  auto differing = [&](const ts::Tensor<float>& t, float times) {
    const std::vector<float> actual = t.to_vector(), expected = values(times);
    std::int64_t count = 0;
    for (std::size_t i = 0; i < actual.size(); ++i) count += actual[i] != expected[i];
    return count;
  };
  nn::Parameter<float> a{ts::zeros<float>(shape, 1)}, b{ts::zeros<float>(shape, 1)},
      c{ts::zeros<float>(shape, 1).contiguous(ts::memory_format::channels_last)};
  a.grad() = pattern(64.0f);
  b.grad() = pattern(64.0f).contiguous(ts::memory_format::channels_last);
  // A strided gradient: every other element of a wider tensor.
  ts::Tensor<float> wide = ts::zeros<float>({16, 48, 64, 128}, 1);
  for (std::int64_t j = 0; j < 2; ++j) wide.narrow(3, j * 64, 64).copy_(pattern(64.0f));
  c.grad() = wide.narrow(3, 64, 64);
  REQUIRE(!b.grad().is_contiguous());
  REQUIRE(b.grad().is_contiguous(ts::memory_format::channels_last));
  REQUIRE(!c.grad().is_contiguous(ts::memory_format::channels_last));
  const void* a_memory = a.grad().data();
  const void* b_memory = b.grad().data();
  optim::SGD sgd({a, b, c}, {.lr = 0.5});

  // Dense gradients need no memory: with the cap at what is reserved now, only the strided
  // one's copy is refused, and nothing is unscaled.
  optim::GradScaler scaler({.init_scale = 64.0});
  ts::memory::empty_cache(cpu1);
  ts::memory::set_limit(cpu1, ts::memory::reserved(cpu1));
  CHECK_THROWS_AS(scaler.unscale_(sgd), ts::out_of_memory_error);
  ts::memory::set_limit(cpu1, ts::memory::no_limit);
  CHECK(differing(b.grad(), 64.0f) == 0);

  // Without the strided gradient, unscaling under that cap succeeds: in place, layouts kept.
  optim::SGD dense({a, b}, {.lr = 0.5});
  ts::memory::empty_cache(cpu1);
  ts::memory::set_limit(cpu1, ts::memory::reserved(cpu1));
  scaler.unscale_(dense);
  ts::memory::set_limit(cpu1, ts::memory::no_limit);
  CHECK(a.grad().data() == a_memory);
  CHECK(b.grad().data() == b_memory);
  CHECK(b.grad().is_contiguous(ts::memory_format::channels_last));
  CHECK(differing(a.grad(), 1.0f) == 0);
  CHECK(differing(b.grad(), 1.0f) == 0);
  CHECK(scaler.step(dense));
  scaler.update();

  // The strided gradient through its copy, and an inf in a channels_last gradient is found.
  optim::GradScaler second({.init_scale = 64.0});
  second.unscale_(sgd);
  CHECK(differing(c.grad(), 1.0f) == 0);
  CHECK(differing(wide.narrow(3, 0, 64), 64.0f) == 0);  // untouched
  CHECK(second.step(sgd));
  second.update();
  b.grad().narrow(1, 4, 1).narrow(3, 2, 1).narrow(2, 7, 1).fill_(
      std::numeric_limits<float>::infinity());
  CHECK_FALSE(second.step(sgd));
  second.update();
  CHECK(second.get_scale() == 32.0);
}

TEST_CASE("GradScaler refuses misuse and bad state, naming the values", "[optim][amp]") {
  CHECK_THROWS_WITH(optim::GradScaler({.growth_factor = 1.0}),
                    Catch::Contains("growth_factor must be > 1") && Catch::Contains("1.0"));
  CHECK_THROWS_WITH(optim::GradScaler({.backoff_factor = 1.5}),
                    Catch::Contains("backoff_factor must be in (0, 1)"));
  CHECK_THROWS_WITH(optim::GradScaler({.init_scale = 1e39}), Catch::Contains("init_scale"));
  CHECK_THROWS_WITH(optim::GradScaler({.growth_interval = 0}), Catch::Contains("growth_interval"));

  nn::Parameter<float> p(ts::ones<float>({3}));
  optim::SGD sgd({p}, {.lr = 0.5});
  optim::GradScaler scaler({.init_scale = 2.0});
  CHECK_THROWS_WITH(scaler.update(), Catch::Contains("no step() or unscale_()"));
  CHECK_THROWS_WITH(scaler.step(sgd), Catch::Contains("has a gradient"));
  p.grad() = ts::full<float>({3}, 4.0f);
  scaler.unscale_(sgd);
  CHECK(p.grad().to_vector() == std::vector<float>{2, 2, 2});
  CHECK_THROWS_WITH(scaler.unscale_(sgd), Catch::Contains("already called"));
  CHECK(scaler.step(sgd));  // does not unscale again
  CHECK(p.value().to_vector() == std::vector<float>{0, 0, 0});
  CHECK_THROWS_WITH(scaler.step(sgd), Catch::Contains("already called"));
  CHECK_THROWS_WITH(scaler.unscale_(sgd), Catch::Contains("after step()"));
  scaler.update();
  CHECK(scaler.get_scale() == 2.0);
  CHECK(scaler.growth_tracker() == 1);

  // A state that does not fit changes nothing.
  ts::StateDict bad = scaler.state_dict();
  bad.insert("backoff_factor", ts::AnyTensor(ts::full<double>({}, 2.0)));
  CHECK_THROWS_WITH(scaler.load_state_dict(bad), Catch::Contains("backoff_factor"));
  ts::StateDict missing;
  missing.insert("scale", ts::AnyTensor(ts::full<double>({}, 8.0)));
  CHECK_THROWS_WITH(scaler.load_state_dict(missing), Catch::Contains("growth_factor"));
  CHECK_THROWS_WITH(scaler.load_state_dict(ts::StateDict{}), Catch::Contains("empty"));
  CHECK(scaler.get_scale() == 2.0);
  CHECK(scaler.growth_tracker() == 1);
  CHECK_THROWS_WITH(scaler.update(0.0), Catch::Contains("positive and finite"));

  // Disabled: everything passes through.
  optim::GradScaler off({.enabled = false});
  p.grad() = ts::full<float>({3}, 1.0f);
  CHECK(off.get_scale() == 1.0);
  CHECK(off.step(sgd));
  CHECK(p.value().to_vector() == std::vector<float>{-0.5f, -0.5f, -0.5f});
  off.update();
  CHECK(off.state_dict().empty());

  // An optimiser's state for a half parameter is float32; a float16 one is refused by name.
  nn::Parameter<ts::half> h(ts::ones<ts::half>({2}));
  optim::SGD sgd_half({h}, {.lr = 0.1, .momentum = 0.9});
  h.grad() = ts::ones<ts::half>({2});
  sgd_half.step();
  ts::StateDict state = sgd_half.state_dict();
  CHECK(state.at("state.0.momentum_buffer").dtype() == ts::ScalarType::float32);
  CHECK(state.at("state.0.master_weight").dtype() == ts::ScalarType::float32);
  state.insert("state.0.master_weight", ts::AnyTensor(ts::ones<ts::half>({2})));
  CHECK_THROWS_WITH(sgd_half.load_state_dict(state),
                    Catch::Contains("state.0.master_weight") && Catch::Contains("float32"));
}

}  // namespace grad_scaler_test
