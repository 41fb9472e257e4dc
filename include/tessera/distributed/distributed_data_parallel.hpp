// DistributedDataParallel<M>: PyTorch's DDP, one process per device (ts::distributed). At
// construction the module's parameters and buffers are checked against rank 0's (same names,
// dtypes and shapes) and broadcast from it. Gradients live in buckets: each parameter's gradient
// is a view into a flat bucket buffer (PyTorch's gradient_as_bucket_view), buckets filled in
// reverse registration order (the first up to first_bucket_mb, the others up to bucket_cap_mb),
// the same on every rank. During backward, Program::on_gradient_ready reports each gradient
// final; when a bucket's gradients are all final its all-reduce (average) starts on the progress
// thread while backward goes on, buckets started in order so that every rank posts the same
// collectives in the same order. backward() returns once every bucket is reduced.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/autograd/program.hpp"
#include "tessera/core/error.hpp"
#include "tessera/nn/module.hpp"
#include "tessera/parallel/detail/step_rollback.hpp"
#include "tessera/distributed/process_group.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/state_dict.hpp"

namespace tessera::parallel {

/// DistributedDataParallel's options (PyTorch's names and defaults).
struct DistributedDataParallelOptions {
  /// Bucket size in MiB, and the first (smaller, so communication starts early) bucket's.
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  /// A parameter that gets no gradient in a backward: with false, backward throws naming it;
  /// with true, its current gradient (zero unless accumulated) is reduced with the others.
  bool find_unused_parameters = false;
  /// Rank 0's buffers (BatchNorm's running statistics) are broadcast before each forward.
  bool broadcast_buffers = true;
  /// false: every bucket is reduced after the backward instead of during it (to measure what
  /// the overlap hides).
  bool overlap = true;
};

namespace detail {

/// The gradient buckets and their reduction, shared by a DistributedDataParallel and the
/// programs it compiles.
class gradient_reducer {
 public:
  struct bucket_info {
    ScalarType dtype;
    std::int64_t numel = 0;
    std::vector<std::string> parameters;  // names, in bucket order
  };

  gradient_reducer(nn::Module& module, distributed::ProcessGroup group,
                   const DistributedDataParallelOptions& options)
      : group_(std::move(group)), options_(options) {
    // Reverse registration order: the last layers' gradients are final first in backward.
    auto named = module.named_parameters();
    const double first_cap = options.first_bucket_mb * 1024 * 1024;
    const double cap = options.bucket_cap_mb * 1024 * 1024;
    for (auto it = named.rbegin(); it != named.rend(); ++it) {
      const auto& [name, parameter] = *it;
      if (!parameter.requires_grad()) continue;
      const AnyTensor value = parameter.value();
      const std::size_t bytes = value.nbytes();
      // A bucket holds one dtype on one device; a parameter larger than the cap has its own.
      bool fits = !buckets_.empty() && buckets_.back().info.dtype == value.dtype() &&
                  slots_[buckets_.back().slots.front()].parameter.device() == value.device();
      if (fits) {
        const double limit = buckets_.size() == 1 ? first_cap : cap;
        const double used = static_cast<double>(buckets_.back().info.numel) *
                            static_cast<double>(element_size(value.dtype()));
        fits = used + static_cast<double>(bytes) <= limit;
      }
      if (!fits) {
        buckets_.emplace_back();
        buckets_.back().info.dtype = value.dtype();
      }
      bucket& b = buckets_.back();
      slots_.push_back({parameter, name, buckets_.size() - 1, b.info.numel, value.numel(), {}});
      b.slots.push_back(slots_.size() - 1);
      b.info.numel += value.numel();
      b.info.parameters.push_back(name);
      slot_of_[parameter.id()] = slots_.size() - 1;
    }
    // One flat buffer per bucket; each gradient becomes a view into it (its current gradient,
    // if any, copied in).
    for (bucket& b : buckets_) {
      const Device device = slots_[b.slots.front()].parameter.device();
      visit_dtype(b.info.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (is_floating_point_v<T>) {
#if TESSERA_CUDA
          if (device.type == DeviceType::cuda) return make_views<T, cuda>(b, device);
#endif
          make_views<T, cpu>(b, device);
        } else {
          throw dtype_error(std::string("DistributedDataParallel: parameter ") +
                            slots_[b.slots.front()].name + " has dtype " + name(b.info.dtype) +
                            "; gradients are floating");
        }
      });
    }
    reported_.assign(slots_.size(), 0);
  }

