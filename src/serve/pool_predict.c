/*
 * pool_predict.c - a workload's minimum, need and curve for the pool's
 * partition (pool_predict.h): its prefill and decode graphs planned at a few
 * budgets with the options its model's offloaded plans use.
 */
#include "serve/pool_predict.h"

#include <math.h>
#include <string.h>

/* The most decode steps the model prices beside a prompt when it chooses its
 * warm weights (runtime/model_int.h MODEL_WARM_DECODE_STEPS): the
 * generation's own, up to that many. */
#define MODEL_WARM_DECODE 32

static tide_plan_opts plan_opts(const pool_predict *pp, uint64_t budget) {
    return (tide_plan_opts){.policy = TIDE_POLICY_TIDE, .device_budget = budget, .host_budget = pp->host_budget,
                            .n_iter = 1, .hw = pp->hw, .host_addressable = pp->host_addressable,
                            .weights_on_ssd = pp->weights_on_ssd};
}

/* The graph of one request's step: a fresh prefill of seq tokens, or the
 * decode step (seq 1 reading the cache), as generate.c builds them. */
static tide_status step_graph(const pool_predict *pp, int seq, bool prefill, tide_graph **g) {
    tide_llama_graph_opts go = {.batch = 1, .seq = seq, .ctx_len = pp->ctx_len, .fresh_cache = prefill,
                                .cache_dtype = pp->cache_dtype};
    return tide_llama_build(pp->ctx, pp->cfg, &go, g);
}

/* The model's warm layout at `limit` bytes (runtime/place.c
 * warm_layout_upto): the checkpoint's tensors in its order (without one,
 * the graph's weights in theirs), each TIDE_PLAN_ALIGN-rounded, first fit
 * (one that does not fit is skipped, a later smaller one may). The arena
 * offset of each tensor of g into off (TIDE_HOME: not warm; NULL: not
 * wanted); returns the region's bytes. */
static uint64_t warm_layout(const pool_predict *pp, const tide_graph *g, uint64_t limit, uint64_t *off) {
    uint64_t at = 0;
    for (int t = 0; off && t < g->n_tensors; t++) off[t] = TIDE_HOME;
    if (!pp->ck) {
        for (int t = 0; t < g->n_tensors; t++) {
            const tide_tensor *tt = &g->tensors[t];
            uint64_t n = tide_plan_align(tt->nbytes);
            if (tt->role != TIDE_ROLE_WEIGHT || n > limit - at) continue;
            if (off) off[t] = at;
            at += n;
        }
        return at;
    }
    int nc = tide_checkpoint_n_tensors(pp->ck);
    for (int i = 0; i < nc; i++) {
        tide_tensor_info ti;
        if (tide_checkpoint_get_index(pp->ck, i, &ti)) continue;
        uint64_t n = tide_plan_align(ti.nbytes);
        if (n > limit - at) continue;
        for (int t = 0; off && t < g->n_tensors; t++)
            if (g->tensors[t].role == TIDE_ROLE_WEIGHT && !strcmp(g->tensors[t].name, ti.name)) {
                off[t] = at;
                break;
            }
        at += n;
    }
    return at;
}

/* off2 for g2 from the layout off of g: the same weight (by name) at the
 * same offset. */
static void warm_map(const tide_graph *g, const uint64_t *off, const tide_graph *g2, uint64_t *off2) {
    for (int t = 0; t < g2->n_tensors; t++) {
        off2[t] = TIDE_HOME;
        if (g2->tensors[t].role != TIDE_ROLE_WEIGHT) continue;
        int u = t < g->n_tensors && !strcmp(g->tensors[t].name, g2->tensors[t].name) ? t : -1;
        for (int v = 0; u < 0 && v < g->n_tensors; v++)
            if (g->tensors[v].role == TIDE_ROLE_WEIGHT && !strcmp(g->tensors[v].name, g2->tensors[t].name)) u = v;
        if (u >= 0) off2[t] = off[u];
    }
}

tide_status pool_predict_bounds(const pool_predict *pp, uint64_t *min, uint64_t *need) {
    tide_status st = TIDE_OK;
    uint64_t wb = 0; /* every weight, warm */
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
            if (pp->warm && !k) wb = warm_layout(pp, g, UINT64_MAX, NULL);
        }
        tide_graph_free(g);
    }
    if (st) return tide_err(pp->ctx, st, "workload '%s': cannot find its minimum budget: %s", pp->name,
                            tide_ctx_last_error(pp->ctx));
    *need += wb;
    return TIDE_OK;
}

