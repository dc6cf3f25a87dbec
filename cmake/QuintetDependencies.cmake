# Finds quintet's dependencies. Used by the project itself and, installed beside
# quintetConfig.cmake, by consumers of an installed quintet (with the recorded QUINTET_HAS_*).
include_guard(GLOBAL)
include(CMakeFindDependencyMacro)

# In the project: resolve AUTO/ON/OFF into QUINTET_HAS_<NAME>. `found` is the result of the search.
macro(_quintet_resolve name found)
  if(QUINTET_WITH_${name} STREQUAL "OFF")
    set(QUINTET_HAS_${name} OFF)
  elseif(${found})
    set(QUINTET_HAS_${name} ON)
  elseif(QUINTET_WITH_${name} STREQUAL "ON")
    message(FATAL_ERROR "QUINTET_WITH_${name}=ON but ${name} was not found")
  else()
    set(QUINTET_HAS_${name} OFF)
  endif()
endmacro()

if(DEFINED QUINTET_INSTALLED_PACKAGE)
  # Consumer side: the installed target links exactly what the build recorded.
  find_dependency(fmt)
  if(QUINTET_HAS_MPI)
    find_dependency(MPI COMPONENTS CXX)
  endif()
  if(QUINTET_HAS_CUDA)
    find_dependency(CUDAToolkit)
  endif()
  if(QUINTET_HAS_BLAS)
    find_dependency(BLAS)
  endif()
  return()
endif()

find_package(fmt REQUIRED)

if(NOT QUINTET_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS CXX QUIET)
endif()
_quintet_resolve(MPI MPI_CXX_FOUND)

# The library needs only the CUDA runtime library and headers; nvcc is needed just for .cu code,
# which the tests enable separately with check_language (consumers never need nvcc to configure).
if(NOT QUINTET_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
endif()
_quintet_resolve(CUDA CUDAToolkit_FOUND)

if(NOT QUINTET_WITH_BLAS STREQUAL "OFF")
  if(NOT DEFINED BLA_VENDOR)
    set(BLA_VENDOR OpenBLAS)
  endif()
  find_package(BLAS QUIET)
  if(BLAS_FOUND)
    find_path(QUINTET_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
    if(NOT QUINTET_CBLAS_INCLUDE_DIR)
      set(BLAS_FOUND FALSE)  # a BLAS without the C interface is of no use here
    endif()
  endif()
endif()
_quintet_resolve(BLAS BLAS_FOUND)

# NCCL (nccl_comm): the library and header shipped with the CUDA toolkit. nccl_comm also needs MPI
# (its unique id is broadcast over MPI), so NCCL counts only with CUDA and MPI both present.
set(QUINTET_HAS_NCCL OFF)
if(QUINTET_HAS_CUDA AND QUINTET_HAS_MPI)
  find_library(QUINTET_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  find_path(QUINTET_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(QUINTET_NCCL_LIBRARY AND QUINTET_NCCL_INCLUDE_DIR)
    set(QUINTET_HAS_NCCL ON)
  endif()
endif()
