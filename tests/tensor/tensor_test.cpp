// Tensor: factories, queries, views (PyTorch semantics), copies and conversions on the CPU.
// Expected values are written out by hand or computed from index arithmetic, never by the code
// under test.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tessera/tessera.hpp"

namespace tensor_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

namespace {
// Row-major 0, 1, 2, ... of `shape` as float.
ts::Tensor<float> iota(const ts::Shape& shape) {
  std::vector<float> values(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  return ts::from_vector<float>(values, shape);
}
}  // namespace

TEST_CASE("tensors with no elements are contiguous, as in PyTorch", "[tensor]") {
  CHECK(ts::zeros<float>({4, 0}).is_contiguous());
  CHECK(ts::zeros<float>({0, 3}).transpose(0, 1).is_contiguous());
  CHECK(ts::zeros<float>({2, 0, 3}).permute({2, 0, 1}).is_contiguous());
  CHECK_FALSE(ts::zeros<float>({2, 3}).transpose(0, 1).is_contiguous());
}

TEST_CASE("factories fill, shape and device", "[tensor]") {
  auto z = ts::zeros<float>({2, 3});
  CHECK(z.shape() == ts::Shape{2, 3});
  CHECK(z.dim() == 2);
  CHECK(z.numel() == 6);
  CHECK(z.strides() == ts::Strides{3, 1});
  CHECK(z.is_contiguous());
  CHECK(z.device() == ts::Device::parse("cpu:0"));
  CHECK(z.device_index() == 0);
  CHECK_FALSE(z.is_cuda());
  CHECK(z.dtype() == ts::ScalarType::float32);
  CHECK(z.to_vector() == std::vector<float>(6, 0.0f));
  CHECK(ts::ones<int32_t>({3}).to_vector() == std::vector<int32_t>{1, 1, 1});
  CHECK(ts::full<double>({2}, 2.5).to_vector() == std::vector<double>{2.5, 2.5});
  CHECK(ts::full<bool>({2}, true).to_vector() == std::vector<bool>{true, true});
  CHECK(ts::arange<int64_t>(5).to_vector() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(ts::arange<float>(1, 2, 0.25).to_vector() == std::vector<float>{1, 1.25f, 1.5f, 1.75f});
  CHECK(ts::arange<double>(3, 0, -1).to_vector() == std::vector<double>{3, 2, 1});
  CHECK(ts::from_vector<ts::half>({ts::half(1.5f), ts::half(-2.0f)}, {2}).to_vector()[1] ==
        ts::half(-2.0f));
  CHECK(z.size(-1) == 3);
  CHECK(z.size(0) == 2);
  CHECK_THROWS_AS(z.size(2), ts::shape_error);
}

TEST_CASE("0-dim and empty tensors", "[tensor]") {
  auto scalar = ts::full<float>({}, 3.0f);
  CHECK(scalar.dim() == 0);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.item() == 3.0f);
  auto empty = ts::zeros<float>({0, 4});
  CHECK(empty.numel() == 0);
  CHECK(empty.to_vector().empty());
  CHECK(empty.view({4, 0}).shape() == ts::Shape{4, 0});
  CHECK(ts::arange<float>(0).numel() == 0);
}

TEST_CASE("bad factory arguments throw and name the values", "[tensor][errors]") {
  CHECK_THROWS_WITH(ts::from_vector<float>({1, 2, 3}, {2, 2}),
                    Catch::Contains("3 values") && Catch::Contains("[2, 2]"));
  CHECK_THROWS_AS(ts::zeros<float>({-2, 3}), ts::shape_error);
  CHECK_THROWS_WITH(ts::zeros<float>({-2, 3}), Catch::Contains("-2"));
  CHECK_THROWS_AS(ts::arange<float>(0, 1, 0), ts::error);
  CHECK_THROWS_AS(ts::arange<float>(0, 5, -1), ts::error);
  CHECK_THROWS_WITH(ts::zeros<float>({2}, 5), Catch::Contains("cpu:5"));
  CHECK_THROWS_AS(ts::zeros<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}), ts::shape_error);
}

