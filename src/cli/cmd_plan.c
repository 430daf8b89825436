/*
 * cmd_plan.c - `tide plan`: plan a model's run under a device memory budget,
 * verify the plan, and predict its timeline on a hardware profile.
 */
#include "cli.h"
#include "plan_int.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char help[] =
    "Usage: tide plan (--model PATH | --config NAME) [--dtype T] [--batch B] [--seq S]\n"
    "                 [--decode N]\n"    "                 [--train [--accum N] [--optimizer auto|device|cpu]]\n"
    "                 [--ranks N [--zero 0|1|2]]\n"
    "                 --budget BYTES|PCT%|min [--hw PROFILE] [--policy P]\n"
    "                 [--host-budget BYTES] [--weights-on-ssd] [--tile auto|none|LEVEL]\n"
    "                 [--host-compute auto|off]\n"
    "                 [--train --lora-r R [--lora-targets LIST] [--base-type T]]\n"
    "                 [--train --precision f32|bf16]\n"
    "                 [--lora DIR]\n"
    "                 [--json] [--trace FILE] [--out PLAN.json]\n"
    "\n"
    "Plans every tensor move of a LLaMA-style model's forward pass under a device\n"
    "memory budget, checks the plan with the independent verifier, and predicts its\n"
    "timeline on a hardware profile. Needs shapes only, no weights.\n"
    "\n"
    "  --model PATH       read the configuration from PATH/config.json, or from\n"
    "                     the metadata of the GGUF file PATH\n"
    "  --config NAME      a built-in configuration: tinyllama-1.1b, llama-7b,\n"
    "                     llama-13b, llama-65b, llama-2-70b, llama-3.1-405b\n"
    "  --dtype T          plan the weights stored as T instead of the configuration's\n"
    "                     type: f32, f16, bf16, or a block type q8_0, q4_0, q4_k,\n"
    "                     q5_k, q6_k (every weight of that type, the norms f32),\n"
    "                     or llama.cpp's mix q4_k_m or q5_k_m (per-weight types as\n"
    "                     its quantizer stores them: the head and some attn_v and\n"
    "                     ffn_down in q6_k)\n"
    "  --cache-type T     the KV cache's type: f32 (default), f16, bf16 or q8_0;\n"
    "                     the cache is planned and moved at that type's bytes\n"
    "  --batch B          sequences processed together (default 1)\n"
    "  --seq S            prompt tokens (default 2048)\n"
    "  --decode N         plan N one-token decode steps after an S-token prompt\n"
    "                     (N iterations of the decode graph) instead of the prefill\n"
    "  --train            plan a training step instead: --accum micro-batches of\n"
    "                     --batch x --seq tokens, forward keeping activations,\n"
    "                     backward, gradient clipping and AdamW (f32 master weights\n"
    "                     and moments). Two steps are planned as a steady state;\n"
    "                     the table gives one step's bytes per link, its predicted\n"
    "                     time against the ideal (every parameter, master weight\n"
    "                     and moment resident, no limit), and the memory of the\n"
    "                     weights, master weights, moments, gradients and\n"
    "                     activations\n"
    "  --accum N          micro-batches per training step (default 1)\n"
    "  --precision P      training: the step's arithmetic, f32 (default) or bf16\n"
    "                     (tide train --precision bf16: bf16 products, the kept\n"
    "                     activations planned at bf16's 2 bytes, the residual\n"
    "                     stream, gradients and optimizer state f32)\n"
    "  --lora-r R         training: a LoRA step of rank R (tide train --lora-r):\n"
    "                     the base weights frozen, read-only like inference\n"
    "                     weights; state, gradients and AdamW the adapters' only\n"
    "  --lora-targets L   with --lora-r: q,k,v,o,gate,up,down (default all)\n"
    "  --lora DIR         inference with the PEFT LoRA adapter in DIR (its\n"
    "                     adapter_config.json's r and targets; the adapter's\n"
    "                     weights planned as f32), as tide run --lora runs it\n"
    "  --base-type T      with --lora-r: QLoRA, the seven projections of every\n"
    "                     layer in q8_0, q4_0, q4_k, q5_k or q6_k (tide train\n"
    "                     --base-type); a quantized --model is QLoRA as stored\n"
    "  --optimizer WHERE  training: where each AdamW update runs: auto (default:\n"
    "                     on the device or on the host CPU, whichever the plan\n"
    "                     predicts faster, split per parameter), device, or cpu\n"
    "  --ranks N          training: plan one of N data-parallel ranks (2-65536), each\n"
    "                     running --accum micro-batches of its own; its gradients'\n"
    "                     collectives run on the network stream, overlapping the\n"
    "                     backward (one parameter's gradient a bucket), priced by\n"
    "                     the profile's network (a multi-GPU profile such as\n"
    "                     8x-h100-80g-nvlink); the ideal is then perfect scaling\n"
    "                     (unlimited memory, free network). `mpirun -np N tide\n"
    "                     train` runs such ranks on the CPU backend\n"
    "  --zero S           with --ranks: 0 every rank a full copy (gradients\n"
    "                     all-reduced), 1 (default) master weights and moments\n"
    "                     sharded 1/N (gradients reduce-scattered after the\n"
    "                     backward, updated parameters all-gathered), 2 also\n"
    "                     gradients sharded (each reduce-scattered as the\n"
    "                     backward writes it, each micro-batch's summed into\n"
    "                     the shard)\n"
    "  --budget X         device arena: bytes (e.g. 20G), a percentage of the\n"
    "                     unconstrained peak capped at the profile's memory (25%),\n"
    "                     or min (the smallest budget the policy can plan)\n"
    "  --hw PROFILE       p100-16g, v100-32g, a100-80g, h100-80g (default),\n"
    "                     h200-141g, l4-24g, a10-24g, rtx-3090-24g, rtx-4090-24g\n"
    "                     (the last five: datasheet figures until probed), for\n"
    "                     --ranks 8x-h100-80g-nvlink (one node) or\n"
    "                     h100-80g-ndr-cluster (nodes of 8 on InfiniBand), or a\n"
    "                     profile JSON path (see tide probe)\n"
    "  --policy P         tide (default), static-layer (whole layers resident, the\n"
    "                     rest streamed with double buffering) or lru (load on\n"
    "                     demand, least recently used evicted); with --train also\n"
    "                     checkpoint-layer (each layer's input kept, its other\n"
    "                     activations dropped after the forward and recomputed\n"
    "                     before its backward; the rest as lru) and zero-offload\n"
    "                     (every AdamW update on the host CPU, each gradient\n"
    "                     stored to host after its layer's backward, activations\n"
    "                     as checkpoint-layer, the rest as lru)\n"
    "  --host-budget X    host memory for weights homed on host and spills\n"
    "                     (default: the profile's host memory)\n"
    "  --weights-on-ssd   home the weights on SSD instead of host memory\n"
    "  --host-compute M   inference, policy tide: auto (default) runs a MATMUL whose\n"
    "                     weight lives in host memory on the host CPU instead of\n"
    "                     bringing the weight over the link (its activations cross\n"
    "                     instead), op by op where the plan is predicted faster\n"
    "                     (the profile's host_mem_bw and host_flops against the\n"
    "                     link); off keeps every op on the device. tide run does\n"
    "                     not place ops on the host\n"
    "  --tile T           split ops into tiles when the budget is below the largest\n"
    "                     op's working set: auto (default: the coarsest tiling that\n"
    "                     fits; with --budget min the one with the smallest minimum),\n"
    "                     none, or a level 1-6 (level k: tiles of seq/2^(k-1) tokens\n"
    "                     of one sequence, weights cut into blocks of 64 MiB/2^(k-1));\n"
    "                     with --train: row tiles of batch/2^k whole sequences\n"
    "                     down to one, then tiles of one sequence with the\n"
    "                     embedding and the head in 2, 4, 8, ... vocabulary blocks\n"
    "                     (auto, for --policy tide only: from the coarsest that\n"
    "                     fits, finer ones while each is predicted faster)\n"
    "  --json             print one JSON object\n"
    "  --trace FILE       write the predicted timeline as Perfetto trace JSON\n"
    "  --out FILE         write the plan as JSON\n";


