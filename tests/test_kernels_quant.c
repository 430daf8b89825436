/*
 * test_kernels_quant.c - the CPU kernels for block-quantized weights
 * (src/backend/cpu/matmul_quant.c): MATMUL with Q8_0, Q4_0, Q4_K, Q5_K and
 * Q6_K weights, EMBED from quantized tables, and the ops that refuse them.
 *
 * Weights are random blocks: every quant byte uniform (all 4/5/6/8-bit
 * values and Q8_0's -128, every 6-bit scale and min of the K types, every
 * int8 Q6_K scale), the f16 scales d (and dmin) random positive values of
 * 1e-3 to 1e-2; and, in one case of each test, random floats quantized by
 * the reference quantizer (tide_quantize_row). Their values are written here
 * from quant_blocks.h's layout definitions alone (wq_value), in double, not
 * from the kernels' code.
 *
 *   - Activations: tk_quantize_act's q (at tk_q_pos) and d per 32 elements are
 *     d = amax / 127 and |x - d q| <= d / 2 (+ 2^-20 |x|), |q| <= 127, the
 *     same bits on every path, and the sums of each 16.
 *   - Accuracy, every type, odd shapes included (K one block; K 288, a Q8_0 /
 *     Q4_0 row whose last 256-element group is part full; N 13):
 *       against a double reference on the 8-bit activations d_c q_k (the
 *       products the kernels form exactly in integers):
 *         |out - ref| <= 1e-6 * sum_k |a_k| (|d sc q| + |dmin m|)_k,
 *       the f32 steps being a product of two scales, one fma per chunk (two
 *       for the mins) and the lane sums: a few 2^-24 relative per term;
 *       against the f32 product of the dequantized weights and x as it is:
 *         |out - ref32| <= sum_k |w_k| (d_c / 2 + 2^-20 |x_k|) + the bound
 *         above, the activation rounding's bound.
 *   - Bit-invariance: every output the same bits whether R is 1, 3, 17 or
 *     64 rows (a row alone = the same row in a batch), with 1, 2 or 3
 *     threads, with a scratch of one row, the weight cut into two column
 *     blocks writing a wider output, and on the AVX-512 VNNI, AVX2 and
 *     portable paths (forced as test_kernels_matmul.c forces them): all
 *     against one result, memcmp.
 *   - EMBED: rows of a quantized table (whole and cut in two vocabulary
 *     blocks, vocab0) bit for bit the reference dequantization
 *     (tide_dequantize_row, src/core/quant.h), itself checked here against
 *     ggml's arithmetic written from the layouts (Q4_K (d sc) q - dmin m,
 *     Q6_K (d sc)(q - 32), ...); the rows of other ids zeroed or kept.
 *   - Through the CPU backend: a graph's EMBED (quantized table), RMSNORM
 *     (f32 weight) and MATMUL (quantized weight, workspace from ops.c, and
 *     without one) give the kernels' bits; the input-gradient form x . w
 *     (no_transpose: a frozen quantized weight's backward) against a double
 *     reference of the dequantized weight, fresh and accumulating, its bits
 *     independent of the thread count on the fused (few rows) and the
 *     dequantize-into-sgemm path; the accumulating x . w^T with a quantized
 *     weight, and other ops given a quantized tensor, fail with
 *     TIDE_E_UNSUPPORTED naming the op and the type; tk_matmul_ex refuses
 *     them and a w (K, N) whose rows are not whole blocks; a scratch under
 *     one row is TIDE_E_INVALID.
 */
#include "tide.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_int.h"
#include "core/quant.h"
#include "core/quant_blocks.h"
#include "graph/graph.h"

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

static uint64_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

static float frand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static const tide_dtype qtypes[] = {TIDE_Q8_0, TIDE_Q4_0, TIDE_Q4_K, TIDE_Q5_K, TIDE_Q6_K};
#define NQT (sizeof qtypes / sizeof qtypes[0])

static bool have_vnni(void) { return tk_cpu_has(TK_CPU_AVX512VNNI | TK_CPU_AVX2); }

/* Paths: 2 VNNI, 1 AVX2, 0 portable; false if this CPU has not got it. */
static bool set_path(int path) {
    tk_cpu_force_no_avx512(false);
    tk_force_generic(false);
    if (path == 2) return have_vnni();
    if (path == 1) {
        tk_cpu_force_no_avx512(true);
        return tk_have_avx2();
    }
    tk_force_generic(true);
    return true;
}

static const char *path_name(int path) { return path == 2 ? "avx512_vnni" : path == 1 ? "avx2" : "portable"; }

/* ------------------------------------------------------------- weights */

/* n random bytes. */
static void rbytes(void *p, size_t n) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(rnd() >> 33);
}

