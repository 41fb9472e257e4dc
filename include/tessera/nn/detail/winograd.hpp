// Winograd's minimal filtering F(2x2, 3x3) for 3x3 convolutions with stride 1 on CPU (Lavin and
// Gray, "Fast Algorithms for Convolutional Neural Networks", 2015). Each 2x2 block of output
// comes from a 4x4 tile of input with 16 products per pair of channels instead of 36: per block
// of tiles, the input tiles are transformed (V = B^T d B), 16 GEMMs give M[k] = U[k] @ V[k] with
// the transformed weight U = G g G^T, and the output tiles are transformed back (Y = A^T M A).
// The input gradient of such a convolution is one too (the weight turned by 180 degrees, input
// and output channels swapped, padding 2 - p). The weight gradient is the forward's backward
// through the same transforms: per tile the output gradient's 2x2 block becomes Z = A dY A^T,
// 16 GEMMs sum dU[k] = Z[k] @ V[k]^T over the tiles, and dW = G^T dU G (nn/detail/conv2d.hpp
// decides which convolutions come here).
//
// With stride 2 (3x3 kernels), one dimension's two outputs y0 = g0 d0 + g1 d1 + g2 d2 and
// y1 = g0 d2 + g1 d3 + g2 d4 read five inputs, and five products give them where the direct
// form takes six: with B^T d = (d0 - d2, d1, d2, d3, d4 - d2) and G g = (g0, g1, g0 + g2, g1,
// g2), m = (G g) * (B^T d) elementwise, y0 = m0 + m1 + m2 and y1 = m2 + m3 + m4 (A^T). In 2-D,
// 25 products per 2x2 block of output and pair of channels instead of 36, from a 5x5 input
// tile; tiles are 4 input rows (and columns) apart and share one. Its input gradient is not a
// stride-1 convolution, so it runs the forward backwards: per tile Z = A g A^T, 25 GEMMs give
// dV[k] = U[k]^T @ Z[k], and B dV B^T is added into the input gradient's tile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn::detail {

/// One F(2x2, 3x3) convolution with stride 1 or 2: input [n, c, h, w], output [n, o, oh, ow]
/// with oh = h + 2 ph - 2 (stride 1) or (h + 2 ph - 3) / 2 + 1 (stride 2), likewise ow, and
/// `block` tiles transformed and multiplied at once.
struct winograd_problem {
  std::int64_t n = 0, c = 0, h = 0, w = 0, o = 0, ph = 0, pw = 0, oh = 0, ow = 0, block = 1;
  std::int64_t stride = 1;

  /// Transform elements per tile (products per 2x2 outputs and pair of channels).
  std::int64_t elements() const { return stride == 1 ? 16 : 25; }
  /// Input rows (and columns) from one tile to the next, and a tile's input rows (and columns).
  std::int64_t step() const { return 2 * stride; }
  std::int64_t side() const { return stride == 1 ? 4 : 5; }
  /// Columns of a padded input row that covers a row of tiles (from column -pw).
  std::int64_t padded_width() const { return step() * tiles_w() + side() - step(); }
  std::int64_t tiles_h() const { return (oh + 1) / 2; }
  std::int64_t tiles_w() const { return (ow + 1) / 2; }
  std::int64_t tiles() const { return n * tiles_h() * tiles_w(); }
};

/// The distance between consecutive transform elements k of V or M, for `elements` per k: at
/// least that, and 320 bytes past a multiple of 4096. At a multiple of 4096 bytes apart, the 16
/// (with stride 2, 25) streams a transform reads or writes at once would all map to one set of
/// the L1 cache, which holds 8 lines (4K aliasing: the input transform then ran at a third of its
/// speed); 320 bytes (5 lines) apart modulo 4096, they fall in different sets (5 k mod 64 differs
/// for every k below 64).
template <class T>
std::int64_t winograd_stream_stride(std::int64_t elements) {
  constexpr std::int64_t page = 4096, offset = 320, size = static_cast<std::int64_t>(sizeof(T));
  const std::int64_t bytes = elements * size;
  const std::int64_t pad = ((offset - bytes) % page + page) % page;
  return (bytes + pad) / size;
}

/// Workspace elements of winograd_conv3x3_cpu: U, and a block's V and M (p.elements() streams
/// each, of o rows of c, c rows of `block` tiles, and o rows of `block` tiles).
template <class T>
std::int64_t winograd_workspace_numel(const winograd_problem& p) {
  return p.elements() *
         (winograd_stream_stride<T>(p.o * p.c) + winograd_stream_stride<T>(p.c * p.block) +
          winograd_stream_stride<T>(p.o * p.block));
}

