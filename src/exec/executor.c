/*
 * executor.c - runs a verified plan with one worker thread per stream.
 *
 * Design note.
 *   Invariants kept:
 *   E1. Device memory is one arena of exactly p->device_budget bytes, allocated
 *       in tide_exec_new; host spill and SSD spill space likewise. Nothing is
 *       allocated in tide_exec_run (the first run starts the stream workers,
 *       which wait between runs until tide_exec_free).
 *   E2. An instruction starts only after its stream's previous instruction and
 *       every instruction it waits on have completed, and its completion is
 *       published only after its effects are visible in memory. Without
 *       events (synchronous issue): the worker waits for the producers'
 *       done flags (wait_done) and sets its own (mark_done) after the call
 *       returned; the mutex orders the memory for the other threads. With
 *       events (asynchronous issue): a done flag means "issued, and its event
 *       recorded"; a device queue waits for a producer on another stream
 *       with event_wait after its flag is set (the event then holds the
 *       producer's record), the io worker with event_sync, since its own
 *       work is done by the host; a producer on the same stream is ordered
 *       by the queue itself.
 *   E3. The first failure stops every worker (ex->failed); the run returns that
 *       failure's status and message; no later instruction starts.
 *   E4. Every stream worker issues on a queue of its own, made from the
 *       backend in tide_exec_new (queue_new), and records its failures, and
 *       those of the calls on its queue, in a context of its own (worker.ctx).
 *       fail_run copies the first of them under ex->mu; tide_exec_run reports
 *       it once, on ex->ctx, from the calling thread. No worker writes ex->ctx
 *       or be->ctx (a progress report writes no error), so two workers failing
 *       at once do not race, and executors sharing one backend (two models)
 *       may run at the same time from different threads, each on its own
 *       queues and contexts. Only a backend without queue_new falls back to
 *       its default queue, whose errors land on be->ctx.
 *   The executor makes no decision: offsets, tiers and order all come from the
 *   plan, which tide_plan_verify has proven safe.
 *
 *   A tensor copy moves through the states the plan encodes:
 *     AT_HOME --LOAD (h2d or io stream)--> ON_DEVICE --STORE (d2h or io)--> SPILLED/AT_HOME
 *     ON_DEVICE --DROP--> gone;  SPILLED(host) --MOVE (io)--> SPILLED(ssd)
 *   run_load, run_store, run_move and run_compute perform the transitions.
 *
 * SSD transfers go through 4 KiB-aligned bounce buffers: an extent that does
 * not start or end on a 4 KiB boundary is read-modify-written at its edges, so
 * tier offsets need no alignment. All SSD instructions run on the io stream,
 * one at a time, which makes the edge read-modify-write safe. A read into
 * device memory (a GPU's) longer than half the bounce buffer is double
 * buffered: a reader thread fills one half while the io stream copies the
 * other to the device.
 */
#include "exec/executor.h"
#include "store/ssd.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ALIGN 4096u
#define BOUNCE_BYTES (8u << 20)

typedef struct home_ref {
    void *host;          /* host home, or NULL */
    int fd;              /* file home (O_DIRECT when direct), or -1; one descriptor
                            per file, shared by the tensors homed in it */
    bool direct;
    uint64_t file_off;
    dev_t dev;           /* the file's identity, to share its descriptor */
    ino_t ino;
} home_ref;

/* A stream's worker. */
typedef struct worker {
    tide_exec *ex;
    int stream;
    void *q;       /* its queue (NULL: the backend's default queue, on a backend
                      without queue_new) */
    tide_ctx *ctx; /* its own (E4): its queue's errors and its own messages */
} worker;

struct tide_exec {
    tide_ctx *ctx;
    tide_backend *be;
    const tide_plan *p;
    const tide_graph *g;
    unsigned char *arena;
    bool arena_lent;
    unsigned char *host_pool;
    size_t host_pool_bytes;
    bool host_pinned;
    bool host_by_backend;       /* host_pool came from be->vt->host_alloc */
    char notice[256];
    tide_ssd *ssd;
    unsigned char *bounce;      /* BOUNCE_BYTES, 4 KiB aligned */
    bool direct_storage;        /* try be->vt->file_read for file homes; cleared
                                   when the backend answers it cannot */
    bool bounce_by_backend;     /* pinned, from be->vt->host_alloc */
    home_ref *home;
    /* asynchronous issue (backend events) */
    bool async;
    void **ev;                  /* per instruction: the event its waiters on other
                                   streams use, or NULL when none waits on it */
    void **ev_time;             /* 2 per instruction (start, end) and the run's base
                                   last: timing events, made at the first timed run */
    void *ev_layer[2];          /* the compute stream's run-ahead bound */
    int *stream_ins[TIDE_STREAM_COUNT];
    int stream_n[TIDE_STREAM_COUNT];
    /* the stream workers: started by the first run, kept until tide_exec_free
     * (a decoding step is short; starting threads for each would show) */
    pthread_t th[TIDE_STREAM_COUNT];
    bool th_started[TIDE_STREAM_COUNT];
    worker wk[TIDE_STREAM_COUNT];  /* of the streams with instructions (ctx set) */
    tide_ctx *ssd_ctx;          /* the SSD store's messages: used by the io worker
                                   and its reader thread, one at a time, and
                                   copied onto the io worker's context */
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_go, pool_idle;
    uint64_t run_gen;           /* runs started */
    int running;                /* workers still in the current run */
    bool quit;
    /* run state */
    atomic_uchar *done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_bool failed;
    tide_status fail_status;
    char fail_msg[TIDE_ERRMSG_MAX];
    tide_sim_event *timeline;
    int n_layers;               /* for progress reports: highest op layer + 1 */
    double t0;
    _Atomic uint64_t bytes[4];  /* h2d, d2h, ssd read, ssd write: a host LOAD or STORE
                                   may run on io as well as on h2d/d2h */
    double ssd_read_s;          /* written by the io stream only */
};

static const char *tname(const tide_exec *ex, int t) { return ex->g->tensors[t].name; }
static tide_status make_events(tide_exec *ex, bool sync_issue, bool timed);
static tide_status make_time_events(tide_exec *ex);
static tide_status make_workers(tide_exec *ex);

/* ---------------------------------------------------------------- setup */

