// Convolution, pooling and BatchNorm2d against PyTorch (tests/oracles/nn_torch.py, section
// "conv", float64): conv2d forward and the input, weight and bias gradients over a grid of
// stride, padding, dilation, groups, 1x1 and bias; max, average and adaptive pooling forward and
// input gradient; BatchNorm2d over three training steps (outputs, input gradients, running
// statistics, accumulated parameter gradients) and evaluation. Each runs eagerly and as a
// compiled program, in float64 and float32, through the CPU loops (one image per GEMM, two, or
// the whole batch) and through the device-agnostic path CUDA takes. Errors name the layer and
// the shapes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "nn/torch_oracle.hpp"
#include "tessera/tessera.hpp"

namespace conv_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;
namespace F = tessera::nn::functional;

namespace {

const torch_oracle::file& oracle() {
  static const torch_oracle::file file("conv");
  return file;
}

// float64 agrees with PyTorch to rounding (different summation orders); float32 to a few ulps
// of the sums' magnitudes.
template <class T>
constexpr double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;

struct conv_case {
  const char* name;
  std::int64_t out;
  nn::Int2 kernel, stride, padding, dilation;
  std::int64_t groups;
  bool bias;
};

const conv_case conv_cases[] = {
    {"same3x3", 4, 3, 1, 1, 1, 1, true},
    {"stride2", 5, 3, 2, 1, 1, 1, false},
    {"pointwise", 4, 1, 1, 0, 1, 1, true},
    {"pointwise_s2", 8, 1, 2, 0, 1, 1, false},
    {"dilated", 4, 3, 1, 2, 2, 1, true},
    {"grouped", 6, 3, 1, 1, 1, 2, true},
    {"depthwise", 4, 3, {2, 1}, 1, 1, 4, false},
    {"stem7x7", 5, 7, 2, 3, 1, 1, false},
    {"rect", 4, {2, 3}, {2, 1}, {0, 1}, {1, 2}, 1, true},
    {"whole", 3, 5, 1, 0, 1, 1, true},
    {"wino_odd", 6, 3, 1, 1, 1, 1, true},
    {"wino_pad0", 3, 3, 1, 0, 1, 1, false},
    {"wino_pad2", 4, 3, 1, 2, 1, 1, true},
    {"wino_rect", 5, 3, 1, {0, 2}, 1, 1, false},
    {"wino_s2_odd", 6, 3, 2, 1, 1, 1, true},
    {"wino_s2_pad0", 3, 3, 2, 0, 1, 1, false},
    {"wino_s2_pad2", 4, 3, 2, 2, 1, 1, true},
    {"wino_s2_rect", 5, 3, 2, {0, 2}, 1, 1, false},
};

/// True for the cases that Winograd F(2x2, 3x3) takes on CPU (given enough channels): stride 1
/// with padding up to 2, or stride 2.
bool winograd_shape(const conv_case& c) {
  const bool stride1 = c.stride == nn::Int2(1) && c.padding.h <= 2 && c.padding.w <= 2;
  return c.kernel == nn::Int2(3) && (stride1 || c.stride == nn::Int2(2)) &&
         c.dilation == nn::Int2(1) && c.groups == 1;
}

/// Sets the device-agnostic (CUDA) im2col path for its lifetime.
struct generic_path {
  bool saved;
  explicit generic_path(bool on) : saved(nn::detail::conv2d_use_generic_path()) {
    nn::detail::conv2d_use_generic_path() = on;
  }
  ~generic_path() { nn::detail::conv2d_use_generic_path() = saved; }
};

/// Sets the GEMM columns a CPU pass aims for (images per pass) for its lifetime.
struct pass_columns {
  std::int64_t saved;
  explicit pass_columns(std::int64_t columns) : saved(nn::detail::conv2d_pass_columns()) {
    nn::detail::conv2d_pass_columns() = columns;
  }
  ~pass_columns() { nn::detail::conv2d_pass_columns() = saved; }
};

/// Sets Winograd's channel threshold and its tiles per block (through the elements a block's
/// operands may hold) for its lifetime.
struct winograd_setting {
  std::int64_t saved_channels, saved_elements;
  winograd_setting(std::int64_t min_channels, std::int64_t block_elements)
      : saved_channels(nn::detail::conv2d_winograd_min_channels()),
        saved_elements(nn::detail::conv2d_winograd_block_elements()) {
    nn::detail::conv2d_winograd_min_channels() = min_channels;
    nn::detail::conv2d_winograd_block_elements() = block_elements;
  }
  ~winograd_setting() {
    nn::detail::conv2d_winograd_min_channels() = saved_channels;
    nn::detail::conv2d_winograd_block_elements() = saved_elements;
  }
};

/// Sets the col elements of a chunk of output rows (one row per chunk at 1) for its lifetime.
struct chunk_elements {
  std::int64_t saved;
  explicit chunk_elements(std::int64_t elements) : saved(nn::detail::conv2d_chunk_elements()) {
    nn::detail::conv2d_chunk_elements() = elements;
  }
  ~chunk_elements() { nn::detail::conv2d_chunk_elements() = saved; }
};

/// Sets the parts the CPU loops split a batch into (one per thread) for its lifetime.
struct cpu_parts {
  std::int64_t saved;
  explicit cpu_parts(std::int64_t parts) : saved(nn::detail::conv2d_cpu_parts()) {
    nn::detail::conv2d_cpu_parts() = parts;
  }
  ~cpu_parts() { nn::detail::conv2d_cpu_parts() = saved; }
};

/// How the CPU loops cut the batch into passes: one image each, two (the last pass of an odd
/// batch has one), or the whole batch in one pass.
enum class passes { one, two, all };

template <class T>
void check(const ts::Tensor<T>& actual, const std::string& name, double scale = 1) {
  torch_oracle::check_close(actual, oracle().at(name), tol<T> * scale, tol<T> * scale);
}

template <class T>
void check_conv(const conv_case& c, passes cut) {
  const std::string tag = std::string("conv.") + c.name;
  const auto x = oracle().tensor<T>(tag + ".x");
  const auto gy = oracle().tensor<T>(tag + ".gy");
  const std::int64_t spatial = gy.size(2) * gy.size(3);
  pass_columns columns(cut == passes::one ? 1 : cut == passes::two ? 2 * spatial : 1 << 30);
  const std::int64_t in = x.size(1);
  nn::Conv2d<T> conv(in, c.out, c.kernel,
                     {.stride = c.stride, .padding = c.padding, .dilation = c.dilation,
                      .groups = c.groups, .bias = c.bias});
  ts::StateDict dict{{"weight", oracle().tensor<T>(tag + ".w")}};
  if (c.bias) dict.insert("bias", oracle().tensor<T>(tag + ".b"));
  conv.load_state_dict(dict);

  // Eager: the layer and the functional form.
  check<T>(conv(x), tag + ".y");
  const nn::Conv2dArgs args{c.stride, c.padding, c.dilation, c.groups};
  if (c.bias) {
    check<T>(F::conv2d(x, conv.weight().value(), conv.bias().value(), args), tag + ".y");
  } else {
    check<T>(F::conv2d(x, conv.weight().value(), args), tag + ".y");
  }
  // A non-contiguous input (a transposed copy transposed back) gives the same result.
  check<T>(conv(x.transpose(2, 3).contiguous().transpose(2, 3)), tag + ".y");

  // Compiled: loss = sum(y * gy) gives dL/dy = gy; the input's gradient through input_grad.
  auto spec = ag::input<T>(x.shape());
  spec.requires_grad = true;
  auto program = ag::compile(
      [&](const auto& xv, const auto& g) { return ts::sum(conv(xv) * g); }, spec,
      ag::input<T>(gy.shape()));
  for (int run = 0; run < 2; ++run) {  // a second run reuses the plan and its workspace
    INFO("run " << run);
    conv.zero_grad();
    program.forward(x, gy);
    program.backward();
    check<T>(program.input_grad(0).template as<T>(), tag + ".dx");
    check<T>(conv.weight().grad(), tag + ".dw");
    if (c.bias) check<T>(conv.bias().grad(), tag + ".db");
  }

  // An input that needs no gradient (a network's images): only the parameters' gradients.
  auto frozen_input =
      ag::compile([&](const auto& xv, const auto& g) { return ts::sum(conv(xv) * g); },
                  ag::input<T>(x.shape()), ag::input<T>(gy.shape()));
  conv.zero_grad();
  frozen_input.forward(x, gy);
  frozen_input.backward();
  check<T>(conv.weight().grad(), tag + ".dw");
  if (c.bias) check<T>(conv.bias().grad(), tag + ".db");

  // The functional form with constant weights (tensors): only the input's gradient.
  const auto weight = conv.weight().value();
  auto constant = ag::compile(
      [&](const auto& xv, const auto& g) {
        if (c.bias) return ts::sum(F::conv2d(xv, weight, conv.bias().value(), args) * g);
        return ts::sum(F::conv2d(xv, weight, args) * g);
      },
      spec, ag::input<T>(gy.shape()));
  constant.forward(x, gy);
  constant.backward();
  check<T>(constant.input_grad(0).template as<T>(), tag + ".dx");

  // A second contribution to x's gradient, from sum(x) (its backward adds to conv's).
  auto twice = ag::compile(
      [&](const auto& xv, const auto& g) { return ts::sum(conv(xv) * g) + ts::sum(xv) * 0.5; },
      spec, ag::input<T>(gy.shape()));
  twice.forward(x, gy);
  twice.backward();
  const ts::Tensor<T> shifted = twice.input_grad(0).template as<T>() - 0.5;
  check<T>(shifted, tag + ".dx");

  // The layer used twice: the second convolution's backward adds into the gradients the first
  // wrote (the input's and the weight's accumulating branches), so both are twice PyTorch's.
  auto doubled = ag::compile(
      [&](const auto& xv, const auto& g) { return ts::sum(conv(xv) * g) + ts::sum(conv(xv) * g); },
      spec, ag::input<T>(gy.shape()));
  conv.zero_grad();
  doubled.forward(x, gy);
  doubled.backward();
  const ts::Tensor<T> half_dx = doubled.input_grad(0).template as<T>() * 0.5;
  check<T>(half_dx, tag + ".dx");
  const ts::Tensor<T> half_dw = conv.weight().grad() * 0.5;
  check<T>(half_dw, tag + ".dw");
  if (c.bias) {
    const ts::Tensor<T> half_db = conv.bias().grad() * 0.5;
    check<T>(half_db, tag + ".db");
  }
}

}  // namespace

