/*
 * cmd_run.c - `tide run`: prefill a prompt and generate tokens greedily.
 */
#include "cli.h"
#include "cli/textgen.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "Usage: tide run [--model PATH] [--lora DIR]\n"
    "                [--prompt TEXT | --prompt-file FILE | --tokens 1,2,3 |\n"
    "                --prompt-len N] [--new-tokens N] [--chat] [--system TEXT]\n"
    "                [--template NAME] [--temperature T] [--top-k K] [--top-p P]\n"
    "                [--min-p P] [--repeat-penalty R] [--frequency-penalty F]\n"
    "                [--presence-penalty P] [--penalty-last-n N] [--seed N]\n"
    "                [--stop STRING]... [--no-parse-special]\n"
    "                [--budget BYTES|PCT%|auto|min|none] [--policy tide|static-layer|lru]\n"
    "                [--host-budget BYTES] [--ssd DIR[,DIR]] [--weights-on-ssd] [--pread]\n"
    "                [--direct-storage]\n"
    "                [--tile auto|none|LEVEL] [--pin-weights auto|yes|no] [--hw PROFILE]\n"
    "                [--engine planned|plain] [--verify] [--check] [--cache-type T]\n"
    "                [--trace FILE] [--trace-svg FILE]\n"
    "                [--backend auto|cpu|cuda] [--matmul auto|f32|fast] [--threads N]\n"
    "                [--json] [--quiet]\n"
    "\n"
    "Prefills the prompt, then generates tokens: greedily (argmax) unless sampling\n"
    "options are given. A text prompt (--prompt, --prompt-file) goes through the\n"
    "model's tokenizer and the generated text is printed as it comes, the summary\n"
    "after it on standard error; token ids (--tokens, --prompt-len) print ids.\n"
    "\n"
    "Every graph runs through a verified plan on the executor: with a budget,\n"
    "one that pages tensors between a device arena of exactly that many bytes,\n"
    "host memory and SSD spill files; without, an unconstrained one (weights\n"
    "and KV cache stay in device memory, or are used in place where it is host\n"
    "memory).\n"
    "\n"
    "On the CPU the device is host memory, so nothing is gained by moving\n"
    "tensors between the two: tensors homed in host memory (the KV cache, the\n"
    "inputs and outputs, and the weights unless --weights-on-ssd) are used in\n"
    "place, never copied; the budget is the arena, which bounds what a run adds\n"
    "to them (activations, and weights streamed from SSD); offloading means the\n"
    "SSD tier. There only --weights-on-ssd lowers the memory a model needs.\n"
    "Under the tide policy, on a GPU or with --weights-on-ssd, part of the\n"
    "budget may keep weights in the arena across runs (chosen by the plans'\n"
    "predictions; `warm` in the summary, warm_weight_bytes in --json).\n"
    "\n"
    "With no arguments it demonstrates offloading on the built-in model (a\n"
    "tinyllama-1.1b-shaped synthetic bf16 checkpoint, generated once into\n"
    "$TIDE_CACHE, else $XDG_CACHE_HOME/tide, else ~/.cache/tide) at 25% of its\n"
    "unconstrained peak, checked bit for bit against the plain reference engine\n"
    "(an unconstrained run). On a GPU the weights stream from host memory. On\n"
    "the CPU they stream from SSD (--weights-on-ssd), the reference run comes\n"
    "after the offloaded one, and the peak resident memory (RSS) of each run is\n"
    "measured and shown side by side.\n"
    "\n"
    "  --model PATH        Hugging Face-layout LLaMA checkpoint directory\n"
    "                      (config.json + model.safetensors or shards with an\n"
    "                      index), or a GGUF file (docs/gguf.md)\n"
    CLI_LORA_HELP
    "  --prompt TEXT       the prompt as text, through the model's tokenizer\n"
    "                      (tokenizer.json in the model directory, a GGUF\n"
    "                      file's metadata; the built-in model has its own),\n"
    "                      with the BOS token it adds\n"
    "  --prompt-file FILE  the prompt's text from FILE, exactly ('-': standard input)\n"
    "  --chat              format --prompt (and --system) with the model's chat\n"
    "                      template, as a one-turn conversation (see tide chat)\n"
    "  --tokens LIST       prompt token ids, comma-separated\n"
    "  --prompt-len N      a deterministic prompt of N token ids (default 32)\n"
    "  --new-tokens N      tokens to generate (default 16)\n"
    "  --budget X          device memory: bytes (2G), a percentage of the\n"
    "                      unconstrained peak (25%: of the bytes the largest graph's\n"
    "                      tensors take when all are in device memory at once:\n"
    "                      weights, KV cache and live activations; the same on the\n"
    "                      CPU, where that is the memory the unconstrained run\n"
    "                      needs), auto (on a GPU its free memory less max(512 MiB,\n"
    "                      1/32 of its memory); on the CPU 90% of the profile's\n"
    "                      device memory; at most the unconstrained peak), min (the\n"
    "                      smallest the policy can plan) or none (everything\n"
    "                      resident). The arena is exactly this many bytes; on the\n"
    "                      CPU it is what a run adds to the tensors homed in host\n"
    "                      memory (see above). Default: 25% with no --model and no\n"
    "                      --budget given; none otherwise\n"
    "  --policy P          tide (default), static-layer or lru (the baselines copy\n"
    "                      every tensor into the arena, on the CPU too)\n"
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
    "                      the backend, see `tide probe`; on the CPU its SSD read\n"
    "                      rate is then refitted from each run that reads at least\n"
    "                      256 MiB from SSD, for the plans made after it)\n"
    "  --engine E          planned (default: every graph through a verified plan)\n"
    "                      or plain (the reference: every op in order, all tensors\n"
    "                      resident, no planner, verifier or executor; no budget)\n"
    "  --verify            verify every plan (always done; kept for scripts)\n"
    "  --check             also run the plain reference engine and compare the\n"
    "                      generated tokens and every logit bit for bit (on by\n"
    "                      default with no arguments); exit status 1 when they\n"
    "                      differ. On the CPU the reference runs after this run,\n"
    "                      so that each run's peak RSS is its own\n"
    CLI_CACHE_TYPE_HELP
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
    ;
