// Device parsing and printing, device kinds, virtual CPU device count, CUDA queries without a GPU.
#include <catch2/catch.hpp>

#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tessera/core/device.hpp"

namespace device_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

TEST_CASE("Device::parse reads PyTorch's device strings", "[device]") {
  CHECK(ts::Device::parse("cpu") == ts::Device(ts::DeviceType::cpu, 0));
  CHECK(ts::Device::parse("cpu:1") == ts::Device(ts::DeviceType::cpu, 1));
  CHECK(ts::Device::parse("cuda") == ts::Device(ts::DeviceType::cuda, 0));
  CHECK(ts::Device::parse("cuda:12") == ts::Device(ts::DeviceType::cuda, 12));
  CHECK(ts::Device::parse("cuda:3").str() == "cuda:3");
  std::ostringstream os;
  os << ts::Device::parse("cpu");
  CHECK(os.str() == "cpu:0");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cpu:1x", "CPU", "", ":0", "cuda:1:2"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(ts::Device::parse(bad), std::invalid_argument);
  }
  CHECK_THROWS_WITH(ts::Device::parse("tpu:0"), Catch::Contains("'tpu:0'"));
  CHECK(ts::Device::of<ts::cuda>(2) == ts::Device::parse("cuda:2"));
}

TEST_CASE("a bare kind means the calling thread's current device of that kind", "[device]") {
  {
    ts::DeviceGuard<ts::cpu> guard(1);  // the harness runs with TESSERA_CPU_DEVICES=2
    CHECK(ts::Device::parse("cpu") == ts::Device(ts::DeviceType::cpu, 1));
    CHECK(ts::Device::parse("cpu:0") == ts::Device(ts::DeviceType::cpu, 0));
  }
  CHECK(ts::Device::parse("cpu") == ts::Device(ts::DeviceType::cpu, 0));
  if (ts::cuda::is_available()) {
    CHECK(ts::Device::parse("cuda") == ts::Device(ts::DeviceType::cuda, ts::cuda::current_device()));
  } else {
    // As torch.device("cuda") on a machine without a GPU: parsing works, using it does not.
    CHECK(ts::Device::parse("cuda") == ts::Device(ts::DeviceType::cuda, 0));
    CHECK_THROWS_AS(ts::check_device(ts::Device::parse("cuda")), ts::device_error);
  }
}

TEST_CASE("with_device runs a function with the kind of a run-time device as a type", "[device]") {
  auto describe = [&]<ts::DeviceKind K>(int ordinal) {
    return std::string(K::name) + " " + std::to_string(ordinal);
  };
  CHECK(ts::with_device(ts::Device::parse("cpu:1"), describe) == "cpu 1");
  CHECK(ts::with_device(ts::Device::parse("cpu"), describe) == "cpu 0");
  CHECK(ts::with_device<ts::cpu>(ts::Device::parse("cpu:1"), describe) == "cpu 1");
  CHECK(ts::with_device<ts::cpu, ts::cuda>(ts::Device::parse("cpu:0"), describe) == "cpu 0");
  // The PyTorch idiom: the GPU when there is one, else the CPU.
  const auto device = ts::Device::parse(ts::cuda::is_available() ? "cuda:0" : "cpu");
  CHECK(ts::with_device(device, describe) == (device.is_cuda() ? "cuda 0" : "cpu 0"));
  // A function returning nothing, and one that returns a reference.
  int calls = 0;
  ts::with_device(ts::Device::parse("cpu:1"), [&]<ts::DeviceKind K>(int ordinal) {
    static_assert(std::is_same_v<K, ts::cpu>);
    calls += ordinal;
  });
  CHECK(calls == 1);
  int target = 0;
  int& same = ts::with_device(ts::Device::parse("cpu"), [&]<ts::DeviceKind>(int) -> int& {
    return target;
  });
  CHECK(&same == &target);
}

TEST_CASE("with_device checks the device before the function runs", "[device]") {
  int calls = 0;
  auto count = [&]<ts::DeviceKind>(int) { ++calls; };
  CHECK_THROWS_WITH(ts::with_device(ts::Device::parse("cpu:2"), count),
                    Catch::Contains("cpu:2") && Catch::Contains("2 cpu devices"));
  if (ts::cuda::device_count() < 8) {
    CHECK_THROWS_AS(ts::with_device(ts::Device::parse("cuda:7"), count), ts::device_error);
  }
  if (ts::cuda::is_available()) {
    // A device of a kind the call was not compiled for: named, with what to do.
    CHECK_THROWS_WITH(ts::with_device<ts::cpu>(ts::Device::parse("cuda:0"), count),
                      Catch::Contains("cuda:0") && Catch::Contains("with_device<"));
  }
  CHECK(calls == 0);
}

TEST_CASE("device kinds are distinct types", "[device]") {
  STATIC_REQUIRE(ts::DeviceKind<ts::cpu>);
  STATIC_REQUIRE(ts::DeviceKind<ts::cuda>);
  STATIC_REQUIRE_FALSE(ts::DeviceKind<int>);
  STATIC_REQUIRE(ts::cpu::type == ts::DeviceType::cpu);
  STATIC_REQUIRE(ts::cuda::type == ts::DeviceType::cuda);
}

TEST_CASE("TESSERA_CPU_DEVICES parsing", "[device]") {
  CHECK(ts::detail::parse_cpu_device_count(nullptr) == 1);
  CHECK(ts::detail::parse_cpu_device_count("") == 1);
  CHECK(ts::detail::parse_cpu_device_count("4") == 4);
  CHECK_THROWS_WITH(ts::detail::parse_cpu_device_count("0"), Catch::Contains("'0'"));
  CHECK_THROWS_AS(ts::detail::parse_cpu_device_count("two"), std::invalid_argument);
  CHECK_THROWS_AS(ts::detail::parse_cpu_device_count("-3"), std::invalid_argument);
  // The test harness runs with TESSERA_CPU_DEVICES=2.
  CHECK(ts::cpu::device_count() == 2);
}

TEST_CASE("check_device names a missing ordinal", "[device]") {
  CHECK_NOTHROW(ts::check_device(ts::Device::parse("cpu:1")));
  CHECK_THROWS_AS(ts::check_device(ts::Device::parse("cpu:2")), ts::device_error);
  CHECK_THROWS_WITH(ts::check_device(ts::Device::parse("cpu:5")),
                    Catch::Contains("cpu:5") && Catch::Contains("2 cpu devices"));
}

TEST_CASE("CUDA queries report no device instead of failing", "[device][cuda]") {
  // On this project's CI machines there is no GPU and no driver: the runtime answers
  // cudaErrorInsufficientDriver (or the build has no CUDA at all). Both mean "not available".
  const int count = ts::cuda::device_count();
  CHECK(count >= 0);
  CHECK(ts::cuda::is_available() == (count > 0));
  if (count == 0) {
    CHECK_THROWS_WITH(ts::cuda::set_device(0), Catch::Contains("cuda:0"));
    // As torch.cuda.current_device(): no device, no current device.
    CHECK_THROWS_WITH(ts::cuda::current_device(),
                      Catch::Contains("current_device") && Catch::Contains("no CUDA device"));
    CHECK_THROWS_AS(ts::cuda::device_name(0), ts::device_error);
    CHECK_NOTHROW(ts::cuda::synchronize());
  } else {
    CHECK_FALSE(ts::cuda::device_name(0).empty());
  }
}

}  // namespace device_test
