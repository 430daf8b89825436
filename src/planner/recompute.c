/*
 * recompute.c - recomputation schedules: which ops run a second time in an
 * iteration, and where, so that the activations they produce need neither
 * stay on the device nor be stored and loaded back (docs/design.md section 4.5: keep,
 * store+prefetch, or drop+recompute).
 *
 * A schedule is the sequence of positions of one iteration, each naming the
 * op it runs (engine.sched): every op of the graph once, in graph order, plus
 * recomputations inserted before the ops that read their outputs again. The
 * engine plans a schedule like any op sequence: lifetime analysis over
 * positions sees a recomputed tensor's next access after its forward reads
 * as a write, so its value is dead in between and its device copy is dropped
 * after the forward (no STORE); the recomputation is allocated, prefetched
 * and emitted like any COMPUTE.
 *
 * Invariants of a schedule made here (the verifier's rule V2 re-checks them
 * on every plan):
 *   R1 every op appears at its graph position, in graph order; an inserted
 *      recomputation of op p comes after p.
 *   R2 each input of a recomputed op holds, at the recomputation, the version
 *      p's first compute read: it is either itself recomputed just before (in
 *      graph order) or not written by any op between p and the recomputation.
 *   R3 each output of a recomputed op is not written by any other op between
 *      p and the recomputation, and every output is a TEMP (never a
 *      persistent tensor, an input or an output of the step).
 * An op that updates a tensor in place fails R2 (its input has moved on to
 * the version it wrote) and is never recomputed.
 *
 * Layer checkpointing (recompute_schedule with no cost model, the
 * checkpoint-layer policy): a layer's ops form contiguous runs (a training
 * step: its forward run, later its backward run, per micro-batch, and its
 * optimizer updates). A forward run reads no TEMP an earlier run of its
 * layer made. Before each run, the TEMP tensors it reads that an earlier
 * forward run of the same layer produced are recomputed: their producers
 * and, transitively, the producers of those producers' inputs inside the
 * same run (never a backward op: the gradients the optimizer reads are
 * kept). What the chain reads from outside that run (the layer's input, the
 * weights) is kept. Ops for which R2 or R3 fails are not recomputed: their
 * outputs are kept instead.
 *
 * Cheap recomputation (recompute_schedule with a cost model, the tide
 * policy's candidate schedules): the same producers when every input each
 * reads is kept anyway, or (chain > 0) is made by a producer of its run
 * that is itself such a candidate, up to `chain` links deep, and the op
 * with its chain costs less than a round trip of its outputs over the host
 * link (rc_cheap). tide_plan_make plans these schedules (single ops, then
 * chains) beside the plain one and keeps the fastest.
 */
#include "planner/planner_int.h"

#include <string.h>

typedef struct rc_build {
    const tide_graph *g;
    const tide_hw *hw;   /* cheap mode: the cost model; NULL: layer checkpointing */
    int chain;           /* cheap mode: how deep a chain of producers may be recomputed (0: single ops) */
    int *last_read;  /* per tensor: last op reading it, -1 */
    int *run;        /* per op: index of its layer run, -1 outside layers */
    int *run_start;  /* per run: its first op */
    int *prod;       /* per op and operand k < TIDE_OP_MAX_IN: op that last wrote
                        input k before this op, -1 none */
    int *writer;     /* per tensor, during the walk: last op writing it */
    int *mark;       /* per op: run before which it is recomputed (the current one), else -1 */
    bool *fwd;       /* per run: a forward run (reads no TEMP an earlier run of its
                        layer made) */
    int *ok_run;     /* per op: run for which ok[] holds, -1 */
    bool *ok;
    int *wstart;     /* (n_tensors + 1): writers of t are wop[wstart[t] .. wstart[t+1]) */
    int *wop;        /* ascending */
} rc_build;

/* Whether tensor t, as of op `at` (exclusive), was last written by op w
 * (-1: never written): no op in (w, at) writes it. One binary search in
 * t's ascending list of writers. */
