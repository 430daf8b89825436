/*
 * test_executor.c - the executor runs verified plans for real: offloaded
 * outputs are bit-identical to the unconstrained run for every policy, budget
 * and weight home; injected faults (SSD read/write errors, a full spill
 * directory, failed allocations, two streams failing at once) end in a clean
 * status, reported once, with nothing left behind; two executors share one
 * backend at the same time.
 *
 * What it proves: offloaded outputs bit-identical to the unconstrained run
 * for every policy, budget (100%, 50%, 25%, min) and weight home (host, SSD,
 * pinned copies); a GPU's paths (uploaded weights, host-homed cache,
 * double-buffered SSD reads into device memory) through a CPU backend that
 * reports device memory; tiled graphs (row tiles, weight blocks of 1-2 KiB)
 * at the full budget and their own minimum, and batch-2 forward and
 * generation through the model API with forced and automatic tiling, equal to
 * the untiled run; SSD spills with injected faults; the Nth allocation
 * failing; asynchronous issue on a backend whose queues run behind the caller
 * with random delays (`tests/async_backend.h`): every policy, budget and
 * weight home, spills to host and SSD, direct-to-device reads, resident runs
 * and generation bit-identical to the CPU, measured timelines that respect
 * every wait of the plan, a queued range error reported with its message
 * (each missing or misplaced wait tried was caught); two streams failing at
 * the same moment (a kernel's range error met by an injected copy failure, a
 * bad token met by an SSD read error) reported once, with one cause, clean
 * under ThreadSanitizer; two executors of two plans sharing one backend (CPU,
 * and the asynchronous test backend) from two threads at once, every run
 * bit-identical; ops forced onto the host CPU (CPU and asynchronous backends,
 * budgets 100%, 50%, minimum, weights on host and SSD), host homes used in
 * place and weights warm in a lent arena, every run bit-identical; the
 * co-offload search's own placement (MATMULs or whole first layers on the
 * host CPU), bit-identical at every budget on both; two models
 * on one backend instance, interleaved step by step and from two threads,
 * resident, offloaded and on the plain engine, every logit equal to each
 * model run alone.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "async_backend.h"
#include "core/alloc_test.h"
#include "backend/backend.h"
#include "exec/executor.h"
#include "planner/planner.h"
#include "runtime/tiling.h"
#include "sim/sim.h"
#include "store/ssd_test.h"
#include "trace/trace.h"
#include "verify/verify.h"

#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { SEQ = 7 };

static char model_dir[256], spill_dir[256];
static tide_hw hw;

static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int setup(void **state) {
    (void)state;
    snprintf(model_dir, sizeof model_dir, "/tmp/tide-exec-model-XXXXXX");
    snprintf(spill_dir, sizeof spill_dir, "/tmp/tide-exec-spill-XXXXXX");
    if (!mkdtemp(model_dir) || !mkdtemp(spill_dir)) return -1;
    /* a small model whose weights are mostly in its layers, so low budgets plan */
    tide_llama_config cfg = {
        .name = "exec-test", .hidden_size = 64, .intermediate_size = 128, .num_hidden_layers = 6,
        .num_attention_heads = 4, .num_key_value_heads = 2, .vocab_size = 96,
        .max_position_embeddings = 64, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
        .tie_word_embeddings = false, .dtype = TIDE_BF16,
    };
    tide_ctx *ctx = tide_ctx_new();
    tide_status st = tide_checkpoint_make_synthetic(ctx, &cfg, 7, 0, model_dir);
    if (st) fprintf(stderr, "%s\n", tide_ctx_last_error(ctx));
    tide_ctx_free(ctx);
    hw = (tide_hw){.name = "test", .device_mem_bytes = UINT64_C(1) << 34, .matmul_efficiency = 1,
                   .mem_bw = 1e10, .h2d_bw = 1e10, .d2h_bw = 1e10, .link_latency_s = 1e-6,
                   .launch_s = 1e-6, .host_mem_bytes = UINT64_C(1) << 34, .ssd_count = 1,
                   .ssd_read_bw = 1e9, .ssd_write_bw = 1e9, .ssd_latency_s = 1e-5};
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) hw.flops[d] = 1e10;
    return st ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", model_dir, spill_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A context, the test model's checkpoint (when with_model) and a CPU backend. */
typedef struct env {
    tide_ctx *ctx;
    tide_checkpoint *ck;
    tide_backend *be;
} env;

static env env_open(bool with_model) {
    env e = {.ctx = tide_ctx_new()};
    assert_non_null(e.ctx);
    if (with_model) assert_int_equal(tide_checkpoint_open(e.ctx, model_dir, &e.ck), TIDE_OK);
    assert_int_equal(tide_backend_new(e.ctx, TIDE_BACKEND_CPU, &e.be), TIDE_OK);
    return e;
}

static void env_close(env *e) {
    tide_backend_free(e->be);
    tide_checkpoint_free(e->ck);
    tide_ctx_free(e->ctx);
}

static void prompt(int32_t *tok, int vocab) {
    for (int i = 0; i < SEQ; i++) tok[i] = (int32_t)((3 + 17 * i) % vocab);
}

/* Logits of the unconstrained (resident) run, through the public API. */
static float *resident_logits(tide_checkpoint *ck, tide_backend *be, tide_ctx *ctx) {
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = SEQ};
    assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
    float *ref = malloc((size_t)SEQ * cfg->vocab_size * sizeof *ref);
    int32_t tok[SEQ];
    prompt(tok, cfg->vocab_size);
    assert_int_equal(tide_model_forward(m, tok, 1, SEQ, 0, ref), TIDE_OK);
    tide_model_free(m);
    return ref;
}

typedef struct run_cfg {
    tide_policy policy;
    double fraction;      /* of the unconstrained peak; 0 = the policy's minimum */
    bool weights_on_ssd;
    uint64_t host_budget;
    tide_exec_opts eo;
    int tile_rows;        /* graph tiling (tide_llama_graph_opts) */
    uint64_t tile_weight_bytes;
    bool bad_token;       /* the last prompt token is out of the vocabulary */
    bool timeline;        /* measure the timeline and check it against the plan */
    tide_exec_stats *es;  /* receives the run's stats (may be NULL) */
    /* placements (the tide policy) */
    bool (*on_host)(const tide_graph *g, int op); /* ops computed on the host CPU */
    bool host_addressable; /* host homes used in place (the CPU backend) */
    bool warm;            /* every weight warm at the bottom of the arena, put there
                             before the run; the budget is the plan's own peak */
} run_cfg;

/* A measured timeline respects the plan: every instruction starts after each
 * one it waits on ended (both streams' clocks are one clock), and after the
 * one before it on its stream. */
static void check_timeline(const tide_plan *p, const tide_sim_event *tl, double wall) {
    int last[TIDE_STREAM_COUNT];
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) last[s] = -1;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        assert_int_equal(tl[i].ins, i);
        if (!(tl[i].start_s >= 0 && tl[i].start_s <= tl[i].end_s && tl[i].end_s <= wall + 1e-3))
            fail_msg("instruction %d: measured [%g, %g] s in a run of %g s", i, tl[i].start_s, tl[i].end_s, wall);
        for (int k = 0; k < in->n_wait; k++) {
            int w = p->waits[in->wait_at + k];
            if (tl[i].start_s < tl[w].end_s)
                fail_msg("instruction %d (%s) started at %.6f s, before instruction %d (%s) it waits on ended "
                         "(%.6f s)", i, tide_stream_name(in->stream), tl[i].start_s, w,
                         tide_stream_name(p->ins[w].stream), tl[w].end_s);
        }
        if (last[in->stream] >= 0 && tl[i].start_s < tl[last[in->stream]].end_s)
            fail_msg("instruction %d started before the previous one on its stream ended", i);
        last[in->stream] = i;
    }
}

/* A plan of the all-logits prefill graph under rc, verified, with its
 * executor made and every home bound: the prompt's tokens (its last one out
 * of the vocabulary with rc->bad_token), fresh state, logits out. */
typedef struct planned {
    tide_graph *g;
    tide_plan *p;
    tide_exec *ex;
    void *arena;          /* with rc->warm: the arena, weights already in it */
    tide_backend *be;
    bool *host;
    uint64_t *warm_off;
    void **state;
    float *logits;
    int32_t tok[SEQ], pos[SEQ], next[SEQ];
} planned;

static void planned_free(planned *x) {
    tide_exec_free(x->ex);
    if (x->arena) x->be->vt->dealloc(x->be, x->arena);
    free(x->host);
    free(x->warm_off);
    if (x->state)
        for (int t = 0; t < x->g->n_tensors; t++) free(x->state[t]);
    free(x->state);
    free(x->logits);
    tide_plan_free(x->p);
    tide_graph_free(x->g);
    memset(x, 0, sizeof *x);
}

/* Returns the status of planning, making the executor and binding (the
 * plan is verified); on failure *x holds nothing. */
