/* fuzz_plan: a plan's JSON (src/ir/plan_json.c), loaded against a fixed small
 * graph (three tensors, two ops) and, when it loads, saved and loaded again. */
#include "fuzz_util.h"
#include "graph/graph.h"
#include "ir/plan.h"
#include "tide.h"

static tide_ctx *g_ctx;
static tide_graph *g_graph;

/* The graph, and (TIDE_FUZZ_PLAN_SEED=PATH) a valid plan of it written to
 * PATH: fuzz/corpus/fuzz_plan's seed. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    g_ctx = tide_ctx_new();
    g_graph = tide_graph_new(g_ctx);
    int w, x, y;
    int64_t n = 1024;
    if (tide_graph_add_tensor(g_graph, "layer.0.w", TIDE_F32, TIDE_ROLE_WEIGHT, 1, &n, &w) ||
        tide_graph_add_tensor(g_graph, "x", TIDE_F32, TIDE_ROLE_TEMP, 1, &n, &x) ||
        tide_graph_add_tensor(g_graph, "y", TIDE_F32, TIDE_ROLE_OUTPUT, 1, &n, &y))
        abort();
    tide_op_args prm = {0}; /* the internal form: flops is not a public parameter */
    prm.flops = 1e9;
    if (tide_graph_add_op_args(g_graph, TIDE_OP_GENERIC, 0, (int[]){0}, 1, &x, &prm, -1, NULL) ||
        tide_graph_add_op_args(g_graph, TIDE_OP_GENERIC, 2, (int[]){x, w}, 1, &y, &prm, -1, NULL))
        abort();
    const char *seed = getenv("TIDE_FUZZ_PLAN_SEED");
    if (seed) {
        tide_plan *p = tide_plan_alloc(g_ctx, g_graph, 1);
        p->device_budget = 12288;
        tide_ins in;
        memset(&in, 0, sizeof in);
        in.kind = TIDE_INS_LOAD, in.stream = TIDE_STREAM_H2D, in.op = -1, in.tensor = w;
        in.src = TIDE_TIER_HOST, in.dst = TIDE_TIER_DEVICE;
        int l = tide_plan_push(p, &in, NULL, 0);
        memset(&in, 0, sizeof in);
        in.kind = TIDE_INS_COMPUTE, in.stream = TIDE_STREAM_COMPUTE, in.op = 0, in.tensor = -1;
        in.src = in.dst = TIDE_TIER_DEVICE;
        in.dev_off[0] = 4096;
        tide_plan_push(p, &in, NULL, 0);
        in.op = 1;
        in.dev_off[0] = 4096, in.dev_off[1] = 0, in.dev_off[2] = 8192;
        tide_plan_push(p, &in, &l, 1);
        if (tide_plan_save_json(p, seed) != TIDE_OK) abort();
        tide_plan_free(p);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512], again[512];
    fuzz_write("plan.json", data, size, path, sizeof path);
    tide_plan *p = NULL;
    if (tide_plan_load_json(g_ctx, g_graph, path, &p) == TIDE_OK) {
        snprintf(again, sizeof again, "%s/plan-again.json", fuzz_dir());
        if (tide_plan_save_json(p, again) != TIDE_OK) abort();
        tide_plan *q = NULL;
        if (tide_plan_load_json(g_ctx, g_graph, again, &q) != TIDE_OK) abort();
        if (q->n_ins != p->n_ins) abort();
        tide_plan_free(q);
        tide_plan_free(p);
    }
    return 0;
}
