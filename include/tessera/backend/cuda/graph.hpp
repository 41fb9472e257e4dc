// A captured CUDA graph (cudaStreamBeginCapture .. cudaGraphInstantiate), replayed with one
// cudaGraphLaunch: what a compiled Program's Options::cuda_graph uses
// (autograd/detail/graph_replay.hpp). Host code over the runtime API: g++ units compile it too.
#pragma once

#include "tessera/core/config.hpp"

#if TESSERA_CUDA
#include <cuda_runtime_api.h>

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
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream.native(), &graph));
    captured_graph result;
    const cudaError_t instantiated = cudaGraphInstantiate(&result.exec_, graph, 0);
    cudaGraphDestroy(graph);
    TESSERA_CUDA_CHECK(instantiated);
    return result;
  }

  /// Queues the whole graph on `stream`.
  void launch(stream_ref stream) const { TESSERA_CUDA_CHECK(cudaGraphLaunch(exec_, stream.native())); }

  bool defined() const noexcept { return exec_ != nullptr; }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace tessera::backend::cuda
#endif  // TESSERA_CUDA
