// ts::nn::functional::one_hot: class indices to one-hot rows (torch.nn.functional.one_hot), the
// way tutorials build their labels. One elementwise comparison of the labels (a trailing
// dimension of 1) with arange(num_classes), so it is one loop on CPU and one kernel on CUDA
// (in a unit compiled by nvcc), after the two reductions that check the labels.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/expr/reduce.hpp"
#include "tessera/tensor/factories.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::nn::detail {

/// Throws tessera::error naming the first label (in row-major order) outside [0, num_classes)
/// (num_classes -1: only negative labels are wrong) and its position. Reads the labels on the
/// host: only after a reduction found such a label.
template <DeviceKind K>
[[noreturn]] void throw_bad_label(const Tensor<std::int64_t, K>& labels, std::int64_t num_classes) {
  const std::vector<std::int64_t> values = labels.to_vector();
  const Shape& shape = labels.shape();
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::int64_t v = values[i];
    if (v >= 0 && (num_classes < 0 || v < num_classes)) continue;
    std::vector<std::int64_t> position(static_cast<std::size_t>(shape.size()));
    std::int64_t rest = static_cast<std::int64_t>(i);
    for (int d = shape.size() - 1; d >= 0; --d) {
      position[static_cast<std::size_t>(d)] = rest % shape[d];
      rest /= shape[d];
    }
    std::string at = "[";
    for (std::size_t d = 0; d < position.size(); ++d) {
      at += (d ? ", " : "") + std::to_string(position[d]);
    }
    at += "]";
    if (v < 0) {
      throw error("one_hot: label " + std::to_string(v) + " at position " + at + " of labels " +
                  shape.str() + " is negative (class values must be non-negative)");
    }
    throw error("one_hot: label " + std::to_string(v) + " at position " + at + " of labels " +
                shape.str() + " is out of range for num_classes " + std::to_string(num_classes) +
                " (expected 0 <= label < " + std::to_string(num_classes) + ")");
  }
  throw error("one_hot: a label is out of range, but none was found on the host");
}

}  // namespace tessera::nn::detail

namespace tessera::nn::functional {

/// torch.nn.functional.one_hot: `labels` (int64 class indices, any shape, on any device) to an
/// int64 tensor of shape labels.shape() + [num_classes] on the labels' device, 1 at each label's
/// class and 0 elsewhere. num_classes = -1 means max(labels) + 1. Throws tessera::error naming
/// the label and its position for a negative label or one >= num_classes, and for empty labels
/// with num_classes = -1 (no maximum to infer from); std::invalid_argument for num_classes < -1.
template <Dtype T, DeviceKind K>
Tensor<std::int64_t, K> one_hot(const Tensor<T, K>& labels, std::int64_t num_classes = -1) {
  static_assert(std::is_same_v<T, std::int64_t>,
                "one_hot: the labels must be int64 class indices (as torch.nn.functional.one_hot "
                "takes); convert them with .to<std::int64_t>()");
  if (!labels.defined()) throw error("one_hot: the labels are undefined");
  if (num_classes < -1) {
    throw std::invalid_argument(
        "one_hot: num_classes must be -1 (max(labels) + 1) or "
        "non-negative, got " +
        std::to_string(num_classes));
  }
  Shape out_shape = labels.shape();
  if (labels.numel() == 0) {
    if (num_classes == -1) {
      throw error("one_hot: cannot infer num_classes from empty labels (shape " +
                  labels.shape().str() + "); pass num_classes");
    }
    out_shape.push_back(num_classes);
    return tessera::zeros<std::int64_t, K>(out_shape, labels.device_index());
  }
  const std::int64_t lowest = tessera::min(labels).item();
  const std::int64_t highest = tessera::max(labels).item();
  if (lowest < 0) detail::throw_bad_label(labels, -1);
  if (num_classes == -1) {
    if (highest == std::numeric_limits<std::int64_t>::max()) {
      throw error("one_hot: the largest label, " + std::to_string(highest) +
                  ", leaves no num_classes to infer");
    }
    num_classes = highest + 1;
  } else if (highest >= num_classes) {
    detail::throw_bad_label(labels, num_classes);
  }
  out_shape.push_back(num_classes);
  Shape column = labels.shape();
  column.push_back(1);
  const Tensor<std::int64_t, K> classes = tessera::arange<std::int64_t, K>(
      0.0, static_cast<double>(num_classes), 1.0, labels.device_index());
  return Tensor<std::int64_t, K>(tessera::cast<std::int64_t>(labels.reshape(column) == classes));
}

}  // namespace tessera::nn::functional
