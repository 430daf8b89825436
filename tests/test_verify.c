/*
 * test_verify.c - the plan verifier (src/verify/verify.c): hand-written plans
 * that must verify, then the same plans with exactly one thing broken, each
 * of which must fail with TIDE_E_VERIFY and a message naming the violation.
 *
 * The reference plan (build_ref) runs a 5-op graph over weights on host and
 * ssd, an input, a state, three temps and an output, for 1 or 2 iterations,
 * in a 5 KiB arena, on all four streams: a temp is spilled device -> host ->
 * ssd -> device, the state is loaded, updated in place and stored home each
 * iteration, slots are reused with the waits each reuse needs. A `fault`
 * argument breaks one thing; F_NONE is the valid plan, tested first. Smaller
 * plans cover stale reads, missing ops, spill areas, a resident state, weight
 * homes and op scratch. Then: every allocation failing in turn, a brute-force
 * race oracle (sharing nothing with the verifier) against single-wait
 * removals, and a 200k-instruction plan for speed.
 *
 * What it proves: the verifier accepts correct plans and rejects each planted
 * fault (overlap, missing wait, stale read, budget overflow, lost dirty
 * state, ...); a recomputation accepted when it reads its first compute's
 * input versions, rejected from a stale input or of a value rewritten since;
 * host computes (a device operand, the wrong stream, a missing wait on the
 * STORE that brought an input to host memory, a device reading host memory in
 * a plan that does not allow it); warm tensors (dropped, ending stale, a
 * stale home read, overlapping, a temp kept warm).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc_test.h"
#include "planner/planner.h"
#include "sim/sim.h"
#include "trace/trace.h"
#include "verify/verify.h"

#define K 1024u /* every tensor here is 256 f32 = 1 KiB */
#define SKIP INT_MIN /* a wait left out (by a fault) */
#define W(...) (const int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#define NOW NULL, 0
#define OFFS(...) (const uint64_t[]){__VA_ARGS__}
#define HOST TIDE_TIER_HOST
#define SSD TIDE_TIER_SSD
#define HOME TIDE_HOME

typedef struct fx {
    tide_ctx *ctx;
    tide_graph *g;
    tide_plan *p;
} fx;

static fx *fx_new(void) {
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->ctx = tide_ctx_new();
    assert_non_null(f->ctx);
    f->g = tide_graph_new(f->ctx);
    assert_non_null(f->g);
    return f;
}

static void fx_free(fx *f) {
    tide_plan_free(f->p);
    tide_graph_free(f->g);
    tide_ctx_free(f->ctx);
    free(f);
}

static int ten(fx *f, const char *name, tide_role role) {
    int64_t shape[1] = {256};
    int id;
    assert_int_equal(tide_graph_add_tensor(f->g, name, TIDE_F32, role, 1, shape, &id), TIDE_OK);
    return id;
}

static int gop(fx *f, const int *in, int n_in, const int *out, int n_out) {
    tide_op_args pr = {.flops = 1000};
    int id;
    assert_int_equal(tide_graph_add_op_args(f->g, TIDE_OP_GENERIC, n_in, in, n_out, out, &pr, -1, &id), TIDE_OK);
    return id;
}

static tide_plan *plan_new(fx *f, int n_iter, uint64_t budget) {
    f->p = tide_plan_alloc(f->ctx, f->g, n_iter);
    assert_non_null(f->p);
    f->p->device_budget = budget;
    return f->p;
}

/* ---- instruction builders; waits equal to SKIP are left out */

static tide_ins ins(tide_ins_kind kind, tide_stream s, int iter) {
    tide_ins in;
    memset(&in, 0, sizeof in);
    in.kind = kind, in.stream = s, in.iter = iter, in.op = -1, in.tensor = -1;
    return in;
}

static int push(tide_plan *p, const tide_ins *in, const int *w, int n) {
    int ws[16], k = 0;
    for (int i = 0; i < n; i++)
        if (w[i] != SKIP) ws[k++] = w[i];
    int r = tide_plan_push(p, in, ws, k);
    assert_true(r >= 0);
    return r;
}

static int load(tide_plan *p, int it, tide_stream s, int t, tide_tier src, uint64_t toff, uint64_t dev,
                const int *w, int n) {
    tide_ins in = ins(TIDE_INS_LOAD, s, it);
    in.tensor = t, in.src = src, in.dst = TIDE_TIER_DEVICE, in.tier_off = toff, in.dev_off[0] = dev;
    return push(p, &in, w, n);
}

static int store(tide_plan *p, int it, tide_stream s, int t, uint64_t dev, tide_tier dst, uint64_t toff,
                 const int *w, int n) {
    tide_ins in = ins(TIDE_INS_STORE, s, it);
    in.tensor = t, in.src = TIDE_TIER_DEVICE, in.dst = dst, in.tier_off = toff, in.dev_off[0] = dev;
    return push(p, &in, w, n);
}

static int move(tide_plan *p, int it, int t, tide_tier src, uint64_t soff, tide_tier dst, uint64_t toff,
                const int *w, int n) {
    tide_ins in = ins(TIDE_INS_MOVE, TIDE_STREAM_IO, it);
    in.tensor = t, in.src = src, in.dst = dst, in.src_off = soff, in.tier_off = toff;
    return push(p, &in, w, n);
}

static int drop_dev(tide_plan *p, int it, tide_stream s, int t, uint64_t dev, const int *w, int n) {
    tide_ins in = ins(TIDE_INS_DROP, s, it);
    in.tensor = t, in.src = TIDE_TIER_DEVICE, in.dev_off[0] = dev;
    return push(p, &in, w, n);
}

static int drop_tier(tide_plan *p, int it, tide_stream s, int t, tide_tier tier, uint64_t toff,
                     const int *w, int n) {
    tide_ins in = ins(TIDE_INS_DROP, s, it);
    in.tensor = t, in.src = tier, in.tier_off = toff;
    return push(p, &in, w, n);
}

/* offs: the op's inputs then outputs. */
static int compute(tide_plan *p, int it, int op, const uint64_t *offs, const int *w, int n) {
    tide_ins in = ins(TIDE_INS_COMPUTE, TIDE_STREAM_COMPUTE, it);
    in.op = op;
    const tide_op *o = &p->g->ops[op];
    for (int i = 0; i < o->n_in + o->n_out; i++) in.dev_off[i] = offs[i];
    return push(p, &in, w, n);
}

/* ---- expectations */

static void expect_ok(fx *f) {
    tide_status st = tide_plan_verify(f->p);
    if (st != TIDE_OK) fail_msg("verify: %s: %s", tide_status_str(st), tide_ctx_last_error(f->ctx));
}

