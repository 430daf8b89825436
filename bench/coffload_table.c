/*
 * coffload_table.c - quantized decode beyond device memory, with and without
 * co-offload, against a model of llama.cpp's partial offload, all planned and
 * simulated in one run (shapes only, no weights).
 *
 *   bench_coffload_table [--steps N] [--seq S] [--json FILE]
 *
 * For llama-2-70b decode (batch 1, N steps after an S-token prompt) with the
 * weights stored as bf16, q8_0, q4_k and llama.cpp's Q4_K_M mix
 * (tide_quant_mix_apply), on rtx-4090-24g (budget 22 GiB of its
 * 24) and h100-80g (budget 24 GiB), each row gives:
 *   - tide, every op on the device (--host-compute off): tokens/s over the
 *     whole plan (its first step loads what stays resident) and in the steady
 *     state (steps 2..N), x its lower bound, bytes over the link per token;
 *   - tide with co-offload (--host-compute auto): the same, and the bytes of
 *     weights the host CPU reads per token;
 *   - llama.cpp's partial offload (-ngl) modelled on the same profile: the
 *     most whole layers whose weights and KV cache fit the budget beside a
 *     compute buffer of 1 GiB live on the GPU and run at its memory
 *     bandwidth; the other layers, the embedding and the head run on the CPU
 *     at the host's memory bandwidth (where the weights exceed host memory,
 *     the excess is read from the SSD at its read rate each token, as an
 *     mmap'd file that does not fit the page cache); one token is the sum
 *     (the CPU and the GPU take turns), compute time where it is larger.
 *     This is a model of that design on the profile, not a measurement of
 *     llama.cpp;
 *   - ratios side by side: co-offload / device-only, co-offload / -ngl.
 * Every tide plan is verified before it is counted.
 */
#include "planner/planner.h"
#include "sim/sim.h"
#include "verify/verify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tide_ctx *ctx;

typedef struct row {
    bool ok;
    double tps, xlb;
    double steady_tps;            /* iterations 2..N: the resident weights already loaded */
    double link_per_tok, host_per_tok; /* bytes */
    int host_ops;
} row;

/* tide on g with or without co-offload. */
static row run_tide(const tide_graph *g, const tide_hw *hw, uint64_t budget, int steps, bool coffload) {
    row r = {0};
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .device_budget = budget, .n_iter = steps, .hw = hw};
    bool *host = NULL;
    tide_host_place_info info = {0};
    if (coffload && tide_plan_host_place(ctx, g, &po, &host, &info)) {
        fprintf(stderr, "bench: co-offload: %s\n", tide_ctx_last_error(ctx));
        return r;
    }
    po.host_ops = host;
    tide_plan *p = NULL;
    tide_bounds b;
    if (tide_plan_make(ctx, g, &po, &p) || tide_plan_bounds(ctx, g, &po, &b)) {
        fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
        tide_free(host);
        tide_plan_free(p);
        return r;
    }
    if (tide_plan_verify(p)) {
        fprintf(stderr, "bench: plan failed verification: %s\n", tide_ctx_last_error(ctx));
        exit(1);
    }
    tide_sim_result sim;
    if (tide_simulate(p, hw, &sim)) {
        fprintf(stderr, "bench: simulate: %s\n", tide_ctx_last_error(ctx));
        exit(1);
    }
    double end0 = 0, endn = 0;
    for (int i = 0; i < sim.n_events; i++) {
        int it = p->ins[sim.events[i].ins].iter;
        if (it == 0 && sim.events[i].end_s > end0) end0 = sim.events[i].end_s;
        if (it == steps - 1 && sim.events[i].end_s > endn) endn = sim.events[i].end_s;
    }
    tide_sim_result_free(&sim);
    r.ok = true;
    r.steady_tps = steps > 1 && endn > end0 ? (steps - 1) / (endn - end0) : steps / p->stats.makespan_s;
    r.tps = steps / p->stats.makespan_s;
    r.xlb = p->stats.makespan_s / b.lower_bound_s;
    r.link_per_tok = (double)p->stats.bytes_h2d / steps;
    r.host_per_tok = (double)info.host_weight_bytes;
    r.host_ops = info.n_host;
    tide_plan_free(p);
    tide_free(host);
    return r;
}