  std::vector<bucket_info> buckets() const {
    std::vector<bucket_info> out;
    for (const bucket& b : buckets_) out.push_back(b.info);
    return out;
  }
  bool synchronizing() const noexcept { return sync_; }
  void set_synchronizing(bool on) noexcept { sync_ = on; }
  /// Buckets whose all-reduce started before the last backward's program returned.
  int started_during_backward() const noexcept { return started_during_backward_; }

  void prepare() {
    std::fill(reported_.begin(), reported_.end(), 0);
    for (bucket& b : buckets_) {
      b.pending = b.slots.size();
      b.work = distributed::Work();
    }
    next_ = 0;
    copied_.clear();
    in_backward_ = true;
    started_during_backward_ = 0;
  }

  void ready(const autograd::GradientReady& r) {
    if (!sync_) return;  // no_sync: gradients accumulate in place
    const auto found = slot_of_.find(r.parameter);
    if (found == slot_of_.end()) return;  // not a parameter of the module
    const std::size_t s = found->second;
    if (reported_[s]) return;
    reported_[s] = 1;
    slot& sl = slots_[s];
    if (r.grad.data_ptr() != sl.view.data_ptr()) {
      // The gradient was replaced (set_grad) since the buckets were made: through the bucket.
      sl.view.copy_(r.grad);
      copied_.push_back({r.grad, sl.view});
    }
    --buckets_[sl.bucket].pending;
    if (options_.overlap) start_ready();
  }

  void finish() {
    in_backward_ = false;
    if (!sync_) return;
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (reported_[s]) continue;
      if (!options_.find_unused_parameters) {
        wait_started();
        throw error("DistributedDataParallel: parameter " + slots_[s].name +
                    " received no gradient in this backward (the loss does not use it); pass "
                    "{.find_unused_parameters = true} to reduce its current gradient anyway, or "
                    "set requires_grad_(false) on it");
      }
      // Its current gradient, read through grad(): zeros that zero_grad() left unwritten are
      // written into the bucket before it is reduced.
      static_cast<void>(slots_[s].parameter.grad());
      reported_[s] = 1;
      --buckets_[slots_[s].bucket].pending;
    }
    start_ready();
    wait_started();
    for (const auto& [gradient, view] : copied_) gradient.copy_(view);
    copied_.clear();
  }

  // The module's buffers from rank 0.
  void broadcast_buffers(const nn::Module& module) {
    if (!options_.broadcast_buffers || group_.size() == 1) return;
    std::vector<distributed::Work> works;
    for (const auto& [name, buffer] : module.named_buffers()) {
      const AnyTensor value = buffer.value();
      if (value.defined()) works.push_back(group_.broadcast_async(value, 0));
    }
    for (auto& w : works) w.wait();
  }

 private:
  struct slot {
    nn::ParameterRef parameter;
    std::string name;
    std::size_t bucket = 0;
    std::int64_t offset = 0;
    std::int64_t numel = 0;
    AnyTensor view;
  };
  struct bucket {
    bucket_info info;
    std::vector<std::size_t> slots;
    std::size_t pending = 0;
    AnyTensor buffer;
    distributed::Work work;
  };

  template <Dtype T, DeviceKind K>
  void make_views(bucket& b, Device device) {
    auto buffer = Tensor<T, K>::empty_on({b.info.numel}, device);
    buffer.zero_();
    b.buffer = buffer;
    for (std::size_t s : b.slots) {
      slot& sl = slots_[s];
      Tensor<T, K> view = buffer.narrow(0, sl.offset, sl.numel).view(sl.parameter.shape());
      const AnyTensor old = sl.parameter.grad();
      if (old.defined()) view.copy_(old.template as<T, K>());
      sl.view = view;
      sl.parameter.set_grad(view);
    }
  }

