// Every derivative rule of the autograd against central finite differences in float64: each
// elementwise function and operator (inside fused nodes, with broadcasting in every position and
// repeated leaves), reductions over every dim with and without keepdim, max/min, softmax and
// log_softmax, matmul in its three layouts with transposed views, views, split/cat, and small
// networks. The reference is the program's own forward loss evaluated at perturbed parameters,
// i.e. an independent numerical derivative, not the backward code.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/autograd.hpp"
#include "tessera/tensor/factories.hpp"

namespace gradcheck_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace ag = tessera::autograd;

namespace {

using slot = std::shared_ptr<ag::parameter_slot<double, ts::cpu>>;
using V = ag::Var<double>;

std::mt19937& rng() {
  static std::mt19937 generator(1234);
  return generator;
}

ts::Tensor<double> random_tensor(const ts::Shape& shape, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> values(static_cast<std::size_t>(shape.numel()));
  for (auto& v : values) v = dist(rng());
  return ts::from_vector<double>(values, shape);
}

slot make_param(const ts::Shape& shape, double lo = -1.0, double hi = 1.0) {
  auto p = std::make_shared<ag::parameter_slot<double, ts::cpu>>();
  p->value = random_tensor(shape, lo, hi);
  return p;
}

/// Compiles loss(x, params...) over input x, runs forward and backward, and compares every
/// parameter's gradient with central differences of the forward loss.
template <class Fn>
void gradcheck(const std::vector<slot>& params, const ts::Tensor<double>& x, Fn fn,
               double tolerance = 1e-6) {
  auto program = ag::compile(fn, ag::input<double>(x.shape()));
  for (const auto& p : params) p->grad = ts::Tensor<double>();
  const double loss = program.forward(x).item();
  REQUIRE(std::isfinite(loss));
  program.backward();
  const double h = 1e-6;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const auto& p = params[k];
    REQUIRE(p->grad.defined());
    const std::vector<double> analytic = p->grad.to_vector();
    double* data = p->value.data();
    for (std::int64_t i = 0; i < p->value.numel(); ++i) {
      const double saved = data[i];
      data[i] = saved + h;
      const double up = program.forward(x).item();
      data[i] = saved - h;
      const double down = program.forward(x).item();
      data[i] = saved;
      const double numeric = (up - down) / (2 * h);
      INFO("parameter " << k << " element " << i << " shape " << p->value.shape().str());
      CHECK(std::abs(analytic[static_cast<std::size_t>(i)] - numeric) <=
            tolerance * (1 + std::abs(numeric)));
    }
  }
}

}  // namespace

TEST_CASE("unary functions: derivatives inside one fused node", "[autograd][gradcheck]") {
  auto x = random_tensor({3, 4}, -1, 1);
  const auto weights = random_tensor({3, 4}, -1, 1);
  struct unary_case {
    const char* name;
    double lo, hi;
    std::function<V(const V&)> f;
  };
  const std::vector<unary_case> cases = {
      {"neg", -1, 1, [](const V& w) { return V(-w); }},
      {"exp", -1, 1, [](const V& w) { return V(ts::exp(w)); }},
      {"log", 0.5, 2, [](const V& w) { return V(ts::log(w)); }},
      {"sqrt", 0.5, 2, [](const V& w) { return V(ts::sqrt(w)); }},
      {"rsqrt", 0.5, 2, [](const V& w) { return V(ts::rsqrt(w)); }},
      {"abs", 0.1, 1, [](const V& w) { return V(ts::abs(w - 0.55)); }},
      {"sin", -2, 2, [](const V& w) { return V(ts::sin(w)); }},
      {"cos", -2, 2, [](const V& w) { return V(ts::cos(w)); }},
      {"tanh", -2, 2, [](const V& w) { return V(ts::tanh(w)); }},
      {"sigmoid", -3, 3, [](const V& w) { return V(ts::sigmoid(w)); }},
      {"relu", -1, 1, [](const V& w) { return V(ts::relu(w)); }},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      auto w = make_param({3, 4}, c.lo, c.hi);
      if (std::string(c.name) == "relu") {
        // Keep away from the kink, where a finite difference straddles it.
        auto values = w->value.to_vector();
        for (auto& v : values) v = v < 0 ? v - 0.05 : v + 0.05;
        w->value = ts::from_vector<double>(values, {3, 4});
      }
      gradcheck({w}, x, [&](V input) {
        auto W = ag::parameter(w, input);
        return ts::sum(c.f(W) * weights + input * 0.0);
      });
    }
  }
}

