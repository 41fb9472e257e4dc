// Pipeline<Seq>: torchgpipe's GPipe over an nn::Sequential. The layers are cut into stages
// (`balance` layers each), each stage's layers are moved in place to its device, and one host
// thread drives each device (parallel::DeviceThreads). A batch is cut into micro-batches (as
// torch.chunk: `chunks` pieces of ceil(N / chunks) samples, the last one smaller, so fewer
// pieces when N does not fill them; or as x.split(split_size): pieces of `split_size` samples,
// the last one smaller); the stages work on different micro-batches at once. An
// activation is sent as a tensor on the sender's device, which the receiving stage copies onto
// its own while the sender goes on; the gradient of an activation is written by its sender into
// a tensor the receiver allocated, so every block of a device comes from that device's thread.
// On CUDA each copy runs on a copy stream of the receiving device (one for the activations that
// arrive there, issued by its stage's thread; one for the gradients, issued by the next stage's
// thread): it waits for the work that produced its source, but not for the compute queued on the
// receiving device, and it is complete when copy_ returns.
//
// Training (pipe.compile): each stage has autograd Programs compiled for its layers and the
// micro-batch shapes (a full one and, when the batch does not divide, the last), as many as the
// schedule keeps micro-batches in flight on that stage. A stage's program takes the activation
// it receives as an input that requires grad, and its backward is seeded with the gradient the
// next stage sends back (Options::seed_gradient); the last stage's program computes the loss.
// A program's arena is freed (Program::release) once its micro-batch is done with it, so a
// stage's memory follows the schedule: GPipe keeps every micro-batch until the backward, 1F1B
// at most `stages - i` on stage i. A checkpointed micro-batch keeps only its stage input: its
// forward is recomputed (Program::recompute, the random generator restored) before its backward.
//
// This header is the public one and includes the pieces: pipeline_options.hpp (Schedule,
// Checkpoint, PipelineOptions, StagePlan), pipeline_program.hpp (compile's program) and
// detail/micro_batches.hpp; Pipeline::compile, which builds the program, is defined here.
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
#include "tessera/parallel/detail/module_kind.hpp"
#include "tessera/parallel/detail/step_rollback.hpp"
#include "tessera/parallel/device_threads.hpp"
#include "tessera/parallel/pipeline_options.hpp"
#include "tessera/parallel/pipeline_program.hpp"
#include "tessera/tensor/cat.hpp"

namespace tessera::parallel {

/// torchgpipe's GPipe over an nn::Sequential (see the file comment). `Seq` is held by
/// reference: keep it alive while the pipeline is used.
template <class Seq>
class Pipeline {
 public:
  using Kind = detail::module_kind_t<Seq>;
  static constexpr std::size_t layer_count = Seq::size();

  /// Cuts `seq` into stages and moves each stage's layers, in place, to its device. Throws
  /// std::invalid_argument, naming the values, when balance does not add up to the
  /// Sequential's length or has a stage with no layer, when there are fewer devices than
  /// stages, when both chunks and split_size are set, or when chunks or split_size < 1;
  /// device_error for an ordinal that does not exist. Nothing is moved when it throws (out of
  /// memory on a stage's device included).
  Pipeline(Seq& seq, PipelineOptions options)
      : seq_(seq), options_(checked(std::move(options))), threads_(options_.devices) {
    int first = 0;
    for (int layers : options_.balance) {
      first_layer_.push_back(first);
      first += layers;
    }
    first_layer_.push_back(first);
    move_layers(std::make_index_sequence<layer_count>{});
    if constexpr (Kind::type == DeviceType::cuda) {
      for (int s = 0; s < stages(); ++s) {
        activation_streams_.emplace_back(device(s));
        gradient_streams_.emplace_back(device(s));
      }
    }
  }

  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  int stages() const noexcept { return static_cast<int>(options_.balance.size()); }
  const PipelineOptions& options() const noexcept { return options_; }
  Device device(int stage) const { return threads_.device(stage); }
  /// Stage `stage` holds layers [first_layer(stage), first_layer(stage + 1)).
  int first_layer(int stage) const { return first_layer_.at(static_cast<std::size_t>(stage)); }
  Seq& module() noexcept { return seq_; }