  // Starts the all-reduce of every complete bucket, in bucket order.
  void start_ready() {
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) {
      bucket& b = buckets_[next_++];
      b.work = group_.all_reduce_async(b.buffer, ReduceOp::avg);
      if (in_backward_) ++started_during_backward_;
    }
  }
  void wait_started() {
    for (std::size_t i = 0; i < next_; ++i) buckets_[i].work.wait();
  }

 public:
  // After a backward that threw: waits for the all-reduces already started (their errors are
  // not the one to report), so that none writes into a gradient after the caller has put the
  // gradients back.
  void settle() noexcept {
    in_backward_ = false;
    for (std::size_t i = 0; i < next_; ++i) {
      try {
        buckets_[i].work.wait();
      } catch (...) {
      }
    }
    copied_.clear();
  }

 private:

  distributed::ProcessGroup group_;
  DistributedDataParallelOptions options_;
  std::vector<slot> slots_;  // reverse registration order
  std::vector<bucket> buckets_;
  std::unordered_map<const void*, std::size_t> slot_of_;
  std::vector<char> reported_;
  std::vector<std::pair<AnyTensor, AnyTensor>> copied_;  // (gradient, its bucket view)
  std::size_t next_ = 0;  // the next bucket to start
  bool sync_ = true;
  bool in_backward_ = false;
  int started_during_backward_ = 0;
};

}  // namespace detail

template <class M, class Program>
class DistributedProgram;

/// PyTorch's DistributedDataParallel over the world's ProcessGroup: every rank runs the same
/// module on its own batch, and backward leaves in every rank's parameters the average of the
/// ranks' gradients, so with a mean loss and equal batches the gradient of the global batch.
/// An optimiser over module().parameters() then steps identically everywhere.
template <class M>
class DistributedDataParallel {
  static_assert(std::derived_from<M, nn::Module>,
                "DistributedDataParallel wraps a module (a class derived from ts::nn::Module)");

 public:
  using Options = DistributedDataParallelOptions;

  /// Takes `module` (CPU tensors: the one this process trains), checks that every rank's has the
  /// same parameters and buffers (names, dtypes, shapes; throws shape_error on every rank naming
  /// the first that differs and both shapes), and copies rank 0's values into every rank's.
  /// Each parameter's gradient becomes a view into its bucket. Needs ts::distributed::init().
  explicit DistributedDataParallel(M module, Options options = {})
      : module_(std::move(module)), group_(), options_(options) {
    check_options();
    check_same_everywhere();
    std::vector<distributed::Work> works;
    for (const auto& [name, value] : module_.state_dict()) {
      works.push_back(group_.broadcast_async(value, 0));
    }
    for (auto& w : works) w.wait();
    reducer_ = std::make_shared<detail::gradient_reducer>(module_, group_, options_);
  }

  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  M& module() noexcept { return module_; }
  const M& module() const noexcept { return module_; }
  distributed::ProcessGroup& process_group() noexcept { return group_; }
  const Options& options() const noexcept { return options_; }
  /// The buckets: dtype, element count and parameter names of each, in reduction order.
  std::vector<detail::gradient_reducer::bucket_info> buckets() const {
    return reducer_->buckets();
  }

  /// The module's state dict with PyTorch's `module.` prefix (what torch DDP saves); a plain
  /// module's load_state_dict strips it.
  StateDict state_dict() const {
    StateDict out;
    for (const auto& [key, value] : module_.state_dict()) out.insert("module." + key, value);
    return out;
  }
  /// Loads into the module (keys with or without the `module.` prefix).
  void load_state_dict(const StateDict& state_dict, bool strict = true) {
    module_.load_state_dict(state_dict, strict);
  }

  /// RAII: while it lives, backward accumulates gradients locally without reducing them; the
  /// next backward after it reduces the accumulated gradients (gradient accumulation).
  class NoSync {
   public:
    explicit NoSync(detail::gradient_reducer& reducer)
        : reducer_(&reducer), previous_(reducer.synchronizing()) {
      reducer.set_synchronizing(false);
    }
    ~NoSync() { reducer_->set_synchronizing(previous_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    detail::gradient_reducer* reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*reducer_); }

