// Autograd nodes for convolution and pooling: each runs the passes of conv2d.hpp / pool2d.hpp
// on its planned workspace (the program's scratch for the step), and records itself from Vars.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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

/// A traced operand as a Var dense in `format` (contiguous_format, or channels_last for a 4-d
/// one): itself when it is, else a copy by a fused node.
template <class T, class K>
autograd::Var<T, K> dense_var(const autograd::Var<T, K>& v, memory_format format) {
  const autograd::detail::value_info& info = v.info();
  const bool dense = format == memory_format::channels_last
                         ? tessera::detail::is_channels_last_contiguous(info.shape, info.strides)
                         : info.strides == info.shape.contiguous_strides();
  if (info.shape == v.shape() && dense) return v;
  return autograd::detail::bind_expression<T, K>(cast<T>(v), format);
}

/// A traced operand as a contiguous Var (a strided view is copied by a fused node first).
template <class T, class K>
autograd::Var<T, K> contiguous_var(const autograd::Var<T, K>& v) {
  return dense_var(v, memory_format::contiguous_format);
}

/// The layout a traced layer that keeps its input's gives (batch norm, pooling): channels_last
/// for a 4-d input laid out channels_last, contiguous_format otherwise.
template <class T, class K>
memory_format var_format(const autograd::Var<T, K>& v) {
  return v.info().shape == v.shape() ? v.info().suggest_memory_format()
                                     : memory_format::contiguous_format;
}

/// The table's current scratch as a workspace.
inline workspace scratch_of(const value_table& table) {
  return workspace(table.scratch, table.scratch_offset, table.scratch_end);
}

/// A value's tensor dense in `format` (a copy from the pool when a bound input or parameter is
/// laid out otherwise).
template <class T, class K>
Tensor<T, K> dense_value(const value_table& table, int id, memory_format format) {
  Tensor<T, K> t = table.template get<T, K>(id);
  return t.contiguous(format);  // t itself when already so
}

/// A value's tensor dense in a layout whose [N, C, H * W] view keeps the channels apart (batch
/// norm): itself when contiguous or (4-d) channels_last, else a contiguous copy from the pool.
template <class T, class K>
Tensor<T, K> dense_value(const value_table& table, int id) {
  Tensor<T, K> t = table.template get<T, K>(id);
  if (t.is_contiguous() || t.is_contiguous(memory_format::channels_last)) return t;
  return t.contiguous();
}

/// A gradient a layer writes dense in `format`: the tensor itself when it is, else a temporary
/// from the pool (a parameter's gradient laid out otherwise) that finish() stores into it.
template <class T, class K>
struct dense_gradient {
  Tensor<T, K> target, tensor;
  bool accumulate = false;  // what the layer is told: false for a temporary
  bool add = false;         // what finish() does: the caller's accumulate flag
  dense_gradient(Tensor<T, K> t, bool accumulate_into, memory_format format)
      : target(std::move(t)), add(accumulate_into) {
    if (target.is_contiguous(format)) {
      tensor = target;
      accumulate = accumulate_into;
    } else {
      tensor = Tensor<T, K>::empty_on(target.shape(), target.device(), format);
    }
  }
  void finish() {
    if (tensor.data() != target.data() || tensor.strides() != target.strides()) {
      store_into(target, tensor, add);
    }
  }
};

/// y = conv2d(x, w) (+ b); x, w, y and their gradients laid out as g.channels_last says.
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
    const auto x = dense_value<T, K>(table, inputs[0], format());
    const auto w = dense_value<T, K>(table, inputs[1], format());
    auto y = table.template get<T, K>(output);
    workspace ws = scratch_of(table);
    if (has_bias_) {
      const auto b = dense_value<T, K>(table, inputs[2], memory_format::contiguous_format);
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
    // The output's gradient is an arena buffer laid out as the output, and so are the input's;
    // a parameter's gradient is its own and may be laid out otherwise (dense_gradient).
    const auto gy = table.template grad<T, K>(output);
    Tensor<T, K> x, db;
    if (needs_w_) x = dense_value<T, K>(table, inputs[0], format());
    const Tensor<T, K> w = dense_value<T, K>(table, inputs[1], format());
    std::size_t next = 0;
    bool ab = false;
    std::optional<dense_gradient<T, K>> dx, dw;
    if (needs_x_)
      dx.emplace(table.template grad<T, K>(inputs[0]), accumulate[next++] != 0, format());
    if (needs_w_)
      dw.emplace(table.template grad<T, K>(inputs[1]), accumulate[next++] != 0, format());
    if (needs_b_) db = table.template grad<T, K>(inputs[2]), ab = accumulate[next++] != 0;
    workspace ws = scratch_of(table);
    conv2d_backward(g_, x, w, gy, dx ? &dx->tensor : nullptr, dx && dx->accumulate,
                    dw ? &dw->tensor : nullptr, dw && dw->accumulate, needs_b_ ? &db : nullptr, ab,
                    ws);
    if (dx) dx->finish();
    if (dw) dw->finish();
  }

 private:
  memory_format format() const {
    return g_.channels_last ? memory_format::channels_last : memory_format::contiguous_format;
  }
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

/// Records node `n` with output `shape` on x's graph and device, laid out in `format`.
template <class T, class K>
autograd::Var<T, K> record(const autograd::Var<T, K>& x, std::unique_ptr<node> n,
                           const Shape& shape,
                           memory_format format = memory_format::contiguous_format) {
  autograd::detail::graph* g = x.graph();
  const int id = g->add_node(std::move(n), shape, scalar_type_of<T>, x.device(), format);
  return autograd::Var<T, K>(g, id, shape);
}

}  // namespace tessera::nn::detail