TEST_CASE("item and to_vector copy to the host", "[tensor]") {
  auto t = iota({2, 3});
  CHECK(t.to_vector() == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(t[1][2].item() == 5.0f);
  CHECK_THROWS_WITH(t.item(), Catch::Contains("6 elements"));
}

TEST_CASE("view and reshape follow PyTorch's stride rules", "[tensor][views]") {
  auto t = iota({2, 3, 4});
  auto v = t.view({6, -1});
  CHECK(v.shape() == ts::Shape{6, 4});
  CHECK(v.shares_storage_with(t));
  CHECK(v.to_vector() == t.to_vector());
  CHECK(t.view({-1}).shape() == ts::Shape{24});
  CHECK_THROWS_WITH(t.view({5, -1}), Catch::Contains("[5, -1]") && Catch::Contains("24"));
  CHECK_THROWS_AS(t.view({-1, -1}), ts::shape_error);

  // A transposed tensor cannot be flattened without a copy...
  auto tt = t.transpose(1, 2);  // [2, 4, 3]
  CHECK_THROWS_WITH(tt.view({24}), Catch::Contains("reshape"));
  // ...but dimensions that stay contiguous can still be split or merged.
  auto split = tt.view({2, 2, 2, 3});
  CHECK(split.shares_storage_with(t));
  CHECK(split.strides() == ts::Strides{12, 2, 1, 4});
  // reshape copies only when it must.
  auto flat = tt.reshape({24});
  CHECK_FALSE(flat.shares_storage_with(t));
  auto flat_values = flat.to_vector();
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j)
        CHECK(flat_values[static_cast<std::size_t>(b * 12 + i * 3 + j)] ==
              static_cast<float>(b * 12 + j * 4 + i));
  CHECK(t.reshape({4, 6}).shares_storage_with(t));
}

TEST_CASE("transpose, permute, narrow, select", "[tensor][views]") {
  auto t = iota({2, 3, 4});
  auto p = t.permute({2, 0, 1});
  CHECK(p.shape() == ts::Shape{4, 2, 3});
  CHECK(p.strides() == ts::Strides{1, 12, 4});
  CHECK_FALSE(p.is_contiguous());
  auto pv = p.contiguous().to_vector();
  for (int k = 0; k < 4; ++k)
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 3; ++b)
        CHECK(pv[static_cast<std::size_t>(k * 6 + a * 3 + b)] ==
              static_cast<float>(a * 12 + b * 4 + k));
  CHECK_THROWS_AS(t.permute({0, 0, 1}), ts::shape_error);
  CHECK_THROWS_AS(t.permute({0, 1}), ts::shape_error);

  auto n = t.narrow(2, 1, 2);  // [2, 3, 2]
  CHECK(n.shape() == ts::Shape{2, 3, 2});
  CHECK(n.storage_offset() == 1);
  CHECK(n.to_vector() ==
        std::vector<float>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});
  CHECK(t.narrow(-1, -1, 1).to_vector() == std::vector<float>{3, 7, 11, 15, 19, 23});
  CHECK_THROWS_WITH(t.narrow(1, 2, 2), Catch::Contains("start 2") && Catch::Contains("size 3"));

  CHECK(t.select(1, 2).to_vector() == std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23});
  CHECK(t.select(0, -1).shape() == ts::Shape{3, 4});
  CHECK_THROWS_AS(t.select(0, 2), ts::shape_error);
  CHECK(t.transpose(0, -1).shape() == ts::Shape{4, 3, 2});
  CHECK(t.unsqueeze(1).shape() == ts::Shape{2, 1, 3, 4});
  CHECK(t.unsqueeze(-1).shape() == ts::Shape{2, 3, 4, 1});
  CHECK(t.unsqueeze(0).squeeze(0).shape() == t.shape());
  CHECK(t.squeeze(0).shape() == t.shape());
  CHECK(t.flatten(1).shape() == ts::Shape{2, 12});
  CHECK(t.flatten().shape() == ts::Shape{24});
}

