/*
 * test_collectives.c - data-parallel planning: the network cost formulas
 * (src/cost/cost.c), one rank's step graph under ZeRO-0/1/2
 * (src/train/train_ranks.c), its collectives placed on the net stream
 * (src/planner/planner_net.c) and the verifier's ordering rules for them
 * (src/verify/verify.c), the plan file's round trip and the executor's
 * refusal.
 *
 * What it proves: ring and hierarchical costs match their formulas; planned
 * rank steps (tinyllama-mini, 2 and 8 ranks, every stage) verify, with every
 * collective on the net stream and overlapping computes in the simulation;
 * a rank's optimizer state is 1/N of a full copy under ZeRO-1/2; the
 * verifier rejects a read of a reduce-scattered shard before its
 * reduce-scatter completes, a write to bytes a collective reads before it
 * completes, and a parameter read before its all-gather completes; ZeRO-2
 * over micro-batches reduce-scatters each one's gradients into the shard
 * (summed in place), holds no gradient past its micro-batch, peaks below
 * ZeRO-1 and verifies (its dropped waits rejected); a plan
 * file keeps the collectives and the ranks; a profile without a network and
 * the executor refuse with messages naming the cause.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cost/cost.h"
#include "exec/executor.h"
#include "net/comm.h"
#include "planner/planner.h"
#include "sim/sim.h"
#include "train/train_ranks.h"
#include "verify/verify.h"

static void near(double got, double want) {
    if (fabs(got - want) > 1e-12 + 1e-9 * fabs(want)) fail_msg("got %.17g, want %.17g", got, want);
}

static void test_cost_formulas(void **state) {
    (void)state;
    tide_hw hw = {.net_intra_bw = 100e9, .net_intra_latency_s = 1e-6, .net_gpus_per_node = 8};
    const double B = 8e9;
    double in, out;
    /* one node: rings */
    near(tide_cost_collective(&hw, TIDE_OP_REDUCE_SCATTER, (uint64_t)B, 8, &in, &out), 7.0 / 8 * B / 100e9 + 7e-6);
    near(in, 7.0 / 8 * B);
    near(out, 0);
    near(tide_cost_collective(&hw, TIDE_OP_ALL_GATHER, (uint64_t)B, 4, &in, &out), 3.0 / 4 * B / 100e9 + 3e-6);
    near(tide_cost_collective(&hw, TIDE_OP_ALL_REDUCE, (uint64_t)B, 8, &in, &out),
         2 * 7.0 / 8 * B / 100e9 + 14e-6);
    near(in, 2 * 7.0 / 8 * B);
    near(tide_cost_collective(&hw, TIDE_OP_ALL_REDUCE, (uint64_t)B, 1, &in, &out), 0);
    assert_null(tide_hw_net_missing(&hw, 8));
    assert_non_null(tide_hw_net_missing(&hw, 16)); /* spans nodes: no inter-node network */
    tide_hw none = {0};
    assert_non_null(tide_hw_net_missing(&none, 2));
    assert_null(tide_hw_net_missing(&none, 1));
    /* across nodes: hierarchical, 4 nodes of 8 */
    hw.net_inter_bw = 10e9;
    hw.net_inter_latency_s = 1e-5;
    double rs = 7.0 / 8 * B / 100e9 + 7e-6 + 3.0 / 4 * (B / 8) / 10e9 + 3e-5;
    near(tide_cost_collective(&hw, TIDE_OP_REDUCE_SCATTER, (uint64_t)B, 32, &in, &out), rs);
    near(in, 7.0 / 8 * B);
    near(out, 3.0 / 4 * B / 8);
    near(tide_cost_collective(&hw, TIDE_OP_ALL_REDUCE, (uint64_t)B, 32, &in, &out), 2 * rs);
    assert_null(tide_hw_net_missing(&hw, 32));
}

/* ---------------------------------------------------------------- planned rank steps */

typedef struct job {
    tide_ctx *ctx;
    tide_hw hw;
    tide_graph *g;
    tide_plan *p;
} job;

static void job_free(job *j) {
    tide_plan_free(j->p);
    tide_graph_free(j->g);
    tide_ctx_free(j->ctx);
}

