// What one rank asks of a collective (the operation, the tensor's dtype, device kind and shape, the
// root, the reduce op, the dim and output length of a concatenation), in a fixed-size record that
// travels with the rank's arrival note (detail/mpi_engine.hpp). Every rank then holds every rank's
// call before any data moves, and check_agreement reaches the same verdict on each from the same
// records: the ranks go on together, or all throw the same error. No MPI here.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/parallel/communicator.hpp"

namespace tessera::distributed::detail {

enum class collective_kind : std::uint8_t {
  barrier,
  all_reduce,
  broadcast,
  reduce,
  all_gather,
  reduce_scatter
};

inline const char* to_string(collective_kind kind) noexcept {
  switch (kind) {
    case collective_kind::barrier:
      return "barrier";
    case collective_kind::all_reduce:
      return "all_reduce";
    case collective_kind::broadcast:
      return "broadcast";
    case collective_kind::reduce:
      return "reduce";
    case collective_kind::all_gather:
      return "all_gather";
    case collective_kind::reduce_scatter:
      return "reduce_scatter";
  }
  return "?";
}

/// One rank's call of a collective. It travels as bytes, so every field is explicit (no padding)
/// and a field the collective does not use keeps its default: equal calls are equal bytes.
struct collective_call {
  collective_kind kind = collective_kind::barrier;
  ScalarType dtype = ScalarType::float32;  // the tensor's (all_gather, reduce_scatter: the input's)
  DeviceType device = DeviceType::cpu;
  std::uint8_t reduce_op = 0;  // 1 + ReduceOp for the reducing collectives; 0 otherwise
  std::int8_t dims = 0;        // the tensor's number of dims
  std::int8_t dim = 0;         // all_gather, reduce_scatter: the dim they concatenate along
  std::int16_t unused = 0;
  std::int32_t root = -1;  // broadcast, reduce
  std::int32_t unused_too = 0;
  std::int64_t extents[max_dims] = {};
  std::int64_t output_length = 0;  // all_gather, reduce_scatter: the output's extent along dim

  friend bool operator==(const collective_call&, const collective_call&) = default;

  static collective_call barrier() { return {}; }
  /// A call on a tensor of `dtype` and `shape` on a `device` kind; the caller sets the rest.
  static collective_call on(collective_kind kind, ScalarType dtype, DeviceType device,
                            const Shape& shape) {
    collective_call call;
    call.kind = kind;
    call.dtype = dtype;
    call.device = device;
    call.dims = static_cast<std::int8_t>(shape.rank());
    for (int d = 0; d < shape.rank(); ++d) call.extents[d] = shape[d];
    return call;
  }
  collective_call& with_op(parallel::ReduceOp op) {
    reduce_op = static_cast<std::uint8_t>(1 + static_cast<int>(op));
    return *this;
  }
  collective_call& with_root(int r) {
    root = r;
    return *this;
  }
  collective_call& along(int d, std::int64_t output_extent) {
    dim = static_cast<std::int8_t>(d);
    output_length = output_extent;
    return *this;
  }

