/*
 * cpu_quant.c - the CPU's block-quantized MATMUL (tk_matmul_q) against the
 * machine's memory bandwidth and against tide's bf16 products of the same
 * shapes, measured side by side in one run.
 *
 *   bench_cpu_quant [--threads LIST] [--types LIST] [--n LIST] [--k K] [--rows R]
 *                   [--reps N] [--mib M] [--no-prefill] [--json FILE]
 *
 * For each weight type (default q8_0,q4_0,q4_k,q5_k,q6_k), each shape
 * (K = --k, default 2048; N in --n, default 2048,5632,32000: the built-in
 * model's) and each thread count (--threads, default 1,2):
 *   1. decode (one row): the weight is held in as many copies as make --mib
 *      MiB (default 512, far beyond the caches) and each round runs, one after
 *      another, (a) a streaming read (a sum) of every copy's bytes on the same
 *      threads, (b) the quantized GEMV over every copy, (c) tide's bf16 GEMV
 *      (the default mode's kernel, tk_matmul_fast: bf16 x bf16 on AVX512_BF16
 *      CPUs, else f32 widening) over bf16 copies of the same shape. Reported:
 *      the quantized weight's GB/s (its bytes / the time of one GEMV) and its
 *      fraction of the stream read's GB/s, and the bf16 GEMV's time over the
 *      quantized one's (the speed-up from reading fewer bytes). Best of --reps
 *      rounds (default 5).
 *   2. prefill (--rows rows, default 512; --no-prefill leaves it out): one
 *      product, the quantized kernel and then the bf16 one on the same x,
 *      GFLOP/s (2 R N K / time) and the ratio quantized / bf16. Best of
 *      max(2, --reps / 2) rounds.
 * A markdown table and one JSON line per (type, N, threads), also appended
 * to --json FILE. Exit status 0; 1 when a kernel fails; 2 for a usage error.
 */
#include "backend/cpu/kernels_int.h"
#include "core/quant_blocks.h"
#include "tide.h"

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint64_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

static float frand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

/* Random blocks of dt (every quant byte uniform, scales 1e-3..1e-2). */
static void fill_q(tide_dtype dt, uint8_t *w, size_t nb) {
    for (size_t i = 0; i < nb; i += 8) {
        uint64_t r = rnd();
        memcpy(w + i, &r, nb - i < 8 ? nb - i : 8);
    }
    size_t bb = tide_dtype_block_bytes(dt);
    for (size_t off = 0; off < nb; off += bb) {
        uint16_t d = tide_f32_to_f16(0.001f + 0.009f * (0.5f + 0.5f * frand()));
        if (dt == TIDE_Q6_K) ((tide_block_q6_k *)(w + off))->d = d;
        else memcpy(w + off, &d, 2); /* Q8_0, Q4_0: d first; Q4_K, Q5_K: d then dmin */
        if (dt == TIDE_Q4_K || dt == TIDE_Q5_K) memcpy(w + off + 2, &d, 2);
    }
}

static volatile uint64_t sink;

/* Sum of n words on nt threads. */
static uint64_t stream_sum(const uint64_t *p, size_t n, int nt) {
    uint64_t s = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : s) num_threads(nt)
    for (size_t i = 0; i < n; i++) s += p[i];
    return s;
}

static int parse_list(const char *s, long *v, int max) {
    int n = 0;
    while (*s && n < max) {
        char *e;
        v[n++] = strtol(s, &e, 10);
        if (e == s) return -1;
        s = *e == ',' ? e + 1 : e;
    }
    return n;
}

static double dmin(double a, double b) { return a < b ? a : b; }

