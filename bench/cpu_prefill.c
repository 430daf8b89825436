/*
 * cpu_prefill.c - CPU prefill throughput in each matmul mode against a raw
 * GEMM library of the same shapes in the same mode, measured side by side
 * in one run (rounds alternate tide and the raw GEMMs, mode by mode).
 *
 *   bench_cpu_prefill [--config NAME] [--seq N] [--reps N] MODEL_DIR
 *
 * MODEL_DIR holds a checkpoint; if it has none, a synthetic one of --config
 * (default tinyllama-1.1b, bf16) is generated there first. For each mode
 * (f32, fast) the benchmark runs the prefill graph (batch 1, --seq tokens,
 * default 512) through the CPU backend and reports tokens/s and achieved
 * GFLOP/s (graph FLOPs / wall time, best of --reps), then the raw GEMMs of
 * exactly the graph's matmul shapes, and the ratio tide / raw:
 *   f32:  OpenBLAS cblas_sgemm on f32 operands (its own threads), and
 *         oneDNN's f32 matmul where the build found oneDNN;
 *   fast: oneDNN's bf16 x bf16 -> f32 matmul (weights in their stored (N, K)
 *         layout, primitives made once per shape before timing), where the
 *         build found oneDNN.
 * The raw GEMMs do only the matmuls: the ratio counts everything else tide
 * does (attention, norms, rounding activations) against it. Target >= 0.6.
 */
#include "backend/cpu/kernels_int.h"
#include "graph/graph.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef TIDE_BENCH_ONEDNN
#include <dnnl.h>
#endif

static double best_of(double a, double b) { return a < b ? a : b; }

/* The graph's matmul shapes (M, K, N), in order. */
typedef struct mm_shape {
    int M, K, N;
} mm_shape;

#ifdef TIDE_BENCH_ONEDNN
/* oneDNN matmuls of every shape in one data type (bf16 or f32 operands, f32
 * output), made before timing. */
typedef struct dnn_set {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    int n;
    dnnl_primitive_t *p;
    dnnl_memory_t *a, *b, *c;
} dnn_set;

static int dnn_make(dnn_set *d, const mm_shape *sh, int n, dnnl_data_type_t t, void *A, void *B, float *C) {
    memset(d, 0, sizeof *d);
    if (dnnl_engine_create(&d->eng, dnnl_cpu, 0) || dnnl_stream_create(&d->strm, d->eng, dnnl_stream_default_flags))
        return -1;
    d->n = n;
    d->p = calloc((size_t)n, sizeof *d->p);
    d->a = calloc((size_t)n, sizeof *d->a);
    d->b = calloc((size_t)n, sizeof *d->b);
    d->c = calloc((size_t)n, sizeof *d->c);
    for (int i = 0; i < n; i++) {
        dnnl_memory_desc_t a, b, c;
        int64_t M = sh[i].M, K = sh[i].K, N = sh[i].N;
        dnnl_matmul_desc_t md;
        dnnl_primitive_desc_t pd;
        if (dnnl_memory_desc_init_by_strides(&a, 2, (dnnl_dims_t){M, K}, t, (dnnl_dims_t){K, 1}) ||
            dnnl_memory_desc_init_by_strides(&b, 2, (dnnl_dims_t){K, N}, t, (dnnl_dims_t){1, K}) ||
            dnnl_memory_desc_init_by_strides(&c, 2, (dnnl_dims_t){M, N}, dnnl_f32, (dnnl_dims_t){N, 1}) ||
            dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) || dnnl_primitive_desc_create(&pd, &md, NULL, d->eng, NULL))
            return -1;
        dnnl_status_t st = dnnl_primitive_create(&d->p[i], pd);
        dnnl_primitive_desc_destroy(pd);
        if (st || dnnl_memory_create(&d->a[i], &a, d->eng, A) || dnnl_memory_create(&d->b[i], &b, d->eng, B) ||
            dnnl_memory_create(&d->c[i], &c, d->eng, C))
            return -1;
    }
    return 0;
}

