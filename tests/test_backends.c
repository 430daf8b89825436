/*
 * test_backends.c - every op on every backend, compared with the CPU backend.
 *
 * The backends under test are a fresh CPU backend (always) and the CUDA
 * backend (when tide_backend_new(TIDE_BACKEND_CUDA) succeeds), both with F32
 * matmuls. Each op is built as a one-op graph through the public API (so its
 * shapes pass graph validation), all its tensors, outputs included, filled
 * from a seeded generator, copied to buffers from the backend's own
 * alloc/to_device and run through the vtable, and every tensor is read back
 * with to_host. The reference is a separate CPU backend on its portable
 * kernels. Every backend runs each case twice and must give the same bits
 * both times (determinism), then match the reference:
 *
 *   - EMBED, ADD, TAKE_LAST, ARGMAX, GENERIC, the KV caches written by
 *     ATTENTION: exact (bits). These are copies, one rounding, or integer
 *     arithmetic; anything else is a bug.
 *   - RMSNORM, SILU_MUL: 1e-6 relative + 1e-7 absolute. The CUDA kernels
 *     round the same operations the CPU rounds (sum of squares in double;
 *     expf evaluated in double and rounded once); a last-bit difference of
 *     1/sqrtf or expf is all that may remain.
 *   - ROPE: (1e-6 + 2.4e-7 * pos) * max|x|. cos/sin are as exact as the
 *     CPU's, but inv_freq = 1/powf(theta, 2i/hd) may round differently in
 *     its last bit (glibc's powf is within 0.82 ulp, not correctly rounded),
 *     and the angle pos * inv_freq carries that 1 ulp times pos.
 *   - MATMUL: 2e-5 * sum_k |x_k w_k| per output: both sides sum K products
 *     in f32 in different orders (cuBLAS tiles, warp trees, BLAS/AVX
 *     blocking); weights are converted exactly, activations never rounded.
 *     In CUDA's fast mode (activations rounded to the 16-bit weights' dtype,
 *     tensor cores) each product may be off by u |x_k w_k| more, so the bound
 *     is (u + 2e-5) * sum_k |x_k w_k|, u = 2^-8 for bf16 and 2^-11 for f16.
 *   - ATTENTION output: 1e-5 absolute (outputs are averages of values in
 *     [-1, 1]): f32 scores in different orders, expf within 2 ulp. The same
 *     for every KV cache type (f32, f16, bf16, q8_0): the caches are written
 *     bit for bit as tide_quantize_row rounds (exact), and both sides then
 *     compute in f32 over the same converted keys and values.
 *   Each failure names the backend, op, case, element, got, want and bound;
 *   the worst error/bound ratio of every case is printed.
 *
 * The tiled forms (tide.h) run the same way, with the untiled op's bounds:
 * EMBED of a block of the vocabulary from a tokens offset (idx0, vocab0,
 * vocab), as a first chunk that zeroes the rows of other blocks and as a later
 * chunk that fills in its rows in place; MATMUL into a (row0, col0) block of
 * a larger output; TAKE_LAST into row row0 of a larger output; ROPE and
 * ATTENTION (reading its caches) from pos[idx0] on. What a tile must leave
 * alone starts as random data and must keep its bits, and tokens and
 * positions outside the tile are values that would give other results (or
 * range errors) if read. As the reference shares the CPU backend's code, it
 * is itself held, with the same bounds, to an expectation worked out without
 * the tiled parameters: the copies by hand, the rest as the untiled op on
 * the tile's slice of the data, put where the tile goes.
 *
 * Block-quantized weights (MATMUL, EMBED; test_matmul_quant,
 * test_embed_quant): on CUDA against the double-precision product of the
 * dequantized weights (tests/quant_ref.h, held bit for bit to
 * tide_dequantize_row), with the row-tile bit contract of
 * docs/cuda_quant.md; on the CPU too (x rounded to 8 bits per block of 32,
 * backend/cpu/matmul_quant.c: its bound adds that rounding; any tiling the same
 * bits); MATMUL's x . w form (a frozen quantized weight's input gradient)
 * on every backend.
 *
 * The training ops (and MATMUL's backward forms, ATTENTION without a cache)
 * run the same way, with the bounds of tests/test_kernels_train.c (their
 * section says which); their id errors (token ids, targets, positions of
 * fresh sequences) as the forward ops' below.
 *
 * Also: the range errors (token id >= vocab, position >= cache) return
 * TIDE_E_RANGE with a message and write nothing; alloc failures are
 * TIDE_E_NOMEM; copies from threads bound to different streams run at once
 * and stay correct; a whole model (synthetic bf16 checkpoint) gives the CPU's
 * logits within 1e-4 of their scale, generates the same tokens twice, and an
 * offloaded run is bit-identical to the resident one on the same backend.
 * Backend selection: AUTO gives CUDA when a GPU answers, else the CPU; asking for
 * CUDA without a GPU is TIDE_E_NO_DEVICE with a message, never a crash.
 * Matmul modes: AUTO is FAST on CUDA, and on the CPU where it multiplies
 * bf16 natively (AVX512_BF16), else F32; the CPU takes both.
 *
 * Without a GPU every case still runs on the CPU backend (a check of the
 * harness and of CPU determinism) and a line says why CUDA was skipped; the
 * ctest entry test_backends_gpu (`test_backends --gpu`) is the one reported
 * skipped (exit 77) there.
 *
 * What it proves: every op on every available backend against the CPU (the
 * CPU's fast mode against its f32 mode within (2^-8 + 2e-5) sum abs(x w), and
 * a whole model in the fast mode offloaded bit-identical to resident), the
 * tiled forms too (checked against independent expectations, with what a tile
 * must keep compared bit for bit); the CUDA fast matmul mode against a bound
 * for bf16/f16-rounded activations; a whole model in each matmul mode,
 * offloaded bit-identical to resident; a three-stream pipeline ordered by
 * events alone, each stream on a queue of its own, on every backend with
 * events and on the asynchronous test backend; concurrent threads each on a
 * queue of their own; the queue limit (CUDA cases skip without a GPU); ROPE
 * and ATTENTION with a position per row (`pos_rows`): each batch row
 * bit-identical to its sequence run alone, on every backend; CROSS_ENTROPY of
 * a row tile (targets from an offset into a longer tensor, which a mutation
 * reading from 0 hits as out of range; the loss and the head's gradient
 * adding into the earlier tiles'; the loss against its value worked in
 * double) on every backend; the loss over a head in three uneven vocabulary
 * blocks (CE_STATS: each block's running statistics from those of the blocks
 * before, the last block's loss fresh and adding; CE_BLOCK: each block's dh,
 * fresh and adding, and dw, fresh and adding) against a double reference of
 * the whole head, and EMBED_BWD into a block of the gradient (exact), with
 * their range errors, on every backend.
 */
#include "tide.h"
#include "async_backend.h"
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "quant_ref.h"

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <ftw.h>
#include <sys/stat.h>

/* ------------------------------------------------------------- backends */

#define MAX_BE 2

typedef struct be_slot {
    tide_ctx *ctx;
    tide_backend *be;
} be_slot;

static be_slot bes[MAX_BE];   /* under test: [0] cpu, [1] cuda when present */
static int n_be;
static be_slot ref;           /* the CPU reference */
static be_slot queued;        /* the asynchronous test backend (tests/async_backend.h) */
static bool have_cuda;
static tide_status cuda_status;
static char cuda_why[1024];
static char model_dir[256], spill_dir[256];

/* ------------------------------------------------------------- random data */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

/* Uniform in [-1, 1). */
static float frand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static int irand(int n) { return (int)(rnd() % (uint64_t)n); }

/* ------------------------------------------------------------- one-op cases */

#define MAX_T 16

typedef struct tcase {
    const char *what; /* printed with results */
    tide_ctx *ctx;
    tide_graph *g;
    int op;
    void *host[MAX_T];   /* every tensor's content before the op */
    void *expect[MAX_T]; /* an output's content as the op must leave it, worked
                            out without the backends (NULL: not given) */
} tcase;

static void tc_open(tcase *c, const char *what) {
    memset(c, 0, sizeof *c);
    c->what = what;
    c->ctx = tide_ctx_new();
    assert_non_null(c->ctx);
    c->g = tide_graph_new(c->ctx);
    assert_non_null(c->g);
    c->op = -1;
}

static void tc_close(tcase *c) {
    for (int t = 0; t < MAX_T; t++) {
        free(c->host[t]);
        free(c->expect[t]);
    }
    tide_graph_free(c->g);
    tide_ctx_free(c->ctx);
}

/* Adds a tensor (1 to 3 dims: trailing zero dims are absent) whose content is
 * amp * uniform[-1, 1) stored in dt (i32: zeros, for the caller to fill). */
static int tc_tensor(tcase *c, const char *name, tide_dtype dt, tide_role role, int64_t d0, int64_t d1,
                     int64_t d2, float amp) {
    int64_t shape[3] = {d0, d1, d2};
    int ndim = d2 ? 3 : d1 ? 2 : 1;
    int id = -1;
    tide_status st = tide_graph_add_tensor(c->g, name, dt, role, ndim, shape, &id);
    if (st) fail_msg("add_tensor %s: %s", name, tide_ctx_last_error(c->ctx));
    assert_true(id < MAX_T);
    size_t nb = (size_t)tide_graph_tensor_bytes(c->g, id);
    void *h = malloc(nb ? nb : 1);
    assert_non_null(h);
    c->host[id] = h;
    if (tide_dtype_is_quantized(dt)) { /* rows of the last dimension, quantized */
        int64_t cols = shape[ndim - 1], rows = (int64_t)(nb / tide_dtype_bytes(dt, (uint64_t)cols));
        float *x = malloc((size_t)cols * sizeof(float));
        assert_non_null(x);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < cols; i++) x[i] = amp * frand();
            assert_int_equal(tide_quantize_row(dt, x, (uint8_t *)h + r * tide_dtype_bytes(dt, (uint64_t)cols), cols), 0);
        }
        free(x);
        return id;
    }
    size_t n = nb / tide_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        float f = amp * frand();
        switch (dt) {
        case TIDE_F32: ((float *)h)[i] = f; break;
        case TIDE_F16: ((uint16_t *)h)[i] = tide_f32_to_f16(f); break;
        case TIDE_BF16: ((uint16_t *)h)[i] = tide_f32_to_bf16(f); break;
        default: ((int32_t *)h)[i] = 0; break;
        }
    }
    return id;
}

static void tc_op(tcase *c, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
                  const tide_op_args *p) {
    tide_status st = tide_graph_add_op_args(c->g, kind, n_in, in, n_out, out, p, -1, &c->op);
    if (st) fail_msg("add_op %s: %s", tide_op_name(kind), tide_ctx_last_error(c->ctx));
}

/* Runs the case's op on be, on queue q (NULL: the default one), starting
 * from the host contents; res[t] gets (malloc'd) every tensor's content
 * afterwards. Returns compute's status (on an asynchronous queue, queue_sync's).
 * Every tensor goes to the device, outputs too: an op that writes its output
 * only in part (the tiled forms, the caches of ATTENTION) finds the host's
 * content there, so what it must keep is compared like what it writes. */
static tide_status tc_run_on(const tcase *c, tide_backend *be, void *q, void **res) {
    const tide_graph *g = c->g;
    tk_force_generic(be == ref.be); /* the reference: the CPU's portable kernels */
    const tide_op *op = &g->ops[c->op];
    int nt = tide_graph_n_tensors(g);
    void *dev[MAX_T] = {0}, *scratch = NULL;
    for (int t = 0; t < nt; t++) {
        size_t nb = (size_t)tide_graph_tensor_bytes(g, t);
        assert_int_equal(be->vt->alloc(be, nb, &dev[t]), TIDE_OK);
        assert_int_equal(be->vt->to_device(be, q, dev[t], c->host[t], nb), TIDE_OK);
    }
    if (op->scratch_bytes) assert_int_equal(be->vt->alloc(be, op->scratch_bytes, &scratch), TIDE_OK);
    void *in[TIDE_OP_MAX_IN], *out[TIDE_OP_MAX_OUT];
    for (int i = 0; i < op->n_in; i++) in[i] = dev[op->in[i]];
    for (int i = 0; i < op->n_out; i++) out[i] = dev[op->out[i]];
    tide_status st = be->vt->compute(be, q, g, op, in, out, scratch);
    if (be->vt->synchronize) {
        /* on an asynchronous queue an op's error comes from queue_sync */
        tide_status ss = q ? tide_backend_queue_sync(be, q) : be->vt->synchronize(be);
        if (!st) st = ss;
        else assert_int_equal(ss, TIDE_OK);
    }
    for (int t = 0; t < nt; t++) {
        size_t nb = (size_t)tide_graph_tensor_bytes(g, t);
        res[t] = malloc(nb ? nb : 1);
        assert_non_null(res[t]);
        assert_int_equal(be->vt->to_host(be, q, res[t], dev[t], nb), TIDE_OK);
        be->vt->dealloc(be, dev[t]);
    }
    if (scratch) be->vt->dealloc(be, scratch);
    return st;
}

static tide_status tc_run(const tcase *c, tide_backend *be, void **res) { return tc_run_on(c, be, NULL, res); }

static void res_free(void **res, int n) {
    for (int t = 0; t < n; t++) free(res[t]);
}

/* Sets tensor t of c to the bytes of tensor s of src from byte `off` on (the
 * untiled twin of a tiled case takes its slice of the tiled case's data). */
static void tc_copy_host(tcase *c, int t, const tcase *src, int s, size_t off) {
    size_t nb = (size_t)tide_graph_tensor_bytes(c->g, t);
    assert_true(off + nb <= (size_t)tide_graph_tensor_bytes(src->g, s));
    memcpy(c->host[t], (const uint8_t *)src->host[s] + off, nb);
}

/* Runs c's op on the reference; returns (malloc'd) tensor t's content after. */
static void *tc_ref_output(const tcase *c, int t) {
    void *res[MAX_T];
    int nt = tide_graph_n_tensors(c->g);
    if (tc_run(c, ref.be, res))
        fail_msg("reference %s (%s): %s", tide_op_name(c->g->ops[c->op].kind), c->what, tide_ctx_last_error(ref.ctx));
    tk_force_generic(false);
    void *r = res[t];
    res[t] = NULL;
    res_free(res, nt);
    return r;
}

/* Starts the expected content of tensor t as its content before the op (what
 * a tile must keep); the caller writes in what the op must change. */
static void *tc_expect_init(tcase *c, int t) {
    size_t nb = (size_t)tide_graph_tensor_bytes(c->g, t);
    free(c->expect[t]);
    c->expect[t] = malloc(nb ? nb : 1);
    assert_non_null(c->expect[t]);
    memcpy(c->expect[t], c->host[t], nb);
    return c->expect[t];
}

/* The bound for one output: exact bits, or |got - want| <= atol + rtol * s_i
 * where s_i = scale[i] when given, else |want_i|. */
typedef struct tol {
    bool exact;
    double atol, rtol;
    const double *scale;
} tol;

#define EXACT ((tol){.exact = true})

/* Compares output tensor t of got with want; returns the worst error/bound
 * ratio (0 for exact matches), failing the test past 1. */
static double compare(const tcase *c, const char *be_name, int t, const void *got, const void *want, tol tl) {
    const char *tn = tide_graph_tensor_name(c->g, t);
    size_t nb = (size_t)tide_graph_tensor_bytes(c->g, t);
    if (tl.exact) {
        if (memcmp(got, want, nb) != 0) {
            size_t i = 0;
            while (((const uint8_t *)got)[i] == ((const uint8_t *)want)[i]) i++;
            size_t e = i / 4;
            fail_msg("%s %s (%s): '%s' differs at element %zu: got %08x (%g), want %08x (%g)", be_name,
                     tide_op_name(c->g->ops[c->op].kind), c->what, tn, e, ((const uint32_t *)got)[e],
                     ((const float *)got)[e], ((const uint32_t *)want)[e], ((const float *)want)[e]);
        }
        return 0;
    }
    assert_int_equal(tide_graph_tensor_dtype(c->g, t), TIDE_F32);
    const float *g = got, *w = want;
    size_t n = nb / sizeof(float);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double s = tl.scale ? tl.scale[i] : fabs((double)w[i]);
        double bound = tl.atol + tl.rtol * s, err = fabs((double)g[i] - (double)w[i]);
        if (!(err <= bound))
            fail_msg("%s %s (%s): '%s'[%zu] = %.9g, want %.9g (error %.3g > bound %.3g)", be_name,
                     tide_op_name(c->g->ops[c->op].kind), c->what, tn, i, g[i], w[i], err, bound);
        if (bound > 0 && err / bound > worst) worst = err / bound;
    }
    return worst;
}

/* Runs the case on the reference and twice on every backend under test;
 * each run must succeed, both runs of a backend must agree in every bit,
 * and output k must match the reference within tols[k]. Where the case gives
 * an output's expected content, the reference must match that too (within
 * the same tols[k]): the reference is CPU backend code, so a tiled parameter
 * both CPU backends ignored would otherwise pass unseen. */
static void tc_check(const tcase *c, const tol *tols) {
    const tide_op *op = &c->g->ops[c->op];
    int nt = tide_graph_n_tensors(c->g);
    void *want[MAX_T], *r1[MAX_T], *r2[MAX_T];
    tide_status st = tc_run(c, ref.be, want);
    if (st) fail_msg("reference %s (%s): %s", tide_op_name(op->kind), c->what, tide_ctx_last_error(ref.ctx));
    for (int k = 0; k < op->n_out; k++) {
        int t = op->out[k];
        if (c->expect[t]) compare(c, "reference", t, want[t], c->expect[t], tols[k]);
    }
    for (int b = 0; b < n_be; b++) {
        const char *bn = tide_backend_name(bes[b].be);
        st = tc_run(c, bes[b].be, r1);
        if (st) fail_msg("%s %s (%s): %s", bn, tide_op_name(op->kind), c->what, tide_ctx_last_error(bes[b].ctx));
        assert_int_equal(tc_run(c, bes[b].be, r2), TIDE_OK);
        double worst = 0;
        for (int k = 0; k < op->n_out; k++) {
            int t = op->out[k];
            if (memcmp(r1[t], r2[t], (size_t)tide_graph_tensor_bytes(c->g, t)) != 0)
                fail_msg("%s %s (%s): two runs differ in '%s'", bn, tide_op_name(op->kind), c->what,
                         tide_graph_tensor_name(c->g, t));
            double w = compare(c, bn, t, r1[t], want[t], tols[k]);
            worst = w > worst ? w : worst;
        }
        print_message("  %-4s %-9s %-40s worst error/bound %.3g\n", bn, tide_op_name(op->kind), c->what, worst);
        res_free(r1, nt);
        res_free(r2, nt);
    }
    res_free(want, nt);
}

/* Runs the case on every backend expecting TIDE_E_RANGE with a message
 * holding `needle`, and every tensor unchanged. */
static void tc_expect_range(const tcase *c, const char *needle) {
    int nt = tide_graph_n_tensors(c->g);
    be_slot all[MAX_BE + 1];
    memcpy(all, bes, sizeof(be_slot) * (size_t)n_be);
    all[n_be] = ref;
    for (int b = 0; b <= n_be; b++) {
        void *res[MAX_T];
        tide_status st = tc_run(c, all[b].be, res);
        const char *msg = tide_ctx_last_error(all[b].ctx);
        if (st != TIDE_E_RANGE)
            fail_msg("%s (%s): status %s, want a range error (%s)", tide_backend_name(all[b].be), c->what,
                     tide_status_str(st), msg);
        if (!strstr(msg, needle))
            fail_msg("%s (%s): message '%s' lacks '%s'", tide_backend_name(all[b].be), c->what, msg, needle);
        for (int t = 0; t < nt; t++)
            if (memcmp(res[t], c->host[t], (size_t)tide_graph_tensor_bytes(c->g, t)) != 0)
                fail_msg("%s (%s): '%s' was written by a failing op", tide_backend_name(all[b].be), c->what,
                         tide_graph_tensor_name(c->g, t));
        res_free(res, nt);
    }
    tk_force_generic(false);
    /* issued asynchronously, on every backend with events: nothing waits for
     * the op, so its error comes from queue_sync, with the same message, on
     * the queue's context (what it wrote is not checked: queued work may run
     * on), and once */
    be_slot async_bes[MAX_BE + 1];
    int n_async = 0;
    for (int b = 0; b < n_be; b++)
        if (bes[b].be->vt->event_new) async_bes[n_async++] = bes[b];
    async_bes[n_async++] = queued;
    for (int b = 0; b < n_async; b++) {
        tide_backend *be = async_bes[b].be;
        void *res[MAX_T], *q = NULL;
        tide_ctx *qctx = tide_ctx_new();
        assert_non_null(qctx);
        assert_int_equal(be->vt->queue_new(be, qctx, true, &q), TIDE_OK);
        tide_status st = tc_run_on(c, be, q, res);
        const char *msg = tide_ctx_last_error(qctx);
        if (st != TIDE_E_RANGE || !strstr(msg, needle))
            fail_msg("%s, queued (%s): status %s, message '%s'; want a range error naming '%s'",
                     tide_backend_name(be), c->what, tide_status_str(st), msg, needle);
        assert_int_equal(be->vt->queue_sync(be, q), TIDE_OK);
        assert_int_equal(be->vt->synchronize(be), TIDE_OK);
        be->vt->queue_free(be, q);
        tide_ctx_free(qctx);
        res_free(res, nt);
    }
}

