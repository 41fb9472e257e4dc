// GPU status, GPUtil-style: the machine's NVIDIA GPUs with their load, memory and temperature
// (ts::tools::utilization, NVML loaded at run time), the CUDA ordinals this process sees under
// CUDA_VISIBLE_DEVICES (ts::tools::visible_devices), and the GPU with the most free memory
// (ts::tools::select_devices). On a machine without a driver it says so and ends normally.
#include <cstdlib>
#include <iostream>

#include <tessera/tessera.hpp>
#include <tessera/tools.hpp>  // not in tessera.hpp

namespace ts = tessera;

int main() {
  std::cout << ts::tools::utilization();

  const char* mask = std::getenv("CUDA_VISIBLE_DEVICES");
  std::cout << "CUDA_VISIBLE_DEVICES: " << (mask != nullptr ? mask : "(unset)") << "\n";
  const std::vector<int> visible = ts::tools::visible_devices();
  for (std::size_t logical = 0; logical < visible.size(); ++logical) {
    std::cout << "  cuda:" << logical << " is GPU " << visible[logical] << "\n";
  }
  if (visible.empty()) {
    std::cout << "no GPU visible to this process\n";
    return 0;
  }
  const std::vector<int> best = ts::tools::select_devices(1);
  std::cout << "most free memory: cuda:" << best[0] << "\n";
}