static double dnn_run(dnn_set *d) {
    double t0 = tide_now();
    for (int i = 0; i < d->n; i++) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, d->a[i]}, {DNNL_ARG_WEIGHTS, d->b[i]}, {DNNL_ARG_DST, d->c[i]}};
        if (dnnl_primitive_execute(d->p[i], d->strm, 3, args)) return -1;
    }
    dnnl_stream_wait(d->strm);
    return tide_now() - t0;
}

static void dnn_free(dnn_set *d) {
    for (int i = 0; i < d->n; i++) {
        dnnl_primitive_destroy(d->p[i]);
        dnnl_memory_destroy(d->a[i]);
        dnnl_memory_destroy(d->b[i]);
        dnnl_memory_destroy(d->c[i]);
    }
    free(d->p);
    free(d->a);
    free(d->b);
    free(d->c);
    if (d->strm) dnnl_stream_destroy(d->strm);
    if (d->eng) dnnl_engine_destroy(d->eng);
}
#endif

static double sgemm_run(const mm_shape *sh, int n, const float *A, const float *B, float *C) {
    double t0 = tide_now();
    for (int i = 0; i < n; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, sh[i].M, sh[i].N, sh[i].K, 1.0f, A, sh[i].K, B, sh[i].K,
                    0.0f, C, sh[i].N);
    return tide_now() - t0;
}

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

    /* the graph's matmul shapes, and operands big enough for the largest */
    mm_shape *sh = malloc((size_t)g->n_ops * sizeof *sh);
    int nsh = 0;
    size_t max_a = 0, max_b = 0, max_c = 0;
    double mm_flops = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        if (op->kind != TIDE_OP_MATMUL) continue;
        const tide_tensor *x = &g->tensors[op->in[0]], *w = &g->tensors[op->in[1]];
        sh[nsh++] = (mm_shape){(int)x->shape[0], (int)x->shape[1], (int)w->shape[0]};
        max_a = TIDE_MAX(max_a, (size_t)(x->shape[0] * x->shape[1]));
        max_b = TIDE_MAX(max_b, (size_t)(w->shape[0] * w->shape[1]));
        max_c = TIDE_MAX(max_c, (size_t)(x->shape[0] * w->shape[0]));
        mm_flops += op->flops;
    }
    float *A = malloc(max_a * 4), *Bm = malloc(max_b * 4), *C = malloc(max_c * 4);
    uint16_t *Ah = malloc(max_a * 2), *Bh = malloc(max_b * 2);
    for (size_t i = 0; i < max_a; i++) A[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < max_b; i++) Bm[i] = (float)((i * 5) % 11) * 0.01f;
    tk_round_bf16(A, (int64_t)max_a, 1, (int64_t)max_a, Ah, (int64_t)max_a, 1);
    tk_round_bf16(Bm, (int64_t)max_b, 1, (int64_t)max_b, Bh, (int64_t)max_b, 1);
    int nt = tide_ctx_threads(ctx);
    omp_set_num_threads(nt); /* oneDNN (OpenMP) takes the calling thread's count */
#ifdef TIDE_BENCH_ONEDNN
    dnn_set dbf, df32;
    if (dnn_make(&dbf, sh, nsh, dnnl_bf16, Ah, Bh, C) || dnn_make(&df32, sh, nsh, dnnl_f32, A, Bm, C)) {
        fprintf(stderr, "bench: oneDNN matmul primitives could not be made\n");
        return 1;
    }
