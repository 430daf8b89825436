/*
 * pool_predict.h - what the pool knows of a workload before it runs: its
 * minimum and need, and the predicted time of its typical request at a few
 * budgets (its curve), all by planning its graphs as the model will, with
 * the same cost model (the planner's own simulated makespans).
 */
#ifndef TIDE_SERVE_POOL_PREDICT_H
#define TIDE_SERVE_POOL_PREDICT_H

#include "runtime/tiling.h"

#define POOL_POINTS 8 /* budgets a workload's curve is planned at (and the pool's whole budget) */
#define POOL_POINTS_MAX (POOL_POINTS + 1)
#define POOL_REGIME_MARGIN 0.9 /* shares <-> time-slicing only when predicted this much faster */
#define POOL_KNEE_SLACK 1e-3   /* a turn's share: the smallest point this close to the whole budget's time */

typedef struct pool_curve {
    int n;
    uint64_t b[POOL_POINTS_MAX]; /* ascending; b[0] the minimum, b[n-1] the need */
    double t[POOL_POINTS_MAX];   /* predicted seconds of the typical request (INFINITY: no plan),
                                its weights warm as the model keeps them at that share */
    uint64_t warm[POOL_POINTS_MAX]; /* the warm weights' bytes at that share (0: none) */
    double u[POOL_POINTS_MAX];   /* seconds to load them: paid once when the share changes */
    /* of t[k], the busy seconds of each resource the workloads share (the
     * cost model's): compute, the host-device link (both ways), the SSDs */
    double comp[POOL_POINTS_MAX], link[POOL_POINTS_MAX], ssd[POOL_POINTS_MAX];
} pool_curve;

/* A workload's graphs and how its model plans them (policy tide, untiled). */
typedef struct pool_predict {
    tide_ctx *ctx;            /* failures, named after `name` */
    const tide_hw *hw;
    uint64_t host_budget;
    bool host_addressable;    /* the backend's device memory is host memory */
    bool weights_on_ssd;      /* the weights are homed on SSD */
    bool warm;                /* the model keeps weights warm in its arena across requests
                                 (tide policy, on a device or with the weights on SSD) */
    const tide_llama_config *cfg;
    const tide_checkpoint *ck; /* the model's weights, whose order its warm region follows
                                 (NULL: the graph's order) */
    uint64_t total;           /* the pool's whole budget: a point of the curve too where it
                                 lies between the minimum and the need (0: none) */
    int ctx_len;
    tide_dtype cache_dtype;   /* the KV cache's type */
    const char *name;
} pool_predict;

/* The minimum (the smallest budget both its longest prefill, ctx_len tokens,
 * and its decode step plan at) and the need (the larger unconstrained peak of
 * the two, at least the minimum; with warm weights, that plus every weight:
 * the share at which none is read again). TIDE_OK or the planner's failure. */
tide_status pool_predict_bounds(const pool_predict *pp, uint64_t *min, uint64_t *need);
/* The predicted time of a request of `prompt` tokens and `gen` new ones (one
 * prefill, gen - 1 decode steps) at POOL_POINTS budgets from min to need
 * (geometric, TIDE_PLAN_ALIGN-rounded, duplicates dropped), and at
 * pp->total where it lies between them (what a time-sliced turn may hold),
 * into *cv. With
 * warm weights, at each budget the warm region is chosen as the model
 * chooses it (runtime/place.c choose_warm: the weights in order, first fit,
 * within 0, 2/8, 4/8, 6/8 or 7/8 of the budget, the candidate whose prompt
 * and gen - 1 decode steps, at most 32, plan fastest), the request priced
 * with those weights
 * in place, and u[k] the time to read them in once. */
tide_status pool_predict_curve(const pool_predict *pp, uint64_t min, uint64_t need, int prompt, int gen,
                               pool_curve *cv);

/* The predicted cost of workload i at point k of its curve: wt x t[k], plus
 * u[k] unless b[k] is the share it runs at now (cur; 0: none), whose warm
 * weights are loaded already: a share that changes loads them again. */
double pool_predict_cost(const pool_curve *cv, int k, double wt, uint64_t cur);

/* Policy tide's partition of `total` bytes among n workloads of curves cv
 * (each's b[0] its minimum; their sum <= total) with queued-request
 * weights wt and current shares cur (0: none): every share starts at its
 * minimum, then the move of one workload up to a later point of its curve
 * with the largest predicted saving (pool_predict_cost) per byte, while
 * bytes remain: a greedy over each curve's points that can jump a flat
 * stretch to a drop beyond it. Shares into share[n]. Pure: the pool's
 * partition and the benchmark's simulation call it alike. */
void pool_predict_partition(int n, const pool_curve *const *cv, const double *wt, const uint64_t *cur,
                            uint64_t total, uint64_t *share);

/* The point of cv a time-sliced turn runs at (policy tide): the smallest
 * whose predicted time is within POOL_KNEE_SLACK of the time at `total`
 * (the knee: more bytes would buy nothing), so that the rest of the budget
 * can keep other workloads' warm weights loaded between their turns; -1
 * when no point is at or below `total`. */
int pool_predict_knee(const pool_curve *cv, uint64_t total);

/* Policy tide's choice between shares and time-slicing (one workload at a
 * time, each turn at its knee of the whole budget, pool_predict_knee):
 * the shares of pool_predict_partition into share[n] and the predicted time
 * of their queued work into *part_s: the workloads run at once, so the
 * longest of each resource's busy time summed over them (compute, link,
 * SSD) and each one's own weighted time (a bound that takes their overlap
 * as perfect), plus the weights loaded for shares that change; the
 * predicted time of slicing into *slice_s: one request at a time, each at
 * its knee; when the knees fit together, each workload's warm weights
 * loaded once (none when its share now is its knee's point), else again at
 * every request when n > 1 (another workload ran between). Returns whether to time-slice: from shares
 * (sliced_now false) when slicing is predicted faster by the margin
 * (slice < POOL_REGIME_MARGIN x shares), and from slicing back to shares
 * when shares are predicted faster by it; never for one workload. Pure. */
bool pool_predict_choose(int n, const pool_curve *const *cv, const double *wt, const uint64_t *cur, uint64_t total,
                         bool sliced_now, uint64_t *share, double *part_s, double *slice_s);

#endif
