// How the recorded operations write gradients (autograd/ops.hpp): store_gradient, which sums an
// expression over the dimensions its target was broadcast along, the gradient jobs of an
// elementwise expression (one per Var leaf, from autograd/derivative.hpp), and the two bases most
// nodes build their backward on: expression_backward_node (an expression's jobs) and
// single_input_node (one input's gradient).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/derivative.hpp"
#include "tessera/autograd/var.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/reduce.hpp"

namespace tessera::autograd::detail {

using tessera::detail::as_node;

/// The dims of `full` summed to reach `target` (NumPy broadcasting read backwards): leading dims
/// `target` lacks, and dims where `target` has extent 1.
TESSERA_API std::vector<int> broadcast_dims(const Shape& full, const Shape& target);

#if TESSERA_DEFINITIONS
TESSERA_API std::vector<int> broadcast_dims(const Shape& full, const Shape& target) {
  std::vector<int> dims;
  const int lead = full.size() - target.size();
  for (int d = 0; d < full.size(); ++d) {
    if (d < lead || (target[d - lead] == 1 && full[d] != 1)) dims.push_back(d);
  }
  return dims;
}
#endif  // TESSERA_DEFINITIONS

using tessera::detail::add_into;  // every planned buffer shares the arena's storage

/// Scratch bytes store_gradient needs for an expression of shape `shape` into `target`.
template <class T>
std::size_t store_gradient_scratch(const Shape& shape, const Shape& target) {
  const Shape full = broadcast_shapes(shape, target, "gradient");
  if (full == target) return 0;
  // A target that is not contiguous (an NHWC gradient) is summed into a contiguous one first.
  if (shape == full && broadcast_dims(full, target).size() == 1)
    return 2 * scratch_bytes<T>(target);
  return 2 * scratch_bytes<T>(full) + scratch_bytes<T>(target) + 64;
}

/// sum of `node` along `dim` into `out` (contiguous, the reduced element count).
template <class T, class K, class Node>
void sum_dim_into(const Tensor<T, K>& out, const Node& node, int dim) {
  using V = typename Node::value_type;
  tessera::detail::reduce_dim_into<backend::sum_op<accumulate_t<V>>, backend::finish_value, T>(
      out, node, dim, "sum");
}

/// target = e (or target += e when `accumulate`), with e summed over the dimensions where target
/// was broadcast.
template <class T, class K, class E>
void store_gradient(const Tensor<T, K>& target, const E& e, bool accumulate, value_table& table) {
  Tensor<T, K> out = target;
  const Shape full = broadcast_shapes(e.shape(), target.shape(), "gradient");
  if (full == target.shape()) {
    if constexpr (std::is_same_v<E, tensor_leaf<T, K>>) {
      // The upstream gradient itself into the very buffer it is (a gradient that took over its
      // upstream's, node::backward_in_place: `y + b`'s gradient of y): nothing to write.
      if (!accumulate && e.tensor.data() == out.data() && e.tensor.shape() == out.shape() &&
          e.tensor.strides() == out.strides()) {
        return;
      }
    }
    // e broadcasts to the target (e.g. a 0-dim upstream gradient): written or added directly.
    if (accumulate) {
      add_into(out, e);
    } else {
      tessera::detail::run_expression(out, e);
    }
    return;
  }
  if (!target.is_contiguous()) {
    // The sums below write contiguous tensors: into one from the scratch, then into the target
    // through its strides (an NHWC gradient of a broadcast operand).
    const Tensor<T, K> sums = table.scratch_tensor<T, K>(target.shape());
    store_gradient(sums, e, false, table);
    if (accumulate) {
      add_into(out, sums);
    } else {
      tessera::detail::run_expression(out, as_node(sums));
    }
    return;
  }
  const auto dims = broadcast_dims(full, target.shape());
  if (dims.size() == 1 && e.shape() == full) {
    if (accumulate) {
      auto partial = table.scratch_tensor<T, K>(target.shape());
      sum_dim_into(partial, e, dims[0]);
      add_into(out, partial);
    } else {
      sum_dim_into(out, e, dims[0]);
    }
    return;
  }
  // Several dims: evaluate once (broadcast to the full shape), then reduce one dim at a time,
  // keeping it with extent 1.
  auto current = table.scratch_tensor<T, K>(full);
  tessera::detail::run_expression(current, e);
  Tensor<T, K> spare;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    Shape next_shape = current.shape();
    next_shape[dims[i]] = 1;
    const bool last = i + 1 == dims.size();
    Tensor<T, K> next;
    if (last && !accumulate) {
      next = out.view(next_shape);
    } else if (i == 0) {
      next = table.scratch_tensor<T, K>(next_shape);
      spare = current;
    } else {
      // Ping-pong: the buffer before `current` is free again and large enough.
      next = Tensor<T, K>(spare.storage(), next_shape, next_shape.contiguous_strides(),
                          spare.storage_offset());
      spare = current;
    }
    sum_dim_into(next, as_node(current), dims[i]);
    current = next;
  }
  if (accumulate) add_into(out, current.view(target.shape()));
}

