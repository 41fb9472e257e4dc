// The geometry of a 2-D convolution (torch.nn.functional.conv2d's arguments, Int2, Conv2dArgs),
// its checks (checked arithmetic: shape errors name the values) and the choices made with it once
// per traced or eager call: cuDNN's algorithms, Winograd or im2col, how the CPU loops cut a batch,
// and the knobs tests turn. The passes that run it are in nn/detail/conv2d.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/backend/cuda/cudnn.hpp"
#include "tessera/core/detail/checked.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"

namespace tessera::nn {

/// A pair of extents (height, width), from one number for both (PyTorch's `stride=2`) or two
/// (`stride={2, 1}`).
struct Int2 {
  std::int64_t h = 0;
  std::int64_t w = 0;
  constexpr Int2() = default;
  constexpr Int2(std::int64_t both) : h(both), w(both) {}  // NOLINT: implicit, as PyTorch's int
  constexpr Int2(std::int64_t height, std::int64_t width) : h(height), w(width) {}
  constexpr bool operator==(const Int2&) const = default;
  std::string str() const {
    return "(" + std::to_string(h) + ", " + std::to_string(w) + ")";
  }
};

/// torch.nn.functional.conv2d's arguments after the tensors.
struct Conv2dArgs {
  Int2 stride = 1;
  Int2 padding = 0;
  Int2 dilation = 1;
  std::int64_t groups = 1;
};

}  // namespace tessera::nn

namespace tessera::nn::detail {

/// Forces the device-agnostic im2col/col2im on CPU as well (tests of the CUDA path's logic).
inline bool& conv2d_use_generic_path() {
  thread_local bool generic = false;
  return generic;
}

/// GEMM columns (output positions, image after image) that the CPU loops aim for in one pass.
/// A pass multiplies the weight by the col matrix of several images at once when one image has
/// fewer positions than this, so that the BLAS packs the weight once per pass instead of once per
/// image (for ResNet-50's last stage at 64x64, 4 positions an image, that packing outweighed the
/// products). Tests change it to reach one image per pass and uneven passes; it is read when a
/// geometry is made.
inline std::int64_t& conv2d_pass_columns() {
  thread_local std::int64_t columns = 1024;
  return columns;
}

/// Parts the CPU loops split a batch into, one per thread, each part's images run on its thread
/// with single-threaded GEMMs (0: the calling thread's thread count when a geometry is made, as
/// long as each part keeps conv2d_pass_columns() output positions; at most the batch). One thread
/// per part meets the others once per call, where a GEMM split between threads meets them inside
/// every product: on this project's 2-vCPU VM, in minutes when a cache line takes 180-350 ns
/// between the cores, the split layers ran 1.3-1.7x faster, and within 0.92-1.08x in the other
/// minutes (bench/RESULTS.md). Tests set it; read when a geometry is made.
inline std::int64_t& conv2d_cpu_parts() {
  thread_local std::int64_t parts = 0;
  return parts;
}

/// The fewest input and output channels with which a 3x3 convolution runs as Winograd on CPU
/// (below, its GEMMs are too thin for the 16 products to beat im2col's 36). Tests set it to 1 to
/// reach Winograd with few channels, or to INT64_MAX to turn it off; read when a geometry is made.
inline std::int64_t& conv2d_winograd_min_channels() {
  thread_local std::int64_t channels = 32;
  return channels;
}

/// The most elements a chunk of one image's col matrix holds when the CPU loops cut an image's
/// output rows into chunks (conv2d_geometry::cpu_chunk; 512 KiB of float, a core's L2 here).
/// Tests lower it to reach chunks of one output row; read when a geometry is made.
inline std::int64_t& conv2d_chunk_elements() {
  thread_local std::int64_t elements = std::int64_t{1} << 17;
  return elements;
}

/// The most elements one CPU pass's col matrix may hold when it holds several images (8 MiB of
/// float: a pass's operands stay a fraction of a shared L3).
inline constexpr std::int64_t conv2d_pass_col_limit = std::int64_t{1} << 21;

/// The most elements a Winograd block's transformed input and product may hold together
/// (conv2d_pass_col_limit by default; tests lower it to split the tiles into many blocks).
inline std::int64_t& conv2d_winograd_block_elements() {
  thread_local std::int64_t elements = conv2d_pass_col_limit;
  return elements;
}

struct conv2d_geometry {
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // input [N, C, H, W]
  std::int64_t o = 0, kh = 0, kw = 0;       // weight [O, C / groups, KH, KW]
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  std::int64_t oh = 0, ow = 0;  // output [N, O, OH, OW]
  std::int64_t cpu_pass = 1;    // images per pass of the CPU loops (conv2d_pass_columns)
  std::int64_t cpu_parts = 1;   // parts of the batch, one per thread (conv2d_cpu_parts)
  std::int64_t cpu_chunk = 0;   // output rows per chunk of an image (0: whole images)
  bool winograd = false;  // 3x3, stride 1 or 2: Winograd on CPU (conv2d_winograd_min_channels)
  backend::cuda::conv2d_algorithms cudnn;  // usable: cuDNN runs it (conv2d_choose_cudnn)
  /// x, w, y (and their gradients) laid out channels_last (NHWC; the weight [O, KH, KW, C/g] in
  /// memory); false: all three contiguous NCHW. Set by the caller from its tensors' layouts.
  bool channels_last = false;

