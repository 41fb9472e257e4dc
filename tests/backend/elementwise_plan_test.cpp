// backend/cuda/elementwise_plan.hpp on the host: how the CUDA executor merges an assignment's
// layout and cuts it into rows, against layouts derived by hand and against an element-by-element
// walk of the original strides (every output element written once, each operand read at the
// offset its own strides give).
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "tessera/backend/cuda/elementwise_plan.hpp"

namespace elementwise_plan_test {  // one namespace per file: a unity build

namespace ts = tessera;
using ts::backend::cuda::elementwise_layout;
using ts::backend::cuda::merge_elementwise;
using ts::backend::cuda::plan_rows;

/// The offsets (output, operand 1, ...) of every element of `shape`, in row-major order of the
/// logical index: the reference any merged layout must reproduce as a set of tuples.
std::vector<std::vector<std::int64_t>> logical_offsets(const ts::Shape& shape,
                                                       const std::vector<ts::Strides>& strides) {
  std::vector<std::vector<std::int64_t>> tuples;
  std::vector<std::int64_t> index(shape.size(), 0);
  const std::int64_t n = shape.numel();
  for (std::int64_t e = 0; e < n; ++e) {
    std::vector<std::int64_t> tuple;
    for (const ts::Strides& s : strides) {
      std::int64_t offset = 0;
      for (int d = 0; d < shape.size(); ++d) offset += index[d] * s[d];
      tuple.push_back(offset);
    }
    tuples.push_back(tuple);
    for (int d = shape.size() - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return tuples;
}

/// The same tuples walked through the merged layout (sizes of `layout`, merged `strides`).
std::vector<std::vector<std::int64_t>> merged_offsets(const elementwise_layout& layout,
                                                      const std::vector<ts::Strides>& strides) {
  const auto& args = layout.args;
  ts::Shape shape;
  for (int d = 0; d < args.rank; ++d) shape.push_back(args.sizes[d]);
  std::vector<ts::Strides> used;
  for (const ts::Strides& s : strides) {
    ts::Strides kept;
    for (int d = 0; d < args.rank; ++d) kept.push_back(s[d]);
    used.push_back(kept);
  }
  return logical_offsets(shape, used);
}

/// Merges (output, operands...) and checks that the merged walk reads and writes the same
/// elements together as the logical walk, each output element once.
elementwise_layout check_merge(const ts::Shape& shape, std::vector<ts::Strides> strides) {
  const auto expected = logical_offsets(shape, strides);
  const elementwise_layout layout =
      merge_elementwise(shape, strides.data(), static_cast<int>(strides.size()));
  auto got = merged_offsets(layout, strides);
  CHECK(got.size() == expected.size());
  std::map<std::int64_t, std::vector<std::int64_t>> by_output;
  for (const auto& tuple : expected) by_output[tuple[0]] = tuple;
  std::map<std::int64_t, int> writes;
  for (const auto& tuple : got) {
    ++writes[tuple[0]];
    CHECK(by_output.at(tuple[0]) == tuple);
  }
  CHECK(writes.size() == by_output.size());
  for (const auto& [offset, count] : writes) CHECK(count == 1);
  CHECK(layout.args.rank == static_cast<int>(strides[0].size()));
  for (int d = 0; d < layout.args.rank; ++d) CHECK(layout.args.out_strides[d] == strides[0][d]);
  return layout;
}

TEST_CASE("row-major operands merge into one dense run", "[elementwise_plan]") {
  const ts::Shape shape{2, 3, 4};
  const ts::Strides row_major{12, 4, 1};
  const auto layout = check_merge(shape, {row_major, row_major, row_major});
  CHECK(layout.dense);
  CHECK(layout.args.rank == 1);
  CHECK(layout.args.sizes[0] == 24);
  // Extent-1 dimensions with any stride are still row-major and vanish.
  const auto ones = check_merge(ts::Shape{1, 6, 1}, {ts::Strides{99, 1, 7}, ts::Strides{5, 1, 3}});
  CHECK(ones.dense);
  CHECK(ones.args.sizes[0] == 6);
  // One element: no dimension left, not dense (the rows kernel takes it, as one row of one).
  const auto single = check_merge(ts::Shape{1, 1}, {ts::Strides{1, 1}, ts::Strides{1, 1}});
  CHECK(single.args.rank == 0);
  CHECK_FALSE(single.dense);
  CHECK_FALSE(single.rows_allow_vector(4));
}

TEST_CASE("channels_last operands merge in memory order; the output's order decides",
          "[elementwise_plan]") {
  const ts::Shape shape{2, 3, 4, 5};
  const ts::Strides nhwc{60, 1, 15, 3};
  const ts::Strides nchw{60, 20, 5, 1};
  const auto alike = check_merge(shape, {nhwc, nhwc});
  CHECK(alike.dense);
  CHECK(alike.args.sizes[0] == 120);
  // Output NHWC, input NCHW: walked N, (H W), C; not dense, and the output has unit stride along
  // the rows (C), so the rows kernel may store vectors when C's extent allows.
  const auto mixed = check_merge(shape, {nhwc, nchw});
  CHECK_FALSE(mixed.dense);
  CHECK(mixed.args.rank == 3);
  CHECK(mixed.args.sizes[0] == 2);
  CHECK(mixed.args.sizes[1] == 20);
  CHECK(mixed.args.sizes[2] == 3);
  CHECK(mixed.rows_allow_vector(1));
  CHECK(mixed.rows_allow_vector(3));
  CHECK_FALSE(mixed.rows_allow_vector(4));  // rows start every 3 elements
  // A row-major output keeps the logical order: [N, C, H*W].
  const auto row_major = check_merge(shape, {nchw, nhwc});
  CHECK(row_major.args.rank == 3);
  CHECK(row_major.args.sizes[2] == 20);
  // A broadcast channel bias: [N*H*W, C] for an NHWC output.
  const auto bias = check_merge(shape, {nhwc, ts::Strides{0, 1, 0, 0}});
  CHECK(bias.args.rank == 2);
  CHECK(bias.args.sizes[0] == 40);
  CHECK(bias.args.sizes[1] == 3);
}

TEST_CASE("transposed and broadcast operands keep their own strides", "[elementwise_plan]") {
  // out [4, 6] row-major = a^T (a [6, 4]) + b broadcast along rows.
  const auto layout =
      check_merge(ts::Shape{4, 6}, {ts::Strides{6, 1}, ts::Strides{1, 4}, ts::Strides{0, 1}});
  CHECK_FALSE(layout.dense);
  CHECK(layout.rows_allow_vector(2));  // rows of 6 start at multiples of 2
  CHECK_FALSE(layout.rows_allow_vector(4));
  // A sliced output (every other column): no unit stride along the row.
  const auto sliced = check_merge(ts::Shape{3, 4}, {ts::Strides{8, 2}, ts::Strides{4, 1}});
  CHECK_FALSE(sliced.dense);
  CHECK_FALSE(sliced.rows_allow_vector(2));
  // A reversed-order (negative stride) operand and an expanded scalar tensor.
  check_merge(ts::Shape{2, 5}, {ts::Strides{5, 1}, ts::Strides{-5, -1}, ts::Strides{0, 0}});
}

TEST_CASE("the rows kernel's plan covers every row once with at most 16 blocks per SM",
          "[elementwise_plan]") {
  elementwise_layout layout;
  layout.args.rank = 2;
  layout.args.sizes[0] = 1000;
  layout.args.sizes[1] = 49;
  const auto launch = plan_rows(layout.args, 1000 * 49, 1, 256, 132 * 2048, 132);
  CHECK(launch.plan.outputs == 1000);
  CHECK(launch.plan.extent == 49);
  CHECK(launch.plan.vector == 1);
  CHECK(launch.grid >= 1);
  CHECK(launch.grid <= 132 * 16);
  CHECK(launch.grid <= launch.plan.tiles());
  // Every element of every row is visited once (the plan's walk, as the kernel runs it).
  std::vector<int> seen(49 * 1000, 0);
  for (std::int64_t tile = 0; tile < launch.plan.tiles(); ++tile) {
    const std::int64_t split = tile % launch.plan.splits;
    for (int thread = 0; thread < 256; ++thread) {
      const std::int64_t row =
          tile / launch.plan.splits * launch.plan.rows_per_block + thread / launch.plan.group;
      if (row >= launch.plan.outputs) continue;
      const int lane = thread % launch.plan.group;
      for (std::int64_t p = launch.plan.first(split) + lane; p < launch.plan.last(split);
           p += launch.plan.group) {
        ++seen[row * 49 + p];
      }
    }
  }
  for (int count : seen) REQUIRE(count == 1);
  // A 0-dim layout: one row of one element.
  const auto scalar = plan_rows(elementwise_layout{}.args, 1, 1, 256, 132 * 2048, 132);
  CHECK(scalar.plan.outputs == 1);
  CHECK(scalar.plan.extent == 1);
  CHECK(scalar.grid == 1);
}

}  // namespace elementwise_plan_test
