// The node of a traced matmul (autograd/ops.hpp records it): 2-D, batched 3-D, or 3-D with a
// shared 2-D right operand, with both operands' gradients as products, and a transposed matrix
// operand read through its base.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "tessera/autograd/detail/gradient.hpp"
#include "tessera/autograd/var.hpp"
#include "tessera/expr/matmul.hpp"

namespace tessera::autograd::detail {

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
    if (epilogue_) {
      applied_ = tessera::detail::matmul_bias_into(out, operand_a(table), operand_b(table),
                                                   table.template get<T, K>(bias_), relu_);
      if (applied_) return;
    }
    tessera::detail::matmul_into(out, operand_a(table), operand_b(table));
  }
  // A product of two matrices may add a bias to its rows and apply ReLU as it writes (the plan's
  // fold of the elementwise nodes after it; bias >= 0 here: a ReLU alone is not folded).
  bool take_epilogue(int bias, bool relu) override {
    if (bias < 0 || a_shape_.size() != 2 || b_shape_.size() != 2) return false;
    epilogue_ = true;
    bias_ = bias;
    relu_ = relu;
    return true;
  }
  bool epilogue_applied() const override { return applied_; }
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
  bool epilogue_ = false, relu_ = false, applied_ = false;
  int bias_ = -1;
};

}  // namespace tessera::autograd::detail
