// In-process collectives (DESIGN §3.7): tensors that live one per device, reduced, broadcast,
// gathered and scattered between the devices of one process. On CPU virtual devices each member's
// thread (parallel::DeviceThreads) works on its share of the elements and writes in place, so an
// all_reduce over N devices runs on N threads with no gather-then-scatter through one of them.
// Every call checks all its arguments before anything is written: a count, shape, device or root
// that does not fit throws naming the member, its device and the values.
//
// ReduceOp (reduce_op.hpp), even_split (even_split.hpp) and the CPU engine
// (detail/reduce_elements.hpp) are in their headers, which this one includes.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/half.hpp"
#include "tessera/parallel/detail/nccl.hpp"
#include "tessera/parallel/detail/reduce_elements.hpp"
#include "tessera/parallel/device_threads.hpp"
#include "tessera/parallel/even_split.hpp"
#include "tessera/parallel/reduce_op.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/factories.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::parallel {

namespace detail {

/// The extents before and after `dim` of a shape: a contiguous tensor is [outer, shape[dim], inner].
inline std::pair<std::int64_t, std::int64_t> outer_inner(const Shape& shape, int dim) {
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (int d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  return {outer, inner};
}

/// One rendezvous slot for send/recv from one member to another.
struct mailbox {
  std::mutex mutex;
  std::condition_variable changed;
  AnyTensor posted;          // the sender's tensor while a send waits
  bool has_post = false;
  bool taken = false;        // the receiver copied it
  std::string failure;       // the receiver refused it (shape or dtype), for the sender too
};

}  // namespace detail

/// In-process collectives over the devices `device_ids` of kind `Kind` (one member per device, in
/// that order). Collective calls take one tensor per member, `ts[i]` on `device_ids[i]`, all of
/// the same shape unless the call says otherwise, contiguous where written in place. A
/// Communicator may be used from several threads, one collective at a time (calls wait their
/// turn); send and recv are called from the two members' threads.
///
/// CPU: the work is split over the members' threads (DeviceThreads), each on its share of the
/// cores; a call returns when its result is complete.
/// CUDA: NCCL (CMake's TESSERA_WITH_NCCL, on when NCCL is found; without it the constructor throws
/// tessera::error). The NCCL communicators are created once per device set (ncclCommInitAll) and
/// shared by the Communicators over it. all_reduce, broadcast, reduce, all_gather and
/// reduce_scatter are one NCCL group each, queued on every member's current stream (as any CUDA
/// work in Tessera): later work on those streams sees the result; the host does not wait.
/// scatter, gather, send and recv are device-to-device copies. int16 has no NCCL type
/// (dtype_error).
template <DeviceKind Kind>
class Communicator {
#if TESSERA_CUDA && TESSERA_NCCL
  static constexpr bool uses_nccl = Kind::type == DeviceType::cuda;
#else
  static constexpr bool uses_nccl = false;  // Communicator<cuda>'s constructor throws
#endif

 public:
  /// A communicator over `device_ids` (non-empty, existing, distinct ordinals of Kind). Throws
  /// std::invalid_argument or device_error naming the member.
  explicit Communicator(std::vector<int> device_ids) : threads_(check_kind(std::move(device_ids))) {
    const std::size_t n = threads_.device_ids().size();
    mailboxes_.reserve(n * n);
    for (std::size_t i = 0; i < n * n; ++i) mailboxes_.push_back(std::make_unique<detail::mailbox>());
#if TESSERA_CUDA && TESSERA_NCCL
    if constexpr (uses_nccl) nccl_ = detail::nccl_clique::get(threads_.device_ids());
#endif
  }

  int size() const noexcept { return threads_.size(); }
  const std::vector<int>& device_ids() const noexcept { return threads_.device_ids(); }
  /// The member whose device is `device_index`, or -1.
  int member_of(int device_index) const noexcept {
    const auto& ids = device_ids();
    auto it = std::find(ids.begin(), ids.end(), device_index);
    return it == ids.end() ? -1 : static_cast<int>(it - ids.begin());
  }

