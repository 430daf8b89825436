/*
 * test_backends.c - every op on every backend, compared with the CPU backend.
 *
 * The backends under test are a fresh CPU backend (always) and the CUDA
 * backend (when tide_backend_new(TIDE_BACKEND_CUDA) succeeds). Each op is
 * built as a one-op graph through the public API (so its shapes pass graph
 * validation), its tensors filled from a seeded generator, and run through
 * the vtable on buffers from the backend's own alloc/to_device/to_host. The
 * reference is a separate CPU backend. Every backend runs each case twice and
 * must give the same bits both times (determinism), then match the reference:
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
 *   - ATTENTION output: 1e-5 absolute (outputs are averages of values in
 *     [-1, 1]): f32 scores in different orders, expf within 2 ulp.
 *   Each failure names the backend, op, case, element, got, want and bound;
 *   the worst error/bound ratio of every case is printed.
 *
 * Also: the range errors (token id >= vocab, position >= cache) return
 * TIDE_E_RANGE with a message and write nothing; alloc failures are
 * TIDE_E_NOMEM; copies from threads bound to different streams run at once
 * and stay correct; a whole model (synthetic bf16 checkpoint) gives the CPU's
 * logits within 1e-4 of their scale, generates the same tokens twice, and an
 * offloaded run is bit-identical to the resident one on the same backend.
 * Backend selection: AUTO gives CUDA when it works, else the CPU; asking for
 * CUDA without a GPU is TIDE_E_NO_DEVICE with a message, never a crash.
 *
 * Without a GPU every case still runs on the CPU backend (a check of the
 * harness and of CPU determinism), a line says why CUDA was skipped, and the
 * program exits 77 (skipped) if everything else passed.
 */
#include "tide.h"
#include "backend/backend.h"
#include "backend/cpu/kernels.h"

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
    void *host[MAX_T]; /* every tensor's content before the op */
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
    for (int t = 0; t < MAX_T; t++) free(c->host[t]);
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
    size_t nb = (size_t)tide_graph_tensor_bytes(c->g, id), n = nb / tide_dtype_size(dt);
    void *h = malloc(nb ? nb : 1);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) {
        float f = amp * frand();
        switch (dt) {
        case TIDE_F32: ((float *)h)[i] = f; break;
        case TIDE_F16: ((uint16_t *)h)[i] = tide_f32_to_f16(f); break;
        case TIDE_BF16: ((uint16_t *)h)[i] = tide_f32_to_bf16(f); break;
        default: ((int32_t *)h)[i] = 0; break;
        }
    }
    c->host[id] = h;
    return id;
}

static void tc_op(tcase *c, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
                  const tide_op_params *p) {
    tide_status st = tide_graph_add_op(c->g, kind, n_in, in, n_out, out, p, -1, &c->op);
    if (st) fail_msg("add_op %s: %s", tide_op_name(kind), tide_ctx_last_error(c->ctx));
}

/* Runs the case's op on be starting from the host contents; res[t] gets
 * (malloc'd) every tensor's content afterwards. Returns compute's status. */
static tide_status tc_run(const tcase *c, tide_backend *be, void **res) {
    const tide_graph *g = c->g;
    tk_force_generic(be == ref.be); /* the reference: the CPU's portable kernels */
    const tide_op *op = &g->ops[c->op];
    int nt = tide_graph_n_tensors(g);
    void *dev[MAX_T] = {0}, *scratch = NULL;
    for (int t = 0; t < nt; t++) {
        size_t nb = (size_t)tide_graph_tensor_bytes(g, t);
        assert_int_equal(be->vt->alloc(be, nb, &dev[t]), TIDE_OK);
        assert_int_equal(be->vt->to_device(be, dev[t], c->host[t], nb), TIDE_OK);
    }
    if (op->scratch_bytes) assert_int_equal(be->vt->alloc(be, op->scratch_bytes, &scratch), TIDE_OK);
    void *in[TIDE_OP_MAX_IN], *out[TIDE_OP_MAX_OUT];
    for (int i = 0; i < op->n_in; i++) in[i] = dev[op->in[i]];
    for (int i = 0; i < op->n_out; i++) out[i] = dev[op->out[i]];
    tide_status st = be->vt->compute(be, g, op, in, out, scratch);
    if (be->vt->synchronize) assert_int_equal(be->vt->synchronize(be), TIDE_OK);
    for (int t = 0; t < nt; t++) {
        size_t nb = (size_t)tide_graph_tensor_bytes(g, t);
        res[t] = malloc(nb ? nb : 1);
        assert_non_null(res[t]);
        assert_int_equal(be->vt->to_host(be, res[t], dev[t], nb), TIDE_OK);
        be->vt->dealloc(be, dev[t]);
    }
    if (scratch) be->vt->dealloc(be, scratch);
    return st;
}

