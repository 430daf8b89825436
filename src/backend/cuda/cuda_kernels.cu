/*
 * cuda_kernels.cu - the CUDA backend's kernels (cuda_kernels.h), one per op
 * kind, with the CPU kernels' semantics (src/backend/cpu/kernels.c).
 *
 * Layout of the work:
 *   - elementwise ops (convert, ADD, SILU_MUL, GENERIC): grid-stride loops;
 *   - row ops (EMBED, RMSNORM, ARGMAX): a block per row, threads over the row;
 *     RMSNORM and ARGMAX reduce through warp shuffles and a shared-memory
 *     stage in an order fixed by thread index;
 *   - MATMUL without BLAS: a warp per weight row, lanes over K, up to
 *     TCU_MATMUL_FUSED_R rows of x at a time (the x rows stay in L1/L2);
 *   - ATTENTION, an online softmax (running max m, running sum l) over key
 *     tiles in ascending order, by one of two kernels:
 *     for prefill (many queries, head_dim <= 128) a block of 256 threads per
 *     (batch, head, 64 queries) stages tiles of 64 keys and values in shared
 *     memory once for all 64 queries and computes S = Q K^T and P.V as
 *     register-tiled products (4 x 4 scores per thread, a row's softmax
 *     reduced over its half-warp); for decoding (and head_dim > 128) a block
 *     of 128 threads per (batch, query, head): the query in shared memory,
 *     keys in tiles of 128 (a warp per key computes a score, lanes over
 *     head_dim) and P.V accumulated by threads over head_dim.
 *
 * Determinism: no reduction uses atomics; every sum is a sequence per thread
 * followed by a butterfly (xor) shuffle tree and a tree over warps, fixed by
 * the block size alone. (A butterfly leaves the same bits in every lane: each
 * step adds the same two values, in either order.) The only atomic is the
 * range check's atomicMin, whose result does not depend on order.
 *
 * Numerics: weights are converted exactly. ROPE's powf/cosf/sinf and
 * SILU_MUL's expf are evaluated in double and rounded once, which reproduces
 * the CPU's (glibc's, below 1 ulp) results in all but rare cases; products
 * and sums the CPU rounds separately are rounded separately here too
 * (__fmul_rn / __fadd_rn keep nvcc from fusing them). Attention and matmul
 * sum in a different order than the CPU (f32, as the CPU) and agree within
 * rounding.
 */
#include "backend/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TCU_BLOCK 256
#define TCU_MAX_GRID (1 << 20)
#define TCU_ATTN_BLOCK 128
#define FULL_MASK 0xffffffffu

static unsigned grid_for(int64_t n, int block) {
    int64_t g = (n + block - 1) / block;
    if (g < 1) g = 1;
    if (g > TCU_MAX_GRID) g = TCU_MAX_GRID;
    return (unsigned)g;
}

/* ------------------------------------------------------------- conversion */

/* Bit-exact with tide_f16_to_f32 / the CPU's h2f: rebias the exponent; inf
 * and NaN keep their payload; subnormals become normal f32 exactly. */
__device__ __forceinline__ float f16_to_f32(uint32_t h) {
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

__device__ __forceinline__ float bf16_to_f32(uint32_t h) { return __uint_as_float(h << 16); }

/* Element i of a weight of dtype DT as f32. */
template <int DT>
__device__ __forceinline__ float load_w(const void *w, int64_t i) {
    if (DT == TIDE_F32) return ((const float *)w)[i];
    uint32_t h = ((const uint16_t *)w)[i];
    return DT == TIDE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* Eight consecutive weights from a 16-byte aligned address, in two steps so
 * that several loads can be in flight before their values are needed: the
 * raw bits (one 16-byte load, two for f32), then their values. */
template <int DT>
__device__ __forceinline__ void load_raw8(const void *w, int64_t i, uint4 *r) {
    if (DT == TIDE_F32) {
        const uint4 *p = (const uint4 *)((const float *)w + i);
        r[0] = p[0];
        r[1] = p[1];
    } else {
        r[0] = *(const uint4 *)((const uint16_t *)w + i);
    }
}

template <int DT>
__device__ __forceinline__ void decode8(const uint4 *r, float *o) {
    if (DT == TIDE_F32) {
        const uint32_t v[8] = {r[0].x, r[0].y, r[0].z, r[0].w, r[1].x, r[1].y, r[1].z, r[1].w};
        for (int j = 0; j < 8; j++) o[j] = __uint_as_float(v[j]);
        return;
    }
    const uint32_t v[4] = {r[0].x, r[0].y, r[0].z, r[0].w};
    for (int j = 0; j < 4; j++) {
        uint32_t lo = v[j] & 0xffffu, hi = v[j] >> 16;
        o[2 * j] = DT == TIDE_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
        o[2 * j + 1] = DT == TIDE_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
    }
}

template <int DT>
__global__ void k_convert(const void *src, float *dst, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = load_w<DT>(src, i);
}

extern "C" cudaError_t tcu_convert(cudaStream_t s, const void *src, tide_dtype dt, float *dst, int64_t n) {
    if (n <= 0) return cudaSuccess;
    unsigned g = grid_for(n, TCU_BLOCK);
    switch (dt) {
    case TIDE_F32: return cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, s);
    case TIDE_F16: k_convert<TIDE_F16><<<g, TCU_BLOCK, 0, s>>>(src, dst, n); break;
    case TIDE_BF16: k_convert<TIDE_BF16><<<g, TCU_BLOCK, 0, s>>>(src, dst, n); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ------------------------------------------------------------- reductions */

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the same bits. sh holds 32 values; the call begins with a
 * barrier, so sh may be reused from one call to the next. */
template <typename T>
__device__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : (T)0;
    return warp_sum(v);
}

__device__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

/* ------------------------------------------------------------- range check */

__global__ void k_range_check(const int32_t *ids, int64_t n, int64_t hi, int32_t *flag) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int32_t v = ids[i];
        if (v < 0 || (int64_t)v >= hi) atomicMin(flag, (int32_t)i);
    }
}

