/*
 * test_kernels_train.c - the CPU kernels of the training ops: the gradients
 * against finite differences and against naive references, their bits
 * against the thread count, the accumulating forms, the loss, the optimizer
 * step, and the cache-less attention forward.
 *
 * Every op is built as a one-op graph through the public API and run through
 * the CPU backend's vtable `compute` on the backend's own buffers, as
 * test_kernels.c does. For each gradient op:
 *   (1) finite differences: on small f32 shapes, the objective J = sum(dy *
 *       forward(inputs)) (the loss itself for CROSS_ENTROPY) is evaluated in
 *       double by a naive forward written here, central differences with step
 *       1e-4 (truncation ~1e-8, rounding ~1e-12), against every element of the
 *       kernel's gradient: |got - fd| <= 1e-5 * max(1, max|fd|) (the
 *       largest seen is 2e-7);
 *   (2) a naive double reference of the analytic gradient on larger shapes
 *       (several tiles, chunks, column blocks), tolerances below;
 *   (3) the same bits for 1, 2 and 3 threads (tide_ctx_set_threads);
 *   (4) the accumulating form against the fresh one plus the previous value.
 * Kernels with an AVX2 path (the softmax rows, attention, silu) run on both paths
 * (tk_force_generic).
 *
 * Tolerances of (2), relative to the size of what is summed, so that a wrong
 * index or a missing term shows as an error of order 1:
 *   - products (MATMUL forms, MATMUL_GRADW, CROSS_ENTROPY's dh and dw):
 *     |got - ref| <= 1e-5 * sum of |terms| (f32 sums of <= 20000 terms);
 *   - RMSNORM_BWD, ROPE_BWD, SILU_MUL_BWD: 1e-5 of the scale of the row's terms;
 *   - ATTENTION_BWD: 5e-6 * max|ref| of the tensor (an f32 softmax, sgemm sums of
 *     <= 300 terms; the largest error seen is 4e-7);
 *   - CROSS_ENTROPY's loss: 1e-5 relative; SUMSQ: 1e-6 relative (one rounding);
 *   - EMBED_BWD: exact against an f32 sum in row order (the contract's order);
 *   - ADAMW: exact against an f32 transcription of torch's single-tensor
 *     AdamW here (torch's vectorised CPU kernels fuse lerp and addcmul into
 *     FMAs), and 1e-5 of the largest step (lr / bc1) against a double one.
 *
 * What it proves: every CPU training kernel (the backward of each forward op,
 * the fused cross-entropy, SUMSQ, AdamW, MATMUL's transposed and accumulating
 * forms, attention without a cache) against central finite differences of its
 * forward and a double reference of its gradient; the same bits for 1, 2 and
 * 3 threads; accumulating forms against fresh plus previous; AdamW bit for
 * bit against an f32 transcription of torch's (f32, bf16 and f16 with
 * masters, clipped or not, 1-D tensors without decay); bad ids, targets and
 * positions refused.
 */
#include "tide.h"
#include "backend/backend.h"
#include "backend/cpu/kernels.h"

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
    void *bufs[128];
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

static void *fx_buf(fx *f, size_t n) {
    void *p = NULL;
    assert_int_equal(f->be->vt->alloc(f->be, n, &p), TIDE_OK);
    assert_true(f->n_bufs < 128);
    f->bufs[f->n_bufs++] = p;
    return p;
}

static int fx_tensor(fx *f, const char *name, tide_dtype dt, tide_role role, int ndim, int64_t d0, int64_t d1) {
    int64_t shape[2] = {d0, d1};
    int id = -1;
    tide_status st = tide_graph_add_tensor(f->g, name, dt, role, ndim, shape, &id);
    if (st) fail_msg("add_tensor %s: %s", name, tide_ctx_last_error(f->ctx));
    return id;
}

/* A tensor and its buffer (contents as allocated). */
static void *fx_new(fx *f, const char *name, tide_dtype dt, tide_role role, int ndim, int64_t d0, int64_t d1,
                    int *id) {
    *id = fx_tensor(f, name, dt, role, ndim, d0, d1);
    return fx_buf(f, tide_graph_tensor_bytes(f->g, *id));
}

static int fx_op(fx *f, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
                 const tide_op_args *p) {
    int id = -1;
    tide_status st = tide_graph_add_op_args(f->g, kind, n_in, in, n_out, out, p, -1, &id);
    if (st) fail_msg("add_op %s: %s", tide_op_name(kind), tide_ctx_last_error(f->ctx));
    return id;
}

static tide_status fx_run_op(fx *f, const tide_op *op, void *const *in, void *const *out) {
    void *scratch = NULL;
    if (op->scratch_bytes) assert_int_equal(f->be->vt->alloc(f->be, op->scratch_bytes, &scratch), TIDE_OK);
    tide_status st = f->be->vt->compute(f->be, NULL, f->g, op, in, out, scratch);
    if (scratch) f->be->vt->dealloc(f->be, scratch);
    return st;
}

static void fx_run(fx *f, int id, void *const *in, void *const *out) {
    tide_status st = fx_run_op(f, &f->g->ops[id], in, out);
    if (st) fail_msg("%s: %s", tide_op_name(f->g->ops[id].kind), tide_ctx_last_error(f->ctx));
}

/* (3): runs op `id` with 1, 2 and 3 threads, each from the outputs' contents
 * at the call (accumulating and in-place forms read them); every output must
 * have the same bits each time. The outputs are left as computed. */
static void check_threads(fx *f, int id, void *const *in, void *const *out) {
    const tide_op *op = &f->g->ops[id];
    size_t nb[TIDE_OP_MAX_OUT];
    void *init[TIDE_OP_MAX_OUT], *first[TIDE_OP_MAX_OUT];
    for (int j = 0; j < op->n_out; j++) {
        nb[j] = tide_graph_tensor_bytes(f->g, op->out[j]);
        init[j] = malloc(nb[j]);
        first[j] = malloc(nb[j]);
        assert_true(init[j] && first[j]);
        memcpy(init[j], out[j], nb[j]);
    }
    for (int nt = 1; nt <= 3; nt++) {
        for (int j = 0; j < op->n_out; j++) memcpy(out[j], init[j], nb[j]);
        tide_ctx_set_threads(f->ctx, nt);
        fx_run(f, id, in, out);
        for (int j = 0; j < op->n_out; j++) {
            if (nt == 1)
                memcpy(first[j], out[j], nb[j]);
            else if (memcmp(first[j], out[j], nb[j]))
                fail_msg("%s: output %d differs between 1 and %d threads", tide_op_name(op->kind), j, nt);
        }
    }
    tide_ctx_set_threads(f->ctx, 0);
    for (int j = 0; j < op->n_out; j++) {
        free(init[j]);
        free(first[j]);
    }
}

/* Deterministic values in [-1, 1). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

/* Stores n f32 values as dt into dst; `exact` receives what each stands for. */
static void store_as(const float *src, tide_dtype dt, void *dst, float *exact, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (dt == TIDE_F32) {
            ((float *)dst)[i] = exact[i] = src[i];
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

static double *dalloc(size_t n) {
    double *p = calloc(n ? n : 1, sizeof(double));
    assert_non_null(p);
    return p;
}

static double *to_double(const float *x, size_t n) {
    double *p = dalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = x[i];
    return p;
}

static void *copy_of(const void *p, size_t n) {
    void *c = malloc(n ? n : 1);
    assert_non_null(c);
    memcpy(c, p, n);
    return c;
}

/* |got - ref| <= tol * mag[i] (mag NULL: tol * max(1, max|ref|)) for n values. */
static void check_close(const char *what, const float *got, const double *ref, const double *mag, size_t n,
                        double tol) {
    double scale = 1;
    if (!mag)
        for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double lim = tol * (mag ? mag[i] : scale) + 1e-30;
        if (!(fabs((double)got[i] - ref[i]) <= lim))
            fail_msg("%s[%zu]: %.9g vs %.9g (limit %.3g)", what, i, (double)got[i], ref[i], lim);
    }
}

static void on_both_paths(void (*fn)(void)) {
    tk_force_generic(false);
    fn();
    tk_force_generic(true);
    fn();
    tk_force_generic(false);
}

static const tide_dtype wdts[3] = {TIDE_F32, TIDE_F16, TIDE_BF16};

/* ------------------------------------------------------------- finite differences */

/* The state of one objective: its parameters in double and its fixed data. */
typedef struct fdc {
    int R, D, K, N, V, B, T, H, KV, hd;
    double *a, *b, *c; /* the parameters (x, w, ...) */
    const double *dy;  /* the output gradient the objective weights outputs by */
    const int32_t *ids;
    double eps, scale;
    float theta;
} fdc;

typedef double (*fd_obj)(const fdc *c);

/* (1): central differences of J at each of p's n elements against got. */
static void check_fd(const char *what, fdc *c, fd_obj J, double *p, size_t n, const float *got) {
    double *g = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        double s = p[i], h = 1e-4 * fmax(1.0, fabs(s));
        p[i] = s + h;
        double jp = J(c);
        p[i] = s - h;
        double jm = J(c);
        p[i] = s;
        g[i] = (jp - jm) / (2 * h);
    }
    char nm[96];
    snprintf(nm, sizeof nm, "%s (finite differences)", what);
    check_close(nm, got, g, NULL, n, 1e-5);
    free(g);
}