/// A problem whose blocks keep V and M within `limit` elements (the tiles of one pass share the
/// transformed weight; a block's operands stay in cache between the transforms and the GEMMs).
inline winograd_problem winograd_problem_of(std::int64_t n, std::int64_t c, std::int64_t h,
                                            std::int64_t w, std::int64_t o, std::int64_t ph,
                                            std::int64_t pw, std::int64_t limit,
                                            std::int64_t stride = 1) {
  winograd_problem p{n, c, h, w, o, ph, pw, h + 2 * ph - 2, w + 2 * pw - 2, 1, stride};
  if (stride == 2) p.oh = (h + 2 * ph - 3) / 2 + 1, p.ow = (w + 2 * pw - 3) / 2 + 1;
  const std::int64_t fit =
      std::max<std::int64_t>(1, limit / std::max<std::int64_t>(p.elements() * (c + o), 1));
  const std::int64_t tiles = std::max<std::int64_t>(p.tiles(), 1);
  const std::int64_t blocks = (tiles + fit - 1) / fit;
  p.block = (tiles + blocks - 1) / blocks;  // blocks of equal size
  return p;
}

/// The 16 elements G g G^T of the kernels g of output channel oo and input channels [0, in):
/// g of input channel ii at k + ii * k_step, read turned by 180 degrees with `turned`; element
/// (r, s) of input channel ii stored at u[(r * 4 + s) * u_stride + ii] (restrict: the stores do
/// not make the compiler reload the kernel).
template <class T>
void winograd_weight_row(const T* __restrict k, std::int64_t k_step, std::int64_t in, bool turned,
                         T* __restrict u, std::int64_t u_stride) {
  for (std::int64_t ii = 0; ii < in; ++ii) {
    const T* g = k + ii * k_step;
    T gk[3][3];
    for (int r = 0; r < 3; ++r) {
      for (int s = 0; s < 3; ++s) gk[r][s] = turned ? g[(2 - r) * 3 + (2 - s)] : g[r * 3 + s];
    }
    T gg[4][3];  // G g
    for (int s = 0; s < 3; ++s) {
      gg[0][s] = gk[0][s];
      gg[1][s] = (gk[0][s] + gk[1][s] + gk[2][s]) * T(0.5);
      gg[2][s] = (gk[0][s] - gk[1][s] + gk[2][s]) * T(0.5);
      gg[3][s] = gk[2][s];
    }
    for (int r = 0; r < 4; ++r) {  // (G g) G^T
      u[(r * 4 + 0) * u_stride + ii] = gg[r][0];
      u[(r * 4 + 1) * u_stride + ii] = (gg[r][0] + gg[r][1] + gg[r][2]) * T(0.5);
      u[(r * 4 + 2) * u_stride + ii] = (gg[r][0] - gg[r][1] + gg[r][2]) * T(0.5);
      u[(r * 4 + 3) * u_stride + ii] = gg[r][2];
    }
  }
}

/// The 25 elements G g G^T of stride 2 for the kernels g of output channel oo and input channels
/// [0, in), g of input channel ii at k + ii * 9, element (r, s) of input channel ii stored at
/// u[(r * 5 + s) * u_stride + ii]: G g = (g0, g1, g0 + g2, g1, g2) along each dimension.
template <class T>
void winograd_s2_weight_row(const T* __restrict k, std::int64_t in, T* __restrict u,
                            std::int64_t u_stride) {
  for (std::int64_t ii = 0; ii < in; ++ii) {
    const T* g = k + ii * 9;
    T gg[5][3];  // G g
    for (int s = 0; s < 3; ++s) {
      gg[0][s] = g[s];
      gg[1][s] = g[3 + s];
      gg[2][s] = g[s] + g[6 + s];
      gg[3][s] = g[3 + s];
      gg[4][s] = g[6 + s];
    }
    for (int r = 0; r < 5; ++r) {  // (G g) G^T
      u[(r * 5 + 0) * u_stride + ii] = gg[r][0];
      u[(r * 5 + 1) * u_stride + ii] = gg[r][1];
      u[(r * 5 + 2) * u_stride + ii] = gg[r][0] + gg[r][2];
      u[(r * 5 + 3) * u_stride + ii] = gg[r][1];
      u[(r * 5 + 4) * u_stride + ii] = gg[r][2];
    }
  }
}