int main(int argc, char **argv) {
    long threads[8] = {1, 2}, ns[8] = {2048, 5632, 32000};
    int nthr = 2, nn = 3, reps = 5, prefill = 1;
    long K = 2048, R = 512, mib = 512;
    const char *types = "q8_0,q4_0,q4_k,q5_k,q6_k", *json = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--threads") && v) nthr = parse_list(argv[++i], threads, 8);
        else if (!strcmp(a, "--n") && v) nn = parse_list(argv[++i], ns, 8);
        else if (!strcmp(a, "--types") && v) types = argv[++i];
        else if (!strcmp(a, "--k") && v) K = atol(argv[++i]);
        else if (!strcmp(a, "--rows") && v) R = atol(argv[++i]);
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--mib") && v) mib = atol(argv[++i]);
        else if (!strcmp(a, "--json") && v) json = argv[++i];
        else if (!strcmp(a, "--no-prefill")) prefill = 0;
        else {
            fprintf(stderr, "usage: %s [--threads LIST] [--types LIST] [--n LIST] [--k K] [--rows R] [--reps N] "
                    "[--mib M] [--no-prefill] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    if (nthr < 1 || nn < 1 || K < 256 || K % 256 || R < 1 || reps < 1 || mib < 1) {
        fprintf(stderr, "bench_cpu_quant: bad arguments (K a multiple of 256)\n");
        return 2;
    }
    FILE *jf = json ? fopen(json, "a") : NULL;
    tk_init();
    char isa[160];
    tk_cpu_names(tk_cpu_detected(), isa, sizeof isa);
    printf("bench cpu_quant: K %ld, decode over %ld MiB of weight copies, prefill %ld rows; quantized path %s, "
           "bf16 %s; cpu: %s\n\n", K, mib, R, tk_matmul_q_path(),
           tk_matmul_fast_native(TIDE_BF16) ? "avx512_bf16 (bf16 x bf16)" : "f32 widening", isa);
    printf("| type | N | threads | q GEMV us | GB/s | stream GB/s | fraction | bf16 GEMV us | bf16/q time |"
           " prefill q GFLOP/s | bf16 GFLOP/s | q/bf16 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    float *x = malloc(sizeof(float) * (size_t)(R * K));
    for (long i = 0; i < R * K; i++) x[i] = frand();
    size_t sb = tk_matmul_q_row_bytes(K) * (size_t)R, fb = tk_matmul_fast_min_scratch(K) * (size_t)R;
    void *scratch = tide_malloc_aligned(sb > fb ? sb : fb, 64);
    float *out = malloc(sizeof(float) * (size_t)R * 32768);
    int rc = 0;
    char tbuf[256];
    snprintf(tbuf, sizeof tbuf, "%s", types);
    for (char *tn = strtok(tbuf, ","); tn; tn = strtok(NULL, ",")) {
        tide_dtype dt;
        if (tide_dtype_parse(tn, &dt) || !tide_dtype_is_quantized(dt)) {
            fprintf(stderr, "bench_cpu_quant: '%s' is not a block type\n", tn);
            return 2;
        }
        for (int in = 0; in < nn; in++) {
            long N = ns[in];
            if (N > 32768) N = 32768;
            size_t qb = (size_t)tide_dtype_bytes(dt, (uint64_t)(N * K)), bb = (size_t)(N * K) * 2;
            size_t total = (size_t)mib << 20;
            int nq = (int)TIDE_MAX(2, (total + qb - 1) / qb), nb = (int)TIDE_MAX(2, (total + bb - 1) / bb);
            uint8_t *wq = tide_malloc_aligned(qb * (size_t)nq, 4096);
            uint16_t *wb = tide_malloc_aligned(bb * (size_t)nb, 4096);
            if (!wq || !wb || !scratch || !out || !x) {
                fprintf(stderr, "bench_cpu_quant: out of memory\n");
                return 1;
            }
            for (int c = 0; c < nq; c++) fill_q(dt, wq + qb * (size_t)c, qb);
            for (size_t i = 0; i < (size_t)(N * K); i++) wb[i] = tide_f32_to_bf16(0.01f * frand());
            for (int c = 1; c < nb; c++) memcpy(wb + (size_t)(N * K) * (size_t)c, wb, bb);
            for (int it = 0; it < nthr; it++) {
                int nt = (int)threads[it];
                double ts = 1e30, tq = 1e30, tb = 1e30, pq = 1e30, pb = 1e30;
                for (int r = 0; r <= reps; r++) { /* round 0 warms up */
                    double t0 = tide_now();
                    sink += stream_sum((const uint64_t *)wq, qb * (size_t)nq / 8, nt);
                    double t1 = tide_now();
                    for (int c = 0; c < nq; c++)
                        if (tk_matmul_q(x, wq + qb * (size_t)c, dt, 1, K, N, out, N, scratch, sb, nt)) rc = 1;
                    double t2 = tide_now();
                    for (int c = 0; c < nb; c++)
                        if (tk_matmul_fast(x, wb + (size_t)(N * K) * (size_t)c, TIDE_BF16, 1, K, N, false, out, N,
                                           scratch, fb, nt))
                            rc = 1;
                    double t3 = tide_now();
                    if (r == 0) continue;
                    ts = dmin(ts, (t1 - t0) / nq);
                    tq = dmin(tq, (t2 - t1) / nq);
                    tb = dmin(tb, (t3 - t2) / nb);
                }
                for (int r = 0; prefill && r <= TIDE_MAX(2, reps / 2); r++) {
                    double t0 = tide_now();
                    if (tk_matmul_q(x, wq, dt, R, K, N, out, N, scratch, sb, nt)) rc = 1;
                    double t1 = tide_now();
                    if (tk_matmul_fast(x, wb, TIDE_BF16, R, K, N, false, out, N, scratch, fb, nt)) rc = 1;
                    double t2 = tide_now();
                    if (r == 0) continue;
                    pq = dmin(pq, t1 - t0);
                    pb = dmin(pb, t2 - t1);
                }
                double gq = (double)qb / tq / 1e9, gs = (double)qb / ts / 1e9, fl = 2.0 * R * N * K;
                printf("| %s | %ld | %d | %.1f | %.1f | %.1f | %.2f | %.1f | %.2f |", tide_dtype_name(dt), N, nt,
                       tq * 1e6, gq, gs, gq / gs, tb * 1e6, tb / tq);
                if (prefill) printf(" %.1f | %.1f | %.2f |\n", fl / pq / 1e9, fl / pb / 1e9, pb / pq);
                else printf(" - | - | - |\n");
                char line[512];
                snprintf(line, sizeof line,
                         "{\"bench\":\"cpu_quant\",\"type\":\"%s\",\"K\":%ld,\"N\":%ld,\"threads\":%d,\"path\":\"%s\","
                         "\"gemv_s\":%.9f,\"gemv_gbps\":%.3f,\"stream_gbps\":%.3f,\"fraction\":%.4f,"
                         "\"bf16_gemv_s\":%.9f,\"bf16_over_q\":%.4f,\"prefill_rows\":%ld,\"prefill_q_gflops\":%.3f,"
                         "\"prefill_bf16_gflops\":%.3f}",
                         tide_dtype_name(dt), K, N, nt, tk_matmul_q_path(), tq, gq, gs, gq / gs, tb, tb / tq,
                         prefill ? R : 0, prefill ? fl / pq / 1e9 : 0, prefill ? fl / pb / 1e9 : 0);
                if (jf) fprintf(jf, "%s\n", line), fflush(jf);
                fprintf(stderr, "%s\n", line);
                fflush(stdout);
            }
            tide_free_aligned(wq);
            tide_free_aligned(wb);
        }
    }
    if (jf) fclose(jf);
    free(x);
    free(out);
    tide_free_aligned(scratch);
    if (rc) fprintf(stderr, "bench_cpu_quant: a kernel failed\n");
    return rc;
}