/* sum dy . (x w^T): x a (R, K), w b (N, K). */
static double obj_matmul(const fdc *c) {
    double J = 0;
    for (int r = 0; r < c->R; r++)
        for (int n = 0; n < c->N; n++) {
            double s = 0;
            for (int k = 0; k < c->K; k++) s += c->a[r * c->K + k] * c->b[n * c->K + k];
            J += c->dy[r * c->N + n] * s;
        }
    return J;
}

/* sum dy . table[ids]: table a (V, D). */
static double obj_embed(const fdc *c) {
    double J = 0;
    for (int r = 0; r < c->R; r++)
        for (int d = 0; d < c->D; d++) J += c->dy[r * c->D + d] * c->a[c->ids[r] * c->D + d];
    return J;
}

/* sum dy . rmsnorm(x a (R, D), w b (D)). */
static double obj_rmsnorm(const fdc *c) {
    double J = 0;
    for (int r = 0; r < c->R; r++) {
        const double *x = c->a + r * c->D;
        double ss = 0;
        for (int d = 0; d < c->D; d++) ss += x[d] * x[d];
        double rs = 1 / sqrt(ss / c->D + c->eps);
        for (int d = 0; d < c->D; d++) J += c->dy[r * c->D + d] * c->b[d] * x[d] * rs;
    }
    return J;
}

/* ROPE's angle for position p and pair i, formed in f32 as HF does. */
static float rope_angle(int32_t p, int i, int hd, float theta) {
    float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
    return (float)p * inv;
}

/* sum dy . rope(x a (R, H*hd)), positions ids (T), R = B*T. */
static double obj_rope(const fdc *c) {
    double J = 0;
    int half = c->hd / 2, D = c->H * c->hd;
    for (int r = 0; r < c->R; r++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < half; i++) {
                double a = rope_angle(c->ids[r % c->T], i, c->hd, c->theta);
                int o = r * D + h * c->hd + i;
                double x0 = c->a[o], x1 = c->a[o + half];
                J += c->dy[o] * (x0 * cos(a) - x1 * sin(a)) + c->dy[o + half] * (x1 * cos(a) + x0 * sin(a));
            }
    return J;
}

/* Causal GQA attention of fresh sequences in double: q a (R, H*hd), k b, v c
 * (R, KV*hd); o (R, H*hd). */
static void attn_fwd_d(const fdc *c, double *o) {
    int qd = c->H * c->hd, kd = c->KV * c->hd, G = c->H / c->KV;
    double *s = dalloc(c->T);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int t = 0; t < c->T; t++) {
                const double *q = c->a + (b * c->T + t) * qd + h * c->hd;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = c->b + (b * c->T + j) * kd + (h / G) * c->hd;
                    double d = 0;
                    for (int e = 0; e < c->hd; e++) d += q[e] * k[e];
                    s[j] = d / sqrt((double)c->hd);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= t; j++) sum += (s[j] = exp(s[j] - mx));
                double *orow = o + (b * c->T + t) * qd + h * c->hd;
                for (int e = 0; e < c->hd; e++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++) acc += s[j] / sum * c->c[(b * c->T + j) * kd + (h / G) * c->hd + e];
                    orow[e] = acc;
                }
            }
    free(s);
}

static double obj_attention(const fdc *c) {
    size_t n = (size_t)c->B * c->T * c->H * c->hd;
    double *o = dalloc(n), J = 0;
    attn_fwd_d(c, o);
    for (size_t i = 0; i < n; i++) J += c->dy[i] * o[i];
    free(o);
    return J;
}

/* sum dy . silu(gate a) * up b over R*D elements. */
static double obj_silu_mul(const fdc *c) {
    double J = 0;
    for (int i = 0; i < c->R * c->D; i++) J += c->dy[i] * c->a[i] / (1 + exp(-c->a[i])) * c->b[i];
    return J;
}

/* The loss: scale * sum over rows with ids >= 0 of logsumexp(h w^T) - logit[id];
 * h a (R, D), w b (V, D). */
static double obj_cross_entropy(const fdc *c) {
    double J = 0, *l = dalloc(c->V);
    for (int r = 0; r < c->R; r++) {
        if (c->ids[r] < 0) continue;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < c->V; v++) {
            double s = 0;
            for (int d = 0; d < c->D; d++) s += c->a[r * c->D + d] * c->b[v * c->D + d];
            l[v] = s;
            mx = fmax(mx, s);
        }
        for (int v = 0; v < c->V; v++) sum += exp(l[v] - mx);
        J += mx + log(sum) - l[c->ids[r]];
    }
    free(l);
    return c->scale * J;
}

/* ------------------------------------------------------------- matmul forms, gradw */

/* MATMUL no_transpose: dx = dy . w, the input gradient of x . w^T, w (N, K) of
 * wdt; finite differences of obj_matmul in x, and MATMUL_GRADW's dw = dy^T . x
 * in w. */
static void test_matmul_fd(void **state) {
    (void)state;
    const int R = 3, K = 5, N = 4;
    fx f;
    fx_open(&f);
    int x, w, dy, dx, dw;
    float *xb = fx_new(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, K, &x);
    float *wb = fx_new(&f, "w", TIDE_F32, TIDE_ROLE_WEIGHT, 2, N, K, &w);
    float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, N, &dy);
    float *dxb = fx_new(&f, "dx", TIDE_F32, TIDE_ROLE_TEMP, 2, R, K, &dx);
    float *dwb = fx_new(&f, "dw", TIDE_F32, TIDE_ROLE_TEMP, 2, N, K, &dw);
    fill(xb, R * K, 1);
    fill(wb, N * K, 1);
    fill(dyb, R * N, 1);
    tide_op_args nt = {.no_transpose = true};
    int i1[2] = {dy, w}, i2[2] = {dy, x};
    int a = fx_op(&f, TIDE_OP_MATMUL, 2, i1, 1, &dx, &nt);
    int b = fx_op(&f, TIDE_OP_MATMUL_GRADW, 2, i2, 1, &dw, NULL);
    void *ia[2] = {dyb, wb}, *oa[1] = {dxb}, *ib[2] = {dyb, xb}, *ob[1] = {dwb};
    fx_run(&f, a, ia, oa);
    fx_run(&f, b, ib, ob);
    fdc c = {.R = R, .K = K, .N = N, .a = to_double(xb, R * K), .b = to_double(wb, N * K)};
    double *dyd = to_double(dyb, R * N);
    c.dy = dyd;
    check_fd("matmul dx", &c, obj_matmul, c.a, R * K, dxb);
    check_fd("matmul_gradw", &c, obj_matmul, c.b, N * K, dwb);
    free(c.a);
    free(c.b);
    free(dyd);
    fx_close(&f);
}

/* out (R, N) = x (R, K) . w, w (K, N) (w_kn) or (N, K), both compared with a
 * double reference; the exact values of 16-bit weights in `wx`. */
static void check_product(const char *what, const float *x, const float *wx, bool w_kn, int R, int K, int N,
                          const float *out, const float *prev) {
    double *ref = dalloc((size_t)R * N), *mag = dalloc((size_t)R * N);
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) {
            double s = prev ? prev[r * N + n] : 0, m = prev ? fabs(prev[r * N + n]) : 0;
            for (int k = 0; k < K; k++) {
                double t = (double)x[r * K + k] * (w_kn ? wx[k * N + n] : wx[n * K + k]);
                s += t;
                m += fabs(t);
            }
            ref[r * N + n] = s;
            mag[r * N + n] = m;
        }
    check_close(what, out, ref, mag, (size_t)R * N, 1e-5);
    free(ref);
    free(mag);
}

/* The new MATMUL forms on every weight dtype: fused (few rows) and sgemm tiles,
 * widened in one block or (a smaller scratch) in several; fresh and
 * accumulating; the same bits for 1-3 threads. */
static void test_matmul_forms(void **state) {
    (void)state;
    static const int shapes[2][3] = {{5, 40, 33}, {256, 136, 200}};
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 3; k++)
            for (int kn = 0; kn < 2; kn++) {
                const int R = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
                fx f;
                fx_open(&f);
                int x, w, o;
                float *xb = fx_new(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, K, &x);
                void *wb = fx_new(&f, "w", wdts[k], TIDE_ROLE_WEIGHT, 2, kn ? K : N, kn ? N : K, &w);
                float *ob = fx_new(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, R, N, &o);
                float *ws = malloc((size_t)K * N * 4), *wx = malloc((size_t)K * N * 4);
                assert_true(ws && wx);
                fill(xb, (size_t)R * K, 1);
                fill(ws, (size_t)K * N, 1);
                store_as(ws, wdts[k], wb, wx, (size_t)K * N);
                tide_op_args fresh = {.no_transpose = kn}, acc = {.no_transpose = kn, .accumulate = true};
                int i2[2] = {x, w}, i3[3] = {x, w, o};
                int id_f = kn ? fx_op(&f, TIDE_OP_MATMUL, 2, i2, 1, &o, &fresh) : -1;
                int id_a = fx_op(&f, TIDE_OP_MATMUL, 3, i3, 1, &o, &acc);
                void *ip[3] = {xb, wb, ob}, *op[1] = {ob};
                char nm[64];
                snprintf(nm, sizeof nm, "matmul %s %s R%d", kn ? "x.w" : "x.w^T +=", tide_dtype_name(wdts[k]), R);
                float *fr = NULL;
                if (kn) {
                    check_threads(&f, id_f, ip, op);
                    check_product(nm, xb, wx, true, R, K, N, ob, NULL);
                    fr = copy_of(ob, (size_t)R * N * 4);
                    /* several widened blocks: a scratch of 37 columns */
                    tide_op small = f.g->ops[id_f];
                    if (small.scratch_bytes) {
                        small.scratch_bytes = (uint64_t)K * 4 * 37;
                        assert_int_equal(fx_run_op(&f, &small, ip, op), TIDE_OK);
                        check_product(nm, xb, wx, true, R, K, N, ob, NULL);
                    }
                }
                /* (4) out += product from a previous value */
                float *prev = malloc((size_t)R * N * 4);
                assert_non_null(prev);
                fill(prev, (size_t)R * N, 2);
                memcpy(ob, prev, (size_t)R * N * 4);
                check_threads(&f, id_a, ip, op);
                check_product(nm, xb, wx, kn, R, K, N, ob, prev);
                if (fr) { /* fresh + previous, up to the rounding of adding in K blocks */
                    double *sum = dalloc((size_t)R * N), *mag = dalloc((size_t)R * N);
                    for (int i = 0; i < R * N; i++) {
                        sum[i] = (double)prev[i] + fr[i];
                        mag[i] = fabs(prev[i]) + fabs(fr[i]) + 1;
                    }
                    check_close("accumulate vs fresh + previous", ob, sum, mag, (size_t)R * N, 1e-6);
                    free(sum);
                    free(mag);
                }
                free(fr);
                free(prev);
                free(ws);
                free(wx);
                fx_close(&f);
            }
}