/// U[k][oo][ii] = (G g G^T)[k] (U[k] at u + k * k_stride, [out, in] contiguous) for the kernel g
/// of output channel oo and input channel ii, from a weight [A, B, 3, 3]: g = w[oo][ii] (A = out,
/// B = in), or with `turned` (stride 1 only) the input gradient's kernel g = w[ii][oo] turned by
/// 180 degrees (A = in, B = out).
template <class T>
void winograd_weight_transform(const T* w, std::int64_t out, std::int64_t in, bool turned, T* u,
                               std::int64_t k_stride, std::int64_t stride = 1) {
  backend::cpu::execute_loop(0, out, 8, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t oo = first; oo < last; ++oo) {
      if (stride == 2) {
        winograd_s2_weight_row(w + oo * in * 9, in, u + oo * in, k_stride);
      } else if (turned) {
        winograd_weight_row(w + oo * 9, out * 9, in, true, u + oo * in, k_stride);
      } else {
        winograd_weight_row(w + oo * in * 9, std::int64_t{9}, in, false, u + oo * in, k_stride);
      }
    }
  });
}

/// For every channel in [0, channels), the threads sharing them: fn(channel, image, tile_row,
/// begin, end, done, buffer) for each row of tiles that tiles [first, last) of p cover, in order,
/// with its columns [begin, end) and the tiles of the block before it (`done`). Tile t is image
/// t / (th * tw), row (t / tw) % th, column t % tw. `buffer` holds buffer_size elements of T,
/// one buffer per thread.
template <class T, class Fn>
void for_channel_tile_rows(const winograd_problem& p, std::int64_t channels, std::int64_t first,
                           std::int64_t last, std::int64_t buffer_size, Fn&& fn) {
  const std::int64_t tw = p.tiles_w(), th = p.tiles_h();
  backend::cpu::execute_loop(0, channels, 1, [&](std::int64_t c_first, std::int64_t c_last) {
    std::vector<T> buffer(static_cast<std::size_t>(buffer_size));
    for (std::int64_t channel = c_first; channel < c_last; ++channel) {
      std::int64_t done = 0;
      for (std::int64_t row = first / tw; row * tw < last; ++row) {
        const std::int64_t begin = std::max<std::int64_t>(first - row * tw, 0);
        const std::int64_t end = std::min<std::int64_t>(last - row * tw, tw);
        fn(channel, row / th, row % th, begin, end, done, buffer.data());
        done += end - begin;
      }
    }
  });
}

/// Rows first_row, first_row + 1, ... of a [height, width] plane into the N rows of `buffer`
/// (`padded` elements each, rows[i] = buffer + i * padded), the plane's column 0 at column
/// `left`; zero where a row or a column falls outside the plane.
template <std::size_t N, class T>
void winograd_padded_rows(const T* plane, std::int64_t height, std::int64_t width,
                          std::int64_t first_row, std::int64_t left, T* buffer, std::int64_t padded,
                          T* (&rows)[N]) {
  const std::int64_t lo = std::min(left, padded), hi = std::clamp(width + left, lo, padded);
  for (std::size_t i = 0; i < N; ++i) {
    rows[i] = buffer + static_cast<std::int64_t>(i) * padded;
    const std::int64_t y = first_row + static_cast<std::int64_t>(i);
    if (y < 0 || y >= height) {
      std::fill(rows[i], rows[i] + padded, T(0));
      continue;
    }
    std::fill(rows[i], rows[i] + lo, T(0));
    std::copy(plane + y * width + (lo - left), plane + y * width + (hi - left), rows[i] + lo);
    std::fill(rows[i] + hi, rows[i] + padded, T(0));
  }
}

/// Transforms the tiles in columns [begin, end) of one row of tiles, from the four padded input
/// rows r0..r3 (tile column c reads columns 2c .. 2c + 3), into out[k * k_stride + c - begin]
/// for transform element k (restrict: the 16 stores do not make the compiler reload the rows).
template <class T>
void winograd_input_row(const T* __restrict r0, const T* __restrict r1, const T* __restrict r2,
                        const T* __restrict r3, std::int64_t begin, std::int64_t end,
                        T* __restrict out, std::int64_t k_stride) {
  for (std::int64_t col = begin; col < end; ++col) {
    const std::int64_t x = 2 * col;
    T b[4][4];  // B^T d, column by column
    for (int j = 0; j < 4; ++j) {
      b[0][j] = r0[x + j] - r2[x + j];
      b[1][j] = r1[x + j] + r2[x + j];
      b[2][j] = r2[x + j] - r1[x + j];
      b[3][j] = r1[x + j] - r3[x + j];
    }
    T* o = out + (col - begin);
    for (int i = 0; i < 4; ++i) {  // (B^T d) B
      o[(i * 4 + 0) * k_stride] = b[i][0] - b[i][2];
      o[(i * 4 + 1) * k_stride] = b[i][1] + b[i][2];
      o[(i * 4 + 2) * k_stride] = b[i][2] - b[i][1];
      o[(i * 4 + 3) * k_stride] = b[i][1] - b[i][3];
    }
  }
}

