// The recorded operations: fused elementwise expressions, reductions of expressions, max/min,
// softmax/log_softmax, matmul, views, cat and copies between ordinals, each with its derivative,
// and the Var methods and ts:: overloads that record them while tracing.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/derivative.hpp"
#include "tessera/core/random.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/expr/reduce.hpp"
#include "tessera/tensor/cat.hpp"
#include "tessera/tensor/factories.hpp"

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
  if (shape == full && broadcast_dims(full, target).size() == 1) return scratch_bytes<T>(target);
  return 2 * scratch_bytes<T>(full) + 64;
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
    // e broadcasts to the target (e.g. a 0-dim upstream gradient): written or added directly.
    if (accumulate) {
      add_into(out, e);
    } else {
      tessera::detail::run_expression(out, e);
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

// ---- nodes ------------------------------------------------------------------------------------

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

/// A fused elementwise expression: forward is one executor pass, each input's gradient another.
template <class T, class K, class E>
class fused_node final : public expression_backward_node {
 public:
  explicit fused_node(E e) : expression_(std::move(e)) { inputs = distinct_vars(expression_); }
  const char* name() const override { return "fused"; }
  // Out of the class (not inline): where the node's type is compiled in tessera::compiled
  // (an extern template), a unit that records it instantiates none of its kernels (nvcc's
  // front end instantiates a class's inline virtual functions even then).
  void trace_backward(graph* g);
  void forward(value_table& table) override;
  std::vector<int> inplace_candidates() const override {
    std::vector<int> ids;
    for_each_var(expression_, [&](const auto& var) {
      using L = std::remove_cvref_t<decltype(var)>;
      if (!var.is_grad() && sizeof(typename L::value_type) == sizeof(T) &&
          var.shape() == expression_.shape()) {
        ids.push_back(var.id());
      }
    });
    return ids;
  }
  void finalize(const std::vector<value_info>& values) override {
    expression_backward_node::finalize(values);
    // Each job is one elementwise pass reading the upstream gradient at the output's index.
    in_place_ = gradients_.move_in_place_job_last(expression_.shape(), sizeof(T));
  }
  bool backward_in_place() const override { return in_place_; }

 private:
  E expression_;
  bool in_place_ = false;
};

template <class T, class K, class E>
void fused_node<T, K, E>::forward(value_table& table) {
  tessera::detail::run_expression(table.template get<T, K>(output), rebind(expression_, table));
}

template <class T, class K, class E>
void fused_node<T, K, E>::trace_backward(graph* g) {
  if constexpr (is_floating_point_v<T>) {
    gradients_.build(expression_, Var<T, K>(g, output, expression_.shape(), true));
  }
}

/// sum or mean of an expression, over everything or along one dim: reads the expression without
/// storing it; the gradient is the expression's, with the upstream gradient broadcast back.
template <class Out, class K, class E, bool Mean>
class reduce_node final : public expression_backward_node {
 public:
  reduce_node(E e, int dim, bool keepdim)
      : expression_(std::move(e)), dim_(dim), keepdim_(keepdim) {
    inputs = distinct_vars(expression_);
  }
  const char* name() const override { return Mean ? "mean" : "sum"; }
  void trace_backward(graph* g);  // out of the class, as fused_node's
  void forward(value_table& table) override {
    using V = typename E::value_type;
    using op = backend::sum_op<accumulate_t<V>>;
    using finish = std::conditional_t<Mean, backend::finish_mean, backend::finish_value>;
    const auto bound = rebind(expression_, table);
    const auto out = table.template get<Out, K>(output);
    if (dim_ < 0) {
      tessera::detail::reduce_all_into<op, finish, Out>(out, bound, name());
    } else {
      tessera::detail::reduce_dim_into<op, finish, Out>(out, bound, dim_, name());
    }
  }

 private:
  E expression_;
  int dim_;
  bool keepdim_;
};

template <class Out, class K, class E, bool Mean>
void reduce_node<Out, K, E, Mean>::trace_backward(graph* g) {
  if constexpr (is_floating_point_v<Out>) {
    Shape upstream_shape;  // 0-dim for a full reduction: broadcasts everywhere
    std::int64_t count = expression_.shape().numel();
    if (dim_ >= 0) {
      upstream_shape = expression_.shape();
      count = upstream_shape[dim_];
      upstream_shape[dim_] = 1;
    }
    const Var<Out, K> upstream(g, output, upstream_shape, true);
    if constexpr (Mean) {
      gradients_.build(expression_,
                       bin<ops::multiply>(upstream, lit(1.0 / static_cast<double>(count))));
    } else {
      gradients_.build(expression_, upstream);
    }
  }
}

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

/// max or min of a value, over everything or along one dim. The gradient goes to the elements
/// equal to the result, split evenly among ties (PyTorch's amax/amin rule).
template <class T, class K, bool Max>
class extremum_node final : public single_input_node {
 public:
  extremum_node(int input, Shape input_shape, int dim)
      : input_shape_(std::move(input_shape)), dim_(dim) {
    inputs = {input};
    kept_shape_ = dim_ < 0 ? Shape{} : input_shape_;
    if (dim_ >= 0) kept_shape_[dim_] = 1;
  }
  const char* name() const override { return Max ? "max" : "min"; }
  void forward(value_table& table) override {
    using op = std::conditional_t<Max, backend::max_op<T>, backend::min_op<T>>;
    const auto x = as_node(table.template get<T, K>(inputs[0]));
    const auto out = table.template get<T, K>(output);
    if (dim_ < 0) {
      tessera::detail::reduce_all_into<op, backend::finish_value, T>(out, x, name());
    } else {
      tessera::detail::reduce_dim_into<op, backend::finish_value, T>(out, x, dim_, name());
    }
  }
  std::vector<int> saved() const override { return {inputs[0], output}; }
  std::size_t backward_scratch() const override { return scratch_bytes<T>(kept_shape_); }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    if (!needs_) return;
    table.scratch_offset = table.scratch_begin;
    const auto x = table.template get<T, K>(inputs[0]);
    const auto m = table.template get<T, K>(output).view(kept_shape_);
    const auto g = table.template grad<T, K>(output).view(kept_shape_);
    auto count = table.template scratch_tensor<T, K>(kept_shape_);
    const auto hits = cast<T>(x == m);
    if (dim_ < 0) {
      tessera::detail::reduce_all_into<backend::sum_op<accumulate_t<T>>, backend::finish_value, T>(
          count, hits, "sum");
    } else {
      sum_dim_into(count, hits, dim_);
    }
    store_gradient(table.template grad<T, K>(inputs[0]), where(x == m, g / count, 0.0),
                   accumulate[0] != 0, table);
  }

 private:
  Shape input_shape_;
  Shape kept_shape_;
  int dim_;
};