static uint16_t rscale(void) { return tide_f32_to_f16(0.001f + 0.009f * (0.5f + 0.5f * frand())); }

/* Whether make_w quantizes random floats with the reference quantizer
 * (tide_quantize_row) instead of drawing random blocks. */
static bool from_floats;

/* A random (N, K) weight of dt, K whole blocks. */
static void *make_w(tide_dtype dt, int64_t N, int64_t K) {
    size_t nb = (size_t)tide_dtype_bytes(dt, (uint64_t)(N * K)), bb = tide_dtype_block_bytes(dt);
    uint8_t *w = malloc(nb);
    assert_non_null(w);
    if (from_floats) {
        float *f = malloc(sizeof(float) * (size_t)(N * K));
        assert_non_null(f);
        for (int64_t i = 0; i < N * K; i++) f[i] = 0.05f * frand() * (i % 61 == 3 ? 6.0f : 1.0f);
        assert_int_equal(tide_quantize_row(dt, f, w, N * K), 0);
        free(f);
        return w;
    }
    rbytes(w, nb);
    for (size_t off = 0; off < nb; off += bb) {
        uint16_t d = rscale(), dm = rscale();
        switch (dt) {
        case TIDE_Q8_0: ((tide_block_q8_0 *)(w + off))->d = d; break;
        case TIDE_Q4_0: ((tide_block_q4_0 *)(w + off))->d = d; break;
        case TIDE_Q4_K: ((tide_block_q4_k *)(w + off))->d = d, ((tide_block_q4_k *)(w + off))->dmin = dm; break;
        case TIDE_Q5_K: ((tide_block_q5_k *)(w + off))->d = d, ((tide_block_q5_k *)(w + off))->dmin = dm; break;
        case TIDE_Q6_K: ((tide_block_q6_k *)(w + off))->d = d; break;
        default: break;
        }
    }
    return w;
}

/* Element j of a block of dt, from quant_blocks.h's definitions: *main the
 * scaled integer part (d sc q), *min the subtracted part (dmin m; 0 but for
 * the K types with mins), in double; the value is main - min. */
static void wq_value(tide_dtype dt, const uint8_t *blk, int j, double *main, double *min) {
    *min = 0;
    switch (dt) {
    case TIDE_Q8_0: {
        const tide_block_q8_0 *b = (const void *)blk;
        *main = (double)tide_f16_to_f32(b->d) * b->qs[j];
        break;
    }
    case TIDE_Q4_0: {
        const tide_block_q4_0 *b = (const void *)blk;
        int q = j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4;
        *main = (double)tide_f16_to_f32(b->d) * (q - 8);
        break;
    }
    case TIDE_Q4_K:
    case TIDE_Q5_K: {
        const tide_block_q4_k *b4 = (const void *)blk;
        const tide_block_q5_k *b5 = (const void *)blk;
        const uint8_t *qs = dt == TIDE_Q4_K ? b4->qs : b5->qs;
        int g = j / 64, l = j % 32, high = j % 64 >= 32, sub = 2 * g + high;
        int q = high ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 15;
        if (dt == TIDE_Q5_K) q |= (b5->qh[l] >> sub & 1) << 4;
        uint8_t sc, m;
        tide_q4k_scale_min(sub, b4->scales, &sc, &m);
        *main = (double)tide_f16_to_f32(b4->d) * sc * q;
        *min = (double)tide_f16_to_f32(b4->dmin) * m;
        break;
    }
    case TIDE_Q6_K: {
        const tide_block_q6_k *b = (const void *)blk;
        int h = j / 128, r = j % 128, k = r / 32, l = r % 32;
        int lo = k & 1 ? b->ql[64 * h + l + 32] : b->ql[64 * h + l];
        lo = k >= 2 ? lo >> 4 : lo & 15;
        int hi = b->qh[32 * h + l] >> (2 * k) & 3;
        int q = (lo | hi << 4) - 32;
        *main = (double)tide_f16_to_f32(b->d) * b->scales[8 * h + l / 16 + 2 * k] * q;
        break;
    }
    default: *main = 0; break;
    }
}

/* Element k of row n of w (N, K) of dt. */
static void w_at(tide_dtype dt, const uint8_t *w, int64_t K, int64_t n, int64_t k, double *main, double *min) {
    int qk = tide_dtype_block(dt);
    const uint8_t *blk =
        w + (size_t)tide_dtype_bytes(dt, (uint64_t)(n * K)) + (size_t)(k / qk) * tide_dtype_block_bytes(dt);
    wq_value(dt, blk, (int)(k % qk), main, min);
}

/* ggml's f32 dequantization of one element, the arithmetic spelled out
 * from the layouts (what EMBED must give bit for bit). */
