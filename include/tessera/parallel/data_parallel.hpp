// DataParallel<M>: PyTorch's nn.DataParallel over several devices of one kind, and replicate().
// The module lives on device_ids[0]; persistent replicas on the other devices are made once.
// dp(x) splits the batch along `dim` into even pieces (sizes differ by at most one; a batch
// smaller than the device count uses that many devices), copies the module's parameters and
// buffers into the replicas' existing tensors (on CPU devices, which share the host's memory,
// the replicas' parameters are aliases of the module's and only the buffers are copied), runs
// every piece at once (one host thread per device, each on its share of the cores:
// parallel::DeviceThreads) and gathers the outputs on `output_device`. dp.compile(fn,
// specs...) trains: one autograd Program per device for its replica and piece, run at once, the
// replicas' gradients summed into the module's.
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/autograd/program.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/expr/assign.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/nn/module.hpp"
#include "tessera/nn/sequential.hpp"
#include "tessera/parallel/communicator.hpp"
#include "tessera/parallel/detail/step_rollback.hpp"
#include "tessera/parallel/device_threads.hpp"
#include "tessera/tensor/state_dict.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::parallel {

namespace detail {

/// The device kind of a module type: K of `Layer<T, K>` and `Net<K>`, the first kind among a
/// Sequential's layers; cpu for types without one (a user model that is not a template of its
/// kind: name the kind as DataParallel's second argument when it is cuda).
template <class M>
struct module_kind {
  using type = void;
};
template <template <DeviceKind> class M, DeviceKind K>
struct module_kind<M<K>> {
  using type = K;
};
template <template <Dtype, DeviceKind> class M, Dtype T, DeviceKind K>
struct module_kind<M<T, K>> {
  using type = K;
};
template <class... M>
struct module_kind<nn::Sequential<M...>> {
  template <class First, class... Rest>
  static auto first() {
    if constexpr (!std::is_void_v<typename module_kind<First>::type> || sizeof...(Rest) == 0) {
      return std::type_identity<typename module_kind<First>::type>{};
    } else {
      return first<Rest...>();
    }
  }
  using type = typename decltype(first<M...>())::type;
};
template <class M>
using module_kind_t = std::conditional_t<std::is_void_v<typename module_kind<M>::type>, cpu,
                                         typename module_kind<M>::type>;

/// Throws device_mismatch_error naming the first parameter or buffer of `module` that is not on
/// `device` (`what` names the caller).
inline void check_module_on(const nn::Module& module, Device device, const char* what) {
  for (const auto& [key, value] : module.state_dict()) {
    if (value.device() != device) {
      throw device_mismatch_error(std::string(what) + ": the module's " + key + " is on " +
                                  value.device().str() + " but device_ids[0] is " + device.str() +
                                  " (move the module there first, e.g. with ts::nn::to)");
    }
  }
}

/// Thrown in a device's thread when another device's failure ends a meeting_point's wait.
struct meeting_aborted {};

/// A barrier for a fixed team of threads that spins briefly, then sleeps; abort() releases every
/// waiter (now and until reset()) with meeting_aborted, so a device that throws cannot leave the
/// others waiting for it.
class meeting_point {
 public:
  void arrive_and_wait(int count) {
    const std::uint32_t seen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      generation_.notify_all();
    } else {
      auto moved = [&] {
        return generation_.load(std::memory_order_acquire) != seen ||
               aborted_.load(std::memory_order_acquire);
      };
      while (!spin_until(moved)) {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    if (aborted_.load(std::memory_order_acquire)) throw meeting_aborted{};
  }
  void abort() {
    aborted_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
  }
  /// Between uses, with no thread inside.
  void reset() {
    arrived_.store(0, std::memory_order_relaxed);
    aborted_.store(false, std::memory_order_relaxed);
  }

 private:
  std::atomic<int> arrived_{0};
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> aborted_{false};
};

/// R of an autograd::Program<R>: the tensor its forward returns.
template <class P>
struct program_result;
template <class R>
struct program_result<autograd::Program<R>> {
  using type = R;
};

}  // namespace detail

/// A deep copy of `module` on ordinal `device` of its kind: new parameters and buffers holding
/// copies of the values, with the requires_grad flags and training modes (not the gradients),
/// whatever device the module is on. Unlike ts::nn::to, which returns the same module when it is
/// already on that device, this always copies. Throws device_error for an ordinal that does not
/// exist.
template <class M>
M replicate(const M& module, int device) {
  using Kind = detail::module_kind_t<M>;
  static_assert(std::is_same_v<nn::rebind_kind_t<M, Kind>, M>,
                "ts::parallel::replicate: the module type changes on its own kind");
  return nn::detail::copy_to<Kind>(module, resolve_device<Kind>(device));
}

template <class M, DeviceKind Kind, class Program, class Inputs>
class DataParallelProgram;

/// PyTorch's nn.DataParallel: `module` on device_ids[0], replicas on the other devices of kind
/// Kind (by default the module's), inputs split along `dim`, outputs gathered on `output_device`.
template <class M, DeviceKind Kind = detail::module_kind_t<M>>
class DataParallel {
 public:
  /// Every device of Kind (cpu::device_count() virtual CPU devices, or every GPU), output on the
  /// first, split along dimension 0.
  explicit DataParallel(M module) : DataParallel(std::move(module), all_devices()) {}