TEST_CASE("split and chunk", "[tensor][views]") {
  auto t = iota({5, 2});
  auto pieces = t.split(2);
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[0].to_vector() == std::vector<float>{0, 1, 2, 3});
  CHECK(pieces[2].shape() == ts::Shape{1, 2});
  CHECK(pieces[2].to_vector() == std::vector<float>{8, 9});
  auto chunks = t.chunk(2);  // PyTorch: ceil(5 / 2) = 3 rows, then 2
  REQUIRE(chunks.size() == 2);
  CHECK(chunks[0].shape() == ts::Shape{3, 2});
  CHECK(chunks[1].shape() == ts::Shape{2, 2});
  CHECK(t.chunk(2, 1)[1].to_vector() == std::vector<float>{1, 3, 5, 7, 9});
  CHECK(ts::zeros<float>({6}).chunk(4).size() == 3);  // sizes 2, 2, 2 as in PyTorch
  CHECK_THROWS_AS(t.chunk(0), ts::shape_error);
  CHECK_THROWS_AS(t.split(0), ts::shape_error);
}

TEST_CASE("expand broadcasts without copying", "[tensor][views]") {
  auto row = iota({1, 3});
  auto e = row.expand({4, -1});
  CHECK(e.shape() == ts::Shape{4, 3});
  CHECK(e.strides() == ts::Strides{0, 1});
  CHECK(e.contiguous().to_vector() == std::vector<float>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2});
  CHECK_THROWS_WITH(row.expand({4, 2}), Catch::Contains("[1, 3]") && Catch::Contains("[4, 2]"));
}

TEST_CASE("copy_ converts dtypes, broadcasts and writes through views", "[tensor][copy]") {
  auto dst = ts::zeros<double>({2, 3});
  dst.copy_(iota({3}));  // broadcast a row
  CHECK(dst.to_vector() == std::vector<double>{0, 1, 2, 0, 1, 2});
  dst.narrow(1, 1, 1).fill_(7.0);
  CHECK(dst.to_vector() == std::vector<double>{0, 7, 2, 0, 7, 2});
  dst.transpose(0, 1).copy_(iota({3, 2}));
  CHECK(dst.to_vector() == std::vector<double>{0, 2, 4, 1, 3, 5});
  CHECK_THROWS_WITH(dst.copy_(iota({4})), Catch::Contains("[4]") && Catch::Contains("[2, 3]"));
  CHECK(dst.to_vector() == std::vector<double>{0, 2, 4, 1, 3, 5});  // untouched by the error

  // Overlapping source and destination in one storage behave as if the source were copied first.
  auto t = iota({3, 3});
  t.copy_(t.t());
  CHECK(t.to_vector() == std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8});
}

TEST_CASE("to<U>() converts like a C++ cast, bool like PyTorch", "[tensor][copy]") {
  auto f = ts::from_vector<float>({-1.75f, 0.0f, 2.5f, 300.0f}, {4});
  CHECK(f.to<int32_t>().to_vector() == std::vector<int32_t>{-1, 0, 2, 300});
  CHECK(f.to<bool>().to_vector() == std::vector<bool>{true, false, true, true});
  CHECK(f.to<double>().to_vector() == std::vector<double>{-1.75, 0.0, 2.5, 300.0});
  auto h = f.to<ts::half>().to_vector();
  CHECK(static_cast<float>(h[0]) == -1.75f);
  CHECK(static_cast<float>(h[3]) == 300.0f);
  auto b = f.to<ts::bfloat16>().to<float>().to_vector();
  CHECK(b == std::vector<float>{-1.75f, 0.0f, 2.5f, 300.0f});  // all exact in bfloat16
  CHECK(f.to<float>().shares_storage_with(f));
  auto nan = ts::full<float>({1}, std::numeric_limits<float>::quiet_NaN());
  CHECK(nan.to<bool>().item());  // NaN is truthy, as in PyTorch
  CHECK(std::isnan(static_cast<float>(nan.to<ts::half>().item())));
}

