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
 *           so the whole gradient is never held at once.
 *
 * ZeRO-2 over several micro-batches: each micro-batch M > 0 writes its own
 * gradient "grad.NAME.mbM" (micro-batch 0's is "grad.NAME"), its first
 * write made the fresh form micro-batch 0's first write has (the same op
 * without the accumulating input: the graph's micro-batches are one op
 * sequence), so no gradient outlives its micro-batch and the planner
 * reuses its memory for the next. After a micro-batch's last write of a
 * gradient it is reduce-scattered: micro-batch 0's straight into the shard,
 * a later one's into "grad.NAME.shard.mbM", added into the shard (ADD, in
 * place). The shard is so summed in micro-batch order of the ranks' sums:
 * shard = (..((rs(g0) + rs(g1)) + rs(g2)) ..), rs summing over the ranks
 * in MPI's order, where one process adds the micro-batches' contributions
 * into one gradient op by op: equal up to f32 summation order.
 */
#include "train/train_ranks.h"

#include "graph/graph.h"

#include <stdio.h>
#include <stdlib.h>
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
    /* ZeRO-2 over micro-batches (n_mb > 1; else all NULL) */
    int n_mb;
    int *mb;        /* per op of g before the optimizer: its micro-batch */
    int *gmb;       /* per gradient t and micro-batch m (t * n_mb + m): its tensor in h (-1) */
    int *first_mb;  /* the same: the first op writing it in the micro-batch (-1) */
    int *last_mb;   /* the same: the last op writing it (-1) */
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

/* Each op before the optimizer's micro-batch (tide_op.micro_batch, set by
 * the step's builder; an op with none, the one before it), and their
 * number. */
static int op_mbs(const tide_graph *g, int first_opt, int *mb) {
    int cur = 0, n = 1;
    for (int i = 0; i < first_opt; i++) {
        if (g->ops[i].micro_batch >= 0) cur = g->ops[i].micro_batch;
        mb[i] = cur;
        n = TIDE_MAX(n, cur + 1);
    }
    return n;
}

/* ZeRO-2 over micro-batches: the tensors of gradient t (micro-batch 0's
 * the gradient itself) and its writes in each micro-batch. */
static void mb_grads(rank_build *b, int first_opt) {
    const tide_graph *g = b->g;
    const int M = b->n_mb;
    for (int i = 0; i < first_opt; i++)
        for (int k = 0; k < g->ops[i].n_out; k++) {
            int t = g->ops[i].out[k];
            if (!b->is_grad[t]) continue;
            int at = t * M + b->mb[i];
            if (b->first_mb[at] < 0) b->first_mb[at] = i;
            b->last_mb[at] = i;
        }
    for (int t = 0; t < g->n_tensors && !b->st; t++) {
        if (!b->is_grad[t]) continue;
        b->gmb[t * M] = b->map[t];
        for (int m = 1; m < M && !b->st; m++) {
            if (b->first_mb[t * M + m] < 0) continue;
            char name[256];
            snprintf(name, sizeof name, "%s.mb%d", g->tensors[t].name, m);
            add_tensor(b, name, &g->tensors[t], TIDE_ROLE_TEMP, false, &b->gmb[t * M + m]);
        }
    }
}

/* Op i of g (micro-batch m > 0) as the rank emits it: its gradients the
 * micro-batch's, and where it is the micro-batch's first write of one that
 * it accumulates into, the fresh form of micro-batch 0's first write (the
 * same op, the gradient not an input, args' accumulate as there). */
static void mb_op(rank_build *b, int i, int *n_in, int *in, int *o, tide_op_args *a) {
    const tide_graph *g = b->g;
    const tide_op *op = &g->ops[i];
    const int M = b->n_mb, m = b->mb[i];
    for (int k = 0; k < op->n_out && !b->st; k++) {
        int t = op->out[k];
        if (!b->is_grad[t]) continue;
        o[k] = b->gmb[t * M + m];
        if (b->first_mb[t * M + m] != i || !tide_op_reads(op, t)) continue;
        const tide_op *f0 = b->first_mb[t * M] >= 0 ? &g->ops[b->first_mb[t * M]] : NULL;
        bool fresh = f0 && f0->kind == op->kind && f0->n_out == op->n_out && f0->n_in + 1 == op->n_in &&
                     *n_in == op->n_in && op->in[op->n_in - 1] == t && !tide_op_reads(f0, t);
        for (int j = 0; fresh && j < op->n_in - 1; j++) fresh = op->in[j] != t;
        if (!fresh) {
            b->st = tide_err(b->ctx, TIDE_E_UNSUPPORTED, "data parallelism: ZeRO-2 over micro-batches: op %d "
                             "accumulates into gradient '%s' in a form micro-batch 0 does not start fresh", i,
                             g->tensors[t].name);
            return;
        }
        *n_in = op->n_in - 1;
        a->accumulate = f0->p.accumulate;
    }
    for (int k = 0; k < *n_in; k++)
        if (b->is_grad[op->in[k]]) in[k] = b->gmb[op->in[k] * M + m];
}