TEMPLATE_TEST_CASE("conv2d matches PyTorch: forward and every gradient", "[conv][oracle]", float,
                   double) {
  for (const conv_case& c : conv_cases) {
    // The batch (2 or 3 images) in one part, in two parts run at once (2 + 1 for 3 images), and
    // in a part per image.
    for (passes cut : {passes::one, passes::two, passes::all}) {
      const std::int64_t parts = cut == passes::one ? 1 : cut == passes::two ? 2 : 3;
      cpu_parts split(parts);
      INFO(c.name << " (CPU loops, "
                  << (cut == passes::one   ? "one image"
                      : cut == passes::two ? "two images"
                                           : "the batch")
                  << " per pass, " << parts << " parts at most)");
      check_conv<TestType>(c, cut);
    }
    // Images in chunks of one output row, in one part and in two: every case with one group, a
    // kernel other than a plain 1x1 and two output rows or more is cut (the rule's patch limit,
    // 512 rows, is above every case's).
    const ts::Tensor<TestType> input =
        oracle().tensor<TestType>(std::string("conv.") + c.name + ".x");
    const nn::Conv2dArgs args{.stride = c.stride, .padding = c.padding, .dilation = c.dilation,
                              .groups = c.groups};
    const ts::Shape weight{c.out, input.size(1) / c.groups, c.kernel.h, c.kernel.w};
    const auto chunked = [&] {
      pass_columns columns(1);
      chunk_elements chunks(1);
      return nn::detail::conv2d_geometry_of("conv2d", input.shape(), weight, nullptr, args)
          .cpu_chunk;
    }();
    const bool plain_1x1 = c.kernel == nn::Int2(1) && c.stride == nn::Int2(1) &&
                           c.padding == nn::Int2(0);
    const std::int64_t out_rows =
        oracle().tensor<TestType>(std::string("conv.") + c.name + ".gy").size(2);
    // Where no chunk is cut, these runs still check one image per pass in two parts.
    REQUIRE(chunked == (c.groups == 1 && !plain_1x1 && out_rows >= 2 ? 1 : 0));
    for (const std::int64_t parts : {1, 2}) {
      cpu_parts split(parts);
      chunk_elements chunks(1);
      INFO(c.name << " (CPU loops, one output row per chunk, " << parts << " parts at most)");
      check_conv<TestType>(c, passes::one);
    }
    if (winograd_shape(c)) {
      // Winograd with these few channels: all tiles in one block, then 3 tiles per block (blocks
      // that end inside a row of tiles and inside an image).
      const ts::Tensor<TestType> x =
          oracle().tensor<TestType>(std::string("conv.") + c.name + ".x");
      const std::int64_t elements = c.stride == nn::Int2(1) ? 16 : 25;
      for (const std::int64_t tiles : {std::int64_t{1} << 20, std::int64_t{3}}) {
        winograd_setting winograd(1, tiles * elements * (x.size(1) + c.out));
        INFO(c.name << " (Winograd, " << tiles << " tiles per block at most)");
        // The case's sizes are ones Winograd takes (else this would test im2col again).
        const ts::Shape w{c.out, x.size(1) / c.groups, c.kernel.h, c.kernel.w};
        const nn::Conv2dArgs a{.stride = c.stride, .padding = c.padding, .dilation = c.dilation,
                               .groups = c.groups};
        REQUIRE(nn::detail::conv2d_winograd<TestType, ts::cpu>(
            nn::detail::conv2d_geometry_of("conv2d", x.shape(), w, nullptr, a)));
        check_conv<TestType>(c, passes::all);
      }
    }
    generic_path path(true);
    INFO(c.name << " (device-agnostic path)");
    check_conv<TestType>(c, passes::one);
  }
}

