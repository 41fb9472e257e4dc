// NCCL under ProcessGroup for CUDA tensors: one NCCL communicator per process, on the GPU that
// ts::distributed::init bound it to, made by init when every rank has a GPU (the unique id goes
// from rank 0 over MPI). The engine issues the NCCL calls once every rank is ready, on the stream
// that was current on the caller's thread when the operation was submitted (so they order after
// the work already queued there), and completes the operation when an event recorded after them
// has passed. A timeout aborts the communicator (ncclCommAbort), which stops the GPU's wait.
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA && TESSERA_NCCL
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/parallel/communicator.hpp"
#include "tessera/distributed/detail/mpi_engine.hpp"
#include "tessera/parallel/detail/nccl.hpp"

namespace tessera::distributed::detail {

/// The group's NCCL communicator (one GPU per rank). Destroyed with the group; after a timeout it
/// has been aborted instead.
struct nccl_communicator {
  ncclComm_t comm = nullptr;
  int device = -1;
  bool aborted = false;

  nccl_communicator() = default;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() {
    if (comm != nullptr && !aborted) (void)ncclCommDestroy(comm);
  }
  void abort() {
    if (comm != nullptr && !aborted) {
      aborted = true;
      (void)ncclCommAbort(comm);
    }
  }
};

/// Creates `group`'s NCCL communicator on CUDA ordinal `device` if every rank has a GPU (an MPI
/// all-reduce decides, so all ranks agree). Engine thread, during init: every rank calls it.
inline void create_nccl_communicator(group_state& group, int device) {
  int has_gpu = device >= 0 ? 1 : 0, all = 0;
  TESSERA_MPI_CHECK(MPI_Allreduce(&has_gpu, &all, 1, MPI_INT, MPI_MIN, group.comm));
  if (!all) return;
  ncclUniqueId id;
  if (group.rank == 0) TESSERA_NCCL_CHECK(ncclGetUniqueId(&id));
  TESSERA_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, group.comm));
  DeviceGuard<cuda> guard(device);
  auto nccl = std::make_shared<nccl_communicator>();
  TESSERA_NCCL_CHECK(ncclCommInitRank(&nccl->comm, group.size, id, group.rank));
  nccl->device = device;
  group.nccl = std::move(nccl);
}

inline nccl_communicator* nccl_of(const group_state& group) {
  return static_cast<nccl_communicator*>(group.nccl.get());
}

/// Throws device_error unless `device` is the CUDA ordinal the group's communicator is on.
inline void check_nccl_device(const group_state& group, Device device, const char* what) {
  const nccl_communicator* nccl = nccl_of(group);
  if (nccl == nullptr) {
    throw device_error(std::string("ProcessGroup::") + what + ": the tensor is on " +
                       device.str() +
                       ", and there is no NCCL communicator: init() makes one only when every "
                       "rank has a GPU of its own");
  }
  if (device.index != nccl->device) {
    throw device_error(std::string("ProcessGroup::") + what + ": the tensor is on " +
                       device.str() + ", this rank's NCCL communicator on cuda:" +
                       std::to_string(nccl->device) + " (one GPU per rank, bound by init())");
  }
}

inline ncclDataType_t nccl_type(ScalarType dtype, const char* what) {
  switch (dtype) {
    case ScalarType::float32: return ncclFloat32;
    case ScalarType::float64: return ncclFloat64;
    case ScalarType::float16: return ncclFloat16;
    case ScalarType::bfloat16: return ncclBfloat16;
    case ScalarType::int8: return ncclInt8;
    case ScalarType::uint8:
    case ScalarType::boolean: return ncclUint8;
    case ScalarType::int32: return ncclInt32;
    case ScalarType::int64: return ncclInt64;
    case ScalarType::int16: break;
  }
  throw dtype_error(std::string("ProcessGroup::") + what + ": NCCL has no int16 type");
}

/// NCCL's operator; on bool (0 or 1 as uint8) sum and max are "or", product and min "and".
inline ncclRedOp_t nccl_reduce_op(parallel::ReduceOp op, ScalarType dtype) {
  using parallel::ReduceOp;
  if (dtype == ScalarType::boolean) {
    return (op == ReduceOp::sum || op == ReduceOp::max) ? ncclMax : ncclMin;
  }
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::product: return ncclProd;
  }
  return ncclSum;
}

/// Runs `before(stream)` (copies the NCCL calls read), `issue(comm, stream)` (NCCL calls, one
/// group) and `after(stream)` (copies of their results) on `stream`, then makes `op` wait for an
/// event recorded after them; a timeout aborts the communicator. Engine thread.
template <class Before, class Issue, class After>
void enqueue_nccl(group_state& group, operation& op, const Stream& stream, Before before,
                  Issue issue, After after) {
  nccl_communicator* nccl = nccl_of(group);
  DeviceGuard<cuda> guard(nccl->device);
  before(stream);
  TESSERA_NCCL_CHECK(ncclGroupStart());
  try {
    issue(nccl->comm, stream.native());
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  TESSERA_NCCL_CHECK(ncclGroupEnd());
  after(stream);  // NCCL launches at ncclGroupEnd: copies of its results go after it
  auto done = std::make_shared<Event>(stream.record_event());
  op.device_done = [done] { return done->query(); };
  op.on_timeout = [nccl] { nccl->abort(); };
}
template <class Issue>
void enqueue_nccl(group_state& group, operation& op, const Stream& stream, Issue issue) {
  auto nothing = [](const Stream&) {};
  enqueue_nccl(group, op, stream, nothing, issue, nothing);
}

/// Copies `rows` rows of `row_bytes` from `from` (rows `from_pitch` apart) to `to` (`to_pitch`
/// apart) on `stream`: the layout between a [outer, length, inner] block and its place in a
/// tensor concatenated along the middle dimension.
inline void copy_rows(void* to, std::size_t to_pitch, const void* from, std::size_t from_pitch,
                      std::size_t row_bytes, std::size_t rows, const Stream& stream) {
  if (row_bytes == 0 || rows == 0) return;
  TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, row_bytes, rows,
                                       cudaMemcpyDeviceToDevice, stream.native()));
}

}  // namespace tessera::distributed::detail
#endif  // TESSERA_CUDA && TESSERA_NCCL
