# backend_emu.cmake - the whole CUDA backend on an emulated GPU, so that CI
# (no GPU) runs src/backend/cuda/cuda_backend.c (and cuda_ops.c) and everything
# above it.
# Included by the top CMakeLists.txt in its tests section, after emu.cmake.
#
#   tide_cudaemu         the library again (the objects of `tide`), plus the
#                        CUDA backend built against the toolkit's headers, its
#                        kernels on the host emulation (cuda_kern_emu.cpp) and
#                        an emulated CUDA runtime and cuBLAS (cuda_rt_emu.cpp)
#                        in place of libcudart and libcublas;
#   tide-cudaemu         the command-line tool on it;
#   test_backends_cudaemu  tests/test_backends.c on it: every op on "cuda"
#                        against the CPU, models offloaded and resident (and
#                        its take_last cases again on a device with a small
#                        2-D copy pitch limit);
#   test_train_cudaemu   tests/emu/test_train_cudaemu.c: the trainer on the
#                        CUDA backend, resident and offloaded (state on host
#                        and on SSD), bit-identical to each other and within
#                        1e-4 of the CPU trainer's losses;
#   cli_cuda_emu         tests/emu/cli_cuda_emu.sh: `tide run` on the emulated
#                        GPU, and its failures;
#   bench_gpu_offload_cudaemu  (with the benchmarks) bench/gpu_offload.c on it,
#                        on a 4-layer tiny model: the GPU benchmark's own code
#                        (timing events, link busy times, plain-copy baseline,
#                        bit-for-bit checks) runs before a GPU session needs it.
#
# Needs a C++17 compiler and the CUDA toolkit's headers (not nvcc, not a GPU).
# Not under ThreadSanitizer: the emulation switches stacks (emu.cmake).

if(NOT CMAKE_CXX_COMPILER OR TIDE_SANITIZE STREQUAL "thread")
  return()
endif()
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND OR NOT EXISTS "${CUDAToolkit_INCLUDE_DIRS}/cublas_v2.h")
  message(STATUS "tide: no CUDA toolkit headers: the CUDA backend's emulated-GPU tests are not built")
  return()
endif()

set(_emu_dir ${CMAKE_CURRENT_LIST_DIR})
set(_emu_gen ${CMAKE_CURRENT_BINARY_DIR}/emu_c)
set(_emu_inc "")
foreach(f cuda_kernels cuda_gemm cuda_train cuda_quant)
  add_custom_command(
    OUTPUT ${_emu_gen}/${f}.inc
    COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR}/src/backend/cuda/${f}.cu -DOUT=${_emu_gen}/${f}.inc
            -DKEEP_C=ON -P ${_emu_dir}/extract.cmake
    DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/${f}.cu ${_emu_dir}/extract.cmake
    COMMENT "Rewriting ${f}.cu for the emulated GPU"
    VERBATIM)
  list(APPEND _emu_inc ${_emu_gen}/${f}.inc)
endforeach()

