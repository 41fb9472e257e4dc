// A call's workspace: bytes carved in order from one storage (a program's planned scratch, or an
// eager call's own allocation), 64-byte aligned tensors and 256-byte aligned raw blocks (cuDNN's).
// Shared by the convolution, pooling and batch norm passes of nn/detail/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/tensor/storage.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn::detail {

/// Bytes carved from one storage, 64-byte aligned, in order (a call's workspace).
class workspace {
 public:
  workspace() = default;
  workspace(Storage storage, std::int64_t begin, std::int64_t end)
      : storage_(std::move(storage)), offset_(begin), end_(end) {}

  /// Bytes take() needs for a tensor of `numel` elements of T.
  template <class T>
  static std::size_t bytes(std::int64_t numel) {
    return numel == 0 ? 0 : static_cast<std::size_t>(numel) * sizeof(T) + 64;
  }

  /// Bytes take_raw() needs for `n` bytes.
  static std::size_t raw_bytes(std::size_t n) { return n == 0 ? 0 : n + raw_alignment; }

  /// `n` bytes from the next free ones, aligned to raw_alignment (cuDNN's workspace); nullptr
  /// for none.
  void* take_raw(std::size_t n) {
    if (n == 0) return nullptr;
    const std::int64_t start = (offset_ + raw_alignment - 1) / raw_alignment * raw_alignment;
    if (start + static_cast<std::int64_t>(n) > end_) {
      throw error("conv2d: internal error: the workspace is smaller than planned");
    }
    offset_ = start + static_cast<std::int64_t>(n);
    return static_cast<char*>(storage_.data()) + start;
  }

  /// A contiguous tensor of `shape` from the next free bytes.
  template <class T, class K>
  Tensor<T, K> take(const Shape& shape) {
    const std::int64_t n = shape.numel();
    if (n == 0) return Tensor<T, K>(storage_, shape, shape.contiguous_strides(), 0);
    const std::int64_t start = (offset_ + 63) / 64 * 64;
    const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(T));
    if (start + bytes > end_) {
      throw error("conv2d: internal error: the workspace is smaller than planned");
    }
    offset_ = start + bytes;
    return Tensor<T, K>(storage_, shape, shape.contiguous_strides(),
                        start / static_cast<std::int64_t>(sizeof(T)));
  }

 private:
  static constexpr std::int64_t raw_alignment = 256;  // a CUDA allocation's own alignment
  Storage storage_;
  std::int64_t offset_ = 0;
  std::int64_t end_ = 0;
};

}  // namespace tessera::nn::detail
