// The process's distributed runtime (DESIGN §3.7): ts::distributed::init() starts MPI under
// mpirun, finds the rank, the world size and the node-local rank, binds the process to its device
// (and makes the NCCL communicator for CUDA tensors when every rank has a GPU of its own), and
// starts the progress thread (detail/mpi_engine.hpp) that ProcessGroup's operations run on;
// finalize() stops it. Session is the RAII form. The world group and the MPI operators made at
// init live here; distributed/process_group.hpp runs the collectives.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/parallel/communicator.hpp"
#include "tessera/distributed/detail/mpi_engine.hpp"
#include "tessera/distributed/detail/mpi_ops.hpp"
#include "tessera/distributed/detail/nccl_process_group.hpp"

namespace tessera::distributed {

using parallel::ReduceOp;

namespace detail {

/// The process's distributed state: set by init(), cleared by finalize().
struct runtime {
  std::mutex mutex;
  bool active = false;
  bool finalized = false;       // MPI cannot start again after MPI_Finalize
  bool started_mpi = false;     // init() called MPI_Init_thread (else the user did: leave it)
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::unique_ptr<mpi_engine> engine;
  std::shared_ptr<group_state> world;
  // Sends and receives given up on whose buffers MPI may still use: kept past MPI_Finalize (for
  // the process's life when the user finalizes MPI).
  std::vector<std::shared_ptr<operation>> stranded;
  MPI_Op nan_max = MPI_OP_NULL;  // max / min that propagate NaN, as Communicator's (MPI's do not)
  MPI_Op nan_min = MPI_OP_NULL;
  // Sum and product of 8- and 16-bit integers modulo 2^bits: OpenMPI 4.1's vectorised ops
  // saturate them (found by process_group_test), Communicator's and PyTorch's wrap.
  MPI_Op wrapping_sum = MPI_OP_NULL;
  MPI_Op wrapping_product = MPI_OP_NULL;
};

inline runtime& state() {
  static runtime r;
  return r;
}

/// The MPI operator for `op` on `dtype` (avg is a sum, divided afterwards). On bool, sum and max
/// are "or", product and min "and", as Communicator's.
inline MPI_Op mpi_op(ReduceOp op, ScalarType dtype) {
  if (dtype == ScalarType::boolean) {
    return (op == ReduceOp::sum || op == ReduceOp::max) ? MPI_LOR : MPI_LAND;
  }
  const bool floating = is_floating_point(dtype);
  const bool narrow_integer = dtype == ScalarType::int8 || dtype == ScalarType::uint8 ||
                              dtype == ScalarType::int16;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return narrow_integer ? state().wrapping_sum : MPI_SUM;
    case ReduceOp::product: return narrow_integer ? state().wrapping_product : MPI_PROD;
    case ReduceOp::max: return floating ? state().nan_max : MPI_MAX;
    case ReduceOp::min: return floating ? state().nan_min : MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace detail

/// Starts the distributed runtime: MPI (with thread support; a program that already called
/// MPI_Init keeps its MPI and finalizes it itself), the rank, the world size and the local rank
/// (ranks on this node, by MPI's shared-memory split). Binds the calling thread to its device:
/// CPU ordinal local_rank % cpu::device_count() (and CUDA ordinal local_rank %
/// cuda::device_count() when GPUs are present; when every rank has a GPU of its own, the NCCL
/// communicator for CUDA tensors is made there, its id sent from rank 0 over MPI), and, unless
/// set_num_threads gave a count, gives
/// each process its share of the cores (cores / processes on the node). Without mpirun: a world
/// of one. A second call does nothing; a call after finalize() throws (MPI cannot restart).
inline void init() {
  detail::runtime& r = detail::state();
  std::lock_guard lock(r.mutex);
  if (r.active) return;
  if (r.finalized) {
    throw communication_error(
        "ts::distributed::init: finalize() was called already, and MPI cannot start twice in a "
        "process");
  }
  int initialized = 0;
  TESSERA_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    TESSERA_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    r.started_mpi = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      r.finalized = true;
      throw communication_error(
          "ts::distributed::init: this MPI gives thread level " + std::to_string(provided) +
          "; Tessera's progress thread needs MPI_THREAD_SERIALIZED or more");
    }
  }
  TESSERA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r.rank));
  TESSERA_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &r.size));
  MPI_Comm node = MPI_COMM_NULL;
  TESSERA_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r.rank, MPI_INFO_NULL, &node));
  TESSERA_MPI_CHECK(MPI_Comm_rank(node, &r.local_rank));
  TESSERA_MPI_CHECK(MPI_Comm_size(node, &r.local_size));
  TESSERA_MPI_CHECK(MPI_Comm_free(&node));
  TESSERA_MPI_CHECK(MPI_Op_create(&detail::nan_extremum_op<true>, 1, &r.nan_max));
  TESSERA_MPI_CHECK(MPI_Op_create(&detail::nan_extremum_op<false>, 1, &r.nan_min));
  TESSERA_MPI_CHECK(MPI_Op_create(&detail::wrapping_op<true>, 1, &r.wrapping_sum));
  TESSERA_MPI_CHECK(MPI_Op_create(&detail::wrapping_op<false>, 1, &r.wrapping_product));

  auto world = std::make_shared<detail::group_state>();
  TESSERA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world->comm));
  TESSERA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world->control));
  // Errors come back as codes (named in exceptions) instead of aborting every rank.
  TESSERA_MPI_CHECK(MPI_Comm_set_errhandler(world->comm, MPI_ERRORS_RETURN));
  TESSERA_MPI_CHECK(MPI_Comm_set_errhandler(world->control, MPI_ERRORS_RETURN));
  world->rank = r.rank;
  world->size = r.size;
  // A GPU of its own for each rank of the node (NCCL refuses two ranks on one GPU); with fewer
  // GPUs than ranks, CUDA tensors have no communicator (ProcessGroup says so).
  const int gpus = cuda::device_count();
  r.engine = std::make_unique<detail::mpi_engine>();
  r.engine->call([&] {
    r.engine->add_group(world);
#if TESSERA_CUDA && TESSERA_NCCL
    // When every rank has a GPU of its own.
    detail::create_nccl_communicator(*world, gpus >= r.local_size ? r.local_rank : -1);
#endif
  });
  r.world = std::move(world);
  r.active = true;

  cpu::set_device(r.local_rank % cpu::device_count());
  if (gpus > 0) cuda::set_device(r.local_rank % gpus);
  if (tessera::detail::cpu_threads().process.load() == 0) {
    cpu::set_num_threads(std::max(1, cpu::core_count() / std::max(1, r.local_size)));
  }
}

