/*
 * test_hw_sim.c - hardware profiles and cost model (cost/hw.c, cost/cost.c), the simulator
 * (simulate.c), Perfetto traces (trace.c), plan JSON (plan_json.c) and the
 * machine probe (probe.c).
 *
 * Simulator cases run on a "unit" profile whose rates make every duration a
 * round number of seconds (1 GFLOP/s, 1 GB/s h2d, 0.5 GB/s d2h, no latencies),
 * so expected makespans are computed by hand in the comments.
 *
 * What it proves: profiles (and malformed ones), the cost model, simulated
 * makespans computed by hand, traces and plan JSON round trips; the backend
 * probe run through the CPU backend's vtable, and on the asynchronous test
 * backend in queued batches (counted), the matmul modes' rules.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "async_backend.h"
#include "test_select.h"
#include "backend/cpu/kernels.h"
#include "core/alloc_test.h"
#include "planner/planner.h"
#include "sim/sim.h"
#include "trace/trace.h"
#include "verify/verify.h"
#include "probe/probe.h"
#include "backend/backend.h"

static char tmpdir[256];

static int setup_all(void **state) {
    (void)state;
    strcpy(tmpdir, "/tmp/tide-test-hw-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_all(void **state) {
    (void)state;
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(tmpdir);
    return 0;
}

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return s;
}

static cJSON *read_json(const char *path) {
    char *s = read_all(path, NULL);
    cJSON *j = cJSON_Parse(s);
    free(s);
    assert_non_null(j);
    return j;
}

static void write_json(const char *path, const cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    assert_non_null(s);
    write_text(path, s);
    cJSON_free(s);
}

static void assert_contains(const char *hay, const char *needle) {
    if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

static void assert_near(double got, double want) {
    double tol = 1e-9 * (fabs(want) > 1 ? fabs(want) : 1);
    if (fabs(got - want) > tol) fail_msg("got %.12g, want %.12g", got, want);
}

/* ---------------------------------------------------------------- profiles */

static void test_shipped_profiles_load(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    const char *names[] = {"p100-16g", "v100-32g", "a100-80g", "h100-80g"};
    for (int i = 0; i < 4; i++) {
        tide_hw hw;
        tide_status st = tide_hw_load(ctx, names[i], &hw);
        if (st) fail_msg("%s: %s", names[i], tide_ctx_last_error(ctx));
        assert_string_equal(hw.name, names[i]);
        assert_true(hw.device_mem_bytes >= (UINT64_C(16) << 30));
        assert_true(hw.flops[TIDE_F32] > 1e12 && hw.flops[TIDE_F16] >= hw.flops[TIDE_F32]);
        assert_true(hw.mem_bw > 5e11 && hw.h2d_bw > 1e10 && hw.ssd_count >= 1);
        assert_true(hw.matmul_efficiency > 0.5 && hw.matmul_efficiency <= 1);
    }
    tide_hw a, p;
    assert_int_equal(tide_hw_load(ctx, "a100-80g", &a), TIDE_OK);
    assert_true(a.flops[TIDE_BF16] == 312e12 && a.flops[TIDE_F32] == 19.5e12);
    assert_int_equal(a.ssd_count, 2);
    assert_int_equal(a.device_mem_bytes, UINT64_C(80) << 30);
    assert_int_equal(tide_hw_load(ctx, "p100-16g", &p), TIDE_OK);
    assert_true(p.flops[TIDE_BF16] == p.flops[TIDE_F32]); /* no bf16 on P100 */
    assert_true(p.flops[TIDE_F16] == 18.7e12);
    tide_ctx_free(ctx);
}

static void test_unknown_profile(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw;
    assert_int_equal(tide_hw_load(ctx, "tpu-v9", &hw), TIDE_E_NOT_FOUND);
    assert_contains(tide_ctx_last_error(ctx), "tpu-v9");
    assert_contains(tide_ctx_last_error(ctx), "a100-80g");
    assert_contains(tide_ctx_last_error(ctx), "h100-80g");
    assert_contains(tide_ctx_last_error(ctx), "p100-16g");
    assert_int_equal(tide_hw_load(ctx, tmp_path("absent.json"), &hw), TIDE_E_NOT_FOUND);
    assert_int_equal(tide_hw_load(ctx, "no/such/profile", &hw), TIDE_E_NOT_FOUND); /* a path */
    tide_ctx_free(ctx);
}

/* Saves a100-80g as JSON, applies edit to it, and expects loading the result
 * to fail with TIDE_E_FORMAT and a message naming `field` and the file. */
static void expect_bad_profile(tide_ctx *ctx, const char *file, void (*edit)(cJSON *),
                               const char *field) {
    tide_hw hw;
    assert_int_equal(tide_hw_load(ctx, "a100-80g", &hw), TIDE_OK);
    const char *path = tmp_path(file);
    assert_int_equal(tide_hw_save(ctx, &hw, path), TIDE_OK);
    cJSON *j = read_json(path);
    edit(j);
    write_json(path, j);
    cJSON_Delete(j);
    tide_hw out;
    memset(&out, 0x5a, sizeof out);
    tide_hw before = out;
    assert_int_equal(tide_hw_load(ctx, path, &out), TIDE_E_FORMAT);
    assert_contains(tide_ctx_last_error(ctx), field);
    assert_contains(tide_ctx_last_error(ctx), file);
    assert_memory_equal(&out, &before, sizeof out); /* untouched on failure */
}

static void drop_mem_bw(cJSON *j) { cJSON_DeleteItemFromObject(j, "mem_bw"); }
static void negative_h2d(cJSON *j) { cJSON_ReplaceItemInObject(j, "h2d_bw", cJSON_CreateNumber(-1)); }
static void string_ssd_count(cJSON *j) {
    cJSON_ReplaceItemInObject(j, "ssd_count", cJSON_CreateString("two"));
}
static void fractional_count(cJSON *j) {
    cJSON_ReplaceItemInObject(j, "ssd_count", cJSON_CreateNumber(1.5));
}
static void efficiency_above_one(cJSON *j) {
    cJSON_ReplaceItemInObject(j, "matmul_efficiency", cJSON_CreateNumber(1.2));
}
static void drop_bf16(cJSON *j) {
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(j, "flops"), "bf16");
}
static void flops_not_object(cJSON *j) { cJSON_ReplaceItemInObject(j, "flops", cJSON_CreateNumber(1)); }
static void name_number(cJSON *j) { cJSON_ReplaceItemInObject(j, "name", cJSON_CreateNumber(3)); }

static void test_malformed_profiles(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw;
    const char *bad = tmp_path("badjson.json");
    write_text(bad, "{ \"name\": \"x\",\n  \"mem_bw\": ");
    assert_int_equal(tide_hw_load(ctx, bad, &hw), TIDE_E_FORMAT);
    assert_contains(tide_ctx_last_error(ctx), "badjson.json");
    assert_contains(tide_ctx_last_error(ctx), "invalid JSON");
    write_text(bad, "[1, 2]");
    assert_int_equal(tide_hw_load(ctx, bad, &hw), TIDE_E_FORMAT);
    write_text(bad, "{\"name\":\"x\"} trailing");
    assert_int_equal(tide_hw_load(ctx, bad, &hw), TIDE_E_FORMAT);

    expect_bad_profile(ctx, "missing.json", drop_mem_bw, "'mem_bw'");
    assert_contains(tide_ctx_last_error(ctx), "missing");
    expect_bad_profile(ctx, "negative.json", negative_h2d, "'h2d_bw'");
    expect_bad_profile(ctx, "type.json", string_ssd_count, "'ssd_count'");
    expect_bad_profile(ctx, "frac.json", fractional_count, "'ssd_count'");
    expect_bad_profile(ctx, "eff.json", efficiency_above_one, "'matmul_efficiency'");
    expect_bad_profile(ctx, "bf16.json", drop_bf16, "'flops.bf16'");
    expect_bad_profile(ctx, "flops.json", flops_not_object, "'flops'");
    expect_bad_profile(ctx, "name.json", name_number, "'name'");
    tide_ctx_free(ctx);
}

