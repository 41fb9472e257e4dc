// The MPI engine under ts::distributed: one progress thread per process makes every MPI call
// after init (so MPI_THREAD_SERIALIZED is enough). Collectives of one group run one at a time in
// the order they were submitted (every rank calls them in the same order, as MPI requires).
// Before any data moves, the ranks agree on each collective in two rounds of small notes on a
// second communicator (point to point, polled, so nothing blocks):
//   1. arrival: "I am at collective k, and this is my call" (operation, dtype, device kind, shape,
//      root, reduce op: detail/collective_call.hpp). With every rank's call in hand, each rank
//      runs the same check on the same records: if the calls differ, every rank fails collective
//      k with the same error, nothing is sent, and the group goes on.
//   2. ready: "the calls agree; I am committed to k". MPI's blocking collective runs once every
//      rank is ready (OpenMPI's blocking all-reduce is 2.6 times faster than its nonblocking one at
//      7.5 MB, bench/RESULTS.md), and then every rank is in it.
// A rank whose timeout passes before every arrival note has come gives up on k: it tells the
// others (abandon), fails k naming the ranks that have not joined, and the group is marked broken
// so that nothing waits on it again. A send or receive that times out breaks the group too, and
// the rank tells the others (broken), which refuse further work on it as soon as the note comes;
// a rank still arriving at a collective abandons it then instead of waiting for its timeout.
// A timed-out receive is cancelled, and the buffers of a send or receive that MPI may still use
// stay alive until MPI_Finalize (never freed under MPI's feet). A rank that has sent "ready" never gives up on its own, and
// waits for every ready note or an abandon note instead: an abandoning rank has sent no ready note,
// so either every rank runs k or none does, and a late rank finds the abandon note when it comes
// and throws too. Sends and receives are nonblocking, posted as soon as they are submitted and
// polled, so a send and a receive submitted in either order cannot deadlock.
//
// The pieces: mpi_check.hpp (the errors, TESSERA_MPI_CHECK), mpi_operation.hpp (an operation and
// what its caller waits on), mpi_group_state.hpp (a group's state, the control notes).
#pragma once

// MPI itself (and the check that this build has it) comes with mpi_check.hpp.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
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
#include "tessera/distributed/detail/collective_call.hpp"
#include "tessera/distributed/detail/mpi_check.hpp"
#include "tessera/distributed/detail/mpi_group_state.hpp"
#include "tessera/distributed/detail/mpi_operation.hpp"

namespace tessera::distributed::detail {

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

  /// Fails what is queued, abandons a collective still waiting for the other ranks (they throw
  /// instead of waiting for this one), lets one that every rank is committed to complete (the
  /// others are in it), cancels the note receives and joins the thread.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  /// After stop(): the sends and receives that timed out while MPI could still use their
  /// buffers. The caller keeps them until MPI_Finalize.
  std::vector<std::shared_ptr<operation>> take_stranded() { return std::move(stranded_); }

  /// Registers a group: the engine posts its note receives. Engine thread (inside call()).
  void add_group(const std::shared_ptr<group_state>& group) {
    const auto n = static_cast<std::size_t>(group->size);
    group->arrivals.assign(n, {});
    group->arrived.assign(n, 0);
    group->ready.assign(n, 0);
    group->abandoned.assign(n, control_note{});
    group->note_buffer.assign(n, control_note{});
    group->note_requests.assign(n, MPI_REQUEST_NULL);
    for (int r = 0; r < group->size; ++r) {
      if (r != group->rank) post_note_receive(*group, r);
    }
    groups_.push_back(group);
  }

 private:
  static constexpr int note_tag = 7;

  static void post_note_receive(group_state& group, int from) {
    const auto r = static_cast<std::size_t>(from);
    TESSERA_MPI_CHECK(MPI_Irecv(&group.note_buffer[r], static_cast<int>(sizeof(control_note)),
                                MPI_BYTE, from, note_tag, group.control,
                                &group.note_requests[r]));
  }

  // Sends `n` to every other rank of the group.
  void send_note(group_state& group, const control_note& n) {
    const int bytes =
        n.kind == control_note::arrival ? static_cast<int>(sizeof(control_note)) : short_note_bytes;
    auto value = std::make_shared<control_note>(n);
    for (int r = 0; r < group.size; ++r) {
      if (r == group.rank) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      TESSERA_MPI_CHECK(
          MPI_Isend(value.get(), bytes, MPI_BYTE, r, note_tag, group.control, &request));
      notes_.push_back({request, value});
    }
  }

