/*
 * test_kernels_gemm.c - the f32 GEMM behind the training products
 * (src/backend/cpu/sgemm.c: tk_sgemm, tk_gemm), called directly, on each of
 * the AVX-512, AVX2 and portable paths the CPU has.
 *
 *   - Every transposition form (A as (M, K) or stored (K, M), B as (K, N) or
 *     stored (N, K)), with padded leading dimensions, alpha 1 and not, beta
 *     0, 1 and neither, on shapes with edge tiles in both directions, K
 *     below, at and past the K block (256), more rows than a row block and
 *     more columns than a column block (2048):
 *       * bit for bit against the order sgemm.c fixes, transcribed here:
 *         per block of TK_SGEMM_KC k, t = t + (alpha * a_k) * b_k from 0 in
 *         order, fused (fmaf) on the AVX-512 and AVX2 paths, a product then
 *         a sum on the portable one; s the blocks' sums added in order; then
 *         c = s, c + s or beta * c + s;
 *       * against a double reference: |got - ref| <= 1e-5 * (|beta c| +
 *         |alpha| sum_k |a_k b_k|) (f32 sums of at most 600 terms);
 *       * C's padding columns untouched, and with beta 0 a C full of NaN
 *         not read.
 *   - The same bits from tk_gemm on 1, 2 and 3 threads (the blocks of rows
 *     and panels the driver hands out, gemm_drive.c), and
 *     from any block of rows and columns computed alone (a caller's row
 *     chunks).
 *   - The path: tk_sgemm_path and the backend's kernels string name the best
 *     path cpuid allows (AVX-512 where F, BW and VL are there, else AVX2,
 *     else portable), so a build or a change that ran the training
 *     products on a lesser kernel than the CPU offers fails here; the test
 *     switches move it down to AVX2 and to portable.
 *
 * What it proves: the training products' GEMM in all four transposition
 * forms, bit for bit the documented summation order on every path the CPU
 * has and within 1e-5 of a double reference; its bits independent of the
 * thread count, the driver's blocking and the rows or columns computed together;
 * beta 0 never reading C; the path chosen the best the CPU offers, named in
 * the kernels string.
 */
#include "tide.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_int.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float frand(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ------------------------------------------------------------- paths */

enum { P_PORTABLE, P_AVX2, P_AVX512, P_COUNT };
static const char *const path_names[P_COUNT] = {"portable", "avx2", "avx512"};

static bool path_available(int p) {
    unsigned f = tk_cpu_detected();
    unsigned base = TK_CPU_AVX512F | TK_CPU_AVX512BW | TK_CPU_AVX512VL;
    return p == P_PORTABLE || (p == P_AVX2 && (f & TK_CPU_AVX2)) || (p == P_AVX512 && (f & base) == base);
}

/* The best path cpuid allows, from the detected bits alone. */
static int best_path(void) {
    for (int p = P_COUNT - 1; p > 0; p--)
        if (path_available(p)) return p;
    return P_PORTABLE;
}

static void set_path(int p) {
    tk_force_generic(p == P_PORTABLE);
    tk_cpu_force_no_avx512(p == P_AVX2);
}

static void reset_path(void) {
    tk_force_generic(false);
    tk_cpu_force_no_avx512(false);
}

/* ------------------------------------------------------------- operands */

typedef struct {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    float *A, *B, *C0; /* C0: C before the call */
} gcase;

static float op_a(const gcase *g, int64_t i, int64_t k) { return g->ta ? g->A[k * g->lda + i] : g->A[i * g->lda + k]; }
static float op_b(const gcase *g, int64_t k, int64_t j) { return g->tb ? g->B[j * g->ldb + k] : g->B[k * g->ldb + j]; }

static float *falloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(p);
    return p;
}

static gcase make(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    gcase g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta};
    g.lda = (ta ? M : K) + 3;
    g.ldb = (tb ? K : N) + 5;
    g.ldc = N + 7;
    size_t na = (size_t)((ta ? K : M) * g.lda), nb = (size_t)((tb ? N : K) * g.ldb), nc = (size_t)(M * g.ldc);
    g.A = falloc(na);
    g.B = falloc(nb);
    g.C0 = falloc(nc);
    for (size_t i = 0; i < na; i++) g.A[i] = frand();
    for (size_t i = 0; i < nb; i++) g.B[i] = frand();
    for (size_t i = 0; i < nc; i++) g.C0[i] = beta == 0.0f ? NAN : frand();
    /* the padding past N in each row of C: a guard the product must keep */
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < g.ldc; j++) g.C0[i * g.ldc + j] = 1234.5f + (float)j;
    return g;
}

