/*
 * pool_predict.h - what the pool knows of a workload before it runs: its
 * minimum and need, and the predicted time of its typical request at a few
 * budgets (its curve), all by planning its graphs as the model will, with
 * the same cost model (the planner's own simulated makespans).
 */
#ifndef TIDE_SERVE_POOL_PREDICT_H
#define TIDE_SERVE_POOL_PREDICT_H

#include "runtime/tiling.h"

#define POOL_POINTS 8 /* budgets a workload's curve is planned at */

typedef struct pool_curve {
    int n;
    uint64_t b[POOL_POINTS]; /* ascending; b[0] the minimum, b[n-1] the need */
    double t[POOL_POINTS];   /* predicted seconds of the typical request (INFINITY: no plan) */
} pool_curve;

/* A workload's graphs and how its model plans them (policy tide, untiled). */
typedef struct pool_predict {
    tide_ctx *ctx;            /* failures, named after `name` */
    const tide_hw *hw;
    uint64_t host_budget;
    bool host_addressable;    /* the backend's device memory is host memory */
    bool weights_on_ssd;      /* the weights are homed on SSD */
    const tide_llama_config *cfg;
    int ctx_len;
    const char *name;
} pool_predict;

/* The minimum (the smallest budget both its longest prefill, ctx_len tokens,
 * and its decode step plan at) and the need (the larger unconstrained peak of
 * the two, at least the minimum). TIDE_OK or the planner's failure. */
tide_status pool_predict_bounds(const pool_predict *pp, uint64_t *min, uint64_t *need);
/* The predicted time of a request of `prompt` tokens and `gen` new ones (one
 * prefill, gen - 1 decode steps) at POOL_POINTS budgets from min to need
 * (geometric, TIDE_PLAN_ALIGN-rounded, duplicates dropped) into *cv. */
tide_status pool_predict_curve(const pool_predict *pp, uint64_t min, uint64_t need, int prompt, int gen,
                               pool_curve *cv);

/* Policy tide's partition of `total` bytes among n workloads of curves cv
 * (each's b[0] its minimum; their sum <= total) with queued-request
 * weights wt: every share starts at its minimum, then the move of one
 * workload up to a later point of its curve with the largest predicted
 * saving per byte (saving weighted), while bytes remain: a greedy over each
 * curve's points that can jump a flat stretch to a drop beyond it. Shares
 * into share[n]. Pure: the pool's partition and the benchmark's simulation
 * call it alike. */
void pool_predict_partition(int n, const pool_curve *const *cv, const double *wt, uint64_t total, uint64_t *share);

#endif
