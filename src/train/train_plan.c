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

#include <math.h>
#include <stdio.h>
#include <string.h>

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
    /* a rank's step: its ideal is perfect scaling, the network free */
    tide_hw free_net;
    for (int i = 0; i < g->n_ops; i++)
        if (tide_op_is_collective(g->ops[i].kind)) {
            free_net = *hw;
            free_net.net_intra_bw = free_net.net_inter_bw = INFINITY;
            free_net.net_intra_latency_s = free_net.net_inter_latency_s = 0;
            hw = &free_net;
            break;
        }
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
    if (o.vocab_blocks > u->cfg->vocab_size) return TIDE_OK; /* no more blocks than ids */
    tide_status st = tide_llama_build_train(u->ctx, u->cfg, &o, g);
    if (st || !u->host_updates) return st;
    if (!(*host_ops = train_optim_all_host(u->ctx, *g))) {
        tide_graph_free(*g);
        *g = NULL;
        return TIDE_E_NOMEM;
    }
    return TIDE_OK;
}

tide_status tide_train_tiling(tide_ctx *ctx, const tide_llama_config *cfg, tide_llama_train_opts *o,
                              const tide_plan_opts *po, bool host_updates, int tile, int from, tide_graph **g,
                              int *level, uint64_t *min_budget) {
    train_level u = {ctx, cfg, o, host_updates};
    tide_tile_searcher s = {.build = build_train_level, .user = &u, .opts = po, .max_ops = TIDE_TILE_MAX_OPS,
                            .what = " for a training step"};
    tide_status st = tide_tile_search(ctx, &s, tile, from, g, level, NULL, min_budget);
    if (!st) tide_llama_train_tile_level(o, *level);
    return st;
}

void tide_train_planned_free(tide_train_planned *t) {
    tide_plan_free(t->p);
    tide_graph_free(t->g);
    tide_free(t->host_ops);
    memset(t, 0, sizeof *t);
}

/* Places g's updates (mode; on INFEASIBLE, fallback when it differs) and
 * plans the step into *c (which takes g). */
static tide_status plan_graph(tide_ctx *ctx, tide_graph *g, const tide_plan_opts *po, train_optim_mode mode,
                              train_optim_mode fallback, tide_train_planned *c) {
    memset(c, 0, sizeof *c);
    c->g = g;
    tide_plan_opts pk = *po;
    tide_status st = train_optim_place(ctx, g, &pk, mode, &c->host_ops, &c->oc);
    pk.host_ops = c->host_ops;
    pk.consider_zero_offload = true;
    if (!st) st = tide_plan_make(ctx, g, &pk, &c->p);
    if (st == TIDE_E_INFEASIBLE && mode != fallback) {
        /* the arena cannot hold some update's operands: updates on the host
         * CPU (their state read in place) let the step plan */
        tide_err_clear(ctx);
        tide_free(c->host_ops);
        c->host_ops = NULL;
        tide_plan_free(c->p);
        c->p = NULL;
        pk.host_ops = NULL;
        st = train_optim_place(ctx, g, &pk, fallback, &c->host_ops, &c->oc);
        pk.host_ops = c->host_ops;
        if (!st) st = tide_plan_make(ctx, g, &pk, &c->p);
    }
    if (!st) train_optim_sync(g, c->p, &c->oc);
    return st;
}

/* Plans g with the AdamW placement of `like` (a plan of another tiling of
 * the same step: each update of g where like's update of the same parameter
 * ran, a block of a parameter where the whole or its block did) into *c,
 * which takes g. One plan, not a placement search. */
