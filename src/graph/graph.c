/*
 * graph.c - the graph builder: tensors with roles, ops in execution order, and
 * the shape contract of every op kind (tide.h) checked as ops are added.
 */
#include "graph/graph.h"

#include <math.h>
#include <string.h>

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

tide_graph *tide_graph_new(tide_ctx *ctx) {
    tide_graph *g = tide_calloc(1, sizeof *g);
    if (!g) {
        tide_err(ctx, TIDE_E_NOMEM, "out of memory creating a graph");
        return NULL;
    }
    g->ctx = ctx;
    return g;
}

void tide_graph_free(tide_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_tensors; i++) {
        tide_free(g->tensors[i].name);
        tide_free(g->tensors[i].home);
    }
    tide_free(g->tensors);
    tide_free(g->ops);
    tide_free(g->index);
    tide_free(g);
}

static int index_rebuild(tide_graph *g, int cap) {
    int *idx = tide_malloc((size_t)cap * sizeof *idx);
    if (!idx) return -1;
    for (int i = 0; i < cap; i++) idx[i] = -1;
    for (int t = 0; t < g->n_tensors; t++) {
        uint64_t h = hash_str(g->tensors[t].name) & (uint64_t)(cap - 1);
        while (idx[h] >= 0) h = (h + 1) & (uint64_t)(cap - 1);
        idx[h] = t;
    }
    tide_free(g->index);
    g->index = idx;
    g->index_cap = cap;
    return 0;
}

int tide_graph_find(const tide_graph *g, const char *name) {
    if (!g->index_cap) return -1;
    uint64_t h = hash_str(name) & (uint64_t)(g->index_cap - 1);
    while (g->index[h] >= 0) {
        if (strcmp(g->tensors[g->index[h]].name, name) == 0) return g->index[h];
        h = (h + 1) & (uint64_t)(g->index_cap - 1);
    }
    return -1;
}

tide_status tide_graph_add_tensor(tide_graph *g, const char *name, tide_dtype dt,
                                  tide_role role, int ndim, const int64_t *shape, int *id) {
    tide_ctx *ctx = g->ctx;
    if (!name || !*name) return tide_err(ctx, TIDE_E_INVALID, "tensor without a name");
    if ((unsigned)dt >= TIDE_DTYPE_COUNT)
        return tide_err(ctx, TIDE_E_INVALID, "tensor '%s': invalid dtype %d", name, (int)dt);
    if ((unsigned)role >= TIDE_ROLE_COUNT)
        return tide_err(ctx, TIDE_E_INVALID, "tensor '%s': invalid role %d", name, (int)role);
    if (ndim < 1 || ndim > TIDE_MAX_DIMS)
        return tide_err(ctx, TIDE_E_INVALID, "tensor '%s': %d dimensions (1 to %d allowed)", name,
                        ndim, TIDE_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || shape[i] > (int64_t)1 << 40)
            return tide_err(ctx, TIDE_E_INVALID, "tensor '%s': dimension %d is %lld", name, i,
                            (long long)shape[i]);
        if (numel > (UINT64_C(1) << 50) / (uint64_t)shape[i])
            return tide_err(ctx, TIDE_E_INVALID, "tensor '%s': too many elements", name);
        numel *= (uint64_t)shape[i];
    }
    if (tide_graph_find(g, name) >= 0)
        return tide_err(ctx, TIDE_E_INVALID, "tensor '%s' is already in the graph", name);
    if (tide_grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof *g->tensors))
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory adding tensor '%s'", name);
    if ((g->n_tensors + 1) * 2 > g->index_cap &&
        index_rebuild(g, g->index_cap ? g->index_cap * 2 : 64))
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory adding tensor '%s'", name);
    char *nm = tide_strdup(name);
    if (!nm) return tide_err(ctx, TIDE_E_NOMEM, "out of memory adding tensor '%s'", name);
    tide_tensor *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->dtype = dt;
    t->role = role;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = numel * tide_dtype_size(dt);
    t->layer = -1;
    int tid = g->n_tensors++;
    uint64_t h = hash_str(name) & (uint64_t)(g->index_cap - 1);
    while (g->index[h] >= 0) h = (h + 1) & (uint64_t)(g->index_cap - 1);
    g->index[h] = tid;
    if (id) *id = tid;
    return TIDE_OK;
}

