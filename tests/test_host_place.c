/*
 * test_host_place.c - planning quantized inference and its co-offload
 * (src/planner/host_place.c, the planner's handling of host computes in
 * inference plans, the verifier's of them):
 *   - a graph of block-typed weights sizes every weight by its blocks: a
 *     q4_k, q8_0 or q6_k tinyllama-1.1b's weight bytes are its blocks' bytes
 *     (norms f32), and the planner's streamed bytes follow them;
 *   - on a machine whose link is slow and whose host memory is fast, the
 *     search puts decode MATMULs (or whole first layers) on the host CPU and
 *     its plan is predicted faster than every op on the device; on one whose link is fast and host
 *     slow, it places nothing there;
 *   - the co-offloaded plan verifies, and a planted one where a host compute
 *     reads a tensor that is not in host memory (its activation operand
 *     pointed at a home it has not got, or at host spill bytes nothing was
 *     stored to) is rejected.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/core.h"
#include "planner/planner.h"
#include "verify/verify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tide_ctx *ctx;

/* tinyllama-1.1b's decode graph (1 row, a 64-position cache) with weights of dt. */
static tide_graph *decode_graph(tide_dtype dt) {
    tide_llama_config cfg;
    assert_int_equal(tide_llama_config_named(ctx, "tinyllama-1.1b", &cfg), TIDE_OK);
    cfg.dtype = dt;
    tide_llama_graph_opts go = {.batch = 1, .seq = 1, .ctx_len = 64};
    tide_graph *g = NULL;
    if (tide_llama_build(ctx, &cfg, &go, &g)) fail_msg("%s", tide_ctx_last_error(ctx));
    return g;
}

/* A machine with a host side: link h2d/d2h at link bytes/s, host memory at
 * host_bw. */
static tide_hw machine(double link, double host_bw) {
    tide_hw h;
    memset(&h, 0, sizeof h);
    snprintf(h.name, sizeof h.name, "test-desktop");
    h.device_mem_bytes = UINT64_C(24) << 30;
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) h.flops[d] = tide_dtype_is_quantized(d) ? 0 : 100e12;
    h.matmul_efficiency = 0.7;
    h.mem_bw = 1e12;
    h.h2d_bw = h.d2h_bw = link;
    h.link_latency_s = 1e-5;
    h.launch_s = 5e-6;
    h.host_mem_bytes = UINT64_C(64) << 30;
    h.ssd_count = 1;
    h.ssd_read_bw = 7e9;
    h.ssd_write_bw = 5e9;
    h.ssd_latency_s = 1e-4;
    h.host_flops = 1.2e12;
    h.host_mem_bw = host_bw;
    return h;
}

/* ---------------------------------------------------------------- sizes */

static void expect_block_sizes(tide_dtype dt) {
    tide_graph *g = decode_graph(dt);
    uint64_t want = 0, blocks = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        const tide_tensor *x = &g->tensors[t];
        if (x->role != TIDE_ROLE_WEIGHT) continue;
        uint64_t numel = (uint64_t)tide_tensor_numel(x);
        if (strstr(x->name, "norm")) {
            assert_int_equal(x->dtype, TIDE_F32); /* a block type keeps the norms f32 */
            want += numel * 4;
            continue;
        }
        assert_int_equal(x->dtype, dt);
        assert_int_equal(numel % (uint64_t)tide_dtype_block(dt), 0);
        uint64_t nb = numel / (uint64_t)tide_dtype_block(dt) * tide_dtype_block_bytes(dt);
        assert_int_equal(x->nbytes, nb);
        want += nb;
        blocks += numel / (uint64_t)tide_dtype_block(dt);
    }
    assert_true(blocks > 0);
    assert_int_equal(tide_graph_role_bytes(g, TIDE_ROLE_WEIGHT), want);
    /* a plan streaming every weight once moves those bytes: budget a tenth */
    tide_hw hw = machine(25e9, 70e9);
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .device_budget = want / 10, .n_iter = 1, .hw = &hw};
    tide_plan *p = NULL;
    if (tide_plan_make(ctx, g, &po, &p)) fail_msg("%s", tide_ctx_last_error(ctx));
    assert_int_equal(tide_plan_verify(p), TIDE_OK);
    uint64_t dev_weights = 0; /* weights device computes read */
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].role == TIDE_ROLE_WEIGHT) dev_weights += g->tensors[t].nbytes;
    assert_true(p->stats.bytes_h2d >= dev_weights - po.device_budget);
    assert_true(p->stats.bytes_h2d <= dev_weights + (UINT64_C(64) << 20)); /* plus activations and the cache */
    tide_plan_free(p);
    tide_graph_free(g);
}

