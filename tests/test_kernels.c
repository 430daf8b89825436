/*
 * test_kernels.c - the CPU backend's kernels against naive references.
 *
 * Every op is built as a one-op graph through the public API (so its shapes
 * pass graph validation) and run through the CPU backend's vtable `compute` on
 * buffers from the backend's own `alloc`. Each result is compared with a
 * plain reference written here that accumulates in double. Kernels that have
 * AVX-512, AVX2 and portable paths are run on each the CPU has
 * (tk_cpu_force_no_avx512, tk_force_generic).
 *
 * Tolerances (all relative to the size of what is summed, so a wrong index,
 * a missing term or a wrong rounding shows up as an error of order 1):
 *   - EMBED, TAKE_LAST, ARGMAX, GENERIC, dtype conversion: exact (bits).
 *   - RMSNORM, ADD, SILU_MUL: 1e-5 relative.
 *   - MATMUL: |out - ref| <= 1e-5 * sum_k |x_k w_k| (f32 summation of <= 1024
 *     terms in BLAS or 2-accumulator order is well within this).
 *   - ROPE: 1e-6 * max|x| against a reference that forms the angle in f32
 *     exactly as HF does (inv_freq, then pos * inv_freq) and rotates in double.
 *   - ATTENTION: 1e-6 absolute on outputs of magnitude <= 1 (f32 scores,
 *     exp within 2 ulp, sums of <= 300 terms; the largest error seen is 2e-7);
 *     the softmax alone is checked to 4e-7 relative (test_softmax_accuracy).
 *   - Between paths (test_attention_paths, test_silu_mul_paths): AVX-512 and
 *     AVX2 attention differ only in the order of a key tile's softmax sum
 *     (16 lanes or 8): 1e-6 absolute on outputs <= 1 against either path,
 *     as ATTENTION above (the largest AVX-512 - AVX2 difference seen is
 *     about 2.4e-7, a few ulp of 0.93); SILU_MUL is the same
 *     bits on the two SIMD paths; a NaN query gives a NaN row on every path
 *     and leaves every other row's bits.
 * Weights stored as f16/bf16 are compared against their exact f32 values, so
 * storage rounding never enters a tolerance.
 *
 * What it proves: every CPU kernel against a plain reference (f32/f16/bf16
 * weights, GQA, decode positions) on each code path the CPU has (AVX-512,
 * AVX2, portable: attention within 1e-6 of each other at the model's shapes,
 * a NaN row kept to its row, SILU_MUL and conversions bit for bit), dtype
 * rounding, determinism, range errors; the tiled op forms (split embedding,
 * matmul blocks, take_last rows) equal to the whole ops, malformed tiles
 * refused.
 */
#include "tide.h"
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/cpu_features.h"
#include "core/quant.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ------------------------------------------------------------- harness */

typedef struct fx {
    tide_ctx *ctx;
    tide_backend *be;
    tide_graph *g;
    void *bufs[64];
    int n_bufs;
} fx;

static void fx_open(fx *f) {
    memset(f, 0, sizeof *f);
    f->ctx = tide_ctx_new();
    assert_non_null(f->ctx);
    assert_int_equal(tide_cpu_backend_new(f->ctx, &f->be), TIDE_OK);
    assert_int_equal(tide_backend_set_matmul(f->be, TIDE_MATMUL_F32), TIDE_OK); /* the f32 tolerances */
    f->g = tide_graph_new(f->ctx);
    assert_non_null(f->g);
}

static void fx_close(fx *f) {
    for (int i = 0; i < f->n_bufs; i++) f->be->vt->dealloc(f->be, f->bufs[i]);
    tide_graph_free(f->g);
    tide_backend_free(f->be);
    tide_ctx_free(f->ctx);
}

/* Backend memory for n bytes, freed by fx_close. */
static void *fx_buf(fx *f, size_t n) {
    void *p = NULL;
    assert_int_equal(f->be->vt->alloc(f->be, n, &p), TIDE_OK);
    assert_true(((uintptr_t)p & 63) == 0);
    assert_true(f->n_bufs < 64);
    f->bufs[f->n_bufs++] = p;
    return p;
}

static int fx_tensor(fx *f, const char *name, tide_dtype dt, tide_role role, int ndim, int64_t d0,
                     int64_t d1, int64_t d2) {
    int64_t shape[3] = {d0, d1, d2};
    int id = -1;
    tide_status st = tide_graph_add_tensor(f->g, name, dt, role, ndim, shape, &id);
    if (st) print_error("add_tensor %s: %s\n", name, tide_ctx_last_error(f->ctx));
    assert_int_equal(st, TIDE_OK);
    return id;
}

static int fx_op(fx *f, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
                 const tide_op_args *p) {
    int id = -1;
    tide_status st = tide_graph_add_op_args(f->g, kind, n_in, in, n_out, out, p, -1, &id);
    if (st) print_error("add_op %s: %s\n", tide_op_name(kind), tide_ctx_last_error(f->ctx));
    assert_int_equal(st, TIDE_OK);
    return id;
}

/* Runs op `id` (or a caller's modified copy `op`) through the vtable; scratch
 * comes from the backend as the executor would provide it. */
static tide_status fx_run_op(fx *f, const tide_op *op, void *const *in, void *const *out) {
    void *scratch = NULL;
    if (op->scratch_bytes) assert_int_equal(f->be->vt->alloc(f->be, op->scratch_bytes, &scratch), TIDE_OK);
    tide_status st = f->be->vt->compute(f->be, NULL, f->g, op, in, out, scratch);
    if (scratch) f->be->vt->dealloc(f->be, scratch);
    return st;
}

static tide_status fx_run(fx *f, int id, void *const *in, void *const *out) {
    return fx_run_op(f, &f->g->ops[id], in, out);
}

/* Deterministic values in [-1, 1). */
static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

/* Stores n f32 values as dt into dst and returns in `exact` the f32 value
 * each stored element stands for. */
static void store_as(const float *src, tide_dtype dt, void *dst, float *exact, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (dt == TIDE_F32) {
            ((float *)dst)[i] = src[i];
            exact[i] = src[i];
        } else if (dt == TIDE_F16) {
            uint16_t h = tide_f32_to_f16(src[i]);
            ((uint16_t *)dst)[i] = h;
            exact[i] = tide_f16_to_f32(h);
        } else {
            uint16_t h = tide_f32_to_bf16(src[i]);
            ((uint16_t *)dst)[i] = h;
            exact[i] = tide_bf16_to_f32(h);
        }
    }
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Runs fn on the AVX-512 and AVX2 paths (those the CPU has) and on the
 * portable one. */
static void on_all_paths(void (*fn)(void)) {
    tk_force_generic(false);
    fn();
    if (tk_cpu_has(TK_CPU_AVX512F)) {
        tk_cpu_force_no_avx512(true);
        fn();
        tk_cpu_force_no_avx512(false);
    }
    tk_force_generic(true);
    fn();
    tk_force_generic(false);
}

static const tide_dtype wdts[3] = {TIDE_F32, TIDE_F16, TIDE_BF16};

/* ------------------------------------------------------------- dtype.c */