  /// In place: every ts[i] becomes op over all members' ts (same shape, contiguous). `avg` needs a
  /// floating dtype (dtype_error otherwise).
  template <Dtype T>
  void all_reduce(const std::vector<Tensor<T, Kind>>& ts, ReduceOp op = ReduceOp::sum) {
    check_reduce_op<T>("all_reduce", op);
    check_same_shapes("all_reduce", ts, true);
    if constexpr (uses_nccl) return this->nccl_all_reduce(ts, op);
    std::vector<const T*> sources = pointers<const T>(ts);
    std::vector<T*> targets = pointers<T>(ts);
    const std::int64_t n = ts[0].numel();
    run([&](int member) {
      const auto [first, last] = share(n, member);
      detail::reduce_elements(op, sources.data(), size(), targets.data(), size(), first, last);
    });
  }

  /// Every ts[i] becomes a copy of ts[root] (same shape, contiguous).
  template <Dtype T>
  void broadcast(const std::vector<Tensor<T, Kind>>& ts, int root = 0) {
    check_root("broadcast", root);
    check_same_shapes("broadcast", ts, true);
    if constexpr (uses_nccl) return this->nccl_broadcast(ts, root);
    std::vector<T*> targets = pointers<T>(ts);
    const std::int64_t n = ts[0].numel();
    run([&](int member) {
      const auto [first, last] = share(n, member);
      if (first >= last) return;
      for (int i = 0; i < size(); ++i) {
        if (i == root) continue;
        std::memcpy(static_cast<void*>(targets[static_cast<std::size_t>(i)] + first),
                    targets[static_cast<std::size_t>(root)] + first,
                    static_cast<std::size_t>(last - first) * sizeof(T));
      }
    });
  }

  /// ts[root] becomes op over all members' ts; the others are unchanged.
  template <Dtype T>
  void reduce(const std::vector<Tensor<T, Kind>>& ts, int root = 0, ReduceOp op = ReduceOp::sum) {
    check_root("reduce", root);
    check_reduce_op<T>("reduce", op);
    check_same_shapes("reduce", ts, true);
    if constexpr (uses_nccl) return this->nccl_reduce(ts, root, op);
    std::vector<const T*> sources = pointers<const T>(ts);
    T* target = ts[static_cast<std::size_t>(root)].data();
    const std::int64_t n = ts[0].numel();
    run([&](int member) {
      const auto [first, last] = share(n, member);
      detail::reduce_elements(op, sources.data(), size(), &target, 1, first, last);
    });
  }

  /// out[j] = cat(in, dim) for every member j: the inputs may differ in size along `dim` (the
  /// other extents agree), and each out[j] has their total along it.
  template <Dtype T>
  void all_gather(const std::vector<Tensor<T, Kind>>& in, const std::vector<Tensor<T, Kind>>& out,
                  int dim = 0) {
    check_members("all_gather", in, "input");
    check_members("all_gather", out, "output");
    const int d = check_concatenation("all_gather", in, dim);
    const Shape total = concatenated_shape(in, d);
    for (int j = 0; j < size(); ++j) {
      if (out[static_cast<std::size_t>(j)].shape() != total) {
        throw shape_error("Communicator::all_gather: output of member " + std::to_string(j) +
                          " (" + out[static_cast<std::size_t>(j)].device().str() +
                          ") has shape " + out[static_cast<std::size_t>(j)].shape().str() +
                          "; the inputs concatenated along dim " + std::to_string(d) + " give " +
                          total.str());
      }
    }
    if constexpr (uses_nccl) return this->nccl_all_gather(in, out, d);
    const std::vector<std::int64_t> offsets = offsets_along(in, d);
    run([&](int member) {
      const auto m = static_cast<std::size_t>(member);
      const Tensor<T, Kind>& piece = in[m];
      if (piece.numel() == 0) return;
      for (const Tensor<T, Kind>& target : out) {
        Tensor<T, Kind> slot = target.narrow(d, offsets[m], piece.size(d));
        slot.copy_(piece);
      }
    });
  }