static float w_f32(tide_dtype dt, const uint8_t *w, int64_t K, int64_t n, int64_t k) {
    int qk = tide_dtype_block(dt), j = (int)(k % qk);
    const uint8_t *blk =
        w + (size_t)tide_dtype_bytes(dt, (uint64_t)(n * K)) + (size_t)(k / qk) * tide_dtype_block_bytes(dt);
    switch (dt) {
    case TIDE_Q8_0: {
        const tide_block_q8_0 *b = (const void *)blk;
        return (float)b->qs[j] * tide_f16_to_f32(b->d);
    }
    case TIDE_Q4_0: {
        const tide_block_q4_0 *b = (const void *)blk;
        int q = j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4;
        return (float)(q - 8) * tide_f16_to_f32(b->d);
    }
    case TIDE_Q4_K:
    case TIDE_Q5_K: {
        const tide_block_q4_k *b4 = (const void *)blk;
        const tide_block_q5_k *b5 = (const void *)blk;
        const uint8_t *qs = dt == TIDE_Q4_K ? b4->qs : b5->qs;
        int g = j / 64, l = j % 32, high = j % 64 >= 32, sub = 2 * g + high;
        int q = high ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 15;
        if (dt == TIDE_Q5_K) q |= (b5->qh[l] >> sub & 1) << 4;
        uint8_t sc, m;
        tide_q4k_scale_min(sub, b4->scales, &sc, &m);
        float d1 = tide_f16_to_f32(b4->d) * (float)sc, m1 = tide_f16_to_f32(b4->dmin) * (float)m;
        return d1 * (float)q - m1;
    }
    case TIDE_Q6_K: {
        const tide_block_q6_k *b = (const void *)blk;
        int h = j / 128, r = j % 128, kk = r / 32, l = r % 32;
        int lo = kk & 1 ? b->ql[64 * h + l + 32] : b->ql[64 * h + l];
        lo = kk >= 2 ? lo >> 4 : lo & 15;
        int q = (lo | (b->qh[32 * h + l] >> (2 * kk) & 3) << 4) - 32;
        return tide_f16_to_f32(b->d) * (float)b->scales[8 * h + l / 16 + 2 * kk] * (float)q;
    }
    default: return 0;
    }
}

/* ------------------------------------------------------------- running */

/* out (R, ldo) columns [col0, col0 + N) = x . w^T in row chunks of `chunk`,
 * scratch of `sb` bytes, nt threads. */
static void run_q(const float *x, const void *w, tide_dtype dt, int64_t R, int64_t K, int64_t N, int64_t chunk,
                  size_t sb, int nt, float *out, int64_t ldo, int64_t col0) {
    void *scratch = malloc(sb);
    assert_non_null(scratch);
    for (int64_t r0 = 0; r0 < R; r0 += chunk) {
        int64_t n = TIDE_MIN(chunk, R - r0);
        tide_status st = tk_matmul(x + r0 * K, w, dt, n, K, N, out + r0 * ldo + col0, ldo, scratch, sb, nt);
        assert_int_equal(st, TIDE_OK);
    }
    free(scratch);
}

static float *make_x(int64_t R, int64_t K) {
    float *x = malloc((size_t)(R * K) * sizeof(float));
    assert_non_null(x);
    for (int64_t i = 0; i < R * K; i++) x[i] = frand() * (i % 97 == 5 ? 8.0f : 1.0f); /* a few outliers */
    return x;
}

/* ------------------------------------------------------------- activations */

static void test_quantize_act(void **state) {
    (void)state;
    enum { R = 5, K = 288 };
    float *x = make_x(R, K);
    for (int i = 0; i < 32; i++) x[32 + i] = 0; /* an all-zero chunk */
    size_t rb = tk_matmul_q_row_bytes(K);
    assert_int_equal(rb % 64, 0);
    uint8_t *want = malloc(rb * R), *got = malloc(rb * R);
    assert_non_null(want);
    assert_non_null(got);
    assert_true(set_path(0));
    tk_quantize_act(x, K, R, K, want, 1);
    for (int path = 1; path <= 2; path++) {
        if (!set_path(path)) continue;
        memset(got, 0xab, rb * R);
        tk_quantize_act(x, K, R, K, got, 2);
        if (memcmp(got, want, rb * R)) fail_msg("activation quantization differs on the %s path", path_name(path));
    }
    set_path(2);
    int64_t kp = (K + 255) / 256 * 256;
    for (int r = 0; r < R; r++) {
        const int8_t *q = (const int8_t *)(want + r * rb);
        const float *d = (const float *)(want + r * rb + kp);
        const int16_t *bs = (const int16_t *)(want + r * rb + kp + kp / 32 * 4);
        for (int c = 0; c < kp / 32; c++) {
            float amax = 0;
            for (int i = 0; i < 32 && 32 * c < K; i++) amax = fmaxf(amax, fabsf(x[r * K + 32 * c + i]));
            assert_true(d[c] == amax / 127.0f);
            int s[2] = {0, 0};
            for (int i = 0; i < 32; i++) {
                int k = 32 * c + i;
                int qk = q[tk_q_pos(k)];
                s[i / 16] += qk;
                assert_true(qk >= -127 && qk <= 127);
                double xv = k < K ? x[r * K + k] : 0;
                if (!(fabs(xv - (double)d[c] * qk) <= 0.5 * d[c] + 0x1p-20 * fabs(xv)))
                    fail_msg("row %d element %d: %g quantized to %d x %g", r, k, xv, qk, d[c]);
            }
            assert_int_equal(bs[2 * c], s[0]);
            assert_int_equal(bs[2 * c + 1], s[1]);
        }
    }
    free(x);
    free(want);
    free(got);
}

