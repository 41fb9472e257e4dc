// Module: the registry behind every layer and user model. Parameters, buffers and child modules
// are registered by name; the queries (parameters, named_parameters, state_dict, ...) use
// PyTorch's dotted names ("fc1.weight", Sequential's "0.weight") in PyTorch's order. A Module is
// a handle, like LibTorch's ModuleHolder: its registry lives in shared state, children and
// parameters are registered as shared handles, so copying a model aliases it and nothing can
// dangle. `ts::nn::to<Kind>(module, i)` returns a converted copy on another device (kind).
#pragma once

#include <algorithm>
#include <concepts>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/memory_format.hpp"
#include "tessera/core/promotion.hpp"
#include "tessera/nn/buffer.hpp"
#include "tessera/nn/parameter.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/state_dict.hpp"

namespace tessera::nn {

namespace detail {

/// What a Module handle points at; shared by every copy of the handle and by parent modules.
struct module_state {
  std::string type_name;
  bool training = true;
  std::vector<std::pair<std::string, ParameterRef>> parameters;
  std::vector<std::pair<std::string, BufferRef>> buffers;
  std::vector<std::pair<std::string, std::shared_ptr<module_state>>> children;
};

TESSERA_API bool has_descendant(const module_state& root, const module_state* target);

inline std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

/// Own parameters first, then each child's, depth first (PyTorch's named_parameters order).
template <class Fn>
void walk_parameters(const module_state& state, const std::string& prefix, bool recurse, Fn& fn) {
  for (const auto& [name, parameter] : state.parameters) fn(join(prefix, name), parameter);
  if (!recurse) return;
  for (const auto& [name, child] : state.children) {
    walk_parameters(*child, join(prefix, name), recurse, fn);
  }
}

template <class Fn>
void walk_buffers(const module_state& state, const std::string& prefix, bool recurse, Fn& fn) {
  for (const auto& [name, buffer] : state.buffers) fn(join(prefix, name), buffer);
  if (!recurse) return;
  for (const auto& [name, child] : state.children) {
    walk_buffers(*child, join(prefix, name), recurse, fn);
  }
}

/// PyTorch's state_dict order: a module's parameters, then its buffers, then its children.
/// Undefined tensors (a parameter registered empty) are left out, as PyTorch leaves out None.
template <class Fn>
void walk_state(const module_state& state, const std::string& prefix, Fn& fn) {
  for (const auto& [name, parameter] : state.parameters) {
    if (AnyTensor value = parameter.value(); value.defined()) fn(join(prefix, name), value);
  }
  for (const auto& [name, buffer] : state.buffers) {
    if (AnyTensor value = buffer.value(); value.defined()) fn(join(prefix, name), value);
  }
  for (const auto& [name, child] : state.children) walk_state(*child, join(prefix, name), fn);
}

inline int& skip_initialization_depth() {
  thread_local int depth = 0;
  return depth;
}

/// While one lives, layers allocate their parameters without drawing initial values (the
/// conversions below overwrite them at once): no wasted pass, and no random numbers consumed.
struct skip_initialization {
  skip_initialization() { ++skip_initialization_depth(); }
  ~skip_initialization() { --skip_initialization_depth(); }
  skip_initialization(const skip_initialization&) = delete;
  skip_initialization& operator=(const skip_initialization&) = delete;
};

inline bool initialization_skipped() { return skip_initialization_depth() > 0; }

inline const std::string& data_parallel_prefix() {
  static const std::string prefix = "module.";
  return prefix;
}
inline bool has_data_parallel_prefix(const std::string& key) {
  return key.compare(0, data_parallel_prefix().size(), data_parallel_prefix()) == 0;
}

inline std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "\"" : ", \"") + key + "\"";
  return out;
}

#if TESSERA_DEFINITIONS
TESSERA_API bool has_descendant(const module_state& root, const module_state* target) {
  for (const auto& child : root.children) {
    if (child.second.get() == target || has_descendant(*child.second, target)) return true;
  }
  return false;
}
#endif  // TESSERA_DEFINITIONS

}  // namespace detail

