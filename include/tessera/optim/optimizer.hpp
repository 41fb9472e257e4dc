// Optimizer: what SGD, Adam and AdamW share. It holds the parameters as nn::ParameterRef (so
// `module.to(i)` and `load_state_dict`, which replace or overwrite values in the shared slots,
// are seen at the next step), dispatches each one to its dtype and device kind at run time, and
// runs each parameter's update as one fused elementwise pass (a threaded CPU loop) that writes
// the parameter and its state; on CUDA (nvcc-compiled units) a step's updates of one rule type
// go out as multi-tensor launches, a few per step (optim/detail/update_list.hpp).
// A half or bfloat16 parameter is updated through an fp32 master copy (mixed precision): the
// pass reads the 16-bit gradient, updates the float master and float state, and writes the
// master rounded to the 16-bit parameter.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/backend/cpu/executor.hpp"
#include "tessera/backend/evaluator.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/nn/parameter.hpp"
#include "tessera/optim/detail/update_list.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/factories.hpp"
#include "tessera/tensor/state_dict.hpp"
#if TESSERA_CUDA_KERNELS
#include "tessera/backend/cuda/multi_update.cuh"
#endif

namespace tessera::optim {

namespace detail {

#if TESSERA_CUDA_KERNELS
/// Rules of type Update queued on one device during a step.
template <class Update>
struct typed_updates final : pending_updates {
  Device device;
  std::vector<Update> rules;
  std::vector<std::int64_t> sizes;

