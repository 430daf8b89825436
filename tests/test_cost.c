/*
 * test_cost.c - the cost model's decode formula (cost/cost.c) against inputs
 * whose answers are worked out by hand, and the profile fields it reads
 * (cost/hw.c). No timing: how close predictions come to a machine is a
 * benchmark's business; here the arithmetic is.
 *
 *   1. A MATMUL of one row (a decode step's matrix-vector product) costs its
 *      bytes over the profile's matvec_bw for the weight's dtype, plus the
 *      per-op overhead; mem_bw where the profile gives none for that dtype;
 *      a prefill's MATMUL stays compute-bound; other ops keep mem_bw.
 *   2. The decode step of a small LLaMA on a host-addressable backend
 *      (every tensor in place but the activations): the predicted makespan
 *      is the sum of its ops' costs, one after the other on the compute
 *      stream, and its matmuls are the weight bytes over matvec_bw.
 *   3. The same step with the weights streamed from SSD under a small
 *      budget: the prediction is bounded below by the bytes read over the
 *      SSD read rate and above by that plus every op's cost and each read's
 *      latency (reads overlap the computes).
 *   4. matvec_bw_f32 / _f16 / _bf16 round-trip through a profile file,
 *      are optional, and a bad value is refused naming the field;
 *   5. the CPU's probe (tide_probe_backend) measures them.
 *
 * What it proves: the cost model's prices: a decode-shaped matmul priced by
 * the profile's matrix-vector bandwidth against hand-worked figures, SSD
 * loads into host memory priced as the read alone, the CPU probe's profile
 * fields.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner/planner.h"
#include "probe/probe.h"
#include "sim/sim.h"
#include "verify/verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void assert_near(double got, double want) {
    double tol = 1e-9 * (fabs(want) > 1 ? fabs(want) : 1);
    if (fabs(got - want) > tol) fail_msg("got %.12g, want %.12g", got, want);
}

/* A CPU-like profile with round numbers: f32 matmuls at 100 GFLOP/s, 16-bit
 * ones at 200, memory 20 GB/s, matrix-vector products streaming bf16
 * weights at 25 GB/s and f32 ones at 16; one SSD reading 2 GB/s. */
static tide_hw cpu_hw(void) {
    tide_hw h;
    memset(&h, 0, sizeof h);
    strcpy(h.name, "test-cpu");
    h.device_mem_bytes = h.host_mem_bytes = UINT64_C(64) << 30;
    h.flops[TIDE_F32] = h.flops[TIDE_I32] = 100e9;
    h.flops[TIDE_F16] = h.flops[TIDE_BF16] = 200e9;
    h.matmul_efficiency = 1;
    h.attention_efficiency = 0.5;
    h.mem_bw = 20e9;
    h.matvec_bw[TIDE_BF16] = 25e9;
    h.matvec_bw[TIDE_F32] = 16e9;
    h.h2d_bw = h.d2h_bw = 10e9;
    h.link_latency_s = 2e-6;
    h.launch_s = 3e-6;
    h.ssd_count = 1;
    h.ssd_read_bw = 2e9;
    h.ssd_write_bw = 1e9;
    h.ssd_latency_s = 1e-4;
    return h;
}

