// ts::matmul: products of 2-D and batched 3-D tensors (torch.matmul for those ranks). Checks the
// operands, reads each one's view as a BLAS layout (a transposed view is a Trans operand, not a
// copy) and dispatches: CBLAS or the built-in kernel on CPU, cuBLAS on CUDA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "tessera/backend/cpu/gemm.hpp"
#include "tessera/backend/cuda/gemm.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera {

namespace detail {

/// How a BLAS reads a matrix: row-major with leading dimension `ld` (NoTrans), or column-major
/// with leading dimension `ld`, i.e. the transpose of a row-major matrix (Trans).
struct blas_layout {
  bool transposed = false;
  std::int64_t ld = 1;

  friend bool operator==(const blas_layout&, const blas_layout&) = default;
};

/// The BLAS layout of a [rows, cols] view with strides (row_stride, col_stride), or nothing when
/// a BLAS cannot read it in place: strides (ld, 1) with ld >= cols are NoTrans, (1, ld) with
/// ld >= rows are Trans; anything else (a stride 0 broadcast, steps in both dimensions, rows
/// closer than a row is long) needs a contiguous copy. The stride of an extent-1 dimension is
/// never followed, so it may be anything; it gets the smallest leading dimension BLAS accepts.
inline std::optional<blas_layout> blas_layout_of(std::int64_t rows, std::int64_t cols,
                                                 std::int64_t row_stride, std::int64_t col_stride) {
  const std::int64_t min_ld_rows = std::max<std::int64_t>(1, cols);
  const std::int64_t min_ld_cols = std::max<std::int64_t>(1, rows);
  if ((cols <= 1 || col_stride == 1) && (rows <= 1 || row_stride >= min_ld_rows)) {
    return blas_layout{false, rows <= 1 ? min_ld_rows : row_stride};
  }
  if ((rows <= 1 || row_stride == 1) && (cols <= 1 || col_stride >= min_ld_cols)) {
    return blas_layout{true, cols <= 1 ? min_ld_cols : col_stride};
  }
  return std::nullopt;
}

/// A matmul operand as a batch of strided matrices (batch_stride 0: shared by the batch).
template <class T, class K>
struct matmul_operand {
  Tensor<T, K> tensor;  // keeps a copy alive when one had to be made
  std::int64_t rows = 0, cols = 0;
  std::int64_t batch_stride = 0, row_stride = 0, col_stride = 0;

  matmul_operand(const Tensor<T, K>& t, std::int64_t batch) : tensor(t) { describe(batch); }

  void describe(std::int64_t batch) {
    const int d = tensor.dim();
    if (d < 2) {  // callers check shapes first; this tells the compiler that d - 2 is an index
      throw shape_error("matmul: an operand of shape " + tensor.shape().str() + " is not a matrix");
    }
    rows = tensor.size(d - 2);
    cols = tensor.size(d - 1);
    row_stride = tensor.strides()[d - 2];
    col_stride = tensor.strides()[d - 1];
    // A 2-D operand, or a batch of one against a larger batch, is the same matrix for every
    // entry: batch stride 0, as PyTorch's broadcasting of matmul gives.
    batch_stride = (d == 3 && tensor.size(0) == batch && batch > 1) ? tensor.strides()[0] : 0;
  }

  const T* data() const { return tensor.data(); }

