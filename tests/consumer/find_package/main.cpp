// An installed Tessera, used the way the README tells users to: one include, `ts::`.
#include <tessera/tessera.hpp>

#include "../training_step.hpp"

#include <iostream>

namespace ts = tessera;

int main() {
  const ts::Device host = ts::Device::parse("cpu");
  std::cout << "devices: " << host.str() << " (" << ts::cpu::device_count() << " virtual), cuda "
            << (ts::cuda::is_available() ? "available" : "not available") << "\n";

  auto x = ts::ones<float>({2, 3});
  std::cout << x << "\n";
  if (x.numel() != 6 || x.to_vector() != std::vector<float>(6, 1.0f)) {
    std::cerr << "find_package consumer: ones({2, 3}) is wrong\n";
    return 1;
  }
  if (!loss_falls(x, "find_package consumer")) return 1;
  std::cout << "find_package consumer: ok\n";
  return 0;
}
