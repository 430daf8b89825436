/*
 * train_plan.c - the figures of a planned training step (train_plan.h): the
 * steady step of a two-iteration plan, the ideal step with every persistent
 * tensor resident, and one step's bytes per link.
 *
 * A step is planned as a steady state: two iterations of the step graph in
 * one plan, persistent tensors (parameters, master weights, moments) starting
 * and ending at their homes. The first iteration pays for filling the device;
 * the second is the step every later one repeats, so its time and its bytes
 * are the step's.
 */
#include "train/train_plan.h"

#include "runtime/tiling.h"

#include <stdio.h>

tide_status tide_plan_steady_step(const tide_plan *p, const tide_hw *hw, double *step, tide_sim_result *keep) {
    tide_sim_result sim;
    tide_status st = tide_simulate(p, hw, &sim);
    if (st) return st;
    double end[2] = {0, 0};
    for (int i = 0; i < sim.n_events; i++) {
        int it = p->ins[sim.events[i].ins].iter;
        if (it >= 0 && it < 2 && sim.events[i].end_s > end[it]) end[it] = sim.events[i].end_s;
    }
    *step = p->n_iter >= 2 ? end[1] - end[0] : sim.makespan_s;
    if (keep) *keep = sim;
    else tide_sim_result_free(&sim);
    return TIDE_OK;
}

tide_status tide_plan_ideal_step(tide_ctx *ctx, const tide_graph *g, const tide_hw *hw, double *step) {
    uint64_t *warm = tide_malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *warm);
    if (!warm) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    uint64_t at = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        tide_role r = g->tensors[t].role;
        warm[t] = TIDE_HOME;
        if (r != TIDE_ROLE_STATE && r != TIDE_ROLE_WEIGHT) continue;
        warm[t] = at;
        at += tide_plan_align(g->tensors[t].nbytes);
    }
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 2, .hw = hw, .warm_off = warm,
                         .host_budget = UINT64_C(1) << 62};
    uint64_t peak = 0;
    tide_plan *p = NULL;
    tide_status st = tide_plan_peak_unbounded(ctx, g, &po, &peak);
    if (!st) {
        po.device_budget = at + peak + TIDE_PLAN_ALIGN;
        st = tide_plan_make(ctx, g, &po, &p);
    }
    if (!st) st = tide_plan_steady_step(p, hw, step, NULL);
    tide_plan_free(p);
    tide_free(warm);
    return st;
}

tide_step_bytes tide_plan_step_bytes(const tide_plan *p) {
    tide_step_bytes b = {0};
    int iter = p->n_iter >= 2 ? 1 : 0;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->iter != iter || in->tensor < 0) continue;
        uint64_t n = p->g->tensors[in->tensor].nbytes;
        if (in->kind == TIDE_INS_LOAD) {
            if (in->src == TIDE_TIER_SSD) b.ssd_read += n;
            else b.h2d += n;
        } else if (in->kind == TIDE_INS_STORE) {
            if (in->dst == TIDE_TIER_SSD) b.ssd_write += n;
            else b.d2h += n;
        } else if (in->kind == TIDE_INS_MOVE) {
            if (in->dst == TIDE_TIER_SSD) b.ssd_write += n;
            else b.ssd_read += n;
        }
    }
    return b;
}

typedef struct train_level {
    tide_ctx *ctx;
    const tide_llama_config *cfg;
    const tide_llama_train_opts *base;
    bool host_updates;
} train_level;

/* The step graph of tiling level `level` (*g NULL past the last), with every
 * ADAMW on the host when asked. */
static tide_status build_train_level(void *user, int level, tide_graph **g, bool **host_ops) {
    train_level *u = user;
    *g = NULL;
    *host_ops = NULL;
    tide_llama_train_opts o = *u->base;
    if (!tide_llama_train_tile_level(&o, level)) return TIDE_OK;
    tide_status st = tide_llama_build_train(u->ctx, u->cfg, &o, g);
    if (st || !u->host_updates) return st;
    if (!(*host_ops = tide_calloc((size_t)((*g)->n_ops ? (*g)->n_ops : 1), sizeof **host_ops))) {
        tide_graph_free(*g);
        *g = NULL;
        return tide_err(u->ctx, TIDE_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < (*g)->n_ops; i++) (*host_ops)[i] = (*g)->ops[i].kind == TIDE_OP_ADAMW;
    return TIDE_OK;
}

tide_status tide_train_tiling(tide_ctx *ctx, const tide_llama_config *cfg, tide_llama_train_opts *o,
                              const tide_plan_opts *po, bool host_updates, int tile, int from, tide_graph **g,
                              int *level, uint64_t *min_budget) {
    train_level u = {ctx, cfg, o, host_updates};
    tide_tile_searcher s = {.build = build_train_level, .user = &u, .opts = po, .what = " for a training step"};
    tide_status st = tide_tile_search(ctx, &s, tile, from, g, level, NULL, min_budget);
    if (!st) tide_llama_train_tile_level(o, *level);
    return st;
}
