/*
 * test_async_backend.c - the asynchronous test double (async_backend.h) keeps
 * the promises of backend.h: synchronous calls return finished work; queues
 * run independently and are ordered only by events, which hold the data a
 * waiting queue reads; event_sync blocks until the work is done; an event
 * never recorded is complete; timings come from timing events only; a
 * failing asynchronous compute is returned once by synchronize, or by
 * queue_sync of its queue and of each queue whose work it skipped, on that
 * queue's context; queues are limited in number and reused; destroy drains
 * queued work.
 *
 * What it proves: the asynchronous test backend keeps backend.h's promises:
 * synchronous calls return finished work, queues are ordered by events only,
 * event_sync blocks, errors of queued work come back from synchronize, or
 * from queue_sync of the queues they touched, once and on the queue's own
 * context (two queues failing at once from two threads each keep their own
 * message), queues are limited in number and reused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "async_backend.h"
#include "backend/cpu/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ThreadSanitizer builds: the stale-data demonstration is a data race by
 * design, which TSan would rightly report. */
#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN 1
#endif
#endif

/* Single-threaded kernels: the lanes are the threads under test, and the
 * OpenMP runtime is not instrumented for ThreadSanitizer. */
static tide_ctx *ctx_new(void) {
    tide_ctx *ctx = tide_ctx_new();
    assert_non_null(ctx);
    tide_ctx_set_threads(ctx, 1);
    return ctx;
}

static tide_backend *async_new(tide_ctx *ctx, unsigned jitter_us, uint32_t seed) {
    tide_async_opts o = {.jitter_us = jitter_us, .seed = seed};
    tide_backend *be = NULL;
    tide_status st = tide_async_backend_new(ctx, &o, &be);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    return be;
}

/* A queue of be, errors on ctx. */
static void *qnew(tide_backend *be, tide_ctx *ctx, bool async) {
    void *q = NULL;
    assert_int_equal(be->vt->queue_new(be, ctx, async, &q), TIDE_OK);
    assert_non_null(q);
    assert_ptr_equal(tide_backend_queue_ctx(be, q), ctx);
    return q;
}

static void *event(tide_backend *be, bool timing) {
    void *ev = NULL;
    assert_int_equal(be->vt->event_new(be, timing, &ev), TIDE_OK);
    assert_non_null(ev);
    return ev;
}

static void fill(unsigned char *p, size_t n, unsigned salt) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + salt * 7 + 1);
}

/* c = a + b over one row of n floats. */
static tide_graph *add_graph(tide_ctx *ctx, int64_t n) {
    tide_graph *g = tide_graph_new(ctx);
    assert_non_null(g);
    int64_t shape[2] = {1, n};
    int t[3];
    assert_int_equal(tide_graph_add_tensor(g, "a", TIDE_F32, TIDE_ROLE_INPUT, 2, shape, &t[0]), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "b", TIDE_F32, TIDE_ROLE_INPUT, 2, shape, &t[1]), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "c", TIDE_F32, TIDE_ROLE_OUTPUT, 2, shape, &t[2]), TIDE_OK);
    tide_op_params p = {0};
    assert_int_equal(tide_graph_add_op(g, TIDE_OP_ADD, 2, t, 1, &t[2], &p, -1, NULL), TIDE_OK);
    return g;
}

/* Rows of a 4 x 8 table picked by two token ids. */
static tide_graph *embed_graph(tide_ctx *ctx) {
    tide_graph *g = tide_graph_new(ctx);
    assert_non_null(g);
    int64_t ts[2] = {4, 8}, ks[2] = {1, 2}, os[2] = {2, 8};
    int tab, tok, o;
    assert_int_equal(tide_graph_add_tensor(g, "table", TIDE_F32, TIDE_ROLE_WEIGHT, 2, ts, &tab), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "tokens", TIDE_I32, TIDE_ROLE_INPUT, 2, ks, &tok), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "rows", TIDE_F32, TIDE_ROLE_OUTPUT, 2, os, &o), TIDE_OK);
    int in[2] = {tab, tok};
    tide_op_params p = {0};
    assert_int_equal(tide_graph_add_op(g, TIDE_OP_EMBED, 2, in, 1, &o, &p, -1, NULL), TIDE_OK);
    return g;
}

