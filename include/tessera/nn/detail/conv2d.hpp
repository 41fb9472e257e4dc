// 2-D convolution on NCHW tensors as GEMMs (torch.nn.functional.conv2d): the forward and
// backward passes on tensors (the geometry and its checks are in nn/detail/conv2d_geometry.hpp,
// the workspace in nn/detail/workspace.hpp). Shared by the eager functional form and the autograd
// node, which gives them workspace from its plan.
// Long file: the three passes (forward, input gradient, weight gradient) on each of the three
// ways to run them (cuDNN, Winograd, im2col + GEMM, on CPU loops or device-agnostic
// expressions) read the same geometry and workspace layout, and are kept side by side so that
// a change to one path is made to its twins.
//
// Per image and group, out = W_g @ col_g, where col (im2col) holds the input patches as rows
// (c, i, j) and columns (oh, ow). A 1x1 convolution with stride 1 and no padding needs no col:
// the image itself, viewed [C, H * W], is the right operand. Backward: dW_g += g_g @ col_g^T,
// dcol_g = W_g^T @ g_g, and col2im adds dcol back into the input's gradient (it is additive, so
// accumulating into an existing gradient costs nothing more).
//
// On CUDA, cuDNN runs the three products when the build has it and it takes the problem (its
// algorithms are chosen once, when a convolution is traced or called, and kept in the geometry
// with their workspace sizes, so a program runs what its memory plan was made for); otherwise
// the im2col + cuBLAS path below.
//
// On CPU, a 3x3 convolution with stride 1 or 2, no dilation, one group and enough channels runs
// as Winograd F(2x2, 3x3) (nn/detail/winograd.hpp: 16 products per 2x2 outputs and channel pair
// instead of 36 with stride 1, 25 with stride 2), its forward and both gradients (the weight's
// with a BLAS); every other convolution as GEMMs with im2col.
//
// channels_last (g.channels_last: x, w, y and their gradients NHWC-dense): cuDNN takes the NHWC
// tensors as they are; otherwise the CPU passes (forward, input and weight gradients) run
// natively on NHWC where conv2d_nhwc_native allows (nn/detail/conv2d_nhwc.hpp), and everything
// else copies its operands to NCHW in the workspace, runs the NCHW passes and copies (or adds)
// the results back (conv2d_nchw_copies).
//
// im2col and col2im have two implementations. On CPU, direct loops over channels (threaded;
// rows of a stride-1 window are copies). Elsewhere (CUDA), the device-agnostic form: the input is
// copied into a zero-padded buffer, col is one strided copy of a 6-D view of it, and col2im is
// one strided addition per kernel offset (i, j); every step is an expression the device's
// executor runs, so no convolution kernel of its own is needed. Tests run that form on CPU too
// (conv2d_use_generic_path).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/backend/cuda/cudnn.hpp"
#include "tessera/core/detail/checked.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/expr/reduce.hpp"
#include "tessera/nn/detail/conv2d_geometry.hpp"
#include "tessera/nn/detail/conv2d_nhwc.hpp"
#include "tessera/nn/detail/winograd.hpp"
#include "tessera/nn/detail/workspace.hpp"
#include "tessera/tensor/storage.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn::detail {

/// True when the CPU loops run the forward and the input gradient as Winograd F(2x2, 3x3) (with
/// stride 1 or 2).
template <class T, class K>
bool conv2d_winograd(const conv2d_geometry& g) {
  return std::is_same_v<K, cpu> &&
         (std::is_same_v<T, float> || std::is_same_v<T, double>)&&!conv2d_use_generic_path() &&
         g.winograd;
}

/// True when the CPU loops run the weight gradient as Winograd too: it sums its GEMMs over the
/// blocks of tiles in their output (a BLAS; the built-in GEMM does not add).
template <class T, class K>
bool conv2d_winograd_weight_grad(const conv2d_geometry& g) {
  return conv2d_winograd<T, K>(g) && tessera::detail::matmul_accumulates<T, K>();
}

/// The forward as a Winograd problem: x [N, C, H, W] into y [N, O, OH, OW] (its weight gradient
/// too).
inline winograd_problem conv2d_winograd_forward(const conv2d_geometry& g) {
  return winograd_problem_of(g.n, g.c, g.h, g.w, g.o, g.ph, g.pw, conv2d_winograd_block_elements(),
                             g.sh);
}

/// The input gradient as a Winograd problem: with stride 1, gy [N, O, OH, OW] into dx
/// [N, C, H, W], with the weight turned and padding 2 - p; with stride 2, the forward's problem
/// run backwards (winograd_s2_input_grad_cpu).
inline winograd_problem conv2d_winograd_input_grad(const conv2d_geometry& g) {
  if (g.sh == 2) return conv2d_winograd_forward(g);
  return winograd_problem_of(g.n, g.o, g.oh, g.ow, g.c, 2 - g.ph, 2 - g.pw,
                             conv2d_winograd_block_elements());
}

/// Elements of the scratch that a backward's Winograd gradients share (they run one after the
/// other), 0 when none runs as Winograd.
template <class T, class K>
std::int64_t conv2d_winograd_backward_numel(const conv2d_geometry& g, bool input, bool weight) {
  if (!conv2d_winograd<T, K>(g)) return 0;
  std::int64_t numel = 0;
  if (input) numel = winograd_workspace_numel<T>(conv2d_winograd_input_grad(g));
  if (weight && conv2d_winograd_weight_grad<T, K>(g)) {
    numel = std::max(numel, winograd_workspace_numel<T>(conv2d_winograd_forward(g)));
  }
  return numel;
}

/// Images per pass: on CPU the geometry's choice (one image when its positions fill the GEMM;
/// more when they are few), on CUDA all (one strided copy per pass instead of one per image).
template <class K>
std::int64_t conv2d_images_per_pass(const conv2d_geometry& g) {
  if constexpr (std::is_same_v<K, cpu>) {
    return conv2d_use_generic_path() ? std::max<std::int64_t>(1, std::min<std::int64_t>(g.n, 2))
                                     : g.cpu_pass;
  } else {
    return std::max<std::int64_t>(1, g.n);
  }
}

/// Output rows per chunk of an image in the CPU loops (g.cpu_chunk), 0 when images run whole
/// (and on the generic path).
template <class K>
std::int64_t conv2d_chunk_rows(const conv2d_geometry& g) {
  return std::is_same_v<K, cpu> && !conv2d_use_generic_path() ? g.cpu_chunk : 0;
}

/// True when the CPU loops gather a pass's images into one GEMM operand (several per pass).
template <class K>
bool conv2d_gathers(const conv2d_geometry& g) {
  return !conv2d_generic<K>() && conv2d_images_per_pass<K>(g) > 1;
}

/// True when the CPU loops split the batch into g.cpu_parts parts run at once, each with its own
/// col and gathered buffers and, for the weight's gradient, its own sum of the products (added
/// into the gradient at the end). Only with a BLAS that accumulates (beta = 1), which the parts'
/// own sums need; not for Winograd, which shares its 16 products between the threads itself.
template <class T, class K>
bool conv2d_split(const conv2d_geometry& g) {
  if constexpr (std::is_same_v<K, cpu>) {
    return g.cpu_parts > 1 && !conv2d_generic<K>() && !conv2d_winograd<T, K>(g) &&
           tessera::detail::matmul_accumulates<T, K>();
  } else {
    return false;
  }
}

