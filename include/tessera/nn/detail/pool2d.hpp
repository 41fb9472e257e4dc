// 2-D pooling on NCHW tensors (torch.nn.functional.max_pool2d, avg_pool2d,
// adaptive_avg_pool2d): geometry and checks, workspace, forward and backward passes. Written as
// passes of expressions over strided views, one per kernel offset (i, j): the window of offset
// (i, j) of every output position is one strided view of a padded copy of the input, and within
// one offset the viewed elements are distinct, so a backward pass can add into it. Every pass is
// a fused expression or reduction the device's executor runs: one implementation for CPU and
// CUDA (max pooling's backward on the CPU has a one-pass loop of its own for NCHW tensors). A
// channels_last input gets a channels_last padded copy and output (pool2d_format), so every pass
// walks the three alike, in storage order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/core/detail/checked.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/expr/reduce.hpp"
#include "tessera/nn/detail/conv2d_geometry.hpp"
#include "tessera/nn/detail/workspace.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn {

/// torch.nn.functional.max_pool2d's arguments after the kernel size; stride 0 (the default)
/// means the kernel size, as PyTorch's None.
struct MaxPool2dArgs {
  Int2 stride = 0;
  Int2 padding = 0;
  Int2 dilation = 1;
  bool ceil_mode = false;
};

/// torch.nn.functional.avg_pool2d's arguments after the kernel size; stride 0 means the kernel
/// size. divisor_override 0 means none.
struct AvgPool2dArgs {
  Int2 stride = 0;
  Int2 padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
  std::int64_t divisor_override = 0;
};

}  // namespace tessera::nn

namespace tessera::nn::detail {

struct pool2d_geometry {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  std::int64_t oh = 0, ow = 0;
  std::int64_t hp = 0, wp = 0;  // the padded buffer: covers every window (ceil_mode overhangs)