static bool rc_unchanged(const rc_build *B, int t, int w, int at) {
    int lo = B->wstart[t], hi = B->wstart[t + 1];
    while (lo < hi) { /* first writer >= at */
        int mid = lo + (hi - lo) / 2;
        if (B->wop[mid] < at) lo = mid + 1;
        else hi = mid;
    }
    int last = lo > B->wstart[t] ? B->wop[lo - 1] : -1;
    return last == w;
}

/* Whether op q can be recomputed before the run starting at op a (R2, R3),
 * memoised for run r: its outputs are TEMPs no other op rewrites before a,
 * it updates nothing in place, and each input is still current at a or is
 * produced by a recomputable op of q's own run. Recursion depth: the length
 * of one layer run. */
static bool rc_ok(rc_build *B, int q, int a, int r) {
    if (B->ok_run[q] == r) return B->ok[q];
    const tide_graph *g = B->g;
    const tide_op *op = &g->ops[q];
    bool ok = true;
    for (int j = 0; j < op->n_out && ok; j++) {
        int t = op->out[j];
        ok = g->tensors[t].role == TIDE_ROLE_TEMP && rc_unchanged(B, t, q, a) && !tide_op_reads(op, t);
    }
    for (int i = 0; i < op->n_in && ok; i++) {
        int w = B->prod[(size_t)q * TIDE_OP_MAX_IN + i];
        ok = (w >= 0 && B->run[w] == B->run[q] && rc_ok(B, w, a, r)) || rc_unchanged(B, op->in[i], w, a);
    }
    B->ok_run[q] = r;
    B->ok[q] = ok;
    return ok;
}

/* Marks op p, when recomputable, and the recomputable in-run producers of
 * its inputs, for recomputation before the run r starting at op a (their
 * outputs are then dropped after their reads and made again; the rest of
 * what they read is kept). */
static void rc_mark(rc_build *B, int p, int a, int r) {
    if (B->mark[p] == r || !rc_ok(B, p, a, r)) return;
    B->mark[p] = r;
    const tide_op *op = &B->g->ops[p];
    for (int i = 0; i < op->n_in; i++) {
        int w = B->prod[(size_t)p * TIDE_OP_MAX_IN + i];
        if (w >= 0 && B->run[w] == B->run[p]) rc_mark(B, w, a, r);
    }
}

/* Cheap mode: the cost of recomputing op p before the run starting at op
 * a, or < 0 when it is not a candidate. p must be recomputable (rc_ok) and
 * each input it reads either kept anyway (persistent, or read again at or
 * after a), so that recomputing frees p's outputs at no cost in memory, or,
 * with depth > 0, the output of an op of p's run that is itself a
 * candidate at depth - 1 (a chain, recomputed in graph order before p). The
 * cost sums p's and its chain's, as the cost model prices them. */
static double rc_chain_cost(rc_build *B, int p, int a, int r, int depth) {
    const tide_graph *g = B->g;
    const tide_op *op = &g->ops[p];
    double c = 0;
    for (int i = 0; i < op->n_in; i++) {
        int t = op->in[i], w = B->prod[(size_t)p * TIDE_OP_MAX_IN + i];
        if (g->tensors[t].role != TIDE_ROLE_TEMP || B->last_read[t] >= a) {
            if (!rc_unchanged(B, t, w, a)) return -1;
            continue;
        }
        if (depth <= 0 || w < 0 || B->run[w] != B->run[p]) return -1;
        double cw = rc_chain_cost(B, w, a, r, depth - 1);
        if (cw < 0) return -1;
        c += cw;
    }
    if (!rc_ok(B, p, a, r)) return -1;
    return c + tide_cost_op(B->hw, g, op);
}

/* Marks op p and its chain (the producers of the inputs it reads that are
 * not kept anyway) for recomputation before run r starting at op a. */
