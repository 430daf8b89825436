/*
 * tiling.h - how finely a LLaMA graph is tiled for a device budget: the
 * runtime builds each tiling level's graph and asks the planner whether it
 * fits (the planner plans graphs; it never builds them).
 */
#ifndef TIDE_RUNTIME_TILING_H
#define TIDE_RUNTIME_TILING_H

#include "planner/planner.h"

/* How a LLaMA graph is tiled (tide_llama_tile_level): TIDE_TILE_AUTO picks a
 * level, TIDE_TILE_NONE never tiles, 1..TIDE_TILE_LEVELS-1 forces a level. */
#define TIDE_TILE_AUTO 0
#define TIDE_TILE_NONE (-1)
/* Graphs with more ops than this are not tried by TIDE_TILE_AUTO. */
#define TIDE_TILE_MAX_OPS 150000

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