/// Elements of a pass's col matrix: the patches of its images ([C * KH * KW, images * OH * OW]
/// on CPU, [images, C * KH * KW, OH * OW] on the generic path). A 1x1 convolution reads the
/// image itself unless the CPU loops gather several.
template <class K>
std::int64_t conv2d_col_numel(const conv2d_geometry& g) {
  if (g.pointwise() && !conv2d_gathers<K>(g)) return 0;
  if (const std::int64_t rows = conv2d_chunk_rows<K>(g); rows > 0) return g.patch() * rows * g.ow;
  return conv2d_images_per_pass<K>(g) * g.c * g.kh * g.kw * g.spatial();
}

/// Elements of the buffer a gathering CPU pass multiplies into (forward) or gathers the upstream
/// gradient into (backward): [O, images * OH * OW]; with chunks, a chunk's forward output.
template <class K>
std::int64_t conv2d_gathered_numel(const conv2d_geometry& g) {
  if (const std::int64_t rows = conv2d_chunk_rows<K>(g); rows > 0) return g.o * rows * g.ow;
  return conv2d_gathers<K>(g) ? conv2d_images_per_pass<K>(g) * g.o * g.spatial() : 0;
}
/// The zero-padded copy of a pass's images that the generic path reads ([0] when none is used).
template <class K>
Shape conv2d_padded_shape(const conv2d_geometry& g) {
  if (!conv2d_generic<K>() || g.pointwise()) return Shape{0};
  return Shape{conv2d_images_per_pass<K>(g), g.c, g.h + 2 * g.ph, g.w + 2 * g.pw};
}
template <class K>
std::int64_t conv2d_padded_numel(const conv2d_geometry& g) {
  return conv2d_padded_shape<K>(g).numel();
}

/// True when a channels_last convolution's passes run on NCHW copies in the workspace (neither
/// cuDNN nor the native NHWC loops take it).
template <class T, class K>
bool conv2d_nchw_copies(const conv2d_geometry& g) {
  return g.channels_last && !g.cudnn.usable && !conv2d_nhwc_native<T, K>(g);
}

/// The geometry of the NCHW passes a channels_last convolution runs on copies.
inline conv2d_geometry conv2d_nchw_geometry(const conv2d_geometry& g) {
  conv2d_geometry nchw = g;
  nchw.channels_last = false;
  return nchw;
}

inline Shape conv2d_weight_shape(const conv2d_geometry& g) {
  return Shape{g.o, g.in_per_group(), g.kh, g.kw};
}

template <class T, class K>
std::size_t conv2d_forward_workspace(const conv2d_geometry& g);

/// Workspace bytes of the NCHW copies of a channels_last forward, and of its NCHW passes.
template <class T, class K>
std::size_t conv2d_forward_copies_workspace(const conv2d_geometry& g) {
  return workspace::bytes<T>(g.n * g.c * g.h * g.w) +
         workspace::bytes<T>(conv2d_weight_shape(g).numel()) +
         workspace::bytes<T>(g.output_shape().numel()) +
         conv2d_forward_workspace<T, K>(conv2d_nchw_geometry(g));
}

/// Workspace bytes of conv2d_forward.
template <class T, class K>
std::size_t conv2d_forward_workspace(const conv2d_geometry& g) {
  if (g.cudnn.usable) return workspace::raw_bytes(g.cudnn.forward_bytes);
  if (g.channels_last) {
    if (conv2d_nhwc_native<T, K>(g)) return workspace::bytes<T>(conv2d_nhwc_col_numel<T>(g));
    return conv2d_forward_copies_workspace<T, K>(g);
  }
  if (conv2d_winograd<T, K>(g))
    return workspace::bytes<T>(winograd_workspace_numel<T>(conv2d_winograd_forward(g)));
  const std::size_t parts = conv2d_split<T, K>(g) ? static_cast<std::size_t>(g.cpu_parts) : 1;
  return parts * (workspace::bytes<T>(conv2d_col_numel<K>(g)) +
                  workspace::bytes<T>(conv2d_gathered_numel<K>(g))) +
         workspace::bytes<T>(conv2d_padded_numel<K>(g));
}

/// Workspace bytes of conv2d_backward for the gradients asked for.
template <class T, class K>
std::size_t conv2d_backward_workspace(const conv2d_geometry& g, bool input, bool weight,
                                      bool bias) {
  if (conv2d_nchw_copies<T, K>(g) && (input || weight)) {
    // gy's and w's copies (the NCHW passes view w even for the weight's gradient alone), dx's
    // for the input gradient, x's and dw's for the weight's, then the NCHW passes (the bias's
    // gradient among them).
    const std::size_t image = workspace::bytes<T>(g.n * g.c * g.h * g.w);
    const std::size_t filter = workspace::bytes<T>(conv2d_weight_shape(g).numel());
    return workspace::bytes<T>(g.output_shape().numel()) + filter + (input ? image : 0) +
           (weight ? image + filter : 0) +
           conv2d_backward_workspace<T, K>(conv2d_nchw_geometry(g), input, weight, bias);
  }
  std::size_t bytes = 0;
  if (bias) bytes += workspace::bytes<T>(g.n * g.o) + workspace::bytes<T>(g.o);
  if (g.cudnn.usable) {
    // The two calls run one after the other on one stream: they share the bytes.
    return bytes +
           workspace::raw_bytes(std::max(input ? g.cudnn.backward_data_bytes : std::size_t{0},
                                         weight ? g.cudnn.backward_filter_bytes : std::size_t{0}));
  }
  if constexpr (std::is_same_v<K, cpu> && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
    if (g.channels_last) {
      // Natively on NHWC (conv2d_backward_nhwc_cpu): a chunk of col per part, and the staging
      // (without a BLAS) or the other parts' weight-gradient sums.
      return bytes + workspace::bytes<T>(conv2d_nhwc_backward_col_numel<T>(g, input, weight)) +
             workspace::bytes<T>(conv2d_nhwc_backward_staging_numel<T>(g, weight));
    }
  }
  if (const std::int64_t numel = conv2d_winograd_backward_numel<T, K>(g, input, weight);
      numel > 0) {
    // The Winograd gradients; an im2col weight gradient (no BLAS) plans alone, below.
    bytes += workspace::bytes<T>(numel);
    input = false;
    if (conv2d_winograd_weight_grad<T, K>(g)) weight = false;
  }
  if (input || weight) {
    const std::size_t parts = conv2d_split<T, K>(g) ? static_cast<std::size_t>(g.cpu_parts) : 1;
    bytes += parts * (workspace::bytes<T>(conv2d_col_numel<K>(g)) +
                      workspace::bytes<T>(conv2d_gathered_numel<K>(g)));
    bytes += workspace::bytes<T>(conv2d_padded_numel<K>(g));
    // Each part but the first sums its weight-gradient products apart.
    if (weight && parts > 1) bytes += (parts - 1) * workspace::bytes<T>(g.o * g.patch());
  }
  if (!tessera::detail::matmul_accumulates<T, K>()) {
    // Products added into a gradient go through a staging buffer.
    std::int64_t staging = 0;
    if (weight) staging = std::max(staging, g.out_per_group() * g.patch());
    if (input && g.pointwise()) staging = std::max(staging, g.in_per_group() * g.h * g.w);
    bytes += workspace::bytes<T>(staging);
  }
  return bytes;
}

