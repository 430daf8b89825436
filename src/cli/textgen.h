/*
 * textgen.h - the text options of the commands that generate (`tide run
 * --prompt`, `tide chat`, and the sampling fields `tide serve` takes): their
 * getopt entries, help and parsing. The text itself (prompts, stop ids, stop
 * strings, streamed UTF-8) is the library's (tide.h, "text generation").
 */
#ifndef TIDE_CLI_TEXTGEN_H
#define TIDE_CLI_TEXTGEN_H

#include "tide.h"

#include <getopt.h>
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

/* The stop ids of a generation (tide_tokenizer_stop_ids) copied
 * into a malloc'd array. Returns 0, or 1 with the message printed. */
int cli_stop_ids(const tide_tokenizer *tok, const tide_chat_template *tmpl, int32_t **out, int *n);

/* Encodes a prompt (tide_tokenizer_encode_prompt; ctx: the tokenizer's)
 * into a malloc'd array. Returns 0, or 1 with the message printed. */
int cli_encode(tide_ctx *ctx, tide_tokenizer *tok, const char *text, size_t len, unsigned flags, int32_t **ids,
               int *n);

/* Writes a piece of generated text to the FILE * user and flushes it: the
 * emit callback of a tide_textgen that prints as it comes. */
void cli_print_piece(void *user, const char *piece, size_t n);

#endif
