/*
 * sgemm.c - the f32 GEMM behind every training product (tk_sgemm, tk_gemm
 * of kernels_int.h): MATMUL's training forms, MATMUL_GRADW, the fused
 * cross-entropy's logits and gradients, attention's backward.
 *
 * The code path is tide's own choice from cpuid (cpu_features.c), never a
 * BLAS's guess of the CPU: AVX-512 (F/BW/VL) register tiles of 12 x 32,
 * AVX2+FMA tiles of 6 x 16, or portable C tiles of 4 x 16.
 *
 * The classic packed layout, driven by gemm_drive.c: the output is walked
 * in blocks of NC columns, K in blocks of KC and the rows in blocks of MC;
 * each block of op(B) (KC x NC) and of op(A) (MC x KC) is copied into
 * contiguous panels of NR columns and MR rows (zeros past the edge),
 * whatever the transposition of the operands, so one register tile kernel
 * serves all four forms. op(A) is scaled by alpha while it is packed.
 *
 * The arithmetic of one output element is fixed by its row of op(A), its
 * column of op(B), K, alpha and beta alone:
 *     for each block b of TK_SGEMM_KC consecutive k from k = 0, in order:
 *         t = 0;  for k in b in order:  t = t + (alpha * a_k) * b_k
 *         s = b is the first ? t : s + t
 *     c = beta == 0 ? s : beta == 1 ? c + s : beta * c + s
 * with one rounding per step of t on the AVX-512 and AVX2 paths (FMA; those
 * two give the same bits) and two (a product, then a sum) on the portable
 * one. The blocks of K are also the cache blocks; summing each on its own
 * keeps the rounding error near that of a sum of TK_SGEMM_KC + K /
 * TK_SGEMM_KC terms rather than of K. Between blocks s waits as an f32 (in
 * C when beta is 0, else in a scratch the sums are added from; with beta 1
 * and K within one block, c + t is formed in the tile), so nothing
 * else changes the bits: not the element's place in a register tile, the
 * blocks of rows gemm_drive.c hands out, the thread count, nor the buffer
 * sizes (a failed allocation runs smaller blocks of M and N from the stack,
 * to the same bits).
 */
#include "backend/cpu/kernels_int.h"

#include <omp.h>
#include <string.h>

/* A path: its register tile sums t of the header over kc steps of the
 * packed panels a (kc x MR) and b (kc x NR) into c (MR x NR, row stride
 * ldc): c = t, or with add (the sums of the K blocks before in c) c = c + t;
 * half (NULL where there is none): the same over the first nr / 2 columns
 * of the panels (b still nr floats a step), for an edge of at most nr / 2
 * columns (a thin product's whole width): no work on the zeros past it. */
typedef struct {
    const char *name;
    int mr, nr;
    tk_gemm_tile_fn tile, half;
} sg_kernel;

/* ------------------------------------------------------------- register tiles */

/* The portable tile: a product rounded, then a sum rounded (kept in two
 * statements, and the file built with -ffp-contract=off, so no compiler
 * fuses them). */
#define SGP_MR 4
#define SGP_NR 16
static void tile_portable(int64_t kc, const void *a_, const void *b_, float *c, int64_t ldc, bool add) {
    const float *a = a_, *b = b_;
    float acc[SGP_MR][SGP_NR];
    for (int r = 0; r < SGP_MR; r++)
        for (int j = 0; j < SGP_NR; j++)
            acc[r][j] = 0.0f;
    for (int64_t k = 0; k < kc; k++) {
        for (int r = 0; r < SGP_MR; r++) {
            float av = a[r];
#pragma omp simd
            for (int j = 0; j < SGP_NR; j++) {
                float p = av * b[j];
                acc[r][j] = acc[r][j] + p;
            }
        }
        a += SGP_MR;
        b += SGP_NR;
    }
    for (int r = 0; r < SGP_MR; r++)
        for (int j = 0; j < SGP_NR; j++) c[r * ldc + j] = add ? c[r * ldc + j] + acc[r][j] : acc[r][j];
}