  Shape output_shape() const { return Shape{n, c, oh, ow}; }
  Shape padded_shape() const { return Shape{n, c, hp, wp}; }
};

/// The output extent of a window of k (dilation d, stride s, padding p) over `in`; `m` checks
/// each step (the caller has checked span = d * (k - 1) + 1 and in + 2 * p).
template <class Checked>
std::int64_t pooled_extent(const Checked& m, std::int64_t in, std::int64_t span, std::int64_t s,
                           std::int64_t p, bool ceil_mode) {
  const std::int64_t room = m.add(in, m.mul(2, p)) - span;  // >= 0: the window fits
  std::int64_t out = (ceil_mode ? room / s + (room % s != 0) : room / s) + 1;
  // PyTorch: with ceil_mode, the last window must start inside the input or its left padding.
  if (ceil_mode && m.mul(out - 1, s) >= m.add(in, p)) --out;
  return out;
}

/// Checks a pooling call named `who`; throws shape_error naming the shape and arguments.
inline pool2d_geometry pool2d_geometry_of(const std::string& who, const Shape& x, Int2 kernel,
                                          Int2 stride, Int2 padding, Int2 dilation,
                                          bool ceil_mode) {
  if (x.size() != 4) {
    throw shape_error(who + ": expected a 4-D input [N, C, H, W], got shape " + x.str());
  }
  if (stride.h == 0 && stride.w == 0) stride = kernel;
  if (kernel.h <= 0 || kernel.w <= 0 || stride.h <= 0 || stride.w <= 0 || dilation.h <= 0 ||
      dilation.w <= 0 || padding.h < 0 || padding.w < 0) {
    throw shape_error(who + ": expected kernel_size, stride and dilation >= 1 and padding >= 0, "
                      "got kernel_size " + kernel.str() + ", stride " + stride.str() +
                      ", padding " + padding.str() + ", dilation " + dilation.str());
  }
  // PyTorch's rule, padding <= kernel_size / 2, without computing 2 * padding (it may overflow).
  if (padding.h > kernel.h / 2 || padding.w > kernel.w / 2) {
    throw shape_error(who + ": padding " + padding.str() +
                      " must be at most half of kernel_size " + kernel.str());
  }
  const tessera::detail::checked_int64 m(who, [&] {
    return "the output size of an input of shape " + x.str() + " with kernel_size " +
           kernel.str() + ", stride " + stride.str() + ", padding " + padding.str() +
           " and dilation " + dilation.str();
  });
  pool2d_geometry g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.kh = kernel.h, g.kw = kernel.w, g.sh = stride.h, g.sw = stride.w;
  g.ph = padding.h, g.pw = padding.w, g.dh = dilation.h, g.dw = dilation.w;
  const std::int64_t span_h = m.add(m.mul(g.dh, g.kh - 1), 1);
  const std::int64_t span_w = m.add(m.mul(g.dw, g.kw - 1), 1);
  if (span_h > m.add(g.h, m.mul(2, g.ph)) || span_w > m.add(g.w, m.mul(2, g.pw))) {
    throw shape_error(who + ": the window " + kernel.str() + " (dilation " + dilation.str() +
                      ") is larger than the padded input of an input of shape " + x.str() +
                      " (padding " + padding.str() + ")");
  }
  g.oh = pooled_extent(m, g.h, span_h, g.sh, g.ph, ceil_mode);
  g.ow = pooled_extent(m, g.w, span_w, g.sw, g.pw, ceil_mode);
  g.hp = std::max(g.h + 2 * g.ph, m.add(m.mul(g.oh - 1, g.sh), span_h));
  g.wp = std::max(g.w + 2 * g.pw, m.add(m.mul(g.ow - 1, g.sw), span_w));
  // A stride past the only window moves nothing: cut to the padded extent there (the windows
  // stay the same), so that no view's stride (sh * wp) overflows.
  if (g.oh == 1) g.sh = std::min(g.sh, g.hp);
  if (g.ow == 1) g.sw = std::min(g.sw, g.wp);
  // The padded buffer and the output: every later size is below these.
  (void)m.mul(m.mul(std::max<std::int64_t>(g.n, 1), std::max<std::int64_t>(g.c, 1)),
              m.mul(g.hp, g.wp));
  return g;
}

/// The layout of a pooling's output (and padded copy) for input x: channels_last for a
/// channels_last input, as PyTorch's pooling gives, contiguous_format otherwise.
template <class T, class K>
memory_format pool2d_format(const Tensor<T, K>& x) {
  return x.suggest_memory_format();
}

/// A padded buffer [N, C, hp, wp] from `ws` laid out in `format` (the same bytes either way).
template <class T, class K>
Tensor<T, K> take_padded(const pool2d_geometry& g, workspace& ws, memory_format format) {
  if (format == memory_format::channels_last) {
    return ws.take<T, K>(Shape{g.n, g.hp, g.wp, g.c}).permute({0, 3, 1, 2});
  }
  return ws.take<T, K>(g.padded_shape());
}

/// The [N, C, OH, OW] view of `padded` (shape [N, C, hp, wp], dense in any memory format) at
/// kernel offset (i, j).
template <class T, class K>
Tensor<T, K> window_view(const pool2d_geometry& g, const Tensor<T, K>& padded, std::int64_t i,
                         std::int64_t j) {
  const Strides& s = padded.strides();
  return Tensor<T, K>(padded.storage(), Shape{padded.size(0), padded.size(1), g.oh, g.ow},
                      Strides{s[0], s[1], g.sh * s[2], g.sw * s[3]},
                      padded.storage_offset() + i * g.dh * s[2] + j * g.dw * s[3]);
}

/// `padded` = `fill` everywhere, x in its interior.
template <class T, class K>
void pad_into(const pool2d_geometry& g, const Tensor<T, K>& x, Tensor<T, K>& padded, T fill) {
  padded.fill_(fill);
  Tensor<T, K> interior = padded.narrow(2, g.ph, g.h).narrow(3, g.pw, g.w);
  tessera::detail::run_expression(interior, tessera::detail::as_node(x));
}

/// y = the first window of `padded`, then combine(y, window) with each further kernel offset's
/// window in scan order (max or sum pooling's forward).
template <class T, class K, class Combine>
void fold_windows(const pool2d_geometry& g, const Tensor<T, K>& padded, Tensor<T, K>& y,
                  Combine&& combine) {
  for (std::int64_t i = 0; i < g.kh; ++i) {
    for (std::int64_t j = 0; j < g.kw; ++j) {
      const Tensor<T, K> window = window_view(g, padded, i, j);
      if (i == 0 && j == 0) {
        tessera::detail::run_expression(y, tessera::detail::as_node(window));
      } else {
        combine(y, window);
      }
    }
  }
}

/// dx = (or += when `accumulate`) the interior of the padded gradient `padded`.
template <class T, class K>
void store_interior(const pool2d_geometry& g, const Tensor<T, K>& padded, Tensor<T, K>& dx,
                    bool accumulate) {
  const Tensor<T, K> interior = padded.narrow(2, g.ph, g.h).narrow(3, g.pw, g.w);
  if (accumulate) {
    tessera::detail::add_into(dx, tessera::detail::as_node(interior));
  } else {
    tessera::detail::run_expression(dx, tessera::detail::as_node(interior));
  }
}

// ---- max pooling ------------------------------------------------------------------------------

template <class T>
std::size_t max_pool2d_forward_workspace(const pool2d_geometry& g) {
  return workspace::bytes<T>(g.padded_shape().numel());
}
template <class T>
std::size_t max_pool2d_backward_workspace(const pool2d_geometry& g) {
  return workspace::bytes<T>(g.padded_shape().numel()) +
         workspace::bytes<T>(g.output_shape().numel());
}

template <class T, class K>
void max_pool2d_forward(const pool2d_geometry& g, const Tensor<T, K>& x, Tensor<T, K>& y,
                        workspace& ws) {
  Tensor<T, K> padded = take_padded<T, K>(g, ws, pool2d_format(x));
  pad_into(g, x, padded, -std::numeric_limits<T>::infinity());
  fold_windows(g, padded, y, [](Tensor<T, K>& out, const Tensor<T, K>& window) {
    tessera::detail::run_expression(out, maximum(out, window));
  });
}

/// dx (+)= the gradient of max pooling: each output's gradient goes to the first element of its
/// window (scan order) equal to the maximum, as PyTorch's CPU kernel picks its index. Two passes
/// over the offsets: the first stores each output's winning offset (i * KW + j + 1) in `winner`,
/// the second adds the gradients at the winners (straight into dx when there is no border).
/// The same on the CPU for NCHW-contiguous tensors, in one pass: a plane per task, each output
/// scanning its window in order for the first element equal to its maximum (a padded position,
/// -inf, counts as a candidate and then takes the gradient away, as in the passes below; a NaN
/// maximum matches nothing there either). On ResNet-18's stem pooling (examples/resnet50, batch
/// 8 at 64x64, the profiler's table, 2026-11-28) 1.8-2.0 ms a call against 6.2-6.6 for the
/// 2 * kh * kw passes.
template <class T>
void max_pool2d_backward_planes(const pool2d_geometry& g, const T* x, const T* y, const T* gy,
                                T* dx, bool accumulate) {
  const std::int64_t planes = g.n * g.c;
  const std::int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const T padding_value = -std::numeric_limits<T>::infinity();
  const std::int64_t grain =
      std::max<std::int64_t>(1, backend::cpu::grain_size / std::max<std::int64_t>(1, in_plane));
  backend::cpu::execute_loop(0, planes, grain, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t p = first; p < last; ++p) {
      const T* xp = x + p * in_plane;
      const T* yp = y + p * out_plane;
      const T* gp = gy + p * out_plane;
      T* dp = dx + p * in_plane;
      if (!accumulate) std::fill(dp, dp + in_plane, T(0));
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const T best = yp[oy * g.ow + ox];
          bool found = false;
          for (std::int64_t i = 0; i < g.kh && !found; ++i) {
            const std::int64_t hy = oy * g.sh - g.ph + i * g.dh;
            const bool row_inside = hy >= 0 && hy < g.h;
            for (std::int64_t j = 0; j < g.kw; ++j) {
              const std::int64_t wx = ox * g.sw - g.pw + j * g.dw;
              const bool inside = row_inside && wx >= 0 && wx < g.w;
              const T value = inside ? xp[hy * g.w + wx] : padding_value;
              if (value == best) {
                if (inside) dp[hy * g.w + wx] += gp[oy * g.ow + ox];
                found = true;
                break;
              }
            }
          }
        }
      }
    }
  });
}