  explicit typed_updates(Device d) : device(d) {}
  void launch() override {
    DeviceGuard<tessera::cuda> guard(device.index);
    backend::cuda::run_update_lists(rules, sizes);
  }
};
#endif

/// Runs update(i) for every i in [0, n) on `device`, as one pass (one counted launch): a
/// threaded loop on the CPU, a multi-tensor launch of one rule on CUDA (backend/cuda/
/// multi_update.cuh); on CUDA during an optimiser's step (a batched_updates on this thread),
/// queued and launched with the step's other updates of its type. The update reads and writes
/// contiguous arrays through raw pointers, so a pass writes every output of the rule at once.
/// A CUDA parameter in a unit not compiled by nvcc throws tessera::error saying so.
template <DeviceKind K, class Update>
void for_each_element(const char* optimiser, Device device, std::int64_t n, const Update& update) {
  (void)optimiser;  // named only in the error of a unit not compiled by nvcc
  if constexpr (std::is_same_v<K, cpu>) {
    profiler::count_launch();
    backend::cpu::execute_loop(0, n, backend::cpu::grain_size,
                               [&](std::int64_t first, std::int64_t last) {
                                 // A local copy: stores through the rule's float pointers could
                                 // alias the referenced rule's own float fields and force a
                                 // reload every iteration; a local one is kept in registers.
                                 // The buffers are distinct, so the iterations are independent.
                                 const Update local = update;
                                 if constexpr (requires { local.run(first, last); }) {
                                   local.run(first, last);  // the rule's own host loop
                                 } else {
#pragma GCC ivdep
                                   for (std::int64_t i = first; i < last; ++i) local(i);
                                 }
                               });
  } else {
#if TESSERA_CUDA_KERNELS
    if (batched_updates* queue = batched_updates::current()) {
      // An optimiser's step: queued, launched with the step's other updates of this rule type.
      if (n == 0) return;
      auto& typed = static_cast<typed_updates<Update>&>(queue->template queue<Update>(
          device, [&] { return std::make_unique<typed_updates<Update>>(device); }));
      typed.rules.push_back(update);
      typed.sizes.push_back(n);
      return;
    }
    if (n == 0) {
      profiler::count_launch();
      return;
    }
    // One parameter: a list of one (the same kernel as a step's lists: one less per rule type).
    typed_updates<Update> single(device);
    single.rules.push_back(update);
    single.sizes.push_back(n);
    single.launch();
#else
    (void)n;
    (void)update;
    throw error(std::string(optimiser) + ": a parameter is on " + device.str() +
                ", and updating CUDA parameters launches a CUDA kernel, so step() must be called "
                "from a translation unit compiled by nvcc (a .cu file, or "
                "set_source_files_properties(file.cpp PROPERTIES LANGUAGE CUDA))");
#endif
  }
}

/// Square root of the compute type: std:: on the host, CUDA's overloads on the device.
template <class C>
TESSERA_HOST_DEVICE C square_root(C x) {
#if TESSERA_DEVICE_CODE
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

/// NaN-propagating maximum (torch.maximum), usable in kernels.
template <class C>
TESSERA_HOST_DEVICE C maximum(C a, C b) {
  return (a != a || a > b) ? a : b;
}

/// The value an update starts from, in the compute type C: the parameter itself, or with an fp32
/// master (T float, L the 16-bit parameter) the master, unless the 16-bit parameter was written
/// since the last step (it is then not the master's rounding: load_state_dict, a user's copy_),
/// in which case that new value is taken.
template <class C, class T, class L>
TESSERA_HOST_DEVICE C start_value(const T* parameter, const L* low, std::int64_t i) {
  if constexpr (std::is_same_v<L, T>) {
    (void)low;
    return static_cast<C>(parameter[i]);
  } else {
    const T master = parameter[i];
    const L rounded = static_cast<L>(master);
    return static_cast<float>(rounded) == static_cast<float>(low[i]) ? static_cast<C>(master)
                                                                     : static_cast<C>(low[i]);
  }
}

/// Stores an update's result: the parameter (or master), and with a master its 16-bit rounding.
template <class C, class T, class L>
TESSERA_HOST_DEVICE void store_value(T* parameter, L* low, std::int64_t i, C value) {
  parameter[i] = T(value);
  if constexpr (!std::is_same_v<L, T>) low[i] = L(static_cast<float>(parameter[i]));
}

}  // namespace detail

namespace detail {
/// The dense layout of a parameter's memory, in which its gradient and state are read element
/// by element alongside it: contiguous_format, or channels_last for a 4-d parameter made so by
/// Module::to(memory_format) (one dense in both, [O, C, 1, 1], counts as contiguous).
inline memory_format parameter_format(const Shape& shape, const Strides& strides) {
  return !backend::cpu::is_row_major(shape, strides) &&
                 tessera::detail::is_channels_last_contiguous(shape, strides)
             ? memory_format::channels_last
             : memory_format::contiguous_format;
}
/// True when the parameter's memory is dense in one of the two layouts.
inline bool parameter_is_dense(const Shape& shape, const Strides& strides) {
  return backend::cpu::is_row_major(shape, strides) ||
         tessera::detail::is_channels_last_contiguous(shape, strides);
}
/// For state dicts (optimisers and schedulers): a 0-d float64 tensor on cpu:0 holding `value`,
/// and the number under `key` (one element, any dtype, on the CPU; tessera::error naming `who`
/// and the key when it is missing or not one number).
TESSERA_API AnyTensor state_scalar(double value);
TESSERA_API double state_number(const StateDict& state_dict, const std::string& key,
                                const std::string& who);
}  // namespace detail

/// A group of parameters with its own learning rate and/or weight decay (PyTorch's
/// param_groups): what the group leaves unset comes from the optimiser's options(), and follows
/// them when they change.
///
///     ts::optim::SGD sgd({{.params = net.backbone.parameters(), .lr = 0.01},
///                         {.params = net.head.parameters(), .weight_decay = 0}},
///                        {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
struct ParamGroup {
  std::vector<nn::ParameterRef> params{};
  std::optional<double> lr = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
};

/// The base of the optimisers: the parameter list, zero_grad, and the typed dispatch of a step.
class Optimizer {
 public:
  /// Throws std::invalid_argument for an empty list, an empty reference or a parameter listed
  /// twice (it would be updated twice per step), naming the optimiser and the position.
  Optimizer(std::vector<nn::ParameterRef> parameters, std::string name);
  /// Parameter groups: the parameters are the groups' in order (parameter i of the optimiser is
  /// the i-th over all groups). Throws std::invalid_argument, naming the group, for an empty
  /// group or a negative lr or weight_decay, and as above (a parameter in two groups is listed
  /// twice).
  TESSERA_API Optimizer(std::vector<ParamGroup> groups, std::string name);
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;
  TESSERA_API virtual ~Optimizer();

  /// One update of every parameter that has a gradient; the others are skipped (their state,
  /// step count included, stays as it is).
  virtual void step() = 0;

