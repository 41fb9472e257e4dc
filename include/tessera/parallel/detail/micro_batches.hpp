// The sizes of the micro-batches a Pipeline cuts a batch into: torch.chunk's (`chunks` pieces of
// ceil(N / chunks)) or x.split(split_size)'s, as PipelineOptions asks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tessera/parallel/pipeline_options.hpp"

namespace tessera::parallel::detail {

/// Sizes of the micro-batches of a batch of `batch` cut into pieces of `split_size` samples, the
/// last one smaller (x.split(split_size)).
inline std::vector<std::int64_t> split_sizes(std::int64_t batch, std::int64_t split_size) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t first = 0; first < batch; first += split_size) {
    sizes.push_back(std::min(split_size, batch - first));
  }
  return sizes;
}

/// Sizes of the micro-batches of a batch of `batch` cut into `chunks` (torch.chunk: pieces of
/// ceil(batch / chunks), so fewer than `chunks` when the batch does not fill them).
inline std::vector<std::int64_t> micro_batch_sizes(std::int64_t batch, int chunks) {
  if (batch <= 0) return {};
  return split_sizes(batch, (batch + chunks - 1) / chunks);
}

/// The micro-batch sizes `options` (checked: chunks or split_size set) give a batch of `batch`.
inline std::vector<std::int64_t> micro_batch_sizes(std::int64_t batch,
                                                   const PipelineOptions& options) {
  if (options.split_size) return split_sizes(batch, *options.split_size);
  return micro_batch_sizes(batch, *options.chunks);
}

}  // namespace tessera::parallel::detail
