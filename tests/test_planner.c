/*
 * test_planner.c - the planner (src/planner/: planner.c, baselines.c, lifetime.c):
 *   1. hundreds of random DAGs (every role, STATE read and written, n_iter 1-3)
 *      planned by all three policies at random budgets above each policy's
 *      minimum: every plan passes the verifier and stays inside its budget;
 *      below the minimum, TIDE_E_INFEASIBLE names the number of bytes needed;
 *   2. on unit-size read-only tensors, tide's number of loads equals the
 *      optimum found by exhaustive search (Belady's bound);
 *   3. LLaMA graphs at 100%, 50%, 25% of the unconstrained peak and at the
 *      minimum budget verify, and tide's makespan is no worse than either
 *      baseline's;
 *   4. tide's minimum budget is no larger than static-layer's;
 *   5. warm tensors with gaps in a warm region: nothing else is planned
 *      there, and a plan that puts something there is rejected;
 *   6. where device memory is host memory (host_addressable), LLaMA graphs
 *      under budgets use their host homes in place and stream only what
 *      lives on SSD;
 *   plus the lifetime queries, the lower bound, and the message of a budget
 *   below an op's need beside what the plan reserves (the two apart).
 * The hardware profile is filled in by hand (an H100-like machine).
 *
 * What it proves: hundreds of random DAGs under random budgets for all three
 * policies, every plan verified; "needs at least N bytes" below the minimum;
 * reload counts equal Belady's optimum (brute force) on small cases; random
 * DAGs with ops forced onto the host CPU, host homes used in place, warm
 * weights and a shared scratch, every plan verified and the baselines
 * refusing them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/alloc_test.h"
#include "planner/lifetime.h"
#include "planner/planner.h"
#include "sim/sim.h"
#include "trace/trace.h"
#include "verify/verify.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tide_hw test_hw(void) {
    tide_hw h;
    memset(&h, 0, sizeof h);
    snprintf(h.name, sizeof h.name, "test-h100");
    h.device_mem_bytes = UINT64_C(80) << 30;
    h.flops[TIDE_F32] = 67e12;
    h.flops[TIDE_F16] = h.flops[TIDE_BF16] = 989e12;
    h.flops[TIDE_I32] = 67e12;
    h.matmul_efficiency = 0.75;
    h.mem_bw = 3350e9;
    h.h2d_bw = h.d2h_bw = 50e9;
    h.link_latency_s = 1e-5;
    h.launch_s = 5e-6;
    h.host_mem_bytes = UINT64_C(512) << 30;
    h.ssd_count = 2;
    h.ssd_read_bw = 6.5e9;
    h.ssd_write_bw = 3.5e9;
    h.ssd_latency_s = 1e-4;
    return h;
}

/* xorshift64* */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static int rint_(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); } /* [lo, hi] */

#define CHECK_OK(ctx, expr)                                                                    \
    do {                                                                                       \
        tide_status st_ = (expr);                                                              \
        if (st_) fail_msg("%s: %s (%s)", #expr, tide_status_str(st_), tide_ctx_last_error(ctx)); \
    } while (0)

/* Prints a plan (debugging a failure: TIDE_TEST_DUMP=1). */
static void dump_plan(const tide_plan *p) {
    const tide_graph *g = p->g;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        fprintf(stderr, "%4d %-7s %-7s it%d %-12s dev %8" PRIu64 " tier %s/%s off %" PRIu64 " waits", i,
                tide_ins_name(in->kind), tide_stream_name(in->stream), in->iter,
                in->kind == TIDE_INS_COMPUTE ? g->tensors[g->ops[in->op].out[0]].name : g->tensors[in->tensor].name,
                in->dev_off[0], tide_tier_name(in->src), tide_tier_name(in->dst), in->tier_off);
        for (int k = 0; k < in->n_wait; k++) fprintf(stderr, " %d", p->waits[in->wait_at + k]);
        fprintf(stderr, "\n");
    }
}

/* Plans, verifies and checks the budget; returns the plan (caller frees). */
static tide_plan *plan_ok(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *o) {
    tide_plan *p = NULL;
    tide_status st = tide_plan_make(ctx, g, o, &p);
    if (st) fail_msg("%s plan at budget %" PRIu64 " failed: %s", tide_policy_name(o->policy),
                     o->device_budget, tide_ctx_last_error(ctx));
    st = tide_plan_verify(p);
    if (st && getenv("TIDE_TEST_DUMP")) dump_plan(p);
    if (st) fail_msg("%s plan (budget %" PRIu64 ", n_iter %d) fails verification: %s", tide_policy_name(o->policy),
                     o->device_budget, o->n_iter, tide_ctx_last_error(ctx));
    assert_true(p->stats.peak_device_bytes <= o->device_budget);
    assert_int_equal(p->device_budget, o->device_budget);
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        for (int k = 0; k < in->n_wait; k++) assert_true(p->waits[in->wait_at + k] < i);
    }
    return p;
}

/* ---------------------------------------------------------------- lifetime */

