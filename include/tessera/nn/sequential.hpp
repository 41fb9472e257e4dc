// Sequential<M...>: layers applied in order (torch.nn.Sequential). Flat: the type is the list of
// the given layer types, held in a tuple, never a nested chain of templates, so deep stacks
// compile fast and read well in errors. Children are named by position: "0", "1", ... (a plain
// layer such as ReLU takes its number but registers nothing, so keys read "0.weight",
// "2.weight" exactly as in PyTorch).
#pragma once

#include <concepts>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tessera/nn/module.hpp"

namespace tessera::nn {

template <class... M>
class Sequential : public Module {
 public:
  /// Holds the given layers (handles: the Sequential shares them with the caller's copies).
  explicit Sequential(M... modules) : Module("Sequential"), modules_(std::move(modules)...) {
    register_children(std::index_sequence_for<M...>{});
  }
  Sequential(const Sequential&) = default;

  /// Each layer's forward applied to the previous one's output (the input itself when empty).
  template <class X>
  auto forward(const X& x) {
    return forward_from<0>(modules_, x);
  }
  template <class X>
  auto forward(const X& x) const {
    return forward_from<0>(modules_, x);
  }
  template <class X>
  auto operator()(const X& x) {
    return forward(x);
  }
  template <class X>
  auto operator()(const X& x) const {
    return forward(x);
  }

  /// Layer I (PyTorch's `seq[I]`), as its own type.
  template <std::size_t I>
  auto& get() noexcept {
    return std::get<I>(modules_);
  }
  template <std::size_t I>
  const auto& get() const noexcept {
    return std::get<I>(modules_);
  }
  static constexpr std::size_t size() noexcept { return sizeof...(M); }

  using Module::to;
  /// Every layer on ordinal `index` of kind K2 (see ts::nn::to): this Sequential when it is
  /// already there, otherwise new layers holding copies.
  template <DeviceKind K2>
  Sequential<rebind_kind_t<M, K2>...> to(int index = -1) const {
    return nn::to<K2>(*this, index);
  }
  /// An independent copy on `device` (of kind K2): each layer copied, modes kept.
  template <DeviceKind K2>
  Sequential<rebind_kind_t<M, K2>...> copy_to(Device device) const {
    auto out = std::apply(
        [&](const auto&... layers) {
          return Sequential<rebind_kind_t<M, K2>...>(detail::copy_to<K2>(layers, device)...);
        },
        modules_);
    detail::copy_training_modes(*this, out);
    return out;
  }
  /// Every layer in dtype U (see ts::nn::to<Dtype>; BatchNorm keeps float): new layers holding
  /// converted copies, modes kept.
  template <Dtype U>
  Sequential<rebind_dtype_t<M, U>...> to() const {
    return nn::to<U>(*this);
  }
  template <Dtype U>
  Sequential<rebind_dtype_t<M, U>...> copy_as() const {
    auto out = std::apply(
        [&](const auto&... layers) {
          return Sequential<rebind_dtype_t<M, U>...>(nn::to<U>(layers)...);
        },
        modules_);
    detail::copy_training_modes(*this, out);
    return out;
  }

 private:
  template <std::size_t... I>
  void register_children(std::index_sequence<I...>) {
    (register_child(std::to_string(I), std::get<I>(modules_)), ...);
  }
  template <class L>
  void register_child(const std::string& name, L& layer) {
    if constexpr (std::derived_from<L, Module>) register_module(name, layer);
  }

  template <std::size_t I, class Tuple, class X>
  static auto forward_from(Tuple& layers, const X& x) {
    if constexpr (I == std::tuple_size_v<std::remove_const_t<Tuple>>) {
      return x;
    } else {
      return forward_from<I + 1>(layers, std::get<I>(layers).forward(x));
    }
  }

  std::tuple<M...> modules_;
};

template <class... M>
Sequential(M...) -> Sequential<M...>;

/// Sequential<M...> on kind K2 is the Sequential of its layers on K2.
template <class... M, class K2>
struct rebind_kind<Sequential<M...>, K2> {
  using type = Sequential<rebind_kind_t<M, K2>...>;
};
/// ... and in dtype U, the Sequential of its layers in U.
template <class... M, class U>
struct rebind_dtype<Sequential<M...>, U> {
  using type = Sequential<rebind_dtype_t<M, U>...>;
};

}  // namespace tessera::nn
