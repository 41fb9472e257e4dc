// PipelineProgram: what Pipeline::compile returns, the stages' autograd Programs run on the
// schedule (GPipe or 1F1B) over the micro-batches of each batch, with the activations and their
// gradients passed between the stages' devices; see pipeline.hpp's top comment for the design.
#pragma once

#include <algorithm>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/program.hpp"
#include "tessera/core/random.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/nn/sequential.hpp"
#include "tessera/parallel/detail/micro_batches.hpp"
#include "tessera/parallel/detail/program_result.hpp"
#include "tessera/parallel/detail/step_rollback.hpp"
#include "tessera/parallel/device_threads.hpp"
#include "tessera/parallel/pipeline_options.hpp"
#include "tessera/tensor/cat.hpp"

namespace tessera::parallel {

namespace detail {

/// Whether `layer` (a module or a plain layer) has a parameter that requires grad.
template <class L>
bool layer_trains(const L& layer) {
  if constexpr (std::derived_from<L, nn::Module>) {
    for (const auto& p : layer.parameters()) {
      if (p.requires_grad()) return true;
    }
  }
  return false;
}

/// Whether stage s's input needs a gradient: when an earlier stage has a backward.
inline bool needs_input_grad(const std::vector<char>& trains, int s) {
  return s > 0 && trains[static_cast<std::size_t>(s) - 1] != 0;
}

/// One step of a stage's schedule: the forward or backward of micro-batch `micro_batch`, using
/// program `slot` of its shape.
struct pipeline_op {
  bool backward = false;
  int micro_batch = 0;
  int slot = 0;
};

}  // namespace detail

template <class Seq>
class Pipeline;

/// The program of Pipeline::compile. `LastProgram` is the last stage's autograd Program (it
/// returns the loss); `Extras` the std::tuple of the loss's other input tensors.
template <class Seq, Dtype T, class LastProgram, class Extras>
class PipelineProgram {
 public:
  using Kind = typename Pipeline<Seq>::Kind;
  using Result = typename detail::program_result<LastProgram>::type;
  using Activation = Tensor<T, Kind>;
  using StageProgram = autograd::Program<Activation>;

  /// Runs the batch `inputs` (tensors of the specs' dtypes and whole-batch shapes, on any
  /// ordinal of Kind): every micro-batch's forward through the stages, and returns the batch's
  /// loss on the last stage's device (kept, losses.push_back(loss), it keeps its value: the
  /// next forward writes a new tensor when the last one is still held). With
  /// Schedule::one_f_one_b the forwards and backwards interleave, so this runs the whole step
  /// and adds the gradients; backward() then only ends the step. Throws shape_error naming the
  /// expected shape for an input of another shape. When a micro-batch fails on any stage (a
  /// label out of range, out of memory), the layers' buffers, the stages' random generators
  /// and (1F1B) every parameter's gradient are put back as they were before the call.
  template <class... Ts>
  Result forward(const Ts&... inputs) {
    static_assert(sizeof...(Ts) == std::tuple_size_v<Extras> + 1,
                  "Pipeline program: forward takes the pipeline's input and the loss's inputs");
    scaler_ = nullptr;
    return run_forward(inputs...);
  }

  /// forward(inputs...) whose step seeds every micro-batch's backward with `scaler`'s loss scale
  /// (mixed precision: the gradients become the scale times the true ones until
  /// scaler.step(optimizer) unscales them). Needed with Schedule::one_f_one_b, whose backwards
  /// run inside forward; with GPipe, forward(inputs...) then backward(scaler) does the same.
  /// Include tessera/optim/grad_scaler.hpp; the scaler must outlive the step.
  template <class... Ts>
  Result forward(const optim::GradScaler& scaler, const Ts&... inputs) {
    static_assert(sizeof...(Ts) == std::tuple_size_v<Extras> + 1,
                  "Pipeline program: forward takes the scaler, the pipeline's input and the "
                  "loss's inputs");
    scaler_ = &scaler;
    scaled_backward_ = [](LastProgram& program, const optim::GradScaler& s) {
      program.backward(s);
    };
    return run_forward(inputs...);
  }

  /// backward() seeded with `scaler`'s loss scale (PyTorch's scaler.scale(loss).backward()):
  /// every stage's parameters get the scale times the batch's gradient. With
  /// Schedule::one_f_one_b the backwards already ran in forward: it must have been
  /// forward(scaler, inputs...) with this scaler, else this throws naming the schedule.
  void backward(const optim::GradScaler& scaler) {
    if (owner_->options_.schedule == Schedule::one_f_one_b && forwarded_ && scaler_ != &scaler) {
      throw error("Pipeline program: backward(scaler) with Schedule::one_f_one_b, whose "
                  "backwards run inside forward: pass the scaler to forward instead, "
                  "forward(scaler, inputs...)");
    }
    if (forwarded_ && owner_->options_.schedule == Schedule::gpipe) {
      scaler_ = &scaler;
      scaled_backward_ = [](LastProgram& program, const optim::GradScaler& s) {
        program.backward(s);
      };
    }
    backward();
  }