  std::int64_t in_per_group() const { return c / groups; }
  std::int64_t out_per_group() const { return o / groups; }
  /// Rows of one group's col: (c, i, j) over the group's channels.
  std::int64_t patch() const { return in_per_group() * kh * kw; }
  std::int64_t spatial() const { return oh * ow; }
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
  Shape output_shape() const { return Shape{n, o, oh, ow}; }
  backend::cuda::conv2d_problem problem() const {
    return {n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups, oh, ow, channels_last};
  }
};

/// The images [first, first + count) of part `part` of a batch cut into `parts` parts of equal
/// size, the last ones smaller (count 0 past the batch): how the CPU loops split a batch between
/// threads (g.cpu_parts), NCHW and NHWC alike.
inline std::pair<std::int64_t, std::int64_t> conv2d_part(const conv2d_geometry& g,
                                                         std::int64_t parts, std::int64_t part) {
  const std::int64_t per = (g.n + parts - 1) / parts;
  const std::int64_t first = std::min(g.n, part * per);
  return {first, std::min(per, g.n - first)};
}

/// Checks the shapes and arguments of a convolution named `who` (the layer, e.g. "Conv2d(3, 64,
/// kernel_size=(7, 7))", or "conv2d"); throws shape_error naming the expected and actual shapes.
inline conv2d_geometry conv2d_geometry_of(const std::string& who, const Shape& x, const Shape& w,
                                          const Shape* bias, const Conv2dArgs& a) {
  if (a.stride.h <= 0 || a.stride.w <= 0 || a.dilation.h <= 0 || a.dilation.w <= 0 ||
      a.padding.h < 0 || a.padding.w < 0 || a.groups <= 0) {
    throw shape_error(who + ": expected stride and dilation >= 1, padding >= 0 and groups >= 1, got "
                      "stride " + a.stride.str() + ", padding " + a.padding.str() + ", dilation " +
                      a.dilation.str() + ", groups " + std::to_string(a.groups));
  }
  if (w.size() != 4) {
    throw shape_error(who + ": expected a 4-D weight [out_channels, in_channels / groups, kH, kW], "
                      "got shape " + w.str());
  }
  if (w[0] % a.groups != 0) {
    throw shape_error(who + ": out_channels (" + std::to_string(w[0]) +
                      ") must be divisible by groups (" + std::to_string(a.groups) + ")");
  }
  const std::int64_t channels = w[1] * a.groups;
  if (x.size() != 4) {
    throw shape_error(who + ": expected a 4-D input [N, " + std::to_string(channels) +
                      ", H, W], got shape " + x.str());
  }
  if (x[1] != channels) {
    throw shape_error(who + ": expected an input of shape [N, " + std::to_string(channels) +
                      ", H, W] (weight " + w.str() + ", groups " + std::to_string(a.groups) +
                      "), got " + x.str());
  }
  if (bias != nullptr && (bias->size() != 1 || (*bias)[0] != w[0])) {
    throw shape_error(who + ": expected a bias of shape [" + std::to_string(w[0]) + "], got " +
                      bias->str());
  }
  conv2d_geometry g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.o = w[0], g.kh = w[2], g.kw = w[3];
  g.sh = a.stride.h, g.sw = a.stride.w, g.ph = a.padding.h, g.pw = a.padding.w;
  g.dh = a.dilation.h, g.dw = a.dilation.w, g.groups = a.groups;
  if (g.kh <= 0 || g.kw <= 0) {
    throw shape_error(who + ": expected a kernel of at least (1, 1), got (" +
                      std::to_string(g.kh) + ", " + std::to_string(g.kw) + ") from the weight " +
                      w.str());
  }
  // Padding, dilation and stride are the user's numbers: every size made from them is checked.
  const tessera::detail::checked_int64 m(who, [&] {
    return "the output size of an input of shape " + x.str() + " with kernel (" +
           std::to_string(g.kh) + ", " + std::to_string(g.kw) + "), stride " + a.stride.str() +
           ", padding " + a.padding.str() + " and dilation " + a.dilation.str();
  });
  const std::int64_t span_h = m.add(m.mul(g.dh, g.kh - 1), 1);
  const std::int64_t span_w = m.add(m.mul(g.dw, g.kw - 1), 1);
  const std::int64_t padded_h = m.add(g.h, m.mul(2, g.ph));
  const std::int64_t padded_w = m.add(g.w, m.mul(2, g.pw));
  if (span_h > padded_h || span_w > padded_w) {
    throw shape_error(who + ": the kernel (" + std::to_string(g.kh) + ", " + std::to_string(g.kw) +
                      ") with dilation " + a.dilation.str() + " spans (" + std::to_string(span_h) +
                      ", " + std::to_string(span_w) + "), larger than the padded input (" +
                      std::to_string(padded_h) + ", " + std::to_string(padded_w) +
                      ") of an input of shape " + x.str());
  }
  g.oh = (padded_h - span_h) / g.sh + 1;
  g.ow = (padded_w - span_w) / g.sw + 1;
  // A stride past the only window moves nothing: with one output position on an axis it is cut
  // to the padded extent (the output and every algorithm's choice stay the same), so that no
  // later product of it (a view's strides, cuDNN's int) overflows.
  if (g.oh == 1) g.sh = std::min(g.sh, padded_h);
  if (g.ow == 1) g.sw = std::min(g.sw, padded_w);
  // The output, the padded input (CUDA's im2col copies into one) and one image's col (c * kh * kw
  // rows of oh * ow): every later size is below these.
  (void)m.mul(m.mul(std::max<std::int64_t>(g.n, 1), g.o), m.mul(g.oh, g.ow));
  (void)m.mul(m.mul(std::max<std::int64_t>(g.n, 1), g.c), m.mul(padded_h, padded_w));
  (void)m.mul(m.mul(g.c, m.mul(g.kh, g.kw)), m.mul(g.oh, g.ow));
  const std::int64_t spatial = std::max<std::int64_t>(g.spatial(), 1);
  const std::int64_t col_image = g.c * g.kh * g.kw * spatial;
  const std::int64_t wanted =
      (std::max<std::int64_t>(conv2d_pass_columns(), 1) + spatial - 1) / spatial;
  const std::int64_t fit =
      std::max<std::int64_t>(1, conv2d_pass_col_limit / std::max<std::int64_t>(col_image, 1));
  // Each part's products pack the whole weight again, so by default a part keeps at least
  // conv2d_pass_columns() output positions (ResNet-50 at 224x224, batch 8: the stem, layer1 and
  // layer2 split; layer3 and layer4, whose weights are large and maps small, do not).
  const std::int64_t batch = std::max<std::int64_t>(g.n, 1);
  const std::int64_t by_columns =
      batch * spatial / std::max<std::int64_t>(conv2d_pass_columns(), 1);
  const std::int64_t parts = std::clamp<std::int64_t>(
      conv2d_cpu_parts() > 0 ? conv2d_cpu_parts()
                             : std::min<std::int64_t>(tessera::cpu::num_threads(), by_columns),
      1, batch);
  // Parts of equal size with none empty: 5 images in 4 parts are 2 + 2 + 1 (3 parts). Passes
  // then cut each part's images.
  const std::int64_t images = (batch + parts - 1) / parts;
  g.cpu_parts = (batch + images - 1) / images;
  const std::int64_t most = std::clamp<std::int64_t>(std::min(wanted, fit), 1, images);
  const std::int64_t passes = (images + most - 1) / most;
  g.cpu_pass = (images + passes - 1) / passes;  // passes of equal size (8 images: 4 + 4, not 6 + 2)
  // An image whose col matrix is large next to a core's L2 but whose patch is short (the 7x7
  // stem: 147 rows of 12544 columns, 7.4 MB) runs in chunks of output rows, so that each chunk's
  // col is written by im2col, read by the GEMMs and by col2im while it stays in L2 (the stem
  // spent a fifth of its time around its GEMMs: im2col, col2im and the BLAS's zeroing of its
  // outputs, all over 7.4 MB). Not for long patches: a chunk's GEMM packs the weight again.
  if (g.cpu_pass == 1 && g.groups == 1 && !g.pointwise() && g.patch() <= 512 && g.ow > 0) {
    const std::int64_t rows =
        std::max<std::int64_t>(1, conv2d_chunk_elements() / (g.patch() * g.ow));
    if (2 * rows <= g.oh) g.cpu_chunk = rows;  // two chunks at least
  }
  // The input gradient's padding is 2 - p: at most 2 on each side. The weight's transforms cost
  // in proportion to C x O and the products save in proportion to C x O x tiles: below one tile
  // per 8 channels (ResNet's last stage on small images or micro-batches: one 2x2 tile per image
  // for 512 channels) Winograd was slower than im2col (bench/RESULTS.md).
  //
  // With stride 2 (any padding: its input gradient runs the forward backwards) a tile saves
  // less, 25 products against 36, so it needs a tile per channel, and outputs that fill their
  // tiles well: with odd sizes the cut tiles' products are lost (ResNet-50's layer4 opening at
  // 224x224, 7x7 outputs in 4x4 tiles: 25 x 16 products per image against 9 x 49 direct). At
  // batch 8, 224x224 that keeps layer2's and layer3's (1.03-1.29x faster than im2col, 28x28 and
  // 14x14 outputs) and leaves layer4's (0.71-0.73x).
  const std::int64_t tiles_hw = ((g.oh + 1) / 2) * ((g.ow + 1) / 2), tiles = g.n * tiles_hw;
  const bool stride1 =
      g.sh == 1 && g.sw == 1 && g.ph <= 2 && g.pw <= 2 && 8 * tiles >= std::max(g.c, g.o);
  const bool stride2 = g.sh == 2 && g.sw == 2 && tiles >= std::max(g.c, g.o) &&
                       4 * 25 * tiles_hw <= 3 * 9 * g.oh * g.ow;
  g.winograd = g.kh == 3 && g.kw == 3 && (stride1 || stride2) && g.dh == 1 && g.dw == 1 &&
               g.groups == 1 && g.n > 0 &&
               std::min(g.c, g.o) >= std::max<std::int64_t>(conv2d_winograd_min_channels(), 1);
  return g;
}

/// Lets cuDNN take a convolution of T on `device` when K is CUDA and cuDNN takes the problem
/// (backends::cudnn's switches, read now): its algorithms, and the process-wide entries of its
/// calls, go into g.cudnn. Called once per traced or eager call, after conv2d_geometry_of; an
/// eager call (`with_backward` false) needs only the forward's. A channels_last problem in double
/// is not given to cuDNN (its NHWC kernels are for float and the 16-bit types; PyTorch keeps double
/// convolutions NCHW too): it runs as GEMMs on NCHW copies.
template <class T, class K>
void conv2d_choose_cudnn(conv2d_geometry& g, Device device, bool with_backward = true) {
  if constexpr (std::is_same_v<K, tessera::cuda>) {
    if (std::is_same_v<T, double> && g.channels_last) return;  // g.cudnn stays unusable
    g.cudnn = backend::cuda::conv2d_choose<T>(device.index, g.problem(), with_backward);
  } else {
    (void)g, (void)device, (void)with_backward;
  }
}

template <class K>
bool conv2d_generic() {
  return !std::is_same_v<K, cpu> || conv2d_use_generic_path();
}

}  // namespace tessera::nn::detail
