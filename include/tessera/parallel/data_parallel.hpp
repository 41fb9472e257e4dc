// DataParallel<M>: PyTorch's nn.DataParallel over several devices of one kind, and replicate().
// The module lives on device_ids[0]; persistent replicas on the other devices are made once.
// dp(x) splits the batch along `dim` into even pieces (sizes differ by at most one; a batch
// smaller than the device count uses that many devices), copies the module's parameters and
// buffers into the replicas' existing tensors (on CPU devices, which share the host's memory,
// the replicas' parameters are aliases of the module's and only the buffers are copied), runs
// every piece at once (one host thread per device, each on its share of the cores:
// parallel::DeviceThreads) and gathers the outputs on `output_device`. dp.compile(fn,
// specs...) trains: one autograd Program per device for its replica and piece, run at once, the
// replicas' gradients summed into the module's. This header is the public one and includes the
// pieces: replicate.hpp, data_parallel_program.hpp (compile's program), detail/module_kind.hpp
// (the default Kind), detail/meeting_point.hpp and detail/overlapped_reduction.hpp (the CPU sums).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
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
#include "tessera/nn/module.hpp"
#include "tessera/nn/sequential.hpp"
#include "tessera/parallel/communicator.hpp"
#include "tessera/parallel/data_parallel_program.hpp"
#include "tessera/parallel/detail/module_kind.hpp"
#include "tessera/parallel/detail/step_rollback.hpp"
#include "tessera/parallel/device_threads.hpp"
#include "tessera/parallel/replicate.hpp"
#include "tessera/tensor/state_dict.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::parallel {

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

}  // namespace tessera::parallel