static void rc_chain_mark(rc_build *B, int p, int a, int r) {
    const tide_graph *g = B->g;
    const tide_op *op = &g->ops[p];
    B->mark[p] = r;
    for (int i = 0; i < op->n_in; i++) {
        int t = op->in[i], w = B->prod[(size_t)p * TIDE_OP_MAX_IN + i];
        if (g->tensors[t].role == TIDE_ROLE_TEMP && B->last_read[t] < a && w >= 0 && B->mark[w] != r)
            rc_chain_mark(B, w, a, r);
    }
}

/* Cheap mode: op p (with its chain) is recomputed before the run starting
 * at op a when it is a candidate (rc_chain_cost) and running it again costs
 * less than a round trip of its outputs over the host link (STORE then
 * LOAD), counted as if nothing hid it. */
static bool rc_cheap(rc_build *B, int p, int a, int r) {
    const tide_graph *g = B->g;
    const tide_op *op = &g->ops[p];
    double cost = rc_chain_cost(B, p, a, r, B->chain);
    if (cost < 0) return false;
    double bytes = 0;
    for (int j = 0; j < op->n_out; j++) bytes += (double)g->tensors[op->out[j]].nbytes;
    double trip = 0;
    if (B->hw->h2d_bw > 0) trip += bytes / B->hw->h2d_bw;
    if (B->hw->d2h_bw > 0) trip += bytes / B->hw->d2h_bw;
    return cost < trip;
}