static void res_free(void **res, int n) {
    for (int t = 0; t < n; t++) free(res[t]);
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
 * and output k must match the reference within tols[k]. */
static void tc_check(const tcase *c, const tol *tols) {
    const tide_op *op = &c->g->ops[c->op];
    int nt = tide_graph_n_tensors(c->g);
    void *want[MAX_T], *r1[MAX_T], *r2[MAX_T];
    tide_status st = tc_run(c, ref.be, want);
    if (st) fail_msg("reference %s (%s): %s", tide_op_name(op->kind), c->what, tide_ctx_last_error(ref.ctx));
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
            tc_op(&c, TIDE_OP_RMSNORM, 2, in, 1, &o, &(tide_op_params){.eps = 1e-5f});
            tc_check(&c, (tol[]){{.atol = 1e-7, .rtol = 1e-6}});
            tc_close(&c);
        }
}

/* One MATMUL case; no_scratch removes the op's scratch (both backends then
 * take their fused, scratch-free path). */
static void matmul_case(tide_dtype dt, int64_t R, int64_t K, int64_t N, bool no_scratch) {
    char what[96];
    snprintf(what, sizeof what, "%s R=%lld K=%lld N=%lld%s", tide_dtype_name(dt), (long long)R, (long long)K,
             (long long)N, no_scratch ? " no scratch" : "");
    tcase c;
    tc_open(&c, what);
    int x = tc_tensor(&c, "x", TIDE_F32, TIDE_ROLE_INPUT, R, K, 0, 1);
    int w = tc_tensor(&c, "w", dt, TIDE_ROLE_WEIGHT, N, K, 0, 1);
    int o = tc_tensor(&c, "y", TIDE_F32, TIDE_ROLE_TEMP, R, N, 0, 1);
    int in[2] = {x, w};
    tc_op(&c, TIDE_OP_MATMUL, 2, in, 1, &o, NULL);
    if (no_scratch) c.g->ops[c.op].scratch_bytes = 0;
    /* scale_rn = sum_k |x_rk| |w_nk| over the weights' exact f32 values */
    float *wf = malloc((size_t)(N * K) * sizeof(float));
    double *scale = malloc((size_t)(R * N) * sizeof(double));
    assert_non_null(wf);
    assert_non_null(scale);
    tide_convert_to_f32(c.host[w], dt, wf, (size_t)(N * K));
    const float *xf = c.host[x];
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += fabs((double)xf[r * K + k] * (double)wf[n * K + k]);
            scale[r * N + n] = s;
        }
    tc_check(&c, (tol[]){{.rtol = 2e-5, .scale = scale}});
    free(scale);
    free(wf);
    tc_close(&c);
}

