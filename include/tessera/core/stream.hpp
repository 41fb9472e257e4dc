// Streams and events (DESIGN §3.7). A Stream is an in-order queue of work on one device: on CUDA
// a cudaStream_t (non-blocking towards the legacy default stream); on a virtual CPU device, work
// issued by the thread that drives it, which runs synchronously, so every CPU stream is always
// idle and a CPU event marks a point already reached. The same device-agnostic code (record, wait,
// synchronize) therefore runs everywhere. Each thread has a current stream per device
// (current_stream, StreamGuard), which Tessera's kernels, copies and library calls use.
// stream_ref is the non-owning handle that memory resources take (RMM's and cuda::mr's shape).
#pragma once

#include <atomic>
#include <time.h>
#include <compare>
#include <cstdint>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/detail/cuda_device_scope.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"

namespace tessera {

/// A non-owning reference to a stream. On CUDA it wraps a cudaStream_t (null is the legacy default
/// stream); on CPU it is an identity (null for a device's default stream).
struct stream_ref {
  void* handle = nullptr;

  constexpr stream_ref() = default;
  constexpr explicit stream_ref(void* native) : handle(native) {}
#if TESSERA_CUDA
  constexpr stream_ref(cudaStream_t native) : handle(static_cast<void*>(native)) {}
  cudaStream_t native() const noexcept { return static_cast<cudaStream_t>(handle); }
#endif

  constexpr bool is_default() const noexcept { return handle == nullptr; }
  friend auto operator<=>(const stream_ref& a, const stream_ref& b) noexcept {
    return reinterpret_cast<std::uintptr_t>(a.handle) <=> reinterpret_cast<std::uintptr_t>(b.handle);
  }
  friend constexpr bool operator==(const stream_ref&, const stream_ref&) = default;
};

class Event;

/// An in-order queue of work on one device. A cheap handle: copies refer to the same queue.
/// `Stream(device)` makes a new stream; `default_stream(device)` and `current_stream(device)` name
/// existing ones. When a CUDA stream's last handle goes, its cudaStream_t is kept for the next
/// Stream of that device and priority rather than destroyed (PyTorch's streams also live as long
/// as the process): the pools keep a block's streams as raw handles (record_stream, asynchronous
/// copies from pinned memory) and record events on them when the block is freed, which must
/// stay valid after the Stream went. A recycled handle may still hold its earlier owner's work;
/// the new owner's work queues after it, as on any stream.
class Stream {
 public:
  /// The default stream of cpu:0.
  Stream() = default;

  /// A new stream on `device` (checked to exist; device_error otherwise). CUDA: a non-blocking
  /// cudaStream_t with the given priority (lower numbers run first, as CUDA's); CPU: a new queue
  /// identity, whose work still runs on the issuing thread.
  explicit Stream(Device device, int priority = 0);

  /// The default stream of `device` (no check that it exists; see default_stream()).
  static Stream default_of(Device device) noexcept {
    Stream stream;
    stream.device_ = device;
    return stream;
  }

  Device device() const noexcept { return device_; }
  stream_ref ref() const noexcept { return stream_ref{state_ ? state_->handle : nullptr}; }
  bool is_default() const noexcept { return state_ == nullptr; }
#if TESSERA_CUDA
  cudaStream_t native() const noexcept { return ref().native(); }
#endif

  /// True when every piece of work queued so far has completed (always on CPU).
  bool query() const;
  /// Blocks the calling thread until the queued work has completed.
  void synchronize() const;
  /// Work queued on this stream after the call waits for `event` (recorded on any device).
  void wait_event(const Event& event) const;
  /// Work queued on this stream after the call waits for the work queued on `other` until now.
  void wait_stream(const Stream& other) const;
  /// Records a new event at this point of the stream and returns it.
  Event record_event(bool enable_timing = false) const;

  std::string str() const {
    return "Stream(device=" + device_.str() +
           (is_default() ? ", default)" : ", id=" + std::to_string(state_->id) + ")");
  }
  friend bool operator==(const Stream& a, const Stream& b) noexcept {
    return a.device_ == b.device_ && a.ref() == b.ref();
  }
  friend std::ostream& operator<<(std::ostream& os, const Stream& s) { return os << s.str(); }

