/*
 * test_recompute.c - recomputation in the planner (src/planner/recompute.c)
 * and the checkpoint-layer policy built on it.
 *
 *   - plans of small training steps (2 and 4 layers, 1 and 2 micro-batches,
 *     two iterations) under checkpoint-layer verify (the verifier's rule V2
 *     proves every recomputation reads the versions its first compute read),
 *     recompute only forward ops of layers whose outputs are TEMPs, before
 *     the backward of their layer, and never an op that updates in place;
 *   - with room for everything, its peak is below lru's (which keeps every
 *     activation) and it stores no activation; at its own peak, where lru
 *     must evict, it moves fewer bytes over the host link than lru;
 *   - on a graph with no backward (inference) the schedule is the graph's:
 *     the same plan as lru, instruction for instruction;
 *   - the tide policy's cheap recomputation, on a slow host link: recomputes,
 *     verifies, and the plan tide_plan_make keeps is no slower.
 *   - a recomputation planted in a real plan from a stale input (an op that
 *     updated a tensor in place) is rejected by the verifier (test_verify.c's
 *     test_recompute does the same on a hand-built plan).
 *   - zero-offload plans (the same steps, at room for everything, a quarter
 *     of it and the policy's minimum) verify, put every ADAMW on the host
 *     and no other op, STORE each gradient to host before any COMPUTE of
 *     another layer after the one that wrote it, recompute as
 *     checkpoint-layer does, and peak below checkpoint-layer (no master or
 *     moment on the device); an inference graph or a caller's host
 *     placement is refused with the reason.
 * Bit-identity of checkpoint-layer steps and of tide steps that recompute
 * (and of zero-offload steps) against the resident step is in test_train.c (test_offload_bit_identical,
 * test_tide_recompute_bit_identical).
 *
 * What it proves: checkpoint-layer plans of small training steps (2 and 4
 * layers, 1 and 2 micro-batches) verify, recompute only forward ops of layers
 * (TEMP outputs, no in-place update), peak below lru's keep-everything plan
 * with no activation stored, less host traffic than lru at checkpoint-layer's
 * own peak; the same plan as lru on an inference graph; the tide policy's
 * cheap recomputation on a slow link verifies and `tide_plan_make` keeps the
 * faster plan; a recomputation planted in a real plan from a stale input (an
 * op that updated a tensor in place) rejected by the verifier; zero-offload
 * plans of the same steps (room for everything, a quarter of it, its minimum)
 * verify, place every ADAMW and nothing else on the host, store each gradient
 * to host before any COMPUTE of another layer, recompute as checkpoint-layer,
 * peak below checkpoint-layer; an inference graph and a caller's host
 * placement refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner/planner.h"
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
    return h;
}

static tide_llama_config tiny_cfg(int layers) {
    tide_llama_config c = {.hidden_size = 64, .intermediate_size = 128, .num_hidden_layers = layers,
                           .num_attention_heads = 4, .num_key_value_heads = 2, .vocab_size = 96,
                           .max_position_embeddings = 64, .rms_norm_eps = 1e-5f, .rope_theta = 10000.f,
                           .dtype = TIDE_F32};
    snprintf(c.name, sizeof c.name, "tiny");
    return c;
}

#define CHECK_OK(ctx, expr)                                                                    \
    do {                                                                                       \
        tide_status st_ = (expr);                                                              \
        if (st_) fail_msg("%s: %s (%s)", #expr, tide_status_str(st_), tide_ctx_last_error(ctx)); \
    } while (0)

static tide_plan *plan_verified(tide_ctx *ctx, const tide_graph *g, tide_policy pol, uint64_t budget) {
    tide_hw hw = test_hw();
    tide_plan_opts o = {.policy = pol, .device_budget = budget, .n_iter = 2, .hw = &hw};
    tide_plan *p = NULL;
    if (tide_plan_make(ctx, g, &o, &p))
        fail_msg("%s plan at %" PRIu64 " bytes: %s", tide_policy_name(pol), budget, tide_ctx_last_error(ctx));
    if (tide_plan_verify(p))
        fail_msg("%s plan at %" PRIu64 " bytes fails verification: %s", tide_policy_name(pol), budget,
                 tide_ctx_last_error(ctx));
    assert_true(p->stats.peak_device_bytes <= budget);
    return p;
}

/* Bytes that hold every tensor and the largest scratch at once. */
static uint64_t all_bytes(const tide_graph *g) {
    uint64_t s = 0, sc = 0;
    for (int t = 0; t < g->n_tensors; t++) s += tide_plan_align(g->tensors[t].nbytes);
    for (int i = 0; i < g->n_ops; i++) sc = sc > g->ops[i].scratch_bytes ? sc : g->ops[i].scratch_bytes;
    return s + tide_plan_align(sc);
}

