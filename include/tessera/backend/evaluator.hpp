// Evaluators: the trivially copyable objects that executors run, on host and device. A leaf
// reads one operand (pointer + strides); nodes (expr/node.hpp) combine children. Every evaluator
// answers get(access) for three ways of walking the index space:
//   linear_access  - every operand contiguous with the output's shape: element i is data[i];
//   index_access   - a full N-d index of the (coalesced) output: offset = sum(index[d] *
//   stride[d]); row_access     - element i of the current row, after bind_row() set each leaf's row
//   pointer
//                    (the CPU's strided path: one dot product per row, not per element);
//   vector_access, row_vector_access - V consecutive elements at once (CUDA's 16-byte loads), of
//                    the contiguous layout or of the current row;
//   unit_access    - element i of the current block of a row in which every operand steps by 1
//                    or 0 (the CPU's strided path when it can vectorise: bind_unit_row() points
//                    each leaf at its row, or at copies of its value when it is broadcast along
//                    the row, and advance_unit() moves the unit-stride leaves to the next block).
// They depend only on core/, so the tensor layer's copies and fills run on the same executors
// as fused expressions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/half.hpp"
#include "tessera/core/shape.hpp"

namespace tessera {

/// The type arithmetic on T is carried out in: float for half and bfloat16 (rounded once when
/// stored, as PyTorch's kernels do), T otherwise.
template <class T>
using opmath_t = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                                    float, T>;

namespace backend {

struct linear_access {
  std::int64_t i;
};
struct index_access {
  const std::int64_t* index;
};
struct row_access {
  std::int64_t i;
};
struct unit_access {
  std::int64_t i;
};

/// Storage for the leaves broadcast along a row (stride 0) in the unit-stride path: each takes a
/// slot and fills `count` copies of its value, so that it too reads element i of a block at
/// row[i] and the block's loop has no stride left to vectorise around.
struct unit_splats {
  static constexpr std::int64_t slot_bytes = 1024;  // block elements * the widest dtype (8 bytes)
  unsigned char* next = nullptr;
  std::int64_t count = 0;  // elements per block (at most slot_bytes / sizeof(T))

  template <class T>
  T* take() {
    static_assert(sizeof(T) <= 8, "unit_splats: slots hold dtypes of up to 8 bytes");
    T* slot = reinterpret_cast<T*>(next);
    next += slot_bytes;
    return slot;
  }
};
/// V consecutive elements from linear index i (CUDA's vectorised path; all pointers aligned).
template <int V>
struct vector_access {
  std::int64_t i;
};
/// V consecutive elements of the current row from its element i, after bind_row (CUDA's
/// vectorised reductions along rows): a leaf with unit stride along the row loads them at once, a
/// leaf broadcast along it (stride 0) repeats its value; is_row_aligned(V) says every leaf can.
template <int V>
struct row_vector_access {
  std::int64_t i;
};

/// V values of T in one aligned load or store (16 bytes for 4 floats).
template <class T, int V>
struct alignas(sizeof(T) * V) aligned_vector {
  T values[V];
};

/// Converts a computed value to the stored type T; bool is "non-zero" (NaN is true, as in
/// PyTorch), half/bfloat16 round to nearest even, floating to integer as PyTorch on x86
/// (float_to_integer: NaN and out-of-range values defined).
template <class T, class V>
TESSERA_HOST_DEVICE constexpr T store_cast(const V& value) {
  if constexpr (std::is_same_v<T, V>) {
    return value;
  } else if constexpr (std::is_same_v<T, bool>) {
    return !(value == V(0));
  } else if constexpr (std::is_integral_v<T> && !std::is_integral_v<V>) {
    return float_to_integer<T>(value);  // defined for NaN and out-of-range values
  } else {
    return static_cast<T>(value);
  }
}

/// Reads one operand of stored type T; returns opmath_t<T>, or R when given (a copy between
/// tensors of one dtype reads T itself, so that its bits move unchanged: a signalling NaN of half
/// stays one, as in PyTorch's copies).
template <class T, class R = opmath_t<T>>
struct leaf_evaluator {
  using value_type = T;
  using result_type = R;
  static constexpr int leaf_count = 1;

