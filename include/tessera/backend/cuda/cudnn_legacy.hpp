// cuDNN's legacy convolution API for one call of one problem (backend/cuda/cudnn.hpp chooses and
// runs the calls): the four descriptors of a problem, cuDNN's heuristics (the _v7 queries) and
// timing (cudnnFind*AlgorithmEx) of each direction's algorithms as candidates for the host-side
// choice (cudnn_cache.hpp), and the scratch memory and zero-filled buffers that benchmark mode
// times on, the execution plans' candidates as well as these. The legacy calls themselves run
// only what no kept plan takes (cudnn_plan.hpp). Empty in a build without cuDNN.
#pragma once

#include "tessera/backend/cuda/cudnn_check.hpp"

#if TESSERA_CUDNN
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tessera/backend/cuda/cudnn_cache.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/half.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/memory.hpp"

namespace tessera::backend::cuda::detail {

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

/// cuDNN's math type as the host-side choice (cudnn_cache.hpp) classifies it.
inline conv2d_math cudnn_math_class(cudnnMathType_t math) {
  switch (math) {
    case CUDNN_FMA_MATH:
      return conv2d_math::fma;
    case CUDNN_TENSOR_OP_MATH:
      return conv2d_math::tensor_op;
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return conv2d_math::tensor_op_allow_conversion;
    default:
      return conv2d_math::default_math;
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
    // x, w and y in one layout: NCHW, or NHWC (channels_last) when the problem says so.
    const cudnnTensorFormat_t format = p.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    TESSERA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, format, data, cudnn_int(p.n), cudnn_int(p.c),
                                                   cudnn_int(p.h), cudnn_int(p.w)));
    TESSERA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, format, data, cudnn_int(p.n), cudnn_int(p.o),
                                                   cudnn_int(p.oh), cudnn_int(p.ow)));
    TESSERA_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, data, format, cudnn_int(p.o),
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

/// Device memory from the device's pool for the length of a choice (benchmark mode's scratch),
/// given back on the stream it was used on.
class cudnn_scratch {
 public:
  cudnn_scratch(int device, stream_ref stream, std::size_t bytes)
      : device_{DeviceType::cuda, device}, stream_(stream), bytes_(bytes) {
    data_ = memory::allocate(device_, bytes_, stream_);
  }
  cudnn_scratch(const cudnn_scratch&) = delete;
  cudnn_scratch& operator=(const cudnn_scratch&) = delete;
  ~cudnn_scratch() { memory::deallocate(device_, data_, bytes_, stream_); }
  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  Device device_;
  stream_ref stream_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

/// The input, weight and output buffers benchmark mode times the three calls on: zeros, made on
/// the first timing a choice needs and shared by the problem's three calls.
class cudnn_timing_buffers {
 public:
  cudnn_timing_buffers(int device, stream_ref stream, const conv2d_problem& p,
                       std::size_t element_bytes)
      : device_(device), stream_(stream), p_(p), element_bytes_(element_bytes) {}

  /// x, w, y; throws out_of_memory_error when the pool cannot give them.
  std::tuple<void*, void*, void*> get() {
    if (!x_) {
      auto make = [&](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
        const std::size_t bytes = static_cast<std::size_t>(a * b * c * d) * element_bytes_;
        auto buffer =
            std::make_unique<cudnn_scratch>(device_, stream_, std::max<std::size_t>(bytes, 1));
        TESSERA_CUDA_CHECK(cudaMemsetAsync(buffer->data(), 0, buffer->bytes(), stream_.native()));
        return buffer;
      };
      x_ = make(p_.n, p_.c, p_.h, p_.w);
      w_ = make(p_.o, p_.c / p_.groups, p_.kh, p_.kw);
      y_ = make(p_.n, p_.o, p_.oh, p_.ow);
    }
    return {x_->data(), w_->data(), y_->data()};
  }

 private:
  int device_;
  stream_ref stream_;
  conv2d_problem p_;
  std::size_t element_bytes_;
  std::unique_ptr<cudnn_scratch> x_, w_, y_;
};

/// The cuDNN calls of one direction, so that choosing is written once for the three.
template <conv2d_direction D>
struct cudnn_direction;

template <>
struct cudnn_direction<conv2d_direction::forward> {
  using perf_t = cudnnConvolutionFwdAlgoPerf_t;
  using algo_t = cudnnConvolutionFwdAlgo_t;
  static constexpr int count = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static cudnnStatus_t heuristics(cudnnHandle_t h, const conv2d_descriptors& d, int* returned,
                                  perf_t* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, count, returned, perf);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const conv2d_descriptors& d, algo_t algo,
                                 std::size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, algo, bytes);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const conv2d_descriptors& d, void* x, void* w, void* y,
                            int* returned, perf_t* perf, void* ws, std::size_t bytes) {
    return cudnnFindConvolutionForwardAlgorithmEx(h, d.x, x, d.w, w, d.conv, d.y, y, count,
                                                  returned, perf, ws, bytes);
  }
};