TEST_CASE("new_* follow the source's dtype and device", "[tensor]") {
  auto t = ts::ones<int16_t>({2});
  auto z = t.new_zeros({3, 1});
  static_assert(std::is_same_v<decltype(z), ts::Tensor<int16_t>>);
  CHECK(z.to_vector() == std::vector<int16_t>{0, 0, 0});
  CHECK(t.new_ones({1}).item() == 1);
  CHECK(t.new_full({2}, 9).to_vector() == std::vector<int16_t>{9, 9});
  CHECK(t.new_empty({4}).numel() == 4);
  CHECK(t.new_tensor({1, 2, 3, 4}, {2, 2}).to_vector() == std::vector<int16_t>{1, 2, 3, 4});
  CHECK_THROWS_AS(t.new_tensor({1, 2, 3}, {2, 2}), ts::shape_error);
}

TEST_CASE("cat concatenates along any dimension", "[tensor]") {
  auto a = iota({2, 2});
  auto b = ts::full<float>({2, 1}, -1.0f);
  CHECK(ts::cat({a, b}, 1).to_vector() == std::vector<float>{0, 1, -1, 2, 3, -1});
  CHECK(ts::cat({a, a}, 0).shape() == ts::Shape{4, 2});
  CHECK(ts::cat({a, a}, -1).to_vector() == std::vector<float>{0, 1, 0, 1, 2, 3, 2, 3});
  std::vector<ts::Tensor<float>> list = {a.t(), a};
  CHECK(ts::cat(list, 0).to_vector() == std::vector<float>{0, 2, 1, 3, 0, 1, 2, 3});
  CHECK_THROWS_WITH(ts::cat({a, b}, 0), Catch::Contains("[2, 2]") && Catch::Contains("[2, 1]"));
  CHECK_THROWS_AS(ts::cat(std::vector<ts::Tensor<float>>{}, 0), ts::shape_error);
}

TEST_CASE("undefined tensors throw instead of crashing", "[tensor][errors]") {
  ts::Tensor<float> undefined;
  CHECK_FALSE(undefined.defined());
  CHECK_THROWS_AS(undefined.view({1}), ts::error);
  CHECK_THROWS_AS(undefined.to_vector(), ts::error);
  CHECK_THROWS_AS(undefined.fill_(1.0f), ts::error);
  // new_* on an undefined tensor uses the current device.
  CHECK(undefined.new_zeros({2}).device() == ts::Device::parse("cpu"));
}

TEST_CASE("rand and randn draw from the device generator", "[tensor][random]") {
  ts::manual_seed(1234);
  auto a = ts::rand<float>({1000});
  ts::manual_seed(1234);
  auto b = ts::rand<float>({1000});
  CHECK(a.to_vector() == b.to_vector());
  auto c = ts::rand<float>({1000});
  CHECK(c.to_vector() != a.to_vector());  // the generator advanced
  for (float v : a.to_vector()) {
    REQUIRE(v >= 0.0f);
    REQUIRE(v < 1.0f);
  }
  // Element i depends only on (seed, offset, i): it equals the documented Philox mapping.
  ts::manual_seed(7);
  auto u = ts::rand<float>({5}).to_vector();
  for (std::uint64_t i = 0; i < 5; ++i) CHECK(u[i] == ts::uniform_float(7, 0, i));
  auto n = ts::randn<double>({10000}).to_vector();
  double mean = 0, square = 0;
  for (double v : n) {
    mean += v;
    square += v * v;
  }
  mean /= 10000;
  CHECK(std::abs(mean) < 0.05);  // 5 standard errors
  CHECK(std::abs(square / 10000 - 1.0) < 0.07);
}

TEST_CASE("a fill drawn on the host inside a graph capture throws, naming why",
          "[tensor][random]") {
  // Only kernels (nvcc's units) read a captured fill's seed and offset from device memory; a
  // host fill would draw the wrong numbers at every replay, so it refuses (and the capture fails,
  // which a program turns into running without graphs).
  ts::Generator& generator = ts::default_generator(ts::Device{ts::DeviceType::cpu, 0});
  const std::uint64_t offset = generator.offset();
  const std::uint64_t device_state[2] = {0, 0};
  generator.begin_graph_capture(device_state);
  CHECK_THROWS_WITH(ts::rand<float>({8}, 0),
                    Catch::Contains("cpu:0") && Catch::Contains("cannot be captured"));
  CHECK(generator.end_graph_capture() == 2);  // the blocks the refused fill asked for
  CHECK(generator.offset() == offset);
  CHECK(ts::rand<float>({8}, 0).numel() == 8);  // as usual after the capture
}