static void test_bf16_rounding(void **state) {
    (void)state;
    /* exact, ties to even (down and up), above a tie */
    assert_int_equal(tide_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(tide_f32_to_bf16(from_bits(0x3f808000u)), 0x3f80); /* 1 + 2^-8: tie, even stays */
    assert_int_equal(tide_f32_to_bf16(from_bits(0x3f818000u)), 0x3f82); /* tie, odd rounds up */
    assert_int_equal(tide_f32_to_bf16(from_bits(0x3f808001u)), 0x3f81); /* just above a tie */
    assert_int_equal(tide_f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80); /* just below */
    assert_int_equal(tide_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(tide_f32_to_bf16(-0.0f), 0x8000);
    /* subnormals round like any other value */
    assert_int_equal(tide_f32_to_bf16(from_bits(0x00000001u)), 0x0000);
    assert_int_equal(tide_f32_to_bf16(from_bits(0x00008000u)), 0x0000); /* tie to even 0 */
    assert_int_equal(tide_f32_to_bf16(from_bits(0x00018000u)), 0x0002); /* tie to even 2 */
    assert_int_equal(tide_f32_to_bf16(from_bits(0x00010000u)), 0x0001);
    /* the largest float rounds up to infinity (as torch does); inf and NaN */
    assert_int_equal(tide_f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);
    assert_int_equal(tide_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(tide_f32_to_bf16(-INFINITY), 0xff80);
    uint16_t n1 = tide_f32_to_bf16(from_bits(0x7f800001u)); /* NaN whose payload is below bit 16 */
    assert_true((n1 & 0x7f80) == 0x7f80 && (n1 & 0x007f) != 0);
    uint16_t n2 = tide_f32_to_bf16(NAN);
    assert_true((n2 & 0x7f80) == 0x7f80 && (n2 & 0x007f) != 0);
    /* bf16 -> f32 is the top half */
    assert_int_equal(bits(tide_bf16_to_f32(0x3f80)), 0x3f800000u);
    assert_int_equal(bits(tide_bf16_to_f32(0x0001)), 0x00010000u); /* subnormal 2^-133 */
    assert_int_equal(bits(tide_bf16_to_f32(0xff80)), 0xff800000u);
    /* every non-NaN bf16 survives a round trip */
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;
        assert_int_equal(tide_f32_to_bf16(tide_bf16_to_f32((uint16_t)h)), h);
    }
}

static void test_f16_rounding(void **state) {
    (void)state;
    const float s = 5.9604644775390625e-8f; /* 2^-24, the smallest f16 subnormal */
    assert_int_equal(tide_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(tide_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(tide_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(tide_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);        /* tie, even stays */
    assert_int_equal(tide_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);    /* tie, odd rounds up */
    assert_int_equal(tide_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01); /* above a tie */
    assert_int_equal(tide_f32_to_f16(65504.0f), 0x7bff);               /* largest */
    assert_int_equal(tide_f32_to_f16(65519.0f), 0x7bff);               /* below half an ulp */
    assert_int_equal(tide_f32_to_f16(65520.0f), 0x7c00);               /* tie rounds to inf */
    assert_int_equal(tide_f32_to_f16(1e6f), 0x7c00);
    assert_int_equal(tide_f32_to_f16(-1e6f), 0xfc00);
    assert_int_equal(tide_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(tide_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t n = tide_f32_to_f16(NAN);
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x03ff) != 0);
    /* subnormals: ties to even between multiples of 2^-24 */
    assert_int_equal(tide_f32_to_f16(0x1p-14f), 0x0400);   /* smallest normal */
    assert_int_equal(tide_f32_to_f16(s), 0x0001);
    assert_int_equal(tide_f32_to_f16(0.5f * s), 0x0000);    /* tie to even 0 */
    assert_int_equal(tide_f32_to_f16(0.75f * s), 0x0001);
    assert_int_equal(tide_f32_to_f16(0.25f * s), 0x0000);
    assert_int_equal(tide_f32_to_f16(1.5f * s), 0x0002);    /* tie to even 2 */
    assert_int_equal(tide_f32_to_f16(2.5f * s), 0x0002);    /* tie to even 2 */
    assert_int_equal(tide_f32_to_f16(-3.5f * s), 0x8004);   /* tie to even 4 */
    assert_int_equal(tide_f32_to_f16(1023.5f * s), 0x0400); /* carries into the smallest normal */
    assert_int_equal(tide_f32_to_f16(1022.5f * s), 0x03fe);
    assert_int_equal(tide_f32_to_f16(1e-30f), 0x0000);
    /* f16 -> f32 */
    assert_int_equal(bits(tide_f16_to_f32(0x0001)), bits(s));
    assert_int_equal(bits(tide_f16_to_f32(0x03ff)), bits(1023.0f * s));
    assert_int_equal(bits(tide_f16_to_f32(0x0400)), bits(0x1p-14f));
    assert_int_equal(bits(tide_f16_to_f32(0x7bff)), bits(65504.0f));
    assert_int_equal(bits(tide_f16_to_f32(0x8000)), 0x80000000u);
    assert_int_equal(bits(tide_f16_to_f32(0x7c00)), 0x7f800000u);
    assert_int_equal(bits(tide_f16_to_f32(0xfc00)), 0xff800000u);
    assert_true(isnan(tide_f16_to_f32(0x7e00)) && isnan(tide_f16_to_f32(0x7c01)));
    /* every non-NaN f16 survives a round trip */
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
        assert_int_equal(tide_f32_to_f16(tide_f16_to_f32((uint16_t)h)), h);
    }
}

/* The kernels' own (vectorised) conversion agrees bit for bit with dtype.c
 * for all 2^16 inputs of both types, NaN payloads included, on both paths. */
static void check_convert_all(void) {
    uint16_t *h = malloc(65536 * 2);
    float *a = malloc(65536 * 4), *b = malloc(65536 * 4);
    assert_true(h && a && b);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    for (int k = 0; k < 2; k++) {
        tide_dtype dt = k ? TIDE_BF16 : TIDE_F16;
        tide_convert_to_f32(h, dt, a, 65536);
        tk_convert(h, dt, b, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            uint32_t want = bits(dt == TIDE_F16 ? tide_f16_to_f32((uint16_t)i) : tide_bf16_to_f32((uint16_t)i));
            if (bits(b[i]) != want || bits(a[i]) != want)
                fail_msg("%s 0x%04x: kernel 0x%08x, dtype.c 0x%08x, want 0x%08x", tide_dtype_name(dt),
                         i, bits(b[i]), bits(a[i]), want);
        }
        /* odd lengths and offsets take the vector tails */
        memset(b, 0, 65536 * 4);
        tk_convert(h + 3, dt, b + 1, 37);
        for (int i = 0; i < 37; i++) assert_int_equal(bits(b[1 + i]), bits(a[3 + i]));
        assert_int_equal(bits(b[0]), 0);
        assert_int_equal(bits(b[38]), 0);
    }
    free(h);
    free(a);
    free(b);
}
static void test_convert_all(void **state) {
    (void)state;
    on_all_paths(check_convert_all);
}

/* ------------------------------------------------------------- backend */

static void test_backend_basics(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    assert_string_equal(tide_backend_name(f.be), "cpu");
    uint8_t *d = fx_buf(&f, 1000), host[1000], back[1000];
    for (int i = 0; i < 1000; i++) host[i] = (uint8_t)(i * 7);
    assert_int_equal(f.be->vt->to_device(f.be, NULL, d, host, sizeof host), TIDE_OK);
    assert_int_equal(f.be->vt->to_host(f.be, NULL, back, d, sizeof back), TIDE_OK);
    assert_memory_equal(host, back, sizeof host);
    void *z = fx_buf(&f, 0); /* zero bytes is a valid allocation */
    assert_non_null(z);
    if (f.be->vt->synchronize) assert_int_equal(f.be->vt->synchronize(f.be), TIDE_OK);
    fx_close(&f);
}

/* ------------------------------------------------------------- embed */

static void test_embed(void **state) {
    (void)state;
    const int V = 37, D = 19, B = 2, T = 5;
    for (int k = 0; k < 3; k++) {
        fx f;
        fx_open(&f);
        int tab = fx_tensor(&f, "tab", wdts[k], TIDE_ROLE_WEIGHT, 2, V, D, 0);
        int tok = fx_tensor(&f, "tok", TIDE_I32, TIDE_ROLE_INPUT, 2, B, T, 0);
        int out = fx_tensor(&f, "out", TIDE_F32, TIDE_ROLE_TEMP, 2, B * T, D, 0);
        int in[2] = {tab, tok};
        int id = fx_op(&f, TIDE_OP_EMBED, 2, in, 1, &out, NULL);
        float src[V * D], exact[V * D];
        fill(src, V * D, 3.0f);
        void *tb = fx_buf(&f, tide_graph_tensor_bytes(f.g, tab));
        store_as(src, wdts[k], tb, exact, V * D);
        int32_t *ids = fx_buf(&f, B * T * 4);
        const int32_t want_ids[10] = {0, 36, 5, 5, 17, 1, 0, 36, 20, 9};
        memcpy(ids, want_ids, sizeof want_ids);
        float *o = fx_buf(&f, (size_t)B * T * D * 4);
        void *ip[2] = {tb, ids}, *op[1] = {o};
        assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
        for (int r = 0; r < B * T; r++)
            for (int c = 0; c < D; c++) assert_int_equal(bits(o[r * D + c]), bits(exact[ids[r] * D + c]));

        /* a bad id: TIDE_E_RANGE naming id, position and vocabulary; nothing written */
        const int32_t bad_ids[2] = {V, -1};
        for (int b = 0; b < 2; b++) {
            memcpy(ids, want_ids, sizeof want_ids);
            ids[7] = bad_ids[b];
            for (int i = 0; i < B * T * D; i++) o[i] = -7.0f;
            assert_int_equal(fx_run(&f, id, ip, op), TIDE_E_RANGE);
            const char *msg = tide_ctx_last_error(f.ctx);
            char want[64];
            snprintf(want, sizeof want, "token id %d at position 7", bad_ids[b]);
            if (!strstr(msg, want) || !strstr(msg, "37")) fail_msg("message: %s", msg);
            for (int i = 0; i < B * T * D; i++) assert_true(o[i] == -7.0f);
        }
        fx_close(&f);
    }
}

/* ------------------------------------------------------------- rmsnorm */

static void test_rmsnorm(void **state) {
    (void)state;
    const int R = 7, D = 333;
    const float eps = 1e-5f;
    for (int k = 0; k < 3; k++) {
        fx f;
        fx_open(&f);
        int x = fx_tensor(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, 0);
        int w = fx_tensor(&f, "w", wdts[k], TIDE_ROLE_WEIGHT, 1, D, 0, 0);
        int out = fx_tensor(&f, "out", TIDE_F32, TIDE_ROLE_TEMP, 2, R, D, 0);
        int in[2] = {x, w};
        tide_op_args p = {.eps = eps};
        int id = fx_op(&f, TIDE_OP_RMSNORM, 2, in, 1, &out, &p);
        float *xb = fx_buf(&f, R * D * 4), *ob = fx_buf(&f, R * D * 4), wsrc[D], wex[D];
        void *wb = fx_buf(&f, tide_graph_tensor_bytes(f.g, w));
        fill(xb, R * D, 2.0f);
        xb[0] = 0; /* a zero row element; row 3 all tiny, so eps matters */
        for (int c = 0; c < D; c++) xb[3 * D + c] *= 1e-4f;
        fill(wsrc, D, 1.5f);
        store_as(wsrc, wdts[k], wb, wex, D);
        void *ip[2] = {xb, wb}, *op[1] = {ob};
        assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
        for (int r = 0; r < R; r++) {
            double ss = 0;
            for (int c = 0; c < D; c++) ss += (double)xb[r * D + c] * xb[r * D + c];
            double rs = 1.0 / sqrt(ss / D + eps);
            for (int c = 0; c < D; c++) {
                double ref = wex[c] * (xb[r * D + c] * rs);
                if (fabs(ob[r * D + c] - ref) > 1e-5 * fabs(ref) + 1e-30)
                    fail_msg("rmsnorm %s [%d,%d]: %.9g vs %.9g", tide_dtype_name(wdts[k]), r, c,
                             ob[r * D + c], ref);
            }
        }
        /* in place gives the same bits */
        float *copy = fx_buf(&f, R * D * 4);
        memcpy(copy, xb, R * D * 4);
        void *ip2[2] = {copy, wb}, *op2[1] = {copy};
        assert_int_equal(fx_run(&f, id, ip2, op2), TIDE_OK);
        assert_memory_equal(copy, ob, R * D * 4);
        fx_close(&f);
    }
}

/* ------------------------------------------------------------- matmul */

/* Checks out (R, N) against x . w^T in double. */
static void check_matmul(const float *x, const float *w, const float *out, int R, int K, int N,
                         const char *what) {
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                s += (double)x[(size_t)r * K + k] * w[(size_t)n * K + k];
                a += fabs((double)x[(size_t)r * K + k] * w[(size_t)n * K + k]);
            }
            double e = fabs(out[(size_t)r * N + n] - s);
            if (!(e <= 1e-5 * a + 1e-30))
                fail_msg("matmul %s R=%d K=%d N=%d [%d,%d]: %.9g vs %.9g", what, R, K, N, r, n,
                         out[(size_t)r * N + n], s);
        }
}

/* One matmul shape for every weight dtype; scratch_rows > 0 shrinks the
 * op's scratch to that many rows of w (forcing many odd blocks). */
static void run_matmul(int R, int K, int N, int scratch_rows) {
    for (int k = 0; k < 3; k++) {
        fx f;
        fx_open(&f);
        int x = fx_tensor(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, K, 0);
        int w = fx_tensor(&f, "w", wdts[k], TIDE_ROLE_WEIGHT, 2, N, K, 0);
        int out = fx_tensor(&f, "out", TIDE_F32, TIDE_ROLE_TEMP, 2, R, N, 0);
        int in[2] = {x, w};
        int id = fx_op(&f, TIDE_OP_MATMUL, 2, in, 1, &out, NULL);
        tide_op op = f.g->ops[id];
        if (wdts[k] != TIDE_F32) {
            uint64_t full = (uint64_t)N * K * 4;
            assert_int_equal(op.scratch_bytes, full < (16u << 20) ? full : (16u << 20));
            if (scratch_rows) op.scratch_bytes = (uint64_t)scratch_rows * K * 4 + 12;
        }
        float *xb = fx_buf(&f, (size_t)R * K * 4), *ob = fx_buf(&f, (size_t)R * N * 4);
        float *wsrc = malloc((size_t)N * K * 4), *wex = malloc((size_t)N * K * 4);
        assert_true(wsrc && wex);
        void *wb = fx_buf(&f, tide_graph_tensor_bytes(f.g, w));
        fill(xb, (size_t)R * K, 1.0f);
        fill(wsrc, (size_t)N * K, 0.5f);
        store_as(wsrc, wdts[k], wb, wex, (size_t)N * K);
        for (size_t i = 0; i < (size_t)R * N; i++) ob[i] = NAN; /* every element must be written */
        void *ip[2] = {xb, wb}, *op_[1] = {ob};
        assert_int_equal(fx_run_op(&f, &op, ip, op_), TIDE_OK);
        check_matmul(xb, wex, ob, R, K, N, tide_dtype_name(wdts[k]));
        /* determinism: a second run gives the same bits */
        float *again = fx_buf(&f, (size_t)R * N * 4);
        void *op2[1] = {again};
        assert_int_equal(fx_run_op(&f, &op, ip, op2), TIDE_OK);
        assert_memory_equal(ob, again, (size_t)R * N * 4);
        free(wsrc);
        free(wex);
        fx_close(&f);
    }
}

static void matmul_small_shapes(void) {
    run_matmul(37, 129, 75, 0);  /* odd sizes, sgemm path, one block */
    run_matmul(37, 129, 75, 7);  /* 11 blocks of 7 rows (equalised) */
    run_matmul(16, 64, 33, 1);   /* one row per block */
    run_matmul(3, 200, 41, 0);   /* fused small-batch path */
    run_matmul(1, 1031, 9, 0);   /* decode: one row, K with a scalar tail */
    run_matmul(15, 17, 5, 0);    /* largest fused batch, tails everywhere */
}
static void test_matmul_small(void **state) {
    (void)state;
    on_all_paths(matmul_small_shapes);
}

/* Large enough (N*K*4 > 16 MiB) that the graph's own scratch holds only part
 * of w: two blocks of 2050 rows. */
static void test_matmul_blocks(void **state) {
    (void)state;
    run_matmul(20, 1024, 4100, 0);
}

/* A scratch smaller than one row of w falls back to the fused kernel. */
static void test_matmul_tiny_scratch(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    const int R = 24, K = 100, N = 10;
    int x = fx_tensor(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, K, 0);
    int w = fx_tensor(&f, "w", TIDE_BF16, TIDE_ROLE_WEIGHT, 2, N, K, 0);
    int out = fx_tensor(&f, "out", TIDE_F32, TIDE_ROLE_TEMP, 2, R, N, 0);
    int in[2] = {x, w};
    int id = fx_op(&f, TIDE_OP_MATMUL, 2, in, 1, &out, NULL);
    tide_op op = f.g->ops[id];
    op.scratch_bytes = 0;
    float *xb = fx_buf(&f, R * K * 4), *ob = fx_buf(&f, R * N * 4), wsrc[N * K], wex[N * K];
    void *wb = fx_buf(&f, N * K * 2);
    fill(xb, R * K, 1.0f);
    fill(wsrc, N * K, 1.0f);
    store_as(wsrc, TIDE_BF16, wb, wex, N * K);
    void *ip[2] = {xb, wb}, *op_[1] = {ob};
    assert_int_equal(f.be->vt->compute(f.be, NULL, f.g, &op, ip, op_, NULL), TIDE_OK);
    check_matmul(xb, wex, ob, R, K, N, "bf16 no scratch");
    fx_close(&f);
}

/* ------------------------------------------------------------- rope */

static void check_rope(void) {
    const int B = 2, T = 5, H = 3, hd = 16, D = H * hd;
    const float theta = 10000.0f;
    fx f;
    fx_open(&f);
    int x = fx_tensor(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, B * T, D, 0);
    int pos = fx_tensor(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T, 0, 0);
    int out = fx_tensor(&f, "out", TIDE_F32, TIDE_ROLE_TEMP, 2, B * T, D, 0);
    int in[2] = {x, pos};
    tide_op_args p = {.n_heads = H, .head_dim = hd, .rope_theta = theta, .batch = B};
    int id = fx_op(&f, TIDE_OP_ROPE, 2, in, 1, &out, &p);
    float *xb = fx_buf(&f, B * T * D * 4), *ob = fx_buf(&f, B * T * D * 4);
    int32_t *pb = fx_buf(&f, T * 4);
    const int32_t pv[5] = {7, 8, 9, 10, 300}; /* decode-like: not starting at 0 */
    memcpy(pb, pv, sizeof pv);
    fill(xb, B * T * D, 2.0f);
    void *ip[2] = {xb, pb}, *op[1] = {ob};
    assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
    for (int r = 0; r < B * T; r++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < hd / 2; i++) {
                /* the angle as HF forms it, in f32; the rotation in double */
                float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
                double a = (float)pv[r % T] * inv;
                const float *xr = xb + r * D + h * hd;
                double r0 = xr[i] * cos(a) - xr[i + hd / 2] * sin(a);
                double r1 = xr[i + hd / 2] * cos(a) + xr[i] * sin(a);
                const float *orow = ob + r * D + h * hd;
                if (fabs(orow[i] - r0) > 1e-6 * 2 || fabs(orow[i + hd / 2] - r1) > 1e-6 * 2)
                    fail_msg("rope row %d head %d i %d: (%.8g, %.8g) vs (%.8g, %.8g)", r, h, i,
                             orow[i], orow[i + hd / 2], r0, r1);
            }
    /* in place gives the same bits */
    float *copy = fx_buf(&f, B * T * D * 4);
    memcpy(copy, xb, B * T * D * 4);
    void *ip2[2] = {copy, pb}, *op2[1] = {copy};
    assert_int_equal(fx_run(&f, id, ip2, op2), TIDE_OK);
    assert_memory_equal(copy, ob, B * T * D * 4);
    fx_close(&f);
}
static void test_rope(void **state) {
    (void)state;
    on_all_paths(check_rope);
}

/* ------------------------------------------------------------- attention */

/* One attention case: B batch rows of T queries at positions start..start+T-1
 * (or `pos` when given), caches of C positions whose rows before `start` hold
 * earlier keys/values and the rest NaN (stale bytes that must never be read). */
typedef struct attn_case {
    int B, T, C, H, KV, hd, start;
} attn_case;

static void run_attention(const attn_case *ac, int n_threads) {
    const int B = ac->B, T = ac->T, C = ac->C, H = ac->H, KV = ac->KV, hd = ac->hd;
    const int qd = H * hd, kd = KV * hd, R = B * T;
    fx f;
    fx_open(&f);
    tide_ctx_set_threads(f.ctx, n_threads);
    int q = fx_tensor(&f, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, R, qd, 0);
    int k = fx_tensor(&f, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, 0);
    int v = fx_tensor(&f, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, 0);
    int pos = fx_tensor(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T, 0, 0);
    int kc = fx_tensor(&f, "kc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
    int vc = fx_tensor(&f, "vc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, R, qd, 0);
    int in[6] = {q, k, v, pos, kc, vc}, out[3] = {o, kc, vc};
    tide_op_args p = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .batch = B};
    int id = fx_op(&f, TIDE_OP_ATTENTION, 6, in, 3, out, &p);
    float *qb = fx_buf(&f, (size_t)R * qd * 4), *kb = fx_buf(&f, (size_t)R * kd * 4),
          *vb = fx_buf(&f, (size_t)R * kd * 4), *ob = fx_buf(&f, (size_t)R * qd * 4);
    size_t cn = (size_t)B * C * kd;
    float *kcb = fx_buf(&f, cn * 4), *vcb = fx_buf(&f, cn * 4);
    int32_t *pb = fx_buf(&f, T * 4);
    for (int t = 0; t < T; t++) pb[t] = ac->start + t;
    fill(qb, (size_t)R * qd, 2.0f);
    fill(kb, (size_t)R * kd, 1.0f);
    fill(vb, (size_t)R * kd, 1.0f);
    for (size_t i = 0; i < cn; i++) kcb[i] = vcb[i] = NAN;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < ac->start; j++) {
            fill(kcb + ((size_t)b * C + j) * kd, kd, 1.0f);
            fill(vcb + ((size_t)b * C + j) * kd, kd, 1.0f);
        }
    float *kc0 = malloc(cn * 4), *vc0 = malloc(cn * 4);
    assert_true(kc0 && vc0);
    memcpy(kc0, kcb, cn * 4);
    memcpy(vc0, vcb, cn * 4);
    void *ip[6] = {qb, kb, vb, pb, kcb, vcb}, *op[3] = {ob, kcb, vcb};
    tide_status st = fx_run(&f, id, ip, op);
    if (st) fail_msg("attention: %s", tide_ctx_last_error(f.ctx));

    /* the cache: rows pos[t] replaced by k/v, every other row untouched */
    for (int b = 0; b < B; b++)
        for (int j = 0; j < C; j++) {
            const float *gk = kcb + ((size_t)b * C + j) * kd, *gv = vcb + ((size_t)b * C + j) * kd;
            int t = j - ac->start;
            const float *wk = t >= 0 && t < T ? kb + ((size_t)b * T + t) * kd : kc0 + ((size_t)b * C + j) * kd;
            const float *wv = t >= 0 && t < T ? vb + ((size_t)b * T + t) * kd : vc0 + ((size_t)b * C + j) * kd;
            if (memcmp(gk, wk, kd * 4) || memcmp(gv, wv, kd * 4)) fail_msg("cache row b=%d j=%d", b, j);
        }
    /* the output against a double softmax over positions 0..pos[t] */
    double *sc = malloc((size_t)C * sizeof(double));
    assert_non_null(sc);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                int g = h / (H / KV), L = pb[t] + 1;
                const float *qr = qb + ((size_t)b * T + t) * qd + h * hd;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < L; j++) {
                    const float *kr = kcb + ((size_t)b * C + j) * kd + g * hd;
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += (double)qr[d] * kr[d];
                    sc[j] = s / sqrt((double)hd);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j < L; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int d = 0; d < hd; d++) {
                    double ref = 0;
                    for (int j = 0; j < L; j++) ref += sc[j] / sum * vcb[((size_t)b * C + j) * kd + g * hd + d];
                    float got = ob[((size_t)b * T + t) * qd + h * hd + d];
                    if (!(fabs(got - ref) <= 1e-6))
                        fail_msg("attention B%d T%d H%d KV%d hd%d start%d: b=%d t=%d h=%d d=%d: %.9g vs %.9g",
                                 B, T, H, KV, hd, ac->start, b, t, h, d, got, ref);
                }
            }
    free(sc);
    free(kc0);
    free(vc0);
    fx_close(&f);
}