/* Fails with TIDE_E_VERIFY and a message holding every given substring. */
static void expect_fail(fx *f, const char *a, const char *b) {
    tide_status st = tide_plan_verify(f->p);
    const char *m = tide_ctx_last_error(f->ctx);
    if (st != TIDE_E_VERIFY) fail_msg("expected a verification failure, got '%s' (%s)", tide_status_str(st), m);
    if (!strstr(m, a)) fail_msg("message lacks '%s': %s", a, m);
    if (b && !strstr(m, b)) fail_msg("message lacks '%s': %s", b, m);
    print_message("    %s\n", m);
}

/* ---------------------------------------------------------------- reference plan */

enum fault {
    F_NONE,
    F_OVERLAP,        /* c written over the live state copy */
    F_WAR,            /* a DROP misses its wait on a reader; the next LOAD into the range races it */
    F_WAIT_DROP,      /* a LOAD into a freed range does not wait on the drop */
    F_RAW,            /* a COMPUTE does not wait on the LOAD of one input */
    F_STALE,          /* the state is updated out of place; the old copy is then stored */
    F_STALE_LOAD,     /* iteration 0 never stores the state; iteration 1 loads the old version */
    F_BUDGET,         /* an output placed past the end of the arena */
    F_LOST_STATE,     /* iteration 1 drops the updated state without storing it */
    F_OUTPUT_LOST,    /* the output is never stored */
    F_OP_ORDER,       /* op 4 computed in op 3's place */
    F_LATER_WAIT,     /* a wait on a later instruction */
    F_SPILL_NEVER,    /* the MOVE host -> ssd is missing; the temp is loaded from ssd anyway */
    F_NOT_DROPPED,    /* a temp is never dropped in the last iteration */
};

typedef struct ref_ids {
    int w0, w1, w2, x, s, a, b, c, y;
} ref_ids;

static void build_ref_graph(fx *f, ref_ids *r) {
    r->w0 = ten(f, "w0", TIDE_ROLE_WEIGHT);
    r->w1 = ten(f, "w1", TIDE_ROLE_WEIGHT);
    r->w2 = ten(f, "w2", TIDE_ROLE_WEIGHT);
    r->x = ten(f, "x", TIDE_ROLE_INPUT);
    r->s = ten(f, "s", TIDE_ROLE_STATE);
    r->a = ten(f, "a", TIDE_ROLE_TEMP);
    r->b = ten(f, "b", TIDE_ROLE_TEMP);
    r->c = ten(f, "c", TIDE_ROLE_TEMP);
    r->y = ten(f, "y", TIDE_ROLE_OUTPUT);
    gop(f, W(r->x, r->w0), W(r->a));        /* op0 a = f(x, w0) */
    gop(f, W(r->a, r->w1), W(r->b));        /* op1 b = f(a, w1) */
    gop(f, W(r->s, r->b), W(r->s));         /* op2 s = f(s, b), in place */
    gop(f, W(r->b, r->w2, r->a), W(r->c));  /* op3 c = f(b, w2, a) */
    gop(f, W(r->c, r->s), W(r->y));         /* op4 y = f(c, s) */
}

/* Arena slots 0..4 of 1 KiB. Comments name what a wait orders. */
static void build_ref(fx *f, int n_iter, enum fault fault) {
    ref_ids r;
    build_ref_graph(f, &r);
    tide_plan *p = plan_new(f, n_iter, 5 * K);
    p->home[r.w2] = SSD;
    p->host_spill_bytes = K;
    p->ssd_spill_bytes = K;
    const tide_stream C = TIDE_STREAM_COMPUTE, H2D = TIDE_STREAM_H2D, D2H = TIDE_STREAM_D2H, IO = TIDE_STREAM_IO;
    int pDy = SKIP, pDb = SKIP, pDha = SKIP, pDa3 = SKIP;
    for (int it = 0; it < n_iter; it++) {
        bool last = it == n_iter - 1;
        int Lx = load(p, it, H2D, r.x, HOST, HOME, 0, W(pDy));       /* slot 0 held y */
        int Lw0 = load(p, it, H2D, r.w0, HOST, HOME, K, W(pDb));     /* slot 1 held b */
        int C0;
        if (fault == F_LATER_WAIT && it == 0)
            C0 = compute(p, it, 0, OFFS(0, K, 2 * K), W(Lx, Lw0, Lw0 + 2));
        else
            C0 = compute(p, it, 0, OFFS(0, K, 2 * K), W(Lx, fault == F_RAW ? SKIP : Lw0));
        int Dx = drop_dev(p, it, C, r.x, 0, NOW);
        drop_dev(p, it, C, r.w0, K, NOW);
        int Lw1 = load(p, it, H2D, r.w1, HOST, HOME, 0, W(fault == F_WAIT_DROP ? SKIP : Dx));
        int Sa = store(p, it, D2H, r.a, 2 * K, HOST, 0, W(C0, pDha)); /* host spill 0 held a */
        int C1 = compute(p, it, 1, OFFS(2 * K, 0, K), W(Lw1));
        int Da = drop_dev(p, it, D2H, r.a, 2 * K, W(fault == F_WAR ? SKIP : C1));
        int Ma = SKIP;
        if (!(fault == F_SPILL_NEVER && it == 0)) Ma = move(p, it, r.a, HOST, 0, SSD, 0, W(Sa));
        pDha = drop_tier(p, it, IO, r.a, HOST, 0, NOW);
        int Dw1 = drop_dev(p, it, C, r.w1, 0, NOW);
        int Ls = load(p, it, H2D, r.s, HOST, HOME, 2 * K, W(Da));    /* slot 2 held a */
        int C2 = compute(p, it, 2, OFFS(2 * K, K, fault == F_STALE ? 3 * K : 2 * K), W(Ls));
        int Ss = SKIP;
        if (!(fault == F_LOST_STATE && last) && !(fault == F_STALE_LOAD && it == 0))
            Ss = store(p, it, D2H, r.s, 2 * K, HOST, HOME, W(C2));
        int Lw2 = load(p, it, IO, r.w2, SSD, HOME, 0, W(Dw1));       /* slot 0 held w1 */
        int La = load(p, it, IO, r.a, SSD, 0, 3 * K, W(pDa3, Ma));   /* slot 3 held a */
        uint64_t c_at = fault == F_OVERLAP ? 2 * K : fault == F_BUDGET ? 4 * K + 512 : 4 * K;
        if (fault == F_OP_ORDER && it == 0)
            compute(p, it, 4, OFFS(K, 0, c_at), W(Lw2, La));
        else
            compute(p, it, 3, OFFS(K, 0, 3 * K, c_at), W(Lw2, La));
        pDb = drop_dev(p, it, C, r.b, K, NOW);
        drop_dev(p, it, C, r.w2, 0, NOW);
        pDa3 = drop_dev(p, it, C, r.a, 3 * K, NOW);
        drop_tier(p, it, IO, r.a, SSD, 0, NOW);
        int C4 = compute(p, it, 4, OFFS(4 * K, 2 * K, 0), NOW);       /* slot 0 held w2 */
        if (fault != F_OUTPUT_LOST) store(p, it, D2H, r.y, 0, HOST, HOME, W(C4));
        pDy = drop_dev(p, it, D2H, r.y, 0, W(C4));
        if (!(fault == F_NOT_DROPPED && last)) drop_dev(p, it, C, r.c, 4 * K, NOW);
        drop_dev(p, it, C, r.s, 2 * K, W(Ss));
    }
}

