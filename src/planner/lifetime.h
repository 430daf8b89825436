/*
 * lifetime.h - lifetime analysis for the planner (docs/design.md section 4.1).
 *
 * A plan runs the graph n_iter times; the planner reasons over the unrolled
 * op sequence, where step = iter * n_ops + op. For every tensor this module
 * keeps the ordered list of ops of one iteration that read or write it (CSR
 * arrays), so that "the next use of t after step s" is one binary search,
 * O(log uses), without materialising the n_iter copies.
 *
 * Access kinds: an op that lists t among its inputs reads it; among its
 * outputs writes it (fully: an output's previous value is never merged); both
 * is an in-place update (the KV cache in ATTENTION), which needs the previous
 * value. A value is dead after step s when the next access is a pure write or
 * there is none.
 *
 * With a schedule (tide_lifetime_build_sched), an iteration is a sequence of
 * positions, each running one op of the graph; an op may appear at several
 * positions (recomputation). Steps, "ops" in the use lists and n_ops are then
 * positions: step = iter * n_pos + pos.
 */
#ifndef TIDE_LIFETIME_H
#define TIDE_LIFETIME_H

#include "graph/graph.h"

#include <limits.h>

/* A step that never comes. */
#define TIDE_NEVER INT_MAX

enum { TIDE_USE_READ = 1, TIDE_USE_WRITE = 2 };

typedef struct tide_lifetime {
    const tide_graph *g;  /* not owned */
    int n_ops, n_iter, n_tensors; /* n_ops: positions per iteration (the graph's ops
                                     unless a schedule is given) */
    int n_steps;          /* n_iter * n_ops */
    int *start;           /* (n_tensors + 1): uses of t are [start[t], start[t+1]) */
    int *use_op;          /* op of each use, ascending within a tensor */
    unsigned char *use_rw;/* TIDE_USE_READ | TIDE_USE_WRITE of each use */
    int *last_write_op;   /* per tensor: last op of an iteration writing it, -1 */
} tide_lifetime;

/* Builds the use lists of g for n_iter iterations. Returns TIDE_OK,
 * TIDE_E_INVALID (n_iter < 1, too many steps, a TEMP/OUTPUT tensor read
 * before any op of the iteration writes it: its value would be undefined, or
 * an OUTPUT no op writes) or
 * TIDE_E_NOMEM; the message is on ctx. On failure *lt is left empty (safe to
 * free). */
tide_status tide_lifetime_build(tide_ctx *ctx, const tide_graph *g, int n_iter, tide_lifetime *lt);
/* The same over a schedule: sched[pos] (n_pos entries) is the op run at
 * position pos of an iteration; NULL: op pos, n_pos = g->n_ops. */
tide_status tide_lifetime_build_sched(tide_ctx *ctx, const tide_graph *g, const int *sched, int n_pos, int n_iter,
                                      tide_lifetime *lt);
void tide_lifetime_free(tide_lifetime *lt);

/* Number of uses of t in one iteration. */
static inline int tide_lifetime_n_uses(const tide_lifetime *lt, int t) {
    return lt->start[t + 1] - lt->start[t];
}

/* First step >= step at which t is used, or TIDE_NEVER; *rw (may be NULL)
 * receives the access kind (0 for TIDE_NEVER). O(log uses). */
int tide_lifetime_use_from(const tide_lifetime *lt, int t, int step, int *rw);
/* First step > step at which t is used (TIDE_NEVER if none). */
int tide_lifetime_next_use(const tide_lifetime *lt, int t, int step, int *rw);
/* Last position of an iteration that uses t, or -1. */
static inline int tide_lifetime_last_op(const tide_lifetime *lt, int t) {
    return lt->start[t] < lt->start[t + 1] ? lt->use_op[lt->start[t + 1] - 1] : -1;
}
/* Last step of the whole plan that uses t, or -1 if the graph never uses it. */
int tide_lifetime_last_use(const tide_lifetime *lt, int t);
/* Last step of the whole plan that writes t, or -1. */
int tide_lifetime_last_write(const tide_lifetime *lt, int t);
/* True if the value t holds after step is never read again: the next access
 * is a pure write, or there is none. */
bool tide_lifetime_dead_after(const tide_lifetime *lt, int t, int step);

#endif