static const char help_tail[] =
    "  --json              print one JSON object instead of the summary (with a\n"
    "                      text prompt: \"text\", \"stop_reason\" and \"seed\" too)\n"
    "  --quiet             no progress lines\n"
    "\n"
    "Environment: TIDE_THREADS (CPU threads without --threads), TIDE_CACHE (where\n"
    "the built-in model is written), TIDE_DATA (hardware profiles), on a GPU\n"
    "TIDE_EXEC_SYNC=1 (wait for every op and copy instead of queueing them ahead\n"
    "with events, to compare) and TIDE_CUDA_ATTENTION=rows (per-row attention\n"
    "kernel only). See docs/running.md, section 8 (Environment).\n";

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

typedef struct run_args {
    const char *prompt_text, *prompt_file; /* a text prompt */
    bool chat, prompt_len_given;
    cli_text_opts text;
    const char *model_dir, *tokens, *budget, *policy, *ssd, *hw, *trace, *trace_svg;
    long prompt_len, new_tokens, threads;
    uint64_t host_budget;
    bool json, quiet, check, weights_on_ssd, pread, verify;
    tide_engine engine;
    tide_backend_kind backend;
    tide_matmul_mode matmul;
    const char *pin;
    bool direct_storage;
    const char *tile;
    tide_dtype cache_type;
    const char *lora;
} run_args;

/* Peak resident memory of the process during each run (cli_rss_*): `exact`
 * when the peak was reset before the run; else it is the process's peak so
 * far (the machine probe's buffers and any earlier run included). */
typedef struct rss_measure {
    uint64_t before, peak;    /* at the run's start; its peak (0: unknown) */
    bool exact;
} rss_measure;

/* What one `tide run` works on. */
typedef struct run_job {
    run_args a;
    tide_offload_opts off;
    bool offload;
    tide_ctx *ctx;
    cli_progress_state ps;
    tide_checkpoint *ck;
    tide_backend *be;
    tide_model *m;
    const char *model_dir;
    char dir[PATH_MAX];
    int32_t *prompt, *gen, *gen_ref;
    int n_prompt;
    tide_gen_stats stats, ref;
    bool have_ref;
    int check_rc;                 /* 0 bit-identical, 1 differ, 2 tiled: tokens identical */
    bool demo;                    /* no arguments: the built-in demonstration */
    bool host_device;             /* the backend's device memory is host memory (the CPU) */
    rss_measure rss, ref_rss;     /* this run's and the reference run's */
    int n_gen, n_gen_ref;         /* ids generated (fewer than --new-tokens after a stop) */
    /* text mode (a text prompt) */
    bool text_mode;
    tide_tokenizer *tok;
    tide_chat_template *tmpl;
    tide_sampler *sampler;        /* also without text, when sampling options are given */
    int32_t *stop_ids;
    int n_stop_ids;
    tide_textgen *out;          /* the text (printed as it comes unless --json) */
    const char *stop_reason;      /* "eos", "stop" (a --stop string), "length" */
} run_job;

/* Predicted against measured seconds, as a signed percentage of the
 * prediction (0 when there is none). */
static double pct_off(double measured, double predicted) {
    return predicted > 0 ? 100.0 * (measured - predicted) / predicted : 0;
}

