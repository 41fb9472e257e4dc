// ts::to_dlpack / ts::from_dlpack against DLPack structures written by hand: the fields of an
// exported tensor against the layout worked out here, imports of hand-built DLManagedTensors over
// buffers this file owns (values, strides, byte_offset, the deleter counted), and every refused
// input (a message naming the values; the deleter not called; nothing counted in the pools).
// Round trips with LibTorch are in dlpack_torch_test.cpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/io/dlpack.hpp"
#include "tessera/tensor/factories.hpp"

namespace dlpack_test {

namespace ts = tessera;
using Catch::Matchers::Contains;

const ts::Device cpu0{ts::DeviceType::cpu, 0};
const ts::Device cpu1{ts::DeviceType::cpu, 1};

/// A DLManagedTensor over a caller's buffer whose deleter counts its calls.
struct counted_tensor {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  int deletes = 0;

  counted_tensor(void* data, DLDataType dtype, std::vector<std::int64_t> shape_,
                 std::vector<std::int64_t> strides_ = {}, std::uint64_t byte_offset = 0,
                 DLDevice device = {kDLCPU, 0})
      : shape(std::move(shape_)), strides(std::move(strides_)) {
    managed.dl_tensor.data = data;
    managed.dl_tensor.device = device;
    managed.dl_tensor.ndim = static_cast<int>(shape.size());
    managed.dl_tensor.dtype = dtype;
    managed.dl_tensor.shape = shape.data();
    managed.dl_tensor.strides = strides.empty() ? nullptr : strides.data();
    managed.dl_tensor.byte_offset = byte_offset;
    managed.manager_ctx = this;
    managed.deleter = [](DLManagedTensor* self) {
      ++static_cast<counted_tensor*>(self->manager_ctx)->deletes;
    };
  }
  counted_tensor(const counted_tensor&) = delete;
  counted_tensor& operator=(const counted_tensor&) = delete;
};

constexpr DLDataType float32{kDLFloat, 32, 1};

template <class T>
std::vector<T> values_of(const ts::Tensor<T>& t) {
  return t.to_vector();
}

// ---- to_dlpack ------------------------------------------------------------------------------

TEST_CASE("to_dlpack describes a contiguous tensor and shares its bytes", "[dlpack]") {
  auto t = ts::arange<float>(0, 6).view({2, 3});
  DLManagedTensor* managed = ts::to_dlpack(t);
  const DLTensor& dl = managed->dl_tensor;
  CHECK(dl.data == static_cast<void*>(t.data()));
  CHECK(dl.device.device_type == kDLCPU);
  CHECK(dl.device.device_id == 0);
  CHECK(dl.ndim == 2);
  CHECK(dl.dtype.code == kDLFloat);
  CHECK(dl.dtype.bits == 32);
  CHECK(dl.dtype.lanes == 1);
  CHECK(std::vector<std::int64_t>(dl.shape, dl.shape + 2) == std::vector<std::int64_t>{2, 3});
  REQUIRE(dl.strides != nullptr);
  CHECK(std::vector<std::int64_t>(dl.strides, dl.strides + 2) == std::vector<std::int64_t>{3, 1});
  CHECK(dl.byte_offset == 0);
  // Row 1, column 2 = 5; a write through the DLPack pointer is read by the tensor.
  CHECK(static_cast<float*>(dl.data)[1 * 3 + 2] == 5.0f);
  static_cast<float*>(dl.data)[0] = -7.0f;
  CHECK(t.to_vector() == std::vector<float>{-7, 1, 2, 3, 4, 5});
  managed->deleter(managed);
}

TEST_CASE("to_dlpack folds a view's offset into the data pointer and keeps its strides",
          "[dlpack]") {
  auto base = ts::arange<float>(0, 12).view({3, 4});
  // base.t() is [4, 3] with strides [1, 4]; rows 1..2 of it start at element 1.
  auto view = base.transpose(0, 1).narrow(0, 1, 2);
  DLManagedTensor* managed = ts::to_dlpack(view);
  const DLTensor& dl = managed->dl_tensor;
  CHECK(dl.data == static_cast<void*>(static_cast<float*>(base.data()) + 1));
  CHECK(dl.byte_offset == 0);
  CHECK(std::vector<std::int64_t>(dl.shape, dl.shape + 2) == std::vector<std::int64_t>{2, 3});
  CHECK(std::vector<std::int64_t>(dl.strides, dl.strides + 2) == std::vector<std::int64_t>{1, 4});
  // Element (i, j) of the view is base[j][1 + i] = 4 j + 1 + i.
  const auto* data = static_cast<const float*>(dl.data);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) CHECK(data[i * 1 + j * 4] == static_cast<float>(4 * j + 1 + i));
  }
  managed->deleter(managed);
}

