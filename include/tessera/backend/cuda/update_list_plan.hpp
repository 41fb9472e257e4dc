// How a list of elementwise updates (an optimiser step's parameters) becomes multi-tensor launches
// on CUDA: which rules go in which launch, which blocks belong to which rule. Plain host and device
// arithmetic, apart from the kernel (backend/cuda/multi_update.cuh), so that CPU tests check that
// every element of every rule is updated exactly once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tessera/core/config.hpp"

namespace tessera::backend::cuda {

/// Launches of a list of rules (sizes[r] elements each): launch k updates rules
/// [first, first + count) (at most max_rules), and rule r of a launch owns blocks
/// [first_block[r], first_block[r + 1]) of it, each block `per_block` consecutive elements.
struct update_list_plan {
  struct launch {
    std::size_t first = 0;
    std::size_t count = 0;
    std::vector<std::int64_t> first_block;  // count + 1 entries, from 0
  };
  std::vector<launch> launches;

  static update_list_plan make(const std::vector<std::int64_t>& sizes, std::size_t max_rules,
                               std::int64_t per_block) {
    update_list_plan plan;
    for (std::size_t first = 0; first < sizes.size(); first += max_rules) {
      launch l;
      l.first = first;
      l.count = std::min(max_rules, sizes.size() - first);
      l.first_block.push_back(0);
      for (std::size_t r = 0; r < l.count; ++r) {
        const std::int64_t blocks = (sizes[first + r] + per_block - 1) / per_block;
        l.first_block.push_back(l.first_block.back() + blocks);
      }
      plan.launches.push_back(std::move(l));
    }
    return plan;
  }
  /// The rule that block b of a launch belongs to (the kernel's scan over first_block).
  TESSERA_HOST_DEVICE static std::size_t rule_of(const std::int64_t* first_block,
                                                 std::size_t count, std::int64_t b) {
    std::size_t r = 0;
    while (r + 1 < count && first_block[r + 1] <= b) ++r;
    return r;
  }
};

}  // namespace tessera::backend::cuda