static void attention_cases(void) {
    static const attn_case cases[] = {
        {2, 5, 16, 4, 2, 16, 3},    /* GQA, batch 2, continuing a cache (decode-like) */
        {2, 1, 16, 4, 2, 16, 9},    /* one decode step per batch row */
        {1, 7, 8, 2, 2, 8, 0},      /* MHA, prefill from 0, tiny head */
        {2, 100, 160, 8, 2, 64, 30}, /* several key tiles: the online softmax rescales */
        {1, 9, 40, 6, 3, 12, 20},   /* head_dim not a multiple of 8: portable loops */
        {1, 3, 300, 4, 1, 128, 250}, /* MQA, long cache, head_dim 128 */
        {1, 2, 20, 2, 1, 256, 5},   /* head_dim 256: smaller tiles */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_attention(&cases[i], 0);
}
static void test_attention(void **state) {
    (void)state;
    on_all_paths(attention_cases);
}

/* Softmax accuracy, isolated: q = (4, 0, ...), key j = (s_j, 0, ...) and
 * head_dim 16 make each score exactly s_j (multiples of 1/64, so s_j - max is
 * exact too), and one-hot values make o[j] = p_j / sum p exactly the softmax.
 * 64 batch rows spread the scores over [-88, 0], near the f32 underflow of
 * exp; each o[j] must be within 4e-7 relative of the double softmax (exp
 * within 2 ulp plus a 16-term f32 sum), or below 2e-38 where exp underflows. */
static void check_softmax_accuracy(void) {
    enum { B = 64, C = 16, HD = 16 };
    fx f;
    fx_open(&f);
    int q = fx_tensor(&f, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, B, HD, 0);
    int k = fx_tensor(&f, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, B, HD, 0);
    int v = fx_tensor(&f, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, B, HD, 0);
    int pos = fx_tensor(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, 1, 0, 0);
    int kc = fx_tensor(&f, "kc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, HD);
    int vc = fx_tensor(&f, "vc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, HD);
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, B, HD, 0);
    int in[6] = {q, k, v, pos, kc, vc}, out[3] = {o, kc, vc};
    tide_op_args p = {.n_heads = 1, .n_kv_heads = 1, .head_dim = HD, .batch = B};
    int id = fx_op(&f, TIDE_OP_ATTENTION, 6, in, 3, out, &p);
    float *qb = fx_buf(&f, B * HD * 4), *kb = fx_buf(&f, B * HD * 4), *vb = fx_buf(&f, B * HD * 4);
    float *kcb = fx_buf(&f, B * C * HD * 4), *vcb = fx_buf(&f, B * C * HD * 4), *ob = fx_buf(&f, B * HD * 4);
    int32_t *pb = fx_buf(&f, 4);
    pb[0] = C - 1; /* the new key is the last cache position */
    memset(kcb, 0, B * C * HD * 4);
    memset(vcb, 0, B * C * HD * 4);
    memset(qb, 0, B * HD * 4);
    memset(kb, 0, B * HD * 4);
    memset(vb, 0, B * HD * 4);
    double sc[B][C];
    for (int b = 0; b < B; b++) {
        qb[b * HD] = 4.0f;
        for (int j = 0; j < C; j++) {
            /* row b spreads its keys over [-88 * b / 63, 0] with a jagged pattern */
            double s = -(88.0 * b / 63.0) * ((j * 7) % C) / (C - 1) + 0.25 * (j % 3);
            s = floor(s * 64) / 64;
            sc[b][j] = s;
            float *kr = j == C - 1 ? kb + b * HD : kcb + ((size_t)b * C + j) * HD;
            float *vr = j == C - 1 ? vb + b * HD : vcb + ((size_t)b * C + j) * HD;
            kr[0] = (float)s;
            vr[j] = 1.0f;
        }
    }
    void *ip[6] = {qb, kb, vb, pb, kcb, vcb}, *op[3] = {ob, kcb, vcb};
    assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
    for (int b = 0; b < B; b++) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < C; j++) mx = sc[b][j] > mx ? sc[b][j] : mx;
        for (int j = 0; j < C; j++) sum += exp(sc[b][j] - mx);
        for (int j = 0; j < C; j++) {
            double ref = exp(sc[b][j] - mx) / sum;
            float got = ob[b * HD + j];
            bool ok = ref < 2e-38 ? fabs(got - ref) <= 2e-38 : fabs(got - ref) <= 4e-7 * ref;
            if (!ok) fail_msg("softmax row %d key %d (score %g): %.9g vs %.9g (rel %.3g)", b, j,
                              sc[b][j] - mx, got, ref, fabs(got - ref) / ref);
        }
    }
    fx_close(&f);
}
static void test_softmax_accuracy(void **state) {
    (void)state;
    on_all_paths(check_softmax_accuracy);
}

