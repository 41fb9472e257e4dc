// cuDNN for convolutions on CUDA devices: PyTorch's torch.backends.cudnn switches (in every
// build), and where the build has cuDNN (TESSERA_CUDNN, defined by CMake when it finds cuDNN
// beside the toolkit) the algorithm choice per problem, handles per thread, device and stream,
// and the three calls of a convolution's forward and backward. Without cuDNN, or when it cannot
// take a problem, convolutions on CUDA run as im2col + cuBLAS (nn/detail/conv2d.hpp).
//
// The legacy convolution API (cudnnConvolutionForward and the _v7 heuristics) is used: cuDNN 9
// marks it deprecated but supports it, and it is what PyTorch's default (non-benchmark) path
// runs. The algorithm is chosen by cuDNN's heuristics, never by timing (no `benchmark` switch).
#pragma once

#include <atomic>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/half.hpp"
#include "tessera/core/stream.hpp"

#ifndef TESSERA_CUDNN
#define TESSERA_CUDNN 0
#endif
#if TESSERA_CUDNN && !TESSERA_CUDA
#error "TESSERA_CUDNN needs the CUDA runtime (TESSERA_CUDA)"
#endif

#if TESSERA_CUDNN
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#endif

namespace tessera::backends::cudnn {

/// Convolutions on CUDA devices use cuDNN when the build has it (torch.backends.cudnn.enabled).
/// Read when a convolution is traced or called eagerly: a compiled program keeps what it chose.
inline std::atomic<bool> enabled{true};

/// Float convolutions may use TF32 tensor cores (products of 10-bit mantissas, sums in float).
/// Off by default, unlike PyTorch's switch of the same name: Tessera's float convolutions, like
/// its matmul, compute fp32 products unless asked otherwise. Half and bfloat16 always use
/// tensor cores (with float sums); double never does.
inline std::atomic<bool> allow_tf32{false};

/// Only algorithms that give the same bits run after run (torch.backends.cudnn.deterministic):
/// some of cuDNN's backward algorithms sum with atomics, in an order that varies.
inline std::atomic<bool> deterministic{false};

/// The most workspace one convolution call may take, in bytes (1 GiB by default). cuDNN's
/// heuristics rank algorithms by speed; the fastest whose workspace fits is taken, and a problem
/// with none that fits runs as im2col + cuBLAS. The workspace comes from the device's pool: a
/// program's plan holds it in its scratch, an eager call allocates it for the call.
inline std::atomic<std::size_t> workspace_limit{std::size_t{1} << 30};

/// True in a build with cuDNN (torch.backends.cudnn.is_available()).
constexpr bool is_available() noexcept { return TESSERA_CUDNN != 0; }

/// The cuDNN library's version as cudnnGetVersion() reports it (91900 for 9.19.0); 0 without
/// cuDNN.
inline std::int64_t version() noexcept {
#if TESSERA_CUDNN
  return static_cast<std::int64_t>(cudnnGetVersion());
#else
  return 0;
#endif
}

}  // namespace tessera::backends::cudnn

#if TESSERA_CUDNN
namespace tessera::detail {
[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file,
                                           int line) {
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  throw cuda_error(std::string(call) + " failed: " + cudnnGetErrorString(status) + " (" +
                       std::to_string(static_cast<int>(status)) + ")" +
                       (detail[0] != '\0' ? std::string(": ") + detail : std::string()) + " at " +
                       file + ":" + std::to_string(line),
                   static_cast<int>(status));
}
}  // namespace tessera::detail

