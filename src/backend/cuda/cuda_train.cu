/*
 * cuda_train.cu - the CUDA backend's kernels of the training ops
 * (cuda_train.h), with the CPU's semantics (src/backend/cpu/kernels_train.c,
 * attention.c); the products around them (MATMUL's forms, MATMUL_GRADW,
 * CROSS_ENTROPY's logits and gradients) are cuBLAS calls in cuda_ops*.c.
 *
 * Layout of the work:
 *   - element-wise ops (SILU_MUL_BWD, ADAMW, widening columns): grid-stride
 *     loops;
 *   - row ops (RMSNORM_BWD's dx, the softmax rows of CROSS_ENTROPY, CE_STATS
 *     and CE_BLOCK): a block per row, reductions through warp shuffles and a shared-memory stage in an
 *     order fixed by thread index (as cuda_kernels.cu's);
 *   - sums over rows (RMSNORM_BWD's dw, SUMSQ): a block per (column block,
 *     block of rows) writes partial sums in double to the workspace, which a
 *     second kernel adds in block order; EMBED_BWD: a thread per column of a
 *     slice of the vocabulary walks the tokens in order;
 *   - ATTENTION_BWD: FlashAttention-2's recomputation without atomics, see
 *     tcu_attention_bwd.
 *
 * Numerics: where the CPU rounds an operation separately the kernels do too
 * (the _rn intrinsics keep nvcc from fusing a product into a sum the CPU
 * does not fuse), so ADAMW and EMBED_BWD give the CPU's bits, and the rest
 * differ from the CPU only by summation order and expf's last bit.
 *
 * Helpers carry a tr_ prefix: the emulation compiles this file in one
 * namespace with cuda_kernels.cu.
 */
#include "backend/cuda/cuda_train.h"
#include "backend/cuda/cuda_kernels.h"

#include <math.h>

#define TR_BLOCK 256
#define TR_MAX_GRID (1 << 20)
#define TR_FULL 0xffffffffu

static unsigned tr_grid(int64_t n, int block) {
    int64_t g = (n + block - 1) / block;
    if (g < 1) g = 1;
    if (g > TR_MAX_GRID) g = TR_MAX_GRID;
    return (unsigned)g;
}

/* Bit-exact with tide_f16_to_f32 (as cuda_kernels.cu's f16_to_f32). */
__device__ __forceinline__ float tr_f16(uint32_t h) {
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

template <int DT>
__device__ __forceinline__ float tr_load(const void *w, int64_t i) {
    if (DT == TIDE_F32) return ((const float *)w)[i];
    uint32_t h = ((const uint16_t *)w)[i];
    return DT == TIDE_F16 ? tr_f16(h) : __uint_as_float(h << 16);
}

template <typename T>
__device__ __forceinline__ T tr_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TR_FULL, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32); every thread gets the
 * same bits. Begins with a barrier, so sh (32 values) may be reused. */
template <typename T>
__device__ T tr_block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tr_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : (T)0;
    return tr_warp_sum(v);
}

__device__ float tr_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(TR_FULL, v, o));
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(TR_FULL, v, o));
    return v;
}

/* A block of threads covering n columns: n rounded up to a warp, at most
 * TR_BLOCK. */
static int tr_cols_block(int64_t n) { return n >= TR_BLOCK ? TR_BLOCK : (int)((n + 31) / 32 * 32); }

/* ------------------------------------------------------------- id checks */

__device__ __forceinline__ bool tr_bad_id(int32_t v, int64_t i, int64_t lo, int64_t hi, bool iota) {
    return (int64_t)v < lo || (int64_t)v >= hi || (iota && (int64_t)v != i);
}

__global__ void k_ids_check(const int32_t *ids, int64_t n, int64_t lo, int64_t hi, bool iota, int32_t *flag) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        if (tr_bad_id(ids[i], i, lo, hi, iota)) atomicMin(flag, (int32_t)i);
}

extern "C" cudaError_t tcu_ids_check(cudaStream_t s, const int32_t *ids, int64_t n, int64_t lo, int64_t hi,
                                     bool iota, int32_t *flag) {
    cudaError_t e = cudaMemsetAsync(flag, 0x7f, sizeof(int32_t), s); /* TCU_FLAG_OK */
    if (e != cudaSuccess || n <= 0) return e;
    k_ids_check<<<tr_grid(n, TR_BLOCK), TR_BLOCK, 0, s>>>(ids, n, lo, hi, iota, flag);
    return cudaGetLastError();
}

__global__ void k_ids_record(const int32_t *ids, int64_t n, int64_t lo, int64_t hi, bool iota, int32_t kind,
                             int64_t base, int32_t *rec) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int32_t v = ids[i];
        if (tr_bad_id(v, i, lo, hi, iota) && atomicCAS(rec, 0, kind) == 0) {
            rec[1] = (int32_t)(base + i < INT32_MAX ? base + i : INT32_MAX);
            rec[2] = v;
            rec[3] = (int32_t)(hi < INT32_MAX ? hi : INT32_MAX);
        }
    }
}