/// Transforms the stride-2 tiles in columns [begin, end) of one row of tiles, from the five
/// padded input rows r0..r4 (tile column c reads columns 4c .. 4c + 4), into
/// out[k * k_stride + c - begin]: B^T d = (d0 - d2, d1, d2, d3, d4 - d2) along each dimension.
template <class T>
void winograd_s2_input_row(const T* __restrict r0, const T* __restrict r1,
                           const T* __restrict r2, const T* __restrict r3,
                           const T* __restrict r4, std::int64_t begin, std::int64_t end,
                           T* __restrict out, std::int64_t k_stride) {
  for (std::int64_t col = begin; col < end; ++col) {
    const std::int64_t x = 4 * col;
    T b[5][5];  // B^T d, column by column
    for (int j = 0; j < 5; ++j) {
      b[0][j] = r0[x + j] - r2[x + j];
      b[1][j] = r1[x + j];
      b[2][j] = r2[x + j];
      b[3][j] = r3[x + j];
      b[4][j] = r4[x + j] - r2[x + j];
    }
    T* o = out + (col - begin);
    for (int i = 0; i < 5; ++i) {  // (B^T d) B
      o[(i * 5 + 0) * k_stride] = b[i][0] - b[i][2];
      o[(i * 5 + 1) * k_stride] = b[i][1];
      o[(i * 5 + 2) * k_stride] = b[i][2];
      o[(i * 5 + 3) * k_stride] = b[i][3];
      o[(i * 5 + 4) * k_stride] = b[i][4] - b[i][2];
    }
  }
}

/// V[k][ci][t - first] = (B^T d B)[k] for the input tile d (4x4, or 5x5 with stride 2) of
/// channel ci and tile t, for tiles [first, last) of x [n, c, h, w] (contiguous); zero outside
/// the image. V[k] starts at v + k * k_stride and is [c, last - first] contiguous.
template <class T>
void winograd_input_transform(const winograd_problem& p, const T* x, std::int64_t first,
                              std::int64_t last, T* v, std::int64_t k_stride) {
  const std::int64_t count = last - first, width = p.padded_width();
  auto row_of_tiles = [&](std::int64_t ci, std::int64_t image, std::int64_t tile_row,
                          std::int64_t begin, std::int64_t end, std::int64_t done, T* padded) {
    const T* plane = x + (image * p.c + ci) * p.h * p.w;
    T* out = v + ci * count + done;
    const std::int64_t top = p.step() * tile_row - p.ph;
    if (p.stride == 1) {
      T* rows[4];
      winograd_padded_rows(plane, p.h, p.w, top, p.pw, padded, width, rows);
      winograd_input_row(rows[0], rows[1], rows[2], rows[3], begin, end, out, k_stride);
    } else {
      T* rows[5];
      winograd_padded_rows(plane, p.h, p.w, top, p.pw, padded, width, rows);
      winograd_s2_input_row(rows[0], rows[1], rows[2], rows[3], rows[4], begin, end, out,
                            k_stride);
    }
  };
  for_channel_tile_rows<T>(p, p.c, first, last, p.side() * width, row_of_tiles);
}

