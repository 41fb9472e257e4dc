// ts::cat: concatenation along one dimension into a new tensor on the first input's device.
#pragma once

#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "tessera/tensor/tensor.hpp"

namespace tessera {

/// Concatenates `tensors` along `dim`. All must be on one device (device_mismatch_error naming
/// both otherwise) and agree in every other dimension (shape_error printing both shapes).
template <Dtype T, DeviceKind K>
Tensor<T, K> cat(std::span<const Tensor<T, K>> tensors, std::int64_t dim = 0) {
  if (tensors.empty()) throw shape_error("cat: expects a non-empty list of tensors");
  const Tensor<T, K>& first = tensors.front();
  if (!first.defined()) throw error("cat: tensor 0 is undefined");
  const int d = first.shape().normalize_dim(dim, "cat");
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (!t.defined()) throw error("cat: tensor " + std::to_string(i) + " is undefined");
    if (t.device() != first.device()) {
      throw device_mismatch_error("cat: tensor 0 is on " + first.device().str() + " but tensor " +
                                  std::to_string(i) + " is on " + t.device().str());
    }
    bool compatible = t.dim() == first.dim();
    for (int j = 0; compatible && j < t.dim(); ++j) {
      if (j != d && t.shape()[j] != first.shape()[j]) compatible = false;
    }
    if (!compatible) {
      throw shape_error("cat: tensor 0 has shape " + first.shape().str() + " but tensor " +
                        std::to_string(i) + " has shape " + t.shape().str() +
                        " (all dimensions but " + std::to_string(d) + " must match)");
    }
    out_shape[d] += t.shape()[d];
  }
  auto out = Tensor<T, K>::empty_on(out_shape, first.device());
  std::int64_t start = 0;
  for (const auto& t : tensors) {
    out.narrow(d, start, t.shape()[d]).copy_(t);
    start += t.shape()[d];
  }
  return out;
}

template <Dtype T, DeviceKind K>
Tensor<T, K> cat(const std::vector<Tensor<T, K>>& tensors, std::int64_t dim = 0) {
  return cat(std::span<const Tensor<T, K>>(tensors), dim);
}

template <Dtype T, DeviceKind K>
Tensor<T, K> cat(std::initializer_list<Tensor<T, K>> tensors, std::int64_t dim = 0) {
  return cat(std::span<const Tensor<T, K>>(tensors.begin(), tensors.size()), dim);
}

}  // namespace tessera
