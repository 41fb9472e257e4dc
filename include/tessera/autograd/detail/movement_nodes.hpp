// The nodes that move or alias values without arithmetic (autograd/ops.hpp records them): views
// (view, transpose, permute, narrow), whose gradient is written through the same view; cat, each
// input copied into its slice; and copies to another device, whose gradient is copied back.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tessera/autograd/detail/gradient.hpp"
#include "tessera/autograd/var.hpp"
#include "tessera/expr/assign.hpp"

namespace tessera::autograd::detail {

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

}  // namespace tessera::autograd::detail