static void test_block_sizes(void **state) {
    (void)state;
    expect_block_sizes(TIDE_Q4_K);
    expect_block_sizes(TIDE_Q8_0);
    expect_block_sizes(TIDE_Q6_K);
    /* q4_k: 144 bytes per 256 weights, 4.5 bits */
    tide_graph *g4 = decode_graph(TIDE_Q4_K), *g16 = decode_graph(TIDE_BF16);
    uint64_t norms = 0;
    for (int t = 0; t < g16->n_tensors; t++)
        if (g16->tensors[t].role == TIDE_ROLE_WEIGHT && strstr(g16->tensors[t].name, "norm"))
            norms += g16->tensors[t].nbytes;
    uint64_t w4 = tide_graph_role_bytes(g4, TIDE_ROLE_WEIGHT), w16 = tide_graph_role_bytes(g16, TIDE_ROLE_WEIGHT);
    assert_int_equal((w16 - norms) / 2 * 144 / 256, w4 - 2 * norms);
    tide_graph_free(g4);
    tide_graph_free(g16);
}

/* ---------------------------------------------------------------- placement */

static const int N_ITER = 4;

static tide_plan_opts decode_opts(const tide_graph *g, const tide_hw *hw) {
    uint64_t w = tide_graph_role_bytes(g, TIDE_ROLE_WEIGHT);
    return (tide_plan_opts){.policy = TIDE_POLICY_TIDE, .device_budget = w / 3, .n_iter = N_ITER, .hw = hw};
}

static void test_slow_link_places_on_host(void **state) {
    (void)state;
    tide_graph *g = decode_graph(TIDE_Q4_K);
    tide_hw hw = machine(4e9, 100e9); /* a slow link, a fast host */
    tide_plan_opts po = decode_opts(g, &hw);
    bool *host = NULL;
    tide_host_place_info info;
    if (tide_plan_host_place(ctx, g, &po, &host, &info)) fail_msg("%s", tide_ctx_last_error(ctx));
    assert_non_null(host);
    assert_true(info.n_candidates >= 22 * 7);
    assert_true(info.n_host > 0 && info.host_weight_bytes > 0);
    /* MATMULs reading weights, or every op of the first host_layers layers */
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        if (info.host_layers) {
            assert_int_equal(host[i], op->layer >= 0 && op->layer < info.host_layers);
        } else if (host[i]) {
            assert_int_equal(op->kind, TIDE_OP_MATMUL);
            assert_int_equal(g->tensors[op->in[1]].role, TIDE_ROLE_WEIGHT);
        }
    }
    assert_true(info.device_makespan_s > 0);
    assert_true(info.makespan_s < 0.8 * info.device_makespan_s);
    /* the plan with that placement: verified, host computes on the host
     * stream, fewer bytes over the link than every op on the device */
    tide_plan *dev = NULL, *p = NULL;
    assert_int_equal(tide_plan_make(ctx, g, &po, &dev), TIDE_OK);
    po.host_ops = host;
    assert_int_equal(tide_plan_make(ctx, g, &po, &p), TIDE_OK);
    assert_int_equal(tide_plan_verify(p), TIDE_OK);
    int n_host = 0;
    for (int i = 0; i < p->n_ins; i++)
        if (p->ins[i].kind == TIDE_INS_COMPUTE && p->ins[i].place == TIDE_PLACE_HOST) {
            assert_int_equal(p->ins[i].stream, TIDE_STREAM_HOST);
            n_host++;
        }
    assert_int_equal(n_host, info.n_host * N_ITER);
    assert_true(p->stats.bytes_h2d < dev->stats.bytes_h2d);
    assert_true(p->stats.makespan_s == info.makespan_s);
    /* the lower bound leaves the host-only weights off the link */
    tide_bounds b_dev, b_host;
    po.host_ops = NULL;
    assert_int_equal(tide_plan_bounds(ctx, g, &po, &b_dev), TIDE_OK);
    po.host_ops = host;
    assert_int_equal(tide_plan_bounds(ctx, g, &po, &b_host), TIDE_OK);
    assert_true(b_host.link_s < b_dev.link_s);
    assert_true(b_host.lower_bound_s <= p->stats.makespan_s);
    tide_plan_free(dev);
    tide_plan_free(p);
    tide_free(host);
    tide_graph_free(g);
}

