// Autograd nodes for convolution and pooling: each runs the passes of conv2d.hpp / pool2d.hpp
// on its planned workspace (the program's scratch for the step), and records itself from Vars.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/autograd/ops.hpp"
#include "tessera/nn/detail/conv2d.hpp"
#include "tessera/nn/detail/pool2d.hpp"

namespace tessera::nn::detail {

using autograd::detail::node;
using autograd::detail::value_info;
using autograd::detail::value_table;

/// A workspace of `bytes` on `device` from its pool, for one eager call.
inline workspace eager_workspace(Device device, std::size_t bytes) {
  if (bytes == 0) return workspace{};
  return workspace(Storage::allocate(device, bytes), 0, static_cast<std::int64_t>(bytes));
}

/// A traced operand as a contiguous Var (a strided view is copied by a fused node first).
template <class T, class K>
autograd::Var<T, K> contiguous_var(const autograd::Var<T, K>& v) {
  if (v.info().strides == v.shape().contiguous_strides()) return v;
  return autograd::Var<T, K>(cast<T>(v));
}

/// The table's current scratch as a workspace.
inline workspace scratch_of(const value_table& table) {
  return workspace(table.scratch, table.scratch_offset, table.scratch_end);
}

/// A value's tensor, contiguous (a copy from the pool when a bound input is a strided view).
template <class T, class K>
Tensor<T, K> contiguous_value(const value_table& table, int id) {
  Tensor<T, K> t = table.template get<T, K>(id);
  return t.is_contiguous() ? t : t.contiguous();
}

/// y = conv2d(x, w) (+ b).
template <class T, class K>
class conv2d_node final : public node {
 public:
  conv2d_node(int x, int w, int b, const conv2d_geometry& g) : g_(g), has_bias_(b >= 0) {
    inputs = {x, w};
    if (has_bias_) inputs.push_back(b);
  }
  const char* name() const override { return "conv2d"; }
  std::size_t forward_scratch() const override { return conv2d_forward_workspace<T, K>(g_); }
  void forward(value_table& table) override {
    const auto x = contiguous_value<T, K>(table, inputs[0]);
    const auto w = contiguous_value<T, K>(table, inputs[1]);
    auto y = table.template get<T, K>(output);
    workspace ws = scratch_of(table);
    if (has_bias_) {
      const auto b = contiguous_value<T, K>(table, inputs[2]);
      conv2d_forward(g_, x, w, &b, y, ws);
    } else {
      conv2d_forward<T, K>(g_, x, w, nullptr, y, ws);
    }
  }
  void finalize(const std::vector<value_info>& values) override {
    auto needs = [&](int id) { return values[static_cast<std::size_t>(id)].requires_grad; };
    needs_x_ = needs(inputs[0]);
    needs_w_ = needs(inputs[1]);
    needs_b_ = has_bias_ && needs(inputs[2]);
  }
  std::vector<int> contributions() const override {
    std::vector<int> out;
    if (needs_x_) out.push_back(inputs[0]);
    if (needs_w_) out.push_back(inputs[1]);
    if (needs_b_) out.push_back(inputs[2]);
    return out;
  }
  std::vector<int> backward_reads() const override {
    if (!needs_x_ && !needs_w_ && !needs_b_) return {};
    std::vector<int> values;
    if (needs_w_) values.push_back(inputs[0]);
    if (needs_x_) values.push_back(inputs[1]);
    return autograd::detail::encode_reads(values, {output});
  }
  std::size_t backward_scratch() const override {
    return conv2d_backward_workspace<T, K>(g_, needs_x_, needs_w_, needs_b_);
  }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    const auto gy = table.template grad<T, K>(output);  // gradients are contiguous buffers
    Tensor<T, K> x, w, dx, dw, db;
    if (needs_w_) x = contiguous_value<T, K>(table, inputs[0]);
    w = table.template get<T, K>(inputs[1]);
    if (!w.is_contiguous()) w = w.contiguous();
    std::size_t next = 0;
    bool ax = false, aw = false, ab = false;
    if (needs_x_) dx = table.template grad<T, K>(inputs[0]), ax = accumulate[next++] != 0;
    if (needs_w_) dw = table.template grad<T, K>(inputs[1]), aw = accumulate[next++] != 0;
    if (needs_b_) db = table.template grad<T, K>(inputs[2]), ab = accumulate[next++] != 0;
    workspace ws = scratch_of(table);
    conv2d_backward(g_, x, w, gy, needs_x_ ? &dx : nullptr, ax, needs_w_ ? &dw : nullptr, aw,
                    needs_b_ ? &db : nullptr, ab, ws);
  }

 private:
  conv2d_geometry g_;
  bool has_bias_;
  bool needs_x_ = false, needs_w_ = false, needs_b_ = false;
};