static void test_lifetime(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_graph *g = tide_graph_new(ctx);
    int64_t sh[1] = {1000};
    int w, s, x, t1, t2;
    assert_int_equal(tide_graph_add_tensor(g, "w", TIDE_F32, TIDE_ROLE_WEIGHT, 1, sh, &w), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "s", TIDE_F32, TIDE_ROLE_STATE, 1, sh, &s), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "x", TIDE_F32, TIDE_ROLE_INPUT, 1, sh, &x), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "t1", TIDE_F32, TIDE_ROLE_TEMP, 1, sh, &t1), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "t2", TIDE_F32, TIDE_ROLE_OUTPUT, 1, sh, &t2), TIDE_OK);
    tide_op_args p = {.flops = 1e6};
    int in0[2] = {x, w}, o0[1] = {t1};            /* op 0: t1 = f(x, w) */
    int in1[2] = {t1, s}, o1[2] = {t2, s};        /* op 1: t2, s = f(t1, s) */
    int in2[1] = {t2}, o2[1] = {t1};              /* op 2: t1 = f(t2) (rewrite) */
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 2, in0, 1, o0, &p, -1, NULL), TIDE_OK);
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 2, in1, 2, o1, &p, -1, NULL), TIDE_OK);
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 1, in2, 1, o2, &p, -1, NULL), TIDE_OK);
    tide_lifetime lt;
    assert_int_equal(tide_lifetime_build(ctx, g, 3, &lt), TIDE_OK);
    assert_int_equal(lt.n_steps, 9);
    int rw;
    assert_int_equal(tide_lifetime_use_from(&lt, w, 1, &rw), 3);
    assert_int_equal(rw, TIDE_USE_READ);
    assert_int_equal(tide_lifetime_next_use(&lt, s, 1, &rw), 4);
    assert_int_equal(rw, TIDE_USE_READ | TIDE_USE_WRITE);
    assert_int_equal(tide_lifetime_next_use(&lt, t1, 1, &rw), 2);
    assert_int_equal(rw, TIDE_USE_WRITE);
    assert_true(tide_lifetime_dead_after(&lt, t1, 1));  /* next access rewrites it */
    assert_false(tide_lifetime_dead_after(&lt, t1, 0)); /* read by op 1 */
    assert_true(tide_lifetime_dead_after(&lt, t1, 8));  /* never read again */
    assert_int_equal(tide_lifetime_next_use(&lt, x, 6, NULL), TIDE_NEVER);
    assert_int_equal(tide_lifetime_last_use(&lt, t2), 8);
    assert_int_equal(tide_lifetime_last_write(&lt, s), 7);
    assert_int_equal(tide_lifetime_n_uses(&lt, t1), 3);
    tide_lifetime_free(&lt);
    /* working set: distinct tensors, granule-rounded */
    assert_int_equal(tide_op_working_set(g, &g->ops[1]), 3 * tide_plan_align(4000));
    /* a temp read before it is written is rejected */
    int in3[1] = {t1}, o3[1] = {t2};
    tide_graph *g2 = tide_graph_new(ctx);
    int a, b;
    assert_int_equal(tide_graph_add_tensor(g2, "a", TIDE_F32, TIDE_ROLE_TEMP, 1, sh, &a), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g2, "b", TIDE_F32, TIDE_ROLE_OUTPUT, 1, sh, &b), TIDE_OK);
    in3[0] = a, o3[0] = b;
    assert_int_equal(tide_graph_add_op_args(g2, TIDE_OP_GENERIC, 1, in3, 1, o3, &p, -1, NULL), TIDE_OK);
    assert_int_equal(tide_lifetime_build(ctx, g2, 1, &lt), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "before any op writes it"));
    tide_lifetime_free(&lt);
    tide_graph_free(g2);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- random DAGs */

/* A random graph of GENERIC ops over tensors of every role. Layers are
 * contiguous runs of ops; a layer's weights are mostly used by its own ops.
 * With scratch, about a third of the ops get a workspace of up to max_bytes. */
static tide_graph *random_graph_s(tide_ctx *ctx, int n_ops, uint64_t max_bytes, bool scratch) {
    tide_graph *g = tide_graph_new(ctx);
    int n_layers = rint_(1, 4);
    int wl[8][6], nwl[8] = {0}, glob[3], nglob = rint_(0, 2), st[4], nst = rint_(0, 3);
    int inp[2], ninp = rint_(1, 2), outp[3], nout = rint_(1, 2);
    int *temps = malloc(sizeof(int) * (size_t)(n_ops * 4 + 8)), ntemps = 0;
    bool *written = calloc((size_t)(n_ops * 4 + 64), sizeof *written);
    char name[64];
    int id;
#define ADD(role, layer, arr, cnt, fmt, ...)                                                            \
    do {                                                                                                \
        snprintf(name, sizeof name, fmt, __VA_ARGS__);                                                  \
        int64_t sh[1] = {(int64_t)(1 + rnd() % (max_bytes / 4))};                                       \
        assert_int_equal(tide_graph_add_tensor(g, name, rnd() % 2 ? TIDE_F32 : TIDE_F16, role, 1, sh, &id), \
                         TIDE_OK);                                                                      \
        tide_graph_set_tensor_layer(g, id, layer);                                                      \
        arr[cnt++] = id;                                                                                \
    } while (0)
    for (int l = 0; l < n_layers; l++) {
        int k = rint_(1, 6);
        for (int j = 0; j < k; j++) ADD(TIDE_ROLE_WEIGHT, l, wl[l], nwl[l], "w.%d.%d", l, j);
    }
    int n = 0;
    for (int j = 0; j < nglob; j++) ADD(TIDE_ROLE_WEIGHT, -1, glob, n, "g.%d", j);
    n = 0;
    for (int j = 0; j < nst; j++) ADD(TIDE_ROLE_STATE, rint_(-1, n_layers - 1), st, n, "s.%d", j);
    n = 0;
    for (int j = 0; j < ninp; j++) ADD(TIDE_ROLE_INPUT, -1, inp, n, "in.%d", j);
    n = 0;
    for (int j = 0; j < nout; j++) ADD(TIDE_ROLE_OUTPUT, -1, outp, n, "out.%d", j);
    for (int i = 0; i < n_ops; i++) {
        int layer = i * n_layers / n_ops;
        int in[TIDE_OP_MAX_IN], ni = 0, out[TIDE_OP_MAX_OUT], no = 0;
        int want = rint_(0, 4);
        for (int k = 0; k < want; k++) {
            int c = rint_(0, 9), t = -1;
            if (c <= 3) t = wl[layer][rint_(0, nwl[layer] - 1)];
            else if (c == 4 && nglob) t = glob[rint_(0, nglob - 1)];
            else if (c == 5 && nst) t = st[rint_(0, nst - 1)];
            else if (c == 6) t = inp[rint_(0, ninp - 1)];
            else if (c == 7 && rnd() % 4 == 0) t = wl[rint_(0, n_layers - 1)][0]; /* shared weight */
            else if (ntemps) t = temps[rint_(0, ntemps - 1)];
            if (t < 0) continue;
            tide_role r = g->tensors[t].role;
            if ((r == TIDE_ROLE_TEMP || r == TIDE_ROLE_OUTPUT) && !written[t]) continue;
            in[ni++] = t;
        }
        for (int j = 0; j < nout; j++) /* outputs may be read once written */
            if (written[outp[j]] && ni < TIDE_OP_MAX_IN && rnd() % 8 == 0) in[ni++] = outp[j];
        int k_out = rint_(1, 2);
        for (int k = 0; k < k_out; k++) {
            int c = rint_(0, 9), t;
            if (c <= 5 || !ntemps) {
                ADD(TIDE_ROLE_TEMP, layer, temps, ntemps, "t.%d.%d", i, k);
                t = temps[ntemps - 1];
            } else if (c == 6) {
                t = temps[rint_(0, ntemps - 1)]; /* rewrite (maybe in place) */
            } else if (c == 7 && nst) {
                t = st[rint_(0, nst - 1)];
                if (rnd() % 2 && ni < TIDE_OP_MAX_IN) in[ni++] = t; /* read-modify-write */
            } else {
                t = outp[rint_(0, nout - 1)];
            }
            out[no++] = t;
        }
        if (i == n_ops - 1) /* every output is written at least once */
            for (int j = 0; j < nout; j++)
                if (!written[outp[j]] && no < TIDE_OP_MAX_OUT) out[no++] = outp[j];
        tide_op_args p = {.flops = (double)(rnd() % 1000000000ull)};
        assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, ni, in, no, out, &p, layer, NULL), TIDE_OK);
        if (scratch && rnd() % 3 == 0) g->ops[g->n_ops - 1].scratch_bytes = 1 + rnd() % max_bytes;
        for (int k = 0; k < no; k++) written[out[k]] = true;
    }
