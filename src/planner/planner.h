/*
 * planner.h - the planner's entry points (docs/design.md section 4): a graph, a
 * device budget and a cost model in, a plan out; the smallest budget a policy
 * can plan, the unconstrained peak, and the lower bound and ideal of docs/design.md
 * section 6.3. The planner plans graphs; it never builds them (the runtime
 * does) and never runs them (the executor does).
 */
#ifndef TIDE_PLANNER_H
#define TIDE_PLANNER_H

#include "cost/cost.h"

typedef struct tide_plan_opts {
    tide_policy policy;
    uint64_t device_budget;       /* bytes of the arena */
    uint64_t host_budget;         /* 0: the profile's host memory */
    int n_iter;                   /* >= 1 */
    const tide_hw *hw;            /* cost model */
    bool weights_on_ssd;          /* home WEIGHTs on SSD instead of host */
    /* The following are planned by the tide policy only (the baselines
     * refuse them with TIDE_E_UNSUPPORTED). */
    bool recompute_cheap;         /* recompute cheap activations instead of keeping or
                                     spilling them (recompute.c's rule); tide_plan_make
                                     tries it by itself and keeps the faster plan */
    int recompute_chain;          /* with recompute_cheap: also recompute chains of
                                     producers up to this many links deep (0: single ops);
                                     tide_plan_make tries RECOMPUTE_CHAIN_DEPTH too */
    const bool *host_ops;         /* per op of g, or NULL: place that op's COMPUTE on the
                                     host CPU (its operands in host memory) */
    bool consider_zero_offload;   /* a training step: tide_plan_make also plans the
                                     zero-offload baseline (its own placement, host_ops
                                     ignored) and keeps its plan, labelled tide, when it is
                                     faster (train_optim_sync reads what it placed) */
    bool host_addressable;        /* the backend's device memory is host memory: tensors
                                     homed on host are read and written in place by
                                     device computes, never loaded or stored (the
                                     arena then holds what lives nowhere else) */
    const uint64_t *warm_off;     /* per tensor of g, or NULL: TIDE_HOME, or the arena
                                     offset where a weight or state is kept across runs
                                     (ir/plan.h: warm tensors) */
    uint64_t warm_region;         /* a multiple of TIDE_PLAN_ALIGN within the budget, or 0:
                                     [0, warm_region) is left to the warm tensors whole,
                                     the bytes no warm tensor of g covers included (the
                                     arena's other users keep theirs there) */
    bool shared_scratch;          /* one workspace, the largest device op's scratch, at the
                                     lowest free range of the arena, used by every device
                                     compute (they run one at a time on the compute stream)
                                     instead of a range per op: the workspace stays in the
                                     caches; for generous budgets (resident runs), since the
                                     range is held for the whole plan */
} tide_plan_opts;

/* Plans g under opts. Returns TIDE_OK with *out set; TIDE_E_INFEASIBLE with a
 * message "needs at least N bytes" when the budget is below what one op's
 * working set needs (or host memory cannot hold what must live there);
 * TIDE_E_NOMEM. The plan's stats are filled in (makespan from the simulator). */
tide_status tide_plan_make(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts,
                           tide_plan **out);
/* Smallest device budget for which the policy finds a plan (binary search
 * between the largest op working set and the unconstrained peak). */
tide_status tide_plan_min_budget(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts,
                                 uint64_t *min_budget);
/* Bytes the device needs with no limit: every tensor resident for the whole run
 * would be an upper bound; this is the peak of the tide policy's plan with an
 * unlimited budget (persistent tensors resident, temps freed after last use). */
uint64_t tide_plan_unconstrained_peak(tide_ctx *ctx, const tide_graph *g, const tide_hw *hw, int n_iter);
/* The same under opts (its policy, budget and warm offsets ignored) into
 * *peak: with host_addressable, only what does not live in host memory
 * counts; with host placements, only what device computes need. TIDE_OK, or
 * the failure of planning. */
tide_status tide_plan_peak_unbounded(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts, uint64_t *peak);

/* Device bytes op needs at once: every distinct input and output tensor plus
 * its scratch, each rounded up to the granule. No plan of g fits a budget
 * below the largest of these. */
uint64_t tide_op_working_set(const tide_graph *g, const tide_op *op);
/* Largest working set over the ops of g (*which: the op, may be NULL). */
uint64_t tide_graph_max_working_set(const tide_graph *g, int *which);
/* The same under opts into *ws: only what device computes need in the arena
 * (with host_addressable, tensors homed on host are used in place and count
 * for nothing; ops placed on the host need none). No plan of g under opts
 * fits a budget below it. TIDE_OK, or the failure of setting up a plan
 * (TIDE_E_INVALID, TIDE_E_INFEASIBLE: host memory, TIDE_E_NOMEM). */
tide_status tide_plan_max_working_set(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts, uint64_t *ws);

/* Co-offload of inference (host_place.c): which MATMULs whose weights live in
 * host memory run on the host CPU, chosen by planning. */
typedef struct tide_host_place_info {
    int n_candidates;             /* MATMULs that may run on the host */
    int n_host;                   /* placed there */
    uint64_t host_weight_bytes;   /* their weights' bytes */
    double fraction;              /* of the candidates' weight bytes */
    int host_layers;              /* whole decoder layers placed there (0: MATMULs alone) */
    double makespan_s;            /* predicted, of the kept placement */
    double device_makespan_s;     /* predicted with every op on the device (0: not plannable) */
    int plans_tried;
} tide_host_place_info;
/* Whether op o of g may run on the host CPU in a co-offloaded plan under po:
 * a MATMUL reading a WEIGHT homed in host memory whose host compute is not
 * far slower than bringing its weight over the link. */
bool tide_host_place_candidate(const tide_graph *g, const tide_plan_opts *po, int o);
/* Chooses the ops of an inference graph g to run on the host CPU under po
 * (policy tide; nothing for other policies, host_addressable plans, weights
 * on SSD, a po->host_ops already given, or training graphs): MATMULs spread
 * over the graph, or every op of the first decoder layers, whichever plans
 * faster, into *host_ops (malloc'd,
 * one per op; NULL when none is placed there: every op on the device is then
 * predicted as fast or faster). TIDE_OK, TIDE_E_NOMEM, or the failure of
 * planning when no candidate placement plans. */
tide_status tide_plan_host_place(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *po, bool **host_ops,
                                 tide_host_place_info *info);

/* Lower bound (docs/design.md section 6.3) and ideal for a graph on hw at a budget. */
/* tide_bounds: tide.h. */
tide_status tide_plan_bounds(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts,
                             tide_bounds *out);

#endif