/* The vtable is the CPU backend's with the asynchronous slots filled in. */
static void test_vtable(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_async_opts o = {.device_is_host = true};
    tide_backend *be = NULL;
    assert_int_equal(tide_async_backend_new(ctx, &o, &be), TIDE_OK);
    assert_string_equal(tide_backend_name(be), "cpu-async");
    assert_true(be->vt->device_is_host);
    assert_int_equal(be->kind, TIDE_BACKEND_CPU);
    assert_int_equal(be->matmul, tk_matmul_fast_native(TIDE_BF16) ? TIDE_MATMUL_FAST : TIDE_MATMUL_F32); /* the CPU's AUTO */
    assert_non_null(be->vt->synchronize);
    assert_non_null(be->vt->queue_sync);
    assert_true(tide_backend_has_events(be));
    assert_non_null(be->vt->event_elapsed);
    assert_null(be->vt->host_alloc);
    assert_null(be->vt->host_free);
    assert_null(be->vt->mem_info);
    assert_null(be->vt->file_read);
    tide_backend_free(be);
    be = async_new(ctx, 0, 1);
    assert_false(be->vt->device_is_host);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

/* Synchronous queues (the default one, or made so): every call returns with
 * its work done. */
static void test_sync_mode(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = async_new(ctx, 500, 11);
    enum { N = 1 << 16 };
    unsigned char *src = malloc(N), *dev = NULL, *dst = malloc(N);
    assert_int_equal(be->vt->alloc(be, N, (void **)&dev), TIDE_OK);
    tide_graph *g = add_graph(ctx, N / 4);
    float *a = malloc(N), *b = malloc(N), *c = malloc(N);
    for (int lane = -1; lane < 4; lane++) {
        void *q = lane >= 0 ? qnew(be, ctx, false) : NULL; /* -1: the default queue */
        for (int rep = 0; rep < 5; rep++) {
            fill(src, N, (unsigned)(lane * 5 + rep + 1));
            assert_int_equal(be->vt->to_device(be, q, dev, src, N), TIDE_OK);
            assert_memory_equal(dev, src, N);
            memset(dst, 0, N);
            assert_int_equal(be->vt->to_host(be, q, dst, dev, N), TIDE_OK);
            assert_memory_equal(dst, src, N);
            for (int i = 0; i < N / 4; i++) {
                a[i] = (float)(i + rep);
                b[i] = (float)lane;
            }
            void *in[2] = {a, b}, *out[1] = {c};
            assert_int_equal(be->vt->compute(be, q, g, &g->ops[0], in, out, NULL), TIDE_OK);
            for (int i = 0; i < N / 4; i++) assert_true(c[i] == (float)(i + rep + lane));
        }
        be->vt->queue_free(be, q);
    }
    assert_int_equal(be->vt->synchronize(be), TIDE_OK);
    uint64_t run = 0, blocked = 0;
    tide_async_backend_counts(be, &run, &blocked);
    assert_int_equal(run, 5 * 5 * 3);
    assert_int_equal(blocked, 0);
    be->vt->dealloc(be, dev);
    tide_backend_free(be);
    tide_graph_free(g);
    free(src);
    free(dst);
    free(a);
    free(b);
    free(c);
    tide_ctx_free(ctx);
}

/* Each copy waits its pseudo-random 0..jitter_us first: 20 copies of at most
 * 5 ms take about 50 ms (under 20 ms: less than one chance in a million). */
static void test_jitter(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = async_new(ctx, 5000, 2);
    unsigned char a[64] = {1}, b[64];
    double t0 = tide_now();
    for (int i = 0; i < 20; i++) assert_int_equal(be->vt->to_host(be, NULL, b, a, sizeof a), TIDE_OK);
    assert_true(tide_now() - t0 >= 0.020);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

/* Queue 1 writes a device buffer, queue 0 reads it; events order the two both
 * ways (read after write, next write after read), and the data is right every
 * time however the jitter falls. The reads alternate between a copy and a
 * compute (whose pointer arrays live on this stack frame only while queued). */
static void test_events_order_lanes(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = async_new(ctx, 300, 7);
    enum { ITERS = 150, N = 1 << 14, PIECES = 4 };
    float *mid = NULL, *ones = malloc(N * sizeof(float));
    assert_int_equal(be->vt->alloc(be, N * sizeof(float), (void **)&mid), TIDE_OK);
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    float *src = malloc((size_t)ITERS * N * sizeof(float)), *dst = calloc((size_t)ITERS * N, sizeof(float));
    for (size_t i = 0; i < (size_t)ITERS * N; i++) src[i] = (float)(i % 100003);
    tide_graph *g = add_graph(ctx, N);
    void *written = event(be, false), *read = event(be, false);
    void *q0 = qnew(be, ctx, true), *q1 = qnew(be, ctx, true);
    for (int it = 0; it < ITERS; it++) {
        assert_int_equal(be->vt->event_wait(be, q1, read), TIDE_OK);
        for (int p = 0; p < PIECES; p++) {
            size_t n = N / PIECES;
            assert_int_equal(be->vt->to_device(be, q1, mid + p * n, src + (size_t)it * N + p * n,
                                               n * sizeof(float)),
                             TIDE_OK);
        }
        assert_int_equal(be->vt->event_record(be, q1, written), TIDE_OK);
        assert_int_equal(be->vt->event_wait(be, q0, written), TIDE_OK);
        float *out = dst + (size_t)it * N;
        if (it % 2) {
            assert_int_equal(be->vt->to_host(be, q0, out, mid, N * sizeof(float)), TIDE_OK);
        } else {
            void *in[2] = {mid, ones}, *o[1] = {out};
            assert_int_equal(be->vt->compute(be, q0, g, &g->ops[0], in, o, NULL), TIDE_OK);
        }
        assert_int_equal(be->vt->event_record(be, q0, read), TIDE_OK);
    }
    assert_int_equal(be->vt->synchronize(be), TIDE_OK);
    for (int it = 0; it < ITERS; it++) {
        const float *want = src + (size_t)it * N, *got = dst + (size_t)it * N;
        for (int i = 0; i < N; i++)
            if (got[i] != want[i] + (it % 2 ? 0.0f : 1.0f))
                fail_msg("iteration %d, element %d: %g, expected %g", it, i, got[i],
                         want[i] + (it % 2 ? 0.0f : 1.0f));
    }
    uint64_t run = 0, blocked = 0;
    tide_async_backend_counts(be, &run, &blocked);
    assert_int_equal(run, (uint64_t)ITERS * (PIECES + 1));
    assert_true(blocked > 0); /* the queues really ran apart */
    be->vt->queue_free(be, q0);
    be->vt->queue_free(be, q1);
    be->vt->event_free(be, written);
    be->vt->event_free(be, read);
    be->vt->dealloc(be, mid);
    tide_backend_free(be);
    tide_graph_free(g);
    free(src);
    free(dst);
    free(ones);
    tide_ctx_free(ctx);
}

/* The jitter is real: without events, queue 0 runs ahead of queue 1. Seen
 * through timing events (no data race: what is compared is times), and, but
 * for TSan builds, as queue 0 copying stale bytes. */
static void test_unordered_lanes_race(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = async_new(ctx, 2000, 3);
    enum { N = 4 << 20, TRIES = 50 };
    unsigned char *src = malloc(N), *mid = NULL, *dst = malloc(N);
    memset(src, 0xa5, N);
    assert_int_equal(be->vt->alloc(be, N, (void **)&mid), TIDE_OK);
    void *e1 = event(be, true), *e0 = event(be, true);
    void *q0 = qnew(be, ctx, true), *q1 = qnew(be, ctx, true);
    /* ordered by an event: queue 0's mark never comes before queue 1's */
    for (int t = 0; t < 10; t++) {
        assert_int_equal(be->vt->to_device(be, q1, mid, src, N), TIDE_OK);
        assert_int_equal(be->vt->event_record(be, q1, e1), TIDE_OK);
        assert_int_equal(be->vt->event_wait(be, q0, e1), TIDE_OK);
        assert_int_equal(be->vt->event_record(be, q0, e0), TIDE_OK);
        assert_int_equal(be->vt->synchronize(be), TIDE_OK);
        double s = -1;
        assert_int_equal(be->vt->event_elapsed(be, e1, e0, &s), TIDE_OK);
        assert_true(s >= 0);
    }
    /* not ordered: queue 0's mark comes first at least once */
    bool ahead = false;
    for (int t = 0; t < TRIES && !ahead; t++) {
        assert_int_equal(be->vt->to_device(be, q1, mid, src, N), TIDE_OK);
        assert_int_equal(be->vt->event_record(be, q1, e1), TIDE_OK);
        assert_int_equal(be->vt->event_record(be, q0, e0), TIDE_OK);
        assert_int_equal(be->vt->synchronize(be), TIDE_OK);
        double s = 0;
        assert_int_equal(be->vt->event_elapsed(be, e1, e0, &s), TIDE_OK);
        ahead = s < 0;
    }
    assert_true(ahead);
#ifndef TSAN
    /* the same as data: queue 0 copies the buffer before queue 1 refilled it */
    bool stale = false;
    for (int t = 0; t < TRIES && !stale; t++) {
        memset(src, t + 1, N);
        assert_int_equal(be->vt->to_device(be, q1, mid, src, N), TIDE_OK);
        assert_int_equal(be->vt->to_host(be, q0, dst, mid, N), TIDE_OK);
        assert_int_equal(be->vt->synchronize(be), TIDE_OK);
        stale = memcmp(dst, src, N) != 0;
    }
    assert_true(stale);
#endif
    be->vt->queue_free(be, q0);
    be->vt->queue_free(be, q1);
    be->vt->event_free(be, e1);
    be->vt->event_free(be, e0);
    be->vt->dealloc(be, mid);
    tide_backend_free(be);
    free(src);
    free(dst);
    tide_ctx_free(ctx);
}

/* event_sync returns once the work before the record is done: the data can be
 * read without synchronize. */
static void test_event_sync(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = async_new(ctx, 20000, 5);
    enum { N = 1 << 20 };
    unsigned char *src = malloc(N), *dst = malloc(N);
    void *ev = event(be, false);
    void *q = qnew(be, ctx, true), *sq = qnew(be, ctx, false);
    for (int rep = 0; rep < 5; rep++) {
        fill(src, N, (unsigned)rep);
        memset(dst, 0, N);
        assert_int_equal(be->vt->to_device(be, q, dst, src, N / 2), TIDE_OK);
        assert_int_equal(be->vt->to_device(be, q, dst + N / 2, src + N / 2, N / 2), TIDE_OK);
        assert_int_equal(be->vt->event_record(be, q, ev), TIDE_OK);
        assert_int_equal(be->vt->event_sync(be, q, ev), TIDE_OK);
        assert_memory_equal(dst, src, N);
    }
    /* a record issued on a synchronous queue does not block its caller, and
     * still completes in order after that queue's work */
    assert_int_equal(be->vt->event_record(be, sq, ev), TIDE_OK);
    assert_int_equal(be->vt->event_sync(be, NULL, ev), TIDE_OK);
    be->vt->queue_free(be, q);
    be->vt->queue_free(be, sq);
    be->vt->event_free(be, ev);
    tide_backend_free(be);
    free(src);
    free(dst);
    tide_ctx_free(ctx);
}

/* An event never recorded is complete: waiting on it holds nothing back,
 * event_sync returns at once; it has no time to measure from. */
static void test_unrecorded_event(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = async_new(ctx, 100, 9);
    void *ev = event(be, true), *done = event(be, true);
    enum { N = 4096 };
    unsigned char src[N], dst[N];
    fill(src, N, 3);
    void *q = qnew(be, ctx, true);
    assert_int_equal(be->vt->event_wait(be, q, ev), TIDE_OK);
    assert_int_equal(be->vt->event_sync(be, q, ev), TIDE_OK);
    assert_int_equal(be->vt->to_host(be, q, dst, src, N), TIDE_OK);
    assert_int_equal(be->vt->queue_sync(be, q), TIDE_OK);
    assert_memory_equal(dst, src, N);
    uint64_t run = 0, blocked = 1;
    tide_async_backend_counts(be, &run, &blocked);
    assert_int_equal(run, 1);
    assert_int_equal(blocked, 0);
    assert_int_equal(be->vt->event_record(be, q, done), TIDE_OK);
    assert_int_equal(be->vt->event_sync(be, q, done), TIDE_OK);
    be->vt->queue_free(be, q);
    double s;
    assert_int_equal(be->vt->event_elapsed(be, ev, done, &s), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "never recorded"));
    be->vt->event_free(be, ev);
    be->vt->event_free(be, done);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

/* event_elapsed: seconds between two complete timing records, >= 0 in queue
 * order; events made without timing are refused. */
static void test_event_elapsed(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = async_new(ctx, 5000, 13);
    enum { N = 1 << 16 };
    unsigned char *src = calloc(N, 1), *dst = malloc(N);
    void *from = event(be, true), *to = event(be, true), *plain = event(be, false);
    void *q = qnew(be, ctx, true);
    for (int rep = 0; rep < 5; rep++) {
        assert_int_equal(be->vt->event_record(be, q, from), TIDE_OK);
        for (int i = 0; i < 3; i++) assert_int_equal(be->vt->to_host(be, q, dst, src, N), TIDE_OK);
        assert_int_equal(be->vt->event_record(be, q, to), TIDE_OK);
        assert_int_equal(be->vt->event_record(be, q, plain), TIDE_OK);
        assert_int_equal(be->vt->event_sync(be, q, plain), TIDE_OK);
        double s = -1;
        assert_int_equal(be->vt->event_elapsed(be, from, to, &s), TIDE_OK);
        assert_true(s >= 0 && s < 10);
        assert_int_equal(be->vt->event_elapsed(be, plain, to, &s), TIDE_E_INVALID);
        assert_non_null(strstr(tide_ctx_last_error(ctx), "timing"));
        assert_int_equal(be->vt->event_elapsed(be, from, plain, &s), TIDE_E_INVALID);
    }
    be->vt->queue_free(be, q);
    be->vt->event_free(be, from);
    be->vt->event_free(be, to);
    be->vt->event_free(be, plain);
    tide_backend_free(be);
    free(src);
    free(dst);
    tide_ctx_free(ctx);
}

/* A failing compute: asynchronous, it returns TIDE_OK, work ordered after it
 * (on its queue, and on another queue through an event) is skipped,
 * synchronize returns the error with its message once and then TIDE_OK, and
 * work runs again. Synchronous, the call itself fails and nothing is left
 * sticky. */
static void test_async_error(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = async_new(ctx, 200, 17);
    tide_graph *g = embed_graph(ctx);
    float table[4][8], rows[2][8];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 8; c++) table[r][c] = (float)(r * 10 + c);
    int32_t tok[2] = {1, 9};
    void *in[2] = {table, tok}, *out[1] = {rows};
    unsigned char src[256], dst0[256] = {0}, dst2[256] = {0};
    fill(src, sizeof src, 1);
    void *ev = event(be, false);
    void *q0 = qnew(be, ctx, true), *q1 = qnew(be, ctx, false), *q2 = qnew(be, ctx, true);
    assert_int_equal(be->vt->compute(be, q0, g, &g->ops[0], in, out, NULL), TIDE_OK);
    assert_int_equal(be->vt->to_host(be, q0, dst0, src, sizeof src), TIDE_OK);
    assert_int_equal(be->vt->event_record(be, q0, ev), TIDE_OK);
    assert_int_equal(be->vt->event_wait(be, q2, ev), TIDE_OK);
    assert_int_equal(be->vt->to_host(be, q2, dst2, src, sizeof src), TIDE_OK);
    tide_err_clear(ctx);
    assert_int_equal(be->vt->synchronize(be), TIDE_E_RANGE);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "outside the vocabulary"));
    assert_non_null(strstr(tide_ctx_last_error(ctx), "tokens"));
    unsigned char zero[256] = {0};
    assert_memory_equal(dst0, zero, sizeof zero);
    assert_memory_equal(dst2, zero, sizeof zero);
    uint64_t run = 0;
    tide_async_backend_counts(be, &run, NULL);
    assert_int_equal(run, 1); /* the compute; both copies were skipped */
    assert_int_equal(be->vt->synchronize(be), TIDE_OK);
    assert_int_equal(be->vt->queue_sync(be, q0), TIDE_OK); /* cleared for the queues too */
    assert_int_equal(be->vt->queue_sync(be, q2), TIDE_OK);
    /* cleared: work runs again */
    assert_int_equal(be->vt->to_host(be, q2, dst2, src, sizeof src), TIDE_OK);
    tok[1] = 3;
    assert_int_equal(be->vt->compute(be, q0, g, &g->ops[0], in, out, NULL), TIDE_OK);
    assert_int_equal(be->vt->synchronize(be), TIDE_OK);
    assert_memory_equal(dst2, src, sizeof src);
    assert_memory_equal(rows[0], table[1], sizeof rows[0]);
    assert_memory_equal(rows[1], table[3], sizeof rows[1]);
    /* synchronous: the call fails itself, later calls and synchronize are fine */
    tok[0] = 4;
    tide_err_clear(ctx);
    assert_int_equal(be->vt->compute(be, q1, g, &g->ops[0], in, out, NULL), TIDE_E_RANGE);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "outside the vocabulary"));
    tok[0] = 2;
    assert_int_equal(be->vt->compute(be, q1, g, &g->ops[0], in, out, NULL), TIDE_OK);
    assert_memory_equal(rows[0], table[2], sizeof rows[0]);
    assert_int_equal(be->vt->synchronize(be), TIDE_OK);
    /* a synchronous call skipped behind an asynchronous failure reports it
     * (the default queue, held by an event until the failure has run) */
    tok[0] = 7;
    assert_int_equal(be->vt->compute(be, q0, g, &g->ops[0], in, out, NULL), TIDE_OK);
    assert_int_equal(be->vt->event_record(be, q0, ev), TIDE_OK);
    assert_int_equal(be->vt->event_wait(be, NULL, ev), TIDE_OK);
    assert_int_equal(be->vt->to_host(be, NULL, dst0, src, sizeof src), TIDE_E_RANGE);
    assert_memory_equal(dst0, zero, sizeof zero);
    assert_int_equal(be->vt->synchronize(be), TIDE_E_RANGE);
    assert_int_equal(be->vt->synchronize(be), TIDE_OK);
    be->vt->queue_free(be, q0);
    be->vt->queue_free(be, q1);
    be->vt->queue_free(be, q2);
    be->vt->event_free(be, ev);
    tide_backend_free(be);
    tide_graph_free(g);
    tide_ctx_free(ctx);
}

