// Reductions on the CPU (their operators, which the CUDA backend shares, are backend/reduce_ops.hpp).
// A reduction reads its input through an expression evaluator (backend/evaluator.hpp), so
// `sum(a * b)` never materialises `a * b`. Values are folded in blocks by several independent accumulators (vectorisable) and the
// block results are combined pairwise (a cascade), so float sums stay accurate over many elements.
// Threads take contiguous ranges and their partials are combined in index order: a result is
// deterministic for a given thread count.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/backend/cpu/strided_loop.hpp"
#include "tessera/backend/cpu/thread_pool.hpp"
#include "tessera/backend/evaluator.hpp"
#include "tessera/backend/functors.hpp"
#include "tessera/backend/reduce_ops.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/shape.hpp"


namespace tessera::backend::cpu {

// ---- blocked, pairwise folding ---------------------------------------------------------------

/// Independent accumulators per block: 16 floats are four SSE or two AVX registers, enough
/// parallel add chains for the loop to run at memory speed.
inline constexpr int reduce_lanes = 16;
/// Elements per block: each lane folds 64 of them (an error of at most 64 half-ulps of its sum)
/// before the block joins the pairwise cascade; the cascade's work per block is then a few
/// percent of the block's.
inline constexpr std::int64_t reduce_block = 1024;

/// Pairwise combination of a stream of block results (a binary counter: level k holds the merge
/// of 2^k blocks), so n blocks are combined in a tree of depth log2(n) with O(log n) memory.
template <class Op>
class cascade {
 public:
  using acc_type = typename Op::acc_type;

  void push(acc_type block) {
    std::uint64_t carry = pushes_++;
    int level = 0;
    for (; carry & 1; carry >>= 1, ++level) block = Op::merge(levels_[level], block);
    levels_[level] = block;
  }
  /// The merge of every block pushed (the identity for none), earlier blocks on the left.
  acc_type result() const {
    acc_type total = Op::identity();
    for (int level = std::bit_width(pushes_) - 1; level >= 0; --level) {
      if ((pushes_ >> level) & 1) total = Op::merge(total, levels_[level]);
    }
    return total;
  }

 private:
  acc_type levels_[64];  // level k is set while bit k of pushes_ is (not zeroed: per-row cost)
  std::uint64_t pushes_ = 0;
};

/// True when Op's result depends on the positions lifted with each element (argmax, argmin).
template <class Op>
inline constexpr bool uses_positions = requires(typename Op::acc_type acc) { acc.index; };

/// Element j of a run of the expression, lifted to Op's accumulator: the value at
/// Access{offset + j} (linear_access, or row_access in a row placed by bind_row), at position
/// index + j (times index_step when Strided). One type per (Op, expression, access kind), so every
/// loop that folds such runs shares one fold_block.
template <class Op, class V, class Evaluator, class Access, bool Strided = false>
struct run_reader {
  const Evaluator* evaluator;
  std::int64_t offset;
  std::int64_t index;
  std::int64_t index_step = 1;

