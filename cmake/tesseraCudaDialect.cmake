# tessera_fill_cuda_dialects(): CMake before 3.26 knows no nvcc flag for the CUDA dialect "CUDA20"
# (Modules/Compiler/NVIDIA-CUDA.cmake stops at C++17). A target whose CXX_STANDARD is 20, as
# every target of a project that sets CMAKE_CXX_STANDARD 20, carries that standard over to its
# .cu sources, and configuring stops with `Target "..." requires the language dialect "CUDA20"`.
# nvcc 12 and later take -std=c++20: Tessera supplies the flag CMake lacks, as cache entries, so
# that every directory of the project sees them (a FetchContent subdirectory's variables would
# not reach the user's). Nothing is changed where CMake knows the flag. nvcc has no C++23: a
# C++23 project sets CMAKE_CUDA_STANDARD 20 for its .cu files (CUDA_STANDARD takes precedence).
# Used by Tessera's CMakeLists.txt and by the installed tesseraConfig.cmake.
macro(tessera_fill_cuda_dialects)
  if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12
     AND NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20" CACHE INTERNAL
        "nvcc's C++20 flag, which this CMake does not know (set by Tessera)")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20" CACHE INTERNAL
        "nvcc's C++20 flag, which this CMake does not know (set by Tessera)")
  endif()
endmacro()
