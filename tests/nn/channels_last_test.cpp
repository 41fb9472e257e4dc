// Layers on channels_last (NHWC) inputs on the CPU: Conv2d (nn/conv.hpp, functional.hpp),
// BatchNorm2d with and without its fused ReLU (nn/batch_norm.hpp), max, average, adaptive and
// global average pooling (nn/detail/pool2d.hpp), ReLU and the residual add_relu, and
// Module::to(memory_format). NHWC in gives NHWC out (strides checked against hand-written ones),
// with the values of the same layers on NCHW float64 inputs (tests/nn/conv_test.cpp checks those
// against PyTorch): float64 NHWC runs to rounding, float32 ones to float's precision. Gradients
// through a compiled program fed NHWC inputs equal the NCHW program's.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "channels_last_support.hpp"
#include "tessera/models/resnet.hpp"
#include "tessera/tessera.hpp"

namespace channels_last_nn_test {

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;
namespace F = tessera::nn::functional;
using tessera_test::check_close;
using tessera_test::nhwc_strides;
using tessera_test::sample;
using ts::memory_format;

namespace {

// float64 NHWC runs sum in other orders than NCHW's; float32 ones round every product and sum.
constexpr double tol64 = 1e-12;
constexpr double tol32 = 2e-5;

struct conv_case {
  const char* name;
  std::int64_t in, out;
  nn::Int2 kernel;
  nn::Conv2dOptions options;
};

const conv_case conv_cases[] = {
    {"3x3 (Winograd on CPU)", 8, 8, 3, {.stride = 1, .padding = 1}},
    {"3x3 stride 2", 4, 6, 3, {.stride = 2, .padding = 1, .bias = false}},
    {"1x1", 4, 8, 1, {}},
    {"1x1 stride 2", 4, 8, 1, {.stride = 2, .bias = false}},
    {"dilated", 4, 4, 3, {.padding = 2, .dilation = 2}},
    {"grouped", 4, 6, 3, {.padding = 1, .groups = 2}},
    {"depthwise", 4, 4, 3, {.stride = {2, 1}, .padding = 1, .groups = 4, .bias = false}},
    {"7x7 stem", 3, 5, 7, {.stride = 2, .padding = 3, .bias = false}},
    {"rectangular", 4, 4, {2, 3}, {.stride = {2, 1}, .padding = {0, 1}, .dilation = {1, 2}}},
};

}  // namespace

TEST_CASE("Conv2d on NHWC input gives NHWC output with the NCHW values", "[channels_last][conv]") {
  for (const conv_case& c : conv_cases) {
    INFO(c.name);
    nn::Conv2d<double> conv(c.in, c.out, c.kernel, c.options);
    const auto conv32 = conv.to<float>();
    const auto x = sample<double>({2, c.in, 9, 10}, 1);
    const ts::Tensor<double> expected = conv(x);  // NCHW, float64
    const auto x_cl = x.contiguous(memory_format::channels_last);
    // One group runs natively on NHWC (nn/detail/conv2d_nhwc.hpp); grouped ones through NCHW.
    const nn::Conv2dArgs args{c.options.stride, c.options.padding, c.options.dilation,
                              c.options.groups};
    const auto geometry = nn::detail::conv2d_geometry_of(
        "conv", x.shape(), conv.weight().value().shape(), nullptr, args);
    CHECK(nn::detail::conv2d_runs_nhwc<double, ts::cpu>(geometry, x_cl) == (c.options.groups == 1));
    CHECK_FALSE(nn::detail::conv2d_runs_nhwc<double, ts::cpu>(geometry, x));
    const ts::Tensor<double> y = conv(x_cl);
    CHECK(y.strides() == nhwc_strides(expected.shape()));
    check_close(y, expected, tol64);
    const ts::Tensor<float> y32 = conv32(x_cl.to<float>());
    CHECK(y32.strides() == nhwc_strides(expected.shape()));
    check_close(y32, expected, tol32);
    // The functional form, and an NHWC weight with an NCHW input: NHWC out as well (PyTorch),
    // except where the weight's layout is ambiguous and contiguous(channels_last) leaves it NCHW
    // (1x1 kernels, one input channel per group), so the input's format decides.
    const auto w_cl = conv.weight().value().contiguous(memory_format::channels_last);
    const bool ambiguous_weight =
        (c.kernel.h == 1 && c.kernel.w == 1) || c.in / c.options.groups == 1;
    const ts::Strides weight_layout =
        ambiguous_weight ? expected.strides() : nhwc_strides(expected.shape());
    const ts::Tensor<double> by_weight =
        c.options.bias ? F::conv2d(x, w_cl, conv.bias().value(), args) : F::conv2d(x, w_cl, args);
    CHECK(by_weight.strides() == weight_layout);
    check_close(by_weight, expected, tol64);
  }
}

TEST_CASE("a 3x3 stride-1 layer Winograd takes runs on NCHW copies: values and gradients",
          "[channels_last][conv][program]") {
  // 32 channels: Winograd's (conv2d_winograd_min_channels), where NHWC goes through NCHW copies.
  ts::manual_seed(13);
  nn::Conv2d<double> conv(32, 32, 3, {.padding = 1});
  const ts::Shape image{2, 32, 6, 7};
  const auto x = sample<double>(image, 14);
  const auto x_cl = x.contiguous(memory_format::channels_last);
  nn::detail::conv2d_geometry g = nn::detail::conv2d_geometry_of(
      "conv", image, conv.weight().value().shape(), nullptr, nn::Conv2dArgs{.padding = 1});
  REQUIRE(g.winograd);
  g.channels_last = true;
  CHECK_FALSE(nn::detail::conv2d_runs_nhwc<double, ts::cpu>(g, x_cl));
  CHECK(nn::detail::conv2d_nchw_copies<double, ts::cpu>(g));
  const ts::Tensor<double> expected = conv(x);
  const ts::Tensor<double> y = conv(x_cl);
  CHECK(y.strides() == nhwc_strides(expected.shape()));
  check_close(y, expected, tol64);

  // A program traced for NHWC against one traced for NCHW: loss, input and weight gradients.
  const auto gy = sample<double>(expected.shape(), 15);
  auto run = [&](memory_format format) {
    auto spec = ag::input<double>(image, 0, format);
    spec.requires_grad = true;
    auto program =
        ag::compile([&](const auto& xv, const auto& gv) { return ts::sum(conv(xv) * gv); }, spec,
                    ag::input<double>(gy.shape()));
    conv.zero_grad();
    const double loss = program.forward(x.contiguous(format), gy).item();
    program.backward();
    std::vector<ts::Tensor<double>> grads{program.input_grad(0).as<double>().contiguous()};
    for (const auto& [name, p] : conv.named_parameters())
      grads.push_back(p.grad().as<double>().contiguous());
    return std::pair{loss, grads};
  };
  const auto [loss_nchw, grads_nchw] = run(memory_format::contiguous_format);
  const auto [loss_nhwc, grads_nhwc] = run(memory_format::channels_last);
  CHECK(loss_nhwc == Approx(loss_nchw).epsilon(1e-12));
  REQUIRE(grads_nhwc.size() == 3);
  for (std::size_t i = 0; i < grads_nchw.size(); ++i) {
    INFO("gradient " << i);
    check_close(grads_nhwc[i], grads_nchw[i], tol64);
  }
}

TEST_CASE("Conv2d on NHWC input: col in several chunks of output positions",
          "[channels_last][conv]") {
  // 2 * 64 * 64 positions of 3 * 3 * 16 columns: more than one chunk of col (2^20 elements).
  nn::Conv2d<double> conv(16, 8, 3, {.padding = 1});
  const auto x = sample<double>({2, 16, 64, 64}, 12);
  REQUIRE(2 * 64 * 64 * 3 * 3 * 16 > nn::detail::conv2d_nhwc_col_elements);
  const ts::Tensor<double> expected = conv(x);
  const ts::Tensor<double> y = conv(x.contiguous(memory_format::channels_last));
  CHECK(y.strides() == nhwc_strides(expected.shape()));
  check_close(y, expected, tol64);
}

TEST_CASE("Module::to(channels_last) makes 4-d parameters NHWC, in place",
          "[channels_last][conv]") {
  nn::Sequential model(nn::Conv2d<double>(3, 4, 3, {.padding = 1}), nn::BatchNorm2d<double>(4),
                       nn::ReLU());
  const auto& conv = model.get<0>();
  const auto x = sample<double>({2, 3, 6, 5}, 2);
  model.eval();
  const ts::Tensor<double> expected = model(x);
  const auto weight_before = conv.weight().value().to_vector();
  const auto bias_strides = conv.bias().value().strides();
  model.to(memory_format::channels_last);
  CHECK(conv.weight().value().strides() == ts::Strides{27, 1, 9, 3});
  CHECK(conv.weight().value().to_vector() == weight_before);
  CHECK(conv.bias().value().strides() == bias_strides);  // 1-d: untouched
  const ts::Tensor<double> y = model(x);
  CHECK(y.strides() == nhwc_strides(y.shape()));
  check_close(y, expected, tol64);
  // A program runs over the NHWC parameters (bound as they are laid out; its convolution is
  // NHWC, tests/autograd/channels_last_test.cpp), and again once they are converted back.
  auto program =
      ag::compile([&](const auto& v) { return ts::sum(model(v)); }, ag::input<double>(x.shape()),
                  ag::Options{.mode = ag::Mode::inference});
  double total = 0;
  for (double v : expected.to_vector()) total += v;
  CHECK(program.forward(x).item() == Approx(total).epsilon(1e-12));
  model.to(memory_format::contiguous_format);
  CHECK(conv.weight().value().strides() == ts::Strides{27, 9, 3, 1});
  CHECK(conv.weight().value().to_vector() == weight_before);
  CHECK(program.forward(x.contiguous(memory_format::channels_last)).item() ==
        Approx(total).epsilon(1e-12));
  // A parameter dense in neither layout is refused, naming the way out.
  const nn::ParameterRef weight = model.named_parameters()[0].second;
  const ts::AnyTensor kept = weight.value();
  weight.set_value(kept.as<double>().transpose(2, 3));
  CHECK_THROWS_WITH(program.forward(x),
                    Catch::Contains("not dense") && Catch::Contains("Module::to(memory_format)"));
  weight.set_value(kept);
}

TEST_CASE("BatchNorm2d on NHWC input: train, eval and the fused ReLU",
          "[channels_last][batchnorm]") {
  nn::BatchNorm2d<double> reference(5, {.momentum = 0.3});
  nn::BatchNorm2d<double> bn(5, {.momentum = 0.3});
  nn::BatchNorm2d<float> bn32(5, {.momentum = 0.3});
  const auto w = sample<double>({5}, 3);
  const auto b = sample<double>({5}, 4);
  for (auto* m : {&reference, &bn}) {
    m->weight().value().copy_(w);
    m->bias().value().copy_(b);
  }
  bn32.weight().value().copy_(w);
  bn32.bias().value().copy_(b);
  for (int step = 0; step < 2; ++step) {
    INFO("training step " << step);
    const ts::Tensor<double> x = sample<double>({3, 5, 4, 6}, 10 + step) * (step + 1.0);
    const ts::Tensor<double> expected = reference(x);
    const auto x_cl = x.contiguous(memory_format::channels_last);
    const ts::Tensor<double> y = bn(x_cl);
    CHECK(y.strides() == nhwc_strides(x.shape()));
    check_close(y, expected, tol64);
    const ts::Tensor<float> y32 = bn32(x_cl.to<float>());
    CHECK(y32.strides() == nhwc_strides(x.shape()));
    check_close(y32, expected, tol32);
    check_close(bn.running_mean().value(), reference.running_mean().value(), tol64);
    check_close(bn.running_var().value(), reference.running_var().value(), tol64);
    check_close(bn32.running_var().value(), reference.running_var().value(), tol32);
    // The fused ReLU (as ResNet's blocks call it).
    const ts::Tensor<double> relu_expected = reference.forward_relu(x);
    const ts::Tensor<double> relu_y = bn.forward_relu(x_cl);
    CHECK(relu_y.strides() == nhwc_strides(x.shape()));
    check_close(relu_y, relu_expected, tol64);
    const ts::Tensor<float> relu_y32 = bn32.forward_relu(x_cl.to<float>());
    CHECK(relu_y32.strides() == nhwc_strides(x.shape()));
    check_close(relu_y32, relu_expected, tol32);
  }
  reference.eval();
  bn.eval();
  const auto x = sample<double>({2, 5, 3, 3}, 20);
  const ts::Tensor<double> expected = reference(x);
  const ts::Tensor<double> y = bn(x.contiguous(memory_format::channels_last));
  CHECK(y.strides() == nhwc_strides(x.shape()));
  check_close(y, expected, tol64);
}

TEST_CASE("pooling on NHWC input gives NHWC output with the NCHW values", "[channels_last][pool]") {
  const auto x = sample<double>({2, 3, 9, 8}, 5);
  const auto x_cl = x.contiguous(memory_format::channels_last);
  const auto x32 = x_cl.to<float>();
  auto check_layer = [&](const auto& layer, const char* name) {
    INFO(name);
    const ts::Tensor<double> expected = layer(x);
    const ts::Tensor<double> y = layer(x_cl);
    CHECK(y.strides() == nhwc_strides(expected.shape()));
    check_close(y, expected, tol64);
    const ts::Tensor<float> y32 = layer(x32);
    CHECK(y32.strides() == nhwc_strides(expected.shape()));
    check_close(y32, expected, tol32);
  };
  check_layer(nn::MaxPool2d(3, {.stride = 2, .padding = 1}), "max 3x3/2 pad 1");
  check_layer(nn::MaxPool2d(2, {.stride = 2, .dilation = 2, .ceil_mode = true}),
              "max dilated ceil");
  check_layer(nn::AvgPool2d(3, {.stride = 2, .padding = 1}), "avg 3x3/2 pad 1");
  check_layer(
      nn::AvgPool2d(3, {.stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false}),
      "avg ceil, padding not counted");
  check_layer(nn::AdaptiveAvgPool2d({4, 3}), "adaptive 4x3");
  check_layer(nn::AdaptiveAvgPool2d(1), "global");
  // A non-dense NHWC view (narrowed): still NHWC out.
  const auto part = x_cl.narrow(3, 1, 6);
  const ts::Tensor<double> y = F::max_pool2d(part, 2);
  CHECK(y.strides() == nhwc_strides(y.shape()));
  check_close(y, F::max_pool2d(x.narrow(3, 1, 6).contiguous(), 2), tol64);
}

TEST_CASE("ReLU and the residual add_relu keep NHWC", "[channels_last]") {
  const auto a = sample<double>({2, 4, 3, 5}, 6);
  const auto b = sample<double>({2, 4, 3, 5}, 7);
  const auto a_cl = a.contiguous(memory_format::channels_last);
  const auto b_cl = b.contiguous(memory_format::channels_last);
  const ts::Tensor<double> r = nn::ReLU()(a_cl);
  CHECK(r.strides() == nhwc_strides(a.shape()));
  const ts::Tensor<double> r_expected = nn::ReLU()(a);
  check_close(r, r_expected, 0.0);
  const auto sum = F::add_relu(a_cl, b_cl);
  CHECK(sum.strides() == nhwc_strides(a.shape()));
  check_close(sum, F::add_relu(a, b), 0.0);
}

TEST_CASE("Dropout keeps NHWC, with the mask an NCHW input of the same seed gets",
          "[channels_last][dropout]") {
  const auto x = sample<double>({2, 4, 3, 5}, 8);
  const auto x_cl = x.contiguous(memory_format::channels_last);
  nn::Dropout dropout(0.4);
  ts::manual_seed(21);
  const ts::Tensor<double> expected = dropout(x);
  ts::manual_seed(21);
  const ts::Tensor<double> y = dropout(x_cl);
  CHECK(y.strides() == nhwc_strides(x.shape()));
  check_close(y, expected, 0.0);
  // The mask drops some and keeps some (a test of the comparison, not of the statistics).
  const double dropped = ts::sum(ts::where(expected == 0.0, 1.0, 0.0)).item();
  CHECK(dropped > 0);
  CHECK(dropped < static_cast<double>(x.numel()));
  CHECK(nn::Dropout(1.0)(x_cl).strides() == nhwc_strides(x.shape()));

  // Traced: conv -> dropout in a program on an NHWC input gives the NCHW program's output
  // (NHWC) and weight gradients, seed for seed.
  nn::Conv2d<double> conv(4, 6, 3, {.padding = 1});
  const auto g = sample<double>({2, 6, 3, 5}, 9);
  auto run = [&](memory_format format) {
    auto program = ag::compile(
        [&](const auto& v, const auto& w) {
          const ag::Var<double> y = dropout(conv(v));
          return std::tuple{ts::sum(y * w), ag::Var<double>(y * 1.0)};
        },
        ag::input<double>(x.shape(), 0, format), ag::input<double>(g.shape()));
    conv.zero_grad();
    ts::manual_seed(22);
    auto [loss, out] = program.forward(format == memory_format::channels_last ? x_cl : x, g);
    program.backward();
    return std::tuple{loss.item(), out.clone(memory_format::preserve_format),
                      conv.weight().grad().clone()};
  };
  const auto [ref_loss, ref_y, ref_dw] = run(memory_format::contiguous_format);
  const auto [loss, out, dw] = run(memory_format::channels_last);
  CHECK(ts::sum(ts::where(ref_y == 0.0, 1.0, 0.0)).item() > 0);
  CHECK(loss == Approx(ref_loss).epsilon(1e-12));
  CHECK(out.strides() == nhwc_strides(out.shape()));
  check_close(out, ref_y, 1e-12);
  check_close(dw, ref_dw, 1e-12);
}

TEST_CASE("a ResNet block on NHWC input: eager forward, and a program's gradients",
          "[channels_last][program]") {
  ts::manual_seed(11);
  ts::models::BasicBlock<double> block(4, 8, 2);  // with a downsampling 1x1 convolution
  const auto x = sample<double>({2, 4, 8, 8}, 8);
  const auto x_cl = x.contiguous(memory_format::channels_last);
  const ts::Tensor<double> expected = block(x);
  const ts::Tensor<double> y = block(x_cl);
  CHECK(y.strides() == nhwc_strides(expected.shape()));
  check_close(y, expected, tol64);

  // Training through a program traced for NCHW input, run on the NHWC tensor: the NCHW run's loss
  // and gradients (its input is bound as it is, so every operation reads it through its strides).
  const auto g = sample<double>(expected.shape(), 9);
  auto spec = ag::input<double>(x.shape());
  spec.requires_grad = true;
  auto program =
      ag::compile([&](const auto& xv, const auto& gv) { return ts::sum(block(xv) * gv); }, spec,
                  ag::input<double>(g.shape()));
  auto run = [&](const ts::Tensor<double>& input) {
    block.zero_grad();
    const double loss = program.forward(input, g).item();
    program.backward();
    std::vector<ts::Tensor<double>> grads{program.input_grad(0).as<double>().clone()};
    for (const auto& [name, p] : block.named_parameters())
      grads.push_back(p.grad().as<double>().clone());
    return std::pair{loss, grads};
  };
  const auto [loss_nchw, grads_nchw] = run(x);
  const auto [loss_nhwc, grads_nhwc] = run(x_cl);
  CHECK(loss_nhwc == Approx(loss_nchw).epsilon(1e-12));
  REQUIRE(grads_nhwc.size() == grads_nchw.size());
  for (std::size_t i = 0; i < grads_nchw.size(); ++i) {
    INFO("gradient " << i);
    check_close(grads_nhwc[i], grads_nchw[i], tol64);
  }
}

namespace {

struct backward_case {
  const char* name;
  std::int64_t in, out;
  nn::Int2 kernel;
  nn::Conv2dArgs args;
  bool bias;
  std::int64_t batch, h, w;
};

// Channel counts off multiples of 4; the last two cases need several chunks of col
// (conv2d_nhwc_col_elements), the last several per part when the batch is cut in three.
const backward_case backward_cases[] = {
    {"3x3 pad 1", 5, 6, 3, {.padding = 1}, true, 2, 9, 10},
    {"3x3 stride 2", 4, 7, 3, {.stride = 2, .padding = 1}, false, 2, 9, 8},
    {"1x1", 6, 10, 1, {}, true, 2, 5, 7},
    {"1x1 stride 2", 5, 7, 1, {.stride = 2}, false, 2, 9, 6},
    {"7x7 stride 2 pad 3", 3, 5, 7, {.stride = 2, .padding = 3}, false, 2, 11, 12},
    {"dilation 2", 4, 3, 3, {.padding = 2, .dilation = 2}, true, 1, 8, 9},
    {"non-square",
     3,
     5,
     {2, 3},
     {.stride = {2, 1}, .padding = {0, 1}, .dilation = {1, 2}},
     true,
     2,
     7,
     9},
    {"several chunks", 17, 9, 3, {.padding = 1}, true, 2, 64, 64},
    {"several chunks a part", 128, 5, 3, {.padding = 1}, true, 5, 24, 24},
};

}  // namespace

TEMPLATE_TEST_CASE("conv2d backward on NHWC tensors: native, the NCHW float64 gradients",
                   "[channels_last][conv]", float, double) {
  using T = TestType;
  // float64 sums in other orders than NCHW's; float32 rounds the operands and sums up to
  // thousands of products per gradient element.
  constexpr double tol = std::is_same_v<T, double> ? 1e-12 : 1e-4;
  const auto nhwc = [](const ts::Tensor<double>& t) {  // a new NHWC tensor of t's values
    auto out = ts::Tensor<T>::empty_on(t.shape(), t.device(), memory_format::channels_last);
    out.copy_(t.to<T>());
    return out;
  };
  struct reset_parts {
    ~reset_parts() { nn::detail::conv2d_cpu_parts() = 0; }
  } reset;
  // The whole batch in one part, and cut into parts run at once (as many as the batch allows,
  // up to three: 2 + 2 + 1 images for a batch of 5).
  for (const std::int64_t parts : {1, 3}) {
    for (const backward_case& c : backward_cases) {
      INFO(c.name << ", parts " << parts);
      const ts::Shape image{c.batch, c.in, c.h, c.w}, filter{c.out, c.in, c.kernel.h, c.kernel.w};
      const ts::Shape bias_shape{c.out};
      const auto x = sample<double>(image, 31);
      const auto w = sample<double>(filter, 32);
      nn::detail::conv2d_cpu_parts() = parts;
      nn::detail::conv2d_geometry g = nn::detail::conv2d_geometry_of(
          "conv2d", image, filter, c.bias ? &bias_shape : nullptr, c.args);
      REQUIRE(g.cpu_parts == std::min(parts, c.batch == 5 ? 3 : c.batch));
      const auto gy = sample<double>(g.output_shape(), 33);
      const std::int64_t positions = c.batch * g.oh * g.ow, k = g.kh * g.kw * g.c;
      const bool chunks = positions * k > nn::detail::conv2d_nhwc_col_elements;
      REQUIRE(chunks == (std::string(c.name).starts_with("several chunks")));
      if (parts == 3 && c.batch == 5) {  // parts of 2 images, each over several chunks
        REQUIRE(2 * g.oh * g.ow > nn::detail::conv2d_nhwc_chunk(g));
      }

      // The reference: the NCHW passes in float64 (tests/nn/conv_test.cpp checks them against
      // PyTorch).
      auto dx_ref = ts::Tensor<double>::empty_on(image, x.device());
      auto dw_ref = ts::Tensor<double>::empty_on(filter, x.device());
      auto db_ref = ts::Tensor<double>::empty_on(bias_shape, x.device());
      {
        nn::detail::workspace ws = nn::detail::eager_workspace(
            x.device(),
            nn::detail::conv2d_backward_workspace<double, ts::cpu>(g, true, true, true));
        nn::detail::conv2d_backward(g, x, w, gy, &dx_ref, false, &dw_ref, false, &db_ref, false,
                                    ws);
      }

      nn::detail::conv2d_geometry gcl = g;
      gcl.channels_last = true;
      REQUIRE(nn::detail::conv2d_nhwc_native<T, ts::cpu>(gcl));
      REQUIRE_FALSE(nn::detail::conv2d_nchw_copies<T, ts::cpu>(gcl));
      const auto x_cl = nhwc(x), w_cl = nhwc(w), gy_cl = nhwc(gy);
      {  // The forward, in the same parts: the NCHW float64 values; a chunk of col per part.
        using ws_t = nn::detail::workspace;
        auto y_ref = ts::Tensor<double>::empty_on(g.output_shape(), x.device());
        ws_t ws_ref = nn::detail::eager_workspace(
            x.device(), nn::detail::conv2d_forward_workspace<double, ts::cpu>(g));
        nn::detail::conv2d_forward(g, x, w, static_cast<const ts::Tensor<double>*>(nullptr), y_ref,
                                   ws_ref);
        const std::size_t bytes = nn::detail::conv2d_forward_workspace<T, ts::cpu>(gcl);
        CHECK(bytes == ws_t::template bytes<T>(g.pointwise()
                                                   ? 0
                                                   : nn::detail::conv2d_nhwc_parts<T>(gcl) *
                                                         nn::detail::conv2d_nhwc_chunk(g) * k));
        ws_t ws = nn::detail::eager_workspace(x.device(), bytes);
        auto y =
            ts::Tensor<T>::empty_on(g.output_shape(), x.device(), memory_format::channels_last);
        nn::detail::conv2d_forward(gcl, x_cl, w_cl, static_cast<const ts::Tensor<T>*>(nullptr), y,
                                   ws);
        CHECK(y.strides() == nhwc_strides(g.output_shape()));
        check_close(y, y_ref, tol);
      }
      // Gradients added to (accumulate) start from these.
      const auto dx0 = sample<double>(image, 34), dw0 = sample<double>(filter, 35);
      const auto db0 = sample<double>(bias_shape, 36);
      for (const bool builtin : {false, true}) {
        INFO((builtin ? "built-in GEMM" : "default GEMM"));
        std::optional<ts::backend::cpu::builtin_gemm_scope> scope;
        if (builtin) scope.emplace();
        const bool adds = ts::detail::matmul_accumulates<T, ts::cpu>();
        for (const bool accumulate : {false, true}) {
          INFO((accumulate ? "accumulate" : "overwrite"));
          for (const int which : {0, 1, 2}) {  // both gradients, the input's alone, the weight's
            const bool input = which != 2, weight = which != 1;
            INFO("input " << input << ", weight " << weight);
            // The plan is the native one: a chunk of col (none for a 1x1 stride-1 unpadded
            // convolution, unless it stages products), staging without a BLAS, the bias's sums;
            // a run that fell back to NCHW copies would overrun it.
            const std::size_t bytes =
                nn::detail::conv2d_backward_workspace<T, ts::cpu>(gcl, input, weight, c.bias);
            // With a BLAS that adds, a chunk of col per part and each part's but the first's
            // weight-gradient sum; without, one part.
            const std::int64_t used_parts = adds ? g.cpu_parts : 1;
            CHECK(nn::detail::conv2d_nhwc_parts<T>(gcl) == used_parts);
            const std::int64_t col = !g.pointwise()
                                         ? used_parts * nn::detail::conv2d_nhwc_chunk(g) * k
                                     : input && !adds ? nn::detail::conv2d_nhwc_chunk(g) * g.c
                                                      : 0;
            const std::int64_t staging = !weight ? 0 : adds ? (used_parts - 1) * g.o * k : g.o * k;
            using ws_t = nn::detail::workspace;
            CHECK(bytes ==
                  ws_t::template bytes<T>(col) + ws_t::template bytes<T>(staging) +
                      (c.bias ? ws_t::template bytes<T>(g.n * g.o) + ws_t::template bytes<T>(g.o)
                              : 0));
            ws_t ws = nn::detail::eager_workspace(x.device(), bytes);
            auto start = [&](const ts::Tensor<double>& t0, const ts::Shape& shape) {
              if (accumulate) return nhwc(t0);
              auto t = ts::Tensor<T>::empty_on(shape, x.device(), memory_format::channels_last);
              t.fill_(std::numeric_limits<T>::quiet_NaN());  // overwritten everywhere
              return t;
            };
            auto dx = start(dx0, image), dw = start(dw0, filter);
            auto db = accumulate ? db0.to<T>().clone() : ts::full<T>(bias_shape, 7.0);
            nn::detail::conv2d_backward(gcl, weight ? x_cl : ts::Tensor<T>(), w_cl, gy_cl,
                                        input ? &dx : nullptr, accumulate, weight ? &dw : nullptr,
                                        accumulate, c.bias ? &db : nullptr, accumulate, ws);
            const auto expect = [&](const ts::Tensor<double>& ref, const ts::Tensor<double>& t0) {
              return accumulate ? ts::Tensor<double>(ref + t0) : ref;
            };
            if (input) {
              CHECK(dx.strides() == nhwc_strides(image));
              check_close(dx, expect(dx_ref, dx0), tol);
            }
            if (weight) {
              CHECK(dw.strides() == nhwc_strides(filter));
              check_close(dw, expect(dw_ref, dw0), tol);
            }
            if (c.bias) check_close(db, expect(db_ref, db0), tol);
          }
        }
      }
    }
  }
}

}  // namespace channels_last_nn_test