  /// Every micro-batch's backward (GPipe); adds the whole batch's gradient into every stage's
  /// parameters (on their devices), seeded with the scaler's scale when the step's forward was
  /// forward(scaler, inputs...). Throws when forward was not called since the last backward.
  /// When a micro-batch's backward throws, every parameter's gradient is put back as it was
  /// before the call (the other micro-batches' contributions are not left in it).
  void backward() {
    if (!forwarded_) {
      throw error("Pipeline program: backward needs a forward first (each forward allows one "
                  "backward)");
    }
    forwarded_ = false;
    if (owner_->options_.schedule != Schedule::gpipe) return;
    gradients_.record(owner_->seq_.parameters());
    try {
      run(phase::backward);
    } catch (...) {
      gradients_.restore();
      gradients_.commit();
      throw;
    }
    gradients_.commit();
  }

  /// Number of micro-batches and their sizes.
  int micro_batches() const noexcept { return static_cast<int>(sizes_.size()); }
  const std::vector<std::int64_t>& micro_batch_sizes() const noexcept { return sizes_; }
  /// Per stage: devices, layers, programs, planned memory.
  const std::vector<StagePlan>& plan() const noexcept { return plan_; }

  // Built by Pipeline::compile.
  PipelineProgram(Pipeline<Seq>* owner, std::vector<std::int64_t> sizes,
                  std::vector<Shape> shapes, int checkpoint_stop)
      : owner_(owner),
        sizes_(std::move(sizes)),
        shapes_(std::move(shapes)),
        checkpoint_stop_(checkpoint_stop) {
    const int stages = owner_->stages();
    const int count = micro_batches();
    offsets_.assign(sizes_.size(), 0);
    for (std::size_t j = 1; j < sizes_.size(); ++j) offsets_[j] = offsets_[j - 1] + sizes_[j - 1];
    inputs_.assign(static_cast<std::size_t>(stages * count), Activation{});
    activation_boxes_.assign(static_cast<std::size_t>(stages * count), Activation{});
    gradient_boxes_.assign(static_cast<std::size_t>(stages * count), Activation{});
    gradient_targets_.assign(static_cast<std::size_t>(stages * count), Activation{});
    rng_.assign(static_cast<std::size_t>(stages * count), philox_state{});
    extras_.resize(sizes_.size());
    losses_.assign(sizes_.size(), 0.0);
    stage_programs_.resize(static_cast<std::size_t>(stages));
    ops_.resize(static_cast<std::size_t>(stages));
    trains_.assign(static_cast<std::size_t>(stages), true);
    loss_ = Result::empty_on({}, owner_->device(stages - 1));
  }

 private:
  template <class>
  friend class Pipeline;

  enum class phase { forward, backward, both };

  // The step's forward (with 1F1B, the whole step). Before anything runs, what it may change is
  // recorded: the layers' buffers (BatchNorm's running statistics), the stages' random
  // generators and, with 1F1B, the parameters' gradients; a stage or micro-batch that throws
  // puts them all back, so the other micro-batches' forwards and backwards leave nothing.
  template <class... Ts>
  Result run_forward(const Ts&... inputs) {
    std::size_t k = 0;
    (check_input(k++, inputs.defined() ? inputs.shape() : Shape{-1}), ...);
    bind_inputs(inputs...);
    const bool both = owner_->options_.schedule == Schedule::one_f_one_b;
    forwarded_ = false;
    Seq& seq = owner_->seq_;
    std::vector<Device> devices;
    for (int s = 0; s < owner_->stages(); ++s) devices.push_back(owner_->device(s));
    effects_.record(seq.buffers(), devices);
    if (both) gradients_.record(seq.parameters());
    try {
      run(both ? phase::both : phase::forward);
    } catch (...) {
      effects_.restore();
      effects_.commit();
      gradients_.restore();
      gradients_.commit();
      throw;
    }
    effects_.commit();
    gradients_.commit();
    forwarded_ = true;
    double total = 0;
    for (double l : losses_) total += l;
    // The last loss, when the caller still holds it, keeps its value.
    if (loss_.storage().use_count() > 1) loss_ = Result::empty_on({}, loss_.device());
    loss_.fill_(static_cast<typename Result::value_type>(total));
    return loss_;
  }

