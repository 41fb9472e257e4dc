// CPU matrix products C = A x B over batches of strided matrices. Float and double go to a CBLAS
// (OpenBLAS) when TESSERA_BLAS is defined; everything else, and everything without a BLAS, runs on
// the built-in kernel here: packed panels, a register-blocked micro-kernel, OpenMP threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/backend/cpu/thread_pool.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/half.hpp"
#include "tessera/memory/memory.hpp"

#if defined(TESSERA_BLAS) && TESSERA_BLAS
#include <cblas.h>
#define TESSERA_GEMM_HAS_BLAS 1
#else
#define TESSERA_GEMM_HAS_BLAS 0
#endif

// The built-in kernel is compiled once per x86 vector ISA (function target attributes) and picked
// at run time, so a default -O3 build without -march still runs AVX2/AVX-512 code. nvcc's front
// end is left out: it does not need the CPU kernel fast, only compiled.
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDACC__)
#define TESSERA_GEMM_X86_KERNELS 1
#else
#define TESSERA_GEMM_X86_KERNELS 0
#endif

// Full unrolling of the register tile's loops, so the accumulators become registers. Only GCC
// reads `#pragma GCC unroll` (nvcc's front end rejects it; others unroll at -O3 on their own).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define TESSERA_GEMM_UNROLL(n) _Pragma(TESSERA_STRINGIFY(GCC unroll n))
#else
#define TESSERA_GEMM_UNROLL(n)
#endif

namespace tessera::backend::cpu {

/// Sizes of a batched product: `batch` products of [m, k] x [k, n].
struct gemm_shape {
  std::int64_t batch = 1;
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
};

/// An input of a batched product: element (b, i, j) is data[b * batch_stride + i * row_stride +
/// j * col_stride]. Strides are in elements; 0 repeats (broadcasts) along that dimension.
template <class T>
struct gemm_operand {
  const T* data = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t row_stride = 0;
  std::int64_t col_stride = 0;
};

/// The output of a batched product: element (b, i, j) is data[b * batch_stride + i * row_stride
/// + j] (unit column stride, as in every tensor matmul creates).
template <class T>
struct gemm_output {
  T* data = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t row_stride = 0;
};

/// Which build of the built-in micro-kernel runs. `automatic` takes the widest the CPU has;
/// the others exist so tests can run every variant a machine supports.
enum class gemm_kernel { automatic, portable, avx2, avx512 };

/// True when this build has `kernel` and the CPU can run it (`automatic`, `portable`: always).
inline bool gemm_kernel_supported(gemm_kernel kernel) noexcept {
  switch (kernel) {
    case gemm_kernel::automatic:
    case gemm_kernel::portable:
      return true;
#if TESSERA_GEMM_X86_KERNELS
    // __builtin_cpu_init: the CPU model may be read before libgcc's constructor ran (a static
    // initializer in another translation unit); it is idempotent and cheap.
    case gemm_kernel::avx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case gemm_kernel::avx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("fma");
#else
    case gemm_kernel::avx2:
    case gemm_kernel::avx512:
      return false;
#endif
  }
  return false;
}

inline const char* name(gemm_kernel kernel) noexcept {
  switch (kernel) {
    case gemm_kernel::automatic:
      return "automatic";
    case gemm_kernel::portable:
      return "portable";
    case gemm_kernel::avx2:
      return "avx2";
    case gemm_kernel::avx512:
      return "avx512";
  }
  return "unknown";
}

// ---- BLAS switch ------------------------------------------------------------------------------

/// True when this build calls a CBLAS (TESSERA_BLAS: CMake found one).
inline constexpr bool has_blas = TESSERA_GEMM_HAS_BLAS != 0;

namespace detail {
inline std::atomic<bool>& blas_disabled_flag() noexcept {
  static std::atomic<bool> disabled{false};
  return disabled;
}
}  // namespace detail

/// Process-wide switch: with `false`, float and double products run on the built-in kernel even
/// though a BLAS is linked (tests and benchmarks compare the two paths in one build).
inline void set_blas_enabled(bool enabled) noexcept {
  detail::blas_disabled_flag().store(!enabled, std::memory_order_relaxed);
}

/// True when products of dtype T go to the CBLAS: one is linked, T is float or double, and
/// set_blas_enabled(false) is not in force.
template <class T>
bool uses_blas() noexcept {
  if constexpr (has_blas && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
    return !detail::blas_disabled_flag().load(std::memory_order_relaxed);
  } else {
    return false;
  }
}

/// RAII: products run on the built-in kernel while it lives (restores the previous setting).
class builtin_gemm_scope {
 public:
  builtin_gemm_scope() noexcept
      : previous_(detail::blas_disabled_flag().exchange(true, std::memory_order_relaxed)) {}
  ~builtin_gemm_scope() {
    detail::blas_disabled_flag().store(previous_, std::memory_order_relaxed);
  }
  builtin_gemm_scope(const builtin_gemm_scope&) = delete;
  builtin_gemm_scope& operator=(const builtin_gemm_scope&) = delete;