  /// out[j] = slice j of (op over all members' in), along `dim`: the slices are consecutive, out[j]
  /// is as long along `dim` as its slice, and the lengths add up to in's extent (even_split gives
  /// the usual ones). Inputs share one shape; inputs and outputs are contiguous.
  template <Dtype T>
  void reduce_scatter(const std::vector<Tensor<T, Kind>>& in,
                      const std::vector<Tensor<T, Kind>>& out, ReduceOp op = ReduceOp::sum,
                      int dim = 0) {
    check_reduce_op<T>("reduce_scatter", op);
    check_same_shapes("reduce_scatter", in, true);
    check_members("reduce_scatter", out, "output");
    const Shape& shape = in[0].shape();
    const int d = shape.normalize_dim(dim, "Communicator::reduce_scatter");
    std::int64_t total = 0;
    for (int j = 0; j < size(); ++j) {
      const Tensor<T, Kind>& o = out[static_cast<std::size_t>(j)];
      check_contiguous("reduce_scatter", o, j, "output");
      bool fits = o.dim() == shape.size();
      for (int k = 0; fits && k < shape.size(); ++k) fits = k == d || o.size(k) == shape[k];
      if (!fits) {
        throw shape_error("Communicator::reduce_scatter: output of member " + std::to_string(j) +
                          " (" + o.device().str() + ") has shape " + o.shape().str() +
                          "; it must match the input shape " + shape.str() +
                          " in every dim but " + std::to_string(d));
      }
      total += o.size(d);
    }
    if (total != shape[d]) {
      throw shape_error("Communicator::reduce_scatter: the outputs add up to " +
                        std::to_string(total) + " along dim " + std::to_string(d) +
                        ", the input shape " + shape.str() + " has " + std::to_string(shape[d]));
    }
    if constexpr (uses_nccl) return this->nccl_reduce_scatter(in, out, op, d);
    std::vector<const T*> sources = pointers<const T>(in);
    const auto [outer, inner] = detail::outer_inner(shape, d);
    std::vector<std::int64_t> offsets = offsets_along(out, d);
    run([&](int member) {
      const auto m = static_cast<std::size_t>(member);
      const std::int64_t rows = out[m].size(d) * inner;  // elements per outer index
      if (rows == 0) return;
      std::vector<const T*> row_sources(sources.size());
      for (std::int64_t o = 0; o < outer; ++o) {
        const std::int64_t start = (o * shape[d] + offsets[m]) * inner;
        for (std::size_t s = 0; s < sources.size(); ++s) row_sources[s] = sources[s] + start;
        T* target = out[m].data() + o * rows;
        detail::reduce_elements(op, row_sources.data(), size(), &target, 1, 0, rows);
      }
    });
  }

  /// Pieces of `t` along `dim`, piece i on device_ids()[i]: sizes `chunk_sizes` if given (one per
  /// member, adding up to t's extent), else even_split (differ by at most one; with fewer items
  /// than members the last pieces are empty). `t` may be on any device of Kind, in any layout.
  template <Dtype T>
  std::vector<Tensor<T, Kind>> scatter(const Tensor<T, Kind>& t, int dim = 0,
                                       std::vector<std::int64_t> chunk_sizes = {}) {
    if (!t.defined()) throw error("Communicator::scatter: the tensor is undefined");
    const int d = t.shape().normalize_dim(dim, "Communicator::scatter");
    if (chunk_sizes.empty()) {
      chunk_sizes = even_split(t.size(d), size());
    } else {
      check_chunk_sizes(chunk_sizes, t.shape(), d);
    }
    std::vector<Tensor<T, Kind>> pieces;
    pieces.reserve(static_cast<std::size_t>(size()));
    for (int i = 0; i < size(); ++i) {
      Shape shape = t.shape();
      shape[d] = chunk_sizes[static_cast<std::size_t>(i)];
      pieces.push_back(empty<T, Kind>(shape, device_ids()[static_cast<std::size_t>(i)]));
    }
    const std::vector<std::int64_t> offsets = offsets_along(pieces, d);
    run([&](int member) {
      const auto m = static_cast<std::size_t>(member);
      if (pieces[m].numel() == 0) return;
      pieces[m].copy_(t.narrow(d, offsets[m], chunk_sizes[m]));
    });
    return pieces;
  }