/* What the chosen tiling is, in words. */
static void tile_words(const tide_graph *g, int level, long seq, char *buf, size_t n) {
    tide_llama_graph_opts o = {.seq = (int)seq};
    if (!level || !tide_llama_tile_level(&o, level)) {
        snprintf(buf, n, "none");
        return;
    }
    char w[32];
    snprintf(buf, n, "level %d (tiles of <= %d tokens of one sequence, weight blocks <= %s; %d ops)", level,
             o.tile_rows, cli_fmt_bytes(o.tile_weight_bytes, w, sizeof w), tide_graph_n_ops(g));
}

/* The KV cache's bytes: k and v of every layer, batch x (seq + decode)
 * positions at the cache's type. */
static uint64_t cache_bytes(const plan_args *a, const tide_llama_config *cfg) {
    const uint64_t kd = (uint64_t)cfg->num_key_value_heads * (uint64_t)(cfg->hidden_size / cfg->num_attention_heads);
    return 2 * (uint64_t)cfg->num_hidden_layers * (uint64_t)a->batch * (uint64_t)(a->seq + a->decode) *
           tide_dtype_bytes(a->cache_type, kd);
}

static void print_human(const plan_args *a, const tide_llama_config *cfg, const tide_hw_info *hw,
                        const tide_plan_info *s, int n_ops, uint64_t peak, const tide_bounds *b,
                        const char *budget_note, const char *tiling, uint64_t weight_bytes) {
    char b1[32], b2[32], b3[32], b4[32];
    printf("plan        %s %s, batch %ld, %s %ld, policy %s, hw %s\n", cfg->name,
           a->decode ? "decode" : "prefill", a->batch, a->decode ? "steps" : "seq",
           a->decode ? a->decode : a->seq, tide_policy_name(s->policy), hw->name);
    if (hw->source[0]) printf("hw source   %s%s\n", hw->source,
                              !strcmp(hw->source, "datasheet") ? " (figures not measured: run tide probe)" : "");
    printf("weights     %s, %s\n", cfg->wtypes_set ? "mixed types" : tide_dtype_name(cfg->dtype),
           cli_fmt_bytes(weight_bytes, b1, sizeof b1));
    printf("kv cache    %s, %s\n", tide_dtype_name(a->cache_type),
           cli_fmt_bytes(cache_bytes(a, cfg), b1, sizeof b1));
    printf("verified    yes (%d instructions, %d ops x %d iterations)\n", s->n_instructions, n_ops, s->n_iter);
    printf("tiling      %s\n", tiling);
    printf("budget      %s %s; unconstrained peak %s\n", cli_fmt_bytes(s->device_budget, b1, sizeof b1),
           budget_note, cli_fmt_bytes(peak, b2, sizeof b2));
    printf("\n%-22s %14s\n", "", "value");
    printf("%-22s %14s\n", "peak device", cli_fmt_bytes(s->peak_device_bytes, b1, sizeof b1));
    printf("%-22s %14s\n", "peak host spill", cli_fmt_bytes(s->peak_host_bytes, b1, sizeof b1));
    printf("%-22s %14s\n", "peak ssd spill", cli_fmt_bytes(s->peak_ssd_bytes, b1, sizeof b1));
    printf("%-22s %14s\n", "bytes host->device", cli_fmt_bytes(s->bytes_h2d, b1, sizeof b1));
    printf("%-22s %14s\n", "bytes device->host", cli_fmt_bytes(s->bytes_d2h, b2, sizeof b2));
    printf("%-22s %14s\n", "bytes ssd read", cli_fmt_bytes(s->bytes_ssd_read, b3, sizeof b3));
    if (s->host_computes)
        printf("%-22s %14d  (reading %s of weights in host memory)\n", "host computes / iter", s->host_computes,
               cli_fmt_bytes(s->host_compute_weight_bytes, b4, sizeof b4));
    printf("%-22s %14s\n", "bytes ssd write", cli_fmt_bytes(s->bytes_ssd_write, b4, sizeof b4));
    printf("%-22s %13.4fs\n", "predicted makespan", s->makespan_s);
    printf("%-22s %13.4fs  (%.1f%% of ideal)\n", "ideal (no limit)", b->ideal_s,
           s->makespan_s > 0 ? 100.0 * b->ideal_s / s->makespan_s : 0);
    printf("%-22s %13.4fs  (%.3fx of lower bound)\n", "lower bound", b->lower_bound_s,
           b->lower_bound_s > 0 ? s->makespan_s / b->lower_bound_s : 0);
    printf("%-22s %13.4fs\n", "planning time", s->plan_seconds);
}