/* MATMUL_GRADW on several tiles: reference, threads, accumulate. */
static void test_matmul_gradw(void **state) {
    (void)state;
    const int R = 200, N = 160, K = 192;
    fx f;
    fx_open(&f);
    int dy, x, dw;
    float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, N, &dy);
    float *xb = fx_new(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, K, &x);
    float *dwb = fx_new(&f, "dw", TIDE_F32, TIDE_ROLE_TEMP, 2, N, K, &dw);
    fill(dyb, (size_t)R * N, 1);
    fill(xb, (size_t)R * K, 1);
    int i2[2] = {dy, x}, i3[3] = {dy, x, dw};
    int a = fx_op(&f, TIDE_OP_MATMUL_GRADW, 2, i2, 1, &dw, NULL);
    int b = fx_op(&f, TIDE_OP_MATMUL_GRADW, 3, i3, 1, &dw, NULL);
    void *ip[3] = {dyb, xb, dwb}, *op[1] = {dwb};
    check_threads(&f, a, ip, op);
    double *ref = dalloc((size_t)N * K), *mag = dalloc((size_t)N * K);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int r = 0; r < R; r++) {
                double t = (double)dyb[r * N + n] * xb[r * K + k];
                ref[n * K + k] += t;
                mag[n * K + k] += fabs(t);
            }
    check_close("matmul_gradw", dwb, ref, mag, (size_t)N * K, 1e-5);
    float *fr = copy_of(dwb, (size_t)N * K * 4), *prev = malloc((size_t)N * K * 4);
    assert_non_null(prev);
    fill(prev, (size_t)N * K, 3);
    memcpy(dwb, prev, (size_t)N * K * 4);
    check_threads(&f, b, ip, op);
    for (int i = 0; i < N * K; i++) {
        ref[i] = (double)prev[i] + fr[i];
        mag[i] = fabs(prev[i]) + mag[i] + 1;
    }
    check_close("matmul_gradw accumulate", dwb, ref, mag, (size_t)N * K, 1e-5);
    free(fr);
    free(prev);
    free(ref);
    free(mag);
    fx_close(&f);
}

/* ------------------------------------------------------------- embed_bwd */

static void test_embed_bwd(void **state) {
    (void)state;
    /* (1) small: finite differences of sum dy . table[ids] */
    {
        const int V = 6, D = 3, R = 5;
        fx f;
        fx_open(&f);
        int dy, tok, dt;
        float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &dy);
        int32_t *ids = fx_new(&f, "tok", TIDE_I32, TIDE_ROLE_INPUT, 1, R, 0, &tok);
        float *dtb = fx_new(&f, "dtab", TIDE_F32, TIDE_ROLE_TEMP, 2, V, D, &dt);
        const int32_t want[5] = {2, 0, 2, 5, 1};
        memcpy(ids, want, sizeof want);
        fill(dyb, R * D, 1);
        int in[2] = {dy, tok};
        int id = fx_op(&f, TIDE_OP_EMBED_BWD, 2, in, 1, &dt, NULL);
        void *ip[2] = {dyb, ids}, *op[1] = {dtb};
        fx_run(&f, id, ip, op);
        float tab[V * D];
        fill(tab, V * D, 1);
        fdc c = {.R = R, .D = D, .V = V, .a = to_double(tab, V * D), .ids = want};
        double *dyd = to_double(dyb, R * D);
        c.dy = dyd;
        check_fd("embed_bwd", &c, obj_embed, c.a, V * D, dtb);
        free(c.a);
        free(dyd);
        fx_close(&f);
    }
    /* (2)-(4): three column blocks, repeated ids, rows from idx0 on */
    const int V = 50, D = 700, R = 300, idx0 = 3;
    fx f;
    fx_open(&f);
    int dy, tok, dt;
    float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &dy);
    int32_t *ids = fx_new(&f, "tok", TIDE_I32, TIDE_ROLE_INPUT, 2, 1, R + idx0, &tok);
    float *dtb = fx_new(&f, "dtab", TIDE_F32, TIDE_ROLE_TEMP, 2, V, D, &dt);
    fill(dyb, (size_t)R * D, 1);
    for (int i = 0; i < R + idx0; i++) ids[i] = i < idx0 ? 999 : (int32_t)((i * 7919u) % V);
    tide_op_args p = {.idx0 = idx0};
    int i2[2] = {dy, tok}, i3[3] = {dy, tok, dt};
    int a = fx_op(&f, TIDE_OP_EMBED_BWD, 2, i2, 1, &dt, &p);
    int b = fx_op(&f, TIDE_OP_EMBED_BWD, 3, i3, 1, &dt, &p);
    void *ip[3] = {dyb, ids, dtb}, *op[1] = {dtb};
    for (int i = 0; i < V * D; i++) dtb[i] = NAN; /* written fresh: never read */
    check_threads(&f, a, ip, op);
    float *ref = calloc((size_t)V * D, 4), *prev = malloc((size_t)V * D * 4);
    assert_true(ref && prev);
    fill(prev, (size_t)V * D, 1);
    memcpy(ref, prev, (size_t)V * D * 4);
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d++) ref[ids[idx0 + r] * D + d] += dyb[r * D + d];
    float *fresh = copy_of(dtb, (size_t)V * D * 4);
    memcpy(dtb, prev, (size_t)V * D * 4);
    check_threads(&f, b, ip, op);
    assert_memory_equal(dtb, ref, (size_t)V * D * 4); /* accumulate: prev + rows in order, exactly */
    memset(ref, 0, (size_t)V * D * 4);
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d++) ref[ids[idx0 + r] * D + d] += dyb[r * D + d];
    assert_memory_equal(fresh, ref, (size_t)V * D * 4);

    /* an id outside [0, V): TIDE_E_RANGE naming it and its position; nothing written */
    const int32_t bad[2] = {V, -1};
    for (int i = 0; i < 2; i++) {
        int32_t keep = ids[idx0 + 17];
        ids[idx0 + 17] = bad[i];
        memcpy(dtb, prev, (size_t)V * D * 4);
        assert_int_equal(fx_run_op(&f, &f.g->ops[a], ip, op), TIDE_E_RANGE);
        const char *msg = tide_ctx_last_error(f.ctx);
        char want[64];
        snprintf(want, sizeof want, "token id %d at position %d", bad[i], idx0 + 17);
        if (!strstr(msg, want)) fail_msg("message: %s", msg);
        assert_memory_equal(dtb, prev, (size_t)V * D * 4);
        ids[idx0 + 17] = keep;
    }
    free(ref);
    free(prev);
    free(fresh);
    fx_close(&f);
}

/* ------------------------------------------------------------- rmsnorm_bwd */

