/*
 * lifetime.c - per-tensor use lists over one iteration, queried as the
 * n_iter-unrolled sequence (lifetime.h).
 */
#include "planner/planner.h"
#include "planner/lifetime.h"

#include <string.h>

void tide_lifetime_free(tide_lifetime *lt) {
    if (!lt) return;
    tide_free(lt->start);
    tide_free(lt->use_op);
    tide_free(lt->use_rw);
    tide_free(lt->last_write_op);
    memset(lt, 0, sizeof *lt);
}

tide_status tide_lifetime_build(tide_ctx *ctx, const tide_graph *g, int n_iter, tide_lifetime *lt) {
    return tide_lifetime_build_sched(ctx, g, NULL, g->n_ops, n_iter, lt);
}

tide_status tide_lifetime_build_sched(tide_ctx *ctx, const tide_graph *g, const int *sched, int n_pos, int n_iter,
                                      tide_lifetime *lt) {
    memset(lt, 0, sizeof *lt);
    if (n_iter < 1) return tide_err(ctx, TIDE_E_INVALID, "plan: n_iter must be >= 1 (got %d)", n_iter);
    if (n_pos > 0 && n_iter > (INT_MAX / 2) / n_pos)
        return tide_err(ctx, TIDE_E_INVALID, "plan: %d iterations of %d ops are too many steps", n_iter, n_pos);
    lt->g = g;
    lt->n_ops = n_pos;
    lt->n_iter = n_iter;
    lt->n_tensors = g->n_tensors;
    lt->n_steps = n_pos * n_iter;
    int nt = g->n_tensors;
    long total = 0;
#define SCHED_OP(i) (&g->ops[sched ? sched[i] : (i)])
    for (int i = 0; i < n_pos; i++) total += SCHED_OP(i)->n_in + SCHED_OP(i)->n_out;
    lt->start = tide_calloc((size_t)nt + 1, sizeof *lt->start);
    lt->use_op = tide_malloc((size_t)(total ? total : 1) * sizeof *lt->use_op);
    lt->use_rw = tide_malloc((size_t)(total ? total : 1));
    lt->last_write_op = tide_malloc((size_t)(nt ? nt : 1) * sizeof *lt->last_write_op);
    int *last_op = tide_malloc((size_t)(nt ? nt : 1) * sizeof *last_op);
    if (!lt->start || !lt->use_op || !lt->use_rw || !lt->last_write_op || !last_op) {
        tide_free(last_op);
        tide_lifetime_free(lt);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory analysing lifetimes of %d tensors", nt);
    }
    /* Count distinct (tensor, op) pairs: an op listing t twice is one use. */
    for (int t = 0; t < nt; t++) last_op[t] = -1;
    for (int i = 0; i < n_pos; i++) {
        const tide_op *op = SCHED_OP(i);
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            if (last_op[t] != i) {
                last_op[t] = i;
                lt->start[t + 1]++;
            }
        }
    }
    for (int t = 0; t < nt; t++) lt->start[t + 1] += lt->start[t];
    /* Fill in op order, so each tensor's list comes out ascending. */
    for (int t = 0; t < nt; t++) {
        last_op[t] = -1;
        lt->last_write_op[t] = -1;
    }
    int *cur = tide_malloc((size_t)(nt ? nt : 1) * sizeof *cur);
    if (!cur) {
        tide_free(last_op);
        tide_lifetime_free(lt);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory analysing lifetimes of %d tensors", nt);
    }
    memcpy(cur, lt->start, (size_t)nt * sizeof *cur);
    for (int i = 0; i < n_pos; i++) {
        const tide_op *op = SCHED_OP(i);
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            unsigned char rw = k < op->n_in ? TIDE_USE_READ : TIDE_USE_WRITE;
            if (last_op[t] == i) {
                lt->use_rw[cur[t] - 1] |= rw;
            } else {
                last_op[t] = i;
                lt->use_op[cur[t]] = i;
                lt->use_rw[cur[t]] = rw;
                cur[t]++;
            }
            if (rw == TIDE_USE_WRITE) lt->last_write_op[t] = i;
        }
    }
