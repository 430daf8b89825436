/*
 * test_kernels_matmul.c - the CPU matmul kernels chosen at run time
 * (src/backend/cpu/matmul_avx512.c, cpu_features.c), called directly.
 *
 *   - tk_round_bf16: round to nearest even, bit for bit the same on the
 *     AVX-512 path and the portable one, ties, NaN, infinities and
 *     subnormals included.
 *   - Row invariance, the property that lets a planner cut a matmul into
 *     row tiles of any size and keep offloaded runs bit-identical: each
 *     output row of the fast mode (tk_matmul_fast) and of the f32 mode
 *     (tk_matmul, on each of the AVX-512, AVX2 and portable paths the CPU
 *     has) has the same bits whether it is computed alone, in
 *     a chunk of 1, 3, 4, 7, 16 or 17 rows, with a scratch that holds few
 *     rows, or with 1, 2 or 3 threads; and writing a block of columns of a
 *     wider output (a weight split into row blocks) gives the same bits too.
 *   - Accuracy against a reference summed in double:
 *       f32 mode: |out - ref| <= 1e-5 * sum_k |x_k w_k| (f32 sums of 16
 *         lanes over K/16 terms then a tree of 4 levels);
 *       fast mode: against the reference on bf16-rounded activations,
 *         1e-5 * sum_k |xb_k w_k| (the products are exact, VDPBF16PS sums
 *         in f32); against the f32 reference, (2^-9 + 1e-5) * sum_k |x_k
 *         w_k|: rounding x to bf16 moves each product by at most 2^-9 of
 *         itself. The bound is K-independent relative to sum |x w|, which
 *         itself grows with K.
 *   - The kernels string names the instruction sets detected.
 * Skips (77) the AVX-512 cases on CPUs without them; the AVX2 and portable
 * cases run wherever the CPU has them.
 *
 * What it proves: the CPU's matmul kernels: bf16 rounding the same on the
 * AVX-512 and portable paths (ties, NaN, infinities, subnormals); each
 * output's bits independent of the rows in a call, the thread count, the
 * scratch and split weights (chunks of 1-17 rows on 1-3 threads, both modes,
 * bit for bit); f32 within 1e-5 and fast within 2^-9 + 1e-5 of sum abs(x w)
 * against double references; a scratch too small refused; the detected CPU
 * features and the kernels named.
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

static uint64_t rng = 0x853c49e6748fea9bull;

static uint64_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

static float frand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static uint16_t bf16_of(float f) { return (uint16_t)(f2u(f) >> 16); } /* exact for test data */

static bool have_512(void) {
    return tk_cpu_has(TK_CPU_AVX512F | TK_CPU_AVX512BW | TK_CPU_AVX512VL);
}

/* ------------------------------------------------------------- rounding */

static void test_round_bf16(void **state) {
    (void)state;
    enum { N = 4099 };
    float *x = malloc(N * sizeof(float));
    uint16_t *a = malloc(N * 2), *b = malloc(N * 2);
    assert_non_null(x);
    assert_non_null(a);
    assert_non_null(b);
    static const uint32_t special[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, /* zeros, infs, NaNs */
        0x3f808000, 0x3f818000, 0x3f80ffff, 0x3f817fff, /* ties to even, just below/above */
        0x00000001, 0x007fffff, 0x80400000, 0x7f7fffff, 0xff7fffff, /* subnormals, largest (rounds to inf) */
    };
    size_t ns = sizeof special / sizeof special[0];
    for (int i = 0; i < N; i++) x[i] = i < (int)ns ? u2f(special[i]) : u2f((uint32_t)rnd());
    tk_force_generic(true);
    tk_round_bf16(x, N, 1, N, a, N, 1);
    tk_force_generic(false);
    tk_round_bf16(x, N, 1, N, b, N, 2);
    assert_memory_equal(a, b, N * 2);
    /* the portable bits: round to nearest even by the integer rule */
    assert_int_equal(a[7], 0x3f80);  /* 1 + 2^-8 exactly halfway: to even (down) */
    assert_int_equal(a[8], 0x3f82);  /* halfway above an odd: to even (up) */
    assert_int_equal(a[9], 0x3f81);  /* just above halfway: up */
    assert_int_equal(a[10], 0x3f81); /* just below halfway: down */
    assert_int_equal(a[14], 0x7f80); /* the largest float rounds to infinity */
    assert_true((a[4] & 0x7f80) == 0x7f80 && (a[4] & 0x7f)); /* NaN stays NaN */
    assert_true((a[6] & 0x7f80) == 0x7f80 && (a[6] & 0x7f)); /* a NaN whose payload is below bf16's */
    for (int i = 0; i < N; i++) {
        float f = x[i];
        if (isnan(f) || isinf(f)) continue;
        /* within half an ulp of bf16, or the overflow to infinity */
        float r = u2f((uint32_t)a[i] << 16);
        if (isinf(r) && !isinf(f)) continue;
        int e = f == 0 ? -126 : ilogb(f);
        double ulp = ldexp(1.0, (e < -126 ? -126 : e) - 7); /* subnormals: bf16's fixed spacing 2^-133 */
        if (!(fabs((double)r - f) <= 0.5 * ulp)) fail_msg("x[%d] = %a rounds to %a", i, f, r);
    }
    free(x);
    free(a);
    free(b);
}

