// max_batch_size(fn, specs..., budget): the largest batch whose planned peak memory fits a budget,
// found by tracing and planning the function at a few batch sizes, never by running it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tessera/autograd/detail/trace.hpp"
#include "tessera/autograd/program_options.hpp"
#include "tessera/core/error.hpp"

namespace tessera::autograd {

/// A memory budget for max_batch_size: `bytes`, and the optimiser's state as a number of buffers
/// per parameter (SGD with momentum: 1, Adam: 2).
struct Budget {
  std::size_t bytes = 0;
  int optimizer_buffers = 0;
  Options options{};
};

namespace detail {
template <class Spec>
Spec with_batch(Spec spec, std::int64_t batch) {
  if (spec.shape.size() == 0) {
    throw shape_error(
        "max_batch_size: an input is 0-dim; every input needs a leading batch dimension");
  }
  spec.shape[0] = batch;
  return spec;
}

template <class Fn, class Tuple, std::size_t... I>
std::size_t planned_peak(Fn& fn, const Budget& budget, const Tuple& specs, std::int64_t batch,
                         std::index_sequence<I...> indices) {
  // Traced and planned as compile does, without a Program around the state: only its plan counts.
  const auto batched = std::tuple{with_batch(std::get<I>(specs), batch)...};
  const auto traced = trace(fn, budget.options, std::tie(std::get<I>(batched)...), indices);
  const MemoryPlan& p = traced.first->plan;
  return p.peak_bytes + static_cast<std::size_t>(budget.optimizer_buffers) * p.parameters;
}
}  // namespace detail

/// The largest leading-dimension size (batch) of every input whose planned peak memory (inputs,
/// parameters, gradients, optimiser state and the arena, as the pool allocates them) fits
/// `budget`, found by compiling plans, not by running. 0 when even a batch of 1 does not fit.
/// The last argument is the budget: a byte count or a Budget.
template <class Fn, class... Args>
std::int64_t max_batch_size(Fn&& fn, const Args&... args) {
  static_assert(sizeof...(Args) >= 2, "max_batch_size(fn, specs..., budget)");
  const auto all = std::tie(args...);
  const auto& last = std::get<sizeof...(Args) - 1>(all);
  Budget budget;
  if constexpr (std::is_same_v<std::remove_cvref_t<decltype(last)>, Budget>) {
    budget = last;
  } else {
    budget.bytes = static_cast<std::size_t>(last);
  }
  constexpr auto indices = std::make_index_sequence<sizeof...(Args) - 1>{};
  auto fits = [&](std::int64_t batch) {
    return detail::planned_peak(fn, budget, all, batch, indices) <= budget.bytes;
  };
  if (!fits(1)) return 0;
  std::int64_t good = 1, bad = 2;
  while (fits(bad)) {
    good = bad;
    if (bad > (std::int64_t{1} << 40)) return good;
    bad *= 2;
  }
  while (bad - good > 1) {
    const std::int64_t mid = good + (bad - good) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

}  // namespace tessera::autograd