static tide_status plan_prepare(tide_ctx *ctx, tide_checkpoint *ck, tide_backend *be, const run_cfg *rc,
                                planned *x, tide_plan_stats *ps) {
    memset(x, 0, sizeof *x);
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    tide_llama_graph_opts go = {.batch = 1, .seq = SEQ, .ctx_len = SEQ, .all_logits = true,
                                .tile_rows = rc->tile_rows, .tile_weight_bytes = rc->tile_weight_bytes};
    assert_int_equal(tide_llama_build(ctx, cfg, &go, &x->g), TIDE_OK);
    tide_graph *g = x->g;
    tide_plan_opts po = {.policy = rc->policy, .host_budget = rc->host_budget, .n_iter = 1, .hw = &hw,
                         .weights_on_ssd = rc->weights_on_ssd, .host_addressable = rc->host_addressable};
    x->be = be;
    if (rc->on_host) {
        x->host = calloc((size_t)g->n_ops, sizeof *x->host);
        for (int i = 0; i < g->n_ops; i++) x->host[i] = rc->on_host(g, i);
        po.host_ops = x->host;
    }
    uint64_t warm_bytes = 0;
    if (rc->warm) { /* every weight packed at the bottom of the arena */
        x->warm_off = malloc((size_t)g->n_tensors * sizeof *x->warm_off);
        for (int t = 0; t < g->n_tensors; t++) {
            x->warm_off[t] = TIDE_HOME;
            if (g->tensors[t].role != TIDE_ROLE_WEIGHT) continue;
            x->warm_off[t] = warm_bytes;
            warm_bytes += tide_plan_align(g->tensors[t].nbytes);
        }
        po.warm_off = x->warm_off;
    }
    uint64_t peak = 0;
    assert_int_equal(tide_plan_peak_unbounded(ctx, g, &po, &peak), TIDE_OK);
    if (rc->warm) {
        po.device_budget = warm_bytes + 2 * peak + TIDE_PLAN_ALIGN; /* then shrunk to what the plan uses */
    } else if (rc->fraction > 0) {
        po.device_budget = (uint64_t)(peak * rc->fraction);
    } else {
        assert_int_equal(tide_plan_min_budget(ctx, g, &po, &po.device_budget), TIDE_OK);
    }
    tide_status st = tide_plan_make(ctx, g, &po, &x->p);
    if (st) {
        planned_free(x);
        return st;
    }
    tide_plan *p = x->p;
    if (rc->warm) p->device_budget = p->stats.peak_device_bytes; /* an unconstrained plan's own peak */
    assert_int_equal(tide_plan_verify(p), TIDE_OK);
    if (ps) *ps = p->stats;
    tide_exec_opts eo = rc->eo;
    eo.timed = rc->timeline;
    if (rc->warm) { /* the weights at their warm offsets before the run */
        assert_int_equal(be->vt->alloc(be, p->device_budget, &x->arena), TIDE_OK);
        for (int t = 0; t < g->n_tensors; t++) {
            if (x->warm_off[t] == TIDE_HOME) continue;
            tide_tensor_info ti;
            assert_int_equal(tide_checkpoint_get(ck, g->tensors[t].name, &ti), TIDE_OK);
            assert_int_equal(be->vt->to_device(be, NULL, (char *)x->arena + x->warm_off[t], ti.data, ti.nbytes),
                             TIDE_OK);
        }
        eo.arena = x->arena;
        eo.arena_bytes = p->device_budget;
    }
    st = tide_exec_new(ctx, be, p, &eo, &x->ex);
    x->state = calloc((size_t)g->n_tensors, sizeof *x->state);
    x->logits = calloc((size_t)SEQ * cfg->vocab_size, sizeof *x->logits);
    prompt(x->tok, cfg->vocab_size);
    if (rc->bad_token) x->tok[SEQ - 1] = (int32_t)cfg->vocab_size + 5;
    for (int i = 0; i < SEQ; i++) x->pos[i] = i;
    for (int t = 0; t < g->n_tensors && !st; t++) {
        const tide_tensor *tt = &g->tensors[t];
        if (tt->role == TIDE_ROLE_WEIGHT) {
            tide_tensor_info ti;
            uint64_t off = 0; /* a block of a split weight is a byte range of it */
            assert_int_equal(tide_checkpoint_get(ck, tide_graph_tensor_home(g, t, &off), &ti), TIDE_OK);
            assert_true(off + tt->nbytes <= ti.nbytes);
            st = p->home[t] == TIDE_TIER_SSD ? tide_exec_bind_file(x->ex, t, ti.file, ti.file_offset + off)
                                             : tide_exec_bind_host(x->ex, t, (char *)ti.data + off);
        } else if (tt->role == TIDE_ROLE_STATE) {
            x->state[t] = calloc(1, tt->nbytes);
            st = tide_exec_bind_host(x->ex, t, x->state[t]);
        }
    }
    if (!st) st = tide_exec_bind_host(x->ex, tide_graph_find(g, "tokens"), x->tok);
    if (!st) st = tide_exec_bind_host(x->ex, tide_graph_find(g, "pos"), x->pos);
    if (!st) st = tide_exec_bind_host(x->ex, tide_graph_find(g, "logits"), x->logits);
    if (!st) st = tide_exec_bind_host(x->ex, tide_graph_find(g, "next_token"), x->next);
    if (st) planned_free(x);
    return st;
}

/* Plans, verifies and executes the all-logits prefill graph under rc; returns
 * the status of the run and the logits in *out (caller frees). */
static tide_status run_planned(tide_ctx *ctx, tide_checkpoint *ck, tide_backend *be, const run_cfg *rc,
                               float **out, tide_plan_stats *ps) {
    *out = NULL;
    planned x;
    tide_status st = plan_prepare(ctx, ck, be, rc, &x, ps);
    if (st) return st;
    tide_sim_event *tl = rc->timeline ? calloc((size_t)x.p->n_ins, sizeof *tl) : NULL;
    tide_exec_stats es = {0};
    st = tide_exec_run(x.ex, tl, &es);
    if (!st && tl) check_timeline(x.p, tl, es.wall_s);
    if (rc->es) *rc->es = es;
    free(tl);
    if (!st) {
        *out = x.logits;
        x.logits = NULL;
    }
    planned_free(&x);
    return st;
}

static void test_bit_identical(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    tide_checkpoint *ck = e.ck;
    tide_backend *be = e.be;
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    size_t nbytes = (size_t)SEQ * cfg->vocab_size * sizeof(float);
    float *ref = resident_logits(ck, be, ctx);
    const double fractions[] = {1.0, 0.5, 0.25, 0};
    int runs = 0;
    for (int pol = 0; pol < TIDE_POLICY_INFERENCE_COUNT; pol++)
        for (int f = 0; f < 4; f++)
            for (int ssd = 0; ssd < 2; ssd++) {
                run_cfg rc = {.policy = (tide_policy)pol, .fraction = fractions[f], .weights_on_ssd = ssd,
                              .eo = {.ssd_dirs = spill_dir}};
                float *got = NULL;
                tide_status st = run_planned(ctx, ck, be, &rc, &got, NULL);
                if (st == TIDE_E_INFEASIBLE) {
                    /* a baseline may not plan at a fraction tide can: it must say why */
                    assert_non_null(strstr(tide_ctx_last_error(ctx), "bytes"));
                    assert_int_not_equal(pol, TIDE_POLICY_TIDE);
                    continue;
                }
                if (st) fail_msg("%s f=%g ssd=%d: %s", tide_policy_name(pol), fractions[f], ssd,
                                 tide_ctx_last_error(ctx));
                if (memcmp(got, ref, nbytes))
                    fail_msg("%s at %g of peak, weights on %s: logits differ from the unconstrained run",
                             tide_policy_name(pol), fractions[f], ssd ? "ssd" : "host");
                free(got);
                runs++;
            }
    assert_true(runs >= 16);
    assert_int_equal(dir_entries(spill_dir), 0);
    free(ref);
    env_close(&e);
}

/* Placements in the plan IR run for real, bit-identical to the unconstrained
 * run: ops forced onto the host CPU (the host stream, operands in host
 * memory; on the CPU backend and on the asynchronous test backend, so host
 * computes interleave with queued device work), host homes used in place by
 * device computes, weights kept warm in the arena (twice: a warm arena is
 * reused). */
static bool host_norms_and_some_matmuls(const tide_graph *g, int o) {
    const tide_op *op = &g->ops[o];
    return op->kind == TIDE_OP_RMSNORM || op->kind == TIDE_OP_SILU_MUL || (op->kind == TIDE_OP_MATMUL && o % 3 == 0) ||
           (op->kind == TIDE_OP_ATTENTION && op->layer == 2);
}

static void test_placements(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    const tide_llama_config *cfg = tide_checkpoint_config(e.ck);
    size_t nbytes = (size_t)SEQ * cfg->vocab_size * sizeof(float);
    float *ref = resident_logits(e.ck, e.be, ctx);
    tide_backend *async = NULL;
    tide_async_opts ao = {.jitter_us = 50, .seed = 5, .device_is_host = false};
    assert_int_equal(tide_async_backend_new(ctx, &ao, &async), TIDE_OK);
    tide_backend *bes[2] = {e.be, async};
    const double fractions[] = {1.0, 0.5, 0};
    int runs = 0, host_ins = 0;
    for (int b = 0; b < 2; b++)
        for (int f = 0; f < 3; f++)
            for (int ssd = 0; ssd < 2; ssd++) {
                run_cfg rc = {.fraction = fractions[f], .weights_on_ssd = ssd, .eo = {.ssd_dirs = spill_dir},
                              .on_host = host_norms_and_some_matmuls, .timeline = true};
                planned x;
                tide_status st = plan_prepare(ctx, e.ck, bes[b], &rc, &x, NULL);
                if (st == TIDE_E_INFEASIBLE && fractions[f] < 1) continue; /* below a device op's working set */
                if (st) fail_msg("host placements, %s, f=%g ssd=%d: %s", bes[b]->vt->name, fractions[f], ssd,
                                 tide_ctx_last_error(ctx));
                for (int i = 0; i < x.p->n_ins; i++) host_ins += x.p->ins[i].place == TIDE_PLACE_HOST;
                tide_sim_event *tl = calloc((size_t)x.p->n_ins, sizeof *tl);
                tide_exec_stats es = {0};
                st = tide_exec_run(x.ex, tl, &es);
                if (st) fail_msg("run: %s", tide_ctx_last_error(ctx));
                check_timeline(x.p, tl, es.wall_s);
                if (memcmp(x.logits, ref, nbytes))
                    fail_msg("host placements on %s at %g of peak, weights on %s: logits differ from the "
                             "unconstrained run", bes[b]->vt->name, fractions[f], ssd ? "ssd" : "host");
                free(tl);
                planned_free(&x);
                runs++;
            }
    /* host homes used in place (the CPU backend only: its device memory is host memory) */
    run_cfg ra = {.fraction = 1.0, .host_addressable = true};
    float *got = NULL;
    tide_plan_stats ps;
    assert_int_equal(run_planned(ctx, e.ck, e.be, &ra, &got, &ps), TIDE_OK);
    assert_memory_equal(got, ref, nbytes);
    assert_int_equal(ps.bytes_h2d + ps.bytes_d2h, 0); /* nothing moves */
    free(got);
    planned x; /* a device whose memory is not host memory refuses such a plan, naming why */
    assert_int_equal(plan_prepare(ctx, e.ck, async, &ra, &x, NULL), TIDE_E_UNSUPPORTED);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "cannot address"));
    /* weights warm in the arena, the plan run twice on it */
    for (int b = 0; b < 2; b++) {
        run_cfg rw = {.warm = true};
        assert_int_equal(plan_prepare(ctx, e.ck, bes[b], &rw, &x, &ps), TIDE_OK);
        for (int i = 0; i < x.p->n_ins; i++)
            if (x.p->ins[i].tensor >= 0 && x.warm_off[x.p->ins[i].tensor] != TIDE_HOME)
                fail_msg("instruction %d moves a warm weight", i);
        for (int k = 0; k < 2; k++) {
            memset(x.logits, 0, nbytes);
            assert_int_equal(tide_exec_run(x.ex, NULL, NULL), TIDE_OK);
            assert_memory_equal(x.logits, ref, nbytes);
        }
        planned_free(&x);
    }
    print_message("    %d runs with %d host computes, in-place and warm runs: bit-identical\n", runs, host_ins);
    assert_true(host_ins > 0);
    tide_backend_free(async);
    free(ref);
    env_close(&e);
}

/* Co-offload's own placement (tide_plan_host_place, the search `tide plan
 * --host-compute auto` runs) of the prefill graph on a machine whose link is
 * ten times slower than its host memory: MATMULs, or whole first layers with
 * their attention, on the host CPU. Run on the CPU and on the asynchronous
 * backend (device memory apart from host memory) at the full budget, half
 * of it and the minimum: every run bit-identical to the unconstrained
 * resident run (a half that falls below a device op's working set is left
 * out). */
static const tide_graph *co_graph;
static bool *co_mask;