static tide_status alloc_host_pool(tide_exec *ex, size_t n, bool no_pin) {
    if (!n) return TIDE_OK;
    n = (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    tide_backend *be = ex->be;
    if (!no_pin && be->vt->host_alloc && be->vt->host_alloc(be, n, (void **)&ex->host_pool) == TIDE_OK) {
        ex->host_pool_bytes = n;
        ex->host_pinned = ex->host_by_backend = true;
        return TIDE_OK;
    }
    tide_err_clear(be->ctx);
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return tide_err(ex->ctx, TIDE_E_NOMEM, "cannot reserve %zu bytes of host spill memory: %s", n,
                        strerror(errno));
    ex->host_pool = m;
    ex->host_pool_bytes = n;
    if (!no_pin && mlock(m, n) == 0) {
        ex->host_pinned = true;
    } else {
        snprintf(ex->notice, sizeof ex->notice,
                 "host pool of %zu bytes is not pinned (%s); transfers use pageable memory", n,
                 no_pin ? "pinning disabled" : strerror(errno));
    }
    return TIDE_OK;
}

static bool plan_uses_ssd(const tide_plan *p) {
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if ((in->kind == TIDE_INS_LOAD || in->kind == TIDE_INS_MOVE) && in->src == TIDE_TIER_SSD) return true;
        if ((in->kind == TIDE_INS_STORE || in->kind == TIDE_INS_MOVE) && in->dst == TIDE_TIER_SSD) return true;
    }
    return false;
}

tide_status tide_exec_new(tide_ctx *ctx, tide_backend *be, const tide_plan *p,
                          const tide_exec_opts *opts, tide_exec **out) {
    static const tide_exec_opts defaults = {0};
    if (!opts) opts = &defaults;
    *out = NULL;
    tide_exec *ex = tide_calloc(1, sizeof *ex);
    if (!ex) return tide_err(ctx, TIDE_E_NOMEM, "out of memory creating the executor");
    ex->ctx = ctx;
    ex->be = be;
    ex->p = p;
    ex->g = p->g;
    pthread_mutex_init(&ex->mu, NULL);
    pthread_cond_init(&ex->cv, NULL);
    pthread_mutex_init(&ex->pool_mu, NULL);
    pthread_cond_init(&ex->pool_go, NULL);
    pthread_cond_init(&ex->pool_idle, NULL);
    tide_status st = TIDE_OK;
    int nt = ex->g->n_tensors;
    ex->home = tide_calloc((size_t)(nt ? nt : 1), sizeof *ex->home);
    ex->done = tide_calloc((size_t)(p->n_ins ? p->n_ins : 1), sizeof *ex->done);
    if (!ex->home || !ex->done) {
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory creating the executor");
        goto fail;
    }
    for (int t = 0; t < nt; t++) ex->home[t].fd = -1;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        ex->stream_ins[s] = tide_malloc((size_t)(p->n_ins ? p->n_ins : 1) * sizeof(int));
        if (!ex->stream_ins[s]) {
            st = tide_err(ctx, TIDE_E_NOMEM, "out of memory creating the executor");
            goto fail;
        }
    }
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        /* SSD transfers share the bounce buffer and the store (one thread at a
         * time), so they must all be on one stream; the verifier allows a LOAD
         * on h2d and a STORE on d2h whatever their tier */
        bool ssd = in->kind == TIDE_INS_MOVE || (in->kind == TIDE_INS_LOAD && in->src == TIDE_TIER_SSD) ||
                   (in->kind == TIDE_INS_STORE && in->dst == TIDE_TIER_SSD);
        if (ssd && in->stream != TIDE_STREAM_IO) {
            st = tide_err(ctx, TIDE_E_UNSUPPORTED, "instruction %d (%s '%s') moves SSD data on the %s stream; "
                          "this executor runs every SSD transfer on the io stream", i, tide_ins_name(in->kind),
                          tname(ex, in->tensor), tide_stream_name(in->stream));
            goto fail;
        }
        int s = in->stream;
        ex->stream_ins[s][ex->stream_n[s]++] = i;
    }
    for (int i = 0; i < ex->g->n_ops; i++) ex->n_layers = TIDE_MAX(ex->n_layers, ex->g->ops[i].layer + 1);
    if ((st = make_events(ex, opts->sync_issue, opts->timed))) goto fail;
    /* E1: the arena is allocated once, exactly the budget (or lent by the caller) */
    if (opts->arena) {
        if (opts->arena_bytes < p->device_budget) {
            st = tide_err(ctx, TIDE_E_INVALID, "the lent arena of %llu bytes is smaller than the budget %llu",
                          (unsigned long long)opts->arena_bytes, (unsigned long long)p->device_budget);
            goto fail;
        }
        ex->arena = opts->arena;
        ex->arena_lent = true;
    } else if ((st = be->vt->alloc(be, p->device_budget ? p->device_budget : 1, (void **)&ex->arena))) {
        st = tide_err(ctx, st, "cannot allocate the device arena of %llu bytes: %s",
                      (unsigned long long)p->device_budget, tide_ctx_last_error(be->ctx));
        goto fail;
    }
    if ((st = alloc_host_pool(ex, p->host_spill_bytes, opts->no_pin))) goto fail;
    ex->direct_storage = opts->direct_storage && be->vt->file_read && !be->vt->device_is_host;
    if (plan_uses_ssd(p)) {
        /* on a GPU the bounce buffer is pinned, so its copies to the device
         * run at the link's rate */
        if (!be->vt->device_is_host && be->vt->host_alloc &&
            be->vt->host_alloc(be, BOUNCE_BYTES, (void **)&ex->bounce) == TIDE_OK) {
            ex->bounce_by_backend = true;
        } else {
            tide_err_clear(be->ctx);
            ex->bounce = tide_malloc_aligned(BOUNCE_BYTES, ALIGN);
        }
        if (!ex->bounce) {
            st = tide_err(ctx, TIDE_E_NOMEM, "out of memory for the SSD bounce buffers");
            goto fail;
        }
        const char *dirs = opts->ssd_dirs;
        if (!dirs || !*dirs) dirs = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", dirs);
        const char *list[16];
        int n = 0;
        for (char *tok = strtok(buf, ","); tok && n < 16; tok = strtok(NULL, ",")) list[n++] = tok;
        tide_ssd_opts so = {.force_fallback = opts->force_pread,
                            .fail_read_nth = opts->fail_ssd_read_nth,
                            .fail_write_nth = opts->fail_ssd_write_nth,
                            .fallocate_enospc_dir = opts->fail_ssd_enospc ? 1 : 0};
        uint64_t cap = (p->ssd_spill_bytes + ALIGN - 1) / ALIGN * ALIGN + ALIGN;
        if (!(ex->ssd_ctx = tide_ctx_new())) {
            st = tide_err(ctx, TIDE_E_NOMEM, "out of memory creating the executor");
            goto fail;
        }
        if ((st = tide_ssd_open(ex->ssd_ctx, list, n, cap, &so, &ex->ssd))) {
            st = tide_err(ctx, st, "%s", tide_ctx_last_error(ex->ssd_ctx));
            goto fail;
        }
        tide_ssd_register(ex->ssd, ex->bounce, BOUNCE_BYTES);
    }
    if ((st = make_workers(ex))) goto fail;
    *out = ex;
    return TIDE_OK;
