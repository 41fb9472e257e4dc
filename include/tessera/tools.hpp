// GPU tools (DESIGN §3.8), in the spirit of GPUtil: a utilisation table of the machine's NVIDIA
// GPUs, the devices with the most free memory, and the logical-to-physical ordinals under
// CUDA_VISIBLE_DEVICES. NVML (libnvidia-ml.so.1, part of the driver) is loaded at run time, so a
// program that uses these builds and runs on machines without a driver: there the table says so
// and there are no devices. One header per tool in tools/; not in tessera.hpp.
#pragma once

#include "tessera/tools/gpu_info.hpp"
#include "tessera/tools/profile.hpp"
#include "tessera/tools/select_devices.hpp"
#include "tessera/tools/utilization.hpp"
#include "tessera/tools/visible_devices.hpp"