/// Checks a cuDNN call; throws tessera::cuda_error naming the call, the status and cuDNN's
/// message for it.
#define TESSERA_CUDNN_CHECK(call)                                                             \
  do {                                                                                        \
    cudnnStatus_t tessera_cudnn_status_ = (call);                                             \
    if (tessera_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                      \
      ::tessera::detail::throw_cudnn_error(tessera_cudnn_status_, #call, __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)
#endif

namespace tessera::backend::cuda {

/// One convolution's sizes, NCHW, as torch.nn.functional.conv2d takes them: input [n, c, h, w],
/// weight [o, c / groups, kh, kw], output [n, o, oh, ow].
struct conv2d_problem {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::int64_t o = 0, kh = 0, kw = 0;
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  std::int64_t oh = 0, ow = 0;
  auto operator<=>(const conv2d_problem&) const = default;
};

/// What cuDNN runs for one problem on one device: an algorithm and a math type for each of the
/// three calls, and the workspace bytes of each. Chosen once (conv2d_choose) and kept by the
/// caller, so that a program runs what its memory plan was made for.
struct conv2d_algorithms {
  /// False: no cuDNN in this build, `enabled` off, a dtype or sizes cuDNN does not take here, or
  /// no algorithm within `workspace_limit`; the caller runs im2col + cuBLAS instead.
  bool usable = false;
  int forward = 0, backward_data = 0, backward_filter = 0;  // cudnnConvolution*Algo_t
  int forward_math = 0, backward_data_math = 0, backward_filter_math = 0;  // cudnnMathType_t
  std::size_t forward_bytes = 0, backward_data_bytes = 0, backward_filter_bytes = 0;
};

/// The dtypes Tessera convolves with cuDNN: float and double, and half and bfloat16 with float
/// sums.
template <class T>
inline constexpr bool conv2d_cudnn_supports =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, half> ||
    std::is_same_v<T, bfloat16>;

/// True when cuDNN's 32-bit sizes hold the problem: every extent, and the element count of the
/// input, weight and output, at most INT_MAX (larger tensors run as im2col + cuBLAS, whose
/// indexing is 64-bit).
inline bool conv2d_fits_cudnn(const conv2d_problem& p) {
  constexpr std::int64_t most = 2147483647;
  const std::int64_t extents[] = {p.n,  p.c,  p.h,  p.w,  p.o,  p.kh,     p.kw, p.sh,
                                  p.sw, p.ph, p.pw, p.dh, p.dw, p.groups, p.oh, p.ow};
  for (const std::int64_t e : extents) {
    if (e < 0 || e > most) return false;
  }
  auto count_fits = [&](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
    std::int64_t product = 1;
    for (const std::int64_t e : {a, b, c, d}) {
      if (e != 0 && product > most / e) return false;
      product *= e;
    }
    return true;
  };
  return count_fits(p.n, p.c, p.h, p.w) && count_fits(p.n, p.o, p.oh, p.ow) &&
         count_fits(p.o, p.groups > 0 ? p.c / p.groups : 0, p.kh, p.kw);
}

#if TESSERA_CUDNN
namespace detail {

template <class T>
constexpr cudnnDataType_t cudnn_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDNN_DATA_FLOAT;
  if constexpr (std::is_same_v<T, double>) return CUDNN_DATA_DOUBLE;
  if constexpr (std::is_same_v<T, half>) return CUDNN_DATA_HALF;
  if constexpr (std::is_same_v<T, bfloat16>) return CUDNN_DATA_BFLOAT16;
}

/// Sums in double for double, in float otherwise.
template <class T>
constexpr cudnnDataType_t cudnn_compute_type() {
  return std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

/// The math type asked for when choosing: no tensor cores for double, FMA only for float unless
/// TF32 is allowed (cuDNN's default math may use TF32 on Ampere and later), tensor cores for
/// half and bfloat16.
template <class T>
cudnnMathType_t cudnn_requested_math(bool allow_tf32) {
  if constexpr (std::is_same_v<T, float>) return allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  if constexpr (std::is_same_v<T, double>) return CUDNN_DEFAULT_MATH;
  return CUDNN_TENSOR_OP_MATH;
}

/// Whether an algorithm's math type keeps T's precision: never a down-conversion of float
/// inputs, and for float without allow_tf32 plain FMA only.
template <class T>
bool cudnn_math_keeps_precision(cudnnMathType_t math, bool allow_tf32) {
  if constexpr (std::is_same_v<T, float>) {
    if (math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
    return allow_tf32 || math == CUDNN_FMA_MATH;
  } else {
    return true;
  }
}

inline int cudnn_int(std::int64_t value) { return static_cast<int>(value); }  // conv2d_fits_cudnn

/// The four descriptors of one problem (input, weight, output, convolution), destroyed with it.
class conv2d_descriptors {
 public:
  conv2d_descriptors(const conv2d_problem& p, cudnnDataType_t data, cudnnDataType_t compute,
                     cudnnMathType_t math) {
    TESSERA_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    TESSERA_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    TESSERA_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    TESSERA_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    TESSERA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, data, cudnn_int(p.n),
                                                   cudnn_int(p.c), cudnn_int(p.h), cudnn_int(p.w)));
    TESSERA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, data, cudnn_int(p.n),
                                                   cudnn_int(p.o), cudnn_int(p.oh),
                                                   cudnn_int(p.ow)));
    TESSERA_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, data, CUDNN_TENSOR_NCHW, cudnn_int(p.o),
                                                   cudnn_int(p.c / p.groups), cudnn_int(p.kh),
                                                   cudnn_int(p.kw)));
    TESSERA_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv, cudnn_int(p.ph), cudnn_int(p.pw), cudnn_int(p.sh), cudnn_int(p.sw), cudnn_int(p.dh),
        cudnn_int(p.dw), CUDNN_CROSS_CORRELATION, compute));
    TESSERA_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, cudnn_int(p.groups)));
    TESSERA_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math));
  }
  conv2d_descriptors(const conv2d_descriptors&) = delete;
  conv2d_descriptors& operator=(const conv2d_descriptors&) = delete;
  ~conv2d_descriptors() {
    // Destroying a descriptor only frees host memory; a failure here is not actionable.
    if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
    if (w != nullptr) cudnnDestroyFilterDescriptor(w);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
  }

  /// The output shape cuDNN derives from the input, weight and convolution descriptors.
  std::tuple<int, int, int, int> output_dims() const {
    int n = 0, c = 0, h = 0, w_out = 0;
    TESSERA_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &n, &c, &h, &w_out));
    return {n, c, h, w_out};
  }

  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

