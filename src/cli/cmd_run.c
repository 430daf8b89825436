/*
 * cmd_run.c - `tide run`: prefill a prompt and generate tokens greedily.
 */
#include "cli.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char help[] =
    "Usage: tide run [--model DIR] [--tokens 1,2,3 | --prompt-len N] [--new-tokens N]\n"
    "                [--backend auto|cpu] [--threads N] [--json] [--quiet]\n"
    "\n"
    "Prefills the prompt, then generates tokens greedily (argmax), and prints the\n"
    "generated token ids, prefill and decode tokens/s and peak memory.\n"
    "With no --model it runs the built-in default: a tinyllama-1.1b-shaped\n"
    "synthetic bf16 model, generated once into the cache directory\n"
    "($TIDE_CACHE, else $XDG_CACHE_HOME/tide, else ~/.cache/tide).\n"
    "\n"
    "  --model DIR       Hugging Face-layout LLaMA checkpoint (config.json +\n"
    "                    model.safetensors or shards with an index)\n"
    "  --tokens LIST     prompt token ids, comma-separated\n"
    "  --prompt-len N    a deterministic prompt of N token ids (default 32)\n"
    "  --new-tokens N    tokens to generate (default 16)\n"
    "  --backend B       auto (CUDA when a GPU is present, else CPU) or cpu\n"
    "  --threads N       CPU threads (default: all cores)\n"
    "  --json            print one JSON object instead of the summary\n"
    "  --quiet           no progress lines\n";

static int parse_tokens(const char *s, int32_t **out, int *n) {
    int cap = 16, cnt = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < INT32_MIN || x > INT32_MAX) {
            free(v);
            return -1;
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = end;
        if (*p == ',') p++;
        else if (*p) {
            free(v);
            return -1;
        }
    }
    if (!cnt) {
        free(v);
        return -1;
    }
    *out = v;
    *n = cnt;
    return 0;
}

static uint64_t peak_rss_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_maxrss * 1024 : 0;
}