// ---- im2col / col2im --------------------------------------------------------------------------

/// The output columns [lo, hi) whose input column x * sw + shift lies inside the image (shift:
/// the kernel column's offset j * dw - pw).
inline std::pair<std::int64_t, std::int64_t> inside_columns(const conv2d_geometry& g,
                                                            std::int64_t shift) {
  std::int64_t lo = shift >= 0 ? 0 : (-shift + g.sw - 1) / g.sw;
  std::int64_t hi = g.w - shift <= 0 ? 0 : (g.w - shift + g.sw - 1) / g.sw;
  lo = std::min(lo, g.ow);
  return {lo, std::clamp(hi, lo, g.ow)};
}

/// col [C * KH * KW, OH * OW] of one contiguous image [C, H, W] (CPU), row r at col + r * ld.
template <class T>
void im2col_cpu(const conv2d_geometry& g, const T* image, T* col, std::int64_t ld,
                std::int64_t y_first = 0, std::int64_t y_last = -1) {
  if (y_last < 0) y_last = g.oh;
  const std::int64_t spatial = (y_last - y_first) * g.ow;
  const std::int64_t rows = g.c * g.kh * g.kw;
  backend::cpu::execute_loop(0, rows, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(spatial, 1)),
                             [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t r = first; r < last; ++r) {
      const std::int64_t j = r % g.kw, i = (r / g.kw) % g.kh, c = r / (g.kw * g.kh);
      const T* plane = image + c * g.h * g.w;
      T* row = col + r * ld;
      const std::int64_t shift = j * g.dw - g.pw;
      const auto [lo, hi] = inside_columns(g, shift);
      for (std::int64_t y = y_first; y < y_last; ++y) {
        T* out = row + (y - y_first) * g.ow;
        const std::int64_t ih = y * g.sh - g.ph + i * g.dh;
        if (ih < 0 || ih >= g.h) {
          std::fill(out, out + g.ow, T(0));
          continue;
        }
        // Input column of output column x: x * sw + shift (inside the row for x in [lo, hi)).
        const T* in = plane + ih * g.w;
        std::fill(out, out + lo, T(0));
        if (g.sw == 1) {
          std::copy(in + (lo + shift), in + (hi + shift), out + lo);
        } else if (g.sw == 2) {
          // Every second element, the stride known: GCC vectorises this (two loads and a
          // shuffle per vector), where the loop for any stride stays scalar.
          if (lo < hi) {
            const T* start = in + (2 * lo + shift);
            for (std::int64_t x = 0; x < hi - lo; ++x) out[lo + x] = start[2 * x];
          }
        } else {
          for (std::int64_t x = lo; x < hi; ++x) out[x] = in[x * g.sw + shift];
        }
        std::fill(out + hi, out + g.ow, T(0));
      }
    }
  });
}

/// image [C, H, W] += col2im(col) (CPU), row r of col at col + r * ld: threads own channels, so
/// no two write one element. col holds output rows [y_first, y_last) (all by default).
template <class T>
void col2im_add_cpu(const conv2d_geometry& g, const T* col, T* image, std::int64_t ld,
                    std::int64_t y_first = 0, std::int64_t y_last = -1) {
  if (y_last < 0) y_last = g.oh;
  backend::cpu::execute_loop(0, g.c, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t c = first; c < last; ++c) {
      T* plane = image + c * g.h * g.w;
      for (std::int64_t i = 0; i < g.kh; ++i) {
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
          const std::int64_t shift = j * g.dw - g.pw;
          const auto [lo, hi] = inside_columns(g, shift);
          for (std::int64_t y = y_first; y < y_last; ++y) {
            const std::int64_t ih = y * g.sh - g.ph + i * g.dh;
            if (ih < 0 || ih >= g.h) continue;
            T* out = plane + ih * g.w;
            const T* in = row + (y - y_first) * g.ow;
            if (g.sw != 2) {
              for (std::int64_t x = lo; x < hi; ++x) out[x * g.sw + shift] += in[x];
            } else if (lo < hi) {
              // out[2x + shift] += in[x]. The element between two of them gets -0.0 added, the
              // one addend that leaves every value as it is, so that each pair is written whole
              // and GCC vectorises the loop (a scatter to every second element stays scalar).
              T* start = out + (2 * lo + shift);
              const std::int64_t count = hi - lo;
              // Pairs while the second element is still inside the row.
              const std::int64_t pairs =
                  std::clamp<std::int64_t>((g.w - (2 * lo + shift)) / 2, 0, count);
              for (std::int64_t x = 0; x < pairs; ++x) {
                start[2 * x] += in[lo + x];
                start[2 * x + 1] += T(-0.0);
              }
              for (std::int64_t x = pairs; x < count; ++x) start[2 * x] += in[lo + x];
            }
          }
        }
      }
    }
  });
}

/// The [B, C, KH, KW, OH, OW] view of a zero-padded buffer [B, C, Hp, Wp] whose elements are the
/// patches (overlapping windows: read only).
template <class T, class K>
Tensor<T, K> patches_view(const conv2d_geometry& g, const Tensor<T, K>& padded) {
  const std::int64_t hp = g.h + 2 * g.ph, wp = g.w + 2 * g.pw;
  const std::int64_t b = padded.size(0);
  return Tensor<T, K>(padded.storage(), Shape{b, g.c, g.kh, g.kw, g.oh, g.ow},
                      Strides{g.c * hp * wp, hp * wp, g.dh * wp, g.dw, g.sh * wp, g.sw},
                      padded.storage_offset());
}

/// col [B, C, KH, KW, OH, OW] of images [B, C, H, W] (any layout) through `padded`, the
/// device-agnostic way.
template <class T, class K>
void im2col_generic(const conv2d_geometry& g, const Tensor<T, K>& images, Tensor<T, K>& padded,
                    Tensor<T, K>& col) {
  using tessera::detail::as_node;
  using tessera::detail::run_expression;
  const std::int64_t b = images.size(0);
  if (g.ph == 0 && g.pw == 0) {
    // The images are their own padded buffer when contiguous.
    if (images.is_contiguous()) {
      Tensor<T, K> out = col.view(Shape{b, g.c, g.kh, g.kw, g.oh, g.ow});
      run_expression(out, as_node(patches_view(g, images)));
      return;
    }
  }
  padded.zero_();
  Tensor<T, K> interior = padded.narrow(2, g.ph, g.h).narrow(3, g.pw, g.w);
  run_expression(interior, as_node(images));
  Tensor<T, K> out = col.view(Shape{b, g.c, g.kh, g.kw, g.oh, g.ow});
  run_expression(out, as_node(patches_view(g, padded)));
}