void tide_graph_set_tensor_layer(tide_graph *g, int tensor, int layer) {
    if (tensor >= 0 && tensor < g->n_tensors) g->tensors[tensor].layer = layer;
}

tide_status tide_graph_set_tensor_home(tide_graph *g, int tensor, const char *home, uint64_t offset) {
    if (tensor < 0 || tensor >= g->n_tensors) return tide_err(g->ctx, TIDE_E_INVALID, "no tensor %d", tensor);
    tide_tensor *t = &g->tensors[tensor];
    char *h = tide_strdup(home);
    if (!h) return tide_err(g->ctx, TIDE_E_NOMEM, "out of memory naming the home of '%s'", t->name);
    tide_free(t->home);
    t->home = h;
    t->home_off = offset;
    return TIDE_OK;
}

const char *tide_graph_tensor_home(const tide_graph *g, int tensor, uint64_t *offset) {
    const tide_tensor *t = &g->tensors[tensor];
    if (offset) *offset = t->home ? t->home_off : 0;
    return t->home ? t->home : t->name;
}

bool tide_op_reads(const tide_op *op, int t) {
    for (int i = 0; i < op->n_in; i++)
        if (op->in[i] == t) return true;
    return false;
}

bool tide_op_writes(const tide_op *op, int t) {
    for (int i = 0; i < op->n_out; i++)
        if (op->out[i] == t) return true;
    return false;
}

/* ---- shape contracts */

#define T(i) (&g->tensors[in[i]])
#define O(i) (&g->tensors[out[i]])
#define FAIL(...) return tide_err(g->ctx, TIDE_E_INVALID, __VA_ARGS__)

static bool is_act(const tide_tensor *t) { return t->dtype == TIDE_F32 && t->ndim == 2; }
static bool is_float(tide_dtype d) { return d == TIDE_F32 || d == TIDE_F16 || d == TIDE_BF16; }

