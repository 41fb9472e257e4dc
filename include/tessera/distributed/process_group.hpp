// One process per device (DESIGN §3.7): ts::distributed::init() (distributed/runtime.hpp)
// starts MPI under mpirun and binds the process to its device, and a ProcessGroup runs the
// collectives of the in-process Communicator across processes, plus send/recv and barrier: CPU tensors through MPI, CUDA
// tensors through NCCL (detail/nccl_process_group.hpp). Every operation has an async form
// returning a Work. Every rank agrees or every rank throws: before any data moves, the ranks
// compare what each asked of a collective, and calls that differ throw the same error on every
// rank; a timeout (default 5 minutes) turns a rank that never joins into a timeout_error naming
// it on every rank, the late one too, not a hang (detail/mpi_engine.hpp). The transports are
// MPI's own collectives (OpenMPI picks shared memory or the network) and NCCL's; Tessera adds the
// ordering, the agreement, the timeout, and the dtypes and operators MPI lacks (half and bfloat16
// reduced in float, NaN-propagating max and min, wrapping small-integer sums).
#pragma once

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/half.hpp"
#include "tessera/parallel/communicator.hpp"
#include "tessera/distributed/detail/mpi_engine.hpp"
#include "tessera/distributed/detail/mpi_ops.hpp"
#include "tessera/distributed/detail/nccl_process_group.hpp"
#include "tessera/distributed/runtime.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::distributed {

using parallel::ReduceOp;

/// An operation in flight (from a ProcessGroup's *_async call). wait() blocks until it completed
/// and rethrows its error (timeout_error, communication_error, shape_error...); the tensors it
/// writes hold the result after wait(). Dropping a Work without waiting is allowed: the operation
/// still completes (its tensors stay alive until then).
class Work {
 public:
  Work() = default;
  /// Blocks until the operation completed; throws its error. Waiting twice is fine.
  void wait() const {
    if (!state_) throw communication_error("Work::wait: this Work holds no operation");
    detail::runtime& r = detail::state();
    if (r.engine) return r.engine->wait(*state_);  // throws the operation's error
    std::lock_guard lock(state_->mutex);  // after finalize(): done (failed if cut short)
    if (!state_->done) throw communication_error("Work::wait: finalize() was called");
    state_->throw_failure();
  }
  /// True when the operation completed (successfully or not); does not block.
  bool is_completed() const {
    if (!state_) return false;
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }
  bool defined() const noexcept { return static_cast<bool>(state_); }

 private:
  friend class ProcessGroup;
  explicit Work(std::shared_ptr<detail::work_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::work_state> state_;
};

/// Collectives across the processes of the world (rank i is member i), on CPU tensors through
/// MPI. The collective calls have the meanings of Communicator's, with one tensor per process:
/// every rank calls the same collectives in the same order, with tensors of the same shape and
/// dtype unless the call says otherwise. Tensors written in place are contiguous. Each call
/// checks its arguments before anything is sent (std::invalid_argument, shape_error,
/// dtype_error, naming the values) and then runs on the progress thread: the *_async form returns
/// at once with a Work; the plain form waits.
///
/// Every rank agrees or every rank throws. Before any data moves, each rank's call (operation,
/// dtype, device kind, shape, root, reduce op, dim and output length) reaches every other rank;
/// calls that cannot run together throw the same error on every rank, naming what each rank
/// asked for (communication_error for another operation, root or reduce op; dtype_error,
/// shape_error, device_error), the tensors are untouched and the group can still be used. A
/// collective that some rank has not joined within timeout() throws timeout_error on every rank
/// that joined it, naming the missing ranks, and on a rank that comes later, at once. After a
/// timeout (a collective's, a send's or a receive's) the group is broken, as PyTorch's after its
/// watchdog aborts the communicator: on the rank that timed out at once, on the others as soon as
/// its note comes (a rank waiting in a collective then gives up instead of waiting for its own
/// timeout), every later operation throws communication_error "ProcessGroup::<op>: the process
/// group is broken (<what broke it>) ..." without waiting or touching its tensors; finalize()
/// still works and returns. A receive that timed out is cancelled, so a late message does not
/// land in its tensor.
/// Handles share one group: a copy is the same group. Thread-safe; collectives are ordered as
/// submitted (from one thread, or ordered by the caller).
class ProcessGroup {
 public:
  /// The world's group. Throws communication_error before init().
  ProcessGroup() {
    detail::runtime& r = detail::state();
    std::lock_guard lock(r.mutex);
    if (!r.active) {
      throw communication_error(
          "ProcessGroup: ts::distributed::init() has not been called (or finalize() has)");
    }
    group_ = r.world;
  }

