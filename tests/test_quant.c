/*
 * test_quant.c - the reference arithmetic of the block types (src/core/quant.c)
 * against the `gguf` Python package and against each type's error bound.
 *
 * Fixtures ($TIDE_FIXTURES/quant, made by scripts/make_quant_fixtures.py with
 * gguf-py's gguf.quants; tests/fixtures/README.md):
 *   - deq_<type>.bin: blocks of random bytes with random finite f16 scales,
 *     the extreme ones (f16 max, the smallest and largest subnormals, zero, -0,
 *     negative), an all-zero block and an all-ones block, with gguf-py's
 *     dequantized values: tide_dequantize_row must give the same bits.
 *   - q_<type>.bin (Q8_0, Q4_0, F16, BF16: the types gguf-py quantizes): f32
 *     rows (several magnitudes, zero blocks, exact rounding ties, outliers,
 *     equal magnitudes of both signs, scales that are f16 subnormals or
 *     overflow) with gguf-py's bytes: tide_quantize_row must give the same
 *     bytes.
 * Without fixtures (TIDE_FIXTURES unset) the test fails: they are committed.
 *
 * For every block type, seeded random blocks of many shapes are quantized and
 * checked against the bounds docs/quantization.md derives:
 *   Q8_0  |x - y| <= d/2 + 127 |d16 - d|, d = amax / 127;
 *   Q4_0  |x - y| <= |d| + 8 ||d16| - |d||, d = amax / 8 (the far end clamps);
 *   Q4_K, Q5_K (nmax 15, 31), per sub-block of range R = max - min(min, 0):
 *         |x - y| <= 4 R / nmax + nmax dS + dM, dS, dM the 6-bit scale and
 *         min roundings (d16 / 2 + 63 ulp-bounds);
 *   Q6_K  |x - y| <= amax / 16 + 32 dS, dS = |d16| / 2 + 128 ulp-bound (the
 *         int8 scale rounding; the amax / 16 for the fit is measured, not
 *         proven: the worst seen is below amax / 38);
 *   K types: every element is its sub-block grid's nearest value (the
 *         quantizers' last step);
 * plus f32 rounding slack. Re-quantizing a dequantized Q8_0 or Q4_0 block
 * gives the same bytes; for the K types (whose scale search sees the
 * dequantized values as new data) the re-quantized values stay within the
 * bound of the dequantized ones.
 */
#include "core/core.h"
#include "core/quant.h"
#include "core/quant_blocks.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ---------------------------------------------------------------- fixtures */

typedef struct fixture {
    uint32_t kind, dtype, n;
    uint8_t *data;
    size_t size;
} fixture;

static bool load_fixture(const char *name, fixture *f) {
    const char *dir = getenv("TIDE_FIXTURES");
    assert_non_null(dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/quant/%s", dir, name);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        print_error("cannot open %s\n", path);
        return false;
    }
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->data = malloc((size_t)sz);
    assert_non_null(f->data);
    assert_int_equal(fread(f->data, 1, (size_t)sz, fp), (size_t)sz);
    fclose(fp);
    f->size = (size_t)sz;
    assert_true(sz >= 16 && memcmp(f->data, "TQF1", 4) == 0);
    memcpy(&f->kind, f->data + 4, 4);
    memcpy(&f->dtype, f->data + 8, 4);
    memcpy(&f->n, f->data + 12, 4);
    return true;
}

