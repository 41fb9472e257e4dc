// A process group's state in the MPI engine (its communicators, timeout, queued and running
// collectives, the ranks' arrival and ready notes) and the control notes the ranks exchange to
// agree on each collective before any data moves (see mpi_engine.hpp's top comment).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "tessera/distributed/detail/collective_call.hpp"
#include "tessera/distributed/detail/mpi_check.hpp"
#include "tessera/distributed/detail/mpi_operation.hpp"

namespace tessera::distributed::detail {

/// A note on a group's control communicator about collective `sequence`: the sender has arrived at
/// it (with its call), is ready to run it, or has abandoned it. Travels as bytes; ready and
/// abandon notes leave out the call.
struct control_note {
  enum kind_t : std::uint32_t { arrival = 1, ready = 2, abandon = 3, broken = 4 };
  enum reason_t : std::uint32_t {
    none = 0,
    timed_out = 1,      // abandon: the sender's timeout passed
    finalized = 2,      // abandon: the sender called finalize()
    send_timed_out = 3,  // broken: the sender's send to `peer` timed out
    recv_timed_out = 4,  // broken: the sender's receive from `peer` timed out
    group_broken = 5,    // abandon: the group broke while the sender waited for the others
  };
  std::uint64_t sequence = 0;
  std::uint32_t kind = 0;
  std::uint32_t reason = none;  // abandon, broken: why
  std::int64_t timeout_ms = 0;  // the sender's timeout
  std::int64_t peer = -1;       // broken: the other end of the send or receive
  collective_kind operation = collective_kind::barrier;  // abandon: the collective given up on
  // abandon (group_broken): what broke the group, as the broken note that said it (origin: the
  // rank that sent it; -1 when unknown), so that every rank names the first cause.
  std::uint32_t cause = none;
  std::int64_t origin = -1;
  collective_call call;         // arrival: the sender's call
};
inline constexpr int short_note_bytes = static_cast<int>(offsetof(control_note, call));

/// One communicator's state: the group's communicator, a duplicate for the control notes, the
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
  std::vector<std::deque<control_note>> arrivals;  // [rank]: its arrival notes not yet used
  std::vector<std::uint64_t> arrived;              // [rank]: the last collective it arrived at
  std::vector<std::uint64_t> ready;                // [rank]: the last collective it is ready for
  std::vector<control_note> abandoned;             // [rank]: what it abandoned (sequence 0: none)
  std::vector<control_note> note_buffer;           // [rank]: the posted receive's buffer
  std::vector<MPI_Request> note_requests;          // [rank]
  std::string broken;                              // why the group cannot be used, once it cannot
  control_note broke_by;  // the send or receive timeout that broke it (origin -1: none known)
  std::shared_ptr<void> nccl;                      // the NCCL communicator (CUDA tensors)
};

/// The message of an operation refused by a broken group: `who` names the operation
/// ("ProcessGroup::barrier"), `why` what broke the group.
inline std::string broken_group_text(const std::string& who, const std::string& why) {
  return who + ": the process group is broken (" + why +
         "); every operation on it fails from now on: call ts::distributed::finalize() and "
         "start the processes again";
}

}  // namespace tessera::distributed::detail
