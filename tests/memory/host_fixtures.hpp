// Fixtures of the pool suite for host memory: a pool straight over host_memory_resource and one
// over limit_resource_adaptor<host_memory_resource> (the default CPU device pool).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "tessera/core/device.hpp"
#include "tessera/memory/host_memory_resource.hpp"
#include "tessera/memory/limit_resource_adaptor.hpp"
#include "tessera/memory/pool.hpp"

namespace host_fixtures {

inline void fill(void* pointer, std::size_t bytes, std::uint8_t pattern) {
  std::memset(pointer, pattern, bytes);
}

inline bool holds(const void* pointer, std::size_t bytes, std::uint8_t pattern) {
  static thread_local unsigned char reference[64 * 1024];
  std::memset(reference, pattern, sizeof reference);
  const auto* bytes_at = static_cast<const unsigned char*>(pointer);
  for (std::size_t offset = 0; offset < bytes; offset += sizeof reference) {
    std::size_t chunk = std::min(sizeof reference, bytes - offset);
    if (std::memcmp(bytes_at + offset, reference, chunk) != 0) return false;
  }
  return true;
}

struct host {
  using pool_type = tessera::memory::pool_resource<tessera::memory::host_memory_resource>;
  static constexpr bool has_limit = false;
  static tessera::Device device() { return tessera::Device{tessera::DeviceType::cpu, 0}; }
  static std::unique_ptr<pool_type> make() { return std::make_unique<pool_type>(device()); }
  static void fill(void* p, std::size_t n, std::uint8_t v) { host_fixtures::fill(p, n, v); }
  static bool holds(const void* p, std::size_t n, std::uint8_t v) {
    return host_fixtures::holds(p, n, v);
  }
};

struct limited_host {
  using pool_type = tessera::memory::pool_resource<
      tessera::memory::limit_resource_adaptor<tessera::memory::host_memory_resource>>;
  static constexpr bool has_limit = true;
  static tessera::Device device() { return tessera::Device{tessera::DeviceType::cpu, 1}; }
  static std::unique_ptr<pool_type> make() { return std::make_unique<pool_type>(device()); }
  static void fill(void* p, std::size_t n, std::uint8_t v) { host_fixtures::fill(p, n, v); }
  static bool holds(const void* p, std::size_t n, std::uint8_t v) {
    return host_fixtures::holds(p, n, v);
  }
};

}  // namespace host_fixtures
