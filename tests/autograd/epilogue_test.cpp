// Matrix products that apply the bias (and the ReLU) after them as they write: the plan's fold
// (program_state::fold_epilogues, memory_plan.hpp; cuBLASLt's epilogues on CUDA, the product and
// one pass on the CPU). Which programs fold, that the folded elementwise nodes do not run (the
// profiler's rows), and the numbers against float64 references computed here; the programs that
// must not fold (the product read again, a recomputed segment, a bias that is not a row).
// Also: relu, sigmoid, tanh and exp applied last are differentiated from their result (PyTorch's
// rule), so the pre-activation is not kept for the backward.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "profile_support.hpp"
#include "tessera/autograd.hpp"
#include "tessera/nn.hpp"
#include "tessera/tensor/factories.hpp"
#include "tessera/tools/profile.hpp"

namespace epilogue_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
using tessera_test::calls;

namespace {

std::vector<double> random_values(std::int64_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> values(static_cast<std::size_t>(count));
  for (auto& v : values) v = dist(rng);
  return values;
}

template <class T>
ts::Tensor<T> tensor_of(const std::vector<double>& values, const ts::Shape& shape) {
  std::vector<T> typed(values.begin(), values.end());
  return ts::from_vector<T>(typed, shape, 0);
}

template <class T>
std::vector<double> doubles(const ts::Tensor<T>& t) {
  const auto v = t.contiguous().to_vector();
  return {v.begin(), v.end()};
}

/// A dense layer in float64: weight [out, in] row-major, bias [out].
struct dense {
  std::vector<double> w, b;
  std::int64_t in = 0, out = 0;
};

/// loss = sum(z_L * c) with z_l = h_{l-1} W_l^T + b_l, h_l = relu(z_l) between layers; returns
/// the loss, and the gradients of every weight and bias (dw[l], db[l]).
double reference(const std::vector<double>& x, std::int64_t rows, const std::vector<dense>& layers,
                 const std::vector<double>& c, std::vector<std::vector<double>>& dw,
                 std::vector<std::vector<double>>& db) {
  std::vector<std::vector<double>> h{x}, z;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const dense& d = layers[l];
    std::vector<double> pre(static_cast<std::size_t>(rows * d.out));
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < d.out; ++j) {
        double s = d.b[static_cast<std::size_t>(j)];
        for (std::int64_t k = 0; k < d.in; ++k) {
          s += h[l][static_cast<std::size_t>(i * d.in + k)] *
               d.w[static_cast<std::size_t>(j * d.in + k)];
        }
        pre[static_cast<std::size_t>(i * d.out + j)] = s;
      }
    }
    z.push_back(pre);
    if (l + 1 < layers.size()) {
      for (auto& v : pre) v = v > 0 ? v : 0;
    }
    h.push_back(pre);
  }
  double loss = 0;
  for (std::size_t i = 0; i < c.size(); ++i) loss += h.back()[i] * c[i];
  dw.assign(layers.size(), {});
  db.assign(layers.size(), {});
  std::vector<double> g = c;  // d loss / d z_L
  for (std::size_t l = layers.size(); l-- > 0;) {
    const dense& d = layers[l];
    if (l + 1 < layers.size()) {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = z[l][i] > 0 ? g[i] : 0;
    }
    dw[l].assign(static_cast<std::size_t>(d.out * d.in), 0);
    db[l].assign(static_cast<std::size_t>(d.out), 0);
    std::vector<double> gh(static_cast<std::size_t>(rows * d.in), 0);
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < d.out; ++j) {
        const double gij = g[static_cast<std::size_t>(i * d.out + j)];
        db[l][static_cast<std::size_t>(j)] += gij;
        for (std::int64_t k = 0; k < d.in; ++k) {
          dw[l][static_cast<std::size_t>(j * d.in + k)] +=
              gij * h[l][static_cast<std::size_t>(i * d.in + k)];
          gh[static_cast<std::size_t>(i * d.in + k)] +=
              gij * d.w[static_cast<std::size_t>(j * d.in + k)];
        }
      }
    }
    g = gh;
  }
  return loss;
}

template <class T>
dense dense_of(const nn::Linear<T>& layer) {
  return {doubles(layer.weight().value()), doubles(layer.bias().value()), layer.in_features(),
          layer.out_features()};
}

void check_close(const std::vector<double>& got, const std::vector<double>& want,
                 double tolerance) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == Approx(want[i]).margin(tolerance).epsilon(tolerance));
  }
}