/// softmax or log_softmax along a dim; backward reads the output only.
template <class T, class K, bool Log>
class softmax_node final : public single_input_node {
 public:
  softmax_node(int input, Shape shape, int dim) : shape_(std::move(shape)), dim_(dim) {
    inputs = {input};
    kept_shape_ = shape_;
    if (kept_shape_.size() > 0) kept_shape_[dim_] = 1;
  }
  const char* name() const override { return Log ? "log_softmax" : "softmax"; }
  void forward(value_table& table) override {
    tessera::detail::softmax_into<Log>(table.template get<T, K>(output),
                                       as_node(table.template get<T, K>(inputs[0])), dim_, name());
  }
  std::vector<int> saved() const override { return {output}; }
  std::size_t backward_scratch() const override {
    return scratch_bytes<T>(kept_shape_) + store_gradient_scratch<T>(shape_, shape_);
  }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    if (!needs_) return;
    table.scratch_offset = table.scratch_begin;
    const auto y = table.template get<T, K>(output);
    const auto g = table.template grad<T, K>(output);
    auto s = table.template scratch_tensor<T, K>(kept_shape_);
    const int d = shape_.size() == 0 ? 0 : dim_;
    if constexpr (Log) {
      // d/dx log_softmax: g - exp(y) * sum(g)
      if (shape_.size() == 0) {
        s.copy_(g);
      } else {
        sum_dim_into(s, as_node(g), d);
      }
      store_gradient(table.template grad<T, K>(inputs[0]), g - exp(y) * s, accumulate[0] != 0,
                     table);
    } else {
      // d/dx softmax: y * (g - sum(g * y))
      if (shape_.size() == 0) {
        s.copy_(Tensor<T, K>(g * y));
      } else {
        sum_dim_into(s, g * y, d);
      }
      store_gradient(table.template grad<T, K>(inputs[0]), y * (g - s), accumulate[0] != 0, table);
    }
  }

 private:
  Shape shape_;
  Shape kept_shape_;
  int dim_;
};

