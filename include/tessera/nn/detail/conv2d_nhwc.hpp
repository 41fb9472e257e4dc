// 2-D convolution over channels_last (NHWC) tensors on the CPU, without converting them: im2col
// over NHWC makes one col row per output position (n, oh, ow), its columns (i, j, c) runs of one
// input pixel's channels (copies), and with the weight as [O, KH * KW * C] (its channels_last
// bytes) and the NHWC output's storage as [N * OH * OW, O] (gy's too): out = col @ Wᵀ,
// dW = gyᵀ @ col, and dcol = gy @ W, whose (i, j, c) runs col2im adds back into dx's pixels.
// col is built in chunks of output positions (bounded scratch; the backward's dcol reuses a
// chunk's col). A 1x1 convolution with stride 1 and no padding multiplies the input's (and dx's)
// storage directly. One group only; grouped convolutions run NCHW (nn/detail/conv2d.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

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

/// True when the CPU loops run this geometry natively on NHWC (conv2d_forward_nhwc_cpu,
/// conv2d_backward_nhwc_cpu): float or double, one group, and not a 3x3 stride-1 layer that
/// Winograd takes, which runs faster as Winograd on NCHW copies than as im2col + GEMM here
/// (ResNet-50's 3x3 64 layer at 56x56, forward + backward: 1.29x, best run against best; with
/// stride 2 the native loops win; bench/RESULTS.md, "channels_last (NHWC) forward + backward on
/// the CPU").
template <class T, class K>
bool conv2d_nhwc_native(const conv2d_geometry& g) {
  const bool winograd_stride1 =
      g.winograd && g.sh == 1 && g.sw == 1 && !conv2d_use_generic_path();
  return std::is_same_v<K, cpu> &&
         (std::is_same_v<T, float> || std::is_same_v<T, double>)&&g.groups == 1 &&
         !winograd_stride1;
}

/// True when conv2d_forward_nhwc_cpu runs this forward: conv2d_nhwc_native, and an input laid
/// out densely channels_last (and not ambiguously: suggest_memory_format).
template <class T, class K>
bool conv2d_runs_nhwc(const conv2d_geometry& g, const Tensor<T, K>& x) {
  return conv2d_nhwc_native<T, K>(g) && x.suggest_memory_format() == memory_format::channels_last &&
         x.is_contiguous(memory_format::channels_last);
}

/// Output positions per chunk of col: conv2d_nhwc_col_elements of them, at least one, at most all.
inline std::int64_t conv2d_nhwc_chunk(const conv2d_geometry& g) {
  const std::int64_t positions = g.n * g.oh * g.ow, k = g.kh * g.kw * g.c;
  return std::clamp<std::int64_t>(conv2d_nhwc_col_elements / std::max<std::int64_t>(k, 1), 1,
                                  std::max<std::int64_t>(positions, 1));
}

/// Parts the native NHWC loops split the batch into (g.cpu_parts, conv2d_cpu_parts), run at
/// once, each over its images' output positions with single-threaded GEMMs, as the NCHW loops
/// (conv2d_split): only with a BLAS that accumulates, since each part but the first sums its
/// weight-gradient products apart; else 1. ResNet-50's 1x1 layer 256 -> 64 at 56x56, batch 8,
/// on the CI machine's 2 threads: its three GEMMs took 17-19 ms in two parts against 23-26 ms
/// as products over the whole batch split by the BLAS's own threads (tall, thin products;
/// bench/RESULTS.md, "channels_last (NHWC) forward + backward on the CPU").
template <class T>
std::int64_t conv2d_nhwc_parts(const conv2d_geometry& g) {
  return tessera::detail::matmul_accumulates<T, cpu>() ? g.cpu_parts : 1;
}

/// Calls run(part) for parts 0 .. parts - 1, at once on the device's threads (on the calling
/// thread when there is one part): the CPU loops' parts of a batch, NCHW and NHWC alike.
template <class Run>
void conv2d_run_parts(std::int64_t parts, Run&& run) {
  backend::cpu::execute_loop(0, parts, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t part = begin; part < end; ++part) run(part);
  });
}