#undef ADD
    free(temps);
    free(written);
    return g;
}

static tide_graph *random_graph(tide_ctx *ctx, int n_ops, uint64_t max_bytes) {
    return random_graph_s(ctx, n_ops, max_bytes, false);
}

static void check_infeasible(tide_ctx *ctx, const tide_graph *g, tide_plan_opts o, uint64_t min) {
    char want[64];
    snprintf(want, sizeof want, "needs at least %" PRIu64 " bytes", min);
    o.device_budget = min - 1;
    tide_plan *p = NULL;
    tide_status st = tide_plan_make(ctx, g, &o, &p);
    if (st != TIDE_E_INFEASIBLE)
        fail_msg("%s below its minimum %" PRIu64 ": status %d (%s)", tide_policy_name(o.policy), min, (int)st,
                 tide_ctx_last_error(ctx));
    if (!strstr(tide_ctx_last_error(ctx), want))
        fail_msg("%s: message '%s' lacks '%s'", tide_policy_name(o.policy), tide_ctx_last_error(ctx), want);
    assert_null(p);
}

static void test_random_dags(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    tide_hw no_ssd = hw;
    no_ssd.ssd_count = 0;
    int n_plans = 0;
    for (int gi = 0; gi < 300; gi++) {
        tide_graph *g = random_graph(ctx, rint_(1, 40), gi % 3 == 0 ? 4096 : 65536);
        uint64_t ws = tide_graph_max_working_set(g, NULL);
        int n_iter = rint_(1, 3);
        uint64_t peak = tide_plan_unconstrained_peak(ctx, g, &hw, n_iter);
        assert_true(peak >= ws);
        for (int pol = 0; pol < TIDE_POLICY_INFERENCE_COUNT; pol++) {
            tide_plan_opts o = {.policy = (tide_policy)pol, .n_iter = n_iter, .hw = gi % 5 == 4 ? &no_ssd : &hw};
            o.weights_on_ssd = gi % 7 == 3;
            if (o.weights_on_ssd) o.hw = &hw;
            uint64_t min = 0;
            o.device_budget = peak;
            tide_status st = tide_plan_min_budget(ctx, g, &o, &min);
            if (st) fail_msg("min budget (%s): %s", tide_policy_name(o.policy), tide_ctx_last_error(ctx));
            assert_true(min >= ws);
            if (pol != TIDE_POLICY_STATIC_LAYER && min != ws) { /* tide and lru reach the bound */
                tide_plan *p = NULL;
                o.device_budget = ws;
                tide_status s2 = tide_plan_make(ctx, g, &o, &p);
                fail_msg("graph %d: %s min budget %" PRIu64 " above the largest working set %" PRIu64 ": %s",
                         gi, tide_policy_name(o.policy), min, ws, s2 ? tide_ctx_last_error(ctx) : "plans there");
            }
            check_infeasible(ctx, g, o, min);
            uint64_t top = peak > min ? peak : min;
            uint64_t budgets[4] = {min, top, min + rnd() % (top + top / 5 - min + 1), min + rnd() % (top - min + 1)};
            for (int b = 0; b < 4; b++) {
                o.device_budget = budgets[b];
                tide_plan *p = plan_ok(ctx, g, &o);
                assert_true(p->stats.makespan_s >= 0);
                tide_plan_free(p);
                n_plans++;
            }
        }
        tide_graph_free(g);
    }
    print_message("  %d random plans verified\n", n_plans);
    tide_ctx_free(ctx);
}

/* A small host budget pushes weights' homes to SSD and spills to SSD. */
static void test_small_host(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    for (int gi = 0; gi < 40; gi++) {
        tide_graph *g = random_graph(ctx, rint_(5, 40), 65536);
        uint64_t io = tide_graph_role_bytes(g, TIDE_ROLE_INPUT) + tide_graph_role_bytes(g, TIDE_ROLE_OUTPUT) +
                      tide_graph_role_bytes(g, TIDE_ROLE_STATE);
        uint64_t ws = tide_graph_max_working_set(g, NULL);
        for (int pol = 0; pol < TIDE_POLICY_INFERENCE_COUNT; pol++) {
            tide_plan_opts o = {.policy = (tide_policy)pol, .n_iter = rint_(1, 3), .hw = &hw,
                                .host_budget = io + 1 + rnd() % 65536};
            uint64_t min;
            o.device_budget = ws * 4;
            CHECK_OK(ctx, tide_plan_min_budget(ctx, g, &o, &min));
            o.device_budget = min;
            tide_plan *p = plan_ok(ctx, g, &o);
            assert_true(p->host_spill_bytes + io <= o.host_budget || p->host_spill_bytes == 0);
            tide_plan_free(p);
        }
        tide_graph_free(g);
    }
    /* inputs and outputs alone over the host budget: infeasible, whatever the device */
    tide_graph *g = random_graph(ctx, 10, 65536);
    tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw, .host_budget = 16,
                        .device_budget = UINT64_C(1) << 30};
    tide_plan *p = NULL;
    assert_int_equal(tide_plan_make(ctx, g, &o, &p), TIDE_E_INFEASIBLE);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "host memory"));
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- Belady */

/* Fewest loads serving the op sequence (each op needs every tensor of its
 * set present at once) with a cache of k unit slots, starting empty:
 * dynamic programming over cache contents, i.e. exhaustive search over every
 * eviction choice. */
