// cuDNN for convolutions on CUDA devices: where the build has cuDNN (TESSERA_CUDNN, defined by
// CMake when it finds cuDNN beside the toolkit), the algorithm of each of a convolution's three
// calls, chosen once per problem and kept for the process with the call's descriptors, handles
// per thread, device and stream, and the calls themselves. Without cuDNN, or when it cannot take
// a problem, convolutions on CUDA run as im2col + cuBLAS (nn/detail/conv2d.hpp). The switches
// (torch.backends.cudnn's) are in backend/backends.hpp, in every build.
//
// A call's key (cudnn_cache.hpp: problem, direction, dtype, device, switches) finds its entry,
// built on the first call of that key: an execution plan of cuDNN's graph API (cudnn_plan.hpp),
// its engine ranked first by cuDNN's heuristics or timed fastest when backends::cudnn::benchmark
// is on, finalized once and then only executed (PyTorch's cudnn_frontend path); and the legacy
// API's descriptors and algorithm (cudnn_legacy.hpp: cudnnConvolutionForward, the _v7
// heuristics, cudnnFind*Ex; deprecated in cuDNN 9 but supported), which runs what the plan does
// not take (buffers not 16-byte aligned, a beta or handle no engine takes) and everything when
// no engine takes the problem or backends::cudnn::legacy_api is on. The legacy calls finalize a plan inside every
// call (87-146 us of host time each in a ResNet-50 step on an H100); a kept plan is executed
// with a variant pack kept for its last buffers. A traced convolution keeps pointers to its
// calls' entries, so running a program looks nothing up; an eager call looks its key up once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/backend/backends.hpp"
#include "tessera/backend/cuda/cudnn_cache.hpp"
#include "tessera/backend/cuda/cudnn_check.hpp"
#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/half.hpp"
#include "tessera/core/stream.hpp"

#if TESSERA_CUDNN
#include <cudnn.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "tessera/backend/cuda/cudnn_legacy.hpp"
#include "tessera/backend/cuda/cudnn_plan.hpp"
#include "tessera/core/detail/cuda_device_scope.hpp"
#include "tessera/memory/memory.hpp"
#endif

