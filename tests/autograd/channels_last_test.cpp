// Compiled programs over channels_last (NHWC) values on the CPU: an input traced NHWC
// (autograd::input's memory_format) and parameters made NHWC by Module::to keep the activations
// and gradients of the layers after them NHWC in the program's memory plan (strides checked
// against hand-written ones), with the loss, every gradient and BatchNorm's running statistics
// of the same program traced NCHW in float64 (float32 programs to float's precision), through
// training steps with SGD; and a grouped convolution, which runs on NCHW copies in the
// program's workspace.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "channels_last_support.hpp"
#include "tessera/models/resnet.hpp"
#include "tessera/tessera.hpp"

namespace channels_last_program_test {

namespace ts = tessera;
namespace nn = tessera::nn;
namespace ag = tessera::autograd;
namespace F = tessera::nn::functional;
using tessera_test::check_close;
using tessera_test::nhwc_strides;
using tessera_test::sample;
using ts::memory_format;

namespace {

// float64 NHWC programs sum in other orders than NCHW's; float32 ones round every product and
// sum (the loss's gradient goes through two BatchNorms over few values per channel).
template <class T>
constexpr double tolerance = std::is_same_v<T, double> ? 1e-10 : 5e-4;

/// A small ResNet: a 3x3 stem, BatchNorm with its fused ReLU, 2x2 max pooling, a BasicBlock
/// with a stride-2 downsampling (1x1 convolution and BatchNorm; the residual add_relu), global
/// average pooling, flatten and a linear classifier.
template <class T>
class tiny_resnet : public nn::Module {
 public:
  using value_type = T;
  tiny_resnet()
      : Module("tiny_resnet"),
        stem(3, 4, 3, {.padding = 1, .bias = false}),
        bn(4),
        block(4, 8, 2),
        fc(8, 5) {
    register_module("stem", stem);
    register_module("bn", bn);
    register_module("block", block);
    register_module("fc", fc);
  }
  /// (loss, the block's output, the pooled [N, C, 1, 1] features).
  template <class X, class Y>
  auto forward(const X& x, const Y& targets) const {
    const ag::Var<T> h = bn.forward_relu(stem(x));
    const ag::Var<T> features = block(F::max_pool2d(h, 2));
    const ag::Var<T> pooled = F::adaptive_avg_pool2d(features, 1);
    const ag::Var<T> loss = nn::cross_entropy(fc(pooled.flatten(1)), targets);
    return std::tuple{loss, features, pooled};
  }