#undef SCHED_OP
    tide_free(cur);
    tide_free(last_op);
    /* A TEMP or OUTPUT has no value before the iteration writes it; an
     * OUTPUT no op writes could never reach its home. */
    for (int t = 0; t < nt; t++) {
        tide_role r = g->tensors[t].role;
        if (r == TIDE_ROLE_OUTPUT && lt->last_write_op[t] < 0) {
            tide_status st = tide_err(ctx, TIDE_E_INVALID, "plan: output tensor '%s' is never written by any op",
                                      g->tensors[t].name);
            tide_lifetime_free(lt);
            return st;
        }
        if ((r == TIDE_ROLE_TEMP || r == TIDE_ROLE_OUTPUT) && lt->start[t] < lt->start[t + 1] &&
            lt->use_rw[lt->start[t]] != TIDE_USE_WRITE) {
            tide_status st = tide_err(ctx, TIDE_E_INVALID,
                                      "plan: %s tensor '%s' is read by op %d before any op writes it",
                                      tide_role_name(r), g->tensors[t].name, lt->use_op[lt->start[t]]);
            tide_lifetime_free(lt);
            return st;
        }
    }
    return TIDE_OK;
}

/* Index in use_op of the first use of t at op >= op (start[t+1] if none). */
static int lower_bound(const tide_lifetime *lt, int t, int op) {
    int lo = lt->start[t], hi = lt->start[t + 1];
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (lt->use_op[mid] < op) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int tide_lifetime_use_from(const tide_lifetime *lt, int t, int step, int *rw) {
    if (rw) *rw = 0;
    if (step < 0) step = 0;
    int a = lt->start[t], b = lt->start[t + 1];
    if (a == b || step >= lt->n_steps) return TIDE_NEVER;
    int iter = step / lt->n_ops, op = step % lt->n_ops;
    int k = lower_bound(lt, t, op);
    if (k == b) {
        if (iter + 1 >= lt->n_iter) return TIDE_NEVER;
        iter++;
        k = a;
    }
    if (rw) *rw = lt->use_rw[k];
    return iter * lt->n_ops + lt->use_op[k];
}

int tide_lifetime_next_use(const tide_lifetime *lt, int t, int step, int *rw) {
    if (step >= lt->n_steps - 1) {
        if (rw) *rw = 0;
        return TIDE_NEVER;
    }
    return tide_lifetime_use_from(lt, t, step + 1, rw);
}

int tide_lifetime_last_use(const tide_lifetime *lt, int t) {
    int a = lt->start[t], b = lt->start[t + 1];
    if (a == b) return -1;
    return (lt->n_iter - 1) * lt->n_ops + lt->use_op[b - 1];
}

int tide_lifetime_last_write(const tide_lifetime *lt, int t) {
    int w = lt->last_write_op[t];
    return w < 0 ? -1 : (lt->n_iter - 1) * lt->n_ops + w;
}

bool tide_lifetime_dead_after(const tide_lifetime *lt, int t, int step) {
    int rw = 0;
    int n = tide_lifetime_next_use(lt, t, step, &rw);
    return n == TIDE_NEVER || rw == TIDE_USE_WRITE;
}

uint64_t tide_op_working_set(const tide_graph *g, const tide_op *op) {
    uint64_t s = tide_plan_align(op->scratch_bytes);
    for (int k = 0; k < op->n_in + op->n_out; k++) {
        int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
        bool seen = false;
        for (int j = 0; j < k && !seen; j++)
            seen = (j < op->n_in ? op->in[j] : op->out[j - op->n_in]) == t;
        if (!seen) s += tide_plan_align(g->tensors[t].nbytes);
    }
    return s;
}

uint64_t tide_graph_max_working_set(const tide_graph *g, int *which) {
    uint64_t best = 0;
    int w = -1;
    for (int i = 0; i < g->n_ops; i++) {
        uint64_t s = tide_op_working_set(g, &g->ops[i]);
        if (s > best || w < 0) {
            best = s;
            w = i;
        }
    }
    if (which) *which = w;
    return best;
}