/* Errors go to the context of the queue the call was made on, never to the
 * backend's: a failing asynchronous compute on queue A is returned once by
 * queue_sync(A), on A's context; queue B, whose copy it skipped, returns it
 * too, on B's context; a third queue that ran before is clean; then work runs
 * again. Two queues failing at once, from two threads, each find their own
 * message on their own context. */
typedef struct fail_arg {
    tide_backend *be;
    void *q;
    const tide_graph *g;
    int32_t tok[2];
    float table[4][8], rows[2][8];
    tide_status st;
} fail_arg;

static void *fail_thread(void *p) {
    fail_arg *f = p;
    void *in[2] = {f->table, f->tok}, *out[1] = {f->rows};
    f->st = f->be->vt->compute(f->be, f->q, f->g, &f->g->ops[0], in, out, NULL);
    return NULL;
}

static void test_queue_errors(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new(), *ca = ctx_new(), *cb = ctx_new(), *cc = ctx_new();
    tide_backend *be = async_new(ctx, 300, 29);
    tide_graph *g = embed_graph(ctx);
    float table[4][8] = {{0}}, rows[2][8];
    int32_t tok[2] = {0, 11};
    void *in[2] = {table, tok}, *out[1] = {rows};
    unsigned char src[64], dst[64] = {0}, dc[64] = {0};
    fill(src, sizeof src, 2);
    void *ev = event(be, false);
    void *qa = qnew(be, ca, true), *qb = qnew(be, cb, true), *qc = qnew(be, cc, true);
    assert_int_equal(be->vt->to_host(be, qc, dc, src, sizeof src), TIDE_OK);
    assert_int_equal(be->vt->queue_sync(be, qc), TIDE_OK);
    assert_int_equal(be->vt->compute(be, qa, g, &g->ops[0], in, out, NULL), TIDE_OK);
    assert_int_equal(be->vt->event_record(be, qa, ev), TIDE_OK);
    assert_int_equal(be->vt->event_wait(be, qb, ev), TIDE_OK);
    assert_int_equal(be->vt->to_host(be, qb, dst, src, sizeof src), TIDE_OK);
    /* B first: its copy, held by the event, has then run (skipped) before
     * A's wait clears the backend's sticky error */
    assert_int_equal(be->vt->queue_sync(be, qb), TIDE_E_RANGE);
    assert_non_null(strstr(tide_ctx_last_error(cb), "outside the vocabulary"));
    assert_int_equal(be->vt->queue_sync(be, qb), TIDE_OK);
    assert_int_equal(be->vt->queue_sync(be, qa), TIDE_E_RANGE);
    assert_non_null(strstr(tide_ctx_last_error(ca), "outside the vocabulary"));
    assert_int_equal(be->vt->queue_sync(be, qa), TIDE_OK);
    assert_int_equal(be->vt->queue_sync(be, qc), TIDE_OK);
    assert_string_equal(tide_ctx_last_error(cc), "");
    assert_string_equal(tide_ctx_last_error(ctx), ""); /* nothing on the backend's */
    unsigned char zero[64] = {0};
    assert_memory_equal(dst, zero, sizeof dst); /* skipped */
    assert_memory_equal(dc, src, sizeof dc);
    /* cleared: work runs again on B */
    assert_int_equal(be->vt->to_host(be, qb, dst, src, sizeof src), TIDE_OK);
    assert_int_equal(be->vt->queue_sync(be, qb), TIDE_OK);
    assert_memory_equal(dst, src, sizeof dst);
    assert_int_equal(be->vt->synchronize(be), TIDE_OK);
    be->vt->queue_free(be, qa);
    be->vt->queue_free(be, qb);
    be->vt->queue_free(be, qc);

    /* two synchronous queues failing at the same time from two threads */
    tide_err_clear(ca);
    tide_err_clear(cb);
    fail_arg fa[2];
    tide_ctx *fc[2] = {ca, cb};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        fa[k] = (fail_arg){.be = be, .q = qnew(be, fc[k], false), .g = g, .tok = {0, 20 + k}};
    }
    for (int k = 0; k < 2; k++) assert_int_equal(pthread_create(&th[k], NULL, fail_thread, &fa[k]), 0);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(fa[k].st, TIDE_E_RANGE);
        char want[32];
        snprintf(want, sizeof want, "token id %d", 20 + k);
        if (!strstr(tide_ctx_last_error(fc[k]), want))
            fail_msg("queue %d: message '%s', want '%s'", k, tide_ctx_last_error(fc[k]), want);
        be->vt->queue_free(be, fa[k].q);
    }
    assert_string_equal(tide_ctx_last_error(ctx), "");
    be->vt->event_free(be, ev);
    tide_backend_free(be);
    tide_graph_free(g);
    tide_ctx_free(ca);
    tide_ctx_free(cb);
    tide_ctx_free(cc);
    tide_ctx_free(ctx);
}