 private:
  struct state {
    void* handle = nullptr;  // cudaStream_t, or a unique CPU identity
    std::uint64_t id = 0;
    int priority = 0;
    Device device;
    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state();
  };

  Device device_{};
  std::shared_ptr<state> state_;  // null: the device's default stream
};

/// A marker in a stream. record() places it after the work queued so far; query() says whether
/// that work is done; synchronize() waits for it; elapsed_time() gives milliseconds between two
/// events recorded with timing enabled. A cheap handle (copies share the event). On CPU, where work
/// is synchronous, recording takes the host clock and the event is complete at once.
class Event {
 public:
  /// `enable_timing`: the event can be used with elapsed_time (CUDA: a timing event, a little
  /// more expensive to record).
  TESSERA_API explicit Event(bool enable_timing = false);

  /// Places the event at the current end of `stream` (re-recording moves it).
  void record(const Stream& stream);
  /// True once the recorded point has been reached; true for an event never recorded (PyTorch).
  bool query() const;
  /// Blocks until the recorded point has been reached (returns at once when never recorded).
  void synchronize() const;
  /// Work queued on `stream` after the call waits for this event.
  void wait(const Stream& stream) const { stream.wait_event(*this); }
  /// Milliseconds from this event to `end`. Both must be recorded, have timing enabled, be on
  /// the same device, and (CUDA) be complete; otherwise throws tessera::error saying which.
  double elapsed_time(const Event& end) const;

  bool is_recorded() const noexcept { return state_->recorded; }
  /// The device of the stream it was last recorded on (cpu:0 before any record).
  Device device() const noexcept { return state_->device; }

 private:
  friend class Stream;
  struct state {
    bool timing = false;
    bool recorded = false;
    Device device{};
    double host_milliseconds = 0.0;  // CPU events: CLOCK_MONOTONIC
#if TESSERA_CUDA
    cudaEvent_t event = nullptr;
#endif
    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
#if TESSERA_CUDA
      if (event != nullptr) (void)cudaEventDestroy(event);  // may run after the runtime is gone
#endif
    }
  };
  std::shared_ptr<state> state_;
};

namespace detail {

/// The calling thread's current stream of each device (absent: the default stream).
struct current_streams {
  std::vector<Stream> cpu;
  std::vector<Stream> cuda;

  std::vector<Stream>& of(DeviceType type) noexcept { return type == DeviceType::cpu ? cpu : cuda; }
};
inline current_streams& thread_current_streams() {
  thread_local current_streams streams;
  return streams;
}


}  // namespace detail

/// The default stream of `device`; device_error when it does not exist.
inline Stream default_stream(Device device) {
  check_device(device);
  return Stream::default_of(device);
}

/// The calling thread's current stream of `device` (its default stream unless a StreamGuard or
/// set_current_stream changed it); device_error when the device does not exist.
inline Stream current_stream(Device device) {
  check_device(device);
  const std::vector<Stream>& streams = detail::thread_current_streams().of(device.type);
  const auto i = static_cast<std::size_t>(device.index);
  return i < streams.size() ? streams[i] : Stream::default_of(device);
}

namespace detail {
/// The calling thread's current stream on its current CUDA device: where Tessera's kernels,
/// copies and library calls go unless a stream is given.
/// Called before every launch: reads the thread's slot without copying a Stream handle (no
/// reference-count traffic) and without re-checking an ordinal the runtime reported.
inline stream_ref current_cuda_stream() {
  const std::vector<Stream>& streams = thread_current_streams().cuda;
  const auto i = static_cast<std::size_t>(cuda::current_device());
  return i < streams.size() ? streams[i].ref() : stream_ref{};
}
}  // namespace detail

/// The calling thread's current stream of its current device of kind K.
template <DeviceKind K>
Stream current_stream() {
  return current_stream(resolve_device<K>(-1));
}

/// Makes `stream` the calling thread's current stream of its device.
TESSERA_API void set_current_stream(const Stream& stream);

