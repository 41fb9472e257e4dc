// One operation submitted to the MPI engine (a collective, send or receive, stepped by the
// engine's thread) and the state its caller waits on, which carries the operation's error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/distributed/detail/collective_call.hpp"
#include "tessera/distributed/detail/mpi_check.hpp"

namespace tessera::distributed::detail {

using clock = std::chrono::steady_clock;

/// What a caller waits on: set once by the engine, with the operation's error if it failed. The
/// error is kept as its kind and message and thrown anew in each waiting thread: an exception
/// object shared between threads is released by whichever thread drops it last, and
/// ThreadSanitizer cannot see that order (the count lives in the uninstrumented libstdc++).
struct work_state {
  enum class error_kind { none, communication, timeout, shape, dtype, device, invalid_argument, other };

  std::mutex mutex;
  std::condition_variable changed;
  bool done = false;
  error_kind kind = error_kind::none;
  std::string message;

  work_state() = default;
  work_state(const work_state&) = delete;
  work_state& operator=(const work_state&) = delete;

  /// Completes the work: `e` is null (success) or the operation's exception, recorded by kind.
  void finish(std::exception_ptr e) {
    error_kind k = error_kind::none;
    std::string text;
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const timeout_error& x) {
        k = error_kind::timeout, text = x.what();
      } catch (const communication_error& x) {
        k = error_kind::communication, text = x.what();
      } catch (const shape_error& x) {
        k = error_kind::shape, text = x.what();
      } catch (const dtype_error& x) {
        k = error_kind::dtype, text = x.what();
      } catch (const device_error& x) {
        k = error_kind::device, text = x.what();
      } catch (const std::invalid_argument& x) {
        k = error_kind::invalid_argument, text = x.what();
      } catch (const std::exception& x) {
        k = error_kind::other, text = x.what();
      } catch (...) {
        k = error_kind::other, text = "unknown exception";
      }
    }
    // Notified under the lock: a waiter that sees `done` may destroy this at once, so the
    // notification must be over before it can.
    std::lock_guard lock(mutex);
    kind = k;
    message = std::move(text);
    done = true;
    changed.notify_all();
  }

  /// Throws the recorded error (call with the lock held, once done); nothing on success.
  void throw_failure() const {
    switch (kind) {
      case error_kind::none: return;
      case error_kind::timeout: throw timeout_error(message);
      case error_kind::communication: throw communication_error(message);
      case error_kind::shape: throw shape_error(message);
      case error_kind::dtype: throw dtype_error(message);
      case error_kind::device: throw device_error(message);
      case error_kind::invalid_argument: throw std::invalid_argument(message);
      case error_kind::other: throw tessera::error(message);
    }
  }
};

/// One operation: `step` posts its next nonblocking MPI call into `request`, or queues GPU work
/// and sets `device_done` (true once that work has finished), or does blocking or local work and
/// sets neither, and returns true; or returns false when the operation is complete. It runs on
/// the engine thread only; an exception from it fails the operation.
struct operation {
  std::string name;     // "all_reduce", for messages
  bool collective = true;
  int peer = -1;        // send / recv: the other rank
  std::function<bool(MPI_Request&, const MPI_Status&)> step;
  std::function<bool()> device_done;  // GPU work in flight: polled instead of `request`
  std::function<void()> on_timeout;   // e.g. abort the NCCL communicator the GPU waits on
  std::shared_ptr<work_state> work = std::make_shared<work_state>();
  collective_call call;                 // collectives: what this rank asks for
  std::vector<collective_call> agreed;  // collectives: every rank's call, by rank, once they agree
  // Engine bookkeeping.
  enum class stage { arriving, committed, running };
  std::uint64_t sequence = 0;  // collectives: the group's count, the same on every rank
  stage at = stage::running;   // collectives: waiting for arrival notes, for ready notes, or run
  MPI_Request request = MPI_REQUEST_NULL;
  clock::time_point deadline{};
};

}  // namespace tessera::distributed::detail
