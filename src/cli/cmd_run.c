/*
 * cmd_run.c - `tide run`: prefill a prompt and generate tokens greedily.
 */
#include "cli.h"
#include "runtime/tiling.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char help[] =
    "Usage: tide run [--model DIR] [--tokens 1,2,3 | --prompt-len N] [--new-tokens N]\n"
    "                [--budget BYTES|PCT%|auto|min|none] [--policy tide|static-layer|lru]\n"
    "                [--host-budget BYTES] [--ssd DIR[,DIR]] [--weights-on-ssd] [--pread]\n"
    "                [--direct-storage]\n"
    "                [--tile auto|none|LEVEL] [--pin-weights auto|yes|no] [--hw PROFILE]\n"
    "                [--verify] [--check]\n"
    "                [--trace FILE] [--trace-svg FILE]\n"
    "                [--backend auto|cpu|cuda] [--matmul auto|f32|fast] [--threads N]\n"
    "                [--json] [--quiet]\n"
    "\n"
    "Prefills the prompt, then generates tokens greedily (argmax). With a budget,\n"
    "every graph runs through a verified plan that pages tensors between a device\n"
    "arena of exactly that many bytes, host memory and SSD spill files.\n"
    "\n"
    "With no arguments it demonstrates offloading: the built-in model (a\n"
    "tinyllama-1.1b-shaped synthetic bf16 checkpoint, generated once into\n"
    "$TIDE_CACHE, else $XDG_CACHE_HOME/tide, else ~/.cache/tide) at 25% of its\n"
    "unconstrained peak, checked bit for bit against an unconstrained run.\n"
    "\n"
    "  --model DIR         Hugging Face-layout LLaMA checkpoint (config.json +\n"
    "                      model.safetensors or shards with an index)\n"
    "  --tokens LIST       prompt token ids, comma-separated\n"
    "  --prompt-len N      a deterministic prompt of N token ids (default 32)\n"
    "  --new-tokens N      tokens to generate (default 16)\n"
    "  --budget X          device memory: bytes (2G), a percentage of the\n"
    "                      unconstrained peak (25%), auto (on a GPU its free memory\n"
    "                      less max(512 MiB, 1/32 of its memory); on the CPU 90% of\n"
    "                      the profile's device memory; at most the unconstrained\n"
    "                      peak), min (the smallest the policy can plan) or none\n"
    "                      (everything resident). Default: 25% with no --model\n"
    "                      and no --budget given; none otherwise\n"
    "  --policy P          tide (default), static-layer or lru\n"
    "  --host-budget X     host memory for spilled activations (default: no limit)\n"
    "  --ssd DIRS          spill directories, comma-separated (default $TMPDIR or\n"
    "                      /tmp); spill files are unlinked as soon as created\n"
    "  --weights-on-ssd    home the weights on SSD: read from the checkpoint file\n"
    "                      with O_DIRECT instead of from memory\n"
    "  --pread             SSD transfers with a pread/pwrite pool, not io_uring\n"
    "  --direct-storage    with --weights-on-ssd on a GPU: read the weights straight\n"
    "                      into device memory with GPUDirect Storage (cuFile),\n"
    "                      where this build and machine have it (else a notice,\n"
    "                      and pinned host buffers as without it)\n"
    "  --tile T            split ops into tiles when a graph's largest op does not\n"
    "                      fit the budget: auto (default; with --budget min the\n"
    "                      tiling with the smallest minimum), none, or a level 1-6\n"
    "  --pin-weights P     copy the weights once into pinned host memory, so their\n"
    "                      loads run at the link's full rate: auto (default: on a\n"
    "                      GPU), yes (on the CPU backend too), no (load from the\n"
    "                      memory-mapped checkpoint); at most half the available\n"
    "                      host memory is pinned\n"
    "  --hw PROFILE        hardware profile for plans and the predicted makespan\n"
    "                      (default: a quick measurement of this machine through\n"
    "                      the backend, see `tide probe`)\n"
    "  --verify            verify every plan (always done; kept for scripts)\n"
    "  --check             also run unconstrained and compare the generated tokens\n"
    "                      and every logit bit for bit (on by default with no\n"
    "                      arguments); exit status 1 when they differ\n"
    "  --trace FILE        Perfetto trace JSON of the offloaded prefill, measured\n"
    "  --trace-svg FILE    device memory over time, measured and predicted\n"
    "  --backend B         auto (CUDA when a GPU is present, else CPU; a GPU that is\n"
    "                      present but unusable is an error), cpu or cuda\n"
    "  --matmul M          how matmuls treat bf16/f16 weights: auto (default: fast\n"
    "                      on CUDA, f32 on the CPU), f32 (weights widened to f32,\n"
    "                      activations kept in f32: the CPU's results up to\n"
    "                      summation order) or fast (CUDA: tensor cores, activations\n"
    "                      rounded to the weights' dtype, f32 accumulation, as a\n"
    "                      bf16 PyTorch model computes)\n"
    "  --threads N         CPU threads (default: all cores)\n"
    "  --json              print one JSON object instead of the summary\n"
    "  --quiet             no progress lines\n"
    "\n"
    "Environment: TIDE_THREADS (CPU threads without --threads), TIDE_CACHE (where\n"
    "the built-in model is written), TIDE_DATA (hardware profiles), on a GPU\n"
    "TIDE_EXEC_SYNC=1 (wait for every op and copy instead of queueing them ahead\n"
    "with events, to compare) and TIDE_CUDA_ATTENTION=rows (per-row attention\n"
    "kernel only). See the README's Environment section.\n";

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

