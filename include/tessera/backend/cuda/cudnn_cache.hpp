// What Tessera decides on the host about cuDNN's convolutions, kept apart from cuDNN itself so
// that it compiles without CUDA and is tested on the CPU (tests/backend/cudnn_cache_test.cpp):
// the problem and the key it is cached under (PyTorch's ConvolutionParams), the key's hash, the
// choice among cuDNN's candidates (ranked by its heuristics, or timed when
// backends::cudnn::benchmark is on) under the precision, determinism and workspace the switches
// ask for, the scratch sizes to try when timing, and the process-wide table from keys to what
// was built for them (backend/cuda/cudnn.hpp stores there the descriptors and the algorithm of
// each call, built once per problem).
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera::backend::cuda {

/// One convolution's sizes, NCHW, as torch.nn.functional.conv2d takes them: input [n, c, h, w],
/// weight [o, c / groups, kh, kw], output [n, o, oh, ow].
struct conv2d_problem {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::int64_t o = 0, kh = 0, kw = 0;
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  std::int64_t oh = 0, ow = 0;
  bool channels_last = false;  // x, w and y NHWC in memory (false: NCHW)
  auto operator<=>(const conv2d_problem&) const = default;
};

/// The three calls of a convolution: y from x and w, the input's gradient from dy and w, the
/// weight's gradient from x and dy. Each has its own algorithm, math type and workspace.
enum class conv2d_direction : std::uint8_t { forward, backward_data, backward_filter };

/// Everything cuDNN's choice for one call depends on (PyTorch's ConvolutionParams with the
/// direction). Pointers are not in it: the legacy API's heuristics do not see them, a choice
/// made when a program is traced has none, and Tessera's buffers are 256-byte aligned (pool
/// blocks, plan arenas and workspaces) except views at an offset, which cuDNN takes as well.
struct conv2d_key {
  conv2d_problem problem;
  conv2d_direction direction = conv2d_direction::forward;
  int device = 0;
  int dtype = 0;            // cudnnDataType_t of the tensors
  bool allow_tf32 = false;  // float only; false for the other dtypes
  bool deterministic = false;
  bool benchmark = false;
  std::size_t workspace_limit = 0;
  bool operator==(const conv2d_key&) const = default;
};

/// A 64-bit hash of every field of a conv2d_key (FNV-1a over the values, so that padding bytes
/// never enter it).
struct conv2d_key_hash {
  std::size_t operator()(const conv2d_key& k) const noexcept {
    std::uint64_t h = 14695981039346656037ull;
    auto mix = [&h](std::uint64_t v) {
      for (int byte = 0; byte < 8; ++byte) {
        h ^= (v >> (8 * byte)) & 0xffu;
        h *= 1099511628211ull;
      }
    };
    const conv2d_problem& p = k.problem;
    for (const std::int64_t v : {p.n, p.c, p.h, p.w, p.o, p.kh, p.kw, p.sh, p.sw, p.ph, p.pw, p.dh,
                                 p.dw, p.groups, p.oh, p.ow, std::int64_t{p.channels_last}}) {
      mix(static_cast<std::uint64_t>(v));
    }
    mix(static_cast<std::uint64_t>(k.direction));
    mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.device)));
    mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.dtype)));
    mix((k.allow_tf32 ? 1u : 0u) | (k.deterministic ? 2u : 0u) | (k.benchmark ? 4u : 0u));
    mix(k.workspace_limit);
    return static_cast<std::size_t>(h);
  }
};

/// How a candidate multiplies, from cuDNN's cudnnMathType_t (cudnn.hpp maps one to the other).
enum class conv2d_math : std::uint8_t {
  fma,           // CUDNN_FMA_MATH: products in the data's precision
  default_math,  // CUDNN_DEFAULT_MATH: tensor cores where the dtype allows (TF32 for float)
  tensor_op,     // CUDNN_TENSOR_OP_MATH
  tensor_op_allow_conversion  // CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: float inputs rounded to half
};

/// The precision a choice must keep: float without TF32 (fp32 products only), float with TF32,
/// or a dtype whose math type cuDNN picks freely (double: never tensor cores; half and bfloat16:
/// tensor cores with float sums).
enum class conv2d_precision : std::uint8_t { fp32_products, tf32_allowed, any };

/// One algorithm cuDNN offers for a call, from its heuristics (in its rank order, untimed) or
/// from timing it (cudnnFind*AlgorithmEx).
struct conv2d_candidate {
  int algorithm = 0;  // cudnnConvolution*Algo_t
  int math = 0;       // cudnnMathType_t, passed back to cuDNN as is
  conv2d_math math_class = conv2d_math::fma;
  bool ok = true;             // cuDNN's status for it was success (and its workspace was known)
  bool deterministic = true;  // CUDNN_DETERMINISTIC
  float milliseconds = -1;    // timed; negative when not
  std::size_t workspace = 0;  // bytes
};