extern "C" cudaError_t tcu_ids_record(cudaStream_t s, const int32_t *ids, int64_t n, int64_t lo, int64_t hi,
                                      bool iota, int32_t kind, int64_t base, int32_t *rec) {
    if (n <= 0) return cudaSuccess;
    if (kind == 0) return cudaErrorInvalidValue;
    k_ids_record<<<tr_grid(n, TR_BLOCK), TR_BLOCK, 0, s>>>(ids, n, lo, hi, iota, kind, base, rec);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- matmul forms */

template <int DT>
__global__ void k_convert_cols(const void *w, int64_t K, int64_t N, int64_t n0, int64_t cnt, float *dst) {
    const int64_t n = K * cnt;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = tr_load<DT>(w, i / cnt * N + n0 + i % cnt);
}

extern "C" cudaError_t tcu_convert_cols(cudaStream_t s, const void *w, tide_dtype dt, int64_t K, int64_t N,
                                        int64_t n0, int64_t cnt, float *dst) {
    if (dt != TIDE_F16 && dt != TIDE_BF16) return cudaErrorInvalidValue;
    if (K <= 0 || cnt <= 0) return cudaSuccess;
    unsigned g = tr_grid(K * cnt, TR_BLOCK);
    if (dt == TIDE_F16) k_convert_cols<TIDE_F16><<<g, TR_BLOCK, 0, s>>>(w, K, N, n0, cnt, dst);
    else k_convert_cols<TIDE_BF16><<<g, TR_BLOCK, 0, s>>>(w, K, N, n0, cnt, dst);
    return cudaGetLastError();
}

/* A thread per output column n, TCU_MATMUL_FUSED_R rows at a time: w (k, n)
 * is read once per group of rows (coalesced across threads when KN), x's
 * element is the same for every thread (a broadcast). */
template <int DT, bool KN>
__global__ void k_matmul_small(const float *x, const void *w, int64_t R, int64_t K, int64_t N, bool accumulate,
                               float *out, int64_t ldo) {
    for (int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; n < N; n += (int64_t)gridDim.x * blockDim.x)
        for (int64_t r0 = 0; r0 < R; r0 += TCU_MATMUL_FUSED_R) {
            const int nr = (int)(R - r0 < TCU_MATMUL_FUSED_R ? R - r0 : TCU_MATMUL_FUSED_R);
            const float *xb = x + r0 * K;
            float acc[TCU_MATMUL_FUSED_R];
#pragma unroll
            for (int r = 0; r < TCU_MATMUL_FUSED_R; r++) acc[r] = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                const float wv = tr_load<DT>(w, KN ? k * N + n : n * K + k);
#pragma unroll
                for (int r = 0; r < TCU_MATMUL_FUSED_R; r++)
                    if (r < nr) acc[r] = fmaf(xb[r * K + k], wv, acc[r]);
            }
#pragma unroll
            for (int r = 0; r < TCU_MATMUL_FUSED_R; r++)
                if (r < nr) {
                    float *o = out + (r0 + r) * ldo + n;
                    *o = accumulate ? __fadd_rn(*o, acc[r]) : acc[r];
                }
        }
}

template <int DT>
static void launch_matmul_small(cudaStream_t s, const float *x, const void *w, int64_t R, int64_t K, int64_t N,
                                bool w_kn, bool accumulate, float *out, int64_t ldo) {
    unsigned g = tr_grid(N, TR_BLOCK);
    if (w_kn) k_matmul_small<DT, true><<<g, TR_BLOCK, 0, s>>>(x, w, R, K, N, accumulate, out, ldo);
    else k_matmul_small<DT, false><<<g, TR_BLOCK, 0, s>>>(x, w, R, K, N, accumulate, out, ldo);
}

extern "C" cudaError_t tcu_matmul_small(cudaStream_t s, const float *x, const void *w, tide_dtype wdt, int64_t R,
                                        int64_t K, int64_t N, bool w_kn, bool accumulate, float *out, int64_t ldo) {
    if (R <= 0 || N <= 0) return cudaSuccess;
    switch (wdt) {
    case TIDE_F32: launch_matmul_small<TIDE_F32>(s, x, w, R, K, N, w_kn, accumulate, out, ldo); break;
    case TIDE_F16: launch_matmul_small<TIDE_F16>(s, x, w, R, K, N, w_kn, accumulate, out, ldo); break;
    case TIDE_BF16: launch_matmul_small<TIDE_BF16>(s, x, w, R, K, N, w_kn, accumulate, out, ldo); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ------------------------------------------------------------- embed_bwd */

#define EB_TOKENS 1024 /* tokens staged in shared memory at a time */
#define EB_SLICES 64   /* slices of the vocabulary, at most */

/* Block (column block cb, vocabulary slice sl): thread c adds, for every
 * token in order whose id lies in the slice, dy's element c of that row to
 * the id's row (row id - vocab0 of the block). Each element of dtable has
 * one thread, which adds in row order: the CPU's sums, bit for bit. */
__global__ void k_embed_bwd(const float *dy, const int32_t *tokens, int64_t R, int64_t D, int64_t vocab0, int64_t V,
                            int64_t ncb, int64_t per, float *dtable) {
    __shared__ int32_t tok[EB_TOKENS];
    const int64_t cb = blockIdx.x % ncb, sl = blockIdx.x / ncb;
    const int64_t c = cb * blockDim.x + threadIdx.x, lo = vocab0 + sl * per;
    const int64_t hi = lo + per < vocab0 + V ? lo + per : vocab0 + V;
    for (int64_t r0 = 0; r0 < R; r0 += EB_TOKENS) {
        const int nt = (int)(R - r0 < EB_TOKENS ? R - r0 : EB_TOKENS);
        __syncthreads(); /* the previous chunk is consumed */
        for (int i = threadIdx.x; i < nt; i += blockDim.x) tok[i] = tokens[r0 + i];
        __syncthreads();
        if (c >= D) continue;
        for (int i = 0; i < nt; i++) {
            const int64_t id = tok[i];
            if (id >= lo && id < hi) {
                float *d = dtable + (id - vocab0) * D + c;
                *d = __fadd_rn(*d, dy[(r0 + i) * D + c]);
            }
        }
    }
}

extern "C" cudaError_t tcu_embed_bwd(cudaStream_t s, const float *dy, const int32_t *tokens, int64_t R, int64_t D,
                                     int64_t vocab0, int64_t V, float *dtable) {
    if (R <= 0 || D <= 0 || V <= 0) return cudaSuccess;
    const int bs = tr_cols_block(D);
    const int64_t ncb = (D + bs - 1) / bs, nsl = V < EB_SLICES ? V : EB_SLICES, per = (V + nsl - 1) / nsl;
    if (ncb * nsl > 0x7fffffff) return cudaErrorInvalidValue;
    k_embed_bwd<<<(unsigned)(ncb * nsl), bs, 0, s>>>(dy, tokens, R, D, vocab0, V, ncb, per, dtable);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- rmsnorm_bwd */

#define RB_MAX_GRID (1 << 16)

/* A block per row: rs, then dx through g = dy * w, as tk_rmsnorm_bwd. */
template <int DT>
__global__ void k_rmsnorm_bwd_rows(const float *x, const void *w, const float *dy, int64_t R, int64_t D, float eps,
                                   float *dx, float *rs_out) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *xr = x + r * D, *dyr = dy + r * D;
        float *dxr = dx + r * D;
        double ss = 0;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            double v = (double)xr[i];
            ss = __dadd_rn(ss, __dmul_rn(v, v));
        }
        ss = tr_block_sum(ss, sh);
        const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)__ddiv_rn(ss, (double)D), eps)));
        double dot = 0;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float g = __fmul_rn(dyr[i], tr_load<DT>(w, i));
            dot = __dadd_rn(dot, __dmul_rn((double)g, (double)xr[i]));
        }
        dot = tr_block_sum(dot, sh);
        const double r3 = __dmul_rn(__dmul_rn((double)rs, (double)rs), (double)rs);
        const float c = (float)__ddiv_rn(__dmul_rn(r3, dot), (double)D);
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float g = __fmul_rn(dyr[i], tr_load<DT>(w, i));
            dxr[i] = __fsub_rn(__fmul_rn(rs, g), __fmul_rn(c, xr[i]));
        }
        if (threadIdx.x == 0) rs_out[r] = rs;
    }
}

