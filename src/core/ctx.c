/*
 * ctx.c - the context: last error, thread count, progress callback; status
 * and role names (op names are in the op descriptor table, graph/ops.c).
 */
#include "core/core.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const status_names[] = {
    [TIDE_OK] = "ok",
    [TIDE_E_INVALID] = "invalid argument",
    [TIDE_E_NOMEM] = "out of memory",
    [TIDE_E_IO] = "i/o error",
    [TIDE_E_FORMAT] = "malformed input",
    [TIDE_E_NOT_FOUND] = "not found",
    [TIDE_E_UNSUPPORTED] = "unsupported",
    [TIDE_E_RANGE] = "value out of range",
    [TIDE_E_INFEASIBLE] = "infeasible",
    [TIDE_E_NO_DEVICE] = "no device",
    [TIDE_E_BACKEND] = "backend failure",
    [TIDE_E_VERIFY] = "verification failed",
    [TIDE_E_BUSY] = "busy",
};

const char *tide_status_str(tide_status s) {
    if ((unsigned)s < sizeof status_names / sizeof status_names[0] && status_names[s])
        return status_names[s];
    return "unknown status";
}

/* The number of threads used when none is set: TIDE_THREADS, else all
 * online cores. */
static int default_threads(void) {
    const char *env = getenv("TIDE_THREADS");
    int n = env ? atoi(env) : 0;
    if (n > 0) return n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

/* The environment is read here, once per context, not on every call that
 * needs it (tide_ctx_threads runs on every CPU op). */
tide_ctx *tide_ctx_new(void) {
    tide_ctx *ctx = tide_calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->default_threads = default_threads();
    return ctx;
}

void tide_ctx_free(tide_ctx *ctx) { tide_free(ctx); }

const char *tide_ctx_last_error(const tide_ctx *ctx) { return ctx ? ctx->last_error : ""; }
tide_status tide_ctx_last_status(const tide_ctx *ctx) { return ctx ? ctx->last_status : TIDE_OK; }

void tide_ctx_set_threads(tide_ctx *ctx, int n) { ctx->n_threads = n < 0 ? 0 : n; }

int tide_ctx_threads(const tide_ctx *ctx) {
    if (ctx && ctx->n_threads > 0) return ctx->n_threads;
    return ctx ? ctx->default_threads : default_threads();
}

void tide_ctx_set_progress(tide_ctx *ctx, tide_progress_fn fn, void *user) {
    ctx->progress = fn;
    ctx->progress_user = user;
}

void tide_progress(tide_ctx *ctx, const char *what, uint64_t done, uint64_t total) {
    if (ctx && ctx->progress) ctx->progress(ctx->progress_user, what, done, total);
}

tide_status tide_err(tide_ctx *ctx, tide_status status, const char *fmt, ...) {
    if (!ctx) return status;
    /* formatted aside first: callers wrap the previous message
     * ("...: %s", tide_ctx_last_error(ctx)), which must not be overwritten
     * while it is being read */
    char msg[sizeof ctx->last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(ctx->last_error, msg, sizeof msg);
    ctx->last_status = status;
    return status;
}

void tide_err_clear(tide_ctx *ctx) {
    if (!ctx) return;
    ctx->last_status = TIDE_OK;
    ctx->last_error[0] = '\0';
}

int tide_grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int ncap = *cap ? *cap : 16;
    while (ncap < need) ncap *= 2;
    void *p = tide_realloc(*arr, (size_t)ncap * elem);
    if (!p) return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

static const char *const role_names[] = {"weight", "state", "input", "output", "temp"};
const char *tide_role_name(tide_role r) {
    return (unsigned)r < TIDE_ROLE_COUNT ? role_names[r] : "?";
}
