/*
 * llama_driver.c - llama.cpp's side of bench/peer_llamacpp.sh: greedy
 * generation from exact prompt token ids through llama.h, timed the way
 * `tide run --json` times it, so the two print comparable figures.
 *
 *   llama_driver --model FILE.gguf --tokens 1,2,3 | --prompt-len N
 *                [--new-tokens N] [--threads N] [--kv f16|f32]
 *                [--flash-attn auto|on|off] [--margins]
 *
 * The prompt is fed as one batch (n_batch = n_ubatch = prompt length, so one
 * graph, as tide's prefill), logits of its last position only; the argmax
 * (lowest id on ties) is the first new token. Each later token is one
 * llama_decode of the previous one. prefill_s is the prompt's llama_decode;
 * decode_s covers the n_new - 1 single-token steps (sampling included), so
 * decode tokens/s = (n_new - 1) / decode_s, as tide counts. --prompt-len N
 * uses tide's deterministic prompt, id i = ((1 + i*2654435761) mod 2^32) % vocab.
 * --kv is the KV cache's type (llama.cpp's default f16; tide keeps f32), and
 * --flash-attn llama.cpp's attention (default auto, which on the CPU means its
 * flash attention: Q rounded to f16 for the K products, even with an f32
 * cache). With an f32 GGUF, --kv f32 and --flash-attn off, llama.cpp computes
 * in f32 throughout, and its logits meet tide's f32 mode's to about 1e-5.
 * --margins adds, per generated token, the gap between the two largest logits
 * (where it is small, a summation-order difference may pick the other id).
 * Prints one JSON line on stdout; llama.cpp's log goes to stderr.
 */
#include "llama.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The largest entry's index (lowest on ties) and its lead over the runner-up. */
static int argmax(const float *v, int n, float *margin) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != best && v[i] > second) second = v[i];
    *margin = v[best] - second;
    return best;
}

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s --model FILE.gguf (--tokens 1,2,3 | --prompt-len N) [--new-tokens N] [--threads N]\n"
                    "       [--kv f16|f32] [--flash-attn auto|on|off] [--margins]\n",
            argv0);
    return 2;
}

/* Parses a comma-separated id list into a new array; returns its length, -1 on error. */
static int parse_ids(const char *s, llama_token **out) {
    int cap = 64, n = 0;
    llama_token *v = malloc((size_t)cap * sizeof *v);
    while (v && *s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > INT32_MAX) break;
        if (n == cap) {
            llama_token *w = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!w) break;
            v = w;
        }
        v[n++] = (llama_token)x;
        s = end;
        if (*s == ',') s++;
        else if (*s) break;
    }
    if (!v || *s || n == 0) {
        free(v);
        return -1;
    }
    *out = v;
    return n;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *ids = NULL;
    int n_prompt = 0, n_new = 32, threads = 2, verbose = 0, margins = 0;
    enum ggml_type kv = GGML_TYPE_F16;
    enum llama_flash_attn_type fa = LLAMA_FLASH_ATTN_TYPE_AUTO;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model_path = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) ids = argv[++i];
        else if (!strcmp(argv[i], "--prompt-len") && i + 1 < argc) n_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--new-tokens") && i + 1 < argc) n_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) {
            const char *t = argv[++i];
            if (!strcmp(t, "f16")) kv = GGML_TYPE_F16;
            else if (!strcmp(t, "f32")) kv = GGML_TYPE_F32;
            else return usage(argv[0]);
        } else if (!strcmp(argv[i], "--flash-attn") && i + 1 < argc) {
            const char *t = argv[++i];
            if (!strcmp(t, "auto")) fa = LLAMA_FLASH_ATTN_TYPE_AUTO;
            else if (!strcmp(t, "on")) fa = LLAMA_FLASH_ATTN_TYPE_ENABLED;
            else if (!strcmp(t, "off")) fa = LLAMA_FLASH_ATTN_TYPE_DISABLED;
            else return usage(argv[0]);
        } else if (!strcmp(argv[i], "--margins")) margins = 1;
        else if (!strcmp(argv[i], "--verbose")) verbose = 1;
        else return usage(argv[0]);
    }
    if (!model_path || (!ids && n_prompt < 1) || n_new < 1 || threads < 1) return usage(argv[0]);
    if (!verbose) llama_log_set(quiet_log, NULL);

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "llama_driver: cannot load %s\n", model_path);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);

    llama_token *prompt = NULL;
    if (ids) {
        n_prompt = parse_ids(ids, &prompt);
        if (n_prompt < 0) {
            fprintf(stderr, "llama_driver: bad --tokens list\n");
            return 2;
        }
    } else {
        prompt = malloc((size_t)n_prompt * sizeof *prompt);
        for (int i = 0; i < n_prompt; i++)
            prompt[i] = (llama_token)((1u + (uint32_t)i * 2654435761u) % (uint32_t)n_vocab);
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= n_vocab) {
            fprintf(stderr, "llama_driver: token id %d >= vocabulary %d\n", prompt[i], n_vocab);
            return 1;
        }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_new);
    cp.n_batch = (uint32_t)n_prompt;
    cp.n_ubatch = (uint32_t)n_prompt;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = fa;
    cp.type_k = kv;
    cp.type_v = kv;
    cp.no_perf = false;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama_driver: cannot create a context\n");
        return 1;
    }

    llama_token *out = malloc((size_t)n_new * sizeof *out);
    float *gap = malloc((size_t)n_new * sizeof *gap);
    double t0 = now_s();
    if (llama_decode(ctx, llama_batch_get_one(prompt, n_prompt))) {
        fprintf(stderr, "llama_driver: prefill failed\n");
        return 1;
    }
    out[0] = argmax(llama_get_logits_ith(ctx, -1), n_vocab, &gap[0]);
    double t1 = now_s();
    for (int k = 1; k < n_new; k++) {
        llama_token t = out[k - 1];
        if (llama_decode(ctx, llama_batch_get_one(&t, 1))) {
            fprintf(stderr, "llama_driver: decode step %d failed\n", k);
            return 1;
        }
        out[k] = argmax(llama_get_logits_ith(ctx, -1), n_vocab, &gap[k]);
    }
    double t2 = now_s();

    double prefill_s = t1 - t0, decode_s = t2 - t1;
    printf("{\"engine\":\"llama.cpp\",\"threads\":%d,\"prompt_tokens\":%d,\"new_tokens\":%d,\"tokens\":[", threads,
           n_prompt, n_new);
    for (int k = 0; k < n_new; k++) printf("%s%d", k ? "," : "", out[k]);
    printf("]");
    if (margins) {
        printf(",\"margins\":[");
        for (int k = 0; k < n_new; k++) printf("%s%.5g", k ? "," : "", gap[k]);
        printf("]");
    }
    printf(",\"kv\":\"%s\",\"flash_attn\":\"%s\",\"prefill_s\":%.6f,\"decode_s\":%.6f,\"prefill_tokens_per_s\":%.4f,\"decode_tokens_per_s\":%.4f,"
           "\"system_info\":\"%s\"}\n",
           kv == GGML_TYPE_F32 ? "f32" : "f16", llama_flash_attn_type_name(fa), prefill_s, decode_s, n_prompt / prefill_s, n_new > 1 ? (n_new - 1) / decode_s : 0.0,
           llama_print_system_info());
    free(out);
    free(gap);
    free(prompt);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
