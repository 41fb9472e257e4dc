// backend/cuda/reduce_plan.hpp on the host: how a full reduction on CUDA reads its operands as
// rows. Every element of every operand is read exactly once, each operand's elements in step
// with the others', contiguous and alike-laid-out operands make one row, and argmax's order keeps
// each element's row-major position at row * extent + position. For reductions along a
// dimension: the rows plan's lanes, loads and splits (walked as the kernel walks them) and the
// columns plan's slices read each element of each row exactly once. Batch
// norm's channel plan covers each channel once; its one-pass moments (in float, merged as the
// kernel merges them) match float64 where a sum of squares would not. Each thread's fold
// (thread_fold: blocks of 16 values in order, the blocks combined pairwise, earlier on the left)
// gives the hand-computed float results where the order of rounding shows.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tessera/backend/cuda/reduce_plan.hpp"
#include "tessera/backend/reduce_ops.hpp"

namespace reduce_plan_test {  // one namespace per file: a unity build

using tessera::backend::cuda::channel_reduction_plan;
using tessera::backend::cuda::column_reduction_plan;
using tessera::backend::cuda::full_reduction_rows;
using tessera::backend::cuda::merge_moments;
using tessera::backend::cuda::moments;
using tessera::backend::cuda::reduce_batch_values;
using tessera::backend::cuda::row_reduction_plan;

using tessera::Shape;
using tessera::Strides;

/// The element offsets of each operand, in the order the rows read them: row o's kept index
/// taken from o as row_source::row takes it (the last kept dimension fastest), then the row's
/// positions.
template <std::size_t L>
std::vector<std::array<std::int64_t, L>> row_offsets(const full_reduction_rows<L>& plan) {
  std::vector<std::array<std::int64_t, L>> offsets;
  for (std::int64_t o = 0; o < plan.rows; ++o) {
    std::int64_t index[tessera::max_dims] = {};
    std::int64_t rest = o;
    for (int d = plan.kept_rank - 1; d >= 0; --d) {
      index[d] = rest % plan.kept[d];
      rest /= plan.kept[d];
    }
    for (std::int64_t p = 0; p < plan.extent; ++p) {
      std::array<std::int64_t, L> at{};
      for (std::size_t k = 0; k < L; ++k) {
        REQUIRE(plan.strides[k].size() == plan.kept_rank + 1);
        std::int64_t offset = p * plan.strides[k][plan.kept_rank];
        for (int d = 0; d < plan.kept_rank; ++d) offset += index[d] * plan.strides[k][d];
        at[k] = offset;
      }
      offsets.push_back(at);
    }
  }
  return offsets;
}

/// The element offsets of each operand in row-major order over `shape` (the reference).
template <std::size_t L>
std::vector<std::array<std::int64_t, L>> row_major_offsets(const Shape& shape,
                                                           const std::array<Strides, L>& strides) {
  std::vector<std::array<std::int64_t, L>> offsets;
  const int rank = shape.size();
  for (std::int64_t i = 0; i < shape.numel(); ++i) {
    std::array<std::int64_t, L> at{};
    std::int64_t rest = i;
    for (int d = rank - 1; d >= 0; --d) {
      const std::int64_t position = rest % shape[d];
      rest /= shape[d];
      for (std::size_t k = 0; k < L; ++k) at[k] += position * strides[k][d];
    }
    offsets.push_back(at);
  }
  return offsets;
}

template <std::size_t L>
void check_full_rows(const Shape& shape, const std::array<Strides, L>& strides,
                     std::int64_t expected_rows) {
  std::string layout = "shape " + shape.str() + ", strides";
  for (std::size_t k = 0; k < L; ++k) layout += " " + strides[k].str();
  INFO(layout);
  const auto expected = row_major_offsets(shape, strides);
  {
    // argmax's order: element for element the row-major one, so the position the kernel gives
    // element (o, p), o * extent + p, is its row-major index.
    const auto plan = full_reduction_rows<L>::make(shape, strides, true);
    CHECK(plan.rows * plan.extent == shape.numel());
    CHECK(row_offsets(plan) == expected);
  }
  {
    // Memory order: the same elements, each once, the operands' offsets still in step.
    const auto plan = full_reduction_rows<L>::make(shape, strides, false);
    CHECK(plan.rows == expected_rows);
    CHECK(plan.rows * plan.extent == shape.numel());
    auto read = row_offsets(plan);
    auto sorted_expected = expected;
    std::sort(read.begin(), read.end());
    std::sort(sorted_expected.begin(), sorted_expected.end());
    CHECK(read == sorted_expected);
  }
}

TEST_CASE("full reduction rows: every element once, argmax's order row-major", "[reduce_plan]") {
  using S = std::array<Strides, 1>;
  // Contiguous: one row of every element.
  check_full_rows(Shape{4, 5, 6}, S{Strides{30, 6, 1}}, 1);
  check_full_rows(Shape{7}, S{Strides{1}}, 1);
  // One element, and extents of 1 dropped.
  check_full_rows(Shape{}, S{Strides{}}, 1);
  check_full_rows(Shape{1, 1}, S{Strides{5, 1}}, 1);
  check_full_rows(Shape{3, 1, 4}, S{Strides{4, 9, 1}}, 1);
  // A transposed matrix: rows along its memory order, one row per column of the view.
  check_full_rows(Shape{5, 3}, S{Strides{1, 5}}, 1);
  // A slice: rows of the inner extent.
  check_full_rows(Shape{4, 3}, S{Strides{8, 1}}, 4);
  // channels_last [N, C, H, W]: one run in memory order.
  check_full_rows(Shape{2, 3, 4, 5}, S{Strides{60, 1, 15, 3}}, 1);
  // A broadcast operand beside a dense one (batch norm's x - mean): rows of H * W.
  using S2 = std::array<Strides, 2>;
  check_full_rows(Shape{2, 3, 4, 5}, S2{Strides{60, 20, 5, 1}, Strides{0, 1, 0, 0}}, 6);
  // A row-major operand beside a transposed one: neither order is one run.
  check_full_rows(Shape{3, 4}, S2{Strides{4, 1}, Strides{1, 3}}, 3);
  // An expanded number (stride 0 everywhere) beside a contiguous tensor.
  check_full_rows(Shape{6, 7}, S2{Strides{7, 1}, Strides{0, 0}}, 1);
  // No operand at all (a reduction of numbers): one row.
  check_full_rows(Shape{3, 4}, std::array<Strides, 0>{}, 1);
}

/// Reads of one row as reduce_rows_kernel makes them: for every split and lane, the positions
/// plan.walk visits; checks that loads are whole and aligned vectors inside the slice, that a
/// lane's positions increase, and returns how often each position was read. The checks run per
/// load without Catch2's per-assertion cost (millions of loads); the first broken one fails.
std::vector<int> row_reads(const row_reduction_plan& plan) {
  std::vector<int> reads(static_cast<std::size_t>(plan.extent), 0);
  std::string broken;  // the first broken check, with where it broke
  auto check = [&](bool holds, const char* what, std::int64_t split, int lane, std::int64_t p) {
    if (!holds && broken.empty()) {
      broken = std::string(what) + " (split " + std::to_string(split) + ", lane " +
               std::to_string(lane) + ", position " + std::to_string(p) + ")";
    }
  };
  for (std::int64_t split = 0; split < plan.splits; ++split) {
    const std::int64_t begin = plan.first(split), end = plan.last(split);
    REQUIRE(begin % plan.vector == 0);
    for (int lane = 0; lane < plan.group; ++lane) {
      std::int64_t previous = -1;
      auto read = [&](std::int64_t p, int count) {
        check(p >= begin, "a load before its slice", split, lane, p);
        check(p + count <= end, "a load past its slice", split, lane, p);
        check(p > previous, "a lane's positions do not increase", split, lane, p);
        if (p < 0 || p + count > plan.extent) return;
        for (int j = 0; j < count; ++j) ++reads[static_cast<std::size_t>(p + j)];
        previous = p + count - 1;
      };
      plan.walk(
          split, lane,
          [&](std::int64_t p, std::int64_t step) {
            check(step == std::int64_t{plan.group} * plan.vector,
                  "a batch's step is not a group's vectors", split, lane, p);
            for (int k = 0; k < reduce_batch_values / plan.vector; ++k) {
              check((p + k * step) % plan.vector == 0, "a batch's load is not aligned", split, lane,
                    p + k * step);
              read(p + k * step, plan.vector);
            }
          },
          [&](std::int64_t p) {
            check(p % plan.vector == 0, "a vector load is not aligned", split, lane, p);
            read(p, plan.vector);
          },
          [&](std::int64_t p) { read(p, 1); });
    }
  }
  INFO(broken);
  REQUIRE(broken.empty());
  return reads;
}

TEST_CASE("row reduction plan: every element of a row is read once, in whole aligned loads",
          "[reduce_plan]") {
  // ResNet-50's batch-norm rows (N*C rows of H*W), short rows, one long row, rows of odd length.
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {8 * 64, 112 * 112}, {8 * 256, 56 * 56}, {32 * 256, 3136}, {8 * 2048, 49}, {16384, 7},
      {1, 1}, {1, 0}, {3, 1'000'003}, {1, 1 << 22}, {2, 100}, {100'000, 3}, {5, 4099}};
  for (const auto& [outputs, extent] : shapes) {
    for (const int vector : {1, 4}) {
      for (const std::int64_t resident : {std::int64_t{132} * 2048, std::int64_t{2048}}) {
        // 0: the plan's choice; else the group cuda_bench's sweep sets. widest: a reduction's
        // warp, or an elementwise block's 256.
        for (const int lanes : {0, 1, 32, 256}) {
          for (const int widest : {32, 256}) {
            const row_reduction_plan plan =
                row_reduction_plan::make(outputs, extent, vector, 256, resident, widest, lanes);
            CAPTURE(outputs, extent, vector, resident, lanes, widest, plan.group, plan.splits,
                    plan.slice);
            if (lanes > 0) REQUIRE(plan.group == lanes);
            REQUIRE(plan.group >= 1);
            REQUIRE(plan.group <= 256);
            REQUIRE((plan.group & (plan.group - 1)) == 0);
            REQUIRE(plan.rows_per_block * plan.group == 256);
            REQUIRE(plan.splits >= 1);
            if (extent > 0) REQUIRE(plan.last(plan.splits - 1) == extent);
            for (std::int64_t s = 0; s + 1 < plan.splits; ++s) {
              REQUIRE(plan.last(s) == plan.first(s + 1));
              REQUIRE(plan.last(s) > plan.first(s));
            }
            // A lane has a batch of values when the row is long enough for one (down to 4 values
            // when the device would otherwise idle), and splits leave each lane 64 values. While
            // the rows fill the device at `widest` lanes, the group is the widest up to it with a
            // batch a lane.
            if (lanes == 0 && outputs * widest >= resident) {
              CHECK(plan.group <= widest);
              if (extent >= 2 * reduce_batch_values && plan.group < widest) {
                CHECK(std::int64_t{plan.group} * 2 * reduce_batch_values > extent);
              }
            }
            if (lanes == 0 && plan.group > 1) CHECK(std::int64_t{plan.group} * 4 <= extent);
            if (plan.splits > 1) {
              CHECK(plan.slice >= std::int64_t{plan.group} * 64);
              CHECK(plan.tiles() * 256 <= resident);  // the slices' blocks are one wave
            }
            const std::vector<int> reads = row_reads(plan);
            for (std::int64_t p = 0; p < extent; ++p) {
              if (reads[static_cast<std::size_t>(p)] != 1) {
                CAPTURE(p, reads[static_cast<std::size_t>(p)]);
                FAIL("a position is not read exactly once");
              }
            }
            CHECK(plan.tiles() ==
                  (outputs + plan.rows_per_block - 1) / plan.rows_per_block * plan.splits);
          }
        }
      }
    }
  }
}

TEST_CASE("row reduction plan: the ResNet-50 shapes fill the device", "[reduce_plan]") {
  // An H100 SXM's or H200's 132 SMs, 4 resident blocks of 256 (reduce_rows_kernel's 64
  // registers a thread, ptxas -v, sm_90).
  const std::int64_t resident = std::int64_t{132} * 1024;
  // [32, 256, 3136] along the last dimension: 8192 rows fill the device a warp each (98 values a
  // lane, shuffles only); elementwise rows of the same shape (x - m) take 128 lanes (24 values).
  const auto wide = row_reduction_plan::make(8192, 3136, 4, 256, resident, 32);
  CHECK(wide.group == 32);
  CHECK(wide.rows_per_block == 8);
  CHECK(wide.splits == 1);
  CHECK(row_reduction_plan::make(8192, 3136, 4, 256, resident, 256).group == 128);
  // [4, 256, 3136]: 1024 rows leave the device idle a warp each: the group widens (12 values a
  // lane) rather than a row being cut over blocks.
  const auto few = row_reduction_plan::make(1024, 3136, 4, 256, resident, 32);
  CHECK(few.group == 256);
  CHECK(few.splits == 1);
  // [8, 2048, 49]: rows of 49 values; 16384 rows need 8 lanes each for the device's lanes.
  const auto short_rows = row_reduction_plan::make(16384, 49, 1, 256, resident, 32);
  CHECK(short_rows.group == 8);
  // One long row: split over blocks, each lane with at least 64 values.
  const auto one = row_reduction_plan::make(1, std::int64_t{1} << 24, 4, 256, resident, 32);
  CHECK(one.group == 256);
  CHECK(one.splits > 100);
  CHECK(one.splits * 256 >= resident / 8);
}

TEST_CASE("column reduction plan: slices cover the reduced dimension once", "[reduce_plan]") {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {64, 8}, {2048, 8}, {1000, 4096}, {1, 1 << 20}, {3, 0}, {100'000, 2}, {33, 257}};
  for (const auto& [outputs, extent] : shapes) {
    for (const std::int64_t resident : {std::int64_t{132} * 2048, std::int64_t{256}}) {
      const column_reduction_plan plan =
          column_reduction_plan::make(outputs, extent, 256, resident);
      CAPTURE(outputs, extent, resident, plan.splits, plan.slice);
      REQUIRE(plan.columns * plan.lanes == 256);
      REQUIRE(plan.splits >= 1);
      REQUIRE(plan.slice % plan.lanes == 0);
      std::vector<int> reads(static_cast<std::size_t>(extent), 0);
      for (std::int64_t s = 0; s < plan.splits; ++s) {
        // Row of threads t reads first + t, first + t + lanes, ... below last (the kernel's walk).
        for (int t = 0; t < plan.lanes; ++t) {
          for (std::int64_t r = plan.first(s) + t; r < plan.last(s); r += plan.lanes) {
            ++reads[static_cast<std::size_t>(r)];
          }
        }
      }
      for (std::int64_t r = 0; r < extent; ++r) REQUIRE(reads[static_cast<std::size_t>(r)] == 1);
      if (plan.splits > 1) {
        CHECK(plan.slice >= std::int64_t{plan.lanes} * 32);
        CHECK(plan.tiles() * 256 <= resident);  // one wave
      }
    }
  }
}

TEST_CASE("channel reduction plan: slices cover a channel once, in whole loads", "[reduce_plan]") {
  for (const std::int64_t channels : {std::int64_t{1}, std::int64_t{4}, std::int64_t{64},
                                      std::int64_t{2048}}) {
    for (const std::int64_t count :
         {std::int64_t{1}, std::int64_t{49}, std::int64_t{8 * 49}, std::int64_t{8 * 12544},
          std::int64_t{32 * 3136}, std::int64_t{1} << 24}) {
      for (const int vector : {1, 4}) {
        const auto plan =
            channel_reduction_plan::make(channels, count, vector, 256, std::int64_t{132} * 2048);
        CAPTURE(channels, count, vector, plan.splits, plan.slice);
        REQUIRE(plan.splits >= 1);
        REQUIRE(plan.splits <= channel_reduction_plan::max_splits);
        // A warp per channel below 16 values a thread of a block, unsplit; else the block.
        REQUIRE(plan.lanes == (count < 256 * 16 ? 32 : 256));
        REQUIRE(plan.channels_per_block * plan.lanes == 256);
        if (plan.lanes < 256) REQUIRE(plan.splits == 1);
        REQUIRE(plan.slice % (plan.lanes * vector) == 0);
        // The grid's blocks and lane groups name every (channel, split) once.
        std::vector<int> seen(static_cast<std::size_t>(channels * plan.splits), 0);
        for (std::int64_t b = 0; b < plan.blocks(); ++b) {
          for (int g = 0; g < plan.channels_per_block; ++g) {
            const std::int64_t ch = plan.channel_of(b, g);
            if (ch >= channels) {
              REQUIRE(b >= plan.blocks() - plan.splits);  // only the last group of channels
              continue;
            }
            ++seen[static_cast<std::size_t>(ch * plan.splits + plan.split_of(b))];
          }
        }
        for (const int s : seen) REQUIRE(s == 1);
        REQUIRE(plan.first(0) == 0);
        REQUIRE(plan.last(plan.splits - 1) == count);
        for (std::int64_t s = 0; s + 1 < plan.splits; ++s) {
          REQUIRE(plan.last(s) == plan.first(s + 1));
          REQUIRE(plan.last(s) > plan.first(s));
        }
        // Splits only while the channels leave the device idle, each thread 16 values a slice.
        if (plan.splits > 1) {
          CHECK(channels * 256 < std::int64_t{132} * 2048);
          CHECK(plan.slice >= 256 * 16);
          CHECK(plan.blocks() * 256 <= std::int64_t{132} * 2048);  // one wave
        }
      }
    }
  }
  // ResNet-50's last stage at batch 8: 2048 channels of 8 * 7 * 7 values, a warp each, 8 to a block.
  const auto last = channel_reduction_plan::make(2048, 8 * 49, 1, 256, std::int64_t{132} * 2048);
  CHECK(last.lanes == 32);
  CHECK(last.blocks() == 256);
  // ResNet-50's first batch norm at batch 8: 64 channels of 8 * 112 * 112 values fill the device.
  const auto first = channel_reduction_plan::make(64, 8 * 12544, 4, 256, std::int64_t{132} * 2048);
  CHECK(first.splits * 64 * 256 >= std::int64_t{132} * 2048 / 2);
}

TEST_CASE("channels_last reduction plan: every (channel, position) once, warps on neighbours",
          "[reduce_plan]") {
  using tessera::backend::cuda::channels_last_reduction_plan;
  constexpr int block = 256;
  const std::int64_t resident = std::int64_t{132} * 2048;
  // Walk the grid as the kernels do (batch_norm.cuh: channels_last_walk): thread t of block b
  // folds channel channel_of(b, t) at positions first + t / 32, stepping by row_lanes.
  for (const std::int64_t channels :
       {std::int64_t{1}, std::int64_t{3}, std::int64_t{32}, std::int64_t{70}}) {
    for (const std::int64_t positions : {std::int64_t{1}, std::int64_t{7}, std::int64_t{49},
                                         std::int64_t{8 * 196}, std::int64_t{5000}}) {
      const auto plan = channels_last_reduction_plan::make(channels, positions, block, resident);
      CAPTURE(channels, positions, plan.splits, plan.slice);
      REQUIRE(plan.row_lanes * channels_last_reduction_plan::columns == block);
      REQUIRE(plan.splits >= 1);
      REQUIRE(plan.splits * channels <= tessera::backend::cuda::channel_partial_slots(channels));
      REQUIRE(plan.slice % plan.row_lanes == 0);
      std::vector<int> seen(static_cast<std::size_t>(channels * positions), 0);
      std::vector<int> partials(static_cast<std::size_t>(channels * plan.splits), 0);
      for (std::int64_t b = 0; b < plan.blocks(); ++b) {
        const std::int64_t split = plan.split_of(b);
        for (int t = 0; t < block; ++t) {
          const std::int64_t c = plan.channel_of(b, t);
          if (c >= channels) continue;
          // A warp's 32 lanes take 32 neighbouring channels (one run of memory per position).
          REQUIRE(c - plan.channel_of(b, t / 32 * 32) == t % 32);
          if (t / 32 == 0) ++partials[static_cast<std::size_t>(c * plan.splits + split)];
          for (std::int64_t p = plan.first(split) + t / 32; p < plan.last(split);
               p += plan.row_lanes) {
            ++seen[static_cast<std::size_t>(p * channels + c)];
          }
        }
      }
      for (const int n : seen) REQUIRE(n == 1);
      for (const int n : partials) REQUIRE(n == 1);  // one writer per (channel, split)
      if (plan.splits > 1) CHECK(plan.blocks() * block <= resident);  // one wave
    }
  }
  // ResNet-50 at batch 32: the first batch norm (64 channels, 32 * 112 * 112 positions: two
  // groups of channels) and the last stage's (2048 channels, 32 * 49) both fill the device.
  const auto first = channels_last_reduction_plan::make(64, 32 * 12544, block, resident);
  CHECK(first.blocks() * block >= resident / 2);
  CHECK(first.slice >= first.row_lanes * 16);
  const auto last = channels_last_reduction_plan::make(2048, 32 * 49, block, resident);
  CHECK(last.blocks() * block >= resident / 2);
  CHECK(last.slice >= last.row_lanes * 16);
}

TEST_CASE("moments: one pass in float, merged as the kernels merge, matches float64",
          "[reduce_plan]") {
  // Values 1000 + N(0, 2): a sum-of-squares variance in float would lose everything
  // (1000^2 / 4 * 2^-24 is 0.015 of the variance per value, summed over thousands). Each "thread"
  // takes every 256th value in float (deviations from its first value, as the kernel's), the
  // threads merge in float in a tree, the slices in double.
  std::mt19937 rng(5);
  std::normal_distribution<double> normal(1000.0, 2.0);
  const std::int64_t count = 8 * 12544;
  std::vector<float> values(static_cast<std::size_t>(count));
  for (auto& v : values) v = static_cast<float>(normal(rng));
  double mean = 0;
  for (float v : values) mean += v;
  mean /= static_cast<double>(count);
  double var = 0;
  for (float v : values) var += (v - mean) * (v - mean);
  var /= static_cast<double>(count);

  const auto plan = channel_reduction_plan::make(1, count, 1, 256, std::int64_t{132} * 2048);
  moments<double> total;
  for (std::int64_t s = 0; s < plan.splits; ++s) {
    std::vector<moments<float>> threads;
    for (std::int64_t t = 0; t < 256; ++t) {
      float shift = 0, sum = 0, squares = 0, n = 0;
      for (std::int64_t j = plan.first(s) + t; j < plan.last(s); j += 256) {
        const float v = values[static_cast<std::size_t>(j)];
        if (n == 0) shift = v;
        const float d = v - shift;
        sum += d;
        squares += d * d;
        n += 1;
      }
      threads.push_back(moments<float>::from_shifted_sums(n, shift, sum, squares));
    }
    for (std::size_t width = 1; width < threads.size(); width *= 2) {
      for (std::size_t i = 0; i + width < threads.size(); i += 2 * width) {
        threads[i] = merge_moments(threads[i], threads[i + width]);
      }
    }
    total = merge_moments(total, moments<double>{threads[0].count, threads[0].mean, threads[0].m2});
  }
  CHECK(total.count == static_cast<double>(count));
  CHECK(std::abs(total.mean - mean) <= 1e-6 * std::abs(mean));
  CHECK(std::abs(total.m2 / total.count - var) <= 1e-4 * var);
  // Merging an empty set changes nothing; two halves give the whole.
  const moments<double> empty;
  CHECK(merge_moments(total, empty).mean == total.mean);
  CHECK(merge_moments(empty, total).m2 == total.m2);
  const auto a = moments<double>::from_shifted_sums(2, 1.0, 1.0, 1.0);   // values 1, 2
  const auto b = moments<double>::from_shifted_sums(2, 10.0, 2.0, 4.0);  // values 10, 12
  const auto ab = merge_moments(a, b);
  CHECK(ab.count == 4);
  CHECK(ab.mean == 6.25);
  CHECK(std::abs(ab.m2 - (5.25 * 5.25 + 4.25 * 4.25 + 3.75 * 3.75 + 5.75 * 5.75)) < 1e-12);
}

// ---- what one thread folds -------------------------------------------------------------------

using fold = tessera::backend::cuda::thread_fold<tessera::backend::sum_op<float>>;
constexpr float two_24 = 16777216.0f;  // 2^24: adding 1 rounds back to it (ties to even)

/// Folds blocks of 16 values, each block given as its first value followed by 15 zeros, then
/// `last` alone: result() pushes that partial block as the cascade's last.
float fold_blocks(const std::vector<float>& firsts, float last = 0.0f) {
  fold f;
  for (float first : firsts) {
    f.add(first);
    for (int k = 1; k < 16; ++k) f.add(0.0f);
  }
  f.add(last);
  return f.result();
}

TEST_CASE("thread fold: a block of 16 in order, then the blocks pairwise", "[reduce_plan]") {
  // One block, in order: 2^24 + 1 + ... + 1 stays 2^24 (each +1 rounds back); the next block's
  // sixteen 1s make 16, and 2^24 + 16 is exact. A float64 sum would be 2^24 + 31.
  fold f;
  f.add(two_24);
  for (int k = 0; k < 15; ++k) f.add(1.0f);
  for (int k = 0; k < 16; ++k) f.add(1.0f);
  CHECK(f.result() == 16777232.0f);

  // The same through runs of 4 and 16, as the kernels' batches add them.
  fold runs;
  const float first[4] = {two_24, 1.0f, 1.0f, 1.0f};
  const float ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  runs.add_run(first);
  for (int k = 0; k < 3; ++k) runs.add_run(ones);
  float sixteen[16];
  for (float& v : sixteen) v = 1.0f;
  runs.add_run(sixteen);
  CHECK(runs.result() == 16777232.0f);

  // No value, and a partial block: the identity, and the block's own sum.
  CHECK(fold().result() == 0.0f);
  fold three;
  for (int k = 0; k < 3; ++k) three.add(0.5f);
  CHECK(three.result() == 1.5f);
}

TEST_CASE("thread fold: the cascade merges its levels from the earliest blocks on", "[reduce_plan]") {
  // Three blocks 2^24, 1, 1 and a last block 1: (2^24 + 1) rounds to 2^24, (1 + 1) is 2, and
  // 2^24 + 2 is exact. In order they would stay 2^24; float64 says 2^24 + 3.
  CHECK(fold_blocks({two_24, 1.0f, 1.0f}, 1.0f) == 16777218.0f);
  // Six blocks and the last leave three levels: [b0..b3] = 2^24, [b4 b5] = 1, [last] = 1, merged
  // from the earliest: (2^24 + 1) + 1 = 2^24. From the latest it would be (1 + 1) + 2^24.
  CHECK(fold_blocks({two_24, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f}, 1.0f) == two_24);
  // Two blocks and the last: levels 1 and 0, (0.5 + 0.25) + 0.125.
  CHECK(fold_blocks({0.5f, 0.25f}, 0.125f) == 0.875f);
  // 2^20 blocks of 1 (2^24 values), a count with one level: exact, where adding the 2^24 ones in
  // order would stop at 2^24 as well but 2^24 + 16 ones would not.
  fold many;
  for (int b = 0; b < (1 << 20); ++b) {
    const float ones16[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    many.add_run(ones16);
  }
  for (int k = 0; k < 16; ++k) many.add(1.0f);
  CHECK(many.result() == two_24 + 16.0f);
}

TEST_CASE("thread fold: float sums of many values stay within a pairwise bound of float64",
          "[reduce_plan]") {
  std::mt19937_64 random(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (const std::int64_t n : {1, 15, 16, 17, 255, 4096, 100003, 1 << 20}) {
    fold f;
    double exact = 0;
    double magnitude = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = value(random) + 1000.0f;  // a large mean: where in-order sums lose the most
      f.add(v);
      exact += v;
      magnitude += std::abs(v);
    }
    // 16 values in order, then a tree of depth log2(n / 16): at most (16 + log2 n) roundings of
    // the running magnitude.
    const double bound = (16.0 + std::log2(static_cast<double>(n)) + 1.0) * 0x1p-24 * magnitude;
    INFO("n = " << n);
    CHECK(std::abs(static_cast<double>(f.result()) - exact) <= bound);
  }
}

TEST_CASE("batch norm's elementwise passes: 16-byte steps where the layout allows them",
          "[reduce_plan]") {
  using tessera::backend::cuda::channel_map_form;
  using tessera::backend::cuda::choose_channel_map;
  // NCHW planes of a multiple of 4: four elements of one channel a step.
  CHECK(choose_channel_map(256, 56 * 56, 4, true) == channel_map_form::shared_channel);
  CHECK(choose_channel_map(2048, 7 * 7, 4, true) == channel_map_form::single);  // 49 values
  // channels_last ([N * H * W, C, 1]): four neighbouring channels a step when C allows it.
  CHECK(choose_channel_map(256, 1, 4, true) == channel_map_form::neighbouring_channels);
  CHECK(choose_channel_map(3, 1, 4, true) == channel_map_form::single);
  CHECK(choose_channel_map(6, 1, 4, true) == channel_map_form::single);
  // Unaligned pointers or scalar types (double: 2 a step) as the layout says.
  CHECK(choose_channel_map(256, 3136, 4, false) == channel_map_form::single);
  CHECK(choose_channel_map(6, 1, 2, true) == channel_map_form::neighbouring_channels);
  CHECK(choose_channel_map(6, 1, 1, true) == channel_map_form::single);
  // Every form covers positions in whole steps that never cross what it assumes: a shared-channel
  // step stays in one channel's row of l; a neighbouring-channels step in one position's C.
  for (const std::int64_t c : {1, 2, 3, 4, 8, 12, 64}) {
    for (const std::int64_t l : {1, 2, 3, 4, 7, 8, 49}) {
      for (const int vector : {1, 2, 4}) {
        const channel_map_form form = choose_channel_map(c, l, vector, true);
        CAPTURE(c, l, vector);
        const std::int64_t total = 3 * c * l;
        const int step = form == channel_map_form::single ? 1 : vector;
        REQUIRE(total % step == 0);
        for (std::int64_t i = 0; i < total; i += step) {
          const std::int64_t channel = (i / l) % c;
          for (int k = 0; k < step; ++k) {
            const std::int64_t expected = ((i + k) / l) % c;
            const std::int64_t given =
                form == channel_map_form::neighbouring_channels ? channel + k : channel;
            REQUIRE(given == expected);
          }
        }
      }
    }
  }
}

}  // namespace reduce_plan_test