static void gfree(gcase *g) {
    free(g->A);
    free(g->B);
    free(g->C0);
}

/* One element in the order of sgemm.c's header, fused or not. */
static float chain(const gcase *g, int64_t i, int64_t j, bool fused) {
    float c = g->C0[i * g->ldc + j], s = 0.0f;
    for (int64_t k0 = 0; k0 < g->K; k0 += TK_SGEMM_KC) {
        float t = 0.0f;
        for (int64_t k = k0; k < g->K && k < k0 + TK_SGEMM_KC; k++) {
            float a = op_a(g, i, k);
            if (g->alpha != 1.0f) a = g->alpha * a;
            float b = op_b(g, k, j);
            if (fused) {
                t = fmaf(a, b, t);
            } else {
                float p = a * b;
                t = t + p;
            }
        }
        s = k0 == 0 ? t : s + t;
    }
    if (g->beta == 0.0f) return s;
    float bc = g->beta == 1.0f ? c : g->beta * c; /* two statements: never fused */
    return bc + s;
}

static float *run_sgemm(const gcase *g) {
    float *C = falloc((size_t)(g->M * g->ldc));
    memcpy(C, g->C0, (size_t)(g->M * g->ldc) * sizeof(float));
    tk_sgemm(g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->A, g->lda, g->B, g->ldb, g->beta, C, g->ldc);
    return C;
}

static float *run_gemm(const gcase *g, int nt) {
    float *C = falloc((size_t)(g->M * g->ldc));
    memcpy(C, g->C0, (size_t)(g->M * g->ldc) * sizeof(float));
    tk_gemm(g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->A, g->lda, g->B, g->ldb, g->beta, C, g->ldc, nt);
    return C;
}

/* got against the chain (bit for bit), the double reference (1e-5 of the
 * magnitude) and the guards. */
static void check(const gcase *g, const float *got, int path, const char *what) {
    bool fused = path != P_PORTABLE;
    for (int64_t i = 0; i < g->M; i++) {
        for (int64_t j = 0; j < g->N; j++) {
            float v = got[i * g->ldc + j];
            float want = chain(g, i, j, fused);
            double c = g->beta == 0.0f ? 0.0 : (double)g->beta * (double)g->C0[i * g->ldc + j];
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < g->K; k++) {
                double t = (double)op_a(g, i, k) * (double)op_b(g, k, j);
                ref += t;
                mag += fabs(t);
            }
            ref = c + (double)g->alpha * ref;
            mag = fabs(c) + fabs((double)g->alpha) * mag;
            if (f2u(v) != f2u(want) || !(fabs((double)v - ref) <= 1e-5 * mag + 1e-30)) {
                print_error("%s path %s ta %d tb %d M %lld N %lld K %lld alpha %g beta %g: (%lld, %lld) got %.9g "
                            "chain %.9g ref %.9g\n", what, path_names[path], g->ta, g->tb, (long long)g->M,
                            (long long)g->N, (long long)g->K, g->alpha, g->beta, (long long)i, (long long)j, v, want,
                            ref);
                fail();
            }
        }
        for (int64_t j = g->N; j < g->ldc; j++)
            assert_int_equal(f2u(got[i * g->ldc + j]), f2u(g->C0[i * g->ldc + j]));
    }
}

/* ------------------------------------------------------------- cases */

static const int64_t shapes[][3] = {
    {1, 1, 1},    {3, 5, 2},     {13, 33, 7},   {12, 32, 256}, {6, 16, 255},
    {25, 70, 257}, {200, 40, 600}, {7, 2100, 30}, {64, 96, 1},
    /* thin and one-block: a half-width last panel (16 columns, whole
     * rows and an edge), beta 1 added in the tiles (K <= one block) */
    {24, 16, 40}, {37, 48, 256},
};
static const float ab[][2] = {{1.0f, 0.0f}, {0.3f, 1.0f}, {1.0f, 0.5f}, {-2.5f, 0.0f}, {0.125f, -1.5f}};

