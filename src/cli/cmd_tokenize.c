/*
 * cmd_tokenize.c - `tide tokenize`: a text through a model's tokenizer, the
 * ids and pieces printed (a table, or one JSON object).
 */
#include "cli.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "Usage: tide tokenize --model DIR|FILE.gguf [--json] [--no-bos]\n"
    "                     [--no-parse-special] [--file F | TEXT]\n"
    "       tide tokenize --model DIR --file DATA.jsonl|DATA.txt --out FILE\n"
    "                     [--data-dtype u16|u32]\n"
    "\n"
    "Encodes TEXT (or the bytes of file F, exactly; '-' reads standard input) with\n"
    "the tokenizer of a Hugging Face model directory (tokenizer.json, with\n"
    "tokenizer_config.json, special_tokens_map.json and generation_config.json for\n"
    "BOS and EOS) or of a GGUF file (its tokenizer.ggml.* metadata) and prints each\n"
    "id with its piece as tokenizer.json (or the GGUF vocabulary) spells it.\n"
    "The ids are those Hugging Face tokenizers gives for the same text with\n"
    "add_special_tokens=True. Text that is not valid UTF-8 is read with U+FFFD in\n"
    "place of each invalid sequence.\n"
    "\n"
    "  --model DIR         the model directory (or its tokenizer.json), or a .gguf\n"
    "                      file\n"
    "  --file F            read the text from F instead of the command line\n"
    "  --json              print one JSON object: {\"ids\": [...], \"pieces\": [...]}\n"
    "  --no-bos            do not add the tokens the tokenizer adds around a text\n"
    "                      (tokenizer.json's post-processor template: usually BOS)\n"
    "  --no-parse-special  read special-token text in the input (\"<|eot_id|>\",\n"
    "                      \"<s>\") as ordinary text, not as the special token\n"
    "  --out FILE          write the token stream of a data set of documents (a\n"
    "                      .jsonl of {\"text\": ...} lines or a .txt, one document\n"
    "                      a line) to FILE: the ids tide train --data takes from\n"
    "                      the text itself (each document: BOS where the\n"
    "                      tokenizer adds one, its ids, EOS), as raw little-endian\n"
    "                      u16 (u32 with --data-dtype u32 or when an id needs it;\n"
    "                      train then with --data-dtype u32) or a .npy when FILE\n"
    "                      ends in .npy; written whole or not at all. A bad line\n"
    "                      is named by its number\n"
    "  --data-dtype D      with --out: u16 or u32\n"
    "\n"
    "Supported: BPE tokenizers, byte-level (GPT-2, Llama 3, Qwen2) and\n"
    "SentencePiece-style (Llama 2, TinyLlama, Mistral); in GGUF files the \"llama\"\n"
    "and \"gpt2\" tokenizer models (pre-tokenizers gpt-2, llama-bpe, qwen2,\n"
    "tekken). Other kinds are refused with a message naming what the file asks for.\n";

/* A piece quoted, with control characters, quotes and backslashes escaped. */
static void print_piece(const char *p) {
    putchar('\'');
    for (const unsigned char *s = (const unsigned char *)p; *s; s++) {
        if (*s == '\n') fputs("\\n", stdout);
        else if (*s == '\t') fputs("\\t", stdout);
        else if (*s == '\r') fputs("\\r", stdout);
        else if (*s == '\\' || *s == '\'') printf("\\%c", *s);
        else if (*s < 0x20 || *s == 0x7F) printf("\\x%02x", *s);
        else putchar(*s);
    }
    putchar('\'');
}

static int print_json(const tide_tokenizer *t, const int32_t *ids, size_t n) {
    cJSON *o = cJSON_CreateObject(), *ja = cJSON_AddArrayToObject(o, "ids"), *pa = cJSON_AddArrayToObject(o, "pieces");
    for (size_t i = 0; o && ja && pa && i < n; i++) {
        cJSON_AddItemToArray(ja, cJSON_CreateNumber(ids[i]));
        cJSON_AddItemToArray(pa, cJSON_CreateString(tide_tokenizer_piece(t, ids[i])));
    }
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) {
        fputs("tide tokenize: out of memory\n", stderr);
        return 1;
    }
    puts(s);
    free(s);
    return 0;
}