#endif

    /* rounds: each mode's tide prefill, then its raw GEMMs, interleaved */
    static const tide_matmul_mode modes[2] = {TIDE_MATMUL_F32, TIDE_MATMUL_FAST};
    double t_tide[2] = {1e30, 1e30}, t_sgemm = 1e30, t_dnn[2] = {1e30, 1e30};
    for (int r = 0; r <= reps; r++) /* round 0 faults the mapped weights in and warms up */
        for (int mi = 0; mi < 2; mi++) {
            tide_gen_stats st;
            if (tide_backend_set_matmul(be, modes[mi]) || tide_model_generate(m, prompt, seq, 1, &next, &st)) {
                fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
                return 1;
            }
            if (r > 0) t_tide[mi] = best_of(t_tide[mi], st.prefill_s);
            if (mi == 0) {
                double t = sgemm_run(sh, nsh, A, Bm, C);
                if (r > 0) t_sgemm = best_of(t_sgemm, t);
            }
#ifdef TIDE_BENCH_ONEDNN
            double t = dnn_run(mi ? &dbf : &df32);
            if (t < 0) {
                fprintf(stderr, "bench: a oneDNN matmul failed\n");
                return 1;
            }
            if (r > 0) t_dnn[mi] = best_of(t_dnn[mi], t);
#endif
        }
    double gf[2] = {flops / t_tide[0] / 1e9, flops / t_tide[1] / 1e9};
    double sg = mm_flops / t_sgemm / 1e9, dn[2] = {mm_flops / t_dnn[0] / 1e9, mm_flops / t_dnn[1] / 1e9};
    printf("bench cpu_prefill: %s, %s weights, seq %d, %d threads\n", cfg->name, tide_dtype_name(cfg->dtype), seq,
           nt);
    tide_backend_set_matmul(be, TIDE_MATMUL_FAST);
    printf("  kernels (fast): %s\n", tide_backend_kernels(be));
    printf("  f32  tide prefill    %8.3f s  %8.1f GFLOP/s  %7.1f tokens/s  (%.1f GFLOP)\n", t_tide[0], gf[0],
           seq / t_tide[0], flops / 1e9);
    printf("       raw sgemm       %8.3f s  %8.1f GFLOP/s  (OpenBLAS %s, same matmul shapes)\n", t_sgemm, sg,
           tk_blas_corename());
#ifdef TIDE_BENCH_ONEDNN
    printf("       raw oneDNN f32  %8.3f s  %8.1f GFLOP/s\n", t_dnn[0], dn[0]);
#endif
    printf("       ratio tide/sgemm %7.3f  (target >= 0.6)\n", gf[0] / sg);
    printf("  fast tide prefill    %8.3f s  %8.1f GFLOP/s  %7.1f tokens/s\n", t_tide[1], gf[1], seq / t_tide[1]);
#ifdef TIDE_BENCH_ONEDNN
    printf("       raw oneDNN bf16 %8.3f s  %8.1f GFLOP/s\n", t_dnn[1], dn[1]);
    printf("       ratio tide/oneDNN bf16 %7.3f  (target >= 0.6)\n", gf[1] / dn[1]);
#else
    printf("       (no oneDNN in this build: no raw bf16 GEMM to compare with)\n");
#endif
    printf("{\"bench\":\"cpu_prefill\",\"config\":\"%s\",\"seq\":%d,\"threads\":%d,"
           "\"f32\":{\"tide_s\":%.6f,\"tide_gflops\":%.3f,\"tokens_per_s\":%.2f,\"sgemm_s\":%.6f,"
           "\"sgemm_gflops\":%.3f,\"ratio\":%.4f},"
           "\"fast\":{\"tide_s\":%.6f,\"tide_gflops\":%.3f,\"tokens_per_s\":%.2f",
           cfg->name, seq, nt, t_tide[0], gf[0], seq / t_tide[0], t_sgemm, sg, gf[0] / sg, t_tide[1], gf[1],
           seq / t_tide[1]);
#ifdef TIDE_BENCH_ONEDNN
    printf(",\"onednn_s\":%.6f,\"onednn_gflops\":%.3f,\"ratio\":%.4f},\"onednn_f32_gflops\":%.3f}\n", t_dnn[1],
           dn[1], gf[1] / dn[1], dn[0]);
    dnn_free(&dbf);
    dnn_free(&df32);
#else
    printf("}}\n");
#endif
    (void)dn;
    free(sh);
    free(A);
    free(Bm);
    free(C);
    free(Ah);
    free(Bh);
    free(prompt);
    tide_graph_free(g);
    tide_model_free(m);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    return 0;
}
