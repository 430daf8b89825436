/*
 * train_ranks.c - one data-parallel rank's training step (train_ranks.h):
 * the step graph of its own micro-batches with the collectives of data
 * parallelism over `ranks` ranks, made from the single-device step graph.
 *
 *   ZeRO-0  every rank a full copy: each gradient all-reduced in place
 *           (ALL_REDUCE) right after the backward's last write of it, so
 *           it overlaps the rest of the backward; the sum of squares and
 *           AdamW as on one device.
 *   ZeRO-1  optimizer state sharded: master weights and moments hold the
 *   ZeRO-2  rank's ceil(rows / ranks) rows of each parameter (rank 0's
 *           shard, the largest); each gradient reduce-scattered into the
 *           rank's shard "grad.NAME.shard" (REDUCE_SCATTER), AdamW updating
 *           the shard "NAME.shard" of the parameter and its master and
 *           moments, the updated rows all-gathered into the parameter
 *           (ALL_GATHER) after its update. The global norm is exact: the
 *           sum of squares of the rank's shards, all-reduced (a scalar)
 *           before the first update. ZeRO-1 keeps the whole gradient until
 *           the backward ends (the reduce-scatters follow the backward's
 *           last op); ZeRO-2 reduce-scatters each gradient as soon as the
 *           backward has written it (buckets of one parameter's gradient),
 *           so the whole gradient is never held at once. With several
 *           micro-batches, ZeRO-2 would reduce-scatter each micro-batch's
 *           gradients into the shard: not built (an error says so).
 */
#include "train/train_ranks.h"

#include "graph/graph.h"

#include <stdio.h>
#include <string.h>

typedef struct rank_build {
    tide_ctx *ctx;
    const tide_graph *g;
    tide_graph *h;
    int ranks, zero;
    int *map;       /* tensor of g -> tensor of h */
    int *last_w;    /* per tensor of g: the last op writing it before the optimizer */
    int *shard;     /* per gradient of g: its shard in h (-1) */
    int *wshard;    /* per parameter of g: its shard in h (-1) */
    bool *sharded;  /* per tensor of g: master or moment, made a shard */
    bool *is_grad;  /* per tensor of g: an AdamW's gradient */
    tide_status st;
} rank_build;

static void add_tensor(rank_build *b, const char *name, const tide_tensor *like, tide_role role, bool shard,
                       int *id) {
    if (b->st) return;
    int64_t shape[TIDE_MAX_DIMS];
    memcpy(shape, like->shape, sizeof shape);
    if (shard && like->ndim > 0) shape[0] = (shape[0] + b->ranks - 1) / b->ranks;
    b->st = tide_graph_add_tensor(b->h, name, like->dtype, role, like->ndim, shape, id);
    if (!b->st) tide_graph_set_tensor_layer(b->h, *id, like->layer);
}

static void add_op(rank_build *b, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
                   const tide_op_args *a, int layer) {
    if (!b->st) b->st = tide_graph_add_op_args(b->h, kind, n_in, in, n_out, out, a, layer, NULL);
}

/* The collective of gradient t of g (ZeRO-0: all-reduce in place; else the
 * reduce-scatter into its shard). */
static void grad_collective(rank_build *b, int t, int layer) {
    tide_op_args a = {.ranks = b->ranks};
    int x = b->map[t];
    if (b->zero == 0) add_op(b, TIDE_OP_ALL_REDUCE, 1, &x, 1, &x, &a, layer);
    else add_op(b, TIDE_OP_REDUCE_SCATTER, 1, &x, 1, &b->shard[t], &a, layer);
}