/* The summary, on f (stdout, or stderr after generated text). */
static void print_summary(const run_job *r, FILE *f) {
    const run_args *a = &r->a;
    const char *model_dir = r->model_dir, *policy = a->policy;
    const tide_llama_config *cfg = tide_checkpoint_config(r->ck);
    tide_backend *be = r->be;
    tide_ctx *ctx = r->ctx;
    int n_prompt = r->n_prompt, check_rc = r->check_rc;
    const int32_t *gen = r->gen;
    const tide_gen_stats *s = &r->stats, *ref = r->have_ref ? &r->ref : NULL;
    bool offload = r->offload;
    const tide_offload_opts *off = &r->off;
    const rss_measure *run_rss = &r->rss, *ref_rss = &r->ref_rss;
    char b1[32], b2[32], b3[32], b4[32];
    fprintf(f, "model      %s (%s, %d layers, %s, KV cache %s)\n", model_dir, cfg->name, cfg->num_hidden_layers,
           tide_dtype_name(cfg->dtype), tide_dtype_name(a->cache_type));
    fprintf(f, "backend    %s, matmul %s, %d threads, %s issue, engine %s\n", tide_backend_name(be),
           tide_matmul_name(tide_backend_matmul(be)), tide_ctx_threads(ctx),
           s->async_issue ? "asynchronous (events)" : "synchronous",
           a->engine == TIDE_ENGINE_PLAIN ? "plain" : "planned");
    fprintf(f, "kernels    %s\n", tide_backend_kernels(be));
    fprintf(f, "prompt     %d tokens\n", n_prompt);
    if (r->text_mode) {
        fprintf(f, "generated  %d tokens (stopped by %s)", r->n_gen, r->stop_reason);
        if (a->text.so.temperature > 0) fprintf(f, ", seed %llu", (unsigned long long)a->text.so.seed);
        fputc('\n', f);
    } else {
        fprintf(f, "generated ");
        for (int i = 0; i < r->n_gen; i++) fprintf(f, " %d", gen[i]);
        fputc('\n', f);
    }
    fprintf(f, "prefill    %.2f tokens/s (%.3f s)\n", s->prefill_tokens_per_s, s->prefill_s);
    fprintf(f, "decode     %.2f tokens/s (%.3f s for %d tokens)\n", s->decode_tokens_per_s, s->decode_s,
           s->decode_tokens);
    if (offload) {
        char tl[16] = "none";
        if (s->tile_level) snprintf(tl, sizeof tl, "level %d", s->tile_level);
        char of[48] = "";
        if (off->budget_kind == TIDE_BUDGET_FRACTION)
            snprintf(of, sizeof of, " (%g%% of the unconstrained peak)", off->fraction * 100);
        fprintf(f, "offload    policy %s, device budget %s%s, peak device %s, tiling %s\n", policy,
               cli_fmt_bytes(s->budget_bytes, b1, sizeof b1), of, cli_fmt_bytes(s->peak_device_bytes, b2, sizeof b2),
               tl);
        fprintf(f, "links      host->device %s, device->host %s, ssd read %s, ssd write %s\n",
               cli_fmt_bytes(s->bytes_h2d, b1, sizeof b1), cli_fmt_bytes(s->bytes_d2h, b2, sizeof b2),
               cli_fmt_bytes(s->bytes_ssd_read, b3, sizeof b3), cli_fmt_bytes(s->bytes_ssd_write, b4, sizeof b4));
        fprintf(f, "weights    %s pinned in host memory of %s%s\n", cli_fmt_bytes(s->pinned_weight_bytes, b1, sizeof b1),
               cli_fmt_bytes(s->weight_bytes, b2, sizeof b2),
               a->weights_on_ssd ? "; homed on SSD, read from the checkpoint file" : "");
        if (s->warm_weight_bytes)
            fprintf(f, "warm       %s of weights kept in the arena across runs\n",
                    cli_fmt_bytes(s->warm_weight_bytes, b1, sizeof b1));
        fprintf(f, "time       wall %.3f s; predicted makespan %.3f s, measured %.3f s (%+.1f%%)\n",
               s->prefill_s + s->decode_s, s->predicted_s, s->exec_s, pct_off(s->exec_s, s->predicted_s));
        double pd = s->predicted_s - s->predicted_prefill_s;
        fprintf(f, "predicted  prefill %.3f s, measured %.3f s (%+.1f%%); decode %.2f tokens/s (%.3f s), measured "
               "%.2f (%.3f s, %+.1f%%)\n", s->predicted_prefill_s, s->prefill_s,
               pct_off(s->prefill_s, s->predicted_prefill_s), pd > 0 ? s->decode_tokens / pd : 0, pd,
               s->decode_tokens_per_s, s->decode_s, pct_off(s->decode_s, pd));
    } else {
        fprintf(f, "memory     peak %s of tensors (weights %s, KV cache %s)\n",
               cli_fmt_bytes(s->peak_bytes, b1, sizeof b1), cli_fmt_bytes(s->weight_bytes, b2, sizeof b2),
               cli_fmt_bytes(s->state_bytes, b3, sizeof b3));
    }
    if (run_rss->peak) {
        fprintf(f, "memory     peak RSS %s %s", cli_fmt_bytes(run_rss->peak, b1, sizeof b1),
               run_rss->exact ? "during this run" : "of the process so far");
        if (run_rss->exact && run_rss->before) fprintf(f, " (%s at its start)", cli_fmt_bytes(run_rss->before, b2, sizeof b2));
        if (ref && ref_rss->peak)
            fprintf(f, "; %s during the unconstrained reference run%s (%.2fx)", cli_fmt_bytes(ref_rss->peak, b3, sizeof b3),
                   ref_rss->exact ? "" : " (process peak)", (double)run_rss->peak / (double)ref_rss->peak);
        fputc('\n', f);
    }
    if (ref) {
        double w = s->prefill_s + s->decode_s, rw = ref->prefill_s + ref->decode_s;
        fprintf(f, "check      %s: plain reference run %.3f s; this run %.2fx its wall time (prefill %.2fx)\n",
               check_rc == 1 ? "FAILED, outputs differ"
               : check_rc == 2 ? "passed, tokens identical (tiled graph: logits equal up to f32 summation order)"
                               : "passed, tokens and logits bit-identical", rw,
               rw > 0 ? w / rw : 0, ref->prefill_s > 0 ? s->prefill_s / ref->prefill_s : 0);
    }
}

