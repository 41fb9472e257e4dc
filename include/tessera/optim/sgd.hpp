// SGD with momentum, dampening, Nesterov momentum and weight decay: exactly torch.optim.SGD's
// rule (torch/optim/sgd.py), one fused pass per parameter, the momentum buffer made at the
// first step that finds a gradient.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/optim/optimizer.hpp"

namespace tessera::optim {

/// torch.optim.SGD's hyperparameters. `lr` has no default: leaving it out is an error.
struct SGDOptions {
  double lr = std::numeric_limits<double>::quiet_NaN();
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  /// Maximise the objective (step along the gradient), as PyTorch's `maximize`.
  bool maximize = false;
};

namespace detail {

/// One element of SGD. With momentum, the first step sets the buffer to the (decayed) gradient
/// itself, without dampening, as PyTorch does. T is the parameter's dtype, or float for the
/// fp32 master of a 16-bit parameter L (then G, the gradient's dtype, is L too, and `low` the
/// 16-bit parameter the pass writes as well).
template <class T, class C, class G = T, class L = T>
struct sgd_update {
  T* parameter;
  const G* grad;
  T* momentum_buffer;  // null without momentum
  C lr, momentum, dampening_complement, weight_decay;
  bool nesterov, first_step, maximize;
  L* low = nullptr;  // the 16-bit parameter of a master (L != T)

  TESSERA_HOST_DEVICE void operator()(std::int64_t i) const {
    const C p = start_value<C>(parameter, low, i);
    C d = static_cast<C>(grad[i]);
    if (maximize) d = -d;
    if (weight_decay != C(0)) d = d + weight_decay * p;
    if (momentum_buffer != nullptr) {
      C b =
          first_step ? d : static_cast<C>(momentum_buffer[i]) * momentum + dampening_complement * d;
      momentum_buffer[i] = T(b);
      b = static_cast<C>(T(b));  // the stored value is what PyTorch reads back
      d = nesterov ? d + momentum * b : b;
    }
    store_value<C>(parameter, low, i, p + (-lr) * d);
  }

  /// Elements [first, last) on the host: the rule's flags chosen once, outside the loop, so
  /// each variant is a straight loop over distinct buffers that the compiler vectorises. Not for
  /// fp32 masters (L != T): their ten variants would be compiled in every header-only unit for
  /// a path that is the CPU's slow one anyway (half arithmetic); operator() serves them.
  void run(std::int64_t first, std::int64_t last) const requires std::is_same_v<L, T> {
    if (weight_decay != C(0)) return with_decay<true>(first, last);
    return with_decay<false>(first, last);
  }

 private:
  template <bool Decay>
  void with_decay(std::int64_t first, std::int64_t last) const {
    if (momentum_buffer == nullptr) return loop<Decay, false, false, false>(first, last);
    if (first_step) {
      return nesterov ? loop<Decay, true, true, true>(first, last)
                      : loop<Decay, true, true, false>(first, last);
    }
    return nesterov ? loop<Decay, true, false, true>(first, last)
                    : loop<Decay, true, false, false>(first, last);
  }
  template <bool Decay, bool Momentum, bool First, bool Nesterov>
  void loop(std::int64_t first, std::int64_t last) const {
    T* __restrict p_out = parameter;
    const G* __restrict g_in = grad;
    T* __restrict buffer = momentum_buffer;
    L* __restrict l_out = low;
    const C sign = maximize ? C(-1) : C(1);
    const C decay = weight_decay, mu = momentum, damp = dampening_complement, step = -lr;
    for (std::int64_t i = first; i < last; ++i) {
      const C p = start_value<C>(p_out, l_out, i);
      C d = sign * static_cast<C>(g_in[i]);
      if constexpr (Decay) d = d + decay * p;
      if constexpr (Momentum) {
        C b;
        if constexpr (First) {
          b = d;
        } else {
          b = static_cast<C>(buffer[i]) * mu + damp * d;
        }
        buffer[i] = T(b);
        b = static_cast<C>(T(b));
        d = Nesterov ? d + mu * b : b;
      }
      store_value<C>(p_out, l_out, i, p + step * d);
    }
  }
};

}  // namespace detail

/// Stochastic gradient descent (torch.optim.SGD): for each parameter p with a gradient g,
///
///     g = g + weight_decay * p                       (if weight_decay != 0)
///     buf = g at the first step, else momentum * buf + (1 - dampening) * g   (if momentum != 0)
///     g = g + momentum * buf if nesterov, else buf    (if momentum != 0)
///     p = p - lr * g
///
/// computed in the parameter's dtype in one pass per parameter; a half or bfloat16 parameter
/// through its fp32 master (Optimizer::master_weight), with a float momentum buffer.
/// With momentum, step() makes one buffer per parameter the first time it sees its gradient.
class SGD : public Optimizer {
 public:
  using options_type = SGDOptions;