 private:
  bool previous_;
};

// ---- the built-in kernel ------------------------------------------------------------------------

namespace detail {

/// The type products are summed in: float for the 16-bit floats (as cuBLAS's 32F compute type),
/// wrapping unsigned integers for the integer types (the low bits of a wrapped sum are those of
/// the exact sum, so casting back gives PyTorch's two's-complement result without signed
/// overflow).
template <class T>
struct gemm_accumulator {
  using type = T;
};
template <>
struct gemm_accumulator<half> {
  using type = float;
};
template <>
struct gemm_accumulator<bfloat16> {
  using type = float;
};
template <>
struct gemm_accumulator<std::int8_t> {
  using type = std::uint32_t;
};
template <>
struct gemm_accumulator<std::uint8_t> {
  using type = std::uint32_t;
};
template <>
struct gemm_accumulator<std::int16_t> {
  using type = std::uint32_t;
};
template <>
struct gemm_accumulator<std::int32_t> {
  using type = std::uint32_t;
};
template <>
struct gemm_accumulator<std::int64_t> {
  using type = std::uint64_t;
};

template <class T>
using gemm_accumulator_t = typename gemm_accumulator<T>::type;

template <class Acc, class T>
inline Acc to_accumulator(T value) noexcept {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return static_cast<float>(value);
  } else {
    return static_cast<Acc>(value);
  }
}

template <class T, class Acc>
inline T from_accumulator(Acc value) noexcept {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return T(value);  // one rounding, from the float sum
  } else {
    return static_cast<T>(value);  // integers: modular, as C++20 defines it
  }
}

/// Cache blocking. A B micro-panel (kc x NR) stays in L1 while the A block (mc x kc) streams from
/// L2 and the B panel (kc x nc) sits in L3: kc = 256 floats makes a 16-wide micro-panel 16 KiB
/// and a 144-row A block 144 KiB. (On a 2-core Zen 4 host, 128 and 512 floats measured no better.)
template <class Acc>
struct gemm_blocking {
  static constexpr std::int64_t kc = 1024 / static_cast<std::int64_t>(sizeof(Acc));
  static constexpr std::int64_t mc_max = 144;
  static constexpr std::int64_t nc = 4096;
};

/// Register tile: MR rows by two vectors of the ISA. With 16 vector registers (SSE, AVX2) 4 x 2
/// vectors keeps 8 accumulators, 2 B vectors and the broadcasts in registers (6 x 2 made GCC 12
/// spill three accumulators to the stack in the k loop); AVX-512's 32 registers hold 8 x 2.
template <class Acc, int VectorBytes>
struct gemm_tile {
  static constexpr int mr = VectorBytes == 64 ? 8 : 4;
  static constexpr int nr = 2 * (VectorBytes / static_cast<int>(sizeof(Acc)) > 0
                                     ? VectorBytes / static_cast<int>(sizeof(Acc))
                                     : 1);
};