/// cuDNN handles per (thread, device, stream), as the cuBLAS handles (gemm.hpp): one handle is
/// never used by two threads at once, and is bound to one stream. Created on first use with the
/// device current, never destroyed (the CUDA runtime may be gone at exit).
class cudnn_handles {
 public:
  /// Calls fn(handle) with the calling thread's handle for `device` and `stream`, the device
  /// current.
  template <class Fn>
  static void with_handle(int device, stream_ref stream, Fn&& fn) {
    check_device(Device{DeviceType::cuda, device});
    DeviceGuard<::tessera::cuda> guard(device);
    thread_local std::map<std::pair<int, void*>, cudnnHandle_t> handles;
    cudnnHandle_t& handle = handles[{device, stream.handle}];
    if (handle == nullptr) {
      cudnnHandle_t created = nullptr;
      TESSERA_CUDNN_CHECK(cudnnCreate(&created));
      TESSERA_CUDNN_CHECK(cudnnSetStream(created, stream.native()));
      handle = created;
    }
    fn(handle);
  }
};

/// The device's current stream for the calling thread: where the convolution's neighbours (the
/// executor's kernels, cuBLAS) run.
inline stream_ref cudnn_stream(int device) {
  return ::tessera::current_stream(Device{DeviceType::cuda, device}).ref();
}

/// The first of cuDNN's ranked candidates that succeeded, keeps T's precision, is deterministic
/// if asked, and whose workspace (asked again with its math type set) fits `limit`: its
/// algorithm, math type and bytes, or false.
template <class T, class Perf, class WorkspaceOf>
bool cudnn_pick(const Perf* candidates, int count, std::size_t limit, bool allow_tf32,
                bool only_deterministic, cudnnConvolutionDescriptor_t conv,
                WorkspaceOf&& workspace_of, int& algorithm, int& math, std::size_t& bytes) {
  for (int i = 0; i < count; ++i) {
    const Perf& c = candidates[i];
    if (c.status != CUDNN_STATUS_SUCCESS) continue;
    if (only_deterministic && c.determinism != CUDNN_DETERMINISTIC) continue;
    if (!cudnn_math_keeps_precision<T>(c.mathType, allow_tf32)) continue;
    TESSERA_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, c.mathType));
    std::size_t needed = 0;
    if (workspace_of(c.algo, needed) != CUDNN_STATUS_SUCCESS || needed > limit) continue;
    algorithm = static_cast<int>(c.algo);
    math = static_cast<int>(c.mathType);
    bytes = needed;
    return true;
  }
  return false;
}