static void test_ref_ok_one_iteration(void **state) {
    fx *f = fx_new();
    build_ref(f, 1, F_NONE);
    expect_ok(f);
    fx_free(f);
}

static void test_ref_ok_two_iterations(void **state) {
    fx *f = fx_new();
    build_ref(f, 2, F_NONE);
    expect_ok(f);
    /* verifying does not change the plan: a second run agrees */
    expect_ok(f);
    fx_free(f);
}

static void run_fault(enum fault fault, const char *a, const char *b) {
    fx *f = fx_new();
    build_ref(f, 2, fault);
    expect_fail(f, a, b);
    fx_free(f);
}

static void test_overlapping_live_ranges(void **state) {
    run_fault(F_OVERLAP, "live ranges overlap", "while 's' still lives at device [2048, 3072)");
}

static void test_war_missing_event(void **state) {
    /* LOAD s into slot 2 after the DROP of a; the DROP did not wait for the
     * reader of a on the compute stream, so the LOAD may overwrite a under it */
    run_fault(F_WAR, "write-after-read", "(compute generic op 1 'b', stream compute");
}

static void test_reuse_without_waiting_on_drop(void **state) {
    run_fault(F_WAIT_DROP, "missing wait on the drop", "held 'x' before instruction 3 (drop 'x'");
}

static void test_raw_missing_event(void **state) {
    run_fault(F_RAW, "read-after-write", "reads 'w0' from device offset 1024, written by instruction 1 (load 'w0'");
}

static void test_stale_store(void **state) {
    run_fault(F_STALE, "holds version 0, current is 1 (stale read)", "stores 's' from device offset 2048");
}

static void test_stale_load(void **state) {
    run_fault(F_STALE_LOAD, "loads 's' from host home that holds version 0, current is 1 (stale read)", "iter 1");
}

static void test_budget_overflow(void **state) {
    run_fault(F_BUDGET, "budget overflow", "writes 'c' at device [4608, 5632), past the device budget of 5120");
}

static void test_lost_dirty_state(void **state) {
    run_fault(F_LOST_STATE, "lost dirty state", "state 's' ends with version 1 at its host home, but its latest version 2");
}

static void test_output_never_stored(void **state) {
    run_fault(F_OUTPUT_LOST, "output never stored", "output 'y'");
}

static void test_op_out_of_order(void **state) {
    run_fault(F_OP_ORDER, "op missing or out of order", "computes op 4 of iteration 0, but op 3 ('c') of iteration 0 comes next");
}

static void test_wait_on_later_instruction(void **state) {
    run_fault(F_LATER_WAIT, "waits on instruction 3, which is not earlier", "instruction 2 (compute generic op 0 'a'");
}

static void test_load_from_spill_never_stored(void **state) {
    run_fault(F_SPILL_NEVER, "loads 'a' from ssd spill offset 0 where no copy of it is live", "never stored there");
}

static void test_device_copy_never_dropped(void **state) {
    run_fault(F_NOT_DROPPED, "missing DROP", "'c' still lives at device offset 4096");
}