namespace tessera::backends::cudnn {

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

namespace tessera::backend::cuda {

namespace detail {
/// One call's descriptors and algorithm, built once per key and kept for the process (defined
/// only in a build with cuDNN).
struct conv2d_cudnn_call;
}  // namespace detail

/// What cuDNN runs for one problem on one device: an algorithm and a math type for each of the
/// three calls, the workspace bytes of each, and the process-wide entries holding their
/// descriptors. Chosen once (conv2d_choose) and kept by the caller, so that a program runs what
/// its memory plan was made for and looks nothing up when it runs.
struct conv2d_algorithms {
  /// False: no cuDNN in this build, `enabled` off, a dtype or sizes cuDNN does not take here, or
  /// no algorithm within `workspace_limit`; the caller runs im2col + cuBLAS instead.
  bool usable = false;
  int forward = 0, backward_data = 0, backward_filter = 0;  // cudnnConvolution*Algo_t
  int forward_math = 0, backward_data_math = 0, backward_filter_math = 0;  // cudnnMathType_t
  std::size_t forward_bytes = 0, backward_data_bytes = 0, backward_filter_bytes = 0;
  /// The calls' entries (null for a call not chosen: the backward ones of an eager forward).
  const detail::conv2d_cudnn_call* forward_call = nullptr;
  const detail::conv2d_cudnn_call* backward_data_call = nullptr;
  const detail::conv2d_cudnn_call* backward_filter_call = nullptr;
  /// The engine (cuDNN's global index) of each call's execution plan, made once and executed at
  /// every call; -1 where no plan took the call (or backends::cudnn::legacy_api was on) and the
  /// legacy call (the algorithm above) runs.
  std::int64_t forward_engine = -1, backward_data_engine = -1, backward_filter_engine = -1;
};

/// How many convolution calls ran through kept execution plans and how many through cuDNN's
/// legacy calls, since the process started (all devices and threads).
struct conv2d_cudnn_counts {
  std::int64_t plan = 0;
  std::int64_t legacy = 0;
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

/// The precision a convolution of T must keep under the switch `allow_tf32`.
template <class T>
constexpr conv2d_precision conv2d_precision_of(bool allow_tf32) {
  if constexpr (std::is_same_v<T, float>) {
    return allow_tf32 ? conv2d_precision::tf32_allowed : conv2d_precision::fp32_products;
  } else {
    return conv2d_precision::any;
  }
}

#if TESSERA_CUDNN
namespace detail {

/// The calls run through plans and through the legacy API (conv2d_cudnn_calls()).
inline std::atomic<std::int64_t> conv2d_plan_runs{0}, conv2d_legacy_runs{0};

/// One call's execution plan for one handle and one beta: made when the call first runs with
/// them (the one its choice timed or ranked is stored when the call is built). `plan` null: no
/// engine takes that variant within the call's workspace; the legacy call runs.
struct conv2d_plan_variant {
  cudnnHandle_t handle = nullptr;
  bool accumulate = false;
  std::unique_ptr<conv_plan> plan;
};

/// One call of one problem (a conv2d_key), built once: the execution plan of the engine chosen
/// for it (`engine`, -1 for none: see cudnn_plan.hpp), and for the legacy call its descriptors,
/// with the chosen math type set on the convolution descriptor, and its algorithm. `bytes`: the
/// workspace either needs. `usable` false: neither fits the switches (the caller runs im2col +
/// cuBLAS). cuDNN does not say that two threads may pass one descriptor at once, so a call holds
/// `mutex` (uncontended: one thread per device is the rule, and each device has its own entries);
/// the plans made later, one per handle and beta, are kept under it too.
struct conv2d_cudnn_call {
  conv2d_cudnn_call(const conv2d_problem& p, cudnnDataType_t data, cudnnDataType_t compute,
                    cudnnMathType_t math)
      : d(p, data, compute, math), problem(p), data_type(data), compute_type(compute) {}
  conv2d_descriptors d;
  bool usable = false;
  bool legacy_usable = false;  // the legacy algorithm below was chosen
  int algorithm = 0;
  int math = 0;
  std::size_t bytes = 0;
  conv2d_problem problem;
  cudnnDataType_t data_type, compute_type;
  conv2d_direction direction = conv2d_direction::forward;
  conv2d_requirements need;
  std::int64_t engine = -1;
  mutable std::vector<conv2d_plan_variant> plans;
  mutable std::mutex mutex;
};

/// A plan of `call` for the handle and beta (made from cuDNN's heuristics for that graph: the
/// call's engine first, else the first acceptable one), or nullptr when none fits the call's
/// workspace. The caller holds call.mutex.
inline conv_plan* conv2d_plan_for(const conv2d_cudnn_call& call, cudnnHandle_t handle,
                                  bool accumulate) {
  for (conv2d_plan_variant& v : call.plans) {
    if (v.handle == handle && v.accumulate == accumulate) return v.plan.get();
  }
  conv2d_plan_variant v{handle, accumulate, nullptr};
  try {
    auto graph = std::make_shared<const conv_graph>(make_conv_graph(
        handle, call.problem, call.direction, call.data_type, call.compute_type,
        accumulate ? 1.0 : 0.0));
    std::vector<conv_engine_config> configs = conv_engine_configs(*graph, CUDNN_HEUR_MODE_A);
    for (const bool same_engine : {true, false}) {
      for (conv_engine_config& c : configs) {
        if (!c.config || (same_engine && c.engine != call.engine) ||
            !conv_engine_acceptable(c, call.need)) {
          continue;
        }
        std::unique_ptr<conv_plan> plan = conv_finalize_plan(handle, graph, std::move(c));
        if (plan && plan->workspace <= call.bytes) {
          v.plan = std::move(plan);
          break;
        }
      }
      if (v.plan) break;
    }
  } catch (const cuda_error&) {
    v.plan.reset();  // the graph API refuses this variant: the legacy call runs it
  }
  call.plans.push_back(std::move(v));
  return call.plans.back().plan.get();
}

/// Every call chosen so far, for the process; leaked on purpose (a descriptor's destruction at
/// exit could follow cuDNN's).
inline process_cache<conv2d_key, conv2d_cudnn_call, conv2d_key_hash>& conv2d_calls() {
  static auto* calls = new process_cache<conv2d_key, conv2d_cudnn_call, conv2d_key_hash>;
  return *calls;
}

/// cuDNN handles per (thread, device, stream), as the cuBLAS handles (gemm.hpp): one handle is
/// never used by two threads at once, and is bound to one stream. Created on first use with the
/// device current, never destroyed (the CUDA runtime may be gone at exit).
class cudnn_handles {
 public:
  /// Calls fn(handle) with the calling thread's handle for `device` (an ordinal checked by the
  /// caller) and `stream`, the device current.
  template <class Fn>
  static void with_handle(int device, stream_ref stream, Fn&& fn) {
    ::tessera::detail::cuda_device_scope scope(device);
    fn(handle(device, stream));
  }