fail:
    tide_exec_free(ex);
    return st;
}

/* E4: a context and a queue for each stream with instructions; the io
 * stream's work is done by the host, so its queue is synchronous. */
static tide_status make_workers(tide_exec *ex) {
    tide_backend *be = ex->be;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        if (!ex->stream_n[s]) continue;
        worker *w = &ex->wk[s];
        *w = (worker){.ex = ex, .stream = s, .ctx = tide_ctx_new()};
        if (!w->ctx) return tide_err(ex->ctx, TIDE_E_NOMEM, "out of memory creating the executor");
        if (!be->vt->queue_new) continue;
        tide_status st = be->vt->queue_new(be, w->ctx, ex->async && s != TIDE_STREAM_IO, &w->q);
        if (st)
            return tide_err(ex->ctx, st, "cannot create the %s stream's queue: %s", tide_stream_name(s),
                            tide_ctx_last_error(w->ctx));
    }
    return TIDE_OK;
}

/* Asynchronous issue: one event per instruction that an instruction of another
 * stream waits on (same-stream order is the queue's own), and the compute
 * stream's two layer events. */
static tide_status make_events(tide_exec *ex, bool sync_issue, bool timed) {
    tide_backend *be = ex->be;
    const tide_plan *p = ex->p;
    if (sync_issue || !tide_backend_has_events(be)) return TIDE_OK;
    ex->async = true;
    ex->ev = tide_calloc((size_t)(p->n_ins ? p->n_ins : 1), sizeof *ex->ev);
    if (!ex->ev) return tide_err(ex->ctx, TIDE_E_NOMEM, "out of memory for the executor's events");
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        for (int k = 0; k < in->n_wait; k++) {
            int w = p->waits[in->wait_at + k];
            if (p->ins[w].stream == in->stream || ex->ev[w]) continue;
            tide_status st = be->vt->event_new(be, false, &ex->ev[w]);
            if (st)
                return tide_err(ex->ctx, st, "cannot create the executor's events: %s", tide_ctx_last_error(be->ctx));
        }
    }
    for (int k = 0; k < 2; k++) {
        tide_status st = be->vt->event_new(be, false, &ex->ev_layer[k]);
        if (st) return tide_err(ex->ctx, st, "cannot create the executor's events: %s", tide_ctx_last_error(be->ctx));
    }
    return timed ? make_time_events(ex) : TIDE_OK;
}

/* The timing events of timed runs: two per instruction and the base. */
static tide_status make_time_events(tide_exec *ex) {
    int n = 2 * ex->p->n_ins + 1;
    ex->ev_time = tide_calloc((size_t)n, sizeof *ex->ev_time);
    if (!ex->ev_time) return tide_err(ex->ctx, TIDE_E_NOMEM, "out of memory for the executor's timing events");
    for (int i = 0; i < n; i++) {
        tide_status st = ex->be->vt->event_new(ex->be, true, &ex->ev_time[i]);
        if (st) return tide_err(ex->ctx, st, "cannot create the executor's timing events: %s",
                                tide_ctx_last_error(ex->be->ctx));
    }
    return TIDE_OK;
}

static void free_events(tide_exec *ex) {
    tide_backend *be = ex->be;
    if (ex->ev)
        for (int i = 0; i < ex->p->n_ins; i++)
            if (ex->ev[i]) be->vt->event_free(be, ex->ev[i]);
    if (ex->ev_time)
        for (int i = 0; i < 2 * ex->p->n_ins + 1; i++)
            if (ex->ev_time[i]) be->vt->event_free(be, ex->ev_time[i]);
    for (int k = 0; k < 2; k++)
        if (ex->ev_layer[k]) be->vt->event_free(be, ex->ev_layer[k]);
    tide_free(ex->ev);
    tide_free(ex->ev_time);
}

/* Forgets tensor t's file home; closes the descriptor unless another tensor
 * still shares it. */
static void release_fd(tide_exec *ex, int t) {
    int fd = ex->home[t].fd;
    ex->home[t].fd = -1;
    if (fd < 0) return;
    for (int u = 0; u < ex->g->n_tensors; u++)
        if (ex->home[u].fd == fd) return;
    close(fd);
}

static void stop_workers(tide_exec *ex) {
    pthread_mutex_lock(&ex->pool_mu);
    ex->quit = true;
    pthread_cond_broadcast(&ex->pool_go);
    pthread_mutex_unlock(&ex->pool_mu);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        if (ex->th_started[s]) pthread_join(ex->th[s], NULL);
}

void tide_exec_free(tide_exec *ex) {
    if (!ex) return;
    stop_workers(ex);
    /* the queues first: freeing one waits for its work, which may use the
     * events and the memory below */
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        if (ex->wk[s].q) ex->be->vt->queue_free(ex->be, ex->wk[s].q);
    free_events(ex);
    if (ex->arena && !ex->arena_lent) ex->be->vt->dealloc(ex->be, ex->arena);
    if (ex->host_pool && ex->host_by_backend) {
        ex->be->vt->host_free(ex->be, ex->host_pool);
    } else if (ex->host_pool) {
        if (ex->host_pinned) munlock(ex->host_pool, ex->host_pool_bytes);
        munmap(ex->host_pool, ex->host_pool_bytes);
    }
    tide_ssd_close(ex->ssd);
    tide_ctx_free(ex->ssd_ctx);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) tide_ctx_free(ex->wk[s].ctx);
    if (ex->bounce_by_backend) ex->be->vt->host_free(ex->be, ex->bounce);
    else tide_free_aligned(ex->bounce);
    if (ex->home)
        for (int t = 0; t < ex->g->n_tensors; t++) release_fd(ex, t);
    tide_free(ex->home);
    tide_free((void *)ex->done);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) tide_free(ex->stream_ins[s]);
    pthread_mutex_destroy(&ex->mu);
    pthread_cond_destroy(&ex->cv);
    pthread_mutex_destroy(&ex->pool_mu);
    pthread_cond_destroy(&ex->pool_go);
    pthread_cond_destroy(&ex->pool_idle);
    tide_free(ex);
}

