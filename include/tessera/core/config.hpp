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

#define TESSERA_STRINGIFY_IMPL(x) #x
#define TESSERA_STRINGIFY(x) TESSERA_STRINGIFY_IMPL(x)

namespace tessera {
/// Maximum number of dimensions of a Shape (PyTorch allows more; 8 keeps Shape a fixed-size value).
inline constexpr int max_dims = 8;
}  // namespace tessera