TEST_CASE("conv2d: which 3x3 convolutions run as Winograd on CPU", "[conv]") {
  const nn::Conv2dArgs same{.stride = 1, .padding = 1};
  auto winograd = [](const ts::Shape& x, const ts::Shape& w, const nn::Conv2dArgs& a) {
    const auto g = nn::detail::conv2d_geometry_of("conv2d", x, w, nullptr, a);
    return nn::detail::conv2d_winograd<float, ts::cpu>(g);
  };
  // ResNet's 3x3 layers (64 channels and more), by default.
  CHECK(winograd({8, 64, 56, 56}, {64, 64, 3, 3}, same));
  CHECK(winograd({8, 512, 7, 7}, {512, 512, 3, 3}, same));
  // Fewer tiles (2x2 blocks of output, over the batch) than one per 8 channels: 8 images of
  // 1x1 or 2 images of 7x7 (2 x 16 tiles) with 512 channels; 4 images of 7x7 suffice.
  CHECK_FALSE(winograd({8, 512, 1, 1}, {512, 512, 3, 3}, same));
  CHECK_FALSE(winograd({2, 512, 7, 7}, {512, 512, 3, 3}, same));
  CHECK(winograd({4, 512, 7, 7}, {512, 512, 3, 3}, same));
  // Too few channels on either side (the default threshold is 32).
  CHECK_FALSE(winograd({8, 16, 56, 56}, {64, 16, 3, 3}, same));
  CHECK_FALSE(winograd({8, 64, 56, 56}, {16, 64, 3, 3}, same));
  // Stride 2 (ResNet's downsampling 3x3 layers), with any padding; not stride 3 or 2 by 1.
  const nn::Conv2dArgs s2{.stride = 2, .padding = 1};
  CHECK(winograd({8, 128, 56, 56}, {128, 128, 3, 3}, s2));
  CHECK(winograd({8, 256, 28, 28}, {256, 256, 3, 3}, s2));
  CHECK(winograd({8, 64, 56, 56}, {64, 64, 3, 3}, {.stride = 2, .padding = 3}));
  // With stride 2, a tile per channel: 4 images of 7 x 7 tiles for 256 channels are too few.
  CHECK_FALSE(winograd({4, 256, 28, 28}, {256, 256, 3, 3}, s2));
  CHECK(winograd({6, 256, 28, 28}, {256, 256, 3, 3}, s2));
  // And outputs that fill their tiles: 7 x 7 outputs in 4 x 4 tiles (25 x 16 products against
  // 9 x 49) are not, even with tiles enough; 6 x 6 are.
  CHECK_FALSE(winograd({64, 512, 14, 14}, {512, 512, 3, 3}, s2));
  CHECK(winograd({64, 512, 12, 12}, {512, 512, 3, 3}, s2));
  CHECK_FALSE(winograd({8, 64, 56, 56}, {64, 64, 3, 3}, {.stride = 3, .padding = 1}));
  CHECK_FALSE(winograd({8, 64, 56, 56}, {64, 64, 3, 3}, {.stride = {2, 1}, .padding = 1}));
  // Dilation, groups, padding 3 with stride 1 (the input gradient's would be -1), other kernels.
  CHECK_FALSE(
      winograd({8, 64, 56, 56}, {64, 64, 3, 3}, {.stride = 2, .padding = 1, .dilation = 2}));
  CHECK_FALSE(winograd({8, 64, 56, 56}, {64, 64, 3, 3}, {.padding = 2, .dilation = 2}));
  CHECK_FALSE(winograd({8, 64, 56, 56}, {64, 32, 3, 3}, {.padding = 1, .groups = 2}));
  CHECK_FALSE(winograd({8, 64, 56, 56}, {64, 64, 3, 3}, {.padding = 3}));
  CHECK_FALSE(winograd({8, 64, 56, 56}, {64, 64, 5, 5}, {.padding = 2}));
  CHECK_FALSE(winograd({8, 64, 56, 56}, {64, 64, 1, 1}, {}));
  // Not on the device-agnostic (CUDA) path, nor for half.
  {
    generic_path path(true);
    CHECK_FALSE(winograd({8, 64, 56, 56}, {64, 64, 3, 3}, same));
  }
  const auto g =
      nn::detail::conv2d_geometry_of("conv2d", {8, 64, 56, 56}, {64, 64, 3, 3}, nullptr, same);
  CHECK_FALSE(nn::detail::conv2d_winograd<ts::half, ts::cpu>(g));
  // A block's operands V [16, C, tiles] and M [16, O, tiles] within 2^21 elements: 1024 tiles
  // of 64 + 64 channels, in 7 equal blocks of 896 for 8 images of 28 x 28 tiles.
  const auto p = nn::detail::conv2d_winograd_forward(g);
  CHECK(p.tiles() == 8 * 28 * 28);
  CHECK(p.block == 896);
  // With stride 2, V [25, C, tiles] and M [25, O, tiles]: 327 tiles of 128 + 128 channels fit,
  // so 8 images of 14 x 14 tiles (outputs 28 x 28) are 5 equal blocks of 314.
  const auto p2 = nn::detail::conv2d_winograd_forward(
      nn::detail::conv2d_geometry_of("conv2d", {8, 128, 56, 56}, {128, 128, 3, 3}, nullptr, s2));
  CHECK(p2.oh == 28);
  CHECK(p2.tiles() == 8 * 14 * 14);
  CHECK(p2.block == 314);
}