  /// The layout for a BLAS, copying the operand to a contiguous one first when it has none.
  /// A shared matrix (batch stride 0) is copied once, not once per batch entry.
  blas_layout blas(std::int64_t batch) {
    if (auto layout = blas_layout_of(rows, cols, row_stride, col_stride)) return *layout;
    if (tensor.dim() == 3 && batch_stride == 0) tensor = tensor.select(0, 0);
    tensor = tensor.contiguous();
    describe(batch);
    return *blas_layout_of(rows, cols, row_stride, col_stride);
  }
};

/// True when A's batch entries are stacked row after row (entry e + 1 starts m rows after entry
/// e) and B is one matrix for the whole batch: then the batch is one product of
/// [batch * m, k] x [k, n], whose row-major result is exactly the [batch, m, n] output, and one
/// larger product threads and blocks better.
template <class T, class K>
bool can_fold_batch(const matmul_operand<T, K>& lhs, const matmul_operand<T, K>& rhs,
                    std::int64_t batch, std::int64_t m) {
  return batch > 1 && rhs.batch_stride == 0 && lhs.batch_stride == m * lhs.row_stride;
}

template <class T, class K>
void fold_batch(matmul_operand<T, K>& lhs, std::int64_t batch, std::int64_t m) {
  lhs.rows = batch * m;
  lhs.batch_stride = 0;
}

/// What a BLAS call gets: the (possibly folded) batch and row count and both layouts.
struct blas_plan {
  std::int64_t batch = 1, m = 0;
  blas_layout a, b;
};

/// Puts both operands in a layout a BLAS reads in place (copying those that have none) and
/// folds the batch when the stacked rows of A still form a NoTrans matrix.
template <class T, class K>
blas_plan plan_blas(matmul_operand<T, K>& lhs, matmul_operand<T, K>& rhs, std::int64_t batch,
                    std::int64_t m, std::int64_t k) {
  blas_plan plan{batch, m, lhs.blas(batch), rhs.blas(batch)};
  if (can_fold_batch(lhs, rhs, batch, m)) {
    // A copy made above may have changed the strides, hence the check on the folded matrix.
    if (auto folded = blas_layout_of(batch * m, k, lhs.row_stride, lhs.col_stride);
        folded && !folded->transposed) {
      fold_batch(lhs, batch, m);
      plan.batch = 1;
      plan.m = batch * m;
      plan.a = *folded;
    }
  }
  return plan;
}

/// Shape checks; returns the output shape. Throws before anything is allocated.
TESSERA_API Shape matmul_result_shape(const Shape& a, const Shape& b);

/// True when matmul_into can add into its output in the same call (BLAS's beta = 1): the CBLAS
/// path for float and double, cuBLAS on CUDA. The built-in kernel only overwrites.
template <class T, class K>
bool matmul_accumulates() {
  if constexpr (std::is_same_v<K, tessera::cpu>) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      return backend::cpu::uses_blas<T>();
    } else {
      return false;
    }
  } else {
    return backend::cuda::gemm_supports<T>;
  }
}

/// a @ b into `out` (out += a @ b when `accumulate`, which needs matmul_accumulates<T, K>()):
/// contiguous, of matmul_result_shape, on the operands' device (checked by the caller, as
/// matmul does).
template <class T, class K>
void matmul_into(Tensor<T, K>& out, const Tensor<T, K>& a, const Tensor<T, K>& b,
                 bool accumulate = false) {
  if (accumulate && !matmul_accumulates<T, K>()) {
    throw error("matmul_into: this path cannot accumulate into its output");
  }
  const Shape& out_shape = out.shape();
  const std::int64_t batch = out_shape.size() == 3 ? out_shape[0] : 1;
  const std::int64_t m = out_shape[out_shape.size() - 2];
  const std::int64_t n = out_shape[out_shape.size() - 1];
  const std::int64_t k = a.size(-1);
  if (out.numel() == 0) return;
  if (k == 0) {
    if (!accumulate) out.zero_();  // a sum over nothing
    return;
  }

  matmul_operand<T, K> lhs(a, batch), rhs(b, batch);
  if constexpr (std::is_same_v<K, tessera::cpu>) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (backend::cpu::uses_blas<T>()) {
        const auto plan = detail::plan_blas(lhs, rhs, batch, m, k);
        backend::cpu::gemm_blas<T>(plan.batch, plan.m, n, k, lhs.data(), plan.a.transposed,
                                   plan.a.ld, lhs.batch_stride, rhs.data(), plan.b.transposed,
                                   plan.b.ld, rhs.batch_stride, out.data(), n, m * n, accumulate);
        return;
      }
    }
    // The built-in kernel reads any strides while packing: no copies. Stacking the batch into
    // rows works for any A strides here.
    std::int64_t gemm_batch = batch, gemm_m = m;
    if (detail::can_fold_batch(lhs, rhs, batch, m)) {
      detail::fold_batch(lhs, batch, m);
      gemm_batch = 1;
      gemm_m = batch * m;
    }
    backend::cpu::gemm_fallback<T>(
        backend::cpu::gemm_shape{gemm_batch, gemm_m, n, k},
        backend::cpu::gemm_operand<T>{lhs.data(), lhs.batch_stride, lhs.row_stride, lhs.col_stride},
        backend::cpu::gemm_operand<T>{rhs.data(), rhs.batch_stride, rhs.row_stride, rhs.col_stride},
        backend::cpu::gemm_output<T>{out.data(), m * n, n}, a.device());
  } else {
    const auto plan = detail::plan_blas(lhs, rhs, batch, m, k);
    if constexpr (backend::cuda::gemm_supports<T>) {
      backend::cuda::gemm<T>(a.device_index(), plan.batch, plan.m, n, k, lhs.data(),
                             plan.a.transposed, plan.a.ld, lhs.batch_stride, rhs.data(),
                             plan.b.transposed, plan.b.ld, rhs.batch_stride, out.data(), n, m * n,
                             tessera::detail::current_cuda_stream(), accumulate);
    } else {
      throw dtype_error(std::string("matmul: cuBLAS has no ") + dtype_name<T>() + " GEMM here");
    }
  }
}

