/*
 * cmd_quantize.c - `tide quantize`: a Hugging Face-layout checkpoint to a
 * quantized GGUF file in one of llama.cpp's mixes (tide_quantize_checkpoint).
 */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char help[] =
    "Usage: tide quantize [--type TYPE] IN OUT.gguf\n"
    "\n"
    "Quantizes the model IN into OUT.gguf, a GGUF v3 file that llama.cpp and tide\n"
    "read: llama.cpp's tensor names and q/k row order, the llama metadata, and the\n"
    "tokenizer. IN is a model directory (config.json and model.safetensors or\n"
    "shards; f32, f16 or bf16 weights; the tokenizer from tokenizer.json with\n"
    "BOS/EOS and chat template from tokenizer_config.json) or a GGUF file (any\n"
    "type tide reads, dequantized first; its tokenizer metadata copied). Every\n"
    "weight is quantized by the reference quantizers (round to nearest per block,\n"
    "as llama.cpp's quantizer without an importance matrix); norms stay f32. The\n"
    "file is written under a temporary name and renamed when whole.\n"
    "\n"
    "  --type TYPE  Q8_0, Q4_0, Q4_K_M, Q5_K_M or Q6_K (default Q4_K_M), the mixes\n"
    "               of llama.cpp's quantizer: the output head in Q6_K (Q8_0 under\n"
    "               Q8_0); in Q4_K_M and Q5_K_M attn_v and ffn_down in Q6_K on\n"
    "               the first and last eighth of the layers and every third\n"
    "               between; rows that are not whole blocks of a type fall back\n"
    "               to Q8_0 (docs/quantization.md)\n"
    "\n"
    "Prints the tensors and bytes per type and the bits per weight.\n";

int cmd_quantize(int argc, char **argv) {
    static const struct option opts[] = {
        {"type", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *type = "Q4_K_M";
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't': type = optarg; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("quantize", "unknown option");
        }
    }
    if (optind != argc - 2) return cli_usage_error("quantize", "an input directory and an output file are required");
    const char *const *names = tide_quant_mix_names();
    bool known = false;
    for (int i = 0; names[i]; i++) known = known || !strcasecmp(names[i], type);
    if (!known) return cli_usage_error("quantize", "unknown --type '%s' (Q8_0, Q4_0, Q4_K_M, Q5_K_M or Q6_K)", type);
    const char *in = argv[optind], *out = argv[optind + 1];

    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) return 1;
    cli_progress_state ps;
    cli_progress_init(&ps, false);
    tide_ctx_set_progress(ctx, cli_progress, &ps);
    tide_quantize_stats st;
    tide_status s = tide_quantize_checkpoint(ctx, in, out, type, &st);
    cli_progress_end(&ps);
    int rc = 0;
    if (s) {
        rc = cli_fail(ctx, "quantize");
        goto done;
    }
    uint64_t el = 0, by = 0;
    int nt = 0;
    char b[32];
    printf("wrote %s (%s, %s):\n", out, type, cli_fmt_bytes(st.file_bytes, b, sizeof b));
    for (int t = 0; t < TIDE_QUANT_STAT_TYPES; t++) {
        if (!st.tensors[t]) continue;
        printf("  %-5s %4d tensors %14llu weights %10s  %.3f bits/weight\n", tide_dtype_name((tide_dtype)t),
               st.tensors[t], (unsigned long long)st.elements[t], cli_fmt_bytes(st.bytes[t], b, sizeof b),
               8.0 * (double)st.bytes[t] / (double)st.elements[t]);
        el += st.elements[t];
        by += st.bytes[t];
        nt += st.tensors[t];
    }
    printf("  all   %4d tensors %14llu weights %10s  %.3f bits/weight\n", nt, (unsigned long long)el,
           cli_fmt_bytes(by, b, sizeof b), el ? 8.0 * (double)by / (double)el : 0.0);
    if (st.fallbacks)
        printf("  %d weights with rows that are not whole blocks of their type fell back to another type\n",
               st.fallbacks);
    if (!strcmp(st.tokenizer, "none"))
        printf("  tokenizer: none in %s (a placeholder vocabulary written)\n", in);
    else
        printf("  tokenizer: %s, %d tokens\n", st.tokenizer, (int)st.n_vocab_tokens);
done:
    tide_ctx_free(ctx);
    return rc;
}
