// compile(fn, specs..., options): traces fn once over symbolic inputs and returns a Program that
// runs it many times. Compiling orders the steps (forward, then backward in reverse with
// recomputation of checkpointed segments), simulates them to find every buffer's lifetime, lets an
// elementwise node's output take over an input that dies there (in place), and packs all buffers
// of a device into one arena with best-fit offsets. The arena is allocated once, at the first
// forward; afterwards a training step makes no allocator calls.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/ops.hpp"
#include "tessera/memory/size_policy.hpp"

namespace tessera::optim {
class GradScaler;
}  // namespace tessera::optim

namespace tessera::autograd {

/// Recomputation: split the forward into `segments` pieces; backward keeps only each piece's
/// last value and recomputes the rest of the piece before its backward (Chen et al. 2016). 0 or
/// 1: no recomputation. Where the pieces end (`balance`):
///   automatic  plans both cuts below and keeps the one whose arena is smaller (the nodes' on a
///              tie): neither is best for every model (bench/RESULTS.md, "recompute segments");
///   nodes      about equal numbers of (non-view) nodes per piece;
///   bytes      about equal bytes of forward values per piece.
struct Checkpoint {
  enum class Balance { automatic, nodes, bytes };
  int segments = 0;
  Balance balance = Balance::automatic;
};

struct Options {
  Mode mode = Mode::training;
  Checkpoint checkpoint{};
  /// Training with the first result's gradient given to backward(grad) (PyTorch's
  /// y.backward(grad)): the result may then have any shape. false: the first result is a
  /// one-element loss, and backward() seeds it with 1.
  bool seed_gradient = false;
};

/// Where a program's memory goes, in bytes. planned_bytes is the arena (all devices);
/// naive_bytes what the same values would take with a buffer each. parameters, gradients and
/// inputs are what the pool allocates for them (rounded to its blocks); activations (forward
/// values) and temporaries (gradients of activations, recomputed values, scratch) are naive
/// sums. peak_bytes = inputs + parameters + gradients + the arena as the pool allocates it.
struct MemoryPlan {
  std::size_t planned_bytes = 0;
  std::size_t naive_bytes = 0;
  std::size_t parameters = 0;
  std::size_t gradients = 0;
  std::size_t activations = 0;
  std::size_t temporaries = 0;
  std::size_t inputs = 0;
  std::size_t peak_bytes = 0;
  int forward_steps = 0;
  int backward_steps = 0;
  int recomputed_steps = 0;
  /// With recomputation: the cut the plan uses (Checkpoint::Balance::nodes or ::bytes).
  Checkpoint::Balance segments_by = Checkpoint::Balance::nodes;
  int in_place = 0;  // outputs and gradients that took over a dying buffer (input / upstream)
};

/// What a gradient-ready hook receives: the parameter's index in the program (first use order),
/// its slot (identity) and its gradient, final for this backward.
struct GradientReady {
  std::size_t index = 0;
  const void* parameter = nullptr;
  AnyTensor grad;
};

namespace detail {

inline std::size_t round_block(std::size_t bytes) {
  return bytes == 0 ? 0 : memory::pytorch_size_policy{}.round_size(bytes);
}
inline std::size_t align64(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

struct step {
  enum kind_t { forward, recompute, seed, backward } kind = forward;
  int node = -1;
  int out_instance = -1;           // forward/recompute of a non-view node, seed
  std::vector<char> accumulate;    // backward: per contribution
  int scratch_instance = -1;       // the step's scratch (forward, recompute or backward)
  std::vector<std::size_t> ready;  // parameters whose gradient is final after this step
  std::vector<std::size_t> first;  // parameters whose gradient this step contributes to first
};

struct instance {
  int value = -1;
  Device device;
  std::size_t bytes = 0;
  int start = 0;
  int end = 0;
  int buffer = -1;
  bool scratch = false;
  bool recomputed = false;
};

struct buffer {
  Device device;
  std::size_t bytes = 0;
  int start = 0;
  int end = 0;
  std::size_t offset = 0;
};

/// Packs buffers (lifetime intervals of steps, sizes) at offsets so that buffers alive at the same
/// time never overlap: largest first, each into the smallest gap that holds it (best fit).
/// Returns the arena size.
TESSERA_API std::size_t pack(std::vector<buffer*>& buffers);
#if TESSERA_DEFINITIONS
TESSERA_API std::size_t pack(std::vector<buffer*>& buffers) {
  std::sort(buffers.begin(), buffers.end(), [](const buffer* a, const buffer* b) {
    if (a->bytes != b->bytes) return a->bytes > b->bytes;
    return a->start < b->start;
  });
  std::vector<const buffer*> placed;
  std::size_t arena = 0;
  for (buffer* b : buffers) {
    std::vector<std::pair<std::size_t, std::size_t>> busy;
    for (const buffer* p : placed) {
      if (p->start <= b->end && b->start <= p->end)
        busy.emplace_back(p->offset, p->offset + p->bytes);
    }
    std::sort(busy.begin(), busy.end());
    std::size_t best = std::numeric_limits<std::size_t>::max();
    std::size_t best_gap = std::numeric_limits<std::size_t>::max();
    std::size_t cursor = 0;
    for (const auto& [begin, end] : busy) {
      if (begin > cursor && begin - cursor >= b->bytes && begin - cursor < best_gap) {
        best = cursor;
        best_gap = begin - cursor;
      }
      cursor = std::max(cursor, end);
    }
    b->offset = best != std::numeric_limits<std::size_t>::max() ? best : cursor;
    arena = std::max(arena, b->offset + b->bytes);
    placed.push_back(b);
  }
  return arena;
}
#endif

/// The compiled form of a traced graph (non-template: shared by every Program type).
class program_state {
 public:
  std::unique_ptr<graph> g;
  Mode mode = Mode::training;
  Checkpoint checkpoint;
  bool seed_gradient = false;
  std::vector<int> input_ids;
  std::vector<int> output_ids;
  std::vector<step> schedule;
  // [parameter]: the backward step and the position among its contributions of the first
  // contribution to the parameter's gradient; (-1, -1) for none.
  std::vector<std::pair<int, int>> first_contribution;
  std::vector<instance> instances;
  std::vector<buffer> buffers;
  std::vector<std::pair<Device, std::size_t>> arena_sizes;
  std::vector<Storage> arenas;
  std::vector<AnyTensor> instance_tensors;
  value_table table;
  MemoryPlan plan;
  std::vector<std::function<void(const GradientReady&)>> hooks;
  bool allocated = false;
  bool forwarded = false;
  // The handle blocks the results and the input gradients were handed out through
  // (Storage::share of the arena's bytes), by output and by input; undefined until handed out.
  std::vector<Storage> result_blocks;
  std::vector<Storage> grad_blocks;

  /// `value` (a buffer of the arena) as the user gets it: through blocks[k], a handle block of
  /// its own on the same bytes, made on first use (or again when the value moved), so that
  /// keep_handed_out can tell whether the user still holds it.
  AnyTensor hand_out(const AnyTensor& value, std::vector<Storage>& blocks, std::size_t k);

  /// Before a run writes the arena (where the buffers it handed out may be reused by other
  /// values): every handed-out block a user still holds gets a copy of its bytes, so kept
  /// results and input gradients keep their values; the others are reused. The copy is the only
  /// cost, and only for what is kept.
  void keep_handed_out();

  void compile();

  /// Allocates the arenas and binds every planned buffer (once).
  void allocate();

  /// Runs the forward steps; `replay`: a recomputation of the same forward, whose effect nodes
  /// (running statistics) have already run and are skipped.
  void run_forward(bool replay = false);

  /// Runs the backward; `seed`: the first result's gradient (seed_gradient programs), else
  /// `seed_value` (1, or a GradScaler's loss scale).
  void run_backward(const AnyTensor* seed = nullptr, double seed_value = 1.0);

  /// Frees the arenas and drops every tensor the table holds (inputs included); the next forward
  /// allocates the arenas again.
  void release();

  std::string report() const;

  /// Binds a forward's inputs (the tensors as given; non-contiguous ones are copied) and the
  /// parameters' current values. Throws, naming the input and both values, for a count, dtype,
  /// device or shape other than compiled, and for a parameter changed since compile; the inputs
  /// are bound only once every input and parameter has been checked.
  void bind(const AnyTensor* inputs, std::size_t count);

  TESSERA_API ~program_state();

 private:
  std::size_t arena_index(Device device) const;

  void run_node_forward(const step& s);

  /// Points the table's scratch at the step's planned scratch bytes (none when it has none).
  void bind_scratch(const step& s);

  static void fill_value(const AnyTensor& t, double value);

  /// Gradient values for every value whose gradient some live node writes.
  void make_gradients();

  /// The schedule: forward steps, then (training) the seed and the backward steps, with the
  /// recomputation of each segment (cut as `by` says) before its first backward step.
  void make_schedule(Checkpoint::Balance by);

  /// make_schedule, simulate and place.
  void plan_memory(Checkpoint::Balance by);

  bool is_output(int value) const;

  /// True for the instance of an arena gradient (simulate makes one per gradient value).
  bool is_gradient_instance(const instance& inst) const;

  /// The instance a value reads from now (views read their base's), or -1 (outside the arena).
  int root_instance(int value, const std::vector<int>& current) const;

  int new_instance(int value, int at, bool recomputed);

  /// A scratch instance of `bytes` for node `n`'s step `at`, or -1 for none.
  int new_scratch(const node& n, std::size_t bytes, int at);

  void use(int inst, int at);

  /// Walks the schedule: creates an instance per written buffer and extends each to its last read.
  void simulate();

  /// In place, buffers, packing, accounting.
  void place();

  std::vector<char> live_nodes_;
};

#if TESSERA_DEFINITIONS
TESSERA_API void program_state::compile() {
  for (auto& n : g->nodes) n->finalize(g->values);
  if (mode == Mode::training) {
    const value_info& loss = g->values[static_cast<std::size_t>(output_ids.at(0))];
    if (loss.shape.numel() != 1 && !seed_gradient) {
      throw shape_error(
          "autograd::compile: in training mode the function's (first) result is "
          "the loss and must have one element; it has shape " +
          loss.shape.str() +
          " (reduce it with ts::sum or ts::mean, or compile with "
          "Options{.mode = Mode::inference})");
    }
    if (!loss.requires_grad) {
      throw error(
          "autograd::compile: the loss does not depend on any parameter that requires "
          "grad, so backward would compute nothing (use Mode::inference to only run "
          "forward)");
    }
  }
  make_gradients();
  const bool both = mode == Mode::training && checkpoint.segments > 1 &&
                    checkpoint.balance == Checkpoint::Balance::automatic;
  if (!both) {
    plan_memory(checkpoint.balance == Checkpoint::Balance::bytes ? Checkpoint::Balance::bytes
                                                                 : Checkpoint::Balance::nodes);
    return;
  }
  // Each cut planned; the smaller arena kept (planning is cheap next to a step).
  plan_memory(Checkpoint::Balance::bytes);
  const std::size_t by_bytes = plan.planned_bytes;
  plan_memory(Checkpoint::Balance::nodes);
  if (by_bytes < plan.planned_bytes) plan_memory(Checkpoint::Balance::bytes);
}

TESSERA_API void program_state::plan_memory(Checkpoint::Balance by) {
  make_schedule(by);
  simulate();
  place();
}

TESSERA_API void program_state::allocate() {
  if (allocated) return;
  arenas.clear();
  for (const auto& [device, bytes] : arena_sizes)
    arenas.push_back(Storage::allocate(device, bytes));
  instance_tensors.assign(instances.size(), AnyTensor{});
  for (std::size_t i = 0; i < instances.size(); ++i) {
    const instance& inst = instances[i];
    if (inst.scratch) continue;
    const buffer& buf = buffers[static_cast<std::size_t>(inst.buffer)];
    const value_info& info = g->values[static_cast<std::size_t>(inst.value)];
    const Storage& arena = arenas[arena_index(buf.device)];
    instance_tensors[i] = visit_dtype(info.dtype, [&](auto tag) -> AnyTensor {
      using T = typename decltype(tag)::type;
      const auto offset = static_cast<std::int64_t>(buf.offset / sizeof(T));
      if (info.device.is_cuda()) {
        return Tensor<T, cuda>(arena, info.shape, info.shape.contiguous_strides(), offset);
      }
      return Tensor<T, cpu>(arena, info.shape, info.shape.contiguous_strides(), offset);
    });
  }
  // Gradients have one instance each: bind them for good.
  for (std::size_t i = 0; i < instances.size(); ++i) {
    const instance& inst = instances[i];
    if (is_gradient_instance(inst)) {
      table.tensors[static_cast<std::size_t>(inst.value)] = instance_tensors[i];
    }
  }
  allocated = true;
}

TESSERA_API void program_state::run_forward(bool replay) {
  allocate();
  keep_handed_out();
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const step& s = schedule[i];
    if (s.kind != step::forward) break;
    if (replay && g->nodes[static_cast<std::size_t>(s.node)]->is_effect()) continue;
    run_node_forward(s);
  }
  forwarded = true;
}

TESSERA_API AnyTensor program_state::hand_out(const AnyTensor& value, std::vector<Storage>& blocks,
                                              std::size_t k) {
  if (!value.defined() || !value.storage().defined()) return value;
  if (blocks.size() <= k) blocks.resize(k + 1);
  Storage& block = blocks[k];
  // The block holds exactly the bytes the value's elements reach, from its lowest one.
  const tessera::detail::element_span span = tessera::detail::span_of(value.shape(), value.strides());
  const auto element = static_cast<std::int64_t>(element_size(value.dtype()));
  const char* first = static_cast<const char*>(value.data_ptr()) + span.first * element;
  const auto bytes = static_cast<std::size_t>((span.last - span.first) * element);
  if (!block.defined() || block.data() != first || block.bytes() != bytes) {
    block = Storage::share(value.storage(),
                           static_cast<std::size_t>(first - static_cast<const char*>(value.storage().data())),
                           bytes);
  }
  return visit_dtype(value.dtype(), [&](auto tag) -> AnyTensor {
    using T = typename decltype(tag)::type;
    if (value.device().is_cuda()) {
      return Tensor<T, cuda>(block, value.shape(), value.strides(), -span.first);
    }
    return Tensor<T, cpu>(block, value.shape(), value.strides(), -span.first);
  });
}

TESSERA_API void program_state::keep_handed_out() {
  for (std::vector<Storage>* blocks : {&result_blocks, &grad_blocks}) {
    for (Storage& block : *blocks) {
      if (!block.defined() || block.use_count() == 1) continue;
      // Kept by the user: its handles move to a copy; the program makes another block next time.
      Storage copy = Storage::allocate(block.device(), block.bytes());
      if (block.device().is_cpu()) {
        std::memcpy(copy.data(), block.data(), block.bytes());
      } else {
#if TESSERA_CUDA
        tessera::detail::copy_bytes(copy.data(), copy.device(), block.data(), block.device(),
                                    block.bytes());
#endif
      }
      block.reown(std::move(copy));
      block = Storage{};
    }
  }
}

TESSERA_API void program_state::release() {
  // Handed-out results and gradients keep the arena's bytes they show alive (their blocks hold
  // the arena); the program lets go of its blocks with it.
  result_blocks.clear();
  grad_blocks.clear();
  arenas.clear();
  instance_tensors.clear();
  for (AnyTensor& t : table.tensors) t = AnyTensor{};
  table.scratch = Storage{};
  allocated = false;
  forwarded = false;
}

TESSERA_API void program_state::run_backward(const AnyTensor* seed, double seed_value) {
  if (mode == Mode::inference) {
    throw error(
        "Program::backward: the program was compiled with Mode::inference, which keeps "
        "nothing for backward; compile with Mode::training");
  }
  if (!forwarded) {
    throw error(
        "Program::backward: call forward first (backward needs the values of a forward "
        "run, and each forward allows one backward)");
  }
  keep_handed_out();
  // Each parameter's gradient: its first contribution adds to it, or writes it when its zeros
  // are unwritten (a new gradient, or one after zero_grad).
  for (std::size_t p = 0; p < g->parameters.size(); ++p) {
    const parameter_binding& binding = g->parameters[p];
    const int gid = g->values[static_cast<std::size_t>(binding.value_id)].grad;
    if (gid < 0) continue;
    auto [grad, zero] = binding.grad_for_backward();
    table.tensors[static_cast<std::size_t>(gid)] = std::move(grad);
    const auto [at, position] = first_contribution[p];
    if (at >= 0) {  // (a gradient no step contributes to keeps its unwritten zeros)
      schedule[static_cast<std::size_t>(at)].accumulate[static_cast<std::size_t>(position)] =
          zero ? 0 : 1;
    }
  }
  forwarded = false;
  std::fill(table.product_taken.begin(), table.product_taken.end(), char{0});
  for (const step& s : schedule) {
    switch (s.kind) {
      case step::forward:
        break;
      case step::recompute:
        run_node_forward(s);
        break;
      case step::seed:
        if (seed) {
          table.gradient(output_ids[0]).copy_(*seed);
        } else {
          fill_value(table.gradient(output_ids[0]), seed_value);
        }
        break;
      case step::backward: {
        node& n = *g->nodes[static_cast<std::size_t>(s.node)];
        bind_scratch(s);
        n.backward(table, s.accumulate);
        for (std::size_t p : s.first) g->parameters[p].written();
        break;
      }
    }
    for (std::size_t p : s.ready) {
      if (table.product_taken[p]) continue;  // the product hook wrote it, not this program
      const auto& binding = g->parameters[p];
      GradientReady ready{p, binding.identity,
                          table.tensors[static_cast<std::size_t>(
                              g->values[static_cast<std::size_t>(binding.value_id)].grad)]};
      for (const auto& hook : hooks) hook(ready);
    }
  }
}

TESSERA_API std::string program_state::report() const {
  auto line = [](const char* what, std::size_t bytes) {
    char buffer_[128];
    std::snprintf(buffer_, sizeof(buffer_), "| %-34s | %14s |\n", what,
                  memory::format_bytes(bytes).c_str());
    return std::string(buffer_);
  };
  std::string out;
  out += "| memory plan                        |          bytes |\n";
  out += "|------------------------------------|----------------|\n";
  out += line("parameters", plan.parameters);
  out += line("parameter gradients", plan.gradients);
  out += line("inputs", plan.inputs);
  out += line("activations (one buffer each)", plan.activations);
  out += line("temporaries (one buffer each)", plan.temporaries);
  out += line("naive: activations + temporaries", plan.naive_bytes);
  out += line("planned arena", plan.planned_bytes);
  out += line("peak (inputs+params+grads+arena)", plan.peak_bytes);
  char tail[256];
  const bool cut = mode == Mode::training && checkpoint.segments > 1;
  std::snprintf(tail, sizeof(tail),
                "mode %s; %d forward, %d backward, %d recomputed steps%s; %d outputs in place; "
                "arena %.1f%% of naive\n",
                mode == Mode::training ? "training" : "inference", plan.forward_steps,
                plan.backward_steps, plan.recomputed_steps,
                !cut ? ""
                : plan.segments_by == Checkpoint::Balance::bytes ? " (segments of equal bytes)"
                                                                 : " (segments of equal nodes)",
                plan.in_place,
                plan.naive_bytes ? 100.0 * static_cast<double>(plan.planned_bytes) /
                                       static_cast<double>(plan.naive_bytes)
                                 : 0.0);
  return out + tail;
}

TESSERA_API std::size_t program_state::arena_index(Device device) const {
  for (std::size_t i = 0; i < arena_sizes.size(); ++i) {
    if (arena_sizes[i].first == device) return i;
  }
  throw error("autograd: internal error: no arena for " + device.str());
}

TESSERA_API void program_state::bind_scratch(const step& s) {
  if (s.scratch_instance >= 0) {
    const instance& inst = instances[static_cast<std::size_t>(s.scratch_instance)];
    const buffer& buf = buffers[static_cast<std::size_t>(inst.buffer)];
    table.scratch = arenas[arena_index(buf.device)];
    table.scratch_begin = static_cast<std::int64_t>(buf.offset);
    table.scratch_end = static_cast<std::int64_t>(buf.offset + buf.bytes);
  } else {
    table.scratch = Storage{};
    table.scratch_begin = table.scratch_end = 0;
  }
  table.scratch_offset = table.scratch_begin;
}

TESSERA_API void program_state::run_node_forward(const step& s) {
  node& n = *g->nodes[static_cast<std::size_t>(s.node)];
  if (s.out_instance >= 0) {
    table.tensors[static_cast<std::size_t>(n.output)] =
        instance_tensors[static_cast<std::size_t>(s.out_instance)];
  }
  bind_scratch(s);
  n.forward(table);
}

TESSERA_API void program_state::fill_value(const AnyTensor& t, double value) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_floating_point_v<T>) {
      if (t.device().is_cuda()) {
        Tensor<T, cuda>(t.storage(), t.shape(), t.strides(), t.storage_offset()).fill_(T(value));
      } else {
        Tensor<T, cpu>(t.storage(), t.shape(), t.strides(), t.storage_offset()).fill_(T(value));
      }
    }
  });
}

