// ts::nn::compile_eval: the evaluation program of a model in one line. A compiled Program takes
// each module's mode when it is traced (BatchNorm's batch statistics and their gradient in
// training, its running statistics as constants in evaluation; Dropout's mask or none), because
// the two modes are different graphs with different memory plans. So a model that trains and
// evaluates has two programs:
//
//     auto step = ts::autograd::compile(loss_fn, x_spec, y_spec);          // model in train()
//     auto evaluate = ts::nn::compile_eval(model, predict_fn, x_spec);     // eval, inference
#pragma once

#include <utility>
#include <vector>

#include "tessera/autograd/program.hpp"
#include "tessera/nn/module.hpp"

namespace tessera::nn {

/// Compiles `fn` over `args` (input specs, then optionally Options; the mode is always
/// Mode::inference) with `module` and all its descendants in evaluation mode, then gives every
/// module back the mode it had. The program keeps the evaluation behaviour whatever the
/// modules' modes are later.
template <class Fn, class... Args>
auto compile_eval(Module& module, Fn&& fn, const Args&... args) {
  std::vector<std::pair<Module, bool>> modes;
  for (const auto& [name, m] : module.named_modules()) modes.emplace_back(m, m.is_training());
  struct restore {
    std::vector<std::pair<Module, bool>>& modes;
    ~restore() {
      // Parents come before their children, so each module ends with its own flag.
      for (auto& [m, on] : modes) m.train(on);
    }
  } guard{modes};
  module.eval();
  if constexpr (autograd::detail::ends_with_options<Args...>()) {
    const auto all = std::tie(args...);
    autograd::Options options = std::get<sizeof...(Args) - 1>(all);
    options.mode = autograd::Mode::inference;
    return autograd::detail::compile_with(fn, options, all,
                                          std::make_index_sequence<sizeof...(Args) - 1>{});
  } else {
    return autograd::compile(fn, args..., autograd::Options{.mode = autograd::Mode::inference});
  }
}

}  // namespace tessera::nn