/// Asks cuDNN's heuristics for the three calls of problem p (conv2d_choose's uncached work).
template <class T>
conv2d_algorithms cudnn_choose(cudnnHandle_t handle, const conv2d_problem& p, bool allow_tf32,
                               bool only_deterministic, std::size_t limit) {
  conv2d_descriptors d(p, cudnn_data_type<T>(), cudnn_compute_type<T>(),
                       cudnn_requested_math<T>(allow_tf32));
  const auto [n, o, oh, ow] = d.output_dims();
  if (n != p.n || o != p.o || oh != p.oh || ow != p.ow) {
    throw error("conv2d: internal error: cuDNN's output [" + std::to_string(n) + ", " +
                std::to_string(o) + ", " + std::to_string(oh) + ", " + std::to_string(ow) +
                "] differs from Tessera's [" + std::to_string(p.n) + ", " + std::to_string(p.o) +
                ", " + std::to_string(p.oh) + ", " + std::to_string(p.ow) + "]");
  }
  conv2d_algorithms a;
  const cudnnMathType_t requested = cudnn_requested_math<T>(allow_tf32);
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    TESSERA_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        handle, d.x, d.w, d.conv, d.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
    auto workspace_of = [&](cudnnConvolutionFwdAlgo_t algo, std::size_t& bytes) {
      return cudnnGetConvolutionForwardWorkspaceSize(handle, d.x, d.w, d.conv, d.y, algo, &bytes);
    };
    if (!cudnn_pick<T>(perf, count, limit, allow_tf32, only_deterministic, d.conv, workspace_of,
                       a.forward, a.forward_math, a.forward_bytes)) {
      return {};
    }
  }
  TESSERA_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, requested));
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    TESSERA_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, d.w, d.y, d.conv, d.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf));
    auto workspace_of = [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t& bytes) {
      return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.w, d.y, d.conv, d.x, algo,
                                                          &bytes);
    };
    if (!cudnn_pick<T>(perf, count, limit, allow_tf32, only_deterministic, d.conv, workspace_of,
                       a.backward_data, a.backward_data_math, a.backward_data_bytes)) {
      return {};
    }
  }
  TESSERA_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, requested));
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    TESSERA_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle, d.x, d.y, d.conv, d.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
    auto workspace_of = [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t& bytes) {
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, d.x, d.y, d.conv, d.w, algo,
                                                            &bytes);
    };
    if (!cudnn_pick<T>(perf, count, limit, allow_tf32, only_deterministic, d.conv, workspace_of,
                       a.backward_filter, a.backward_filter_math, a.backward_filter_bytes)) {
      return {};
    }
  }
  a.usable = true;
  return a;
}

/// alpha and beta in the compute type's precision (double for double data, float otherwise).
template <class T>
using cudnn_scale_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

}  // namespace detail
#endif