static void test_matvec_formula(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = cpu_hw();
    tide_graph *g = tide_graph_new(ctx);
    int x1, x, wb, wf, wh, y1, y1f, y1h, y, z;
    const int64_t K = 2048, N = 5632, R = 512;
    assert_int_equal(tide_graph_add_tensor(g, "x1", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){1, K}, &x1), 0);
    assert_int_equal(tide_graph_add_tensor(g, "x", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){R, K}, &x), 0);
    assert_int_equal(tide_graph_add_tensor(g, "wb", TIDE_BF16, TIDE_ROLE_WEIGHT, 2, (int64_t[]){N, K}, &wb), 0);
    assert_int_equal(tide_graph_add_tensor(g, "wf", TIDE_F32, TIDE_ROLE_WEIGHT, 2, (int64_t[]){N, K}, &wf), 0);
    assert_int_equal(tide_graph_add_tensor(g, "wh", TIDE_F16, TIDE_ROLE_WEIGHT, 2, (int64_t[]){N, K}, &wh), 0);
    assert_int_equal(tide_graph_add_tensor(g, "y1", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){1, N}, &y1), 0);
    assert_int_equal(tide_graph_add_tensor(g, "y1f", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){1, N}, &y1f), 0);
    assert_int_equal(tide_graph_add_tensor(g, "y1h", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){1, N}, &y1h), 0);
    assert_int_equal(tide_graph_add_tensor(g, "y", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){R, N}, &y), 0);
    assert_int_equal(tide_graph_add_tensor(g, "z", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){1, N}, &z), 0);
    assert_int_equal(tide_graph_add_op(g, TIDE_OP_MATMUL, 2, (int[]){x1, wb}, 1, (int[]){y1}, NULL, 0, NULL), 0);
    assert_int_equal(tide_graph_add_op(g, TIDE_OP_MATMUL, 2, (int[]){x1, wf}, 1, (int[]){y1f}, NULL, 0, NULL), 0);
    assert_int_equal(tide_graph_add_op(g, TIDE_OP_MATMUL, 2, (int[]){x1, wh}, 1, (int[]){y1h}, NULL, 0, NULL), 0);
    assert_int_equal(tide_graph_add_op(g, TIDE_OP_MATMUL, 2, (int[]){x, wb}, 1, (int[]){y}, NULL, 0, NULL), 0);
    assert_int_equal(tide_graph_add_op(g, TIDE_OP_ADD, 2, (int[]){y1, y1f}, 1, (int[]){z}, NULL, 0, NULL), 0);
    const double row_in = K * 4.0, row_out = N * 4.0;
    /* decode, bf16 weight: (x row + weight + y row) / 25 GB/s + 3 us; its
     * 2KN FLOPs at 200 GFLOP/s would take 115 us, the bytes 923 us */
    assert_near(tide_cost_op(&hw, g, &g->ops[0]), (row_in + N * K * 2.0 + row_out) / 25e9 + 3e-6);
    /* an f32 weight: its own rate, 16 GB/s */
    assert_near(tide_cost_op(&hw, g, &g->ops[1]), (row_in + N * K * 4.0 + row_out) / 16e9 + 3e-6);
    /* f16: none in the profile, so mem_bw */
    assert_near(tide_cost_op(&hw, g, &g->ops[2]), (row_in + N * K * 2.0 + row_out) / 20e9 + 3e-6);
    /* prefill of 512 rows: compute-bound at the bf16 rate (5.9 ms against
     * 1.9 ms of bytes) */
    double flops = 2.0 * R * K * N, bytes = R * K * 4.0 + N * K * 2.0 + R * N * 4.0;
    assert_true(flops / 200e9 > bytes / 25e9);
    assert_near(tide_cost_op(&hw, g, &g->ops[3]), flops / 200e9 + 3e-6);
    /* an element-wise op is not a matmul: mem_bw */
    assert_near(tide_cost_op(&hw, g, &g->ops[4]), 3.0 * N * 4 / 20e9 + 3e-6);
    /* no matvec rate at all: every matmul's bytes at mem_bw, as before */
    tide_hw plain = hw;
    memset(plain.matvec_bw, 0, sizeof plain.matvec_bw);
    assert_near(tide_cost_op(&plain, g, &g->ops[0]), (row_in + N * K * 2.0 + row_out) / 20e9 + 3e-6);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* A 2-layer bf16 LLaMA's decode step (one token after 15) and its weights'
 * bytes. */
static tide_graph *decode_graph(tide_ctx *ctx, uint64_t *weights) {
    tide_llama_config cfg = {
        .name = "cost-test", .hidden_size = 512, .intermediate_size = 1408, .num_hidden_layers = 2,
        .num_attention_heads = 8, .num_key_value_heads = 2, .vocab_size = 4000, .max_position_embeddings = 64,
        .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .dtype = TIDE_BF16,
    };
    tide_llama_graph_opts go = {.batch = 1, .seq = 1, .ctx_len = 16};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build(ctx, &cfg, &go, &g), TIDE_OK);
    *weights = tide_graph_role_bytes(g, TIDE_ROLE_WEIGHT);
    return g;
}

