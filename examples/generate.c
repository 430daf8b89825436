/*
 * generate.c - a program that uses tide as a library, through tide.h alone:
 * it loads a Hugging Face-layout model directory, runs it offloaded under a
 * device budget (a fraction of the model's unconstrained peak), generates
 * greedily and prints the tokens, the text (when the model directory has a
 * tokenizer) and the run's statistics.
 *
 *   generate MODEL_DIR PROMPT [NEW_TOKENS [BUDGET_FRACTION]]
 *
 * PROMPT is text when MODEL_DIR holds a tokenizer.json, else comma-separated
 * token ids. NEW_TOKENS defaults to 16, BUDGET_FRACTION to 0.5 (0: resident,
 * no budget). Generation stops early at the tokenizer's end-of-sequence ids.
 * Output (standard output): a line "tokens: 1,2,3", a line "text: ..." with a
 * tokenizer, then "stats: ..." lines. The build: README.md beside this file.
 */
#include <tide.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints the failure recorded on ctx and returns 1 (the program's exit status). */
static int fail(tide_ctx *ctx, const char *what, tide_status st) {
    fprintf(stderr, "generate: %s: %s (%s)\n", what, tide_ctx_last_error(ctx), tide_status_str(st));
    return 1;
}

/* Parses "1,2,3" into a malloc'd array; returns the count, -1 on bad input. */
static int parse_ids(const char *s, int32_t **out) {
    int cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *v = malloc(sizeof *v * (size_t)cap);
    int n = 0;
    for (char *end; v && *s; s = *end ? end + 1 : end) {
        long x = strtol(s, &end, 10);
        if (end == s || (*end && *end != ',') || x < 0 || x > INT32_MAX) break;
        v[n++] = (int32_t)x;
        if (!*end) { *out = v; return n; }
    }
    free(v);
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s MODEL_DIR PROMPT [NEW_TOKENS [BUDGET_FRACTION]]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *prompt = argv[2];
    int n_new = argc > 3 ? atoi(argv[3]) : 16;
    double fraction = argc > 4 ? atof(argv[4]) : 0.5;
    if (n_new < 1 || fraction < 0 || fraction > 1) {
        fprintf(stderr, "generate: NEW_TOKENS must be >= 1 and BUDGET_FRACTION in [0, 1]\n");
        return 2;
    }
    /* a header/library mismatch would show here */
    printf("tide %s (header %s)\n", tide_version(), TIDE_VERSION);

    int rc = 1;
    tide_ctx *ctx = tide_ctx_new();
    tide_checkpoint *ck = NULL;
    tide_backend *be = NULL;
    tide_model *m = NULL;
    tide_tokenizer *tok = NULL;
    int32_t *ids = NULL, *out = NULL;
    char *text = NULL;
    tide_status st;
    if (!ctx) return 1;

    /* The weights, memory-mapped and validated; a backend (CUDA where a GPU
     * is present, else the CPU); the model with its KV cache. */
    if ((st = tide_checkpoint_open(ctx, dir, &ck))) { rc = fail(ctx, "opening the model", st); goto done; }
    if ((st = tide_backend_new(ctx, TIDE_BACKEND_AUTO, &be))) { rc = fail(ctx, "backend", st); goto done; }
    tide_model_opts mo = tide_model_opts_default();
    if ((st = tide_model_new(ctx, ck, be, &mo, &m))) { rc = fail(ctx, "loading the model", st); goto done; }

    /* The budget: every run is planned, verified and executed within it. */
    if (fraction > 0) {
        tide_offload_opts off = tide_offload_opts_default();
        off.budget_kind = TIDE_BUDGET_FRACTION;
        off.fraction = fraction;
        if ((st = tide_model_set_offload(m, &off))) { rc = fail(ctx, "setting the budget", st); goto done; }
    }

    /* The prompt: text through the model's tokenizer when it has one. */
    int n_ids;
    st = tide_tokenizer_open(ctx, dir, &tok);
    if (st == TIDE_OK) {
        size_t n = 0;
        st = tide_tokenizer_encode(tok, prompt, strlen(prompt), TIDE_TOKENIZE_ADD_SPECIAL, NULL, 0, &n);
        if (!st && !(ids = malloc(sizeof *ids * (n ? n : 1)))) st = TIDE_E_NOMEM;
        if (!st) st = tide_tokenizer_encode(tok, prompt, strlen(prompt), TIDE_TOKENIZE_ADD_SPECIAL, ids, n, &n);
        if (st) { rc = fail(ctx, "encoding the prompt", st); goto done; }
        n_ids = (int)n;
    } else if (st == TIDE_E_NOT_FOUND) {
        if ((n_ids = parse_ids(prompt, &ids)) < 1) {
            fprintf(stderr, "generate: %s has no tokenizer: give the prompt as token ids (1,2,3)\n", dir);
            goto done;
        }
    } else {
        rc = fail(ctx, "opening the tokenizer", st);
        goto done;
    }

    /* Greedy generation, ending at an end-of-sequence id. */
    tide_gen_opts go = tide_gen_opts_default();
    if (tok) go.n_stop_ids = tide_tokenizer_eos_ids(tok, &go.stop_ids);
    tide_gen_stats stats;
    int n_out = 0;
    if (!(out = malloc(sizeof *out * (size_t)n_new))) goto done;
    if ((st = tide_model_generate_ex(m, ids, n_ids, n_new, &go, out, &n_out, &stats))) {
        rc = fail(ctx, "generating", st);
        goto done;
    }

    printf("tokens: ");
    for (int i = 0; i < n_out; i++) printf(i ? ",%d" : "%d", out[i]);
    printf("\n");
    if (tok) {
        size_t len = 0;
        st = tide_tokenizer_decode(tok, out, (size_t)n_out, TIDE_DECODE_SKIP_SPECIAL, NULL, 0, &len);
        if (st == TIDE_OK && !(text = malloc(len + 1))) st = TIDE_E_NOMEM;
        if (!st) st = tide_tokenizer_decode(tok, out, (size_t)n_out, TIDE_DECODE_SKIP_SPECIAL, text, len + 1, &len);
        if (st) { rc = fail(ctx, "decoding", st); goto done; }
        printf("text: %s\n", text);
    }
    printf("stats: prompt %d tokens in %.3f s, %d more generated at %.1f tokens/s\n", stats.prefill_tokens,
           stats.prefill_s, stats.decode_tokens, stats.decode_tokens_per_s);
    printf("stats: budget %llu bytes, peak device %llu bytes, peak %llu bytes, %llu bytes to the device, "
           "predicted %.3f s\n",
           (unsigned long long)stats.budget_bytes, (unsigned long long)stats.peak_device_bytes,
           (unsigned long long)stats.peak_bytes, (unsigned long long)stats.bytes_h2d, stats.predicted_s);
    rc = 0;
done:
    free(text);
    free(out);
    free(ids);
    tide_tokenizer_free(tok);
    tide_model_free(m);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    return rc;
}
