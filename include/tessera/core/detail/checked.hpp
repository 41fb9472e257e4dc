// Checked int64 arithmetic for sizes computed from a user's arguments (convolution and pooling
// geometry, a loader's batches, a schedule's steps): a result that does not fit int64 is a
// shape_error naming the computation and its operands, never undefined behaviour or a wrapped
// number that a later check misreads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"

namespace tessera::detail {

[[noreturn, gnu::cold]] TESSERA_API void throw_int64_overflow(std::string_view who,
                                                              std::string_view context,
                                                              std::int64_t a, char op,
                                                              std::int64_t b);
#if TESSERA_DEFINITIONS
TESSERA_API void throw_int64_overflow(std::string_view who, std::string_view context,
                                      std::int64_t a, char op, std::int64_t b) {
  std::string message(who);
  message += ": ";
  message += context;
  message += " does not fit a 64-bit integer (";
  message += std::to_string(a);
  message += ' ';
  message += op;
  message += ' ';
  message += std::to_string(b);
  message += " overflows)";
  throw shape_error(message);
}
#endif  // TESSERA_DEFINITIONS

/// a + b, a - b, a * b in int64, each throwing shape_error "<who>: <context> does not fit a
/// 64-bit integer (a op b overflows)" when the exact result does not fit. `context()` says what
/// is computed and from which arguments ("the output size of an input of shape ... with padding
/// ..."); it is called only to build the error, so the checks cost a few instructions.
template <class Context>
class checked_int64 {
 public:
  checked_int64(std::string_view who, Context context) : who_(who), context_(std::move(context)) {}

  std::int64_t add(std::int64_t a, std::int64_t b) const {
    std::int64_t out;
    if (__builtin_add_overflow(a, b, &out)) [[unlikely]] fail(a, '+', b);
    return out;
  }
  std::int64_t sub(std::int64_t a, std::int64_t b) const {
    std::int64_t out;
    if (__builtin_sub_overflow(a, b, &out)) [[unlikely]] fail(a, '-', b);
    return out;
  }
  std::int64_t mul(std::int64_t a, std::int64_t b) const {
    std::int64_t out;
    if (__builtin_mul_overflow(a, b, &out)) [[unlikely]] fail(a, '*', b);
    return out;
  }

 private:
  [[noreturn, gnu::cold, gnu::noinline]] void fail(std::int64_t a, char op, std::int64_t b) const {
    throw_int64_overflow(who_, std::string(context_()), a, op, b);
  }

  std::string_view who_;
  Context context_;
};

}  // namespace tessera::detail
