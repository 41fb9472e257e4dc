// Adam and AdamW: exactly torch.optim.Adam's and torch.optim.AdamW's rules (torch/optim/adam.py,
// adamw.py), with bias corrections from a step count kept per parameter, AMSGrad, and one fused
// pass per parameter that writes the parameter and every moment at once. The moments are made at
// the first step that finds a gradient (two buffers per parameter, three with amsgrad).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/optim/optimizer.hpp"
#include "tessera/tensor/factories.hpp"

namespace tessera::optim {

/// torch.optim.Adam's hyperparameters.
struct AdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  /// L2 penalty added to the gradient (coupled, as Adam's).
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
};

/// torch.optim.AdamW's hyperparameters: as Adam's, with decoupled weight decay 1e-2.
struct AdamWOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  /// Decoupled: p = p * (1 - lr * weight_decay) before the Adam update.
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

namespace detail {

/// One element of Adam / AdamW. At the first step the moments are written without being read
/// (they start at zero, so m = (1 - beta1) g and v = (1 - beta2) g^2 exactly).
template <class T, class C, class G = T, class L = T>
struct adam_update {
  T* parameter;
  const G* grad;
  T* exp_avg;
  T* exp_avg_sq;
  T* max_exp_avg_sq;  // null without amsgrad
  C beta1, beta2, one_minus_beta1, one_minus_beta2;
  C weight_decay;           // Adam: added to the gradient
  C decay_factor;           // AdamW: 1 - lr * weight_decay
  C negative_step_size;     // -lr / (1 - beta1^t)
  C bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  C eps;
  bool decoupled, first_step, maximize;
  L* low = nullptr;  // the 16-bit parameter of an fp32 master (L != T; see sgd_update)

  TESSERA_HOST_DEVICE void operator()(std::int64_t i) const {
    C p = start_value<C>(parameter, low, i);
    C g = static_cast<C>(grad[i]);
    if (maximize) g = -g;
    if (decoupled) {
      p = p * decay_factor;
    } else if (weight_decay != C(0)) {
      g = g + weight_decay * p;
    }
    // The stored (rounded) moments are what PyTorch reads back, hence the round trips via T.
    const C m =
        static_cast<C>(T(first_step ? one_minus_beta1 * g
                                    : static_cast<C>(exp_avg[i]) * beta1 + one_minus_beta1 * g));
    const C v = static_cast<C>(
        T(first_step ? one_minus_beta2 * g * g
                     : static_cast<C>(exp_avg_sq[i]) * beta2 + one_minus_beta2 * g * g));
    exp_avg[i] = T(m);
    exp_avg_sq[i] = T(v);
    C second = v;
    if (max_exp_avg_sq != nullptr) {
      // PyTorch's running maximum starts at zero, and v >= 0: the first maximum is v.
      second = first_step ? v : maximum(static_cast<C>(max_exp_avg_sq[i]), v);
      max_exp_avg_sq[i] = T(second);
      second = static_cast<C>(T(second));
    }
    const C denominator = square_root(second) / bias_correction2_sqrt + eps;
    store_value<C>(parameter, low, i, p + negative_step_size * m / denominator);
  }
};

/// What Adam and AdamW share; `Decoupled` selects AdamW's weight decay.
template <class Options, bool Decoupled>
class adam_base : public Optimizer {
 public:
  using options_type = Options;

  adam_base(std::vector<nn::ParameterRef> parameters, Options options, const char* name)
      : Optimizer(std::move(parameters), name), options_(options), state_(parameters_.size()) {
    validate(options_, name_);
  }
  adam_base(std::vector<ParamGroup> groups, Options options, const char* name)
      : Optimizer(std::move(groups), name), options_(options), state_(parameters_.size()) {
    for (std::size_t g = 0; g < groups_.size(); ++g) validate(group_options(g), name_);
  }

  /// The hyperparameters (the defaults of the parameter groups); change them between steps.
  Options& options() noexcept { return options_; }
  const Options& options() const noexcept { return options_; }
  /// Group g's hyperparameters: options() with the group's own lr and weight_decay.
  Options group_options(std::size_t g) const { return options_of_group(g, options_); }
  double group_lr(std::size_t g) const { return group_options(g).lr; }
  /// The group's own rate when it has one, else options().lr (the schedulers call this).
  void set_group_lr(std::size_t g, double lr) { set_lr_of_group(g, lr, options_.lr); }

  /// Steps taken by parameter i (it counts only the steps that found a gradient).
  std::int64_t step_count(std::size_t i) const { return state_.at(i).step; }
  /// Parameter i's moments (undefined before its first step; max_exp_avg_sq only with amsgrad).
  const AnyTensor& exp_avg(std::size_t i) const { return state_.at(i).exp_avg; }
  const AnyTensor& exp_avg_sq(std::size_t i) const { return state_.at(i).exp_avg_sq; }
  const AnyTensor& max_exp_avg_sq(std::size_t i) const { return state_.at(i).max_exp_avg_sq; }