static void test_dequant_matches_gguf(void **state) {
    (void)state;
    const char *names[] = {"deq_q8_0.bin", "deq_q4_0.bin", "deq_q4_k.bin", "deq_q5_k.bin", "deq_q6_k.bin"};
    const tide_dtype want[] = {TIDE_Q8_0, TIDE_Q4_0, TIDE_Q4_K, TIDE_Q5_K, TIDE_Q6_K};
    for (int t = 0; t < 5; t++) {
        fixture f;
        assert_true(load_fixture(names[t], &f));
        assert_int_equal(f.kind, 0);
        assert_int_equal(f.dtype, want[t]);
        size_t qbytes = tide_dtype_bytes(want[t], f.n);
        assert_true(qbytes > 0);
        assert_int_equal(f.size, 16 + qbytes + 4 * (size_t)f.n);
        float *out = malloc(4 * (size_t)f.n);
        assert_int_equal(tide_dequantize_row(want[t], f.data + 16, out, f.n), 0);
        const uint8_t *ref = f.data + 16 + qbytes;
        int bad = 0;
        for (uint32_t i = 0; i < f.n; i++) {
            float r;
            memcpy(&r, ref + 4 * i, 4);
            if (memcmp(&r, &out[i], 4) != 0) {
                if (bad++ < 5) print_error("%s: element %u: tide %a, gguf %a\n", names[t], i, out[i], r);
            }
        }
        assert_int_equal(bad, 0);
        free(out);
        free(f.data);
    }
}

static void test_quant_matches_gguf(void **state) {
    (void)state;
    const char *names[] = {"q_q8_0.bin", "q_q4_0.bin", "q_f16.bin", "q_bf16.bin"};
    const tide_dtype want[] = {TIDE_Q8_0, TIDE_Q4_0, TIDE_F16, TIDE_BF16};
    for (int t = 0; t < 4; t++) {
        fixture f;
        assert_true(load_fixture(names[t], &f));
        assert_int_equal(f.kind, 1);
        assert_int_equal(f.dtype, want[t]);
        size_t qbytes = tide_dtype_bytes(want[t], f.n);
        assert_int_equal(f.size, 16 + 4 * (size_t)f.n + qbytes);
        float *x = malloc(4 * (size_t)f.n);
        memcpy(x, f.data + 16, 4 * (size_t)f.n);
        uint8_t *q = malloc(qbytes);
        assert_int_equal(tide_quantize_row(want[t], x, q, f.n), 0);
        const uint8_t *ref = f.data + 16 + 4 * (size_t)f.n;
        size_t bb = tide_dtype_block_bytes(want[t]);
        int bad = 0;
        for (size_t b = 0; b < qbytes / bb; b++)
            if (memcmp(q + b * bb, ref + b * bb, bb) != 0 && bad++ < 5)
                print_error("%s: block %zu differs from gguf's\n", names[t], b);
        assert_int_equal(bad, 0);
        free(q);
        free(x);
        free(f.data);
    }
}

/* ---------------------------------------------------------------- bounds */

