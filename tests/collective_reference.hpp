// Reference values for collective tests (in-process Communicator and ProcessGroup across
// processes): member m's input at element i, exactly representable in every dtype, and the
// reference of a reduction over the members in float64 (floating), exact modulo 2^bits
// (integers) or logic (bool), with the tolerance of each dtype's rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tessera/parallel/communicator.hpp"
#include "tessera/tensor/factories.hpp"

namespace collective_reference {

namespace ts = tessera;
using ts::parallel::ReduceOp;

template <class T>
constexpr bool is_float_v = std::is_floating_point_v<T> || std::is_same_v<T, ts::half> ||
                            std::is_same_v<T, ts::bfloat16>;

// Member m's value at element i: exactly representable in T, varied in sign and size.
template <class T>
T value_at(int member, std::int64_t i) {
  if constexpr (std::is_same_v<T, bool>) {
    return (i * 7 + member * 3) % 5 < 2;
  } else if constexpr (is_float_v<T>) {
    // Multiples of 1/8 in [-4, 4): exact in every floating dtype, sums exact in float.
    const double v = static_cast<double>((i * 37 + member * 11) % 64 - 32) / 8.0;
    return static_cast<T>(static_cast<float>(v));
  } else {
    // Full-width patterns so that sums and products wrap.
    const auto bits = static_cast<std::uint64_t>(i * 2654435761LL + member * 40503LL + 12345);
    return static_cast<T>(bits * 0x9E3779B97F4A7C15ULL >> 7);
  }
}

// Values in [0.5, 1.5] for products of floats (no overflow, no denormals).
template <class T>
T product_value_at(int member, std::int64_t i) {
  if constexpr (is_float_v<T>) {
    return static_cast<T>(static_cast<float>(0.5 + static_cast<double>((i * 13 + member * 5) % 9) / 8.0));
  } else {
    return value_at<T>(member, i);
  }
}

// The reference of op over `inputs` at element i: float64 for floating dtypes, exact uint64
// arithmetic reduced modulo 2^bits for integers, logic for bool.
// long double: its 64-bit significand holds every int64 and uint64 exactly.
template <class T>
long double reference(ReduceOp op, const std::vector<std::vector<T>>& inputs, std::size_t i) {
  const std::size_t n = inputs.size();
  if constexpr (std::is_same_v<T, bool>) {
    bool any = false, all = true;
    for (const auto& in : inputs) {
      any = any || in[i];
      all = all && in[i];
    }
    return (op == ReduceOp::sum || op == ReduceOp::max) ? any : all;
  } else if constexpr (is_float_v<T>) {
    double acc = static_cast<double>(static_cast<float>(inputs[0][i]));
    for (std::size_t m = 1; m < n; ++m) {
      const double v = static_cast<double>(static_cast<float>(inputs[m][i]));
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: acc += v; break;
        case ReduceOp::product: acc *= v; break;
        case ReduceOp::max: acc = std::max(acc, v); break;
        case ReduceOp::min: acc = std::min(acc, v); break;
      }
    }
    return op == ReduceOp::avg ? acc / static_cast<double>(n) : acc;
  } else {
    // Exact modulo 2^64 for sums and products (unsigned arithmetic), then reduced modulo
    // 2^bits by the conversion to T; max and min compare the values.
    std::uint64_t wrapped = static_cast<std::uint64_t>(inputs[0][i]);
    std::int64_t extreme = static_cast<std::int64_t>(inputs[0][i]);
    for (std::size_t m = 1; m < n; ++m) {
      const auto v = static_cast<std::int64_t>(inputs[m][i]);
      if (op == ReduceOp::sum) wrapped += static_cast<std::uint64_t>(v);
      if (op == ReduceOp::product) wrapped *= static_cast<std::uint64_t>(v);
      if (op == ReduceOp::max) extreme = std::max(extreme, v);
      if (op == ReduceOp::min) extreme = std::min(extreme, v);
    }
    if (op == ReduceOp::max || op == ReduceOp::min) return static_cast<long double>(extreme);
    return static_cast<long double>(static_cast<T>(wrapped));
  }
}

// |got - want| within the dtype's rounding of a float64 result (exact for integers and bool).
template <class T>
bool close(T got, long double want_exact) {
  if constexpr (!is_float_v<T>) return static_cast<long double>(got) == want_exact;
  const auto want = static_cast<double>(want_exact);
  double g = 0.0;
  if constexpr (std::is_same_v<T, double>) {
    g = got;
  } else {
    g = static_cast<float>(got);  // exact for float, half and bfloat16
  }
  if constexpr (std::is_same_v<T, double>) return std::abs(g - want) <= 1e-12 * (1 + std::abs(want));
  if constexpr (std::is_same_v<T, float>) return std::abs(g - want) <= 1e-6 * (1 + std::abs(want));
  if constexpr (std::is_same_v<T, ts::half>) return std::abs(g - want) <= 1e-3 * (1 + std::abs(want));
  if constexpr (std::is_same_v<T, ts::bfloat16>) return std::abs(g - want) <= 8e-3 * (1 + std::abs(want));
  return false;
}

template <class T>
std::vector<ReduceOp> ops_of() {
  if constexpr (is_float_v<T>) {
    return {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::product};
  } else {
    return {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::product};
  }
}

// Member m's input of n elements (product inputs stay in [0.5, 1.5]) on CPU device `device`.
template <class T>
ts::Tensor<T> member_tensor(int member, int device, std::int64_t n, bool for_product) {
  std::vector<T> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] =
        for_product ? product_value_at<T>(member, i) : value_at<T>(member, i);
  }
  return ts::from_vector<T>(values, {n}, device);
}

}  // namespace collective_reference