/// The base of every layer and model. Derive from it, give the members to `register_module`,
/// `register_parameter` or `register_buffer` in the constructor, and write a templated
/// `forward`:
///
///     template <class K = ts::cpu>
///     struct Net : ts::nn::Module {
///       ts::nn::Linear<float, K> fc1{784, 128}, fc2{128, 10};
///       Net() { register_module("fc1", fc1); register_module("fc2", fc2); }
///       template <class X> auto forward(const X& x) const { return fc2(ts::relu(fc1(x))); }
///     };
///
/// Modules are handles (as LibTorch's): copying one aliases it (same parameters, same training
/// flag), which is safe because the registry holds shared handles, never member addresses.
/// There is no assignment: a registered member cannot be re-pointed behind the registry's back.
/// For an independent copy on another device use `ts::nn::to<Kind>(module, i)`.
class Module {
 public:
  /// `type_name` is what messages call the module (e.g. "Linear"); user models may pass theirs.
  TESSERA_API explicit Module(std::string type_name = "Module");
  Module(const Module&) = default;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  // ---- registration ------------------------------------------------------------------------

  /// Registers `module` as the child `name` (its keys get the prefix "name."); returns it.
  /// Throws tessera::error when the name is empty, contains '.', is taken in this module, or
  /// when the child is this module or contains it.
  template <class M>
  requires std::derived_from<M, Module> M& register_module(const std::string& name, M& module) {
    add_child(name, module);
    return module;
  }

  /// Registers `parameter` under `name` (shared, not copied); returns it. Errors as
  /// register_module.
  template <Dtype T, DeviceKind K>
  Parameter<T, K>& register_parameter(const std::string& name, Parameter<T, K>& parameter) {
    add_parameter(name, ParameterRef(parameter));
    return parameter;
  }
  /// Registers a new parameter holding `value` and returns its handle.
  template <Dtype T, DeviceKind K>
  Parameter<T, K> register_parameter(const std::string& name, Tensor<T, K> value,
                                     bool requires_grad = true) {
    Parameter<T, K> parameter(std::move(value), requires_grad);
    register_parameter(name, parameter);
    return parameter;
  }

  /// Registers `buffer` under `name` (shared); returns it. Errors as register_module.
  template <Dtype T, DeviceKind K>
  Buffer<T, K>& register_buffer(const std::string& name, Buffer<T, K>& buffer) {
    add_buffer(name, BufferRef(buffer));
    return buffer;
  }
  /// Registers a new buffer holding `value` and returns its handle.
  template <Dtype T, DeviceKind K>
  Buffer<T, K> register_buffer(const std::string& name, Tensor<T, K> value) {
    Buffer<T, K> buffer(std::move(value));
    register_buffer(name, buffer);
    return buffer;
  }

  // ---- queries -----------------------------------------------------------------------------

  /// {dotted name, parameter} in PyTorch's order (a module's own, then each child's, in
  /// registration order). A parameter reachable twice (shared between children) is listed once,
  /// under its first name; parameters without a value are left out.
  std::vector<std::pair<std::string, ParameterRef>> named_parameters(bool recurse = true) const;

  /// The parameters of named_parameters, for the optimisers.
  std::vector<ParameterRef> parameters(bool recurse = true) const;

  /// {dotted name, buffer}, in the order of named_parameters, each buffer once.
  std::vector<std::pair<std::string, BufferRef>> named_buffers(bool recurse = true) const;

  std::vector<BufferRef> buffers(bool recurse = true) const;

  /// The direct children as Module handles (aliasing them), in registration order.
  std::vector<std::pair<std::string, Module>> named_children() const;
  std::vector<Module> children() const;

  /// This module (name "") and every descendant, depth first, each once.
  std::vector<std::pair<std::string, Module>> named_modules() const;

  /// Parameters and buffers by PyTorch's key names (for BatchNorm1d: weight, bias,
  /// running_mean, running_var, num_batches_tracked), sharing storage with the module.
  /// Shared tensors appear under every name they are reachable by, as in PyTorch.
  StateDict state_dict() const;

  /// Copies the values of `state_dict` into the module's tensors, in place (parameters keep
  /// their identity and device; the dict's tensors may be on any device). Keys saved from a
  /// data-parallel wrapper ("module.fc1.weight") load into the plain module, and plain keys load
  /// into a module whose own keys carry that prefix.
  ///
  /// Throws before copying anything (so the module is unchanged) when a key's shape or dtype
  /// differs (naming the key and both shapes or dtypes), or, when `strict`, when keys are
  /// missing or unexpected (listing every one): shape_error or dtype_error when only those
  /// mismatches are wrong, tessera::error otherwise.
  void load_state_dict(const StateDict& state_dict, bool strict = true);

