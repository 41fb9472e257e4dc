// For the parallel wrappers' tests: deterministic training data (inputs spread over [-2.5, 2.5]
// and labels of 3 classes, both a pure function of (shape, seed), so a wrapper and its one-device
// reference see the same batch), and a relative comparison of lists of tensors' values.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/tensor/factories.hpp"
#include "tessera/tensor/tensor.hpp"

namespace training_data {

template <class T>
tessera::Tensor<T> inputs_of(std::int64_t rows, std::int64_t columns, int seed) {
  std::vector<T> values(static_cast<std::size_t>(rows * columns));
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<T>((static_cast<int>(i) * 7919 + seed * 104729) % 2001 - 1000) /
                static_cast<T>(400);
  }
  return tessera::from_vector<T>(values, {rows, columns});
}

inline tessera::Tensor<std::int64_t> labels_of(std::int64_t rows, int seed) {
  std::vector<std::int64_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < labels.size(); ++i) {
    labels[i] = static_cast<std::int64_t>((i * 5 + static_cast<std::size_t>(seed)) % 3);
  }
  return tessera::from_vector<std::int64_t>(labels, {rows});
}

/// Each got[t][i] within tol * (1 + |want[t][i]|) of want[t][i].
inline void check_close(const std::vector<std::vector<double>>& got,
                        const std::vector<std::vector<double>>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t t = 0; t < got.size(); ++t) {
    REQUIRE(got[t].size() == want[t].size());
    for (std::size_t i = 0; i < got[t].size(); ++i) {
      INFO("tensor " << t << ", element " << i);
      CHECK(std::abs(got[t][i] - want[t][i]) <= tol * (1.0 + std::abs(want[t][i])));
    }
  }
}

}  // namespace training_data
