// The nodes of traced reductions (autograd/ops.hpp records them): sum and mean of an expression
// (read without storing it), max and min of a value (the gradient to the extreme elements), and
// softmax and log_softmax along a dim.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/detail/gradient.hpp"
#include "tessera/autograd/var.hpp"
#include "tessera/expr/reduce.hpp"

namespace tessera::autograd::detail {

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

}  // namespace tessera::autograd::detail
