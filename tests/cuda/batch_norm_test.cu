// BatchNorm2d on a CUDA device through its own channel reductions (backend/cuda/batch_norm.cuh:
// statistics in one pass, the backward's two sums in one pass), against float64 references
// computed here from the inputs' values by the textbook formulas: outputs, running statistics,
// input, weight and bias gradients, with and without the fused ReLU, for channels split over many
// blocks (few channels, many values), rows of a multiple of 4 (16-byte loads) and of 49 (one value
// at a time), and inputs whose mean is far from 0 (where a sum-of-squares variance would cancel).
// The executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tessera/tessera.hpp"

namespace cuda_batch_norm_test {  // one namespace per file: a unity build

namespace ts = tessera;
namespace ag = ts::autograd;

namespace {

struct reference {
  std::vector<double> y, dx, dweight, dbias, mean, var;
};

// BatchNorm2d in training mode, float64: y = relu?((x - mean) / sqrt(var + eps) * w + b), and
// the gradients for the upstream gradient gy.
reference batch_norm_reference(const std::vector<double>& x, const std::vector<double>& gy,
                               const std::vector<double>& w, const std::vector<double>& b,
                               std::int64_t n, std::int64_t c, std::int64_t l, double eps,
                               bool relu) {
  reference r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  const double count = static_cast<double>(n * l);
  auto at = [&](std::int64_t i, std::int64_t ch, std::int64_t j) {
    return static_cast<std::size_t>((i * c + ch) * l + j);
  };
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double mean = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < l; ++j) mean += x[at(i, ch, j)];
    mean /= count;
    double var = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < l; ++j) var += (x[at(i, ch, j)] - mean) * (x[at(i, ch, j)] - mean);
    var /= count;
    const double invstd = 1.0 / std::sqrt(var + eps);
    const double wc = w[static_cast<std::size_t>(ch)], bc = b[static_cast<std::size_t>(ch)];
    double sum_g = 0, sum_gxhat = 0;
    std::vector<double> masked(static_cast<std::size_t>(n * l));
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < l; ++j) {
        const double xhat = (x[at(i, ch, j)] - mean) * invstd;
        const double pre = xhat * wc + bc;
        r.y[at(i, ch, j)] = relu ? (pre > 0 ? pre : 0.0) : pre;
        const double g = relu && !(pre > 0) ? 0.0 : gy[at(i, ch, j)];
        masked[static_cast<std::size_t>(i * l + j)] = g;
        sum_g += g;
        sum_gxhat += g * xhat;
      }
    }
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < l; ++j) {
        const double xhat = (x[at(i, ch, j)] - mean) * invstd;
        const double g = masked[static_cast<std::size_t>(i * l + j)];
        r.dx[at(i, ch, j)] = wc * invstd * (g - sum_g / count - xhat * sum_gxhat / count);
      }
    }
    r.dweight.push_back(sum_gxhat);
    r.dbias.push_back(sum_g);
    r.mean.push_back(mean);
    r.var.push_back(var);
  }
  return r;
}

/// x = offset + N(0, 2), gy = N(0, 1), w = 0.5 + |N(0, 1)|, b = N(0, 0.1) for a batch norm over
/// `shape` (channels shape[1]), from `seed`.
std::tuple<std::vector<float>, std::vector<float>, std::vector<float>, std::vector<float>> inputs(
    const ts::Shape& shape, double offset, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(shape.numel())), gy(x.size()),
      w(static_cast<std::size_t>(shape[1])), b(w.size());
  for (auto& v : x) v = static_cast<float>(offset) + normal(rng) * 2.0f;
  for (auto& v : gy) v = normal(rng);
  for (auto& v : w) v = 0.5f + std::abs(normal(rng));
  for (auto& v : b) v = normal(rng) * 0.1f;
  return {x, gy, w, b};
}

std::vector<double> doubles(const ts::Tensor<float>& t) {
  std::vector<double> out;
  for (float v : t.to_vector()) out.push_back(v);
  return out;
}

