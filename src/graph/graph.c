/*
 * graph.c - the graph builder: tensors with roles and ops in execution order,
 * each op checked against its kind's contract (ops.c) as it is added.
 */
#include "graph/graph.h"

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
    if (shape[ndim - 1] % tide_dtype_block(dt))
        return tide_err(ctx, TIDE_E_INVALID, "tensor '%s': rows of %lld elements are not whole %s blocks of %d",
                        name, (long long)shape[ndim - 1], tide_dtype_name(dt), tide_dtype_block(dt));
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
    t->nbytes = tide_dtype_bytes(dt, numel);
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

#define FAIL(...) return tide_err(g->ctx, TIDE_E_INVALID, __VA_ARGS__)

tide_status tide_graph_add_op(tide_graph *g, tide_op_kind kind, int n_in, const int *in,
                              int n_out, const int *out, const tide_op_params *params,
                              int layer, int *id) {
    tide_op_args a = {0};
    if (params) {
        a.eps = params->eps;
        a.rope_theta = params->rope_theta;
        a.n_heads = params->n_heads;
        a.n_kv_heads = params->n_kv_heads;
        a.head_dim = params->head_dim;
        a.batch = params->batch;
        a.no_transpose = params->no_transpose;
        a.accumulate = params->accumulate;
        a.scale = params->scale;
        a.beta1 = params->beta1;
        a.beta2 = params->beta2;
        a.adam_eps = params->adam_eps;
        a.weight_decay = params->weight_decay;
        a.max_norm = params->max_norm;
    }
    return tide_graph_add_op_args(g, kind, n_in, in, n_out, out, &a, layer, id);
}

tide_status tide_graph_add_op_args(tide_graph *g, tide_op_kind kind, int n_in, const int *in, int n_out,
                                   const int *out, const tide_op_args *params, int layer, int *id) {
    static const tide_op_args none = {0};
    const tide_op_args *p = params ? params : &none;
    const tide_op_desc *d = tide_op_desc_of(kind);
    if (!d) FAIL("unknown op kind %d", (int)kind);
    if (n_in < 0 || n_in > TIDE_OP_MAX_IN || n_out < 0 || n_out > TIDE_OP_MAX_OUT)
        FAIL("%s: too many inputs or outputs", d->name);
    for (int i = 0; i < n_in; i++)
        if (in[i] < 0 || in[i] >= g->n_tensors) FAIL("%s: input %d is not a tensor of the graph", d->name, i);
    for (int i = 0; i < n_out; i++) {
        if (out[i] < 0 || out[i] >= g->n_tensors) FAIL("%s: output %d is not a tensor of the graph", d->name, i);
        tide_role r = g->tensors[out[i]].role;
        if (r == TIDE_ROLE_WEIGHT || r == TIDE_ROLE_INPUT)
            FAIL("%s writes '%s', a %s tensor", d->name, g->tensors[out[i]].name, tide_role_name(r));
    }
    double flops = 0;
    tide_status st = tide_op_check(g, kind, n_in, in, n_out, out, p, &flops);
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
    op->micro_batch = -1;
    op->flops = flops;
    op->scratch_bytes = d->scratch ? d->scratch(g, op) : 0;
    if (id) *id = g->n_ops;
    g->n_ops++;
    return TIDE_OK;
}
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
