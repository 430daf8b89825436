/*
 * optim_place.c - the placement of a training step's AdamW updates, device
 * or host CPU, chosen by planning (optim_place.h).
 *
 * Why by planning and not by a formula: whether a CPU update pays depends on
 * what else the step moves. An update on the device needs its master
 * weights and moments (12 bytes a parameter in f32) in device memory; where
 * the budget cannot keep them there, each step brings them down and takes
 * them back (24 bytes a parameter over the link). On the host it moves the
 * gradient down and the updated parameter up, and takes the host's compute
 * and memory time (tide_cost_op_host) instead of the device's, in parallel
 * with the device's own work. Which wins, and for how many parameters,
 * depends on the budget, the link, the host and on what the rest of the
 * step keeps the links busy with: the simulator already prices all of it,
 * so the choice compares plans. The update itself is the same kernel on
 * either side (the executor's host computes run the CPU backend's AdamW),
 * and global-norm clipping stays exact: every update, wherever it runs,
 * reads the norm of all the gradients, which the graph computes first.
 *
 * The search: candidates put the k largest updates (by state bytes) on the
 * host. The makespan over k is not guaranteed unimodal, so the search keeps
 * all-device (k = 0) as a candidate and walks from the best of k = 0, n/2
 * and n by halving steps; it finds the best split on the usual shape (link
 * time falling and host time rising with k) and never returns a plan
 * predicted slower than all-device.
 */
#include "train/optim_place.h"

#include "core/core.h"
#include "ir/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int train_optim_parse(const char *s, train_optim_mode *out) {
    if (!strcmp(s, "auto")) *out = TRAIN_OPTIM_AUTO;
    else if (!strcmp(s, "device")) *out = TRAIN_OPTIM_DEVICE;
    else if (!strcmp(s, "cpu")) *out = TRAIN_OPTIM_CPU;
    else return -1;
    return 0;
}

const char *train_optim_name(train_optim_mode m) {
    return m == TRAIN_OPTIM_CPU ? "cpu" : m == TRAIN_OPTIM_DEVICE ? "device" : "auto";
}

typedef struct update {
    int op;
    uint64_t bytes; /* its persistent operands: parameter, master, moments */
} update;

static int by_bytes_desc(const void *a, const void *b) {
    const update *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return x->op - y->op;
}

typedef struct search {
    tide_ctx *ctx;
    const tide_graph *g;
    tide_plan_opts po;
    const update *u;
    int n;
    bool *mask;           /* scratch: the candidate's host_ops */
    double *cost;         /* per k (NAN: not tried; INFINITY: not plannable) */
    tide_status last_err;
    int tried;
} search;

/* The predicted makespan with the k largest updates on the host. */
static double try_k(search *s, int k) {
    if (!isnan(s->cost[k])) return s->cost[k];
    memset(s->mask, 0, (size_t)s->g->n_ops * sizeof *s->mask);
    for (int i = 0; i < k; i++) s->mask[s->u[i].op] = true;
    s->po.host_ops = k ? s->mask : NULL;
    tide_plan *p = NULL;
    tide_status st = tide_plan_make(s->ctx, s->g, &s->po, &p);
    s->tried++;
    if (st == TIDE_E_NOMEM) {
        s->last_err = st;
        return s->cost[k] = INFINITY;
    }
    if (st) s->last_err = st;
    s->cost[k] = st ? INFINITY : p->stats.makespan_s;
    tide_plan_free(p);
    return s->cost[k];
}