TESSERA_API void program_state::make_gradients() {
  auto& values = g->values;
  table.grad_of.assign(values.size(), -1);
  if (mode != Mode::training) return;
  std::vector<char> live(values.size(), 0);
  live[static_cast<std::size_t>(output_ids[0])] = 1;
  live_nodes_.assign(g->nodes.size(), 0);
  for (int i = static_cast<int>(g->nodes.size()) - 1; i >= 0; --i) {
    const node& n = *g->nodes[static_cast<std::size_t>(i)];
    const auto targets = n.contributions();
    if (!live[static_cast<std::size_t>(n.output)] || targets.empty()) continue;
    live_nodes_[static_cast<std::size_t>(i)] = 1;
    for (int t : targets) live[static_cast<std::size_t>(t)] = 1;
  }
  const std::size_t count = values.size();
  for (std::size_t v = 0; v < count; ++v) {
    if (!live[v] || !values[v].requires_grad) continue;
    value_info grad;
    grad.shape = values[v].shape;
    grad.strides = grad.shape.contiguous_strides();
    grad.dtype = values[v].dtype;
    grad.device = values[v].device;
    grad.role = values[v].role == value_role::parameter ? value_role::parameter_gradient
                                                        : value_role::gradient;
    grad.base = static_cast<int>(v);
    grad.name = "grad of " + values[v].name;
    const int id = g->add_value(std::move(grad));
    g->values[v].grad = id;
  }
  table.grad_of.assign(g->values.size(), -1);
  for (std::size_t v = 0; v < g->values.size(); ++v) table.grad_of[v] = g->values[v].grad;
}