  typename Op::acc_type operator()(std::int64_t j) const {
    const std::int64_t position = Strided ? index + j * index_step : index + j;
    return Op::lift(read_as<V>(*evaluator, Access{offset + j}), position);
  }
};

/// The merge of get(first) .. get(first + count - 1) (each already lifted to Op::acc_type) for a
/// count of at most reduce_block (any count for an exact Op): reduce_lanes independent
/// accumulators (the loop the compiler vectorises), then a tree over the lanes. Out of line: one
/// copy per reader, however many loops call it (a call per block costs little).
template <class Op, class Get>
TESSERA_CPU_OUT_OF_LINE typename Op::acc_type fold_block(const Get& get, std::int64_t first,
                                                         std::int64_t count) {
  using acc_type = typename Op::acc_type;
  acc_type total = Op::identity();
  const std::int64_t full = count - count % reduce_lanes;
  if (full > 0) {
    acc_type lane[reduce_lanes];
    for (auto& a : lane) a = Op::identity();
    for (std::int64_t k = 0; k < full; k += reduce_lanes) {
      for (int l = 0; l < reduce_lanes; ++l) lane[l] = Op::step(lane[l], get(first + k + l));
    }
    for (int width = reduce_lanes / 2; width > 0; width /= 2) {
      for (int l = 0; l < width; ++l) lane[l] = Op::merge(lane[l], lane[l + width]);
    }
    total = lane[0];
  }
  for (std::int64_t j = full; j < count; ++j) total = Op::step(total, get(first + j));
  return total;
}

/// Folds get(0) .. get(count - 1) into `sums`, one block at a time (exact operators in one
/// block: fewer merges, and each lane's running best changes rarely, so its branch predicts).
template <class Op, class Get>
void fold(cascade<Op>& sums, const Get& get, std::int64_t count) {
  // The loop in the else branch, not after a return: nvcc warns (#128, an error under
  // -Werror=all-warnings) about a loop it cannot reach.
  if constexpr (Op::exact) {
    if (count > 0) sums.push(fold_block<Op>(get, 0, count));
  } else {
    for (std::int64_t first = 0; first < count; first += reduce_block) {
      sums.push(fold_block<Op>(get, first, std::min(reduce_block, count - first)));
    }
  }
}

/// The merge of get(0) .. get(count - 1): one block directly, longer runs through a cascade.
template <class Op, class Get>
typename Op::acc_type fold_all(const Get& get, std::int64_t count) {
  if (Op::exact || count <= reduce_block) return fold_block<Op>(get, 0, count);
  cascade<Op> sums;
  fold(sums, get, count);
  return sums.result();
}

/// Splits [0, n) over parallel_for's threads; chunk(first, last) returns the accumulator of its
/// range. Each chunk's partial has its own slot, merged in index order, so the result depends only
/// on the thread count.
template <class Op, class Chunk>
typename Op::acc_type reduce_chunks(std::int64_t n, std::int64_t grain, Chunk&& chunk) {
  using acc_type = typename Op::acc_type;
  const std::int64_t chunks = detail::planned_chunks(n, grain);
  // A single chunk is merged into the identity too, as several are below (a sum of -0.0 gives
  // +0.0 either way).
  if (chunks <= 1) return Op::merge(Op::identity(), chunk(0, n));
  // Not std::vector: acc_type may be bool.
  const auto partials = std::make_unique<acc_type[]>(static_cast<std::size_t>(chunks));
  for (std::int64_t c = 0; c < chunks; ++c) partials[c] = Op::identity();
  auto body = [&](std::int64_t c, std::int64_t first, std::int64_t last) {
    partials[c] = chunk(first, last);
  };
  detail::run_chunks(0, n, chunks, body);
  acc_type total = Op::identity();
  for (std::int64_t c = 0; c < chunks; ++c) total = Op::merge(total, partials[c]);
  return total;
}

/// Row-major index of `position` over `shape` (ranks 0..max_dims).
inline void unravel(std::int64_t position, const Shape& shape, std::int64_t* index) {
  for (int d = shape.size() - 1; d >= 0; --d) {
    index[d] = position % shape[d];
    position /= shape[d];
  }
}

/// Advances a row-major index over the first `rank` dimensions of `shape` (an odometer).
inline void next_index(std::int64_t* index, const Shape& shape, int rank) {
  for (int d = rank - 1; d >= 0; --d) {
    if (++index[d] < shape[d]) return;
    index[d] = 0;
  }
}

template <std::size_t L>
bool all_row_major(const Shape& shape, const std::array<Strides, L>& leaf_strides) {
  for (const Strides& strides : leaf_strides) {
    if (!is_row_major(shape, strides)) return false;
  }
  return true;
}

// ---- layouts of a reduction along one dimension -------------------------------------------------

/// A shape split into the kept dimensions (merged where every operand allows; operand 0 is the
/// output, 1..L the leaves) and the one reduced (or softmax) dimension.
template <std::size_t L>
struct split_layout {
  strided_layout<static_cast<int>(L + 1)> kept;  // without the dimension
  std::int64_t extent = 0;                       // its extent
  std::array<std::int64_t, L + 1> stride{};      // each operand's stride along it

  split_layout(const Shape& shape, int dim, const Strides& out_strides,
               const std::array<Strides, L>& leaf_strides)
      : kept(without(shape, dim), without_all(dim, out_strides, leaf_strides)), extent(shape[dim]) {
    stride[0] = out_strides[dim];
    for (std::size_t k = 0; k < L; ++k) stride[k + 1] = leaf_strides[k][dim];
  }

