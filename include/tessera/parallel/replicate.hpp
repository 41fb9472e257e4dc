// replicate(module, device): a deep copy of a module on another device of its kind, as
// DataParallel makes its replicas (PyTorch's torch.nn.parallel.replicate, one device at a time).
#pragma once

#include <type_traits>

#include "tessera/core/device.hpp"
#include "tessera/nn/module.hpp"
#include "tessera/parallel/detail/module_kind.hpp"

namespace tessera::parallel {

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

}  // namespace tessera::parallel