static void print_json(const plan_args *a, const tide_llama_config *cfg, const tide_hw_info *hw,
                       const tide_plan_info *s, int n_ops, uint64_t peak, const tide_bounds *b, int level,
                       uint64_t weight_bytes) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "feasible", 1);
    cJSON_AddBoolToObject(o, "verified", 1);
    cJSON_AddStringToObject(o, "config", cfg->name);
    cJSON_AddStringToObject(o, "workload", a->decode ? "decode" : "prefill");
    cJSON_AddStringToObject(o, "dtype", cfg->wtypes_set ? "mixed" : tide_dtype_name(cfg->dtype));
    cJSON_AddNumberToObject(o, "weight_bytes", (double)weight_bytes);
    cJSON_AddStringToObject(o, "cache_type", tide_dtype_name(a->cache_type));
    cJSON_AddNumberToObject(o, "cache_bytes", (double)cache_bytes(a, cfg));
    cJSON_AddNumberToObject(o, "batch", (double)a->batch);
    cJSON_AddNumberToObject(o, "seq", (double)a->seq);
    cJSON_AddNumberToObject(o, "decode_steps", (double)a->decode);
    cJSON_AddStringToObject(o, "hw", hw->name);
    cJSON_AddStringToObject(o, "hw_source", hw->source);
    cJSON_AddStringToObject(o, "policy", tide_policy_name(s->policy));
    cJSON_AddNumberToObject(o, "budget_bytes", (double)s->device_budget);
    cJSON_AddNumberToObject(o, "unconstrained_peak_bytes", (double)peak);
    cJSON_AddNumberToObject(o, "peak_device_bytes", (double)s->peak_device_bytes);
    cJSON_AddNumberToObject(o, "peak_host_spill_bytes", (double)s->peak_host_bytes);
    cJSON_AddNumberToObject(o, "peak_ssd_spill_bytes", (double)s->peak_ssd_bytes);
    cJSON_AddNumberToObject(o, "bytes_h2d", (double)s->bytes_h2d);
    cJSON_AddNumberToObject(o, "bytes_d2h", (double)s->bytes_d2h);
    cJSON_AddNumberToObject(o, "bytes_ssd_read", (double)s->bytes_ssd_read);
    cJSON_AddNumberToObject(o, "bytes_ssd_write", (double)s->bytes_ssd_write);
    cJSON_AddNumberToObject(o, "n_instructions", s->n_instructions);
    cJSON_AddNumberToObject(o, "host_computes", s->host_computes);
    cJSON_AddNumberToObject(o, "host_compute_weight_bytes", (double)s->host_compute_weight_bytes);
    cJSON_AddNumberToObject(o, "n_ops", n_ops);
    cJSON_AddNumberToObject(o, "tile_level", level);
    cJSON_AddNumberToObject(o, "makespan_s", s->makespan_s);
    cJSON_AddNumberToObject(o, "compute_s", s->compute_s);
    cJSON_AddNumberToObject(o, "ideal_s", b->ideal_s);
    cJSON_AddNumberToObject(o, "lower_bound_s", b->lower_bound_s);
    cJSON_AddNumberToObject(o, "x_lower_bound", b->lower_bound_s > 0 ? s->makespan_s / b->lower_bound_s : 0);
    cJSON_AddNumberToObject(o, "pct_of_ideal", s->makespan_s > 0 ? 100.0 * b->ideal_s / s->makespan_s : 0);
    cJSON_AddNumberToObject(o, "plan_seconds", s->plan_seconds);
    char *js = cJSON_PrintUnformatted(o);
    if (js) puts(js);
    free(js);
    cJSON_Delete(o);
}