static const tide_dtype wdts[3] = {TIDE_F32, TIDE_F16, TIDE_BF16};

/* ------------------------------------------------------------- ops */

static void test_embed(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{50, 33}, {1000, 256}}; /* V, D */
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 2; s++) {
            int64_t V = shapes[s][0], D = shapes[s][1], B = 2, T = 5;
            char what[96];
            snprintf(what, sizeof what, "%s V=%lld D=%lld", tide_dtype_name(wdts[d]), (long long)V, (long long)D);
            tcase c;
            tc_open(&c, what);
            int tab = tc_tensor(&c, "table", wdts[d], TIDE_ROLE_WEIGHT, V, D, 0, 1);
            int tok = tc_tensor(&c, "tokens", TIDE_I32, TIDE_ROLE_INPUT, B, T, 0, 0);
            int out = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_TEMP, B * T, D, 0, 1);
            int32_t *ids = c.host[tok];
            for (int i = 0; i < B * T; i++) ids[i] = irand((int)V);
            ids[0] = 0;
            ids[1] = (int32_t)V - 1;
            int in[2] = {tab, tok};
            tc_op(&c, TIDE_OP_EMBED, 2, in, 1, &out, NULL);
            tc_check(&c, (tol[]){EXACT});
            /* an id past the vocabulary, then a negative one: nothing written */
            ids[7] = (int32_t)V;
            char needle[64];
            snprintf(needle, sizeof needle, "token id %lld", (long long)V);
            tc_expect_range(&c, needle);
            ids[7] = 1;
            ids[3] = -5;
            tc_expect_range(&c, "token id -5");
            tc_close(&c);
        }
}

static void test_rmsnorm(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{7, 64}, {3, 1000}, {2, 4097}};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 3; s++) {
            int64_t R = shapes[s][0], D = shapes[s][1];
            char what[96];
            snprintf(what, sizeof what, "%s R=%lld D=%lld", tide_dtype_name(wdts[d]), (long long)R, (long long)D);
            tcase c;
            tc_open(&c, what);
            int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 2);
            int w = tc_tensor(&c, "w", wdts[d], TIDE_ROLE_WEIGHT, D, 0, 0, 1);
            int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
            int in[2] = {x, w};
            tc_op(&c, TIDE_OP_RMSNORM, 2, in, 1, &o, &(tide_op_args){.eps = 1e-5f});
            tc_check(&c, (tol[]){{.atol = 1e-7, .rtol = 1e-6}});
            tc_close(&c);
        }
}

/* One MATMUL case: x (R, K) . w (N, K)^T. Untiled when Ro is 0; tiled, the
 * result is the block at (row0, col0) of a pre-filled (Ro, No) output that is
 * also the op's last input, and every element outside the block must keep its
 * pre-filled bits. no_scratch removes the op's scratch (both backends then
 * take their fused, scratch-free path); scratch > 0 shrinks it to that many
 * bytes (weights converted in more blocks; in CUDA's fast mode, activations
 * rounded and multiplied in chunks of rows). rtol 0 means 2e-5 (see the
 * top). */
typedef struct mm_case {
    tide_dtype dt;
    int64_t R, K, N;
    bool no_scratch;
    uint64_t scratch;
    int64_t Ro, No, row0, col0;
    double rtol;
    const char *mode; /* printed before the case ("fast"), or NULL */
} mm_case;

static void matmul_case(const mm_case *m) {
    int64_t R = m->R, K = m->K, N = m->N, Ro = m->Ro ? m->Ro : R, No = m->Ro ? m->No : N;
    char what[96], tile[48] = "";
    if (m->Ro) snprintf(tile, sizeof tile, " at (%lld,%lld) of (%lld,%lld)", (long long)m->row0,
                        (long long)m->col0, (long long)Ro, (long long)No);
    char scr[40] = "";
    if (m->scratch) snprintf(scr, sizeof scr, " scratch %llu", (unsigned long long)m->scratch);
    snprintf(what, sizeof what, "%s%s%s R=%lld K=%lld N=%lld%s%s%s", m->mode ? m->mode : "", m->mode ? " " : "",
             tide_dtype_name(m->dt), (long long)R, (long long)K, (long long)N, tile,
             m->no_scratch ? " no scratch" : "", scr);
    tcase c;
    tc_open(&c, what);
    int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, K, 0, 1);
    int w = tc_tensor(&c, "w", m->dt, TIDE_ROLE_WEIGHT, N, K, 0, 1);
    int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, Ro, No, 0, 1);
    int in[3] = {x, w, o};
    tc_op(&c, TIDE_OP_MATMUL, m->Ro ? 3 : 2, in, 1, &o, &(tide_op_args){.row0 = m->row0, .col0 = m->col0});
    if (m->no_scratch) c.g->ops[c.op].scratch_bytes = 0;
    if (m->scratch) {
        assert_true(m->scratch <= c.g->ops[c.op].scratch_bytes);
        c.g->ops[c.op].scratch_bytes = m->scratch;
    }
    /* scale = sum_k |x_rk| |w_nk| over the weights' exact f32 values in the
     * block, 0 (exact bits) outside it */
    float *wf = malloc((size_t)(N * K) * sizeof(float));
    double *scale = calloc((size_t)(Ro * No), sizeof(double));
    assert_non_null(wf);
    assert_non_null(scale);
    tide_convert_to_f32(c.host[w], m->dt, wf, (size_t)(N * K));
    const float *xf = c.host[x];
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += fabs((double)xf[r * K + k] * (double)wf[n * K + k]);
            scale[(m->row0 + r) * No + m->col0 + n] = s;
        }
    if (m->Ro) {
        /* expected: the untiled product on the reference, put in its place */
        tcase u;
        tc_open(&u, "untiled");
        int ux = tc_tensor(&u, "x", TIDE_F32, TIDE_ROLE_INPUT, R, K, 0, 0);
        int uw = tc_tensor(&u, "w", m->dt, TIDE_ROLE_WEIGHT, N, K, 0, 0);
        int uo = tc_tensor(&u, "y", TIDE_F32, TIDE_ROLE_TEMP, R, N, 0, 0);
        tc_copy_host(&u, ux, &c, x, 0);
        tc_copy_host(&u, uw, &c, w, 0);
        tc_op(&u, TIDE_OP_MATMUL, 2, (int[]){ux, uw}, 1, &uo, NULL);
        float *blk = tc_ref_output(&u, uo), *e = tc_expect_init(&c, o);
        for (int64_t r = 0; r < R; r++)
            memcpy(e + (m->row0 + r) * No + m->col0, blk + r * N, (size_t)N * sizeof(float));
        free(blk);
        tc_close(&u);
    }
    tc_check(&c, (tol[]){{.rtol = m->rtol > 0 ? m->rtol : 2e-5, .scale = scale}});
    free(scale);
    free(wf);
    tc_close(&c);
}

static void test_matmul(void **state) {
    (void)state;
    /* decode-sized (fused on the GPU), odd K (scalar loads), blocked sgemm */
    static const int64_t shapes[][3] = {{1, 64, 48}, {3, 1000, 300}, {5, 37, 19}, {16, 256, 200}, {40, 1000, 129}};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 5; s++)
            matmul_case(&(mm_case){.dt = wdts[d], .R = shapes[s][0], .K = shapes[s][1], .N = shapes[s][2]});
    /* a weight over the 16 MiB scratch: converted in two blocks */
    matmul_case(&(mm_case){.dt = TIDE_BF16, .R = 17, .K = 4096, .N = 1100});
    matmul_case(&(mm_case){.dt = TIDE_F16, .R = 20, .K = 96, .N = 70, .no_scratch = true});
    matmul_case(&(mm_case){.dt = TIDE_BF16, .R = 20, .K = 96, .N = 70, .no_scratch = true});
    /* scratch for 9 weight rows: 8 blocks of rows of w (9 x 7, 7) */
    matmul_case(&(mm_case){.dt = TIDE_BF16, .R = 20, .K = 96, .N = 70, .scratch = 9 * 96 * 4});
}

/* The fast matmul mode of the backends that have one (CUDA; the CPU for bf16
 * weights where it has AVX512_BF16): activations are rounded to the weights'
 * 16-bit dtype, so each product x_k w_k is off by at most u |x_k w_k| (u =
 * 2^-8 for bf16, 2^-11 for f16: round to nearest, with a factor 2 to
 * spare), and the bound is (u + 2e-5) * sum_k |x_k w_k|. The setup switches
 * the modes, the teardown puts F32 back (a failing case leaves through the
 * teardown too). Where the CPU multiplies in f32 anyway (f16 weights, no
 * AVX512_BF16) its cases hold to the same bound trivially; with no backend
 * whose fast mode differs from f32 they are skipped, as they would test
 * nothing new. */
static void matmul_ex_case(tide_dtype dt, int64_t R, int64_t K, int64_t N, bool kn, bool acc, uint64_t scratch,
                           double rtol, const char *mode);

static int n_fast;

static int fast_on(void **state) {
    (void)state;
    n_fast = 0;
    for (int b = 0; b < n_be; b++) {
        if (tide_backend_set_matmul(bes[b].be, TIDE_MATMUL_FAST)) return -1;
        if (bes[b].be->kind == TIDE_BACKEND_CUDA || tk_matmul_fast_native(TIDE_BF16)) n_fast++;
    }
    return 0;
}

static int fast_off(void **state) {
    (void)state;
    for (int b = 0; b < n_be; b++)
        if (tide_backend_set_matmul(bes[b].be, TIDE_MATMUL_F32)) return -1;
    return 0;
}

static void test_matmul_fast(void **state) {
    (void)state;
    if (!n_fast) {
        print_message("  no backend under test has a fast matmul mode\n");
        skip(); /* reported as skipped by cmocka, not passed */
    }
    static const int64_t shapes[][3] = {{3, 1000, 300}, {20, 300, 70}, {40, 1000, 129}, {17, 4096, 1100}};
    for (int d = 1; d < 3; d++) {
        double rtol = (wdts[d] == TIDE_BF16 ? 0x1p-8 : 0x1p-11) + 2e-5;
        for (int s = 0; s < 4; s++)
            matmul_case(&(mm_case){.dt = wdts[d], .R = shapes[s][0], .K = shapes[s][1], .N = shapes[s][2],
                                   .rtol = rtol, .mode = "fast"});
        matmul_case(&(mm_case){.dt = wdts[d], .R = 20, .K = 300, .N = 70, .Ro = 45, .No = 200, .row0 = 25,
                               .col0 = 130, .rtol = rtol, .mode = "fast"});
        /* scratch for 7 rows: 6 chunks of rows (7, 7, 7, 7, 7, 5), into a block of a wider output */
        matmul_case(&(mm_case){.dt = wdts[d], .R = 40, .K = 300, .N = 70, .scratch = 7 * 300 * 2, .rtol = rtol,
                               .mode = "fast"});
        matmul_case(&(mm_case){.dt = wdts[d], .R = 40, .K = 300, .N = 70, .Ro = 50, .No = 90, .row0 = 3,
                               .col0 = 11, .scratch = 7 * 300 * 2, .rtol = rtol, .mode = "fast"});
        /* the backward forms (x . w, +=) on the 16-bit weights as they are */
        for (int form = 0; form < 3; form++)
            matmul_ex_case(wdts[d], 40, 300, 70, form != 1, form != 0, 0, rtol, "fast");
    }
}

static void test_rope(void **state) {
    (void)state;
    static const struct { int B, T, H, hd; float theta; int pos0; } cs[] = {
        {2, 5, 4, 16, 10000.0f, 0}, {1, 1, 8, 64, 10000.0f, 37}, {2, 3, 2, 128, 500000.0f, 1000},
        {1, 4, 3, 6, 10000.0f, 2},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int B = cs[i].B, T = cs[i].T, H = cs[i].H, hd = cs[i].hd;
        int64_t R = (int64_t)B * T, D = (int64_t)H * hd;
        char what[96];
        snprintf(what, sizeof what, "B=%d T=%d H=%d hd=%d pos0=%d", B, T, H, hd, cs[i].pos0);
        tcase c;
        tc_open(&c, what);
        int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1);
        int pos = tc_tensor(&c, "pos", TIDE_I32, TIDE_ROLE_INPUT, T, 0, 0, 0);
        int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
        for (int t = 0; t < T; t++) ((int32_t *)c.host[pos])[t] = cs[i].pos0 + t;
        int in[2] = {x, pos};
        tc_op(&c, TIDE_OP_ROPE, 2, in, 1, &o,
              &(tide_op_args){.n_heads = H, .head_dim = hd, .rope_theta = cs[i].theta, .batch = B});
        double *scale = malloc((size_t)(R * D) * sizeof(double));
        assert_non_null(scale);
        for (int64_t r = 0; r < R; r++)
            for (int64_t e = 0; e < D; e++) scale[r * D + e] = 1.0 + 0.24 * (cs[i].pos0 + r % T); /* max|x| = 1 */
        tc_check(&c, (tol[]){{.rtol = 1e-6, .scale = scale}});
        free(scale);
        tc_close(&c);
    }
}

typedef struct attn_cfg {
    int B, T, C, H, KV, hd;
    int pos[4]; /* positions, or {-1, p0}: p0, p0+1, ... */
} attn_cfg;