typedef struct run_args {
    const char *model_dir, *tokens, *budget, *policy, *ssd, *hw, *trace, *trace_svg;
    long prompt_len, new_tokens, threads;
    uint64_t host_budget;
    bool json, quiet, check, weights_on_ssd, pread, verify;
    tide_backend_kind backend;
    tide_matmul_mode matmul;
    const char *pin;
    bool direct_storage;
    const char *tile;
} run_args;

/* Parses --budget into offload options; returns 0 or -1. */
static int parse_budget(const char *s, tide_offload_opts *o) {
    if (!strcmp(s, "none")) o->budget_kind = TIDE_BUDGET_NONE;
    else if (!strcmp(s, "min")) o->budget_kind = TIDE_BUDGET_MIN;
    else if (!strcmp(s, "auto")) o->budget_kind = TIDE_BUDGET_AUTO;
    else if (s[0] && s[strlen(s) - 1] == '%') {
        char *end;
        double pct = strtod(s, &end);
        if (end == s || *end != '%' || !(pct > 0 && pct <= 100)) return -1;
        o->budget_kind = TIDE_BUDGET_FRACTION;
        o->fraction = pct / 100.0;
    } else {
        if (cli_parse_bytes(s, &o->bytes) || !o->bytes) return -1;
        o->budget_kind = TIDE_BUDGET_BYTES;
    }
    return 0;
}

