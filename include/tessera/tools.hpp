// GPU tools (DESIGN §3.8), in the spirit of GPUtil: a utilisation table of the machine's NVIDIA
// GPUs, the devices with the most free memory, and the logical-to-physical ordinals under
// CUDA_VISIBLE_DEVICES. NVML (libnvidia-ml.so.1, part of the driver) is loaded at run time, so a
// program that uses these builds and runs on machines without a driver: there the table says so
// and there are no devices.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tessera/core/config.hpp"

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

/// What utilization() found: a row per GPU, or none and a note saying why.
struct utilization_table {
  std::vector<gpu_info> gpus;
  /// Empty when NVML answered and found GPUs; otherwise why `gpus` is empty ("no NVIDIA driver:
  /// libnvidia-ml.so.1 not found", "NVML found no GPU", NVML's error text).
  std::string note;

  /// The table, one GPU per line (ID, CUDA ordinal, name, load, memory used/total in MiB,
  /// temperature), or the note.
  std::string str() const;
  friend std::ostream& operator<<(std::ostream& os, const utilization_table& table) {
    return os << table.str();
  }
};

/// The machine's NVIDIA GPUs with their load, memory and temperature now, through NVML (GPUtil's
/// showUtilization). Never throws for a missing driver or a machine without GPUs: the table is
/// then empty and its note says which. Throws std::bad_alloc only.
TESSERA_API utilization_table utilization();

/// The logical-to-physical mapping of CUDA ordinals in this process: element i is the NVML index
/// of the GPU that this process calls cuda:i. CUDA_VISIBLE_DEVICES unset: every GPU NVML sees,
/// in order. Set: its comma-separated entries, each a physical index or a GPU UUID ("GPU-..."; a
/// unique prefix is enough), up to the first entry CUDA would refuse (not a number, out of range,
/// a repeat, an unknown or ambiguous UUID), as CUDA reads it; "" or "-1" hide every GPU. Without
/// a driver: empty. NVML numbers GPUs in PCI bus order; CUDA does too under
/// CUDA_DEVICE_ORDER=PCI_BUS_ID (its default orders the fastest first, which is the same order on
/// machines with identical GPUs).
TESSERA_API std::vector<int> visible_devices();

/// The CUDA ordinals (as this process numbers them, under CUDA_VISIBLE_DEVICES) of the `n`
/// visible GPUs with the most free memory, most free first (ties: the lower ordinal first), to
/// pass to cuda::set_device or a DataParallel's device list. Throws device_error naming `n` and
/// the count when fewer than `n` GPUs are visible (also without a driver, naming why), and
/// std::invalid_argument for a negative `n`.
TESSERA_API std::vector<int> select_devices(int n);

namespace detail {

/// CUDA_VISIBLE_DEVICES as CUDA reads it (see visible_devices): `text` is the variable's value
/// (nullptr: unset), `physical_count` the number of GPUs, `uuids` their UUIDs by physical index
/// (may be empty when unknown: UUID entries then end the list). Pure: no NVML, no environment.
TESSERA_API std::vector<int> parse_visible_devices(const char* text, int physical_count,
                                                   const std::vector<std::string>& uuids);

/// select_devices' choice among `gpus` (rows by physical index, with memory_free) given the
/// logical-to-physical mapping `visible`: the logical ordinals of the `n` with the most free
/// memory. `why_none` is appended to the error when no GPU is visible. Pure.
TESSERA_API std::vector<int> select_by_free_memory(const std::vector<gpu_info>& gpus,
                                                   const std::vector<int>& visible, int n,
                                                   const std::string& why_none = {});

/// The GPUs through NVML, with cuda_ordinal unset; `note` says why when the list is empty.
TESSERA_API std::vector<gpu_info> query_gpus(std::string& note);

}  // namespace detail

}  // namespace tessera::tools

#if TESSERA_DEFINITIONS
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include <dlfcn.h>

#include "tessera/core/error.hpp"

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

TESSERA_API std::vector<int> parse_visible_devices(const char* text, int physical_count,
                                                   const std::vector<std::string>& uuids) {
  std::vector<int> visible;
  if (text == nullptr) {
    for (int index = 0; index < physical_count; ++index) visible.push_back(index);
    return visible;
  }
  std::string_view rest(text);
  while (true) {
    const std::size_t comma = rest.find(',');
    std::string_view entry = rest.substr(0, comma);
    while (!entry.empty() && (entry.front() == ' ' || entry.front() == '\t'))
      entry.remove_prefix(1);
    while (!entry.empty() && (entry.back() == ' ' || entry.back() == '\t')) entry.remove_suffix(1);
    int physical = -1;
    if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string_view::npos) {
      if (entry.size() <= 9) physical = std::stoi(std::string(entry));
      if (physical >= physical_count) physical = -1;
    } else if (entry.size() > 4 && entry.substr(0, 4) == "GPU-") {
      for (std::size_t index = 0; index < uuids.size(); ++index) {
        if (std::string_view(uuids[index]).substr(0, entry.size()) != entry) continue;
        if (physical != -1) {  // a prefix of two UUIDs names no GPU
          physical = -1;
          break;
        }
        physical = static_cast<int>(index);
      }
      if (physical >= physical_count) physical = -1;
    }
    // CUDA ends the list at the first entry it cannot use.
    if (physical < 0 || std::find(visible.begin(), visible.end(), physical) != visible.end()) break;
    visible.push_back(physical);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return visible;
}