// |got - want| <= rel * scale for each element, scale the largest |want| (the values' own size:
// gradients near 0 are not compared relatively).
void check_near(const std::vector<double>& got, const std::vector<double>& want, double rel,
                const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= rel * scale)) {
      if (bad++ == 0) first = i;
    }
  }
  INFO(bad << " of " << got.size() << " differ; first at " << first << ": got "
            << (bad ? got[first] : 0.0) << ", want " << (bad ? want[first] : 0.0) << " (scale "
            << scale << ")");
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("BatchNorm2d on CUDA: statistics, running statistics and gradients against float64",
          "[cuda][batchnorm]") {
  struct shape_case {
    std::int64_t n, c, h, w;
    double offset;  // added to every input: a mean far from 0
    bool relu;
  };
  // 4 channels of 8 x 56 x 56: each channel split over many blocks; 7 x 7 rows of 49 (no 16-byte
  // loads); 1000 + N(0, 1) inputs; a channel count that is not a multiple of anything.
  const std::vector<shape_case> cases = {{8, 4, 56, 56, 0.0, false}, {8, 4, 56, 56, 0.0, true},
                                         {4, 24, 7, 7, 0.0, true},   {2, 3, 64, 64, 1000.0, false},
                                         {16, 5, 1, 4, 0.0, false}};
  for (const auto& sc : cases) {
    const std::int64_t l = sc.h * sc.w;
    const ts::Shape shape{sc.n, sc.c, sc.h, sc.w};
    INFO("shape " << shape << ", offset " << sc.offset << ", relu " << sc.relu);
    const auto [x, gy, w, b] =
        inputs(shape, sc.offset, static_cast<unsigned>(sc.n * 131 + sc.c * 7 + l));
    const double eps = 1e-5;

    ts::nn::BatchNorm2d<float, ts::cuda> bn(sc.c, {.momentum = 0.25}, 0);
    bn.weight().value().copy_(ts::from_vector<float>(w, {sc.c}).cuda());
    bn.bias().value().copy_(ts::from_vector<float>(b, {sc.c}).cuda());
    auto spec = ag::input<float, ts::cuda>(shape, 0);
    spec.requires_grad = true;
    const bool relu = sc.relu;
    auto program = ag::compile(
        [&](const auto& input, const auto& g) {
          ag::Var<float, ts::cuda> y = relu ? bn.forward_relu(input) : bn(input);
          return std::tuple{ts::sum(y * g), y};
        },
        spec, ag::input<float, ts::cuda>(shape, 0));
    bn.zero_grad();
    const auto xs = ts::from_vector<float>(x, shape).cuda();
    const auto gs = ts::from_vector<float>(gy, shape).cuda();
    const auto [loss, y] = program.forward(xs, gs);
    program.backward();

    std::vector<double> xd(x.begin(), x.end()), gd(gy.begin(), gy.end()), wd(w.begin(), w.end()),
        bd(b.begin(), b.end());
    const reference want = batch_norm_reference(xd, gd, wd, bd, sc.n, sc.c, l, eps, sc.relu);
    // float's rounding of x (2^-24 of |x|, up to 1000: the offset case) bounds what y can be.
    const double rel = sc.offset > 0 ? 2e-3 : 2e-5;
    check_near(doubles(y.cpu()), want.y, rel, "y");
    check_near(doubles(program.input_grad(0).as<float, ts::cuda>().cpu()), want.dx, rel * 10, "dx");
    check_near(doubles(bn.weight().grad().cpu()), want.dweight, 1e-4, "dweight");
    check_near(doubles(bn.bias().grad().cpu()), want.dbias, 1e-4, "dbias");
    // Running statistics after one step from (0, 1), momentum 0.25: the variance unbiased.
    const double count = static_cast<double>(sc.n * l);
    std::vector<double> running_mean, running_var;
    for (std::int64_t ch = 0; ch < sc.c; ++ch) {
      running_mean.push_back(0.25 * want.mean[static_cast<std::size_t>(ch)]);
      running_var.push_back(0.75 + 0.25 * want.var[static_cast<std::size_t>(ch)] * count /
                                       (count - 1));
    }
    check_near(doubles(bn.running_mean().value().cpu()), running_mean, 1e-5, "running_mean");
    check_near(doubles(bn.running_var().value().cpu()), running_var, 1e-5, "running_var");
  }
}