  /// cat(ts, dim) as a new tensor on device `device` of Kind (any existing ordinal, -1: the
  /// current one); each member copies its piece. Pieces may differ in size along `dim`.
  template <Dtype T>
  Tensor<T, Kind> gather(const std::vector<Tensor<T, Kind>>& ts, int device = -1, int dim = 0) {
    check_members("gather", ts, "tensor");
    const int d = check_concatenation("gather", ts, dim);
    Tensor<T, Kind> out = empty<T, Kind>(concatenated_shape(ts, d), device);
    const std::vector<std::int64_t> offsets = offsets_along(ts, d);
    run([&](int member) {
      const auto m = static_cast<std::size_t>(member);
      if (ts[m].numel() == 0) return;
      Tensor<T, Kind> slot = out.narrow(d, offsets[m], ts[m].size(d));
      slot.copy_(ts[m]);
    });
    return out;
  }

  /// Sends `t` to member `to`: blocks until that member's recv has copied it. The sender is the
  /// member whose device holds `t`. Call it from the sending member's thread, with a matching
  /// recv on the receiving one's. Throws when the receiver's tensor does not fit (shape, dtype).
  template <Dtype T>
  void send(const Tensor<T, Kind>& t, int to) {
    const int from = sender_member("send", t);
    check_peer("send", to, from);
    detail::mailbox& box = mailbox_of(from, to);
    std::unique_lock lock(box.mutex);
    box.changed.wait(lock, [&] { return !box.has_post; });  // an earlier send is still waiting
    box.posted = t;
    box.has_post = true;
    box.taken = false;
    box.failure.clear();
    box.changed.notify_all();
    box.changed.wait(lock, [&] { return box.taken || !box.failure.empty(); });
    std::string failure = std::move(box.failure);
    box.posted = AnyTensor();
    box.has_post = false;
    box.taken = false;
    box.failure.clear();
    box.changed.notify_all();
    if (!failure.empty()) throw shape_error(failure);
  }

  /// Receives into `t` what member `from` sends (blocks until it does). The receiver is the member
  /// whose device holds `t`; the sent tensor must have t's shape and dtype, else both sides throw
  /// and `t` is unchanged.
  template <Dtype T>
  void recv(const Tensor<T, Kind>& t, int from) {
    const int to = sender_member("recv", t);
    check_peer("recv", from, to);
    detail::mailbox& box = mailbox_of(from, to);
    std::unique_lock lock(box.mutex);
    box.changed.wait(lock, [&] { return box.has_post && !box.taken && box.failure.empty(); });
    const AnyTensor& posted = box.posted;
    if (posted.dtype() != scalar_type_of<T> || posted.shape() != t.shape()) {
      box.failure = "Communicator::send/recv: member " + std::to_string(from) + " (" +
                    posted.device().str() + ") sent " + name(posted.dtype()) + " " +
                    posted.shape().str() + ", member " + std::to_string(to) + " (" +
                    t.device().str() + ") receives into " + name(scalar_type_of<T>) + " " +
                    t.shape().str();
      std::string failure = box.failure;
      box.changed.notify_all();
      throw shape_error(failure);
    }
    Tensor<T, Kind> source = posted.as<T, Kind>();
    lock.unlock();  // the sender waits for `taken`, so its tensor stays alive and unchanged
    Tensor<T, Kind> target = t;
    target.copy_(source);
    lock.lock();
    box.taken = true;
    box.changed.notify_all();
  }

