// The utilisation table (utilization(), GPUtil's showUtilization): the machine's NVIDIA GPUs with
// their load, memory and temperature now, each with this process's CUDA ordinal; without a driver
// an empty table whose note says why.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/tools/gpu_info.hpp"

namespace tessera::tools {

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

}  // namespace tessera::tools

#if TESSERA_DEFINITIONS
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string_view>

#include "tessera/tools/detail/nvml.hpp"
#include "tessera/tools/visible_devices.hpp"

namespace tessera::tools {

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

}  // namespace tessera::tools
#endif  // TESSERA_DEFINITIONS
