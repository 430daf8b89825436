/*
 * pool_predict.c - a workload's minimum, need and curve for the pool's
 * partition (pool_predict.h): its prefill and decode graphs planned at a few
 * budgets with the options its model's offloaded plans use.
 */
#include "serve/pool_predict.h"

#include <math.h>

static tide_plan_opts plan_opts(const pool_predict *pp, uint64_t budget) {
    return (tide_plan_opts){.policy = TIDE_POLICY_TIDE, .device_budget = budget, .host_budget = pp->host_budget,
                            .n_iter = 1, .hw = pp->hw, .host_addressable = pp->host_addressable,
                            .weights_on_ssd = pp->weights_on_ssd};
}

/* The graph of one request's step: a fresh prefill of seq tokens, or the
 * decode step (seq 1 reading the cache), as generate.c builds them. */
static tide_status step_graph(const pool_predict *pp, int seq, bool prefill, tide_graph **g) {
    tide_llama_graph_opts go = {.batch = 1, .seq = seq, .ctx_len = pp->ctx_len, .fresh_cache = prefill};
    return tide_llama_build(pp->ctx, pp->cfg, &go, g);
}

tide_status pool_predict_bounds(const pool_predict *pp, uint64_t *min, uint64_t *need) {
    tide_status st = TIDE_OK;
    *min = *need = 0;
    for (int k = 0; k < 2 && !st; k++) {
        tide_graph *g = NULL;
        if ((st = step_graph(pp, k ? 1 : pp->ctx_len, !k, &g))) break;
        tide_plan_opts po = plan_opts(pp, 0);
        uint64_t mn = 0, pk = 0;
        st = tide_plan_min_budget(pp->ctx, g, &po, &mn);
        if (!st) st = tide_plan_peak_unbounded(pp->ctx, g, &po, &pk);
        if (!st) {
            *min = TIDE_MAX(*min, mn);
            *need = TIDE_MAX(*need, TIDE_MAX(pk, mn));
        }
        tide_graph_free(g);
    }
    if (st) return tide_err(pp->ctx, st, "workload '%s': cannot find its minimum budget: %s", pp->name,
                            tide_ctx_last_error(pp->ctx));
    return TIDE_OK;
}

tide_status pool_predict_curve(const pool_predict *pp, uint64_t min, uint64_t need, int prompt, int gen,
                               pool_curve *cv) {
    tide_graph *pre = NULL, *dec = NULL;
    tide_status st = step_graph(pp, prompt, true, &pre);
    if (!st) st = step_graph(pp, 1, false, &dec);
    cv->n = 0;
    double ratio = need > min ? (double)need / (double)min : 1;
    for (int k = 0; !st && k < POOL_POINTS; k++) {
        uint64_t b = k == 0 ? min
                   : k == POOL_POINTS - 1 ? need
                   : tide_plan_align((uint64_t)((double)min * pow(ratio, (double)k / (POOL_POINTS - 1))));
        b = TIDE_MIN(TIDE_MAX(b, min), need);
        if (cv->n && b <= cv->b[cv->n - 1]) continue;
        tide_plan_opts po = plan_opts(pp, b);
        double t = 0;
        for (int s = 0; s < 2 && !st; s++) {
            tide_plan *pl = NULL;
            tide_status ps = tide_plan_make(pp->ctx, s ? dec : pre, &po, &pl);
            if (ps == TIDE_E_INFEASIBLE) t = INFINITY;
            else if (ps) st = ps;
            else t += pl->stats.makespan_s * (s ? (double)(gen > 1 ? gen - 1 : 0) : 1.0);
            tide_plan_free(pl);
        }
        if (st) break;
        tide_err_clear(pp->ctx);
        cv->b[cv->n] = b;
        cv->t[cv->n++] = t;
    }
    tide_graph_free(pre);
    tide_graph_free(dec);
    if (st) return tide_err(pp->ctx, st, "workload '%s': cannot predict its requests: %s", pp->name,
                            tide_ctx_last_error(pp->ctx));
    return TIDE_OK;
}

void pool_predict_partition(int n, const pool_curve *const *cv, const double *wt, uint64_t total, uint64_t *share) {
    int at[n ? n : 1];
    uint64_t left = total;
    for (int i = 0; i < n; i++) {
        at[i] = 0;
        share[i] = cv[i]->b[0];
        left = left >= share[i] ? left - share[i] : 0;
    }
    for (;;) { /* the move of the largest saving per byte */
        int bi = -1, bk = 0;
        double best = 0;
        for (int i = 0; i < n; i++) {
            for (int k = at[i] + 1; k < cv[i]->n; k++) {
                uint64_t add = cv[i]->b[k] - share[i];
                if (add > left) break;
                double save = wt[i] * (cv[i]->t[at[i]] - cv[i]->t[k]);
                if (!isfinite(cv[i]->t[k]) || !(save > 0)) continue;
                double r = save / (double)(add ? add : 1);
                if (r > best) best = r, bi = i, bk = k;
            }
        }
        if (bi < 0) break;
        left -= cv[bi]->b[bk] - share[bi];
        share[bi] = cv[bi]->b[bk];
        at[bi] = bk;
    }
}