TESSERA_API void program_state::make_schedule(Checkpoint::Balance by) {
  const auto& nodes = g->nodes;
  schedule.clear();
  plan.backward_steps = plan.recomputed_steps = 0;
  plan.segments_by = by;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    step s;
    s.kind = step::forward;
    s.node = static_cast<int>(i);
    schedule.push_back(s);
  }
  plan.forward_steps = static_cast<int>(nodes.size());
  if (mode != Mode::training) return;
  // Segments for recomputation: contiguous runs of about equal weight, a non-view node weighing
  // 1 (Balance::nodes) or its output's bytes (Balance::bytes); views weigh nothing.
  std::vector<int> segment(nodes.size(), 0);
  const int segments = std::max(1, checkpoint.segments);
  if (segments > 1) {
    auto weight = [&](const node& n) {
      if (n.is_view()) return 0.0;
      if (by == Checkpoint::Balance::nodes) return 1.0;
      return static_cast<double>(g->values[static_cast<std::size_t>(n.output)].bytes());
    };
    double total = 0;
    for (const auto& n : nodes) total += weight(*n);
    double seen = 0;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      // seen * segments first: exact for node counts, so a boundary falls where it did.
      const double at = total > 0 ? seen * segments / total : 0.0;
      segment[i] = std::min(segments - 1, static_cast<int>(at));
      seen += weight(*nodes[i]);
    }
  }
  std::vector<int> last_of_segment(static_cast<std::size_t>(segments), -1);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (!nodes[i]->is_view())
      last_of_segment[static_cast<std::size_t>(segment[i])] = static_cast<int>(i);
  }
  step seed;
  seed.kind = step::seed;
  schedule.push_back(seed);
  std::vector<char> written(g->values.size(), 0);
  written[static_cast<std::size_t>(g->values[static_cast<std::size_t>(output_ids[0])].grad)] = 1;
  std::vector<char> recomputed(static_cast<std::size_t>(segments), segments == 1 ? 1 : 0);
  std::vector<int> last_contribution(g->values.size(), -1);
  std::vector<int> contributions(g->values.size(), 0);
  std::vector<std::pair<int, int>> first_of(g->values.size(), {-1, -1});
  for (int i = static_cast<int>(nodes.size()) - 1; i >= 0; --i) {
    if (!live_nodes_[static_cast<std::size_t>(i)]) continue;
    const int seg = segment[static_cast<std::size_t>(i)];
    if (!recomputed[static_cast<std::size_t>(seg)]) {
      recomputed[static_cast<std::size_t>(seg)] = 1;
      for (std::size_t j = 0; j < nodes.size(); ++j) {
        if (segment[j] == seg &&
            static_cast<int>(j) != last_of_segment[static_cast<std::size_t>(seg)] &&
            !is_output(nodes[j]->output) && nodes[j]->recomputable()) {
          step r;
          r.kind = step::recompute;
          r.node = static_cast<int>(j);
          schedule.push_back(r);
          ++plan.recomputed_steps;
        }
      }
    }
    step b;
    b.kind = step::backward;
    b.node = i;
    for (int t : nodes[static_cast<std::size_t>(i)]->contributions()) {
      const int gid = g->values[static_cast<std::size_t>(t)].grad;
      const bool external =
          g->values[static_cast<std::size_t>(gid)].role == value_role::parameter_gradient;
      if (external && !written[static_cast<std::size_t>(gid)]) {
        first_of[static_cast<std::size_t>(gid)] = {static_cast<int>(schedule.size()),
                                                   static_cast<int>(b.accumulate.size())};
      }
      // A parameter's gradient: run_backward sets its first contribution's flag at each run.
      b.accumulate.push_back(external || written[static_cast<std::size_t>(gid)] ? 1 : 0);
      written[static_cast<std::size_t>(gid)] = 1;
      ++contributions[static_cast<std::size_t>(gid)];
      last_contribution[static_cast<std::size_t>(gid)] = static_cast<int>(schedule.size());
    }
    schedule.push_back(std::move(b));
    ++plan.backward_steps;
  }
  first_contribution.assign(g->parameters.size(), {-1, -1});
  table.product_parameter.assign(g->values.size(), -1);
  table.product_taken.assign(g->parameters.size(), 0);
  for (std::size_t p = 0; p < g->parameters.size(); ++p) {
    const int gid = g->values[static_cast<std::size_t>(g->parameters[p].value_id)].grad;
    if (gid >= 0 && contributions[static_cast<std::size_t>(gid)] == 1) {
      table.product_parameter[static_cast<std::size_t>(gid)] = static_cast<int>(p);
    }
    if (gid >= 0 && last_contribution[static_cast<std::size_t>(gid)] >= 0) {
      schedule[static_cast<std::size_t>(last_contribution[static_cast<std::size_t>(gid)])]
          .ready.push_back(p);
      first_contribution[p] = first_of[static_cast<std::size_t>(gid)];
      schedule[static_cast<std::size_t>(first_contribution[p].first)].first.push_back(p);
    }
  }
}