static tide_graph *rank_graph_accum(tide_ctx *ctx, int ranks, int zero, int accum) {
    tide_llama_config cfg;
    assert_int_equal(tide_llama_config_named(ctx, "tinyllama-mini", &cfg), TIDE_OK);
    tide_llama_train_opts o = {.batch = 2, .seq = 32, .accum = accum, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                               .weight_decay = 0.1f, .grad_clip = 1.0f, .ranks = ranks, .zero = zero};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build_train(ctx, &cfg, &o, &g), TIDE_OK);
    return g;
}

static tide_graph *rank_graph(tide_ctx *ctx, int ranks, int zero) { return rank_graph_accum(ctx, ranks, zero, 1); }

/* Plans a rank's step (2 steps) of `accum` micro-batches at `pct` of its
 * unconstrained peak on 8x-h100-80g-nvlink. */
static void plan_rank_accum(job *j, int ranks, int zero, int accum, double pct) {
    j->ctx = tide_ctx_new();
    assert_int_equal(tide_hw_load(j->ctx, TIDE_DATA_PATH "/hw/8x-h100-80g-nvlink.json", &j->hw), TIDE_OK);
    j->g = rank_graph_accum(j->ctx, ranks, zero, accum);
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 2, .hw = &j->hw, .host_budget = UINT64_C(1) << 36};
    uint64_t peak = 0;
    assert_int_equal(tide_plan_peak_unbounded(j->ctx, j->g, &po, &peak), TIDE_OK);
    po.device_budget = tide_plan_align((uint64_t)((double)peak * pct));
    if (tide_plan_make(j->ctx, j->g, &po, &j->p)) fail_msg("planning: %s", tide_ctx_last_error(j->ctx));
    if (tide_plan_verify(j->p)) fail_msg("verifying: %s", tide_ctx_last_error(j->ctx));
}

static void plan_rank(job *j, int ranks, int zero, double pct) { plan_rank_accum(j, ranks, zero, 1, pct); }

static int count_kind(const tide_plan *p, tide_ins_kind k) {
    int n = 0;
    for (int i = 0; i < p->n_ins; i++) n += p->ins[i].kind == k;
    return n;
}

static int count_ops(const tide_graph *g, tide_op_kind k) {
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) n += g->ops[i].kind == k;
    return n;
}

static void test_planned_ranks_verify(void **state) {
    (void)state;
    const int ranks[2] = {2, 8};
    for (int r = 0; r < 2; r++)
        for (int zero = 0; zero <= 2; zero++) {
            job j = {0};
            plan_rank(&j, ranks[r], zero, zero == 1 ? 1.0 : 0.6);
            const tide_plan *p = j.p;
            assert_int_equal(p->ranks, ranks[r]);
            int updates = count_ops(j.g, TIDE_OP_ADAMW);
            assert_true(updates > 0);
            /* per iteration: ZeRO-0 one all-reduce per gradient; ZeRO-1/2 a
             * reduce-scatter and an all-gather per parameter, one all-reduce
             * of the sum of squares */
            assert_int_equal(count_kind(p, TIDE_INS_ALL_REDUCE), 2 * (zero ? 1 : updates));
            assert_int_equal(count_kind(p, TIDE_INS_REDUCE_SCATTER), zero ? 2 * updates : 0);
            assert_int_equal(count_kind(p, TIDE_INS_ALL_GATHER), zero ? 2 * updates : 0);
            for (int i = 0; i < p->n_ins; i++) {
                const tide_ins *in = &p->ins[i];
                assert_int_equal(tide_ins_is_collective(in->kind), in->stream == TIDE_STREAM_NET);
                if (in->kind == TIDE_INS_COMPUTE) assert_false(tide_op_is_collective(j.g->ops[in->op].kind));
            }
            /* the simulation overlaps collectives with computes */
            tide_sim_result sim;
            assert_int_equal(tide_simulate(p, &j.hw, &sim), TIDE_OK);
            int overlapped = 0;
            for (int a = 0; a < sim.n_events && !overlapped; a++) {
                const tide_sim_event *ea = &sim.events[a];
                if (!tide_ins_is_collective(p->ins[ea->ins].kind) || ea->end_s <= ea->start_s) continue;
                for (int b = 0; b < sim.n_events && !overlapped; b++) {
                    const tide_sim_event *eb = &sim.events[b];
                    overlapped = p->ins[eb->ins].kind == TIDE_INS_COMPUTE &&
                                 p->ins[eb->ins].stream == TIDE_STREAM_COMPUTE && eb->start_s < ea->end_s &&
                                 eb->end_s > ea->start_s && eb->end_s > eb->start_s;
                }
            }
            tide_sim_result_free(&sim);
            if (zero != 1) assert_true(overlapped); /* ZeRO-1's follow the backward, beside the optimizer */
            job_free(&j);
        }
}