TEST_CASE("to_dlpack keeps the storage alive until the deleter runs", "[dlpack]") {
  const auto base = ts::memory::allocated(cpu0);
  DLManagedTensor* managed = nullptr;
  {
    auto t = ts::arange<float>(0, 1000);  // 4000 B -> 4096 from the pool
    managed = ts::to_dlpack(t.narrow(0, 10, 5));
    CHECK(t.storage().use_count() == 2);
  }
  CHECK(ts::memory::allocated(cpu0) - base == 4096);
  const auto* data = static_cast<const float*>(managed->dl_tensor.data);
  CHECK(std::vector<float>(data, data + 5) == std::vector<float>{10, 11, 12, 13, 14});
  managed->deleter(managed);
  CHECK(ts::memory::allocated(cpu0) == base);
}

TEST_CASE("to_dlpack writes the DLPack type of every dtype", "[dlpack]") {
  auto check = [](auto tensor, std::uint8_t code, std::uint8_t bits) {
    DLManagedTensor* managed = ts::to_dlpack(tensor);
    CHECK(managed->dl_tensor.dtype.code == code);
    CHECK(managed->dl_tensor.dtype.bits == bits);
    CHECK(managed->dl_tensor.dtype.lanes == 1);
    managed->deleter(managed);
  };
  check(ts::zeros<float>({2}), kDLFloat, 32);
  check(ts::zeros<double>({2}), kDLFloat, 64);
  check(ts::zeros<ts::half>({2}), kDLFloat, 16);
  check(ts::zeros<ts::bfloat16>({2}), kDLBfloat, 16);
  check(ts::zeros<std::int8_t>({2}), kDLInt, 8);
  check(ts::zeros<std::int16_t>({2}), kDLInt, 16);
  check(ts::zeros<std::int32_t>({2}), kDLInt, 32);
  check(ts::zeros<std::int64_t>({2}), kDLInt, 64);
  check(ts::zeros<std::uint8_t>({2}), kDLUInt, 8);
  // kDLBool (6) is DLPack 0.8's; with an older header bool is kDLUInt 8, the bytes 0 and 1.
  check(ts::zeros<bool>({2}), ts::detail::dlpack::header_has_bool ? 6 : kDLUInt, 8);
}

TEST_CASE("to_dlpack of a virtual CPU device's tensor is host memory, device_id 0", "[dlpack]") {
  auto t = ts::arange<std::int32_t, ts::cpu>(0, 4, 1, 1);
  REQUIRE(t.device() == cpu1);
  DLManagedTensor* managed = ts::to_dlpack(t);
  CHECK(managed->dl_tensor.device.device_type == kDLCPU);
  CHECK(managed->dl_tensor.device.device_id == 0);
  managed->deleter(managed);
}

TEST_CASE("to_dlpack of a 0-dim tensor, and of an undefined one", "[dlpack][errors]") {
  auto scalar = ts::full<double>({}, 2.5);
  DLManagedTensor* managed = ts::to_dlpack(scalar);
  CHECK(managed->dl_tensor.ndim == 0);
  CHECK(*static_cast<const double*>(managed->dl_tensor.data) == 2.5);
  managed->deleter(managed);

  CHECK_THROWS_AS(ts::to_dlpack(ts::Tensor<float>()), ts::error);
  CHECK_THROWS_WITH(ts::to_dlpack(ts::Tensor<float>()),
                    Contains("to_dlpack") && Contains("undefined"));
}