const char *tide_exec_notice(const tide_exec *ex) { return ex->notice; }

tide_status tide_exec_bind_host(tide_exec *ex, int t, void *data) {
    if (t < 0 || t >= ex->g->n_tensors || !data)
        return tide_err(ex->ctx, TIDE_E_INVALID, "binding tensor %d: no such tensor or no data", t);
    ex->home[t].host = data;
    return TIDE_OK;
}

tide_status tide_exec_bind_file(tide_exec *ex, int t, const char *path, uint64_t off) {
    if (t < 0 || t >= ex->g->n_tensors)
        return tide_err(ex->ctx, TIDE_E_INVALID, "binding tensor %d: no such tensor", t);
    if (ex->g->tensors[t].role != TIDE_ROLE_WEIGHT)
        return tide_err(ex->ctx, TIDE_E_UNSUPPORTED, "only weights can be homed in a file ('%s' is %s)",
                        tname(ex, t), tide_role_name(ex->g->tensors[t].role));
    home_ref *h = &ex->home[t];
    release_fd(ex, t);
    /* a checkpoint file holds many weights: one descriptor for all of them, so
     * that a large model does not run out of descriptors */
    struct stat sb;
    if (stat(path, &sb) == 0)
        for (int u = 0; u < ex->g->n_tensors; u++) {
            const home_ref *o = &ex->home[u];
            if (o->fd >= 0 && o->dev == sb.st_dev && o->ino == sb.st_ino) {
                h->fd = o->fd;
                h->direct = o->direct;
                h->dev = o->dev;
                h->ino = o->ino;
                h->file_off = off;
                return TIDE_OK;
            }
        }
    int fd = -1;
    if (tide_ssd_open_direct(path, &fd) == TIDE_OK) {
        h->direct = true;
    } else {
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return tide_err(ex->ctx, TIDE_E_IO, "cannot open %s for '%s': %s", path, tname(ex, t), strerror(errno));
        h->direct = false;
    }
    h->fd = fd;
    h->file_off = off;
    if (fstat(fd, &sb) == 0) {
        h->dev = sb.st_dev;
        h->ino = sb.st_ino;
    }
    return TIDE_OK;
}

/* ---------------------------------------------------------------- transfers */

/* The context a backend call on w's queue recorded its error on. */
static tide_ctx *queue_ctx(const worker *w) { return tide_backend_queue_ctx(w->ex->be, w->q); }

/* A failed SSD store call (its message is on ex->ssd_ctx), recorded on w's
 * context; the store is idle, so its context is not being written. */
static tide_status ssd_fail(worker *w, tide_status st) {
    return tide_err(w->ctx, st, "%s", tide_ctx_last_error(w->ex->ssd_ctx));
}

/* A failed backend call on w's queue, on w's context. */
static tide_status queue_fail(worker *w, tide_status st) {
    return w->q ? st : tide_err(w->ctx, st, "%s", tide_ctx_last_error(queue_ctx(w)));
}

static tide_status fail_io(worker *w, int i, const char *what) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    return tide_err(w->ctx, tide_ctx_last_status(w->ctx) ? tide_ctx_last_status(w->ctx) : TIDE_E_IO,
                    "instruction %d (%s '%s', iteration %d): %s: %s", i, tide_ins_name(in->kind),
                    tname(ex, in->tensor), in->iter, what, tide_ctx_last_error(w->ctx));
}

/* One bounce-buffer read: the 4 KiB-aligned span holding the start of
 * [off, off+n), at most cap bytes, into buf; *skip is where off lies in buf and
 * *take how many of its bytes belong to the extent. Errors on ex->ssd_ctx. */
static tide_status read_chunk(tide_exec *ex, int fd, bool direct, uint64_t off, uint64_t n, unsigned char *buf,
                              uint64_t cap, uint64_t *skip, uint64_t *take) {
    uint64_t a0 = off & ~(uint64_t)(ALIGN - 1);
    *skip = off - a0;
    uint64_t span = TIDE_MIN(cap, (*skip + n + ALIGN - 1) & ~(uint64_t)(ALIGN - 1));
    *take = TIDE_MIN(n, span - *skip);
    if (fd < 0) return tide_ssd_read(ex->ssd, a0, buf, span);
    if (direct) return tide_ssd_read_file(ex->ssd, fd, a0, buf, span);
    ssize_t r = pread(fd, buf + *skip, *take, (off_t)off);
    return r == (ssize_t)*take ? TIDE_OK
                               : tide_err(ex->ssd_ctx, TIDE_E_IO, "read of %llu bytes at %llu: %s",
                                          (unsigned long long)*take, (unsigned long long)off,
                                          r < 0 ? strerror(errno) : "short read");
}

/* A read from SSD to device memory through the two halves of the bounce
 * buffer: a reader thread fills one half while this thread copies the other
 * to the device, so the drive and the host link work at the same time. The
 * reader's errors go to ex->ssd_ctx (which nothing else uses meanwhile), the
 * copies' to w's. */
typedef struct dbuf {
    tide_exec *ex;
    int fd;
    bool direct;
    uint64_t off, n;            /* what is left to read */
    unsigned char *half[2];
    uint64_t skip[2], take[2];
    int filled, copied;         /* chunks read, chunks copied */
    bool done, stop;            /* the reader read everything / must stop */
    tide_status st;             /* the reader's failure */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} dbuf;

#define HALF_BYTES ((uint64_t)BOUNCE_BYTES / 2)

static void *dbuf_reader(void *arg) {
    dbuf *d = arg;
    for (int k = 0;; k++) {
        pthread_mutex_lock(&d->mu);
        while (!d->stop && k - d->copied >= 2) pthread_cond_wait(&d->cv, &d->mu); /* both halves busy */
        bool stop = d->stop;
        pthread_mutex_unlock(&d->mu);
        if (stop) return NULL;
        uint64_t skip = 0, take = 0;
        tide_status st = read_chunk(d->ex, d->fd, d->direct, d->off, d->n, d->half[k & 1], HALF_BYTES, &skip, &take);
        pthread_mutex_lock(&d->mu);
        if (st) {
            d->st = st;
        } else {
            d->skip[k & 1] = skip;
            d->take[k & 1] = take;
            d->off += take;
            d->n -= take;
            d->filled = k + 1;
            d->done = d->n == 0;
        }
        bool end = st || d->done;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        if (end) return NULL;
    }
}