static void print_json(const run_job *r) {
    const run_args *a = &r->a;
    const char *model_dir = r->model_dir, *policy = a->policy;
    const tide_llama_config *cfg = tide_checkpoint_config(r->ck);
    tide_backend *be = r->be;
    tide_ctx *ctx = r->ctx;
    int n_prompt = r->n_prompt, check_rc = r->check_rc;
    const int32_t *gen = r->gen;
    const tide_gen_stats *s = &r->stats, *ref = r->have_ref ? &r->ref : NULL;
    bool offload = r->offload;
    const tide_offload_opts *off = &r->off;
    const rss_measure *run_rss = &r->rss, *ref_rss = &r->ref_rss;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model_dir);
    cJSON_AddStringToObject(o, "config", cfg->name);
    cJSON_AddStringToObject(o, "backend", tide_backend_name(be));
    cJSON_AddStringToObject(o, "cache_type", tide_dtype_name(r->a.cache_type));
    cJSON_AddStringToObject(o, "matmul", tide_matmul_name(tide_backend_matmul(be)));
    cJSON_AddStringToObject(o, "kernels", tide_backend_kernels(be));
    cJSON_AddNumberToObject(o, "threads", tide_ctx_threads(ctx));
    cJSON_AddStringToObject(o, "engine", a->engine == TIDE_ENGINE_PLAIN ? "plain" : "planned");
    cJSON_AddBoolToObject(o, "async_issue", s->async_issue);
    cJSON_AddNumberToObject(o, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(o, "new_tokens", (double)a->new_tokens);
    cJSON_AddItemToObject(o, "tokens", cJSON_CreateIntArray(gen, r->n_gen));
    char lh[24]; /* FNV-1a of every logits output: equal for bit-identical logits */
    snprintf(lh, sizeof lh, "%016llx", (unsigned long long)s->logits_hash);
    cJSON_AddStringToObject(o, "logits_hash", lh);
    if (r->text_mode) {
        cJSON_AddStringToObject(o, "text", tide_textgen_text(r->out, NULL));
        cJSON_AddStringToObject(o, "stop_reason", r->stop_reason);
    }
    if (a->text.so.temperature > 0) {
        char seed[24];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)a->text.so.seed);
        cJSON_AddStringToObject(o, "seed", seed); /* a string: 64 bits do not fit a JSON number's double */
    }
    cJSON_AddNumberToObject(o, "prefill_s", s->prefill_s);
    cJSON_AddNumberToObject(o, "decode_s", s->decode_s);
    cJSON_AddNumberToObject(o, "wall_s", s->prefill_s + s->decode_s);
    cJSON_AddNumberToObject(o, "prefill_tokens_per_s", s->prefill_tokens_per_s);
    cJSON_AddNumberToObject(o, "decode_tokens_per_s", s->decode_tokens_per_s);
    cJSON_AddNumberToObject(o, "peak_bytes", (double)s->peak_bytes);
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)cli_rss_peak());
    cJSON_AddNumberToObject(o, "run_peak_rss_bytes", (double)run_rss->peak);
    cJSON_AddNumberToObject(o, "run_start_rss_bytes", (double)run_rss->before);
    cJSON_AddBoolToObject(o, "run_peak_rss_exact", run_rss->exact);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)s->weight_bytes);
    cJSON_AddNumberToObject(o, "state_bytes", (double)s->state_bytes);
    cJSON_AddBoolToObject(o, "offloaded", offload);
    cJSON_AddStringToObject(o, "policy", offload ? policy : "none");
    cJSON_AddNumberToObject(o, "budget_bytes", (double)s->budget_bytes);
    if (offload && off->budget_kind == TIDE_BUDGET_FRACTION) cJSON_AddNumberToObject(o, "budget_fraction", off->fraction);
    cJSON_AddBoolToObject(o, "weights_on_ssd", offload && a->weights_on_ssd);
    cJSON_AddNumberToObject(o, "tile_level", s->tile_level);
    cJSON_AddNumberToObject(o, "pinned_weight_bytes", (double)s->pinned_weight_bytes);
    cJSON_AddNumberToObject(o, "warm_weight_bytes", (double)s->warm_weight_bytes);
    cJSON_AddNumberToObject(o, "peak_device_bytes", (double)(offload ? s->peak_device_bytes : s->peak_bytes));
    cJSON_AddNumberToObject(o, "bytes_h2d", (double)s->bytes_h2d);
    cJSON_AddNumberToObject(o, "bytes_d2h", (double)s->bytes_d2h);
    cJSON_AddNumberToObject(o, "bytes_ssd_read", (double)s->bytes_ssd_read);
    cJSON_AddNumberToObject(o, "bytes_ssd_write", (double)s->bytes_ssd_write);
    cJSON_AddNumberToObject(o, "predicted_makespan_s", s->predicted_s);
    cJSON_AddNumberToObject(o, "predicted_prefill_s", s->predicted_prefill_s);
    cJSON_AddNumberToObject(o, "predicted_decode_s", offload ? s->predicted_s - s->predicted_prefill_s : 0);
    cJSON_AddNumberToObject(o, "measured_makespan_s", s->exec_s);
    cJSON_AddNumberToObject(o, "ssd_read_s", s->ssd_read_s);
    if (ref) {
        cJSON_AddStringToObject(o, "reference_engine", "plain");
        cJSON_AddNumberToObject(o, "unconstrained_wall_s", ref->prefill_s + ref->decode_s);
        cJSON_AddNumberToObject(o, "unconstrained_prefill_s", ref->prefill_s);
        cJSON_AddBoolToObject(o, "check_passed", check_rc != 1);
        cJSON_AddBoolToObject(o, "check_bit_identical", check_rc == 0);
        cJSON_AddNumberToObject(o, "reference_peak_rss_bytes", (double)ref_rss->peak);
        cJSON_AddBoolToObject(o, "reference_peak_rss_exact", ref_rss->exact);
    }
    char *js = cJSON_PrintUnformatted(o);
    if (js) puts(js);
    free(js);
    cJSON_Delete(o);
}