/* Block (column block cb, row block rb): column c's sum over the rows of rb,
 * in order, in double. */
__global__ void k_rmsnorm_bwd_parts(const float *x, const float *dy, const float *rs, int64_t R, int64_t D,
                                    int64_t ncb, int64_t nrb, int64_t rows, double *parts) {
    for (int64_t blk = blockIdx.x; blk < ncb * nrb; blk += gridDim.x) {
        const int64_t cb = blk % ncb, rb = blk / ncb, c = cb * blockDim.x + threadIdx.x;
        if (c >= D) continue;
        const int64_t r0 = rb * rows, r1 = r0 + rows < R ? r0 + rows : R;
        double acc = 0;
        for (int64_t r = r0; r < r1; r++)
            acc = __dadd_rn(acc, __dmul_rn((double)dy[r * D + c], (double)__fmul_rn(x[r * D + c], rs[r])));
        parts[rb * D + c] = acc;
    }
}

__global__ void k_rmsnorm_bwd_dw(const double *parts, int64_t nrb, int64_t D, bool accumulate, float *dw) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < D; c += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0;
        for (int64_t rb = 0; rb < nrb; rb++) acc = __dadd_rn(acc, parts[rb * D + c]);
        dw[c] = accumulate ? __fadd_rn(dw[c], (float)acc) : (float)acc;
    }
}

extern "C" cudaError_t tcu_rmsnorm_bwd(cudaStream_t s, const float *x, const void *w, tide_dtype wdt,
                                       const float *dy, int64_t R, int64_t D, float eps, bool accumulate, float *dx,
                                       float *dw, void *work, size_t work_bytes) {
    if (R <= 0 || D <= 0) return cudaSuccess;
    if (wdt != TIDE_F32 && wdt != TIDE_F16 && wdt != TIDE_BF16) return cudaErrorInvalidValue;
    const size_t rsb = ((size_t)R * sizeof(float) + 255) / 256 * 256;
    if (work_bytes < rsb || (work_bytes - rsb) / sizeof(double) / (size_t)D < 1) return cudaErrorInvalidValue;
    float *rs = (float *)work;
    double *parts = (double *)((char *)work + rsb);
    /* row blocks: as many as the workspace holds, equal */
    int64_t nrb = (int64_t)((work_bytes - rsb) / sizeof(double) / (size_t)D);
    nrb = nrb < R ? nrb : R;
    const int64_t rows = (R + nrb - 1) / nrb;
    nrb = (R + rows - 1) / rows;
    const unsigned gr = (unsigned)(R < RB_MAX_GRID ? R : RB_MAX_GRID);
    switch (wdt) {
    case TIDE_F32: k_rmsnorm_bwd_rows<TIDE_F32><<<gr, TR_BLOCK, 0, s>>>(x, w, dy, R, D, eps, dx, rs); break;
    case TIDE_F16: k_rmsnorm_bwd_rows<TIDE_F16><<<gr, TR_BLOCK, 0, s>>>(x, w, dy, R, D, eps, dx, rs); break;
    default: k_rmsnorm_bwd_rows<TIDE_BF16><<<gr, TR_BLOCK, 0, s>>>(x, w, dy, R, D, eps, dx, rs); break;
    }
    const int bs = tr_cols_block(D);
    const int64_t ncb = (D + bs - 1) / bs;
    const unsigned gp = (unsigned)(ncb * nrb < RB_MAX_GRID ? ncb * nrb : RB_MAX_GRID);
    k_rmsnorm_bwd_parts<<<gp, bs, 0, s>>>(x, dy, rs, R, D, ncb, nrb, rows, parts);
    k_rmsnorm_bwd_dw<<<tr_grid(D, TR_BLOCK), TR_BLOCK, 0, s>>>(parts, nrb, D, accumulate, dw);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- silu_mul_bwd */

__global__ void k_silu_mul_bwd(const float *gate, const float *up, const float *dy, float *dgate, float *dup,
                               int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = gate[i], u = up[i], d = dy[i];
        const float e1 = __fadd_rn(1.0f, (float)exp(-(double)g)), sg = __fdiv_rn(1.0f, e1);
        dup[i] = __fmul_rn(d, __fdiv_rn(g, e1));
        dgate[i] = __fmul_rn(__fmul_rn(d, u), __fmul_rn(sg, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sg)))));
    }
}