 private:
  static std::vector<int> check_kind(std::vector<int> device_ids) {
#if !(TESSERA_CUDA && TESSERA_NCCL)
    if constexpr (Kind::type == DeviceType::cuda) {
      throw error("Communicator<cuda>: collectives between CUDA devices need NCCL; configure "
                  "Tessera with -DTESSERA_WITH_NCCL=ON (NCCL must be installed)");
    }
#endif
    return device_ids;
  }

#if TESSERA_CUDA && TESSERA_NCCL
  template <class T>
  static void check_nccl_dtype(const char* operation) {
    if constexpr (!detail::nccl_supports_v<T>) {
      throw dtype_error("Communicator<cuda>::" + std::string(operation) + ": NCCL has no " +
                        name(scalar_type_of<T>) + " type; convert to int32");
    }
  }

  template <class Fn>
  void nccl_group(Fn&& issue) {
    detail::nccl_group(*nccl_, device_ids(), std::forward<Fn>(issue));
  }

  template <class T>
  void nccl_all_reduce(const std::vector<Tensor<T, Kind>>& ts, ReduceOp op) {
    check_nccl_dtype<T>("all_reduce");
    const auto count = static_cast<std::size_t>(ts[0].numel());
    nccl_group([&](std::size_t m, ncclComm_t comm, cudaStream_t stream) {
      TESSERA_NCCL_CHECK(ncclAllReduce(ts[m].data(), ts[m].data(), count, detail::nccl_type<T>(),
                                       detail::nccl_op<T>(static_cast<int>(op)), comm, stream));
    });
  }

  template <class T>
  void nccl_broadcast(const std::vector<Tensor<T, Kind>>& ts, int root) {
    check_nccl_dtype<T>("broadcast");
    const auto count = static_cast<std::size_t>(ts[0].numel());
    const T* source = ts[static_cast<std::size_t>(root)].data();
    nccl_group([&](std::size_t m, ncclComm_t comm, cudaStream_t stream) {
      TESSERA_NCCL_CHECK(ncclBroadcast(source, ts[m].data(), count, detail::nccl_type<T>(), root,
                                       comm, stream));
    });
  }

  template <class T>
  void nccl_reduce(const std::vector<Tensor<T, Kind>>& ts, int root, ReduceOp op) {
    check_nccl_dtype<T>("reduce");
    const auto count = static_cast<std::size_t>(ts[0].numel());
    // The receive buffer is read only on the root: the root reduces in place.
    nccl_group([&](std::size_t m, ncclComm_t comm, cudaStream_t stream) {
      TESSERA_NCCL_CHECK(ncclReduce(ts[m].data(), ts[m].data(), count, detail::nccl_type<T>(),
                                    detail::nccl_op<T>(static_cast<int>(op)), root, comm, stream));
    });
  }

  // Collectives along dim d work on [n, outer, inner] (d moved to the front, contiguous), where
  // every member's piece is one run of memory. A contiguous tensor with outer = 1 is that already.
  template <class T>
  static bool is_dim_first(const Tensor<T, Kind>& t, int d) {
    return detail::outer_inner(t.shape(), d).first == 1 && t.is_contiguous();
  }
  template <class T>
  static Tensor<T, Kind> dim_first(const Tensor<T, Kind>& t, int d) {
    if (is_dim_first(t, d)) return t;
    const auto [outer, inner] = detail::outer_inner(t.shape(), d);
    return t.reshape(Shape{outer, t.size(d), inner}).transpose(0, 1).contiguous();
  }
  // `t` itself when it is dim-first, else an uninitialised [n, outer, inner] on its device.
  template <class T>
  static Tensor<T, Kind> dim_first_target(const Tensor<T, Kind>& t, int d) {
    if (is_dim_first(t, d)) return t;
    const auto [outer, inner] = detail::outer_inner(t.shape(), d);
    return empty<T, Kind>(Shape{t.size(d), outer, inner}, t.device_index());
  }
  // Writes `front` (from dim_first_target) into `target`, unless it is `target` itself.
  template <class T>
  static void from_dim_first(const Tensor<T, Kind>& front, const Tensor<T, Kind>& target, int d) {
    if (is_dim_first(target, d)) return;
    Tensor<T, Kind> destination = target;
    destination.copy_(front.transpose(0, 1).reshape(target.shape()));
  }