/// One MR x NR tile of C from a packed A sliver (kc x MR, column after column) and a packed B
/// sliver (kc x NR, row after row): the k loop accumulates into a local array that the compiler
/// keeps in vector registers (the j loop is the vector lane). `mr` x `nr` <= MR x NR entries of C
/// are stored (edge tiles); `accumulate` adds to C instead of overwriting it.
template <class Acc, int MR, int NR, bool Fused>
[[gnu::always_inline]] inline void micro_kernel(std::int64_t kc, const Acc* __restrict a,
                                                const Acc* __restrict b, Acc* __restrict c,
                                                std::int64_t ldc, int mr, int nr, bool accumulate) {
  Acc acc[MR][NR] = {};
  for (std::int64_t p = 0; p < kc; ++p) {
    const Acc* ap = a + p * MR;
    const Acc* bp = b + p * NR;
    TESSERA_GEMM_UNROLL(16)
    for (int i = 0; i < MR; ++i) {
      const Acc ai = ap[i];
      TESSERA_GEMM_UNROLL(64)
      for (int j = 0; j < NR; ++j) {
        // An explicit fma where the ISA has one: with -std=c++20 (not gnu++20) GCC does not
        // contract a*b+c on its own, which would halve the throughput.
        if constexpr (Fused) {
          acc[i][j] = std::fma(ai, bp[j], acc[i][j]);
        } else {
          acc[i][j] += ai * bp[j];
        }
      }
    }
  }
  if (mr == MR && nr == NR) {
    for (int i = 0; i < MR; ++i) {
      Acc* row = c + i * ldc;
      if (accumulate) {
        for (int j = 0; j < NR; ++j) row[j] += acc[i][j];
      } else {
        for (int j = 0; j < NR; ++j) row[j] = acc[i][j];
      }
    }
  } else {
    for (int i = 0; i < mr; ++i) {
      Acc* row = c + i * ldc;
      for (int j = 0; j < nr; ++j) row[j] = accumulate ? row[j] + acc[i][j] : acc[i][j];
    }
  }
}

/// C block (mc x nc) from a packed A block and a packed B panel. jr outside ir: one B sliver is
/// reused from L1 against every A sliver of the block.
template <class Acc, int MR, int NR, bool Fused>
[[gnu::always_inline]] inline void macro_kernel(std::int64_t mc, std::int64_t nc, std::int64_t kc,
                                                const Acc* a_pack, const Acc* b_pack, Acc* c,
                                                std::int64_t ldc, bool accumulate) {
  for (std::int64_t jr = 0; jr < nc; jr += NR) {
    const int nr = static_cast<int>(std::min<std::int64_t>(NR, nc - jr));
    for (std::int64_t ir = 0; ir < mc; ir += MR) {
      const int mr = static_cast<int>(std::min<std::int64_t>(MR, mc - ir));
      micro_kernel<Acc, MR, NR, Fused>(kc, a_pack + ir * kc, b_pack + jr * kc, c + ir * ldc + jr,
                                       ldc, mr, nr, accumulate);
    }
  }
}

template <class Acc>
using macro_kernel_fn = void (*)(std::int64_t, std::int64_t, std::int64_t, const Acc*, const Acc*,
                                 Acc*, std::int64_t, bool);

template <class Acc>
inline constexpr bool fusable = std::is_same_v<Acc, float> || std::is_same_v<Acc, double>;

template <class Acc, int MR, int NR>
void macro_kernel_portable(std::int64_t mc, std::int64_t nc, std::int64_t kc, const Acc* a_pack,
                           const Acc* b_pack, Acc* c, std::int64_t ldc, bool accumulate) {
  macro_kernel<Acc, MR, NR, false>(mc, nc, kc, a_pack, b_pack, c, ldc, accumulate);
}

#if TESSERA_GEMM_X86_KERNELS
template <class Acc, int MR, int NR>
__attribute__((target("avx2,fma"))) void macro_kernel_avx2(std::int64_t mc, std::int64_t nc,
                                                           std::int64_t kc, const Acc* a_pack,
                                                           const Acc* b_pack, Acc* c,
                                                           std::int64_t ldc, bool accumulate) {
  macro_kernel<Acc, MR, NR, fusable<Acc>>(mc, nc, kc, a_pack, b_pack, c, ldc, accumulate);
}