  int rank() const noexcept { return group_->rank; }
  int size() const noexcept { return group_->size; }
  /// How long a collective, send or receive may take before it throws timeout_error (default 5
  /// minutes). Applies to operations started afterwards. std::invalid_argument below 1 ms; one
  /// longer than the clock can count (milliseconds::max()) never passes.
  void set_timeout(std::chrono::milliseconds timeout) {
    if (timeout.count() < 1) {
      throw std::invalid_argument("ProcessGroup::set_timeout: " +
                                  std::to_string(timeout.count()) + " ms; at least 1 ms");
    }
    group_->timeout_ms.store(static_cast<std::int64_t>(timeout.count()));
  }
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(group_->timeout_ms.load());
  }

  /// In place: t becomes op over every rank's t. `avg` needs a floating dtype (dtype_error).
  template <Dtype T, DeviceKind K>
  Work all_reduce_async(const Tensor<T, K>& t, ReduceOp op = ReduceOp::sum) {
    return all_reduce_any(AnyTensor(t), op);
  }
  template <Dtype T, DeviceKind K>
  void all_reduce(const Tensor<T, K>& t, ReduceOp op = ReduceOp::sum) {
    all_reduce_async(t, op).wait();
  }

  /// The type-erased form (a CPU tensor of any dtype, e.g. a module's state).
  Work all_reduce_async(const AnyTensor& t, ReduceOp op = ReduceOp::sum) {
    return all_reduce_any(t, op);
  }

  /// Every rank's t becomes a copy of rank root's t.
  template <Dtype T, DeviceKind K>
  Work broadcast_async(const Tensor<T, K>& t, int root = 0) {
    return broadcast_any(AnyTensor(t), root);
  }
  template <Dtype T, DeviceKind K>
  void broadcast(const Tensor<T, K>& t, int root = 0) {
    broadcast_async(t, root).wait();
  }

  /// The type-erased form (a CPU tensor of any dtype, e.g. a module's state).
  Work broadcast_async(const AnyTensor& t, int root = 0) { return broadcast_any(t, root); }

  /// Rank root's t becomes op over every rank's t; the others' are unchanged.
  template <Dtype T, DeviceKind K>
  Work reduce_async(const Tensor<T, K>& t, int root = 0, ReduceOp op = ReduceOp::sum) {
    return reduce_any(AnyTensor(t), root, op);
  }
  template <Dtype T, DeviceKind K>
  void reduce(const Tensor<T, K>& t, int root = 0, ReduceOp op = ReduceOp::sum) {
    reduce_async(t, root, op).wait();
  }

  /// out = cat(every rank's in, dim), in rank order, on every rank. The ranks' inputs may differ
  /// in size along dim (the other extents agree); out has in's extents but their total along dim
  /// (shape_error otherwise, on every rank whose out does not fit).
  template <Dtype T, DeviceKind K>
  Work all_gather_async(const Tensor<T, K>& in, const Tensor<T, K>& out, int dim = 0) {
    return all_gather_any(AnyTensor(in), AnyTensor(out), dim);
  }
  template <Dtype T, DeviceKind K>
  void all_gather(const Tensor<T, K>& in, const Tensor<T, K>& out, int dim = 0) {
    all_gather_async(in, out, dim).wait();
  }

  /// out = slice `rank` of (op over every rank's in), along dim: the slices are consecutive in
  /// rank order and each rank's out is as long along dim as its slice; the lengths add up to in's
  /// extent (shape_error on every rank otherwise). in has one shape on every rank.
  template <Dtype T, DeviceKind K>
  Work reduce_scatter_async(const Tensor<T, K>& in, const Tensor<T, K>& out,
                            ReduceOp op = ReduceOp::sum, int dim = 0) {
    return reduce_scatter_any(AnyTensor(in), AnyTensor(out), op, dim);
  }
  template <Dtype T, DeviceKind K>
  void reduce_scatter(const Tensor<T, K>& in, const Tensor<T, K>& out,
                      ReduceOp op = ReduceOp::sum, int dim = 0) {
    reduce_scatter_async(in, out, op, dim).wait();
  }

