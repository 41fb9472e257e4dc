// The reduction operators the CPU and CUDA backends share (host and device code): sum, max, min,
// argmax and argmin as an accumulator with identity, lift, merge and step, the finishers that turn
// an accumulator into a result (the value, the mean, the index), and read_as, an expression's value
// as its dtype would hold it. The CPU's reductions are in cpu/reduce.hpp, CUDA's in
// cuda/reduce.cuh.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "tessera/backend/evaluator.hpp"
#include "tessera/backend/functors.hpp"
#include "tessera/core/config.hpp"

namespace tessera::backend {

// ---- reduction operators (host and device) ---------------------------------------------------
//
// An operator Op describes one reduction over values of a compute type:
//   Op::acc_type                the accumulator (a value, or a value with its index);
//   Op::identity()              the accumulator of no elements;
//   Op::lift(x, index)          the accumulator of the one element x at position `index`;
//   Op::merge(a, b)             the accumulator of both; associative and commutative (up to
//                               rounding), so lanes, blocks and threads may combine in any tree;
//   Op::step(a, b)              merge(a, b) when b comes from a later position than every
//                               element of a (folding a run in order): argmax needs no index
//                               comparison then;
//   Op::exact                   true when merge does not round (max, min, integer sums): the
//                               order of merging then cannot matter and needs no cascade;
//   Op::positional              (argmax, argmin only) true: lift's index matters, so elements
//                               keep their row-major positions (see positional_op).

template <class T>
TESSERA_HOST_DEVICE constexpr bool is_nan(T value) {
  if constexpr (std::is_floating_point_v<T>) {
    return value != value;
  } else {
    return false;
  }
}

// Constants as variables, not calls: device code may read a constexpr variable, but calling the
// constexpr std::numeric_limits functions there needs nvcc's --expt-relaxed-constexpr.
template <class T>
inline constexpr T lowest_v = std::is_floating_point_v<T> ? -std::numeric_limits<T>::infinity()
                                                          : std::numeric_limits<T>::lowest();
template <class T>
inline constexpr T highest_v = std::is_floating_point_v<T> ? std::numeric_limits<T>::infinity()
                                                           : std::numeric_limits<T>::max();
template <class T>
inline constexpr T quiet_nan_v = std::numeric_limits<T>::quiet_NaN();
inline constexpr std::int64_t no_index = std::numeric_limits<std::int64_t>::max();

/// The expression's value at `access` as a materialised tensor of its dtype V would hold it
/// (rounded to V), in V's compute type (float for half and bfloat16): a fused reduction then gives
/// what PyTorch gives for the two statements `t = expression; t.sum()`.
template <class V, class Evaluator, class Access>
TESSERA_HOST_DEVICE opmath_t<V> read_as(const Evaluator& evaluator, Access access) {
  if constexpr (requires { typename Evaluator::value_type; }) {
    if constexpr (std::is_same_v<typename Evaluator::value_type, V>) {
      // A leaf or a cast: its values are V's values already.
      return static_cast<opmath_t<V>>(evaluator.get(access));
    } else {
      return static_cast<opmath_t<V>>(store_cast<V>(evaluator.get(access)));
    }
  } else {
    return static_cast<opmath_t<V>>(store_cast<V>(evaluator.get(access)));
  }
}

/// Sum in the accumulation type Acc.
template <class Acc>
struct sum_op {
  using acc_type = Acc;
  static constexpr bool exact = !std::is_floating_point_v<Acc>;
  TESSERA_HOST_DEVICE static constexpr Acc identity() { return Acc(0); }
  template <class X>
  TESSERA_HOST_DEVICE static constexpr Acc lift(X x, std::int64_t) {
    return static_cast<Acc>(x);
  }
  TESSERA_HOST_DEVICE static constexpr Acc merge(Acc a, Acc b) { return a + b; }
  TESSERA_HOST_DEVICE static constexpr Acc step(Acc a, Acc b) { return a + b; }
};

/// Maximum; NaN wins (torch.max propagates NaN).
template <class T>
struct max_op {
  using acc_type = T;
  static constexpr bool exact = true;
  TESSERA_HOST_DEVICE static constexpr T identity() { return lowest_v<T>; }
  template <class X>
  TESSERA_HOST_DEVICE static constexpr T lift(X x, std::int64_t) {
    return static_cast<T>(x);
  }
  TESSERA_HOST_DEVICE static constexpr T merge(T a, T b) { return (b > a || is_nan(b)) ? b : a; }
  TESSERA_HOST_DEVICE static constexpr T step(T a, T b) { return merge(a, b); }
};

/// Minimum; NaN wins.
template <class T>
struct min_op {
  using acc_type = T;
  static constexpr bool exact = true;
  TESSERA_HOST_DEVICE static constexpr T identity() { return highest_v<T>; }
  template <class X>
  TESSERA_HOST_DEVICE static constexpr T lift(X x, std::int64_t) {
    return static_cast<T>(x);
  }
  TESSERA_HOST_DEVICE static constexpr T merge(T a, T b) { return (b < a || is_nan(b)) ? b : a; }
  TESSERA_HOST_DEVICE static constexpr T step(T a, T b) { return merge(a, b); }
};

/// A value and the position it came from (argmax, argmin).
template <class T>
struct arg_value {
  T value;
  std::int64_t index;
};

/// argmax (Greatest) or argmin: the best value's position; NaN counts as best (as in PyTorch), and
/// among equal values the lowest position wins, so merging in any order gives the first one.
template <class T, bool Greatest>
struct arg_op {
  using acc_type = arg_value<T>;
  static constexpr bool exact = true;
  static constexpr bool positional = true;
  TESSERA_HOST_DEVICE static constexpr acc_type identity() {
    return {Greatest ? lowest_v<T> : highest_v<T>, no_index};
  }
  template <class X>
  TESSERA_HOST_DEVICE static constexpr acc_type lift(X x, std::int64_t index) {
    return {static_cast<T>(x), index};
  }
  TESSERA_HOST_DEVICE static constexpr acc_type merge(acc_type a, acc_type b) {
    // Bitwise & and | rather than && and ||: no branches to mispredict on random data, so the
    // choice compiles to selects.
    const bool a_nan = is_nan(a.value);
    const bool b_nan = is_nan(b.value);
    const bool b_better = Greatest ? b.value > a.value : b.value < a.value;
    const bool tie = (a.value == b.value) | (a_nan & b_nan);
    const bool take_b = (b_nan & !a_nan) | b_better | (tie & (b.index < a.index));
    return {take_b ? b.value : a.value, take_b ? b.index : a.index};
  }
  TESSERA_HOST_DEVICE static constexpr acc_type step(acc_type a, acc_type b) {
    // b is later: it wins only by being better, by being the first NaN, or over the identity (a
    // tie keeps a).
    const bool b_better = Greatest ? b.value > a.value : b.value < a.value;
    const bool take_b = b_better | (is_nan(b.value) & !is_nan(a.value)) | (a.index == no_index);
    return {take_b ? b.value : a.value, take_b ? b.index : a.index};
  }
};

/// True for the operators whose result depends on the elements' positions (argmax, argmin:
/// marked `static constexpr bool positional = true`), not only on their values.
template <class Op>
concept positional_op = requires {
  requires Op::positional;
};

/// The result of a reduction is the accumulator, converted to the output dtype.
struct finish_value {
  template <class Out, class Acc>
  TESSERA_HOST_DEVICE static Out apply(const Acc& acc, std::int64_t) {
    return store_cast<Out>(acc);
  }
};
/// The accumulator divided by the element count (NaN for no elements, as torch.mean).
struct finish_mean {
  template <class Out, class Acc>
  TESSERA_HOST_DEVICE static Out apply(const Acc& acc, std::int64_t count) {
    return store_cast<Out>(count == 0 ? quiet_nan_v<Acc> : acc / static_cast<Acc>(count));
  }
};
/// The accumulator's position (argmax, argmin).
struct finish_index {
  template <class Out, class Acc>
  TESSERA_HOST_DEVICE static Out apply(const Acc& acc, std::int64_t) {
    return static_cast<Out>(acc.index);
  }
};

}  // namespace tessera::backend