tide_status train_optim_place(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *po, train_optim_mode mode,
                              bool **host_ops, train_optim_choice *choice) {
    *host_ops = NULL;
    memset(choice, 0, sizeof *choice);
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) n += g->ops[i].kind == TIDE_OP_ADAMW;
    choice->n_groups = n;
    if (po->policy == TIDE_POLICY_ZERO_OFFLOAD) {
        /* the policy itself puts every update on the host (no mask here) */
        if (mode == TRAIN_OPTIM_DEVICE)
            return tide_err(ctx, TIDE_E_UNSUPPORTED, "the zero-offload policy runs every AdamW update on the host "
                            "CPU: it takes no device placement of the optimizer");
        choice->n_host = n;
        for (int i = 0; i < g->n_ops; i++)
            for (int j = 0; g->ops[i].kind == TIDE_OP_ADAMW && j < g->ops[i].n_in; j++)
                if (g->tensors[g->ops[i].in[j]].role == TIDE_ROLE_STATE)
                    choice->state_bytes += g->tensors[g->ops[i].in[j]].nbytes;
        choice->host_state_bytes = choice->state_bytes;
        return TIDE_OK;
    }
    if (n == 0 || mode == TRAIN_OPTIM_DEVICE) return TIDE_OK;
    if (po->policy != TIDE_POLICY_TIDE) {
        if (mode == TRAIN_OPTIM_AUTO) return TIDE_OK; /* the baselines place nothing on the host */
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "AdamW on the CPU is planned by the tide policy only");
    }
    search s = {.ctx = ctx, .g = g, .po = *po, .n = n, .last_err = TIDE_OK};
    update *u = tide_malloc((size_t)n * sizeof *u);
    s.mask = tide_malloc((size_t)g->n_ops * sizeof *s.mask);
    s.cost = tide_malloc((size_t)(n + 1) * sizeof *s.cost);
    if (!u || !s.mask || !s.cost) {
        tide_free(u);
        tide_free(s.mask);
        tide_free(s.cost);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory placing the optimizer");
    }
    int k = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        if (op->kind != TIDE_OP_ADAMW) continue;
        uint64_t b = 0;
        for (int j = 0; j < op->n_in; j++)
            if (g->tensors[op->in[j]].role == TIDE_ROLE_STATE) b += g->tensors[op->in[j]].nbytes;
        u[k++] = (update){i, b};
        choice->state_bytes += b;
    }
    qsort(u, (size_t)n, sizeof *u, by_bytes_desc);
    s.u = u;
    for (int i = 0; i <= n; i++) s.cost[i] = NAN;

    int best;
    if (mode == TRAIN_OPTIM_CPU) {
        best = n;
        try_k(&s, n);
    } else {
        best = 0;
        int starts[3] = {0, n / 2, n};
        for (int i = 0; i < 3; i++)
            if (try_k(&s, starts[i]) < s.cost[best]) best = starts[i];
        for (int step = n / 4 > 0 ? n / 4 : 1;; step /= 2) {
            bool moved = true;
            while (moved) {
                moved = false;
                int cand[2] = {best - step, best + step};
                for (int i = 0; i < 2; i++)
                    if (cand[i] >= 0 && cand[i] <= n && try_k(&s, cand[i]) < s.cost[best]) {
                        best = cand[i];
                        moved = true;
                    }
            }
            if (step == 1) break;
        }
    }
    tide_status st = TIDE_OK;
    if (!isfinite(s.cost[best])) {
        st = s.last_err ? s.last_err : tide_err(ctx, TIDE_E_INFEASIBLE, "no placement of the optimizer can be planned");
    } else {
        choice->n_host = best;
        choice->makespan_s = s.cost[best];
        choice->device_makespan_s = isfinite(s.cost[0]) ? s.cost[0] : 0;
        for (int i = 0; i < best; i++) choice->host_state_bytes += u[i].bytes;
        if (best) {
            memset(s.mask, 0, (size_t)g->n_ops * sizeof *s.mask);
            for (int i = 0; i < best; i++) s.mask[u[i].op] = true;
            *host_ops = s.mask;
            s.mask = NULL;
        }
    }
    choice->plans_tried = s.tried;
    tide_free(u);
    tide_free(s.mask);
    tide_free(s.cost);
    return st;
}

bool train_optim_sync(const tide_graph *g, const tide_plan *p, train_optim_choice *choice) {
    int n_host = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->kind != TIDE_INS_COMPUTE || in->iter != 0 || in->place != TIDE_PLACE_HOST) continue;
        const tide_op *op = &g->ops[in->op];
        if (op->kind != TIDE_OP_ADAMW) continue;
        n_host++;
        for (int j = 0; j < op->n_in; j++)
            if (g->tensors[op->in[j]].role == TIDE_ROLE_STATE) bytes += g->tensors[op->in[j]].nbytes;
    }
    if (n_host == choice->n_host) return false;
    choice->n_host = n_host;
    choice->host_state_bytes = bytes;
    choice->makespan_s = p->stats.makespan_s;
    choice->device_makespan_s = 0;
    return true;
}

bool *train_optim_all_host(tide_ctx *ctx, const tide_graph *g) {
    bool *h = tide_calloc((size_t)(g->n_ops ? g->n_ops : 1), sizeof *h);
    if (!h) {
        tide_err(ctx, TIDE_E_NOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < g->n_ops; i++) h[i] = g->ops[i].kind == TIDE_OP_ADAMW;
    return h;
}
