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
#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
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
  /// A handle and the workspace it was given (which cuBLASLt calls on the same stream share:
  /// the stream orders them).
  struct entry {
    cublasHandle_t handle = nullptr;
    void* workspace = nullptr;
    std::size_t workspace_bytes = 0;
  };

  /// Calls fn(handle) with the calling thread's handle for `device` and `stream`, with the device
  /// current.
  template <class Fn>
  static void with_handle(int device, stream_ref stream, Fn&& fn) {
    with_entry(device, stream, [&](const entry& e) { fn(e.handle); });
  }

  /// Calls fn(entry) with the calling thread's handle for `device` and `stream` and its workspace,
  /// with the device current.
  template <class Fn>
  static void with_entry(int device, stream_ref stream, Fn&& fn) {
    check_device(Device{DeviceType::cuda, device});
    DeviceGuard<::tessera::cuda> guard(device);
    thread_local std::map<std::pair<int, void*>, entry> handles;
    entry& slot = handles[{device, stream.handle}];
    cublasHandle_t& handle = slot.handle;
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
      std::size_t bytes = 0;
      try {
        int major = 0;
        TESSERA_CUDA_CHECK(
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        bytes = std::size_t{major >= 9 ? 32u : 8u} << 20;
        TESSERA_CUDA_CHECK(cudaMalloc(&workspace, bytes));
        TESSERA_CUBLAS_CHECK(cublasSetWorkspace(created, workspace, bytes));
      } catch (...) {  // out of memory: no handle is kept, the next call tries again
        if (workspace != nullptr) (void)cudaFree(workspace);
        (void)cublasDestroy(created);
        throw;
      }
      handle = created;
      slot.workspace = workspace;
      slot.workspace_bytes = bytes;
    }
    fn(static_cast<const entry&>(slot));
  }
};

/// The calling thread's cuBLASLt handle for `device` (created on first use, never destroyed, as
/// the cuBLAS handles).
inline cublasLtHandle_t cublaslt_handle(int device) {
  thread_local std::map<int, cublasLtHandle_t> handles;
  cublasLtHandle_t& handle = handles[device];
  if (handle == nullptr) TESSERA_CUBLAS_CHECK(cublasLtCreate(&handle));
  return handle;
}

/// A cuBLASLt matmul with a bias (and ReLU) epilogue, described once per problem: its operation
/// and layouts, and the algorithm the heuristic chose (none: `found` false, cuBLASLt declined).
struct lt_bias_plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, result = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;

  lt_bias_plan() = default;
  lt_bias_plan(const lt_bias_plan&) = delete;
  lt_bias_plan& operator=(const lt_bias_plan&) = delete;
  ~lt_bias_plan() {  // host objects: destroying them needs no device
    if (result != nullptr) (void)cublasLtMatrixLayoutDestroy(result);
    if (second != nullptr) (void)cublasLtMatrixLayoutDestroy(second);
    if (first != nullptr) (void)cublasLtMatrixLayoutDestroy(first);
    if (operation != nullptr) (void)cublasLtMatmulDescDestroy(operation);
  }
};

/// The largest power of two (up to 256) that divides the address: the alignment cuBLASLt's
/// heuristic is told, as its kernels may assume it.
inline std::uint32_t pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t alignment = 1;
  while (alignment < 256 && address % (alignment * 2) == 0) alignment *= 2;
  return alignment;
}

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

/// C = op(A) x op(B) + bias, then ReLU when `relu`, for one row-major [m, n] C (leading
/// dimension ldc) and a bias of n elements added to every row: one cuBLASLt call with its BIAS or
/// RELU_BIAS epilogue (PyTorch's addmm path for Linear), operands as gemm() reads them, sums in
/// fp32 (TF32 for float under backends::cuda::matmul::allow_tf32, as gemm). The operation, its
/// layouts and the heuristic's algorithm are kept per problem and per thread (the pointers'
/// alignments are part of the problem), so a repeated call costs one cublasLtMatmul. Uses the
/// workspace of the stream's cuBLAS handle. Returns false, having queued nothing, when cuBLASLt
/// declines the problem (no algorithm for it, a description it refuses: the caller multiplies and
/// adds as usual); throws cuda_error when a call it took fails, and device_error in a build
/// without CUDA. float, half, bfloat16.
template <class T>
bool gemm_bias(int device, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, bool a_trans,
               std::int64_t lda, const T* b, bool b_trans, std::int64_t ldb, const T* bias,
               bool relu, T* c, std::int64_t ldc,
               stream_ref stream = tessera::detail::current_cuda_stream()) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                "gemm_bias: float, half and bfloat16 only");