/* Bad positions return TIDE_E_RANGE with a message and leave the caches alone. */
static void test_attention_bad_pos(void **state) {
    (void)state;
    const int B = 1, T = 3, C = 6, H = 2, KV = 1, hd = 8, kd = KV * hd, qd = H * hd;
    fx f;
    fx_open(&f);
    int q = fx_tensor(&f, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, B * T, qd, 0);
    int k = fx_tensor(&f, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, B * T, kd, 0);
    int v = fx_tensor(&f, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, B * T, kd, 0);
    int pos = fx_tensor(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T, 0, 0);
    int kc = fx_tensor(&f, "kc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
    int vc = fx_tensor(&f, "vc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, B * T, qd, 0);
    int in[6] = {q, k, v, pos, kc, vc}, out[3] = {o, kc, vc};
    tide_op_args p = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .batch = B};
    int id = fx_op(&f, TIDE_OP_ATTENTION, 6, in, 3, out, &p);
    float *qb = fx_buf(&f, B * T * qd * 4), *kb = fx_buf(&f, B * T * kd * 4),
          *vb = fx_buf(&f, B * T * kd * 4), *ob = fx_buf(&f, B * T * qd * 4);
    float *kcb = fx_buf(&f, B * C * kd * 4), *vcb = fx_buf(&f, B * C * kd * 4);
    int32_t *pb = fx_buf(&f, T * 4);
    fill(qb, B * T * qd, 1);
    fill(kb, B * T * kd, 1);
    fill(vb, B * T * kd, 1);
    fill(kcb, B * C * kd, 1);
    fill(vcb, B * C * kd, 1);
    float kc0[B * C * kd], vc0[B * C * kd];
    memcpy(kc0, kcb, sizeof kc0);
    memcpy(vc0, vcb, sizeof vc0);
    const int32_t bad[2][3] = {{4, 5, 6}, {-1, 0, 1}};
    for (int c = 0; c < 2; c++) {
        memcpy(pb, bad[c], sizeof bad[c]);
        void *ip[6] = {qb, kb, vb, pb, kcb, vcb}, *op[3] = {ob, kcb, vcb};
        assert_int_equal(fx_run(&f, id, ip, op), TIDE_E_RANGE);
        const char *msg = tide_ctx_last_error(f.ctx);
        char want[64];
        snprintf(want, sizeof want, "position %d at index %d", c ? -1 : 6, c ? 0 : 2);
        if (!strstr(msg, want) || !strstr(msg, "capacity 6")) fail_msg("message: %s", msg);
        assert_memory_equal(kcb, kc0, sizeof kc0);
        assert_memory_equal(vcb, vc0, sizeof vc0);
    }
    fx_close(&f);
}

/* A head_dim above the tile limit is refused with a message, not overrun. */
static void test_attention_head_dim_limit(void **state) {
    (void)state;
    const int hd = TK_ATTN_MAX_HD + 8;
    fx f;
    fx_open(&f);
    int q = fx_tensor(&f, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, 1, hd, 0);
    int k = fx_tensor(&f, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, 1, hd, 0);
    int v = fx_tensor(&f, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, 1, hd, 0);
    int pos = fx_tensor(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, 1, 0, 0);
    int kc = fx_tensor(&f, "kc", TIDE_F32, TIDE_ROLE_STATE, 3, 1, 2, hd);
    int vc = fx_tensor(&f, "vc", TIDE_F32, TIDE_ROLE_STATE, 3, 1, 2, hd);
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, 1, hd, 0);
    int in[6] = {q, k, v, pos, kc, vc}, out[3] = {o, kc, vc};
    tide_op_args p = {.n_heads = 1, .n_kv_heads = 1, .head_dim = hd, .batch = 1};
    int id = fx_op(&f, TIDE_OP_ATTENTION, 6, in, 3, out, &p);
    float *b[6];
    for (int i = 0; i < 6; i++) b[i] = fx_buf(&f, 2 * hd * 4);
    int32_t *pb = fx_buf(&f, 4);
    pb[0] = 0;
    void *ip[6] = {b[0], b[1], b[2], pb, b[3], b[4]}, *op[3] = {b[5], b[3], b[4]};
    assert_int_equal(fx_run(&f, id, ip, op), TIDE_E_UNSUPPORTED);
    char want[32];
    snprintf(want, sizeof want, "head_dim %d", hd);
    if (!strstr(tide_ctx_last_error(f.ctx), want)) fail_msg("message: %s", tide_ctx_last_error(f.ctx));
    fx_close(&f);
}

