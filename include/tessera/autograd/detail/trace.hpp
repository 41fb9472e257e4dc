// Tracing, the first half of autograd::compile: the user's function runs once on symbolic Vars
// made from the input specs, its results are recorded as the outputs, and the graph is compiled
// into a program_state (program_state.hpp: scheduled and planned). Program (autograd/program.hpp)
// wraps the state; max_batch_size reads only its plan.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tessera/autograd/detail/memory_plan.hpp"
#include "tessera/autograd/detail/program_state.hpp"
#include "tessera/autograd/detail/schedule.hpp"
#include "tessera/autograd/ops.hpp"
#include "tessera/autograd/program_options.hpp"
#include "tessera/autograd/var.hpp"

namespace tessera::autograd::detail {

template <class X>
struct is_input_spec : std::false_type {};
template <class T, class K>
struct is_input_spec<input_spec<T, K>> : std::true_type {};

/// The tensors a traced result becomes.
template <class R>
struct tensors_of {
  using var = Var<typename R::value_type, typename R::device_kind>;
  using type = Tensor<typename R::value_type, typename R::device_kind>;
};
template <class... R>
struct tensors_of<std::tuple<R...>> {
  using type = std::tuple<typename tensors_of<R>::type...>;
};

// What trace does that does not depend on the traced function (out of line in compiled mode):
// a new program's state, an input's or an output's value recorded, and the compilation.
TESSERA_API std::unique_ptr<program_state> start_trace(const Options& options);
TESSERA_API int add_input(program_state& state, value_info info);
TESSERA_API void add_output(program_state& state, int id);
TESSERA_API void finish_trace(program_state& state);

template <class R>
int bind_result(const R& r) {
  if constexpr (is_var<R>::value) {
    return r.id();
  } else {
    static_assert(tessera::detail::symbolic_expression<R>,
                  "autograd::compile: the function must return a Var, an expression of Vars, or a "
                  "std::tuple of them");
    return Var<typename R::value_type, typename R::device_kind>(r).id();
  }
}

#if TESSERA_DEFINITIONS
TESSERA_API std::unique_ptr<program_state> start_trace(const Options& options) {
  auto state = std::make_unique<program_state>();
  state->g = std::make_unique<graph>();
  state->mode = options.mode;
  state->checkpoint = options.checkpoint;
  state->seed_gradient = options.seed_gradient && options.mode == Mode::training;
  state->restore_gradients = options.restore_gradients;
  state->cuda_graph = options.cuda_graph;
  state->gradients_in_arena = options.gradients_in_arena && options.mode == Mode::training;
  state->epilogues = options.epilogues;
  return state;
}
TESSERA_API int add_input(program_state& state, value_info info) {
  const int id = state.g->add_value(std::move(info));
  state.input_ids.push_back(id);
  return id;
}
TESSERA_API void add_output(program_state& state, int id) { state.output_ids.push_back(id); }
TESSERA_API void finish_trace(program_state& state) {
  state.table.tensors.assign(state.g->values.size(), AnyTensor{});
  state.compile();
  state.table.tensors.resize(state.g->values.size());
}
#endif  // TESSERA_DEFINITIONS

template <class Fn, class... Specs, std::size_t... I>
auto trace(Fn& fn, const Options& options, const std::tuple<const Specs&...>& specs,
           std::index_sequence<I...>) {
  std::unique_ptr<program_state> state = start_trace(options);
  graph* g = state->g.get();
  auto make_input = [&](std::size_t index, const auto& spec) {
    using S = std::remove_cvref_t<decltype(spec)>;
    using T = typename S::value_type;
    using K = typename S::device_kind;
    value_info info;
    info.shape = spec.shape;
    info.strides =
        spec.memory_format == memory_format::contiguous_format
            ? spec.shape.contiguous_strides()
            : tessera::detail::strides_for(spec.shape, spec.memory_format, "autograd::input");
    info.dtype = scalar_type_of<T>;
    info.device = resolve_device<K>(spec.device);
    info.role = value_role::input;
    info.requires_grad = spec.requires_grad && is_floating_point_v<T>;
    info.name = "input " + std::to_string(index);
    spec.shape.check_non_negative("autograd::input");
    return Var<T, K>(g, add_input(*state, std::move(info)), spec.shape);
  };
  // Braces: the inputs are made (and numbered) left to right.
  auto vars = std::tuple{make_input(I, std::get<I>(specs))...};
  auto result = std::apply(fn, vars);
  using R = decltype(result);
  if constexpr (requires { std::tuple_size<R>::value; }) {
    std::apply([&](const auto&... r) { (add_output(*state, bind_result(r)), ...); }, result);
  } else {
    add_output(*state, bind_result(result));
  }
  finish_trace(*state);
  return std::pair{std::move(state), std::type_identity<typename tensors_of<R>::type>{}};
}

}  // namespace tessera::autograd::detail