static void test_rmsnorm_bwd(void **state) {
    (void)state;
    const float eps = 1e-5f;
    /* (1) finite differences in x and w */
    {
        const int R = 3, D = 8;
        fx f;
        fx_open(&f);
        int x, w, dy, dx, dw;
        float *xb = fx_new(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &x);
        float *wb = fx_new(&f, "w", TIDE_F32, TIDE_ROLE_WEIGHT, 1, D, 0, &w);
        float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &dy);
        float *dxb = fx_new(&f, "dx", TIDE_F32, TIDE_ROLE_TEMP, 2, R, D, &dx);
        float *dwb = fx_new(&f, "dw", TIDE_F32, TIDE_ROLE_TEMP, 1, D, 0, &dw);
        fill(xb, R * D, 1);
        fill(wb, D, 1);
        fill(dyb, R * D, 1);
        tide_op_args p = {.eps = eps};
        int in[3] = {x, w, dy}, out[2] = {dx, dw};
        int id = fx_op(&f, TIDE_OP_RMSNORM_BWD, 3, in, 2, out, &p);
        void *ip[3] = {xb, wb, dyb}, *op[2] = {dxb, dwb};
        fx_run(&f, id, ip, op);
        fdc c = {.R = R, .D = D, .eps = eps, .a = to_double(xb, R * D), .b = to_double(wb, D)};
        double *dyd = to_double(dyb, R * D);
        c.dy = dyd;
        check_fd("rmsnorm_bwd dx", &c, obj_rmsnorm, c.a, R * D, dxb);
        check_fd("rmsnorm_bwd dw", &c, obj_rmsnorm, c.b, D, dwb);
        free(c.a);
        free(c.b);
        free(dyd);
        fx_close(&f);
    }
    /* (2)-(4) on f32 and bf16 weights */
    const int R = 200, D = 300;
    for (int k = 0; k < 3; k += 2) {
        fx f;
        fx_open(&f);
        int x, w, dy, dx, dw;
        float *xb = fx_new(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &x);
        void *wb = fx_new(&f, "w", wdts[k], TIDE_ROLE_WEIGHT, 1, D, 0, &w);
        float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &dy);
        float *dxb = fx_new(&f, "dx", TIDE_F32, TIDE_ROLE_TEMP, 2, R, D, &dx);
        float *dwb = fx_new(&f, "dw", TIDE_F32, TIDE_ROLE_TEMP, 1, D, 0, &dw);
        float ws[D], wx[D];
        fill(ws, D, 1.5f);
        store_as(ws, wdts[k], wb, wx, D);
        fill(xb, (size_t)R * D, 2);
        fill(dyb, (size_t)R * D, 1);
        tide_op_args p = {.eps = eps};
        int i3[3] = {x, w, dy}, i4[4] = {x, w, dy, dw}, out[2] = {dx, dw};
        int a = fx_op(&f, TIDE_OP_RMSNORM_BWD, 3, i3, 2, out, &p);
        int b = fx_op(&f, TIDE_OP_RMSNORM_BWD, 4, i4, 2, out, &p);
        void *ip[4] = {xb, wb, dyb, dwb}, *op[2] = {dxb, dwb};
        check_threads(&f, a, ip, op);
        double *rdx = dalloc((size_t)R * D), *mdx = dalloc((size_t)R * D), *rdw = dalloc(D), *mdw = dalloc(D);
        for (int r = 0; r < R; r++) {
            const float *xr = xb + r * D, *dyr = dyb + r * D;
            double ss = 0, dot = 0, adot = 0;
            for (int d = 0; d < D; d++) ss += (double)xr[d] * xr[d];
            double rs = 1 / sqrt(ss / D + eps);
            for (int d = 0; d < D; d++) {
                dot += (double)dyr[d] * wx[d] * xr[d];
                adot += fabs((double)dyr[d] * wx[d] * xr[d]);
            }
            for (int d = 0; d < D; d++) {
                rdx[r * D + d] = rs * dyr[d] * wx[d] - rs * rs * rs * dot / D * xr[d];
                mdx[r * D + d] = rs * fabs(dyr[d] * wx[d]) + rs * rs * rs * adot / D * fabs(xr[d]) + rs;
                rdw[d] += (double)dyr[d] * xr[d] * rs;
                mdw[d] += fabs((double)dyr[d] * xr[d] * rs);
            }
        }
        check_close("rmsnorm_bwd dx", dxb, rdx, mdx, (size_t)R * D, 1e-5);
        check_close("rmsnorm_bwd dw", dwb, rdw, mdw, D, 1e-5);
        /* (4) exactly dw + the fresh gradient (one rounding of a double sum); dx unchanged */
        float *fdx = copy_of(dxb, (size_t)R * D * 4), *fdw = copy_of(dwb, D * 4), prev[D], want[D];
        fill(prev, D, 4);
        for (int d = 0; d < D; d++) want[d] = prev[d] + fdw[d];
        memcpy(dwb, prev, D * 4);
        check_threads(&f, b, ip, op);
        assert_memory_equal(dwb, want, D * 4);
        assert_memory_equal(dxb, fdx, (size_t)R * D * 4);
        free(fdx);
        free(fdw);
        free(rdx);
        free(mdx);
        free(rdw);
        free(mdw);
        fx_close(&f);
    }
}

/* ------------------------------------------------------------- rope_bwd */

static void test_rope_bwd(void **state) {
    (void)state;
    const float theta = 10000.0f;
    /* (1) finite differences, two batch rows at positions from idx0 */
    {
        const int B = 2, T = 3, H = 2, hd = 6, R = B * T, D = H * hd;
        fx f;
        fx_open(&f);
        int dy, pos, dx;
        float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &dy);
        int32_t *pb = fx_new(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T + 1, 0, &pos);
        float *dxb = fx_new(&f, "dx", TIDE_F32, TIDE_ROLE_TEMP, 2, R, D, &dx);
        const int32_t pv[4] = {-1, 5, 17, 3};
        memcpy(pb, pv, sizeof pv);
        fill(dyb, R * D, 1);
        tide_op_args p = {.n_heads = H, .head_dim = hd, .rope_theta = theta, .batch = B, .idx0 = 1};
        int in[2] = {dy, pos};
        int id = fx_op(&f, TIDE_OP_ROPE_BWD, 2, in, 1, &dx, &p);
        void *ip[2] = {dyb, pb}, *op[1] = {dxb};
        fx_run(&f, id, ip, op);
        float x[R * D];
        fill(x, R * D, 1);
        fdc c = {.R = R, .T = T, .H = H, .hd = hd, .theta = theta, .ids = pv + 1, .a = to_double(x, R * D)};
        double *dyd = to_double(dyb, R * D);
        c.dy = dyd;
        check_fd("rope_bwd", &c, obj_rope, c.a, R * D, dxb);
        free(c.a);
        free(dyd);
        fx_close(&f);
    }
    /* (2), (3); and the transpose of ROPE: <rope(x), dy> = <x, rope_bwd(dy)> */
    const int B = 2, T = 64, H = 4, hd = 64, R = B * T, D = H * hd;
    fx f;
    fx_open(&f);
    int dy, pos, dx, x, y;
    float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &dy);
    int32_t *pb = fx_new(&f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T, 0, &pos);
    float *dxb = fx_new(&f, "dx", TIDE_F32, TIDE_ROLE_TEMP, 2, R, D, &dx);
    float *xb = fx_new(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &x);
    float *yb = fx_new(&f, "y", TIDE_F32, TIDE_ROLE_TEMP, 2, R, D, &y);
    for (int t = 0; t < T; t++) pb[t] = 1000 + 37 * t;
    fill(dyb, (size_t)R * D, 1);
    fill(xb, (size_t)R * D, 1);
    tide_op_args p = {.n_heads = H, .head_dim = hd, .rope_theta = theta, .batch = B};
    int i1[2] = {dy, pos}, i2[2] = {x, pos};
    int a = fx_op(&f, TIDE_OP_ROPE_BWD, 2, i1, 1, &dx, &p);
    int b = fx_op(&f, TIDE_OP_ROPE, 2, i2, 1, &y, &p);
    void *ia[2] = {dyb, pb}, *oa[1] = {dxb}, *ib[2] = {xb, pb}, *ob[1] = {yb};
    check_threads(&f, a, ia, oa);
    fx_run(&f, b, ib, ob);
    double *ref = dalloc((size_t)R * D), *mag = dalloc((size_t)R * D), lhs = 0, rhs = 0, amag = 0;
    for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < hd / 2; i++) {
                double an = rope_angle(pb[r % T], i, hd, theta);
                int o = r * D + h * hd + i, o2 = o + hd / 2;
                ref[o] = dyb[o] * cos(an) + dyb[o2] * sin(an);
                ref[o2] = dyb[o2] * cos(an) - dyb[o] * sin(an);
                mag[o] = mag[o2] = fabs(dyb[o]) + fabs(dyb[o2]);
            }
    check_close("rope_bwd", dxb, ref, mag, (size_t)R * D, 1e-5);
    for (int i = 0; i < R * D; i++) {
        lhs += (double)yb[i] * dyb[i];
        rhs += (double)xb[i] * dxb[i];
        amag += fabs((double)xb[i] * dxb[i]);
    }
    if (!(fabs(lhs - rhs) <= 1e-6 * amag)) fail_msg("rope transpose: %.12g vs %.12g", lhs, rhs);
    free(ref);
    free(mag);
    fx_close(&f);
}

/* ------------------------------------------------------------- silu_mul_bwd */

/* (2), (3), gates far out on both sides */
static void silu_mul_bwd_cases(void) {
    const int R = 64, I = 600, n = R * I;
    fx f;
    fx_open(&f);
    int g, u, dy, dg, du;
    float *gb = fx_new(&f, "gate", TIDE_F32, TIDE_ROLE_INPUT, 2, R, I, &g);
    float *ub = fx_new(&f, "up", TIDE_F32, TIDE_ROLE_INPUT, 2, R, I, &u);
    float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, I, &dy);
    float *dgb = fx_new(&f, "dgate", TIDE_F32, TIDE_ROLE_TEMP, 2, R, I, &dg);
    float *dub = fx_new(&f, "dup", TIDE_F32, TIDE_ROLE_TEMP, 2, R, I, &du);
    fill(gb, n, 6);
    fill(ub, n, 1);
    fill(dyb, n, 1);
    gb[0] = 200.0f;
    gb[1] = -200.0f;
    int in[3] = {g, u, dy}, out[2] = {dg, du};
    int id = fx_op(&f, TIDE_OP_SILU_MUL_BWD, 3, in, 2, out, NULL);
    void *ip[3] = {gb, ub, dyb}, *op[2] = {dgb, dub};
    check_threads(&f, id, ip, op);
    double *rg = dalloc(n), *ru = dalloc(n), *mg = dalloc(n), *mu = dalloc(n);
    for (int i = 0; i < n; i++) {
        double x = gb[i], s = 1 / (1 + exp(-x));
        ru[i] = dyb[i] * x * s;
        rg[i] = dyb[i] * ub[i] * (s + x * s * (1 - s));
        mu[i] = fabs(ru[i]) + 1e-3;
        mg[i] = fabs(dyb[i] * ub[i]) * (s + fabs(x) * s * (1 - s)) + 1e-3;
    }
    check_close("silu_mul_bwd dgate", dgb, rg, mg, n, 1e-5);
    check_close("silu_mul_bwd dup", dub, ru, mu, n, 1e-5);
    free(rg);
    free(ru);
    free(mg);
    free(mu);
    fx_close(&f);
}

