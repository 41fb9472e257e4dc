# Finds NCCL (the CUDA toolkit's or a system one) and makes it the target tessera_nccl::nccl
# (included by Tessera's CMakeLists.txt and by the installed tesseraConfig.cmake, so both link the
# same one). Sets TESSERA_NCCL_FOUND. TESSERA_NCCL_INCLUDE_DIR and TESSERA_NCCL_LIBRARY name it
# explicitly.
macro(tessera_find_nccl)
  if(NOT TARGET tessera_nccl::nccl)
    set(tessera_nccl_hints)
    if(CUDAToolkit_INCLUDE_DIRS)
      list(APPEND tessera_nccl_hints ${CUDAToolkit_INCLUDE_DIRS})
    endif()
    find_path(TESSERA_NCCL_INCLUDE_DIR nccl.h HINTS ${tessera_nccl_hints}
      DOC "Directory of nccl.h")
    find_library(TESSERA_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
      DOC "The NCCL library")
    if(TESSERA_NCCL_INCLUDE_DIR AND TESSERA_NCCL_LIBRARY)
      add_library(tessera_nccl::nccl INTERFACE IMPORTED)
      set_target_properties(tessera_nccl::nccl PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_NCCL_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${TESSERA_NCCL_LIBRARY}")
      set(TESSERA_NCCL_FOUND TRUE)
    else()
      set(TESSERA_NCCL_FOUND FALSE)
    endif()
  else()
    set(TESSERA_NCCL_FOUND TRUE)
  endif()
endmacro()