/// images [B, C, H, W] (contiguous) += col2im(col), the device-agnostic way: one strided
/// addition per kernel offset (within one offset the windows' elements are distinct).
template <class T, class K>
void col2im_add_generic(const conv2d_geometry& g, const Tensor<T, K>& col, Tensor<T, K>& images,
                        Tensor<T, K>& padded) {
  using tessera::detail::as_node;
  const std::int64_t b = images.size(0);
  const bool pad = g.ph != 0 || g.pw != 0;
  Tensor<T, K> target = images;
  if (pad) {
    padded.zero_();
    target = padded;
  }
  const std::int64_t hp = g.h + 2 * g.ph, wp = g.w + 2 * g.pw;
  const Tensor<T, K> col6 = col.view(Shape{b, g.c, g.kh, g.kw, g.oh, g.ow});
  for (std::int64_t i = 0; i < g.kh; ++i) {
    for (std::int64_t j = 0; j < g.kw; ++j) {
      Tensor<T, K> window(target.storage(), Shape{b, g.c, g.oh, g.ow},
                          Strides{g.c * hp * wp, hp * wp, g.sh * wp, g.sw},
                          target.storage_offset() + i * g.dh * wp + j * g.dw);
      const Tensor<T, K> piece = col6.select(2, i).select(2, j);
      tessera::detail::add_into(window, as_node(piece));
    }
  }
  if (pad) {
    Tensor<T, K> interior = padded.narrow(2, g.ph, g.h).narrow(3, g.pw, g.w);
    tessera::detail::add_into(images, as_node(interior));
  }
}

// ---- passes -----------------------------------------------------------------------------------

/// packed [rows, b * plane] from b contiguous blocks [rows, plane] `stride` elements apart (CPU):
/// a pass's images side by side, as one GEMM operand.
template <class T>
void pack_images_cpu(const T* images, std::int64_t stride, std::int64_t b, std::int64_t rows,
                     std::int64_t plane, T* packed) {
  backend::cpu::execute_loop(0, rows,
                             std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(b * plane, 1)),
                             [&](std::int64_t first, std::int64_t last) {
                               for (std::int64_t r = first; r < last; ++r) {
                                 for (std::int64_t m = 0; m < b; ++m) {
                                   const T* from = images + m * stride + r * plane;
                                   std::copy(from, from + plane, packed + (r * b + m) * plane);
                                 }
                               }
                             });
}

/// The inverse of pack_images_cpu: each block [rows, plane] of `images` is set to (or, with
/// `add`, added to) its columns of packed [rows, b * plane].
template <class T>
void unpack_images_cpu(const T* packed, std::int64_t b, std::int64_t rows, std::int64_t plane,
                       T* images, std::int64_t stride, bool add) {
  backend::cpu::execute_loop(0, rows,
                             std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(b * plane, 1)),
                             [&](std::int64_t first, std::int64_t last) {
                               for (std::int64_t r = first; r < last; ++r) {
                                 for (std::int64_t m = 0; m < b; ++m) {
                                   const T* from = packed + (r * b + m) * plane;
                                   T* to = images + m * stride + r * plane;
                                   if (add) {
                                     for (std::int64_t e = 0; e < plane; ++e) to[e] += from[e];
                                   } else {
                                     std::copy(from, from + plane, to);
                                   }
                                 }
                               }
                             });
}

/// col [C * KH * KW, b * OH * OW] of images [first, first + b) of x (contiguous, CPU): image m's
/// patches in columns [m * OH * OW, (m + 1) * OH * OW). A 1x1 convolution's col is its images.
template <class T>
void conv2d_col_cpu(const conv2d_geometry& g, const T* x, std::int64_t first, std::int64_t b,
                    T* col) {
  const std::int64_t image = g.c * g.h * g.w, spatial = g.spatial();
  if (g.pointwise()) {
    pack_images_cpu(x + first * image, image, b, g.c, spatial, col);
    return;
  }
  for (std::int64_t m = 0; m < b; ++m)
    im2col_cpu(g, x + (first + m) * image, col + m * spatial, b * spatial);
}

// The three products of a pass, per group g: W_g is rows [g * O/groups, ...) of the weight
// [O, patch], and the col-side operand has `patch` rows per group (a 1x1 convolution's patch is
// its channels per group, so its image takes col's place unchanged).

/// out_g = W_g @ col_g for every group: out [O, columns], col [groups * patch, columns].
template <class T, class K>
void conv2d_output_gemms(const conv2d_geometry& g, const Tensor<T, K>& out, const Tensor<T, K>& w2,
                         const Tensor<T, K>& col) {
  const std::int64_t og = g.out_per_group(), k = g.patch();
  for (std::int64_t grp = 0; grp < g.groups; ++grp) {
    Tensor<T, K> out_g = out.narrow(0, grp * og, og);
    tessera::detail::matmul_into(out_g, w2.narrow(0, grp * og, og), col.narrow(0, grp * k, k));
  }
}

/// dW_g = gy_g @ col_g^T for every group, or += when `accumulate`: gy [O, columns], col
/// [groups * patch, columns]. `staging` as matmul_add_into's.
template <class T, class K>
void conv2d_weight_grad_gemms(const conv2d_geometry& g, const Tensor<T, K>& dw,
                              const Tensor<T, K>& gy, const Tensor<T, K>& col, bool accumulate,
                              const Tensor<T, K>& staging) {
  const std::int64_t og = g.out_per_group(), k = g.patch();
  const Tensor<T, K> dw2 = dw.view(Shape{g.o, k});
  for (std::int64_t grp = 0; grp < g.groups; ++grp) {
    tessera::detail::matmul_add_into(dw2.narrow(0, grp * og, og), gy.narrow(0, grp * og, og),
                                     col.narrow(0, grp * k, k).t(), accumulate, staging);
  }
}

/// dcol_g = W_g^T @ gy_g for every group, or += when `accumulate`: dcol [groups * patch,
/// columns] (col's gradient, or a 1x1 convolution's input gradient itself), gy [O, columns].
template <class T, class K>
void conv2d_input_grad_gemms(const conv2d_geometry& g, const Tensor<T, K>& dcol,
                             const Tensor<T, K>& w2, const Tensor<T, K>& gy, bool accumulate,
                             const Tensor<T, K>& staging) {
  const std::int64_t og = g.out_per_group(), k = g.patch();
  for (std::int64_t grp = 0; grp < g.groups; ++grp) {
    tessera::detail::matmul_add_into(dcol.narrow(0, grp * k, k), w2.narrow(0, grp * og, og).t(),
                                     gy.narrow(0, grp * og, og), accumulate, staging);
  }
}

/// col of images [first, first + b) of x (contiguous) into the pass's col tensor, the generic
/// path's layout [b, C * KH * KW, OH * OW].
template <class T, class K>
void conv2d_im2col_generic(const conv2d_geometry& g, const Tensor<T, K>& x, std::int64_t first,
                           std::int64_t b, Tensor<T, K>& col, Tensor<T, K>& padded) {
  const Tensor<T, K> images = x.narrow(0, first, b);
  Tensor<T, K> pad_b = padded.numel() > 0 ? padded.narrow(0, 0, b) : padded;
  Tensor<T, K> col_b = col.narrow(0, 0, b * g.c * g.kh * g.kw * g.spatial());
  im2col_generic(g, images, pad_b, col_b);
}