  /// Throws std::invalid_argument, as PyTorch does, for a missing or negative lr, a negative
  /// momentum, dampening or weight_decay, or nesterov without momentum or with dampening; and
  /// for an empty or repeated parameter list.
  SGD(std::vector<nn::ParameterRef> parameters, SGDOptions options)
      : Optimizer(std::move(parameters), "SGD"),
        options_(options),
        momentum_buffers_(parameters_.size()) {
    validate(options_);
  }
  /// Parameter groups with their own lr and weight_decay (ParamGroup); `options` are the
  /// defaults.
  SGD(std::vector<ParamGroup> groups, SGDOptions options)
      : Optimizer(std::move(groups), "SGD"),
        options_(options),
        momentum_buffers_(parameters_.size()) {
    for (std::size_t g = 0; g < groups_.size(); ++g) validate(group_options(g));
  }

  /// The hyperparameters (the defaults of the parameter groups); change them between steps
  /// (e.g. the learning rate). step() checks them again.
  SGDOptions& options() noexcept { return options_; }
  const SGDOptions& options() const noexcept { return options_; }
  /// Group g's hyperparameters: options() with the group's own lr and weight_decay.
  SGDOptions group_options(std::size_t g) const { return options_of_group(g, options_); }
  double group_lr(std::size_t g) const { return group_options(g).lr; }
  /// The group's own rate when it has one, else options().lr (the schedulers call this).
  void set_group_lr(std::size_t g, double lr) { set_lr_of_group(g, lr, options_.lr); }

  /// Parameter i's momentum buffer (undefined before its first step, or without momentum).
  const AnyTensor& momentum_buffer(std::size_t i) const { return momentum_buffers_.at(i); }

  /// PyTorch's optimizer state, flattened for ts::save: "state.<i>.momentum_buffer" (shared,
  /// not copied), "state.<i>.master_weight" for a 16-bit parameter that has stepped, and for
  /// each group g "param_groups.<g>.lr", ".momentum", ".dampening", ".weight_decay",
  /// ".nesterov", ".maximize" (0-d float64) and ".params" (its parameters' indices, int64).
  TESSERA_API StateDict state_dict() const;
  /// Restores what state_dict saved (buffers copied to the parameters' devices). Checks all of
  /// it first (a missing hyperparameter, invalid options, a buffer of another shape or dtype, an
  /// index that names no parameter: tessera::error, shape_error, dtype_error naming the entry)
  /// and changes nothing when something does not fit.
  TESSERA_API void load_state_dict(const StateDict& state_dict);

  // TESSERA_API (inline) header-only: a virtual function declared without it would be SGD's key
  // function, and every unit would then emit SGD's vtable and the update of every dtype.
  TESSERA_API void step() override;

  static void validate(const SGDOptions& o);

 private:
  static std::string str(double v) { return std::to_string(v); }

  /// Parameter i's momentum buffer for this step (undefined without momentum), made (its first
  /// step) or checked and on its device, without changing any state: step() stages every
  /// parameter's before it updates any.
  template <Dtype T, DeviceKind K>
  AnyTensor stage(std::size_t i, const Tensor<T, K>& value) const {
    if (group_options(group_of_[i]).momentum == 0.0) return {};
    // Made here, filled by the pass (the first step writes it without reading it).
    if (!momentum_buffers_[i].defined()) {
      return Tensor<T, K>::empty_on(value.shape(), value.device(),
                                    detail::parameter_format(value.shape(), value.strides()));
    }
    AnyTensor buffer = momentum_buffers_[i];  // state_like moves this copy, not the state
    (void)state_like(buffer, value, "momentum buffer", i);
    return buffer;
  }

