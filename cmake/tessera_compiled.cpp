// The one translation unit of Tessera's compiled mode (the CMake target tessera::compiled): it
// compiles, once, the machinery that the headers only declare in the units of a program linking
// that target (TESSERA_COMPILED=1): see "Header-only or compiled" in include/tessera/core/config.hpp.
// The target defines TESSERA_IMPLEMENTATION for this file alone. With CUDA, nvcc compiles it, so
// the library also holds the kernels of every primitive that g++ units evaluate CUDA expressions
// with, one operation at a time (include/tessera/expr/detail/op_by_op.hpp).
#include "tessera/tessera.hpp"
#include "tessera/tools.hpp"  // not in tessera.hpp

#if TESSERA_CUDA_KERNELS
#include "tessera/expr/detail/op_by_op.hpp"

namespace {

// Each primitive's address is stored here (volatile: the stores stay), so the compiler instantiates
// and keeps it for the units that only declare it.
const void* volatile tessera_primitive_sink = nullptr;

struct instantiate_cuda_primitives {
  template <class F>
  static void keep(F* function) {
    tessera_primitive_sink = reinterpret_cast<const void*>(function);
  }
  template <class E>
  void elementwise() {
    keep(&tessera::detail::run_cuda_primitive<typename E::value_type, E>);
  }
  template <class Op, class Finish, class Out, class V>
  void reduction() {
    keep(&tessera::detail::reduce_all_cuda_primitive<Op, Finish, Out, V>);
    keep(&tessera::detail::reduce_dim_cuda_primitive<Op, Finish, Out, V>);
  }
  template <bool Log, class F>
  void softmax() {
    keep(&tessera::detail::softmax_cuda_primitive<Log, F>);
  }
};

}  // namespace

/// Never called: its body makes the compiler emit every CUDA primitive.
void tessera_compiled_cuda_primitives() {
  instantiate_cuda_primitives visit;
  tessera::detail::op_by_op::for_each_primitive<tessera::cuda>(visit);
}
#endif
