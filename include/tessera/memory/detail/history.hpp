// The memory history behind memory::record_history and memory::export_timeline: one recorder per
// device, which memory::allocate and deallocate reach only while some device records (one relaxed
// load on their path otherwise), and the writer of Chrome trace-event JSON. Everything here is
// compiled where TESSERA_DEFINITIONS is 1 (header-only units, or tessera::compiled); memory.hpp
// includes it after declaring those functions, and it reaches the devices through the registry.
#pragma once

#include "tessera/core/config.hpp"
#include "tessera/memory/detail/device_registry.hpp"

#if TESSERA_DEFINITIONS
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/memory/detail/thread_cache.hpp"
#include "tessera/memory/stats.hpp"

namespace tessera::memory::detail {

/// One recorded event: what happened and the device's memory right after it.
struct history_event {
  enum class action : std::uint8_t {
    start,          ///< recording started: the memory as it was then
    allocate,       ///< `bytes` were allocated at `address`
    deallocate,     ///< the `bytes` at `address` were freed
    out_of_memory,  ///< a request of `bytes` was refused
    empty_cache,    ///< cached segments were returned to the upstream
  };
  action what = action::start;
  int thread = 0;              // the recording's number of the calling thread, from 1
  std::uintptr_t address = 0;  // an address, not a pointer: freed memory must not be reachable
  std::size_t bytes = 0;
  std::int64_t allocated = 0;  // memory::allocated(device) after the event
  std::int64_t reserved = 0;   // memory::reserved(device) after the event
  std::chrono::steady_clock::time_point time;
};

/// The history of one device. The recording path holds `mutex` around the allocation or free and
/// its event, so that the events' order, times and byte counts agree with each other.
struct device_history {
  std::mutex mutex;
  std::atomic<bool> on{false};
  bool started = false;  // record_history(device, true) was called: there is a history
  std::size_t max_events = 0;
  std::vector<history_event> events;  // a ring once max_events are kept
  std::size_t next = 0;               // the oldest event (where the next goes) once full
  std::uint64_t dropped = 0;          // events dropped: the ring was full, or memory ran out

  // The events, oldest first (mutex held).
  std::vector<history_event> ordered() const {
    std::vector<history_event> result;
    result.reserve(events.size());
    result.insert(result.end(), events.begin() + static_cast<std::ptrdiff_t>(next), events.end());
    result.insert(result.end(), events.begin(), events.begin() + static_cast<std::ptrdiff_t>(next));
    return result;
  }

  // Records `what` on `device` with the memory as it is now (mutex held). Never throws: an
  // event that cannot be recorded is counted as dropped.
  void record(Device device, history_event::action what, std::uintptr_t address,
              std::size_t bytes) noexcept {
    try {
      // The pool's statistics less the blocks waiting in threads' caches: memory::allocated's
      // value, without flushing the calling thread's cache (which would change what it measures).
      MemoryStats stats = device_registry::instance().get(device).stats();
      if (device.is_cpu()) thread_cache_registry::instance().correct(device.index, stats);
      static std::atomic<int> threads{0};
      thread_local const int thread = threads.fetch_add(1, std::memory_order_relaxed) + 1;
      const history_event event{what,
                                thread,
                                address,
                                bytes,
                                stats.allocated_bytes.current,
                                stats.reserved_bytes.current,
                                std::chrono::steady_clock::now()};
      if (events.size() < max_events) {
        events.push_back(event);
      } else {
        events[next] = event;
        next = (next + 1) % events.size();
        ++dropped;
      }
    } catch (...) {
      ++dropped;
    }
  }
};

/// Every device's history, created once for the devices that exist; leaked like the device
/// registry (tensors freed during static destruction may still record).
class history_registry {
 public:
  static history_registry& instance() {
    static history_registry* registry = new history_registry();
    return *registry;
  }
  /// The history of an existing device (the caller checked it).
  device_history& of(Device device) noexcept {
    return device.is_cpu() ? cpu_[device.index] : cuda_[device.index];
  }

 private:
  history_registry()
      : cpu_(new device_history[static_cast<std::size_t>(cpu::device_count())]),
        cuda_(new device_history[static_cast<std::size_t>(cuda::device_count())]) {}

  // Never freed, as the registry (and no unique_ptr<T[]> for every unit to compile).
  device_history* cpu_;
  device_history* cuda_;
};

TESSERA_API void* recorded_allocate(Device device, std::size_t bytes, stream_ref stream) {
  resource_of(device, "allocate");  // a device that does not exist is a device_error
  device_history& history = history_registry::instance().of(device);
  if (bytes == 0 || !history.on.load(std::memory_order_acquire)) {
    return allocate_unrecorded(device, bytes, stream);
  }
  std::lock_guard lock(history.mutex);
  if (!history.on.load(std::memory_order_relaxed)) {  // stopped meanwhile
    return allocate_unrecorded(device, bytes, stream);
  }
  void* pointer = nullptr;
  try {
    pointer = allocate_unrecorded(device, bytes, stream);
  } catch (const out_of_memory_error&) {
    history.record(device, history_event::action::out_of_memory, 0, bytes);
    throw;
  }
  history.record(device, history_event::action::allocate, reinterpret_cast<std::uintptr_t>(pointer),
                 bytes);
  return pointer;
}

TESSERA_API void recorded_deallocate(Device device, void* pointer, std::size_t bytes,
                                     stream_ref stream) noexcept {
  // deallocate_unrecorded reports a device that does not exist (it terminates: deallocate is
  // noexcept) before the history is looked up.
  if (pointer == nullptr || device.index < 0 || device.index >= device_count(device.type)) {
    deallocate_unrecorded(device, pointer, bytes, stream);
    return;
  }
  device_history& history = history_registry::instance().of(device);
  if (!history.on.load(std::memory_order_acquire)) {
    deallocate_unrecorded(device, pointer, bytes, stream);
    return;
  }
  std::lock_guard lock(history.mutex);
  deallocate_unrecorded(device, pointer, bytes, stream);
  if (history.on.load(std::memory_order_relaxed)) {
    history.record(device, history_event::action::deallocate,
                   reinterpret_cast<std::uintptr_t>(pointer), bytes);
  }
}

TESSERA_API void record_empty_cache(Device device) {
  resource_of(device, "empty_cache");
  device_history& history = history_registry::instance().of(device);
  if (!history.on.load(std::memory_order_acquire)) return;
  std::lock_guard lock(history.mutex);
  if (history.on.load(std::memory_order_relaxed)) {
    history.record(device, history_event::action::empty_cache, 0, 0);
  }
}

}  // namespace tessera::memory::detail