static tide_status check_op(tide_graph *g, tide_op_kind kind, int n_in, const int *in, int n_out,
                            const int *out, const tide_op_params *p, double *flops) {
    const char *nm = tide_op_name(kind);
    /* inputs: fewest, most (-1: any); outputs */
    static const signed char arity[TIDE_OP_COUNT][3] = {
        [TIDE_OP_EMBED] = {2, 3, 1},     [TIDE_OP_RMSNORM] = {2, 2, 1}, [TIDE_OP_MATMUL] = {2, 3, 1},
        [TIDE_OP_ROPE] = {2, 2, 1},      [TIDE_OP_ATTENTION] = {4, 6, 3}, [TIDE_OP_SILU_MUL] = {2, 2, 1},
        [TIDE_OP_ADD] = {2, 2, 1},       [TIDE_OP_TAKE_LAST] = {1, 2, 1}, [TIDE_OP_ARGMAX] = {1, 1, 1},
        [TIDE_OP_GENERIC] = {-1, -1, -1},
    };
    /* ATTENTION takes 4 inputs when its cache is written fresh (never read beyond
     * what it writes itself), 6 when it reads the caches too. The tiled forms
     * of EMBED, MATMUL and TAKE_LAST take their own output as a last input. */
    if (arity[kind][0] >= 0 && (n_in < arity[kind][0] || n_in > arity[kind][1] || n_out != arity[kind][2] ||
                                (kind == TIDE_OP_ATTENTION && n_in == 5)))
        FAIL("%s takes %d%s inputs and %d outputs, got %d and %d", nm, arity[kind][0],
             arity[kind][1] > arity[kind][0] ? " or more" : "", arity[kind][2], n_in, n_out);
    if ((kind == TIDE_OP_EMBED || kind == TIDE_OP_MATMUL || kind == TIDE_OP_TAKE_LAST) &&
        n_in == arity[kind][1] && in[n_in - 1] != out[0])
        FAIL("%s: its last input must be its output '%s' (a tile written into it)", nm, O(0)->name);
    if (p->idx0 < 0 || p->row0 < 0 || p->col0 < 0 || p->vocab0 < 0 || p->vocab < 0)
        FAIL("%s: negative tile offset", nm);
    *flops = 0;
    switch (kind) {
    case TIDE_OP_EMBED: {
        const tide_tensor *tab = T(0), *tok = T(1), *o = O(0);
        if (tab->ndim != 2 || !is_float(tab->dtype)) FAIL("embed: table '%s' must be a 2-D float tensor", tab->name);
        if (tok->dtype != TIDE_I32) FAIL("embed: tokens '%s' must be i32", tok->name);
        if (!is_act(o) || o->shape[1] != tab->shape[1] || p->idx0 + o->shape[0] > tide_tensor_numel(tok))
            FAIL("embed: output '%s' must be f32 (rows, %lld) with rows from '%s'[%lld] on", o->name,
                 (long long)tab->shape[1], tok->name, (long long)p->idx0);
        if (p->vocab && p->vocab0 + tab->shape[0] > p->vocab)
            FAIL("embed: table '%s' (ids %lld..) runs past the vocabulary of %lld", tab->name,
                 (long long)p->vocab0, (long long)p->vocab);
        break;
    }
    case TIDE_OP_RMSNORM: {
        const tide_tensor *x = T(0), *w = T(1), *o = O(0);
        if (!is_act(x) || !is_act(o) || x->shape[0] != o->shape[0] || x->shape[1] != o->shape[1])
            FAIL("rmsnorm: input '%s' and output '%s' must be f32 of one 2-D shape", x->name, o->name);
        if (!is_float(w->dtype) || tide_tensor_numel(w) != x->shape[1])
            FAIL("rmsnorm: weight '%s' must have %lld elements", w->name, (long long)x->shape[1]);
        if (!(p->eps > 0)) FAIL("rmsnorm: eps must be positive");
        *flops = 4.0 * (double)tide_tensor_numel(x);
        break;
    }
    case TIDE_OP_MATMUL: {
        const tide_tensor *x = T(0), *w = T(1), *o = O(0);
        if (!is_act(x) || !is_act(o)) FAIL("matmul: '%s' and '%s' must be 2-D f32", x->name, o->name);
        if (w->ndim != 2 || !is_float(w->dtype)) FAIL("matmul: weight '%s' must be 2-D float", w->name);
        if (w->shape[1] != x->shape[1] || o->shape[0] < p->row0 + x->shape[0] ||
            o->shape[1] < p->col0 + w->shape[0])
            FAIL("matmul: shapes (%lld,%lld) x (%lld,%lld)^T -> (%lld,%lld) at (%lld,%lld) do not agree ('%s')",
                 (long long)x->shape[0], (long long)x->shape[1], (long long)w->shape[0],
                 (long long)w->shape[1], (long long)o->shape[0], (long long)o->shape[1],
                 (long long)p->row0, (long long)p->col0, w->name);
        *flops = 2.0 * (double)x->shape[0] * (double)w->shape[0] * (double)w->shape[1];
        break;
    }
    case TIDE_OP_ROPE: {
        const tide_tensor *x = T(0), *pos = T(1), *o = O(0);
        if (!is_act(x) || !is_act(o) || x->shape[0] != o->shape[0] || x->shape[1] != o->shape[1])
            FAIL("rope: '%s' and '%s' must be f32 of one 2-D shape", x->name, o->name);
        if (p->n_heads <= 0 || p->head_dim <= 0 || p->head_dim % 2 ||
            (int64_t)p->n_heads * p->head_dim != x->shape[1])
            FAIL("rope: n_heads %d x head_dim %d (even) must equal %lld", p->n_heads, p->head_dim,
                 (long long)x->shape[1]);
        if (pos->dtype != TIDE_I32 || p->batch <= 0 || x->shape[0] % p->batch ||
            p->idx0 + x->shape[0] / p->batch > tide_tensor_numel(pos))
            FAIL("rope: batch %d x positions '%s' (from %lld) must cover %lld rows", p->batch, pos->name,
                 (long long)p->idx0, (long long)x->shape[0]);
        if (!(p->rope_theta > 0)) FAIL("rope: rope_theta must be positive");
        *flops = 6.0 * (double)tide_tensor_numel(x);
        break;
    }
    case TIDE_OP_ATTENTION: {
        const tide_tensor *q = T(0), *k = T(1), *v = T(2), *pos = T(3), *kc = O(1), *vc = O(2);
        const tide_tensor *o = O(0);
        if (p->n_heads <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0 || p->batch <= 0 ||
            p->n_heads % p->n_kv_heads)
            FAIL("attention: n_heads %d must be a positive multiple of n_kv_heads %d", p->n_heads,
                 p->n_kv_heads);
        int64_t R = q->shape[0], qd = (int64_t)p->n_heads * p->head_dim,
                kd = (int64_t)p->n_kv_heads * p->head_dim;
        if (!is_act(q) || q->shape[1] != qd || !is_act(o) || o->shape[0] != R || o->shape[1] != qd)
            FAIL("attention: q '%s' and output '%s' must be f32 (%lld, %lld)", q->name, o->name,
                 (long long)R, (long long)qd);
        if (!is_act(k) || !is_act(v) || k->shape[0] != R || v->shape[0] != R ||
            k->shape[1] != kd || v->shape[1] != kd)
            FAIL("attention: k '%s' and v '%s' must be f32 (%lld, %lld)", k->name, v->name,
                 (long long)R, (long long)kd);
        int64_t T_ = R % p->batch ? -1 : R / p->batch;
        if (pos->dtype != TIDE_I32 || T_ < 0 || p->idx0 + T_ > tide_tensor_numel(pos))
            FAIL("attention: batch %d x positions '%s' (from %lld) must cover %lld rows", p->batch, pos->name,
                 (long long)p->idx0, (long long)R);
        if (n_in == 4 && p->idx0)
            FAIL("attention: a fresh cache is written from position 0; a later tile reads it (6 inputs)");
        for (int c = 1; c <= 2; c++) {
            const tide_tensor *cc = O(c);
            if (cc->dtype != TIDE_F32 || cc->ndim != 3 || cc->shape[0] != p->batch ||
                cc->shape[2] != kd || cc->shape[1] < T_)
                FAIL("attention: cache '%s' must be f32 (%d, >= %lld, %lld)", cc->name, p->batch,
                     (long long)T_, (long long)kd);
        }
        if (kc->shape[1] != vc->shape[1]) FAIL("attention: k and v caches differ in length");
        if (n_in == 6 && (out[1] != in[4] || out[2] != in[5]))
            FAIL("attention: outputs 2 and 3 must be the caches it reads ('%s', '%s')", kc->name,
                 vc->name);
        if (out[1] == out[2]) FAIL("attention: the k and v caches must be two tensors");
        /* QK^T and PV over the causal span: about T/2 keys per query when the
         * cache is fresh, idx0 + T/2 for a later tile of a prefill, about half
         * the cache otherwise. */
        double keys = n_in == 4 ? 0.5 * (double)T_
                    : p->idx0 ? (double)p->idx0 + 0.5 * (double)T_ : 0.5 * (double)kc->shape[1];
        *flops = 4.0 * (double)R * (double)qd * keys;
        break;
    }
    case TIDE_OP_SILU_MUL:
    case TIDE_OP_ADD: {
        const tide_tensor *a = T(0), *b = T(1), *o = O(0);
        if (!is_act(a) || !is_act(b) || !is_act(o) || a->shape[0] != b->shape[0] ||
            a->shape[1] != b->shape[1] || a->shape[0] != o->shape[0] || a->shape[1] != o->shape[1])
            FAIL("%s: '%s', '%s' and '%s' must be f32 of one 2-D shape", nm, a->name, b->name, o->name);
        *flops = (kind == TIDE_OP_ADD ? 1.0 : 6.0) * (double)tide_tensor_numel(a);
        break;
    }
    case TIDE_OP_TAKE_LAST: {
        const tide_tensor *x = T(0), *o = O(0);
        if (!is_act(x) || !is_act(o) || p->batch <= 0 || o->shape[0] < p->row0 + p->batch ||
            o->shape[1] != x->shape[1] || x->shape[0] % p->batch)
            FAIL("take_last: '%s' must be f32 (>= %lld, %lld) taken from rows of '%s'", o->name,
                 (long long)(p->row0 + p->batch), (long long)x->shape[1], x->name);
        break;
    }
    case TIDE_OP_ARGMAX: {
        const tide_tensor *x = T(0), *o = O(0);
        if (!is_act(x) || o->dtype != TIDE_I32 || tide_tensor_numel(o) != x->shape[0])
            FAIL("argmax: '%s' must be i32 with one element per row of '%s'", o->name, x->name);
        *flops = (double)tide_tensor_numel(x);
        break;
    }
    case TIDE_OP_GENERIC:
        if (n_in < 0 || n_in > TIDE_OP_MAX_IN || n_out < 1 || n_out > TIDE_OP_MAX_OUT)
            FAIL("generic: 0 to %d inputs and 1 to %d outputs allowed", TIDE_OP_MAX_IN, TIDE_OP_MAX_OUT);
        if (!(p->flops >= 0) || !isfinite(p->flops)) FAIL("generic: flops must be finite and >= 0");
        *flops = p->flops;
        break;
    default:
        FAIL("unknown op kind %d", (int)kind);
    }
    return TIDE_OK;
}

