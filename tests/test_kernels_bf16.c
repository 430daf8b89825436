/*
 * test_kernels_bf16.c - the products of a bf16 training step
 * (src/backend/cpu/sgemm_bf16.c: tk_gemm_bf16; tk_matmul_bf16,
 * tk_matmul_gradw_bf16), called directly, on every code path the CPU has:
 * AMX-BF16 (TDPBF16PS), AVX512_BF16 (VDPBF16PS, tk_cpu_force_no_amx),
 * AVX-512F without either (the pairs widened in registers,
 * tk_cpu_force_no_bf16), AVX2 and portable (fmaf).
 *
 *   - Every transposition form, operands f32 (rounded to bf16 as packed),
 *     bf16 and f16, beta 0 and 1, padded leading dimensions, shapes with
 *     edge tiles both ways, K odd, below, at and past the K block (256):
 *     bit for bit the order sgemm_bf16.c documents, transcribed here (per
 *     block of TK_SGEMM_KC k, t = fmaf(a_{k+1}, b_{k+1}, t) then
 *     fmaf(a_k, b_k, t) over the pairs, the blocks' sums added in order),
 *     on each path but AMX (whose instruction sums its own way); and on
 *     every path within 1e-5 of a double reference of the same
 *     bf16-rounded operands (so the rounding of the operands is there,
 *     and nothing else is lost).
 *   - The same bits on 1, 2 and 3 threads and for any block of rows and
 *     columns computed alone, on each path, for square and thin products
 *     (a few columns or rows: LoRA's rank 16 and below), each operand
 *     dtype and form, and more rows than one packed block.
 *   - On AMX: a product split at a multiple of 32 k, its second part added
 *     with beta, is the whole product bit for bit (the documented order).
 *   - tk_matmul_bf16: a bf16 output is the f32 result rounded once to
 *     nearest even, whatever room it is formed in (a one-row scratch, room
 *     for part of the rows, formed in blocks of columns, none), the
 *     accumulating form adds to the widened output first; MATMUL_GRADW's
 *     form is tk_gemm_bf16's.
 *   - The path: tk_gemm_bf16_path names VDPBF16PS where cpuid reports
 *     AVX512_BF16, and the switches move it down.
 *
 * Inputs are normal numbers (the one place the paths may differ is a
 * subnormal, which VDPBF16PS flushes to zero).
 */
#include "tide.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_int.h"
#include "core/core.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A matrix of rows x cols (row stride ld) of dt, random values in (-1, 1). */
typedef struct {
    void *p;
    tide_dtype dt;
    int64_t rows, cols, ld;
} mat;

static mat mat_new(tide_dtype dt, int64_t rows, int64_t cols, int64_t pad) {
    mat m = {.dt = dt, .rows = rows, .cols = cols, .ld = cols + pad};
    size_t n = (size_t)(rows * m.ld), es = tide_dtype_size(dt);
    m.p = malloc(n * es + 4);
    assert_non_null(m.p);
    for (size_t i = 0; i < n; i++) {
        float v = frand();
        if (dt == TIDE_F32) ((float *)m.p)[i] = v;
        else if (dt == TIDE_BF16) ((uint16_t *)m.p)[i] = tide_f32_to_bf16(v);
        else ((uint16_t *)m.p)[i] = tide_f32_to_f16(v);
    }
    return m;
}

/* Element i of m as the bf16 value the products take, widened. */
static float as_bf16(const mat *m, int64_t i) {
    float v = m->dt == TIDE_F32    ? ((const float *)m->p)[i]
              : m->dt == TIDE_BF16 ? tide_bf16_to_f32(((const uint16_t *)m->p)[i])
                                   : tide_f16_to_f32(((const uint16_t *)m->p)[i]);
    return tide_bf16_to_f32(tide_f32_to_bf16(v));
}

/* op(A)(i, k) and op(B)(k, j) */
static float ea(const mat *A, bool ta, int64_t i, int64_t k) { return as_bf16(A, ta ? k * A->ld + i : i * A->ld + k); }
static float eb(const mat *B, bool tb, int64_t k, int64_t j) { return as_bf16(B, tb ? j * B->ld + k : k * B->ld + j); }

/* The documented order, transcribed. */
static float ref_order(const mat *A, bool ta, const mat *B, bool tb, int64_t i, int64_t j, int64_t K, bool beta,
                       float c) {
    float s = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += TK_SGEMM_KC) {
        int64_t k1 = k0 + TK_SGEMM_KC < K ? k0 + TK_SGEMM_KC : K;
        float t = 0.0f;
        for (int64_t k = k0; k < k1; k += 2) {
            float a1 = k + 1 < k1 ? ea(A, ta, i, k + 1) : 0.0f, b1 = k + 1 < k1 ? eb(B, tb, k + 1, j) : 0.0f;
            t = fmaf(a1, b1, t);
            t = fmaf(ea(A, ta, i, k), eb(B, tb, k, j), t);
        }
        s = k0 == 0 ? t : s + t;
    }
    return beta ? c + s : s;
}