static void test_profile_round_trip(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw a, b;
    assert_int_equal(tide_hw_load(ctx, "h100-80g", &a), TIDE_OK);
    a.launch_s = 1.0 / 3.0; /* not a short decimal */
    a.host_mem_bytes = (UINT64_C(1) << 53) - 1;
    const char *path = tmp_path("rt.json");
    assert_int_equal(tide_hw_save(ctx, &a, path), TIDE_OK);
    assert_int_equal(tide_hw_load(ctx, path, &b), TIDE_OK);
    assert_string_equal(a.name, b.name);
    assert_true(a.launch_s == b.launch_s && a.mem_bw == b.mem_bw && a.h2d_bw == b.h2d_bw &&
                a.d2h_bw == b.d2h_bw && a.link_latency_s == b.link_latency_s &&
                a.ssd_read_bw == b.ssd_read_bw && a.ssd_write_bw == b.ssd_write_bw &&
                a.ssd_latency_s == b.ssd_latency_s && a.matmul_efficiency == b.matmul_efficiency);
    assert_int_equal(a.host_mem_bytes, b.host_mem_bytes);
    assert_int_equal(a.device_mem_bytes, b.device_mem_bytes);
    assert_int_equal(a.ssd_count, b.ssd_count);
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) assert_true(a.flops[d] == b.flops[d]);
    /* no temporary file left beside it */
    DIR *dir = opendir(tmpdir);
    struct dirent *e;
    while ((e = readdir(dir))) assert_null(strstr(e->d_name, ".tmp."));
    closedir(dir);
    /* an invalid profile is not saved */
    a.h2d_bw = 0;
    assert_int_equal(tide_hw_save(ctx, &a, tmp_path("invalid.json")), TIDE_E_INVALID);
    assert_contains(tide_ctx_last_error(ctx), "h2d_bw");
    assert_int_equal(access(tmp_path("invalid.json"), F_OK), -1);
    assert_int_equal(tide_hw_save(ctx, &b, "/nonexistent-dir/x.json"), TIDE_E_IO);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- cost model */

static void test_cost_model(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw;
    assert_int_equal(tide_hw_load(ctx, "a100-80g", &hw), TIDE_OK);
    tide_graph *g = tide_graph_new(ctx);
    int x, w, wf, y, y2, x1, y1;
    assert_int_equal(tide_graph_add_tensor(g, "x", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){4096, 4096}, &x), 0);
    assert_int_equal(tide_graph_add_tensor(g, "l.up.weight", TIDE_BF16, TIDE_ROLE_WEIGHT, 2, (int64_t[]){4096, 4096}, &w), 0);
    assert_int_equal(tide_graph_add_tensor(g, "l.f.weight", TIDE_F32, TIDE_ROLE_WEIGHT, 2, (int64_t[]){4096, 4096}, &wf), 0);
    assert_int_equal(tide_graph_add_tensor(g, "y", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){4096, 4096}, &y), 0);
    assert_int_equal(tide_graph_add_tensor(g, "y2", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){4096, 4096}, &y2), 0);
    assert_int_equal(tide_graph_add_tensor(g, "x1", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){1, 4096}, &x1), 0);
    assert_int_equal(tide_graph_add_tensor(g, "y1", TIDE_F32, TIDE_ROLE_TEMP, 2, (int64_t[]){1, 4096}, &y1), 0);
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_MATMUL, 2, (int[]){x, w}, 1, (int[]){y}, NULL, 0, NULL), 0);
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_MATMUL, 2, (int[]){x, wf}, 1, (int[]){y2}, NULL, 0, NULL), 0);
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_MATMUL, 2, (int[]){x1, w}, 1, (int[]){y1}, NULL, 0, NULL), 0);
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_ADD, 2, (int[]){y, y2}, 1, (int[]){x}, NULL, 0, NULL), 0);
    double flops = 2.0 * 4096 * 4096 * 4096;
    /* prefill matmul, bf16 weight: compute-bound at the bf16 rate */
    assert_near(tide_cost_op(&hw, g, &g->ops[0]), flops / (312e12 * 0.75) + 5e-6);
    /* the same with an f32 weight: the f32 rate */
    assert_near(tide_cost_op(&hw, g, &g->ops[1]), flops / (19.5e12 * 0.75) + 5e-6);
    /* decode matmul (one row): memory-bound on the weight */
    double bytes = 4096.0 * 4 + 4096.0 * 4096 * 2 + 4096.0 * 4;
    assert_near(tide_cost_op(&hw, g, &g->ops[2]), bytes / 2039e9 + 5e-6);
    /* element-wise add: memory-bound on 3 tensors */
    assert_near(tide_cost_op(&hw, g, &g->ops[3]), 3.0 * 4096 * 4096 * 4 / 2039e9 + 5e-6);
    /* links and drives: n / bw + latency; two SSDs striped */
    assert_near(tide_hw_h2d_seconds(&hw, 25000000000ull), 1 + 1e-5);
    assert_near(tide_hw_d2h_seconds(&hw, 50000000000ull), 2 + 1e-5);
    assert_near(tide_hw_ssd_read_seconds(&hw, 13000000000ull), 1 + 1e-4);
    assert_near(tide_hw_ssd_write_seconds(&hw, 7000000000ull), 1 + 1e-4);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- simulator */

/* 1 GFLOP/s, 1 GB/s h2d, 0.5 GB/s d2h, SSD 0.5 GB/s read and 0.25 GB/s write,
 * no latency or launch cost, memory bandwidth so high it never matters. */
static tide_hw unit_hw(void) {
    tide_hw hw;
    memset(&hw, 0, sizeof hw);
    strcpy(hw.name, "unit");
    hw.device_mem_bytes = UINT64_C(1) << 40;
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) hw.flops[d] = 1e9;
    hw.matmul_efficiency = 1;
    hw.mem_bw = 1e20;
    hw.h2d_bw = 1e9;
    hw.d2h_bw = 0.5e9;
    hw.host_mem_bytes = UINT64_C(1) << 40;
    hw.ssd_count = 1;
    hw.ssd_read_bw = 0.5e9;
    hw.ssd_write_bw = 0.25e9;
    return hw;
}

/* Tensors: w0, w1 (weights, 1e9 bytes: 1 s over h2d), big (temp, 1e9 bytes),
 * a, b, c (small temps). Ops: op0 -> a (1 GFLOP = 1 s), op1 a -> b (2 s),
 * op2 b, w0 -> c (3 s). */
typedef struct sim_graph {
    tide_graph *g;
    int w0, w1, big, a, b, c;
} sim_graph;

static sim_graph make_sim_graph(tide_ctx *ctx) {
    sim_graph s;
    s.g = tide_graph_new(ctx);
    assert_non_null(s.g);
    int64_t gb = 250000000, small = 256;
    assert_int_equal(tide_graph_add_tensor(s.g, "w0", TIDE_F32, TIDE_ROLE_WEIGHT, 1, &gb, &s.w0), 0);
    assert_int_equal(tide_graph_add_tensor(s.g, "w1", TIDE_F32, TIDE_ROLE_WEIGHT, 1, &gb, &s.w1), 0);
    assert_int_equal(tide_graph_add_tensor(s.g, "big", TIDE_F32, TIDE_ROLE_TEMP, 1, &gb, &s.big), 0);
    assert_int_equal(tide_graph_add_tensor(s.g, "a", TIDE_F32, TIDE_ROLE_TEMP, 1, &small, &s.a), 0);
    assert_int_equal(tide_graph_add_tensor(s.g, "b", TIDE_F32, TIDE_ROLE_TEMP, 1, &small, &s.b), 0);
    assert_int_equal(tide_graph_add_tensor(s.g, "c", TIDE_F32, TIDE_ROLE_TEMP, 1, &small, &s.c), 0);
    tide_op_args p = {0};
    p.flops = 1e9;
    /* (int[]){0}, not NULL, for no inputs: graph.c memcpy()s from it */
    assert_int_equal(tide_graph_add_op_args(s.g, TIDE_OP_GENERIC, 0, (int[]){0}, 1, &s.a, &p, -1, NULL), 0);
    p.flops = 2e9;
    assert_int_equal(tide_graph_add_op_args(s.g, TIDE_OP_GENERIC, 1, &s.a, 1, &s.b, &p, -1, NULL), 0);
    p.flops = 3e9;
    assert_int_equal(tide_graph_add_op_args(s.g, TIDE_OP_GENERIC, 2, (int[]){s.b, s.w0}, 1, &s.c, &p, -1, NULL), 0);
    return s;
}