static bool coffload_placed(const tide_graph *g, int o) {
    if (g != co_graph) { /* a new graph: search its placement */
        free(co_mask);
        co_mask = NULL;
        co_graph = g;
        tide_ctx *ctx = tide_ctx_new();
        tide_hw slow = hw;
        slow.h2d_bw = slow.d2h_bw = 1e9;
        slow.host_mem_bw = 1e10;
        slow.host_flops = 1e10;
        tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &slow};
        po.device_budget = tide_plan_unconstrained_peak(ctx, g, &slow, 1) / 2;
        tide_host_place_info info;
        bool *m = NULL;
        if (tide_plan_host_place(ctx, g, &po, &m, &info)) fail_msg("co-offload: %s", tide_ctx_last_error(ctx));
        tide_ctx_free(ctx);
        co_mask = calloc((size_t)g->n_ops, sizeof *co_mask);
        if (m) memcpy(co_mask, m, (size_t)g->n_ops * sizeof *co_mask);
        tide_free(m);
    }
    return co_mask[o];
}

static void test_coffload(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    const tide_llama_config *cfg = tide_checkpoint_config(e.ck);
    size_t nbytes = (size_t)SEQ * cfg->vocab_size * sizeof(float);
    float *ref = resident_logits(e.ck, e.be, ctx);
    tide_backend *async = NULL;
    tide_async_opts ao = {.jitter_us = 50, .seed = 11, .device_is_host = false};
    assert_int_equal(tide_async_backend_new(ctx, &ao, &async), TIDE_OK);
    tide_backend *bes[2] = {e.be, async};
    const double fractions[] = {1.0, 0.5, 0};
    int runs = 0, host_ins = 0;
    for (int b = 0; b < 2; b++)
        for (int f = 0; f < 3; f++) {
            run_cfg rc = {.fraction = fractions[f], .on_host = coffload_placed, .timeline = true};
            planned x;
            tide_status st = plan_prepare(ctx, e.ck, bes[b], &rc, &x, NULL);
            if (st == TIDE_E_INFEASIBLE && fractions[f] < 1) continue; /* below a device op's working set */
            if (st) fail_msg("co-offload, %s, f=%g: %s", bes[b]->vt->name, fractions[f], tide_ctx_last_error(ctx));
            for (int i = 0; i < x.p->n_ins; i++) host_ins += x.p->ins[i].place == TIDE_PLACE_HOST;
            tide_sim_event *tl = calloc((size_t)x.p->n_ins, sizeof *tl);
            tide_exec_stats es = {0};
            if (tide_exec_run(x.ex, tl, &es)) fail_msg("run: %s", tide_ctx_last_error(ctx));
            check_timeline(x.p, tl, es.wall_s);
            if (memcmp(x.logits, ref, nbytes))
                fail_msg("co-offload on %s at %g of peak: logits differ from the unconstrained run", bes[b]->vt->name,
                         fractions[f]);
            free(tl);
            planned_free(&x);
            runs++;
        }
    print_message("    %d co-offloaded runs with %d host computes: bit-identical\n", runs, host_ins);
    assert_true(host_ins > 0); /* the search placed something on the host */
    free(co_mask);
    co_mask = NULL;
    co_graph = NULL;
    tide_backend_free(async);
    free(ref);
    env_close(&e);
}

/* Tiled graphs (rows in tiles of 3 and 1 tokens, every weight cut into
 * blocks of at most 2 KiB, so the embedding, every matmul and the head run
 * block by block) give the unconstrained untiled run's logits bit for bit, at
 * the full budget and at their own (much smaller) minimum, weights on host and
 * on SSD (block offsets not aligned to anything). */
static void test_tiled_bit_identical(void **state) {
    (void)state;
    env e = env_open(true);
    const tide_llama_config *cfg = tide_checkpoint_config(e.ck);
    size_t nbytes = (size_t)SEQ * cfg->vocab_size * sizeof(float);
    float *ref = resident_logits(e.ck, e.be, e.ctx);
    uint64_t min_untiled = 0;
    {
        tide_llama_graph_opts go = {.batch = 1, .seq = SEQ, .ctx_len = SEQ, .all_logits = true};
        tide_graph *g = NULL;
        assert_int_equal(tide_llama_build(e.ctx, cfg, &go, &g), TIDE_OK);
        tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw};
        assert_int_equal(tide_plan_min_budget(e.ctx, g, &po, &min_untiled), TIDE_OK);
        tide_graph_free(g);
    }
    const struct { int rows; uint64_t wbytes; } tilings[] = {{3, 0}, {0, 2048}, {3, 2048}, {1, 1024}};
    for (size_t i = 0; i < sizeof tilings / sizeof tilings[0]; i++)
        for (int f = 0; f < 2; f++)
            for (int ssd = 0; ssd < 2; ssd++) {
                run_cfg rc = {.policy = TIDE_POLICY_TIDE, .fraction = f ? 0 : 1.0, .weights_on_ssd = ssd,
                              .eo = {.ssd_dirs = spill_dir}, .tile_rows = tilings[i].rows,
                              .tile_weight_bytes = tilings[i].wbytes};
                float *got = NULL;
                tide_plan_stats ps;
                tide_status st = run_planned(e.ctx, e.ck, e.be, &rc, &got, &ps);
                if (st) fail_msg("tiles %d/%llu: %s", tilings[i].rows, (unsigned long long)tilings[i].wbytes,
                                 tide_ctx_last_error(e.ctx));
                if (memcmp(got, ref, nbytes))
                    fail_msg("tiles of %d rows, weight blocks %llu bytes, %s budget, weights on %s: logits differ",
                             tilings[i].rows, (unsigned long long)tilings[i].wbytes, f ? "min" : "full",
                             ssd ? "ssd" : "host");
                if (f && tilings[i].wbytes) /* cutting the weights lowers the floor */
                    assert_true(ps.peak_device_bytes < min_untiled);
                free(got);
            }
    free(ref);
    env_close(&e);
}

/* Batch 2 through the model API: with per-sequence tiles (forced level 1 and
 * the automatic choice under the minimum budget) the logits of a batched
 * forward pass and a generation's tokens and logits equal the resident run's. */
static void test_tiled_model_api(void **state) {
    (void)state;
    env e = env_open(true);
    const tide_llama_config *cfg = tide_checkpoint_config(e.ck);
    const int B = 2;
    int32_t tok[2 * SEQ];
    for (int i = 0; i < B * SEQ; i++) tok[i] = (int32_t)((5 + 13 * i) % cfg->vocab_size);
    size_t n = (size_t)B * SEQ * cfg->vocab_size;
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    int32_t gen_ref[6], gen[6];
    tide_gen_stats s_ref, s;
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = B, .ctx_len = 16};
    assert_int_equal(tide_model_new(e.ctx, e.ck, e.be, &mo, &m), TIDE_OK);
    assert_int_equal(tide_model_forward(m, tok, B, SEQ, 0, ref), TIDE_OK);
    assert_int_equal(tide_model_generate(m, tok, SEQ, 6, gen_ref, &s_ref), TIDE_OK);
    const int tiles[] = {1, 3, TIDE_TILE_AUTO};
    for (int i = 0; i < 3; i++) {
        tide_offload_opts oo = {.budget_kind = tiles[i] == TIDE_TILE_AUTO ? TIDE_BUDGET_MIN : TIDE_BUDGET_FRACTION,
                                .fraction = 0.5, .hw = "h100-80g", .ssd_dirs = spill_dir, .tile = tiles[i]};
        assert_int_equal(tide_model_set_offload(m, &oo), TIDE_OK);
        tide_status st = tide_model_forward(m, tok, B, SEQ, 0, got);
        if (st) fail_msg("tile %d: %s", tiles[i], tide_ctx_last_error(e.ctx));
        if (memcmp(got, ref, n * sizeof *got)) fail_msg("tile %d: batched logits differ", tiles[i]);
        assert_int_equal(tide_model_generate(m, tok, SEQ, 6, gen, &s), TIDE_OK);
        assert_memory_equal(gen, gen_ref, sizeof gen);
        assert_true(s.logits_hash == s_ref.logits_hash);
    }
    tide_offload_opts bad = {.budget_kind = TIDE_BUDGET_MIN, .tile = TIDE_TILE_LEVELS};
    assert_int_equal(tide_model_set_offload(m, &bad), TIDE_E_INVALID);
    tide_model_free(m);
    free(ref);
    free(got);
    env_close(&e);
}

/* A one-layer synthetic model of its own (hidden 256, 4 heads, 2 kv heads,
 * vocabulary 512, bf16) with MLP width `inter`, written under the spill
 * directory, opened on a CPU backend: for tests that need weights larger
 * than the shared model's. synth_close frees it and removes its files. */
typedef struct synth {
    char dir[300];
    tide_ctx *ctx;
    tide_checkpoint *ck;
    tide_backend *be;
} synth;

static synth synth_open(const char *name, int64_t inter, uint64_t seed) {
    tide_llama_config cfg = {.hidden_size = 256, .intermediate_size = inter,
                             .num_hidden_layers = 1, .num_attention_heads = 4, .num_key_value_heads = 2,
                             .vocab_size = 512, .max_position_embeddings = 32, .rms_norm_eps = 1e-5f,
                             .rope_theta = 10000.0f, .dtype = TIDE_BF16};
    snprintf(cfg.name, sizeof cfg.name, "%s", name);
    synth y = {.ctx = tide_ctx_new()};
    snprintf(y.dir, sizeof y.dir, "%s/%s", spill_dir, name);
    assert_int_equal(tide_checkpoint_make_synthetic(y.ctx, &cfg, seed, 0, y.dir), TIDE_OK);
    assert_int_equal(tide_checkpoint_open(y.ctx, y.dir, &y.ck), TIDE_OK);
    assert_int_equal(tide_backend_new(y.ctx, TIDE_BACKEND_CPU, &y.be), TIDE_OK);
    return y;
}

static void synth_close(synth *y) {
    tide_backend_free(y->be);
    tide_checkpoint_free(y->ck);
    tide_ctx_free(y->ctx);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", y->dir);
    assert_int_equal(system(cmd), 0);
}

/* Weights homed in pinned copies (pin_weights 1 forces them on the CPU
 * backend, where auto means no): the same tokens and logits as the resident
 * run, whole weights and weight blocks of a tiled graph alike, and every
 * weight byte counted as pinned; never / auto / weights on SSD pin nothing. */