TEST_CASE("conv2d: which images the CPU loops cut into chunks of output rows", "[conv]") {
  auto chunk = [](const ts::Shape& x, const ts::Shape& w, const nn::Conv2dArgs& a) {
    return nn::detail::conv2d_geometry_of("conv2d", x, w, nullptr, a).cpu_chunk;
  };
  // ResNet's 7x7 stem at 224x224: 147 patch rows of 112 columns a row, 7 rows (784 columns,
  // 115,248 elements) within 2^17 elements per chunk.
  CHECK(chunk({8, 3, 224, 224}, {64, 3, 7, 7}, {.stride = 2, .padding = 3}) == 7);
  // Not at 64x64 (a col of 150,528 elements: not two chunks' worth), not a 1x1, not with
  // patches over 512 rows (3x3 on 64 channels: 576), not grouped.
  CHECK(chunk({8, 3, 64, 64}, {64, 3, 7, 7}, {.stride = 2, .padding = 3}) == 0);
  CHECK(chunk({8, 256, 56, 56}, {64, 256, 1, 1}, {}) == 0);
  CHECK(chunk({8, 64, 112, 112}, {64, 64, 3, 3}, {.stride = 1, .padding = 1}) == 0);
  CHECK(chunk({8, 32, 112, 112}, {32, 16, 3, 3}, {.padding = 1, .groups = 2}) == 0);
  // 3x3 on 32 channels (288 patch rows) at 112x112: 4 rows of 112 columns per chunk.
  CHECK(chunk({8, 32, 112, 112}, {32, 32, 3, 3}, {.padding = 1}) == 4);
}