TESSERA_API bool program_state::is_output(int value) const {
  return std::find(output_ids.begin(), output_ids.end(), value) != output_ids.end();
}

TESSERA_API bool program_state::is_gradient_instance(const instance& inst) const {
  return !inst.scratch &&
         g->values[static_cast<std::size_t>(inst.value)].role == value_role::gradient;
}

TESSERA_API int program_state::root_instance(int value, const std::vector<int>& current) const {
  int v = value;
  while (g->values[static_cast<std::size_t>(v)].role == value_role::view) {
    v = g->values[static_cast<std::size_t>(v)].base;
  }
  return current[static_cast<std::size_t>(v)];
}

TESSERA_API int program_state::new_instance(int value, int at, bool recomputed) {
  const value_info& info = g->values[static_cast<std::size_t>(value)];
  instance inst;
  inst.value = value;
  inst.device = info.device;
  inst.bytes = align64(info.bytes());
  inst.start = inst.end = at;
  inst.recomputed = recomputed;
  instances.push_back(inst);
  return static_cast<int>(instances.size()) - 1;
}

TESSERA_API int program_state::new_scratch(const node& n, std::size_t bytes, int at) {
  if (bytes == 0) return -1;
  instance inst;
  inst.value = n.scratch_value();
  inst.device = g->values[static_cast<std::size_t>(inst.value)].device;
  inst.bytes = align64(bytes);
  inst.start = inst.end = at;
  inst.scratch = true;
  instances.push_back(inst);
  return static_cast<int>(instances.size()) - 1;
}

