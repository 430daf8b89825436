/*
 * gemm_bf16.c - the products of a bf16 training step (tk_matmul_bf16,
 * tk_matmul_gradw_bf16, tk_gemm_bf16: src/backend/cpu/sgemm_bf16.c) against
 * oneDNN's bf16 x bf16 -> f32 matmul of the same shapes, side by side in one
 * run (each round times every shape in tide, then in oneDNN).
 *
 *   bench_gemm_bf16 [--rows N[,N]] [--threads N[,N]] [--reps N] [--no-vocab]
 *                   [--only NAME]
 *
 * The shapes are tinyllama-1.1b's (hidden 2048, intermediate 5632, KV dim
 * 256, vocabulary 32000) at R rows (batch x seq; default 512 and 1024), and
 * LoRA's rank-16 products on the 2048-wide projections:
 *   fwd   y (R, N) = x (R, K) . w^T, w (N, K)          tk_matmul_bf16
 *   dx    dx (R, K) = dy (R, N) . w                     tk_matmul_bf16 (w_kn)
 *   dw    dw (N, K) = dy^T . x, summed over the R rows  tk_matmul_gradw_bf16
 * tide's operands are f32 (a step's activations and master weights, rounded
 * to bf16 as they are packed), and again bf16 (tk_gemm_bf16 on operands
 * rounded beforehand: the products alone); oneDNN's are bf16 in the same
 * layouts (strides, no reorder of the caller's memory), its primitives made
 * before timing. Best of --reps (default 3) after one warm-up round, per
 * thread count (default 1 and 2; OpenMP for both libraries). Prints a table
 * of GFLOP/s and the ratios tide / oneDNN, a JSON line per row, and an
 * FNV-1a hash of each of tide's outputs (to compare builds bit for bit).
 * --no-vocab leaves out the 32000-wide products, --only keeps the products
 * whose name holds NAME (e.g. "lora").
 * Without oneDNN in the build only tide's figures are printed.
 */
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_int.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef TIDE_BENCH_ONEDNN
#include <dnnl.h>
#endif

typedef enum { F_FWD, F_DX, F_DW } form;

typedef struct {
    const char *name;
    form f;
    int64_t N, K; /* the weight (N, K) */
} shape;

static const shape shapes[] = {
    {"q,o", F_FWD, 2048, 2048},       {"k,v", F_FWD, 256, 2048},      {"gate,up", F_FWD, 5632, 2048},
    {"down", F_FWD, 2048, 5632},      {"lm_head", F_FWD, 32000, 2048}, {"q,o", F_DX, 2048, 2048},
    {"k,v", F_DX, 256, 2048},         {"gate,up", F_DX, 5632, 2048},  {"down", F_DX, 2048, 5632},
    {"lm_head", F_DX, 32000, 2048},   {"q,o", F_DW, 2048, 2048},      {"k,v", F_DW, 256, 2048},
    {"gate,up", F_DW, 5632, 2048},    {"down", F_DW, 2048, 5632},     {"lm_head", F_DW, 32000, 2048},
    {"lora A", F_FWD, 16, 2048},      {"lora B", F_FWD, 2048, 16},    {"lora A", F_DX, 16, 2048},
    {"lora B", F_DX, 2048, 16},       {"lora A", F_DW, 16, 2048},     {"lora B", F_DW, 2048, 16},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))
static const char *form_name[] = {"fwd", "dx", "dw"};

/* The GEMM of a shape at R rows: C (M, Nc) = op(A) (M, Kc) . op(B). */
typedef struct {
    bool ta, tb;
    int64_t M, Nc, Kc, lda, ldb;
} gemm;

static gemm gemm_of(const shape *s, int64_t R) {
    switch (s->f) {
    case F_FWD: return (gemm){false, true, R, s->N, s->K, s->K, s->K};
    case F_DX: return (gemm){false, false, R, s->K, s->N, s->N, s->K};
    default: return (gemm){true, false, s->N, s->K, R, s->N, s->K};
    }
}

