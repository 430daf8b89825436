/*
 * cuda_runtime_api.h (test stand-in) - the few CUDA runtime types that
 * src/backend/cuda/cuda_kernels.h and cuda_gemm.h name in their prototypes,
 * so that the kernels can be compiled as C++ on a machine without the CUDA
 * toolkit (tests/emu/cuda_emu.h). Only the emulated kernel test puts this
 * directory on its include path, ahead of any real toolkit directory.
 *
 * The values of the enumerators are the real runtime's, so that a status
 * printed by the test means what it would mean on a GPU. The functions live
 * in cuda_emu.h, in namespace emu, never as C symbols: a build with the real
 * CUDA backend links libcudart into the same test binary.
 */
#ifndef TIDE_EMU_CUDA_RUNTIME_API_H
#define TIDE_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

struct cudaFuncAttributes {
    size_t sharedSizeBytes, constSizeBytes, localSizeBytes;
    int maxThreadsPerBlock, numRegs, ptxVersion, binaryVersion, cacheModeCA, maxDynamicSharedSizeBytes;
};

#endif
