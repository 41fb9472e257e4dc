// AnyTensor (type-erased handle) and StateDict (ordered name -> AnyTensor map).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/tessera.hpp"

namespace any_tensor_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

TEST_CASE("AnyTensor keeps dtype, device and storage", "[any_tensor]") {
  auto t = ts::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}, 1);
  ts::AnyTensor any = t.t();
  CHECK(any.defined());
  CHECK(any.dtype() == ts::ScalarType::float64);
  CHECK(any.device() == ts::Device::parse("cpu:1"));
  CHECK(any.shape() == ts::Shape{3, 2});
  CHECK_FALSE(any.is_contiguous());
  CHECK(any.nbytes() == 48);
  CHECK(any.storage().is_same(t.storage()));
  auto back = any.as<double>();
  CHECK(back.shares_storage_with(t));
  CHECK(back.to_vector() == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK_THROWS_AS(any.as<float>(), ts::dtype_error);
  CHECK_THROWS_WITH(any.as<float>(), Catch::Contains("float64") && Catch::Contains("float32"));
  CHECK_THROWS_AS((any.as<double, ts::cuda>()), ts::device_mismatch_error);
  CHECK_THROWS_AS(ts::AnyTensor().as<float>(), ts::error);
}

TEST_CASE("AnyTensor converts device and dtype at run time", "[any_tensor]") {
  ts::AnyTensor any = ts::from_vector<float>({1.5f, -2.0f}, {2});
  auto moved = any.to(ts::Device::parse("cpu:1"));
  CHECK(moved.device().index == 1);
  CHECK(moved.as<float>().to_vector() == std::vector<float>{1.5f, -2.0f});
  auto ints = any.to(ts::ScalarType::int32);
  CHECK(ints.dtype() == ts::ScalarType::int32);
  CHECK(ints.as<int32_t>().to_vector() == std::vector<int32_t>{1, -2});
  int rank = any.visit([](const auto& typed) { return typed.dim(); });
  CHECK(rank == 1);
}

TEST_CASE("AnyTensor clone, copy_ and fill_ move each dtype's bits, on its device",
          "[any_tensor]") {
  // half: a signalling NaN's payload must survive a copy (bits, not a conversion through float).
  std::vector<ts::half> values(6);
  const std::uint16_t patterns[6] = {0x7C01, 0x3C00, 0xBC00, 0x0001, 0x7BFF, 0x8000};
  for (std::size_t i = 0; i < 6; ++i) {
    std::memcpy(static_cast<void*>(&values[i]), &patterns[i], 2);
  }
  const auto bits_of = [](const std::vector<ts::half>& v) {
    std::vector<std::uint16_t> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) std::memcpy(&out[i], &v[i], 2);
    return out;
  };
  auto source = ts::from_vector<ts::half>(values, {2, 3}, 1);
  const ts::AnyTensor any = source.t();  // a transposed view: the clone is contiguous
  const ts::AnyTensor copy = any.clone();
  CHECK(copy.dtype() == ts::ScalarType::float16);
  CHECK(copy.device() == ts::Device::parse("cpu:1"));
  CHECK(copy.shape() == ts::Shape{3, 2});
  CHECK(copy.is_contiguous());
  CHECK_FALSE(copy.storage().is_same(source.storage()));
  CHECK(bits_of(copy.as<ts::half>().to_vector()) ==
        std::vector<std::uint16_t>{0x7C01, 0x0001, 0x3C00, 0x7BFF, 0xBC00, 0x8000});

  // channels_last stays channels_last, as Tensor::clone.
  const ts::AnyTensor nhwc = ts::arange<std::int32_t>(0, 24)
                                 .view({1, 2, 3, 4})
                                 .contiguous(ts::memory_format::channels_last);
  const ts::AnyTensor nhwc_copy = nhwc.clone();
  CHECK(nhwc_copy.strides() == nhwc.strides());
  CHECK(nhwc_copy.as<std::int32_t>().to_vector() == nhwc.as<std::int32_t>().to_vector());

  // copy_ broadcasts and moves bits; another dtype is refused and changes nothing.
  const ts::AnyTensor target = ts::zeros<ts::half>({2, 3});
  target.copy_(ts::AnyTensor(source.narrow(0, 1, 1)));
  CHECK(bits_of(target.as<ts::half>().to_vector()) ==
        std::vector<std::uint16_t>{0x0001, 0x7BFF, 0x8000, 0x0001, 0x7BFF, 0x8000});
  CHECK_THROWS_AS(target.copy_(ts::AnyTensor(ts::ones<float>({2, 3}))), ts::dtype_error);
  CHECK_THROWS_WITH(target.copy_(ts::AnyTensor(ts::ones<float>({2, 3}))),
                    Catch::Contains("float32") && Catch::Contains("float16"));
  CHECK(bits_of(target.as<ts::half>().to_vector()) ==
        std::vector<std::uint16_t>{0x0001, 0x7BFF, 0x8000, 0x0001, 0x7BFF, 0x8000});
  CHECK_THROWS_AS(target.copy_(ts::AnyTensor()), ts::error);
  CHECK_THROWS_AS(ts::AnyTensor().clone(), ts::error);

  // fill_ converts the number as static_cast does, into a view only.
  const auto doubles = ts::zeros<double>({2, 2});
  ts::AnyTensor(doubles.select(1, 1)).fill_(-2.75);
  CHECK(doubles.to_vector() == std::vector<double>{0, -2.75, 0, -2.75});
  const ts::AnyTensor halves = ts::zeros<ts::half>({3});
  halves.fill_(0.1);
  for (ts::half h : halves.as<ts::half>().to_vector()) CHECK(h == ts::half(0.1f));
  const ts::AnyTensor ints = ts::zeros<std::int64_t>({2});
  ints.fill_(-3.9);
  CHECK(ints.as<std::int64_t>().to_vector() == std::vector<std::int64_t>{-3, -3});
  const ts::AnyTensor flags = ts::zeros<bool>({2});
  flags.fill_(0.5);
  CHECK(flags.as<bool>().to_vector() == std::vector<bool>{true, true});
}

TEST_CASE("StateDict keeps insertion order", "[state_dict]") {
  ts::StateDict sd;
  sd.insert("layer.weight", ts::zeros<float>({2, 2}));
  sd.insert("layer.bias", ts::zeros<float>({2}));
  sd.insert("a.first_alphabetically", ts::ones<int64_t>({1}));
  CHECK(sd.size() == 3);
  CHECK(sd.keys() ==
        std::vector<std::string>{"layer.weight", "layer.bias", "a.first_alphabetically"});
  CHECK(sd.contains("layer.bias"));
  CHECK_FALSE(sd.contains("missing"));
  CHECK(sd.at("layer.weight").shape() == ts::Shape{2, 2});
  CHECK_THROWS_WITH(sd.at("missing"), Catch::Contains("missing"));
  sd.insert("layer.weight", ts::ones<float>({3}));  // replaces in place
  CHECK(sd.keys().front() == "layer.weight");
  CHECK(sd.at("layer.weight").shape() == ts::Shape{3});
  CHECK(sd.erase("layer.bias"));
  CHECK_FALSE(sd.erase("layer.bias"));
  CHECK(sd.keys() == std::vector<std::string>{"layer.weight", "a.first_alphabetically"});
  CHECK(sd.at("a.first_alphabetically").dtype() == ts::ScalarType::int64);
  std::vector<std::string> seen;
  for (const auto& [key, tensor] : sd) seen.push_back(key);
  CHECK(seen == sd.keys());
}

}  // namespace any_tensor_test
