// Stream policies of pool_resource: how a pool learns that a freed block is no longer used by
// queued work. Host memory used by synchronous host work is reusable at once (host_stream_policy);
// CUDA memory is reused without synchronisation only on its own stream, and a block used on other
// streams returns to the pool when events recorded on those streams complete (cuda_stream_policy,
// PyTorch's scheme). Upstreams name their policy as `stream_policy`; adaptors forward it.
#pragma once

#include <concepts>
#include <stdexcept>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/detail/cuda_device_scope.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"

namespace tessera::memory {

/// What pool_resource needs from a stream policy. When `tracks_streams` is false the pool treats
/// every stream as the default one and never calls the event functions.
template <class P>
concept stream_policy = std::constructible_from<P, Device> &&
    requires(P& policy, stream_ref stream, typename P::event_type event) {
  { P::tracks_streams } -> std::convertible_to<bool>;
  { policy.record(stream) } -> std::same_as<typename P::event_type>;
  { policy.query(event) } -> std::same_as<bool>;
  policy.synchronize(event);
  policy.release(event);
};

/// Synchronous work (the CPU today): all streams are one, a freed block is reusable at once and
/// record_stream has nothing to wait for.
struct host_stream_policy {
  static constexpr bool tracks_streams = false;
  using event_type = int;

  explicit host_stream_policy(Device) noexcept {}
  event_type record(stream_ref) noexcept { return 0; }
  bool query(event_type) noexcept { return true; }
  void synchronize(event_type) noexcept {}
  void release(event_type) noexcept {}
};

#if TESSERA_CUDA
/// CUDA events from a per-pool free list (cudaEventDisableTiming: the cheapest kind), created on
/// the pool's device. Events are only ever recorded on streams of that device.
class cuda_stream_policy {
 public:
  static constexpr bool tracks_streams = true;
  using event_type = cudaEvent_t;

  /// `device` must be a CUDA device; throws std::invalid_argument naming it otherwise.
  explicit cuda_stream_policy(Device device) : device_(device.index) {
    if (!device.is_cuda()) {
      throw std::invalid_argument("cuda_stream_policy: events need a CUDA device, not " +
                                  device.str());
    }
  }
  ~cuda_stream_policy() {
    for (cudaEvent_t event : free_events_) (void)cudaEventDestroy(event);
  }
  cuda_stream_policy(const cuda_stream_policy&) = delete;
  cuda_stream_policy& operator=(const cuda_stream_policy&) = delete;

  /// Records an event on `stream` (a stream of this device); throws cuda_error. A Stream whose
  /// last handle went before the block was freed left its cudaStream_t to the next Stream (core/
  /// stream.hpp), so the handle is still valid. Should the runtime still refuse the stream (a
  /// context torn down), its work is waited for with the whole device's, and the event marks a
  /// point after it.
  event_type record(stream_ref stream) {
    tessera::detail::cuda_device_scope scope(device_);
    cudaEvent_t event = nullptr;
    if (free_events_.empty()) {
      TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } else {
      event = free_events_.back();
      free_events_.pop_back();
    }
    cudaError_t status = cudaEventRecord(event, stream.native());
    if (status == cudaErrorInvalidResourceHandle || status == cudaErrorContextIsDestroyed) {
      (void)cudaGetLastError();
      status = cudaDeviceSynchronize();
      if (status == cudaSuccess) status = cudaEventRecord(event, nullptr);
    }
    if (status != cudaSuccess) {
      release(event);
      tessera::detail::throw_cuda_error(status, "cudaEventRecord(event, stream)", __FILE__,
                                        __LINE__);
    }
    return event;
  }
  /// True when the work before the event has completed; throws cuda_error on a failed query.
  bool query(event_type event) {
    return tessera::detail::cuda_query_done(cudaEventQuery(event), "cudaEventQuery(event)");
  }
  void synchronize(event_type event) { TESSERA_CUDA_CHECK(cudaEventSynchronize(event)); }
  /// Returns the event to the free list (or destroys it if the list cannot grow).
  void release(event_type event) noexcept {
    try {
      free_events_.push_back(event);
    } catch (...) {
      (void)cudaEventDestroy(event);
    }
  }

 private:
  int device_;
  std::vector<cudaEvent_t> free_events_;
};
#endif

namespace detail {
template <class Upstream>
struct default_stream_policy {
  using type = host_stream_policy;
};
template <class Upstream>
requires requires { typename Upstream::stream_policy; }
struct default_stream_policy<Upstream> {
  using type = typename Upstream::stream_policy;
};
}  // namespace detail

/// The stream policy an upstream asks for (`Upstream::stream_policy`), host_stream_policy if none.
template <class Upstream>
using default_stream_policy_t = typename detail::default_stream_policy<Upstream>::type;

}  // namespace tessera::memory
