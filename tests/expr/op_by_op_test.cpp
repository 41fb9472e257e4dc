// expr/detail/op_by_op.hpp on the CPU: an expression evaluated one operation at a time (what a
// g++ unit does with CUDA tensors when it links tessera::compiled) against the same expression
// evaluated fused, as nvcc units and every CPU unit do. Float, double, integer and bool operands
// compute the same values either way, so those are compared exactly; half is compared with the
// same operations written as separate statements (PyTorch's eager rounding). Each step must be
// one of the library's primitives (a static check in the runner), and the steps are counted.
// Reductions and softmax of expressions are checked the same way, and the list of primitives
// that tessera::compiled instantiates holds only primitives.
#include <catch2/catch.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <typeinfo>
#include <vector>

#include "tessera/backend/cuda/elementwise_plan.hpp"
#include "tessera/expr/detail/op_by_op.hpp"
#include "tessera/tessera.hpp"

namespace op_by_op_test {  // one namespace per file: a unity build

namespace ts = tessera;
namespace op_by_op = tessera::detail::op_by_op;
using ts::cpu;

/// Runs each primitive with the CPU executor as the CUDA library does (its operands merged into
/// operand_leaf: op_by_op::merged_operands), counting the steps, and counts the elements where
/// that differs from the primitive run as it is.
struct counting_runner {
  int steps = 0;
  std::int64_t merged_differ = 0;
  template <class T, class E>
  void operator()(const ts::Tensor<T, cpu>& out, const E& primitive) {
    static_assert(op_by_op::is_primitive_v<E, cpu>);
    static_assert(std::is_same_v<T, typename E::value_type>);
    ++steps;
    ts::detail::run_expression(out, op_by_op::merged_operands<cpu>(primitive));
    auto direct = ts::empty<T>(out.shape());
    ts::detail::run_expression(direct, primitive);
    const auto a = out.contiguous().to_vector();
    const auto b = direct.to_vector();
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!(a[i] == b[i] || (a[i] != a[i] && b[i] != b[i]))) ++merged_differ;
    }
  }
};

/// The expression evaluated one operation at a time into a new tensor of dtype T.
template <class T, class E>
ts::Tensor<T> op_by_op_eval(const E& e, int* steps = nullptr) {
  const auto node = ts::detail::as_node(e);
  auto out = ts::empty<T>(node.shape());
  counting_runner run;
  op_by_op::evaluate<cpu>(out, node, run);
  if (steps != nullptr) *steps = run.steps;
  CHECK(run.merged_differ == 0);
  return out;
}

template <class T>
std::vector<T> values(const ts::Tensor<T>& t) {
  return t.contiguous().to_vector();
}

template <class T, class E>
void check_same(const E& e, int expected_steps) {
  int steps = 0;
  const ts::Tensor<T> fused = e;
  const ts::Tensor<T> separate = op_by_op_eval<T>(e, &steps);
  REQUIRE(separate.shape() == fused.shape());
  const auto a = values(separate);
  const auto b = values(fused);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    // NaN equals NaN here: both evaluations must give it at the same places.
    if (!(a[i] == b[i] || (a[i] != a[i] && b[i] != b[i]))) ++differ;
  }
  INFO(differ << " of " << a.size() << " elements differ");
  CHECK(differ == 0);
  CHECK(steps == expected_steps);
}

TEST_CASE("op by op: float expressions give the fused values", "[op_by_op]") {
  ts::manual_seed(3);
  const auto a = ts::randn<float>({4, 5});
  const auto b = ts::randn<float>({5});     // broadcast along the rows
  const auto c = ts::randn<float>({4, 1});  // and along the columns
  check_same<float>(a * 2 + b, 2);
  check_same<float>(2 - a, 1);  // a number first: its own primitive
  check_same<float>(2 * a, 1);  // commutes: the tensor first
  check_same<float>(1.0 / (1.0 + ts::exp(-a)), 4);
  check_same<float>(ts::relu(a * c + b) - ts::sigmoid(b), 5);
  check_same<float>(ts::where(a > 0, a, 0.5 * a), 3);
  check_same<float>(ts::where(a > c, 1.0, b), 2);
  check_same<float>(ts::where(a > 0, 1.0, -1.0), 2);
  check_same<float>(ts::maximum(a, c) + ts::minimum(2.0, b), 3);
  check_same<float>(ts::pow(ts::abs(a), 1.5) + ts::pow(2.0, c), 4);
  check_same<float>(ts::sqrt(ts::abs(a)) * ts::rsqrt(ts::abs(c) + 1) + ts::log(ts::abs(b) + 1),
                    10);
  check_same<float>(ts::tanh(ts::sin(a) + ts::cos(c)), 4);
  // Comparisons with the number first are turned around: 0 < a is a > 0.
  check_same<bool>(0 < a, 1);
  check_same<bool>((a >= c) == (b != 0), 3);
  // Results into another dtype: the value's own dtype, then converted.
  check_same<double>(a * b, 1);
  check_same<std::int64_t>(a * 3, 1);
  // A leaf alone is a copy or a fill, no primitive.
  check_same<float>(ts::detail::as_node(a), 0);
}