/// matmul of two values (2-D, batched 3-D, or 3-D with a shared 2-D right operand). An operand
/// that is the transpose of a 2-D value (x @ W.t(), as in Linear) is read through the value
/// itself: its gradient goes straight into the value's gradient, transposed by the product's
/// own layout, with no buffer for the view's gradient and no copy.
template <class T, class K>
class matmul_node final : public node {
 public:
  matmul_node(int a, bool a_transposed, int b, bool b_transposed, Shape a_shape, Shape b_shape)
      : ta_(a_transposed),
        tb_(b_transposed),
        a_shape_(std::move(a_shape)),
        b_shape_(std::move(b_shape)) {
    inputs = {a, b};
  }
  const char* name() const override { return "matmul"; }
  void forward(value_table& table) override {
    auto out = table.template get<T, K>(output);
    tessera::detail::matmul_into(out, operand_a(table), operand_b(table));
  }
  void finalize(const std::vector<value_info>& values) override {
    needs_a_ = values[static_cast<std::size_t>(inputs[0])].requires_grad;
    needs_b_ = values[static_cast<std::size_t>(inputs[1])].requires_grad;
  }
  std::vector<int> contributions() const override {
    std::vector<int> out;
    if (needs_a_) out.push_back(inputs[0]);
    if (needs_b_) out.push_back(inputs[1]);
    return out;
  }
  std::vector<int> backward_reads() const override {
    std::vector<int> values;
    if (needs_a_) values.push_back(inputs[1]);
    if (needs_b_) values.push_back(inputs[0]);
    if (!needs_a_ && !needs_b_) return {};
    return encode_reads(values, {output});
  }
  std::size_t backward_scratch() const override {
    // Adding a product into a gradient needs a staging buffer only without BLAS's beta = 1.
    if (tessera::detail::matmul_accumulates<T, K>()) return 0;
    return std::max(scratch_bytes<T>(a_shape_), scratch_bytes<T>(b_shape_));
  }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    const auto g = table.template grad<T, K>(output);
    const auto a = operand_a(table);
    const auto b = operand_b(table);
    std::size_t next = 0;
    if (needs_a_) {
      const auto target = table.template grad<T, K>(inputs[0]);
      if (ta_) {
        // A = X^T: dX = (g B^T)^T = B g^T
        product_into(table, inputs[0], target, b, g.t(), accumulate[next++] != 0);
      } else {
        // dA = g @ B^T (B shared or batched)
        const auto bt = b.dim() == 3 ? b.transpose(1, 2) : b.t();
        product_into(table, inputs[0], target, g, bt, accumulate[next++] != 0);
      }
    }
    if (needs_b_) {
      const auto target = table.template grad<T, K>(inputs[1]);
      const bool shared = a.dim() == 3 && b.dim() == 2;
      // B shared by the batch: the batch stacked, dB = sum_i A_i^T g_i = A'^T g'.
      const auto a2 = shared ? a.reshape({a.size(0) * a.size(1), a.size(2)}) : a;
      const auto g2 = shared ? g.reshape({g.size(0) * g.size(1), g.size(2)}) : g;
      if (tb_) {
        // B = X^T: dX = (A^T g)^T = g^T A
        product_into(table, inputs[1], target, g2.t(), a2, accumulate[next++] != 0);
      } else {
        const auto at = a2.dim() == 3 ? a2.transpose(1, 2) : a2.t();
        product_into(table, inputs[1], target, at, g2, accumulate[next++] != 0);
      }
    }
  }

 private:
  // target (+)= x @ y, a contribution to the gradient of `value`, unless the program's caller
  // takes it (a parameter's product: value_table::hand_over_product).
  static void product_into(value_table& table, int value, Tensor<T, K> target,
                           const Tensor<T, K>& x, const Tensor<T, K>& y, bool accumulate) {
    if (table.hand_over_product(value, target, x, y, accumulate)) return;
    Tensor<T, K> staging;
    if (accumulate && !tessera::detail::matmul_accumulates<T, K>()) {
      table.scratch_offset = table.scratch_begin;
      staging = table.template scratch_tensor<T, K>(target.shape());
    }
    tessera::detail::matmul_add_into(target, x, y, accumulate, staging);
  }

  Tensor<T, K> operand_a(const value_table& table) const {
    const auto a = table.template get<T, K>(inputs[0]);
    return ta_ ? a.t() : a;
  }
  Tensor<T, K> operand_b(const value_table& table) const {
    const auto b = table.template get<T, K>(inputs[1]);
    return tb_ ? b.t() : b;
  }

  bool ta_, tb_;
  Shape a_shape_, b_shape_;
  bool needs_a_ = false, needs_b_ = false;
};

/// A view: the output shares the input's storage. Its gradient is written through the same view
/// of the input's gradient.
enum class view_kind { view, transpose, permute, narrow };

template <class T, class K>
class view_node final : public single_input_node {
 public:
  view_node(int input, view_kind kind, Shape shape, std::int64_t a = 0, std::int64_t b = 0,
            std::int64_t c = 0)
      : kind_(kind), shape_(std::move(shape)), a_(a), b_(b), c_(c) {
    inputs = {input};
  }
  const char* name() const override { return "view"; }
  bool is_view() const override { return true; }
  void forward(value_table& table) override {
    table.tensors[static_cast<std::size_t>(output)] = apply(table.template get<T, K>(inputs[0]));
  }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    if (!needs_) return;
    Tensor<T, K> grad_in = table.template grad<T, K>(inputs[0]);
    const auto g = table.template grad<T, K>(output);
    if (kind_ == view_kind::narrow && accumulate[0] == 0) grad_in.zero_();
    Tensor<T, K> region = apply(grad_in);
    if (accumulate[0] != 0 || kind_ == view_kind::narrow) {
      add_into(region, g);
    } else {
      tessera::detail::run_expression(region, as_node(g));
    }
  }

 private:
  Tensor<T, K> apply(const Tensor<T, K>& t) const {
    switch (kind_) {
      case view_kind::view:
        return t.view(shape_);
      case view_kind::transpose:
        return t.transpose(a_, b_);
      case view_kind::permute:
        return t.permute(permutation_);
      case view_kind::narrow:
        return t.narrow(a_, b_, c_);
    }
    return t;
  }

 public:
  Shape permutation_;

 private:
  view_kind kind_;
  Shape shape_;
  std::int64_t a_, b_, c_;
};