  // ---- placement and modes -----------------------------------------------------------------

  /// Moves every parameter (with its gradient) and buffer to ordinal `index` of its own device
  /// kind, in place: the parameters keep their identity (optimisers and programs built before
  /// see the moved values). All copies are made before any is installed, so on an error
  /// (device_error for an ordinal that does not exist, out_of_memory_error) nothing has moved.
  Module& to(int index);

  /// PyTorch's `model.to(memory_format=...)`: every 4-d parameter (with its gradient) and buffer
  /// laid out in `format` in place (channels_last: conv weights NHWC), the rest (and anything
  /// under preserve_format) as they are; parameters keep their identity. All copies are made
  /// first: on an error (out_of_memory_error) nothing has changed. Convert before compiling.
  Module& to(memory_format format);

  /// Sets training mode (`on`) or evaluation mode on this module and every descendant.
  Module& train(bool on = true) {
    set_training(*state_, on);
    return *this;
  }
  /// train(false): Dropout passes its input through, BatchNorm uses its running statistics.
  Module& eval() { return train(false); }
  bool is_training() const noexcept { return state_->training; }

  /// Zeroes every existing gradient, keeping its buffer (nothing allocated); parameters without
  /// a gradient are left without one. Buffers are not touched. The zeros are not written now:
  /// the next backward writes each gradient instead of adding it, and reading a gradient before
  /// that writes its zeros (Parameter::zero_grad).
  void zero_grad();

  const std::string& type_name() const noexcept { return state_->type_name; }
  /// True when both handles are the same module.
  bool is_same(const Module& other) const noexcept { return state_ == other.state_; }

 private:
  explicit Module(std::shared_ptr<detail::module_state> state) : state_(std::move(state)) {}

  void check_new_name(const std::string& name, const char* operation) const;
  // What the register_* templates do, out of their templates (compiled once in compiled mode).
  TESSERA_API void add_child(const std::string& name, const Module& child);
  TESSERA_API void add_parameter(const std::string& name, ParameterRef parameter);
  TESSERA_API void add_buffer(const std::string& name, BufferRef buffer);

  static void set_training(detail::module_state& state, bool on);

  static void collect_modules(const std::shared_ptr<detail::module_state>& state,
                              const std::string& prefix,
                              std::unordered_set<const detail::module_state*>& seen,
                              std::vector<std::pair<std::string, Module>>& out);

  std::shared_ptr<detail::module_state> state_;
};

#if TESSERA_DEFINITIONS
TESSERA_API std::vector<std::pair<std::string, ParameterRef>> Module::named_parameters(
    bool recurse) const {
  std::vector<std::pair<std::string, ParameterRef>> out;
  std::unordered_set<const void*> seen;
  auto collect = [&](const std::string& name, const ParameterRef& parameter) {
    if (parameter.value().defined() && seen.insert(parameter.id()).second) {
      out.emplace_back(name, parameter);
    }
  };
  detail::walk_parameters(*state_, "", recurse, collect);
  return out;
}

TESSERA_API std::vector<ParameterRef> Module::parameters(bool recurse) const {
  std::vector<ParameterRef> out;
  for (auto& item : named_parameters(recurse)) out.push_back(std::move(item.second));
  return out;
}

TESSERA_API std::vector<std::pair<std::string, BufferRef>> Module::named_buffers(
    bool recurse) const {
  std::vector<std::pair<std::string, BufferRef>> out;
  std::unordered_set<const void*> seen;
  auto collect = [&](const std::string& name, const BufferRef& buffer) {
    if (buffer.value().defined() && seen.insert(buffer.id()).second) {
      out.emplace_back(name, buffer);
    }
  };
  detail::walk_buffers(*state_, "", recurse, collect);
  return out;
}

TESSERA_API std::vector<BufferRef> Module::buffers(bool recurse) const {
  std::vector<BufferRef> out;
  for (auto& item : named_buffers(recurse)) out.push_back(std::move(item.second));
  return out;
}

TESSERA_API std::vector<std::pair<std::string, Module>> Module::named_children() const {
  std::vector<std::pair<std::string, Module>> out;
  for (const auto& [name, child] : state_->children) out.emplace_back(name, Module(child));
  return out;
}

