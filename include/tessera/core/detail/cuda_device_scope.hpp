// RAII helper for CUDA calls: makes a device current for the duration of a call and restores the
// caller's device, touching cudaSetDevice only when the two differ (it is not free). No check that
// the ordinal exists: callers have checked it.
#pragma once

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"

#if TESSERA_CUDA
namespace tessera::detail {

class cuda_device_scope {
 public:
  explicit cuda_device_scope(int device) {
    TESSERA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) TESSERA_CUDA_CHECK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~cuda_device_scope() {
    if (changed_) (void)cudaSetDevice(previous_);  // the previous device was valid when read
  }
  cuda_device_scope(const cuda_device_scope&) = delete;
  cuda_device_scope& operator=(const cuda_device_scope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace tessera::detail
#endif