static int optimal_loads(const unsigned *need, int n_ops, int n_t, int k) {
    enum { BIG = 1 << 20 };
    int n_masks = 1 << n_t;
    int *cur = malloc(sizeof(int) * (size_t)n_masks), *nxt = malloc(sizeof(int) * (size_t)n_masks);
    for (int m = 0; m < n_masks; m++) cur[m] = m == 0 ? 0 : BIG;
    for (int i = 0; i < n_ops; i++) {
        for (int m = 0; m < n_masks; m++) nxt[m] = BIG;
        for (int m = 0; m < n_masks; m++) {
            if (cur[m] >= BIG) continue;
            unsigned avail = (unsigned)m | need[i];
            /* every subset of what is there or loaded that keeps the need set */
            for (unsigned s = avail;; s = (s - 1) & avail) {
                if ((s & need[i]) == need[i] && __builtin_popcount(s) <= k) {
                    int c = cur[m] + __builtin_popcount(need[i] & ~(unsigned)m);
                    if (c < nxt[s]) nxt[s] = c;
                }
                if (s == 0) break;
            }
        }
        int *t = cur;
        cur = nxt;
        nxt = t;
    }
    int best = BIG;
    for (int m = 0; m < n_masks; m++) best = cur[m] < best ? cur[m] : best;
    free(cur);
    free(nxt);
    return best;
}

static void test_belady(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    const int64_t unit = 1024; /* f32 elements: 4 KiB, a multiple of the granule */
    int checked = 0;
    for (int trial = 0; trial < 400; trial++) {
        int n_t = rint_(4, 6), n_ops = rint_(6, 10), k = rint_(2, n_t - 1);
        unsigned need[10];
        tide_graph *g = tide_graph_new(ctx);
        int w[6], acc, id;
        /* an accumulator read and written by every op: always resident, in
         * the arena's first granule, so the weights' slots stay aligned */
        int64_t sh1[1] = {64}, shu[1] = {unit};
        assert_int_equal(tide_graph_add_tensor(g, "acc", TIDE_F32, TIDE_ROLE_STATE, 1, sh1, &acc), TIDE_OK);
        for (int j = 0; j < n_t; j++) {
            char nm[16];
            snprintf(nm, sizeof nm, "w%d", j);
            assert_int_equal(tide_graph_add_tensor(g, nm, TIDE_F32, TIDE_ROLE_WEIGHT, 1, shu, &id), TIDE_OK);
            w[j] = id;
        }
        for (int i = 0; i < n_ops; i++) {
            int in[TIDE_OP_MAX_IN], ni = 0;
            in[ni++] = acc;
            need[i] = 0;
            int r = rint_(1, k);
            while (__builtin_popcount(need[i]) < r) need[i] |= 1u << rint_(0, n_t - 1);
            for (int j = 0; j < n_t; j++)
                if (need[i] >> j & 1) in[ni++] = w[j];
            int out[1] = {acc};
            /* compute-bound (each op ~20 ms, a load ~0.1 ms): the regime where
             * tide keeps to MIN's evictions; when the link would idle it
             * trades a load for overlap instead */
            tide_op_args p = {.flops = 1e12 * (double)(1 + rnd() % 4)};
            assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, ni, in, 1, out, &p, -1, NULL), TIDE_OK);
        }
        tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw,
                            .device_budget = TIDE_PLAN_ALIGN + (uint64_t)k * (uint64_t)unit * 4};
        tide_plan *p = plan_ok(ctx, g, &o);
        int loads = 0;
        for (int i = 0; i < p->n_ins; i++)
            if (p->ins[i].kind == TIDE_INS_LOAD && p->ins[i].tensor != acc) loads++;
        int opt = optimal_loads(need, n_ops, n_t, k);
        if (loads != opt) {
            char seq[256];
            int at = 0;
            for (int i = 0; i < n_ops; i++) at += snprintf(seq + at, sizeof seq - (size_t)at, " %x", need[i]);
            fail_msg("trial %d: tide loads %d, optimum %d (k %d, need sets:%s)", trial, loads, opt, k, seq);
        }
        checked++;
        tide_plan_free(p);
        tide_graph_free(g);
    }
    print_message("  %d sequences match the optimum\n", checked);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- placements */

/* Random DAGs, half of them with ops that have scratch, planned with (a)
 * some ops forced onto the host CPU, (b) the device addressing host memory
 * (tensors homed on host used in place), (c) every weight warm at the top of
 * the arena, and (a)+(b), some with one shared scratch range (whose users
 * must all be ordered), over 1 to 3 iterations: every plan
 * verifies, host ops compute on the host stream with host operands, in-place
 * tensors are never loaded, warm ones never loaded nor dropped. The
 * baselines refuse all three. */
