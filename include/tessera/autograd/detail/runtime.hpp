// Running a compiled program (autograd/program.hpp): binding the inputs and parameters
// (program_state::bind), allocating the arenas once and binding every planned buffer (allocate),
// the forward and backward steps with their planned scratch (run_forward, run_backward) and the
// gradient hooks, and handing results out so that those a user keeps keep their values
// (hand_out, keep_handed_out); release frees the arenas.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/autograd/detail/graph_replay.hpp"
#include "tessera/autograd/detail/program_state.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/detail/copy.hpp"
#include "tessera/tensor/storage.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::autograd::detail {

// The hooks a Program installs (out of line in compiled mode).
TESSERA_API void add_gradient_hook(program_state& state,
                                   std::function<void(const GradientReady&)> hook);
TESSERA_API void set_product_hook(program_state& state,
                                  std::function<bool(ParameterProduct&)> hook);

#if TESSERA_DEFINITIONS
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
    // A value's strides are dense (contiguous or channels_last): the same bytes either way.
    const auto offset = static_cast<std::int64_t>(buf.offset / element_size(info.dtype));
    instance_tensors[i] = AnyTensor(info.dtype, arena, info.shape, info.strides, offset);
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
  keep_parameter_gradients();
  if (cuda_graph && !replay) {
    run_forward_graphed();
  } else {
    if (graphs != nullptr) graphs->forward_graphed = false;
    run_forward_steps(replay);
  }
  forwarded = true;
}

TESSERA_API void program_state::run_forward_steps(bool replay) {
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const step& s = schedule[i];
    if (s.kind != step::forward) break;
    if (replay && g->nodes[static_cast<std::size_t>(s.node)]->is_effect()) continue;
    run_node_forward(s);
  }
}

TESSERA_API AnyTensor program_state::hand_out(const AnyTensor& value, std::vector<Storage>& blocks,
                                              std::size_t k) {
  if (!value.defined() || !value.storage().defined()) return value;
  if (blocks.size() <= k) blocks.resize(k + 1);
  Storage& block = blocks[k];
  // The block holds exactly the bytes the value's elements reach, from its lowest one.
  const tessera::detail::element_span span =
      tessera::detail::span_of(value.shape(), value.strides());
  const auto element = static_cast<std::int64_t>(element_size(value.dtype()));
  const char* first = static_cast<const char*>(value.data_ptr()) + span.first * element;
  const auto bytes = static_cast<std::size_t>((span.last - span.first) * element);
  if (!block.defined() || block.data() != first || block.bytes() != bytes) {
    block = Storage::share(
        value.storage(),
        static_cast<std::size_t>(first - static_cast<const char*>(value.storage().data())), bytes);
  }
  return AnyTensor(value.dtype(), block, value.shape(), value.strides(), -span.first);
}

