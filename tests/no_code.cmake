# Fails when an object file defines a function of Tessera's (core.empty_unit_compiles_no_code):
#   cmake -DNM=<nm> -DOBJECTS=<object files> [-DALLOW=<regex>] -P no_code.cmake
execute_process(COMMAND ${NM} --defined-only -C ${OBJECTS} OUTPUT_VARIABLE symbols
                RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${NM} failed (${result}) on ${OBJECTS}")
endif()
string(REGEX MATCHALL "[^\n]* [TtWw] [^\n]*tessera::[^\n]*" functions "${symbols}")
# ALLOW: a regular expression for the functions (demangled, after the symbol's type) a unit may
# define (an nvcc unit: the host side of kernels).
if(ALLOW)
  set(kept "")
  foreach(line IN LISTS functions)
    string(REGEX REPLACE "^[0-9a-fA-F]* *[0-9a-fA-F]* *[TtWw] " "" name "${line}")
    if(NOT name MATCHES "${ALLOW}")
      list(APPEND kept "${line}")
    endif()
  endforeach()
  set(functions ${kept})
endif()
list(LENGTH functions count)
if(count GREATER 0)
  list(JOIN functions "\n" listing)
  message(FATAL_ERROR "a unit that only includes tessera/tessera.hpp compiles ${count} of "
                      "Tessera's functions (each unit of every user would):\n${listing}")
endif()
message(STATUS "no function of Tessera's compiled in ${OBJECTS}")