/// y's 2x2 blocks of tiles [first, last) = (A^T M A) of M[k][oo][t - first] (M[k] at
/// m + k * k_stride, [o, last - first] contiguous), set or (with `add`) added into y
/// [n, o, oh, ow] (contiguous); the last row and column of tiles are cut to the output.
template <class T>
void winograd_output_transform(const winograd_problem& p, const T* m, std::int64_t first,
                               std::int64_t last, std::int64_t k_stride, T* y, bool add) {
  const std::int64_t count = last - first, tw = p.tiles_w();
  for_channel_tile_rows<T>(
      p, p.o, first, last, 2 * 2 * tw,
      [&](std::int64_t oo, std::int64_t image, std::int64_t tile_row, std::int64_t begin,
          std::int64_t end, std::int64_t done, T* rows) {
        T* row0 = rows;
        T* row1 = rows + 2 * tw;
        const T* tiles = m + oo * count + done;  // tile column col's M[0] at tiles + col - begin
        if (p.stride == 1) {
          for (std::int64_t col = begin; col < end; ++col) {
            const T* in = tiles + (col - begin);
            T s[2][4];  // A^T M
            for (int j = 0; j < 4; ++j) {
              const T m0 = in[(0 * 4 + j) * k_stride], m1 = in[(1 * 4 + j) * k_stride];
              const T m2 = in[(2 * 4 + j) * k_stride], m3 = in[(3 * 4 + j) * k_stride];
              s[0][j] = m0 + m1 + m2;
              s[1][j] = m1 - m2 - m3;
            }
            row0[2 * col] = s[0][0] + s[0][1] + s[0][2];  // (A^T M) A
            row0[2 * col + 1] = s[0][1] - s[0][2] - s[0][3];
            row1[2 * col] = s[1][0] + s[1][1] + s[1][2];
            row1[2 * col + 1] = s[1][1] - s[1][2] - s[1][3];
          }
        } else {
          for (std::int64_t col = begin; col < end; ++col) {
            const T* in = tiles + (col - begin);
            T s[2][5];  // A^T M, with A^T = [[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]]
            for (int j = 0; j < 5; ++j) {
              const T m2 = in[(2 * 5 + j) * k_stride];
              s[0][j] = in[(0 * 5 + j) * k_stride] + in[(1 * 5 + j) * k_stride] + m2;
              s[1][j] = m2 + in[(3 * 5 + j) * k_stride] + in[(4 * 5 + j) * k_stride];
            }
            row0[2 * col] = s[0][0] + s[0][1] + s[0][2];  // (A^T M) A
            row0[2 * col + 1] = s[0][2] + s[0][3] + s[0][4];
            row1[2 * col] = s[1][0] + s[1][1] + s[1][2];
            row1[2 * col + 1] = s[1][2] + s[1][3] + s[1][4];
          }
        }
        T* plane = y + (image * p.o + oo) * p.oh * p.ow;
        const std::int64_t lo = 2 * begin, hi = std::min<std::int64_t>(2 * end, p.ow);
        for (int i = 0; i < 2; ++i) {
          const std::int64_t out_row = 2 * tile_row + i;
          if (out_row >= p.oh) break;
          const T* from = i == 0 ? row0 : row1;
          T* to = plane + out_row * p.ow;
          if (add) {
            for (std::int64_t e = lo; e < hi; ++e) to[e] += from[e];
          } else {
            std::copy(from + lo, from + hi, to + lo);
          }
        }
      });
}

/// Calls gemm(k) for the transform elements k of p, the threads taking different k's: each of
/// the 16 (or 25) GEMMs then runs on one thread (a BLAS call inside a parallel region does), with
/// operands of its own, where a threaded GEMM per k shares its packed panels between the threads
/// and meets them 16 times per block.
template <class Gemm>
void winograd_for_each_k(const winograd_problem& p, Gemm&& gemm) {
  backend::cpu::execute_loop(0, p.elements(), 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t k = first; k < last; ++k) gemm(k);
  });
}

/// Transforms the output-gradient tiles in columns [begin, end) of one row of tiles, from the
/// two padded gradient rows r0, r1 (tile column c reads columns 2c, 2c + 1), into
/// out[k * k_stride + c - begin]: Z = A g A^T, with A = [[1, 0], [1, 1], [1, -1], [0, -1]].
template <class T>
void winograd_grad_row(const T* __restrict r0, const T* __restrict r1, std::int64_t begin,
                       std::int64_t end, T* __restrict out, std::int64_t k_stride) {
  for (std::int64_t col = begin; col < end; ++col) {
    const std::int64_t x = 2 * col;
    const T g00 = r0[x], g01 = r0[x + 1], g10 = r1[x], g11 = r1[x + 1];
    const T q[4][2] = {{g00, g01}, {g00 + g10, g01 + g11}, {g00 - g10, g01 - g11}, {-g10, -g11}};
    T* o = out + (col - begin);
    for (int i = 0; i < 4; ++i) {  // (A g) A^T
      o[(i * 4 + 0) * k_stride] = q[i][0];
      o[(i * 4 + 1) * k_stride] = q[i][0] + q[i][1];
      o[(i * 4 + 2) * k_stride] = q[i][0] - q[i][1];
      o[(i * 4 + 3) * k_stride] = -q[i][1];
    }
  }
}

/// Transforms the stride-2 output-gradient tiles in columns [begin, end) of one row of tiles
/// (as winograd_grad_row): Z = A g A^T with A = [[1, 0], [1, 0], [1, 1], [0, 1], [0, 1]].
template <class T>
void winograd_s2_grad_row(const T* __restrict r0, const T* __restrict r1, std::int64_t begin,
                          std::int64_t end, T* __restrict out, std::int64_t k_stride) {
  for (std::int64_t col = begin; col < end; ++col) {
    const std::int64_t x = 2 * col;
    const T g00 = r0[x], g01 = r0[x + 1], g10 = r1[x], g11 = r1[x + 1];
    const T q[5][2] = {{g00, g01}, {g00, g01}, {g00 + g10, g01 + g11}, {g10, g11}, {g10, g11}};
    T* o = out + (col - begin);
    for (int i = 0; i < 5; ++i) {  // (A g) A^T
      o[(i * 5 + 0) * k_stride] = q[i][0];
      o[(i * 5 + 1) * k_stride] = q[i][0];
      o[(i * 5 + 2) * k_stride] = q[i][0] + q[i][1];
      o[(i * 5 + 3) * k_stride] = q[i][1];
      o[(i * 5 + 4) * k_stride] = q[i][1];
    }
  }
}