extern "C" cudaError_t tcu_range_check(cudaStream_t s, const int32_t *ids, int64_t n, int64_t hi, int32_t *flag) {
    cudaError_t e = cudaMemsetAsync(flag, 0x7f, sizeof(int32_t), s); /* TCU_FLAG_OK */
    if (e != cudaSuccess || n <= 0) return e;
    k_range_check<<<grid_for(n, TCU_BLOCK), TCU_BLOCK, 0, s>>>(ids, n, hi, flag);
    return cudaGetLastError();
}

/* The first thread to find a bad id claims the record (kind 0 -> kind) and
 * fills it; a record already claimed, by this launch or an earlier one, is
 * left as it is. */
__global__ void k_range_record(const int32_t *ids, int64_t n, int64_t hi, int32_t kind, int64_t base,
                               int32_t *rec) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int32_t v = ids[i];
        if ((v < 0 || (int64_t)v >= hi) && atomicCAS(rec, 0, kind) == 0) {
            rec[1] = (int32_t)(base + i < INT32_MAX ? base + i : INT32_MAX);
            rec[2] = v;
            rec[3] = (int32_t)(hi < INT32_MAX ? hi : INT32_MAX);
        }
    }
}

extern "C" cudaError_t tcu_range_record(cudaStream_t s, const int32_t *ids, int64_t n, int64_t hi, int32_t kind,
                                        int64_t base, int32_t *rec) {
    if (n <= 0) return cudaSuccess;
    if (kind == 0) return cudaErrorInvalidValue;
    k_range_record<<<grid_for(n, TCU_BLOCK), TCU_BLOCK, 0, s>>>(ids, n, hi, kind, base, rec);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- embed, norm */

template <int DT>
__global__ void k_embed(const void *table, int64_t V, int64_t D, int64_t vocab0, bool first,
                        const int32_t *tokens, int64_t R, float *out) {
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        int64_t id = (int64_t)tokens[r] - vocab0;
        float *o = out + r * D;
        if (id >= 0 && id < V) {
            for (int64_t i = threadIdx.x; i < D; i += blockDim.x) o[i] = load_w<DT>(table, id * D + i);
        } else if (first) {
            for (int64_t i = threadIdx.x; i < D; i += blockDim.x) o[i] = 0.0f;
        }
    }
}

extern "C" cudaError_t tcu_embed(cudaStream_t s, const void *table, tide_dtype dt, int64_t V, int64_t D,
                                 int64_t vocab0, bool first, const int32_t *tokens, int64_t R, float *out) {
    if (R <= 0 || D <= 0) return cudaSuccess;
    unsigned g = (unsigned)(R < TCU_MAX_GRID ? R : TCU_MAX_GRID);
    switch (dt) {
    case TIDE_F32: k_embed<TIDE_F32><<<g, TCU_BLOCK, 0, s>>>(table, V, D, vocab0, first, tokens, R, out); break;
    case TIDE_F16: k_embed<TIDE_F16><<<g, TCU_BLOCK, 0, s>>>(table, V, D, vocab0, first, tokens, R, out); break;
    case TIDE_BF16: k_embed<TIDE_BF16><<<g, TCU_BLOCK, 0, s>>>(table, V, D, vocab0, first, tokens, R, out); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <int DT>
__global__ void k_rmsnorm(const float *x, const void *w, int64_t R, int64_t D, float eps, float *out) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *xr = x + r * D;
        float *orow = out + r * D;
        double ss = 0;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            double v = (double)xr[i];
            ss = __dadd_rn(ss, __dmul_rn(v, v));
        }
        ss = block_sum(ss, sh);
        float rs = 1.0f / sqrtf(__fadd_rn((float)(ss / (double)D), eps));
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
            orow[i] = __fmul_rn(load_w<DT>(w, i), __fmul_rn(xr[i], rs)); /* own element: in place is safe */
    }
}

