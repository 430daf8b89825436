/*
 * cuda_quant.cu - the CUDA kernels for block-quantized weights
 * (cuda_quant.h): the decoder of each block type, the dequantization of
 * row tiles (f32, or bf16 for the fast mode's tensor-core GEMM), the GEMV of
 * decoding and EMBED from a quantized table.
 *
 * Work unit: 8 consecutive elements of a row (a row is K / 8 units). A unit
 * never straddles a block (32 or 256 elements) nor a sub-block (32 for
 * Q4_K/Q5_K, 16 for Q6_K), so it has one scale (and min), which the decoder
 * forms once; its quants are 8 bytes (4 bytes for 4-bit types, plus the
 * fifth/high bits) of its block. In the GEMV a warp's 32 lanes take 32
 * consecutive units, i.e. 256 consecutive elements of the row: the warp
 * reads whole consecutive blocks (every DRAM sector of the row once per
 * group of x rows), lanes sharing a block's scale bytes through L1.
 *
 * Numerics: the decoder's products and differences are __fmul_rn /
 * __fsub_rn (nvcc would otherwise contract (d1 * q) - m1 into one fma), so
 * every element is the f32 value ggml's dequantization gives (order of
 * operations in cuda_quant.h). The bf16 tile rounds those values once, to
 * nearest even. The GEMV multiplies the f32 values with f32 activations.
 *
 * Determinism: no atomics; the GEMV's sums are per lane in unit order, then a
 * butterfly shuffle, fixed by K alone.
 */
#include "backend/cuda/cuda_quant.h"

#include <cuda_bf16.h>

#define TQ_BLOCK 256
#define TQ_MAX_GRID (1 << 20)
#define TQ_WARPS 8
#define TQ_FULL_MASK 0xffffffffu

static unsigned tq_grid(int64_t n, int block) {
    int64_t g = (n + block - 1) / block;
    if (g < 1) g = 1;
    if (g > TQ_MAX_GRID) g = TQ_MAX_GRID;
    return (unsigned)g;
}

/* The block of dt in elements, 0 for a type that is not a block type
 * (src/core/dtype.c has the sizes). */
static int tq_qk(tide_dtype dt) { return tide_dtype_is_quantized(dt) ? tide_dtype_block(dt) : 0; }

/* ------------------------------------------------------------- decoder */

/* Bit-exact with tide_f16_to_f32 (as cuda_kernels.cu's conversion). */
__device__ __forceinline__ float tq_f16(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t o = (h & 0x7fffu) << 13;
    uint32_t e = o & 0x0f800000u;
    o += 0x38000000u;
    if (e == 0x0f800000u)
        o += 0x38000000u;
    else if (e == 0)
        o = __float_as_uint(__fsub_rn(__uint_as_float(o + 0x00800000u), __uint_as_float(0x38800000u)));
    return __uint_as_float(o | sign);
}

/* A block's f16 at byte offset off (even: every block type keeps them 2-aligned). */
__device__ __forceinline__ float tq_half_at(const uint8_t *blk, int off) {
    return tq_f16(*(const uint16_t *)(blk + off));
}

/* Sub-block j's 6-bit scale and min of a Q4_K / Q5_K block (the packing of
 * tide_q4k_scale_min, src/core/quant_blocks.h). */
