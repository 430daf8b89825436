/*
 * ops.c - the op descriptor table: for every op kind, its name, its arity,
 * its shape contract (tide.h documents each kind), its FLOPs, the bytes it
 * moves through memory, the class of rate it runs at, and the backend
 * workspace it needs. Every stage asks this table instead of switching on the
 * kind, so a new op kind is one row here and its kernels in each backend's
 * kernel table (backend/cpu/cpu_backend.c, backend/cuda/cuda_backend.c).
 *
 * A check function sees an op whose arity, tensor indices and output roles
 * were checked already (graph.c, tide_op_check); it checks shapes, dtypes
 * and parameters and sets *flops. Messages name the op and the tensor.
 */
#include "graph/graph.h"

#include <math.h>

#define T(i) (&g->tensors[in[i]])
#define O(i) (&g->tensors[out[i]])
#define FAIL(...) return tide_err(g->ctx, TIDE_E_INVALID, __VA_ARGS__)
#define CHECK_ARGS tide_graph *g, int n_in, const int *in, int n_out, const int *out, const tide_op_args *p, \
                   double *flops

/* An activation: 2-D f32, or bf16 (a bf16 training step keeps some in bf16;
 * the CPU kernels load and store them, tide_op_slot_native) */
static bool is_act(const tide_tensor *t) { return (t->dtype == TIDE_F32 || t->dtype == TIDE_BF16) && t->ndim == 2; }
static bool is_float(tide_dtype d) { return d == TIDE_F32 || d == TIDE_F16 || d == TIDE_BF16; }
/* A weight a MATMUL or an EMBED takes: float, or block-quantized (its rows
 * whole blocks, which tide_graph_add_tensor checks). */
static bool is_weight(tide_dtype d) { return is_float(d) || tide_dtype_is_quantized(d); }

/* ---------------------------------------------------------------- shape contracts */

static tide_status check_embed(CHECK_ARGS) {
    const tide_tensor *tab = T(0), *tok = T(1), *o = O(0);
    if (tab->ndim != 2 || !is_weight(tab->dtype))
        FAIL("embed: table '%s' must be a 2-D float or block-quantized tensor", tab->name);
    if (tok->dtype != TIDE_I32) FAIL("embed: tokens '%s' must be i32", tok->name);
    if (!is_act(o) || o->shape[1] != tab->shape[1] || p->idx0 + o->shape[0] > tide_tensor_numel(tok))
        FAIL("embed: output '%s' must be f32 (rows, %lld) with rows from '%s'[%lld] on", o->name,
             (long long)tab->shape[1], tok->name, (long long)p->idx0);
    if (p->vocab && p->vocab0 + tab->shape[0] > p->vocab)
        FAIL("embed: table '%s' (ids %lld..) runs past the vocabulary of %lld", tab->name, (long long)p->vocab0,
             (long long)p->vocab);
    return TIDE_OK;
}

static tide_status check_rmsnorm(CHECK_ARGS) {
    const tide_tensor *x = T(0), *w = T(1), *o = O(0);
    if (!is_act(x) || !is_act(o) || x->shape[0] != o->shape[0] || x->shape[1] != o->shape[1])
        FAIL("rmsnorm: input '%s' and output '%s' must be f32 of one 2-D shape", x->name, o->name);
    if (!is_float(w->dtype) || tide_tensor_numel(w) != x->shape[1])
        FAIL("rmsnorm: weight '%s' must have %lld elements", w->name, (long long)x->shape[1]);
    if (!(p->eps > 0)) FAIL("rmsnorm: eps must be positive");
    *flops = 4.0 * (double)tide_tensor_numel(x);
    return TIDE_OK;
}

static tide_status check_matmul(CHECK_ARGS) {
    const tide_tensor *x = T(0), *w = T(1), *o = O(0);
    if (!is_act(x) || !is_act(o)) FAIL("matmul: '%s' and '%s' must be 2-D f32 or bf16", x->name, o->name);
    if (w->ndim != 2 || !is_weight(w->dtype))
        FAIL("matmul: weight '%s' must be 2-D float or block-quantized", w->name);
    if (p->accumulate && n_in != 3) FAIL("matmul: accumulating into '%s' takes it as a third input", o->name);
    if (p->no_transpose) { /* x . w, w (K, N) */
        if (w->shape[0] != x->shape[1] || o->shape[0] < p->row0 + x->shape[0] || o->shape[1] < p->col0 + w->shape[1])
            FAIL("matmul: shapes (%lld,%lld) x (%lld,%lld) -> (%lld,%lld) at (%lld,%lld) do not agree ('%s')",
                 (long long)x->shape[0], (long long)x->shape[1], (long long)w->shape[0], (long long)w->shape[1],
                 (long long)o->shape[0], (long long)o->shape[1], (long long)p->row0, (long long)p->col0, w->name);
        *flops = 2.0 * (double)x->shape[0] * (double)w->shape[0] * (double)w->shape[1];
        return TIDE_OK;
    }
    if (w->shape[1] != x->shape[1] || o->shape[0] < p->row0 + x->shape[0] || o->shape[1] < p->col0 + w->shape[0])
        FAIL("matmul: shapes (%lld,%lld) x (%lld,%lld)^T -> (%lld,%lld) at (%lld,%lld) do not agree ('%s')",
             (long long)x->shape[0], (long long)x->shape[1], (long long)w->shape[0], (long long)w->shape[1],
             (long long)o->shape[0], (long long)o->shape[1], (long long)p->row0, (long long)p->col0, w->name);
    *flops = 2.0 * (double)x->shape[0] * (double)w->shape[0] * (double)w->shape[1];
    return TIDE_OK;
}