template <class Acc, int MR, int NR>
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void macro_kernel_avx512(
    std::int64_t mc, std::int64_t nc, std::int64_t kc, const Acc* a_pack, const Acc* b_pack, Acc* c,
    std::int64_t ldc, bool accumulate) {
  macro_kernel<Acc, MR, NR, fusable<Acc>>(mc, nc, kc, a_pack, b_pack, c, ldc, accumulate);
}
#endif

/// Packs rows [0, mc) and columns [0, kc) of A (already offset to the block) into slivers of MR
/// rows: sliver s holds a[s*MR + i][p] at s*MR*kc + p*MR + i; rows past mc are zero.
template <int MR, class T, class Acc>
void pack_a(const T* a, std::int64_t row_stride, std::int64_t col_stride, std::int64_t mc,
            std::int64_t kc, Acc* out) {
  for (std::int64_t s = 0; s < mc; s += MR) {
    const std::int64_t rows = std::min<std::int64_t>(MR, mc - s);
    Acc* sliver = out + s * kc;
    for (std::int64_t i = 0; i < rows; ++i) {
      const T* row = a + (s + i) * row_stride;
      for (std::int64_t p = 0; p < kc; ++p) {
        sliver[p * MR + i] = to_accumulator<Acc>(row[p * col_stride]);
      }
    }
    for (std::int64_t i = rows; i < MR; ++i) {
      for (std::int64_t p = 0; p < kc; ++p) sliver[p * MR + i] = Acc(0);
    }
  }
}

