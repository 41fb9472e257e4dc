// TESSERA_CUDNN (1 in a build with cuDNN: CMake defines it when it finds cuDNN beside the
// toolkit, 0 otherwise) and, with cuDNN, TESSERA_CUDNN_CHECK: a cuDNN call whose failure throws
// tessera::cuda_error naming the call, cuDNN's status and its last error message. Shared by
// backend/cuda/cudnn.hpp (the legacy calls, the choice) and cudnn_plan.hpp (the graph API).
#pragma once

#include <string>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"

#ifndef TESSERA_CUDNN
#define TESSERA_CUDNN 0
#endif
#if TESSERA_CUDNN && !TESSERA_CUDA
#error "TESSERA_CUDNN needs the CUDA runtime (TESSERA_CUDA)"
#endif

#if TESSERA_CUDNN
#include <cudnn.h>

namespace tessera::detail {
[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file,
                                           int line) {
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  throw cuda_error(std::string(call) + " failed: " + cudnnGetErrorString(status) + " (" +
                       std::to_string(static_cast<int>(status)) + ")" +
                       (detail[0] != '\0' ? std::string(": ") + detail : std::string()) + " at " +
                       file + ":" + std::to_string(line),
                   static_cast<int>(status));
}
}  // namespace tessera::detail

/// Checks a cuDNN call; throws tessera::cuda_error naming the call, the status and cuDNN's
/// message for it.
#define TESSERA_CUDNN_CHECK(call)                                                             \
  do {                                                                                        \
    cudnnStatus_t tessera_cudnn_status_ = (call);                                             \
    if (tessera_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                      \
      ::tessera::detail::throw_cudnn_error(tessera_cudnn_status_, #call, __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)
#endif