/* Optimizer state (master weights and moments) of a rank's graph. */
static uint64_t state_bytes(const tide_graph *g) {
    uint64_t n = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        const char *nm = g->tensors[t].name;
        if (!strncmp(nm, "master.", 7) || !strncmp(nm, "exp_avg", 7)) n += g->tensors[t].nbytes;
    }
    return n;
}

static void test_state_bytes_per_rank(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_graph *one = rank_graph(ctx, 1, 0);
    uint64_t full = state_bytes(one);
    assert_true(full > 0);
    for (int n = 2; n <= 8; n *= 2) {
        tide_graph *z0 = rank_graph(ctx, n, 0), *z1 = rank_graph(ctx, n, 1), *z2 = rank_graph(ctx, n, 2);
        /* ZeRO-0: every rank a full copy (N copies in all) */
        assert_true(state_bytes(z0) == full);
        /* ZeRO-1/2: 1/N each, within the rounding of ceil(rows / N) */
        for (int k = 0; k < 2; k++) {
            uint64_t s = state_bytes(k ? z2 : z1);
            assert_true(s * (uint64_t)n >= full);
            assert_true((double)s * n <= (double)full * 1.02);
        }
        tide_graph_free(z0);
        tide_graph_free(z1);
        tide_graph_free(z2);
    }
    /* bad ranks and stages */
    tide_graph *h = NULL;
    assert_int_equal(tide_train_rank_graph(ctx, one, 0, 1, &h), TIDE_E_INVALID);
    assert_int_equal(tide_train_rank_graph(ctx, one, 2, 3, &h), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "--zero"));
    assert_null(h);
    tide_graph_free(one);
    tide_ctx_free(ctx);
}

/* Removes wait `on` from instruction x's list; returns whether it was there. */
static bool drop_wait(tide_plan *p, int x, int on) {
    tide_ins *in = &p->ins[x];
    for (int k = 0; k < in->n_wait; k++)
        if (p->waits[in->wait_at + k] == on) {
            memmove(&p->waits[in->wait_at + k], &p->waits[in->wait_at + k + 1],
                    (size_t)(in->n_wait - k - 1) * sizeof *p->waits);
            in->n_wait--;
            return true;
        }
    return false;
}

static bool reads_dev(const tide_plan *p, const tide_ins *x, int t) {
    if (x->kind != TIDE_INS_COMPUTE || x->place != TIDE_PLACE_DEVICE) return false;
    const tide_op *op = &p->g->ops[x->op];
    for (int k = 0; k < op->n_in; k++)
        if (op->in[k] == t && !tide_ins_host_opnd(x, k)) return true;
    return false;
}

/* The first instruction after collective c that waits on it and computes a
 * reader of its output (*reader) or not (a writer of its bytes); -1. */
static int waiter(const tide_plan *p, int c, bool reader) {
    int t = p->g->ops[p->ins[c].op].out[0];
    for (int x = c + 1; x < p->n_ins; x++) {
        const tide_ins *in = &p->ins[x];
        bool waits = false;
        for (int k = 0; k < in->n_wait; k++) waits = waits || p->waits[in->wait_at + k] == c;
        if (waits && reads_dev(p, in, t) == reader && (reader || in->kind != TIDE_INS_STORE)) return x;
    }
    return -1;
}