namespace runtime_detail {
/// The handed-out blocks still held elsewhere (use_count above 1) move their handles to a copy of
/// their bytes, and the program lets go of them (it makes another block next time).
inline void move_held_to_copies(std::vector<Storage>& blocks) {
  for (Storage& block : blocks) {
    if (!block.defined() || block.use_count() == 1) continue;
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
}  // namespace runtime_detail

TESSERA_API void program_state::keep_handed_out() {
  runtime_detail::move_held_to_copies(result_blocks);  // kept by the user
  runtime_detail::move_held_to_copies(grad_blocks);
}

TESSERA_API void program_state::keep_parameter_gradients() {
  if (!gradients_in_arena || !g) return;
  for (std::size_t p = 0; p < parameter_grad_instance.size(); ++p) {
    if (parameter_grad_instance[p] < 0) continue;
    const parameter_binding& binding = g->parameters[p];
    // The table's handle (bound by the last backward), then the slot's gradient when zero_grad()
    // cleared it (in the arena or not: the next backward writes into the arena).
    table.tensors[static_cast<std::size_t>(
        g->values[static_cast<std::size_t>(binding.value_id)].grad)] = AnyTensor{};
    binding.drop_zero_grad(binding.slot.get());
  }
  // What is still held (the slot's values, a handle of yours) moves to a copy.
  runtime_detail::move_held_to_copies(parameter_grad_blocks);
}

TESSERA_API void program_state::release() {
  keep_parameter_gradients();  // a gradient in the arena would keep all of it alive
  // Handed-out results and gradients keep the arena's bytes they show alive (their blocks hold
  // the arena); the program lets go of its blocks with it.
  result_blocks.clear();
  grad_blocks.clear();
  parameter_grad_blocks.clear();
  arenas.clear();
  instance_tensors.clear();
  for (AnyTensor& t : table.tensors) t = AnyTensor{};
  table.scratch = Storage{};
  allocated = false;
  forwarded = false;
  graphs.reset();  // its graphs keep the arena's addresses
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
  // are unwritten (a new gradient, or one after zero_grad). Recorded first, so that a backward
  // that throws puts every gradient back.
  grads_before_.assign(g->parameters.size(), grad_before::none);
  std::size_t recorded = 0;
  try {
    for (; recorded < g->parameters.size(); ++recorded) {
      const std::size_t p = recorded;
      const int gid = g->values[static_cast<std::size_t>(g->parameters[p].value_id)].grad;
      if (gid < 0) continue;
      auto [grad, zero] = record_gradient(p);
      table.tensors[static_cast<std::size_t>(gid)] = std::move(grad);
      const auto [at, position] = first_contribution[p];
      if (at >= 0) {  // (a gradient no step contributes to keeps its unwritten zeros)
        schedule[static_cast<std::size_t>(at)].accumulate[static_cast<std::size_t>(position)] =
            zero ? 0 : 1;
      }
    }
    // From here a backward that throws needs a new forward (its steps reuse the forward's
    // buffers); one that could not make its gradients may be called again.
    forwarded = false;
    if (cuda_graph) {
      run_backward_graphed(seed, seed_value);
    } else {
      run_backward_steps(seed, seed_value);
    }
  } catch (...) {
    restore_gradients_before(recorded);
    throw;
  }
}

TESSERA_API std::pair<AnyTensor, bool> program_state::record_gradient(std::size_t p) {
  const parameter_binding& binding = g->parameters[p];
  const bool had = binding.has_grad();
  if (!had && gradients_in_arena && parameter_grad_instance[p] >= 0) {
    // Options::gradients_in_arena: the gradient is the arena's buffer, handed to the slot through
    // a block of its own (keep_parameter_gradients tells from it whether it is still held).
    if (parameter_grad_blocks.size() < g->parameters.size()) {
      parameter_grad_blocks.resize(g->parameters.size());
    }
    binding.adopt_grad(
        binding.slot.get(),
        hand_out(instance_tensors[static_cast<std::size_t>(parameter_grad_instance[p])],
                 parameter_grad_blocks, p));
  }
  auto [grad, zero] = binding.grad_for_backward();  // creates it (zero) when there was none
  const grad_before before = !had ? grad_before::none : zero ? grad_before::zero : grad_before::values;
  grads_before_[p] = before;
  if (before == grad_before::values && restore_gradients) {
    if (grad_copies_.size() < g->parameters.size()) grad_copies_.resize(g->parameters.size());
    AnyTensor& copy = grad_copies_[p];
    if (!copy.defined() || copy.shape() != grad.shape() || copy.dtype() != grad.dtype() ||
        copy.device() != grad.device()) {
      copy = grad.clone();
    } else {
      copy.copy_(grad);
    }
  } else if (p < grad_copies_.size()) {
    grad_copies_[p] = AnyTensor{};  // held only while the gradient accumulates
  }
  return {std::move(grad), zero};
}

TESSERA_API void program_state::restore_gradients_before(std::size_t count) noexcept {
  for (std::size_t p = 0; p < count && p < grads_before_.size(); ++p) {
    const parameter_binding& binding = g->parameters[p];
    if (g->values[static_cast<std::size_t>(binding.value_id)].grad < 0) continue;
    switch (grads_before_[p]) {
      case grad_before::none:
        binding.unwrite(true);
        break;
      case grad_before::zero:
        binding.unwrite(false);
        break;
      case grad_before::values:
        if (!restore_gradients || p >= grad_copies_.size() || !grad_copies_[p].defined()) break;
        try {
          binding.grad_for_backward().first.copy_(grad_copies_[p]);
        } catch (...) {  // a copy into an existing buffer of its own shape: cannot fail short of
        }                // a device fault, which the next call reports
        break;
    }
  }
}

TESSERA_API void program_state::run_backward_steps(const AnyTensor* seed, double seed_value) {
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
        const profiler::range timing(n.name(), "backward", node_device(n));
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
  // Work the product before it did as its epilogue (fold_epilogues): nothing left to do.
  if (n.folded_into != nullptr && n.folded_into->epilogue_applied()) return;
  bind_scratch(s);
  const profiler::range timing(n.name(), s.kind == step::recompute ? "recompute" : "forward",
                               node_device(n));
  n.forward(table);
}

TESSERA_API void program_state::fill_value(const AnyTensor& t, double value) {
  if (is_floating_point(t.dtype())) t.fill_(value);
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
    // Bound as they are laid out, dense contiguous or channels_last (Module::to(memory_format));
    // the layers read them through their strides (and copy them where they need another layout).
    const bool dense =
        value.defined() && (value.is_contiguous() || tessera::detail::is_channels_last_contiguous(
                                                         value.shape(), value.strides()));
    if (!value.defined() || value.shape() != info.shape || value.dtype() != info.dtype ||
        value.device() != info.device || !dense) {
      throw error("Program::forward: parameter " + std::to_string(p) +
                  " changed since compile: " + "traced as " + std::string(name(info.dtype)) + " " +
                  info.shape.str() + " on " + info.device.str() + ", now " +
                  (value.defined() ? std::string(name(value.dtype())) + " " + value.shape().str() +
                                         " on " + value.device().str() +
                                         (dense ? ""
                                                : " (not dense: a program's parameters are "
                                                  "contiguous or channels_last; make it so with "
                                                  "Module::to(memory_format))")
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

TESSERA_API void add_gradient_hook(program_state& state,
                                   std::function<void(const GradientReady&)> hook) {
  state.hooks.push_back(std::move(hook));
}
TESSERA_API void set_product_hook(program_state& state,
                                  std::function<bool(ParameterProduct&)> hook) {
  state.table.product_hook = std::move(hook);
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::autograd::detail
