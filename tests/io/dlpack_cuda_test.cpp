// ts::to_dlpack / ts::from_dlpack with CUDA memory, compiled by g++ (the exchange launches no
// kernel; reads go through the runtime API). Its executable's main reports it skipped (exit 77)
// without a CUDA device. References: values written here and read back with cudaMemcpy, and a
// DLManagedTensor over cudaMalloc'd memory whose deleter counts its calls and frees it.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "tessera/io/dlpack.hpp"
#include "tessera/tensor/factories.hpp"

namespace dlpack_cuda_test {

namespace ts = tessera;

#if TESSERA_CUDA

/// Reads `count` floats at `device_pointer` with cudaMemcpy (not through Tessera).
std::vector<float> read_device(const void* device_pointer, std::size_t count) {
  std::vector<float> host(count);
  REQUIRE(cudaMemcpy(host.data(), device_pointer, count * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  return host;
}

TEST_CASE("to_dlpack of a CUDA tensor: kDLCUDA with its ordinal, its bytes shared",
          "[dlpack][cuda]") {
  const int last = ts::cuda::device_count() - 1;
  auto t = ts::from_vector<float, ts::cuda>({0, 1, 2, 3, 4, 5}, {2, 3}, last);
  auto view = t.transpose(0, 1).narrow(0, 1, 2);  // [2, 2], strides [1, 3], from element 1
  DLManagedTensor* managed = ts::to_dlpack(view);
  const DLTensor& dl = managed->dl_tensor;
  CHECK(dl.device.device_type == kDLCUDA);
  CHECK(dl.device.device_id == last);
  CHECK(dl.data == static_cast<void*>(static_cast<float*>(t.data()) + 1));
  CHECK(std::vector<std::int64_t>(dl.strides, dl.strides + 2) == std::vector<std::int64_t>{1, 3});
  // Elements (i, j) at data + i + 3 j: 1, 4 / 2, 5.
  const std::vector<float> bytes = read_device(dl.data, 5);
  CHECK(bytes == std::vector<float>{1, 2, 3, 4, 5});

  // Back into Tessera: the same device and bytes.
  auto back = ts::from_dlpack<float, ts::cuda>(managed);
  CHECK(back.device() == ts::Device(ts::DeviceType::cuda, last));
  CHECK(back.data() == view.data());
  CHECK(back.to_vector() == std::vector<float>{1, 4, 2, 5});
}

TEST_CASE("from_dlpack views a producer's CUDA memory and calls its deleter once",
          "[dlpack][cuda]") {
  struct producer {
    DLManagedTensor managed{};
    std::int64_t shape[2] = {3, 2};
    std::int64_t strides[2] = {1, 3};  // a transposed 2 x 3 matrix
    int deletes = 0;
  } p;
  void* allocation = nullptr;
  REQUIRE(cudaMalloc(&allocation, 8 * sizeof(float)) == cudaSuccess);
  auto* memory = static_cast<float*>(allocation);
  const std::vector<float> host = {-1, 10, 11, 12, 13, 14, 15, -1};
  REQUIRE(cudaMemcpy(memory, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  p.managed.dl_tensor.data = memory;
  p.managed.dl_tensor.device = DLDevice{kDLCUDA, 0};
  p.managed.dl_tensor.ndim = 2;
  p.managed.dl_tensor.dtype = DLDataType{kDLFloat, 32, 1};
  p.managed.dl_tensor.shape = p.shape;
  p.managed.dl_tensor.strides = p.strides;
  p.managed.dl_tensor.byte_offset = sizeof(float);  // the matrix starts at element 1
  p.managed.manager_ctx = &p;
  p.managed.deleter = [](DLManagedTensor* self) {
    auto* owner = static_cast<producer*>(self->manager_ctx);
    ++owner->deletes;
    (void)cudaFree(self->dl_tensor.data);
  };
  const auto before = ts::memory::allocated(ts::Device(ts::DeviceType::cuda, 0));
  {
    auto t = ts::from_dlpack<float, ts::cuda>(&p.managed);
    CHECK(t.device() == ts::Device(ts::DeviceType::cuda, 0));
    CHECK(t.data() == memory + 1);
    // Element (i, j) is memory[1 + i + 3 j]: 10 13 / 11 14 / 12 15.
    CHECK(t.to_vector() == std::vector<float>{10, 13, 11, 14, 12, 15});
    auto copy = t.cpu();
    auto row = t.narrow(0, 2, 1);
    t = ts::Tensor<float, ts::cuda>();
    CHECK(p.deletes == 0);
    CHECK(row.to_vector() == std::vector<float>{12, 15});
    CHECK(copy.to_vector() == std::vector<float>{10, 13, 11, 14, 12, 15});
  }
  CHECK(p.deletes == 1);
  CHECK(ts::memory::allocated(ts::Device(ts::DeviceType::cuda, 0)) == before);
}

TEST_CASE(
    "from_dlpack refuses CUDA memory for a CPU tensor, and a CUDA ordinal that does not "
    "exist",
    "[dlpack][cuda][errors]") {
  auto t = ts::zeros<float, ts::cuda>({2});
  DLManagedTensor* managed = ts::to_dlpack(t);
  CHECK_THROWS_AS(ts::from_dlpack<float>(managed), ts::device_error);
  const int count = ts::cuda::device_count();
  managed->dl_tensor.device.device_id = count;
  CHECK_THROWS_WITH((ts::from_dlpack<float, ts::cuda>(managed)),
                    Catch::Matchers::Contains("cuda:" + std::to_string(count) + " does not exist"));
  managed->deleter(managed);  // refused: still the caller's
}

#endif  // TESSERA_CUDA

}  // namespace dlpack_cuda_test
