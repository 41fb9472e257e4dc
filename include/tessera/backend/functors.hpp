// The elementwise functors: one empty struct per operation, callable on host and device with
// values in the operation's compute type (float for half/bfloat16, see opmath_t). Each names
// itself for messages; the expression nodes in expr/node.hpp apply them, and the backend's
// reductions and softmax use exp and log. They sit in the backend layer, below expr/, because the
// backend calls them; expr/functors.hpp includes this header.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tessera/backend/cpu/vector_math.hpp"
#include "tessera/backend/evaluator.hpp"
#include "tessera/core/config.hpp"

namespace tessera {

namespace ops {

// Math functions for the compute types: std:: on the host, CUDA's overloads on the device.
#if TESSERA_DEVICE_CODE
#define TESSERA_MATH(name) ::name
#else
#define TESSERA_MATH(name) std::name
#endif

// Signed integers wrap on overflow, as PyTorch's results do (int32 max + 1 == min), where C++
// signed overflow would be undefined behaviour: +, -, * and negation compute in the unsigned type
// (at least unsigned int, so that int8/int16 do not promote to int and overflow there) and
// convert back, which C++20 defines as modulo 2^N. Floats and unsigned types are untouched.
template <class A>
inline constexpr bool wraps_v = std::is_integral_v<A> && std::is_signed_v<A>;
template <class A>
using wrapping_t =
    std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;

struct negate {
  static constexpr const char* name = "neg";
  template <class A>
  TESSERA_HOST_DEVICE constexpr A operator()(A a) const {
    if constexpr (wraps_v<A>) {
      return static_cast<A>(wrapping_t<A>(0) - static_cast<wrapping_t<A>>(a));
    } else {
      return -a;
    }
  }
};
struct add {
  static constexpr const char* name = "add";
  template <class A>
  TESSERA_HOST_DEVICE constexpr A operator()(A a, A b) const {
    if constexpr (wraps_v<A>) {
      return static_cast<A>(static_cast<wrapping_t<A>>(a) + static_cast<wrapping_t<A>>(b));
    } else {
      return a + b;
    }
  }
};
struct subtract {
  static constexpr const char* name = "sub";
  template <class A>
  TESSERA_HOST_DEVICE constexpr A operator()(A a, A b) const {
    if constexpr (wraps_v<A>) {
      return static_cast<A>(static_cast<wrapping_t<A>>(a) - static_cast<wrapping_t<A>>(b));
    } else {
      return a - b;
    }
  }
};
struct multiply {
  static constexpr const char* name = "mul";
  template <class A>
  TESSERA_HOST_DEVICE constexpr A operator()(A a, A b) const {
    if constexpr (std::is_same_v<A, bool>) {
      return a && b;  // bool * bool is logical and, as in PyTorch
    } else if constexpr (wraps_v<A>) {
      return static_cast<A>(static_cast<wrapping_t<A>>(a) * static_cast<wrapping_t<A>>(b));
    } else {
      return a * b;
    }
  }
};
struct divide {
  static constexpr const char* name = "div";
  template <class A>
  TESSERA_HOST_DEVICE constexpr A operator()(A a, A b) const { return a / b; }
};
struct less {
  static constexpr const char* name = "lt";
  template <class A>
  TESSERA_HOST_DEVICE constexpr bool operator()(A a, A b) const { return a < b; }
};
struct less_equal {
  static constexpr const char* name = "le";
  template <class A>
  TESSERA_HOST_DEVICE constexpr bool operator()(A a, A b) const { return a <= b; }
};
struct greater {
  static constexpr const char* name = "gt";
  template <class A>
  TESSERA_HOST_DEVICE constexpr bool operator()(A a, A b) const { return a > b; }
};
struct greater_equal {
  static constexpr const char* name = "ge";
  template <class A>
  TESSERA_HOST_DEVICE constexpr bool operator()(A a, A b) const { return a >= b; }
};
struct equal {
  static constexpr const char* name = "eq";
  template <class A>
  TESSERA_HOST_DEVICE constexpr bool operator()(A a, A b) const { return a == b; }
};
struct not_equal {
  static constexpr const char* name = "ne";
  template <class A>
  TESSERA_HOST_DEVICE constexpr bool operator()(A a, A b) const { return a != b; }
};
struct maximum {
  static constexpr const char* name = "maximum";
  // NaN propagates, as torch.maximum does.
  template <class A>
  TESSERA_HOST_DEVICE constexpr A operator()(A a, A b) const {
    if constexpr (std::is_floating_point_v<A>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a > b ? a : b;
  }
};
struct minimum {
  static constexpr const char* name = "minimum";
  template <class A>
  TESSERA_HOST_DEVICE constexpr A operator()(A a, A b) const {
    if constexpr (std::is_floating_point_v<A>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a < b ? a : b;
  }
};
struct power {
  static constexpr const char* name = "pow";
  template <class A>
  TESSERA_HOST_DEVICE A operator()(A a, A b) const {
    if constexpr (std::is_same_v<A, bool>) {
      return a || !b;
    } else if constexpr (std::is_integral_v<A>) {
      // Integer power by squaring (PyTorch: negative exponents give 0 except for bases +-1).
      if constexpr (std::is_signed_v<A>) {
        if (b < 0) return a == 1 ? A(1) : (a == -1 ? ((b & 1) ? A(-1) : A(1)) : A(0));
      }
      // In 64-bit unsigned arithmetic: it wraps as PyTorch's results do (truncating to A keeps
      // the low bits), where signed overflow would be undefined behaviour.
      std::uint64_t result = 1;
      std::uint64_t base = static_cast<std::uint64_t>(a);
      while (b) {
        if (b & 1) result *= base;
        b >>= 1;
        if (b) base *= base;
      }
      return static_cast<A>(result);
    } else {
      return TESSERA_MATH(pow)(a, b);
    }
  }
};

#define TESSERA_UNARY_MATH_FUNCTOR(functor, fn)                                             \
  struct functor {                                                                         \
    static constexpr const char* name = #fn;                                               \
    template <class A>                                                                     \
    TESSERA_HOST_DEVICE A operator()(A a) const { return TESSERA_MATH(fn)(a); }            \
  };
TESSERA_UNARY_MATH_FUNCTOR(log, log)
TESSERA_UNARY_MATH_FUNCTOR(sqrt, sqrt)
TESSERA_UNARY_MATH_FUNCTOR(sin, sin)
TESSERA_UNARY_MATH_FUNCTOR(cos, cos)
#undef TESSERA_UNARY_MATH_FUNCTOR

// exp, tanh and sigmoid on float (half and bfloat16 compute in float) use the vectorisable
// implementations of backend/cpu/vector_math.hpp on the host (libm's expf/tanhf are calls the
// compiler cannot vectorise; accuracy bounds are in that header). Double and device code keep
// std:: and CUDA's functions.
#if TESSERA_DEVICE_CODE
#define TESSERA_VECTOR_MATH_FLOAT(A) false
#else
#define TESSERA_VECTOR_MATH_FLOAT(A) std::is_same_v<A, float>
#endif
struct exp {
  static constexpr const char* name = "exp";
  static constexpr bool compute_bound = true;  // the executor builds an AVX2 clone of its loop
  template <class A>
  TESSERA_HOST_DEVICE A operator()(A a) const {
    if constexpr (TESSERA_VECTOR_MATH_FLOAT(A)) {
      return detail::vector_math::exp(a);
    } else {
      return TESSERA_MATH(exp)(a);
    }
  }
};
struct tanh {
  static constexpr const char* name = "tanh";
  static constexpr bool compute_bound = true;  // the executor builds an AVX2 clone of its loop
  template <class A>
  TESSERA_HOST_DEVICE A operator()(A a) const {
    if constexpr (TESSERA_VECTOR_MATH_FLOAT(A)) {
      return detail::vector_math::tanh(a);
    } else {
      return TESSERA_MATH(tanh)(a);
    }
  }
};

struct abs {
  static constexpr const char* name = "abs";
  template <class A>
  TESSERA_HOST_DEVICE constexpr A operator()(A a) const {
    if constexpr (std::is_same_v<A, bool> || std::is_unsigned_v<A>) {
      return a;
    } else {
      return a < A(0) ? negate{}(a) : a;  // abs(int32 min) wraps to min, as in PyTorch
    }
  }
};
struct rsqrt {
  static constexpr const char* name = "rsqrt";
  template <class A>
  TESSERA_HOST_DEVICE A operator()(A a) const { return A(1) / TESSERA_MATH(sqrt)(a); }
};
struct sigmoid {
  static constexpr const char* name = "sigmoid";
  static constexpr bool compute_bound = true;  // the executor builds an AVX2 clone of its loop
  template <class A>
  TESSERA_HOST_DEVICE A operator()(A a) const {
    if constexpr (TESSERA_VECTOR_MATH_FLOAT(A)) {
      return detail::vector_math::sigmoid(a);
    } else {
      return A(1) / (A(1) + TESSERA_MATH(exp)(-a));
    }
  }
};
#undef TESSERA_VECTOR_MATH_FLOAT
/// Conversion to U, rounded through U (so cast<half> really rounds), handed on as opmath_t<U>.
template <class U>
struct cast_to {
  static constexpr const char* name = "cast";
  template <class A>
  TESSERA_HOST_DEVICE constexpr opmath_t<U> operator()(A a) const {
    return opmath_t<U>(backend::store_cast<U>(a));
  }
};

struct relu {
  static constexpr const char* name = "relu";
  // NaN propagates (a > 0 is false for NaN, but NaN is returned as in torch.relu).
  template <class A>
  TESSERA_HOST_DEVICE constexpr A operator()(A a) const { return a > A(0) || a != a ? a : A(0); }
};

#undef TESSERA_MATH

}  // namespace ops
}  // namespace tessera