template <class T, class K>
void max_pool2d_backward(const pool2d_geometry& g, const Tensor<T, K>& x, const Tensor<T, K>& y,
                         const Tensor<T, K>& gy, Tensor<T, K>& dx, bool accumulate, workspace& ws) {
  if constexpr (std::is_same_v<K, cpu> && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
    if (x.is_contiguous() && y.is_contiguous() && gy.is_contiguous() && dx.is_contiguous()) {
      max_pool2d_backward_planes(g, x.data(), y.data(), gy.data(), dx.data(), accumulate);
      return;
    }
  }
  Tensor<T, K> padded = ws.take<T, K>(g.padded_shape());
  Tensor<T, K> winner = ws.take<T, K>(g.output_shape());
  pad_into(g, x, padded, -std::numeric_limits<T>::infinity());
  winner.zero_();
  for (std::int64_t i = 0; i < g.kh; ++i) {
    for (std::int64_t j = 0; j < g.kw; ++j) {
      const Tensor<T, K> window = window_view(g, padded, i, j);
      const double code = static_cast<double>(i * g.kw + j + 1);
      tessera::detail::run_expression(winner,
                                      where(winner == 0.0, where(window == y, code, 0.0), winner));
    }
  }
  const bool direct = g.hp == g.h && g.wp == g.w && dx.is_contiguous();
  Tensor<T, K> target = direct ? dx : padded;  // the padded input is not read any more
  if (!direct || !accumulate) target.zero_();
  for (std::int64_t i = 0; i < g.kh; ++i) {
    for (std::int64_t j = 0; j < g.kw; ++j) {
      Tensor<T, K> window = window_view(g, target, i, j);
      const double code = static_cast<double>(i * g.kw + j + 1);
      tessera::detail::run_expression(window, where(winner == code, window + gy, window));
    }
  }
  if (direct) return;
  store_interior(g, padded, dx, accumulate);
}

