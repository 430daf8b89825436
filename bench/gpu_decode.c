/*
 * gpu_decode.c - decode's matmuls on the GPU against its memory bandwidth:
 * the CUDA backend's kernels for one token (R = 1 row of activations) with
 * 16-bit and block-quantized weights, timed with CUDA events.
 *
 *   bench_gpu_decode [--config llama-7b|small] [--tokens N] [--reps N]
 *                    [--types bf16,q8_0,q6_k,q5_k,q4_k,q4_0] [--rows R]
 *                    [--json FILE]
 *
 * A token of --config (default llama-7b: hidden 4096, intermediate 11008, 32
 * layers, vocabulary 32000; "small": 512, 1536, 2 layers, 4096, for checking
 * this program) is its layers' seven projections (q, k, v, o: hidden x
 * hidden; gate, up: intermediate x hidden; down: hidden x intermediate) and
 * the head (vocabulary x hidden), each x (R, K) . w (N, K)^T with R = --rows
 * (default 1) through the launcher the backend takes for that many rows
 * (src/backend/cuda/cuda_ops.c): tcu_matmul_fused for 16-bit weights (both
 * matmul modes below 16 rows), tcu_qgemv for quantized ones. One layer's
 * weights are allocated and used by every layer (a layer is far larger than
 * L2 at llama-7b's shapes, so each pass streams from DRAM; with "small" it
 * is not, and the figures are not DRAM figures). --tokens tokens (default
 * 20) are launched back to back between two events, after one untimed
 * token; the best of --reps (default 5) is reported.
 *
 * Per type: weight bytes per token (every projection and the head; the
 * embedding row and the KV cache are left out), ms per token, tokens/s (of
 * the matmuls alone: an upper bound on decode), achieved GB/s (bytes / time)
 * and its fraction of (a) the device's peak (2 x memory clock x bus width,
 * from the device attributes) and (b) a device-to-device cudaMemcpy of 1 GiB
 * (read + write bytes / time), the practical ceiling.
 *
 * Output: a markdown table on stdout and one JSON line per row (also
 * appended to --json FILE). Exit status 0; 1 when a launch fails; 2 for a
 * usage error; 77 without the CUDA backend or a device.
 */
#include "tide.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TIDE_HAVE_CUDA
int main(void) {
    fprintf(stderr, "bench_gpu_decode: built without the CUDA backend: skipped\n");
    return 77;
}
#else
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_quant.h"

#include <cuda_runtime_api.h>

static FILE *json_out;

static void emit(const char *line) {
    puts(line);
    fflush(stdout);
    if (json_out) {
        fprintf(json_out, "%s\n", line);
        fflush(json_out);
    }
}

#define CK(call, what)                                                                            \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "bench_gpu_decode: %s: %s\n", what, cudaGetErrorString(e_));          \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

typedef struct shape {
    int64_t hidden, inter, layers, vocab;
} shape;

/* One token's matmuls: the seven projections of `layers` layers and the head. */
static void token(cudaStream_t s, tide_dtype dt, const shape *sh, int64_t R, const float *x, const float *xi,
                  void *const *w, float *out) {
    const int64_t H = sh->hidden, I = sh->inter;
    /* (N, K, weight index): q k v o gate up down, then the head */
    const int64_t mm[8][3] = {{H, H, 0}, {H, H, 1}, {H, H, 2}, {H, H, 3}, {I, H, 4}, {I, H, 5}, {H, I, 6},
                              {sh->vocab, H, 7}};
    for (int64_t l = 0; l <= sh->layers; l++)
        for (int m = l < sh->layers ? 0 : 7; m < (l < sh->layers ? 7 : 8); m++) {
            const int64_t N = mm[m][0], K = mm[m][1];
            const float *xx = K == I ? xi : x;
            cudaError_t e = tide_dtype_is_quantized(dt) ? tcu_qgemv(s, xx, w[mm[m][2]], dt, R, K, N, out, N)
                                                        : tcu_matmul_fused(s, xx, w[mm[m][2]], dt, R, K, N, out, N);
            CK(e, "matmul launch");
        }
}