/// Packs slivers [first, last) of NR columns of B (kc x nc, already offset to the panel): sliver
/// s holds b[p][s*NR + j] at s*NR*kc + p*NR + j; columns past nc are zero.
template <int NR, class T, class Acc>
void pack_b(const T* b, std::int64_t row_stride, std::int64_t col_stride, std::int64_t kc,
            std::int64_t nc, std::int64_t first, std::int64_t last, Acc* out) {
  for (std::int64_t s = first; s < last; ++s) {
    const std::int64_t col0 = s * NR;
    const std::int64_t cols = std::min<std::int64_t>(NR, nc - col0);
    Acc* sliver = out + col0 * kc;
    for (std::int64_t p = 0; p < kc; ++p) {
      const T* row = b + p * row_stride + col0 * col_stride;
      Acc* dst = sliver + p * NR;
      if (col_stride == 1) {
        for (std::int64_t j = 0; j < cols; ++j) dst[j] = to_accumulator<Acc>(row[j]);
      } else {
        for (std::int64_t j = 0; j < cols; ++j) dst[j] = to_accumulator<Acc>(row[j * col_stride]);
      }
      for (std::int64_t j = cols; j < NR; ++j) dst[j] = Acc(0);
    }
  }
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
inline std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }
inline std::size_t aligned_bytes(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

/// Scratch memory for one call, taken from the device's pool in one block so that it shows in
/// memory::stats like every other byte; returned when the call ends (also on exceptions).
class gemm_workspace {
 public:
  gemm_workspace(Device device, std::size_t bytes)
      : device_(device), bytes_(bytes), data_(memory::allocate(device, bytes)) {}
  ~gemm_workspace() { memory::deallocate(device_, data_, bytes_); }
  gemm_workspace(const gemm_workspace&) = delete;
  gemm_workspace& operator=(const gemm_workspace&) = delete;
  std::byte* data() const noexcept { return static_cast<std::byte*>(data_); }

 private:
  Device device_;
  std::size_t bytes_;
  void* data_;
};

/// The built-in product for one ISA build: (MR, NR) fix the packing, `macro` the compute.
template <class T, int MR, int NR>
class builtin_gemm {
 public:
  using Acc = gemm_accumulator_t<T>;
  using blocking = gemm_blocking<Acc>;
  // The kernel writes Acc; an output of another type goes through an Acc copy of C, converted at
  // the end, so partial sums over k blocks are never rounded to T.
  static constexpr bool direct_output = std::is_same_v<Acc, T>;

  builtin_gemm(const gemm_shape& shape, macro_kernel_fn<Acc> macro) : shape_(shape), macro_(macro) {
    kc_ = std::min<std::int64_t>(blocking::kc, std::max<std::int64_t>(shape.k, 1));
    nc_ = std::min<std::int64_t>(blocking::nc, round_up(shape.n, NR));
    const std::int64_t threads = tessera::cpu::num_threads();
    // Many small products: one product per thread, each single-threaded. Otherwise each product
    // in turn uses every thread.
    const double flops =
        static_cast<double>(shape.m) * static_cast<double>(shape.n) * static_cast<double>(shape.k);
    batch_parallel_ = shape.batch > 1 && (shape.batch >= threads || flops < 64.0 * 64.0 * 64.0);
    slots_ = batch_parallel_ ? parallel_chunks(shape.batch, 1) : 1;
    inner_threads_ = batch_parallel_ ? 1 : threads;
    // mc: the largest multiple of MR up to mc_max that splits m evenly over the threads.
    const std::int64_t blocks =
        inner_threads_ * ceil_div(shape.m, inner_threads_ * blocking::mc_max);
    mc_ = std::min<std::int64_t>(
        blocking::mc_max, round_up(ceil_div(shape.m, std::max<std::int64_t>(blocks, 1)), MR));
    a_packs_per_slot_ = batch_parallel_ ? 1 : inner_threads_;
  }

  /// Bytes of workspace the call needs.
  std::size_t workspace_bytes() const { return static_cast<std::size_t>(slots_) * slot_bytes(); }

  void run(gemm_operand<T> a, gemm_operand<T> b, gemm_output<T> c, std::byte* workspace) const {
    if (batch_parallel_) {
      // Slot s takes batch entries [batch * s / slots, batch * (s + 1) / slots) with workspace
      // slot s; parallel_for hands each slot to one thread, however it splits the range.
      parallel_for(0, slots_, 1, [&](std::int64_t first, std::int64_t last) {
        for (std::int64_t slot = first; slot < last; ++slot) {
          for (std::int64_t e = shape_.batch * slot / slots_;
               e < shape_.batch * (slot + 1) / slots_; ++e) {
            one_product(a, b, c, e, workspace + slot * slot_bytes(), 1);
          }
        }
      });
    } else {
      for (std::int64_t e = 0; e < shape_.batch; ++e) {
        one_product(a, b, c, e, workspace, inner_threads_);
      }
    }
  }

 private:
  std::size_t b_pack_bytes() const {
    return aligned_bytes(static_cast<std::size_t>(kc_ * round_up(nc_, NR)) * sizeof(Acc));
  }
  std::size_t a_pack_bytes() const {
    return aligned_bytes(static_cast<std::size_t>(kc_ * round_up(mc_, MR)) * sizeof(Acc));
  }
  std::size_t c_copy_bytes() const {
    return direct_output
               ? 0
               : aligned_bytes(static_cast<std::size_t>(shape_.m * shape_.n) * sizeof(Acc));
  }
  std::size_t slot_bytes() const {
    return b_pack_bytes() + static_cast<std::size_t>(a_packs_per_slot_) * a_pack_bytes() +
           c_copy_bytes();
  }

  // Product `e` of the batch with `threads` threads (1: on the caller).
  void one_product(gemm_operand<T> a, gemm_operand<T> b, gemm_output<T> c, std::int64_t e,
                   std::byte* slot, std::int64_t threads) const {
    const std::int64_t m = shape_.m, n = shape_.n, k = shape_.k;
    const T* a_base = a.data + e * a.batch_stride;
    const T* b_base = b.data + e * b.batch_stride;
    T* c_out = c.data + e * c.batch_stride;
    Acc* b_pack = reinterpret_cast<Acc*>(slot);
    std::byte* a_packs = slot + b_pack_bytes();
    Acc* c_acc;
    std::int64_t ldc;
    if constexpr (direct_output) {
      c_acc = c_out;
      ldc = c.row_stride;
    } else {
      c_acc = reinterpret_cast<Acc*>(a_packs +
                                     static_cast<std::size_t>(a_packs_per_slot_) * a_pack_bytes());
      ldc = n;
    }
    const std::int64_t m_blocks = ceil_div(m, mc_);

    for (std::int64_t jc = 0; jc < n; jc += nc_) {
      const std::int64_t nc = std::min(nc_, n - jc);
      const std::int64_t slivers = ceil_div(nc, NR);
      // Few row blocks for many threads: split the columns of the panel too.
      const std::int64_t n_groups = std::clamp<std::int64_t>(threads / m_blocks, 1, slivers);
      const std::int64_t units = m_blocks * n_groups;
      for (std::int64_t pc = 0; pc < k; pc += kc_) {
        const std::int64_t kc = std::min(kc_, k - pc);
        const T* b_panel = b_base + pc * b.row_stride + jc * b.col_stride;
        const bool accumulate = pc > 0;
        maybe_parallel(slivers, threads, 4, [&](std::int64_t first, std::int64_t last) {
          pack_b<NR>(b_panel, b.row_stride, b.col_stride, kc, nc, first, last, b_pack);
        });
        // At most one chunk per A pack, even if the thread count changed since construction.
        const std::int64_t chunks =
            threads > 1 ? std::min(parallel_chunks(units, 1), a_packs_per_slot_) : 1;
        maybe_parallel(chunks, threads, 1, [&](std::int64_t first, std::int64_t last) {
          for (std::int64_t chunk = first; chunk < last; ++chunk) {
            // Each chunk owns A pack `chunk`, so chunks on other threads never share one.
            Acc* a_pack =
                reinterpret_cast<Acc*>(a_packs + static_cast<std::size_t>(chunk) * a_pack_bytes());
            std::int64_t packed_block = -1;
            for (std::int64_t u = units * chunk / chunks; u < units * (chunk + 1) / chunks; ++u) {
              const std::int64_t block = u / n_groups;
              const std::int64_t group = u % n_groups;
              const std::int64_t ic = block * mc_;
              const std::int64_t mc = std::min(mc_, m - ic);
              if (block != packed_block) {
                pack_a<MR>(a_base + ic * a.row_stride + pc * a.col_stride, a.row_stride,
                           a.col_stride, mc, kc, a_pack);
                packed_block = block;
              }
              const std::int64_t s0 = slivers * group / n_groups;
              const std::int64_t s1 = slivers * (group + 1) / n_groups;
              if (s0 == s1) continue;
              const std::int64_t width = std::min(s1 * NR, nc) - s0 * NR;
              macro_(mc, width, kc, a_pack, b_pack + s0 * NR * kc, c_acc + ic * ldc + jc + s0 * NR,
                     ldc, accumulate);
            }
          }
        });
      }
    }
    if constexpr (!direct_output) {
      maybe_parallel(m, threads, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(n, 1)),
                     [&](std::int64_t first, std::int64_t last) {
                       for (std::int64_t i = first; i < last; ++i) {
                         for (std::int64_t j = 0; j < n; ++j) {
                           c_out[i * c.row_stride + j] = from_accumulator<T>(c_acc[i * n + j]);
                         }
                       }
                     });
    }
  }

  // parallel_for when the product has threads to itself, else a plain call on this thread (the
  // chunk index space stays the same, so workspace slots match either way).
  template <class Fn>
  static void maybe_parallel(std::int64_t n, std::int64_t threads, std::int64_t grain, Fn&& fn) {
    if (threads > 1) {
      parallel_for(0, n, grain, fn);
    } else if (n > 0) {
      fn(std::int64_t{0}, n);
    }
  }

  gemm_shape shape_;
  macro_kernel_fn<Acc> macro_;
  std::int64_t kc_ = 1, mc_ = 1, nc_ = 1;
  bool batch_parallel_ = false;
  std::int64_t slots_ = 1;
  std::int64_t inner_threads_ = 1;
  std::int64_t a_packs_per_slot_ = 1;
};