  /// Inference: `x` (a tensor of Kind on any ordinal, the batch along dimension 0) through the
  /// stages, micro-batch after micro-batch, the stages working at once; the output on the last
  /// stage's device. Uses the layers' current modes (BatchNorm in training mode normalises each
  /// micro-batch with its own statistics). When a micro-batch fails on any stage, the layers'
  /// buffers and the stages' random generators are put back as they were.
  template <Dtype T>
  Tensor<T, Kind> operator()(const Tensor<T, Kind>& x) {
    if (!x.defined()) throw error("Pipeline: the input is undefined");
    if (x.dim() == 0) throw shape_error("Pipeline: the input is 0-dim; it needs a batch dimension");
    std::vector<std::int64_t> sizes = detail::micro_batch_sizes(x.size(0), options_);
    if (sizes.empty()) sizes.push_back(0);  // an empty batch goes through as one empty piece
    std::vector<Tensor<T, Kind>> outputs(sizes.size());
    // A micro-batch that fails (BatchNorm refusing one sample, out of memory) must not leave
    // the earlier ones' running statistics and random draws: put back if any stage throws.
    detail::effect_rollback effects;
    std::vector<Device> devices;
    for (int s = 0; s < stages(); ++s) devices.push_back(device(s));
    effects.record(seq_.is_training() ? seq_.buffers() : std::vector<nn::BufferRef>{}, devices);
    try {
      run_stages(x, sizes, outputs);
    } catch (...) {
      effects.restore();
      throw;
    }
    if (outputs.size() == 1) return outputs[0];
    return cat(outputs, 0);
  }

 private:
  // operator()'s micro-batches through the stages, each stage on its thread.
  template <Dtype T>
  void run_stages(const Tensor<T, Kind>& x, const std::vector<std::int64_t>& sizes,
                  std::vector<Tensor<T, Kind>>& outputs) {
    const int count = static_cast<int>(sizes.size());
    const int last = stages() - 1;
    std::vector<Tensor<T, Kind>> boxes(static_cast<std::size_t>(stages() * count));
    exchange sync;
    run_all(sync, [&](int s) {
      std::int64_t offset = 0;
      for (int j = 0; j < count; ++j) {
        const auto jj = static_cast<std::size_t>(j);
        Tensor<T, Kind> in;
        if (s == 0) {
          in = x.narrow(0, offset, sizes[jj]).to(threads_.device(0).index);
          offset += sizes[jj];
        } else {
          const Tensor<T, Kind> sent =
              sync.take(boxes[static_cast<std::size_t>(s * count + j)]);
          in = Tensor<T, Kind>::empty_on(sent.shape(), threads_.device(s));
          receive_activation(s, in, sent);
        }
        Tensor<T, Kind> out = run_stage_range(s, s + 1, in);
        if (s == last) {
          outputs[jj] = std::move(out);
        } else {
          sync.put(boxes[static_cast<std::size_t>((s + 1) * count + j)], std::move(out));
        }
      }
    });
  }

 public:

  /// Training: `loss(out, vars...)` maps the last stage's output and the remaining inputs to
  /// the loss of the micro-batch it is given, as a mean over it (cross_entropy, mse_loss).
  /// `input_spec, specs...` (autograd::input) describe the whole batch (dimension 0); the first
  /// is the pipeline's input, the others go to the loss on the last stage's device. The result's
  /// forward(tensors...) returns the batch's loss (the micro-batches' losses weighted by their
  /// sizes) and backward() adds the whole batch's gradient into every stage's parameters.
  template <class Fn, class Spec, class... Specs>
  auto compile(Fn loss, const Spec& input_spec, const Specs&... specs);

