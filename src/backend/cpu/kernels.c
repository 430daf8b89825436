/*
 * kernels.c - the CPU kernels of kernels.h.
 *
 * Threads: each kernel opens its own OpenMP region with nt threads and splits
 * only independent outputs (rows, elements, attention tiles) between them.
 * MATMUL runs OpenBLAS single-threaded on each OpenMP thread's tile: with
 * Debian's pthread OpenBLAS, a second pool of BLAS threads would spin on the
 * cores our OpenMP threads need (and ours on theirs) between ops, costing
 * 10-20% of a bf16 matmul; with one pool the conversion and the sgemm calls
 * share the threads.
 *
 * Attention is tiled flash-style: a task is (batch b, kv head g, a few query
 * heads of that group, a block of queries); its rows (head, query) share each
 * key tile, which is transposed once into a stack tile; scores, an online
 * softmax (running max m, running sum l) and P.V are accumulated tile by tile
 * into an output tile. Each row reads only keys j <= its position, so stale
 * cache rows are never touched. A task's result does not depend on which
 * thread runs it, so tasks are handed out dynamically, heaviest first.
 *
 * Two code paths: AVX2+FMA intrinsics (chosen at run time) for the hot loops,
 * and portable loops (vectorised by `omp simd`) elsewhere. Within one path the
 * order of every floating-point reduction is fixed by the code alone.
 */
#include "backend/cpu/kernels.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TK_X86 1
#define TK_AVX2 __attribute__((target("avx2,fma")))
#endif

/* ------------------------------------------------------------- dispatch */

static atomic_int isa_avx2 = -1; /* -1 not probed, 0 no, 1 yes */
static atomic_bool isa_forced_generic;

void tk_init(void) {
    if (atomic_load_explicit(&isa_avx2, memory_order_relaxed) >= 0) return;
    int v = 0;
#ifdef TK_X86
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    atomic_store(&isa_avx2, v);
}

void tk_force_generic(bool on) { atomic_store(&isa_forced_generic, on); }

bool tk_have_avx2(void) {
    tk_init();
    return atomic_load_explicit(&isa_avx2, memory_order_relaxed) == 1 &&
           !atomic_load_explicit(&isa_forced_generic, memory_order_relaxed);
}

/* ------------------------------------------------------------- conversion */

typedef union { float f; uint32_t u; } tk_bits;

static inline float u2f(uint32_t u) { tk_bits b = {.u = u}; return b.f; }
static inline uint32_t f2u(float f) { tk_bits b = {.f = f}; return b.u; }

/* binary16 -> binary32 without branches (so that loops vectorise): rebias the
 * exponent; exponent 31 (inf/NaN) maps to 255 keeping the payload; exponent 0
 * (zero/subnormal) is renormalised exactly by one subtraction of 2^-14. */
static inline float h2f(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t o = (h & 0x7fffu) << 13;
    uint32_t e = o & 0x0f800000u;
    o += 0x38000000u;                                    /* (127 - 15) << 23 */
    uint32_t special = o + 0x38000000u;                  /* exponent -> 255 */
    uint32_t sub = f2u(u2f(o + 0x00800000u) - u2f(0x38800000u));
    /* select by masks, not branches: the form the vectoriser takes */
    uint32_t ms = -(uint32_t)(e == 0x0f800000u), mz = -(uint32_t)(e == 0);
    uint32_t r = (o & ~(ms | mz)) | (special & ms) | (sub & mz);
    return u2f(r | sign);
}

/* The loops are written once and compiled twice, portable and AVX2. */
#define TK_CONVERT_LOOPS(NAME, ATTR)                                                 \
    ATTR static void NAME##_bf16(const uint16_t *s, float *d, size_t n) {            \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) d[i] = u2f((uint32_t)s[i] << 16); \
    }                                                                                \
    ATTR static void NAME##_f16(const uint16_t *s, float *d, size_t n) {             \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) d[i] = h2f(s[i]);         \
    }

TK_CONVERT_LOOPS(conv_generic, )
#ifdef TK_X86
TK_CONVERT_LOOPS(conv_avx2, TK_AVX2)
#endif