/// Three Linear layers with ReLU between them, written as a model's forward is.
template <class T>
struct Mlp {
  nn::Linear<T> fc1{12, 16, true, 0}, fc2{16, 8, true, 0}, fc3{8, 5, true, 0};
  template <class X>
  auto operator()(const X& x) const {
    return fc3(ts::relu(fc2(ts::relu(fc1(x)))));
  }
  std::vector<const nn::Linear<T>*> layers() const { return {&fc1, &fc2, &fc3}; }
};

}  // namespace

TEMPLATE_TEST_CASE(
    "Linear -> ReLU products apply their bias and ReLU as they write, with "
    "float64's numbers",
    "[autograd][epilogue]", float, double) {
  using T = TestType;
  Mlp<T> net;
  constexpr std::int64_t rows = 7;
  const auto xs = random_values(rows * 12, 1), cs = random_values(rows * 5, 2);
  const auto x = tensor_of<T>(xs, {rows, 12});
  const auto c = tensor_of<T>(cs, {rows, 5});
  auto program =
      ag::compile([&](auto input) { return ts::sum(net(input) * c); }, ag::input<T>({rows, 12}, 0));
  INFO(program.memory_report());
  CHECK(program.plan().epilogues == 3);

  ts::tools::Profile profile;
  T loss{};
  {
    auto recording = profile.record();
    loss = program.forward(x).item();
    program.backward();
  }
  const auto profiled = profile.rows();
  INFO(profile.table());
  CHECK(calls(profiled, "matmul", "forward") == 3);
  CHECK(calls(profiled, "fused", "forward") == 0);  // the bias and ReLU passes did not run

  std::vector<dense> layers;
  for (const auto* layer : net.layers()) layers.push_back(dense_of(*layer));
  std::vector<std::vector<double>> dw, db;
  const double want = reference(xs, rows, layers, cs, dw, db);
  const double tolerance = std::is_same_v<T, float> ? 1e-4 : 1e-12;
  CHECK(static_cast<double>(loss) == Approx(want).epsilon(tolerance));
  const auto all = net.layers();
  for (std::size_t l = 0; l < all.size(); ++l) {
    CAPTURE(l);
    check_close(doubles(all[l]->weight().grad()), dw[l], tolerance);
    check_close(doubles(all[l]->bias().grad()), db[l], tolerance);
  }

  // A second step gives the same numbers (the fold is planned once, applied every forward).
  CHECK(program.forward(x).item() == loss);

  // Options::epilogues = false: no fold, the passes run, the same numbers (bit for bit on the
  // CPU: the same operations in the same order).
  auto unfolded = ag::compile([&](auto input) { return ts::sum(net(input) * c); },
                              ag::input<T>({rows, 12}, 0), ag::Options{.epilogues = false});
  CHECK(unfolded.plan().epilogues == 0);
  ts::tools::Profile passes;
  {
    auto recording = passes.record();
    CHECK(unfolded.forward(x).item() == loss);
  }
  CHECK(calls(passes.rows(), "fused", "forward") == 5);
}

