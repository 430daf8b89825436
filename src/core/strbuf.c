/*
 * strbuf.c - a growing text buffer written by printf-style calls (core.h).
 */
#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>

void tide_strbuf_printf(tide_strbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap <= b->len + (size_t)n) cap *= 2;
        char *p = tide_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}
