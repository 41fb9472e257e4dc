// select_devices: the CUDA ordinals of the visible GPUs with the most free memory, to hand to
// cuda::set_device or a DataParallel's device list; the choice itself
// (detail::select_by_free_memory) is pure and tested without a GPU.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/tools/gpu_info.hpp"

namespace tessera::tools {

/// The CUDA ordinals (as this process numbers them, under CUDA_VISIBLE_DEVICES) of the `n`
/// visible GPUs with the most free memory, most free first (ties: the lower ordinal first), to
/// pass to cuda::set_device or a DataParallel's device list. Throws device_error naming `n` and
/// the count when fewer than `n` GPUs are visible (also without a driver, naming why), and
/// std::invalid_argument for a negative `n`.
TESSERA_API std::vector<int> select_devices(int n);

namespace detail {

/// select_devices' choice among `gpus` (rows by physical index, with memory_free) given the
/// logical-to-physical mapping `visible`: the logical ordinals of the `n` with the most free
/// memory. `why_none` is appended to the error when no GPU is visible. Pure.
TESSERA_API std::vector<int> select_by_free_memory(const std::vector<gpu_info>& gpus,
                                                   const std::vector<int>& visible, int n,
                                                   const std::string& why_none = {});

}  // namespace detail

}  // namespace tessera::tools

#if TESSERA_DEFINITIONS
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "tessera/core/error.hpp"
#include "tessera/tools/detail/nvml.hpp"
#include "tessera/tools/visible_devices.hpp"

namespace tessera::tools {

namespace detail {

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

}  // namespace detail

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
