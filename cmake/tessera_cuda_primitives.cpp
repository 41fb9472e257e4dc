// The second translation unit of Tessera's compiled mode with CUDA (the CMake target
// tessera::compiled, built by nvcc): the kernels of every primitive that g++ units evaluate CUDA
// expressions with, one operation at a time (include/tessera/expr/detail/op_by_op.hpp). They
// are about half of the library's build, so they are a unit of their own, which a build with two
// or more jobs compiles beside tessera_compiled.cpp (on 2 cores: 390 s of wall time in one unit
// -> about 215 s in two; bench/RESULTS.md, "compile time").
//
// This unit is compiled as a user's unit of a compiled-mode program (TESSERA_COMPILED=1, no
// TESSERA_IMPLEMENTATION): the library's own functions and instantiations are declared here and
// defined in tessera_compiled.cpp.
#include "tessera/tessera.hpp"

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
