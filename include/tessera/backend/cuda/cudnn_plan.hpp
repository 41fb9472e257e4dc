// cuDNN's graph API (the "backend" API of cudnn_graph.h) for one convolution call: an execution
// plan finalized once and then only executed. The legacy calls (cudnnConvolutionForward and its
// two siblings) build and finalize such a plan inside every call — in cuDNN 9.14 on an H100,
// 87-146 us of host time per call in a ResNet-50 step, 72 % of the step's host time (host_time
// samples, 2026-11-27) — so a program whose convolutions run through kept plans issues its step
// several times faster. PyTorch runs its convolutions the same way (cudnn_frontend plans kept in
// a cache).
//
// What is here: descriptors that destroy themselves, the operation graph of one call (tensors,
// convolution, the operation with its alpha and beta, the graph), the engine configurations
// cuDNN's heuristics rank, what each is (precision, determinism, runtime compilation), plans
// finalized from them, timing them (backends::cudnn::benchmark) and executing one with a kept
// variant pack. backend/cuda/cudnn.hpp chooses with these and falls back to the legacy call for
// what no plan takes. Empty in a build without cuDNN.
#pragma once

#include "tessera/backend/cuda/cudnn_check.hpp"

#if TESSERA_CUDNN
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "tessera/backend/cuda/cudnn_cache.hpp"

namespace tessera::backend::cuda::detail {

/// One cuDNN graph-API descriptor, destroyed with the object.
class graph_descriptor {
 public:
  graph_descriptor() = default;
  explicit graph_descriptor(cudnnBackendDescriptorType_t type) {
    TESSERA_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  graph_descriptor(graph_descriptor&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  graph_descriptor& operator=(graph_descriptor&& other) noexcept {
    if (this != &other) {
      reset();
      d_ = std::exchange(other.d_, nullptr);
    }
    return *this;
  }
  graph_descriptor(const graph_descriptor&) = delete;
  graph_descriptor& operator=(const graph_descriptor&) = delete;
  ~graph_descriptor() { reset(); }

  cudnnBackendDescriptor_t get() const noexcept { return d_; }
  explicit operator bool() const noexcept { return d_ != nullptr; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count,
           const void* values) {
    TESSERA_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  }
  void set(cudnnBackendAttributeName_t name, const graph_descriptor& value) {
    const cudnnBackendDescriptor_t raw = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  void set_int64(cudnnBackendAttributeName_t name, std::int64_t value) {
    set(name, CUDNN_TYPE_INT64, 1, &value);
  }
  void finalize() { TESSERA_CUDNN_CHECK(cudnnBackendFinalize(d_)); }
  /// Finalizes; false (nothing thrown) when cuDNN refuses: an engine that does not take the
  /// problem is an ordinary answer.
  bool try_finalize() noexcept { return cudnnBackendFinalize(d_) == CUDNN_STATUS_SUCCESS; }

 private:
  void reset() noexcept {
    // Destroying a descriptor frees host memory only; a failure is not actionable.
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
    d_ = nullptr;
  }
  cudnnBackendDescriptor_t d_ = nullptr;
};

/// The unique ids of a convolution's three tensors in its graph and its variant packs.
enum : std::int64_t { conv_uid_x = 1, conv_uid_w = 2, conv_uid_y = 3 };

/// The byte alignment a plan is made for: every pointer it runs on must have it (Tessera's pool
/// blocks, plan arenas and workspaces are 256-byte aligned; a view at an odd offset runs the
/// legacy call instead).
inline constexpr std::int64_t conv_plan_alignment = 16;

/// The strides of a dense 4-d tensor of logical dims [N, C, H, W]: NCHW's, or NHWC's
/// (channels_last: the channel innermost) when `channels_last`.
inline std::array<std::int64_t, 4> conv_strides(const std::array<std::int64_t, 4>& dims,
                                                bool channels_last) {
  if (channels_last) return {dims[1] * dims[2] * dims[3], 1, dims[3] * dims[1], dims[1]};
  return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
}

/// A dense tensor descriptor of logical dims [N, C, H, W], laid out NCHW or NHWC.
inline graph_descriptor conv_tensor(std::int64_t uid, cudnnDataType_t type,
                                    const std::array<std::int64_t, 4>& dims, bool channels_last) {
  graph_descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::array<std::int64_t, 4> strides = conv_strides(dims, channels_last);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  t.set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t.set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, conv_plan_alignment);
  t.finalize();
  return t;
}

/// The operation graph of one call of problem p: y = conv(x, w) (forward), dx = f(w, dy)
/// (backward data) or dw = f(x, dy) (backward filter), each as alpha * result + beta * out.
/// Groups are the input's channels over the weight's (cuDNN reads them from the shapes).
struct conv_graph {
  graph_descriptor x, w, y, conv, op, graph;
};

inline conv_graph make_conv_graph(cudnnHandle_t handle, const conv2d_problem& p,
                                  conv2d_direction direction, cudnnDataType_t data,
                                  cudnnDataType_t compute, double beta) {
  conv_graph g;
  // x, w and y in one layout (PyTorch gives cuDNN all three in the input's suggested format).
  g.x = conv_tensor(conv_uid_x, data, {p.n, p.c, p.h, p.w}, p.channels_last);
  g.w = conv_tensor(conv_uid_w, data, {p.o, p.c / p.groups, p.kh, p.kw}, p.channels_last);
  g.y = conv_tensor(conv_uid_y, data, {p.n, p.o, p.oh, p.ow}, p.channels_last);
  g.conv = graph_descriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t spatial = 2;
  const std::array<std::int64_t, 2> dilation{p.dh, p.dw}, stride{p.sh, p.sw}, padding{p.ph, p.pw};
  g.conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  g.conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  g.conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  g.conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation.data());
  g.conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride.data());
  g.conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, padding.data());
  g.conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, padding.data());
  g.conv.finalize();
  // alpha and beta in double for double sums, in float otherwise (as the legacy calls take them).
  const bool in_double = compute == CUDNN_DATA_DOUBLE;
  const double alpha64 = 1.0, beta64 = beta;
  const float alpha32 = 1.0f, beta32 = static_cast<float>(beta);
  const cudnnBackendAttributeType_t scale = in_double ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  const void* alpha = in_double ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta_value = in_double ? static_cast<const void*>(&beta64) : &beta32;
  // The operation of each direction and its attributes, in the order x, w, y (as the call names
  // its tensors: dx for the input gradient, dw for the weight gradient), conv, alpha, beta.
  struct operation {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  static constexpr operation operations[] = {
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
  };
  static_assert(static_cast<int>(conv2d_direction::forward) == 0 &&
                    static_cast<int>(conv2d_direction::backward_data) == 1 &&
                    static_cast<int>(conv2d_direction::backward_filter) == 2,
                "make_conv_graph: operations[] follows conv2d_direction's order");
  const operation& o = operations[static_cast<int>(direction)];
  g.op = graph_descriptor(o.type);
  g.op.set(o.x, g.x);
  g.op.set(o.w, g.w);
  g.op.set(o.y, g.y);
  g.op.set(o.conv, g.conv);
  g.op.set(o.alpha, scale, 1, alpha);
  g.op.set(o.beta, scale, 1, beta_value);
  g.op.finalize();
  g.graph = graph_descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const cudnnBackendDescriptor_t ops = g.op.get();
  g.graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ops);
  g.graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  g.graph.finalize();
  return g;
}