  /// PyTorch's optimizer state, flattened for ts::save: "state.<i>.step" (0-d float64),
  /// ".exp_avg", ".exp_avg_sq", ".max_exp_avg_sq" (shared, not copied) for each parameter that
  /// has stepped, ".master_weight" for a 16-bit one (its fp32 master), and for each group g
  /// "param_groups.<g>.lr", ".betas" ([2]), ".eps", ".weight_decay", ".amsgrad", ".maximize"
  /// and ".params" (its parameters' indices, int64).
  StateDict state_dict() const {
    StateDict out;
    for (std::size_t i = 0; i < state_.size(); ++i) {
      const parameter_state& s = state_[i];
      if (!s.exp_avg.defined()) continue;
      out.insert(state_key(i, "step"), scalar(static_cast<double>(s.step)));
      out.insert(state_key(i, "exp_avg"), s.exp_avg);
      out.insert(state_key(i, "exp_avg_sq"), s.exp_avg_sq);
      if (s.max_exp_avg_sq.defined()) out.insert(state_key(i, "max_exp_avg_sq"), s.max_exp_avg_sq);
    }
    save_masters(out);
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const Options o = group_options(g);
      out.insert(group_key(g, "lr"), scalar(o.lr));
      out.insert(group_key(g, "betas"), from_vector<double>({o.betas[0], o.betas[1]}, {2}, 0));
      out.insert(group_key(g, "eps"), scalar(o.eps));
      out.insert(group_key(g, "weight_decay"), scalar(o.weight_decay));
      out.insert(group_key(g, "amsgrad"), scalar(o.amsgrad ? 1 : 0));
      out.insert(group_key(g, "maximize"), scalar(o.maximize ? 1 : 0));
    }
    save_groups(out);
    return out;
  }
  /// Restores what state_dict saved (moments copied to the parameters' devices). Checks all of
  /// it first and changes nothing when something does not fit (tessera::error, shape_error,
  /// dtype_error naming the entry; std::invalid_argument for invalid options).
  void load_state_dict(const StateDict& state_dict) {
    check_state_indices(state_dict);
    check_groups(state_dict);
    Options options = options_;
    if (!state_dict.contains("param_groups.0.betas") ||
        state_dict.at("param_groups.0.betas").numel() != 2 ||
        state_dict.at("param_groups.0.betas").dtype() != ScalarType::float64) {
      throw error(name_ + "::load_state_dict: param_groups.0.betas must be two float64 numbers");
    }
    const auto betas = state_dict.at("param_groups.0.betas").as<double>().to_vector();
    options.betas = {betas[0], betas[1]};
    options.eps = scalar_of(state_dict, "param_groups.0.eps");
    options.amsgrad = scalar_of(state_dict, "param_groups.0.amsgrad") != 0;
    options.maximize = scalar_of(state_dict, "param_groups.0.maximize") != 0;
    std::vector<group_settings> groups;
    load_group_settings(state_dict, options, groups);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      validate(options_of_group_in(groups, g, options), name_);
    }
    std::vector<parameter_state> state(parameters_.size());
    for (std::size_t i = 0; i < state.size(); ++i) {
      parameter_state& s = state[i];
      s.exp_avg = loaded_state(state_dict, i, "exp_avg");
      if (!s.exp_avg.defined()) continue;  // not stepped yet
      s.exp_avg_sq = loaded_state(state_dict, i, "exp_avg_sq");
      s.max_exp_avg_sq = loaded_state(state_dict, i, "max_exp_avg_sq");
      if (!s.exp_avg_sq.defined() || (options.amsgrad && !s.max_exp_avg_sq.defined())) {
        throw error(name_ + "::load_state_dict: parameter " + std::to_string(i) +
                    " has exp_avg but not all of its other moments");
      }
      const double step = scalar_of(state_dict, state_key(i, "step"));
      // A whole number of steps (torch saves it as a float): -1, NaN or 1e30 would make the next
      // update's bias corrections 0 or NaN, and every parameter non-finite.
      if (!(step >= 0 && step <= 0x1p53 && step == std::floor(step))) {
        throw error(name_ + "::load_state_dict: " + state_key(i, "step") + " is " +
                    tessera::detail::number_str(step) +
                    ", not a whole number of steps from 0 to 2^53; nothing was loaded");
      }
      s.step = static_cast<std::int64_t>(step);
    }
    std::vector<AnyTensor> masters = loaded_masters(state_dict);
    options_ = options;
    groups_ = std::move(groups);
    state_ = std::move(state);
    masters_ = std::move(masters);
  }

  // Defined below the class, not inline: in compiled mode the library instantiates Adam's and
  // AdamW's (TESSERA_INSTANTIATE), and a user's unit compiles no update for any dtype.
  void step() override;
  adam_base(adam_base&&) = default;
  adam_base& operator=(adam_base&&) = default;
  ~adam_base() override;

  /// Throws std::invalid_argument as PyTorch does: lr < 0, eps < 0, a beta outside [0, 1),
  /// weight_decay < 0.
  static void validate(const Options& o, const std::string& name);

 private:
  struct parameter_state {
    std::int64_t step = 0;
    AnyTensor exp_avg, exp_avg_sq, max_exp_avg_sq;
  };

  /// A parameter's moments for one step: made (its first step) or checked and on its device.
  struct staged_moments {
    AnyTensor exp_avg, exp_avg_sq, max_exp_avg_sq;
  };

  /// Parameter i's moments for this step, without changing any state: step() stages every
  /// parameter's (the allocations and checks that can fail) before it updates any.
  template <Dtype T, DeviceKind K>
  staged_moments stage(std::size_t i, const Tensor<T, K>& value) const {
    const Options o = group_options(group_of_[i]);
    const parameter_state& state = state_[i];
    staged_moments out;
    if (!state.exp_avg.defined()) {
      // Made here, filled by the pass, which writes them without reading them.
      // Laid out as the parameter, alongside which the pass reads them element by element.
      const memory_format format = detail::parameter_format(value.shape(), value.strides());
      out.exp_avg = Tensor<T, K>::empty_on(value.shape(), value.device(), format);
      out.exp_avg_sq = Tensor<T, K>::empty_on(value.shape(), value.device(), format);
      if (o.amsgrad) {
        out.max_exp_avg_sq = Tensor<T, K>::empty_on(value.shape(), value.device(), format);
      }
      return out;
    }
    if (o.amsgrad && !state.max_exp_avg_sq.defined()) {
      throw error(name_ + ": amsgrad was switched on after parameter " + std::to_string(i) +
                  "'s first step; PyTorch fails there too (no max_exp_avg_sq state)");
    }
    out.exp_avg = state.exp_avg;  // copies of the handles: state_like moves these, not the state
    out.exp_avg_sq = state.exp_avg_sq;
    (void)state_like(out.exp_avg, value, "exp_avg", i);
    (void)state_like(out.exp_avg_sq, value, "exp_avg_sq", i);
    if (o.amsgrad) {
      out.max_exp_avg_sq = state.max_exp_avg_sq;
      (void)state_like(out.max_exp_avg_sq, value, "max_exp_avg_sq", i);
    }
    return out;
  }

  /// `value` is the parameter, or the fp32 master of the 16-bit parameter `low`; `moments` what
  /// stage() made for it. Updates the parameter and commits the moments.
  template <Dtype T, DeviceKind K, Dtype G = T, Dtype L = T>
  void update(std::size_t i, const Tensor<T, K>& value, const Tensor<G, K>& grad,
              const staged_moments& moments, const Tensor<L, K>& low = {}) {
    using C = opmath_t<T>;
    const Options o = group_options(group_of_[i]);
    parameter_state& state = state_[i];
    const bool first_step = !state.exp_avg.defined();
    const Tensor<T, K> exp_avg = moments.exp_avg.template as<T, K>();
    const Tensor<T, K> exp_avg_sq = moments.exp_avg_sq.template as<T, K>();
    Tensor<T, K> max_exp_avg_sq;
    if (o.amsgrad) max_exp_avg_sq = moments.max_exp_avg_sq.template as<T, K>();
    // Scalars in double, as Python computes them, then rounded to the compute type.
    const double step = static_cast<double>(state.step + 1);
    const double bias_correction1 = 1.0 - std::pow(o.betas[0], step);
    const double bias_correction2 = 1.0 - std::pow(o.betas[1], step);
    L* low_data = nullptr;
    if constexpr (!std::is_same_v<L, T>) low_data = low.data();
    const detail::adam_update<T, C, G, L> rule{value.data(),
                                               grad.data(),
                                               exp_avg.data(),
                                               exp_avg_sq.data(),
                                               o.amsgrad ? max_exp_avg_sq.data() : nullptr,
                                               static_cast<C>(o.betas[0]),
                                               static_cast<C>(o.betas[1]),
                                               static_cast<C>(1.0 - o.betas[0]),
                                               static_cast<C>(1.0 - o.betas[1]),
                                               static_cast<C>(o.weight_decay),
                                               static_cast<C>(1.0 - o.lr * o.weight_decay),
                                               static_cast<C>(-(o.lr / bias_correction1)),
                                               static_cast<C>(std::sqrt(bias_correction2)),
                                               static_cast<C>(o.eps),
                                               Decoupled,
                                               first_step,
                                               o.maximize,
                                               low_data};
    detail::for_each_element<K>(name_.c_str(), value.device(), value.numel(), rule);
    state.step += 1;
    state.exp_avg = moments.exp_avg;
    state.exp_avg_sq = moments.exp_avg_sq;
    if (o.amsgrad) state.max_exp_avg_sq = moments.max_exp_avg_sq;
  }

  Options options_;
  std::vector<parameter_state> state_;
};