/* The predicted seconds of one prefill (*pre_s) and one decode step
 * (*dec_s) at budget b with the warm weights of layout limit `limit`
 * (0: none); TIDE_E_INFEASIBLE when either cannot be planned. *warm its
 * bytes. */
typedef struct step_cost {
    double t, comp, link, ssd; /* makespan and each resource's busy seconds */
} step_cost;

static step_cost step_cost_of(const pool_predict *pp, const tide_plan_stats *ps) {
    const tide_hw *hw = pp->hw;
    int k = hw->ssd_count > 0 ? hw->ssd_count : 1;
    return (step_cost){
        .t = ps->makespan_s,
        .comp = ps->compute_s,
        /* on a device, what the SSDs read or write crosses the link too */
        .link = (hw->h2d_bw > 0 ? (double)(ps->bytes_h2d + (pp->host_addressable ? 0 : ps->bytes_ssd_read)) /
                                      hw->h2d_bw : 0) +
                (hw->d2h_bw > 0 ? (double)(ps->bytes_d2h + (pp->host_addressable ? 0 : ps->bytes_ssd_write)) /
                                      hw->d2h_bw : 0),
        .ssd = (hw->ssd_read_bw > 0 ? (double)ps->bytes_ssd_read / (hw->ssd_read_bw * k) : 0) +
               (hw->ssd_write_bw > 0 ? (double)ps->bytes_ssd_write / (hw->ssd_write_bw * k) : 0),
    };
}

static tide_status price_at(const pool_predict *pp, tide_graph *pre, tide_graph *dec, tide_graph *full, uint64_t b,
                            uint64_t limit, step_cost *pre_s, step_cost *dec_s, uint64_t *warm) {
    int n = TIDE_MAX(pre->n_tensors, dec->n_tensors);
    if (full) n = TIDE_MAX(n, full->n_tensors);
    uint64_t *off = tide_malloc((size_t)(n ? n : 1) * sizeof *off * 2);
    if (!off) return tide_err(pp->ctx, TIDE_E_NOMEM, "out of memory predicting");
    *warm = limit ? warm_layout(pp, pre, limit, off) : 0;
    if (*warm) warm_map(pre, off, dec, off + n);
    tide_status st = TIDE_OK;
    for (int s = 0; s < 2 && !st; s++) {
        tide_plan_opts po = plan_opts(pp, b);
        if (*warm) {
            po.warm_off = off + (s ? n : 0);
            po.warm_region = *warm;
        }
        tide_plan *pl = NULL;
        if (!(st = tide_plan_make(pp->ctx, s ? dec : pre, &po, &pl))) *(s ? dec_s : pre_s) = step_cost_of(pp, &pl->stats);
        tide_plan_free(pl);
    }
    if (!st && *warm && full) { /* as the model: a whole-context prompt must still plan beside the region */
        warm_map(pre, off, full, off + n);
        tide_plan_opts po = plan_opts(pp, b);
        po.warm_off = off + n;
        po.warm_region = *warm;
        tide_plan *pl = NULL;
        st = tide_plan_make(pp->ctx, full, &po, &pl);
        tide_plan_free(pl);
    }
    tide_free(off);
    return st;
}

/* The request's predicted seconds at budget b as the model runs it (its
 * warm weights chosen as choose_warm does, see pool_predict.h); INFINITY
 * when it cannot be planned there. */
static tide_status predict_at(const pool_predict *pp, tide_graph *pre, tide_graph *dec, tide_graph *full,
                              uint64_t b, int gen, step_cost *t, uint64_t *warm) {
    static const int eighths[] = {0, 2, 4, 6, 7};
    double best = INFINITY;
    uint64_t last = UINT64_MAX;
    *t = (step_cost){.t = INFINITY};
    *warm = 0;
    for (int k = 0; k < (pp->warm ? (int)(sizeof eighths / sizeof *eighths) : 1); k++) {
        step_cost ps = {0}, ds = {0};
        uint64_t w = 0;
        tide_status st = price_at(pp, pre, dec, full, b, b / 8 * (uint64_t)eighths[k], &ps, &ds, &w);
        if (st == TIDE_E_INFEASIBLE) break; /* no plan beside this region, nor beside larger ones */
        if (st) return st;
        if (w == last) continue;
        last = w;
        double steps = gen > 1 ? gen - 1 : 0, choose = ps.t + fmin(steps, MODEL_WARM_DECODE) * ds.t;
        if (choose < best) {
            best = choose;
            *t = (step_cost){.t = ps.t + steps * ds.t, .comp = ps.comp + steps * ds.comp,
                             .link = ps.link + steps * ds.link, .ssd = ps.ssd + steps * ds.ssd};
            *warm = w;
        }
    }
    tide_err_clear(pp->ctx);
    return TIDE_OK;
}