/* Checks the recomputations of p: each is an op already computed in its
 * iteration, of a layer, writing TEMPs only, reading none of its outputs
 * (no in-place update); a later op of the same layer comes before the end of
 * the iteration (its backward). Returns their number. */
static int check_recomputations(const tide_plan *p) {
    const tide_graph *g = p->g;
    int *seen = calloc((size_t)g->n_ops, sizeof *seen), n = 0;
    assert_non_null(seen);
    int iter = -1;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->kind != TIDE_INS_COMPUTE) continue;
        if (in->iter != iter) {
            memset(seen, 0, (size_t)g->n_ops * sizeof *seen);
            iter = in->iter;
        }
        if (!seen[in->op]++) continue;
        n++;
        const tide_op *op = &g->ops[in->op];
        assert_true(op->layer >= 0);
        for (int j = 0; j < op->n_out; j++) {
            assert_int_equal(g->tensors[op->out[j]].role, TIDE_ROLE_TEMP);
            assert_false(tide_op_reads(op, op->out[j]));
        }
        bool later = false;
        for (int k = in->op + 1; k < g->n_ops && !later; k++) later = g->ops[k].layer == op->layer && !seen[k];
        assert_true(later);
    }
    free(seen);
    return n;
}

/* Bytes of TEMP tensors stored off the device. */
static uint64_t temp_stored(const tide_plan *p) {
    uint64_t b = 0;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->kind == TIDE_INS_STORE && p->g->tensors[in->tensor].role == TIDE_ROLE_TEMP)
            b += p->g->tensors[in->tensor].nbytes;
    }
    return b;
}

static void test_checkpoint_layer_train(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    static const int cases[][4] = {{2, 4, 64, 1}, {2, 8, 64, 2}, {4, 8, 64, 1}}; /* layers, B, T, accum */
    for (int c = 0; c < 3; c++) {
        tide_llama_config cfg = tiny_cfg(cases[c][0]);
        tide_llama_train_opts to = {.batch = cases[c][1], .seq = cases[c][2], .accum = cases[c][3], .beta1 = 0.9f,
                                    .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
        tide_graph *g = NULL;
        assert_int_equal(tide_llama_build_train(ctx, &cfg, &to, &g), TIDE_OK);
        uint64_t big = all_bytes(g);
        tide_plan *keep = plan_verified(ctx, g, TIDE_POLICY_LRU, big);
        tide_plan *ck = plan_verified(ctx, g, TIDE_POLICY_CHECKPOINT_LAYER, big);
        int n_re = check_recomputations(ck);
        assert_int_equal(check_recomputations(keep), 0);
        /* every layer of every micro-batch recomputes, in both iterations */
        assert_true(n_re >= 2 * cfg.num_hidden_layers * to.accum);
        assert_true(ck->stats.peak_device_bytes < keep->stats.peak_device_bytes);
        assert_int_equal(temp_stored(ck), 0);
        assert_true(ck->stats.compute_s > keep->stats.compute_s);
        print_message("  %d layers, %d x %d x %d: peak %" PRIu64 " (lru, all kept) -> %" PRIu64
                      " (checkpoint-layer), %d recomputations\n",
                      cfg.num_hidden_layers, to.batch, to.seq, to.accum, keep->stats.peak_device_bytes,
                      ck->stats.peak_device_bytes, n_re);
        /* at checkpoint-layer's own peak lru must evict: more traffic */
        uint64_t tight = ck->stats.peak_device_bytes;
        tide_plan *lt = plan_verified(ctx, g, TIDE_POLICY_LRU, tight);
        tide_plan *ct = plan_verified(ctx, g, TIDE_POLICY_CHECKPOINT_LAYER, tight);
        assert_true(ct->stats.bytes_h2d + ct->stats.bytes_d2h < lt->stats.bytes_h2d + lt->stats.bytes_d2h);
        tide_plan_free(lt);
        tide_plan_free(ct);
        tide_plan_free(keep);
        tide_plan_free(ck);
        tide_graph_free(g);
    }
    tide_ctx_free(ctx);
}

/* Recomputations of a plan that read a TEMP another recomputation of the
 * same iteration made since that tensor's first compute: the links of
 * chains. */
static int chain_links(const tide_plan *p) {
    const tide_graph *g = p->g;
    int *seen = calloc((size_t)g->n_ops, sizeof *seen), links = 0, iter = -1;
    int *made = calloc((size_t)g->n_tensors, sizeof *made); /* 1: first compute, 2: a recomputation */
    assert_non_null(seen);
    assert_non_null(made);
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->kind != TIDE_INS_COMPUTE) continue;
        if (in->iter != iter) {
            memset(seen, 0, (size_t)g->n_ops * sizeof *seen);
            memset(made, 0, (size_t)g->n_tensors * sizeof *made);
            iter = in->iter;
        }
        const tide_op *op = &g->ops[in->op];
        bool again = seen[in->op]++ > 0;
        for (int k = 0; again && k < op->n_in; k++) links += made[op->in[k]] == 2;
        for (int k = 0; k < op->n_out; k++) made[op->out[k]] = again ? 2 : 1;
    }
    free(seen);
    free(made);
    return links;
}