  nn::Conv2d<T> stem;
  nn::BatchNorm2d<T> bn;
  ts::models::BasicBlock<T> block;
  nn::Linear<T> fc;
};

/// Copies every parameter of `from` into `to` (converting the dtype; any layouts).
template <class A, class B>
void copy_parameters(const A& from, B& to) {
  using U = typename B::value_type;
  const auto source = from.named_parameters();
  const auto target = to.named_parameters();
  REQUIRE(source.size() == target.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    auto t = target[i].second.value().template as<U>();
    t.copy_(source[i].second.value().to(ts::scalar_type_of<U>).template as<U>());
  }
}

}  // namespace

TEMPLATE_TEST_CASE(
    "a program over NHWC input and Module::to(channels_last) parameters: NHWC "
    "activations and gradients, the NCHW float64 program's values",
    "[channels_last][program]", float, double) {
  using T = TestType;
  constexpr double tol = tolerance<T>;
  ts::manual_seed(42);
  tiny_resnet<double> reference;
  tiny_resnet<T> model;
  // The same weights, rounded to T: the two programs differ only in their arithmetic.
  copy_parameters(reference, model);
  copy_parameters(model, reference);
  model.to(memory_format::channels_last);
  REQUIRE(model.stem.weight().value().strides() == nhwc_strides({4, 3, 3, 3}));

  const ts::Shape image{4, 3, 8, 8};
  const auto x = sample<double>(image, 1);
  const auto targets = ts::from_vector<std::int64_t>({0, 3, 1, 4}, {4});
  auto spec = ag::input<double>(image);
  spec.requires_grad = true;
  auto reference_program =
      ag::compile([&](const auto& v, const auto& y) { return reference.forward(v, y); }, spec,
                  ag::input<std::int64_t>({4}));
  auto nhwc_spec = ag::input<T>(image, 0, memory_format::channels_last);
  nhwc_spec.requires_grad = true;
  auto program = ag::compile([&](const auto& v, const auto& y) { return model.forward(v, y); },
                             nhwc_spec, ag::input<std::int64_t>({4}));
  ts::optim::SGD reference_sgd(reference.parameters(), {.lr = 0.1, .momentum = 0.9});
  ts::optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});

  const ts::Tensor<T> x_nhwc = x.to<T>().contiguous(memory_format::channels_last);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    reference.zero_grad();
    model.zero_grad();
    const auto [ref_loss, ref_features, ref_pooled] = reference_program.forward(x, targets);
    reference_program.backward();
    // The last step binds the input NCHW: the program copies it into the layout it was traced
    // for, with the same values.
    const ts::Tensor<T> input = step == 2 ? x.to<T>() : x_nhwc;
    const auto [loss, features, pooled] = program.forward(input, targets);
    program.backward();

    CHECK(static_cast<double>(loss.item()) == Approx(ref_loss.item()).epsilon(tol));
    // The activations the program hands out are its arena values, laid out NHWC.
    CHECK(features.strides() == nhwc_strides(features.shape()));
    CHECK(pooled.strides() == nhwc_strides(pooled.shape()));
    check_close(features, ref_features, tol);
    check_close(pooled, ref_pooled, tol);
    // The input's gradient is NHWC, as the input.
    const ts::AnyTensor dx = program.input_grad(0);
    CHECK(dx.strides() == nhwc_strides(image));
    check_close(dx, reference_program.input_grad(0).template as<double>(), tol);
    const auto expected = reference.named_parameters();
    const auto actual = model.named_parameters();
    REQUIRE(expected.size() == actual.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO("gradient of " << actual[i].first);
      const ts::AnyTensor grad = actual[i].second.grad();
      // The gradients of NHWC parameters are NHWC, as the parameters (a 1x1 kernel's
      // [O, C, 1, 1] is dense in both layouts, and Module::to leaves it as it was).
      if (grad.dim() == 4) {
        CHECK(grad.strides() == actual[i].second.value().strides());
        CHECK(ts::detail::is_channels_last_contiguous(grad.shape(), grad.strides()));
      }
      check_close(grad, expected[i].second.grad().template as<double>(), tol);
    }
    const auto expected_buffers = reference.named_buffers();
    const auto actual_buffers = model.named_buffers();
    REQUIRE(expected_buffers.size() == actual_buffers.size());
    for (std::size_t i = 0; i < expected_buffers.size(); ++i) {
      INFO("buffer " << actual_buffers[i].first);
      const ts::AnyTensor expected_value = expected_buffers[i].second.value();
      if (expected_value.dtype() == ts::ScalarType::int64) {
        CHECK(actual_buffers[i].second.value().template as<std::int64_t>().to_vector() ==
              expected_value.template as<std::int64_t>().to_vector());
      } else {
        check_close(actual_buffers[i].second.value(), expected_value.template as<double>(), tol);
      }
    }
    reference_sgd.step();
    sgd.step();
  }
  // SGD updated the parameters in place, NHWC, to the reference's values.
  CHECK(model.stem.weight().value().strides() == nhwc_strides({4, 3, 3, 3}));
  const auto expected = reference.named_parameters();
  const auto actual = model.named_parameters();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("parameter " << actual[i].first);
    check_close(actual[i].second.value(), expected[i].second.value().template as<double>(), tol);
  }
}

TEST_CASE("an NHWC program with recomputation segments gives the NCHW program's gradients",
          "[channels_last][program]") {
  ts::manual_seed(43);
  tiny_resnet<double> reference, model;
  copy_parameters(reference, model);
  model.to(memory_format::channels_last);
  const ts::Shape image{4, 3, 8, 8};
  const auto x = sample<double>(image, 2);
  const auto targets = ts::from_vector<std::int64_t>({1, 2, 0, 4}, {4});
  auto reference_program =
      ag::compile([&](const auto& v, const auto& y) { return reference.forward(v, y); },
                  ag::input<double>(image), ag::input<std::int64_t>({4}));
  // The recomputed segments write their NHWC values into the same planned buffers again.
  auto program =
      ag::compile([&](const auto& v, const auto& y) { return model.forward(v, y); },
                  ag::input<double>(image, 0, memory_format::channels_last),
                  ag::input<std::int64_t>({4}), ag::Options{.checkpoint = {.segments = 3}});
  REQUIRE(program.plan().recomputed_steps > 0);
  const double expected = std::get<0>(reference_program.forward(x, targets)).item();
  reference_program.backward();
  const double loss =
      std::get<0>(program.forward(x.contiguous(memory_format::channels_last), targets)).item();
  program.backward();
  CHECK(loss == Approx(expected).epsilon(1e-12));
  const auto want = reference.named_parameters();
  const auto got = model.named_parameters();
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("gradient of " << got[i].first);
    check_close(got[i].second.grad(), want[i].second.grad().as<double>(), 1e-10);
  }
}