/* Faults made by editing one field of the valid plan after it is built. */
static void test_field_faults(void **state) {
    static const struct {
        int ins;
        int field; /* 0 stream, 1 dst, 2 tensor of a COMPUTE, 3 op of a LOAD, 4 iter, 5 tier_off home drop */
        int value;
        const char *msg;
    } cases[] = {
        {2, 0, TIDE_STREAM_H2D, "computes off the compute stream"},
        {0, 1, TIDE_TIER_HOST, "a LOAD goes host|ssd -> device"},
        {0, 0, TIDE_STREAM_D2H, "a LOAD runs on h2d or io"},
        {2, 2, 3, "a COMPUTE's tensor must be -1"},
        {0, 3, 0, "only a COMPUTE names an op"},
        {0, 4, 2, "names iteration 2 of a plan of 2"},
        {10, 5, 0, "a plan never drops a home"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        fx *f = fx_new();
        build_ref(f, 2, F_NONE);
        tide_ins *in = &f->p->ins[cases[k].ins];
        switch (cases[k].field) {
        case 0: in->stream = (tide_stream)cases[k].value; break;
        case 1: in->dst = (tide_tier)cases[k].value; break;
        case 2: in->tensor = cases[k].value; break;
        case 3: in->op = cases[k].value; break;
        case 4: in->iter = cases[k].value; break;
        case 5:
            assert_int_equal(in->kind, TIDE_INS_DROP);
            assert_int_equal(in->src, TIDE_TIER_HOST);
            in->tier_off = HOME;
            break;
        }
        expect_fail(f, cases[k].msg, NULL);
        fx_free(f);
    }
}

static void test_bad_home(void **state) {
    fx *f = fx_new();
    build_ref(f, 1, F_NONE);
    f->p->home[tide_graph_find(f->g, "x")] = SSD;
    expect_fail(f, "gives input 'x' home tier 2 (ssd)", NULL);
    fx_free(f);
}

/* Every allocation the verifier makes may fail: it must then say so, never
 * crash, and never report a violation that is not there. */
static void test_out_of_memory(void **state) {
    fx *f = fx_new();
    build_ref(f, 2, F_NONE);
    int failures = 0;
    for (long n = 1; n < 200; n++) {
        tide_alloc_fail_nth(n);
        tide_status st = tide_plan_verify(f->p);
        tide_alloc_fail_nth(0);
        if (st == TIDE_OK) break;
        assert_int_equal(st, TIDE_E_NOMEM);
        assert_non_null(strstr(tide_ctx_last_error(f->ctx), "out of memory"));
        failures++;
    }
    assert_true(failures > 0);
    expect_ok(f);
    fx_free(f);
}

/* ---------------------------------------------------------------- small plans */

/* t = f(x); t = f(t) written to a new range; y = f(t). fault 1: op 2 reads
 * the old range, still live, holding the previous version; fault 2: the new
 * range is dropped before op 2 reads it. */
static void build_stale(fx *f, int fault) {
    int x = ten(f, "x", TIDE_ROLE_INPUT), t = ten(f, "t", TIDE_ROLE_TEMP), y = ten(f, "y", TIDE_ROLE_OUTPUT);
    gop(f, W(x), W(t));
    gop(f, W(t), W(t));
    gop(f, W(t), W(y));
    tide_plan *p = plan_new(f, 1, 4 * K);
    const tide_stream C = TIDE_STREAM_COMPUTE;
    int Lx = load(p, 0, TIDE_STREAM_H2D, x, HOST, HOME, 0, NOW);
    compute(p, 0, 0, OFFS(0, K), W(Lx));
    drop_dev(p, 0, C, x, 0, NOW);
    compute(p, 0, 1, OFFS(K, 2 * K), NOW);
    if (fault == 2) drop_dev(p, 0, C, t, 2 * K, NOW);
    int C2 = compute(p, 0, 2, OFFS(fault == 1 ? K : 2 * K, 3 * K), NOW);
    drop_dev(p, 0, C, t, K, NOW);
    if (fault != 2) drop_dev(p, 0, C, t, 2 * K, NOW);
    store(p, 0, TIDE_STREAM_D2H, y, 3 * K, HOST, HOME, W(C2));
    drop_dev(p, 0, TIDE_STREAM_D2H, y, 3 * K, NOW);
}

static void test_stale_compute_read(void **state) {
    fx *f = fx_new();
    build_stale(f, 0);
    expect_ok(f);
    fx_free(f);
    f = fx_new();
    build_stale(f, 1);
    expect_fail(f, "(compute generic op 2 'y', stream compute) reads 't' from device offset 1024 that holds version 1, current is 2 (stale read)", NULL);
    fx_free(f);
    f = fx_new();
    build_stale(f, 2);
    expect_fail(f, "reads 't' from device offset 2048 where no copy of it is live",
                "its current version was lost when instruction 4 (drop 't' device offset 2048");
    fx_free(f);
}

/* y0 = f(x); y1 = f(x). fault: op 1 is never computed (nor stored). */
static void test_op_missing(void **state) {
    for (int fault = 0; fault < 2; fault++) {
        fx *f = fx_new();
        int x = ten(f, "x", TIDE_ROLE_INPUT), y0 = ten(f, "y0", TIDE_ROLE_OUTPUT), y1 = ten(f, "y1", TIDE_ROLE_OUTPUT);
        gop(f, W(x), W(y0));
        gop(f, W(x), W(y1));
        tide_plan *p = plan_new(f, 1, 3 * K);
        int Lx = load(p, 0, TIDE_STREAM_H2D, x, HOST, HOME, 0, NOW);
        int C0 = compute(p, 0, 0, OFFS(0, K), W(Lx));
        store(p, 0, TIDE_STREAM_D2H, y0, K, HOST, HOME, W(C0));
        drop_dev(p, 0, TIDE_STREAM_D2H, y0, K, NOW);
        if (!fault) {
            int C1 = compute(p, 0, 1, OFFS(0, 2 * K), NOW);
            store(p, 0, TIDE_STREAM_D2H, y1, 2 * K, HOST, HOME, W(C1));
            drop_dev(p, 0, TIDE_STREAM_D2H, y1, 2 * K, NOW);
        }
        drop_dev(p, 0, TIDE_STREAM_COMPUTE, x, 0, NOW);
        if (fault)
            expect_fail(f, "op 1 ('y1') of iteration 0 is never computed (op missing)", "at the end of the plan");
        else
            expect_ok(f);
        fx_free(f);
    }
}

/* y = f(x, t) where nothing writes the temp t before. */
static void test_read_of_temp_never_written(void **state) {
    fx *f = fx_new();
    int x = ten(f, "x", TIDE_ROLE_INPUT), t = ten(f, "t", TIDE_ROLE_TEMP), y = ten(f, "y", TIDE_ROLE_OUTPUT);
    gop(f, W(x, t), W(y));
    tide_plan *p = plan_new(f, 1, 3 * K);
    int Lx = load(p, 0, TIDE_STREAM_H2D, x, HOST, HOME, 0, NOW);
    compute(p, 0, 0, OFFS(0, K, 2 * K), W(Lx));
    expect_fail(f, "reads 't', a temp tensor no instruction has written yet (read of a temp never written)", NULL);
    fx_free(f);
}

/* a = f(x); b = f(x); y = f(a, b), a and b spilled to host and reloaded.
 * fault: b's spill overlaps a's, still live. */
static void build_spills(fx *f, bool fault) {
    int x = ten(f, "x", TIDE_ROLE_INPUT), a = ten(f, "a", TIDE_ROLE_TEMP), b = ten(f, "b", TIDE_ROLE_TEMP);
    int y = ten(f, "y", TIDE_ROLE_OUTPUT);
    gop(f, W(x), W(a));
    gop(f, W(x), W(b));
    gop(f, W(a, b), W(y));
    tide_plan *p = plan_new(f, 1, 3 * K);
    p->host_spill_bytes = 2 * K;
    const tide_stream C = TIDE_STREAM_COMPUTE, D2H = TIDE_STREAM_D2H, H2D = TIDE_STREAM_H2D;
    int Lx = load(p, 0, H2D, x, HOST, HOME, 0, NOW);
    int C0 = compute(p, 0, 0, OFFS(0, K), W(Lx));
    int Sa = store(p, 0, D2H, a, K, HOST, 0, W(C0));
    drop_dev(p, 0, C, a, K, W(Sa));
    int C1 = compute(p, 0, 1, OFFS(0, K), NOW);
    int Sb = store(p, 0, D2H, b, K, HOST, fault ? K / 2 : K, W(C1));
    drop_dev(p, 0, C, b, K, W(Sb));
    int Dx = drop_dev(p, 0, C, x, 0, NOW);
    int La = load(p, 0, H2D, a, HOST, 0, 0, W(Dx, Sa));
    int Lb = load(p, 0, H2D, b, HOST, fault ? K / 2 : K, 2 * K, W(Sb));
    int C2 = compute(p, 0, 2, OFFS(0, 2 * K, K), W(La, Lb));
    store(p, 0, D2H, y, K, HOST, HOME, W(C2));
    drop_dev(p, 0, D2H, y, K, NOW);
    drop_dev(p, 0, C, a, 0, NOW);
    drop_dev(p, 0, C, b, 2 * K, NOW);
    drop_tier(p, 0, H2D, a, HOST, 0, NOW);
    drop_tier(p, 0, H2D, b, HOST, fault ? K / 2 : K, NOW);
}

static void test_spill_areas(void **state) {
    fx *f = fx_new();
    build_spills(f, false);
    expect_ok(f);
    fx_free(f);
    f = fx_new();
    build_spills(f, true);
    expect_fail(f, "writes host spill bytes [512, 1536) while 'a' still lives at host spill [0, 1024)",
                "live ranges overlap");
    fx_free(f);
}

/* A resident state updated in place for two iterations: s = f(s, x); y = f(s).
 * faults: 1 the second update does not wait for the first STORE home still
 * reading s (WAR on the device copy); 2 s is not marked resident; 3 a second
 * STORE home on another stream races the first (WAW on the home). */
static void build_resident(fx *f, int fault) {
    int x = ten(f, "x", TIDE_ROLE_INPUT), s = ten(f, "s", TIDE_ROLE_STATE), y = ten(f, "y", TIDE_ROLE_OUTPUT);
    gop(f, W(s, x), W(s));
    gop(f, W(s), W(y));
    tide_plan *p = plan_new(f, 2, 3 * K);
    p->resident[s] = fault != 2;
    int Ls = load(p, 0, TIDE_STREAM_H2D, s, HOST, HOME, 0, NOW);
    int Lx = load(p, 0, TIDE_STREAM_H2D, x, HOST, HOME, K, NOW);
    int pSs = SKIP, pDy = SKIP;
    (void)Ls;
    for (int it = 0; it < 2; it++) {
        int C0 = compute(p, it, 0, OFFS(0, K, 0), W(it ? SKIP : Lx, fault == 1 ? SKIP : pSs));
        pSs = store(p, it, TIDE_STREAM_D2H, s, 0, HOST, HOME, W(C0));
        if (fault == 3 && it == 0) /* a second STORE home, on io, racing the first */
            store(p, it, TIDE_STREAM_IO, s, 0, HOST, HOME, W(C0));
        int C1 = compute(p, it, 1, OFFS(0, 2 * K), W(pDy));
        store(p, it, TIDE_STREAM_D2H, y, 2 * K, HOST, HOME, W(C1));
        pDy = drop_dev(p, it, TIDE_STREAM_D2H, y, 2 * K, NOW);
    }
    drop_dev(p, 1, TIDE_STREAM_COMPUTE, x, K, NOW);
}

static void test_resident_state(void **state) {
    fx *f = fx_new();
    build_resident(f, 0);
    expect_ok(f);
    fx_free(f);
    f = fx_new();
    build_resident(f, 1);
    expect_fail(f, "overwrites 's' at device offset 0 while instruction 3 (store 's' device offset 0 -> host home",
                "(missing wait: write-after-read)");
    fx_free(f);
    f = fx_new();
    build_resident(f, 2);
    expect_fail(f, "'s' still lives at device offset 0", "only resident tensors stay on the device");
    fx_free(f);
    f = fx_new();
    build_resident(f, 3);
    expect_fail(f, "overwrites 's' at host home while instruction 3 (store 's' device offset 0 -> host home, stream d2h",
                "may still write it (missing wait: write-after-write)");
    fx_free(f);
}

/* y = f(x, w) with op scratch. faults: 1 a STORE to the weight's home; 2 the
 * scratch overlaps the live input x; 3 w is loaded from ssd though its home
 * is host. */
static void build_weight(fx *f, int fault) {
    int w = ten(f, "w", TIDE_ROLE_WEIGHT), x = ten(f, "x", TIDE_ROLE_INPUT), y = ten(f, "y", TIDE_ROLE_OUTPUT);
    int op = gop(f, W(x, w), W(y));
    f->g->ops[op].scratch_bytes = 512;
    tide_plan *p = plan_new(f, 1, 4 * K);
    int Lw = load(p, 0, TIDE_STREAM_H2D, w, fault == 3 ? SSD : HOST, HOME, 0, NOW);
    int Lx = load(p, 0, TIDE_STREAM_H2D, x, HOST, HOME, K, NOW);
    tide_ins in = ins(TIDE_INS_COMPUTE, TIDE_STREAM_COMPUTE, 0);
    in.op = op;
    in.dev_off[0] = K, in.dev_off[1] = 0, in.dev_off[2] = 2 * K;
    in.scratch_off = fault == 2 ? K + 256 : 3 * K;
    int C = push(p, &in, W(Lw, Lx));
    if (fault == 1) store(p, 0, TIDE_STREAM_D2H, w, 0, HOST, HOME, W(C));
    store(p, 0, TIDE_STREAM_D2H, y, 2 * K, HOST, HOME, W(C));
    drop_dev(p, 0, TIDE_STREAM_D2H, y, 2 * K, NOW);
    drop_dev(p, 0, TIDE_STREAM_COMPUTE, w, 0, NOW);
    drop_dev(p, 0, TIDE_STREAM_COMPUTE, x, K, NOW);
}

static void test_weights_and_scratch(void **state) {
    fx *f = fx_new();
    build_weight(f, 0);
    expect_ok(f);
    fx_free(f);
    f = fx_new();
    build_weight(f, 1);
    expect_fail(f, "writes the home of weight 'w'", "read-only");
    fx_free(f);
    f = fx_new();
    build_weight(f, 2);
    expect_fail(f, "writes device bytes [1280, 1792) while 'x' still lives at device [1024, 2048)", NULL);
    fx_free(f);
    f = fx_new();
    build_weight(f, 3);
    expect_fail(f, "loads 'w' from ssd home, but its home is host", NULL);
    fx_free(f);
}

/* ---------------------------------------------------------------- soundness */

/* A brute-force race oracle sharing nothing with the verifier: the full
 * happens-before closure as bitsets, then every pair of instructions touching
 * overlapping bytes of one space (arena, a spill area, a home), one of them
 * writing, must be ordered. O(n^2): small plans only. */
typedef struct rx { int space; uint64_t lo, hi; bool w; } rx;

static void rx_tier(const tide_plan *p, rx *a, int *n, tide_tier tier, uint64_t off, int t, bool w) {
    if (off == HOME) a[(*n)++] = (rx){3 + 2 * t + (tier == SSD), 0, 1, w};
    else a[(*n)++] = (rx){(int)tier, off, off + p->g->tensors[t].nbytes, w};
}

static int rx_accesses(const tide_plan *p, int i, rx *a) {
    const tide_ins *in = &p->ins[i];
    const tide_graph *g = p->g;
    int n = 0, t = in->tensor;
    switch (in->kind) {
    case TIDE_INS_COMPUTE: {
        const tide_op *op = &g->ops[in->op];
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            int tk = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            a[n++] = (rx){0, in->dev_off[k], in->dev_off[k] + g->tensors[tk].nbytes, k >= op->n_in};
        }
        if (op->scratch_bytes) a[n++] = (rx){0, in->scratch_off, in->scratch_off + op->scratch_bytes, true};
        break;
    }
    case TIDE_INS_LOAD:
        rx_tier(p, a, &n, in->src, in->tier_off, t, false);
        a[n++] = (rx){0, in->dev_off[0], in->dev_off[0] + g->tensors[t].nbytes, true};
        break;
    case TIDE_INS_STORE:
        a[n++] = (rx){0, in->dev_off[0], in->dev_off[0] + g->tensors[t].nbytes, false};
        rx_tier(p, a, &n, in->dst, in->tier_off, t, true);
        break;
    case TIDE_INS_MOVE:
        rx_tier(p, a, &n, in->src, in->src_off, t, false);
        rx_tier(p, a, &n, in->dst, in->tier_off, t, true);
        break;
    default:
        break;
    }
    return n;
}