static void test_pinned_weights(void **state) {
    (void)state;
    env e = env_open(true);
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = 24};
    assert_int_equal(tide_model_new(e.ctx, e.ck, e.be, &mo, &m), TIDE_OK);
    int32_t tok[SEQ], ref[8], got[8];
    prompt(tok, tide_checkpoint_config(e.ck)->vocab_size);
    tide_gen_stats rs, gs;
    assert_int_equal(tide_model_generate(m, tok, SEQ, 8, ref, &rs), TIDE_OK);
    struct {
        int pin, tile;
        bool ssd, pinned;
    } cs[] = {{1, TIDE_TILE_NONE, false, true}, {1, 3, false, true}, {-1, TIDE_TILE_NONE, false, false},
              {0, TIDE_TILE_NONE, false, false}, {1, TIDE_TILE_NONE, true, false}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        tide_offload_opts o = {.budget_kind = TIDE_BUDGET_FRACTION, .fraction = 0.5, .ssd_dirs = spill_dir,
                               .hw = "h100-80g", .pin_weights = cs[i].pin, .tile = cs[i].tile,
                               .weights_on_ssd = cs[i].ssd};
        assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
        tide_status st = tide_model_generate(m, tok, SEQ, 8, got, &gs);
        if (st) fail_msg("case %zu: %s", i, tide_ctx_last_error(e.ctx));
        assert_memory_equal(got, ref, sizeof ref);
        if (cs[i].tile == TIDE_TILE_NONE) assert_true(gs.logits_hash == rs.logits_hash);
        if (cs[i].pinned) assert_true(gs.pinned_weight_bytes == gs.weight_bytes && gs.weight_bytes > 0);
        else assert_true(gs.pinned_weight_bytes == 0);
        assert_string_equal(tide_model_notice(m), "");
    }
    tide_offload_opts bad = {.budget_kind = TIDE_BUDGET_MIN, .pin_weights = 2};
    assert_int_equal(tide_model_set_offload(m, &bad), TIDE_E_INVALID);
    tide_model_free(m);
    env_close(&e);

    /* weight blocks (byte ranges) of pinned copies: a model whose MLP weights
     * (4 MiB) are split at tiling level 6 (blocks of at most 2 MiB) */
    synth y = synth_open("pin-blocks", 8192, 5);
    tide_ctx *ctx = y.ctx;
    assert_int_equal(tide_model_new(ctx, y.ck, y.be, &mo, &m), TIDE_OK);
    assert_int_equal(tide_model_generate(m, tok, SEQ, 4, ref, &rs), TIDE_OK);
    tide_offload_opts o = {.budget_kind = TIDE_BUDGET_MIN, .ssd_dirs = spill_dir, .hw = "h100-80g",
                           .pin_weights = 1, .tile = 6};
    assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
    tide_status st = tide_model_generate(m, tok, SEQ, 4, got, &gs);
    if (st) fail_msg("blocks: %s", tide_ctx_last_error(ctx));
    assert_int_equal(gs.tile_level, 6);
    assert_true(gs.pinned_weight_bytes == gs.weight_bytes);
    assert_memory_equal(got, ref, 4 * sizeof *ref);
    /* row tiles change f32 summation order, so the bit-for-bit reference is
     * the same tiled plan reading the memory-mapped checkpoint */
    tide_gen_stats us;
    o.pin_weights = -1;
    assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
    assert_int_equal(tide_model_generate(m, tok, SEQ, 4, got, &us), TIDE_OK);
    assert_true(us.pinned_weight_bytes == 0 && us.tile_level == 6);
    assert_true(us.logits_hash == gs.logits_hash);
    tide_model_free(m);
    synth_close(&y);
}

/* A stand-in for GPUDirect Storage: pread straight into "device" memory,
 * counted; or a refusal, as on a machine without it. */
static int direct_reads;
static tide_status fake_file_read(tide_backend *be, void *q, int fd, uint64_t off, void *dst, size_t n) {
    tide_ctx *ctx = tide_backend_queue_ctx(be, q);
    direct_reads++;
    /* the descriptor may be O_DIRECT, which refuses unaligned buffers: read
     * through a second descriptor of the same file without it */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int fd2 = open(path, O_RDONLY | O_CLOEXEC);
    if (fd2 < 0) return tide_err(ctx, TIDE_E_IO, "cannot reopen descriptor %d", fd);
    tide_status st = TIDE_OK;
    for (size_t done = 0; done < n && !st;) {
        ssize_t r = pread(fd2, (char *)dst + done, n - done, (off_t)(off + done));
        if (r <= 0) st = tide_err(ctx, TIDE_E_IO, "stand-in direct read failed");
        else done += (size_t)r;
    }
    close(fd2);
    return st;
}
static tide_status no_file_read(tide_backend *be, void *q, int fd, uint64_t off, void *dst, size_t n) {
    (void)fd, (void)off, (void)dst, (void)n;
    direct_reads++;
    return tide_err(tide_backend_queue_ctx(be, q), TIDE_E_UNSUPPORTED, "no direct storage on this test machine");
}

/* The paths a GPU takes, run on the CPU: a CPU backend whose vtable says its
 * memory is not host memory, so the model uploads weights for resident runs,
 * keeps the KV cache's home in host memory, pins weight copies by default,
 * and the executor reads SSD-homed weights through the bounce buffer into
 * "device" memory, double buffered for weights above half of it (8 MiB MLP
 * weights here), with io_uring and with the pread store. Every offloaded
 * generation equals the resident one bit for bit. */
static void test_device_paths(void **state) {
    (void)state;
    synth y = synth_open("device-paths", 16384, 9);
    tide_ctx *ctx = y.ctx;
    tide_backend *be = y.be;
    const tide_backend_vt *host_vt = be->vt;
    tide_backend_vt dev_vt = *host_vt;
    dev_vt.device_is_host = false;
    be->vt = &dev_vt;

    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = 24};
    assert_int_equal(tide_model_new(ctx, y.ck, be, &mo, &m), TIDE_OK);
    int32_t tok[SEQ], ref[6], got[6];
    prompt(tok, tide_checkpoint_config(y.ck)->vocab_size);
    tide_gen_stats rs, gs;
    assert_int_equal(tide_model_generate(m, tok, SEQ, 6, ref, &rs), TIDE_OK);
    struct {
        bool ssd, pread;
    } cs[] = {{true, false}, {true, true}, {false, false}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        tide_offload_opts o = {.budget_kind = TIDE_BUDGET_FRACTION, .fraction = 0.7, .ssd_dirs = spill_dir,
                               .hw = "h100-80g", .weights_on_ssd = cs[i].ssd, .tile = TIDE_TILE_NONE};
        /* the pread path, by the variable src/store/ssd.c reads at the store's opening */
        if (cs[i].pread) setenv("TIDE_SSD_PREAD", "1", 1);
        else unsetenv("TIDE_SSD_PREAD");
        assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
        tide_status st = tide_model_generate(m, tok, SEQ, 6, got, &gs);
        if (st) fail_msg("case %zu: %s", i, tide_ctx_last_error(ctx));
        assert_memory_equal(got, ref, sizeof ref);
        if (gs.logits_hash != rs.logits_hash) fail_msg("case %zu: logits differ from the resident run", i);
        if (cs[i].ssd) {
            assert_true(gs.bytes_ssd_read >= (UINT64_C(8) << 20) && gs.pinned_weight_bytes == 0);
        } else {
            /* on a device backend weights are pinned by default */
            assert_true(gs.pinned_weight_bytes == gs.weight_bytes && gs.bytes_ssd_read == 0);
        }
    }
    unsetenv("TIDE_SSD_PREAD");
    /* direct storage reads (a stand-in for cuFile), then a backend that
     * refuses them: the first refusal turns them off with a notice, and the
     * run goes on through the bounce buffer */
    tide_status (*const reads[2])(tide_backend *, void *, int, uint64_t, void *, size_t) = {fake_file_read,
                                                                                          no_file_read};
    for (int k = 0; k < 2; k++) {
        dev_vt.file_read = reads[k];
        direct_reads = 0;
        tide_offload_opts o = {.budget_kind = TIDE_BUDGET_FRACTION, .fraction = 0.7, .ssd_dirs = spill_dir,
                               .hw = "h100-80g", .weights_on_ssd = true, .direct_storage = true,
                               .tile = TIDE_TILE_NONE};
        assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
        tide_status st = tide_model_generate(m, tok, SEQ, 6, got, &gs);
        if (st) fail_msg("direct storage %d: %s", k, tide_ctx_last_error(ctx));
        assert_true(gs.logits_hash == rs.logits_hash);
        if (k == 0) {
            assert_true(direct_reads > 6);
            assert_string_equal(tide_model_notice(m), "");
        } else {
            assert_true(direct_reads >= 1 && direct_reads <= 2); /* once per graph's executor */
            assert_non_null(strstr(tide_model_notice(m), "no direct storage on this test machine"));
        }
    }
    dev_vt.file_read = NULL;
    /* back to resident: the device copies come back */
    assert_int_equal(tide_model_set_offload(m, NULL), TIDE_OK);
    assert_int_equal(tide_model_generate(m, tok, SEQ, 6, got, &gs), TIDE_OK);
    assert_true(gs.logits_hash == rs.logits_hash);
    tide_model_free(m);
    be->vt = host_vt;
    synth_close(&y);
}

/* The same through the model API with generation: tokens and every logit of
 * prefill and decode steps equal (logits_hash). */
static void test_generate_offloaded(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    tide_checkpoint *ck = e.ck;
    tide_backend *be = e.be;
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = 24};
    assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
    int32_t tok[SEQ], ref[12], got[12];
    prompt(tok, tide_checkpoint_config(ck)->vocab_size);
    tide_gen_stats rs, gs;
    assert_int_equal(tide_model_generate(m, tok, SEQ, 12, ref, &rs), TIDE_OK);
    const char *policies[] = {"tide", "static-layer", "lru"};
    for (int p = 0; p < 3; p++) {
        tide_offload_opts o = {.budget_kind = TIDE_BUDGET_MIN, .policy = policies[p], .ssd_dirs = spill_dir,
                               .hw = TIDE_DATA_PATH "/hw/h100-80g.json"};
        assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
        tide_status st = tide_model_generate(m, tok, SEQ, 12, got, &gs);
        if (st) fail_msg("%s: %s", policies[p], tide_ctx_last_error(ctx));
        assert_memory_equal(got, ref, sizeof ref);
        assert_true(gs.logits_hash == rs.logits_hash);
        assert_true(gs.peak_device_bytes <= gs.budget_bytes);
        /* where device memory is host memory, tide uses the host homes in
         * place (nothing crosses the link); the baselines copy them in */
        if (p == 0 && be->vt->device_is_host) assert_int_equal(gs.bytes_h2d + gs.bytes_d2h, 0);
        else assert_true(gs.bytes_h2d > 0);
    }
    tide_model_free(m);
    env_close(&e);
}

static void test_pread_fallback(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    tide_checkpoint *ck = e.ck;
    tide_backend *be = e.be;
    size_t nbytes = (size_t)SEQ * tide_checkpoint_config(ck)->vocab_size * sizeof(float);
    float *ref = resident_logits(ck, be, ctx), *got = NULL;
    run_cfg rc = {.policy = TIDE_POLICY_TIDE, .fraction = 0, .weights_on_ssd = true,
                  .eo = {.ssd_dirs = spill_dir, .force_pread = true}};
    assert_int_equal(run_planned(ctx, ck, be, &rc, &got, NULL), TIDE_OK);
    assert_memory_equal(got, ref, nbytes);
    free(got);
    free(ref);
    env_close(&e);
}

/* The Nth SSD read fails: a clean TIDE_E_IO naming the instruction, no spill
 * file left, no output claimed. */