/* ------------------------------------------------------------- invariance */

typedef struct mm_data {
    int64_t R, K, N;
    float *x;       /* (R, K) */
    uint16_t *wb;   /* (N, K) bf16 */
    float *wf;      /* (N, K) the same values in f32 */
} mm_data;

static mm_data mm_make(int64_t R, int64_t K, int64_t N) {
    mm_data d = {R, K, N, malloc((size_t)(R * K) * 4), malloc((size_t)(N * K) * 2), malloc((size_t)(N * K) * 4)};
    assert_non_null(d.x);
    assert_non_null(d.wb);
    assert_non_null(d.wf);
    for (int64_t i = 0; i < R * K; i++) d.x[i] = frand();
    for (int64_t i = 0; i < N * K; i++) {
        d.wb[i] = bf16_of(frand() * 0.5f);
        d.wf[i] = u2f((uint32_t)d.wb[i] << 16);
    }
    return d;
}

static void mm_free(mm_data *d) {
    free(d->x);
    free(d->wb);
    free(d->wf);
}

/* out (R, ldo) = the product computed in row chunks of `chunk` rows with nt
 * threads, into columns [col0, col0 + N) of an output ldo wide. */
static void run_chunks(const mm_data *d, bool fast, tide_dtype wdt, int64_t chunk, size_t scratch_bytes, int nt,
                       float *out, int64_t ldo, int64_t col0) {
    void *scratch = malloc(scratch_bytes ? scratch_bytes : 1);
    assert_non_null(scratch);
    const void *w = wdt == TIDE_BF16 ? (const void *)d->wb : (const void *)d->wf;
    for (int64_t r0 = 0; r0 < d->R; r0 += chunk) {
        int64_t n = d->R - r0 < chunk ? d->R - r0 : chunk;
        tide_status st = fast ? tk_matmul_fast(d->x + r0 * d->K, w, wdt, n, d->K, d->N, false, out + r0 * ldo + col0,
                                               ldo, scratch, scratch_bytes, nt)
                              : tk_matmul(d->x + r0 * d->K, w, wdt, n, d->K, d->N, out + r0 * ldo + col0, ldo,
                                          scratch, scratch_bytes, nt);
        assert_int_equal(st, TIDE_OK);
    }
    free(scratch);
}

static void check_invariance(bool fast, tide_dtype wdt) {
    static const int64_t shapes[][3] = {{40, 2048, 77}, {19, 300, 130}, {33, 47, 9}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        mm_data d = mm_make(shapes[s][0], shapes[s][1], shapes[s][2]);
        int64_t R = d.R, N = d.N;
        size_t full = (size_t)(R * N) * sizeof(float);
        float *want = malloc(full), *got = malloc(full);
        assert_non_null(want);
        assert_non_null(got);
        size_t big = 16u << 20;
        run_chunks(&d, fast, wdt, R, big, 2, want, N, 0);
        static const int64_t chunks[] = {1, 3, 4, 7, 16, 17};
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++)
            for (int nt = 1; nt <= 3; nt++) {
                memset(got, 0xff, full);
                run_chunks(&d, fast, wdt, chunks[c], big, nt, got, N, 0);
                if (memcmp(got, want, full))
                    fail_msg("%s %s R=%lld K=%lld N=%lld: chunks of %lld rows on %d threads change bits",
                             fast ? "fast" : "f32", tide_dtype_name(wdt), (long long)R, (long long)d.K, (long long)N,
                             (long long)chunks[c], nt);
            }
        /* a scratch of 3 rows (the fast mode rounds 3 rows at a time) */
        memset(got, 0xff, full);
        run_chunks(&d, fast, wdt, R, (size_t)d.K * 2 * 3 + 5, 2, got, N, 0);
        assert_memory_equal(got, want, full);
        /* the weight cut into two row blocks, each writing its columns */
        if (N > 8) {
            int64_t n1 = N / 3;
            float *wide = malloc(full);
            assert_non_null(wide);
            mm_data a = d, b = d;
            a.N = n1;
            b.N = N - n1;
            b.wb = d.wb + n1 * d.K;
            b.wf = d.wf + n1 * d.K;
            run_chunks(&a, fast, wdt, R, big, 2, wide, N, 0);
            run_chunks(&b, fast, wdt, 5, big, 3, wide, N, n1);
            assert_memory_equal(wide, want, full);
            free(wide);
        }
        free(want);
        free(got);
        mm_free(&d);
    }
}

static void test_fast_rows_invariant(void **state) {
    (void)state;
    if (!tk_matmul_fast_native(TIDE_BF16)) skip();
    check_invariance(true, TIDE_BF16);
}

/* The f32 mode on each path this CPU has: AVX-512, AVX2 (forced on an
 * AVX-512 CPU), portable (forced); bf16 and f32 weights. */