/// What the switches ask of a choice.
struct conv2d_requirements {
  conv2d_precision precision = conv2d_precision::fp32_products;
  bool only_deterministic = false;
  std::size_t workspace_limit = 0;
};

/// Whether a candidate's math keeps the precision asked for: float inputs are never rounded to
/// half, and without TF32 float products are plain FMA.
constexpr bool conv2d_keeps_precision(conv2d_math math, conv2d_precision precision) noexcept {
  switch (precision) {
    case conv2d_precision::fp32_products:
      return math == conv2d_math::fma;
    case conv2d_precision::tf32_allowed:
      return math != conv2d_math::tensor_op_allow_conversion;
    case conv2d_precision::any:
      return true;
  }
  return false;
}

/// The candidate to run, as an index into `candidates`, or -1 when none is acceptable (failed,
/// not deterministic when asked, losing precision, or needing more workspace than the limit).
/// Untimed (`timed` false: the heuristics' list): the first acceptable one in cuDNN's order.
/// Timed: the fastest acceptable one that was timed; on equal times the one with less workspace,
/// then the earlier one.
inline int conv2d_choose_candidate(std::span<const conv2d_candidate> candidates,
                                   const conv2d_requirements& need, bool timed) {
  int best = -1;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const conv2d_candidate& c = candidates[i];
    if (!c.ok || (need.only_deterministic && !c.deterministic) ||
        !conv2d_keeps_precision(c.math_class, need.precision) ||
        c.workspace > need.workspace_limit) {
      continue;
    }
    if (!timed) return static_cast<int>(i);
    if (c.milliseconds < 0) continue;
    if (best < 0) {
      best = static_cast<int>(i);
      continue;
    }
    const conv2d_candidate& b = candidates[static_cast<std::size_t>(best)];
    if (c.milliseconds < b.milliseconds ||
        (c.milliseconds == b.milliseconds && c.workspace < b.workspace)) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

/// The scratch workspace sizes to try, largest first, when timing a call's candidates: every
/// distinct candidate workspace within `limit`, then 0. The caller allocates the first size the
/// device's pool can give (an out-of-memory answer moves to the next) and cuDNN then times only
/// the algorithms whose workspace fits in it (PyTorch's getMaxWorkspaceSize, with its retry).
inline std::vector<std::size_t> conv2d_scratch_sizes(std::span<const std::size_t> workspaces,
                                                     std::size_t limit) {
  std::vector<std::size_t> sizes;
  for (const std::size_t bytes : workspaces) {
    if (bytes > 0 && bytes <= limit) sizes.push_back(bytes);
  }
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  sizes.push_back(0);
  return sizes;
}

/// A table from keys to values made once per key and kept for the process (PyTorch's
/// BenchmarkCache): a value's address never changes, so callers may keep a pointer to it (a
/// traced convolution keeps its calls'). Thread-safe: one lock guards the table, and it is not
/// held while a value is made (timing cuDNN's algorithms takes milliseconds; other keys' lookups
/// go on). Two threads making the same key at once both make it; the first stored is kept and
/// returned to both, the other dropped.
template <class Key, class Value, class Hash = std::hash<Key>>
class process_cache {
 public:
  /// The value of `key`, made by `make()` (returning a Value or a std::unique_ptr<Value>) when
  /// the key is new. An exception from make() leaves nothing stored and propagates.
  template <class Make>
  const Value& get(const Key& key, Make&& make) {
    if (const Value* found = find(key)) return *found;
    std::unique_ptr<Value> made = wrap(std::forward<Make>(make)());
    const std::lock_guard lock(mutex_);
    const auto [it, inserted] = table_.try_emplace(key, std::move(made));
    (void)inserted;
    return *it->second;
  }

  /// The value of `key` if it was made, else nullptr.
  const Value* find(const Key& key) const {
    const std::lock_guard lock(mutex_);
    const auto it = table_.find(key);
    return it == table_.end() ? nullptr : it->second.get();
  }

  std::size_t size() const {
    const std::lock_guard lock(mutex_);
    return table_.size();
  }

 private:
  static std::unique_ptr<Value> wrap(std::unique_ptr<Value> made) { return made; }
  static std::unique_ptr<Value> wrap(Value&& made) {
    return std::make_unique<Value>(std::move(made));
  }

  mutable std::mutex mutex_;
  std::unordered_map<Key, std::unique_ptr<Value>, Hash> table_;
};

}  // namespace tessera::backend::cuda
