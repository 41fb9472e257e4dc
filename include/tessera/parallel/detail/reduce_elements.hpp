// The CPU reduction engine: reduce_elements combines members' buffers element by element, in place
// or not, over a range of elements (a member's share), in the accumulator type: the CPU
// reductions of the Communicator and DataParallel's gradient sums (detail/overlapped_reduction.hpp)
// go through it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tessera/core/half.hpp"
#include "tessera/parallel/reduce_op.hpp"

namespace tessera::parallel::detail {

template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// The type values are combined in: float for half and bfloat16 (rounded once at the end), T else.
template <class T>
using reduce_accumulator_t = std::conditional_t<is_16bit_float_v<T>, float, T>;

template <class T>
inline constexpr bool is_floating_dtype_v =
    std::is_floating_point_v<T> || is_16bit_float_v<T>;

template <ReduceOp Op, class A>
inline A combine(A a, A b) noexcept {
  if constexpr (std::is_same_v<A, bool>) {
    return (Op == ReduceOp::sum || Op == ReduceOp::max) ? (a || b) : (a && b);
  } else if constexpr (std::is_integral_v<A>) {
    // Through uint64: wraps modulo 2^64 without undefined behaviour; the conversion back keeps
    // the low bits (C++20), i.e. wraps modulo 2^bits as PyTorch's integer tensors do.
    const auto ua = static_cast<std::uint64_t>(a), ub = static_cast<std::uint64_t>(b);
    if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) return static_cast<A>(ua + ub);
    if constexpr (Op == ReduceOp::product) return static_cast<A>(ua * ub);
    if constexpr (Op == ReduceOp::max) return a > b ? a : b;
    if constexpr (Op == ReduceOp::min) return a < b ? a : b;
  } else {
    if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) return a + b;
    if constexpr (Op == ReduceOp::product) return a * b;
    // NaN propagates (torch.maximum / torch.minimum).
    if constexpr (Op == ReduceOp::max) return (a != a || a > b) ? a : b;
    if constexpr (Op == ReduceOp::min) return (a != a || a < b) ? a : b;
  }
}

// The loops of reduce_two, restrict-qualified parameters each (GCC trusts restrict on
// parameters): t[i] = x[i] op t[i] or t[i] op y[i], out[i] = x[i] op y[i], and both of a
// two-member all_reduce's buffers set to their combination.
template <ReduceOp Op, class T>
inline T combine_values(T x, T y) noexcept {
  using A = reduce_accumulator_t<T>;
  return static_cast<T>(combine<Op>(static_cast<A>(x), static_cast<A>(y)));
}
template <ReduceOp Op, class T>
void combine_into_first(T* __restrict t, const T* __restrict y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) t[i] = combine_values<Op>(t[i], y[i]);
}
template <ReduceOp Op, class T>
void combine_into_second(const T* __restrict x, T* __restrict t, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) t[i] = combine_values<Op>(x[i], t[i]);
}
template <ReduceOp Op, class T>
void combine_to(const T* __restrict x, const T* __restrict y, T* __restrict out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = combine_values<Op>(x[i], y[i]);
}
template <ReduceOp Op, class T>
void combine_both(T* __restrict x, T* __restrict y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = y[i] = combine_values<Op>(x[i], y[i]);
}

/// Two sources a and b combined in one pass, no partial buffer, where the targets are one buffer
/// (a source or neither) or exactly a and b (a two-member all_reduce). Returns false, having
/// done nothing, for any other aliasing.
template <ReduceOp Op, class T>
bool reduce_two(const T* a, const T* b, T* const* targets, int target_count, std::int64_t first,
                std::int64_t last) {
  if (a == b) return false;
  const std::int64_t n = last - first;
  if (target_count == 1) {
    T* t = targets[0];
    if (t == a) {
      combine_into_first<Op>(t + first, b + first, n);
    } else if (t == b) {
      combine_into_second<Op>(a + first, t + first, n);
    } else {
      combine_to<Op>(a + first, b + first, t + first, n);
    }
    return true;
  }
  if (target_count == 2 && targets[0] == a && targets[1] == b) {
    combine_both<Op>(targets[0] + first, targets[1] + first, n);
    return true;
  }
  return false;
}

/// targets[t][i] = op over s of sources[s][i], for i in [first, last), each target written after
/// every source of that block was read (so targets may be sources: in-place). Combines in member
/// order, in the accumulator type, blocks of 1024 elements so the partial stays in L1 (two
/// sources: reduce_two's single pass where it applies).
template <ReduceOp Op, class T>
void reduce_elements(const T* const* sources, int source_count, T* const* targets,
                     int target_count, std::int64_t first, std::int64_t last) {
  using A = reduce_accumulator_t<T>;
  if constexpr (Op != ReduceOp::avg) {
    if (source_count == 2 &&
        reduce_two<Op>(sources[0], sources[1], targets, target_count, first, last)) {
      return;
    }
  }
  constexpr std::int64_t block = 1024;
  A partial[block];
  for (std::int64_t begin = first; begin < last; begin += block) {
    const std::int64_t length = std::min(block, last - begin);
    const T* source = sources[0] + begin;
    for (std::int64_t i = 0; i < length; ++i) partial[i] = static_cast<A>(source[i]);
    for (int s = 1; s < source_count; ++s) {
      source = sources[s] + begin;
      for (std::int64_t i = 0; i < length; ++i) {
        partial[i] = combine<Op>(partial[i], static_cast<A>(source[i]));
      }
    }
    if constexpr (Op == ReduceOp::avg) {
      const A count = static_cast<A>(source_count);
      for (std::int64_t i = 0; i < length; ++i) partial[i] = partial[i] / count;
    }
    for (int t = 0; t < target_count; ++t) {
      T* target = targets[t] + begin;
      for (std::int64_t i = 0; i < length; ++i) target[i] = static_cast<T>(partial[i]);
    }
  }
}

/// reduce_elements with the operator chosen at run time (one instantiation per operator).
template <class T>
void reduce_elements(ReduceOp op, const T* const* sources, int source_count, T* const* targets,
                     int target_count, std::int64_t first, std::int64_t last) {
  switch (op) {
    case ReduceOp::sum:
      return reduce_elements<ReduceOp::sum>(sources, source_count, targets, target_count, first,
                                            last);
    case ReduceOp::avg:
      if constexpr (is_floating_dtype_v<T>) {
        return reduce_elements<ReduceOp::avg>(sources, source_count, targets, target_count, first,
                                              last);
      }
      break;  // refused by the argument checks
    case ReduceOp::max:
      return reduce_elements<ReduceOp::max>(sources, source_count, targets, target_count, first,
                                            last);
    case ReduceOp::min:
      return reduce_elements<ReduceOp::min>(sources, source_count, targets, target_count, first,
                                            last);
    case ReduceOp::product:
      return reduce_elements<ReduceOp::product>(sources, source_count, targets, target_count,
                                                first, last);
  }
}

}  // namespace tessera::parallel::detail