tide_status recompute_schedule(tide_ctx *ctx, const tide_graph *g, const tide_hw *hw, int chain, int **sched_out,
                               int *n_pos_out) {
    int no = g->n_ops, nt = g->n_tensors;
    size_t so = (size_t)(no ? no : 1), st = (size_t)(nt ? nt : 1);
    rc_build B = {.g = g, .hw = hw, .chain = chain};
    B.run = tide_malloc(so * sizeof *B.run);
    B.run_start = tide_malloc(so * sizeof *B.run_start);
    B.prod = tide_malloc(so * TIDE_OP_MAX_IN * sizeof *B.prod);
    B.writer = tide_malloc(st * sizeof *B.writer);
    B.mark = tide_malloc(so * sizeof *B.mark);
    B.ok_run = tide_malloc(so * sizeof *B.ok_run);
    B.fwd = tide_malloc(so * sizeof *B.fwd);
    B.last_read = tide_malloc(st * sizeof *B.last_read);
    B.ok = tide_malloc(so * sizeof *B.ok);
    int n_w = 0;
    for (int i = 0; i < no; i++) n_w += g->ops[i].n_out;
    B.wstart = tide_calloc(st + 1, sizeof *B.wstart);
    B.wop = tide_malloc((size_t)(n_w ? n_w : 1) * sizeof *B.wop);
    int *sched = NULL;
    tide_status rc = TIDE_OK;
    if (!B.run || !B.run_start || !B.prod || !B.writer || !B.mark || !B.ok_run || !B.ok || !B.fwd || !B.last_read || !B.wstart || !B.wop) {
        rc = tide_err(ctx, TIDE_E_NOMEM, "out of memory building a recomputation schedule");
        goto out;
    }
    int n_runs = 0;
    for (int i = 0; i < no; i++) {
        int l = g->ops[i].layer;
        if (l < 0) B.run[i] = -1;
        else if (i > 0 && g->ops[i - 1].layer == l) B.run[i] = B.run[i - 1];
        else B.run_start[n_runs] = i, B.run[i] = n_runs++;
        B.mark[i] = B.ok_run[i] = -1;
    }
    for (int t = 0; t < nt; t++) B.writer[t] = B.last_read[t] = -1;
    for (int i = 0; i < no; i++) {
        const tide_op *op = &g->ops[i];
        for (int k = 0; k < op->n_in; k++) B.prod[(size_t)i * TIDE_OP_MAX_IN + k] = B.writer[op->in[k]];
        for (int k = 0; k < op->n_in; k++) B.last_read[op->in[k]] = i;
        for (int k = 0; k < op->n_out; k++) {
            int t = op->out[k];
            if (B.writer[t] != i) B.wstart[t + 1]++;
            B.writer[t] = i;
        }
    }
    for (int t = 0; t < nt; t++) B.wstart[t + 1] += B.wstart[t];
    for (int t = 0; t < nt; t++) B.writer[t] = B.wstart[t]; /* fill cursor */
    for (int i = 0; i < no; i++) {
        const tide_op *op = &g->ops[i];
        for (int k = 0; k < op->n_out; k++) {
            int t = op->out[k];
            int c = B.writer[t];
            if (c > B.wstart[t] && B.wop[c - 1] == i) continue; /* listed twice by one op */
            B.wop[c] = i;
            B.writer[t] = c + 1;
        }
    }
    /* Forward runs: only their ops are recomputed (a backward run reads the
     * activations of its layer's forward; the optimizer's, the gradients
     * the backward made: recomputing those would run the backward twice). */
    for (int r = 0; r < n_runs; r++) B.fwd[r] = true;
    for (int i = 0; i < no; i++) {
        const tide_op *op = &g->ops[i];
        for (int k = 0; k < op->n_in && B.run[i] >= 0; k++) {
            int w = B.prod[(size_t)i * TIDE_OP_MAX_IN + k];
            if (w >= 0 && B.run[w] >= 0 && B.run[w] != B.run[i] && g->ops[w].layer == op->layer &&
                g->tensors[op->in[k]].role == TIDE_ROLE_TEMP)
                B.fwd[B.run[i]] = false;
        }
    }
    /* Marks per run, then the schedule: each run's recomputations (graph
     * order) before its first op. At most every op again per run. */
    int n_extra = 0;
    for (int pass = 0; pass < 2; pass++) {
        int pos = 0;
        for (int i = 0; i < no; i++) {
            int r = B.run[i];
            if (r >= 0 && B.run_start[r] == i) {
                int a = i, l = g->ops[i].layer;
                for (int j = a; j < no && B.run[j] == r; j++) {
                    const tide_op *op = &g->ops[j];
                    for (int k = 0; k < op->n_in; k++) {
                        int w = B.prod[(size_t)j * TIDE_OP_MAX_IN + k];
                        if (w >= 0 && B.run[w] >= 0 && B.run[w] != r && B.fwd[B.run[w]] && g->ops[w].layer == l &&
                            g->tensors[op->in[k]].role == TIDE_ROLE_TEMP)
                        {
                            if (!hw) rc_mark(&B, w, a, r);
                            else if (B.mark[w] != r && rc_cheap(&B, w, a, r)) rc_chain_mark(&B, w, a, r);
                        }
                    }
                }
                for (int q = 0; q < a; q++)
                    if (B.mark[q] == r) {
                        if (pass) sched[pos] = q;
                        else n_extra++;
                        pos++;
                    }
                /* pass 1 marks again with the same outcome: reset for it */
                if (!pass)
                    for (int q = 0; q < a; q++) {
                        if (B.mark[q] == r) B.mark[q] = -1;
                        if (B.ok_run[q] == r) B.ok_run[q] = -1;
                    }
            }
            if (pass) sched[pos] = i;
            pos++;
        }
        if (!pass) {
            if (n_extra > (INT_MAX / 4) - no) {
                rc = tide_err(ctx, TIDE_E_INVALID, "plan: a recomputation schedule of %d ops is too long", no);
                goto out;
            }
            if (!(sched = tide_malloc((size_t)(no + n_extra ? no + n_extra : 1) * sizeof *sched))) {
                rc = tide_err(ctx, TIDE_E_NOMEM, "out of memory building a recomputation schedule");
                goto out;
            }
        }
    }
    *sched_out = sched;
    *n_pos_out = no + n_extra;
    sched = NULL;
out:
    tide_free(sched);
    tide_free(B.run);
    tide_free(B.run_start);
    tide_free(B.prod);
    tide_free(B.writer);
    tide_free(B.mark);
    tide_free(B.ok_run);
    tide_free(B.ok);
    tide_free(B.fwd);
    tide_free(B.last_read);
    tide_free(B.wstart);
    tide_free(B.wop);
    return rc;
}
