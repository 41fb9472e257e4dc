// Element types. The dtype of a Tensor is its template parameter T; ScalarType is the run-time
// tag used by AnyTensor, checkpoints and messages. `Dtype` is the concept of a supported T.
// int16 is supported beyond DESIGN's list because PyTorch promotes int8 with uint8 to int16.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/half.hpp"

namespace tessera {

enum class ScalarType : std::uint8_t {
  float32,
  float64,
  float16,
  bfloat16,
  int8,
  uint8,
  int16,
  int32,
  int64,
  boolean,
};

/// A supported element type.
template <class T>
concept Dtype =
    std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, half> ||
    std::same_as<T, bfloat16> || std::same_as<T, std::int8_t> || std::same_as<T, std::uint8_t> ||
    std::same_as<T, std::int16_t> || std::same_as<T, std::int32_t> ||
    std::same_as<T, std::int64_t> || std::same_as<T, bool>;

namespace detail {
template <class T>
struct scalar_type_of_impl;
template <> struct scalar_type_of_impl<float> { static constexpr ScalarType value = ScalarType::float32; };
template <> struct scalar_type_of_impl<double> { static constexpr ScalarType value = ScalarType::float64; };
template <> struct scalar_type_of_impl<half> { static constexpr ScalarType value = ScalarType::float16; };
template <> struct scalar_type_of_impl<bfloat16> { static constexpr ScalarType value = ScalarType::bfloat16; };
template <> struct scalar_type_of_impl<std::int8_t> { static constexpr ScalarType value = ScalarType::int8; };
template <> struct scalar_type_of_impl<std::uint8_t> { static constexpr ScalarType value = ScalarType::uint8; };
template <> struct scalar_type_of_impl<std::int16_t> { static constexpr ScalarType value = ScalarType::int16; };
template <> struct scalar_type_of_impl<std::int32_t> { static constexpr ScalarType value = ScalarType::int32; };
template <> struct scalar_type_of_impl<std::int64_t> { static constexpr ScalarType value = ScalarType::int64; };
template <> struct scalar_type_of_impl<bool> { static constexpr ScalarType value = ScalarType::boolean; };
}  // namespace detail

/// The run-time tag of dtype T.
template <Dtype T>
inline constexpr ScalarType scalar_type_of = detail::scalar_type_of_impl<T>::value;

/// "float32", "float16", "int64", "bool", ... (PyTorch's names without "torch.").
constexpr const char* name(ScalarType type) noexcept {
  switch (type) {
    case ScalarType::float32: return "float32";
    case ScalarType::float64: return "float64";
    case ScalarType::float16: return "float16";
    case ScalarType::bfloat16: return "bfloat16";
    case ScalarType::int8: return "int8";
    case ScalarType::uint8: return "uint8";
    case ScalarType::int16: return "int16";
    case ScalarType::int32: return "int32";
    case ScalarType::int64: return "int64";
    case ScalarType::boolean: return "bool";
  }
  return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, ScalarType type) { return os << name(type); }

/// Bytes per element.
constexpr std::size_t element_size(ScalarType type) noexcept {
  switch (type) {
    case ScalarType::float64:
    case ScalarType::int64: return 8;
    case ScalarType::float32:
    case ScalarType::int32: return 4;
    case ScalarType::float16:
    case ScalarType::bfloat16:
    case ScalarType::int16: return 2;
    case ScalarType::int8:
    case ScalarType::uint8:
    case ScalarType::boolean: return 1;
  }
  return 0;
}

constexpr bool is_floating_point(ScalarType type) noexcept {
  return type == ScalarType::float32 || type == ScalarType::float64 ||
         type == ScalarType::float16 || type == ScalarType::bfloat16;
}

/// Name of dtype T (same text as name(scalar_type_of<T>)).
template <Dtype T>
constexpr const char* dtype_name() noexcept {
  return name(scalar_type_of<T>);
}

/// A floating-point value converted to integer type T (not bool) with the results PyTorch gives
/// on x86, defined for every input (a plain C++ cast of NaN or of an out-of-range value is
/// undefined): truncation toward zero; NaN, infinities and values outside the range give the
/// lowest value for int64 and int32; narrower types take the int32 result modulo 2^bits (so
/// 300.0 -> uint8 44, -1.0 -> uint8 255, NaN -> 0).
template <class T, class V>
TESSERA_HOST_DEVICE constexpr T float_to_integer(V value) {
  const auto d = static_cast<double>(value);
  if constexpr (sizeof(T) == 8) {
    constexpr auto lowest = static_cast<std::int64_t>(static_cast<std::uint64_t>(1) << 63);
    return d >= -0x1p63 && d < 0x1p63 ? static_cast<T>(static_cast<std::int64_t>(d))
                                      : static_cast<T>(lowest);
  } else {
    constexpr auto lowest = static_cast<std::int32_t>(static_cast<std::uint32_t>(1) << 31);
    const std::int32_t wide = d > -2147483649.0 && d < 2147483648.0
                                  ? static_cast<std::int32_t>(d)
                                  : lowest;
    return static_cast<T>(wide);
  }
}

/// True when the number `value` cannot be stored as dtype T without overflow, as PyTorch decides
/// for fill_ and full (c10's `overflows`): NaN for an integer type, a value outside T's range
/// (an infinity is fine for a floating type), except that negative integers may wrap into
/// unsigned types down to -max (fill_(-1) on uint8 stores 255). bool accepts everything.
template <class T, class S>
constexpr bool overflows(S value) {
  if constexpr (std::is_same_v<T, bool>) {
    return false;
  } else if constexpr (std::is_integral_v<S>) {  // an integer (or bool) number
    if constexpr (std::is_same_v<S, bool>) {
      return false;
    } else if constexpr (std::is_integral_v<T>) {
      if constexpr (std::is_unsigned_v<T> && std::is_signed_v<S>) {
        if (value < 0) {
          return static_cast<std::uint64_t>(0) - static_cast<std::uint64_t>(value) >
                 static_cast<std::uint64_t>(std::numeric_limits<T>::max());
        }
      }
      return std::cmp_less(value, std::numeric_limits<T>::lowest()) ||
             std::cmp_greater(value, std::numeric_limits<T>::max());
    } else {  // into a floating type: only half's range (65504) is small enough to matter
      return static_cast<double>(value) < static_cast<double>(std::numeric_limits<T>::lowest()) ||
             static_cast<double>(value) > static_cast<double>(std::numeric_limits<T>::max());
    }
  } else {  // a floating number (float, double, half, bfloat16)
    const auto d = static_cast<double>(value);
    if (d != d) return std::is_integral_v<T>;
    if constexpr (!std::is_integral_v<T>) {
      if (d == std::numeric_limits<double>::infinity() ||
          d == -std::numeric_limits<double>::infinity()) {
        return false;
      }
    }
    // In double, as c10 compares: int64's largest value rounds up to 2^63 there, so 2^63 itself
    // passes (and is stored as float_to_integer makes it, the lowest int64), as in PyTorch.
    return d < static_cast<double>(std::numeric_limits<T>::lowest()) ||
           d > static_cast<double>(std::numeric_limits<T>::max());
  }
}

/// `value` as dtype T for fill_ and full: throws tessera::error naming the operation, the value
/// and T when it overflows T (overflows<T>); otherwise converts as a cast does.
template <class T, class S>
T checked_scalar(S value, const char* operation) {
  if (overflows<T>(value)) {
    throw error(std::string(operation) + ": value " +
                detail::number_str(static_cast<double>(value)) +
                " cannot be converted to dtype " + name(scalar_type_of<T>) + " without overflow");
  }
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_integral_v<S>) {
    return float_to_integer<T>(value);
  } else if constexpr (std::is_same_v<T, bool>) {
    return !(value == S(0));
  } else {
    return static_cast<T>(value);
  }
}

/// An empty value standing for a type, for run-time dispatch.
template <class T>
struct type_tag {
  using type = T;
};

/// Calls fn(type_tag<T>{}) with T the dtype named by `type` (a switch over every dtype).
template <class Fn>
decltype(auto) visit_dtype(ScalarType type, Fn&& fn) {
  switch (type) {
    case ScalarType::float32: return fn(type_tag<float>{});
    case ScalarType::float64: return fn(type_tag<double>{});
    case ScalarType::float16: return fn(type_tag<half>{});
    case ScalarType::bfloat16: return fn(type_tag<bfloat16>{});
    case ScalarType::int8: return fn(type_tag<std::int8_t>{});
    case ScalarType::uint8: return fn(type_tag<std::uint8_t>{});
    case ScalarType::int16: return fn(type_tag<std::int16_t>{});
    case ScalarType::int32: return fn(type_tag<std::int32_t>{});
    case ScalarType::int64: return fn(type_tag<std::int64_t>{});
    case ScalarType::boolean: return fn(type_tag<bool>{});
  }
  throw dtype_error("visit_dtype: unknown ScalarType " +
                    std::to_string(static_cast<int>(type)));
}

}  // namespace tessera