/* At most TIDE_ASYNC_MAX_QUEUES queues, the default one included: one more
 * is refused on the caller's context, with no queue; a freed one makes room.
 * Queue errors never reach the backend's context. */
static void test_queue_limit(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new(), *qctx = ctx_new();
    tide_backend *be = async_new(ctx, 0, 1);
    void *q[TIDE_ASYNC_MAX_QUEUES];
    for (int i = 0; i < TIDE_ASYNC_MAX_QUEUES - 1; i++) q[i] = qnew(be, qctx, i % 2);
    void *extra = (void *)1;
    assert_int_equal(be->vt->queue_new(be, qctx, true, &extra), TIDE_E_UNSUPPORTED);
    assert_null(extra);
    assert_non_null(strstr(tide_ctx_last_error(qctx), "queues"));
    assert_string_equal(tide_ctx_last_error(ctx), "");
    be->vt->queue_free(be, q[5]);
    q[5] = qnew(be, qctx, false);
    be->vt->queue_free(be, NULL);
    for (int i = 0; i < TIDE_ASYNC_MAX_QUEUES - 1; i++) be->vt->queue_free(be, q[i]);
    tide_backend_free(be);
    tide_ctx_free(qctx);
    tide_ctx_free(ctx);
}

/* Destroy with work queued on every queue, waits across queues and events
 * already freed: it runs everything, then returns (no hang; ASan: no leak).
 * With an asynchronous failure first, everything ordered after it is skipped
 * but still drained. Queues not freed are freed with the backend. */