static void test_silu_mul_bwd(void **state) {
    (void)state;
    /* (1) */
    {
        const int R = 3, I = 5;
        fx f;
        fx_open(&f);
        int g, u, dy, dg, du;
        float *gb = fx_new(&f, "gate", TIDE_F32, TIDE_ROLE_INPUT, 2, R, I, &g);
        float *ub = fx_new(&f, "up", TIDE_F32, TIDE_ROLE_INPUT, 2, R, I, &u);
        float *dyb = fx_new(&f, "dy", TIDE_F32, TIDE_ROLE_INPUT, 2, R, I, &dy);
        float *dgb = fx_new(&f, "dgate", TIDE_F32, TIDE_ROLE_TEMP, 2, R, I, &dg);
        float *dub = fx_new(&f, "dup", TIDE_F32, TIDE_ROLE_TEMP, 2, R, I, &du);
        fill(gb, R * I, 4);
        fill(ub, R * I, 1);
        fill(dyb, R * I, 1);
        int in[3] = {g, u, dy}, out[2] = {dg, du};
        int id = fx_op(&f, TIDE_OP_SILU_MUL_BWD, 3, in, 2, out, NULL);
        void *ip[3] = {gb, ub, dyb}, *op[2] = {dgb, dub};
        fx_run(&f, id, ip, op);
        fdc c = {.R = R, .D = I, .a = to_double(gb, R * I), .b = to_double(ub, R * I)};
        double *dyd = to_double(dyb, R * I);
        c.dy = dyd;
        check_fd("silu_mul_bwd dgate", &c, obj_silu_mul, c.a, R * I, dgb);
        check_fd("silu_mul_bwd dup", &c, obj_silu_mul, c.b, R * I, dub);
        free(c.a);
        free(c.b);
        free(dyd);
        fx_close(&f);
    }
    on_both_paths(silu_mul_bwd_cases);
}

/* ------------------------------------------------------------- attention */

typedef struct att_shape {
    int B, T, H, KV, hd;
} att_shape;

/* One-op graphs over shared q, k, v, pos (0..T-1): the cache-less forward
 * `fwd`, the fresh-cache forward `cached`, and the backward `bwd` reading o. */
typedef struct att_fx {
    fx f;
    att_shape s;
    int fwd, cached, bwd;
    float *q, *k, *v, *o, *o2, *kc, *vc, *dout, *dq, *dk, *dv;
    int32_t *pos;
} att_fx;

static void att_open(att_fx *a, const att_shape *s) {
    a->s = *s;
    fx *f = &a->f;
    fx_open(f);
    const int R = s->B * s->T, qd = s->H * s->hd, kd = s->KV * s->hd;
    int q, k, v, pos, o, o2, kc, vc, dout, dq, dk, dv;
    a->q = fx_new(f, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, R, qd, &q);
    a->k = fx_new(f, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, &k);
    a->v = fx_new(f, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, R, kd, &v);
    a->pos = fx_new(f, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, s->T, 0, &pos);
    a->o = fx_new(f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, R, qd, &o);
    a->o2 = fx_new(f, "o_cached", TIDE_F32, TIDE_ROLE_TEMP, 2, R, qd, &o2);
    int64_t cs[3] = {s->B, s->T, kd};
    assert_int_equal(tide_graph_add_tensor(f->g, "kc", TIDE_F32, TIDE_ROLE_STATE, 3, cs, &kc), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(f->g, "vc", TIDE_F32, TIDE_ROLE_STATE, 3, cs, &vc), TIDE_OK);
    a->kc = fx_buf(f, tide_graph_tensor_bytes(f->g, kc));
    a->vc = fx_buf(f, tide_graph_tensor_bytes(f->g, vc));
    a->dout = fx_new(f, "do", TIDE_F32, TIDE_ROLE_INPUT, 2, R, qd, &dout);
    a->dq = fx_new(f, "dq", TIDE_F32, TIDE_ROLE_TEMP, 2, R, qd, &dq);
    a->dk = fx_new(f, "dk", TIDE_F32, TIDE_ROLE_TEMP, 2, R, kd, &dk);
    a->dv = fx_new(f, "dv", TIDE_F32, TIDE_ROLE_TEMP, 2, R, kd, &dv);
    fill(a->q, (size_t)R * qd, 2);
    fill(a->k, (size_t)R * kd, 1);
    fill(a->v, (size_t)R * kd, 1);
    fill(a->dout, (size_t)R * qd, 1);
    for (int t = 0; t < s->T; t++) a->pos[t] = t;
    tide_op_args p = {.n_heads = s->H, .n_kv_heads = s->KV, .head_dim = s->hd, .batch = s->B};
    int i4[4] = {q, k, v, pos}, c3[3] = {o2, kc, vc}, i6[6] = {q, k, v, o, dout, pos}, g3[3] = {dq, dk, dv};
    a->fwd = fx_op(f, TIDE_OP_ATTENTION, 4, i4, 1, &o, &p);
    a->cached = fx_op(f, TIDE_OP_ATTENTION, 4, i4, 3, c3, &p);
    a->bwd = fx_op(f, TIDE_OP_ATTENTION_BWD, 6, i6, 3, g3, &p);
}

static void att_forward(att_fx *a) {
    void *ip[4] = {a->q, a->k, a->v, a->pos}, *op[1] = {a->o};
    fx_run(&a->f, a->fwd, ip, op);
}

static void att_backward(att_fx *a, bool threads) {
    void *ip[6] = {a->q, a->k, a->v, a->o, a->dout, a->pos}, *op[3] = {a->dq, a->dk, a->dv};
    if (threads)
        check_threads(&a->f, a->bwd, ip, op);
    else
        fx_run(&a->f, a->bwd, ip, op);
}

/* The analytic gradients in double: dq, dk, dv of sum(dout . attn(q, k, v)). */
static void att_bwd_ref(const att_fx *a, double *dq, double *dk, double *dv) {
    const att_shape *s = &a->s;
    const int qd = s->H * s->hd, kd = s->KV * s->hd, G = s->H / s->KV, hd = s->hd;
    double *P = dalloc(s->T), *dP = dalloc(s->T), sc = 1 / sqrt((double)hd);
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->H; h++)
            for (int t = 0; t < s->T; t++) {
                const float *q = a->q + (b * s->T + t) * qd + h * hd, *dor = a->dout + (b * s->T + t) * qd + h * hd;
                double mx = -INFINITY, sum = 0, Dt = 0;
                for (int j = 0; j <= t; j++) {
                    const int64_t kr = (int64_t)(b * s->T + j) * kd + (h / G) * hd;
                    const float *k = a->k + kr, *v = a->v + kr;
                    double d = 0, e = 0;
                    for (int i = 0; i < hd; i++) {
                        d += (double)q[i] * k[i];
                        e += (double)dor[i] * v[i];
                    }
                    P[j] = d * sc;
                    dP[j] = e;
                    mx = fmax(mx, P[j]);
                }
                for (int j = 0; j <= t; j++) sum += (P[j] = exp(P[j] - mx));
                for (int j = 0; j <= t; j++) Dt += (P[j] /= sum) * dP[j];
                for (int j = 0; j <= t; j++) {
                    double ds = P[j] * (dP[j] - Dt);
                    int kr = (b * s->T + j) * kd + (h / G) * hd, qr = (b * s->T + t) * qd + h * hd;
                    for (int i = 0; i < hd; i++) {
                        dq[qr + i] += sc * ds * a->k[kr + i];
                        dk[kr + i] += sc * ds * a->q[qr + i];
                        dv[kr + i] += P[j] * a->dout[qr + i];
                    }
                }
            }
    free(P);
    free(dP);
}

/* (1): finite differences of sum(do . attention(q, k, v)) in q, k and v. */
static void test_attention_bwd_fd(void **state) {
    (void)state;
    const att_shape s = {2, 5, 4, 2, 8};
    att_fx a;
    att_open(&a, &s);
    att_forward(&a);
    att_backward(&a, false);
    const int R = s.B * s.T, qd = s.H * s.hd, kd = s.KV * s.hd;
    fdc c = {.B = s.B, .T = s.T, .H = s.H, .KV = s.KV, .hd = s.hd, .a = to_double(a.q, R * qd),
             .b = to_double(a.k, R * kd), .c = to_double(a.v, R * kd)};
    double *dyd = to_double(a.dout, R * qd);
    c.dy = dyd;
    check_fd("attention_bwd dq", &c, obj_attention, c.a, R * qd, a.dq);
    check_fd("attention_bwd dk", &c, obj_attention, c.b, R * kd, a.dk);
    check_fd("attention_bwd dv", &c, obj_attention, c.c, R * kd, a.dv);
    free(c.a);
    free(c.b);
    free(c.c);
    free(dyd);
    fx_close(&a.f);
}

