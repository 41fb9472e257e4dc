// One NVIDIA GPU as NVML reports it (gpu_info): the row type of the GPU tools, filled by
// tools/detail/nvml.hpp and read by utilization() (tools/utilization.hpp) and select_devices()
// (tools/select_devices.hpp).
#pragma once

#include <cstdint>
#include <string>

namespace tessera::tools {

/// One GPU as NVML reports it. Memory is in bytes; a value NVML cannot give (a GPU without a
/// temperature sensor, a MIG-enabled one without utilisation) is -1.
struct gpu_info {
  int index = 0;  ///< NVML's (physical) index: PCI bus order, as nvidia-smi numbers them
  /// This process's CUDA ordinal of the GPU; -1 if CUDA_VISIBLE_DEVICES hides it.
  int cuda_ordinal = -1;
  std::string name;  ///< e.g. "NVIDIA H100 80GB HBM3"
  std::string uuid;  ///< "GPU-8932f937-..." (what CUDA_VISIBLE_DEVICES may name)
  int load = -1;     ///< percent of the last sample period in which a kernel ran (0-100)
  std::int64_t memory_used = -1;
  std::int64_t memory_total = -1;
  std::int64_t memory_free = -1;
  int temperature = -1;  ///< degrees Celsius (the GPU die)
};

}  // namespace tessera::tools
