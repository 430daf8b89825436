/*
 * cuda_gemm.cu - the activation rounding of the fast matmul mode
 * (cuda_gemm.h). A grid-stride loop, two elements per step where the
 * addresses allow it: the rounding is memory-bound and runs once per row
 * chunk of a MATMUL, before cublasGemmEx reads the chunk.
 */
#include "backend/cuda/cuda_gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define RND_BLOCK 256
#define RND_MAX_GRID (1 << 16)

template <int DT>
__device__ __forceinline__ uint16_t round16(float x) {
    if (DT == TIDE_BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    return __half_as_ushort(__float2half_rn(x));
}

template <int DT>
__global__ void k_round16(const float *src, uint16_t *dst, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    /* pairs: src is 8-byte aligned and dst 4-byte aligned (checked by the launcher) */
    const int64_t pairs = n / 2;
    const float2 *s2 = (const float2 *)src;
    uint32_t *d2 = (uint32_t *)dst;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += stride) {
        float2 v = s2[i];
        d2[i] = (uint32_t)round16<DT>(v.x) | ((uint32_t)round16<DT>(v.y) << 16);
    }
    if (n & 1 && blockIdx.x == 0 && threadIdx.x == 0) dst[n - 1] = round16<DT>(src[n - 1]);
}

template <int DT>
__global__ void k_round16_unaligned(const float *src, uint16_t *dst, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = round16<DT>(src[i]);
}

extern "C" cudaError_t tcu_round_to_16(cudaStream_t s, const float *src, tide_dtype dt, void *dst, int64_t n) {
    if (dt != TIDE_F16 && dt != TIDE_BF16) return cudaErrorInvalidValue;
    if (n <= 0) return cudaSuccess;
    bool paired = ((uintptr_t)src % 8 == 0) && ((uintptr_t)dst % 4 == 0);
    int64_t work = paired ? (n + 1) / 2 : n;
    int64_t g = (work + RND_BLOCK - 1) / RND_BLOCK;
    if (g > RND_MAX_GRID) g = RND_MAX_GRID;
    uint16_t *d = (uint16_t *)dst;
    if (dt == TIDE_BF16) {
        if (paired) k_round16<TIDE_BF16><<<(unsigned)g, RND_BLOCK, 0, s>>>(src, d, n);
        else k_round16_unaligned<TIDE_BF16><<<(unsigned)g, RND_BLOCK, 0, s>>>(src, d, n);
    } else {
        if (paired) k_round16<TIDE_F16><<<(unsigned)g, RND_BLOCK, 0, s>>>(src, d, n);
        else k_round16_unaligned<TIDE_F16><<<(unsigned)g, RND_BLOCK, 0, s>>>(src, d, n);
    }
    return cudaGetLastError();
}