/// Z[k][oo][t - first] = (A g A^T)[k] for the 2x2 block g of the output gradient gy
/// [n, o, oh, ow] (contiguous) under tile t of channel oo, zero past the output, for tiles
/// [first, last). Z[k] starts at z + k * k_stride and is [o, last - first] contiguous.
template <class T>
void winograd_grad_transform(const winograd_problem& p, const T* gy, std::int64_t first,
                             std::int64_t last, T* z, std::int64_t k_stride) {
  const std::int64_t count = last - first, width = 2 * p.tiles_w();
  for_channel_tile_rows<T>(p, p.o, first, last, 2 * width,
                           [&](std::int64_t oo, std::int64_t image, std::int64_t tile_row,
                               std::int64_t begin, std::int64_t end, std::int64_t done, T* padded) {
                             T* rows[2];
                             winograd_padded_rows(gy + (image * p.o + oo) * p.oh * p.ow, p.oh, p.ow,
                                                  2 * tile_row, 0, padded, width, rows);
                             T* out = z + oo * count + done;
                             if (p.stride == 1) {
                               winograd_grad_row(rows[0], rows[1], begin, end, out, k_stride);
                             } else {
                               winograd_s2_grad_row(rows[0], rows[1], begin, end, out, k_stride);
                             }
                           });
}

/// g = G^T dU G (stride 1) for one pair of channels, dU's element k at d[k * k_stride].
template <class T>
void winograd_weight_grad_tile(const T* d, std::int64_t k_stride, T (&g)[3][3]) {
  T u[4][4];
  for (int k = 0; k < 16; ++k) u[k / 4][k % 4] = d[k * k_stride];
  T r[3][4];  // G^T dU, with G^T = [[1, 1/2, 1/2, 0], [0, 1/2, -1/2, 0], [0, 1/2, 1/2, 1]]
  for (int s = 0; s < 4; ++s) {
    r[0][s] = u[0][s] + (u[1][s] + u[2][s]) * T(0.5);
    r[1][s] = (u[1][s] - u[2][s]) * T(0.5);
    r[2][s] = (u[1][s] + u[2][s]) * T(0.5) + u[3][s];
  }
  for (int i = 0; i < 3; ++i) {  // (G^T dU) G
    g[i][0] = r[i][0] + (r[i][1] + r[i][2]) * T(0.5);
    g[i][1] = (r[i][1] - r[i][2]) * T(0.5);
    g[i][2] = (r[i][1] + r[i][2]) * T(0.5) + r[i][3];
  }
}

/// g = G^T dU G (stride 2) for one pair of channels, dU's element k at d[k * k_stride], with
/// G^T = [[1, 0, 1, 0, 0], [0, 1, 0, 1, 0], [0, 0, 1, 0, 1]].
template <class T>
void winograd_s2_weight_grad_tile(const T* d, std::int64_t k_stride, T (&g)[3][3]) {
  T u[5][5];
  for (int k = 0; k < 25; ++k) u[k / 5][k % 5] = d[k * k_stride];
  T r[3][5];  // G^T dU
  for (int s = 0; s < 5; ++s) {
    r[0][s] = u[0][s] + u[2][s];
    r[1][s] = u[1][s] + u[3][s];
    r[2][s] = u[2][s] + u[4][s];
  }
  for (int i = 0; i < 3; ++i) {  // (G^T dU) G
    g[i][0] = r[i][0] + r[i][2];
    g[i][1] = r[i][1] + r[i][3];
    g[i][2] = r[i][2] + r[i][4];
  }
}

/// dw = (or, with `add`, dw +=) G^T dU G for every pair of channels: dU[k][oo][ii] at
/// du + k * k_stride + oo * in + ii, dw [out, in, 3, 3] contiguous.
template <class T>
void winograd_weight_grad_output(const T* du, std::int64_t k_stride, std::int64_t out,
                                 std::int64_t in, T* dw, bool add, std::int64_t stride = 1) {
  backend::cpu::execute_loop(0, out, 8, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t oo = first; oo < last; ++oo) {
      for (std::int64_t ii = 0; ii < in; ++ii) {
        T g[3][3];
        if (stride == 1) {
          winograd_weight_grad_tile(du + oo * in + ii, k_stride, g);
        } else {
          winograd_s2_weight_grad_tile(du + oo * in + ii, k_stride, g);
        }
        T* target = dw + (oo * in + ii) * 9;
        for (int e = 0; e < 9; ++e) target[e] = add ? target[e] + g[e / 3][e % 3] : g[e / 3][e % 3];
      }
    }
  });
}

