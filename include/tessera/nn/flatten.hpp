// Flatten: merges dimensions start_dim..end_dim into one (torch.nn.Flatten, default start_dim 1,
// so [N, C, L] becomes [N, C * L]). A plain class: no parameters, not registered. Written with
// .shape() and .reshape() only, so it traces unchanged.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/nn/detail/operand.hpp"

namespace tessera::nn {

struct Flatten {
  std::int64_t start_dim = 1;
  std::int64_t end_dim = -1;

  Flatten() = default;
  explicit Flatten(std::int64_t start, std::int64_t end = -1) : start_dim(start), end_dim(end) {}

  /// The input reshaped to merge dimensions start_dim..end_dim (a view when the layout allows,
  /// as reshape). Throws shape_error for dimensions out of range or in the wrong order.
  template <class X>
  auto forward(const X& x) const {
    decltype(auto) input = detail::materialize(x);
    return input.reshape(target_shape(input.shape()));
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

  /// The flattened shape of an input of shape `shape` (a 0-dim input becomes [1], as PyTorch).
  Shape target_shape(const Shape& shape) const {
    if (shape.size() == 0) return Shape{1};
    const int first = shape.normalize_dim(start_dim, "Flatten");
    const int last = shape.normalize_dim(end_dim, "Flatten");
    if (first > last) {
      throw shape_error("Flatten: start_dim " + std::to_string(start_dim) +
                        " comes after end_dim " + std::to_string(end_dim) + " for shape " +
                        shape.str());
    }
    Shape target;
    for (int d = 0; d < first; ++d) target.push_back(shape[d]);
    std::int64_t merged = 1;
    for (int d = first; d <= last; ++d) merged *= shape[d];
    target.push_back(merged);
    for (int d = last + 1; d < shape.size(); ++d) target.push_back(shape[d]);
    return target;
  }
};

}  // namespace tessera::nn
