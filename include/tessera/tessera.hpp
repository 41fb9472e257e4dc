// Everything Tessera offers, in one include. Users write `namespace ts = tessera;`.
#pragma once

#include "tessera/autograd.hpp"
#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/profiler.hpp"
#include "tessera/core/random.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/core/stream.hpp"
#include "tessera/expr.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/nn.hpp"
#include "tessera/optim.hpp"
#include "tessera/tensor.hpp"

// Compiled mode (core/config.hpp): the class templates every program instantiates for the same
// arguments are compiled once, in tessera::compiled, and only declared to its users' units. Here,
// after every header, so that each member's definition is visible to the library's explicit
// instantiation.
TESSERA_INSTANTIATE(class tessera::Tensor<float, tessera::cpu>)
TESSERA_INSTANTIATE(class tessera::Tensor<double, tessera::cpu>)
TESSERA_INSTANTIATE(class tessera::Tensor<std::int64_t, tessera::cpu>)
TESSERA_INSTANTIATE(class tessera::memory::pool_resource<
                    tessera::memory::limit_resource_adaptor<tessera::memory::host_memory_resource>,
                    tessera::memory::pytorch_size_policy, tessera::memory::host_stream_policy>)
TESSERA_INSTANTIATE(struct tessera::detail::safetensors::codec<0>)