/// Elements of the col buffer conv2d_forward_nhwc_cpu fills chunk by chunk, a chunk per part
/// (0: a 1x1 convolution with stride 1 and no padding, which needs none).
template <class T>
std::int64_t conv2d_nhwc_col_numel(const conv2d_geometry& g) {
  if (g.pointwise()) return 0;
  return conv2d_nhwc_parts<T>(g) * conv2d_nhwc_chunk(g) * g.kh * g.kw * g.c;
}

/// Elements of the chunk buffer conv2d_backward_nhwc_cpu takes for the gradients asked for (a
/// chunk's col, then its dcol, per part): the forward's col; for a 1x1 stride-1 unpadded
/// convolution none, except where the GEMM cannot add into its output (no BLAS), where a chunk
/// of the input gradient's products is staged in it before being added into dx.
template <class T>
std::int64_t conv2d_nhwc_backward_col_numel(const conv2d_geometry& g, bool input, bool weight) {
  if (!input && !weight) return 0;
  if (!g.pointwise()) return conv2d_nhwc_col_numel<T>(g);
  return input && !tessera::detail::matmul_accumulates<T, cpu>() ? conv2d_nhwc_chunk(g) * g.c : 0;
}

/// Elements of the buffer for the weight gradient's products of conv2d_backward_nhwc_cpu that do
/// not go straight into dW: [O, KH * KW * C] staging where the GEMM cannot add (no BLAS); with
/// parts, each part's but the first's own sum ((parts - 1) of them, added into dW after all
/// parts, in order); else 0.
template <class T>
std::int64_t conv2d_nhwc_backward_staging_numel(const conv2d_geometry& g, bool weight) {
  if (!weight) return 0;
  const std::int64_t filter = g.o * g.kh * g.kw * g.c;
  if (!tessera::detail::matmul_accumulates<T, cpu>()) return filter;
  return (conv2d_nhwc_parts<T>(g) - 1) * filter;
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

/// The [rows, columns] row-major matrix over a dense tensor's bytes (a channels_last tensor's
/// NHWC storage: an activation's [N * H * W, C], a weight's [O, KH * KW * C]).
template <class T>
Tensor<T, cpu> nhwc_matrix(const Tensor<T, cpu>& t, std::int64_t rows, std::int64_t columns) {
  return Tensor<T, cpu>(t.storage(), Shape{rows, columns}, Strides{columns, 1}, t.storage_offset());
}

/// Adds rows [first, first + rows) of dcol [rows, KH * KW * C] (the NHWC im2col's layout) into
/// dx (NHWC bytes): each row's (i, j) run of C channels into the input pixel im2col_nhwc_cpu
/// read it from; padding's runs are dropped. Threaded over the input rows (n, ih) the chunk
/// reaches, each thread adding only into its own rows, so every element sums its terms in the
/// same order (positions, then kernel offsets) whatever the thread count.
template <class T>
void col2im_nhwc_add_cpu(const conv2d_geometry& g, const T* dcol, std::int64_t first,
                         std::int64_t rows, T* dx) {
  if (rows <= 0) return;
  const std::int64_t k = g.kh * g.kw * g.c, last = first + rows - 1;
  const std::int64_t n0 = first / (g.oh * g.ow), oh0 = first / g.ow % g.oh;
  const std::int64_t n1 = last / (g.oh * g.ow), oh1 = last / g.ow % g.oh;
  const std::int64_t lo = n0 * g.h + std::clamp<std::int64_t>(oh0 * g.sh - g.ph, 0, g.h);
  const std::int64_t hi =
      n1 * g.h + std::clamp<std::int64_t>(oh1 * g.sh - g.ph + (g.kh - 1) * g.dh + 1, 0, g.h);
  const std::int64_t grain = std::max<std::int64_t>(1, backend::cpu::grain_size / (g.w * g.c + 1));
  backend::cpu::execute_loop(lo, hi, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t p = first + r;
      const std::int64_t ow = p % g.ow, oh = p / g.ow % g.oh, n = p / (g.ow * g.oh);
      const T* row = dcol + r * k;
      for (std::int64_t i = 0; i < g.kh; ++i) {
        const std::int64_t ih = oh * g.sh - g.ph + i * g.dh;
        const std::int64_t line = n * g.h + ih;
        if (ih < 0 || ih >= g.h || line < begin || line >= end) continue;
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const std::int64_t iw = ow * g.sw - g.pw + j * g.dw;
          if (iw < 0 || iw >= g.w) continue;
          T* pixel = dx + (line * g.w + iw) * g.c;
          const T* in = row + (i * g.kw + j) * g.c;
          for (std::int64_t c = 0; c < g.c; ++c) pixel[c] += in[c];
        }
      }
    }
  });
}