static void test_ssd_read_fault(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    tide_checkpoint *ck = e.ck;
    tide_backend *be = e.be;
    for (long n = 1; n <= 5; n += 2) {
        run_cfg rc = {.policy = TIDE_POLICY_TIDE, .fraction = 0, .weights_on_ssd = true,
                      .eo = {.ssd_dirs = spill_dir}};
        float *got = NULL;
        tide_ssd_test_set_faults(&(tide_ssd_faults){.fail_read_nth = n});
        tide_status st = run_planned(ctx, ck, be, &rc, &got, NULL);
        tide_ssd_test_set_faults(NULL);
        assert_int_equal(st, TIDE_E_IO);
        assert_null(got);
        assert_non_null(strstr(tide_ctx_last_error(ctx), "instruction"));
        assert_int_equal(dir_entries(spill_dir), 0);
    }
    env_close(&e);
}

/* A chain of GENERIC ops where an early result is read again at the end: under
 * a tight budget with almost no host space, it must go to SSD and come back. */
static tide_graph *spill_graph(tide_ctx *ctx, int *t_in, int *t_out) {
    tide_graph *g = tide_graph_new(ctx);
    int64_t big = 1 << 18, small = 1000;
    int in, early, prev, out;
    assert_int_equal(tide_graph_add_tensor(g, "in", TIDE_F32, TIDE_ROLE_INPUT, 1, &small, &in), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "early", TIDE_F32, TIDE_ROLE_TEMP, 1, &big, &early), TIDE_OK);
    tide_op_args p = {.flops = 1e6};
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 1, &in, 1, &early, &p, -1, NULL), TIDE_OK);
    prev = early;
    for (int i = 0; i < 6; i++) {
        char name[16];
        snprintf(name, sizeof name, "mid%d", i);
        int t;
        assert_int_equal(tide_graph_add_tensor(g, name, TIDE_F32, TIDE_ROLE_TEMP, 1, &big, &t), TIDE_OK);
        int src = i == 0 ? in : prev;
        assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 1, &src, 1, &t, &p, -1, NULL), TIDE_OK);
        prev = t;
    }
    assert_int_equal(tide_graph_add_tensor(g, "out", TIDE_F32, TIDE_ROLE_OUTPUT, 1, &small, &out), TIDE_OK);
    int last[2] = {early, prev};
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 2, last, 1, &out, &p, -1, NULL), TIDE_OK);
    *t_in = in;
    *t_out = out;
    return g;
}

static tide_status run_spill_host(tide_ctx *ctx, tide_backend *be, uint64_t budget, uint64_t host_budget,
                                  const tide_exec_opts *eo, unsigned char *out, tide_plan_stats *ps,
                                  char *notice, size_t notice_len) {
    int t_in, t_out;
    tide_graph *g = spill_graph(ctx, &t_in, &t_out);
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .device_budget = budget, .host_budget = host_budget,
                         .n_iter = 1, .hw = &hw};
    tide_plan *p = NULL;
    tide_status st = tide_plan_make(ctx, g, &po, &p);
    if (!st) st = tide_plan_verify(p);
    if (!st && ps) *ps = p->stats;
    tide_exec *ex = NULL;
    unsigned char in[4000];
    for (int i = 0; i < 4000; i++) in[i] = (unsigned char)(i * 7 + 1);
    if (!st) st = tide_exec_new(ctx, be, p, eo, &ex);
    if (!st) st = tide_exec_bind_host(ex, t_in, in);
    if (!st) st = tide_exec_bind_host(ex, t_out, out);
    if (!st) st = tide_exec_run(ex, NULL, NULL);
    if (ex && notice) snprintf(notice, notice_len, "%s", tide_exec_notice(ex));
    tide_exec_free(ex);
    tide_plan_free(p);
    tide_graph_free(g);
    return st;
}

static tide_status run_spill(tide_ctx *ctx, tide_backend *be, uint64_t budget, const tide_exec_opts *eo,
                             unsigned char *out, tide_plan_stats *ps) {
    return run_spill_host(ctx, be, budget, 8192, eo, out, ps, NULL, 0);
}

/* With host room the spill goes to the host pool; when it is not pinned the
 * executor says so (one line for the caller to show) and still runs right. */
static void test_host_spill_unpinned(void **state) {
    (void)state;
    env e = env_open(false);
    tide_ctx *ctx = e.ctx;
    tide_backend *be = e.be;
    unsigned char ref[4000], got[4000];
    char notice[256] = "";
    tide_exec_opts eo = {.ssd_dirs = spill_dir};
    assert_int_equal(run_spill(ctx, be, UINT64_C(64) << 20, &eo, ref, NULL), TIDE_OK);
    tide_plan_stats ps;
    tide_exec_opts np = {.ssd_dirs = spill_dir, .no_pin = true};
    tide_status st = run_spill_host(ctx, be, 2 * (UINT64_C(1) << 20) + 65536, UINT64_C(1) << 30, &np, got, &ps,
                                    notice, sizeof notice);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    assert_memory_equal(got, ref, sizeof ref);
    assert_true(ps.bytes_d2h >= (UINT64_C(1) << 20)); /* spilled to host and back */
    assert_non_null(strstr(notice, "not pinned"));
    env_close(&e);
}

/* Asynchronous issue, on a backend with events whose queues really run
 * behind the caller (tests/async_backend.h: each stream a thread that sleeps
 * at random before each item): the executor's compute, h2d and d2h workers
 * queue their work and order it by events only, the io worker waits on the
 * host, and the resident runner queues a whole graph. Every run gives the CPU
 * backend's logits bit for bit (policies, budgets, weights on host and SSD,
 * activations spilled to host and to SSD), the measured timeline (from timing
 * events) respects every wait of the plan, the queues really waited on
 * events, an out-of-range token found by a queued op fails the run with the
 * kernel's message (and the next run is clean), and the synchronous mode
 * (sync_issue, TIDE_EXEC_SYNC=1) gives the same results. */
static void test_async_issue(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    tide_checkpoint *ck = e.ck;
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    size_t nbytes = (size_t)SEQ * cfg->vocab_size * sizeof(float);
    float *ref = resident_logits(ck, e.be, ctx);
    tide_backend *ab = NULL;
    tide_async_opts ao = {.jitter_us = 150, .seed = 11, .device_is_host = false};
    assert_int_equal(tide_async_backend_new(ctx, &ao, &ab), TIDE_OK);
    assert_non_null(ab->vt->event_new);

    float *got = resident_logits(ck, ab, ctx);
    if (memcmp(got, ref, nbytes)) fail_msg("resident run on queues: logits differ from the CPU backend's");
    free(got);

    const double fractions[] = {1.0, 0.5, 0};
    const tide_policy pols[] = {TIDE_POLICY_TIDE, TIDE_POLICY_STATIC_LAYER, TIDE_POLICY_LRU};
    int runs = 0;
    for (int pi = 0; pi < 3; pi++)
        for (int f = 0; f < 3; f++)
            for (int ssd = 0; ssd < 2; ssd++) {
                tide_exec_stats es = {0};
                run_cfg rc = {.policy = pols[pi], .fraction = fractions[f], .weights_on_ssd = ssd,
                              .eo = {.ssd_dirs = spill_dir}, .timeline = true, .es = &es};
                tide_status st = run_planned(ctx, ck, ab, &rc, &got, NULL);
                if (st == TIDE_E_INFEASIBLE && pols[pi] != TIDE_POLICY_TIDE) continue;
                if (st) fail_msg("%s f=%g ssd=%d: %s", tide_policy_name(pols[pi]), fractions[f], ssd,
                                 tide_ctx_last_error(ctx));
                assert_true(es.async);
                if (memcmp(got, ref, nbytes))
                    fail_msg("%s at %g of peak, weights on %s, queued: logits differ from the CPU backend's",
                             tide_policy_name(pols[pi]), fractions[f], ssd ? "ssd" : "host");
                free(got);
                runs++;
            }
    assert_true(runs >= 12);

    /* weights read from SSD straight into "device" memory by the io worker
     * (a stand-in for cuFile, which no queue orders): the io worker must have
     * waited on the host for the readers of the range it overwrites */
    const tide_backend_vt *queued_vt = ab->vt;
    tide_backend_vt direct_vt = *queued_vt;
    direct_vt.file_read = fake_file_read;
    ab->vt = &direct_vt;
    direct_reads = 0;
    for (int pi = 0; pi < 3; pi += 2)
        for (int f = 1; f < 3; f++) {
            run_cfg rc = {.policy = pols[pi], .fraction = fractions[f], .weights_on_ssd = true,
                          .eo = {.ssd_dirs = spill_dir, .direct_storage = true}, .timeline = true};
            tide_status st = run_planned(ctx, ck, ab, &rc, &got, NULL);
            if (st) fail_msg("direct %s f=%g: %s", tide_policy_name(pols[pi]), fractions[f], tide_ctx_last_error(ctx));
            if (memcmp(got, ref, nbytes))
                fail_msg("direct reads, %s at %g of peak: logits differ from the CPU backend's",
                         tide_policy_name(pols[pi]), fractions[f]);
            free(got);
        }
    assert_true(direct_reads > 20);
    ab->vt = queued_vt;

    /* activations spilled to host, then through the host to SSD */
    unsigned char want[4000], have[4000];
    tide_exec_opts eo = {.ssd_dirs = spill_dir};
    assert_int_equal(run_spill(ctx, e.be, UINT64_C(64) << 20, &eo, want, NULL), TIDE_OK);
    uint64_t small = 2 * (UINT64_C(1) << 20) + 65536;
    const uint64_t host_room[2] = {UINT64_C(1) << 30, 8192};
    for (int h = 0; h < 2; h++) {
        tide_plan_stats ps;
        memset(have, 0, sizeof have);
        tide_status st = run_spill_host(ctx, ab, small, host_room[h], &eo, have, &ps, NULL, 0);
        if (st) fail_msg("spill %d: %s", h, tide_ctx_last_error(ctx));
        assert_memory_equal(have, want, sizeof have);
        if (h) assert_true(ps.bytes_ssd_write > 0);
        else assert_true(ps.bytes_d2h > 0);
    }

    uint64_t items = 0, blocked = 0;
    tide_async_backend_counts(ab, &items, &blocked);
    print_message("  %d planned runs and 2 spilling runs on queues: %llu items run, %llu waits held a queue\n",
                  runs, (unsigned long long)items, (unsigned long long)blocked);
    assert_true(items > 1000 && blocked > 0);

    /* a bad token is found by a queued EMBED: the run fails with its message,
     * and the next one is clean */
    run_cfg bad = {.policy = TIDE_POLICY_TIDE, .fraction = 0.5, .eo = {.ssd_dirs = spill_dir}, .bad_token = true};
    assert_int_equal(run_planned(ctx, ck, ab, &bad, &got, NULL), TIDE_E_RANGE);
    assert_null(got);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "outside the vocabulary"));
    bad.bad_token = false;
    assert_int_equal(run_planned(ctx, ck, ab, &bad, &got, NULL), TIDE_OK);
    assert_memory_equal(got, ref, nbytes);
    free(got);

    /* the synchronous mode on the same backend */
    tide_exec_stats es = {0};
    run_cfg sy = {.policy = TIDE_POLICY_TIDE, .fraction = 0, .weights_on_ssd = true,
                  .eo = {.ssd_dirs = spill_dir, .sync_issue = true}, .timeline = true, .es = &es};
    assert_int_equal(run_planned(ctx, ck, ab, &sy, &got, NULL), TIDE_OK);
    assert_false(es.async);
    assert_memory_equal(got, ref, nbytes);
    free(got);

    /* generation through the model API, queued and synchronous (sync_issue,
     * what TIDE_EXEC_SYNC=1 sets in the tide command) */
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = 24};
    int32_t tok[SEQ], want_tok[8], got_tok[8];
    prompt(tok, cfg->vocab_size);
    tide_gen_stats rs, gs;
    assert_int_equal(tide_model_new(ctx, ck, e.be, &mo, &m), TIDE_OK);
    assert_int_equal(tide_model_generate(m, tok, SEQ, 8, want_tok, &rs), TIDE_OK);
    assert_false(rs.async_issue);
    tide_model_free(m);
    for (int k = 0; k < 4; k++) {
        bool sync = k & 1, offload = k & 2;
        tide_model_opts mk = mo;
        mk.sync_issue = sync;
        assert_int_equal(tide_model_new(ctx, ck, ab, &mk, &m), TIDE_OK);
        tide_offload_opts o = {.budget_kind = TIDE_BUDGET_MIN, .ssd_dirs = spill_dir, .hw = "h100-80g"};
        assert_int_equal(tide_model_set_offload(m, offload ? &o : NULL), TIDE_OK);
        tide_status st = tide_model_generate(m, tok, SEQ, 8, got_tok, &gs);
        if (st) fail_msg("generation %d: %s", k, tide_ctx_last_error(ctx));
        assert_memory_equal(got_tok, want_tok, sizeof want_tok);
        assert_true(gs.logits_hash == rs.logits_hash);
        assert_int_equal(gs.async_issue, !sync);
        tide_model_free(m);
    }
    tide_backend_free(ab);
    assert_int_equal(dir_entries(spill_dir), 0);
    free(ref);
    env_close(&e);
}

