/*
 * optim_place.h - where a training step's AdamW updates run (Training II,
 * computation co-offload): on the device, the parameter's master weights
 * and moments brought to it and taken back when they do not stay there, or
 * on the host CPU where they live, only the gradient going down and the
 * updated parameter coming up. See optim_place.c.
 */
#ifndef TIDE_OPTIM_PLACE_H
#define TIDE_OPTIM_PLACE_H

#include "planner/planner.h"

typedef enum train_optim_mode {
    TRAIN_OPTIM_AUTO = 0, /* each update where the plan's predicted step is shortest */
    TRAIN_OPTIM_DEVICE,   /* every update on the device */
    TRAIN_OPTIM_CPU,      /* every update on the host CPU */
} train_optim_mode;

/* Parses "auto", "device" or "cpu". Returns 0 or -1. */
int train_optim_parse(const char *s, train_optim_mode *out);
const char *train_optim_name(train_optim_mode m);

typedef struct train_optim_choice {
    int n_groups;          /* AdamW updates in the step (one per parameter) */
    int n_host;            /* of them on the host CPU */
    uint64_t host_state_bytes, state_bytes; /* parameter, master and moment bytes of those
                                              updates, and of all */
    double makespan_s;     /* the chosen plan's predicted makespan */
    double device_makespan_s; /* every update on the device (0: infeasible there) */
    int plans_tried;
} train_optim_choice;

/* Chooses the placement of g's ADAMW ops under po (policy tide; po->host_ops
 * ignored) into *host_ops (malloc'd, one per op of g; NULL when every update
 * stays on the device) and *choice. AUTO plans candidate splits and keeps the
 * one with the shortest predicted makespan: the updates in order of their
 * state bytes, largest first, the first k on the host, k searched from the
 * ends and the middle inward by halving steps (about 2 + 2 log2(n) plans);
 * all on the device is always a candidate, so the choice is never predicted
 * slower than it. Returns TIDE_OK, TIDE_E_UNSUPPORTED (CPU updates under a
 * baseline policy), the planner's failure when no candidate can be planned,
 * or TIDE_E_NOMEM. */
tide_status train_optim_place(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *po, train_optim_mode mode,
                              bool **host_ops, train_optim_choice *choice);

/* Every ADAMW of g on the host CPU: a host_ops array (one per op of g, the
 * caller frees it), or NULL (TIDE_E_NOMEM on ctx). */
bool *train_optim_all_host(tide_ctx *ctx, const tide_graph *g);

/* After the step's plan p of g is made from choice's placement: when the
 * planner took the zero-offload baseline's plan instead (tide_plan_make:
 * faster, or the only one that fits), *choice is set to what p places
 * (every update on the host, no all-device figure). Returns whether it
 * changed. */
bool train_optim_sync(const tide_graph *g, const tide_plan *p, train_optim_choice *choice);

#endif
