// Multi-tensor updates on CUDA (PyTorch's foreach/fused optimisers): one launch runs a list of
// elementwise update rules (an optimiser step's parameters), each block taking 4096 elements of
// one rule; as many rules per launch as fit 4 KiB of kernel parameters (update_list_plan.hpp).
// Included only by nvcc-compiled units.
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA_KERNELS
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tessera/backend/cuda/executor.cuh"
#include "tessera/backend/cuda/update_list_plan.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/stream.hpp"

namespace tessera::backend::cuda {

/// Elements a block of multi_update_kernel updates (16 per thread).
inline constexpr std::int64_t update_block_elements = threads_per_block * 16;

/// Rules of type Update that fit one launch's 4 KiB of kernel parameters.
template <class Update>
inline constexpr int update_list_capacity =
    static_cast<int>((4000 - 32) / (sizeof(Update) + 2 * sizeof(std::int64_t)));

/// One launch's rules: rule r updates sizes[r] elements and owns blocks [first_block[r],
/// first_block[r + 1]) (update_list_plan).
template <class Update>
struct update_list {
  static constexpr int capacity = update_list_capacity<Update>;
  Update rules[capacity];
  std::int64_t sizes[capacity];
  std::int64_t first_block[capacity + 1];
  int count;
};

/// Several parameters' updates in one launch: each block finds its rule, then updates its chunk.
template <class Update>
__global__ void __launch_bounds__(threads_per_block)
    multi_update_kernel(update_list<Update> list) {
  const std::int64_t blocks = list.first_block[list.count];
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const auto r = update_list_plan::rule_of(list.first_block, static_cast<std::size_t>(list.count), b);
    const std::int64_t begin = (b - list.first_block[r]) * update_block_elements;
    const std::int64_t limit = begin + update_block_elements;
    const std::int64_t end = limit < list.sizes[r] ? limit : list.sizes[r];
    const Update rule = list.rules[r];
    for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) rule(i);
  }
}

/// Runs rules[r](i) for every i in [0, sizes[r]) of every rule, on the current device and
/// `stream`, as multi-tensor launches (one counted launch each).
template <class Update>
void run_update_lists(const std::vector<Update>& rules, const std::vector<std::int64_t>& sizes,
                      stream_ref stream = tessera::detail::current_cuda_stream()) {
  static_assert(sizeof(update_list<Update>) <= 4096,
                "Tessera: an update rule is too large for a multi-tensor launch");
  const update_list_plan plan = update_list_plan::make(
      sizes, static_cast<std::size_t>(update_list<Update>::capacity), update_block_elements);
  for (const auto& l : plan.launches) {
    profiler::count_launch();
    update_list<Update> list;
    list.count = static_cast<int>(l.count);
    for (std::size_t r = 0; r < l.count; ++r) {
      list.rules[r] = rules[l.first + r];
      list.sizes[r] = sizes[l.first + r];
    }
    for (std::size_t r = 0; r <= l.count; ++r) list.first_block[r] = l.first_block[r];
    const std::int64_t blocks = l.first_block[l.count];
    const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count()) * 8;
    multi_update_kernel<<<static_cast<unsigned>(std::max<std::int64_t>(1, std::min(blocks, cap))),
                          threads_per_block, 0, stream.native()>>>(list);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace tessera::backend::cuda
#endif