extern "C" cudaError_t tcu_silu_mul_bwd(cudaStream_t s, const float *gate, const float *up, const float *dy,
                                        float *dgate, float *dup, int64_t n) {
    if (n <= 0) return cudaSuccess;
    k_silu_mul_bwd<<<tr_grid(n, TR_BLOCK), TR_BLOCK, 0, s>>>(gate, up, dy, dgate, dup, n);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- attention_bwd */

/*
 * Tiles of BT query rows and BT keys of one head (BT = 32, 16, 8, 4 as
 * head_dim is up to 64, 128, 256, 512, so that BT * hd <= 2048) are staged
 * in shared memory with rows hd + 1 floats apart (a warp reading one column
 * of 32 rows hits 32 banks). A block of 256 threads computes a tile's
 * BT x BT entries (score, P, dP, dS: each a dot product over head_dim, d
 * ascending), then each thread owns up to 8 elements of the BT x hd result
 * (dk and dv, or dq) and adds the tile's terms to them in row order. The
 * causal mask keeps key j of query i iff j <= i; a masked entry is never
 * computed on (P = dS = 0 and skipped in the sums). Rows past T are zero in
 * the tiles and never stored.
 */
#define AB_THREADS 256
#define AB_PER 8 /* result elements per thread: BT * hd / 256 */

static int ab_tile(int hd) { return hd <= 64 ? 32 : hd <= 128 ? 16 : hd <= 256 ? 8 : 4; }

/* Dynamic shared memory: four row tiles, two BT x (BT + 1) tiles, 3 BT
 * statistics; under 42 KiB for every head_dim. */
static size_t ab_smem(int bt, int hd) {
    return ((size_t)4 * bt * (hd + 1) + (size_t)2 * bt * (bt + 1) + (size_t)3 * bt) * sizeof(float);
}

/* dst [bt][hd + 1] = rows 0..n-1 of src (ld floats apart), zero below. */
__device__ __forceinline__ void ab_load(float *dst, const float *src, int64_t ld, int n, int bt, int hd) {
    for (int e = threadIdx.x; e < bt * hd; e += blockDim.x) {
        const int r = e / hd, d = e % hd;
        dst[r * (hd + 1) + d] = r < n ? src[r * ld + d] : 0.0f;
    }
}

__device__ __forceinline__ float ab_dot(const float *a, const float *b, int hd) {
    float s = 0.0f;
    for (int d = 0; d < hd; d++) s = fmaf(a[d], b[d], s);
    return s;
}

/* Block (query tile, b, h), later tiles first: each row's max over its keys,
 * then its sum of expf(s - max) in double, key order, by the row's thread;
 * and rowsum(dO * O) in double. */
__global__ void __launch_bounds__(AB_THREADS)
    k_attn_bwd_stats(const float *q, const float *k, const float *o, const float *dout, int64_t B, int64_t T, int H,
                     int KV, int hd, int bt, float scale, float *stats) {
    extern __shared__ float ab_sm[];
    const int lds = hd + 1, ldp = bt + 1, tid = threadIdx.x;
    float *Qs = ab_sm, *Ks = Qs + bt * lds, *Ss = Ks + bt * lds;
    const int64_t nqb = (T + bt - 1) / bt, qb = nqb - 1 - (int64_t)blockIdx.x % nqb, bh = (int64_t)blockIdx.x / nqb;
    const int h = (int)(bh % H), g = h / (H / KV);
    const int64_t b = bh / H, qd = (int64_t)H * hd, kd = (int64_t)KV * hd, i0 = qb * bt;
    const int nq = (int)(T - i0 < bt ? T - i0 : bt);
    ab_load(Qs, q + (b * T + i0) * qd + (int64_t)h * hd, qd, nq, bt, hd);
    float m = -INFINITY;
    double sum = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t kb = 0; kb <= qb; kb++) {
            const int64_t j0 = kb * bt;
            const int nk = (int)(T - j0 < bt ? T - j0 : bt);
            __syncthreads(); /* the previous tile's scores are consumed */
            ab_load(Ks, k + (b * T + j0) * kd + (int64_t)g * hd, kd, nk, bt, hd);
            __syncthreads();
            for (int e = tid; e < bt * bt; e += blockDim.x) {
                const int i = e / bt, j = e % bt;
                Ss[i * ldp + j] =
                    i < nq && j0 + j <= i0 + i ? __fmul_rn(ab_dot(Qs + i * lds, Ks + j * lds, hd), scale) : -INFINITY;
            }
            __syncthreads();
            if (tid < nq) {
                const int64_t lim = i0 + tid - j0 + 1; /* keys of this tile in the row's range */
                const int n = (int)(lim < bt ? lim : bt);
                const float *sr = Ss + tid * ldp;
                if (pass == 0)
                    for (int j = 0; j < n; j++) m = sr[j] > m ? sr[j] : m;
                else
                    for (int j = 0; j < n; j++) sum = __dadd_rn(sum, (double)expf(__fsub_rn(sr[j], m)));
            }
        }
    if (tid < nq) {
        const int64_t n = B * H * T, at = (b * H + h) * T + i0 + tid, row = (b * T + i0 + tid) * qd + (int64_t)h * hd;
        double dd = 0;
        for (int d = 0; d < hd; d++) dd = __dadd_rn(dd, __dmul_rn((double)dout[row + d], (double)o[row + d]));
        stats[at] = m;
        stats[n + at] = (float)__ddiv_rn(1.0, sum);
        stats[2 * n + at] = (float)dd;
    }
}