TEST_CASE("A bias added on the left, a [1, n] bias, and ReLU bound as a node of its own fold",
          "[autograd][epilogue]") {
  constexpr std::int64_t m = 6, k = 9, n = 4;
  const auto xs = random_values(m * k, 3), ws = random_values(n * k, 4), bs = random_values(n, 5),
             cs = random_values(m * n, 6);
  const auto x = tensor_of<float>(xs, {m, k});
  const auto c = tensor_of<float>(cs, {m, n});
  nn::Linear<float> layer(k, n, true, 0);
  layer.weight().value().copy_(tensor_of<float>(ws, {n, k}));
  layer.bias().value().copy_(tensor_of<float>(bs, {n}));
  // sum(relu(x W^T + b) * c) and its gradients in float64.
  std::vector<double> want_dw(static_cast<std::size_t>(n * k), 0),
      want_db(static_cast<std::size_t>(n), 0);
  double want = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = bs[static_cast<std::size_t>(j)];
      for (std::int64_t q = 0; q < k; ++q)
        s += xs[static_cast<std::size_t>(i * k + q)] * ws[static_cast<std::size_t>(j * k + q)];
      if (s <= 0) continue;
      const double g = cs[static_cast<std::size_t>(i * n + j)];
      want += s * g;
      want_db[static_cast<std::size_t>(j)] += g;
      for (std::int64_t q = 0; q < k; ++q)
        want_dw[static_cast<std::size_t>(j * k + q)] += g * xs[static_cast<std::size_t>(i * k + q)];
    }
  }
  auto run = [&](auto fn, int epilogues) {
    layer.weight().zero_grad();
    layer.bias().zero_grad();
    auto program = ag::compile(fn, ag::input<float>({m, k}, 0));
    INFO(program.memory_report());
    CHECK(program.plan().epilogues == epilogues);
    CHECK(program.forward(x).item() == Approx(want).epsilon(1e-5));
    program.backward();
    check_close(doubles(layer.weight().grad()), want_dw, 1e-5);
    check_close(doubles(layer.bias().grad()), want_db, 1e-5);
  };
  // Each activation is bound as a value (as a next layer's product binds its operand); left
  // lazy, `* c` would join it into the loss's expression, which is no epilogue.
  using ag::detail::bind_expression;
  SECTION("bias on the left, ReLU in the same expression") {
    run(
        [&](auto in) {
          auto w = layer.weight().like(in), b = layer.bias().like(in);
          return ts::sum(bind_expression<float, ts::cpu>(ts::relu(b + ts::matmul(in, w.t()))) * c);
        },
        1);
  }
  SECTION("a [1, n] bias") {
    run(
        [&](auto in) {
          auto w = layer.weight().like(in), b = layer.bias().like(in);
          return ts::sum(
              bind_expression<float, ts::cpu>(ts::relu(ts::matmul(in, w.t()) + b.reshape({1, n}))) *
              c);
        },
        1);
  }
  SECTION("the sum and the ReLU bound as two nodes") {
    run(
        [&](auto in) {
          auto w = layer.weight().like(in), b = layer.bias().like(in);
          const auto biased = bind_expression<float, ts::cpu>(ts::matmul(in, w.t()) + b);
          return ts::sum(bind_expression<float, ts::cpu>(ts::relu(biased)) * c);
        },
        1);
  }
}

TEST_CASE("Products whose output is read again, recomputed, or given a column do not fold",
          "[autograd][epilogue]") {
  constexpr std::int64_t m = 5, k = 7, n = 3;
  const auto xs = random_values(m * k, 7), ws = random_values(n * k, 8), bs = random_values(n, 9),
             cols = random_values(m, 10);
  const auto x = tensor_of<float>(xs, {m, k});
  const auto w = tensor_of<float>(ws, {n, k});
  const auto b = tensor_of<float>(bs, {n});
  const auto column = tensor_of<float>(cols, {m, 1});
  // y = x W^T in float64
  std::vector<double> y(static_cast<std::size_t>(m * n), 0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t q = 0; q < k; ++q)
        y[static_cast<std::size_t>(i * n + j)] +=
            xs[static_cast<std::size_t>(i * k + q)] * ws[static_cast<std::size_t>(j * k + q)];
  auto total = [&](auto value) {
    double s = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) s += value(i, j, y[static_cast<std::size_t>(i * n + j)]);
    return s;
  };
  const nn::Parameter<float> wp(w);
  SECTION("the product read by another node after the sum") {
    auto program = ag::compile(
        [&](auto in) {
          const auto p = ts::matmul(in, wp.like(in).t());
          return ts::sum(ts::relu(p + b) * p);
        },
        ag::input<float>({m, k}, 0));
    CHECK(program.plan().epilogues == 0);
    const double want = total([&](auto, auto j, double v) {
      const double s = v + bs[static_cast<std::size_t>(j)];
      return (s > 0 ? s : 0) * v;
    });
    CHECK(program.forward(x).item() == Approx(want).epsilon(1e-5));
  }
  SECTION("a column [m, 1] is not a bias of the rows") {
    auto program = ag::compile(
        [&](auto in) { return ts::sum(ts::relu(ts::matmul(in, wp.like(in).t()) + column)); },
        ag::input<float>({m, k}, 0));
    CHECK(program.plan().epilogues == 0);
    const double want = total([&](auto i, auto, double v) {
      const double s = v + cols[static_cast<std::size_t>(i)];
      return s > 0 ? s : 0;
    });
    CHECK(program.forward(x).item() == Approx(want).epsilon(1e-5));
  }
  SECTION("one row added to itself is not a bias") {
    const auto row = tensor_of<float>(std::vector<double>(xs.begin(), xs.begin() + k), {1, k});
    auto program = ag::compile(
        [&](auto in) {
          const auto p = ts::matmul(in, wp.like(in).t());
          return ts::sum(ag::detail::bind_expression<float, ts::cpu>(ts::relu(p + p)));
        },
        ag::input<float>({1, k}, 0));
    CHECK(program.plan().epilogues == 0);
    double want = 0;
    for (std::int64_t j = 0; j < n; ++j) want += std::max(2 * y[static_cast<std::size_t>(j)], 0.0);
    CHECK(program.forward(row).item() == Approx(want).epsilon(1e-5));
  }
  SECTION("a recomputed segment runs its nodes again itself") {
    nn::Linear<float> l1(k, 8, true, 0), l2(8, 8, true, 0), l3(8, n, true, 0);
    auto fn = [&](auto in) { return ts::sum(l3(ts::relu(l2(ts::relu(l1(in)))))); };
    auto plain = ag::compile(fn, ag::input<float>({m, k}, 0));
    auto segmented =
        ag::compile(fn, ag::input<float>({m, k}, 0), ag::Options{.checkpoint = {.segments = 3}});
    INFO(segmented.memory_report());
    CHECK(plain.plan().epilogues == 3);
    CHECK(segmented.plan().recomputed_steps > 0);
    CHECK(segmented.plan().epilogues < 3);
    const float a = plain.forward(x).item();
    plain.backward();
    const auto grads = doubles(l1.weight().grad());
    l1.weight().zero_grad();
    const float s = segmented.forward(x).item();
    segmented.backward();
    CHECK(s == a);  // the same passes in the same order on the CPU: bit for bit
    CHECK(doubles(l1.weight().grad()) == grads);
  }
}