TEST_CASE("binary operators with broadcasting in every position and scalars on both sides",
          "[autograd][gradcheck]") {
  auto x = random_tensor({3, 4}, -1, 1);
  auto a = make_param({3, 4});
  auto row = make_param({4}, 0.5, 1.5);
  auto column = make_param({3, 1}, 0.5, 1.5);
  auto positive = make_param({3, 4}, 0.5, 2);
  const auto weights = random_tensor({3, 4}, -1, 1);
  using build = std::function<V(const V&, const V&, const V&, const V&, const V&)>;
  const std::vector<std::pair<const char*, build>> cases = {
      {"add", [](auto&, auto& A, auto& R, auto& C, auto&) { return V(A + R + C); }},
      {"sub", [](auto&, auto& A, auto& R, auto& C, auto&) { return V(C - A - R); }},
      {"mul", [](auto&, auto& A, auto& R, auto& C, auto&) { return V(A * R * C); }},
      {"div", [](auto&, auto& A, auto& R, auto& C, auto&) { return V(A / R / C); }},
      {"scalars", [](auto&, auto& A, auto& R, auto&, auto&) { return V(2.0 - A * 3.0 + 1.5 / R); }},
      {"pow scalar exponent", [](auto&, auto&, auto&, auto&, auto& P) { return V(ts::pow(P, 2.5)); }},
      {"pow scalar base", [](auto&, auto& A, auto&, auto&, auto&) { return V(ts::pow(2.0, A)); }},
      {"pow both", [](auto&, auto&, auto& R, auto&, auto& P) { return V(ts::pow(P, R)); }},
      {"maximum", [](auto&, auto& A, auto& R, auto&, auto&) { return V(ts::maximum(A, R - 1.0)); }},
      {"minimum", [](auto&, auto& A, auto&, auto& C, auto&) { return V(ts::minimum(C - 1.0, A)); }},
      {"where", [](auto& X, auto& A, auto& R, auto& C, auto&) { return V(ts::where(X > 0.0, A * R, C)); }},
      {"input operand", [](auto& X, auto& A, auto& R, auto&, auto&) { return V(A * X + R * X * X); }},
      {"repeated leaf", [](auto&, auto& A, auto&, auto&, auto&) { return V(A * A + ts::sin(A) / (2.0 + A * A)); }},
  };
  for (const auto& [name, f] : cases) {
    SECTION(name) {
      gradcheck({a, row, column, positive}, x, [&](V input) {
        auto A = ag::parameter(a, input);
        auto R = ag::parameter(row, input);
        auto C = ag::parameter(column, input);
        auto P = ag::parameter(positive, input);
        // Every parameter appears, so each gets a (possibly zero) gradient.
        return ts::sum(f(input, A, R, C, P) * weights + (A + R + C + P) * 0.0);
      });
    }
  }
}

TEST_CASE("reductions over every dim, with and without keepdim", "[autograd][gradcheck]") {
  auto x = random_tensor({3, 4, 5}, -1, 1);
  auto w = make_param({3, 4, 5});
  for (int dim = 0; dim < 3; ++dim) {
    for (bool keepdim : {false, true}) {
      SECTION("sum and mean, dim " + std::to_string(dim) + (keepdim ? " keepdim" : "")) {
        ts::Shape reduced = x.shape();
        if (keepdim) {
          reduced[dim] = 1;
        } else {
          reduced.erase(dim);
        }
        const auto c1 = random_tensor(reduced, -1, 1);
        const auto c2 = random_tensor(reduced, -1, 1);
        gradcheck({w}, x, [&](V input) {
          auto W = ag::parameter(w, input);
          auto s = ts::sum(W * input, dim, keepdim);
          auto m = ts::mean(ts::exp(W), dim, keepdim);
          return ts::sum(s * c1 + m * c2);
        });
      }
      SECTION("max and min, dim " + std::to_string(dim) + (keepdim ? " keepdim" : "")) {
        ts::Shape reduced = x.shape();
        if (keepdim) {
          reduced[dim] = 1;
        } else {
          reduced.erase(dim);
        }
        const auto c = random_tensor(reduced, -1, 1);
        gradcheck({w}, x, [&](V input) {
          auto W = ag::parameter(w, input);
          return ts::sum(ts::max(W, dim, keepdim) * c - ts::min(W, dim, keepdim) * c * 0.5);
        });
      }
    }
  }
  SECTION("full reductions") {
    gradcheck({w}, x, [&](V input) {
      auto W = ag::parameter(w, input);
      return ts::sum(W * input) * 0.5 + ts::mean(W * W) + ts::max(W) - ts::min(W * 2.0);
    });
  }
}

TEST_CASE("softmax and log_softmax along every dim", "[autograd][gradcheck]") {
  auto x = random_tensor({3, 4}, -1, 1);
  auto w = make_param({3, 4}, -2, 2);
  const auto c = random_tensor({3, 4}, -1, 1);
  for (int dim = 0; dim < 2; ++dim) {
    SECTION("dim " + std::to_string(dim)) {
      gradcheck({w}, x, [&](V input) {
        auto W = ag::parameter(w, input);
        return ts::sum(ts::softmax(W * input + W, dim) * c + ts::log_softmax(W, dim) * c * 0.3);
      });
    }
  }
}