/* Weight bytes of layer L of g (tensors named model.layers.L.*), the rest
 * (embedding, final norm, head) into *other. */
static void layer_bytes(const tide_graph *g, int n_layers, uint64_t *per_layer, uint64_t *other) {
    memset(per_layer, 0, (size_t)n_layers * sizeof *per_layer);
    *other = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        const tide_tensor *x = &g->tensors[t];
        if (x->role != TIDE_ROLE_WEIGHT) continue;
        int L;
        if (sscanf(x->name, "model.layers.%d.", &L) == 1 && L >= 0 && L < n_layers) per_layer[L] += x->nbytes;
        else *other += x->nbytes;
    }
}

/* llama.cpp's -ngl on hw: the largest whole-layer split that fits. */
static row run_ngl(const tide_graph *g, const tide_llama_config *cfg, const tide_hw *hw, uint64_t budget, int ctx_len,
                   int *ngl_out) {
    int nl = cfg->num_hidden_layers;
    uint64_t *lb = calloc((size_t)nl, sizeof *lb), other = 0;
    layer_bytes(g, nl, lb, &other);
    /* llama.cpp's default KV cache: f16 keys and values */
    uint64_t kv = (uint64_t)2 * ctx_len * (uint64_t)cfg->num_key_value_heads *
                  (uint64_t)(cfg->hidden_size / cfg->num_attention_heads) * 2;
    uint64_t used = UINT64_C(1) << 30; /* compute buffer */
    int ngl = 0;
    while (ngl < nl && used + lb[ngl] + kv <= budget) used += lb[ngl++] + kv;
    uint64_t gpu = 0, cpu = other;
    for (int L = 0; L < nl; L++) *(L < ngl ? &gpu : &cpu) += lb[L];
    double flops_per_byte = 0; /* decode, batch 1: 2 FLOPs a weight */
    double params = (double)tide_graph_flops(g) / 2, wbytes = (double)(gpu + cpu);
    flops_per_byte = 2 * params / wbytes;
    double host_bw = hw->host_mem_bw > 0 ? hw->host_mem_bw : TIDE_HOST_MEM_BW_DEFAULT;
    double host_fl = hw->host_flops > 0 ? hw->host_flops : TIDE_HOST_FLOPS_DEFAULT;
    uint64_t host_room = hw->host_mem_bytes > (UINT64_C(4) << 30) ? hw->host_mem_bytes - (UINT64_C(4) << 30) : 0;
    uint64_t in_mem = cpu < host_room ? cpu : host_room, from_ssd = cpu - in_mem;
    double t_cpu = (double)in_mem / host_bw + (double)from_ssd / (hw->ssd_read_bw * hw->ssd_count);
    double t_cpu_fl = flops_per_byte * (double)cpu / host_fl;
    double t_gpu = (double)gpu / hw->mem_bw;
    double t_gpu_fl = flops_per_byte * (double)gpu / (hw->flops[TIDE_BF16] * hw->matmul_efficiency);
    double t = (t_cpu > t_cpu_fl ? t_cpu : t_cpu_fl) + (t_gpu > t_gpu_fl ? t_gpu : t_gpu_fl);
    free(lb);
    *ngl_out = ngl;
    return (row){.ok = true, .tps = 1 / t, .host_per_tok = (double)cpu};
}

static const char *fmt_gb(double b, char *buf, size_t n) {
    snprintf(buf, n, "%.2f GB", b / 1e9);
    return buf;
}