/// One engine configuration cuDNN's heuristics offered, with what its engine's notes say.
struct conv_engine_config {
  graph_descriptor config;
  std::int64_t engine = -1;  // the engine's global index
  conv2d_math math = conv2d_math::fma;
  bool deterministic = true;
  // Never used: compiled with NVRTC when finalized (seconds), or its engine or notes could not
  // be read.
  bool excluded = false;
};

/// The engine configurations the heuristics of `mode` rank for the graph, best first; empty
/// when the mode offers none.
inline std::vector<conv_engine_config> conv_engine_configs(const conv_graph& g,
                                                           cudnnBackendHeurMode_t mode) {
  graph_descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g.graph);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (!heuristics.try_finalize()) return {};
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0) {
    return {};
  }
  std::vector<conv_engine_config> configs(static_cast<std::size_t>(count));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (conv_engine_config& c : configs) {
    c.config = graph_descriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(c.config.get());
  }
  std::int64_t returned = 0;
  TESSERA_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                                               raw.data()));
  configs.resize(static_cast<std::size_t>(std::max<std::int64_t>(0, std::min(returned, count))));
  for (conv_engine_config& c : configs) {
    graph_descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t engine_raw = engine.get();
    std::int64_t n = 0;
    if (cudnnBackendGetAttribute(c.config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                 &engine_raw) != CUDNN_STATUS_SUCCESS) {
      c.excluded = true;
      continue;
    }
    cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                             &n, &c.engine);
    std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
    std::int64_t note_count = 0;
    if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                                 &note_count, notes.data()) != CUDNN_STATUS_SUCCESS) {
      c.excluded = true;
      continue;
    }
    for (std::int64_t i = 0; i < note_count; ++i) {
      switch (notes[static_cast<std::size_t>(i)]) {
        case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
          c.math = conv2d_math::tensor_op_allow_conversion;
          break;
        case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
          if (c.math == conv2d_math::fma) c.math = conv2d_math::tensor_op;
          break;
        case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
          c.deterministic = false;
          break;
        default:
          break;
      }
    }
    std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behaviour{};
    std::int64_t behaviour_count = 0;
    if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                                 CUDNN_TYPE_BEHAVIOR_NOTE, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT,
                                 &behaviour_count, behaviour.data()) == CUDNN_STATUS_SUCCESS) {
      for (std::int64_t i = 0; i < behaviour_count; ++i) {
        if (behaviour[static_cast<std::size_t>(i)] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) {
          c.excluded = true;
        }
      }
    }
  }
  return configs;
}