  /// Sends t to rank `to`, whose recv receives it (sends from one rank to another arrive in
  /// order). The async form lets the caller go on; t must not change until wait().
  template <Dtype T, DeviceKind K>
  Work send_async(const Tensor<T, K>& t, int to) {
    return send_any(AnyTensor(t), to);
  }
  template <Dtype T, DeviceKind K>
  void send(const Tensor<T, K>& t, int to) {
    send_async(t, to).wait();
  }

  /// Receives into t what rank `from` sends: the same dtype and element count (shape_error
  /// naming both counts otherwise; a longer message is an MPI truncation error).
  template <Dtype T, DeviceKind K>
  Work recv_async(const Tensor<T, K>& t, int from) {
    return recv_any(AnyTensor(t), from);
  }
  template <Dtype T, DeviceKind K>
  void recv(const Tensor<T, K>& t, int from) {
    recv_async(t, from).wait();
  }

  /// Returns when every rank has called barrier.
  Work barrier_async() {
    auto op = make_collective("barrier", detail::collective_call::barrier());
    // Every rank has reached it once the engine lets it start (every rank is ready): done.
    op->step = [](MPI_Request&, const MPI_Status&) { return false; };
    return submit(std::move(op));
  }
  void barrier() { barrier_async().wait(); }

 private:
  // A send or receive.
  std::shared_ptr<detail::operation> make(const char* name) const {
    auto op = std::make_shared<detail::operation>();
    op->name = name;
    op->collective = false;
    return op;
  }
  // A collective; `call` is what this rank asks of it, compared with every rank's before it runs.
  std::shared_ptr<detail::operation> make_collective(const char* name,
                                                     const detail::collective_call& call) const {
    auto op = std::make_shared<detail::operation>();
    op->name = name;
    op->collective = true;
    op->call = call;
    return op;
  }
  Work submit(std::shared_ptr<detail::operation> op) {
    detail::runtime& r = detail::state();
    std::shared_ptr<detail::work_state> work = op->work;
    {
      std::lock_guard lock(r.mutex);
      if (!r.engine) {
        throw communication_error("ProcessGroup::" + op->name +
                                  ": ts::distributed::finalize() has been called");
      }
      r.engine->submit(group_, std::move(op));
    }
    return Work(std::move(work));
  }

  void check_tensor(const AnyTensor& t, const char* what, const char* role,
                    bool written) const {
    if (!t.defined()) {
      throw std::invalid_argument(std::string("ProcessGroup::") + what + ": the " + role +
                                  " is undefined");
    }
    if (t.device().type == DeviceType::cuda) {
#if TESSERA_CUDA && TESSERA_NCCL
      detail::check_nccl_device(*group_, t.device(), what);
#else
      throw device_error(std::string("ProcessGroup::") + what + ": the " + role + " is on " +
                         t.device().str() +
                         "; CUDA tensors travel through NCCL, which this build does not have "
                         "(CMake: TESSERA_WITH_CUDA and TESSERA_WITH_NCCL)");
#endif
    }
    if (written && !t.is_contiguous()) {
      throw std::invalid_argument(std::string("ProcessGroup::") + what + ": the " + role +
                                  " (shape " + t.shape().str() +
                                  ") is not contiguous; it is written in place");
    }
  }
  void check_rank(int r, const char* what, const char* role) const {
    if (r < 0 || r >= size()) {
      throw std::invalid_argument(std::string("ProcessGroup::") + what + ": " + role + " " +
                                  std::to_string(r) + " is not a rank of this group (size " +
                                  std::to_string(size()) + ")");
    }
  }
  // The other end of a send or receive: a rank of the group, not this one.
  void check_peer(int r, const char* what, const char* role) const {
    check_rank(r, what, role);
    if (r == rank()) {
      throw std::invalid_argument(std::string("ProcessGroup::") + what + ": rank " +
                                  std::to_string(r) + " is this rank; it cannot be the " + role);
    }
  }
  void check_op(ReduceOp op, ScalarType dtype, const char* what) const {
    if (op == ReduceOp::avg && !is_floating_point(dtype)) {
      throw dtype_error(std::string("ProcessGroup::") + what + ": avg needs a floating dtype, not " +
                        name(dtype));
    }
  }