  // Every member's input and output in dim-first form (dim_first, dim_first_target).
  template <class T>
  static std::pair<std::vector<Tensor<T, Kind>>, std::vector<Tensor<T, Kind>>> staged(
      const std::vector<Tensor<T, Kind>>& in, const std::vector<Tensor<T, Kind>>& out, int d) {
    std::pair<std::vector<Tensor<T, Kind>>, std::vector<Tensor<T, Kind>>> result;
    for (std::size_t m = 0; m < in.size(); ++m) {
      result.first.push_back(dim_first(in[m], d));
      result.second.push_back(dim_first_target(out[m], d));
    }
    return result;
  }

  // out[m] along d gets every member's piece: a broadcast from each member, in one group.
  template <class T>
  void nccl_all_gather(const std::vector<Tensor<T, Kind>>& in,
                       const std::vector<Tensor<T, Kind>>& out, int d) {
    check_nccl_dtype<T>("all_gather");
    const auto staging = staged(in, out, d);
    const std::vector<Tensor<T, Kind>>& pieces = staging.first;
    const std::vector<Tensor<T, Kind>>& gathered = staging.second;
    const std::vector<std::int64_t> offsets = offsets_along(in, d);
    const auto [outer, inner] = detail::outer_inner(out[0].shape(), d);
    const std::int64_t per_index = outer * inner;  // elements per index along d
    nccl_group([&](std::size_t m, ncclComm_t comm, cudaStream_t stream) {
      for (std::size_t j = 0; j < in.size(); ++j) {
        const std::int64_t count = in[j].size(d) * per_index;
        if (count == 0) continue;
        T* target = gathered[m].data() + offsets[j] * per_index;
        TESSERA_NCCL_CHECK(ncclBroadcast(pieces[j].data(), target, static_cast<std::size_t>(count),
                                         detail::nccl_type<T>(), static_cast<int>(j), comm,
                                         stream));
      }
    });
    for (std::size_t m = 0; m < out.size(); ++m) from_dim_first(gathered[m], out[m], d);
  }

  // out[j] = member j's slice of the reduction: a reduce to each member, in one group.
  template <class T>
  void nccl_reduce_scatter(const std::vector<Tensor<T, Kind>>& in,
                           const std::vector<Tensor<T, Kind>>& out, ReduceOp op, int d) {
    check_nccl_dtype<T>("reduce_scatter");
    const auto staging = staged(in, out, d);
    const std::vector<Tensor<T, Kind>>& sources = staging.first;
    const std::vector<Tensor<T, Kind>>& targets = staging.second;
    const std::vector<std::int64_t> offsets = offsets_along(out, d);
    const auto [outer, inner] = detail::outer_inner(in[0].shape(), d);
    const std::int64_t per_index = outer * inner;
    nccl_group([&](std::size_t m, ncclComm_t comm, cudaStream_t stream) {
      for (std::size_t j = 0; j < out.size(); ++j) {
        const std::int64_t count = out[j].size(d) * per_index;
        if (count == 0) continue;
        const T* source = sources[m].data() + offsets[j] * per_index;
        // The receive buffer is used only on the root (member j).
        T* target = m == j ? targets[m].data() : sources[m].data() + offsets[j] * per_index;
        TESSERA_NCCL_CHECK(ncclReduce(source, target, static_cast<std::size_t>(count),
                                      detail::nccl_type<T>(),
                                      detail::nccl_op<T>(static_cast<int>(op)),
                                      static_cast<int>(j), comm, stream));
      }
    });
    for (std::size_t m = 0; m < out.size(); ++m) from_dim_first(targets[m], out[m], d);
  }
#endif