/// Whether the float data's math keeps the precision asked for: conv2d_math as the notes say,
/// where a tensor-core engine of float data multiplies in TF32.
inline bool conv_engine_acceptable(const conv_engine_config& c, const conv2d_requirements& need) {
  return !c.excluded && c.engine >= 0 && (!need.only_deterministic || c.deterministic) &&
         conv2d_keeps_precision(c.math, need.precision);
}

/// A finalized plan with what it was made from (the descriptors it refers to live as long as it)
/// and its last variant pack: a traced convolution runs on the same buffers every step, so the
/// pack is made once and executed again.
struct conv_plan {
  std::shared_ptr<const conv_graph> graph;
  graph_descriptor config;
  graph_descriptor plan;
  std::int64_t engine = -1;
  std::size_t workspace = 0;
  // The kept variant pack and the pointers it holds (x, w, y, workspace).
  graph_descriptor pack;
  std::array<void*, 4> pointers{};
};

/// Finalizes a plan of `config` for graph g; nullptr when cuDNN does not take it.
inline std::unique_ptr<conv_plan> conv_finalize_plan(cudnnHandle_t handle,
                                                     std::shared_ptr<const conv_graph> g,
                                                     conv_engine_config&& config) {
  auto p = std::make_unique<conv_plan>();
  p->plan = graph_descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  p->plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  p->plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config.config);
  if (!p->plan.try_finalize()) return nullptr;
  std::int64_t bytes = 0, n = 0;
  if (cudnnBackendGetAttribute(p->plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                               CUDNN_TYPE_INT64, 1, &n, &bytes) != CUDNN_STATUS_SUCCESS ||
      bytes < 0) {
    return nullptr;
  }
  p->workspace = static_cast<std::size_t>(bytes);
  p->engine = config.engine;
  p->config = std::move(config.config);
  p->graph = std::move(g);
  return p;
}

/// Executes plan p on x, w, y (the call's three tensors: for backward data x is dx and y is dy,
/// for backward filter w is dw) with `workspace`, on the handle's stream. The variant pack is
/// rebuilt only when a pointer changed.
inline void conv_execute(cudnnHandle_t handle, conv_plan& p, const void* x, const void* w,
                         const void* y, void* workspace) {
  const std::array<void*, 4> pointers{const_cast<void*>(x), const_cast<void*>(w),
                                      const_cast<void*>(y), workspace};
  if (!p.pack || pointers != p.pointers) {
    graph_descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    const std::array<std::int64_t, 3> uids{conv_uid_x, conv_uid_w, conv_uid_y};
    void* data[3] = {pointers[0], pointers[1], pointers[2]};
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, data);
    pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    pack.finalize();
    p.pack = std::move(pack);
    p.pointers = pointers;
  }
  TESSERA_CUDNN_CHECK(cudnnBackendExecute(handle, p.plan.get(), p.pack.get()));
}

/// True when every pointer has the alignment plans are made for (null: no workspace).
inline bool conv_plan_aligned(const void* x, const void* w, const void* y,
                              const void* workspace) noexcept {
  const auto bits = reinterpret_cast<std::uintptr_t>(x) | reinterpret_cast<std::uintptr_t>(w) |
                    reinterpret_cast<std::uintptr_t>(y) |
                    reinterpret_cast<std::uintptr_t>(workspace);
  return bits % static_cast<std::uintptr_t>(conv_plan_alignment) == 0;
}

}  // namespace tessera::backend::cuda::detail
#endif  // TESSERA_CUDNN
