// What tensors cost in the device pool: sizes rounded to 512 bytes exactly as PyTorch's caching
// allocator does, views and no-op conversions allocate nothing, handles release on destruction,
// and failed calls leave every statistic as it was.
#include <catch2/catch.hpp>

#include <cstdint>

#include "tessera/tessera.hpp"

namespace accounting_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

namespace {
const ts::Device cpu0 = ts::Device::parse("cpu:0");
std::int64_t allocation_count() { return ts::memory::stats(cpu0).allocations.allocated; }
}  // namespace

TEST_CASE("tensor sizes are accounted in 512-byte units", "[accounting]") {
  const auto base = ts::memory::allocated(cpu0);
  {
    auto a = ts::empty<float>({1});  // 4 B -> 512
    CHECK(ts::memory::allocated(cpu0) - base == 512);
    auto b = ts::empty<float>({128});  // 512 B -> 512
    CHECK(ts::memory::allocated(cpu0) - base == 1024);
    auto c = ts::empty<float>({129});  // 516 B -> 1024
    CHECK(ts::memory::allocated(cpu0) - base == 2048);
    auto d = ts::empty<float>({1024});  // 4096 B -> 4096
    CHECK(ts::memory::allocated(cpu0) - base == 6144);
    CHECK(ts::memory::reserved(cpu0) >= ts::memory::allocated(cpu0));
    auto e = ts::empty<float>({0});  // nothing, as in PyTorch
    CHECK(ts::memory::allocated(cpu0) - base == 6144);
  }
  CHECK(ts::memory::allocated(cpu0) == base);
}

TEST_CASE("views and same-device conversions allocate nothing", "[accounting]") {
  auto t = ts::zeros<float>({4, 8});
  const auto bytes = ts::memory::allocated(cpu0);
  const auto count = allocation_count();
  {
    auto v = t.view({8, 4});
    auto tr = t.transpose(0, 1);
    auto n = t.narrow(1, 2, 3);
    auto p = t.permute({1, 0});
    auto s = t.split(2);
    auto c = t.chunk(3, 1);
    auto e = t.unsqueeze(0).expand({5, 4, 8});
    auto same_device = t.to(0);
    auto same_kind = t.to<ts::cpu>(0);
    auto same_dtype = t.to<float>();
    auto contiguous = t.contiguous();
    auto r = t.reshape({32});
    ts::AnyTensor any = t;
    auto back = any.as<float>();
    CHECK(ts::memory::allocated(cpu0) == bytes);
    CHECK(allocation_count() == count);
  }
  // A real copy allocates exactly its rounded size, once.
  auto moved = t.to(1);
  auto converted = t.to<double>();  // 32 doubles = 256 B -> 512
  CHECK(ts::memory::allocated(cpu0) - bytes == 512);
  CHECK(allocation_count() == count + 1);
}

TEST_CASE("storage is released when the last handle goes", "[accounting]") {
  const auto base = ts::memory::allocated(cpu0);
  ts::Tensor<float> view;
  {
    auto t = ts::zeros<float>({1000});  // 4000 B -> 4096
    view = t.narrow(0, 10, 5);
  }
  CHECK(ts::memory::allocated(cpu0) - base == 4096);  // the view keeps the storage alive
  CHECK(view.storage().use_count() == 1);
  view = ts::Tensor<float>();
  CHECK(ts::memory::allocated(cpu0) == base);
}

TEST_CASE("an alias on another CPU device shares the bytes and keeps them alive",
          "[accounting]") {
  const ts::Device cpu1 = ts::Device::parse("cpu:1");
  const auto base0 = ts::memory::allocated(cpu0);
  const auto base1 = ts::memory::allocated(cpu1);
  const auto count1 = ts::memory::stats(cpu1).allocations.allocated;
  ts::Tensor<float> alias;
  {
    auto t = ts::arange<float>(0, 1000);  // 4000 B -> 4096 on cpu:0
    const ts::Storage shared = ts::Storage::alias(t.storage(), cpu1);
    CHECK(shared.is_alias());
    CHECK_FALSE(t.storage().is_alias());
    CHECK(shared.device() == cpu1);
    CHECK(shared.data() == t.storage().data());
    CHECK(shared.bytes() == t.storage().bytes());
    CHECK(t.storage().use_count() == 2);  // the alias holds one reference to its owner
    alias = ts::Tensor<float>(shared, t.shape(), t.strides(), t.storage_offset()).narrow(0, 10, 5);
    t.narrow(0, 10, 1).fill_(-1.0f);  // a write through the owner is read through the alias
  }
  CHECK(alias.device() == cpu1);
  CHECK(alias.to_vector() == std::vector<float>{-1, 11, 12, 13, 14});
  // The bytes stay counted on the owner's device, nothing on the alias's.
  CHECK(ts::memory::allocated(cpu0) - base0 == 4096);
  CHECK(ts::memory::allocated(cpu1) == base1);
  CHECK(ts::memory::stats(cpu1).allocations.allocated == count1);
  alias = ts::Tensor<float>();  // the last handle: the owner's bytes go back to cpu:0's pool
  CHECK(ts::memory::allocated(cpu0) == base0);
  CHECK(ts::memory::allocated(cpu1) == base1);
}