/* P and dS of a tile (rows i0.., keys j0..) into Ps (may be NULL) and Gs,
 * from Q, dO, K, V tiles and the rows' statistics. */
__device__ __forceinline__ void ab_entries(const float *Qs, const float *Ds, const float *Ks, const float *Vs,
                                           const float *st, int bt, int hd, int nq, int nk, int64_t i0, int64_t j0,
                                           float scale, float *Ps, float *Gs) {
    const int lds = hd + 1, ldp = bt + 1;
    for (int e = threadIdx.x; e < bt * bt; e += blockDim.x) {
        const int i = e / bt, j = e % bt;
        float p = 0.0f, ds = 0.0f;
        if (i < nq && j < nk && j0 + j <= i0 + i) {
            const float sc = __fmul_rn(ab_dot(Qs + i * lds, Ks + j * lds, hd), scale);
            p = __fmul_rn(expf(__fsub_rn(sc, st[i])), st[bt + i]);
            const float dp = ab_dot(Ds + i * lds, Vs + j * lds, hd);
            ds = __fmul_rn(p, __fsub_rn(dp, st[2 * bt + i]));
        }
        if (Ps) Ps[i * ldp + j] = p;
        Gs[i * ldp + j] = ds;
    }
}

/* The statistics of rows i0..i0+nq-1 of (b, h) into st [3][bt]. */
__device__ __forceinline__ void ab_stats(const float *stats, int64_t n, int64_t at, int nq, int bt, float *st) {
    for (int i = threadIdx.x; i < bt; i += blockDim.x) {
        st[i] = i < nq ? stats[at + i] : 0.0f;
        st[bt + i] = i < nq ? stats[n + at + i] : 0.0f;
        st[2 * bt + i] = i < nq ? stats[2 * n + at + i] : 0.0f;
    }
}

/* Block (key tile, b, kv head g), earlier keys (more queries) first: dV =
 * sum P^T dO, dK = scale * sum dS^T Q over the group's heads in order, then
 * the query tiles from the keys' own on. */
__global__ void __launch_bounds__(AB_THREADS)
    k_attn_bwd_dkv(const float *q, const float *k, const float *v, const float *dout, const float *stats,
                   int64_t B, int64_t T, int H, int KV, int hd, int bt, float scale, float *dk, float *dv) {
    extern __shared__ float ab_sm[];
    const int lds = hd + 1, ldp = bt + 1, tid = threadIdx.x, G = H / KV;
    float *Ks = ab_sm, *Vs = Ks + bt * lds, *Qs = Vs + bt * lds, *Ds = Qs + bt * lds;
    float *Ps = Ds + bt * lds, *Gs = Ps + bt * ldp, *st = Gs + bt * ldp;
    const int64_t nb = (T + bt - 1) / bt, kb = (int64_t)blockIdx.x % nb, bg = (int64_t)blockIdx.x / nb;
    const int g = (int)(bg % KV);
    const int64_t b = bg / KV, qd = (int64_t)H * hd, kd = (int64_t)KV * hd, j0 = kb * bt, n = B * H * T;
    const int nk = (int)(T - j0 < bt ? T - j0 : bt);
    ab_load(Ks, k + (b * T + j0) * kd + (int64_t)g * hd, kd, nk, bt, hd);
    ab_load(Vs, v + (b * T + j0) * kd + (int64_t)g * hd, kd, nk, bt, hd);
    float ak[AB_PER], av[AB_PER];
#pragma unroll
    for (int u = 0; u < AB_PER; u++) ak[u] = av[u] = 0.0f;
    for (int h = g * G; h < g * G + G; h++)
        for (int64_t qb = kb; qb < nb; qb++) {
            const int64_t i0 = qb * bt;
            const int nq = (int)(T - i0 < bt ? T - i0 : bt);
            __syncthreads(); /* the previous tile is consumed */
            ab_load(Qs, q + (b * T + i0) * qd + (int64_t)h * hd, qd, nq, bt, hd);
            ab_load(Ds, dout + (b * T + i0) * qd + (int64_t)h * hd, qd, nq, bt, hd);
            ab_stats(stats, n, (b * H + h) * T + i0, nq, bt, st);
            __syncthreads();
            ab_entries(Qs, Ds, Ks, Vs, st, bt, hd, nq, nk, i0, j0, scale, Ps, Gs);
            __syncthreads();
#pragma unroll
            for (int u = 0; u < AB_PER; u++) {
                const int e = tid + u * AB_THREADS;
                if (e < bt * hd) {
                    const int j = e / hd, d = e % hd;
                    /* queries at or after key j: in the keys' own tile, from row j on */
                    float a = av[u], c = ak[u];
                    for (int i = qb == kb ? j : 0; i < nq; i++) {
                        a = fmaf(Ps[i * ldp + j], Ds[i * lds + d], a);
                        c = fmaf(Gs[i * ldp + j], Qs[i * lds + d], c);
                    }
                    av[u] = a;
                    ak[u] = c;
                }
            }
        }
#pragma unroll
    for (int u = 0; u < AB_PER; u++) {
        const int e = tid + u * AB_THREADS;
        if (e < bt * hd && e / hd < nk) {
            const int64_t at = (b * T + j0 + e / hd) * kd + (int64_t)g * hd + e % hd;
            dk[at] = __fmul_rn(ak[u], scale);
            dv[at] = av[u];
        }
    }
}

/* Block (query tile, b, h), later tiles first: dQ = scale * sum dS K over
 * the key tiles up to the queries, in order. */
