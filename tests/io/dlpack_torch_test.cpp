// ts::to_dlpack / ts::from_dlpack round trips with LibTorch (at::toDLPack, at::fromDLPack): the
// bytes are shared, not copied (data pointers compared, writes through one side read through the
// other), views keep their strides and offsets, every dtype both libraries have crosses over, and
// each side's storage lives exactly as long as the other side holds it. References are LibTorch's
// own tensors (their values, strides, data pointers and use counts) and numbers written here.
// LibTorch first: Debian's LibTorch brings glog, whose CHECK macro Catch's replaces.
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#undef CHECK

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "tessera/io/dlpack.hpp"
#include "tessera/tensor/factories.hpp"

namespace dlpack_torch_test {

namespace ts = tessera;

const ts::Device cpu0{ts::DeviceType::cpu, 0};

/// Torch's values as doubles, in row-major order of its shape (whatever its strides).
std::vector<double> torch_values(const at::Tensor& a) {
  at::Tensor d = a.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

template <class T, class K>
std::vector<double> tessera_values(const ts::Tensor<T, K>& t) {
  std::vector<double> out;
  for (T v : t.to_vector()) out.push_back(static_cast<double>(v));
  return out;
}

std::vector<std::int64_t> to_vector(at::IntArrayRef values) {
  return std::vector<std::int64_t>(values.begin(), values.end());
}
std::vector<std::int64_t> to_vector(const ts::Shape& values) {
  return std::vector<std::int64_t>(values.begin(), values.end());
}

TEST_CASE("a LibTorch tensor viewed by Tessera shares its bytes both ways", "[dlpack][torch]") {
  at::Tensor a = at::arange(12, at::kFloat).reshape({3, 4});
  auto t = ts::from_dlpack<float>(at::toDLPack(a));
  CHECK(static_cast<void*>(t.data()) == a.data_ptr());
  CHECK(to_vector(t.shape()) == to_vector(a.sizes()));
  CHECK(to_vector(t.strides()) == to_vector(a.strides()));
  CHECK(tessera_values(t) == torch_values(a));
  t.narrow(0, 1, 1).fill_(-1.0f);                                    // Tessera writes row 1 ...
  CHECK(torch_values(a[1]) == std::vector<double>{-1, -1, -1, -1});  // ... LibTorch reads it
  a[2][3] = 42.0;                                                    // LibTorch writes ...
  CHECK(t.narrow(0, 2, 1).to_vector() == std::vector<float>{8, 9, 10, 42});  // ... Tessera reads
}

TEST_CASE("LibTorch views keep their strides and offsets in Tessera", "[dlpack][torch]") {
  at::Tensor a = at::arange(24, at::kDouble).reshape({4, 6});
  const std::vector<at::Tensor> views = {
      a.t(),                                // transposed: strides [1, 6]
      a.slice(0, 1, 3),                     // rows 1..2: storage offset 6
      a.slice(1, 1, 6, 2),                  // every second column from 1: strides [6, 2], offset 1
      a.slice(0, 1, 4).t().slice(0, 2, 5),  // both
      a[2].expand({3, 6}),                  // a broadcast row: stride 0
  };
  for (const at::Tensor& view : views) {
    INFO("sizes " << view.sizes() << ", strides " << view.strides() << ", offset "
                  << view.storage_offset());
    auto t = ts::from_dlpack<double>(at::toDLPack(view));
    CHECK(static_cast<void*>(t.data()) == view.data_ptr());
    CHECK(to_vector(t.shape()) == to_vector(view.sizes()));
    CHECK(to_vector(t.strides()) == to_vector(view.strides()));
    CHECK(tessera_values(t) == torch_values(view));
  }
}

TEST_CASE("Tessera views keep their strides and offsets in LibTorch", "[dlpack][torch]") {
  auto base = ts::arange<float>(0, 24).view({4, 6});
  struct expected_view {
    ts::Tensor<float> view;
    std::vector<std::int64_t> strides;
    std::vector<double> values;
  };
  const std::vector<expected_view> cases = {
      {base.transpose(0, 1).narrow(0, 4, 2), {1, 6}, {4, 10, 16, 22, 5, 11, 17, 23}},
      {base.narrow(0, 2, 2).narrow(1, 3, 2), {6, 1}, {15, 16, 21, 22}},
      {base.select(1, 5), {6}, {5, 11, 17, 23}},
      {base.narrow(0, 3, 1).expand({2, 6}),
       {0, 1},
       {18, 19, 20, 21, 22, 23, 18, 19, 20, 21, 22, 23}},
  };
  for (const auto& c : cases) {
    INFO("shape " << c.view.shape() << ", strides " << c.view.strides());
    at::Tensor a = at::fromDLPack(ts::to_dlpack(c.view));
    CHECK(a.scalar_type() == at::kFloat);
    CHECK(a.data_ptr() == static_cast<void*>(c.view.data()));
    CHECK(to_vector(a.sizes()) == to_vector(c.view.shape()));
    CHECK(to_vector(a.strides()) == c.strides);
    CHECK(torch_values(a) == c.values);
  }
  // LibTorch writes into Tessera's storage.
  at::Tensor whole = at::fromDLPack(ts::to_dlpack(base));
  whole.select(0, 0).fill_(-3.0);
  CHECK(base.narrow(0, 0, 1).to_vector() == std::vector<float>(6, -3.0f));
}

TEST_CASE("every dtype both libraries have crosses over with its values", "[dlpack][torch]") {
  const std::vector<double> floats = {-2.5, 0, 1, 3.75, 96};
  const std::vector<double> ints = {-100, -1, 0, 7, 100};
  const std::vector<double> bytes = {0, 1, 7, 200, 255};
  auto check = [](auto zero, at::ScalarType torch_type, const std::vector<double>& values) {
    using T = decltype(zero);
    INFO("dtype " << ts::dtype_name<T>());
    // LibTorch -> Tessera: Tessera reads LibTorch's values.
    at::Tensor a = at::tensor(values, at::kDouble).to(torch_type);
    auto t = ts::from_dlpack<T>(at::toDLPack(a));
    CHECK(static_cast<void*>(t.data()) == a.data_ptr());
    CHECK(tessera_values(t) == torch_values(a));
    CHECK(tessera_values(t) == values);
    // Tessera -> LibTorch: LibTorch gets the dtype and the values.
    std::vector<T> typed;
    for (double v : values) typed.push_back(static_cast<T>(v));
    auto source = ts::from_vector<T>(typed, {static_cast<std::int64_t>(values.size())});
    at::Tensor b = at::fromDLPack(ts::to_dlpack(source));
    CHECK(b.scalar_type() == torch_type);
    CHECK(b.data_ptr() == static_cast<void*>(source.data()));
    CHECK(torch_values(b) == values);
  };
  check(float{}, at::kFloat, floats);
  check(double{}, at::kDouble, floats);
  check(ts::half{}, at::kHalf, floats);
  check(ts::bfloat16{}, at::kBFloat16, floats);
  check(std::int8_t{}, at::kChar, ints);
  check(std::int16_t{}, at::kShort, ints);
  check(std::int32_t{}, at::kInt, ints);
  check(std::int64_t{}, at::kLong, ints);
  check(std::uint8_t{}, at::kByte, bytes);
}

TEST_CASE("bool crosses over as LibTorch 1.13 can take it", "[dlpack][torch]") {
  // LibTorch 1.13 has no bool in DLPack (its toDLPack refuses a bool tensor). Tessera's bool goes
  // out as kDLUInt 8 (kDLBool with a DLPack 0.8+ header), which LibTorch reads as uint8 0 / 1;
  // and a LibTorch uint8 tensor of 0 / 1 comes in as bool.
  auto flags = ts::from_vector<bool>({true, false, true}, {3});
  at::Tensor a = at::fromDLPack(ts::to_dlpack(flags));
  CHECK(a.scalar_type() == (ts::detail::dlpack::header_has_bool ? at::kBool : at::kByte));
  CHECK(torch_values(a) == std::vector<double>{1, 0, 1});

  at::Tensor bytes = at::tensor(std::vector<std::int64_t>{0, 1, 1, 0}, at::kLong).to(at::kByte);
  auto t = ts::from_dlpack<bool>(at::toDLPack(bytes));
  const std::vector<bool> expected = {false, true, true, false};
  CHECK(t.to_vector() == expected);
}

TEST_CASE("LibTorch's tensor lives while Tessera holds it, and no longer", "[dlpack][torch]") {
  at::Tensor a = at::arange(6, at::kFloat);
  const auto uses = a.use_count();
  ts::Tensor<float> view;
  {
    auto t = ts::from_dlpack<float>(at::toDLPack(a));
    CHECK(a.use_count() == uses + 1);  // LibTorch's DLPack holder keeps a handle
    view = t.narrow(0, 2, 3);
  }
  CHECK(a.use_count() == uses + 1);
  a = at::Tensor();  // LibTorch lets go of its own handle: the bytes stay, held by the holder
  CHECK(view.to_vector() == std::vector<float>{2, 3, 4});
  at::Tensor again = at::fromDLPack(ts::to_dlpack(view));  // and they can go back to LibTorch
  CHECK(torch_values(again) == std::vector<double>{2, 3, 4});
  view = ts::Tensor<float>();
  CHECK(torch_values(again) == std::vector<double>{2, 3, 4});
}

TEST_CASE("LibTorch holds Tessera's storage until it lets go, and hands it back in place",
          "[dlpack][torch]") {
  const auto base = ts::memory::allocated(cpu0);
  at::Tensor a;
  const void* data = nullptr;
  {
    auto t = ts::arange<std::int64_t>(0, 100);  // 800 B -> 1024 from the pool
    data = t.data();
    a = at::fromDLPack(ts::to_dlpack(t));
  }
  CHECK(ts::memory::allocated(cpu0) - base == 1024);
  CHECK(a.data_ptr() == data);
  CHECK(a.sum().item<std::int64_t>() == 4950);
  // Back into Tessera through LibTorch's own export: the same bytes, three holders deep.
  auto back = ts::from_dlpack<std::int64_t>(at::toDLPack(a.slice(0, 10, 20)));
  CHECK(static_cast<const void*>(back.data()) == static_cast<const std::int64_t*>(data) + 10);
  a = at::Tensor();
  CHECK(ts::memory::allocated(cpu0) - base == 1024);
  CHECK(back.to_vector() == std::vector<std::int64_t>{10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
  back = ts::Tensor<std::int64_t>();
  CHECK(ts::memory::allocated(cpu0) == base);
}

TEST_CASE("a LibTorch tensor that from_dlpack refuses stays the caller's", "[dlpack][torch]") {
  at::Tensor a = at::arange(4, at::kDouble);
  const auto uses = a.use_count();
  DLManagedTensor* managed = at::toDLPack(a);
  CHECK_THROWS_AS(ts::from_dlpack<float>(managed), ts::dtype_error);
  CHECK(a.use_count() == uses + 1);  // not released: the caller owns it after the throw
  managed->deleter(managed);
  CHECK(a.use_count() == uses);
}

}  // namespace dlpack_torch_test