  /// Training: `fn(module, vars...)` returns this rank's loss for the batch the specs
  /// (autograd::input, this rank's batch, placed on the module's device whatever their device
  /// says) describe; an autograd::Options may follow. The
  /// result's forward(tensors...) broadcasts rank 0's buffers (broadcast_buffers) and returns
  /// this rank's loss; its backward() runs the program's backward with the buckets' all-reduces
  /// overlapping it, and returns with the averaged gradients in the module's parameters. Keep
  /// this DistributedDataParallel alive while the program is used.
  template <class Fn, class... Args>
  auto compile(Fn fn, const Args&... args) {
    M& m = module_;
    // The inputs live where the module does (an input spec's device defaults to 0).
    // The step's rollback keeps the module's gradients (gradients_), so the program keeps none.
    auto on_module_device = [device = module_device().index](auto arg) {
      if constexpr (requires { arg.shape, arg.device = device; }) arg.device = device;
      if constexpr (std::is_same_v<decltype(arg), autograd::Options>) arg.restore_gradients = false;
      return arg;
    };
    auto traced = [fn, &m](auto... vars) { return fn(m, vars...); };
    auto program = [&] {
      if constexpr (autograd::detail::ends_with_options<Args...>()) {
        return autograd::compile(traced, on_module_device(args)...);
      } else {
        return autograd::compile(traced, on_module_device(args)...,
                                 autograd::Options{.restore_gradients = false});
      }
    }();
    return DistributedProgram<M, decltype(program)>(this, std::move(program), reducer_);
  }

  /// Eager forward on this rank's batch (inference): the module's own forward.
  template <class X>
  auto operator()(const X& x) {
    reducer_->broadcast_buffers(module_);
    return module_.forward(x);
  }

 private:
  void check_options() const {
    if (!(options_.bucket_cap_mb > 0) || !(options_.first_bucket_mb > 0)) {
      throw std::invalid_argument(
          "DistributedDataParallel: bucket_cap_mb " + std::to_string(options_.bucket_cap_mb) +
          " and first_bucket_mb " + std::to_string(options_.first_bucket_mb) +
          " must be positive");
    }
  }

  // Every rank's parameters and buffers against rank 0's: count, then (dtype, rank, extents)
  // of each. Every rank takes part in every step and throws the same error.
  void check_same_everywhere() {
    constexpr std::size_t width = 2 + 8;  // dtype, dims, up to 8 extents
    std::vector<std::pair<std::string, AnyTensor>> entries;
    for (const auto& [key, value] : module_.state_dict()) entries.emplace_back(key, value);
    auto signature = [&](const AnyTensor& t, std::int64_t* out) {
      out[0] = static_cast<std::int64_t>(t.dtype());
      out[1] = t.dim();
      for (int d = 0; d < 8; ++d) out[2 + d] = d < t.dim() ? t.shape()[d] : -1;
    };
    auto describe = [&](const std::int64_t* s) {
      std::string text = name(static_cast<ScalarType>(s[0]));
      text += " [";
      for (std::int64_t d = 0; d < s[1] && d < 8; ++d) {
        text += (d ? ", " : "") + std::to_string(s[2 + d]);
      }
      return text + "]";
    };
    const auto count = static_cast<std::int64_t>(entries.size());
    auto counts = from_vector<std::int64_t>({count, -count}, {2});  // on the CPU
    group_.all_reduce(counts, ReduceOp::max);
    const std::vector<std::int64_t> extremes = counts.to_vector();
    if (extremes[0] != -extremes[1]) {
      throw shape_error("DistributedDataParallel: the ranks' modules have from " +
                        std::to_string(-extremes[1]) + " to " + std::to_string(extremes[0]) +
                        " parameters and buffers (rank " + std::to_string(group_.rank()) +
                        " has " + std::to_string(count) + ")");
    }
    const Device host{DeviceType::cpu, cpu::current_device()};
    auto mine = Tensor<std::int64_t, cpu>::empty_on({count * static_cast<std::int64_t>(width)},
                                                    host);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      signature(entries[i].second, mine.data() + i * width);
    }
    auto reference = mine.clone();
    group_.broadcast(reference, 0);
    std::int64_t first = count;
    for (std::int64_t i = 0; i < count && first == count; ++i) {
      for (std::size_t k = 0; k < width; ++k) {
        if (mine.data()[i * static_cast<std::int64_t>(width) + static_cast<std::int64_t>(k)] !=
            reference.data()[i * static_cast<std::int64_t>(width) + static_cast<std::int64_t>(k)]) {
          first = i;
          break;
        }
      }
    }
    auto earliest = from_vector<std::int64_t>({first}, {1});
    group_.all_reduce(earliest, ReduceOp::min);
    const std::int64_t bad = earliest.item();
    if (bad == count) return;
    // Everyone's entry `bad`, so that every rank names the same rank and shapes.
    auto theirs = Tensor<std::int64_t, cpu>::empty_on(
        {static_cast<std::int64_t>(group_.size()) * static_cast<std::int64_t>(width)}, host);
    auto own = mine.narrow(0, bad * static_cast<std::int64_t>(width),
                           static_cast<std::int64_t>(width));
    group_.all_gather(own, theirs);
    int other = 1;
    for (int r = 1; r < group_.size(); ++r) {
      bool same = true;
      for (std::size_t k = 0; k < width; ++k) {
        same = same && theirs.data()[static_cast<std::size_t>(r) * width + k] == theirs.data()[k];
      }
      if (!same) {
        other = r;
        break;
      }
    }
    throw shape_error("DistributedDataParallel: " + entries[static_cast<std::size_t>(bad)].first +
                      " is " + describe(theirs.data()) + " on rank 0 but " +
                      describe(theirs.data() + static_cast<std::size_t>(other) * width) +
                      " on rank " + std::to_string(other) +
                      " (every rank must build the same module)");
  }