tide_status tide_graph_add_op(tide_graph *g, tide_op_kind kind, int n_in, const int *in,
                              int n_out, const int *out, const tide_op_params *params,
                              int layer, int *id) {
    static const tide_op_params none = {0};
    const tide_op_params *p = params ? params : &none;
    if ((unsigned)kind >= TIDE_OP_COUNT) FAIL("unknown op kind %d", (int)kind);
    if (n_in < 0 || n_in > TIDE_OP_MAX_IN || n_out < 0 || n_out > TIDE_OP_MAX_OUT)
        FAIL("%s: too many inputs or outputs", tide_op_name(kind));
    for (int i = 0; i < n_in; i++)
        if (in[i] < 0 || in[i] >= g->n_tensors) FAIL("%s: input %d is not a tensor of the graph", tide_op_name(kind), i);
    for (int i = 0; i < n_out; i++) {
        if (out[i] < 0 || out[i] >= g->n_tensors) FAIL("%s: output %d is not a tensor of the graph", tide_op_name(kind), i);
        tide_role r = g->tensors[out[i]].role;
        if (r == TIDE_ROLE_WEIGHT || r == TIDE_ROLE_INPUT)
            FAIL("%s writes '%s', a %s tensor", tide_op_name(kind), g->tensors[out[i]].name, tide_role_name(r));
    }
    double flops = 0;
    tide_status st = check_op(g, kind, n_in, in, n_out, out, p, &flops);
    if (st) return st;
    if (tide_grow((void **)&g->ops, &g->cap_ops, g->n_ops + 1, sizeof *g->ops))
        return tide_err(g->ctx, TIDE_E_NOMEM, "out of memory adding an op");
    tide_op *op = &g->ops[g->n_ops];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->n_in = n_in;
    op->n_out = n_out;
    if (n_in) memcpy(op->in, in, (size_t)n_in * sizeof *in);
    if (n_out) memcpy(op->out, out, (size_t)n_out * sizeof *out);
    op->p = *p;
    op->layer = layer;
    op->flops = flops;
    if (kind == TIDE_OP_MATMUL && g->tensors[in[1]].dtype != TIDE_F32) {
        /* the CPU converts the weight to f32 in column blocks of this size */
        uint64_t wb = (uint64_t)tide_tensor_numel(&g->tensors[in[1]]) * 4;
        op->scratch_bytes = TIDE_MIN(wb, UINT64_C(16) << 20);
    }
    if (id) *id = g->n_ops;
    g->n_ops++;
    return TIDE_OK;
}
#undef T
#undef O
#undef FAIL

int tide_graph_n_tensors(const tide_graph *g) { return g->n_tensors; }
int tide_graph_n_ops(const tide_graph *g) { return g->n_ops; }
const char *tide_graph_tensor_name(const tide_graph *g, int id) { return g->tensors[id].name; }
tide_role tide_graph_tensor_role(const tide_graph *g, int id) { return g->tensors[id].role; }
tide_dtype tide_graph_tensor_dtype(const tide_graph *g, int id) { return g->tensors[id].dtype; }
uint64_t tide_graph_tensor_bytes(const tide_graph *g, int id) { return g->tensors[id].nbytes; }

int tide_graph_tensor_shape(const tide_graph *g, int id, int64_t shape[TIDE_MAX_DIMS]) {
    const tide_tensor *t = &g->tensors[id];
    for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
    return t->ndim;
}

uint64_t tide_graph_role_bytes(const tide_graph *g, tide_role role) {
    uint64_t s = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == role) s += g->tensors[i].nbytes;
    return s;
}

double tide_graph_flops(const tide_graph *g) {
    double f = 0;
    for (int i = 0; i < g->n_ops; i++) f += g->ops[i].flops;
    return f;
}