TEST_CASE("ReLU, sigmoid, tanh and exp applied last are differentiated from their result",
          "[autograd][epilogue]") {
  // sum(f(x W^T + b) * c) for each f, its gradients against float64; and a ReLU's pre-activation
  // is not kept for the backward: the activation takes over the product's buffer.
  constexpr std::int64_t m = 4, k = 5, n = 6;
  const auto xs = random_values(m * k, 11), ws = random_values(n * k, 12),
             bs = random_values(n, 13), cs = random_values(m * n, 14);
  const auto x = tensor_of<float>(xs, {m, k});
  const auto c = tensor_of<float>(cs, {m, n});
  const auto b = tensor_of<float>(bs, {n});
  auto check = [&](auto f, auto value, auto derivative, const char* name) {
    INFO(name);
    nn::Parameter<float> w(tensor_of<float>(ws, {n, k}));
    auto program = ag::compile(
        [&](auto in) {
          const auto bias = ag::detail::to_var(b, in.graph());
          const auto activation =
              ag::detail::bind_expression<float, ts::cpu>(f(ts::matmul(in, w.like(in).t()) + bias));
          return ts::sum(activation * c);
        },
        ag::input<float>({m, k}, 0));
    double want = 0;
    std::vector<double> want_dw(static_cast<std::size_t>(n * k), 0);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double s = bs[static_cast<std::size_t>(j)];
        for (std::int64_t q = 0; q < k; ++q)
          s += xs[static_cast<std::size_t>(i * k + q)] * ws[static_cast<std::size_t>(j * k + q)];
        const double g = cs[static_cast<std::size_t>(i * n + j)];
        want += value(s) * g;
        for (std::int64_t q = 0; q < k; ++q) {
          want_dw[static_cast<std::size_t>(j * k + q)] +=
              g * derivative(s) * xs[static_cast<std::size_t>(i * k + q)];
        }
      }
    }
    CHECK(program.forward(x).item() == Approx(want).epsilon(1e-5));
    program.backward();
    check_close(doubles(w.grad()), want_dw, 1e-5);
    // The activation takes over the sum's buffer (the product's): possible only because the
    // backward no longer reads the sum. With the product's gradient taking over its upstream's,
    // two buffers in place (one when the sum was recomputed from its inputs).
    CHECK(program.plan().in_place == 2);
    return program.plan();
  };
  const auto relu_plan =
      check([](const auto& e) { return ts::relu(e); }, [](double s) { return s > 0 ? s : 0; },
            [](double s) { return s > 0 ? 1.0 : 0.0; }, "relu");
  CHECK(relu_plan.epilogues == 1);  // the ReLU also rides on the product
  check([](const auto& e) { return ts::sigmoid(e); },
        [](double s) { return 1 / (1 + std::exp(-s)); },
        [](double s) {
          const double y = 1 / (1 + std::exp(-s));
          return y * (1 - y);
        },
        "sigmoid");
  check([](const auto& e) { return ts::tanh(e); }, [](double s) { return std::tanh(s); },
        [](double s) { return 1 - std::tanh(s) * std::tanh(s); }, "tanh");
  check([](const auto& e) { return ts::exp(e); }, [](double s) { return std::exp(s); },
        [](double s) { return std::exp(s); }, "exp");
}

}  // namespace epilogue_test