  /// The memory plan of the last compiled program (per stage). Throws before any compile.
  const std::vector<StagePlan>& plan() const {
    if (plan_.empty()) throw error("Pipeline::plan: nothing compiled yet (call compile first)");
    return plan_;
  }

 private:
  template <class, Dtype, class, class>
  friend class PipelineProgram;

  static PipelineOptions checked(PipelineOptions o) {
    auto list = [](const std::vector<int>& v) {
      std::string out = "[";
      for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
      return out + "]";
    };
    long long sum = 0;
    for (int b : o.balance) sum += b;
    if (o.balance.empty() || sum != static_cast<long long>(layer_count)) {
      throw std::invalid_argument("Pipeline: the module and the sum of balance have different "
                                  "lengths (module: " + std::to_string(layer_count) +
                                  ", sum of balance: " + std::to_string(sum) + ", balance: " +
                                  list(o.balance) + ")");
    }
    for (int b : o.balance) {
      if (b <= 0) {
        throw std::invalid_argument("Pipeline: every stage needs at least one layer (balance: " +
                                    list(o.balance) + ")");
      }
    }
    const std::size_t stages = o.balance.size();
    if (o.devices.empty()) {
      const int available = device_count(Kind::type);
      if (static_cast<std::size_t>(available) < stages) {
        throw std::invalid_argument("Pipeline: too few devices to hold the stages (devices: " +
                                    std::to_string(available) + ", stages: " +
                                    std::to_string(stages) + ")");
      }
      for (std::size_t i = 0; i < stages; ++i) o.devices.push_back(static_cast<int>(i));
    } else if (o.devices.size() < stages) {
      throw std::invalid_argument("Pipeline: too few devices to hold the stages (devices: " +
                                  list(o.devices) + ", stages: " + std::to_string(stages) + ")");
    }
    o.devices.resize(stages);
    if (o.chunks && o.split_size) {
      throw std::invalid_argument("Pipeline: set chunks or split_size, not both (chunks: " +
                                  std::to_string(*o.chunks) + ", split_size: " +
                                  std::to_string(*o.split_size) + ")");
    }
    if (o.split_size && *o.split_size < 1) {
      throw std::invalid_argument("Pipeline: split_size must be a positive number (split_size: " +
                                  std::to_string(*o.split_size) + ")");
    }
    if (!o.split_size) {
      if (!o.chunks) o.chunks = 1;
      if (*o.chunks < 1) {
        throw std::invalid_argument("Pipeline: chunks must be a positive number (chunks: " +
                                    std::to_string(*o.chunks) + ")");
      }
    }
    return o;
  }

  int stage_of(std::size_t layer) const {
    int s = 0;
    while (static_cast<std::size_t>(first_layer_[static_cast<std::size_t>(s) + 1]) <= layer) ++s;
    return s;
  }

  // Each layer to its stage's device. A layer that cannot move (out of memory there) leaves
  // every layer where it was: those already moved get their old tensors back.
  template <std::size_t... I>
  void move_layers(std::index_sequence<I...>) {
    detail::placement_rollback placement;
    placement.record(seq_.parameters(), seq_.buffers());
    try {
      (move_layer(seq_.template get<I>(), stage_of(I)), ...);
    } catch (...) {
      placement.restore();
      throw;
    }
  }
  template <class L>
  void move_layer(L& layer, int stage) {
    if constexpr (std::derived_from<L, nn::Module>) layer.to(threads_.device(stage).index);
  }