/// max_pool2d; backward reads the input and the output.
template <class T, class K>
class max_pool2d_node final : public autograd::detail::single_input_node {
 public:
  max_pool2d_node(int x, const pool2d_geometry& g) : g_(g) { inputs = {x}; }
  const char* name() const override { return "max_pool2d"; }
  std::size_t forward_scratch() const override { return max_pool2d_forward_workspace<T>(g_); }
  void forward(value_table& table) override {
    auto y = table.template get<T, K>(output);
    workspace ws = scratch_of(table);
    max_pool2d_forward(g_, table.template get<T, K>(inputs[0]), y, ws);
  }
  std::vector<int> saved() const override { return {inputs[0], output}; }
  std::size_t backward_scratch() const override { return max_pool2d_backward_workspace<T>(g_); }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    if (!needs_) return;
    auto dx = table.template grad<T, K>(inputs[0]);
    workspace ws = scratch_of(table);
    max_pool2d_backward(g_, table.template get<T, K>(inputs[0]), table.template get<T, K>(output),
                        table.template grad<T, K>(output), dx, accumulate[0] != 0, ws);
  }

 private:
  pool2d_geometry g_;
};

/// avg_pool2d; backward reads only the output's gradient.
template <class T, class K>
class avg_pool2d_node final : public autograd::detail::single_input_node {
 public:
  avg_pool2d_node(int x, const pool2d_geometry& g, const AvgPool2dArgs& a) : g_(g), a_(a) {
    inputs = {x};
  }
  const char* name() const override { return "avg_pool2d"; }
  std::size_t forward_scratch() const override { return avg_pool2d_workspace<T>(g_); }
  void forward(value_table& table) override {
    auto y = table.template get<T, K>(output);
    workspace ws = scratch_of(table);
    avg_pool2d_forward(g_, a_, table.template get<T, K>(inputs[0]), y, ws);
  }
  std::size_t backward_scratch() const override { return avg_pool2d_workspace<T>(g_); }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    if (!needs_) return;
    auto dx = table.template grad<T, K>(inputs[0]);
    workspace ws = scratch_of(table);
    avg_pool2d_backward(g_, a_, table.template grad<T, K>(output), dx, accumulate[0] != 0, ws);
  }

 private:
  pool2d_geometry g_;
  AvgPool2dArgs a_;
};

/// adaptive_avg_pool2d; backward reads only the output's gradient.
template <class T, class K>
class adaptive_avg_pool2d_node final : public autograd::detail::single_input_node {
 public:
  adaptive_avg_pool2d_node(int x, const adaptive_geometry& g) : g_(g) { inputs = {x}; }
  const char* name() const override { return "adaptive_avg_pool2d"; }
  std::size_t forward_scratch() const override { return adaptive_avg_pool2d_workspace<T>(g_); }
  void forward(value_table& table) override {
    auto y = table.template get<T, K>(output);
    workspace ws = scratch_of(table);
    adaptive_avg_pool2d_forward(g_, table.template get<T, K>(inputs[0]), y, ws);
  }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    if (!needs_) return;
    auto dx = table.template grad<T, K>(inputs[0]);
    adaptive_avg_pool2d_backward(g_, table.template grad<T, K>(output), dx, accumulate[0] != 0);
  }

 private:
  adaptive_geometry g_;
};

/// y = relu(a + b) (a residual connection); backward masks the upstream gradient with y > 0, so
/// only the output is kept, not the two summands.
template <class T, class K>
class add_relu_node final : public node {
 public:
  add_relu_node(int a, int b) { inputs = {a, b}; }
  const char* name() const override { return "add_relu"; }
  void forward(value_table& table) override {
    auto y = table.template get<T, K>(output);
    tessera::detail::run_expression(
        y, relu(table.template get<T, K>(inputs[0]) + table.template get<T, K>(inputs[1])));
  }
  std::vector<int> inplace_candidates() const override { return {inputs[0], inputs[1]}; }
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
    if (!needs_a_ && !needs_b_) return {};
    return autograd::detail::encode_reads({output}, {output});
  }
  void backward(value_table& table, const std::vector<char>& accumulate) override {
    const auto y = table.template get<T, K>(output);
    const auto g = table.template grad<T, K>(output);
    std::size_t next = 0;
    for (int i = 0; i < 2; ++i) {
      if (i == 0 ? !needs_a_ : !needs_b_) continue;
      auto target = table.template grad<T, K>(inputs[static_cast<std::size_t>(i)]);
      if (accumulate[next++] != 0) {
        tessera::detail::add_into(target, where(y > 0.0, g, 0.0));
      } else {
        tessera::detail::run_expression(target, where(y > 0.0, g, 0.0));
      }
    }
  }

 private:
  bool needs_a_ = false, needs_b_ = false;
};

/// Records node `n` with output `shape` on x's graph and device.
template <class T, class K>
autograd::Var<T, K> record(const autograd::Var<T, K>& x, std::unique_ptr<node> n,
                           const Shape& shape) {
  autograd::detail::graph* g = x.graph();
  const int id = g->add_node(std::move(n), shape, scalar_type_of<T>, x.device());
  return autograd::Var<T, K>(g, id, shape);
}

}  // namespace tessera::nn::detail
