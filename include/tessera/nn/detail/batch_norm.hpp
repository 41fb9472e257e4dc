// Batch normalisation passes on inputs viewed [N, C, L] (L = 1 for [N, C], H * W for images),
// shared by the eager layers and their autograd nodes, written as fused expressions and
// reductions so that CPU and CUDA run the same code:
//
// - statistics [3, C]: rows mean, 1 / sqrt(var + eps), var (biased), from the batch (two
//   reductions of x, then of (x - mean)^2, each along L then N) or from the running statistics;
// - apply: y = x * scale + shift with scale = w / sqrt(var + eps), shift = b - mean * scale (one
//   pass; ReLU fused on request, as ResNet's blocks use it);
// - backward: per-channel sums of g and g * (x - mean) (two reductions), then dx in one pass:
//   scale * (g - sum(g) / M - (x - mean) * invstd^2 * sum(g (x - mean)) / M) with batch
//   statistics, scale * g with running ones; dw = invstd * sum(g (x - mean)), db = sum(g).
//   With ReLU fused, g is first masked by y > 0 (y, the output, is kept for that).
// On CUDA devices (units nvcc compiles), float and double take backend/cuda/batch_norm.cuh for the
// per-channel reductions (the statistics in one pass over x, the backward's two sums in one pass
// over g and x, each two launches instead of the expressions' six or more) and for the apply and
// dx passes over contiguous tensors (the same arithmetic, a thread per 16 bytes with the channel
// from its position).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/backend/cuda/batch_norm.cuh"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/expr/reduce.hpp"
#include "tessera/nn/detail/workspace.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn::detail {

/// [N, C, L] of a batch-norm input of shape [N, C], [N, C, L] or [N, C, H, W].
inline Shape batch_norm_view(const Shape& shape) {
  std::int64_t l = 1;
  for (int d = 2; d < shape.size(); ++d) l *= shape[d];
  return Shape{shape[0], shape[1], l};
}

/// sum of `e` ([N, C, L]) over N and L into `out` [C], through `partial` [N, C].
template <class T, class K, class E>
void channel_sum(const E& e, Tensor<T, K> out, Tensor<T, K>& partial) {
  using sum = backend::sum_op<accumulate_t<T>>;
  tessera::detail::reduce_dim_into<sum, backend::finish_value, T>(partial, e, 2, "batch_norm");
  tessera::detail::reduce_dim_into<sum, backend::finish_value, T>(
      out, tessera::detail::as_node(partial), 0, "batch_norm");
}

/// Whether the CUDA channel reductions (backend/cuda/batch_norm.cuh) serve T on K in this unit.
template <class T, class K>
inline constexpr bool cuda_channel_reductions =
    TESSERA_CUDA_KERNELS && std::is_same_v<K, cuda> &&
    (std::is_same_v<T, float> || std::is_same_v<T, double>);

/// Bytes of the CUDA channel reductions' partials for C channels (0 where they are not used).
template <class T, class K>
std::size_t channel_partials_workspace(std::int64_t channels) {
#if TESSERA_CUDA_KERNELS
  if constexpr (cuda_channel_reductions<T, K>) {
    return workspace::raw_bytes(backend::cuda::channel_partials_bytes(channels));
  }
#endif
  (void)channels;
  return 0;
}

/// Whether t3 [N, C, L] is the [N, C, H * W] view of a dense channels_last tensor: strides
/// [L * C, 1, C], the channel innermost (dimensions of extent 1 step by anything). The CUDA
/// kernels then see it as [N * L, C] row-major.
template <class T, class K>
bool channels_last_view(const Tensor<T, K>& t3) {
  const Shape& s = t3.shape();
  const Strides& st = t3.strides();
  return (s[1] == 1 || st[1] == 1) && (s[2] == 1 || st[2] == s[1]) &&
         (s[0] == 1 || st[0] == s[1] * s[2]);
}

template <class T, class K>
std::size_t batch_norm_stats_workspace(const Shape& view) {
  return workspace::bytes<T>(view[0] * view[1]) + channel_partials_workspace<T, K>(view[1]);
}