static void test_placements(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    int n_plans = 0, n_host = 0;
    for (int gi = 0; gi < 200; gi++) {
        tide_graph *g = random_graph_s(ctx, rint_(1, 30), gi % 3 == 0 ? 4096 : 65536, gi % 2 == 1);
        int n_iter = rint_(1, 3), mode = gi % 4;
        bool *host = calloc((size_t)g->n_ops + 1, sizeof *host);
        uint64_t *warm = malloc(((size_t)g->n_tensors + 1) * sizeof *warm);
        for (int i = 0; i < g->n_ops; i++) host[i] = (mode == 0 || mode == 3) && rnd() % 4 == 0;
        tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = n_iter, .hw = &hw};
        o.weights_on_ssd = mode == 0 && gi % 8 == 0;
        if (mode == 0 || mode == 3) o.host_ops = host;
        o.host_addressable = mode == 1 || mode == 3;
        o.shared_scratch = mode == 3 || gi % 5 == 1;
        uint64_t peak = 0, warm_bytes = 0;
        CHECK_OK(ctx, tide_plan_peak_unbounded(ctx, g, &o, &peak));
        if (!peak) peak = TIDE_PLAN_ALIGN; /* everything on the host */
        if (mode == 2) { /* every weight warm, packed above what the plan needs */
            for (int t = 0; t < g->n_tensors; t++) {
                warm[t] = TIDE_HOME;
                if (g->tensors[t].role != TIDE_ROLE_WEIGHT) continue;
                warm[t] = peak + warm_bytes;
                warm_bytes += tide_plan_align(g->tensors[t].nbytes);
            }
            o.warm_off = warm;
        }
        uint64_t budgets[2] = {peak + warm_bytes, peak / 2 + rnd() % (peak / 2 + 1)};
        for (int b = 0; b < 2; b++) {
            o.device_budget = budgets[b] + (b ? warm_bytes : 0);
            if (mode == 2 && b) o.device_budget = budgets[0]; /* the warm offsets need their top */
            tide_plan *p = NULL;
            tide_status st = tide_plan_make(ctx, g, &o, &p);
            if (st == TIDE_E_INFEASIBLE && b) continue; /* below what some op needs */
            if (st) fail_msg("graph %d mode %d budget %" PRIu64 ": %s: %s", gi, mode, o.device_budget, tide_status_str(st),
                             tide_ctx_last_error(ctx));
            if (tide_plan_verify(p)) {
                if (getenv("TIDE_TEST_DUMP")) dump_plan(p);
                fail_msg("graph %d mode %d (n_iter %d) fails verification: %s", gi, mode, n_iter, tide_ctx_last_error(ctx));
            }
            assert_true(p->stats.peak_device_bytes <= o.device_budget);
            for (int i = 0; i < p->n_ins; i++) {
                const tide_ins *in = &p->ins[i];
                if (in->kind == TIDE_INS_COMPUTE) {
                    bool h = host[in->op] && o.host_ops;
                    assert_int_equal(in->place, h ? TIDE_PLACE_HOST : TIDE_PLACE_DEVICE);
                    assert_int_equal(in->stream, h ? TIDE_STREAM_HOST : TIDE_STREAM_COMPUTE);
                    n_host += h;
                    continue;
                }
                tide_role r = g->tensors[in->tensor].role;
                if (o.host_addressable && r != TIDE_ROLE_TEMP && p->home[in->tensor] == TIDE_TIER_HOST)
                    assert_true(in->kind == TIDE_INS_MOVE || (in->kind == TIDE_INS_DROP && in->src != TIDE_TIER_DEVICE));
                if (mode == 2 && warm[in->tensor] != TIDE_HOME)
                    fail_msg("graph %d: warm '%s' is moved by a %s", gi, g->tensors[in->tensor].name, tide_ins_name(in->kind));
            }
            if (mode == 2)
                for (int t = 0; t < g->n_tensors; t++) assert_true(p->warm_off[t] == warm[t]);
            tide_plan_free(p);
            n_plans++;
        }
        /* the baselines plan none of it */
        if (mode != 1 || gi % 8 == 1) {
            tide_plan_opts ob = o;
            ob.policy = TIDE_POLICY_LRU;
            tide_plan *p = NULL;
            assert_int_equal(tide_plan_make(ctx, g, &ob, &p), TIDE_E_UNSUPPORTED);
            assert_null(p);
        }
        free(host);
        free(warm);
        tide_graph_free(g);
    }
    print_message("  %d plans with host computes (%d of them), in-place or warm tensors verified\n", n_plans, n_host);
    assert_true(n_host > 100);
    tide_ctx_free(ctx);
}

/* y = op(x, w0, w1) with w1 warm at offset 0 (4 KiB) and the shared scratch
 * of a second op (4 KiB): below what the op needs beside them, the message
 * gives the op's need and what the plan reserves apart. */
static void test_reserve_message(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    tide_graph *g = tide_graph_new(ctx);
    int x, w0, w1, y, z;
    int64_t page[1] = {1024}, two[1] = {2048};
    CHECK_OK(ctx, tide_graph_add_tensor(g, "x", TIDE_F32, TIDE_ROLE_INPUT, 1, page, &x));
    CHECK_OK(ctx, tide_graph_add_tensor(g, "w0", TIDE_F32, TIDE_ROLE_WEIGHT, 1, two, &w0));
    CHECK_OK(ctx, tide_graph_add_tensor(g, "w1", TIDE_F32, TIDE_ROLE_WEIGHT, 1, page, &w1));
    CHECK_OK(ctx, tide_graph_add_tensor(g, "y", TIDE_F32, TIDE_ROLE_TEMP, 1, page, &y));
    CHECK_OK(ctx, tide_graph_add_tensor(g, "z", TIDE_F32, TIDE_ROLE_OUTPUT, 1, page, &z));
    int in0[3] = {x, w0, w1}, in1[1] = {y};
    tide_op_args prm = {.flops = 1e6};
    CHECK_OK(ctx, tide_graph_add_op_args(g, TIDE_OP_GENERIC, 3, in0, 1, &y, &prm, 0, NULL));
    CHECK_OK(ctx, tide_graph_add_op_args(g, TIDE_OP_GENERIC, 1, in1, 1, &z, &prm, 0, NULL));
    g->ops[1].scratch_bytes = 100;
    uint64_t warm[5] = {TIDE_HOME, TIDE_HOME, 0, TIDE_HOME, TIDE_HOME};
    tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw, .warm_off = warm,
                        .shared_scratch = true, .device_budget = 5 * 4096};
    tide_plan *p = NULL;
    assert_int_equal(tide_plan_make(ctx, g, &o, &p), TIDE_E_INFEASIBLE);
    const char *want = "op 0 (generic) needs 16384 bytes plus 8192 reserved";
    if (!strstr(tide_ctx_last_error(ctx), want))
        fail_msg("message '%s' lacks '%s'", tide_ctx_last_error(ctx), want);
    o.device_budget = 6 * 4096;
    tide_plan_free(plan_ok(ctx, g, &o));
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* The first device range of p other than a warm tensor at its warm offset
 * that overlaps [0, region): its instruction, or -1. */
static int in_warm_region(const tide_plan *p, uint64_t region) {
    const tide_graph *g = p->g;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->kind == TIDE_INS_COMPUTE) {
            if (in->place != TIDE_PLACE_DEVICE) continue;
            const tide_op *op = &g->ops[in->op];
            for (int k = 0; k < op->n_in + op->n_out; k++) {
                int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
                if (!tide_ins_host_opnd(in, k) && in->dev_off[k] < region && p->warm_off[t] != in->dev_off[k])
                    return i;
            }
            if (op->scratch_bytes && in->scratch_off < region) return i;
        } else if ((in->kind == TIDE_INS_LOAD || in->kind == TIDE_INS_STORE ||
                    (in->kind == TIDE_INS_DROP && in->src == TIDE_TIER_DEVICE)) &&
                   in->dev_off[0] < region && g->tensors[in->tensor].nbytes) {
            return i;
        }
    }
    return -1;
}

/* Warm weights and state with gaps between them (the rows of a cache buffer
 * a smaller batch leaves), some ops with scratch, n_iter 1-3, a shared
 * scratch or not: planned with the warm region, nothing of the plan but the
 * warm tensors lies in it (checked here and by the verifier), and the plan's
 * peak covers it; planned without it, the gaps hold activations or scratch,
 * and the verifier rejects that plan once it claims the region (a planted
 * fault). A region past the budget or not a multiple of the granule is
 * refused. */
