// Where a program's time goes, by node (torch.profiler's key_averages table, without CUPTI): a
// Profile records, on each thread that holds one of its Recording scopes, every profiler::range
// that ends there — each node of a compiled program (forward, backward, recompute), each graph
// launch of Options::cuda_graph, each optimiser step, and the user's own ranges — with the host's
// time and, on a CUDA device, the time between two timing events on the device's current stream.
// rows() and table() add them up by (name, phase, device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/profiler.hpp"

namespace tessera::tools {

/// Ranges recorded while a Recording of it is open on a thread, added up by name, phase and device.
///
///     ts::tools::Profile profile;
///     {
///       auto recording = profile.record();  // this thread's ranges, until the scope ends
///       for (int i = 0; i < 5; ++i) step();
///     }
///     std::cout << profile.table();         // largest device time first
///
/// A CUDA range's device time is the time between an event recorded on the device's current
/// stream at its start and one at its end: the GPU time of what it queued when the GPU was busy
/// (a step bound by the GPU), otherwise also the time the stream waited for the host to queue it.
/// The events are read when finished, without waiting (rows() waits for the last ones). Ranges
/// that begin while the stream is captured into a CUDA graph are not timed (they queue nothing);
/// the graph's launches are (name "cuda_graph"). Any thread may record into one Profile at once.
class Profile {
 public:
  /// One (name, phase, device): its calls and their summed times.
  struct Row {
    std::string name;
    std::string phase;  // "forward", "backward", "recompute", "step", or "" (a user's range)
    Device device;
    std::int64_t calls = 0;
    double host_ms = 0;    // the host's time from each range's start to its end
    double device_ms = 0;  // CUDA: between the events; CPU (synchronous): the host's time
    /// device_ms over the summed device time of the outermost ranges on the same device (the
    /// step, when the user wraps it in a range; else the nodes and optimiser steps themselves).
    double share = 0;
  };

  /// The calling thread's recording scope: ranges that end on this thread while it lives go to
  /// the Profile. Scopes nest (an inner one, of any Profile, takes over until it ends). Must end
  /// on the thread that made it, after the ranges begun under it (as scopes do); it keeps the
  /// Profile's records alive.
  class Recording final : public profiler::recorder {
   public:
    TESSERA_API ~Recording();
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;

    TESSERA_API void begin(const char* name, const char* phase, Device device) override;
    TESSERA_API void end() noexcept override;

   private:
    friend class Profile;
    struct state;
    struct open;
    TESSERA_API explicit Recording(std::shared_ptr<state> profile);
    std::shared_ptr<state> profile_;
    profiler::recorder* previous_ = nullptr;
    std::vector<open>* stack_ = nullptr;
  };

  TESSERA_API Profile();
  /// Starts recording the calling thread's ranges (see Recording).
  [[nodiscard]] TESSERA_API Recording record();
  /// Every (name, phase, device) recorded so far, largest device time first (then host time).
  /// Waits for the device work of the ranges that have ended.
  TESSERA_API std::vector<Row> rows() const;
  /// rows() as a table: name, phase, device, calls, host ms, device ms, share, mean device µs;
  /// the first `top` rows, then the outermost ranges' totals per device and, when ranges could
  /// not be timed, how many and why.
  TESSERA_API std::string table(std::size_t top = 25) const;
  /// Forgets what was recorded (open scopes go on recording).
  TESSERA_API void reset();

 private:
  std::shared_ptr<Recording::state> state_;
};

}  // namespace tessera::tools

#if TESSERA_DEFINITIONS
#include <time.h>
#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>

#include "tessera/core/stream.hpp"
#if TESSERA_CUDA
#include "tessera/core/detail/cuda_device_scope.hpp"
#endif

namespace tessera::tools {

namespace profile_detail {
inline double host_milliseconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) * 1e-6;
}
/// Whether `device`'s current stream is being captured into a CUDA graph (nothing runs then).
inline bool capturing(Device device) {
#if TESSERA_CUDA
  if (device.is_cuda()) {
    const Stream stream = current_stream(device);
    tessera::detail::cuda_device_scope scope(device.index);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream.native(), &status) != cudaSuccess) {
      // The legacy default stream while another stream is captured in global mode: nothing may
      // be queued on it, so the range is not timed.
      (void)cudaGetLastError();
      return true;
    }
    return status != cudaStreamCaptureStatusNone;
  }