static const sg_kernel sg_portable = {"portable", SGP_MR, SGP_NR, tile_portable, NULL};

#ifdef TK_X86
#define SG_INLINE inline __attribute__((always_inline))

/* 6 rows x 16 columns: 12 accumulators, two columns of b, one broadcast. */
#define SG2_MR 6
TK_AVX2 static void tile_avx2(int64_t kc, const void *a_, const void *b_, float *c, int64_t ldc, bool add) {
    const float *a = a_, *b = b_;
    __m256 acc[SG2_MR][2];
#pragma GCC unroll 6
    for (int r = 0; r < SG2_MR; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            acc[r][h] = _mm256_setzero_ps();
        }
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
        for (int r = 0; r < SG2_MR; r++) {
            __m256 av = _mm256_broadcast_ss(a + r);
            acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
        }
        a += SG2_MR;
        b += 16;
    }
#pragma GCC unroll 6
    for (int r = 0; r < SG2_MR; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            float *o = c + r * ldc + 8 * h;
            _mm256_storeu_ps(o, add ? _mm256_add_ps(_mm256_loadu_ps(o), acc[r][h]) : acc[r][h]);
        }
}

/* MR rows x 16 NV columns, the accumulators in registers; b advances BS
 * floats a step (16 NV, or more for the first columns of wider panels). */
TK_AVX512 static SG_INLINE void tile512(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, bool add,
                                        const int MR, const int NV, const int BS) {
    __m512 acc[16][4];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int h = 0; h < NV; h++) acc[r][h] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        __m512 bv[4];
#pragma GCC unroll 4
        for (int h = 0; h < NV; h++) bv[h] = _mm512_loadu_ps(b + 16 * h);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
            for (int h = 0; h < NV; h++) acc[r][h] = _mm512_fmadd_ps(av, bv[h], acc[r][h]);
        }
        a += MR;
        b += BS;
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int h = 0; h < NV; h++) {
            float *o = c + r * ldc + 16 * h;
            _mm512_storeu_ps(o, add ? _mm512_add_ps(_mm512_loadu_ps(o), acc[r][h]) : acc[r][h]);
        }
}

/* 12 rows x 32 columns: 24 accumulators, two vectors of b, one broadcast
 * (27 of the 32 registers). */
#define SG5_MR 12
#define SG5_NV 2
TK_AVX512 static void tile_avx512(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, bool add) {
    tile512(kc, a, b, c, ldc, add, SG5_MR, SG5_NV, 16 * SG5_NV);
}

/* Its first 16 columns: 12 accumulators. */
TK_AVX512 static void tile_avx512_half(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, bool add) {
    tile512(kc, a, b, c, ldc, add, SG5_MR, 1, 16 * SG5_NV);
}

_Static_assert(SG5_MR <= TK_GEMM_MR_MAX && 16 * SG5_NV <= TK_GEMM_NR_MAX && SG2_MR <= TK_GEMM_MR_MAX,
               "the stack buffers hold every path's tiles");
static const sg_kernel sg_avx2 = {"avx2", SG2_MR, 16, tile_avx2, NULL};
static const sg_kernel sg_avx512 = {"avx512", SG5_MR, 16 * SG5_NV, tile_avx512, tile_avx512_half};
#endif

/* The best path the CPU (as tk_cpu reports it) runs. */
static const sg_kernel *sg_pick(void) {
#ifdef TK_X86
    if (tk_have_avx512()) return &sg_avx512;
    if (tk_have_avx2()) return &sg_avx2;
#endif
    return &sg_portable;
}

const char *tk_sgemm_path(void) { return sg_pick()->name; }

/* ------------------------------------------------------------- packing */

