/*
 * alloc.c - the allocation hooks: one place for accounting and fault injection.
 * A small header in front of each block records its size so that live bytes can
 * be counted without asking the C library.
 */
#include "core/alloc_test.h"
#include "core/core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define HDR 16 /* keeps malloc's 16-byte alignment */

static atomic_long n_allocs;
static atomic_long fail_at; /* allocation number that fails; 0 = none */
static atomic_llong live_bytes;

void tide_alloc_fail_nth(long n) { atomic_store(&fail_at, n > 0 ? atomic_load(&n_allocs) + n : 0); }
long tide_alloc_count(void) { return atomic_load(&n_allocs); }
int64_t tide_alloc_live_bytes(void) { return atomic_load(&live_bytes); }

static int should_fail(void) {
    long k = atomic_fetch_add(&n_allocs, 1) + 1;
    long f = atomic_load(&fail_at);
    return f != 0 && k == f;
}

void *tide_malloc(size_t n) {
    if (should_fail() || n > SIZE_MAX - HDR) return NULL;
    unsigned char *p = malloc(n + HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    atomic_fetch_add(&live_bytes, (long long)n);
    return p + HDR;
}

void *tide_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return NULL;
    void *p = tide_malloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

void *tide_realloc(void *ptr, size_t n) {
    if (!ptr) return tide_malloc(n);
    if (should_fail() || n > SIZE_MAX - HDR) return NULL;
    unsigned char *base = (unsigned char *)ptr - HDR;
    size_t old;
    memcpy(&old, base, sizeof old);
    unsigned char *p = realloc(base, n + HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    atomic_fetch_add(&live_bytes, (long long)n - (long long)old);
    return p + HDR;
}

void tide_free(void *ptr) {
    if (!ptr) return;
    unsigned char *base = (unsigned char *)ptr - HDR;
    size_t n;
    memcpy(&n, base, sizeof n);
    atomic_fetch_sub(&live_bytes, (long long)n);
    free(base);
}

char *tide_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = tide_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Aligned blocks keep the size and the true base just before the returned
 * pointer. */
void *tide_malloc_aligned(size_t n, size_t alignment) {
    if (alignment < 16) alignment = 16;
    if (should_fail() || n > SIZE_MAX - alignment - HDR) return NULL;
    void *base = NULL;
    if (posix_memalign(&base, alignment, n + alignment) != 0) return NULL;
    unsigned char *p = (unsigned char *)base + alignment;
    memcpy(p - HDR, &n, sizeof n);
    memcpy(p - sizeof(void *), &base, sizeof base);
    atomic_fetch_add(&live_bytes, (long long)n);
    return p;
}

void tide_free_aligned(void *ptr) {
    if (!ptr) return;
    unsigned char *p = ptr;
    size_t n;
    void *base;
    memcpy(&n, p - HDR, sizeof n);
    memcpy(&base, p - sizeof(void *), sizeof base);
    atomic_fetch_sub(&live_bytes, (long long)n);
    free(base);
}