// ---- from_dlpack ----------------------------------------------------------------------------

TEST_CASE(
    "from_dlpack views the producer's bytes and calls its deleter once, after the last "
    "handle",
    "[dlpack]") {
  std::vector<float> buffer = {0, 1, 2, 3, 4, 5};
  counted_tensor producer(buffer.data(), float32, {2, 3});
  const auto stats_before = ts::memory::stats(cpu0);
  {
    ts::Tensor<float> t = ts::from_dlpack<float>(&producer.managed);
    CHECK(t.data() == buffer.data());
    CHECK(t.shape() == ts::Shape{2, 3});
    CHECK(t.strides() == ts::Strides{3, 1});  // strides NULL: compact row-major
    CHECK(t.device() == cpu0);
    CHECK(t.storage().is_external());
    CHECK(t.to_vector() == buffer);
    // Writes go to the producer's buffer, and the producer's writes are read.
    t.narrow(1, 1, 1).fill_(9.0f);
    CHECK(buffer == std::vector<float>{0, 9, 2, 3, 9, 5});
    buffer[5] = -1.0f;
    CHECK(t.to_vector() == std::vector<float>{0, 9, 2, 3, 9, -1});

    auto view = t.transpose(0, 1);
    ts::Tensor<float> copy = t;
    t = ts::Tensor<float>();
    CHECK(producer.deletes == 0);
    copy = ts::Tensor<float>();
    CHECK(producer.deletes == 0);  // the view still holds the storage
    CHECK(view.to_vector() == std::vector<float>{0, 3, 9, 9, 2, -1});
  }
  CHECK(producer.deletes == 1);
  // The producer's bytes were never the pool's.
  const auto stats_after = ts::memory::stats(cpu0);
  CHECK(stats_after.allocations.allocated == stats_before.allocations.allocated);
  CHECK(stats_after.allocated_bytes.current == stats_before.allocated_bytes.current);
}

TEST_CASE("from_dlpack keeps strides and byte_offset", "[dlpack]") {
  // A 3 x 4 row-major int64 matrix; the producer lends its columns 1..2 transposed: shape
  // [2, 3], strides [1, 4], starting at element 1 (byte_offset 8).
  std::vector<std::int64_t> buffer(12);
  for (int i = 0; i < 12; ++i) buffer[static_cast<std::size_t>(i)] = 10 * i;
  counted_tensor producer(buffer.data(), DLDataType{kDLInt, 64, 1}, {2, 3}, {1, 4}, 8);
  {
    auto t = ts::from_dlpack<std::int64_t>(&producer.managed);
    CHECK(t.data() == buffer.data() + 1);
    CHECK(t.strides() == ts::Strides{1, 4});
    CHECK_FALSE(t.is_contiguous());
    // Element (i, j) is buffer[1 + i + 4 j].
    CHECK(t.to_vector() == std::vector<std::int64_t>{10, 50, 90, 20, 60, 100});
  }
  CHECK(producer.deletes == 1);

  // Stride 0 (a broadcast row, as PyTorch's expand exports it): every row reads the same bytes.
  counted_tensor expanded(buffer.data(), DLDataType{kDLInt, 64, 1}, {3, 2}, {0, 1});
  {
    auto t = ts::from_dlpack<std::int64_t>(&expanded.managed);
    CHECK(t.to_vector() == std::vector<std::int64_t>{0, 10, 0, 10, 0, 10});
  }
  CHECK(expanded.deletes == 1);
}