static void test_warm_region(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    int n_plans = 0, n_rejected = 0;
    for (int gi = 0; gi < 150; gi++) {
        tide_graph *g = random_graph_s(ctx, rint_(2, 30), gi % 3 == 0 ? 8192 : 65536, true);
        uint64_t *warm = malloc(((size_t)g->n_tensors + 1) * sizeof *warm), at = 0;
        for (int t = 0; t < g->n_tensors; t++) {
            warm[t] = TIDE_HOME;
            tide_role r = g->tensors[t].role;
            if ((r != TIDE_ROLE_WEIGHT && r != TIDE_ROLE_STATE) || rnd() % 4 == 0) continue;
            at += (uint64_t)rint_(0, 3) * TIDE_PLAN_ALIGN; /* a gap no tensor of g names */
            warm[t] = at;
            at += tide_plan_align(g->tensors[t].nbytes);
        }
        uint64_t region = at + (uint64_t)rint_(0, 2) * TIDE_PLAN_ALIGN, peak = 0;
        tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = rint_(1, 3), .hw = &hw, .warm_off = warm,
                            .shared_scratch = gi % 2 == 1};
        CHECK_OK(ctx, tide_plan_peak_unbounded(ctx, g, &o, &peak));
        uint64_t budgets[2] = {region + peak + TIDE_PLAN_ALIGN, region + peak / 2 + rnd() % (peak / 2 + 1)};
        for (int b = 0; b < 2; b++) {
            o.device_budget = tide_plan_align(budgets[b]);
            o.warm_region = region;
            tide_plan *p = NULL;
            tide_status st = tide_plan_make(ctx, g, &o, &p);
            if (st == TIDE_E_INFEASIBLE && b) continue; /* below what some op needs beside the region */
            if (st) fail_msg("graph %d budget %" PRIu64 ": %s (%s)", gi, o.device_budget, tide_status_str(st),
                             tide_ctx_last_error(ctx));
            if (tide_plan_verify(p)) {
                if (getenv("TIDE_TEST_DUMP")) dump_plan(p);
                fail_msg("graph %d (n_iter %d) with a warm region fails verification: %s", gi, o.n_iter,
                         tide_ctx_last_error(ctx));
            }
            assert_true(p->warm_region == region);
            assert_true(p->stats.peak_device_bytes >= region && p->stats.peak_device_bytes <= o.device_budget);
            int i = in_warm_region(p, region);
            if (i >= 0) fail_msg("graph %d: instruction %d lies in the warm region [0, %" PRIu64 ")", gi, i, region);
            tide_plan_free(p);
            n_plans++;
            /* the same without the region: what lands in the gaps is rejected once claimed */
            o.warm_region = 0;
            p = plan_ok(ctx, g, &o);
            if (in_warm_region(p, region) >= 0) {
                p->warm_region = region;
                assert_int_equal(tide_plan_verify(p), TIDE_E_VERIFY);
                if (!strstr(tide_ctx_last_error(ctx), "inside the warm region"))
                    fail_msg("graph %d: rejected for '%s', not for the warm region", gi, tide_ctx_last_error(ctx));
                n_rejected++;
            }
            p->warm_region = p->device_budget + TIDE_PLAN_ALIGN; /* past the budget */
            assert_int_equal(tide_plan_verify(p), TIDE_E_VERIFY);
            tide_plan_free(p);
        }
        o.device_budget = tide_plan_align(budgets[0]);
        tide_plan *p = NULL;
        o.warm_region = region + 100;
        assert_int_equal(tide_plan_make(ctx, g, &o, &p), TIDE_E_INVALID);
        o.warm_region = o.device_budget + TIDE_PLAN_ALIGN;
        assert_int_equal(tide_plan_make(ctx, g, &o, &p), TIDE_E_INVALID);
        o.warm_region = region;
        o.policy = TIDE_POLICY_LRU;
        o.warm_off = NULL;
        assert_int_equal(tide_plan_make(ctx, g, &o, &p), TIDE_E_UNSUPPORTED); /* the baselines plan no region */
        assert_null(p);
        free(warm);
        tide_graph_free(g);
    }
    print_message("  %d plans with a warm region verified; %d planned without it used the region's gaps and "
                  "were rejected once claiming it\n", n_plans, n_rejected);
    assert_true(n_plans > 150 && n_rejected > 20);
    tide_ctx_free(ctx);
}

/* A shared scratch in a multi-iteration plan under a budget: the steady
 * state's resident region must go where the arena is free, not where its
 * first block (the scratch, reserved at offset 0) is. A 3-layer bf16 LLaMA
 * graph, two iterations, budgets from the peak down: every plan verifies or
 * is refused as infeasible. */
static void test_shared_scratch_iterations(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    tide_llama_config cfg;
    CHECK_OK(ctx, tide_llama_config_named(ctx, "tinyllama-1.1b", &cfg));
    cfg.num_hidden_layers = 3;
    cfg.dtype = TIDE_BF16;
    tide_llama_graph_opts go = {.batch = 1, .seq = 128};
    tide_graph *g = NULL;
    CHECK_OK(ctx, tide_llama_build(ctx, &cfg, &go, &g));
    int n_plans = 0;
    for (int n_iter = 2; n_iter <= 3; n_iter++) {
        tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = n_iter, .hw = &hw, .shared_scratch = true};
        uint64_t peak = 0;
        CHECK_OK(ctx, tide_plan_peak_unbounded(ctx, g, &o, &peak));
        static const int eighths[] = {8, 7, 6, 5, 4, 3, 2};
        for (int k = 0; k < (int)(sizeof eighths / sizeof *eighths); k++) {
            o.device_budget = tide_plan_align(peak / 8 * (uint64_t)eighths[k]);
            tide_plan *p = NULL;
            tide_status st = tide_plan_make(ctx, g, &o, &p);
            if (st == TIDE_E_INFEASIBLE) continue;
            if (st) fail_msg("n_iter %d, %d/8 of the peak: %s", n_iter, eighths[k], tide_ctx_last_error(ctx));
            tide_plan_free(p);
            tide_plan_free(plan_ok(ctx, g, &o));
            n_plans++;
        }
    }
    print_message("  %d plans with a shared scratch over iterations verified\n", n_plans);
    assert_true(n_plans >= 8);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* Weights homed on SSD and every third op on the host CPU: a host op's
 * weight comes into host spill space by a MOVE, and that clean copy goes
 * after the weight's last use of each iteration, so the host spill peak is
 * the same at 1, 2 and 3 iterations, and a host budget that holds one
 * iteration's plan holds three's. Every plan verifies. */
