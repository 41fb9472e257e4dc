// Multi-tensor updates (PyTorch's foreach/fused optimisers): while an optimiser step runs, each CUDA
// parameter's update rule is queued here, and the step's end launches them as lists through the
// backend (backend/cuda/multi_update.cuh: one launch per list of rules of one type and device that
// fits the kernel parameters).
#pragma once

#include <cstdint>
#include <memory>
#include <typeindex>
#include <utility>
#include <vector>

#include "tessera/core/device.hpp"

namespace tessera::optim::detail {

/// Queued updates of one rule type on one device.
struct pending_updates {
  virtual ~pending_updates() = default;
  virtual void launch() = 0;
};

/// While one exists on a thread (an optimiser's step), CUDA updates queue in it instead of
/// launching one kernel each; flush() (or the destructor, which drops errors: call flush) launches
/// them, one kernel per list of rules of one type and device.
class batched_updates {
 public:
  batched_updates() : previous_(current()) { current() = this; }
  batched_updates(const batched_updates&) = delete;
  batched_updates& operator=(const batched_updates&) = delete;
  ~batched_updates() {
    try {
      flush();
    } catch (...) {  // a step that threw already reports its own error
    }
    current() = previous_;
  }

  /// The queue updates go to on this thread, or null.
  static batched_updates*& current() {
    thread_local batched_updates* queue = nullptr;
    return queue;
  }

  /// The queue of rule type Update on `device` (made by `make` the first time).
  template <class Update, class Make>
  pending_updates& queue(Device device, Make&& make) {
    const std::type_index type(typeid(Update));
    for (auto& [key, queued] : queues_) {
      if (key.first == type && key.second == device) return *queued;
    }
    std::unique_ptr<pending_updates> made = make();
    queues_.emplace_back(std::make_pair(type, device), std::move(made));
    return *queues_.back().second;
  }

  /// Keeps `buffer` (a temporary a queued rule points into: a gradient made contiguous) alive
  /// until the rules are launched.
  void keep(std::shared_ptr<const void> buffer) { kept_.push_back(std::move(buffer)); }

  /// Launches everything queued, in the order the types were first queued; then lets go of the
  /// kept buffers (freed on the stream, after the launches).
  void flush() {
    auto queues = std::move(queues_);
    queues_.clear();
    for (auto& entry : queues) entry.second->launch();
    kept_.clear();
  }

 private:
  batched_updates* previous_;
  std::vector<std::shared_ptr<const void>> kept_;
  std::vector<std::pair<std::pair<std::type_index, Device>, std::unique_ptr<pending_updates>>>
      queues_;
};

/// `tensor`, kept alive by the thread's batched_updates when one is queueing (so that a rule that
/// points into it is launched before it is freed).
template <class Tensor>
Tensor kept_until_flush(Tensor tensor) {
  if (batched_updates* queue = batched_updates::current()) {
    queue->keep(std::make_shared<Tensor>(tensor));
  }
  return tensor;
}

}  // namespace tessera::optim::detail
