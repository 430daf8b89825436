/*
 * tiling.h - how finely a LLaMA graph is tiled for a device budget: the
 * runtime builds each tiling level's graph and asks the planner whether it
 * fits (the planner plans graphs; it never builds them).
 */
#ifndef TIDE_RUNTIME_TILING_H
#define TIDE_RUNTIME_TILING_H

#include "planner/planner.h"

/* TIDE_TILE_AUTO, TIDE_TILE_NONE: tide.h */
/* Graphs with more ops than this are not tried by TIDE_TILE_AUTO. */
#define TIDE_TILE_MAX_OPS 150000

/* A search over the tiling levels of some workload. build makes the graph of
 * a level (*g NULL past the last level) and, optionally, the ops of that
 * graph to place on the host CPU (*host_ops, freed by the search; NULL: the
 * plan options' own). */
typedef struct tide_tile_searcher {
    tide_status (*build)(void *user, int level, tide_graph **g, bool **host_ops);
    void *user;
    const tide_plan_opts *opts;
    int max_ops;      /* with tile auto, a tiled level with more ops is not tried (nor
                         finer ones; 0: no limit) */
    const char *what; /* words after "too small" in the refusal, or NULL */
} tide_tile_searcher;

/* Tries the levels from `from` (tile: TIDE_TILE_AUTO, TIDE_TILE_NONE: level 0
 * only, or a forced level: that one):
 *   - with min_budget: the level whose minimum budget is smallest (coarsest
 *     on ties), that minimum in *min_budget;
 *   - else, with plan: the coarsest level whose plan fits opts->device_budget,
 *     the plan in *plan;
 *   - else: the coarsest level whose largest working set fits (the caller
 *     plans it; where that fails, it searches again from *level + 1).
 * On success *g is the level's graph (the caller frees it) and *level the
 * level; TIDE_E_INFEASIBLE (the message gives what the last level tried
 * needs) when none fits, *level -1. */
tide_status tide_tile_search(tide_ctx *ctx, const tide_tile_searcher *s, int tile, int from, tide_graph **g,
                             int *level, tide_plan **plan, uint64_t *min_budget);

/* Builds the graph of (cfg, base) tiled for opts. With min_budget NULL: the
 * coarsest level (from none) whose plan fits opts->device_budget, and, when
 * plan is not NULL, that plan (of *g; the caller frees both); with
 * min_budget: the level with the smallest minimum budget (coarsest on ties),
 * that minimum in *min_budget (and no plan). `tile` limits the choice
 * (above). On success *g is the graph and *level its level.
 * TIDE_E_INFEASIBLE when no level fits (the message gives what the finest
 * level tried needs). */
tide_status tide_llama_plan_tiled(tide_ctx *ctx, const tide_llama_config *cfg,
                                  const tide_llama_graph_opts *base, const tide_plan_opts *opts, int tile,
                                  tide_graph **g, int *level, tide_plan **plan, uint64_t *min_budget);
/* Parses "auto", "none" or a level number; TIDE_E_INVALID otherwise (with a
 * message in ctx, which may be NULL). */
tide_status tide_tile_parse(tide_ctx *ctx, const char *s, int *tile);

#endif