TEST_CASE("large fills are cut over threads and still give element i its number",
          "[tensor][random]") {
  // Several chunks of counter blocks (random_blocks_per_chunk) and a ragged end: every element
  // equals the element functions of the documented mapping.
  const std::int64_t n = 4 * 4096 * 5 + 3;
  ts::manual_seed(31);
  const auto u = ts::rand<float>({n}).to_vector();
  const auto d = ts::rand<double>({n}).to_vector();
  const auto z = ts::randn<float>({n}).to_vector();
  const std::uint64_t float_blocks = ts::blocks_needed<float>(static_cast<std::uint64_t>(n));
  const std::uint64_t double_blocks = ts::blocks_needed<double>(static_cast<std::uint64_t>(n));
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::uint64_t>(i);
    const auto at = static_cast<std::size_t>(i);
    wrong += u[at] != ts::uniform_float(31, 0, k);
    wrong += d[at] != ts::uniform_double(31, float_blocks, k);
    wrong += z[at] != ts::normal_float(31, float_blocks + double_blocks, k);
  }
  CHECK(wrong == 0);
  // A channels_last tensor gets a contiguous one's numbers, element by element.
  ts::manual_seed(32);
  const auto contiguous = ts::rand<float>({2, 3, 4, 5});
  ts::manual_seed(32);
  auto nhwc = ts::empty<float>({2, 3, 4, 5}, ts::memory_format::channels_last);
  ts::detail::fill_uniform_(nhwc);
  CHECK(nhwc.is_contiguous(ts::memory_format::channels_last));
  CHECK(nhwc.to_vector() == contiguous.to_vector());
}

}  // namespace tensor_test

namespace tensor_test {

namespace {
template <class H>
std::vector<std::uint16_t> bits_of(const ts::Tensor<H>& t) {
  std::vector<std::uint16_t> bits;
  for (const H& value : t.contiguous().to_vector()) bits.push_back(value.bits());
  return bits;
}
template <class H>
H from_bits(std::uint16_t bits) {
  return H::from_bits(bits);
}
}  // namespace

TEMPLATE_TEST_CASE("copies of one 16-bit dtype move the bits, signalling NaNs included",
                   "[tensor][copy][half]", ts::half, ts::bfloat16) {
  // Signalling NaNs (quiet bit clear), a quiet NaN with a payload, -0 and an ordinary value:
  // converting through float would set the quiet bit (0x7C01 -> 0x7E01); PyTorch's copies keep it.
  const std::vector<std::uint16_t> bits =
      std::is_same_v<TestType, ts::half>
          ? std::vector<std::uint16_t>{0x7C01, 0xFC02, 0x7E05, 0x8000, 0x3C00, 0x7D00}
          : std::vector<std::uint16_t>{0x7F81, 0xFF82, 0x7FC5, 0x8000, 0x3F80, 0x7F90};
  std::vector<TestType> values;
  for (auto b : bits) values.push_back(from_bits<TestType>(b));
  const auto t = ts::from_vector<TestType>(values, {2, 3});
  CHECK(bits_of(t) == bits);
  CHECK(bits_of(t.clone()) == bits);
  CHECK(bits_of(t.template to<TestType>()) == bits);
  auto copied = ts::zeros<TestType>({2, 3});
  copied.copy_(t);
  CHECK(bits_of(copied) == bits);
  // Through a strided layout both ways: transposed, made contiguous, transposed back.
  const auto round_trip = t.t().contiguous().t();
  CHECK(bits_of(round_trip) == bits);
  auto filled = ts::zeros<TestType>({3});
  filled.fill_(from_bits<TestType>(bits[0]));
  CHECK(bits_of(filled) == std::vector<std::uint16_t>(3, bits[0]));
}

}  // namespace tensor_test