static uint64_t fnv(const float *c, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const uint8_t *p = (const uint8_t *)c;
    for (size_t i = 0; i < n * 4; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The operands of a shape: x or dy (R rows) and w, f32 and bf16. */
typedef struct {
    float *a, *b;
    uint16_t *ah, *bh;
} operands;

static double run_tide(const shape *s, int64_t R, const operands *o, float *C, bool f32_in, int nt) {
    const gemm g = gemm_of(s, R);
    double t0 = tide_now();
    if (!f32_in) {
        tk_gemm_bf16(g.ta, g.tb, g.M, g.Nc, g.Kc, o->ah, TIDE_BF16, g.lda, o->bh, TIDE_BF16, g.ldb, false, C, g.Nc,
                     nt);
    } else if (s->f == F_DW) {
        if (tk_matmul_gradw_bf16(o->a, TIDE_F32, o->b, TIDE_F32, R, s->N, s->K, false, C, nt)) return -1;
    } else {
        /* fwd: x (R, K) . w^T; dx: dy (R, N) . w, w taken (K', N') = (N, K) */
        const int64_t kk = s->f == F_FWD ? s->K : s->N, nn = s->f == F_FWD ? s->N : s->K;
        if (tk_matmul_bf16(o->a, TIDE_F32, o->b, TIDE_F32, R, kk, nn, s->f == F_DX, false, C, TIDE_F32, nn, NULL, 0,
                           nt))
            return -1;
    }
    return tide_now() - t0;
}

#ifdef TIDE_BENCH_ONEDNN
typedef struct {
    dnnl_primitive_t p;
    dnnl_memory_t a, b, c;
} dnn_mm;

static int dnn_make(dnnl_engine_t eng, const gemm *g, void *A, void *B, float *C, dnn_mm *d) {
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    dnnl_dims_t sa, sb;
    if (g->ta) sa[0] = 1, sa[1] = g->lda;
    else sa[0] = g->lda, sa[1] = 1;
    if (g->tb) sb[0] = 1, sb[1] = g->ldb;
    else sb[0] = g->ldb, sb[1] = 1;
    if (dnnl_memory_desc_init_by_strides(&a, 2, (dnnl_dims_t){g->M, g->Kc}, dnnl_bf16, sa) ||
        dnnl_memory_desc_init_by_strides(&b, 2, (dnnl_dims_t){g->Kc, g->Nc}, dnnl_bf16, sb) ||
        dnnl_memory_desc_init_by_strides(&c, 2, (dnnl_dims_t){g->M, g->Nc}, dnnl_f32, (dnnl_dims_t){g->Nc, 1}) ||
        dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) || dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL))
        return -1;
    dnnl_status_t st = dnnl_primitive_create(&d->p, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st || dnnl_memory_create(&d->a, &a, eng, A) || dnnl_memory_create(&d->b, &b, eng, B) ||
        dnnl_memory_create(&d->c, &c, eng, C))
        return -1;
    return 0;
}

static double dnn_run(dnnl_stream_t strm, dnn_mm *d) {
    double t0 = tide_now();
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, d->a}, {DNNL_ARG_WEIGHTS, d->b}, {DNNL_ARG_DST, d->c}};
    if (dnnl_primitive_execute(d->p, strm, 3, args)) return -1;
    dnnl_stream_wait(strm);
    return tide_now() - t0;
}
#endif

static int parse_list(const char *s, int64_t *v, int max) {
    int n = 0;
    while (*s && n < max) {
        char *e;
        long x = strtol(s, &e, 10);
        if (e == s || x < 1) return -1;
        v[n++] = x;
        s = *e == ',' ? e + 1 : e;
        if (*e && *e != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    int64_t rows[4] = {512, 1024}, thr[4] = {1, 2};
    int nrows = 2, nthr = 2, reps = 3;
    bool vocab = true;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc) nrows = parse_list(argv[++i], rows, 4);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) nthr = parse_list(argv[++i], thr, 4);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-vocab")) vocab = false;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else nrows = -1;
        if (nrows < 1 || nthr < 1 || reps < 1) {
            fprintf(stderr, "usage: %s [--rows N[,N]] [--threads N[,N]] [--reps N] [--no-vocab] [--only NAME]\n", argv[0]);
            return 2;
        }
    }
    int64_t rmax = 0;
    for (int i = 0; i < nrows; i++) rmax = TIDE_MAX(rmax, rows[i]);
    /* room for the largest operands and output */
    size_t na = 0, nb = 0, nc = 0;
    for (int s = 0; s < NSHAPES; s++) {
        na = TIDE_MAX(na, (size_t)(rmax * TIDE_MAX(shapes[s].N, shapes[s].K)));
        nb = TIDE_MAX(nb, (size_t)(shapes[s].N * shapes[s].K)); /* w, or x of dw */
        nb = TIDE_MAX(nb, (size_t)(rmax * shapes[s].K));
        const gemm g = gemm_of(&shapes[s], rmax);
        nc = TIDE_MAX(nc, (size_t)(g.M * g.Nc));
    }
    operands o = {malloc(na * 4), malloc(nb * 4), malloc(na * 2), malloc(nb * 2)};
    float *C = malloc(nc * 4);
    if (!o.a || !o.b || !o.ah || !o.bh || !C) {
        fprintf(stderr, "bench: out of memory\n");
        return 1;
    }
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < na; i++) r = r * 6364136223846793005ull + 1, o.a[i] = (float)((r >> 40) % 2001) * 1e-3f - 1;
    for (size_t i = 0; i < nb; i++) r = r * 6364136223846793005ull + 1, o.b[i] = (float)((r >> 40) % 2001) * 1e-4f - .1f;
    tk_round_bf16(o.a, (int64_t)na, 1, (int64_t)na, o.ah, (int64_t)na, 1);
    tk_round_bf16(o.b, (int64_t)nb, 1, (int64_t)nb, o.bh, (int64_t)nb, 1);
#ifdef TIDE_BENCH_ONEDNN
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) || dnnl_stream_create(&strm, eng, dnnl_stream_default_flags)) {
        fprintf(stderr, "bench: no oneDNN CPU engine\n");
        return 1;
    }
    const char *peer = "oneDNN bf16";