  // Tells the other ranks that this one gives up on collective `sequence` (it has sent no ready
  // note for it). Best effort: this rank is failing already.
  void abandon(group_state& group, const operation& op, control_note::reason_t reason) {
    if (group.size == 1) return;
    control_note n;
    n.sequence = op.sequence;
    n.operation = op.call.kind;
    n.cause = group.broke_by.reason;
    n.origin = group.broke_by.origin;
    n.peer = group.broke_by.peer;
    n.kind = control_note::abandon;
    n.reason = reason;
    n.timeout_ms = reason == control_note::group_broken && group.broke_by.origin >= 0
                       ? group.broke_by.timeout_ms
                       : group.timeout_ms.load();
    try {
      send_note(group, n);
    } catch (...) {  // the error already being reported says more
    }
  }

  // "rank 1's receive from rank 0 did not complete within its timeout of 500 ms".
  static std::string point_to_point_text(std::int64_t from, std::uint32_t reason,
                                         std::int64_t peer, std::int64_t timeout_ms) {
    return "rank " + std::to_string(from) +
           (reason == control_note::recv_timed_out ? "'s receive from rank " : "'s send to rank ") +
           std::to_string(peer) + " did not complete within its timeout of " +
           std::to_string(timeout_ms) + " ms";
  }

  static std::string abandon_text(int from, const control_note& n) {
    const std::string which = "collective #" + std::to_string(n.sequence) + " (" +
                              to_string(n.operation) + ")";
    const std::string rank = "rank " + std::to_string(from);
    switch (n.reason) {
      case control_note::finalized:
        return rank + " called ts::distributed::finalize() during " + which;
      case control_note::group_broken:
        return n.origin < 0 ? rank + " gave up on " + which + " because the group broke"
                            : point_to_point_text(n.origin, n.cause, n.peer, n.timeout_ms);
      case control_note::send_timed_out:
      case control_note::recv_timed_out:
        return point_to_point_text(from, n.reason, n.peer, n.timeout_ms);
      default:
        return rank + " gave up on " + which + " after its timeout of " +
               std::to_string(n.timeout_ms) + " ms";
    }
  }

  // The group cannot be used any more, for `why` (the first reason stays). `tell`: send the other
  // ranks a broken note with `n`'s reason, so that they refuse further work on it too instead of
  // waiting for this rank. Best effort.
  void break_group(group_state& group, const std::string& why, const control_note* tell) {
    if (group.broken.empty()) group.broken = why;
    if (tell && group.size > 1) {
      try {
        send_note(group, *tell);
      } catch (...) {  // the error already being reported says more
      }
    }
  }

