# Finds a dlpack.h for tessera/io/dlpack.hpp and makes it the target tessera_dlpack::headers
# (included by Tessera's CMakeLists.txt and by the installed tesseraConfig.cmake, so both use the
# same one). Sets TESSERA_DLPACK_FOUND. TESSERA_DLPACK_INCLUDE_DIR names the directory: one holding
# dlpack/dlpack.h (Debian's libdlpack-dev, DLPack's own install, CuPy's include directory),
# ATen/dlpack.h (LibTorch's include directory) or dlpack.h itself. DLPack is a header only.
macro(tessera_find_dlpack)
  if(NOT TARGET tessera_dlpack::headers)
    find_path(TESSERA_DLPACK_INCLUDE_DIR NAMES dlpack/dlpack.h ATen/dlpack.h
      DOC "Directory of dlpack/dlpack.h (or ATen/dlpack.h, LibTorch's, or dlpack.h)")
    if(TESSERA_DLPACK_INCLUDE_DIR AND (EXISTS "${TESSERA_DLPACK_INCLUDE_DIR}/dlpack/dlpack.h" OR
                                       EXISTS "${TESSERA_DLPACK_INCLUDE_DIR}/ATen/dlpack.h" OR
                                       EXISTS "${TESSERA_DLPACK_INCLUDE_DIR}/dlpack.h"))
      add_library(tessera_dlpack::headers INTERFACE IMPORTED)
      set_target_properties(tessera_dlpack::headers PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_DLPACK_INCLUDE_DIR}")
      set(TESSERA_DLPACK_FOUND TRUE)
    else()
      set(TESSERA_DLPACK_FOUND FALSE)
    endif()
  else()
    set(TESSERA_DLPACK_FOUND TRUE)
  endif()
endmacro()
