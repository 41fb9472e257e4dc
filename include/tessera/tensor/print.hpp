// operator<< for tensors in PyTorch's layout: `tensor([[1., 2.], [3., 4.]])`, four decimals or
// scientific notation chosen from the values' range, long tensors summarised with `...`, and a
// `device='cuda:0'` / `dtype=...` suffix when they differ from cpu:0 and the default dtypes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "tessera/tensor/tensor.hpp"

namespace tessera {

namespace detail {

/// The body of operator<<: `values` row-major over `shape` (any dtype, as double), laid out as
/// PyTorch prints them. Out of line: it is the same for every tensor type.
TESSERA_API std::string format_tensor(const std::vector<double>& values, ScalarType type,
                                      const Shape& shape, Device device);

#if TESSERA_DEFINITIONS

struct print_options {
  int precision = 4;
  std::int64_t threshold = 1000;  // summarise above this many elements (PyTorch's default)
  std::int64_t edge_items = 3;
  int line_width = 80;
};

class element_formatter {
 public:
  element_formatter(const std::vector<double>& values, ScalarType type, const print_options& o)
      : type_(type), precision_(o.precision) {
    if (type == ScalarType::boolean || !is_floating_point(type)) return;
    std::vector<double> finite;
    for (double v : values) {
      if (std::isfinite(v)) finite.push_back(std::abs(v));
    }
    if (finite.empty()) return;
    integer_mode_ = std::all_of(values.begin(), values.end(),
                                [](double v) { return !std::isfinite(v) || v == std::ceil(v); });
    double max_abs = *std::max_element(finite.begin(), finite.end());
    double min_nonzero = max_abs;
    for (double v : finite) {
      if (v > 0) min_nonzero = std::min(min_nonzero, v);
    }
    // PyTorch switches to scientific notation for a wide dynamic range or extreme magnitudes.
    if (integer_mode_) {
      scientific_ = max_abs > 1e8;
    } else {
      scientific_ = max_abs > 1e8 || (min_nonzero > 0 && min_nonzero < 1e-4) ||
                    (min_nonzero > 0 && max_abs / min_nonzero > 1000.0);
    }
  }

  std::string operator()(double v) const {
    if (type_ == ScalarType::boolean) return v != 0 ? "True" : "False";
    if (!is_floating_point(type_)) return std::to_string(static_cast<long long>(v));
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buffer[64];
    if (scientific_) {
      std::snprintf(buffer, sizeof buffer, "%.*e", precision_, v);
    } else if (integer_mode_) {
      std::snprintf(buffer, sizeof buffer, "%.0f.", v);
    } else {
      std::snprintf(buffer, sizeof buffer, "%.*f", precision_, v);
    }
    return buffer;
  }

 private:
  ScalarType type_;
  int precision_;
  bool integer_mode_ = false;
  bool scientific_ = false;
};

// Recursive layout of one dimension, appended to `out`; `items` are row-major over `shape`.
// (Into a std::string, not a stream: <sstream> is a cost every includer would pay.)
inline void print_dimension(std::string& out, const std::vector<std::string>& items,
                            const Shape& shape, int dim, std::int64_t offset, int indent,
                            std::size_t width, bool summarise, const print_options& options) {
  const std::int64_t extent = shape[dim];
  std::int64_t inner = 1;
  for (int d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  auto visible = [&](std::int64_t i) {
    return !summarise || extent <= 2 * options.edge_items || i < options.edge_items ||
           i >= extent - options.edge_items;
  };
  out += '[';
  if (dim == shape.size() - 1) {
    const int per_line =
        std::max(1, static_cast<int>((options.line_width - indent) / static_cast<int>(width + 2)));
    int on_line = 0;
    bool first = true;
    for (std::int64_t i = 0; i < extent; ++i) {
      if (!visible(i)) {
        if (i == options.edge_items) {
          out += ",  ...";  // PyTorch joins " ..." with ", "
          first = false;
        }
        continue;
      }
      if (!first) {
        out += ',';
        if (on_line == per_line) {
          out += '\n';
          out.append(static_cast<std::size_t>(indent + 1), ' ');
          on_line = 0;
        } else {
          out += ' ';
        }
      }
      const std::string& item = items[static_cast<std::size_t>(offset + i)];
      out.append(width - item.size(), ' ');
      out += item;
      first = false;
      ++on_line;
    }
  } else {
    std::string separator(1, ',');
    separator.append(static_cast<std::size_t>(shape.size() - dim - 1), '\n');
    separator.append(static_cast<std::size_t>(indent + 1), ' ');
    bool first = true;
    for (std::int64_t i = 0; i < extent; ++i) {
      if (!visible(i)) {
        if (i == options.edge_items) {
          out += separator;
          out += "...";
        }
        continue;
      }
      if (!first) out += separator;
      print_dimension(out, items, shape, dim + 1, offset + i * inner, indent + 1, width, summarise,
                      options);
      first = false;
    }
  }
  out += ']';
}

TESSERA_API std::string format_tensor(const std::vector<double>& values, ScalarType type,
                                      const Shape& shape, Device device) {
  const print_options options;
  const auto numel = static_cast<std::int64_t>(values.size());
  const bool summarise = numel > options.threshold;
  std::vector<std::string> items(values.size());
  element_formatter format(values, type, options);
  std::size_t width = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    items[i] = format(values[i]);
    width = std::max(width, items[i].size());
  }

  std::string body = "tensor(";
  if (shape.size() == 0) {
    body += items.front();
  } else if (numel == 0) {
    body += "[]";
    if (shape.size() > 1) {
      body += ", size=(";
      for (int d = 0; d < shape.size(); ++d) {
        if (d) body += ", ";
        body += std::to_string(shape[d]);
      }
      body += ')';
    }
  } else {
    print_dimension(body, items, shape, 0, 0, 7, width, summarise, options);
  }
  // PyTorch omits the default dtypes of float, integer and bool literals.
  if (type != ScalarType::float32 && type != ScalarType::int64 && type != ScalarType::boolean) {
    body += ", dtype=";
    body += name(type);
  }
  if (device != Device{}) body += ", device='" + device.str() + "'";
  body += ')';
  return body;
}
#endif  // TESSERA_DEFINITIONS

}  // namespace detail

/// Prints like PyTorch: `tensor([1., 2.])`, `tensor([1, 2], dtype=int32, device='cpu:1')`.
template <Dtype T, DeviceKind K>
std::ostream& operator<<(std::ostream& os, const Tensor<T, K>& tensor) {
  if (!tensor.defined()) return os << "tensor(undefined)";
  std::vector<T> host = tensor.to_vector();
  std::vector<double> values(host.size());
  std::transform(host.begin(), host.end(), values.begin(), [](const T& v) {
    if constexpr (std::is_arithmetic_v<T>) {
      return static_cast<double>(v);
    } else {
      return static_cast<double>(static_cast<float>(v));  // half, bfloat16
    }
  });
  return os << detail::format_tensor(values, scalar_type_of<T>, tensor.shape(), tensor.device());
}

}  // namespace tessera
