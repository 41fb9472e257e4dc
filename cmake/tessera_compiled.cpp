// The one translation unit of Tessera's compiled mode (the CMake target tessera::compiled): it
// compiles, once, the machinery that the headers only declare in the units of a program linking
// that target (TESSERA_COMPILED=1): see "Header-only or compiled" in include/tessera/core/config.hpp.
// The target defines TESSERA_IMPLEMENTATION for this file alone.
#include "tessera/tessera.hpp"
#include "tessera/tools.hpp"  // not in tessera.hpp