/* Runs every case under each path the CPU has, in turn. */
static int n_paths(void) { return 5; }

static void leave_paths(void) {
    tk_cpu_force_no_amx(false);
    tk_cpu_force_no_bf16(false);
    tk_cpu_force_no_avx512(false);
    tk_cpu_force_generic(false);
}

/* Path p: 0 the CPU's own, 1 without AMX, 2 without AVX512_BF16, 3
 * without AVX-512, 4 portable; false where it would repeat one already
 * run. */
static bool enter_path(int p) {
    leave_paths();
    unsigned f = tk_cpu_detected();
    bool avx512 = (f & TK_CPU_AVX512F) != 0, bf16 = (f & TK_CPU_AVX512BF16) != 0, avx2 = (f & TK_CPU_AVX2) != 0;
    bool amx = (f & TK_CPU_AMXBF16) != 0;
    switch (p) {
    case 0: return true;
    case 1: tk_cpu_force_no_amx(true); return avx512 && amx && bf16;
    case 2: tk_cpu_force_no_bf16(true); return avx512 && (bf16 || amx);
    case 3: tk_cpu_force_no_avx512(true); return avx512 && avx2;
    default: tk_cpu_force_generic(true); return avx2;
    }
}

/* The AMX path sums inside TDPBF16PS its own way: within tolerance of the
 * others, not their bits. */
static bool on_amx(void) { return strstr(tk_gemm_bf16_path(), "amx") != NULL; }

static void check_case(int64_t M, int64_t N, int64_t K, bool ta, bool tb, tide_dtype adt, tide_dtype bdt,
                       bool beta) {
    mat A = ta ? mat_new(adt, K, M, 3) : mat_new(adt, M, K, 5);
    mat B = tb ? mat_new(bdt, N, K, 1) : mat_new(bdt, K, N, 7);
    const int64_t ldc = N + 2;
    float *C0 = malloc((size_t)(M * ldc) * sizeof(float)), *C = malloc((size_t)(M * ldc) * sizeof(float));
    assert_non_null(C0);
    assert_non_null(C);
    for (int64_t i = 0; i < M * ldc; i++) C0[i] = frand();
    for (int p = 0; p < n_paths(); p++) {
        if (!enter_path(p)) continue;
        memcpy(C, C0, (size_t)(M * ldc) * sizeof(float));
        if (!beta)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) C[i * ldc + j] = NAN; /* beta 0 never reads C */
        tk_gemm_bf16(ta, tb, M, N, K, A.p, adt, A.ld, B.p, bdt, B.ld, beta, C, ldc, 2);
        const bool amx = on_amx();
        for (int64_t i = 0; i < M; i++) {
            for (int64_t j = 0; j < N; j++) {
                float want = ref_order(&A, ta, &B, tb, i, j, K, beta, C0[i * ldc + j]);
                float got = C[i * ldc + j];
                if (!amx && memcmp(&got, &want, sizeof got)) {
                    fail_msg("%s: M %lld N %lld K %lld ta %d tb %d %s x %s beta %d: (%lld, %lld) %a, the order "
                             "gives %a", tk_gemm_bf16_path(), (long long)M, (long long)N, (long long)K, ta, tb,
                             tide_dtype_name(adt), tide_dtype_name(bdt), beta, (long long)i, (long long)j,
                             (double)got, (double)want);
                }
                double ref = beta ? C0[i * ldc + j] : 0.0, mag = beta ? fabs(C0[i * ldc + j]) : 0.0;
                for (int64_t k = 0; k < K; k++) {
                    double t = (double)ea(&A, ta, i, k) * (double)eb(&B, tb, k, j);
                    ref += t;
                    mag += fabs(t);
                }
                if (!(fabs((double)got - ref) <= 1e-5 * mag + 1e-30))
                    fail_msg("%s: (%lld, %lld) of M %lld N %lld K %lld: %g, the double sum %g (of magnitude %g)",
                             tk_gemm_bf16_path(), (long long)i, (long long)j, (long long)M, (long long)N,
                             (long long)K, (double)got, ref, mag);
            }
            for (int64_t j = N; j < ldc; j++) assert_memory_equal(&C[i * ldc + j], &C0[i * ldc + j], sizeof(float));
        }
    }
    leave_paths();
    free(A.p);
    free(B.p);
    free(C0);
    free(C);
}