__device__ __forceinline__ void tq_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Unit u (elements 8u .. 8u + 7) of a row of type DT, as f32 (cuda_quant.h). */
template <int DT>
__device__ __forceinline__ void tq_unit(const uint8_t *row, int64_t u, float *w) {
    if (DT == TIDE_Q8_0 || DT == TIDE_Q4_0) {
        const int64_t b = u >> 2;
        const int e = (int)(u & 3) * 8;
        if (DT == TIDE_Q8_0) {
            const uint8_t *blk = row + b * 34;
            const float d = tq_half_at(blk, 0);
            const int8_t *qs = (const int8_t *)(blk + 2) + e;
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = __fmul_rn((float)qs[i], d);
        } else {
            const uint8_t *blk = row + b * 18;
            const float d = tq_half_at(blk, 0);
            const uint8_t *qs = blk + 2 + (e & 15);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int q = e < 16 ? (qs[i] & 15) : (qs[i] >> 4);
                w[i] = __fmul_rn((float)(q - 8), d);
            }
        }
        return;
    }
    const int64_t b = u >> 5;
    const int e = (int)(u & 31) * 8;
    if (DT == TIDE_Q4_K || DT == TIDE_Q5_K) {
        const uint8_t *blk = row + b * (DT == TIDE_Q4_K ? 144 : 176);
        const float d = tq_half_at(blk, 0), dmin = tq_half_at(blk, 2);
        const int g = e >> 6, hi = (e >> 5) & 1, l0 = e & 31, j = 2 * g + hi;
        int sc, m;
        tq_scale_min(j, blk + 4, &sc, &m);
        const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const uint8_t *qs = blk + (DT == TIDE_Q4_K ? 16 : 48) + 32 * g + l0;
        const uint8_t *qh = blk + 16 + l0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = hi ? (qs[i] >> 4) : (qs[i] & 15);
            if (DT == TIDE_Q5_K) q += ((qh[i] >> j) & 1) << 4;
            w[i] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
        }
        return;
    }
    /* Q6_K */
    const uint8_t *blk = row + b * 210;
    const int h = e >> 7, r = e & 127, k = r >> 5, l0 = r & 31;
    const float d = tq_half_at(blk, 208);
    const int sc = ((const int8_t *)(blk + 192))[8 * h + (l0 >> 4) + 2 * k];
    const float dd = __fmul_rn(d, (float)sc);
    const uint8_t *ql = blk + 64 * h + l0 + (k & 1) * 32, *qh = blk + 128 + 32 * h + l0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int lo = k >= 2 ? (ql[i] >> 4) : (ql[i] & 15);
        const int q = (lo | (((qh[i] >> (2 * k)) & 3) << 4)) - 32;
        w[i] = __fmul_rn(dd, (float)q);
    }
}

/* ------------------------------------------------------------- tiles */

/* A thread per unit of the tile: dst row i = weight row n0 + i. VEC: dst
 * 16-byte aligned (the tile's rows are too: K * 2 is a multiple of 64), so
 * a unit is two float4 stores (f32) or one uint4 (bf16). */
template <int DT, bool BF16, bool VEC>
__global__ void k_qdequant(const uint8_t *w, int64_t rb, int64_t K, int64_t n0, int64_t cnt, void *dst) {
    const int64_t upr = K / 8, n = cnt * upr;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / upr, u = i % upr;
        float v[8];
        tq_unit<DT>(w + (n0 + r) * rb, u, v);
        if (BF16) {
            uint16_t h[8];
#pragma unroll
            for (int c = 0; c < 8; c++) h[c] = __bfloat16_as_ushort(__float2bfloat16_rn(v[c]));
            uint16_t *o = (uint16_t *)dst + r * K + 8 * u;
            if (VEC) {
                *(uint4 *)o = make_uint4(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16,
                                         h[4] | (uint32_t)h[5] << 16, h[6] | (uint32_t)h[7] << 16);
            } else {
#pragma unroll
                for (int c = 0; c < 8; c++) o[c] = h[c];
            }
        } else {
            float *o = (float *)dst + r * K + 8 * u;
            if (VEC) {
                ((float4 *)o)[0] = make_float4(v[0], v[1], v[2], v[3]);
                ((float4 *)o)[1] = make_float4(v[4], v[5], v[6], v[7]);
            } else {
#pragma unroll
                for (int c = 0; c < 8; c++) o[c] = v[c];
            }
        }
    }
}

template <int DT>
static void launch_qdequant(cudaStream_t s, const uint8_t *w, int64_t rb, int64_t K, int64_t n0, int64_t cnt,
                            void *dst, bool bf16) {
    const unsigned g = tq_grid(cnt * (K / 8), TQ_BLOCK);
    const bool vec = ((uintptr_t)dst & 15) == 0;
    if (bf16) {
        if (vec) k_qdequant<DT, true, true><<<g, TQ_BLOCK, 0, s>>>(w, rb, K, n0, cnt, dst);
        else k_qdequant<DT, true, false><<<g, TQ_BLOCK, 0, s>>>(w, rb, K, n0, cnt, dst);
    } else {
        if (vec) k_qdequant<DT, false, true><<<g, TQ_BLOCK, 0, s>>>(w, rb, K, n0, cnt, dst);
        else k_qdequant<DT, false, false><<<g, TQ_BLOCK, 0, s>>>(w, rb, K, n0, cnt, dst);
    }
}