TEST_CASE("conv2d: how the CPU loops split a batch between threads", "[conv]") {
  const nn::Conv2dArgs s2{.stride = 2, .padding = 1};
  auto geometry = [&](std::int64_t n, std::int64_t parts) {
    cpu_parts split(parts);
    return nn::detail::conv2d_geometry_of("conv2d", {n, 16, 14, 14}, {16, 16, 3, 3}, nullptr, s2);
  };
  // Parts of equal size, the last one smaller, none empty: 5 images asked in 4 parts are 2 + 2 +
  // 1; at most one part per image.
  const auto g = geometry(5, 4);
  CHECK(g.cpu_parts == 3);
  using range = std::pair<std::int64_t, std::int64_t>;
  CHECK(nn::detail::conv2d_part(g, g.cpu_parts, 0) == range{0, 2});
  CHECK(nn::detail::conv2d_part(g, g.cpu_parts, 1) == range{2, 2});
  CHECK(nn::detail::conv2d_part(g, g.cpu_parts, 2) == range{4, 1});
  CHECK(geometry(2, 8).cpu_parts == 2);
  CHECK(geometry(8, 1).cpu_parts == 1);
  // 0: the thread count when the geometry is made, while each part keeps 1024 output positions:
  // 8 images of 32x32 outputs may take 8 parts, 8 images of 7x7 (392 positions) one.
  const auto big = [&] {
    cpu_parts split(0);
    return nn::detail::conv2d_geometry_of("conv2d", {8, 16, 64, 64}, {16, 16, 3, 3}, nullptr, s2);
  }();
  CHECK(big.cpu_parts == std::min<std::int64_t>(8, ts::cpu::num_threads()));
  CHECK(geometry(8, 0).cpu_parts == 1);
  // Split with a BLAS (each part's weight-gradient sum accumulates), for float and double, not
  // on the device-agnostic path.
  CHECK(nn::detail::conv2d_split<double, ts::cpu>(g) ==
        ts::detail::matmul_accumulates<double, ts::cpu>());
  CHECK_FALSE(nn::detail::conv2d_split<float, ts::cpu>(geometry(8, 1)));
  generic_path path(true);
  CHECK_FALSE(nn::detail::conv2d_split<float, ts::cpu>(g));
}

