// What the channels_last tests share (tests/nn, tests/autograd, tests/cuda): NHWC strides written
// out, reproducible sample tensors, and a comparison against float64 NCHW results.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

#include "element_check.hpp"
#include "tessera/tessera.hpp"

namespace tessera_test {

/// The NHWC strides of a 4-d shape [N, C, H, W]: (H·W·C, 1, W·C, C).
inline tessera::Strides nhwc_strides(const tessera::Shape& s) {
  return tessera::Strides{s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
}

/// Values in [-1, 1] from an LCG, in logical (NCHW, row-major) order, as T on the CPU.
template <class T>
tessera::Tensor<T> sample(const tessera::Shape& shape, std::uint64_t seed) {
  std::vector<T> host(static_cast<std::size_t>(shape.numel()));
  std::uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& v : host) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<T>(-1.0 + 2.0 * static_cast<double>(state >> 11) * 0x1.0p-53);
  }
  return tessera::from_vector<T>(host, shape);
}

/// |actual - expected| <= tol * (1 + |expected|) everywhere, both read in logical order (actual
/// in any layout, dtype and device; expected float64), in one assertion naming the first failure.
template <class T, class K>
void check_close(const tessera::Tensor<T, K>& actual, const tessera::Tensor<double>& expected,
                 double tol) {
  REQUIRE(actual.shape() == expected.shape());
  const auto a = actual.to_vector();
  const auto e = expected.to_vector();
  check_each(
      a.size(),
      [&](std::size_t i) {
        return std::fabs(static_cast<double>(a[i]) - e[i]) <= tol * (1.0 + std::fabs(e[i]));
      },
      [&](std::ostream& out, std::size_t i) {
        out << "got " << static_cast<double>(a[i]) << ", expected " << e[i];
      });
}

/// The same for a CPU tensor of any floating dtype behind an AnyTensor.
inline void check_close(const tessera::AnyTensor& actual, const tessera::Tensor<double>& expected,
                        double tol) {
  check_close(actual.to(tessera::ScalarType::float64).as<double>(), expected, tol);
}

}  // namespace tessera_test