void tk_convert(const void *src, tide_dtype dt, float *dst, size_t n) {
    bool avx = tk_have_avx2();
    switch (dt) {
    case TIDE_F32:
        memmove(dst, src, n * sizeof(float));
        break;
    case TIDE_BF16:
#ifdef TK_X86
        if (avx) {
            conv_avx2_bf16(src, dst, n);
            break;
        }
#endif
        conv_generic_bf16(src, dst, n);
        break;
    case TIDE_F16:
#ifdef TK_X86
        if (avx) {
            conv_avx2_f16(src, dst, n);
            break;
        }
#endif
        conv_generic_f16(src, dst, n);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------- small loops */

/* Work below this many elements runs on the calling thread only. */
#define TK_PAR_MIN 16384

#ifdef TK_X86
TK_AVX2 static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif

/* ------------------------------------------------------------- embed, norm */

tide_status tk_embed(const void *table, tide_dtype dt, int64_t V, int64_t D,
                     const int32_t *tokens, int64_t R, float *out, int64_t *bad, int nt) {
    for (int64_t r = 0; r < R; r++)
        if (tokens[r] < 0 || tokens[r] >= V) {
            *bad = r;
            return TIDE_E_RANGE;
        }
    size_t es = tide_dtype_size(dt);
    const uint8_t *tab = table;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * D >= TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++)
        tk_convert(tab + (size_t)tokens[r] * (size_t)D * es, dt, out + r * D, (size_t)D);
    return TIDE_OK;
}

#define TK_CHUNK 512

void tk_rmsnorm(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t D, float eps,
                float *out, int nt) {
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * D >= TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D;
        float *orow = out + r * D;
        double ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < D; i++) ss += (double)xr[i] * (double)xr[i];
        float rs = 1.0f / sqrtf((float)(ss / (double)D) + eps);
        float wf[TK_CHUNK];
        for (int64_t i0 = 0; i0 < D; i0 += TK_CHUNK) {
            int64_t n = TIDE_MIN(TK_CHUNK, D - i0);
            tk_convert(wb + (size_t)i0 * es, wdt, wf, (size_t)n);
#pragma omp simd
            for (int64_t i = 0; i < n; i++) orow[i0 + i] = wf[i] * (xr[i0 + i] * rs);
        }
    }
}

/* ------------------------------------------------------------- matmul */

/* Dot products of nr (1..4) rows of x (row stride ldx) with w (n): acc[r] +=
 * x_r . w. One pattern for every row (two accumulators over alternating
 * 8-float blocks, then the tail), so a row's result never depends on which
 * rows it was grouped with. */
#ifdef TK_X86
TK_AVX2 static void dots_avx2(const float *x, int64_t ldx, int nr, const float *w, int64_t n,
                              float *acc) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) {
        const float *x0 = x + r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            __m256 wa = _mm256_loadu_ps(w + i), wb = _mm256_loadu_ps(w + i + 8);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + i), wa, a0);
            b0 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + i + 8), wb, b0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + i), wa, a1);
            b1 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + i + 8), wb, b1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x2 + i), wa, a2);
            b2 = _mm256_fmadd_ps(_mm256_loadu_ps(x2 + i + 8), wb, b2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x3 + i), wa, a3);
            b3 = _mm256_fmadd_ps(_mm256_loadu_ps(x3 + i + 8), wb, b3);
        }
        if (i + 8 <= n) {
            __m256 wa = _mm256_loadu_ps(w + i);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + i), wa, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + i), wa, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x2 + i), wa, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x3 + i), wa, a3);
            i += 8;
        }
        float s0 = hsum8(_mm256_add_ps(a0, b0)), s1 = hsum8(_mm256_add_ps(a1, b1)),
              s2 = hsum8(_mm256_add_ps(a2, b2)), s3 = hsum8(_mm256_add_ps(a3, b3));
        for (; i < n; i++) {
            s0 += x0[i] * w[i];
            s1 += x1[i] * w[i];
            s2 += x2[i] * w[i];
            s3 += x3[i] * w[i];
        }
        acc[r] += s0;
        acc[r + 1] += s1;
        acc[r + 2] += s2;
        acc[r + 3] += s3;
    }
    for (; r < nr; r++) {
        const float *x0 = x + r * ldx;
        __m256 a0 = _mm256_setzero_ps(), b0 = a0;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + i), _mm256_loadu_ps(w + i), a0);
            b0 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + i + 8), _mm256_loadu_ps(w + i + 8), b0);
        }
        if (i + 8 <= n) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + i), _mm256_loadu_ps(w + i), a0);
            i += 8;
        }
        float s0 = hsum8(_mm256_add_ps(a0, b0));
        for (; i < n; i++) s0 += x0[i] * w[i];
        acc[r] += s0;
    }
}
#endif

static void dots(bool avx, const float *x, int64_t ldx, int nr, const float *w, int64_t n,
                 float *acc) {
#ifdef TK_X86
    if (avx) {
        dots_avx2(x, ldx, nr, w, n, acc);
        return;
    }
#endif
    for (int r = 0; r < nr; r++) {
        const float *xr = x + r * ldx;
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; i++) s += xr[i] * w[i];
        acc[r] += s;
    }
}

/* out (R, N) = x (R, K) . w^T for a few rows: each row of w is converted in
 * chunks into a stack buffer and dotted with every row of x, so weights are
 * read once; the right shape for decoding, where R is the batch. */