static bool has_race(const tide_plan *p) {
    int n = p->n_ins, words = (n + 63) / 64, last[TIDE_STREAM_COUNT] = {-1, -1, -1, -1};
    uint64_t *before = calloc((size_t)n * (size_t)words, sizeof *before);
    rx(*acc)[16] = malloc((size_t)n * sizeof *acc);
    int *na = malloc((size_t)n * sizeof *na);
    assert_true(before && acc && na);
    for (int i = 0; i < n; i++) {
        const tide_ins *in = &p->ins[i];
        uint64_t *b = before + (size_t)i * words;
        for (int k = -1; k < in->n_wait; k++) {
            int q = k < 0 ? last[in->stream] : p->waits[in->wait_at + k];
            if (q < 0 || q >= i) continue;
            for (int w = 0; w < words; w++) b[w] |= before[(size_t)q * words + w];
            b[q / 64] |= UINT64_C(1) << (q % 64);
        }
        last[in->stream] = i;
        na[i] = rx_accesses(p, i, acc[i]);
    }
    bool race = false;
    for (int j = 0; j < n && !race; j++)
        for (int i = 0; i < j && !race; i++) {
            if (before[(size_t)j * words + i / 64] >> (i % 64) & 1) continue;
            for (int x = 0; x < na[i]; x++)
                for (int y = 0; y < na[j]; y++) {
                    rx a = acc[i][x], b = acc[j][y];
                    race = race || (a.space == b.space && (a.w || b.w) && a.lo < b.hi && b.lo < a.hi);
                }
        }
    free(before);
    free(acc);
    free(na);
    return race;
}

