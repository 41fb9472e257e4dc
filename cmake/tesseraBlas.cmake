# Finds the CBLAS that Tessera's matmul calls and makes it the target BLAS::BLAS (included by
# Tessera's CMakeLists.txt and by the installed tesseraConfig.cmake, so both link the same one).
#
# With OpenMP, OpenBLAS's OpenMP build (Debian: libopenblas-openmp-dev) comes first: it runs its
# threads from the same OpenMP pool as Tessera's loops, and takes its thread count from the calling
# thread, so two threads driving two devices each get their share of the cores. The default
# pthreads build keeps a pool of its own: its threads and libgomp's spinning ones starve each
# other (a 784-1024-10 MLP step ran several times slower), and its count is process-wide.
# TESSERA_BLAS_OPENMP_LIBRARY names it explicitly; without it, FindBLAS chooses.
macro(tessera_find_blas with_openmp)
  if(NOT TARGET BLAS::BLAS)
    if(${with_openmp} AND NOT BLA_VENDOR)
      find_library(TESSERA_BLAS_OPENMP_LIBRARY NAMES openblas
        PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp /usr/lib64/openblas-openmp
              /usr/lib/openblas-openmp
        NO_DEFAULT_PATH
        DOC "OpenBLAS built with OpenMP (preferred when Tessera uses OpenMP)")
    endif()
    if(${with_openmp} AND TESSERA_BLAS_OPENMP_LIBRARY)
      add_library(BLAS::BLAS INTERFACE IMPORTED)
      set_target_properties(BLAS::BLAS PROPERTIES INTERFACE_LINK_LIBRARIES
                            "${TESSERA_BLAS_OPENMP_LIBRARY}")
      set(BLAS_FOUND TRUE)
      message(STATUS "Tessera: BLAS is OpenBLAS's OpenMP build (${TESSERA_BLAS_OPENMP_LIBRARY})")
    else()
      find_package(BLAS)
    endif()
  else()
    set(BLAS_FOUND TRUE)
  endif()
endmacro()