static tide_status ssd_read_to_device_pipelined(worker *w, int fd, bool direct, uint64_t off,
                                                unsigned char *dst, uint64_t n) {
    tide_exec *ex = w->ex;
    dbuf d = {.ex = ex, .fd = fd, .direct = direct, .off = off, .n = n,
              .half = {ex->bounce, ex->bounce + HALF_BYTES}};
    pthread_mutex_init(&d.mu, NULL);
    pthread_cond_init(&d.cv, NULL);
    pthread_t th;
    int rc = pthread_create(&th, NULL, dbuf_reader, &d);
    if (rc != 0) {
        pthread_cond_destroy(&d.cv);
        pthread_mutex_destroy(&d.mu);
        return tide_err(w->ctx, TIDE_E_NOMEM, "cannot start the SSD reader thread: %s", strerror(rc));
    }
    tide_status st = TIDE_OK;
    for (int k = 0; !st; k++) {
        pthread_mutex_lock(&d.mu);
        while (d.filled <= k && !d.st) pthread_cond_wait(&d.cv, &d.mu);
        bool have = d.filled > k;
        uint64_t skip = d.skip[k & 1], take = d.take[k & 1];
        bool last = have && d.done && d.filled == k + 1;
        pthread_mutex_unlock(&d.mu);
        if (!have) break;
        st = ex->be->vt->to_device(ex->be, w->q, dst, d.half[k & 1] + skip, take);
        if (st) st = queue_fail(w, st);
        dst += take;
        pthread_mutex_lock(&d.mu);
        d.copied = k + 1;
        if (st) d.stop = true;
        pthread_cond_broadcast(&d.cv);
        pthread_mutex_unlock(&d.mu);
        if (last) break;
    }
    pthread_join(th, NULL);
    if (!st && d.st) st = ssd_fail(w, d.st); /* the reader is done: its message is final */
    pthread_cond_destroy(&d.cv);
    pthread_mutex_destroy(&d.mu);
    return st;
}

/* Reads [off, off+n) of a file or the SSD store into dst (host memory, or
 * device memory when to_device), via the bounce buffer when dst or the extent
 * is not 4 KiB aligned. Errors on w's context. */
static tide_status ssd_read_into(worker *w, int fd, bool direct, uint64_t off, unsigned char *dst,
                                 uint64_t n, bool to_device) {
    tide_exec *ex = w->ex;
    /* Host-addressable destination with aligned extents: the store reads the
     * whole aligned part straight into it, many requests in flight; only a
     * partial last page goes through the bounce buffer. */
    bool host_dst = !to_device || ex->be->vt->device_is_host;
    if (host_dst && direct && !(off & (ALIGN - 1)) && !((uintptr_t)dst & (ALIGN - 1)) && n >= ALIGN) {
        uint64_t bulk = n & ~(uint64_t)(ALIGN - 1);
        tide_status st = fd < 0 ? tide_ssd_read(ex->ssd, off, dst, bulk)
                                : tide_ssd_read_file(ex->ssd, fd, off, dst, bulk);
        if (st) return ssd_fail(w, st);
        off += bulk;
        dst += bulk;
        n -= bulk;
    }
    /* a file straight into device memory (GPUDirect Storage) where it works;
     * the first refusal turns it off for this executor, with a notice */
    if (!host_dst && fd >= 0 && ex->direct_storage && n > 0) {
        tide_status st = ex->be->vt->file_read(ex->be, w->q, fd, off, dst, n);
        if (st != TIDE_E_UNSUPPORTED) return st ? queue_fail(w, st) : TIDE_OK;
        ex->direct_storage = false;
        snprintf(ex->notice, sizeof ex->notice, "direct storage reads are off: %s",
                 tide_ctx_last_error(queue_ctx(w)));
    }
    /* device memory, more than one half of the bounce buffer: pipelined */
    if (!host_dst && n > HALF_BYTES) return ssd_read_to_device_pipelined(w, fd, direct, off, dst, n);
    while (n > 0) {
        uint64_t skip = 0, take = 0;
        tide_status st = read_chunk(ex, fd, direct, off, n, ex->bounce, BOUNCE_BYTES, &skip, &take);
        if (st) return ssd_fail(w, st);
        if (to_device && (st = ex->be->vt->to_device(ex->be, w->q, dst, ex->bounce + skip, take)))
            return queue_fail(w, st);
        if (!to_device) memcpy(dst, ex->bounce + skip, take);
        off += take;
        dst += take;
        n -= take;
    }
    return TIDE_OK;
}

/* Writes src (device memory when from_device) to [off, off+n) of the SSD store;
 * partial 4 KiB pages at the edges are read first and merged. Errors on w's
 * context. */
static tide_status ssd_write_from(worker *w, uint64_t off, const unsigned char *src, uint64_t n,
                                  bool from_device) {
    tide_exec *ex = w->ex;
    while (n > 0) {
        uint64_t a0 = off & ~(uint64_t)(ALIGN - 1);
        uint64_t skip = off - a0;
        uint64_t span = TIDE_MIN((uint64_t)BOUNCE_BYTES, (skip + n + ALIGN - 1) & ~(uint64_t)(ALIGN - 1));
        uint64_t take = TIDE_MIN(n, span - skip);
        /* keep the bytes of partly covered edge pages: read them first */
        tide_status st = TIDE_OK;
        uint64_t end = skip + take, last = end & ~(uint64_t)(ALIGN - 1);
        if (skip) st = tide_ssd_read(ex->ssd, a0, ex->bounce, ALIGN);
        if (!st && (end & (ALIGN - 1)) && (last != 0 || !skip))
            st = tide_ssd_read(ex->ssd, a0 + last, ex->bounce + last, ALIGN);
        if (st) return ssd_fail(w, st);
        if (from_device && (st = ex->be->vt->to_host(ex->be, w->q, ex->bounce + skip, src, take)))
            return queue_fail(w, st);
        if (!from_device) memcpy(ex->bounce + skip, src, take);
        if ((st = tide_ssd_write(ex->ssd, a0, ex->bounce, span))) return ssd_fail(w, st);
        off += take;
        src += take;
        n -= take;
    }
    return TIDE_OK;
}

