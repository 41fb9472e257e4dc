// overlapped_reduction: how DataParallelProgram sums its devices' gradients on CPU devices, during
// the backward: a weight gradient that is one matmul's product computed by all devices at once
// into the module's, every other one summed block by block as soon as every device has it final
// (the elements combined by detail::reduce_elements, the Communicator's CPU engine).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/program_options.hpp"
#include "tessera/autograd/var.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/parallel/detail/meeting_point.hpp"
#include "tessera/parallel/detail/reduce_elements.hpp"
#include "tessera/parallel/even_split.hpp"
#include "tessera/parallel/reduce_op.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::parallel::detail {

// One parameter's gradients from every device meet here (CPU devices). The last device to
// report a parameter's gradient final opens it: its gradients are summed into the module's
// (device 0's), block by block. Any device may take an open parameter's next block: the last
// device to arrive takes its share (1/devices of the blocks) and goes back to its backward;
// a device whose backward has ended takes blocks of every open parameter until all devices
// have ended. The devices that were ahead end first and take the rest, so no device carries
// a whole sum while the others wait for it, and the sums of the last gradients (ready when
// the slowest device ends) are shared.
struct overlapped_reduction {
  static constexpr std::int64_t block = 8192;  // elements

  overlapped_reduction(int device_count, std::size_t parameters)
      : devices(device_count),
        grads(parameters, std::vector<AnyTensor>(static_cast<std::size_t>(device_count))),
        blocks(parameters, 0),
        arrived(new std::atomic<int>[parameters]()),
        opened(new std::atomic<bool>[parameters]()),
        taken(new std::atomic<std::int64_t>[parameters]()) {
    shared.operands.resize(static_cast<std::size_t>(device_count));
  }

  // Before each backward, by the thread that starts the devices' backward.
  void begin() {
    for (std::size_t p = 0; p < grads.size(); ++p) {
      arrived[p].store(0, std::memory_order_relaxed);
      opened[p].store(false, std::memory_order_relaxed);
      taken[p].store(0, std::memory_order_relaxed);
    }
    ended.store(0, std::memory_order_relaxed);
    meeting.reset();
    // A product that an aborted backward left half done holds views of the arenas.
    for (auto& operands : shared.operands) operands = {};
    shared.target = AnyTensor{};
  }

