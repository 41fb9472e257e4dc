# Runs one failtest: asks ninja for the compile command of TARGET (`ninja -t commands`, which
# builds nothing) and runs it, printing the compiler's output; the CTest passes when that output
# holds the expected text (PASS_REGULAR_EXPRESSION) and fails if the program compiles. Running
# the compiler directly, not `cmake --build`, lets the failtests run in parallel: two builds in one
# tree cannot overlap, so they used to run one at a time (a minute of every CPU and ASan stage).
#   cmake -DNINJA=<ninja> -DBUILD_DIR=<build tree> -DTARGET=failtest_<name> -DSOURCE=<file> \
#         -P run.cmake
execute_process(COMMAND ${NINJA} -C ${BUILD_DIR} -t commands ${TARGET}
                OUTPUT_VARIABLE commands RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "ninja -t commands ${TARGET} failed (${status})")
endif()
string(REPLACE "\n" ";" commands "${commands}")
set(compile)
foreach(command IN LISTS commands)
  string(FIND "${command}" " -c ${SOURCE}" at)
  if(at GREATER -1)
    set(compile "${command}")
    break()
  endif()
endforeach()
if(NOT compile)
  message(FATAL_ERROR "no compile command for ${SOURCE} in `ninja -t commands ${TARGET}`")
endif()
separate_arguments(compile UNIX_COMMAND "${compile}")
execute_process(COMMAND ${compile} WORKING_DIRECTORY ${BUILD_DIR}
                OUTPUT_VARIABLE output ERROR_VARIABLE output RESULT_VARIABLE status)
message("${output}")
if(status EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not")
endif()