namespace {

struct pool_case {
  const char* name;
  int kind;  // 0 max, 1 avg, 2 adaptive
  nn::Int2 kernel;
  nn::MaxPool2dArgs max{};
  nn::AvgPool2dArgs avg{};
};

const pool_case pool_cases[] = {
    {"max_stem", 0, 3, {.stride = 2, .padding = 1}},
    {"max_2x2", 0, 2},
    {"max_ceil", 0, 3, {.stride = 2, .ceil_mode = true}},
    {"max_dilated", 0, 2, {.stride = 1, .padding = 1, .dilation = 2}},
    {"max_ties", 0, 3, {.stride = 1, .padding = 1}},
    {"avg_pad", 1, 3, {}, {.stride = 2, .padding = 1}},
    {"avg_nopadcount", 1, 3, {}, {.stride = 2, .padding = 1, .count_include_pad = false}},
    {"avg_ceil", 1, 3, {}, {.stride = 2, .padding = 1, .ceil_mode = true}},
    {"avg_divisor", 1, 2, {}, {.divisor_override = 3}},
    {"adaptive_global", 2, 1},
    {"adaptive_uneven", 2, {3, 2}},
    {"adaptive_up", 2, {4, 5}},
};

template <class T>
void check_pool(const pool_case& c) {
  const std::string tag = std::string("pool.") + c.name;
  const auto x = oracle().tensor<T>(tag + ".x");
  const auto gy = oracle().tensor<T>(tag + ".gy");
  auto pool = [&](const auto& input) {
    if (c.kind == 0) return F::max_pool2d(input, c.kernel, c.max);
    if (c.kind == 1) return F::avg_pool2d(input, c.kernel, c.avg);
    return F::adaptive_avg_pool2d(input, c.kernel);
  };
  check<T>(pool(x), tag + ".y");
  auto spec = ag::input<T>(x.shape());
  spec.requires_grad = true;
  auto program =
      ag::compile([&](const auto& xv, const auto& g) { return ts::sum(pool(xv) * g); }, spec,
                  ag::input<T>(gy.shape()));
  program.forward(x, gy);
  program.backward();
  check<T>(program.input_grad(0).template as<T>(), tag + ".dx");
  // Accumulating into an existing gradient: sum(x) * 2 runs its backward first.
  auto twice = ag::compile(
      [&](const auto& xv, const auto& g) { return ts::sum(pool(xv) * g) + ts::sum(xv) * 2.0; },
      spec, ag::input<T>(gy.shape()));
  twice.forward(x, gy);
  twice.backward();
  const ts::Tensor<T> shifted = twice.input_grad(0).template as<T>() - 2.0;
  check<T>(shifted, tag + ".dx");
}

}  // namespace