  /// dst (on stage s's device, allocated by its thread) = src, the activation stage s - 1 sent;
  /// called by stage s's thread.
  template <Dtype T>
  void receive_activation(int s, Tensor<T, Kind>& dst, const Tensor<T, Kind>& src) {
    copy_on(activation_streams_, s, dst, src);
  }
  /// dst (on stage s's device, allocated by its thread) = src, the gradient of stage s's output
  /// that stage s + 1 computed; called by stage s + 1's thread.
  template <Dtype T>
  void receive_gradient(int s, Tensor<T, Kind>& dst, const Tensor<T, Kind>& src) {
    copy_on(gradient_streams_, s, dst, src);
  }
  // CUDA: the copy on streams[s]. dst is contiguous, of src's dtype, on another device, so
  // copy_ is copy_bytes' peer copy: it waits there for the current stream of src's device (where
  // src was computed) and returns once the copy is done, so stage s's compute needs no event.
  // CPU: a copy by the calling thread.
  template <Dtype T>
  static void copy_on(const std::vector<Stream>& streams, int s, Tensor<T, Kind>& dst,
                      const Tensor<T, Kind>& src) {
    if constexpr (Kind::type == DeviceType::cuda) {
      StreamGuard guard(streams[static_cast<std::size_t>(s)]);
      dst.copy_(src);
    } else {
      dst.copy_(src);
    }
  }

  /// Layers [first_layer(from), first_layer(to)) applied to x (a Var or a tensor), each
  /// layer's result bound to x's type.
  template <class X>
  X run_stage_range(int from, int to, X x) {
    const int begin = first_layer_[static_cast<std::size_t>(from)];
    const int end = first_layer_[static_cast<std::size_t>(to)];
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((static_cast<int>(I) >= begin && static_cast<int>(I) < end ? void(x = apply<I>(x))
                                                                  : void()),
       ...);
    }(std::make_index_sequence<layer_count>{});
    return x;
  }
  template <std::size_t I, class X>
  X apply(const X& x) {
    auto out = seq_.template get<I>().forward(x);
    static_assert(std::is_same_v<typename decltype(out)::value_type, typename X::value_type>,
                  "Pipeline: every layer must keep the dtype of its input");
    return X(out);
  }

  /// The stages' rendezvous: boxes (tensors) put by one stage and taken by another; a failure
  /// on one stage wakes and stops the others.
  struct exchange {
    std::mutex mutex;
    std::condition_variable changed;
    bool aborted = false;
    std::exception_ptr failure;

    template <class Box>
    void put(Box& box, Box value) {
      {
        std::lock_guard lock(mutex);
        box = std::move(value);
      }
      changed.notify_all();
    }
    template <class Box>
    Box take(Box& box) {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return aborted || box.defined(); });
      if (aborted) throw error("Pipeline: another stage failed");
      Box value = std::move(box);
      box = Box{};
      return value;
    }
    void abort(std::exception_ptr e) {
      {
        std::lock_guard lock(mutex);
        if (!failure) failure = e;
        aborted = true;
      }
      changed.notify_all();
    }
  };

  /// fn(stage) on every stage's thread at once; the first stage to fail stops the others, and
  /// its exception is the one thrown.
  template <class Fn>
  void run_all(exchange& sync, Fn&& fn) {
    try {
      threads_.run([&](int s) {
        try {
          fn(s);
        } catch (...) {
          sync.abort(std::current_exception());
          throw;
        }
      });
    } catch (...) {
      if (sync.failure) std::rethrow_exception(sync.failure);
      throw;
    }
  }

  Seq& seq_;
  PipelineOptions options_;
  DeviceThreads<Kind> threads_;
  std::vector<int> first_layer_;  // [stage], plus the end
  std::vector<StagePlan> plan_;
  std::vector<Stream> activation_streams_;  // [stage], CUDA: where activations arrive
  std::vector<Stream> gradient_streams_;    // [stage], CUDA: where gradients arrive
};

template <class Seq>
Pipeline(Seq&, PipelineOptions) -> Pipeline<Seq>;

