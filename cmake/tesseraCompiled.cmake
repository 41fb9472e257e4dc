# tessera::compiled, Tessera's optional compiled mode: a static library whose unit
# tessera_compiled.cpp (beside this file) compiles, once, the machinery that does not depend on a
# user's types; a program linking it gets only declarations of that machinery from the headers
# (TESSERA_COMPILED=1), so each of its units compiles less. With CUDA a second unit,
# tessera_cuda_primitives.cpp, holds the kernels of the primitives g++ units run CUDA expressions
# with (about half of the library's nvcc time), so two build jobs compile the library in about
# half the wall time. Header-only use (tessera::tessera alone) is unchanged. The library is built
# inside the user's project, with the user's compiler and flags, from the sources installed with
# the package.
# Used by Tessera's CMakeLists.txt and by the installed tesseraConfig.cmake.
function(tessera_add_compiled_library source with_cuda)
  if(TARGET tessera_compiled)
    return()
  endif()
  set(sources ${source})
  if(with_cuda)
    get_filename_component(directory "${source}" DIRECTORY)
    list(APPEND sources "${directory}/tessera_cuda_primitives.cpp")
  endif()
  add_library(tessera_compiled STATIC ${sources})
  add_library(tessera::compiled ALIAS tessera_compiled)
  target_link_libraries(tessera_compiled PUBLIC tessera::tessera)
  target_compile_definitions(tessera_compiled PUBLIC TESSERA_COMPILED=1)
  # The library's definitions are compiled in the main unit only; the primitives' unit is
  # compiled as a user's unit (their declarations).
  set_property(SOURCE "${source}" TARGET_DIRECTORY tessera_compiled APPEND PROPERTY
               COMPILE_DEFINITIONS TESSERA_IMPLEMENTATION=1)
  if(with_cuda)
    # nvcc compiles the library, so the kernels of the library's layers, losses, optimisers,
    # copies and of every primitive that g++ units run their CUDA expressions with are in it.
    set_source_files_properties(${sources} TARGET_DIRECTORY tessera_compiled PROPERTIES LANGUAGE CUDA)
    target_compile_options(tessera_compiled PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
    # The GPU generations the kernels are built for: TESSERA_CUDA_ARCHITECTURES (a CMake list,
    # e.g. "80;90"), Hopper by default. Each architecture compiles every kernel again: about
    # half of the library's build per architecture added.
    if(NOT TESSERA_CUDA_ARCHITECTURES)
      set(TESSERA_CUDA_ARCHITECTURES 90)
    endif()
    set_target_properties(tessera_compiled PROPERTIES CUDA_ARCHITECTURES "${TESSERA_CUDA_ARCHITECTURES}")
    # The library's units are CUDA; C++20 reaches nvcc as -std=c++20 (tessera::tessera). A
    # project's CMAKE_CXX_STANDARD (20, 23) sets CXX_STANDARD on every target, and CMake carries
    # it over to CUDA sources as the dialect "CUDA20"/"CUDA23", for which CMake 3.25 knows no nvcc
    # flag: configuring would stop ("requires the language dialect CUDA20"). Unset here.
    set_property(TARGET tessera_compiled PROPERTY CXX_STANDARD)
    set_property(TARGET tessera_compiled PROPERTY CXX_STANDARD_REQUIRED)
    set_property(TARGET tessera_compiled PROPERTY CXX_EXTENSIONS)
  endif()
endfunction()

# tessera_precompile_headers(<target>...): each target's C++ units get <tessera/tessera.hpp>
# precompiled (CMake's target_precompile_headers, built once per target with its own flags, and
# included before each unit's first line), so a unit no longer parses Tessera's headers itself.
# Worth it for targets of several units; with one unit, building the header costs what it saves.
# CUDA units (nvcc) are left as they are.
function(tessera_precompile_headers)
  foreach(target IN LISTS ARGN)
    if(NOT TARGET ${target})
      message(FATAL_ERROR "tessera_precompile_headers: no target named '${target}'")
    endif()
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<tessera/tessera.hpp>>")
  endforeach()
endfunction()