/// cat along a dim: each input copied into its slice of the output.
template <class T, class K>
class cat_node final : public node {
 public:
  cat_node(std::vector<int> ids, std::vector<std::int64_t> sizes, int dim)
      : sizes_(std::move(sizes)), dim_(dim) {
    inputs = std::move(ids);
  }
  const char* name() const override { return "cat"; }
  void forward(value_table& table) override {
    auto out = table.template get<T, K>(output);
    std::int64_t start = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      out.narrow(dim_, start, sizes_[i]).copy_(table.template get<T, K>(inputs[i]));
      start += sizes_[i];
    }
  }
  void finalize(const std::vector<value_info>& values) override {
    needs_.clear();
    for (int id : inputs) needs_.push_back(values[static_cast<std::size_t>(id)].requires_grad);
  }
  std::vector<int> contributions() const override {
    std::vector<int> out;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (needs_[i]) out.push_back(inputs[i]);
    }
    return out;
  }
  std::vector<int> backward_reads() const override {
    for (bool n : needs_) {
      if (n) return encode_reads({}, {output});
    }
    return {};
  }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    const auto g = table.template grad<T, K>(output);
    std::int64_t start = 0;
    std::size_t next = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (needs_[i]) {
        store_gradient(table.template grad<T, K>(inputs[i]),
                       as_node(g.narrow(dim_, start, sizes_[i])), accumulate[next++] != 0, table);
      }
      start += sizes_[i];
    }
  }

 private:
  std::vector<std::int64_t> sizes_;
  int dim_;
  std::vector<bool> needs_;
};

/// A copy to another device: another ordinal of the same kind, or across kinds (KIn -> KOut,
/// cpu <-> cuda); the gradient is copied back. Scratch (to stage a gradient that is added) is on
/// the input's device.
template <class T, class KIn, class KOut = KIn>
class copy_node final : public single_input_node {
 public:
  copy_node(int input, Shape shape) : shape_(std::move(shape)) { inputs = {input}; }
  const char* name() const override { return "to"; }
  void forward(value_table& table) override {
    table.template get<T, KOut>(output).copy_(table.template get<T, KIn>(inputs[0]));
  }
  std::size_t backward_scratch() const override { return scratch_bytes<T>(shape_); }
  int scratch_value() const override { return inputs[0]; }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    if (!needs_) return;
    auto grad_in = table.template grad<T, KIn>(inputs[0]);
    const auto g = table.template grad<T, KOut>(output);
    if (accumulate[0] == 0) {
      grad_in.copy_(g);
      return;
    }
    table.scratch_offset = table.scratch_begin;
    auto staged = table.template scratch_tensor<T, KIn>(shape_);
    staged.copy_(g);
    add_into(grad_in, staged);
  }

 private:
  Shape shape_;
};

/// Uniform numbers in [0, 1) drawn anew at every forward from the device's Philox generator
/// (ts::manual_seed makes runs reproducible). Never recomputed: a checkpointed segment keeps them.
template <class T, class K>
class rand_node final : public node {
 public:
  rand_node() = default;
  const char* name() const override { return "rand"; }
  bool recomputable() const override { return false; }
  void forward(value_table& table) override {
    tessera::detail::fill_uniform_(table.template get<T, K>(output));
  }
};

/// Runs a function on the current tensors of some values at every forward (running statistics,
/// logging); no gradient, never recomputed. Its output has no elements.
class effect_node final : public node {
 public:
  explicit effect_node(std::vector<int> ids, std::function<void(const value_table&)> effect)
      : effect_(std::move(effect)) {
    inputs = std::move(ids);
  }
  const char* name() const override { return "effect"; }
  bool recomputable() const override { return false; }
  bool is_effect() const override { return true; }
  void forward(value_table& table) override { effect_(table); }

 private:
  std::function<void(const value_table&)> effect_;
};

// ---- recording ----------------------------------------------------------------------------------

/// Records a fused node for expression `e`, producing a contiguous value of dtype T.
template <class T, class K, class E>
Var<T, K> bind_expression(const E& e) {
  graph* g = graph_of(e);
  const Device device = tessera::detail::device_of(e, "autograd");
  auto n = std::make_unique<fused_node<T, K, E>>(e);
  auto* raw = n.get();
  const int id = g->add_node(std::move(n), e.shape(), scalar_type_of<T>, device);
  raw->trace_backward(g);
  return Var<T, K>(g, id, g->values[static_cast<std::size_t>(id)].shape);
}