static tide_status run_load(worker *w, int i) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_tensor *t = &ex->g->tensors[in->tensor];
    unsigned char *dst = ex->arena + in->dev_off[0];
    tide_backend *be = ex->be;
    tide_status st;
    if (in->src == TIDE_TIER_HOST) {
        const void *src = in->tier_off == TIDE_HOME ? ex->home[in->tensor].host : ex->host_pool + in->tier_off;
        if (!src) return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no host home bound", i, t->name);
        if ((st = be->vt->to_device(be, w->q, dst, src, t->nbytes))) st = queue_fail(w, st);
        ex->bytes[0] += t->nbytes;
        return st ? fail_io(w, i, "host to device copy") : TIDE_OK;
    }
    double t0 = tide_now();
    const home_ref *h = &ex->home[in->tensor];
    if (in->tier_off == TIDE_HOME) {
        if (h->fd >= 0) st = ssd_read_into(w, h->fd, h->direct, h->file_off, dst, t->nbytes, true);
        else if (!h->host)
            return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no SSD home bound", i, t->name);
        else if ((st = be->vt->to_device(be, w->q, dst, h->host, t->nbytes))) /* home mapped in memory */
            st = queue_fail(w, st);
    } else {
        st = ssd_read_into(w, -1, true, in->tier_off, dst, t->nbytes, true);
    }
    ex->ssd_read_s += tide_now() - t0;
    ex->bytes[2] += t->nbytes;
    return st ? fail_io(w, i, "SSD read") : TIDE_OK;
}

static tide_status run_store(worker *w, int i) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_tensor *t = &ex->g->tensors[in->tensor];
    const unsigned char *src = ex->arena + in->dev_off[0];
    tide_status st;
    if (in->dst == TIDE_TIER_HOST) {
        void *dst = in->tier_off == TIDE_HOME ? ex->home[in->tensor].host : ex->host_pool + in->tier_off;
        if (!dst) return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no host home bound", i, t->name);
        if ((st = ex->be->vt->to_host(ex->be, w->q, dst, src, t->nbytes))) st = queue_fail(w, st);
        ex->bytes[1] += t->nbytes;
        return st ? fail_io(w, i, "device to host copy") : TIDE_OK;
    }
    if (in->tier_off == TIDE_HOME)
        return tide_err(w->ctx, TIDE_E_UNSUPPORTED, "instruction %d: '%s' would be written to its SSD home; "
                        "only weights are homed on SSD and they are never written", i, t->name);
    st = ssd_write_from(w, in->tier_off, src, t->nbytes, true);
    ex->bytes[3] += t->nbytes;
    return st ? fail_io(w, i, "SSD write") : TIDE_OK;
}

static tide_status run_move(worker *w, int i) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_tensor *t = &ex->g->tensors[in->tensor];
    if (in->tier_off == TIDE_HOME || in->src_off == TIDE_HOME)
        return tide_err(w->ctx, TIDE_E_UNSUPPORTED, "instruction %d: moves of home copies ('%s') are not supported",
                        i, t->name);
    tide_status st;
    if (in->src == TIDE_TIER_HOST && in->dst == TIDE_TIER_SSD) {
        st = ssd_write_from(w, in->tier_off, ex->host_pool + in->src_off, t->nbytes, false);
        ex->bytes[3] += t->nbytes;
    } else {
        st = ssd_read_into(w, -1, true, in->src_off, ex->host_pool + in->tier_off, t->nbytes, false);
        ex->bytes[2] += t->nbytes;
    }
    return st ? fail_io(w, i, "move between host and SSD") : TIDE_OK;
}

static tide_status run_compute(worker *w, int i) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_op *op = &ex->g->ops[in->op];
    void *ip[TIDE_OP_MAX_IN], *op_out[TIDE_OP_MAX_OUT];
    for (int j = 0; j < op->n_in; j++) ip[j] = ex->arena + in->dev_off[j];
    for (int j = 0; j < op->n_out; j++) op_out[j] = ex->arena + in->dev_off[op->n_in + j];
    void *scratch = op->scratch_bytes ? ex->arena + in->scratch_off : NULL;
    tide_status st = ex->be->vt->compute(ex->be, w->q, ex->g, op, ip, op_out, scratch);
    if (st)
        return tide_err(w->ctx, st, "instruction %d (%s, op %d, iteration %d): %s", i, tide_op_name(op->kind),
                        in->op, in->iter, tide_ctx_last_error(queue_ctx(w)));
    return TIDE_OK;
}

/* ---------------------------------------------------------------- workers */

static bool wait_done(tide_exec *ex, int w) {
    if (atomic_load_explicit(&ex->done[w], memory_order_acquire)) return true;
    pthread_mutex_lock(&ex->mu);
    while (!atomic_load(&ex->done[w]) && !atomic_load(&ex->failed)) pthread_cond_wait(&ex->cv, &ex->mu);
    pthread_mutex_unlock(&ex->mu);
    return !atomic_load(&ex->failed);
}

static void mark_done(tide_exec *ex, int i) {
    pthread_mutex_lock(&ex->mu);
    atomic_store_explicit(&ex->done[i], 1, memory_order_release);
    pthread_cond_broadcast(&ex->cv);
    pthread_mutex_unlock(&ex->mu);
}

/* E3, E4: the first failure of the run, copied from its worker's context. */
static void fail_run(worker *w, tide_status st) {
    tide_exec *ex = w->ex;
    pthread_mutex_lock(&ex->mu);
    if (!atomic_load(&ex->failed)) {
        ex->fail_status = st;
        snprintf(ex->fail_msg, sizeof ex->fail_msg, "%s", tide_ctx_last_error(w->ctx));
        atomic_store(&ex->failed, true);
    }
    pthread_cond_broadcast(&ex->cv);
    pthread_mutex_unlock(&ex->mu);
}

/* Whether op `o` ends its layer (for progress reports). */
static bool ends_layer(const tide_graph *g, int o) {
    return g->ops[o].layer >= 0 && (o + 1 == g->n_ops || g->ops[o + 1].layer != g->ops[o].layer);
}

/* Asynchronous issue on the compute stream: after issuing the last op of a
 * layer, waits until the layer two before it has completed, reports it, and
 * marks this one, so the worker stays at most two layers ahead of the device
 * and progress reports what has been computed. A failed report is the
 * backend's failure. */