template <class T, int MR, int NR>
void run_builtin(const gemm_shape& shape, gemm_operand<T> a, gemm_operand<T> b, gemm_output<T> c,
                 Device workspace_device, macro_kernel_fn<gemm_accumulator_t<T>> macro) {
  builtin_gemm<T, MR, NR> gemm(shape, macro);
  gemm_workspace workspace(workspace_device, gemm.workspace_bytes());
  gemm.run(a, b, c, workspace.data());
}

template <class T>
void zero_output(const gemm_shape& shape, gemm_output<T> c) {
  for (std::int64_t e = 0; e < shape.batch; ++e) {
    for (std::int64_t i = 0; i < shape.m; ++i) {
      T* row = c.data + e * c.batch_stride + i * c.row_stride;
      std::fill(row, row + shape.n, T(0));
    }
  }
}

}  // namespace detail

/// C[b] = A[b] x B[b] for every b in [0, shape.batch) on the built-in kernel, whatever the dtype,
/// whatever the input strides (stride 0 broadcasts; nothing is copied beyond the packed panels).
/// Sums run in float for half and bfloat16 (rounded once at the end) and wrap modulo 2^bits for
/// integers, as in PyTorch. Threads: tessera::cpu::num_threads(). The packing workspace comes
/// from `workspace_device`'s pool in one block (out_of_memory_error before C is touched).
/// `kernel` picks the micro-kernel build (device_error when the CPU cannot run it).
template <class T>
void gemm_fallback(const gemm_shape& shape, gemm_operand<T> a, gemm_operand<T> b, gemm_output<T> c,
                   Device workspace_device = Device{},
                   gemm_kernel kernel = gemm_kernel::automatic) {
  static_assert(!std::is_same_v<T, bool>, "gemm: bool tensors have no matrix product");
  using Acc = detail::gemm_accumulator_t<T>;
  if (!gemm_kernel_supported(kernel)) {
    throw device_error(std::string("gemm: the ") + name(kernel) +
                       " kernel is not supported by this CPU or build");
  }
  if (shape.batch <= 0 || shape.m <= 0 || shape.n <= 0) return;
  if (shape.k <= 0) {
    detail::zero_output(shape, c);
    return;
  }
#if TESSERA_GEMM_X86_KERNELS
  if (kernel == gemm_kernel::automatic) {
    kernel = gemm_kernel_supported(gemm_kernel::avx512) ? gemm_kernel::avx512
             : gemm_kernel_supported(gemm_kernel::avx2) ? gemm_kernel::avx2
                                                        : gemm_kernel::portable;
  }
  if (kernel == gemm_kernel::avx512) {
    using tile = detail::gemm_tile<Acc, 64>;
    detail::run_builtin<T, tile::mr, tile::nr>(
        shape, a, b, c, workspace_device, &detail::macro_kernel_avx512<Acc, tile::mr, tile::nr>);
    return;
  }
  if (kernel == gemm_kernel::avx2) {
    using tile = detail::gemm_tile<Acc, 32>;
    detail::run_builtin<T, tile::mr, tile::nr>(shape, a, b, c, workspace_device,
                                               &detail::macro_kernel_avx2<Acc, tile::mr, tile::nr>);
    return;
  }
#endif
  using tile = detail::gemm_tile<Acc, 16>;
  detail::run_builtin<T, tile::mr, tile::nr>(
      shape, a, b, c, workspace_device, &detail::macro_kernel_portable<Acc, tile::mr, tile::nr>);
}