static void matmul_fused(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                         int64_t N, float *out, int nt) {
    bool avx = tk_have_avx2();
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
    for (int64_t r0 = 0; r0 < R; r0 += TK_MATMUL_FUSED_R) {
        int nr = (int)TIDE_MIN(TK_MATMUL_FUSED_R, R - r0);
#pragma omp parallel for schedule(static) num_threads(nt) if (N * K >= TK_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            _Alignas(32) float buf[TK_CHUNK];
            float acc[TK_MATMUL_FUSED_R] = {0};
            const uint8_t *wr = wb + (size_t)n * (size_t)K * es;
            for (int64_t k0 = 0; k0 < K; k0 += TK_CHUNK) {
                int64_t len = TIDE_MIN(TK_CHUNK, K - k0);
                const float *wf = buf;
                if (wdt == TIDE_F32)
                    wf = (const float *)wr + k0;
                else
                    tk_convert(wr + (size_t)k0 * es, wdt, buf, (size_t)len);
                dots(avx, x + r0 * K + k0, K, nr, wf, len, acc);
            }
            for (int r = 0; r < nr; r++) out[(r0 + r) * N + n] = acc[r];
        }
    }
}

/* Splits an (R, N) output among nt threads as a pm x pn grid of tiles, pm a
 * divisor of nt chosen to make tiles closest to square. */
static int grid_rows(int nt, int64_t R, int64_t N) {
    int best = 1;
    double bestq = 1e300;
    for (int pm = 1; pm <= nt; pm++) {
        if (nt % pm) continue;
        double h = (double)R / pm, w = (double)N / (nt / pm);
        double q = h > w ? h / w : w / h;
        if (h >= 1 && q < bestq) {
            bestq = q;
            best = pm;
        }
    }
    return best;
}

/* Thread `tid`'s tile of the grid over (R, N): rows [*r0, *r1), columns
 * [*c0, *c1) (columns cut at multiples of 16 to keep sgemm on full panels). */
static void grid_tile(int tid, int nt, int pm, int64_t R, int64_t N, int64_t *r0, int64_t *r1,
                      int64_t *c0, int64_t *c1) {
    int pn = nt / pm, im = tid / pn, in = tid % pn;
    *r0 = R * im / pm;
    *r1 = R * (im + 1) / pm;
    *c0 = in == 0 ? 0 : (N * in / pn) & ~(int64_t)15;
    *c1 = in == pn - 1 ? N : (N * (in + 1) / pn) & ~(int64_t)15;
}

/* One single-threaded sgemm of a tile: out[r0:r1, c0:c1] = x[r0:r1] . wf^T
 * where wf holds w rows c0.. (row stride K). */
static void sgemm_tile(const float *x, const float *wf, int64_t K, int64_t N, float *out,
                       int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (r1 <= r0 || c1 <= c0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)(c1 - c0), (int)K,
                1.0f, x + r0 * K, (int)K, wf, (int)K, 0.0f, out + r0 * N + c0, (int)N);
}

tide_status tk_matmul(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                      int64_t N, float *out, void *scratch, size_t scratch_bytes, int nt) {
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX) return TIDE_E_UNSUPPORTED;
    int64_t nb = wdt == TIDE_F32 ? N : scratch ? (int64_t)(scratch_bytes / ((size_t)K * sizeof(float))) : 0;
    if (R < TK_MATMUL_FUSED_R || nb < 1) {
        matmul_fused(x, w, wdt, R, K, N, out, nt);
        return TIDE_OK;
    }
    /* OpenBLAS runs single-threaded inside our OpenMP threads: one thread
     * pool, so no pool spins on cores the other needs. Its setting is global,
     * so the caller's is put back afterwards. */
    int blas_nt = openblas_get_num_threads();
    if (blas_nt != 1) openblas_set_num_threads(1);
    nb = TIDE_MIN(nb, N);
    int64_t nblk = (N + nb - 1) / nb;
    nb = (N + nblk - 1) / nblk; /* equal blocks: no thin last sgemm */
    int nth = (int)TIDE_MIN((int64_t)nt, R * ((nb + 15) / 16));
    int pm = grid_rows(nth, R, nb);
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
    float *wf = scratch;
#pragma omp parallel num_threads(nth)
    {
        int tid = omp_get_thread_num(), nthr = omp_get_num_threads();
        for (int64_t n0 = 0; n0 < N; n0 += nb) {
            int64_t cnt = TIDE_MIN(nb, N - n0);
            const float *blk = (const float *)w + n0 * K;
            if (wdt != TIDE_F32) {
#pragma omp for schedule(static)
                for (int64_t i = 0; i < cnt; i++)
                    tk_convert(wb + (size_t)(n0 + i) * (size_t)K * es, wdt, wf + i * K, (size_t)K);
                blk = wf;
            }
            int64_t r0, r1, c0, c1;
            if (nthr == nth) {
                grid_tile(tid, nth, pm, R, cnt, &r0, &r1, &c0, &c1);
                sgemm_tile(x, blk + c0 * K, K, N, out + n0, r0, r1, c0, c1);
            } else if (tid == 0) { /* the runtime gave fewer threads: one tile */
                sgemm_tile(x, blk, K, N, out + n0, 0, R, 0, cnt);
            }
#pragma omp barrier
        }
    }
    if (blas_nt != 1) openblas_set_num_threads(blas_nt);
    return TIDE_OK;
}