# The kernels: against the stub runtime header (tests/emu/stub), never the
# toolkit's, whose types the emulation defines differently.
add_library(tide_cudaemu_kern OBJECT ${_emu_dir}/cuda_kern_emu.cpp ${_emu_inc})
target_include_directories(tide_cudaemu_kern BEFORE PRIVATE ${_emu_dir}/stub ${_emu_gen} ${_emu_dir}
                                                             ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
# The emulated runtime: against the toolkit's headers, so that its functions
# have the signatures and symbol names the backend was compiled against.
add_library(tide_cudaemu_rt OBJECT ${_emu_dir}/cuda_rt_emu.cpp)
target_include_directories(tide_cudaemu_rt PRIVATE ${_emu_dir} ${CUDAToolkit_INCLUDE_DIRS})
foreach(t tide_cudaemu_kern tide_cudaemu_rt)
  set_target_properties(${t} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  target_compile_options(${t} PRIVATE -ffp-contract=off -Wno-unknown-pragmas)
  if(TIDE_SANITIZE STREQUAL "address")
    target_compile_options(${t} PRIVATE -fno-sanitize-recover=undefined)
  endif()
endforeach()

# The library's objects (TIDE_LIB_OBJECTS, compiled once for both), the backend
# selection with TIDE_HAVE_CUDA, the CUDA backend and the emulation.
add_library(tide_cudaemu STATIC ${TIDE_BACKEND_SELECT} ${PROJECT_SOURCE_DIR}/src/backend/cuda/cuda_backend.c
            ${PROJECT_SOURCE_DIR}/src/backend/cuda/cuda_ops.c ${PROJECT_SOURCE_DIR}/src/backend/cuda/cuda_ops_train.c
            ${PROJECT_SOURCE_DIR}/src/backend/cuda/cuda_file.c
            ${TIDE_LIB_OBJECTS}
            $<TARGET_OBJECTS:tide_cudaemu_kern> $<TARGET_OBJECTS:tide_cudaemu_rt>)
target_include_directories(tide_cudaemu PUBLIC ${PROJECT_SOURCE_DIR}/include
                                        PRIVATE ${PROJECT_SOURCE_DIR}/src ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(tide_cudaemu PUBLIC TIDE_HAVE_CUDA=1)
target_link_libraries(tide_cudaemu PUBLIC ${TIDE_LIB_DEPS} stdc++)

add_executable(tide-cudaemu ${TIDE_CLI_SRC})
target_include_directories(tide-cudaemu PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(tide-cudaemu PRIVATE tide_cudaemu PkgConfig::MHD)

add_executable(test_backends_cudaemu ${PROJECT_SOURCE_DIR}/tests/test_backends.c)
target_include_directories(test_backends_cudaemu PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
target_compile_definitions(test_backends_cudaemu PRIVATE TIDE_DATA_PATH="${PROJECT_SOURCE_DIR}/data")
target_link_libraries(test_backends_cudaemu PRIVATE tide_test_hooks tide_cudaemu PkgConfig::CMOCKA)
# Under a sanitizer (5 times slower here) test_model, three quarters of the
# time, is left to cli_cuda_emu, which runs the same model paths; and the CLI
# test offloads with one policy instead of three (TIDE_CLI_QUICK).
set(_emu_skip "")
set(_emu_quick "")
if(TIDE_SANITIZE)
  set(_emu_skip --skip test_model)
  set(_emu_quick ";TIDE_CLI_QUICK=1")
endif()
# COST of these (the order ctest -j starts them in): the table in CMakeLists.txt
add_test(NAME test_backends_cudaemu COMMAND test_backends_cudaemu ${_emu_skip})
set_tests_properties(test_backends_cudaemu PROPERTIES
  ENVIRONMENT "TIDE_FIXTURES=${PROJECT_SOURCE_DIR}/tests/fixtures;TIDE_DATA=${PROJECT_SOURCE_DIR}/data"
  TIMEOUT 900)

# A device whose largest 2-D copy pitch (memPitch) is below the test's rows:
# TAKE_LAST's path for sequences longer than that.
add_test(NAME test_backends_cudaemu_pitch COMMAND test_backends_cudaemu "test_take_last*")
set_tests_properties(test_backends_cudaemu_pitch PROPERTIES
  ENVIRONMENT "TIDE_EMU_MEM_PITCH=64;TIDE_DATA=${PROJECT_SOURCE_DIR}/data" TIMEOUT 300)

# Offloaded runs keeping weights warm across runs, on the emulated GPU.
add_executable(test_warm_offload_cudaemu ${PROJECT_SOURCE_DIR}/tests/test_warm_offload.c)
target_include_directories(test_warm_offload_cudaemu PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(test_warm_offload_cudaemu PRIVATE tide_test_hooks tide_cudaemu PkgConfig::CMOCKA)
# a prefill and 3 decode steps a request, not 9: the same paths (warm weights
# across graph runs, decode steps reading them), each emulated kernel slow
target_compile_definitions(test_warm_offload_cudaemu PRIVATE WARM_N_NEW=4)
add_test(NAME test_warm_offload_cudaemu COMMAND test_warm_offload_cudaemu)
set_tests_properties(test_warm_offload_cudaemu PROPERTIES
  ENVIRONMENT "TIDE_FIXTURES=${PROJECT_SOURCE_DIR}/tests/fixtures" TIMEOUT 600)

# A LoRA adapter applied at run time, offloaded on the emulated GPU.
add_executable(test_lora_cudaemu ${PROJECT_SOURCE_DIR}/tests/test_lora.c)
target_include_directories(test_lora_cudaemu PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(test_lora_cudaemu PRIVATE tide_test_hooks tide_cudaemu PkgConfig::CMOCKA)
add_test(NAME test_lora_cudaemu COMMAND test_lora_cudaemu test_offloaded_device)
set_tests_properties(test_lora_cudaemu PROPERTIES
  ENVIRONMENT "TIDE_FIXTURES=${PROJECT_SOURCE_DIR}/tests/fixtures" TIMEOUT 600)

add_executable(test_train_cudaemu ${_emu_dir}/test_train_cudaemu.c)
target_link_libraries(test_train_cudaemu PRIVATE tide_test_hooks tide_cudaemu PkgConfig::CMOCKA)
add_test(NAME test_train_cudaemu COMMAND test_train_cudaemu)
set_tests_properties(test_train_cudaemu PROPERTIES
  ENVIRONMENT "TIDE_FIXTURES=${PROJECT_SOURCE_DIR}/tests/fixtures" TIMEOUT 900)

# A rank's step with its collectives on device memory, one rank, on the
# emulated GPU (the device collectives the test's own: copies; no NCCL here).
add_executable(test_comm_cudaemu ${_emu_dir}/test_comm_cudaemu.c)
target_include_directories(test_comm_cudaemu PRIVATE ${PROJECT_SOURCE_DIR}/src ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(test_comm_cudaemu PRIVATE tide_test_hooks tide_cudaemu)
add_test(NAME test_comm_cudaemu COMMAND test_comm_cudaemu)
set_tests_properties(test_comm_cudaemu PROPERTIES
  ENVIRONMENT "TIDE_FIXTURES=${PROJECT_SOURCE_DIR}/tests/fixtures" SKIP_RETURN_CODE 77 TIMEOUT 900)

add_test(NAME cli_cuda_emu COMMAND bash ${_emu_dir}/cli_cuda_emu.sh $<TARGET_FILE:tide-cudaemu>)
set_tests_properties(cli_cuda_emu PROPERTIES
  ENVIRONMENT "TIDE_FIXTURES=${PROJECT_SOURCE_DIR}/tests/fixtures;TIDE_DATA=${PROJECT_SOURCE_DIR}/data${_emu_quick}"
  TIMEOUT 900)

if(TIDE_BUILD_BENCH)
  add_executable(bench_gpu_offload_cudaemu ${PROJECT_SOURCE_DIR}/bench/gpu_offload.c)
  target_include_directories(bench_gpu_offload_cudaemu PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(bench_gpu_offload_cudaemu PRIVATE tide_cudaemu)
  # The model is generated into the build tree on the first run and kept.
  add_test(NAME bench_gpu_offload_cudaemu
           COMMAND bench_gpu_offload_cudaemu --config ${PROJECT_SOURCE_DIR}/tests/fixtures/tiny-bf16-gqa/config.json
                   --layers 4 --seq 64 --reps 1 --hw h100-80g ${CMAKE_CURRENT_BINARY_DIR}/emu_bench_model)
  set_tests_properties(bench_gpu_offload_cudaemu PROPERTIES
    ENVIRONMENT "TIDE_DATA=${PROJECT_SOURCE_DIR}/data" TIMEOUT 600)
endif()
