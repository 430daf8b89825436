/*
 * train_plan.h - the figures of a planned training step, shared by `tide
 * plan --train` (src/cli/plan_train.c) and bench_train_plan: a step planned
 * as a steady state (n_iter = 2, persistent tensors starting and ending at
 * their homes), its time, the ideal it is measured against, and the bytes it
 * moves per link.
 */
#ifndef TIDE_TRAIN_PLAN_H
#define TIDE_TRAIN_PLAN_H

#include "ir/plan.h"
#include "planner/planner.h"
#include "sim/sim.h"
#include "train/optim_place.h"

/* The steady step time of p simulated on hw, into *step: with n_iter >= 2,
 * the end of the second iteration's last instruction minus the end of the
 * first's; otherwise the makespan. With keep, the simulation is left there
 * (the caller frees it with tide_sim_result_free); without, it is freed.
 * Returns TIDE_OK, or tide_simulate's failure (*step and *keep untouched). */
tide_status tide_plan_steady_step(const tide_plan *p, const tide_hw *hw, double *step, tide_sim_result *keep);

/* The ideal step of g on hw, into *step: what TERAIO calls the speed with
 * unlimited memory. The steady step (tide policy, n_iter = 2) of a plan with
 * every WEIGHT and STATE tensor warm at a fixed offset on the device (never
 * loaded or stored) and a device budget of their bytes plus the unbounded
 * peak of the rest; only the batch moves. For a data-parallel rank's step
 * (collectives in g), the network costs nothing too: perfect scaling. Returns TIDE_OK, TIDE_E_NOMEM, or
 * the failure of planning or simulating (message on ctx). */
tide_status tide_plan_ideal_step(tide_ctx *ctx, const tide_graph *g, const tide_hw *hw, double *step);

/* Bytes a plan moves per link in its second iteration (its only one when
 * n_iter is 1): LOADs from host (h2d) or SSD (ssd_read), STOREs to host (d2h)
 * or SSD (ssd_write), MOVEs between host and SSD by direction. */
typedef struct tide_step_bytes {
    uint64_t h2d, d2h, ssd_read, ssd_write;
} tide_step_bytes;
tide_step_bytes tide_plan_step_bytes(const tide_plan *p);

/* Row tiling of a training step (tide_llama_train_tile_level) for a budget.
 * tile: TIDE_TILE_AUTO, TIDE_TILE_NONE or a level; host_updates: every ADAMW
 * runs on the host CPU (po->host_ops is made per graph, as the graphs of the
 * levels differ). Levels from `from` (a forced level: that one) are tried:
 *   - with min_budget: the level whose minimum budget under po is smallest
 *     (coarsest on ties), that minimum in *min_budget;
 *   - without: the coarsest level whose largest device working set under po
 *     fits po->device_budget (a plan may still find it infeasible: the
 *     caller then tries from *level + 1).
 * On success *g is the level's graph (the caller frees it), *level the level
 * and o->tile_seqs its tiles. TIDE_E_INFEASIBLE (message on ctx) when no
 * level fits; the failure of building or planning otherwise. */
tide_status tide_train_tiling(tide_ctx *ctx, const tide_llama_config *cfg, tide_llama_train_opts *o,
                              const tide_plan_opts *po, bool host_updates, int tile, int from, tide_graph **g,
                              int *level, uint64_t *min_budget);

/* A training step planned by tide_train_plan_tiled: its graph, plan, tiling
 * level, the updates placed on the host CPU (one per op of g, or NULL) and
 * the placement's figures. */
typedef struct tide_train_planned {
    tide_graph *g;
    tide_plan *p;
    int level;
    bool *host_ops;
    train_optim_choice oc;
} tide_train_planned;
void tide_train_planned_free(tide_train_planned *t);

/* Plans a training step (po: policy, budget, host budget, n_iter, profile)
 * with its row tiling searched: tile TIDE_TILE_NONE plans the step o makes;
 * a forced level plans that level; auto starts at the coarsest level whose
 * largest op fits (a level that does not plan gives way to the next) and
 * plans finer levels while each is predicted faster than the last (smaller
 * working sets leave the prefetch more room), keeping the fastest. The
 * first level that plans places the AdamW updates by train_optim_place
 * (mode; where that placement cannot plan, fallback); finer levels are
 * tried with its placement (one plan each), and the level kept then searches
 * its own (when it has at most TIDE_TRAIN_SEARCH_MAX_OPS ops: the search
 * plans it about 2 + 2 log2(updates) times), kept when faster. A plan may be
 * the zero-offload baseline's
 * (consider_zero_offload). On success *out holds the plan kept
 * and o->tile_seqs and o->vocab_blocks its tiling; the failure of the last level tried
 * otherwise (TIDE_E_INFEASIBLE naming what it needs). */
#define TIDE_TRAIN_SEARCH_MAX_OPS 40000
tide_status tide_train_plan_tiled(tide_ctx *ctx, const tide_llama_config *cfg, tide_llama_train_opts *o,
                                  const tide_plan_opts *po, train_optim_mode mode, train_optim_mode fallback, int tile,
                                  tide_train_planned *out);

#endif
