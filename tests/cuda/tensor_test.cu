// Tensors on CUDA devices (compiled by nvcc, so the strided kernels run): placement, copies
// between cpu and cuda and between CUDA ordinals, dtype conversion on the device, views, fills,
// random numbers equal to the CPU's, memory accounting with the same policy as on the CPU.
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <vector>

#include "tessera/tessera.hpp"

namespace cuda_tensor_test {  // one namespace per file: a unity build

namespace ts = tessera;

TEST_CASE("cuda tensors round-trip through the host", "[cuda][tensor]") {
  auto host = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto device = host.cuda();
  CHECK(device.is_cuda());
  CHECK(device.device() == ts::Device::parse("cuda:0"));
  CHECK(device.to_vector() == host.to_vector());
  CHECK(device.cpu().to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(device.cuda(0).shares_storage_with(device));
  // A transposed view crosses devices as its logical elements, in both directions.
  CHECK(host.t().cuda().to_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK(device.t().cpu().to_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});
}

TEST_CASE("kernels fill, convert and scatter on the device", "[cuda][tensor]") {
  auto z = ts::zeros<double, ts::cuda>({3, 4});
  z.narrow(1, 1, 2).fill_(2.5);
  CHECK(z.to_vector() == std::vector<double>{0, 2.5, 2.5, 0, 0, 2.5, 2.5, 0, 0, 2.5, 2.5, 0});
  auto h = z.to<ts::half>();
  CHECK(static_cast<float>(h.to_vector()[1]) == 2.5f);
  auto ints = ts::from_vector<float>({-1.5f, 0.0f, 7.9f}, {3}).cuda().to<int32_t>();
  CHECK(ints.to_vector() == std::vector<int32_t>{-1, 0, 7});
  auto flags = ts::from_vector<float>({-1.5f, 0.0f, 7.9f}, {3}).cuda().to<bool>();
  CHECK(flags.to_vector() == std::vector<bool>{true, false, true});
  auto dst = ts::zeros<float, ts::cuda>({2, 3});
  dst.copy_(ts::from_vector<int64_t>({1, 2, 3}, {3}));  // cpu int64 row broadcast into cuda float
  CHECK(dst.to_vector() == std::vector<float>{1, 2, 3, 1, 2, 3});
  CHECK(ts::cat({dst, dst}, 1).to_vector() ==
        std::vector<float>{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3});
  CHECK(dst.new_ones({2}).is_cuda());
}

TEST_CASE("cuda accounting uses the CPU's 512-byte policy", "[cuda][memory]") {
  const auto d = ts::Device::parse("cuda:0");
  const auto base = ts::memory::allocated(d);
  {
    auto a = ts::empty<float, ts::cuda>({1});
    CHECK(ts::memory::allocated(d) == base + 512);
    auto b = ts::empty<float, ts::cuda>({129});
    CHECK(ts::memory::allocated(d) == base + 512 + 1024);
    auto view = b.view({3, 43});
    CHECK(ts::memory::allocated(d) == base + 512 + 1024);
  }
  CHECK(ts::memory::allocated(d) == base);
}

TEST_CASE("rand gives the same numbers on cpu and cuda", "[cuda][random]") {
  ts::manual_seed(42);
  auto on_cpu = ts::rand<float>({1000});
  ts::manual_seed(42);
  auto on_cuda = ts::rand<float, ts::cuda>({1000});
  CHECK(on_cuda.to_vector() == on_cpu.to_vector());
}

TEST_CASE("copies between CUDA ordinals", "[cuda][placement]") {
  if (ts::cuda::device_count() < 2) {
    WARN("only one CUDA device: peer copies not exercised");
    return;
  }
  auto a = ts::arange<float, ts::cuda>(0, 8, 1, 0);
  auto b = a.to(1);
  CHECK(b.device_index() == 1);
  CHECK(b.to_vector() == a.to_vector());
  CHECK_THROWS_AS(ts::cat({a, b}, 0), ts::device_mismatch_error);
}

}  // namespace cuda_tensor_test