/* ------------------------------------------------------------- accuracy */

static void check_accuracy(tide_dtype dt, int64_t R, int64_t K, int64_t N) {
    float *x = make_x(R, K);
    void *w = make_w(dt, N, K);
    float *out = malloc((size_t)(R * N) * sizeof(float));
    assert_non_null(out);
    size_t rb = tk_matmul_q_row_bytes(K);
    uint8_t *act = malloc(rb * (size_t)R);
    assert_non_null(act);
    tk_quantize_act(x, K, R, K, act, 1);
    run_q(x, w, dt, R, K, N, R, rb * (size_t)R, 2, out, N, 0);
    int64_t kp = (K + 255) / 256 * 256;
    double worst1 = 0, worst2 = 0;
    for (int64_t r = 0; r < R; r++) {
        const int8_t *q = (const int8_t *)(act + r * rb);
        const float *d = (const float *)(act + r * rb + kp);
        for (int64_t n = 0; n < N; n++) {
            double ref = 0, abs1 = 0, ref32 = 0, round = 0;
            for (int64_t k = 0; k < K; k++) {
                double mn, mi, a = (double)d[k / 32] * q[tk_q_pos(k)], xv = x[r * K + k];
                w_at(dt, w, K, n, k, &mn, &mi);
                ref += (mn - mi) * a;
                abs1 += (fabs(mn) + fabs(mi)) * fabs(a);
                float wf = w_f32(dt, w, K, n, k);
                ref32 += (double)wf * xv;
                round += fabs((double)wf) * (0.5 * d[k / 32] + 0x1p-20 * fabs(xv));
            }
            double got = out[r * N + n], b1 = 1e-6 * abs1 + 1e-30, b2 = round + b1;
            double e1 = fabs(got - ref) / b1, e2 = fabs(got - ref32) / b2;
            if (e1 > worst1) worst1 = e1;
            if (e2 > worst2) worst2 = e2;
        }
    }
    print_message("  %-5s R=%lld K=%lld N=%lld: error / bound %.3g (8-bit activations), %.3g (f32 x)\n",
                  tide_dtype_name(dt), (long long)R, (long long)K, (long long)N, worst1, worst2);
    assert_true(worst1 <= 1.0);
    assert_true(worst2 <= 1.0);
    free(x);
    free(w);
    free(out);
    free(act);
}

static void test_accuracy(void **state) {
    (void)state;
    for (size_t t = 0; t < NQT; t++) {
        tide_dtype dt = qtypes[t];
        int64_t blk = tide_dtype_block(dt);
        check_accuracy(dt, 3, 2048, 24);
        check_accuracy(dt, 2, blk, 13); /* one block */
        check_accuracy(dt, 1, blk == 32 ? 288 : 512, 9);
        from_floats = true; /* weights from the reference quantizer */
        check_accuracy(dt, 4, 2048, 16);
        from_floats = false;
    }
}

/* ------------------------------------------------------------- invariance */

