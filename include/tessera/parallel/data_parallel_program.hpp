// DataParallelProgram: what DataParallel::compile returns, one autograd Program per device, run at
// once; its forward splits the batch over the devices and its backward sums the replicas'
// gradients into the module's (on CPU devices during the backward, parallel/detail/
// overlapped_reduction.hpp; on CUDA after it, through the Communicator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/program.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/nn/module.hpp"
#include "tessera/parallel/communicator.hpp"
#include "tessera/parallel/detail/meeting_point.hpp"
#include "tessera/parallel/detail/overlapped_reduction.hpp"
#include "tessera/parallel/detail/program_result.hpp"
#include "tessera/parallel/detail/step_rollback.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::parallel {

template <class M, DeviceKind Kind>
class DataParallel;

/// The program of DataParallel::compile: one autograd Program per device used, run at once.
/// `Inputs` is the std::tuple of the inputs' tensor types.
template <class M, DeviceKind Kind, class Program, class Inputs>
class DataParallelProgram {
 public:
  using Result = typename detail::program_result<Program>::type;

  /// Copies the module's state into the replicas, each piece of `inputs` (tensors of the specs'
  /// dtypes and whole-batch shapes, on any ordinal of Kind) into its device's input buffers, runs
  /// every device's forward at once, and returns the whole batch's loss on device_ids[0] (a
  /// loss you keep, losses.push_back(loss), keeps its value: the next forward writes a new
  /// tensor when the last one is still held). Throws shape_error naming the expected whole-batch
  /// shape for an input of another shape. When any device's forward throws (a label out of
  /// range in its piece, out of memory), the module's buffers (BatchNorm's running statistics)
  /// and the devices' random generators are put back as they were, and backward() is refused
  /// until a forward succeeds.
  template <class... Ts>
  Result forward(const Ts&... inputs) {
    static_assert(std::is_same_v<std::tuple<std::remove_cvref_t<Ts>...>, Inputs>,
                  "DataParallel program: forward takes tensors of the compiled specs' dtypes and "
                  "device kind, in order");
    std::size_t k = 0;
    (check_input(k++, inputs.defined() ? inputs.shape() : Shape{-1}), ...);
    auto& dp = *owner_;
    // The replicas' programs were traced with the replicas' tensors as bound at compile: a
    // parameter of the module rebound since would train the replicas on the old one.
    if (const std::string name = dp.rebound(); !name.empty()) {
      throw error("DataParallel program: the module's '" + name +
                  "' is not the tensor the program was compiled with (rebound with value() = "
                  "..., or moved away and back with to() since); compile the program again");
    }
    const int used = devices();
    forwarded_ = false;
    dp.record_effects(used);
    try {
      run_forward(used, inputs...);
    } catch (...) {
      dp.effects_.restore();
      throw;
    }
    dp.effects_.commit();
    forwarded_ = true;
    double total = 0;
    for (double loss : losses_) total += loss;
    // The last loss, when the caller still holds it, keeps its value.
    if (loss_.storage().use_count() > 1) loss_ = Result::empty_on({}, loss_.device());
    loss_.fill_(static_cast<typename Result::value_type>(total));
    return loss_;
  }

  /// Every device's backward at once; the replicas' gradients are summed into the module's
  /// (which accumulate, as Program::backward's do). On CPU devices a weight gradient that is one
  /// matmul's product is computed by all devices at once into the module's gradient, each a
  /// block of rows from every device's operands (Program::on_parameter_product); every other
  /// gradient is summed as soon as every device has it final (Program::on_gradient_ready): the
  /// last device to get there sums its share of the blocks and goes on, the devices that end
  /// their backward first sum the rest. On CUDA, after the backward, through NCCL. The
  /// replicas' programs write their gradients (zero_grad before each backward leaves their zeros
  /// unwritten), so nothing zeroes them. When a device's backward throws (out of memory, a
  /// gradient hook's exception), the module's gradients are put back as they were before the
  /// call (none, zero, or the values they had accumulated), so the other devices' work is not
  /// left in them; the forward, which returned, keeps its effects. Throws when no forward has
  /// succeeded since the last backward.
  void backward() {
    run_backward([](auto& program) { program.backward(); });
  }
  /// backward() with every device's loss seeded with `scaler`'s loss scale (mixed precision), so
  /// the module's gradients are the scale times the summed ones; scaler.step(optimizer) over the
  /// module's parameters then unscales them (include tessera/optim/grad_scaler.hpp).
  void backward(const optim::GradScaler& scaler) {
    run_backward([&](auto& program) { program.backward(scaler); });
  }