static void test_attention(void **state) {
    (void)state;
    static const attn_cfg cs[] = {
        {2, 4, 16, 4, 2, 16, {-1, 0}},     /* prefill from 0, GQA 2:1 */
        {1, 1, 300, 8, 2, 64, {-1, 257}},  /* decode over three key tiles */
        {2, 3, 200, 4, 4, 128, {-1, 130}}, /* batch 2, no grouping, later chunk */
        {1, 2, 40, 2, 1, 256, {-1, 20}},   /* head_dim 256, one kv head */
        {2, 4, 10, 6, 3, 80, {-1, 0}},     /* head_dim not a power of two */
        {1, 3, 8, 2, 1, 32, {3, 3, 5}},    /* a repeated position: the last row stays */
        {1, 2, 20, 2, 2, 512, {-1, 5}},    /* the largest head_dim */
    };
    /* every KV cache type: the caches written bit for bit as the reference
     * rounds them (tide_quantize_row), the output within the f32 bound (both
     * sides compute over the same converted keys and values) */
    static const attn_cfg cq[] = {
        {2, 4, 16, 4, 2, 16, {-1, 0}},    /* batch 2 (not q8_0: head_dim 16) */
        {1, 1, 300, 8, 2, 64, {-1, 257}}, /* decode over three key tiles */
        {1, 20, 48, 4, 2, 64, {-1, 10}},  /* CUDA's query-tiled kernel (T >= 16) */
        {1, 3, 8, 2, 1, 32, {3, 3, 5}},   /* a repeated position: the last row stays */
    };
    enum { NCS = sizeof cs / sizeof cs[0], NCQ = sizeof cq / sizeof cq[0] };
    static const tide_dtype cdts[] = {TIDE_F16, TIDE_BF16, TIDE_Q8_0};
    for (size_t ci = 0; ci < NCS + 3 * NCQ; ci++) {
        const attn_cfg *a = ci < NCS ? &cs[ci] : &cq[(ci - NCS) % NCQ];
        const tide_dtype cdt = ci < NCS ? TIDE_F32 : cdts[(ci - NCS) / NCQ];
        if (a->hd % tide_dtype_block(cdt)) continue; /* a q8_0 cache needs whole blocks per head */
        int64_t R = (int64_t)a->B * a->T, qd = (int64_t)a->H * a->hd, kd = (int64_t)a->KV * a->hd;
        char what[96];
        snprintf(what, sizeof what, "B=%d T=%d C=%d H=%d KV=%d hd=%d %s", a->B, a->T, a->C, a->H, a->KV, a->hd,
                 tide_dtype_name(cdt));
        tcase c;
        tc_open(&c, what);
        int q = tc_tensor(&c, "q", TIDE_F32, TIDE_ROLE_INPUT, R, qd, 0, 1);
        int k = tc_tensor(&c, "k", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int v = tc_tensor(&c, "v", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int pos = tc_tensor(&c, "pos", TIDE_I32, TIDE_ROLE_INPUT, a->T, 0, 0, 0);
        /* caches hold stale values everywhere: only positions <= pos[t] may be read */
        int kc = tc_tensor(&c, "cache.k", cdt, TIDE_ROLE_STATE, a->B, a->C, kd, 1);
        int vc = tc_tensor(&c, "cache.v", cdt, TIDE_ROLE_STATE, a->B, a->C, kd, 1);
        int o = tc_tensor(&c, "o", TIDE_F32, TIDE_ROLE_TEMP, R, qd, 0, 1);
        int32_t *p = c.host[pos];
        for (int t = 0; t < a->T; t++) p[t] = a->pos[0] < 0 ? a->pos[1] + t : a->pos[t];
        int in[6] = {q, k, v, pos, kc, vc}, out[3] = {o, kc, vc};
        tc_op(&c, TIDE_OP_ATTENTION, 6, in, 3, out,
              &(tide_op_args){.n_heads = a->H, .n_kv_heads = a->KV, .head_dim = a->hd, .batch = a->B});
        tc_check(&c, (tol[]){{.atol = 1e-5}, EXACT, EXACT});
        /* a position past the cache: nothing written, caches included */
        int32_t keep = p[a->T - 1];
        p[a->T - 1] = a->C;
        char needle[64];
        snprintf(needle, sizeof needle, "position %d", a->C);
        tc_expect_range(&c, needle);
        p[a->T - 1] = keep;
        tc_close(&c);
    }
}

/* A position per row (pos_rows): each sequence of the batch at its own
 * positions, in rope and in attention (a batch of decode steps), equals
 * that sequence run alone as a batch of one at those positions, bit for bit,
 * on every backend; the batch is also checked against the reference. */
typedef struct prow_cfg {
    int B, T, C, H, KV, hd;
    int pos[6];
} prow_cfg;

/* One op case of cfg a for rows [b0, b0 + nb) (nb = B with pos_rows, else a
 * sequence alone): rope when !attn. Data from the seeded generator, so that
 * the same seed gives every case the same numbers; the sequence's rows are
 * taken from the whole batch's (tc_copy_host). */
static void prow_case(tcase *c, const prow_cfg *a, bool attn, bool rows) {
    int B = rows ? a->B : 1, H = a->H, KV = a->KV, hd = a->hd;
    int64_t R = (int64_t)B * a->T, qd = (int64_t)H * hd, kd = (int64_t)KV * hd;
    tc_open(c, rows ? "pos_rows" : "one sequence");
    int q = tc_tensor(c, "q", TIDE_F32, TIDE_ROLE_INPUT, R, qd, 0, 1);
    int k = tc_tensor(c, "k", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
    int v = tc_tensor(c, "v", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
    int pos = tc_tensor(c, "pos", TIDE_I32, TIDE_ROLE_INPUT, rows ? R : a->T, 0, 0, 0);
    int kc = tc_tensor(c, "cache.k", TIDE_F32, TIDE_ROLE_STATE, B, a->C, kd, 1);
    int vc = tc_tensor(c, "cache.v", TIDE_F32, TIDE_ROLE_STATE, B, a->C, kd, 1);
    int o = tc_tensor(c, "o", TIDE_F32, TIDE_ROLE_TEMP, R, qd, 0, 1);
    if (!attn) {
        tc_op(c, TIDE_OP_ROPE, 2, (int[]){q, pos}, 1, &o,
              &(tide_op_args){.n_heads = H, .head_dim = hd, .rope_theta = 10000.0f, .batch = B, .pos_rows = rows});
        return;
    }
    tc_op(c, TIDE_OP_ATTENTION, 6, (int[]){q, k, v, pos, kc, vc}, 3, (int[]){o, kc, vc},
          &(tide_op_args){.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .batch = B, .pos_rows = rows});
}

static void test_pos_rows(void **state) {
    (void)state;
    static const prow_cfg cs[] = {
        {3, 1, 40, 4, 2, 32, {5, 0, 33}},        /* three decode steps */
        {2, 2, 300, 8, 2, 64, {3, 4, 257, 258}}, /* two sequences, two steps each */
        {3, 2, 16, 2, 1, 16, {0, 1, 14, 15, 7, 8}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int attn = 0; attn < 2; attn++) {
            const prow_cfg *a = &cs[i];
            tcase c;
            prow_case(&c, a, attn, true);
            int32_t *p = c.host[3];
            for (int r = 0; r < a->B * a->T; r++) p[r] = a->pos[r];
            tc_check(&c, attn ? (tol[]){{.atol = 1e-5}, EXACT, EXACT} : (tol[]){{.rtol = 1e-5, .atol = 1e-6}});
            const tide_op *op = &c.g->ops[c.op];
            for (int bi = 0; bi < n_be; bi++) {
                void *whole[MAX_T];
                assert_int_equal(tc_run(&c, bes[bi].be, whole), TIDE_OK);
                for (int b = 0; b < a->B; b++) {
                    tcase one;
                    prow_case(&one, a, attn, false);
                    for (int t = 0; t < 7; t++) { /* q k v pos kc vc o: row b's part of each */
                        size_t nb = (size_t)tide_graph_tensor_bytes(one.g, t);
                        tc_copy_host(&one, t, &c, t, (size_t)b * nb);
                    }
                    void *alone[MAX_T];
                    assert_int_equal(tc_run(&one, bes[bi].be, alone), TIDE_OK);
                    for (int k = 0; k < op->n_out; k++) {
                        int t = op->out[k];
                        size_t nb = (size_t)tide_graph_tensor_bytes(one.g, t);
                        if (memcmp((uint8_t *)whole[t] + (size_t)b * nb, alone[t], nb))
                            fail_msg("%s %s pos_rows case %zu: row %d of '%s' differs from the sequence alone",
                                     tide_backend_name(bes[bi].be), tide_op_name(op->kind), i, b,
                                     tide_graph_tensor_name(c.g, t));
                    }
                    res_free(alone, tide_graph_n_tensors(one.g));
                    tc_close(&one);
                }
                res_free(whole, tide_graph_n_tensors(c.g));
            }
            tc_close(&c);
        }
}

static void test_elementwise(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{3, 333}, {64, 1563}};
    for (int s = 0; s < 2; s++)
        for (int add = 0; add < 2; add++) {
            int64_t R = shapes[s][0], D = shapes[s][1];
            char what[96];
            snprintf(what, sizeof what, "R=%lld D=%lld", (long long)R, (long long)D);
            tcase c;
            tc_open(&c, what);
            int a = tc_tensor(&c, "a", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 8); /* exp over [-8, 8) */
            int b = tc_tensor(&c, "b", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1);
            int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
            int in[2] = {a, b};
            tc_op(&c, add ? TIDE_OP_ADD : TIDE_OP_SILU_MUL, 2, in, 1, &o, NULL);
            tc_check(&c, add ? (tol[]){EXACT} : (tol[]){{.atol = 1e-7, .rtol = 1e-6}});
            tc_close(&c);
        }
}

static void test_take_last(void **state) {
    (void)state;
    static const int shapes[][3] = {{3, 4, 33}, {2, 1, 64}, {1, 7, 5}}; /* B, T, D */
    for (int s = 0; s < 3; s++) {
        int B = shapes[s][0], T = shapes[s][1], D = shapes[s][2];
        char what[96];
        snprintf(what, sizeof what, "B=%d T=%d D=%d", B, T, D);
        tcase c;
        tc_open(&c, what);
        int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, (int64_t)B * T, D, 0, 1);
        int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, B, D, 0, 1);
        tc_op(&c, TIDE_OP_TAKE_LAST, 1, &x, 1, &o, &(tide_op_args){.batch = B});
        tc_check(&c, (tol[]){EXACT});
        tc_close(&c);
    }
}

static void test_argmax(void **state) {
    (void)state;
    for (int s = 0; s < 2; s++) {
        int R = s ? 2 : 7, V = s ? 1 : 1000;
        char what[96];
        snprintf(what, sizeof what, "R=%d V=%d", R, V);
        tcase c;
        tc_open(&c, what);
        int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, V, 0, 1);
        int o = tc_tensor(&c, "y", TIDE_I32, TIDE_ROLE_TEMP, R, 0, 0, 0);
        float *xf = c.host[x];
        if (V == 1000) {
            xf[1 * V + 10] = xf[1 * V + 700] = 5.0f;          /* tie: the first */
            xf[2 * V + 500] = xf[2 * V + 800] = NAN;          /* NaN: the first NaN */
            xf[2 * V + 3] = 9.0f;
            for (int j = 0; j < V; j++) xf[3 * V + j] = -INFINITY; /* all equal: 0 */
            xf[4 * V + V - 1] = 2.0f;                          /* the last element */
            for (int j = 0; j < V; j++) xf[5 * V + j] = j == 0 ? -0.0f : 0.0f; /* -0 == +0: 0 */
            xf[6 * V + 0] = NAN;                               /* NaN first */
        }
        tc_op(&c, TIDE_OP_ARGMAX, 1, &x, 1, &o, NULL);
        tc_check(&c, (tol[]){EXACT});
        tc_close(&c);
    }
}

static void test_generic(void **state) {
    (void)state;
    tcase c;
    tc_open(&c, "3 inputs, 2 outputs, one in place");
    int a = tc_tensor(&c, "a", TIDE_F32, TIDE_ROLE_INPUT, 10, 7, 0, 1);
    int b = tc_tensor(&c, "b", TIDE_I32, TIDE_ROLE_INPUT, 3, 0, 0, 0);
    int s = tc_tensor(&c, "s", TIDE_F32, TIDE_ROLE_STATE, 5, 5, 0, 1);
    int o = tc_tensor(&c, "o", TIDE_F32, TIDE_ROLE_TEMP, 1000, 3, 0, 1);
    for (int i = 0; i < 3; i++) ((int32_t *)c.host[b])[i] = (int32_t)rnd();
    int in[3] = {a, b, s}, out[2] = {s, o};
    tc_op(&c, TIDE_OP_GENERIC, 3, in, 2, out, &(tide_op_args){.flops = 1e6});
    tc_check(&c, (tol[]){EXACT, EXACT});
    tc_close(&c);
}

/* ------------------------------------------------------------- tiled forms */

/* Each tiled form runs on every backend against the reference, with the
 * untiled op's tolerance, and the reference itself is held to an expected
 * content worked out without the tiled parameters: by hand for the copies
 * (EMBED, TAKE_LAST), else the untiled op on the reference applied to the
 * tile's slice of the data and put where the tile goes. Outputs written in
 * part start as random data, and what a tile must keep is compared too. */

/* EMBED of a block of the vocabulary: the table holds ids [vocab0, end) of V,
 * the op reads R tokens from idx0. The first chunk (2 inputs) zeroes the rows
 * whose id another block holds; a later chunk (its output as a third input)
 * fills in its ids and keeps the other rows. Either form runs on each block.
 * The tokens outside [idx0, idx0 + R) are ids no table has (-1, V): reading
 * one would be a range error. */
static void test_embed_tiled(void **state) {
    (void)state;
    enum { V = 300, B = 2, T = 8, R = 7, IDX0 = 5 };
    static const int64_t blocks[][2] = {{0, 100}, {100, 250}, {250, V}};
    static const int64_t dims[3] = {33, 64, 200};
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 3; k++)
            for (int later = 0; later < 2; later++) {
                bool first = !later;
                int64_t v0 = blocks[k][0], Vb = blocks[k][1] - v0, D = dims[d];
                char what[96];
                snprintf(what, sizeof what, "%s ids [%lld,%lld) of %d D=%lld idx0=%d %s", tide_dtype_name(wdts[d]),
                         (long long)v0, (long long)(v0 + Vb), V, (long long)D, IDX0, first ? "first" : "later");
                tcase c;
                tc_open(&c, what);
                int tab = tc_tensor(&c, "table", wdts[d], TIDE_ROLE_WEIGHT, Vb, D, 0, 1);
                int tok = tc_tensor(&c, "tokens", TIDE_I32, TIDE_ROLE_INPUT, B, T, 0, 0);
                int out = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
                int32_t *ids = c.host[tok];
                static const int32_t tile[R] = {0, 99, 100, 249, 250, V - 1, -1}; /* -1: random */
                for (int i = 0; i < B * T; i++) ids[i] = i % 2 ? -1 : V;
                for (int r = 0; r < R; r++) ids[IDX0 + r] = tile[r] >= 0 ? tile[r] : irand(V);
                int in[3] = {tab, tok, out};
                tc_op(&c, TIDE_OP_EMBED, first ? 2 : 3, in, 1, &out,
                      &(tide_op_args){.idx0 = IDX0, .vocab0 = v0, .vocab = V});
                float *e = tc_expect_init(&c, out);
                size_t es = tide_dtype_size(wdts[d]);
                for (int r = 0; r < R; r++) {
                    int64_t id = ids[IDX0 + r] - v0;
                    if (id >= 0 && id < Vb)
                        tide_convert_to_f32((const uint8_t *)c.host[tab] + (size_t)(id * D) * es, wdts[d], e + r * D,
                                            (size_t)D);
                    else if (first)
                        memset(e + r * D, 0, (size_t)D * sizeof(float));
                }
                tc_check(&c, (tol[]){EXACT});
                /* an id past the whole vocabulary, in the tile: nothing written */
                ids[IDX0 + 2] = V;
                char needle[64];
                snprintf(needle, sizeof needle, "token id %d", V);
                tc_expect_range(&c, needle);
                tc_close(&c);
            }
}

/* The tiled form: a block inside the output, and one that ends at its last
 * row and column, on the fused path (R < 16) and the blocked one. */
static void test_matmul_tiled(void **state) {
    (void)state;
    for (int d = 0; d < 3; d++) {
        matmul_case(&(mm_case){.dt = wdts[d], .R = 3, .K = 64, .N = 48, .Ro = 8, .No = 100, .row0 = 2, .col0 = 30});
        matmul_case(&(mm_case){.dt = wdts[d], .R = 20, .K = 300, .N = 70, .Ro = 45, .No = 200, .row0 = 25,
                               .col0 = 130});
    }
    matmul_case(&(mm_case){.dt = TIDE_BF16, .R = 20, .K = 96, .N = 70, .no_scratch = true, .Ro = 21, .No = 71,
                           .row0 = 1, .col0 = 1});
}

/* Tiles repeat the whole product's bits: x (R, K) . w (N, K)^T run whole,
 * then as row tiles of rt rows times weight blocks of nb rows of w, each a
 * tiled MATMUL writing its block of a zeroed (R, N) output, must give the
 * same output bit for bit, in both matmul modes, on the CPU, and on CUDA for
 * 16-bit weights in the fast mode (its default). This is what an offloaded
 * run that tiles relies on to equal the unconstrained run; K is long and
 * M x N small, where a GEMM library would split K over blocks. CUDA's f32
 * GEMM path (f32 weights, or the f32 mode) picks cuBLAS kernels by the
 * call's rows (seen on an H100: 16- and 7-row tiles of 40 rows differ), so
 * there each element is held to 2e-6 of sum_k |x_k w_k| instead. */
static void *mm_tile_run(tide_backend *be, tide_ctx *bctx, tide_dtype dt, const float *xs, const void *ws,
                         int64_t R, int64_t K, int64_t N, int64_t r0, int64_t rc, int64_t n0, int64_t nc,
                         bool whole) {
    tcase c;
    tc_open(&c, "tile");
    size_t es = tide_dtype_size(dt);
    int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, rc, K, 0, 0);
    int w = tc_tensor(&c, "w", dt, TIDE_ROLE_WEIGHT, nc, K, 0, 0);
    int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, whole ? rc : R, whole ? nc : N, 0, 0);
    memcpy(c.host[x], xs + r0 * K, (size_t)(rc * K) * sizeof(float));
    memcpy(c.host[w], (const uint8_t *)ws + (size_t)(n0 * K) * es, (size_t)(nc * K) * es);
    int in[3] = {x, w, o};
    tc_op(&c, TIDE_OP_MATMUL, whole ? 2 : 3, in, 1, &o, &(tide_op_args){.row0 = r0, .col0 = n0});
    void *res[MAX_T];
    if (tc_run(&c, be, res))
        fail_msg("%s tiled matmul (%lld rows at %lld, %lld columns at %lld): %s", tide_backend_name(be),
                 (long long)rc, (long long)r0, (long long)nc, (long long)n0, tide_ctx_last_error(bctx));
    tk_force_generic(false);
    void *r = res[o];
    res[o] = NULL;
    res_free(res, tide_graph_n_tensors(c.g));
    tc_close(&c);
    return r;
}

static void test_matmul_tile_bits(void **state) {
    (void)state;
    static const int64_t R = 40, K = 4096, N = 96;
    static const int64_t tiles[][2] = {{16, 32}, {20, 40}, {40, 48}, {16, 96}, {7, 96}};
    float *xs = malloc((size_t)(R * K) * sizeof(float));
    uint16_t *w16 = malloc((size_t)(N * K) * sizeof(uint16_t));
    float *w32 = malloc((size_t)(N * K) * sizeof(float));
    assert_true(xs && w16 && w32);
    for (int64_t i = 0; i < R * K; i++) xs[i] = frand();
    for (int64_t i = 0; i < N * K; i++) w32[i] = 0.05f * frand(), w16[i] = tide_f32_to_bf16(w32[i]);
    float *w16f = malloc((size_t)(N * K) * sizeof(float));
    assert_non_null(w16f);
    tide_convert_to_f32(w16, TIDE_BF16, w16f, (size_t)(N * K));
    int n_bad = 0;
    for (int b = 0; b < n_be; b++) {
        tide_backend *be = bes[b].be;
        for (int mode = 0; mode < 2; mode++) {
            assert_int_equal(tide_backend_set_matmul(be, mode ? TIDE_MATMUL_FAST : TIDE_MATMUL_F32), TIDE_OK);
            for (int d = 0; d < 2; d++) {
                tide_dtype dt = d ? TIDE_BF16 : TIDE_F32;
                const void *ws = d ? (const void *)w16 : (const void *)w32;
                /* the CUDA products that go through cuBLAS's f32 GEMM (f32
                 * weights; 16-bit ones in the f32 mode) are held to a bound,
                 * every other to the bit */
                bool sgemm_path = be->kind == TIDE_BACKEND_CUDA && (!d || !mode);
                const float *w32f = d ? w16f : w32;
                float *full = mm_tile_run(be, bes[b].ctx, dt, xs, ws, R, K, N, 0, R, 0, N, true);
                for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
                    int64_t rt = tiles[t][0], nb = tiles[t][1];
                    float *got = calloc((size_t)(R * N), sizeof(float));
                    assert_non_null(got);
                    for (int64_t r0 = 0; r0 < R; r0 += rt)
                        for (int64_t n0 = 0; n0 < N; n0 += nb) {
                            int64_t rc = TIDE_MIN(rt, R - r0), nc = TIDE_MIN(nb, N - n0);
                            float *o = mm_tile_run(be, bes[b].ctx, dt, xs, ws, R, K, N, r0, rc, n0, nc, false);
                            for (int64_t r = r0; r < r0 + rc; r++)
                                memcpy(got + r * N + n0, o + r * N + n0, (size_t)nc * sizeof(float));
                            free(o);
                        }
                    int64_t diff = 0, first = -1;
                    for (int64_t i = 0; i < R * N; i++)
                        if (memcmp(&got[i], &full[i], sizeof(float)) && !diff++) first = i;
                    if (diff && sgemm_path) {
                        /* cuBLAS's f32 GEMM picks its kernel by the call's rows:
                         * a tile then sums in another order (README, Status) */
                        for (int64_t i = 0; i < R * N; i++) {
                            double sc = 0;
                            for (int64_t k = 0; k < K; k++)
                                sc += fabs((double)xs[(i / N) * K + k] * (double)w32f[(i % N) * K + k]);
                            if (!(fabs((double)got[i] - (double)full[i]) <= 2e-6 * sc))
                                fail_msg("%s f32 GEMM tiles of %lld x %lld: [%lld][%lld] = %.9g, whole %.9g, beyond "
                                         "2e-6 of %.3g", tide_backend_name(be), (long long)rt, (long long)nb,
                                         (long long)(i / N), (long long)(i % N), got[i], full[i], sc);
                        }
                        print_message("  %s %s mode, %s weights: tiles of %lld rows x %lld columns differ in %lld "
                                      "of %lld elements, each within 2e-6 of sum |x w| (cuBLAS f32 GEMM)\n",
                                      tide_backend_name(be), mode ? "fast" : "f32", tide_dtype_name(dt),
                                      (long long)rt, (long long)nb, (long long)diff, (long long)(R * N));
                        diff = 0;
                    }
                    if (diff) {
                        print_message("  %s %s mode, %s weights: tiles of %lld rows x %lld columns differ in %lld "
                                      "of %lld elements, first [%lld][%lld] = %.9g, the whole product %.9g\n",
                                      tide_backend_name(be), mode ? "fast" : "f32", tide_dtype_name(dt),
                                      (long long)rt, (long long)nb, (long long)diff, (long long)(R * N),
                                      (long long)(first / N), (long long)(first % N), got[first], full[first]);
                        n_bad++;
                    }
                    free(got);
                }
                free(full);
            }
            print_message("  %-4s matmul %s mode: %zu tilings of (%lld x %lld x %lld), f32 and bf16 weights\n",
                          tide_backend_name(be), mode ? "fast" : "f32", sizeof tiles / sizeof tiles[0],
                          (long long)R, (long long)K, (long long)N);
        }
        assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK);
    }
    free(xs);
    free(w16);
    free(w32);
    free(w16f);
    if (n_bad) fail_msg("%d tilings differ from the whole product (listed above)", n_bad);
}

/* ROPE of a tile: rows of positions pos[idx0 .. idx0 + T) of a longer pos. */
static void test_rope_tiled(void **state) {
    (void)state;
    static const struct { int B, T, H, hd; float theta; int S, idx0, pos0; } cs[] = {
        {1, 4, 4, 16, 10000.0f, 12, 5, 0}, {2, 3, 2, 128, 500000.0f, 9, 6, 1000}, {1, 1, 8, 64, 10000.0f, 40, 39, 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int B = cs[i].B, T = cs[i].T, H = cs[i].H, hd = cs[i].hd, idx0 = cs[i].idx0;
        int64_t R = (int64_t)B * T, D = (int64_t)H * hd;
        char what[96];
        snprintf(what, sizeof what, "B=%d T=%d H=%d hd=%d pos[%d..] of %d", B, T, H, hd, idx0, cs[i].S);
        tcase c;
        tc_open(&c, what);
        int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1);
        int pos = tc_tensor(&c, "pos", TIDE_I32, TIDE_ROLE_INPUT, cs[i].S, 0, 0, 0);
        int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
        int32_t *p = c.host[pos];
        for (int t = 0; t < cs[i].S; t++) p[t] = cs[i].pos0 + t;
        tide_op_args pr = {.n_heads = H, .head_dim = hd, .rope_theta = cs[i].theta, .batch = B, .idx0 = idx0};
        tc_op(&c, TIDE_OP_ROPE, 2, (int[]){x, pos}, 1, &o, &pr);
        /* expected: the untiled op on the tile's positions */
        tcase u;
        tc_open(&u, "untiled");
        int ux = tc_tensor(&u, "x", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 0);
        int up = tc_tensor(&u, "pos", TIDE_I32, TIDE_ROLE_INPUT, T, 0, 0, 0);
        int uo = tc_tensor(&u, "y", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 0);
        tc_copy_host(&u, ux, &c, x, 0);
        tc_copy_host(&u, up, &c, pos, (size_t)idx0 * sizeof(int32_t));
        pr.idx0 = 0;
        tc_op(&u, TIDE_OP_ROPE, 2, (int[]){ux, up}, 1, &uo, &pr);
        c.expect[o] = tc_ref_output(&u, uo);
        tc_close(&u);
        double *scale = malloc((size_t)(R * D) * sizeof(double));
        assert_non_null(scale);
        for (int64_t r = 0; r < R; r++)
            for (int64_t e = 0; e < D; e++) scale[r * D + e] = 1.0 + 0.24 * p[idx0 + r % T]; /* max|x| = 1 */
        tc_check(&c, (tol[]){{.rtol = 1e-6, .scale = scale}});
        free(scale);
        tc_close(&c);
    }
}