/// RAII (PyTorch's StreamGuard / `with torch.cuda.stream(s)`): makes `stream` current on its
/// device and its device the current one of its kind for the calling thread; restores both on
/// exit. A stream of a device that does not exist throws device_error before anything changes.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream)
      : previous_stream_(current_stream(stream.device())),
        previous_device_(stream.device().is_cpu() ? cpu::current_device()
                                                  : cuda::current_device()) {
    set_current_stream(stream);
    set_device(stream.device().index);
  }
  ~StreamGuard() {
    try {
      set_current_stream(previous_stream_);
      set_device(previous_device_);
    } catch (...) {  // both were valid when taken; destructors must not throw
    }
  }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

  const Stream& previous_stream() const noexcept { return previous_stream_; }

 private:
  void set_device(int index) const {
    if (previous_stream_.device().is_cpu()) {
      cpu::set_device(index);
    } else {
      cuda::set_device(index);
    }
  }
  Stream previous_stream_;
  int previous_device_;
};

// ---- definitions ------------------------------------------------------------------------------

#if TESSERA_CUDA
namespace detail {
/// The answer of cudaStreamQuery / cudaEventQuery: true when the work is done, false when it is
/// not ready yet ("not ready" is an answer, not an error to leave behind: it is cleared); any
/// other status throws cuda_error naming `call`.
inline bool cuda_query_done(cudaError_t status, const char* call) {
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (status != cudaSuccess) throw_cuda_error(status, call, __FILE__, __LINE__);
  return true;
}
}  // namespace detail
#endif

// Out of line in compiled mode (core/config.hpp).
#if TESSERA_DEFINITIONS
TESSERA_API Event::Event(bool enable_timing) : state_(std::make_shared<state>()) {
  state_->timing = enable_timing;
}
TESSERA_API void set_current_stream(const Stream& stream) {
  check_device(stream.device());
  std::vector<Stream>& streams = detail::thread_current_streams().of(stream.device().type);
  const auto i = static_cast<std::size_t>(stream.device().index);
  if (streams.size() <= i) {
    streams.reserve(static_cast<std::size_t>(device_count(stream.device().type)));
    while (streams.size() <= i) {
      streams.push_back(
          Stream::default_of(Device{stream.device().type, static_cast<int>(streams.size())}));
    }
  }
  streams[i] = stream;
}

#if TESSERA_CUDA
namespace detail {
/// The cudaStream_t handles of Streams whose last handle went: {device, priority, handle}, taken
/// again by the next Stream of that device and priority. Leaked on purpose, like the pools: a
/// Stream may go during static destruction.
struct cuda_spare_streams {
  struct entry {
    int device;
    int priority;
    cudaStream_t handle;
  };
  std::mutex mutex;
  std::vector<entry> spare;
};
inline cuda_spare_streams& spare_cuda_streams() {
  static auto* streams = new cuda_spare_streams;
  return *streams;
}
}  // namespace detail
#endif

TESSERA_API Stream::Stream(Device device, int priority) : device_(device) {
  check_device(device);
  auto created = std::make_shared<state>();
  static std::atomic<std::uint64_t> next_id{1};
  created->id = next_id.fetch_add(1, std::memory_order_relaxed);
  created->device = device;
  if (device.is_cpu()) {
    (void)priority;
    // A CPU stream is an identity; the id can never be 0, so the handle never reads as default.
    created->handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(created->id));
  } else {
#if TESSERA_CUDA
    created->priority = priority;
    cudaStream_t native = nullptr;
    {
      detail::cuda_spare_streams& spares = detail::spare_cuda_streams();
      const std::lock_guard lock(spares.mutex);
      for (auto it = spares.spare.begin(); it != spares.spare.end(); ++it) {
        if (it->device == device.index && it->priority == priority) {
          native = it->handle;
          spares.spare.erase(it);
          break;
        }
      }
    }
    if (native == nullptr) {
      detail::cuda_device_scope scope(device.index);
      TESSERA_CUDA_CHECK(cudaStreamCreateWithPriority(&native, cudaStreamNonBlocking, priority));
    }
    created->handle = static_cast<void*>(native);
#endif
  }
  state_ = std::move(created);
}

TESSERA_API Stream::state::~state() {
#if TESSERA_CUDA
  if (device.is_cuda() && handle != nullptr) {
    try {  // kept for the next Stream, never destroyed (see Stream)
      detail::cuda_spare_streams& spares = detail::spare_cuda_streams();
      const std::lock_guard lock(spares.mutex);
      spares.spare.push_back({device.index, priority, static_cast<cudaStream_t>(handle)});
    } catch (...) {  // no memory for the list: the handle is leaked, still valid
    }
  }
#endif
}