  Shape shape() const {
    Shape s = Shape::filled(dims, 0);
    for (int d = 0; d < dims; ++d) s[d] = extents[d];
    return s;
  }
};
static_assert(std::is_trivially_copyable_v<collective_call> &&
                  std::has_unique_object_representations_v<collective_call>,
              "collective_call travels as bytes: no padding, nothing but values");

/// "all_reduce(float32 [64], sum)", "broadcast(int32 [2, 3], root 1)", "all_gather(float32 [2, 3]
/// into 6 along dim 0)": what a rank asked for, as the user wrote it.
inline std::string describe(const collective_call& call) {
  std::string text = std::string(to_string(call.kind)) + "(";
  if (call.kind == collective_kind::barrier) return text + ")";
  text += std::string(name(call.dtype)) + " " + call.shape().str();
  if (call.device != DeviceType::cpu) text += std::string(" on ") + to_string(call.device);
  if (call.reduce_op != 0) {
    text += std::string(", ") +
            parallel::to_string(static_cast<parallel::ReduceOp>(call.reduce_op - 1));
  }
  if (call.root >= 0) text += ", root " + std::to_string(call.root);
  if (call.kind == collective_kind::all_gather || call.kind == collective_kind::reduce_scatter) {
    text +=
        " into " + std::to_string(call.output_length) + " along dim " + std::to_string(call.dim);
  }
  return text + ")";
}

/// The verdict on one collective: what kind of disagreement (none when the ranks agree) and the
/// message every rank throws.
struct agreement {
  enum class failure { none, operation, device, dtype, argument, shape };
  failure kind = failure::none;
  std::string message;
  explicit operator bool() const noexcept { return kind == failure::none; }
};

namespace call_detail {

// "rank 3", "ranks 0, 2", "ranks 0-4, 7": the ranks in `ranks` (ascending).
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (i ? ", " : "") + std::to_string(ranks[i]);
    if (j > i) text += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

// Every distinct call with the ranks that made it, in order of their first rank: "rank 0:
// all_reduce(float32 [64], sum); rank 1: broadcast(float32 [64], root 0)". At most 8 distinct
// calls are written out (a world of many ranks with uneven all_gather inputs would be long).
inline std::string calls_by_rank(const std::vector<collective_call>& calls) {
  constexpr std::size_t written = 8;
  std::vector<std::size_t> firsts;  // index of each distinct call's first rank
  std::vector<std::vector<int>> ranks;
  for (std::size_t r = 0; r < calls.size(); ++r) {
    std::size_t k = 0;
    while (k < firsts.size() && !(calls[firsts[k]] == calls[r])) ++k;
    if (k == firsts.size()) {
      firsts.push_back(r);
      ranks.emplace_back();
    }
    ranks[k].push_back(static_cast<int>(r));
  }
  std::string text;
  std::size_t others = 0;
  for (std::size_t k = 0; k < firsts.size(); ++k) {
    if (k >= written) {
      others += ranks[k].size();
      continue;
    }
    text += (k ? "; " : "") + rank_list(ranks[k]) + ": " + describe(calls[firsts[k]]);
  }
  if (others) text += "; and " + std::to_string(others) + " more ranks with other calls";
  return text;
}

}  // namespace call_detail

/// Checks that every rank's call (`calls[r]` is rank r's) can run together: one operation on one
/// kind of device and dtype, with one root, reduce op and dim; one shape for all_reduce, broadcast,
/// reduce and reduce_scatter's input; all_gather's inputs equal but along dim, and each output as
/// long as they are together; reduce_scatter's outputs adding up to the input. The first of these
/// that fails decides the kind; the message names the collective's number in the group
/// (`sequence`) and what each rank asked for.
inline agreement check_agreement(const std::vector<collective_call>& calls,
                                 std::uint64_t sequence) {
  using failure = agreement::failure;
  const collective_call& first = calls.front();
  auto every = [&](auto same) {
    for (const auto& c : calls) {
      if (!same(c)) return false;
    }
    return true;
  };
  auto verdict = [&](failure kind, const std::string& reason) {
    return agreement{kind, "ProcessGroup: the ranks disagree on collective #" +
                               std::to_string(sequence) + " (" + reason +
                               "): " + call_detail::calls_by_rank(calls) +
                               ". Every rank throws this error; no data moved, and the group "
                               "can still be used"};
  };
  if (!every([&](const auto& c) { return c.kind == first.kind; })) {
    return verdict(failure::operation, "different collectives");
  }
  if (first.kind == collective_kind::barrier) return {};
  if (!every([&](const auto& c) { return c.device == first.device; })) {
    return verdict(failure::device, "tensors on different kinds of device");
  }
  if (!every([&](const auto& c) { return c.dtype == first.dtype; })) {
    return verdict(failure::dtype, "different dtypes");
  }
  if (!every([&](const auto& c) { return c.root == first.root; })) {
    return verdict(failure::argument, "different roots");
  }
  if (!every([&](const auto& c) { return c.reduce_op == first.reduce_op; })) {
    return verdict(failure::argument, "different reduce ops");
  }
  const bool concatenation =
      first.kind == collective_kind::all_gather || first.kind == collective_kind::reduce_scatter;
  if (!concatenation) {
    if (!every([&](const auto& c) { return c.shape() == first.shape(); })) {
      return verdict(failure::shape, "different shapes");
    }
    return {};
  }
  if (!every([&](const auto& c) { return c.dim == first.dim; })) {
    return verdict(failure::shape, "different dims");
  }
  const int d = first.dim;
  if (first.kind == collective_kind::reduce_scatter) {
    if (!every([&](const auto& c) { return c.shape() == first.shape(); })) {
      return verdict(failure::shape, "inputs of different shapes");
    }
    std::int64_t total = 0;
    for (const auto& c : calls) total += c.output_length;
    if (total != first.extents[d]) {
      return verdict(failure::shape, "the outputs' lengths along dim " + std::to_string(d) +
                                         " add up to " + std::to_string(total) +
                                         ", the input has " + std::to_string(first.extents[d]));
    }
    return {};
  }
  // all_gather: the inputs agree but along d (where they may differ); each output holds them all.
  auto same_but_d = [&](const collective_call& c) {
    if (c.dims != first.dims) return false;
    for (int k = 0; k < c.dims; ++k) {
      if (k != d && c.extents[k] != first.extents[k]) return false;
    }
    return true;
  };
  if (!every(same_but_d)) {
    return verdict(failure::shape, "inputs that differ in a dim other than " + std::to_string(d));
  }
  std::int64_t total = 0;
  for (const auto& c : calls) total += c.extents[d];
  for (std::size_t r = 0; r < calls.size(); ++r) {
    if (calls[r].output_length != total) {
      return verdict(failure::shape, "the inputs' lengths along dim " + std::to_string(d) +
                                         " add up to " + std::to_string(total) + ", rank " +
                                         std::to_string(r) + "'s output has " +
                                         std::to_string(calls[r].output_length));
    }
  }
  return {};
}

}  // namespace tessera::distributed::detail