  // An elementwise reduction or broadcast of `t` in pieces of at most piece_limit() elements:
  // `post(data, count, type)` runs one piece (a blocking collective: the engine starts a
  // collective only once every rank has reached it). Half and bfloat16 are staged in
  // float when `reducing`; `divide_by` > 1 divides the result (avg) where `written`.
  template <class Post>
  Work elementwise(const char* name, const detail::collective_call& call, AnyTensor t,
                   bool reducing, bool written, int divide_by, Post post) {
    auto op = make_collective(name, call);
    struct progress {
      Tensor<float, cpu> staging;  // half / bfloat16 reduced in float
      std::int64_t offset = 0;
      bool started = false;
    };
    op->step = [t, reducing, written, divide_by, post, p = progress{}](
                   MPI_Request&, const MPI_Status&) mutable {
      const bool staged = reducing && detail::is_16bit_float(t.dtype());
      const MPI_Datatype type = detail::mpi_type(t.dtype(), reducing);
      const std::int64_t n = t.numel();
      if (!p.started) {
        p.started = true;
        if (staged) p.staging = detail::to_float(t);
      }
      char* base = static_cast<char*>(staged ? p.staging.data() : t.data_ptr());
      if (p.offset < n) {
        const std::int64_t count = std::min(detail::piece_limit(), n - p.offset);
        post(base + p.offset * detail::mpi_type_size(type), static_cast<int>(count), type);
        p.offset += count;
        return true;
      }
      if (written && divide_by > 1) detail::divide(base, n, type, divide_by);
      if (written && staged) detail::copy_from_float(t, p.staging);
      return false;
    };
    return submit(std::move(op));
  }

  Work all_reduce_any(const AnyTensor& t, ReduceOp op) {
    check_tensor(t, "all_reduce", "tensor", true);
    check_op(op, t.dtype(), "all_reduce");
    const auto call = detail::collective_call::on(detail::collective_kind::all_reduce, t.dtype(),
                                                  t.device().type, t.shape())
                          .with_op(op);
#if TESSERA_CUDA && TESSERA_NCCL
    if (t.device().type == DeviceType::cuda) {
      const ncclDataType_t type = detail::nccl_type(t.dtype(), "all_reduce");
      const ncclRedOp_t reduce = detail::nccl_reduce_op(op, t.dtype());
      return nccl_collective("all_reduce", call, t,
                             [t, type, reduce](ncclComm_t comm, cudaStream_t s) {
        TESSERA_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(),
                                         static_cast<std::size_t>(t.numel()), type, reduce, comm,
                                         s));
      });
    }
#endif
    const MPI_Op mpi = detail::mpi_op(op, t.dtype());
    auto group = group_;
    return elementwise("all_reduce", call, t, true, true, op == ReduceOp::avg ? size() : 1,
                       [group, mpi](char* data, int count, MPI_Datatype type) {
                         TESSERA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, type, mpi,
                                                         group->comm));
                       });
  }

  Work broadcast_any(const AnyTensor& t, int root) {
    check_tensor(t, "broadcast", "tensor", true);
    check_rank(root, "broadcast", "root");
    const auto call = detail::collective_call::on(detail::collective_kind::broadcast, t.dtype(),
                                                  t.device().type, t.shape())
                          .with_root(root);
#if TESSERA_CUDA && TESSERA_NCCL
    if (t.device().type == DeviceType::cuda) {  // bytes: every dtype, int16 too
      return nccl_collective("broadcast", call, t, [t, root](ncclComm_t comm, cudaStream_t s) {
        TESSERA_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root,
                                         comm, s));
      });
    }
