// Bad input found by adversarial probing (issue: reliability): shapes whose element count, strides
// or byte size overflow 64 bits, ranges that overflow, ordinals below -1, writes into expanded
// views. Each must throw a Tessera error naming the values and leave every object as it was.
// Expected messages and values are written out by hand.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "tessera/tessera.hpp"

namespace bad_input_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

// 3 * W wraps to 2 modulo 2^64, and 3 * W * 3 to 6: the counts the old arithmetic accepted.
constexpr std::int64_t W = 6148914691236517206;

TEST_CASE("factories refuse shapes too large for 64-bit arithmetic", "[tensor][errors]") {
  const ts::Device cpu0{ts::DeviceType::cpu, 0};
  const auto allocated_before = ts::memory::allocated(cpu0);
  CHECK_THROWS_AS(ts::zeros<float>({1LL << 32, 1LL << 32}), ts::shape_error);
  CHECK_THROWS_WITH(ts::zeros<float>({1LL << 32, 1LL << 32}),
                    Catch::Contains("[4294967296, 4294967296]") &&
                        Catch::Contains("does not fit in a 64-bit integer"));
  // 2^62 floats are 2^64 bytes: the element count fits, the byte size does not.
  CHECK_THROWS_WITH(ts::empty<float>({1LL << 62}),
                    Catch::Contains("[4611686018427387904]") && Catch::Contains("size in bytes"));
  CHECK_THROWS_AS(ts::empty<float>({3, 1LL << 62}), ts::shape_error);
  CHECK_THROWS_AS(ts::full<float>({3, W}, 1.0f), ts::shape_error);
  CHECK_THROWS_WITH(ts::from_vector<float>({1, 2}, {3, W}),
                    Catch::Contains("from_vector") && Catch::Contains("[3, 6148914691236517206]"));
  // A zero extent does not hide the others: the strides of [0, 2^62, 2^62] still overflow.
  CHECK_THROWS_AS(ts::empty<float>({0, 1LL << 62, 1LL << 62}), ts::shape_error);
  // Large but representable shapes are refused by the pool, not by the arithmetic: 2^46 floats
  // are 256 TiB, more than x86-64's 128 TiB of user address space, so no host gives them, even
  // one that overcommits memory (4 TiB were given on the GPU machine, 2026-11-25).
  CHECK_THROWS_AS(ts::empty<float>({1LL << 46}), ts::out_of_memory_error);
  CHECK(ts::memory::allocated(cpu0) == allocated_before);
}

TEST_CASE("views refuse shapes whose element count overflows", "[tensor][views][errors]") {
  const auto x = ts::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK_THROWS_WITH(x.view({3, W, 3}), Catch::Contains("view") &&
                                           Catch::Contains("[3, 6148914691236517206, 3]") &&
                                           Catch::Contains("input of size 6"));
  CHECK_THROWS_AS(x.reshape({3, W, 3}), ts::shape_error);
  CHECK_THROWS_AS(x.view({-1, W, 3}), ts::shape_error);
  CHECK_THROWS_WITH(ts::zeros<float>({1, 1}).expand({W, W}),
                    Catch::Contains("expand") && Catch::Contains("does not fit"));
  // narrow's range check cannot overflow: start 1 + INT64_MAX is not "in range".
  CHECK_THROWS_WITH(x.narrow(1, 1, std::numeric_limits<std::int64_t>::max()),
                    Catch::Contains("start 1 and length 9223372036854775807") &&
                        Catch::Contains("size 3"));
  CHECK_THROWS_AS(x.narrow(1, 2, std::numeric_limits<std::int64_t>::max() - 1), ts::shape_error);
  CHECK(x.narrow(1, 1, 2).to_vector() == std::vector<float>{1, 2, 4, 5});
  CHECK(x.shape() == ts::Shape{2, 3});  // unchanged
}

TEST_CASE("arange refuses counts that cannot be a tensor and allocates from the pool",
          "[tensor][errors]") {
  CHECK_THROWS_WITH(ts::arange<float>(0, 1e30),
                    Catch::Contains("arange") && Catch::Contains("1e+30") &&
                        Catch::Contains("too many"));
  // 10^12 floats: through the pool, so its OOM (and a limit) applies, not the host heap's.
  CHECK_THROWS_AS(ts::arange<float>(0, 1e12), ts::out_of_memory_error);
  CHECK(ts::arange<std::int64_t>(2, 11, 3).to_vector() == std::vector<std::int64_t>{2, 5, 8});
  // Values beyond the dtype's range convert as PyTorch's casts do (modulo 256 for uint8 here).
  CHECK(ts::arange<std::uint8_t>(254, 258).to_vector() ==
        std::vector<std::uint8_t>{254, 255, 0, 1});
}

TEST_CASE("ordinals below -1 are errors, not the current device", "[tensor][errors]") {
  CHECK_THROWS_AS(ts::empty<float>({2}, -2), ts::device_error);
  CHECK_THROWS_WITH(ts::empty<float>({2}, -2), Catch::Contains("device cpu:-2 does not exist"));
  const auto x = ts::zeros<float>({2});
  CHECK_THROWS_WITH(x.to(-5), Catch::Contains("device cpu:-5 does not exist"));
  CHECK_THROWS_WITH(x.to<ts::cpu>(-5), Catch::Contains("device cpu:-5 does not exist"));
  CHECK_THROWS_AS(ts::cpu::synchronize(-3), ts::device_error);
  CHECK(x.to(-1).device() == x.device());  // -1 is still the current device
}

TEST_CASE("copy_ into an expanded view throws, as += does", "[tensor][copy][errors]") {
  auto base = ts::from_vector<float>({1, 2}, {2, 1});
  auto expanded = base.expand({2, 3});
  const auto source = ts::from_vector<float>({10, 11, 12, 13, 14, 15}, {2, 3});
  CHECK_THROWS_WITH(expanded.copy_(source), Catch::Contains("copy_") &&
                                                Catch::Contains("expanded view") &&
                                                Catch::Contains("stride 0 in dimension 1") &&
                                                Catch::Contains("clone() it first"));
  CHECK_THROWS_AS(expanded.narrow(0, 0, 1) = source.narrow(0, 0, 1), ts::error);
  CHECK(base.to_vector() == std::vector<float>{1, 2});  // nothing written
  // An extent-1 dimension with stride 0 holds one element: writing it is fine.
  auto single = base.narrow(0, 0, 1).expand({1, 1});
  single.copy_(ts::from_vector<float>({7}, {1, 1}));
  CHECK(base.to_vector() == std::vector<float>{7, 2});
}

}  // namespace bad_input_test
