// A captured CUDA graph (cudaStreamBeginCapture .. cudaGraphInstantiate), replayed with one
// cudaGraphLaunch: what a compiled Program's Options::cuda_graph uses
// (autograd/detail/graph_replay.hpp). Host code over the runtime API: g++ units compile it too.
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/core/stream.hpp"

namespace tessera::backend::cuda {

/// An instantiated graph (move-only; destroyed with the last owner).
class captured_graph {
 public:
  captured_graph() = default;
  captured_graph(captured_graph&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}
  captured_graph& operator=(captured_graph&& other) noexcept {
    std::swap(exec_, other.exec_);
    return *this;
  }
  captured_graph(const captured_graph&) = delete;
  captured_graph& operator=(const captured_graph&) = delete;
  ~captured_graph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);  // a destructor reports nothing
  }

  /// Captures the work `work()` queues on `stream` (a stream of its own, not the legacy default
  /// one) into a graph and instantiates it; nothing runs until launch(). Capture is relaxed:
  /// the allocator may still take memory from the device (cudaMalloc) meanwhile, but anything
  /// that waits for the GPU on the host (a copy to the host, a synchronisation) fails the
  /// capture. When `work` throws or the capture fails, the capture is ended and discarded and
  /// the exception (or a cuda_error naming the capture) propagates; the stream can be used again.
  template <class Work>
  static captured_graph capture(stream_ref stream, Work&& work) {
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream.native(), cudaStreamCaptureModeRelaxed));
    cudaGraph_t graph = nullptr;
    try {
      work();
    } catch (...) {
      if (cudaStreamEndCapture(stream.native(), &graph) == cudaSuccess && graph != nullptr) {
        cudaGraphDestroy(graph);
      }
      (void)cudaGetLastError();  // the failed capture's error is reported by the exception
      throw;
    }
    // A failure here (a capture invalidated by a call that waited for the GPU, an
    // instantiation refused) is reported by the exception alone: the runtime's last error is
    // cleared, so that the caller's run without graphs does not meet it at its first launch.
    const cudaError_t ended = cudaStreamEndCapture(stream.native(), &graph);
    if (ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      TESSERA_CUDA_CHECK(ended);
    }
    captured_graph result;
    // Auto-free on launch (as PyTorch's graphs): memory a library call allocated inside the
    // capture and did not free (cuBLAS without a workspace of its own) does not make the next
    // launch fail.
    const cudaError_t instantiated = cudaGraphInstantiateWithFlags(
        &result.exec_, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
    cudaGraphDestroy(graph);
    if (instantiated != cudaSuccess) {
      (void)cudaGetLastError();
      TESSERA_CUDA_CHECK(instantiated);
    }
    return result;
  }

  /// Queues the whole graph on `stream`.
  void launch(stream_ref stream) const { TESSERA_CUDA_CHECK(cudaGraphLaunch(exec_, stream.native())); }

  bool defined() const noexcept { return exec_ != nullptr; }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

/// Writes pairs of 64-bit values (a captured graph's random fills' {seed, base offset}:
/// Generator::begin_graph_capture) into device memory on a stream, ordered before what is queued
/// after, without waiting for the GPU: each pair goes through a slot of pinned host memory (a
/// copy from pageable memory may wait for the stream), and a slot is written again only after
/// the copy that read it has run, `slots` writes later. Neither copied nor moved; the pinned
/// memory and events are made at the first write.
class pinned_pair_writer {
 public:
  static constexpr int slots = 8;

  pinned_pair_writer() = default;
  pinned_pair_writer(const pinned_pair_writer&) = delete;
  pinned_pair_writer& operator=(const pinned_pair_writer&) = delete;
  /// The copies queued must have run (the owner synchronises the stream first).
  ~pinned_pair_writer() {
    for (cudaEvent_t event : events_) {
      if (event != nullptr) cudaEventDestroy(event);  // a destructor reports nothing
    }
    if (host_ != nullptr) cudaFreeHost(host_);
  }

  /// Queues the copy of {first, second} into `device` (two uint64 of device memory) on `stream`.
  void write(std::uint64_t* device, std::uint64_t first, std::uint64_t second, stream_ref stream) {
    if (host_ == nullptr) {
      void* memory = nullptr;
      TESSERA_CUDA_CHECK(
          cudaHostAlloc(&memory, sizeof(std::uint64_t) * 2 * slots, cudaHostAllocDefault));
      host_ = static_cast<std::uint64_t*>(memory);
    }
    const int k = next_;
    if (events_[k] == nullptr) {
      TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&events_[k], cudaEventDisableTiming));
    } else {
      TESSERA_CUDA_CHECK(cudaEventSynchronize(events_[k]));  // the copy that read slot k ran
    }
    host_[2 * k] = first;
    host_[2 * k + 1] = second;
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(device, host_ + 2 * k, 2 * sizeof(std::uint64_t),
                                       cudaMemcpyHostToDevice, stream.native()));
    TESSERA_CUDA_CHECK(cudaEventRecord(events_[k], stream.native()));
    next_ = (k + 1) % slots;
  }

 private:
  std::uint64_t* host_ = nullptr;
  cudaEvent_t events_[slots] = {};
  int next_ = 0;
};

}  // namespace tessera::backend::cuda
#endif  // TESSERA_CUDA