/* Each wait of the valid reference plan, in turn, pointed at instruction 0
 * (a harmless wait): whenever the oracle then sees a race, the verifier must
 * reject the plan. */
static void test_no_race_is_accepted(void **state) {
    fx *f = fx_new();
    build_ref(f, 2, F_NONE);
    tide_plan *p = f->p;
    assert_false(has_race(p));
    int racy = 0;
    for (int w = 0; w < p->n_waits; w++) {
        int saved = p->waits[w];
        p->waits[w] = 0;
        if (has_race(p)) {
            racy++;
            if (tide_plan_verify(p) != TIDE_E_VERIFY)
                fail_msg("wait %d -> 0 makes a race the verifier accepts", w);
        }
        p->waits[w] = saved;
    }
    print_message("    %d of %d single-wait removals race; all rejected\n", racy, p->n_waits);
    assert_true(racy > 0);
    expect_ok(f);
    fx_free(f);
}

/* ---------------------------------------------------------------- scale */

/* A chain x_{k+1} = f(x_k, w_k) of n ops: weights double-buffered in slots 0
 * and 1 on h2d, activations alternating in slots 2 and 3, every 8th
 * activation also spilled to host and the spill dropped. About 5 instructions
 * per op. */
static void build_chain(fx *f, int n) {
    char name[32];
    int *w = malloc((size_t)n * sizeof *w), *xs = malloc((size_t)(n + 1) * sizeof *xs);
    assert_non_null(w);
    assert_non_null(xs);
    xs[0] = ten(f, "x0", TIDE_ROLE_INPUT);
    for (int k = 0; k < n; k++) {
        snprintf(name, sizeof name, "w%d", k);
        w[k] = ten(f, name, TIDE_ROLE_WEIGHT);
        snprintf(name, sizeof name, "x%d", k + 1);
        xs[k + 1] = ten(f, name, k + 1 == n ? TIDE_ROLE_OUTPUT : TIDE_ROLE_TEMP);
        gop(f, W(xs[k], w[k]), W(xs[k + 1]));
    }
    tide_plan *p = plan_new(f, 1, 4 * K);
    p->host_spill_bytes = K;
    const tide_stream C = TIDE_STREAM_COMPUTE;
    int Lx = load(p, 0, TIDE_STREAM_H2D, xs[0], HOST, HOME, 2 * K, NOW);
    int dropw[2] = {SKIP, SKIP}, loads[2];
    int pDh = SKIP, spilled = -1, S_spill = SKIP; /* xs[spilled] is being stored by S_spill */
    loads[0] = load(p, 0, TIDE_STREAM_H2D, w[0], HOST, HOME, 0, NOW);
    for (int k = 0; k < n; k++) {
        if (k + 1 < n) /* prefetch the next weight into the other slot */
            loads[(k + 1) & 1] = load(p, 0, TIDE_STREAM_H2D, w[k + 1], HOST, HOME, (uint64_t)((k + 1) & 1) * K,
                                      W(dropw[(k + 1) & 1]));
        uint64_t in_at = 2 * K + (uint64_t)(k & 1) * K, out_at = 2 * K + (uint64_t)((k + 1) & 1) * K;
        int Ck = compute(p, 0, k, OFFS(in_at, (uint64_t)(k & 1) * K, out_at), W(loads[k & 1], k ? SKIP : Lx));
        dropw[k & 1] = drop_dev(p, 0, C, w[k], (uint64_t)(k & 1) * K, NOW);
        drop_dev(p, 0, C, xs[k], in_at, W(spilled == k ? S_spill : SKIP));
        if (k % 8 == 0 && k + 1 < n) {
            S_spill = store(p, 0, TIDE_STREAM_D2H, xs[k + 1], out_at, HOST, 0, W(Ck, pDh));
            spilled = k + 1;
            pDh = drop_tier(p, 0, TIDE_STREAM_D2H, xs[k + 1], HOST, 0, W(S_spill));
        }
    }
    int S = store(p, 0, TIDE_STREAM_D2H, xs[n], 2 * K + (uint64_t)(n & 1) * K, HOST, HOME, W(p->n_ins - 1));
    drop_dev(p, 0, TIDE_STREAM_D2H, xs[n], 2 * K + (uint64_t)(n & 1) * K, W(S));
    free(w);
    free(xs);
}

static void test_large_plan_is_fast(void **state) {
    fx *f = fx_new();
    int n = 50000;
    build_chain(f, n);
    double t0 = tide_now();
    expect_ok(f);
    double dt = tide_now() - t0;
    print_message("    %d instructions verified in %.3f s\n", f->p->n_ins, dt);
    assert_true(dt < 5.0);
    /* a fault near the end is still found: the last weight's LOAD no longer
     * waits for the drop of the weight two ops back that held its slot */
    for (int i = f->p->n_ins - 1; i >= 0; i--) {
        tide_ins *in = &f->p->ins[i];
        if (in->kind == TIDE_INS_LOAD && in->n_wait == 1) {
            in->n_wait = 0;
            break;
        }
    }
    expect_fail(f, "missing wait on the drop", NULL);
    fx_free(f);
}