  /// Zeroes every existing gradient, keeping its buffer (nothing is allocated; parameters
  /// without a gradient keep none). As Module::zero_grad, the zeros are written only if a
  /// gradient is read before the next backward writes it.
  void zero_grad();

  const std::vector<nn::ParameterRef>& parameters() const noexcept { return parameters_; }
  const std::string& name() const noexcept { return name_; }

  /// The number of parameter groups (1 when the optimiser was given a plain list).
  std::size_t param_group_count() const noexcept { return groups_.size(); }
  /// The group of parameter i.
  std::size_t group_of(std::size_t i) const { return group_of_.at(i); }

  /// Parameter i's fp32 master copy when it is half or bfloat16 (mixed precision): made from the
  /// parameter at its first step, updated by each step, and rounded into the parameter. Undefined
  /// before the first step and for float and double parameters. A step sees what was written
  /// into the 16-bit parameter in between (an element that is not the master's rounding is taken
  /// from the parameter).
  const AnyTensor& master_weight(std::size_t i) const { return masters_.at(i); }

 protected:
  /// Where the profiler times a step (profiler::range "<name>", phase "step"): the first
  /// parameter's device.
  Device step_device() const {
    for (const nn::ParameterRef& parameter : parameters_) {
      const AnyTensor value = parameter.value();
      if (value.defined()) return value.device();
    }
    return Device{};
  }

  /// Calls fn(value, grad) with parameter i's value and gradient as typed tensors (float,
  /// double, half or bfloat16, on cpu or cuda) dense in the value's layout (contiguous, or
  /// channels_last: detail::parameter_format), or does nothing when it has no gradient. A
  /// gradient laid out otherwise is copied first. Throws, naming the optimiser and the
  /// parameter: dtype_error for an integer parameter or a gradient of another dtype,
  /// device_mismatch_error for a gradient on another device, shape_error for another shape,
  /// tessera::error for a non-contiguous parameter.
  ///
  /// A half or bfloat16 parameter is given as fn(master, grad, parameter): its fp32 master
  /// (made at its first step, moved with the parameter), the 16-bit gradient and the 16-bit
  /// parameter, which the update writes as well (detail::start_value / store_value).
  template <class Fn>
  void with_typed(std::size_t i, Fn&& fn) {
    const nn::ParameterRef& parameter = parameters_[i];
    const AnyTensor grad = parameter.grad();
    if (!grad.defined()) return;
    const AnyTensor value = parameter.value();
    const std::string which = name_ + ": parameter " + std::to_string(i);
    if (!value.defined()) throw error(which + " has a gradient but no value");
    if (grad.dtype() != value.dtype()) {
      throw dtype_error(which + " has dtype " + tessera::name(value.dtype()) +
                        " but its gradient " + tessera::name(grad.dtype()));
    }
    if (grad.device() != value.device()) {
      throw device_mismatch_error(which + " is on " + value.device().str() +
                                  " but its gradient on " + grad.device().str());
    }
    if (grad.shape() != value.shape()) {
      throw shape_error(which + " has shape " + value.shape().str() + " but its gradient " +
                        grad.shape().str());
    }
    if (!detail::parameter_is_dense(value.shape(), value.strides())) {
      throw error(which + " (shape " + value.shape().str() + ", strides " + value.strides().str() +
                  ") is not dense; optimisers update contiguous or channels_last parameters");
    }
    switch (value.dtype()) {
      case ScalarType::float32:
        return typed<float>(value, grad, fn);
      case ScalarType::float64:
        return typed<double>(value, grad, fn);
      case ScalarType::float16:
        return with_master<half>(i, value, grad, fn);
      case ScalarType::bfloat16:
        return with_master<bfloat16>(i, value, grad, fn);
      default:
        throw dtype_error(which + " has dtype " + tessera::name(value.dtype()) +
                          "; optimisers update floating-point parameters only");
    }
  }

