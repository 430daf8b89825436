/*
 * textgen.c - text in and text out for `tide run --prompt` and `tide chat`
 * (see textgen.h).
 *
 * Stop strings: the text is searched after every id from the first byte a
 * new match could start at; the text after the last byte that might begin a
 * stop string (the longest suffix that is a proper prefix of one) is held
 * back, so nothing of a stop string is ever printed, and what is printed is
 * exactly the final text's prefix. Since the decoder emits whole UTF-8
 * sequences and stop strings are valid UTF-8, a held-back suffix starts on a
 * character boundary.
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
    "                      model's tokenizer_config.json: llama2, llama3, chatml,\n"
    "                      mistral, zephyr or gemma\n";

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

int cli_chat_prompt(tide_ctx *ctx, const tide_tokenizer *tok, const cli_text_opts *t, const char *user,
                    char **out, size_t *len, tide_chat_template **tmpl) {
    if (!*tmpl && tide_chat_template_get(ctx, tok, t->template_name, tmpl)) return cli_fail(ctx, "chat template");
    tide_chat_msg msgs[2];
    int n = 0;
    if (t->system) msgs[n++] = (tide_chat_msg){"system", t->system};
    msgs[n++] = (tide_chat_msg){"user", user};
    if (tide_chat_format(ctx, *tmpl, msgs, n, true, out, len)) return cli_fail(ctx, "chat template");
    return 0;
}

int cli_encode(tide_ctx *ctx, tide_tokenizer *tok, const char *text, size_t len, unsigned flags, int32_t **ids,
               int *n) {
    size_t cnt = 0;
    if (tide_tokenizer_encode(tok, text, len, flags, NULL, 0, &cnt)) return cli_fail(ctx, "encoding the prompt");
    if (cnt == 0 || len == 0) {
        fprintf(stderr, "tide: the prompt is empty\n");
        return 1;
    }
    if (cnt > INT32_MAX / 2) {
        fprintf(stderr, "tide: the prompt is too long (%zu tokens)\n", cnt);
        return 1;
    }
    int32_t *v = malloc(cnt * sizeof *v);
    if (!v) return fprintf(stderr, "tide: out of memory encoding the prompt\n"), 1;
    if (tide_tokenizer_encode(tok, text, len, flags, v, cnt, &cnt)) {
        free(v);
        return cli_fail(ctx, "encoding the prompt");
    }
    *ids = v;
    *n = (int)cnt;
    return 0;
}

int cli_stop_ids(const tide_tokenizer *tok, const tide_chat_template *tmpl, int32_t **out, int *n) {
    const int32_t *eos = NULL;
    int ne = tide_tokenizer_eos_ids(tok, &eos);
    int32_t *v = malloc((size_t)(ne + 1) * sizeof *v);
    if (!v) return fprintf(stderr, "tide: out of memory\n"), 1;
    memcpy(v, eos, (size_t)ne * sizeof *v);
    int32_t eot = tmpl ? tide_tokenizer_find(tok, tide_chat_template_end_of_turn(tmpl)) : -1;
    bool have = eot < 0;
    for (int i = 0; i < ne && !have; i++) have = v[i] == eot;
    if (!have) v[ne++] = eot;
    *out = v;
    *n = ne;
    return 0;
}

/* ------------------------------------------------------------ text out */

int cli_textout_init(cli_textout *o, const tide_tokenizer *tok, FILE *out, const char *const *stops, int n_stops) {
    memset(o, 0, sizeof *o);
    o->out = out;
    o->stops = stops;
    o->n_stops = n_stops;
    for (int i = 0; i < n_stops; i++) {
        o->stop_len[i] = strlen(stops[i]);
        if (o->stop_len[i] > o->max_stop) o->max_stop = o->stop_len[i];
    }
    o->cap = 256;
    if (!(o->text = malloc(o->cap)) || tide_detok_new(tok, TIDE_DECODE_SKIP_SPECIAL, &o->dt)) {
        free(o->text);
        o->text = NULL;
        fprintf(stderr, "tide: out of memory\n");
        return 1;
    }
    o->text[0] = '\0';
    return 0;
}

void cli_textout_free(cli_textout *o) {
    tide_detok_free(o->dt);
    free(o->text);
    o->dt = NULL;
    o->text = NULL;
}

void cli_textout_reset(cli_textout *o) {
    tide_detok_reset(o->dt);
    o->len = o->shown = 0;
    o->text[0] = '\0';
    o->stopped = false;
    o->err = TIDE_OK;
}

static void show(cli_textout *o, size_t upto) {
    if (upto > o->shown && o->out) {
        fwrite(o->text + o->shown, 1, upto - o->shown, o->out);
        fflush(o->out);
    }
    if (upto > o->shown && o->emit) o->emit(o->emit_user, o->text + o->shown, upto - o->shown);
    if (upto > o->shown) o->shown = upto;
}

/* Appends s[0..n); then looks for a stop string and shows what can no
 * longer be part of one. */
static int add_text(cli_textout *o, const char *s, size_t n) {
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap;
        while (o->len + n + 1 > cap) cap *= 2;
        char *t = realloc(o->text, cap);
        if (!t) {
            o->err = TIDE_E_NOMEM;
            return 1;
        }
        o->text = t;
        o->cap = cap;
    }
    size_t from = o->len >= o->max_stop ? o->len - o->max_stop + 1 : 0;
    memcpy(o->text + o->len, s, n);
    o->len += n;
    o->text[o->len] = '\0';
    size_t cut = SIZE_MAX;
    for (int i = 0; i < o->n_stops; i++) {
        const char *hit = strstr(o->text + from, o->stops[i]);
        if (hit && (size_t)(hit - o->text) < cut) cut = (size_t)(hit - o->text);
    }
    if (cut != SIZE_MAX) {
        o->len = cut;
        o->text[cut] = '\0';
        show(o, cut);
        o->stopped = true;
        return 1;
    }
    size_t hold = 0;
    for (int i = 0; i < o->n_stops; i++) {
        for (size_t k = o->stop_len[i] - 1; k > hold; k--)
            if (k <= o->len && !memcmp(o->text + o->len - k, o->stops[i], k)) {
                hold = k;
                break;
            }
    }
    show(o, o->len - hold);
    return 0;
}

int cli_textout_on_token(void *user, int32_t id) {
    cli_textout *o = user;
    const char *s;
    size_t n;
    if ((o->err = tide_detok_push(o->dt, id, &s, &n))) return 1;
    if (n && add_text(o, s, n)) return 1;
    return o->interrupt && *o->interrupt;
}

void cli_textout_finish(cli_textout *o) {
    const char *s;
    size_t n;
    if (!o->stopped && !tide_detok_finish(o->dt, &s, &n) && n) add_text(o, s, n);
    show(o, o->len);
}