static const struct option run_options[] = {
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
    {"engine", required_argument, 0, 'E'},     {"cache-type", required_argument, 0, CLI_OPT_CACHE_TYPE},
    {"prompt", required_argument, 0, 'Q'},     {"prompt-file", required_argument, 0, 'F'},
    {"chat", no_argument, 0, 'C'},             {"lora", required_argument, 0, CLI_OPT_LORA},
    CLI_TEXT_OPTIONS,
    {0, 0, 0, 0},
};

/* Parses argv into r->a and r->off. Returns -1 to go on, else the exit
 * status (0 after --help, 2 on a usage error). */
static int parse_args(int argc, char **argv, run_job *r) {
    run_args *a = &r->a;
    *a = (run_args){.prompt_len = 32, .new_tokens = 16, .policy = "tide", .backend = TIDE_BACKEND_AUTO};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", run_options, NULL)) != -1) {
        switch (c) {
        case 'm': a->model_dir = optarg; break;
        case 't': a->tokens = optarg; break;
        case 'p':
            if (cli_parse_int(optarg, 1, 1 << 20, &a->prompt_len)) return cli_usage_error("run", "bad --prompt-len '%s'", optarg);
            a->prompt_len_given = true;
            break;
        case 'Q': a->prompt_text = optarg; break;
        case 'F': a->prompt_file = optarg; break;
        case 'C': a->chat = true; break;
        case 'n':
            if (cli_parse_int(optarg, 0, 1 << 20, &a->new_tokens)) return cli_usage_error("run", "bad --new-tokens '%s'", optarg);
            break;
        case 'T':
            if (cli_parse_int(optarg, 1, 4096, &a->threads)) return cli_usage_error("run", "bad --threads '%s'", optarg);
            break;
        case 'b':
            if (cli_parse_backend(optarg, &a->backend))
                return cli_usage_error("run", "unknown --backend '%s' (auto, cpu or cuda)", optarg);
            break;
        case 'B':
            a->budget = optarg;
            if (cli_parse_budget(optarg, &r->off))
                return cli_usage_error("run", "bad --budget '%s' (bytes such as 2G, a percentage such as 25%%, auto, min or none)", optarg);
            break;
        case 'P':
            if (!strcmp(optarg, "zero-offload"))
                return cli_usage_error("run", "--policy %s plans a training step (tide train, tide plan --train); "
                                       "inference takes tide, static-layer or lru", optarg);
            if (strcmp(optarg, "tide") && strcmp(optarg, "static-layer") && strcmp(optarg, "lru"))
                return cli_usage_error("run", "unknown --policy '%s' (tide, static-layer or lru)", optarg);
            a->policy = optarg;
            break;
        case 'H':
            if (cli_parse_bytes(optarg, &a->host_budget) || !a->host_budget)
                return cli_usage_error("run", "bad --host-budget '%s'", optarg);
            break;
        case 'S': a->ssd = optarg; break;
        case 'W': a->weights_on_ssd = true; break;
        case 'R': a->pread = true; break;
        case 'D': a->direct_storage = true; break;
        case 'w': a->hw = optarg; break;
        case 'v': a->verify = true; break;
        case 'c': a->check = true; break;
        case 'x': a->trace = optarg; break;
        case 'X': a->trace_svg = optarg; break;
        case 'j': a->json = true; break;
        case 'q': a->quiet = true; break;
        case 'L':
            a->tile = optarg;
            if (tide_tile_parse(NULL, optarg, &r->off.tile))
                return cli_usage_error("run", "bad --tile '%s' (auto, none or a level 1 to %d)", optarg,
                                       TIDE_TILE_LEVELS - 1);
            break;
        case 'N':
            a->pin = optarg;
            if (!strcmp(optarg, "auto")) r->off.pin_weights = 0;
            else if (!strcmp(optarg, "yes")) r->off.pin_weights = 1;
            else if (!strcmp(optarg, "no")) r->off.pin_weights = -1;
            else return cli_usage_error("run", "bad --pin-weights '%s' (auto, yes or no)", optarg);
            break;
        case 'M':
            if (tide_matmul_parse(NULL, optarg, &a->matmul))
                return cli_usage_error("run", "unknown --matmul '%s' (auto, f32 or fast)", optarg);
            break;
        case CLI_OPT_CACHE_TYPE:
            if (cli_parse_cache_type(optarg, &a->cache_type)) return cli_usage_error("run", CLI_CACHE_TYPE_ERROR, optarg);
            break;
        case CLI_OPT_LORA: a->lora = optarg; break;
        case 'E':
            if (!strcmp(optarg, "planned")) a->engine = TIDE_ENGINE_PLANNED;
            else if (!strcmp(optarg, "plain")) a->engine = TIDE_ENGINE_PLAIN;
            else return cli_usage_error("run", "unknown --engine '%s' (planned or plain)", optarg);
            break;
        case 'h':
            fputs(help, stdout);
            fputs(cli_text_help, stdout);
            fputs(help_tail, stdout);
            return 0;
        default: {
            int t = cli_text_option(c, optarg, "run", &a->text);
            if (t < 0) return 2;
            if (t == 0) return cli_usage_error("run", "unknown option");
        }
        }
    }
    if (optind != argc) return cli_usage_error("run", "unexpected argument '%s'", argv[optind]);
    r->text_mode = a->prompt_text || a->prompt_file;
    if ((a->prompt_text != NULL) + (a->prompt_file != NULL) + (a->tokens != NULL) + a->prompt_len_given > 1)
        return cli_usage_error("run", "give one prompt: --prompt, --prompt-file, --tokens or --prompt-len");
    if (a->chat && !r->text_mode) return cli_usage_error("run", "--chat formats a text prompt: give --prompt or --prompt-file");
    if ((a->text.system || a->text.template_name) && !a->chat)
        return cli_usage_error("run", "--system and --template need --chat");
    if (a->chat && a->text.no_parse_special)
        return cli_usage_error("run", "--no-parse-special does not combine with --chat (the template's markers are special tokens)");
    if ((a->text.n_stops || a->text.no_parse_special) && !r->text_mode)
        return cli_usage_error("run", "--stop and --no-parse-special need a text prompt (--prompt or --prompt-file)");
    if (!a->model_dir && !a->budget && a->engine == TIDE_ENGINE_PLANNED) {
        /* the built-in demonstration: offloaded at 25%, checked (on the CPU,
         * weights on SSD too: open_model, once the backend is known) */
        r->off.budget_kind = TIDE_BUDGET_FRACTION;
        r->off.fraction = 0.25;
        a->check = true;
        r->demo = true;
    }
    r->offload = r->off.budget_kind != TIDE_BUDGET_NONE;
    r->off.timeline = a->trace || a->trace_svg; /* measured on a GPU only when written */
    if (!r->offload && (a->trace || a->trace_svg || a->weights_on_ssd || a->ssd || a->hw || a->host_budget ||
                        a->pread || a->tile || a->pin || a->direct_storage || strcmp(a->policy, "tide")))
        return cli_usage_error("run", "--trace, --trace-svg, --ssd, --weights-on-ssd, --policy, --hw, "
                               "--host-budget, --tile, --pin-weights, --direct-storage and --pread need a --budget");
    if (a->engine == TIDE_ENGINE_PLAIN && (r->offload || a->check))
        return cli_usage_error("run", "--engine plain runs resident, unchecked: no --budget, no --check");
    if (a->check && a->new_tokens < 1) return cli_usage_error("run", "--check needs --new-tokens of at least 1");
    if (a->direct_storage && !a->weights_on_ssd)
        return cli_usage_error("run", "--direct-storage reads weights homed on SSD: it needs --weights-on-ssd");
    if (a->tokens && parse_tokens(a->tokens, &r->prompt, &r->n_prompt))
        return cli_usage_error("run", "bad --tokens '%s' (comma-separated integers)", a->tokens);
    r->off.policy = a->policy;
    r->off.host_budget = a->host_budget;
    r->off.ssd_dirs = a->ssd;
    r->off.weights_on_ssd = a->weights_on_ssd;
    if (a->pread) setenv("TIDE_SSD_PREAD", "1", 1); /* src/store/ssd.c: the pread path */
    r->off.direct_storage = a->direct_storage;
    r->off.hw = a->hw;
    return -1;
}