  /// `state` (a per-parameter buffer made at the first step) on `value`'s device: moved there
  /// when the module was moved since (Module::to), checked for shape.
  template <Dtype T, DeviceKind K>
  Tensor<T, K> state_like(AnyTensor& state, const Tensor<T, K>& value, const char* what,
                          std::size_t i) const {
    Tensor<T, K> typed = state.as<T, K>();
    if (typed.shape() != value.shape()) {
      throw shape_error(name_ + ": parameter " + std::to_string(i) + " has shape " +
                        value.shape().str() + " but its " + what + " " + typed.shape().str() +
                        " (was the parameter replaced by one of another shape?)");
    }
    if (typed.device() != value.device()) {
      typed = typed.template to<K>(value.device_index());
      state = typed;
    }
    // Read element by element alongside the parameter: laid out as it is (Module::to may have
    // changed the parameter's layout since the state was made).
    const memory_format format = detail::parameter_format(value.shape(), value.strides());
    if (!typed.is_contiguous(format)) {
      typed = typed.contiguous(format);
      state = typed;
    }
    return typed;
  }

  // ---- state_dict helpers: PyTorch's optimizer state_dict flattened into tensor entries,
  // "state.<i>.<buffer>" per parameter and "param_groups.0.<hyperparameter>" (0-d float64), so
  // that ts::save writes it as safetensors.

  static std::string state_key(std::size_t i, const char* buffer) {
    return "state." + std::to_string(i) + "." + buffer;
  }
  static AnyTensor scalar(double value) { return detail::state_scalar(value); }
  double scalar_of(const StateDict& state_dict, const std::string& key) const {
    return detail::state_number(state_dict, key, name_);
  }
  /// Parameter i's buffer `buffer` from `state_dict` (undefined when absent), copied to the
  /// parameter's device; shape_error / dtype_error naming the key when it does not match the
  /// parameter (float32 for a 16-bit parameter, whose state is kept in float).
  TESSERA_API AnyTensor loaded_state(const StateDict& state_dict, std::size_t i,
                                     const char* buffer) const;
  /// The masters as state entries "state.<i>.master_weight" (float32, shared), and back: the
  /// loaded masters (checked like loaded_state), to be assigned with the rest of the state once
  /// everything has been checked.
  TESSERA_API void save_masters(StateDict& out) const;
  TESSERA_API std::vector<AnyTensor> loaded_masters(const StateDict& state_dict) const;
  /// Throws tessera::error naming the first "state.<i>." entry whose i is not a parameter.
  TESSERA_API void check_state_indices(const StateDict& state_dict) const;

  struct group_settings {
    std::optional<double> lr;
    std::optional<double> weight_decay;
  };

  /// `defaults` with group g's learning rate and weight decay where it sets them.
  template <class Options>
  Options options_of_group(std::size_t g, const Options& defaults) const {
    return options_of_group_in(groups_, g, defaults);
  }
  template <class Options>
  static Options options_of_group_in(const std::vector<group_settings>& groups, std::size_t g,
                                     const Options& defaults) {
    Options o = defaults;
    const group_settings& group = groups.at(g);
    if (group.lr) o.lr = *group.lr;
    if (group.weight_decay) o.weight_decay = *group.weight_decay;
    return o;
  }
  /// Sets group g's learning rate: its own when it has one, else `defaults_lr` (options().lr,
  /// which the groups without their own follow).
  void set_lr_of_group(std::size_t g, double lr, double& defaults_lr) {
    group_settings& group = groups_.at(g);
    if (group.lr) {
      group.lr = lr;
    } else {
      defaults_lr = lr;
    }
  }
  /// "param_groups.<g>.params" (int64 parameter indices) for every group, and the check that a
  /// loaded state has the same groups (tessera::error naming the first that differs).
  TESSERA_API void save_groups(StateDict& out) const;
  TESSERA_API void check_groups(const StateDict& state_dict) const;
  TESSERA_API std::string group_key(std::size_t g, const char* hyperparameter) const;
  /// The loaded groups' lr and weight_decay ("param_groups.<g>.lr", ".weight_decay") into
  /// `options` (the defaults) and `groups`: a group with its own value gets the loaded one; the
  /// first group without takes the defaults' from the state, and a later one whose loaded value
  /// differs gets its own. The effective value of every group is the saved one.
  template <class Options>
  void load_group_settings(const StateDict& state_dict, Options& options,
                           std::vector<group_settings>& groups) const;

  std::vector<nn::ParameterRef> parameters_;
  std::string name_;
  std::vector<AnyTensor> masters_;  // fp32 copies of the 16-bit parameters
  std::vector<group_settings> groups_;
  std::vector<std::size_t> group_of_;  // per parameter