  std::size_t at(int stage, int j) const {
    return static_cast<std::size_t>(stage * micro_batches() + j);
  }
  // The programs of micro-batch j (full size or the smaller last one) in slot `slot`.
  StageProgram& stage_program(int s, int j, int slot) {
    return stage_programs_[static_cast<std::size_t>(s)][static_cast<std::size_t>(shape_class(j))]
                          [static_cast<std::size_t>(slot)];
  }
  LastProgram& last_program(int j, int slot) {
    return last_programs_[static_cast<std::size_t>(shape_class(j))][static_cast<std::size_t>(slot)];
  }
  int shape_class(int j) const { return sizes_[static_cast<std::size_t>(j)] == sizes_[0] ? 0 : 1; }
  bool checkpointed(int j) const { return j < checkpoint_stop_; }

  void check_input(std::size_t k, const Shape& shape) const {
    if (shape != shapes_[k]) {
      throw shape_error("Pipeline program: input " + std::to_string(k) + " has shape " +
                        shape.str() + ", expected the whole batch's " + shapes_[k].str());
    }
  }

  template <class X, class... Xs>
  void bind_inputs(const X& x, const Xs&... extras) {
    static_assert(std::is_same_v<X, Activation> && std::is_same_v<std::tuple<Xs...>, Extras>,
                  "Pipeline program: forward takes tensors of the compiled specs' dtypes and "
                  "device kind, in order");
    input_ = x;
    extra_inputs_ = Extras(extras...);
  }

  /// Runs the stages' ops of `which` phase at once, one thread per stage.
  void run(phase which) {
    auto& pipe = *owner_;
    typename Pipeline<Seq>::exchange sync;
    sync_ = &sync;
    try {
      pipe.run_all(sync, [&](int s) {
        for (const detail::pipeline_op& op : ops_[static_cast<std::size_t>(s)]) {
          if (op.backward && which != phase::forward) {
            backward_op(s, op);
          } else if (!op.backward && which != phase::backward) {
            forward_op(s, op);
          }
        }
      });
    } catch (...) {
      sync_ = nullptr;
      reset();
      throw;
    }
    sync_ = nullptr;
  }

  // After a failure: every program's arena and every box let go, so the next call starts clean.
  void reset() {
    for (auto& stage : stage_programs_) {
      for (auto& shape : stage) {
        for (auto& p : shape) p.release();
      }
    }
    for (auto& shape : last_programs_) {
      for (auto& p : shape) p.release();
    }
    for (auto& t : inputs_) t = Activation{};
    for (auto& t : activation_boxes_) t = Activation{};
    for (auto& t : gradient_boxes_) t = Activation{};
    for (auto& t : gradient_targets_) t = Activation{};
    for (auto& e : extras_) e = Extras{};
    forwarded_ = false;
  }

  void forward_op(int s, const detail::pipeline_op& op) {
    auto& pipe = *owner_;
    const int j = op.micro_batch;
    const auto jj = static_cast<std::size_t>(j);
    const Device device = pipe.device(s);
    const int last = pipe.stages() - 1;
    Activation& in = inputs_[at(s, j)];
    if (s == 0) {  // a view of the caller's tensor when it is on this device already
      in = input_.narrow(0, offsets_[jj], sizes_[jj]).to(device.index);
    } else {
      // Copied here, while the sender goes on, from a view of the sender's arena (or from its
      // copy of it, when the sender frees its arena at once).
      const Activation sent = sync_->take(activation_boxes_[at(s, j)]);
      in = Activation::empty_on(sent.shape(), device);
      pipe.receive_activation(s, in, sent);
    }
    if (checkpointed(j)) rng_[at(s, j)] = default_generator(device).state();
    if (s == last) {
      auto& program = last_program(j, op.slot);
      cut_extras(j, device, std::make_index_sequence<std::tuple_size_v<Extras>>{});
      losses_[jj] = std::apply(
          [&](const auto&... extras) {
            return static_cast<double>(program.forward(in, extras...).item());
          },
          extras_[jj]);
      if (checkpointed(j)) program.release();
    } else {
      auto& program = stage_program(s, j, op.slot);
      Activation out = program.forward(in);
      if (trains_[static_cast<std::size_t>(s)]) {
        // Where the next stage will write the gradient of this output: allocated here, by the
        // thread of this device, so that every block of a device comes from its own thread.
        gradient_targets_[at(s, j)] = Activation::empty_on(out.shape(), device);
      }
      if (checkpointed(j) || !trains_[static_cast<std::size_t>(s)]) {
        out = out.clone();  // the arena goes now; the next stage copies from this
        program.release();
      }
      sync_->put(activation_boxes_[at(s + 1, j)], std::move(out));
    }
  }

  // Micro-batch j of the loss's inputs on the last stage's device (views of the caller's tensors
  // when they are there already).
  template <std::size_t... I>
  void cut_extras(int j, Device device, std::index_sequence<I...>) {
    const auto jj = static_cast<std::size_t>(j);
    ((std::get<I>(extras_[jj]) =
          std::get<I>(extra_inputs_).narrow(0, offsets_[jj], sizes_[jj]).to(device.index)),
     ...);
  }