TEST_CASE("op by op: mixed dtypes, integers and bools", "[op_by_op]") {
  ts::manual_seed(4);
  const auto f = ts::randn<float>({3, 4});
  const auto d = ts::randn<double>({4});
  const auto i = ts::arange<std::int64_t>(-5, 7).view({3, 4});
  const auto j = ts::arange<std::int32_t>(1, 5);
  const auto u = ts::arange<std::uint8_t>(0, 12).view({3, 4});
  const ts::Tensor<bool> m = i > 0;
  // float with int64: the integer operand converted to float first, as PyTorch does.
  check_same<float>(f + i, 1);
  check_same<double>(f * d - i, 2);
  // Integer arithmetic, true division, integer powers, abs, relu, negation.
  check_same<std::int64_t>(i * j + 3, 2);
  check_same<float>(i / j, 1);
  check_same<std::int64_t>(ts::pow(i, 2) - ts::abs(i) + ts::relu(-i), 6);
  check_same<std::uint8_t>(u * 3 + 1, 2);
  check_same<std::int32_t>(ts::maximum(j, 2) * 7, 2);
  // Bool operands: conditions, comparisons of bools, and sums of bools promoted to int64.
  check_same<bool>(m == (f > 0), 2);
  check_same<bool>(m + (f > 1), 2);
  check_same<std::int64_t>(m + 2, 1);
  check_same<float>(ts::where(m, f, i), 1);
  check_same<std::int64_t>(ts::where(u > 5, u, i), 2);
  // Casts: rounded through their dtype.
  check_same<float>(ts::cast<std::int32_t>(f * 10) * 0.5, 2);
  check_same<std::int64_t>(ts::cast<bool>(i) + 1, 1);
  check_same<double>(ts::cast<ts::half>(d * 3), 1);
}

TEST_CASE("op by op: half rounds each step, as separate statements do", "[op_by_op]") {
  ts::manual_seed(5);
  const auto a = ts::randn<float>({6, 7}).to<ts::half>();
  const auto b = ts::randn<float>({7}).to<ts::half>();
  int steps = 0;
  const auto separate = op_by_op_eval<ts::half>(ts::exp(a) * b + 0.1, &steps);
  CHECK(steps == 3);
  const ts::Tensor<ts::half> e = ts::exp(a);
  const ts::Tensor<ts::half> p = e * b;
  const ts::Tensor<ts::half> expected = p + 0.1;  // the number stays in float, as in PyTorch
  const auto x = values(separate);
  const auto y = values(expected);
  REQUIRE(x.size() == y.size());
  for (std::size_t k = 0; k < x.size(); ++k) {
    CHECK(static_cast<float>(x[k]) == static_cast<float>(y[k]));
  }
}

template <class Op, class Finish, class Out, class E>
ts::Tensor<Out> op_by_op_reduce_all(const E& e) {
  const auto node = ts::detail::as_node(e);
  auto out = ts::empty<Out>(ts::Shape{});
  counting_runner run;
  auto reduce = [](const auto& into, const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    using R = typename std::remove_cvref_t<decltype(into)>::value_type;
    static_assert(op_by_op::reduction_allowed_v<Op, Finish, R, typename L::value_type>);
    ts::detail::reduce_all_into<Op, Finish, R>(into, leaf, "test");
  };
  op_by_op::reduce<Op, Finish, cpu>(out, node, run, reduce);
  return out;
}

template <class Op, class Finish, class Out, class E>
ts::Tensor<Out> op_by_op_reduce_dim(const E& e, int dim) {
  const auto node = ts::detail::as_node(e);
  auto out = ts::empty<Out>(ts::detail::reduced_shape(node.shape(), dim, false));
  counting_runner run;
  auto reduce = [dim](const auto& into, const auto& leaf) {
    using R = typename std::remove_cvref_t<decltype(into)>::value_type;
    ts::detail::reduce_dim_into<Op, Finish, R>(into, leaf, dim, "test");
  };
  op_by_op::reduce<Op, Finish, cpu>(out, node, run, reduce);
  return out;
}