extern "C" cudaError_t tcu_rmsnorm(cudaStream_t s, const float *x, const void *w, tide_dtype wdt, int64_t R,
                                   int64_t D, float eps, float *out) {
    if (R <= 0 || D <= 0) return cudaSuccess;
    unsigned g = (unsigned)(R < TCU_MAX_GRID ? R : TCU_MAX_GRID);
    switch (wdt) {
    case TIDE_F32: k_rmsnorm<TIDE_F32><<<g, TCU_BLOCK, 0, s>>>(x, w, R, D, eps, out); break;
    case TIDE_F16: k_rmsnorm<TIDE_F16><<<g, TCU_BLOCK, 0, s>>>(x, w, R, D, eps, out); break;
    case TIDE_BF16: k_rmsnorm<TIDE_BF16><<<g, TCU_BLOCK, 0, s>>>(x, w, R, D, eps, out); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ------------------------------------------------------------- matmul */

#define MM_WARPS 8
#define MM_PIPE 4 /* 16-byte weight loads in flight per lane (the decode GEMV streams at bandwidth) */

/* out (R, N) = x (R, K) . w (N, K)^T; warp per weight row n. VEC: K % 8 == 0
 * and x, w 16-byte aligned, so each lane loads 8 weights and 2 float4 of x. */
template <int DT, bool VEC>
__global__ void __launch_bounds__(MM_WARPS * 32) k_matmul_fused(const float *x, const void *w, int64_t R,
                                                                 int64_t K, int64_t N, float *out, int64_t ldo) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (n >= N) return; /* whole warps leave together: no shuffle misses a lane */
    const int64_t wrow = n * K;
    for (int64_t r0 = 0; r0 < R; r0 += TCU_MATMUL_FUSED_R) {
        const int nr = (int)(R - r0 < TCU_MATMUL_FUSED_R ? R - r0 : TCU_MATMUL_FUSED_R);
        const float *xb = x + r0 * K;
        float acc[TCU_MATMUL_FUSED_R];
#pragma unroll
        for (int r = 0; r < TCU_MATMUL_FUSED_R; r++) acc[r] = 0.0f;
        if (VEC) {
            /* MM_PIPE steps of 256 weights: their loads first, then their
             * products in step order (each lane's sum in the order of k,
             * whatever MM_PIPE is) */
            for (int64_t k0 = (int64_t)lane * 8; k0 < K; k0 += MM_PIPE * 32 * 8) {
                uint4 raw[MM_PIPE][2];
#pragma unroll
                for (int j = 0; j < MM_PIPE; j++)
                    if (k0 + j * 256 < K) load_raw8<DT>(w, wrow + k0 + j * 256, raw[j]);
#pragma unroll
                for (int j = 0; j < MM_PIPE; j++) {
                    const int64_t k = k0 + j * 256;
                    if (k >= K) break;
                    float wv[8];
                    decode8<DT>(raw[j], wv);
#pragma unroll
                    for (int r = 0; r < TCU_MATMUL_FUSED_R; r++) {
                        if (r < nr) {
                            const float4 *xp = (const float4 *)(xb + r * K + k);
                            float4 a = xp[0], b = xp[1];
                            float t = acc[r];
                            t = fmaf(a.x, wv[0], t);
                            t = fmaf(a.y, wv[1], t);
                            t = fmaf(a.z, wv[2], t);
                            t = fmaf(a.w, wv[3], t);
                            t = fmaf(b.x, wv[4], t);
                            t = fmaf(b.y, wv[5], t);
                            t = fmaf(b.z, wv[6], t);
                            t = fmaf(b.w, wv[7], t);
                            acc[r] = t;
                        }
                    }
                }
            }
        } else {
            for (int64_t k = lane; k < K; k += 32) {
                float wv = load_w<DT>(w, wrow + k);
#pragma unroll
                for (int r = 0; r < TCU_MATMUL_FUSED_R; r++)
                    if (r < nr) acc[r] = fmaf(xb[r * K + k], wv, acc[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < TCU_MATMUL_FUSED_R; r++) {
            float v = warp_sum(acc[r]);
            if (r < nr && lane == r) out[(r0 + r) * ldo + n] = v;
        }
    }
}

template <int DT>
static void launch_matmul_fused(cudaStream_t s, const float *x, const void *w, int64_t R, int64_t K, int64_t N,
                                float *out, int64_t ldo) {
    unsigned g = (unsigned)((N + MM_WARPS - 1) / MM_WARPS);
    bool vec = K % 8 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w & 15) == 0;
    if (vec)
        k_matmul_fused<DT, true><<<g, MM_WARPS * 32, 0, s>>>(x, w, R, K, N, out, ldo);
    else
        k_matmul_fused<DT, false><<<g, MM_WARPS * 32, 0, s>>>(x, w, R, K, N, out, ldo);
}

extern "C" cudaError_t tcu_matmul_fused(cudaStream_t s, const float *x, const void *w, tide_dtype wdt, int64_t R,
                                        int64_t K, int64_t N, float *out, int64_t ldo) {
    if (R <= 0 || N <= 0) return cudaSuccess;
    switch (wdt) {
    case TIDE_F32: launch_matmul_fused<TIDE_F32>(s, x, w, R, K, N, out, ldo); break;
    case TIDE_F16: launch_matmul_fused<TIDE_F16>(s, x, w, R, K, N, out, ldo); break;
    case TIDE_BF16: launch_matmul_fused<TIDE_BF16>(s, x, w, R, K, N, out, ldo); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ------------------------------------------------------------- rope */

/* A thread per (row, i < hd/2): the angle's cos and sin once, then every
 * head of the row. INV: the rotation by minus the angle (sin negated,
 * exactly), ROPE_BWD's. */
template <bool INV>
__global__ void k_rope(const float *x, const int32_t *pos, int64_t R, int64_t T, int H, int hd, float theta,
                       bool il, float *out) {
    const int half = hd / 2;
    const int64_t D = (int64_t)H * hd, n = R * half;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = idx / half;
        int i = (int)(idx % half);
        float p = (float)pos[r % T];
        /* as HF and the CPU: inv_freq = 1 / theta ** ((2i) / hd) in f32 */
        float e = __fdiv_rn((float)(2 * i), (float)hd);
        float inv = __fdiv_rn(1.0f, (float)pow((double)theta, (double)e));
        float a = __fmul_rn(p, inv);
        float c = (float)cos((double)a), sn = (float)sin((double)a);
        if (INV) sn = -sn;
        for (int h = 0; h < H; h++) {
            const float *xr = x + r * D + (int64_t)h * hd;
            float *orow = out + r * D + (int64_t)h * hd;
            float x0 = il ? xr[2 * i] : xr[i], x1 = il ? xr[2 * i + 1] : xr[i + half];
            orow[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
            orow[i + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, sn));
        }
    }
}

extern "C" cudaError_t tcu_rope(cudaStream_t s, const float *x, const int32_t *pos, int64_t R, int64_t T, int H,
                                int hd, float theta, bool interleaved, float *out) {
    int64_t n = R * (hd / 2);
    if (n <= 0 || T <= 0) return cudaSuccess;
    k_rope<false><<<grid_for(n, TCU_BLOCK), TCU_BLOCK, 0, s>>>(x, pos, R, T, H, hd, theta, interleaved, out);
    return cudaGetLastError();
}

extern "C" cudaError_t tcu_rope_inverse(cudaStream_t s, const float *x, const int32_t *pos, int64_t R, int64_t T,
                                        int H, int hd, float theta, float *out) {
    int64_t n = R * (hd / 2);
    if (n <= 0 || T <= 0) return cudaSuccess;
    k_rope<true><<<grid_for(n, TCU_BLOCK), TCU_BLOCK, 0, s>>>(x, pos, R, T, H, hd, theta, false, out);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- attention */

/* KV cache element e (flat over (B, C, KV*hd)) of a cache of type CT, as
 * f32: f16 and bf16 widened exactly, q8_0 (34-byte blocks of 32 along a row)
 * as q * d, tide_dequantize_row's arithmetic. */
template <int CT>
__device__ __forceinline__ float kv_at(const void *c, int64_t e) {
    if (CT == TIDE_F32 || CT == TIDE_F16 || CT == TIDE_BF16) return load_w<CT>(c, e);
    const uint8_t *blk = (const uint8_t *)c + (e >> 5) * 34;
    return (float)(int8_t)blk[2 + (e & 31)] * f16_to_f32(*(const uint16_t *)blk);
}

/* Row x (n elements) written as a cache row of type CT at dst by the block's
 * threads: f16 / bf16 rounded to nearest even, q8_0 a block of 32 per thread
 * as tide_quantize_row (d = amax / 127 stored as f16, q = round(x / d)
 * through 1 / d, halves away from zero), so the bits are the CPU's. */
template <int CT>
__device__ void kv_put_row(const float *x, int64_t n, void *dst) {
    if (CT == TIDE_F32) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ((float *)dst)[i] = x[i];
    } else if (CT == TIDE_F16) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ((__half *)dst)[i] = __float2half_rn(x[i]);
    } else if (CT == TIDE_BF16) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(x[i]);
    } else {
        for (int64_t blk = threadIdx.x; blk < n / 32; blk += blockDim.x) {
            const float *xb = x + blk * 32;
            uint8_t *ob = (uint8_t *)dst + blk * 34;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
            const float d = __fdiv_rn(amax, 127.0f);
            const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
            *(__half *)ob = __float2half_rn(d);
            for (int i = 0; i < 32; i++) {
                float r = roundf(__fmul_rn(xb[i], id));
                if (!(r == r)) r = 0.0f;
                ob[2 + i] = (uint8_t)(int8_t)fmaxf(-127.0f, fminf(127.0f, r));
            }
        }
    }
}

/* A block per row (b, t): writes k/v row into the caches at pos[t] (rounded
 * to the cache's type CT), unless a later t' of the same batch row has the
 * same position (the CPU copies in order of t, so the last one stays). */
template <int CT>
__global__ void k_cache_write(const float *k, const float *v, const int32_t *pos, int64_t B, int64_t T,
                              int64_t C, int64_t kd, void *kcache, void *vcache) {
    const int64_t rb = CT == TIDE_F32 ? kd * 4 : CT == TIDE_Q8_0 ? kd / 32 * 34 : kd * 2; /* a row's bytes */
    for (int64_t row = blockIdx.x; row < B * T; row += gridDim.x) {
        int64_t b = row / T, t = row % T;
        int32_t p = pos[t];
        int later = 0;
        for (int64_t u = t + 1 + threadIdx.x; u < T; u += blockDim.x) later |= pos[u] == p;
        if (__syncthreads_or(later)) continue; /* uniform across the block */
        if (p < 0 || p >= C) continue;          /* not range-checked yet: writes nothing */
        kv_put_row<CT>(k + row * kd, kd, (char *)kcache + (b * C + p) * rb);
        kv_put_row<CT>(v + row * kd, kd, (char *)vcache + (b * C + p) * rb);
    }
}

static cudaError_t cache_write_dt(cudaStream_t s, const float *k, const float *v, const int32_t *pos, int64_t B,
                                  int64_t T, int64_t C, int64_t kd, int cache_dtype, void *kcache, void *vcache) {
    int64_t rows = B * T;
    if (rows <= 0 || kd <= 0) return cudaSuccess;
    unsigned g = (unsigned)(rows < TCU_MAX_GRID ? rows : TCU_MAX_GRID);
    switch (cache_dtype) {
    case TIDE_F32: k_cache_write<TIDE_F32><<<g, TCU_BLOCK, 0, s>>>(k, v, pos, B, T, C, kd, kcache, vcache); break;
    case TIDE_F16: k_cache_write<TIDE_F16><<<g, TCU_BLOCK, 0, s>>>(k, v, pos, B, T, C, kd, kcache, vcache); break;
    case TIDE_BF16: k_cache_write<TIDE_BF16><<<g, TCU_BLOCK, 0, s>>>(k, v, pos, B, T, C, kd, kcache, vcache); break;
    case TIDE_Q8_0:
        if (kd % 32) return cudaErrorInvalidValue;
        k_cache_write<TIDE_Q8_0><<<g, TCU_BLOCK, 0, s>>>(k, v, pos, B, T, C, kd, kcache, vcache);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t tcu_cache_write_dt(cudaStream_t s, const float *k, const float *v, const int32_t *pos,
                                          int64_t B, int64_t T, int64_t C, int64_t kd, int cache_dtype,
                                          void *kcache, void *vcache) {
    return cache_write_dt(s, k, v, pos, B, T, C, kd, cache_dtype, kcache, vcache);
}

extern "C" cudaError_t tcu_cache_write(cudaStream_t s, const float *k, const float *v, const int32_t *pos,
                                       int64_t B, int64_t T, int64_t C, int64_t kd, float *kcache,
                                       float *vcache) {
    return cache_write_dt(s, k, v, pos, B, T, C, kd, TIDE_F32, kcache, vcache);
}

/* Per-row kernel, for decoding (few queries) and head_dim > 128. */
#define ATT_TILE TCU_ATTN_BLOCK                       /* keys per tile: one score per thread */
#define ATT_PER_THREAD (TCU_ATTN_MAX_HD / TCU_ATTN_BLOCK) /* output elements per thread */

/* Block index -> (b, t, h), later queries (more keys) first. CT: the
 * caches' type (kv_at). */
template <int CT>
__global__ void __launch_bounds__(TCU_ATTN_BLOCK)
    k_attention(const float *q, const int32_t *pos, const void *kcache, const void *vcache, float *o,
                int64_t T, int64_t C, int H, int KV, int hd, float scale) {
    __shared__ float qs[TCU_ATTN_MAX_HD];
    __shared__ float S[ATT_TILE];
    __shared__ float red[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarp = TCU_ATTN_BLOCK / 32;
    const int64_t idx = blockIdx.x;
    const int h = (int)(idx % H);
    const int64_t rest = idx / H;
    const int64_t t = T - 1 - rest % T, b = rest / T;
    const int g = h / (H / KV);
    const int64_t qd = (int64_t)H * hd, kd = (int64_t)KV * hd;
    const int64_t row = b * T + t;
    const float *qr = q + row * qd + (int64_t)h * hd;
    for (int d = tid; d < hd; d += TCU_ATTN_BLOCK) qs[d] = qr[d];
    const int64_t kb = b * C * kd + (int64_t)g * hd; /* element of position 0 of the head */
    /* clamped to the cache, for positions whose range check is still queued */
    const int64_t nkeys = min(max((int64_t)pos[t] + 1, (int64_t)0), C);
    float acc[ATT_PER_THREAD];
#pragma unroll
    for (int i = 0; i < ATT_PER_THREAD; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    __syncthreads();
    for (int64_t j0 = 0; j0 < nkeys; j0 += ATT_TILE) {
        const int nk = (int)(nkeys - j0 < ATT_TILE ? nkeys - j0 : ATT_TILE);
        /* scores: a warp per key, lanes over head_dim */
        for (int jj = warp; jj < nk; jj += nwarp) {
            const int64_t kr = kb + (j0 + jj) * kd;
            float dot = 0.0f;
            for (int d = lane; d < hd; d += 32) dot = fmaf(qs[d], kv_at<CT>(kcache, kr + d), dot);
            dot = warp_sum(dot);
            if (lane == 0) S[jj] = __fmul_rn(dot, scale);
        }
        __syncthreads();
        float sv = tid < nk ? S[tid] : -INFINITY;
        float mx = block_max(sv, red);
        float mnew = mx > m ? mx : m;
        float p = tid < nk ? expf(sv - mnew) : 0.0f;
        float sum = block_sum(p, red);
        float corr = expf(m - mnew);
        l = l * corr + sum;
        m = mnew;
        if (tid < nk) S[tid] = p;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_PER_THREAD; i++) {
            int d = tid + i * TCU_ATTN_BLOCK;
            if (d < hd) {
                float a = acc[i] * corr;
                const int64_t vp = kb + j0 * kd + d;
                for (int jj = 0; jj < nk; jj++) a = fmaf(S[jj], kv_at<CT>(vcache, vp + jj * kd), a);
                acc[i] = a;
            }
        }
        __syncthreads(); /* S is rewritten by the next tile */
    }
    float *orow = o + row * qd + (int64_t)h * hd;
#pragma unroll
    for (int i = 0; i < ATT_PER_THREAD; i++) {
        int d = tid + i * TCU_ATTN_BLOCK;
        if (d < hd) orow[d] = acc[i] / l;
    }
}

/*
 * Query-tiled kernel, for prefill (T >= TCU_ATTN_TILED_MIN_T, hd <=
 * TCU_ATTN_TILED_MAX_HD). The per-row kernel reads every key and value once
 * per query row; here a block takes ATQ_ROWS consecutive query rows of one
 * (b, h) and streams tiles of ATQ_KEYS keys through shared memory once for
 * all of them, so the cache is read T / ATQ_ROWS times less and the work is
 * two small matrix products per tile, S = Q K^T and O += P V, done as in a
 * SIMT GEMM: each thread computes a 4 x 4 block of S and a 4 x (HD / 16)
 * block of O from float4 reads of shared memory (2 float4 reads per 16 FMAs
 * for S, 1 + HD / 64 per 4 * HD / 16 for P.V).
 *
 * Threads: 256 as 16 x 16, ty = tid / 16, tx = tid % 16. Thread (ty, tx) owns
 * query rows 4ty..4ty+3 of the tile throughout: in S the keys 4tx..4tx+3, in
 * O the head_dim columns 64g + 4tx + c. A row's 16 threads are one half-warp,
 * so its max and sum over the tile are 4-step xor shuffles within it, and the
 * row's running max m, sum l and rescale factor stay in registers (the same
 * bits in all 16 threads) for the P.V step that follows.
 *
 * Shared memory, HD = 64 or 128:
 *   Qs [HD][64]  the query tile transposed (d-major: a thread's 4 rows at one
 *                d are one float4, the same for its half-warp);
 *   Ks [HD][64]  the key tile transposed; once the scores are in registers
 *                it holds P [64 keys][64 rows] instead;
 *   Vs [64][HD]  the value tile as in the cache.
 * Columns d from hd to hd rounded up to 32 are zero, so the score loop runs
 * in whole steps of 32. 3 * 64 * HD floats: 96 KiB at HD = 128 (below the
 * 99 KiB a block may opt in to on every sm_80+ device), 48 KiB at 64. Ks
 * and P permute the float4 chunks of each row (atq_at): row d of Ks by
 * (d >> 2) & 7, row j of P by (j >> 2) & 7. float4 accesses stay whole, and
 * the transposing stores of K (a warp writes 4 columns x 32 rows d) and the
 * stores of P (a half-warp writes 16 rows j = 4tx + c) fall in distinct
 * banks instead of 4 or 2; reads of a row by 16 threads still cover it once.
 *
 * Masking: key j counts for a row iff j <= its position. Key tiles go from 0
 * to the largest position among the tile's rows, in ascending order; key 0 is
 * in every row's range, so m is finite after the first tile and later tiles
 * out of a row's range leave it exactly as it was (p = 0, rescale by 1).
 * Scores out of range are replaced, never computed on, and P.V stops at each
 * row's last key, so cache rows past a row's position (stale, perhaps never
 * written) do not reach it. Rows of the last tile past T compute with
 * position 0 and are not stored, so every thread reaches every barrier.
 *
 * Per row the sums run in a fixed order (d ascending for a score, keys
 * ascending for O, the butterfly for the row sum), independent of the other
 * rows and of the launch, so results are the same bits on every run.
 */
#define ATQ_ROWS 64     /* query rows per block (16 ty x 4) */
#define ATQ_KEYS 64     /* keys per tile (16 tx x 4); both are the 64 of the layouts */
#define ATQ_THREADS 256 /* 16 x 16 */
#define ATQ_SMEM(HD) ((size_t)3 * 64 * (HD) * sizeof(float))

/* Offset of (r, c) in a [.][64] tile whose row r has its float4 chunks
 * permuted by k: c ^ ((k & 7) << 2) keeps 4 aligned columns together. */
__device__ __forceinline__ int atq_at(int r, int c, int k) { return r * 64 + (c ^ ((k & 7) << 2)); }

/* dst [HD][64] = src rows 0..n-1 (ld floats apart), columns 0..hd-1,
 * transposed: element (r, d) at atq_at(d, r, d >> 2) when SWZ, else at
 * d * 64 + r; zero for rows n..63 and columns hd..dpad-1 (dpad = hd rounded
 * up to 32). A warp moves 4 rows x 32 columns, 4 per lane (one float4 when
 * vec: hd % 4 == 0 and src 16-byte aligned): 4 cache lines of global memory;
 * with SWZ each of its 4 stores covers the 32 banks (lane (r, e) writes row
 * d = 4e + c, chunk (r / 4) ^ e), without it they conflict 8 ways, which the
 * query tile, stored once per block, can afford. */
template <bool SWZ, int CT>
__device__ __forceinline__ void atq_load_t(float *dst, const void *base, int64_t off, int64_t ld, int n, int hd,
                                           int dpad, bool vec) {
    const int nw = dpad / 32 * 512;
    for (int w = threadIdx.x; w < nw; w += ATQ_THREADS) {
        const int lane = w & 31, grp = w >> 5;
        const int r = ((grp & 15) << 2) + (lane >> 3), d = ((grp >> 4) << 5) + ((lane & 7) << 2);
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < n) {
            const int64_t sp = off + r * ld + d;
            if (CT == TIDE_F32 && vec) {
                if (d < hd) {
                    const float4 v = *(const float4 *)((const float *)base + sp);
                    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
                }
            } else {
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if (d + c < hd) x[c] = kv_at<CT>(base, sp + c);
            }
        }
#pragma unroll
        for (int c = 0; c < 4; c++) dst[SWZ ? atq_at(d + c, r, d >> 2) : (d + c) * 64 + r] = x[c];
    }
}

/* Block index -> (query tile, b, h), later tiles (more keys) first. CT:
 * the caches' type (kv_at; float4 loads for f32 caches only). */
template <int HD, int CT>
__global__ void __launch_bounds__(ATQ_THREADS, 2)
    k_attention_tiled(const float *q, const int32_t *pos, const void *kcache, const void *vcache, float *o,
                      int64_t B, int64_t T, int64_t C, int H, int KV, int hd, float scale, bool vec) {
    extern __shared__ float4 atq_smem[];
    float *Qs = (float *)atq_smem, *Ks = Qs + HD * 64, *Vs = Ks + HD * 64, *Ps = Ks;
    const int NG = HD / 64; /* groups of 64 output columns */
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4, lane = tid & 31;
    const int64_t nbh = B * H, ntile = (T + ATQ_ROWS - 1) / ATQ_ROWS;
    const int64_t bh = blockIdx.x % nbh, t0 = (ntile - 1 - blockIdx.x / nbh) * ATQ_ROWS;
    const int h = (int)(bh % H);
    const int64_t b = bh / H;
    const int g = h / (H / KV);
    const int64_t qd = (int64_t)H * hd, kd = (int64_t)KV * hd;
    const int nq = (int)(T - t0 < ATQ_ROWS ? T - t0 : ATQ_ROWS);
    const int64_t kb = b * C * kd + (int64_t)g * hd; /* element of position 0 of the head */
    const float *vb = (const float *)vcache + kb;   /* f32 caches' float4 path */

    /* keys 0..kmax: the tile's largest position, the same in every warp */
    int kmax = 0;
    for (int r = lane; r < nq; r += 32) kmax = max(kmax, (int)pos[t0 + r]);
    for (int x = 16; x > 0; x >>= 1) kmax = max(kmax, __shfl_xor_sync(FULL_MASK, kmax, x));
    /* clamped to the cache, for positions whose range check is still queued */
    const int64_t nkeys = min((int64_t)kmax + 1, C);

    int prow[4];
    float m[4], l[4], acc[4][4 * NG];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        prow[i] = 4 * ty + i < nq ? (int)pos[t0 + 4 * ty + i] : 0;
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < 4 * NG; e++) acc[i][e] = 0.0f;
    }
    const int dpad = (hd + 31) & ~31; /* Qs, Ks columns hd..dpad-1 are zero */
    atq_load_t<false, TIDE_F32>(Qs, q, (b * T + t0) * qd + (int64_t)h * hd, qd, nq, hd, dpad, vec);

    for (int64_t j0 = 0; j0 < nkeys; j0 += ATQ_KEYS) {
        const int nk = (int)(nkeys - j0 < ATQ_KEYS ? nkeys - j0 : ATQ_KEYS);
        __syncthreads(); /* the previous tile's P and V are consumed */
        atq_load_t<true, CT>(Ks, kcache, kb + j0 * kd, kd, nk, hd, dpad, vec);
        if (CT == TIDE_F32 && vec) {
            for (int w = tid; w < ATQ_KEYS * HD / 4; w += ATQ_THREADS) {
                const int j = w / (HD / 4), d = w % (HD / 4) * 4;
                float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (j < nk && d < hd) x = *(const float4 *)&vb[(j0 + j) * kd + d];
                *(float4 *)&Vs[j * HD + d] = x;
            }
        } else {
            for (int w = tid; w < ATQ_KEYS * HD; w += ATQ_THREADS) {
                const int j = w / HD, d = w % HD;
                Vs[w] = j < nk && d < hd ? kv_at<CT>(vcache, kb + (j0 + j) * kd + d) : 0.0f;
            }
        }
        __syncthreads();

        /* S = Q K^T for rows 4ty+i, keys 4tx+c; d in steps of 32 so that the
         * swizzle of row d of Ks, (d >> 2) & 7, is a constant of the unrolled
         * body and every address an immediate offset */
        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[i][c] = 0.0f;
        for (int d0 = 0; d0 < dpad; d0 += 32) {
#pragma unroll
            for (int k = 0; k < 32; k++) {
                const float4 qv = *(const float4 *)&Qs[(d0 + k) * 64 + 4 * ty];
                const float4 kv = *(const float4 *)&Ks[atq_at(d0 + k, 4 * tx, k >> 2)];
                const float qa[4] = {qv.x, qv.y, qv.z, qv.w}, ka[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int c = 0; c < 4; c++) s[i][c] = fmaf(qa[i], ka[c], s[i][c]);
            }
        }
        __syncthreads(); /* Ks is free: P goes there */

        /* online softmax per row, over its half-warp */
        float corr[4];
        int lim[4], jlo = nk, jhi = 0; /* row i uses keys jj < lim[i] of this tile */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t last = (int64_t)prow[i] - j0; /* last key of the row, tile-relative */
            float mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                s[i][c] = 4 * tx + c <= last ? __fmul_rn(s[i][c], scale) : -INFINITY;
                mx = fmaxf(mx, s[i][c]);
            }
            for (int x = 8; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, x));
            const float mnew = fmaxf(m[i], mx);
            float sum = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                s[i][c] = 4 * tx + c <= last ? expf(s[i][c] - mnew) : 0.0f;
                sum += s[i][c];
            }
            for (int x = 8; x > 0; x >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, x);
            corr[i] = expf(m[i] - mnew);
            l[i] = l[i] * corr[i] + sum;
            m[i] = mnew;
            lim[i] = (int)(last < 0 ? 0 : last >= nk ? nk : last + 1);
            jlo = min(jlo, lim[i]);
            jhi = max(jhi, lim[i]);
        }
