// CUDA matrix products through cuBLAS (cublasGemmEx, cublasGemmStridedBatchedEx), with one
// handle per device and every call checked by TESSERA_CUBLAS_CHECK. cuBLAS is a host library, so
// this works from g++ translation units too; without CUDA (TESSERA_CUDA 0) gemm throws.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/backend/backends.hpp"
#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/half.hpp"
#include "tessera/core/stream.hpp"

#if TESSERA_CUDA
#include <cublas_v2.h>

#include <climits>
#include <map>
#include <memory>
#include <utility>

namespace tessera::detail {
[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  throw cuda_error(std::string(call) + " failed: " + cublasGetStatusName(status) + " (" +
                       std::to_string(static_cast<int>(status)) + "): " +
                       cublasGetStatusString(status) + " at " + file + ":" + std::to_string(line),
                   static_cast<int>(status));
}
}  // namespace tessera::detail

/// Checks a cuBLAS call; throws tessera::cuda_error naming the call, the status and its text.
#define TESSERA_CUBLAS_CHECK(call)                                                              \
  do {                                                                                          \
    cublasStatus_t tessera_cublas_status_ = (call);                                             \
    if (tessera_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                      \
      ::tessera::detail::throw_cublas_error(tessera_cublas_status_, #call, __FILE__, __LINE__); \
    }                                                                                           \
  } while (0)
#endif

namespace tessera::backend::cuda {

/// True for the dtypes cuBLAS multiplies here: float, double, half, bfloat16 (the integer GEMMs
/// of cuBLAS need int8 inputs with int32 outputs and aligned sizes, which matmul's same-dtype
/// contract does not give).
template <class T>
inline constexpr bool gemm_supports = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                      std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

#if TESSERA_CUDA
namespace detail {

/// cuBLAS handles per (thread, device, stream), as PyTorch keeps them per thread and device with
/// a workspace per stream: a handle's internal workspace is then only ever used by work queued on
/// one stream, so kernels of two streams never share it, and no lock is taken. Created on first
/// use with their device current, and never destroyed: static and thread-exit destructors may run
/// after the CUDA runtime has shut down, where cublasDestroy would fail (PyTorch leaks them for the
/// same reason). A thread that uses many short-lived streams keeps a handle for each.
class cublas_handles {
 public:
  /// Calls fn(handle) with the calling thread's handle for `device` and `stream`, with the device
  /// current.
  template <class Fn>
  static void with_handle(int device, stream_ref stream, Fn&& fn) {
    check_device(Device{DeviceType::cuda, device});
    DeviceGuard<::tessera::cuda> guard(device);
    thread_local std::map<std::pair<int, void*>, cublasHandle_t> handles;
    cublasHandle_t& handle = handles[{device, stream.handle}];
    if (handle == nullptr) {
      cublasHandle_t created = nullptr;
      TESSERA_CUBLAS_CHECK(cublasCreate(&created));
      TESSERA_CUBLAS_CHECK(cublasSetStream(created, stream.native()));  // resets the workspace
      // A workspace of its own, set once (PyTorch's sizes: 32 MiB from Hopper on, else 8 MiB):
      // without one cuBLAS allocates its own, inside a CUDA graph capture with
      // cudaMallocAsync, and may choose other kernels there than in the plain program. Made
      // with cudaMalloc and never freed, as the handle (outside the pool's statistics, as
      // cuBLAS's own was).
      void* workspace = nullptr;
      try {
        int major = 0;
        TESSERA_CUDA_CHECK(
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        const std::size_t bytes = std::size_t{major >= 9 ? 32u : 8u} << 20;
        TESSERA_CUDA_CHECK(cudaMalloc(&workspace, bytes));
        TESSERA_CUBLAS_CHECK(cublasSetWorkspace(created, workspace, bytes));
      } catch (...) {  // out of memory: no handle is kept, the next call tries again
        if (workspace != nullptr) (void)cudaFree(workspace);
        (void)cublasDestroy(created);
        throw;
      }
      handle = created;
    }
    fn(handle);
  }
};

template <class T>
constexpr cudaDataType_t cuda_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  if constexpr (std::is_same_v<T, half>) return CUDA_R_16F;
  if constexpr (std::is_same_v<T, bfloat16>) return CUDA_R_16BF;
}

inline int to_cublas_int(std::int64_t value, const char* what) {
  if (value < 0 || value > INT_MAX) {
    throw shape_error(std::string("matmul: ") + what + " " + std::to_string(value) +
                      " exceeds cuBLAS's int range");
  }
  return static_cast<int>(value);
}

}  // namespace detail
#endif

/// C[e] = op(A[e]) x op(B[e]) for e in [0, batch), row-major as tensors are: op(A) is [m, k] and
/// op(B) [k, n]; an operand that is `trans`posed is stored column-major (its rows are its
/// columns), with leading dimension lda / ldb. C is row-major [m, n] with leading dimension ldc.
/// Batch strides may be 0 (one matrix shared by the batch). Sums run in fp32 for float, half and
/// bfloat16 (CUBLAS_COMPUTE_32F) and in fp64 for double; float products are plain fp32 unless
/// backends::cuda::matmul::allow_tf32 is on (read at each call; off by default, as PyTorch's),
/// which lets cuBLAS use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32). Runs on
/// `stream` of device `device` (enqueued; the caller synchronises as usual). Throws dtype_error
/// for other dtypes, shape_error for sizes beyond cuBLAS's int, cuda_error for cuBLAS failures,
/// and device_error in a build without CUDA.
template <class T>
void gemm(int device, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
          const T* a, bool a_trans, std::int64_t lda, std::int64_t a_batch_stride, const T* b,
          bool b_trans, std::int64_t ldb, std::int64_t b_batch_stride, T* c, std::int64_t ldc,
          std::int64_t c_batch_stride, stream_ref stream = tessera::detail::current_cuda_stream(),
          bool accumulate = false) {
  if constexpr (!gemm_supports<T>) {
    throw dtype_error(std::string("matmul: cuBLAS has no ") + dtype_name<T>() +
                      " GEMM here (float32, float64, float16 and bfloat16 only); multiply on the "
                      "CPU or convert with .to<float>()");
  } else {
#if TESSERA_CUDA
    if (batch <= 0 || m <= 0 || n <= 0) return;
    const int im = detail::to_cublas_int(m, "m"), in = detail::to_cublas_int(n, "n"),
              ik = detail::to_cublas_int(k, "k"), ilda = detail::to_cublas_int(lda, "lda"),
              ildb = detail::to_cublas_int(ldb, "ldb"), ildc = detail::to_cublas_int(ldc, "ldc"),
              ibatch = detail::to_cublas_int(batch, "batch");
    // cuBLAS is column-major: a row-major [r, c] matrix is its column-major transpose. So
    // row-major C = A x B is column-major C^T = B^T x A^T: pass B first, then A, with n and m
    // swapped. A row-major (untransposed) operand is then read as is (N); a transposed view,
    // column-major in memory, needs T.
    const cublasOperation_t op_b = b_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    constexpr cudaDataType_t type = detail::cuda_data_type<T>();
    constexpr bool is_double = std::is_same_v<T, double>;
    // TF32 for float only: half and bfloat16 run on tensor cores anyway, double never does.
    const cublasComputeType_t compute =
        is_double ? CUBLAS_COMPUTE_64F
        : std::is_same_v<T, float> &&
                backends::cuda::matmul::allow_tf32.load(std::memory_order_relaxed)
            ? CUBLAS_COMPUTE_32F_FAST_TF32
            : CUBLAS_COMPUTE_32F;
    // alpha and beta have the compute type's precision (host pointers: the default mode).
    using scale_t = std::conditional_t<is_double, double, float>;
    // accumulate: beta = 1, C += A B (gradients accumulating into a buffer).
    const scale_t alpha = 1, beta = accumulate ? 1 : 0;
    detail::cublas_handles::with_handle(device, stream, [&](cublasHandle_t handle) {
      if (batch == 1) {
        TESSERA_CUBLAS_CHECK(cublasGemmEx(handle, op_b, op_a, in, im, ik, &alpha, b, type, ildb, a,
                                          type, ilda, &beta, c, type, ildc, compute,
                                          CUBLAS_GEMM_DEFAULT));
      } else {
        TESSERA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            handle, op_b, op_a, in, im, ik, &alpha, b, type, ildb, b_batch_stride, a, type, ilda,
            a_batch_stride, &beta, c, type, ildc, c_batch_stride, ibatch, compute,
            CUBLAS_GEMM_DEFAULT));
      }
    });
#else
    (void)device, (void)batch, (void)m, (void)n, (void)k, (void)a, (void)a_trans, (void)lda;
    (void)a_batch_stride, (void)b, (void)b_trans, (void)ldb, (void)b_batch_stride, (void)c;
    (void)ldc, (void)c_batch_stride, (void)stream, (void)accumulate;
    throw device_error("matmul: this build has no CUDA support (configure with TESSERA_WITH_CUDA)");
#endif
  }
}

}  // namespace tessera::backend::cuda