/// The batch's statistics of x3 [N, C, L] into stats [3, C].
template <class T, class K>
void batch_norm_batch_stats(const Tensor<T, K>& x3, Tensor<T, K>& stats, double eps,
                            workspace& ws) {
  const std::int64_t n = x3.size(0), c = x3.size(1), l = x3.size(2);
#if TESSERA_CUDA_KERNELS
  if constexpr (cuda_channel_reductions<T, K>) {
    const bool nhwc = !x3.is_contiguous() && channels_last_view(x3);
    if ((x3.is_contiguous() || nhwc) && stats.is_contiguous()) {
      DeviceGuard<cuda> guard(x3.device().index);
      void* partials = ws.take_raw(backend::cuda::channel_partials_bytes(c));
      backend::cuda::batch_norm_statistics(x3.data(), n, c, l, stats.data(), eps, partials, nhwc);
      return;
    }
  }
#endif
  Tensor<T, K> partial = ws.take<T, K>(Shape{n, c});
  Tensor<T, K> mean = stats.select(0, 0), invstd = stats.select(0, 1), var = stats.select(0, 2);
  const double inverse_count = 1.0 / static_cast<double>(n * l);
  channel_sum(tessera::detail::as_node(x3), mean, partial);
  tessera::detail::run_expression(mean, mean * inverse_count);
  const Tensor<T, K> mean3 = mean.view(Shape{1, c, 1});
  channel_sum((x3 - mean3) * (x3 - mean3), var, partial);
  tessera::detail::run_expression(var, var * inverse_count);
  tessera::detail::run_expression(invstd, rsqrt(var + eps));
}

/// The running statistics into stats [3, C].
template <class T, class K>
void batch_norm_running_stats(const Tensor<T, K>& running_mean, const Tensor<T, K>& running_var,
                              Tensor<T, K>& stats, double eps) {
  Tensor<T, K> mean = stats.select(0, 0), invstd = stats.select(0, 1), var = stats.select(0, 2);
  mean.copy_(running_mean);
  var.copy_(running_var);
  tessera::detail::run_expression(invstd, rsqrt(running_var + eps));
}

template <class T>
std::size_t batch_norm_apply_workspace(const Shape&) {
  return 0;
}

/// y3 = x3 * scale + shift (then ReLU when `relu`); w, b undefined when not affine. One pass:
/// scale = invstd * w and shift = b - mean * scale are computed per element from the [1, C, 1]
/// operands (the same arithmetic as storing them first, without two launches over C).
template <class T, class K>
void batch_norm_apply(const Tensor<T, K>& x3, const Tensor<T, K>& stats, const Tensor<T, K>* w,
                      const Tensor<T, K>* b, bool relu_after, Tensor<T, K>& y3, workspace&) {
  const std::int64_t c = x3.size(1);
#if TESSERA_CUDA_KERNELS
  if constexpr (cuda_channel_reductions<T, K>) {
    // One thread per 16 bytes with the channel from its position (batch_norm.cuh), not the row
    // kernel, which places each per-channel operand once per row of L.
    // channels_last x and y: the same kernel over [N * L, C, 1] (the channel of position i is
    // i % C; one element per thread).
    const bool nchw = x3.is_contiguous() && y3.is_contiguous();
    const bool nhwc = channels_last_view(x3) && channels_last_view(y3);
    if ((nchw || nhwc) && stats.is_contiguous() &&
        (w == nullptr || (w->is_contiguous() && b->is_contiguous()))) {
      DeviceGuard<cuda> guard(x3.device().index);
      const std::int64_t n = nchw ? x3.size(0) : x3.size(0) * x3.size(2);
      backend::cuda::batch_norm_apply_channels(
          x3.data(), stats.data(), w != nullptr ? w->data() : nullptr,
          w != nullptr ? b->data() : nullptr, relu_after, n, c, nchw ? x3.size(2) : 1, y3.data());
      return;
    }
  }
#endif
  const Tensor<T, K> mean3 = stats.select(0, 0).view(Shape{1, c, 1});
  const Tensor<T, K> invstd3 = stats.select(0, 1).view(Shape{1, c, 1});
  auto run = [&](const auto& scale, const auto& shift) {
    if (relu_after) {
      tessera::detail::run_expression(y3, relu(x3 * scale + shift));
    } else {
      tessera::detail::run_expression(y3, x3 * scale + shift);
    }
  };
  if (w != nullptr) {
    const Tensor<T, K> w3 = w->view(Shape{1, c, 1}), b3 = b->view(Shape{1, c, 1});
    const auto scale = invstd3 * w3;
    run(scale, b3 - mean3 * scale);
  } else {
    run(invstd3, -(mean3 * invstd3));
  }
}

template <class T, class K>
std::size_t batch_norm_backward_workspace(const Shape& view) {
  return workspace::bytes<T>(view[0] * view[1]) + 2 * workspace::bytes<T>(view[1]) +
         channel_partials_workspace<T, K>(view[1]);
}