 private:
  static cudnnHandle_t handle(int device, stream_ref stream) {
    // The last handle the thread used: a training step calls with one device and stream.
    struct last_handle {
      int device = -1;
      void* stream = nullptr;
      cudnnHandle_t handle = nullptr;
    };
    thread_local last_handle last;
    if (last.handle != nullptr && last.device == device && last.stream == stream.handle) {
      return last.handle;
    }
    thread_local std::map<std::pair<int, void*>, cudnnHandle_t> handles;
    cudnnHandle_t& handle = handles[{device, stream.handle}];
    if (handle == nullptr) {
      cudnnHandle_t created = nullptr;
      TESSERA_CUDNN_CHECK(cudnnCreate(&created));
      TESSERA_CUDNN_CHECK(cudnnSetStream(created, stream.native()));
      handle = created;
    }
    last = {device, stream.handle, handle};
    return handle;
  }
};

/// The calling thread's current stream of CUDA device `device`, read without copying a Stream
/// (no reference counting): where the convolution's neighbours (the executor's kernels, cuBLAS)
/// run.
inline stream_ref cudnn_stream(int device) {
  const std::vector<Stream>& streams = ::tessera::detail::thread_current_streams().cuda;
  const auto i = static_cast<std::size_t>(device);
  return i < streams.size() ? streams[i].ref() : stream_ref{};
}

/// Times plans on the timing buffers (backends::cudnn::benchmark): each executed once to warm up,
/// then three times between two events; a plan whose workspace the pool cannot give, or which
/// fails to run, is left out. The index of the fastest (on equal times the one with less
/// workspace, then the earlier), or -1 when none could be timed.
inline int cudnn_time_plans(cudnnHandle_t h, std::vector<std::unique_ptr<conv_plan>>& plans,
                            int device, stream_ref stream, cudnn_timing_buffers& buffers) {
  void *x = nullptr, *w = nullptr, *y = nullptr;
  try {
    std::tie(x, w, y) = buffers.get();
  } catch (const out_of_memory_error&) {
    return -1;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  TESSERA_CUDA_CHECK(cudaEventCreate(&start));
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  }
  int best = -1;
  float best_ms = 0;
  try {
    for (std::size_t i = 0; i < plans.size(); ++i) {
      conv_plan& p = *plans[i];
      std::unique_ptr<cudnn_scratch> scratch;
      if (p.workspace > 0) {
        try {
          scratch = std::make_unique<cudnn_scratch>(device, stream, p.workspace);
        } catch (const out_of_memory_error&) {
          continue;
        }
      }
      void* ws = scratch ? scratch->data() : nullptr;
      try {
        conv_execute(h, p, x, w, y, ws);
      } catch (const cuda_error&) {
        continue;  // an engine that finalized but does not run this problem
      }
      constexpr int runs = 3;
      TESSERA_CUDA_CHECK(cudaEventRecord(start, stream.native()));
      for (int r = 0; r < runs; ++r) conv_execute(h, p, x, w, y, ws);
      TESSERA_CUDA_CHECK(cudaEventRecord(stop, stream.native()));
      TESSERA_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      ms /= runs;
      const conv_plan* b = best < 0 ? nullptr : plans[static_cast<std::size_t>(best)].get();
      if (b == nullptr || ms < best_ms || (ms == best_ms && p.workspace < b->workspace)) {
        best = static_cast<int>(i);
        best_ms = ms;
      }
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

/// The execution plan of the call of `key` (beta 0, this handle): in benchmark mode the fastest
/// of the acceptable engines the heuristics offer (up to 12 timed), else the first acceptable
/// one in the heuristics' order, within the workspace limit; nullptr when none (or when cuDNN's
/// graph API does not take the problem: the legacy call runs it).
template <class T, conv2d_direction D>
std::unique_ptr<conv_plan> cudnn_choose_plan(cudnnHandle_t h, const conv2d_key& key,
                                             const conv2d_requirements& need, stream_ref stream,
                                             cudnn_timing_buffers& buffers) {
  try {
    auto graph = std::make_shared<const conv_graph>(make_conv_graph(
        h, key.problem, D, cudnn_data_type<T>(), cudnn_compute_type<T>(), 0.0));
    std::vector<conv_engine_config> configs = conv_engine_configs(*graph, CUDNN_HEUR_MODE_A);
    constexpr std::size_t most_timed = 12;
    std::vector<std::unique_ptr<conv_plan>> plans;
    for (conv_engine_config& c : configs) {
      if (!c.config || !conv_engine_acceptable(c, need)) continue;
      std::unique_ptr<conv_plan> plan = conv_finalize_plan(h, graph, std::move(c));
      if (!plan || plan->workspace > need.workspace_limit) continue;
      if (!key.benchmark) return plan;
      plans.push_back(std::move(plan));
      if (plans.size() == most_timed) break;
    }
    if (plans.empty()) return nullptr;
    const int best = cudnn_time_plans(h, plans, key.device, stream, buffers);
    // Nothing could be timed: the heuristics' first.
    return std::move(plans[static_cast<std::size_t>(std::max(best, 0))]);
  } catch (const cuda_error&) {
    return nullptr;
  }
}

/// Builds the call of `key`: the execution plan of its engine (cudnn_choose_plan), and the legacy
/// call's descriptors and algorithm, which runs what no plan takes (pointers not aligned as the
/// plans ask, a beta or handle no engine takes) or everything when no plan was made. The legacy
/// algorithm is the timed fastest in benchmark mode when there is no plan (falling back to the
/// heuristics when timing could not run or timed nothing acceptable), else the heuristics'
/// first that keeps the precision, is deterministic when asked and fits the workspace limit —
/// with a plan, preferably within the plan's workspace.
template <class T, conv2d_direction D>
std::unique_ptr<conv2d_cudnn_call> cudnn_make_call(cudnnHandle_t h, const conv2d_key& key,
                                                   stream_ref stream,
                                                   cudnn_timing_buffers& buffers) {
  using dir = cudnn_direction<D>;
  const conv2d_problem& p = key.problem;
  const cudnnMathType_t requested = cudnn_requested_math<T>(key.allow_tf32);
  auto call = std::make_unique<conv2d_cudnn_call>(p, cudnn_data_type<T>(), cudnn_compute_type<T>(),
                                                  requested);
  const conv2d_descriptors& d = call->d;
  const auto [n, o, oh, ow] = d.output_dims();
  if (n != p.n || o != p.o || oh != p.oh || ow != p.ow) {
    throw error("conv2d: internal error: cuDNN's output [" + std::to_string(n) + ", " +
                std::to_string(o) + ", " + std::to_string(oh) + ", " + std::to_string(ow) +
                "] differs from Tessera's [" + std::to_string(p.n) + ", " + std::to_string(p.o) +
                ", " + std::to_string(p.oh) + ", " + std::to_string(p.ow) + "]");
  }
  const conv2d_requirements need{conv2d_precision_of<T>(key.allow_tf32), key.deterministic,
                                 key.workspace_limit};
  call->direction = D;
  call->need = need;
  std::unique_ptr<conv_plan> plan;
  if (!backends::cudnn::legacy_api.load()) {
    plan = cudnn_choose_plan<T, D>(h, key, need, stream, buffers);
  }

  // The legacy call: `limit` is the workspace it may take.
  auto choose_legacy = [&](std::size_t limit, bool timed) -> bool {
    const conv2d_requirements within{need.precision, need.only_deterministic, limit};
    std::vector<conv2d_candidate> candidates;
    int chosen = -1;
    if (timed) {
      candidates = cudnn_timed_candidates<D>(h, d, key.device, stream, buffers, limit);
      chosen = conv2d_choose_candidate(candidates, within, true);
    }
    if (chosen < 0) {  // not timed, or nothing timed was acceptable: the heuristics
      TESSERA_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, requested));
      typename dir::perf_t perf[dir::count];
      int count = 0;
      TESSERA_CUDNN_CHECK(dir::heuristics(h, d, &count, perf));
      candidates = cudnn_candidates<D>(h, d, perf, count, false);
      chosen = conv2d_choose_candidate(candidates, within, false);
    }
    if (chosen < 0) return false;
    const conv2d_candidate& c = candidates[static_cast<std::size_t>(chosen)];
    // The call runs with the candidate's math type set on its descriptor (PyTorch's Note
    // [behavior of cudnnFind and cudnnGet]), and its workspace is asked again with it.
    TESSERA_CUDNN_CHECK(
        cudnnSetConvolutionMathType(d.conv, static_cast<cudnnMathType_t>(c.math)));
    std::size_t bytes = 0;
    TESSERA_CUDNN_CHECK(
        dir::workspace(h, d, static_cast<typename dir::algo_t>(c.algorithm), &bytes));
    bytes = std::max(bytes, c.workspace);
    if (bytes > limit) return false;
    call->legacy_usable = true;
    call->algorithm = c.algorithm;
    call->math = c.math;
    call->bytes = bytes;
    return true;
  };
  if (plan) {
    if (!choose_legacy(plan->workspace, false)) choose_legacy(key.workspace_limit, false);
    call->engine = plan->engine;
    call->bytes = std::max(call->bytes, plan->workspace);
    call->plans.push_back({h, false, std::move(plan)});
    call->usable = true;
  } else {
    call->usable = choose_legacy(key.workspace_limit, key.benchmark);
  }
  return call;
}

/// alpha and beta in the compute type's precision (double for double data, float otherwise).
template <class T>
using cudnn_scale_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

}  // namespace detail
#endif

/// The algorithms cuDNN runs for problem p of dtype T on CUDA device `device`, under the current
/// switches (backends::cudnn): all three calls, or with `with_backward` false only the forward
/// (an eager call). Each call's entry is built the first time its key (cudnn_cache.hpp) is seen
/// and kept for the process: descriptors created once, the algorithm from cuDNN's heuristics or,
/// with backends::cudnn::benchmark, from timing the candidates (once per key; it synchronises
/// the device). Unusable (`usable` false) where cuDNN does not take the problem or a call has no
/// algorithm within the switches. Throws cuda_error when cuDNN itself fails, device_error for an
/// ordinal that does not exist.
template <class T>
conv2d_algorithms conv2d_choose(int device, const conv2d_problem& p, bool with_backward = true) {
#if TESSERA_CUDNN
  if constexpr (conv2d_cudnn_supports<T>) {
    if (!backends::cudnn::enabled.load() || !conv2d_fits_cudnn(p) || p.n == 0 || p.c == 0 ||
        p.o == 0) {
      return {};
    }
    check_device(Device{DeviceType::cuda, device});
    conv2d_key key;
    key.problem = p;
    key.device = device;
    key.dtype = static_cast<int>(detail::cudnn_data_type<T>());
    key.allow_tf32 = std::is_same_v<T, float> && backends::cudnn::allow_tf32.load();
    key.deterministic = backends::cudnn::deterministic.load();
    key.benchmark = backends::cudnn::benchmark.load();
    key.workspace_limit = backends::cudnn::workspace_limit.load();
    const stream_ref stream = detail::cudnn_stream(device);
    detail::cudnn_timing_buffers buffers(device, stream, p, sizeof(T));
    auto entry = [&]<conv2d_direction D>() -> const detail::conv2d_cudnn_call& {
      key.direction = D;
      return detail::conv2d_calls().get(key, [&] {
        std::unique_ptr<detail::conv2d_cudnn_call> made;
        detail::cudnn_handles::with_handle(device, stream, [&](cudnnHandle_t h) {
          made = detail::cudnn_make_call<T, D>(h, key, stream, buffers);
        });
        return made;
      });
    };
    conv2d_algorithms a;
    const detail::conv2d_cudnn_call& f = entry.template operator()<conv2d_direction::forward>();
    if (!f.usable) return {};
    a.forward = f.algorithm, a.forward_math = f.math, a.forward_bytes = f.bytes;
    a.forward_call = &f;
    a.forward_engine = f.engine;
    if (with_backward) {
      const detail::conv2d_cudnn_call& bd =
          entry.template operator()<conv2d_direction::backward_data>();
      const detail::conv2d_cudnn_call& bf =
          entry.template operator()<conv2d_direction::backward_filter>();
      if (!bd.usable || !bf.usable) return {};
      a.backward_data = bd.algorithm, a.backward_data_math = bd.math;
      a.backward_data_bytes = bd.bytes, a.backward_data_call = &bd;
      a.backward_filter = bf.algorithm, a.backward_filter_math = bf.math;
      a.backward_filter_bytes = bf.bytes, a.backward_filter_call = &bf;
      a.backward_data_engine = bd.engine, a.backward_filter_engine = bf.engine;
    }
    a.usable = true;
    return a;
  }
#endif
  (void)device, (void)p, (void)with_backward;
  return {};
}

#if TESSERA_CUDNN
namespace detail {
/// Runs a chosen call on the device's current stream, holding the call: its execution plan for
/// this handle and beta when the pointers have the plans' alignment (x, w, y as the plan names
/// them: for the input gradient x is dx and y is dy, for the weight gradient w is dw), else
/// `legacy(handle, call)`.
template <class Legacy>
void cudnn_run(int device, const conv2d_cudnn_call* call, const char* what, bool accumulate,
               const void* x, const void* w, const void* y, void* workspace, Legacy&& legacy) {
  if (call == nullptr || !call->usable) {
    throw error(std::string("conv2d: internal error: cuDNN's ") + what + " was not chosen");
  }
  cudnn_handles::with_handle(device, cudnn_stream(device), [&](cudnnHandle_t h) {
    const std::lock_guard lock(call->mutex);
    if (call->engine >= 0 && !backends::cudnn::legacy_api.load() &&
        conv_plan_aligned(x, w, y, workspace)) {
      if (conv_plan* plan = conv2d_plan_for(*call, h, accumulate)) {
        conv_execute(h, *plan, x, w, y, workspace);
        conv2d_plan_runs.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    if (!call->legacy_usable) {
      const conv2d_problem& p = call->problem;
      throw error(std::string("conv2d: cuDNN's ") + what + " of input [" + std::to_string(p.n) +
                  ", " + std::to_string(p.c) + ", " + std::to_string(p.h) + ", " +
                  std::to_string(p.w) + "] has an execution plan only for 16-byte aligned " +
                  "buffers and beta 0, and no legacy algorithm within the workspace limit");
    }
    legacy(h, *call);
    conv2d_legacy_runs.fetch_add(1, std::memory_order_relaxed);
  });
}
}  // namespace detail

/// How many convolution calls ran through kept execution plans and through the legacy calls.
inline conv2d_cudnn_counts conv2d_cudnn_calls() noexcept {
  return {detail::conv2d_plan_runs.load(std::memory_order_relaxed),
          detail::conv2d_legacy_runs.load(std::memory_order_relaxed)};
}

/// y = conv2d(x, w) with the chosen forward plan or algorithm, on the device's current stream;
/// x, w, y dense on `device`, all NCHW or all NHWC (p.channels_last), `workspace` at least
/// a.forward_bytes.
template <class T>
void conv2d_forward(int device, const conv2d_problem& p, const conv2d_algorithms& a, const T* x,
                    const T* w, T* y, void* workspace) {
  (void)p;  // the entry holds it
  detail::cudnn_run(device, a.forward_call, "forward", false, x, w, y, workspace,
                    [&](cudnnHandle_t h, const auto& c) {
                      const detail::cudnn_scale_t<T> alpha = 1, beta = 0;
                      TESSERA_CUDNN_CHECK(cudnnConvolutionForward(
                          h, &alpha, c.d.x, x, c.d.w, w, c.d.conv,
                          static_cast<cudnnConvolutionFwdAlgo_t>(c.algorithm), workspace, c.bytes,
                          &beta, c.d.y, y));
                    });
}

/// dx = (or, with `accumulate`, dx +=) the input gradient of y = conv2d(x, w) for gy.
template <class T>
void conv2d_backward_data(int device, const conv2d_problem& p, const conv2d_algorithms& a,
                          const T* gy, const T* w, T* dx, bool accumulate, void* workspace) {
  (void)p;
  detail::cudnn_run(device, a.backward_data_call, "input gradient", accumulate, dx, w, gy,
                    workspace, [&](cudnnHandle_t h, const auto& c) {
                      const detail::cudnn_scale_t<T> alpha = 1, beta = accumulate ? 1 : 0;
                      TESSERA_CUDNN_CHECK(cudnnConvolutionBackwardData(
                          h, &alpha, c.d.w, w, c.d.y, gy, c.d.conv,
                          static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algorithm), workspace,
                          c.bytes, &beta, c.d.x, dx));
                    });
}

/// dw = (or, with `accumulate`, dw +=) the weight gradient of y = conv2d(x, w) for gy.
template <class T>
void conv2d_backward_filter(int device, const conv2d_problem& p, const conv2d_algorithms& a,
                            const T* x, const T* gy, T* dw, bool accumulate, void* workspace) {
  (void)p;
  detail::cudnn_run(device, a.backward_filter_call, "weight gradient", accumulate, x, dw, gy,
                    workspace, [&](cudnnHandle_t h, const auto& c) {
                      const detail::cudnn_scale_t<T> alpha = 1, beta = accumulate ? 1 : 0;
                      TESSERA_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
                          h, &alpha, c.d.x, x, c.d.y, gy, c.d.conv,
                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algorithm), workspace,
                          c.bytes, &beta, c.d.w, dw));
                    });
}
#endif

}  // namespace tessera::backend::cuda