/* Rows [i0, i0 + mc) x columns [p0, p0 + kc) of op(A), times alpha, into
 * panels of mr rows: panel p holds element (p * mr + r, k) at
 * ap[p * kc * mr + k * mr + r]; rows past mc are zeros. op(A) (i, k) is
 * A[i * lda + k], or A[k * lda + i] when ta. */
static void pack_a(bool ta, const float *A, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float alpha,
                   int mr, float *ap) {
    for (int64_t ib = 0; ib < mc; ib += mr) {
        int64_t rows = TIDE_MIN((int64_t)mr, mc - ib);
        float *d = ap + ib * kc;
        if (ta) {
            for (int64_t k = 0; k < kc; k++) {
                const float *s = A + (p0 + k) * lda + i0 + ib;
                float *o = d + k * mr;
                int64_t r = 0;
                if (alpha == 1.0f)
                    for (; r < rows; r++) o[r] = s[r];
                else
                    for (; r < rows; r++) o[r] = alpha * s[r];
                for (; r < mr; r++) o[r] = 0.0f;
            }
        } else {
#ifdef TK_X86
            if (tk_have_avx512()) {
                tk_pack_t16(A + (i0 + ib) * lda + p0, lda, rows, kc, alpha, mr, d);
                continue;
            }
#endif
            for (int64_t r = 0; r < mr; r++) {
                if (r >= rows) {
                    for (int64_t k = 0; k < kc; k++) d[k * mr + r] = 0.0f;
                    continue;
                }
                const float *s = A + (i0 + ib + r) * lda + p0;
                if (alpha == 1.0f)
                    for (int64_t k = 0; k < kc; k++) d[k * mr + r] = s[k];
                else
                    for (int64_t k = 0; k < kc; k++) d[k * mr + r] = alpha * s[k];
            }
        }
    }
}

/* Rows [p0, p0 + kc) x columns [j0, j0 + nc) of op(B) into panels of nr
 * columns: panel p holds element (k, p * nr + j) at bp[p * kc * nr + k * nr
 * + j]; columns past nc are zeros. op(B) (k, j) is B[k * ldb + j], or
 * B[j * ldb + k] when tb. */
static void pack_b(bool tb, const float *B, int64_t ldb, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int nr,
                   float *bp) {
    for (int64_t jb = 0; jb < nc; jb += nr) {
        int64_t cols = TIDE_MIN((int64_t)nr, nc - jb);
        float *d = bp + jb * kc;
        if (!tb) {
            for (int64_t k = 0; k < kc; k++) {
                float *o = d + k * nr;
                memcpy(o, B + (p0 + k) * ldb + j0 + jb, (size_t)cols * sizeof(float));
                if (cols < nr) memset(o + cols, 0, (size_t)(nr - cols) * sizeof(float));
            }
        } else {
#ifdef TK_X86
            if (tk_have_avx512()) {
                tk_pack_t16(B + (j0 + jb) * ldb + p0, ldb, cols, kc, 1.0f, nr, d);
                continue;
            }
#endif
            for (int64_t j = 0; j < nr; j++) {
                if (j >= cols) {
                    for (int64_t k = 0; k < kc; k++) d[k * nr + j] = 0.0f;
                    continue;
                }
                const float *s = B + (j0 + jb + j) * ldb + p0;
                for (int64_t k = 0; k < kc; k++) d[k * nr + j] = s[k];
            }
        }
    }
}

/* ------------------------------------------------------------- driver */

typedef struct {
    bool t;
    const float *X;
    int64_t ld;
    float alpha;
} sg_op;

static void sg_pack_a(const void *ctx, int64_t i0, int64_t n, int64_t p0, int64_t kc, int r, int64_t kd,
                      uint32_t *dst) {
    const sg_op *o = ctx;
    (void)kd;
    pack_a(o->t, o->X, o->ld, i0, n, p0, kc, o->alpha, r, (float *)(void *)dst);
}