/// Gradients of batch_norm_apply for the upstream gradient g3 (dx3, dw, db: null when not
/// wanted; each written, or added to when its flag says so). `batch`: the statistics were the
/// batch's (their dependence on x is part of dx). y3 is read only when `relu_after`.
template <class T, class K>
void batch_norm_backward(const Tensor<T, K>& x3, const Tensor<T, K>& stats, const Tensor<T, K>* w,
                         const Tensor<T, K>& y3, bool relu_after, bool batch,
                         const Tensor<T, K>& g3_in, Tensor<T, K>* dx3, bool dx_accumulate,
                         Tensor<T, K>* dw, bool dw_accumulate, Tensor<T, K>* db,
                         bool db_accumulate, workspace& ws) {
  using tessera::detail::run_expression;
  const std::int64_t n = x3.size(0), c = x3.size(1), l = x3.size(2);
  Tensor<T, K> partial = ws.take<T, K>(Shape{n, c});
  Tensor<T, K> sum_g = ws.take<T, K>(Shape{c}), sum_gx = ws.take<T, K>(Shape{c});
  const Tensor<T, K> mean = stats.select(0, 0), invstd = stats.select(0, 1);
  const Tensor<T, K> mean3 = mean.view(Shape{1, c, 1}), invstd3 = invstd.view(Shape{1, c, 1});
  auto body = [&](const auto& g) {
    const bool sums = dw != nullptr || db != nullptr || (dx3 != nullptr && batch);
    if (sums) {
      bool done = false;
#if TESSERA_CUDA_KERNELS
      if constexpr (cuda_channel_reductions<T, K>) {
        const bool nchw =
            x3.is_contiguous() && g3_in.is_contiguous() && (!relu_after || y3.is_contiguous());
        const bool nhwc = !nchw && channels_last_view(x3) && channels_last_view(g3_in) &&
                          (!relu_after || channels_last_view(y3));
        if (nchw || nhwc) {
          DeviceGuard<cuda> guard(x3.device().index);
          void* partials = ws.take_raw(backend::cuda::channel_partials_bytes(c));
          backend::cuda::batch_norm_gradient_sums(
              g3_in.data(), x3.data(), relu_after ? y3.data() : nullptr, mean.data(), n, c, l,
              sum_g.data(), sum_gx.data(), partials, nhwc);
          done = true;
        }
      }
#endif
      if (!done) {
        channel_sum(g, sum_g, partial);
        channel_sum(g * (x3 - mean3), sum_gx, partial);
      }
    }
    if (db != nullptr) {
      if (db_accumulate) {
        tessera::detail::add_into(*db, tessera::detail::as_node(sum_g));
      } else {
        db->copy_(sum_g);
      }
    }
    if (dw != nullptr) {
      if (dw_accumulate) {
        tessera::detail::add_into(*dw, sum_gx * invstd);
      } else {
        run_expression(*dw, sum_gx * invstd);
      }
    }
    if (dx3 == nullptr) return;
#if TESSERA_CUDA_KERNELS
    if constexpr (cuda_channel_reductions<T, K>) {
      // channels_last tensors: the same kernel over [N * L, C, 1], as batch_norm_apply.
      const bool nchw = x3.is_contiguous() && g3_in.is_contiguous() && dx3->is_contiguous() &&
                        (!relu_after || y3.is_contiguous());
      const bool nhwc = channels_last_view(x3) && channels_last_view(g3_in) &&
                        channels_last_view(*dx3) && (!relu_after || channels_last_view(y3));
      if ((nchw || nhwc) && stats.is_contiguous() && (w == nullptr || w->is_contiguous())) {
        DeviceGuard<cuda> guard(x3.device().index);
        backend::cuda::batch_norm_input_gradient(
            g3_in.data(), x3.data(), relu_after ? y3.data() : nullptr, stats.data(),
            w != nullptr ? w->data() : nullptr, sum_g.data(), sum_gx.data(), batch, dx_accumulate,
            nchw ? n : n * l, c, nchw ? l : 1, dx3->data());
        return;
      }
    }
#endif
    // dx = scale * g - a - (x - mean) * b, scale = invstd * w, a = scale * sum(g) / M,
    // b = scale * invstd^2 * sum(g (x - mean)) / M: one pass, the [1, C, 1] factors computed per
    // element (the same arithmetic as storing them first, without three launches over C).
    auto finish = [&](const auto& scale) {
      if (!batch) {
        if (dx_accumulate) {
          tessera::detail::add_into(*dx3, g * scale);
        } else {
          run_expression(*dx3, g * scale);
        }
        return;
      }
      const double inverse_count = 1.0 / static_cast<double>(n * l);
      const Tensor<T, K> sum_g3 = sum_g.view(Shape{1, c, 1}), sum_gx3 = sum_gx.view(Shape{1, c, 1});
      const auto a = scale * sum_g3 * inverse_count;
      const auto b = scale * invstd3 * invstd3 * sum_gx3 * inverse_count;
      if (dx_accumulate) {
        tessera::detail::add_into(*dx3, g * scale - a - (x3 - mean3) * b);
      } else {
        run_expression(*dx3, g * scale - a - (x3 - mean3) * b);
      }
    };
    if (w != nullptr) {
      finish(invstd3 * w->view(Shape{1, c, 1}));
    } else {
      finish(invstd3);
    }
  };
  if (relu_after) {
    body(where(y3 > 0.0, g3_in, 0.0));
  } else {
    body(tessera::detail::as_node(g3_in));
  }
}

}  // namespace tessera::nn::detail