int main(int argc, char **argv) {
    int steps = 32, seq = 2048;
    FILE *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) seq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = fopen(argv[++i], "w");
        else {
            fprintf(stderr, "usage: bench_coffload_table [--steps N] [--seq S] [--json FILE]\n");
            return 2;
        }
    }
    if (steps < 1 || seq < 1) return 2;
    ctx = tide_ctx_new();
    static const struct { const char *hw; uint64_t budget; } machines[] = {
        {"rtx-4090-24g", UINT64_C(22) << 30},
        {"h100-80g", UINT64_C(24) << 30},
    };
    static const char *const names[] = {"bf16", "q8_0", "q4_k", "q4_k_m"};
    printf("llama-2-70b decode, batch 1, %d steps after a %d-token prompt\n\n", steps, seq);
    printf("tok/s: over the whole plan (the first step loads what stays resident); steady: steps 2..%d.\n\n", steps);
    printf("| profile | budget | weights | device-only tok/s | steady | x LB | link/token | co-offload tok/s | steady "
           "| x LB | link/token | host reads/token | -ngl model | tok/s | co-offload / device-only (steady) | "
           "co-offload steady / -ngl |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t m = 0; m < sizeof machines / sizeof machines[0]; m++) {
        tide_hw hw;
        if (tide_hw_load(ctx, machines[m].hw, &hw)) {
            fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
            return 1;
        }
        for (size_t d = 0; d < sizeof names / sizeof names[0]; d++) {
            tide_llama_config cfg;
            tide_llama_config_named(ctx, "llama-2-70b", &cfg);
            if (!strcmp(names[d], "q4_k_m")) { /* a mix: per-weight types as llama.cpp's quantizer stores them */
                if (tide_quant_mix_apply(ctx, names[d], &cfg)) {
                    fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
                    return 1;
                }
            } else {
                tide_dtype_parse(names[d], &cfg.dtype);
            }
            tide_llama_graph_opts go = {.batch = 1, .seq = 1, .ctx_len = seq + steps};
            tide_graph *g = NULL;
            if (tide_llama_build(ctx, &cfg, &go, &g)) {
                fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
                return 1;
            }
            uint64_t budget = machines[m].budget;
            row dev = run_tide(g, &hw, budget, steps, false), co = run_tide(g, &hw, budget, steps, true);
            int ngl = 0;
            row lc = run_ngl(g, &cfg, &hw, budget, seq + steps, &ngl);
            char b1[32], b2[32], b3[32], b4[32], b5[32];
            printf("| %s | %.0f GiB | %s %s | %.3f | %.3f | %.3f | %s | %.3f | %.3f | %.3f | %s | %s | -ngl %d of %d | "
                   "%.3f | %.2fx (%.2fx) | %.2fx |\n",
                   hw.name, (double)budget / (1 << 30), names[d],
                   fmt_gb((double)tide_graph_role_bytes(g, TIDE_ROLE_WEIGHT), b5, sizeof b5), dev.tps,
                   dev.steady_tps, dev.xlb, fmt_gb(dev.link_per_tok, b1, sizeof b1), co.tps, co.steady_tps, co.xlb,
                   fmt_gb(co.link_per_tok, b2, sizeof b2), fmt_gb(co.host_per_tok, b3, sizeof b3), ngl,
                   cfg.num_hidden_layers, lc.tps, dev.tps > 0 ? co.tps / dev.tps : 0,
                   dev.steady_tps > 0 ? co.steady_tps / dev.steady_tps : 0, lc.tps > 0 ? co.steady_tps / lc.tps : 0);
            (void)b4;
            if (json)
                fprintf(json, "{\"hw\":\"%s\",\"budget_bytes\":%llu,\"dtype\":\"%s\",\"weight_bytes\":%llu,"
                        "\"device_only\":{\"ok\":%s,\"tokens_per_s\":%.6g,\"steady_tokens_per_s\":%.6g,\"x_lower_bound\":%.6g,"
                        "\"link_bytes_per_token\":%.6g},\"coffload\":{\"ok\":%s,\"tokens_per_s\":%.6g,\"steady_tokens_per_s\":%.6g,"
                        "\"x_lower_bound\":%.6g,\"link_bytes_per_token\":%.6g,\"host_weight_bytes_per_token\":%.6g,"
                        "\"host_ops\":%d},\"ngl_model\":{\"ngl\":%d,\"tokens_per_s\":%.6g}}\n",
                        hw.name, (unsigned long long)budget, names[d],
                        (unsigned long long)tide_graph_role_bytes(g, TIDE_ROLE_WEIGHT), dev.ok ? "true" : "false",
                        dev.tps, dev.steady_tps, dev.xlb, dev.link_per_tok, co.ok ? "true" : "false", co.tps,
                        co.steady_tps, co.xlb,
                        co.link_per_tok, co.host_per_tok, co.host_ops, ngl, lc.tps);
            tide_graph_free(g);
        }
    }
    if (json) fclose(json);
    tide_ctx_free(ctx);
    return 0;
}
