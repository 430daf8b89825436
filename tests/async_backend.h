/*
 * async_backend.h - a test double: the CPU backend behind truly asynchronous
 * queues, so that the use of queues and events (backend.h) can be tested,
 * under ThreadSanitizer too, on a machine without a GPU.
 *
 * The backend ("cpu-async") has a default queue and makes more with
 * queue_new, each a worker thread that runs its items in order: COMPUTE (the
 * CPU kernels), COPY (memcpy: device memory is host memory here, whatever
 * device_is_host says), RECORD and WAIT (events). Before each COMPUTE or COPY
 * a queue's thread sleeps a pseudo-random 0..jitter_us microseconds, so that
 * an order the caller forgot to enforce shows up as wrong data or as a
 * reported race rather than happening to hold because the work was quick.
 *
 * Semantics, as backend.h documents them for a CUDA-like backend:
 *   - Queues belong to the instance: two threads (two executors) that each
 *     made their own never share one, and nothing is bound to a thread. The
 *     default queue (q == NULL) is synchronous and records errors on
 *     be->ctx; a queue from queue_new records them on the context it was
 *     made with. At most TIDE_ASYNC_MAX_QUEUES queues, the default included.
 *   - Synchronous queue: a call queues its item and waits until the queue has
 *     run it (and so everything queued before it); it returns the item's
 *     status. Asynchronous queue: the call queues and returns TIDE_OK.
 *   - A compute queued asynchronously keeps pointers to the graph and the op:
 *     they must live until the work is complete (the pointer arrays are copied).
 *   - An asynchronous COMPUTE that fails leaves a sticky error on the backend
 *     (the first one wins) and on its queue. While the backend's is set,
 *     COMPUTE and COPY items on every queue are skipped (RECORD and WAIT
 *     still run, so nothing waits forever): a synchronous call that is skipped
 *     returns the sticky error, an asynchronous item skipped leaves it on its
 *     own queue too (its work did not run, as on a GPU whose context has
 *     faulted). queue_sync waits for what was issued on its queue before it,
 *     then returns that queue's error and clears it, and the backend's too
 *     when it came from that queue (work held behind the failure by an
 *     event and not run yet then runs again: wait for it first to see it
 *     skipped). synchronize waits for all work issued
 *     before it on every queue, then returns the backend's sticky error (else
 *     the first queue's) and clears them all. A synchronous COMPUTE that
 *     fails returns its error to its caller only: it is not sticky, as on
 *     the plain CPU backend.
 *   - Events count records issued (`recorded`) and the highest record a queue
 *     has reached (`completed`); an event never recorded counts as complete.
 *     Every hand-over between threads goes through a mutex (of a queue or of
 *     an event), so that ThreadSanitizer sees the order the caller asked for,
 *     and only that.
 *   - event_free may come while queued items still name the event: those hold
 *     references, and the last one frees it.
 *   - dealloc waits for every queue's queued work first, as cudaFree does;
 *     queue_free for its queue's.
 *
 * The double's own memory (queues, events, the backend struct) comes from the
 * C library, not the tide_malloc hooks: which allocation is "the Nth" must not
 * depend on how queues interleave, or fault-injection tests would stop being
 * reproducible. Every queue's thread owns a tide_ctx (contexts are not
 * thread-safe) and a CPU backend on it, so kernel messages are written there
 * and copied onto the queue's context by the thread that issued the call
 * (synchronous items) or by queue_sync and synchronize (asynchronous ones).
 *
 * Header-only, every function static: each test program that includes it gets
 * its own copy.
 */
#ifndef TIDE_TEST_ASYNC_BACKEND_H
#define TIDE_TEST_ASYNC_BACKEND_H

#include "backend/backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TIDE_ASYNC_MAX_QUEUES = 64 };

typedef struct tide_async_opts {
    unsigned jitter_us;  /* most microseconds a queue sleeps before a COMPUTE or COPY (0: none) */
    uint32_t seed;       /* of the queues' jitter sequences */
    bool device_is_host; /* reported in the vtable: false takes the executor's GPU paths */
} tide_async_opts;

