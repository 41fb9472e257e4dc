// compile(fn, specs..., options): traces fn once over symbolic inputs and returns a Program that
// runs it many times. Compiling orders the steps (forward, then backward in reverse with
// recomputation of checkpointed segments), simulates them to find every buffer's lifetime, lets an
// elementwise node's output take over an input that dies there (in place), and packs all buffers
// of a device into one arena with best-fit offsets. The arena is allocated once, at the first
// forward; afterwards a training step makes no allocator calls.
// The pieces, in autograd/detail/: trace.hpp, program_state.hpp (the compiled form), schedule.hpp,
// memory_plan.hpp and arena.hpp (the plan), runtime.hpp (running it); max_batch_size is in
// autograd/max_batch_size.hpp, the options and the plan's figures in autograd/program_options.hpp.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tessera/autograd/detail/memory_plan.hpp"
#include "tessera/autograd/detail/program_state.hpp"
#include "tessera/autograd/detail/runtime.hpp"
#include "tessera/autograd/detail/schedule.hpp"
#include "tessera/autograd/detail/trace.hpp"
#include "tessera/autograd/max_batch_size.hpp"
#include "tessera/autograd/ops.hpp"
#include "tessera/autograd/program_options.hpp"

namespace tessera::optim {
class GradScaler;
}  // namespace tessera::optim

namespace tessera::autograd {

/// A compiled function: run forward (and backward in training mode) many times.
template <class Result>
class Program {
 public:
  explicit Program(std::unique_ptr<detail::program_state> state) : state_(std::move(state)) {}

  /// Runs the function on `inputs` (tensors of the compiled specs' dtypes, devices and shapes;
  /// an input not dense in its spec's memory_format is copied into it first). Returns the result
  /// tensors: views of the program's output buffers. A result you keep keeps its values
  /// (losses.push_back(loss)): before the next run writes the buffers, results still held are moved
  /// to a copy of their bytes, and only those cost anything. Do not read a kept result on another
  /// thread while the program runs again.
  template <class... Ts>
  Result forward(const Ts&... inputs) {
    bind(inputs...);
    state_->run_forward();
    return results(std::make_index_sequence<output_count()>{});
  }

  /// The forward again, as a recomputation before backward (activation checkpointing across
  /// calls): the same as forward, except that effects (BatchNorm's running statistics) are not
  /// applied a second time. Random numbers are drawn anew: restore the generator's state
  /// (Generator::state/set_state) to get those of the first run.
  template <class... Ts>
  Result recompute(const Ts&... inputs) {
    bind(inputs...);
    state_->run_forward(true);
    return results(std::make_index_sequence<output_count()>{});
  }

  /// Adds every used parameter's gradient into its .grad() (created as zeros the first time).
  /// The first result is a one-element loss (see Options::seed_gradient).
  void backward() {
    if (state_->seed_gradient) {
      throw error(
          "Program::backward: the program was compiled with Options::seed_gradient; "
          "pass the first result's gradient: backward(grad)");
    }
    state_->run_backward();
  }

  /// backward() seeded with `scaler`'s loss scale (mixed precision: PyTorch's
  /// scaler.scale(loss).backward()), so every gradient is the scale times the true one until
  /// scaler.step(optimizer) unscales it. The seed is the scale in the loss's dtype: compute the
  /// loss in float (a half loss would overflow at the default scale 65536; the scaler would then
  /// skip that step and halve the scale). Defined in tessera/optim/grad_scaler.hpp.
  void backward(const optim::GradScaler& scaler);

  /// backward with the first result's gradient given (Options::seed_gradient; PyTorch's
  /// y.backward(grad)): `grad` has the result's dtype, shape and device kind, on any ordinal.
  /// Throws for another shape or dtype, naming both.
  template <class T, class K>
  void backward(const Tensor<T, K>& grad) {
    auto& s = *state_;
    if (!s.seed_gradient) {
      throw error(
          "Program::backward(grad): the program was not compiled with "
          "Options::seed_gradient (its first result is a loss: call backward())");
    }
    const detail::value_info& info = s.g->values[static_cast<std::size_t>(s.output_ids[0])];
    if (!grad.defined()) throw error("Program::backward(grad): the gradient is undefined");
    if (scalar_type_of<T> != info.dtype || grad.shape() != info.shape ||
        grad.device().type != info.device.type) {
      throw shape_error(
          "Program::backward(grad): the gradient is " + std::string(name(scalar_type_of<T>)) + " " +
          grad.shape().str() + " on " + grad.device().str() + ", the first result is " +
          std::string(name(info.dtype)) + " " + info.shape.str() + " on " + info.device.str());
    }
    const AnyTensor seed = grad.contiguous();
    s.run_backward(&seed);
  }

  /// The gradient of input `i` (compiled with requires_grad) after the last backward: a view of
  /// a buffer of the program; kept past the next run, it keeps its values (as results do).
  /// Throws when the input does not require grad, or when the result does not depend on it.
  AnyTensor input_grad(std::size_t i) const {
    const auto& s = *state_;
    if (i >= s.input_ids.size()) {
      throw std::out_of_range("Program::input_grad: input " + std::to_string(i) + " of " +
                              std::to_string(s.input_ids.size()));
    }
    const int gid = s.g->values[static_cast<std::size_t>(s.input_ids[i])].grad;
    if (gid < 0 || !s.table.tensors[static_cast<std::size_t>(gid)].defined()) {
      throw error("Program::input_grad: input " + std::to_string(i) +
                  " has no gradient (compile its spec with requires_grad = true; the result "
                  "must depend on it)");
    }
    return state_->hand_out(s.table.tensors[static_cast<std::size_t>(gid)], state_->grad_blocks, i);
  }

