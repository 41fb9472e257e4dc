// balance_by_time: a Pipeline's `balance` from measured layer times (torchgpipe's
// balance_by_time). Each layer of a Sequential is timed, forward and backward, on a deep copy
// placed on the sample's device; then the layers are cut into contiguous stages so that the
// slowest stage is as fast as it can be (a pipeline runs at the pace of its slowest stage).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tessera/autograd/program.hpp"
#include "tessera/core/random.hpp"
#include "tessera/nn/sequential.hpp"
#include "tessera/parallel/pipeline.hpp"
#include "tessera/tensor/factories.hpp"

namespace tessera::parallel {

namespace detail {

/// Layers per stage: `costs` (one per layer, in order) cut into `partitions` contiguous,
/// non-empty stages whose largest sum is the smallest possible (among equal cuts, the one whose
/// last stage starts earliest). Throws std::invalid_argument unless 1 <= partitions <=
/// costs.size().
inline std::vector<int> balance_costs(const std::vector<double>& costs, int partitions) {
  const auto layers = static_cast<int>(costs.size());
  if (partitions < 1 || partitions > layers) {
    throw std::invalid_argument("balance_by_time: " + std::to_string(partitions) +
                                " partitions for " + std::to_string(layers) +
                                " layers (each stage needs at least one layer)");
  }
  std::vector<double> prefix(costs.size() + 1, 0.0);
  for (std::size_t i = 0; i < costs.size(); ++i) prefix[i + 1] = prefix[i] + costs[i];
  auto sum = [&](int from, int to) {
    return prefix[static_cast<std::size_t>(to)] - prefix[static_cast<std::size_t>(from)];
  };
  const auto width = static_cast<std::size_t>(layers) + 1;
  // best[p * width + i]: the smallest largest stage when layers [0, i) form p stages; cut[...]:
  // where the last of those stages begins.
  constexpr double none = std::numeric_limits<double>::infinity();
  std::vector<double> best(static_cast<std::size_t>(partitions + 1) * width, none);
  std::vector<int> cut(best.size(), 0);
  best[0] = 0.0;
  for (int p = 1; p <= partitions; ++p) {
    for (int i = p; i <= layers - (partitions - p); ++i) {
      double& slot = best[static_cast<std::size_t>(p) * width + static_cast<std::size_t>(i)];
      for (int j = p - 1; j < i; ++j) {
        const double value = std::max(
            best[static_cast<std::size_t>(p - 1) * width + static_cast<std::size_t>(j)], sum(j, i));
        if (value < slot) {
          slot = value;
          cut[static_cast<std::size_t>(p) * width + static_cast<std::size_t>(i)] = j;
        }
      }
    }
  }
  std::vector<int> balance(static_cast<std::size_t>(partitions));
  int end = layers;
  for (int p = partitions; p >= 1; --p) {
    const int begin = cut[static_cast<std::size_t>(p) * width + static_cast<std::size_t>(end)];
    balance[static_cast<std::size_t>(p) - 1] = end - begin;
    end = begin;
  }
  return balance;
}

}  // namespace detail

/// Layers per stage for a ts::parallel::Pipeline of `seq` over `partitions` devices, from
/// measured times (torchgpipe's balance_by_time). Every layer is copied (parallel::replicate) to
/// the sample's device and its forward and backward are timed there, on a thread with the share
/// of the cores a pipeline stage gets (the process's threads divided by `partitions`), layer
/// after layer for at least `timeout` seconds and at least three timed rounds after a warm-up;
/// each layer's cost is its median. The stages are then the contiguous cut whose slowest stage
/// is fastest. `sample` is one micro-batch (the batch divided by the pipeline's chunks): layer
/// times do not scale alike with the batch. `seq` is left as it was (its parameters, gradients,
/// buffers and the random generator of the sample's device). Throws std::invalid_argument when
/// `partitions` is not in [1, layers] or `timeout` is negative, tessera::error for an undefined
/// or 0-dim sample, and what the layers throw for the sample's shape.
template <class Seq, Dtype T, DeviceKind K>
std::vector<int> balance_by_time(int partitions, const Seq& seq, const Tensor<T, K>& sample,
                                 double timeout = 1.0) {
  constexpr std::size_t layers = Seq::size();
  if (partitions < 1 || static_cast<std::size_t>(partitions) > layers) {
    throw std::invalid_argument("balance_by_time: " + std::to_string(partitions) +
                                " partitions for " + std::to_string(layers) +
                                " layers (each stage needs at least one layer)");
  }
  if (!(timeout >= 0)) {
    throw std::invalid_argument(
        "balance_by_time: the timeout must be at least 0 seconds (timeout: " +
        std::to_string(timeout) + ")");
  }
  if (!sample.defined()) throw error("balance_by_time: the sample is undefined");
  if (sample.dim() == 0) {
    throw shape_error("balance_by_time: the sample is 0-dim; it needs a batch dimension");
  }
  using Activation = Tensor<T, K>;
  using Var = autograd::Var<T, K>;
  const Device device = sample.device();
  DeviceGuard<K> on_device(device.index);
  tessera::detail::cpu_share_scope share(partitions);
  Generator& generator = default_generator(device);
  struct restore_generator {
    Generator& generator;
    philox_state state;
    ~restore_generator() { generator.set_state(state); }
  } restore{generator, generator.state()};

  // The copies (modules deep-copied as replicate does, plain layers as they are; alive while
  // their programs run), one program per layer, and its input.
  auto copy_layers = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::make_tuple(nn::detail::copy_to<K>(seq.template get<I>(), device)...);
  };
  auto copies = copy_layers(std::make_index_sequence<layers>{});
  std::vector<autograd::Program<Activation>> programs;
  std::vector<Activation> inputs{sample.contiguous()};
  std::vector<Activation> seeds;  // the output's gradient; undefined: no backward (inference)
  bool earlier = false;  // an earlier layer trains, so this layer's input needs a gradient
  auto compile_layer = [&](auto& layer) {
    const bool has = detail::layer_trains(layer);
    auto spec = autograd::input<T, K>(inputs.back().shape(), device.index);
    spec.requires_grad = earlier;
    const bool training = has || earlier;
    auto fn = [&layer](Var x) { return Var(layer.forward(x)); };
    programs.push_back(autograd::compile(
        fn, spec,
        autograd::Options{.mode = training ? autograd::Mode::training : autograd::Mode::inference,
                          .seed_gradient = training}));
    const Activation out = programs.back().forward(inputs.back());
    seeds.push_back(training ? ones<T, K>(out.shape(), device.index) : Activation{});
    inputs.push_back(out.clone());
    earlier = earlier || has;
  };
  std::apply([&](auto&... layer) { (compile_layer(layer), ...); }, copies);

  // Rounds over every layer (the first a warm-up: arenas, gradients, caches) until `timeout`
  // has passed and three rounds are timed.
  using clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> times(layers);
  const auto start = clock::now();
  for (int round = 0;; ++round) {
    for (std::size_t i = 0; i < layers; ++i) {
      K::synchronize(device.index);
      const auto t0 = clock::now();
      programs[i].forward(inputs[i]);
      if (seeds[i].defined()) programs[i].backward(seeds[i]);
      K::synchronize(device.index);
      if (round > 0) times[i].push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
    if (round >= 3 && std::chrono::duration<double>(clock::now() - start).count() >= timeout) {
      break;
    }
  }
  std::vector<double> costs(layers);
  for (std::size_t i = 0; i < layers; ++i) {
    auto& t = times[i];
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    costs[i] = t[t.size() / 2];
  }
  return detail::balance_costs(costs, partitions);
}

}  // namespace tessera::parallel
