// Aligned host memory from the C++ heap: the upstream of every CPU device's pool. 256-byte
// alignment like RMM's resources, so a block at any 512-byte offset of a segment is aligned for
// every dtype and for AVX-512 loads.
#pragma once

#include <cstddef>
#include <new>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/format.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace tessera::memory {

class host_memory_resource {
 public:
  /// Alignment of every pointer returned by allocate, in bytes.
  static constexpr std::size_t alignment = 256;

  /// Allocates `bytes` (> 0) bytes aligned to 256; the stream is ignored (host memory is usable by
  /// any host work). Throws out_of_memory_error when the heap cannot provide them.
  void* allocate(std::size_t bytes, stream_ref = {}) {
    void* pointer = ::operator new (bytes, std::align_val_t{alignment}, std::nothrow);
    if (pointer == nullptr) {
      throw out_of_memory_error("host_memory_resource: the heap cannot provide " +
                                format_bytes(bytes));
    }
    return pointer;
  }

  /// Returns memory from allocate; `bytes` must be the size that was allocated.
  void deallocate(void* pointer, std::size_t, stream_ref = {}) noexcept {
    ::operator delete (pointer, std::align_val_t{alignment});
  }

  /// Physical memory of the machine in bytes (0 when the platform cannot tell).
  std::size_t capacity() const noexcept {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGE_SIZE)
    long pages = sysconf(_SC_PHYS_PAGES);
    long page_size = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page_size > 0) {
      return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
    }
#endif
    return 0;
  }

  friend bool operator==(const host_memory_resource&, const host_memory_resource&) = default;
};

}  // namespace tessera::memory