static const struct option plan_options[] = {
    {"model", required_argument, 0, 'm'},  {"config", required_argument, 0, 'c'},
    {"batch", required_argument, 0, 'B'},  {"seq", required_argument, 0, 'S'},
    {"decode", required_argument, 0, 'D'}, {"budget", required_argument, 0, 'b'},
    {"hw", required_argument, 0, 'w'},     {"policy", required_argument, 0, 'p'},
    {"host-budget", required_argument, 0, 'H'}, {"weights-on-ssd", no_argument, 0, 's'},
    {"json", no_argument, 0, 'j'},         {"trace", required_argument, 0, 't'},
    {"out", required_argument, 0, 'o'},    {"help", no_argument, 0, 'h'},
    {"tile", required_argument, 0, 'T'},   {"train", no_argument, 0, 'r'},
    {"accum", required_argument, 0, 'A'},  {"optimizer", required_argument, 0, 'O'},
    {"dtype", required_argument, 0, 'd'},  {"host-compute", required_argument, 0, 'C'},
    {"lora-r", required_argument, 0, 0x100}, {"lora-targets", required_argument, 0, 0x101},
    {"base-type", required_argument, 0, 0x310}, {"precision", required_argument, 0, 0x440},
    {"ranks", required_argument, 0, 'R'},  {"zero", required_argument, 0, 'Z'},
    {"cache-type", required_argument, 0, CLI_OPT_CACHE_TYPE}, {"lora", required_argument, 0, CLI_OPT_LORA},
    {0, 0, 0, 0},
};