TESSERA_API std::vector<Module> Module::children() const {
  std::vector<Module> out;
  for (const auto& child : state_->children) out.push_back(Module(child.second));
  return out;
}

TESSERA_API std::vector<std::pair<std::string, Module>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module>> out;
  std::unordered_set<const detail::module_state*> seen;
  collect_modules(state_, "", seen, out);
  return out;
}

TESSERA_API StateDict Module::state_dict() const {
  StateDict out;
  auto collect = [&](const std::string& key, const AnyTensor& value) { out.insert(key, value); };
  detail::walk_state(*state_, "", collect);
  return out;
}

TESSERA_API void Module::load_state_dict(const StateDict& state_dict, bool strict) {
  std::vector<std::pair<std::string, AnyTensor>> own;
  auto collect = [&](const std::string& key, const AnyTensor& value) {
    own.emplace_back(key, value);
  };
  detail::walk_state(*state_, "", collect);
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < own.size(); ++i) index.emplace(own[i].first, i);

  // Which side carries the data-parallel prefix, if only one does.
  auto all_prefixed = [](const auto& items) {
    return !items.empty() && std::all_of(items.begin(), items.end(), [](const auto& item) {
      return detail::has_data_parallel_prefix(item.first);
    });
  };
  auto none_prefixed = [](const auto& items) {
    return std::none_of(items.begin(), items.end(), [](const auto& item) {
      return detail::has_data_parallel_prefix(item.first);
    });
  };
  enum class prefix_mode { none, strip, add };
  prefix_mode mode = prefix_mode::none;
  if (all_prefixed(state_dict) && none_prefixed(own)) {
    mode = prefix_mode::strip;
  } else if (all_prefixed(own) && none_prefixed(state_dict) && !state_dict.empty()) {
    mode = prefix_mode::add;
  }
  auto own_key = [&](const std::string& key) {
    switch (mode) {
      case prefix_mode::strip:
        return key.substr(detail::data_parallel_prefix().size());
      case prefix_mode::add:
        return detail::data_parallel_prefix() + key;
      case prefix_mode::none:
        break;
    }
    return key;
  };

  std::vector<std::string> missing, unexpected, shape_mismatches, dtype_mismatches;
  std::vector<bool> found(own.size(), false);
  std::vector<std::pair<std::size_t, const AnyTensor*>> copies;
  for (const auto& [key, tensor] : state_dict) {
    const std::string mine = own_key(key);
    const auto it = index.find(mine);
    if (it == index.end()) {
      unexpected.push_back(key);
      continue;
    }
    found[it->second] = true;
    const AnyTensor& target = own[it->second].second;
    if (!tensor.defined()) {
      shape_mismatches.push_back("the state dict's tensor for " + mine + " is undefined");
    } else if (tensor.shape() != target.shape()) {
      shape_mismatches.push_back("size mismatch for " + mine + ": shape " + tensor.shape().str() +
                                 " in the state dict, " + target.shape().str() + " in the module");
    } else if (tensor.dtype() != target.dtype()) {
      dtype_mismatches.push_back("dtype mismatch for " + mine + ": " + name(tensor.dtype()) +
                                 " in the state dict, " + name(target.dtype()) + " in the module");
    } else {
      copies.emplace_back(it->second, &tensor);
    }
  }
  for (std::size_t i = 0; i < own.size(); ++i) {
    if (!found[i]) missing.push_back(own[i].first);
  }

  const bool key_problems = strict && (!missing.empty() || !unexpected.empty());
  if (key_problems || !shape_mismatches.empty() || !dtype_mismatches.empty()) {
    std::string message =
        "load_state_dict: error(s) in loading a state dict into " + state_->type_name + ":";
    if (strict && !missing.empty()) {
      message += "\n  missing key(s): " + detail::quoted_list(missing);
    }
    if (strict && !unexpected.empty()) {
      message += "\n  unexpected key(s): " + detail::quoted_list(unexpected);
    }
    for (const auto& line : shape_mismatches) message += "\n  " + line;
    for (const auto& line : dtype_mismatches) message += "\n  " + line;
    if (!key_problems && dtype_mismatches.empty()) throw shape_error(message);
    if (!key_problems && shape_mismatches.empty()) throw dtype_error(message);
    throw error(message);
  }
  for (const auto& [i, source] : copies) own[i].second.copy_(*source);
}

