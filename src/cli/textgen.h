/*
 * textgen.h - text in and text out for the commands that generate (`tide
 * run --prompt`, `tide chat`): the sampling options they share, the prompt
 * through the tokenizer, and generated ids printed as text while they come,
 * with --stop strings held back until they can no longer match.
 */
#ifndef TIDE_CLI_TEXTGEN_H
#define TIDE_CLI_TEXTGEN_H

#include "tide.h"

#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

#define CLI_MAX_STOPS 16

/* The options of generating text, shared by run and chat. */
typedef struct cli_text_opts {
    tide_sampler_opts so;
    bool seed_given;
    const char *stops[CLI_MAX_STOPS];
    int n_stops;
    bool no_parse_special;     /* special tokens' text in the input is text */
    const char *system;        /* --system */
    const char *template_name; /* --template */
} cli_text_opts;

/* The getopt_long entries of cli_text_opts (values from 0x200 up), to be
 * copied into a command's own table. */
#define CLI_TEXT_OPTIONS                                                                                 \
    {"temperature", required_argument, 0, 0x200}, {"top-k", required_argument, 0, 0x201},               \
    {"top-p", required_argument, 0, 0x202},       {"min-p", required_argument, 0, 0x203},               \
    {"repeat-penalty", required_argument, 0, 0x204}, {"frequency-penalty", required_argument, 0, 0x205}, \
    {"presence-penalty", required_argument, 0, 0x206}, {"penalty-last-n", required_argument, 0, 0x207},  \
    {"seed", required_argument, 0, 0x208},        {"stop", required_argument, 0, 0x209},                \
    {"no-parse-special", no_argument, 0, 0x20a},  {"system", required_argument, 0, 0x20b},              \
    {"template", required_argument, 0, 0x20c}

/* The help lines of those options. */
extern const char cli_text_help[];

/* Handles option c of CLI_TEXT_OPTIONS. Returns 1 when it was one (and
 * parsed), 0 when it is not one of them, -1 on a bad value (message printed
 * for command cmd). */
int cli_text_option(int c, const char *arg, const char *cmd, cli_text_opts *t);

/* true when any sampling option was given (else generation is greedy). */
bool cli_text_sampling_given(const cli_text_opts *t);
/* A seed from the system's random source (the clock where there is none). */
uint64_t cli_random_seed(void);

/* The template of the model's tokenizer (--template NAME, else detected)
 * and the conversation [system], user formatted with the assistant's
 * header. *out is freed with tide_free_text. Returns 0 or 1 (message
 * printed). */
int cli_chat_prompt(tide_ctx *ctx, const tide_tokenizer *tok, const cli_text_opts *t, const char *user,
                    char **out, size_t *len, tide_chat_template **tmpl);

/* Encodes text into a malloc'd array. Returns 0, or 1 with the message
 * printed (an empty result is "an empty prompt"). */
int cli_encode(tide_ctx *ctx, tide_tokenizer *tok, const char *text, size_t len, unsigned flags, int32_t **ids,
               int *n);

/* The stop ids of a generation: the tokenizer's EOS ids, and the chat
 * template's end-of-turn token (tmpl may be NULL). *out is malloc'd. */
int cli_stop_ids(const tide_tokenizer *tok, const tide_chat_template *tmpl, int32_t **out, int *n);

/* Generated ids to text, printed as they come (to out, when not NULL; to
 * emit, when set) and
 * collected; generation stops at a --stop string, which is neither printed
 * nor collected, nor is anything after it. Special tokens print nothing. */
typedef struct cli_textout {
    tide_detok *dt;
    FILE *out;
    /* Optional: also given each piece as it is shown (`tide serve` streams
     * them); piece is not NUL-terminated. */
    void (*emit)(void *user, const char *piece, size_t n);
    void *emit_user;
    const char *const *stops;
    int n_stops;
    size_t stop_len[CLI_MAX_STOPS];
    size_t max_stop;           /* the longest stop string's length */
    char *text;                /* the text so far (NUL-terminated) */
    size_t len, cap;
    size_t shown;              /* text[0..shown) has been written to out */
    bool stopped;              /* a stop string matched */
    volatile sig_atomic_t *interrupt; /* set (by a signal): stop */
    tide_status err;           /* a decode failure (the callback then stops) */
} cli_textout;

int cli_textout_init(cli_textout *o, const tide_tokenizer *tok, FILE *out, const char *const *stops, int n_stops);
void cli_textout_free(cli_textout *o);
/* Starts a new text (the stream and the text emptied). */
void cli_textout_reset(cli_textout *o);
/* tide_gen_opts.on_token for a cli_textout: non-zero to stop. */
int cli_textout_on_token(void *user, int32_t id);
/* Ends the text: what was held back for a stop string is written. */
void cli_textout_finish(cli_textout *o);

#endif