/* Drops the wait of a waiter of some collective of kind k (readers or
 * not), expecting the verifier to reject the plan with `what` in its
 * message; other removals it may accept (another path may order them). */
static void planted(job *j, tide_ins_kind k, bool reader, const char *what) {
    int rejected = 0, tried = 0;
    for (int c = 0; c < j->p->n_ins && !rejected; c++) {
        if (j->p->ins[c].kind != k) continue;
        int x = waiter(j->p, c, reader);
        if (x < 0) continue;
        tried++;
        assert_true(drop_wait(j->p, x, c));
        tide_status st = tide_plan_verify(j->p);
        if (st) {
            assert_int_equal(st, TIDE_E_VERIFY);
            const char *msg = tide_ctx_last_error(j->ctx);
            char ref[32];
            snprintf(ref, sizeof ref, "instruction %d", c);
            if (!strstr(msg, what) || !strstr(msg, ref)) fail_msg("unexpected message: %s", msg);
            rejected++;
            if (getenv("TIDE_TEST_VERBOSE")) fprintf(stderr, "rejected as planted: %s\n", msg);
        }
        /* put the wait back (it was dropped from the end of its list or
         * shifted: append it again, order does not matter) */
        tide_ins *in = &j->p->ins[x];
        j->p->waits[in->wait_at + in->n_wait++] = c;
        assert_int_equal(tide_plan_verify(j->p), TIDE_OK);
    }
    if (!tried) fail_msg("no %s with a %s waiter", tide_ins_name(k), reader ? "reading" : "writing");
    assert_true(rejected > 0);
}

static void test_planted_faults(void **state) {
    (void)state;
    job j = {0};
    plan_rank(&j, 2, 2, 0.6);
    /* a read of a shard (its sum of squares, then AdamW) before its
     * reduce-scatter completes */
    planted(&j, TIDE_INS_REDUCE_SCATTER, true, "read-after-write");
    /* a parameter read (the next step's forward) before its all-gather */
    planted(&j, TIDE_INS_ALL_GATHER, true, "read-after-write");
    /* a write over bytes a reduce-scatter reads (the gradient's) before it
     * completes */
    planted(&j, TIDE_INS_REDUCE_SCATTER, false, "");
    /* a collective computed as a COMPUTE, or on the compute stream */
    for (int c = 0; c < j.p->n_ins; c++) {
        if (!tide_ins_is_collective(j.p->ins[c].kind)) continue;
        j.p->ins[c].stream = TIDE_STREAM_COMPUTE;
        assert_int_equal(tide_plan_verify(j.p), TIDE_E_VERIFY);
        assert_non_null(strstr(tide_ctx_last_error(j.ctx), "net stream"));
        j.p->ins[c].stream = TIDE_STREAM_NET;
        tide_ins_kind k = j.p->ins[c].kind;
        j.p->ins[c].kind = TIDE_INS_COMPUTE;
        j.p->ins[c].stream = TIDE_STREAM_COMPUTE;
        assert_int_equal(tide_plan_verify(j.p), TIDE_E_VERIFY);
        assert_non_null(strstr(tide_ctx_last_error(j.ctx), "as a COMPUTE"));
        j.p->ins[c].kind = k;
        j.p->ins[c].stream = TIDE_STREAM_NET;
        j.p->ranks = 3;
        assert_int_equal(tide_plan_verify(j.p), TIDE_E_VERIFY);
        assert_non_null(strstr(tide_ctx_last_error(j.ctx), "ranks"));
        j.p->ranks = 2;
        break;
    }
    assert_int_equal(tide_plan_verify(j.p), TIDE_OK);
    job_free(&j);
}

static bool ends(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* ZeRO-2 over 3 micro-batches: each micro-batch's gradient reduce-scattered
 * after its last write there and summed into the shard, no gradient touched
 * after its reduce-scatter (so none outlives its micro-batch), a smaller
 * peak than ZeRO-1's whole gradients, and plans the verifier proves (and
 * whose dropped waits it rejects). */
