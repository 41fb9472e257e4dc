// GradScaler: PyTorch's dynamic loss scaling for mixed-precision training
// (torch.cuda.amp.GradScaler, torch/cuda/amp/grad_scaler.py, and its two kernels,
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_). A program's backward is
// seeded with the scale (Program::backward(scaler)), so small gradients survive in half
// precision; step(optimizer) divides the gradients by the scale, and skips the optimiser's step
// when any of them is inf or NaN; update() halves the scale after such a step and doubles it
// after `growth_interval` clean ones.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/autograd/program.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/tensor/state_dict.hpp"

namespace tessera::optim {

/// torch.cuda.amp.GradScaler's arguments.
struct GradScalerOptions {
  double init_scale = 65536.0;
  /// The scale is multiplied by this after growth_interval steps without inf or NaN (> 1).
  double growth_factor = 2.0;
  /// ... and by this after a step with inf or NaN gradients, which is skipped (in (0, 1)).
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  /// false: every call passes through (scale 1, no unscaling, step() steps), as PyTorch's.
  bool enabled = true;
};

namespace detail {

/// One gradient element divided by the scale (times its float reciprocal, as PyTorch), and a
/// flag set when it was inf or NaN before. C: the compute type (float for half and bfloat16).
template <class T, class C>
struct unscale_rule {
  T* grad;
  C inv_scale;
  int* found;  // host memory on the CPU, device memory on CUDA

  TESSERA_HOST_DEVICE void operator()(std::int64_t i) const {
    const C v = static_cast<C>(grad[i]);
    if (!(v - v == C(0))) *found = 1;  // inf - inf and NaN - NaN are NaN
    grad[i] = T(v * inv_scale);
  }

  /// The host loop: one flag per chunk, set once (chunks run on several threads).
  void run(std::int64_t first, std::int64_t last) const {
    T* __restrict g = grad;
    const C inv = inv_scale;
    bool bad = false;
    for (std::int64_t i = first; i < last; ++i) {
      const C v = static_cast<C>(g[i]);
      bad |= !(v - v == C(0));
      g[i] = T(v * inv);
    }
    if (bad) std::atomic_ref<int>(*found).store(1, std::memory_order_relaxed);
  }
};

/// What unscale_gradients found: whether any gradient was inf or NaN, and how many there were.
struct unscale_result {
  bool found_inf = false;
  std::size_t gradients = 0;
};
/// Unscales every gradient of `optimizer`'s parameters in place (times `inv_scale`). Throws
/// dtype_error for an integer gradient.
TESSERA_API unscale_result unscale_gradients(const Optimizer& optimizer, float inv_scale);

}  // namespace detail

/// Dynamic loss scaling (torch.cuda.amp.GradScaler), for any optimiser:
///
///     auto step = ts::autograd::compile(loss_fn, specs...);
///     ts::optim::GradScaler scaler;
///     for (...) {
///       opt.zero_grad();
///       step.forward(x, y);
///       step.backward(scaler);   // seeded with the scale
///       scaler.step(opt);        // unscales; skips the step when a gradient is inf or NaN
///       scaler.update();         // backs off or grows the scale
///     }
///
/// The scale is a float32 number, as PyTorch's; the arithmetic of unscale and update is
/// PyTorch's (float reciprocal of the scale; scale * factor rounded to float). Unlike PyTorch,
/// half and bfloat16 gradients are accepted: with 16-bit parameters the optimisers keep fp32
/// master weights (Optimizer::master_weight), which is the recipe this scaler is for.
class GradScaler {
 public:
  /// Throws std::invalid_argument for init_scale not positive and finite, growth_factor <= 1,
  /// backoff_factor outside (0, 1), growth_interval < 1.
  TESSERA_API explicit GradScaler(GradScalerOptions options = {});

