# cuda.cmake - the optional CUDA backend (src/backend/cuda/), included by the top
# CMakeLists.txt right after the `tide` library target is defined.
#
# Contract:
#   - option TIDE_CUDA: ON by default where nvcc is found, OFF otherwise. ON
#     without nvcc only warns; the build goes on without the backend.
#   - With the backend: CUDA is enabled as a language (C++17, -O3, architectures
#     "80;90" unless CMAKE_CUDA_ARCHITECTURES was given: `native` needs a GPU at
#     configure time), the files of src/backend/cuda are added to `tide`,
#     TIDE_HAVE_CUDA is defined for it (src/backend/backend.c then offers the
#     backend), and cudart (shared) and cuBLAS are linked PUBLIC.
#   - cuFile (GPUDirect Storage) is optional on top: where cufile.h is found
#     (the CUDA include directory or the nvidia-cufile / nvidia cu13 Python
#     wheels) TIDE_HAVE_CUFILE is defined and the library is opened with dlopen
#     at run time, so nothing links against libcufile and a machine without it
#     still runs every binary.
#   - The directory-wide C flags of CMakeLists.txt (-Wall ..., -march=native,
#     sanitizers) are kept from nvcc, which does not take them; .cu files get
#     their own warning flags through -Xcompiler.

include(CheckLanguage)

# nvcc is not always on PATH; the toolkit's usual home is a good second guess.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  find_program(_tide_nvcc nvcc)
  if(NOT _tide_nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
  endif()
endif()
check_language(CUDA)

if(CMAKE_CUDA_COMPILER)
  option(TIDE_CUDA "Build the CUDA backend" ON)
else()
  option(TIDE_CUDA "Build the CUDA backend" OFF)
endif()

if(TIDE_CUDA AND NOT CMAKE_CUDA_COMPILER)
  message(WARNING "TIDE_CUDA is ON but no CUDA compiler (nvcc) was found: building without the CUDA backend")
  set(TIDE_CUDA OFF)
endif()

if(TIDE_CUDA)
  # cudart and cuBLAS must be there too, or the backend cannot link.
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cudart OR NOT TARGET CUDA::cublas)
    message(WARNING "TIDE_CUDA is ON but the CUDA toolkit's cudart/cuBLAS were not found: "
                    "building without the CUDA backend")
    set(TIDE_CUDA OFF)
  endif()
endif()

if(NOT TIDE_CUDA)
  message(STATUS "tide: CUDA backend disabled")
  return()
endif()

# Set before enable_language: the compiler check itself builds for these.
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to build for" FORCE)
endif()
enable_language(CUDA)

set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# One CUDA runtime in every binary: the shared one, as CUDA::cudart below.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)

file(GLOB TIDE_CUDA_SRC CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu
     ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.c)
target_sources(tide PRIVATE ${TIDE_CUDA_SRC})

# The directory's compile options were copied into the target when it was
# made; keep them to C and give nvcc its own.
get_target_property(_tide_copts tide COMPILE_OPTIONS)
if(_tide_copts)
  set(_tide_copts_c "")
  foreach(opt IN LISTS _tide_copts)
    list(APPEND _tide_copts_c "$<$<COMPILE_LANGUAGE:C>:${opt}>")
  endforeach()
  set_property(TARGET tide PROPERTY COMPILE_OPTIONS ${_tide_copts_c})
endif()
target_compile_options(tide PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Wno-sign-compare>)
# Optimised builds compile the kernels at -O3 (in place of the configuration's
# -O2, which nvcc would otherwise see twice and warn about).
foreach(cfg RELEASE RELWITHDEBINFO)
  string(REGEX REPLACE "(^| )-O[0-9s]( |$)" "\\1-O3\\2" CMAKE_CUDA_FLAGS_${cfg} "${CMAKE_CUDA_FLAGS_${cfg}}")
endforeach()
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  target_compile_options(tide PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-O3>)
endif()

