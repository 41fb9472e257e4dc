// The layers under arguments at the edge of int64 and under failures (issue 46): convolution and
// pooling geometry computed with checked arithmetic (a shape_error naming the values, never an
// overflow, which the ASan+UBSan build would report), and a BatchNorm whose forward runs out of
// memory leaves its running statistics as they were.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tessera/tessera.hpp"

namespace nn_failure_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace F = tessera::nn::functional;
using Catch::Contains;

constexpr std::int64_t huge = std::int64_t{1} << 62;
constexpr std::int64_t most = std::numeric_limits<std::int64_t>::max();

TEST_CASE("conv2d with padding, dilation or stride near 2^63 is a shape_error naming them",
          "[nn][failure]") {
  const auto x = ts::ones<float>({1, 1, 5, 5});
  const auto w = ts::ones<float>({1, 1, 3, 3});
  CHECK_THROWS_AS(F::conv2d(x, w, {.padding = huge}), ts::shape_error);
  CHECK_THROWS_WITH(F::conv2d(x, w, {.padding = huge}),
                    Contains("conv2d") && Contains("does not fit a 64-bit integer") &&
                        Contains("4611686018427387904"));
  CHECK_THROWS_WITH(F::conv2d(x, w, {.dilation = huge}),
                    Contains("does not fit a 64-bit integer") && Contains("dilation"));
  CHECK_THROWS_WITH(F::conv2d(x, w, {.dilation = most}), Contains("does not fit a 64-bit integer"));
  // A dilation that fits int64 but spans more than the input: the ordinary error.
  CHECK_THROWS_WITH(F::conv2d(x, w, {.dilation = {1, 3}}), Contains("larger than the padded input"));
  // A stride of INT64_MAX is legal: one output position per axis, the top-left window.
  const auto y = F::conv2d(ts::arange<float>(0, 25).view({1, 1, 5, 5}), w, {.stride = most});
  REQUIRE(y.shape() == ts::Shape{1, 1, 1, 1});
  CHECK(y.item() == 0 + 1 + 2 + 5 + 6 + 7 + 10 + 11 + 12);
  // Padding large enough that the output itself cannot exist: named, nothing allocated.
  CHECK_THROWS_WITH(F::conv2d(x, w, {.padding = std::int64_t{1} << 32}),
                    Contains("does not fit a 64-bit integer"));
}

TEST_CASE("a convolution weight with an empty kernel says so", "[nn][failure]") {
  const auto x = ts::ones<float>({1, 1, 5, 5});
  CHECK_THROWS_WITH(F::conv2d(x, ts::ones<float>({1, 1, 0, 3})),
                    Contains("expected a kernel of at least (1, 1), got (0, 3)") &&
                        Contains("[1, 1, 0, 3]"));
}

TEST_CASE("pooling with padding or stride near 2^63 is a shape_error or the right answer",
          "[nn][failure]") {
  const auto x = ts::arange<float>(0, 25).view({1, 1, 5, 5});
  // PyTorch's padding <= kernel / 2, checked without computing 2 * padding.
  CHECK_THROWS_WITH(F::max_pool2d(x, 3, {.padding = huge}),
                    Contains("padding (4611686018427387904, 4611686018427387904)") &&
                        Contains("at most half of kernel_size (3, 3)"));
  CHECK_THROWS_WITH(F::avg_pool2d(x, 3, {.padding = most}), Contains("at most half"));
  CHECK_THROWS_WITH(F::max_pool2d(x, 3, {.dilation = huge}),
                    Contains("does not fit a 64-bit integer"));
  // A huge kernel (padding within its half) whose padded input overflows.
  CHECK_THROWS_WITH(F::max_pool2d(x, huge, {.padding = huge / 2}),
                    Contains("does not fit a 64-bit integer"));
  // stride INT64_MAX with ceil_mode (its rounding up used to add stride - 1): PyTorch gives one
  // window per axis, the top-left one.
  for (const bool ceil : {false, true}) {
    CAPTURE(ceil);
    const auto y = F::max_pool2d(x, 3, {.stride = most, .ceil_mode = ceil});
    REQUIRE(y.shape() == ts::Shape{1, 1, 1, 1});
    CHECK(y.item() == 12.0f);
    const auto a = F::avg_pool2d(x, 3, {.stride = most, .ceil_mode = ceil});
    REQUIRE(a.shape() == ts::Shape{1, 1, 1, 1});
    CHECK(a.item() == Approx((0 + 1 + 2 + 5 + 6 + 7 + 10 + 11 + 12) / 9.0));
  }
  // ceil_mode's rounding, checked against PyTorch's formula by hand: 5 wide, kernel 2, stride 2
  // -> floor 2, ceil 3 windows.
  CHECK(F::max_pool2d(x, 2, {.stride = 2}).shape() == ts::Shape{1, 1, 2, 2});
  CHECK(F::max_pool2d(x, 2, {.stride = 2, .ceil_mode = true}).shape() == ts::Shape{1, 1, 3, 3});
}

TEST_CASE("BatchNorm with no channels is refused by its constructor, by name", "[nn][failure]") {
  CHECK_THROWS_WITH(ts::nn::BatchNorm2d<float>(0), Contains("num_features >= 1") &&
                                                       Contains("BatchNorm2d"));
  CHECK_THROWS_AS(ts::nn::BatchNorm1d<float>(0), std::invalid_argument);
}