/* tokenize --out: a data set of documents as a token file. */
static int write_tokens(const char *model, const char *file, const char *out, tide_token_dtype dt) {
    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) return 1;
    tide_tokenizer *t = NULL;
    tide_dataset *d = NULL;
    int rc = 0;
    tide_dataset_opts o = {.seq = 0}; /* read to be written */
    if (tide_tokenizer_open(ctx, model, &t)) rc = cli_fail(ctx, "tokenizer");
    else if (strlen(file) < 4 || (strcmp(file + strlen(file) - 4, ".txt") &&
                                  (strlen(file) < 6 || strcmp(file + strlen(file) - 6, ".jsonl")))) {
        fprintf(stderr, "tide: tokenize: --out needs a .jsonl or .txt --file, not %s\n", file);
        rc = 2;
    } else if (tide_dataset_open(ctx, file, t, tide_tokenizer_n_vocab(t), TIDE_TOKENS_AUTO, &o, &d, NULL)) {
        rc = cli_fail(ctx, "reading the data");
    } else if (tide_dataset_write_tokens(d, out, dt)) {
        rc = cli_fail(ctx, "writing the token file");
    } else {
        const tide_tokens *tk = tide_dataset_tokens(d);
        tide_dataset_info in;
        tide_dataset_info_get(d, &in);
        bool wide = dt == TIDE_TOKENS_U32;
        for (int64_t i = 0; !wide && dt == TIDE_TOKENS_AUTO && i < tide_tokens_count(tk); i++)
            wide = tide_tokens_at(tk, i) > 65535;
        size_t n = strlen(out);
        bool npy = n >= 4 && !strcmp(out + n - 4, ".npy");
        printf("wrote %lld tokens of %lld documents to %s (%s%s)\n", (long long)tide_tokens_count(tk),
               (long long)in.rows, out, npy ? ".npy, " : "", wide ? npy ? "<u4" : "u32: train with --data-dtype u32"
                                                                  : npy ? "<u2" : "u16");
    }
    tide_dataset_free(d);
    tide_tokenizer_free(t);
    tide_ctx_free(ctx);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"file", required_argument, 0, 'f'},
        {"json", no_argument, 0, 'j'},        {"no-bos", no_argument, 0, 'B'},
        {"no-parse-special", no_argument, 0, 'S'}, {"help", no_argument, 0, 'h'},
        {"out", required_argument, 0, 'o'},   {"data-dtype", required_argument, 0, 'D'},
        {0, 0, 0, 0},
    };
    const char *model = NULL, *file = NULL, *out = NULL;
    tide_token_dtype dt = TIDE_TOKENS_AUTO;
    bool have_dt = false;
    bool json = false;
    unsigned flags = TIDE_TOKENIZE_ADD_SPECIAL;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'f': file = optarg; break;
        case 'j': json = true; break;
        case 'B': flags &= ~(unsigned)TIDE_TOKENIZE_ADD_SPECIAL; break;
        case 'S': flags |= TIDE_TOKENIZE_SPECIAL_AS_TEXT; break;
        case 'o': out = optarg; break;
        case 'D':
            if (!strcmp(optarg, "u16")) dt = TIDE_TOKENS_U16;
            else if (!strcmp(optarg, "u32")) dt = TIDE_TOKENS_U32;
            else return cli_usage_error("tokenize", "bad --data-dtype '%s' (u16 or u32)", optarg);
            have_dt = true;
            break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("tokenize", "unknown option");
        }
    }
    if (!model) return cli_usage_error("tokenize", "--model is required");
    if (have_dt && !out) return cli_usage_error("tokenize", "--data-dtype is for --out");
    if (out) {
        if (!file || optind != argc) return cli_usage_error("tokenize", "--out writes the tokens of --file DATA.jsonl "
                                                            "or DATA.txt (and takes no text)");
        return write_tokens(model, file, out, dt);
    }
    if (file && optind != argc) return cli_usage_error("tokenize", "give either --file or a text, not both");
    if (!file && optind != argc - 1)
        return cli_usage_error("tokenize", "one text is required (quote it), or --file F");

    size_t len;
    char *text = file ? cli_read_all(file, &len) : strdup(argv[optind]);
    if (!text) return 1;
    if (!file) len = strlen(text);
    tide_ctx *ctx = tide_ctx_new();
    tide_tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    if (!ctx) {
        rc = 1;
        goto out;
    }
    if (tide_tokenizer_open(ctx, model, &t)) {
        rc = cli_fail(ctx, "tokenizer");
        goto out;
    }
    /* at most one id per byte plus the template for byte-level models; asked
     * again with the exact count when another model needs more */
    size_t cap = len + 16;
    ids = malloc(cap * sizeof *ids);
    if (!ids || tide_tokenizer_encode(t, text, len, flags, ids, cap, &n)) {
        rc = ids ? cli_fail(ctx, "tokenize") : 1;
        goto out;
    }
    if (n > cap) {
        int32_t *b = realloc(ids, n * sizeof *ids);
        if (!b || tide_tokenizer_encode(t, text, len, flags, b, n, &n)) {
            if (b) ids = b;
            rc = b ? cli_fail(ctx, "tokenize") : 1;
            goto out;
        }
        ids = b;
    }
    if (json) {
        rc = print_json(t, ids, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        printf("%8d  ", (int)ids[i]);
        print_piece(tide_tokenizer_piece(t, ids[i]));
        putchar('\n');
    }
    printf("%zu token%s\n", n, n == 1 ? "" : "s");
out:
    free(ids);
    free(text);
    tide_tokenizer_free(t);
    tide_ctx_free(ctx);
    return rc;
}