  template <class Fn>
  void run(Fn&& fn) {
    threads_.run(std::forward<Fn>(fn));
  }

  // Member `member`'s share [first, last) of n elements.
  std::pair<std::int64_t, std::int64_t> share(std::int64_t n, int member) const noexcept {
    return detail::member_share(n, member, size());
  }

  template <class P, class T>
  static std::vector<P*> pointers(const std::vector<Tensor<T, Kind>>& ts) {
    std::vector<P*> result;
    result.reserve(ts.size());
    for (const Tensor<T, Kind>& t : ts) result.push_back(t.data());
    return result;
  }

  std::string member_text(int member) const {
    return "member " + std::to_string(member) + " (" +
           Device{Kind::type, device_ids()[static_cast<std::size_t>(member)]}.str() + ")";
  }

  // One defined tensor per member, on that member's device.
  template <class T>
  void check_members(const char* operation, const std::vector<Tensor<T, Kind>>& ts,
                     const char* what) const {
    if (static_cast<int>(ts.size()) != size()) {
      throw std::invalid_argument("Communicator::" + std::string(operation) + ": " +
                                  std::to_string(ts.size()) + " " + what + "s for " +
                                  std::to_string(size()) + " members");
    }
    for (int i = 0; i < size(); ++i) {
      const Tensor<T, Kind>& t = ts[static_cast<std::size_t>(i)];
      if (!t.defined()) {
        throw error("Communicator::" + std::string(operation) + ": the " + what + " of " +
                    member_text(i) + " is undefined");
      }
      if (t.device_index() != device_ids()[static_cast<std::size_t>(i)]) {
        throw device_mismatch_error("Communicator::" + std::string(operation) + ": the " + what +
                                    " of " + member_text(i) + " is on " + t.device().str());
      }
    }
  }

  template <class T>
  void check_contiguous(const char* operation, const Tensor<T, Kind>& t, int member,
                        const char* what) const {
    if (!t.is_contiguous()) {
      throw error("Communicator::" + std::string(operation) + ": the " + what + " of " +
                  member_text(member) + " (shape " + t.shape().str() + ", strides " +
                  t.strides().str() + ") is not contiguous; pass .contiguous()");
    }
  }

  // Members' tensors: one each, on its device, all of ts[0]'s shape, contiguous if asked.
  template <class T>
  void check_same_shapes(const char* operation, const std::vector<Tensor<T, Kind>>& ts,
                         bool contiguous) const {
    check_members(operation, ts, "tensor");
    for (int i = 0; i < size(); ++i) {
      const Tensor<T, Kind>& t = ts[static_cast<std::size_t>(i)];
      if (t.shape() != ts[0].shape()) {
        throw shape_error("Communicator::" + std::string(operation) + ": the tensor of " +
                          member_text(i) + " has shape " + t.shape().str() + ", that of " +
                          member_text(0) + " has " + ts[0].shape().str());
      }
      if (contiguous) check_contiguous(operation, t, i, "tensor");
    }
  }