static const att_shape att_shapes[] = {
    {2, 70, 4, 2, 32},  /* GQA, query blocks of 16 with a tail */
    {1, 300, 2, 1, 64}, /* one kv head for two query heads, blocks of 37 */
    {3, 33, 3, 3, 12},  /* no grouping, head_dim not a multiple of 8 */
    {1, 1, 4, 1, 16},   /* a single position */
};

/* (2), (3) on both code paths. */
static void attention_bwd_cases(void) {
    for (size_t i = 0; i < sizeof att_shapes / sizeof att_shapes[0]; i++) {
        const att_shape *s = &att_shapes[i];
        att_fx a;
        att_open(&a, s);
        att_forward(&a);
        for (size_t j = 0; j < (size_t)s->B * s->T * s->KV * s->hd; j++) a.dk[j] = a.dv[j] = NAN;
        att_backward(&a, true);
        const size_t nq = (size_t)s->B * s->T * s->H * s->hd, nk = (size_t)s->B * s->T * s->KV * s->hd;
        double *dq = dalloc(nq), *dk = dalloc(nk), *dv = dalloc(nk);
        att_bwd_ref(&a, dq, dk, dv);
        check_close("attention_bwd dq", a.dq, dq, NULL, nq, 5e-6);
        check_close("attention_bwd dk", a.dk, dk, NULL, nk, 5e-6);
        check_close("attention_bwd dv", a.dv, dv, NULL, nk, 5e-6);
        free(dq);
        free(dk);
        free(dv);
        fx_close(&a.f);
    }
}

static void test_attention_bwd(void **state) {
    (void)state;
    on_both_paths(attention_bwd_cases);
}

/* The cache-less forward is the fresh-cache forward's o, bit for bit, and its
 * bits do not depend on the thread count. */
static void attention_nocache_cases(void) {
    static const att_shape shapes[] = {{2, 37, 4, 2, 64}, {1, 130, 2, 1, 16}, {2, 9, 3, 3, 12}, {1, 200, 8, 2, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        att_fx a;
        att_open(&a, &shapes[i]);
        void *ip[4] = {a.q, a.k, a.v, a.pos}, *o1[1] = {a.o}, *o3[3] = {a.o2, a.kc, a.vc};
        check_threads(&a.f, a.fwd, ip, o1);
        fx_run(&a.f, a.cached, ip, o3);
        tide_graph *g = a.f.g;
        assert_memory_equal(a.o, a.o2, tide_graph_tensor_bytes(g, g->ops[a.fwd].out[0]));
        fx_close(&a.f);
    }
}

static void test_attention_nocache(void **state) {
    (void)state;
    on_both_paths(attention_nocache_cases);
}

/* Positions other than 0..T-1 are refused by both with TIDE_E_RANGE. */
static void test_attention_bad_pos(void **state) {
    (void)state;
    const att_shape s = {2, 6, 2, 1, 8};
    att_fx a;
    att_open(&a, &s);
    a.pos[3] = 4;
    void *ip[4] = {a.q, a.k, a.v, a.pos}, *o1[1] = {a.o};
    assert_int_equal(fx_run_op(&a.f, &a.f.g->ops[a.fwd], ip, o1), TIDE_E_RANGE);
    if (!strstr(tide_ctx_last_error(a.f.ctx), "'pos'[3] is 4")) fail_msg("%s", tide_ctx_last_error(a.f.ctx));
    void *ib[6] = {a.q, a.k, a.v, a.o, a.dout, a.pos}, *ob[3] = {a.dq, a.dk, a.dv};
    assert_int_equal(fx_run_op(&a.f, &a.f.g->ops[a.bwd], ib, ob), TIDE_E_RANGE);
    if (!strstr(tide_ctx_last_error(a.f.ctx), "'pos'[3] is 4")) fail_msg("%s", tide_ctx_last_error(a.f.ctx));
    fx_close(&a.f);
}

/* ------------------------------------------------------------- cross_entropy */

/* (1): the loss and its gradients against finite differences of the loss,
 * with an ignored row. */
static void test_cross_entropy_fd(void **state) {
    (void)state;
    const int R = 4, V = 7, D = 5;
    fx f;
    fx_open(&f);
    int h, w, tg, loss, dh, dw;
    float *hb = fx_new(&f, "h", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &h);
    float *wb = fx_new(&f, "w", TIDE_F32, TIDE_ROLE_WEIGHT, 2, V, D, &w);
    int32_t *tb = fx_new(&f, "targets", TIDE_I32, TIDE_ROLE_INPUT, 1, R, 0, &tg);
    float *lb = fx_new(&f, "loss", TIDE_F32, TIDE_ROLE_OUTPUT, 1, 1, 0, &loss);
    float *dhb = fx_new(&f, "dh", TIDE_F32, TIDE_ROLE_TEMP, 2, R, D, &dh);
    float *dwb = fx_new(&f, "dw", TIDE_F32, TIDE_ROLE_TEMP, 2, V, D, &dw);
    fill(hb, R * D, 2);
    fill(wb, V * D, 1);
    const int32_t want[4] = {3, -100, 0, 6};
    memcpy(tb, want, sizeof want);
    tide_op_args p = {.scale = 0.37f};
    int in[3] = {h, w, tg}, out[3] = {loss, dh, dw};
    int id = fx_op(&f, TIDE_OP_CROSS_ENTROPY, 3, in, 3, out, &p);
    void *ip[3] = {hb, wb, tb}, *op[3] = {lb, dhb, dwb};
    fx_run(&f, id, ip, op);
    fdc c = {.R = R, .V = V, .D = D, .scale = 0.37f, .ids = want, .a = to_double(hb, R * D),
             .b = to_double(wb, V * D)};
    double J = obj_cross_entropy(&c);
    if (!(fabs(*lb - J) <= 1e-6 * fabs(J))) fail_msg("loss %.9g vs %.9g", *lb, J);
    check_fd("cross_entropy dh", &c, obj_cross_entropy, c.a, R * D, dhb);
    check_fd("cross_entropy dw", &c, obj_cross_entropy, c.b, V * D, dwb);
    for (int d = 0; d < D; d++) assert_true(dhb[D + d] == 0.0f); /* the ignored row */

    /* a frozen head's form (2 outputs: no dw): the same loss and dh bits,
     * 2/3 of the flops, dw's buffer untouched; as a row tile (4 inputs) its
     * loss adds into the 4th */
    float l0 = *lb, *dh0 = malloc(sizeof(float) * R * D), *dw0 = malloc(sizeof(float) * V * D);
    assert_true(dh0 && dw0);
    memcpy(dh0, dhb, sizeof(float) * R * D);
    for (int i = 0; i < V * D; i++) dwb[i] = -7.0f;
    memcpy(dw0, dwb, sizeof(float) * V * D);
    int fz = fx_op(&f, TIDE_OP_CROSS_ENTROPY, 3, in, 2, out, &p);
    assert_true(f.g->ops[fz].flops == f.g->ops[id].flops * 4.0 / 6.0);
    memset(dhb, 0, sizeof(float) * R * D);
    fx_run(&f, fz, ip, op);
    assert_true(memcmp(lb, &l0, sizeof l0) == 0);
    assert_memory_equal(dhb, dh0, sizeof(float) * R * D);
    assert_memory_equal(dwb, dw0, sizeof(float) * V * D);
    int i4[4] = {h, w, tg, loss};
    int fzt = fx_op(&f, TIDE_OP_CROSS_ENTROPY, 4, i4, 2, out, &p);
    void *ip4[4] = {hb, wb, tb, lb};
    *lb = 1.5f;
    fx_run(&f, fzt, ip4, op);
    assert_true(*lb == 1.5f + l0);
    /* refused: a frozen form with a 4th input that is not its loss, or 5
     * inputs; a CE_BLOCK with no dw that would add into one */
    int bad4[4] = {h, w, tg, dh}, bad5[5] = {h, w, tg, dw, loss}, idb = -1;
    assert_int_equal(tide_graph_add_op_args(f.g, TIDE_OP_CROSS_ENTROPY, 4, bad4, 2, out, &p, -1, &idb),
                     TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f.ctx), "must be the loss"));
    assert_int_equal(tide_graph_add_op_args(f.g, TIDE_OP_CROSS_ENTROPY, 5, bad5, 2, out, &p, -1, &idb),
                     TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f.ctx), "takes 3 to 4 inputs"));
    free(dh0);
    free(dw0);
    free(c.a);
    free(c.b);
    fx_close(&f);
}

/* (2)-(4): two chunks of rows (V large enough that a chunk is 167 rows), f32
 * and bf16 weights, the latter also widened in several blocks (a smaller
 * scratch), negative targets; both code paths against one reference; an
 * out-of-range target; no workspace. */
