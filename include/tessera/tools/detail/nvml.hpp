// NVML at run time for the GPU tools: libnvidia-ml.so.1 (part of the driver) is opened with dlopen
// on first use and its few entry points found with dlsym, so nothing links against it and nvml.h
// is not needed; query_gpus lists the GPUs as gpu_info rows, or says why there are none.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/tools/gpu_info.hpp"

namespace tessera::tools::detail {

/// The GPUs through NVML, with cuda_ordinal unset; `note` says why when the list is empty.
TESSERA_API std::vector<gpu_info> query_gpus(std::string& note);

}  // namespace tessera::tools::detail

#if TESSERA_DEFINITIONS
#include <cstdint>
#include <utility>

#include <dlfcn.h>

namespace tessera::tools::detail {

/// The few NVML entry points used here, declared as in nvml.h (so that the toolkit's header is
/// not needed) and found with dlsym in libnvidia-ml.so.1, loaded once per process.
struct nvml_api {
  using device_handle = struct nvml_device*;
  struct memory_info {
    unsigned long long total, free, used;
  };
  struct utilization_rates {
    unsigned int gpu, memory;
  };
  static constexpr int success = 0;              // NVML_SUCCESS
  static constexpr int temperature_gpu = 0;      // NVML_TEMPERATURE_GPU
  static constexpr unsigned int text_size = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE, ..._UUID_V2_...

  int (*init)() = nullptr;
  int (*device_count)(unsigned int*) = nullptr;
  int (*handle_by_index)(unsigned int, device_handle*) = nullptr;
  int (*name)(device_handle, char*, unsigned int) = nullptr;
  int (*uuid)(device_handle, char*, unsigned int) = nullptr;
  int (*memory)(device_handle, memory_info*) = nullptr;
  int (*utilization)(device_handle, utilization_rates*) = nullptr;
  int (*temperature)(device_handle, int, unsigned int*) = nullptr;
  const char* (*error_string)(int) = nullptr;

  std::string failure;  // empty when loaded and initialised

  std::string error_text(int code) const {
    const char* text = error_string != nullptr ? error_string(code) : nullptr;
    return text != nullptr ? std::string(text) : "error " + std::to_string(code);
  }

  static const nvml_api& instance() {
    static const nvml_api api = load();
    return api;
  }

 private:
  template <class Function>
  static bool find(void* library, const char* symbol, Function& function, std::string& failure) {
    void* address = ::dlsym(library, symbol);
    if (address == nullptr) {
      if (failure.empty()) failure = std::string("NVML has no ") + symbol + " (driver too old?)";
      return false;
    }
    function = reinterpret_cast<Function>(address);
    return true;
  }

  static nvml_api load() {
    nvml_api api;
    // Never closed: NVML stays initialised for the process, as GPUtil's nvidia-smi calls would.
    void* library = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = ::dlerror();
      api.failure = "no NVIDIA driver: libnvidia-ml.so.1 not found";
      if (why != nullptr) api.failure += std::string(" (") + why + ")";
      return api;
    }
    std::string& failure = api.failure;
    find(library, "nvmlErrorString", api.error_string, failure);
    const bool found =
        find(library, "nvmlInit_v2", api.init, failure) &&
        find(library, "nvmlDeviceGetCount_v2", api.device_count, failure) &&
        find(library, "nvmlDeviceGetHandleByIndex_v2", api.handle_by_index, failure) &&
        find(library, "nvmlDeviceGetName", api.name, failure) &&
        find(library, "nvmlDeviceGetUUID", api.uuid, failure) &&
        find(library, "nvmlDeviceGetMemoryInfo", api.memory, failure) &&
        find(library, "nvmlDeviceGetUtilizationRates", api.utilization, failure) &&
        find(library, "nvmlDeviceGetTemperature", api.temperature, failure);
    if (!found) return api;
    if (const int code = api.init(); code != success) {
      api.failure = "NVML could not start: nvmlInit_v2: " + api.error_text(code);
    }
    return api;
  }
};

TESSERA_API std::vector<gpu_info> query_gpus(std::string& note) {
  const nvml_api& nvml = nvml_api::instance();
  std::vector<gpu_info> gpus;
  note.clear();
  if (!nvml.failure.empty()) {
    note = nvml.failure;
    return gpus;
  }
  unsigned int count = 0;
  if (const int code = nvml.device_count(&count); code != nvml_api::success) {
    note = "NVML: nvmlDeviceGetCount_v2: " + nvml.error_text(code);
    return gpus;
  }
  for (unsigned int index = 0; index < count; ++index) {
    gpu_info gpu;
    gpu.index = static_cast<int>(index);
    nvml_api::device_handle handle = nullptr;
    if (const int code = nvml.handle_by_index(index, &handle); code != nvml_api::success) {
      gpu.name = "(inaccessible: " + nvml.error_text(code) + ")";  // e.g. no permission
      gpus.push_back(std::move(gpu));
      continue;
    }
    char text[nvml_api::text_size] = {};
    if (nvml.name(handle, text, sizeof text) == nvml_api::success) gpu.name = text;
    char uuid[nvml_api::text_size] = {};
    if (nvml.uuid(handle, uuid, sizeof uuid) == nvml_api::success) gpu.uuid = uuid;
    nvml_api::memory_info memory{};
    if (nvml.memory(handle, &memory) == nvml_api::success) {
      gpu.memory_total = static_cast<std::int64_t>(memory.total);
      gpu.memory_free = static_cast<std::int64_t>(memory.free);
      gpu.memory_used = static_cast<std::int64_t>(memory.used);
    }
    nvml_api::utilization_rates rates{};
    if (nvml.utilization(handle, &rates) == nvml_api::success) {
      gpu.load = static_cast<int>(rates.gpu);
    }
    unsigned int celsius = 0;
    if (nvml.temperature(handle, nvml_api::temperature_gpu, &celsius) == nvml_api::success) {
      gpu.temperature = static_cast<int>(celsius);
    }
    gpus.push_back(std::move(gpu));
  }
  if (gpus.empty()) note = "NVML found no GPU";
  return gpus;
}

}  // namespace tessera::tools::detail
#endif  // TESSERA_DEFINITIONS