TESSERA_API void program_state::use(int inst, int at) {
  if (inst >= 0)
    instances[static_cast<std::size_t>(inst)].end =
        std::max(instances[static_cast<std::size_t>(inst)].end, at);
}

TESSERA_API void program_state::simulate() {
  instances.clear();
  std::vector<int> current(g->values.size(), -1);
  const int end_of_time = static_cast<int>(schedule.size());
  for (int i = 0; i < static_cast<int>(schedule.size()); ++i) {
    step& s = schedule[static_cast<std::size_t>(i)];
    if (s.kind == step::forward || s.kind == step::recompute) {
      node& n = *g->nodes[static_cast<std::size_t>(s.node)];
      for (int input : n.inputs) use(root_instance(input, current), i);
      if (!n.is_view()) {
        s.out_instance = new_instance(n.output, i, s.kind == step::recompute);
        current[static_cast<std::size_t>(n.output)] = s.out_instance;
      }
      s.scratch_instance = new_scratch(n, n.forward_scratch(), i);
      if (s.kind == step::forward && i + 1 < end_of_time &&
          schedule[static_cast<std::size_t>(i + 1)].kind != step::forward) {
        for (int out : output_ids) use(root_instance(out, current), end_of_time);
      }
    } else if (s.kind == step::seed) {
      const int gid = g->values[static_cast<std::size_t>(output_ids[0])].grad;
      s.out_instance = new_instance(gid, i, false);
      current[static_cast<std::size_t>(gid)] = s.out_instance;
    } else {
      node& n = *g->nodes[static_cast<std::size_t>(s.node)];
      for (int r : n.backward_reads()) {
        if (r >= 0) {
          use(root_instance(r, current), i);
        } else {
          use(current[static_cast<std::size_t>(g->values[static_cast<std::size_t>(-2 - r)].grad)],
              i);
        }
      }
      for (int t : n.contributions()) {
        const int gid = g->values[static_cast<std::size_t>(t)].grad;
        if (g->values[static_cast<std::size_t>(gid)].role == value_role::parameter_gradient)
          continue;
        if (current[static_cast<std::size_t>(gid)] < 0) {
          current[static_cast<std::size_t>(gid)] = new_instance(gid, i, false);
        }
        use(current[static_cast<std::size_t>(gid)], i);
      }
      s.scratch_instance = new_scratch(n, n.backward_scratch(), i);
    }
  }
  // A forward-only schedule's outputs: alive to its end (training marked them after the last
  // forward step above).
  if (mode != Mode::training) {
    for (int out : output_ids) use(root_instance(out, current), end_of_time);
  } else {
    // The inputs' gradients (inputs that require grad) are read after backward.
    for (int id : input_ids) {
      const int gid = g->values[static_cast<std::size_t>(id)].grad;
      if (gid >= 0) use(current[static_cast<std::size_t>(gid)], end_of_time);
    }
  }
}