static tide_status check_rope(CHECK_ARGS) {
    const tide_tensor *x = T(0), *pos = T(1), *o = O(0);
    if (!is_act(x) || !is_act(o) || x->shape[0] != o->shape[0] || x->shape[1] != o->shape[1])
        FAIL("rope: '%s' and '%s' must be f32 of one 2-D shape", x->name, o->name);
    if (p->n_heads <= 0 || p->head_dim <= 0 || p->head_dim % 2 || (int64_t)p->n_heads * p->head_dim != x->shape[1])
        FAIL("rope: n_heads %d x head_dim %d (even) must equal %lld", p->n_heads, p->head_dim,
             (long long)x->shape[1]);
    if (pos->dtype != TIDE_I32 || p->batch <= 0 || x->shape[0] % p->batch ||
        p->idx0 + (p->pos_rows ? x->shape[0] : x->shape[0] / p->batch) > tide_tensor_numel(pos))
        FAIL("rope: batch %d x positions '%s' (from %lld%s) must cover %lld rows", p->batch, pos->name,
             (long long)p->idx0, p->pos_rows ? ", one per row" : "", (long long)x->shape[0]);
    if (!(p->rope_theta > 0)) FAIL("rope: rope_theta must be positive");
    *flops = 6.0 * (double)tide_tensor_numel(x);
    return TIDE_OK;
}

static tide_status check_attention(CHECK_ARGS) {
    /* 4 inputs when the cache is written fresh (never read beyond what the
     * op writes itself), 6 when it reads the caches too */
    if (n_in == 5 || (n_out == 1 && n_in != 4) || n_out == 2)
        FAIL("attention takes 4 or 6 inputs and 3 outputs (4 and 1 without a cache), got %d and %d", n_in, n_out);
    const tide_tensor *q = T(0), *k = T(1), *v = T(2), *pos = T(3);
    const tide_tensor *o = O(0);
    if (p->n_heads <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0 || p->batch <= 0 || p->n_heads % p->n_kv_heads)
        FAIL("attention: n_heads %d must be a positive multiple of n_kv_heads %d", p->n_heads, p->n_kv_heads);
    int64_t R = q->shape[0], qd = (int64_t)p->n_heads * p->head_dim, kd = (int64_t)p->n_kv_heads * p->head_dim;
    if (!is_act(q) || q->shape[1] != qd || !is_act(o) || o->shape[0] != R || o->shape[1] != qd)
        FAIL("attention: q '%s' and output '%s' must be f32 (%lld, %lld)", q->name, o->name, (long long)R,
             (long long)qd);
    if (!is_act(k) || !is_act(v) || k->shape[0] != R || v->shape[0] != R || k->shape[1] != kd ||
        v->shape[1] != kd)
        FAIL("attention: k '%s' and v '%s' must be f32 (%lld, %lld)", k->name, v->name, (long long)R,
             (long long)kd);
    int64_t T_ = R % p->batch ? -1 : R / p->batch;
    if (pos->dtype != TIDE_I32 || T_ < 0 || p->idx0 + (p->pos_rows ? R : T_) > tide_tensor_numel(pos))
        FAIL("attention: batch %d x positions '%s' (from %lld%s) must cover %lld rows", p->batch, pos->name,
             (long long)p->idx0, p->pos_rows ? ", one per row" : "", (long long)R);
    if (n_in == 4 && p->idx0)
        FAIL("attention: a fresh cache is written from position 0; a later tile reads it (6 inputs)");
    if (p->pos_rows && n_in != 6)
        FAIL("attention: a position per row reads and writes the caches (6 inputs and 3 outputs)");
    double keys0 = n_in == 4 ? 0.5 * (double)T_ : 0;
    if (n_out == 1) { /* no cache: keys and values are k and v themselves */
        *flops = 4.0 * (double)R * (double)qd * keys0;
        return TIDE_OK;
    }
    const tide_tensor *kc = O(1), *vc = O(2);
    for (int c = 1; c <= 2; c++) {
        const tide_tensor *cc = O(c);
        const tide_dtype dt = cc->dtype;
        if ((dt != TIDE_F32 && dt != TIDE_F16 && dt != TIDE_BF16 && dt != TIDE_Q8_0) || cc->ndim != 3 ||
            cc->shape[0] != p->batch || cc->shape[2] != kd || cc->shape[1] < T_)
            FAIL("attention: cache '%s' must be f32, f16, bf16 or q8_0 (%d, >= %lld, %lld)", cc->name, p->batch,
                 (long long)T_, (long long)kd);
        if (p->head_dim % tide_dtype_block(dt))
            FAIL("attention: a %s cache '%s' needs head_dim %d to be whole blocks of %d", tide_dtype_name(dt),
                 cc->name, p->head_dim, tide_dtype_block(dt));
    }
    if (kc->shape[1] != vc->shape[1]) FAIL("attention: k and v caches differ in length");
    if (kc->dtype != vc->dtype) FAIL("attention: k and v caches differ in type");
    if (n_in == 6 && (out[1] != in[4] || out[2] != in[5]))
        FAIL("attention: outputs 2 and 3 must be the caches it reads ('%s', '%s')", kc->name, vc->name);
    if (out[1] == out[2]) FAIL("attention: the k and v caches must be two tensors");
    /* QK^T and PV over the causal span: about T/2 keys per query when the
     * cache is fresh, idx0 + T/2 for a later tile of a prefill, about half
     * the cache otherwise. */
    double keys = n_in == 4 ? 0.5 * (double)T_
                : p->idx0 && !p->pos_rows ? (double)p->idx0 + 0.5 * (double)T_
                            : 0.5 * (double)kc->shape[1];
    *flops = 4.0 * (double)R * (double)qd * keys;
    return TIDE_OK;
}

/* SILU_MUL and ADD: three f32 tensors of one shape. */
static tide_status check_elementwise(tide_graph *g, const char *nm, const int *in, const int *out) {
    const tide_tensor *a = T(0), *b = T(1), *o = O(0);
    if (!is_act(a) || !is_act(b) || !is_act(o) || a->shape[0] != b->shape[0] || a->shape[1] != b->shape[1] ||
        a->shape[0] != o->shape[0] || a->shape[1] != o->shape[1])
        FAIL("%s: '%s', '%s' and '%s' must be f32 of one 2-D shape", nm, a->name, b->name, o->name);
    return TIDE_OK;
}

static tide_status check_silu_mul(CHECK_ARGS) {
    *flops = 6.0 * (double)tide_tensor_numel(T(0));
    return check_elementwise(g, "silu_mul", in, out);
}

/* add: f32 of one 2-D shape, or (a rank's gradient shards summed over
 * micro-batches, train/train_ranks.c) of one 1-D shape */