int main(int argc, char **argv) {
    shape sh = {4096, 11008, 32, 32000};
    const char *cfg = "llama-7b", *types = "bf16,q8_0,q6_k,q5_k,q4_k,q4_0", *json = NULL;
    int tokens = 20, reps = 5;
    int64_t R = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") && v) cfg = argv[++i];
        else if (!strcmp(a, "--tokens") && v) tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--types") && v) types = argv[++i];
        else if (!strcmp(a, "--rows") && v) R = atoll(argv[++i]);
        else if (!strcmp(a, "--json") && v) json = argv[++i];
        else {
            fprintf(stderr, "usage: bench_gpu_decode [--config llama-7b|small] [--tokens N] [--reps N] "
                            "[--types LIST] [--rows R] [--json FILE]\n");
            return 2;
        }
    }
    if (!strcmp(cfg, "small")) sh = (shape){512, 1536, 2, 4096};
    else if (strcmp(cfg, "llama-7b")) {
        fprintf(stderr, "bench_gpu_decode: unknown --config '%s'\n", cfg);
        return 2;
    }
    if (tokens < 1 || reps < 1 || R < 1 || R >= 16) {
        fprintf(stderr, "bench_gpu_decode: --tokens and --reps >= 1, --rows in 1..15 (the decode paths)\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "bench_gpu_decode: no CUDA device: skipped\n");
        return 77;
    }
    if (json && !(json_out = fopen(json, "a"))) {
        fprintf(stderr, "bench_gpu_decode: cannot open %s\n", json);
        return 2;
    }
    int dev = 0, clk_khz = 0, bus_bits = 0;
    CK(cudaSetDevice(dev), "cudaSetDevice");
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, dev), "memory clock");
    CK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev), "bus width");
    const double peak = 2.0 * clk_khz * 1e3 * (bus_bits / 8.0) / 1e9; /* GB/s */
    cudaStream_t s;
    CK(cudaStreamCreate(&s), "cudaStreamCreate");
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0), "cudaEventCreate");
    CK(cudaEventCreate(&e1), "cudaEventCreate");

    /* the copy ceiling: 1 GiB device to device, best of reps */
    const size_t cb = (size_t)1 << 30;
    void *ca, *cbuf;
    CK(cudaMalloc(&ca, cb), "cudaMalloc (copy)");
    CK(cudaMalloc(&cbuf, cb), "cudaMalloc (copy)");
    CK(cudaMemsetAsync(ca, 1, cb, s), "cudaMemset");
    float best_copy = 1e30f;
    for (int r = 0; r < reps + 1; r++) {
        CK(cudaEventRecord(e0, s), "event");
        CK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
        CK(cudaEventRecord(e1, s), "event");
        CK(cudaEventSynchronize(e1), "event sync");
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
        if (r && ms < best_copy) best_copy = ms;
    }
    const double copy_gbs = 2.0 * (double)cb / (best_copy * 1e-3) / 1e9;
    CK(cudaFree(ca), "cudaFree");
    CK(cudaFree(cbuf), "cudaFree");

    char line[1024];
    snprintf(line, sizeof line, "{\"bench\":\"gpu_decode\",\"row\":\"device\",\"gpu\":\"%s\",\"peak_gbs\":%.1f,"
             "\"copy_gbs\":%.1f,\"config\":\"%s\",\"rows\":%lld}", prop.name, peak, copy_gbs, cfg, (long long)R);
    emit(line);
    printf("\n%s, peak %.0f GB/s (memory clock x bus), device copy %.0f GB/s; %s, %lld row(s) per matmul\n\n",
           prop.name, peak, copy_gbs, cfg, (long long)R);
    printf("| weights | GB/token | ms/token | tokens/s | GB/s | of peak | of copy |\n"
           "|---|---:|---:|---:|---:|---:|---:|\n");

    const int64_t H = sh.hidden, I = sh.inter;
    const int64_t wn[8][2] = {{H, H}, {H, H}, {H, H}, {H, H}, {I, H}, {I, H}, {H, I}, {sh.vocab, H}};
    float *x, *xi, *out;
    CK(cudaMalloc((void **)&x, (size_t)(R * H) * sizeof(float)), "cudaMalloc x");
    CK(cudaMalloc((void **)&xi, (size_t)(R * I) * sizeof(float)), "cudaMalloc x");
    CK(cudaMalloc((void **)&out, (size_t)(R * (sh.vocab > I ? sh.vocab : I)) * sizeof(float)), "cudaMalloc out");
    CK(cudaMemsetAsync(x, 0, (size_t)(R * H) * sizeof(float), s), "memset");
    CK(cudaMemsetAsync(xi, 0, (size_t)(R * I) * sizeof(float), s), "memset");
    int rc = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        tide_dtype dt;
        if (tide_dtype_parse(t, &dt) || !(dt == TIDE_BF16 || dt == TIDE_F16 || tide_dtype_is_quantized(dt))) {
            fprintf(stderr, "bench_gpu_decode: '%s' is not bf16, f16 or a block type\n", t);
            rc = 2;
            continue;
        }
        void *w[8];
        double bytes = 0;
        for (int m = 0; m < 8; m++) {
            uint64_t nb = tide_dtype_bytes(dt, (uint64_t)wn[m][1]) * (uint64_t)wn[m][0];
            CK(cudaMalloc(&w[m], nb), "cudaMalloc weights");
            /* 0x11: finite scales and quants in every layout (the speed does not depend on the values) */
            CK(cudaMemsetAsync(w[m], 0x11, nb, s), "memset weights");
            bytes += (double)nb * (m < 7 ? (double)sh.layers : 1.0);
        }
        token(s, dt, &sh, R, x, xi, w, out); /* untimed */
        float best = 1e30f;
        for (int r = 0; r < reps; r++) {
            CK(cudaEventRecord(e0, s), "event");
            for (int k = 0; k < tokens; k++) token(s, dt, &sh, R, x, xi, w, out);
            CK(cudaEventRecord(e1, s), "event");
            CK(cudaEventSynchronize(e1), "event sync");
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
            if (ms < best) best = ms;
        }
        const double ms_tok = best / tokens, gbs = bytes / (ms_tok * 1e-3) / 1e9;
        printf("| %s | %.3f | %.3f | %.1f | %.0f | %.2f | %.2f |\n", tide_dtype_name(dt), bytes / 1e9, ms_tok,
               1e3 / ms_tok, gbs, gbs / peak, gbs / copy_gbs);
        snprintf(line, sizeof line, "{\"bench\":\"gpu_decode\",\"row\":\"matmuls\",\"dtype\":\"%s\",\"config\":\"%s\","
                 "\"rows\":%lld,\"bytes_per_token\":%.0f,\"ms_per_token\":%.4f,\"tokens_per_s\":%.2f,\"gbs\":%.1f,"
                 "\"of_peak\":%.3f,\"of_copy\":%.3f}", tide_dtype_name(dt), cfg, (long long)R, bytes, ms_tok,
                 1e3 / ms_tok, gbs, gbs / peak, gbs / copy_gbs);
        emit(line);
        for (int m = 0; m < 8; m++) CK(cudaFree(w[m]), "cudaFree");
    }
    CK(cudaFree(x), "cudaFree");
    CK(cudaFree(xi), "cudaFree");
    CK(cudaFree(out), "cudaFree");
    if (json_out) fclose(json_out);
    return rc;
}
#endif