TESSERA_API void program_state::place() {
  // Union-find over instances: an elementwise output takes over an input dying at its step.
  std::vector<int> parent(instances.size());
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int x) {
    while (parent[static_cast<std::size_t>(x)] != x)
      x = parent[static_cast<std::size_t>(x)] =
          parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(x)])];
    return x;
  };
  std::vector<int> current(g->values.size(), -1);
  // A gradient value has one instance (simulate creates it at its first write).
  std::vector<int> gradient_instance(g->values.size(), -1);
  for (std::size_t k = 0; k < instances.size(); ++k) {
    const instance& inst = instances[k];
    if (is_gradient_instance(inst)) {
      gradient_instance[static_cast<std::size_t>(inst.value)] = static_cast<int>(k);
    }
  }
  plan.in_place = 0;
  for (int i = 0; i < static_cast<int>(schedule.size()); ++i) {
    const step& s = schedule[static_cast<std::size_t>(i)];
    if (s.kind == step::backward) {
      // The last contribution's gradient, first written here, takes over the output gradient's
      // buffer when that dies here (node::backward_in_place).
      const node& n = *g->nodes[static_cast<std::size_t>(s.node)];
      if (!n.backward_in_place()) continue;
      const std::vector<int> targets = n.contributions();
      if (targets.empty()) continue;
      const int upstream = g->values[static_cast<std::size_t>(n.output)].grad;
      const int written = g->values[static_cast<std::size_t>(targets.back())].grad;
      if (upstream < 0 || written < 0) continue;
      const int from = gradient_instance[static_cast<std::size_t>(upstream)];
      const int to = gradient_instance[static_cast<std::size_t>(written)];
      if (from < 0 || to < 0) continue;
      const instance& in = instances[static_cast<std::size_t>(from)];
      const instance& out = instances[static_cast<std::size_t>(to)];
      if (in.end != i || out.start != i || in.bytes != out.bytes || in.device != out.device) {
        continue;
      }
      parent[static_cast<std::size_t>(to)] = find(from);
      ++plan.in_place;
      continue;
    }
    if (s.kind != step::forward && s.kind != step::recompute) continue;
    node& n = *g->nodes[static_cast<std::size_t>(s.node)];
    if (s.out_instance >= 0) {
      for (int c : n.inplace_candidates()) {
        const value_info& cv = g->values[static_cast<std::size_t>(c)];
        if (cv.role != value_role::computed) continue;
        const int inst = current[static_cast<std::size_t>(c)];
        if (inst < 0) continue;
        const instance& in = instances[static_cast<std::size_t>(inst)];
        const instance& out = instances[static_cast<std::size_t>(s.out_instance)];
        if (in.end != i || in.bytes != out.bytes || in.device != out.device) continue;
        // No other input of the step may read the same buffer (a view of it, read elsewhere).
        bool alone = true;
        for (int other : n.inputs) {
          if (other != c && root_instance(other, current) == inst) alone = false;
        }
        if (!alone) continue;
        parent[static_cast<std::size_t>(s.out_instance)] = find(inst);
        ++plan.in_place;
        break;
      }
      current[static_cast<std::size_t>(n.output)] = s.out_instance;
    }
  }
  buffers.clear();
  std::vector<int> buffer_of(instances.size(), -1);
  for (std::size_t i = 0; i < instances.size(); ++i) {
    const int root = find(static_cast<int>(i));
    if (buffer_of[static_cast<std::size_t>(root)] < 0) {
      buffer_of[static_cast<std::size_t>(root)] = static_cast<int>(buffers.size());
      buffer b;
      b.device = instances[static_cast<std::size_t>(root)].device;
      b.start = instances[static_cast<std::size_t>(root)].start;
      b.end = instances[static_cast<std::size_t>(root)].end;
      buffers.push_back(b);
    }
    buffer& b = buffers[static_cast<std::size_t>(buffer_of[static_cast<std::size_t>(root)])];
    b.bytes = std::max(b.bytes, instances[i].bytes);
    b.start = std::min(b.start, instances[i].start);
    b.end = std::max(b.end, instances[i].end);
    instances[i].buffer = buffer_of[static_cast<std::size_t>(root)];
  }
  arena_sizes.clear();
  for (const buffer& b : buffers) {
    bool known = false;
    for (const auto& a : arena_sizes) known = known || a.first == b.device;
    if (!known) arena_sizes.emplace_back(b.device, 0);
  }
  for (auto& [device, size] : arena_sizes) {
    std::vector<buffer*> mine;
    for (buffer& b : buffers) {
      if (b.device == device) mine.push_back(&b);
    }
    size = pack(mine);
  }
  // Accounting.
  plan.activations = plan.temporaries = 0;
  for (const instance& inst : instances) {
    const bool activation =
        !inst.scratch && !inst.recomputed &&
        g->values[static_cast<std::size_t>(inst.value)].role == value_role::computed;
    (activation ? plan.activations : plan.temporaries) += inst.bytes;
  }
  plan.naive_bytes = plan.activations + plan.temporaries;
  plan.planned_bytes = 0;
  std::size_t arena_blocks = 0;
  for (const auto& a : arena_sizes) {
    plan.planned_bytes += a.second;
    arena_blocks += round_block(a.second);
  }
  plan.parameters = plan.gradients = plan.inputs = 0;
  for (const auto& p : g->parameters) {
    const value_info& v = g->values[static_cast<std::size_t>(p.value_id)];
    plan.parameters += round_block(v.bytes());
    if (v.grad >= 0) plan.gradients += round_block(v.bytes());
  }
  for (int id : input_ids)
    plan.inputs += round_block(g->values[static_cast<std::size_t>(id)].bytes());
  plan.peak_bytes = plan.inputs + plan.parameters + plan.gradients + arena_blocks;
}

TESSERA_API void program_state::bind(const AnyTensor* inputs, std::size_t count) {
  if (count != input_ids.size()) {
    throw error("Program::forward: expected " + std::to_string(input_ids.size()) + " inputs, got " +
                std::to_string(count));
  }
  for (std::size_t i = 0; i < count; ++i) {
    const AnyTensor& x = inputs[i];
    const value_info& info = g->values[static_cast<std::size_t>(input_ids[i])];
    const std::string which = "Program::forward: input " + std::to_string(i);
    if (!x.defined()) throw error(which + " is undefined");
    if (x.dtype() != info.dtype) {
      throw dtype_error(which + " has dtype " + std::string(name(x.dtype())) + ", expected " +
                        std::string(name(info.dtype)));
    }
    if (x.device() != info.device) {
      throw device_mismatch_error(which + " is on " + x.device().str() + ", expected " +
                                  info.device.str());
    }
    if (x.shape() != info.shape) {
      throw shape_error(which + " has shape " + x.shape().str() + ", expected " + info.shape.str());
    }
  }
  // Each parameter's current value is read once (a call through its binding), checked and bound.
  for (std::size_t p = 0; p < g->parameters.size(); ++p) {
    const auto& binding = g->parameters[p];
    AnyTensor value = binding.value();
    const value_info& info = g->values[static_cast<std::size_t>(binding.value_id)];
    if (!value.defined() || value.shape() != info.shape || value.dtype() != info.dtype ||
        value.device() != info.device || !value.is_contiguous()) {
      throw error("Program::forward: parameter " + std::to_string(p) +
                  " changed since compile: " + "traced as " + std::string(name(info.dtype)) + " " +
                  info.shape.str() + " on " + info.device.str() + ", now " +
                  (value.defined() ? std::string(name(value.dtype())) + " " + value.shape().str() +
                                         " on " + value.device().str() +
                                         (value.is_contiguous() ? "" : " (not contiguous)")
                                   : std::string("undefined")) +
                  "; compile again after moving or replacing parameters");
    }
    table.tensors[static_cast<std::size_t>(binding.value_id)] = std::move(value);
  }
  for (std::size_t i = 0; i < count; ++i) {
    table.tensors[static_cast<std::size_t>(input_ids[i])] = inputs[i];
  }
  for (std::size_t v = 0; v < g->constants.size(); ++v) {
    if (g->constants[v].defined()) table.tensors[v] = g->constants[v];
  }
}

TESSERA_API program_state::~program_state() = default;
#endif  // TESSERA_DEFINITIONS

template <class X>
struct is_input_spec : std::false_type {};
template <class T, class K>
struct is_input_spec<input_spec<T, K>> : std::true_type {};

/// The tensors a traced result becomes.
template <class R>
struct tensors_of {
  using var = Var<typename R::value_type, typename R::device_kind>;
  using type = Tensor<typename R::value_type, typename R::device_kind>;
};
template <class... R>
struct tensors_of<std::tuple<R...>> {
  using type = std::tuple<typename tensors_of<R>::type...>;
};

// What trace does that does not depend on the traced function (out of line in compiled mode):
// a new program's state, an input's or an output's value recorded, and the compilation.
TESSERA_API std::unique_ptr<program_state> start_trace(const Options& options);
TESSERA_API int add_input(program_state& state, value_info info);
TESSERA_API void add_output(program_state& state, int id);
TESSERA_API void finish_trace(program_state& state);
TESSERA_API void add_gradient_hook(program_state& state,
                                   std::function<void(const GradientReady&)> hook);
TESSERA_API void set_product_hook(program_state& state,
                                  std::function<bool(ParameterProduct&)> hook);