/* Event calls that fail (as CUDA's do once a queued kernel has faulted):
 * failing the Nth event_wait, event_record or event_sync of a run ends it
 * with a status and a message that says how to name the culprit, never a
 * crash; nothing the run queued is still running when it returns; the next
 * run on the same executor is right. Progress of an asynchronous run reports
 * each layer once, in order. */
static int fail_kind, fail_at, fail_calls;
static tide_status (*real_wait)(tide_backend *, void *, void *), (*real_record)(tide_backend *, void *, void *),
    (*real_sync)(tide_backend *, void *, void *);
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
/* The failure goes where the queue's errors go (a worker's own context). */
static bool fail_now(int kind, tide_backend *be, void *q) {
    pthread_mutex_lock(&fail_mu);
    bool f = kind == fail_kind && ++fail_calls == fail_at;
    pthread_mutex_unlock(&fail_mu);
    if (f) tide_err(tide_backend_queue_ctx(be, q), TIDE_E_BACKEND, "injected event failure");
    return f;
}
static tide_status failing_wait(tide_backend *be, void *q, void *ev) {
    return fail_now(0, be, q) ? TIDE_E_BACKEND : real_wait(be, q, ev);
}
static tide_status failing_record(tide_backend *be, void *q, void *ev) {
    return fail_now(1, be, q) ? TIDE_E_BACKEND : real_record(be, q, ev);
}
static tide_status failing_sync(tide_backend *be, void *q, void *ev) {
    return fail_now(2, be, q) ? TIDE_E_BACKEND : real_sync(be, q, ev);
}

static uint64_t layers_seen[64], items_at[64];
static int n_layers_seen;
static void on_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)total;
    if (strcmp(what, "layer") || n_layers_seen >= 64) return;
    tide_async_backend_counts(user, &items_at[n_layers_seen], NULL);
    layers_seen[n_layers_seen++] = done;
}

static void test_async_failures(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    const tide_llama_config *cfg = tide_checkpoint_config(e.ck);
    size_t nbytes = (size_t)SEQ * cfg->vocab_size * sizeof(float);
    float *ref = resident_logits(e.ck, e.be, ctx);
    tide_backend *ab = NULL;
    tide_async_opts ao = {.jitter_us = 1000, .seed = 23, .device_is_host = false};
    assert_int_equal(tide_async_backend_new(ctx, &ao, &ab), TIDE_OK);
    const tide_backend_vt *queued_vt = ab->vt;
    tide_backend_vt vt = *queued_vt;
    real_wait = vt.event_wait;
    real_record = vt.event_record;
    real_sync = vt.event_sync;
    vt.event_wait = failing_wait;
    vt.event_record = failing_record;
    vt.event_sync = failing_sync;
    ab->vt = &vt;
    static const char *const kinds[3] = {"event_wait", "event_record", "event_sync"};
    float *got = NULL;
    for (int kind = 0; kind < 3; kind++)
        for (int at = 1; at <= 40; at += 13) {
            fail_kind = kind;
            fail_at = at;
            fail_calls = 0;
            /* weights on SSD at the minimum budget: the io worker syncs on events too */
            run_cfg rc = {.policy = TIDE_POLICY_TIDE, .fraction = 0, .weights_on_ssd = true,
                          .eo = {.ssd_dirs = spill_dir}, .timeline = kind == 1};
            tide_status st = run_planned(ctx, e.ck, ab, &rc, &got, NULL);
            if (fail_calls < at) { /* fewer calls of this kind than `at` in a run */
                assert_int_equal(st, TIDE_OK);
                free(got);
                continue;
            }
            if (st != TIDE_E_BACKEND) fail_msg("%s #%d failing: status %s", kinds[kind], at, tide_status_str(st));
            const char *msg = tide_ctx_last_error(ctx);
            /* the base of the timeline is recorded before anything is queued */
            bool before = !strncmp(msg, "starting the run's timeline", 27);
            if (!strstr(msg, "injected event failure") || (!before && !strstr(msg, "TIDE_EXEC_SYNC=1")))
                fail_msg("%s #%d failing: message '%s'", kinds[kind], at, msg);
            assert_null(got);
            /* nothing the failed run queued runs on */
            uint64_t a = 0, b = 0, blocked = 0;
            tide_async_backend_counts(ab, &a, &blocked);
            usleep(20000);
            tide_async_backend_counts(ab, &b, &blocked);
            assert_true(a == b);
        }
    fail_kind = -1;
    ab->vt = queued_vt;

    /* progress: each layer once, in order, and only once the queues have
     * run it (at least as many items run as the graph has ops up to the end
     * of that layer), though the run queues ahead */
    tide_llama_graph_opts go = {.batch = 1, .seq = SEQ, .ctx_len = SEQ, .all_logits = true};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build(ctx, cfg, &go, &g), TIDE_OK);
    uint64_t ops_through[64] = {0};
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].layer >= 0 && g->ops[i].layer < 64) ops_through[g->ops[i].layer] = (uint64_t)i + 1;
    tide_graph_free(g);
    uint64_t items0 = 0;
    tide_async_backend_counts(ab, &items0, NULL);
    tide_ctx_set_progress(ctx, on_progress, ab);
    n_layers_seen = 0;
    run_cfg rc = {.policy = TIDE_POLICY_TIDE, .fraction = 0.5, .eo = {.ssd_dirs = spill_dir}};
    assert_int_equal(run_planned(ctx, e.ck, ab, &rc, &got, NULL), TIDE_OK);
    tide_ctx_set_progress(ctx, NULL, NULL);
    assert_memory_equal(got, ref, nbytes);
    free(got);
    assert_int_equal(n_layers_seen, cfg->num_hidden_layers);
    for (int l = 0; l < n_layers_seen; l++) {
        assert_int_equal(layers_seen[l], l + 1);
        if (items_at[l] - items0 < ops_through[l])
            fail_msg("layer %d reported when %llu items had run; its ops alone are %llu", l + 1,
                     (unsigned long long)(items_at[l] - items0), (unsigned long long)ops_through[l]);
    }

    tide_backend_free(ab);
    free(ref);
    env_close(&e);
}

/* Two streams of one run failing at the same moment (E4): the EMBED of a bad
 * token on the compute stream and a host-to-device copy (a LOAD on another
 * stream) meet at a rendezvous, then fail together, each into its own
 * worker's context: the kernel's range error and an injected copy failure.
 * The run returns one error, naming one of the two causes and not the other,
 * and the caller's context holds it; under ThreadSanitizer nothing races
 * (when the workers wrote the executor's context, this test raced there).
 * Then an SSD read failing on the io stream (fail_read_nth, store/ssd_test.h) while the bad
 * token fails the compute stream, the same.
 *
 * The rendezvous is decided by events, not by time: the copies the EMBED
 * needs (its inputs: the token ids and the embedding table, told apart by
 * their sizes) pass; the first other copy waits for the EMBED, and the EMBED
 * for it. A bound of RV_GUARD_MS only turns a hang (a plan that queued such
 * a copy behind the EMBED's inputs' would be one) into a failure; it is never
 * reached while the rendezvous works, however loaded the machine. */
#define RV_GUARD_MS 60000
static pthread_mutex_t rv_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rv_cv = PTHREAD_COND_INITIALIZER;
static bool rv_compute, rv_copy, rv_met; /* at the rendezvous: the EMBED, a copy; they met */
static size_t rv_pass[2];                /* bytes of the EMBED's inputs: their copies pass */
static tide_status (*real_compute)(tide_backend *, void *, const tide_graph *, const tide_op *, void *const *,
                                   void *const *, void *);
static tide_status (*real_to_device)(tide_backend *, void *, void *, const void *, size_t);

/* Waits (rv_mu held) until the two met, or the hang guard. */
static void rv_wait(void) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += RV_GUARD_MS / 1000;
    while (!rv_met && pthread_cond_timedwait(&rv_cv, &rv_mu, &until) == 0) {
    }
}

/* The EMBED waits for a copy to meet, then fails for real. */
static tide_status meeting_compute(tide_backend *be, void *q, const tide_graph *g, const tide_op *op,
                                   void *const *in, void *const *out, void *scratch) {
    if (op->kind == TIDE_OP_EMBED) {
        pthread_mutex_lock(&rv_mu);
        rv_compute = true;
        rv_met = rv_copy;
        pthread_cond_broadcast(&rv_cv);
        rv_wait();
        pthread_mutex_unlock(&rv_mu);
    }
    return real_compute(be, q, g, op, in, out, scratch);
}

/* The EMBED's own inputs are copied; the first other copy waits for the
 * EMBED and fails with it. */
static tide_status meeting_to_device(tide_backend *be, void *q, void *dst, const void *src, size_t n) {
    pthread_mutex_lock(&rv_mu);
    bool fail = false;
    if (!rv_met && n != rv_pass[0] && n != rv_pass[1]) {
        rv_copy = true;
        rv_met = rv_compute;
        pthread_cond_broadcast(&rv_cv);
        rv_wait();
        fail = rv_met;
        rv_copy = false;
    }
    pthread_mutex_unlock(&rv_mu);
    if (fail) return tide_err(tide_backend_queue_ctx(be, q), TIDE_E_IO, "injected copy failure");
    return real_to_device(be, q, dst, src, n);
}

