// A non-owning reference to a stream of work on a device. On CUDA it wraps a cudaStream_t (null
// is the legacy default stream); CPU work is synchronous today, so a CPU stream_ref is always the
// default one. Memory resources take a stream_ref in allocate/deallocate, as RMM and cuda::mr do.
#pragma once

#include <compare>
#include <cstdint>

#include "tessera/core/config.hpp"

namespace tessera {

struct stream_ref {
  void* handle = nullptr;

  constexpr stream_ref() = default;
  constexpr explicit stream_ref(void* native) : handle(native) {}
#if TESSERA_CUDA
  constexpr stream_ref(cudaStream_t native) : handle(static_cast<void*>(native)) {}
  cudaStream_t native() const noexcept { return static_cast<cudaStream_t>(handle); }
#endif

  constexpr bool is_default() const noexcept { return handle == nullptr; }
  friend constexpr auto operator<=>(const stream_ref& a, const stream_ref& b) {
    return reinterpret_cast<std::uintptr_t>(a.handle) <=> reinterpret_cast<std::uintptr_t>(b.handle);
  }
  friend constexpr bool operator==(const stream_ref&, const stream_ref&) = default;
};

/// The default stream of any device.
inline constexpr stream_ref default_stream{};

}  // namespace tessera