template <class R>
int bind_result(const R& r) {
  if constexpr (is_var<R>::value) {
    return r.id();
  } else {
    static_assert(tessera::detail::symbolic_expression<R>,
                  "autograd::compile: the function must return a Var, an expression of Vars, or a "
                  "std::tuple of them");
    return Var<typename R::value_type, typename R::device_kind>(r).id();
  }
}

}  // namespace detail

/// A compiled function: run forward (and backward in training mode) many times.
template <class Result>
class Program {
 public:
  explicit Program(std::unique_ptr<detail::program_state> state) : state_(std::move(state)) {}

  /// Runs the function on `inputs` (tensors of the compiled specs' dtypes, devices and shapes;
  /// a non-contiguous input is copied first). Returns the result tensors: views of the program's
  /// output buffers. A result you keep keeps its values (losses.push_back(loss)): before the
  /// next run writes the buffers, results still held are moved to a copy of their bytes, and
  /// only those cost anything. Do not read a kept result on another thread while the program
  /// runs again.
  template <class... Ts>
  Result forward(const Ts&... inputs) {
    bind(inputs...);
    state_->run_forward();
    return results(std::make_index_sequence<output_count()>{});
  }

  /// The forward again, as a recomputation before backward (activation checkpointing across
  /// calls): the same as forward, except that effects (BatchNorm's running statistics) are not
  /// applied a second time. Random numbers are drawn anew: restore the generator's state
  /// (Generator::state/set_state) to get those of the first run.
  template <class... Ts>
  Result recompute(const Ts&... inputs) {
    bind(inputs...);
    state_->run_forward(true);
    return results(std::make_index_sequence<output_count()>{});
  }

  /// Adds every used parameter's gradient into its .grad() (created as zeros the first time).
  /// The first result is a one-element loss (see Options::seed_gradient).
  void backward() {
    if (state_->seed_gradient) {
      throw error("Program::backward: the program was compiled with Options::seed_gradient; "
                  "pass the first result's gradient: backward(grad)");
    }
    state_->run_backward();
  }

  /// backward() seeded with `scaler`'s loss scale (mixed precision: PyTorch's
  /// scaler.scale(loss).backward()), so every gradient is the scale times the true one until
  /// scaler.step(optimizer) unscales it. The seed is the scale in the loss's dtype: compute the
  /// loss in float (a half loss would overflow at the default scale 65536; the scaler would then
  /// skip that step and halve the scale). Defined in tessera/optim/grad_scaler.hpp.
  void backward(const optim::GradScaler& scaler);

  /// backward with the first result's gradient given (Options::seed_gradient; PyTorch's
  /// y.backward(grad)): `grad` has the result's dtype, shape and device kind, on any ordinal.
  /// Throws for another shape or dtype, naming both.
  template <class T, class K>
  void backward(const Tensor<T, K>& grad) {
    auto& s = *state_;
    if (!s.seed_gradient) {
      throw error("Program::backward(grad): the program was not compiled with "
                  "Options::seed_gradient (its first result is a loss: call backward())");
    }
    const detail::value_info& info = s.g->values[static_cast<std::size_t>(s.output_ids[0])];
    if (!grad.defined()) throw error("Program::backward(grad): the gradient is undefined");
    if (scalar_type_of<T> != info.dtype || grad.shape() != info.shape ||
        grad.device().type != info.device.type) {
      throw shape_error("Program::backward(grad): the gradient is " +
                        std::string(name(scalar_type_of<T>)) + " " + grad.shape().str() + " on " +
                        grad.device().str() + ", the first result is " +
                        std::string(name(info.dtype)) + " " + info.shape.str() + " on " +
                        info.device.str());
    }
    const AnyTensor seed = grad.contiguous();
    s.run_backward(&seed);
  }

  /// The gradient of input `i` (compiled with requires_grad) after the last backward: a view of
  /// a buffer of the program; kept past the next run, it keeps its values (as results do).
  /// Throws when the input does not require grad, or when the result does not depend on it.
  AnyTensor input_grad(std::size_t i) const {
    const auto& s = *state_;
    if (i >= s.input_ids.size()) {
      throw std::out_of_range("Program::input_grad: input " + std::to_string(i) + " of " +
                              std::to_string(s.input_ids.size()));
    }
    const int gid = s.g->values[static_cast<std::size_t>(s.input_ids[i])].grad;
    if (gid < 0 || !s.table.tensors[static_cast<std::size_t>(gid)].defined()) {
      throw error("Program::input_grad: input " + std::to_string(i) +
                  " has no gradient (compile its spec with requires_grad = true; the result "
                  "must depend on it)");
    }
    return state_->hand_out(s.table.tensors[static_cast<std::size_t>(gid)], state_->grad_blocks,
                            i);
  }

  /// Frees the program's planned memory (its arena) and lets go of its inputs; the next
  /// forward allocates the arena again (from the pool's cache). Results and input gradients
  /// already returned keep their memory alive until they are dropped.
  void release() { state_->release(); }

 private:
  template <class... Ts>
  void bind(const Ts&... inputs) {
    static_assert((tessera::detail::is_tensor<Ts>::value && ...),
                  "Program::forward: inputs are tensors");
    // Made contiguous and type-erased here; checked and bound out of line, the same code for
    // every program.
    const AnyTensor erased[sizeof...(Ts) + 1] = {
        AnyTensor(inputs.defined() ? inputs.contiguous() : inputs)...};
    state_->bind(erased, sizeof...(Ts));
  }

 public:
  const MemoryPlan& plan() const noexcept { return state_->plan; }
  std::string memory_report() const { return state_->report(); }
  Mode mode() const noexcept { return state_->mode; }
  /// Number of parameters the program uses (GradientReady::index counts them).
  std::size_t parameter_count() const noexcept { return state_->g->parameters.size(); }
  /// Calls `hook` during backward as soon as a parameter's gradient is final.
  void on_gradient_ready(std::function<void(const GradientReady&)> hook) {
    detail::add_gradient_hook(*state_, std::move(hook));
  }
  /// Offers `hook` the product of every matmul backward that is a parameter's only gradient
  /// contribution (ParameterProduct: target (+)= x @ y, the parameter's index): when it returns
  /// true it has written the product itself and the program does not, and in that backward the
  /// parameter gets no on_gradient_ready call (the program never wrote its gradient tensor).
  /// DataParallel computes the devices' products straight into the module's gradient this way.
  /// One hook per program; an empty function removes it.
  void on_parameter_product(std::function<bool(ParameterProduct&)> hook) {
    detail::set_product_hook(*state_, std::move(hook));
  }

 private:
  static constexpr std::size_t output_count() {
    if constexpr (requires { std::tuple_size<Result>::value; }) {
      return std::tuple_size_v<Result>;
    } else {
      return 1;
    }
  }
  template <std::size_t... I>
  Result results(std::index_sequence<I...>) const {
    auto& s = *state_;
    if constexpr (requires { std::tuple_size<Result>::value; }) {
      return Result{s.hand_out(s.table.value(s.output_ids[I]), s.result_blocks, I)
                        .template as<typename std::tuple_element_t<I, Result>::value_type,
                                     typename std::tuple_element_t<I, Result>::device_kind>()...};
    } else {
      return s.hand_out(s.table.value(s.output_ids[0]), s.result_blocks, 0)
          .template as<typename Result::value_type, typename Result::device_kind>();
    }
  }

