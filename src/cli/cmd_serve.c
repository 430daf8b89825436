/*
 * cmd_serve.c - `tide serve`: an OpenAI-compatible HTTP server for several
 * models under one device budget (a tide_pool; the server is
 * src/cli/serve/http.c). This file parses the options, makes the backend and
 * the pool, and hands them to the server.
 */
#include "cli.h"
#include "cli/serve/http.h"

#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <pthread.h>

#define SERVE_MAX_MODELS 16

static const char help[] =
    "Usage: tide serve --model NAME=DIR [--model NAME=DIR]... --budget BYTES|auto\n"
    "                  [--host-budget BYTES] [--ssd DIRS] [--weights-on-ssd]\n"
    "                  [--policy tide|equal|serial] [--hw PROFILE] [--ctx N]\n"
    "                  [--host ADDR] [--port N] [--api-key KEY] [--queue N]\n"
    "                  [--max-loaded N] [--shutdown-grace S] [--timeout S]\n"
    "                  [--keep-alive S] [--max-connections N] [--http-threads N]\n"
    "                  [--per-client N] [--cache-type T] [--lora NAME=DIR]...\n"
    "                  [--max-batch N] [--backend auto|cpu|cuda] [--threads N] [--quiet]\n"
    "\n"
    "Serves the models over HTTP with OpenAI's API, all of them under one device\n"
    "budget: a pool gives each loaded model a share of the budget and moves the\n"
    "shares as models arrive and requests queue (--policy). Each model is loaded\n"
    "on its first request and kept while there is room. When a request needs a\n"
    "model that does not fit beside the loaded ones (--max-loaded; the pool\n"
    "refusing it, policy equal; their minimums over the budget, policy tide),\n"
    "the least recently used model with no request running or waiting is\n"
    "evicted (logged with the reason); when every one has requests, 503.\n"
    "GET /v1/models says which are loaded and how often each was evicted.\n"
    "\n"
    "Endpoints:\n"
    "  POST /v1/completions       {model, prompt, max_tokens (default 16),\n"
    "                             temperature (default 0: greedy), top_p, top_k,\n"
    "                             min_p, seed, stop, frequency_penalty,\n"
    "                             presence_penalty, repetition_penalty, stream,\n"
    "                             stream_options {include_usage}}\n"
    "  POST /v1/chat/completions  {model, messages [{role: system|user|assistant,\n"
    "                             content}], the same fields; max_tokens default\n"
    "                             256}, rendered with the model's chat template\n"
    "  GET  /v1/models            the models, whether each is loaded, its evictions\n"
    "  GET  /health               {\"status\": \"ok\"} (no key needed)\n"
    "  GET  /metrics              Prometheus text: requests by endpoint and status,\n"
    "                             tokens, queue depth, each model's share and held\n"
    "                             bytes, replans, drifted requests, evictions\n"
    "With \"stream\": true the answer comes as server-sent events (data: CHUNK ...\n"
    "data: [DONE]). Errors are {\"error\": {\"message\", \"type\"}} with status 400\n"
    "(malformed JSON, a field of the wrong type, a prompt longer than the\n"
    "context), 401 (--api-key), 404 (unknown model or path), 413 (a body over\n"
    "1 MiB), 503 (--queue full; no room for the model while the others have\n"
    "requests) or 500.\n"
    "\n"
    "Requests are queued per model and run in batches of up to --max-batch: each\n"
    "prompt is prefilled into a free row of the KV cache (prompts of one length\n"
    "joining together in one forward), then every request still generating\n"
    "takes its next token in one forward, each row at its own position (no\n"
    "padding to a common length). A request arriving while its model's batch\n"
    "runs joins it at the next step when a row is free; each is answered as\n"
    "soon as it ends. Each answer is the one the request gets alone. Requests\n"
    "for different models run at once, within their shares.\n"
    "\n"
    "  --model NAME=DIR    a model to serve as NAME (letters, digits, . _ - : /):\n"
    "                      a Hugging Face-layout LLaMA checkpoint directory with\n"
    "                      its tokenizer, or a GGUF file (several allowed)\n"
    "  --lora NAME=DIR     serve model NAME with the PEFT LoRA adapter in DIR\n"
    "                      applied at run time (as tide run --lora; read when the\n"
    "                      model loads; one adapter per model)\n"
    "  --budget X          the device budget all the models share: bytes (2G) or\n"
    "                      auto (on a GPU its free memory less max(512 MiB, 1/32\n"
    "                      of its memory))\n"
    "  --host-budget X     host memory for each model's spilled activations\n"
    "  --ssd DIRS          spill directories, comma-separated (default $TMPDIR or\n"
    "                      /tmp); spill files are unlinked as soon as created\n"
    "  --weights-on-ssd    home the weights on SSD (read from the checkpoint file);\n"
    "                      on the CPU what makes the shares bound the weights too\n"
    "  --policy P          how the budget is shared: tide (default: shares chosen\n"
    "                      by predicted time, counting the weights each share\n"
    "                      keeps warm and reloads when it changes; time-sliced,\n"
    "                      each turn at the least budget as fast as the whole,\n"
    "                      when the models' minimums do not fit together or when\n"
    "                      that is predicted faster), equal, or serial (one\n"
    "                      model holds the whole budget at a time)\n"
    "  --hw PROFILE        hardware profile for plans and predictions (default:\n"
    "                      this machine, measured once at start, about 1 s)\n"
    "  --ctx N             each model's context (KV cache) in tokens, prompt and\n"
    "                      answer (default: the model's positions, at most 4096)\n"
    CLI_CACHE_TYPE_HELP
    "  --host ADDR         address to listen on (default 127.0.0.1: this machine\n"
    "                      only; 0.0.0.0 or :: for every interface)\n"
    "  --port N            port (default 8080; 0: any free port, printed)\n"
    "  --api-key KEY       ask every request but GET /health for 'Authorization:\n"
    "                      Bearer KEY' (401 without)\n"
    "  --queue N           requests accepted per model at once, running and waiting\n"
    "                      (default 16); more get 503\n"
    "  --max-loaded N      models loaded at once (default 0: as many as the budget\n"
    "                      holds); loading one more evicts the least recently\n"
    "                      used idle one\n"
    "  --max-batch N       requests of a model run together, at most 64; each\n"
    "                      model's KV cache in host memory holds N sequences of\n"
    "                      --ctx tokens (default 4, fewer where that cache would\n"
    "                      take over a quarter of the host memory available;\n"
    "                      1: requests one at a time, the smallest cache)\n"
    "  --backend B         auto, cpu or cuda\n"
    "  --threads N         CPU threads of each model (default: all cores)\n"
    "  --timeout S         seconds a request's headers and body may take from its\n"
    "                      first byte (default 10); slower clients are cut off\n"
    "  --keep-alive S      seconds an idle connection is kept open (default 60)\n"
    "  --max-connections N open connections at once (default 4096; more are\n"
    "                      closed unanswered)\n"
    "  --per-client N      connections one client address may hold (default 64;\n"
    "                      0: no limit; 127.0.0.1 and ::1 are never limited);\n"
    "                      past it a request is answered 503, then closed\n"
    "  --http-threads N    event-loop threads of the HTTP server (default 4);\n"
    "                      generations run on threads of their own\n"
    "  --shutdown-grace S  seconds the requests in flight get to finish after\n"
    "                      SIGINT or SIGTERM (default 10; 0: stop them at once)\n"
    "  --quiet             no log lines on standard error\n"
    "\n"
    "The server prints 'tide serve: listening on http://HOST:PORT/v1' once it\n"
    "accepts requests. SIGINT or SIGTERM stops it: it stops accepting, lets the\n"
    "requests in flight finish for up to --shutdown-grace seconds, then ends\n"
    "those still running at their next token (a stream with a last chunk,\n"
    "finish_reason \"length\", and data: [DONE]), frees everything and exits\n"
    "with status 0. A second signal skips the wait.\n";