static void check_invariance(tide_dtype dt, int64_t K, int64_t N) {
    enum { R = 64 };
    float *x = make_x(R, K);
    void *w = make_w(dt, N, K);
    size_t full = (size_t)(R * N) * sizeof(float), rb = tk_matmul_q_row_bytes(K), big = rb * R;
    float *want = malloc(full), *got = malloc(full);
    assert_non_null(want);
    assert_non_null(got);
    assert_true(set_path(0));
    run_q(x, w, dt, R, K, N, R, big, 2, want, N, 0);
    size_t wrow = (size_t)tide_dtype_bytes(dt, (uint64_t)K);
    for (int path = 2; path >= 0; path--) {
        if (!set_path(path)) continue;
        static const int64_t chunks[] = {1, 3, 17, 64};
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++)
            for (int nt = 1; nt <= 3; nt++) {
                memset(got, 0xff, full);
                run_q(x, w, dt, R, K, N, chunks[c], big, nt, got, N, 0);
                if (memcmp(got, want, full))
                    fail_msg("%s K=%lld N=%lld, %s path: chunks of %lld rows on %d threads change bits",
                             tide_dtype_name(dt), (long long)K, (long long)N, path_name(path), (long long)chunks[c],
                             nt);
            }
        /* a scratch of one row */
        memset(got, 0xff, full);
        run_q(x, w, dt, R, K, N, R, rb, 3, got, N, 0);
        if (memcmp(got, want, full)) fail_msg("%s, %s path: a scratch of one row changes bits", tide_dtype_name(dt),
                                              path_name(path));
        /* the weight cut into two column blocks of a wider output */
        int64_t n1 = N / 3;
        memset(got, 0xff, full);
        run_q(x, w, dt, R, K, n1, 17, big, 2, got, N, 0);
        run_q(x, (const uint8_t *)w + (size_t)n1 * wrow, dt, R, K, N - n1, 5, big, 3, got, N, n1);
        if (memcmp(got, want, full)) fail_msg("%s, %s path: column blocks change bits", tide_dtype_name(dt),
                                              path_name(path));
    }
    set_path(2);
    free(x);
    free(w);
    free(want);
    free(got);
}

static void test_invariance(void **state) {
    (void)state;
    print_message("  paths: %s%s portable\n", have_vnni() ? "avx512_vnni " : "", tk_have_avx2() ? "avx2" : "");
    for (size_t t = 0; t < NQT; t++) {
        int64_t blk = tide_dtype_block(qtypes[t]);
        check_invariance(qtypes[t], 2048, 37);
        check_invariance(qtypes[t], blk == 32 ? 288 : 256, 13);
        from_floats = true;
        check_invariance(qtypes[t], 512, 21);
        from_floats = false;
    }
}

/* ------------------------------------------------------------- embed */

static void test_embed(void **state) {
    (void)state;
    enum { V = 23, R = 9 };
    for (size_t t = 0; t < NQT; t++) {
        tide_dtype dt = qtypes[t];
        int64_t D = tide_dtype_block(dt) == 32 ? 288 : 512;
        uint8_t *tab = make_w(dt, V, D);
        int32_t tok[R];
        for (int r = 0; r < R; r++) tok[r] = (int32_t)(rnd() % V);
        tok[0] = 0, tok[1] = V - 1;
        float *want = malloc(sizeof(float) * R * D), *got = malloc(sizeof(float) * R * D);
        assert_non_null(want);
        assert_non_null(got);
        for (int r = 0; r < R; r++) {
            for (int64_t k = 0; k < D; k++) want[r * D + k] = w_f32(dt, tab, D, tok[r], k);
            /* the layouts' arithmetic here is the reference's, bit for bit */
            float ref[512];
            size_t rowb = (size_t)tide_dtype_bytes(dt, (uint64_t)D);
            assert_int_equal(tide_dequantize_row(dt, tab + (size_t)tok[r] * rowb, ref, D), 0);
            assert_memory_equal(ref, want + r * D, sizeof(float) * (size_t)D);
        }
        for (int path = 2; path >= 0; path--) {
            if (!set_path(path)) continue;
            int64_t bad = -1;
            memset(got, 0xff, sizeof(float) * R * D);
            assert_int_equal(tk_embed(tab, dt, V, D, 0, 0, true, tok, R, got, &bad, 2), TIDE_OK);
            if (memcmp(got, want, sizeof(float) * R * D))
                fail_msg("embed %s, %s path: rows differ from the dequantization", tide_dtype_name(dt),
                         path_name(path));
            /* the table in two vocabulary blocks [0, 10) and [10, V) */
            memset(got, 0xff, sizeof(float) * R * D);
            size_t off = (size_t)tide_dtype_bytes(dt, (uint64_t)(10 * D));
            assert_int_equal(tk_embed(tab, dt, 10, D, 0, V, true, tok, R, got, &bad, 1), TIDE_OK);
            for (int r = 0; r < R; r++)
                if (tok[r] >= 10)
                    for (int64_t k = 0; k < D; k++) assert_true(got[r * D + k] == 0.0f);
            assert_int_equal(tk_embed(tab + off, dt, V - 10, D, 10, V, false, tok, R, got, &bad, 3), TIDE_OK);
            if (memcmp(got, want, sizeof(float) * R * D))
                fail_msg("embed %s: vocabulary blocks differ", tide_dtype_name(dt));
            /* an id out of the vocabulary: nothing written */
            int32_t badtok[2] = {1, V};
            assert_int_equal(tk_embed(tab, dt, V, D, 0, 0, true, badtok, 2, got, &bad, 1), TIDE_E_RANGE);
            assert_int_equal(bad, 1);
        }
        set_path(2);
        float row[512];
        assert_true(tk_dequant_row(tab, dt, row, D));
        assert_false(tk_dequant_row(tab, dt, row, D - 16)); /* not whole blocks */
        assert_false(tk_dequant_row(tab, TIDE_BF16, row, D));
        free(tab);
        free(want);
        free(got);
    }
}