static tide_status plan_placed(tide_ctx *ctx, tide_graph *g, const tide_plan_opts *po, const tide_train_planned *like,
                               tide_train_planned *c) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->oc = like->oc;
    tide_plan_opts pk = *po;
    if (like->host_ops) {
        if (!(c->host_ops = tide_calloc((size_t)(g->n_ops ? g->n_ops : 1), sizeof *c->host_ops)))
            return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
        /* the updates come in parameter order in both graphs */
        int j = 0;
        for (int i = 0; i < g->n_ops; i++) {
            if (g->ops[i].kind != TIDE_OP_ADAMW) continue;
            const char *home = tide_graph_tensor_home(g, g->ops[i].in[0], NULL);
            for (int k = j; k < like->g->n_ops; k++)
                if (like->g->ops[k].kind == TIDE_OP_ADAMW &&
                    !strcmp(tide_graph_tensor_home(like->g, like->g->ops[k].in[0], NULL), home)) {
                    c->host_ops[i] = like->host_ops[k];
                    j = k;
                    break;
                }
        }
    }
    pk.host_ops = c->host_ops;
    pk.consider_zero_offload = true;
    tide_status st = tide_plan_make(ctx, g, &pk, &c->p);
    if (!st) {
        c->oc.makespan_s = c->p->stats.makespan_s;
        train_optim_sync(g, c->p, &c->oc);
    }
    return st;
}

tide_status tide_train_plan_tiled(tide_ctx *ctx, const tide_llama_config *cfg, tide_llama_train_opts *o,
                                  const tide_plan_opts *po, train_optim_mode mode, train_optim_mode fallback, int tile,
                                  tide_train_planned *out) {
    memset(out, 0, sizeof *out);
    tide_status st;
    if (tile == TIDE_TILE_NONE) { /* the step as o makes it */
        tide_graph *g = NULL;
        if ((st = tide_llama_build_train(ctx, cfg, o, &g))) return st;
        st = plan_graph(ctx, g, po, mode, fallback, out);
        if (st) tide_train_planned_free(out);
        return st;
    }
    tide_train_planned best = {0};
    tide_llama_train_opts best_o = *o;
    int first_level = -1; /* the first level that planned (its placement searched) */
    char why[512] = "";
    st = TIDE_OK;
    for (int from = 0;;) {
        tide_llama_train_opts lo = *o;
        tide_graph *g = NULL;
        int level = -1;
        /* the coarsest level from `from` whose largest op fits (updates that
         * may run on the host need no room; zero-offload places its own) */
        st = tide_train_tiling(ctx, cfg, &lo, po, fallback != TRAIN_OPTIM_DEVICE && po->policy == TIDE_POLICY_TIDE,
                               tile, from, &g, &level, NULL);
        if (st) break;
        /* the first level that plans searches the AdamW placement; finer
         * ones take it (a search per level would multiply the planning) */
        tide_train_planned c;
        st = best.p ? plan_placed(ctx, g, po, &best, &c) : plan_graph(ctx, g, po, mode, fallback, &c);
        c.level = level;
        if (st) {
            snprintf(why, sizeof why, "%s", tide_ctx_last_error(ctx));
            tide_train_planned_free(&c);
            if (st != TIDE_E_INFEASIBLE || best.p || tile > 0) break;
            from = level + 1; /* a finer tiling may plan where this one did not */
            continue;
        }
        /* a finer tiling than the coarsest that fits leaves the prefetch more
         * room (smaller working sets): keep refining while it is faster */
        if (best.p && !(c.p->stats.makespan_s < best.p->stats.makespan_s)) {
            tide_train_planned_free(&c);
            break;
        }
        if (!best.p) first_level = level;
        tide_train_planned_free(&best);
        best = c;
        best_o = lo;
        if (tile > 0) break;
        from = level + 1;
    }
    if (best.p && best.level != first_level && best.g->n_ops <= TIDE_TRAIN_SEARCH_MAX_OPS) {
        /* the finer level chosen with the first level's placement: its own
         * placement search, kept when faster */
        tide_graph *g = NULL;
        tide_train_planned c;
        if (!tide_llama_build_train(ctx, cfg, &best_o, &g)) {
            if (!plan_graph(ctx, g, po, mode, fallback, &c) && c.p->stats.makespan_s < best.p->stats.makespan_s) {
                c.level = best.level;
                tide_train_planned_free(&best);
                best = c;
            } else {
                tide_train_planned_free(&c);
            }
        }
    }
    if (best.p) {
        tide_err_clear(ctx);
        *out = best;
        *o = best_o;
        return TIDE_OK;
    }
    if (st == TIDE_E_INFEASIBLE && why[0]) return tide_err(ctx, st, "%s", why); /* the plan's refusal, not "no level" */
    return st ? st : tide_err(ctx, TIDE_E_INFEASIBLE, "no tiling of the training step plans");
}