static uint64_t rng_state;
static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static double nrand(void) {
    double u = urand() + 1e-300, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* Block b of a test row: one of 10 shapes at one of 6 magnitudes. */
static void fill_block(float *x, int qk, int b) {
    static const double mags[] = {1.0, 0.02, 3e-4, 50.0, 2e3, 1e-2};
    double m = mags[(b / 10) % 6];
    for (int i = 0; i < qk; i++) {
        double v;
        switch (b % 10) {
        case 0: v = nrand(); break;
        case 1: v = urand() * 2 - 1; break;
        case 2: v = urand(); break;                         /* one-signed */
        case 3: v = -urand() - 0.5; break;                  /* all negative, away from 0 */
        case 4: v = nrand() * nrand() * nrand(); break;     /* heavy tails */
        case 5: v = i == qk / 3 ? 40.0 : nrand() * 1e-2; break; /* one outlier */
        case 6: v = 0; break;
        case 7: v = (i % 7) - 3; break;                     /* few distinct values */
        case 8: v = i < qk / 2 ? nrand() : nrand() * 1e-3; break; /* loud and quiet sub-blocks */
        default: v = (i & 1) ? 1.0 : -1.0; break;
        }
        x[i] = (float)(v * m);
    }
}

/* Half the spacing of f16 values near |h| (an upper bound of the rounding
 * error of an f32 that rounded to h), conservatively. */
static double f16_err(double h) { return fmax(fabs(h) * 0x1p-10, 0x1p-24); }

static double amax_of(const float *x, int n) {
    double a = 0;
    for (int i = 0; i < n; i++) a = fmax(a, fabs(x[i]));
    return a;
}

/* Checks y = dequantize(quantize(x)) for one block (q its bytes) against the
 * type's bound; returns the largest |x - y| / bound seen. */
static double check_block(tide_dtype dt, const float *x, const uint8_t *q, const float *y) {
    int qk = tide_dtype_block(dt);
    double amax = amax_of(x, qk), worst = 0;
    double slack = amax * 0x1p-18 + 1e-30;
    if (dt == TIDE_Q8_0 || dt == TIDE_Q4_0) {
        uint16_t h;
        memcpy(&h, q, 2);
        double d16 = fabs((double)tide_f16_to_f32(h));
        double d = dt == TIDE_Q8_0 ? amax / 127 : amax / 8;
        double bound = dt == TIDE_Q8_0 ? d / 2 + 127 * fabs(d16 - d) : d + 8 * fabs(d16 - d);
        bound += slack;
        for (int i = 0; i < qk; i++) {
            double e = fabs((double)x[i] - y[i]);
            if (e > bound) print_error("%s: element %d: |%g - %g| > %g\n", tide_dtype_name(dt), i, x[i], y[i], bound);
            assert_true(e <= bound);
            worst = fmax(worst, e / bound);
        }
        return worst;
    }
    if (dt == TIDE_Q4_K || dt == TIDE_Q5_K) {
        int nmax = dt == TIDE_Q4_K ? 15 : 31;
        tide_block_q4_k hdr; /* d, dmin and scales lie at the same offsets in Q5_K */
        memcpy(&hdr, q, 16);
        double d16 = tide_f16_to_f32(hdr.d), m16 = tide_f16_to_f32(hdr.dmin);
        double dS = d16 / 2 + 63 * f16_err(d16), dM = m16 / 2 + 63 * f16_err(m16);
        for (int j = 0; j < 8; j++) {
            const float *xs = x + 32 * j, *ys = y + 32 * j;
            double lo = 0, hi = xs[0];
            for (int l = 0; l < 32; l++) {
                lo = fmin(lo, xs[l]);
                hi = fmax(hi, xs[l]);
            }
            double bound = 4 * (hi - lo) / nmax + nmax * dS + dM + slack;
            uint8_t sc, m;
            tide_q4k_scale_min(j, hdr.scales, &sc, &m);
            float S = (float)d16 * (float)sc, M = (float)m16 * (float)m;
            for (int l = 0; l < 32; l++) {
                double e = fabs((double)xs[l] - ys[l]);
                if (e > bound) print_error("%s: sub-block %d element %d: |%g - %g| > %g\n", tide_dtype_name(dt), j, l,
                                           xs[l], ys[l], bound);
                assert_true(e <= bound);
                worst = fmax(worst, e / bound);
                if (S == 0.f) continue;
                /* the nearest value of the grid S * q - M, q = 0..nmax */
                double best = INFINITY;
                for (int k = 0; k <= nmax; k++) best = fmin(best, fabs((double)xs[l] - (double)(S * (float)k - M)));
                assert_true(e <= best + 1e-5 * (fabs(xs[l]) + S * nmax + M) + 1e-30);
            }
        }
        return worst;
    }
    /* Q6_K */
    tide_block_q6_k blk;
    memcpy(&blk, q, sizeof blk);
    float d = tide_f16_to_f32(blk.d);
    double dS = fabs(d) / 2 + 128 * f16_err(d); /* |stored sub-block scale - its fit| */
    double bound = amax / 16 + 32 * dS + slack;
    for (int j = 0; j < 16; j++) {
        float S = d * (float)blk.scales[j];
        for (int l = 0; l < 16; l++) {
            int i = 16 * j + l;
            double e = fabs((double)x[i] - y[i]);
            if (e > bound) print_error("q6_k: element %d: |%g - %g| > %g\n", i, x[i], y[i], bound);
            assert_true(e <= bound);
            worst = fmax(worst, e / bound);
            if (S == 0.f) continue;
            double best = INFINITY;
            for (int k = -32; k < 32; k++) best = fmin(best, fabs((double)x[i] - (double)(S * (float)k)));
            assert_true(e <= best + 1e-5 * (fabs(x[i]) + fabs(S) * 32) + 1e-30);
        }
    }
    return worst;
}

static void test_roundtrip_bounds(void **state) {
    (void)state;
    const tide_dtype types[] = {TIDE_Q8_0, TIDE_Q4_0, TIDE_Q4_K, TIDE_Q5_K, TIDE_Q6_K};
    for (int t = 0; t < 5; t++) {
        tide_dtype dt = types[t];
        int qk = tide_dtype_block(dt);
        size_t bb = tide_dtype_block_bytes(dt);
        const int nb = 600;
        float *x = malloc(sizeof(float) * qk * nb), *y = malloc(sizeof(float) * qk * nb);
        float *z = malloc(sizeof(float) * qk * nb);
        uint8_t *q = malloc(bb * nb), *q2 = malloc(bb * nb);
        rng_state = 0x9E3779B97F4A7C15ull + (uint64_t)t;
        for (int b = 0; b < nb; b++) fill_block(x + (size_t)b * qk, qk, b);
        assert_int_equal(tide_quantize_row(dt, x, q, (int64_t)qk * nb), 0);
        assert_int_equal(tide_dequantize_row(dt, q, y, (int64_t)qk * nb), 0);
        double worst = 0;
        for (int b = 0; b < nb; b++)
            worst = fmax(worst, check_block(dt, x + (size_t)b * qk, q + b * bb, y + (size_t)b * qk));
        /* re-quantizing the dequantized values */
        assert_int_equal(tide_quantize_row(dt, y, q2, (int64_t)qk * nb), 0);
        assert_int_equal(tide_dequantize_row(dt, q2, z, (int64_t)qk * nb), 0);
        int same = 0;
        for (int b = 0; b < nb; b++) {
            bool eq = memcmp(q + b * bb, q2 + b * bb, bb) == 0;
            same += eq;
            if (dt == TIDE_Q8_0 || dt == TIDE_Q4_0) assert_true(eq);
            check_block(dt, y + (size_t)b * qk, q2 + b * bb, z + (size_t)b * qk);
        }
        print_message("%s: worst error / bound %.3f; re-quantized blocks identical %d / %d\n", tide_dtype_name(dt),
                      worst, same, nb);
        /* an all-zero block dequantizes to zeros */
        for (int b = 0; b < nb; b++)
            if (amax_of(x + (size_t)b * qk, qk) == 0)
                for (int i = 0; i < qk; i++) assert_true(y[(size_t)b * qk + i] == 0.f);
        free(x);
        free(y);
        free(z);
        free(q);
        free(q2);
    }
}

/* Values an element can take reach the layout's every bit: quantizing a
 * block whose values are exactly a grid of the type uses all codes. */
static void test_codes_and_layout(void **state) {
    (void)state;
    /* Q8_0: x = k, k = -127..127 over a few blocks: d = 1, q = x exactly */
    float x[256];
    for (int i = 0; i < 32; i++) x[i] = (float)(i * 8 - 127 + (i == 31 ? 6 : 0));
    tide_block_q8_0 b8;
    assert_int_equal(tide_quantize_row(TIDE_Q8_0, x, &b8, 32), 0);
    assert_int_equal(b8.d, tide_f32_to_f16(1.0f));
    for (int i = 0; i < 32; i++) assert_int_equal(b8.qs[i], (int)x[i]);
    /* Q4_0: max -8 at element 0 gives d = 1; element i < 16 in the low nibble of qs[i] */
    for (int i = 0; i < 32; i++) x[i] = (float)((i % 16) - 8);
    x[0] = -8;
    tide_block_q4_0 b4;
    assert_int_equal(tide_quantize_row(TIDE_Q4_0, x, &b4, 32), 0);
    assert_int_equal(b4.d, tide_f32_to_f16(1.0f));
    for (int i = 0; i < 16; i++) assert_int_equal(b4.qs[i], (i) | (i << 4));
    /* Q6_K: codes at their documented places: dequantize a block with one
     * code set per quarter and compare positions */
    tide_block_q6_k b6;
    memset(&b6, 0, sizeof b6);
    for (int j = 0; j < 16; j++) b6.scales[j] = 1;
    b6.d = tide_f32_to_f16(1.0f);
    /* all codes 32 (value 0) but element 128 + 5 + 64 (half 1, l 5, k 2):
     * q2 = ql[64 + 5] >> 4 | (qh[32 + 5] >> 4 & 3) << 4 */
    memset(b6.qh, 0xAA, sizeof b6.qh); /* every high pair 2: every q = 32 */
    b6.ql[64 + 5] = 0x70;                                    /* q2 low nibble 7 */
    float y[256];
    assert_int_equal(tide_dequantize_row(TIDE_Q6_K, &b6, y, 256), 0);
    for (int i = 0; i < 256; i++) assert_true(y[i] == (i == 128 + 5 + 64 ? 7.f : 0.f));
    /* Q5_K: the fifth bit of element l of group g's high half is bit 2g+1 of qh[l] */
    tide_block_q5_k b5;
    memset(&b5, 0, sizeof b5);
    b5.d = tide_f32_to_f16(1.0f);
    for (int j = 0; j < 4; j++) b5.scales[j] = 1; /* sc[j] = 1, m[j] = 0 for j < 4 */
    for (int j = 8; j < 12; j++) b5.scales[j] = 1; /* sc[j] low nibble for j >= 4 */
    b5.qh[9] = 1 << 3; /* group 1, high half, element 9: sub-block 3 */
    assert_int_equal(tide_dequantize_row(TIDE_Q5_K, &b5, y, 256), 0);
    for (int i = 0; i < 256; i++) assert_true(y[i] == (i == 32 * 3 + 9 ? 16.f : 0.f));
}

static void test_bad_arguments(void **state) {
    (void)state;
    float x[64] = {0}, y[64];
    uint8_t q[256];
    assert_int_equal(tide_quantize_row(TIDE_Q8_0, x, q, 33), -1);
    assert_int_equal(tide_quantize_row(TIDE_Q4_K, x, q, 64), -1);
    assert_int_equal(tide_dequantize_row(TIDE_Q6_K, q, y, 32), -1);
    assert_int_equal(tide_quantize_row(TIDE_I32, x, q, 4), -1);
    assert_int_equal(tide_dequantize_row(TIDE_I32, q, y, 4), -1);
    assert_int_equal(tide_dequantize_row(TIDE_Q8_0, q, y, -32), -1);
    /* scalar types round-trip as tide_convert_to_f32 reads them */
    float v[4] = {1.5f, -0.0f, 65504.f, 1e-8f};
    uint16_t h[4];
    assert_int_equal(tide_quantize_row(TIDE_F16, v, h, 4), 0);
    assert_int_equal(tide_dequantize_row(TIDE_F16, h, y, 4), 0);
    assert_true(y[0] == 1.5f && y[2] == 65504.f && signbit(y[1]));
    /* non-finite inputs give defined blocks, flagged by tide_quant_all_finite */
    x[3] = NAN;
    x[7] = INFINITY;
    assert_false(tide_quant_all_finite(x, 64));
    assert_int_equal(tide_quantize_row(TIDE_Q8_0, x, q, 64), 0);
    assert_int_equal(tide_quantize_row(TIDE_Q4_0, x, q, 64), 0);
    x[3] = 0;
    x[7] = 0;
    assert_true(tide_quant_all_finite(x, 64));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_matches_gguf), cmocka_unit_test(test_quant_matches_gguf),
        cmocka_unit_test(test_roundtrip_bounds),     cmocka_unit_test(test_codes_and_layout),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