/* Whether --dtype names one of llama.cpp's mixes (tide_quant_mix_apply). */
static bool is_mix(const char *s) { return !strcasecmp(s, "q4_k_m") || !strcasecmp(s, "q5_k_m"); }

/* Parses argv into *a. Returns -1 to go on, else the exit status (0 after
 * --help, 2 on a usage error). */
static int parse_args(int argc, char **argv, plan_args *a) {
    *a = (plan_args){.hw_name = "h100-80g", .batch = 1, .seq = 2048, .accum = 1, .policy = TIDE_POLICY_TIDE,
                     .ranks = 1, .zero = 1};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", plan_options, NULL)) != -1) {
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'c': a->config = optarg; break;
        case 'B':
            if (cli_parse_int(optarg, 1, 1 << 16, &a->batch)) return cli_usage_error("plan", "bad --batch '%s'", optarg);
            break;
        case 'S':
            if (cli_parse_int(optarg, 1, 1 << 22, &a->seq)) return cli_usage_error("plan", "bad --seq '%s'", optarg);
            break;
        case 'D':
            if (cli_parse_int(optarg, 1, 1 << 20, &a->decode)) return cli_usage_error("plan", "bad --decode '%s'", optarg);
            break;
        case 'b': a->budget = optarg; break;
        case 'w': a->hw_name = optarg; break;
        case 'p':
            if (tide_policy_parse(optarg, &a->policy))
                return cli_usage_error("plan", "unknown --policy '%s' (tide, static-layer, lru, "
                                       "checkpoint-layer or zero-offload)", optarg);
            break;
        case 'H':
            if (cli_parse_bytes(optarg, &a->host_budget) || !a->host_budget)
                return cli_usage_error("plan", "bad --host-budget '%s'", optarg);
            break;
        case 's': a->weights_on_ssd = true; break;
        case 'j': a->json = true; break;
        case 't': a->trace = optarg; break;
        case 'o': a->out = optarg; break;
        case 'T':
            if (tide_tile_parse(NULL, optarg, &a->tile))
                return cli_usage_error("plan", "bad --tile '%s' (auto, none or a level 1 to %d)", optarg,
                                       TIDE_TILE_LEVELS - 1);
            break;
        case 'r': a->train = true; break;
        case CLI_OPT_LORA: a->lora = optarg; break;
        case CLI_OPT_CACHE_TYPE:
            if (cli_parse_cache_type(optarg, &a->cache_type)) return cli_usage_error("plan", CLI_CACHE_TYPE_ERROR, optarg);
            a->have_cache_type = true;
            break;
        case 'C':
            if (strcmp(optarg, "auto") && strcmp(optarg, "off"))
                return cli_usage_error("plan", "bad --host-compute '%s' (auto or off)", optarg);
            a->host_compute_off = !strcmp(optarg, "off");
            break;
        case 'd': {
            tide_dtype dt;
            if (!is_mix(optarg) && (tide_dtype_parse(optarg, &dt) || dt == TIDE_I32))
                return cli_usage_error("plan", "unknown --dtype '%s' (f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, "
                                       "q6_k, q4_k_m or q5_k_m)", optarg);
            a->dtype = optarg;
            break;
        }
        case 'A':
            if (cli_parse_int(optarg, 1, 4096, &a->accum)) return cli_usage_error("plan", "bad --accum '%s'", optarg);
            a->have_accum = true;
            break;
        case 'O':
            if (tide_optim_mode_parse(NULL, optarg, &a->optim))
                return cli_usage_error("plan", "unknown --optimizer '%s' (auto, device or cpu)", optarg);
            a->have_optim = true;
            break;
        case 0x100:
            if (cli_parse_int(optarg, 1, 65536, &a->lora_r))
                return cli_usage_error("plan", "bad --lora-r '%s' (a rank from 1)", optarg);
            break;
        case 0x101: {
            tide_ctx *ctx = tide_ctx_new();
            if (!ctx) return 1;
            if (tide_lora_parse_targets(ctx, optarg, &a->lora_targets)) {
                int rc = cli_usage_error("plan", "%s", tide_ctx_last_error(ctx));
                tide_ctx_free(ctx);
                return rc;
            }
            tide_ctx_free(ctx);
            break;
        }
        case 0x310: a->base_type = optarg; break; /* checked by tide_qlora_config */
        case 0x440:
            if (tide_train_precision_parse(NULL, optarg, &a->precision) || a->precision == TIDE_PRECISION_AUTO)
                return cli_usage_error("plan", "unknown --precision '%s' (f32 or bf16)", optarg);
            a->have_precision = true;
            break;
        case 'R':
            if (cli_parse_int(optarg, 1, 65536, &a->ranks))
                return cli_usage_error("plan", "bad --ranks '%s' (an integer from 1 to 65536)", optarg);
            break;
        case 'Z':
            if (cli_parse_int(optarg, 0, 2, &a->zero))
                return cli_usage_error("plan", "bad --zero '%s' (0, 1 or 2)", optarg);
            a->have_zero = true;
            break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("plan", "unknown option");
        }
    }
    if (optind != argc) return cli_usage_error("plan", "unexpected argument '%s'", argv[optind]);
    if (!a->model == !a->config) return cli_usage_error("plan", "give exactly one of --model and --config");
    if (!a->budget) return cli_usage_error("plan", "--budget is required (bytes, a percentage or min)");
    if (a->train && a->dtype)
        return cli_usage_error("plan", "--dtype plans inference: a training step keeps the checkpoint's weights");
    if (a->train && (a->decode || a->weights_on_ssd))
        return cli_usage_error("plan", "--train plans a training step: no --decode or --weights-on-ssd");
    if ((a->lora_r || a->lora_targets) && !a->train)
        return cli_usage_error("plan", "--lora-r and --lora-targets plan a LoRA training step: they need --train");
    if (a->lora_targets && !a->lora_r) return cli_usage_error("plan", "--lora-targets needs --lora-r");
    if (a->lora && a->train)
        return cli_usage_error("plan", "--lora plans inference with an adapter: a LoRA training step is --lora-r");
    if (a->base_type && !a->lora_r) return cli_usage_error("plan", "--base-type plans QLoRA: it needs --lora-r");
    if (a->have_precision && !a->train)
        return cli_usage_error("plan", "--precision is a training step's arithmetic: it needs --train");
    if (a->ranks > 1 && !a->train) return cli_usage_error("plan", "--ranks plans data-parallel training: it needs --train");
    if (a->have_zero && a->ranks < 2) return cli_usage_error("plan", "--zero needs --ranks 2 or more");
    if (a->train && a->have_cache_type)
        return cli_usage_error("plan", "--cache-type plans inference: a training step has no KV cache");
    if ((a->have_accum || a->have_optim) && !a->train)
        return cli_usage_error("plan", "--accum and --optimizer need --train");
    if (a->policy == TIDE_POLICY_CHECKPOINT_LAYER && !a->train)
        return cli_usage_error("plan", "--policy checkpoint-layer recomputes a training step's activations: it "
                               "needs --train");
    if (a->policy == TIDE_POLICY_ZERO_OFFLOAD && !a->train)
        return cli_usage_error("plan", "--policy zero-offload runs a training step's AdamW updates on the host CPU: "
                               "it needs --train");
    if (a->policy == TIDE_POLICY_ZERO_OFFLOAD && a->have_optim && a->optim == TIDE_OPTIM_DEVICE)
        return cli_usage_error("plan", "--policy zero-offload runs every AdamW update on the host CPU: no "
                               "--optimizer device with it");
    if (a->optim == TIDE_OPTIM_CPU && a->policy != TIDE_POLICY_TIDE && a->policy != TIDE_POLICY_ZERO_OFFLOAD)
        return cli_usage_error("plan", "--optimizer cpu is planned by the tide policy only");
    return -1;
}