TEST_CASE("from_dlpack puts a CPU tensor on the current or the named virtual CPU device",
          "[dlpack]") {
  std::vector<double> buffer = {1.5, 2.5};
  counted_tensor named(buffer.data(), DLDataType{kDLFloat, 64, 1}, {2});
  {
    auto t = ts::from_dlpack<double>(&named.managed, 1);
    CHECK(t.device() == cpu1);
    CHECK(t.to_vector() == buffer);
  }
  CHECK(named.deletes == 1);

  counted_tensor current(buffer.data(), DLDataType{kDLFloat, 64, 1}, {2});
  {
    ts::DeviceGuard<ts::cpu> guard(1);
    auto t = ts::from_dlpack<double, ts::cpu>(&current.managed);
    CHECK(t.device() == cpu1);
  }
  CHECK(current.deletes == 1);

  // kDLCUDAHost (pinned host memory) is host memory too; a CPU device_id other than 0 is ignored.
  counted_tensor pinned(buffer.data(), DLDataType{kDLFloat, 64, 1}, {2}, {}, 0,
                        DLDevice{kDLCUDAHost, 3});
  {
    auto t = ts::from_dlpack<double>(&pinned.managed);
    CHECK(t.device() == cpu0);
    CHECK(t.to_vector() == buffer);
  }
  CHECK(pinned.deletes == 1);
}

TEST_CASE("from_dlpack takes every dtype's DLPack type, and bool from kDLUInt 8 or kDLBool",
          "[dlpack]") {
  alignas(8) unsigned char bytes[16] = {};
  auto accepts = [&](auto zero, DLDataType dtype) {
    using T = decltype(zero);
    counted_tensor producer(bytes, dtype, {1});
    { auto t = ts::from_dlpack<T>(&producer.managed); }
    return producer.deletes == 1;
  };
  CHECK(accepts(float{}, {kDLFloat, 32, 1}));
  CHECK(accepts(double{}, {kDLFloat, 64, 1}));
  CHECK(accepts(ts::half{}, {kDLFloat, 16, 1}));
  CHECK(accepts(ts::bfloat16{}, {kDLBfloat, 16, 1}));
  CHECK(accepts(std::int8_t{}, {kDLInt, 8, 1}));
  CHECK(accepts(std::int16_t{}, {kDLInt, 16, 1}));
  CHECK(accepts(std::int32_t{}, {kDLInt, 32, 1}));
  CHECK(accepts(std::int64_t{}, {kDLInt, 64, 1}));
  CHECK(accepts(std::uint8_t{}, {kDLUInt, 8, 1}));
  CHECK(accepts(bool{}, {kDLUInt, 8, 1}));
  CHECK(accepts(bool{}, {6, 8, 1}));  // kDLBool

  // The bytes 1 0 1 read as bool.
  unsigned char flags[3] = {1, 0, 1};
  counted_tensor producer(flags, DLDataType{kDLUInt, 8, 1}, {3});
  auto t = ts::from_dlpack<bool>(&producer.managed);
  const std::vector<bool> expected = {true, false, true};
  CHECK(t.to_vector() == expected);
}

TEST_CASE("from_dlpack of a tensor without elements, and a producer without a deleter",
          "[dlpack]") {
  counted_tensor empty(nullptr, float32, {0, 3});
  {
    auto t = ts::from_dlpack<float>(&empty.managed);
    CHECK(t.numel() == 0);
    CHECK(t.shape() == ts::Shape{0, 3});
  }
  CHECK(empty.deletes == 1);

  float value = 4.0f;
  counted_tensor no_deleter(&value, float32, {});
  no_deleter.managed.deleter = nullptr;  // allowed by DLPack: nothing to call
  auto t = ts::from_dlpack<float>(&no_deleter.managed);
  CHECK(t.item() == 4.0f);
}

TEST_CASE("record_stream on a view of a producer's memory records nothing", "[dlpack]") {
  std::vector<float> buffer = {1, 2};
  counted_tensor producer(buffer.data(), float32, {2});
  {
    auto t = ts::from_dlpack<float>(&producer.managed);
    CHECK_NOTHROW(t.record_stream(ts::current_stream(t.device())));
  }
  CHECK(producer.deletes == 1);
}