/* ZeRO-2 over micro-batches: micro-batch m's gradient t reduce-scattered,
 * into the shard (m = 0) or into its own shard added into it. */
static void mb_collective(rank_build *b, int t, int m, int layer) {
    tide_op_args a = {.ranks = b->ranks};
    int x = b->gmb[t * b->n_mb + m];
    if (m == 0) {
        add_op(b, TIDE_OP_REDUCE_SCATTER, 1, &x, 1, &b->shard[t], &a, layer);
        return;
    }
    char name[280];
    snprintf(name, sizeof name, "%s.shard.mb%d", b->g->tensors[t].name, m);
    int part = -1;
    add_tensor(b, name, &b->g->tensors[t], TIDE_ROLE_TEMP, true, &part);
    add_op(b, TIDE_OP_REDUCE_SCATTER, 1, &x, 1, &part, &a, layer);
    int in[2] = {b->shard[t], part};
    add_op(b, TIDE_OP_ADD, 2, in, 1, &b->shard[t], NULL, layer);
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
    /* ZeRO-2: the micro-batches, each with gradients of its own */
    if (zero == 2 && !b.st && first_opt > 0) {
        b.mb = tide_malloc((size_t)first_opt * sizeof *b.mb);
        if (!b.mb) b.st = tide_err(ctx, TIDE_E_NOMEM, "out of memory building a rank's step");
        else b.n_mb = op_mbs(g, first_opt, b.mb);
        if (!b.st && b.n_mb > 1) {
            size_t n = nt * (size_t)b.n_mb;
            b.gmb = tide_malloc(n * sizeof *b.gmb);
            b.first_mb = tide_malloc(n * sizeof *b.first_mb);
            b.last_mb = tide_malloc(n * sizeof *b.last_mb);
            if (!b.gmb || !b.first_mb || !b.last_mb) {
                b.st = tide_err(ctx, TIDE_E_NOMEM, "out of memory building a rank's step");
            } else {
                for (size_t k = 0; k < n; k++) b.gmb[k] = b.first_mb[k] = b.last_mb[k] = -1;
                mb_grads(&b, first_opt);
            }
        }
    }
    const bool per_mb = b.gmb != NULL;
    /* the forward and backward, each gradient's collective after its last
     * write (ZeRO-1: after the backward; ZeRO-2 over micro-batches: after
     * each micro-batch's last write) */
    for (int i = 0; i < first_opt && !b.st; i++) {
        const tide_op *op = &g->ops[i];
        int in[TIDE_OP_MAX_IN], o[TIDE_OP_MAX_OUT], n_in = op->n_in;
        tide_op_args a = op->p;
        for (int k = 0; k < op->n_in; k++) in[k] = b.map[op->in[k]];
        for (int k = 0; k < op->n_out; k++) o[k] = b.map[op->out[k]];
        if (per_mb) mb_op(&b, i, &n_in, in, o, &a);
        add_op(&b, op->kind, n_in, in, op->n_out, o, &a, op->layer);
        if (zero == 1) continue;
        for (int k = 0; k < op->n_out; k++) {
            int t = op->out[k];
            bool dup = false;
            for (int j = 0; j < k; j++) dup = dup || op->out[j] == t;
            if (dup || !b.is_grad[t]) continue;
            if (per_mb) {
                if (b.last_mb[t * b.n_mb + b.mb[i]] == i) mb_collective(&b, t, b.mb[i], op->layer);
            } else if (b.last_w[t] == i) {
                grad_collective(&b, t, op->layer);
            }
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
    tide_free(b.mb);
    tide_free(b.gmb);
    tide_free(b.first_mb);
    tide_free(b.last_mb);
    if (b.st) {
        tide_graph_free(b.h);
        return b.st;
    }
    *out = b.h;
    return TIDE_OK;
}

tide_status train_ranks_apply(tide_ctx *ctx, const tide_llama_train_opts *o, tide_graph **g) {
    tide_graph *h = NULL;
    tide_status st = tide_train_rank_graph(ctx, *g, o->ranks, o->zero, &h);
    tide_graph_free(*g);
    *g = h;
    return st;
}