/// The algorithms cuDNN runs for problem p of dtype T on CUDA device `device`, under the current
/// switches (backends::cudnn). Chosen by cuDNN's heuristics the first time a (device, dtype,
/// problem, switches) is seen and remembered for the process (a lock guards the table: threads
/// driving devices choose at once). Unusable (`usable` false) where cuDNN does not take the
/// problem. Throws cuda_error when cuDNN itself fails.
template <class T>
conv2d_algorithms conv2d_choose(int device, const conv2d_problem& p) {
#if TESSERA_CUDNN
  if constexpr (conv2d_cudnn_supports<T>) {
    if (!backends::cudnn::enabled.load() || !conv2d_fits_cudnn(p) || p.n == 0 || p.c == 0 ||
        p.o == 0) {
      return {};
    }
    const bool tf32 = backends::cudnn::allow_tf32.load();
    const bool only_deterministic = backends::cudnn::deterministic.load();
    const std::size_t limit = backends::cudnn::workspace_limit.load();
    using key_t = std::tuple<int, int, conv2d_problem, bool, bool, std::size_t>;
    static std::mutex mutex;
    static std::map<key_t, conv2d_algorithms> chosen;
    const key_t key{
        device, static_cast<int>(detail::cudnn_data_type<T>()), p, tf32, only_deterministic, limit};
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = chosen.find(key); it != chosen.end()) return it->second;
    conv2d_algorithms a;
    detail::cudnn_handles::with_handle(device, detail::cudnn_stream(device), [&](cudnnHandle_t h) {
      a = detail::cudnn_choose<T>(h, p, tf32, only_deterministic, limit);
    });
    chosen.emplace(key, a);
    return a;
  }
#endif
  (void)device, (void)p;
  return {};
}

#if TESSERA_CUDNN
/// y = conv2d(x, w) with the chosen forward algorithm, on the device's current stream; x, w, y
/// contiguous NCHW on `device`, `workspace` at least a.forward_bytes.
template <class T>
void conv2d_forward(int device, const conv2d_problem& p, const conv2d_algorithms& a, const T* x,
                    const T* w, T* y, void* workspace) {
  detail::cudnn_handles::with_handle(device, detail::cudnn_stream(device), [&](cudnnHandle_t h) {
    detail::conv2d_descriptors d(p, detail::cudnn_data_type<T>(), detail::cudnn_compute_type<T>(),
                                 static_cast<cudnnMathType_t>(a.forward_math));
    const detail::cudnn_scale_t<T> alpha = 1, beta = 0;
    TESSERA_CUDNN_CHECK(cudnnConvolutionForward(h, &alpha, d.x, x, d.w, w, d.conv,
                                                static_cast<cudnnConvolutionFwdAlgo_t>(a.forward),
                                                workspace, a.forward_bytes, &beta, d.y, y));
  });
}

/// dx = (or, with `accumulate`, dx +=) the input gradient of y = conv2d(x, w) for gy.
template <class T>
void conv2d_backward_data(int device, const conv2d_problem& p, const conv2d_algorithms& a,
                          const T* gy, const T* w, T* dx, bool accumulate, void* workspace) {
  detail::cudnn_handles::with_handle(device, detail::cudnn_stream(device), [&](cudnnHandle_t h) {
    detail::conv2d_descriptors d(p, detail::cudnn_data_type<T>(), detail::cudnn_compute_type<T>(),
                                 static_cast<cudnnMathType_t>(a.backward_data_math));
    const detail::cudnn_scale_t<T> alpha = 1, beta = accumulate ? 1 : 0;
    TESSERA_CUDNN_CHECK(
        cudnnConvolutionBackwardData(h, &alpha, d.w, w, d.y, gy, d.conv,
                                     static_cast<cudnnConvolutionBwdDataAlgo_t>(a.backward_data),
                                     workspace, a.backward_data_bytes, &beta, d.x, dx));
  });
}

/// dw = (or, with `accumulate`, dw +=) the weight gradient of y = conv2d(x, w) for gy.
template <class T>
void conv2d_backward_filter(int device, const conv2d_problem& p, const conv2d_algorithms& a,
                            const T* x, const T* gy, T* dw, bool accumulate, void* workspace) {
  detail::cudnn_handles::with_handle(device, detail::cudnn_stream(device), [&](cudnnHandle_t h) {
    detail::conv2d_descriptors d(p, detail::cudnn_data_type<T>(), detail::cudnn_compute_type<T>(),
                                 static_cast<cudnnMathType_t>(a.backward_filter_math));
    const detail::cudnn_scale_t<T> alpha = 1, beta = accumulate ? 1 : 0;
    TESSERA_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        h, &alpha, d.x, x, d.y, gy, d.conv,
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.backward_filter), workspace,
        a.backward_filter_bytes, &beta, d.w, dw));
  });
}
#endif

}  // namespace tessera::backend::cuda
