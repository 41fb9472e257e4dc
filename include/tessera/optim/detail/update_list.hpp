// Multi-tensor updates (PyTorch's foreach/fused optimisers): an optimiser step on CUDA queues each
// parameter's update rule, and one launch then updates up to a kernel-parameter-sized list of
// parameters, each block taking a chunk of one parameter's elements. update_list_plan is the
// arithmetic (which rules go in which launch, which blocks belong to which rule), plain host code
// so that CPU tests check every element of every parameter is updated exactly once;
// batched_updates queues the rules while a step runs (the kernel is in optim/optimizer.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <typeindex>
#include <utility>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"

namespace tessera::optim::detail {

/// How the queued updates of one rule type and device become launches: launch k updates rules
/// [first, first + count) (at most max_rules), and rule r of a launch owns blocks
/// [first_block[r], first_block[r + 1]) of it, each block `per_block` consecutive elements.
struct update_list_plan {
  struct launch {
    std::size_t first = 0;
    std::size_t count = 0;
    std::vector<std::int64_t> first_block;  // count + 1 entries, from 0
  };
  std::vector<launch> launches;

  static update_list_plan make(const std::vector<std::int64_t>& sizes, std::size_t max_rules,
                               std::int64_t per_block) {
    update_list_plan plan;
    for (std::size_t first = 0; first < sizes.size(); first += max_rules) {
      launch l;
      l.first = first;
      l.count = std::min(max_rules, sizes.size() - first);
      l.first_block.push_back(0);
      for (std::size_t r = 0; r < l.count; ++r) {
        const std::int64_t blocks = (sizes[first + r] + per_block - 1) / per_block;
        l.first_block.push_back(l.first_block.back() + blocks);
      }
      plan.launches.push_back(std::move(l));
    }
    return plan;
  }
  /// The rule that block b of a launch belongs to (the kernel's scan over first_block).
  TESSERA_HOST_DEVICE static std::size_t rule_of(const std::int64_t* first_block,
                                                 std::size_t count, std::int64_t b) {
    std::size_t r = 0;
    while (r + 1 < count && first_block[r + 1] <= b) ++r;
    return r;
  }
};

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