static void test_f32_rows_invariant(void **state) {
    (void)state;
    for (int path = 2; path >= 0; path--) {
        if ((path == 2 && !have_512()) || (path == 1 && !tk_have_avx2())) continue;
        tk_cpu_force_no_avx512(path == 1);
        tk_force_generic(path == 0);
        print_message("  f32 mode, %s path: chunks of 1..17 rows, 1..3 threads, column blocks\n",
                      path == 2 ? "avx512" : path == 1 ? "avx2" : "portable");
        check_invariance(false, TIDE_BF16);
        check_invariance(false, TIDE_F32);
        tk_cpu_force_no_avx512(false);
        tk_force_generic(false);
    }
}

/* ------------------------------------------------------------- accuracy */

/* Worst |got - ref| / (rtol * sum |x w|) over the output (ref in double, on
 * x rounded to bf16 first when xround). */
static double worst_ratio(const mm_data *d, const float *got, bool xround, double rtol) {
    double worst = 0;
    for (int64_t r = 0; r < d->R; r++)
        for (int64_t n = 0; n < d->N; n++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < d->K; k++) {
                float xv = d->x[r * d->K + k];
                if (xround) {
                    uint16_t h;
                    tk_round_bf16(&xv, 1, 1, 1, &h, 1, 1);
                    xv = u2f((uint32_t)h << 16);
                }
                double p = (double)xv * d->wf[n * d->K + k];
                s += p;
                a += fabs(p);
            }
            double e = fabs((double)got[r * d->N + n] - s) / (rtol * a + 1e-30);
            if (e > worst) worst = e;
        }
    return worst;
}

static void test_accuracy(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{1, 2048, 64}, {5, 5632, 24}, {20, 300, 70}, {17, 33, 13}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        mm_data d = mm_make(shapes[s][0], shapes[s][1], shapes[s][2]);
        float *got = malloc((size_t)(d.R * d.N) * 4);
        assert_non_null(got);
        for (int path = 0; path < 2; path++) {
            tk_force_generic(path == 1);
            run_chunks(&d, false, TIDE_BF16, d.R, 16u << 20, 2, got, d.N, 0);
            double e = worst_ratio(&d, got, false, 1e-5);
            print_message("  f32  %s R=%lld K=%lld N=%lld: worst error/bound %.3g\n", path ? "portable" : "dispatched",
                          (long long)d.R, (long long)d.K, (long long)d.N, e);
            assert_true(e <= 1.0);
            run_chunks(&d, true, TIDE_BF16, d.R, 16u << 20, 2, got, d.N, 0);
            if (tk_matmul_fast_native(TIDE_BF16)) {
                double e1 = worst_ratio(&d, got, true, 1e-5), e2 = worst_ratio(&d, got, false, 0x1p-9 + 1e-5);
                print_message("  fast %s: against rounded x %.3g, against f32 x %.3g of the bound\n",
                              path ? "portable" : "dispatched", e1, e2);
                assert_true(e1 <= 1.0);
                assert_true(e2 <= 1.0);
            } else {
                assert_true(worst_ratio(&d, got, false, 1e-5) <= 1.0); /* f32 kernels */
            }
        }
        tk_force_generic(false);
        free(got);
        mm_free(&d);
    }
}

/* The fast mode refuses a scratch too small for one row, with a status. */
static void test_fast_scratch(void **state) {
    (void)state;
    if (!tk_matmul_fast_native(TIDE_BF16)) skip();
    mm_data d = mm_make(2, 64, 8);
    float out[16];
    uint8_t small[64];
    assert_int_equal(tk_matmul_fast(d.x, d.wb, TIDE_BF16, 2, 64, 8, false, out, 8, small, 100, 1), TIDE_E_INVALID);
    assert_int_equal(tk_matmul_fast(d.x, d.wb, TIDE_BF16, 2, 64, 8, false, out, 8, NULL, 0, 1), TIDE_E_INVALID);
    mm_free(&d);
}

/* ------------------------------------------------------------- dispatch */

static void test_features(void **state) {
    (void)state;
    char names[200];
    unsigned f = tk_cpu_detected();
    tk_cpu_names(f, names, sizeof names);
    print_message("  detected: %s\n", names);
    if (f & TK_CPU_AVX512BF16) assert_true(f & TK_CPU_AVX512F);
    tk_cpu_force_generic(true);
    assert_int_equal(tk_cpu(), 0);
    assert_false(tk_matmul_fast_native(TIDE_BF16));
    tk_cpu_force_generic(false);
    assert_int_equal(tk_cpu(), f);
    tk_cpu_names(0, names, sizeof names);
    assert_string_equal(names, "none");
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    const char *k = tide_backend_kernels(be);
    print_message("  kernels: %s\n", k);
    if (f & TK_CPU_AVX512BF16) {
        assert_int_equal(tide_backend_matmul(be), TIDE_MATMUL_FAST);
        assert_non_null(strstr(k, "avx512_bf16"));
    }
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_features),
        cmocka_unit_test(test_round_bf16),
        cmocka_unit_test(test_fast_rows_invariant),
        cmocka_unit_test(test_f32_rows_invariant),
        cmocka_unit_test(test_accuracy),
        cmocka_unit_test(test_fast_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