/// Ends the distributed runtime: operations still queued fail with communication_error, and so
/// does a collective still waiting for the other ranks (they are told, and throw too, instead of
/// waiting for this one); a collective that every rank has already committed to runs to the end
/// with them first. Then the progress thread stops and MPI is finalized (when init() started it).
/// Does nothing when init() was not called. After a timeout or a disagreement every rank
/// finalizes as usual.
inline void finalize() {
  detail::runtime& r = detail::state();
  std::lock_guard lock(r.mutex);
  if (!r.active) return;
  r.engine->stop();
  for (auto& op : r.engine->take_stranded()) r.stranded.push_back(std::move(op));
  r.engine.reset();
  if (r.world->broken.empty()) {
    MPI_Comm_free(&r.world->comm);
    MPI_Comm_free(&r.world->control);
  }
  r.world.reset();
  MPI_Op_free(&r.nan_max);
  MPI_Op_free(&r.nan_min);
  MPI_Op_free(&r.wrapping_sum);
  MPI_Op_free(&r.wrapping_product);
  r.active = false;
  if (r.started_mpi) {
    MPI_Finalize();
    r.finalized = true;
    r.stranded.clear();  // MPI has let go of every buffer
  }
}

/// True between init() and finalize().
inline bool is_initialized() {
  detail::runtime& r = detail::state();
  std::lock_guard lock(r.mutex);
  return r.active;
}
/// This process's rank in the world (0 before init()).
inline int rank() { return detail::state().rank; }
/// Number of processes (1 before init()).
inline int world_size() { return detail::state().size; }
/// This process's rank among those on its node (0 before init()).
inline int local_rank() { return detail::state().local_rank; }
/// Number of processes on this node (1 before init()).
inline int local_size() { return detail::state().local_size; }

/// RAII form: init() on construction, finalize() on destruction.
class Session {
 public:
  Session() { init(); }
  ~Session() { finalize(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

}  // namespace tessera::distributed
