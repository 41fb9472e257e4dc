// What autograd::compile takes and what a compiled Program reports: Options (training or
// inference, recomputation by Checkpoint, a gradient given to backward), MemoryPlan (where the
// program's memory goes) and GradientReady (what a gradient hook receives). compile and Program
// are in autograd/program.hpp.
#pragma once

#include <cstddef>

#include "tessera/autograd/var.hpp"
#include "tessera/tensor/any_tensor.hpp"

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
  /// A backward that throws part-way (out of memory in a node, a gradient hook that throws) puts
  /// every parameter's gradient back as it was before it: none, zero, or its values. Zero and
  /// none cost nothing to keep; a gradient that accumulates onto earlier values (a second
  /// backward without zero_grad) is copied first, into a buffer the program keeps. false: no
  /// copy, and a failed backward leaves those gradients part-written (DataParallel, DDP and
  /// Pipeline turn it off: they keep the module's gradients themselves, once per step).
  bool restore_gradients = true;
  /// CUDA graphs: a program on one CUDA device runs its first forward and backward as usual (on
  /// a stream of its own), captures each into a CUDA graph at its second run, and from then on
  /// replays them, one launch each instead of one per kernel. Inputs are copied into the
  /// program's own buffers first; the host checks that read device values (cross_entropy's
  /// targets) run before each replay, and a replay whose choices differ (a module switched
  /// between train() and eval(), a parameter or gradient replaced, another seed) captures again.
  /// Results are the same as without. What cannot be replayed (random numbers, dropout in
  /// training, on_forward effects, BatchNorm with momentum None, gradient hooks, several
  /// devices, CPU programs) runs as usual, and Program::cuda_graphs() says why.
  bool cuda_graph = false;
  /// The parameters' gradients live in the program's arena, planned with its other buffers: a
  /// gradient takes memory from the backward step that first writes it, where the forward's
  /// activations have died, instead of beside them for the whole step (PyTorch gets the same by
  /// zero_grad(set_to_none=True) freeing them and backward allocating them). ResNet-50's planned
  /// peak falls by 63 MiB at batch 8 (of its 97.5 MiB of gradients). The price, at the next forward
  /// (which reuses the arena): a gradient zero_grad() cleared is let go of (it reads as none until
  /// the next backward, as after PyTorch's zero_grad), and one that still holds values (accumulated
  /// over several backward calls, or kept by you) is copied out first, as kept results are.
  /// Training mode only; a gradient that already exists when backward runs (made elsewhere, or
  /// copied out) is added to where it is.
  bool gradients_in_arena = false;
  /// A 2-D product followed by `+ b` (a row vector: Linear's bias) and optionally a ReLU, each
  /// taking over the buffer before it, writes them itself (cuBLASLt's BIAS / RELU_BIAS epilogue
  /// on CUDA; the product then one pass on the CPU) and the elementwise nodes skip their forward.
  /// MemoryPlan::epilogues counts them. false: each stays a pass of its own (for an A/B).
  bool epilogues = true;
};

/// Where a program's memory goes, in bytes. planned_bytes is the arena (all devices);
/// naive_bytes what the same values would take with a buffer each. parameters, gradients and
/// inputs are what the pool allocates for them (rounded to its blocks); activations (forward
/// values) and temporaries (gradients of activations, recomputed values, scratch) are naive
/// sums. peak_bytes = inputs + parameters + gradients + the arena as the pool allocates it.
/// With Options::gradients_in_arena the parameters' gradients are in the arena (among the
/// temporaries) and `gradients` is 0.
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
  /// Matrix products that add the bias after them (and the ReLU after that) as they write, the
  /// elementwise nodes' work folded into the product (cuBLASLt's epilogues on CUDA).
  int epilogues = 0;
};

/// What a gradient-ready hook receives: the parameter's index in the program (first use order),
/// its slot (identity) and its gradient, final for this backward.
struct GradientReady {
  std::size_t index = 0;
  const void* parameter = nullptr;
  AnyTensor grad;
};

}  // namespace tessera::autograd