TEMPLATE_TEST_CASE("pooling matches PyTorch: max, average, adaptive", "[pool][oracle]", float,
                   double) {
  for (const pool_case& c : pool_cases) {
    INFO(c.name);
    check_pool<TestType>(c);
  }
}

TEMPLATE_TEST_CASE("BatchNorm2d matches PyTorch in training (compiled) and evaluation",
                   "[batchnorm][oracle]", float, double) {
  using T = TestType;
  nn::BatchNorm2d<T> bn(3, {.momentum = 0.2});
  bn.weight().value().copy_(oracle().tensor<T>("bn2d.weight"));
  bn.bias().value().copy_(oracle().tensor<T>("bn2d.bias"));
  const ts::Shape shape{4, 3, 5, 6};
  auto spec = ag::input<T>(shape);
  spec.requires_grad = true;
  // The output y comes back as a second result beside the loss.
  auto program = ag::compile(
      [&](const auto& x, const auto& g) {
        ag::Var<T> y = bn(x);
        return std::tuple{ts::sum(y * g), y};
      },
      spec, ag::input<T>(shape));
  bn.zero_grad();
  for (int step = 0; step < 3; ++step) {
    const std::string tag = "bn2d.train" + std::to_string(step);
    INFO("step " << step);
    const auto [loss, y] = program.forward(oracle().tensor<T>(tag + ".x"),
                                           oracle().tensor<T>(tag + ".gy"));
    check<T>(y, tag + ".y", 10);
    program.backward();
    check<T>(program.input_grad(0).template as<T>(), tag + ".dx", 10);
    check<T>(bn.running_mean().value(), tag + ".running_mean", 10);
    check<T>(bn.running_var().value(), tag + ".running_var", 10);
    CHECK(bn.num_batches_tracked().value().item() == step + 1);
  }
  check<T>(bn.weight().grad(), "bn2d.dweight", 10);
  check<T>(bn.bias().grad(), "bn2d.dbias", 10);

  // Evaluation: eagerly, and through a program compiled in training mode: eval() takes effect at
  // its next run (running statistics normalise and stay as they are), and train() again after.
  const auto x = oracle().tensor<T>("bn2d.eval.x");
  auto outputs = ag::compile([&](const auto& v) { return bn(v); }, ag::input<T>(x.shape()),
                             ag::Options{.mode = ag::Mode::inference});
  bn.eval();
  check<T>(outputs.forward(x), "bn2d.eval.y", 10);
  check<T>(outputs.forward(x), "bn2d.eval.y", 10);
  CHECK(bn.num_batches_tracked().value().item() == 3);
  check<T>(bn(x), "bn2d.eval.y", 10);
  // Back in training: the same program normalises with the batch's statistics again.
  bn.train();
  const ts::Tensor<T> normalised = outputs.forward(x);
  CHECK(bn.num_batches_tracked().value().item() == 4);
  const auto values = normalised.to_vector();
  double mean = 0;
  for (std::size_t i = 0; i < values.size(); i += 1) mean += values[i];
  mean /= static_cast<double>(values.size());
  // Per channel the output has the bias as its mean; over all channels, the mean of the biases.
  const auto biases = bn.bias().value().to_vector();
  CHECK(mean == Approx((biases[0] + biases[1] + biases[2]) / 3).margin(1e-5));
}