static tide_status layer_issued(worker *w, int layer, int *pending) {
    tide_exec *ex = w->ex;
    tide_backend *be = ex->be;
    void *ev = ex->ev_layer[layer & 1];
    if (pending[layer & 1] >= 0) {
        tide_status st = be->vt->event_sync(be, w->q, ev);
        if (st) return queue_fail(w, st);
        tide_progress(ex->ctx, "layer", (uint64_t)pending[layer & 1] + 1, (uint64_t)ex->n_layers);
    }
    pending[layer & 1] = layer;
    tide_status st = be->vt->event_record(be, w->q, ev);
    return st ? queue_fail(w, st) : TIDE_OK;
}

/* Issues instruction i on w's stream. */
static tide_status run_ins(worker *w, int i) {
    switch (w->ex->p->ins[i].kind) {
    case TIDE_INS_COMPUTE: return run_compute(w, i);
    case TIDE_INS_LOAD: return run_load(w, i);
    case TIDE_INS_STORE: return run_store(w, i);
    case TIDE_INS_MOVE: return run_move(w, i);
    case TIDE_INS_DROP: return TIDE_OK; /* the arena range is free once this completes */
    default: return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d has kind %d", i, (int)w->ex->p->ins[i].kind);
    }
}

/* A failed event call on instruction i (tide_exec_run adds where to look for
 * the cause: with work queued ahead it may be an earlier instruction). */
static tide_status event_fail(worker *w, int i, const char *what, tide_status st) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    char who[200];
    if (in->kind == TIDE_INS_COMPUTE)
        snprintf(who, sizeof who, "%s, op %d", tide_op_name(ex->g->ops[in->op].kind), in->op);
    else
        snprintf(who, sizeof who, "%s '%s'", tide_ins_name(in->kind), in->tensor >= 0 ? tname(ex, in->tensor) : "?");
    return tide_err(w->ctx, st, "instruction %d (%s): %s: %s", i, who, what, tide_ctx_last_error(queue_ctx(w)));
}

/* One run of stream w->stream's instructions. */
static void worker_run(worker *w) {
    tide_exec *ex = w->ex;
    tide_backend *be = ex->be;
    const tide_plan *p = ex->p;
    /* the io stream's work is done by the host: its queue is synchronous */
    bool async = ex->async && w->stream != TIDE_STREAM_IO;
    bool timed = ex->timeline && ex->async;
    int pending[2] = {-1, -1}; /* layers issued and not yet reported (async compute) */
    tide_status st = TIDE_OK;
    for (int k = 0; k < ex->stream_n[w->stream] && !st; k++) {
        int i = ex->stream_ins[w->stream][k];
        const tide_ins *in = &p->ins[i];
        for (int j_ = 0; j_ < in->n_wait && !st; j_++) {
            int j = p->waits[in->wait_at + j_];
            if (!wait_done(ex, j)) return;
            if (ex->async && p->ins[j].stream != w->stream) {
                st = async ? be->vt->event_wait(be, w->q, ex->ev[j]) : be->vt->event_sync(be, w->q, ex->ev[j]);
                if (st) {
                    char what[64];
                    snprintf(what, sizeof what, "waiting for instruction %d", j);
                    st = event_fail(w, i, what, st);
                }
            }
        }
        if (st || atomic_load(&ex->failed)) break;
        double t0 = tide_now();
        if (timed && (st = be->vt->event_record(be, w->q, ex->ev_time[2 * i]))) {
            st = event_fail(w, i, "recording its start", st);
            break;
        }
        if ((st = run_ins(w, i))) break;
        if (timed && (st = be->vt->event_record(be, w->q, ex->ev_time[2 * i + 1]))) {
            st = event_fail(w, i, "recording its end", st);
            break;
        }
        if (ex->ev && ex->ev[i] && (st = be->vt->event_record(be, w->q, ex->ev[i]))) {
            st = event_fail(w, i, "recording its completion", st);
            break;
        }
        if (ex->timeline && !ex->async) {
            ex->timeline[i].ins = i;
            ex->timeline[i].start_s = t0 - ex->t0;
            ex->timeline[i].end_s = tide_now() - ex->t0;
        }
        mark_done(ex, i);
        if (in->kind == TIDE_INS_COMPUTE && ends_layer(ex->g, in->op)) {
            if (!async)
                tide_progress(ex->ctx, "layer", (uint64_t)ex->g->ops[in->op].layer + 1, (uint64_t)ex->n_layers);
            else if ((st = layer_issued(w, ex->g->ops[in->op].layer, pending)))
                st = event_fail(w, i, "keeping at most two layers ahead of the device", st);
        }
    }
    /* the last layers issued are reported once complete */
    int first = pending[1] >= 0 && (pending[0] < 0 || pending[1] < pending[0]) ? 1 : 0;
    for (int k = 0; k < 2 && !st && async; k++) {
        int slot = first ^ k;
        if (pending[slot] < 0) continue;
        if ((st = be->vt->event_sync(be, w->q, ex->ev_layer[slot]))) st = queue_fail(w, st);
        else tide_progress(ex->ctx, "layer", (uint64_t)pending[slot] + 1, (uint64_t)ex->n_layers);
    }
    if (st) fail_run(w, st);
}

/* A stream's worker thread: one run of its instructions per run started,
 * until the executor is freed. */
static void *worker_main(void *arg) {
    worker *w = arg;
    tide_exec *ex = w->ex;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&ex->pool_mu);
        while (!ex->quit && ex->run_gen == seen) pthread_cond_wait(&ex->pool_go, &ex->pool_mu);
        bool quit = ex->quit;
        seen = ex->run_gen;
        pthread_mutex_unlock(&ex->pool_mu);
        if (quit) return NULL;
        worker_run(w);
        pthread_mutex_lock(&ex->pool_mu);
        if (--ex->running == 0) pthread_cond_broadcast(&ex->pool_idle);
        pthread_mutex_unlock(&ex->pool_mu);
    }
}

/* Fills the timeline of an asynchronous run from its timing events (all
 * complete: the run has been synchronized). */
