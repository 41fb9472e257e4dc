// The shape every Tessera memory resource has: RMM's and cuda::mr's stream-ordered
// `allocate(bytes, stream)` / `deallocate(p, bytes, stream)`. Upstreams (host, pinned, cudaMalloc,
// cudaMallocAsync), adaptors (limit, statistics, trace) and the pool all satisfy `memory_resource`,
// so they compose as template arguments:
// pool_resource<limit_resource_adaptor<host_memory_resource>>.
#pragma once

#include <concepts>
#include <cstddef>
#include <limits>

#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"

namespace tessera::memory {

/// A stream-ordered allocator. `allocate` returns memory usable by work on `stream` and reports
/// exhaustion by throwing tessera::out_of_memory_error (or std::bad_alloc), so that a pool can tell
/// "no memory" (release the cache and retry) from any other failure. `deallocate` takes the size
/// that was passed to `allocate` and the stream on which the memory was last used.
template <class R>
concept memory_resource = requires(R& resource, void* pointer, std::size_t bytes,
                                   stream_ref stream) {
  { resource.allocate(bytes, stream) } -> std::same_as<void*>;
  resource.deallocate(pointer, bytes, stream);
};

/// The value of a limit that does not limit anything (returned by `limit()` when none is set).
inline constexpr std::size_t no_limit = std::numeric_limits<std::size_t>::max();

}  // namespace tessera::memory