/* ---------------------------------------------------------------- recomputation */

/* a = f(s); b = g(a); y = h(b, a), where a is dropped after op 1 and
 * recomputed (op 0 again) into another range before op 2: accepted. fault 1:
 * op 1 also updates the state s in place, so recomputing a from s reads a
 * newer s than the first compute did (a recomputation from a stale input). */
static void build_recompute(fx *f, int fault) {
    int s = ten(f, "s", TIDE_ROLE_STATE), a = ten(f, "a", TIDE_ROLE_TEMP), b = ten(f, "b", TIDE_ROLE_TEMP);
    int y = ten(f, "y", TIDE_ROLE_OUTPUT);
    gop(f, W(s), W(a));          /* op0 a = f(s) */
    if (fault == 1)
        gop(f, W(a, s), W(b, s));  /* op1 b = g(a), and s updated in place */
    else
        gop(f, W(a), W(b));        /* op1 b = g(a) */
    gop(f, W(b, a), W(y));       /* op2 y = h(b, a) */
    tide_plan *p = plan_new(f, 1, 4 * K);
    int Ls = load(p, 0, TIDE_STREAM_H2D, s, HOST, HOME, 0, NOW);
    int C0 = compute(p, 0, 0, OFFS(0, K), W(Ls));
    int C1 = fault == 1 ? compute(p, 0, 1, OFFS(K, 0, 2 * K, 0), (const int[]){C0}, 1)
                        : compute(p, 0, 1, OFFS(K, 2 * K), (const int[]){C0}, 1);
    int Da = drop_dev(p, 0, TIDE_STREAM_COMPUTE, a, K, NOW); /* a leaves the device... */
    int R0 = compute(p, 0, 0, OFFS(0, 3 * K), W(Da));         /* ...and is recomputed at 3K */
    int C2 = compute(p, 0, 2, OFFS(2 * K, 3 * K, K), W(R0, C1));
    int Sy = store(p, 0, TIDE_STREAM_D2H, y, K, HOST, HOME, W(C2));
    drop_dev(p, 0, TIDE_STREAM_D2H, y, K, NOW);
    drop_dev(p, 0, TIDE_STREAM_COMPUTE, a, 3 * K, NOW);
    drop_dev(p, 0, TIDE_STREAM_COMPUTE, b, 2 * K, NOW);
    if (fault == 1) store(p, 0, TIDE_STREAM_D2H, s, 0, HOST, HOME, W(C1, Sy));
    drop_dev(p, 0, fault == 1 ? TIDE_STREAM_D2H : TIDE_STREAM_COMPUTE, s, 0, NOW);
}

static void test_recompute(void **state) {
    fx *f = fx_new();
    build_recompute(f, 0);
    expect_ok(f);
    fx_free(f);
    f = fx_new();
    build_recompute(f, 1);
    expect_fail(f, "recomputes op 0, but its input 's' is at version 1, not version 0 that its first compute read",
                "(recomputation from a stale input)");
    fx_free(f);
}

/* A recomputation of an op whose output was rewritten since: a = f(x);
 * a = g(a) in place; then op 0 again would bring back the old a. */
static void test_recompute_stale_output(void **state) {
    fx *f = fx_new();
    int x = ten(f, "x", TIDE_ROLE_INPUT), a = ten(f, "a", TIDE_ROLE_TEMP), y = ten(f, "y", TIDE_ROLE_OUTPUT);
    gop(f, W(x), W(a));    /* op0 a = f(x) */
    gop(f, W(a), W(a));    /* op1 a = g(a), in place */
    gop(f, W(a), W(y));    /* op2 y = h(a) */
    tide_plan *p = plan_new(f, 1, 3 * K);
    int Lx = load(p, 0, TIDE_STREAM_H2D, x, HOST, HOME, 0, NOW);
    int C0 = compute(p, 0, 0, OFFS(0, K), W(Lx));
    int C1 = compute(p, 0, 1, OFFS(K, K), W(C0));
    compute(p, 0, 0, OFFS(0, K), W(C1)); /* a = f(x) again: version 1, current is 2 */
    expect_fail(f, "recomputes op 0, whose output 'a' has moved on to version 2 since its first compute wrote version 1",
                NULL);
    fx_free(f);
}

/* ---------------------------------------------------------------- host placement */

/* a = f(x, w) on the device; b = g(a, s) on the host, s updated in place at
 * its home; y = h(b) on the device. faults: 1 the host compute reads a from
 * the device; 2 it runs on the compute stream; 3 it reads a's host spill
 * copy without waiting for the STORE; 4 a device compute reads w at its home
 * in a plan that is not host_addressable. */
static void build_host(fx *f, int fault) {
    int x = ten(f, "x", TIDE_ROLE_INPUT), w = ten(f, "w", TIDE_ROLE_WEIGHT), s = ten(f, "s", TIDE_ROLE_STATE);
    int a = ten(f, "a", TIDE_ROLE_TEMP), b = ten(f, "b", TIDE_ROLE_TEMP), y = ten(f, "y", TIDE_ROLE_OUTPUT);
    gop(f, W(x, w), W(a));
    gop(f, W(a, s), W(b, s));
    gop(f, W(b), W(y));
    tide_plan *p = plan_new(f, 1, 3 * K);
    p->host_spill_bytes = 2 * K;
    int Lx = load(p, 0, TIDE_STREAM_H2D, x, HOST, HOME, 0, NOW);
    int C0;
    if (fault == 4) {
        tide_ins in = ins(TIDE_INS_COMPUTE, TIDE_STREAM_COMPUTE, 0);
        in.op = 0, in.host_opnd = 2, in.dev_off[0] = 0, in.dev_off[1] = HOME, in.dev_off[2] = K;
        C0 = push(p, &in, W(Lx));
    } else {
        int Lw = load(p, 0, TIDE_STREAM_H2D, w, HOST, HOME, K, NOW);
        C0 = compute(p, 0, 0, OFFS(0, K, 2 * K), W(Lx, Lw));
        drop_dev(p, 0, TIDE_STREAM_COMPUTE, w, K, NOW);
    }
    int DROPx = drop_dev(p, 0, TIDE_STREAM_COMPUTE, x, 0, NOW);
    int Sa = store(p, 0, TIDE_STREAM_D2H, a, fault == 4 ? K : 2 * K, HOST, 0, W(C0));
    tide_ins in = ins(TIDE_INS_COMPUTE, fault == 2 ? TIDE_STREAM_COMPUTE : TIDE_STREAM_HOST, 0);
    in.op = 1, in.place = TIDE_PLACE_HOST;
    in.host_opnd = fault == 1 ? 0xe : 0xf; /* a, s, b, s */
    in.dev_off[0] = fault == 1 ? 2 * K : 0, in.dev_off[1] = HOME, in.dev_off[2] = K, in.dev_off[3] = HOME;
    int H = push(p, &in, (const int[]){fault == 3 ? SKIP : Sa}, 1);
    int Da = drop_dev(p, 0, TIDE_STREAM_D2H, a, fault == 4 ? K : 2 * K, W(Sa));
    drop_tier(p, 0, TIDE_STREAM_HOST, a, HOST, 0, NOW);
    int Lb = load(p, 0, TIDE_STREAM_H2D, b, HOST, K, 0, W(H, DROPx, Da));
    drop_tier(p, 0, TIDE_STREAM_H2D, b, HOST, K, NOW);
    int C2 = compute(p, 0, 2, OFFS(0, K), W(Lb));
    store(p, 0, TIDE_STREAM_D2H, y, K, HOST, HOME, W(C2));
    drop_dev(p, 0, TIDE_STREAM_D2H, y, K, NOW);
    drop_dev(p, 0, TIDE_STREAM_COMPUTE, b, 0, NOW);
}