// ---- average pooling --------------------------------------------------------------------------

/// The divisor of each output position [1, 1, OH, OW]: PyTorch's pool_size (the window clipped
/// to the padded input, or to the input when !count_include_pad) or divisor_override.
template <class T, class K>
void avg_pool2d_divisors(const pool2d_geometry& g, const AvgPool2dArgs& a, Tensor<T, K>& counts) {
  if (a.divisor_override > 0) {
    counts.fill_(static_cast<T>(a.divisor_override));
    return;
  }
  std::vector<T> host(static_cast<std::size_t>(g.oh * g.ow));
  for (std::int64_t y = 0; y < g.oh; ++y) {
    for (std::int64_t x = 0; x < g.ow; ++x) {
      std::int64_t hs = y * g.sh - g.ph, ws = x * g.sw - g.pw;
      std::int64_t he = std::min(hs + g.kh, g.h + g.ph), we = std::min(ws + g.kw, g.w + g.pw);
      std::int64_t size = (he - hs) * (we - ws);
      if (!a.count_include_pad) {
        hs = std::max<std::int64_t>(hs, 0), ws = std::max<std::int64_t>(ws, 0);
        he = std::min(he, g.h), we = std::min(we, g.w);
        size = (he - hs) * (we - ws);
      }
      host[static_cast<std::size_t>(y * g.ow + x)] = static_cast<T>(size);
    }
  }
  counts.copy_from_host(host.data());
}

template <class T>
std::size_t avg_pool2d_workspace(const pool2d_geometry& g) {
  return workspace::bytes<T>(g.padded_shape().numel()) + workspace::bytes<T>(g.oh * g.ow);
}

template <class T, class K>
void avg_pool2d_forward(const pool2d_geometry& g, const AvgPool2dArgs& a, const Tensor<T, K>& x,
                        Tensor<T, K>& y, workspace& ws) {
  Tensor<T, K> padded = take_padded<T, K>(g, ws, pool2d_format(x));
  Tensor<T, K> counts = ws.take<T, K>(Shape{1, 1, g.oh, g.ow});
  pad_into(g, x, padded, T(0));
  avg_pool2d_divisors(g, a, counts);
  fold_windows(g, padded, y,
               [](Tensor<T, K>& out, const Tensor<T, K>& window) {
                 tessera::detail::add_into(out, tessera::detail::as_node(window));
               });
  tessera::detail::run_expression(y, y / counts);
}

template <class T, class K>
void avg_pool2d_backward(const pool2d_geometry& g, const AvgPool2dArgs& a, const Tensor<T, K>& gy,
                         Tensor<T, K>& dx, bool accumulate, workspace& ws) {
  Tensor<T, K> padded = ws.take<T, K>(g.padded_shape());
  Tensor<T, K> counts = ws.take<T, K>(Shape{1, 1, g.oh, g.ow});
  avg_pool2d_divisors(g, a, counts);
  padded.zero_();
  for (std::int64_t i = 0; i < g.kh; ++i) {
    for (std::int64_t j = 0; j < g.kw; ++j) {
      Tensor<T, K> window = window_view(g, padded, i, j);
      tessera::detail::run_expression(window, window + gy / counts);
    }
  }
  store_interior(g, padded, dx, accumulate);
}

// ---- adaptive average pooling -----------------------------------------------------------------