static tide_ins mk(tide_ins_kind kind, tide_stream stream, int op, int tensor, tide_tier src, tide_tier dst) {
    tide_ins in;
    memset(&in, 0, sizeof in);
    in.kind = kind;
    in.stream = stream;
    in.op = op;
    in.tensor = tensor;
    in.src = src;
    in.dst = dst;
    in.tier_off = TIDE_HOME;
    in.src_off = TIDE_HOME;
    return in;
}

static int push(tide_plan *p, tide_ins in, int n_wait, ...) {
    int w[8];
    va_list ap;
    va_start(ap, n_wait);
    for (int i = 0; i < n_wait; i++) w[i] = va_arg(ap, int);
    va_end(ap);
    int k = tide_plan_push(p, &in, w, n_wait);
    assert_true(k >= 0);
    return k;
}

#define COMPUTE(op) mk(TIDE_INS_COMPUTE, TIDE_STREAM_COMPUTE, op, -1, TIDE_TIER_DEVICE, TIDE_TIER_DEVICE)
#define LOAD(t, stream) mk(TIDE_INS_LOAD, stream, -1, t, TIDE_TIER_HOST, TIDE_TIER_DEVICE)
#define LOAD_SSD(t, stream) mk(TIDE_INS_LOAD, stream, -1, t, TIDE_TIER_SSD, TIDE_TIER_DEVICE)
#define STORE(t) mk(TIDE_INS_STORE, TIDE_STREAM_D2H, -1, t, TIDE_TIER_DEVICE, TIDE_TIER_HOST)

static void expect_event(const tide_sim_result *r, int i, double start, double end) {
    assert_int_equal(r->events[i].ins, i);
    assert_near(r->events[i].start_s, start);
    assert_near(r->events[i].end_s, end);
}

static void test_sim_serial_chain(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    sim_graph s = make_sim_graph(ctx);
    tide_hw hw = unit_hw();
    tide_plan *p = tide_plan_alloc(ctx, s.g, 1);
    push(p, COMPUTE(0), 0);
    push(p, COMPUTE(1), 0);
    push(p, COMPUTE(2), 0);
    int64_t live = tide_alloc_live_bytes();
    tide_sim_result r;
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    /* 1 + 2 + 3 seconds, one after the other on the compute stream */
    assert_int_equal(r.n_events, 3);
    expect_event(&r, 0, 0, 1);
    expect_event(&r, 1, 1, 3);
    expect_event(&r, 2, 3, 6);
    assert_near(r.makespan_s, 6);
    assert_near(r.busy_s[TIDE_STREAM_COMPUTE], 6);
    assert_near(r.busy_s[TIDE_STREAM_H2D], 0);
    tide_sim_result_free(&r);
    assert_int_equal(tide_alloc_live_bytes(), live);
    tide_plan_free(p);
    tide_graph_free(s.g);
    tide_ctx_free(ctx);
}

static void test_sim_overlap_and_waits(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    sim_graph s = make_sim_graph(ctx);
    tide_hw hw = unit_hw();
    tide_plan *p = tide_plan_alloc(ctx, s.g, 1);
    int l0 = push(p, LOAD(s.w0, TIDE_STREAM_H2D), 0); /* [0, 1] h2d */
    push(p, COMPUTE(1), 0);                           /* [0, 2] independent: overlaps the load */
    push(p, COMPUTE(2), 1, l0);                       /* [2, 5] needs w0 (ready at 1), stream free at 2 */
    int l1 = push(p, LOAD(s.w1, TIDE_STREAM_H2D), 0); /* [1, 2] */
    int st = push(p, STORE(s.big), 1, l1);            /* [2, 4] d2h at 0.5 GB/s, waits on l1 */
    push(p, COMPUTE(0), 1, st);                       /* [5, 6]: stream free at 5, store done at 4 */
    tide_sim_result r;
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    expect_event(&r, 0, 0, 1);
    expect_event(&r, 1, 0, 2);
    expect_event(&r, 2, 2, 5);
    expect_event(&r, 3, 1, 2);
    expect_event(&r, 4, 2, 4);
    expect_event(&r, 5, 5, 6);
    assert_near(r.makespan_s, 6);
    assert_near(r.busy_s[TIDE_STREAM_COMPUTE], 6);
    assert_near(r.busy_s[TIDE_STREAM_H2D], 2);
    assert_near(r.busy_s[TIDE_STREAM_D2H], 2);
    tide_sim_result_free(&r);
    tide_plan_free(p);

    /* A wait delays a start past an idle stream: compute waits on a 1 s load. */
    p = tide_plan_alloc(ctx, s.g, 1);
    int l = push(p, LOAD(s.w0, TIDE_STREAM_H2D), 0);
    push(p, COMPUTE(0), 1, l);
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    expect_event(&r, 1, 1, 2);
    assert_near(r.makespan_s, 2);
    tide_sim_result_free(&r);
    tide_plan_free(p);
    tide_graph_free(s.g);
    tide_ctx_free(ctx);
}

static void test_sim_shared_links(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    sim_graph s = make_sim_graph(ctx);
    tide_hw hw = unit_hw();
    tide_sim_result r;

    /* Two loads on the h2d stream: FIFO, 1 s each. */
    tide_plan *p = tide_plan_alloc(ctx, s.g, 1);
    push(p, LOAD(s.w0, TIDE_STREAM_H2D), 0);
    push(p, LOAD(s.w1, TIDE_STREAM_H2D), 0);
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    expect_event(&r, 0, 0, 1);
    expect_event(&r, 1, 1, 2);
    tide_sim_result_free(&r);
    tide_plan_free(p);

    /* Two host loads on different streams still share the H2D link; the
     * earlier instruction goes first. A store overlaps: D2H is its own link. */
    p = tide_plan_alloc(ctx, s.g, 1);
    push(p, LOAD(s.w0, TIDE_STREAM_IO), 0);
    push(p, LOAD(s.w1, TIDE_STREAM_H2D), 0);
    push(p, STORE(s.big), 0);
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    expect_event(&r, 0, 0, 1);
    expect_event(&r, 1, 1, 2);
    expect_event(&r, 2, 0, 2);
    assert_near(r.makespan_s, 2);
    tide_sim_result_free(&r);
    tide_plan_free(p);

    /* SSD -> device is pipelined: the SSD's 2 s for 1e9 bytes plus the link's
     * time for one 4 MiB chunk (the pipeline fill). A MOVE on the io stream
     * then waits for the SSDs: host -> ssd of 1e9 bytes at 0.25 GB/s = 4 s. */
    p = tide_plan_alloc(ctx, s.g, 1);
    push(p, LOAD_SSD(s.w0, TIDE_STREAM_H2D), 0);
    tide_ins mv = mk(TIDE_INS_MOVE, TIDE_STREAM_IO, -1, s.big, TIDE_TIER_HOST, TIDE_TIER_SSD);
    push(p, mv, 0);
    push(p, LOAD(s.w1, TIDE_STREAM_H2D), 0); /* after the SSD load on its stream */
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    double fill = (double)(4 << 20) / 1e9;
    expect_event(&r, 0, 0, 2 + fill);
    expect_event(&r, 1, 2 + fill, 6 + fill);
    expect_event(&r, 2, 2 + fill, 3 + fill);
    tide_sim_result_free(&r);
    tide_plan_free(p);

    /* STORE to SSD: d2h (2 s) and SSD write (4 s) pipelined. */
    p = tide_plan_alloc(ctx, s.g, 1);
    tide_ins so = STORE(s.big);
    so.dst = TIDE_TIER_SSD;
    push(p, so, 0);
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    expect_event(&r, 0, 0, 4 + (double)(4 << 20) / 0.5e9);
    tide_sim_result_free(&r);
    tide_plan_free(p);
    tide_graph_free(s.g);
    tide_ctx_free(ctx);
}

