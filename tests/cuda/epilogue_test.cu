// Products with their bias and ReLU as cuBLASLt's epilogue (backend::cuda::gemm_bias, the plan's
// fold of Linear's '+ b' and a following ReLU): the call itself for float, half and bfloat16,
// every transpose combination and odd sizes, against float64 products computed here; and Linear ->
// ReLU programs on CUDA, whose folded elementwise nodes must not run (cuBLASLt took the work:
// the profiler's rows), against the same program in float64 on the CPU.
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "expr/elementwise_reference.hpp"
#include "profile_support.hpp"
#include "tessera/autograd.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/nn.hpp"
#include "tessera/tensor/factories.hpp"
#include "tessera/tools/profile.hpp"

namespace cuda_epilogue_test {  // one namespace per file: a unity build

namespace ts = tessera;
namespace ag = tessera::autograd;
namespace nn = tessera::nn;
using expr_test::to_double;
using tessera_test::calls;

namespace {

template <class T, class K>
std::vector<double> values_of(const ts::Tensor<T, K>& t) {
  std::vector<double> out;
  for (T v : t.contiguous().to_vector()) out.push_back(to_double(v));
  return out;
}

template <class T>
ts::Tensor<T, ts::cpu> random_host(const ts::Shape& shape, std::mt19937& rng) {
  std::vector<T> values(static_cast<std::size_t>(shape.numel()));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : values) v = T(u(rng));
  return ts::from_vector<T>(values, shape);
}

// Unit roundoff of T's storage, and of the sums cuBLASLt runs in fp32 (TF32 is off).
template <class T>
double roundoff() {
  if constexpr (std::is_same_v<T, ts::half>) return 1.0 / 2048;
  if constexpr (std::is_same_v<T, ts::bfloat16>) return 1.0 / 256;
  return 1.0 / (1 << 23);
}

}  // namespace