/* ATTENTION of a later tile of a prefill: queries at positions pos[idx0 ..
 * idx0 + T) of a longer pos, reading the caches (6 inputs) where the tiles
 * before it left keys and values (here random), writing its own rows. */
static void test_attention_tiled(void **state) {
    (void)state;
    static const struct { int B, T, C, H, KV, hd, S, idx0; } cs[] = {
        {1, 4, 32, 4, 2, 16, 16, 8},    /* GQA 2:1, a tile in the middle */
        {2, 3, 12, 4, 4, 64, 9, 6},     /* batch 2, the last tile */
        {1, 16, 300, 8, 2, 64, 272, 256}, /* a tile past three key tiles */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int B = cs[i].B, T = cs[i].T, C = cs[i].C, S = cs[i].S, idx0 = cs[i].idx0;
        int64_t R = (int64_t)B * T, qd = (int64_t)cs[i].H * cs[i].hd, kd = (int64_t)cs[i].KV * cs[i].hd;
        char what[96];
        snprintf(what, sizeof what, "B=%d T=%d C=%d H=%d KV=%d hd=%d pos[%d..] of %d", B, T, C, cs[i].H, cs[i].KV,
                 cs[i].hd, idx0, S);
        tcase c;
        tc_open(&c, what);
        int q = tc_tensor(&c, "q", TIDE_F32, TIDE_ROLE_INPUT, R, qd, 0, 1);
        int k = tc_tensor(&c, "k", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int v = tc_tensor(&c, "v", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int pos = tc_tensor(&c, "pos", TIDE_I32, TIDE_ROLE_INPUT, S, 0, 0, 0);
        int kc = tc_tensor(&c, "cache.k", TIDE_F32, TIDE_ROLE_STATE, B, C, kd, 1);
        int vc = tc_tensor(&c, "cache.v", TIDE_F32, TIDE_ROLE_STATE, B, C, kd, 1);
        int o = tc_tensor(&c, "o", TIDE_F32, TIDE_ROLE_TEMP, R, qd, 0, 1);
        int32_t *p = c.host[pos];
        for (int t = 0; t < S; t++) p[t] = t;
        tide_op_args pr = {.n_heads = cs[i].H, .n_kv_heads = cs[i].KV, .head_dim = cs[i].hd, .batch = B,
                             .idx0 = idx0};
        tc_op(&c, TIDE_OP_ATTENTION, 6, (int[]){q, k, v, pos, kc, vc}, 3, (int[]){o, kc, vc}, &pr);
        /* expected: the untiled op on the tile's positions, same caches */
        tcase u;
        tc_open(&u, "untiled");
        int uq = tc_tensor(&u, "q", TIDE_F32, TIDE_ROLE_INPUT, R, qd, 0, 0);
        int uk = tc_tensor(&u, "k", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 0);
        int uv = tc_tensor(&u, "v", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 0);
        int up = tc_tensor(&u, "pos", TIDE_I32, TIDE_ROLE_INPUT, T, 0, 0, 0);
        int ukc = tc_tensor(&u, "cache.k", TIDE_F32, TIDE_ROLE_STATE, B, C, kd, 0);
        int uvc = tc_tensor(&u, "cache.v", TIDE_F32, TIDE_ROLE_STATE, B, C, kd, 0);
        int uo = tc_tensor(&u, "o", TIDE_F32, TIDE_ROLE_TEMP, R, qd, 0, 0);
        tc_copy_host(&u, uq, &c, q, 0);
        tc_copy_host(&u, uk, &c, k, 0);
        tc_copy_host(&u, uv, &c, v, 0);
        tc_copy_host(&u, up, &c, pos, (size_t)idx0 * sizeof(int32_t));
        tc_copy_host(&u, ukc, &c, kc, 0);
        tc_copy_host(&u, uvc, &c, vc, 0);
        pr.idx0 = 0;
        tc_op(&u, TIDE_OP_ATTENTION, 6, (int[]){uq, uk, uv, up, ukc, uvc}, 3, (int[]){uo, ukc, uvc}, &pr);
        void *res[MAX_T];
        if (tc_run(&u, ref.be, res)) fail_msg("reference untiled attention: %s", tide_ctx_last_error(ref.ctx));
        tk_force_generic(false);
        c.expect[o] = res[uo];
        c.expect[kc] = res[ukc];
        c.expect[vc] = res[uvc];
        res[uo] = res[ukc] = res[uvc] = NULL;
        res_free(res, tide_graph_n_tensors(u.g));
        tc_close(&u);
        tc_check(&c, (tol[]){{.atol = 1e-5}, EXACT, EXACT});
        /* a position past the cache in the tile: nothing written */
        p[idx0 + T - 1] = C;
        char needle[64];
        snprintf(needle, sizeof needle, "position %d", C);
        tc_expect_range(&c, needle);
        tc_close(&c);
    }
}

/* TAKE_LAST into rows [row0, row0 + B) of a larger output; its other rows
 * keep their content. */
static void test_take_last_tiled(void **state) {
    (void)state;
    static const int cs[][5] = {{1, 4, 33, 3, 2}, {2, 3, 64, 5, 1}, {3, 1, 5, 3, 0}}; /* B, T, D, rows, row0 */
    for (int s = 0; s < 3; s++) {
        int B = cs[s][0], T = cs[s][1], D = cs[s][2], Ro = cs[s][3], row0 = cs[s][4];
        char what[96];
        snprintf(what, sizeof what, "B=%d T=%d D=%d into rows %d.. of %d", B, T, D, row0, Ro);
        tcase c;
        tc_open(&c, what);
        int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, (int64_t)B * T, D, 0, 1);
        int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, Ro, D, 0, 1);
        tc_op(&c, TIDE_OP_TAKE_LAST, 2, (int[]){x, o}, 1, &o, &(tide_op_args){.batch = B, .row0 = row0});
        float *e = tc_expect_init(&c, o);
        const float *xf = c.host[x];
        for (int b = 0; b < B; b++)
            memcpy(e + (size_t)(row0 + b) * D, xf + ((size_t)b * T + T - 1) * D, (size_t)D * sizeof(float));
        tc_check(&c, (tol[]){EXACT});
        tc_close(&c);
    }
}

/* ------------------------------------------------------------- training ops
 *
 * The training ops (tide.h), each against the reference with the bounds of
 * tests/test_kernels_train.c, scaled by what each result sums:
 *   - MATMUL's no_transpose and accumulate forms, MATMUL_GRADW,
 *     CROSS_ENTROPY's dh and dw: 1e-5 * sum of |terms| (2e-5 for MATMUL's
 *     forms, as the forward's; in CUDA's fast mode (u + 2e-5), as there),
 *     plus |previous| for an accumulating form;
 *   - RMSNORM_BWD, SILU_MUL_BWD: 1e-5 of the scale of the element's terms;
 *     ROPE_BWD: ROPE's bound;
 *   - ATTENTION without a cache: ATTENTION's 1e-5; ATTENTION_BWD: 5e-6 *
 *     max|ref| of each gradient;
 *   - CROSS_ENTROPY's loss: 1e-5 relative; SUMSQ: 1e-6 relative;
 *   - EMBED_BWD (f32 sums in row order) and ADAMW (each operation rounded as
 *     torch's): exact. */

static double *dalloc0(size_t n) {
    double *d = calloc(n ? n : 1, sizeof(double));
    assert_non_null(d);
    return d;
}

static float *widened(const tcase *c, int t) {
    size_t n = (size_t)tide_graph_tensor_bytes(c->g, t) / tide_dtype_size(tide_graph_tensor_dtype(c->g, t));
    float *f = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(f);
    tide_convert_to_f32(c->host[t], tide_graph_tensor_dtype(c->g, t), f, n);
    return f;
}

/* One case of MATMUL's backward forms: x (R, K) . w, w (K, N) when kn else
 * (N, K) transposed, into out (R, N), added to out when acc. scratch as
 * mm_case's (0: ops.c's; (uint64_t)-1: none). */
static void matmul_ex_case(tide_dtype dt, int64_t R, int64_t K, int64_t N, bool kn, bool acc, uint64_t scratch,
                           double rtol, const char *mode) {
    char what[128];
    snprintf(what, sizeof what, "%s%s%s R=%lld K=%lld N=%lld%s%s%s", mode ? mode : "", mode ? " " : "",
             tide_dtype_name(dt), (long long)R, (long long)K, (long long)N, kn ? " no_transpose" : "",
             acc ? " accumulate" : "", scratch == (uint64_t)-1 ? " no scratch" : scratch ? " small scratch" : "");
    tcase c;
    tc_open(&c, what);
    int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, K, 0, 1);
    int w = tc_tensor(&c, "w", dt, TIDE_ROLE_WEIGHT, kn ? K : N, kn ? N : K, 0, 1);
    int o = tc_tensor(&c, "dx", TIDE_F32, TIDE_ROLE_TEMP, R, N, 0, 1);
    tc_op(&c, TIDE_OP_MATMUL, acc ? 3 : 2, (int[]){x, w, o}, 1, &o,
          &(tide_op_args){.no_transpose = kn, .accumulate = acc});
    if (scratch == (uint64_t)-1) c.g->ops[c.op].scratch_bytes = 0;
    else if (scratch) {
        assert_true(scratch <= c.g->ops[c.op].scratch_bytes);
        c.g->ops[c.op].scratch_bytes = scratch;
    }
    float *wf = widened(&c, w);
    const float *xf = c.host[x], *prev = c.host[o];
    double *scale = dalloc0((size_t)(R * N));
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < N; n++) {
            double s = acc ? fabs((double)prev[r * N + n]) : 0;
            for (int64_t k = 0; k < K; k++) s += fabs((double)xf[r * K + k] * wf[kn ? k * N + n : n * K + k]);
            scale[r * N + n] = s;
        }
    tc_check(&c, (tol[]){{.rtol = rtol > 0 ? rtol : 2e-5, .scale = scale}});
    free(scale);
    free(wf);
    tc_close(&c);
}

static void test_matmul_backward(void **state) {
    (void)state;
    /* the fused path's sizes (R < 16), odd ones, cuBLAS on blocks */
    static const int64_t shapes[][3] = {{1, 64, 48}, {5, 37, 19}, {20, 96, 70}, {40, 300, 129}};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 4; s++)
            for (int form = 0; form < 3; form++)
                matmul_ex_case(wdts[d], shapes[s][0], shapes[s][1], shapes[s][2], form != 1, form != 0, 0, 0, NULL);
    for (int form = 0; form < 3; form++) {
        /* no scratch (the small kernel at any size), 9 widened rows or columns per block */
        matmul_ex_case(TIDE_BF16, 20, 96, 70, form != 1, form != 0, (uint64_t)-1, 0, NULL);
        matmul_ex_case(TIDE_F16, 20, 96, 70, form != 1, form != 0, 9 * 96 * 4, 0, NULL);
    }
}

static void test_matmul_gradw(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{7, 33, 20}, {64, 100, 80}, {300, 17, 9}}; /* R, N, K */
    for (int s = 0; s < 3; s++)
        for (int acc = 0; acc < 2; acc++) {
            int64_t R = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            char what[96];
            snprintf(what, sizeof what, "R=%lld N=%lld K=%lld%s", (long long)R, (long long)N, (long long)K,
                     acc ? " accumulate" : "");
            tcase c;
            tc_open(&c, what);
            int dy = tc_tensor(&c, "dy", TIDE_F32, TIDE_ROLE_INPUT, R, N, 0, 1);
            int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, K, 0, 1);
            int dw = tc_tensor(&c, "dw", TIDE_F32, TIDE_ROLE_TEMP, N, K, 0, 1);
            tc_op(&c, TIDE_OP_MATMUL_GRADW, acc ? 3 : 2, (int[]){dy, x, dw}, 1, &dw, NULL);
            const float *dyf = c.host[dy], *xf = c.host[x], *prev = c.host[dw];
            double *scale = dalloc0((size_t)(N * K));
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    double s2 = acc ? fabs((double)prev[n * K + k]) : 0;
                    for (int64_t r = 0; r < R; r++) s2 += fabs((double)dyf[r * N + n] * xf[r * K + k]);
                    scale[n * K + k] = s2;
                }
            tc_check(&c, (tol[]){{.rtol = 1e-5, .scale = scale}});
            free(scale);
            tc_close(&c);
        }
}

/* EMBED_BWD into a block of the gradient: ids [20, 20 + 17) of 50; the
 * others add nothing there. */
static void test_embed_bwd_block(void **state) {
    (void)state;
    enum { B = 2, T = 9, IDX0 = 3, R = 12, V = 50, V0 = 20, VB = 17, D = 40 };
    for (int acc = 0; acc < 2; acc++) {
        tcase c;
        tc_open(&c, acc ? "block accumulate" : "block");
        int dy = tc_tensor(&c, "dy", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1);
        int tok = tc_tensor(&c, "tokens", TIDE_I32, TIDE_ROLE_INPUT, B, T, 0, 0);
        int dt = tc_tensor(&c, "dtable", TIDE_F32, TIDE_ROLE_TEMP, VB, D, 0, 1);
        int32_t *ids = c.host[tok];
        for (int i = 0; i < B * T; i++) ids[i] = i < IDX0 ? V : irand(V);
        ids[IDX0] = ids[IDX0 + 4] = V0, ids[IDX0 + 1] = V0 + VB - 1, ids[IDX0 + 2] = V0 - 1, ids[IDX0 + 3] = V0 + VB;
        tc_op(&c, TIDE_OP_EMBED_BWD, acc ? 3 : 2, (int[]){dy, tok, dt}, 1, &dt,
              &(tide_op_args){.idx0 = IDX0, .vocab0 = V0, .vocab = V});
        float *e = tc_expect_init(&c, dt);
        if (!acc) memset(e, 0, (size_t)VB * D * sizeof(float));
        const float *dyf = c.host[dy];
        for (int r = 0; r < R; r++) {
            int id = ids[IDX0 + r] - V0;
            if (id >= 0 && id < VB)
                for (int i = 0; i < D; i++) e[id * D + i] += dyf[r * D + i];
        }
        tc_check(&c, (tol[]){EXACT});
        ids[IDX0 + 6] = V + 1;
        tc_expect_range(&c, "token id 51");
        tc_close(&c);
    }
}

static void test_embed_bwd(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{50, 33}, {300, 300}}; /* V, D: one or two column blocks */
    for (int s = 0; s < 2; s++)
        for (int acc = 0; acc < 2; acc++) {
            enum { B = 2, T = 9, IDX0 = 3, R = 12 };
            int64_t V = shapes[s][0], D = shapes[s][1];
            char what[96];
            snprintf(what, sizeof what, "V=%lld D=%lld rows from tokens[%d]%s", (long long)V, (long long)D, IDX0,
                     acc ? " accumulate" : "");
            tcase c;
            tc_open(&c, what);
            int dy = tc_tensor(&c, "dy", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1);
            int tok = tc_tensor(&c, "tokens", TIDE_I32, TIDE_ROLE_INPUT, B, T, 0, 0);
            int dt = tc_tensor(&c, "dtable", TIDE_F32, TIDE_ROLE_TEMP, V, D, 0, 1);
            int32_t *ids = c.host[tok];
            for (int i = 0; i < B * T; i++) ids[i] = i < IDX0 ? (int32_t)V : irand((int)V); /* not read */
            ids[IDX0] = ids[IDX0 + 4] = ids[IDX0 + 7] = 0; /* a repeated id sums in row order */
            ids[IDX0 + 1] = (int32_t)V - 1;
            tc_op(&c, TIDE_OP_EMBED_BWD, acc ? 3 : 2, (int[]){dy, tok, dt}, 1, &dt, &(tide_op_args){.idx0 = IDX0});
            /* expected: the contract's f32 sums, rows in order */
            float *e = tc_expect_init(&c, dt);
            if (!acc) memset(e, 0, (size_t)(V * D) * sizeof(float));
            const float *dyf = c.host[dy];
            for (int r = 0; r < R; r++)
                for (int64_t i = 0; i < D; i++) e[ids[IDX0 + r] * D + i] += dyf[r * D + i];
            tc_check(&c, (tol[]){EXACT});
            ids[IDX0 + 5] = (int32_t)V + 2;
            char needle[64];
            snprintf(needle, sizeof needle, "token id %lld", (long long)V + 2);
            tc_expect_range(&c, needle);
            tc_close(&c);
        }
}

static void test_rmsnorm_bwd(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{7, 64}, {300, 100}, {3, 1000}}; /* 300 rows: two blocks of dw's sums */
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 3; s++)
            for (int acc = 0; acc < 2; acc++) {
                int64_t R = shapes[s][0], D = shapes[s][1];
                const float eps = 1e-5f;
                char what[96];
                snprintf(what, sizeof what, "%s R=%lld D=%lld%s", tide_dtype_name(wdts[d]), (long long)R,
                         (long long)D, acc ? " accumulate" : "");
                tcase c;
                tc_open(&c, what);
                int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 2);
                int w = tc_tensor(&c, "w", wdts[d], TIDE_ROLE_WEIGHT, D, 0, 0, 1.5f);
                int dy = tc_tensor(&c, "dy", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1);
                int dx = tc_tensor(&c, "dx", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
                int dw = tc_tensor(&c, "dw", TIDE_F32, TIDE_ROLE_TEMP, D, 0, 0, 1);
                tc_op(&c, TIDE_OP_RMSNORM_BWD, acc ? 4 : 3, (int[]){x, w, dy, dw}, 2, (int[]){dx, dw},
                      &(tide_op_args){.eps = eps});
                float *wx = widened(&c, w);
                const float *xf = c.host[x], *dyf = c.host[dy], *prev = c.host[dw];
                double *mdx = dalloc0((size_t)(R * D)), *mdw = dalloc0((size_t)D);
                for (int64_t r = 0; r < R; r++) {
                    const float *xr = xf + r * D, *dyr = dyf + r * D;
                    double ss = 0, adot = 0;
                    for (int64_t i = 0; i < D; i++) ss += (double)xr[i] * xr[i];
                    double rs = 1 / sqrt(ss / (double)D + eps);
                    for (int64_t i = 0; i < D; i++) adot += fabs((double)dyr[i] * wx[i] * xr[i]);
                    for (int64_t i = 0; i < D; i++) {
                        mdx[r * D + i] = rs * fabs(dyr[i] * wx[i]) + rs * rs * rs * adot / (double)D * fabs(xr[i]) + rs;
                        mdw[i] += fabs((double)dyr[i] * xr[i] * rs);
                    }
                }
                for (int64_t i = 0; acc && i < D; i++) mdw[i] += fabs(prev[i]);
                tc_check(&c, (tol[]){{.rtol = 1e-5, .scale = mdx}, {.rtol = 1e-5, .scale = mdw}});
                free(mdx);
                free(mdw);
                free(wx);
                tc_close(&c);
            }
}