  /// Number of devices the batch is split over, and each piece's size along dim.
  int devices() const noexcept { return static_cast<int>(programs_.size()); }
  const std::vector<std::int64_t>& split_sizes() const noexcept { return sizes_; }
  /// Device i's own program (its memory plan, its hooks). std::out_of_range naming i and the
  /// count for i outside [0, devices()).
  Program& program(int i) {
    if (i < 0 || i >= devices()) {
      throw std::out_of_range("DataParallel program: device " + std::to_string(i) +
                              " of a program over " + std::to_string(devices()) + " devices");
    }
    return programs_[static_cast<std::size_t>(i)];
  }

  DataParallelProgram(DataParallel<M, Kind>* owner, std::vector<Program> programs,
                      std::vector<Shape> shapes, std::vector<std::int64_t> sizes, int dim,
                      std::vector<Inputs> buffers)
      : owner_(owner),
        programs_(std::move(programs)),
        shapes_(std::move(shapes)),
        sizes_(std::move(sizes)),
        offsets_(sizes_.size(), 0),
        dim_(dim),
        buffers_(std::move(buffers)),
        losses_(sizes_.size(), 0.0) {
    for (std::size_t i = 1; i < sizes_.size(); ++i) offsets_[i] = offsets_[i - 1] + sizes_[i - 1];
    const std::vector<int>& ids = owner->device_ids();
    const std::vector<int> used(ids.begin(),
                                ids.begin() + static_cast<std::ptrdiff_t>(sizes_.size()));
    loss_ = Result::empty_on({}, Device{Kind::type, ids[0]});
    if (used.size() == 1) return;
    if constexpr (std::is_same_v<Kind, cpu>) {
      reduction_ = std::make_shared<detail::overlapped_reduction>(static_cast<int>(used.size()),
                                                          programs_[0].parameter_count());
      for (std::size_t m = 0; m < used.size(); ++m) {
        programs_[m].on_gradient_ready(
            [state = reduction_, member = static_cast<int>(m)](const autograd::GradientReady& r) {
              state->ready(member, r);
            });
        programs_[m].on_parameter_product(
            [state = reduction_, member = static_cast<int>(m)](
                autograd::ParameterProduct& product) { return state->product(member, product); });
      }
    } else {
      communicator_ = std::make_unique<Communicator<Kind>>(used);
    }
  }

 private:
  // Every member's forward on its piece (the caller puts the module back if it throws).
  template <class... Ts>
  void run_forward(int used, const Ts&... inputs) {
    auto& dp = *owner_;
    // The module's buffers into the replicas first, all members at once: the module's own
    // forward (member 0) may update them (BatchNorm's running statistics). On CUDA the
    // parameters, which member 0 only reads, are copied by each replica's thread in the same
    // pass as its forward; on CPU the replicas' parameters are the module's (aliases), and all
    // members share the buffers' copy, then all run.
    constexpr bool on_cpu = std::is_same_v<Kind, cpu>;
    if (used > 1 && dp.has_buffers()) {
      dp.threads_.run([&](int member) {
        if (member >= used) return;
        if (on_cpu) {
          dp.copy_state(member, used);
        } else if (member > 0) {
          dp.copy_buffers(member);
        }
      });
    }
    dp.threads_.run([&](int member) {
      if (member >= used) return;
      const auto m = static_cast<std::size_t>(member);
      if (member > 0) {
        if (on_cpu) {
          dp.copy_training_modes(member);
        } else {
          dp.copy_parameters(member);
        }
      }
      std::apply(
          [&](auto&... buffers) {
            (buffers.copy_(inputs.narrow(dim_, offsets_[m], sizes_[m])), ...);
            losses_[m] = static_cast<double>(programs_[m].forward(buffers...).item());
          },
          buffers_[m]);
    });
  }