extern "C" cudaError_t tcu_qdequant(cudaStream_t s, const void *w, tide_dtype dt, int64_t K, int64_t n0,
                                    int64_t cnt, void *dst, bool bf16) {
    const int qk = tq_qk(dt);
    if (!qk || K <= 0 || K % qk) return cudaErrorInvalidValue;
    if (cnt <= 0) return cudaSuccess;
    const uint8_t *wb = (const uint8_t *)w;
    const int64_t rb = (int64_t)tide_dtype_bytes(dt, (uint64_t)K);
    switch (dt) {
    case TIDE_Q8_0: launch_qdequant<TIDE_Q8_0>(s, wb, rb, K, n0, cnt, dst, bf16); break;
    case TIDE_Q4_0: launch_qdequant<TIDE_Q4_0>(s, wb, rb, K, n0, cnt, dst, bf16); break;
    case TIDE_Q4_K: launch_qdequant<TIDE_Q4_K>(s, wb, rb, K, n0, cnt, dst, bf16); break;
    case TIDE_Q5_K: launch_qdequant<TIDE_Q5_K>(s, wb, rb, K, n0, cnt, dst, bf16); break;
    default: launch_qdequant<TIDE_Q6_K>(s, wb, rb, K, n0, cnt, dst, bf16); break;
    }
    return cudaGetLastError();
}

/* ------------------------------------------------------------- GEMV */

__device__ __forceinline__ float tq_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TQ_FULL_MASK, v, o);
    return v;
}

/* A warp per weight row n; TCU_QGEMV_R rows of x at a time (the weight row
 * is read once per group). VEC: x 16-byte aligned, so a unit's 8
 * activations of a row are two float4 loads (K is a multiple of 32). */