  // Program::on_parameter_product: a parameter's gradient that is one matmul's product, target
  // (+)= x @ y on every device over its piece. Instead of each device writing its own and the
  // sum after, every device's x and y meet here and each device computes its block of rows of
  // the module's gradient from all of them: device 0's product first (with device 0's
  // accumulate flag), the others' added by the GEMM itself (beta = 1). Nothing is left to sum,
  // and each device does the same GEMM work as before. Taken only where BLAS adds in place
  // (float and double) and every operand is 2-D, which every device decides alike.
  bool product(int member, autograd::ParameterProduct& product) {
    if (product.target.dim() != 2 || product.x.dim() != 2 || product.y.dim() != 2 ||
        !product.target.is_contiguous()) {
      return false;
    }
    bool taken = false;
    visit_dtype(product.target.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        if (tessera::detail::matmul_accumulates<T, cpu>()) {
          fused_product<T>(member, product);
          taken = true;
        }
      }
    });
    return taken;
  }

  template <class T>
  void fused_product(int member, const autograd::ParameterProduct& product) {
    const auto m = static_cast<std::size_t>(member);
    shared.operands[m] = {product.x, product.y};
    if (member == 0) {
      shared.target = product.target;
      shared.accumulate = product.accumulate;
    }
    meeting.arrive_and_wait(devices);  // every device's operands are here
    const auto [first, last] = detail::member_share(shared.target.shape()[0], member, devices);
    const std::int64_t rows = last - first;
    if (rows > 0) {
      Tensor<T, cpu> block = shared.target.template as<T, cpu>().narrow(0, first, rows);
      for (std::size_t k = 0; k < shared.operands.size(); ++k) {
        const auto& [x, y] = shared.operands[k];
        tessera::detail::matmul_into(block, x.template as<T, cpu>().narrow(0, first, rows),
                                     y.template as<T, cpu>(), k > 0 || shared.accumulate);
      }
    }
    meeting.arrive_and_wait(devices);  // every device has read the operands: they may change
    // Nothing kept past the product (the operands are views of the programs' arenas).
    shared.operands[m] = {};
    if (member == 0) shared.target = AnyTensor{};
  }

  // A device's backward has thrown: the others, waiting for it in product(), stop.
  void abort() { meeting.abort(); }

  void ready(int member, const autograd::GradientReady& r) {
    const std::size_t p = r.index;  // (never a parameter whose product() was taken)
    grads[p][static_cast<std::size_t>(member)] = r.grad;
    if (arrived[p].fetch_add(1, std::memory_order_acq_rel) + 1 != devices) return;
    blocks[p] = (r.grad.numel() + block - 1) / block;
    opened[p].store(true, std::memory_order_release);
    announce();
    // This device's share of the blocks only: the others, ahead of it in their backward, end
    // it sooner and take the rest (end_of_backward), or this device does at its own end.
    reduce_blocks(p, (blocks[p] + devices - 1) / devices);
  }

  // Device `member`'s backward has returned (or thrown): it takes blocks of open parameters
  // until every device's backward has returned. Every parameter it sums (those product() did
  // not take) is open by then, and the last
  // device to end takes every block still left before it returns, so none is left; each
  // device returns only when its own blocks are summed.
  void end_of_backward() {
    ended.fetch_add(1, std::memory_order_acq_rel);
    announce();
    for (;;) {
      const std::uint32_t seen = news.load(std::memory_order_acquire);
      for (std::size_t p = 0; p < grads.size(); ++p) {
        if (opened[p].load(std::memory_order_acquire) &&
            taken[p].load(std::memory_order_relaxed) < blocks[p]) {
          reduce_blocks(p);
        }
      }
      if (ended.load(std::memory_order_acquire) == devices) return;
      news.wait(seen, std::memory_order_acquire);  // a parameter opened or a device ended
    }
  }

 private:
  void announce() {
    news.fetch_add(1, std::memory_order_acq_rel);
    news.notify_all();
  }

  // Sums blocks of parameter p, at most `most` of them, until none is left. The elements go
  // through the Communicator's CPU engine (reduce_elements); the Communicator's calls themselves
  // cannot be used here (issue 44, item 4): Communicator::reduce is a blocking collective that
  // runs every member on its own DeviceThreads, so it is called from outside the devices' threads
  // and only once every device has its gradient. Here a device's thread, inside its backward,
  // sums a share of the blocks and goes on, and the devices that end first take the rest; moved
  // after the backward, the sums would wait for the slowest device and add to the step.
  void reduce_blocks(std::size_t p,
                     std::int64_t most = std::numeric_limits<std::int64_t>::max()) {
    const std::vector<AnyTensor>& g = grads[p];
    visit_dtype(g[0].dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (is_floating_point_v<T>) {  // gradients are floating
        // Sized, then filled by index: push_back instantiates vector::back(), whose `end() - 1`
        // GCC 12 finds ambiguous against half's hidden friend operators at -O0 in this namespace
        // (a parallel_bench build at 389ddc5 stopped on it).
        std::vector<const T*> sources(g.size());
        for (std::size_t i = 0; i < g.size(); ++i) sources[i] = static_cast<const T*>(g[i].data_ptr());
        T* target = static_cast<T*>(g[0].data_ptr());
        const std::int64_t n = g[0].numel();
        for (std::int64_t done = 0; done < most; ++done) {
          const std::int64_t b = taken[p].fetch_add(1, std::memory_order_relaxed);
          if (b >= blocks[p]) return;
          const std::int64_t first = b * block;
          const std::int64_t last = std::min(n, first + block);
          detail::reduce_elements(ReduceOp::sum, sources.data(), static_cast<int>(g.size()),
                                  &target, 1, first, last);
        }
      }
    });
  }

  int devices;
  std::vector<std::vector<AnyTensor>> grads;  // [parameter][device]
  // The product the devices are at (one at a time: they pass the meetings together): every
  // device's operands, the module's gradient and device 0's accumulate flag.
  struct current_product {
    std::vector<std::pair<AnyTensor, AnyTensor>> operands;  // [device]
    AnyTensor target;
    bool accumulate = false;
  } shared;
  detail::meeting_point meeting;
  std::vector<std::int64_t> blocks;           // [parameter], set when it opens
  std::unique_ptr<std::atomic<int>[]> arrived;
  std::unique_ptr<std::atomic<bool>[]> opened;
  std::unique_ptr<std::atomic<std::int64_t>[]> taken;  // blocks handed out
  std::atomic<int> ended{0};                           // devices whose backward returned
  std::atomic<std::uint32_t> news{0};  // bumped when a parameter opens or a device ends
};

}  // namespace tessera::parallel::detail