static void test_forms(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {13, 33, 17}, {12, 32, 256}, {30, 70, 257},
                                        {25, 40, 600}, {200, 9, 31}, {20, 40, 1100}, {48, 16, 1056},
                                        {40, 24, 544}, {17, 48, 96}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int f = 0; f < 4; f++) {
            bool ta = f & 1, tb = f & 2;
            check_case(shapes[s][0], shapes[s][1], shapes[s][2], ta, tb, TIDE_F32, TIDE_F32, false);
            check_case(shapes[s][0], shapes[s][1], shapes[s][2], ta, tb, TIDE_BF16, TIDE_F32, true);
            check_case(shapes[s][0], shapes[s][1], shapes[s][2], ta, tb, TIDE_F32, TIDE_BF16, f == 1);
        }
    check_case(19, 45, 300, false, true, TIDE_BF16, TIDE_F16, false);
    check_case(19, 45, 300, false, false, TIDE_F32, TIDE_F16, true);
}

/* More columns than a column block (2048) and rows than a row block. */
static void test_large(void **state) {
    (void)state;
    check_case(200, 2100, 40, false, true, TIDE_F32, TIDE_BF16, false);
}

/* Element (r, c) of op(X) for a matrix of m: the address. */
static const void *at(const mat *m, bool t, int64_t r, int64_t c) {
    return (const uint8_t *)m->p + (size_t)(t ? c * m->ld + r : r * m->ld + c) * tide_dtype_size(m->dt);
}

/* One shape: the same bits on 1, 2 and 3 threads, and for the block of
 * rows r0.. and columns c0.. computed alone (with and without beta). */
static void threads_tiles_case(int64_t M, int64_t N, int64_t K, bool ta, bool tb, tide_dtype adt, tide_dtype bdt,
                               int64_t r0, int64_t c0) {
    mat A = ta ? mat_new(adt, K, M, 0) : mat_new(adt, M, K, 0);
    mat B = tb ? mat_new(bdt, N, K, 0) : mat_new(bdt, K, N, 0);
    float *C1 = calloc((size_t)(M * N), sizeof(float)), *C = calloc((size_t)(M * N), sizeof(float));
    assert_non_null(C1);
    assert_non_null(C);
    tk_gemm_bf16(ta, tb, M, N, K, A.p, adt, A.ld, B.p, bdt, B.ld, false, C1, N, 1);
    for (int nt = 2; nt <= 3; nt++) {
        memset(C, 0, (size_t)(M * N) * sizeof(float));
        tk_gemm_bf16(ta, tb, M, N, K, A.p, adt, A.ld, B.p, bdt, B.ld, false, C, N, nt);
        if (memcmp(C, C1, (size_t)(M * N) * sizeof(float)))
            fail_msg("%s: M %lld N %lld K %lld ta %d tb %d: %d threads change the bits", tk_gemm_bf16_path(),
                     (long long)M, (long long)N, (long long)K, ta, tb, nt);
    }
    /* rows r0.. and columns c0.. alone */
    const int64_t m = M - r0, n = N - c0;
    for (int beta = 0; beta < 2; beta++) {
        for (int64_t i = 0; i < m * n; i++) C[i] = beta ? 0.0f : NAN;
        tk_gemm_bf16(ta, tb, m, n, K, at(&A, ta, r0, 0), adt, A.ld, at(&B, tb, 0, c0), bdt, B.ld, beta, C, n, 2);
        for (int64_t i = 0; i < m; i++)
            if (memcmp(C + i * n, C1 + (i + r0) * N + c0, (size_t)n * sizeof(float)))
                fail_msg("%s: M %lld N %lld K %lld ta %d tb %d: rows %lld.. and columns %lld.. alone (beta %d) "
                         "change row %lld", tk_gemm_bf16_path(), (long long)M, (long long)N, (long long)K, ta, tb,
                         (long long)r0, (long long)c0, beta, (long long)i);
    }
    free(A.p);
    free(B.p);
    free(C1);
    free(C);
}