/// The forward in chunks of g.cpu_chunk output rows per image (one group): per chunk, col
/// [patch, rows * OW] = im2col of those rows, out [O, rows * OW] = W @ col in `out_buffer`, and
/// out's rows copied into y's.
template <class T>
void conv2d_forward_chunks(const conv2d_geometry& g, const Tensor<T, cpu>& x,
                           const Tensor<T, cpu>& w2, Tensor<T, cpu>& y, Tensor<T, cpu>& col,
                           Tensor<T, cpu>& out_buffer) {
  const std::int64_t spatial = g.spatial(), patch = g.patch();
  for (std::int64_t image = 0; image < g.n; ++image) {
    const T* in = x.data() + image * g.c * g.h * g.w;
    T* plane = y.data() + image * g.o * spatial;
    for (std::int64_t y0 = 0; y0 < g.oh; y0 += g.cpu_chunk) {
      const std::int64_t y1 = std::min(y0 + g.cpu_chunk, g.oh), columns = (y1 - y0) * g.ow;
      im2col_cpu(g, in, col.data(), columns, y0, y1);
      Tensor<T, cpu> out = out_buffer.narrow(0, 0, g.o * columns).view(Shape{g.o, columns});
      tessera::detail::matmul_into(out, w2,
                                   col.narrow(0, 0, patch * columns).view(Shape{patch, columns}));
      for (std::int64_t oo = 0; oo < g.o; ++oo) {
        std::copy(out.data() + oo * columns, out.data() + (oo + 1) * columns,
                  plane + oo * spatial + y0 * g.ow);
      }
    }
  }
}

/// The input and weight gradients in chunks of g.cpu_chunk output rows per image (one group;
/// conv2d_backward_cpu's contract, dx already zeroed or accumulating): per chunk, with gy's
/// columns of those rows, dW += gy' @ col^T after an im2col, and dcol = W^T @ gy' (in col's
/// place), which col2im adds into dx.
template <class T>
void conv2d_backward_chunks(const conv2d_geometry& g, const Tensor<T, cpu>& x,
                            const Tensor<T, cpu>& w2, const Tensor<T, cpu>& gy,
                            Tensor<T, cpu>* dx, Tensor<T, cpu>* dw, bool dw_accumulate,
                            Tensor<T, cpu>& col, Tensor<T, cpu>& staging) {
  const std::int64_t spatial = g.spatial(), patch = g.patch();
  for (std::int64_t image = 0; image < g.n; ++image) {
    const Tensor<T, cpu> gy_image = gy.select(0, image).view(Shape{g.o, spatial});
    for (std::int64_t y0 = 0; y0 < g.oh; y0 += g.cpu_chunk) {
      const std::int64_t y1 = std::min(y0 + g.cpu_chunk, g.oh), columns = (y1 - y0) * g.ow;
      const Tensor<T, cpu> gy_chunk = gy_image.narrow(1, y0 * g.ow, columns);
      const Tensor<T, cpu> col2 = col.narrow(0, 0, patch * columns).view(Shape{patch, columns});
      if (dw != nullptr) {
        // x is defined only when the weight's gradient is wanted.
        im2col_cpu(g, x.data() + image * g.c * g.h * g.w, col.data(), columns, y0, y1);
        conv2d_weight_grad_gemms(g, *dw, gy_chunk, col2, dw_accumulate || image > 0 || y0 > 0,
                                 staging);
      }
      if (dx == nullptr) continue;
      conv2d_input_grad_gemms(g, col2, w2, gy_chunk, false, staging);
      col2im_add_cpu(g, col.data(), dx->data() + image * g.c * g.h * g.w, columns, y0, y1);
    }
  }
}

/// y = conv2d(x, w) into y [N, O, OH, OW] (contiguous), the CPU loops: per pass of b images,
/// out [O, b * OH * OW] = W @ col, written into y directly when b is 1 and through `gathered`
/// otherwise (or in chunks of output rows: conv2d_forward_chunks).
template <class T>
void conv2d_forward_cpu(const conv2d_geometry& g, const Tensor<T, cpu>& x, const Tensor<T, cpu>& w,
                        Tensor<T, cpu>& y, Tensor<T, cpu>& col, Tensor<T, cpu>& gathered) {
  const std::int64_t per_pass = conv2d_images_per_pass<cpu>(g);
  const std::int64_t spatial = g.spatial(), col_rows = g.c * g.kh * g.kw;
  const Tensor<T, cpu> w2 = w.view(Shape{g.o, g.patch()});
  if (conv2d_chunk_rows<cpu>(g) > 0) {
    conv2d_forward_chunks(g, x, w2, y, col, gathered);
    return;
  }
  for (std::int64_t first = 0; first < g.n; first += per_pass) {
    const std::int64_t b = std::min(per_pass, g.n - first), columns = b * spatial;
    Tensor<T, cpu> right;
    if (!g.pointwise() || per_pass > 1) {
      conv2d_col_cpu(g, x.data(), first, b, col.data());
      right = col.narrow(0, 0, col_rows * columns).view(Shape{col_rows, columns});
    } else {
      right = x.select(0, first).view(Shape{g.c, spatial});  // the image is its own col
    }
    Tensor<T, cpu> out = per_pass == 1
                             ? y.select(0, first).view(Shape{g.o, spatial})
                             : gathered.narrow(0, 0, g.o * columns).view(Shape{g.o, columns});
    conv2d_output_gemms(g, out, w2, right);
    if (per_pass > 1) {
      unpack_images_cpu(out.data(), b, g.o, spatial, y.data() + first * g.o * spatial,
                        g.o * spatial, false);
    }
  }
}

/// The part `part` of a split batch as a geometry of its own (n: the part's images).
inline conv2d_geometry conv2d_part_geometry(const conv2d_geometry& g, std::int64_t count) {
  conv2d_geometry part = g;
  part.n = count;
  part.cpu_parts = 1;
  return part;
}

/// y = conv2d(x, w) with the batch split into g.cpu_parts parts run at once (conv2d_split): each
/// part runs the CPU loops on its images with its own buffers from `ws`.
template <class T>
void conv2d_forward_parts(const conv2d_geometry& g, const Tensor<T, cpu>& x,
                          const Tensor<T, cpu>& w, Tensor<T, cpu>& y, workspace& ws) {
  std::vector<Tensor<T, cpu>> cols, gathered;
  for (std::int64_t part = 0; part < g.cpu_parts; ++part) {
    cols.push_back(ws.take<T, cpu>(Shape{conv2d_col_numel<cpu>(g)}));
    gathered.push_back(ws.take<T, cpu>(Shape{conv2d_gathered_numel<cpu>(g)}));
  }
  conv2d_run_parts(g.cpu_parts, [&](std::int64_t part) {
    const auto [first, count] = conv2d_part(g, g.cpu_parts, part);
    if (count == 0) return;
    const auto i = static_cast<std::size_t>(part);
    Tensor<T, cpu> images = y.narrow(0, first, count);
    conv2d_forward_cpu(conv2d_part_geometry(g, count), x.narrow(0, first, count), w, images,
                       cols[i], gathered[i]);
  });
}

