// Page-locked host memory (cudaHostAlloc/cudaFreeHost): the source and target of asynchronous
// copies between host and device, which pageable memory turns into synchronous ones. Pinning costs
// milliseconds per call, so put a pool over it. Only with TESSERA_CUDA.
#pragma once

#include <cstddef>
#include <string>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/cuda_memory_resource.hpp"
#include "tessera/memory/format.hpp"

#if TESSERA_CUDA
namespace tessera::memory {

/// Pinned host memory. It declares no stream policy: a pool over it treats it as host memory, so
/// callers synchronise the copy streams before freeing, or give the pool cuda_stream_policy and a
/// CUDA device (pool_resource<pinned_host_memory_resource, pytorch_size_policy,
/// cuda_stream_policy>) to have frees wait for recorded streams.
class pinned_host_memory_resource {
 public:
  /// cudaHostAlloc of `bytes` (portable: pinned for every device). Throws out_of_memory_error when
  /// the host cannot pin that much, cuda_error for any other failure.
  void* allocate(std::size_t bytes, stream_ref = {}) {
    void* pointer = nullptr;
    detail::check_cuda_allocation(
        cudaHostAlloc(&pointer, bytes, cudaHostAllocPortable),
        "cudaHostAlloc(&pointer, bytes, cudaHostAllocPortable)",
        "cudaHostAlloc of " + format_bytes(bytes) + " failed: out of pinned host memory", __FILE__,
        __LINE__);
    return pointer;
  }

  /// cudaFreeHost. Throws cuda_error.
  void deallocate(void* pointer, std::size_t, stream_ref = {}) {
    TESSERA_CUDA_CHECK(cudaFreeHost(pointer));
  }

  friend bool operator==(const pinned_host_memory_resource&,
                         const pinned_host_memory_resource&) = default;
};

}  // namespace tessera::memory
#endif