static tide_status read_timeline(tide_exec *ex) {
    tide_backend *be = ex->be;
    void *base = ex->ev_time[2 * ex->p->n_ins];
    for (int i = 0; i < ex->p->n_ins; i++) {
        double a = 0, b = 0;
        tide_status st = be->vt->event_elapsed(be, base, ex->ev_time[2 * i], &a);
        if (!st) st = be->vt->event_elapsed(be, base, ex->ev_time[2 * i + 1], &b);
        if (st) return tide_err(ex->ctx, st, "reading the run's timeline: %s", tide_ctx_last_error(be->ctx));
        ex->timeline[i].ins = i;
        ex->timeline[i].start_s = TIDE_MAX(a, 0.0);
        ex->timeline[i].end_s = TIDE_MAX(b, ex->timeline[i].start_s);
    }
    return TIDE_OK;
}

/* Waits for the work the run queued (every worker is idle): each queue's
 * with queue_sync, whose errors land on the workers' contexts, else the
 * whole backend's. Returns the first error, its message in msg. */
static tide_status sync_queues(tide_exec *ex, char *msg, size_t cap) {
    tide_backend *be = ex->be;
    tide_status first = TIDE_OK;
    if (!be->vt->queue_sync) {
        first = be->vt->synchronize ? be->vt->synchronize(be) : TIDE_OK;
        if (first) snprintf(msg, cap, "%s", tide_ctx_last_error(be->ctx));
        return first;
    }
    /* every queue is waited for, whatever failed first */
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        worker *w = &ex->wk[s];
        if (!w->ctx) continue;
        tide_status st = be->vt->queue_sync(be, w->q);
        if (st && !first) {
            first = st;
            snprintf(msg, cap, "%s", tide_ctx_last_error(queue_ctx(w)));
        }
    }
    return first;
}

tide_status tide_exec_run(tide_exec *ex, tide_sim_event *timeline, tide_exec_stats *stats) {
    const tide_plan *p = ex->p;
    for (int t = 0; t < ex->g->n_tensors; t++) {
        tide_role r = ex->g->tensors[t].role;
        if (r == TIDE_ROLE_TEMP) continue;
        const home_ref *h = &ex->home[t];
        if (!h->host && h->fd < 0)
            return tide_err(ex->ctx, TIDE_E_INVALID, "%s tensor '%s' has no home bound", tide_role_name(r), tname(ex, t));
        if (p->home[t] == TIDE_TIER_HOST && !h->host)
            return tide_err(ex->ctx, TIDE_E_INVALID, "'%s' is homed on host by the plan but bound to a file", tname(ex, t));
    }
    for (int i = 0; i < p->n_ins; i++) atomic_store(&ex->done[i], 0);
    atomic_store(&ex->failed, false);
    ex->fail_status = TIDE_OK;
    for (int k = 0; k < 4; k++) atomic_store(&ex->bytes[k], 0);
    ex->ssd_read_s = 0;
    ex->timeline = timeline;
    /* the workers' contexts start clean, with the caller's thread count (the
     * CPU kernels read it from the context of the queue they run on) */
    worker *base_w = NULL;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        worker *w = &ex->wk[s];
        if (!w->ctx) continue;
        tide_err_clear(w->ctx);
        tide_ctx_set_threads(w->ctx, tide_ctx_threads(ex->ctx));
        if (!base_w) base_w = w;
    }
    tide_status st = TIDE_OK;
    if (timeline && ex->async) {
        if (!ex->ev_time)
            return tide_err(ex->ctx, TIDE_E_INVALID, "a timeline was asked of an executor made without "
                            "timing events (tide_exec_opts.timed)");
        /* the base every timing event is measured from, on the first
         * stream's queue before anything is queued (its worker is idle) */
        if (base_w && (st = ex->be->vt->event_record(ex->be, base_w->q, ex->ev_time[2 * p->n_ins])))
            return tide_err(ex->ctx, st, "starting the run's timeline: %s", tide_ctx_last_error(queue_ctx(base_w)));
    }
    ex->t0 = tide_now();
    /* the workers of streams with instructions, started once */
    int active = 0;
    for (int s = 0; s < TIDE_STREAM_COUNT && !st; s++) {
        if (!ex->stream_n[s]) continue;
        active++;
        if (ex->th_started[s]) continue;
        int rc = pthread_create(&ex->th[s], NULL, worker_main, &ex->wk[s]);
        if (rc != 0)
            st = tide_err(ex->ctx, TIDE_E_NOMEM, "cannot start the %s stream's thread: %s", tide_stream_name(s),
                          strerror(rc));
        else ex->th_started[s] = true;
    }
    if (st) return st; /* nothing was issued */
    pthread_mutex_lock(&ex->pool_mu);
    ex->running = active;
    ex->run_gen++;
    pthread_cond_broadcast(&ex->pool_go);
    while (ex->running > 0) pthread_cond_wait(&ex->pool_idle, &ex->pool_mu);
    pthread_mutex_unlock(&ex->pool_mu);
    /* always: after a failure, work already queued must finish before the
     * caller may reuse or free the memory it touches */
    char sync_msg[TIDE_ERRMSG_MAX] = "";
    tide_status sync_st = sync_queues(ex, sync_msg, sizeof sync_msg);
    double wall = tide_now() - ex->t0;
    bool failed = atomic_load(&ex->failed);
    if (failed || sync_st) {
        /* E3, E4: reported once, here: the first worker failure, else the
         * first queue's. A device fault surfaces at whatever call comes next:
         * with work queued ahead, that need not be the instruction that
         * caused it */
        st = failed ? (ex->fail_status ? ex->fail_status : TIDE_E_BACKEND) : sync_st;
        bool hint = ex->async && st == TIDE_E_BACKEND;
        return tide_err(ex->ctx, st, "%s%s", failed ? ex->fail_msg : sync_msg,
                        hint ? " (device work was queued ahead: TIDE_EXEC_SYNC=1 names the failing instruction)"
                             : "");
    }
    if (timeline && ex->async && (st = read_timeline(ex))) return st;
    if (stats) {
        stats->wall_s = wall;
        stats->bytes_h2d = ex->bytes[0];
        stats->bytes_d2h = ex->bytes[1];
        stats->bytes_ssd_read = ex->bytes[2];
        stats->bytes_ssd_write = ex->bytes[3];
        stats->ssd_read_s = ex->ssd_read_s;
        stats->host_pinned = ex->host_pinned || !ex->host_pool;
        stats->ssd_backend = ex->ssd ? tide_ssd_backend_name(ex->ssd) : "none";
        stats->async = ex->async;
    }
    return TIDE_OK;
}
