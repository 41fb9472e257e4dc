// CUDA graph replay of a compiled program (Options::cuda_graph): the program's forward and
// backward run on a stream of their own; the first run of each is an ordinary run (warm-up:
// cuDNN plans, library handles, gradients are made), the second is captured into a CUDA graph
// with its allocations in a private pool (memory::MemPool), and later runs replay the graph.
// Before each replay the host does what a graph cannot: copy the inputs into the program's own
// buffers, the nodes' host checks (prepare_replay: cross_entropy's targets), the gradients'
// bookkeeping, and the seed and first counter block of the graph's random fills (dropout's
// masks), written into device memory the captured kernels read; a replay whose key differs (the
// nodes' choices, the parameters' and gradients' addresses, the accumulation flags, the
// backward's seed) captures again. What cannot be replayed runs as usual, and
// cuda_graph_status() says why.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/autograd/detail/program_state.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/random.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/tensor.hpp"

#if TESSERA_CUDA
#include "tessera/backend/cuda/graph.hpp"
#include "tessera/memory/mem_pool.hpp"
#endif

namespace tessera::autograd::detail {

#if TESSERA_CUDA
/// A captured graph and the counter blocks of the device's generator its random fills take at
/// each launch (Generator::begin_graph_capture).
struct replay_graph {
  backend::cuda::captured_graph graph;
  std::uint64_t random_blocks = 0;
};
#endif

/// A program's graphs and what their replays need.
struct graph_replay {
  std::string fallback;       // why the program runs without graphs; empty while it may use them
  bool forward_warm = false;  // the first forward (and backward) ran as usual
  bool backward_warm = false;
  bool forward_graphed = false;  // this run's forward was a graph (its backward may be one too)
  int captures = 0;
  int launches = 0;
#if TESSERA_CUDA
  std::optional<Stream> stream;
  std::optional<memory::MemPool> pool;
  std::vector<AnyTensor> static_inputs;
  AnyTensor static_seed;
  // {seed, base offset} of the graphs' random fills, written before each launch that draws.
  Tensor<std::int64_t, cuda> random_state;
  backend::cuda::pinned_pair_writer random_writer;
  std::vector<std::int64_t> forward_key;
  replay_graph forward;
  std::map<std::vector<std::int64_t>, replay_graph> backward;

  graph_replay() = default;
  graph_replay(const graph_replay&) = delete;
  graph_replay& operator=(const graph_replay&) = delete;
  /// The graphs' last launches finish before their private pool gives its memory back.
  ~graph_replay() {
    if (stream) {
      try {
        stream->synchronize();
      } catch (...) {  // a device error is reported by the next call that checks
      }
    }
  }
#endif
};

#if TESSERA_DEFINITIONS
namespace graph_detail {

/// Why no graph can run this program at all, or "" (checked at each run: hooks come and go).
inline std::string program_blocker(const program_state& s) {
  const Device device = s.g->values.front().device;
  for (const value_info& v : s.g->values) {
    if (v.device != device || !v.device.is_cuda()) return "the program is not on one CUDA device";
  }
  if (!s.hooks.empty()) return "gradient hooks (on_gradient_ready runs host code in backward)";
  if (s.table.product_hook) return "a parameter-product hook (on_parameter_product)";
  return "";
}

/// The first node of the forward whose forward a replay cannot run, or nullptr.
inline const char* node_blocker(const program_state& s) {
  for (const step& st : s.schedule) {
    if (st.kind != step::forward) continue;
    if (const char* why = s.g->nodes[static_cast<std::size_t>(st.node)]->capture_blocker()) {
      return why;
    }
  }
  return nullptr;
}

inline void append_address(std::vector<std::int64_t>& key, const AnyTensor& t) {
  key.push_back(static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(t.data_ptr())));
}

/// Sets table.capturing for a scope.
struct capturing_scope {
  value_table& table;
  explicit capturing_scope(value_table& t) : table(t) { table.capturing = true; }
  ~capturing_scope() { table.capturing = false; }
};

#if TESSERA_CUDA
/// Captures `work` (queued on the program's stream) into `target`, this thread's fills from the
/// device's generator reading their seed and base offset from r.random_state (allocated here
/// once, outside the private pool, so its address stays fixed).
template <class Work>
void capture_into(graph_replay& r, replay_graph& target, Device device, Work&& work) {
  if (!r.random_state.defined()) {
    r.random_state = Tensor<std::int64_t, cuda>::empty_on(Shape{2}, device);
  }
  Generator& generator = default_generator(device);
  memory::use_mem_pool in_private_pool(*r.pool);
  generator.begin_graph_capture(reinterpret_cast<const std::uint64_t*>(r.random_state.data()));
  try {
    target.graph = backend::cuda::captured_graph::capture(r.stream->ref(), work);
  } catch (...) {
    (void)generator.end_graph_capture();
    throw;
  }
  target.random_blocks = generator.end_graph_capture();
}

/// After a forward or backward that threw: the user's stream waits for what the program's stream
/// was given (the inputs' copies may still be reading the user's tensors), reporting nothing
/// (the first exception is the one to see).
inline void join_quietly(const Stream& user, const Stream& program) noexcept {
  try {
    user.wait_stream(program);
  } catch (...) {
  }
}

/// Launches `g` on the program's stream: first, when its fills draw, the generator's next
/// g.random_blocks blocks are reserved and their seed and offset written where the fills read
/// them (stream-ordered, so a later launch's write waits for this one's kernels). The profiler
/// times it as "cuda_graph" (`phase`: forward or backward).
inline void launch(graph_replay& r, const replay_graph& g, Device device, const char* phase) {
  const profiler::range timing("cuda_graph", phase, device);  // on the program's stream
  if (g.random_blocks > 0) {
    const philox_state state = default_generator(device).reserve_state(g.random_blocks);
    r.random_writer.write(reinterpret_cast<std::uint64_t*>(r.random_state.data()), state.seed,
                          state.offset, r.stream->ref());
  }
  g.graph.launch(r.stream->ref());
  ++r.launches;
}
#endif

}  // namespace graph_detail

