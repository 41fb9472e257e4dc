// ReduceOp: how the collectives (Communicator, ProcessGroup) and DataParallel's gradient sums
// combine the members' values: sum, avg, max, min, product.
#pragma once

namespace tessera::parallel {

/// How all_reduce, reduce and reduce_scatter combine the members' values. `avg` is the sum
/// divided by the member count (floating dtypes only). On bool, sum and max are "or", product and
/// min are "and" (as PyTorch maps them for NCCL). Integer sums and products wrap modulo 2^bits.
enum class ReduceOp { sum, avg, max, min, product };

inline const char* to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::product: return "product";
  }
  return "?";
}

}  // namespace tessera::parallel