TEST_CASE("a Tessera tensor goes out and back in: one storage, released at the end", "[dlpack]") {
  const auto base = ts::memory::allocated(cpu0);
  ts::Tensor<std::int32_t> back;
  {
    auto t = ts::arange<std::int32_t>(0, 6).view({2, 3}).transpose(0, 1);
    back = ts::from_dlpack<std::int32_t>(ts::to_dlpack(t));
    CHECK(back.data() == t.data());
    CHECK(back.strides() == ts::Strides{1, 3});
  }
  CHECK(back.to_vector() == std::vector<std::int32_t>{0, 3, 1, 4, 2, 5});
  CHECK(ts::memory::allocated(cpu0) - base == 512);  // still held, through the DLPack holder
  back = ts::Tensor<std::int32_t>();
  CHECK(ts::memory::allocated(cpu0) == base);
}

// ---- refused inputs: a message naming the values, the deleter not called --------------------

// Runs from_dlpack<T, Kind> on `producer`, which must be refused with exception E and a message
// containing each of `parts`; then checks that nothing took the producer's memory (the caller
// still owns it: its deleter has not run, and runs once when the caller calls it).
template <class T, class Kind = ts::cpu, class E>
void check_refused(counted_tensor& producer, const std::vector<std::string>& parts, E*,
                   int cpu_device = -1) {
  const auto before = ts::memory::stats(cpu0);
  std::string message;
  try {
    if constexpr (std::is_same_v<Kind, ts::cpu>) {
      if (cpu_device >= 0) {
        (void)ts::from_dlpack<T>(&producer.managed, cpu_device);
      } else {
        (void)ts::from_dlpack<T, Kind>(&producer.managed);
      }
    } else {
      (void)ts::from_dlpack<T, Kind>(&producer.managed);
    }
    FAIL("from_dlpack accepted it");
  } catch (const E& e) {
    message = e.what();
  }
  INFO(message);
  for (const auto& part : parts) CHECK_THAT(message, Contains(part));
  CHECK(producer.deletes == 0);
  const auto after = ts::memory::stats(cpu0);
  CHECK(after.allocations.allocated == before.allocations.allocated);
  producer.managed.deleter(&producer.managed);  // the caller's to release
  CHECK(producer.deletes == 1);
}

template <class E>
constexpr E* as = nullptr;

TEST_CASE("from_dlpack refuses a dtype that is not T's, naming both", "[dlpack][errors]") {
  alignas(8) unsigned char bytes[64] = {};
  {
    counted_tensor p(bytes, DLDataType{kDLFloat, 64, 1}, {2});
    check_refused<float>(
        p, {"from_dlpack<float32, cpu>", "kDLFloat (code 2), 64 bits", "not float32", "32 bits"},
        as<ts::dtype_error>);
  }
  {
    counted_tensor p(bytes, DLDataType{kDLFloat, 16, 1}, {2});
    check_refused<ts::bfloat16>(p, {"kDLFloat (code 2), 16 bits", "kDLBfloat (code 4)"},
                                as<ts::dtype_error>);
  }
  {
    counted_tensor p(bytes, DLDataType{kDLInt, 8, 1}, {2});
    check_refused<std::uint8_t>(p, {"kDLInt (code 0), 8 bits", "not uint8", "kDLUInt (code 1)"},
                                as<ts::dtype_error>);
  }
  {
    counted_tensor p(bytes, DLDataType{6, 8, 1}, {2});  // kDLBool is not uint8
    check_refused<std::uint8_t>(p, {"kDLBool (code 6)"}, as<ts::dtype_error>);
  }
  {
    counted_tensor p(bytes, DLDataType{kDLComplex, 64, 1}, {2});
    check_refused<double>(p, {"kDLComplex (code 5), 64 bits", "not float64"}, as<ts::dtype_error>);
  }
  {
    counted_tensor p(bytes, DLDataType{kDLFloat, 32, 4}, {2});
    check_refused<float>(p, {"4 lanes", "lanes 1"}, as<ts::dtype_error>);
  }
}

