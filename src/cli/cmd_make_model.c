/*
 * cmd_make_model.c - `tide make-model`: a deterministic synthetic checkpoint in
 * Hugging Face layout, for demos, tests and benchmarks.
 */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static const char help[] =
    "Usage: tide make-model --config NAME|FILE [--seed S] [--dtype bf16|f16|f32]\n"
    "                       [--shard-size BYTES] [--layers N] DIR\n"
    "\n"
    "Writes DIR/config.json and DIR/model.safetensors (or shards with\n"
    "model.safetensors.index.json) with weights drawn from a seeded generator:\n"
    "the same seed gives the same bytes on every machine. Files are written under\n"
    "temporary names and renamed when complete.\n"
    "\n"
    "  --config NAME|FILE  a built-in configuration (tinyllama-1.1b, llama-7b,\n"
    "                      llama-13b, llama-65b, llama-2-70b,\n"
    "                      llama-3.1-405b) or a config.json path\n"
    "  --seed S            generator seed (default 0)\n"
    "  --dtype D           storage dtype of the weights (default: the config's)\n"
    "  --shard-size BYTES  split into shards of at most this size (e.g. 2G)\n"
    "  --layers N          keep only the first N decoder layers (smaller models)\n";

int cmd_make_model(int argc, char **argv) {
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"seed", required_argument, 0, 's'},
        {"dtype", required_argument, 0, 'd'},  {"shard-size", required_argument, 0, 'S'},
        {"layers", required_argument, 0, 'L'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *config = NULL, *dtype = NULL;
    long seed = 0, layers = 0;
    uint64_t shard = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case 'd': dtype = optarg; break;
        case 's':
            if (cli_parse_int(optarg, 0, 0x7fffffffL, &seed)) return cli_usage_error("make-model", "bad --seed '%s'", optarg);
            break;
        case 'S':
            if (cli_parse_bytes(optarg, &shard)) return cli_usage_error("make-model", "bad --shard-size '%s'", optarg);
            break;
        case 'L':
            if (cli_parse_int(optarg, 1, 1000, &layers)) return cli_usage_error("make-model", "bad --layers '%s'", optarg);
            break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("make-model", "unknown option");
        }
    }
    if (!config) return cli_usage_error("make-model", "--config is required");
    if (optind != argc - 1) return cli_usage_error("make-model", "one output directory is required");
    const char *dir = argv[optind];

    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) return 1;
    cli_progress_state ps;
    cli_progress_init(&ps, false);
    tide_ctx_set_progress(ctx, cli_progress, &ps);
    int rc = 0;
    tide_llama_config cfg;
    tide_status st = strchr(config, '/') || strstr(config, ".json")
                         ? tide_llama_config_load(ctx, config, &cfg)
                         : tide_llama_config_named(ctx, config, &cfg);
    if (st) {
        rc = cli_fail(ctx, "config");
        goto out;
    }
    if (dtype) {
        tide_dtype dt;
        if (tide_dtype_parse(dtype, &dt) || dt == TIDE_I32 || tide_dtype_is_quantized(dt)) {
            rc = cli_usage_error("make-model", "bad --dtype '%s' (bf16, f16 or f32)", dtype);
            goto out;
        }
        cfg.dtype = dt;
    }
    if (layers) cfg.num_hidden_layers = (int)layers;
    st = tide_checkpoint_make_synthetic(ctx, &cfg, (uint64_t)seed, shard, dir);
    cli_progress_end(&ps);
    if (st) {
        rc = cli_fail(ctx, "make-model");
        goto out;
    }
    char b[32];
    printf("wrote %s: %s, %d layers, %s weights, %llu parameters (%s)\n", dir, cfg.name,
           cfg.num_hidden_layers, tide_dtype_name(cfg.dtype),
           (unsigned long long)tide_llama_config_params(&cfg),
           cli_fmt_bytes(tide_llama_config_params(&cfg) * tide_dtype_size(cfg.dtype), b, sizeof b));
out:
    tide_ctx_free(ctx);
    return rc;
}