/* ------------------------------------------------------------- backend */

typedef struct bcase {
    tide_ctx *ctx;
    tide_backend *be;
    tide_graph *g;
} bcase;

static int add_t(bcase *c, const char *name, tide_dtype dt, tide_role role, int64_t d0, int64_t d1) {
    int64_t shape[2] = {d0, d1};
    int id = -1;
    if (tide_graph_add_tensor(c->g, name, dt, role, d1 ? 2 : 1, shape, &id))
        fail_msg("add_tensor %s: %s", name, tide_ctx_last_error(c->ctx));
    return id;
}

/* Runs op i of the graph with the given buffers (indexed by tensor), with
 * its workspace from ops.c when `ws`. */
static tide_status run_op(bcase *c, int i, void **buf, bool ws) {
    const tide_op *op = &c->g->ops[i];
    void *in[TIDE_OP_MAX_IN], *out[TIDE_OP_MAX_OUT], *scratch = NULL;
    for (int k = 0; k < op->n_in; k++) in[k] = buf[op->in[k]];
    for (int k = 0; k < op->n_out; k++) out[k] = buf[op->out[k]];
    if (ws && op->scratch_bytes) {
        scratch = malloc(op->scratch_bytes);
        assert_non_null(scratch);
    }
    tide_status st = c->be->vt->compute(c->be, NULL, c->g, op, in, out, scratch);
    free(scratch);
    return st;
}

/* y (R, D) = x (R, N) . w for w (N, D) of block type dt, against a double
 * reference of the dequantized weight: within 1e-5 of the sum of |terms|
 * (f32 sums of at most a few hundred terms). */
static void check_q_kn(tide_dtype dt, const float *x, const uint8_t *w, int64_t R, int64_t N, int64_t D,
                       const float *y) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < D; k++) {
            double s = 0, a = 0;
            for (int64_t n = 0; n < N; n++) {
                double t = (double)x[r * N + n] * (double)w_f32(dt, w, D, n, k);
                s += t;
                a += fabs(t);
            }
            if (!(fabs((double)y[r * D + k] - s) <= 1e-5 * a + 1e-30)) {
                print_error("%s x . w: y[%lld][%lld] = %.9g, reference %.9g (sum |terms| %.3g)\n", tide_dtype_name(dt),
                            (long long)r, (long long)k, (double)y[r * D + k], s, a);
                fail();
            }
        }
}

