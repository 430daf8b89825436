/*
 * matmul.c - MATMUL on the CPU (tk_matmul, tk_matmul_fast, tk_matmul_ex of
 * kernels.h) and the sgemm drivers of kernels_int.h (tk_sgemm, tk_gemm).
 *
 * Threads: MATMUL runs OpenBLAS single-threaded on each OpenMP thread's tile:
 * with Debian's pthread OpenBLAS, a second pool of BLAS threads would spin on
 * the cores our OpenMP threads need (and ours on theirs) between ops, costing
 * 10-20% of a bf16 matmul; with one pool the conversion and the sgemm calls
 * share the threads.
 *
 * MATMUL's training forms (w as (K, N), accumulating) and every product of
 * the training kernels go through tk_gemm instead: the output cut into tiles
 * fixed by the shape, not by the thread count, so that their bits do not
 * depend on it; each tile one single-threaded sgemm over the whole of K.
 *
 * With AVX-512, the products with w as (N, K) are matmul_avx512.c's
 * register-tiled kernels (tk_mm_f32w, tk_mm_bf16); the choice of path and
 * the other paths are here.
 */
#include "backend/cpu/kernels_int.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <string.h>

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
                         int64_t N, float *out, int64_t ldo, bool add, int nt) {
    if (tk_have_avx512()) {
        tk_mm_f32w(x, K, w, wdt, R, K, N, out, ldo, add, nt);
        return;
    }
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
            for (int r = 0; r < nr; r++) {
                float *dst = out + (r0 + r) * ldo + n;
                *dst = add ? *dst + acc[r] : acc[r];
            }
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
 * where wf holds w rows c0.. (row stride K) and out has row stride ldo. */
static void sgemm_tile(const float *x, const float *wf, int64_t K, int64_t ldo, float *out,
                       int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (r1 <= r0 || c1 <= c0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)(c1 - c0), (int)K,
                1.0f, x + r0 * K, (int)K, wf, (int)K, 0.0f, out + r0 * ldo + c0, (int)ldo);
}

/* Rows of x (or of its bf16 rounding) are this many bytes longer in scratch
 * than they are: with K a multiple of 1024 rows would lie a multiple of 4 KiB
 * apart, and a register tile's rows of x and w would all fall in one L1 set. */
#define TK_ROW_PAD 64

/* tk_mm_f32w on x copied a chunk of rows at a time into scratch with padded
 * rows (the same values: the bits do not change), or on x in place when
 * scratch holds less than one padded row. */
static void mm_f32w_padded(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                           float *out, int64_t ldo, bool add, void *scratch, size_t scratch_bytes, int nt) {
    int64_t ld = K + TK_ROW_PAD / (int64_t)sizeof(float);
    int64_t rows = scratch ? (int64_t)(scratch_bytes / ((size_t)ld * sizeof(float))) : 0;
    if (rows < 1) {
        tk_mm_f32w(x, K, w, wdt, R, K, N, out, ldo, add, nt);
        return;
    }
    float *xp = scratch;
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
        int64_t n = TIDE_MIN(rows, R - r0);
#pragma omp parallel for schedule(static) num_threads(nt) if (n * K >= 4 * TK_PAR_MIN)
        for (int64_t r = 0; r < n; r++) memcpy(xp + r * ld, x + (r0 + r) * K, (size_t)K * sizeof(float));
        tk_mm_f32w(xp, ld, w, wdt, n, K, N, out + r0 * ldo, ldo, add, nt);
    }
}

tide_status tk_matmul(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                      int64_t N, float *out, int64_t ldo, void *scratch, size_t scratch_bytes, int nt) {
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX || ldo > INT_MAX) return TIDE_E_UNSUPPORTED;
    if (tk_have_avx512()) { /* every row count, the weights widened in registers */
        mm_f32w_padded(x, w, wdt, R, K, N, out, ldo, false, scratch, scratch_bytes, nt);
        return TIDE_OK;
    }
    int64_t nb = wdt == TIDE_F32 ? N : scratch ? (int64_t)(scratch_bytes / ((size_t)K * sizeof(float))) : 0;
    if (R < TK_MATMUL_FUSED_R || nb < 1) {
        matmul_fused(x, w, wdt, R, K, N, out, ldo, false, nt);
        return TIDE_OK;
    }
    int blas_nt = tk_blas_single();
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
                sgemm_tile(x, blk + c0 * K, K, ldo, out + n0, r0, r1, c0, c1);
            } else if (tid == 0) { /* the runtime gave fewer threads: one tile */
                sgemm_tile(x, blk, K, ldo, out + n0, 0, R, 0, cnt);
            }
#pragma omp barrier
        }
    }
    tk_blas_restore(blas_nt);
    return TIDE_OK;
}

size_t tk_matmul_fast_min_scratch(int64_t K) { return (size_t)K * sizeof(uint16_t); }