TEST_CASE("convolution and pooling errors name the layer and the shapes", "[conv][errors]") {
  nn::Conv2d<float> conv(3, 8, 3, {.padding = 1});
  const auto before = conv.weight().value().clone();
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const ts::shape_error& e) {
      return std::string(e.what());
    }
    return std::string("no shape_error");
  };
  // Wrong channel count.
  auto m = message([&] { (void)conv(ts::zeros<float>({2, 4, 8, 8})); });
  CHECK_THAT(m, Catch::Contains("Conv2d(3, 8, kernel_size=(3, 3)"));
  CHECK_THAT(m, Catch::Contains("[N, 3, H, W]"));
  CHECK_THAT(m, Catch::Contains("[2, 4, 8, 8]"));
  // Not 4-D.
  m = message([&] { (void)conv(ts::zeros<float>({3, 8, 8})); });
  CHECK_THAT(m, Catch::Contains("4-D input"));
  CHECK_THAT(m, Catch::Contains("[3, 8, 8]"));
  // Kernel larger than the padded input.
  nn::Conv2d<float> big(3, 4, 7);
  m = message([&] { (void)big(ts::zeros<float>({1, 3, 5, 9})); });
  CHECK_THAT(m, Catch::Contains("larger than the padded input (5, 9)"));
  CHECK_THAT(m, Catch::Contains("Conv2d(3, 4, kernel_size=(7, 7)"));
  // Groups not dividing the channels: at construction (std::invalid_argument) and functionally.
  CHECK_THROWS_AS(nn::Conv2d<float>(3, 8, 3, {.groups = 2}), std::invalid_argument);
  m = message([&] { (void)F::conv2d(ts::zeros<float>({1, 4, 5, 5}), ts::zeros<float>({3, 2, 3, 3}),
                                    {.groups = 2}); });
  CHECK_THAT(m, Catch::Contains("out_channels (3) must be divisible by groups (2)"));
  // Traced: the same checks at compile time.
  m = message([&] {
    (void)ag::compile([&](const auto& x) { return ts::sum(conv(x)); },
                      ag::input<float>({2, 5, 8, 8}));
  });
  CHECK_THAT(m, Catch::Contains("[2, 5, 8, 8]"));
  // Pooling.
  m = message([&] { (void)F::max_pool2d(ts::zeros<float>({1, 1, 4, 4}), 3, {.padding = 2}); });
  CHECK_THAT(m, Catch::Contains("at most half of kernel_size"));
  m = message([&] { (void)nn::MaxPool2d(5)(ts::zeros<float>({1, 1, 4, 4})); });
  CHECK_THAT(m, Catch::Contains("MaxPool2d(kernel_size=(5, 5))"));
  m = message([&] { (void)nn::AdaptiveAvgPool2d(2)(ts::zeros<float>({4, 4})); });
  CHECK_THAT(m, Catch::Contains("[4, 4]"));
  nn::BatchNorm2d<float> bn(3);
  m = message([&] { (void)bn(ts::zeros<float>({2, 3, 4})); });
  CHECK_THAT(m, Catch::Contains("BatchNorm2d(3): expected an input of shape [N, 3, H, W], got [2, 3, 4]"));
  // Nothing changed.
  CHECK(conv.weight().value().to_vector() == before.to_vector());
  CHECK(bn.num_batches_tracked().value().item() == 0);
}

TEST_CASE("Conv2d initialises as PyTorch: U(-1/sqrt(fan_in), 1/sqrt(fan_in))", "[conv]") {
  ts::manual_seed(7);
  nn::Conv2d<double> conv(16, 64, 3, {.groups = 2});
  const double bound = 1.0 / std::sqrt(8.0 * 9.0);  // fan_in = 16 / 2 * 3 * 3
  CHECK(conv.weight().value().shape() == ts::Shape{64, 8, 3, 3});
  const auto w = conv.weight().value().to_vector();
  double sum = 0, squares = 0, most = 0;
  for (double v : w) sum += v, squares += v * v, most = std::max(most, std::abs(v));
  const double n = static_cast<double>(w.size());
  CHECK(most <= bound);
  CHECK(most > 0.98 * bound);
  // Uniform on [-b, b]: mean 0, variance b^2 / 3 (4608 draws: a few percent).
  CHECK(std::abs(sum / n) < 0.05 * bound);
  CHECK(squares / n == Approx(bound * bound / 3).epsilon(0.06));
  for (double v : conv.bias().value().to_vector()) CHECK(std::abs(v) <= bound);
  const auto keys = conv.state_dict().keys();
  CHECK(keys == std::vector<std::string>{"weight", "bias"});
}

}  // namespace conv_test
