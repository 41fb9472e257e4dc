// backend/cuda/reduce_plan.hpp on the host: how a full reduction on CUDA cuts its elements into
// blocks. Every element belongs to exactly one block's slice, slices are whole multiples of the
// block's width, the block count stays within its cap, and each thread gets at least the minimum
// number of elements whenever there are enough elements for one block to have them. A reduction
// done slice by slice in the plan's order equals a float64 sum of the same numbers.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "tessera/backend/cuda/reduce_plan.hpp"

namespace reduce_plan_test {  // one namespace per file: a unity build

using tessera::backend::cuda::full_reduction_plan;

void check_cover(std::int64_t n, std::int64_t width, std::int64_t max_blocks,
                 std::int64_t min_per_thread) {
  CAPTURE(n, width, max_blocks, min_per_thread);
  const full_reduction_plan plan = full_reduction_plan::make(n, width, max_blocks, min_per_thread);
  CAPTURE(plan.blocks, plan.chunk);
  REQUIRE(plan.blocks >= 1);
  REQUIRE(plan.blocks <= max_blocks);
  REQUIRE(plan.chunk % width == 0);
  CHECK(plan.first(0) == 0);
  CHECK(plan.last(plan.blocks - 1, n) == n);
  for (std::int64_t b = 0; b + 1 < plan.blocks; ++b) {
    // Consecutive and non-empty: the next slice starts where this one ends.
    REQUIRE(plan.last(b, n) == plan.first(b + 1));
    REQUIRE(plan.last(b, n) > plan.first(b));
  }
  if (n > 0) REQUIRE(plan.last(plan.blocks - 1, n) > plan.first(plan.blocks - 1));
  // Several blocks only when each slice gives every thread its minimum.
  if (plan.blocks > 1) CHECK(plan.chunk >= width * min_per_thread);
  // Where the cap does not bind, slices stay under twice the minimum (one more block would
  // not give each thread its minimum).
  if (n / (width * min_per_thread) < max_blocks) {
    CHECK(plan.chunk < 2 * width * min_per_thread + width);
  }
}

TEST_CASE("full reduction plan: slices cover the elements once", "[reduce_plan]") {
  const std::vector<std::int64_t> sizes = {0,
                                           1,
                                           2,
                                           255,
                                           256,
                                           257,
                                           8191,
                                           8192,
                                           8193,
                                           65536,
                                           1'000'003,
                                           3 << 20,
                                           (std::int64_t{1} << 33) + 7};
  for (const std::int64_t n : sizes) {
    for (const std::int64_t max_blocks : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1056}}) {
      check_cover(n, 256, max_blocks, 32);
      check_cover(n, 128, max_blocks, 1);
    }
  }
}

TEST_CASE("full reduction plan: a sum over the slices equals the float64 sum", "[reduce_plan]") {
  // Values whose float64 sum is exact: the order of the slices cannot change it, so any element
  // read twice or missed shows.
  const std::int64_t n = 100'003;
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    values[static_cast<std::size_t>(i)] = static_cast<double>(i % 97);
  double expected = 0;
  for (const double v : values) expected += v;
  const full_reduction_plan plan = full_reduction_plan::make(n, 256, 16, 4);
  REQUIRE(plan.blocks == 16);
  std::vector<double> partials;
  for (std::int64_t b = 0; b < plan.blocks; ++b) {
    double partial = 0;
    // Thread t of block b reads first + t, first + t + width, ... below last (the kernel's walk).
    for (std::int64_t t = 0; t < 256; ++t) {
      for (std::int64_t i = plan.first(b) + t; i < plan.last(b, n); i += 256) {
        partial += values[static_cast<std::size_t>(i)];
      }
    }
    partials.push_back(partial);
  }
  double total = 0;
  for (const double p : partials) total += p;
  CHECK(total == expected);
}

}  // namespace reduce_plan_test
