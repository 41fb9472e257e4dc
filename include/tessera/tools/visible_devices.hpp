// The logical-to-physical mapping of CUDA ordinals under CUDA_VISIBLE_DEVICES (visible_devices),
// read as CUDA reads the variable (detail::parse_visible_devices, pure, tested without a GPU)
// over the GPUs NVML finds.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/tools/gpu_info.hpp"

namespace tessera::tools {

/// The logical-to-physical mapping of CUDA ordinals in this process: element i is the NVML index
/// of the GPU that this process calls cuda:i. CUDA_VISIBLE_DEVICES unset: every GPU NVML sees,
/// in order. Set: its comma-separated entries, each a physical index or a GPU UUID ("GPU-..."; a
/// unique prefix is enough), up to the first entry CUDA would refuse (not a number, out of range,
/// a repeat, an unknown or ambiguous UUID), as CUDA reads it; "" or "-1" hide every GPU. Without
/// a driver: empty. NVML numbers GPUs in PCI bus order; CUDA does too under
/// CUDA_DEVICE_ORDER=PCI_BUS_ID (its default orders the fastest first, which is the same order on
/// machines with identical GPUs).
TESSERA_API std::vector<int> visible_devices();

namespace detail {

/// CUDA_VISIBLE_DEVICES as CUDA reads it (see visible_devices): `text` is the variable's value
/// (nullptr: unset), `physical_count` the number of GPUs, `uuids` their UUIDs by physical index
/// (may be empty when unknown: UUID entries then end the list). Pure: no NVML, no environment.
TESSERA_API std::vector<int> parse_visible_devices(const char* text, int physical_count,
                                                   const std::vector<std::string>& uuids);

}  // namespace detail

}  // namespace tessera::tools

#if TESSERA_DEFINITIONS
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string_view>

#include "tessera/tools/detail/nvml.hpp"

namespace tessera::tools {

namespace detail {

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

// The mapping for the GPUs NVML found, from this process's CUDA_VISIBLE_DEVICES.
inline std::vector<int> visible_among(const std::vector<gpu_info>& gpus) {
  std::vector<std::string> uuids;
  for (const gpu_info& gpu : gpus) uuids.push_back(gpu.uuid);
  return parse_visible_devices(std::getenv("CUDA_VISIBLE_DEVICES"), static_cast<int>(gpus.size()),
                               uuids);
}

}  // namespace detail

TESSERA_API std::vector<int> visible_devices() {
  std::string note;
  return detail::visible_among(detail::query_gpus(note));
}

}  // namespace tessera::tools
#endif  // TESSERA_DEFINITIONS