TESSERA_API std::vector<int> select_by_free_memory(const std::vector<gpu_info>& gpus,
                                                   const std::vector<int>& visible, int n,
                                                   const std::string& why_none) {
  if (n < 0) {
    throw std::invalid_argument("tools::select_devices(" + std::to_string(n) +
                                "): the number of devices must not be negative");
  }
  if (static_cast<std::size_t>(n) > visible.size()) {
    std::string message = "tools::select_devices(" + std::to_string(n) + "): " + std::to_string(n) +
                          " GPU(s) asked for, " + std::to_string(visible.size()) +
                          " visible to this process";
    if (visible.empty() && !why_none.empty()) message += " (" + why_none + ")";
    throw device_error(message);
  }
  auto free_memory = [&](int logical) -> std::int64_t {
    const int physical = visible[static_cast<std::size_t>(logical)];
    for (const gpu_info& gpu : gpus) {
      if (gpu.index == physical) return gpu.memory_free;
    }
    return -1;
  };
  std::vector<int> logical(visible.size());
  for (std::size_t i = 0; i < logical.size(); ++i) logical[i] = static_cast<int>(i);
  std::stable_sort(logical.begin(), logical.end(),
                   [&](int a, int b) { return free_memory(a) > free_memory(b); });
  logical.resize(static_cast<std::size_t>(n));
  return logical;
}

}  // namespace tessera::tools::detail

namespace tessera::tools {

namespace detail {
// The mapping for the GPUs NVML found, from this process's CUDA_VISIBLE_DEVICES.
inline std::vector<int> visible_among(const std::vector<gpu_info>& gpus) {
  std::vector<std::string> uuids;
  for (const gpu_info& gpu : gpus) uuids.push_back(gpu.uuid);
  return parse_visible_devices(std::getenv("CUDA_VISIBLE_DEVICES"), static_cast<int>(gpus.size()),
                               uuids);
}
}  // namespace detail

TESSERA_API std::string utilization_table::str() const {
  if (gpus.empty()) return note.empty() ? std::string("no GPU\n") : note + "\n";
  std::size_t name_width = 4;
  for (const gpu_info& gpu : gpus) name_width = std::max(name_width, gpu.name.size());
  auto number = [](std::int64_t value, const char* unit) {
    return value < 0 ? std::string("?") : std::to_string(value) + unit;
  };
  char line[512];
  std::snprintf(line, sizeof line, "| %2s | %4s | %-*s | %5s | %21s | %5s |\n", "ID", "CUDA",
                static_cast<int>(name_width), "Name", "Load", "Memory used / total", "Temp");
  std::string out = line;
  out += "|" + std::string(std::string_view(line).size() - 3, '-') + "|\n";
  for (const gpu_info& gpu : gpus) {
    const std::string cuda = gpu.cuda_ordinal < 0 ? "-" : std::to_string(gpu.cuda_ordinal);
    const std::string memory =
        (gpu.memory_used < 0 ? std::string("?") : std::to_string(gpu.memory_used >> 20)) + " / " +
        (gpu.memory_total < 0 ? std::string("?") : std::to_string(gpu.memory_total >> 20)) + " MiB";
    std::snprintf(line, sizeof line, "| %2d | %4s | %-*s | %5s | %21s | %5s |\n", gpu.index,
                  cuda.c_str(), static_cast<int>(name_width), gpu.name.c_str(),
                  number(gpu.load, "%").c_str(), memory.c_str(),
                  number(gpu.temperature, " C").c_str());
    out += line;
  }
  if (!note.empty()) out += note + "\n";
  return out;
}

TESSERA_API utilization_table utilization() {
  utilization_table table;
  table.gpus = detail::query_gpus(table.note);
  const std::vector<int> visible = detail::visible_among(table.gpus);
  for (std::size_t logical = 0; logical < visible.size(); ++logical) {
    for (gpu_info& gpu : table.gpus) {
      if (gpu.index == visible[logical]) gpu.cuda_ordinal = static_cast<int>(logical);
    }
  }
  return table;
}

TESSERA_API std::vector<int> visible_devices() {
  std::string note;
  return detail::visible_among(detail::query_gpus(note));
}

TESSERA_API std::vector<int> select_devices(int n) {
  std::string note;
  const std::vector<gpu_info> gpus = detail::query_gpus(note);
  const std::vector<int> visible = detail::visible_among(gpus);
  std::string why_none = note;
  const char* mask = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible.empty() && !gpus.empty() && mask != nullptr) {
    why_none = "CUDA_VISIBLE_DEVICES=\"" + std::string(mask) + "\" hides all " +
               std::to_string(gpus.size()) + " GPU(s)";
  }
  return detail::select_by_free_memory(gpus, visible, n, why_none);
}

}  // namespace tessera::tools
#endif  // TESSERA_DEFINITIONS