static void test_backend(void **state) {
    (void)state;
    enum { T = 6, V = 40, D = 256, N = 70 };
    for (size_t t = 0; t < NQT; t++) {
        tide_dtype dt = qtypes[t];
        bcase c = {.ctx = tide_ctx_new()};
        assert_int_equal(tide_backend_new(c.ctx, TIDE_BACKEND_CPU, &c.be), TIDE_OK);
        c.g = tide_graph_new(c.ctx);
        int tab = add_t(&c, "embed", dt, TIDE_ROLE_WEIGHT, V, D);
        int tok = add_t(&c, "tok", TIDE_I32, TIDE_ROLE_INPUT, T, 0);
        int h = add_t(&c, "h", TIDE_F32, TIDE_ROLE_TEMP, T, D);
        int nw = add_t(&c, "norm", TIDE_F32, TIDE_ROLE_WEIGHT, D, 0);
        int hn = add_t(&c, "hn", TIDE_F32, TIDE_ROLE_TEMP, T, D), w = add_t(&c, "proj", dt, TIDE_ROLE_WEIGHT, N, D);
        int o = add_t(&c, "o", TIDE_F32, TIDE_ROLE_OUTPUT, T, N), o2 = add_t(&c, "o2", TIDE_F32, TIDE_ROLE_TEMP, T, D);
        tide_op_args pe = {0}, pn = {.eps = 1e-5f}, pm = {0}, pt = {.no_transpose = true}, pa = {.accumulate = true};
        int e_in[2] = {tab, tok}, n_in[2] = {h, nw}, m_in[2] = {hn, w}, a_in[3] = {hn, w, o}, t_in[2] = {o, w};
        assert_int_equal(tide_graph_add_op_args(c.g, TIDE_OP_EMBED, 2, e_in, 1, &h, &pe, -1, NULL), TIDE_OK);
        assert_int_equal(tide_graph_add_op_args(c.g, TIDE_OP_RMSNORM, 2, n_in, 1, &hn, &pn, -1, NULL), TIDE_OK);
        assert_int_equal(tide_graph_add_op_args(c.g, TIDE_OP_MATMUL, 2, m_in, 1, &o, &pm, -1, NULL), TIDE_OK);
        assert_int_equal(tide_graph_add_op_args(c.g, TIDE_OP_MATMUL, 3, a_in, 1, &o, &pa, -1, NULL), TIDE_OK);
        /* x (T, N) . w (N, D): the weight read as (K, N) */
        assert_int_equal(tide_graph_add_op_args(c.g, TIDE_OP_MATMUL, 2, t_in, 1, &o2, &pt, -1, NULL), TIDE_OK);
        assert_true(c.g->ops[2].scratch_bytes >= T * tk_matmul_q_min_scratch(D));
        /* a quantized norm weight is refused when the graph is built */
        int qn = add_t(&c, "qnorm", dt, TIDE_ROLE_WEIGHT, 1, D), hq = add_t(&c, "hq", TIDE_F32, TIDE_ROLE_TEMP, T, D);
        int q_in[2] = {h, qn};
        assert_int_not_equal(tide_graph_add_op_args(c.g, TIDE_OP_RMSNORM, 2, q_in, 1, &hq, &pn, -1, NULL), TIDE_OK);

        void *buf[16] = {0};
        buf[tab] = make_w(dt, V, D);
        buf[w] = make_w(dt, N, D);
        int32_t ids[T] = {3, 0, 39, 7, 7, 21};
        buf[tok] = ids;
        float nwv[D];
        for (int k = 0; k < D; k++) nwv[k] = 0.5f + 0.5f * frand();
        buf[nw] = nwv;
        float *hb = malloc(sizeof(float) * T * D), *hnb = malloc(sizeof(float) * T * D);
        float *ob = malloc(sizeof(float) * T * N), *ref = malloc(sizeof(float) * T * N);
        float *o2b = malloc(sizeof(float) * T * D);
        buf[h] = hb, buf[hn] = hnb, buf[o] = ob, buf[o2] = o2b;
        assert_int_equal(run_op(&c, 0, buf, true), TIDE_OK);
        for (int r = 0; r < T; r++)
            for (int k = 0; k < D; k++) assert_true(hb[r * D + k] == w_f32(dt, buf[tab], D, ids[r], k));
        assert_int_equal(run_op(&c, 1, buf, true), TIDE_OK);
        float *want_hn = malloc(sizeof(float) * T * D);
        tk_rmsnorm(hb, nwv, TIDE_F32, T, D, 1e-5f, want_hn, 1);
        assert_memory_equal(hnb, want_hn, sizeof(float) * T * D);
        run_q(hnb, buf[w], dt, T, D, N, T, tk_matmul_q_min_scratch(D), 1, ref, N, 0);
        assert_int_equal(run_op(&c, 2, buf, true), TIDE_OK);
        assert_memory_equal(ob, ref, sizeof(float) * T * N);
        memset(ob, 0, sizeof(float) * T * N);
        assert_int_equal(run_op(&c, 2, buf, false), TIDE_OK); /* no workspace: allocated for the call */
        assert_memory_equal(ob, ref, sizeof(float) * T * N);
        /* the training forms: refused, naming the op's weight and type */
        assert_int_equal(run_op(&c, 3, buf, true), TIDE_E_UNSUPPORTED);
        const char *msg = tide_ctx_last_error(c.ctx);
        print_message("  %s accumulate: %s\n", tide_dtype_name(dt), msg);
        assert_non_null(strstr(msg, "matmul"));
        assert_non_null(strstr(msg, tide_dtype_name(dt)));
        /* x . w: o (T, N) times the weight read as (N, D) */
        assert_int_equal(run_op(&c, 4, buf, true), TIDE_OK);
        check_q_kn(dt, ob, buf[w], T, N, D, o2b);
        /* the kernel itself: more rows (the sgemm path, scratch for a few
         * blocks of columns), thread counts, accumulating */
        {
            enum { RB = 40 };
            float *xb = malloc(sizeof(float) * RB * N), *y1 = malloc(sizeof(float) * RB * D);
            float *y2 = malloc(sizeof(float) * RB * D), *y3 = malloc(sizeof(float) * RB * D);
            assert_true(xb && y1 && y2 && y3);
            for (int i = 0; i < RB * N; i++) xb[i] = frand();
            size_t sb = (size_t)N * sizeof(float) * (size_t)tide_dtype_block(dt) * 2 + 100;
            void *scr = malloc(sb);
            assert_non_null(scr);
            for (int rows = 1; rows <= RB; rows += RB - 1) { /* 1: fused; 40: sgemm */
                assert_int_equal(tk_matmul_ex(xb, buf[w], dt, rows, N, D, true, false, y1, D, scr, sb, 1), TIDE_OK);
                check_q_kn(dt, xb, buf[w], rows, N, D, y1);
                assert_int_equal(tk_matmul_ex(xb, buf[w], dt, rows, N, D, true, false, y2, D, scr, sb, 3), TIDE_OK);
                assert_memory_equal(y1, y2, sizeof(float) * (size_t)rows * D);
                for (int i = 0; i < rows * D; i++) y3[i] = y2[i] = 0.25f * frand();
                assert_int_equal(tk_matmul_ex(xb, buf[w], dt, rows, N, D, true, true, y2, D, scr, sb, 2), TIDE_OK);
                for (int i = 0; i < rows * D; i++) assert_true(y2[i] == y3[i] + y1[i]);
            }
            free(scr);
            free(xb);
            free(y1);
            free(y2);
            free(y3);
        }
        /* the kernel's refusals: w (K, N) with rows not of whole blocks, the accumulating x . w^T */
        float tmp[16 * 16];
        assert_int_equal(tk_matmul_ex(hnb, buf[w], dt, 1, D, 16, true, false, tmp, 16, NULL, 0, 1), TIDE_E_UNSUPPORTED);
        assert_int_equal(tk_matmul_ex(hnb, buf[w], dt, 1, D, 16, false, true, tmp, 16, NULL, 0, 1), TIDE_E_UNSUPPORTED);
        assert_int_equal(tk_matmul_q(hnb, buf[w], dt, 1, D, 16, tmp, 16, NULL, 0, 1), TIDE_E_INVALID);
        uint8_t small[64];
        assert_int_equal(tk_matmul_q(hnb, buf[w], dt, 1, D, 16, tmp, 16, small, sizeof small, 1), TIDE_E_INVALID);
        assert_int_equal(tk_matmul_q(hnb, buf[w], TIDE_BF16, 1, D, 16, tmp, 16, small, sizeof small, 1),
                         TIDE_E_INVALID);
        free(buf[tab]);
        free(buf[w]);
        free(hb);
        free(hnb);
        free(ob);
        free(ref);
        free(o2b);
        free(want_hn);
        tide_graph_free(c.g);
        tide_backend_free(c.be);
        tide_ctx_free(c.ctx);
    }
}