TESSERA_API Module& Module::to(int index) {
  std::vector<std::pair<ParameterRef, std::pair<AnyTensor, AnyTensor>>> parameters;
  for (const auto& [name, parameter] : named_parameters()) {
    const AnyTensor value = parameter.value();
    const AnyTensor grad = parameter.grad();
    const Device target{value.device().type, index};
    parameters.push_back(
        {parameter, {value.to(target), grad.defined() ? grad.to(target) : AnyTensor()}});
  }
  std::vector<std::pair<BufferRef, AnyTensor>> buffers;
  for (const auto& [name, buffer] : named_buffers()) {
    const AnyTensor value = buffer.value();
    buffers.push_back({buffer, value.to(Device{value.device().type, index})});
  }
  for (const auto& [parameter, moved] : parameters) {
    parameter.set_value(moved.first);
    parameter.set_grad(moved.second);
  }
  for (const auto& [buffer, moved] : buffers) buffer.set_value(moved);
  return *this;
}

TESSERA_API Module& Module::to(memory_format format) {
  if (format == memory_format::preserve_format) return *this;
  auto converted = [format](const AnyTensor& value) {
    if (!value.defined() || value.shape().size() != 4) return value;
    return value.visit([format](const auto& t) -> AnyTensor { return t.contiguous(format); });
  };
  std::vector<std::pair<ParameterRef, std::pair<AnyTensor, AnyTensor>>> parameters;
  for (const auto& [name, parameter] : named_parameters()) {
    parameters.push_back(
        {parameter, {converted(parameter.value()), converted(parameter.grad())}});
  }
  std::vector<std::pair<BufferRef, AnyTensor>> buffers;
  for (const auto& [name, buffer] : named_buffers()) {
    buffers.push_back({buffer, converted(buffer.value())});
  }
  for (const auto& [parameter, moved] : parameters) {
    parameter.set_value(moved.first);
    if (moved.second.defined()) parameter.set_grad(moved.second);
  }
  for (const auto& [buffer, moved] : buffers) buffer.set_value(moved);
  return *this;
}

TESSERA_API void Module::zero_grad() {
  for (const ParameterRef& parameter : parameters()) parameter.zero_grad();
}

TESSERA_API Module::Module(std::string type_name)
    : state_(std::make_shared<detail::module_state>()) {
  state_->type_name = std::move(type_name);
}

TESSERA_API void Module::add_child(const std::string& name, const Module& child) {
  check_new_name(name, "register_module");
  if (child.state_ == state_ || detail::has_descendant(*child.state_, state_.get())) {
    throw error("register_module: registering '" + name + "' in " + state_->type_name +
                " would make the module its own descendant");
  }
  state_->children.emplace_back(name, child.state_);
}
TESSERA_API void Module::add_parameter(const std::string& name, ParameterRef parameter) {
  check_new_name(name, "register_parameter");
  state_->parameters.emplace_back(name, std::move(parameter));
}
TESSERA_API void Module::add_buffer(const std::string& name, BufferRef buffer) {
  check_new_name(name, "register_buffer");
  state_->buffers.emplace_back(name, std::move(buffer));
}

TESSERA_API void Module::check_new_name(const std::string& name, const char* operation) const {
  if (name.empty()) {
    throw error(std::string(operation) + ": the name is empty (in " + state_->type_name + ")");
  }
  if (name.find('.') != std::string::npos) {
    throw error(std::string(operation) + ": the name '" + name + "' contains '.' (in " +
                state_->type_name + ")");
  }
  auto taken = [&](const auto& items) {
    return std::any_of(items.begin(), items.end(),
                       [&](const auto& item) { return item.first == name; });
  };
  if (taken(state_->parameters) || taken(state_->buffers) || taken(state_->children)) {
    throw error(std::string(operation) + ": '" + name + "' is already registered in " +
                state_->type_name);
  }
}

TESSERA_API void Module::set_training(detail::module_state& state, bool on) {
  state.training = on;
  for (auto& child : state.children) set_training(*child.second, on);
}