tide_status pool_predict_curve(const pool_predict *pp, uint64_t min, uint64_t need, int prompt, int gen,
                               pool_curve *cv) {
    tide_graph *pre = NULL, *dec = NULL, *full = NULL;
    tide_status st = step_graph(pp, prompt, true, &pre);
    if (!st) st = step_graph(pp, 1, false, &dec);
    if (!st && pp->warm && prompt < pp->ctx_len) st = step_graph(pp, pp->ctx_len, true, &full);
    cv->n = 0;
    double ratio = need > min ? (double)need / (double)min : 1;
    uint64_t bs[POOL_POINTS_MAX];
    int nb = 0;
    for (int k = 0; k < POOL_POINTS; k++) {
        uint64_t b = k == 0 ? min
                   : k == POOL_POINTS - 1 ? need
                   : tide_plan_align((uint64_t)((double)min * pow(ratio, (double)k / (POOL_POINTS - 1))));
        b = TIDE_MIN(TIDE_MAX(b, min), need);
        if (pp->total > min && pp->total < need && (nb ? bs[nb - 1] : 0) < pp->total && b > pp->total)
            bs[nb++] = pp->total; /* the whole budget, in order */
        bs[nb++] = b;
    }
    for (int k = 0; !st && k < nb; k++) {
        uint64_t b = bs[k];
        if (cv->n && b <= cv->b[cv->n - 1]) continue;
        step_cost t;
        uint64_t warm = 0;
        if ((st = predict_at(pp, pre, dec, full, b, gen, &t, &warm))) break;
        cv->b[cv->n] = b;
        cv->t[cv->n] = t.t;
        cv->comp[cv->n] = t.comp;
        cv->link[cv->n] = t.link;
        cv->ssd[cv->n] = t.ssd;
        cv->warm[cv->n] = warm;
        cv->u[cv->n++] = !warm ? 0
                       : pp->weights_on_ssd ? tide_cost_load(pp->hw, TIDE_TIER_SSD, warm, pp->host_addressable, NULL)
                                            : tide_cost_load(pp->hw, TIDE_TIER_HOST, warm, false, NULL);
    }
    tide_graph_free(pre);
    tide_graph_free(dec);
    tide_graph_free(full);
    if (st) return tide_err(pp->ctx, st, "workload '%s': cannot predict its requests: %s", pp->name,
                            tide_ctx_last_error(pp->ctx));
    return TIDE_OK;
}

/* The last point of cv at or below `share` (-1: none). */
static int point_at(const pool_curve *cv, uint64_t share) {
    int k = -1;
    while (k + 1 < cv->n && cv->b[k + 1] <= share) k++;
    return k;
}

double pool_predict_cost(const pool_curve *cv, int k, double wt, uint64_t cur) {
    return wt * cv->t[k] + (cur && point_at(cv, cur) == k ? 0 : cv->u[k]);
}

/* The predicted time of the queued work with workload i at point at[i] of
 * its curve (pool_predict_choose's bound for shares: the workloads run at
 * once, so the longest of each shared resource's summed busy time and each
 * one's own time, plus the warm weights loaded for the shares that change);
 * INFINITY where a point has no plan. */
static double shares_time(int n, const pool_curve *const *cv, const double *wt, const uint64_t *cur, const int *at) {
    double comp = 0, link = 0, ssd = 0, own = 0, load = 0;
    for (int i = 0; i < n; i++) {
        int k = at[i];
        if (k < 0 || !isfinite(cv[i]->t[k])) return INFINITY;
        comp += wt[i] * cv[i]->comp[k];
        link += wt[i] * cv[i]->link[k];
        ssd += wt[i] * cv[i]->ssd[k];
        own = fmax(own, wt[i] * cv[i]->t[k]);
        load += pool_predict_cost(cv[i], k, wt[i], cur ? cur[i] : 0) - wt[i] * cv[i]->t[k];
    }
    return fmax(fmax(comp, link), fmax(ssd, own)) + load;
}

/* The points of every workload's curve, all of their combinations that fit
 * `total`, searched for the least shares_time (ties: the first found, in
 * the order of fewer bytes); false when there are more than
 * POOL_EXHAUSTIVE combinations. */