/* The tide policy's cheap recomputation (recompute_cheap, which
 * tide_plan_make tries by itself): on a slow host link (20 MB/s) cheap
 * producers are recomputed, their plans verify, and tide_plan_make keeps a
 * plan no slower than either; likewise with chains of producers. */
static void test_tide_cheap(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_llama_config cfg = tiny_cfg(2);
    tide_llama_train_opts to = {.batch = 8, .seq = 64, .accum = 1, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                .weight_decay = 0.1f, .grad_clip = 1.0f};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build_train(ctx, &cfg, &to, &g), TIDE_OK);
    tide_hw hw = test_hw();
    hw.h2d_bw = hw.d2h_bw = 2e7;
    tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .device_budget = all_bytes(g) / 4, .n_iter = 2, .hw = &hw};
    tide_plan *best = NULL, *cheap = NULL;
    CHECK_OK(ctx, tide_plan_make(ctx, g, &o, &best));
    o.recompute_cheap = true;
    CHECK_OK(ctx, tide_plan_make(ctx, g, &o, &cheap));
    CHECK_OK(ctx, tide_plan_verify(best));
    CHECK_OK(ctx, tide_plan_verify(cheap));
    assert_true(check_recomputations(cheap) > 0);
    assert_true(best->stats.makespan_s <= cheap->stats.makespan_s);
    /* chains (recompute_chain): more ops recomputed, some reading what
     * another recomputation made just before; verified; tide_plan_make's
     * choice no slower */
    o.recompute_chain = 3;
    tide_plan *chain = NULL;
    CHECK_OK(ctx, tide_plan_make(ctx, g, &o, &chain));
    CHECK_OK(ctx, tide_plan_verify(chain));
    int n_single = check_recomputations(cheap), n_chain = check_recomputations(chain);
    print_message("  recomputations per plan: single ops %d, chains %d; makespans best %.4g, single %.4g, chains "
                  "%.4g s\n", n_single, n_chain, best->stats.makespan_s, cheap->stats.makespan_s,
                  chain->stats.makespan_s);
    assert_true(n_chain > n_single);
    assert_true(chain_links(chain) > 0);
    assert_true(best->stats.makespan_s <= chain->stats.makespan_s);
    tide_plan_free(chain);
    tide_plan_free(best);
    tide_plan_free(cheap);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* A planted fault in a real checkpoint-layer plan: a recomputation renamed to
 * an op that updated a tensor in place earlier in the iteration (a backward
 * op accumulating into a gradient) would read that tensor at a newer version
 * than its first compute did; the verifier rejects it as a recomputation
 * from a stale input. */
