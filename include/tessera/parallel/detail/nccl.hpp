// NCCL for Communicator<cuda>: one NCCL communicator per member of a device set (ncclCommInitAll),
// shared by every Communicator over that set and destroyed with the last of them; dtype and
// operator mapping; grouped calls on the members' current streams. Compiled only with TESSERA_NCCL
// (CMake's TESSERA_WITH_NCCL, on by default in CUDA builds when NCCL is found).
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA && TESSERA_NCCL
#include <nccl.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/half.hpp"
#include "tessera/core/stream.hpp"

namespace tessera::parallel::detail {

[[noreturn]] inline void throw_nccl_error(ncclResult_t code, const char* call) {
  std::string message = std::string(call) + " failed: " + ncclGetErrorString(code) + " (" +
                        std::to_string(static_cast<int>(code)) + ")";
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0') {
    message += ": ";
    message += last;
  }
  throw error(message);
}

#define TESSERA_NCCL_CHECK(call)                                                     \
  do {                                                                               \
    ncclResult_t tessera_nccl_status_ = (call);                                      \
    if (tessera_nccl_status_ != ncclSuccess) {                                       \
      ::tessera::parallel::detail::throw_nccl_error(tessera_nccl_status_, #call);     \
    }                                                                                \
  } while (0)

/// NCCL communicators for the devices `ids` (member i on ids[i]), from ncclCommInitAll.
class nccl_clique {
 public:
  explicit nccl_clique(const std::vector<int>& ids) : comms_(ids.size()) {
    TESSERA_NCCL_CHECK(ncclCommInitAll(comms_.data(), static_cast<int>(ids.size()), ids.data()));
  }
  ~nccl_clique() {
    for (ncclComm_t comm : comms_) (void)ncclCommDestroy(comm);
  }
  nccl_clique(const nccl_clique&) = delete;
  nccl_clique& operator=(const nccl_clique&) = delete;

  ncclComm_t comm(std::size_t member) const noexcept { return comms_[member]; }
  /// Held while a group is issued: NCCL calls on one communicator must not interleave, and every
  /// Communicator over these devices shares them.
  std::mutex& mutex() const noexcept { return mutex_; }

  /// The clique over `ids`: the live one if a Communicator over the same devices (same order)
  /// holds it, else a new one. Creating NCCL communicators costs milliseconds to seconds.
  static std::shared_ptr<nccl_clique> get(const std::vector<int>& ids) {
    static std::mutex mutex;
    static std::map<std::vector<int>, std::weak_ptr<nccl_clique>> cache;
    std::lock_guard lock(mutex);
    std::weak_ptr<nccl_clique>& slot = cache[ids];
    if (std::shared_ptr<nccl_clique> live = slot.lock()) return live;
    auto created = std::make_shared<nccl_clique>(ids);
    slot = created;
    return created;
  }

 private:
  std::vector<ncclComm_t> comms_;
  mutable std::mutex mutex_;
};

/// NCCL's type for T. bool travels as uint8 (0 or 1); NCCL has no 16-bit integer type.
template <class T>
constexpr bool nccl_supports_v = !std::is_same_v<T, std::int16_t>;

template <class T>
ncclDataType_t nccl_type() noexcept {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  if constexpr (std::is_same_v<T, half>) return ncclFloat16;
  if constexpr (std::is_same_v<T, bfloat16>) return ncclBfloat16;
  if constexpr (std::is_same_v<T, std::int8_t>) return ncclInt8;
  if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, bool>) return ncclUint8;
  if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  return ncclUint8;  // int16: refused by the callers (nccl_supports_v)
}

/// NCCL's operator for `op` (numbered as ReduceOp: sum, avg, max, min, product) on T. On bool,
/// sum and max are "or" (max of 0/1), product and min are "and" (min), as on CPU.
template <class T>
ncclRedOp_t nccl_op(int op) noexcept {
  if constexpr (std::is_same_v<T, bool>) return (op == 0 || op == 2) ? ncclMax : ncclMin;
  switch (op) {
    case 0: return ncclSum;
    case 1: return ncclAvg;
    case 2: return ncclMax;
    case 3: return ncclMin;
    default: return ncclProd;
  }
}

/// Issues `issue(member, comm, stream)` for every member in one NCCL group, each on the current
/// stream of its member's device (so the collective orders with the work already queued there).
template <class Fn>
void nccl_group(const nccl_clique& clique, const std::vector<int>& ids, Fn&& issue) {
  std::vector<cudaStream_t> streams;
  streams.reserve(ids.size());
  for (int id : ids) streams.push_back(current_stream(Device{DeviceType::cuda, id}).native());
  std::lock_guard lock(clique.mutex());
  TESSERA_NCCL_CHECK(ncclGroupStart());
  try {
    for (std::size_t m = 0; m < ids.size(); ++m) issue(m, clique.comm(m), streams[m]);
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  TESSERA_NCCL_CHECK(ncclGroupEnd());
}

}  // namespace tessera::parallel::detail
#endif
