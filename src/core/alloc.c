/*
 * alloc.c - the allocation hooks: every allocation of the library goes
 * through here, which gives one place for accounting, fault injection, and a
 * caller's own allocator (tide_set_allocator). A small header in front of each
 * block records its size so that live bytes can be counted without asking the
 * allocator. Live blocks are counted apart from live bytes: a block of 0 bytes
 * is still the allocator's, to be given back to it.
 *
 * The accounting and fault injection the tests read (alloc_test.h: the
 * count of allocations, the Nth failing, the live bytes) is compiled only
 * into the test build's objects (TIDE_TEST_HOOKS); the shipped library counts
 * only live blocks, which tide_set_allocator needs.
 *
 * Aligned blocks are carved out of an ordinary block of the allocator: the
 * returned pointer is aligned, and the size and the true base sit in the gap
 * just before it.
 */
#include "core/core.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HDR 16 /* keeps malloc's 16-byte alignment */

static atomic_long live_blocks;
static tide_allocator hooks; /* all NULL: the C library */

#ifdef TIDE_TEST_HOOKS
#include "core/alloc_test.h"

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
#define LIVE_BYTES_ADD(n) atomic_fetch_add(&live_bytes, (long long)(n))
#else
#define should_fail() 0
#define LIVE_BYTES_ADD(n) ((void)0)
#endif

tide_status tide_set_allocator(const tide_allocator *a) {
    if (a && (!a->alloc || !a->resize || !a->release)) return TIDE_E_INVALID;
    if (atomic_load(&live_blocks) != 0) return TIDE_E_INVALID; /* blocks of the old one are live */
    if (a) hooks = *a;
    else memset(&hooks, 0, sizeof hooks);
    return TIDE_OK;
}

static void *raw_alloc(size_t n) { return hooks.alloc ? hooks.alloc(hooks.user, n) : malloc(n); }
static void *raw_resize(void *p, size_t n) { return hooks.resize ? hooks.resize(hooks.user, p, n) : realloc(p, n); }
static void raw_release(void *p) {
    if (hooks.release) hooks.release(hooks.user, p);
    else free(p);
}

void *tide_malloc(size_t n) {
    if (should_fail() || n > SIZE_MAX - HDR) return NULL;
    unsigned char *p = raw_alloc(n + HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    LIVE_BYTES_ADD(n);
    atomic_fetch_add(&live_blocks, 1);
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
    unsigned char *p = raw_resize(base, n + HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    LIVE_BYTES_ADD((long long)n - (long long)old);
    return p + HDR;
}

void tide_free(void *ptr) {
    if (!ptr) return;
    unsigned char *base = (unsigned char *)ptr - HDR;
    size_t n;
    memcpy(&n, base, sizeof n);
    LIVE_BYTES_ADD(-(long long)n);
    atomic_fetch_sub(&live_blocks, 1);
    raw_release(base);
}

char *tide_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = tide_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void *tide_malloc_aligned(size_t n, size_t alignment) {
    if (alignment < HDR) alignment = HDR;
    if (should_fail() || n > SIZE_MAX - 2 * alignment) return NULL;
    unsigned char *base = raw_alloc(n + 2 * alignment);
    if (!base) return NULL;
    /* at least HDR bytes before p hold its size and the base */
    uintptr_t a = ((uintptr_t)base + HDR + alignment - 1) & ~(uintptr_t)(alignment - 1);
    unsigned char *p = (unsigned char *)a;
    memcpy(p - HDR, &n, sizeof n);
    memcpy(p - sizeof(void *), &base, sizeof base);
    LIVE_BYTES_ADD(n);
    atomic_fetch_add(&live_blocks, 1);
    return p;
}

void tide_free_aligned(void *ptr) {
    if (!ptr) return;
    unsigned char *p = ptr;
    size_t n;
    void *base;
    memcpy(&n, p - HDR, sizeof n);
    memcpy(&base, p - sizeof(void *), sizeof base);
    LIVE_BYTES_ADD(-(long long)n);
    atomic_fetch_sub(&live_blocks, 1);
    raw_release(base);
}