static tide_status check_add(CHECK_ARGS) {
    *flops = (double)tide_tensor_numel(T(0));
    const tide_tensor *a = T(0), *b = T(1), *o = O(0);
    if (a->ndim == 1 && a->dtype == TIDE_F32 && b->dtype == TIDE_F32 && o->dtype == TIDE_F32 && b->ndim == 1 &&
        o->ndim == 1 && b->shape[0] == a->shape[0] && o->shape[0] == a->shape[0])
        return TIDE_OK;
    return check_elementwise(g, "add", in, out);
}

static tide_status check_add_bias(CHECK_ARGS) {
    const tide_tensor *x = T(0), *b = T(1), *o = O(0);
    if (!is_act(x) || !is_act(o) || x->shape[0] != o->shape[0] || x->shape[1] != o->shape[1])
        FAIL("add_bias: input '%s' and output '%s' must be f32 of one 2-D shape", x->name, o->name);
    if (!is_float(b->dtype) || b->ndim != 1 || b->shape[0] != x->shape[1])
        FAIL("add_bias: bias '%s' must be a float vector of %lld elements", b->name, (long long)x->shape[1]);
    *flops = (double)tide_tensor_numel(x);
    return TIDE_OK;
}

static tide_status check_take_last(CHECK_ARGS) {
    const tide_tensor *x = T(0), *o = O(0);
    if (!is_act(x) || !is_act(o) || p->batch <= 0 || o->shape[0] < p->row0 + p->batch || o->shape[1] != x->shape[1] ||
        x->shape[0] % p->batch)
        FAIL("take_last: '%s' must be f32 (>= %lld, %lld) taken from rows of '%s'", o->name,
             (long long)(p->row0 + p->batch), (long long)x->shape[1], x->name);
    return TIDE_OK;
}

static tide_status check_argmax(CHECK_ARGS) {
    const tide_tensor *x = T(0), *o = O(0);
    if (!is_act(x) || o->dtype != TIDE_I32 || tide_tensor_numel(o) != x->shape[0])
        FAIL("argmax: '%s' must be i32 with one element per row of '%s'", o->name, x->name);
    *flops = (double)tide_tensor_numel(x);
    return TIDE_OK;
}

