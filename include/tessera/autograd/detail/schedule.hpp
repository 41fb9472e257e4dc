// The schedule of a compiled program (program_state::make_schedule): the forward steps, then in
// training the seed and the backward steps in reverse, with each checkpointed segment's
// recomputation before its first backward step (the cut by nodes or by bytes); which values get a
// gradient (make_gradients), and after which step each parameter's gradient is final.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "tessera/autograd/detail/program_state.hpp"

namespace tessera::autograd::detail {

#if TESSERA_DEFINITIONS
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
    // Laid out as the value is: an NHWC value's gradient is NHWC.
    grad.strides = dense_strides(grad.shape, values[v].suggest_memory_format());
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

#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::autograd::detail
