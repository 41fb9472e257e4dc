// The memory plan of a compiled program (program_state::plan_memory): simulate walks the schedule
// and gives every written buffer an instance that lives from its write to its last read; place
// lets an elementwise node's output (or a gradient) take over an input that dies at its step,
// packs each device's buffers into one arena (arena.hpp) and fills MemoryPlan; report prints it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "tessera/autograd/detail/arena.hpp"
#include "tessera/autograd/detail/program_state.hpp"
#include "tessera/memory/format.hpp"
#include "tessera/memory/size_policy.hpp"

namespace tessera::autograd::detail {

inline std::size_t round_block(std::size_t bytes) {
  return bytes == 0 ? 0 : memory::pytorch_size_policy{}.round_size(bytes);
}
inline std::size_t align64(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

#if TESSERA_DEFINITIONS
TESSERA_API void program_state::plan_memory(Checkpoint::Balance by) {
  make_schedule(by);
  simulate();
  place();
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
        const bool of_parameter =
            g->values[static_cast<std::size_t>(gid)].role == value_role::parameter_gradient;
        // A parameter's gradient is the slot's, outside the arena; with gradients_in_arena it is
        // planned from its first write to the end of the run (read after backward).
        if (of_parameter && !gradients_in_arena) continue;
        if (current[static_cast<std::size_t>(gid)] < 0) {
          current[static_cast<std::size_t>(gid)] = new_instance(gid, i, false);
        }
        use(current[static_cast<std::size_t>(gid)], of_parameter ? end_of_time : i);
      }
      s.scratch_instance = new_scratch(n, n.backward_scratch(), i);
    }
  }
  parameter_grad_instance.assign(g->parameters.size(), -1);
  if (gradients_in_arena) {
    for (std::size_t p = 0; p < g->parameters.size(); ++p) {
      const int gid = g->values[static_cast<std::size_t>(g->parameters[p].value_id)].grad;
      if (gid >= 0) parameter_grad_instance[p] = current[static_cast<std::size_t>(gid)];
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
      // Read and written at the same index only when laid out alike (NHWC and NCHW are not).
      if (g->values[static_cast<std::size_t>(upstream)].strides !=
          g->values[static_cast<std::size_t>(written)].strides) {
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
        // An elementwise pass reads each element where it writes it only when the two values are
        // laid out alike (NHWC and NCHW are not).
        if (cv.strides != g->values[static_cast<std::size_t>(n.output)].strides) continue;
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
    // (With gradients_in_arena they are in the arena, counted among the temporaries.)
    if (v.grad >= 0 && !gradients_in_arena) plan.gradients += round_block(v.bytes());
  }
  for (int id : input_ids)
    plan.inputs += round_block(g->values[static_cast<std::size_t>(id)].bytes());
  plan.peak_bytes = plan.inputs + plan.parameters + plan.gradients + arena_blocks;
}

TESSERA_API void program_state::fold_epilogues() {
  plan.epilogues = 0;
  if (!epilogues) return;  // Options::epilogues
  // Nodes recomputed in the backward run their own forward again: none of them is folded.
  std::vector<char> recomputed(g->nodes.size(), 0);
  for (const step& s : schedule) {
    if (s.kind == step::recompute) recomputed[static_cast<std::size_t>(s.node)] = 1;
  }
  auto forward_at = [&](std::size_t i) -> const step* {
    if (i >= schedule.size() || schedule[i].kind != step::forward) return nullptr;
    return recomputed[static_cast<std::size_t>(schedule[i].node)] ? nullptr : &schedule[i];
  };
  // The next forward step after i that computes something: views in between (the next layer's
  // W.t(), traced before its operand is bound) only name buffers.
  auto next_after = [&](std::size_t i) {
    std::size_t j = i + 1;
    while (j < schedule.size() && schedule[j].kind == step::forward &&
           g->nodes[static_cast<std::size_t>(schedule[j].node)]->is_view()) {
      ++j;
    }
    return j;
  };
  // `after` writes where `before` did: it took over the buffer of a value that dies there.
  auto takes_over = [&](const step& before, const step& after) {
    return before.out_instance >= 0 && after.out_instance >= 0 &&
           instances[static_cast<std::size_t>(before.out_instance)].buffer ==
               instances[static_cast<std::size_t>(after.out_instance)].buffer;
  };
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const step* s = forward_at(i);
    const std::size_t j = next_after(i);
    const step* next = forward_at(j);
    if (s == nullptr || next == nullptr) continue;
    node& product = *g->nodes[static_cast<std::size_t>(s->node)];
    node& add = *g->nodes[static_cast<std::size_t>(next->node)];
    const node::epilogue_form form = add.epilogue();
    // (The bias read while the product writes: never the product itself, `y + y` of one row.)
    if (form.operand != product.output || form.bias < 0 || form.bias == form.operand ||
        is_output(product.output) || !takes_over(*s, *next)) {
      continue;
    }
    const value_info& bias = g->values[static_cast<std::size_t>(form.bias)];
    if (bias.strides != bias.shape.contiguous_strides()) continue;
    // A ReLU of the sum right after it, in place: folded too.
    node* relu = nullptr;
    if (const step* after = forward_at(next_after(j)); !form.relu && after != nullptr) {
      node& candidate = *g->nodes[static_cast<std::size_t>(after->node)];
      const node::epilogue_form then = candidate.epilogue();
      if (then.operand == add.output && then.bias < 0 && then.relu && !is_output(add.output) &&
          takes_over(*next, *after)) {
        relu = &candidate;
      }
    }
    if (!product.take_epilogue(form.bias, form.relu || relu != nullptr)) continue;
    add.folded_into = &product;
    if (relu != nullptr) relu->folded_into = &product;
    ++plan.epilogues;
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
  out += line(gradients_in_arena ? "parameter gradients (in the arena)" : "parameter gradients",
              plan.gradients);
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
                "epilogues folded into products: %d; arena %.1f%% of naive\n",
                mode == Mode::training ? "training" : "inference", plan.forward_steps,
                plan.backward_steps, plan.recomputed_steps,
                !cut                                             ? ""
                : plan.segments_by == Checkpoint::Balance::bytes ? " (segments of equal bytes)"
                                                                 : " (segments of equal nodes)",
                plan.in_place, plan.epilogues,
                plan.naive_bytes ? 100.0 * static_cast<double>(plan.planned_bytes) /
                                       static_cast<double>(plan.naive_bytes)
                                 : 0.0);
  return out + tail;
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::autograd::detail