/* The same input gives the same bits on every run and for 1, 2 and 3 threads. */
/* ------------------------------------------------------------- KV cache types */

/* One ATTENTION over caches of type cdt: B rows of T queries at positions
 * p0..p0+T-1, caches (B, C, KV*hd) at kc / vc (bytes of that type), nt
 * threads. */
static tide_status cache_attention(tide_dtype cdt, int B, int T, int C, int H, int KV, int hd, int p0, int nt,
                                   const float *qb, const float *kb, const float *vb, void *kc, void *vc, float *ob) {
    const int qd = H * hd, kd = KV * hd, R = B * T;
    fx f;
    fx_open(&f);
    tide_ctx_set_threads(f.ctx, nt);
    int q = fx_tensor(&f, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, R, qd, 0);
    int k = fx_tensor(&f, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, 0);
    int v = fx_tensor(&f, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, 0);
    int pos = fx_tensor(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T, 0, 0);
    int kct = fx_tensor(&f, "kc", cdt, TIDE_ROLE_STATE, 3, B, C, kd);
    int vct = fx_tensor(&f, "vc", cdt, TIDE_ROLE_STATE, 3, B, C, kd);
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, R, qd, 0);
    int in[6] = {q, k, v, pos, kct, vct}, out[3] = {o, kct, vct};
    tide_op_args p = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .batch = B};
    int id = fx_op(&f, TIDE_OP_ATTENTION, 6, in, 3, out, &p);
    int32_t *pb = malloc((size_t)T * sizeof *pb);
    assert_non_null(pb);
    for (int t = 0; t < T; t++) pb[t] = p0 + t;
    void *ip[6] = {(void *)qb, (void *)kb, (void *)vb, pb, kc, vc}, *op[3] = {ob, kc, vc};
    tide_status st = fx_run(&f, id, ip, op);
    if (st) print_error("attention: %s\n", tide_ctx_last_error(f.ctx));
    free(pb);
    fx_close(&f);
    return st;
}

/* The output of query (b, t, head h) in double over keys / values 0..L-1 of
 * kv head g given as f32 rows (kd floats apart, batch row b at b * C). */
static double attn_ref(const float *qr, const float *K, const float *V, int64_t kd, int hd, int L, int d,
                       double *sc) {
    double mx = -INFINITY, sum = 0, r = 0;
    for (int j = 0; j < L; j++) {
        double s = 0;
        for (int e = 0; e < hd; e++) s += (double)qr[e] * K[(int64_t)j * kd + e];
        sc[j] = s / sqrt((double)hd);
        mx = sc[j] > mx ? sc[j] : mx;
    }
    for (int j = 0; j < L; j++) sum += (sc[j] = exp(sc[j] - mx));
    for (int j = 0; j < L; j++) r += sc[j] / sum * V[(int64_t)j * kd + d];
    return r;
}

/* Attention over f16, bf16 and q8_0 caches, against double references:
 *   - the rows written for the current tokens are tide_quantize_row's bytes
 *     of k and v (f16 / bf16 round to nearest even, q8_0 per 32), every other
 *     row untouched (the stale rows hold NaN patterns that must never be read);
 *   - the output is within 1e-6 of the double softmax over the stored values
 *     (tide_dequantize_row of every cache row, the current ones too): the
 *     current tokens attend to their own rounded keys, as a later step will;
 *   - against the exact (unrounded) keys and values, within the type's bound
 *     for these magnitudes (q in [-2, 2), k, v in [-1, 1)): f16 1e-3,
 *     bf16 1e-2, q8_0 1.5e-2 (measured: 2.8e-4, 2.9e-3, 5.0e-3);
 *   - the same bits with 1, 2 or 3 threads, and (B = 1) when the T queries
 *     run as a prefill of T1 and a second call of the rest (a prefill then
 *     decode steps equals one longer prefill, bit for bit). */
static void test_attention_cache_types(void **state) {
    (void)state;
    typedef struct { int B, T, C, H, KV, hd, start; } ccase;
    static const ccase cs[] = {
        {2, 5, 40, 4, 2, 32, 3},     /* GQA, batch 2, continuing a cache */
        {1, 70, 80, 8, 2, 64, 0},    /* a prefill over two key tiles */
        {1, 3, 300, 4, 1, 128, 250}, /* MQA, long cache, head_dim 128 */
    };
    static const tide_dtype cdts[] = {TIDE_F16, TIDE_BF16, TIDE_Q8_0};
    static const double bound[] = {1e-3, 1e-2, 1.5e-2};
    for (size_t di = 0; di < 3; di++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            const ccase *a = &cs[ci];
            const tide_dtype dt = cdts[di];
            const int B = a->B, T = a->T, C = a->C, H = a->H, KV = a->KV, hd = a->hd;
            const int qd = H * hd, kd = KV * hd, R = B * T;
            const size_t rb = (size_t)tide_dtype_bytes(dt, (uint64_t)kd), cb = (size_t)B * C * rb;
            float *qb = malloc((size_t)R * qd * 4), *kb = malloc((size_t)R * kd * 4), *vb = malloc((size_t)R * kd * 4);
            float *ex_k = malloc((size_t)B * C * kd * 4), *ex_v = malloc((size_t)B * C * kd * 4); /* exact */
            float *st_k = malloc((size_t)B * C * kd * 4), *st_v = malloc((size_t)B * C * kd * 4); /* stored */
            uint8_t *kc = malloc(cb), *vc = malloc(cb), *kc0 = malloc(cb), *vc0 = malloc(cb);
            float *o = malloc((size_t)R * qd * 4), *o2 = malloc((size_t)R * qd * 4);
            double *sc = malloc((size_t)C * sizeof(double));
            assert_true(qb && kb && vb && ex_k && ex_v && st_k && st_v && kc && vc && kc0 && vc0 && o && o2 && sc);
            rng_state = 777 + ci;
            fill(qb, (size_t)R * qd, 2.0f);
            fill(kb, (size_t)R * kd, 1.0f);
            fill(vb, (size_t)R * kd, 1.0f);
            memset(kc, 0xff, cb); /* NaN in every type: stale rows */
            memset(vc, 0xff, cb);
            for (int b = 0; b < B; b++)
                for (int j = 0; j < a->start; j++) {
                    size_t r = (size_t)b * C + j;
                    fill(ex_k + r * kd, kd, 1.0f);
                    fill(ex_v + r * kd, kd, 1.0f);
                    assert_int_equal(tide_quantize_row(dt, ex_k + r * kd, kc + r * rb, kd), 0);
                    assert_int_equal(tide_quantize_row(dt, ex_v + r * kd, vc + r * rb, kd), 0);
                }
            memcpy(kc0, kc, cb);
            memcpy(vc0, vc, cb);
            assert_int_equal(cache_attention(dt, B, T, C, H, KV, hd, a->start, 0, qb, kb, vb, kc, vc, o), TIDE_OK);
            /* the cache rows: written ones are the rounded k / v, the rest kept */
            uint8_t *want = malloc(rb);
            assert_non_null(want);
            for (int b = 0; b < B; b++)
                for (int j = 0; j < C; j++) {
                    size_t r = (size_t)b * C + j;
                    int t = j - a->start;
                    for (int c = 0; c < 2; c++) {
                        const uint8_t *got = (c ? vc : kc) + r * rb;
                        if (t >= 0 && t < T) {
                            const float *src = (c ? vb : kb) + ((size_t)b * T + t) * kd;
                            assert_int_equal(tide_quantize_row(dt, src, want, kd), 0);
                            memcpy((c ? ex_v : ex_k) + r * kd, src, (size_t)kd * 4);
                        } else {
                            memcpy(want, (c ? vc0 : kc0) + r * rb, rb);
                        }
                        if (memcmp(got, want, rb)) fail_msg("%s cache row b=%d j=%d (%c)", tide_dtype_name(dt), b, j,
                                                            c ? 'v' : 'k');
                    }
                    if (j < a->start + T) {
                        assert_int_equal(tide_dequantize_row(dt, kc + r * rb, st_k + r * kd, kd), 0);
                        assert_int_equal(tide_dequantize_row(dt, vc + r * rb, st_v + r * kd, kd), 0);
                    }
                }
            free(want);
            double worst_stored = 0, worst_exact = 0;
            for (int b = 0; b < B; b++)
                for (int t = 0; t < T; t++)
                    for (int h = 0; h < H; h++) {
                        const int g = h / (H / KV), L = a->start + t + 1;
                        const float *qr = qb + ((size_t)b * T + t) * qd + h * hd;
                        const size_t base = (size_t)b * C * kd + (size_t)g * hd;
                        for (int d = 0; d < hd; d++) {
                            double got = o[((size_t)b * T + t) * qd + h * hd + d];
                            double es = fabs(got - attn_ref(qr, st_k + base, st_v + base, kd, hd, L, d, sc));
                            double ee = fabs(got - attn_ref(qr, ex_k + base, ex_v + base, kd, hd, L, d, sc));
                            worst_stored = es > worst_stored ? es : worst_stored;
                            worst_exact = ee > worst_exact ? ee : worst_exact;
                        }
                    }
            print_message("%s cache, case %zu: vs stored values %.3g, vs exact %.3g (bound %.3g)\n",
                          tide_dtype_name(dt), ci, worst_stored, worst_exact, bound[di]);
            if (!(worst_stored <= 1e-6)) fail_msg("%s case %zu: %.3g from the stored values", tide_dtype_name(dt), ci,
                                                  worst_stored);
            if (!(worst_exact <= bound[di])) fail_msg("%s case %zu: %.3g from the exact values", tide_dtype_name(dt),
                                                      ci, worst_exact);
            /* the bits do not depend on the threads */
            for (int nt = 1; nt <= 3; nt++) {
                memcpy(kc, kc0, cb);
                memcpy(vc, vc0, cb);
                assert_int_equal(cache_attention(dt, B, T, C, H, KV, hd, a->start, nt, qb, kb, vb, kc, vc, o2),
                                 TIDE_OK);
                if (memcmp(o, o2, (size_t)R * qd * 4)) fail_msg("%s case %zu: %d threads differ", tide_dtype_name(dt),
                                                                 ci, nt);
            }
            /* a prefill of T1 queries, then the rest in a second call */
            if (B == 1 && T > 1) {
                const int T1 = T / 2 + 1;
                memcpy(kc, kc0, cb);
                memcpy(vc, vc0, cb);
                assert_int_equal(cache_attention(dt, 1, T1, C, H, KV, hd, a->start, 0, qb, kb, vb, kc, vc, o2),
                                 TIDE_OK);
                assert_int_equal(cache_attention(dt, 1, T - T1, C, H, KV, hd, a->start + T1, 0, qb + (size_t)T1 * qd,
                                                 kb + (size_t)T1 * kd, vb + (size_t)T1 * kd, kc, vc,
                                                 o2 + (size_t)T1 * qd),
                                 TIDE_OK);
                if (memcmp(o, o2, (size_t)R * qd * 4))
                    fail_msg("%s case %zu: prefill %d + %d differs from one prefill of %d", tide_dtype_name(dt), ci,
                             T1, T - T1, T);
            }
            free(qb), free(kb), free(vb), free(ex_k), free(ex_v), free(st_k), free(st_v);
            free(kc), free(vc), free(kc0), free(vc0), free(o), free(o2), free(sc);
        }
}