TESSERA_API void Module::collect_modules(const std::shared_ptr<detail::module_state>& state,
                                         const std::string& prefix,
                                         std::unordered_set<const detail::module_state*>& seen,
                                         std::vector<std::pair<std::string, Module>>& out) {
  if (!seen.insert(state.get()).second) return;
  out.emplace_back(prefix, Module(state));
  for (const auto& [name, child] : state->children) {
    collect_modules(child, detail::join(prefix, name), seen, out);
  }
}
#endif  // TESSERA_DEFINITIONS

// ---- conversion to another device kind ------------------------------------------------------

/// The module type M on device kind K2: `Linear<T, K>` -> `Linear<T, K2>`, `Net<K>` -> `Net<K2>`
/// (a template whose last argument is the kind); types without a kind (ReLU) stay as they are.
/// Specialise it for other shapes of module templates.
template <class M, class K2>
struct rebind_kind {
  using type = M;
};
template <template <DeviceKind> class M, DeviceKind K, DeviceKind K2>
struct rebind_kind<M<K>, K2> {
  using type = M<K2>;
};
template <template <Dtype, DeviceKind> class M, Dtype T, DeviceKind K, DeviceKind K2>
struct rebind_kind<M<T, K>, K2> {
  using type = M<T, K2>;
};
template <class M, class K2>
using rebind_kind_t = typename rebind_kind<M, K2>::type;