  /// Updates parameter i with the buffer stage() made for it, and commits the buffer. `value` is
  /// the parameter, or the fp32 master of the 16-bit parameter `low`.
  template <Dtype T, DeviceKind K, Dtype G = T, Dtype L = T>
  void update(std::size_t i, const Tensor<T, K>& value, const Tensor<G, K>& grad,
              const AnyTensor& staged, const Tensor<L, K>& low = {}) {
    using C = opmath_t<T>;
    const SGDOptions o = group_options(group_of_[i]);
    const bool has_momentum = o.momentum != 0.0;
    AnyTensor& buffer_state = momentum_buffers_[i];
    const bool first_step = has_momentum && !buffer_state.defined();
    Tensor<T, K> buffer;
    if (has_momentum) buffer = staged.template as<T, K>();
    L* low_data = nullptr;
    if constexpr (!std::is_same_v<L, T>) low_data = low.data();
    const detail::sgd_update<T, C, G, L> rule{value.data(),
                                              grad.data(),
                                              has_momentum ? buffer.data() : nullptr,
                                              static_cast<C>(o.lr),
                                              static_cast<C>(o.momentum),
                                              static_cast<C>(1.0 - o.dampening),
                                              static_cast<C>(o.weight_decay),
                                              o.nesterov,
                                              first_step,
                                              o.maximize,
                                              low_data};
    detail::for_each_element<K>("SGD", value.device(), value.numel(), rule);
    if (has_momentum) buffer_state = staged;
  }

  SGDOptions options_;
  std::vector<AnyTensor> momentum_buffers_;
};

#if TESSERA_DEFINITIONS
TESSERA_API void SGD::step() {
  const profiler::range timing(name_.c_str(), "step",
                               profiler::active_recorder() ? step_device() : Device{});
  for (std::size_t g = 0; g < groups_.size(); ++g) validate(group_options(g));
  // Everything that can fail first (each gradient checked, each buffer made or moved): a bad
  // gradient or an out-of-memory error leaves every parameter and its buffer as they were.
  std::vector<AnyTensor> staged(parameters_.size());
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

TESSERA_API StateDict SGD::state_dict() const {
  StateDict out;
  for (std::size_t i = 0; i < momentum_buffers_.size(); ++i) {
    if (momentum_buffers_[i].defined()) {
      out.insert(state_key(i, "momentum_buffer"), momentum_buffers_[i]);
    }
  }
  save_masters(out);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const SGDOptions o = group_options(g);
    out.insert(group_key(g, "lr"), scalar(o.lr));
    out.insert(group_key(g, "momentum"), scalar(o.momentum));
    out.insert(group_key(g, "dampening"), scalar(o.dampening));
    out.insert(group_key(g, "weight_decay"), scalar(o.weight_decay));
    out.insert(group_key(g, "nesterov"), scalar(o.nesterov ? 1 : 0));
    out.insert(group_key(g, "maximize"), scalar(o.maximize ? 1 : 0));
  }
  save_groups(out);
  return out;
}
TESSERA_API void SGD::load_state_dict(const StateDict& state_dict) {
  check_state_indices(state_dict);
  check_groups(state_dict);
  SGDOptions options = options_;
  options.momentum = scalar_of(state_dict, "param_groups.0.momentum");
  options.dampening = scalar_of(state_dict, "param_groups.0.dampening");
  options.nesterov = scalar_of(state_dict, "param_groups.0.nesterov") != 0;
  options.maximize = scalar_of(state_dict, "param_groups.0.maximize") != 0;
  std::vector<group_settings> groups;
  load_group_settings(state_dict, options, groups);
  for (std::size_t g = 0; g < groups.size(); ++g) validate(options_of_group_in(groups, g, options));
  std::vector<AnyTensor> buffers(parameters_.size());
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    buffers[i] = loaded_state(state_dict, i, "momentum_buffer");
  }
  std::vector<AnyTensor> masters = loaded_masters(state_dict);
  options_ = options;
  groups_ = std::move(groups);
  momentum_buffers_ = std::move(buffers);
  masters_ = std::move(masters);
}

TESSERA_API void SGD::validate(const SGDOptions& o) {
  if (std::isnan(o.lr)) {
    throw std::invalid_argument("SGD: the learning rate is not set; give options.lr");
  }
  if (!(o.lr >= 0.0)) throw std::invalid_argument("SGD: invalid learning rate " + str(o.lr));
  if (!(o.momentum >= 0.0)) {
    throw std::invalid_argument("SGD: invalid momentum value " + str(o.momentum));
  }
  if (!(o.dampening >= 0.0)) {
    throw std::invalid_argument("SGD: invalid dampening value " + str(o.dampening));
  }
  if (!(o.weight_decay >= 0.0)) {
    throw std::invalid_argument("SGD: invalid weight_decay value " + str(o.weight_decay));
  }
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
    throw std::invalid_argument(
        "SGD: Nesterov momentum requires a momentum and zero dampening (momentum " +
        str(o.momentum) + ", dampening " + str(o.dampening) + ")");
  }
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::optim