/* What one `tide plan` works on. */
typedef struct plan_job {
    tide_ctx *ctx;
    tide_llama_config cfg;
    tide_hw *hw;
    tide_hw_info hwi;
    tide_llama_graph_opts go;
    tide_planner_opts po;
    tide_graph *g;
    tide_plan *p;
    uint64_t peak;                /* unconstrained peak of the untiled graph */
    int level;                    /* tiling level of g */
    char note[96];                /* how the budget was chosen */
} plan_job;

/* The configuration, the profile and the untiled graph. Returns 0 or the
 * exit status. */
static int load_job(const plan_args *a, plan_job *j) {
    if (a->model ? cli_model_config(j->ctx, a->model, &j->cfg) : tide_llama_config_named(j->ctx, a->config, &j->cfg))
        return cli_fail(j->ctx, "config");
    if (a->dtype && is_mix(a->dtype)) {
        if (tide_quant_mix_apply(j->ctx, a->dtype, &j->cfg)) return cli_fail(j->ctx, "--dtype");
    } else if (a->dtype) { /* parsed by parse_args */
        tide_dtype dt = TIDE_F32;
        tide_dtype_parse(a->dtype, &dt);
        j->cfg.dtype = dt;
        j->cfg.wtypes_set = false; /* uniform: a block type keeps the norms f32 */
    }
    if (a->lora) {
        /* shapes only: the adapter's config (its weights planned as f32) */
        float alpha = 0;
        if (tide_lora_read_config(j->ctx, a->lora, &j->cfg.lora_r, &alpha, &j->cfg.lora_targets))
            return cli_fail(j->ctx, "--lora");
        j->cfg.lora_alpha = alpha;
        j->cfg.lora_dtype = TIDE_F32;
    }
    if (tide_hw_open(j->ctx, a->hw_name, &j->hw)) return cli_fail(j->ctx, "hardware profile");
    tide_hw_info_get(j->hw, &j->hwi);
    int n_iter = a->decode ? (int)a->decode : 1;
    j->go = (tide_llama_graph_opts){.batch = (int)a->batch, .seq = a->decode ? 1 : (int)a->seq,
                                    .ctx_len = (int)(a->seq + a->decode), .fresh_cache = !a->decode,
                                    .cache_dtype = a->cache_type};
    if (j->go.ctx_len > j->cfg.max_position_embeddings)
        fprintf(stderr, "tide plan: note: %d positions exceed the model's max_position_embeddings %d\n",
                j->go.ctx_len, j->cfg.max_position_embeddings);
    if (tide_llama_build(j->ctx, &j->cfg, &j->go, &j->g)) return cli_fail(j->ctx, "building the graph");
    j->po = tide_planner_opts_default();
    j->po.policy = a->policy;
    j->po.host_budget = a->host_budget;
    j->po.n_iter = n_iter;
    j->po.hw = j->hw;
    j->po.weights_on_ssd = a->weights_on_ssd;
    j->po.tile = a->tile;
    j->po.host_compute = a->host_compute_off ? TIDE_HOST_COMPUTE_OFF : TIDE_HOST_COMPUTE_AUTO;
    j->peak = tide_planner_peak(j->ctx, j->g, &j->po);
    return 0;
}