set_target_properties(tide PROPERTIES
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_RUNTIME_LIBRARY Shared
  CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
# PUBLIC: src/backend/backend.c and every consumer in this build (the tests)
# see that the backend exists; not exported to installed consumers.
target_compile_definitions(tide PUBLIC $<BUILD_INTERFACE:TIDE_HAVE_CUDA=1>)
target_link_libraries(tide PUBLIC CUDA::cudart CUDA::cublas)

# ---------------------------------------------------------------- cuFile (optional)
set(_tide_cufile_hints ${CUDAToolkit_INCLUDE_DIRS})
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import importlib.util as u, os\nfor m in ('nvidia.cufile', 'nvidia.cu13', 'nvidia'):\n    try:\n        s = u.find_spec(m)\n    except Exception:\n        s = None\n    if s and s.submodule_search_locations:\n        for p in s.submodule_search_locations: print(p)"
    OUTPUT_VARIABLE _tide_py_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  string(REPLACE "\n" ";" _tide_py_dirs "${_tide_py_dirs}")
  foreach(d IN LISTS _tide_py_dirs)
    list(APPEND _tide_cufile_hints ${d}/include ${d}/cufile/include ${d}/cu13/include)
  endforeach()
endif()
find_path(TIDE_CUFILE_INCLUDE_DIR cufile.h HINTS ${_tide_cufile_hints} /usr/local/cuda/include)
if(TIDE_CUFILE_INCLUDE_DIR)
  get_filename_component(_tide_cufile_root ${TIDE_CUFILE_INCLUDE_DIR} DIRECTORY)
  find_library(TIDE_CUFILE_LIBRARY NAMES cufile libcufile.so.0
               HINTS ${_tide_cufile_root}/lib ${_tide_cufile_root}/lib64 ${CUDAToolkit_LIBRARY_DIR})
endif()
if(TIDE_CUFILE_INCLUDE_DIR)
  message(STATUS "tide: cuFile (GPUDirect Storage) header at ${TIDE_CUFILE_INCLUDE_DIR}; "
                 "library ${TIDE_CUFILE_LIBRARY} (opened at run time)")
  target_compile_definitions(tide PRIVATE TIDE_HAVE_CUFILE=1)
  if(TIDE_CUFILE_LIBRARY)
    target_compile_definitions(tide PRIVATE TIDE_CUFILE_PATH="${TIDE_CUFILE_LIBRARY}")
  endif()
  # Only the .c file that wraps cuFile sees the header's directory, searched
  # after the toolkit's (a wheel's directory holds its own cuda.h).
  set_property(SOURCE ${PROJECT_SOURCE_DIR}/src/backend/cuda/cuda_file.c APPEND PROPERTY
               COMPILE_OPTIONS -idirafter ${TIDE_CUFILE_INCLUDE_DIR})
  target_link_libraries(tide PUBLIC ${CMAKE_DL_LIBS})
else()
  message(STATUS "tide: cufile.h not found: building without GPUDirect Storage")
endif()

# ---------------------------------------------------------------- NCCL (optional)
# The collectives of data-parallel ranks on the CUDA backend (src/net/comm_nccl.c)
# need nccl.h and libnccl (the CUDA toolkit's directories, /usr/local, or the
# nvidia-nccl Python wheel's); the ranks' host carrier (MPI, or TCP for a
# torchrun-style launch: src/net/comm.c) carries NCCL's unique id, so a build
# without MPI has NCCL too (its ranks started torchrun-style). Found: the file
# is compiled into `tide` alone (the emulated GPU's library has no NCCL),
# TIDE_HAVE_NCCL is defined for the sources `tide`
# compiles itself (src/backend/backend.c's tide_backend_comm_attach), and
# libnccl is linked. TIDE_NCCL=OFF leaves it out.
option(TIDE_NCCL "Run the CUDA ranks' collectives on NCCL where found" ON)
set(TIDE_HAVE_NCCL OFF)
if(TIDE_NCCL)
  set(_tide_nccl_hints ${CUDAToolkit_INCLUDE_DIRS})
  set(_tide_nccl_lib_hints ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64)
  foreach(d IN LISTS _tide_py_dirs)
    list(APPEND _tide_nccl_hints ${d}/nccl/include)
    list(APPEND _tide_nccl_lib_hints ${d}/nccl/lib)
  endforeach()
  find_path(TIDE_NCCL_INCLUDE_DIR nccl.h HINTS ${_tide_nccl_hints})
  find_library(TIDE_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_tide_nccl_lib_hints})
  if(TIDE_NCCL_INCLUDE_DIR AND TIDE_NCCL_LIBRARY)
    set(TIDE_HAVE_NCCL ON)
    target_sources(tide PRIVATE ${PROJECT_SOURCE_DIR}/src/net/comm_nccl.c)
    set_property(SOURCE ${PROJECT_SOURCE_DIR}/src/net/comm_nccl.c APPEND PROPERTY
                 COMPILE_OPTIONS -idirafter ${TIDE_NCCL_INCLUDE_DIR})
    target_compile_definitions(tide PRIVATE TIDE_HAVE_NCCL=1)
    target_link_libraries(tide PUBLIC ${TIDE_NCCL_LIBRARY})
    message(STATUS "tide: NCCL at ${TIDE_NCCL_INCLUDE_DIR}, ${TIDE_NCCL_LIBRARY}: CUDA ranks' collectives on NCCL")
  else()
    message(STATUS "tide: nccl.h or libnccl not found: CUDA ranks are refused with a message")
  endif()
endif()

message(STATUS "tide: CUDA backend enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
               "architectures ${CMAKE_CUDA_ARCHITECTURES})")
