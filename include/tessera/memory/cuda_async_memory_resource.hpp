// Stream-ordered device memory from CUDA's own pool allocator (cudaMallocFromPoolAsync /
// cudaFreeAsync), over a memory pool this resource creates for its device. Used under
// pool_resource it gives a Tessera pool (same statistics) whose segments come from the driver's
// pool instead of cudaMalloc; cudaFreeAsync does not synchronise the device. Only with
// TESSERA_CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "tessera/core/config.hpp"
#include "tessera/core/detail/cuda_device_scope.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/cuda_memory_resource.hpp"
#include "tessera/memory/format.hpp"
#include "tessera/memory/stream_policy.hpp"

#if TESSERA_CUDA
namespace tessera::memory {

class cuda_async_memory_resource {
 public:
  using stream_policy = cuda_stream_policy;

  /// Creates a CUDA memory pool on device `device`. `release_threshold` is the number of bytes the
  /// driver pool keeps cached across synchronisations (cudaMemPoolAttrReleaseThreshold; 0, CUDA's
  /// default, returns freed memory to the device at the next synchronisation). Throws cuda_error
  /// (e.g. cudaErrorNotSupported on devices without memory pools).
  explicit cuda_async_memory_resource(int device = 0, std::size_t release_threshold = 0)
      : device_(device) {
    tessera::detail::cuda_device_scope scope(device_);
    cudaMemPoolProps properties{};
    properties.allocType = cudaMemAllocationTypePinned;
    properties.location.type = cudaMemLocationTypeDevice;
    properties.location.id = device_;
    TESSERA_CUDA_CHECK(cudaMemPoolCreate(&pool_, &properties));
    std::uint64_t threshold = release_threshold;  // the attribute is a cuuint64_t
    cudaError_t status =
        cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (status != cudaSuccess) {
      (void)cudaMemPoolDestroy(pool_);
      tessera::detail::throw_cuda_error(status, "cudaMemPoolSetAttribute(ReleaseThreshold)",
                                        __FILE__, __LINE__);
    }
  }
  cuda_async_memory_resource(cuda_async_memory_resource&& other) noexcept
      : device_(other.device_), pool_(std::exchange(other.pool_, nullptr)) {}
  cuda_async_memory_resource& operator=(cuda_async_memory_resource&& other) noexcept {
    std::swap(device_, other.device_);
    std::swap(pool_, other.pool_);
    return *this;
  }
  cuda_async_memory_resource(const cuda_async_memory_resource&) = delete;
  cuda_async_memory_resource& operator=(const cuda_async_memory_resource&) = delete;
  ~cuda_async_memory_resource() {
    if (pool_ != nullptr) (void)cudaMemPoolDestroy(pool_);  // frees whatever is still cached
  }

  int device() const noexcept { return device_; }
  cudaMemPool_t native_pool() const noexcept { return pool_; }

  /// Stream-ordered allocation on `stream`: usable by work queued on it after this call. Throws
  /// out_of_memory_error when the device is out of memory, cuda_error otherwise.
  void* allocate(std::size_t bytes, stream_ref stream = {}) {
    tessera::detail::cuda_device_scope scope(device_);
    void* pointer = nullptr;
    detail::check_cuda_allocation(cudaMallocFromPoolAsync(&pointer, bytes, pool_, stream.native()),
                                  "cudaMallocFromPoolAsync(&pointer, bytes, pool, stream)",
                                  "cudaMallocFromPoolAsync of " + format_bytes(bytes) +
                                      " on cuda:" + std::to_string(device_) +
                                      " failed: out of memory",
                                  __FILE__, __LINE__);
    return pointer;
  }

  /// Stream-ordered free after the work queued on `stream`. Throws cuda_error.
  void deallocate(void* pointer, std::size_t, stream_ref stream = {}) {
    tessera::detail::cuda_device_scope scope(device_);
    TESSERA_CUDA_CHECK(cudaFreeAsync(pointer, stream.native()));
  }

  /// Total memory of the device in bytes.
  std::size_t capacity() const { return cuda_memory_resource(device_).capacity(); }
  /// Memory of the device no one holds, in bytes.
  std::size_t free_capacity() const { return cuda_memory_resource(device_).free_capacity(); }

 private:
  int device_;
  cudaMemPool_t pool_ = nullptr;
};

}  // namespace tessera::memory
#endif
