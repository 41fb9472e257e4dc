// Placement across two virtual CPU devices (CTest runs every test with TESSERA_CPU_DEVICES=2):
// to(i) copies, new_* follow the source, bad ordinals are named, guards restore, and each device
// accounts its own memory; pin_memory without a CUDA device is a device_error.
#include <catch2/catch.hpp>

#include "skip.hpp"

#include <vector>

#include "tessera/tessera.hpp"

namespace placement_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

TEST_CASE("two virtual CPU devices are configured for the tests", "[placement]") {
  REQUIRE(ts::cpu::device_count() == 2);
}

TEST_CASE("to(i) copies to another ordinal, to(same) shares", "[placement]") {
  auto a = ts::from_vector<float>({1, 2, 3, 4}, {2, 2});
  auto b = a.to(1);
  CHECK(b.device() == ts::Device::parse("cpu:1"));
  CHECK_FALSE(b.shares_storage_with(a));
  CHECK(b.to_vector() == std::vector<float>{1, 2, 3, 4});
  b.fill_(0.0f);
  CHECK(a.to_vector() == std::vector<float>{1, 2, 3, 4});  // the original is untouched
  CHECK(a.to(0).shares_storage_with(a));
  CHECK(a.to<ts::cpu>(0).shares_storage_with(a));
  CHECK(a.cpu().shares_storage_with(a));
  CHECK(b.cpu(1).shares_storage_with(b));
  // A non-contiguous view moves as its logical elements.
  CHECK(a.t().to(1).to_vector() == std::vector<float>{1, 3, 2, 4});
}

TEST_CASE("to(i) allocates on the target device only", "[placement][memory]") {
  const auto d0 = ts::Device::parse("cpu:0");
  const auto d1 = ts::Device::parse("cpu:1");
  auto a = ts::zeros<float>({256});  // 1 KiB
  const auto before0 = ts::memory::allocated(d0);
  const auto before1 = ts::memory::allocated(d1);
  auto b = a.to(1);
  CHECK(ts::memory::allocated(d0) == before0);
  CHECK(ts::memory::allocated(d1) == before1 + 1024);
}

TEST_CASE("new_* and factories follow the device", "[placement]") {
  auto on1 = ts::ones<double>({3}, 1);
  CHECK(on1.device_index() == 1);
  CHECK(on1.new_zeros({2}).device_index() == 1);
  CHECK(on1.new_full({2}, 4.0).device_index() == 1);
  CHECK(on1.new_tensor({1, 2}, {2}).device_index() == 1);
  CHECK(on1.clone().device_index() == 1);
  CHECK(on1.view({3, 1}).device_index() == 1);
}

TEST_CASE("a bad ordinal throws device_error naming it", "[placement][errors]") {
  CHECK_THROWS_AS(ts::zeros<float>({2}, 5), ts::device_error);
  CHECK_THROWS_WITH(ts::zeros<float>({2}, 5), Catch::Contains("cpu:5"));
  CHECK_THROWS_WITH(ts::zeros<float>({2}).to(2), Catch::Contains("cpu:2"));
  CHECK_THROWS_WITH(ts::memory::allocated(ts::Device::parse("cpu:5")), Catch::Contains("cpu:5"));
  CHECK_THROWS_WITH(ts::cpu::set_device(7), Catch::Contains("cpu:7"));
  CHECK(ts::cpu::current_device() == 0);  // unchanged by the failed call
}

TEST_CASE("DeviceGuard makes an ordinal current and restores it", "[placement]") {
  CHECK(ts::cpu::current_device() == 0);
  {
    ts::DeviceGuard<ts::cpu> guard(1);
    CHECK(ts::cpu::current_device() == 1);
    CHECK(ts::zeros<float>({1}).device_index() == 1);  // factories use the current device
    {
      ts::DeviceGuard<ts::cpu> inner(0);
      CHECK(ts::cpu::current_device() == 0);
    }
    CHECK(ts::cpu::current_device() == 1);
  }
  CHECK(ts::cpu::current_device() == 0);
  CHECK_THROWS_AS(ts::DeviceGuard<ts::cpu>(3), ts::device_error);
  CHECK(ts::cpu::current_device() == 0);
}

TEST_CASE("copies between ordinals convert dtypes and broadcast", "[placement]") {
  auto src = ts::from_vector<int32_t>({1, 2, 3}, {3}, 1);
  auto dst = ts::zeros<double>({2, 3}, 0);
  dst.copy_(src);
  CHECK(dst.to_vector() == std::vector<double>{1, 2, 3, 1, 2, 3});
}

TEST_CASE("cat rejects tensors on different ordinals, naming both", "[placement][errors]") {
  auto a = ts::zeros<float>({2}, 0);
  auto b = ts::zeros<float>({2}, 1);
  CHECK_THROWS_AS(ts::cat({a, b}, 0), ts::device_mismatch_error);
  CHECK_THROWS_WITH(ts::cat({a, b}, 0), Catch::Contains("cpu:0") && Catch::Contains("cpu:1"));
}

TEST_CASE("CUDA tensors are unavailable without a GPU, with a clear error", "[placement]") {
  if (ts::cuda::is_available()) return;  // covered by the CUDA tests on a GPU machine
  CHECK(ts::cuda::device_count() == 0);
  CHECK_THROWS_AS((ts::zeros<float, ts::cuda>({2})), ts::device_error);
  CHECK_THROWS_WITH(ts::zeros<float>({2}).cuda(), Catch::Contains("cuda:0"));
}

TEST_CASE("pin_memory needs a CUDA device: device_error, the tensor unchanged",
          "[placement][skippable]") {
  if (ts::cuda::is_available()) {  // pinning itself: tests/cuda/tensor_test.cu
    TESSERA_SKIP("a CUDA device is present, so pin_memory succeeds (tests/cuda/tensor_test.cu)");
  }
  const std::vector<float> values{1, 2, 3, 4, 5, 6};
  auto a = ts::from_vector<float>(values, {2, 3});
  const auto allocated = ts::memory::allocated(ts::Device{});
  CHECK_FALSE(a.is_pinned());
  CHECK_THROWS_AS(a.pin_memory(), ts::device_error);
  CHECK_THROWS_WITH(a.pin_memory(),
                    Catch::Contains("pin_memory") &&
                        Catch::Contains("Cannot access accelerator device when none is available"));
  CHECK_THROWS_AS(a.t().pin_memory(), ts::device_error);  // a view: no contiguous copy either
  CHECK_FALSE(a.is_pinned());
  CHECK(a.to_vector() == values);
  CHECK(a.shape() == ts::Shape{2, 3});
  CHECK(a.storage().use_count() == 1);
  CHECK(ts::memory::allocated(ts::Device{}) == allocated);  // nothing allocated on the way
  CHECK_FALSE(ts::zeros<float>({2}).is_pinned());
  CHECK(ts::memory::pinned_stats().allocated_bytes.current == 0);
  CHECK(ts::memory::pinned_stats().reserved_bytes.current == 0);
  ts::memory::pinned_empty_cache();  // nothing to do, no error
}

}  // namespace placement_test