// ---- CBLAS
// ---------------------------------------------------------------------------------------

#if TESSERA_GEMM_HAS_BLAS
namespace detail {
/// OpenBLAS runs its own threads; give it the calling thread's share of the cores, as Tessera's
/// own loops get. With OpenBLAS's OpenMP build (the one Tessera's CMake prefers) the count is the
/// calling thread's OpenMP setting, so two threads driving two devices each get their own share
/// and one pool of threads serves both libraries. Where Tessera has OpenMP too, that count is read
/// before each product and set only when it differs from the share: a program's own
/// omp_set_num_threads or openblas_set_num_threads in between cannot leave it wrong. Otherwise
/// (OpenBLAS's other builds keep one count for the process; without OpenMP Tessera cannot read an
/// OpenMP build's per-thread count) it is set when this thread last set another.
inline void sync_blas_threads() {
#if defined(OPENBLAS_VERSION)
#if defined(__SANITIZE_THREAD__)
  // Under ThreadSanitizer BLAS runs on the calling thread: OpenBLAS's OpenMP threads synchronise
  // inside libgomp, which TSan does not see, so their writes would be reported as races.
  const int wanted = 1;
#else
  const int wanted = tessera::cpu::num_threads();
#endif
#if defined(_OPENMP)
  static const bool openmp_build = openblas_get_parallel() == 2;
  if (openmp_build) {
    if (omp_get_max_threads() != wanted) openblas_set_num_threads(wanted);
    return;
  }
#endif
  thread_local int applied = 0;
  if (applied != wanted) {
    openblas_set_num_threads(wanted);
    applied = wanted;
  }
#endif
}

inline bool fits_blas_int(std::int64_t value) { return value >= 0 && value <= INT_MAX; }
}  // namespace detail