static void threads_tiles(void) {
    threads_tiles_case(300, 200, 1100, false, true, TIDE_BF16, TIDE_F32, 37, 64);
    /* thin products (LoRA's rank 16 and below): few columns, few rows */
    threads_tiles_case(300, 16, 2048, false, true, TIDE_BF16, TIDE_F32, 37, 0);
    threads_tiles_case(100, 5, 640, false, true, TIDE_BF16, TIDE_BF16, 16, 2);
    threads_tiles_case(70, 20, 1000, false, false, TIDE_BF16, TIDE_F32, 9, 3);
    threads_tiles_case(16, 300, 700, true, false, TIDE_F32, TIDE_BF16, 0, 33);
    threads_tiles_case(20, 600, 513, true, false, TIDE_F32, TIDE_F32, 3, 100);
    threads_tiles_case(48, 90, 96, false, false, TIDE_F16, TIDE_F32, 16, 32);
    /* more rows than one packed block of them (2048) */
    threads_tiles_case(2100, 300, 64, false, true, TIDE_F32, TIDE_F32, 1000, 17);
}

static void test_threads_tiles(void **state) {
    (void)state;
    for (int p = 0; p < n_paths(); p++)
        if (enter_path(p)) threads_tiles();
    leave_paths();
}

/* The AMX order (sgemm_bf16.c): an element's tile sum runs from C's element
 * (with beta) over steps of 32 consecutive k from k = 0; so a product
 * split at a multiple of 32 k, the second part added with beta, is the
 * whole product bit for bit (whatever the cache blocks of k). */
static void test_amx_order(void **state) {
    (void)state;
    if (!on_amx()) skip();
    static const int64_t cuts[] = {32, 160, 512, 544, 1024};
    const int64_t M = 70, N = 50, K = 1100;
    for (int f = 0; f < 4; f++) {
        const bool ta = f & 1, tb = f & 2;
        mat A = ta ? mat_new(TIDE_F32, K, M, 1) : mat_new(TIDE_BF16, M, K, 1);
        mat B = tb ? mat_new(TIDE_BF16, N, K, 2) : mat_new(TIDE_F32, K, N, 2);
        float *C1 = calloc((size_t)(M * N), sizeof(float)), *C = calloc((size_t)(M * N), sizeof(float));
        assert_non_null(C1);
        assert_non_null(C);
        tk_gemm_bf16(ta, tb, M, N, K, A.p, A.dt, A.ld, B.p, B.dt, B.ld, false, C1, N, 2);
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            const int64_t k1 = cuts[c];
            tk_gemm_bf16(ta, tb, M, N, k1, A.p, A.dt, A.ld, B.p, B.dt, B.ld, false, C, N, 1);
            tk_gemm_bf16(ta, tb, M, N, K - k1, at(&A, ta, 0, k1), A.dt, A.ld, at(&B, tb, k1, 0), B.dt, B.ld, true, C,
                         N, 2);
            if (memcmp(C, C1, (size_t)(M * N) * sizeof(float)))
                fail_msg("ta %d tb %d: K %lld split at %lld (beta) is not the whole product's bits", ta, tb,
                         (long long)K, (long long)k1);
        }
        free(A.p);
        free(B.p);
        free(C1);
        free(C);
    }
}

