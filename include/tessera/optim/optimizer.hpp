// Optimizer: what SGD, Adam and AdamW share. It holds the parameters as nn::ParameterRef (so
// `module.to(i)` and `load_state_dict`, which replace or overwrite values in the shared slots,
// are seen at the next step), dispatches each one to its dtype and device kind at run time, and
// runs each parameter's update as one fused elementwise pass (a threaded CPU loop, or a
// grid-stride CUDA kernel in nvcc-compiled units) that writes the parameter and its state.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tessera/backend/cpu/executor.hpp"
#include "tessera/backend/cpu/parallel.hpp"
#include "tessera/backend/evaluator.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/nn/parameter.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/state_dict.hpp"
#if TESSERA_CUDA_KERNELS
#include "tessera/backend/cuda/executor.cuh"
#endif

namespace tessera::optim {

namespace detail {

#if TESSERA_CUDA_KERNELS
template <class Update>
__global__ void __launch_bounds__(backend::cuda::threads_per_block)
    update_kernel(std::int64_t n, Update update) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    update(i);
  }
}
#endif

/// Runs update(i) for every i in [0, n) on `device`, as one pass (one counted launch): a
/// threaded loop on the CPU, a grid-stride kernel on CUDA. The update reads and writes
/// contiguous arrays through raw pointers, so a pass writes every output of the rule at once.
/// A CUDA parameter in a unit not compiled by nvcc throws tessera::error saying so.
template <DeviceKind K, class Update>
void for_each_element(const char* optimiser, Device device, std::int64_t n, const Update& update) {
  (void)optimiser;  // named only in the error of a unit not compiled by nvcc
  if constexpr (std::is_same_v<K, cpu>) {
    profiler::count_launch();
    backend::cpu::parallel_for(0, n, backend::cpu::grain_size,
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
    profiler::count_launch();
    if (n == 0) return;
    DeviceGuard<tessera::cuda> guard(device.index);
    update_kernel<<<backend::cuda::grid_for(n), backend::cuda::threads_per_block, 0,
                    tessera::detail::current_cuda_stream().native()>>>(n, update);
    TESSERA_CUDA_CHECK(cudaGetLastError());
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

}  // namespace detail

namespace detail {
/// For state dicts (optimisers and schedulers): a 0-d float64 tensor on cpu:0 holding `value`,
/// and the number under `key` (one element, any dtype, on the CPU; tessera::error naming `who`
/// and the key when it is missing or not one number).
TESSERA_API AnyTensor state_scalar(double value);
TESSERA_API double state_number(const StateDict& state_dict, const std::string& key,
                                const std::string& who);
}  // namespace detail

/// The base of the optimisers: the parameter list, zero_grad, and the typed dispatch of a step.
class Optimizer {
 public:
  /// Throws std::invalid_argument for an empty list, an empty reference or a parameter listed
  /// twice (it would be updated twice per step), naming the optimiser and the position.
  Optimizer(std::vector<nn::ParameterRef> parameters, std::string name);
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;
  TESSERA_API virtual ~Optimizer();

  /// One update of every parameter that has a gradient; the others are skipped (their state,
  /// step count included, stays as it is).
  virtual void step() = 0;

  /// Zeroes every existing gradient in place (nothing is allocated; parameters without a
  /// gradient keep none).
  void zero_grad();

  const std::vector<nn::ParameterRef>& parameters() const noexcept { return parameters_; }
  const std::string& name() const noexcept { return name_; }

 protected:
  /// Calls fn(value, grad) with parameter i's value and gradient as contiguous typed tensors
  /// (float, double, half or bfloat16, on cpu or cuda), or does nothing when it has no
  /// gradient. A non-contiguous gradient is copied first. Throws, naming the optimiser and the
  /// parameter: dtype_error for an integer parameter or a gradient of another dtype,
  /// device_mismatch_error for a gradient on another device, shape_error for another shape,
  /// tessera::error for a non-contiguous parameter.
  template <class Fn>
  void with_typed(std::size_t i, Fn&& fn) const {
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
    if (!value.is_contiguous()) {
      throw error(which + " (shape " + value.shape().str() +
                  ") is not contiguous; optimisers update contiguous parameters");
    }
    switch (value.dtype()) {
      case ScalarType::float32:
        return typed<float>(value, grad, fn);
      case ScalarType::float64:
        return typed<double>(value, grad, fn);
      case ScalarType::float16:
        return typed<half>(value, grad, fn);
      case ScalarType::bfloat16:
        return typed<bfloat16>(value, grad, fn);
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
  /// parameter.
  TESSERA_API AnyTensor loaded_state(const StateDict& state_dict, std::size_t i,
                                     const char* buffer) const;
  /// Throws tessera::error naming the first "state.<i>." entry whose i is not a parameter.
  TESSERA_API void check_state_indices(const StateDict& state_dict) const;

  std::vector<nn::ParameterRef> parameters_;
  std::string name_;

 private:
  template <Dtype T, class Fn>
  static void typed(const AnyTensor& value, const AnyTensor& grad, Fn& fn) {
    if (value.device().is_cuda()) {
      fn(value.as<T, tessera::cuda>(), grad.as<T, tessera::cuda>().contiguous());
    } else {
      fn(value.as<T, tessera::cpu>(), grad.as<T, tessera::cpu>().contiguous());
    }
  }
};

#if TESSERA_DEFINITIONS
TESSERA_API Optimizer::Optimizer(std::vector<nn::ParameterRef> parameters, std::string name)
    : parameters_(std::move(parameters)), name_(std::move(name)) {
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

TESSERA_API Optimizer::~Optimizer() = default;

namespace detail {
TESSERA_API AnyTensor state_scalar(double value) {
  Tensor<double, cpu> t = Tensor<double, cpu>::empty_on(Shape{}, Device{DeviceType::cpu, 0});
  t.fill_(value);
  return t;
}
TESSERA_API double state_number(const StateDict& state_dict, const std::string& key,
                                const std::string& who) {
  if (!state_dict.contains(key)) {
    throw error(who + "::load_state_dict: no entry " + key + " (not a state_dict of " + who +
                "?)");
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
  if (loaded.dtype() != value.dtype()) {
    throw dtype_error(name_ + "::load_state_dict: " + key + " has dtype " +
                      tessera::name(loaded.dtype()) + ", parameter " + std::to_string(i) +
                      " " + tessera::name(value.dtype()));
  }
  if (loaded.shape() != value.shape()) {
    throw shape_error(name_ + "::load_state_dict: " + key + " has shape " +
                      loaded.shape().str() + ", parameter " + std::to_string(i) + " " +
                      value.shape().str());
  }
  AnyTensor copy = value.visit(
      [&](const auto& typed) -> AnyTensor { return typed.empty_on(value.shape(), value.device()); });
  copy.copy_(loaded);  // to the parameter's device
  return copy;
}
TESSERA_API void Optimizer::check_state_indices(const StateDict& state_dict) const {
  for (const std::string& key : state_dict.keys()) {
    if (key.rfind("state.", 0) != 0) continue;
    const std::size_t end = key.find('.', 6);
    const std::string index = key.substr(6, end == std::string::npos ? end : end - 6);
    if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos ||
        std::stoull(index) >= parameters_.size()) {
      throw error(name_ + "::load_state_dict: entry " + key + " names no parameter (this " +
                  name_ + " has " + std::to_string(parameters_.size()) + ")");
    }
  }
}


TESSERA_API void Optimizer::zero_grad() {
  for (const auto& parameter : parameters_) {
    const AnyTensor grad = parameter.grad();
    if (grad.defined()) grad.visit([](auto typed) { typed.zero_(); });
  }
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera::optim
