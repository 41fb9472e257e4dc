// The pool's unit of bookkeeping: a block is a piece of a segment (memory from the upstream),
// linked to its neighbours in the segment so that freed blocks merge. Free blocks are kept in a
// set ordered by (stream, size, address), so best fit is one lower_bound (PyTorch's BlockPool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/core/stream.hpp"

namespace tessera::memory::detail {

struct block {
  char* pointer = nullptr;
  std::size_t size = 0;       // rounded size (a multiple of 512)
  std::size_t requested = 0;  // what the caller asked for, while allocated
  stream_ref stream;          // the stream it was allocated on; reuse without events only there
  block* prev = nullptr;      // neighbours in the same segment
  block* next = nullptr;
  bool small = false;  // from the small pool
  bool allocated = false;
  int event_count = 0;                  // events still pending after a cross-stream free
  std::vector<stream_ref> stream_uses;  // other streams it was used on (record_stream)

  bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
};

/// Key of a free-block search: the smallest block of `size` or more on `stream`.
struct block_key {
  stream_ref stream;
  std::size_t size;
  const char* pointer;
};

/// Orders blocks by (stream, size, address); transparent so lower_bound takes a block_key.
struct block_order {
  using is_transparent = void;

  static std::uintptr_t stream_bits(stream_ref stream) noexcept {
    return reinterpret_cast<std::uintptr_t>(stream.handle);
  }
  template <class A, class B>
  static bool less(const A& a, const B& b) noexcept {
    if (a.stream != b.stream) return stream_bits(a.stream) < stream_bits(b.stream);
    if (a.size != b.size) return a.size < b.size;
    // As integers, as stream_bits: the same total order as std::less without <functional>.
    return reinterpret_cast<std::uintptr_t>(a.pointer) <
           reinterpret_cast<std::uintptr_t>(b.pointer);
  }
  bool operator()(const block* a, const block* b) const noexcept { return less(*a, *b); }
  bool operator()(const block* a, const block_key& b) const noexcept { return less(*a, b); }
  bool operator()(const block_key& a, const block* b) const noexcept { return less(a, *b); }
};

}  // namespace tessera::memory::detail