/// C[e] = op(A[e]) x op(B[e]) for e in [0, batch) through cblas_sgemm / cblas_dgemm, one call
/// per batch entry. Row-major, as tensors are: op(A) is [m, k] and op(B) [k, n]; a `trans`posed
/// operand is stored column-major (CblasTrans) with leading dimension lda / ldb, which the caller
/// has checked against BLAS's rules. Batch strides may be 0 (one matrix shared by the batch). C
/// is row-major with leading dimension ldc. Sizes beyond a BLAS int throw shape_error.
template <class T>
void gemm_blas(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
               bool a_trans, std::int64_t lda, std::int64_t a_batch_stride, const T* b,
               bool b_trans, std::int64_t ldb, std::int64_t b_batch_stride, T* c, std::int64_t ldc,
               std::int64_t c_batch_stride, bool accumulate = false) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "gemm_blas: CBLAS multiplies float and double only");
  if (batch <= 0 || m <= 0 || n <= 0) return;
  for (std::int64_t value : {m, n, k, lda, ldb, ldc}) {
    if (!detail::fits_blas_int(value)) {
      throw shape_error("matmul: size or leading dimension " + std::to_string(value) +
                        " exceeds the BLAS integer range");
    }
  }
  detail::sync_blas_threads();
  const auto im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  const auto ilda = static_cast<int>(lda), ildb = static_cast<int>(ldb),
             ildc = static_cast<int>(ldc);
  const CBLAS_TRANSPOSE ta = a_trans ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = b_trans ? CblasTrans : CblasNoTrans;
  for (std::int64_t e = 0; e < batch; ++e) {
    const T* ae = a + e * a_batch_stride;
    const T* be = b + e * b_batch_stride;
    T* ce = c + e * c_batch_stride;
    // k = 0: BLAS scales C by beta = 0, i.e. writes zeros, as a product over nothing must.
    // accumulate: beta = 1, C += A B (gradients accumulating into a buffer).
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, ta, tb, im, in, ik, 1.0f, ae, ilda, be, ildb,
                  accumulate ? 1.0f : 0.0f, ce, ildc);
    } else {
      cblas_dgemm(CblasRowMajor, ta, tb, im, in, ik, 1.0, ae, ilda, be, ildb,
                  accumulate ? 1.0 : 0.0, ce, ildc);
    }
  }
}
#else
/// Without a BLAS (uses_blas<T>() is false) nothing reaches this; it exists so callers compile.
template <class T>
void gemm_blas(std::int64_t, std::int64_t, std::int64_t, std::int64_t, const T*, bool, std::int64_t,
               std::int64_t, const T*, bool, std::int64_t, std::int64_t, T*, std::int64_t,
               std::int64_t, bool = false) {
  throw error("gemm_blas: this build has no BLAS (configure with TESSERA_WITH_BLAS)");
}
#endif

}  // namespace tessera::backend::cpu