static void test_cross_entropy(void **state) {
    (void)state;
    const int R = 240, V = 50000, D = 8;
    const float scale = 1.0f / 200;
    for (int k = 0; k < 3; k += 2) {
        fx f;
        fx_open(&f);
        int h, w, tg, loss, dh, dw;
        float *hb = fx_new(&f, "h", TIDE_F32, TIDE_ROLE_INPUT, 2, R, D, &h);
        void *wb = fx_new(&f, "w", wdts[k], TIDE_ROLE_WEIGHT, 2, V, D, &w);
        int32_t *tb = fx_new(&f, "targets", TIDE_I32, TIDE_ROLE_INPUT, 1, R, 0, &tg);
        float *lb = fx_new(&f, "loss", TIDE_F32, TIDE_ROLE_OUTPUT, 1, 1, 0, &loss);
        float *dhb = fx_new(&f, "dh", TIDE_F32, TIDE_ROLE_TEMP, 2, R, D, &dh);
        float *dwb = fx_new(&f, "dw", TIDE_F32, TIDE_ROLE_TEMP, 2, V, D, &dw);
        float *ws = malloc((size_t)V * D * 4), *wx = malloc((size_t)V * D * 4);
        assert_true(ws && wx);
        fill(ws, (size_t)V * D, 1);
        store_as(ws, wdts[k], wb, wx, (size_t)V * D);
        fill(hb, (size_t)R * D, 1.5f);
        for (int r = 0; r < R; r++) tb[r] = r % 11 == 5 ? -1 - r % 3 : (int32_t)((r * 104729u) % V);
        tide_op_args p = {.scale = scale};
        int i3[3] = {h, w, tg}, i4[4] = {h, w, tg, dw}, out[3] = {loss, dh, dw};
        int a = fx_op(&f, TIDE_OP_CROSS_ENTROPY, 3, i3, 3, out, &p);
        int b = fx_op(&f, TIDE_OP_CROSS_ENTROPY, 4, i4, 3, out, &p);
        assert_true(tide_ce_chunk_rows(R, V) == 167);
        void *ip[4] = {hb, wb, tb, dwb}, *op[3] = {lb, dhb, dwb};

        /* the reference in double */
        double loss_ref = 0, *l = dalloc(V);
        double *rdh = dalloc((size_t)R * D), *mdh = dalloc((size_t)R * D);
        double *rdw = dalloc((size_t)V * D), *mdw = dalloc((size_t)V * D), *racc = dalloc((size_t)V * D);
        double *macc = dalloc((size_t)V * D);
        for (int r = 0; r < R; r++) {
            if (tb[r] < 0) continue;
            const float *hr = hb + r * D;
            double mx = -INFINITY, sum = 0;
            for (int v = 0; v < V; v++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)hr[d] * wx[v * D + d];
                l[v] = s;
                mx = fmax(mx, s);
            }
            for (int v = 0; v < V; v++) sum += (l[v] = exp(l[v] - mx));
            loss_ref += mx + log(sum) - (log(l[tb[r]]) + mx);
            for (int v = 0; v < V; v++) {
                double gv = scale * (l[v] / sum - (v == tb[r]));
                for (int d = 0; d < D; d++) {
                    rdh[r * D + d] += gv * wx[v * D + d];
                    mdh[r * D + d] += fabs(gv * wx[v * D + d]);
                    rdw[v * D + d] += gv * hr[d];
                    mdw[v * D + d] += fabs(gv * hr[d]);
                }
            }
        }
        loss_ref *= scale;
        free(l);
        for (size_t i = 0; i < (size_t)R * D; i++) mdh[i] += 1e-6;
        for (size_t i = 0; i < (size_t)V * D; i++) mdw[i] += 1e-6;
        float *prev = malloc((size_t)V * D * 4);
        assert_non_null(prev);
        fill(prev, (size_t)V * D, 1);

        for (int path = 0; path < 2; path++) {
            tk_force_generic(path == 1);
            for (size_t i = 0; i < (size_t)V * D; i++) dwb[i] = NAN; /* written fresh: never read */
            if (path == 0) /* (3) on one path: both are deterministic alike */
                check_threads(&f, a, ip, op);
            else
                fx_run(&f, a, ip, op);
            if (!(fabs(*lb - loss_ref) <= 1e-5 * fabs(loss_ref))) fail_msg("loss %.9g vs %.9g", *lb, loss_ref);
            check_close("cross_entropy dh", dhb, rdh, mdh, (size_t)R * D, 1e-5);
            check_close("cross_entropy dw", dwb, rdw, mdw, (size_t)V * D, 1e-5);
            for (int r = 0; r < R; r++)
                if (tb[r] < 0)
                    for (int d = 0; d < D; d++) assert_true(dhb[r * D + d] == 0.0f);
            float *fdw = copy_of(dwb, (size_t)V * D * 4), fl = *lb;
            /* (4) dw += the gradient: the chunks add into the previous value */
            memcpy(dwb, prev, (size_t)V * D * 4);
            if (path == 0)
                check_threads(&f, b, ip, op);
            else
                fx_run(&f, b, ip, op);
            assert_true(*lb == fl);
            for (size_t i = 0; i < (size_t)V * D; i++) {
                racc[i] = (double)prev[i] + fdw[i];
                macc[i] = mdw[i] + fabs(prev[i]);
            }
            check_close("cross_entropy dw accumulate", dwb, racc, macc, (size_t)V * D, 1e-5);
            free(fdw);
            /* several widened blocks of w */
            if (wdts[k] != TIDE_F32) {
                tide_op small = f.g->ops[a];
                small.scratch_bytes -= (uint64_t)V * D * 4 - 3000 * D * 4;
                assert_int_equal(fx_run_op(&f, &small, ip, op), TIDE_OK);
                if (!(fabs(*lb - loss_ref) <= 1e-5 * fabs(loss_ref))) fail_msg("loss %.9g vs %.9g", *lb, loss_ref);
                check_close("cross_entropy dh (blocks)", dhb, rdh, mdh, (size_t)R * D, 1e-5);
                check_close("cross_entropy dw (blocks)", dwb, rdw, mdw, (size_t)V * D, 1e-5);
            }
        }
        tk_force_generic(false);

        /* a target >= V: TIDE_E_RANGE naming row and target, nothing written */
        tb[123] = V;
        memcpy(dwb, prev, (size_t)V * D * 4);
        assert_int_equal(fx_run_op(&f, &f.g->ops[a], ip, op), TIDE_E_RANGE);
        const char *msg = tide_ctx_last_error(f.ctx);
        if (!strstr(msg, "target 50000 of row 123")) fail_msg("message: %s", msg);
        assert_memory_equal(dwb, prev, (size_t)V * D * 4);
        tb[123] = 0;
        /* no workspace: refused, not a crash */
        assert_int_equal(f.be->vt->compute(f.be, NULL, f.g, &f.g->ops[a], ip, op, NULL), TIDE_E_INVALID);
        if (!strstr(tide_ctx_last_error(f.ctx), "workspace")) fail_msg("%s", tide_ctx_last_error(f.ctx));

        free(prev);
        free(rdh);
        free(mdh);
        free(rdw);
        free(mdw);
        free(racc);
        free(macc);
        free(ws);
        free(wx);
        fx_close(&f);
    }
}

/* ------------------------------------------------------------- sumsq */

static void test_sumsq(void **state) {
    (void)state;
    const int R = 2500, C = 1000; /* 2.5 M elements: two groups of blocks */
    fx f;
    fx_open(&f);
    int g, acc, out;
    float *gb = fx_new(&f, "g", TIDE_F32, TIDE_ROLE_INPUT, 2, R, C, &g);
    float *ab = fx_new(&f, "acc", TIDE_F32, TIDE_ROLE_TEMP, 1, 1, 0, &acc);
    float *ob = fx_new(&f, "ss", TIDE_F32, TIDE_ROLE_TEMP, 1, 1, 0, &out);
    fill(gb, (size_t)R * C, 1);
    int i1[1] = {g}, i2[2] = {g, acc};
    int a = fx_op(&f, TIDE_OP_SUMSQ, 1, i1, 1, &out, NULL);
    int b = fx_op(&f, TIDE_OP_SUMSQ, 2, i2, 1, &acc, NULL);
    double ref = 0;
    for (size_t i = 0; i < (size_t)R * C; i++) ref += (double)gb[i] * gb[i];
    void *ia[1] = {gb}, *oa[1] = {ob};
    *ob = NAN;
    check_threads(&f, a, ia, oa);
    if (!(fabs(*ob - ref) <= 1e-6 * ref)) fail_msg("sumsq %.9g vs %.9g", *ob, ref);
    *ab = 12345.5f;
    void *ib[2] = {gb, ab}, *ob2[1] = {ab};
    check_threads(&f, b, ib, ob2);
    if (!(fabs(*ab - (ref + 12345.5)) <= 1e-6 * ref)) fail_msg("sumsq acc %.9g vs %.9g", *ab, ref + 12345.5);
    fx_close(&f);
}

/* ------------------------------------------------------------- adamw */

typedef struct adam_case {
    tide_dtype dt;
    int ndim;
    float beta1, wd, max_norm, sumsq;
} adam_case;

/* Three steps of AdamW on n elements against the f32 transcription of
 * torch's _single_tensor_adamw (with clip_grad_norm_'s scaling first), bit
 * for bit, and against a double one up to 1e-5 of the step. */