/// out = a @ b + bias, then ReLU when `relu`: a product with its epilogue, for 2-D a [m, k],
/// b [k, n], out [m, n] contiguous, and bias a contiguous row vector of n elements added to every
/// row (out may be where the epilogue's nodes would have written: a planned fold). On the CPU the
/// product and then one pass over out; on CUDA one cuBLASLt call with its bias (and ReLU)
/// epilogue for float, half and bfloat16. Returns false, having written nothing, when the device's
/// library has no kernel for it (double on CUDA; a size or alignment cuBLASLt declines): the
/// caller then runs the product and the elementwise pass as usual.
template <class T, class K>
bool matmul_bias_into(Tensor<T, K>& out, const Tensor<T, K>& a, const Tensor<T, K>& b,
                      const Tensor<T, K>& bias, bool relu) {
  const std::int64_t m = out.size(0), n = out.size(1), k = a.size(1);
  if constexpr (std::is_same_v<K, tessera::cpu>) {
    matmul_into(out, a, b);
    const auto row = as_node(bias.view(Shape{1, n}));
    if (relu) {
      run_expression(out, tessera::relu(as_node(out) + row));
    } else {
      run_expression(out, as_node(out) + row);
    }
    return true;
  } else {
    if constexpr (backend::cuda::gemm_supports<T> && !std::is_same_v<T, double>) {
      if (out.numel() == 0 || k == 0) return false;  // nothing to multiply: the usual path
      matmul_operand<T, K> lhs(a, 1), rhs(b, 1);
      const auto plan = detail::plan_blas(lhs, rhs, 1, m, k);
      return backend::cuda::gemm_bias<T>(a.device_index(), m, n, k, lhs.data(), plan.a.transposed,
                                         plan.a.ld, rhs.data(), plan.b.transposed, plan.b.ld,
                                         bias.data(), relu, out.data(), n,
                                         tessera::detail::current_cuda_stream());
    } else {
      (void)m, (void)n, (void)k, (void)out, (void)a, (void)b, (void)bias, (void)relu;
      return false;
    }
  }
}

/// target = x @ y, or target += x @ y when `accumulate` (a gradient adding into itself). Where
/// the GEMM cannot add in place (no BLAS beta = 1), the product goes to `staging` first, a
/// contiguous buffer of at least target's elements (unused otherwise, so it may be empty).
template <class T, class K>
void matmul_add_into(Tensor<T, K> target, const Tensor<T, K>& x, const Tensor<T, K>& y,
                     bool accumulate, const Tensor<T, K>& staging) {
  if (!accumulate || matmul_accumulates<T, K>()) {
    matmul_into(target, x, y, accumulate);
    return;
  }
  Tensor<T, K> partial(staging.storage(), target.shape(), target.shape().contiguous_strides(),
                       staging.storage_offset());
  matmul_into(partial, x, y);
  add_into(target, as_node(partial));
}