#define POOL_EXHAUSTIVE 200000
static bool best_points(int n, const pool_curve *const *cv, const double *wt, const uint64_t *cur, uint64_t total,
                        int *best) {
    double combos = 1;
    for (int i = 0; i < n; i++) combos *= cv[i]->n > 0 ? cv[i]->n : 1;
    if (n < 1 || combos > POOL_EXHAUSTIVE) return false;
    int at[n];
    double best_t = INFINITY;
    for (int i = 0; i < n; i++) at[i] = best[i] = 0;
    for (;;) {
        uint64_t sum = 0;
        for (int i = 0; i < n; i++) sum += cv[i]->b[at[i]];
        if (sum <= total) {
            double t = shares_time(n, cv, wt, cur, at);
            if (t < best_t) {
                best_t = t;
                memcpy(best, at, sizeof at);
            }
        }
        int i = 0; /* the next combination, odometer order */
        while (i < n && ++at[i] >= cv[i]->n) at[i++] = 0;
        if (i == n) break;
    }
    return isfinite(best_t);
}

void pool_predict_partition(int n, const pool_curve *const *cv, const double *wt, const uint64_t *cur,
                            uint64_t total, uint64_t *share) {
    int at[n ? n : 1];
    uint64_t left = total;
    for (int i = 0; i < n; i++) {
        at[i] = 0;
        share[i] = cv[i]->b[0];
        left = left >= share[i] ? left - share[i] : 0;
    }
    if (best_points(n, cv, wt, cur, total, at)) {
        left = total;
        for (int i = 0; i < n; i++) {
            share[i] = cv[i]->b[at[i]];
            left -= share[i];
        }
    }
    for (;;) { /* then the move of the largest saving per byte, while one helps */
        int bi = -1, bk = 0;
        double best = 0;
        for (int i = 0; i < n; i++) {
            for (int k = at[i] + 1; k < cv[i]->n; k++) {
                uint64_t add = cv[i]->b[k] - share[i];
                if (add > left) break;
                double save = pool_predict_cost(cv[i], at[i], wt[i], cur ? cur[i] : 0) -
                              pool_predict_cost(cv[i], k, wt[i], cur ? cur[i] : 0);
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
    /* a share at the point a workload holds now stays what it holds where
     * the bytes left allow: the same prediction, no weights loaded again */
    for (int i = 0; cur && i < n; i++)
        if (cur[i] > share[i] && point_at(cv[i], cur[i]) == at[i] && cur[i] - share[i] <= left) {
            left -= cur[i] - share[i];
            share[i] = cur[i];
        }
}

int pool_predict_knee(const pool_curve *cv, uint64_t total) {
    int s = point_at(cv, total);
    if (s < 0 || !isfinite(cv->t[s])) return s;
    for (int k = 0; k < s; k++)
        if (isfinite(cv->t[k]) && cv->t[k] <= cv->t[s] * (1 + POOL_KNEE_SLACK)) return k;
    return s;
}

bool pool_predict_choose(int n, const pool_curve *const *cv, const double *wt, const uint64_t *cur, uint64_t total,
                         bool sliced_now, uint64_t *share, double *part_s, double *slice_s) {
    pool_predict_partition(n, cv, wt, cur, total, share);
    int at[n ? n : 1], knee[n ? n : 1];
    at[0] = -1;
    double slice = 0;
    uint64_t knees = 0;
    for (int i = 0; i < n; i++) {
        knee[i] = pool_predict_knee(cv[i], total);
        knees += knee[i] >= 0 ? cv[i]->b[knee[i]] : total;
    }
    for (int i = 0; i < n; i++) {
        at[i] = point_at(cv[i], share[i]);
        int s = knee[i];
        if (s < 0 || !isfinite(cv[i]->t[s])) slice = INFINITY;
        else if (knees <= total) /* every turn's share stays loaded beside the others' */
            slice += pool_predict_cost(cv[i], s, wt[i], cur ? cur[i] : 0);
        else
            slice += wt[i] * cv[i]->t[s] + (n > 1 ? wt[i] : 1) * cv[i]->u[s];
    }
    *part_s = shares_time(n, cv, wt, cur, at);
    *slice_s = slice;
    /* a change of regime must be predicted POOL_REGIME_MARGIN faster: the
     * two predictions are estimates, and each change reloads weights */
    if (n < 2) return false;
    return sliced_now ? !(*part_s < POOL_REGIME_MARGIN * slice) : slice < POOL_REGIME_MARGIN * *part_s;
}
