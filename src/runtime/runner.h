/*
 * runner.h - the one engine: a graph bound to a backend through a verified
 * plan and run by the executor, with its homes bound by name. Every workload
 * runs on it: resident runs (an unconstrained plan: tensors kept warm on the
 * device or, where device memory is host memory, used in place), offloaded
 * runs (a plan under a budget), and whatever is built on them (generation,
 * training steps, several models sharing a device). The runner knows no
 * model: which tensor is a weight, the cache or the logits is its client's
 * business (runtime/generate.c for LLaMA).
 */
#ifndef TIDE_RUNTIME_RUNNER_H
#define TIDE_RUNTIME_RUNNER_H

#include "exec/executor.h"

typedef struct tide_runner tide_runner;

/* Device memory `--budget auto` leaves free for the runtime (cuBLAS
 * workspaces, kernel images, later allocations of the CUDA runtime): the
 * larger of 512 MiB and 1/32 of the device's memory. */
#define TIDE_AUTO_MARGIN(total) TIDE_MAX((uint64_t)512 << 20, (uint64_t)(total) / 32)

typedef struct tide_runner_opts {
    tide_exec_opts exec;          /* arena (lent: several runners may share one), spill
                                     directories, issue mode; exec.timed: measure every
                                     run's timeline (tide_runner_timeline) */
} tide_runner_opts;

/* Makes a runner of plan p of graph g on be, taking both (freed with the
 * runner, or at once on failure). The plan is verified first (docs/design.md
 * invariant 3: a plan the verifier rejects never runs). Returns TIDE_OK,
 * TIDE_E_VERIFY, or what tide_exec_new returns (arena, pool or spill store
 * refused). */
tide_status tide_runner_new(tide_ctx *ctx, tide_backend *be, tide_graph *g, tide_plan *p,
                            const tide_runner_opts *o, tide_runner **out);
void tide_runner_free(tide_runner *r);

const tide_graph *tide_runner_graph(const tide_runner *r);
const tide_plan *tide_runner_plan(const tide_runner *r);

/* Binds to host memory at data the home of the tensor named `name` and of
 * every tensor that is a byte range of it (a weight block, a batch row of a
 * cache: tide_graph_set_tensor_home), each at data plus its offset. Inputs,
 * outputs and persistent tensors alike; a binding holds until replaced.
 * Returns TIDE_OK or TIDE_E_NOT_FOUND (the graph has no such tensor). */
tide_status tide_runner_bind(tide_runner *r, const char *name, void *data);
/* Binds tensor t's home to host memory, or to bytes [off, +nbytes) of the
 * file at path (a weight homed on SSD). */
tide_status tide_runner_bind_tensor(tide_runner *r, int t, void *data);
tide_status tide_runner_bind_file(tide_runner *r, int t, const char *path, uint64_t off);

/* Runs the plan once (every home must be bound). Returns TIDE_OK or the
 * failure of the run (tide_exec_run); stats may be NULL. */
tide_status tide_runner_run(tide_runner *r, tide_exec_stats *stats);

/* The measured timeline of the last run (one event per instruction), or NULL
 * when none was asked for (opts.exec.timed) or no run has completed. */
const tide_sim_event *tide_runner_timeline(const tide_runner *r);
/* The executor's notice ("" when none): pinning refused, pageable memory used. */
const char *tide_runner_notice(const tide_runner *r);

#endif
