// Configuration macros shared by every Tessera header.
// TESSERA_CUDA is 1 when the CUDA runtime is available to this translation unit (CMake's
// TESSERA_WITH_CUDA links cudart and defines it); TESSERA_CUDA_KERNELS is 1 only when the unit is
// compiled by nvcc, so kernels can be launched from it.
#pragma once

#ifndef TESSERA_CUDA
#if defined(__CUDACC__)
#define TESSERA_CUDA 1
#else
#define TESSERA_CUDA 0
#endif
#endif

#if defined(__CUDACC__)
#define TESSERA_CUDA_KERNELS 1
#define TESSERA_HOST_DEVICE __host__ __device__
#define TESSERA_DEVICE __device__
#else
#define TESSERA_CUDA_KERNELS 0
#define TESSERA_HOST_DEVICE
#define TESSERA_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define TESSERA_DEVICE_CODE 1
#else
#define TESSERA_DEVICE_CODE 0
#endif

#if TESSERA_CUDA
#include <cuda_runtime_api.h>
#endif

// Header-only (the default) or compiled mode. Header-only: every definition is in the headers and
// `inline`, so each translation unit compiles the machinery it uses. Compiled mode: a program
// links the `tessera::compiled` CMake target (which defines TESSERA_COMPILED=1 for its users and
// compiles one translation unit with TESSERA_IMPLEMENTATION), and the headers then declare, but do
// not define, the machinery that does not depend on a user's types (the autograd planner, module
// and optimiser bookkeeping, checkpoints, memory summaries...): it is compiled once, in that
// library, instead of in every unit. Both modes give the same program.
//   TESSERA_API          on such a function: `inline` header-only, nothing in compiled mode;
//   TESSERA_DEFINITIONS  1 where its definition is to be compiled (header-only, or the library);
//   TESSERA_INSTANTIATE(declaration)   an explicit instantiation in the library, `extern` in its
//                        users, nothing header-only (templates instantiated for fixed types).
// A TESSERA_API virtual destructor defined below its class gets an empty body, never
// `= default`: nvcc's front end writes the in-class declaration of a destructor defaulted out of
// line without its `inline`, so the destructor becomes the class's key function and every
// header-only nvcc unit emits the vtable and compiles every virtual function (Adam's and AdamW's
// updates for every dtype: 361 of the 377 KB of host code an empty nvcc unit compiled).
#if defined(TESSERA_IMPLEMENTATION)
#define TESSERA_API
#define TESSERA_DEFINITIONS 1
#define TESSERA_INSTANTIATE(...) template __VA_ARGS__;
#elif defined(TESSERA_COMPILED) && TESSERA_COMPILED
#define TESSERA_API
#define TESSERA_DEFINITIONS 0
#define TESSERA_INSTANTIATE(...) extern template __VA_ARGS__;
#else
#define TESSERA_API inline
#define TESSERA_DEFINITIONS 1
#define TESSERA_INSTANTIATE(...)
#endif

// TESSERA_CUDA_OP_BY_OP: 1 in a unit that reaches CUDA tensors without compiling kernels (g++)
// and links tessera::compiled, which nvcc compiled with Tessera's kernels: such a unit evaluates
// any expression on CUDA tensors one operation at a time, each a kernel of the library
// (expr/detail/op_by_op.hpp). A g++ unit without the library cannot evaluate CUDA expressions.
#if TESSERA_CUDA && !TESSERA_CUDA_KERNELS && !defined(TESSERA_IMPLEMENTATION) && \
    defined(TESSERA_COMPILED) && TESSERA_COMPILED
#define TESSERA_CUDA_OP_BY_OP 1
#else
#define TESSERA_CUDA_OP_BY_OP 0
#endif

#define TESSERA_STRINGIFY_IMPL(x) #x
#define TESSERA_STRINGIFY(x) TESSERA_STRINGIFY_IMPL(x)

namespace tessera {
/// Maximum number of dimensions of a Shape (PyTorch allows more; 8 keeps Shape a fixed-size value).
inline constexpr int max_dims = 8;
}  // namespace tessera