  // Where the module lives: its first parameter's device (the current CPU device if it has
  // none).
  Device module_device() const {
    const auto parameters = module_.parameters();
    return parameters.empty() ? Device{DeviceType::cpu, cpu::current_device()}
                              : parameters.front().device();
  }

  template <class, class>
  friend class DistributedProgram;

  M module_;
  distributed::ProcessGroup group_;
  Options options_;
  std::shared_ptr<detail::gradient_reducer> reducer_;
};

/// The program of DistributedDataParallel::compile.
template <class M, class Program>
class DistributedProgram {
 public:
  /// Broadcasts rank 0's buffers (if enabled), then this rank's forward; returns its loss.
  template <class... Ts>
  auto forward(const Ts&... inputs) {
    reducer_->broadcast_buffers(owner_->module_);
    return program_.forward(inputs...);
  }
  /// This rank's backward, every bucket's all-reduce (average) started as soon as its gradients
  /// are final; returns when all are reduced (gradients accumulate, as Program::backward's).
  /// Under no_sync(), a local backward only. When it throws (this rank's backward failed, or an
  /// all-reduce did: another rank failed and the group timed out), the all-reduces already
  /// started are waited for and the module's gradients are put back as they were before the
  /// call, on every rank that throws.
  void backward() {
    run_backward([&] { program_.backward(); });
  }
  /// backward() seeded with `scaler`'s loss scale (mixed precision): the averaged gradients are
  /// the scale times the true ones, and an inf or NaN on any rank reaches every rank through the
  /// all-reduce, so every rank's scaler.step(optimizer) skips the same steps (include
  /// tessera/optim/grad_scaler.hpp).
  void backward(const optim::GradScaler& scaler) {
    run_backward([&] { program_.backward(scaler); });
  }
  /// This rank's program (its memory plan).
  Program& program() noexcept { return program_; }
  /// Buckets whose all-reduce started while the last backward was still running.
  int buckets_started_during_backward() const noexcept {
    return reducer_->started_during_backward();
  }

  DistributedProgram(DistributedDataParallel<M>* owner, Program program,
                     std::shared_ptr<detail::gradient_reducer> reducer)
      : owner_(owner), program_(std::move(program)), reducer_(std::move(reducer)) {
    program_.on_gradient_ready(
        [r = reducer_.get()](const autograd::GradientReady& ready) { r->ready(ready); });
  }

 private:
  template <class Run>
  void run_backward(const Run& run) {
    gradients_.record(owner_->module_.parameters());
    try {
      reducer_->prepare();
      run();
      reducer_->finish();
    } catch (...) {
      reducer_->settle();
      gradients_.restore();
      gradients_.commit();
      throw;
    }
    gradients_.commit();
  }

  DistributedDataParallel<M>* owner_;
  Program program_;
  std::shared_ptr<detail::gradient_reducer> reducer_;
  detail::gradient_rollback gradients_;  // the module's gradients before the backward
};

}  // namespace tessera::parallel