template <>
struct cudnn_direction<conv2d_direction::backward_data> {
  using perf_t = cudnnConvolutionBwdDataAlgoPerf_t;
  using algo_t = cudnnConvolutionBwdDataAlgo_t;
  static constexpr int count = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static cudnnStatus_t heuristics(cudnnHandle_t h, const conv2d_descriptors& d, int* returned,
                                  perf_t* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, count, returned,
                                                       perf);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const conv2d_descriptors& d, algo_t algo,
                                 std::size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, algo, bytes);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const conv2d_descriptors& d, void* x, void* w, void* y,
                            int* returned, perf_t* perf, void* ws, std::size_t bytes) {
    // dx = f(w, dy): the output buffer is x's.
    return cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, w, d.y, y, d.conv, d.x, x, count,
                                                       returned, perf, ws, bytes);
  }
};

template <>
struct cudnn_direction<conv2d_direction::backward_filter> {
  using perf_t = cudnnConvolutionBwdFilterAlgoPerf_t;
  using algo_t = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr int count = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static cudnnStatus_t heuristics(cudnnHandle_t h, const conv2d_descriptors& d, int* returned,
                                  perf_t* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, count, returned,
                                                         perf);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const conv2d_descriptors& d, algo_t algo,
                                 std::size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, algo, bytes);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const conv2d_descriptors& d, void* x, void* w, void* y,
                            int* returned, perf_t* perf, void* ws, std::size_t bytes) {
    // dw = f(x, dy): the output buffer is w's.
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, x, d.y, y, d.conv, d.w, w, count,
                                                         returned, perf, ws, bytes);
  }
};

/// cuDNN's answers as candidates for the host-side choice. Untimed answers (the heuristics) get
/// their workspace asked with their own math type set, as the call will run them.
template <conv2d_direction D>
std::vector<conv2d_candidate> cudnn_candidates(cudnnHandle_t h, const conv2d_descriptors& d,
                                               const typename cudnn_direction<D>::perf_t* perf,
                                               int count, bool timed) {
  using dir = cudnn_direction<D>;
  std::vector<conv2d_candidate> candidates;
  for (int i = 0; i < count; ++i) {
    const auto& r = perf[i];
    conv2d_candidate c;
    c.algorithm = static_cast<int>(r.algo);
    c.math = static_cast<int>(r.mathType);
    c.math_class = cudnn_math_class(r.mathType);
    c.ok = r.status == CUDNN_STATUS_SUCCESS;
    c.deterministic = r.determinism == CUDNN_DETERMINISTIC;
    c.milliseconds = timed ? r.time : -1.0f;
    c.workspace = r.memory;
    if (c.ok && !timed) {
      TESSERA_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, r.mathType));
      std::size_t bytes = 0;
      c.ok = dir::workspace(h, d, r.algo, &bytes) == CUDNN_STATUS_SUCCESS;
      c.workspace = bytes;
    }
    candidates.push_back(c);
  }
  return candidates;
}

/// Times the candidates of direction D (cudnnFind*AlgorithmEx) on `buffers`, with the largest
/// scratch workspace within the limit that the pool can give; empty when the buffers or any
/// scratch cannot be had (the caller then asks the heuristics).
template <conv2d_direction D>
std::vector<conv2d_candidate> cudnn_timed_candidates(cudnnHandle_t h, const conv2d_descriptors& d,
                                                     int device, stream_ref stream,
                                                     cudnn_timing_buffers& buffers,
                                                     std::size_t limit) {
  using dir = cudnn_direction<D>;
  void *x = nullptr, *w = nullptr, *y = nullptr;
  try {
    std::tie(x, w, y) = buffers.get();
  } catch (const out_of_memory_error&) {
    return {};
  }
  std::vector<std::size_t> workspaces;
  for (int a = 0; a < dir::count; ++a) {
    std::size_t bytes = 0;
    if (dir::workspace(h, d, static_cast<typename dir::algo_t>(a), &bytes) ==
        CUDNN_STATUS_SUCCESS) {
      workspaces.push_back(bytes);
    }
  }
  for (const std::size_t size : conv2d_scratch_sizes(workspaces, limit)) {
    std::unique_ptr<cudnn_scratch> scratch;
    if (size > 0) {
      try {
        scratch = std::make_unique<cudnn_scratch>(device, stream, size);
      } catch (const out_of_memory_error&) {
        continue;  // a smaller scratch times fewer algorithms
      }
    }
    typename dir::perf_t perf[dir::count];
    int count = 0;
    TESSERA_CUDNN_CHECK(
        dir::find(h, d, x, w, y, &count, perf, scratch ? scratch->data() : nullptr, size));
    return cudnn_candidates<D>(h, d, perf, count, true);
  }
  return {};
}

}  // namespace tessera::backend::cuda::detail
#endif  // TESSERA_CUDNN