template <class Options, bool Decoupled>
void adam_base<Options, Decoupled>::step() {
  const profiler::range timing(name_.c_str(), "step",
                               profiler::active_recorder() ? step_device() : Device{});
  for (std::size_t g = 0; g < groups_.size(); ++g) validate(group_options(g), name_);
  // Everything that can fail first (each gradient checked, each moment made or moved): a bad
  // gradient or an out-of-memory error leaves every parameter and its state as they were.
  std::vector<staged_moments> staged(parameters_.size());
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    with_typed(i, [&](auto value, auto, auto...) { staged[i] = stage(i, value); });
  }
  // CUDA parameters' updates go out as multi-tensor launches (a few per step, not one each).
  detail::batched_updates batch;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    with_typed(i, [&](auto value, auto grad, auto... low) {
      update(i, value, grad, staged[i], low...);
    });
  }
  batch.flush();
}

template <class Options, bool Decoupled>
adam_base<Options, Decoupled>::~adam_base() = default;

template <class Options, bool Decoupled>
void adam_base<Options, Decoupled>::validate(const Options& o, const std::string& name) {
  auto text = [](double v) { return std::to_string(v); };
  if (!(o.lr >= 0.0)) throw std::invalid_argument(name + ": invalid learning rate " + text(o.lr));
  if (!(o.eps >= 0.0)) throw std::invalid_argument(name + ": invalid epsilon value " + text(o.eps));
  for (int k = 0; k < 2; ++k) {
    if (!(o.betas[k] >= 0.0 && o.betas[k] < 1.0)) {
      throw std::invalid_argument(name + ": invalid beta parameter at index " + std::to_string(k) +
                                  ": " + text(o.betas[k]) + " (expected 0 <= beta < 1)");
    }
  }
  if (!(o.weight_decay >= 0.0)) {
    throw std::invalid_argument(name + ": invalid weight_decay value " + text(o.weight_decay));
  }
}