template <int DT, bool VEC>
__global__ void __launch_bounds__(TQ_WARPS * 32, 4) k_qgemv(const float *x, const uint8_t *w, int64_t rb, int64_t R,
                                                         int64_t K, int64_t N, float *out, int64_t ldo) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * TQ_WARPS + (threadIdx.x >> 5);
    if (n >= N) return; /* whole warps leave together */
    const uint8_t *row = w + n * rb;
    const int64_t units = K / 8;
    for (int64_t r0 = 0; r0 < R; r0 += TCU_QGEMV_R) {
        const int nr = (int)(R - r0 < TCU_QGEMV_R ? R - r0 : TCU_QGEMV_R);
        const float *xb = x + r0 * K;
        float acc[TCU_QGEMV_R];
#pragma unroll
        for (int r = 0; r < TCU_QGEMV_R; r++) acc[r] = 0.0f;
        for (int64_t u = lane; u < units; u += 32) {
            float wv[8];
            tq_unit<DT>(row, u, wv);
#pragma unroll
            for (int r = 0; r < TCU_QGEMV_R; r++) {
                if (r < nr) {
                    const float *xp = xb + r * K + 8 * u;
                    float xv[8];
                    if (VEC) {
                        const float4 a = __ldg((const float4 *)xp), c = __ldg((const float4 *)xp + 1);
                        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
                        xv[4] = c.x, xv[5] = c.y, xv[6] = c.z, xv[7] = c.w;
                    } else {
#pragma unroll
                        for (int i = 0; i < 8; i++) xv[i] = xp[i];
                    }
                    float t = acc[r];
#pragma unroll
                    for (int i = 0; i < 8; i++) t = fmaf(xv[i], wv[i], t);
                    acc[r] = t;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < TCU_QGEMV_R; r++) {
            const float v = tq_warp_sum(acc[r]);
            if (r < nr && lane == r) out[(r0 + r) * ldo + n] = v;
        }
    }
}

template <int DT>
static void launch_qgemv(cudaStream_t s, const float *x, const uint8_t *w, int64_t rb, int64_t R, int64_t K,
                         int64_t N, float *out, int64_t ldo) {
    const unsigned g = (unsigned)((N + TQ_WARPS - 1) / TQ_WARPS);
    if (((uintptr_t)x & 15) == 0) k_qgemv<DT, true><<<g, TQ_WARPS * 32, 0, s>>>(x, w, rb, R, K, N, out, ldo);
    else k_qgemv<DT, false><<<g, TQ_WARPS * 32, 0, s>>>(x, w, rb, R, K, N, out, ldo);
}

extern "C" cudaError_t tcu_qgemv(cudaStream_t s, const float *x, const void *w, tide_dtype dt, int64_t R, int64_t K,
                                 int64_t N, float *out, int64_t ldo) {
    const int qk = tq_qk(dt);
    if (!qk || K <= 0 || K % qk || N >= ((int64_t)1 << 31) * TQ_WARPS) return cudaErrorInvalidValue;
    if (R <= 0 || N <= 0) return cudaSuccess;
    const uint8_t *wb = (const uint8_t *)w;
    const int64_t rb = (int64_t)tide_dtype_bytes(dt, (uint64_t)K);
    switch (dt) {
    case TIDE_Q8_0: launch_qgemv<TIDE_Q8_0>(s, x, wb, rb, R, K, N, out, ldo); break;
    case TIDE_Q4_0: launch_qgemv<TIDE_Q4_0>(s, x, wb, rb, R, K, N, out, ldo); break;
    case TIDE_Q4_K: launch_qgemv<TIDE_Q4_K>(s, x, wb, rb, R, K, N, out, ldo); break;
    case TIDE_Q5_K: launch_qgemv<TIDE_Q5_K>(s, x, wb, rb, R, K, N, out, ldo); break;
    default: launch_qgemv<TIDE_Q6_K>(s, x, wb, rb, R, K, N, out, ldo); break;
    }
    return cudaGetLastError();
}

/* ------------------------------------------------------------- embed */

/* A block per token, threads over the row's units. */
template <int DT>
__global__ void k_qembed(const uint8_t *table, int64_t rb, int64_t V, int64_t D, int64_t vocab0, bool first,
                         const int32_t *tokens, int64_t R, float *out) {
    const int64_t units = D / 8;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const int64_t id = (int64_t)tokens[r] - vocab0;
        float *o = out + r * D;
        if (id >= 0 && id < V) {
            for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
                float v[8];
                tq_unit<DT>(table + id * rb, u, v);
#pragma unroll
                for (int c = 0; c < 8; c++) o[8 * u + c] = v[c];
            }
        } else if (first) {
            for (int64_t i = threadIdx.x; i < D; i += blockDim.x) o[i] = 0.0f;
        }
    }
}

extern "C" cudaError_t tcu_qembed(cudaStream_t s, const void *table, tide_dtype dt, int64_t V, int64_t D,
                                  int64_t vocab0, bool first, const int32_t *tokens, int64_t R, float *out) {
    const int qk = tq_qk(dt);
    if (!qk || D <= 0 || D % qk) return cudaErrorInvalidValue;
    if (R <= 0) return cudaSuccess;
    const unsigned g = (unsigned)(R < TQ_MAX_GRID ? R : TQ_MAX_GRID);
    const uint8_t *tb = (const uint8_t *)table;
    const int64_t rb = (int64_t)tide_dtype_bytes(dt, (uint64_t)D);
    switch (dt) {
    case TIDE_Q8_0: k_qembed<TIDE_Q8_0><<<g, TQ_BLOCK, 0, s>>>(tb, rb, V, D, vocab0, first, tokens, R, out); break;
    case TIDE_Q4_0: k_qembed<TIDE_Q4_0><<<g, TQ_BLOCK, 0, s>>>(tb, rb, V, D, vocab0, first, tokens, R, out); break;
    case TIDE_Q4_K: k_qembed<TIDE_Q4_K><<<g, TQ_BLOCK, 0, s>>>(tb, rb, V, D, vocab0, first, tokens, R, out); break;
    case TIDE_Q5_K: k_qembed<TIDE_Q5_K><<<g, TQ_BLOCK, 0, s>>>(tb, rb, V, D, vocab0, first, tokens, R, out); break;
    default: k_qembed<TIDE_Q6_K><<<g, TQ_BLOCK, 0, s>>>(tb, rb, V, D, vocab0, first, tokens, R, out); break;
    }
    return cudaGetLastError();
}