/* A text prompt: the model's tokenizer, the text (through the chat template
 * with --chat) encoded, the stop ids, the printer. Returns 0 or the exit
 * status. */
static int text_prompt(run_job *r, const tide_llama_config *cfg) {
    run_args *a = &r->a;
    if (tide_tokenizer_open(r->ctx, r->model_dir, &r->tok)) return cli_fail(r->ctx, "the model's tokenizer");
    if (tide_tokenizer_n_vocab(r->tok) > cfg->vocab_size) {
        fprintf(stderr, "tide: run: the tokenizer's %d ids exceed the model's vocabulary of %d (embedding rows): "
                "they do not belong together\n", tide_tokenizer_n_vocab(r->tok), cfg->vocab_size);
        return 1;
    }
    size_t len = 0;
    char *text = a->prompt_file ? cli_read_all(a->prompt_file, &len) : strdup(a->prompt_text);
    if (!text) return a->prompt_file ? 1 : (fprintf(stderr, "tide: out of memory\n"), 1);
    if (!a->prompt_file) len = strlen(text);
    int rc = 0;
    unsigned flags = a->text.no_parse_special ? TIDE_TOKENIZE_SPECIAL_AS_TEXT : 0;
    if (len == 0) {
        fprintf(stderr, "tide: run: the prompt is empty\n");
        rc = 1;
    } else if (a->chat) {
        char *chat = NULL;
        size_t clen = 0;
        tide_chat_msg msgs[2];
        int n = 0;
        if (a->text.system) msgs[n++] = (tide_chat_msg){"system", a->text.system};
        msgs[n++] = (tide_chat_msg){"user", text};
        if (tide_chat_template_get(r->ctx, r->tok, a->text.template_name, &r->tmpl) ||
            tide_chat_format(r->ctx, r->tmpl, msgs, n, true, &chat, &clen))
            rc = cli_fail(r->ctx, "chat template");
        if (!rc) rc = cli_encode(r->ctx, r->tok, chat, clen, flags, &r->prompt, &r->n_prompt);
        tide_free_text(chat);
    } else {
        rc = cli_encode(r->ctx, r->tok, text, len, flags | TIDE_TOKENIZE_ADD_SPECIAL, &r->prompt, &r->n_prompt);
    }
    free(text);
    if (rc) return rc;
    tide_textgen_opts to = tide_textgen_opts_default();
    to.stops = a->text.stops;
    to.n_stops = a->text.n_stops;
    if (!a->json) to.emit = cli_print_piece, to.emit_user = stdout;
    if (cli_stop_ids(r->tok, r->tmpl, &r->stop_ids, &r->n_stop_ids)) return 1;
    if (tide_textgen_new(r->ctx, r->tok, &to, &r->out)) return cli_fail(r->ctx, "--stop");
    return 0;
}

/* The backend, the checkpoint (the built-in one when no --model), the prompt
 * and the model. Returns 0 or the exit status. */