TEMPLATE_TEST_CASE(
    "gemm_bias: a product with its bias (and ReLU) in one cuBLASLt call, against "
    "float64",
    "[cuda][matmul][epilogue]", float, ts::half, ts::bfloat16) {
  using T = TestType;
  std::mt19937 rng(42);
  struct problem {
    std::int64_t m, n, k;
  };
  // Sizes a Linear meets (multiples of 16: cuBLASLt must take them) and odd ones (either path).
  for (const problem p : {problem{64, 128, 96}, problem{256, 64, 512}, problem{37, 29, 53}}) {
    for (const bool relu : {false, true}) {
      for (const bool weight_transposed : {true, false}) {
        CAPTURE(p.m, p.n, p.k, relu, weight_transposed);
        const auto a = random_host<T>({p.m, p.k}, rng);
        // Linear's x @ W.t(): W [n, k] read transposed; or a plain [k, n] matrix.
        const auto w =
            random_host<T>(weight_transposed ? ts::Shape{p.n, p.k} : ts::Shape{p.k, p.n}, rng);
        const auto bias = random_host<T>({p.n}, rng);
        const auto da = a.cuda(0), dw = w.cuda(0), dbias = bias.cuda(0);
        const auto b = weight_transposed ? dw.t() : dw;
        auto out = ts::empty<T, ts::cuda>({p.m, p.n}, 0);
        const bool applied = ts::detail::matmul_bias_into(out, da, b, dbias, relu);
        if (p.m % 16 == 0) CHECK(applied);  // cuBLASLt has kernels for these
        if (!applied) continue;             // nothing written: the caller's usual path
        const auto av = values_of(a), wv = values_of(w), bv = values_of(bias);
        const auto got = values_of(out);
        for (std::int64_t i = 0; i < p.m; ++i) {
          for (std::int64_t j = 0; j < p.n; ++j) {
            double sum = bv[static_cast<std::size_t>(j)], magnitude = std::abs(sum);
            for (std::int64_t q = 0; q < p.k; ++q) {
              const double wq = weight_transposed ? wv[static_cast<std::size_t>(j * p.k + q)]
                                                  : wv[static_cast<std::size_t>(q * p.n + j)];
              const double term = av[static_cast<std::size_t>(i * p.k + q)] * wq;
              sum += term;
              magnitude += std::abs(term);
            }
            const double want = relu ? std::max(sum, 0.0) : sum;
            // fp32 sums over k terms, then one rounding to T.
            const double bound = magnitude * (static_cast<double>(p.k) + 2) / (1 << 23) +
                                 std::abs(want) * roundoff<T>() + 1e-30;
            const double g = got[static_cast<std::size_t>(i * p.n + j)];
            if (std::abs(g - want) > bound) {
              CAPTURE(i, j, g, want, bound);
              FAIL_CHECK("gemm_bias differs from float64");
            }
          }
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE(
    "Linear -> ReLU programs on CUDA: the products take the bias and ReLU, and "
    "the numbers are float64's",
    "[cuda][autograd][epilogue]", float, ts::half, ts::bfloat16) {
  using T = TestType;
  constexpr std::int64_t rows = 64;
  nn::Linear<double> h1(32, 64), h2(64, 48), h3(48, 16);  // the reference, on the CPU
  nn::Linear<T, ts::cuda> d1(32, 64, true, 0), d2(64, 48, true, 0), d3(48, 16, true, 0);
  auto copy = [](const nn::Linear<double>& from, nn::Linear<T, ts::cuda>& to) {
    // The device layer's values rounded to T, and the reference given exactly those.
    to.weight().value().copy_(from.weight().value().to<T>().cuda(0));
    to.bias().value().copy_(from.bias().value().to<T>().cuda(0));
    from.weight().value().copy_(to.weight().value().cpu().template to<double>());
    from.bias().value().copy_(to.bias().value().cpu().template to<double>());
  };
  copy(h1, d1);
  copy(h2, d2);
  copy(h3, d3);
  std::mt19937 rng(7);
  const auto x = random_host<T>({rows, 32}, rng);
  const auto c = random_host<T>({rows, 16}, rng);
  const auto xd = x.template to<double>(), cd = c.template to<double>();
  auto reference =
      ag::compile([&](auto in) { return ts::sum(h3(ts::relu(h2(ts::relu(h1(in))))) * cd); },
                  ag::input<double>({rows, 32}));
  const double want = reference.forward(xd).item();
  reference.backward();

  const auto cc = c.cuda(0);
  auto program =
      ag::compile([&](auto in) { return ts::sum(d3(ts::relu(d2(ts::relu(d1(in))))) * cc); },
                  ag::input<T, ts::cuda>({rows, 32}, 0));
  INFO(program.memory_report());
  CHECK(program.plan().epilogues == 3);
  CHECK(reference.plan().epilogues == 3);
  ts::tools::Profile profile;
  double got = 0;
  {
    auto recording = profile.record();
    got = to_double(program.forward(x.cuda(0)).item());
    program.backward();
    ts::cuda::synchronize(0);
  }
  const auto rows_seen = profile.rows();
  INFO(profile.table());
  CHECK(calls(rows_seen, "matmul", "forward") == 3);
  CHECK(calls(rows_seen, "fused", "forward") == 0);  // cuBLASLt applied every bias and ReLU

  // Storage roundings of T through three layers: a loose relative bound per format.
  const double tolerance = std::is_same_v<T, float>      ? 1e-4
                           : std::is_same_v<T, ts::half> ? 3e-2
                                                         : 1e-1;
  CHECK(got == Approx(want).epsilon(tolerance).margin(tolerance));
  const std::vector<std::pair<const nn::Linear<double>*, const nn::Linear<T, ts::cuda>*>> pairs{
      {&h1, &d1}, {&h2, &d2}, {&h3, &d3}};
  for (std::size_t l = 0; l < pairs.size(); ++l) {
    CAPTURE(l);
    const auto want_w = values_of(pairs[l].first->weight().grad());
    const auto got_w = values_of(pairs[l].second->weight().grad().cpu());
    const auto want_b = values_of(pairs[l].first->bias().grad());
    const auto got_b = values_of(pairs[l].second->bias().grad().cpu());
    double scale = 0;
    for (double v : want_w) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < want_w.size(); ++i) {
      if (std::abs(got_w[i] - want_w[i]) > tolerance * (scale + 1)) {
        CAPTURE(i, got_w[i], want_w[i]);
        FAIL_CHECK("weight gradient differs");
      }
    }
    for (std::size_t i = 0; i < want_b.size(); ++i) {
      CHECK(got_b[i] == Approx(want_b[i]).margin(tolerance * (scale + 1)));
    }
  }
}

}  // namespace cuda_epilogue_test