  /// `device_ids`: distinct existing ordinals of Kind, the module on the first (its parameters
  /// and buffers all there); `output_device`: where outputs are gathered (-1: device_ids[0]);
  /// `dim`: the batch dimension of inputs and outputs. Throws std::invalid_argument for an empty
  /// or repeated list, device_error for an ordinal that does not exist, device_mismatch_error
  /// naming the first tensor of the module that is not on device_ids[0].
  DataParallel(M module, std::vector<int> device_ids, int output_device = -1, int dim = 0)
      : module_(std::move(module)),
        threads_(checked_ids(device_ids)),
        output_device_(output_device == -1 ? device_ids.at(0) : output_device),
        dim_(dim) {
    check_device(Device{Kind::type, output_device_});
    if constexpr (is_module) detail::check_module_on(module_, device(0), "DataParallel");
    replicas_.reserve(device_ids.size() - 1);
    for (std::size_t i = 1; i < device_ids.size(); ++i) {
      replicas_.push_back(replicate(module_, device_ids[i]));
    }
    if constexpr (is_module) bind_copies();
  }

  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// The wrapped module (on device_ids[0]); an optimiser over its parameters trains the model.
  M& module() noexcept { return module_; }
  const M& module() const noexcept { return module_; }
  const std::vector<int>& device_ids() const noexcept { return threads_.device_ids(); }
  int output_device() const noexcept { return output_device_; }
  int dim() const noexcept { return dim_; }

  /// The module's state dict with PyTorch's `module.` prefix on every key (what
  /// torch.nn.DataParallel saves). A plain module's load_state_dict strips it, and this
  /// wrapper's load_state_dict adds it when missing, so checkpoints move both ways.
  StateDict state_dict() const
    requires std::derived_from<M, nn::Module>
  {
    StateDict out;
    for (const auto& [key, value] : module_.state_dict()) out.insert("module." + key, value);
    return out;
  }
  /// Loads into the module (keys with or without the `module.` prefix); the replicas take the
  /// new values at the next call.
  void load_state_dict(const StateDict& state_dict, bool strict = true)
    requires std::derived_from<M, nn::Module>
  {
    module_.load_state_dict(state_dict, strict);
  }