static void test_decode_in_place(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = cpu_hw();
    uint64_t weights = 0;
    tide_graph *g = decode_graph(ctx, &weights);
    tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw, .host_addressable = true};
    uint64_t peak = 0;
    assert_int_equal(tide_plan_peak_unbounded(ctx, g, &o, &peak), TIDE_OK);
    o.device_budget = tide_plan_align(peak) + TIDE_PLAN_ALIGN;
    tide_plan *p = NULL;
    assert_int_equal(tide_plan_make(ctx, g, &o, &p), TIDE_OK);
    assert_int_equal(tide_plan_verify(p), TIDE_OK);
    /* nothing moves: the step is its computes, one after the other */
    double sum = 0, mm = 0, mm_bytes = 0;
    int n_mm = 0;
    for (int i = 0; i < g->n_ops; i++) {
        double c = tide_cost_op(&hw, g, &g->ops[i]);
        sum += c;
        if (g->ops[i].kind == TIDE_OP_MATMUL) {
            mm += c;
            mm_bytes += tide_op_bytes(g, &g->ops[i]);
            n_mm++;
        }
    }
    assert_int_equal(p->stats.n_loads + p->stats.n_stores + p->stats.n_moves, 0);
    assert_near(p->stats.makespan_s, sum);
    tide_sim_result sim;
    assert_int_equal(tide_simulate(p, &hw, &sim), TIDE_OK);
    assert_near(sim.makespan_s, sum);
    tide_sim_result_free(&sim);
    /* its matmuls: the bytes they move (the weights, once) at 25 GB/s */
    assert_near(mm, mm_bytes / 25e9 + n_mm * 3e-6);
    assert_true(mm_bytes >= (double)weights - (double)tide_graph_tensor_bytes(g, tide_graph_find(g, "model.embed_tokens.weight")));
    print_message("  decode step: %d matmuls of %.1f MB, predicted %.3f ms (matmuls %.3f ms)\n", n_mm, mm_bytes / 1e6,
                  sum * 1e3, mm * 1e3);
    tide_plan_free(p);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

static void test_decode_from_ssd(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw = cpu_hw();
    uint64_t weights = 0;
    tide_graph *g = decode_graph(ctx, &weights);
    tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw, .host_addressable = true,
                        .weights_on_ssd = true};
    uint64_t full = tide_plan_unconstrained_peak(ctx, g, &hw, 1), min = 0;
    o.device_budget = full;
    assert_int_equal(tide_plan_min_budget(ctx, g, &o, &min), TIDE_OK);
    double compute = 0;
    for (int i = 0; i < g->n_ops; i++) compute += tide_cost_op(&hw, g, &g->ops[i]);
    static const double fr[] = {0.5, 0.25, 0};
    for (int b = 0; b < 3; b++) {
        o.device_budget = fr[b] > 0 ? TIDE_MAX(min, tide_plan_align((uint64_t)(full * fr[b]))) : min;
        tide_plan *p = NULL;
        assert_int_equal(tide_plan_make(ctx, g, &o, &p), TIDE_OK);
        assert_int_equal(tide_plan_verify(p), TIDE_OK);
        /* every weight from SSD (one may be read again when the budget
         * cannot hold it until its use), nothing else: the drive bounds the
         * step */
        assert_true(p->stats.bytes_ssd_read >= weights);
        assert_int_equal(p->stats.bytes_h2d + p->stats.bytes_d2h + p->stats.bytes_ssd_write, 0);
        double reads = (double)p->stats.bytes_ssd_read / 2e9, lat = (double)p->stats.n_loads * 1e-4;
        if (p->stats.makespan_s < reads || p->stats.makespan_s > reads + lat + compute * (1 + 1e-9))
            fail_msg("budget %.0f%%: predicted %.6f s, outside [%.6f, %.6f]", fr[b] * 100, p->stats.makespan_s, reads,
                     reads + lat + compute);
        print_message("  budget %.0f%% (%.1f MB): predicted %.3f ms; reads alone %.3f ms, computes %.3f ms\n",
                      fr[b] * 100, o.device_budget / 1e6, p->stats.makespan_s * 1e3, reads * 1e3, compute * 1e3);
        tide_plan_free(p);
    }
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

