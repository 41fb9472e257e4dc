// Tests of memory/size_policy.hpp against PyTorch's table (research/anchors-allocators.md §1.1),
// worked out by hand.
#include <catch2/catch.hpp>

#include <cstddef>

#include "tessera/memory/size_policy.hpp"
#include "memory/units.hpp"

namespace size_policy_test {  // one namespace per test file: unity builds compile several together

using memory_test_units::KiB;
using memory_test_units::MiB;

namespace {
const tessera::memory::pytorch_size_policy policy{};
}  // namespace

static_assert(tessera::memory::size_policy<tessera::memory::pytorch_size_policy>);

TEST_CASE("pytorch_size_policy: requests round up to 512 B, at least 512", "[memory][policy]") {
  CHECK(policy.round_size(1) == 512);
  CHECK(policy.round_size(4) == 512);
  CHECK(policy.round_size(512) == 512);
  CHECK(policy.round_size(513) == 1024);
  CHECK(policy.round_size(516) == 1024);
  CHECK(policy.round_size(4096) == 4096);
  CHECK(policy.round_size(1536 * KiB + 1) == 1536 * KiB + 512);
}

TEST_CASE("pytorch_size_policy: pools and segment sizes", "[memory][policy]") {
  CHECK(policy.is_small(512));
  CHECK(policy.is_small(1 * MiB));
  CHECK_FALSE(policy.is_small(1 * MiB + 512));
  CHECK(policy.segment_size(512) == 2 * MiB);
  CHECK(policy.segment_size(1 * MiB) == 2 * MiB);
  CHECK(policy.segment_size(1 * MiB + 512) == 20 * MiB);
  CHECK(policy.segment_size(10 * MiB - 512) == 20 * MiB);
  CHECK(policy.segment_size(10 * MiB) == 10 * MiB);
  CHECK(policy.segment_size(11 * MiB) == 12 * MiB);
  CHECK(policy.segment_size(12 * MiB) == 12 * MiB);
  CHECK(policy.segment_size(12 * MiB + 512) == 14 * MiB);
}

TEST_CASE("pytorch_size_policy: should_split", "[memory][policy]") {
  // Small pool: any remainder of at least 512 B.
  CHECK(policy.should_split(true, 2 * MiB, 2 * MiB - 512));
  CHECK_FALSE(policy.should_split(true, 1024, 1024));
  // Large pool: only a remainder of more than 1 MiB.
  CHECK(policy.should_split(false, 20 * MiB, 1536 * KiB));
  CHECK_FALSE(policy.should_split(false, 12 * MiB, 11 * MiB));
  CHECK(policy.should_split(false, 12 * MiB, 11 * MiB - 512));
}

TEST_CASE("pytorch_size_policy: the oversize rule with max_split_size", "[memory][policy]") {
  CHECK(policy.may_use(100 * MiB, 2 * MiB));  // unlimited by default
  tessera::memory::pytorch_size_policy capped;
  capped.max_split_size = 64 * MiB;
  CHECK_FALSE(capped.may_use(64 * MiB, 2 * MiB));              // small request, oversize block
  CHECK(capped.may_use(64 * MiB + 20 * MiB - 512, 64 * MiB));  // wastes less than 20 MiB
  CHECK_FALSE(capped.may_use(84 * MiB, 64 * MiB));             // wastes 20 MiB
  CHECK_FALSE(capped.should_split(false, 200 * MiB, 64 * MiB));
  CHECK(capped.should_split(false, 20 * MiB, 2 * MiB));
}

}  // namespace size_policy_test
