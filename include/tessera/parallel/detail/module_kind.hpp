// The device kind of a module type (module_kind_t), which DataParallel, replicate and Pipeline
// take as their default, and the check that a module's tensors all live on one device.
#pragma once

#include <string>
#include <type_traits>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/nn/module.hpp"
#include "tessera/nn/sequential.hpp"
#include "tessera/tensor/state_dict.hpp"

namespace tessera::parallel::detail {

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

}  // namespace tessera::parallel::detail
