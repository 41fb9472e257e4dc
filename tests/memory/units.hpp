// Byte units and the two virtual CPU devices that the memory tests share (one definition, so the
// test files can also be compiled together in one unity translation unit).
#pragma once

#include <cstddef>

#include "tessera/core/device.hpp"

namespace memory_test_units {
inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;
inline const tessera::Device cpu0{tessera::DeviceType::cpu, 0};
inline const tessera::Device cpu1{tessera::DeviceType::cpu, 1};
}  // namespace memory_test_units