static int open_model(run_job *r) {
    run_args *a = &r->a;
    r->model_dir = a->model_dir;
    int rc;
    if (tide_backend_new(r->ctx, a->backend, &r->be)) return cli_fail(r->ctx, "backend");
    if (tide_backend_set_matmul(r->be, a->matmul)) return cli_fail(r->ctx, "--matmul");
    r->host_device = !strcmp(tide_backend_name(r->be), "cpu");
    if (r->demo && r->host_device) {
        /* where device memory is host memory, offloading means the SSD tier */
        a->weights_on_ssd = r->off.weights_on_ssd = true;
    }
    if (!r->model_dir) {
        if ((rc = cli_ensure_default_model(r->ctx, r->dir, sizeof r->dir, &r->ps))) return rc;
        r->model_dir = r->dir;
    }
    if (tide_checkpoint_open(r->ctx, r->model_dir, &r->ck)) return cli_fail(r->ctx, "loading the model");
    if (a->lora && tide_checkpoint_add_lora(r->ck, a->lora)) return cli_fail(r->ctx, "--lora");
    /* weights homed in memory: read them in now, so no run is timed on faults */
    if (!a->weights_on_ssd && tide_checkpoint_prefetch(r->ck)) return cli_fail(r->ctx, "loading the model");
    cli_progress_end(&r->ps);
    const tide_llama_config *cfg = tide_checkpoint_config(r->ck);
    if (r->text_mode && (rc = text_prompt(r, cfg))) return rc;
    if (!r->prompt) {
        r->n_prompt = (int)a->prompt_len;
        if (!(r->prompt = malloc((size_t)r->n_prompt * sizeof *r->prompt))) return 1;
        /* a fixed pseudo-random prompt: the same ids on every run */
        for (int i = 0; i < r->n_prompt; i++)
            r->prompt[i] = (int32_t)((1u + (uint32_t)i * 2654435761u) % (uint32_t)cfg->vocab_size);
    }
    int ctx_len = r->n_prompt + (int)(a->new_tokens > 0 ? a->new_tokens - 1 : 0);
    if (ctx_len > cfg->max_position_embeddings) {
        fprintf(stderr, "tide: run: %d prompt + %ld new tokens exceed the model's %d positions\n", r->n_prompt,
                a->new_tokens, cfg->max_position_embeddings);
        return 1;
    }
    if (r->text_mode || cli_text_sampling_given(&a->text)) {
        /* text is drawn from the tokenizer's ids only (a model's embedding may
         * have more rows than the tokenizer has ids); greedy stays greedy */
        if (a->text.so.temperature > 0 && !a->text.seed_given) a->text.so.seed = cli_random_seed();
        int32_t nv = r->tok ? tide_tokenizer_n_vocab(r->tok) : cfg->vocab_size;
        if (tide_sampler_new(r->ctx, &a->text.so, nv, &r->sampler)) return cli_fail(r->ctx, "sampling options");
    }
    const char *sync = getenv("TIDE_EXEC_SYNC"); /* read here, at the edge */
    tide_model_opts mo = {.max_batch = 1, .ctx_len = ctx_len, .sync_issue = sync && *sync && strcmp(sync, "0"),
                          .cache_dtype = a->cache_type};
    if (tide_model_new(r->ctx, r->ck, r->be, &mo, &r->m)) return cli_fail(r->ctx, "preparing the model");
    r->gen = calloc((size_t)(a->new_tokens ? a->new_tokens : 1), sizeof *r->gen);
    r->gen_ref = calloc((size_t)(a->new_tokens ? a->new_tokens : 1), sizeof *r->gen_ref);
    return r->gen && r->gen_ref ? 0 : 1;
}

/* Starts measuring the resident memory of the run about to begin: what
 * the allocator holds of memory freed before (the machine probe's buffers)
 * goes back to the system first, so it is not counted as the run's. */
static void rss_begin(rss_measure *m) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    m->exact = cli_rss_reset_peak();
    m->before = cli_rss_now();
}

static void rss_end(rss_measure *m) { m->peak = cli_rss_peak(); }

/* One generation of the prompt into out (n_out ids): through the sampler
 * when there is one (reset to the seed, the prompt accepted first), the
 * text printed as it comes when `print`. */
static tide_status generate(run_job *r, int32_t *out, int *n_out, tide_gen_stats *st, bool print) {
    const run_args *a = &r->a;
    tide_gen_opts go = {.sampler = r->sampler, .stop_ids = r->stop_ids, .n_stop_ids = r->n_stop_ids};
    if (r->sampler && tide_sampler_start(r->sampler, a->text.so.seed, r->prompt, r->n_prompt)) return TIDE_E_RANGE;
    if (r->text_mode) {
        bool shown = print && !a->json;
        tide_textgen_set_emit(r->out, shown ? cli_print_piece : NULL, shown ? stdout : NULL);
        /* per-token progress lines would break the text printed */
        if (shown) tide_ctx_set_progress(r->ctx, NULL, NULL);
        tide_status s = tide_textgen_generate(r->out, r->m, r->prompt, r->n_prompt, (int)a->new_tokens, &go, out,
                                              n_out, st);
        tide_ctx_set_progress(r->ctx, cli_progress, &r->ps);
        return s;
    }
    return tide_model_generate_ex(r->m, r->prompt, r->n_prompt, (int)a->new_tokens, &go, out, n_out, st);
}

/* With --check: the same generation on the plain reference engine (an
 * unconstrained run). Returns 0 or the exit status. */