#if TESSERA_DEFINITIONS
TESSERA_API Shape matmul_result_shape(const Shape& a, const Shape& b) {
  const auto both = [&] { return a.str() + " and " + b.str(); };
  if (a.size() < 2 || a.size() > 3 || b.size() < 2 || b.size() > 3) {
    throw shape_error("matmul: expects 2-D or 3-D tensors, got shapes " + both());
  }
  const std::int64_t m = a[a.size() - 2], k = a[a.size() - 1];
  const std::int64_t k2 = b[b.size() - 2], n = b[b.size() - 1];
  if (k != k2) {
    throw shape_error("matmul: shapes " + both() + " cannot be multiplied (" + std::to_string(k) +
                      " != " + std::to_string(k2) + ")");
  }
  if (a.size() == 2 && b.size() == 2) return Shape{m, n};
  const std::int64_t batch_a = a.size() == 3 ? a[0] : 1;
  const std::int64_t batch_b = b.size() == 3 ? b[0] : 1;
  if (a.size() == 3 && b.size() == 3 && batch_a != batch_b && batch_a != 1 && batch_b != 1) {
    throw shape_error("matmul: batch sizes " + std::to_string(batch_a) + " and " +
                      std::to_string(batch_b) + " do not match (shapes " + both() + ")");
  }
  // Broadcasting: a batch of 1 (or a 2-D operand) is used for every entry of the other's batch.
  const std::int64_t batch = batch_a == 1 ? batch_b : batch_a;
  return Shape{batch, m, n};
}
#endif  // TESSERA_DEFINITIONS

}  // namespace detail

/// Matrix product, as torch.matmul for 2-D and 3-D operands: [m, k] x [k, n] -> [m, n];
/// [B, m, k] x [B, k, n] -> [B, m, n]; a 2-D operand, or a 3-D one with a batch of 1, is used for
/// every entry of the other's batch. Returns a new contiguous tensor on the operands' device.
///
/// Transposed views cost nothing: a view whose last two strides are (ld, 1) or (1, ld) goes to
/// the BLAS as NoTrans / Trans with that ld; other views (narrowed inner dimension, stride-0
/// broadcasts) are copied first on the BLAS paths, while the CPU's built-in kernel reads any
/// strides as it packs. CPU: float and double through CBLAS when one is linked (TESSERA_BLAS),
/// everything else (half and bfloat16 summed in float; integers wrapping as in PyTorch) on the
/// built-in kernel. CUDA: cuBLAS for float, double, half and bfloat16 (fp32 sums for the 16-bit
/// types, no TF32).
///
/// Throws, before allocating anything: shape_error naming both shapes (rank other than 2 or 3,
/// inner dimensions that differ, batch sizes that differ and are not 1); device_mismatch_error
/// naming both devices; dtype_error for an integer dtype on CUDA; tessera::error for an
/// undefined operand. Operands of different dtypes are a dtype_error and of different device
/// kinds a compile error (see the overload below).
template <Dtype T, DeviceKind K>
Tensor<T, K> matmul(const Tensor<T, K>& a, const Tensor<T, K>& b) {
  static_assert(!std::is_same_v<T, bool>,
                "matmul: bool tensors have no matrix product (nor in PyTorch); convert them with "
                ".to<float>() or .to<std::int32_t>() first");
  if (!a.defined() || !b.defined()) {
    throw error(std::string("matmul: the ") + (a.defined() ? "second" : "first") +
                " operand is undefined (default-constructed)");
  }
  const Shape out_shape = detail::matmul_result_shape(a.shape(), b.shape());
  if (a.device() != b.device()) {
    throw device_mismatch_error("matmul: expected both operands on the same device, got " +
                                a.device().str() + " and " + b.device().str());
  }
  if constexpr (std::is_same_v<K, tessera::cuda> && !backend::cuda::gemm_supports<T>) {
    throw dtype_error(std::string("matmul: cuBLAS has no ") + dtype_name<T>() +
                      " GEMM here (float32, float64, float16 and bfloat16 only); multiply on the "
                      "CPU or convert with .to<float>()");
  }

  Tensor<T, K> out = Tensor<T, K>::empty_on(out_shape, a.device());
  detail::matmul_into(out, a, b);
  return out;
}

/// Operands of different dtypes or device kinds. Kinds are types: mixing cpu and cuda does not
/// compile. Dtypes must match at run time, as in PyTorch (dtype_error naming both).
template <Dtype TA, DeviceKind KA, Dtype TB, DeviceKind KB>
requires(!(std::is_same_v<TA, TB> &&
           std::is_same_v<KA, KB>)) Tensor<TA, KA> matmul(const Tensor<TA, KA>&,
                                                          const Tensor<TB, KB>&) {
  static_assert(std::is_same_v<KA, KB>,
                "matmul: the operands are on different device kinds (cpu and cuda); move one "
                "with .to<tessera::cuda>(i) or .to<tessera::cpu>(i) first");
  throw dtype_error(std::string("matmul: expected both operands to have the same dtype, got ") +
                    dtype_name<TA>() + " and " + dtype_name<TB>() + "; convert one with .to<T>()");
}

}  // namespace tessera