static void test_stale_recompute_rejected(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_llama_config cfg = tiny_cfg(2);
    tide_llama_train_opts to = {.batch = 2, .seq = 16, .accum = 2, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                .weight_decay = 0.1f, .grad_clip = 1.0f};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build_train(ctx, &cfg, &to, &g), TIDE_OK);
    tide_plan *p = plan_verified(ctx, g, TIDE_POLICY_CHECKPOINT_LAYER, all_bytes(g));
    /* the first recomputation after an in-place op of the same iteration */
    bool *done = calloc((size_t)g->n_ops, sizeof *done);
    assert_non_null(done);
    int inplace = -1, x = -1;
    for (int i = 0; i < p->n_ins && x < 0; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->kind != TIDE_INS_COMPUTE || in->iter != 0) continue;
        const tide_op *op = &g->ops[in->op];
        if (done[in->op] && inplace >= 0) x = i;
        done[in->op] = true;
        for (int j = 0; j < op->n_out && inplace < 0; j++)
            if (tide_op_reads(op, op->out[j])) inplace = in->op;
    }
    free(done);
    assert_true(inplace >= 0 && x >= 0);
    p->ins[x].op = inplace;
    assert_int_not_equal(tide_plan_verify(p), TIDE_OK);
    const char *msg = tide_ctx_last_error(ctx);
    if (!strstr(msg, "recomputation from a stale input")) fail_msg("rejected for another reason: %s", msg);
    tide_plan_free(p);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* Checks a zero-offload plan: every ADAMW COMPUTE on the host and nothing
 * else there; each gradient (what an ADAMW reads and does not update) that a
 * device COMPUTE writes is STOREd to host before the first later device
 * COMPUTE of another layer. Returns the number of gradient STOREs. */
static int check_zero_offload(const tide_plan *p) {
    const tide_graph *g = p->g;
    bool *grad = calloc((size_t)g->n_tensors, sizeof *grad);
    int *pending = malloc((size_t)g->n_tensors * sizeof *pending); /* writer's layer, INT_MIN none */
    assert_true(grad && pending);
    int n_adamw = 0, n_host = 0, n_stores = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        if (op->kind != TIDE_OP_ADAMW) continue;
        n_adamw++;
        for (int k = 0; k < op->n_in; k++)
            if (!tide_op_writes(op, op->in[k])) grad[op->in[k]] = true;
    }
    for (int t = 0; t < g->n_tensors; t++) pending[t] = INT32_MIN;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->kind == TIDE_INS_STORE && grad[in->tensor] && in->dst == TIDE_TIER_HOST) {
            if (pending[in->tensor] != INT32_MIN) n_stores++;
            pending[in->tensor] = INT32_MIN;
        }
        if (in->kind != TIDE_INS_COMPUTE) continue;
        const tide_op *op = &g->ops[in->op];
        assert_int_equal(in->place == TIDE_PLACE_HOST, op->kind == TIDE_OP_ADAMW);
        if (in->place == TIDE_PLACE_HOST) {
            n_host++;
            continue;
        }
        for (int t = 0; t < g->n_tensors; t++)
            if (pending[t] != INT32_MIN && pending[t] != op->layer)
                fail_msg("gradient '%s' (written by layer %d) not stored before op %d of layer %d", g->tensors[t].name,
                         pending[t], in->op, op->layer);
        for (int k = 0; k < op->n_out; k++)
            if (grad[op->out[k]]) pending[op->out[k]] = op->layer;
    }
    assert_int_equal(n_host, n_adamw * p->n_iter);
    free(grad);
    free(pending);
    return n_stores;
}

