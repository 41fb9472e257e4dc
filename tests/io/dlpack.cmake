# DLPack tests (tessera/io/dlpack.hpp), included by tests/CMakeLists.txt. They need tessera::dlpack
# (a dlpack.h), so they are an executable of their own, tessera_io_dlpack_tests, not part of
# tessera_io_tests; each file is one CTest test, io.<name>:
#   dlpack_test        hand-built DLPack structures: fields, deleter counts, refused inputs
#   dlpack_torch_test  round trips with LibTorch (at::toDLPack / at::fromDLPack), when found
# and in a CUDA build, tessera_io_dlpack_cuda_tests (g++: the exchange launches no kernel) runs
# dlpack_cuda_test as cuda.dlpack_test, reported skipped (exit 77) without a GPU.
if(NOT TARGET tessera::dlpack)
  message(STATUS "Tessera tests: no dlpack.h, so no DLPack tests (install libdlpack-dev)")
  # The header check compiles tessera/io/dlpack.hpp only where it can.
  set_source_files_properties(${CMAKE_CURRENT_BINARY_DIR}/header_check/tessera_io_dlpack_hpp.cpp
                              PROPERTIES HEADER_FILE_ONLY ON)
  return()
endif()
target_link_libraries(tessera_header_check PRIVATE tessera::dlpack)

add_executable(tessera_io_dlpack_tests io/dlpack_test.cpp)
tessera_test_target(tessera_io_dlpack_tests)
target_link_libraries(tessera_io_dlpack_tests PRIVATE tessera::dlpack)
set(tessera_dlpack_tests dlpack_test)

# LibTorch as the bench finds it. Its headers are SYSTEM includes, so their warnings cannot break
# -Werror.
find_package(Torch QUIET)
if(Torch_FOUND)
  target_sources(tessera_io_dlpack_tests PRIVATE io/dlpack_torch_test.cpp)
  target_include_directories(tessera_io_dlpack_tests SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
  target_link_libraries(tessera_io_dlpack_tests PRIVATE ${TORCH_LIBRARIES})
  list(APPEND tessera_dlpack_tests dlpack_torch_test)
else()
  message(STATUS "Tessera tests: LibTorch not found (libtorch-dev), so the DLPack round trips "
                 "with LibTorch (io.dlpack_torch_test) are not built")
endif()
foreach(stem IN LISTS tessera_dlpack_tests)
  add_test(NAME io.${stem} COMMAND tessera_io_dlpack_tests
           --filenames-as-tags --warn NoTests "[#${stem}]")
  set_tests_properties(io.${stem} PROPERTIES ENVIRONMENT "${tessera_test_env}" LABELS io)
endforeach()

if(TESSERA_WITH_CUDA)
  add_executable(tessera_io_dlpack_cuda_tests io/dlpack_cuda_test.cpp)
  target_link_libraries(tessera_io_dlpack_cuda_tests PRIVATE
    tessera_cuda_main tessera::dlpack tessera_warnings)
  target_include_directories(tessera_io_dlpack_cuda_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  tessera_cuda_test_options(tessera_io_dlpack_cuda_tests)
  add_test(NAME cuda.dlpack_test COMMAND tessera_io_dlpack_cuda_tests)
  set_tests_properties(cuda.dlpack_test PROPERTIES
    ENVIRONMENT "${tessera_test_env}" LABELS "cuda;io" SKIP_RETURN_CODE 77)
  add_dependencies(tessera_cuda_check tessera_io_dlpack_cuda_tests)
endif()