TESSERA_API std::string program_state::cuda_graph_status() const {
  if (!cuda_graph) return "off (Options::cuda_graph is false)";
  if (graphs == nullptr) return "not run yet";
  if (!graphs->fallback.empty()) return "not used: " + graphs->fallback;
  if (graphs->captures == 0) return "warming up (the first run is an ordinary one)";
  return "replaying: " + std::to_string(graphs->captures) + " capture(s), " +
         std::to_string(graphs->launches) + " launch(es)";
}

TESSERA_API void program_state::run_forward_graphed() {
  if (graphs == nullptr) graphs = std::make_shared<graph_replay>();
  graph_replay& r = *graphs;
  r.forward_graphed = false;
  if (r.fallback.empty()) r.fallback = graph_detail::program_blocker(*this);
  if (!r.fallback.empty()) {
    run_forward_steps(false);
    return;
  }
#if TESSERA_CUDA
  const Device device = g->values.front().device;
  if (!r.stream) {
    r.stream.emplace(device);
    r.pool.emplace(device);
  }
  const Stream user = current_stream(device);
  r.stream->wait_stream(user);  // the inputs and parameters were written there
  try {
    StreamGuard on_program_stream(*r.stream);
    // The inputs go into the program's own buffers, whose addresses the graphs keep.
    if (r.static_inputs.empty()) {
      for (int id : input_ids) {
        const AnyTensor& x = table.tensors[static_cast<std::size_t>(id)];
        r.static_inputs.push_back(x.clone());
      }
    } else {
      for (std::size_t i = 0; i < input_ids.size(); ++i) {
        r.static_inputs[i].copy_(table.tensors[static_cast<std::size_t>(input_ids[i])]);
      }
    }
    for (std::size_t i = 0; i < input_ids.size(); ++i) {
      table.tensors[static_cast<std::size_t>(input_ids[i])] = r.static_inputs[i];
    }
    // The nodes' host checks and choices (they may throw, before anything else runs), and the
    // addresses a graph keeps.
    std::vector<std::int64_t> key;
    for (const step& st : schedule) {
      if (st.kind != step::forward) continue;
      key.push_back(g->nodes[static_cast<std::size_t>(st.node)]->prepare_replay(table));
    }
    for (const parameter_binding& p : g->parameters) {
      graph_detail::append_address(key, table.tensors[static_cast<std::size_t>(p.value_id)]);
    }
    if (!r.forward_warm) {
      run_forward_steps(false);
      r.forward_warm = true;
    } else if (r.forward.graph.defined() && key == r.forward_key) {
      graph_detail::launch(r, r.forward, device, "forward");
      r.forward_graphed = true;
    } else if (const char* why = graph_detail::node_blocker(*this)) {
      r.fallback = why;
      run_forward_steps(false);
    } else {
      try {
        graph_detail::capturing_scope capturing(table);
        graph_detail::capture_into(r, r.forward, device, [&] { run_forward_steps(false); });
      } catch (const std::exception& e) {
        r.fallback = std::string("capturing the forward failed: ") + e.what();
        r.forward = {};
        r.backward.clear();
        run_forward_steps(false);
      }
      if (r.fallback.empty()) {
        r.forward_key = std::move(key);
        r.backward.clear();  // captured with the earlier forward's host choices
        ++r.captures;
        graph_detail::launch(r, r.forward, device, "forward");
        r.forward_graphed = true;
      }
    }
  } catch (...) {
    graph_detail::join_quietly(user, *r.stream);
    throw;
  }
  user.wait_stream(*r.stream);
#endif
}