static void test_rope_bwd(void **state) {
    (void)state;
    static const struct { int B, T, H, hd, idx0; float theta; } cs[] = {
        {2, 5, 4, 16, 0, 10000.0f}, {1, 3, 2, 128, 4, 500000.0f}, {1, 4, 3, 6, 0, 10000.0f}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int B = cs[i].B, T = cs[i].T, H = cs[i].H, hd = cs[i].hd;
        int64_t R = (int64_t)B * T, D = (int64_t)H * hd;
        char what[96];
        snprintf(what, sizeof what, "B=%d T=%d H=%d hd=%d pos[%d..]", B, T, H, hd, cs[i].idx0);
        tcase c;
        tc_open(&c, what);
        int dy = tc_tensor(&c, "dy", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1);
        int pos = tc_tensor(&c, "pos", TIDE_I32, TIDE_ROLE_INPUT, cs[i].idx0 + T, 0, 0, 0);
        int dx = tc_tensor(&c, "dx", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
        int32_t *p = c.host[pos];
        for (int t = 0; t < cs[i].idx0 + T; t++) p[t] = t * 7;
        tc_op(&c, TIDE_OP_ROPE_BWD, 2, (int[]){dy, pos}, 1, &dx,
              &(tide_op_args){.n_heads = H, .head_dim = hd, .rope_theta = cs[i].theta, .batch = B,
                                .idx0 = cs[i].idx0});
        double *scale = dalloc0((size_t)(R * D));
        for (int64_t r = 0; r < R; r++)
            for (int64_t e = 0; e < D; e++) scale[r * D + e] = 1.0 + 0.24 * p[cs[i].idx0 + r % T];
        tc_check(&c, (tol[]){{.rtol = 1e-6, .scale = scale}});
        free(scale);
        tc_close(&c);
    }
}

static void test_silu_mul_bwd(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{3, 333}, {64, 1563}};
    for (int s = 0; s < 2; s++) {
        int64_t R = shapes[s][0], I = shapes[s][1], n = R * I;
        char what[96];
        snprintf(what, sizeof what, "R=%lld I=%lld", (long long)R, (long long)I);
        tcase c;
        tc_open(&c, what);
        int g = tc_tensor(&c, "gate", TIDE_F32, TIDE_ROLE_INPUT, R, I, 0, 8);
        int u = tc_tensor(&c, "up", TIDE_F32, TIDE_ROLE_INPUT, R, I, 0, 1);
        int dy = tc_tensor(&c, "dy", TIDE_F32, TIDE_ROLE_INPUT, R, I, 0, 1);
        int dg = tc_tensor(&c, "dgate", TIDE_F32, TIDE_ROLE_TEMP, R, I, 0, 1);
        int du = tc_tensor(&c, "dup", TIDE_F32, TIDE_ROLE_TEMP, R, I, 0, 1);
        float *gf = c.host[g];
        gf[0] = 200.0f, gf[1] = -200.0f;
        tc_op(&c, TIDE_OP_SILU_MUL_BWD, 3, (int[]){g, u, dy}, 2, (int[]){dg, du}, NULL);
        const float *uf = c.host[u], *dyf = c.host[dy];
        double *mg = dalloc0((size_t)n), *mu = dalloc0((size_t)n);
        for (int64_t i = 0; i < n; i++) {
            double x = gf[i], sg = 1 / (1 + exp(-x));
            mu[i] = fabs(dyf[i] * x * sg) + 1e-3;
            mg[i] = fabs(dyf[i] * uf[i]) * (sg + fabs(x) * sg * (1 - sg)) + 1e-3;
        }
        tc_check(&c, (tol[]){{.rtol = 1e-5, .scale = mg}, {.rtol = 1e-5, .scale = mu}});
        free(mg);
        free(mu);
        tc_close(&c);
    }
}

typedef struct attn_train_cfg {
    int B, T, H, KV, hd;
} attn_train_cfg;

/* Both kernels of the forward (T >= 16: query-tiled), several tiles of the
 * backward (head_dim 16, 64: tiles of 32 rows; 128: 16; 200: 8; 300: 4). */
static const attn_train_cfg attn_train_cs[] = {
    {2, 5, 4, 2, 16}, {1, 40, 2, 1, 64}, {2, 17, 4, 4, 80}, {1, 20, 4, 2, 128}, {1, 9, 2, 1, 200}, {1, 6, 2, 2, 300},
};