/* ------------------------------------------------------------- rope */

#define TK_ROPE_CHUNK 128

void tk_rope(const float *x, const int32_t *pos, int64_t R, int64_t T, int H, int hd,
             float theta, float *out, int nt) {
    int half = hd / 2;
    int64_t D = (int64_t)H * hd;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * D >= TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        float p = (float)pos[r % T];
        float c[TK_ROPE_CHUNK], s[TK_ROPE_CHUNK];
        for (int i0 = 0; i0 < half; i0 += TK_ROPE_CHUNK) {
            int n = TIDE_MIN(TK_ROPE_CHUNK, half - i0);
            for (int i = 0; i < n; i++) {
                /* as HF: inv_freq = 1 / theta ** (arange(0, hd, 2).float() / hd), in f32 */
                float inv = 1.0f / powf(theta, (float)(2 * (i0 + i)) / (float)hd);
                float a = p * inv;
                c[i] = cosf(a);
                s[i] = sinf(a);
            }
            for (int h = 0; h < H; h++) {
                const float *xr = x + r * D + (int64_t)h * hd + i0;
                float *orow = out + r * D + (int64_t)h * hd + i0;
#pragma omp simd
                for (int i = 0; i < n; i++) {
                    float x0 = xr[i], x1 = xr[i + half];
                    orow[i] = x0 * c[i] - x1 * s[i];
                    orow[i + half] = x1 * c[i] + x0 * s[i];
                }
            }
        }
    }
}

/* ------------------------------------------------------------- attention */

/* Tile budget: the transposed key tile and the output tile hold at most
 * ATT_BUF floats each, so a task's stack is < 96 KiB for any head_dim. */
#define ATT_BUF 8192
#define ATT_MAX_ROWS 64
#define ATT_MAX_KEYS 64

typedef struct att_task {
    int nrows;
    const float *qrow[ATT_MAX_ROWS];
    float *orow[ATT_MAX_ROWS];
    int64_t rpos[ATT_MAX_ROWS];
} att_task;

/* S[i][j] = scale * q_i . Kt[:, j] for rows i, keys j < jmax[i] rounded up to
 * 8 or 16. Kt (hd, ldk) holds keys as columns, zero past the tile's keys. */
static void att_scores_generic(const att_task *tk, const float *Kt, int ldk, const int *jmax,
                               int hd, float scale, float *S, int lds) {
    for (int i = 0; i < tk->nrows; i++) {
        float *s = S + i * lds;
        int n = jmax[i];
        for (int j = 0; j < n; j++) s[j] = 0;
        for (int d = 0; d < hd; d++) {
            float qd = tk->qrow[i][d];
            const float *kt = Kt + d * ldk;
#pragma omp simd
            for (int j = 0; j < n; j++) s[j] += qd * kt[j];
        }
        for (int j = 0; j < n; j++) s[j] *= scale;
    }
}

/* O[i] += sum_{ja <= j < jb} P[i][j] * V_j; V_j = vb + j * vs. */
static void att_pv_row_generic(const float *p, int ja, int jb, const float *vb, int64_t vs,
                               int hd, float *o) {
    for (int j = ja; j < jb; j++) {
        float pj = p[j];
        const float *vr = vb + j * vs;
#pragma omp simd
        for (int d = 0; d < hd; d++) o[d] += pj * vr[d];
    }
}

