/*
 * strbuf.c - a growing text buffer, kept NUL-terminated (core.h).
 */
#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Makes room for n more bytes and the NUL; false (and oom) when it cannot. */
static bool reserve(tide_strbuf *b, size_t n) {
    if (b->oom) return false;
    if (b->len + n < b->cap) return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap <= b->len + n) cap *= 2;
    char *p = tide_realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void tide_strbuf_add(tide_strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

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
        if (!reserve(b, (size_t)n)) return;
    }
}