 private:
  /// A 16-bit parameter: fn(master, grad, value) with the fp32 master on value's device (made
  /// from the parameter at its first step; remade if the parameter's shape changed, moved if
  /// the parameter was).
  template <Dtype L, class Fn>
  void with_master(std::size_t i, const AnyTensor& value, const AnyTensor& grad, Fn& fn) {
    if (value.device().is_cuda()) {
      typed_master<L, tessera::cuda>(i, value, grad, fn);
    } else {
      typed_master<L, tessera::cpu>(i, value, grad, fn);
    }
  }
  template <Dtype L, DeviceKind K, class Fn>
  void typed_master(std::size_t i, const AnyTensor& value, const AnyTensor& grad, Fn& fn) {
    const memory_format format = detail::parameter_format(value.shape(), value.strides());
    const Tensor<float, K> master = master_of<L, K>(i, value, format);
    if constexpr (std::is_same_v<K, tessera::cuda>) {  // a queued CUDA rule points into it
      fn(master, detail::kept_until_flush(grad.as<L, K>().contiguous(format)), value.as<L, K>());
    } else {
      fn(master, grad.as<L, K>().contiguous(format), value.as<L, K>());
    }
  }
  /// The fp32 master of 16-bit parameter i (`value`), made, moved or laid out as `format` here:
  /// one body per dtype and device kind, whatever the update.
  template <Dtype L, DeviceKind K>
  Tensor<float, K> master_of(std::size_t i, const AnyTensor& value, memory_format format) {
    const Tensor<L, K> low = value.as<L, K>();
    AnyTensor& master = masters_[i];
    if (!master.defined() || master.shape() != value.shape() ||
        master.device().type != value.device().type) {
      master = low.template to<float>().contiguous(format);
    } else if (master.device() != value.device()) {
      master = master.as<float, K>().template to<K>(value.device().index);
    }
    // The master is read element by element alongside the parameter: laid out as it is (a
    // parameter moved to another layout since, by Module::to, moves its master too).
    if (!master.as<float, K>().is_contiguous(format)) {
      master = master.as<float, K>().contiguous(format);
    }
    return master.as<float, K>();
  }

  template <Dtype T, class Fn>
  static void typed(const AnyTensor& value, const AnyTensor& grad, Fn& fn) {
    // The gradient is read element by element alongside the parameter: laid out as it is.
    const memory_format format = detail::parameter_format(value.shape(), value.strides());
    if (value.device().is_cuda()) {
      fn(value.as<T, tessera::cuda>(),
         detail::kept_until_flush(grad.as<T, tessera::cuda>().contiguous(format)));
    } else {
      fn(value.as<T, tessera::cpu>(), grad.as<T, tessera::cpu>().contiguous(format));
    }
  }
};

template <class Options>
void Optimizer::load_group_settings(const StateDict& state_dict, Options& options,
                                    std::vector<group_settings>& groups) const {
  groups = groups_;
  bool lr_taken = false, decay_taken = false;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const double lr = scalar_of(state_dict, group_key(g, "lr"));
    const double decay = scalar_of(state_dict, group_key(g, "weight_decay"));
    if (groups[g].lr || (lr_taken && lr != options.lr)) {
      groups[g].lr = lr;
    } else if (!lr_taken) {
      options.lr = lr;
      lr_taken = true;
    }
    if (groups[g].weight_decay || (decay_taken && decay != options.weight_decay)) {
      groups[g].weight_decay = decay;
    } else if (!decay_taken) {
      options.weight_decay = decay;
      decay_taken = true;
    }
  }
}

#if TESSERA_DEFINITIONS
TESSERA_API Optimizer::Optimizer(std::vector<nn::ParameterRef> parameters, std::string name)
    : parameters_(std::move(parameters)),
      name_(std::move(name)),
      masters_(parameters_.size()),
      groups_(1),
      group_of_(parameters_.size(), 0) {
  if (parameters_.empty()) {
    throw std::invalid_argument(name_ + ": got an empty parameter list");
  }
  std::unordered_set<const void*> seen;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (!parameters_[i].defined()) {
      throw std::invalid_argument(name_ + ": parameter " + std::to_string(i) +
                                  " is an empty reference");
    }
    if (!seen.insert(parameters_[i].id()).second) {
      throw std::invalid_argument(name_ + ": parameter " + std::to_string(i) +
                                  " appears more than once in the list");
    }
  }
}