#ifdef TK_X86
TK_AVX2 static void att_scores_avx2(const att_task *tk, const float *Kt, int ldk, const int *jmax,
                                    int hd, float scale, float *S, int lds) {
    __m256 sc = _mm256_set1_ps(scale);
    int i = 0;
    for (; i + 4 <= tk->nrows; i += 4) {
        int n = TIDE_MAX(TIDE_MAX(jmax[i], jmax[i + 1]), TIDE_MAX(jmax[i + 2], jmax[i + 3]));
        const float *q0 = tk->qrow[i], *q1 = tk->qrow[i + 1], *q2 = tk->qrow[i + 2],
                    *q3 = tk->qrow[i + 3];
        for (int j = 0; j < n; j += 16) {
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00,
                   a21 = a00, a30 = a00, a31 = a00;
            const float *kt = Kt + j;
            for (int d = 0; d < hd; d++, kt += ldk) {
                __m256 k0 = _mm256_load_ps(kt), k1 = _mm256_load_ps(kt + 8), b;
                b = _mm256_broadcast_ss(q0 + d);
                a00 = _mm256_fmadd_ps(b, k0, a00);
                a01 = _mm256_fmadd_ps(b, k1, a01);
                b = _mm256_broadcast_ss(q1 + d);
                a10 = _mm256_fmadd_ps(b, k0, a10);
                a11 = _mm256_fmadd_ps(b, k1, a11);
                b = _mm256_broadcast_ss(q2 + d);
                a20 = _mm256_fmadd_ps(b, k0, a20);
                a21 = _mm256_fmadd_ps(b, k1, a21);
                b = _mm256_broadcast_ss(q3 + d);
                a30 = _mm256_fmadd_ps(b, k0, a30);
                a31 = _mm256_fmadd_ps(b, k1, a31);
            }
            float *s = S + i * lds + j;
            _mm256_store_ps(s, _mm256_mul_ps(a00, sc));
            _mm256_store_ps(s + 8, _mm256_mul_ps(a01, sc));
            _mm256_store_ps(s + lds, _mm256_mul_ps(a10, sc));
            _mm256_store_ps(s + lds + 8, _mm256_mul_ps(a11, sc));
            _mm256_store_ps(s + 2 * lds, _mm256_mul_ps(a20, sc));
            _mm256_store_ps(s + 2 * lds + 8, _mm256_mul_ps(a21, sc));
            _mm256_store_ps(s + 3 * lds, _mm256_mul_ps(a30, sc));
            _mm256_store_ps(s + 3 * lds + 8, _mm256_mul_ps(a31, sc));
        }
    }
    for (; i < tk->nrows; i++) {
        const float *q0 = tk->qrow[i];
        for (int j = 0; j < jmax[i]; j += 16) {
            __m256 a00 = _mm256_setzero_ps(), a01 = a00;
            const float *kt = Kt + j;
            for (int d = 0; d < hd; d++, kt += ldk) {
                __m256 b = _mm256_broadcast_ss(q0 + d);
                a00 = _mm256_fmadd_ps(b, _mm256_load_ps(kt), a00);
                a01 = _mm256_fmadd_ps(b, _mm256_load_ps(kt + 8), a01);
            }
            _mm256_store_ps(S + i * lds + j, _mm256_mul_ps(a00, sc));
            _mm256_store_ps(S + i * lds + j + 8, _mm256_mul_ps(a01, sc));
        }
    }
}

/* One row, keys ja..jb-1, hd % 16 == 0; per element the same FMA sequence as
 * the 4-row kernel, so grouping never changes a bit. */
TK_AVX2 static void att_pv_row_avx2(const float *p, int ja, int jb, const float *vb, int64_t vs,
                                    int hd, float *o) {
    for (int d = 0; d < hd; d += 16) {
        __m256 o0 = _mm256_loadu_ps(o + d), o1 = _mm256_loadu_ps(o + d + 8);
        for (int j = ja; j < jb; j++) {
            __m256 b = _mm256_broadcast_ss(p + j);
            const float *vr = vb + j * vs + d;
            o0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(vr), o0);
            o1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(vr + 8), o1);
        }
        _mm256_storeu_ps(o + d, o0);
        _mm256_storeu_ps(o + d + 8, o1);
    }
}