static void test_attention_nocache(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof attn_train_cs / sizeof attn_train_cs[0]; i++) {
        const attn_train_cfg *a = &attn_train_cs[i];
        int64_t R = (int64_t)a->B * a->T, qd = (int64_t)a->H * a->hd, kd = (int64_t)a->KV * a->hd;
        char what[96];
        snprintf(what, sizeof what, "no cache B=%d T=%d H=%d KV=%d hd=%d", a->B, a->T, a->H, a->KV, a->hd);
        tcase c;
        tc_open(&c, what);
        int q = tc_tensor(&c, "q", TIDE_F32, TIDE_ROLE_INPUT, R, qd, 0, 1);
        int k = tc_tensor(&c, "k", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int v = tc_tensor(&c, "v", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int pos = tc_tensor(&c, "pos", TIDE_I32, TIDE_ROLE_INPUT, a->T, 0, 0, 0);
        int o = tc_tensor(&c, "o", TIDE_F32, TIDE_ROLE_TEMP, R, qd, 0, 1);
        int32_t *p = c.host[pos];
        for (int t = 0; t < a->T; t++) p[t] = t;
        tc_op(&c, TIDE_OP_ATTENTION, 4, (int[]){q, k, v, pos}, 1, &o,
              &(tide_op_args){.n_heads = a->H, .n_kv_heads = a->KV, .head_dim = a->hd, .batch = a->B});
        tc_check(&c, (tol[]){{.atol = 1e-5}});
        /* positions other than 0..T-1: refused, nothing written */
        p[a->T - 1] = a->T + 3;
        char needle[64];
        snprintf(needle, sizeof needle, "positions 0..%d", a->T - 1);
        tc_expect_range(&c, needle);
        tc_close(&c);
    }
}

static void test_attention_bwd(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof attn_train_cs / sizeof attn_train_cs[0]; i++) {
        const attn_train_cfg *a = &attn_train_cs[i];
        int64_t R = (int64_t)a->B * a->T, qd = (int64_t)a->H * a->hd, kd = (int64_t)a->KV * a->hd;
        char what[96];
        snprintf(what, sizeof what, "B=%d T=%d H=%d KV=%d hd=%d", a->B, a->T, a->H, a->KV, a->hd);
        tcase c;
        tc_open(&c, what);
        int q = tc_tensor(&c, "q", TIDE_F32, TIDE_ROLE_INPUT, R, qd, 0, 1);
        int k = tc_tensor(&c, "k", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int v = tc_tensor(&c, "v", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int o = tc_tensor(&c, "o", TIDE_F32, TIDE_ROLE_INPUT, R, qd, 0, 1);
        int dout = tc_tensor(&c, "do", TIDE_F32, TIDE_ROLE_INPUT, R, qd, 0, 1);
        int pos = tc_tensor(&c, "pos", TIDE_I32, TIDE_ROLE_INPUT, a->T, 0, 0, 0);
        int dq = tc_tensor(&c, "dq", TIDE_F32, TIDE_ROLE_TEMP, R, qd, 0, 1);
        int dk = tc_tensor(&c, "dk", TIDE_F32, TIDE_ROLE_TEMP, R, kd, 0, 1);
        int dv = tc_tensor(&c, "dv", TIDE_F32, TIDE_ROLE_TEMP, R, kd, 0, 1);
        int32_t *p = c.host[pos];
        for (int t = 0; t < a->T; t++) p[t] = t;
        tc_op(&c, TIDE_OP_ATTENTION_BWD, 6, (int[]){q, k, v, o, dout, pos}, 3, (int[]){dq, dk, dv},
              &(tide_op_args){.n_heads = a->H, .n_kv_heads = a->KV, .head_dim = a->hd, .batch = a->B});
        /* the workspace holds the CPU's blocks for one thread at least (so it
         * allocates nothing) and the GPU's row statistics */
        tk_attn_dims dims = {.B = a->B, .T = a->T, .C = a->T, .H = a->H, .KV = a->KV, .hd = a->hd};
        uint64_t ws = c.g->ops[c.op].scratch_bytes;
        assert_true(ws >= tk_attention_bwd_work(&dims, 1) && ws >= 3 * (uint64_t)R * (uint64_t)a->H * 4);
        /* 5e-6 of each gradient's largest element */
        int outs[3] = {dq, dk, dv};
        double *scale[3];
        tol tols[3];
        for (int j = 0; j < 3; j++) {
            float *r = tc_ref_output(&c, outs[j]);
            size_t n = (size_t)tide_graph_tensor_bytes(c.g, outs[j]) / 4;
            double mx = 0;
            for (size_t e = 0; e < n; e++) mx = fmax(mx, fabs(r[e]));
            scale[j] = dalloc0(n);
            for (size_t e = 0; e < n; e++) scale[j][e] = mx;
            tols[j] = (tol){.rtol = 5e-6, .scale = scale[j]};
            free(r);
        }
        tc_check(&c, tols);
        for (int j = 0; j < 3; j++) free(scale[j]);
        p[0] = 1;
        char needle[64];
        snprintf(needle, sizeof needle, "positions 0..%d", a->T - 1);
        tc_expect_range(&c, needle);
        tc_close(&c);
    }
}

/* ATTENTION_BWD's workspace (graph/ops.c) for long sequences, without
 * running them: the CPU's blocks for one thread at least, for as many as
 * there are (batch, kv head) tasks up to 64 MiB of them, and the GPU's row
 * statistics. */
static void test_attention_bwd_workspace(void **state) {
    (void)state;
    static const int cs[][4] = {{1, 1, 1, 1}, {8, 2048, 32, 8}, {1, 8192, 32, 32}, {2, 70000, 4, 1}, {4, 100, 8, 2}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int B = cs[i][0], T = cs[i][1], H = cs[i][2], KV = cs[i][3], hd = 8;
        int64_t R = (int64_t)B * T;
        tcase c;
        tc_open(&c, "workspace");
        int64_t qd = (int64_t)H * hd, kd = (int64_t)KV * hd, shape_q[2] = {R, qd}, shape_k[2] = {R, kd}, shape_p[1] = {T};
        int t[9];
        const char *nm[9] = {"q", "k", "v", "o", "do", "pos", "dq", "dk", "dv"};
        for (int j = 0; j < 9; j++)
            assert_int_equal(tide_graph_add_tensor(c.g, nm[j], j == 5 ? TIDE_I32 : TIDE_F32,
                                                   j == 5 ? TIDE_ROLE_INPUT : TIDE_ROLE_TEMP, j == 5 ? 1 : 2,
                                                   j == 5 ? shape_p : j == 1 || j == 2 || j == 7 || j == 8 ? shape_k : shape_q,
                                                   &t[j]),
                             TIDE_OK);
        tc_op(&c, TIDE_OP_ATTENTION_BWD, 6, t, 3, t + 6,
              &(tide_op_args){.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .batch = B});
        tk_attn_dims d = {.B = B, .T = T, .C = T, .H = H, .KV = KV, .hd = hd};
        uint64_t ws = c.g->ops[c.op].scratch_bytes, per = tk_attention_bwd_work(&d, 1);
        uint64_t slots = per ? ws / per : 0, want = (uint64_t)B * KV;
        if (want * per > (UINT64_C(64) << 20)) want = per > (UINT64_C(64) << 20) ? 1 : (UINT64_C(64) << 20) / per;
        if (slots < want || ws < 3 * (uint64_t)R * (uint64_t)H * 4)
            fail_msg("B=%d T=%d H=%d KV=%d: workspace %llu bytes holds %llu of the CPU's %llu-byte blocks (want %llu)", B,
                     T, H, KV, (unsigned long long)ws, (unsigned long long)slots, (unsigned long long)per,
                     (unsigned long long)want);
        tc_close(&c);
    }
}

/* sum of exp(l[j] - mx) over j < n */
static double sum_exp(const double *l, int64_t n, double mx) {
    double s = 0;
    for (int64_t j = 0; j < n; j++) s += exp(l[j] - mx);
    return s;
}

/* CROSS_ENTROPY: rows with ignored targets (-1), f32 and 16-bit weights
 * (widened whole, or 9 rows at a time in a smaller workspace), fresh and
 * accumulating into dw; a row tile (targets from [3] of a longer tensor, the
 * loss and dw adding into the earlier tiles', the loss checked against its
 * value worked in double); a frozen head's form (no dw output), fresh and as
 * a row tile whose loss adds. */
static void test_cross_entropy(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{6, 16, 50}, {40, 64, 300}}; /* R, D, V */
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 2; s++)
            for (int var = 0; var < 6; var++) {
                bool frozen = var >= 4, tile = var == 3 || var == 5, acc = var == 1 || var == 3, small = var == 2;
                if (small && wdts[d] == TIDE_F32) continue;
                int64_t R = shapes[s][0], D = shapes[s][1], V = shapes[s][2], t0 = tile ? 3 : 0;
                const float scale = 1.0f / (float)R;
                char what[96];
                snprintf(what, sizeof what, "%s R=%lld D=%lld V=%lld%s%s%s", tide_dtype_name(wdts[d]), (long long)R,
                         (long long)D, (long long)V, tile ? " row tile" : acc ? " accumulate" : "",
                         small ? " 9-row blocks" : "", frozen ? " frozen head" : "");
                tcase c;
                tc_open(&c, what);
                int h = tc_tensor(&c, "h", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1);
                int w = tc_tensor(&c, "w", wdts[d], TIDE_ROLE_WEIGHT, V, D, 0, 0.5f);
                int tg = tc_tensor(&c, "targets", TIDE_I32, TIDE_ROLE_INPUT, R + t0, 0, 0, 0);
                int loss = tc_tensor(&c, "loss", TIDE_F32, TIDE_ROLE_OUTPUT, 1, 0, 0, 1);
                int dh = tc_tensor(&c, "dh", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
                int dw = tc_tensor(&c, "dw", TIDE_F32, TIDE_ROLE_TEMP, V, D, 0, 1);
                int32_t *t = c.host[tg];
                for (int64_t r = 0; r < t0; r++) t[r] = (int32_t)V + 7; /* before the tile: never read */
                t += t0;
                for (int64_t r = 0; r < R; r++) t[r] = r % 5 == 2 ? -1 : irand((int)V);
                t[0] = (int32_t)V - 1;
                if (frozen)
                    tc_op(&c, TIDE_OP_CROSS_ENTROPY, tile ? 4 : 3, (int[]){h, w, tg, loss}, 2, (int[]){loss, dh},
                          &(tide_op_args){.scale = scale, .idx0 = t0});
                else
                    tc_op(&c, TIDE_OP_CROSS_ENTROPY, tile ? 5 : acc ? 4 : 3, (int[]){h, w, tg, dw, loss}, 3,
                          (int[]){loss, dh, dw}, &(tide_op_args){.scale = scale, .idx0 = t0});
                double want_loss = 0;
                float *exp_loss = tile ? tc_expect_init(&c, loss) : NULL;
                if (small) {
                    uint64_t lb = (uint64_t)(R * V) * 4; /* one chunk: R rows of logits */
                    c.g->ops[c.op].scratch_bytes = ((uint64_t)R * 8 + 63) / 64 * 64 + lb + 9 * (uint64_t)D * 4;
                }
                /* scales: sum of |terms| of each dh and dw element, from a
                 * double softmax */
                float *wx = widened(&c, w);
                const float *hf = c.host[h], *prev = c.host[dw];
                double *mdh = dalloc0((size_t)(R * D)), *mdw = dalloc0((size_t)(V * D)), *l = dalloc0((size_t)V);
                for (int64_t r = 0; r < R; r++) {
                    if (t[r] < 0) continue;
                    double mx = -INFINITY, sum = 0;
                    for (int64_t j = 0; j < V; j++) {
                        double s2 = 0;
                        for (int64_t e = 0; e < D; e++) s2 += (double)hf[r * D + e] * wx[j * D + e];
                        l[j] = s2;
                        mx = fmax(mx, s2);
                    }
                    want_loss += log(sum_exp(l, V, mx)) + mx - l[t[r]];
                    for (int64_t j = 0; j < V; j++) sum += (l[j] = exp(l[j] - mx));
                    for (int64_t j = 0; j < V; j++) {
                        double gv = fabs(scale * (l[j] / sum - (j == t[r])));
                        for (int64_t e = 0; e < D; e++) {
                            mdh[r * D + e] += gv * fabs(wx[j * D + e]);
                            mdw[j * D + e] += gv * fabs(hf[r * D + e]);
                        }
                    }
                }
                for (int64_t i = 0; i < R * D; i++) mdh[i] += 1e-6;
                for (int64_t i = 0; i < V * D; i++) mdw[i] += 1e-6 + (acc ? fabs(prev[i]) : 0);
                if (exp_loss) exp_loss[0] = (float)((double)exp_loss[0] + scale * want_loss);
                tc_check(&c, (tol[]){{.rtol = 1e-5}, {.rtol = 1e-5, .scale = mdh}, {.rtol = 1e-5, .scale = mdw}});
                if (frozen) assert_int_equal(c.g->ops[c.op].flops, 4.0 * (double)(R * V * D)); /* no dw product */
                free(mdh);
                free(mdw);
                free(l);
                free(wx);
                if ((!acc && !small) || tile) {
                    t[R - 1] = (int32_t)V;
                    char needle[96];
                    snprintf(needle, sizeof needle, "target %lld of row %lld", (long long)V, (long long)(t0 + R - 1));
                    tc_expect_range(&c, needle);
                }
                tc_close(&c);
            }
}

/* A case of CE_STATS or CE_BLOCK over rows [v0, v0 + vb) of c0's head ww
 * (D columns): h (R, D) and the targets (R + t0 of them, the rows' from
 * [t0]) copied from c0's hh and tgt, and the statistics (R, 3), which the
 * caller fills. */
typedef struct ce_ids {
    int h, w, tg, st;
} ce_ids;

static ce_ids ce_case_open(tcase *c, const char *what, const tcase *c0, int hh, int ww, int64_t R, int64_t D,
                           int64_t v0, int64_t vb, const int32_t *tgt, int64_t t0) {
    tide_dtype dt = tide_graph_tensor_dtype(c0->g, ww);
    tc_open(c, what);
    ce_ids id = {.h = tc_tensor(c, "h", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1),
                 .w = tc_tensor(c, "w", dt, TIDE_ROLE_WEIGHT, vb, D, 0, 0.5f),
                 .tg = tc_tensor(c, "targets", TIDE_I32, TIDE_ROLE_INPUT, R + t0, 0, 0, 0),
                 .st = tc_tensor(c, "stats", TIDE_F32, TIDE_ROLE_TEMP, R, 3, 0, 1)};
    tc_copy_host(c, id.h, c0, hh, 0);
    tc_copy_host(c, id.w, c0, ww, (size_t)(v0 * D) * tide_dtype_size(dt));
    memcpy(c->host[id.tg], tgt, (size_t)(R + t0) * sizeof *tgt);
    return id;
}

/* CE_STATS and CE_BLOCK: a head of V = 300 ids in three uneven blocks, f32
 * and 16-bit weights, targets from [3] of a longer tensor with ignored rows.
 * Each op once per block, its inputs (the statistics of the blocks before,
 * the gradient so far) set from a double reference of the whole head, its
 * outputs checked against that reference: the statistics, the loss (fresh
 * and adding), dh (fresh at the first block, adding later) and dw (fresh and
 * adding). */
static void test_ce_blocks(void **state) {
    (void)state;
    enum { R = 24, D = 48, V = 300, T0 = 3, NB = 3 };
    static const int64_t b0[NB + 1] = {0, 100, 230, V};
    const float scale = 1.0f / (float)R;
    for (int d = 0; d < 3; d++) {
        /* the reference: logits, per-row prefix statistics before each block, the whole's */
        tcase c0;
        tc_open(&c0, "ce blocks data");
        int hh = tc_tensor(&c0, "h", TIDE_F32, TIDE_ROLE_INPUT, R, D, 0, 1);
        int ww = tc_tensor(&c0, "w", wdts[d], TIDE_ROLE_WEIGHT, V, D, 0, 0.5f);
        float *wx = widened(&c0, ww);
        const float *hf = c0.host[hh];
        int32_t tgt[R + T0];
        for (int r = 0; r < T0; r++) tgt[r] = V + 7; /* before the rows: never read */
        for (int r = 0; r < R; r++) tgt[T0 + r] = r % 5 == 2 ? -1 : irand(V);
        tgt[T0] = V - 1, tgt[T0 + 1] = 100, tgt[T0 + 3] = 99;
        const int32_t *t = tgt + T0;
        double *l = dalloc0((size_t)R * V), *mag = dalloc0((size_t)R * V);
        for (int r = 0; r < R; r++)
            for (int j = 0; j < V; j++)
                for (int e = 0; e < D; e++) {
                    l[r * V + j] += (double)hf[r * D + e] * wx[j * D + e];
                    mag[r * V + j] += fabs((double)hf[r * D + e] * wx[j * D + e]);
                }
        /* stats of ids [0, b) per row: max, sum exp, target logit */
#define PREFIX(b, r, M, S, Tl)                                                                                         \
    do {                                                                                                               \
        M = -INFINITY, S = 0, Tl = 0;                                                                                  \
        for (int j = 0; j < (b); j++) M = fmax(M, l[(r) * V + j]);                                                     \
        for (int j = 0; j < (b); j++) S += exp(l[(r) * V + j] - M);                                                    \
        if (t[r] >= 0 && t[r] < (b)) Tl = l[(r) * V + t[r]];                                                           \
    } while (0)
        double want_loss = 0;
        for (int r = 0; r < R; r++) {
            double M, S, Tl;
            PREFIX(V, r, M, S, Tl);
            if (t[r] >= 0) want_loss += M + log(S) - Tl;
        }
        for (int k = 0; k < NB; k++) {
            const int64_t v0 = b0[k], vb = b0[k + 1] - b0[k];
            const bool first = k == 0, last = k == NB - 1;
            for (int acc = 0; acc < 1 + last; acc++) {
                char what[96];
                snprintf(what, sizeof what, "stats %s block %lld+%lld%s", tide_dtype_name(wdts[d]), (long long)v0,
                         (long long)vb, acc ? " loss adding" : "");
                tcase c;
                ce_ids id = ce_case_open(&c, what, &c0, hh, ww, R, D, v0, vb, tgt, T0);
                const int tg = id.tg, st = id.st;
                int loss = tc_tensor(&c, "loss", TIDE_F32, TIDE_ROLE_OUTPUT, 1, 0, 0, 1);
                float *sin = c.host[st];
                for (int r = 0; r < R; r++) {
                    double M, S, Tl;
                    PREFIX((int)v0, r, M, S, Tl);
                    sin[r * 3] = (float)M, sin[r * 3 + 1] = (float)S, sin[r * 3 + 2] = (float)Tl;
                }
                int ins[5] = {id.h, id.w, tg}, n_in = 3;
                if (!first) ins[n_in++] = st;
                if (acc) ins[n_in++] = loss;
                tc_op(&c, TIDE_OP_CE_STATS, n_in, ins, last ? 2 : 1, (int[]){st, loss},
                      &(tide_op_args){.vocab0 = v0, .vocab = V, .idx0 = T0, .scale = scale, .accumulate = acc});
                float *es = tc_expect_init(&c, st);
                double *sc = dalloc0((size_t)R * 3);
                for (int r = 0; r < R; r++) {
                    double M, S, Tl, worst = 0;
                    PREFIX((int)(v0 + vb), r, M, S, Tl);
                    es[r * 3] = (float)M, es[r * 3 + 1] = (float)S, es[r * 3 + 2] = (float)Tl;
                    for (int j = 0; j < v0 + vb; j++) worst = fmax(worst, mag[r * V + j]);
                    /* a logit's error is 1e-5 of its terms' magnitudes; S moves by S times it */
                    sc[r * 3] = sc[r * 3 + 2] = worst + 1e-6;
                    sc[r * 3 + 1] = S * worst + 1e-6;
                }
                if (last) {
                    float *el = tc_expect_init(&c, loss);
                    el[0] = (float)((acc ? (double)el[0] : 0.0) + scale * want_loss);
                }
                tc_check(&c, (tol[]){{.rtol = 1e-5, .scale = sc}, {.rtol = 1e-5}});
                free(sc);
                if (last && !acc) {
                    ((int32_t *)c.host[tg])[T0 + R - 1] = V;
                    char needle[96];
                    snprintf(needle, sizeof needle, "target %d of row %d", V, T0 + R - 1);
                    tc_expect_range(&c, needle);
                }
                tc_close(&c);
            }
        }
        /* CE_BLOCK per block, with the whole head's statistics */
        for (int k = 0; k < NB; k++) {
            const int64_t v0 = b0[k], vb = b0[k + 1] - b0[k];
            for (int var = 0; var < 3; var++) {
                const bool acc = var == 1, frozen = var == 2; /* frozen: a frozen head's block, dh alone */
                char what[96];
                snprintf(what, sizeof what, "grad %s block %lld+%lld%s", tide_dtype_name(wdts[d]), (long long)v0,
                         (long long)vb, acc ? " dw adding" : frozen ? " frozen head" : "");
                tcase c;
                ce_ids id = ce_case_open(&c, what, &c0, hh, ww, R, D, v0, vb, tgt, T0);
                int dh = tc_tensor(&c, "dh", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
                int dw = tc_tensor(&c, "dw", TIDE_F32, TIDE_ROLE_TEMP, vb, D, 0, 1);
                float *sin = c.host[id.st];
                double *lse = dalloc0(R);
                for (int r = 0; r < R; r++) {
                    double M, S, Tl;
                    PREFIX(V, r, M, S, Tl);
                    sin[r * 3] = (float)M, sin[r * 3 + 1] = (float)S, sin[r * 3 + 2] = (float)Tl;
                    lse[r] = M + log(S);
                }
                int ins[6] = {id.h, id.w, id.tg, id.st}, n_in = 4;
                if (v0 > 0) ins[n_in++] = dh;
                if (acc) ins[n_in++] = dw;
                tc_op(&c, TIDE_OP_CE_BLOCK, n_in, ins, frozen ? 1 : 2, (int[]){dh, dw},
                      &(tide_op_args){.vocab0 = v0, .vocab = V, .idx0 = T0, .scale = scale, .accumulate = acc});
                float *edh = tc_expect_init(&c, dh), *edw = frozen ? NULL : tc_expect_init(&c, dw);
                double *mdh = dalloc0((size_t)R * D), *mdw = dalloc0((size_t)vb * D);
                double *xdh = dalloc0((size_t)R * D), *xdw = dalloc0((size_t)vb * D);
                for (int r = 0; r < R; r++) {
                    if (t[r] < 0) continue;
                    for (int64_t j = 0; j < vb; j++) {
                        double gv = scale * (exp(l[r * V + v0 + j] - lse[r]) - (v0 + j == t[r]));
                        for (int e = 0; e < D; e++) {
                            xdh[r * D + e] += gv * wx[(v0 + j) * D + e];
                            mdh[r * D + e] += fabs(gv * wx[(v0 + j) * D + e]);
                            xdw[j * D + e] += gv * hf[r * D + e];
                            mdw[j * D + e] += fabs(gv * hf[r * D + e]);
                        }
                    }
                }
                for (int64_t i = 0; i < R * D; i++) {
                    double prev = v0 > 0 ? edh[i] : 0;
                    edh[i] = (float)(prev + xdh[i]);
                    mdh[i] += 1e-6 + fabs(prev);
                }
                for (int64_t i = 0; i < vb * D && edw; i++) {
                    double prev = acc ? edw[i] : 0;
                    edw[i] = (float)(prev + xdw[i]);
                    mdw[i] += 1e-6 + fabs(prev);
                }
                tc_check(&c, (tol[]){{.rtol = 1e-5, .scale = mdh}, {.rtol = 1e-5, .scale = mdw}});
                free(mdh), free(mdw), free(xdh), free(xdw), free(lse);
                tc_close(&c);
            }
        }
#undef PREFIX
        free(l), free(mag), free(wx);
        tc_close(&c0);
    }
}

static void test_sumsq(void **state) {
    (void)state;
    static const int64_t ns[] = {1000, 20000, 100001};
    for (int s = 0; s < 3; s++)
        for (int acc = 0; acc < 2; acc++) {
            char what[96];
            snprintf(what, sizeof what, "n=%lld%s", (long long)ns[s], acc ? " accumulate" : "");
            tcase c;
            tc_open(&c, what);
            int g = ns[s] % 10 ? tc_tensor(&c, "g", TIDE_F32, TIDE_ROLE_INPUT, ns[s], 0, 0, 3)
                               : tc_tensor(&c, "g", TIDE_F32, TIDE_ROLE_INPUT, ns[s] / 10, 10, 0, 3);
            int out = tc_tensor(&c, "acc", TIDE_F32, TIDE_ROLE_TEMP, 1, 0, 0, 1);
            ((float *)c.host[out])[0] = 123.25f;
            tc_op(&c, TIDE_OP_SUMSQ, acc ? 2 : 1, (int[]){g, out}, 1, &out, NULL);
            tc_check(&c, (tol[]){{.rtol = 1e-6}});
            tc_close(&c);
        }
}

/* ADAMW on every parameter dtype (16-bit ones with an f32 master), 1-D
 * (no decay) and 2-D, clipped or not: exactly the CPU's bits. */
static void test_adamw(void **state) {
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int nd = 1; nd <= 2; nd++)
            for (int clip = 0; clip < 2; clip++) {
                tide_dtype dt = wdts[d];
                bool master = dt != TIDE_F32 || (nd == 2 && clip); /* an f32 parameter with a master too */
                int64_t d0 = nd == 2 ? 37 : 1000, d1 = nd == 2 ? 29 : 0;
                char what[96];
                snprintf(what, sizeof what, "%s %d-D%s%s", tide_dtype_name(dt), nd, master ? " master" : "",
                         clip ? " clipped" : "");
                tcase c;
                tc_open(&c, what);
                int p = tc_tensor(&c, "param", dt, TIDE_ROLE_STATE, d0, d1, 0, 1);
                int mst = master ? tc_tensor(&c, "master", TIDE_F32, TIDE_ROLE_STATE, d0, d1, 0, 1) : -1;
                int m = tc_tensor(&c, "m", TIDE_F32, TIDE_ROLE_STATE, d0, d1, 0, 0.01f);
                int v = tc_tensor(&c, "v", TIDE_F32, TIDE_ROLE_STATE, d0, d1, 0, 1e-4f);
                int gr = tc_tensor(&c, "grad", TIDE_F32, TIDE_ROLE_TEMP, d0, d1, 0, 0.1f);
                int hy = tc_tensor(&c, "hyper", TIDE_F32, TIDE_ROLE_INPUT, 4, 0, 0, 0);
                int ss = tc_tensor(&c, "sumsq", TIDE_F32, TIDE_ROLE_TEMP, 1, 0, 0, 0);
                float *vv = c.host[v], *hyper = c.host[hy];
                size_t n = (size_t)(d0 * (d1 ? d1 : 1));
                for (size_t i = 0; i < n; i++) vv[i] = fabsf(vv[i]);
                const double lr = 1e-3, b1 = 0.9, b2 = 0.95;
                hyper[0] = (float)lr;
                hyper[1] = (float)(lr / (1 - b1 * b1 * b1));
                hyper[2] = (float)sqrt(1 - b2 * b2 * b2);
                hyper[3] = 0;
                ((float *)c.host[ss])[0] = clip ? 9.0f : 0.25f; /* norm 3 or 0.5 against max_norm 1 */
                tide_op_args pr = {.beta1 = (float)b1, .beta2 = (float)b2, .adam_eps = 1e-8f, .weight_decay = 0.1f,
                                     .max_norm = 1.0f};
                if (master)
                    tc_op(&c, TIDE_OP_ADAMW, 7, (int[]){p, mst, m, v, gr, hy, ss}, 4, (int[]){p, mst, m, v}, &pr);
                else
                    tc_op(&c, TIDE_OP_ADAMW, 6, (int[]){p, m, v, gr, hy, ss}, 3, (int[]){p, m, v}, &pr);
                tc_check(&c, (tol[]){EXACT, EXACT, EXACT, EXACT});
                tc_close(&c);
            }
}

/* ------------------------------------------------------------- memory, streams */

static void test_memory(void **state) {
    (void)state;
    for (int b = 0; b < n_be; b++) {
        tide_backend *be = bes[b].be;
        size_t n = (size_t)1 << 20;
        uint8_t *src = malloc(n), *dst = malloc(n);
        assert_non_null(src);
        assert_non_null(dst);
        for (size_t i = 0; i < n; i++) src[i] = (uint8_t)(i * 7 + 3);
        void *d = NULL, *z = NULL;
        assert_int_equal(be->vt->alloc(be, n, &d), TIDE_OK);
        assert_int_equal(be->vt->alloc(be, 0, &z), TIDE_OK); /* zero bytes: a valid pointer */
        assert_non_null(z);
        assert_int_equal(be->vt->to_device(be, NULL, d, src, n), TIDE_OK);
        assert_int_equal(be->vt->to_host(be, NULL, dst, d, n), TIDE_OK);
        assert_memory_equal(src, dst, n);
        assert_int_equal(be->vt->to_device(be, NULL, d, src, 0), TIDE_OK);
        if (be->vt->host_alloc) {
            void *pinned = NULL;
            assert_int_equal(be->vt->host_alloc(be, n, &pinned), TIDE_OK);
            assert_int_equal(be->vt->to_host(be, NULL, pinned, d, n), TIDE_OK);
            assert_memory_equal(src, pinned, n);
            be->vt->host_free(be, pinned);
        }
        be->vt->dealloc(be, z);
        be->vt->dealloc(be, d);
        /* far more than any machine has: a status and a message, no crash */
        void *huge = (void *)1;
        assert_int_equal(be->vt->alloc(be, (size_t)1 << 52, &huge), TIDE_E_NOMEM);
        assert_null(huge);
        assert_true(strlen(tide_ctx_last_error(bes[b].ctx)) > 0);
        print_message("  %-4s alloc of 4 PiB: %s\n", tide_backend_name(be), tide_ctx_last_error(bes[b].ctx));
        free(src);
        free(dst);
    }
}

typedef struct stream_arg {
    tide_backend *be;
    int stream;
    const tcase *add; /* stream 0 also computes this ADD (tensors 0 + 1 -> 2) */
    int errors;
    char why[TIDE_ERRMSG_MAX];
} stream_arg;

/* One ADD of the case on be's queue q, checked; no cmocka asserts (runs off
 * the main thread). Returns the number of errors. */
static int add_once(tide_backend *be, void *q, const tcase *c) {
    size_t nb = (size_t)tide_graph_tensor_bytes(c->g, 0), n = nb / sizeof(float);
    void *d[3] = {0};
    float *z = malloc(nb);
    int err = !z;
    for (int t = 0; t < 3 && !err; t++) err = be->vt->alloc(be, nb, &d[t]) != TIDE_OK;
    for (int t = 0; t < 2 && !err; t++) err = be->vt->to_device(be, q, d[t], c->host[t], nb) != TIDE_OK;
    if (!err) err = be->vt->compute(be, q, c->g, &c->g->ops[c->op], d, &d[2], NULL) != TIDE_OK;
    if (!err) err = be->vt->to_host(be, q, z, d[2], nb) != TIDE_OK;
    const float *x = c->host[0], *y = c->host[1];
    for (size_t i = 0; i < n && !err; i++) err = z[i] != x[i] + y[i];
    for (int t = 0; t < 3; t++)
        if (d[t]) be->vt->dealloc(be, d[t]);
    free(z);
    return err;
}

/* A worker as the executor runs one: a synchronous queue of its own, errors
 * on a context of its own, then copies (and on stream 0 computes) in a loop,
 * checking each result. */
static void *stream_worker(void *p) {
    stream_arg *a = p;
    tide_backend *be = a->be;
    tide_ctx *ctx = tide_ctx_new();
    void *q = NULL;
    if (!ctx || (be->vt->queue_new && be->vt->queue_new(be, ctx, false, &q) != TIDE_OK)) {
        a->errors++;
        snprintf(a->why, sizeof a->why, "queue_new: %s", tide_ctx_last_error(ctx));
        tide_ctx_free(ctx);
        return NULL;
    }
    size_t n = (size_t)4 << 20;
    uint32_t *h = malloc(n), *back = malloc(n);
    void *d = NULL;
    if (!h || !back || be->vt->alloc(be, n, &d) != TIDE_OK) {
        a->errors++;
        free(h);
        free(back);
        if (q) be->vt->queue_free(be, q);
        tide_ctx_free(ctx);
        return NULL;
    }
    for (int it = 0; it < 20; it++) {
        for (size_t i = 0; i < n / 4; i++) h[i] = (uint32_t)(i * 2654435761u) ^ (uint32_t)(a->stream << 24 | it);
        if (be->vt->to_device(be, q, d, h, n) || be->vt->to_host(be, q, back, d, n) || memcmp(h, back, n)) a->errors++;
        if (a->add) a->errors += add_once(be, q, a->add);
    }
    if (a->errors) snprintf(a->why, sizeof a->why, "%s", tide_ctx_last_error(ctx));
    be->vt->dealloc(be, d);
    if (q) be->vt->queue_free(be, q);
    tide_ctx_free(ctx);
    free(h);
    free(back);
    return NULL;
}

/* The queue limit of a backend that has one (CUDA: a stream and its
 * resources per queue): queue_new refuses past it with a message and no
 * queue; freed queues are reused. */
static void queue_limit(tide_backend *be) {
    enum { MOST = 200 };
    void *q[MOST] = {0};
    tide_ctx *ctx = tide_ctx_new();
    assert_non_null(ctx);
    int n = 0;
    tide_status st = TIDE_OK;
    bool ev = tide_backend_has_events(be);
    while (n < MOST && !(st = be->vt->queue_new(be, ctx, ev && n % 2, &q[n]))) n++;
    if (be->kind == TIDE_BACKEND_CPU) {
        assert_int_equal(n, MOST); /* a context pointer each: no limit */
    } else {
        assert_int_equal(st, TIDE_E_UNSUPPORTED);
        assert_null(q[n]);
        assert_non_null(strstr(tide_ctx_last_error(ctx), "queues"));
        print_message("  %-4s %d queues, then: %s\n", tide_backend_name(be), n, tide_ctx_last_error(ctx));
        be->vt->queue_free(be, q[0]);
        assert_int_equal(be->vt->queue_new(be, ctx, ev, &q[0]), TIDE_OK);
    }
    for (int i = 0; i < n; i++) be->vt->queue_free(be, q[i]);
    be->vt->queue_free(be, NULL);
    tide_ctx_free(ctx);
}

static void test_streams(void **state) {
    (void)state;
    for (int b = 0; b < n_be; b++) {
        tcase add;
        tc_open(&add, "add on stream 0");
        int x = tc_tensor(&add, "a", TIDE_F32, TIDE_ROLE_INPUT, 10, 100, 0, 1);
        int y = tc_tensor(&add, "b", TIDE_F32, TIDE_ROLE_INPUT, 10, 100, 0, 1);
        int o = tc_tensor(&add, "c", TIDE_F32, TIDE_ROLE_TEMP, 10, 100, 0, 1);
        tc_op(&add, TIDE_OP_ADD, 2, (int[]){x, y}, 1, &o, NULL);
        pthread_t th[4];
        stream_arg args[4];
        for (int s = 0; s < 4; s++) {
            args[s] = (stream_arg){.be = bes[b].be, .stream = s, .add = s == 0 ? &add : NULL};
            assert_int_equal(pthread_create(&th[s], NULL, stream_worker, &args[s]), 0);
        }
        int errors = 0;
        for (int s = 0; s < 4; s++) {
            pthread_join(th[s], NULL);
            errors += args[s].errors;
        }
        for (int s = 0; s < 4 && errors; s++)
            if (args[s].errors) fail_msg("%s: %d errors on concurrent queues (%s)", tide_backend_name(bes[b].be),
                                         errors, args[s].why);
        queue_limit(bes[b].be);
        tc_close(&add);
    }
}

/* ------------------------------------------------------------- events */

/* A three-stage pipeline as the executor issues one, on backends with events:
 * the h2d stream copies input k into one of two device buffers, the compute
 * stream adds a constant into one of two outputs, the d2h stream copies the
 * output back, each stream on its own thread and its own asynchronous queue
 * (errors on a context of its own). Every
 * edge is an event recorded by the producer and waited on by the consumer's
 * queue (input ready, output ready) or by the producer of the next use of a
 * buffer (input consumed, output read back), after the host learnt that the
 * record was issued. Nothing else orders the streams, so a missing or
 * misplaced wait in the backend shows up as a wrong result. */
#define EV_ITERS 24
#define EV_FLOATS ((size_t)1 << 20)

typedef struct ev_pipe {
    tide_backend *be;
    const tcase *add;            /* ADD of two (EV_FLOATS) tensors */
    float *h_in[EV_ITERS], *h_out[EV_ITERS];
    void *x[2], *y, *z[2];       /* device */
    void *in_ready[EV_ITERS], *in_used[EV_ITERS], *out_ready[EV_ITERS], *out_read[EV_ITERS];
    int issued[3];               /* per stage: iterations issued (records made) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int errors;
    char why[256];
} ev_pipe;

static void ev_issued(ev_pipe *e, int stage, int k) {
    pthread_mutex_lock(&e->mu);
    e->issued[stage] = k + 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Waits until stage has issued iteration k (k < 0: nothing to wait for). */
static void ev_await(ev_pipe *e, int stage, int k) {
    if (k < 0) return;
    pthread_mutex_lock(&e->mu);
    while (e->issued[stage] <= k && !e->errors) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

static void ev_error(ev_pipe *e, tide_ctx *ctx, const char *what) {
    pthread_mutex_lock(&e->mu);
    if (!e->errors++) snprintf(e->why, sizeof e->why, "%s: %s", what, tide_ctx_last_error(ctx));
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

typedef struct ev_arg {
    ev_pipe *e;
    int stage;    /* 0 h2d, 1 compute, 2 d2h */
    void *q;      /* the stage's queue, made and freed by the main thread */
    tide_ctx *ctx; /* its errors */
} ev_arg;

static void *ev_stage(void *p) {
    ev_arg *a = p;
    ev_pipe *e = a->e;
    tide_backend *be = e->be;
    const tide_backend_vt *vt = be->vt;
    void *q = a->q;
    size_t nb = EV_FLOATS * sizeof(float);
    for (int k = 0; k < EV_ITERS && !e->errors; k++) {
        int b = k & 1;
        tide_status st = TIDE_OK;
        if (a->stage == 0) {
            /* x[b] is free once the compute of iteration k - 2 has read it */
            ev_await(e, 1, k - 2);
            if (k >= 2) st = vt->event_wait(be, q, e->in_used[k - 2]);
            if (!st) st = vt->to_device(be, q, e->x[b], e->h_in[k], nb);
            if (!st) st = vt->event_record(be, q, e->in_ready[k]);
        } else if (a->stage == 1) {
            ev_await(e, 0, k);
            ev_await(e, 2, k - 2);
            st = vt->event_wait(be, q, e->in_ready[k]);
            if (!st && k >= 2) st = vt->event_wait(be, q, e->out_read[k - 2]);
            void *in[2] = {e->x[b], e->y}, *out[1] = {e->z[b]};
            if (!st) st = vt->compute(be, q, e->add->g, &e->add->g->ops[e->add->op], in, out, NULL);
            if (!st) st = vt->event_record(be, q, e->in_used[k]);
            if (!st) st = vt->event_record(be, q, e->out_ready[k]);
        } else {
            ev_await(e, 1, k);
            st = vt->event_wait(be, q, e->out_ready[k]);
            if (!st) st = vt->to_host(be, q, e->h_out[k], e->z[b], nb);
            if (!st) st = vt->event_record(be, q, e->out_read[k]);
        }
        if (st) {
            ev_error(e, a->ctx, "a pipeline stage");
            return NULL;
        }
        ev_issued(e, a->stage, k);
    }
    return NULL;
}

static void events_on(tide_backend *be, const tcase *add) {
    const tide_backend_vt *vt = be->vt;
    const char *bn = tide_backend_name(be);
    size_t nb = EV_FLOATS * sizeof(float);
    ev_pipe e = {.be = be, .add = add};
    pthread_mutex_init(&e.mu, NULL);
    pthread_cond_init(&e.cv, NULL);
    /* pinned host buffers where the backend has them: the copies are then
     * truly asynchronous */
    bool pinned = vt->host_alloc != NULL;
    for (int k = 0; k < EV_ITERS; k++) {
        if (pinned) {
            assert_int_equal(vt->host_alloc(be, nb, (void **)&e.h_in[k]), TIDE_OK);
            assert_int_equal(vt->host_alloc(be, nb, (void **)&e.h_out[k]), TIDE_OK);
        } else {
            e.h_in[k] = malloc(nb);
            e.h_out[k] = malloc(nb);
        }
        assert_non_null(e.h_in[k]);
        assert_non_null(e.h_out[k]);
        for (size_t i = 0; i < EV_FLOATS; i++) {
            e.h_in[k][i] = (float)((i * 7 + (size_t)k * 131) % 1009);
            e.h_out[k][i] = -1.0f;
        }
        void **evs[4] = {&e.in_ready[k], &e.in_used[k], &e.out_ready[k], &e.out_read[k]};
        for (int j = 0; j < 4; j++) assert_int_equal(vt->event_new(be, false, evs[j]), TIDE_OK);
    }
    float *yh = malloc(nb);
    assert_non_null(yh);
    for (size_t i = 0; i < EV_FLOATS; i++) yh[i] = (float)(i % 17) * 0.5f;
    assert_int_equal(vt->alloc(be, nb, &e.y), TIDE_OK);
    assert_int_equal(vt->to_device(be, NULL, e.y, yh, nb), TIDE_OK);
    for (int b = 0; b < 2; b++) {
        assert_int_equal(vt->alloc(be, nb, &e.x[b]), TIDE_OK);
        assert_int_equal(vt->alloc(be, nb, &e.z[b]), TIDE_OK);
    }
    pthread_t th[3];
    ev_arg args[3];
    for (int s = 0; s < 3; s++) {
        args[s] = (ev_arg){.e = &e, .stage = s, .ctx = tide_ctx_new()};
        assert_non_null(args[s].ctx);
        assert_int_equal(vt->queue_new(be, args[s].ctx, true, &args[s].q), TIDE_OK);
    }
    for (int s = 0; s < 3; s++) assert_int_equal(pthread_create(&th[s], NULL, ev_stage, &args[s]), 0);
    for (int s = 0; s < 3; s++) pthread_join(th[s], NULL);
    assert_int_equal(vt->synchronize ? vt->synchronize(be) : TIDE_OK, TIDE_OK);
    for (int s = 0; s < 3; s++) {
        vt->queue_free(be, args[s].q);
        tide_ctx_free(args[s].ctx);
    }
    if (e.errors) fail_msg("%s: %s", bn, e.why);
    int wrong = 0;
    for (int k = 0; k < EV_ITERS; k++)
        for (size_t i = 0; i < EV_FLOATS; i++) wrong += e.h_out[k][i] != e.h_in[k][i] + yh[i];
    if (wrong) fail_msg("%s: %d wrong values through the event pipeline", bn, wrong);

    /* event_sync waits for the work before the record; an event never
     * recorded is complete; elapsed time between timing events */
    void *t0 = NULL, *t1 = NULL, *never = NULL;
    assert_int_equal(vt->event_new(be, true, &t0), TIDE_OK);
    assert_int_equal(vt->event_new(be, true, &t1), TIDE_OK);
    assert_int_equal(vt->event_new(be, false, &never), TIDE_OK);
    assert_int_equal(vt->event_sync(be, NULL, never), TIDE_OK);
    assert_int_equal(vt->event_wait(be, NULL, never), TIDE_OK);
    void *q = NULL;
    assert_int_equal(vt->queue_new(be, be->ctx, true, &q), TIDE_OK);
    assert_int_equal(vt->event_record(be, q, t0), TIDE_OK);
    for (int k = 0; k < EV_ITERS; k++) assert_int_equal(vt->to_host(be, q, e.h_out[k], e.y, nb), TIDE_OK);
    assert_int_equal(vt->event_record(be, q, t1), TIDE_OK);
    assert_int_equal(vt->event_sync(be, q, t1), TIDE_OK);
    for (int k = 0; k < EV_ITERS; k++) assert_memory_equal(e.h_out[k], yh, nb);
    double sec = -1;
    assert_int_equal(vt->event_elapsed(be, t0, t1, &sec), TIDE_OK);
    assert_true(sec >= 0 && sec < 60);
    print_message("  %-9s %d pipelined iterations right; %d copies of %zu MiB timed by events: %.3f ms\n", bn,
                  EV_ITERS, EV_ITERS, nb >> 20, sec * 1e3);
    vt->queue_free(be, q);
    vt->event_free(be, t0);
    vt->event_free(be, t1);
    vt->event_free(be, never);

    for (int b = 0; b < 2; b++) {
        vt->dealloc(be, e.x[b]);
        vt->dealloc(be, e.z[b]);
    }
    vt->dealloc(be, e.y);
    free(yh);
    for (int k = 0; k < EV_ITERS; k++) {
        if (pinned) {
            vt->host_free(be, e.h_in[k]);
            vt->host_free(be, e.h_out[k]);
        } else {
            free(e.h_in[k]);
            free(e.h_out[k]);
        }
        void *evs[4] = {e.in_ready[k], e.in_used[k], e.out_ready[k], e.out_read[k]};
        for (int j = 0; j < 4; j++) vt->event_free(be, evs[j]);
    }
    pthread_mutex_destroy(&e.mu);
    pthread_cond_destroy(&e.cv);
}

static void test_events(void **state) {
    (void)state;
    tcase add;
    tc_open(&add, "add through events");
    int x = tc_tensor(&add, "a", TIDE_F32, TIDE_ROLE_INPUT, 1024, (int64_t)EV_FLOATS / 1024, 0, 1);
    int y = tc_tensor(&add, "b", TIDE_F32, TIDE_ROLE_INPUT, 1024, (int64_t)EV_FLOATS / 1024, 0, 1);
    int o = tc_tensor(&add, "c", TIDE_F32, TIDE_ROLE_TEMP, 1024, (int64_t)EV_FLOATS / 1024, 0, 1);
    tc_op(&add, TIDE_OP_ADD, 2, (int[]){x, y}, 1, &o, NULL);
    for (int b = 0; b < n_be; b++) {
        tide_backend *be = bes[b].be;
        if (!be->vt->event_new) {
            /* all six or none, and no asynchronous mode without them */
            assert_null(be->vt->event_record);
            assert_null(be->vt->event_wait);
            assert_null(be->vt->event_sync);
            if (be->vt->queue_new) {
                void *q = (void *)1;
                assert_int_equal(be->vt->queue_new(be, bes[b].ctx, true, &q), TIDE_E_UNSUPPORTED);
                assert_null(q);
            }
            continue;
        }
        events_on(be, &add);
    }
    /* and on queues that run behind the caller with random delays
     * (tests/async_backend.h), where a missing wait would show */
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *ab = NULL;
    tide_async_opts ao = {.jitter_us = 300, .seed = 3};
    assert_int_equal(tide_async_backend_new(ctx, &ao, &ab), TIDE_OK);
    events_on(ab, &add);
    tide_backend_free(ab);
    tide_ctx_free(ctx);
    tc_close(&add);
}

/* ------------------------------------------------------------- selection */

static void test_selection(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = (tide_backend *)1;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_AUTO, &be), TIDE_OK);
    assert_string_equal(tide_backend_name(be), have_cuda ? "cuda" : "cpu");
    tide_backend_free(be);
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    assert_string_equal(tide_backend_name(be), "cpu");
    assert_true(be->vt->device_is_host);
    /* matmul modes: both on the CPU; AUTO is FAST where bf16 weights are
     * multiplied natively (AVX512_BF16), F32 elsewhere; the kernels are named */
    tide_matmul_mode cpu_auto = tk_matmul_fast_native(TIDE_BF16) ? TIDE_MATMUL_FAST : TIDE_MATMUL_F32;
    assert_int_equal(tide_backend_matmul(be), cpu_auto);
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_FAST), TIDE_OK);
    assert_int_equal(tide_backend_matmul(be), TIDE_MATMUL_FAST);
    assert_non_null(strstr(tide_backend_kernels(be), "cpu: "));
    print_message("  cpu/fast kernels: %s\n", tide_backend_kernels(be));
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK);
    print_message("  cpu/f32 kernels: %s\n", tide_backend_kernels(be));
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_AUTO), TIDE_OK);
    assert_int_equal(tide_backend_matmul(be), cpu_auto);
    assert_int_equal(tide_backend_set_matmul(be, (tide_matmul_mode)99), TIDE_E_INVALID);
    tide_backend_free(be);
    for (int i = 0; i < 2; i++) { /* twice: a failed attempt leaves nothing behind */
        be = (tide_backend *)1;
        tide_status st = tide_backend_new(ctx, TIDE_BACKEND_CUDA, &be);
        if (have_cuda) {
            assert_int_equal(st, TIDE_OK);
            assert_string_equal(tide_backend_name(be), "cuda");
            assert_false(be->vt->device_is_host);
            assert_true(tide_backend_has_events(be));
            assert_non_null(be->vt->queue_sync);
            assert_non_null(be->vt->host_alloc);
            assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK);
            assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_AUTO), TIDE_OK);
            assert_int_equal(tide_backend_matmul(be), TIDE_MATMUL_FAST); /* AUTO on CUDA */
            tide_backend_free(be);
            continue;
        }
        assert_null(be);