  const T* data = nullptr;
  std::int64_t strides[max_dims] = {};
  int rank = 0;
  const T* row = nullptr;
  std::int64_t inner_stride = 0;

  leaf_evaluator() = default;
  TESSERA_HOST_DEVICE leaf_evaluator(const T* pointer, const Strides& s, int r)
      : data(pointer), rank(r), row(pointer) {
    for (int d = 0; d < r; ++d) strides[d] = s[d];
    inner_stride = r > 0 ? strides[r - 1] : 0;
  }

  TESSERA_HOST_DEVICE result_type get(linear_access a) const { return result_type(data[a.i]); }
  // In device code the loops over dimensions below run to max_dims, a constant, and skip those
  // past the rank: nvcc unrolls them and indexes `strides` by constants, so a kernel's copy of
  // the evaluator stays in registers and parameter space. A loop to `rank` indexes it at run
  // time, which puts the whole evaluator in each thread's local memory (1.4 KB per thread for
  // batch norm's input gradient, 8x slower than the copy's bandwidth on an H100). The host keeps
  // the loop to `rank` (no extra iterations per row on the CPU).
  TESSERA_HOST_DEVICE static constexpr int loop_dims(int r) {
    return TESSERA_DEVICE_CODE ? max_dims : r;
  }
  TESSERA_HOST_DEVICE result_type get(index_access a) const {
    std::int64_t offset = 0;
    for (int d = 0; d < loop_dims(rank); ++d) {
      if (d < rank) offset += a.index[d] * strides[d];
    }
    return result_type(data[offset]);
  }
  TESSERA_HOST_DEVICE result_type get(row_access a) const {
    return result_type(row[a.i * inner_stride]);
  }
  /// Points `row` at the start of the row `index[0 .. rank-2]`.
  TESSERA_HOST_DEVICE void bind_row(const std::int64_t* index) {
    std::int64_t offset = 0;
    for (int d = 0; d + 1 < loop_dims(rank); ++d) {
      if (d + 1 < rank) offset += index[d] * strides[d];
    }
    row = data + offset;
  }
  /// bind_row for the unit-stride path (inner stride 1 or 0): a broadcast leaf's `row` becomes a
  /// slot of `splats` holding copies of its value.
  void bind_unit_row(const std::int64_t* index, unit_splats& splats) {
    bind_row(index);
    if (inner_stride == 0) {
      T* slot = splats.take<T>();
      const T value = *row;
      for (std::int64_t k = 0; k < splats.count; ++k) slot[k] = value;
      row = slot;
    }
  }
  /// Moves a unit-stride leaf `n` elements on (a broadcast one stays on its copies).
  void advance_unit(std::int64_t n) {
    if (inner_stride != 0) row += n;
  }
  TESSERA_HOST_DEVICE result_type get(unit_access a) const { return result_type(row[a.i]); }
  template <int V>
  TESSERA_HOST_DEVICE void get_vector(vector_access<V> a, result_type (&out)[V]) const {
    const auto loaded = *reinterpret_cast<const aligned_vector<T, V>*>(data + a.i);
    for (int k = 0; k < V; ++k) out[k] = result_type(loaded.values[k]);
  }
  template <int V>
  TESSERA_HOST_DEVICE void get_vector(row_vector_access<V> a, result_type (&out)[V]) const {
    if (inner_stride == 0) {
      const result_type value = result_type(*row);
      for (int k = 0; k < V; ++k) out[k] = value;
    } else {
      const auto loaded = *reinterpret_cast<const aligned_vector<T, V>*>(row + a.i);
      for (int k = 0; k < V; ++k) out[k] = result_type(loaded.values[k]);
    }
  }
  /// True when `data` allows aligned loads of `vector` elements.
  bool is_aligned(int vector) const {
    return reinterpret_cast<std::uintptr_t>(data) % (sizeof(T) * static_cast<std::size_t>(vector)) == 0;
  }
  /// True when every row placed by bind_row allows row_vector_access<vector>: the leaf steps by 1
  /// along the row (with `data` and every other stride a multiple of `vector` elements) or by 0.
  bool is_row_aligned(int vector) const {
    if (inner_stride == 0) return true;
    if (inner_stride != 1 || !is_aligned(vector)) return false;
    for (int d = 0; d + 1 < rank; ++d) {
      if (strides[d] % vector != 0) return false;
    }
    return true;
  }
};

/// A constant (a scalar operand, or a fill value), already in its compute type.
template <class T>
struct scalar_evaluator {
  using value_type = T;
  using result_type = T;
  static constexpr int leaf_count = 0;
  T value;