  /// Training over the devices: `fn(module, vars...)` returns the loss of the batch it is given
  /// as a mean over that batch (cross_entropy, mse_loss); `specs` (autograd::input) describe the
  /// whole batch, each split along dim; an autograd::Options may follow. Compiles one program per
  /// device, for its replica and its piece of the batch (a batch smaller than the device count
  /// uses that many). The result's forward(tensors...) returns the whole batch's loss (the
  /// pieces' losses weighted by their sizes: the one-device loss) and its backward() adds the
  /// whole batch's gradient into the module's parameters on device_ids[0], so an optimiser over
  /// module().parameters() works unchanged. The replicas' gradients are summed into the
  /// module's at each backward, and only the module's BatchNorm running statistics
  /// are kept. The program uses this DataParallel's replicas and threads: keep it alive while
  /// the program is used.
  template <class Fn, class... Args>
  auto compile(Fn fn, const Args&... args) {
    constexpr bool has_options = autograd::detail::ends_with_options<Args...>();
    constexpr std::size_t spec_count = sizeof...(Args) - (has_options ? 1 : 0);
    static_assert(spec_count > 0, "DataParallel::compile(fn, specs..., options): no input spec");
    const auto all = std::tie(args...);
    autograd::Options options;
    if constexpr (has_options) options = std::get<sizeof...(Args) - 1>(all);
    options.restore_gradients = false;  // the step's rollback keeps the module's gradients
    if constexpr (is_module) rebind_if_changed();  // the replicas traced on the current tensors
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      const std::vector<Shape> shapes{std::get<I>(all).shape...};
      // The batch: each input's extent along dim, which must agree.
      std::int64_t batch = -1;
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        const int d = shapes[k].normalize_dim(dim_, "DataParallel::compile (dim of an input)");
        if (batch >= 0 && shapes[k][d] != batch) {
          throw shape_error("DataParallel::compile: the inputs disagree on the batch along dim " +
                            std::to_string(dim_) + ": " + shapes[0].str() + " and " +
                            shapes[k].str());
        }
        batch = shapes[k][d];
      }
      const int used = static_cast<int>(std::max<std::int64_t>(
          1, std::min<std::int64_t>(batch, static_cast<std::int64_t>(threads_.size()))));
      const std::vector<std::int64_t> sizes = even_split(batch, used);
      auto piece_spec = [&](auto spec, int member) {
        spec.shape[spec.shape.normalize_dim(dim_)] = sizes[static_cast<std::size_t>(member)];
        spec.device = device_ids()[static_cast<std::size_t>(member)];
        return spec;
      };
      using Specs = std::tuple<Args...>;
      using Inputs =
          std::tuple<Tensor<typename std::tuple_element_t<I, Specs>::value_type, Kind>...>;
      auto compile_member = [&](int member) {
        M& replica = member == 0 ? module_ : replicas_[static_cast<std::size_t>(member - 1)];
        // The piece's mean loss weighted by its share of the batch: the pieces add up to the
        // whole batch's mean.
        const double weight = static_cast<double>(sizes[static_cast<std::size_t>(member)]) /
                              static_cast<double>(batch);
        auto replica_fn = [&fn, &replica, weight](auto... vars) {
          return fn(replica, vars...) * weight;  // 1 exactly for one device
        };
        return autograd::compile(replica_fn, piece_spec(std::get<I>(all), member)..., options);
      };
      using Program = decltype(compile_member(0));
      std::vector<Program> programs;
      std::vector<Inputs> buffers;
      for (int member = 0; member < used; ++member) {
        // Compiled on the member's own thread: tracing makes tensors on the current device.
        std::optional<Program> compiled;
        threads_.run([&](int m) {
          if (m == member) compiled.emplace(compile_member(member));
        });
        programs.push_back(std::move(*compiled));
        buffers.push_back(Inputs{std::tuple_element_t<I, Inputs>::empty_on(
            piece_spec(std::get<I>(all), member).shape, device(member))...});
      }
      return DataParallelProgram<M, Kind, Program, Inputs>(this, std::move(programs), shapes,
                                                           sizes, dim_, std::move(buffers));
    }(std::make_index_sequence<spec_count>{});
  }

  /// The module applied to `x` (a tensor of Kind on any ordinal) as one batch split over the
  /// devices: each device runs its piece at once, the outputs concatenated along dim on
  /// output_device. Replica i uses the module's current parameters, buffers and training mode
  /// (BatchNorm in training mode normalises each piece with its own statistics, as in PyTorch).
  /// When every replica returns a 0-dim tensor (a loss, say), the result is a 1-d tensor of one
  /// value per device used, in device_ids order, whatever `dim` is (PyTorch's gather does this
  /// with a warning; with a single device id the module's 0-dim output is returned as it is, also
  /// as PyTorch). Throws shape_error naming the shape when x has no dimension `dim`, or naming
  /// both shapes when the pieces' outputs cannot be concatenated.
  template <Dtype T>
  auto operator()(const Tensor<T, Kind>& x) {
    if (!x.defined()) throw error("DataParallel: the input is undefined");
    const int d = x.shape().normalize_dim(dim_, "DataParallel (dim of the input)");
    const std::int64_t batch = x.size(d);
    const int used = static_cast<int>(std::max<std::int64_t>(
        1, std::min<std::int64_t>(batch, static_cast<std::int64_t>(threads_.size()))));
    const std::vector<std::int64_t> sizes = even_split(batch, used);
    std::vector<std::int64_t> offsets(sizes.size(), 0);
    for (std::size_t i = 1; i < sizes.size(); ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];

    using Out = decltype(run(module_, x));
    std::vector<Out> outputs(static_cast<std::size_t>(used));
    // First every replica takes the module's state, then all run: the module's own forward on
    // device_ids[0] may update its buffers (BatchNorm's running statistics) while running.
    constexpr bool on_cpu = std::is_same_v<Kind, cpu>;
    if constexpr (is_module) {
      rebind_if_changed();
      if (used > 1 && (!on_cpu || has_buffers())) {
        threads_.run([&](int member) {
          if (member < used) copy_state(member, used);
        });
      }
    }
    // The module's forward (member 0) moves its buffers (BatchNorm's running statistics and
    // batch count) in training mode, and every member draws from its device's generator
    // (Dropout): kept aside first, and put back when any member throws, so a failed call (a
    // piece BatchNorm refuses, out of memory) leaves the module and the generators as they were.
    record_effects(used);
    try {
      threads_.run([&](int member) {
        if (member >= used) return;
        if constexpr (is_module && on_cpu) {
          if (member > 0) copy_training_modes(member);
        }
        M& replica = member == 0 ? module_ : replicas_[static_cast<std::size_t>(member - 1)];
        const auto i = static_cast<std::size_t>(member);
        const Tensor<T, Kind> piece = x.narrow(d, offsets[i], sizes[i]).to(device_ids()[i]);
        outputs[i] = run(replica, piece);
      });
    } catch (...) {
      effects_.restore();
      throw;
    }
    effects_.commit();
    return gather(outputs);
  }

 private:
  static std::vector<int> all_devices() {
    std::vector<int> ids(static_cast<std::size_t>(device_count(Kind::type)));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
    return ids;
  }
  static std::vector<int> checked_ids(const std::vector<int>& ids) {
    parallel::detail::check_device_ids<Kind>(ids, "DataParallel");
    return ids;
  }
  Device device(int member) const { return threads_.device(member); }

  static constexpr bool is_module = std::derived_from<M, nn::Module>;

  // Pairs (replica's tensor, module's tensor) of every parameter and buffer, found once: a
  // replica is bound to the module's tensors as they are at construction (load_state_dict copies
  // into them; a module moved elsewhere afterwards no longer fits its DataParallel anyway).
  // On CPU devices a replica's parameters are aliases of the module's (Storage::alias: the
  // devices share the host's memory and the replicas only read them), so only the buffers,
  // which a replica's forward writes (BatchNorm's running statistics), are copied.
  struct replica_copies {
    std::vector<std::pair<AnyTensor, AnyTensor>> parameters;
    std::vector<std::pair<AnyTensor, AnyTensor>> buffers;
    std::size_t bytes = 0;  // of all pairs
  };
  // The module's parameters' then buffers' values now.
  std::vector<AnyTensor> module_tensors() const {
    std::vector<AnyTensor> out;
    for (const auto& p : module_.parameters()) out.push_back(p.value());
    for (const auto& b : module_.buffers()) out.push_back(b.value());
    return out;
  }
  void bind_copies() {
    const auto module_parameters = module_.parameters();
    const auto module_buffers = module_.buffers();
    bound_ = module_tensors();
    copies_.assign(static_cast<std::size_t>(threads_.size()), replica_copies{});
    flat_copies_ = true;
    for (std::size_t m = 1; m < copies_.size(); ++m) {
      const M& replica = replicas_[m - 1];
      const auto parameters = replica.parameters();
      for (std::size_t p = 0; p < parameters.size(); ++p) {
        const AnyTensor from = module_parameters[p].value();
        if constexpr (std::is_same_v<Kind, cpu>) {
          const Device here = device(static_cast<int>(m));
          parameters[p].set_value(from.visit([&](auto typed) {
            return AnyTensor(decltype(typed)(Storage::alias(typed.storage(), here), typed.shape(),
                                             typed.strides(), typed.storage_offset()));
          }));
        } else {
          copies_[m].parameters.emplace_back(parameters[p].value(), from);
        }
      }
      const auto buffers = replica.buffers();
      for (std::size_t b = 0; b < buffers.size(); ++b) {
        copies_[m].buffers.emplace_back(buffers[b].value(), module_buffers[b].value());
      }
      for (const auto* pairs : {&copies_[m].buffers, &copies_[m].parameters}) {
        for (const auto& [to, from] : *pairs) {
          flat_copies_ = flat_copies_ && to.dtype() == from.dtype() && to.shape() == from.shape() &&
                         to.is_contiguous() && from.is_contiguous();
          copies_[m].bytes += to.nbytes();
        }
      }
    }
  }
  // The dotted name of the first parameter or buffer of the module that is not the tensor
  // bind_copies bound (rebound, `p.value() = other`, or moved away and back with to()), or ""
  // when every one is: the replicas would read or copy the old tensors.
  std::string rebound() const {
    const std::vector<AnyTensor> now = module_tensors();
    std::size_t k = 0;
    if (now.size() == bound_.size()) {
      while (k < now.size() && now[k].storage().is_same(bound_[k].storage()) &&
             now[k].storage_offset() == bound_[k].storage_offset() &&
             now[k].shape() == bound_[k].shape()) {
        ++k;
      }
      if (k == now.size()) return {};
    }
    // Named only on the way out, in module_tensors' order.
    std::vector<std::string> names;
    for (const auto& [name, p] : module_.named_parameters()) names.push_back(name);
    for (const auto& [name, b] : module_.named_buffers()) names.push_back(name);
    return k < names.size() && now.size() == bound_.size() ? names[k]
                                                           : "(a parameter or buffer added or removed)";
  }
  // Before a forward: a module whose parameters were rebound since the replicas were bound is
  // bound again (its new tensors must be on device_ids[0]), so the replicas see the current ones.
  void rebind_if_changed() {
    if (const std::string name = rebound(); !name.empty()) {
      detail::check_module_on(module_, device(0), "DataParallel");
      bind_copies();
    }
  }
  bool has_buffers() const noexcept { return copies_.size() > 1 && !copies_[1].buffers.empty(); }
  // Before a forward: the module's buffers when it trains (BatchNorm moves them) and the
  // generators of the `used` devices, for effects_.restore() if the forward throws.
  void record_effects(int used) {
    std::vector<Device> devices;
    for (int m = 0; m < used; ++m) devices.push_back(device(m));
    std::vector<nn::BufferRef> buffers;
    if constexpr (is_module) {
      if (module_.is_training()) buffers = module_.buffers();
    }
    effects_.record(buffers, devices);
  }
  // The module's buffers into member m's replica (m > 0).
  void copy_buffers(int member) const {
    for (const auto& [to, from] : copies_[static_cast<std::size_t>(member)].buffers) {
      to.copy_(from);
    }
  }
  // The module's training modes into member m's replica (m > 0).
  void copy_training_modes(int member) {
    nn::detail::copy_training_modes(module_, replicas_[static_cast<std::size_t>(member - 1)]);
  }
  // The module's parameters and training modes into member m's replica (m > 0; on CPU the
  // parameters are aliases, and there is nothing to copy).
  void copy_parameters(int member) {
    for (const auto& [to, from] : copies_[static_cast<std::size_t>(member)].parameters) {
      to.copy_(from);
    }
    copy_training_modes(member);
  }
  // Member `member`'s part (of `used` members) in copying the module's buffers, and on CUDA its
  // parameters and training modes, into the replicas of members 1 .. used-1, all members at
  // once. On CUDA each member copies into its own replica (its stream orders the copy before its
  // work). CPU devices share the host's memory, so there the bytes of all replicas' buffers are
  // cut into `used` even spans, one per member: the copy ends in 1/used of the time one thread
  // takes. (On CPU the training modes are the caller's to copy.)
  void copy_state(int member, int used) {
    if (!std::is_same_v<Kind, cpu> || !flat_copies_) {
      if (member > 0) {
        copy_buffers(member);
        if (!std::is_same_v<Kind, cpu>) copy_parameters(member);
      }
    } else {
      std::size_t total = 0;
      for (int m = 1; m < used; ++m) total += copies_[static_cast<std::size_t>(m)].bytes;
      const auto share = [&](int i) {  // 64-byte aligned cuts
        return (total * static_cast<std::size_t>(i) / static_cast<std::size_t>(used)) / 64 * 64;
      };
      const std::size_t first = share(member);
      const std::size_t last = member + 1 == used ? total : share(member + 1);
      std::size_t offset = 0;  // of the current pair in the concatenation of all pairs
      for (int m = 1; m < used && offset < last; ++m) {
        for (const auto& [to, from] : copies_[static_cast<std::size_t>(m)].buffers) {
          const std::size_t bytes = to.nbytes();
          const std::size_t begin = std::max(first, offset);
          const std::size_t end = std::min(last, offset + bytes);
          if (begin < end) {
            std::memcpy(static_cast<char*>(to.data_ptr()) + (begin - offset),
                        static_cast<const char*>(from.data_ptr()) + (begin - offset),
                        end - begin);
          }
          offset += bytes;
        }
      }
    }
  }

  // A replica's output on its piece, as a tensor (a lazy expression is evaluated).
  template <class X>
  static auto run(M& replica, const X& x) {
    auto out = replica.forward(x);
    if constexpr (tessera::detail::is_tensor<decltype(out)>::value) {
      return out;
    } else {
      return tessera::eval(out);
    }
  }

  // The pieces' outputs concatenated along dim on output_device, each member copying its own;
  // 0-dim outputs as one value per member (see operator()).
  template <class Out>
  Out gather(const std::vector<Out>& outputs) {
    const auto is_scalar = [](const Out& out) { return out.dim() == 0; };
    if (std::all_of(outputs.begin(), outputs.end(), is_scalar)) {
      if (threads_.size() == 1) return outputs[0].to(output_device_);
      std::vector<Out> values;
      values.reserve(outputs.size());
      for (const Out& out : outputs) values.push_back(out.view({1}));
      return concatenate(values, 0);
    }
    const Out& first = outputs[0];
    for (const Out& out : outputs) {
      if (out.dim() != first.dim()) {
        throw shape_error("DataParallel: the replicas' outputs " + first.shape().str() + " and " +
                          out.shape().str() + " cannot be concatenated along dimension " +
                          std::to_string(dim_));
      }
    }
    return concatenate(outputs,
                       first.shape().normalize_dim(dim_, "DataParallel (dim of the outputs)"));
  }

  // `outputs` (all of one rank) concatenated along d on output_device, each member copying its own.
  template <class Out>
  Out concatenate(const std::vector<Out>& outputs, int d) {
    const Out& first = outputs[0];
    Shape shape = first.shape();
    shape[d] = 0;
    for (const Out& out : outputs) {
      Shape expected = first.shape();
      expected[d] = out.size(d);
      if (out.shape() != expected) {
        throw shape_error("DataParallel: the replicas' outputs " + first.shape().str() + " and " +
                          out.shape().str() + " cannot be concatenated along dimension " +
                          std::to_string(d));
      }
      shape[d] += out.size(d);
    }
    using T = typename Out::value_type;
    if (outputs.size() == 1 && first.device_index() == output_device_) return first;
    Out gathered = Tensor<T, Kind>::empty_on(shape, Device{Kind::type, output_device_});
    std::vector<std::int64_t> offsets(outputs.size(), 0);
    for (std::size_t i = 1; i < outputs.size(); ++i) {
      offsets[i] = offsets[i - 1] + outputs[i - 1].size(d);
    }
    threads_.run([&](int member) {
      const auto i = static_cast<std::size_t>(member);
      if (i < outputs.size()) gathered.narrow(d, offsets[i], outputs[i].size(d)).copy_(outputs[i]);
    });
    return gathered;
  }

  template <class, DeviceKind, class, class>
  friend class DataParallelProgram;

  M module_;
  std::vector<M> replicas_;
  DeviceThreads<Kind> threads_;
  int output_device_;
  int dim_;
  std::vector<replica_copies> copies_;  // [member]; member 0 is the module itself
  bool flat_copies_ = true;  // every pair: same dtype and shape, both contiguous (memcpy-able)
  std::vector<AnyTensor> bound_;  // the module's parameters' then buffers' values when bound
  // What a forward (eager or compiled) may change and puts back when it throws; its copies are
  // kept from call to call.
  detail::effect_rollback effects_;
};

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
      reduction_ = std::make_shared<overlapped_reduction>(static_cast<int>(used.size()),
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

    // Sums blocks of parameter p, at most `most` of them, until none is left.
    void reduce_blocks(std::size_t p,
                       std::int64_t most = std::numeric_limits<std::int64_t>::max()) {
      const std::vector<AnyTensor>& g = grads[p];
      visit_dtype(g[0].dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (is_floating_point_v<T>) {  // gradients are floating
          std::vector<const T*> sources;
          for (const AnyTensor& t : g) sources.push_back(static_cast<const T*>(t.data_ptr()));
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
  std::shared_ptr<overlapped_reduction> reduction_;   // CPU
  std::unique_ptr<Communicator<Kind>> communicator_;  // CUDA
  Result loss_;
  bool forwarded_ = false;              // a forward succeeded since the last backward
  detail::gradient_rollback gradients_;  // the module's gradients before the backward
};

}  // namespace tessera::parallel
