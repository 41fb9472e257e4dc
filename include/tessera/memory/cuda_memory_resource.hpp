// Device memory from cudaMalloc/cudaFree on one device ordinal: the upstream of every CUDA
// device's pool. cudaMalloc is slow (and cudaFree synchronises the device), which is why the pool
// caches what it gets from here. Only with TESSERA_CUDA (the CUDA runtime available to this unit).
#pragma once

#include <cstddef>
#include <string>

#include "tessera/core/config.hpp"
#include "tessera/core/detail/cuda_device_scope.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/format.hpp"
#include "tessera/memory/stream_policy.hpp"

#if TESSERA_CUDA
namespace tessera::memory {

namespace detail {
/// Throws out_of_memory_error for cudaErrorMemoryAllocation (after clearing it, so the next CUDA
/// call does not see it), cuda_error naming `call` for any other failure.
inline void check_cuda_allocation(cudaError_t status, const char* call, const std::string& what,
                                  const char* file, int line) {
  if (status == cudaSuccess) return;
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw out_of_memory_error(what);
  }
  tessera::detail::throw_cuda_error(status, call, file, line);
}
}  // namespace detail

class cuda_memory_resource {
 public:
  /// Blocks freed after use on other streams wait for events before reuse.
  using stream_policy = cuda_stream_policy;

  /// A resource for CUDA device `device` (an ordinal; not checked until the first call).
  explicit cuda_memory_resource(int device = 0) noexcept : device_(device) {}

  int device() const noexcept { return device_; }

  /// cudaMalloc of `bytes` on this resource's device (the stream is not needed: cudaMalloc memory
  /// is usable by every stream). Throws out_of_memory_error when the device is out of memory,
  /// cuda_error for any other failure.
  void* allocate(std::size_t bytes, stream_ref = {}) {
    tessera::detail::cuda_device_scope scope(device_);
    void* pointer = nullptr;
    detail::check_cuda_allocation(cudaMalloc(&pointer, bytes), "cudaMalloc(&pointer, bytes)",
                                  "cudaMalloc of " + format_bytes(bytes) + " on cuda:" +
                                      std::to_string(device_) + " failed: out of memory",
                                  __FILE__, __LINE__);
    return pointer;
  }

  /// cudaFree (which waits for all work on the device). Throws cuda_error.
  void deallocate(void* pointer, std::size_t, stream_ref = {}) {
    tessera::detail::cuda_device_scope scope(device_);
    TESSERA_CUDA_CHECK(cudaFree(pointer));
  }

  /// Total memory of the device in bytes (cudaMemGetInfo).
  std::size_t capacity() const {
    std::size_t free = 0;
    std::size_t total = 0;
    tessera::detail::cuda_device_scope scope(device_);
    TESSERA_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return total;
  }

  /// Memory of the device that no one (in any process) holds, in bytes (cudaMemGetInfo).
  std::size_t free_capacity() const {
    std::size_t free = 0;
    std::size_t total = 0;
    tessera::detail::cuda_device_scope scope(device_);
    TESSERA_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }

  friend bool operator==(const cuda_memory_resource&, const cuda_memory_resource&) = default;

 private:
  int device_;
};

}  // namespace tessera::memory
#endif