#else
  (void)device;
#endif
  return false;
}
}  // namespace profile_detail

/// A range that has begun and not yet ended on a Recording's thread.
struct Profile::Recording::open {
  std::size_t row = 0;
  double host_start = 0;
  bool skipped = false;  // begun while the stream was captured: not recorded
  // A CUDA range's timing events (none on the CPU, whose host time is its device time).
  std::optional<Event> start, stop;
};

/// What a Profile has recorded; shared by its Recording scopes.
struct Profile::Recording::state {
  /// A finished CUDA range whose events have not been read yet.
  struct pending {
    std::size_t row;
    bool outermost;
    Event start;
    Event stop;
  };
  mutable std::mutex mutex;
  std::vector<Row> rows;
  // "name\0phase\0device" -> rows (kept by reset(), which zeroes the rows: open ranges hold
  // their indices).
  std::map<std::string, std::size_t> index;
  std::vector<std::pair<Device, double>> outermost;  // summed device time per device
  std::vector<pending> pending_events;
  std::vector<Event> spare_events;  // timing events to reuse
  std::int64_t captured = 0;        // ranges begun inside a capture
  std::int64_t lost = 0;            // ranges whose events failed
  std::string lost_reason;

  std::size_t row_of(const char* name, const char* phase, Device device) {
    std::string key = name;
    key += '\0';
    key += phase;
    key += '\0';
    key += device.str();
    const auto [it, added] = index.try_emplace(std::move(key), rows.size());
    if (added) rows.push_back(Row{name, phase, device});
    return it->second;
  }
  Event take_event() {
    if (spare_events.empty()) return Event(true);
    Event event = spare_events.back();
    spare_events.pop_back();
    return event;
  }
  void add_outermost(Device device, double ms) {
    for (auto& [d, total] : outermost) {
      if (d == device) {
        total += ms;
        return;
      }
    }
    outermost.emplace_back(device, ms);
  }
  /// Reads the events of the pending ranges that have finished (all of them when `wait`), adds
  /// their times and keeps their events for reuse. Called with the mutex held.
  void settle(bool wait) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < pending_events.size(); ++i) {
      pending& p = pending_events[i];
      if (!wait && !p.stop.query()) {
        if (kept != i) pending_events[kept] = std::move(p);
        ++kept;
        continue;
      }
      p.stop.synchronize();
      const double ms = p.start.elapsed_time(p.stop);
      rows[p.row].device_ms += ms;
      if (p.outermost) add_outermost(rows[p.row].device, ms);
      spare_events.push_back(p.start);
      spare_events.push_back(p.stop);
    }
    pending_events.resize(kept);
  }
};

TESSERA_API Profile::Profile() : state_(std::make_shared<Recording::state>()) {}

TESSERA_API Profile::Recording Profile::record() { return Recording(state_); }

TESSERA_API Profile::Recording::Recording(std::shared_ptr<state> profile)
    : profile_(std::move(profile)),
      previous_(profiler::detail::thread_recorder()),
      stack_(new std::vector<open>()) {
  profiler::detail::thread_recorder() = this;
}

TESSERA_API Profile::Recording::~Recording() {
  // Ended on its own thread after the scopes it opened: the previous recorder takes over again.
  if (profiler::detail::thread_recorder() == this) profiler::detail::thread_recorder() = previous_;
  delete stack_;
}

TESSERA_API void Profile::Recording::begin(const char* name, const char* phase, Device device) {
  open entry;
  if (profile_detail::capturing(device)) {
    entry.skipped = true;
    stack_->push_back(std::move(entry));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(profile_->mutex);
    entry.row = profile_->row_of(name, phase, device);
    if (device.is_cuda()) {
      entry.start = profile_->take_event();
      entry.stop = profile_->take_event();
    }
  }
  // Pushed first, so that a failed record below leaves no range half begun.
  stack_->push_back(std::move(entry));
  open& top = stack_->back();
  try {
    if (top.start) top.start->record(current_stream(device));
  } catch (...) {
    stack_->pop_back();
    throw;
  }
  top.host_start = profile_detail::host_milliseconds();
}