__global__ void __launch_bounds__(AB_THREADS)
    k_attn_bwd_dq(const float *q, const float *k, const float *v, const float *dout, const float *stats, int64_t B,
                  int64_t T, int H, int KV, int hd, int bt, float scale, float *dq) {
    extern __shared__ float ab_sm[];
    const int lds = hd + 1, ldp = bt + 1, tid = threadIdx.x;
    float *Qs = ab_sm, *Ds = Qs + bt * lds, *Ks = Ds + bt * lds, *Vs = Ks + bt * lds;
    float *Gs = Vs + bt * lds, *st = Gs + 2 * bt * ldp;
    const int64_t nb = (T + bt - 1) / bt, qb = nb - 1 - (int64_t)blockIdx.x % nb, bh = (int64_t)blockIdx.x / nb;
    const int h = (int)(bh % H), g = h / (H / KV);
    const int64_t b = bh / H, qd = (int64_t)H * hd, kd = (int64_t)KV * hd, i0 = qb * bt, n = B * H * T;
    const int nq = (int)(T - i0 < bt ? T - i0 : bt);
    ab_load(Qs, q + (b * T + i0) * qd + (int64_t)h * hd, qd, nq, bt, hd);
    ab_load(Ds, dout + (b * T + i0) * qd + (int64_t)h * hd, qd, nq, bt, hd);
    ab_stats(stats, n, (b * H + h) * T + i0, nq, bt, st);
    float aq[AB_PER];
#pragma unroll
    for (int u = 0; u < AB_PER; u++) aq[u] = 0.0f;
    for (int64_t kb = 0; kb <= qb; kb++) {
        const int64_t j0 = kb * bt;
        const int nk = (int)(T - j0 < bt ? T - j0 : bt);
        __syncthreads(); /* the previous tile is consumed (and the first: Q, dO, st written) */
        ab_load(Ks, k + (b * T + j0) * kd + (int64_t)g * hd, kd, nk, bt, hd);
        ab_load(Vs, v + (b * T + j0) * kd + (int64_t)g * hd, kd, nk, bt, hd);
        __syncthreads();
        ab_entries(Qs, Ds, Ks, Vs, st, bt, hd, nq, nk, i0, j0, scale, NULL, Gs);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < AB_PER; u++) {
            const int e = tid + u * AB_THREADS;
            if (e < bt * hd) {
                const int i = e / hd, d = e % hd;
                /* keys up to query i: in the queries' own tile, to column i */
                const int jn = kb == qb ? (i + 1 < nk ? i + 1 : nk) : nk;
                float a = aq[u];
                for (int j = 0; j < jn; j++) a = fmaf(Gs[i * ldp + j], Ks[j * lds + d], a);
                aq[u] = a;
            }
        }
    }
#pragma unroll
    for (int u = 0; u < AB_PER; u++) {
        const int e = tid + u * AB_THREADS;
        if (e < bt * hd && e / hd < nq) dq[(b * T + i0 + e / hd) * qd + (int64_t)h * hd + e % hd] = __fmul_rn(aq[u], scale);
    }
}

extern "C" cudaError_t tcu_attention_bwd(cudaStream_t s, const float *q, const float *k, const float *v,
                                         const float *o, const float *dout, float *dq, float *dk, float *dv,
                                         int64_t B, int64_t T, int H, int KV, int hd, float *stats) {
    if (hd <= 0 || hd > TCU_ATTN_MAX_HD || KV <= 0 || H <= 0 || H % KV) return cudaErrorInvalidValue;
    if (B <= 0 || T <= 0) return cudaSuccess;
    if (B * T * H > 0x7fffffff) return cudaErrorInvalidValue;
    const int bt = ab_tile(hd);
    const size_t smem = ab_smem(bt, hd);
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t nb = (T + bt - 1) / bt;
    k_attn_bwd_stats<<<(unsigned)(nb * B * H), AB_THREADS, smem, s>>>(q, k, o, dout, B, T, H, KV, hd, bt, scale, stats);
    k_attn_bwd_dkv<<<(unsigned)(nb * B * KV), AB_THREADS, smem, s>>>(q, k, v, dout, stats, B, T, H, KV, hd, bt, scale,
                                                                     dk, dv);
    k_attn_bwd_dq<<<(unsigned)(nb * B * H), AB_THREADS, smem, s>>>(q, k, v, dout, stats, B, T, H, KV, hd, bt, scale,
                                                                   dq);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- cross_entropy */

#define CE_MAX_GRID (1 << 16)

/* A block per row: max, expf(l - max) with the sum in double, then the
 * gradient row in place and the row's loss term, as the CPU's ce_row. */
__global__ void k_ce_rows(float *l, int64_t R, int64_t V, const int32_t *targets, float scale, double *terms) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        float *row = l + r * V;
        const int64_t t = targets[r];
        if (t < 0 || t >= V) { /* ignored (or, not range-checked yet, out of range): no loss, no gradient */
            for (int64_t j = threadIdx.x; j < V; j += blockDim.x) row[j] = 0.0f;
            if (threadIdx.x == 0) terms[r] = 0;
            continue;
        }
        const float lt = row[t];
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = row[j] > mx ? row[j] : mx;
        mx = tr_block_max(mx, shf); /* every thread has read lt: rows are written below */
        double sum = 0;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            const float e = expf(__fsub_rn(row[j], mx));
            row[j] = e;
            sum = __dadd_rn(sum, (double)e);
        }
        sum = tr_block_sum(sum, shd);
        const float inv = (float)__ddiv_rn(1.0, sum);
        /* the target's element (its exponential) is read and rewritten by its own thread */
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
            row[j] = j == t ? (float)__dmul_rn((double)scale, __dsub_rn(__ddiv_rn((double)row[j], sum), 1.0))
                            : __fmul_rn(scale, __fmul_rn(row[j], inv));
        if (threadIdx.x == 0) terms[r] = __dsub_rn(__dadd_rn((double)mx, log(sum)), (double)lt);
    }
}