static void test_sim_rejects_bad_waits(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    sim_graph s = make_sim_graph(ctx);
    tide_hw hw = unit_hw();
    tide_sim_result r;
    /* waits on a later instruction of its own stream: can never start */
    tide_plan *p = tide_plan_alloc(ctx, s.g, 1);
    push(p, COMPUTE(0), 1, 1);
    push(p, COMPUTE(1), 0);
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_E_INVALID);
    assert_contains(tide_ctx_last_error(ctx), "deadlock");
    assert_null(r.events);
    tide_plan_free(p);
    /* out of range */
    p = tide_plan_alloc(ctx, s.g, 1);
    push(p, COMPUTE(0), 1, 7);
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_E_INVALID);
    tide_plan_free(p);
    /* a wait on a later instruction of another stream is merely a delay */
    p = tide_plan_alloc(ctx, s.g, 1);
    push(p, COMPUTE(0), 1, 1);
    push(p, LOAD(s.w0, TIDE_STREAM_H2D), 0);
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    expect_event(&r, 0, 1, 2);
    tide_sim_result_free(&r);
    tide_plan_free(p);
    tide_graph_free(s.g);
    tide_ctx_free(ctx);
}

static void test_sim_large_plan(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    sim_graph s = make_sim_graph(ctx);
    tide_hw hw = unit_hw();
    /* 500k loads (1 s each) feeding 500k computes (1 s each): a pipeline whose
     * makespan is N + 1. */
    const int N = 500000;
    tide_plan *p = tide_plan_alloc(ctx, s.g, 1);
    for (int i = 0; i < N; i++) {
        int l = push(p, LOAD(s.w0, TIDE_STREAM_H2D), 0);
        push(p, COMPUTE(0), 1, l);
    }
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    tide_sim_result r;
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    double t = (double)clock() / CLOCKS_PER_SEC - t0;
    assert_near(r.makespan_s, N + 1);
    assert_int_equal(r.n_events, 2 * N);
    /* the time is printed, never a verdict (it depends on the machine and its load) */
    print_message("simulated %d instructions in %.3f s\n", 2 * N, t);
    tide_sim_result_free(&r);
    tide_plan_free(p);
    tide_graph_free(s.g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- trace */

static void test_trace(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_graph *g = tide_graph_new(ctx);
    int w, x, y;
    int64_t n = 1024; /* 4096 bytes each */
    assert_int_equal(tide_graph_add_tensor(g, "layer.0.w\"q\"", TIDE_F32, TIDE_ROLE_WEIGHT, 1, &n, &w), 0);
    assert_int_equal(tide_graph_add_tensor(g, "x", TIDE_F32, TIDE_ROLE_TEMP, 1, &n, &x), 0);
    assert_int_equal(tide_graph_add_tensor(g, "y", TIDE_F32, TIDE_ROLE_OUTPUT, 1, &n, &y), 0);
    tide_op_args prm = {0};
    prm.flops = 1e9;
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 0, (int[]){0}, 1, &x, &prm, -1, NULL), 0);
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 2, (int[]){x, w}, 1, &y, &prm, -1, NULL), 0);
    tide_plan *p = tide_plan_alloc(ctx, g, 1);
    p->device_budget = 12288;
    p->host_spill_bytes = 0;
    tide_ins in;
    in = LOAD(w, TIDE_STREAM_H2D);
    in.dev_off[0] = 0;
    int l = push(p, in, 0);
    in = COMPUTE(0);
    in.dev_off[0] = 4096;
    int c0 = push(p, in, 0);
    in = COMPUTE(1);
    in.dev_off[0] = 4096, in.dev_off[1] = 0, in.dev_off[2] = 8192;
    int c1 = push(p, in, 1, l);
    in = mk(TIDE_INS_DROP, TIDE_STREAM_COMPUTE, -1, x, TIDE_TIER_DEVICE, TIDE_TIER_DEVICE);
    in.dev_off[0] = 4096;
    push(p, in, 0);
    in.tensor = w;
    in.dev_off[0] = 0;
    push(p, in, 0);
    in = STORE(y);
    in.dev_off[0] = 8192;
    int s = push(p, in, 1, c1);
    in = mk(TIDE_INS_DROP, TIDE_STREAM_D2H, -1, y, TIDE_TIER_DEVICE, TIDE_TIER_DEVICE);
    in.dev_off[0] = 8192;
    push(p, in, 1, s);
    /* a second round reusing offset 0 right after w's drop */
    in = COMPUTE(0);
    in.dev_off[0] = 0;
    push(p, in, 0);
    in = mk(TIDE_INS_DROP, TIDE_STREAM_COMPUTE, -1, x, TIDE_TIER_DEVICE, TIDE_TIER_DEVICE);
    in.dev_off[0] = 0;
    push(p, in, 0);
    (void)c0;

    tide_hw hw = unit_hw();
    tide_sim_result r;
    assert_int_equal(tide_simulate(p, &hw, &r), TIDE_OK);
    const char *path = tmp_path("trace.json");
    assert_int_equal(tide_trace_write(p, r.events, r.n_events, path), TIDE_OK);

    cJSON *j = read_json(path);
    assert_string_equal(cJSON_GetObjectItem(j, "displayTimeUnit")->valuestring, "ms");
    cJSON *evs = cJSON_GetObjectItem(j, "traceEvents");
    assert_true(cJSON_IsArray(evs));
    bool thread[TIDE_STREAM_COUNT] = {false}, process = false, load_w = false, store_y = false;
    int n_x = 0, n_c = 0;
    double max_bytes = 0, last_bytes = -1, last_ts = -1;
    cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
        cJSON *args = cJSON_GetObjectItem(e, "args");
        if (!strcmp(ph, "M") && !strcmp(name, "process_name"))
            process = !strcmp(cJSON_GetObjectItem(args, "name")->valuestring, "tide");
        if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
            int tid = cJSON_GetObjectItem(e, "tid")->valueint;
            assert_true(tid >= 1 && tid <= TIDE_STREAM_COUNT);
            assert_string_equal(cJSON_GetObjectItem(args, "name")->valuestring,
                                tide_stream_name((tide_stream)(tid - 1)));
            thread[tid - 1] = true;
        }
        if (!strcmp(ph, "X")) {
            n_x++;
            int ins = cJSON_GetObjectItem(args, "ins")->valueint;
            assert_true(ins >= 0 && ins < p->n_ins);
            assert_int_equal(cJSON_GetObjectItem(e, "tid")->valueint, (int)p->ins[ins].stream + 1);
            /* microseconds, printed to the nanosecond */
            assert_true(fabs(cJSON_GetObjectItem(e, "ts")->valuedouble - r.events[ins].start_s * 1e6) < 1e-3);
            assert_true(fabs(cJSON_GetObjectItem(e, "dur")->valuedouble -
                             (r.events[ins].end_s - r.events[ins].start_s) * 1e6) < 1e-3);
            if (!strcmp(name, "load layer.0.w\"q\"")) {
                load_w = true;
                assert_int_equal(cJSON_GetObjectItem(args, "bytes")->valuedouble, 4096);
            }
            if (!strcmp(name, "store y")) store_y = true;
            if (p->ins[ins].kind == TIDE_INS_COMPUTE) assert_true(!strncmp(name, "generic ", 8));
        }
        if (!strcmp(ph, "C")) {
            assert_string_equal(name, "device bytes");
            n_c++;
            double b = cJSON_GetObjectItem(args, "used")->valuedouble;
            double ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
            assert_true(ts >= last_ts);
            last_ts = ts;
            assert_true(b >= 0 && b <= (double)p->device_budget);
            if (b > max_bytes) max_bytes = b;
            last_bytes = b;
        }
    }
    assert_true(process && load_w && store_y);
    for (int k = 0; k < TIDE_STREAM_COUNT; k++) assert_true(thread[k]);
    assert_int_equal(n_x, p->n_ins);
    assert_true(n_c >= 2);
    assert_true(max_bytes == 12288); /* w, x and y together while op1 runs */
    assert_true(last_bytes == 0);
    cJSON_Delete(j);

    /* A partial measured timeline is fine; a bad one is refused. */
    assert_int_equal(tide_trace_write(p, r.events, 3, tmp_path("partial.json")), TIDE_OK);
    tide_sim_event bad[2] = {r.events[0], r.events[0]};
    assert_int_equal(tide_trace_write(p, bad, 2, tmp_path("bad.json")), TIDE_E_INVALID);
    bad[1].ins = 1;
    bad[1].end_s = -1;
    assert_int_equal(tide_trace_write(p, bad, 2, tmp_path("bad.json")), TIDE_E_INVALID);
    assert_int_equal(access(tmp_path("bad.json"), F_OK), -1);
    assert_int_equal(tide_trace_write(p, r.events, r.n_events, "/nonexistent-dir/t.json"), TIDE_E_IO);
    tide_sim_result_free(&r);
    tide_plan_free(p);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- plan JSON */

