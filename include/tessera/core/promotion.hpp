// PyTorch's type promotion, at compile time over the Dtype concept and at run time over
// ScalarType: which dtype `a + b` has for two tensors (promote_t, torch.promote_types), for a
// tensor and a C++ number (promote_scalar_t, PyTorch's "wrapped number" rule), and which type a
// reduction accumulates in (accumulate_t).
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "tessera/core/dtype.hpp"
#include "tessera/core/half.hpp"

namespace tessera {

/// True for the floating dtypes: half, bfloat16, float, double.
template <class T>
inline constexpr bool is_floating_point_v = std::same_as<T, float> || std::same_as<T, double> ||
                                            std::same_as<T, half> || std::same_as<T, bfloat16>;

/// True for the integer dtypes int8, uint8, int16, int32, int64; bool only when include_bool
/// (as PyTorch's isIntegralType(t, includeBool)).
template <class T, bool include_bool = false>
inline constexpr bool is_integral_dtype_v = std::same_as<T, std::int8_t> ||
                                            std::same_as<T, std::uint8_t> ||
                                            std::same_as<T, std::int16_t> ||
                                            std::same_as<T, std::int32_t> ||
                                            std::same_as<T, std::int64_t> ||
                                            (include_bool && std::same_as<T, bool>);

namespace detail {

// PyTorch orders dtypes in categories bool < integral < floating; a wrapped number only counts
// when its category is higher than the tensor's.
enum class dtype_category : int { boolean = 0, integral = 1, floating = 2 };

constexpr dtype_category category(ScalarType type) noexcept {
  if (type == ScalarType::boolean) return dtype_category::boolean;
  return is_floating_point(type) ? dtype_category::floating : dtype_category::integral;
}

template <ScalarType type>
struct dtype_of_impl;
// clang-format off
template <> struct dtype_of_impl<ScalarType::float32> { using type = float; };
template <> struct dtype_of_impl<ScalarType::float64> { using type = double; };
template <> struct dtype_of_impl<ScalarType::float16> { using type = half; };
template <> struct dtype_of_impl<ScalarType::bfloat16> { using type = bfloat16; };
template <> struct dtype_of_impl<ScalarType::int8> { using type = std::int8_t; };
template <> struct dtype_of_impl<ScalarType::uint8> { using type = std::uint8_t; };
template <> struct dtype_of_impl<ScalarType::int16> { using type = std::int16_t; };
template <> struct dtype_of_impl<ScalarType::int32> { using type = std::int32_t; };
template <> struct dtype_of_impl<ScalarType::int64> { using type = std::int64_t; };
template <> struct dtype_of_impl<ScalarType::boolean> { using type = bool; };
// clang-format on

template <ScalarType type>
using dtype_of = typename dtype_of_impl<type>::type;

/// A C++ value that can stand for a scalar operand: any arithmetic type, half or bfloat16.
template <class T>
concept wrapped_number = std::is_arithmetic_v<T> || is_floating_point_v<T>;

}  // namespace detail

/// torch.promote_types for two dtypes: the higher category wins (bool < integral < floating);
/// within a category the larger type, except int8 with uint8 -> int16 (neither holds the other)
/// and float16 with bfloat16 -> float32 (neither holds the other's range and precision).
constexpr ScalarType promote_types(ScalarType a, ScalarType b) noexcept {
  if (a == b) return a;
  const auto category_a = detail::category(a);
  const auto category_b = detail::category(b);
  if (category_a != category_b) return category_a > category_b ? a : b;
  if (category_a == detail::dtype_category::floating) {
    if (a == ScalarType::float64 || b == ScalarType::float64) return ScalarType::float64;
    // The remaining pairs mix float32 with a 16-bit type, or the two 16-bit types.
    return ScalarType::float32;
  }
  // Two different integer types. uint8 is the only unsigned one: with a wider signed type that
  // type holds it; with int8 it needs int16.
  if (a == ScalarType::uint8 || b == ScalarType::uint8) {
    const ScalarType other = a == ScalarType::uint8 ? b : a;
    return other == ScalarType::int8 ? ScalarType::int16 : other;
  }
  return element_size(a) >= element_size(b) ? a : b;
}

/// The dtype of an elementwise operation between tensors of dtypes A and B (torch.promote_types).
template <Dtype A, Dtype B>
using promote_t = detail::dtype_of<promote_types(scalar_type_of<A>, scalar_type_of<B>)>;

namespace detail {
template <class... Ts>
struct result_type_impl;
template <class T>
struct result_type_impl<T> {
  using type = T;
};
template <class A, class B, class... Rest>
struct result_type_impl<A, B, Rest...> : result_type_impl<promote_t<A, B>, Rest...> {};
}  // namespace detail

/// promote_t folded over any number of tensor dtypes (torch.result_type for tensors only).
template <Dtype T, Dtype... Ts>
using result_type_t = typename detail::result_type_impl<T, Ts...>::type;

/// The run-time counterpart of promote_scalar_t, with the scalar's category given as its
/// ScalarType (int64 for any C++ integer, float64 for any C++ floating value, bool).
constexpr ScalarType promote_scalar_type(ScalarType tensor, ScalarType scalar) noexcept {
  const auto scalar_category = detail::category(scalar);
  if (scalar_category <= detail::category(tensor)) return tensor;
  // A higher-category scalar gives that category's default dtype: int64, or float32 (PyTorch's
  // default dtype), whatever the scalar's own width.
  return scalar_category == detail::dtype_category::floating ? ScalarType::float32
                                                             : ScalarType::int64;
}

namespace detail {
template <class T>
constexpr ScalarType wrapped_number_type() noexcept {
  if constexpr (std::same_as<T, bool>) {
    return ScalarType::boolean;
  } else if constexpr (is_floating_point_v<T> || std::is_floating_point_v<T>) {
    return ScalarType::float64;
  } else {
    return ScalarType::int64;
  }
}
}  // namespace detail

/// The dtype of an elementwise operation between a tensor of dtype TensorT and a C++ number of
/// type ScalarT (PyTorch's wrapped number): the scalar counts only when its category is higher.
/// int32 tensor + int64_t -> int32; half tensor + double -> half; int tensor + double -> float;
/// bool tensor + int -> int64.
template <Dtype TensorT, class ScalarT>
requires detail::wrapped_number<std::remove_cvref_t<ScalarT>>
using promote_scalar_t = detail::dtype_of<promote_scalar_type(
    scalar_type_of<TensorT>, detail::wrapped_number_type<std::remove_cvref_t<ScalarT>>())>;

/// The type a reduction (sum, mean, dot) of T accumulates in: float for the 16-bit floats and
/// float, double for double, int64 for the integers and bool (as PyTorch's sum of bool is int64).
template <Dtype T>
using accumulate_t =
    std::conditional_t<std::same_as<T, double>, double,
                       std::conditional_t<is_floating_point_v<T>, float, std::int64_t>>;

}  // namespace tessera
