// What tests/cuda_gxx's programs return, shared by the g++ unit and its nvcc twin.
#pragma once

#include <vector>

namespace cuda_gxx_test {
/// Per step: the loss; at the end: every parameter (and buffer), flattened.
struct run_result {
  std::vector<double> losses;
  std::vector<double> parameters;
};
}  // namespace cuda_gxx_test
