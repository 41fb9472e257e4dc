// Packing a compiled program's buffers into one arena per device (autograd/program.hpp): each
// buffer is a size and a lifetime (an interval of schedule steps), and buffers alive at the same
// time get byte ranges that do not overlap.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"

namespace tessera::autograd::detail {

struct buffer {
  Device device;
  std::size_t bytes = 0;
  int start = 0;
  int end = 0;
  std::size_t offset = 0;
};

/// Packs buffers (lifetime intervals of steps, sizes) at offsets so that buffers alive at the same
/// time never overlap: largest first, each into the smallest gap that holds it (best fit).
/// Returns the arena size.
TESSERA_API std::size_t pack(std::vector<buffer*>& buffers);
#if TESSERA_DEFINITIONS
TESSERA_API std::size_t pack(std::vector<buffer*>& buffers) {
  std::sort(buffers.begin(), buffers.end(), [](const buffer* a, const buffer* b) {
    if (a->bytes != b->bytes) return a->bytes > b->bytes;
    return a->start < b->start;
  });
  std::vector<const buffer*> placed;
  std::size_t arena = 0;
  for (buffer* b : buffers) {
    std::vector<std::pair<std::size_t, std::size_t>> busy;
    for (const buffer* p : placed) {
      if (p->start <= b->end && b->start <= p->end)
        busy.emplace_back(p->offset, p->offset + p->bytes);
    }
    std::sort(busy.begin(), busy.end());
    std::size_t best = std::numeric_limits<std::size_t>::max();
    std::size_t best_gap = std::numeric_limits<std::size_t>::max();
    std::size_t cursor = 0;
    for (const auto& [begin, end] : busy) {
      if (begin > cursor && begin - cursor >= b->bytes && begin - cursor < best_gap) {
        best = cursor;
        best_gap = begin - cursor;
      }
      cursor = std::max(cursor, end);
    }
    b->offset = best != std::numeric_limits<std::size_t>::max() ? best : cursor;
    arena = std::max(arena, b->offset + b->bytes);
    placed.push_back(b);
  }
  return arena;
}
#endif

}  // namespace tessera::autograd::detail