static void run_adamw(const adam_case *ac) {
    const int n = 40000, rows = 200;
    const bool master = ac->dt != TIDE_F32;
    const float lr = 3e-3f, beta2 = 0.95f, eps = 1e-8f;
    fx f;
    fx_open(&f);
    int pt, mt = -1, m1, v1, gt, ht, st;
    void *pb = fx_new(&f, "param", ac->dt, TIDE_ROLE_STATE, ac->ndim, ac->ndim == 2 ? rows : n, n / rows, &pt);
    float *mb = master ? fx_new(&f, "master", TIDE_F32, TIDE_ROLE_STATE, 1, n, 0, &mt) : NULL;
    float *m = fx_new(&f, "m", TIDE_F32, TIDE_ROLE_STATE, 1, n, 0, &m1);
    float *v = fx_new(&f, "v", TIDE_F32, TIDE_ROLE_STATE, 1, n, 0, &v1);
    float *gr = fx_new(&f, "grad", TIDE_F32, TIDE_ROLE_TEMP, 1, n, 0, &gt);
    float *hy = fx_new(&f, "hyper", TIDE_F32, TIDE_ROLE_INPUT, 1, 4, 0, &ht);
    float *ss = fx_new(&f, "sumsq", TIDE_F32, TIDE_ROLE_TEMP, 1, 1, 0, &st);
    float *P = malloc(n * 4), *M = malloc(n * 4), *Vv = malloc(n * 4), *src = malloc(n * 4);
    double *Pd = dalloc(n), *Md = dalloc(n), *Vd = dalloc(n);
    assert_true(P && M && Vv && src);
    fill(src, n, 0.5f);
    if (master) {
        store_as(src, ac->dt, pb, mb, n); /* the master starts as the parameter's value */
        memcpy(P, mb, n * 4);
    } else {
        memcpy(pb, src, n * 4);
        memcpy(P, src, n * 4);
    }
    memset(m, 0, n * 4);
    memset(v, 0, n * 4);
    memset(M, 0, n * 4);
    memset(Vv, 0, n * 4);
    for (int i = 0; i < n; i++) Pd[i] = P[i];
    tide_op_args p = {.beta1 = ac->beta1, .beta2 = beta2, .adam_eps = eps, .weight_decay = ac->wd,
                        .max_norm = ac->max_norm};
    int in7[7] = {pt, mt, m1, v1, gt, ht, st}, out4[4] = {pt, mt, m1, v1};
    int in6[6] = {pt, m1, v1, gt, ht, st}, out3[3] = {pt, m1, v1};
    int id = master ? fx_op(&f, TIDE_OP_ADAMW, 7, in7, 4, out4, &p) : fx_op(&f, TIDE_OP_ADAMW, 6, in6, 3, out3, &p);
    void *ip7[7] = {pb, mb, m, v, gr, hy, ss}, *op4[4] = {pb, mb, m, v};
    void *ip6[6] = {pb, m, v, gr, hy, ss}, *op3[3] = {pb, m, v};
    const float wd = ac->ndim >= 2 ? ac->wd : 0.0f; /* 1-D parameters are not decayed */
    for (int t = 1; t <= 3; t++) {
        fill(gr, n, 1);
        double bc1 = 1 - pow(ac->beta1, t), bc2 = 1 - pow(beta2, t);
        hy[0] = lr;
        hy[1] = (float)((double)lr / bc1); /* the step size, as torch forms it */
        hy[2] = (float)sqrt(bc2);
        hy[3] = 0;
        *ss = ac->sumsq;
        check_threads(&f, id, master ? ip7 : ip6, master ? op4 : op3);
        /* torch, in f32 */
        float clip = 1.0f;
        if (ac->max_norm > 0) {
            float total = sqrtf(ac->sumsq), coef = ac->max_norm / (total + 1e-6f);
            clip = coef > 1.0f ? 1.0f : coef;
        }
        const float wgt = (float)(1.0 - (double)ac->beta1);
        const float step = hy[1];
        for (int i = 0; i < n; i++) {
            float g = gr[i] * clip;
            P[i] *= (float)(1.0 - (double)lr * wd);              /* param.mul_(1 - lr * wd) */
            float d = g - M[i];                                   /* exp_avg.lerp_(grad, 1 - beta1) */
            M[i] = fabsf(wgt) < 0.5f ? fmaf(wgt, d, M[i]) : fmaf(wgt - 1.0f, d, g);
            /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2) */
            Vv[i] = fmaf((float)(1.0 - (double)beta2) * g, g, Vv[i] * beta2);
            float denom = sqrtf(Vv[i]) / hy[2] + eps;             /* (sqrt / bc2_sqrt).add_(eps) */
            P[i] += -step * M[i] / denom;                         /* addcdiv_(m, denom, -step_size) */
            /* and in double */
            double gd = (double)gr[i] * clip;
            Pd[i] *= 1.0 - (double)lr * wd;
            Md[i] = ac->beta1 * Md[i] + (1 - ac->beta1) * gd;
            Vd[i] = beta2 * Vd[i] + (1 - beta2) * gd * gd;
            Pd[i] -= lr / bc1 * Md[i] / (sqrt(Vd[i]) / sqrt(bc2) + eps);
            const float *pm = master ? mb : pb;
            /* within 1e-5 of the largest step, lr / bc1 (m can be a difference of
             * nearly equal terms, so not of this step) */
            if (!(fabs(pm[i] - Pd[i]) <= 1e-5 * lr / bc1 + 1e-6 * fabs(Pd[i])))
                fail_msg("adamw step %d [%d]: %.9g vs %.9g (double)", t, i, pm[i], Pd[i]);
        }
        assert_memory_equal(m, M, n * 4);
        assert_memory_equal(v, Vv, n * 4);
        assert_memory_equal(master ? mb : (float *)pb, P, n * 4);
        if (master) /* the parameter is the master rounded to its dtype */
            for (int i = 0; i < n; i++) {
                uint16_t want = ac->dt == TIDE_BF16 ? tide_f32_to_bf16(P[i]) : tide_f32_to_f16(P[i]);
                if (((uint16_t *)pb)[i] != want)
                    fail_msg("adamw param [%d]: %04x vs %04x", i, ((uint16_t *)pb)[i], want);
            }
    }
    free(P);
    free(M);
    free(Vv);
    free(src);
    free(Pd);
    free(Md);
    free(Vd);
    fx_close(&f);
}

static void test_adamw(void **state) {
    (void)state;
    static const adam_case cases[] = {
        {TIDE_F32, 2, 0.9f, 0.1f, 0.0f, 0.0f},     /* no clipping */
        {TIDE_F32, 2, 0.9f, 0.1f, 1.0f, 1e4f},     /* clipped: coefficient 0.01 */
        {TIDE_F32, 2, 0.9f, 0.0f, 1.0f, 0.25f},    /* under the norm: coefficient 1 */
        {TIDE_F32, 1, 0.9f, 0.1f, 0.0f, 0.0f},     /* 1-D: no decay */
        {TIDE_BF16, 2, 0.9f, 0.1f, 1.0f, 1e4f},    /* bf16 with an f32 master, clipped */
        {TIDE_BF16, 1, 0.9f, 0.1f, 0.0f, 0.0f},
        {TIDE_F16, 2, 0.3f, 0.05f, 0.0f, 0.0f},    /* beta1 < 0.5: lerp from the other end */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_adamw(&cases[i]);
}

/* ------------------------------------------------------------- contracts */

/* Malformed training ops are refused when the graph is built, naming the
 * problem. */
static void test_bad_graphs(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    int x = fx_tensor(&f, "x", TIDE_F32, TIDE_ROLE_INPUT, 2, 4, 8);
    int w = fx_tensor(&f, "w", TIDE_BF16, TIDE_ROLE_WEIGHT, 2, 6, 8);
    int o = fx_tensor(&f, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, 4, 6);
    int dw = fx_tensor(&f, "dw", TIDE_F32, TIDE_ROLE_TEMP, 2, 6, 8);
    int m = fx_tensor(&f, "m", TIDE_F32, TIDE_ROLE_STATE, 2, 6, 8);
    int hy = fx_tensor(&f, "hyper", TIDE_F32, TIDE_ROLE_INPUT, 1, 4, 0);
    int ss = fx_tensor(&f, "ss", TIDE_F32, TIDE_ROLE_TEMP, 1, 1, 0);
    int pw = fx_tensor(&f, "p", TIDE_BF16, TIDE_ROLE_STATE, 2, 6, 8);
    tide_op_args acc = {.accumulate = true}, none = {0}, adam = {.beta1 = 0.9f, .beta2 = 0.95f, .adam_eps = 1e-8f};
    int i2[2] = {x, w};
    /* accumulate without the output as third input */
    assert_int_equal(tide_graph_add_op_args(f.g, TIDE_OP_MATMUL, 2, i2, 1, &o, &acc, -1, NULL), TIDE_E_INVALID);
    /* gradw accumulating into another tensor */
    int gi[3] = {o, x, m};
    assert_int_equal(tide_graph_add_op_args(f.g, TIDE_OP_MATMUL_GRADW, 3, gi, 1, &dw, &none, -1, NULL), TIDE_E_INVALID);
    /* a 16-bit parameter without a master */
    int ai[6] = {pw, m, m, dw, hy, ss}, ao[3] = {pw, m, m};
    assert_int_equal(tide_graph_add_op_args(f.g, TIDE_OP_ADAMW, 6, ai, 3, ao, &adam, -1, NULL), TIDE_E_INVALID);
    if (!strstr(tide_ctx_last_error(f.ctx), "master")) fail_msg("%s", tide_ctx_last_error(f.ctx));
    fx_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_fd),
        cmocka_unit_test(test_matmul_forms),
        cmocka_unit_test(test_matmul_gradw),
        cmocka_unit_test(test_embed_bwd),
        cmocka_unit_test(test_rmsnorm_bwd),
        cmocka_unit_test(test_rope_bwd),
        cmocka_unit_test(test_silu_mul_bwd),
        cmocka_unit_test(test_attention_bwd_fd),
        cmocka_unit_test(test_attention_bwd),
        cmocka_unit_test(test_attention_nocache),
        cmocka_unit_test(test_attention_bad_pos),
        cmocka_unit_test(test_cross_entropy_fd),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_bad_graphs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