static void print_summary(const run_args *a, const char *model_dir, const tide_llama_config *cfg,
                          tide_backend *be, tide_ctx *ctx, int n_prompt, const int32_t *gen,
                          const tide_gen_stats *s, const tide_gen_stats *ref, bool offload,
                          const char *policy, int check_rc) {
    char b1[32], b2[32], b3[32], b4[32];
    printf("model      %s (%s, %d layers, %s)\n", model_dir, cfg->name, cfg->num_hidden_layers,
           tide_dtype_name(cfg->dtype));
    printf("backend    %s, matmul %s, %d threads, %s issue\n", tide_backend_name(be),
           tide_matmul_name(tide_backend_matmul(be)), tide_ctx_threads(ctx),
           s->async_issue ? "asynchronous (events)" : "synchronous");
    printf("prompt     %d tokens\n", n_prompt);
    printf("generated ");
    for (long i = 0; i < a->new_tokens; i++) printf(" %d", gen[i]);
    printf("\n");
    printf("prefill    %.2f tokens/s (%.3f s)\n", s->prefill_tokens_per_s, s->prefill_s);
    printf("decode     %.2f tokens/s (%.3f s for %d tokens)\n", s->decode_tokens_per_s, s->decode_s,
           s->decode_tokens);
    if (offload) {
        char tl[16] = "none";
        if (s->tile_level) snprintf(tl, sizeof tl, "level %d", s->tile_level);
        printf("offload    policy %s, device budget %s, peak device %s, tiling %s\n", policy,
               cli_fmt_bytes(s->budget_bytes, b1, sizeof b1), cli_fmt_bytes(s->peak_device_bytes, b2, sizeof b2), tl);
        printf("links      host->device %s, device->host %s, ssd read %s, ssd write %s\n",
               cli_fmt_bytes(s->bytes_h2d, b1, sizeof b1), cli_fmt_bytes(s->bytes_d2h, b2, sizeof b2),
               cli_fmt_bytes(s->bytes_ssd_read, b3, sizeof b3), cli_fmt_bytes(s->bytes_ssd_write, b4, sizeof b4));
        printf("weights    %s pinned in host memory of %s\n", cli_fmt_bytes(s->pinned_weight_bytes, b1, sizeof b1),
               cli_fmt_bytes(s->weight_bytes, b2, sizeof b2));
        printf("time       wall %.3f s; predicted makespan %.3f s, measured %.3f s (%+.1f%%)\n",
               s->prefill_s + s->decode_s, s->predicted_s, s->exec_s,
               s->predicted_s > 0 ? 100.0 * (s->exec_s - s->predicted_s) / s->predicted_s : 0);
    } else {
        printf("memory     peak %s of tensors (weights %s, KV cache %s)\n",
               cli_fmt_bytes(s->peak_bytes, b1, sizeof b1), cli_fmt_bytes(s->weight_bytes, b2, sizeof b2),
               cli_fmt_bytes(s->state_bytes, b3, sizeof b3));
    }
    if (ref) {
        double w = s->prefill_s + s->decode_s, rw = ref->prefill_s + ref->decode_s;
        printf("check      %s: unconstrained run %.3f s; offloaded %.2fx its wall time (prefill %.2fx)\n",
               check_rc == 1 ? "FAILED, outputs differ"
               : check_rc == 2 ? "passed, tokens identical (tiled graph: logits equal up to f32 summation order)"
                               : "passed, tokens and logits bit-identical", rw,
               rw > 0 ? w / rw : 0, ref->prefill_s > 0 ? s->prefill_s / ref->prefill_s : 0);
    }
}

static void print_json(const run_args *a, const char *model_dir, const tide_llama_config *cfg,
                       tide_backend *be, tide_ctx *ctx, int n_prompt, const int32_t *gen,
                       const tide_gen_stats *s, const tide_gen_stats *ref, bool offload,
                       const char *policy, int check_rc, uint64_t rss) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model_dir);
    cJSON_AddStringToObject(o, "config", cfg->name);
    cJSON_AddStringToObject(o, "backend", tide_backend_name(be));
    cJSON_AddStringToObject(o, "matmul", tide_matmul_name(tide_backend_matmul(be)));
    cJSON_AddNumberToObject(o, "threads", tide_ctx_threads(ctx));
    cJSON_AddBoolToObject(o, "async_issue", s->async_issue);
    cJSON_AddNumberToObject(o, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(o, "new_tokens", (double)a->new_tokens);
    cJSON_AddItemToObject(o, "tokens", cJSON_CreateIntArray(gen, (int)a->new_tokens));
    cJSON_AddNumberToObject(o, "prefill_s", s->prefill_s);
    cJSON_AddNumberToObject(o, "decode_s", s->decode_s);
    cJSON_AddNumberToObject(o, "wall_s", s->prefill_s + s->decode_s);
    cJSON_AddNumberToObject(o, "prefill_tokens_per_s", s->prefill_tokens_per_s);
    cJSON_AddNumberToObject(o, "decode_tokens_per_s", s->decode_tokens_per_s);
    cJSON_AddNumberToObject(o, "peak_bytes", (double)s->peak_bytes);
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)rss);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)s->weight_bytes);
    cJSON_AddNumberToObject(o, "state_bytes", (double)s->state_bytes);
    cJSON_AddBoolToObject(o, "offloaded", offload);
    cJSON_AddStringToObject(o, "policy", offload ? policy : "none");
    cJSON_AddNumberToObject(o, "budget_bytes", (double)s->budget_bytes);
    cJSON_AddNumberToObject(o, "tile_level", s->tile_level);
    cJSON_AddNumberToObject(o, "pinned_weight_bytes", (double)s->pinned_weight_bytes);
    cJSON_AddNumberToObject(o, "peak_device_bytes", (double)(offload ? s->peak_device_bytes : s->peak_bytes));
    cJSON_AddNumberToObject(o, "bytes_h2d", (double)s->bytes_h2d);
    cJSON_AddNumberToObject(o, "bytes_d2h", (double)s->bytes_d2h);
    cJSON_AddNumberToObject(o, "bytes_ssd_read", (double)s->bytes_ssd_read);
    cJSON_AddNumberToObject(o, "bytes_ssd_write", (double)s->bytes_ssd_write);
    cJSON_AddNumberToObject(o, "predicted_makespan_s", s->predicted_s);
    cJSON_AddNumberToObject(o, "measured_makespan_s", s->exec_s);
    cJSON_AddNumberToObject(o, "ssd_read_s", s->ssd_read_s);
    if (ref) {
        cJSON_AddNumberToObject(o, "unconstrained_wall_s", ref->prefill_s + ref->decode_s);
        cJSON_AddNumberToObject(o, "unconstrained_prefill_s", ref->prefill_s);
        cJSON_AddBoolToObject(o, "check_passed", check_rc != 1);
        cJSON_AddBoolToObject(o, "check_bit_identical", check_rc == 0);
    }
    char *js = cJSON_PrintUnformatted(o);
    if (js) puts(js);
    free(js);
    cJSON_Delete(o);
}

