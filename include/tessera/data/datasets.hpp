// Small real data sets for examples and tests: load_digits, scikit-learn's handwritten digits
// (1797 8x8 images, the UCI "optdigits" test set), from the safetensors file that
// examples/data/make_digits.py writes from scikit-learn's bundled copy.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/data/data_loader.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::data {

/// The digits data set: `images` [N, 64] (each 8x8 image flattened row by row), `labels` [N]
/// (0..9), on cpu:0.
template <Dtype T = float>
struct Digits {
  Tensor<T, cpu> images;
  Tensor<std::int64_t, cpu> labels;

  std::int64_t size() const { return labels.numel(); }
  /// The examples [first, first + count) as a TensorDataset (views of these tensors).
  TensorDataset<T, std::int64_t> dataset(std::int64_t first = 0, std::int64_t count = -1) const {
    if (count < 0) count = size() - first;
    if (first < 0 || count < 0 || first + count > size()) {
      throw std::invalid_argument("Digits::dataset: examples [" + std::to_string(first) + ", " +
                                  std::to_string(first + count) + ") of " + std::to_string(size()));
    }
    return TensorDataset<T, std::int64_t>(images.narrow(0, first, count),
                                          labels.narrow(0, first, count));
  }
};

/// scikit-learn's load_digits from `path` (examples/data/digits.safetensors in Tessera's
/// source tree): pixel values 0..16 as T, divided by 16 when `scale` (to [0, 1]). Throws
/// io_error for a missing or damaged file (ts::load's errors) and tessera::error naming the
/// entry when the file is not a digits file (entries "images" uint8 [N, 8, 8] and "labels"
/// int64 [N] with values 0..9).
template <Dtype T = float>
Digits<T> load_digits(const std::string& path, bool scale = true) {
  const StateDict file = load(path);
  const std::string what = "load_digits(" + path + ")";
  if (!file.contains("images") || !file.contains("labels")) {
    throw error(what +
                ": no \"images\" and \"labels\" entries (not a digits file; "
                "examples/data/make_digits.py writes one)");
  }
  const AnyTensor& images = file.at("images");
  const AnyTensor& labels = file.at("labels");
  if (images.dtype() != ScalarType::uint8 || images.dim() != 3 || images.shape()[1] != 8 ||
      images.shape()[2] != 8) {
    throw error(what + ": images are " + std::string(name(images.dtype())) + " " +
                images.shape().str() + ", expected uint8 [N, 8, 8]");
  }
  if (labels.dtype() != ScalarType::int64 || labels.dim() != 1 ||
      labels.shape()[0] != images.shape()[0]) {
    throw error(what + ": labels are " + std::string(name(labels.dtype())) + " " +
                labels.shape().str() + ", expected int64 [" + std::to_string(images.shape()[0]) +
                "]");
  }
  Digits<T> out;
  out.labels = labels.as<std::int64_t>();
  for (const std::int64_t label : out.labels.to_vector()) {
    if (label < 0 || label > 9) {
      throw error(what + ": a label is " + std::to_string(label) + ", expected 0..9");
    }
  }
  const std::int64_t n = images.shape()[0];
  Tensor<T, cpu> pixels = images.as<std::uint8_t>().template to<T>().view({n, 64});
  if (scale) pixels = eval(pixels / T(16));
  out.images = pixels;
  return out;
}

}  // namespace tessera::data
