/*
 * host_place.c - co-offload of an inference plan: which MATMULs whose weights
 * live in host memory run on the host CPU instead of on the device
 * (planner.h, tide_plan_host_place).
 *
 * A MATMUL on the device needs its weight on the device: resident, or
 * brought over the link each time it runs. On the host CPU it reads the
 * weight where it lives, at the host's memory bandwidth and compute rate
 * (tide_cost_op_host), and only its activations cross the link: the input
 * goes up (device -> host), the output comes back down. In a decode step a
 * weight is read once for a few rows, so the host's memory bandwidth against
 * the link's decides, and both run at once: the link streams the weights of
 * the device's ops while the host computes its own. How many to put on the
 * host, and which, depends on the budget (what stays resident needs neither)
 * and on how the rest of the plan uses the link, which the simulator prices
 * already: the choice compares whole plans, as the optimizer's placement of
 * a training step does (train/optim_place.c).
 *
 * Candidates: MATMULs reading a WEIGHT homed in host memory whose host
 * compute takes less than TIDE_HOST_PLACE_RATIO times the link time of the
 * weight (prefill's large row counts are compute bound on the host and drop
 * out here). A candidate set is a fraction f of their weight bytes, spread
 * evenly over the graph's order by error diffusion (each op goes to the host
 * when the carried share reaches half its bytes), so that host ops interleave
 * with streamed ones and the host and the link work at the same time. The
 * search tries f = 0, 1/4, 1/2, 3/4 and 1, then halves the step around the
 * best down to 1/32; f = 0 (nothing on the host) is always a candidate, so
 * the plan kept is never predicted slower than the device-only one.
 */
#include "planner/planner.h"

#include "core/core.h"

#include <math.h>
#include <string.h>

/* A candidate's host compute may take at most this many times the link time
 * of its weight (beyond, no budget makes it worth it). */
#define TIDE_HOST_PLACE_RATIO 4.0

typedef struct hp_search {
    tide_ctx *ctx;
    const tide_graph *g;
    tide_plan_opts po;
    const int *cand;              /* candidate op indices, in graph order */
    int n;
    bool *mask;                   /* scratch: one per op */
    double cost[33];              /* per f = k/32: predicted makespan (NAN: not tried) */
    tide_status last_err;
    int tried;
} hp_search;

/* Fills s->mask with the candidates of fraction k/32 of their bytes; returns
 * how many went to the host. */
static int hp_mask(hp_search *s, int k) {
    memset(s->mask, 0, (size_t)s->g->n_ops * sizeof *s->mask);
    double f = k / 32.0, carry = 0;
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        const tide_op *op = &s->g->ops[s->cand[i]];
        double b = (double)s->g->tensors[op->in[1]].nbytes;
        carry += f * b;
        if (carry >= 0.5 * b) {
            s->mask[s->cand[i]] = true;
            carry -= b;
            n++;
        }
    }
    return n;
}

static double hp_try(hp_search *s, int k) {
    if (!isnan(s->cost[k])) return s->cost[k];
    int n = hp_mask(s, k);
    s->po.host_ops = n ? s->mask : NULL;
    tide_plan *p = NULL;
    tide_status st = tide_plan_make(s->ctx, s->g, &s->po, &p);
    s->tried++;
    if (st) s->last_err = st;
    s->cost[k] = st ? INFINITY : p->stats.makespan_s;
    tide_plan_free(p);
    return s->cost[k];
}

bool tide_host_place_candidate(const tide_graph *g, const tide_plan_opts *po, int o) {
    const tide_op *op = &g->ops[o];
    if (op->kind != TIDE_OP_MATMUL || op->n_in < 2) return false;
    const tide_tensor *w = &g->tensors[op->in[1]];
    if (w->role != TIDE_ROLE_WEIGHT || po->weights_on_ssd) return false;
    double host_s = tide_cost_op_host(po->hw, g, op), link_s = tide_hw_h2d_seconds(po->hw, w->nbytes);
    return host_s < TIDE_HOST_PLACE_RATIO * link_s;
}

tide_status tide_plan_host_place(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *po, bool **host_ops,
                                 tide_host_place_info *info) {
    *host_ops = NULL;
    memset(info, 0, sizeof *info);
    if (po->policy != TIDE_POLICY_TIDE || po->host_addressable || po->host_ops) return TIDE_OK;
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].kind == TIDE_OP_ADAMW) return TIDE_OK; /* a training step: train/optim_place.c's */
    int *cand = tide_malloc((size_t)(g->n_ops ? g->n_ops : 1) * sizeof *cand);
    bool *mask = tide_malloc((size_t)(g->n_ops ? g->n_ops : 1) * sizeof *mask);
    if (!cand || !mask) {
        tide_free(cand);
        tide_free(mask);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory placing ops on the host");
    }
    int n = 0;
    for (int i = 0; i < g->n_ops; i++)
        if (tide_host_place_candidate(g, po, i)) cand[n++] = i;
    info->n_candidates = n;
    if (!n) {
        tide_free(cand);
        tide_free(mask);
        return TIDE_OK;
    }
    hp_search s = {.ctx = ctx, .g = g, .po = *po, .cand = cand, .n = n, .mask = mask};
    for (int k = 0; k <= 32; k++) s.cost[k] = NAN;
    int best = 0;
    for (int k = 0; k <= 32; k += 8)
        if (hp_try(&s, k) < s.cost[best]) best = k;
    for (int step = 4; step >= 1; step /= 2) {
        int b0 = best;
        for (int d = -1; d <= 1; d += 2) {
            int k = b0 + d * step;
            if (k >= 0 && k <= 32 && hp_try(&s, k) < s.cost[best]) best = k;
        }
    }
    tide_status st = TIDE_OK;
    info->plans_tried = s.tried;
    info->device_makespan_s = isfinite(s.cost[0]) ? s.cost[0] : 0;
    if (!isfinite(s.cost[best])) {
        st = s.last_err ? s.last_err : tide_err(ctx, TIDE_E_INFEASIBLE, "no placement of ops on the host plans");
    } else {
        info->makespan_s = s.cost[best];
        info->fraction = best / 32.0;
        int nh = hp_mask(&s, best);
        info->n_host = nh;
        for (int i = 0; i < g->n_ops; i++)
            if (mask[i]) info->host_weight_bytes += g->tensors[g->ops[i].in[1]].nbytes;
        if (nh) {
            *host_ops = mask;
            mask = NULL;
        }
    }
    tide_free(cand);
    tide_free(mask);
    return st;
}