#endif
    auto group = group_;
    return elementwise("broadcast", call, t, false, true, 1,
                       [group, root](char* data, int count, MPI_Datatype type) {
                         TESSERA_MPI_CHECK(MPI_Bcast(data, count, type, root, group->comm));
                       });
  }

  Work reduce_any(const AnyTensor& t, int root, ReduceOp op) {
    check_tensor(t, "reduce", "tensor", true);
    check_rank(root, "reduce", "root");
    check_op(op, t.dtype(), "reduce");
    const auto call = detail::collective_call::on(detail::collective_kind::reduce, t.dtype(),
                                                  t.device().type, t.shape())
                          .with_op(op)
                          .with_root(root);
#if TESSERA_CUDA && TESSERA_NCCL
    if (t.device().type == DeviceType::cuda) {
      const ncclDataType_t type = detail::nccl_type(t.dtype(), "reduce");
      const ncclRedOp_t reduce = detail::nccl_reduce_op(op, t.dtype());
      return nccl_collective("reduce", call, t,
                             [t, type, reduce, root](ncclComm_t comm, cudaStream_t s) {
        TESSERA_NCCL_CHECK(ncclReduce(t.data_ptr(), t.data_ptr(),
                                      static_cast<std::size_t>(t.numel()), type, reduce, root,
                                      comm, s));
      });
    }
#endif
    const MPI_Op mpi = detail::mpi_op(op, t.dtype());
    auto group = group_;
    const bool is_root = rank() == root;
    return elementwise(
        "reduce", call, t, true, is_root, op == ReduceOp::avg ? size() : 1,
        [group, mpi, root, is_root](char* data, int count, MPI_Datatype type) {
          TESSERA_MPI_CHECK(MPI_Reduce(is_root ? MPI_IN_PLACE : data, is_root ? data : nullptr,
                                       count, type, mpi, root, group->comm));
        });
  }

  // Checks what every rank can check alone: dtypes, and out's extents against in's but along d.
  int check_concatenation(const AnyTensor& in, const AnyTensor& out, int dim, const char* what,
                          ReduceOp op = ReduceOp::sum) const {
    check_tensor(in, what, "input", false);
    check_tensor(out, what, "output", true);
    check_op(op, in.dtype(), what);
    if (in.dtype() != out.dtype()) {
      throw dtype_error(std::string("ProcessGroup::") + what + ": the input is " +
                        name(in.dtype()) + ", the output " + name(out.dtype()));
    }
    if (in.device().type != out.device().type) {  // one goes through MPI, the other NCCL
      throw device_mismatch_error(std::string("ProcessGroup::") + what + ": the input is on " +
                                  in.device().str() + ", the output on " + out.device().str());
    }
    const int d = in.shape().normalize_dim(dim, (std::string("ProcessGroup::") + what).c_str());
    bool fits = out.dim() == in.dim();
    for (int k = 0; fits && k < in.dim(); ++k) fits = k == d || out.shape()[k] == in.shape()[k];
    if (!fits) {
      throw shape_error(std::string("ProcessGroup::") + what + ": the output's shape " +
                        out.shape().str() + " must match the input's " + in.shape().str() +
                        " in every dim but " + std::to_string(d));
    }
    return d;
  }

  Work all_gather_any(const AnyTensor& in, const AnyTensor& out, int dim) {
    const int d = check_concatenation(in, out, dim, "all_gather");
    const AnyTensor source = contiguous(in);
    const auto call = detail::collective_call::on(detail::collective_kind::all_gather, in.dtype(),
                                                  in.device().type, in.shape())
                          .along(d, out.shape()[d]);
#if TESSERA_CUDA && TESSERA_NCCL
    if (in.device().type == DeviceType::cuda) return nccl_all_gather(call, source, out, d);
#endif
    auto op = make_collective("all_gather", call);
    // Each rank's piece as one block of outer * length * inner elements, gathered into a staging
    // buffer in rank order (MPI_Allgatherv), then laid out along d. The lengths are the agreed
    // calls' (every output fits: the ranks checked before they came here).
    op->step = [group = group_, self = op.get(), source, out, d](MPI_Request&, const MPI_Status&) {
      const auto [outer, inner] = parallel::detail::outer_inner(source.shape(), d);
      const auto element = static_cast<std::int64_t>(element_size(source.dtype()));
      const MPI_Datatype type = detail::mpi_type(source.dtype(), false);
      const auto lengths = input_lengths(*self, d);
      std::vector<int> counts, displacements;
      std::int64_t offset = 0;
      for (std::int64_t length : lengths) {
        counts.push_back(detail::checked_count(outer * length * inner, "all_gather"));
        displacements.push_back(detail::checked_count(offset, "all_gather"));
        offset += outer * length * inner;
      }
      auto staging = Tensor<std::uint8_t, cpu>::empty_on({offset * element}, source.device());
      TESSERA_MPI_CHECK(MPI_Allgatherv(source.data_ptr(), counts[static_cast<std::size_t>(group->rank)],
                                       type, staging.data(), counts.data(), displacements.data(),
                                       type, group->comm));
      const std::int64_t total = out.shape()[d];
      const char* from = reinterpret_cast<const char*>(staging.data());
      char* to = static_cast<char*>(out.data_ptr());
      std::int64_t along = 0;
      for (std::size_t r = 0; r < lengths.size(); ++r) {
        // Rank r's block is [outer, length_r, inner]: row o goes to out[o, along.., :].
        const std::int64_t row = lengths[r] * inner * element;
        const char* block = from + displacements[r] * element;
        for (std::int64_t o = 0; o < outer; ++o) {
          std::memcpy(to + (o * total + along) * inner * element, block + o * row,
                      static_cast<std::size_t>(row));
        }
        along += lengths[r];
      }
      return false;
    };
    return submit(std::move(op));
  }

  Work reduce_scatter_any(const AnyTensor& in, const AnyTensor& out, ReduceOp op, int dim) {
    const int d = check_concatenation(in, out, dim, "reduce_scatter", op);
    const AnyTensor source = contiguous(in);
    const auto call = detail::collective_call::on(detail::collective_kind::reduce_scatter,
                                                  in.dtype(), in.device().type, in.shape())
                          .with_op(op)
                          .along(d, out.shape()[d]);
#if TESSERA_CUDA && TESSERA_NCCL
    if (in.device().type == DeviceType::cuda) return nccl_reduce_scatter(call, source, out, op, d);
#endif
    auto operation = make_collective("reduce_scatter", call);
    // The input packed rank by rank (rank r's slice [outer, length_r, inner] contiguous), then
    // MPI_Reduce_scatter; half and bfloat16 in float. The slices' lengths are the agreed calls'.
    operation->step = [group = group_, self = operation.get(), source, out, d,
                       mpi = detail::mpi_op(op, in.dtype()),
                       divide_by = op == ReduceOp::avg ? size() : 1](MPI_Request&,
                                                                     const MPI_Status&) {
      const auto [outer, inner] = parallel::detail::outer_inner(source.shape(), d);
      // Half and bfloat16 are packed and reduced in float.
      const bool staged = detail::is_16bit_float(source.dtype());
      const AnyTensor input = staged ? AnyTensor(detail::to_float(source)) : source;
      const MPI_Datatype type = detail::mpi_type(source.dtype(), true);
      const auto element = static_cast<std::int64_t>(element_size(input.dtype()));
      const auto lengths = output_lengths(*self);
      const std::int64_t total = source.shape()[d];
      auto packed = Tensor<std::uint8_t, cpu>::empty_on({input.numel() * element},
                                                        input.device());
      const char* from = static_cast<const char*>(input.data_ptr());
      char* to = reinterpret_cast<char*>(packed.data());
      std::vector<int> counts;
      std::int64_t along = 0;
      for (std::int64_t length : lengths) {
        const std::int64_t row = length * inner * element;
        counts.push_back(detail::checked_count(outer * length * inner, "reduce_scatter"));
        for (std::int64_t o = 0; o < outer; ++o) {
          std::memcpy(to, from + (o * total + along) * inner * element,
                      static_cast<std::size_t>(row));
          to += row;
        }
        along += length;
      }
      const Tensor<float, cpu> result =
          staged ? Tensor<float, cpu>::empty_on(out.shape(), out.device()) : Tensor<float, cpu>();
      void* receive = staged ? static_cast<void*>(result.data()) : out.data_ptr();
      TESSERA_MPI_CHECK(
          MPI_Reduce_scatter(packed.data(), receive, counts.data(), type, mpi, group->comm));
      if (divide_by > 1) detail::divide(receive, out.numel(), type, divide_by);
      if (staged) detail::copy_from_float(out, result);
      return false;
    };
    return submit(std::move(operation));
  }

  Work send_any(const AnyTensor& t, int to) {
    check_tensor(t, "send", "tensor", false);
    check_peer(to, "send", "destination");
    auto op = make("send");
    op->peer = to;
    auto group = group_;
    const AnyTensor source = contiguous(t);
#if TESSERA_CUDA && TESSERA_NCCL
    if (t.device().type == DeviceType::cuda) {
      return nccl_operation(std::move(op), source, [source, to](ncclComm_t comm, cudaStream_t s) {
        TESSERA_NCCL_CHECK(ncclSend(source.data_ptr(), source.nbytes(), ncclUint8, to, comm, s));
      });
    }
#endif
    op->step = [group, source, to, posted = false](MPI_Request& request,
                                                   const MPI_Status&) mutable {
      if (posted) return false;
      posted = true;
      TESSERA_MPI_CHECK(MPI_Isend(source.data_ptr(),
                                  detail::checked_count(source.numel(), "send"),
                                  detail::mpi_type(source.dtype(), false), to, point_to_point_tag,
                                  group->comm, &request));
      return true;
    };
    return submit(std::move(op));
  }

  Work recv_any(const AnyTensor& t, int from) {
    check_tensor(t, "recv", "tensor", true);
    check_peer(from, "recv", "source");
    auto op = make("recv");
    op->peer = from;
    auto group = group_;
#if TESSERA_CUDA && TESSERA_NCCL
    if (t.device().type == DeviceType::cuda) {  // NCCL cannot tell a shorter message: sizes match
      return nccl_operation(std::move(op), t, [t, from](ncclComm_t comm, cudaStream_t s) {
        TESSERA_NCCL_CHECK(ncclRecv(t.data_ptr(), t.nbytes(), ncclUint8, from, comm, s));
      });
    }
#endif
    op->step = [group, t, from, posted = false](MPI_Request& request,
                                                const MPI_Status& status) mutable {
      const MPI_Datatype type = detail::mpi_type(t.dtype(), false);
      if (!posted) {
        posted = true;
        TESSERA_MPI_CHECK(MPI_Irecv(t.data_ptr(), detail::checked_count(t.numel(), "recv"), type,
                                    from, point_to_point_tag, group->comm, &request));
        return true;
      }
      int received = 0;
      TESSERA_MPI_CHECK(MPI_Get_count(&status, type, &received));
      if (received != t.numel()) {
        throw shape_error("ProcessGroup::recv: rank " + std::to_string(from) + " sent " +
                          std::to_string(received) + " elements; the tensor (shape " +
                          t.shape().str() + ") has " + std::to_string(t.numel()));
      }
      return false;
    };
    return submit(std::move(op));
  }

  // Every rank's input extent along d (all_gather), and every rank's output length along the
  // concatenated dim (reduce_scatter), from the calls the ranks agreed on.
  static std::vector<std::int64_t> input_lengths(const detail::operation& op, int d) {
    std::vector<std::int64_t> lengths;
    for (const auto& call : op.agreed) lengths.push_back(call.extents[d]);
    return lengths;
  }
  static std::vector<std::int64_t> output_lengths(const detail::operation& op) {
    std::vector<std::int64_t> lengths;
    for (const auto& call : op.agreed) lengths.push_back(call.output_length);
    return lengths;
  }

  // t itself when contiguous, else a contiguous copy on t's device (for a CUDA tensor, on the
  // calling thread's current stream: before the operation's NCCL calls). For inputs only read.
  static AnyTensor contiguous(const AnyTensor& t) {
    return t.visit([](const auto& typed) -> AnyTensor { return typed.contiguous(); });
  }