namespace tessera::memory {

TESSERA_API void record_history(Device device, bool on, std::size_t max_events) {
  detail::resource_of(device, "record_history");
  if (on && max_events == 0) {
    throw std::invalid_argument("memory::record_history(" + device.str() +
                                ", true, 0): max_events must be at least 1");
  }
  detail::device_history& history = detail::history_registry::instance().of(device);
  std::lock_guard lock(history.mutex);
  if (on) {
    history.events.clear();
    history.events.shrink_to_fit();
    history.next = 0;
    history.dropped = 0;
    history.max_events = max_events;
    history.started = true;
    if (!history.on.load(std::memory_order_relaxed)) {
      history.on.store(true, std::memory_order_release);
      detail::devices_recording.fetch_add(1, std::memory_order_relaxed);
      detail::add_slow_allocation_path(device, 1);
    }
    history.record(device, detail::history_event::action::start, 0, 0);
  } else if (history.on.load(std::memory_order_relaxed)) {
    history.on.store(false, std::memory_order_release);
    detail::devices_recording.fetch_sub(1, std::memory_order_relaxed);
    detail::add_slow_allocation_path(device, -1);
  }
}

TESSERA_API void export_timeline(Device device, const std::string& path) {
  detail::resource_of(device, "export_timeline");
  detail::device_history& history = detail::history_registry::instance().of(device);
  std::vector<detail::history_event> events;
  std::uint64_t dropped = 0;
  {
    std::lock_guard lock(history.mutex);
    if (!history.started) {
      throw error("memory::export_timeline(" + device.str() + ", \"" + path +
                  "\"): there is no memory history of " + device.str() +
                  "; start one with memory::record_history(" + device.str() + ", true)");
    }
    events = history.ordered();
    dropped = history.dropped;
  }
  const std::string where = "memory::export_timeline(" + device.str() + ", \"" + path + "\")";
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    throw io_error(where + ": cannot open the file for writing: " + std::strerror(errno));
  }
  const std::string name = device.str();
  const long pid = static_cast<long>(::getpid());
  // Chrome's trace-event format (the JSON object form): "ts" in microseconds; counters ("C") are
  // per process and name, so each device has its own two tracks.
  std::fprintf(file,
               "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"Tessera\","
               "\"device\":\"%s\",\"clock\":\"steady_clock\",\"dropped_events\":%" PRIu64
               "},\n"
               "\"traceEvents\":[\n"
               "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%ld,\"tid\":0,"
               "\"args\":{\"name\":\"Tessera memory\"}}",
               name.c_str(), dropped, pid);
  std::vector<bool> named_threads;
  for (const detail::history_event& event : events) {
    const auto thread = static_cast<std::size_t>(event.thread);
    if (thread >= named_threads.size()) named_threads.resize(thread + 1);
    if (!named_threads[thread]) {
      named_threads[thread] = true;
      std::fprintf(file,
                   ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%ld,\"tid\":%d,"
                   "\"args\":{\"name\":\"thread %d\"}}",
                   pid, event.thread, event.thread);
    }
  }
  using action = detail::history_event::action;
  for (const detail::history_event& event : events) {
    const double ts =
        std::chrono::duration<double, std::micro>(event.time.time_since_epoch()).count();
    const char* what = nullptr;
    switch (event.what) {
      case action::start:
        break;
      case action::allocate:
        what = "allocate";
        break;
      case action::deallocate:
        what = "free";
        break;
      case action::out_of_memory:
        what = "out_of_memory";
        break;
      case action::empty_cache:
        what = "empty_cache";
        break;
    }
    if (what != nullptr) {
      std::fprintf(file,
                   ",\n{\"name\":\"%s\",\"cat\":\"memory\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,"
                   "\"pid\":%ld,\"tid\":%d,\"args\":{\"device\":\"%s\",\"size\":%zu,"
                   "\"address\":\"0x%" PRIxPTR "\",\"allocated\":%" PRId64 ",\"reserved\":%" PRId64
                   "}}",
                   what, ts, pid, event.thread, name.c_str(), event.bytes, event.address,
                   event.allocated, event.reserved);
    }
    std::fprintf(file,
                 ",\n{\"name\":\"%s allocated\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%ld,\"tid\":0,"
                 "\"args\":{\"bytes\":%" PRId64
                 "}}"
                 ",\n{\"name\":\"%s reserved\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%ld,\"tid\":0,"
                 "\"args\":{\"bytes\":%" PRId64 "}}",
                 name.c_str(), ts, pid, event.allocated, name.c_str(), ts, pid, event.reserved);
  }
  std::fputs("\n]}\n", file);
  const bool failed = std::ferror(file) != 0;
  if (std::fclose(file) != 0 || failed) {
    throw io_error(where + ": writing the file failed: " + std::strerror(errno));
  }
}

}  // namespace tessera::memory
#endif  // TESSERA_DEFINITIONS
