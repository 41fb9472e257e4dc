// AnyTensor (type-erased handle) and StateDict (ordered name -> AnyTensor map).
#include <catch2/catch.hpp>

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