static const struct option serve_options[] = {
    {"model", required_argument, 0, 'm'},     {"budget", required_argument, 0, 'B'},
    {"host-budget", required_argument, 0, 'H'}, {"ssd", required_argument, 0, 'S'},
    {"weights-on-ssd", no_argument, 0, 'W'},  {"policy", required_argument, 0, 'P'},
    {"hw", required_argument, 0, 'w'},        {"ctx", required_argument, 0, 'x'},
    {"host", required_argument, 0, 'a'},      {"port", required_argument, 0, 'p'},
    {"api-key", required_argument, 0, 'k'},   {"queue", required_argument, 0, 'Q'},
    {"max-batch", required_argument, 0, 'G'}, {"backend", required_argument, 0, 'b'},
    {"threads", required_argument, 0, 'T'},   {"quiet", no_argument, 0, 'q'},
    {"max-loaded", required_argument, 0, 'L'}, {"shutdown-grace", required_argument, 0, 'g'},
    {"timeout", required_argument, 0, 'o'},   {"keep-alive", required_argument, 0, 'K'},
    {"max-connections", required_argument, 0, 'C'}, {"http-threads", required_argument, 0, 'R'},
    {"per-client", required_argument, 0, 'I'}, {"cache-type", required_argument, 0, CLI_OPT_CACHE_TYPE},
    {"lora", required_argument, 0, CLI_OPT_LORA},
    {"help", no_argument, 0, 'h'},            {0, 0, 0, 0},
};