static void sg_pack_b(const void *ctx, int64_t i0, int64_t n, int64_t p0, int64_t kc, int r, int64_t kd,
                      uint32_t *dst) {
    const sg_op *o = ctx;
    (void)kd;
    pack_b(o->t, o->X, o->ld, p0, kc, i0, n, r, (float *)(void *)dst);
}

/* C (M x N, K >= 1) = the sums s of the header, C's old contents not read;
 * with add_c (K at most one block: s is that block's t) C = C + s; on nt
 * threads (gemm_drive.c), the bits of one. */
static void sgemm_sums(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float *C, int64_t ldc, bool add_c, int nt) {
    const sg_kernel *k = sg_pick();
    const sg_op a = {ta, A, lda, alpha}, b = {tb, B, ldb, 1.0f};
    const tk_gemm_kern kn = {.mr = k->mr, .nr = k->nr, .pairs = false, .tile = k->tile, .half = k->half,
                             .pack_a = sg_pack_a, .pack_b = sg_pack_b, .a_ctx = &a, .b_ctx = &b};
    tk_gemm_sums(&kn, M, N, K, C, ldc, add_c, nt);
}

/* Floats of the sums' scratch when beta is not 0: at most SG_SUMS_MAX from
 * the heap, else SG_SUMS_STACK from the stack, the output walked in blocks
 * that fit. */
#define SG_SUMS_MAX ((int64_t)1 << 22)
#define SG_SUMS_STACK 4096

/* tk_sgemm on nt threads. */
static void sgemm_run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc, int nt) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        /* no products (as a BLAS: alpha 0 reads neither A nor B): s is 0 */
        for (int64_t i = 0; i < M; i++) {
            float *c = C + i * ldc;
            if (beta == 0.0f)
                memset(c, 0, (size_t)N * sizeof(float));
            else
                for (int64_t j = 0; j < N; j++) c[j] = (beta == 1.0f ? c[j] : beta * c[j]) + 0.0f;
        }
        return;
    }
    if (beta == 0.0f || (beta == 1.0f && K <= TK_SGEMM_KC)) {
        /* beta 1 over one block of K: c + s is the tiles' own c + t, added
         * in place (no scratch, no second pass over C) */
        sgemm_sums(ta, tb, M, N, K, alpha, A, lda, B, ldb, C, ldc, beta == 1.0f, nt);
        return;
    }
    /* the sums into a scratch, then added to (beta times) C */
    _Alignas(64) float stack[SG_SUMS_STACK];
    int64_t want = TIDE_MIN(M * N, SG_SUMS_MAX), cap = SG_SUMS_STACK;
    float *s = stack, *own = NULL;
    if (want > cap && (own = tide_malloc_aligned((size_t)want * sizeof(float), 64))) s = own, cap = want;
    int64_t bn = TIDE_MIN(N, cap), bm = TIDE_MAX((int64_t)1, TIDE_MIN(M, cap / bn));
    for (int64_t i0 = 0; i0 < M; i0 += bm) {
        int64_t m = TIDE_MIN(bm, M - i0);
        for (int64_t j0 = 0; j0 < N; j0 += bn) {
            int64_t n = TIDE_MIN(bn, N - j0);
            const float *a = ta ? A + i0 : A + i0 * lda;
            const float *b = tb ? B + j0 * ldb : B + j0;
            sgemm_sums(ta, tb, m, n, K, alpha, a, lda, b, ldb, s, n, false, nt);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && m * n >= TK_PAR_MIN)
            for (int64_t i = 0; i < m; i++) {
                float *c = C + (i0 + i) * ldc + j0;
                const float *si = s + i * n;
                if (beta == 1.0f)
                    for (int64_t j = 0; j < n; j++) c[j] = c[j] + si[j];
                else
                    for (int64_t j = 0; j < n; j++) c[j] = beta * c[j] + si[j];
            }
        }
    }
    if (own) tide_free_aligned(own);
}

void tk_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    sgemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1);
}

void tk_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc, int nt) {
    sgemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nt);
}