// ---- gradient jobs: one per Var leaf position of an expression ----------------------------------

struct gradient_job {
  int target = -1;  // the value whose gradient this writes
  Shape full_shape;
  Shape target_shape;
  std::size_t element_size = 0;  // of the target's dtype
  std::vector<int> value_reads;  // forward values the gradient expression reads
  std::vector<int> grad_reads;   // values whose gradients it reads
  virtual ~gradient_job() = default;
  virtual void run(value_table& table, bool accumulate) = 0;
  virtual std::size_t scratch() const = 0;
};

template <class T, class K, class G>
struct gradient_job_of final : gradient_job {
  G expression;
  explicit gradient_job_of(G g) : expression(std::move(g)) { element_size = sizeof(T); }
  void run(value_table& table, bool accumulate) override {
    store_gradient(table.template grad<T, K>(target), rebind(expression, table), accumulate, table);
  }
  std::size_t scratch() const override {
    return store_gradient_scratch<T>(full_shape, target_shape);
  }
};

/// The gradient jobs of expression `e` for upstream gradient `g`.
class expression_gradients {
 public:
  template <class E, class G>
  void build(const E& e, const G& g) {
    auto emit = [this](const auto& leaf, const auto& gradient) {
      using L = std::remove_cvref_t<decltype(leaf)>;
      using GE = std::remove_cvref_t<decltype(gradient)>;
      auto job =
          std::make_unique<gradient_job_of<typename L::value_type, typename L::device_kind, GE>>(
              gradient);
      job->target = leaf.id();
      job->full_shape = gradient.shape();
      job->target_shape = leaf.shape();
      for_each_var(gradient, [&](const auto& var) {
        (var.is_grad() ? job->grad_reads : job->value_reads).push_back(var.id());
      });
      jobs_.push_back(std::move(job));
    };
    backprop(e, g, emit);
  }
  TESSERA_API void finalize(const std::vector<value_info>& values);
  /// Moves last a job that writes its whole target elementwise from an upstream gradient of
  /// `upstream_shape` and `upstream_element_size` (no broadcast, the only job of its target), so
  /// that it runs after every other read of the upstream gradient. True when there is one: its
  /// target's gradient may then share the upstream gradient's buffer (node::backward_in_place).
  TESSERA_API bool move_in_place_job_last(const Shape& upstream_shape,
                                          std::size_t upstream_element_size);
  TESSERA_API std::vector<int> contributions() const;
  TESSERA_API void add_reads(std::vector<int>& values, std::vector<int>& grads) const;
  TESSERA_API std::size_t scratch() const;
  TESSERA_API void run(value_table& table, const std::vector<char>& accumulate);
  bool empty() const { return jobs_.empty(); }

 private:
  std::vector<std::unique_ptr<gradient_job>> jobs_;
};

/// Reads of a node's backward: forward values, and gradients (encoded as -2 - value id).
TESSERA_API std::vector<int> encode_reads(const std::vector<int>& values,
                                          const std::vector<int>& grads);