/// One block of tiles in a Winograd call's workspace, p.elements() streams each: U [o, c] for
/// every k, then the block's c-side operand (V, or the input gradient's dV) [c, count] and its
/// o-side one (M, or the output gradient's Z) [o, count].
template <class T>
struct winograd_block {
  const Tensor<T, cpu>& workspace;
  const winograd_problem& p;
  std::int64_t first, count, u_stride, c_stride, o_stride;

  std::int64_t c_begin() const { return p.elements() * u_stride; }
  std::int64_t o_begin() const { return c_begin() + p.elements() * c_stride; }
  T* c_side() const { return workspace.data() + c_begin(); }
  T* o_side() const { return workspace.data() + o_begin(); }
  Tensor<T, cpu> u(std::int64_t k) const {
    return workspace.narrow(0, k * u_stride, p.o * p.c).view(Shape{p.o, p.c});
  }
  Tensor<T, cpu> c(std::int64_t k) const {
    return workspace.narrow(0, c_begin() + k * c_stride, p.c * count).view(Shape{p.c, count});
  }
  Tensor<T, cpu> o(std::int64_t k) const {
    return workspace.narrow(0, o_begin() + k * o_stride, p.o * count).view(Shape{p.o, count});
  }
};

/// Calls fn(block) for the blocks of p.block tiles in order, over `workspace`
/// (winograd_workspace_numel<T>(p) elements, U first).
template <class T, class Fn>
void winograd_for_each_block(const winograd_problem& p, const Tensor<T, cpu>& workspace, Fn&& fn) {
  const std::int64_t u_stride = winograd_stream_stride<T>(p.o * p.c), tiles = p.tiles();
  for (std::int64_t first = 0; first < tiles; first += p.block) {
    const std::int64_t count = std::min(p.block, tiles - first);
    fn(winograd_block<T>{workspace, p, first, count, u_stride,
                         winograd_stream_stride<T>(p.c * count),
                         winograd_stream_stride<T>(p.o * count)});
  }
}

/// dw = (or, with `add`, dw +=) the weight gradient of the F(2x2, 3x3) convolution (stride
/// p.stride) of x
/// [n, c, h, w] for the output gradient gy [n, o, oh, ow], using `workspace`
/// (winograd_workspace_numel<T>(p) elements, as the forward's). x, gy, dw [o, c, 3, 3]
/// contiguous, on the CPU; needs a GEMM that adds into its output (BLAS).
template <class T>
void winograd_weight_grad_cpu(const winograd_problem& p, const T* x, const T* gy, T* dw, bool add,
                              const Tensor<T, cpu>& workspace) {
  winograd_for_each_block(p, workspace, [&](const winograd_block<T>& b) {
    const std::int64_t last = b.first + b.count;
    winograd_input_transform(p, x, b.first, last, b.c_side(), b.c_stride);
    winograd_grad_transform(p, gy, b.first, last, b.o_side(), b.o_stride);
    winograd_for_each_k(p, [&](std::int64_t k) {
      Tensor<T, cpu> du_k = b.u(k);
      tessera::detail::matmul_into(du_k, b.o(k), b.c(k).t(), b.first > 0);
    });
  });
  winograd_weight_grad_output(workspace.data(), winograd_stream_stride<T>(p.o * p.c), p.o, p.c, dw,
                              add, p.stride);
}

/// y = (or, with `add`, y +=) the F(2x2, 3x3) convolution (stride p.stride) of x [n, c, h, w]
/// with the weight w (see winograd_weight_transform for `turned`), using `workspace`
/// (winograd_workspace_numel<T>(p) elements). x, w, y contiguous, on the CPU.
template <class T>
void winograd_conv3x3_cpu(const winograd_problem& p, const T* x, const T* w, bool turned, T* y,
                          bool add, const Tensor<T, cpu>& workspace) {
  winograd_weight_transform(w, p.o, p.c, turned, workspace.data(),
                            winograd_stream_stride<T>(p.o * p.c), p.stride);
  winograd_for_each_block(p, workspace, [&](const winograd_block<T>& b) {
    const std::int64_t last = b.first + b.count;
    winograd_input_transform(p, x, b.first, last, b.c_side(), b.c_stride);
    winograd_for_each_k(p, [&](std::int64_t k) {
      Tensor<T, cpu> m_k = b.o(k);
      tessera::detail::matmul_into(m_k, b.u(k), b.c(k));
    });
    winograd_output_transform(p, b.o_side(), b.first, last, b.o_stride, y, add);
  });
}

