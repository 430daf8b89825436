/*
 * runner.c - the one engine (runner.h): a graph, its verified plan and an
 * executor, with homes bound by name.
 */
#include "runtime/runner.h"
#include "verify/verify.h"

#include <string.h>

struct tide_runner {
    tide_ctx *ctx;
    tide_graph *g;
    tide_plan *p;
    tide_exec *ex;
    tide_sim_event *timeline; /* with exec.timed: one event per instruction */
    bool timed_ok;            /* a run has filled timeline */
};

void tide_runner_free(tide_runner *r) {
    if (!r) return;
    tide_exec_free(r->ex);
    tide_plan_free(r->p);
    tide_graph_free(r->g);
    tide_free(r->timeline);
    tide_free(r);
}

tide_status tide_runner_new(tide_ctx *ctx, tide_backend *be, tide_graph *g, tide_plan *p,
                            const tide_runner_opts *o, tide_runner **out) {
    *out = NULL;
    tide_runner *r = tide_calloc(1, sizeof *r);
    if (!r) {
        tide_plan_free(p);
        tide_graph_free(g);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory making a runner");
    }
    r->ctx = ctx;
    r->g = g;
    r->p = p;
    tide_status st = tide_plan_verify(p);
    if (st) st = tide_err(ctx, st, "the plan failed verification and was not run: %s", tide_ctx_last_error(ctx));
    if (!st && o->exec.timed &&
        !(r->timeline = tide_calloc((size_t)(p->n_ins ? p->n_ins : 1), sizeof *r->timeline)))
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory for a run's timeline");
    if (!st) st = tide_exec_new(ctx, be, p, &o->exec, &r->ex);
    if (st) {
        tide_runner_free(r);
        return st;
    }
    *out = r;
    return TIDE_OK;
}

const tide_graph *tide_runner_graph(const tide_runner *r) { return r->g; }
const tide_plan *tide_runner_plan(const tide_runner *r) { return r->p; }

tide_status tide_runner_bind(tide_runner *r, const char *name, void *data) {
    int found = 0;
    for (int t = 0; t < r->g->n_tensors; t++) {
        uint64_t off = 0;
        const char *home = tide_graph_tensor_home(r->g, t, &off);
        if (strcmp(home, name) != 0) continue;
        tide_status st = tide_exec_bind_host(r->ex, t, data ? (char *)data + off : NULL);
        if (st) return st;
        found++;
    }
    return found ? TIDE_OK : tide_err(r->ctx, TIDE_E_NOT_FOUND, "the graph has no tensor '%s' to bind", name);
}

tide_status tide_runner_bind_tensor(tide_runner *r, int t, void *data) { return tide_exec_bind_host(r->ex, t, data); }

tide_status tide_runner_bind_file(tide_runner *r, int t, const char *path, uint64_t off) {
    return tide_exec_bind_file(r->ex, t, path, off);
}

tide_status tide_runner_run(tide_runner *r, tide_exec_stats *stats) {
    r->timed_ok = false;
    tide_status st = tide_exec_run(r->ex, r->timeline, stats);
    r->timed_ok = !st && r->timeline;
    return st;
}

const tide_sim_event *tide_runner_timeline(const tide_runner *r) { return r->timed_ok ? r->timeline : NULL; }
const char *tide_runner_notice(const tide_runner *r) { return tide_exec_notice(r->ex); }