/// y = conv2d(x, w) into y (contiguous) as GEMMs: the CPU loops, or the generic path.
template <class T, class K>
void conv2d_forward_gemms(const conv2d_geometry& g, const Tensor<T, K>& x, const Tensor<T, K>& w,
                          Tensor<T, K>& y, workspace& ws) {
  if constexpr (std::is_same_v<K, cpu>) {
    if (conv2d_winograd<T, K>(g)) {
      const winograd_problem p = conv2d_winograd_forward(g);
      winograd_conv3x3_cpu(p, x.data(), w.data(), false, y.data(), false,
                           ws.take<T, cpu>(Shape{winograd_workspace_numel<T>(p)}));
      return;
    }
  }
  if constexpr (std::is_same_v<K, cpu>) {
    if (conv2d_split<T, K>(g)) {
      conv2d_forward_parts(g, x, w, y, ws);
      return;
    }
  }
  const std::int64_t per_pass = conv2d_images_per_pass<K>(g);
  Tensor<T, K> col = ws.take<T, K>(Shape{conv2d_col_numel<K>(g)});
  Tensor<T, K> padded = ws.take<T, K>(conv2d_padded_shape<K>(g));
  Tensor<T, K> gathered = ws.take<T, K>(Shape{conv2d_gathered_numel<K>(g)});
  const Tensor<T, K> w2 = w.view(Shape{g.o, g.patch()});
  if constexpr (std::is_same_v<K, cpu>) {
    if (!conv2d_generic<K>()) conv2d_forward_cpu(g, x, w, y, col, gathered);
  }
  for (std::int64_t first = 0; conv2d_generic<K>() && first < g.n; first += per_pass) {
    const std::int64_t b = std::min(per_pass, g.n - first);
    if (!g.pointwise()) conv2d_im2col_generic(g, x, first, b, col, padded);
    for (std::int64_t m = 0; m < b; ++m) {
      const std::int64_t image = first + m;
      Tensor<T, K> out = y.select(0, image).view(Shape{g.o, g.spatial()});
      const Tensor<T, K> right =
          g.pointwise() ? x.select(0, image).view(Shape{g.c, g.spatial()})
                        : col.narrow(0, m * g.c * g.kh * g.kw * g.spatial(), g.c * g.kh * g.kw * g.spatial())
                              .view(Shape{g.c * g.kh * g.kw, g.spatial()});
      conv2d_output_gemms(g, out, w2, right);
    }
  }
}

/// y = conv2d(x, w) into y (contiguous) with cuDNN's chosen forward algorithm (g.cudnn usable).
template <class T>
void conv2d_forward_cudnn(const conv2d_geometry& g, const Tensor<T, tessera::cuda>& x,
                          const Tensor<T, tessera::cuda>& w, Tensor<T, tessera::cuda>& y,
                          workspace& ws) {
#if TESSERA_CUDNN
  backend::cuda::conv2d_forward<T>(x.device_index(), g.problem(), g.cudnn, x.data(), w.data(),
                                   y.data(), ws.take_raw(g.cudnn.forward_bytes));
#else
  (void)g, (void)x, (void)w, (void)y, (void)ws;
  throw error("conv2d: internal error: cuDNN chosen in a build without it");
#endif
}

/// A copy of `t` (any layout) into a contiguous tensor from `ws`.
template <class T, class K>
Tensor<T, K> contiguous_copy(const Tensor<T, K>& t, workspace& ws) {
  Tensor<T, K> copy = ws.take<T, K>(t.shape());
  tessera::detail::run_expression(copy, tessera::detail::as_node(t));
  return copy;
}

/// target = value (or += when `accumulate`), through target's strides.
template <class T, class K>
void store_into(Tensor<T, K>& target, const Tensor<T, K>& value, bool accumulate) {
  if (accumulate) {
    tessera::detail::add_into(target, tessera::detail::as_node(value));
  } else {
    tessera::detail::run_expression(target, tessera::detail::as_node(value));
  }
}

/// y = conv2d(x, w) (+ bias) into y [N, O, OH, OW]: contiguous tensors, or NHWC-dense ones when
/// g.channels_last (cuDNN takes them as they are; the CPU loops natively where
/// conv2d_nhwc_native allows; otherwise NCHW copies in `ws`, conv2d_forward_copies_workspace).
template <class T, class K>
void conv2d_forward(const conv2d_geometry& g, const Tensor<T, K>& x, const Tensor<T, K>& w,
                    const Tensor<T, K>* bias, Tensor<T, K>& y, workspace& ws) {
  if (g.channels_last && !g.cudnn.usable) {
    if constexpr (std::is_same_v<K, cpu>) {
      if (conv2d_nhwc_native<T, K>(g)) {
        Tensor<T, cpu> col;
        if (const std::int64_t numel = conv2d_nhwc_col_numel<T>(g); numel > 0) {
          col = ws.take<T, cpu>(Shape{numel});
        }
        conv2d_forward_nhwc_cpu(g, x, w, bias, y, col);
        return;
      }
    }
    const Tensor<T, K> xc = contiguous_copy(x, ws), wc = contiguous_copy(w, ws);
    Tensor<T, K> yc = ws.take<T, K>(y.shape());
    conv2d_forward(conv2d_nchw_geometry(g), xc, wc, bias, yc, ws);
    store_into(y, yc, false);
    return;
  }
  if constexpr (std::is_same_v<K, tessera::cuda>) {
    if (g.cudnn.usable) conv2d_forward_cudnn(g, x, w, y, ws);
  }
  if (!g.cudnn.usable) conv2d_forward_gemms(g, x, w, y, ws);
  if (bias != nullptr) {
    // [N, O, OH * OW] views both dense layouts (channels_last's with O innermost).
    Tensor<T, K> y3 = y.view(Shape{g.n, g.o, g.spatial()});
    tessera::detail::add_into(y3, tessera::detail::as_node(bias->view(Shape{1, g.o, 1})));
  }
}

/// The input and weight gradients of y = conv2d(x, w) for gy, the CPU loops (conv2d_backward's
/// contract): per pass of b images, with gy' [O, b * OH * OW] (gy itself when b is 1),
/// dW += gy' @ col^T and dcol = W^T @ gy', which col2im adds into dx (a 1x1 convolution's dcol is
/// dx's pass itself); or in chunks of output rows (conv2d_backward_chunks).
template <class T>
void conv2d_backward_cpu(const conv2d_geometry& g, const Tensor<T, cpu>& x, const Tensor<T, cpu>& w,
                         const Tensor<T, cpu>& gy, Tensor<T, cpu>* dx, bool dx_accumulate,
                         Tensor<T, cpu>* dw, bool dw_accumulate, Tensor<T, cpu>& col,
                         Tensor<T, cpu>& gathered, Tensor<T, cpu>& staging) {
  const std::int64_t per_pass = conv2d_images_per_pass<cpu>(g);
  const std::int64_t spatial = g.spatial(), col_rows = g.c * g.kh * g.kw;
  const Tensor<T, cpu> w2 = w.view(Shape{g.o, g.patch()});
  if (dx != nullptr && !dx_accumulate && !g.pointwise()) dx->zero_();
  if (conv2d_chunk_rows<cpu>(g) > 0) {
    conv2d_backward_chunks(g, x, w2, gy, dx, dw, dw_accumulate, col, staging);
    return;
  }
  for (std::int64_t first = 0; first < g.n; first += per_pass) {
    const std::int64_t b = std::min(per_pass, g.n - first), columns = b * spatial;
    Tensor<T, cpu> gy2 = gy.select(0, first).view(Shape{g.o, spatial});
    if (per_pass > 1) {
      pack_images_cpu(gy.data() + first * g.o * spatial, g.o * spatial, b, g.o, spatial,
                      gathered.data());
      gy2 = gathered.narrow(0, 0, g.o * columns).view(Shape{g.o, columns});
    }
    const bool own_col = !g.pointwise() || per_pass > 1;  // false: the image is its own col
    Tensor<T, cpu> col2 = own_col
                              ? col.narrow(0, 0, col_rows * columns).view(Shape{col_rows, columns})
                              : Tensor<T, cpu>();
    if (dw != nullptr) {
      // x is defined only when the weight's gradient is wanted.
      Tensor<T, cpu> patches = col2;
      if (own_col) {
        conv2d_col_cpu(g, x.data(), first, b, col.data());
      } else {
        patches = x.select(0, first).view(Shape{g.c, spatial});
      }
      conv2d_weight_grad_gemms(g, *dw, gy2, patches, dw_accumulate || first > 0, staging);
    }
    if (dx == nullptr) continue;
    if (!own_col) {
      conv2d_input_grad_gemms(g, dx->select(0, first).view(Shape{g.c, spatial}), w2, gy2,
                              dx_accumulate, staging);
      continue;
    }
    // dcol overwrites the pass's col (its weight-gradient use is done).
    conv2d_input_grad_gemms(g, col2, w2, gy2, false, staging);
    T* dx_pass = dx->data() + first * g.c * g.h * g.w;
    if (g.pointwise()) {
      unpack_images_cpu(col2.data(), b, g.c, spatial, dx_pass, g.c * spatial, dx_accumulate);
    } else {
      for (std::int64_t m = 0; m < b; ++m) {
        col2im_add_cpu(g, col2.data() + m * spatial, dx_pass + m * g.c * g.h * g.w, columns);
      }
    }
  }
}