/* One error, naming exactly one of the two causes (a and b), with its status. */
static void one_cause(tide_status st, tide_ctx *ctx, tide_status sa, const char *a, tide_status sb,
                      const char *b, int *seen_a, int *seen_b) {
    const char *msg = tide_ctx_last_error(ctx);
    bool has_a = strstr(msg, a) != NULL, has_b = strstr(msg, b) != NULL;
    if (has_a == has_b || st != (has_a ? sa : sb) || tide_ctx_last_status(ctx) != st ||
        strncmp(msg, "instruction ", 12))
        fail_msg("status %s, message '%s': want one error naming '%s' or '%s'", tide_status_str(st), msg, a, b);
    *(has_a ? seen_a : seen_b) += 1;
}

static void test_two_failures_at_once(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    tide_backend *be = e.be;
    const tide_backend_vt *host_vt = be->vt;
    tide_backend_vt vt = *host_vt;
    vt.device_is_host = false; /* weights are LOADed: copies on the h2d stream */
    const tide_llama_config *cfg = tide_checkpoint_config(e.ck);
    rv_pass[0] = (size_t)SEQ * sizeof(int32_t);
    rv_pass[1] = (size_t)cfg->vocab_size * (size_t)cfg->hidden_size * tide_dtype_size(cfg->dtype);
    real_compute = vt.compute;
    real_to_device = vt.to_device;
    vt.compute = meeting_compute;
    vt.to_device = meeting_to_device;
    be->vt = &vt;
    int met = 0, range = 0, copy = 0;
    enum { RUNS = 6 };
    for (int r = 0; r < RUNS; r++) {
        rv_compute = rv_copy = rv_met = false;
        run_cfg rc = {.policy = TIDE_POLICY_TIDE, .fraction = 0.5, .eo = {.ssd_dirs = spill_dir}, .bad_token = true};
        float *got = NULL;
        tide_err_clear(ctx);
        tide_status st = run_planned(ctx, e.ck, be, &rc, &got, NULL);
        assert_null(got);
        one_cause(st, ctx, TIDE_E_RANGE, "outside the vocabulary", TIDE_E_IO, "injected copy failure", &range, &copy);
        met += rv_met;
    }
    be->vt = host_vt;
    print_message("  %d runs, %d with both failing at once: %d reported the range error, %d the copy\n", RUNS, met,
                  range, copy);
    assert_int_equal(met, RUNS);

    /* the io stream's SSD read and the compute stream's bad token */
    range = 0;
    int io = 0;
    for (long n = 1; n <= 6; n++) {
        run_cfg rc = {.policy = TIDE_POLICY_TIDE, .fraction = 0, .weights_on_ssd = true, .bad_token = true,
                      .eo = {.ssd_dirs = spill_dir}};
        float *got = NULL;
        tide_ssd_test_set_faults(&(tide_ssd_faults){.fail_read_nth = n});
        tide_status st = run_planned(ctx, e.ck, be, &rc, &got, NULL);
        tide_ssd_test_set_faults(NULL);
        assert_null(got);
        one_cause(st, ctx, TIDE_E_RANGE, "outside the vocabulary", TIDE_E_IO, "SSD read", &range, &io);
        assert_int_equal(dir_entries(spill_dir), 0);
    }
    print_message("  SSD read #1..6 failing too: %d reported the range error, %d the read\n", range, io);
    env_close(&e);
}

/* Two executors of two plans (50% of the peak with weights on host; the
 * minimum with weights on SSD) on ONE backend instance, run at the same time
 * from two threads, each with its own context, run after run: every run's
 * logits equal the unconstrained run's. On the CPU backend and on the
 * asynchronous test backend (queues with random delays), where each
 * executor's queues are its own. */
typedef struct shared_arg {
    planned *x;
    tide_ctx *ctx;
    const float *ref;
    size_t nbytes;
    pthread_barrier_t *start;
    int runs, failed, wrong;
    char why[TIDE_ERRMSG_MAX];
} shared_arg;

/* No cmocka asserts here: off the main thread. */
static void *shared_runner(void *p) {
    shared_arg *a = p;
    for (int r = 0; r < a->runs; r++) {
        pthread_barrier_wait(a->start); /* both runs start together */
        memset(a->x->logits, 0, a->nbytes);
        tide_status st = tide_exec_run(a->x->ex, NULL, NULL);
        if (st && !a->failed++) snprintf(a->why, sizeof a->why, "%s", tide_ctx_last_error(a->ctx));
        if (!st && memcmp(a->x->logits, a->ref, a->nbytes)) a->wrong++;
    }
    return NULL;
}

static void shared_backend_on(tide_backend *be, tide_checkpoint *ck, const float *ref, size_t nbytes) {
    const run_cfg rc[2] = {
        {.policy = TIDE_POLICY_TIDE, .fraction = 0.5, .eo = {.ssd_dirs = spill_dir}},
        {.policy = TIDE_POLICY_TIDE, .fraction = 0, .weights_on_ssd = true, .eo = {.ssd_dirs = spill_dir}},
    };
    planned x[2];
    shared_arg a[2];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    for (int k = 0; k < 2; k++) {
        tide_ctx *ctx = tide_ctx_new();
        assert_non_null(ctx);
        tide_status st = plan_prepare(ctx, ck, be, &rc[k], &x[k], NULL);
        if (st) fail_msg("%s, plan %d: %s", tide_backend_name(be), k, tide_ctx_last_error(ctx));
        a[k] = (shared_arg){.x = &x[k], .ctx = ctx, .ref = ref, .nbytes = nbytes, .start = &start, .runs = 4};
    }
    pthread_t th[2];
    for (int k = 0; k < 2; k++) assert_int_equal(pthread_create(&th[k], NULL, shared_runner, &a[k]), 0);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        if (a[k].failed) fail_msg("%s, executor %d: %d runs failed: %s", tide_backend_name(be), k, a[k].failed,
                                  a[k].why);
        if (a[k].wrong) fail_msg("%s, executor %d: %d runs gave other logits", tide_backend_name(be), k, a[k].wrong);
        planned_free(&x[k]);
        tide_ctx_free(a[k].ctx);
    }
    pthread_barrier_destroy(&start);
    assert_int_equal(dir_entries(spill_dir), 0);
}

static void test_shared_backend(void **state) {
    (void)state;
    env e = env_open(true);
    const tide_llama_config *cfg = tide_checkpoint_config(e.ck);
    size_t nbytes = (size_t)SEQ * cfg->vocab_size * sizeof(float);
    float *ref = resident_logits(e.ck, e.be, e.ctx);
    shared_backend_on(e.be, e.ck, ref, nbytes);
    tide_backend *ab = NULL;
    tide_async_opts ao = {.jitter_us = 200, .seed = 31};
    assert_int_equal(tide_async_backend_new(e.ctx, &ao, &ab), TIDE_OK);
    shared_backend_on(ab, e.ck, ref, nbytes);
    uint64_t items = 0, blocked = 0;
    tide_async_backend_counts(ab, &items, &blocked);
    print_message("  two executors on one cpu-async backend: %llu items run, %llu waits held a queue\n",
                  (unsigned long long)items, (unsigned long long)blocked);
    tide_backend_free(ab);
    free(ref);
    env_close(&e);
}

/* Two models in one process on one backend instance (the CPU's, and the
 * asynchronous test double posing as a device, where resident runs keep
 * weights and cache warm in each model's arena): their forward passes
 * interleaved step by step in one thread, then whole generations from two
 * threads at once, resident, offloaded and on the plain engine; every logit
 * equals the model's own run alone on the plain engine. */
enum { TM_STEPS = 4 };

/* Logits of a prefill then TM_STEPS one-token steps of m (vocab v) into out. */
static tide_status tm_forward(tide_model *m, int v, int step, float *out) {
    int32_t tok[SEQ];
    prompt(tok, v);
    if (step == 0) return tide_model_forward(m, tok, 1, SEQ, 0, out);
    int32_t t = (int32_t)((7 * step + 1) % v);
    return tide_model_forward(m, &t, 1, 1, SEQ + step - 1, out);
}

typedef struct tm_arg {
    tide_model *m;
    tide_ctx *ctx;
    int vocab;
    int32_t tok[8];
    tide_gen_stats gs;
    tide_status st;
    char why[256];
} tm_arg;

static void *tm_generate(void *p) {
    tm_arg *a = p;
    int32_t tok[SEQ];
    prompt(tok, a->vocab);
    a->st = tide_model_generate(a->m, tok, SEQ, 8, a->tok, &a->gs);
    if (a->st) snprintf(a->why, sizeof a->why, "%s", tide_ctx_last_error(a->ctx));
    return NULL;
}

static void two_models_on(tide_backend *be, tide_checkpoint *ck[2], tide_ctx *ctx[2]) {
    tide_model_opts mo = {.max_batch = 1, .ctx_len = SEQ + TM_STEPS + 8};
    int v[2];
    float *ref[2][1 + TM_STEPS];
    int32_t ref_tok[2][8];
    uint64_t ref_hash[2];
    for (int k = 0; k < 2; k++) { /* each alone, on the plain engine */
        v[k] = tide_checkpoint_config(ck[k])->vocab_size;
        tide_model *m = NULL;
        assert_int_equal(tide_model_new(ctx[k], ck[k], be, &mo, &m), TIDE_OK);
        assert_int_equal(tide_model_set_engine(m, TIDE_ENGINE_PLAIN), TIDE_OK);
        for (int s = 0; s <= TM_STEPS; s++) {
            ref[k][s] = malloc((size_t)(s ? 1 : SEQ) * v[k] * sizeof(float));
            assert_int_equal(tm_forward(m, v[k], s, ref[k][s]), TIDE_OK);
        }
        tm_arg a = {.m = m, .ctx = ctx[k], .vocab = v[k]};
        tm_generate(&a);
        assert_int_equal(a.st, TIDE_OK);
        memcpy(ref_tok[k], a.tok, sizeof a.tok);
        ref_hash[k] = a.gs.logits_hash;
        tide_model_free(m);
    }
    for (int mode = 0; mode < 3; mode++) { /* resident, offloaded, plain */
        tide_model *m[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(tide_model_new(ctx[k], ck[k], be, &mo, &m[k]), TIDE_OK);
            tide_offload_opts o = {.budget_kind = k ? TIDE_BUDGET_MIN : TIDE_BUDGET_FRACTION, .fraction = 0.5,
                                   .ssd_dirs = spill_dir, .hw = "h100-80g"};
            if (mode == 1) assert_int_equal(tide_model_set_offload(m[k], &o), TIDE_OK);
            if (mode == 2) assert_int_equal(tide_model_set_engine(m[k], TIDE_ENGINE_PLAIN), TIDE_OK);
        }
        for (int s = 0; s <= TM_STEPS; s++) /* step by step, alternating */
            for (int k = 0; k < 2; k++) {
                size_t n = (size_t)(s ? 1 : SEQ) * v[k];
                float *got = malloc(n * sizeof *got);
                tide_status st = tm_forward(m[k], v[k], s, got);
                if (st) fail_msg("%s, mode %d, model %d, step %d: %s", tide_backend_name(be), mode, k, s,
                                 tide_ctx_last_error(ctx[k]));
                if (memcmp(got, ref[k][s], n * sizeof *got))
                    fail_msg("%s, mode %d: model %d's logits at step %d differ from its run alone",
                             tide_backend_name(be), mode, k, s);
                free(got);
            }
        tm_arg a[2];
        pthread_t th[2];
        for (int k = 0; k < 2; k++) { /* two threads at once, each with its own context */
            a[k] = (tm_arg){.m = m[k], .ctx = ctx[k], .vocab = v[k]};
            assert_int_equal(pthread_create(&th[k], NULL, tm_generate, &a[k]), 0);
        }
        for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
        for (int k = 0; k < 2; k++) {
            if (a[k].st) fail_msg("%s, mode %d, model %d generating: %s", tide_backend_name(be), mode, k, a[k].why);
            assert_memory_equal(a[k].tok, ref_tok[k], sizeof ref_tok[k]);
            assert_true(a[k].gs.logits_hash == ref_hash[k]);
            tide_model_free(m[k]);
        }
    }
    for (int k = 0; k < 2; k++)
        for (int s = 0; s <= TM_STEPS; s++) free(ref[k][s]);
}

