// The exception hierarchy. Every error Tessera throws derives from tessera::error, except parse
// errors (std::invalid_argument), so callers can catch by category. Messages name the operation
// and the values involved.
#pragma once

#include <charconv>
#include <stdexcept>
#include <string>

#include "tessera/core/config.hpp"

namespace tessera {

namespace detail {
/// A number for a message, in the shortest form that reads back exactly ("300", "0.1", "1e+30",
/// "nan"), where std::to_string would print "300.000000".
inline std::string number_str(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}
}  // namespace detail

/// Base of every Tessera exception.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Shapes that do not agree (both shapes are printed).
class shape_error : public error {
 public:
  using error::error;
};

/// Operands on different devices (both devices are printed).
class device_mismatch_error : public error {
 public:
  using error::error;
};

/// A tensor of the wrong dtype (e.g. AnyTensor::as<T>() with another T).
class dtype_error : public error {
 public:
  using error::error;
};

/// An allocation that the device (or its limit) cannot satisfy, after cached blocks were freed.
class out_of_memory_error : public error {
 public:
  using error::error;
};

/// A CUDA runtime, driver or library call that failed; names the call, the code and its text.
class cuda_error : public error {
 public:
  cuda_error(const std::string& message, int code) : error(message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// A file that cannot be read, written or parsed.
class io_error : public error {
 public:
  using error::error;
};

/// A device ordinal or device kind that does not exist here.
class device_error : public error {
 public:
  using error::error;
};

}  // namespace tessera

#if TESSERA_CUDA
namespace tessera::detail {
[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* call, const char* file,
                                          int line) {
  throw cuda_error(std::string(call) + " failed: " + cudaGetErrorName(code) + " (" +
                       std::to_string(static_cast<int>(code)) + "): " + cudaGetErrorString(code) +
                       " at " + file + ":" + std::to_string(line),
                   static_cast<int>(code));
}
}  // namespace tessera::detail

/// Checks a CUDA runtime call; throws tessera::cuda_error naming the call, the code and its text.
#define TESSERA_CUDA_CHECK(call)                                                       \
  do {                                                                                 \
    cudaError_t tessera_status_ = (call);                                              \
    if (tessera_status_ != cudaSuccess) {                                              \
      ::tessera::detail::throw_cuda_error(tessera_status_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)
#endif
