// Memory formats on tensors (core/memory_format.hpp, Tensor::contiguous / is_contiguous /
// suggest_memory_format / clone / to, empty and empty_like): strides against hand-written ones,
// PyTorch's contiguity rules for extent-1 dimensions, values against row-major index arithmetic.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/tessera.hpp"

namespace memory_format_test {

namespace ts = tessera;
using ts::memory_format;

namespace {
// Row-major 0, 1, 2, ... of `shape` as float (logical order, whatever the layout).
ts::Tensor<float> iota(const ts::Shape& shape) {
  std::vector<float> values(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  return ts::from_vector<float>(values, shape);
}
std::vector<float> iota_values(std::int64_t n) {
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  return values;
}
}  // namespace

TEST_CASE("channels_last strides are NHWC's", "[memory_format]") {
  auto x = ts::empty<float>({2, 3, 4, 5}, memory_format::channels_last);
  CHECK(x.shape() == ts::Shape{2, 3, 4, 5});
  CHECK(x.strides() == ts::Strides{60, 1, 15, 3});
  CHECK(x.is_contiguous(memory_format::channels_last));
  CHECK_FALSE(x.is_contiguous());
  CHECK_FALSE(x.is_contiguous(memory_format::contiguous_format));
  CHECK(x.suggest_memory_format() == memory_format::channels_last);
  auto c = ts::empty<float>({2, 3, 4, 5}, memory_format::contiguous_format);
  CHECK(c.strides() == ts::Strides{60, 20, 5, 1});
  CHECK(c.suggest_memory_format() == memory_format::contiguous_format);
  CHECK_FALSE(c.is_contiguous(memory_format::channels_last));
  // Extent-0 and extent-1 dimensions count as 1 in the strides (PyTorch's
  // get_channels_last_strides_2d).
  CHECK(ts::empty<float>({2, 3, 0, 5}, memory_format::channels_last).strides() ==
        ts::Strides{15, 1, 15, 3});
}

TEST_CASE("is_contiguous(channels_last) ignores extent-1 dimensions, as PyTorch",
          "[memory_format]") {
  // [N, 1, H, W]: NCHW and NHWC are the same bytes; both tests hold for a contiguous one.
  auto one_channel = ts::zeros<float>({2, 1, 3, 4});
  CHECK(one_channel.is_contiguous());
  CHECK(one_channel.is_contiguous(memory_format::channels_last));
  // ...but its layout is ambiguous, and suggest_memory_format says contiguous (PyTorch).
  CHECK(one_channel.suggest_memory_format() == memory_format::contiguous_format);
  // [N, C, 1, 1]: likewise.
  auto pooled = ts::zeros<float>({2, 3, 1, 1});
  CHECK(pooled.is_contiguous(memory_format::channels_last));
  CHECK(pooled.is_contiguous());
  // Hand-made strides that differ only in extent-1 dimensions.
  ts::Tensor<float> odd(ts::zeros<float>({24}).storage(), ts::Shape{2, 3, 1, 4},
                        ts::Strides{12, 1, 999, 3}, 0);
  CHECK(odd.is_contiguous(memory_format::channels_last));
  CHECK_FALSE(odd.is_contiguous());
  // suggest_memory_format does read them (PyTorch's is_channels_last_strides_2d): H's stride 999
  // above N's breaks the order; with H's stride at 12 the layout is channels_last.
  CHECK(odd.suggest_memory_format() == memory_format::contiguous_format);
  ts::Tensor<float> ordered(odd.storage(), ts::Shape{2, 3, 1, 4}, ts::Strides{12, 1, 12, 3}, 0);
  CHECK(ordered.suggest_memory_format() == memory_format::channels_last);
  // Not 4-d: never channels_last, and no error when asking.
  CHECK_FALSE(ts::zeros<float>({2, 3, 4}).is_contiguous(memory_format::channels_last));
  CHECK(ts::zeros<float>({2, 3, 4}).suggest_memory_format() == memory_format::contiguous_format);
  // A permuted NCHW view with NHWC strides is channels_last; a narrowed one is not dense.
  auto nchw = ts::zeros<float>({2, 4, 5, 3});
  auto as_nhwc = nchw.permute({0, 3, 1, 2});  // logical [2, 3, 4, 5], strides [60, 1, 15, 3]
  CHECK(as_nhwc.strides() == ts::Strides{60, 1, 15, 3});
  CHECK(as_nhwc.is_contiguous(memory_format::channels_last));
  auto narrowed = as_nhwc.narrow(3, 0, 4);
  CHECK_FALSE(narrowed.is_contiguous(memory_format::channels_last));
  CHECK(narrowed.suggest_memory_format() == memory_format::channels_last);
  CHECK_THROWS_AS(nchw.is_contiguous(memory_format::preserve_format), ts::error);
}

TEST_CASE("contiguous(channels_last) moves the values into NHWC order", "[memory_format]") {
  const ts::Shape shape{2, 3, 4, 5};
  auto x = iota(shape);
  auto y = x.contiguous(memory_format::channels_last);
  CHECK(y.strides() == ts::Strides{60, 1, 15, 3});
  CHECK_FALSE(y.shares_storage_with(x));
  // Logical values unchanged.
  CHECK(y.to_vector() == iota_values(shape.numel()));
  // Storage order: element (n, c, h, w) at n*60 + h*15 + w*3 + c, holding its row-major index.
  const float* data = y.data();
  bool stored_nhwc = true;
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 3; ++c)
      for (int h = 0; h < 4; ++h)
        for (int w = 0; w < 5; ++w) {
          const float expected = static_cast<float>(((n * 3 + c) * 4 + h) * 5 + w);
          if (data[n * 60 + h * 15 + w * 3 + c] != expected) stored_nhwc = false;
        }
  CHECK(stored_nhwc);
  // Already so: the same storage, no copy.
  auto again = y.contiguous(memory_format::channels_last);
  CHECK(again.shares_storage_with(y));
  CHECK(again.data() == y.data());
  // And back.
  auto back = y.contiguous(memory_format::contiguous_format);
  CHECK(back.strides() == ts::Strides{60, 20, 5, 1});
  CHECK(back.to_vector() == iota_values(shape.numel()));
  CHECK(y.contiguous().is_contiguous());
  CHECK(x.contiguous(memory_format::contiguous_format).shares_storage_with(x));
}

TEST_CASE("channels_last on a tensor that is not 4-d throws naming the shape, changing nothing",
          "[memory_format]") {
  auto x = iota({2, 3, 4});
  const auto allocated = ts::memory::allocated(x.device());
  try {
    (void)x.contiguous(memory_format::channels_last);
    FAIL("no exception");
  } catch (const ts::shape_error& e) {
    CHECK(std::string(e.what()).find("[2, 3, 4]") != std::string::npos);
    CHECK(std::string(e.what()).find("channels_last") != std::string::npos);
    CHECK(std::string(e.what()).find("contiguous") != std::string::npos);
  }
  CHECK_THROWS_AS(x.clone(memory_format::channels_last), ts::shape_error);
  CHECK_THROWS_AS(ts::empty<float>({2, 3}, memory_format::channels_last), ts::shape_error);
  CHECK_THROWS_AS(x.contiguous(memory_format::preserve_format), ts::error);
  CHECK_THROWS_AS(ts::empty<float>({1, 2, 3, 4}, memory_format::preserve_format), ts::error);
  CHECK(ts::memory::allocated(x.device()) == allocated);
  CHECK(x.strides() == ts::Strides{12, 4, 1});
  CHECK(x.to_vector() == iota_values(24));
}

TEST_CASE("copies keep the channels_last layout where PyTorch does (preserve_format)",
          "[memory_format]") {
  const ts::Shape shape{2, 3, 4, 5};
  auto x = iota(shape).contiguous(memory_format::channels_last);
  const ts::Strides nhwc{60, 1, 15, 3};
  const ts::Strides nchw{60, 20, 5, 1};
  CHECK(x.clone().strides() == nhwc);
  CHECK(x.clone().to_vector() == iota_values(shape.numel()));
  CHECK(x.clone(memory_format::contiguous_format).strides() == nchw);
  CHECK(iota(shape).clone(memory_format::channels_last).strides() == nhwc);
  auto d = x.to<double>();
  CHECK(d.strides() == nhwc);
  CHECK(d.to_vector()[37] == 37.0);
  CHECK(x.to(1).strides() == nhwc);  // another virtual CPU device
  CHECK(x.to(1).to_vector() == iota_values(shape.numel()));
  CHECK(ts::empty_like(x).strides() == nhwc);
  CHECK(ts::empty_like(x, memory_format::contiguous_format).strides() == nchw);
  CHECK(ts::empty_like(iota(shape)).strides() == nchw);
  CHECK(ts::zeros_like(x).to_vector() == std::vector<float>(120, 0.0f));
  CHECK(ts::zeros_like(x).strides() == nhwc);
  CHECK(ts::eval(x).strides() == nhwc);
  // A transposed matrix's copy is contiguous (PyTorch would keep its strides: see clone's doc).
  CHECK(iota({2, 3}).t().clone().strides() == ts::Strides{2, 1});
  // reshape copies into row-major order whatever the source's format.
  auto flat = x.reshape({2, 60});
  CHECK(flat.is_contiguous());
  CHECK(flat.to_vector() == iota_values(shape.numel()));
}

}  // namespace memory_format_test