/* Another op given a quantized tensor (a hand-made op the graph checks
 * would refuse): TIDE_E_UNSUPPORTED naming the op, tensor and type. */
static void test_backend_other_ops(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    tide_graph *g = tide_graph_new(ctx);
    bcase c = {.ctx = ctx, .be = be, .g = g};
    int x = add_t(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, 256), w = add_t(&c, "nw", TIDE_F32, TIDE_ROLE_WEIGHT, 256, 0);
    int y = add_t(&c, "y", TIDE_F32, TIDE_ROLE_OUTPUT, 2, 256);
    int q = add_t(&c, "nq", TIDE_Q4_K, TIDE_ROLE_WEIGHT, 1, 256);
    tide_op_args pn = {.eps = 1e-5f};
    int in[2] = {x, w};
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_RMSNORM, 2, in, 1, &y, &pn, -1, NULL), TIDE_OK);
    tide_op op = g->ops[0];
    op.in[1] = q; /* the weight swapped for a quantized one behind the checks' back */
    float xb[512] = {0}, yb[512];
    uint8_t qb[144] = {0};
    void *ins[2] = {xb, qb}, *outs[1] = {yb};
    assert_int_equal(be->vt->compute(be, NULL, g, &op, ins, outs, NULL), TIDE_E_UNSUPPORTED);
    const char *msg = tide_ctx_last_error(ctx);
    print_message("  %s\n", msg);
    assert_non_null(strstr(msg, "rmsnorm"));
    assert_non_null(strstr(msg, "nq"));
    assert_non_null(strstr(msg, "q4_k"));
    const char *k = tide_backend_kernels(be);
    print_message("  kernels: %s\n", k);
    assert_non_null(strstr(k, tk_matmul_q_path()));
    assert_non_null(strstr(k, "q4_k"));
    tide_graph_free(g);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_act),   cmocka_unit_test(test_accuracy),
        cmocka_unit_test(test_invariance),     cmocka_unit_test(test_embed),
        cmocka_unit_test(test_backend),        cmocka_unit_test(test_backend_other_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