TESSERA_API bool Stream::query() const {
#if TESSERA_CUDA
  if (device_.is_cuda()) {
    detail::cuda_device_scope scope(device_.index);
    return detail::cuda_query_done(cudaStreamQuery(native()), "cudaStreamQuery(stream)");
  }
#endif
  return true;
}

TESSERA_API void Stream::synchronize() const {
#if TESSERA_CUDA
  if (device_.is_cuda()) {
    detail::cuda_device_scope scope(device_.index);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(native()));
  }
#endif
}

TESSERA_API void Stream::wait_event(const Event& event) const {
#if TESSERA_CUDA
  if (device_.is_cuda() && event.state_->recorded && event.state_->event != nullptr) {
    detail::cuda_device_scope scope(device_.index);
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(native(), event.state_->event, 0));
    return;
  }
  if (device_.is_cpu() && event.state_->recorded && event.state_->event != nullptr) {
    // CPU work issued after this waits for CUDA work: the issuing thread blocks until it is done.
    TESSERA_CUDA_CHECK(cudaEventSynchronize(event.state_->event));
  }
#else
  (void)event;
#endif
}

TESSERA_API void Stream::wait_stream(const Stream& other) const {
  if (device_.is_cpu() && other.device_.is_cpu()) return;  // CPU work is already complete
  wait_event(other.record_event());
}

TESSERA_API Event Stream::record_event(bool enable_timing) const {
  Event event(enable_timing);
  event.record(*this);
  return event;
}

TESSERA_API void Event::record(const Stream& stream) {
  check_device(stream.device());
#if TESSERA_CUDA
  if (stream.device().is_cuda()) {
    detail::cuda_device_scope scope(stream.device().index);
    if (state_->event != nullptr && state_->device != stream.device()) {
      // A CUDA event belongs to the device it was created on; re-create it for the new one.
      (void)cudaEventDestroy(state_->event);
      state_->event = nullptr;
    }
    if (state_->event == nullptr) {
      TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(
          &state_->event, state_->timing ? cudaEventDefault : cudaEventDisableTiming));
    }
    TESSERA_CUDA_CHECK(cudaEventRecord(state_->event, stream.native()));
    state_->device = stream.device();
    state_->recorded = true;
    return;
  }
#endif
  // clock_gettime, not <chrono>: C++20's <chrono> costs every user compile time.
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  state_->host_milliseconds = static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) * 1e-6;
  state_->device = stream.device();
  state_->recorded = true;
}

TESSERA_API bool Event::query() const {
#if TESSERA_CUDA
  if (state_->recorded && state_->device.is_cuda()) {
    return detail::cuda_query_done(cudaEventQuery(state_->event), "cudaEventQuery(event)");
  }
#endif
  return true;
}

TESSERA_API void Event::synchronize() const {
#if TESSERA_CUDA
  if (state_->recorded && state_->device.is_cuda()) {
    TESSERA_CUDA_CHECK(cudaEventSynchronize(state_->event));
  }
#endif
}

TESSERA_API double Event::elapsed_time(const Event& end) const {
  if (!state_->timing || !end.state_->timing) {
    throw error("Event::elapsed_time: both events need timing enabled (Event(true)); the " +
                std::string(!state_->timing ? "start" : "end") + " event has it off");
  }
  if (!state_->recorded || !end.state_->recorded) {
    throw error("Event::elapsed_time: the " + std::string(!state_->recorded ? "start" : "end") +
                " event was never recorded");
  }
  if (state_->device != end.state_->device) {
    throw device_mismatch_error("Event::elapsed_time: events recorded on " +
                                state_->device.str() + " and " + end.state_->device.str());
  }
#if TESSERA_CUDA
  if (state_->device.is_cuda()) {
    float milliseconds = 0.0f;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, state_->event, end.state_->event));
    return milliseconds;
  }
#endif
  return end.state_->host_milliseconds - state_->host_milliseconds;
}

#endif  // TESSERA_DEFINITIONS

}  // namespace tessera