  /// Frees the program's planned memory (its arena) and lets go of its inputs; the next
  /// forward allocates the arena again (from the pool's cache). Results and input gradients
  /// already returned keep their memory alive until they are dropped.
  void release() { state_->release(); }

 private:
  template <class... Ts>
  void bind(const Ts&... inputs) {
    static_assert((tessera::detail::is_tensor<Ts>::value && ...),
                  "Program::forward: inputs are tensors");
    // Made dense in the layout each input was traced for (its spec's memory_format: a copy
    // when laid out otherwise) and type-erased here; checked and bound out of line, the same
    // code for every program.
    std::size_t next = 0;
    auto dense = [&](const auto& t) {
      const std::size_t i = next++;
      const memory_format format =
          i < state_->input_ids.size()
              ? state_->g->values[static_cast<std::size_t>(state_->input_ids[i])]
                    .suggest_memory_format()
              : memory_format::contiguous_format;
      using X = std::remove_cvref_t<decltype(t)>;
      if (!t.defined() || t.is_contiguous(format)) return X(t);
      return t.contiguous(format);
    };
    const AnyTensor erased[sizeof...(Ts) + 1] = {AnyTensor(dense(inputs))...};
    state_->bind(erased, sizeof...(Ts));
  }

 public:
  const MemoryPlan& plan() const noexcept { return state_->plan; }
  std::string memory_report() const { return state_->report(); }
  /// With Options::cuda_graph: "replaying: ..." once the forward and backward are captured (with
  /// the counts of captures and launches), "warming up ..." before, or "not used: <why>" (what
  /// kept the program from graphs; it then runs as usual); "off ..." without the option.
  std::string cuda_graphs() const { return state_->cuda_graph_status(); }
  Mode mode() const noexcept { return state_->mode; }
  /// Number of parameters the program uses (GradientReady::index counts them).
  std::size_t parameter_count() const noexcept { return state_->g->parameters.size(); }
  /// Calls `hook` during backward as soon as a parameter's gradient is final.
  void on_gradient_ready(std::function<void(const GradientReady&)> hook) {
    detail::add_gradient_hook(*state_, std::move(hook));
  }
  /// Offers `hook` the product of every matmul backward that is a parameter's only gradient
  /// contribution (ParameterProduct: target (+)= x @ y, the parameter's index): when it returns
  /// true it has written the product itself and the program does not, and in that backward the
  /// parameter gets no on_gradient_ready call (the program never wrote its gradient tensor).
  /// DataParallel computes the devices' products straight into the module's gradient this way.
  /// One hook per program; an empty function removes it.
  void on_parameter_product(std::function<bool(ParameterProduct&)> hook) {
    detail::set_product_hook(*state_, std::move(hook));
  }

 private:
  static constexpr std::size_t output_count() {
    if constexpr (requires { std::tuple_size<Result>::value; }) {
      return std::tuple_size_v<Result>;
    } else {
      return 1;
    }
  }
  template <std::size_t... I>
  Result results(std::index_sequence<I...>) const {
    auto& s = *state_;
    if constexpr (requires { std::tuple_size<Result>::value; }) {
      return Result{s.hand_out(s.table.value(s.output_ids[I]), s.result_blocks, I)
                        .template as<typename std::tuple_element_t<I, Result>::value_type,
                                     typename std::tuple_element_t<I, Result>::device_kind>()...};
    } else {
      return s.hand_out(s.table.value(s.output_ids[0]), s.result_blocks, 0)
          .template as<typename Result::value_type, typename Result::device_kind>();
    }
  }

  std::unique_ptr<detail::program_state> state_;
};

namespace detail {

template <class... Args>
constexpr bool ends_with_options() {
  if constexpr (sizeof...(Args) == 0) {
    return false;
  } else {
    return std::is_same_v<
        std::remove_cvref_t<std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>>,
        Options>;
  }
}

template <class Fn, class Tuple, std::size_t... I>
auto compile_with(Fn& fn, const Options& options, const Tuple& args, std::index_sequence<I...>) {
  const auto specs = std::tie(std::get<I>(args)...);
  auto [state, tag] = trace(fn, options, specs, std::index_sequence<I...>{});
  using Result = typename decltype(tag)::type;
  return Program<Result>(std::move(state));
}

}  // namespace detail

/// Traces `fn(Var...)` once over the given input specs (ts::autograd::input<T, K>(shape, device))
/// and compiles it; the last argument may be Options. fn returns the loss (training) or any Var,
/// expression of Vars, or tuple of them.
template <class Fn, class... Args>
auto compile(Fn&& fn, const Args&... args) {
  const auto all = std::tie(args...);
  if constexpr (detail::ends_with_options<Args...>()) {
    return detail::compile_with(fn, std::get<sizeof...(Args) - 1>(all), all,
                                std::make_index_sequence<sizeof...(Args) - 1>{});
  } else {
    return detail::compile_with(fn, Options{}, all, std::make_index_sequence<sizeof...(Args)>{});
  }
}

}  // namespace tessera::autograd