TEST_CASE("from_dlpack refuses a device that is not Kind's, or that does not exist",
          "[dlpack][errors]") {
  alignas(8) unsigned char bytes[64] = {};
  {
    counted_tensor p(bytes, float32, {2}, {}, 0, DLDevice{kDLCUDA, 1});
    check_refused<float>(p, {"kDLCUDA (2), device_id 1", "from_dlpack<T, ts::cuda>"},
                         as<ts::device_error>);
  }
  {
    counted_tensor p(bytes, float32, {2}, {}, 0, DLDevice{kDLOpenCL, 0});
    check_refused<float>(p, {"kDLOpenCL (4), device_id 0", "kDLCPU or kDLCUDAHost"},
                         as<ts::device_error>);
  }
  {
    counted_tensor p(bytes, float32, {2});
    check_refused<float, ts::cuda>(
        p, {"from_dlpack<float32, cuda>", "kDLCPU (1), device_id 0", "from_dlpack<T, ts::cpu>"},
        as<ts::device_error>);
  }
  {
    // Tests run with two virtual CPU devices.
    counted_tensor p(bytes, float32, {2});
    check_refused<float>(p, {"device cpu:5 does not exist", "2 cpu devices"}, as<ts::device_error>,
                         5);
  }
  if (!ts::cuda::is_available()) {
    counted_tensor p(bytes, float32, {2}, {}, 0, DLDevice{kDLCUDA, 0});
    check_refused<float, ts::cuda>(p, {"device cuda:0 does not exist", "0 cuda devices"},
                                   as<ts::device_error>);
  }
}

TEST_CASE("from_dlpack refuses offsets, alignments, strides and shapes it cannot view",
          "[dlpack][errors]") {
  alignas(8) unsigned char bytes[64] = {};
  {
    counted_tensor p(bytes, float32, {2}, {}, 6);
    check_refused<float>(p, {"byte_offset 6", "element size (4 bytes)"}, as<ts::error>);
  }
  {
    counted_tensor p(bytes + 2, float32, {2});
    check_refused<float>(p, {"is not aligned to 4 bytes"}, as<ts::error>);
  }
  {
    counted_tensor p(bytes, float32, {2, 3}, {-1, 1});
    check_refused<float>(p, {"stride -1 of dimension 0", "shape [2, 3]", "strides [-1, 1]"},
                         as<ts::shape_error>);
  }
  {
    counted_tensor p(bytes, float32, {2, -3});
    check_refused<float>(p, {"negative extent -3"}, as<ts::shape_error>);
  }
  {
    counted_tensor p(bytes, float32, {1, 1, 1, 1, 1, 1, 1, 1, 1});
    check_refused<float>(p, {"9 dimensions", "0 to 8"}, as<ts::shape_error>);
  }
  {
    counted_tensor p(bytes, float32, {2, 2}, {std::int64_t{1} << 62, 1});
    check_refused<float>(p, {"strides [4611686018427387904, 1]", "past 2^63 bytes"},
                         as<ts::shape_error>);
  }
  {
    counted_tensor p(bytes, float32, {2, 3});
    p.managed.dl_tensor.shape = nullptr;
    check_refused<float>(p, {"2 dimensions and a null shape pointer"}, as<ts::error>);
  }
  {
    counted_tensor p(nullptr, float32, {2, 3});
    check_refused<float>(p, {"data pointer is null", "[2, 3]", "6 elements"}, as<ts::error>);
  }
}

TEST_CASE("from_dlpack refuses a null DLManagedTensor", "[dlpack][errors]") {
  CHECK_THROWS_AS(ts::from_dlpack<float>(nullptr), ts::error);
  CHECK_THROWS_WITH(ts::from_dlpack<float>(nullptr),
                    Contains("from_dlpack<float32, cpu>") && Contains("pointer is null"));
}

}  // namespace dlpack_test
