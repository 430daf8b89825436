/*
 * cli.h - shared pieces of the tide command-line front end.
 */
#ifndef TIDE_CLI_H
#define TIDE_CLI_H

#include "tide.h"

#include <stdbool.h>
#include <stdint.h>

/* Each command: returns the process exit status (0 ok, 1 failure, 2 usage). */
int cmd_run(int argc, char **argv);
int cmd_make_model(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

/* Prints "tide: <what>: <ctx message>" on stderr and returns 1. */
int cli_fail(tide_ctx *ctx, const char *what);
/* Prints a usage error "tide <cmd>: msg" and a hint to --help; returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses a byte count: "123", "4096B", "1.5G", "512MiB", "2GB" (K/M/G/T are
 * powers of 1024). Returns 0 or -1. */
int cli_parse_bytes(const char *s, uint64_t *out);
/* --budget: "none", "min", "auto", a percentage "25%" (of the unconstrained
 * peak) or bytes, into o's budget fields. Returns 0 or -1. */
int cli_parse_budget(const char *s, tide_offload_opts *o);
/* --cache-type: "f32", "f16", "bf16" or "q8_0" into *out; -1 for anything
 * else. CLI_OPT_CACHE_TYPE is its getopt code (no short option), and
 * CLI_CACHE_TYPE_HELP its --help lines. */
int cli_parse_cache_type(const char *s, tide_dtype *out);
#define CLI_OPT_CACHE_TYPE 0x1c7
/* --lora DIR (run, chat, plan): a PEFT LoRA adapter applied at run time
 * (tide_checkpoint_add_lora); CLI_LORA_HELP its --help lines. */
#define CLI_OPT_LORA 0x300
#define CLI_LORA_HELP                                                                   \
    "  --lora DIR          apply the PEFT LoRA adapter in DIR (adapter_config.json,\n" \
    "                      adapter_model.safetensors, as tide train --lora-r\n"       \
    "                      writes) at run time: each targeted projection adds\n"      \
    "                      (alpha/r) (x A^T) B^T beside its base weight (any dtype)\n"
#define CLI_CACHE_TYPE_HELP                                                             \
    "  --cache-type T      the KV cache's type: f32 (default), f16, bf16 (rounded to\n" \
    "                      nearest even) or q8_0 (ggml's 8-bit blocks of 32 values,\n" \
    "                      3.8x smaller than f32; docs/quantization.md)\n"
#define CLI_CACHE_TYPE_ERROR "bad --cache-type '%s' (f32, f16, bf16 or q8_0)"
/* "auto", "cpu" or "cuda" into *out; -1 for anything else. */
int cli_parse_backend(const char *s, tide_backend_kind *out);
/* Parses an int in [lo, hi]. Returns 0 or -1. */
int cli_parse_int(const char *s, long lo, long hi, long *out);
/* A decimal integer from 0 to 2^64-1, the whole string (no sign). 0 or -1. */
int cli_parse_u64(const char *s, uint64_t *out);
/* A finite number in [lo, hi], the whole string. Returns 0 or -1. */
int cli_parse_double(const char *s, double lo, double hi, double *out);
/* Formats bytes as "1.23 GiB" into buf. */
const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len);

/* Progress line on stderr: redrawn in place on a terminal, one line per phase
 * otherwise. Install with tide_ctx_set_progress(ctx, cli_progress, &state). */
typedef struct cli_progress_state {
    bool tty;
    bool quiet;
    char phase[32];
    double last;
    bool open; /* a line is being redrawn */
} cli_progress_state;
void cli_progress_init(cli_progress_state *s, bool quiet);
void cli_progress(void *user, const char *what, uint64_t done, uint64_t total);
void cli_progress_end(cli_progress_state *s);

/* Resident memory of this process (Linux: /proc/self/status). cli_rss_peak:
 * its peak (VmHWM; else getrusage's ru_maxrss) in bytes, 0 when unknown;
 * cli_rss_now: its current size (VmRSS), 0 when unknown;
 * cli_rss_reset_peak: sets the peak to the current size (/proc/self/clear_refs),
 * so that the next cli_rss_peak is the peak since this call; false when the
 * system does not allow it (the peak then runs from the process's start). */
bool cli_rss_reset_peak(void);
uint64_t cli_rss_peak(void);
uint64_t cli_rss_now(void);

/* Directory of the built-in default model (created on first use):
 * $TIDE_CACHE, else $XDG_CACHE_HOME/tide, else $HOME/.cache/tide, then
 * models/<name>. Returns 0 or -1 (message in buf on failure). */
int cli_default_model_dir(const char *name, char *buf, size_t len);
/* Makes sure the built-in default model exists (generating it if not) and
 * writes its directory into dir. Returns 0 or the exit status on failure. */
int cli_ensure_default_model(tide_ctx *ctx, char *dir, size_t len, cli_progress_state *ps);

/* The configuration of --model PATH: PATH/config.json for a directory, the
 * metadata of a GGUF file (opened as a checkpoint). Returns TIDE_OK or the
 * status with the message on ctx. */
tide_status cli_model_config(tide_ctx *ctx, const char *path, tide_llama_config *cfg);
/* True when path is a regular file that starts with GGUF's magic. */
bool cli_is_gguf(const char *path);

/* Reads all of path ("-": standard input) into a malloc'd buffer (one NUL
 * after the bytes, not counted in *len); NULL with the message printed. */
char *cli_read_all(const char *path, size_t *len);

#define TIDE_DEFAULT_CONFIG "tinyllama-1.1b"
#define TIDE_DEFAULT_SEED 0

#endif
