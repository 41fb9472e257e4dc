// Tensor<T, Kind>: a cheap handle (shared storage + shape, strides and offset) whose dtype T and
// device kind are types and whose ordinal is a value. Views share storage; `to`, `cuda`, `cpu`
// and `to<U>()` copy unless nothing would change, as in PyTorch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/memory_format.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/tensor/detail/copy.hpp"
#include "tessera/tensor/storage.hpp"

namespace tessera {

template <Dtype T, DeviceKind Kind = cpu>
class Tensor;

namespace detail {
template <class X>
struct is_tensor : std::false_type {};
template <class T, class K>
struct is_tensor<Tensor<T, K>> : std::true_type {};

/// PyTorch's view stride computation: strides for `shape` over the same elements as
/// (old_shape, old_strides), or nothing when no such strides exist without a copy.
TESSERA_API std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides,
                                                const Shape& shape);

/// Throws shape_error unless `count` values fill `shape` exactly. Called before anything is
/// allocated, so a bad call changes no statistic.
inline void check_value_count(std::size_t count, const Shape& shape, const char* operation) {
  shape.check_size(operation);
  if (static_cast<std::int64_t>(count) != shape.numel()) {
    throw shape_error(std::string(operation) + ": " + std::to_string(count) +
                      " values do not fill shape " + shape.str() + " (" +
                      std::to_string(shape.numel()) + " elements)");
  }
}

/// Throws tessera::error naming the operation when writing through a view of `shape` and
/// `strides` would store several elements into one memory location (an expanded view: stride 0
/// over an extent above 1), as PyTorch refuses; nothing has been written then.
TESSERA_API void check_not_expanded(const Shape& shape, const Strides& strides,
                                    const char* operation);

/// A lazy expression node (expr/node.hpp) over tensors, as opposed to a tensor or a number.
/// Declared here so Tensor can be constructed from and assigned an expression; expr/assign.hpp
/// defines how. Symbolic expressions (over autograd Vars) are not: they are traced, not run.
template <class E>
concept expression_node = requires {
  typename E::expression_node_tag;
}
&&!E::is_scalar && !E::is_symbolic;

[[noreturn]] inline void throw_undefined(const char* operation) {
  throw error(std::string(operation) + ": the tensor is undefined (default-constructed)");
}
#if TESSERA_DEFINITIONS
TESSERA_API std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides,
                                                const Shape& shape) {
  Strides strides = Shape::filled(shape.size(), 0);
  if (old_shape.numel() == 0 || old_shape.size() == 0) {
    if (old_shape == shape) return old_strides;
    return shape.contiguous_strides();
  }
  int view_d = shape.size() - 1;
  std::int64_t chunk_base_stride = old_strides.back();
  std::int64_t tensor_numel = 1;
  std::int64_t view_numel = 1;
  for (int tensor_d = old_shape.size() - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    // A chunk ends where the next outer dimension is not laid out right after this one.
    if (tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                          old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

TESSERA_API void check_not_expanded(const Shape& shape, const Strides& strides,
                                    const char* operation) {
  if (shape.numel() == 0) return;
  for (int d = 0; d < shape.size(); ++d) {
    if (strides[d] == 0 && shape[d] > 1) {
      throw error(std::string(operation) + ": the output of shape " + shape.str() +
                  " is an expanded view (stride 0 in dimension " + std::to_string(d) +
                  "), so several of its elements share one memory location; clone() it first");
    }
  }
}
#endif  // TESSERA_DEFINITIONS

}  // namespace detail

/// A tensor of dtype T on a device of kind Kind. A default-constructed Tensor is undefined.
template <Dtype T, DeviceKind Kind>
class Tensor {
 public:
  using value_type = T;
  using device_kind = Kind;

  /// An undefined tensor (no storage); `defined()` is false.
  Tensor() = default;

  /// A view of `storage` (not checked against its size: views are made by Tessera's own code).
  Tensor(Storage storage, Shape shape, Strides strides, std::int64_t storage_offset)
      : storage_(std::move(storage)),
        shape_(shape),
        strides_(strides),
        offset_(storage_offset) {}

  /// Evaluates a lazy expression (`Tensor<float> y = a * 2 + b;`) into a new tensor on the
  /// expression's device, in one pass; values are converted to T. Defined in expr/assign.hpp.
  template <detail::expression_node E>
  Tensor(const E& expression);  // NOLINT: implicit, so `Tensor<float> y = a + b;` reads naturally

  /// Evaluates a lazy expression into this tensor's storage when the shapes match (one pass;
  /// views of this storage see the result), otherwise rebinds this handle to a new tensor.
  /// Defined in expr/assign.hpp.
  template <detail::expression_node E>
  Tensor& operator=(const E& expression) &;

  /// Assignment to a temporary view writes through, as `y[:, 0:1] = e` does in PyTorch:
  /// `y.narrow(1, 0, 1) = e;` evaluates e into the view's elements, e broadcasting to the view's
  /// shape (shape_error naming both shapes otherwise, before anything is written); e may read
  /// the view's own storage (it is then evaluated aside first). Defined in expr/assign.hpp.
  template <detail::expression_node E>
  Tensor&& operator=(const E& expression) &&;

  Tensor(const Tensor&) = default;
  Tensor(Tensor&&) noexcept = default;
  /// A named tensor is a handle: `y = x;` makes y another handle to x's storage (nothing is
  /// copied), as `y = x` in Python.
  Tensor& operator=(const Tensor&) & = default;
  Tensor& operator=(Tensor&&) & noexcept = default;

  /// A temporary view is written through: `y.narrow(1, 0, 1) = x;` is
  /// `y.narrow(1, 0, 1).copy_(x)` (x broadcasts; any dtype and device), as in PyTorch.
  Tensor&& operator=(const Tensor& source) && {
    copy_(source);
    return std::move(*this);
  }
  template <Dtype U, DeviceKind K2>
  Tensor&& operator=(const Tensor<U, K2>& source) && {
    copy_(source);
    return std::move(*this);
  }
  /// `y.select(1, 0) = 0.5;` fills the view (the number converted to T), as fill_.
  template <class S>
    requires std::is_arithmetic_v<S> || std::is_same_v<S, half> || std::is_same_v<S, bfloat16>
  Tensor&& operator=(S value) && {
    fill_(value);
    return std::move(*this);
  }

  /// An uninitialised contiguous tensor on `device` (must be of kind Kind).
  static Tensor empty_on(const Shape& shape, Device device) {
    return make_on(shape, device, false);
  }
  /// An uninitialised dense tensor on `device` laid out in `format` (contiguous_format or
  /// channels_last). Throws shape_error for channels_last on a shape that is not 4-d, and
  /// tessera::error for preserve_format (which needs a source: see clone), before allocating.
  static Tensor empty_on(const Shape& shape, Device device, memory_format format) {
    return make_on(shape, device, false, format);
  }
  /// The same in pinned (page-locked) host memory (see pin_memory); throws device_error without
  /// CUDA support or a CUDA device.
  static Tensor empty_pinned_on(const Shape& shape, Device device)
    requires std::is_same_v<Kind, tessera::cpu>
  {
    return make_on(shape, device, true);
  }

  // ---- queries ---------------------------------------------------------------------------

  bool defined() const noexcept { return storage_.defined(); }
  const Shape& shape() const noexcept { return shape_; }
  /// Extent of dimension `dim` (negative counts from the end).
  std::int64_t size(std::int64_t dim) const { return shape_[shape_.normalize_dim(dim, "size")]; }
  int dim() const noexcept { return shape_.size(); }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  const Strides& strides() const noexcept { return strides_; }
  std::int64_t stride(std::int64_t dim) const {
    return strides_[shape_.normalize_dim(dim, "stride")];
  }
  bool is_contiguous() const noexcept { return backend::cpu::is_row_major(shape_, strides_); }
  /// True when the elements lie densely in `format`'s order (PyTorch's is_contiguous(
  /// memory_format)): extent-1 dimensions' strides do not matter, and channels_last is false for
  /// a tensor that is not 4-d. A 4-d tensor with C = 1 (or H = W = 1) can be both. Throws
  /// tessera::error for preserve_format, as PyTorch does.
  bool is_contiguous(memory_format format) const {
    switch (format) {
      case memory_format::contiguous_format:
        return is_contiguous();
      case memory_format::channels_last:
        return detail::is_channels_last_contiguous(shape_, strides_);
      case memory_format::preserve_format:
        break;
    }
    throw error("is_contiguous: memory_format preserve_format is not a layout to test for");
  }
  /// channels_last when the strides order this 4-d tensor's dimensions as channels_last does
  /// (dense or not), contiguous_format otherwise (PyTorch's suggest_memory_format; ambiguous
  /// layouts, such as [N, 1, 1, 1], count as contiguous_format).
  memory_format suggest_memory_format() const noexcept {
    return detail::is_channels_last_like(shape_, strides_) ? memory_format::channels_last
                                                           : memory_format::contiguous_format;
  }
  Device device() const noexcept { return Device{Kind::type, storage_.device().index}; }
  int device_index() const noexcept { return storage_.device().index; }
  static constexpr bool is_cuda() noexcept { return Kind::type == DeviceType::cuda; }
  static constexpr ScalarType dtype() noexcept { return scalar_type_of<T>; }
  static constexpr std::size_t element_size() noexcept { return sizeof(T); }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel()) * sizeof(T); }
  /// Pointer to the first element (device memory for CUDA tensors).
  T* data() const noexcept { return static_cast<T*>(storage_.data()) + offset_; }
  const Storage& storage() const noexcept { return storage_; }
  std::int64_t storage_offset() const noexcept { return offset_; }
  /// Marks this tensor's memory as used by work queued on `stream` (PyTorch's record_stream):
  /// when the last handle to its storage goes, the pool hands the block out again only after the
  /// work queued on `stream` until then is done. `stream` must be on this tensor's device
  /// (device_mismatch_error naming both). On CPU, whose work is synchronous, nothing waits.
  /// Memory another library owns (Storage::from_blob, ts::from_dlpack) is not the pool's: as in
  /// PyTorch, nothing is recorded, and the caller finishes the work before the last handle goes.
  void record_stream(const Stream& stream) const {
    require_defined("record_stream");
    if (stream.device() != device()) {
      throw device_mismatch_error("record_stream: the tensor is on " + device().str() +
                                  ", the stream on " + stream.device().str());
    }
    if (storage_.data() != nullptr && !storage_.is_external()) {
      memory::record_stream(device(), storage_.data(), stream.ref());
    }
  }
  /// True when the tensor's storage is pinned (page-locked) host memory, from pin_memory or a
  /// DataLoader with pin_memory; false for every other tensor, and everywhere without CUDA.
  bool is_pinned() const noexcept { return storage_.is_pinned(); }
  /// True when both tensors view the same storage (PyTorch: `a.untyped_storage() is ...`).
  template <class U, class K2>
  bool shares_storage_with(const Tensor<U, K2>& other) const noexcept {
    return storage_.is_same(other.storage());
  }

  // ---- views (share storage, allocate nothing) ---------------------------------------------

  /// Same elements with another shape; `-1` is inferred. Throws shape_error when the element
  /// count differs or the strides do not allow it without a copy (use reshape).
  Tensor view(const Shape& shape) const {
    require_defined("view");
    Shape target = shape.infer(numel(), "view");
    auto strides = detail::view_strides(shape_, strides_, target);
    if (!strides) {
      throw shape_error("view: shape " + target.str() + " is not compatible with a tensor of shape " +
                        shape_.str() + " and strides " + strides_.str() +
                        " (at least one dimension spans two contiguous subspaces); use reshape()");
    }
    return Tensor(storage_, target, *strides, offset_);
  }

  /// view() when possible, otherwise a contiguous copy with the new shape.
  Tensor reshape(const Shape& shape) const {
    require_defined("reshape");
    Shape target = shape.infer(numel(), "reshape");
    if (auto strides = detail::view_strides(shape_, strides_, target)) {
      return Tensor(storage_, target, *strides, offset_);
    }
    return clone(memory_format::contiguous_format).view(target);
  }

  /// Swaps dimensions a and b.
  Tensor transpose(std::int64_t a, std::int64_t b) const {
    require_defined("transpose");
    if (dim() == 0) {  // as PyTorch: dimensions -1 and 0 of a 0-dim tensor are itself
      Shape::normalize_dim(a, 1, "transpose");
      Shape::normalize_dim(b, 1, "transpose");
      return *this;
    }
    int da = shape_.normalize_dim(a, "transpose");
    int db = shape_.normalize_dim(b, "transpose");
    Tensor out = *this;
    std::swap(out.shape_[da], out.shape_[db]);
    std::swap(out.strides_[da], out.strides_[db]);
    return out;
  }

  /// Transpose of a tensor of at most 2 dimensions.
  Tensor t() const {
    if (dim() > 2) {
      throw shape_error("t: expects a tensor of at most 2 dimensions, got shape " + shape_.str());
    }
    return dim() < 2 ? *this : transpose(0, 1);
  }

  /// Reorders the dimensions: output dimension i is input dimension dims[i].
  Tensor permute(const Shape& dims) const {
    require_defined("permute");
    if (dims.size() != dim()) {
      throw shape_error("permute: " + dims.str() + " names " + std::to_string(dims.size()) +
                        " dimensions for a tensor of shape " + shape_.str());
    }
    Tensor out = *this;
    bool seen[max_dims] = {};
    for (int i = 0; i < dims.size(); ++i) {
      int d = shape_.normalize_dim(dims[i], "permute");
      if (seen[d]) {
        throw shape_error("permute: dimension " + std::to_string(d) + " repeated in " +
                          dims.str());
      }
      seen[d] = true;
      out.shape_[i] = shape_[d];
      out.strides_[i] = strides_[d];
    }
    return out;
  }

  /// Elements [start, start + length) of dimension `dim` (negative start counts from the end).
  Tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const {
    require_defined("narrow");
    int d = shape_.normalize_dim(dim, "narrow");
    std::int64_t extent = shape_[d];
    // PyTorch wraps a negative start as a dimension index: an extent of 0 counts as 1 there.
    std::int64_t first = start < 0 ? start + std::max<std::int64_t>(extent, 1) : start;
    if (first < 0 || first > extent || length < 0 || length > extent - first) {
      throw shape_error("narrow: start " + std::to_string(start) + " and length " +
                        std::to_string(length) + " are out of range for dimension " +
                        std::to_string(d) + " of size " + std::to_string(extent) + " (shape " +
                        shape_.str() + ")");
    }
    Tensor out = *this;
    out.shape_[d] = length;
    out.offset_ += first * strides_[d];
    return out;
  }

  /// Pieces of `split_size` along `dim` (the last may be smaller).
  std::vector<Tensor> split(std::int64_t split_size, std::int64_t dim = 0) const {
    require_defined("split");
    int d = shape_.normalize_dim(dim, "split");
    if (split_size <= 0 && shape_[d] != 0) {
      throw shape_error("split: split_size must be positive, got " + std::to_string(split_size));
    }
    std::vector<Tensor> pieces;
    if (shape_[d] == 0) {
      pieces.push_back(*this);
      return pieces;
    }
    for (std::int64_t start = 0; start < shape_[d]; start += split_size) {
      pieces.push_back(narrow(d, start, std::min(split_size, shape_[d] - start)));
    }
    return pieces;
  }

  /// At most `chunks` pieces of equal size along `dim` (PyTorch's rule: size ceil(n / chunks),
  /// so fewer pieces may come back).
  std::vector<Tensor> chunk(std::int64_t chunks, std::int64_t dim = 0) const {
    require_defined("chunk");
    if (chunks <= 0) {
      throw shape_error("chunk: number of chunks must be positive, got " + std::to_string(chunks));
    }
    int d = shape_.normalize_dim(dim, "chunk");
    std::int64_t size = (shape_[d] + chunks - 1) / chunks;
    return split(std::max<std::int64_t>(size, 1), d);
  }

  /// Inserts a dimension of extent 1 at `dim` (in [-dim()-1, dim()]).
  Tensor unsqueeze(std::int64_t dim) const {
    require_defined("unsqueeze");
    int d = Shape::normalize_dim(dim, this->dim() + 1, "unsqueeze");
    Tensor out = *this;
    std::int64_t stride = d < this->dim() ? shape_[d] * strides_[d] : 1;
    out.shape_.insert(d, 1);
    out.strides_.insert(d, stride);
    return out;
  }

  /// Removes dimension `dim` if its extent is 1 (PyTorch leaves other extents alone).
  Tensor squeeze(std::int64_t dim) const {
    require_defined("squeeze");
    if (this->dim() == 0) {  // as PyTorch: dimension -1 or 0 of a 0-dim tensor is itself
      Shape::normalize_dim(dim, 1, "squeeze");
      return *this;
    }
    int d = shape_.normalize_dim(dim, "squeeze");
    if (shape_[d] != 1) return *this;
    Tensor out = *this;
    out.shape_.erase(d);
    out.strides_.erase(d);
    return out;
  }

  /// The dimensions start..end merged into one (a view when possible).
  Tensor flatten(std::int64_t start = 0, std::int64_t end = -1) const {
    require_defined("flatten");
    if (dim() == 0) {  // as PyTorch: a 0-dim tensor has dimensions -1 and 0 here
      Shape::normalize_dim(start, 1, "flatten");
      Shape::normalize_dim(end, 1, "flatten");
      return reshape({1});
    }
    int s = shape_.normalize_dim(start, "flatten");
    int e = shape_.normalize_dim(end, "flatten");
    if (s > e) {
      throw shape_error("flatten: start dimension " + std::to_string(s) +
                        " comes after end dimension " + std::to_string(e));
    }
    Shape target;
    for (int i = 0; i < s; ++i) target.push_back(shape_[i]);
    std::int64_t merged = 1;
    for (int i = s; i <= e; ++i) merged *= shape_[i];
    target.push_back(merged);
    for (int i = e + 1; i < dim(); ++i) target.push_back(shape_[i]);
    return reshape(target);
  }

  /// A broadcast view with shape `shape` (-1 keeps an extent); no copy, stride 0 where expanded.
  Tensor expand(const Shape& shape) const {
    require_defined("expand");
    Shape target = shape;
    for (int i = 0; i < target.size(); ++i) {
      int j = dim() - target.size() + i;
      if (target[i] == -1) {
        if (j < 0) {
          throw shape_error("expand: -1 is not allowed for the new leading dimension " +
                            std::to_string(i) + " in " + shape.str());
        }
        target[i] = shape_[j];
      }
    }
    target.check_size("expand");
    Tensor out = *this;
    out.strides_ = expand_strides(shape_, strides_, target, "expand");
    out.shape_ = target;
    return out;
  }

  /// The slice at `index` of dimension `dim`, with that dimension removed.
  Tensor select(std::int64_t dim, std::int64_t index) const {
    int d = shape_.normalize_dim(dim, "select");
    std::int64_t i = index < 0 ? index + shape_[d] : index;
    if (i < 0 || i >= shape_[d]) {
      throw shape_error("select: index " + std::to_string(index) +
                        " is out of range for dimension " + std::to_string(d) + " of size " +
                        std::to_string(shape_[d]));
    }
    return narrow(d, i, 1).squeeze(d);
  }
  /// select(0, index).
  Tensor operator[](std::int64_t index) const { return select(0, index); }

  /// This tensor when contiguous, otherwise a contiguous copy.
  Tensor contiguous() const {
    require_defined("contiguous");
    return is_contiguous() ? *this : clone(memory_format::contiguous_format);
  }

  /// This tensor when its elements lie densely in `format` already (is_contiguous(format)),
  /// otherwise a copy in that layout (`x.contiguous(ts::memory_format::channels_last)`). Throws
  /// shape_error naming the shape for channels_last on a tensor that is not 4-d, and
  /// tessera::error for preserve_format, as PyTorch does; nothing is allocated then.
  Tensor contiguous(memory_format format) const {
    require_defined("contiguous");
    if (format == memory_format::preserve_format) {
      throw error("contiguous: memory_format preserve_format is not supported (use clone)");
    }
    if (format == memory_format::channels_last && dim() != 4) {
      (void)detail::strides_for(shape_, format, "contiguous");  // throws, naming the shape
    }
    return is_contiguous(format) ? *this : clone(format);
  }

  /// A dense copy on the same device in `format`. The default, preserve_format, keeps a
  /// channels_last-like tensor channels_last (suggest_memory_format) and makes every other copy
  /// contiguous; PyTorch would also keep the strides of other dense permutations, such as a
  /// transposed matrix, which Tessera's copies make contiguous. Throws shape_error for
  /// channels_last on a tensor that is not 4-d.
  Tensor clone(memory_format format = memory_format::preserve_format) const {
    require_defined("clone");
    Tensor out = empty_on(shape_, device(), detail::resolve_format(format, shape_, strides_));
    out.copy_from(*this);
    return out;
  }

  // ---- conversions (copies) ---------------------------------------------------------------

  /// A contiguous copy of this CPU tensor in pinned (page-locked) host memory, from a pool shared
  /// by the process (memory::pinned_stats); this tensor itself when it is pinned already (as
  /// PyTorch). Copies from a pinned tensor to a CUDA tensor (`to`, `copy_`) do not wait: they are
  /// queued on the device's current stream and the host goes on, as PyTorch's non_blocking copies
  /// from pinned memory, so the host must not write the pinned tensor until it has synchronised
  /// with that stream (its memory itself is not reused before the copy is done, even if the
  /// tensor is freed). Throws device_error ("Cannot access accelerator device when none is
  /// available") without CUDA support or a CUDA device, leaving this tensor as it was.
  Tensor pin_memory() const
    requires std::is_same_v<Kind, tessera::cpu>
  {
    require_defined("pin_memory");
    if (is_pinned()) return *this;
    Tensor out = empty_pinned_on(shape_, device());
    out.copy_from(*this);
    return out;
  }

  /// This tensor on ordinal `index` of kind K2 (-1: K2's current device). Returns a handle to the
  /// same storage when that is where it already is; a copy keeps a channels_last tensor
  /// channels_last (preserve_format, as clone). From a pinned tensor to CUDA, the copy does
  /// not wait (see pin_memory); every other copy between host and device does.
  template <DeviceKind K2>
  Tensor<T, K2> to(int index = -1) const {
    require_defined("to");
    Device target = resolve_device<K2>(index);
    if constexpr (std::is_same_v<K2, Kind>) {
      if (target == device()) return *this;
    }
    auto out = Tensor<T, K2>::empty_on(shape_, target, suggest_memory_format());
    out.copy_(*this);
    return out;
  }

  /// This tensor on ordinal `index` of the same kind.
  Tensor to(int index) const { return to<Kind>(index); }

  /// This tensor converted to dtype U (a handle to the same storage when U is T); the copy
  /// keeps a channels_last tensor channels_last (preserve_format, as clone).
  template <Dtype U>
  Tensor<U, Kind> to() const {
    require_defined("to");
    if constexpr (std::is_same_v<U, T>) {
      return *this;
    } else {
      auto out = Tensor<U, Kind>::empty_on(shape_, device(), suggest_memory_format());
      out.copy_(*this);
      return out;
    }
  }

  /// This tensor on CUDA device `index` (-1: the current CUDA device).
  Tensor<T, tessera::cuda> cuda(int index = -1) const { return to<tessera::cuda>(index); }
  /// This tensor on CPU device `index`.
  Tensor<T, tessera::cpu> cpu(int index = 0) const { return to<tessera::cpu>(index); }

  // ---- tensors beside this one ----------------------------------------------------------

  Tensor new_empty(const Shape& shape) const { return empty_on(shape, device_for_new()); }
  Tensor new_zeros(const Shape& shape) const { return new_full(shape, T(0)); }
  Tensor new_ones(const Shape& shape) const { return new_full(shape, T(1)); }
  Tensor new_full(const Shape& shape, T value) const {
    Tensor out = new_empty(shape);
    out.fill_(value);
    return out;
  }
  /// A tensor with this dtype and device holding `values` in row-major order.
  Tensor new_tensor(const std::vector<T>& values, const Shape& shape) const {
    detail::check_value_count(values.size(), shape, "new_tensor");
    Tensor out = new_empty(shape);
    out.assign_from_host(values);
    return out;
  }

  // ---- host access -----------------------------------------------------------------------

  /// The single element of a one-element tensor, copied to the host (synchronises).
  T item() const {
    require_defined("item");
    if (numel() != 1) {
      throw shape_error("item: a tensor with " + std::to_string(numel()) +
                        " elements (shape " + shape_.str() + ") cannot be converted to a scalar");
    }
    T value{};
    detail::copy_strided(detail::strided_ref<T>{&value, Device{}, Shape::filled(dim(), 0)},
                         detail::strided_ref<const T>{data(), device(), strides_}, shape_);
    return value;
  }

  /// The elements in row-major order, copied to the host (synchronises).
  std::vector<T> to_vector() const {
    require_defined("to_vector");
    const auto n = static_cast<std::size_t>(numel());
    if constexpr (std::is_same_v<T, bool>) {
      auto host = std::make_unique<bool[]>(n);  // std::vector<bool> has no contiguous storage
      copy_to_host(host.get());
      return std::vector<bool>(host.get(), host.get() + n);
    } else {
      std::vector<T> host(n);
      copy_to_host(host.data());
      return host;
    }
  }

  /// Copies the numel() elements, in row-major order, into host memory at `host` (synchronises).
  void copy_to_host(T* host) const {
    require_defined("copy_to_host");
    detail::copy_strided(detail::strided_ref<T>{host, Device{}, shape_.contiguous_strides()},
                         detail::strided_ref<const T>{data(), device(), strides_}, shape_);
  }

  /// Overwrites the elements with numel() values read in row-major order from host memory.
  Tensor& copy_from_host(const T* host) {
    require_defined("copy_from_host");
    detail::copy_strided(detail::strided_ref<T>{data(), device(), strides_},
                         detail::strided_ref<const T>{host, Device{}, shape_.contiguous_strides()},
                         shape_);
    return *this;
  }

  // ---- in place --------------------------------------------------------------------------

  /// Sets every element to `value`.
  Tensor& fill_(T value) {
    require_defined("fill_");
    detail::fill_strided(detail::strided_ref<T>{data(), device(), strides_}, shape_, value);
    return *this;
  }
  /// Sets every element to the number `value` converted to T. Throws tessera::error naming the
  /// value and the dtype, before writing, when it does not fit T (NaN or 1e10 into int32, 300 into
  /// uint8, 1e300 into float), as PyTorch's fill_.
  template <class S>
    requires(!std::is_same_v<S, T>) &&
            (std::is_arithmetic_v<S> || std::is_same_v<S, half> || std::is_same_v<S, bfloat16>)
  Tensor& fill_(S value) {
    return fill_(checked_scalar<T>(value, "fill_"));
  }
  Tensor& zero_() { return fill_(T(0)); }

  /// Copies `src` into this tensor, converting its dtype and crossing devices as needed; `src`
  /// broadcasts to this shape. Throws shape_error (both shapes) before writing anything. A copy
  /// from a pinned CPU tensor into a contiguous CUDA tensor of the same dtype and shape does not
  /// wait (see pin_memory); any other copy between host and device returns once it is done.
  template <Dtype U, DeviceKind K2>
  Tensor& copy_(const Tensor<U, K2>& src) {
    require_defined("copy_");
    src.require_defined("copy_ (source)");
    detail::check_not_expanded(shape_, strides_, "copy_");
    copy_from(src);
    return *this;
  }

  template <Dtype, DeviceKind>
  friend class Tensor;

 private:
  void require_defined(const char* operation) const {
    if (!defined()) detail::throw_undefined(operation);
  }

  // empty_on and empty_pinned_on: the checks, then the storage from the device's pool or pinned.
  // The strides come after the size check: a shape too large for memory would overflow them.
  static Tensor make_on(const Shape& shape, Device device, bool pinned,
                        memory_format format = memory_format::contiguous_format) {
    shape.check_size("empty", sizeof(T));
    if (device.type != Kind::type) {
      throw device_mismatch_error("empty: device " + device.str() + " is not a " +
                                  std::string(Kind::name) + " device");
    }
    check_device(device);
    const Strides strides = detail::strides_for(shape, format, "empty");
    const auto bytes = static_cast<std::size_t>(shape.numel()) * sizeof(T);
    return Tensor(
        pinned ? Storage::allocate_pinned(device, bytes) : Storage::allocate(device, bytes), shape,
        strides, 0);
  }

  // New tensors go where this one is; an undefined tensor has no device, so use the current one.
  Device device_for_new() const { return defined() ? device() : resolve_device<Kind>(-1); }

  template <class U, class K2>
  void copy_from(const Tensor<U, K2>& src) {
    Strides src_strides = expand_strides(src.shape(), src.strides(), shape_, "copy_");
    if (storage_.is_same(src.storage()) && overlaps(src)) {
      // Reading and writing one buffer: go through a copy of the source, as PyTorch requires.
      auto staged = src.clone();
      copy_from(staged);
      return;
    }
#if TESSERA_CUDA
    if constexpr (std::is_same_v<Kind, tessera::cuda> && std::is_same_v<K2, tessera::cpu> &&
                  std::is_same_v<U, T>) {
      // Straight from pinned memory into this tensor's: queued, not waited for. A copy that
      // needs scratch memory (strides, dtype) waits, so that no scratch is freed under it.
      if (src.is_pinned() && is_contiguous() && backend::cpu::is_row_major(shape_, src_strides)) {
        detail::copy_from_pinned(data(), device(), src.data(), src.storage().data(), nbytes());
        return;
      }
    }
#endif
    detail::copy_strided(detail::strided_ref<T>{data(), device(), strides_},
                         detail::strided_ref<const U>{src.data(), src.device(), src_strides},
                         shape_);
  }

  template <class U, class K2>
  bool overlaps(const Tensor<U, K2>& other) const {
    if (numel() == 0 || other.numel() == 0) return false;
    auto mine = detail::span_of(shape_, strides_);
    auto theirs = detail::span_of(other.shape(), other.strides());
    std::int64_t a0 = (offset_ + mine.first) * static_cast<std::int64_t>(sizeof(T));
    std::int64_t a1 = (offset_ + mine.last) * static_cast<std::int64_t>(sizeof(T));
    std::int64_t b0 = (other.storage_offset() + theirs.first) * static_cast<std::int64_t>(sizeof(U));
    std::int64_t b1 = (other.storage_offset() + theirs.last) * static_cast<std::int64_t>(sizeof(U));
    return a0 < b1 && b0 < a1;
  }

  void assign_from_host(const std::vector<T>& values) {
    if constexpr (std::is_same_v<T, bool>) {
      auto host = std::make_unique<bool[]>(values.size());
      std::copy(values.begin(), values.end(), host.get());
      copy_from_host(host.get());
    } else {
      copy_from_host(values.data());
    }
  }

  Storage storage_;
  Shape shape_;
  Strides strides_;
  std::int64_t offset_ = 0;
};

}  // namespace tessera