TESSERA_INSTANTIATE(class adam_base<AdamOptions, false>)
TESSERA_INSTANTIATE(class adam_base<AdamWOptions, true>)

}  // namespace detail

/// Adam (torch.optim.Adam): for each parameter p with gradient g, at its step t (counted per
/// parameter),
///
///     g = g + weight_decay * p                                  (if weight_decay != 0)
///     m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2   (m, v start at 0)
///     v_hat = max(v_hat, v) with amsgrad, else v
///     p = p - lr / (1 - beta1^t) * m / (sqrt(v_hat) / sqrt(1 - beta2^t) + eps)
///
/// in the parameter's dtype, one pass per parameter; a half or bfloat16 parameter through its
/// fp32 master (Optimizer::master_weight), with float moments. The first step of a parameter
/// makes its two moments (three with amsgrad).
class Adam : public detail::adam_base<AdamOptions, false> {
 public:
  /// Throws std::invalid_argument for invalid options (see validate) or parameter lists.
  Adam(std::vector<nn::ParameterRef> parameters, AdamOptions options = {})
      : adam_base(std::move(parameters), options, "Adam") {}
  /// Parameter groups with their own lr and weight_decay (ParamGroup).
  Adam(std::vector<ParamGroup> groups, AdamOptions options = {})
      : adam_base(std::move(groups), options, "Adam") {}
  Adam(Adam&&) = default;
  Adam& operator=(Adam&&) = default;
  TESSERA_API ~Adam() override;
};

/// AdamW (torch.optim.AdamW): Adam with decoupled weight decay, p = p * (1 - lr * weight_decay)
/// before the update, and the gradient left alone. Default weight_decay 1e-2.
class AdamW : public detail::adam_base<AdamWOptions, true> {
 public:
  AdamW(std::vector<nn::ParameterRef> parameters, AdamWOptions options = {})
      : adam_base(std::move(parameters), options, "AdamW") {}
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {})
      : adam_base(std::move(groups), options, "AdamW") {}
  AdamW(AdamW&&) = default;
  AdamW& operator=(AdamW&&) = default;
  TESSERA_API ~AdamW() override;
};

// Out of line in compiled mode, so that the library holds the destructors and vtables; empty
// bodies, not `= default` (config.hpp: nvcc would make them key functions).
#if TESSERA_DEFINITIONS
TESSERA_API Adam::~Adam() {}
TESSERA_API AdamW::~AdamW() {}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::optim