static void test_host_compute(void **state) {
    fx *f = fx_new();
    build_host(f, 0);
    expect_ok(f);
    fx_free(f);
    f = fx_new();
    build_host(f, 1);
    expect_fail(f, "runs on the host but reads 'a' on the device", NULL);
    fx_free(f);
    f = fx_new();
    build_host(f, 2);
    expect_fail(f, "computes off the host stream (on the compute stream)", NULL);
    fx_free(f);
    f = fx_new();
    build_host(f, 3);
    expect_fail(f, "on the host", "reads 'a' from host spill offset 0, written by instruction");
    fx_free(f);
    f = fx_new();
    build_host(f, 4);
    expect_fail(f, "reads 'w' in host memory from the device", "host_addressable is off");
    fx_free(f);
    /* the same device read of w's home is fine where the device addresses host memory */
    f = fx_new();
    build_host(f, 4);
    f->p->host_addressable = true;
    expect_ok(f);
    fx_free(f);
}

/* ---------------------------------------------------------------- warm tensors */

/* w (weight) and s (state) stay warm at 0 and K: s = f(s, w) in place, then
 * y = g(s). faults: 1 s is dropped; 2 s is updated out of place (its warm
 * copy ends stale); 3 s's home is loaded (a warm state's home is stale);
 * 4 the two warm ranges overlap; 5 a temp is kept warm. */
static void build_warm(fx *f, int fault) {
    int w = ten(f, "w", TIDE_ROLE_WEIGHT), s = ten(f, "s", TIDE_ROLE_STATE), y = ten(f, "y", TIDE_ROLE_OUTPUT);
    int t = ten(f, "t", TIDE_ROLE_TEMP);
    gop(f, W(s, w), W(s));
    gop(f, W(s), W(y, t));
    tide_plan *p = plan_new(f, 1, 5 * K);
    p->warm_off[w] = 0;
    p->warm_off[s] = fault == 4 ? 512 : K;
    if (fault == 5) p->warm_off[t] = 3 * K;
    int L = -1;
    if (fault == 3) L = load(p, 0, TIDE_STREAM_H2D, s, HOST, HOME, 2 * K, NOW);
    int C0 = compute(p, 0, 0, fault == 2 ? OFFS(K, 0, 2 * K) : fault == 3 ? OFFS(2 * K, 0, 2 * K) : OFFS(K, 0, K),
                     L >= 0 ? (const int[]){L} : NULL, L >= 0);
    bool moved = fault == 2 || fault == 3; /* s's new version at 2K */
    int C1 = compute(p, 0, 1, moved ? OFFS(2 * K, 3 * K, 4 * K) : OFFS(K, 2 * K, 3 * K), W(C0));
    store(p, 0, TIDE_STREAM_D2H, y, moved ? 3 * K : 2 * K, HOST, HOME, W(C1));
    drop_dev(p, 0, TIDE_STREAM_D2H, y, moved ? 3 * K : 2 * K, NOW);
    if (fault != 5) drop_dev(p, 0, TIDE_STREAM_COMPUTE, t, moved ? 4 * K : 3 * K, NOW);
    if (moved) drop_dev(p, 0, TIDE_STREAM_COMPUTE, s, 2 * K, NOW);
    if (fault == 1) drop_dev(p, 0, TIDE_STREAM_COMPUTE, s, K, NOW);
}

static void test_warm(void **state) {
    fx *f = fx_new();
    build_warm(f, 0);
    expect_ok(f);
    fx_free(f);
    f = fx_new();
    build_warm(f, 1);
    expect_fail(f, "drops warm 's' at its offset 1024", NULL);
    fx_free(f);
    f = fx_new();
    build_warm(f, 2);
    expect_fail(f, "warm 's' does not end at its offset 1024 with its latest version 1", NULL);
    fx_free(f);
    f = fx_new();
    build_warm(f, 3);
    expect_fail(f, "loads 's' from its host home, which holds no valid copy", NULL);
    fx_free(f);
    f = fx_new();
    build_warm(f, 4);
    expect_fail(f, "warm 'w' and 's' overlap on the device at [512, 1024)", NULL);
    fx_free(f);
    f = fx_new();
    build_warm(f, 5);
    expect_fail(f, "keeps temp 't' warm on the device", NULL);
    fx_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_ok_one_iteration),
        cmocka_unit_test(test_ref_ok_two_iterations),
        cmocka_unit_test(test_overlapping_live_ranges),
        cmocka_unit_test(test_war_missing_event),
        cmocka_unit_test(test_reuse_without_waiting_on_drop),
        cmocka_unit_test(test_raw_missing_event),
        cmocka_unit_test(test_stale_store),
        cmocka_unit_test(test_stale_load),
        cmocka_unit_test(test_stale_compute_read),
        cmocka_unit_test(test_budget_overflow),
        cmocka_unit_test(test_lost_dirty_state),
        cmocka_unit_test(test_output_never_stored),
        cmocka_unit_test(test_op_out_of_order),
        cmocka_unit_test(test_op_missing),
        cmocka_unit_test(test_wait_on_later_instruction),
        cmocka_unit_test(test_read_of_temp_never_written),
        cmocka_unit_test(test_load_from_spill_never_stored),
        cmocka_unit_test(test_device_copy_never_dropped),
        cmocka_unit_test(test_spill_areas),
        cmocka_unit_test(test_resident_state),
        cmocka_unit_test(test_weights_and_scratch),
        cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_recompute_stale_output),
        cmocka_unit_test(test_host_compute),
        cmocka_unit_test(test_warm),
        cmocka_unit_test(test_field_faults),
        cmocka_unit_test(test_bad_home),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_no_race_is_accepted),
        cmocka_unit_test(test_large_plan_is_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
