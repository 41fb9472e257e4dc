// The compiled form of a traced graph, shared by every Program type (autograd/program.hpp): the
// graph, the schedule of steps, the instances and buffers of the memory plan, the arenas, and the
// value table a run reads and writes. Its members are defined by concern: the schedule in
// schedule.hpp, the memory plan in memory_plan.hpp, running in runtime.hpp; compile(), which
// drives them, here.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/autograd/detail/arena.hpp"
#include "tessera/autograd/program_options.hpp"
#include "tessera/autograd/var.hpp"
#include "tessera/core/error.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/storage.hpp"

namespace tessera::autograd::detail {

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

struct graph_replay;

/// The compiled form of a traced graph (non-template: shared by every Program type).
class program_state {
 public:
  std::unique_ptr<graph> g;
  Mode mode = Mode::training;
  Checkpoint checkpoint;
  bool seed_gradient = false;
  bool restore_gradients = true;  // Options::restore_gradients
  bool cuda_graph = false;        // Options::cuda_graph
  bool gradients_in_arena = false;  // Options::gradients_in_arena (training mode only)
  bool epilogues = true;            // Options::epilogues
  // Its graphs (graph_replay.hpp), made at the first forward when cuda_graph is set.
  std::shared_ptr<graph_replay> graphs;
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
  // With gradients_in_arena: [parameter] the instance of its gradient in the arena (-1: none, or
  // no step contributes to it), and the block it was handed to the parameter's slot through.
  std::vector<int> parameter_grad_instance;
  std::vector<Storage> parameter_grad_blocks;

  /// `value` (a buffer of the arena) as the user gets it: through blocks[k], a handle block of
  /// its own on the same bytes, made on first use (or again when the value moved), so that
  /// keep_handed_out can tell whether the user still holds it.
  AnyTensor hand_out(const AnyTensor& value, std::vector<Storage>& blocks, std::size_t k);

  /// Before a run writes the arena (where the buffers it handed out may be reused by other
  /// values): every handed-out block a user still holds gets a copy of its bytes, so kept
  /// results and input gradients keep their values; the others are reused. The copy is the only
  /// cost, and only for what is kept.
  void keep_handed_out();

  /// With gradients_in_arena, before a run writes the arena (and when it is released or
  /// destroyed): the parameters' gradients that zero_grad() cleared are let go of (none, as
  /// PyTorch's set_to_none), and those in the arena still held (values to accumulate onto, or a
  /// handle you keep) are copied out of it, as kept results are.
  void keep_parameter_gradients();

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
  /// Whether the program replays CUDA graphs, and if not why (Program::cuda_graphs).
  std::string cuda_graph_status() const;

  /// Binds a forward's inputs (the tensors as given; non-contiguous ones are copied) and the
  /// parameters' current values. Throws, naming the input and both values, for a count, dtype,
  /// device or shape other than compiled, and for a parameter changed since compile; the inputs
  /// are bound only once every input and parameter has been checked.
  void bind(const AnyTensor* inputs, std::size_t count);

  TESSERA_API ~program_state();

 private:
  std::size_t arena_index(Device device) const;

  void run_node_forward(const step& s);
  /// Where node n's work is timed by the profiler (profiler::range): its output's device.
  Device node_device(const node& n) const {
    return g->values[static_cast<std::size_t>(n.output)].device;
  }
  /// The forward steps (`replay`: a recomputation, whose effect nodes are skipped).
  void run_forward_steps(bool replay);
  /// run_forward and run_backward's steps with Options::cuda_graph (graph_replay.hpp).
  void run_forward_graphed();
  void run_backward_graphed(const AnyTensor* seed, double seed_value);

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

  /// After the plan: a matrix product followed by `+ bias` (and a ReLU), each taking over the
  /// buffer before it, applies them as its epilogue; the elementwise nodes then skip their forward
  /// (MemoryPlan::epilogues).
  void fold_epilogues();

  /// Each parameter's gradient as run_backward found it, so that a backward that throws puts it
  /// back (Options::restore_gradients); copies_ holds the values of those that accumulate (kept
  /// from step to step, so that a warm step allocates nothing).
  enum class grad_before : char { none, zero, values };
  std::vector<grad_before> grads_before_;
  std::vector<AnyTensor> grad_copies_;
  /// Records parameter p's gradient state (and its values when it accumulates); returns the
  /// gradient for this backward and whether it is zero unwritten.
  std::pair<AnyTensor, bool> record_gradient(std::size_t p);
  /// Puts back the gradients of the first `count` parameters recorded.
  void restore_gradients_before(std::size_t count) noexcept;
  void run_backward_steps(const AnyTensor* seed, double seed_value);

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
  } else {
    // Each cut planned; the smaller arena kept (planning is cheap next to a step).
    plan_memory(Checkpoint::Balance::bytes);
    const std::size_t by_bytes = plan.planned_bytes;
    plan_memory(Checkpoint::Balance::nodes);
    if (by_bytes < plan.planned_bytes) plan_memory(Checkpoint::Balance::bytes);
  }
  fold_epilogues();
}

TESSERA_API program_state::~program_state() {
  try {
    keep_parameter_gradients();  // gradients in the arena would keep all of it alive
  } catch (...) {                // out of memory for the copies: they keep the arena instead
  }
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::autograd::detail