struct adaptive_geometry {
  std::int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  std::int64_t start_h(std::int64_t i) const { return i * h / oh; }
  std::int64_t end_h(std::int64_t i) const { return ((i + 1) * h + oh - 1) / oh; }
  std::int64_t start_w(std::int64_t j) const { return j * w / ow; }
  std::int64_t end_w(std::int64_t j) const { return ((j + 1) * w + ow - 1) / ow; }
  bool global() const { return oh == 1 && ow == 1; }
  Shape output_shape() const { return Shape{n, c, oh, ow}; }
};

inline adaptive_geometry adaptive_geometry_of(const std::string& who, const Shape& x, Int2 out) {
  if (x.size() != 4 || x[2] <= 0 || x[3] <= 0) {
    throw shape_error(who + ": expected a 4-D input [N, C, H, W] with H, W >= 1, got shape " +
                      x.str());
  }
  if (out.h <= 0 || out.w <= 0) {
    throw shape_error(who + ": expected an output_size >= 1, got " + out.str());
  }
  return adaptive_geometry{x[0], x[1], x[2], x[3], out.h, out.w};
}

template <class T>
std::size_t adaptive_avg_pool2d_workspace(const adaptive_geometry& g) {
  return g.global() ? workspace::bytes<T>(g.n * g.c)
                    : workspace::bytes<T>(g.n * g.c * g.h) + workspace::bytes<T>(g.n * g.c);
}

template <class T, class K>
void adaptive_avg_pool2d_forward(const adaptive_geometry& g, const Tensor<T, K>& x,
                                 Tensor<T, K>& y, workspace& ws) {
  using tessera::detail::as_node;
  using sum = backend::sum_op<accumulate_t<T>>;
  // Both dense layouts view as [N, C, H * W] (channels_last's with the channel innermost).
  if (g.global() && (x.is_contiguous() || x.is_contiguous(memory_format::channels_last))) {
    Tensor<T, K> y2 = y.view(Shape{g.n, g.c});
    tessera::detail::reduce_dim_into<sum, backend::finish_mean, T>(
        y2, as_node(x.view(Shape{g.n, g.c, g.h * g.w})), 2, "adaptive_avg_pool2d");
    return;
  }
  Tensor<T, K> rows = ws.take<T, K>(Shape{g.n * g.c * g.h});
  Tensor<T, K> cell = ws.take<T, K>(Shape{g.n, g.c});
  for (std::int64_t i = 0; i < g.oh; ++i) {
    for (std::int64_t j = 0; j < g.ow; ++j) {
      const std::int64_t hs = g.start_h(i), he = g.end_h(i), ws0 = g.start_w(j), we = g.end_w(j);
      const Tensor<T, K> window = x.narrow(2, hs, he - hs).narrow(3, ws0, we - ws0);
      Tensor<T, K> partial = rows.narrow(0, 0, g.n * g.c * (he - hs)).view(Shape{g.n, g.c, he - hs});
      tessera::detail::reduce_dim_into<sum, backend::finish_value, T>(partial, as_node(window), 3,
                                                                      "adaptive_avg_pool2d");
      tessera::detail::reduce_dim_into<sum, backend::finish_value, T>(cell, as_node(partial), 2,
                                                                      "adaptive_avg_pool2d");
      Tensor<T, K> out = y.select(3, j).select(2, i);
      const double scale = 1.0 / static_cast<double>((he - hs) * (we - ws0));
      tessera::detail::run_expression(out, cell * scale);
    }
  }
}

template <class T, class K>
void adaptive_avg_pool2d_backward(const adaptive_geometry& g, const Tensor<T, K>& gy,
                                  Tensor<T, K>& dx, bool accumulate) {
  if (g.global()) {
    const double scale = 1.0 / static_cast<double>(g.h * g.w);
    if (accumulate) {
      tessera::detail::run_expression(dx, dx + gy * scale);
    } else {
      tessera::detail::run_expression(dx, gy * scale);
    }
    return;
  }
  if (!accumulate) dx.zero_();
  for (std::int64_t i = 0; i < g.oh; ++i) {
    for (std::int64_t j = 0; j < g.ow; ++j) {
      const std::int64_t hs = g.start_h(i), he = g.end_h(i), ws0 = g.start_w(j), we = g.end_w(j);
      Tensor<T, K> window = dx.narrow(2, hs, he - hs).narrow(3, ws0, we - ws0);
      const Tensor<T, K> cell = gy.narrow(2, i, 1).narrow(3, j, 1);
      const double scale = 1.0 / static_cast<double>((he - hs) * (we - ws0));
      tessera::detail::run_expression(window, window + cell * scale);
    }
  }
}

}  // namespace tessera::nn::detail