bool tk_matmul_fast_native(tide_dtype wdt) { return wdt == TIDE_BF16 && tk_cpu_has(TK_CPU_AVX512BF16); }

tide_status tk_matmul_fast(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                           bool accumulate, float *out, int64_t ldo, void *scratch, size_t scratch_bytes, int nt) {
    if (!tk_matmul_fast_native(wdt))
        return tk_matmul_ex(x, w, wdt, R, K, N, false, accumulate, out, ldo, scratch, scratch_bytes, nt);
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX || ldo > INT_MAX) return TIDE_E_UNSUPPORTED;
    int64_t ld = K + TK_ROW_PAD / (int64_t)sizeof(uint16_t);
    if (!scratch || scratch_bytes < (size_t)ld * sizeof(uint16_t)) ld = K;
    int64_t rows = scratch ? (int64_t)(scratch_bytes / ((size_t)ld * sizeof(uint16_t))) : 0;
    if (rows < 1) return TIDE_E_INVALID;
    /* the activations rounded to bf16 a chunk of rows at a time: a row's
     * result does not depend on the chunk it is in */
    uint16_t *xb = scratch;
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
        int64_t n = TIDE_MIN(rows, R - r0);
        tk_round_bf16(x + r0 * K, K, n, K, xb, ld, nt);
        tk_mm_bf16(xb, ld, w, n, K, N, out + r0 * ldo, ldo, accumulate, nt);
    }
    return TIDE_OK;
}

/* ------------------------------------------------------------- fixed-tile sgemm */

const char *tk_blas_corename(void) { return openblas_get_corename(); }

/* OpenBLAS runs single-threaded inside our OpenMP threads: one thread pool,
 * so no pool spins on cores the other needs. Its setting is global, so the
 * caller's is put back afterwards (tk_blas_restore). */
int tk_blas_single(void) {
    int prev = openblas_get_num_threads();
    if (prev != 1) openblas_set_num_threads(1);
    return prev;
}

void tk_blas_restore(int prev) {
    if (prev != 1) openblas_set_num_threads(prev);
}

void tk_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* Tile counts a product may be cut into: divisible by 2 and by 3 where they
 * can be, so that two or three threads get equal shares. */
static const int gemm_counts[] = {24, 16, 12, 8, 6, 4, 3, 2, 1};

/* The grid (pm x pn tiles) of an (M, N) output summed over K: the most tiles
 * of gemm_counts whose tiles are at least TK_GEMM_MIN_TILE on each side (or
 * the whole side) and TK_GEMM_MIN_FLOPS each, then the squarest. A function
 * of the shape alone. */
#define TK_GEMM_MIN_TILE 64
#define TK_GEMM_MIN_FLOPS 4e6
static void gemm_grid(int64_t M, int64_t N, int64_t K, int *pm, int *pn) {
    int64_t cm = TIDE_MAX(1, M / TK_GEMM_MIN_TILE), cn = TIDE_MAX(1, N / TK_GEMM_MIN_TILE);
    double cf = 2.0 * (double)M * (double)N * (double)K / TK_GEMM_MIN_FLOPS;
    *pm = *pn = 1;
    for (size_t c = 0; c < sizeof gemm_counts / sizeof gemm_counts[0]; c++) {
        int n = gemm_counts[c];
        if (n > cf && n > 1) continue;
        double bestq = 1e300;
        for (int a = 1; a <= n; a++) {
            if (n % a || a > cm || n / a > cn) continue;
            double h = (double)M / a, w = (double)N / (n / a), q = h > w ? h / w : w / h;
            if (q < bestq) {
                bestq = q;
                *pm = a;
                *pn = n / a;
            }
        }
        if (bestq < 1e300) return;
    }
}

void tk_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc, int nt) {
    int pm, pn;
    gemm_grid(M, N, K, &pm, &pn);
    int ntile = pm * pn;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (ntile > 1 && nt > 1)
    for (int t = 0; t < ntile; t++) {
        int im = t / pn, in = t % pn;
        int64_t r0 = M * im / pm, r1 = M * (im + 1) / pm;
        int64_t c0 = in == 0 ? 0 : (N * in / pn) & ~(int64_t)15;
        int64_t c1 = in == pn - 1 ? N : (N * (in + 1) / pn) & ~(int64_t)15;
        if (c1 <= c0) continue;
        const float *a = ta ? A + r0 : A + r0 * lda;
        const float *b = tb ? B + c0 * ldb : B + c0;
        tk_sgemm(ta, tb, r1 - r0, c1 - c0, K, alpha, a, lda, b, ldb, beta, C + r0 * ldc + c0, ldc);
    }
}

/* ------------------------------------------------------------- matmul, training forms */

