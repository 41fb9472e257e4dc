// What a Pipeline is told and what it reports: the schedule (GPipe or 1F1B), which micro-batches
// are checkpointed, how a batch is cut (PipelineOptions) and each stage's memory (StagePlan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "tessera/core/device.hpp"

namespace tessera::parallel {

/// GPipe: every micro-batch's forward, then every backward (last micro-batch first). 1F1B
/// (PipeDream-Flush): stage i runs `stages - 1 - i` forwards, then alternates one forward and one
/// backward, so at most `stages - i` micro-batches are in flight on it.
enum class Schedule { gpipe, one_f_one_b };

/// Which micro-batches are checkpointed (keep only their stage input, recompute the forward
/// before the backward): all, all but the last (torchgpipe's default), none.
enum class Checkpoint { always, except_last, never };

/// How a batch is cut: set `chunks` (torchgpipe's knob) or `split_size` (the knob of PyTorch's
/// pipeline tutorial), not both; neither means one micro-batch (Pipeline sets chunks to 1).
struct PipelineOptions {
  std::vector<int> balance{};   // layers per stage, in order; adds up to the Sequential's size
  std::vector<int> devices{};   // ordinal of each stage (empty: 0, 1, ...); extra ones unused
  std::optional<int> chunks{};  // micro-batches per batch (torch.chunk)
  std::optional<std::int64_t> split_size{};  // samples per micro-batch (x.split(split_size))
  Schedule schedule = Schedule::gpipe;
  Checkpoint checkpoint = Checkpoint::except_last;
};

/// One stage's share of a compiled pipeline's memory, in bytes as the pool allocates them.
struct StagePlan {
  Device device;
  int first_layer = 0;        // the stage's layers are [first_layer, last_layer)
  int last_layer = 0;
  int programs = 0;           // compiled programs (arenas that can be allocated at once)
  int max_in_flight = 0;      // micro-batches between their forward and their backward at once
  // One full micro-batch kept for backward: its program's arena, its inputs (the loss's too on
  // the last stage; counted even where they are views of the caller's tensors, on stage 0 and
  // the last stage when those are on the stage's device), and the gradient of its output that
  // the next stage sends back.
  std::size_t micro_batch_bytes = 0;
  // The planned peak over the schedule (the loss's inputs and the gradient of the output of
  // a smaller last micro-batch counted at the full size).
  std::size_t peak_bytes = 0;
};

}  // namespace tessera::parallel