extern "C" cudaError_t tcu_ce_rows(cudaStream_t s, float *l, int64_t R, int64_t V, const int32_t *targets,
                                   float scale, double *terms) {
    if (R <= 0 || V <= 0) return cudaSuccess;
    k_ce_rows<<<(unsigned)(R < CE_MAX_GRID ? R : CE_MAX_GRID), TR_BLOCK, 0, s>>>(l, R, V, targets, scale, terms);
    return cudaGetLastError();
}

__global__ void k_ce_loss(const double *terms, int64_t n, float scale, bool add, float *loss) {
    __shared__ double sh[32];
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s = __dadd_rn(s, terms[i]);
    s = tr_block_sum(s, sh);
    if (threadIdx.x == 0) {
        const float part = (float)__dmul_rn((double)scale, s);
        *loss = add ? __fadd_rn(*loss, part) : part;
    }
}

extern "C" cudaError_t tcu_ce_loss(cudaStream_t s, const double *terms, int64_t n, float scale, bool add,
                                   float *loss) {
    k_ce_loss<<<1, TR_BLOCK, 0, s>>>(terms, n, scale, add, loss);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- cross_entropy in vocabulary blocks */

/* A block per row: the block's max and sum of expf(l - max) in double (as
 * k_ce_rows), merged by thread 0 with the statistics of the blocks before
 * (stats_in may be stats: each row's are read, then written, by one
 * thread), as tk_ce_stats; with terms, the row's loss term from the rounded
 * statistics. */
__global__ void k_ce_stats_rows(const float *l, int64_t R, int64_t Vb, const int32_t *targets, int64_t vocab0,
                                const float *stats_in, float *stats, double *terms) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *row = l + r * Vb;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < Vb; j += blockDim.x) mx = row[j] > mx ? row[j] : mx;
        mx = tr_block_max(mx, shf);
        double sum = 0;
        for (int64_t j = threadIdx.x; j < Vb; j += blockDim.x)
            sum = __dadd_rn(sum, (double)expf(__fsub_rn(row[j], mx)));
        sum = tr_block_sum(sum, shd);
        if (threadIdx.x) continue;
        const int64_t tg = targets[r], t = tg - vocab0;
        const float tl = t >= 0 && t < Vb ? row[t] : 0.0f;
        float M = mx, S = (float)sum, T = tl;
        if (stats_in) {
            const float *in = stats_in + r * 3;
            M = in[0] > mx ? in[0] : mx;
            S = (float)__dadd_rn(__dmul_rn((double)in[1], exp(__dsub_rn((double)in[0], (double)M))),
                                 __dmul_rn(sum, exp(__dsub_rn((double)mx, (double)M))));
            T = __fadd_rn(in[2], tl);
        }
        float *o = stats + r * 3;
        o[0] = M, o[1] = S, o[2] = T;
        if (terms) terms[r] = tg >= 0 ? __dsub_rn(__dadd_rn((double)M, log((double)S)), (double)T) : 0.0;
    }
}

extern "C" cudaError_t tcu_ce_stats_rows(cudaStream_t s, const float *l, int64_t R, int64_t Vb,
                                         const int32_t *targets, int64_t vocab0, const float *stats_in, float *stats,
                                         double *terms) {
    if (R <= 0) return cudaSuccess;
    if (Vb <= 0) return cudaErrorInvalidValue;
    k_ce_stats_rows<<<(unsigned)(R < CE_MAX_GRID ? R : CE_MAX_GRID), TR_BLOCK, 0, s>>>(l, R, Vb, targets, vocab0,
                                                                                      stats_in, stats, terms);
    return cudaGetLastError();
}

/* A block per row: g in place of the logits, each element by its own
 * thread, as tk_ce_block. */
__global__ void k_ce_block_rows(float *l, int64_t R, int64_t Vb, const int32_t *targets, int64_t vocab0,
                                const float *stats, float scale) {
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        float *row = l + r * Vb;
        const int64_t tg = targets[r];
        if (tg < 0) { /* ignored: no gradient */
            for (int64_t j = threadIdx.x; j < Vb; j += blockDim.x) row[j] = 0.0f;
            continue;
        }
        const int64_t t = tg - vocab0;
        const float M = stats[r * 3];
        const double S = (double)stats[r * 3 + 1];
        const float inv = (float)__ddiv_rn(1.0, S);
        for (int64_t j = threadIdx.x; j < Vb; j += blockDim.x) {
            const float e = expf(__fsub_rn(row[j], M));
            row[j] = j == t ? (float)__dmul_rn((double)scale, __dsub_rn(__ddiv_rn((double)e, S), 1.0))
                            : __fmul_rn(scale, __fmul_rn(e, inv));
        }
    }
}

extern "C" cudaError_t tcu_ce_block_rows(cudaStream_t s, float *l, int64_t R, int64_t Vb, const int32_t *targets,
                                         int64_t vocab0, const float *stats, float scale) {
    if (R <= 0 || Vb <= 0) return cudaSuccess;
    k_ce_block_rows<<<(unsigned)(R < CE_MAX_GRID ? R : CE_MAX_GRID), TR_BLOCK, 0, s>>>(l, R, Vb, targets, vocab0,
                                                                                      stats, scale);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- sumsq */

#define SQ_MAX_GRID (1 << 16)

__global__ void k_sumsq_parts(const float *g, int64_t n, int64_t per, int64_t nparts, double *parts) {
    __shared__ double sh[32];
    for (int64_t p = blockIdx.x; p < nparts; p += gridDim.x) {
        const int64_t i0 = p * per, i1 = i0 + per < n ? i0 + per : n;
        double s = 0;
        for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
            const double v = (double)g[i];
            s = __dadd_rn(s, __dmul_rn(v, v));
        }
        s = tr_block_sum(s, sh);
        if (threadIdx.x == 0) parts[p] = s;
    }
}