/* The budget of --budget: bytes, a percentage of the unconstrained peak, or
 * the minimum (which also fixes the tiling, *g then being its graph).
 * Returns 0 or the exit status. */
static int choose_budget(const plan_args *a, plan_job *j) {
    if (!strcmp(a->budget, "min")) {
        tide_graph *tg = NULL;
        if (tide_llama_min_budget(j->ctx, &j->cfg, &j->go, &j->po, &tg, &j->level, &j->po.device_budget))
            return cli_fail(j->ctx, "finding the minimum budget");
        tide_graph_free(j->g);
        j->g = tg;
        snprintf(j->note, sizeof j->note, "(the minimum for %s)", tide_policy_name(a->policy));
    } else if (a->budget[0] && a->budget[strlen(a->budget) - 1] == '%') {
        char *end;
        double pct = strtod(a->budget, &end);
        if (end == a->budget || *end != '%' || !(pct > 0 && pct <= 100))
            return cli_usage_error("plan", "bad --budget '%s' (a percentage in (0, 100])", a->budget);
        uint64_t base = j->peak < j->hwi.device_mem_bytes ? j->peak : j->hwi.device_mem_bytes;
        j->po.device_budget = (uint64_t)((double)base * pct / 100.0);
        snprintf(j->note, sizeof j->note, "(%g%% of %s)", pct,
                 j->peak > j->hwi.device_mem_bytes ? "the device memory" : "the unconstrained peak");
    } else if (cli_parse_bytes(a->budget, &j->po.device_budget) || !j->po.device_budget) {
        return cli_usage_error("plan", "bad --budget '%s' (bytes such as 20G, a percentage, or min)", a->budget);
    }
    if (j->po.device_budget > j->hwi.device_mem_bytes) {
        char b1[32], b2[32];
        fprintf(stderr, "tide: plan: budget %s is more than %s's device memory %s\n",
                cli_fmt_bytes(j->po.device_budget, b1, sizeof b1), j->hwi.name,
                cli_fmt_bytes(j->hwi.device_mem_bytes, b2, sizeof b2));
        return 1;
    }
    return 0;
}