/// y = conv2d(x, w) (+ bias) with x and y [N, C, H, W] / [N, O, OH, OW] dense channels_last
/// (conv2d_runs_nhwc), w in any layout (copied to channels_last when it is not), in
/// conv2d_nhwc_parts parts at once. `col`: a buffer of conv2d_nhwc_col_numel(g) elements (a
/// program's planned workspace), or undefined: one from the pool.
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
  const std::int64_t parts = conv2d_nhwc_parts<T>(g), chunk = conv2d_nhwc_chunk(g);
  if (!g.pointwise() && !col.defined()) {
    col = Tensor<T, cpu>::empty_on(Shape{conv2d_nhwc_col_numel<T>(g)}, x.device());
  }
  const Tensor<T, cpu> x2 = g.pointwise() ? nhwc_matrix(x, positions, g.c) : Tensor<T, cpu>();
  conv2d_run_parts(parts, [&](std::int64_t part) {
    const auto [image, images] = conv2d_part(g, parts, part);
    if (images == 0) return;
    const std::int64_t begin = image * g.oh * g.ow, count = images * g.oh * g.ow;
    if (g.pointwise()) {
      Tensor<T, cpu> out = y2.narrow(0, begin, count);
      tessera::detail::matmul_into(out, x2.narrow(0, begin, count), w2t);
      return;
    }
    const Tensor<T, cpu> part_col = col.narrow(0, part * chunk * k, chunk * k);
    for (std::int64_t first = begin; first < begin + count; first += chunk) {
      const std::int64_t rows = std::min(chunk, begin + count - first);
      im2col_nhwc_cpu(g, x.data(), first, rows, part_col.data());
      Tensor<T, cpu> out = y2.narrow(0, first, rows);
      tessera::detail::matmul_into(out, part_col.narrow(0, 0, rows * k).view(Shape{rows, k}), w2t);
    }
  });
  if (bias != nullptr) {
    tessera::detail::add_into(y2, tessera::detail::as_node(bias->view(Shape{1, g.o})));
  }
}

