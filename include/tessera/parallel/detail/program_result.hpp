// program_result: the tensor type an autograd::Program's forward returns, which the programs of
// DataParallel::compile and Pipeline::compile return as their loss.
#pragma once

#include "tessera/autograd/program.hpp"

namespace tessera::parallel::detail {

/// R of an autograd::Program<R>: the tensor its forward returns.
template <class P>
struct program_result;
template <class R>
struct program_result<autograd::Program<R>> {
  using type = R;
};

}  // namespace tessera::parallel::detail