static void test_attention_deterministic(void **state) {
    (void)state;
    const int B = 2, T = 70, C = 80, H = 8, KV = 2, hd = 64, kd = KV * hd, qd = H * hd, R = B * T;
    enum { RUNS = 5 };
    float *res[RUNS] = {0};
    const int threads[RUNS] = {0, 0, 1, 2, 3};
    for (int run = 0; run < RUNS; run++) {
        fx f;
        fx_open(&f);
        tide_ctx_set_threads(f.ctx, threads[run]);
        int q = fx_tensor(&f, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, R, qd, 0);
        int k = fx_tensor(&f, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, 0);
        int v = fx_tensor(&f, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, 0);
        int pos = fx_tensor(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T, 0, 0);
        int kc = fx_tensor(&f, "kc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
        int vc = fx_tensor(&f, "vc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
        int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, R, qd, 0);
        int in[6] = {q, k, v, pos, kc, vc}, out[3] = {o, kc, vc};
        tide_op_args p = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .batch = B};
        int id = fx_op(&f, TIDE_OP_ATTENTION, 6, in, 3, out, &p);
        float *qb = fx_buf(&f, R * qd * 4), *kb = fx_buf(&f, R * kd * 4), *vb = fx_buf(&f, R * kd * 4);
        float *kcb = fx_buf(&f, B * C * kd * 4), *vcb = fx_buf(&f, B * C * kd * 4);
        int32_t *pb = fx_buf(&f, T * 4);
        rng_state = 12345;
        fill(qb, R * qd, 3);
        fill(kb, R * kd, 3);
        fill(vb, R * kd, 1);
        fill(kcb, B * C * kd, 3);
        fill(vcb, B * C * kd, 1);
        for (int t = 0; t < T; t++) pb[t] = 5 + t;
        res[run] = malloc(R * qd * 4);
        assert_non_null(res[run]);
        void *ip[6] = {qb, kb, vb, pb, kcb, vcb}, *op[3] = {res[run], kcb, vcb};
        assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
        fx_close(&f);
    }
    for (int run = 1; run < RUNS; run++) assert_memory_equal(res[0], res[run], R * qd * 4);
    for (int run = 0; run < RUNS; run++) free(res[run]);
}

/* One attention run on the path chosen by `path` (2 AVX-512, 1 AVX2, 0
 * portable): B batch rows of T queries at positions start.., a cache of C
 * positions; q, k, v and the cache from a fixed seed, q row `nan_row` (or
 * none when < 0) NaN at its first head's element 0. Returns the output. */
static float *attention_on_path(int path, int B, int T, int C, int H, int KV, int hd, int start, int nan_row) {
    const int kd = KV * hd, qd = H * hd, R = B * T;
    tk_force_generic(path == 0);
    tk_cpu_force_no_avx512(path == 1);
    fx f;
    fx_open(&f);
    int q = fx_tensor(&f, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, R, qd, 0);
    int k = fx_tensor(&f, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, 0);
    int v = fx_tensor(&f, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, 0);
    int pos = fx_tensor(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T, 0, 0);
    int kc = fx_tensor(&f, "kc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
    int vc = fx_tensor(&f, "vc", TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, R, qd, 0);
    int in[6] = {q, k, v, pos, kc, vc}, out[3] = {o, kc, vc};
    tide_op_args p = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .batch = B};
    int id = fx_op(&f, TIDE_OP_ATTENTION, 6, in, 3, out, &p);
    float *qb = fx_buf(&f, (size_t)R * qd * 4), *kb = fx_buf(&f, (size_t)R * kd * 4),
          *vb = fx_buf(&f, (size_t)R * kd * 4);
    float *kcb = fx_buf(&f, (size_t)B * C * kd * 4), *vcb = fx_buf(&f, (size_t)B * C * kd * 4);
    int32_t *pb = fx_buf(&f, (size_t)T * 4);
    rng_state = 777;
    fill(qb, (size_t)R * qd, 3);
    fill(kb, (size_t)R * kd, 3);
    fill(vb, (size_t)R * kd, 1);
    fill(kcb, (size_t)B * C * kd, 3);
    fill(vcb, (size_t)B * C * kd, 1);
    if (nan_row >= 0) qb[(size_t)nan_row * qd] = NAN;
    for (int t = 0; t < T; t++) pb[t] = start + t;
    float *res = malloc((size_t)R * qd * 4);
    assert_non_null(res);
    void *ip[6] = {qb, kb, vb, pb, kcb, vcb}, *op[3] = {res, kcb, vcb};
    assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
    fx_close(&f);
    tk_force_generic(false);
    tk_cpu_force_no_avx512(false);
    return res;
}

/* The AVX-512 attention against the AVX2 and portable paths on the built-in
 * model's shapes (32 heads, 4 KV heads, head_dim 64) and two odd ones:
 * prefill from 0, a decode step over a long cache, a continuation. */
static void test_attention_paths(void **state) {
    (void)state;
    if (!tk_cpu_has(TK_CPU_AVX512F)) skip();
    static const struct { int B, T, C, H, KV, hd, start; } cases[] = {
        {1, 70, 70, 32, 4, 64, 0}, {2, 1, 520, 32, 4, 64, 515}, {1, 9, 300, 8, 2, 128, 200},
        {1, 5, 40, 6, 3, 48, 17}, /* hd % 32 == 16: the 16-wide P.V column */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int B = cases[c].B, T = cases[c].T, n = B * T * cases[c].H * cases[c].hd;
        float *o[3];
        for (int path = 0; path < 3; path++)
            o[path] = attention_on_path(path, B, T, cases[c].C, cases[c].H, cases[c].KV, cases[c].hd,
                                        cases[c].start, -1);
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double d2 = fabs((double)o[2][i] - o[1][i]), d0 = fabs((double)o[2][i] - o[0][i]);
            worst = d2 > worst ? d2 : worst;
            if (!(d2 <= 1e-6) || !(d0 <= 1e-6))
                fail_msg("attention case %zu element %d: avx512 %.9g avx2 %.9g portable %.9g", c, i, o[2][i],
                         o[1][i], o[0][i]);
        }
        print_message("attention case %zu: largest avx512-avx2 difference %.3g\n", c, worst);
        for (int path = 0; path < 3; path++) free(o[path]);
    }
    /* a NaN in a query: that row's head NaN, every other output the bits without it */
    const int B = 1, T = 20, H = 8, KV = 2, hd = 64, qd = H * hd, bad = 7;
    for (int path = 0; path < 3; path++) {
        float *clean = attention_on_path(path, B, T, 40, H, KV, hd, 10, -1);
        float *nan = attention_on_path(path, B, T, 40, H, KV, hd, 10, bad);
        for (int i = 0; i < T * qd; i++) {
            bool in_bad = i / qd == bad && i % qd < hd;
            if (in_bad ? !isnan(nan[i]) : bits(nan[i]) != bits(clean[i]))
                fail_msg("path %d: NaN query, element %d: %.9g (clean %.9g)", path, i, nan[i], clean[i]);
        }
        free(clean);
        free(nan);
    }
}

/* SILU_MUL on the AVX-512 path against the AVX2 one, bit for bit, over a
 * length with a masked tail and gates that include +-inf, NaN and the
 * exp overflow range; and within 1e-5 of the portable path where finite. */
