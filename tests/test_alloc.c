/*
 * test_alloc.c - the allocation hooks (src/core/alloc.c): a caller's own
 * allocator receives every allocation of the library and gets every block
 * back; an allocator that refuses makes the library report TIDE_E_NOMEM
 * instead of crashing; it cannot be swapped while blocks of the current one
 * are live, blocks of 0 bytes included; aligned blocks are aligned.
 *
 * What it proves: a caller's allocator (`tide_set_allocator`) receives every
 * allocation of planning a model and gets every block back; one that refuses
 * at any point gives TIDE_E_NOMEM with nothing leaked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/alloc_test.h"
#include "core/core.h"
#include "planner/planner.h"
#include "verify/verify.h"

#include <stdlib.h>
#include <string.h>

typedef struct counting {
    long allocs, resizes, releases;
    long refuse_after; /* > 0: allocations beyond this many fail */
} counting;

static void *c_alloc(void *u, size_t n) {
    counting *c = u;
    if (c->refuse_after > 0 && c->allocs >= c->refuse_after) return NULL;
    c->allocs++;
    return malloc(n);
}
static void *c_resize(void *u, void *p, size_t n) {
    counting *c = u;
    c->resizes++;
    return realloc(p, n);
}
static void c_release(void *u, void *p) {
    counting *c = u;
    c->releases++;
    free(p);
}

/* Plans and verifies a small LLaMA graph: tables, a graph, a plan. */
static tide_status plan_something(tide_ctx *ctx) {
    tide_llama_config cfg;
    tide_status st = tide_llama_config_named(ctx, "tinyllama-1.1b", &cfg);
    if (st) return st;
    cfg.num_hidden_layers = 2;
    tide_llama_graph_opts go = {.batch = 1, .seq = 16};
    tide_graph *g = NULL;
    if ((st = tide_llama_build(ctx, &cfg, &go, &g))) return st;
    tide_hw hw;
    if ((st = tide_hw_load(ctx, "h100-80g", &hw))) {
        tide_graph_free(g);
        return st;
    }
    tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw,
                        .device_budget = tide_plan_unconstrained_peak(ctx, g, &hw, 1) / 2};
    tide_plan *p = NULL;
    st = tide_plan_make(ctx, g, &o, &p);
    if (!st) st = tide_plan_verify(p);
    tide_plan_free(p);
    tide_graph_free(g);
    return st;
}

static void test_caller_allocator(void **state) {
    (void)state;
    assert_int_equal(tide_alloc_live_bytes(), 0);
    counting c = {0};
    tide_allocator a = {c_alloc, c_resize, c_release, &c};
    assert_int_equal(tide_set_allocator(&a), TIDE_OK);
    tide_ctx *ctx = tide_ctx_new();
    assert_non_null(ctx);
    assert_int_equal(tide_set_allocator(NULL), TIDE_E_INVALID); /* the context is live */
    tide_status st = plan_something(ctx);
    if (st) fail_msg("planning: %s", tide_ctx_last_error(ctx));
    void *al = tide_malloc_aligned(1000, 4096);
    assert_non_null(al);
    assert_int_equal((uintptr_t)al % 4096, 0);
    memset(al, 1, 1000);
    tide_free_aligned(al);
    tide_ctx_free(ctx);
    assert_int_equal(tide_alloc_live_bytes(), 0);
    print_message("    %ld allocations, %ld resizes, %ld releases through the caller's allocator\n", c.allocs,
                  c.resizes, c.releases);
    assert_true(c.allocs > 100);
    assert_int_equal(c.allocs, c.releases);
    assert_int_equal(tide_set_allocator(NULL), TIDE_OK);
    tide_allocator bad = {c_alloc, NULL, c_release, &c};
    assert_int_equal(tide_set_allocator(&bad), TIDE_E_INVALID);
}

/* A live block of 0 bytes (plain or aligned) holds the allocator as any
 * other does: no swap until it is freed, and it goes back to the allocator
 * that made it. */
static void test_zero_byte_blocks(void **state) {
    (void)state;
    assert_int_equal(tide_alloc_live_bytes(), 0);
    counting c = {0}, other = {0};
    tide_allocator a = {c_alloc, c_resize, c_release, &c}, b = {c_alloc, c_resize, c_release, &other};
    assert_int_equal(tide_set_allocator(&a), TIDE_OK);
    void *p = tide_malloc(0), *q = tide_malloc_aligned(0, 64);
    assert_non_null(p);
    assert_non_null(q);
    assert_int_equal(tide_alloc_live_bytes(), 0); /* no bytes, two blocks */
    assert_int_equal(tide_set_allocator(NULL), TIDE_E_INVALID);
    assert_int_equal(tide_set_allocator(&b), TIDE_E_INVALID);
    tide_free(p);
    assert_int_equal(tide_set_allocator(NULL), TIDE_E_INVALID); /* q is still live */
    tide_free_aligned(q);
    assert_int_equal(c.allocs, 2);
    assert_int_equal(c.releases, 2);
    assert_int_equal(other.allocs + other.releases, 0);
    assert_int_equal(tide_set_allocator(NULL), TIDE_OK);
}

/* An allocator that refuses after k blocks, for every k up to success:
 * TIDE_E_NOMEM (with a message) or success, and nothing leaked. */
static void test_refusing_allocator(void **state) {
    (void)state;
    int nomem = 0;
    for (long k = 1;; k++) {
        counting c = {.refuse_after = k};
        tide_allocator a = {c_alloc, c_resize, c_release, &c};
        assert_int_equal(tide_set_allocator(&a), TIDE_OK);
        tide_ctx *ctx = tide_ctx_new();
        tide_status st = ctx ? plan_something(ctx) : TIDE_E_NOMEM;
        if (st && st != TIDE_E_NOMEM) fail_msg("allocation %ld refused: %s (%s)", k, tide_status_str(st),
                                               tide_ctx_last_error(ctx));
        if (st && ctx) assert_true(strlen(tide_ctx_last_error(ctx)) > 0);
        tide_ctx_free(ctx);
        assert_int_equal(tide_alloc_live_bytes(), 0);
        assert_int_equal(c.allocs, c.releases);
        assert_int_equal(tide_set_allocator(NULL), TIDE_OK);
        if (!st) break;
        nomem++;
        if (k > 200) k += k / 8; /* the rest by larger steps */
    }
    print_message("    %d refusals reported as out of memory, none leaked\n", nomem);
    assert_true(nomem > 50);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caller_allocator),
        cmocka_unit_test(test_zero_byte_blocks),
        cmocka_unit_test(test_refusing_allocator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
