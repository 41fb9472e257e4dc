// Memory formats (PyTorch's torch.memory_format): the order in which a tensor's elements lie in
// its storage, independent of its logical shape. channels_last keeps a 4-d [N, C, H, W] tensor's
// channels innermost (strides [H*W*C, 1, W*C, C], "NHWC"), the layout convolutions prefer.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"

namespace tessera {

/// torch.contiguous_format, torch.channels_last, torch.preserve_format. preserve_format is only
/// meaningful for copies of a tensor (clone, to, empty_like): the copy keeps the source's format.
enum class memory_format { contiguous_format, channels_last, preserve_format };

/// "contiguous_format", "channels_last", "preserve_format" (PyTorch's spelling).
inline const char* to_string(memory_format format) noexcept {
  switch (format) {
    case memory_format::contiguous_format:
      return "contiguous_format";
    case memory_format::channels_last:
      return "channels_last";
    case memory_format::preserve_format:
      return "preserve_format";
  }
  return "unknown memory_format";
}

namespace detail {

/// True when (shape, strides) is a dense channels_last layout of a 4-d shape (PyTorch's
/// is_contiguous(memory_format=torch.channels_last)): walking C, W, H, N, each dimension of
/// extent above 1 has the stride of the ones before it multiplied; extent-1 dimensions' strides
/// do not matter. Any other rank: false.
inline bool is_channels_last_contiguous(const Shape& shape, const Strides& strides) {
  if (shape.size() != 4) return false;
  std::int64_t expected = 1;
  for (int d : {1, 3, 2, 0}) {
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

/// True when strides order a 4-d shape's dimensions as channels_last does (C innermost, then W,
/// H, N), whether or not densely; PyTorch's is_channels_last_strides_2d, with its fallbacks to
/// the contiguous format for ambiguous layouts (C of stride 0, [N, 1, 1, 1] with equal strides,
/// an empty dimension). Decides suggest_memory_format and preserve_format.
inline bool is_channels_last_like(const Shape& shape, const Strides& strides) {
  if (shape.size() != 4 || strides[1] == 0) return false;
  std::int64_t min = 0;
  for (int d : {1, 3, 2, 0}) {
    if (shape[d] == 0 || strides[d] < min) return false;
    // [N, 1, 1, 1] with one stride everywhere (a contiguous tensor, or a column of an N11W one)
    // is taken as contiguous, as PyTorch does.
    if (d == 0 && min == strides[1]) return false;
    min = strides[d];
    if (shape[d] > 1) min *= shape[d];
  }
  return true;
}

/// The dense strides of `shape` in `format` (contiguous_format or channels_last). Throws
/// shape_error naming the operation and the shape for channels_last on a shape that is not 4-d,
/// and tessera::error for preserve_format, which needs a source tensor.
inline Strides strides_for(const Shape& shape, memory_format format, const char* operation) {
  switch (format) {
    case memory_format::contiguous_format:
      return shape.contiguous_strides();
    case memory_format::channels_last: {
      if (shape.size() != 4) {
        throw shape_error(std::string(operation) +
                          ": memory_format channels_last needs a 4-d shape [N, C, H, W], got " +
                          shape.str());
      }
      auto extent = [&](int d) { return shape[d] > 1 ? shape[d] : std::int64_t{1}; };
      Strides strides = shape;
      strides[1] = 1;
      strides[3] = extent(1);
      strides[2] = strides[3] * extent(3);
      strides[0] = strides[2] * extent(2);
      return strides;
    }
    case memory_format::preserve_format:
      break;
  }
  throw error(std::string(operation) +
              ": memory_format preserve_format needs a source tensor (use it with clone, to or "
              "empty_like)");
}

/// The format a copy of a tensor of (shape, strides) takes under `format`: preserve_format
/// becomes channels_last for a channels_last-like layout, contiguous_format otherwise.
inline memory_format resolve_format(memory_format format, const Shape& shape,
                                    const Strides& strides) {
  if (format != memory_format::preserve_format) return format;
  return is_channels_last_like(shape, strides) ? memory_format::channels_last
                                               : memory_format::contiguous_format;
}

}  // namespace detail
}  // namespace tessera