TK_AVX2 static void att_pv_avx2(const float *P, int lds, const int *lim, int nrows,
                                const float *vb, int64_t vs, int hd, float *O) {
    int i = 0;
    for (; i + 4 <= nrows; i += 4) {
        int jc = TIDE_MIN(TIDE_MIN(lim[i], lim[i + 1]), TIDE_MIN(lim[i + 2], lim[i + 3]));
        const float *p0 = P + i * lds, *p1 = p0 + lds, *p2 = p1 + lds, *p3 = p2 + lds;
        for (int d = 0; d < hd; d += 16) {
            float *o = O + i * hd + d;
            __m256 a00 = _mm256_loadu_ps(o), a01 = _mm256_loadu_ps(o + 8);
            __m256 a10 = _mm256_loadu_ps(o + hd), a11 = _mm256_loadu_ps(o + hd + 8);
            __m256 a20 = _mm256_loadu_ps(o + 2 * hd), a21 = _mm256_loadu_ps(o + 2 * hd + 8);
            __m256 a30 = _mm256_loadu_ps(o + 3 * hd), a31 = _mm256_loadu_ps(o + 3 * hd + 8);
            for (int j = 0; j < jc; j++) {
                const float *vr = vb + j * vs + d;
                __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8), b;
                b = _mm256_broadcast_ss(p0 + j);
                a00 = _mm256_fmadd_ps(b, v0, a00);
                a01 = _mm256_fmadd_ps(b, v1, a01);
                b = _mm256_broadcast_ss(p1 + j);
                a10 = _mm256_fmadd_ps(b, v0, a10);
                a11 = _mm256_fmadd_ps(b, v1, a11);
                b = _mm256_broadcast_ss(p2 + j);
                a20 = _mm256_fmadd_ps(b, v0, a20);
                a21 = _mm256_fmadd_ps(b, v1, a21);
                b = _mm256_broadcast_ss(p3 + j);
                a30 = _mm256_fmadd_ps(b, v0, a30);
                a31 = _mm256_fmadd_ps(b, v1, a31);
            }
            _mm256_storeu_ps(o, a00);
            _mm256_storeu_ps(o + 8, a01);
            _mm256_storeu_ps(o + hd, a10);
            _mm256_storeu_ps(o + hd + 8, a11);
            _mm256_storeu_ps(o + 2 * hd, a20);
            _mm256_storeu_ps(o + 2 * hd + 8, a21);
            _mm256_storeu_ps(o + 3 * hd, a30);
            _mm256_storeu_ps(o + 3 * hd + 8, a31);
        }
        for (int r = 0; r < 4; r++)
            if (lim[i + r] > jc)
                att_pv_row_avx2(P + (i + r) * lds, jc, lim[i + r], vb, vs, hd, O + (i + r) * hd);
    }
    for (; i < nrows; i++) att_pv_row_avx2(P + i * lds, 0, lim[i], vb, vs, hd, O + i * hd);
}
#endif

/* Online-softmax step for one row: s holds n > 0 scores of this key tile;
 * replaces them with p_j = exp(s_j - m'), m' = max(*m, max s), updates the
 * running max *m and sum *l, and returns the factor exp(*m - m') that earlier
 * accumulations must be scaled by. */
static float att_softmax_generic(float *s, int n, float *m, float *l) {
    float mx = s[0];
    for (int j = 1; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    float mnew = mx > *m ? mx : *m;
    float corr = expf(*m - mnew), sum = 0;
    for (int j = 0; j < n; j++) {
        float pj = expf(s[j] - mnew);
        s[j] = pj;
        sum += pj;
    }
    *l = *l * corr + sum;
    *m = mnew;
    return corr;
}

/* Kt[d * ldk + j] = key j's element d, for keys j < nk (key j at kb + j * vs). */
static void att_transpose_generic(const float *kb, int64_t vs, int nk, int hd, float *Kt, int ldk) {
    for (int j = 0; j < nk; j++) {
        const float *kr = kb + j * vs;
        for (int d = 0; d < hd; d++) Kt[d * ldk + j] = kr[d];
    }
}

#ifdef TK_X86
/* exp(x) for x <= 0 (softmax arguments): Cody-Waite reduction by ln 2 and a
 * degree-6 polynomial, within 2 ulp of expf; results below the smallest
 * normal float flush to 0; NaN stays NaN. */
TK_AVX2 static __m256 exp_neg_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x); /* keeps NaN: MAXPS returns the second operand */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* att_softmax_generic in 8-float blocks; s has room for n rounded up to 8
 * (lanes past n become 0). */
TK_AVX2 static float att_softmax_avx2(float *s, int n, float *m, float *l) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmx = ninf;
    for (int j = 0; j < n; j += 8) {
        __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lane));
        vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + j), valid));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmx), _mm256_extractf128_ps(vmx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float mx = _mm_cvtss_f32(h);
    float mnew = mx > *m ? mx : *m;
    __m256 vm = _mm256_set1_ps(mnew), vsum = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lane));
        __m256 p = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        p = _mm256_and_ps(p, valid);
        _mm256_storeu_ps(s + j, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    float corr = _mm_cvtss_f32(_mm256_castps256_ps128(exp_neg_avx2(_mm256_set1_ps(*m - mnew))));
    *l = *l * corr + hsum8(vsum);
    *m = mnew;
    return corr;
}