/// The input and weight gradients of y = conv2d(x, w) for gy, natively on NHWC-dense x, w, gy,
/// dx and dw (conv2d_backward's contract; conv2d_nhwc_native): each of dx, dw that is defined is
/// written, or added to when its accumulate flag is set; x is read only for dw. In
/// conv2d_nhwc_parts parts at once, each over its images' output positions, and per chunk of
/// them: col = im2col(x), dW (+)= gyᵀ @ col, then dcol = gy @ W into the same buffer, which
/// col2im adds into dx (zeroed first unless added to; the parts' images, so their pixels, are
/// their own). A 1x1 stride-1 unpadded convolution: dW (+)= gyᵀ @ x and dx (+)= gy @ W, one GEMM
/// each per part. The first part's weight-gradient products go into dW, each other part's into
/// a sum of its own in `staging`, added into dW after all parts, in order. `col` and `staging`:
/// buffers of conv2d_nhwc_backward_col_numel and conv2d_nhwc_backward_staging_numel elements.
template <class T>
void conv2d_backward_nhwc_cpu(const conv2d_geometry& g, const Tensor<T, cpu>& x,
                              const Tensor<T, cpu>& w, const Tensor<T, cpu>& gy, Tensor<T, cpu>* dx,
                              bool dx_accumulate, Tensor<T, cpu>* dw, bool dw_accumulate,
                              const Tensor<T, cpu>& col, const Tensor<T, cpu>& staging) {
  using tessera::detail::matmul_add_into;
  using tessera::detail::matmul_into;
  const std::int64_t positions = g.n * g.oh * g.ow, k = g.kh * g.kw * g.c;
  if (positions == 0) {  // no terms: a written gradient is zero
    if (dx != nullptr && !dx_accumulate) dx->zero_();
    if (dw != nullptr && !dw_accumulate) dw->zero_();
    return;
  }
  const std::int64_t parts = conv2d_nhwc_parts<T>(g), chunk = conv2d_nhwc_chunk(g);
  const Tensor<T, cpu> gy2 = nhwc_matrix(gy, positions, g.o);
  const Tensor<T, cpu> w2 = dx != nullptr
                                ? nhwc_matrix(w.contiguous(memory_format::channels_last), g.o, k)
                                : Tensor<T, cpu>();
  const Tensor<T, cpu> dw2 = dw != nullptr ? nhwc_matrix(*dw, g.o, k) : Tensor<T, cpu>();
  // Part p's weight gradient, and the buffer that stages products where the GEMM cannot add.
  const auto dw_of = [&](std::int64_t part) {
    return part == 0 ? dw2 : staging.narrow(0, (part - 1) * g.o * k, g.o * k).view(Shape{g.o, k});
  };
  const Tensor<T, cpu> products = parts == 1 ? staging : Tensor<T, cpu>();
  if (dx != nullptr && !dx_accumulate && !g.pointwise()) dx->zero_();
  conv2d_run_parts(parts, [&](std::int64_t part) {
    const auto [image, images] = conv2d_part(g, parts, part);
    if (images == 0) return;
    const std::int64_t begin = image * g.oh * g.ow, count = images * g.oh * g.ow;
    const bool dw_adds = part == 0 && dw_accumulate;
    if (g.pointwise()) {
      if (dw != nullptr) {
        matmul_add_into(dw_of(part), gy2.narrow(0, begin, count).t(),
                        nhwc_matrix(x, positions, g.c).narrow(0, begin, count), dw_adds, products);
      }
      if (dx == nullptr) return;
      Tensor<T, cpu> dx2 = nhwc_matrix(*dx, positions, g.c).narrow(0, begin, count);
      const Tensor<T, cpu> gy_part = gy2.narrow(0, begin, count);
      if (!dx_accumulate || tessera::detail::matmul_accumulates<T, cpu>()) {
        matmul_into(dx2, gy_part, w2, dx_accumulate);
        return;
      }
      // No BLAS (one part): staged in chunks of positions (col), each added into its rows of dx.
      for (std::int64_t first = 0; first < count; first += chunk) {
        const std::int64_t rows = std::min(chunk, count - first);
        matmul_add_into(dx2.narrow(0, first, rows), gy_part.narrow(0, first, rows), w2, true, col);
      }
      return;
    }
    const Tensor<T, cpu> part_col = col.narrow(0, part * chunk * k, chunk * k);
    for (std::int64_t first = begin; first < begin + count; first += chunk) {
      const std::int64_t rows = std::min(chunk, begin + count - first);
      Tensor<T, cpu> col2 = part_col.narrow(0, 0, rows * k).view(Shape{rows, k});
      const Tensor<T, cpu> gy_chunk = gy2.narrow(0, first, rows);
      if (dw != nullptr) {
        im2col_nhwc_cpu(g, x.data(), first, rows, col2.data());
        matmul_add_into(dw_of(part), gy_chunk.t(), col2, dw_adds || first > begin, products);
      }
      if (dx == nullptr) continue;
      matmul_into(col2, gy_chunk, w2);  // dcol overwrites the chunk's col (dW's use is done)
      col2im_nhwc_add_cpu(g, col2.data(), first, rows, dx->data());
    }
  });
  if (dw == nullptr) return;
  for (std::int64_t part = 1; part < parts; ++part) {
    if (conv2d_part(g, parts, part).second > 0) {
      tessera::detail::add_into(dw2, tessera::detail::as_node(dw_of(part)));
    }
  }
}

}  // namespace tessera::nn::detail
