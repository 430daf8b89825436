/*
 * engine.c - the one engine's price: resident runs through an unconstrained
 * plan on the executor (the planned engine, the default) against the plain
 * engine (every op in order, all tensors in one buffer, no planner, verifier
 * or executor), measured side by side in one process, alternating, on the same
 * model and backend.
 *
 *   bench_engine [--backend auto|cpu|cuda] [--prompt N] [--new N] [--reps N]
 *                [--json FILE] MODEL_DIR
 *
 * MODEL_DIR holds a checkpoint; if it has none, a synthetic tinyllama-1.1b
 * bf16 one is written there first. Each rep generates --new tokens (default
 * 32) after a --prompt-token prompt (default 32) on each engine, in turn
 * (the first rep of each is untimed: planning, uploads); the median prefill
 * and decode tokens/s of the timed reps are reported with planned/plain
 * ratios, and every rep's tokens and logits are checked bit for bit between
 * the engines. The design asks the planned engine to be as fast as the plain
 * one (ratio >= 0.95); the run says whether it is.
 */
#include "tide.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--backend auto|cpu|cuda] [--prompt N] [--new N] [--reps N] [--json FILE] MODEL_DIR\n",
            argv0);
    return 2;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *json_path = NULL;
    int n_prompt = 32, n_new = 32, reps = 5;
    tide_backend_kind bk = TIDE_BACKEND_AUTO;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prompt") && i + 1 < argc) n_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--new") && i + 1 < argc) n_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            const char *b = argv[++i];
            bk = !strcmp(b, "cpu") ? TIDE_BACKEND_CPU : !strcmp(b, "cuda") ? TIDE_BACKEND_CUDA : TIDE_BACKEND_AUTO;
        } else if (argv[i][0] != '-') dir = argv[i];
        else return usage(argv[0]);
    }
    if (!dir || n_prompt < 1 || n_new < 2 || reps < 1) return usage(argv[0]);
    tide_ctx *ctx = tide_ctx_new();
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        tide_llama_config cfg;
        if (tide_llama_config_named(ctx, "tinyllama-1.1b", &cfg) || tide_checkpoint_make_synthetic(ctx, &cfg, 0, 0, dir)) {
            fprintf(stderr, "bench_engine: %s\n", tide_ctx_last_error(ctx));
            return 1;
        }
    }
    tide_checkpoint *ck = NULL;
    tide_backend *be = NULL;
    tide_model *m[2] = {NULL, NULL}; /* [0] plain, [1] planned */
    tide_model_opts mo = {.max_batch = 1, .ctx_len = n_prompt + n_new};
    if (tide_checkpoint_open(ctx, dir, &ck) || tide_checkpoint_prefetch(ck) || tide_backend_new(ctx, bk, &be)) {
        fprintf(stderr, "bench_engine: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    for (int k = 0; k < 2; k++)
        if (tide_model_new(ctx, ck, be, &mo, &m[k]) ||
            tide_model_set_engine(m[k], k ? TIDE_ENGINE_PLANNED : TIDE_ENGINE_PLAIN)) {
            fprintf(stderr, "bench_engine: %s\n", tide_ctx_last_error(ctx));
            return 1;
        }
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt), *tok[2];
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((1u + (uint32_t)i * 2654435761u) % (uint32_t)cfg->vocab_size);
    for (int k = 0; k < 2; k++) tok[k] = malloc((size_t)n_new * sizeof *tok[k]);
    double *pre[2], *dec[2];
    for (int k = 0; k < 2; k++) {
        pre[k] = calloc((size_t)reps, sizeof(double));
        dec[k] = calloc((size_t)reps, sizeof(double));
    }
    int mismatches = 0;
    uint64_t peak[2] = {0, 0};
    fprintf(stderr, "bench_engine: %s, %d layers, backend %s, prompt %d, %d new tokens, %d timed reps per engine\n",
            cfg->name, cfg->num_hidden_layers, tide_backend_name(be), n_prompt, n_new, reps);
    for (int r = 0; r <= reps; r++) {
        tide_gen_stats st[2];
        for (int k = 0; k < 2; k++) {
            if (tide_model_generate(m[k], prompt, n_prompt, n_new, tok[k], &st[k])) {
                fprintf(stderr, "bench_engine: %s engine: %s\n", k ? "planned" : "plain", tide_ctx_last_error(ctx));
                return 1;
            }
            peak[k] = st[k].peak_bytes;
            if (r) {
                pre[k][r - 1] = st[k].prefill_tokens_per_s;
                dec[k][r - 1] = st[k].decode_tokens_per_s;
            }
        }
        if (memcmp(tok[0], tok[1], (size_t)n_new * sizeof *tok[0]) || st[0].logits_hash != st[1].logits_hash)
            mismatches++;
    }
    double p0 = median(pre[0], reps), p1 = median(pre[1], reps), d0 = median(dec[0], reps), d1 = median(dec[1], reps);
    printf("# bench engine: %s (%d layers, %s), backend %s, prompt %d tokens, %d generated, median of %d reps\n\n",
           cfg->name, cfg->num_hidden_layers, tide_dtype_name(cfg->dtype), tide_backend_name(be), n_prompt, n_new, reps);
    printf("| engine | prefill tokens/s | decode tokens/s | peak tensor bytes |\n|---|---|---|---|\n");
    printf("| plain (reference) | %.2f | %.2f | %.1f MiB |\n", p0, d0, peak[0] / 1048576.0);
    printf("| planned (default) | %.2f | %.2f | %.1f MiB |\n", p1, d1, peak[1] / 1048576.0);
    printf("| planned / plain | %.3f | %.3f | |\n\n", p0 > 0 ? p1 / p0 : 0, d0 > 0 ? d1 / d0 : 0);
    printf("outputs bit-identical in %d of %d runs per engine; target planned/plain >= 0.95: prefill %s, decode %s\n",
           reps + 1 - mismatches, reps + 1, p1 >= 0.95 * p0 ? "met" : "NOT met", d1 >= 0.95 * d0 ? "met" : "NOT met");
    char line[1024];
    snprintf(line, sizeof line,
             "{\"bench\":\"engine\",\"config\":\"%s\",\"backend\":\"%s\",\"prompt\":%d,\"new\":%d,\"reps\":%d,"
             "\"plain_prefill_tps\":%.3f,\"planned_prefill_tps\":%.3f,\"plain_decode_tps\":%.3f,"
             "\"planned_decode_tps\":%.3f,\"prefill_ratio\":%.4f,\"decode_ratio\":%.4f,\"mismatches\":%d}",
             cfg->name, tide_backend_name(be), n_prompt, n_new, reps, p0, p1, d0, d1, p0 > 0 ? p1 / p0 : 0,
             d0 > 0 ? d1 / d0 : 0, mismatches);
    puts(line);
    if (json_path) {
        FILE *f = fopen(json_path, "a");
        if (f) {
            fprintf(f, "%s\n", line);
            fclose(f);
        }
    }
    for (int k = 0; k < 2; k++) {
        tide_model_free(m[k]);
        free(tok[k]);
        free(pre[k]);
        free(dec[k]);
    }
    free(prompt);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    return mismatches ? 1 : 0;
}
