// Tessera pulled in with FetchContent, used the way the README tells users to.
#include <tessera/tessera.hpp>

#include "../training_step.hpp"

#include <iostream>

namespace ts = tessera;

int main() {
  const auto device = ts::Device::parse("cpu:0");
  auto x = ts::arange<float>(6).reshape({2, 3});
  std::cout << "on " << device.str() << ":\n" << x << "\n";
  const std::vector<float> expected{0, 1, 2, 3, 4, 5};
  if (x.shape() != ts::Shape{2, 3} || x.to_vector() != expected) {
    std::cerr << "fetchcontent consumer: arange(6).reshape({2, 3}) is wrong\n";
    return 1;
  }
  if (!loss_falls(x, "fetchcontent consumer")) return 1;
  std::cout << "fetchcontent consumer: ok\n";
  return 0;
}