static void test_destroy_queued(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    enum { N = 1 << 18, PER = 10, NQ = 4 };
    unsigned char *src = malloc(N), *zero = calloc(N, 1), *dst[NQ];
    fill(src, N, 5);
    tide_graph *g = embed_graph(ctx);
    float table[4][8] = {{0}}, rows[2][8];
    int32_t tok[2] = {0, 99};
    for (int round = 0; round < 3; round++) {
        bool fail = round == 1;
        tide_backend *be = async_new(ctx, 1000, (uint32_t)(round + 21));
        void *ev[NQ], *q[NQ];
        for (int l = 0; l < NQ; l++) {
            dst[l] = calloc(N, 1);
            ev[l] = event(be, l % 2);
            q[l] = qnew(be, ctx, true);
        }
        for (int l = 0; l < NQ; l++) {
            if (l) assert_int_equal(be->vt->event_wait(be, q[l], ev[l - 1]), TIDE_OK);
            if (!l && fail) {
                void *in[2] = {table, tok}, *out[1] = {rows};
                assert_int_equal(be->vt->compute(be, q[l], g, &g->ops[0], in, out, NULL), TIDE_OK);
            }
            for (int i = 0; i < PER; i++) assert_int_equal(be->vt->to_device(be, q[l], dst[l], src, N), TIDE_OK);
            assert_int_equal(be->vt->event_record(be, q[l], ev[l]), TIDE_OK);
        }
        for (int l = 0; l < NQ; l++) be->vt->event_free(be, ev[l]);
        tide_backend_free(be);
        for (int l = 0; l < NQ; l++) {
            assert_memory_equal(dst[l], fail ? zero : src, N); /* drained: run, or skipped after the failure */
            free(dst[l]);
        }
    }
    tide_graph_free(g);
    free(src);
    free(zero);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vtable),
        cmocka_unit_test(test_sync_mode),
        cmocka_unit_test(test_jitter),
        cmocka_unit_test(test_events_order_lanes),
        cmocka_unit_test(test_unordered_lanes_race),
        cmocka_unit_test(test_event_sync),
        cmocka_unit_test(test_unrecorded_event),
        cmocka_unit_test(test_event_elapsed),
        cmocka_unit_test(test_async_error),
        cmocka_unit_test(test_queue_errors),
        cmocka_unit_test(test_queue_limit),
        cmocka_unit_test(test_destroy_queued),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