static void test_silu_mul_paths(void **state) {
    (void)state;
    if (!tk_cpu_has(TK_CPU_AVX512F)) skip();
    const int n = 4096 + 4096 + 808 + 13;
    float *g = malloc(n * 4), *u = malloc(n * 4), *o[3];
    assert_true(g && u);
    rng_state = 4242;
    fill(g, n, 30.0f);
    fill(u, n, 2.0f);
    g[5] = INFINITY;
    g[6] = -INFINITY;
    g[7] = NAN;
    g[8] = -100.0f;
    g[9] = 100.0f;
    g[n - 1] = -INFINITY;
    for (int path = 0; path < 3; path++) {
        tk_force_generic(path == 0);
        tk_cpu_force_no_avx512(path == 1);
        o[path] = malloc(n * 4);
        assert_non_null(o[path]);
        tk_silu_mul(g, u, o[path], n, 2);
    }
    tk_force_generic(false);
    tk_cpu_force_no_avx512(false);
    for (int i = 0; i < n; i++) {
        bool nan2 = isnan(o[2][i]), nan1 = isnan(o[1][i]), nan0 = isnan(o[0][i]);
        /* the AVX2 loop's generic tail: the last n % 8 elements */
        bool tail = i >= n - n % 8;
        if (tail ? nan2 != nan0 || (!nan2 && fabs(o[2][i] - o[0][i]) > 1e-5 * fabs(o[0][i]) + 1e-30)
                 : nan2 != nan1 || (!nan2 && bits(o[2][i]) != bits(o[1][i])))
            fail_msg("silu_mul %d (gate %g): avx512 %.9g avx2 %.9g portable %.9g", i, g[i], o[2][i], o[1][i],
                     o[0][i]);
        if (nan0 != nan2 || (!nan0 && !isinf(o[0][i]) && fabs(o[2][i] - o[0][i]) > 1e-5 * fabs(o[0][i]) + 1e-30))
            fail_msg("silu_mul %d against portable: %.9g vs %.9g", i, o[2][i], o[0][i]);
    }
    for (int path = 0; path < 3; path++) free(o[path]);
    free(g);
    free(u);
}

/* ------------------------------------------------------------- elementwise */

static void test_silu_mul_add(void **state) {
    (void)state;
    const int R = 9, I = 1000;
    fx f;
    fx_open(&f);
    int a = fx_tensor(&f, "a", TIDE_F32, TIDE_ROLE_INPUT, 2, R, I, 0);
    int b = fx_tensor(&f, "b", TIDE_F32, TIDE_ROLE_INPUT, 2, R, I, 0);
    int s = fx_tensor(&f, "s", TIDE_F32, TIDE_ROLE_TEMP, 2, R, I, 0);
    int d = fx_tensor(&f, "d", TIDE_F32, TIDE_ROLE_TEMP, 2, R, I, 0);
    int in[2] = {a, b};
    int silu = fx_op(&f, TIDE_OP_SILU_MUL, 2, in, 1, &s, NULL);
    int add = fx_op(&f, TIDE_OP_ADD, 2, in, 1, &d, NULL);
    float *ab = fx_buf(&f, R * I * 4), *bb = fx_buf(&f, R * I * 4), *sb = fx_buf(&f, R * I * 4),
          *db = fx_buf(&f, R * I * 4);
    fill(ab, R * I, 20.0f);
    fill(bb, R * I, 3.0f);
    ab[0] = -100.0f; /* exp(100) overflows: silu must still be -0 * up, not NaN */
    ab[1] = 100.0f;
    void *ip[2] = {ab, bb}, *os[1] = {sb}, *od[1] = {db};
    assert_int_equal(fx_run(&f, silu, ip, os), TIDE_OK);
    assert_int_equal(fx_run(&f, add, ip, od), TIDE_OK);
    for (int i = 0; i < R * I; i++) {
        double g = ab[i], ref = g / (1.0 + exp(-g)) * bb[i];
        if (fabs(sb[i] - ref) > 1e-5 * fabs(ref) + 1e-30) fail_msg("silu_mul %d: %.9g vs %.9g", i, sb[i], ref);
        if (bits(db[i]) != bits(ab[i] + bb[i])) fail_msg("add %d", i);
    }
    fx_close(&f);
}

static void test_take_last(void **state) {
    (void)state;
    const int B = 3, T = 4, D = 5;
    fx f;
    fx_open(&f);
    int x = fx_tensor(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, B * T, D, 0);
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, B, D, 0);
    tide_op_args p = {.batch = B};
    int id = fx_op(&f, TIDE_OP_TAKE_LAST, 1, &x, 1, &o, &p);
    float *xb = fx_buf(&f, B * T * D * 4), *ob = fx_buf(&f, B * D * 4);
    fill(xb, B * T * D, 1);
    void *ip[1] = {xb}, *op[1] = {ob};
    assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
    for (int b = 0; b < B; b++) assert_memory_equal(ob + b * D, xb + (b * T + T - 1) * D, D * 4);
    fx_close(&f);
}

/* The tiled forms: a table split in two blocks filling in their ids over a
 * tokens range (the first zeroing the rest), a matmul writing its block of a
 * wider output in place, take_last into a row of a larger output. Each equals
 * the whole op bit for bit; malformed tiles are refused by the graph. */
static void test_tiled_forms(void **state) {
    (void)state;
    const int V = 11, D = 8, R = 6, K = 16, N = 10;
    fx f;
    fx_open(&f);
    int t1 = fx_tensor(&f, "tab[0:4]", TIDE_F32, TIDE_ROLE_WEIGHT, 2, 4, D, 0);
    int t2 = fx_tensor(&f, "tab[4:11]", TIDE_F32, TIDE_ROLE_WEIGHT, 2, V - 4, D, 0);
    int tok = fx_tensor(&f, "tok", TIDE_I32, TIDE_ROLE_INPUT, 1, R + 2, 0, 0);
    int h = fx_tensor(&f, "h", TIDE_F32, TIDE_ROLE_TEMP, 2, R, D, 0);
    tide_op_args e1 = {.idx0 = 2, .vocab0 = 0, .vocab = V}, e2 = {.idx0 = 2, .vocab0 = 4, .vocab = V};
    int in_a[2] = {t1, tok}, in_b[3] = {t2, tok, h};
    int ea = fx_op(&f, TIDE_OP_EMBED, 2, in_a, 1, &h, &e1), eb = fx_op(&f, TIDE_OP_EMBED, 3, in_b, 1, &h, &e2);
    float *tab = fx_buf(&f, (size_t)V * D * 4), *hb = fx_buf(&f, (size_t)R * D * 4);
    fill(tab, (size_t)V * D, 1);
    int32_t *ids = fx_buf(&f, (R + 2) * 4);
    const int32_t want[8] = {99, 99, 3, 10, 4, 0, 7, 3}; /* the first two are not this tile's */
    memcpy(ids, want, sizeof want);
    for (int i = 0; i < R * D; i++) hb[i] = 5.0f;
    void *ia[2] = {tab, ids}, *ib[3] = {tab + 4 * D, ids, hb}, *oh[1] = {hb};
    assert_int_equal(fx_run(&f, ea, ia, oh), TIDE_OK);
    assert_true(hb[1 * D] == 0.0f); /* id 10 is the second block's: zeroed by the first */
    assert_int_equal(fx_run(&f, eb, ib, oh), TIDE_OK);
    for (int r = 0; r < R; r++) assert_memory_equal(hb + r * D, tab + want[r + 2] * D, D * 4);
    ids[4] = V; /* outside the whole vocabulary, not only the block: refused */
    assert_int_equal(fx_run(&f, ea, ia, oh), TIDE_E_RANGE);

    /* matmul: two column blocks and two row blocks of one output */
    int x = fx_tensor(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, K, 0);
    int xa = fx_tensor(&f, "xa", TIDE_F32, TIDE_ROLE_INPUT, 2, R / 2, K, 0);
    int w = fx_tensor(&f, "w", TIDE_F32, TIDE_ROLE_WEIGHT, 2, N, K, 0);
    int w1 = fx_tensor(&f, "w[0:3]", TIDE_F32, TIDE_ROLE_WEIGHT, 2, 3, K, 0);
    int w2 = fx_tensor(&f, "w[3:10]", TIDE_F32, TIDE_ROLE_WEIGHT, 2, N - 3, K, 0);
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, R, N, 0);
    int ow = fx_tensor(&f, "ow", TIDE_F32, TIDE_ROLE_TEMP, 2, R, N, 0);
    int iw[2] = {x, w};
    int whole = fx_op(&f, TIDE_OP_MATMUL, 2, iw, 1, &ow, NULL);
    int blk[4];
    for (int i = 0; i < 4; i++) {
        tide_op_args mp = {.row0 = (i & 1) * (R / 2), .col0 = i < 2 ? 0 : 3};
        int in3[3] = {xa, i < 2 ? w1 : w2, o};
        blk[i] = fx_op(&f, TIDE_OP_MATMUL, i ? 3 : 2, in3, 1, &o, &mp);
    }
    float *xb = fx_buf(&f, (size_t)R * K * 4), *wb = fx_buf(&f, (size_t)N * K * 4);
    float *ob = fx_buf(&f, (size_t)R * N * 4), *owb = fx_buf(&f, (size_t)R * N * 4);
    fill(xb, (size_t)R * K, 1);
    fill(wb, (size_t)N * K, 1);
    void *iwp[2] = {xb, wb}, *owp[1] = {owb}, *op_[1] = {ob};
    assert_int_equal(fx_run(&f, whole, iwp, owp), TIDE_OK);
    for (int i = 0; i < 4; i++) {
        void *ip[3] = {xb + (i & 1) * (R / 2) * K, i < 2 ? wb : wb + 3 * K, ob};
        assert_int_equal(fx_run(&f, blk[i], ip, op_), TIDE_OK);
    }
    for (int i = 0; i < R * N; i++) assert_int_equal(bits(ob[i]), bits(owb[i]));

    /* take_last into row 2 of a (3, D) output */
    int xs = fx_tensor(&f, "xs", TIDE_F32, TIDE_ROLE_INPUT, 2, 4, D, 0);
    int last = fx_tensor(&f, "last", TIDE_F32, TIDE_ROLE_TEMP, 2, 3, D, 0);
    tide_op_args tp = {.batch = 1, .row0 = 2};
    int in_t[2] = {xs, last};
    int tl = fx_op(&f, TIDE_OP_TAKE_LAST, 2, in_t, 1, &last, &tp);
    float *xsb = fx_buf(&f, 4 * D * 4), *lb = fx_buf(&f, 3 * D * 4);
    fill(xsb, 4 * D, 1);
    for (int i = 0; i < 3 * D; i++) lb[i] = 9.0f;
    void *it[2] = {xsb, lb}, *ot[1] = {lb};
    assert_int_equal(fx_run(&f, tl, it, ot), TIDE_OK);
    assert_memory_equal(lb + 2 * D, xsb + 3 * D, D * 4);
    assert_true(lb[0] == 9.0f && lb[D] == 9.0f);

    /* malformed tiles */
    tide_graph *g = f.g;
    int bad3[3] = {x, w, ow};
    tide_op_args off = {.col0 = 1};
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_MATMUL, 2, iw, 1, &ow, &off, -1, NULL), TIDE_E_INVALID);
    bad3[2] = o; /* the in-place input must be the output */
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_MATMUL, 3, bad3, 1, &ow, NULL, -1, NULL), TIDE_E_INVALID);
    tide_op_args past = {.vocab0 = 8, .vocab = V};
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_EMBED, 2, in_a, 1, &h, &past, -1, NULL), TIDE_E_INVALID);
    tide_op_args far = {.idx0 = 3};
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_EMBED, 2, in_a, 1, &h, &far, -1, NULL), TIDE_E_INVALID);
    tide_op_args neg = {.row0 = -1, .batch = 1};
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_TAKE_LAST, 1, &xs, 1, &last, &neg, -1, NULL), TIDE_E_INVALID);
    fx_close(&f);
}