#if TESSERA_CUDA
  if (m <= 0 || n <= 0 || k <= 0) return false;
  // The same size limits as gemm()'s (cuBLAS's int), so both paths take the same products.
  (void)detail::to_cublas_int(m, "m"), (void)detail::to_cublas_int(n, "n");
  (void)detail::to_cublas_int(k, "k");
  constexpr cudaDataType_t type = detail::cuda_data_type<T>();
  const cublasComputeType_t compute =
      std::is_same_v<T, float> && backends::cuda::matmul::allow_tf32.load(std::memory_order_relaxed)
          ? CUBLAS_COMPUTE_32F_FAST_TF32
          : CUBLAS_COMPUTE_32F;
  const std::uint32_t align_a = detail::pointer_alignment(a),
                      align_b = detail::pointer_alignment(b),
                      align_c = detail::pointer_alignment(c),
                      align_bias = detail::pointer_alignment(bias);
  bool done = false;
  detail::cublas_handles::with_entry(device, stream, [&](const detail::cublas_handles::entry& e) {
    // Column-major, as gemm(): row-major C = A B is C^T = B^T A^T, so cuBLASLt's first operand is
    // B and its second A, its "rows" n and "columns" m; the bias then runs along its rows (one
    // value per row of C^T, a column of C), which is what its BIAS epilogue adds.
    const std::array<std::int64_t, 16> key{device,
                                           static_cast<std::int64_t>(type),
                                           static_cast<std::int64_t>(compute),
                                           m,
                                           n,
                                           k,
                                           a_trans,
                                           lda,
                                           b_trans,
                                           ldb,
                                           ldc,
                                           relu,
                                           align_a,
                                           align_b,
                                           align_c,
                                           align_bias};
    thread_local std::map<std::array<std::int64_t, 16>, std::unique_ptr<detail::lt_bias_plan>>
        plans;
    cublasLtHandle_t lt = detail::cublaslt_handle(device);
    auto& slot = plans[key];
    if (slot == nullptr) {
      // Any status but success while describing the problem or asking the heuristic is cuBLASLt
      // declining it (no algorithm for a size, alignment or epilogue; a description it refuses),
      // kept as the answer: the caller's usual path runs, and the CUDA tests, which require the
      // epilogue on sizes cuBLASLt takes, say so.
      auto plan = std::make_unique<detail::lt_bias_plan>();
      cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
      auto step = [&](cublasStatus_t result) {
        if (status == CUBLAS_STATUS_SUCCESS) status = result;
      };
      const cublasOperation_t op_first = b_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t op_second = a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasLtEpilogue_t epilogue =
          relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
      const std::int32_t bias_type = type;
      // The heuristic reads the bias pointer's alignment from the pointer itself.
      const void* bias_pointer = bias;
      step(cublasLtMatmulDescCreate(&plan->operation, compute, CUDA_R_32F));
      if (status == CUBLAS_STATUS_SUCCESS) {
        step(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                            sizeof(op_first)));
        step(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB,
                                            &op_second, sizeof(op_second)));
        step(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                            &epilogue, sizeof(epilogue)));
        step(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                            &bias_type, sizeof(bias_type)));
        step(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                            &bias_pointer, sizeof(bias_pointer)));
      }
      // Stored (not transposed) shapes: B is [n, k] column-major read N, or [k, n] read T.
      step(cublasLtMatrixLayoutCreate(&plan->first, type, b_trans ? k : n, b_trans ? n : k, ldb));
      step(cublasLtMatrixLayoutCreate(&plan->second, type, a_trans ? m : k, a_trans ? k : m, lda));
      step(cublasLtMatrixLayoutCreate(&plan->result, type, n, m, ldc));
      cublasLtMatmulPreference_t preference = nullptr;
      step(cublasLtMatmulPreferenceCreate(&preference));
      cublasLtMatmulHeuristicResult_t heuristic{};
      int returned = 0;
      if (status == CUBLAS_STATUS_SUCCESS) {
        const std::uint64_t workspace = e.workspace_bytes;
        const std::uint32_t alignments[4] = {align_b, align_a, align_c, align_c};
        const cublasLtMatmulPreferenceAttributes_t which[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        step(cublasLtMatmulPreferenceSetAttribute(
            preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
        for (int i = 0; i < 4; ++i) {
          step(cublasLtMatmulPreferenceSetAttribute(preference, which[i], &alignments[i],
                                                    sizeof(alignments[i])));
        }
        if (status == CUBLAS_STATUS_SUCCESS) {
          step(cublasLtMatmulAlgoGetHeuristic(lt, plan->operation, plan->first, plan->second,
                                              plan->result, plan->result, preference, 1, &heuristic,
                                              &returned));
        }
      }
      if (preference != nullptr) (void)cublasLtMatmulPreferenceDestroy(preference);
      if (status == CUBLAS_STATUS_SUCCESS && returned > 0) {
        plan->algo = heuristic.algo;
        plan->found = true;
      }
      slot = std::move(plan);
    }
    const detail::lt_bias_plan& plan = *slot;
    if (!plan.found) return;
    const void* bias_pointer = bias;
    TESSERA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer, sizeof(bias_pointer)));
    const float alpha = 1, beta = 0;
    const cublasStatus_t status = cublasLtMatmul(
        lt, plan.operation, &alpha, b, plan.first, a, plan.second, &beta, c, plan.result, c,
        plan.result, &plan.algo, e.workspace, e.workspace_bytes, stream.native());
    // Refused before anything was queued: the usual path. A failure of the launch is an error.
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return;
    TESSERA_CUBLAS_CHECK(status);
    done = true;
  });
  return done;
#else
  (void)device, (void)m, (void)n, (void)k, (void)a, (void)a_trans, (void)lda, (void)b;
  (void)b_trans, (void)ldb, (void)bias, (void)relu, (void)c, (void)ldc, (void)stream;
  throw device_error("matmul: this build has no CUDA support (configure with TESSERA_WITH_CUDA)");
#endif
}

}  // namespace tessera::backend::cuda