typedef struct ta_event {
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* `completed` grew */
    uint64_t recorded;   /* records issued */
    uint64_t completed;  /* highest record generation a queue has reached */
    double time;         /* tide_now() when `completed` last grew */
    bool timing;
    int refs;            /* the owner's, plus one per queued item naming it */
} ta_event;

typedef enum { TA_COMPUTE, TA_COPY, TA_RECORD, TA_WAIT } ta_kind;

/* A synchronous caller's item outcome, on the caller's stack; written by the
 * queue's thread under the queue's mutex. */
typedef struct ta_result {
    bool done;
    tide_status status;
    char msg[TIDE_ERRMSG_MAX];
} ta_result;

typedef struct ta_item {
    ta_kind kind;
    uint64_t seq;    /* its place on the queue: 1, 2, ... */
    ta_result *res;  /* NULL: issued asynchronously */
    /* COMPUTE */
    const tide_graph *g;
    const tide_op *op;
    void *in[TIDE_OP_MAX_IN], *out[TIDE_OP_MAX_OUT], *scratch;
    int n_threads;   /* the issuing queue's context's thread count */
    tide_matmul_mode matmul;
    /* COPY */
    void *dst;
    const void *src;
    size_t n;
    /* RECORD, WAIT */
    ta_event *ev;
    uint64_t gen;
} ta_item;

struct ta_async;

typedef struct ta_queue {
    tide_ctx *ctx;          /* where errors of calls on it go (the default queue: be->ctx);
                               first, as backend.h asks */
    struct ta_async *a;
    int index;              /* 0 the default queue, then 1, 2, ... in order of creation */
    bool async;
    pthread_mutex_t mu;
    pthread_cond_t more;    /* an item was queued, or stop was set */
    pthread_cond_t done_cv; /* an item finished */
    ta_item *q;             /* ring of cap items: count of them from head */
    size_t cap, head, count;
    uint64_t issued, done;  /* seq of the last item queued / finished */
    bool stop;
    uint32_t rng;           /* jitter state; only the queue's thread touches it */
    tide_ctx *kctx;         /* the queue thread's own: kernel messages land here */
    tide_backend *cpu;      /* a CPU backend on kctx */
    tide_status err;        /* deferred error of its asynchronous items (a->err_mu) */
    char err_msg[TIDE_ERRMSG_MAX];
    pthread_t thread;
    bool started;
    struct ta_queue *next;  /* the instance's list (a->mu) */
} ta_queue;

typedef struct ta_async {
    tide_backend_vt vt;
    tide_backend *inner;    /* on the caller's context: alloc and dealloc */
    unsigned jitter_us;
    uint32_t seed;
    pthread_mutex_t mu;     /* guards the list, held while a caller waits on all of it */
    ta_queue *queues;       /* every queue, newest first; the default one is `def` */
    ta_queue *def;
    int n_queues, next_index;
    pthread_mutex_t err_mu; /* guards the sticky error and every queue's err */
    tide_status err;
    char err_msg[TIDE_ERRMSG_MAX];
    ta_queue *err_from;     /* the queue whose item set it */
    atomic_uint_least64_t items_run, waits_blocked;
} ta_async;

static ta_queue *ta_queue_of(tide_backend *be, void *q) {
    return q ? (ta_queue *)q : ((ta_async *)be->impl)->def;
}

/* ------------------------------------------------------------------ events */

/* Drops one reference; called with e->mu held, returns with it released. The
 * last holder frees the event: everyone else let go of the mutex before it
 * could take it. */
static void ta_event_release(ta_event *e) {
    bool last = --e->refs == 0;
    pthread_mutex_unlock(&e->mu);
    if (last) {
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->mu);
        free(e);
    }
}

static tide_status ta_event_new(tide_backend *be, bool timing, void **ev) {
    *ev = NULL;
    ta_event *e = calloc(1, sizeof *e);
    if (!e) return tide_err(be->ctx, TIDE_E_NOMEM, "cpu-async: out of memory creating an event");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->timing = timing;
    e->refs = 1;
    *ev = e;
    return TIDE_OK;
}