/// Adds B dV B^T of the stride-2 tiles [first, last) into dx [n, c, h, w] (contiguous), for
/// dV[k][ci][t - first] at dv + k * k_stride (B dV = (dv0, dv1, dv2 - dv0 - dv4, dv3, dv4) along
/// each dimension): per channel and row of tiles, the tiles' 5x5 blocks go into five padded rows
/// (a tile's last column, which the next tile's first one shares, is carried to it in
/// registers) and the rows are added into the plane (neighbouring rows of tiles share a row).
/// With `zero`, each plane is zeroed when its first tile comes.
template <class T>
void winograd_s2_input_grad_transform(const winograd_problem& p, const T* dv, std::int64_t first,
                                      std::int64_t last, std::int64_t k_stride, T* dx, bool zero) {
  const std::int64_t count = last - first, width = p.padded_width();
  for_channel_tile_rows<T>(
      p, p.c, first, last, 5 * width,
      [&](std::int64_t ci, std::int64_t image, std::int64_t tile_row, std::int64_t begin,
          std::int64_t end, std::int64_t done, T* rows) {
        T* plane = dx + (image * p.c + ci) * p.h * p.w;
        if (zero && tile_row == 0 && begin == 0) std::fill(plane, plane + p.h * p.w, T(0));
        const T* tiles = dv + ci * count + done;
        T carry[5] = {};
        for (std::int64_t col = begin; col < end; ++col) {
          const T* in = tiles + (col - begin);
          T t[5][5];  // dV B^T, row by row
          for (int i = 0; i < 5; ++i) {
            const T v0 = in[(i * 5 + 0) * k_stride], v2 = in[(i * 5 + 2) * k_stride];
            const T v4 = in[(i * 5 + 4) * k_stride];
            t[i][0] = v0;
            t[i][1] = in[(i * 5 + 1) * k_stride];
            t[i][2] = v2 - v0 - v4;
            t[i][3] = in[(i * 5 + 3) * k_stride];
            t[i][4] = v4;
          }
          for (int j = 0; j < 5; ++j) t[2][j] -= t[0][j] + t[4][j];  // B (dV B^T)
          for (int r = 0; r < 5; ++r) {
            T* row = rows + r * width + 4 * col;
            row[0] = t[r][0] + carry[r];
            row[1] = t[r][1];
            row[2] = t[r][2];
            row[3] = t[r][3];
            carry[r] = t[r][4];
          }
        }
        for (int r = 0; r < 5; ++r) rows[r * width + 4 * end] = carry[r];
        // Padded column q is the plane's column q - pw.
        const std::int64_t from = std::max(4 * begin, p.pw);
        const std::int64_t to = std::min(4 * end + 1, p.w + p.pw);
        for (int r = 0; r < 5; ++r) {
          const std::int64_t y = 4 * tile_row - p.ph + r;
          if (y < 0 || y >= p.h || from >= to) continue;
          T* target = plane + y * p.w - p.pw;
          const T* source = rows + r * width;
          for (std::int64_t q = from; q < to; ++q) target[q] += source[q];
        }
      });
}

/// dx = (or, with `add`, dx +=) the input gradient of the stride-2 F(2x2, 3x3) convolution p of
/// x [n, c, h, w] with the weight w [o, c, 3, 3] for the output gradient gy [n, o, oh, ow]:
/// dV[k] = U[k]^T @ Z[k] per block of tiles, added into dx as B dV B^T. Uses `workspace`
/// (winograd_workspace_numel<T>(p) elements: U, then a block's Z and dV in the places of the
/// forward's M and V). gy, w, dx contiguous, on the CPU.
template <class T>
void winograd_s2_input_grad_cpu(const winograd_problem& p, const T* gy, const T* w, T* dx,
                                bool add, const Tensor<T, cpu>& workspace) {
  winograd_weight_transform(w, p.o, p.c, false, workspace.data(),
                            winograd_stream_stride<T>(p.o * p.c), p.stride);
  winograd_for_each_block(p, workspace, [&](const winograd_block<T>& b) {
    const std::int64_t last = b.first + b.count;
    winograd_grad_transform(p, gy, b.first, last, b.o_side(), b.o_stride);
    winograd_for_each_k(p, [&](std::int64_t k) {
      Tensor<T, cpu> dv_k = b.c(k);
      tessera::detail::matmul_into(dv_k, b.u(k).t(), b.o(k));
    });
    winograd_s2_input_grad_transform(p, b.c_side(), b.first, last, b.c_stride, dx, !add);
  });
}

}  // namespace tessera::nn::detail
