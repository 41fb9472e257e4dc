// What a parallel training step changes in the modules it trains, kept before the step so that a
// step that throws can put it back (the core's rule: a failed call leaves every object as it
// was). DataParallel's devices and a Pipeline's micro-batches write gradients, running statistics
// and random draws as they go, so one of them failing would leave the others' work done. The
// copies are kept from step to step: a warm step that needs one makes no allocation.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "tessera/autograd/parameter.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/random.hpp"
#include "tessera/nn/buffer.hpp"
#include "tessera/nn/parameter.hpp"
#include "tessera/tensor/any_tensor.hpp"

namespace tessera::parallel::detail {

/// Calls fn(slot) with the typed autograd::parameter_slot behind `parameter`.
template <class Fn>
void visit_slot(const nn::ParameterRef& parameter, Fn&& fn) {
  visit_dtype(parameter.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (parameter.device_type() == DeviceType::cuda) {
      fn(*parameter.as<T, cuda>().slot());
    } else {
      fn(*parameter.as<T, cpu>().slot());
    }
  });
}

/// A copy of `from` in `kept` (reused when it has from's dtype, shape and device, so that a warm
/// step allocates nothing).
inline void keep_copy(AnyTensor& kept, const AnyTensor& from) {
  if (!kept.defined() || kept.dtype() != from.dtype() || kept.shape() != from.shape() ||
      kept.device() != from.device() || !kept.is_contiguous()) {
    kept = from.clone();
  } else {
    kept.copy_(from);
  }
}

/// The parameters' gradients before a backward: none, zero but unwritten (after zero_grad, the
/// usual case, which costs nothing to keep), or values (a step that accumulates onto earlier
/// gradients: copied, so accumulating costs a copy of those gradients' memory, held until a
/// step finds them zero again). restore() puts each back, on the same tensor.
class gradient_rollback {
 public:
  /// Records every parameter's gradient. Throws (out_of_memory_error) before anything changed
  /// when a copy cannot be made.
  void record(const std::vector<nn::ParameterRef>& parameters) {
    entries_.resize(parameters.size());
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      entry& e = entries_[i];
      e.parameter = parameters[i];
      visit_slot(parameters[i], [&](const auto& slot) {
        e.state = !slot.grad.defined() ? grad_state::none
                  : slot.grad_zero     ? grad_state::zero
                                       : grad_state::values;
        if (e.state == grad_state::values) {
          keep_copy(e.copy, AnyTensor(slot.grad));
        } else {
          e.copy = AnyTensor{};  // held only while the gradients accumulate
        }
      });
    }
    recorded_ = true;
  }

  /// Puts every recorded gradient back (nothing when nothing is recorded).
  void restore() const {
    if (!recorded_) return;
    for (const entry& e : entries_) {
      visit_slot(e.parameter, [&](auto& slot) {
        using Slot = std::remove_cvref_t<decltype(slot)>;
        using Grad = decltype(Slot::grad);
        switch (e.state) {
          case grad_state::none:  // made by the failed backward
            slot.set_grad(Grad{});
            break;
          case grad_state::zero:
            slot.zero_grad();
            break;
          case grad_state::values:
            slot.grad.copy_(
                e.copy.template as<typename Grad::value_type, typename Grad::device_kind>());
            slot.grad_zero = false;
            break;
        }
      });
    }
  }

  /// Forgets the record (the step succeeded); the copies are kept for the next step.
  void commit() noexcept { recorded_ = false; }

 private:
  enum class grad_state { none, zero, values };
  struct entry {
    nn::ParameterRef parameter;
    grad_state state = grad_state::none;
    AnyTensor copy;
  };
  std::vector<entry> entries_;
  bool recorded_ = false;
};

/// The modules' buffers (BatchNorm's running statistics and batch count) and the devices' random
/// generators before a forward, which moves them; restore() puts them back.
class effect_rollback {
 public:
  /// Records `buffers`' values (copied) and the generators of `devices`.
  void record(const std::vector<nn::BufferRef>& buffers, const std::vector<Device>& devices) {
    buffers_.resize(buffers.size());
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      buffers_[i].first = buffers[i].value();
      if (buffers_[i].first.defined()) keep_copy(buffers_[i].second, buffers_[i].first);
    }
    generators_.clear();
    for (const Device& device : devices) {
      generators_.emplace_back(device, default_generator(device).state());
    }
    recorded_ = true;
  }

  void restore() const {
    if (!recorded_) return;
    for (const auto& [buffer, copy] : buffers_) {
      if (buffer.defined()) buffer.copy_(copy);
    }
    for (const auto& [device, state] : generators_) default_generator(device).set_state(state);
  }

  void commit() noexcept {
    recorded_ = false;
    for (auto& kept : buffers_) kept.first = AnyTensor{};  // the module's, not ours to hold
  }

 private:
  std::vector<std::pair<AnyTensor, AnyTensor>> buffers_;  // (the module's buffer, its copy)
  std::vector<std::pair<Device, philox_state>> generators_;
  bool recorded_ = false;
};

/// Which tensors a module's parameters (value and gradient) and buffers are: handles, not
/// copies, so a move of several layers (Module::to, each layer staged and committed on its own)
/// that fails at a later layer gives the layers already moved their old tensors back.
class placement_rollback {
 public:
  void record(const std::vector<nn::ParameterRef>& parameters,
              const std::vector<nn::BufferRef>& buffers) {
    for (const auto& p : parameters) {
      visit_slot(p, [&](const auto& slot) {
        parameters_.push_back({p, AnyTensor(slot.value), AnyTensor(slot.grad), slot.grad_zero});
      });
    }
    for (const auto& b : buffers) buffers_.emplace_back(b, b.value());
  }

  void restore() const {
    for (const auto& e : parameters_) {
      visit_slot(e.parameter, [&](auto& slot) {
        using Value = decltype(slot.value);
        using T = typename Value::value_type;
        using K = typename Value::device_kind;
        slot.value = e.value.defined() ? e.value.template as<T, K>() : Value{};
        slot.grad = e.grad.defined() ? e.grad.template as<T, K>() : Value{};
        slot.grad_zero = e.grad_zero;
      });
    }
    for (const auto& [buffer, value] : buffers_) buffer.set_value(value);
  }

 private:
  struct entry {
    nn::ParameterRef parameter;
    AnyTensor value;
    AnyTensor grad;
    bool grad_zero = false;
  };
  std::vector<entry> parameters_;
  std::vector<std::pair<nn::BufferRef, AnyTensor>> buffers_;
};

}  // namespace tessera::parallel::detail