/* Every form, shape and (alpha, beta) on every path the CPU has. */
static void test_forms(void **state) {
    (void)state;
    for (int p = 0; p < P_COUNT; p++) {
        if (!path_available(p)) {
            print_message("  %s: not on this CPU\n", path_names[p]);
            continue;
        }
        set_path(p);
        assert_string_equal(tk_sgemm_path(), path_names[p]);
        for (int form = 0; form < 4; form++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (size_t c = 0; c < sizeof ab / sizeof ab[0]; c++) {
                    /* the big shapes with two (alpha, beta) only: time */
                    if (shapes[s][0] * shapes[s][1] * shapes[s][2] > 100000 && c > 1) continue;
                    gcase g = make(form & 1, form >> 1 & 1, shapes[s][0], shapes[s][1], shapes[s][2], ab[c][0],
                                   ab[c][1]);
                    float *C = run_sgemm(&g);
                    check(&g, C, p, "tk_sgemm");
                    free(C);
                    gfree(&g);
                }
        reset_path();
    }
}

/* No products: C = beta * C, and with beta 0 zeros whatever C held. */
static void test_empty_k(void **state) {
    (void)state;
    for (int p = 0; p < P_COUNT; p++) {
        if (!path_available(p)) continue;
        set_path(p);
        for (size_t c = 0; c < sizeof ab / sizeof ab[0]; c++) {
            gcase g = make(false, true, 9, 37, 0, ab[c][0], ab[c][1]);
            float *C = run_sgemm(&g);
            check(&g, C, p, "K 0");
            free(C);
            gfree(&g);
        }
        reset_path();
    }
}

/* tk_gemm on 1, 2 and 3 threads, and blocks of rows and columns alone: the
 * same bits as one tk_sgemm of the whole. */
static void test_tiles_threads(void **state) {
    (void)state;
    static const int64_t big[][3] = {{256, 384, 128}, {300, 190, 70}, {97, 1000, 65}};
    for (int p = 0; p < P_COUNT; p++) {
        if (!path_available(p)) continue;
        set_path(p);
        for (int form = 0; form < 4; form++)
            for (size_t s = 0; s < sizeof big / sizeof big[0]; s++) {
                gcase g = make(form & 1, form >> 1 & 1, big[s][0], big[s][1], big[s][2], form == 2 ? 0.7f : 1.0f,
                               form == 1 ? 1.0f : 0.0f);
                size_t n = (size_t)(g.M * g.ldc);
                float *whole = run_sgemm(&g);
                if (form == 0 && s == 0) check(&g, whole, p, "whole");
                for (int nt = 1; nt <= 3; nt++) {
                    float *C = run_gemm(&g, nt);
                    assert_memory_equal(C, whole, n * sizeof(float));
                    free(C);
                }
                /* rows [r0, r1) x columns [c0, c1) on their own */
                static const int64_t cuts[][4] = {{0, 1, 0, 5}, {3, 40, 17, 90}, {50, 97, 1, 65}, {13, 14, 0, 65}};
                for (size_t q = 0; q < sizeof cuts / sizeof cuts[0]; q++) {
                    int64_t r0 = cuts[q][0], r1 = cuts[q][1], c0 = cuts[q][2], c1 = cuts[q][3];
                    float *C = falloc(n);
                    memcpy(C, g.C0, n * sizeof(float));
                    const float *a = g.ta ? g.A + r0 : g.A + r0 * g.lda;
                    const float *b = g.tb ? g.B + c0 * g.ldb : g.B + c0;
                    tk_sgemm(g.ta, g.tb, r1 - r0, c1 - c0, g.K, g.alpha, a, g.lda, b, g.ldb, g.beta,
                             C + r0 * g.ldc + c0, g.ldc);
                    for (int64_t i = r0; i < r1; i++)
                        assert_memory_equal(C + i * g.ldc + c0, whole + i * g.ldc + c0,
                                            (size_t)(c1 - c0) * sizeof(float));
                    free(C);
                }
                free(whole);
                gfree(&g);
            }
        reset_path();
    }
}

/* The path chosen is the best the CPU offers, and the kernels string says
 * so; the switches move it down. */
static void test_path(void **state) {
    (void)state;
    int best = best_path();
    char names[200];
    tk_cpu_names(tk_cpu_detected(), names, sizeof names);
    print_message("  detected: %s; training products: %s\n", names, tk_sgemm_path());
    assert_string_equal(tk_sgemm_path(), path_names[best]);
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    char want[64];
    snprintf(want, sizeof want, "training products %s sgemm", path_names[best]);
    const char *k = tide_backend_kernels(be);
    if (!strstr(k, want)) {
        print_error("kernels string lacks \"%s\": %s\n", want, k);
        fail();
    }
    if (path_available(P_AVX2)) {
        tk_cpu_force_no_avx512(true);
        assert_string_equal(tk_sgemm_path(), "avx2");
        assert_non_null(strstr(tide_backend_kernels(be), "training products avx2 sgemm"));
        tk_cpu_force_no_avx512(false);
    }
    tk_force_generic(true);
    assert_string_equal(tk_sgemm_path(), "portable");
    assert_non_null(strstr(tide_backend_kernels(be), "training products portable sgemm"));
    tk_force_generic(false);
    assert_string_equal(tk_sgemm_path(), path_names[best]);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path),
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_empty_k),
        cmocka_unit_test(test_tiles_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
