// The static-graph autograd: Var, compile, Program, MemoryPlan, max_batch_size (DESIGN §3.5).
#pragma once

#include "tessera/autograd/derivative.hpp"
#include "tessera/autograd/ops.hpp"
#include "tessera/autograd/parameter.hpp"
#include "tessera/autograd/program.hpp"
#include "tessera/autograd/var.hpp"
