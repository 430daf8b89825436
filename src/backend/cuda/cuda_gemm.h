/*
 * cuda_gemm.h - kernels of the CUDA backend's fast matmul mode
 * (TIDE_MATMUL_FAST): the activations are rounded to the weights' 16-bit
 * dtype so that cuBLAS can multiply both on tensor cores (cublasGemmEx, f32
 * accumulation, f32 output). Same conventions as cuda_kernels.h: launchers
 * callable from C that enqueue on `s` and return the launch status.
 */
#ifndef TIDE_CUDA_GEMM_H
#define TIDE_CUDA_GEMM_H

#include "tide.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst (n) of dt (TIDE_F16 or TIDE_BF16) = src (n) f32, each element rounded
 * to nearest even (overflow to f16 gives +-inf, as a PyTorch cast does).
 * cudaErrorInvalidValue for another dtype. */
cudaError_t tcu_round_to_16(cudaStream_t s, const float *src, tide_dtype dt, void *dst, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