  // The normalised dim along which ts can be concatenated (other extents agree).
  template <class T>
  int check_concatenation(const char* operation, const std::vector<Tensor<T, Kind>>& ts,
                          int dim) const {
    const Shape& first = ts[0].shape();
    const int d = first.normalize_dim(dim, (std::string("Communicator::") + operation).c_str());
    for (int i = 1; i < size(); ++i) {
      const Shape& shape = ts[static_cast<std::size_t>(i)].shape();
      bool fits = shape.size() == first.size();
      for (int k = 0; fits && k < shape.size(); ++k) fits = k == d || shape[k] == first[k];
      if (!fits) {
        throw shape_error("Communicator::" + std::string(operation) + ": the tensor of " +
                          member_text(i) + " has shape " + shape.str() + ", that of " +
                          member_text(0) + " has " + first.str() +
                          "; they may differ only along dim " + std::to_string(d));
      }
    }
    return d;
  }

  template <class T>
  static Shape concatenated_shape(const std::vector<Tensor<T, Kind>>& ts, int d) {
    Shape shape = ts[0].shape();
    std::int64_t total = 0;
    for (const Tensor<T, Kind>& t : ts) total += t.size(d);
    shape[d] = total;
    return shape;
  }

  template <class T>
  static std::vector<std::int64_t> offsets_along(const std::vector<Tensor<T, Kind>>& ts, int d) {
    std::vector<std::int64_t> offsets;
    offsets.reserve(ts.size());
    std::int64_t offset = 0;
    for (const Tensor<T, Kind>& t : ts) {
      offsets.push_back(offset);
      offset += t.size(d);
    }
    return offsets;
  }

  void check_chunk_sizes(const std::vector<std::int64_t>& sizes, const Shape& shape, int d) const {
    std::string list;
    std::int64_t total = 0;
    bool negative = false;
    for (std::int64_t s : sizes) {
      list += (list.empty() ? "" : ", ") + std::to_string(s);
      total += s;
      negative = negative || s < 0;
    }
    if (static_cast<int>(sizes.size()) != size() || negative || total != shape[d]) {
      throw shape_error("Communicator::scatter: chunk sizes [" + list + "] for " +
                        std::to_string(size()) + " members do not split extent " +
                        std::to_string(shape[d]) + " of dim " + std::to_string(d) + " of " +
                        shape.str());
    }
  }

  void check_root(const char* operation, int root) const {
    if (root < 0 || root >= size()) {
      throw std::invalid_argument("Communicator::" + std::string(operation) + ": root " +
                                  std::to_string(root) + " is not a member (members 0.." +
                                  std::to_string(size() - 1) + ")");
    }
  }

  template <class T>
  static void check_reduce_op(const char* operation, ReduceOp op) {
    if (op == ReduceOp::avg && !detail::is_floating_dtype_v<T>) {
      throw dtype_error("Communicator::" + std::string(operation) + ": avg needs a floating "
                        "dtype, not " + name(scalar_type_of<T>) + " (use sum and divide)");
    }
  }

  template <class T>
  int sender_member(const char* operation, const Tensor<T, Kind>& t) const {
    if (!t.defined()) throw error("Communicator::" + std::string(operation) + ": undefined tensor");
    const int member = member_of(t.device_index());
    if (member < 0) {
      throw device_mismatch_error("Communicator::" + std::string(operation) + ": the tensor is on " +
                                  t.device().str() + ", which is not a member");
    }
    return member;
  }

  void check_peer(const char* operation, int peer, int self) const {
    if (peer < 0 || peer >= size() || peer == self) {
      throw std::invalid_argument("Communicator::" + std::string(operation) + ": peer " +
                                  std::to_string(peer) + " is not another member (members 0.." +
                                  std::to_string(size() - 1) + ", this one " +
                                  std::to_string(self) + ")");
    }
  }

  detail::mailbox& mailbox_of(int from, int to) {
    return *mailboxes_[static_cast<std::size_t>(from * size() + to)];
  }

  DeviceThreads<Kind> threads_;
  std::vector<std::unique_ptr<detail::mailbox>> mailboxes_;
#if TESSERA_CUDA && TESSERA_NCCL
  std::shared_ptr<detail::nccl_clique> nccl_;
#endif
};

}  // namespace tessera::parallel
