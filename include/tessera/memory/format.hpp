// Human-readable byte counts ("512 B", "2.00 MiB") for OOM messages, memory summaries and the
// tensor layer's messages. Binary units, two decimals, as PyTorch's allocator prints them, except
// that a unit is used from 1.00 of it (PyTorch prints 1 MiB as "1024.00 KiB").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tessera::memory {

/// Formats a byte count: below 1 KiB as "N B", otherwise with two decimals in the largest binary
/// unit that is at least 1 ("1.50 KiB", "2.00 MiB", "79.10 GiB", up to PiB). Never throws except
/// std::bad_alloc.
inline std::string format_bytes(std::size_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[48];
  std::snprintf(text, sizeof text, "%.2f %s", value, units[unit]);
  return text;
}

}  // namespace tessera::memory