static void test_matmul(void **state) {
    (void)state;
    /* decode-sized (fused on the GPU), odd K (scalar loads), blocked sgemm */
    static const int64_t shapes[][3] = {{1, 64, 48}, {3, 1000, 300}, {5, 37, 19}, {16, 256, 200}, {40, 1000, 129}};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 5; s++) matmul_case(wdts[d], shapes[s][0], shapes[s][1], shapes[s][2], false);
    /* a weight over the 16 MiB scratch: converted in two blocks */
    matmul_case(TIDE_BF16, 17, 4096, 1100, false);
    matmul_case(TIDE_F16, 20, 96, 70, true);
    matmul_case(TIDE_BF16, 20, 96, 70, true);
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
              &(tide_op_params){.n_heads = H, .head_dim = hd, .rope_theta = cs[i].theta, .batch = B});
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
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const attn_cfg *a = &cs[i];
        int64_t R = (int64_t)a->B * a->T, qd = (int64_t)a->H * a->hd, kd = (int64_t)a->KV * a->hd;
        char what[96];
        snprintf(what, sizeof what, "B=%d T=%d C=%d H=%d KV=%d hd=%d", a->B, a->T, a->C, a->H, a->KV, a->hd);
        tcase c;
        tc_open(&c, what);
        int q = tc_tensor(&c, "q", TIDE_F32, TIDE_ROLE_INPUT, R, qd, 0, 1);
        int k = tc_tensor(&c, "k", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int v = tc_tensor(&c, "v", TIDE_F32, TIDE_ROLE_INPUT, R, kd, 0, 1);
        int pos = tc_tensor(&c, "pos", TIDE_I32, TIDE_ROLE_INPUT, a->T, 0, 0, 0);
        /* caches hold stale values everywhere: only positions <= pos[t] may be read */
        int kc = tc_tensor(&c, "cache.k", TIDE_F32, TIDE_ROLE_STATE, a->B, a->C, kd, 1);
        int vc = tc_tensor(&c, "cache.v", TIDE_F32, TIDE_ROLE_STATE, a->B, a->C, kd, 1);
        int o = tc_tensor(&c, "o", TIDE_F32, TIDE_ROLE_TEMP, R, qd, 0, 1);
        int32_t *p = c.host[pos];
        for (int t = 0; t < a->T; t++) p[t] = a->pos[0] < 0 ? a->pos[1] + t : a->pos[t];
        int in[6] = {q, k, v, pos, kc, vc}, out[3] = {o, kc, vc};
        tc_op(&c, TIDE_OP_ATTENTION, 6, in, 3, out,
              &(tide_op_params){.n_heads = a->H, .n_kv_heads = a->KV, .head_dim = a->hd, .batch = a->B});
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
        tc_op(&c, TIDE_OP_TAKE_LAST, 1, &x, 1, &o, &(tide_op_params){.batch = B});
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
    tc_op(&c, TIDE_OP_GENERIC, 3, in, 2, out, &(tide_op_params){.flops = 1e6});
    tc_check(&c, (tol[]){EXACT, EXACT});
    tc_close(&c);
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
        assert_int_equal(be->vt->to_device(be, d, src, n), TIDE_OK);
        assert_int_equal(be->vt->to_host(be, dst, d, n), TIDE_OK);
        assert_memory_equal(src, dst, n);
        assert_int_equal(be->vt->to_device(be, d, src, 0), TIDE_OK);
        if (be->vt->host_alloc) {
            void *pinned = NULL;
            assert_int_equal(be->vt->host_alloc(be, n, &pinned), TIDE_OK);
            assert_int_equal(be->vt->to_host(be, pinned, d, n), TIDE_OK);
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
} stream_arg;

/* One ADD of the case on be, checked; no cmocka asserts (runs off the main
 * thread). Returns the number of errors. */
static int add_once(tide_backend *be, const tcase *c) {
    size_t nb = (size_t)tide_graph_tensor_bytes(c->g, 0), n = nb / sizeof(float);
    void *d[3] = {0};
    float *z = malloc(nb);
    int err = !z;
    for (int t = 0; t < 3 && !err; t++) err = be->vt->alloc(be, nb, &d[t]) != TIDE_OK;
    for (int t = 0; t < 2 && !err; t++) err = be->vt->to_device(be, d[t], c->host[t], nb) != TIDE_OK;
    if (!err) err = be->vt->compute(be, c->g, &c->g->ops[c->op], d, &d[2], NULL) != TIDE_OK;
    if (!err) err = be->vt->to_host(be, z, d[2], nb) != TIDE_OK;
    const float *x = c->host[0], *y = c->host[1];
    for (size_t i = 0; i < n && !err; i++) err = z[i] != x[i] + y[i];
    for (int t = 0; t < 3; t++)
        if (d[t]) be->vt->dealloc(be, d[t]);
    free(z);
    return err;
}

/* A worker as the executor runs one: bound to its stream, then copies (and on
 * stream 0 computes) in a loop, checking each result. */
static void *stream_worker(void *p) {
    stream_arg *a = p;
    tide_backend *be = a->be;
    if (be->vt->stream_begin && be->vt->stream_begin(be, a->stream) != TIDE_OK) {
        a->errors++;
        return NULL;
    }
    size_t n = (size_t)4 << 20;
    uint32_t *h = malloc(n), *back = malloc(n);
    void *d = NULL;
    if (!h || !back || be->vt->alloc(be, n, &d) != TIDE_OK) {
        a->errors++;
        free(h);
        free(back);
        return NULL;
    }
    for (int it = 0; it < 20; it++) {
        for (size_t i = 0; i < n / 4; i++) h[i] = (uint32_t)(i * 2654435761u) ^ (uint32_t)(a->stream << 24 | it);
        if (be->vt->to_device(be, d, h, n) || be->vt->to_host(be, back, d, n) || memcmp(h, back, n)) a->errors++;
        if (a->add) a->errors += add_once(be, a->add);
    }
    be->vt->dealloc(be, d);
    free(h);
    free(back);
    return NULL;
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
        if (errors) fail_msg("%s: %d errors on concurrent streams (%s)", tide_backend_name(bes[b].be), errors,
                             tide_ctx_last_error(bes[b].ctx));
        if (bes[b].be->vt->stream_begin)
            assert_int_equal(bes[b].be->vt->stream_begin(bes[b].be, 9), TIDE_E_INVALID);
        tc_close(&add);
    }
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
    tide_backend_free(be);
    for (int i = 0; i < 2; i++) { /* twice: a failed attempt leaves nothing behind */
        be = (tide_backend *)1;
        tide_status st = tide_backend_new(ctx, TIDE_BACKEND_CUDA, &be);
        if (have_cuda) {
            assert_int_equal(st, TIDE_OK);
            assert_string_equal(tide_backend_name(be), "cuda");
            assert_false(be->vt->device_is_host);
            assert_non_null(be->vt->stream_begin);
            assert_non_null(be->vt->host_alloc);
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
    for (int b = 0; b < n_be; b++) {
        tide_backend *be = bes[b].be;
        tide_ctx *ctx = bes[b].ctx;
        const char *bn = tide_backend_name(be);
        float *got = model_logits(be, ctx, tok, next);
        double worst = 0;
        for (size_t i = 0; i < nl; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
        print_message("  %-4s model logits: max error %.3g of scale %.3g\n", bn, worst, scale);
        if (!(worst <= 1e-4 * scale)) fail_msg("%s: logits differ from the cpu by %g (scale %g)", bn, worst, scale);
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
                               .hw = TIDE_DATA_PATH "/hw/h100-80g.json"};
        st = tide_model_set_offload(m, &o);
        if (!st) st = tide_model_generate(m, prompt, MT, NEW, g3, &s3);
        if (st) fail_msg("%s offloaded generate: %s", bn, tide_ctx_last_error(ctx));
        assert_memory_equal(g1, g3, sizeof g1);
        if (s1.logits_hash != s3.logits_hash) fail_msg("%s: offloaded logits are not bit-identical", bn);
        assert_true(s3.peak_device_bytes <= s3.budget_bytes);
        print_message("  %-4s generate: resident = offloaded (budget %llu bytes, %llu bytes h2d)\n", bn,
                      (unsigned long long)s3.budget_bytes, (unsigned long long)s3.bytes_h2d);
        tide_model_free(m);
        tide_checkpoint_free(ck);
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
    n_be = 1;
    bes[1].ctx = tide_ctx_new();
    if (!bes[1].ctx) return -1;
    cuda_status = tide_backend_new(bes[1].ctx, TIDE_BACKEND_CUDA, &bes[1].be);
    if (cuda_status == TIDE_OK) {
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
}

int main(void) {
    if (open_backends()) {
        fprintf(stderr, "cannot create the cpu backends\n");
        return 1;
    }
    if (have_cuda)
        printf("CUDA: device present; every case runs on cpu and cuda\n");
    else
        printf("CUDA: %s (%s); GPU cases skipped, the cpu cases run\n", cuda_why, tide_status_str(cuda_status));
    fflush(stdout);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_selection), cmocka_unit_test(test_memory),      cmocka_unit_test(test_streams),
        cmocka_unit_test(test_embed),     cmocka_unit_test(test_rmsnorm),     cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_rope),      cmocka_unit_test(test_attention),   cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_take_last), cmocka_unit_test(test_argmax),      cmocka_unit_test(test_generic),
        cmocka_unit_test(test_model),
    };
    int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
    close_backends();
    if (failed) return failed;
    return have_cuda ? 0 : 77; /* 77: skipped, for want of a GPU */
}
