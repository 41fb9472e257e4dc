# Finds cuDNN (the CUDA toolkit's or a system one) and makes it the target tessera_cudnn::cudnn
# (included by Tessera's CMakeLists.txt and by the installed tesseraConfig.cmake, so both link the
# same one). Sets TESSERA_CUDNN_FOUND. TESSERA_CUDNN_INCLUDE_DIR and TESSERA_CUDNN_LIBRARY name it
# explicitly. cuDNN 9's libcudnn loads its engine libraries (libcudnn_cnn, ...) itself at run time.
macro(tessera_find_cudnn)
  if(NOT TARGET tessera_cudnn::cudnn)
    set(tessera_cudnn_hints)
    if(CUDAToolkit_INCLUDE_DIRS)
      list(APPEND tessera_cudnn_hints ${CUDAToolkit_INCLUDE_DIRS})
    endif()
    find_path(TESSERA_CUDNN_INCLUDE_DIR cudnn.h HINTS ${tessera_cudnn_hints}
      DOC "Directory of cudnn.h")
    find_library(TESSERA_CUDNN_LIBRARY NAMES cudnn HINTS ${CUDAToolkit_LIBRARY_DIR}
      DOC "The cuDNN library")
    if(TESSERA_CUDNN_INCLUDE_DIR AND TESSERA_CUDNN_LIBRARY)
      add_library(tessera_cudnn::cudnn INTERFACE IMPORTED)
      set_target_properties(tessera_cudnn::cudnn PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${TESSERA_CUDNN_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${TESSERA_CUDNN_LIBRARY}")
      set(TESSERA_CUDNN_FOUND TRUE)
    else()
      set(TESSERA_CUDNN_FOUND FALSE)
    endif()
  else()
    set(TESSERA_CUDNN_FOUND TRUE)
  endif()
endmacro()