__global__ void k_sumsq_final(const double *parts, int64_t nparts, const float *acc_in, float *out) {
    __shared__ double sh[32];
    double s = 0;
    for (int64_t i = threadIdx.x; i < nparts; i += blockDim.x) s = __dadd_rn(s, parts[i]);
    s = tr_block_sum(s, sh);
    if (threadIdx.x == 0) *out = (float)__dadd_rn(acc_in ? (double)*acc_in : 0.0, s);
}

extern "C" cudaError_t tcu_sumsq(cudaStream_t s, const float *g, int64_t n, const float *acc_in, float *out,
                                 double *parts, size_t parts_bytes) {
    int64_t np = (int64_t)(parts_bytes / sizeof(double));
    if (np < 1) return cudaErrorInvalidValue;
    np = np < n ? np : n;
    if (np > 0) {
        const int64_t per = (n + np - 1) / np;
        np = (n + per - 1) / per;
        k_sumsq_parts<<<(unsigned)(np < SQ_MAX_GRID ? np : SQ_MAX_GRID), TR_BLOCK, 0, s>>>(g, n, per, np, parts);
    }
    k_sumsq_final<<<1, TR_BLOCK, 0, s>>>(parts, np, acc_in, out);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- adamw */

/* tide_f32_to_bf16 and tide_f32_to_f16 (src/core/dtype.c), bit for bit:
 * round to nearest even, a NaN kept a (quiet) NaN with its sign. */
__device__ __forceinline__ uint16_t tr_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ uint16_t tr_to_f16(float f) {
    const uint32_t u = __float_as_uint(f), a = u & 0x7fffffffu;
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a < 0x38800000u) {
        if (a < 0x33000000u) return sign;
        const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return sign | (uint16_t)q;
    }
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return sign | (uint16_t)(r >> 13);
}

/* tk_adamw's loop, each operation rounded as there. The scalars are formed
 * by every thread from hyper and sumsq (a few operations; the same bits). */
template <int PDT>
__global__ void k_adamw(void *param, float *master, float *m, float *v, const float *grad, int64_t n,
                        const float *hyper, const float *sumsq, float beta1, float beta2, float eps, float wd,
                        float max_norm) {
    if (hyper[3] < 0) return; /* a step that only measures its loss */
    const float gs = hyper[3] > 0 ? hyper[3] : 1.0f;
    float clip = 1.0f;
    if (max_norm > 0) {
        const float c = __fdiv_rn(max_norm, __fadd_rn(__fmul_rn(__fsqrt_rn(*sumsq), gs), 1e-6f));
        clip = c > 1.0f ? 1.0f : c;
    }
    clip = __fmul_rn(clip, gs);
    const float lr = hyper[0], nstep = -hyper[1], bc2s = hyper[2];
    const float decay = (float)__dsub_rn(1.0, __dmul_rn((double)lr, (double)wd));
    const float w1 = (float)__dsub_rn(1.0, (double)beta1), w1m = __fsub_rn(w1, 1.0f);
    const bool small = fabsf(w1) < 0.5f;
    const float omb2 = (float)__dsub_rn(1.0, (double)beta2);
    float *p32 = master ? master : (float *)param;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = __fmul_rn(grad[i], clip);
        float p = __fmul_rn(p32[i], decay);
        float mi = m[i];
        const float d = __fsub_rn(g, mi);
        mi = small ? fmaf(w1, d, mi) : fmaf(w1m, d, g);
        const float vi = fmaf(__fmul_rn(omb2, g), g, __fmul_rn(v[i], beta2));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2s), eps);
        p = __fadd_rn(p, __fdiv_rn(__fmul_rn(nstep, mi), denom));
        m[i] = mi;
        v[i] = vi;
        p32[i] = p;
        if (master) {
            if (PDT == TIDE_F32) ((float *)param)[i] = p;
            else ((uint16_t *)param)[i] = PDT == TIDE_BF16 ? tr_to_bf16(p) : tr_to_f16(p);
        }
    }
}

extern "C" cudaError_t tcu_adamw(cudaStream_t s, void *param, tide_dtype pdt, float *master, float *m, float *v,
                                 const float *grad, int64_t n, const float *hyper, const float *sumsq, float beta1,
                                 float beta2, float eps, float weight_decay, float max_norm) {
    if (pdt != TIDE_F32 && pdt != TIDE_F16 && pdt != TIDE_BF16) return cudaErrorInvalidValue;
    if (pdt != TIDE_F32 && !master) return cudaErrorInvalidValue;
    if (n <= 0) return cudaSuccess;
    const unsigned g = tr_grid(n, TR_BLOCK);
    switch (pdt) {
    case TIDE_F32:
        k_adamw<TIDE_F32><<<g, TR_BLOCK, 0, s>>>(param, master, m, v, grad, n, hyper, sumsq, beta1, beta2, eps,
                                                 weight_decay, max_norm);
        break;
    case TIDE_F16:
        k_adamw<TIDE_F16><<<g, TR_BLOCK, 0, s>>>(param, master, m, v, grad, n, hyper, sumsq, beta1, beta2, eps,
                                                 weight_decay, max_norm);
        break;
    default:
        k_adamw<TIDE_BF16><<<g, TR_BLOCK, 0, s>>>(param, master, m, v, grad, n, hyper, sumsq, beta1, beta2, eps,
                                                  weight_decay, max_norm);
        break;
    }
    return cudaGetLastError();
}