typedef struct json_fixture {
    tide_graph *g;
    tide_plan *p;
    int w, st, in, out, x;
} json_fixture;

static tide_graph *make_json_graph(tide_ctx *ctx, const char *xname, json_fixture *f) {
    tide_graph *g = tide_graph_new(ctx);
    int64_t n = 1024;
    assert_int_equal(tide_graph_add_tensor(g, "w", TIDE_BF16, TIDE_ROLE_WEIGHT, 1, &n, &f->w), 0);
    assert_int_equal(tide_graph_add_tensor(g, "state", TIDE_F32, TIDE_ROLE_STATE, 1, &n, &f->st), 0);
    assert_int_equal(tide_graph_add_tensor(g, "in", TIDE_F32, TIDE_ROLE_INPUT, 1, &n, &f->in), 0);
    assert_int_equal(tide_graph_add_tensor(g, "out", TIDE_F32, TIDE_ROLE_OUTPUT, 1, &n, &f->out), 0);
    assert_int_equal(tide_graph_add_tensor(g, xname, TIDE_F32, TIDE_ROLE_TEMP, 1, &n, &f->x), 0);
    tide_op_args prm = {0};
    prm.flops = 5;
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 2, (int[]){f->in, f->w}, 1, &f->x, &prm, -1, NULL), 0);
    assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, 2, (int[]){f->x, f->st}, 2, (int[]){f->out, f->st}, &prm, -1, NULL), 0);
    return g;
}

static json_fixture make_json_plan(tide_ctx *ctx) {
    json_fixture f;
    f.g = make_json_graph(ctx, "x", &f);
    tide_plan *p = tide_plan_alloc(ctx, f.g, 2);
    p->policy = TIDE_POLICY_STATIC_LAYER;
    p->device_budget = (UINT64_C(1) << 55) + 12345;  /* above 2^53: written as a string */
    p->host_budget = UINT64_MAX;
    p->home[f.w] = TIDE_TIER_SSD;
    p->resident[f.st] = true;
    p->host_spill_bytes = 1 << 20;
    p->ssd_spill_bytes = UINT64_C(1) << 60;
    p->stats.peak_device_bytes = (UINT64_C(1) << 53) + 1;
    p->stats.bytes_h2d = 123456789;
    p->stats.n_loads = 7;
    p->stats.compute_s = 1.0 / 3.0;
    p->stats.makespan_s = INFINITY;
    p->stats.plan_seconds = 0.1;
    uint64_t hi = (UINT64_C(1) << 54) + 3; /* odd above 2^53: not an exact double */
    tide_ins in;
    in = mk(TIDE_INS_LOAD, TIDE_STREAM_IO, -1, f.w, TIDE_TIER_SSD, TIDE_TIER_DEVICE);
    in.dev_off[0] = hi;
    int l0 = push(p, in, 0);
    in = LOAD(f.in, TIDE_STREAM_H2D);
    in.dev_off[0] = 0;
    int l1 = push(p, in, 0);
    in = COMPUTE(0);
    in.dev_off[0] = 0, in.dev_off[1] = hi, in.dev_off[2] = 8192;
    int c0 = push(p, in, 2, l0, l1);
    in = mk(TIDE_INS_STORE, TIDE_STREAM_D2H, -1, f.x, TIDE_TIER_DEVICE, TIDE_TIER_SSD);
    in.dev_off[0] = 8192;
    in.tier_off = (UINT64_C(1) << 60) - 4096;
    int s0 = push(p, in, 1, c0);
    in = mk(TIDE_INS_MOVE, TIDE_STREAM_IO, -1, f.x, TIDE_TIER_SSD, TIDE_TIER_HOST);
    in.tier_off = 4096;
    in.src_off = (UINT64_C(1) << 60) - 4096;
    push(p, in, 1, s0);
    in = COMPUTE(1);
    in.iter = 1;
    in.dev_off[0] = 8192, in.dev_off[1] = 16384, in.dev_off[2] = 24576, in.dev_off[3] = 16384;
    in.scratch_off = 99;
    push(p, in, 0);
    in = mk(TIDE_INS_DROP, TIDE_STREAM_COMPUTE, -1, f.x, TIDE_TIER_HOST, TIDE_TIER_DEVICE);
    in.iter = 1;
    in.tier_off = 4096;
    push(p, in, 0);
    in = mk(TIDE_INS_STORE, TIDE_STREAM_D2H, -1, f.out, TIDE_TIER_DEVICE, TIDE_TIER_HOST);
    in.iter = 1;
    in.dev_off[0] = 24576;
    push(p, in, 3, 5, 0, 5);
    f.p = p;
    return f;
}

static void assert_plans_equal(const tide_plan *a, const tide_plan *b) {
    assert_int_equal(a->policy, b->policy);
    assert_int_equal(a->n_iter, b->n_iter);
    assert_int_equal(a->device_budget, b->device_budget);
    assert_int_equal(a->host_budget, b->host_budget);
    assert_int_equal(a->host_spill_bytes, b->host_spill_bytes);
    assert_int_equal(a->ssd_spill_bytes, b->ssd_spill_bytes);
    assert_int_equal(a->warm_region, b->warm_region);
    assert_memory_equal(&a->stats, &b->stats, sizeof a->stats);
    for (int t = 0; t < a->g->n_tensors; t++) {
        assert_int_equal(a->home[t], b->home[t]);
        assert_int_equal(a->resident[t], b->resident[t]);
    }
    assert_int_equal(a->n_ins, b->n_ins);
    for (int i = 0; i < a->n_ins; i++) {
        const tide_ins *x = &a->ins[i], *y = &b->ins[i];
        assert_int_equal(x->kind, y->kind);
        assert_int_equal(x->stream, y->stream);
        assert_int_equal(x->iter, y->iter);
        assert_int_equal(x->op, y->op);
        assert_int_equal(x->tensor, y->tensor);
        assert_int_equal(x->src, y->src);
        assert_int_equal(x->dst, y->dst);
        assert_memory_equal(x->dev_off, y->dev_off, sizeof x->dev_off);
        assert_int_equal(x->scratch_off, y->scratch_off);
        assert_int_equal(x->tier_off, y->tier_off);
        assert_int_equal(x->src_off, y->src_off);
        assert_int_equal(x->n_wait, y->n_wait);
        for (int k = 0; k < x->n_wait; k++)
            assert_int_equal(a->waits[x->wait_at + k], b->waits[y->wait_at + k]);
    }
}