static int reference_run(run_job *r) {
    const run_args *a = &r->a;
    if (!a->check) return 0;
    if (!a->quiet && !a->json) fprintf(stderr, "tide: plain reference run (for --check)\n");
    /* the reference holds the weights in memory: read them in first, so it
     * is not timed on page faults (they were left on SSD for this run) */
    if (a->weights_on_ssd && tide_checkpoint_prefetch(r->ck)) return cli_fail(r->ctx, "loading the model");
    cli_progress_end(&r->ps);
    if (tide_model_set_offload(r->m, NULL) || tide_model_set_engine(r->m, TIDE_ENGINE_PLAIN))
        return cli_fail(r->ctx, "reference run");
    rss_begin(&r->ref_rss);
    tide_status st = generate(r, r->gen_ref, &r->n_gen_ref, &r->ref, false);
    rss_end(&r->ref_rss);
    cli_progress_end(&r->ps);
    if (st) return cli_fail(r->ctx, "reference run");
    r->have_ref = true;
    return tide_model_set_engine(r->m, TIDE_ENGINE_PLANNED) ? cli_fail(r->ctx, "engine") : 0;
}

/* The run itself (offloaded when a budget was given), then the comparison
 * with the reference. Returns 0 or the exit status. */
static int main_run(run_job *r) {
    const run_args *a = &r->a;
    if (tide_model_set_engine(r->m, a->engine)) return cli_fail(r->ctx, "engine");
    if (r->offload) {
        if (!a->quiet && !a->json) fprintf(stderr, "tide: offloaded run (policy %s)\n", a->policy);
        if (!a->quiet && !a->json && r->host_device && !a->weights_on_ssd && !strcmp(a->policy, "tide"))
            fprintf(stderr, "tide: note: on the CPU the weights homed in host memory are used in place: the budget "
                    "bounds what the run adds to them; --weights-on-ssd streams them from SSD instead\n");
        if (tide_model_set_offload(r->m, &r->off)) return cli_fail(r->ctx, "offloading");
    }
    rss_begin(&r->rss);
    tide_status st = generate(r, r->gen, &r->n_gen, &r->stats, true);
    if (!st && r->text_mode)
        r->stop_reason = tide_textgen_stopped(r->out) ? "stop" : r->n_gen < a->new_tokens ? "eos" : "length";
    rss_end(&r->rss);
    cli_progress_end(&r->ps);
    if (!a->quiet && tide_model_notice(r->m)[0]) fprintf(stderr, "tide: note: %s\n", tide_model_notice(r->m));
    if (st) return cli_fail(r->ctx, "run");
    if ((a->trace || a->trace_svg) && tide_model_write_trace(r->m, a->trace, a->trace_svg))
        return cli_fail(r->ctx, "writing the trace");
    return 0;
}

/* Both runs, in the order that measures each one's memory: where device
 * memory is host memory (the CPU), this run first, since the reference maps
 * the weights in (they then stay in the process's resident memory); on a
 * device, the reference first, as its memory is not the host's. Then the
 * comparison (r->check_rc). Returns 0 or the exit status. */
static int both_runs(run_job *r) {
    int rc;
    if (!r->host_device && (rc = reference_run(r))) return rc;
    if ((rc = main_run(r))) return rc;
    if (r->host_device && (rc = reference_run(r))) return rc;
    if (r->have_ref) {
        /* 0: bit-identical; 2: a tiled graph's tokens are identical and its
         * logits differ only in f32 rounding (sgemm over fewer rows sums in
         * another order); 1: the outputs differ */
        bool same_tokens = r->n_gen == r->n_gen_ref && !memcmp(r->gen, r->gen_ref, (size_t)r->n_gen * sizeof *r->gen);
        r->check_rc = !same_tokens ? 1 : r->stats.logits_hash == r->ref.logits_hash ? 0 : r->stats.tile_level ? 2 : 1;
    }
    return 0;
}

/* The summary or the JSON; exit status 1 when --check failed. */
static int report(run_job *r) {
    const run_args *a = &r->a;
    if (a->json) {
        print_json(r);
    } else if (r->text_mode) {
        fputc('\n', stdout);
        fflush(stdout);
        if (!a->quiet) print_summary(r, stderr);
    } else {
        print_summary(r, stdout);
    }
    if (r->check_rc != 1) return 0;
    fprintf(stderr, "tide: run: --check failed: this run's %s differ from the plain reference run's\n",
            r->n_gen != r->n_gen_ref || memcmp(r->gen, r->gen_ref, (size_t)r->n_gen * sizeof *r->gen) ? "tokens"
                                                                                                   : "logits");
    return 1;
}

int cmd_run(int argc, char **argv) {
    run_job r;
    memset(&r, 0, sizeof r);
    int rc = parse_args(argc, argv, &r);
    if (rc >= 0) {
        free(r.prompt);
        return rc;
    }
    if (!(r.ctx = tide_ctx_new())) return 1;
    tide_ctx_set_threads(r.ctx, (int)r.a.threads);
    cli_progress_init(&r.ps, r.a.quiet);
    tide_ctx_set_progress(r.ctx, cli_progress, &r.ps);
    if (!(rc = open_model(&r)) && !(rc = both_runs(&r))) rc = report(&r);
    tide_model_free(r.m);
    tide_sampler_free(r.sampler);
    tide_textgen_free(r.out);
    tide_chat_template_free(r.tmpl);
    tide_tokenizer_free(r.tok);
    free(r.stop_ids);
    tide_backend_free(r.be);
    tide_checkpoint_free(r.ck);
    tide_ctx_free(r.ctx);
    free(r.prompt);
    free(r.gen);
    free(r.gen_ref);
    return rc;
}