TEMPLATE_TEST_CASE("a grouped convolution in a program on NHWC values runs on NCHW copies",
                   "[channels_last][program][conv]", float, double) {
  using T = TestType;
  constexpr double tol = std::is_same_v<T, double> ? 1e-12 : 2e-5;
  ts::manual_seed(7);
  nn::Conv2d<double> reference(4, 6, 3, {.padding = 1, .groups = 2});
  nn::Conv2d<T> conv(4, 6, 3, {.padding = 1, .groups = 2});
  copy_parameters(reference, conv);
  copy_parameters(conv, reference);
  const ts::Shape image{2, 4, 5, 6};
  const auto x = sample<double>(image, 3);
  const auto g = sample<double>({2, 6, 5, 6}, 4);
  auto run = [&](auto& layer, auto spec, const auto& input, const auto& weights) {
    using U = typename decltype(spec)::value_type;
    spec.requires_grad = true;
    auto program = ag::compile(
        [&](const auto& v, const auto& w) {
          // y * 1.0 keeps y's layout (the expression's rule) and hands it out.
          const ag::Var<U> y = layer(v);
          return std::tuple{ts::sum(y * w), ag::Var<U>(y * 1.0)};
        },
        spec, ag::input<U>(weights.shape()));
    layer.zero_grad();
    auto [loss, y] = program.forward(input, weights);
    program.backward();
    return std::tuple{loss.item(), y.clone(memory_format::preserve_format), program.input_grad(0),
                      ts::AnyTensor(layer.weight().grad()), ts::AnyTensor(layer.bias().grad())};
  };
  const auto [ref_loss, ref_y, ref_dx, ref_dw, ref_db] =
      run(reference, ag::input<double>(image), x, g);
  conv.to(memory_format::channels_last);
  const auto [loss, y, dx, dw, db] =
      run(conv, ag::input<T>(image, 0, memory_format::channels_last),
          x.to<T>().contiguous(memory_format::channels_last), g.to<T>());
  CHECK(static_cast<double>(loss) == Approx(ref_loss).epsilon(tol));
  CHECK(y.strides() == nhwc_strides(y.shape()));
  check_close(y, ref_y, tol);
  CHECK(dx.strides() == nhwc_strides(image));
  check_close(dx, ref_dx.template as<double>(), tol);
  CHECK(dw.strides() == nhwc_strides(dw.shape()));
  check_close(dw, ref_dw.template as<double>(), tol);
  check_close(db, ref_db.template as<double>(), tol);
}

TEST_CASE("an NHWC input into a contiguous model: NHWC activations, contiguous weight gradients",
          "[channels_last][program][conv]") {
  ts::manual_seed(8);
  nn::Conv2d<double> conv(3, 5, 3, {.stride = 2, .padding = 1});
  const ts::Shape image{2, 3, 7, 6};
  const auto x = sample<double>(image, 5);
  const auto g = sample<double>({2, 5, 4, 3}, 6);
  auto run = [&](memory_format format) {
    auto program = ag::compile(
        [&](const auto& v, const auto& w) {
          const ag::Var<double> y = conv(v);
          return std::tuple{ts::sum(y * w), ag::Var<double>(y * 1.0)};
        },
        ag::input<double>(image, 0, format), ag::input<double>(g.shape()));
    conv.zero_grad();
    auto [loss, y] = program.forward(x, g);  // NCHW x: copied into an NHWC input's layout
    program.backward();
    return std::tuple{loss.item(), y.clone(memory_format::preserve_format),
                      conv.weight().grad().clone(), conv.bias().grad().clone()};
  };
  const auto [ref_loss, ref_y, ref_dw, ref_db] = run(memory_format::contiguous_format);
  const auto [loss, y, dw, db] = run(memory_format::channels_last);
  CHECK(loss == Approx(ref_loss).epsilon(1e-12));
  // The convolution is NHWC (its input is: PyTorch's rule); its weight is copied to NHWC for it,
  // and its gradient comes back through that copy into the contiguous parameter's.
  CHECK(y.strides() == nhwc_strides(y.shape()));
  check_close(y, ref_y, 1e-12);
  CHECK(conv.weight().grad().is_contiguous());
  check_close(dw, ref_dw, 1e-12);
  check_close(db, ref_db, 1e-12);
}

TEST_CASE("autograd::input with channels_last needs a 4-d shape", "[channels_last][program]") {
  CHECK_THROWS_AS(ag::compile([](const auto& v) { return ts::sum(v); },
                              ag::input<float>({2, 3}, 0, memory_format::channels_last)),
                  ts::shape_error);
}

}  // namespace channels_last_program_test