typedef struct serve_args {
    serve_model_spec models[SERVE_MAX_MODELS];
    char names[SERVE_MAX_MODELS][64];
    int n_models;
    tide_offload_opts budget;
    bool budget_given;
    tide_pool_opts po;
    tide_pool_model_opts mo;      /* every model's (context, batch, threads) */
    int max_loaded;
    const char *loras[SERVE_MAX_MODELS]; /* --lora NAME=DIR as given */
    int n_loras;
    serve_opts so;
    tide_backend_kind backend;
} serve_args;

static bool good_name(const char *s) {
    if (!*s) return false;
    for (; *s; s++)
        if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') || ('0' <= *s && *s <= '9') || strchr("._-:/", *s)))
            return false;
    return true;
}

/* --model NAME=DIR: DIR must hold a config.json, or be a GGUF file (the
 * rest is read on the model's first request). */
static int add_model(serve_args *a, const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq) return cli_usage_error("serve", "--model takes NAME=DIR, not '%s'", arg);
    if (a->n_models == SERVE_MAX_MODELS) return cli_usage_error("serve", "at most %d models", SERVE_MAX_MODELS);
    char *name = a->names[a->n_models];
    const char *dir = eq + 1;
    size_t n = (size_t)(eq - arg);
    if (n >= sizeof a->names[0]) return cli_usage_error("serve", "the model name in '%s' is over 63 bytes", arg);
    memcpy(name, arg, n);
    name[n] = '\0';
    if (!good_name(name))
        return cli_usage_error("serve", "bad model name '%s' (letters, digits and . _ - : / only)", name);
    for (int i = 0; i < a->n_models; i++)
        if (!strcmp(a->models[i].name, name)) return cli_usage_error("serve", "the model name '%s' is given twice", name);
    char cfg[PATH_MAX];
    struct stat st;
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if ((stat(cfg, &st) || !S_ISREG(st.st_mode)) && !cli_is_gguf(dir))
        return cli_usage_error("serve", "--model %s=%s: neither a GGUF file nor a directory with a config.json (a "
                               "Hugging Face model directory)", name, dir);
    a->models[a->n_models++] = (serve_model_spec){name, dir, NULL};
    return 0;
}