#ifdef TIDE_HAVE_CUDA
        /* built with CUDA: no usable GPU here (driver or device absent) */
        assert_true(st == TIDE_E_NO_DEVICE || st == TIDE_E_UNSUPPORTED);
        if (st == TIDE_E_NO_DEVICE) assert_non_null(strstr(tide_ctx_last_error(ctx), "CUDA"));
#else
        assert_int_equal(st, TIDE_E_UNSUPPORTED);
#endif
        assert_true(strlen(tide_ctx_last_error(ctx)) > 0);
    }
    tide_backend_free(NULL);
    tide_ctx_free(ctx);
}

/* ------------------------------------------------------------- whole model */

enum { MB = 2, MT = 5, NEW = 6 };

static tide_llama_config model_config(void) {
    tide_llama_config c = {
        .name = "backends-test", .hidden_size = 128, .intermediate_size = 352, .num_hidden_layers = 3,
        .num_attention_heads = 4, .num_key_value_heads = 2, .vocab_size = 300,
        .max_position_embeddings = 64, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
        .tie_word_embeddings = false, .dtype = TIDE_BF16,
    };
    return c;
}

/* Logits (MB*MT then MB*1 rows of V) of a prefill and one decode step. */
static float *model_logits(tide_backend *be, tide_ctx *ctx, const int32_t *tok, const int32_t *next) {
    tide_checkpoint *ck = NULL;
    tide_model *m = NULL;
    int V = model_config().vocab_size;
    float *lg = malloc((size_t)(MB * MT + MB) * (size_t)V * sizeof(float));
    assert_non_null(lg);
    assert_int_equal(tide_checkpoint_open(ctx, model_dir, &ck), TIDE_OK);
    tide_model_opts mo = {.max_batch = MB, .ctx_len = 32};
    tk_force_generic(be == ref.be);
    tide_status st = tide_model_new(ctx, ck, be, &mo, &m);
    if (!st) st = tide_model_forward(m, tok, MB, MT, 0, lg);
    if (!st) st = tide_model_forward(m, next, MB, 1, MT, lg + (size_t)MB * MT * V);
    tk_force_generic(false);
    if (st) fail_msg("%s: %s", tide_backend_name(be), tide_ctx_last_error(ctx));
    tide_model_free(m);
    tide_checkpoint_free(ck);
    return lg;
}

static void test_model(void **state) {
    (void)state;
    const int V = model_config().vocab_size;
    int32_t tok[MB * MT], next[MB], prompt[MT];
    for (int i = 0; i < MB * MT; i++) tok[i] = irand(V);
    for (int i = 0; i < MB; i++) next[i] = irand(V);
    memcpy(prompt, tok, sizeof prompt);
    float *want = model_logits(ref.be, ref.ctx, tok, next);
    size_t nl = (size_t)(MB * MT + MB) * (size_t)V;
    double scale = 0;
    for (size_t i = 0; i < nl; i++) scale = fmax(scale, fabs(want[i]));
    /* every backend in its f32 mode, then in its fast mode where it has one:
     * logits near the CPU's (bf16 activations in the fast mode: 3e-2 of the
     * scale), and in each mode an offloaded run bit-identical to a resident
     * one */
    static const tide_matmul_mode modes[2] = {TIDE_MATMUL_F32, TIDE_MATMUL_FAST};
    for (int b = 0; b < n_be; b++)
        for (int mi = 0; mi < 2; mi++) {
            tide_backend *be = bes[b].be;
            tide_ctx *ctx = bes[b].ctx;
            if (tide_backend_set_matmul(be, modes[mi]) != TIDE_OK) {
                tide_err_clear(ctx);
                continue;
            }
            char bn[32];
            snprintf(bn, sizeof bn, "%s/%s", tide_backend_name(be), tide_matmul_name(modes[mi]));
            double bound = modes[mi] == TIDE_MATMUL_FAST ? 3e-2 : 1e-4;
            float *got = model_logits(be, ctx, tok, next);
            double worst = 0;
            for (size_t i = 0; i < nl; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
            print_message("  %-9s model logits: max error %.3g of scale %.3g\n", bn, worst, scale);
            if (!(worst <= bound * scale))
                fail_msg("%s: logits differ from the cpu by %g (scale %g)", bn, worst, scale);
            free(got);

            /* greedy generation: twice resident, then offloaded under half the peak */
            tide_checkpoint *ck = NULL;
            tide_model *m = NULL;
            assert_int_equal(tide_checkpoint_open(ctx, model_dir, &ck), TIDE_OK);
            tide_model_opts mo = {.max_batch = 1, .ctx_len = 32};
            assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
            int32_t g1[NEW], g2[NEW], g3[NEW];
            tide_gen_stats s1, s2, s3;
            tide_status st = tide_model_generate(m, prompt, MT, NEW, g1, &s1);
            if (!st) st = tide_model_generate(m, prompt, MT, NEW, g2, &s2);
            if (st) fail_msg("%s generate: %s", bn, tide_ctx_last_error(ctx));
            assert_memory_equal(g1, g2, sizeof g1);
            assert_true(s1.logits_hash == s2.logits_hash);
            tide_offload_opts o = {.budget_kind = TIDE_BUDGET_FRACTION, .fraction = 0.5, .ssd_dirs = spill_dir,
                                   .hw = "h100-80g"};
            st = tide_model_set_offload(m, &o);
            if (!st) st = tide_model_generate(m, prompt, MT, NEW, g3, &s3);
            if (st) fail_msg("%s offloaded generate: %s", bn, tide_ctx_last_error(ctx));
            assert_memory_equal(g1, g3, sizeof g1);
            if (s1.logits_hash != s3.logits_hash) fail_msg("%s: offloaded logits are not bit-identical", bn);
            assert_true(s3.peak_device_bytes <= s3.budget_bytes);
            print_message("  %-9s generate: resident = offloaded (budget %llu bytes, %llu bytes h2d, %llu pinned)\n",
                          bn, (unsigned long long)s3.budget_bytes, (unsigned long long)s3.bytes_h2d,
                          (unsigned long long)s3.pinned_weight_bytes);
            tide_model_free(m);
            tide_checkpoint_free(ck);
            assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK);
        }
    free(want);
}

/* ------------------------------------------------------------- setup */