#else
    const char *peer = "(no oneDNN in this build)";
#endif
    printf("bench gemm_bf16: tide %s against %s, best of %d\n\n", tk_gemm_bf16_path(), peer, reps);
    printf("| rows | threads | product | M x N x K | tide f32 in GFLOP/s | tide bf16 in GFLOP/s | oneDNN bf16 GFLOP/s "
           "| f32 in / oneDNN | bf16 in / oneDNN | tide hash |\n|---|---|---|---|---|---|---|---|---|---|\n");
    double tot[4][4][3] = {{{0}}}, fl_all[4] = {0};
    for (int ri = 0; ri < nrows; ri++)
        for (int ti = 0; ti < nthr; ti++) {
            const int64_t R = rows[ri];
            const int nt = (int)thr[ti];
            omp_set_num_threads(nt); /* oneDNN (OpenMP) takes the calling thread's count */
            for (int si = 0; si < NSHAPES; si++) {
                const shape *s = &shapes[si];
                if (!vocab && s->N == 32000) continue;
                if (only && !strstr(s->name, only)) continue;
                const gemm g = gemm_of(s, R);
                const double fl = 2.0 * (double)g.M * (double)g.Nc * (double)g.Kc;
                double best[3] = {1e30, 1e30, 1e30};
#ifdef TIDE_BENCH_ONEDNN
                dnn_mm d = {0};
                if (dnn_make(eng, &g, o.ah, o.bh, C, &d)) {
                    fprintf(stderr, "bench: a oneDNN matmul could not be made\n");
                    return 1;
                }
#endif
                uint64_t h = 0;
                for (int rep = 0; rep <= reps; rep++) {
                    double t[3] = {run_tide(s, R, &o, C, true, nt), 0, 0};
                    if (rep == 0) h = fnv(C, (size_t)(g.M * g.Nc));
                    t[1] = run_tide(s, R, &o, C, false, nt);
#ifdef TIDE_BENCH_ONEDNN
                    t[2] = dnn_run(strm, &d);
#endif
                    if (t[0] < 0 || t[1] < 0 || t[2] < 0) {
                        fprintf(stderr, "bench: a product failed\n");
                        return 1;
                    }
                    for (int k = 0; k < 3 && rep > 0; k++) best[k] = TIDE_MIN(best[k], t[k]);
                }
#ifdef TIDE_BENCH_ONEDNN
                dnnl_primitive_destroy(d.p);
                dnnl_memory_destroy(d.a);
                dnnl_memory_destroy(d.b);
                dnnl_memory_destroy(d.c);
                const double gd = fl / best[2] / 1e9;
#else
                const double gd = 0;
#endif
                const double g0 = fl / best[0] / 1e9, g1 = fl / best[1] / 1e9;
                for (int k = 0; k < 3; k++) tot[ri][ti][k] += best[k];
                if (ti == 0) fl_all[ri] += fl;
                printf("| %lld | %d | %s %s | %lld x %lld x %lld | %.1f | %.1f | %.1f | %.2f | %.2f | %016llx |\n",
                       (long long)R, nt, s->name, form_name[s->f], (long long)g.M, (long long)g.Nc, (long long)g.Kc,
                       g0, g1, gd, gd > 0 ? g0 / gd : 0, gd > 0 ? g1 / gd : 0, (unsigned long long)h);
                printf("{\"bench\":\"gemm_bf16\",\"rows\":%lld,\"threads\":%d,\"product\":\"%s %s\",\"M\":%lld,"
                       "\"N\":%lld,\"K\":%lld,\"tide_f32_gflops\":%.2f,\"tide_bf16_gflops\":%.2f,"
                       "\"onednn_gflops\":%.2f,\"hash\":\"%016llx\"}\n",
                       (long long)R, nt, s->name, form_name[s->f], (long long)g.M, (long long)g.Nc, (long long)g.Kc,
                       g0, g1, gd, (unsigned long long)h);
                fflush(stdout);
            }
        }
    printf("\n| rows | threads | all products: tide f32 in GFLOP/s | tide bf16 in | oneDNN bf16 | f32 in / oneDNN |\n"
           "|---|---|---|---|---|---|\n");
    for (int ri = 0; ri < nrows; ri++)
        for (int ti = 0; ti < nthr; ti++) {
            const double f = fl_all[ri], *t = tot[ri][ti];
            const double gd = t[2] > 0 ? f / t[2] / 1e9 : 0;
            printf("| %lld | %lld | %.1f | %.1f | %.1f | %.2f |\n", (long long)rows[ri], (long long)thr[ti],
                   f / t[0] / 1e9, f / t[1] / 1e9, gd, gd > 0 ? f / t[0] / 1e9 / gd : 0);
        }
#ifdef TIDE_BENCH_ONEDNN
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
#endif
    free(o.a);
    free(o.b);
    free(o.ah);
    free(o.bh);
    free(C);
    return 0;
}