  /// True when walking the kept dimensions innermost reads memory more contiguously than walking
  /// the dimension itself (sum(x, 0) of a row-major matrix): count the operands with unit stride
  /// in each. Ties go to the dimension (one row per output, the simpler loop).
  bool kept_is_inner() const {
    const int rank = kept.shape.size();
    if (rank == 0) return false;
    int along_dim = 0;
    int along_kept = 0;
    for (std::size_t k = 0; k <= L; ++k) {
      if (stride[k] == 1 || stride[k] == -1) ++along_dim;
      const std::int64_t s = kept.strides[k][rank - 1];
      if (s == 1 || s == -1) ++along_kept;
    }
    return along_kept > along_dim;
  }

  /// Leaf strides with the dimension innermost: [kept..., dim].
  std::array<Strides, L> dim_innermost() const {
    std::array<Strides, L> out;
    for (std::size_t k = 0; k < L; ++k) {
      out[k] = kept.strides[k + 1];
      out[k].push_back(stride[k + 1]);
    }
    return out;
  }
  /// Leaf strides with the dimension second innermost: [kept outer..., dim, kept last].
  std::array<Strides, L> dim_second_innermost() const {
    const int rank = kept.shape.size();
    std::array<Strides, L> out;
    for (std::size_t k = 0; k < L; ++k) {
      out[k] = kept.strides[k + 1];
      out[k].insert(rank - 1, stride[k + 1]);
    }
    return out;
  }

 private:
  static Shape without(const Shape& shape, int dim) {
    Shape out = shape;
    out.erase(dim);
    return out;
  }
  static std::array<Strides, L + 1> without_all(int dim, const Strides& out_strides,
                                                const std::array<Strides, L>& leaf_strides) {
    std::array<Strides, L + 1> out;
    out[0] = without(out_strides, dim);
    for (std::size_t k = 0; k < L; ++k) out[k + 1] = without(leaf_strides[k], dim);
    return out;
  }
};

/// Most outputs per tile when outputs are folded side by side: 1024 floats are a 4 KiB page of
/// each input row, long enough for the hardware prefetcher to stream it (with short tiles the
/// loop jumps to a new page every few elements and waits on memory).
inline constexpr int max_output_tile = 1024;

/// Tile width for `outputs` outputs of rows `width` long: as wide as allowed while leaving each
/// thread two tiles.
inline int output_tile_for(std::int64_t outputs, std::int64_t width) {
  const std::int64_t per_thread =
      outputs / (2 * static_cast<std::int64_t>(tessera::cpu::num_threads()));
  const std::int64_t tile = std::clamp<std::int64_t>(per_thread / 16 * 16, 64, max_output_tile);
  return static_cast<int>(std::min(tile, width));
}

/// Rows a lane folds before its block joins the lane's cascade.
inline constexpr std::int64_t lane_block_rows = 16;

/// True after row r when a lane's block joins its cascade: every lane_block_rows rows for a
/// rounding Op, only after the last row for an exact one.
template <class Op>
constexpr bool ends_lane_block(std::int64_t r, std::int64_t extent) {
  return r + 1 == extent || (!Op::exact && (r + 1) % lane_block_rows == 0);
}

/// The accumulators of up to max_output_tile outputs folded side by side (outputs contiguous in the
/// innermost kept dimension): a cascade per lane, all lanes pushing together.
template <class Op>
class lane_cascade {
 public:
  using op_type = Op;
  using acc_type = typename Op::acc_type;

  void reset() { pushes_ = 0; }
  /// Pushes block[0 .. n) (clobbering it).
  void push(acc_type* block, int n) {
    std::uint64_t carry = pushes_++;
    std::size_t level = 0;
    for (; carry & 1; carry >>= 1, ++level) {
      const auto& earlier = levels_[level];
      for (int w = 0; w < n; ++w) block[w] = Op::merge(earlier[w], block[w]);
    }
    if (levels_.size() <= level) levels_.resize(level + 1);
    std::copy(block, block + n, levels_[level].begin());
  }
  /// out[w] = the merge of every block pushed for lane w.
  void result(acc_type* out, int n) const {
    for (int w = 0; w < n; ++w) out[w] = Op::identity();
    for (int level = std::bit_width(pushes_) - 1; level >= 0; --level) {
      if (!((pushes_ >> level) & 1)) continue;
      const auto& sums = levels_[static_cast<std::size_t>(level)];
      for (int w = 0; w < n; ++w) out[w] = Op::merge(out[w], sums[w]);
    }
  }