/// The input and weight gradients with the batch split into g.cpu_parts parts run at once
/// (conv2d_split): each part runs the CPU loops on its images with its own buffers; the first
/// part's weight-gradient products go into dw, each other part's into a sum of its own, which
/// are added into dw after all parts, in order.
template <class T>
void conv2d_backward_parts(const conv2d_geometry& g, const Tensor<T, cpu>& x,
                           const Tensor<T, cpu>& w, const Tensor<T, cpu>& gy, Tensor<T, cpu>* dx,
                           bool dx_accumulate, Tensor<T, cpu>* dw, bool dw_accumulate,
                           workspace& ws) {
  std::vector<Tensor<T, cpu>> cols, gathered, sums;
  for (std::int64_t part = 0; part < g.cpu_parts; ++part) {
    cols.push_back(ws.take<T, cpu>(Shape{conv2d_col_numel<cpu>(g)}));
    gathered.push_back(ws.take<T, cpu>(Shape{conv2d_gathered_numel<cpu>(g)}));
    if (dw != nullptr && part > 0) sums.push_back(ws.take<T, cpu>(dw->shape()));
  }
  conv2d_run_parts(g.cpu_parts, [&](std::int64_t part) {
    const auto [first, count] = conv2d_part(g, g.cpu_parts, part);
    if (count == 0) return;
    const auto i = static_cast<std::size_t>(part);
    // x is defined only when the weight's gradient is wanted.
    const Tensor<T, cpu> images = x.defined() ? x.narrow(0, first, count) : Tensor<T, cpu>();
    Tensor<T, cpu> dx_part = dx != nullptr ? dx->narrow(0, first, count) : Tensor<T, cpu>();
    Tensor<T, cpu>* dw_part = dw == nullptr ? nullptr : part == 0 ? dw : &sums[i - 1];
    Tensor<T, cpu> no_staging;  // the BLAS accumulates (conv2d_split)
    conv2d_backward_cpu(conv2d_part_geometry(g, count), images, w, gy.narrow(0, first, count),
                        dx != nullptr ? &dx_part : nullptr, dx_accumulate, dw_part,
                        part == 0 && dw_accumulate, cols[i], gathered[i], no_staging);
  });
  if (dw == nullptr) return;
  for (std::int64_t part = 1; part < g.cpu_parts; ++part) {
    if (conv2d_part(g, g.cpu_parts, part).second > 0) {
      tessera::detail::add_into(*dw,
                                tessera::detail::as_node(sums[static_cast<std::size_t>(part - 1)]));
    }
  }
}

/// The input and weight gradients of y = conv2d(x, w) for gy as GEMMs (conv2d_backward's
/// contract; one of dx, dw defined): the CPU loops, or the generic path.
template <class T, class K>
void conv2d_backward_gemms(const conv2d_geometry& g, const Tensor<T, K>& x, const Tensor<T, K>& w,
                           const Tensor<T, K>& gy, Tensor<T, K>* dx, bool dx_accumulate,
                           Tensor<T, K>* dw, bool dw_accumulate, workspace& ws) {
  if constexpr (std::is_same_v<K, cpu>) {
    const bool input_winograd = dx != nullptr && conv2d_winograd<T, K>(g);
    const bool weight_winograd = dw != nullptr && conv2d_winograd_weight_grad<T, K>(g);
    if (input_winograd || weight_winograd) {
      const Tensor<T, cpu> scratch = ws.take<T, cpu>(
          Shape{conv2d_winograd_backward_numel<T, K>(g, dx != nullptr, dw != nullptr)});
      if (weight_winograd) {
        winograd_weight_grad_cpu(conv2d_winograd_forward(g), x.data(), gy.data(), dw->data(),
                                 dw_accumulate, scratch);
      } else if (dw != nullptr) {
        conv2d_backward_gemms<T, K>(g, x, w, gy, nullptr, false, dw, dw_accumulate, ws);
      }
      if (input_winograd && g.sh == 2) {
        winograd_s2_input_grad_cpu(conv2d_winograd_input_grad(g), gy.data(), w.data(), dx->data(),
                                   dx_accumulate, scratch);
      } else if (input_winograd) {
        winograd_conv3x3_cpu(conv2d_winograd_input_grad(g), gy.data(), w.data(), true, dx->data(),
                             dx_accumulate, scratch);
      }
      return;
    }
  }
  if constexpr (std::is_same_v<K, cpu>) {
    if (conv2d_split<T, K>(g)) {
      conv2d_backward_parts(g, x, w, gy, dx, dx_accumulate, dw, dw_accumulate, ws);
      return;
    }
  }
  const std::int64_t per_pass = conv2d_images_per_pass<K>(g);
  Tensor<T, K> col = ws.take<T, K>(Shape{conv2d_col_numel<K>(g)});
  Tensor<T, K> padded = ws.take<T, K>(conv2d_padded_shape<K>(g));
  Tensor<T, K> gathered = ws.take<T, K>(Shape{conv2d_gathered_numel<K>(g)});
  Tensor<T, K> staging;
  if (!tessera::detail::matmul_accumulates<T, K>()) {
    std::int64_t n = 0;
    if (dw != nullptr) n = std::max(n, g.out_per_group() * g.patch());
    if (dx != nullptr && g.pointwise()) n = std::max(n, g.in_per_group() * g.h * g.w);
    staging = ws.take<T, K>(Shape{n});
  }
  const std::int64_t col_rows = g.c * g.kh * g.kw, col_image = col_rows * g.spatial();
  const Tensor<T, K> w2 = w.view(Shape{g.o, g.patch()});
  if constexpr (std::is_same_v<K, cpu>) {
    if (!conv2d_generic<K>()) {
      conv2d_backward_cpu(g, x, w, gy, dx, dx_accumulate, dw, dw_accumulate, col, gathered,
                          staging);
      return;
    }
  }
  if (dx != nullptr && !dx_accumulate && !g.pointwise()) dx->zero_();

  // The generic path: per pass an im2col, per image its GEMMs, per pass a col2im.
  for (std::int64_t first = 0; first < g.n; first += per_pass) {
    const std::int64_t b = std::min(per_pass, g.n - first);
    if (dw != nullptr && !g.pointwise()) conv2d_im2col_generic(g, x, first, b, col, padded);
    for (std::int64_t m = 0; m < b; ++m) {
      const std::int64_t image = first + m;
      const Tensor<T, K> gy2 = gy.select(0, image).view(Shape{g.o, g.spatial()});
      if (dw != nullptr) {
        const Tensor<T, K> patches =
            g.pointwise() ? x.select(0, image).view(Shape{g.c, g.spatial()})
                          : col.narrow(0, m * col_image, col_image).view(Shape{col_rows, g.spatial()});
        conv2d_weight_grad_gemms(g, *dw, gy2, patches, dw_accumulate || image > 0, staging);
      }
      if (dx == nullptr) continue;
      // A 1x1 convolution's product is dx's image itself; otherwise dcol overwrites this image's
      // col (its weight-gradient use is done).
      const Tensor<T, K> dcol =
          g.pointwise()
              ? dx->select(0, image).view(Shape{g.c, g.spatial()})
              : col.narrow(0, m * col_image, col_image).view(Shape{col_rows, g.spatial()});
      conv2d_input_grad_gemms(g, dcol, w2, gy2, g.pointwise() && dx_accumulate, staging);
    }
    if (dx != nullptr && !g.pointwise()) {
      Tensor<T, K> images = dx->narrow(0, first, b);
      Tensor<T, K> pad_b = padded.numel() > 0 ? padded.narrow(0, 0, b) : padded;
      col2im_add_generic(g, col.narrow(0, 0, b * col_image), images, pad_b);
    }
  }
}