#if TESSERA_CUDA && TESSERA_NCCL
  // NCCL calls on the caller's current stream of `t`'s device (collectives once every rank is
  // ready, sends and receives at once); complete when the GPU has run them.
  template <class Issue>
  Work nccl_operation(std::shared_ptr<detail::operation> op, const AnyTensor& t, Issue issue) {
    op->step = [group = group_, self = op.get(), stream = current_stream(t.device()), issue,
                posted = false](MPI_Request&, const MPI_Status&) mutable {
      if (posted) return false;
      posted = true;
      detail::enqueue_nccl(*group, *self, stream, issue);
      return true;
    };
    return submit(std::move(op));
  }
  template <class Issue>
  Work nccl_collective(const char* name, const detail::collective_call& call, const AnyTensor& t,
                       Issue issue) {
    return nccl_operation(make_collective(name, call), t, issue);
  }

  // all_gather on CUDA: every rank's piece broadcast (bytes, uneven lengths along d, known from
  // the agreed calls) into a staging buffer in rank order, then laid out into `out` along d.
  Work nccl_all_gather(const detail::collective_call& call, const AnyTensor& source,
                       const AnyTensor& out, int d) {
    auto op = make_collective("all_gather", call);
    op->step = [group = group_, self = op.get(), stream = current_stream(source.device()), source,
                out, d, staging = Tensor<std::uint8_t, cuda>()](MPI_Request&,
                                                                const MPI_Status&) mutable {
      if (staging.defined()) return false;  // the GPU work is done
      const auto [outer, inner] = parallel::detail::outer_inner(source.shape(), d);
      const auto element = static_cast<std::int64_t>(element_size(source.dtype()));
      const auto lengths = input_lengths(*self, d);
      const std::int64_t total = out.shape()[d];  // the lengths' sum (agreed)
      staging = Tensor<std::uint8_t, cuda>::empty_on({outer * total * inner * element},
                                                     source.device());
      char* base = reinterpret_cast<char*>(staging.data());
      auto issue = [&](ncclComm_t comm, cudaStream_t s) {
        std::int64_t offset = 0;  // bytes
        for (int r = 0; r < group->size; ++r) {
          const std::int64_t bytes = outer * lengths[static_cast<std::size_t>(r)] * inner * element;
          const void* send = r == group->rank ? source.data_ptr() : base + offset;
          TESSERA_NCCL_CHECK(ncclBroadcast(send, base + offset, static_cast<std::size_t>(bytes),
                                           ncclUint8, r, comm, s));
          offset += bytes;
        }
      };
      auto lay_out = [&](const Stream& s) {
        std::int64_t offset = 0, along = 0;
        for (std::int64_t length : lengths) {
          const std::int64_t row = length * inner * element;
          detail::copy_rows(static_cast<char*>(out.data_ptr()) + along * inner * element,
                            static_cast<std::size_t>(total * inner * element), base + offset,
                            static_cast<std::size_t>(row), static_cast<std::size_t>(row),
                            static_cast<std::size_t>(outer), s);
          offset += outer * row;
          along += length;
        }
      };
      detail::enqueue_nccl(*group, *self, stream, [](const Stream&) {}, issue, lay_out);
      return true;
    };
    return submit(std::move(op));
  }

  // reduce_scatter on CUDA: the input packed rank by rank on the GPU (the slices' lengths are the
  // agreed calls' outputs'), then one ncclReduce per rank's slice, rooted there.
  Work nccl_reduce_scatter(const detail::collective_call& call, const AnyTensor& source,
                           const AnyTensor& out, ReduceOp reduce_op, int d) {
    auto op = make_collective("reduce_scatter", call);
    op->step = [group = group_, self = op.get(), stream = current_stream(source.device()), source,
                out, d, type = detail::nccl_type(source.dtype(), "reduce_scatter"),
                reduce = detail::nccl_reduce_op(reduce_op, source.dtype()),
                packed = Tensor<std::uint8_t, cuda>()](MPI_Request&, const MPI_Status&) mutable {
      if (packed.defined()) return false;  // the GPU work is done
      const auto [outer, inner] = parallel::detail::outer_inner(source.shape(), d);
      const auto element = static_cast<std::int64_t>(element_size(source.dtype()));
      const auto lengths = output_lengths(*self);
      const std::int64_t total = source.shape()[d];
      packed = Tensor<std::uint8_t, cuda>::empty_on({source.numel() * element}, source.device());
      char* base = reinterpret_cast<char*>(packed.data());
      auto pack = [&](const Stream& s) {
        std::int64_t offset = 0, along = 0;
        for (std::int64_t length : lengths) {
          const std::int64_t row = length * inner * element;
          detail::copy_rows(base + offset, static_cast<std::size_t>(row),
                            static_cast<const char*>(source.data_ptr()) + along * inner * element,
                            static_cast<std::size_t>(total * inner * element),
                            static_cast<std::size_t>(row), static_cast<std::size_t>(outer), s);
          offset += outer * row;
          along += length;
        }
      };
      auto issue = [&](ncclComm_t comm, cudaStream_t s) {
        std::int64_t offset = 0;  // bytes
        for (int r = 0; r < group->size; ++r) {
          const std::int64_t count = outer * lengths[static_cast<std::size_t>(r)] * inner;
          void* slice = base + offset;
          void* receive = r == group->rank ? out.data_ptr() : slice;  // used on the root only
          TESSERA_NCCL_CHECK(ncclReduce(slice, receive, static_cast<std::size_t>(count), type,
                                        reduce, r, comm, s));
          offset += count * element;
        }
      };
      detail::enqueue_nccl(*group, *self, stream, pack, issue, [](const Stream&) {});
      return true;
    };
    return submit(std::move(op));
  }
#endif
  static constexpr int point_to_point_tag = 11;
  std::shared_ptr<detail::group_state> group_;
};

}  // namespace tessera::distributed
