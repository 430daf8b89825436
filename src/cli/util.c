/*
 * util.c - parsing, formatting, progress lines and the default model cache for
 * the command-line front end.
 */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int cli_fail(tide_ctx *ctx, const char *what) {
    fprintf(stderr, "tide: %s: %s (%s)\n", what, tide_ctx_last_error(ctx),
            tide_status_str(tide_ctx_last_status(ctx)));
    return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tide %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'tide %s --help'.\n", cmd);
    va_end(ap);
    return 2;
}

int cli_parse_bytes(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0) || !isfinite(v)) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul > 1 && *end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    double r = v * mul;
    if (r >= 1.8e19) return -1;
    *out = (uint64_t)floor(r + 0.5); /* llround would overflow past 2^63 */
    return 0;
}

int cli_parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, len, "%llu B", (unsigned long long)n);
    else snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

void cli_progress_init(cli_progress_state *s, bool quiet) {
    memset(s, 0, sizeof *s);
    s->tty = isatty(STDERR_FILENO);
    s->quiet = quiet;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void cli_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    cli_progress_state *s = user;
    if (s->quiet) return;
    bool new_phase = strncmp(s->phase, what, sizeof s->phase - 1) != 0;
    double t = now_s();
    if (new_phase) {
        if (s->open) fputc('\n', stderr);
        s->open = false;
        snprintf(s->phase, sizeof s->phase, "%s", what);
    } else if (t - s->last < 0.2 && done < total) {
        return;
    }
    s->last = t;
    double pct = total ? 100.0 * (double)done / (double)total : 0;
    if (s->tty) {
        fprintf(stderr, "\r%s %llu/%llu (%.0f%%)   ", what, (unsigned long long)done,
                (unsigned long long)total, pct);
        s->open = true;
    } else if (new_phase && strcmp(what, "generating") == 0 && done == 0) {
        /* not a terminal: one line for the one long phase, none for per-layer ticks */
        fprintf(stderr, "%s...\n", what);
    }
    fflush(stderr);
}

void cli_progress_end(cli_progress_state *s) {
    if (s->open) fputc('\n', stderr);
    s->open = false;
    s->phase[0] = '\0';
}

static int mkdir_p(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int rc = mkdir(path, 0755);
        *p = '/';
        if (rc && errno != EEXIST) return -1;
    }
    if (mkdir(path, 0755) && errno != EEXIST) return -1;
    return 0;
}

int cli_default_model_dir(const char *name, char *buf, size_t len) {
    const char *c = getenv("TIDE_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int n;
    if (c && *c) n = snprintf(buf, len, "%s/models/%s", c, name);
    else if (x && *x) n = snprintf(buf, len, "%s/tide/models/%s", x, name);
    else if (h && *h) n = snprintf(buf, len, "%s/.cache/tide/models/%s", h, name);
    else n = snprintf(buf, len, "/tmp/tide-cache/models/%s", name);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

/* The built-in tokenizer's files (data/tokenizer, embedded by the build). */
extern const unsigned char tide_builtin_tokenizer_json[], tide_builtin_tokenizer_config[],
    tide_builtin_generation_config[];
extern const unsigned long tide_builtin_tokenizer_json_len, tide_builtin_tokenizer_config_len,
    tide_builtin_generation_config_len;

/* Writes dir/name whole or not at all: into name.tmp, fsynced, renamed. */
static int write_file_atomic(const char *dir, const char *name, const void *data, size_t n) {
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) goto fail;
    bool ok = fwrite(data, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0 || !ok) {
        unlink(tmp);
        goto fail;
    }
    if (rename(tmp, path) == 0) return 0;
    unlink(tmp);
fail:
    fprintf(stderr, "tide: cannot write %s: %s\n", path, strerror(errno));
    return 1;
}

/* The built-in tokenizer beside the built-in model (also into a model
 * generated by an older tide, which had none): tokenizer.json last, so that
 * its presence means the set is whole. */
static int ensure_default_tokenizer(const char *dir) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat st;
    if (stat(path, &st) == 0) return 0;
    if (write_file_atomic(dir, "tokenizer_config.json", tide_builtin_tokenizer_config,
                          tide_builtin_tokenizer_config_len) ||
        write_file_atomic(dir, "generation_config.json", tide_builtin_generation_config,
                          tide_builtin_generation_config_len) ||
        write_file_atomic(dir, "tokenizer.json", tide_builtin_tokenizer_json, tide_builtin_tokenizer_json_len))
        return 1;
    return 0;
}