static void test_zero_offload_train(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    static const int cases[][4] = {{2, 4, 64, 1}, {2, 8, 64, 2}, {4, 8, 64, 1}}; /* layers, B, T, accum */
    tide_hw hw = test_hw();
    for (int c = 0; c < 3; c++) {
        tide_llama_config cfg = tiny_cfg(cases[c][0]);
        tide_llama_train_opts to = {.batch = cases[c][1], .seq = cases[c][2], .accum = cases[c][3], .beta1 = 0.9f,
                                    .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
        tide_graph *g = NULL;
        assert_int_equal(tide_llama_build_train(ctx, &cfg, &to, &g), TIDE_OK);
        int n_params = 0;
        for (int i = 0; i < g->n_ops; i++) n_params += g->ops[i].kind == TIDE_OP_ADAMW;
        tide_plan_opts mo = {.policy = TIDE_POLICY_ZERO_OFFLOAD, .n_iter = 2, .hw = &hw};
        uint64_t min = 0;
        CHECK_OK(ctx, tide_plan_min_budget(ctx, g, &mo, &min));
        uint64_t budgets[3] = {all_bytes(g), all_bytes(g) / 4, min};
        for (int b = 0; b < 3; b++) {
            if (budgets[b] < min) continue;
            tide_plan *z = plan_verified(ctx, g, TIDE_POLICY_ZERO_OFFLOAD, budgets[b]);
            /* every gradient goes down at least once per iteration */
            assert_true(check_zero_offload(z) >= n_params * z->n_iter);
            assert_true(check_recomputations(z) >= 2 * cfg.num_hidden_layers * to.accum);
            if (b == 0) {
                tide_plan *ck = plan_verified(ctx, g, TIDE_POLICY_CHECKPOINT_LAYER, budgets[b]);
                assert_true(z->stats.peak_device_bytes < ck->stats.peak_device_bytes);
                print_message("  %d layers, %d x %d x %d: peak %" PRIu64 " (checkpoint-layer) -> %" PRIu64
                              " (zero-offload); its minimum %" PRIu64 "\n", cfg.num_hidden_layers, to.batch, to.seq,
                              to.accum, ck->stats.peak_device_bytes, z->stats.peak_device_bytes, min);
                tide_plan_free(ck);
            }
            tide_plan_free(z);
        }
        /* a placement of the caller's is not taken */
        bool *mask = calloc((size_t)g->n_ops, sizeof *mask);
        assert_non_null(mask);
        tide_plan_opts o = {.policy = TIDE_POLICY_ZERO_OFFLOAD, .device_budget = all_bytes(g), .n_iter = 2,
                            .hw = &hw, .host_ops = mask};
        tide_plan *p = NULL;
        assert_int_not_equal(tide_plan_make(ctx, g, &o, &p), TIDE_OK);
        assert_null(p);
        free(mask);
        tide_graph_free(g);
    }
    /* inference: no AdamW to place */
    tide_llama_config cfg = tiny_cfg(2);
    tide_graph *g = NULL;
    tide_llama_graph_opts go = {.batch = 2, .seq = 16};
    assert_int_equal(tide_llama_build(ctx, &cfg, &go, &g), TIDE_OK);
    tide_plan_opts o = {.policy = TIDE_POLICY_ZERO_OFFLOAD, .device_budget = all_bytes(g), .n_iter = 2, .hw = &hw};
    tide_plan *p = NULL;
    assert_int_equal(tide_plan_make(ctx, g, &o, &p), TIDE_E_INVALID);
    if (!strstr(tide_ctx_last_error(ctx), "this graph has none"))
        fail_msg("refused for another reason: %s", tide_ctx_last_error(ctx));
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* Without a backward there is nothing to recompute: the same plan as lru. */
static void test_checkpoint_layer_inference(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_llama_config cfg = tiny_cfg(2);
    tide_graph *g = NULL;
    tide_llama_graph_opts go = {.batch = 2, .seq = 16};
    assert_int_equal(tide_llama_build(ctx, &cfg, &go, &g), TIDE_OK);
    uint64_t b = all_bytes(g) / 2;
    tide_plan *a = plan_verified(ctx, g, TIDE_POLICY_LRU, b);
    tide_plan *c = plan_verified(ctx, g, TIDE_POLICY_CHECKPOINT_LAYER, b);
    assert_int_equal(a->n_ins, c->n_ins);
    for (int i = 0; i < a->n_ins; i++) {
        assert_int_equal(a->ins[i].kind, c->ins[i].kind);
        assert_int_equal(a->ins[i].op, c->ins[i].op);
        assert_int_equal(a->ins[i].tensor, c->ins[i].tensor);
        assert_true(a->ins[i].dev_off[0] == c->ins[i].dev_off[0]);
    }
    assert_int_equal(check_recomputations(c), 0);
    tide_plan_free(a);
    tide_plan_free(c);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_layer_train),
        cmocka_unit_test(test_checkpoint_layer_inference),
        cmocka_unit_test(test_tide_cheap),
        cmocka_unit_test(test_stale_recompute_rejected),
        cmocka_unit_test(test_zero_offload_train),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