static void test_host_spill_iterations(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    tide_llama_config cfg = {
        .name = "host-spill", .hidden_size = 128, .intermediate_size = 352, .num_hidden_layers = 3,
        .num_attention_heads = 4, .num_key_value_heads = 2, .vocab_size = 300, .max_position_embeddings = 64,
        .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .dtype = TIDE_BF16,
    };
    tide_llama_graph_opts go = {.batch = 1, .seq = 8};
    tide_graph *g = NULL;
    CHECK_OK(ctx, tide_llama_build(ctx, &cfg, &go, &g));
    bool *host = calloc((size_t)g->n_ops, sizeof *host);
    for (int i = 0; i < g->n_ops; i++) host[i] = i % 3 == 2;
    uint64_t spill[4] = {0}, homes = tide_graph_role_bytes(g, TIDE_ROLE_INPUT) +
                                     tide_graph_role_bytes(g, TIDE_ROLE_OUTPUT) +
                                     tide_graph_role_bytes(g, TIDE_ROLE_STATE);
    for (int n_iter = 1; n_iter <= 3; n_iter++) {
        tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = n_iter, .hw = &hw, .weights_on_ssd = true,
                            .host_ops = host};
        CHECK_OK(ctx, tide_plan_peak_unbounded(ctx, g, &o, &o.device_budget));
        o.device_budget += TIDE_PLAN_ALIGN;
        tide_plan *p = plan_ok(ctx, g, &o);
        spill[n_iter] = p->stats.peak_host_bytes;
        tide_plan_free(p);
        /* a host budget that holds the homes and one iteration's spills */
        o.host_budget = homes + spill[1] + 2 * TIDE_PLAN_ALIGN;
        tide_plan_free(plan_ok(ctx, g, &o));
    }
    print_message("  host spill peak at 1, 2, 3 iterations: %" PRIu64 ", %" PRIu64 ", %" PRIu64 " bytes\n", spill[1],
                  spill[2], spill[3]);
    assert_true(spill[1] > 0);
    assert_true(spill[2] == spill[1] && spill[3] == spill[1]);
    free(host);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- LLaMA */

static void llama_case(tide_ctx *ctx, const char *model, int layers, int batch, int seq, int n_iter,
                       uint64_t *min_tide, uint64_t *min_static) {
    tide_hw hw = test_hw();
    tide_llama_config cfg;
    assert_int_equal(tide_llama_config_named(ctx, model, &cfg), TIDE_OK);
    if (layers) cfg.num_hidden_layers = layers;
    cfg.dtype = TIDE_F16;
    tide_llama_graph_opts go = {.batch = batch, .seq = seq};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build(ctx, &cfg, &go, &g), TIDE_OK);
    uint64_t peak = tide_plan_unconstrained_peak(ctx, g, &hw, n_iter);
    tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = n_iter, .hw = &hw, .device_budget = peak};
    uint64_t mins[TIDE_POLICY_INFERENCE_COUNT];
    for (int pol = 0; pol < TIDE_POLICY_INFERENCE_COUNT; pol++) {
        o.policy = (tide_policy)pol;
        CHECK_OK(ctx, tide_plan_min_budget(ctx, g, &o, &mins[pol]));
    }
    double fr[4] = {1.0, 0.5, 0.25, 0};
    for (int b = 0; b < 4; b++) {
        uint64_t budget = fr[b] > 0 ? (uint64_t)((double)peak * fr[b]) : mins[TIDE_POLICY_TIDE];
        double ms[TIDE_POLICY_INFERENCE_COUNT];
        tide_bounds bd;
        o.device_budget = budget;
        CHECK_OK(ctx, tide_plan_bounds(ctx, g, &o, &bd));
        for (int pol = 0; pol < TIDE_POLICY_INFERENCE_COUNT; pol++) {
            ms[pol] = -1;
            if (budget < mins[pol]) continue;
            o.policy = (tide_policy)pol;
            tide_plan *p = plan_ok(ctx, g, &o);
            ms[pol] = p->stats.makespan_s;
            assert_true(ms[pol] >= bd.lower_bound_s * 0.999);
            tide_plan_free(p);
        }
        print_message("  %s x%d b%d s%d iter %d, budget %.0f%% (%.2f GB): tide %.4f s (%.3fx LB), static-layer %.4f, "
                      "lru %.4f\n", model, cfg.num_hidden_layers, batch, seq, n_iter, fr[b] * 100, budget / 1e9,
                      ms[0], ms[0] / bd.lower_bound_s, ms[1], ms[2]);
        for (int pol = 1; pol < TIDE_POLICY_INFERENCE_COUNT; pol++)
            if (ms[pol] >= 0 && ms[0] > ms[pol] * (1 + 1e-9))
                fail_msg("tide (%.6f s) slower than %s (%.6f s)", ms[0], tide_policy_name((tide_policy)pol), ms[pol]);
    }
    *min_tide = mins[TIDE_POLICY_TIDE];
    *min_static = mins[TIDE_POLICY_STATIC_LAYER];
    tide_graph_free(g);
}

static void test_llama(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    uint64_t mt, ms;
    llama_case(ctx, "tinyllama-1.1b", 0, 1, 128, 1, &mt, &ms);
    assert_true(mt <= ms);
    llama_case(ctx, "llama-7b", 8, 2, 256, 2, &mt, &ms);
    assert_true(mt <= ms);
    llama_case(ctx, "llama-7b", 0, 8, 2048, 1, &mt, &ms);
    assert_true(mt <= ms);
    llama_case(ctx, "llama-65b", 0, 1, 512, 1, &mt, &ms);
    assert_true(mt * 5 <= ms);
    print_message("  llama-65b min budget: tide %.3f GB, static-layer %.3f GB\n", mt / 1e9, ms / 1e9);
    tide_ctx_free(ctx);
}

/* Offloaded plans where device memory is host memory (host_addressable, the
 * CPU backend): LLaMA prefill and decode graphs (a 4-layer bf16
 * tinyllama, 32 prompt tokens) with the weights homed on host and on SSD, at
 * 100%, 50%, 25% and 10% of the unconstrained peak (every tensor in the
 * arena: what `tide run --budget X%` takes a percentage of) and at the
 * minimum. Every plan verifies and stays within its budget; no host-homed
 * tensor (weights on host, the cache, inputs, outputs) is loaded, stored or
 * moved: nothing crosses the host link; with the weights on SSD each is read
 * from there at least once; spills go to SSD, none to host memory. With
 * the weights on host the arena holds the activations alone: the in-place
 * peak and minimum are a small part of the weights. */
