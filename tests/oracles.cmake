# Reference data from independent implementations (numpy, the CUDA toolkit), included at the end
# of tests/CMakeLists.txt. An oracle script is a CTest fixture: the tests that read its files
# require it, so `ctest -R core.half_test` runs the script first.

add_test(NAME oracles.half
  COMMAND ${TESSERA_ORACLE_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/oracles/half_reference.py
          ${TESSERA_ORACLE_DIR})
set_tests_properties(oracles.half PROPERTIES FIXTURES_SETUP oracle_half LABELS oracles)
if(TEST core.half_test)
  set_tests_properties(core.half_test PROPERTIES FIXTURES_REQUIRED oracle_half)
endif()

# half_cuda_oracle_test compares with the CUDA toolkit's host-side conversions in cuda_fp16.h and
# cuda_bf16.h (header-only for these; no cudart needed), so it needs only the include directory.
# Without it the test compiles to a failing case that says so: the toolkit is required here.
if(TARGET tessera_core_tests)
  # Kept out of the unity batches: cuda_fp16.h declares a global `half` that other files' names
  # would meet.
  set_source_files_properties(core/half_cuda_oracle_test.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  find_path(TESSERA_CUDA_FP16_INCLUDE_DIR cuda_bf16.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{CUDA_HOME}/include $ENV{CUDA_PATH}/include
    PATHS /usr/local/cuda/include /opt/cuda/include /usr/include)
  if(TESSERA_CUDA_FP16_INCLUDE_DIR)
    # SYSTEM: the toolkit's headers are not held to Tessera's -Werror.
    target_include_directories(tessera_core_tests SYSTEM PRIVATE
      ${TESSERA_CUDA_FP16_INCLUDE_DIR})
  else()
    message(WARNING "Tessera: cuda_bf16.h not found; core.half_cuda_oracle_test will fail. "
                    "Install the CUDA toolkit or set TESSERA_CUDA_FP16_INCLUDE_DIR.")
  endif()
endif()

# random_expr_test evaluates random expression trees with Tessera and runs expr_numpy.py on them
# itself (std::system, so the script sees exactly the trees of this run); the script's self-test
# checks its table of PyTorch's promotion rules and a few hand-computed trees.
add_test(NAME oracles.expr_numpy
  COMMAND ${TESSERA_ORACLE_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/oracles/expr_numpy.py --self-test)
set_tests_properties(oracles.expr_numpy PROPERTIES FIXTURES_SETUP oracle_expr_numpy LABELS oracles)
if(TEST expr.random_expr_test)
  # About 300 expression types each instantiate the executor: -O0 compiles the file in a quarter
  # of the -O3 time (the tensors are tiny), and the other expr tests cover the optimised loops.
  # Its own translation unit, so -O0 applies to it alone.
  set_source_files_properties(expr/random_expr_test.cpp PROPERTIES COMPILE_OPTIONS -O0
                              SKIP_UNITY_BUILD_INCLUSION ON)
  set_tests_properties(expr.random_expr_test PROPERTIES
    FIXTURES_REQUIRED oracle_expr_numpy LABELS "expr;oracles")
endif()

# io.safetensors_test checks Tessera's checkpoints against Python's official `safetensors`
# package (PyPI; `cmake/install-deps.sh --test` installs it): the test runs safetensors_interop.py
# itself on the files of its run (without the package it fails, saying what to install). The
# script's self-test has the official reader decode the bytes the test expects Tessera to write.
add_test(NAME oracles.safetensors
  COMMAND ${TESSERA_ORACLE_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/oracles/safetensors_interop.py
          --self-test)
set_tests_properties(oracles.safetensors PROPERTIES FIXTURES_SETUP oracle_safetensors LABELS oracles)
if(TEST io.safetensors_test)
  set_tests_properties(io.safetensors_test PROPERTIES
    FIXTURES_REQUIRED oracle_safetensors LABELS "io;oracles")
endif()

# nn.layers_test and optim.optim_test compare layers, losses and optimiser trajectories with
# PyTorch (Debian's python3-torch; `cmake/install-deps.sh --test` installs it): each test runs
# nn_torch.py itself, which draws the inputs with torch's generator and writes PyTorch's results
# (without torch the script exits 2 and the test fails, saying what to install).
foreach(torch_test IN ITEMS nn.layers_test optim.optim_test autograd.torch_test)
  if(TEST ${torch_test})
    string(REGEX REPLACE "\\..*$" "" torch_folder ${torch_test})
    set_tests_properties(${torch_test} PROPERTIES LABELS "${torch_folder};oracles")
  endif()
endforeach()
