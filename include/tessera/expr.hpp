// The expression engine in one include: lazy elementwise expressions, evaluation, reductions, matmul.
#pragma once

#include "tessera/expr/assign.hpp"
#include "tessera/expr/functors.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/expr/node.hpp"
#include "tessera/expr/operators.hpp"
#include "tessera/expr/reduce.hpp"