  void check_input(std::size_t k, const Shape& shape) const {
    if (shape != shapes_[k]) {
      throw shape_error("DataParallel program: input " + std::to_string(k) + " has shape " +
                        shape.str() + ", expected the whole batch's " + shapes_[k].str());
    }
  }

  // CUDA: the replicas' gradients summed into the module's through NCCL, after the backward.
  template <class Run>
  void run_backward(const Run& run) {
    if (!forwarded_) {
      throw error("DataParallel program: backward needs a forward that succeeded first (each "
                  "forward allows one backward)");
    }
    auto& dp = *owner_;
    // Before anything is written: the module's gradients as they are (a copy only of those
    // that hold accumulated values), put back if any device throws.
    gradients_.record(dp.module_.parameters());
    forwarded_ = false;
    try {
      reduce_backward(run);
    } catch (...) {
      gradients_.restore();
      gradients_.commit();
      throw;
    }
    gradients_.commit();
  }

  template <class Run>
  void reduce_backward(const Run& run) {
    auto& dp = *owner_;
    const int used = devices();
    if (reduction_) reduction_->begin();
    dp.threads_.run([&](int member) {
      if (member >= used) return;
      // The replicas' gradients zero (unwritten): their programs write them, not add to them.
      if (member > 0) dp.replicas_[static_cast<std::size_t>(member - 1)].zero_grad();
      if (!reduction_) return run(programs_[static_cast<std::size_t>(member)]);
      try {
        run(programs_[static_cast<std::size_t>(member)]);
      } catch (const detail::meeting_aborted&) {
        reduction_->end_of_backward();  // another device's failure, which run() rethrows
        return;
      } catch (...) {
        reduction_->abort();
        reduction_->end_of_backward();
        throw;
      }
      reduction_->end_of_backward();
    });
    if constexpr (!std::is_same_v<Kind, cpu>) {
      if (used > 1) reduce_after_backward();
    }
  }

  void reduce_after_backward() {
    auto& dp = *owner_;
    const int used = devices();
    std::vector<std::vector<nn::ParameterRef>> parameters;
    parameters.push_back(dp.module_.parameters());
    for (int i = 1; i < used; ++i) {
      parameters.push_back(dp.replicas_[static_cast<std::size_t>(i - 1)].parameters());
    }
    for (std::size_t p = 0; p < parameters[0].size(); ++p) {
      const AnyTensor root = parameters[0][p].grad();
      if (!root.defined()) continue;  // a parameter the loss does not use
      visit_dtype(root.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (is_floating_point_v<T>) {  // gradients are floating
          std::vector<Tensor<T, Kind>> grads{root.template as<T, Kind>()};
          for (int i = 1; i < used; ++i) {
            const AnyTensor g = parameters[static_cast<std::size_t>(i)][p].grad();
            grads.push_back(g.template as<T, Kind>());
          }
          communicator_->reduce(grads, 0, ReduceOp::sum);
        }
      });
    }
  }

  DataParallel<M, Kind>* owner_;
  std::vector<Program> programs_;
  std::vector<Shape> shapes_;
  std::vector<std::int64_t> sizes_;
  std::vector<std::int64_t> offsets_;
  int dim_;
  std::vector<Inputs> buffers_;  // each device's input tensors (its pieces)
  std::vector<double> losses_;
  std::shared_ptr<detail::overlapped_reduction> reduction_;  // CPU
  std::unique_ptr<Communicator<Kind>> communicator_;  // CUDA
  Result loss_;
  bool forwarded_ = false;              // a forward succeeded since the last backward
  detail::gradient_rollback gradients_;  // the module's gradients before the backward
};

}  // namespace tessera::parallel
