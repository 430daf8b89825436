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
 * out here; no candidate, no search). Two families of placements are
 * searched:
 *   - MATMULs alone: a fraction f of the candidates' weight bytes, spread
 *     evenly over the graph's order by error diffusion (each op goes to the
 *     host when the carried share reaches half its bytes), so that host ops
 *     interleave with streamed ones and the host and the link work at the
 *     same time; each host MATMUL's activations make a round trip;
 *   - whole decoder layers: every op of the first k layers (norms,
 *     attention over a KV cache then kept in host memory, the element-wise
 *     ops), as llama.cpp's partial offload puts whole layers on the CPU; the
 *     activations cross the link once where the host's layers end, and the
 *     device's layers still stream what does not stay resident.
 * Each family's index (f in 32nds; k) is searched at its quarters, then by
 * halving steps around the best; index 0 (nothing on the host) is always a
 * candidate, so the plan kept is never predicted slower than the device-only
 * one.
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
    const int *cand;              /* candidate MATMULs, in graph order */
    int n;
    int n_layers;                 /* decoder layers of g */
    bool *mask;                   /* scratch: one per op */
    double *cost[2];              /* per family and index: predicted makespan (NAN: not tried) */
    int size[2];                  /* indices 0..size of each family */
    tide_status last_err;
    int tried;
} hp_search;

/* Fills s->mask with candidate set k of a family; returns how many ops went
 * to the host. Family 0: the MATMULs of a fraction k/32 of the candidates'
 * weight bytes, spread by error diffusion. Family 1: every op of the first k
 * decoder layers (attention and its KV cache too), so that activations cross
 * the link only where the host's layers end. */
static int hp_mask(hp_search *s, int family, int k) {
    const tide_graph *g = s->g;
    memset(s->mask, 0, (size_t)g->n_ops * sizeof *s->mask);
    int n = 0;
    if (family == 1) {
        for (int i = 0; i < g->n_ops; i++)
            if (g->ops[i].layer >= 0 && g->ops[i].layer < k) {
                s->mask[i] = true;
                n++;
            }
        return n;
    }
    double f = k / 32.0, carry = 0;
    for (int i = 0; i < s->n; i++) {
        const tide_op *op = &g->ops[s->cand[i]];
        double b = (double)g->tensors[op->in[1]].nbytes;
        carry += f * b;
        if (carry >= 0.5 * b) {
            s->mask[s->cand[i]] = true;
            carry -= b;
            n++;
        }
    }
    return n;
}

static double hp_try(hp_search *s, int family, int k) {
    if (!isnan(s->cost[family][k])) return s->cost[family][k];
    int n = hp_mask(s, family, k);
    s->po.host_ops = n ? s->mask : NULL;
    tide_plan *p = NULL;
    tide_status st = tide_plan_make(s->ctx, s->g, &s->po, &p);
    s->tried++;
    if (st) s->last_err = st;
    s->cost[family][k] = st ? INFINITY : p->stats.makespan_s;
    tide_plan_free(p);
    return s->cost[family][k];
}

/* The best index of a family: its quarters, then halving steps around the
 * best (0, nothing on the host, among them). */
static int hp_search_family(hp_search *s, int family) {
    int N = s->size[family], best = 0;
    for (int q = 0; q <= 4; q++) {
        int k = N * q / 4;
        if (hp_try(s, family, k) < s->cost[family][best]) best = k;
    }
    for (int step = N / 8 > 0 ? N / 8 : 1;; step /= 2) {
        int b0 = best;
        for (int d = -1; d <= 1; d += 2) {
            int k = b0 + d * step;
            if (k >= 0 && k <= N && hp_try(s, family, k) < s->cost[family][best]) best = k;
        }
        if (step <= 1) break;
    }
    return best;
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
    if (po->policy != TIDE_POLICY_TIDE || po->host_addressable || po->host_ops || po->weights_on_ssd) return TIDE_OK;
    int n_layers = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (g->ops[i].kind == TIDE_OP_ADAMW) return TIDE_OK; /* a training step: train/optim_place.c's */
        n_layers = TIDE_MAX(n_layers, g->ops[i].layer + 1);
    }
    int *cand = tide_malloc((size_t)(g->n_ops ? g->n_ops : 1) * sizeof *cand);
    bool *mask = tide_malloc((size_t)(g->n_ops ? g->n_ops : 1) * sizeof *mask);
    double *cost = tide_malloc((size_t)(32 + 1 + n_layers + 1) * sizeof *cost);
    if (!cand || !mask || !cost) {
        tide_free(cand);
        tide_free(mask);
        tide_free(cost);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory placing ops on the host");
    }
    int n = 0;
    for (int i = 0; i < g->n_ops; i++)
        if (tide_host_place_candidate(g, po, i)) cand[n++] = i;
    info->n_candidates = n;
    if (!n) {
        tide_free(cand);
        tide_free(mask);
        tide_free(cost);
        return TIDE_OK;
    }
    hp_search s = {.ctx = ctx, .g = g, .po = *po, .cand = cand, .n = n, .n_layers = n_layers, .mask = mask,
                   .cost = {cost, cost + 33}, .size = {32, n_layers}};
    for (int k = 0; k < 32 + 1 + n_layers + 1; k++) cost[k] = NAN;
    int fam = 0, best = hp_search_family(&s, 0);
    if (n_layers > 0) {
        s.cost[1][0] = s.cost[0][0]; /* the same plan: nothing on the host */
        int b1 = hp_search_family(&s, 1);
        if (s.cost[1][b1] < s.cost[0][best]) {
            fam = 1;
            best = b1;
        }
    }
    tide_status st = TIDE_OK;
    info->plans_tried = s.tried;
    info->device_makespan_s = isfinite(s.cost[0][0]) ? s.cost[0][0] : 0;
    if (!isfinite(s.cost[fam][best])) {
        st = s.last_err ? s.last_err : tide_err(ctx, TIDE_E_INFEASIBLE, "no placement of ops on the host plans");
    } else {
        info->makespan_s = s.cost[fam][best];
        info->host_layers = fam == 1 ? best : 0;
        int nh = hp_mask(&s, fam, best);
        info->n_host = nh;
        uint64_t all = 0;
        for (int i = 0; i < n; i++) all += g->tensors[g->ops[cand[i]].in[1]].nbytes;
        for (int i = 0; i < g->n_ops; i++)
            if (mask[i] && g->ops[i].kind == TIDE_OP_MATMUL && g->tensors[g->ops[i].in[1]].role == TIDE_ROLE_WEIGHT)
                info->host_weight_bytes += g->tensors[g->ops[i].in[1]].nbytes;
        info->fraction = all ? (double)info->host_weight_bytes / (double)all : 0;
        if (nh) {
            *host_ops = mask;
            mask = NULL;
        }
    }
    tide_free(cand);
    tide_free(mask);
    tide_free(cost);
    return st;
}