static void test_argmax(void **state) {
    (void)state;
    const int R = 6, V = 7;
    fx f;
    fx_open(&f);
    int x = fx_tensor(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, V, 0);
    int o = fx_tensor(&f, "o", TIDE_I32, TIDE_ROLE_OUTPUT, 1, R, 0, 0);
    int id = fx_op(&f, TIDE_OP_ARGMAX, 1, &x, 1, &o, NULL);
    float *xb = fx_buf(&f, R * V * 4);
    int32_t *ob = fx_buf(&f, R * 4);
    const float rows[6][7] = {
        {1, 5, 3, 5, 2, 5, 0},                         /* ties: first */
        {-3, -2, -1, -4, -1, -9, -8},                  /* negatives, tie */
        {2, 2, 2, 2, 2, 2, 2},                         /* all equal: 0 */
        {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
        {1, 9, NAN, 10, NAN, 3, 4},                    /* first NaN wins, as torch */
        {0, 1, 2, 3, 4, 5, INFINITY},                  /* last */
    };
    const int32_t want[6] = {1, 2, 0, 0, 2, 6};
    memcpy(xb, rows, sizeof rows);
    void *ip[1] = {xb}, *op[1] = {ob};
    assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
    for (int r = 0; r < R; r++) assert_int_equal(ob[r], want[r]);
    fx_close(&f);
}

/* ------------------------------------------------------------- generic */

static void test_generic(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    int a = fx_tensor(&f, "a", TIDE_F32, TIDE_ROLE_INPUT, 1, 7, 0, 0);       /* 28 bytes */
    int b = fx_tensor(&f, "b", TIDE_I32, TIDE_ROLE_INPUT, 2, 3, 50000, 0);   /* 600000 bytes */
    int s = fx_tensor(&f, "s", TIDE_F16, TIDE_ROLE_STATE, 1, 1001, 0, 0);    /* 2002 bytes, in and out */
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, 2, 100000, 0);   /* 800000 bytes */
    int in[3] = {a, b, s}, out[2] = {o, s};
    tide_op_args p = {.flops = 1e6};
    int id = fx_op(&f, TIDE_OP_GENERIC, 3, in, 2, out, &p);
    const uint64_t nb[4] = {28, 600000, 2002, 800000};
    uint8_t *buf[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = fx_buf(&f, nb[i]);
        for (uint64_t j = 0; j < nb[i]; j++) buf[i][j] = (uint8_t)(frand() * 128 + 128);
    }
    uint8_t *s0 = malloc(nb[2]), *o_ref = malloc(nb[3]), *s_ref = malloc(nb[2]);
    assert_true(s0 && o_ref && s_ref);
    memcpy(s0, buf[2], nb[2]);
    /* output 0 from the original inputs; output 1 (= input 2) in place */
    for (uint64_t j = 0; j < nb[3]; j++)
        o_ref[j] = (uint8_t)(1 * buf[0][j % nb[0]] + 2 * buf[1][j % nb[1]] + 3 * s0[j % nb[2]] + 31 * j);
    for (uint64_t j = 0; j < nb[2]; j++)
        s_ref[j] = (uint8_t)(1 * buf[0][j % nb[0]] + 2 * buf[1][j % nb[1]] + 3 * s0[j] + 31 * j + 17);
    void *ip[3] = {buf[0], buf[1], buf[2]}, *op[2] = {buf[3], buf[2]};
    assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
    assert_memory_equal(buf[3], o_ref, nb[3]);
    assert_memory_equal(buf[2], s_ref, nb[2]);
    /* depends on every input: changing one byte of the short input changes outputs */
    buf[0][5] ^= 1;
    memcpy(buf[2], s0, nb[2]);
    assert_int_equal(fx_run(&f, id, ip, op), TIDE_OK);
    assert_true(buf[3][5] != o_ref[5] && buf[3][5 + 28] != o_ref[5 + 28]);
    free(s0);
    free(o_ref);
    free(s_ref);
    fx_close(&f);
}

/* ------------------------------------------------------------- determinism */

/* Matmul (both paths: sgemm blocks and fused), rmsnorm and rope twice on the
 * same input: identical bits. */
static void test_deterministic(void **state) {
    (void)state;
    const int R = 33, K = 300, N = 257;
    fx f;
    fx_open(&f);
    int x = fx_tensor(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, K, 0);
    int x2 = fx_tensor(&f, "x2", TIDE_F32, TIDE_ROLE_INPUT, 2, 2, K, 0);
    int w = fx_tensor(&f, "w", TIDE_BF16, TIDE_ROLE_WEIGHT, 2, N, K, 0);
    int nw = fx_tensor(&f, "nw", TIDE_F16, TIDE_ROLE_WEIGHT, 1, K, 0, 0);
    int pos = fx_tensor(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, R, 0, 0);
    int m = fx_tensor(&f, "m", TIDE_F32, TIDE_ROLE_TEMP, 2, R, N, 0);
    int m2 = fx_tensor(&f, "m2", TIDE_F32, TIDE_ROLE_TEMP, 2, 2, N, 0);
    int n = fx_tensor(&f, "n", TIDE_F32, TIDE_ROLE_TEMP, 2, R, K, 0);
    int in[2] = {x, w}, in2[2] = {x2, w}, in3[2] = {x, nw}, in4[2] = {x, pos};
    int ops[4];
    ops[0] = fx_op(&f, TIDE_OP_MATMUL, 2, in, 1, &m, NULL);   /* sgemm blocks */
    ops[1] = fx_op(&f, TIDE_OP_MATMUL, 2, in2, 1, &m2, NULL); /* fused */
    tide_op_args p = {.eps = 1e-6f, .n_heads = 3, .head_dim = 100, .rope_theta = 500000.0f, .batch = 1};
    ops[2] = fx_op(&f, TIDE_OP_RMSNORM, 2, in3, 1, &n, &p);
    ops[3] = fx_op(&f, TIDE_OP_ROPE, 2, in4, 1, &n, &p);
    float *xb = fx_buf(&f, R * K * 4);
    uint16_t *wb = fx_buf(&f, N * K * 2), *nwb = fx_buf(&f, K * 2);
    int32_t *pb = fx_buf(&f, R * 4);
    fill(xb, R * K, 1);
    for (int i = 0; i < N * K; i++) wb[i] = tide_f32_to_bf16(frand());
    for (int i = 0; i < K; i++) nwb[i] = tide_f32_to_f16(frand());
    for (int i = 0; i < R; i++) pb[i] = 1000 + 7 * i;
    void *ins[4][2] = {{xb, wb}, {xb, wb}, {xb, nwb}, {xb, pb}};
    for (int i = 0; i < 4; i++) {
        const tide_op *op = &f.g->ops[ops[i]];
        size_t nb = tide_graph_tensor_bytes(f.g, op->out[0]);
        float *a = fx_buf(&f, nb), *b = fx_buf(&f, nb);
        void *o1[1] = {a}, *o2[1] = {b};
        assert_int_equal(fx_run(&f, ops[i], ins[i], o1), TIDE_OK);
        assert_int_equal(fx_run(&f, ops[i], ins[i], o2), TIDE_OK);
        assert_memory_equal(a, b, nb);
    }
    fx_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_convert_all),
        cmocka_unit_test(test_backend_basics),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_matmul_small),
        cmocka_unit_test(test_matmul_blocks),
        cmocka_unit_test(test_matmul_tiny_scratch),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_softmax_accuracy),
        cmocka_unit_test(test_attention_bad_pos),
        cmocka_unit_test(test_attention_head_dim_limit),
        cmocka_unit_test(test_attention_deterministic),
        cmocka_unit_test(test_attention_cache_types),
        cmocka_unit_test(test_attention_paths),
        cmocka_unit_test(test_silu_mul_add),
        cmocka_unit_test(test_silu_mul_paths),
        cmocka_unit_test(test_take_last),
        cmocka_unit_test(test_tiled_forms),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_generic),
        cmocka_unit_test(test_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