#if TESSERA_DEFINITIONS
TESSERA_API std::vector<int> encode_reads(const std::vector<int>& values,
                                          const std::vector<int>& grads) {
  std::vector<int> out = values;
  for (int g : grads) out.push_back(-2 - g);
  return out;
}
TESSERA_API void expression_gradients::finalize(const std::vector<value_info>& values) {
  std::erase_if(jobs_, [&](const auto& job) {
    return !values[static_cast<std::size_t>(job->target)].requires_grad;
  });
}
TESSERA_API bool expression_gradients::move_in_place_job_last(const Shape& upstream_shape,
                                                              std::size_t upstream_element_size) {
  for (std::size_t i = jobs_.size(); i-- > 0;) {
    const gradient_job& job = *jobs_[i];
    if (job.full_shape != upstream_shape || job.target_shape != upstream_shape ||
        job.element_size != upstream_element_size) {
      continue;
    }
    const auto same_target = std::count_if(
        jobs_.begin(), jobs_.end(), [&](const auto& other) { return other->target == job.target; });
    if (same_target != 1) continue;
    std::rotate(jobs_.begin() + static_cast<std::ptrdiff_t>(i),
                jobs_.begin() + static_cast<std::ptrdiff_t>(i) + 1, jobs_.end());
    return true;
  }
  return false;
}
TESSERA_API std::vector<int> expression_gradients::contributions() const {
  std::vector<int> out;
  for (const auto& job : jobs_) out.push_back(job->target);
  return out;
}
TESSERA_API void expression_gradients::add_reads(std::vector<int>& values,
                                                 std::vector<int>& grads) const {
  for (const auto& job : jobs_) {
    values.insert(values.end(), job->value_reads.begin(), job->value_reads.end());
    grads.insert(grads.end(), job->grad_reads.begin(), job->grad_reads.end());
  }
}
TESSERA_API std::size_t expression_gradients::scratch() const {
  std::size_t most = 0;
  for (const auto& job : jobs_) most = std::max(most, job->scratch());
  return most;
}
TESSERA_API void expression_gradients::run(value_table& table,
                                           const std::vector<char>& accumulate) {
  for (std::size_t i = 0; i < jobs_.size(); ++i) {
    table.scratch_offset = table.scratch_begin;
    jobs_[i]->run(table, accumulate[i] != 0);
  }
}
#endif  // TESSERA_DEFINITIONS

template <class E>
std::vector<int> distinct_vars(const E& e) {
  std::vector<int> ids;
  for_each_var(e, [&](const auto& var) {
    if (!var.is_grad() && std::find(ids.begin(), ids.end(), var.id()) == ids.end()) {
      ids.push_back(var.id());
    }
  });
  return ids;
}

/// A node whose backward is the gradient jobs of one expression (fused and reduce nodes).
class expression_backward_node : public node {
 public:
  TESSERA_API void finalize(const std::vector<value_info>& values) override;
  TESSERA_API std::vector<int> contributions() const override;
  TESSERA_API std::vector<int> backward_reads() const override;
  TESSERA_API std::size_t backward_scratch() const override;
  TESSERA_API void backward(value_table& table, const std::vector<char>& accumulate) override;

 protected:
  expression_gradients gradients_;
};

#if TESSERA_DEFINITIONS
TESSERA_API void expression_backward_node::finalize(const std::vector<value_info>& values) {
  gradients_.finalize(values);
}
TESSERA_API std::vector<int> expression_backward_node::contributions() const {
  return gradients_.contributions();
}
TESSERA_API std::vector<int> expression_backward_node::backward_reads() const {
  std::vector<int> values, grads;
  gradients_.add_reads(values, grads);
  return encode_reads(values, grads);
}
TESSERA_API std::size_t expression_backward_node::backward_scratch() const {
  return gradients_.scratch();
}
TESSERA_API void expression_backward_node::backward(value_table& table,
                                                    const std::vector<char>& accumulate) {
  gradients_.run(table, accumulate);
}
#endif  // TESSERA_DEFINITIONS

/// A node with one differentiable input: backward adds to that input's gradient when it needs
/// one, reading the output's gradient and the forward values saved() names.
class single_input_node : public node {
 public:
  TESSERA_API void finalize(const std::vector<value_info>& values) override;
  TESSERA_API std::vector<int> contributions() const override;
  TESSERA_API std::vector<int> backward_reads() const override;

 protected:
  TESSERA_API virtual std::vector<int> saved() const;
  bool needs_ = false;
};

#if TESSERA_DEFINITIONS
TESSERA_API void single_input_node::finalize(const std::vector<value_info>& values) {
  needs_ = values[static_cast<std::size_t>(inputs[0])].requires_grad;
}
TESSERA_API std::vector<int> single_input_node::contributions() const {
  return needs_ ? std::vector<int>{inputs[0]} : std::vector<int>{};
}
TESSERA_API std::vector<int> single_input_node::backward_reads() const {
  return needs_ ? encode_reads(saved(), {output}) : std::vector<int>{};
}
TESSERA_API std::vector<int> single_input_node::saved() const { return {}; }
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::autograd::detail