namespace detail {

/// True when every parameter and buffer of `module` is on `device`.
TESSERA_API bool all_on(const Module& module, Device device);
#if TESSERA_DEFINITIONS
TESSERA_API bool all_on(const Module& module, Device device) {
  for (const auto& [key, value] : module.state_dict()) {
    if (value.device() != device) return false;
  }
  return true;
}
#endif

/// Throws device_error naming the first parameter or buffer of `moved` (nn::to's result) that is
/// not on `device`: a model whose layers choose their own kind or ordinal (a class that is not a
/// template over the kind, `nn::Linear<float> fc{4, 2}` in a plain struct) cannot be moved by
/// making it again, and must not come back half moved.
TESSERA_API void check_moved(const Module& moved, Device device);
#if TESSERA_DEFINITIONS
TESSERA_API void check_moved(const Module& moved, Device device) {
  for (const auto& [key, value] : moved.state_dict()) {
    if (!value.defined() || value.device() == device) continue;
    throw device_error(
        "nn::to: the model was made again for " + device.str() + " but its '" + key +
        "' is on " + value.device().str() +
        ": its layers choose their own device kind or ordinal (a model class that is not a "
        "template over the kind, e.g. a member nn::Linear<float> in a plain struct, or a layer "
        "made on a fixed ordinal). Make the model a template, template <ts::DeviceKind K> struct "
        "Net, with layers of kind K on the current ordinal, or give it a member "
        "template <ts::DeviceKind K2> Net<K2> copy_to(ts::Device) const");
  }
}
#endif

/// Sets each module of `target` (same structure as `source`) to the training mode of its
/// counterpart. train() is recursive, so setting the flags parents first leaves each its own.
TESSERA_API void copy_training_modes(const Module& source, Module& target);
#if TESSERA_DEFINITIONS
TESSERA_API void copy_training_modes(const Module& source, Module& target) {
  std::unordered_map<std::string, Module> target_modules;
  for (auto& [name, module] : target.named_modules()) target_modules.emplace(name, module);
  for (const auto& [name, module] : source.named_modules()) {
    if (auto it = target_modules.find(name); it != target_modules.end()) {
      it->second.train(module.is_training());
    }
  }
}
#endif

/// Gives `target` (same structure as `source`, on any device) source's values, buffers,
/// requires_grad flags and training modes. Gradients are not copied.
TESSERA_API void copy_module_state(const Module& source, Module& target);
/// The same with `values` (source's state, converted) loaded instead of source's own.
TESSERA_API void copy_module_state(const Module& source, const StateDict& values, Module& target);
#if TESSERA_DEFINITIONS
TESSERA_API void copy_module_state(const Module& source, Module& target) {
  copy_module_state(source, source.state_dict(), target);
}
TESSERA_API void copy_module_state(const Module& source, const StateDict& values, Module& target) {
  target.load_state_dict(values, true);
  std::unordered_map<std::string, ParameterRef> target_parameters;
  for (auto& [name, parameter] : target.named_parameters()) target_parameters[name] = parameter;
  for (const auto& [name, parameter] : source.named_parameters()) {
    if (auto it = target_parameters.find(name); it != target_parameters.end()) {
      it->second.requires_grad_(parameter.requires_grad());
    }
  }
  copy_training_modes(source, target);
}
#endif

/// `make()` called with `device` current for kind K and initialisation skipped (the values are
/// filled in next).
template <DeviceKind K, class Make>
auto made_on(Device device, Make&& make) {
  DeviceGuard<K> guard(device.index);
  skip_initialization skip;
  return make();
}

/// made_on<K2>(device, make), filled with `source`'s state.
template <DeviceKind K2, class Make>
auto converted(const Module& source, Device device, Make&& make) {
  auto target = made_on<K2>(device, make);
  copy_module_state(source, target);
  return target;
}

/// An independent copy of `module` on `device` (of kind K2): the module's member
/// `copy_to<K2>(device)` when it has one (layers whose constructor needs arguments), otherwise
/// its type for K2 default-constructed and filled. Layers without a kind are copied as they are.
template <DeviceKind K2, class M>
rebind_kind_t<M, K2> copy_to(const M& module, Device device) {
  using Target = rebind_kind_t<M, K2>;
  if constexpr (!std::derived_from<M, Module>) {
    return module;
  } else if constexpr (requires {
                         { module.template copy_to<K2>(device) } -> std::same_as<Target>;
                       }) {
    return module.template copy_to<K2>(device);
  } else {
    static_assert(!std::is_same_v<M, Module>,
                  "ts::nn::to<Kind>(module): a plain Module handle does not know its model's "
                  "type; pass the model itself");
    static_assert(std::is_default_constructible_v<Target>,
                  "ts::nn::to<Kind>(module): the model type on the new kind has no default "
                  "constructor; give it one (e.g. default arguments) or a member "
                  "'template <ts::DeviceKind K2> Model<K2> copy_to(ts::Device device) const'");
    return converted<K2>(module, device, [] { return Target(); });
  }
}

/// The device of `module`'s first parameter or buffer (the current CPU device when it has none).
TESSERA_API Device module_device(const Module& module);
#if TESSERA_DEFINITIONS
TESSERA_API Device module_device(const Module& module) {
  for (const auto& [key, value] : module.state_dict()) {
    if (value.defined()) return value.device();
  }
  return resolve_device<cpu>(-1);
}
#endif

/// made_on<K>(device, make), filled with `source`'s state converted to the new module's dtypes
/// (entries that keep theirs are copied).
template <DeviceKind K, class Make>
auto converted_as(const Module& source, Device device, Make&& make) {
  auto target = made_on<K>(device, make);
  const StateDict wanted = target.state_dict();
  StateDict values;
  for (const auto& entry : source.state_dict()) {
    // Named, not a structured binding: clang before 16 cannot capture bindings in a lambda.
    const std::string& key = entry.first;
    const AnyTensor& value = entry.second;
    if (!wanted.contains(key) || !value.defined() || wanted.at(key).dtype() == value.dtype()) {
      values.insert(key, value);
      continue;
    }
    // A floating-point value to the target's floating dtype (AnyTensor::visit gives its typed
    // tensor); anything else stays as it is, and load_state_dict names the mismatch.
    values.insert(
        key, visit_dtype(wanted.at(key).dtype(), [&](auto tag) -> AnyTensor {
          using U = typename decltype(tag)::type;
          if constexpr (is_floating_point_v<U>) {
            if (is_floating_point(value.dtype())) {
              return value.visit([](const auto& t) -> AnyTensor { return t.template to<U>(); });
            }
          }
          return value;
        }));
  }
  copy_module_state(source, values, target);
  return target;
}

}  // namespace detail

/// Modules that keep their dtype when a model is converted with `nn::to<Dtype>` (mixed
/// precision): BatchNorm1d/2d stay in float, taking the model's dtype at their input and giving
/// it back at their output (the casts are part of the expressions around them). Specialise it
/// as std::true_type for a module of yours.
template <class M>
struct keeps_dtype : std::false_type {};

