/*
 * plan.c - the plan container: instruction list with per-instruction waits,
 * names of tiers, streams, instruction kinds and policies.
 */
#include "ir/plan.h"

#include <string.h>

static const char *const tier_names[] = {"device", "host", "ssd"};
static const char *const stream_names[] = {"compute", "h2d", "d2h", "io", "host", "net"};
static const char *const ins_names[] = {"compute", "load", "store", "move", "drop", "all_reduce", "reduce_scatter", "all_gather"};
static const char *const policy_names[] = {"tide", "static-layer", "lru", "checkpoint-layer", "zero-offload"};
static const char *const place_names[] = {"device", "host"};

const char *tide_tier_name(tide_tier t) { return (unsigned)t < TIDE_TIER_COUNT ? tier_names[t] : "?"; }
const char *tide_stream_name(tide_stream s) { return (unsigned)s < TIDE_STREAM_COUNT ? stream_names[s] : "?"; }
const char *tide_ins_name(tide_ins_kind k) { return (unsigned)k < TIDE_INS_COUNT ? ins_names[k] : "?"; }
const char *tide_place_name(tide_place p) { return (unsigned)p < TIDE_PLACE_COUNT ? place_names[p] : "?"; }
const char *tide_policy_name(tide_policy p) { return (unsigned)p < TIDE_POLICY_COUNT ? policy_names[p] : "?"; }

int tide_policy_parse(const char *s, tide_policy *out) {
    for (int i = 0; i < TIDE_POLICY_COUNT; i++)
        if (strcmp(s, policy_names[i]) == 0) {
            *out = (tide_policy)i;
            return 0;
        }
    return -1;
}

tide_plan *tide_plan_alloc(tide_ctx *ctx, const tide_graph *g, int n_iter) {
    tide_plan *p = tide_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->g = g;
    p->ctx = ctx;
    p->n_iter = n_iter;
    p->ranks = 1;
    int n = g->n_tensors ? g->n_tensors : 1;
    p->home = tide_calloc((size_t)n, sizeof *p->home);
    p->resident = tide_calloc((size_t)n, sizeof *p->resident);
    p->warm_off = tide_malloc((size_t)n * sizeof *p->warm_off);
    if (!p->home || !p->resident || !p->warm_off) {
        tide_plan_free(p);
        return NULL;
    }
    for (int t = 0; t < g->n_tensors; t++) {
        tide_role r = g->tensors[t].role;
        p->home[t] = r == TIDE_ROLE_TEMP ? TIDE_TIER_DEVICE : TIDE_TIER_HOST;
        p->warm_off[t] = TIDE_HOME;
    }
    return p;
}

void tide_plan_free(tide_plan *p) {
    if (!p) return;
    tide_free(p->home);
    tide_free(p->resident);
    tide_free(p->warm_off);
    tide_free(p->ins);
    tide_free(p->waits);
    tide_free(p);
}

int tide_plan_push(tide_plan *p, const tide_ins *ins, const int *waits, int n_wait) {
    if (tide_grow((void **)&p->ins, &p->cap_ins, p->n_ins + 1, sizeof *p->ins)) return -1;
    if (n_wait > 0 && tide_grow((void **)&p->waits, &p->cap_waits, p->n_waits + n_wait, sizeof *p->waits))
        return -1;
    tide_ins *d = &p->ins[p->n_ins];
    *d = *ins;
    d->wait_at = p->n_waits;
    d->n_wait = n_wait > 0 ? n_wait : 0;
    if (n_wait > 0) memcpy(p->waits + p->n_waits, waits, (size_t)n_wait * sizeof *waits);
    p->n_waits += d->n_wait;
    return p->n_ins++;
}