/// A Var for an operand of a non-elementwise op: itself, its bound expression, or a constant.
template <class X>
auto to_var(const X& x, graph* g) {
  if constexpr (is_var<X>::value) {
    return x;
  } else if constexpr (tessera::detail::symbolic_expression<X>) {
    return bind_expression<typename X::value_type, typename X::device_kind>(x);
  } else {
    static_assert(tessera::detail::is_tensor<X>::value,
                  "autograd: an operand must be a Var, an expression of Vars or a Tensor");
    using T = typename X::value_type;
    using K = typename X::device_kind;
    const int id = g->add_constant(x);
    return Var<T, K>(g, id, x.shape());
  }
}

template <class T, class K>
Var<T, K> add_view(const Var<T, K>& x, std::unique_ptr<view_node<T, K>> n, const Shape& shape,
                   const Strides& strides, std::int64_t offset) {
  graph* g = x.graph();
  const int id = g->add_view(std::move(n), shape, strides, offset);
  return Var<T, K>(g, id, shape);
}

}  // namespace tessera::autograd::detail

namespace tessera::autograd {

template <Dtype T, DeviceKind K>
template <class E>
requires tessera::detail::symbolic_expression<E> &&
    (!detail::is_var<E>::value)Var<T, K>::Var(const E& expression)
    : Var(detail::bind_expression<T, K>(expression)) {}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::view(const Shape& shape) const {
  const auto& me = info();
  const Shape target = shape.infer(numel(), "view");
  auto strides = tessera::detail::view_strides(me.shape, me.strides, target);
  if (!strides) {
    throw shape_error("view: the Var of shape " + me.shape.str() + " and strides " +
                      me.strides.str() + " cannot be viewed as " + target.str() +
                      " without a copy; use reshape");
  }
  return detail::add_view(
      *this, std::make_unique<detail::view_node<T, K>>(id(), detail::view_kind::view, target),
      target, *strides, 0);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::reshape(const Shape& shape) const {
  const auto& me = info();
  const Shape target = shape.infer(numel(), "reshape");
  if (tessera::detail::view_strides(me.shape, me.strides, target)) return view(target);
  return Var<T, K>(cast<T>(*this)).view(target);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::transpose(std::int64_t a, std::int64_t b) const {
  const auto& me = info();
  const int da = Shape::normalize_dim(a, me.shape.size(), "transpose");
  const int db = Shape::normalize_dim(b, me.shape.size(), "transpose");
  Shape shape = me.shape;
  Strides strides = me.strides;
  std::swap(shape[da], shape[db]);
  std::swap(strides[da], strides[db]);
  const bool matrix = me.shape.size() == 2;  // `me` dangles once the view is added
  auto out = detail::add_view(
      *this,
      std::make_unique<detail::view_node<T, K>>(id(), detail::view_kind::transpose, shape, da, db),
      shape, strides, 0);
  if (matrix && da != db) {
    graph_->values[static_cast<std::size_t>(out.id())].transposed_matrix = true;
  }
  return out;
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::t() const {
  if (dim() > 2) {
    throw shape_error("t: expects a Var of at most 2 dimensions, got shape " + shape_.str() +
                      "; use transpose(a, b)");
  }
  if (dim() < 2) return *this;
  return transpose(0, 1);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::permute(const Shape& dims) const {
  const auto& me = info();
  if (dims.size() != me.shape.size()) {
    throw shape_error("permute: " + std::to_string(dims.size()) +
                      " dimensions given for a Var of shape " + me.shape.str());
  }
  Shape shape, strides, order;
  std::vector<bool> seen(static_cast<std::size_t>(me.shape.size()), false);
  for (int i = 0; i < dims.size(); ++i) {
    const int d = Shape::normalize_dim(dims[i], me.shape.size(), "permute");
    if (seen[static_cast<std::size_t>(d)]) {
      throw shape_error("permute: dimension " + std::to_string(d) + " appears twice in " +
                        dims.str());
    }
    seen[static_cast<std::size_t>(d)] = true;
    shape.push_back(me.shape[d]);
    strides.push_back(me.strides[d]);
    order.push_back(d);
  }
  auto n = std::make_unique<detail::view_node<T, K>>(id(), detail::view_kind::permute, shape);
  n->permutation_ = order;
  return detail::add_view(*this, std::move(n), shape, strides, 0);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const {
  const auto& me = info();
  const int d = Shape::normalize_dim(dim, me.shape.size(), "narrow");
  const std::int64_t extent = me.shape[d];
  const std::int64_t first = start < 0 ? start + extent : start;
  if (first < 0 || first > extent || length < 0 || first + length > extent) {
    throw shape_error("narrow: start " + std::to_string(start) + " and length " +
                      std::to_string(length) + " are out of range for dimension " +
                      std::to_string(d) + " of shape " + me.shape.str());
  }
  Shape shape = me.shape;
  shape[d] = length;
  return detail::add_view(*this,
                          std::make_unique<detail::view_node<T, K>>(id(), detail::view_kind::narrow,
                                                                    shape, d, first, length),
                          shape, me.strides, first * me.strides[d]);
}

template <Dtype T, DeviceKind K>
std::vector<Var<T, K>> Var<T, K>::split(std::int64_t split_size, std::int64_t dim) const {
  const int d = Shape::normalize_dim(dim, shape_.size(), "split");
  if (split_size <= 0) {
    throw shape_error("split: split_size must be positive, got " + std::to_string(split_size));
  }
  std::vector<Var> pieces;
  for (std::int64_t start = 0; start < shape_[d]; start += split_size) {
    pieces.push_back(narrow(d, start, std::min(split_size, shape_[d] - start)));
  }
  return pieces;
}

template <Dtype T, DeviceKind K>
std::vector<Var<T, K>> Var<T, K>::chunk(std::int64_t chunks, std::int64_t dim) const {
  if (chunks <= 0)
    throw shape_error("chunk: chunks must be positive, got " + std::to_string(chunks));
  const int d = Shape::normalize_dim(dim, shape_.size(), "chunk");
  return split(std::max<std::int64_t>(1, (shape_[d] + chunks - 1) / chunks), d);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::unsqueeze(std::int64_t dim) const {
  Shape shape = shape_;
  const int d = Shape::normalize_dim(dim, shape_.size() + 1, "unsqueeze");
  shape.insert(d, 1);
  return view(shape);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::squeeze(std::int64_t dim) const {
  const int d = Shape::normalize_dim(dim, shape_.size(), "squeeze");
  if (shape_[d] != 1) return *this;
  Shape shape = shape_;
  shape.erase(d);
  return view(shape);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::flatten(std::int64_t start, std::int64_t end) const {
  if (dim() == 0) return reshape({1});
  const int s = Shape::normalize_dim(start, shape_.size(), "flatten");
  const int e = Shape::normalize_dim(end, shape_.size(), "flatten");
  if (s > e) throw shape_error("flatten: start dimension comes after end dimension");
  Shape shape;
  for (int d = 0; d < s; ++d) shape.push_back(shape_[d]);
  std::int64_t merged = 1;
  for (int d = s; d <= e; ++d) merged *= shape_[d];
  shape.push_back(merged);
  for (int d = e + 1; d < shape_.size(); ++d) shape.push_back(shape_[d]);
  return reshape(shape);
}

template <Dtype T, DeviceKind K>
Var<T, K> Var<T, K>::to(int index) const {
  const Device target = resolve_device<K>(index);
  if (target == device()) return *this;
  detail::graph* g = graph_;
  auto n = std::make_unique<detail::copy_node<T, K>>(id_, shape_);
  const int out = g->add_node(std::move(n), shape_, scalar_type_of<T>, target);
  return Var(g, out, shape_);
}

template <Dtype T, DeviceKind K>
template <DeviceKind K2>
Var<T, K2> Var<T, K>::to(int index) const {
  if constexpr (std::is_same_v<K, K2>) {
    return to(index);
  } else {
    const Device target = resolve_device<K2>(index);
    auto n = std::make_unique<detail::copy_node<T, K, K2>>(id_, shape_);
    const int out = graph_->add_node(std::move(n), shape_, scalar_type_of<T>, target);
    return Var<T, K2>(graph_, out, shape_);
  }
}

/// Uniform random numbers in [0, 1) of `x`'s dtype (floating), shape and device, drawn anew at
/// every forward (a traced ts::rand: dropout masks).
template <class X>
requires tessera::detail::symbolic_expression<X>
auto rand_like(const X& x) {
  using T = tessera::detail::floating_of<typename X::value_type>;
  using K = typename X::device_kind;
  detail::graph* g = detail::graph_of(x);
  const Device device = tessera::detail::device_of(x, "rand_like");
  const int id = g->add_node(std::make_unique<detail::rand_node<T, K>>(), x.shape(),
                             scalar_type_of<T>, device);
  return Var<T, K>(g, id, x.shape());
}

/// Calls `effect(tensors...)` with the current tensors of `vars` at every forward, after they are
/// computed (e.g. BatchNorm's running statistics); it takes no part in backward.
template <class Fn, class... Vs>
void on_forward(Fn effect, const Vs&... vars) {
  static_assert(sizeof...(Vs) > 0, "on_forward: give at least one Var");
  detail::graph* g = std::get<0>(std::tie(vars...)).graph();
  std::vector<int> ids{vars.id()...};
  auto call = [effect = std::move(effect), vars...](const detail::value_table& table) mutable {
    effect(table.template get<typename Vs::value_type, typename Vs::device_kind>(vars.id())...);
  };
  const Device device = std::get<0>(std::tie(vars...)).device();
  g->add_node(std::make_unique<detail::effect_node>(std::move(ids), std::move(call)), Shape{0},
              ScalarType::float32, device);
}

}  // namespace tessera::autograd

namespace tessera {

/// Traced reductions, softmax and matmul: the same names as for tensors.
namespace autograd::detail {
template <class E>
using var_of = Var<typename E::value_type, typename E::device_kind>;

template <class Out, bool Mean, class E>
auto record_reduce(const E& e, int dim, bool keepdim) {
  using K = typename E::device_kind;
  graph* g = graph_of(e);
  const Device device = tessera::detail::device_of(e, Mean ? "mean" : "sum");
  Shape shape = dim < 0 ? Shape{} : tessera::detail::reduced_shape(e.shape(), dim, keepdim);
  auto n = std::make_unique<reduce_node<Out, K, E, Mean>>(e, dim, keepdim);
  auto* raw = n.get();
  const int id = g->add_node(std::move(n), shape, scalar_type_of<Out>, device);
  raw->trace_backward(g);
  return Var<Out, K>(g, id, shape);
}

template <bool Max, class E>
auto record_extremum(const E& e, std::int64_t dim, bool keepdim, bool full) {
  using T = typename E::value_type;
  using K = typename E::device_kind;
  graph* g = graph_of(e);
  const auto x = to_var(e, g);
  const char* name = Max ? "max" : "min";
  if (x.numel() == 0) tessera::detail::throw_empty_reduction(name, x.shape());
  const int d = full ? -1 : tessera::detail::reduction_dim(x.shape(), dim, name);
  const Shape shape = full ? Shape{} : tessera::detail::reduced_shape(x.shape(), d, keepdim);
  auto n = std::make_unique<extremum_node<T, K, Max>>(x.id(), x.shape(), x.dim() == 0 ? -1 : d);
  const int id = g->add_node(std::move(n), shape, scalar_type_of<T>, x.device());
  return Var<T, K>(g, id, shape);
}

template <bool Log, class E>
auto record_softmax(const E& e, std::int64_t dim) {
  using T = tessera::detail::floating_of<typename E::value_type>;
  using K = typename E::device_kind;
  graph* g = graph_of(e);
  const Var<T, K> x = [&] {
    if constexpr (std::is_same_v<typename E::value_type, T>) {
      return to_var(e, g);
    } else {
      return Var<T, K>(cast<T>(e));
    }
  }();
  const int d = tessera::detail::reduction_dim(x.shape(), dim, Log ? "log_softmax" : "softmax");
  auto n = std::make_unique<softmax_node<T, K, Log>>(x.id(), x.shape(), d);
  const int id = g->add_node(std::move(n), x.shape(), scalar_type_of<T>, x.device());
  return Var<T, K>(g, id, x.shape());
}
}  // namespace autograd::detail

template <class E>
requires detail::symbolic_expression<E>
auto sum(const E& e) {
  return autograd::detail::record_reduce<detail::sum_result_t<typename E::value_type>, false>(
      e, -1, false);
}
template <class E>
requires detail::symbolic_expression<E>
auto sum(const E& e, std::int64_t dim, bool keepdim = false) {
  if (e.shape().size() == 0) return sum(e);
  const int d = detail::reduction_dim(e.shape(), dim, "sum");
  return autograd::detail::record_reduce<detail::sum_result_t<typename E::value_type>, false>(
      e, d, keepdim);
}
template <class E>
requires detail::symbolic_expression<E>
auto mean(const E& e) {
  static_assert(is_floating_point_v<typename E::value_type>,
                "mean: the input is not floating point; cast first, e.g. mean(ts::cast<float>(x))");
  return autograd::detail::record_reduce<typename E::value_type, true>(e, -1, false);
}
template <class E>
requires detail::symbolic_expression<E>
auto mean(const E& e, std::int64_t dim, bool keepdim = false) {
  static_assert(is_floating_point_v<typename E::value_type>,
                "mean: the input is not floating point; cast first, e.g. mean(ts::cast<float>(x))");
  if (e.shape().size() == 0) return mean(e);
  const int d = detail::reduction_dim(e.shape(), dim, "mean");
  return autograd::detail::record_reduce<typename E::value_type, true>(e, d, keepdim);
}
// max and min of everything (0-dim) or along a dim; the gradient goes to the extreme elements.
#define TESSERA_TRACED_EXTREMUM(name, is_max)                                                    \
  template <class E>                                                                             \
  requires detail::symbolic_expression<E>                                                        \
  auto name(const E& e) { return autograd::detail::record_extremum<is_max>(e, 0, false, true); } \
  template <class E>                                                                             \
  requires detail::symbolic_expression<E>                                                        \
  auto name(const E& e, std::int64_t dim, bool keepdim = false) {                                \
    return autograd::detail::record_extremum<is_max>(e, dim, keepdim, false);                    \
  }
TESSERA_TRACED_EXTREMUM(max, true)
TESSERA_TRACED_EXTREMUM(min, false)
#undef TESSERA_TRACED_EXTREMUM

template <class E>
requires detail::symbolic_expression<E>
auto softmax(const E& e, std::int64_t dim) {
  return autograd::detail::record_softmax<false>(e, dim);
}
template <class E>
requires detail::symbolic_expression<E>
auto log_softmax(const E& e, std::int64_t dim) {
  return autograd::detail::record_softmax<true>(e, dim);
}

/// matmul of Vars (or expressions of Vars, bound first; a Tensor operand is a constant).
template <class A, class B>
requires(detail::symbolic_expression<A> || detail::symbolic_expression<B>) auto matmul(const A& a,
                                                                                       const B& b) {
  autograd::detail::graph* g = [&] {
    if constexpr (detail::symbolic_expression<A>) {
      return autograd::detail::graph_of(a);
    } else {
      return autograd::detail::graph_of(b);
    }
  }();
  const auto va = autograd::detail::to_var(a, g);
  const auto vb = autograd::detail::to_var(b, g);
  using TA = typename decltype(va)::value_type;
  using TB = typename decltype(vb)::value_type;
  using K = typename decltype(va)::device_kind;
  static_assert(std::is_same_v<K, typename decltype(vb)::device_kind>,
                "matmul: the operands are on different device kinds (cpu and cuda); move one "
                "with .to<tessera::cuda>(i) or .to<tessera::cpu>(i) first");
  static_assert(std::is_same_v<TA, TB>, "matmul: both operands must have the same dtype");
  const Shape out_shape = detail::matmul_result_shape(va.shape(), vb.shape());
  if (va.device() != vb.device()) {
    throw device_mismatch_error("matmul: expected both operands on the same device, got " +
                                va.device().str() + " and " + vb.device().str());
  }
  const bool batched_a = va.dim() == 3, batched_b = vb.dim() == 3;
  if ((batched_a && batched_b && va.size(0) != vb.size(0)) || (!batched_a && batched_b)) {
    throw shape_error(
        "matmul: autograd supports [m, k] x [k, n], [B, m, k] x [B, k, n] and "
        "[B, m, k] x [k, n]; got " +
        va.shape().str() + " and " + vb.shape().str());
  }
  if (batched_a && !batched_b && vb.info().requires_grad &&
      !tessera::detail::view_strides(va.shape(), va.info().strides,
                                     Shape{va.size(0) * va.size(1), va.size(2)})) {
    throw shape_error("matmul: the batched left operand of shape " + va.shape().str() +
                      " must be viewable as a matrix for the shared right operand's gradient; "
                      "use reshape or contiguous layouts");
  }
  // A transposed matrix operand is read through its base (see matmul_node).
  auto unwrap = [&](const auto& v) {
    const auto& info = v.info();
    if (info.role == autograd::detail::value_role::view && info.transposed_matrix) {
      return std::pair{info.base, true};
    }
    return std::pair{v.id(), false};
  };
  const auto [ida, ta] = unwrap(va);
  const auto [idb, tb] = unwrap(vb);
  auto n = std::make_unique<autograd::detail::matmul_node<TA, K>>(
      ida, ta, idb, tb, g->values[static_cast<std::size_t>(ida)].shape,
      g->values[static_cast<std::size_t>(idb)].shape);
  const int id = g->add_node(std::move(n), out_shape, scalar_type_of<TA>, va.device());
  return autograd::Var<TA, K>(g, id, out_shape);
}

/// cat of Vars along `dim`.
template <Dtype T, DeviceKind K>
autograd::Var<T, K> cat(const std::vector<autograd::Var<T, K>>& vars, std::int64_t dim = 0) {
  if (vars.empty()) throw shape_error("cat: expects at least one Var");
  autograd::detail::graph* g = vars[0].graph();
  const Shape& first = vars[0].shape();
  const int d = Shape::normalize_dim(dim, first.size(), "cat");
  Shape out = first;
  out[d] = 0;
  std::vector<int> ids;
  std::vector<std::int64_t> sizes;
  for (const auto& v : vars) {
    if (v.graph() != g) throw error("cat: the Vars belong to different traces");
    if (v.device() != vars[0].device()) {
      throw device_mismatch_error("cat: Vars on different devices, " + vars[0].device().str() +
                                  " and " + v.device().str());
    }
    for (int k = 0; k < first.size(); ++k) {
      if (k != d && (v.dim() != first.size() || v.shape()[k] != first[k])) {
        throw shape_error("cat: shapes " + first.str() + " and " + v.shape().str() +
                          " differ outside dimension " + std::to_string(d));
      }
    }
    out[d] += v.shape()[d];
    ids.push_back(v.id());
    sizes.push_back(v.shape()[d]);
  }
  auto n = std::make_unique<autograd::detail::cat_node<T, K>>(ids, sizes, d);
  const int id = g->add_node(std::move(n), out, scalar_type_of<T>, vars[0].device());
  return autograd::Var<T, K>(g, id, out);
}

}  // namespace tessera
