// The CUDA resources' device scope: core's (tessera::detail::cuda_device_scope), named here too.
#pragma once

#include "tessera/core/detail/cuda_device_scope.hpp"

#if TESSERA_CUDA
namespace tessera::memory::detail {
using tessera::detail::cuda_device_scope;
}  // namespace tessera::memory::detail
#endif