static void test_matvec_fields(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    char dir[] = "/tmp/tide-test-cost-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/p.json", dir);
    tide_hw a = cpu_hw(), b;
    a.matvec_bw[TIDE_F16] = 1.0 / 3.0 * 1e10; /* not a short decimal */
    assert_int_equal(tide_hw_save(ctx, &a, path), TIDE_OK);
    assert_int_equal(tide_hw_load(ctx, path, &b), TIDE_OK);
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) assert_true(a.matvec_bw[d] == b.matvec_bw[d]);
    /* optional: a profile without them loads with none */
    tide_hw c = cpu_hw();
    memset(c.matvec_bw, 0, sizeof c.matvec_bw);
    assert_int_equal(tide_hw_save(ctx, &c, path), TIDE_OK);
    assert_int_equal(tide_hw_load(ctx, path, &b), TIDE_OK);
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) assert_true(b.matvec_bw[d] == 0);
    /* a bad one is refused by name, when saving and when loading */
    a.matvec_bw[TIDE_BF16] = -1;
    assert_int_equal(tide_hw_save(ctx, &a, path), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "matvec_bw_bf16"));
    FILE *f = fopen(path, "r");
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, "\"host_mem_bytes\"");
    assert_non_null(at);
    char bad[4200];
    snprintf(bad, sizeof bad, "%.*s\"matvec_bw_f32\": \"fast\",\n  %s", (int)(at - text), text, at);
    f = fopen(path, "w");
    fputs(bad, f);
    fclose(f);
    assert_int_equal(tide_hw_load(ctx, path, &b), TIDE_E_FORMAT);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "matvec_bw_f32"));
    unlink(path);
    rmdir(dir);
    tide_ctx_free(ctx);
}

/* The CPU's profile, measured through its backend, carries the rates the
 * decode formula reads: each dtype's matrix-vector rate, plausible, and a
 * valid profile file. */
static void test_probe_matvec(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    char dir[] = "/tmp/tide-test-cost-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    tide_hw hw;
    if (tide_probe_backend(ctx, be, dir, 0.5, NULL, &hw)) fail_msg("%s", tide_ctx_last_error(ctx));
    print_message("  %s: matvec f32 %.1f, f16 %.1f, bf16 %.1f GB/s; mem %.1f GB/s; ssd read %.2f GB/s\n", hw.name,
                  hw.matvec_bw[TIDE_F32] / 1e9, hw.matvec_bw[TIDE_F16] / 1e9, hw.matvec_bw[TIDE_BF16] / 1e9,
                  hw.mem_bw / 1e9, hw.ssd_read_bw / 1e9);
    static const tide_dtype dts[] = {TIDE_F32, TIDE_F16, TIDE_BF16};
    for (int i = 0; i < 3; i++) assert_true(hw.matvec_bw[dts[i]] > 1e7 && hw.matvec_bw[dts[i]] < 1e13);
    size_t n = strlen(hw.name);
    assert_true(n > 4 && !strcmp(hw.name + n - 4, "-cpu"));
    snprintf(path, sizeof path, "%s/p.json", dir);
    assert_int_equal(tide_hw_save(ctx, &hw, path), TIDE_OK);
    tide_hw back;
    assert_int_equal(tide_hw_load(ctx, path, &back), TIDE_OK);
    assert_true(back.matvec_bw[TIDE_BF16] == hw.matvec_bw[TIDE_BF16]);
    unlink(path);
    rmdir(dir);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matvec_formula),
        cmocka_unit_test(test_decode_in_place),
        cmocka_unit_test(test_decode_from_ssd),
        cmocka_unit_test(test_matvec_fields),
        cmocka_unit_test(test_probe_matvec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