static int parse_args(int argc, char **argv, serve_args *a) {
    long v;
    a->so.host = "127.0.0.1";
    a->so.port = 8080;
    a->so.max_queue = 16;
    a->so.shutdown_grace = 10;
    a->so.timeout = 10;
    a->so.keep_alive = 60;
    a->so.max_connections = 4096;
    a->so.threads = 4;
    a->so.per_client = 64;
    a->backend = TIDE_BACKEND_AUTO;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", serve_options, NULL)) != -1) {
        switch (c) {
        case 'm':
            if (add_model(a, optarg)) return 2;
            break;
        case CLI_OPT_LORA:
            if (a->n_loras == SERVE_MAX_MODELS) return cli_usage_error("serve", "at most %d --lora", SERVE_MAX_MODELS);
            a->loras[a->n_loras++] = optarg;
            break;
        case 'B':
            if (cli_parse_budget(optarg, &a->budget) ||
                (a->budget.budget_kind != TIDE_BUDGET_BYTES && a->budget.budget_kind != TIDE_BUDGET_AUTO))
                return cli_usage_error("serve", "bad --budget '%s' (bytes such as 2G, or auto: one budget for every "
                                       "model, so not a percentage of one model's peak, min or none)", optarg);
            a->budget_given = true;
            break;
        case 'H':
            if (cli_parse_bytes(optarg, &a->po.host_budget) || !a->po.host_budget)
                return cli_usage_error("serve", "bad --host-budget '%s'", optarg);
            break;
        case 'S': a->po.ssd_dirs = optarg; break;
        case 'W': a->po.weights_on_ssd = true; break;
        case 'P':
            if (tide_pool_policy_parse(NULL, optarg, &a->po.policy))
                return cli_usage_error("serve", "unknown --policy '%s' (tide, equal or serial)", optarg);
            break;
        case 'w': a->po.hw = optarg; break;
        case 'x':
            if (cli_parse_int(optarg, 2, 1 << 24, &v)) return cli_usage_error("serve", "bad --ctx '%s' (>= 2)", optarg);
            a->mo.ctx_len = (int)v;
            break;
        case CLI_OPT_CACHE_TYPE:
            if (cli_parse_cache_type(optarg, &a->mo.cache_dtype))
                return cli_usage_error("serve", CLI_CACHE_TYPE_ERROR, optarg);
            break;
        case 'a': a->so.host = optarg; break;
        case 'p':
            if (cli_parse_int(optarg, 0, 65535, &v)) return cli_usage_error("serve", "bad --port '%s' (0 to 65535)", optarg);
            a->so.port = (int)v;
            break;
        case 'k':
            if (!optarg[0]) return cli_usage_error("serve", "--api-key needs a non-empty key");
            a->so.api_key = optarg;
            break;
        case 'o':
            if (cli_parse_double(optarg, 0.5, 86400, &a->so.timeout))
                return cli_usage_error("serve", "bad --timeout '%s' (0.5 to 86400 seconds)", optarg);
            break;
        case 'C':
            if (cli_parse_int(optarg, 1, 1 << 20, &v))
                return cli_usage_error("serve", "bad --max-connections '%s' (>= 1)", optarg);
            a->so.max_connections = (int)v;
            break;
        case 'I':
            if (cli_parse_int(optarg, 0, 1 << 20, &v)) return cli_usage_error("serve", "bad --per-client '%s' (>= 0)", optarg);
            a->so.per_client = (int)v;
            break;
        case 'R':
            if (cli_parse_int(optarg, 1, 256, &v)) return cli_usage_error("serve", "bad --http-threads '%s' (1 to 256)", optarg);
            a->so.threads = (int)v;
            break;
        case 'K':
            if (cli_parse_int(optarg, 1, 86400, &v))
                return cli_usage_error("serve", "bad --keep-alive '%s' (1 to 86400 seconds)", optarg);
            a->so.keep_alive = (int)v;
            break;
        case 'g':
            if (cli_parse_double(optarg, 0, 86400, &a->so.shutdown_grace))
                return cli_usage_error("serve", "bad --shutdown-grace '%s' (0 to 86400 seconds)", optarg);
            break;
        case 'Q':
            if (cli_parse_int(optarg, 1, 1 << 20, &v)) return cli_usage_error("serve", "bad --queue '%s' (>= 1)", optarg);
            a->so.max_queue = (int)v;
            break;
        case 'G':
            if (cli_parse_int(optarg, 1, TIDE_MAX_BATCH, &v))
                return cli_usage_error("serve", "bad --max-batch '%s' (1 to %d)", optarg, TIDE_MAX_BATCH);
            a->mo.max_batch = (int)v;
            break;
        case 'b':
            if (cli_parse_backend(optarg, &a->backend))
                return cli_usage_error("serve", "unknown --backend '%s' (auto, cpu or cuda)", optarg);
            break;
        case 'T':
            if (cli_parse_int(optarg, 1, 4096, &v)) return cli_usage_error("serve", "bad --threads '%s'", optarg);
            a->mo.threads = (int)v;
            break;
        case 'L':
            if (cli_parse_int(optarg, 0, SERVE_MAX_MODELS, &v))
                return cli_usage_error("serve", "bad --max-loaded '%s' (0 for no limit, up to %d)", optarg,
                                       SERVE_MAX_MODELS);
            a->max_loaded = (int)v;
            break;
        case 'q': a->so.quiet = true; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("serve", "unknown option");
        }
    }
    if (optind != argc) return cli_usage_error("serve", "unexpected argument '%s'", argv[optind]);
    if (!a->n_models) return cli_usage_error("serve", "give at least one --model NAME=DIR");
    for (int k = 0; k < a->n_loras; k++) {
        const char *arg = a->loras[k], *eq = strchr(arg, '=');
        int found = -1;
        for (int i = 0; eq && i < a->n_models; i++)
            if (strlen(a->models[i].name) == (size_t)(eq - arg) && !strncmp(a->models[i].name, arg, (size_t)(eq - arg)))
                found = i;
        if (!eq || !eq[1]) return cli_usage_error("serve", "--lora takes NAME=DIR, not '%s'", arg);
        if (found < 0)
            return cli_usage_error("serve", "--lora %s: no --model named '%.*s'", arg, (int)(eq - arg), arg);
        if (a->models[found].lora)
            return cli_usage_error("serve", "--lora: the model '%s' has an adapter already", a->models[found].name);
        a->models[found].lora = eq + 1;
    }
    if (!a->budget_given) return cli_usage_error("serve", "give the device budget the models share: --budget BYTES|auto");
    a->so.models = a->models;
    a->so.n_models = a->n_models;
    return -1;
}

