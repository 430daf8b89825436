# emu.cmake - test_cuda_emu and test_cuda_emu_train: the CUDA backend's kernels
# run on the host by the emulation of tests/emu/cuda_emu.h and compared with the
# CPU kernels. Included by the top CMakeLists.txt in its tests section.
#
# It needs a C++17 compiler, never nvcc or the CUDA toolkit, so it is built
# and run wherever the tests are, whether or not the CUDA backend is enabled
# (CI has no GPU). The kernels it compiles are the current sources: each .cu
# file is rewritten for the emulation by extract.cmake at build time, again
# whenever it changes. TIDE_EMU_CUDA_DIR can point the test at another copy
# of them, which is only for checking that the test catches a bug planted in
# a copy.

include(CheckLanguage)
check_language(CXX)
if(NOT CMAKE_CXX_COMPILER)
  message(STATUS "tide: no C++ compiler: test_cuda_emu (CUDA kernels on a host emulation) not built")
  return()
endif()
# Under ThreadSanitizer: the emulation is single-threaded (nothing for TSan
# to check) and switches stacks, which TSan would need annotations for.
if(TIDE_SANITIZE STREQUAL "thread")
  message(STATUS "tide: test_cuda_emu not built under ThreadSanitizer (single-threaded, switches stacks)")
  return()
endif()
enable_language(CXX)

set(TIDE_EMU_CUDA_DIR "${PROJECT_SOURCE_DIR}/src/backend/cuda" CACHE PATH
    "Directory of the .cu files test_cuda_emu compiles (the real sources; another only to check the test)")

set(_emu_gen ${CMAKE_CURRENT_BINARY_DIR}/emu)
foreach(f cuda_kernels cuda_gemm cuda_train cuda_quant)
  add_custom_command(
    OUTPUT ${_emu_gen}/${f}.inc
    COMMAND ${CMAKE_COMMAND} -DSRC=${TIDE_EMU_CUDA_DIR}/${f}.cu -DOUT=${_emu_gen}/${f}.inc
            -P ${CMAKE_CURRENT_LIST_DIR}/extract.cmake
    DEPENDS ${TIDE_EMU_CUDA_DIR}/${f}.cu ${CMAKE_CURRENT_LIST_DIR}/extract.cmake
    COMMENT "Rewriting ${f}.cu for the CUDA emulation test"
    VERBATIM)
endforeach()

# test_cuda_emu: the forward kernels (cuda_kernels.cu) and the fast mode's
# rounding (cuda_gemm.cu); test_cuda_emu_train: the training kernels
# (cuda_train.cu); test_cuda_emu_quant: the kernels for quantized weights
# (cuda_quant.cu). All on the harness of emu_check.h.
add_executable(test_cuda_emu ${CMAKE_CURRENT_LIST_DIR}/test_cuda_emu.cpp ${_emu_gen}/cuda_kernels.inc
               ${_emu_gen}/cuda_gemm.inc)
add_executable(test_cuda_emu_train ${CMAKE_CURRENT_LIST_DIR}/test_cuda_emu_train.cpp ${_emu_gen}/cuda_train.inc)
add_executable(test_cuda_emu_quant ${CMAKE_CURRENT_LIST_DIR}/test_cuda_emu_quant.cpp ${_emu_gen}/cuda_quant.inc)
target_include_directories(test_cuda_emu_quant PRIVATE ${PROJECT_SOURCE_DIR}/tests)
# it makes its weights itself (tests/quant_ref.h): emu_check.h's 16-bit helpers go unused
target_compile_options(test_cuda_emu_quant PRIVATE -Wno-unused-function)
foreach(t test_cuda_emu test_cuda_emu_train test_cuda_emu_quant)
  set_target_properties(${t} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  # stub/ first: its cuda_runtime_api.h, not a toolkit's, serves the backend's headers.
  target_include_directories(${t} BEFORE PRIVATE ${CMAKE_CURRENT_LIST_DIR}/stub ${_emu_gen}
                                                 ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR}/src)
  # -ffp-contract=off: the host must round a * b + c twice where the CUDA source
  # does (cuda_emu.h). #pragma unroll is nvcc's.
  target_compile_options(${t} PRIVATE -ffp-contract=off -Wno-unknown-pragmas)
  # Undefined behaviour in a kernel (a misaligned access, say) is a fault on a
  # GPU: under the sanitizers it stops this test, where others only print it.
  if(TIDE_SANITIZE STREQUAL "address")
    target_compile_options(${t} PRIVATE -fno-sanitize-recover=undefined)
  endif()
  target_link_libraries(${t} PRIVATE tide_test_hooks tide)
endforeach()
# Under AddressSanitizer the emulated kernels run about 5 times slower (a
# minute for the whole set): --quick keeps every case but three quarters of
# the attention shape grid, which still runs every kernel and code path.
set(_emu_args "")
if(TIDE_SANITIZE)
  set(_emu_args --quick)
endif()
# their COST (the order ctest -j starts them in): the table in CMakeLists.txt
add_test(NAME test_cuda_emu COMMAND test_cuda_emu ${_emu_args})
set_tests_properties(test_cuda_emu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
add_test(NAME test_cuda_emu_train COMMAND test_cuda_emu_train ${_emu_args})
set_tests_properties(test_cuda_emu_train PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
add_test(NAME test_cuda_emu_quant COMMAND test_cuda_emu_quant ${_emu_args})
set_tests_properties(test_cuda_emu_quant PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