static void test_zero2_micro_batches(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_graph *g = rank_graph_accum(ctx, 2, 2, 3);
    int updates = count_ops(g, TIDE_OP_ADAMW), sums = 0;
    assert_int_equal(count_ops(g, TIDE_OP_REDUCE_SCATTER), 3 * updates);
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        if (op->kind == TIDE_OP_ADD && ends(g->tensors[op->out[0]].name, ".shard")) {
            sums++;
            assert_int_equal(op->in[0], op->out[0]); /* in place */
            assert_non_null(strstr(g->tensors[op->in[1]].name, ".shard.mb"));
        }
        if (op->kind != TIDE_OP_REDUCE_SCATTER) continue;
        int x = op->in[0];
        assert_int_equal(strncmp(g->tensors[x].name, "grad.", 5), 0);
        for (int j = i + 1; j < g->n_ops; j++)
            if (tide_op_reads(&g->ops[j], x) || tide_op_writes(&g->ops[j], x))
                fail_msg("'%s' is used by op %d after its reduce-scatter (op %d)", g->tensors[x].name, j, i);
    }
    assert_int_equal(sums, 2 * updates);
    assert_true(tide_graph_find(g, "grad.model.norm.weight.mb2") >= 0);
    /* the peak without a budget: ZeRO-2's below ZeRO-1's */
    tide_hw hw;
    assert_int_equal(tide_hw_load(ctx, TIDE_DATA_PATH "/hw/8x-h100-80g-nvlink.json", &hw), TIDE_OK);
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 2, .hw = &hw, .host_budget = UINT64_C(1) << 36};
    tide_graph *g1 = rank_graph_accum(ctx, 2, 1, 3);
    uint64_t p1 = 0, p2 = 0;
    assert_int_equal(tide_plan_peak_unbounded(ctx, g, &po, &p2), TIDE_OK);
    assert_int_equal(tide_plan_peak_unbounded(ctx, g1, &po, &p1), TIDE_OK);
    if (getenv("TIDE_TEST_VERBOSE")) fprintf(stderr, "peaks: ZeRO-1 %llu, ZeRO-2 %llu\n", (unsigned long long)p1,
                                             (unsigned long long)p2);
    assert_true(p2 < p1);
    tide_graph_free(g);
    tide_graph_free(g1);
    tide_ctx_free(ctx);
    /* planned offloaded, 2 and 3 ranks: verified; a shard's sum read before
     * its reduce-scatter, or the gradient written over, rejected */
    for (int n = 2; n <= 3; n++) {
        job j = {0};
        plan_rank_accum(&j, n, 2, 3, 0.6);
        assert_int_equal(count_kind(j.p, TIDE_INS_REDUCE_SCATTER), 2 * 3 * updates);
        if (n == 2) {
            planted(&j, TIDE_INS_REDUCE_SCATTER, true, "read-after-write");
            planted(&j, TIDE_INS_REDUCE_SCATTER, false, "");
        }
        job_free(&j);
    }
}

static void test_json_round_trip(void **state) {
    (void)state;
    job j = {0};
    plan_rank(&j, 8, 1, 0.7);
    char path[] = "/tmp/tide_collectives_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(tide_plan_save_json(j.p, path), TIDE_OK);
    tide_plan *q = NULL;
    assert_int_equal(tide_plan_load_json(j.ctx, j.g, path, &q), TIDE_OK);
    unlink(path);
    assert_int_equal(q->ranks, 8);
    assert_int_equal(q->n_ins, j.p->n_ins);
    for (int i = 0; i < q->n_ins; i++) {
        const tide_ins *a = &j.p->ins[i], *b = &q->ins[i];
        assert_int_equal(a->kind, b->kind);
        assert_int_equal(a->stream, b->stream);
        assert_int_equal(a->op, b->op);
        assert_int_equal(a->n_wait, b->n_wait);
        assert_memory_equal(a->dev_off, b->dev_off, sizeof a->dev_off);
        for (int k = 0; k < a->n_wait; k++) assert_int_equal(j.p->waits[a->wait_at + k], q->waits[b->wait_at + k]);
    }
    assert_int_equal(tide_plan_verify(q), TIDE_OK);

    /* without the ranks' communicator the executor refuses it, before
     * touching the backend */
    tide_exec *ex = NULL;
    assert_int_equal(tide_exec_new(j.ctx, NULL, q, NULL, &ex), TIDE_E_UNSUPPORTED);
    assert_null(ex);
    assert_non_null(strstr(tide_ctx_last_error(j.ctx), "its collectives need the other ranks"));
    tide_plan_free(q);
    job_free(&j);
}