static void ta_event_free(tide_backend *be, void *ev) {
    ta_event *e = ev;
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    ta_event_release(e);
}

/* ------------------------------------------------------------------ queues */

static uint32_t ta_rand(uint32_t *s) {
    /* xorshift32: the state is never 0 */
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

static void ta_jitter(ta_queue *l) {
    unsigned max = l->a->jitter_us;
    if (!max) return;
    unsigned us = ta_rand(&l->rng) % (max + 1);
    if (!us) return;
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Records an asynchronous item's error s (message m) on its queue l, and on
 * the backend when `sticky` (a failure, not a skip); first ones win. */
static void ta_defer(ta_queue *l, tide_status s, const char *m, bool sticky) {
    ta_async *a = l->a;
    pthread_mutex_lock(&a->err_mu);
    if (sticky && !a->err) {
        a->err = s;
        snprintf(a->err_msg, sizeof a->err_msg, "%s", m);
        a->err_from = l;
    }
    if (!l->err) {
        l->err = s;
        snprintf(l->err_msg, sizeof l->err_msg, "%s", m);
    }
    pthread_mutex_unlock(&a->err_mu);
}

/* Runs one item on queue l; for a synchronous item, its status and message
 * go to *st and msg. */
static void ta_run(ta_queue *l, ta_item *it, tide_status *st, char *msg) {
    ta_async *a = l->a;
    ta_event *e = it->ev;
    switch (it->kind) {
    case TA_RECORD:
        pthread_mutex_lock(&e->mu);
        /* records of one event issued on two queues may finish out of order:
         * the time is that of the highest generation */
        if (it->gen > e->completed) {
            e->completed = it->gen;
            e->time = tide_now();
            pthread_cond_broadcast(&e->cv);
        }
        ta_event_release(e);
        return;
    case TA_WAIT:
        pthread_mutex_lock(&e->mu);
        if (e->completed < it->gen) {
            atomic_fetch_add(&a->waits_blocked, 1);
            while (e->completed < it->gen) pthread_cond_wait(&e->cv, &e->mu);
        }
        ta_event_release(e);
        return;
    case TA_COMPUTE:
    case TA_COPY:
        break;
    }
    char m[TIDE_ERRMSG_MAX];
    pthread_mutex_lock(&a->err_mu);
    tide_status sticky = a->err;
    if (sticky) memcpy(m, a->err_msg, sizeof m);
    pthread_mutex_unlock(&a->err_mu);
    if (sticky) {
        *st = sticky;
        if (it->res) memcpy(msg, m, sizeof m);
        else ta_defer(l, sticky, m, false);
        return;
    }
    ta_jitter(l);
    atomic_fetch_add(&a->items_run, 1);
    if (it->kind == TA_COPY) {
        if (it->n) memcpy(it->dst, it->src, it->n);
        return;
    }
    tide_ctx_set_threads(l->kctx, it->n_threads);
    tide_err_clear(l->kctx);
    l->cpu->matmul = it->matmul;
    tide_status s = l->cpu->vt->compute(l->cpu, NULL, it->g, it->op, it->in, it->out, it->scratch);
    if (!s) return;
    if (tide_ctx_last_error(l->kctx)[0])
        snprintf(m, sizeof m, "%s", tide_ctx_last_error(l->kctx));
    else
        snprintf(m, sizeof m, "cpu-async: %s failed (%s)", tide_op_name(it->op->kind), tide_status_str(s));
    *st = s;
    if (it->res) memcpy(msg, m, sizeof m);
    else ta_defer(l, s, m, true);
}

static void *ta_queue_main(void *arg) {
    ta_queue *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->count && !l->stop) pthread_cond_wait(&l->more, &l->mu);
        if (!l->count) break; /* stopped, and drained */
        ta_item it = l->q[l->head];
        l->head = (l->head + 1) % l->cap;
        l->count--;
        pthread_mutex_unlock(&l->mu);
        tide_status st = TIDE_OK;
        char msg[TIDE_ERRMSG_MAX] = "";
        ta_run(l, &it, &st, msg);
        pthread_mutex_lock(&l->mu);
        l->done = it.seq;
        if (it.res) {
            it.res->status = st;
            memcpy(it.res->msg, msg, sizeof msg);
            it.res->done = true;
        }
        pthread_cond_broadcast(&l->done_cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Makes room for one more item on l (l->mu held); false when out of memory. */
static bool ta_reserve(ta_queue *l) {
    if (l->count < l->cap) return true;
    size_t cap = l->cap ? 2 * l->cap : 64;
    ta_item *q = malloc(cap * sizeof *q);
    if (!q) return false;
    for (size_t i = 0; i < l->count; i++) q[i] = l->q[(l->head + i) % l->cap];
    free(l->q);
    l->q = q;
    l->cap = cap;
    l->head = 0;
    return true;
}

/* Appends it to l (l->mu held, room reserved). */
static void ta_push(ta_queue *l, ta_item *it) {
    it->seq = ++l->issued;
    l->q[(l->head + l->count++) % l->cap] = *it;
    pthread_cond_signal(&l->more);
}

static tide_status ta_nomem(ta_queue *l) {
    return tide_err(l->ctx, TIDE_E_NOMEM, "cpu-async: out of memory queueing work on queue %d", l->index);
}

/* Queues a COMPUTE or COPY on l; on a synchronous queue waits for it and
 * returns its status. */
static tide_status ta_issue(ta_queue *l, ta_item *it) {
    ta_result res = {.done = false};
    it->res = l->async ? NULL : &res;
    pthread_mutex_lock(&l->mu);
    if (!ta_reserve(l)) {
        pthread_mutex_unlock(&l->mu);
        return ta_nomem(l);
    }
    ta_push(l, it);
    if (it->res)
        while (!res.done) pthread_cond_wait(&l->done_cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
    if (res.status) return tide_err(l->ctx, res.status, "%s", res.msg);
    return TIDE_OK;
}

/* Waits until l has run what was queued on it before this call. */
static void ta_drain_one(ta_queue *l) {
    pthread_mutex_lock(&l->mu);
    uint64_t upto = l->issued;
    while (l->done < upto) pthread_cond_wait(&l->done_cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
}

/* Stops l's thread once it has run everything queued, then frees l (not
 * linked in any list any more). Also frees a half-built queue. */
static void ta_queue_destroy(ta_queue *l) {
    if (l->started) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_signal(&l->more);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    tide_backend_free(l->cpu);
    tide_ctx_free(l->kctx);
    free(l->q);
    pthread_cond_destroy(&l->done_cv);
    pthread_cond_destroy(&l->more);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

/* A new queue with its thread started, errors on ctx; not linked yet. */
static tide_status ta_queue_make(ta_async *a, int index, tide_ctx *ctx, bool async, ta_queue **out) {
    *out = NULL;
    ta_queue *l = calloc(1, sizeof *l);
    if (!l) return tide_err(ctx, TIDE_E_NOMEM, "cpu-async: out of memory creating queue %d", index);
    l->a = a;
    l->index = index;
    l->ctx = ctx;
    l->async = async;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->more, NULL);
    pthread_cond_init(&l->done_cv, NULL);
    l->rng = (a->seed ^ 0x9e3779b9u * (uint32_t)(index + 1)) | 1;
    l->kctx = tide_ctx_new();
    if (!l->kctx || tide_cpu_backend_new(l->kctx, &l->cpu)) {
        ta_queue_destroy(l);
        return tide_err(ctx, TIDE_E_NOMEM, "cpu-async: out of memory creating queue %d", index);
    }
    int rc = pthread_create(&l->thread, NULL, ta_queue_main, l);
    if (rc) {
        ta_queue_destroy(l);
        return tide_err(ctx, TIDE_E_BACKEND, "cpu-async: cannot start queue %d: %s", index, strerror(rc));
    }
    l->started = true;
    *out = l;
    return TIDE_OK;
}

static tide_status ta_queue_new(tide_backend *be, tide_ctx *ctx, bool async, void **q) {
    ta_async *a = be->impl;
    *q = NULL;
    pthread_mutex_lock(&a->mu);
    bool room = a->n_queues < TIDE_ASYNC_MAX_QUEUES;
    int index = room ? a->next_index++ : -1;
    if (room) a->n_queues++; /* reserved while it is made */
    pthread_mutex_unlock(&a->mu);
    if (!room)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "cpu-async: this backend has its %d queues already",
                        TIDE_ASYNC_MAX_QUEUES);
    ta_queue *l = NULL;
    tide_status st = ta_queue_make(a, index, ctx, async, &l);
    pthread_mutex_lock(&a->mu);
    if (st) {
        a->n_queues--;
    } else {
        l->next = a->queues;
        a->queues = l;
    }
    pthread_mutex_unlock(&a->mu);
    *q = l;
    return st;
}

/* Runs what q holds, then releases it; an error it still holds is dropped
 * (and the backend's sticky error, when q set it). */
static void ta_queue_free(tide_backend *be, void *q) {
    ta_async *a = be->impl;
    ta_queue *l = q;
    if (!l) return;
    pthread_mutex_lock(&a->mu);
    for (ta_queue **p = &a->queues; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    a->n_queues--;
    pthread_mutex_unlock(&a->mu);
    ta_drain_one(l);
    pthread_mutex_lock(&a->err_mu);
    if (a->err_from == l) {
        a->err = TIDE_OK;
        a->err_msg[0] = '\0';
        a->err_from = NULL;
    }
    pthread_mutex_unlock(&a->err_mu);
    ta_queue_destroy(l);
}

/* ------------------------------------------------------------------ vtable */

static tide_status ta_alloc(tide_backend *be, size_t n, void **ptr) {
    tide_backend *in = ((ta_async *)be->impl)->inner;
    return in->vt->alloc(in, n, ptr);
}

/* Waits until every queue has run what was queued on it before this call
 * (the list's mutex held throughout, so no queue is freed meanwhile: every
 * WAIT queued names a RECORD already queued, so the drain ends). */
static void ta_drain(ta_async *a) {
    pthread_mutex_lock(&a->mu);
    for (ta_queue *l = a->queues; l; l = l->next) ta_drain_one(l);
    pthread_mutex_unlock(&a->mu);
}

/* As cudaFree does, waits for all queued work first: a copy or kernel still
 * queued may use the memory. */
static void ta_dealloc(tide_backend *be, void *ptr) {
    ta_async *a = be->impl;
    ta_drain(a);
    a->inner->vt->dealloc(a->inner, ptr);
}

static tide_status ta_copy(tide_backend *be, void *q, void *dst, const void *src, size_t n) {
    ta_item it = {.kind = TA_COPY, .dst = dst, .src = src, .n = n};
    return ta_issue(ta_queue_of(be, q), &it);
}

static tide_status ta_compute(tide_backend *be, void *q, const tide_graph *g, const tide_op *op, void *const *in,
                              void *const *out, void *scratch) {
    ta_queue *l = ta_queue_of(be, q);
    ta_item it = {.kind = TA_COMPUTE, .g = g, .op = op, .scratch = scratch, .n_threads = tide_ctx_threads(l->ctx),
                  .matmul = be->matmul};
    for (int i = 0; i < op->n_in && i < TIDE_OP_MAX_IN; i++) it.in[i] = in[i];
    for (int i = 0; i < op->n_out && i < TIDE_OP_MAX_OUT; i++) it.out[i] = out[i];
    return ta_issue(l, &it);
}

static tide_status ta_queue_sync(tide_backend *be, void *q) {
    ta_async *a = be->impl;
    ta_queue *l = ta_queue_of(be, q);
    ta_drain_one(l);
    char msg[TIDE_ERRMSG_MAX];
    pthread_mutex_lock(&a->err_mu);
    tide_status st = l->err;
    memcpy(msg, l->err_msg, sizeof msg);
    l->err = TIDE_OK;
    l->err_msg[0] = '\0';
    if (a->err_from == l) {
        a->err = TIDE_OK;
        a->err_msg[0] = '\0';
        a->err_from = NULL;
    }
    pthread_mutex_unlock(&a->err_mu);
    if (st) return tide_err(l->ctx, st, "%s", msg);
    return TIDE_OK;
}

static tide_status ta_synchronize(tide_backend *be) {
    ta_async *a = be->impl;
    /* what was issued before this call: work queued meanwhile by other threads
     * is not waited for, so a busy queue cannot keep synchronize waiting */
    ta_drain(a);
    char msg[TIDE_ERRMSG_MAX];
    pthread_mutex_lock(&a->mu);
    pthread_mutex_lock(&a->err_mu);
    tide_status st = a->err;
    memcpy(msg, a->err_msg, sizeof msg);
    for (ta_queue *l = a->queues; l; l = l->next) {
        if (!st && l->err) {
            st = l->err;
            memcpy(msg, l->err_msg, sizeof msg);
        }
        l->err = TIDE_OK;
        l->err_msg[0] = '\0';
    }
    a->err = TIDE_OK;
    a->err_msg[0] = '\0';
    a->err_from = NULL;
    pthread_mutex_unlock(&a->err_mu);
    pthread_mutex_unlock(&a->mu);
    if (st) return tide_err(be->ctx, st, "%s", msg);
    return TIDE_OK;
}

static tide_status ta_event_record(tide_backend *be, void *q, void *ev) {
    ta_event *e = ev;
    ta_queue *l = ta_queue_of(be, q);
    ta_item it = {.kind = TA_RECORD, .ev = e};
    /* the generation is taken and its RECORD queued under the queue's mutex,
     * so a wait that sees the new generation finds the RECORD already queued
     * (a wait can never target a record that is not on some queue) */
    pthread_mutex_lock(&l->mu);
    if (!ta_reserve(l)) {
        pthread_mutex_unlock(&l->mu);
        return ta_nomem(l);
    }
    pthread_mutex_lock(&e->mu);
    it.gen = ++e->recorded;
    e->refs++;
    pthread_mutex_unlock(&e->mu);
    ta_push(l, &it);
    pthread_mutex_unlock(&l->mu);
    return TIDE_OK;
}

static tide_status ta_event_wait(tide_backend *be, void *q, void *ev) {
    ta_event *e = ev;
    ta_queue *l = ta_queue_of(be, q);
    ta_item it = {.kind = TA_WAIT, .ev = e};
    pthread_mutex_lock(&l->mu);
    if (!ta_reserve(l)) {
        pthread_mutex_unlock(&l->mu);
        return ta_nomem(l);
    }
    pthread_mutex_lock(&e->mu);
    it.gen = e->recorded;
    /* nothing recorded, or already complete: this thread has seen the
     * completion under the event's mutex, and what it queues next is ordered
     * after that through the queue's mutex */
    bool needed = it.gen > e->completed;
    if (needed) e->refs++;
    pthread_mutex_unlock(&e->mu);
    if (needed) ta_push(l, &it);
    pthread_mutex_unlock(&l->mu);
    return TIDE_OK;
}

static tide_status ta_event_sync(tide_backend *be, void *q, void *ev) {
    (void)be, (void)q;
    ta_event *e = ev;
    pthread_mutex_lock(&e->mu);
    uint64_t target = e->recorded;
    while (e->completed < target) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return TIDE_OK;
}

static tide_status ta_event_elapsed(tide_backend *be, void *from, void *to, double *seconds) {
    ta_event *ev[2] = {from, to};
    double t[2];
    for (int i = 0; i < 2; i++) {
        ta_event *e = ev[i];
        pthread_mutex_lock(&e->mu);
        bool timing = e->timing, recorded = e->recorded > 0, complete = e->completed >= e->recorded;
        t[i] = e->time;
        pthread_mutex_unlock(&e->mu);
        const char *which = i ? "to" : "from";
        if (!timing)
            return tide_err(be->ctx, TIDE_E_INVALID, "cpu-async: event_elapsed: the '%s' event was made without "
                            "timing", which);
        if (!recorded)
            return tide_err(be->ctx, TIDE_E_INVALID, "cpu-async: event_elapsed: the '%s' event was never "
                            "recorded", which);
        if (!complete)
            return tide_err(be->ctx, TIDE_E_INVALID, "cpu-async: event_elapsed: the '%s' event is not complete",
                            which);
    }
    *seconds = t[1] - t[0];
    return TIDE_OK;
}

/* Stops every queue once they have all run everything queued, then frees
 * all. Also frees a half-built backend. */
static void ta_destroy(tide_backend *be) {
    ta_async *a = be->impl;
    /* all queues drain at once: a WAIT on one may need a RECORD on another */
    for (ta_queue *l = a->queues; l; l = l->next) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_signal(&l->more);
        pthread_mutex_unlock(&l->mu);
    }
    for (ta_queue *l = a->queues, *nx; l; l = nx) {
        nx = l->next;
        ta_queue_destroy(l);
    }
    tide_backend_free(a->inner);
    pthread_mutex_destroy(&a->err_mu);
    pthread_mutex_destroy(&a->mu);
    free(a);
    free(be);
}

/* Returns TIDE_OK with *out a new cpu-async backend on ctx (o NULL: no jitter,
 * device_is_host false), or TIDE_E_NOMEM / TIDE_E_BACKEND (a thread would not
 * start). */
static inline tide_status tide_async_backend_new(tide_ctx *ctx, const tide_async_opts *o, tide_backend **out) {
    *out = NULL;
    tide_async_opts none = {0};
    if (!o) o = &none;
    ta_async *a = calloc(1, sizeof *a);
    tide_backend *be = calloc(1, sizeof *be);
    if (!a || !be) {
        free(a);
        free(be);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory creating the cpu-async backend");
    }
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->err_mu, NULL);
    atomic_init(&a->items_run, 0);
    atomic_init(&a->waits_blocked, 0);
    a->jitter_us = o->jitter_us;
    a->seed = o->seed;
    be->impl = a;
    be->ctx = ctx;
    be->kind = TIDE_BACKEND_CPU;
    be->matmul = TIDE_MATMUL_F32;
    tide_status st = tide_cpu_backend_new(ctx, &a->inner);
    if (!st) be->matmul = a->inner->matmul; /* the CPU backend's default (its AUTO) */
    if (!st) st = ta_queue_make(a, a->next_index++, ctx, false, &a->def);
    if (st) {
        ta_destroy(be);
        return st;
    }
    a->queues = a->def;
    a->n_queues = 1;
    a->vt = *a->inner->vt;
    a->vt.name = "cpu-async";
    a->vt.device_is_host = o->device_is_host;
    a->vt.destroy = ta_destroy;
    a->vt.alloc = ta_alloc;
    a->vt.dealloc = ta_dealloc;
    a->vt.queue_new = ta_queue_new;
    a->vt.queue_free = ta_queue_free;
    a->vt.queue_sync = ta_queue_sync;
    a->vt.to_device = ta_copy;
    a->vt.to_host = ta_copy;
    a->vt.compute = ta_compute;
    a->vt.synchronize = ta_synchronize;
    a->vt.event_new = ta_event_new;
    a->vt.event_free = ta_event_free;
    a->vt.event_record = ta_event_record;
    a->vt.event_wait = ta_event_wait;
    a->vt.event_sync = ta_event_sync;
    a->vt.event_elapsed = ta_event_elapsed;
    a->vt.host_alloc = NULL;
    a->vt.host_free = NULL;
    a->vt.mem_info = NULL;
    a->vt.file_read = NULL;
    be->vt = &a->vt;
    *out = be;
    return TIDE_OK;
}

/* COMPUTE and COPY items the queues have run (skipped ones not counted), and
 * WAIT items that found their event incomplete and had to block. */
static inline void tide_async_backend_counts(tide_backend *be, uint64_t *items_run, uint64_t *waits_blocked) {
    ta_async *a = be->impl;
    if (items_run) *items_run = atomic_load(&a->items_run);
    if (waits_blocked) *waits_blocked = atomic_load(&a->waits_blocked);
}

#endif