/* att_transpose_generic with 8x8 register transposes (hd % 8 == 0). */
TK_AVX2 static void att_transpose_avx2(const float *kb, int64_t vs, int nk, int hd, float *Kt, int ldk) {
    int j = 0;
    for (; j + 8 <= nk; j += 8) {
        for (int d = 0; d < hd; d += 8) {
            __m256 r0 = _mm256_loadu_ps(kb + (j + 0) * vs + d), r1 = _mm256_loadu_ps(kb + (j + 1) * vs + d);
            __m256 r2 = _mm256_loadu_ps(kb + (j + 2) * vs + d), r3 = _mm256_loadu_ps(kb + (j + 3) * vs + d);
            __m256 r4 = _mm256_loadu_ps(kb + (j + 4) * vs + d), r5 = _mm256_loadu_ps(kb + (j + 5) * vs + d);
            __m256 r6 = _mm256_loadu_ps(kb + (j + 6) * vs + d), r7 = _mm256_loadu_ps(kb + (j + 7) * vs + d);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
            __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
            __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
            float *o = Kt + d * ldk + j;
            _mm256_store_ps(o + 0 * ldk, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_store_ps(o + 1 * ldk, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_store_ps(o + 2 * ldk, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_store_ps(o + 3 * ldk, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_store_ps(o + 4 * ldk, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_store_ps(o + 5 * ldk, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_store_ps(o + 6 * ldk, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_store_ps(o + 7 * ldk, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    }
    if (j < nk) att_transpose_generic(kb + j * vs, vs, nk - j, hd, Kt + j, ldk);
}
#endif

/* Runs one task: its rows against cache positions 0..max rpos of kv head g
 * (kb/vb point at position 0 of that head, vs floats between positions). */
static void att_run_task(const att_task *tk, const float *kb, const float *vb, int64_t vs, int hd,
                         int BK, bool avx) {
    _Alignas(32) float Kt[ATT_BUF];
    _Alignas(32) float O[ATT_BUF];
    _Alignas(32) float S[ATT_MAX_ROWS * ATT_MAX_KEYS];
    float m[ATT_MAX_ROWS], l[ATT_MAX_ROWS];
    int lim[ATT_MAX_ROWS], jmax[ATT_MAX_ROWS];
    int nr = tk->nrows;
    int64_t maxp = 0;
    for (int i = 0; i < nr; i++) {
        maxp = TIDE_MAX(maxp, tk->rpos[i]);
        m[i] = -INFINITY;
        l[i] = 0;
    }
    memset(O, 0, (size_t)nr * (size_t)hd * sizeof(float));
    float scale = 1.0f / sqrtf((float)hd);
    bool avx_pv = avx && hd % 16 == 0;
    for (int64_t j0 = 0; j0 <= maxp; j0 += BK) {
        int nk = (int)TIDE_MIN((int64_t)BK, maxp + 1 - j0);
        int nkp = (nk + 15) & ~15;
#ifdef TK_X86
        if (avx && hd % 8 == 0)
            att_transpose_avx2(kb + j0 * vs, vs, nk, hd, Kt, BK);
        else
#endif
            att_transpose_generic(kb + j0 * vs, vs, nk, hd, Kt, BK);
        for (int d = 0; d < hd; d++)
            for (int j = nk; j < nkp; j++) Kt[d * BK + j] = 0;
        for (int i = 0; i < nr; i++) {
            int64_t n = tk->rpos[i] - j0 + 1;
            lim[i] = n <= 0 ? 0 : (int)TIDE_MIN(n, (int64_t)nk);
            jmax[i] = (lim[i] + 15) & ~15;
        }
#ifdef TK_X86
        if (avx)
            att_scores_avx2(tk, Kt, BK, jmax, hd, scale, S, BK);
        else
#endif
            att_scores_generic(tk, Kt, BK, jmax, hd, scale, S, BK);
        /* online softmax: rescale what was accumulated to the new running max */
        for (int i = 0; i < nr; i++) {
            if (lim[i] == 0) continue;
            float corr;
#ifdef TK_X86
            if (avx)
                corr = att_softmax_avx2(S + i * BK, lim[i], &m[i], &l[i]);
            else
#endif
                corr = att_softmax_generic(S + i * BK, lim[i], &m[i], &l[i]);
            if (corr != 1.0f) {
                float *o = O + i * hd;
#pragma omp simd
                for (int d = 0; d < hd; d++) o[d] *= corr;
            }
        }
        const float *vt = vb + j0 * vs;
#ifdef TK_X86
        if (avx_pv) {
            att_pv_avx2(S, BK, lim, nr, vt, vs, hd, O);
            continue;
        }
#endif
        for (int i = 0; i < nr; i++) att_pv_row_generic(S + i * BK, 0, lim[i], vt, vs, hd, O + i * hd);
    }
    for (int i = 0; i < nr; i++) {
        const float *o = O + i * hd;
        float *dst = tk->orow[i], li = l[i];
#pragma omp simd
        for (int d = 0; d < hd; d++) dst[d] = o[d] / li;
    }
}

tide_status tk_attention(const float *q, const float *k, const float *v, const int32_t *pos,
                         float *kcache, float *vcache, float *o, const tk_attn_dims *dm,
                         int64_t *bad, int nt) {
    const int64_t B = dm->B, T = dm->T, C = dm->C;
    const int H = dm->H, KV = dm->KV, hd = dm->hd;
    if (hd > TK_ATTN_MAX_HD) return TIDE_E_UNSUPPORTED;
    for (int64_t t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= C) {
            *bad = t;
            return TIDE_E_RANGE;
        }
    const int64_t kd = (int64_t)KV * hd, qd = (int64_t)H * hd;
    /* cache write; t in order within b, so a repeated position keeps its last row */
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * kd >= TK_PAR_MIN)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            size_t dst = (size_t)((b * C + pos[t]) * kd), src = (size_t)((b * T + t) * kd);
            memcpy(kcache + dst, k + src, (size_t)kd * sizeof(float));
            memcpy(vcache + dst, v + src, (size_t)kd * sizeof(float));
        }

    const int BK = TIDE_MIN(ATT_MAX_KEYS, (ATT_BUF / hd) & ~15);
    const int NQ = TIDE_MIN(ATT_MAX_ROWS, ATT_BUF / hd);
    const int G = H / KV;
    const int HB = TIDE_MIN(G, NQ);          /* query heads per task */
    const int n_hb = (G + HB - 1) / HB;
    const int64_t BQ = TIDE_MAX(1, NQ / HB); /* queries per task */
    const int64_t n_qb = (T + BQ - 1) / BQ;
    const int64_t n_task = B * KV * n_hb * n_qb;
    const bool avx = tk_have_avx2();
    /* dynamic: a task's output does not depend on which thread runs it */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (n_task > 1)
    for (int64_t task = 0; task < n_task; task++) {
        int64_t qb = n_qb - 1 - task % n_qb; /* later queries see more keys: first */
        int64_t rest = task / n_qb;
        int hb = (int)(rest % n_hb);
        rest /= n_hb;
        int g = (int)(rest % KV);
        int64_t b = rest / KV;
        att_task tk;
        tk.nrows = 0;
        int64_t t0 = qb * BQ, t1 = TIDE_MIN(T, t0 + BQ);
        int h0 = g * G + hb * HB, h1 = TIDE_MIN(g * G + G, h0 + HB);
        for (int h = h0; h < h1; h++)
            for (int64_t t = t0; t < t1; t++) {
                int64_t row = b * T + t;
                tk.qrow[tk.nrows] = q + row * qd + (int64_t)h * hd;
                tk.orow[tk.nrows] = o + row * qd + (int64_t)h * hd;
                tk.rpos[tk.nrows] = pos[t];
                tk.nrows++;
            }
        const float *kb = kcache + b * C * kd + (int64_t)g * hd;
        const float *vb = vcache + b * C * kd + (int64_t)g * hd;
        att_run_task(&tk, kb, vb, kd, hd, BK, avx);
    }
    return TIDE_OK;
}

/* ------------------------------------------------------------- elementwise */

void tk_silu_mul(const float *gate, const float *up, float *out, int64_t n, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TK_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void tk_add(const float *a, const float *b, float *out, int64_t n, int nt) {
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TK_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void tk_take_last(const float *x, int64_t B, int64_t T, int64_t D, float *out) {
    for (int64_t b = 0; b < B; b++)
        memcpy(out + b * D, x + (b * T + T - 1) * D, (size_t)D * sizeof(float));
}

void tk_argmax(const float *x, int64_t R, int64_t V, int32_t *out, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt) if (R * V >= TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * V;
        int64_t best = 0;
        for (int64_t j = 0; j < V; j++) {
            if (isnan(xr[j])) {
                best = j;
                break;
            }
            if (xr[j] > xr[best]) best = j;
        }
        out[r] = (int32_t)best;
    }
}

/* ------------------------------------------------------------- generic */

#define TK_GEN_CHUNK 65536

void tk_generic(int n_in, const uint8_t *const *in, const uint64_t *in_bytes, int n_out,
                uint8_t *const *out, const uint64_t *out_bytes, int nt) {
    for (int k = 0; k < n_out; k++) {
        uint64_t n = out_bytes[k];
        int64_t nchunk = (int64_t)((n + TK_GEN_CHUNK - 1) / TK_GEN_CHUNK);
        uint8_t *dst = out[k];
#pragma omp parallel for schedule(static) num_threads(nt) if (nchunk > 1)
        for (int64_t c = 0; c < nchunk; c++) {
            uint64_t j0 = (uint64_t)c * TK_GEN_CHUNK, j1 = TIDE_MIN(n, j0 + TK_GEN_CHUNK);
            uint64_t idx[TIDE_OP_MAX_IN];
            for (int i = 0; i < n_in; i++) idx[i] = j0 % in_bytes[i];
            for (uint64_t j = j0; j < j1; j++) {
                uint32_t s = 31u * (uint32_t)j + 17u * (uint32_t)k;
                for (int i = 0; i < n_in; i++) {
                    s += (uint32_t)(i + 1) * in[i][idx[i]];
                    if (++idx[i] == in_bytes[i]) idx[i] = 0;
                }
                dst[j] = (uint8_t)s;
            }
        }
    }
}