TEST_CASE("BatchNorm2d's forward that runs out of memory leaves its statistics as they were",
          "[nn][failure][memory]") {
  const ts::Device cpu1 = ts::Device::parse("cpu:1");
  ts::nn::BatchNorm2d<float> bn(4, 1e-5, 0.1, true, true, 1);
  ts::manual_seed(3);
  // 13 MiB: the output takes a segment of its own (the pool's large requests), while the
  // statistics and the workspace fit the 2 MiB segment of small ones, so some limits let them
  // be made and refuse the output.
  const auto x = ts::randn<float>({8, 4, 320, 320}, 1);
  (void)bn(x);  // one step: statistics away from their initial values
  const auto mean = bn.running_mean().value().to_vector();
  const auto var = bn.running_var().value().to_vector();
  const auto tracked = bn.num_batches_tracked().value().item();
  REQUIRE(tracked == 1);
  // Limits from "nothing fits" up, 1 MiB apart: the forward either fails, changing nothing, or
  // succeeds and moves the statistics once.
  int failures = 0, after_small = 0;
  for (std::size_t limit = 0; limit <= (std::size_t{64} << 20); limit += std::size_t{1} << 20) {
    ts::memory::empty_cache(cpu1);
    ts::memory::set_limit(cpu1, ts::memory::allocated(cpu1) + limit);
    bool failed = false;
    try {
      (void)bn(x);
    } catch (const ts::out_of_memory_error&) {
      failed = true;
    }
    ts::memory::set_limit(cpu1, ts::memory::no_limit);
    if (!failed) break;
    ++failures;
    if (limit >= (std::size_t{4} << 20)) ++after_small;  // the small segment fit: the output failed
    CHECK(bn.running_mean().value().to_vector() == mean);
    CHECK(bn.running_var().value().to_vector() == var);
    CHECK(bn.num_batches_tracked().value().item() == tracked);
  }
  CHECK(after_small > 0);  // the loop did fail where the old order had moved the statistics
  CHECK(bn.num_batches_tracked().value().item() == tracked + 1);  // and then one step ran
  CHECK(bn.running_mean().value().to_vector() != mean);
}

TEST_CASE("a loss whose target is on another device names the loss, not an internal op",
          "[nn][failure]") {
  const auto x = ts::ones<float>({4, 3}, 0);
  const auto y = ts::zeros<float>({4, 3}, 1);
  CHECK_THROWS_AS(ts::nn::mse_loss(x, y), ts::device_mismatch_error);
  CHECK_THROWS_WITH(ts::nn::mse_loss(x, y),
                    Contains("mse_loss: the input is on cpu:0 and the target on cpu:1"));
  CHECK_THROWS_WITH(ts::nn::l1_loss(x, y), Contains("l1_loss") && Contains("cpu:1"));
  CHECK_THROWS_WITH(ts::nn::binary_cross_entropy_with_logits(x, y),
                    Contains("binary_cross_entropy_with_logits"));
  const auto labels = ts::zeros<std::int64_t>({4}, 1);
  CHECK_THROWS_AS(ts::nn::cross_entropy(x, labels), ts::device_mismatch_error);
  CHECK_THROWS_WITH(ts::nn::cross_entropy(x, labels),
                    Contains("cross_entropy: the logits are on cpu:0 and the targets on cpu:1"));
  // On one device, the value is torch's: every logit equal, the loss is log(3).
  CHECK(ts::nn::cross_entropy(x, labels.to(0)).item() == Approx(std::log(3.0)));
}

// A plain (not templated) model whose layer is made on a fixed ordinal: nn::to cannot move it by
// making it again.
struct Pinned : ts::nn::Module {
  ts::nn::Linear<float> fc{4, 2, true, 0};
  Pinned() : Module("Pinned") { register_module("fc", fc); }
};
// A plain model whose layers follow the current ordinal: nn::to moves it between CPU devices.
struct Plain : ts::nn::Module {
  ts::nn::Linear<float> fc{4, 2};
  Plain() : Module("Plain") { register_module("fc", fc); }
};

TEST_CASE("nn::to either moves every parameter or throws naming the one that did not move",
          "[nn][failure]") {
  const ts::Device cpu1 = ts::Device::parse("cpu:1");
  Pinned pinned;
  CHECK_THROWS_WITH(ts::nn::to<ts::cpu>(pinned, 1),
                    Contains("'fc.weight' is on cpu:0") && Contains("cpu:1") &&
                        Contains("template over the kind"));
  CHECK(pinned.fc.weight().value().device() == ts::Device::parse("cpu:0"));
  Plain plain;
  const auto moved = ts::nn::to<ts::cpu>(plain, 1);
  CHECK(moved.fc.weight().value().device() == cpu1);
  CHECK(moved.fc.weight().value().to_vector() == plain.fc.weight().value().to_vector());
  if (!ts::cuda::is_available()) {
    CHECK_THROWS_AS(ts::nn::to<ts::cuda>(plain, 0), ts::device_error);  // no such device
  } else {
    // The case the issue found on a GPU: a plain model "moved" to CUDA kept its CPU weights.
    CHECK_THROWS_WITH(ts::nn::to<ts::cuda>(plain, 0), Contains("is on cpu:0"));
  }
}

}  // namespace nn_failure_test