  void backward_op(int s, const detail::pipeline_op& op) {
    auto& pipe = *owner_;
    const int j = op.micro_batch;
    const auto jj = static_cast<std::size_t>(j);
    const int last = pipe.stages() - 1;
    Activation& in = inputs_[at(s, j)];
    // A checkpointed micro-batch's forward again, drawing the random numbers of its forward.
    auto replay = [&](auto&& fn) {
      if (!checkpointed(j)) return;
      Generator& generator = default_generator(pipe.device(s));
      const philox_state now = generator.state();
      generator.set_state(rng_[at(s, j)]);
      try {
        fn();
      } catch (...) {
        generator.set_state(now);  // not left at the replayed draws
        throw;
      }
      generator.set_state(now);
    };
    if (s == last) {
      auto& program = last_program(j, op.slot);
      replay([&] {
        std::apply([&](const auto&... extras) { program.recompute(in, extras...); },
                   extras_[jj]);
      });
      if (scaler_ != nullptr) {
        scaled_backward_(program, *scaler_);
      } else {
        program.backward();
      }
      if (needs_input_grad(s)) send_gradient(s, j, program.input_grad(0));
      program.release();
      extras_[jj] = Extras{};
    } else {
      auto& program = stage_program(s, j, op.slot);
      if (trains_[static_cast<std::size_t>(s)]) {
        const Activation grad = sync_->take(gradient_boxes_[at(s, j)]);
        replay([&] { program.recompute(in); });
        program.backward(grad);
        if (needs_input_grad(s)) send_gradient(s, j, program.input_grad(0));
        program.release();
      }
    }
    in = Activation{};
  }

  // The gradient of stage s's input for micro-batch j, copied out of the arena (which goes
  // now) into the tensor stage s - 1 allocated for it at its forward; stage s - 1 then seeds its
  // backward with it. (Stage s - 1 wrote the target before sending micro-batch j's activation,
  // which stage s took under the exchange's lock: the read here is ordered after the write.)
  void send_gradient(int s, int j, const AnyTensor& grad) {
    Activation target = std::move(gradient_targets_[at(s - 1, j)]);
    owner_->receive_gradient(s - 1, target, grad.template as<T, Kind>());
    sync_->put(gradient_boxes_[at(s - 1, j)], std::move(target));
  }
  bool needs_input_grad(int s) const { return detail::needs_input_grad(trains_, s); }

  Pipeline<Seq>* owner_;
  std::vector<std::int64_t> sizes_;    // [micro-batch]
  std::vector<std::int64_t> offsets_;  // [micro-batch]
  std::vector<Shape> shapes_;          // the whole batch's input shapes
  int checkpoint_stop_ = 0;            // micro-batches below it are checkpointed
  std::vector<std::vector<std::vector<StageProgram>>> stage_programs_;  // [stage][shape][slot]
  std::vector<std::vector<LastProgram>> last_programs_;                 // [shape][slot]
  std::vector<std::vector<detail::pipeline_op>> ops_;                   // [stage]
  std::vector<char> trains_;                 // [stage]: has a backward
  std::vector<Activation> inputs_;            // [stage, micro-batch]: kept for the backward
  std::vector<Activation> activation_boxes_;  // [stage, micro-batch]: sent to that stage
  std::vector<Activation> gradient_boxes_;    // [stage, micro-batch]: sent to that stage
  std::vector<Activation> gradient_targets_;  // [stage, micro-batch]: allocated by that stage
  std::vector<philox_state> rng_;             // [stage, micro-batch]: before its forward
  std::vector<Extras> extras_;                // [micro-batch]: the loss's inputs, last device
  std::vector<double> losses_;                // [micro-batch], weighted
  std::vector<StagePlan> plan_;
  typename Pipeline<Seq>::exchange* sync_ = nullptr;
  Activation input_;
  Extras extra_inputs_;  // the whole batch's, as given to forward
  Result loss_;
  bool forwarded_ = false;
  // The step's loss scaler (null: seeds of 1), and the call that seeds the last stage's backward
  // with it: made where the scaler is given, so a pipeline without one needs no definition of
  // Program::backward(const GradScaler&) (tessera/optim/grad_scaler.hpp).
  const optim::GradScaler* scaler_ = nullptr;
  void (*scaled_backward_)(LastProgram&, const optim::GradScaler&) = nullptr;
  // What a failing step puts back (their copies kept from step to step).
  detail::effect_rollback effects_;      // the layers' buffers and the stages' generators
  detail::gradient_rollback gradients_;  // every parameter's gradient
};

}  // namespace tessera::parallel