  /// The current scale (1 when disabled).
  double get_scale() const noexcept { return options_.enabled ? static_cast<double>(scale_) : 1.0; }
  bool is_enabled() const noexcept { return options_.enabled; }
  double get_growth_factor() const noexcept { return options_.growth_factor; }
  double get_backoff_factor() const noexcept { return options_.backoff_factor; }
  std::int64_t get_growth_interval() const noexcept { return options_.growth_interval; }
  /// Consecutive steps without inf or NaN since the scale last changed.
  std::int64_t growth_tracker() const noexcept { return growth_tracker_; }

  /// Divides the optimiser's gradients by the scale, in place, and records whether any was inf
  /// or NaN (optional: step() does it; call it to clip or inspect the true gradients first).
  /// Throws tessera::error when called twice for the optimiser since the last update(), or after
  /// step().
  TESSERA_API void unscale_(Optimizer& optimizer);

  /// Unscales (unless unscale_ did), then runs optimizer.step() unless a gradient was inf or NaN.
  /// Returns whether it stepped. Throws tessera::error when called twice for the optimiser since
  /// the last update(), or when none of its parameters has a gradient.
  TESSERA_API bool step(Optimizer& optimizer);

  /// After the iteration's step(s): scale * backoff_factor if any optimiser found inf or NaN
  /// (and the growth tracker back to 0); otherwise the tracker counts the step, and at
  /// growth_interval the scale is multiplied by growth_factor (when that stays finite). Throws
  /// tessera::error when no step() or unscale_() was recorded since the last update.
  TESSERA_API void update();
  /// Sets the scale to `new_scale` (positive and finite, else std::invalid_argument).
  TESSERA_API void update(double new_scale);

  /// PyTorch's keys, as 0-d float64 tensors for ts::save: "scale", "growth_factor",
  /// "backoff_factor", "growth_interval", "_growth_tracker". Empty when disabled.
  TESSERA_API StateDict state_dict() const;
  /// Restores what state_dict saved; checks everything first and changes nothing when an entry
  /// is missing or invalid (tessera::error naming it). Does nothing when disabled; an empty dict
  /// is an error (saved from a disabled scaler), as in PyTorch.
  TESSERA_API void load_state_dict(const StateDict& state_dict);

 private:
  enum class stage { ready, unscaled, stepped };
  struct optimizer_state {
    stage at = stage::ready;
    bool found_inf = false;
    std::size_t gradients = 0;
  };

  static void validate(const GradScalerOptions& o);