static void test_fast_link_keeps_device(void **state) {
    (void)state;
    tide_graph *g = decode_graph(TIDE_Q4_K);
    tide_hw hw = machine(400e9, 5e9); /* a fast link, a slow host */
    tide_plan_opts po = decode_opts(g, &hw);
    bool *host = NULL;
    tide_host_place_info info;
    if (tide_plan_host_place(ctx, g, &po, &host, &info)) fail_msg("%s", tide_ctx_last_error(ctx));
    assert_null(host);
    assert_int_equal(info.n_host, 0);
    /* the baselines and weights on SSD are left alone */
    hw = machine(4e9, 100e9);
    po.policy = TIDE_POLICY_LRU;
    assert_int_equal(tide_plan_host_place(ctx, g, &po, &host, &info), TIDE_OK);
    assert_null(host);
    assert_int_equal(info.n_candidates, 0);
    po.policy = TIDE_POLICY_TIDE;
    po.weights_on_ssd = true;
    assert_int_equal(tide_plan_host_place(ctx, g, &po, &host, &info), TIDE_OK);
    assert_null(host);
    tide_graph_free(g);
}

/* ---------------------------------------------------------------- verifier */

static void test_verifier(void **state) {
    (void)state;
    tide_graph *g = decode_graph(TIDE_Q8_0);
    tide_hw hw = machine(4e9, 100e9);
    tide_plan_opts po = decode_opts(g, &hw);
    bool *host = NULL;
    tide_host_place_info info;
    assert_int_equal(tide_plan_host_place(ctx, g, &po, &host, &info), TIDE_OK);
    assert_non_null(host);
    po.host_ops = host;
    tide_plan *p = NULL;
    assert_int_equal(tide_plan_make(ctx, g, &po, &p), TIDE_OK);
    assert_int_equal(tide_plan_verify(p), TIDE_OK);
    /* the first host MATMUL of the second iteration: its activation input */
    int at = -1;
    for (int i = 0; i < p->n_ins && at < 0; i++)
        if (p->ins[i].kind == TIDE_INS_COMPUTE && p->ins[i].place == TIDE_PLACE_HOST && p->ins[i].iter == 1 &&
            g->ops[p->ins[i].op].kind == TIDE_OP_MATMUL)
            at = i;
    assert_true(at >= 0);
    const tide_op *op = &g->ops[p->ins[at].op];
    assert_int_equal(g->tensors[op->in[0]].role, TIDE_ROLE_TEMP);
    assert_true(tide_ins_host_opnd(&p->ins[at], 0));
    uint64_t off = p->ins[at].dev_off[0];
    /* a temp has no home to read */
    p->ins[at].dev_off[0] = TIDE_HOME;
    assert_int_equal(tide_plan_verify(p), TIDE_E_VERIFY);
    fprintf(stderr, "rejected (home): %s\n", tide_ctx_last_error(ctx));
    /* host spill bytes nothing was stored to */
    p->ins[at].dev_off[0] = tide_plan_align(p->host_spill_bytes);
    p->host_spill_bytes = tide_plan_align(p->host_spill_bytes) + tide_plan_align(g->tensors[op->in[0]].nbytes);
    assert_int_equal(tide_plan_verify(p), TIDE_E_VERIFY);
    fprintf(stderr, "rejected (spill): %s\n", tide_ctx_last_error(ctx));
    /* its weight read from the device arena by a host compute */
    p->ins[at].dev_off[0] = off;
    p->ins[at].host_opnd &= (uint16_t)~2u;
    p->ins[at].dev_off[1] = 0;
    assert_int_equal(tide_plan_verify(p), TIDE_E_VERIFY);
    fprintf(stderr, "rejected (device operand): %s\n", tide_ctx_last_error(ctx));
    tide_plan_free(p);
    tide_free(host);
    tide_graph_free(g);
}

int main(void) {
    ctx = tide_ctx_new();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_sizes),
        cmocka_unit_test(test_slow_link_places_on_host),
        cmocka_unit_test(test_fast_link_keeps_device),
        cmocka_unit_test(test_verifier),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tide_ctx_free(ctx);
    return rc;
}