static void test_plan_json_round_trip(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    json_fixture f = make_json_plan(ctx);
    if (f.p->device_budget >= TIDE_PLAN_ALIGN) f.p->warm_region = TIDE_PLAN_ALIGN; /* saved and loaded back */
    const char *path = tmp_path("plan.json");
    assert_int_equal(tide_plan_save_json(f.p, path), TIDE_OK);
    tide_plan *q = NULL;
    tide_status st = tide_plan_load_json(ctx, f.g, path, &q);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    assert_plans_equal(f.p, q);
    assert_true(q->g == f.g);
    /* saving the loaded plan gives the same bytes */
    const char *path2 = tmp_path("plan2.json");
    assert_int_equal(tide_plan_save_json(q, path2), TIDE_OK);
    size_t n1, n2;
    char *s1 = read_all(path, &n1), *s2 = read_all(path2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(s1, s2, n1);
    free(s1);
    free(s2);
    tide_plan_free(q);
    /* the fingerprint sees names and shapes */
    json_fixture other;
    tide_graph *g2 = make_json_graph(ctx, "x2", &other);
    assert_true(tide_graph_fingerprint(g2) != tide_graph_fingerprint(f.g));
    assert_int_equal(tide_plan_load_json(ctx, g2, path, &q), TIDE_E_FORMAT);
    assert_contains(tide_ctx_last_error(ctx), "fingerprint");
    assert_null(q);
    tide_graph_free(g2);
    tide_plan_free(f.p);
    tide_graph_free(f.g);
    tide_ctx_free(ctx);
}

/* Applies an edit to the saved plan JSON and expects loading to fail with
 * TIDE_E_FORMAT naming `what`. */
static void expect_bad_plan(tide_ctx *ctx, const json_fixture *f, void (*edit)(cJSON *),
                            const char *what) {
    const char *good = tmp_path("good-plan.json"), *bad = tmp_path("bad-plan.json");
    assert_int_equal(tide_plan_save_json(f->p, good), TIDE_OK);
    cJSON *j = read_json(good);
    edit(j);
    write_json(bad, j);
    cJSON_Delete(j);
    tide_plan *q = (tide_plan *)1;
    tide_status st = tide_plan_load_json(ctx, f->g, bad, &q);
    if (st != TIDE_E_FORMAT) fail_msg("status %d for '%s': %s", st, what, tide_ctx_last_error(ctx));
    assert_null(q);
    assert_contains(tide_ctx_last_error(ctx), what);
    assert_contains(tide_ctx_last_error(ctx), "bad-plan.json");
}

static cJSON *ins_field(cJSON *j, int i, int k) {
    return cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ins"), i), k);
}
static void edit_fingerprint(cJSON *j) {
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "graph"), "fingerprint",
                              cJSON_CreateString("0123456789abcdef"));
}
static void edit_wait_range(cJSON *j) {
    cJSON_ReplaceItemInArray(ins_field(j, 2, 11), 0, cJSON_CreateNumber(99));
}
static void edit_wait_forward(cJSON *j) {
    cJSON_ReplaceItemInArray(ins_field(j, 2, 11), 0, cJSON_CreateNumber(2));
}
static void edit_huge_offset(cJSON *j) {
    cJSON_ReplaceItemInArray(ins_field(j, 1, 7), 0, cJSON_CreateString("18446744073709551615"));
}
static void edit_inexact_offset(cJSON *j) {
    cJSON_ReplaceItemInArray(ins_field(j, 1, 7), 0, cJSON_CreateNumber(1e300));
}
static void edit_overflow_offset(cJSON *j) {
    cJSON_ReplaceItemInArray(ins_field(j, 1, 7), 0, cJSON_CreateString("99999999999999999999"));
}
static void edit_spill_offset(cJSON *j) {
    cJSON_ReplaceItemInArray(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ins"), 6), 9,
                             cJSON_CreateNumber(1 << 20));
}
static void edit_kind(cJSON *j) { cJSON_ReplaceItemInArray(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ins"), 0), 0, cJSON_CreateNumber(9)); }
static void edit_stream(cJSON *j) { cJSON_ReplaceItemInArray(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ins"), 0), 1, cJSON_CreateNumber(-1)); }
static void edit_iter(cJSON *j) { cJSON_ReplaceItemInArray(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ins"), 0), 2, cJSON_CreateNumber(2)); }
static void edit_op(cJSON *j) { cJSON_ReplaceItemInArray(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ins"), 2), 3, cJSON_CreateNumber(2)); }
static void edit_tier(cJSON *j) { cJSON_ReplaceItemInArray(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ins"), 1), 5, cJSON_CreateNumber(0)); }
static void edit_dev_off_len(cJSON *j) { cJSON_DeleteItemFromArray(ins_field(j, 2, 7), 0); }
static void edit_missing_stats(cJSON *j) { cJSON_DeleteItemFromObject(j, "stats"); }
static void edit_n_iter_type(cJSON *j) { cJSON_ReplaceItemInObject(j, "n_iter", cJSON_CreateString("two")); }
static void edit_home(cJSON *j) { cJSON_ReplaceItemInArray(cJSON_GetObjectItem(j, "home"), 4, cJSON_CreateString("host")); }
static void edit_home_mismatch(cJSON *j) { cJSON_ReplaceItemInArray(cJSON_GetObjectItem(j, "home"), 0, cJSON_CreateString("host")); }
static void edit_short_ins(cJSON *j) { cJSON_DeleteItemFromArray(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ins"), 3), 11); }
static void edit_version(cJSON *j) { cJSON_ReplaceItemInObject(j, "version", cJSON_CreateNumber(3)); }
static void edit_policy(cJSON *j) { cJSON_ReplaceItemInObject(j, "policy", cJSON_CreateString("random")); }
static void edit_warm_region(cJSON *j) { cJSON_ReplaceItemInObject(j, "warm_region", cJSON_CreateNumber(100)); }
static void edit_counts(cJSON *j) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "graph"), "n_ops", cJSON_CreateNumber(3)); }

static void test_plan_json_corrupt(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    json_fixture f = make_json_plan(ctx);
    const char *path = tmp_path("trunc.json");
    assert_int_equal(tide_plan_save_json(f.p, path), TIDE_OK);
    size_t n;
    char *s = read_all(path, &n);
    tide_plan *q = NULL;
    for (size_t cut = 1; cut < n - 2; cut += n / 13 + 1) { /* truncated at various points */
        FILE *fp = fopen(path, "wb");
        fwrite(s, 1, cut, fp);
        fclose(fp);
        assert_int_equal(tide_plan_load_json(ctx, f.g, path, &q), TIDE_E_FORMAT);
        assert_null(q);
    }
    free(s);
    assert_int_equal(tide_plan_load_json(ctx, f.g, tmp_path("absent-plan.json"), &q), TIDE_E_NOT_FOUND);

    expect_bad_plan(ctx, &f, edit_fingerprint, "fingerprint");
    expect_bad_plan(ctx, &f, edit_wait_range, "wait");
    expect_bad_plan(ctx, &f, edit_wait_forward, "earlier instruction");
    expect_bad_plan(ctx, &f, edit_huge_offset, "outside the device budget");
    expect_bad_plan(ctx, &f, edit_inexact_offset, "dev_off[0]");
    expect_bad_plan(ctx, &f, edit_overflow_offset, "dev_off[0]");
    expect_bad_plan(ctx, &f, edit_spill_offset, "spill area");
    expect_bad_plan(ctx, &f, edit_kind, "'kind'");
    expect_bad_plan(ctx, &f, edit_stream, "'stream'");
    expect_bad_plan(ctx, &f, edit_iter, "'iter'");
    expect_bad_plan(ctx, &f, edit_op, "'op'");
    expect_bad_plan(ctx, &f, edit_tier, "load from device");
    expect_bad_plan(ctx, &f, edit_dev_off_len, "'dev_off'");
    expect_bad_plan(ctx, &f, edit_missing_stats, "'stats'");
    expect_bad_plan(ctx, &f, edit_n_iter_type, "'n_iter'");
    expect_bad_plan(ctx, &f, edit_home, "home[4]");
    expect_bad_plan(ctx, &f, edit_home_mismatch, "no home on ssd");
    expect_bad_plan(ctx, &f, edit_short_ins, "instruction 3");
    expect_bad_plan(ctx, &f, edit_version, "'version'");
    expect_bad_plan(ctx, &f, edit_policy, "'policy'");
    expect_bad_plan(ctx, &f, edit_counts, "3 ops");
    expect_bad_plan(ctx, &f, edit_warm_region, "warm_region");
    assert_int_equal(tide_plan_save_json(f.p, "/nonexistent-dir/p.json"), TIDE_E_IO);
    tide_plan_free(f.p);
    tide_graph_free(f.g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- allocation failures */

/* Fails the 1st, 2nd, ... allocation of each call until it succeeds: every
 * failure must be TIDE_E_NOMEM (or a success that did without the memory)
 * and leave no allocation behind. */
static void test_alloc_failures(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    json_fixture f = make_json_plan(ctx);
    tide_hw hw = unit_hw();
    const char *path = tmp_path("fi-plan.json"), *tpath = tmp_path("fi-trace.json");
    assert_int_equal(tide_plan_save_json(f.p, path), TIDE_OK);
    tide_sim_result ref;
    assert_int_equal(tide_simulate(f.p, &hw, &ref), TIDE_OK);
    int64_t live = tide_alloc_live_bytes();
    for (int what = 0; what < 4; what++) {
        int failures = 0;
        for (long nth = 1; nth < 10000; nth++) {
            tide_plan *q = NULL;
            tide_sim_result r = {0};
            tide_hw h;
            tide_status st;
            tide_alloc_fail_nth(nth);
            switch (what) {
            case 0: st = tide_plan_load_json(ctx, f.g, path, &q); break;
            case 1: st = tide_simulate(f.p, &hw, &r); break;
            case 2: st = tide_trace_write(f.p, ref.events, ref.n_events, tpath); break;
            default: st = tide_hw_load(ctx, "no-such-profile", &h); break;
            }
            tide_alloc_fail_nth(0);
            if (st == TIDE_OK || (what == 3 && st == TIDE_E_NOT_FOUND)) {
                tide_plan_free(q);
                tide_sim_result_free(&r);
                assert_int_equal(tide_alloc_live_bytes(), live);
                break;
            }
            if (st != TIDE_E_NOMEM) fail_msg("case %d, allocation %ld: status %d: %s", what, nth, st,
                                             tide_ctx_last_error(ctx));
            failures++;
            assert_null(q);
            assert_null(r.events);
            assert_int_equal(tide_alloc_live_bytes(), live);
        }
        assert_true(what == 3 || failures > 0);
    }
    tide_sim_result_free(&ref);
    tide_plan_free(f.p);
    tide_graph_free(f.g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- probe */

static void test_probe(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/probe", tmpdir);
    assert_int_equal(mkdir(dir, 0700), 0);
    tide_hw hw;
    double t0 = (double)time(NULL);
    tide_status st = tide_probe(ctx, dir, 1.0, &hw);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    /* printed, not checked: a verdict on the time would depend on the machine's load */
    print_message("the probe of 1 s took %.0f s\n", (double)time(NULL) - t0);
    print_message("%s: sgemm %.1f GFLOP/s (bf16 %.1f, f16 %.1f), mem %.2f GB/s, copy %.2f GB/s, "
                  "ssd read %.2f GB/s write %.2f GB/s latency %.1f us, host %.1f GiB\n",
                  hw.name, hw.flops[TIDE_F32] / 1e9, hw.flops[TIDE_BF16] / 1e9,
                  hw.flops[TIDE_F16] / 1e9, hw.mem_bw / 1e9, hw.h2d_bw / 1e9, hw.ssd_read_bw / 1e9,
                  hw.ssd_write_bw / 1e9, hw.ssd_latency_s * 1e6, hw.host_mem_bytes / 1073741824.0);
    assert_true(!strncmp(hw.name, "probed-", 7));
    for (int d = 0; d <= TIDE_I32; d++) assert_true(hw.flops[d] > 1e6);
    assert_true(hw.mem_bw > 1e8 && hw.h2d_bw > 1e8 && hw.d2h_bw > 1e8);
    assert_true(hw.ssd_read_bw > 1e6 && hw.ssd_write_bw > 1e6 && hw.ssd_latency_s > 0);
    assert_true(hw.host_mem_bytes > (UINT64_C(1) << 28) && hw.device_mem_bytes == hw.host_mem_bytes);
    /* the temporary file is gone */
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    assert_int_equal(n, 0);
    rmdir(dir);
    /* a probed profile is a valid profile */
    const char *path = tmp_path("probed.json");
    assert_int_equal(tide_hw_save(ctx, &hw, path), TIDE_OK);
    tide_hw back;
    assert_int_equal(tide_hw_load(ctx, path, &back), TIDE_OK);
    assert_true(back.flops[TIDE_F32] == hw.flops[TIDE_F32]);
    /* a list naming one drive twice is one drive */
    char list[1100];
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(list, sizeof list, "%s,%s,", dir, tmpdir);
    assert_int_equal(tide_probe(ctx, list, 0.3, &hw), TIDE_OK);
    assert_int_equal(hw.ssd_count, 1);
    rmdir(dir);
    /* a directory that does not exist */
    assert_int_equal(tide_probe(ctx, "/nonexistent-dir/x", 0.2, &hw), TIDE_E_IO);
    assert_contains(tide_ctx_last_error(ctx), "/nonexistent-dir/x");
    assert_int_equal(tide_probe(ctx, ",,", 0.2, &hw), TIDE_E_INVALID);
    tide_ctx_free(ctx);
}

/* The backend-level probe (the one a GPU gets), run through the CPU
 * backend's vtable: every figure it owns is measured and plausible, the rest
 * of the profile is left alone; and the matmul modes of the CPU backend. */
/* Counts the waits of a probe on the asynchronous test backend. */
static int syncs;
static tide_status (*real_queue_sync)(tide_backend *, void *);
static tide_status counting_queue_sync(tide_backend *be, void *q) {
    syncs++;
    return real_queue_sync(be, q);
}

static void test_probe_backend_ops(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    tide_hw hw;
    memset(&hw, 0, sizeof hw);
    hw.ssd_count = 7;
    hw.host_mem_bytes = 12345;
    double t0 = tide_now();
    tide_status st = tide_probe_ops(ctx, be, 0.3, &hw);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    double took = tide_now() - t0;
    print_message("cpu backend ops: matmul f32 %.1f, f16 %.1f, bf16 %.1f GFLOP/s; mem %.2f GB/s; copies %.2f / "
                  "%.2f GB/s; launch %.1f us; copy latency %.1f us (%.2f s)\n",
                  hw.flops[TIDE_F32] / 1e9, hw.flops[TIDE_F16] / 1e9, hw.flops[TIDE_BF16] / 1e9, hw.mem_bw / 1e9,
                  hw.h2d_bw / 1e9, hw.d2h_bw / 1e9, hw.launch_s * 1e6, hw.link_latency_s * 1e6, took);
    for (int d = 0; d <= TIDE_I32; d++) assert_true(hw.flops[d] > 1e8 && hw.flops[d] < 1e15);
    assert_true(hw.matmul_efficiency == 1.0);
    assert_true(hw.attention_efficiency > 0 && hw.attention_efficiency <= 1.0);
    assert_true(hw.mem_bw > 1e8 && hw.h2d_bw > 1e8 && hw.d2h_bw > 1e8);
    assert_true(hw.launch_s > 0 && hw.launch_s < 0.01);
    assert_true(hw.link_latency_s > 0 && hw.link_latency_s < 0.01);
    /* not its fields: untouched */
    assert_int_equal(hw.ssd_count, 7);
    assert_true(hw.host_mem_bytes == 12345 && hw.ssd_read_bw == 0);
    /* the profile it makes is a valid one once the drive is measured too */
    assert_int_equal(tide_probe_drives(ctx, tmpdir, 0.2, &hw), TIDE_OK);
    hw.device_mem_bytes = hw.host_mem_bytes = UINT64_C(1) << 30;
    strcpy(hw.name, "ops");
    const char *path = tmp_path("ops.json");
    if (tide_hw_save(ctx, &hw, path)) fail_msg("%s", tide_ctx_last_error(ctx));
    tide_hw back;
    assert_int_equal(tide_hw_load(ctx, path, &back), TIDE_OK);
    assert_true(back.attention_efficiency == hw.attention_efficiency && back.launch_s == hw.launch_s);
    /* the attention rate it measured is the one the cost model uses */
    {
        tide_graph *g = tide_graph_new(ctx);
        int64_t s2[2] = {64, 256}, sp[1] = {64}, sc[3] = {1, 64, 256};
        int q, k, v, pos, o, kc, vc, op;
        assert_int_equal(tide_graph_add_tensor(g, "q", TIDE_F32, TIDE_ROLE_INPUT, 2, s2, &q), TIDE_OK);
        assert_int_equal(tide_graph_add_tensor(g, "k", TIDE_F32, TIDE_ROLE_INPUT, 2, s2, &k), TIDE_OK);
        assert_int_equal(tide_graph_add_tensor(g, "v", TIDE_F32, TIDE_ROLE_INPUT, 2, s2, &v), TIDE_OK);
        assert_int_equal(tide_graph_add_tensor(g, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, sp, &pos), TIDE_OK);
        assert_int_equal(tide_graph_add_tensor(g, "o", TIDE_F32, TIDE_ROLE_TEMP, 2, s2, &o), TIDE_OK);
        assert_int_equal(tide_graph_add_tensor(g, "ck", TIDE_F32, TIDE_ROLE_STATE, 3, sc, &kc), TIDE_OK);
        assert_int_equal(tide_graph_add_tensor(g, "cv", TIDE_F32, TIDE_ROLE_STATE, 3, sc, &vc), TIDE_OK);
        tide_op_args prm = {.n_heads = 2, .n_kv_heads = 2, .head_dim = 128, .batch = 1};
        assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_ATTENTION, 4, (int[]){q, k, v, pos}, 3, (int[]){o, kc, vc},
                                           &prm, -1, &op), TIDE_OK);
        tide_hw slow = back;
        slow.attention_efficiency = back.attention_efficiency / 2;
        slow.mem_bw = back.mem_bw = 1e15; /* compute-bound */
        double t1 = tide_cost_op(&back, g, &g->ops[op]) - back.launch_s;
        double t2 = tide_cost_op(&slow, g, &g->ops[op]) - slow.launch_s;
        assert_true(fabs(t2 / t1 - 2.0) < 1e-9);
        tide_graph_free(g);
    }
    tide_hw bad = back;
    bad.attention_efficiency = 1.5;
    assert_int_equal(tide_hw_save(ctx, &bad, path), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "attention_efficiency"));
    /* on a host backend, tide_probe_backend is the CPU probe */
    assert_int_equal(tide_probe_backend(ctx, be, tmpdir, 0.3, NULL, &hw), TIDE_OK);
    assert_true(!strncmp(hw.name, "probed-", 7) && hw.device_mem_bytes == hw.host_mem_bytes);
    assert_int_equal(tide_probe_backend(ctx, be, "/nonexistent-dir/x", 0.2, NULL, &hw), TIDE_E_IO);

    /* matmul modes: the CPU has both; AUTO is FAST where it multiplies bf16
     * natively (AVX512_BF16), else F32 */
    tide_matmul_mode cpu_auto = tk_matmul_fast_native(TIDE_BF16) ? TIDE_MATMUL_FAST : TIDE_MATMUL_F32;
    assert_int_equal(tide_backend_matmul(be), cpu_auto);
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_FAST), TIDE_OK);
    assert_int_equal(tide_backend_matmul(be), TIDE_MATMUL_FAST);
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_AUTO), TIDE_OK);
    assert_int_equal(tide_backend_matmul(be), cpu_auto);
    assert_int_equal(tide_backend_set_matmul(be, (tide_matmul_mode)9), TIDE_E_INVALID);
    tide_matmul_mode mm = TIDE_MATMUL_AUTO;
    assert_int_equal(tide_matmul_parse(ctx, "fast", &mm), TIDE_OK);
    assert_int_equal(mm, TIDE_MATMUL_FAST);
    assert_int_equal(tide_matmul_parse(ctx, "f32", &mm), TIDE_OK);
    assert_int_equal(mm, TIDE_MATMUL_F32);
    assert_int_equal(tide_matmul_parse(ctx, "tf32", &mm), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "'tf32'"));
    assert_int_equal(tide_matmul_parse(NULL, NULL, &mm), TIDE_E_INVALID);
    assert_string_equal(tide_matmul_name(TIDE_MATMUL_AUTO), "auto");
    assert_null(tide_matmul_name((tide_matmul_mode)9));
    tide_backend_free(be);

    /* on a backend with events the probe times queued items, as the
     * executor issues them there: batches waited for once */
    tide_async_opts ao = {.seed = 1};
    assert_int_equal(tide_async_backend_new(ctx, &ao, &be), TIDE_OK);
    const tide_backend_vt *queued_vt = be->vt;
    tide_backend_vt counting = *queued_vt;
    real_queue_sync = counting.queue_sync;
    counting.queue_sync = counting_queue_sync;
    be->vt = &counting;
    memset(&hw, 0, sizeof hw);
    syncs = 0;
    if (tide_probe_ops(ctx, be, 0.3, &hw)) fail_msg("%s", tide_ctx_last_error(ctx));
    uint64_t items = 0;
    tide_async_backend_counts(be, &items, NULL);
    be->vt = queued_vt;
    print_message("queued ops: launch %.1f us, copy latency %.1f us, %llu items queued, %d waits\n",
                  hw.launch_s * 1e6, hw.link_latency_s * 1e6, (unsigned long long)items, syncs);
    /* 8 measurements, each one untimed wait (1 or 2 items) then waits for
     * batches of 16 */
    assert_true(syncs > 8 && items >= (uint64_t)16 * (uint64_t)(syncs - 8));
    assert_true(hw.launch_s > 0 && hw.launch_s < 0.01 && hw.flops[TIDE_BF16] > 1e8 && hw.h2d_bw > 1e8);
    /* and the default queue still issues synchronously afterwards */
    void *d = NULL;
    float x = 1.5f, y = 0;
    assert_int_equal(be->vt->alloc(be, sizeof x, &d), TIDE_OK);
    assert_int_equal(be->vt->to_device(be, NULL, d, &x, sizeof x), TIDE_OK);
    assert_int_equal(be->vt->to_host(be, NULL, &y, d, sizeof y), TIDE_OK);
    assert_true(y == x);
    be->vt->dealloc(be, d);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

int main(int argc, char **argv) {
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_profiles_load),
        cmocka_unit_test(test_unknown_profile),
        cmocka_unit_test(test_malformed_profiles),
        cmocka_unit_test(test_profile_round_trip),
        cmocka_unit_test(test_cost_model),
        cmocka_unit_test(test_sim_serial_chain),
        cmocka_unit_test(test_sim_overlap_and_waits),
        cmocka_unit_test(test_sim_shared_links),
        cmocka_unit_test(test_sim_rejects_bad_waits),
        cmocka_unit_test(test_sim_large_plan),
        cmocka_unit_test(test_trace),
        cmocka_unit_test(test_plan_json_round_trip),
        cmocka_unit_test(test_plan_json_corrupt),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_probe_backend_ops),
    };
    size_t n = test_select(tests, sizeof tests / sizeof tests[0], argc, argv);
    if (!n) return 1;
    return _cmocka_run_group_tests("test_hw_sim", tests, n, setup_all, teardown_all);
}