  GradScalerOptions options_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
  // Per optimiser since the last update (keyed by address; cleared by update()).
  std::unordered_map<const Optimizer*, optimizer_state> per_optimizer_;
};

#if TESSERA_DEFINITIONS
namespace detail {
TESSERA_API unscale_result unscale_gradients(const Optimizer& optimizer, float inv_scale) {
  unscale_result result;
  int found_on_host = 0;
  std::vector<std::pair<Device, Tensor<std::int32_t, cuda>>> found_on_gpus;
  const std::vector<nn::ParameterRef>& parameters = optimizer.parameters();
  // First everything that can fail (a gradient's dtype, the memory of contiguous copies and
  // flags), so that an error leaves every gradient as it was. `work` is what is unscaled in place,
  // element by element over its memory: the gradient when it is dense (contiguous or
  // channels_last: the rule needs every element once, in any order), else a contiguous copy of
  // it, copied back at the end.
  std::vector<std::pair<AnyTensor, AnyTensor>> gradients;  // (gradient, work)
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const AnyTensor grad = parameters[i].grad();
    if (!grad.defined()) continue;
    if (!is_floating_point(grad.dtype())) {
      throw dtype_error("GradScaler: parameter " + std::to_string(i) + " of " + optimizer.name() +
                        " has a gradient of dtype " + tessera::name(grad.dtype()) +
                        "; only floating-point gradients can be unscaled");
    }
    const AnyTensor work =
        parameter_is_dense(grad.shape(), grad.strides())
            ? grad
            : grad.visit([](const auto& t) -> AnyTensor { return t.contiguous(); });
    gradients.emplace_back(grad, work);
    if (grad.device().is_cuda()) {
      auto it = found_on_gpus.begin();
      while (it != found_on_gpus.end() && it->first != grad.device()) ++it;
      if (it == found_on_gpus.end()) {
        Tensor<std::int32_t, cuda> flag =
            Tensor<std::int32_t, cuda>::empty_on(Shape{1}, grad.device());
        flag.zero_();
        found_on_gpus.emplace_back(grad.device(), flag);
      }
    }
  }
  result.gradients = gradients.size();
  // CUDA gradients are unscaled by multi-tensor launches (a few per device and dtype, as an
  // optimiser's step, not one per parameter): the rules queue here and go out at flush().
  batched_updates batch;
  for (const auto& entry : gradients) {
    // Named, not a structured binding: clang before 16 cannot capture bindings in a lambda.
    const AnyTensor& grad = entry.first;
    const AnyTensor& work = entry.second;
    visit_dtype(grad.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (is_floating_point_v<T>) {
        using C = opmath_t<T>;
        if (grad.device().is_cuda()) {
          auto it = found_on_gpus.begin();
          while (it->first != grad.device()) ++it;
          Tensor<T, cuda> typed = work.as<T, cuda>();
          const unscale_rule<T, C> rule{typed.data(), static_cast<C>(inv_scale), it->second.data()};
          for_each_element<cuda>("GradScaler", grad.device(), typed.numel(), rule);
        } else {
          Tensor<T, cpu> typed = work.as<T, cpu>();
          const unscale_rule<T, C> rule{typed.data(), static_cast<C>(inv_scale), &found_on_host};
          for_each_element<cpu>("GradScaler", grad.device(), typed.numel(), rule);
        }
      }
    });
  }
  batch.flush();
  for (const auto& [grad, work] : gradients) {
    if (work.data_ptr() != grad.data_ptr()) grad.copy_(work);  // a contiguous copy
  }
  result.found_inf = found_on_host != 0;
  for (auto& [device, flag] : found_on_gpus) {
    if (flag.item() != 0) result.found_inf = true;
  }
  return result;
}
}  // namespace detail

TESSERA_API GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(static_cast<float>(options.init_scale)) {
  validate(options_);
}

TESSERA_API void GradScaler::validate(const GradScalerOptions& o) {
  auto text = [](double v) { return std::to_string(v); };
  if (!(o.init_scale > 0.0) || !std::isfinite(static_cast<float>(o.init_scale))) {
    throw std::invalid_argument(
        "GradScaler: init_scale must be positive and finite in float32, not " + text(o.init_scale));
  }
  if (!(o.growth_factor > 1.0)) {
    throw std::invalid_argument("GradScaler: growth_factor must be > 1, not " +
                                text(o.growth_factor));
  }
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0)) {
    throw std::invalid_argument("GradScaler: backoff_factor must be in (0, 1), not " +
                                text(o.backoff_factor));
  }
  if (o.growth_interval < 1) {
    throw std::invalid_argument("GradScaler: growth_interval must be >= 1, not " +
                                std::to_string(o.growth_interval));
  }
}

TESSERA_API void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled) return;
  optimizer_state& state = per_optimizer_[&optimizer];
  if (state.at == stage::unscaled) {
    throw error("GradScaler::unscale_: already called for this " + optimizer.name() +
                " since the last update()");
  }
  if (state.at == stage::stepped) {
    throw error("GradScaler::unscale_: called after step() for this " + optimizer.name() +
                " (call update() first)");
  }
  // PyTorch: the scale's reciprocal in double, rounded to float.
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  const detail::unscale_result result = detail::unscale_gradients(optimizer, inv_scale);
  state.found_inf = result.found_inf;
  state.gradients = result.gradients;
  state.at = stage::unscaled;
}

TESSERA_API bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  optimizer_state& state = per_optimizer_[&optimizer];
  if (state.at == stage::stepped) {
    throw error("GradScaler::step: already called for this " + optimizer.name() +
                " since the last update()");
  }
  if (state.at == stage::ready) unscale_(optimizer);
  if (state.gradients == 0) {
    state.at = stage::ready;  // nothing was recorded: as if step() had not been called
    throw error("GradScaler::step: none of this " + optimizer.name() +
                "'s parameters has a gradient (no inf checks were recorded; run backward first)");
  }
  state.at = stage::stepped;
  if (state.found_inf) return false;
  optimizer.step();
  return true;
}