/// The input and weight gradients with cuDNN's chosen algorithms (g.cudnn usable): the weight's
/// first, then the input's, sharing one workspace.
template <class T>
void conv2d_backward_cudnn(const conv2d_geometry& g, const Tensor<T, tessera::cuda>& x,
                           const Tensor<T, tessera::cuda>& w, const Tensor<T, tessera::cuda>& gy,
                           Tensor<T, tessera::cuda>* dx, bool dx_accumulate,
                           Tensor<T, tessera::cuda>* dw, bool dw_accumulate, workspace& ws) {
#if TESSERA_CUDNN
  const int device = gy.device_index();
  void* scratch =
      ws.take_raw(std::max(dx != nullptr ? g.cudnn.backward_data_bytes : std::size_t{0},
                           dw != nullptr ? g.cudnn.backward_filter_bytes : std::size_t{0}));
  if (dw != nullptr) {
    backend::cuda::conv2d_backward_filter<T>(device, g.problem(), g.cudnn, x.data(), gy.data(),
                                             dw->data(), dw_accumulate, scratch);
  }
  if (dx != nullptr) {
    backend::cuda::conv2d_backward_data<T>(device, g.problem(), g.cudnn, gy.data(), w.data(),
                                           dx->data(), dx_accumulate, scratch);
  }
#else
  (void)g, (void)x, (void)w, (void)gy, (void)dx, (void)dx_accumulate, (void)dw;
  (void)dw_accumulate, (void)ws;
  throw error("conv2d: internal error: cuDNN chosen in a build without it");
#endif
}

/// Gradients of y = conv2d(x, w) + bias for the upstream gradient gy [N, O, OH, OW]: each of dx,
/// dw, db that is defined is written, or added to when its accumulate flag is set. x (needed for
/// dw only), w, gy, dx and dw contiguous, or NHWC-dense when g.channels_last (cuDNN takes them
/// as they are; the CPU loops natively where conv2d_nhwc_native allows; otherwise the NCHW
/// passes run on copies in `ws`, conv2d_backward_workspace).
template <class T, class K>
void conv2d_backward(const conv2d_geometry& g, const Tensor<T, K>& x, const Tensor<T, K>& w,
                     const Tensor<T, K>& gy, Tensor<T, K>* dx, bool dx_accumulate, Tensor<T, K>* dw,
                     bool dw_accumulate, Tensor<T, K>* db, bool db_accumulate, workspace& ws) {
  using tessera::detail::as_node;
  if (conv2d_nchw_copies<T, K>(g) && (dx != nullptr || dw != nullptr)) {
    const Tensor<T, K> gyc = contiguous_copy(gy, ws);
    const Tensor<T, K> xc = dw != nullptr ? contiguous_copy(x, ws) : Tensor<T, K>();
    const Tensor<T, K> wc = contiguous_copy(w, ws);
    Tensor<T, K> dxc = dx != nullptr ? ws.take<T, K>(dx->shape()) : Tensor<T, K>();
    Tensor<T, K> dwc = dw != nullptr ? ws.take<T, K>(dw->shape()) : Tensor<T, K>();
    conv2d_backward(conv2d_nchw_geometry(g), xc, wc, gyc, dx != nullptr ? &dxc : nullptr, false,
                    dw != nullptr ? &dwc : nullptr, false, db, db_accumulate, ws);
    if (dx != nullptr) store_into(*dx, dxc, dx_accumulate);
    if (dw != nullptr) store_into(*dw, dwc, dw_accumulate);
    return;
  }
  if (db != nullptr) {
    // db = sum of gy over (N, OH, OW): along the spatial dim, then the batch ([N, O, OH * OW]
    // views an NHWC gy too).
    Tensor<T, K> per_image = ws.take<T, K>(Shape{g.n, g.o});
    tessera::detail::reduce_dim_into<backend::sum_op<accumulate_t<T>>, backend::finish_value, T>(
        per_image, as_node(gy.view(Shape{g.n, g.o, g.spatial()})), 2, "sum");
    if (db_accumulate) {
      Tensor<T, K> partial = ws.take<T, K>(Shape{g.o});
      tessera::detail::reduce_dim_into<backend::sum_op<accumulate_t<T>>, backend::finish_value, T>(
          partial, as_node(per_image), 0, "sum");
      tessera::detail::add_into(*db, as_node(partial));
    } else {
      tessera::detail::reduce_dim_into<backend::sum_op<accumulate_t<T>>, backend::finish_value, T>(
          *db, as_node(per_image), 0, "sum");
    }
  }
  if (dx == nullptr && dw == nullptr) return;
  if constexpr (std::is_same_v<K, tessera::cuda>) {
    if (g.cudnn.usable) {
      conv2d_backward_cudnn(g, x, w, gy, dx, dx_accumulate, dw, dw_accumulate, ws);
      return;
    }
  }
  if constexpr (std::is_same_v<K, cpu> && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
    if (g.channels_last) {  // conv2d_nhwc_native (not conv2d_nchw_copies)
      const Tensor<T, cpu> col = ws.take<T, cpu>(
          Shape{conv2d_nhwc_backward_col_numel<T>(g, dx != nullptr, dw != nullptr)});
      const Tensor<T, cpu> staging =
          ws.take<T, cpu>(Shape{conv2d_nhwc_backward_staging_numel<T>(g, dw != nullptr)});
      conv2d_backward_nhwc_cpu(g, x, w, gy, dx, dx_accumulate, dw, dw_accumulate, col, staging);
      return;
    }
  }
  conv2d_backward_gemms(g, x, w, gy, dx, dx_accumulate, dw, dw_accumulate, ws);
}

}  // namespace tessera::nn::detail