// Not `= default`: nvcc would make it the key function (config.hpp).
TESSERA_API Optimizer::~Optimizer() {}

namespace detail {
inline std::vector<nn::ParameterRef> concatenated(const std::vector<ParamGroup>& groups) {
  std::vector<nn::ParameterRef> all;
  for (const ParamGroup& group : groups)
    all.insert(all.end(), group.params.begin(), group.params.end());
  return all;
}
}  // namespace detail

TESSERA_API Optimizer::Optimizer(std::vector<ParamGroup> groups, std::string name)
    : Optimizer(detail::concatenated(groups), std::move(name)) {
  groups_.clear();
  group_of_.clear();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const ParamGroup& group = groups[g];
    const std::string which = name_ + ": parameter group " + std::to_string(g);
    if (group.params.empty()) throw std::invalid_argument(which + " has no parameters");
    if (group.lr && !(*group.lr >= 0.0)) {
      throw std::invalid_argument(which + ": invalid learning rate " + std::to_string(*group.lr));
    }
    if (group.weight_decay && !(*group.weight_decay >= 0.0)) {
      throw std::invalid_argument(which + ": invalid weight_decay value " +
                                  std::to_string(*group.weight_decay));
    }
    groups_.push_back({group.lr, group.weight_decay});
    group_of_.insert(group_of_.end(), group.params.size(), g);
  }
}

TESSERA_API std::string Optimizer::group_key(std::size_t g, const char* hyperparameter) const {
  return "param_groups." + std::to_string(g) + "." + hyperparameter;
}

TESSERA_API void Optimizer::save_groups(StateDict& out) const {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    std::vector<std::int64_t> indices;
    for (std::size_t i = 0; i < group_of_.size(); ++i) {
      if (group_of_[i] == g) indices.push_back(static_cast<std::int64_t>(i));
    }
    const auto n = static_cast<std::int64_t>(indices.size());
    out.insert(group_key(g, "params"), from_vector<std::int64_t>(indices, Shape{n}, 0));
  }
}

TESSERA_API void Optimizer::check_groups(const StateDict& state_dict) const {
  std::size_t loaded = 0;  // one more than the highest "param_groups.<g>." index
  for (const std::string& key : state_dict.keys()) {
    if (key.rfind("param_groups.", 0) != 0) continue;
    const std::size_t end = key.find('.', 13);
    const std::string index = key.substr(13, end == std::string::npos ? end : end - 13);
    if (index.empty() || index.size() > 6 ||
        index.find_first_not_of("0123456789") != std::string::npos) {
      throw error(name_ + "::load_state_dict: entry " + key + " names no parameter group");
    }
    loaded = std::max(loaded, static_cast<std::size_t>(std::stoul(index)) + 1);
  }
  if (loaded != groups_.size()) {
    throw error(name_ + "::load_state_dict: the state has " + std::to_string(loaded) +
                " parameter group(s), this " + name_ + " has " + std::to_string(groups_.size()));
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::string key = group_key(g, "params");
    if (!state_dict.contains(key)) {
      if (groups_.size() == 1) continue;  // a state saved before groups: all parameters
      throw error(name_ + "::load_state_dict: no entry " + key);
    }
    const AnyTensor& indices = state_dict.at(key);
    std::vector<std::int64_t> want;
    for (std::size_t i = 0; i < group_of_.size(); ++i) {
      if (group_of_[i] == g) want.push_back(static_cast<std::int64_t>(i));
    }
    bool same = indices.dtype() == ScalarType::int64 && indices.dim() == 1 &&
                indices.device().type == DeviceType::cpu &&
                indices.numel() == static_cast<std::int64_t>(want.size());
    if (same) same = indices.as<std::int64_t>().to_vector() == want;
    if (!same) {
      throw error(name_ + "::load_state_dict: " + key + " (" + indices.shape().str() +
                  ") does not list the parameters of group " + std::to_string(g) + " (" +
                  std::to_string(want.size()) + " parameters, from index " +
                  (want.empty() ? std::string("-") : std::to_string(want.front())) + ")");
    }
  }
}

