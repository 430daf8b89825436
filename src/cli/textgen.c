/*
 * textgen.c - the text options of `tide run --prompt`, `tide chat` and
 * `tide serve` (see textgen.h); the text itself is src/text/textgen.c's.
 */
#include "cli/textgen.h"

#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char cli_text_help[] =
    "  --temperature T     sampling temperature (default 0: greedy, the most likely\n"
    "                      token every time)\n"
    "  --top-k K           sample among the K most likely tokens (0: all; default 0)\n"
    "  --top-p P           ... among the most likely tokens whose probabilities sum\n"
    "                      to at least P (1: all; default 1)\n"
    "  --min-p P           drop tokens less likely than P times the most likely one\n"
    "                      (default 0)\n"
    "  --repeat-penalty R  divide the (positive) logits of tokens already seen by R,\n"
    "                      multiply negative ones (default 1: off)\n"
    "  --frequency-penalty F  subtract F times a token's count so far (default 0)\n"
    "  --presence-penalty P   subtract P from tokens seen at all (default 0)\n"
    "  --penalty-last-n N  the penalties see the last N tokens (default 0: all)\n"
    "  --seed N            the generator's seed (xoshiro256**): the same seed gives\n"
    "                      the same tokens from the same logits on every machine\n"
    "                      (default: a random seed, printed)\n"
    "  --stop STRING       stop when the generated text contains STRING, which is\n"
    "                      not printed (several allowed). Generation also stops on\n"
    "                      the tokenizer's EOS tokens and the chat template's end of\n"
    "                      turn\n"
    "  --no-parse-special  special tokens' text typed in a prompt (\"<|im_end|>\")\n"
    "                      is read as text, not as the special token (not with a\n"
    "                      chat template, whose markers are special tokens)\n"
    "  --system TEXT       the system message of a chat\n"
    "  --template NAME     the chat template family, instead of detecting it from the\n"
    "                      model's tokenizer_config.json (or GGUF metadata):\n"
    "                      llama2, llama3, chatml, mistral, zephyr or gemma\n";

int cli_text_option(int c, const char *arg, const char *cmd, cli_text_opts *t) {
    long v;
    switch (c) {
    case 0x200:
        if (cli_parse_double(arg, 0, 1e6, &t->so.temperature)) return cli_usage_error(cmd, "bad --temperature '%s' (>= 0)", arg), -1;
        return 1;
    case 0x201:
        if (cli_parse_int(arg, 0, INT32_MAX, &v)) return cli_usage_error(cmd, "bad --top-k '%s' (>= 0)", arg), -1;
        t->so.top_k = (int32_t)v;
        return 1;
    case 0x202:
        if (cli_parse_double(arg, 0, 1, &t->so.top_p)) return cli_usage_error(cmd, "bad --top-p '%s' (0 to 1)", arg), -1;
        return 1;
    case 0x203:
        if (cli_parse_double(arg, 0, 1, &t->so.min_p)) return cli_usage_error(cmd, "bad --min-p '%s' (0 to 1)", arg), -1;
        return 1;
    case 0x204:
        if (cli_parse_double(arg, 0, 1e6, &t->so.repetition_penalty))
            return cli_usage_error(cmd, "bad --repeat-penalty '%s' (> 0; 1 is off)", arg), -1;
        return 1;
    case 0x205:
        if (cli_parse_double(arg, -1e6, 1e6, &t->so.frequency_penalty))
            return cli_usage_error(cmd, "bad --frequency-penalty '%s'", arg), -1;
        return 1;
    case 0x206:
        if (cli_parse_double(arg, -1e6, 1e6, &t->so.presence_penalty))
            return cli_usage_error(cmd, "bad --presence-penalty '%s'", arg), -1;
        return 1;
    case 0x207:
        if (cli_parse_int(arg, 0, INT32_MAX, &v)) return cli_usage_error(cmd, "bad --penalty-last-n '%s' (>= 0)", arg), -1;
        t->so.penalty_last_n = (int32_t)v;
        return 1;
    case 0x208:
        if (cli_parse_u64(arg, &t->so.seed))
            return cli_usage_error(cmd, "bad --seed '%s' (an integer from 0 to 2^64-1)", arg), -1;
        t->seed_given = true;
        return 1;
    case 0x209:
        if (!arg[0]) return cli_usage_error(cmd, "--stop needs a non-empty string"), -1;
        if (t->n_stops == CLI_MAX_STOPS) return cli_usage_error(cmd, "at most %d --stop strings", CLI_MAX_STOPS), -1;
        t->stops[t->n_stops++] = arg;
        return 1;
    case 0x20a: t->no_parse_special = true; return 1;
    case 0x20b: t->system = arg; return 1;
    case 0x20c: t->template_name = arg; return 1;
    default: return 0;
    }
}

bool cli_text_sampling_given(const cli_text_opts *t) {
    const tide_sampler_opts *o = &t->so;
    return t->seed_given || o->temperature != 0 || o->top_k || o->top_p != 0 || o->min_p != 0 ||
           o->repetition_penalty != 0 || o->frequency_penalty != 0 || o->presence_penalty != 0 || o->penalty_last_n;
}

uint64_t cli_random_seed(void) {
    uint64_t s = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&s, sizeof s, 1, f) != 1) s = 0;
        fclose(f);
    }
    if (!s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    return s;
}

int cli_stop_ids(const tide_tokenizer *tok, const tide_chat_template *tmpl, int32_t **out, int *n) {
    int cnt = tide_tokenizer_stop_ids(tok, tmpl, NULL, 0);
    int32_t *v = malloc((size_t)(cnt ? cnt : 1) * sizeof *v);
    if (!v) return fprintf(stderr, "tide: out of memory\n"), 1;
    tide_tokenizer_stop_ids(tok, tmpl, v, cnt);
    *out = v;
    *n = cnt;
    return 0;
}

int cli_encode(tide_ctx *ctx, tide_tokenizer *tok, const char *text, size_t len, unsigned flags, int32_t **ids,
               int *n) {
    int32_t *v = NULL;
    if (tide_tokenizer_encode_prompt(tok, text, len, flags, &v, n)) {
        fprintf(stderr, "tide: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    /* the commands free their prompts with free() */
    if (!(*ids = malloc((size_t)*n * sizeof **ids))) {
        tide_free_ids(v);
        return fprintf(stderr, "tide: out of memory encoding the prompt\n"), 1;
    }
    memcpy(*ids, v, (size_t)*n * sizeof **ids);
    tide_free_ids(v);
    return 0;
}

void cli_print_piece(void *user, const char *piece, size_t n) {
    FILE *f = user;
    fwrite(piece, 1, n, f);
    fflush(f);
}