  template <class Access>
  TESSERA_HOST_DEVICE constexpr T get(Access) const {
    return value;
  }
  TESSERA_HOST_DEVICE constexpr void bind_row(const std::int64_t*) {}
  void bind_unit_row(const std::int64_t*, unit_splats&) {}
  void advance_unit(std::int64_t) {}
  template <class VectorAccess, int V>
  TESSERA_HOST_DEVICE void get_vector(VectorAccess, T (&out)[V]) const {
    for (int k = 0; k < V; ++k) out[k] = value;
  }
  bool is_aligned(int) const { return true; }
  bool is_row_aligned(int) const { return true; }
};

/// A tensor of T or a number (in T's compute type), chosen at run time: the operand of the
/// library's CUDA primitives (expr/detail/op_by_op.hpp), so that x + y, x + 2 and 2 - x on one
/// dtype share one kernel. A number takes a leaf's place (it reads no memory, whatever strides
/// the executor lays out for it); the choice is the same for every thread, so the branch costs no
/// divergence.
template <class T>
struct operand_evaluator {
  using value_type = T;
  using result_type = opmath_t<T>;
  static constexpr int leaf_count = 1;
  leaf_evaluator<T> leaf;
  result_type number{};
  bool is_number = false;

  template <class Access>
  TESSERA_HOST_DEVICE result_type get(Access a) const {
    return is_number ? number : leaf.get(a);
  }
  TESSERA_HOST_DEVICE void bind_row(const std::int64_t* index) {
    if (!is_number) leaf.bind_row(index);
  }
  void bind_unit_row(const std::int64_t* index, unit_splats& splats) {
    if (!is_number) leaf.bind_unit_row(index, splats);
  }
  void advance_unit(std::int64_t n) {
    if (!is_number) leaf.advance_unit(n);
  }
  template <class VectorAccess, int V>
  TESSERA_HOST_DEVICE void get_vector(VectorAccess a, result_type (&out)[V]) const {
    if (is_number) {
      for (int k = 0; k < V; ++k) out[k] = number;
    } else {
      leaf.get_vector(a, out);
    }
  }
  bool is_aligned(int vector) const { return is_number || leaf.is_aligned(vector); }
  bool is_row_aligned(int vector) const { return is_number || leaf.is_row_aligned(vector); }
};

/// Converts a child's value to U (rounding through U, so cast<half> really rounds), then to
/// opmath_t<U> for the parent.
template <class U, class Child>
struct cast_evaluator {
  using value_type = U;
  using result_type = opmath_t<U>;
  static constexpr int leaf_count = Child::leaf_count;
  Child child;

  template <class Access>
  TESSERA_HOST_DEVICE result_type get(Access a) const {
    return result_type(store_cast<U>(child.get(a)));
  }
  TESSERA_HOST_DEVICE void bind_row(const std::int64_t* index) { child.bind_row(index); }
  void bind_unit_row(const std::int64_t* index, unit_splats& splats) {
    child.bind_unit_row(index, splats);
  }
  void advance_unit(std::int64_t n) { child.advance_unit(n); }
  template <class VectorAccess, int V>
  TESSERA_HOST_DEVICE void get_vector(VectorAccess a, result_type (&out)[V]) const {
    typename Child::result_type in[V];
    child.get_vector(a, in);
    for (int k = 0; k < V; ++k) out[k] = result_type(store_cast<U>(in[k]));
  }
  bool is_aligned(int vector) const { return child.is_aligned(vector); }
  bool is_row_aligned(int vector) const { return child.is_row_aligned(vector); }
};

}  // namespace backend
}  // namespace tessera