#pragma unroll
        for (int c = 0; c < 4; c++)
            *(float4 *)&Ps[atq_at(4 * tx + c, 4 * ty, tx)] = make_float4(s[0][c], s[1][c], s[2][c], s[3][c]);
        __syncthreads();

        /* O = O * corr + P V; keys every row of the thread uses, then the
         * ragged end where some rows have stopped */
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4 * NG; e++) acc[i][e] *= corr[i];
        int jj = 0;
#pragma unroll 4
        for (; jj < jlo; jj++) {
            const float4 pv = *(const float4 *)&Ps[atq_at(jj, 4 * ty, jj >> 2)];
            const float pa[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
            for (int gi = 0; gi < NG; gi++) {
                const float4 vv = *(const float4 *)&Vs[jj * HD + 64 * gi + 4 * tx];
                const float va[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[i][4 * gi + c] = fmaf(pa[i], va[c], acc[i][4 * gi + c]);
            }
        }
        for (; jj < jhi; jj++) {
            const float4 pv = *(const float4 *)&Ps[atq_at(jj, 4 * ty, jj >> 2)];
            const float pa[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
            for (int gi = 0; gi < NG; gi++) {
                const float4 vv = *(const float4 *)&Vs[jj * HD + 64 * gi + 4 * tx];
                const float va[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (jj < lim[i])
#pragma unroll
                        for (int c = 0; c < 4; c++) acc[i][4 * gi + c] = fmaf(pa[i], va[c], acc[i][4 * gi + c]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (4 * ty + i >= nq) continue;
        float *orow = o + (b * T + t0 + 4 * ty + i) * qd + (int64_t)h * hd;
#pragma unroll
        for (int gi = 0; gi < NG; gi++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int d = 64 * gi + 4 * tx + c;
                if (d < hd) orow[d] = acc[i][4 * gi + c] / l[i];
            }
    }
}

template <int HD, int CT>
static cudaError_t attention_tiled(cudaStream_t s, const float *q, const int32_t *pos, const void *kcache,
                                   const void *vcache, float *o, int64_t B, int64_t T, int64_t C, int H, int KV,
                                   int hd, float scale) {
    /* float4 loads where every row start is 16-byte aligned */
    bool vec = hd % 4 == 0 && ((uintptr_t)q | (uintptr_t)kcache | (uintptr_t)vcache) % 16 == 0;
    /* above 48 KiB of dynamic shared memory a kernel must opt in (per device;
     * cheap, so done on every launch) */
    cudaError_t e = cudaFuncSetAttribute(k_attention_tiled<HD, CT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)ATQ_SMEM(HD));
    if (e != cudaSuccess) return e;
    unsigned nblk = (unsigned)(B * H * ((T + ATQ_ROWS - 1) / ATQ_ROWS));
    k_attention_tiled<HD, CT><<<nblk, ATQ_THREADS, ATQ_SMEM(HD), s>>>(q, pos, kcache, vcache, o, B, T, C, H, KV,
                                                                     hd, scale, vec);
    return cudaGetLastError();
}

template <int CT>
static cudaError_t attention_ct(cudaStream_t s, const float *q, const int32_t *pos, const void *kcache,
                                const void *vcache, float *o, int64_t B, int64_t T, int64_t C, int H, int KV, int hd,
                                bool rows_only) {
    const int64_t nblk = B * T * H;
    float scale = 1.0f / sqrtf((float)hd);
    if (!rows_only && T >= TCU_ATTN_TILED_MIN_T && hd <= TCU_ATTN_TILED_MAX_HD) {
        cudaError_t e = hd <= 64 ? attention_tiled<64, CT>(s, q, pos, kcache, vcache, o, B, T, C, H, KV, hd, scale)
                                 : attention_tiled<128, CT>(s, q, pos, kcache, vcache, o, B, T, C, H, KV, hd, scale);
        /* a GPU that refuses the tiled kernel's shared memory takes the
         * per-row one; any other error is the caller's */
        if (e != cudaErrorInvalidValue) return e;
        (void)cudaGetLastError();
    }
    k_attention<CT><<<(unsigned)nblk, TCU_ATTN_BLOCK, 0, s>>>(q, pos, kcache, vcache, o, T, C, H, KV, hd, scale);
    return cudaGetLastError();
}

static cudaError_t attention_dt(cudaStream_t s, const float *q, const int32_t *pos, int cache_dtype,
                                const void *kcache, const void *vcache, float *o, int64_t B, int64_t T, int64_t C,
                                int H, int KV, int hd, bool rows_only) {
    int64_t nblk = B * T * H;
    if (nblk <= 0) return cudaSuccess;
    if (hd > TCU_ATTN_MAX_HD || nblk > 0x7fffffff || KV <= 0 || H % KV) return cudaErrorInvalidValue;
    switch (cache_dtype) {
    case TIDE_F32: return attention_ct<TIDE_F32>(s, q, pos, kcache, vcache, o, B, T, C, H, KV, hd, rows_only);
    case TIDE_F16: return attention_ct<TIDE_F16>(s, q, pos, kcache, vcache, o, B, T, C, H, KV, hd, rows_only);
    case TIDE_BF16: return attention_ct<TIDE_BF16>(s, q, pos, kcache, vcache, o, B, T, C, H, KV, hd, rows_only);
    case TIDE_Q8_0:
        if (hd % 32) return cudaErrorInvalidValue;
        return attention_ct<TIDE_Q8_0>(s, q, pos, kcache, vcache, o, B, T, C, H, KV, hd, rows_only);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t tcu_attention(cudaStream_t s, const float *q, const int32_t *pos, const float *kcache,
                                     const float *vcache, float *o, int64_t B, int64_t T, int64_t C, int H, int KV,
                                     int hd, bool rows_only) {
    return attention_dt(s, q, pos, TIDE_F32, kcache, vcache, o, B, T, C, H, KV, hd, rows_only);
}

extern "C" cudaError_t tcu_attention_dt(cudaStream_t s, const float *q, const int32_t *pos, int cache_dtype,
                                        const void *kcache, const void *vcache, float *o, int64_t B, int64_t T,
                                        int64_t C, int H, int KV, int hd, bool rows_only) {
    return attention_dt(s, q, pos, cache_dtype, kcache, vcache, o, B, T, C, H, KV, hd, rows_only);
}

/* ------------------------------------------------------------- elementwise */

__global__ void k_silu_mul(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        float e = (float)exp(-(double)g);
        out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, e)), up[i]);
    }
}

extern "C" cudaError_t tcu_silu_mul(cudaStream_t s, const float *gate, const float *up, float *out, int64_t n) {
    if (n <= 0) return cudaSuccess;
    k_silu_mul<<<grid_for(n, TCU_BLOCK), TCU_BLOCK, 0, s>>>(gate, up, out, n);
    return cudaGetLastError();
}

__global__ void k_add(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(a[i], b[i]);
}

__global__ void k_add_bias(const float *x, const void *b, tide_dtype bdt, int64_t N, float *out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = i % N;
        float bv = bdt == TIDE_F32 ? load_w<TIDE_F32>(b, c) : bdt == TIDE_F16 ? load_w<TIDE_F16>(b, c)
                                                                              : load_w<TIDE_BF16>(b, c);
        out[i] = __fadd_rn(x[i], bv);
    }
}

extern "C" cudaError_t tcu_add_bias(cudaStream_t s, const float *x, const void *b, tide_dtype bdt, int64_t R,
                                    int64_t N, float *out) {
    int64_t n = R * N;
    if (n <= 0) return cudaSuccess;
    k_add_bias<<<grid_for(n, TCU_BLOCK), TCU_BLOCK, 0, s>>>(x, b, bdt, N, out, n);
    return cudaGetLastError();
}

extern "C" cudaError_t tcu_add(cudaStream_t s, const float *a, const float *b, float *out, int64_t n) {
    if (n <= 0) return cudaSuccess;
    k_add<<<grid_for(n, TCU_BLOCK), TCU_BLOCK, 0, s>>>(a, b, out, n);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- argmax */

/* True if (v, i) comes before (bv, bi): any NaN before any number, the first
 * NaN among NaNs; among numbers the larger, the first on ties. A total order
 * with a unique winner, so any reduction tree gives the sequential answer. */
__device__ __forceinline__ bool am_better(float v, int64_t i, float bv, int64_t bi) {
    bool n = isnan(v), bn = isnan(bv);
    if (n != bn) return n;
    if (n || v == bv) return i < bi;
    return v > bv;
}

__global__ void k_argmax(const float *x, int64_t R, int64_t V, int32_t *out) {
    __shared__ float shv[32];
    __shared__ int64_t shi[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *xr = x + r * V;
        float bv = -INFINITY;
        int64_t bi = INT64_MAX;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
            if (am_better(xr[j], j, bv, bi)) {
                bv = xr[j];
                bi = j;
            }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(FULL_MASK, bv, o);
            int64_t oi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (am_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        __syncthreads();
        if (lane == 0) {
            shv[w] = bv;
            shi[w] = bi;
        }
        __syncthreads();
        if (w == 0) {
            bv = lane < nw ? shv[lane] : -INFINITY;
            bi = lane < nw ? shi[lane] : INT64_MAX;
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(FULL_MASK, bv, o);
                int64_t oi = __shfl_xor_sync(FULL_MASK, bi, o);
                if (am_better(ov, oi, bv, bi)) {
                    bv = ov;
                    bi = oi;
                }
            }
            /* V >= 1: some lane saw index 0 at least, so bi < V */
            if (lane == 0) out[r] = (int32_t)(bi < V ? bi : 0);
        }
    }
}

extern "C" cudaError_t tcu_argmax(cudaStream_t s, const float *x, int64_t R, int64_t V, int32_t *out) {
    if (R <= 0) return cudaSuccess;
    unsigned g = (unsigned)(R < TCU_MAX_GRID ? R : TCU_MAX_GRID);
    k_argmax<<<g, TCU_BLOCK, 0, s>>>(x, R, V, out);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- generic */

typedef struct gen_args {
    const uint8_t *in[TIDE_OP_MAX_IN];
    uint64_t in_bytes[TIDE_OP_MAX_IN];
    int n_in;
    uint32_t k;
} gen_args;

__global__ void k_generic(gen_args a, uint8_t *out, uint64_t n) {
    for (uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; j < n; j += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t s = 31u * (uint32_t)j + 17u * a.k;
        for (int i = 0; i < a.n_in; i++) s += (uint32_t)(i + 1) * a.in[i][j % a.in_bytes[i]];
        out[j] = (uint8_t)s;
    }
}

extern "C" cudaError_t tcu_generic(cudaStream_t s, int n_in, const uint8_t *const *in, const uint64_t *in_bytes,
                                   int k, uint8_t *out, uint64_t n) {
    if (n == 0) return cudaSuccess;
    if (n_in < 0 || n_in > TIDE_OP_MAX_IN) return cudaErrorInvalidValue;
    gen_args a;
    a.n_in = n_in;
    a.k = (uint32_t)k;
    for (int i = 0; i < TIDE_OP_MAX_IN; i++) {
        a.in[i] = i < n_in ? in[i] : NULL;
        a.in_bytes[i] = i < n_in ? in_bytes[i] : 1;
    }
    k_generic<<<grid_for((int64_t)(n < (uint64_t)INT64_MAX ? n : (uint64_t)INT64_MAX), TCU_BLOCK), TCU_BLOCK, 0, s>>>(a, out, n);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- probe */

extern "C" cudaError_t tcu_probe(void) {
    struct cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, k_add);
}