/* Plans (the coarsest tiling that fits, unless the minimum fixed it) and
 * verifies. Returns 0 or the exit status. */
static int make_plan(const plan_args *a, plan_job *j) {
    bool is_min = !strcmp(a->budget, "min");
    tide_graph *tg = NULL;
    tide_status st = is_min ? tide_plan_new(j->ctx, j->g, &j->po, &j->p)
                            : tide_llama_plan(j->ctx, &j->cfg, &j->go, &j->po, &tg, &j->level, &j->p);
    if (st) {
        if (a->json && st == TIDE_E_INFEASIBLE)
            printf("{\"feasible\":false,\"policy\":\"%s\",\"budget_bytes\":%llu}\n", tide_policy_name(a->policy),
                   (unsigned long long)j->po.device_budget);
        return cli_fail(j->ctx, "planning");
    }
    if (tg) {
        tide_graph_free(j->g);
        j->g = tg;
    }
    if (tide_plan_verify(j->p)) return cli_fail(j->ctx, "the plan failed verification and was not used");
    return 0;
}

/* The bounds, the files asked for, and the report. Returns 0 or the exit status. */
static int report(const plan_args *a, plan_job *j) {
    tide_bounds bounds;
    if (tide_planner_bounds(j->ctx, j->g, &j->po, &bounds)) return cli_fail(j->ctx, "bounds");
    if (a->trace) {
        tide_timeline *tl = NULL;
        tide_status st = tide_plan_simulate(j->p, j->hw, &tl);
        if (!st) st = tide_plan_write_trace(j->p, tl, a->trace, NULL);
        tide_timeline_free(tl);
        if (st) return cli_fail(j->ctx, "writing the trace");
    }
    if (a->out && tide_plan_save_json(j->p, a->out)) return cli_fail(j->ctx, "writing the plan");
    char tiling[160];
    tile_words(j->g, j->level, j->go.seq, tiling, sizeof tiling);
    tide_plan_info s;
    tide_plan_info_get(j->p, &s);
    int n_ops = tide_graph_n_ops(j->g);
    uint64_t wb = tide_graph_role_bytes(j->g, TIDE_ROLE_WEIGHT);
    if (a->json) print_json(a, &j->cfg, &j->hwi, &s, n_ops, j->peak, &bounds, j->level, wb);
    else print_human(a, &j->cfg, &j->hwi, &s, n_ops, j->peak, &bounds, j->note, tiling, wb);
    return 0;
}

int cmd_plan(int argc, char **argv) {
    plan_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    if (a.train) return plan_train(&a);
    plan_job j = {.ctx = tide_ctx_new()};
    if (!j.ctx) return 1;
    if (!(rc = load_job(&a, &j)) && !(rc = choose_budget(&a, &j)) && !(rc = make_plan(&a, &j))) rc = report(&a, &j);
    tide_plan_free(j.p);
    tide_graph_free(j.g);
    tide_hw_free(j.hw);
    tide_ctx_free(j.ctx);
    return rc;
}