tide_status tide_train_rank_graph(tide_ctx *ctx, const tide_graph *g, int ranks, int zero, tide_graph **out) {
    *out = NULL;
    if (ranks < 1 || ranks > TIDE_TRAIN_RANKS_MAX)
        return tide_err(ctx, TIDE_E_INVALID, "data parallelism needs 1 to %d ranks (got %d)", TIDE_TRAIN_RANKS_MAX,
                        ranks);
    if (zero < 0 || zero > 2) return tide_err(ctx, TIDE_E_INVALID, "--zero must be 0, 1 or 2 (got %d)", zero);
    int first_opt = -1; /* the first SUMSQ: where the optimizer starts */
    for (int i = 0; i < g->n_ops && first_opt < 0; i++)
        if (g->ops[i].kind == TIDE_OP_SUMSQ) first_opt = i;
    if (first_opt < 0) return tide_err(ctx, TIDE_E_INVALID, "data parallelism: the graph is not a training step");
    rank_build b = {.ctx = ctx, .g = g, .ranks = ranks, .zero = zero, .h = tide_graph_new(ctx)};
    size_t nt = (size_t)(g->n_tensors ? g->n_tensors : 1);
    b.map = tide_malloc(nt * sizeof *b.map);
    b.last_w = tide_malloc(nt * sizeof *b.last_w);
    b.shard = tide_malloc(nt * sizeof *b.shard);
    b.wshard = tide_malloc(nt * sizeof *b.wshard);
    b.sharded = tide_calloc(nt, sizeof *b.sharded);
    b.is_grad = tide_calloc(nt, sizeof *b.is_grad);
    if (!b.h || !b.map || !b.last_w || !b.shard || !b.wshard || !b.sharded || !b.is_grad) {
        b.st = tide_err(ctx, TIDE_E_NOMEM, "out of memory building a rank's step");
        goto done;
    }
    for (int t = 0; t < g->n_tensors; t++) b.last_w[t] = b.shard[t] = b.wshard[t] = -1;
    for (int i = 0; i < first_opt; i++)
        for (int j = 0; j < g->ops[i].n_out; j++) b.last_w[g->ops[i].out[j]] = i;
    /* sharded state: ADAMW's master and moments (inputs 1 .. n_out - 1) */
    for (int i = first_opt; i < g->n_ops; i++)
        if (g->ops[i].kind == TIDE_OP_ADAMW) {
            b.is_grad[g->ops[i].in[g->ops[i].n_in - 3]] = true;
            for (int k = 1; zero > 0 && k < g->ops[i].n_out; k++) b.sharded[g->ops[i].in[k]] = true;
        }
    /* the tensors, then the shards */
    for (int t = 0; t < g->n_tensors && !b.st; t++) {
        const tide_tensor *T = &g->tensors[t];
        if (zero > 0 && T->role == TIDE_ROLE_OUTPUT && b.is_grad[t])
            b.st = tide_err(ctx, TIDE_E_UNSUPPORTED, "data parallelism: gradients as outputs (grads_out) are not "
                            "planned with sharded state");
        add_tensor(&b, T->name, T, T->role, b.sharded[t], &b.map[t]);
        if (!b.st && T->home && !b.sharded[t])
            b.st = tide_graph_set_tensor_home(b.h, b.map[t], T->home, T->home_off);
    }
    if (zero > 0)
        for (int i = first_opt; i < g->n_ops && !b.st; i++) {
            const tide_op *op = &g->ops[i];
            if (op->kind != TIDE_OP_ADAMW) continue;
            int w = op->in[0], gr = op->in[op->n_in - 3];
            char name[256];
            snprintf(name, sizeof name, "%s.shard", g->tensors[gr].name);
            add_tensor(&b, name, &g->tensors[gr], TIDE_ROLE_TEMP, true, &b.shard[gr]);
            snprintf(name, sizeof name, "%s.shard", g->tensors[w].name);
            add_tensor(&b, name, &g->tensors[w], TIDE_ROLE_STATE, true, &b.wshard[w]);
        }
    /* the forward and backward, each gradient's collective after its last
     * write (ZeRO-1: after the backward) */
    for (int i = 0; i < first_opt && !b.st; i++) {
        const tide_op *op = &g->ops[i];
        int in[TIDE_OP_MAX_IN], o[TIDE_OP_MAX_OUT];
        for (int k = 0; k < op->n_in; k++) in[k] = b.map[op->in[k]];
        for (int k = 0; k < op->n_out; k++) o[k] = b.map[op->out[k]];
        add_op(&b, op->kind, op->n_in, in, op->n_out, o, &op->p, op->layer);
        if (zero == 1) continue;
        for (int k = 0; k < op->n_out; k++) {
            int t = op->out[k];
            bool dup = false;
            for (int j = 0; j < k; j++) dup = dup || op->out[j] == t;
            if (!dup && b.last_w[t] == i && b.is_grad[t]) grad_collective(&b, t, op->layer);
        }
    }
    if (zero == 1)
        for (int i = first_opt; i < g->n_ops && !b.st; i++)
            if (g->ops[i].kind == TIDE_OP_ADAMW) grad_collective(&b, g->ops[i].in[g->ops[i].n_in - 3], g->ops[i].layer);
    /* the optimizer: sums of squares (of the shards), their all-reduce,
     * then the updates (of the shards, each all-gathered) */
    int sumsq = -1;
    for (int i = first_opt; i < g->n_ops && !b.st; i++) {
        const tide_op *op = &g->ops[i];
        int in[TIDE_OP_MAX_IN], o[TIDE_OP_MAX_OUT];
        for (int k = 0; k < op->n_in; k++) in[k] = b.map[op->in[k]];
        for (int k = 0; k < op->n_out; k++) o[k] = b.map[op->out[k]];
        if (op->kind == TIDE_OP_SUMSQ) {
            if (zero > 0) in[0] = b.shard[op->in[0]];
            sumsq = o[0];
            add_op(&b, op->kind, op->n_in, in, op->n_out, o, &op->p, op->layer);
            bool last = i + 1 >= g->n_ops || g->ops[i + 1].kind != TIDE_OP_SUMSQ;
            tide_op_args a = {.ranks = ranks};
            if (last && zero > 0) add_op(&b, TIDE_OP_ALL_REDUCE, 1, &sumsq, 1, &sumsq, &a, op->layer);
            continue;
        }
        if (op->kind == TIDE_OP_ADAMW && zero > 0) {
            int w = op->in[0];
            in[0] = o[0] = b.wshard[w];
            in[op->n_in - 3] = b.shard[op->in[op->n_in - 3]];
            add_op(&b, op->kind, op->n_in, in, op->n_out, o, &op->p, op->layer);
            tide_op_args a = {.ranks = ranks};
            int full = b.map[w];
            add_op(&b, TIDE_OP_ALL_GATHER, 1, &b.wshard[w], 1, &full, &a, op->layer);
            continue;
        }
        add_op(&b, op->kind, op->n_in, in, op->n_out, o, &op->p, op->layer);
    }
done:
    tide_free(b.map);
    tide_free(b.last_w);
    tide_free(b.shard);
    tide_free(b.wshard);
    tide_free(b.sharded);
    tide_free(b.is_grad);
    if (b.st) {
        tide_graph_free(b.h);
        return b.st;
    }
    *out = b.h;
    return TIDE_OK;
}

tide_status train_ranks_apply(tide_ctx *ctx, const tide_llama_train_opts *o, tide_graph **g) {
    tide_graph *h = NULL;
    tide_status st = TIDE_OK;
    if (o->zero == 2 && o->accum > 1)
        st = tide_err(ctx, TIDE_E_UNSUPPORTED, "--zero 2 with --accum %d: reduce-scattering each micro-batch's "
                      "gradients into the shard is not built (use --zero 1, or --accum 1)", o->accum);
    if (!st) st = tide_train_rank_graph(ctx, *g, o->ranks, o->zero, &h);
    tide_graph_free(*g);
    *g = h;
    return st;
}
