/*
 * cpu_prefill.c - CPU prefill throughput against raw OpenBLAS sgemm, measured
 * side by side in one run.
 *
 *   bench_cpu_prefill [--config NAME] [--seq N] [--reps N] MODEL_DIR
 *
 * MODEL_DIR holds a checkpoint; if it has none, a synthetic one of --config
 * (default tinyllama-1.1b, bf16) is generated there first. The benchmark runs
 * the prefill graph (batch 1, --seq tokens, default 512) through the CPU
 * backend and reports achieved GFLOP/s (graph FLOPs / wall time, best of
 * --reps), then times cblas_sgemm on f32 operands of exactly the graph's matmul
 * shapes (the same total size) and prints the ratio. Target >= 0.6.
 */
#include "graph/graph.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static double best_of(double a, double b) { return a < b ? a : b; }

int main(int argc, char **argv) {
    const char *config = "tinyllama-1.1b", *dir = NULL;
    int seq = 512, reps = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) seq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (argv[i][0] != '-') dir = argv[i];
        else {
            fprintf(stderr, "usage: %s [--config NAME] [--seq N] [--reps N] MODEL_DIR\n", argv[0]);
            return 2;
        }
    }
    if (!dir || seq < 1 || reps < 1) {
        fprintf(stderr, "usage: %s [--config NAME] [--seq N] [--reps N] MODEL_DIR\n", argv[0]);
        return 2;
    }
    tide_ctx *ctx = tide_ctx_new();
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        tide_llama_config cfg;
        if (tide_llama_config_named(ctx, config, &cfg) ||
            tide_checkpoint_make_synthetic(ctx, &cfg, 0, 0, dir)) {
            fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
            return 1;
        }
    }
    tide_checkpoint *ck = NULL;
    tide_backend *be = NULL;
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = seq};
    if (tide_checkpoint_open(ctx, dir, &ck) || tide_backend_new(ctx, TIDE_BACKEND_CPU, &be) ||
        tide_model_new(ctx, ck, be, &mo, &m)) {
        fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    tide_llama_graph_opts go = {.batch = 1, .seq = seq, .ctx_len = seq};
    tide_graph *g = NULL;
    if (tide_llama_build(ctx, cfg, &go, &g)) {
        fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    double flops = tide_graph_flops(g);
    int32_t *prompt = malloc((size_t)seq * sizeof *prompt), next;
    for (int i = 0; i < seq; i++) prompt[i] = (int32_t)((1u + (uint32_t)i * 2654435761u) % (uint32_t)cfg->vocab_size);

    /* tide: prefill (the first run also faults the mapped weights in) */
    double t_tide = 1e30;
    for (int r = 0; r <= reps; r++) {
        tide_gen_stats st;
        if (tide_model_generate(m, prompt, seq, 1, &next, &st)) {
            fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
            return 1;
        }
        if (r > 0) t_tide = best_of(t_tide, st.prefill_s);
    }

    /* raw sgemm on the graph's matmul shapes, f32 operands */
    size_t max_a = 0, max_b = 0, max_c = 0;
    double mm_flops = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        if (op->kind != TIDE_OP_MATMUL) continue;
        const tide_tensor *x = &g->tensors[op->in[0]], *w = &g->tensors[op->in[1]];
        max_a = TIDE_MAX(max_a, (size_t)(x->shape[0] * x->shape[1]));
        max_b = TIDE_MAX(max_b, (size_t)(w->shape[0] * w->shape[1]));
        max_c = TIDE_MAX(max_c, (size_t)(x->shape[0] * w->shape[0]));
        mm_flops += op->flops;
    }
    float *A = malloc(max_a * 4), *Bm = malloc(max_b * 4), *C = malloc(max_c * 4);
    for (size_t i = 0; i < max_a; i++) A[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < max_b; i++) Bm[i] = (float)((i * 5) % 11) * 0.01f;
    double t_raw = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = tide_now();
        for (int i = 0; i < g->n_ops; i++) {
            const tide_op *op = &g->ops[i];
            if (op->kind != TIDE_OP_MATMUL) continue;
            const tide_tensor *x = &g->tensors[op->in[0]], *w = &g->tensors[op->in[1]];
            int M = (int)x->shape[0], K = (int)x->shape[1], N = (int)w->shape[0];
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, Bm, K, 0.0f, C, N);
        }
        double dt = tide_now() - t0;
        if (r > 0) t_raw = best_of(t_raw, dt);
    }
    double tide_gfs = flops / t_tide / 1e9, raw_gfs = mm_flops / t_raw / 1e9;
    printf("bench cpu_prefill: %s, %s weights, seq %d, %d threads\n", cfg->name,
           tide_dtype_name(cfg->dtype), seq, tide_ctx_threads(ctx));
    printf("  tide prefill      %8.3f s  %8.1f GFLOP/s  (%.1f GFLOP, %.1f tokens/s)\n", t_tide,
           tide_gfs, flops / 1e9, seq / t_tide);
    printf("  raw sgemm         %8.3f s  %8.1f GFLOP/s  (%.1f GFLOP, same matmul shapes, f32)\n",
           t_raw, raw_gfs, mm_flops / 1e9);
    printf("  ratio             %8.3f  (target >= 0.6)\n", tide_gfs / raw_gfs);
    printf("{\"bench\":\"cpu_prefill\",\"config\":\"%s\",\"seq\":%d,\"tide_s\":%.6f,\"tide_gflops\":%.3f,"
           "\"sgemm_s\":%.6f,\"sgemm_gflops\":%.3f,\"ratio\":%.4f}\n",
           cfg->name, seq, t_tide, tide_gfs, t_raw, raw_gfs, tide_gfs / raw_gfs);
    free(A);
    free(Bm);
    free(C);
    free(prompt);
    tide_graph_free(g);
    tide_model_free(m);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    return 0;
}