int cmd_run(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"tokens", required_argument, 0, 't'},
        {"prompt-len", required_argument, 0, 'p'}, {"new-tokens", required_argument, 0, 'n'},
        {"backend", required_argument, 0, 'b'},    {"threads", required_argument, 0, 'T'},
        {"budget", required_argument, 0, 'B'},     {"policy", required_argument, 0, 'P'},
        {"host-budget", required_argument, 0, 'H'}, {"ssd", required_argument, 0, 'S'},
        {"weights-on-ssd", no_argument, 0, 'W'},   {"pread", no_argument, 0, 'R'},
        {"hw", required_argument, 0, 'w'},         {"verify", no_argument, 0, 'v'},
        {"check", no_argument, 0, 'c'},            {"trace", required_argument, 0, 'x'},
        {"trace-svg", required_argument, 0, 'X'},  {"json", no_argument, 0, 'j'},
        {"quiet", no_argument, 0, 'q'},            {"help", no_argument, 0, 'h'},
        {"tile", required_argument, 0, 'L'},       {"matmul", required_argument, 0, 'M'},
        {"pin-weights", required_argument, 0, 'N'}, {"direct-storage", no_argument, 0, 'D'},
        {0, 0, 0, 0},
    };
    run_args a = {.prompt_len = 32, .new_tokens = 16, .policy = "tide", .backend = TIDE_BACKEND_AUTO};
    tide_offload_opts off = {0};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a.model_dir = optarg; break;
        case 't': a.tokens = optarg; break;
        case 'p':
            if (cli_parse_int(optarg, 1, 1 << 20, &a.prompt_len)) return cli_usage_error("run", "bad --prompt-len '%s'", optarg);
            break;
        case 'n':
            if (cli_parse_int(optarg, 0, 1 << 20, &a.new_tokens)) return cli_usage_error("run", "bad --new-tokens '%s'", optarg);
            break;
        case 'T':
            if (cli_parse_int(optarg, 1, 4096, &a.threads)) return cli_usage_error("run", "bad --threads '%s'", optarg);
            break;
        case 'b':
            if (cli_parse_backend(optarg, &a.backend))
                return cli_usage_error("run", "unknown --backend '%s' (auto, cpu or cuda)", optarg);
            break;
        case 'B':
            a.budget = optarg;
            if (parse_budget(optarg, &off))
                return cli_usage_error("run", "bad --budget '%s' (bytes such as 2G, a percentage such as 25%%, auto, min or none)", optarg);
            break;
        case 'P':
            if (strcmp(optarg, "tide") && strcmp(optarg, "static-layer") && strcmp(optarg, "lru"))
                return cli_usage_error("run", "unknown --policy '%s' (tide, static-layer or lru)", optarg);
            a.policy = optarg;
            break;
        case 'H':
            if (cli_parse_bytes(optarg, &a.host_budget) || !a.host_budget)
                return cli_usage_error("run", "bad --host-budget '%s'", optarg);
            break;
        case 'S': a.ssd = optarg; break;
        case 'W': a.weights_on_ssd = true; break;
        case 'R': a.pread = true; break;
        case 'D': a.direct_storage = true; break;
        case 'w': a.hw = optarg; break;
        case 'v': a.verify = true; break;
        case 'c': a.check = true; break;
        case 'x': a.trace = optarg; break;
        case 'X': a.trace_svg = optarg; break;
        case 'j': a.json = true; break;
        case 'q': a.quiet = true; break;
        case 'L':
            a.tile = optarg;
            if (tide_tile_parse(NULL, optarg, &off.tile))
                return cli_usage_error("run", "bad --tile '%s' (auto, none or a level 1 to %d)", optarg,
                                       TIDE_TILE_LEVELS - 1);
            break;
        case 'N':
            a.pin = optarg;
            if (!strcmp(optarg, "auto")) off.pin_weights = 0;
            else if (!strcmp(optarg, "yes")) off.pin_weights = 1;
            else if (!strcmp(optarg, "no")) off.pin_weights = -1;
            else return cli_usage_error("run", "bad --pin-weights '%s' (auto, yes or no)", optarg);
            break;
        case 'M':
            if (tide_matmul_parse(NULL, optarg, &a.matmul))
                return cli_usage_error("run", "unknown --matmul '%s' (auto, f32 or fast)", optarg);
            break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("run", "unknown option");
        }
    }
    if (optind != argc) return cli_usage_error("run", "unexpected argument '%s'", argv[optind]);
    if (!a.model_dir && !a.budget) {
        /* the built-in demonstration: offloaded at 25%, checked */
        off.budget_kind = TIDE_BUDGET_FRACTION;
        off.fraction = 0.25;
        a.check = true;
    }
    bool offload = off.budget_kind != TIDE_BUDGET_NONE;
    off.timeline = a.trace || a.trace_svg; /* measured on a GPU only when written */
    if (!offload && (a.trace || a.trace_svg || a.weights_on_ssd || a.ssd || a.check || a.hw || a.host_budget ||
                     a.pread || a.tile || a.pin || a.direct_storage || strcmp(a.policy, "tide")))
        return cli_usage_error("run", "--check, --trace, --trace-svg, --ssd, --weights-on-ssd, --policy, --hw, "
                               "--host-budget, --tile, --pin-weights, --direct-storage and --pread need a --budget");
    if (a.check && a.new_tokens < 1) return cli_usage_error("run", "--check needs --new-tokens of at least 1");
    if (a.direct_storage && !a.weights_on_ssd)
        return cli_usage_error("run", "--direct-storage reads weights homed on SSD: it needs --weights-on-ssd");
    off.policy = a.policy;
    off.host_budget = a.host_budget;
    off.ssd_dirs = a.ssd;
    off.weights_on_ssd = a.weights_on_ssd;
    off.force_pread = a.pread;
    off.direct_storage = a.direct_storage;
    off.verify = true;
    off.hw = a.hw;

    int32_t *prompt = NULL, *gen = NULL, *gen_ref = NULL;
    int n_prompt = 0;
    if (a.tokens && parse_tokens(a.tokens, &prompt, &n_prompt))
        return cli_usage_error("run", "bad --tokens '%s' (comma-separated integers)", a.tokens);

    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) return 1;
    tide_ctx_set_threads(ctx, (int)a.threads);
    cli_progress_state ps;
    cli_progress_init(&ps, a.quiet);
    tide_ctx_set_progress(ctx, cli_progress, &ps);
    tide_checkpoint *ck = NULL;
    tide_backend *be = NULL;
    tide_model *m = NULL;
    int rc = 0, check_rc = 0;
    char dir[PATH_MAX];
    const char *model_dir = a.model_dir;
    if (!model_dir) {
        if ((rc = cli_ensure_default_model(ctx, dir, sizeof dir, &ps))) goto out;
        model_dir = dir;
    }
    if (tide_checkpoint_open(ctx, model_dir, &ck)) {
        rc = cli_fail(ctx, "loading the model");
        goto out;
    }
    /* weights homed in memory: read them in now, so no run is timed on faults */
    if (!a.weights_on_ssd && tide_checkpoint_prefetch(ck)) {
        rc = cli_fail(ctx, "loading the model");
        goto out;
    }
    cli_progress_end(&ps);
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    if (!prompt) {
        n_prompt = (int)a.prompt_len;
        prompt = malloc((size_t)n_prompt * sizeof *prompt);
        if (!prompt) {
            rc = 1;
            goto out;
        }
        /* a fixed pseudo-random prompt: the same ids on every run */
        for (int i = 0; i < n_prompt; i++)
            prompt[i] = (int32_t)((1u + (uint32_t)i * 2654435761u) % (uint32_t)cfg->vocab_size);
    }
    if (tide_backend_new(ctx, a.backend, &be)) {
        rc = cli_fail(ctx, "backend");
        goto out;
    }
    if (tide_backend_set_matmul(be, a.matmul)) {
        rc = cli_fail(ctx, "--matmul");
        goto out;
    }
    int ctx_len = n_prompt + (int)(a.new_tokens > 0 ? a.new_tokens - 1 : 0);
    if (ctx_len > cfg->max_position_embeddings) {
        fprintf(stderr, "tide: run: %d prompt + %ld new tokens exceed the model's %d positions\n", n_prompt,
                a.new_tokens, cfg->max_position_embeddings);
        rc = 1;
        goto out;
    }
    tide_model_opts mo = {.max_batch = 1, .ctx_len = ctx_len};
    if (tide_model_new(ctx, ck, be, &mo, &m)) {
        rc = cli_fail(ctx, "preparing the model");
        goto out;
    }
    gen = calloc((size_t)(a.new_tokens ? a.new_tokens : 1), sizeof *gen);
    gen_ref = calloc((size_t)(a.new_tokens ? a.new_tokens : 1), sizeof *gen_ref);
    if (!gen || !gen_ref) {
        rc = 1;
        goto out;
    }
    tide_gen_stats stats, ref;
    bool have_ref = false;
    if (a.check && offload) {
        if (!a.quiet && !a.json) fprintf(stderr, "tide: unconstrained run (for --check)\n");
        if (tide_model_generate(m, prompt, n_prompt, (int)a.new_tokens, gen_ref, &ref)) {
            cli_progress_end(&ps);
            rc = cli_fail(ctx, "unconstrained run");
            goto out;
        }
        cli_progress_end(&ps);
        have_ref = true;
    }
    if (offload) {
        if (!a.quiet && !a.json) fprintf(stderr, "tide: offloaded run (policy %s)\n", a.policy);
        if (tide_model_set_offload(m, &off)) {
            rc = cli_fail(ctx, "offloading");
            goto out;
        }
    }
    tide_status st = tide_model_generate(m, prompt, n_prompt, (int)a.new_tokens, gen, &stats);
    cli_progress_end(&ps);
    if (!a.quiet && tide_model_notice(m)[0]) fprintf(stderr, "tide: note: %s\n", tide_model_notice(m));
    if (st) {
        rc = cli_fail(ctx, "run");
        goto out;
    }
    if (have_ref) {
        /* 0: bit-identical; 2: a tiled graph's tokens are identical and its
         * logits differ only in f32 rounding (sgemm over fewer rows sums in
         * another order); 1: the outputs differ */
        bool same_tokens = memcmp(gen, gen_ref, (size_t)a.new_tokens * sizeof *gen) == 0;
        check_rc = !same_tokens ? 1 : stats.logits_hash == ref.logits_hash ? 0 : stats.tile_level ? 2 : 1;
    }
    if ((a.trace || a.trace_svg) && tide_model_write_trace(m, a.trace, a.trace_svg)) {
        rc = cli_fail(ctx, "writing the trace");
        goto out;
    }
    if (a.json)
        print_json(&a, model_dir, cfg, be, ctx, n_prompt, gen, &stats, have_ref ? &ref : NULL, offload, a.policy,
                   check_rc, peak_rss_bytes());
    else
        print_summary(&a, model_dir, cfg, be, ctx, n_prompt, gen, &stats, have_ref ? &ref : NULL, offload,
                      a.policy, check_rc);
    if (check_rc == 1) {
        fprintf(stderr, "tide: run: --check failed: the offloaded run's %s differ from the unconstrained run's\n",
                memcmp(gen, gen_ref, (size_t)a.new_tokens * sizeof *gen) ? "tokens" : "logits");
        rc = 1;
    }
out:
    tide_model_free(m);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    free(prompt);
    free(gen);
    free(gen_ref);
    return rc;
}
