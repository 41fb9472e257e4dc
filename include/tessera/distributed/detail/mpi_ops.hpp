// The MPI side of ProcessGroup's data (distributed/process_group.hpp): the MPI type each dtype
// travels as, the operators MPI lacks (max and min that propagate NaN, sums and products of 8- and
// 16-bit integers that wrap as Communicator's and PyTorch's do), half and bfloat16 staged through
// float for reductions, avg's division, and MPI's int counts (elementwise operations go in pieces).
#pragma once

#include <climits>
#include <cstdint>
#include <string>

#include "tessera/core/dtype.hpp"
#include "tessera/core/half.hpp"
#include "tessera/distributed/detail/mpi_engine.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::distributed::detail {

template <class F, bool Max>
void nan_extremum(const void* in, void* inout, int count) {
  const F* a = static_cast<const F*>(in);
  F* b = static_cast<F*>(inout);
  for (int i = 0; i < count; ++i) {
    const bool take = a[i] != a[i] || (Max ? a[i] > b[i] : a[i] < b[i]);
    if (take) b[i] = a[i];
  }
}
template <bool Max>
void nan_extremum_op(void* in, void* inout, int* count, MPI_Datatype* type) {
  if (*type == MPI_FLOAT) {
    nan_extremum<float, Max>(in, inout, *count);
  } else {
    nan_extremum<double, Max>(in, inout, *count);
  }
}

template <class I, bool Sum>
void wrapping(const void* in, void* inout, int count) {
  const I* a = static_cast<const I*>(in);
  I* b = static_cast<I*>(inout);
  for (int i = 0; i < count; ++i) {
    const auto x = static_cast<std::uint64_t>(a[i]), y = static_cast<std::uint64_t>(b[i]);
    b[i] = static_cast<I>(Sum ? x + y : x * y);  // keeps the low bits (C++20): wraps
  }
}
template <bool Sum>
void wrapping_op(void* in, void* inout, int* count, MPI_Datatype* type) {
  if (*type == MPI_INT8_T) {
    wrapping<std::int8_t, Sum>(in, inout, *count);
  } else if (*type == MPI_UINT8_T) {
    wrapping<std::uint8_t, Sum>(in, inout, *count);
  } else {
    wrapping<std::int16_t, Sum>(in, inout, *count);
  }
}

/// The MPI type a dtype travels as. `reducing`: half and bfloat16 are reduced as float (staged);
/// otherwise they move as their 16 bits.
inline MPI_Datatype mpi_type(ScalarType dtype, bool reducing) {
  switch (dtype) {
    case ScalarType::float32: return MPI_FLOAT;
    case ScalarType::float64: return MPI_DOUBLE;
    case ScalarType::float16:
    case ScalarType::bfloat16: return reducing ? MPI_FLOAT : MPI_UINT16_T;
    case ScalarType::int8: return MPI_INT8_T;
    case ScalarType::uint8: return MPI_UINT8_T;
    case ScalarType::int16: return MPI_INT16_T;
    case ScalarType::int32: return MPI_INT32_T;
    case ScalarType::int64: return MPI_INT64_T;
    case ScalarType::boolean: return MPI_C_BOOL;
  }
  return MPI_BYTE;
}

inline bool is_16bit_float(ScalarType dtype) {
  return dtype == ScalarType::float16 || dtype == ScalarType::bfloat16;
}

/// A half or bfloat16 CPU tensor as float, and float values written back into one (Tensor's own
/// conversions): MPI has no 16-bit floating type, so these are reduced in float.
inline Tensor<float, cpu> to_float(const AnyTensor& t) {
  if (t.dtype() == ScalarType::float16) return t.as<half, cpu>().to<float>();
  return t.as<bfloat16, cpu>().to<float>();
}
inline void copy_from_float(const AnyTensor& to, const Tensor<float, cpu>& from) {
  if (to.dtype() == ScalarType::float16) {
    to.as<half, cpu>().copy_(from);
  } else {
    to.as<bfloat16, cpu>().copy_(from);
  }
}

/// Divides `count` values of MPI type `type` (float or double) at `data` by `by`. Vectorised at
/// -O2 too (omp simd): scalar division of 7.5 MB took 2.3 ms, more than the all-reduce itself.
template <class F>
void divide_values(F* p, std::int64_t count, F by) {
#if defined(_OPENMP)
#pragma omp simd
#endif
  for (std::int64_t i = 0; i < count; ++i) p[i] /= by;
}
inline void divide(void* data, std::int64_t count, MPI_Datatype type, int by) {
  if (type == MPI_FLOAT) {
    divide_values(static_cast<float*>(data), count, static_cast<float>(by));
  } else {
    divide_values(static_cast<double*>(data), count, static_cast<double>(by));
  }
}

inline int mpi_type_size(MPI_Datatype type) {
  int bytes = 0;
  MPI_Type_size(type, &bytes);
  return bytes;
}

/// MPI counts are int: elementwise operations go in pieces of at most this many elements (2^30;
/// tests lower it to check the pieces).
inline std::int64_t& piece_limit() {
  static std::int64_t limit = std::int64_t{1} << 30;
  return limit;
}

inline int checked_count(std::int64_t n, const char* what) {
  if (n > INT_MAX) {
    throw communication_error(std::string("ProcessGroup::") + what + ": " + std::to_string(n) +
                              " elements; MPI counts stop at " + std::to_string(INT_MAX));
  }
  return static_cast<int>(n);
}

}  // namespace tessera::distributed::detail