TEST_CASE("BatchNorm2d's CUDA passes on channels_last tensors against float64",
          "[cuda][batchnorm][channels_last]") {
  namespace nd = ts::nn::detail;
  struct shape_case {
    std::int64_t n, c, h, w;
    double offset;
    bool relu;
  };
  // Few channels over many positions (split to fill the device), channel counts that are not a
  // multiple of the warp's 32 (70: three groups, the last partly idle), a mean far from 0, and
  // positions fewer than a block's rows of threads.
  const std::vector<shape_case> cases = {{8, 4, 56, 56, 0.0, false},
                                         {8, 64, 28, 28, 0.0, true},
                                         {4, 70, 7, 7, 0.0, true},
                                         {2, 3, 64, 64, 1000.0, false},
                                         {1, 5, 1, 3, 0.0, false}};
  for (const auto& sc : cases) {
    const std::int64_t l = sc.h * sc.w;
    const ts::Shape shape{sc.n, sc.c, sc.h, sc.w};
    const ts::Shape view{sc.n, sc.c, l};
    INFO("shape " << shape << ", offset " << sc.offset << ", relu " << sc.relu);
    const auto [x, gy, w, b] =
        inputs(shape, sc.offset, static_cast<unsigned>(sc.n * 17 + sc.c * 5 + l));
    const double eps = 1e-5;
    auto nhwc = [&](const std::vector<float>& values) {
      return ts::from_vector<float>(values, shape)
          .contiguous(ts::memory_format::channels_last)
          .cuda(0);
    };
    const auto xs = nhwc(x), gs = nhwc(gy);
    auto ys = ts::empty<float, ts::cuda>(shape, ts::memory_format::channels_last, 0);
    auto dxs = ts::empty<float, ts::cuda>(shape, ts::memory_format::channels_last, 0);
    const auto ws_ = ts::from_vector<float>(w, {sc.c}).cuda(0);
    const auto bs = ts::from_vector<float>(b, {sc.c}).cuda(0);
    auto dw = ts::empty<float, ts::cuda>({sc.c}, 0), db = ts::empty<float, ts::cuda>({sc.c}, 0);
    auto stats = ts::empty<float, ts::cuda>({3, sc.c}, 0);
    const auto x3 = xs.view(view), g3 = gs.view(view);
    auto y3 = ys.view(view), dx3 = dxs.view(view);
    REQUIRE(nd::channels_last_view(x3));
    nd::workspace ws = nd::eager_workspace(
        xs.device(), nd::batch_norm_stats_workspace<float, ts::cuda>(view) +
                         nd::batch_norm_backward_workspace<float, ts::cuda>(view));
    ts::cuda::synchronize(0);
    const auto launches = ts::profiler::kernel_launches();
    nd::batch_norm_batch_stats(x3, stats, eps, ws);
    nd::batch_norm_apply(x3, stats, &ws_, &bs, sc.relu, y3, ws);
    nd::batch_norm_backward(x3, stats, &ws_, y3, sc.relu, true, g3, &dx3, false, &dw, false, &db,
                            false, ws);
    // Statistics, apply, gradient sums, dx (one launch each), dw and db (one each at most): the
    // channels_last kernels; the generic passes take 7 launches for the statistics alone.
    CHECK(ts::profiler::kernel_launches() - launches <= 6);

    std::vector<double> xd(x.begin(), x.end()), gd(gy.begin(), gy.end()), wd(w.begin(), w.end()),
        bd(b.begin(), b.end());
    const reference want = batch_norm_reference(xd, gd, wd, bd, sc.n, sc.c, l, eps, sc.relu);
    const double rel = sc.offset > 0 ? 2e-3 : 2e-5;
    check_near(doubles(stats.select(0, 0).cpu()), want.mean, rel, "mean");
    check_near(doubles(stats.select(0, 2).cpu()), want.var, 1e-4, "var");
    check_near(doubles(ys.cpu()), want.y, rel, "y");  // cpu() keeps NHWC; to_vector is logical
    check_near(doubles(dxs.cpu()), want.dx, rel * 10, "dx");
    check_near(doubles(dw.cpu()), want.dweight, 1e-4, "dweight");
    check_near(doubles(db.cpu()), want.dbias, 1e-4, "dbias");
  }
}