int cmd_run(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"tokens", required_argument, 0, 't'},
        {"prompt-len", required_argument, 0, 'p'}, {"new-tokens", required_argument, 0, 'n'},
        {"backend", required_argument, 0, 'b'},    {"threads", required_argument, 0, 'T'},
        {"json", no_argument, 0, 'j'},             {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    const char *model_dir = NULL, *tokens_arg = NULL;
    long prompt_len = 32, new_tokens = 16, threads = 0;
    bool json = false, quiet = false;
    tide_backend_kind bk = TIDE_BACKEND_AUTO;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': tokens_arg = optarg; break;
        case 'p':
            if (cli_parse_int(optarg, 1, 1 << 20, &prompt_len)) return cli_usage_error("run", "bad --prompt-len '%s'", optarg);
            break;
        case 'n':
            if (cli_parse_int(optarg, 0, 1 << 20, &new_tokens)) return cli_usage_error("run", "bad --new-tokens '%s'", optarg);
            break;
        case 'T':
            if (cli_parse_int(optarg, 1, 4096, &threads)) return cli_usage_error("run", "bad --threads '%s'", optarg);
            break;
        case 'b':
            if (!strcmp(optarg, "auto")) bk = TIDE_BACKEND_AUTO;
            else if (!strcmp(optarg, "cpu")) bk = TIDE_BACKEND_CPU;
            else if (!strcmp(optarg, "cuda")) bk = TIDE_BACKEND_CUDA;
            else return cli_usage_error("run", "unknown --backend '%s' (auto, cpu or cuda)", optarg);
            break;
        case 'j': json = true; break;
        case 'q': quiet = true; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("run", "unknown option");
        }
    }
    if (optind != argc) return cli_usage_error("run", "unexpected argument '%s'", argv[optind]);

    int32_t *prompt = NULL, *gen = NULL;
    int n_prompt = 0;
    if (tokens_arg && parse_tokens(tokens_arg, &prompt, &n_prompt))
        return cli_usage_error("run", "bad --tokens '%s' (comma-separated integers)", tokens_arg);

    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) return 1;
    tide_ctx_set_threads(ctx, (int)threads);
    cli_progress_state ps;
    cli_progress_init(&ps, quiet);
    tide_ctx_set_progress(ctx, cli_progress, &ps);
    tide_checkpoint *ck = NULL;
    tide_backend *be = NULL;
    tide_model *m = NULL;
    int rc = 0;
    char dir[PATH_MAX];
    if (!model_dir) {
        if ((rc = cli_ensure_default_model(ctx, dir, sizeof dir, &ps))) goto out;
        model_dir = dir;
    }
    if (tide_checkpoint_open(ctx, model_dir, &ck)) {
        rc = cli_fail(ctx, "loading the model");
        goto out;
    }
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    if (!prompt) {
        n_prompt = (int)prompt_len;
        prompt = malloc((size_t)n_prompt * sizeof *prompt);
        if (!prompt) {
            rc = 1;
            goto out;
        }
        /* a fixed pseudo-random prompt: the same ids on every run */
        for (int i = 0; i < n_prompt; i++)
            prompt[i] = (int32_t)((1u + (uint32_t)i * 2654435761u) % (uint32_t)cfg->vocab_size);
    }
    if (tide_backend_new(ctx, bk, &be)) {
        rc = cli_fail(ctx, "backend");
        goto out;
    }
    int ctx_len = n_prompt + (int)(new_tokens > 0 ? new_tokens - 1 : 0);
    if (ctx_len > cfg->max_position_embeddings) {
        fprintf(stderr, "tide: run: %d prompt + %ld new tokens exceed the model's %d positions\n",
                n_prompt, new_tokens, cfg->max_position_embeddings);
        rc = 1;
        goto out;
    }
    tide_model_opts mo = {.max_batch = 1, .ctx_len = ctx_len};
    if (tide_model_new(ctx, ck, be, &mo, &m)) {
        rc = cli_fail(ctx, "preparing the model");
        goto out;
    }
    gen = malloc((size_t)(new_tokens ? new_tokens : 1) * sizeof *gen);
    tide_gen_stats stats;
    if (!gen) {
        rc = 1;
        goto out;
    }
    tide_status st = tide_model_generate(m, prompt, n_prompt, (int)new_tokens, gen, &stats);
    cli_progress_end(&ps);
    if (st) {
        rc = cli_fail(ctx, "run");
        goto out;
    }
    uint64_t rss = peak_rss_bytes();
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", model_dir);
        cJSON_AddStringToObject(o, "config", cfg->name);
        cJSON_AddStringToObject(o, "backend", tide_backend_name(be));
        cJSON_AddNumberToObject(o, "threads", tide_ctx_threads(ctx));
        cJSON_AddNumberToObject(o, "prompt_tokens", n_prompt);
        cJSON_AddNumberToObject(o, "new_tokens", (double)new_tokens);
        cJSON_AddItemToObject(o, "tokens", cJSON_CreateIntArray(gen, (int)new_tokens));
        cJSON_AddNumberToObject(o, "prefill_s", stats.prefill_s);
        cJSON_AddNumberToObject(o, "decode_s", stats.decode_s);
        cJSON_AddNumberToObject(o, "prefill_tokens_per_s", stats.prefill_tokens_per_s);
        cJSON_AddNumberToObject(o, "decode_tokens_per_s", stats.decode_tokens_per_s);
        cJSON_AddNumberToObject(o, "peak_bytes", (double)stats.peak_bytes);
        cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)rss);
        cJSON_AddNumberToObject(o, "weight_bytes", (double)stats.weight_bytes);
        cJSON_AddNumberToObject(o, "state_bytes", (double)stats.state_bytes);
        char *s = cJSON_PrintUnformatted(o);
        if (s) puts(s);
        free(s);
        cJSON_Delete(o);
    } else {
        char b1[32], b2[32], b3[32], b4[32];
        printf("model      %s (%s, %d layers, %s)\n", model_dir, cfg->name, cfg->num_hidden_layers,
               tide_dtype_name(cfg->dtype));
        printf("backend    %s, %d threads\n", tide_backend_name(be), tide_ctx_threads(ctx));
        printf("prompt     %d tokens\n", n_prompt);
        printf("generated ");
        for (long i = 0; i < new_tokens; i++) printf(" %d", gen[i]);
        printf("\n");
        printf("prefill    %.2f tokens/s (%.3f s)\n", stats.prefill_tokens_per_s, stats.prefill_s);
        printf("decode     %.2f tokens/s (%.3f s for %d tokens)\n", stats.decode_tokens_per_s,
               stats.decode_s, stats.decode_tokens);
        printf("peak       %s of tensors (weights %s, KV cache %s); process RSS %s\n",
               cli_fmt_bytes(stats.peak_bytes, b1, sizeof b1),
               cli_fmt_bytes(stats.weight_bytes, b2, sizeof b2),
               cli_fmt_bytes(stats.state_bytes, b3, sizeof b3),
               cli_fmt_bytes(rss, b4, sizeof b4));
    }
out:
    tide_model_free(m);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    free(prompt);
    free(gen);
    return rc;
}