 private:
  std::vector<std::array<acc_type, max_output_tile>> levels_;  // grows to log2(blocks) levels
  std::uint64_t pushes_ = 0;
};

/// A shape and its leaves' strides with the dimensions in memory order (larger strides outside,
/// as PyTorch's TensorIterator orders them), then merged. Operand 0 is the row-major strides of
/// the logical shape, so each element's logical position stays known.
template <std::size_t L>
struct memory_order_layout {
  strided_layout<static_cast<int>(L + 1)> merged;

  memory_order_layout(const Shape& shape, const std::array<Strides, L>& leaf_strides)
      : merged(sorted(shape, leaf_strides)) {}

 private:
  // True when dimension `a` should be walked inside dimension `b`: the first leaf that steps
  // through both (stride 0 says nothing) has a smaller stride in a.
  static bool inside(int a, int b, const std::array<Strides, L>& leaf_strides) {
    for (const Strides& strides : leaf_strides) {
      const std::int64_t sa = strides[a] < 0 ? -strides[a] : strides[a];
      const std::int64_t sb = strides[b] < 0 ? -strides[b] : strides[b];
      if (sa == 0 || sb == 0 || sa == sb) continue;
      return sa < sb;
    }
    return false;
  }
  static strided_layout<static_cast<int>(L + 1)> sorted(
      const Shape& shape, const std::array<Strides, L>& leaf_strides) {
    const int rank = shape.size();
    std::array<int, max_dims> order{};
    for (int d = 0; d < rank; ++d) order[d] = d;
    // Insertion sort: stable, and undecided pairs (broadcast dimensions) keep the logical order.
    for (int i = 1; i < rank; ++i) {
      for (int j = i; j > 0 && inside(order[j - 1], order[j], leaf_strides); --j) {
        std::swap(order[j - 1], order[j]);
      }
    }
    const Strides logical = shape.contiguous_strides();
    Shape extents;
    std::array<Strides, L + 1> strides;
    for (int k = 0; k < rank; ++k) {
      const int d = order[k];
      extents.push_back(shape[d]);
      strides[0].push_back(logical[d]);
      for (std::size_t leaf = 0; leaf < L; ++leaf)
        strides[leaf + 1].push_back(leaf_strides[leaf][d]);
    }
    return strided_layout<static_cast<int>(L + 1)>(extents, strides);
  }
};

// ---- full reductions ------------------------------------------------------------------------

/// *out = Finish(Op over every element of the expression of dtype V and shape `shape`), one
/// threaded pass (one launch; the few per-thread partials are merged on the caller). Elements are
/// numbered in row-major order (argmax gives that flattened position). `leaf_strides` are the
/// leaves' strides expanded to `shape`; make_evaluator(strides, rank) builds the evaluator.
template <class Op, class V, class Finish, class Out, std::size_t L, class MakeEvaluator>
void reduce_all(Out* out, const Shape& shape, const std::array<Strides, L>& leaf_strides,
                MakeEvaluator&& make_evaluator) {
  using acc_type = typename Op::acc_type;
  profiler::count_launch();
  const std::int64_t n = shape.numel();
  if (n == 0) {
    *out = Finish::template apply<Out>(Op::identity(), 0);
    return;
  }
  if (all_row_major(shape, leaf_strides)) {
    const auto evaluator = make_evaluator(leaf_strides.data(), shape.size());
    using reader = run_reader<Op, V, std::remove_cvref_t<decltype(evaluator)>, linear_access>;
    const acc_type total =
        reduce_chunks<Op>(n, grain_size, [&](std::int64_t first, std::int64_t last) {
          return fold_all<Op>(reader{&evaluator, first, first}, last - first);
        });
    *out = Finish::template apply<Out>(total, n);
    return;
  }
  // Walk in memory order: dimensions sorted so the leaves' strides decrease (as PyTorch's
  // TensorIterator does), so that a transposed input is read along its rows, not down its columns.
  // Operand 0 carries each element's row-major position in the logical shape (argmax reports it).
  const memory_order_layout<L> layout(shape, leaf_strides);
  const int rank = layout.merged.shape.size();
  const Shape& extents = layout.merged.shape;
  const auto& strides = layout.merged.strides;
  if (rank == 0) {  // one element behind unusual strides
    const auto evaluator = make_evaluator(strides.data() + 1, 0);
    *out = Finish::template apply<Out>(
        Op::merge(Op::identity(), Op::lift(read_as<V>(evaluator, index_access{nullptr}), 0)), 1);
    return;
  }
  const std::int64_t inner = extents[rank - 1];
  const std::int64_t position_step = strides[0][rank - 1];
  const auto prototype = make_evaluator(strides.data() + 1, rank);
  // Positions step through the logical order; only argmax and argmin read them.
  using reader = run_reader<Op, V, std::remove_cvref_t<decltype(prototype)>, row_access,
                            uses_positions<Op>>;
  const acc_type total =
      reduce_chunks<Op>(n, grain_size, [&](std::int64_t first, std::int64_t last) {
        auto evaluator = prototype;
        std::int64_t index[max_dims] = {};
        unravel(first, extents, index);
        cascade<Op> sums;
        // One segment per row: place the row once, then fold along it. The cascade spans rows, so
        // short rows still sum pairwise.
        for (std::int64_t i = first; i < last;) {
          const std::int64_t column = index[rank - 1];
          const std::int64_t length = std::min(inner - column, last - i);
          std::int64_t row_position = 0;
          for (int d = 0; d + 1 < rank; ++d) row_position += index[d] * strides[0][d];
          evaluator.bind_row(index);
          fold(sums,
               reader{&evaluator, column, row_position + column * position_step, position_step},
               length);
          i += length;
          index[rank - 1] = 0;
          next_index(index, extents, rank - 1);
        }
        return sums.result();
      });
  *out = Finish::template apply<Out>(total, n);
}

// ---- reductions along one dimension -------------------------------------------------------------

/// out[o] = Finish(Op over dimension `dim` of the expression), for every position o of the kept
/// dimensions in row-major order (out is contiguous; keepdim does not change it). One launch.
/// Outputs run in parallel; a row is folded like a full reduction (blocked, pairwise). When the
/// kept dimensions are the contiguous ones (sum(x, 0)), tiles of neighbouring outputs are folded
/// side by side instead, so every input row is read contiguously. Few outputs with long rows
/// split each row over the threads.
template <class Op, class V, class Finish, class Out, std::size_t L, class MakeEvaluator>
void reduce_dim(Out* out, const Shape& shape, int dim, const std::array<Strides, L>& leaf_strides,
                MakeEvaluator&& make_evaluator) {
  using acc_type = typename Op::acc_type;
  profiler::count_launch();
  const std::int64_t extent = shape[dim];
  std::int64_t outputs = 1;
  for (int d = 0; d < shape.size(); ++d) {
    if (d != dim) outputs *= shape[d];
  }
  if (outputs == 0) return;
  if (extent == 0) {
    for (std::int64_t o = 0; o < outputs; ++o)
      out[o] = Finish::template apply<Out>(Op::identity(), 0);
    return;
  }
  const bool few_outputs = outputs < tessera::cpu::num_threads() && extent >= 2 * grain_size;

  // Folds every row: place_row(evaluator, o, first) places row o and returns the reader of its
  // elements from `first` on. Few outputs split each row over the threads; otherwise each
  // thread takes whole rows.
  auto run_rows = [&](const auto& prototype, auto place_row) {
    auto fold_row = [&](auto& evaluator, std::int64_t o, std::int64_t first, std::int64_t last) {
      return fold_all<Op>(place_row(evaluator, o, first), last - first);
    };
    if (few_outputs) {
      for (std::int64_t o = 0; o < outputs; ++o) {
        const acc_type total =
            reduce_chunks<Op>(extent, grain_size, [&](std::int64_t first, std::int64_t last) {
              auto evaluator = prototype;
              return fold_row(evaluator, o, first, last);
            });
        out[o] = Finish::template apply<Out>(total, extent);
      }
      return;
    }
    parallel_for(0, outputs, std::max<std::int64_t>(1, grain_size / extent),
                 [&](std::int64_t first, std::int64_t last) {
                   auto evaluator = prototype;
                   for (std::int64_t o = first; o < last; ++o) {
                     out[o] = Finish::template apply<Out>(fold_row(evaluator, o, 0, extent), extent);
                   }
                 });
  };

  std::int64_t after = 1;  // elements between two neighbours along dim
  for (int d = dim + 1; d < shape.size(); ++d) after *= shape[d];
  if (after == 1 && all_row_major(shape, leaf_strides)) {
    // Rows are contiguous and every leaf reads at the same linear index: element r of row o is
    // o * extent + r.
    const auto evaluator = make_evaluator(leaf_strides.data(), shape.size());
    using reader = run_reader<Op, V, std::remove_cvref_t<decltype(evaluator)>, linear_access>;
    run_rows(evaluator, [extent](const auto& e, std::int64_t o, std::int64_t first) {
      return reader{&e, o * extent + first, first};
    });
    return;
  }

  const split_layout<L> layout(shape, dim, Shape::filled(shape.size(), 0), leaf_strides);
  const Shape& kept = layout.kept.shape;
  const int kept_rank = kept.size();
  if (!layout.kept_is_inner() || few_outputs) {
    const auto strides = layout.dim_innermost();
    const auto evaluator = make_evaluator(strides.data(), kept_rank + 1);
    using reader = run_reader<Op, V, std::remove_cvref_t<decltype(evaluator)>, row_access>;
    run_rows(evaluator, [&kept](auto& e, std::int64_t o, std::int64_t first) {
      std::int64_t index[max_dims] = {};
      unravel(o, kept, index);
      e.bind_row(index);
      return reader{&e, first, first};
    });
    return;
  }

  // Neighbouring outputs side by side: for each row r of the reduced dimension, a tile of
  // neighbouring outputs reads its elements contiguously and folds them into per-lane blocks.
  const auto strides = layout.dim_second_innermost();
  const auto prototype = make_evaluator(strides.data(), kept_rank + 1);
  const std::int64_t width = kept[kept_rank - 1];
  const int tile = output_tile_for(outputs, width);
  const std::int64_t tiles = (width + tile - 1) / tile;
  const std::int64_t tasks = outputs / width * tiles;
  const std::int64_t tile_work = extent * tile;
  parallel_for(0, tasks, std::max<std::int64_t>(1, grain_size / tile_work),
               [&](std::int64_t first, std::int64_t last) {
                 auto evaluator = prototype;
                 lane_cascade<Op> sums;
                 // Not std::vector: acc_type may be bool.
                 const auto block_storage =
                     std::make_unique<acc_type[]>(static_cast<std::size_t>(tile));
                 acc_type* block = block_storage.get();
                 for (std::int64_t task = first; task < last; ++task) {
                   const std::int64_t outer = task / tiles;
                   const std::int64_t start = task % tiles * tile;
                   const int lanes = static_cast<int>(std::min<std::int64_t>(tile, width - start));
                   std::int64_t index[max_dims] = {};
                   std::int64_t rest = outer;
                   for (int d = kept_rank - 2; d >= 0; --d) {
                     index[d] = rest % kept[d];
                     rest /= kept[d];
                   }
                   sums.reset();
                   std::fill(block, block + lanes, Op::identity());
                   for (std::int64_t r = 0; r < extent; ++r) {
                     index[kept_rank - 1] = r;
                     evaluator.bind_row(index);
                     for (int w = 0; w < lanes; ++w) {
                       block[w] = Op::step(
                           block[w], Op::lift(read_as<V>(evaluator, row_access{start + w}), r));
                     }
                     if (ends_lane_block<Op>(r, extent)) {
                       sums.push(block, lanes);
                       std::fill(block, block + lanes, Op::identity());
                     }
                   }
                   sums.result(block, lanes);
                   Out* out_row = out + outer * width + start;
                   for (int w = 0; w < lanes; ++w) {
                     out_row[w] = Finish::template apply<Out>(block[w], extent);
                   }
                 }
               });
}

// ---- softmax --------------------------------------------------------------------------------

/// out = softmax (or log_softmax when Log) of the expression along `dim`: per row, m = max,
/// s = sum exp(x - m), out = exp(x - m) / s (or x - m - log s), computed in F's compute type and
/// stored as F. The expression is read two or three times per row, never stored: when F is its
/// own compute type (float, double) softmax keeps exp(x - m) in the output and divides it in
/// place, so each element costs one exp. `out` is contiguous with the expression's shape. One
/// launch.
template <bool Log, class V, class F, std::size_t L, class MakeEvaluator>
void softmax(F* out, const Shape& shape, int dim, const std::array<Strides, L>& leaf_strides,
             MakeEvaluator&& make_evaluator) {
  using A = opmath_t<F>;
  // Storing exp(x - m) in a 16-bit output and dividing it there would round twice.
  constexpr bool keep_exponentials = !Log && std::is_same_v<F, A>;
  profiler::count_launch();
  const std::int64_t n = shape.numel();
  if (n == 0) return;
  const std::int64_t extent = shape[dim];
  const std::int64_t rows = n / extent;

  // One row: x(r) reads element r, slot(r) is its output element.
  auto softmax_row = [](std::int64_t length, auto&& x, auto&& slot) {
    const A m = fold_all<max_op<A>>([&](std::int64_t r) { return x(r); }, length);
    if constexpr (keep_exponentials) {
      const A s = fold_all<sum_op<A>>(
          [&](std::int64_t r) {
            const A e = ops::exp{}(A(x(r) - m));
            slot(r) = e;
            return e;
          },
          length);
      for (std::int64_t r = 0; r < length; ++r) slot(r) = A(slot(r) / s);
    } else {
      const A s =
          fold_all<sum_op<A>>([&](std::int64_t r) { return ops::exp{}(A(x(r) - m)); }, length);
      if constexpr (Log) {
        const A log_s = ops::log{}(s);
        for (std::int64_t r = 0; r < length; ++r) slot(r) = store_cast<F>(A(x(r) - m - log_s));
      } else {
        for (std::int64_t r = 0; r < length; ++r) {
          slot(r) = store_cast<F>(A(ops::exp{}(A(x(r) - m)) / s));
        }
      }
    }
  };

  std::int64_t after = 1;
  for (int d = dim + 1; d < shape.size(); ++d) after *= shape[d];
  if (after == 1 && all_row_major(shape, leaf_strides)) {
    const auto evaluator = make_evaluator(leaf_strides.data(), shape.size());
    parallel_for(0, rows, std::max<std::int64_t>(1, grain_size / extent),
                 [&](std::int64_t first, std::int64_t last) {
                   for (std::int64_t o = first; o < last; ++o) {
                     const std::int64_t base = o * extent;
                     softmax_row(
                         extent,
                         [&](std::int64_t r) {
                           return static_cast<A>(read_as<V>(evaluator, linear_access{base + r}));
                         },
                         [&](std::int64_t r) -> F& { return out[base + r]; });
                   }
                 });
    return;
  }

  const Strides out_strides = shape.contiguous_strides();
  const split_layout<L> layout(shape, dim, out_strides, leaf_strides);
  const Shape& kept = layout.kept.shape;
  const int kept_rank = kept.size();
  const std::int64_t out_step = layout.stride[0];
  if (!layout.kept_is_inner()) {
    const auto strides = layout.dim_innermost();
    const auto prototype = make_evaluator(strides.data(), kept_rank + 1);
    parallel_for(0, rows, std::max<std::int64_t>(1, grain_size / extent),
                 [&](std::int64_t first, std::int64_t last) {
                   auto evaluator = prototype;
                   std::int64_t index[max_dims] = {};
                   unravel(first, kept, index);
                   for (std::int64_t o = first; o < last; ++o) {
                     evaluator.bind_row(index);
                     std::int64_t out_offset = 0;
                     for (int d = 0; d < kept_rank; ++d)
                       out_offset += index[d] * layout.kept.strides[0][d];
                     F* out_row = out + out_offset;
                     softmax_row(
                         extent,
                         [&](std::int64_t r) {
                           return static_cast<A>(read_as<V>(evaluator, row_access{r}));
                         },
                         [&](std::int64_t r) -> F& { return out_row[r * out_step]; });
                     next_index(index, kept, kept_rank);
                   }
                 });
    return;
  }

  // Rows side by side (softmax over a dimension that is not the contiguous one): a tile of
  // neighbouring rows makes the passes together, reading each input row contiguously.
  const auto strides = layout.dim_second_innermost();
  const auto prototype = make_evaluator(strides.data(), kept_rank + 1);
  const std::int64_t width = kept[kept_rank - 1];
  const std::int64_t out_lane_step = layout.kept.strides[0][kept_rank - 1];
  const int tile = output_tile_for(rows, width);
  const std::int64_t tiles = (width + tile - 1) / tile;
  const std::int64_t tasks = rows / width * tiles;
  const std::int64_t tile_work = extent * tile;
  parallel_for(
      0, tasks, std::max<std::int64_t>(1, grain_size / tile_work),
      [&](std::int64_t first, std::int64_t last) {
        auto evaluator = prototype;
        lane_cascade<max_op<A>> maxima;
        lane_cascade<sum_op<A>> sums;
        std::vector<A> lane_values(2 * static_cast<std::size_t>(tile));
        A* m = lane_values.data();
        A* s = m + tile;
        for (std::int64_t task = first; task < last; ++task) {
          const std::int64_t outer = task / tiles;
          const std::int64_t start = task % tiles * tile;
          const int lanes = static_cast<int>(std::min<std::int64_t>(tile, width - start));
          std::int64_t index[max_dims] = {};
          std::int64_t rest = outer;
          std::int64_t out_offset = start * out_lane_step;
          for (int d = kept_rank - 2; d >= 0; --d) {
            index[d] = rest % kept[d];
            rest /= kept[d];
            out_offset += index[d] * layout.kept.strides[0][d];
          }
          auto slot = [&](std::int64_t r, int w) -> F& {
            return out[out_offset + r * out_step + w * out_lane_step];
          };
          // Visits every row r of the tile: fn(r, x) with x(w) the value of lane w.
          auto each_row = [&](auto&& fn) {
            for (std::int64_t r = 0; r < extent; ++r) {
              index[kept_rank - 1] = r;
              evaluator.bind_row(index);
              fn(r, [&](int w) {
                return static_cast<A>(read_as<V>(evaluator, row_access{start + w}));
              });
            }
          };
          // Folds value(acc, x, r, w) per lane into `into`, pairwise over blocks of rows.
          auto fold_lanes = [&](auto& cascade_of_lanes, A* into, auto&& value, A identity) {
            cascade_of_lanes.reset();
            std::fill(into, into + lanes, identity);
            each_row([&](std::int64_t r, auto&& x) {
              for (int w = 0; w < lanes; ++w) into[w] = value(into[w], x(w), r, w);
              if (ends_lane_block<
                      typename std::remove_cvref_t<decltype(cascade_of_lanes)>::op_type>(r,
                                                                                         extent)) {
                cascade_of_lanes.push(into, lanes);
                std::fill(into, into + lanes, identity);
              }
            });
            cascade_of_lanes.result(into, lanes);
          };
          fold_lanes(
              maxima, m, [](A acc, A x, std::int64_t, int) { return max_op<A>::merge(acc, x); },
              max_op<A>::identity());
          fold_lanes(
              sums, s,
              [&](A acc, A x, std::int64_t r, int w) {
                const A e = ops::exp{}(A(x - m[w]));
                if constexpr (keep_exponentials) slot(r, w) = e;
                (void)r;
                return A(acc + e);
              },
              A(0));
          if constexpr (keep_exponentials) {
            for (std::int64_t r = 0; r < extent; ++r) {
              for (int w = 0; w < lanes; ++w) slot(r, w) = A(slot(r, w) / s[w]);
            }
          } else {
            if constexpr (Log) {
              for (int w = 0; w < lanes; ++w) s[w] = ops::log{}(s[w]);
            }
            each_row([&](std::int64_t r, auto&& x) {
              for (int w = 0; w < lanes; ++w) {
                const A shifted = A(x(w) - m[w]);
                if constexpr (Log) {
                  slot(r, w) = store_cast<F>(A(shifted - s[w]));
                } else {
                  slot(r, w) = store_cast<F>(A(ops::exp{}(shifted) / s[w]));
                }
              }
            });
          }
        }
      });
}

}  // namespace tessera::backend::cpu