TEST_CASE("BatchNorm2d on CUDA: running statistics, no affine, and input gradients that add up",
          "[cuda][batchnorm]") {
  // Two batch norms read the same input: one without weight and bias normalising with the
  // batch's statistics, one with the running statistics (eval) and ReLU fused. The input's
  // gradient is the sum of both (the second written onto the first), each through CUDA's dx
  // pass, against the same program on the CPU in float64; planes of 49 (one element at a time)
  // and of 64 (16-byte steps).
  for (const ts::Shape& shape : {ts::Shape{4, 6, 7, 7}, ts::Shape{3, 5, 8, 8}}) {
    INFO("shape " << shape);
    const std::int64_t c = shape[1];
    ts::manual_seed(21);
    ts::nn::BatchNorm2d<double> plain_cpu(c, {.affine = false});
    ts::nn::BatchNorm2d<double> running_cpu(c);
    running_cpu.running_mean().value().copy_(ts::randn<double>({c}));
    running_cpu.running_var().value().copy_(ts::eval(ts::rand<double>({c}) + 0.5));
    running_cpu.weight().value().copy_(ts::randn<double>({c}));
    running_cpu.bias().value().copy_(ts::randn<double>({c}));
    auto plain_gpu = ts::nn::to<ts::cuda>(plain_cpu, 0);
    auto running_gpu = ts::nn::to<ts::cuda>(running_cpu, 0);
    running_cpu.eval();
    running_gpu.eval();
    const auto x = ts::randn<double>(shape);
    const auto g = ts::randn<double>(shape);
    auto run = [&](auto& plain, auto& running, const auto& input, const auto& grad) {
      using K = typename std::remove_cvref_t<decltype(input)>::device_kind;
      auto spec = ag::input<double, K>(shape, 0);
      spec.requires_grad = true;
      auto program = ag::compile(
          [&](const auto& v, const auto& gv) {
            return ts::sum((plain(v) + running.forward_relu(v)) * gv);
          },
          spec, ag::input<double, K>(shape, 0));
      plain.zero_grad();
      running.zero_grad();
      program.forward(input, grad);
      program.backward();
      return std::tuple{
          program.input_grad(0).template as<double, K>().template to<ts::cpu>().to_vector(),
          running.weight().grad().template to<ts::cpu>().to_vector(),
          running.bias().grad().template to<ts::cpu>().to_vector()};
    };
    const auto [dx_cpu, dw_cpu, db_cpu] = run(plain_cpu, running_cpu, x, g);
    const auto [dx_gpu, dw_gpu, db_gpu] =
        run(plain_gpu, running_gpu, x.to<ts::cuda>(0), g.to<ts::cuda>(0));
    check_near(dx_gpu, dx_cpu, 1e-12, "dx");
    check_near(dw_gpu, dw_cpu, 1e-12, "dweight");
    check_near(db_gpu, db_cpu, 1e-12, "dbias");
    // The outputs too (the apply pass, with and without weight and bias).
    const ts::Tensor<double> y_cpu = plain_cpu(x);
    const ts::Tensor<double, ts::cuda> y_gpu = plain_gpu(x.to<ts::cuda>(0));
    check_near(y_gpu.to<ts::cpu>().to_vector(), y_cpu.to_vector(), 1e-12, "y, no affine");
    const ts::Tensor<double> z_cpu = running_cpu.forward_relu(x);
    const ts::Tensor<double, ts::cuda> z_gpu = running_gpu.forward_relu(x.to<ts::cuda>(0));
    check_near(z_gpu.to<ts::cpu>().to_vector(), z_cpu.to_vector(), 1e-12, "y, running, ReLU");
  }
}

}  // namespace cuda_batch_norm_test
