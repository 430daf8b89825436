/*
 * ctx_error.c - tide_ctx_set_error (tide.h): a client's own failure recorded
 * on a context the way the library records its own (core.h: tide_err).
 */
#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>

tide_status tide_ctx_set_error(tide_ctx *ctx, tide_status status, const char *fmt, ...) {
    if (!ctx) return status;
    /* formatted aside: fmt's arguments may be this context's last error */
    char msg[TIDE_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tide_err(ctx, status, "%s", msg);
}