static tide_status check_generic(CHECK_ARGS) {
    if (n_in < 0 || n_in > TIDE_OP_MAX_IN || n_out < 1 || n_out > TIDE_OP_MAX_OUT)
        FAIL("generic: 0 to %d inputs and 1 to %d outputs allowed", TIDE_OP_MAX_IN, TIDE_OP_MAX_OUT);
    if (!(p->flops >= 0) || !isfinite(p->flops)) FAIL("generic: flops must be finite and >= 0");
    *flops = p->flops;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- training ops */

/* Output j must have shape rows x cols (cols 0: 1-D of rows elements), f32. */
static bool is_f32_shape(const tide_tensor *t, int64_t rows, int64_t cols) {
    if (t->dtype != TIDE_F32) return false;
    if (!cols) return tide_tensor_numel(t) == rows;
    return t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

/* The same, f32 or bf16 (an activation a bf16 step keeps). */
static bool is_act_shape(const tide_tensor *t, int64_t rows, int64_t cols) {
    if (t->dtype == TIDE_BF16) {
        tide_tensor f = *t;
        f.dtype = TIDE_F32;
        return is_f32_shape(&f, rows, cols);
    }
    return is_f32_shape(t, rows, cols);
}

/* The accumulating form (the output as an extra last input) names that output. */
static tide_status check_accumulate(tide_graph *g, const char *nm, int n_in, int base, const int *in, int out_id) {
    if (n_in > base && in[n_in - 1] != out_id)
        FAIL("%s: its last input must be the gradient '%s' it adds into", nm, g->tensors[out_id].name);
    return TIDE_OK;
}

static tide_status check_embed_bwd(CHECK_ARGS) {
    const tide_tensor *dy = T(0), *tok = T(1), *dt = O(0);
    if (!is_act(dy)) FAIL("embed_bwd: '%s' must be 2-D f32 or bf16", dy->name);
    if (tok->dtype != TIDE_I32 || p->idx0 + dy->shape[0] > tide_tensor_numel(tok))
        FAIL("embed_bwd: tokens '%s' must be i32 with rows from [%lld] on", tok->name, (long long)p->idx0);
    if (!is_act(dt) || dt->shape[1] != dy->shape[1])
        FAIL("embed_bwd: gradient '%s' must be f32 (vocab, %lld)", dt->name, (long long)dy->shape[1]);
    if (p->vocab ? p->vocab0 + dt->shape[0] > p->vocab : p->vocab0 != 0)
        FAIL("embed_bwd: gradient block '%s' (ids %lld..) runs past the vocabulary of %lld", dt->name,
             (long long)p->vocab0, (long long)p->vocab);
    *flops = (double)tide_tensor_numel(dy);
    return check_accumulate(g, "embed_bwd", n_in, 2, in, out[0]);
}

static tide_status check_rmsnorm_bwd(CHECK_ARGS) {
    const tide_tensor *x = T(0), *w = T(1), *dy = T(2);
    int64_t R = x->shape[0], D = tide_tensor_cols(x);
    if (!is_act(x) || !is_f32_shape(dy, R, D) || !is_f32_shape(O(0), R, D))
        FAIL("rmsnorm_bwd: x '%s', dy '%s' and dx '%s' must be f32 of one 2-D shape", x->name, dy->name, O(0)->name);
    if (!is_float(w->dtype) || tide_tensor_numel(w) != D || !is_f32_shape(O(1), D, 0))
        FAIL("rmsnorm_bwd: weight '%s' and its gradient '%s' must have %lld elements (the gradient f32)", w->name,
             O(1)->name, (long long)D);
    if (!(p->eps > 0)) FAIL("rmsnorm_bwd: eps must be positive");
    *flops = 10.0 * (double)R * (double)D;
    return check_accumulate(g, "rmsnorm_bwd", n_in, 3, in, out[1]);
}

static tide_status check_matmul_gradw(CHECK_ARGS) {
    const tide_tensor *dy = T(0), *x = T(1), *dw = O(0);
    if (!is_act(dy) || !is_act(x) || dy->shape[0] != x->shape[0])
        FAIL("matmul_gradw: '%s' and '%s' must be f32 with the same rows", dy->name, x->name);
    if (!is_f32_shape(dw, dy->shape[1], x->shape[1]))
        FAIL("matmul_gradw: gradient '%s' must be f32 (%lld, %lld)", dw->name, (long long)dy->shape[1],
             (long long)x->shape[1]);
    *flops = 2.0 * (double)dy->shape[0] * (double)dy->shape[1] * (double)x->shape[1];
    return check_accumulate(g, "matmul_gradw", n_in, 2, in, out[0]);
}

static tide_status check_rope_bwd(CHECK_ARGS) {
    tide_status st = check_rope(g, n_in, in, n_out, out, p, flops);
    if (st) return tide_err(g->ctx, st, "rope_bwd: %s", tide_ctx_last_error(g->ctx));
    return TIDE_OK;
}

static tide_status check_attention_bwd(CHECK_ARGS) {
    const tide_tensor *q = T(0), *k = T(1), *v = T(2), *o = T(3), *dout = T(4), *pos = T(5);
    if (p->pos_rows) FAIL("attention_bwd: its sequences are fresh (positions 0..T-1): no position per row");
    if (p->n_heads <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0 || p->batch <= 0 || p->n_heads % p->n_kv_heads)
        FAIL("attention_bwd: n_heads %d must be a positive multiple of n_kv_heads %d", p->n_heads, p->n_kv_heads);
    int64_t R = q->shape[0], qd = (int64_t)p->n_heads * p->head_dim, kd = (int64_t)p->n_kv_heads * p->head_dim;
    if (!is_act_shape(q, R, qd) || !is_act_shape(o, R, qd) || !is_f32_shape(dout, R, qd) || !is_f32_shape(O(0), R, qd))
        FAIL("attention_bwd: q '%s', o '%s', do '%s' and dq '%s' must be f32 (%lld, %lld)", q->name, o->name,
             dout->name, O(0)->name, (long long)R, (long long)qd);
    if (!is_act_shape(k, R, kd) || !is_act_shape(v, R, kd) || !is_f32_shape(O(1), R, kd) || !is_f32_shape(O(2), R, kd))
        FAIL("attention_bwd: k '%s', v '%s', dk '%s' and dv '%s' must be f32 (%lld, %lld)", k->name, v->name,
             O(1)->name, O(2)->name, (long long)R, (long long)kd);
    int64_t T_ = R % p->batch ? -1 : R / p->batch;
    if (pos->dtype != TIDE_I32 || T_ < 0 || p->idx0 || T_ > tide_tensor_numel(pos))
        FAIL("attention_bwd: batch %d x positions '%s' must cover %lld rows of fresh sequences", p->batch, pos->name,
             (long long)R);
    *flops = 10.0 * (double)R * (double)qd * 0.5 * (double)T_;
    return TIDE_OK;
}

static tide_status check_silu_mul_bwd(CHECK_ARGS) {
    const tide_tensor *a = T(0);
    int64_t R = a->shape[0], I = tide_tensor_cols(a);
    for (int i = 0; i < 3; i++)
        if (!(i < 2 ? is_act_shape(T(i), R, I) : is_f32_shape(T(i), R, I)))
            FAIL("silu_mul_bwd: '%s' must be f32 (%lld, %lld)", T(i)->name, (long long)R, (long long)I);
    for (int j = 0; j < 2; j++)
        if (!is_f32_shape(O(j), R, I)) FAIL("silu_mul_bwd: '%s' must be f32 (%lld, %lld)", O(j)->name, (long long)R, (long long)I);
    *flops = 10.0 * (double)R * (double)I;
    return TIDE_OK;
}

/* CROSS_ENTROPY writes (loss, dh, dw), or with 2 outputs (loss, dh) no
 * weight gradient (a frozen head). With dw: 4 inputs, dw adds into its 4th;
 * 5, the loss adds into its 5th too (a row tile of a batch whose loss is the
 * sum of its tiles'). Without: 4 inputs, the loss adds into its 4th. */
static tide_status check_cross_entropy(CHECK_ARGS) {
    if (n_out != 2 && n_out != 3) FAIL("cross_entropy writes 2 or 3 outputs, got %d", n_out);
    const bool dw = n_out == 3;
    if (n_in < 3 || n_in > (dw ? 5 : 4))
        FAIL("cross_entropy with%s a weight gradient takes 3 to %d inputs, got %d", dw ? "" : "out", dw ? 5 : 4, n_in);
    const tide_tensor *h = T(0), *w = T(1), *tg = T(2);
    if (!is_act(h)) FAIL("cross_entropy: '%s' must be 2-D f32 or bf16", h->name);
    int64_t R = h->shape[0], D = h->shape[1];
    if (w->ndim != 2 || !is_float(w->dtype) || w->shape[1] != D)
        FAIL("cross_entropy: weight '%s' must be 2-D float (vocab, %lld)", w->name, (long long)D);
    if (tg->dtype != TIDE_I32 || p->idx0 + R > tide_tensor_numel(tg))
        FAIL("cross_entropy: targets '%s' must be i32 with one id per row of '%s' (from [%lld] on)", tg->name,
             h->name, (long long)p->idx0);
    if (!is_f32_shape(O(0), 1, 0) || !is_f32_shape(O(1), R, D) || (dw && !is_f32_shape(O(2), w->shape[0], D)))
        FAIL("cross_entropy: outputs must be f32: loss '%s' (1), dh '%s' (%lld, %lld)%s%s%s", O(0)->name,
             O(1)->name, (long long)R, (long long)D, dw ? ", dw '" : "", dw ? O(2)->name : "", dw ? "'" : "");
    if (!isfinite(p->scale)) FAIL("cross_entropy: scale must be finite");
    *flops = (dw ? 6.0 : 4.0) * (double)R * (double)w->shape[0] * (double)D;
    if (!dw) {
        if (n_in == 4 && in[3] != out[0])
            FAIL("cross_entropy: its 4th input must be the loss '%s' it adds into", O(0)->name);
        return TIDE_OK;
    }
    if (n_in == 5 && (in[3] != out[2] || in[4] != out[0]))
        FAIL("cross_entropy: its 4th and 5th inputs must be the gradient '%s' and the loss '%s' it adds into",
             O(2)->name, O(0)->name);
    return n_in == 5 ? TIDE_OK : check_accumulate(g, "cross_entropy", n_in, 3, in, out[2]);
}

/* What CE_STATS and CE_BLOCK share: h, a head block w and the targets. */
static tide_status check_ce_common(tide_graph *g, const char *nm, int n_in, int min_in, const int *in, int n_out,
                                   const tide_op_args *p) {
    if (n_in < min_in || n_out < 1)
        FAIL("%s takes %d or more inputs and 1 or more outputs, got %d and %d", nm, min_in, n_in, n_out);
    const tide_tensor *h = T(0), *w = T(1), *tg = T(2);
    if (!is_act(h)) FAIL("%s: '%s' must be 2-D f32 or bf16", nm, h->name);
    int64_t R = h->shape[0], D = h->shape[1];
    if (w->ndim != 2 || !is_float(w->dtype) || w->shape[1] != D)
        FAIL("%s: weight block '%s' must be 2-D float (rows, %lld)", nm, w->name, (long long)D);
    if (p->vocab < 1 || p->vocab0 + w->shape[0] > p->vocab)
        FAIL("%s: weight block '%s' (ids %lld..) must lie in a vocabulary of %lld ids", nm, w->name,
             (long long)p->vocab0, (long long)p->vocab);
    if (tg->dtype != TIDE_I32 || p->idx0 + R > tide_tensor_numel(tg))
        FAIL("%s: targets '%s' must be i32 with one id per row of '%s' (from [%lld] on)", nm, tg->name, h->name,
             (long long)p->idx0);
    if (!isfinite(p->scale)) FAIL("%s: scale must be finite", nm);
    return TIDE_OK;
}

static tide_status check_ce_stats(CHECK_ARGS) {
    tide_status st = check_ce_common(g, "ce_stats", n_in, 3, in, n_out, p);
    if (st) return st;
    const tide_tensor *h = T(0), *w = T(1);
    int64_t R = h->shape[0];
    bool first = p->vocab0 == 0, last = p->vocab0 + w->shape[0] == p->vocab;
    int want_in = 3 + !first + (last && p->accumulate), want_out = 1 + last;
    if (n_in != want_in || n_out != want_out || (p->accumulate && !last))
        FAIL("ce_stats: the block at id %lld%s takes %d inputs and %d outputs, got %d and %d", (long long)p->vocab0,
             last ? (p->accumulate ? " (the last, its loss adding)" : " (the last)") : "", want_in, want_out, n_in,
             n_out);
    if (!is_f32_shape(O(0), R, 3)) FAIL("ce_stats: statistics '%s' must be f32 (%lld, 3)", O(0)->name, (long long)R);
    if (!first && in[3] != out[0])
        FAIL("ce_stats: its 4th input must be the statistics '%s' it updates", O(0)->name);
    if (last && !is_f32_shape(O(1), 1, 0)) FAIL("ce_stats: the loss '%s' must be one f32", O(1)->name);
    if (last && p->accumulate && in[4] != out[1])
        FAIL("ce_stats: its 5th input must be the loss '%s' it adds into", O(1)->name);
    *flops = 2.0 * (double)R * (double)w->shape[0] * (double)h->shape[1];
    return TIDE_OK;
}

static tide_status check_ce_block(CHECK_ARGS) {
    tide_status st = check_ce_common(g, "ce_block", n_in, 4, in, n_out, p);
    if (st) return st;
    const tide_tensor *h = T(0), *w = T(1);
    int64_t R = h->shape[0], D = h->shape[1];
    bool first = p->vocab0 == 0;
    /* 1 output: dh alone (a frozen head's block: no weight gradient) */
    const bool dw = n_out == 2;
    int want_in = 4 + !first + p->accumulate;
    if (n_out != 1 && n_out != 2) FAIL("ce_block writes 1 or 2 outputs, got %d", n_out);
    if (!dw && p->accumulate) FAIL("ce_block: without a weight gradient there is no gradient to add into");
    if (n_in != want_in)
        FAIL("ce_block: the block at id %lld%s takes %d inputs, got %d", (long long)p->vocab0,
             p->accumulate ? " (dw adding)" : "", want_in, n_in);
    if (!is_f32_shape(T(3), R, 3)) FAIL("ce_block: statistics '%s' must be f32 (%lld, 3)", T(3)->name, (long long)R);
    if (!is_f32_shape(O(0), R, D) || (dw && !is_f32_shape(O(1), w->shape[0], D)))
        FAIL("ce_block: outputs must be f32: dh '%s' (%lld, %lld)%s%s%s", O(0)->name, (long long)R, (long long)D,
             dw ? ", dw '" : "", dw ? O(1)->name : "", dw ? "'" : "");
    if (!first && in[4] != out[0]) FAIL("ce_block: its 5th input must be the gradient '%s' it adds into", O(0)->name);
    if (p->accumulate && in[n_in - 1] != out[1])
        FAIL("ce_block: its last input must be the gradient '%s' it adds into", O(1)->name);
    *flops = (dw ? 6.0 : 4.0) * (double)R * (double)w->shape[0] * (double)D;
    return TIDE_OK;
}

static tide_status check_sumsq(CHECK_ARGS) {
    if (T(0)->dtype != TIDE_F32) FAIL("sumsq: '%s' must be f32", T(0)->name);
    if (!is_f32_shape(O(0), 1, 0)) FAIL("sumsq: '%s' must be one f32", O(0)->name);
    *flops = 2.0 * (double)tide_tensor_numel(T(0));
    return check_accumulate(g, "sumsq", n_in, 1, in, out[0]);
}

static tide_status check_adamw(CHECK_ARGS) {
    bool master = n_in == 7;
    if (n_in != 6 && n_in != 7) FAIL("adamw takes 6 or 7 inputs, got %d", n_in);
    if (n_out != n_in - 3) FAIL("adamw with%s a master copy writes %d outputs, got %d", master ? "" : "out",
                                n_in - 3, n_out);
    const tide_tensor *param = T(0);
    int64_t n = tide_tensor_numel(param);
    if (!is_float(param->dtype)) FAIL("adamw: parameter '%s' must be float", param->name);
    if (!master && param->dtype != TIDE_F32) FAIL("adamw: parameter '%s' is not f32: it needs an f32 master copy", param->name);
    for (int i = 1; i < n_in - 2; i++)
        if (T(i)->dtype != TIDE_F32 || tide_tensor_numel(T(i)) != n)
            FAIL("adamw: '%s' must be f32 with the %lld elements of '%s'", T(i)->name, (long long)n, param->name);
    if (!is_f32_shape(T(n_in - 2), 4, 0)) FAIL("adamw: hyperparameters '%s' must be 4 f32", T(n_in - 2)->name);
    if (!is_f32_shape(T(n_in - 1), 1, 0)) FAIL("adamw: '%s' must be one f32 (the gradients' sum of squares)", T(n_in - 1)->name);
    for (int j = 0; j < n_out; j++)
        if (out[j] != in[j]) FAIL("adamw: output %d must be input %d ('%s'), updated in place", j, j, T(j)->name);
    if (!(p->beta1 >= 0 && p->beta1 < 1 && p->beta2 >= 0 && p->beta2 < 1 && p->adam_eps > 0 && p->weight_decay >= 0 &&
          p->max_norm >= 0))
        FAIL("adamw: betas must be in [0, 1), eps positive, weight decay and max_norm >= 0");
    *flops = 16.0 * (double)n;
    return TIDE_OK;
}

int64_t tide_shard_numel(const tide_tensor *x, int n) {
    int64_t numel = tide_tensor_numel(x), d0 = x->ndim ? x->shape[0] : 1;
    if (n < 1 || d0 < 1) return numel;
    return (d0 + n - 1) / n * (numel / d0);
}

static tide_status check_collective(tide_op_kind kind_of_check, CHECK_ARGS) {
    (void)n_in;
    (void)n_out;
    const char *name = tide_op_name(kind_of_check);
    if (p->ranks < 1) FAIL("%s: needs ranks >= 1 (got %d)", name, p->ranks);
    const tide_tensor *x = T(0), *y = g->tensors + out[0];
    if (!is_float(x->dtype) || x->dtype != y->dtype) FAIL("%s: '%s' and '%s' must be one float dtype", name, x->name, y->name);
    if (kind_of_check != TIDE_OP_ALL_GATHER && x->dtype != TIDE_F32) FAIL("%s: '%s' must be f32", name, x->name);
    if (kind_of_check == TIDE_OP_ALL_REDUCE) {
        if (out[0] != in[0]) FAIL("%s: output must be input '%s', reduced in place", name, x->name);
    } else {
        const tide_tensor *full = kind_of_check == TIDE_OP_REDUCE_SCATTER ? x : y;
        const tide_tensor *part = kind_of_check == TIDE_OP_REDUCE_SCATTER ? y : x;
        if (tide_tensor_numel(part) != tide_shard_numel(full, p->ranks))
            FAIL("%s: shard '%s' must hold %lld elements (ceil(rows / %d) rows of '%s')", name, part->name,
                 (long long)tide_shard_numel(full, p->ranks), p->ranks, full->name);
    }
    *flops = 0;
    return TIDE_OK;
}
static tide_status check_all_reduce(CHECK_ARGS) { return check_collective(TIDE_OP_ALL_REDUCE, g, n_in, in, n_out, out, p, flops); }
static tide_status check_reduce_scatter(CHECK_ARGS) {
    return check_collective(TIDE_OP_REDUCE_SCATTER, g, n_in, in, n_out, out, p, flops);
}
static tide_status check_all_gather(CHECK_ARGS) { return check_collective(TIDE_OP_ALL_GATHER, g, n_in, in, n_out, out, p, flops); }

/* The rows of logits CROSS_ENTROPY holds at once: 32 MiB of them, at least
 * one row. */
int64_t tide_ce_chunk_rows(int64_t rows, int64_t vocab) {
    int64_t c = (INT64_C(32) << 20) / (4 * (vocab > 0 ? vocab : 1));
    c = c < 1 ? 1 : c;
    return c < rows ? c : rows;
}

/* ---------------------------------------------------------------- training workspaces
 *
 * Each is a function of the op's shapes alone, whatever the backend or its
 * thread count, so that a plan (and an offloaded run's arithmetic, which
 * may follow the workspace's size) is the same on every backend. */

static uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

/* CROSS_ENTROPY's workspace: first R doubles, rounded up to 64 bytes, for
 * each row's loss term, which the GPU sums once all chunks are done (the CPU
 * sums as it goes and skips them); then a chunk's logits, then (16-bit
 * weights) a block of up to 16 MiB for the weight widened to f32, as
 * MATMUL's. */
static uint64_t scratch_cross_entropy(const tide_graph *g, const tide_op *op) {
    const tide_tensor *h = &g->tensors[op->in[0]], *w = &g->tensors[op->in[1]];
    uint64_t logits = (uint64_t)tide_ce_chunk_rows(h->shape[0], w->shape[0]) * (uint64_t)w->shape[0] * 4;
    /* a bf16 step's products read an f32 or bf16 head as stored */
    bool as_stored = w->dtype == TIDE_F32 || (op->p.bf16 && w->dtype == TIDE_BF16);
    uint64_t wb = as_stored ? 0 : TIDE_MIN((uint64_t)tide_tensor_numel(w) * 4, UINT64_C(16) << 20);
    return round_up((uint64_t)h->shape[0] * 8, 64) + logits + wb;
}

/* CE_STATS' and CE_BLOCK's: as CROSS_ENTROPY's over the block's rows. */
static uint64_t scratch_ce_block(const tide_graph *g, const tide_op *op) { return scratch_cross_entropy(g, op); }

/* RMSNORM_BWD's workspace: each row's 1/rms (R floats: the CPU's whole
 * need), then, 256-byte aligned, dw's partial sums in double over blocks of
 * 256 rows (ceil(R / 256) x D), which the GPU adds in block order. */
static uint64_t scratch_rmsnorm_bwd(const tide_graph *g, const tide_op *op) {
    const tide_tensor *x = &g->tensors[op->in[0]];
    uint64_t R = (uint64_t)x->shape[0], D = (uint64_t)tide_tensor_cols(x);
    return round_up(R * 4, 256) + (R + 255) / 256 * D * 8;
}

/* ATTENTION_BWD's workspace, the larger of two needs:
 *   - the GPU's row statistics: for every query row and head its softmax's
 *     max, 1 / sum and rowsum(dO * O), 3 floats;
 *   - the CPU's score blocks: per thread two blocks of bq query rows by T
 *     keys (rounded up to 16), bq as attention.c's att_bwd_rows(T), for as
 *     many threads as there are (batch, kv head) tasks but at most 64 MiB of
 *     blocks (one thread's at least); the CPU runs the op on no more threads
 *     than its workspace holds (its bits do not depend on the count). */
static uint64_t scratch_attention_bwd(const tide_graph *g, const tide_op *op) {
    const tide_op_args *p = &op->p;
    uint64_t R = (uint64_t)g->tensors[op->in[0]].shape[0], T = R / (uint64_t)p->batch;
    uint64_t stats = 3 * R * (uint64_t)p->n_heads * 4;
    uint64_t bq = TIDE_MAX(16, TIDE_MIN(128, T / 8));
    bq = TIDE_MIN(bq, TIDE_MAX(16, (UINT64_C(1) << 19) / TIDE_MAX(T, 1)));
    bq = TIDE_MIN(bq, T);
    uint64_t per = 2 * bq * round_up(T, 16) * 4;
    uint64_t tasks = (uint64_t)p->batch * (uint64_t)p->n_kv_heads;
    uint64_t slots = TIDE_MIN(tasks, TIDE_MAX(1, (UINT64_C(64) << 20) / TIDE_MAX(per, 1)));
    return TIDE_MAX(stats, slots * per);
}

/* SUMSQ's workspace: a double per block of 8192 elements, the partial sums
 * the GPU adds in block order. */
static uint64_t scratch_sumsq(const tide_graph *g, const tide_op *op) {
    return ((uint64_t)tide_tensor_numel(&g->tensors[op->in[0]]) + 8191) / 8192 * 8;
}

/* ---------------------------------------------------------------- bytes and workspace */

/* EMBED gathers one table row per token (its share of them for a chunk). */
static double bytes_embed(const tide_graph *g, const tide_op *op) {
    const tide_tensor *tab = &g->tensors[op->in[0]], *o = &g->tensors[op->out[0]];
    double share = op->p.vocab ? (double)tab->shape[0] / (double)op->p.vocab : 1.0;
    return 4.0 * (double)o->shape[0] + 2.0 * share * (double)o->nbytes;
}

/* TAKE_LAST copies B rows. */
static double bytes_take_last(const tide_graph *g, const tide_op *op) {
    return 2.0 * 4.0 * (double)op->p.batch * (double)g->tensors[op->out[0]].shape[1];
}

/* MATMUL reads x and w and writes its output block. */
static double bytes_matmul(const tide_graph *g, const tide_op *op) {
    const tide_tensor *x = &g->tensors[op->in[0]], *w = &g->tensors[op->in[1]];
    return (double)x->nbytes + (double)w->nbytes + 4.0 * (double)x->shape[0] * (double)w->shape[0];
}

/* The CPU converts a 16-bit weight to f32 in column blocks of at most 16 MiB.
 * With a block-quantized weight, the larger of two needs: the CPU quantizes
 * the rows of x to 8 bits, each row K padded to a multiple of 256 (Kp) taking
 * Kp * 5/4 bytes (backend/cpu/matmul_quant.c), room for every row up to 16
 * MiB and at least one row; CUDA dequantizes the weight in tiles of whole
 * rows in a workspace of numel * 4 bytes, at most 16 MiB (f32 tiles in the
 * f32 mode; bf16 tiles in its first half and the rounded activations in the
 * second in the fast mode, src/backend/cuda/cuda_ops.c), never a whole copy
 * of a weight above 16 MiB. */
static uint64_t scratch_matmul(const tide_graph *g, const tide_op *op) {
    const tide_tensor *x = &g->tensors[op->in[0]], *w = &g->tensors[op->in[1]];
    if (tide_dtype_is_quantized(w->dtype)) {
        uint64_t kp = ((uint64_t)x->shape[1] + 255) / 256 * 256, row = kp + kp / 8 + kp / 8;
        uint64_t cpu = TIDE_MAX(row, TIDE_MIN(row * (uint64_t)x->shape[0], UINT64_C(16) << 20));
        return TIDE_MAX(cpu, TIDE_MIN((uint64_t)tide_tensor_numel(w) * 4, UINT64_C(16) << 20));
    }
    if (op->p.bf16) {
        /* a bf16 step's product (the CPU's tk_matmul_bf16) reads its
         * operands as stored; a bf16 output is summed in f32 rows, up to 4
         * MiB of them (at least one) */
        const tide_tensor *o = &g->tensors[op->out[0]];
        if (o->dtype != TIDE_BF16) return 0;
        uint64_t n = (uint64_t)(op->p.no_transpose ? w->shape[1] : w->shape[0]) * 4;
        return TIDE_MAX(n, TIDE_MIN(n * (uint64_t)x->shape[0], UINT64_C(4) << 20));
    }
    if (w->dtype == TIDE_F32) return 0;
    uint64_t wb = (uint64_t)tide_tensor_numel(w) * 4;
    return TIDE_MIN(wb, UINT64_C(16) << 20);
}

/* ---------------------------------------------------------------- the table */

static const tide_op_desc descs[TIDE_OP_COUNT] = {
    [TIDE_OP_EMBED] = {"embed", 2, 3, 1, TIDE_OPC_VECTOR, true, check_embed, bytes_embed, NULL},
    [TIDE_OP_RMSNORM] = {"rmsnorm", 2, 2, 1, TIDE_OPC_VECTOR, false, check_rmsnorm, NULL, NULL},
    [TIDE_OP_MATMUL] = {"matmul", 2, 3, 1, TIDE_OPC_MATMUL, true, check_matmul, bytes_matmul, scratch_matmul},
    [TIDE_OP_ROPE] = {"rope", 2, 2, 1, TIDE_OPC_VECTOR, false, check_rope, NULL, NULL},
    [TIDE_OP_ATTENTION] = {"attention", 4, 6, -1, TIDE_OPC_ATTENTION, false, check_attention, NULL, NULL},
    [TIDE_OP_SILU_MUL] = {"silu_mul", 2, 2, 1, TIDE_OPC_VECTOR, false, check_silu_mul, NULL, NULL},
    [TIDE_OP_ADD] = {"add", 2, 2, 1, TIDE_OPC_VECTOR, false, check_add, NULL, NULL},
    [TIDE_OP_TAKE_LAST] = {"take_last", 1, 2, 1, TIDE_OPC_VECTOR, true, check_take_last, bytes_take_last, NULL},
    [TIDE_OP_ARGMAX] = {"argmax", 1, 1, 1, TIDE_OPC_VECTOR, false, check_argmax, NULL, NULL},
    [TIDE_OP_GENERIC] = {"generic", -1, -1, -1, TIDE_OPC_GENERIC, false, check_generic, NULL, NULL},
    [TIDE_OP_EMBED_BWD] = {"embed_bwd", 2, 3, 1, TIDE_OPC_VECTOR, false, check_embed_bwd, NULL, NULL},
    [TIDE_OP_RMSNORM_BWD] = {"rmsnorm_bwd", 3, 4, 2, TIDE_OPC_VECTOR, false, check_rmsnorm_bwd, NULL,
                             scratch_rmsnorm_bwd},
    [TIDE_OP_MATMUL_GRADW] = {"matmul_gradw", 2, 3, 1, TIDE_OPC_MATMUL, false, check_matmul_gradw, NULL, NULL},
    [TIDE_OP_ROPE_BWD] = {"rope_bwd", 2, 2, 1, TIDE_OPC_VECTOR, false, check_rope_bwd, NULL, NULL},
    [TIDE_OP_ATTENTION_BWD] = {"attention_bwd", 6, 6, 3, TIDE_OPC_ATTENTION, false, check_attention_bwd, NULL,
                               scratch_attention_bwd},
    [TIDE_OP_SILU_MUL_BWD] = {"silu_mul_bwd", 3, 3, 2, TIDE_OPC_VECTOR, false, check_silu_mul_bwd, NULL, NULL},
    [TIDE_OP_CROSS_ENTROPY] = {"cross_entropy", -1, -1, -1, TIDE_OPC_MATMUL, false, check_cross_entropy, NULL,
                               scratch_cross_entropy},
    [TIDE_OP_SUMSQ] = {"sumsq", 1, 2, 1, TIDE_OPC_VECTOR, false, check_sumsq, NULL, scratch_sumsq},
    [TIDE_OP_ADAMW] = {"adamw", -1, -1, -1, TIDE_OPC_VECTOR, false, check_adamw, NULL, NULL},
    [TIDE_OP_CE_STATS] = {"ce_stats", -1, -1, -1, TIDE_OPC_MATMUL, false, check_ce_stats, NULL, scratch_ce_block},
    [TIDE_OP_CE_BLOCK] = {"ce_block", -1, -1, -1, TIDE_OPC_MATMUL, false, check_ce_block, NULL, scratch_ce_block},
    [TIDE_OP_ADD_BIAS] = {"add_bias", 2, 2, 1, TIDE_OPC_VECTOR, false, check_add_bias, NULL, NULL},
    [TIDE_OP_ALL_REDUCE] = {"all_reduce", 1, 1, 1, TIDE_OPC_VECTOR, false, check_all_reduce, NULL, NULL},
    [TIDE_OP_REDUCE_SCATTER] = {"reduce_scatter", 1, 1, 1, TIDE_OPC_VECTOR, false, check_reduce_scatter, NULL, NULL},
    [TIDE_OP_ALL_GATHER] = {"all_gather", 1, 1, 1, TIDE_OPC_VECTOR, false, check_all_gather, NULL, NULL},
};

const tide_op_desc *tide_op_desc_of(tide_op_kind k) {
    return (unsigned)k < TIDE_OP_COUNT && descs[k].name ? &descs[k] : NULL;
}

const char *tide_op_name(tide_op_kind k) {
    const tide_op_desc *d = tide_op_desc_of(k);
    return d ? d->name : "?";
}

tide_status tide_op_check(tide_graph *g, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
                          const tide_op_args *p, double *flops) {
    const tide_op_desc *d = tide_op_desc_of(kind);
    if (!d) FAIL("unknown op kind %d", (int)kind);
    if (d->min_in >= 0 && (n_in < d->min_in || n_in > d->max_in || (d->n_out >= 0 && n_out != d->n_out)))
        FAIL("%s takes %d%s inputs and %d outputs, got %d and %d", d->name, d->min_in,
             d->max_in > d->min_in ? " or more" : "", d->n_out, n_in, n_out);
    /* the tiled form (most inputs) takes its own output as its last input */
    if (d->tile_rmw && n_in == d->max_in && in[n_in - 1] != out[0])
        FAIL("%s: its last input must be its output '%s' (a tile written into it)", d->name, O(0)->name);
    if (p->idx0 < 0 || p->row0 < 0 || p->col0 < 0 || p->vocab0 < 0 || p->vocab < 0)
        FAIL("%s: negative tile offset", d->name);
    *flops = 0;
    return d->check(g, n_in, in, n_out, out, p, flops);
}

double tide_op_bytes(const tide_graph *g, const tide_op *op) {
    const tide_op_desc *d = tide_op_desc_of(op->kind);
    if (d && d->bytes) return d->bytes(g, op);
    double b = 0;
    for (int i = 0; i < op->n_in; i++) b += (double)g->tensors[op->in[i]].nbytes;
    for (int j = 0; j < op->n_out; j++)
        if (!tide_op_reads(op, op->out[j])) b += (double)g->tensors[op->out[j]].nbytes;
    return b;
}