int cli_ensure_default_model(tide_ctx *ctx, char *dir, size_t len, cli_progress_state *ps) {
    char name[96];
    snprintf(name, sizeof name, "%s-synthetic-s%d", TIDE_DEFAULT_CONFIG, TIDE_DEFAULT_SEED);
    if (cli_default_model_dir(name, dir, len)) {
        fprintf(stderr, "tide: the cache directory path is too long\n");
        return 1;
    }
    char cfg_path[PATH_MAX + 32];
    snprintf(cfg_path, sizeof cfg_path, "%s/model.safetensors", dir); /* written last */
    struct stat st;
    if (stat(cfg_path, &st) == 0) {
        /* not fatal: only a text prompt needs it, and says so if it is missing */
        (void)ensure_default_tokenizer(dir);
        return 0;
    }
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", dir);
    if (mkdir_p(tmp)) {
        fprintf(stderr, "tide: cannot create the model cache %s: %s\n", dir, strerror(errno));
        return 1;
    }
    tide_llama_config cfg;
    if (tide_llama_config_named(ctx, TIDE_DEFAULT_CONFIG, &cfg)) return cli_fail(ctx, "default model");
    if (!ps->quiet)
        fprintf(stderr, "tide: generating the built-in %s-shaped synthetic model (%.2f GB, once) in %s\n",
                TIDE_DEFAULT_CONFIG, tide_llama_config_params(&cfg) * 2 / 1e9, dir);
    tide_status s = tide_checkpoint_make_synthetic(ctx, &cfg, TIDE_DEFAULT_SEED, 0, dir);
    cli_progress_end(ps);
    if (s) return cli_fail(ctx, "generating the default model");
    (void)ensure_default_tokenizer(dir);
    return 0;
}

int cli_parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || errno || s[0] == '-') return -1;
    *out = v;
    return 0;
}

int cli_parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cli_parse_cache_type(const char *s, tide_dtype *out) {
    tide_dtype dt;
    if (tide_dtype_parse(s, &dt) || (dt != TIDE_F32 && dt != TIDE_F16 && dt != TIDE_BF16 && dt != TIDE_Q8_0))
        return -1;
    *out = dt;
    return 0;
}

int cli_parse_backend(const char *s, tide_backend_kind *out) {
    if (!strcmp(s, "auto")) *out = TIDE_BACKEND_AUTO;
    else if (!strcmp(s, "cpu")) *out = TIDE_BACKEND_CPU;
    else if (!strcmp(s, "cuda")) *out = TIDE_BACKEND_CUDA;
    else return -1;
    return 0;
}

int cli_parse_budget(const char *s, tide_offload_opts *o) {
    if (!strcmp(s, "none")) o->budget_kind = TIDE_BUDGET_NONE;
    else if (!strcmp(s, "min")) o->budget_kind = TIDE_BUDGET_MIN;
    else if (!strcmp(s, "auto")) o->budget_kind = TIDE_BUDGET_AUTO;
    else if (s[0] && s[strlen(s) - 1] == '%') {
        char *end;
        double pct = strtod(s, &end);
        if (end == s || *end != '%' || !(pct > 0 && pct <= 100)) return -1;
        o->budget_kind = TIDE_BUDGET_FRACTION;
        o->fraction = pct / 100.0;
    } else {
        if (cli_parse_bytes(s, &o->bytes) || !o->bytes) return -1;
        o->budget_kind = TIDE_BUDGET_BYTES;
    }
    return 0;
}

/* A "Name:   N kB" line of /proc/self/status in bytes, or 0. */
static uint64_t proc_status_kb(const char *name) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t n = strlen(name);
    uint64_t v = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == ':') {
            v = strtoull(line + n + 1, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

bool cli_rss_reset_peak(void) {
    /* "5" resets the peak resident set size to the current one (Linux 4.0) */
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    ok = fclose(f) == 0 && ok;
    return ok && proc_status_kb("VmHWM") > 0;
}

uint64_t cli_rss_peak(void) {
    uint64_t v = proc_status_kb("VmHWM");
    if (v) return v;
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_maxrss * 1024 : 0;
}

uint64_t cli_rss_now(void) { return proc_status_kb("VmRSS"); }

char *cli_read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "tide: %s: cannot open: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        char *b = realloc(buf, cap *= 2);
        if (!b) free(buf);
        buf = b;
    }
    int err = ferror(f) ? (errno ? errno : EIO) : 0;
    if (f != stdin) fclose(f);
    if (!buf || err) {
        fprintf(stderr, "tide: %s: %s\n", path, buf ? strerror(err) : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = '\0'; /* n < cap: the loop ends on a short read */
    *len = n;
    return buf;
}

bool cli_is_gguf(const char *path) {
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) return false;
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char m[4] = {0};
    size_t n = fread(m, 1, 4, f);
    fclose(f);
    return n == 4 && !memcmp(m, "GGUF", 4);
}

tide_status cli_model_config(tide_ctx *ctx, const char *path, tide_llama_config *cfg) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        tide_checkpoint *ck = NULL;
        tide_status s = tide_checkpoint_open(ctx, path, &ck);
        if (s) return s;
        *cfg = *tide_checkpoint_config(ck);
        tide_checkpoint_free(ck);
        return TIDE_OK;
    }
    char cp[4096];
    snprintf(cp, sizeof cp, "%s/config.json", path);
    return tide_llama_config_load(ctx, cp, cfg);
}
