// The MPI engine under ts::distributed: one progress thread per process makes every MPI call
// after init (so MPI_THREAD_SERIALIZED is enough). Collectives of one group run one at a time in
// the order they were submitted (every rank calls them in the same order, as MPI requires).
// Before a collective starts, each rank sends the others a small note "I am at collective k" on
// a second communicator, and the engine starts collective k only when every rank's note has
// come: then MPI's blocking collective runs at once (OpenMPI's blocking all-reduce is 2.6 times
// faster than its nonblocking one at 7.5 MB, bench/RESULTS.md), and a rank that never comes is
// a deadline that passes with nothing posted: the collective fails naming the ranks that have
// not joined it, and the group is marked broken so that nothing waits on it again. Sends and
// receives are nonblocking, posted as soon as they are submitted and polled, so a send and a
// receive submitted in either order cannot deadlock.
#pragma once

#if !TESSERA_MPI
#error "tessera/distributed.hpp needs MPI: build with -DTESSERA_WITH_MPI=ON and link tessera::distributed"
#endif

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // OpenMPI's deprecated C++ bindings: not used, and slow to compile
#endif
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"

namespace tessera::distributed {

/// An MPI call that failed, or a process group that can no longer be used; names the operation.
class communication_error : public tessera::error {
 public:
  using tessera::error::error;
};

/// A collective, send or receive that did not complete within the group's timeout; names the
/// operation and the ranks that had not joined it.
class timeout_error : public communication_error {
 public:
  using communication_error::communication_error;
};

namespace detail {

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

[[noreturn]] inline void throw_mpi_error(int code, const char* call) {
  throw communication_error(std::string(call) + " failed: " + mpi_error_text(code));
}

}  // namespace detail
}  // namespace tessera::distributed

/// Checks an MPI call's result; throws ts::distributed::communication_error naming the call.
#define TESSERA_MPI_CHECK(call)                                                   \
  do {                                                                            \
    const int tessera_mpi_code_ = (call);                                         \
    if (tessera_mpi_code_ != MPI_SUCCESS) {                                       \
      ::tessera::distributed::detail::throw_mpi_error(tessera_mpi_code_, #call);  \
    }                                                                             \
  } while (0)

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
  // Engine bookkeeping.
  std::uint64_t sequence = 0;  // collectives: the group's count, the same on every rank
  bool gated = false;          // a collective waiting for every rank's arrival note
  MPI_Request request = MPI_REQUEST_NULL;
  clock::time_point deadline{};
};

/// One communicator's state: the group's communicator, a duplicate for the arrival notes, the
/// timeout, the collectives waiting their turn and the one in flight.
struct group_state {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm control = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::atomic<std::int64_t> timeout_ms{300000};  // 5 minutes, PyTorch's default

  // Engine thread only.
  std::deque<std::shared_ptr<operation>> waiting;  // collectives, in submission order
  std::shared_ptr<operation> active;               // the collective in flight
  std::uint64_t started = 0;                       // collectives started here
  std::vector<std::uint64_t> arrived;              // [rank]: the last collective it reported
  std::vector<std::uint64_t> arrival_buffer;       // [rank]: the posted receive's buffer
  std::vector<MPI_Request> arrival_requests;       // [rank]
  std::string broken;                              // why the group cannot be used, once it cannot
  std::shared_ptr<void> nccl;                      // the NCCL communicator (CUDA tensors)
};

/// The progress thread and its queues. One per process, made by ts::distributed::init.
class mpi_engine {
 public:
  mpi_engine() : thread_([this] { loop(); }) {}
  mpi_engine(const mpi_engine&) = delete;
  mpi_engine& operator=(const mpi_engine&) = delete;
  ~mpi_engine() { stop(); }