TESSERA_API void program_state::run_backward_graphed(const AnyTensor* seed, double seed_value) {
  graph_replay* r = graphs.get();
  if (r != nullptr && r->fallback.empty()) {
    const std::string why = graph_detail::program_blocker(*this);  // hooks added since forward
    if (!why.empty()) r->fallback = why;
  }
  if (r == nullptr || !r->fallback.empty()) {
    run_backward_steps(seed, seed_value);
    return;
  }
#if TESSERA_CUDA
  const Device device = g->values.front().device;
  const Stream user = current_stream(device);
  r->stream->wait_stream(user);
  try {
    StreamGuard on_program_stream(*r->stream);
    const AnyTensor* seed_used = seed;
    if (seed != nullptr) {  // into the program's own buffer, as the inputs
      if (!r->static_seed.defined()) {
        r->static_seed = seed->clone();
      } else {
        r->static_seed.copy_(*seed);
      }
      seed_used = &r->static_seed;
    }
    if (!r->backward_warm || !r->forward_graphed) {
      run_backward_steps(seed_used, seed_value);
      r->backward_warm = true;
    } else {
      // The key: the accumulation flags, the gradients' addresses, the seed.
      std::vector<std::int64_t> key;
      for (const step& st : schedule) {
        for (char a : st.accumulate) key.push_back(a);
      }
      for (const parameter_binding& p : g->parameters) {
        const int gid = g->values[static_cast<std::size_t>(p.value_id)].grad;
        if (gid >= 0) graph_detail::append_address(key, table.tensors[static_cast<std::size_t>(gid)]);
      }
      std::int64_t seed_bits = 0;
      static_assert(sizeof seed_bits == sizeof seed_value);
      std::memcpy(&seed_bits, &seed_value, sizeof seed_bits);
      key.push_back(seed != nullptr ? 1 : 0);
      key.push_back(seed != nullptr ? 0 : seed_bits);
      auto found = r->backward.find(key);
      if (found == r->backward.end()) {
        try {
          graph_detail::capturing_scope capturing(table);
          replay_graph graph;
          graph_detail::capture_into(*r, graph, device,
                                     [&] { run_backward_steps(seed_used, seed_value); });
          found = r->backward.emplace(std::move(key), std::move(graph)).first;
          ++r->captures;
        } catch (const std::exception& e) {
          r->fallback = std::string("capturing the backward failed: ") + e.what();
          r->forward = {};
          r->backward.clear();
          run_backward_steps(seed_used, seed_value);
        }
        if (!r->fallback.empty()) {
          user.wait_stream(*r->stream);
          return;
        }
        // The capture ran the steps' host code (the gradients' bookkeeping) once, for this run.
        graph_detail::launch(*r, found->second, device, "backward");
      } else {
        graph_detail::launch(*r, found->second, device, "backward");
        // What run_backward_steps does on the host besides queuing kernels.
        for (const step& st : schedule) {
          for (std::size_t p : st.first) g->parameters[p].written();
        }
      }
    }
  } catch (...) {
    graph_detail::join_quietly(user, *r->stream);
    throw;
  }
  user.wait_stream(*r->stream);
#else
  (void)seed;
  (void)seed_value;
#endif
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::autograd::detail
