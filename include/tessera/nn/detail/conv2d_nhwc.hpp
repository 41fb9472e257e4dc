// 2-D convolution forward over a channels_last (NHWC) input on the CPU, without converting it:
// im2col over NHWC makes one col row per output position (n, oh, ow), its columns (i, j, c) runs
// of one input pixel's channels (copies), and out = col @ Wᵀ, with the weight as [O, KH * KW * C]
// (its channels_last bytes), is the NHWC output's storage itself ([N * OH * OW, O]). A 1x1
// convolution with stride 1 and no padding multiplies the input's storage directly. One group
// only; grouped convolutions, and every backward pass, run NCHW (nn/detail/conv2d.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/core/memory_format.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/nn/detail/conv2d_geometry.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn::detail {

/// Elements of col per chunk of output positions: bounds the scratch (8 MiB of double) while a
/// chunk keeps hundreds of positions for the GEMM even for a 3x3 kernel over 512 channels.
inline constexpr std::int64_t conv2d_nhwc_col_elements = std::int64_t{1} << 20;

/// True when conv2d_forward_nhwc_cpu can run this geometry's forward: float or double on the
/// CPU, one group.
template <class T, class K>
bool conv2d_nhwc_native(const conv2d_geometry& g) {
  return std::is_same_v<K, cpu> &&
         (std::is_same_v<T, float> || std::is_same_v<T, double>)&&g.groups == 1;
}

/// True when conv2d_forward_nhwc_cpu runs this forward: conv2d_nhwc_native, and an input laid
/// out densely channels_last (and not ambiguously: suggest_memory_format).
template <class T, class K>
bool conv2d_runs_nhwc(const conv2d_geometry& g, const Tensor<T, K>& x) {
  return conv2d_nhwc_native<T, K>(g) && x.suggest_memory_format() == memory_format::channels_last &&
         x.is_contiguous(memory_format::channels_last);
}

/// Elements of the col buffer conv2d_forward_nhwc_cpu fills chunk by chunk (0: a 1x1
/// convolution with stride 1 and no padding, which needs none).
inline std::int64_t conv2d_nhwc_col_numel(const conv2d_geometry& g) {
  if (g.pointwise()) return 0;
  const std::int64_t positions = g.n * g.oh * g.ow, k = g.kh * g.kw * g.c;
  const std::int64_t chunk =
      std::clamp<std::int64_t>(conv2d_nhwc_col_elements / std::max<std::int64_t>(k, 1), 1,
                               std::max<std::int64_t>(positions, 1));
  return chunk * k;
}

/// Rows [first, first + rows) of the NHWC im2col of x (NHWC bytes) into col [rows, KH * KW * C]:
/// row p = (n, oh, ow) holds, for each kernel offset (i, j), the C channels of input pixel
/// (oh * sh - ph + i * dh, ow * sw - pw + j * dw), zeros where that is padding. Threaded over rows.
template <class T>
void im2col_nhwc_cpu(const conv2d_geometry& g, const T* x, std::int64_t first, std::int64_t rows,
                     T* col) {
  const std::int64_t k = g.kh * g.kw * g.c;
  const std::int64_t grain = std::max<std::int64_t>(1, backend::cpu::grain_size / k);
  backend::cpu::execute_loop(0, rows, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      const std::int64_t p = first + r;
      const std::int64_t ow = p % g.ow, oh = p / g.ow % g.oh, n = p / (g.ow * g.oh);
      T* row = col + r * k;
      for (std::int64_t i = 0; i < g.kh; ++i) {
        const std::int64_t ih = oh * g.sh - g.ph + i * g.dh;
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const std::int64_t iw = ow * g.sw - g.pw + j * g.dw;
          T* out = row + (i * g.kw + j) * g.c;
          if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) {
            std::fill(out, out + g.c, T(0));
          } else {
            const T* pixel = x + ((n * g.h + ih) * g.w + iw) * g.c;
            std::copy(pixel, pixel + g.c, out);
          }
        }
      }
    }
  });
}

/// y = conv2d(x, w) (+ bias) with x and y [N, C, H, W] / [N, O, OH, OW] dense channels_last
/// (conv2d_runs_nhwc), w in any layout (copied to channels_last when it is not). `col`: a buffer
/// of conv2d_nhwc_col_numel(g) elements (a program's planned workspace), or undefined: one from
/// the pool.
template <class T>
void conv2d_forward_nhwc_cpu(const conv2d_geometry& g, const Tensor<T, cpu>& x,
                             const Tensor<T, cpu>& w, const Tensor<T, cpu>* bias, Tensor<T, cpu>& y,
                             Tensor<T, cpu> col = {}) {
  const std::int64_t positions = g.n * g.oh * g.ow, k = g.kh * g.kw * g.c;
  // [O, KH, KW, C] row-major is the weight's channels_last storage.
  const Tensor<T, cpu> w2 =
      w.contiguous(memory_format::channels_last).permute({0, 2, 3, 1}).view(Shape{g.o, k});
  const Tensor<T, cpu> w2t = w2.t();
  Tensor<T, cpu> y2(y.storage(), Shape{positions, g.o}, Strides{g.o, 1}, y.storage_offset());
  if (g.pointwise()) {
    const Tensor<T, cpu> x2(x.storage(), Shape{positions, g.c}, Strides{g.c, 1},
                            x.storage_offset());
    tessera::detail::matmul_into(y2, x2, w2t);
  } else {
    const std::int64_t chunk =
        std::clamp<std::int64_t>(conv2d_nhwc_col_elements / std::max<std::int64_t>(k, 1), 1,
                                 std::max<std::int64_t>(positions, 1));
    if (!col.defined()) col = Tensor<T, cpu>::empty_on(Shape{chunk * k}, x.device());
    for (std::int64_t first = 0; first < positions; first += chunk) {
      const std::int64_t rows = std::min(chunk, positions - first);
      im2col_nhwc_cpu(g, x.data(), first, rows, col.data());
      Tensor<T, cpu> out = y2.narrow(0, first, rows);
      tessera::detail::matmul_into(out, col.narrow(0, 0, rows * k).view(Shape{rows, k}), w2t);
    }
  }
  if (bias != nullptr) {
    tessera::detail::add_into(y2, tessera::detail::as_node(bias->view(Shape{1, g.o})));
  }
}

}  // namespace tessera::nn::detail