TESSERA_API void GradScaler::update() {
  if (!options_.enabled) return;
  bool found_inf = false, recorded = false;
  for (const auto& [optimizer, state] : per_optimizer_) {
    if (state.at == stage::ready) continue;
    recorded = true;
    found_inf = found_inf || state.found_inf;
  }
  if (!recorded) {
    throw error(
        "GradScaler::update: no step() or unscale_() since the last update (no inf "
        "checks were recorded)");
  }
  // torch's _amp_update_scale_: float scale times a double factor, stored as float.
  if (found_inf) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * options_.backoff_factor);
    growth_tracker_ = 0;
  } else {
    const std::int64_t successful = growth_tracker_ + 1;
    if (successful == options_.growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(scale_) * options_.growth_factor);
      if (std::isfinite(grown)) scale_ = grown;
      growth_tracker_ = 0;
    } else {
      growth_tracker_ = successful;
    }
  }
  per_optimizer_.clear();
}

TESSERA_API void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  if (!(new_scale > 0.0) || !std::isfinite(static_cast<float>(new_scale))) {
    throw std::invalid_argument(
        "GradScaler::update: the new scale must be positive and finite "
        "in float32, not " +
        std::to_string(new_scale));
  }
  scale_ = static_cast<float>(new_scale);
  per_optimizer_.clear();
}

TESSERA_API StateDict GradScaler::state_dict() const {
  StateDict out;
  if (!options_.enabled) return out;
  out.insert("scale", detail::state_scalar(static_cast<double>(scale_)));
  out.insert("growth_factor", detail::state_scalar(options_.growth_factor));
  out.insert("backoff_factor", detail::state_scalar(options_.backoff_factor));
  out.insert("growth_interval",
             detail::state_scalar(static_cast<double>(options_.growth_interval)));
  out.insert("_growth_tracker", detail::state_scalar(static_cast<double>(growth_tracker_)));
  return out;
}

TESSERA_API void GradScaler::load_state_dict(const StateDict& state_dict) {
  if (!options_.enabled) return;
  if (state_dict.empty()) {
    throw error(
        "GradScaler::load_state_dict: the state dict is empty (saved from a disabled "
        "GradScaler?)");
  }
  GradScalerOptions options = options_;
  options.init_scale = detail::state_number(state_dict, "scale", "GradScaler");
  options.growth_factor = detail::state_number(state_dict, "growth_factor", "GradScaler");
  options.backoff_factor = detail::state_number(state_dict, "backoff_factor", "GradScaler");
  const double interval = detail::state_number(state_dict, "growth_interval", "GradScaler");
  const double tracker = detail::state_number(state_dict, "_growth_tracker", "GradScaler");
  if (interval != std::floor(interval) || tracker != std::floor(tracker) || !(tracker >= 0) ||
      !(interval < 9.0e18) || !(tracker < interval)) {
    throw error("GradScaler::load_state_dict: growth_interval " + std::to_string(interval) +
                " and _growth_tracker " + std::to_string(tracker) +
                " must be whole numbers with 0 <= _growth_tracker < growth_interval");
  }
  options.growth_interval = static_cast<std::int64_t>(interval);
  try {
    validate(options);
  } catch (const std::invalid_argument& e) {
    throw error(std::string("GradScaler::load_state_dict: ") + e.what());
  }
  options_ = options;
  scale_ = static_cast<float>(options.init_scale);
  growth_tracker_ = static_cast<std::int64_t>(tracker);
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::optim

namespace tessera::autograd {
template <class Result>
void Program<Result>::backward(const optim::GradScaler& scaler) {
  if (state_->seed_gradient) {
    throw error(
        "Program::backward(scaler): the program was compiled with "
        "Options::seed_gradient; multiply the gradient you give backward(grad) by "
        "scaler.get_scale()");
  }
  state_->run_backward(nullptr, scaler.get_scale());
}
}  // namespace tessera::autograd