template <class Seq>
template <class Fn, class Spec, class... Specs>
auto Pipeline<Seq>::compile(Fn loss, const Spec& input_spec, const Specs&... specs) {
  using T = typename Spec::value_type;
  static_assert(std::is_same_v<typename Spec::device_kind, Kind>,
                "Pipeline::compile: the input's device kind is not the module's");
  using Activation = Tensor<T, Kind>;
  using Var = autograd::Var<T, Kind>;
  using Extras = std::tuple<Tensor<typename Specs::value_type, Kind>...>;
  const int S = stages();
  const int last = S - 1;
  std::vector<Shape> shapes{input_spec.shape, specs.shape...};
  for (const Shape& shape : shapes) {
    if (shape.size() == 0) {
      throw shape_error("Pipeline::compile: an input is 0-dim; every input needs a batch "
                        "dimension (dimension 0)");
    }
    if (shape[0] != shapes[0][0]) {
      throw shape_error("Pipeline::compile: the inputs disagree on the batch (dimension 0): " +
                        shapes[0].str() + " and " + shape.str());
    }
  }
  const std::int64_t batch = shapes[0][0];
  if (batch < 1) {
    throw shape_error("Pipeline::compile: the batch is empty (input shape " + shapes[0].str() +
                      ")");
  }
  const std::vector<std::int64_t> sizes = detail::micro_batch_sizes(batch, options_);
  const int count = static_cast<int>(sizes.size());
  // Micro-batches of one shape class share programs: 0, the full size; 1, a smaller last one.
  const int classes = sizes.back() == sizes.front() ? 1 : 2;
  auto class_of = [&](int j) { return sizes[static_cast<std::size_t>(j)] == sizes[0] ? 0 : 1; };
  auto rows_of = [&](int c) { return c == 0 ? sizes.front() : sizes.back(); };
  const int stop = options_.checkpoint == Checkpoint::always        ? count
                   : options_.checkpoint == Checkpoint::except_last ? count - 1
                                                                    : 0;

  // Each stage's ops, and the slot (program) of each micro-batch: a slot is held from a
  // non-checkpointed forward to its backward, and for the duration of a checkpointed op.
  std::vector<std::vector<detail::pipeline_op>> ops(static_cast<std::size_t>(S));
  std::vector<std::vector<int>> slots(static_cast<std::size_t>(S), std::vector<int>(2, 0));
  std::vector<int> max_in_flight(static_cast<std::size_t>(S), 0);
  for (int s = 0; s < S; ++s) {
    auto& list = ops[static_cast<std::size_t>(s)];
    if (options_.schedule == Schedule::gpipe) {
      for (int j = 0; j < count; ++j) list.push_back({false, j, 0});
      for (int j = count - 1; j >= 0; --j) list.push_back({true, j, 0});
    } else {
      const int warmup = std::min(S - 1 - s, count);
      int f = 0, b = 0;
      for (; f < warmup; ++f) list.push_back({false, f, 0});
      while (f < count) {
        list.push_back({false, f++, 0});
        list.push_back({true, b++, 0});
      }
      while (b < count) list.push_back({true, b++, 0});
    }
    std::vector<std::vector<char>> busy(2);
    std::vector<int> slot_of(static_cast<std::size_t>(count), -1);
    int in_flight = 0;
    auto acquire = [&](int c) {
      auto& b = busy[static_cast<std::size_t>(c)];
      for (std::size_t i = 0; i < b.size(); ++i) {
        if (!b[i]) {
          b[i] = 1;
          return static_cast<int>(i);
        }
      }
      b.push_back(1);
      return static_cast<int>(b.size()) - 1;
    };
    for (auto& op : list) {
      const int c = class_of(op.micro_batch);
      const bool ckpt = op.micro_batch < stop;
      auto& slot = slot_of[static_cast<std::size_t>(op.micro_batch)];
      if (!op.backward) {
        ++in_flight;
        slot = acquire(c);
        if (ckpt) busy[static_cast<std::size_t>(c)][static_cast<std::size_t>(slot)] = 0;
      } else {
        --in_flight;
        if (ckpt) slot = acquire(c);
        busy[static_cast<std::size_t>(c)][static_cast<std::size_t>(slot)] = 0;
      }
      op.slot = slot;
      max_in_flight[static_cast<std::size_t>(s)] =
          std::max(max_in_flight[static_cast<std::size_t>(s)], in_flight + (op.backward ? 1 : 0));
      for (int k = 0; k < 2; ++k) {
        slots[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)] =
            std::max(slots[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)],
                     static_cast<int>(busy[static_cast<std::size_t>(k)].size()));
      }
    }
  }

  // A stage whose layers have no parameter that requires grad, after stages that have none
  // either, has no backward (the last stage always computes the loss's backward).
  std::vector<char> trains(static_cast<std::size_t>(S), 1);
  {
    std::size_t layer = 0;
    std::vector<char> has(static_cast<std::size_t>(S), 0);
    auto visit = [&](const auto& l) {
      if (detail::layer_trains(l)) has[static_cast<std::size_t>(stage_of(layer))] = 1;
      ++layer;
    };
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (visit(seq_.template get<I>()), ...);
    }(std::make_index_sequence<layer_count>{});
    bool earlier = false;  // a gradient must flow back into some earlier stage
    for (int s = 0; s < S; ++s) {
      trains[static_cast<std::size_t>(s)] = has[static_cast<std::size_t>(s)] || earlier || s == last;
      earlier = earlier || has[static_cast<std::size_t>(s)];
    }
  }
  auto needs_input_grad = [&](int s) { return detail::needs_input_grad(trains, s); };

  // The programs, stage after stage (each on its own thread: tracing works on the current
  // device), for each micro-batch shape; a stage's output shape is the next stage's input.
  std::vector<std::vector<Shape>> in_shapes(static_cast<std::size_t>(S),
                                            std::vector<Shape>(static_cast<std::size_t>(classes)));
  for (int c = 0; c < classes; ++c) {
    Shape shape = shapes[0];
    shape[0] = rows_of(c);
    in_shapes[0][static_cast<std::size_t>(c)] = shape;
  }
  auto last_fn_for = [&](int c) {
    const double weight =
        static_cast<double>(rows_of(c)) / static_cast<double>(batch);
    return [this, &loss, last, weight](Var x, auto... vars) {
      return loss(run_stage_range(last, last + 1, x), vars...) * weight;
    };
  };
  auto last_spec = [&](int c) {
    auto spec = autograd::input<T, Kind>(in_shapes[static_cast<std::size_t>(last)][static_cast<std::size_t>(c)],
                                         device(last).index);
    spec.requires_grad = needs_input_grad(last);
    return spec;
  };
  auto extra_spec = [&](auto spec, int c) {
    spec.shape[0] = rows_of(c);
    spec.device = device(last).index;
    return spec;
  };
  using LastProgram = decltype(autograd::compile(last_fn_for(0), last_spec(0), extra_spec(specs, 0)...));
  std::vector<std::vector<std::vector<autograd::Program<Activation>>>> stage_programs(
      static_cast<std::size_t>(S));
  std::vector<std::vector<LastProgram>> last_programs;
  for (int s = 0; s < S; ++s) {
    stage_programs[static_cast<std::size_t>(s)].resize(static_cast<std::size_t>(classes));
  }
  for (int s = 0; s < S; ++s) {
    threads_.run([&](int member) {
      if (member != s) return;
      for (int c = 0; c < classes; ++c) {
        const int n = slots[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
        if (s == last) {
          std::vector<LastProgram> list;
          for (int k = 0; k < n; ++k) {
            list.push_back(autograd::compile(last_fn_for(c), last_spec(c), extra_spec(specs, c)...));
          }
          last_programs.push_back(std::move(list));
          continue;
        }
        Shape out_shape;
        auto fn = [this, s, &out_shape](Var x) {
          Var y = run_stage_range(s, s + 1, x);
          out_shape = y.shape();
          return y;
        };
        auto spec = autograd::input<T, Kind>(in_shapes[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)],
                                             device(s).index);
        spec.requires_grad = needs_input_grad(s);
        const autograd::Options opts{.mode = trains[static_cast<std::size_t>(s)]
                                                  ? autograd::Mode::training
                                                  : autograd::Mode::inference,
                                     .seed_gradient = true,
                                     // the step's rollback keeps every gradient (gradients_)
                                     .restore_gradients = false};
        auto& list = stage_programs[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
        for (int k = 0; k < std::max(n, 1); ++k) list.push_back(autograd::compile(fn, spec, opts));
        in_shapes[static_cast<std::size_t>(s) + 1][static_cast<std::size_t>(c)] = out_shape;
      }
    });
  }

  PipelineProgram<Seq, T, LastProgram, Extras> program(this, sizes, shapes, stop);
  program.stage_programs_ = std::move(stage_programs);
  program.last_programs_ = std::move(last_programs);
  program.ops_ = std::move(ops);
  program.trains_ = std::move(trains);

  // The plan: one micro-batch kept for backward is its program's arena and its inputs; the
  // peak follows the ops (a checkpointed micro-batch, or one on a stage without backward, keeps
  // only its input, and needs the arena while its forward or its recomputation and backward
  // run).
  plan_.clear();
  for (int s = 0; s < S; ++s) {
    StagePlan p;
    p.device = device(s);
    p.first_layer = first_layer(s);
    p.last_layer = first_layer(s + 1);
    p.max_in_flight = max_in_flight[static_cast<std::size_t>(s)];
    std::vector<std::size_t> arena(2, 0), input(2, 0);
    for (int c = 0; c < classes; ++c) {
      if (s == last) {
        p.programs += static_cast<int>(program.last_programs_[static_cast<std::size_t>(c)].size());
        if (!program.last_programs_[static_cast<std::size_t>(c)].empty()) {
          const auto& mp = program.last_programs_[static_cast<std::size_t>(c)][0].plan();
          arena[static_cast<std::size_t>(c)] = autograd::detail::round_block(mp.planned_bytes);
        }
      } else {
        const auto& list = program.stage_programs_[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
        p.programs += static_cast<int>(list.size());
        arena[static_cast<std::size_t>(c)] = autograd::detail::round_block(list[0].plan().planned_bytes);
      }
      input[static_cast<std::size_t>(c)] = autograd::detail::round_block(
          static_cast<std::size_t>(in_shapes[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)].numel()) *
          sizeof(T));
    }
    // The gradient of the output, received from the next stage.
    std::size_t received = 0;
    if (s < last && program.trains_[static_cast<std::size_t>(s)]) {
      received = autograd::detail::round_block(
          static_cast<std::size_t>(in_shapes[static_cast<std::size_t>(s) + 1][0].numel()) *
          sizeof(T));
    }
    if (s == last) {  // the loss's inputs
      for (int c = 0; c < classes; ++c) {
        const std::int64_t rows = rows_of(c);
        ((input[static_cast<std::size_t>(c)] += autograd::detail::round_block(
              static_cast<std::size_t>(specs.shape.numel() / std::max<std::int64_t>(batch, 1) *
                                       rows) *
              sizeof(typename Specs::value_type))),
         ...);
      }
    }
    p.micro_batch_bytes = arena[0] + input[0] + received;
    std::size_t held = 0, peak = 0;
    for (const auto& op : program.ops_[static_cast<std::size_t>(s)]) {
      const auto c = static_cast<std::size_t>(class_of(op.micro_batch));
      const bool ckpt = op.micro_batch < stop || !program.trains_[static_cast<std::size_t>(s)];
      const std::size_t kept = input[c] + received + (ckpt ? 0 : arena[c]);
      if (!op.backward) {
        // + the copy of the output a checkpointed micro-batch sends (its arena goes)
        peak = std::max(peak, held + input[c] + received + arena[c] + (ckpt ? received : 0));
        held += kept;
      } else {
        peak = std::max(peak, held + (ckpt ? arena[c] : 0));
        held -= kept;
      }
    }
    p.peak_bytes = peak;
    plan_.push_back(p);
  }
  program.plan_ = plan_;
  return program;
}

}  // namespace tessera::parallel