static void test_two_models(void **state) {
    (void)state;
    env e = env_open(true);
    synth y = synth_open("second-model", 512, 77);
    tide_checkpoint *ck[2] = {e.ck, y.ck};
    tide_ctx *ctx[2] = {e.ctx, y.ctx};
    two_models_on(e.be, ck, ctx);
    tide_backend *ab = NULL;
    tide_async_opts ao = {.jitter_us = 100, .seed = 9, .device_is_host = false};
    assert_int_equal(tide_async_backend_new(e.ctx, &ao, &ab), TIDE_OK);
    two_models_on(ab, ck, ctx);
    tide_backend_free(ab);
    synth_close(&y);
    env_close(&e);
}

static void test_ssd_spill_faults(void **state) {
    (void)state;
    env e = env_open(false);
    tide_ctx *ctx = e.ctx;
    tide_backend *be = e.be;
    unsigned char ref[4000], got[4000];
    tide_exec_opts eo = {.ssd_dirs = spill_dir};
    assert_int_equal(run_spill(ctx, be, UINT64_C(64) << 20, &eo, ref, NULL), TIDE_OK);
    /* two big tensors fit (one op), so "early" cannot stay while the chain runs */
    tide_plan_stats ps;
    tide_status st = run_spill(ctx, be, 2 * (UINT64_C(1) << 20) + 65536, &eo, got, &ps);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    assert_memory_equal(got, ref, sizeof ref);
    assert_true(ps.bytes_ssd_write >= (UINT64_C(1) << 20));
    assert_true(ps.bytes_ssd_read >= (UINT64_C(1) << 20));
    for (int io = 0; io < 2; io++) {
        tide_exec_opts f = {.ssd_dirs = spill_dir, .force_pread = io};
        tide_ssd_test_set_faults(&(tide_ssd_faults){.fail_write_nth = 1});
        st = run_spill(ctx, be, 2 * (UINT64_C(1) << 20) + 65536, &f, got, NULL);
        tide_ssd_test_set_faults(NULL);
        assert_int_equal(st, TIDE_E_IO);
        assert_non_null(strstr(tide_ctx_last_error(ctx), "SSD write"));
        assert_int_equal(dir_entries(spill_dir), 0);
        tide_exec_opts r = {.ssd_dirs = spill_dir, .force_pread = io};
        tide_ssd_test_set_faults(&(tide_ssd_faults){.fail_read_nth = 1});
        st = run_spill(ctx, be, 2 * (UINT64_C(1) << 20) + 65536, &r, got, NULL);
        tide_ssd_test_set_faults(NULL);
        assert_int_equal(st, TIDE_E_IO);
        assert_int_equal(dir_entries(spill_dir), 0);
    }
    tide_exec_opts full = {.ssd_dirs = spill_dir};
    tide_ssd_test_set_faults(&(tide_ssd_faults){.fallocate_enospc_dir = 1});
    st = run_spill(ctx, be, 2 * (UINT64_C(1) << 20) + 65536, &full, got, NULL);
    tide_ssd_test_set_faults(NULL);
    assert_int_equal(st, TIDE_E_IO);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "space"));
    assert_int_equal(dir_entries(spill_dir), 0);
    tide_exec_opts bad = {.ssd_dirs = "/nonexistent/tide-spill"};
    assert_int_equal(run_spill(ctx, be, 2 * (UINT64_C(1) << 20) + 65536, &bad, got, NULL), TIDE_E_IO);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "/nonexistent/tide-spill"));
    env_close(&e);
}

/* A prefill from position 0 writes the caches fresh: its plans never load
 * their old contents, and the logits are the same bits. */
static void test_fresh_cache(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    tide_checkpoint *ck = e.ck;
    tide_backend *be = e.be;
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    uint64_t h2d[2], state_bytes = 0;
    for (int fresh = 0; fresh < 2; fresh++) {
        tide_llama_graph_opts go = {.batch = 1, .seq = SEQ, .ctx_len = SEQ, .all_logits = true, .fresh_cache = fresh};
        tide_graph *g = NULL;
        assert_int_equal(tide_llama_build(ctx, cfg, &go, &g), TIDE_OK);
        state_bytes = tide_graph_role_bytes(g, TIDE_ROLE_STATE);
        tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw,
                             .device_budget = tide_plan_unconstrained_peak(ctx, g, &hw, 1)};
        tide_plan *p = NULL;
        assert_int_equal(tide_plan_make(ctx, g, &po, &p), TIDE_OK);
        assert_int_equal(tide_plan_verify(p), TIDE_OK);
        h2d[fresh] = p->stats.bytes_h2d;
        tide_plan_free(p);
        tide_graph_free(g);
    }
    assert_true(h2d[1] + state_bytes <= h2d[0]);
    /* same logits through the model API: forward from 0 uses the fresh graph,
     * from 0 again after a run reads nothing stale */
    float *ref = resident_logits(ck, be, ctx);
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = SEQ};
    assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
    tide_offload_opts o = {.budget_kind = TIDE_BUDGET_FRACTION, .fraction = 0.5, .ssd_dirs = spill_dir,
                           .hw = TIDE_DATA_PATH "/hw/h100-80g.json"};
    assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
    float *got = malloc((size_t)SEQ * cfg->vocab_size * sizeof *got);
    int32_t tok[SEQ];
    prompt(tok, cfg->vocab_size);
    assert_int_equal(tide_model_forward(m, tok, 1, SEQ, 0, got), TIDE_OK);
    assert_memory_equal(got, ref, (size_t)SEQ * cfg->vocab_size * sizeof *got);
    free(got);
    free(ref);
    tide_model_free(m);
    /* a fresh attention op refuses positions that are not 0..T-1 */
    tide_graph *g = tide_graph_new(ctx);
    int64_t qs[2] = {2, 8}, ps[1] = {2}, cs[3] = {1, 4, 8};
    int q, k, v, pos, kc, vc, o_;
    assert_int_equal(tide_graph_add_tensor(g, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, qs, &q), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, qs, &k), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, qs, &v), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, ps, &pos), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "kc", TIDE_F32, TIDE_ROLE_STATE, 3, cs, &kc), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "vc", TIDE_F32, TIDE_ROLE_STATE, 3, cs, &vc), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "o", TIDE_F32, TIDE_ROLE_OUTPUT, 2, qs, &o_), TIDE_OK);
    tide_op_args ap = {.n_heads = 1, .n_kv_heads = 1, .head_dim = 8, .batch = 1};
    int in[4] = {q, k, v, pos}, out[3] = {o_, kc, vc};
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_ATTENTION, 4, in, 3, out, &ap, -1, NULL), TIDE_OK);
    float qd[16] = {0}, cache[2][32] = {{0}}, od[16];
    int32_t pd[2] = {1, 2};
    void *ip[4] = {qd, qd, qd, pd}, *op_[3] = {od, cache[0], cache[1]};
    assert_int_equal(be->vt->compute(be, NULL, g, &g->ops[0], ip, op_, NULL), TIDE_E_RANGE);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "fresh"));
    pd[0] = 0;
    pd[1] = 1;
    assert_int_equal(be->vt->compute(be, NULL, g, &g->ops[0], ip, op_, NULL), TIDE_OK);
    tide_graph_free(g);
    env_close(&e);
}

/* The Nth allocation fails anywhere in plan + prepare + run: never a crash,
 * and a failure is reported as a status. */
static void test_alloc_faults(void **state) {
    (void)state;
    env e = env_open(true);
    tide_ctx *ctx = e.ctx;
    tide_checkpoint *ck = e.ck;
    tide_backend *be = e.be;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = SEQ + 2};
    int32_t tok[SEQ], out[3];
    prompt(tok, tide_checkpoint_config(ck)->vocab_size);
    int failures = 0;
    for (long n = 1; n < 4000; n += 37) {
        tide_model *m = NULL;
        int64_t live0 = tide_alloc_live_bytes();
        tide_alloc_fail_nth(n);
        tide_status st = tide_model_new(ctx, ck, be, &mo, &m);
        tide_offload_opts o = {.budget_kind = TIDE_BUDGET_FRACTION, .fraction = 0.5, .ssd_dirs = spill_dir,
                               .hw = TIDE_DATA_PATH "/hw/v100-32g.json"};
        if (!st) st = tide_model_set_offload(m, &o);
        if (!st) st = tide_model_generate(m, tok, SEQ, 3, out, NULL);
        tide_alloc_fail_nth(0);
        if (st) {
            failures++;
            assert_true(st == TIDE_E_NOMEM || st == TIDE_E_BACKEND || st == TIDE_E_IO);
            assert_true(tide_ctx_last_error(ctx)[0] != '\0');
        }
        tide_model_free(m);
        assert_int_equal(tide_alloc_live_bytes(), live0);
    }
    assert_true(failures > 5);
    assert_int_equal(dir_entries(spill_dir), 0);
    env_close(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_placements),
        cmocka_unit_test(test_coffload),
        cmocka_unit_test(test_tiled_bit_identical),
        cmocka_unit_test(test_tiled_model_api),
        cmocka_unit_test(test_pinned_weights),
        cmocka_unit_test(test_device_paths),
        cmocka_unit_test(test_async_issue),
        cmocka_unit_test(test_async_failures),
        cmocka_unit_test(test_two_failures_at_once),
        cmocka_unit_test(test_shared_backend),
        cmocka_unit_test(test_two_models),
        cmocka_unit_test(test_generate_offloaded),
        cmocka_unit_test(test_pread_fallback),
        cmocka_unit_test(test_ssd_read_fault),
        cmocka_unit_test(test_ssd_spill_faults),
        cmocka_unit_test(test_host_spill_unpinned),
        cmocka_unit_test(test_fresh_cache),
        cmocka_unit_test(test_alloc_faults),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
