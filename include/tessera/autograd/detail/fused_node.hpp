// The node of a fused elementwise expression of Vars (autograd/ops.hpp records it): its forward
// is one executor pass, and each input's gradient another, from the expression's compile-time
// derivative (autograd/derivative.hpp).
#pragma once

#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/detail/gradient.hpp"
#include "tessera/autograd/var.hpp"
#include "tessera/expr/assign.hpp"

namespace tessera::autograd::detail {

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

}  // namespace tessera::autograd::detail