static void test_in_place_budget(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    tide_llama_config cfg;
    CHECK_OK(ctx, tide_llama_config_named(ctx, "tinyllama-1.1b", &cfg));
    cfg.num_hidden_layers = 4;
    cfg.dtype = TIDE_BF16;
    int n_plans = 0;
    for (int shape = 0; shape < 2; shape++) {
        tide_llama_graph_opts go = {.batch = 1, .seq = shape ? 1 : 32, .ctx_len = 48, .fresh_cache = !shape};
        tide_graph *g = NULL;
        CHECK_OK(ctx, tide_llama_build(ctx, &cfg, &go, &g));
        uint64_t full = tide_plan_unconstrained_peak(ctx, g, &hw, 1), weights = tide_graph_role_bytes(g, TIDE_ROLE_WEIGHT);
        for (int ssd = 0; ssd < 2; ssd++) {
            tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw, .weights_on_ssd = ssd,
                                .host_addressable = true};
            uint64_t act = 0, min = 0;
            CHECK_OK(ctx, tide_plan_peak_unbounded(ctx, g, &o, &act));
            o.device_budget = full;
            CHECK_OK(ctx, tide_plan_min_budget(ctx, g, &o, &min));
            if (ssd ? act < weights / 4 : act > weights / 4 || min > act)
                fail_msg("weights on %s: in place %" PRIu64 ", minimum %" PRIu64 ", unconstrained %" PRIu64
                         ", weights %" PRIu64, ssd ? "ssd" : "host", act, min, full, weights);
            static const double fr[] = {1.0, 0.5, 0.25, 0.10, 0};
            for (int b = 0; b < 5; b++) {
                o.device_budget = fr[b] > 0 ? tide_plan_align((uint64_t)((double)full * fr[b])) : min;
                if (o.device_budget < min) continue;
                tide_plan *p = plan_ok(ctx, g, &o);
                assert_true(p->host_addressable);
                assert_int_equal(p->stats.bytes_h2d + p->stats.bytes_d2h, 0);
                for (int i = 0; i < p->n_ins; i++) {
                    const tide_ins *in = &p->ins[i];
                    if (in->tensor < 0 || g->tensors[in->tensor].role == TIDE_ROLE_TEMP) continue;
                    if (p->home[in->tensor] == TIDE_TIER_HOST && in->kind != TIDE_INS_DROP)
                        fail_msg("%s, weights on %s, budget %.0f%%: %s of host-homed '%s'", shape ? "decode" : "prefill",
                                 ssd ? "ssd" : "host", fr[b] * 100, tide_ins_name(in->kind), g->tensors[in->tensor].name);
                }
                if (ssd) assert_true(p->stats.bytes_ssd_read >= weights);
                assert_int_equal(p->stats.peak_host_bytes, 0);
                assert_int_equal(p->host_spill_bytes, 0);
                tide_plan_free(p);
                n_plans++;
            }
            print_message("  %s, weights on %s: unconstrained peak %.1f MB, in place %.1f MB, minimum %.1f MB\n",
                          shape ? "decode" : "prefill", ssd ? "ssd" : "host", full / 1e6, act / 1e6, min / 1e6);
        }
        tide_graph_free(g);
    }
    assert_true(n_plans >= 16);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- bounds */

static void test_bounds(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    tide_graph *g = random_graph(ctx, 30, 65536);
    tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = 2, .hw = &hw};
    o.device_budget = tide_plan_unconstrained_peak(ctx, g, &hw, 2);
    tide_bounds b;
    CHECK_OK(ctx, tide_plan_bounds(ctx, g, &o, &b));
    assert_true(b.lower_bound_s >= b.compute_s && b.lower_bound_s >= b.link_s);
    assert_true(b.ideal_s >= b.lower_bound_s * 0.999);
    double c = 0;
    for (int i = 0; i < g->n_ops; i++) c += tide_cost_op(&hw, g, &g->ops[i]);
    assert_true(b.compute_s > 2 * c * 0.999 && b.compute_s < 2 * c * 1.001);
    tide_plan *p = plan_ok(ctx, g, &o);
    assert_true(p->stats.makespan_s >= b.lower_bound_s * 0.999);
    tide_plan_free(p);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- faults */

/* Fails the Nth allocation of planning, for every N until one succeeds:
 * each failure is TIDE_E_NOMEM with nothing leaked. */
static void test_alloc_faults(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = test_hw();
    for (int gi = 0; gi < 6; gi++) {
        tide_graph *g = random_graph(ctx, 25, 65536);
        uint64_t ws = tide_graph_max_working_set(g, NULL);
        for (int pol = 0; pol < TIDE_POLICY_INFERENCE_COUNT; pol++) {
            tide_plan_opts o = {.policy = (tide_policy)pol, .n_iter = 1 + gi % 3, .hw = &hw,
                                .device_budget = pol == TIDE_POLICY_STATIC_LAYER ? ws * 8 : ws + ws / 2};
            bool done = false;
            for (long n = 1; !done && n < 100000; n++) {
                int64_t live = tide_alloc_live_bytes();
                tide_plan *p = NULL;
                tide_alloc_fail_nth(n);
                tide_status st = tide_plan_make(ctx, g, &o, &p);
                tide_alloc_fail_nth(0);
                if (st == TIDE_OK) {
                    assert_int_equal(tide_plan_verify(p), TIDE_OK);
                    tide_plan_free(p);
                    done = true;
                } else if (st != TIDE_E_NOMEM && !(pol == TIDE_POLICY_STATIC_LAYER && st == TIDE_E_INFEASIBLE)) {
                    fail_msg("allocation %ld failed: status %d (%s)", n, (int)st, tide_ctx_last_error(ctx));
                } else {
                    assert_null(p);
                    if (st == TIDE_E_INFEASIBLE) done = true;
                }
                if (tide_alloc_live_bytes() != live)
                    fail_msg("%s, allocation %ld failed: %lld bytes leaked", tide_policy_name(o.policy), n,
                             (long long)(tide_alloc_live_bytes() - live));
            }
            assert_true(done);
        }
        tide_graph_free(g);
    }
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifetime),
        cmocka_unit_test(test_belady),
        cmocka_unit_test(test_random_dags),
        cmocka_unit_test(test_small_host),
        cmocka_unit_test(test_placements),
        cmocka_unit_test(test_reserve_message),
        cmocka_unit_test(test_warm_region),
        cmocka_unit_test(test_shared_scratch_iterations),
        cmocka_unit_test(test_host_spill_iterations),
        cmocka_unit_test(test_in_place_budget),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_alloc_faults),
        cmocka_unit_test(test_llama),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