// How the CUDA executor lays out a merged primitive (backend/cuda/elementwise_plan.hpp, host
// code): a number operand must not keep a dense tensor operand from being one dense run (the
// vector kernel's case), and a broadcast tensor operand still does.
TEST_CASE("op by op: a merged number operand leaves a dense run dense", "[op_by_op]") {
  using leaf = ts::detail::tensor_leaf<float, cpu>;
  using number = op_by_op::number_of<float>;
  const auto a = ts::randn<float>({4, 5});
  const auto row = ts::randn<float>({5});
  const auto dense = [](const auto& merged, const ts::Shape& shape) {
    const auto operands = ts::detail::leaf_strides_of(merged, shape);
    ts::Strides strides[3] = {shape.contiguous_strides(), operands[0], operands[1]};
    return ts::backend::cuda::merge_elementwise(shape, strides, 3).dense;
  };
  const auto times_two = op_by_op::merged_operands<cpu>(
      ts::binary_expr<ts::ops::multiply, leaf, number>(leaf{a}, number{2.0f}));
  CHECK(dense(times_two, a.shape()));
  const auto two_minus = op_by_op::merged_operands<cpu>(
      ts::binary_expr<ts::ops::subtract, number, leaf>(number{2.0f}, leaf{a}));
  CHECK(dense(two_minus, a.shape()));
  const auto plus_row =
      op_by_op::merged_operands<cpu>(ts::binary_expr<ts::ops::add, leaf, leaf>(leaf{a}, leaf{row}));
  CHECK_FALSE(dense(plus_row, a.shape()));
  // The values: each merged form against the same arithmetic in float64.
  ts::Tensor<float> y = ts::empty<float>(a.shape());
  ts::detail::run_expression(y, two_minus);
  const auto got = y.to_vector();
  const auto x = a.to_vector();
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(got[i] == static_cast<float>(2.0 - static_cast<double>(x[i])));
  }
}

TEST_CASE("op by op: reductions and softmax of expressions", "[op_by_op]") {
  ts::manual_seed(6);
  const auto a = ts::randn<float>({5, 9});
  const auto b = ts::randn<float>({9});
  using sum = ts::backend::sum_op<float>;
  using max = ts::backend::max_op<float>;
  using argmax = ts::backend::arg_op<float, true>;
  const auto e = a * b - 1;
  CHECK(op_by_op_reduce_all<sum, ts::backend::finish_value, float>(e).item() ==
        ts::sum(e).item());
  CHECK(op_by_op_reduce_all<sum, ts::backend::finish_mean, float>(e).item() ==
        ts::mean(e).item());
  CHECK(values(op_by_op_reduce_dim<sum, ts::backend::finish_value, float>(e, 1)) ==
        values(ts::sum(e, 1)));
  CHECK(values(op_by_op_reduce_dim<max, ts::backend::finish_value, float>(e, 0)) ==
        values(ts::max(e, 0)));
  CHECK(values(op_by_op_reduce_dim<argmax, ts::backend::finish_index, std::int64_t>(e, 1)) ==
        values(ts::argmax(e, 1)));
  // A sum of bools counts in int64; into a float output it goes through int64 first.
  const auto counted = op_by_op_reduce_dim<ts::backend::sum_op<std::int64_t>,
                                           ts::backend::finish_value, float>(a > 0, 1);
  const ts::Tensor<float> expected = ts::cast<float>(ts::sum(a > 0, 1));
  CHECK(values(counted) == values(expected));
  // softmax of an expression, and of an integer one (its values as float).
  auto soft = ts::empty<float>({5, 9});
  counting_runner run;
  auto softmax = [](const auto& into, const auto& leaf) {
    ts::detail::softmax_into<true>(into, leaf, 1, "test");
  };
  op_by_op::softmax<cpu>(soft, ts::detail::as_node(a * 3), run, softmax);
  CHECK(values(soft) == values(ts::log_softmax(a * 3, 1)));
  const auto i = ts::arange<std::int64_t>(0, 45).view({5, 9});
  op_by_op::softmax<cpu>(soft, ts::detail::as_node(i), run, softmax);
  CHECK(values(soft) == values(ts::log_softmax(i, 1)));
}

/// Records each primitive of the list; a non-primitive fails to compile.
struct list_checker {
  std::set<std::string> names;
  int elementwise_count = 0;
  int reductions = 0;
  int softmaxes = 0;
  template <class E>
  void elementwise() {
    static_assert(op_by_op::is_primitive_v<E, ts::cuda>);
    names.insert(typeid(E).name());
    ++elementwise_count;
  }
  template <class Op, class Finish, class Out, class V>
  void reduction() {
    static_assert(op_by_op::reduction_allowed_v<Op, Finish, Out, V>);
    ++reductions;
  }
  template <bool Log, class F>
  void softmax() {
    static_assert(op_by_op::floating_dtype_v<F>);
    ++softmaxes;
  }
};

TEST_CASE("op by op: the library's list holds primitives, each once", "[op_by_op]") {
  list_checker visit;
  op_by_op::for_each_primitive<ts::cuda>(visit);
  CHECK(visit.names.size() == static_cast<std::size_t>(visit.elementwise_count));
  // Four floating dtypes with 11 unary functors, three integer dtypes with 3, and bool with
  // none; 13 binary functors (12 for bool) with two tensors or a tensor and a number, and 3 of
  // them with the number first; where with tensors or numbers for either value (two numbers
  // only where they give the dtype: float, int64, bool).
  const int floating = 4 * (11 + 13 * 2 + 3 + 3) + 1;
  const int integer = 3 * (3 + 13 * 2 + 3 + 3) + 1;
  const int boolean = 12 * 2 + 2 + 4;
  CHECK(visit.elementwise_count == floating + integer + boolean);
  CHECK(visit.reductions == 4 * 6 + 3 * 5 + 5);
  CHECK(visit.softmaxes == 8);
}

}  // namespace op_by_op_test
