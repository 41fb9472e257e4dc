// The main translation unit of Tessera's compiled mode (the CMake target tessera::compiled): it
// compiles, once, the machinery that the headers only declare in the units of a program linking
// that target (TESSERA_COMPILED=1): see "Header-only or compiled" in include/tessera/core/config.hpp.
// The target defines TESSERA_IMPLEMENTATION for this file alone. With CUDA, nvcc compiles it, so
// the library also holds the kernels of its layers, losses, optimisers and copies; the kernels of
// the primitives that g++ units evaluate CUDA expressions with are the library's second unit,
// tessera_cuda_primitives.cpp beside this file.
#include "tessera/tessera.hpp"
#include "tessera/tools.hpp"  // not in tessera.hpp