static void test_matmul_bf16(void **state) {
    (void)state;
    const int64_t R = 70, K = 300, N = 90;
    mat x = mat_new(TIDE_BF16, R, K, 0), w = mat_new(TIDE_F32, N, K, 0), wkn = mat_new(TIDE_BF16, K, N, 0);
    float *f = malloc((size_t)(R * N) * sizeof(float));
    uint16_t *o = malloc((size_t)(R * N) * 2), *o2 = malloc((size_t)(R * N) * 2), *acc = malloc((size_t)(R * N) * 2);
    char scratch[N * sizeof(float) + 8];
    static char cols[40 * 90 * sizeof(float)]; /* 40 rows of N */
    assert_non_null(f);
    assert_non_null(o);
    assert_non_null(o2);
    assert_non_null(acc);
    for (int form = 0; form < 2; form++) {
        const mat *W = form ? &wkn : &w;
        tk_gemm_bf16(false, !form, R, N, K, x.p, x.dt, K, W->p, W->dt, form ? N : K, false, f, N, 2);
        assert_int_equal(tk_matmul_bf16(x.p, x.dt, W->p, W->dt, R, K, N, form, false, o, TIDE_BF16, N, NULL, 0, 2),
                         TIDE_OK);
        for (int64_t i = 0; i < R * N; i++) assert_int_equal(o[i], tide_f32_to_bf16(f[i]));
        /* a one-row scratch: rows one at a time, the same bits */
        assert_int_equal(tk_matmul_bf16(x.p, x.dt, W->p, W->dt, R, K, N, form, false, o2, TIDE_BF16, N, scratch,
                                        N * sizeof(float), 2),
                         TIDE_OK);
        assert_memory_equal(o, o2, (size_t)(R * N) * 2);
        /* room for 40 of the 70 rows, fewer rows than columns: blocks of
         * 32 columns (the last 26 wide) over all rows, the same bits */
        memset(o2, 0, (size_t)(R * N) * 2);
        assert_int_equal(tk_matmul_bf16(x.p, x.dt, W->p, W->dt, R, K, N, form, false, o2, TIDE_BF16, N, cols,
                                        sizeof cols, 2),
                         TIDE_OK);
        assert_memory_equal(o, o2, (size_t)(R * N) * 2);
        /* accumulating: the widened output plus the product, rounded once
         * (in rows, and in the blocks of columns) */
        for (int64_t i = 0; i < R * N; i++) acc[i] = tide_f32_to_bf16(frand());
        memcpy(o, acc, (size_t)(R * N) * 2);
        assert_int_equal(tk_matmul_bf16(x.p, x.dt, W->p, W->dt, R, K, N, form, true, o, TIDE_BF16, N, cols,
                                        sizeof cols, 2),
                         TIDE_OK);
        memcpy(o2, acc, (size_t)(R * N) * 2);
        assert_int_equal(tk_matmul_bf16(x.p, x.dt, W->p, W->dt, R, K, N, form, true, o2, TIDE_BF16, N, NULL, 0, 2),
                         TIDE_OK);
        assert_memory_equal(o, o2, (size_t)(R * N) * 2);
        float *g = malloc((size_t)(R * N) * sizeof(float));
        assert_non_null(g);
        for (int64_t i = 0; i < R * N; i++) g[i] = tide_bf16_to_f32(acc[i]);
        tk_gemm_bf16(false, !form, R, N, K, x.p, x.dt, K, W->p, W->dt, form ? N : K, true, g, N, 1);
        for (int64_t i = 0; i < R * N; i++) assert_int_equal(o2[i], tide_f32_to_bf16(g[i]));
        /* an f32 output: tk_gemm_bf16's sums themselves */
        assert_int_equal(tk_matmul_bf16(x.p, x.dt, W->p, W->dt, R, K, N, form, false, g, TIDE_F32, N, NULL, 0, 3),
                         TIDE_OK);
        assert_memory_equal(g, f, (size_t)(R * N) * sizeof(float));
        free(g);
    }
    /* MATMUL_GRADW: dw (N, K) = dy^T . x */
    mat dy = mat_new(TIDE_F32, R, N, 0);
    float *dw = malloc((size_t)(N * K) * sizeof(float)), *dw2 = malloc((size_t)(N * K) * sizeof(float));
    assert_non_null(dw);
    assert_non_null(dw2);
    assert_int_equal(tk_matmul_gradw_bf16(dy.p, dy.dt, x.p, x.dt, R, N, K, false, dw, 2), TIDE_OK);
    tk_gemm_bf16(true, false, N, K, R, dy.p, dy.dt, N, x.p, x.dt, K, false, dw2, K, 1);
    assert_memory_equal(dw, dw2, (size_t)(N * K) * sizeof(float));
    free(dw);
    free(dw2);
    free(dy.p);
    free(x.p);
    free(w.p);
    free(wkn.p);
    free(f);
    free(o);
    free(o2);
    free(acc);
}

static void test_path(void **state) {
    (void)state;
    unsigned f = tk_cpu_detected();
    const char *p = tk_gemm_bf16_path();
    /* AMX where cpuid reports it and Linux lends the tiles (refused, VDPBF16PS) */
    if ((f & TK_CPU_AMXBF16) && (f & TK_CPU_AVX512F)) assert_true(strstr(p, "amx_bf16") || strstr(p, "avx512_bf16"));
    else if (f & TK_CPU_AVX512BF16) assert_non_null(strstr(p, "avx512_bf16"));
    else if (f & TK_CPU_AVX512F) assert_non_null(strstr(p, "avx512"));
    tk_cpu_force_no_amx(true);
    if (f & TK_CPU_AVX512BF16) assert_non_null(strstr(tk_gemm_bf16_path(), "vdpbf16ps"));
    tk_cpu_force_no_amx(false);
    tk_cpu_force_no_bf16(true);
    if (f & TK_CPU_AVX512F) assert_non_null(strstr(tk_gemm_bf16_path(), "widened"));
    tk_cpu_force_no_bf16(false);
    tk_cpu_force_generic(true);
    assert_non_null(strstr(tk_gemm_bf16_path(), "portable"));
    tk_cpu_force_generic(false);
    printf("bf16 products here: %s\n", tk_gemm_bf16_path());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path),
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_large),
        cmocka_unit_test(test_threads_tiles),
        cmocka_unit_test(test_amx_order),
        cmocka_unit_test(test_matmul_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