  // Polls the note receives and the notes sent; true when any completed.
  bool poll_notes() {
    bool progress = false;
    for (const auto& group : groups_) {
      for (int r = 0; r < group->size; ++r) {
        const auto i = static_cast<std::size_t>(r);
        auto& request = group->note_requests[i];
        if (request == MPI_REQUEST_NULL) continue;
        int flag = 0;
        if (MPI_Test(&request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) continue;
        const control_note n = group->note_buffer[i];
        if (n.kind == control_note::arrival) {
          group->arrivals[i].push_back(n);
          group->arrived[i] = std::max(group->arrived[i], n.sequence);
        } else if (n.kind == control_note::ready) {
          group->ready[i] = std::max(group->ready[i], n.sequence);
        } else if (n.kind == control_note::abandon) {
          group->abandoned[i] = n;
          // Whatever this rank does next with the group would wait for that one.
          if (group->broken.empty()) group->broken = abandon_text(r, n);
        } else if (n.kind == control_note::broken) {
          if (group->broken.empty()) group->broken = abandon_text(r, n);
          if (group->broke_by.origin < 0) {
            group->broke_by = n;
            group->broke_by.origin = r;
          }
        }
        post_note_receive(*group, r);
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

  // Posts `op`'s first step, or announces a collective; false when it completed (or failed) at
  // once.
  bool start(group_state& group, operation& op) {
    // now + timeout, saturated: a timeout past what the clock holds (milliseconds::max()) means
    // none, not an overflow into a deadline already passed.
    const auto now = clock::now();
    const std::int64_t timeout = group.timeout_ms.load();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          clock::time_point::max() - now)
                          .count();
    op.deadline =
        timeout >= left ? clock::time_point::max() : now + std::chrono::milliseconds(timeout);
    if (op.collective && anyone_abandoned(group, group.started + 1)) {
      // A late rank: the others gave up on this collective before it came.
      op.sequence = ++group.started;
      abandoned_by_others(group, op);
      return false;
    }
    if (!group.broken.empty()) {
      fail(op, std::make_exception_ptr(
                   communication_error(broken_group_text("ProcessGroup::" + op.name, group.broken))));
      return false;
    }
    if (op.collective) {
      op.sequence = ++group.started;
      op.at = operation::stage::arriving;
      if (group.size > 1) {
        control_note n;
        n.sequence = op.sequence;
        n.kind = control_note::arrival;
        n.call = op.call;
        try {
          send_note(group, n);
        } catch (...) {
          group.broken = "an arrival note could not be sent";
          fail(op, std::current_exception());
          return false;
        }
      }
      return true;
    }
    return advance(op, nullptr);
  }

  // True when every other rank's arrival note for `sequence` has come (older ones, left by
  // collectives that failed, are dropped).
  static bool everyone_arrived(group_state& group, std::uint64_t sequence) {
    for (int r = 0; r < group.size; ++r) {
      if (r == group.rank) continue;
      auto& notes = group.arrivals[static_cast<std::size_t>(r)];
      while (!notes.empty() && notes.front().sequence < sequence) notes.pop_front();
      if (notes.empty() || notes.front().sequence != sequence) return false;
    }
    return true;
  }

  static bool everyone_ready(const group_state& group, std::uint64_t sequence) {
    for (int r = 0; r < group.size; ++r) {
      if (r != group.rank && group.ready[static_cast<std::size_t>(r)] < sequence) return false;
    }
    return true;
  }

  static bool anyone_abandoned(const group_state& group, std::uint64_t sequence) {
    for (const auto& n : group.abandoned) {
      if (n.sequence == sequence) return true;
    }
    return false;
  }

  static std::exception_ptr disagreement(const agreement& verdict) {
    const std::string& text = verdict.message;
    switch (verdict.kind) {
      case agreement::failure::device: return std::make_exception_ptr(device_error(text));
      case agreement::failure::dtype: return std::make_exception_ptr(dtype_error(text));
      case agreement::failure::shape: return std::make_exception_ptr(shape_error(text));
      default: return std::make_exception_ptr(communication_error(text));
    }
  }

  // Every rank's call has come: the same check on every rank. On agreement this rank commits (its
  // ready note) and returns true; else op fails with the verdict, as it does on every rank, and
  // the group goes on (nothing was sent).
  bool agree(group_state& group, operation& op) {
    std::vector<collective_call> calls(static_cast<std::size_t>(group.size));
    for (int r = 0; r < group.size; ++r) {
      auto& call = calls[static_cast<std::size_t>(r)];
      if (r == group.rank) {
        call = op.call;
      } else {
        auto& notes = group.arrivals[static_cast<std::size_t>(r)];
        call = notes.front().call;
        notes.pop_front();
      }
    }
    const agreement verdict = check_agreement(calls, op.sequence);
    if (!verdict) {
      fail(op, disagreement(verdict));
      return false;
    }
    op.agreed = std::move(calls);
    op.at = operation::stage::committed;
    if (group.size > 1) {
      control_note n;
      n.sequence = op.sequence;
      n.kind = control_note::ready;
      try {
        send_note(group, n);
      } catch (...) {
        group.broken = "a ready note could not be sent";
        fail(op, std::current_exception());
        return false;
      }
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

  // Moves the group's active collective on; true when it is finished (done or failed).
  bool progress_collective(group_state& group, operation& op, clock::time_point now,
                           bool& progress) {
    if (op.at == operation::stage::arriving) {
      if (anyone_abandoned(group, op.sequence)) {
        abandoned_by_others(group, op);
        return true;
      }
      if (!group.broken.empty()) {
        // Broken while this rank waited (a send or receive timed out here or on another rank):
        // the rank that broke it will not come, so this one gives up now, not at its timeout,
        // and tells the others (it has sent no ready note: no rank can have started k).
        abandon(group, op, control_note::group_broken);
        fail(op, std::make_exception_ptr(
                     communication_error(broken_group_text(where(group, op), group.broken))));
        return true;
      }
      if (!everyone_arrived(group, op.sequence)) {
        if (now <= op.deadline) return false;
        time_out(group, op);
        return true;
      }
      progress = true;
      if (!agree(group, op)) return true;
    }
    if (op.at == operation::stage::committed) {
      // No deadline here: every rank has arrived, and each either commits or, within its own
      // timeout, abandons (and says so).
      if (everyone_ready(group, op.sequence)) {
        op.at = operation::stage::running;
        progress = true;
        return !advance(op, nullptr);
      }
      if (anyone_abandoned(group, op.sequence)) {
        abandoned_by_others(group, op);
        return true;
      }
      return false;
    }
    if (!poll(op, progress)) return true;
    if (now <= op.deadline) return false;
    time_out(group, op);
    return true;
  }

  // "rank 2 has not joined it", "ranks 1, 2 have not joined it", or "" when every rank has.
  static std::string missing_ranks(const group_state& group, const operation& op) {
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
    if (count == 0) return "";
    return (count == 1 ? "rank " : "ranks ") + ranks + (count == 1 ? " has" : " have") +
           " not joined it";
  }

  static std::string where(const group_state& group, const operation& op) {
    return "ProcessGroup::" + op.name + " on rank " + std::to_string(group.rank) + " of " +
           std::to_string(group.size);
  }

  void time_out(group_state& group, operation& op) {
    std::string missing = missing_ranks(group, op);
    if (missing.empty()) missing = "every rank joined it, but it did not complete";
    const std::string message = where(group, op) + " did not complete within " +
                                std::to_string(group.timeout_ms.load()) + " ms: " + missing;
    // Still arriving: this rank has sent no ready note, so no rank can have started k; telling
    // them makes them (and a late rank, when it comes) throw too instead of waiting.
    if (op.collective && op.at == operation::stage::arriving) {
      abandon(group, op, control_note::timed_out);
    }
    // A late rank would now find the others gone, and a send's request may still match later
    // (it is left to MPI_Finalize): the group refuses further work, which could only wait. The
    // other ranks learn it from the abandon note, or for a send or receive from a broken note.
    control_note note;
    note.kind = control_note::broken;
    note.reason = op.name == "recv" ? control_note::recv_timed_out : control_note::send_timed_out;
    note.timeout_ms = group.timeout_ms.load();
    note.peer = op.peer;
    note.origin = group.rank;
    if (!op.collective && group.broke_by.origin < 0) group.broke_by = note;
    break_group(group, message, op.collective ? nullptr : &note);
    if (op.on_timeout) {
      try {
        op.on_timeout();
      } catch (...) {  // the timeout is the error to report
      }
    }
    fail(op, std::make_exception_ptr(timeout_error(message)));
  }

  // Another rank abandoned op's collective (its timeout passed, or it finalized) before every
  // rank was ready: no rank runs it, and this one throws too.
  void abandoned_by_others(group_state& group, operation& op) {
    std::vector<int> ranks;
    const control_note* first = nullptr;
    for (int r = 0; r < group.size; ++r) {
      const control_note& n = group.abandoned[static_cast<std::size_t>(r)];
      if (n.sequence != op.sequence) continue;
      ranks.push_back(r);
      if (!first) first = &n;
    }
    const std::string who = call_detail::rank_list(ranks);
    const bool one = ranks.size() == 1;
    std::string missing = missing_ranks(group, op);
    missing = missing.empty() ? ", before every rank had joined it" : "; " + missing;
    if (first->reason == control_note::finalized) {
      const std::string message = where(group, op) + " cannot complete: " + who +
                                  (one ? " has" : " have") +
                                  " called ts::distributed::finalize() during it" + missing;
      if (group.broken.empty()) group.broken = message;
      fail(op, std::make_exception_ptr(communication_error(message)));
      return;
    }
    if (first->reason == control_note::group_broken) {
      // The group broke while the others waited (or before this rank came): it is broken here
      // too, for the reason this rank heard first.
      if (group.broken.empty()) group.broken = abandon_text(ranks.front(), *first);
      fail(op, std::make_exception_ptr(
                   communication_error(broken_group_text(where(group, op), group.broken))));
      return;
    }
    const std::string message =
        where(group, op) + " did not complete: " + who + " gave up on it after " +
        (one ? "its timeout of " + std::to_string(first->timeout_ms) + " ms"
             : "their timeouts (" + std::to_string(first->timeout_ms) + " ms on rank " +
                   std::to_string(ranks.front()) + ")") +
        missing;
    if (group.broken.empty()) group.broken = message;
    fail(op, std::make_exception_ptr(timeout_error(message)));
  }

  struct pending_call {
    std::function<void()> fn;
    std::shared_ptr<work_state> work;
  };
  struct note {
    MPI_Request request;
    std::shared_ptr<control_note> value;
  };

  static void refuse(operation& op) {
    op.work->finish(std::make_exception_ptr(communication_error(
        "ProcessGroup::" + op.name +
        ": ts::distributed::finalize() was called before it completed")));
  }

  // A send or receive given up on (timed out, or cut short by finalize) whose MPI request may
  // still be active: a receive is cancelled (a late message must not land in the caller's
  // tensor), and the operation, which holds its tensor, is kept until MPI has let go of the
  // request, so that MPI never reads or writes freed memory.
  void strand(std::shared_ptr<operation> op) {
    if (op->request == MPI_REQUEST_NULL) return;  // nothing posted, or GPU work (aborted)
    if (op->name == "recv") MPI_Cancel(&op->request);
    stranded_.push_back(std::move(op));
  }
  // Lets go of the stranded operations whose requests have completed (or been cancelled).
  void poll_stranded() {
    for (auto it = stranded_.begin(); it != stranded_.end();) {
      int flag = 0;
      if ((*it)->request == MPI_REQUEST_NULL ||
          (MPI_Test(&(*it)->request, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)) {
        it = stranded_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // At stop: queued work fails; a collective still arriving is abandoned (this rank has sent no
  // ready note: the others throw instead of committing to it); one already committed or running
  // stays, to complete with the others (loop drains it).
  void refuse_for_stop() {
    for (auto& [group, op] : p2p_) {
      refuse(*op);
      strand(std::move(op));
    }
    p2p_.clear();
    for (const auto& group : groups_) {
      for (auto& op : group->waiting) refuse(*op);
      group->waiting.clear();
      if (group->active && group->active->at == operation::stage::arriving) {
        abandon(*group, *group->active, control_note::finalized);
        refuse(*group->active);
        group->active.reset();
      }
    }
  }

  void loop() {
    int idle_rounds = 0;
    bool draining = false;
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
      // Notes first: a broken note that came while the engine slept must stop a send or
      // receive submitted now from being posted (it would match the other rank's stale one).
      bool noted = !incoming.empty() && poll_notes();
      for (auto& [group, op] : incoming) {
        if (stopping) {
          refuse(*op);
        } else if (op->collective) {
          group->waiting.push_back(std::move(op));
        } else if (start(*group, *op)) {
          p2p_.emplace_back(group, std::move(op));
        }
      }
      if (stopping && !draining) {
        draining = true;
        refuse_for_stop();
      }
      if (draining && !any_collective()) {
        shut_down();
        return;
      }

      bool progress = !incoming.empty() || !calls.empty() || noted;
      if (poll_notes()) progress = true;
      poll_stranded();
      const auto now = clock::now();
      for (const auto& group : groups_) {
        while (true) {
          if (group->active) {
            if (!progress_collective(*group, *group->active, now, progress)) break;
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
          strand(std::move(op));
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

  // Engine thread, at the end of stop: whatever is left fails; the note receives are cancelled so
  // MPI_Finalize does not wait on them.
  void shut_down() {
    for (auto& [group, op] : p2p_) {
      refuse(*op);
      strand(std::move(op));
    }
    p2p_.clear();
    // What MPI may still use: its requests freed (MPI_Finalize reclaims them), the operations
    // (their tensors) handed to finalize(), which keeps them past MPI_Finalize.
    poll_stranded();
    for (auto& op : stranded_) {
      if (op->request != MPI_REQUEST_NULL) MPI_Request_free(&op->request);
    }
    for (const auto& group : groups_) {
      if (group->active) refuse(*group->active);
      group->active.reset();
      for (auto& op : group->waiting) refuse(*op);
      group->waiting.clear();
      for (auto& request : group->note_requests) {
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
  std::vector<std::shared_ptr<operation>> stranded_;  // see strand()
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace tessera::distributed::detail