/* out (R, N) (+)= x (R, K) . w for w (K, N) of wdt and a few rows: each task
 * owns a block of output columns and runs k in order, converting w's rows
 * a chunk at a time into a stack buffer. */
#define TK_NT_COLS 256
static void matmul_nt_fused(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                            int64_t N, float *out, int64_t ldo, bool add, int nt) {
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
    int64_t ncb = (N + TK_NT_COLS - 1) / TK_NT_COLS;
    for (int64_t r0 = 0; r0 < R; r0 += TK_MATMUL_FUSED_R) {
        int nr = (int)TIDE_MIN(TK_MATMUL_FUSED_R, R - r0);
#pragma omp parallel for schedule(static) num_threads(nt) if (N * K >= TK_PAR_MIN)
        for (int64_t cb = 0; cb < ncb; cb++) {
            int64_t c0 = cb * TK_NT_COLS;
            int n = (int)TIDE_MIN(TK_NT_COLS, N - c0);
            _Alignas(32) float buf[TK_NT_COLS];
            _Alignas(32) float acc[TK_MATMUL_FUSED_R][TK_NT_COLS];
            memset(acc, 0, sizeof acc);
            for (int64_t k = 0; k < K; k++) {
                const float *wf = buf;
                if (wdt == TIDE_F32)
                    wf = (const float *)w + k * N + c0;
                else
                    tk_convert(wb + (size_t)(k * N + c0) * es, wdt, buf, (size_t)n);
                for (int r = 0; r < nr; r++) {
                    float xv = x[(r0 + r) * K + k];
                    float *a = acc[r];
#pragma omp simd
                    for (int j = 0; j < n; j++) a[j] += xv * wf[j];
                }
            }
            for (int r = 0; r < nr; r++) {
                float *dst = out + (r0 + r) * ldo + c0;
                if (add) {
#pragma omp simd
                    for (int j = 0; j < n; j++) dst[j] += acc[r][j];
                } else {
                    memcpy(dst, acc[r], (size_t)n * sizeof(float));
                }
            }
        }
    }
}

tide_status tk_matmul_ex(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                         bool w_kn, bool accumulate, float *out, int64_t ldo, void *scratch,
                         size_t scratch_bytes, int nt) {
    if (!w_kn && !accumulate) return tk_matmul(x, w, wdt, R, K, N, out, ldo, scratch, scratch_bytes, nt);
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX || ldo > INT_MAX) return TIDE_E_UNSUPPORTED;
    if (!w_kn && tk_have_avx512()) {
        mm_f32w_padded(x, w, wdt, R, K, N, out, ldo, true, scratch, scratch_bytes, nt);
        return TIDE_OK;
    }
    float beta = accumulate ? 1.0f : 0.0f;
    int prev = tk_blas_single();
    if (wdt == TIDE_F32) {
        tk_gemm(false, !w_kn, R, N, K, 1.0f, x, K, w, w_kn ? N : K, beta, out, ldo, nt);
        tk_blas_restore(prev);
        return TIDE_OK;
    }
    /* 16-bit weights: widened a block at a time into scratch; a block is
     * whole rows of w (N, K) or whole columns of w (K, N), so each output
     * element is still one sum over all of K */
    int64_t nb = scratch ? (int64_t)(scratch_bytes / ((size_t)K * sizeof(float))) : 0;
    if (R < TK_MATMUL_FUSED_R || nb < 1) {
        tk_blas_restore(prev);
        if (w_kn)
            matmul_nt_fused(x, w, wdt, R, K, N, out, ldo, accumulate, nt);
        else
            matmul_fused(x, w, wdt, R, K, N, out, ldo, accumulate, nt);
        return TIDE_OK;
    }
    nb = TIDE_MIN(nb, N);
    int64_t nblk = (N + nb - 1) / nb;
    nb = (N + nblk - 1) / nblk;
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
    float *wf = scratch;
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t cnt = TIDE_MIN(nb, N - n0);
        if (w_kn) {
#pragma omp parallel for schedule(static) num_threads(nt) if (K * cnt >= TK_PAR_MIN)
            for (int64_t k = 0; k < K; k++)
                tk_convert(wb + (size_t)(k * N + n0) * es, wdt, wf + k * cnt, (size_t)cnt);
            tk_gemm(false, false, R, cnt, K, 1.0f, x, K, wf, cnt, beta, out + n0, ldo, nt);
        } else {
#pragma omp parallel for schedule(static) num_threads(nt) if (K * cnt >= TK_PAR_MIN)
            for (int64_t i = 0; i < cnt; i++)
                tk_convert(wb + (size_t)(n0 + i) * (size_t)K * es, wdt, wf + i * K, (size_t)K);
            tk_gemm(false, true, R, cnt, K, 1.0f, x, K, wf, K, beta, out + n0, ldo, nt);
        }
    }
    tk_blas_restore(prev);
    return TIDE_OK;
}
