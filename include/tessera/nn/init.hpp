// Initialisers (torch.nn.init): fill a tensor in place from the device's Philox generator
// (ts::manual_seed makes them reproducible, and the same seed gives the same values on CPU and
// CUDA), with PyTorch's fan and gain rules for kaiming_* and xavier_*.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/promotion.hpp"
#include "tessera/core/random.hpp"
#include "tessera/tensor/factories.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn::init {

enum class FanMode { fan_in, fan_out };

namespace detail {
/// Fills `tensor` with `fill` (uniform_fill<T> or normal_fill<T>) as ts::rand fills a tensor
/// (tessera::detail::fill_random_: in place, or by a kernel on CUDA in units nvcc compiles).
template <Dtype T, DeviceKind K, class Fill>
void random_fill(const Tensor<T, K>& tensor, const Fill& fill) {
  static_assert(is_floating_point_v<T>,
                "nn::init: random initialisers fill floating-point tensors (float, double, half, "
                "bfloat16)");
  tessera::detail::fill_random_(tensor, fill);
}

inline void require_defined(bool defined, const char* operation) {
  if (!defined) throw error(std::string("nn::init::") + operation + ": the tensor is undefined");
}
}  // namespace detail

/// Values uniform in [low, high). Throws std::invalid_argument for a bad range (nothing drawn).
template <Dtype T, DeviceKind K>
const Tensor<T, K>& uniform_(const Tensor<T, K>& tensor, double low = 0.0, double high = 1.0) {
  detail::require_defined(tensor.defined(), "uniform_");
  // The transform validates the range before anything is drawn.
  detail::random_fill(tensor, uniform_fill<T>{uniform_transform<random_compute_t<T>>(low, high)});
  return tensor;
}

/// Normal values with mean `mean` and standard deviation `stddev` (PyTorch's `std`).
template <Dtype T, DeviceKind K>
const Tensor<T, K>& normal_(const Tensor<T, K>& tensor, double mean = 0.0, double stddev = 1.0) {
  detail::require_defined(tensor.defined(), "normal_");
  detail::random_fill(tensor, normal_fill<T>{normal_transform<random_compute_t<T>>(mean, stddev)});
  return tensor;
}

template <Dtype T, DeviceKind K>
const Tensor<T, K>& constant_(const Tensor<T, K>& tensor, T value) {
  detail::require_defined(tensor.defined(), "constant_");
  Tensor<T, K>(tensor).fill_(value);
  return tensor;
}
template <Dtype T, DeviceKind K>
const Tensor<T, K>& zeros_(const Tensor<T, K>& tensor) {
  return constant_(tensor, T(0));
}
template <Dtype T, DeviceKind K>
const Tensor<T, K>& ones_(const Tensor<T, K>& tensor) {
  return constant_(tensor, T(1));
}

/// PyTorch's (fan_in, fan_out) of a weight of `shape`: [out, in, k...] gives in * prod(k) and
/// out * prod(k). Throws shape_error below 2 dimensions, as PyTorch does.
inline std::pair<std::int64_t, std::int64_t> calculate_fan_in_and_fan_out(const Shape& shape) {
  if (shape.size() < 2) {
    throw shape_error("nn::init: fan in and fan out cannot be computed for a tensor of shape " +
                      shape.str() + " (fewer than 2 dimensions)");
  }
  std::int64_t receptive = 1;
  for (int d = 2; d < shape.size(); ++d) receptive *= shape[d];
  return {shape[1] * receptive, shape[0] * receptive};
}

/// PyTorch's recommended gain: "linear", "sigmoid" and the conv names 1, "tanh" 5/3, "relu"
/// sqrt(2), "leaky_relu" sqrt(2 / (1 + slope^2)) (slope `param`, default 0.01), "selu" 3/4.
/// Throws std::invalid_argument for another name.
inline double calculate_gain(const std::string& nonlinearity, double param = 0.01) {
  if (nonlinearity == "linear" || nonlinearity == "sigmoid" || nonlinearity == "conv1d" ||
      nonlinearity == "conv2d" || nonlinearity == "conv3d") {
    return 1.0;
  }
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  throw std::invalid_argument("nn::init::calculate_gain: unsupported nonlinearity '" +
                              nonlinearity + "'");
}

/// He initialisation, uniform: U(-b, b) with b = gain * sqrt(3 / fan), gain from `nonlinearity`
/// with slope `a`. Linear's default is kaiming_uniform_(w, sqrt(5)), i.e. b = 1 / sqrt(fan_in).
template <Dtype T, DeviceKind K>
const Tensor<T, K>& kaiming_uniform_(const Tensor<T, K>& tensor, double a = 0.0,
                                     FanMode mode = FanMode::fan_in,
                                     const std::string& nonlinearity = "leaky_relu") {
  detail::require_defined(tensor.defined(), "kaiming_uniform_");
  if (tensor.numel() == 0) return tensor;  // PyTorch: initialising no elements is a no-op
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor.shape());
  const double fan = static_cast<double>(mode == FanMode::fan_in ? fan_in : fan_out);
  const double bound = std::sqrt(3.0) * (calculate_gain(nonlinearity, a) / std::sqrt(fan));
  return uniform_(tensor, -bound, bound);
}

/// He initialisation, normal: N(0, (gain / sqrt(fan))^2).
template <Dtype T, DeviceKind K>
const Tensor<T, K>& kaiming_normal_(const Tensor<T, K>& tensor, double a = 0.0,
                                    FanMode mode = FanMode::fan_in,
                                    const std::string& nonlinearity = "leaky_relu") {
  detail::require_defined(tensor.defined(), "kaiming_normal_");
  if (tensor.numel() == 0) return tensor;
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor.shape());
  const double fan = static_cast<double>(mode == FanMode::fan_in ? fan_in : fan_out);
  return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / std::sqrt(fan));
}

/// Glorot initialisation, uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
template <Dtype T, DeviceKind K>
const Tensor<T, K>& xavier_uniform_(const Tensor<T, K>& tensor, double gain = 1.0) {
  detail::require_defined(tensor.defined(), "xavier_uniform_");
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor.shape());
  const double stddev = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  const double bound = std::sqrt(3.0) * stddev;
  return uniform_(tensor, -bound, bound);
}

/// Glorot initialisation, normal: N(0, gain^2 * 2 / (fan_in + fan_out)).
template <Dtype T, DeviceKind K>
const Tensor<T, K>& xavier_normal_(const Tensor<T, K>& tensor, double gain = 1.0) {
  detail::require_defined(tensor.defined(), "xavier_normal_");
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor.shape());
  return normal_(tensor, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)));
}

}  // namespace tessera::nn::init