TEST_CASE("an alias of CPU storage on a CUDA device is refused, naming both devices",
          "[accounting][errors]") {
  auto t = ts::zeros<float>({4});
  const auto uses = t.storage().use_count();
  const ts::Device cuda0{ts::DeviceType::cuda, 0};
  CHECK_THROWS_AS(ts::Storage::alias(t.storage(), cuda0), ts::device_error);
  CHECK_THROWS_WITH(ts::Storage::alias(t.storage(), cuda0),
                    Catch::Matchers::Contains("cpu:0") && Catch::Matchers::Contains("cuda:0"));
  CHECK(t.storage().use_count() == uses);
}

TEST_CASE(
    "another library's memory is neither counted nor freed by the pool; its release "
    "function runs once, after the last handle",
    "[accounting]") {
  struct owner {
    float values[4] = {1, 2, 3, 4};
    int releases = 0;
  } memory;
  const auto before = ts::memory::stats(cpu0);
  ts::Tensor<float> view;
  {
    ts::Storage storage = ts::Storage::from_blob(
        cpu0, memory.values, sizeof memory.values,
        [](void* context) noexcept { ++static_cast<owner*>(context)->releases; }, &memory);
    CHECK(storage.is_external());
    CHECK_FALSE(storage.is_pinned());
    CHECK(storage.data() == memory.values);
    CHECK(storage.bytes() == 16);
    auto t = ts::Tensor<float>(storage, ts::Shape{4}, ts::Strides{1}, 0);
    view = t.narrow(0, 1, 2);
    t.narrow(0, 3, 1).fill_(-4.0f);
  }
  CHECK(memory.releases == 0);
  CHECK(memory.values[3] == -4.0f);  // written in place
  CHECK(view.to_vector() == std::vector<float>{2, 3});
  view = ts::Tensor<float>();
  CHECK(memory.releases == 1);
  const auto after = ts::memory::stats(cpu0);
  CHECK(after.allocations.allocated == before.allocations.allocated);
  CHECK(after.allocated_bytes.current == before.allocated_bytes.current);

  // A device that does not exist: refused before anything is taken (release is not called).
  CHECK_THROWS_AS(
      ts::Storage::from_blob(
          ts::Device::parse("cpu:9"), memory.values, sizeof memory.values,
          [](void* context) noexcept { ++static_cast<owner*>(context)->releases; }, &memory),
      ts::device_error);
  CHECK(memory.releases == 1);
}

TEST_CASE("failed calls change no statistic", "[accounting][errors]") {
  auto t = ts::zeros<float>({2, 3});
  const auto before = ts::memory::stats(cpu0);
  CHECK_THROWS_AS(ts::from_vector<float>({1, 2, 3}, {2, 2}), ts::shape_error);
  CHECK_THROWS_AS(t.new_tensor({1, 2}, {3}), ts::shape_error);
  CHECK_THROWS_AS(t.view({4, 2}), ts::shape_error);
  CHECK_THROWS_AS(t.copy_(ts::Tensor<float>()), ts::error);
  CHECK_THROWS_AS(ts::zeros<float>({-1}), ts::shape_error);
  const auto after = ts::memory::stats(cpu0);
  CHECK(after.allocations.allocated == before.allocations.allocated);
  CHECK(after.allocated_bytes.current == before.allocated_bytes.current);
  CHECK(after.reserved_bytes.current == before.reserved_bytes.current);
}

TEST_CASE("an OOM while creating a tensor leaves the others intact", "[accounting][errors]") {
  const auto d1 = ts::Device::parse("cpu:1");
  ts::memory::empty_cache(d1);
  ts::memory::set_limit(d1, 4u << 20);
  auto keep = ts::full<float>({256}, 3.0f, 1);
  const auto allocated = ts::memory::allocated(d1);
  const auto ooms = ts::memory::stats(d1).num_ooms;
  CHECK_THROWS_AS(ts::empty<float>({2 * 1024 * 1024}, 1), ts::out_of_memory_error);  // 8 MiB
  CHECK_THROWS_WITH(ts::empty<float>({2 * 1024 * 1024}, 1),
                    Catch::Contains("8.00 MiB") && Catch::Contains("cpu:1"));
  CHECK(ts::memory::allocated(d1) == allocated);
  CHECK(ts::memory::stats(d1).num_ooms == ooms + 2);
  CHECK(keep.to_vector() == std::vector<float>(256, 3.0f));
  auto fits = ts::zeros<float>({1024}, 1);
  CHECK(fits.numel() == 1024);
  ts::memory::set_limit(d1, ts::memory::no_limit);
}

}  // namespace accounting_test
