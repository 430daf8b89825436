/*
 * test_verify_alone.c - the verifier as a library of its own. This program
 * is compiled against an include directory holding only include/, core/,
 * graph/ and ir/, and linked with the base objects (core, graph, plan IR)
 * and the verifier's alone: no planner, simulator, runtime or backend. That
 * it builds is the proof that the verifier shares no code with the planner;
 * that it runs shows the verifier works there: a hand-written plan passes,
 * and the same plan with one wait removed (a read of a value still being
 * loaded) fails with TIDE_E_VERIFY.
 *
 * Plain C, no test framework: the program must stay within what the base
 * links. Exit status 0 on success, 1 on the first failed check.
 *
 * What it proves: the verifier built against `ir/`, `graph/` and `core/`
 * alone and linked without the planner, simulator, runtime or backends: a
 * plan verifies there and a planted fault is rejected.
 */
#include "ir/plan.h"
#include "verify/verify.h"

#include <stdio.h>
#include <string.h>

static int failed;
#define CHECK(c)                                                        \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            failed = 1;                                                 \
        }                                                               \
    } while (0)

static tide_ins ins(tide_ins_kind k, tide_stream s) {
    tide_ins in;
    memset(&in, 0, sizeof in);
    in.kind = k, in.stream = s, in.op = -1, in.tensor = -1, in.tier_off = TIDE_HOME, in.src_off = TIDE_HOME;
    return in;
}

/* w (weight, host) and x (input) -> y (output): LOAD w, LOAD x, COMPUTE,
 * STORE y home, DROPs. with_wait: the COMPUTE waits for the LOAD of w. */
static tide_status plan_and_verify(tide_ctx *ctx, const tide_graph *g, bool with_wait) {
    tide_plan *p = tide_plan_alloc(ctx, g, 1);
    CHECK(p != NULL);
    if (!p) return TIDE_E_NOMEM;
    p->device_budget = 3 * TIDE_PLAN_ALIGN;
    tide_ins a = ins(TIDE_INS_LOAD, TIDE_STREAM_H2D);
    a.tensor = 0, a.src = TIDE_TIER_HOST, a.dst = TIDE_TIER_DEVICE, a.dev_off[0] = 0;
    a.stream = TIDE_STREAM_IO; /* w on its own stream: only a wait orders it */
    int lw = tide_plan_push(p, &a, NULL, 0);
    a.stream = TIDE_STREAM_H2D, a.tensor = 1, a.dev_off[0] = TIDE_PLAN_ALIGN;
    int lx = tide_plan_push(p, &a, NULL, 0);
    tide_ins c = ins(TIDE_INS_COMPUTE, TIDE_STREAM_COMPUTE);
    c.op = 0, c.dev_off[0] = 0, c.dev_off[1] = TIDE_PLAN_ALIGN, c.dev_off[2] = 2 * TIDE_PLAN_ALIGN;
    int waits[2] = {lx, lw};
    int cc = tide_plan_push(p, &c, waits, with_wait ? 2 : 1);
    tide_ins s = ins(TIDE_INS_STORE, TIDE_STREAM_D2H);
    s.tensor = 2, s.src = TIDE_TIER_DEVICE, s.dst = TIDE_TIER_HOST, s.dev_off[0] = 2 * TIDE_PLAN_ALIGN;
    int st = tide_plan_push(p, &s, &cc, 1);
    for (int t = 0; t < 3; t++) {
        tide_ins d = ins(TIDE_INS_DROP, t == 2 ? TIDE_STREAM_D2H : TIDE_STREAM_COMPUTE);
        d.tensor = t, d.src = d.dst = TIDE_TIER_DEVICE, d.dev_off[0] = (uint64_t)t * TIDE_PLAN_ALIGN;
        CHECK(tide_plan_push(p, &d, t == 2 ? &st : &cc, 1) >= 0);
    }
    tide_status r = tide_plan_verify(p);
    tide_plan_free(p);
    return r;
}

int main(void) {
    tide_ctx *ctx = tide_ctx_new();
    tide_graph *g = ctx ? tide_graph_new(ctx) : NULL;
    CHECK(g != NULL);
    if (!g) return 1;
    int64_t shape[1] = {256};
    int w, x, y;
    CHECK(tide_graph_add_tensor(g, "w", TIDE_F32, TIDE_ROLE_WEIGHT, 1, shape, &w) == TIDE_OK);
    CHECK(tide_graph_add_tensor(g, "x", TIDE_F32, TIDE_ROLE_INPUT, 1, shape, &x) == TIDE_OK);
    CHECK(tide_graph_add_tensor(g, "y", TIDE_F32, TIDE_ROLE_OUTPUT, 1, shape, &y) == TIDE_OK);
    tide_op_args pr = {.flops = 1};
    int in[2] = {w, x};
    CHECK(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 2, in, 1, &y, &pr, -1, NULL) == TIDE_OK);

    tide_status st = plan_and_verify(ctx, g, true);
    if (st) fprintf(stderr, "valid plan rejected: %s\n", tide_ctx_last_error(ctx));
    CHECK(st == TIDE_OK);
    st = plan_and_verify(ctx, g, false);
    CHECK(st == TIDE_E_VERIFY);
    CHECK(strstr(tide_ctx_last_error(ctx), "'w'") != NULL);
    if (st == TIDE_E_VERIFY) printf("planted fault rejected: %s\n", tide_ctx_last_error(ctx));

    tide_graph_free(g);
    tide_ctx_free(ctx);
    return failed;
}