static int group_setup(void **state) {
    (void)state;
    snprintf(model_dir, sizeof model_dir, "/tmp/tide-backends-model-XXXXXX");
    snprintf(spill_dir, sizeof spill_dir, "/tmp/tide-backends-spill-XXXXXX");
    if (!mkdtemp(model_dir) || !mkdtemp(spill_dir)) return -1;
    tide_llama_config cfg = model_config();
    tide_ctx *ctx = tide_ctx_new();
    tide_status st = tide_checkpoint_make_synthetic(ctx, &cfg, 11, 0, model_dir);
    if (st) fprintf(stderr, "synthetic checkpoint: %s\n", tide_ctx_last_error(ctx));
    tide_ctx_free(ctx);
    return st ? -1 : 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int group_teardown(void **state) {
    (void)state;
    int a = nftw(model_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    int b = nftw(spill_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return a || b ? -1 : 0;
}

static int open_backends(void) {
    ref.ctx = tide_ctx_new();
    bes[0].ctx = tide_ctx_new();
    if (!ref.ctx || !bes[0].ctx) return -1;
    if (tide_backend_new(ref.ctx, TIDE_BACKEND_CPU, &ref.be) || tide_backend_new(bes[0].ctx, TIDE_BACKEND_CPU, &bes[0].be))
        return -1;
    /* the tolerances at the top are for F32 matmuls (the CPU's AUTO may be
     * FAST); the fast mode has its own test */
    if (tide_backend_set_matmul(ref.be, TIDE_MATMUL_F32) || tide_backend_set_matmul(bes[0].be, TIDE_MATMUL_F32))
        return -1;
    n_be = 1;
    queued.ctx = tide_ctx_new();
    tide_async_opts ao = {.jitter_us = 50, .seed = 5};
    if (!queued.ctx || tide_async_backend_new(queued.ctx, &ao, &queued.be)) return -1;
    bes[1].ctx = tide_ctx_new();
    if (!bes[1].ctx) return -1;
    cuda_status = tide_backend_new(bes[1].ctx, TIDE_BACKEND_CUDA, &bes[1].be);
    if (cuda_status == TIDE_OK) {
        /* the tolerances at the top are for F32 matmuls; the fast mode (the
         * CUDA default) has its own test */
        if (tide_backend_set_matmul(bes[1].be, TIDE_MATMUL_F32)) return -1;
        have_cuda = true;
        n_be = 2;
    } else {
        snprintf(cuda_why, sizeof cuda_why, "%s", tide_ctx_last_error(bes[1].ctx));
    }
    return 0;
}

static void close_backends(void) {
    for (int b = 0; b < MAX_BE; b++) {
        tide_backend_free(bes[b].be);
        tide_ctx_free(bes[b].ctx);
    }
    tide_backend_free(ref.be);
    tide_ctx_free(ref.ctx);
    tide_backend_free(queued.be);
    tide_ctx_free(queued.ctx);
}

/* ------------------------------------------------------------- quantized weights */

/* MATMUL and EMBED with block-quantized weights (tests/quant_ref.h reads
 * the blocks): on CUDA, every type, R in {1, 3, 17, 64}, both matmul modes,
 * against the product in double of x and the dequantized weights: within
 * 2e-5 * sum_k |x_k w_k| where the weights are used as f32 (the GEMV, R < 16
 * in the whole output, and the f32 mode's dequantized tiles), within
 * (2^-7 + 2e-5) * sum_k |x_k w_k| in the fast mode's GEMM (weights and
 * activations each rounded to bf16: 2^-9 each, a factor 2 to spare). The
 * bit contract: row tiles (with weight blocks) of a 64-row product in the
 * fast mode, and of a 12-row one (the GEMV) in both modes, give the whole
 * product's bits. EMBED (also a block of the vocabulary, first and later
 * chunk): bit for bit the dequantized rows. The x . w form with a quantized
 * weight (a frozen weight's input gradient in training), fresh and
 * accumulating, with the op's workspace and one of 7 dequantized rows, on
 * every backend within 2e-5 * sum |terms| of the product in double. */
static const tide_dtype qdts[] = {TIDE_Q8_0, TIDE_Q4_0, TIDE_Q4_K, TIDE_Q5_K, TIDE_Q6_K};
static uint64_t mmq_scratch; /* > 0: the op's workspace cut to this many bytes */

static int tc_qtensor(tcase *c, const char *name, tide_dtype dt, int64_t d0, int64_t d1, const uint8_t *data) {
    int id = -1;
    tide_status st = tide_graph_add_tensor(c->g, name, dt, TIDE_ROLE_WEIGHT, 2, (int64_t[]){d0, d1}, &id);
    if (st) fail_msg("add_tensor %s: %s", name, tide_ctx_last_error(c->ctx));
    assert_true(id < MAX_T);
    size_t nb = (size_t)tide_graph_tensor_bytes(c->g, id);
    c->host[id] = malloc(nb);
    assert_non_null(c->host[id]);
    memcpy(c->host[id], data, nb);
    return id;
}

/* x rows r0.. (rc) times weight rows n0.. (nc) of the quantized wq (N, K),
 * as a whole product or as the tile at (r0, n0) of an (R, N) output; *st
 * gets compute's status, and the result (malloc'd) is the output. */
static float *mmq_run(tide_backend *be, tide_dtype dt, const float *xs, const uint8_t *wq, int64_t R, int64_t K,
                      int64_t N, int64_t r0, int64_t rc, int64_t n0, int64_t nc, bool whole, tide_status *st) {
    tcase c;
    tc_open(&c, "quantized matmul");
    size_t rb = (size_t)tide_dtype_bytes(dt, (uint64_t)K);
    int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, rc, K, 0, 0);
    int w = tc_qtensor(&c, "w", dt, nc, K, wq + (size_t)n0 * rb);
    int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, whole ? rc : R, whole ? nc : N, 0, 0);
    memcpy(c.host[x], xs + r0 * K, (size_t)(rc * K) * sizeof(float));
    tc_op(&c, TIDE_OP_MATMUL, whole ? 2 : 3, (int[]){x, w, o}, 1, &o,
          &(tide_op_args){.row0 = whole ? 0 : r0, .col0 = whole ? 0 : n0});
    if (mmq_scratch) {
        assert_true(mmq_scratch <= c.g->ops[c.op].scratch_bytes);
        c.g->ops[c.op].scratch_bytes = mmq_scratch;
    }
    void *res[MAX_T];
    *st = tc_run(&c, be, res);
    tk_force_generic(false);
    float *r = res[o];
    res[o] = NULL;
    res_free(res, tide_graph_n_tensors(c.g));
    tc_close(&c);
    return r;
}

/* The tiles (rt rows x nb weight rows) of an (R, N) product must give the
 * whole product's bits; returns the elements that differ. */
static int64_t mmq_tiles_differ(tide_backend *be, tide_dtype dt, const float *xs, const uint8_t *wq, int64_t R,
                                int64_t K, int64_t N, int64_t rt, int64_t nb, const float *whole) {
    float *got = calloc((size_t)(R * N), sizeof(float));
    assert_non_null(got);
    for (int64_t r0 = 0; r0 < R; r0 += rt)
        for (int64_t n0 = 0; n0 < N; n0 += nb) {
            int64_t rc = TIDE_MIN(rt, R - r0), nc = TIDE_MIN(nb, N - n0);
            tide_status st;
            float *o = mmq_run(be, dt, xs, wq, R, K, N, r0, rc, n0, nc, false, &st);
            assert_int_equal(st, TIDE_OK);
            for (int64_t r = r0; r < r0 + rc; r++) memcpy(got + r * N + n0, o + r * N + n0, (size_t)nc * 4);
            free(o);
        }
    int64_t diff = 0;
    for (int64_t i = 0; i < R * N; i++) diff += memcmp(&got[i], &whole[i], 4) != 0;
    free(got);
    return diff;
}

static void test_matmul_quant(void **state) {
    (void)state;
    enum { K = 512, N = 40, RMAX = 64 };
    static const int64_t Rs[] = {1, 3, 17, 64};
    float *xs = malloc((size_t)(RMAX * K) * sizeof(float)), *wf = malloc((size_t)(N * K) * sizeof(float));
    uint8_t *wq = malloc((size_t)N * (size_t)K * 2);
    assert_true(xs && wf && wq);
    for (int64_t i = 0; i < RMAX * K; i++) xs[i] = frand();
    int checked = 0;
    for (size_t d = 0; d < sizeof qdts / sizeof qdts[0]; d++) {
        tide_dtype dt = qdts[d];
        size_t rb = (size_t)tide_dtype_bytes(dt, K);
        qref_fill(dt, wq, rb * N, rnd);
        for (int64_t n = 0; n < N; n++) assert_int_equal(qref_dequant_row(dt, wq + n * rb, K, wf + n * K), 0);
        for (int b = 0; b < n_be; b++) {
            tide_backend *be = bes[b].be;
            bool cuda = be->kind == TIDE_BACKEND_CUDA;
            for (int mode = 0; mode < 2; mode++) {
                assert_int_equal(tide_backend_set_matmul(be, mode ? TIDE_MATMUL_FAST : TIDE_MATMUL_F32), TIDE_OK);
                for (size_t ri = 0; ri < sizeof Rs / sizeof Rs[0]; ri++) {
                    int64_t R = Rs[ri];
                    tide_status st;
                    float *o = mmq_run(be, dt, xs, wq, R, K, N, 0, R, 0, N, true, &st);
                    if (st) fail_msg("%s matmul %s R=%lld: %s", tide_backend_name(be), tide_dtype_name(dt),
                                     (long long)R, tide_ctx_last_error(bes[b].ctx));
                    /* CUDA: the weights' values in f32 (or bf16 tiles in the fast GEMM); the CPU rounds
                     * x to 8 bits per block of 32 (scale amax/127: at most amax/254 off an element) in
                     * either mode, so its bound adds sum_k |w_k| * amax(x's block of k) / 254 */
                    double rtol = cuda && mode && R >= 16 ? 0x1p-7 + 2e-5 : 2e-5, worst = 0;
                    for (int64_t r = 0; r < R; r++)
                        for (int64_t n = 0; n < N; n++) {
                            double s = 0, a = 0, xq = 0;
                            for (int64_t k = 0; k < K; k++) {
                                double p = (double)xs[r * K + k] * (double)wf[n * K + k];
                                s += p;
                                a += fabs(p);
                                if (!cuda) {
                                    double amax = 0;
                                    for (int64_t j = k / 32 * 32; j < k / 32 * 32 + 32; j++)
                                        amax = fmax(amax, fabs((double)xs[r * K + j]));
                                    xq += fabs((double)wf[n * K + k]) * amax / 254 * (1 + 1e-6);
                                }
                            }
                            double err = fabs((double)o[r * N + n] - s);
                            if (!cuda) a += xq / rtol;
                            if (!(err <= rtol * a))
                                fail_msg("%s %s mode matmul %s R=%lld: [%lld][%lld] = %.9g, want %.9g (error %.3g "
                                         "> %.3g)", tide_backend_name(be), mode ? "fast" : "f32", tide_dtype_name(dt),
                                         (long long)R, (long long)r, (long long)n, o[r * N + n], s, err, rtol * a);
                            if (a > 0 && err / (rtol * a) > worst) worst = err / (rtol * a);
                        }
                    print_message("  %s %s mode matmul %s R=%lld: worst error/bound %.3g\n", tide_backend_name(be),
                                  mode ? "fast" : "f32", tide_dtype_name(dt), (long long)R, worst);
                    /* the bit contract: the GEMM path in the fast mode, the GEMV in both */
                    if (R == RMAX && (mode || !cuda)) {
                        int64_t diff = mmq_tiles_differ(be, dt, xs, wq, R, K, N, 17, 16, o);
                        if (diff)
                            fail_msg("%s fast mode matmul %s: row tiles of 17 x 16 differ from the whole (%lld x %d) "
                                     "in %lld elements", tide_backend_name(be), tide_dtype_name(dt), (long long)R, N,
                                     (long long)diff);
                        /* a workspace for 7 weight rows and 7 x rows: 6 weight tiles, 10 row chunks */
                        mmq_scratch = 2 * 7 * K * 2;
                        float *o7 = mmq_run(be, dt, xs, wq, R, K, N, 0, R, 0, N, true, &st);
                        mmq_scratch = 0;
                        assert_int_equal(st, TIDE_OK);
                        if (memcmp(o7, o, (size_t)(R * N) * sizeof(float)))
                            fail_msg("%s fast mode matmul %s: a workspace of 7 rows changes the bits",
                                     tide_backend_name(be), tide_dtype_name(dt));
                        free(o7);
                    }
                    if (R == RMAX && !mode) {
                        /* a workspace for 7 f32 weight rows: 6 tiles, each within the bound */
                        mmq_scratch = 7 * K * 4;
                        float *o7 = mmq_run(be, dt, xs, wq, R, K, N, 0, R, 0, N, true, &st);
                        mmq_scratch = 0;
                        assert_int_equal(st, TIDE_OK);
                        for (int64_t i = 0; i < R * N; i++) {
                            double a = 0;
                            for (int64_t k = 0; k < K; k++) a += fabs((double)xs[i / N * K + k] * wf[i % N * K + k]);
                            if (!(fabs((double)o7[i] - (double)o[i]) <= 4e-5 * a))
                                fail_msg("%s f32 mode matmul %s, a workspace of 7 rows: [%lld] = %.9g, whole %.9g",
                                         tide_backend_name(be), tide_dtype_name(dt), (long long)i, o7[i], o[i]);
                        }
                        free(o7);
                    }
                    free(o);
                    checked++;
                }
                /* the GEMV (fewer than 16 rows in the whole output): tiles of 5 rows of 12 */
                if (cuda) {
                    tide_status st;
                    float *o = mmq_run(be, dt, xs, wq, 12, K, N, 0, 12, 0, N, true, &st);
                    assert_int_equal(st, TIDE_OK);
                    int64_t diff = mmq_tiles_differ(be, dt, xs, wq, 12, K, N, 5, 24, o);
                    if (diff)
                        fail_msg("%s %s mode matmul %s: row tiles of 5 x 24 differ from the whole (12 x %d) in %lld "
                                 "elements", tide_backend_name(be), mode ? "fast" : "f32", tide_dtype_name(dt), N,
                                 (long long)diff);
                    free(o);
                }
            }
            assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK);
            /* the x . w form (w (K, N), a frozen quantized weight's input gradient): the first
             * 64 * 256 elements of wq read as (64, 256), R = 3 (CPU: the fused kernel) and 20
             * (sgemm), fresh and accumulating, against the product in double */
            enum { KK = 64, NN = 256 };
            size_t rb2 = (size_t)tide_dtype_bytes(dt, NN);
            float *wk = malloc(sizeof(float) * KK * NN);
            assert_non_null(wk);
            for (int64_t k = 0; k < KK; k++) assert_int_equal(qref_dequant_row(dt, wq + k * rb2, NN, wk + k * NN), 0);
            for (int acc = 0; acc < 2; acc++)
                for (int64_t R = 3; R <= 20; R += 17) {
                    tcase c;
                    tc_open(&c, "quantized x . w");
                    int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, KK, 0, 1);
                    int w = tc_qtensor(&c, "w", dt, KK, NN, wq);
                    int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, R, NN, 0, 1);
                    const float *prev = c.host[o]; /* what an accumulating product adds to */
                    tc_op(&c, TIDE_OP_MATMUL, acc ? 3 : 2, (int[]){x, w, o}, 1, &o,
                          &(tide_op_args){.no_transpose = true, .accumulate = acc});
                    /* accumulating, 20 rows: a workspace of 7 dequantized rows (CUDA: 10 chunks of w's rows) */
                    if (acc && R == 20) c.g->ops[c.op].scratch_bytes = 7 * NN * 4;
                    void *res[MAX_T];
                    tide_status st = tc_run(&c, be, res);
                    if (st) fail_msg("%s x . w %s R=%lld: %s", tide_backend_name(be), tide_dtype_name(dt),
                                     (long long)R, tide_ctx_last_error(bes[b].ctx));
                    const float *xv = c.host[x], *y = res[o];
                    double worst = 0;
                    for (int64_t r = 0; r < R; r++)
                        for (int64_t n = 0; n < NN; n++) {
                            double s = acc ? (double)prev[r * NN + n] : 0, a = fabs(s);
                            for (int64_t k = 0; k < KK; k++) {
                                double p = (double)xv[r * KK + k] * (double)wk[k * NN + n];
                                s += p;
                                a += fabs(p);
                            }
                            double err = fabs((double)y[r * NN + n] - s);
                            if (!(err <= 2e-5 * a + 1e-30))
                                fail_msg("%s x . w %s R=%lld%s: [%lld][%lld] = %.9g, want %.9g", tide_backend_name(be),
                                         tide_dtype_name(dt), (long long)R, acc ? " accumulating" : "", (long long)r,
                                         (long long)n, y[r * NN + n], s);
                            if (a > 0 && err / (2e-5 * a) > worst) worst = err / (2e-5 * a);
                        }
                    print_message("  %s x . w %s R=%lld%s: worst error/bound %.3g\n", tide_backend_name(be),
                                  tide_dtype_name(dt), (long long)R, acc ? " accumulating" : "", worst);
                    tk_force_generic(false);
                    res_free(res, tide_graph_n_tensors(c.g));
                    tc_close(&c);
                    checked++;
                }
            free(wk);
        }
    }
    if (!checked) print_message("  no backend under test runs quantized matmuls (cpu: refused, as checked)\n");
    free(xs);
    free(wf);
    free(wq);
}

static void test_embed_quant(void **state) {
    (void)state;
    enum { V = 40, D = 512, R = 7, B = 2, T = 8, IDX0 = 3 };
    static const int64_t blocks[][2] = {{0, V}, {10, 25}};
    uint8_t *tq = malloc((size_t)V * D * 2);
    float *tf = malloc((size_t)(V * D) * sizeof(float));
    assert_true(tq && tf);
    for (size_t d = 0; d < sizeof qdts / sizeof qdts[0]; d++) {
        tide_dtype dt = qdts[d];
        size_t rb = (size_t)tide_dtype_bytes(dt, D);
        qref_fill(dt, tq, rb * V, rnd);
        for (int64_t v = 0; v < V; v++) assert_int_equal(qref_dequant_row(dt, tq + v * rb, D, tf + v * D), 0);
        for (int k = 0; k < 2; k++)
            for (int later = 0; later < (k ? 2 : 1); later++) {
                int64_t v0 = blocks[k][0], Vb = blocks[k][1] - v0;
                char what[96];
                snprintf(what, sizeof what, "%s ids [%lld,%lld) of %d D=%d %s", tide_dtype_name(dt), (long long)v0,
                         (long long)(v0 + Vb), V, D, later ? "later" : "first");
                tcase c;
                tc_open(&c, what);
                int tab = tc_qtensor(&c, "table", dt, Vb, D, tq + (size_t)v0 * rb);
                int tok = tc_tensor(&c, "tokens", TIDE_I32, TIDE_ROLE_INPUT, B, T, 0, 0);
                int out = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_TEMP, R, D, 0, 1);
                int32_t *ids = c.host[tok];
                for (int i = 0; i < B * T; i++) ids[i] = V; /* outside the tile: out of range if read */
                for (int r = 0; r < R; r++) ids[IDX0 + r] = r ? irand(V) : (int32_t)(v0 + Vb - 1);
                tc_op(&c, TIDE_OP_EMBED, later ? 3 : 2, (int[]){tab, tok, out}, 1, &out,
                      &(tide_op_args){.idx0 = IDX0, .vocab0 = v0, .vocab = V});
                float *e = tc_expect_init(&c, out);
                for (int r = 0; r < R; r++) {
                    int64_t id = ids[IDX0 + r] - v0;
                    if (id >= 0 && id < Vb) memcpy(e + r * D, tf + (v0 + id) * D, (size_t)D * sizeof(float));
                    else if (!later) memset(e + r * D, 0, (size_t)D * sizeof(float));
                }
                for (int b = 0; b < n_be; b++) {
                    tide_backend *be = bes[b].be;
                    void *res[MAX_T];
                    tide_status st = tc_run(&c, be, res);
                    tk_force_generic(false);
                    if (st) fail_msg("%s embed %s: %s", tide_backend_name(be), what, tide_ctx_last_error(bes[b].ctx));
                    if (memcmp(res[out], e, (size_t)(R * D) * sizeof(float)))
                        fail_msg("%s embed %s: not the dequantized rows bit for bit", tide_backend_name(be), what);
                    res_free(res, tide_graph_n_tensors(c.g));
                }
                tc_close(&c);
            }
    }
    free(tq);
    free(tf);
}

/* `test_backends PATTERN` runs only the cases whose names match it, and
 * `test_backends --skip PATTERN` all but those (cmocka's patterns: * and ?
 * wildcards), e.g. "test_take_last*". `test_backends --gpu [...]` is the
 * ctest entry test_backends_gpu: skipped (77) at once without a GPU, else the
 * same run; the plain entry passes on its CPU cases alone. */
int main(int argc, char **argv) {
    bool need_gpu = argc > 1 && !strcmp(argv[1], "--gpu");
    if (need_gpu) argc--, argv++;
    if (argc > 2 && !strcmp(argv[1], "--skip"))
        cmocka_set_skip_filter(argv[2]);
    else if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    if (open_backends()) {
        fprintf(stderr, "cannot create the cpu backends\n");
        return 1;
    }
    if (have_cuda)
        printf("CUDA: device present; every case runs on cpu and cuda\n");
    else
        printf("CUDA: %s (%s); GPU cases skipped%s\n", cuda_why, tide_status_str(cuda_status),
               need_gpu ? "" : ", the cpu cases run (test_backends_gpu reports the skip)");
    fflush(stdout);
    if (need_gpu && !have_cuda) {
        close_backends();
        return 77; /* skipped, for want of a GPU */
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_selection), cmocka_unit_test(test_memory),      cmocka_unit_test(test_streams),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_embed),     cmocka_unit_test(test_rmsnorm),     cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_rope),      cmocka_unit_test(test_attention),   cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_take_last), cmocka_unit_test(test_argmax),      cmocka_unit_test(test_generic),
        cmocka_unit_test(test_embed_tiled), cmocka_unit_test(test_matmul_tiled), cmocka_unit_test(test_rope_tiled),
        cmocka_unit_test(test_attention_tiled), cmocka_unit_test(test_take_last_tiled),
        cmocka_unit_test(test_matmul_tile_bits),
        cmocka_unit_test(test_matmul_quant), cmocka_unit_test(test_embed_quant),
        cmocka_unit_test(test_pos_rows),
        cmocka_unit_test_setup_teardown(test_matmul_fast, fast_on, fast_off),
        cmocka_unit_test(test_matmul_backward), cmocka_unit_test(test_matmul_gradw), cmocka_unit_test(test_embed_bwd), cmocka_unit_test(test_embed_bwd_block),
        cmocka_unit_test(test_rmsnorm_bwd), cmocka_unit_test(test_rope_bwd), cmocka_unit_test(test_silu_mul_bwd),
        cmocka_unit_test(test_attention_nocache), cmocka_unit_test(test_attention_bwd),
        cmocka_unit_test(test_attention_bwd_workspace),
        cmocka_unit_test(test_cross_entropy), cmocka_unit_test(test_ce_blocks), cmocka_unit_test(test_sumsq), cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_model),
    };
    int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
    close_backends();
    return failed;
}
