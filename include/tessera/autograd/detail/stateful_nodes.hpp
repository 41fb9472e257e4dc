// The nodes that are not pure functions of their inputs, so never recomputed and without a
// gradient (autograd/ops.hpp records them): rand_node draws from the device's generator at every
// forward, effect_node runs a function on some values' tensors (BatchNorm's running statistics).
#pragma once

#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/var.hpp"
#include "tessera/tensor/factories.hpp"

namespace tessera::autograd::detail {

/// Why a program's random fills on device kind K cannot be captured in a CUDA graph, or nullptr:
/// a kernel compiled in this unit (nvcc) reads a captured fill's seed and offset from device
/// memory at each launch (Generator::begin_graph_capture); a fill drawn on the host cannot.
template <class K>
constexpr const char* random_capture_blocker() {
  if constexpr (std::is_same_v<K, cuda> && TESSERA_CUDA_KERNELS) {
    return nullptr;
  } else {
    return "random numbers drawn on the host (on the CPU, or in a unit not compiled by nvcc)";
  }
}

/// Uniform numbers in [0, 1) drawn anew at every forward from the device's Philox generator
/// (ts::manual_seed makes runs reproducible). Never recomputed: a checkpointed segment keeps them.
template <class T, class K>
class rand_node final : public node {
 public:
  rand_node() = default;
  const char* name() const override { return "rand"; }
  bool recomputable() const override { return false; }
  const char* capture_blocker() const override { return random_capture_blocker<K>(); }
  void forward(value_table& table) override {
    tessera::detail::fill_uniform_(table.template get<T, K>(output));
  }
};

/// Runs a function on the current tensors of some values at every forward (running statistics,
/// logging); no gradient, never recomputed. Its output has no elements.
class effect_node final : public node {
 public:
  explicit effect_node(std::vector<int> ids, std::function<void(const value_table&)> effect)
      : effect_(std::move(effect)) {
    inputs = std::move(ids);
  }
  const char* name() const override { return "effect"; }
  bool recomputable() const override { return false; }
  bool is_effect() const override { return true; }
  void forward(value_table& table) override { effect_(table); }
  const char* capture_blocker() const override { return blocker_; }
  /// An effect whose work is only device work queued at each forward (BatchNorm's running
  /// statistics with a momentum) may be replayed by a CUDA graph: nullptr. Otherwise why not.
  void set_capture_blocker(const char* blocker) noexcept { blocker_ = blocker; }

 private:
  std::function<void(const value_table&)> effect_;
  const char* blocker_ =
      "an on_forward effect (host code that runs at every forward, which a replay skips)";
};

}  // namespace tessera::autograd::detail