  std::unique_ptr<detail::program_state> state_;
};

namespace detail {

#if TESSERA_DEFINITIONS
TESSERA_API void add_gradient_hook(program_state& state,
                                   std::function<void(const GradientReady&)> hook) {
  state.hooks.push_back(std::move(hook));
}
TESSERA_API void set_product_hook(program_state& state,
                                  std::function<bool(ParameterProduct&)> hook) {
  state.table.product_hook = std::move(hook);
}
TESSERA_API std::unique_ptr<program_state> start_trace(const Options& options) {
  auto state = std::make_unique<program_state>();
  state->g = std::make_unique<graph>();
  state->mode = options.mode;
  state->checkpoint = options.checkpoint;
  state->seed_gradient = options.seed_gradient && options.mode == Mode::training;
  return state;
}
TESSERA_API int add_input(program_state& state, value_info info) {
  const int id = state.g->add_value(std::move(info));
  state.input_ids.push_back(id);
  return id;
}
TESSERA_API void add_output(program_state& state, int id) { state.output_ids.push_back(id); }
TESSERA_API void finish_trace(program_state& state) {
  state.table.tensors.assign(state.g->values.size(), AnyTensor{});
  state.compile();
  state.table.tensors.resize(state.g->values.size());
}
#endif  // TESSERA_DEFINITIONS

template <class Fn, class... Specs, std::size_t... I>
auto trace(Fn& fn, const Options& options, const std::tuple<const Specs&...>& specs,
           std::index_sequence<I...>) {
  std::unique_ptr<program_state> state = start_trace(options);
  graph* g = state->g.get();
  auto make_input = [&](std::size_t index, const auto& spec) {
    using S = std::remove_cvref_t<decltype(spec)>;
    using T = typename S::value_type;
    using K = typename S::device_kind;
    value_info info;
    info.shape = spec.shape;
    info.strides = spec.shape.contiguous_strides();
    info.dtype = scalar_type_of<T>;
    info.device = resolve_device<K>(spec.device);
    info.role = value_role::input;
    info.requires_grad = spec.requires_grad && is_floating_point_v<T>;
    info.name = "input " + std::to_string(index);
    spec.shape.check_non_negative("autograd::input");
    return Var<T, K>(g, add_input(*state, std::move(info)), spec.shape);
  };
  // Braces: the inputs are made (and numbered) left to right.
  auto vars = std::tuple{make_input(I, std::get<I>(specs))...};
  auto result = std::apply(fn, vars);
  using R = decltype(result);
  if constexpr (requires { std::tuple_size<R>::value; }) {
    std::apply([&](const auto&... r) { (add_output(*state, bind_result(r)), ...); }, result);
  } else {
    add_output(*state, bind_result(result));
  }
  finish_trace(*state);
  return std::pair{std::move(state), std::type_identity<typename tensors_of<R>::type>{}};
}

template <class... Args>
constexpr bool ends_with_options() {
  if constexpr (sizeof...(Args) == 0) {
    return false;
  } else {
    return std::is_same_v<
        std::remove_cvref_t<std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>>,
        Options>;
  }
}

template <class Fn, class Tuple, std::size_t... I>
auto compile_with(Fn& fn, const Options& options, const Tuple& args, std::index_sequence<I...>) {
  const auto specs = std::tie(std::get<I>(args)...);
  auto [state, tag] = trace(fn, options, specs, std::index_sequence<I...>{});
  using Result = typename decltype(tag)::type;
  return Program<Result>(std::move(state));
}

}  // namespace detail

/// Traces `fn(Var...)` once over the given input specs (ts::autograd::input<T, K>(shape, device))
/// and compiles it; the last argument may be Options. fn returns the loss (training) or any Var,
/// expression of Vars, or tuple of them.
template <class Fn, class... Args>
auto compile(Fn&& fn, const Args&... args) {
  const auto all = std::tie(args...);
  if constexpr (detail::ends_with_options<Args...>()) {
    return detail::compile_with(fn, std::get<sizeof...(Args) - 1>(all), all,
                                std::make_index_sequence<sizeof...(Args) - 1>{});
  } else {
    return detail::compile_with(fn, Options{}, all, std::make_index_sequence<sizeof...(Args)>{});
  }
}

/// A memory budget for max_batch_size: `bytes`, and the optimiser's state as a number of buffers
/// per parameter (SGD with momentum: 1, Adam: 2).
struct Budget {
  std::size_t bytes = 0;
  int optimizer_buffers = 0;
  Options options{};
};

namespace detail {
template <class Spec>
Spec with_batch(Spec spec, std::int64_t batch) {
  if (spec.shape.size() == 0) {
    throw shape_error(
        "max_batch_size: an input is 0-dim; every input needs a leading batch dimension");
  }
  spec.shape[0] = batch;
  return spec;
}

template <class Fn, class Tuple, std::size_t... I>
std::size_t planned_peak(Fn& fn, const Budget& budget, const Tuple& specs, std::int64_t batch,
                         std::index_sequence<I...>) {
  const auto program = compile(fn, with_batch(std::get<I>(specs), batch)..., budget.options);
  const MemoryPlan& p = program.plan();
  return p.peak_bytes + static_cast<std::size_t>(budget.optimizer_buffers) * p.parameters;
}
}  // namespace detail

/// The largest leading-dimension size (batch) of every input whose planned peak memory (inputs,
/// parameters, gradients, optimiser state and the arena, as the pool allocates them) fits
/// `budget`, found by compiling plans, not by running. 0 when even a batch of 1 does not fit.
/// The last argument is the budget: a byte count or a Budget.
template <class Fn, class... Args>
std::int64_t max_batch_size(Fn&& fn, const Args&... args) {
  static_assert(sizeof...(Args) >= 2, "max_batch_size(fn, specs..., budget)");
  const auto all = std::tie(args...);
  const auto& last = std::get<sizeof...(Args) - 1>(all);
  Budget budget;
  if constexpr (std::is_same_v<std::remove_cvref_t<decltype(last)>, Budget>) {
    budget = last;
  } else {
    budget.bytes = static_cast<std::size_t>(last);
  }
  constexpr auto indices = std::make_index_sequence<sizeof...(Args) - 1>{};
  auto fits = [&](std::int64_t batch) {
    return detail::planned_peak(fn, budget, all, batch, indices) <= budget.bytes;
  };
  if (!fits(1)) return 0;
  std::int64_t good = 1, bad = 2;
  while (fits(bad)) {
    good = bad;
    if (bad > (std::int64_t{1} << 40)) return good;
    bad *= 2;
  }
  while (bad - good > 1) {
    const std::int64_t mid = good + (bad - good) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

}  // namespace tessera::autograd