  /// Queues `op` for `group`; returns at once. Thread-safe.
  void submit(std::shared_ptr<group_state> group, std::shared_ptr<operation> op) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) {
        op->work->finish(std::make_exception_ptr(communication_error(
            "ProcessGroup::" + op->name + ": ts::distributed::finalize() has been called")));
        return;
      }
      incoming_.emplace_back(std::move(group), std::move(op));
    }
    wake_.notify_one();
  }

  /// Runs `fn` on the engine thread (for MPI calls outside operations: creating a group) and
  /// waits for it; rethrows its exception.
  void call(std::function<void()> fn) {
    auto work = std::make_shared<work_state>();
    {
      std::lock_guard lock(mutex_);
      if (stopping_) throw communication_error("ts::distributed: finalize() has been called");
      calls_.emplace_back(std::move(fn), work);
    }
    wake_.notify_one();
    wait(*work);
  }

  /// Blocks until `work` is done; while a caller waits, the engine polls without sleeping (the
  /// caller's core is free). Rethrows the operation's error.
  void wait(work_state& work) {
    waiters_.fetch_add(1, std::memory_order_relaxed);
    wake_.notify_one();
    std::unique_lock lock(work.mutex);
    work.changed.wait(lock, [&] { return work.done; });
    waiters_.fetch_sub(1, std::memory_order_relaxed);
    work.throw_failure();
  }

  /// Fails whatever has not completed, cancels the arrival receives and joins the thread.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  /// Registers a group: the engine posts its arrival receives. Engine thread (inside call()).
  void add_group(const std::shared_ptr<group_state>& group) {
    const auto n = static_cast<std::size_t>(group->size);
    group->arrived.assign(n, 0);
    group->arrival_buffer.assign(n, 0);
    group->arrival_requests.assign(n, MPI_REQUEST_NULL);
    for (int r = 0; r < group->size; ++r) {
      if (r != group->rank) post_arrival_receive(*group, r);
    }
    groups_.push_back(group);
  }

 private:
  static constexpr int arrival_tag = 7;

  static void post_arrival_receive(group_state& group, int from) {
    const auto r = static_cast<std::size_t>(from);
    TESSERA_MPI_CHECK(MPI_Irecv(&group.arrival_buffer[r], 1, MPI_UINT64_T, from, arrival_tag,
                                group.control, &group.arrival_requests[r]));
  }

  // Tells every other rank of the group that this one has started collective `sequence`.
  void announce(group_state& group, std::uint64_t sequence) {
    for (int r = 0; r < group.size; ++r) {
      if (r == group.rank) continue;
      auto note = std::make_unique<std::uint64_t>(sequence);
      MPI_Request request = MPI_REQUEST_NULL;
      TESSERA_MPI_CHECK(
          MPI_Isend(note.get(), 1, MPI_UINT64_T, r, arrival_tag, group.control, &request));
      notes_.push_back({request, std::move(note)});
    }
  }

  // Polls the arrival receives and the notes sent; true when any completed.
  bool poll_arrivals() {
    bool progress = false;
    for (const auto& group : groups_) {
      for (int r = 0; r < group->size; ++r) {
        auto& request = group->arrival_requests[static_cast<std::size_t>(r)];
        if (request == MPI_REQUEST_NULL) continue;
        int flag = 0;
        if (MPI_Test(&request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) continue;
        const auto i = static_cast<std::size_t>(r);
        group->arrived[i] = std::max(group->arrived[i], group->arrival_buffer[i]);
        post_arrival_receive(*group, r);
        progress = true;
      }
    }
    for (auto it = notes_.begin(); it != notes_.end();) {
      int flag = 0;
      if (MPI_Test(&it->request, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
        it = notes_.erase(it);
        progress = true;
      } else {
        ++it;
      }
    }
    return progress;
  }

  void fail(operation& op, std::exception_ptr e) { op.work->finish(std::move(e)); }

  // Posts `op`'s first step; false when it completed (or failed) at once.
  bool start(group_state& group, operation& op) {
    op.deadline = clock::now() + std::chrono::milliseconds(group.timeout_ms.load());
    if (!group.broken.empty()) {
      fail(op, std::make_exception_ptr(communication_error(
                   "ProcessGroup::" + op.name + ": the process group is broken: " +
                   group.broken)));
      return false;
    }
    if (op.collective) {
      op.sequence = ++group.started;
      if (group.size > 1) announce(group, op.sequence);
      op.gated = true;  // runs once every rank has arrived (loop)
      return true;
    }
    return advance(op, nullptr);
  }

  static bool everyone_arrived(const group_state& group, std::uint64_t sequence) {
    for (int r = 0; r < group.size; ++r) {
      if (r != group.rank && group.arrived[static_cast<std::size_t>(r)] < sequence) return false;
    }
    return true;
  }

  // Runs op's next step; false when op is finished (done or failed).
  bool advance(operation& op, const MPI_Status* status) {
    try {
      MPI_Status none{};
      while (true) {
        op.request = MPI_REQUEST_NULL;
        op.device_done = nullptr;
        if (!op.step(op.request, status ? *status : none)) {
          op.work->finish(nullptr);
          return false;
        }
        if (op.request != MPI_REQUEST_NULL || op.device_done) return true;
        status = nullptr;  // a local step: go straight on
      }
    } catch (...) {
      fail(op, std::current_exception());
      return false;
    }
  }

  // Tests op's request (or its GPU work); false when op is finished.
  bool poll(operation& op, bool& progress) {
    if (op.device_done) {
      try {
        if (!op.device_done()) return true;
      } catch (...) {
        fail(op, std::current_exception());
        return false;
      }
      progress = true;
      return advance(op, nullptr);
    }
    int flag = 0;
    MPI_Status status{};
    const int code = MPI_Test(&op.request, &flag, &status);
    if (code != MPI_SUCCESS) {
      fail(op, std::make_exception_ptr(communication_error(
                   "ProcessGroup::" + op.name + ": " + mpi_error_text(code))));
      return false;
    }
    if (!flag) return true;
    progress = true;
    return advance(op, &status);
  }

  std::string missing_ranks(const group_state& group, const operation& op) const {
    std::string ranks;
    int count = 0;
    if (!op.collective) {
      ranks = std::to_string(op.peer);
      count = 1;
    } else {
      for (int r = 0; r < group.size; ++r) {
        if (r != group.rank && group.arrived[static_cast<std::size_t>(r)] < op.sequence) {
          ranks += (count++ ? ", " : "") + std::to_string(r);
        }
      }
    }
    if (count == 0) return "every rank joined it, but it did not complete";
    return (count == 1 ? "rank " : "ranks ") + ranks + (count == 1 ? " has" : " have") +
           " not joined it";
  }

  void time_out(group_state& group, operation& op) {
    const std::string message =
        "ProcessGroup::" + op.name + " on rank " + std::to_string(group.rank) + " of " +
        std::to_string(group.size) + " did not complete within " +
        std::to_string(group.timeout_ms.load()) + " ms: " + missing_ranks(group, op);
    // A late rank would now find the others gone, and a send's request may still match later
    // (it is left to MPI_Finalize): the group refuses further work, which could only wait.
    if (group.broken.empty()) group.broken = message;
    if (op.on_timeout) {
      try {
        op.on_timeout();
      } catch (...) {  // the timeout is the error to report
      }
    }
    fail(op, std::make_exception_ptr(timeout_error(message)));
  }

  struct pending_call {
    std::function<void()> fn;
    std::shared_ptr<work_state> work;
  };
  struct note {
    MPI_Request request;
    std::unique_ptr<std::uint64_t> value;
  };

  void loop() {
    int idle_rounds = 0;
    while (true) {
      std::vector<std::pair<std::shared_ptr<group_state>, std::shared_ptr<operation>>> incoming;
      std::vector<pending_call> calls;
      bool stopping = false;
      {
        std::unique_lock lock(mutex_);
        const bool busy = !p2p_.empty() || any_collective() || !notes_.empty();
        if (!busy && incoming_.empty() && calls_.empty() && !stopping_) {
          wake_.wait(lock, [&] { return !incoming_.empty() || !calls_.empty() || stopping_; });
        }
        incoming.swap(incoming_);
        for (auto& c : calls_) calls.push_back(std::move(c));
        calls_.clear();
        stopping = stopping_;
      }
      for (auto& c : calls) {
        try {
          c.fn();
          c.work->finish(nullptr);
        } catch (...) {
          c.work->finish(std::current_exception());
        }
      }
      for (auto& [group, op] : incoming) {
        if (op->collective) {
          group->waiting.push_back(std::move(op));
        } else if (start(*group, *op)) {
          p2p_.emplace_back(group, std::move(op));
        }
      }
      if (stopping) {
        shut_down();
        return;
      }

      bool progress = !incoming.empty() || !calls.empty();
      if (poll_arrivals()) progress = true;
      const auto now = clock::now();
      for (const auto& group : groups_) {
        while (true) {
          if (group->active) {
            operation& op = *group->active;
            bool finished = false;
            if (op.gated) {
              if (everyone_arrived(*group, op.sequence)) {
                op.gated = false;
                progress = true;
                finished = !advance(op, nullptr);
              } else if (now > op.deadline) {
                time_out(*group, op);
                finished = true;
              }
            } else if (!poll(op, progress)) {
              finished = true;
            } else if (now > op.deadline) {
              time_out(*group, op);
              finished = true;
            }
            if (!finished) break;
            group->active.reset();
          }
          if (group->waiting.empty()) break;
          auto next = std::move(group->waiting.front());
          group->waiting.pop_front();
          if (start(*group, *next)) group->active = std::move(next);
        }
      }
      for (auto it = p2p_.begin(); it != p2p_.end();) {
        auto& [group, op] = *it;
        if (!poll(*op, progress)) {
          it = p2p_.erase(it);
        } else if (now > op->deadline) {
          time_out(*group, *op);
          it = p2p_.erase(it);
        } else {
          ++it;
        }
      }

      // Nothing moved: a caller waiting means its core is free, so poll again at once; else
      // yield briefly, then sleep 50 us a round, so a rank's compute threads keep their cores
      // while communication is in flight (overlap).
      if (progress) {
        idle_rounds = 0;
      } else if (waiters_.load(std::memory_order_relaxed) == 0 && ++idle_rounds > 64) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  bool any_collective() const {
    for (const auto& group : groups_) {
      if (group->active || !group->waiting.empty()) return true;
    }
    return false;
  }

  // Engine thread, at stop: everything still queued or in flight fails; the arrival receives are
  // cancelled so MPI_Finalize does not wait on them.
  void shut_down() {
    auto refuse = [](operation& op) {
      op.work->finish(std::make_exception_ptr(communication_error(
          "ProcessGroup::" + op.name +
          ": ts::distributed::finalize() was called before it completed")));
    };
    for (auto& [group, op] : p2p_) refuse(*op);
    p2p_.clear();
    for (const auto& group : groups_) {
      if (group->active) refuse(*group->active);
      group->active.reset();
      for (auto& op : group->waiting) refuse(*op);
      group->waiting.clear();
      for (auto& request : group->arrival_requests) {
        if (request == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&request);
        MPI_Request_free(&request);
      }
    }
    std::vector<pending_call> calls;
    {
      std::lock_guard lock(mutex_);
      for (auto& c : calls_) calls.push_back(std::move(c));
      calls_.clear();
      for (auto& [group, op] : incoming_) refuse(*op);
      incoming_.clear();
    }
    for (auto& c : calls) {
      c.work->finish(std::make_exception_ptr(
          communication_error("ts::distributed: finalize() was called")));
    }
    // Notes to ranks that are gone may never complete; MPI_Finalize reclaims them.
    for (auto& n : notes_) {
      if (n.request != MPI_REQUEST_NULL) MPI_Request_free(&n.request);
    }
    notes_.clear();
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<std::pair<std::shared_ptr<group_state>, std::shared_ptr<operation>>> incoming_;
  std::vector<pending_call> calls_;
  std::atomic<int> waiters_{0};
  // Engine thread only.
  std::vector<std::shared_ptr<group_state>> groups_;
  std::vector<std::pair<std::shared_ptr<group_state>, std::shared_ptr<operation>>> p2p_;
  std::vector<note> notes_;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace tessera::distributed::detail