TESSERA_API void Profile::Recording::end() noexcept {
  if (stack_->empty()) return;
  open entry = std::move(stack_->back());
  stack_->pop_back();
  const bool outermost = stack_->empty() || std::all_of(stack_->begin(), stack_->end(),
                                                        [](const open& o) { return o.skipped; });
  std::lock_guard<std::mutex> lock(profile_->mutex);
  if (entry.skipped) {
    ++profile_->captured;
    return;
  }
  const double host_ms = profile_detail::host_milliseconds() - entry.host_start;
  Row& row = profile_->rows[entry.row];
  ++row.calls;
  row.host_ms += host_ms;
  if (!entry.start) {
    row.device_ms += host_ms;
    if (outermost) profile_->add_outermost(row.device, host_ms);
    return;
  }
  try {
    entry.stop->record(current_stream(row.device));
    profile_->pending_events.push_back(
        state::pending{entry.row, outermost, *entry.start, *entry.stop});
    // Read what has finished now and then, so that a long recording holds few events.
    if (profile_->pending_events.size() >= 1024) profile_->settle(false);
  } catch (const std::exception& e) {
    ++profile_->lost;
    profile_->lost_reason = e.what();
  } catch (...) {
    ++profile_->lost;
    profile_->lost_reason = "unknown error";
  }
}

TESSERA_API std::vector<Profile::Row> Profile::rows() const {
  std::vector<Row> out;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->settle(true);
    for (Row row : state_->rows) {
      if (row.calls == 0) continue;  // zeroed by reset()
      for (const auto& [device, total] : state_->outermost) {
        if (device == row.device && total > 0) row.share = row.device_ms / total;
      }
      out.push_back(std::move(row));
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) {
    if (a.device_ms != b.device_ms) return a.device_ms > b.device_ms;
    return a.host_ms > b.host_ms;
  });
  return out;
}

TESSERA_API std::string Profile::table(std::size_t top) const {
  const std::vector<Row> all = rows();
  std::size_t name_width = 4;
  for (std::size_t i = 0; i < all.size() && i < top; ++i) {
    name_width = std::max(name_width, all[i].name.size());
  }
  char line[512];
  std::snprintf(line, sizeof line, "%-*s  %-9s  %-7s  %7s  %10s  %10s  %6s  %12s\n",
                static_cast<int>(name_width), "name", "phase", "device", "calls", "host ms",
                "device ms", "share", "device us/call");
  std::string out = line;
  for (std::size_t i = 0; i < all.size() && i < top; ++i) {
    const Row& r = all[i];
    std::snprintf(line, sizeof line, "%-*s  %-9s  %-7s  %7lld  %10.3f  %10.3f  %5.1f%%  %12.1f\n",
                  static_cast<int>(name_width), r.name.c_str(), r.phase.c_str(),
                  r.device.str().c_str(), static_cast<long long>(r.calls), r.host_ms, r.device_ms,
                  100.0 * r.share,
                  r.calls > 0 ? 1e3 * r.device_ms / static_cast<double>(r.calls) : 0.0);
    out += line;
  }
  if (all.size() > top) {
    out += "(" + std::to_string(all.size() - top) + " more rows: rows() has them all)\n";
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (const auto& [device, total] : state_->outermost) {
    std::snprintf(line, sizeof line, "outermost ranges on %s: %.3f ms of device time\n",
                  device.str().c_str(), total);
    out += line;
  }
  if (state_->captured > 0) {
    out += std::to_string(state_->captured) +
           " ranges began while their stream was captured into a CUDA graph: not timed (the "
           "graph's launches are)\n";
  }
  if (state_->lost > 0) {
    out +=
        std::to_string(state_->lost) + " ranges could not be timed: " + state_->lost_reason + "\n";
  }
  return out;
}

TESSERA_API void Profile::reset() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->settle(true);
  for (Row& row : state_->rows) {
    row.calls = 0;
    row.host_ms = 0;
    row.device_ms = 0;
  }
  state_->outermost.clear();
  state_->captured = 0;
  state_->lost = 0;
  state_->lost_reason.clear();
}

}  // namespace tessera::tools
#endif  // TESSERA_DEFINITIONS