/* --budget auto: the device's free memory less the margin tide run keeps. */
static int auto_budget(tide_ctx *ctx, tide_backend *be, uint64_t *out) {
    tide_status st = tide_pool_auto_budget(ctx, be, out);
    if (st == TIDE_E_UNSUPPORTED) {
        fprintf(stderr, "tide serve: --budget auto reads a GPU's free memory; the %s backend has none: give bytes\n",
                tide_backend_name(be));
        return 2;
    }
    if (st == TIDE_E_INFEASIBLE) {
        fprintf(stderr, "tide serve: --budget auto: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    return st ? cli_fail(ctx, "--budget auto") : 0;
}

static void pool_log(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "tide serve: %s\n", line);
}

int cmd_serve(int argc, char **argv) {
    serve_args a;
    memset(&a, 0, sizeof a);
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    /* SIGINT and SIGTERM go to the server's sigwait: blocked in every thread
     * made from here on; a client gone never raises SIGPIPE */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    tide_ctx *ctx = tide_ctx_new(), *pool_ctx = tide_ctx_new();
    tide_backend *be = NULL;
    tide_pool *pool = NULL;
    rc = 1;
    if (!ctx || !pool_ctx) goto done;
    if (tide_backend_new(ctx, a.backend, &be)) {
        rc = cli_fail(ctx, "backend");
        goto done;
    }
    a.po.budget_bytes = a.budget.bytes;
    if (a.budget.budget_kind == TIDE_BUDGET_AUTO && (rc = auto_budget(ctx, be, &a.po.budget_bytes))) goto done;
    if (!a.so.quiet) {
        a.po.log = pool_log;
        char b[32];
        fprintf(stderr, "tide serve: %d models on %s, budget %s shared (policy %s)%s\n", a.n_models,
                tide_backend_name(be), cli_fmt_bytes(a.po.budget_bytes, b, sizeof b),
                tide_pool_policy_name(a.po.policy), a.po.hw ? "" : "; measuring this machine");
    }
    if (tide_pool_new(pool_ctx, be, &a.po, &pool)) {
        rc = cli_fail(pool_ctx, "the pool");
        goto done;
    }
    /* the pool loads them on their first requests, and evicts */
    for (int i = 0; i < a.n_models; i++) {
        tide_pool_model_opts mo = a.mo;
        mo.lora = a.models[i].lora;
        if (tide_pool_offer_model(pool, a.models[i].name, a.models[i].dir, &mo)) {
            /* a model the options can never serve (--ctx beyond its
             * positions, a name given twice) is a bad argument: exit 2 */
            rc = cli_fail(pool_ctx, "the pool");
            if (tide_ctx_last_status(pool_ctx) == TIDE_E_INVALID) rc = 2;
            tide_pool_free(pool);
            goto done;
        }
    }
    if (tide_pool_set_max_loaded(pool, a.max_loaded)) {
        rc = cli_fail(pool_ctx, "the pool");
        tide_pool_free(pool);
        goto done;
    }
    a.so.pool = pool;
    rc = serve_http_run(&a.so, &sigs); /* frees the pool */
done:
    tide_backend_free(be);
    tide_ctx_free(pool_ctx);
    tide_ctx_free(ctx);
    return rc;
}