TEST_CASE("matmul: 2-D, batched, shared right operand, transposed views", "[autograd][gradcheck]") {
  SECTION("x @ W^T + b with W a parameter") {
    auto x = random_tensor({4, 3}, -1, 1);
    auto w = make_param({5, 3});
    auto b = make_param({5});
    const auto c = random_tensor({4, 5}, -1, 1);
    gradcheck({w, b}, x, [&](V input) {
      auto W = ag::parameter(w, input);
      auto B = ag::parameter(b, input);
      return ts::sum(ts::tanh(ts::matmul(input, W.t()) + B) * c);
    });
  }
  SECTION("both operands parameters, transposed on both sides") {
    auto x = random_tensor({2, 2}, -1, 1);
    auto p = make_param({3, 4});
    auto q = make_param({5, 4});
    const auto c = random_tensor({4, 4}, -1, 1);
    gradcheck({p, q}, x, [&](V input) {
      auto P = ag::parameter(p, input);
      auto Q = ag::parameter(q, input);
      // [4, 3] @ ([3, 4] @ [4, 5]) @ [5, 4]
      return ts::sum(ts::matmul(ts::matmul(P.t(), ts::matmul(P, Q.t())), Q) * c) +
             ts::sum(input) * 0.0;
    });
  }
  SECTION("batched [B, m, k] x [B, k, n]") {
    auto x = random_tensor({2, 3, 4}, -1, 1);
    auto w = make_param({2, 4, 5});
    const auto c = random_tensor({2, 3, 5}, -1, 1);
    gradcheck({w}, x, [&](V input) {
      auto W = ag::parameter(w, input);
      return ts::sum(ts::matmul(input * 1.5, W) * c);
    });
  }
  SECTION("[B, m, k] x [k, n]: the right operand shared by the batch") {
    auto x = random_tensor({2, 3, 4}, -1, 1);
    auto w = make_param({4, 5});
    auto a = make_param({2, 3, 4});
    const auto c = random_tensor({2, 3, 5}, -1, 1);
    gradcheck({w, a}, x, [&](V input) {
      auto W = ag::parameter(w, input);
      auto A = ag::parameter(a, input);
      return ts::sum(ts::matmul(A * input, W) * c);
    });
  }
}

TEST_CASE("views, split and cat carry gradients", "[autograd][gradcheck]") {
  auto x = random_tensor({3, 4}, -1, 1);
  auto w = make_param({3, 4});
  auto cube = make_param({2, 3, 4});
  const auto c34 = random_tensor({3, 4}, -1, 1);
  const auto c43 = random_tensor({4, 3}, -1, 1);
  SECTION("transpose, view, reshape, narrow, unsqueeze, flatten, permute") {
    const auto c12 = random_tensor({12}, -1, 1);
    const auto c32 = random_tensor({3, 2}, -1, 1);
    const auto c423 = random_tensor({4, 2, 3}, -1, 1);
    gradcheck({w, cube}, x, [&](V input) {
      auto W = ag::parameter(w, input);
      auto Q = ag::parameter(cube, input);
      V s1 = ts::sum(W.t() * c43);
      V s2 = ts::sum(W.reshape({12}) * c12 * W.view({12}));
      V s3 = ts::sum(W.narrow(1, 1, 2) * c32);
      V s4 = ts::sum(W.unsqueeze(0).flatten() * c12);
      V s5 = ts::sum(Q.permute({2, 0, 1}) * c423);
      V s6 = ts::sum(W.t().reshape({12}) * c12);  // a copy: the transposed view is not viewable
      return s1 + s2 + s3 + s4 + s5 + s6 + ts::sum(input) * 0.0;
    });
  }
  SECTION("split and cat") {
    gradcheck({w}, x, [&](V input) {
      auto W = ag::parameter(w, input);
      auto parts = W.split(1, 1);  // four [3, 1] columns
      V shuffled = ts::cat(std::vector<V>{parts[3], parts[0] * 2.0, parts[2], parts[1]}, 1);
      auto rows = V(W * input).chunk(3, 0);
      V stacked = ts::cat(std::vector<V>{rows[2], rows[1], rows[0]}, 0);
      return ts::sum(shuffled * c34 + stacked * c34);
    });
  }
}

TEST_CASE("an MLP with mse and with cross entropy", "[autograd][gradcheck]") {
  auto x = random_tensor({6, 4}, -1, 1);
  auto w1 = make_param({8, 4});
  auto b1 = make_param({8});
  auto w2 = make_param({3, 8});
  auto b2 = make_param({3});
  const auto target = random_tensor({6, 3}, -1, 1);
  std::vector<double> hot(18, 0.0);
  for (int i = 0; i < 6; ++i) hot[static_cast<std::size_t>(i * 3 + (i * 7) % 3)] = 1.0;
  const auto onehot = ts::from_vector<double>(hot, {6, 3});
  auto logits = [&](const V& input) {
    V h = ts::tanh(ts::matmul(input, ag::parameter(w1, input).t()) + ag::parameter(b1, input));
    return V(ts::matmul(h, ag::parameter(w2, input).t()) + ag::parameter(b2, input));
  };
  SECTION("mse") {
    gradcheck({w1, b1, w2, b2}, x, [&](V input) {
      auto d = logits(input) - target;
      return ts::mean(d * d);
    });
  }
  SECTION("cross entropy through log_softmax") {
    gradcheck({w1, b1, w2, b2}, x, [&](V input) {
      return -ts::sum(ts::log_softmax(logits(input), 1) * onehot) / 6.0;
    });
  }
}

}  // namespace gradcheck_test