/// The module type M with dtype U: `Linear<T, K>` -> `Linear<U, K>`, `Net<T, K>` -> `Net<U, K>`
/// (a template whose arguments are the dtype and the kind); unchanged for modules without a
/// dtype (ReLU), with an integer one, or that keep theirs (keeps_dtype). Specialise it for other
/// shapes of module templates.
template <class M, class U>
struct rebind_dtype {
  using type = M;
};
template <template <Dtype, DeviceKind> class M, Dtype T, DeviceKind K, Dtype U>
struct rebind_dtype<M<T, K>, U> {
  using type =
      std::conditional_t<keeps_dtype<M<T, K>>::value || !is_floating_point_v<T>, M<T, K>, M<U, K>>;
};
template <class M, class U>
using rebind_dtype_t = typename rebind_dtype<M, U>::type;

/// `module` on ordinal `index` (-1: the current one) of device kind K2, as its type for K2
/// (`rebind_kind_t<M, K2>`): PyTorch's `model.to(device)` for another kind, or a replica on
/// another ordinal. When K2 is M's kind and every tensor is already there, returns a handle to
/// the same module (as Tensor::to does); otherwise an independent module holding copies of the
/// values, buffers, requires_grad flags and training modes (not the gradients).
///
/// Layers whose constructor takes arguments (Linear, BatchNorm1d, Sequential) have a member
/// `copy_to<K2>(device)` that this uses; a user model `template <class K> struct Net` is
/// default-constructed with the target ordinal current and initialisation skipped, then
/// filled. Layers without a kind (ReLU, Flatten) are returned as they are. The layers also offer
/// this as a member, `layer.to<K2>(index)`. Throws device_error for an ordinal that does not
/// exist.
template <DeviceKind K2, class M>
rebind_kind_t<M, K2> to(const M& module, int index = -1) {
  if constexpr (!std::derived_from<M, Module>) {
    return module;
  } else {
    const Device device = resolve_device<K2>(index);
    if constexpr (std::is_same_v<rebind_kind_t<M, K2>, M>) {
      if (detail::all_on(module, device)) return module;
    }
    auto moved = detail::copy_to<K2>(module, device);
    detail::check_moved(moved, device);
    return moved;
  }
}

/// `module` with its floating-point parameters and buffers in dtype U (PyTorch's
/// `model.half()`, `model.to(torch.bfloat16)`), as its type for U (`rebind_dtype_t<M, U>`): an
/// independent module on the same devices holding the converted values (rounded to nearest
/// even), the requires_grad flags and the training modes. Modules that keep their dtype
/// (keeps_dtype: BatchNorm) are copied as they are, and convert at their boundary. Train the
/// result with an optimiser, which keeps fp32 master weights of 16-bit parameters, and a
/// GradScaler (README, "Mixed precision").
///
/// Layers (Linear, Conv2d, BatchNorm, Sequential) have a member `copy_as<U>()` that this uses,
/// and offer it as `layer.to<U>()`; a user model `template <class T, class K> struct Net` is
/// default-constructed on its device with initialisation skipped, then filled.
template <Dtype U, class M>
rebind_dtype_t<M, U> to(const M& module) {
  static_assert(is_floating_point_v<U>,
                "ts::nn::to<Dtype>(module): convert a model to a floating-point dtype");
  using Target = rebind_dtype_t<M, U>;
  if constexpr (!std::derived_from<M, Module>) {
    return module;
  } else if constexpr (requires {
                         { module.template copy_as<U>() } -> std::same_as<Target>;
                       }) {
    return module.template copy_as<U>();
  } else {
    static_assert(!std::is_same_v<M, Module>,
                  "ts::nn::to<Dtype>(module): a plain Module handle does not know its model's "
                  "type; pass the model itself");
    static_assert(!std::is_same_v<Target, M> || keeps_dtype<M>::value,
                  "ts::nn::to<Dtype>(module): the model's type has no dtype to change; make it "
                  "'template <class T, class K> struct Net' (or specialise nn::keeps_dtype)");
    static_assert(std::is_default_constructible_v<Target>,
                  "ts::nn::to<Dtype>(module): the model type for the new dtype has no default "
                  "constructor; give it one or a member 'template <ts::Dtype U> Net<U, K> "
                  "copy_as() const'");
    const Device device = detail::module_device(module);
    if (device.is_cuda()) {
      return detail::converted_as<cuda>(module, device, [] { return Target(); });
    }
    return detail::converted_as<cpu>(module, device, [] { return Target(); });
  }
}

}  // namespace tessera::nn
