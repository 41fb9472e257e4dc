// The switches of the GPU libraries, with PyTorch's names and defaults (torch.backends): TF32 for
// cuBLAS's float products and for cuDNN's float convolutions, and cuDNN's use, autotuning,
// determinism and workspace limit. Plain atomics in every build, with no CUDA header, so that g++
// units and CPU-only builds can set them; backend/cuda/gemm.hpp and backend/cuda/cudnn.hpp read
// them.
#pragma once

#include <atomic>
#include <cstddef>

namespace tessera::backends {

namespace cuda::matmul {
/// Float matrix products on CUDA (ts::matmul, Linear, im2col convolutions) may use TF32 tensor
/// cores (torch.backends.cuda.matmul.allow_tf32): inputs rounded to 10-bit mantissas, products
/// summed in float, so a result's relative error grows from about 1e-6 to about 1e-3. Off by
/// default, as PyTorch's since 1.12. Read at each product. Half, bfloat16 and double are not
/// affected.
inline std::atomic<bool> allow_tf32{false};
}  // namespace cuda::matmul

namespace cuda {
/// The lanes that fold one row of a CUDA reduction along rows (sum(x, -1), batch norm's sums of
/// NCHW planes through expressions): a power of two from 1 to 256, or 0 (the default) for the
/// plan's own choice from the rows' count and length. For cuda_bench's sweep of that choice (which
/// width reaches the copy's bandwidth on a given GPU); not in PyTorch. Read at each reduction; any
/// other value makes the reduction throw std::invalid_argument.
inline std::atomic<int> reduction_row_lanes{0};
}  // namespace cuda

namespace cudnn {

/// Convolutions on CUDA devices use cuDNN when the build has it (torch.backends.cudnn.enabled).
/// Read when a convolution is traced or called eagerly: a compiled program keeps what it chose.
inline std::atomic<bool> enabled{true};

/// Float convolutions may use TF32 tensor cores (torch.backends.cudnn.allow_tf32): products of
/// 10-bit mantissas summed in float, about 1e-3 relative error instead of about 1e-6. On by
/// default, as PyTorch's; set it to false for fp32 products. Read when a convolution is traced
/// or called eagerly. Half and bfloat16 always use tensor cores (with float sums); double never.
inline std::atomic<bool> allow_tf32{true};

/// cuDNN's algorithms are timed (torch.backends.cudnn.benchmark): the first time a problem is
/// seen, every candidate runs once on scratch buffers and the fastest whose workspace fits is
/// kept for the process; off, cuDNN's heuristics choose without running anything. Timing takes
/// milliseconds to a second per new problem and synchronises the device, once.
inline std::atomic<bool> benchmark{false};

/// Only algorithms that give the same bits run after run (torch.backends.cudnn.deterministic):
/// some of cuDNN's backward algorithms sum with atomics, in an order that varies.
inline std::atomic<bool> deterministic{false};

/// The most workspace one convolution call may take, in bytes (1 GiB by default). The fastest
/// algorithm whose workspace fits is taken, and a problem with none that fits runs as im2col +
/// cuBLAS. The workspace comes from the device's pool: a program's plan holds it in its scratch,
/// an eager call allocates it for the call.
inline std::atomic<std::size_t> workspace_limit{std::size_t{1} << 30};

/// Convolutions run through cuDNN's legacy calls (cudnnConvolutionForward and its siblings)
/// instead of execution plans of its graph API kept per call (the default, as PyTorch's). The
/// legacy calls finalize a plan inside every call: the same numbers, 5-10x the host time per
/// call. For comparison (cuda_bench's host-cost rows); not in PyTorch. Read when a problem's
/// calls are first chosen (no plan is made for them while it is on) and at every call.
inline std::atomic<bool> legacy_api{false};

}  // namespace cudnn

}  // namespace tessera::backends