namespace detail {
TESSERA_API AnyTensor state_scalar(double value) {
  Tensor<double, cpu> t = Tensor<double, cpu>::empty_on(Shape{}, Device{DeviceType::cpu, 0});
  t.fill_(value);
  return t;
}
TESSERA_API double state_number(const StateDict& state_dict, const std::string& key,
                                const std::string& who) {
  if (!state_dict.contains(key)) {
    throw error(who + "::load_state_dict: no entry " + key + " (not a state_dict of " + who + "?)");
  }
  const AnyTensor& t = state_dict.at(key);
  if (t.numel() != 1 || t.device().type != DeviceType::cpu) {
    throw error(who + "::load_state_dict: " + key + " must be one number on the CPU, not " +
                t.shape().str() + " on " + t.device().str());
  }
  double value = 0;
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    value = static_cast<double>(t.as<T, tessera::cpu>().contiguous().data()[0]);
  });
  return value;
}
}  // namespace detail
TESSERA_API AnyTensor Optimizer::loaded_state(const StateDict& state_dict, std::size_t i,
                                              const char* buffer) const {
  const std::string key = state_key(i, buffer);
  if (!state_dict.contains(key)) return {};
  const AnyTensor& loaded = state_dict.at(key);
  const AnyTensor value = parameters_[i].value();
  const bool master = value.dtype() == ScalarType::float16 || value.dtype() == ScalarType::bfloat16;
  const ScalarType want = master ? ScalarType::float32 : value.dtype();
  if (loaded.dtype() != want) {
    throw dtype_error(name_ + "::load_state_dict: " + key + " has dtype " +
                      tessera::name(loaded.dtype()) + ", expected " + tessera::name(want) +
                      " for parameter " + std::to_string(i) + " (" + tessera::name(value.dtype()) +
                      (master ? ", whose state is kept in float32)" : ")"));
  }
  if (loaded.shape() != value.shape()) {
    throw shape_error(name_ + "::load_state_dict: " + key + " has shape " + loaded.shape().str() +
                      ", parameter " + std::to_string(i) + " " + value.shape().str());
  }
  AnyTensor copy = visit_dtype(want, [&](auto tag) -> AnyTensor {  // on the parameter's device
    using T = typename decltype(tag)::type;
    // Laid out as the parameter, alongside which it is read element by element.
    const memory_format format = detail::parameter_format(value.shape(), value.strides());
    if (value.device().is_cuda()) {
      return Tensor<T, cuda>::empty_on(value.shape(), value.device(), format);
    }
    return Tensor<T, cpu>::empty_on(value.shape(), value.device(), format);
  });
  copy.copy_(loaded);
  return copy;
}
TESSERA_API void Optimizer::save_masters(StateDict& out) const {
  for (std::size_t i = 0; i < masters_.size(); ++i) {
    if (masters_[i].defined()) out.insert(state_key(i, "master_weight"), masters_[i]);
  }
}
TESSERA_API std::vector<AnyTensor> Optimizer::loaded_masters(const StateDict& state_dict) const {
  std::vector<AnyTensor> masters(parameters_.size());
  for (std::size_t i = 0; i < masters.size(); ++i) {
    const ScalarType dtype = parameters_[i].value().dtype();
    const bool sixteen_bit = dtype == ScalarType::float16 || dtype == ScalarType::bfloat16;
    if (!sixteen_bit) {
      if (state_dict.contains(state_key(i, "master_weight"))) {
        throw error(name_ + "::load_state_dict: " + state_key(i, "master_weight") +
                    " is for a 16-bit parameter, but parameter " + std::to_string(i) + " is " +
                    tessera::name(dtype));
      }
      continue;
    }
    masters[i] = loaded_state(state_dict, i, "master_weight");
  }
  return masters;
}
TESSERA_API void Optimizer::check_state_indices(const StateDict& state_dict) const {
  for (const std::string& key : state_dict.keys()) {
    if (key.rfind("state.", 0) != 0) continue;
    const std::size_t end = key.find('.', 6);
    const std::string index = key.substr(6, end == std::string::npos ? end : end - 6);
    if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos ||
        std::stoull(index) >= parameters_.size()) {
      throw error(name_ + "::load_state_dict: entry " + key + " names no parameter (this " + name_ +
                  " has " + std::to_string(parameters_.size()) + ")");
    }
  }
}

TESSERA_API void Optimizer::zero_grad() {
  for (const auto& parameter : parameters_) parameter.zero_grad();
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::optim