static void test_profile_without_network(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw;
    assert_int_equal(tide_hw_load(ctx, TIDE_DATA_PATH "/hw/h100-80g.json", &hw), TIDE_OK);
    tide_graph *g = rank_graph(ctx, 2, 1);
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw, .device_budget = UINT64_C(1) << 30};
    tide_plan *p = NULL;
    assert_int_equal(tide_plan_make(ctx, g, &po, &p), TIDE_E_INVALID);
    assert_null(p);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "cannot run collectives over 2 ranks"));
    /* the profiles with a network load their fields */
    assert_int_equal(tide_hw_load(ctx, TIDE_DATA_PATH "/hw/h100-80g-ndr-cluster.json", &hw), TIDE_OK);
    assert_true(hw.net_intra_bw == 450e9 && hw.net_inter_bw == 50e9 && hw.net_gpus_per_node == 8);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* The launch read from the environment (net/comm.c), the rows of each
 * rank's shard, and the launches MPI cannot join. */
static void test_launch_env(void **state) {
    (void)state;
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK",
                                       "SLURM_STEP_NUM_TASKS", "PMIX_RANK", "SLURM_PROCID", "TIDE_WORLD_SIZE",
                                       "TIDE_RANK", "WORLD_SIZE", "RANK"};
    for (size_t k = 0; k < sizeof vars / sizeof vars[0]; k++) unsetenv(vars[k]);
    int r = -1;
    const char *l = NULL;
    assert_int_equal(tide_comm_launch_env(&r, &l), 1);
    assert_int_equal(r, 0);
    assert_string_equal(l, "none");
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    assert_int_equal(tide_comm_launch_env(&r, &l), 3);
    assert_int_equal(r, 2);
    assert_string_equal(l, "mpirun");
    setenv("OMPI_COMM_WORLD_SIZE", "x", 1); /* malformed */
    assert_int_equal(tide_comm_launch_env(&r, &l), -1);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    setenv("SLURM_PROCID", "1", 1);
    assert_int_equal(tide_comm_launch_env(&r, &l), 4);
    assert_int_equal(r, 1);
    assert_string_equal(l, "srun");
    unsetenv("SLURM_STEP_NUM_TASKS");
    unsetenv("SLURM_PROCID");
    /* torchrun-style: named; joined over TCP, which needs MASTER_ADDR */
    setenv("TIDE_WORLD_SIZE", "2", 1);
    setenv("TIDE_RANK", "1", 1);
    unsetenv("MASTER_ADDR");
    assert_int_equal(tide_comm_launch_env(&r, &l), 2);
    assert_string_equal(l, "torchrun");
    tide_ctx *ctx = tide_ctx_new();
    tide_comm *c = (tide_comm *)&r;
    assert_int_equal(tide_comm_open(ctx, &c), TIDE_E_INVALID);
    assert_null(c);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "needs MASTER_ADDR"));
    tide_ctx_free(ctx);
    unsetenv("TIDE_WORLD_SIZE");
    unsetenv("TIDE_RANK");
    /* shards: ceil(rows / n) rows each, the last short or empty */
    int64_t r0, n;
    tide_comm_shard_rows(64, 3, 0, &r0, &n);
    assert_true(r0 == 0 && n == 22);
    tide_comm_shard_rows(64, 3, 2, &r0, &n);
    assert_true(r0 == 44 && n == 20);
    tide_comm_shard_rows(2, 3, 2, &r0, &n);
    assert_true(r0 == 2 && n == 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_formulas),
        cmocka_unit_test(test_launch_env),
        cmocka_unit_test(test_state_bytes_per_rank),
        cmocka_unit_test(test_planned_ranks_verify),
        cmocka_unit_test(test_planted_faults),
        cmocka_unit_test(test_zero2_micro_batches),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_profile_without_network),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
