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
