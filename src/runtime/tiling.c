/*
 * tiling.c - picks how finely a graph is tiled for a device budget.
 *
 * Tiling (tide_llama_tile_level for inference, tide_llama_train_tile_level
 * for training steps) lowers the largest op's working set, which is the floor
 * of any budget, at the price of more ops, smaller matmuls and, when little
 * fits, weights read once per tile or weight block instead of once per
 * layer. So the coarsest level that fits is used; for the minimum budget, the
 * level whose minimum is smallest. A level's largest working set bounds its
 * minimum from below, so a level that cannot beat the best so far is not
 * planned.
 */
#include "runtime/tiling.h"

#include <stdlib.h>
#include <string.h>

tide_status tide_tile_parse(tide_ctx *ctx, const char *s, int *tile) {
    if (!strcmp(s, "auto")) *tile = TIDE_TILE_AUTO;
    else if (!strcmp(s, "none")) *tile = TIDE_TILE_NONE;
    else {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (!*s || *end || v < 1 || v >= TIDE_TILE_LEVELS)
            return tide_err(ctx, TIDE_E_INVALID, "tiling '%s' is not auto, none or a level 1 to %d", s,
                            TIDE_TILE_LEVELS - 1);
        *tile = (int)v;
    }
    return TIDE_OK;
}

tide_status tide_tile_search(tide_ctx *ctx, const tide_tile_searcher *s, int tile, int from, tide_graph **g,
                             int *level, tide_plan **plan, uint64_t *min_budget) {
    *g = NULL;
    *level = -1;
    if (plan) *plan = NULL;
    const tide_plan_opts *opts = s->opts;
    int first = tile > 0 ? tile : from, last = tile == TIDE_TILE_NONE ? 0 : tile > 0 ? tile : TIDE_TILE_LEVELS - 1;
    if (tile > 0 && from > tile) last = -1; /* a forced level was tried */
    tide_graph *best = NULL;
    uint64_t best_min = 0;
    int best_level = -1;
    tide_status st = TIDE_OK, last_st = TIDE_E_INFEASIBLE;
    char why[512] = "";
    for (int k = first; k <= last && !st; k++) {
        tide_graph *gk = NULL;
        bool *host = NULL;
        if ((st = s->build(s->user, k, &gk, &host)) || !gk) break; /* no level past the last */
        if (tile == TIDE_TILE_AUTO && k > 0 && s->max_ops && gk->n_ops > s->max_ops) { /* finer levels only grow */
            tide_free(host);
            tide_graph_free(gk);
            break;
        }
        tide_plan_opts pk = *opts;
        if (host) pk.host_ops = host;
        uint64_t lo = 0;
        if ((st = tide_plan_max_working_set(ctx, gk, &pk, &lo))) {
            tide_free(host);
            tide_graph_free(gk);
            break;
        }
        if (!min_budget) {
            if (lo > opts->device_budget) { /* cannot fit: skip the planning */
                char lv[48] = "untiled";
                if (k) snprintf(lv, sizeof lv, "tiled at level %d", k);
                snprintf(why, sizeof why, "a device budget of %llu bytes is too small%s: it needs at least %llu "
                         "bytes (the largest op's working set, %s)", (unsigned long long)opts->device_budget,
                         s->what ? s->what : "", (unsigned long long)lo, lv);
                tide_free(host);
                tide_graph_free(gk);
                continue;
            }
            if (!plan) { /* the caller plans */
                tide_free(host);
                *g = gk;
                *level = k;
                return TIDE_OK;
            }
            tide_plan *p = NULL;
            last_st = tide_plan_make(ctx, gk, &pk, &p);
            tide_free(host);
            if (last_st == TIDE_OK) { /* the plan is handed out, not made again */
                *plan = p;
                *g = gk;
                *level = k;
                return TIDE_OK;
            }
            tide_plan_free(p);
            snprintf(why, sizeof why, "%s", tide_ctx_last_error(ctx));
            tide_graph_free(gk);
            if (last_st != TIDE_E_INFEASIBLE) return last_st;
            continue;
        }
        if (best && lo >= best_min) { /* its minimum is at least lo: cannot do better */
            tide_free(host);
            tide_graph_free(gk);
            continue;
        }
        uint64_t m = 0;
        last_st = tide_plan_min_budget(ctx, gk, &pk, &m);
        tide_free(host);
        if (last_st) {
            snprintf(why, sizeof why, "%s", tide_ctx_last_error(ctx));
            tide_graph_free(gk);
            if (last_st != TIDE_E_INFEASIBLE) return last_st;
            continue;
        }
        if (!best || m < best_min) {
            tide_graph_free(best);
            best = gk;
            best_min = m;
            best_level = k;
        } else {
            tide_graph_free(gk);
        }
    }
    if (st) {
        tide_graph_free(best);
        return st;
    }
    if (best) {
        tide_err_clear(ctx);
        *g = best;
        *level = best_level;
        *min_budget = best_min;
        return TIDE_OK;
    }
    return tide_err(ctx, TIDE_E_INFEASIBLE, "%s", why[0] ? why : "no tiling level fits");
}

typedef struct llama_level {
    tide_ctx *ctx;
    const tide_llama_config *cfg;
    const tide_llama_graph_opts *base;
} llama_level;

static tide_status build_llama_level(void *user, int level, tide_graph **g, bool **host_ops) {
    llama_level *u = user;
    *host_ops = NULL;
    tide_llama_graph_opts o = *u->base;
    if (!tide_llama_tile_level(&o, level)) {
        *g = NULL;
        return TIDE_OK;
    }
    return tide_llama_build(u->ctx, u->cfg, &o, g);
}

tide_status tide_llama_plan_tiled(tide_ctx *ctx, const tide_llama_config *cfg,
                                  const tide_llama_graph_opts *base, const tide_plan_opts *opts, int tile,
                                  tide_graph **g, int *level, tide_plan **plan, uint64_t *min_budget) {
    llama_level u = {ctx, cfg, base};
    tide_tile_searcher s = {.build = build_llama_level, .user = &u, .opts = opts, .max_ops = TIDE_TILE_MAX_OPS};
    tide_plan *p = NULL;
    tide_status st = tide_tile_search(ctx, &s, tile, 0, g, level, min_budget ? NULL : &p, min_budget);
    if (*level < 0) *level = 0;
    if (plan) *plan = p;
    else tide_plan_free(p);
    return st;
}
