/*
 * executor.c - runs a verified plan with one worker thread per stream: the
 * device's compute stream, the h2d, d2h and io transfer streams, and the host
 * stream, which runs the computes the plan places on the host CPU (on a CPU
 * backend of the executor's own, reading and writing host copies: homes and
 * the host spill pool). A device compute may use host copies in place too,
 * where the plan is host_addressable (only on a backend whose device memory is
 * host memory: tide_exec_new refuses it elsewhere).
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
 *       producer's record), the io and host workers with event_sync, since
 *       their own work is done by the host; a producer on the same stream is
 *       ordered by the queue itself.
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
 *     AT_HOME(ssd) --MOVE (io)--> SPILLED(host) --MOVE (io)--> AT_HOME(ssd)
 *   A STORE or MOVE to an SSD home writes a STATE's file extent back (on
 *   the io stream, like every SSD transfer); a WEIGHT's home is only read.
 *   exec_load, exec_store, exec_move and run_compute perform the transitions.
 *
 * Transfers (LOAD, STORE, MOVE; the SSD's bounce buffers) are in
 * exec_transfer.c.
 */
#include "exec/exec_int.h"

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

#ifdef TIDE_TEST_HOOKS
#include "exec/exec_test.h"

static pthread_mutex_t test_timing_mu = PTHREAD_MUTEX_INITIALIZER;
static tide_exec_test_timing_fn test_timing;
static void *test_timing_user;

void tide_exec_test_set_timing(tide_exec_test_timing_fn fn, void *user) {
    pthread_mutex_lock(&test_timing_mu);
    test_timing = fn;
    test_timing_user = user;
    pthread_mutex_unlock(&test_timing_mu);
}

/* The test's timings in place of the measured ones (exec_test.h). */
static void apply_test_timing(const tide_plan *p, tide_sim_event *timeline, double *wall) {
    pthread_mutex_lock(&test_timing_mu);
    tide_exec_test_timing_fn fn = test_timing;
    void *user = test_timing_user;
    pthread_mutex_unlock(&test_timing_mu);
    if (fn) fn(user, p, timeline, wall);
}
#endif

static tide_status make_events(tide_exec *ex, bool sync_issue, bool timed);
static tide_status make_time_events(tide_exec *ex);
static tide_status make_workers(tide_exec *ex);
static tide_status make_host_compute(tide_exec *ex);

/* ---------------------------------------------------------------- setup */

static tide_status alloc_host_pool(tide_exec *ex, size_t n, bool no_pin) {
    if (!n) return TIDE_OK;
    n = (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    tide_backend *be = ex->be;
    if (!no_pin && be->vt->host_alloc) {
        if (be->vt->host_alloc(be, n, (void **)&ex->host_pool) == TIDE_OK) {
            ex->host_pool_bytes = n;
            ex->host_pinned = ex->host_by_backend = true;
            return TIDE_OK;
        }
        /* pageable memory instead: the backend's refusal is no error (its
         * context is touched only where it recorded one) */
        tide_err_clear(be->ctx);
    }
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

/* Whether p reads or writes the SSD tier: spills, and homes on SSD (weights
 * read, state read and written back) alike need the store and the bounce
 * buffer, even with nothing spilled. */
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
    bool coll = p && p->ranks > 1;
    for (int i = 0; p && i < p->n_ins && !coll; i++)
        coll = tide_ins_is_collective(p->ins[i].kind) || p->ins[i].stream == TIDE_STREAM_NET;
    if (coll && !opts->comm) /* a data-parallel rank's plan needs the other ranks */
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "the plan is one of %d data-parallel ranks: its collectives need "
                        "the other ranks (a communicator: start the ranks with mpirun -np %d); run a plan without "
                        "--ranks", p->ranks, p->ranks);
    if (coll && tide_comm_size(opts->comm) != p->ranks)
        return tide_err(ctx, TIDE_E_INVALID, "the plan is one of %d data-parallel ranks, the communicator has %d",
                        p->ranks, tide_comm_size(opts->comm));
    if (coll && !be->vt->device_is_host && !tide_comm_get_dev(opts->comm, NULL))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "collectives on the %s backend's device memory need the "
                        "communicator's device collectives (NCCL: tide_trainer_set_comm attaches them), and this "
                        "one has none", be->vt->name);
    tide_exec *ex = tide_calloc(1, sizeof *ex);
    if (!ex) return tide_err(ctx, TIDE_E_NOMEM, "out of memory creating the executor");
    ex->ctx = ctx;
    ex->be = be;
    ex->p = p;
    ex->g = p->g;
    ex->comm = coll ? opts->comm : NULL;
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
    if (p->host_addressable && !be->vt->device_is_host) {
        st = tide_err(ctx, TIDE_E_UNSUPPORTED, "the plan computes on host memory in place, which the %s backend's "
                      "device cannot address", be->vt->name);
        goto fail;
    }
    if ((st = make_host_compute(ex))) goto fail;
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
    ex->buffered_files = opts->buffered_files;
    if (plan_uses_ssd(p)) {
        /* on a GPU the bounce buffer is pinned, so its copies to the device
         * run at the link's rate */
        if (!be->vt->device_is_host && be->vt->host_alloc) {
            if (be->vt->host_alloc(be, BOUNCE_BYTES, (void **)&ex->bounce) == TIDE_OK)
                ex->bounce_by_backend = true;
            else /* a refusal is no error: pageable instead. The backend's
                  * context is shared by a pool's threads: touched only
                  * where the backend recorded something */
                tide_err_clear(be->ctx);
        }
        if (!ex->bounce_by_backend) ex->bounce = tide_malloc_aligned(BOUNCE_BYTES, ALIGN);
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
        char *save = NULL; /* strtok_r: another thread may be making an executor too */
        for (char *tok = strtok_r(buf, ",", &save); tok && n < 16; tok = strtok_r(NULL, ",", &save)) list[n++] = tok;
        /* fault injection: tide_ssd_test_set_faults (store/ssd_test.h) */
        tide_ssd_opts so = {.force_fallback = opts->force_pread};
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

/* Computes placed on the host run on a CPU backend of the executor's own,
 * with one scratch buffer for the largest of them (the host stream runs one
 * at a time). */
static tide_status make_host_compute(tide_exec *ex) {
    uint64_t scratch = 0;
    bool any = false;
    for (int i = 0; i < ex->p->n_ins; i++) {
        const tide_ins *in = &ex->p->ins[i];
        if (in->kind != TIDE_INS_COMPUTE || in->place != TIDE_PLACE_HOST) continue;
        any = true;
        scratch = TIDE_MAX(scratch, ex->g->ops[in->op].scratch_bytes);
    }
    if (!any) return TIDE_OK;
    tide_status st = tide_cpu_backend_new(ex->ctx, &ex->host_be);
    if (st) return st;
    if (scratch && !(ex->host_scratch = tide_malloc_aligned(scratch, ALIGN)))
        return tide_err(ex->ctx, TIDE_E_NOMEM, "out of memory for the host computes' scratch (%llu bytes)",
                        (unsigned long long)scratch);
    return TIDE_OK;
}

/* E4: a context and a queue for each stream with instructions; the io and
 * host streams' work is done by the host, so their queues are synchronous
 * (the host stream's, on the device's backend, only records the events
 * others wait on; it computes on its queue of the host backend). */
static tide_status make_workers(tide_exec *ex) {
    tide_backend *be = ex->be;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        if (!ex->stream_n[s]) continue;
        worker *w = &ex->wk[s];
        bool by_host = s == TIDE_STREAM_IO || s == TIDE_STREAM_HOST;
        *w = (worker){.ex = ex, .stream = s, .ctx = tide_ctx_new()};
        if (!w->ctx) return tide_err(ex->ctx, TIDE_E_NOMEM, "out of memory creating the executor");
        tide_status st = TIDE_OK;
        if (be->vt->queue_new) st = be->vt->queue_new(be, w->ctx, ex->async && !by_host, &w->q);
        if (!st && s == TIDE_STREAM_HOST && ex->host_be)
            st = ex->host_be->vt->queue_new(ex->host_be, w->ctx, false, &w->hq);
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
    if (ex->comm) tide_comm_clear_cancel(ex->comm, &ex->failed);
    stop_workers(ex);
    /* the queues first: freeing one waits for its work, which may use the
     * events and the memory below */
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        if (ex->wk[s].q) ex->be->vt->queue_free(ex->be, ex->wk[s].q);
        if (ex->wk[s].hq) ex->host_be->vt->queue_free(ex->host_be, ex->wk[s].hq);
    }
    tide_backend_free(ex->host_be);
    tide_free_aligned(ex->host_scratch);
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

/* Opens the file of a home: O_DIRECT where the filesystem allows it (and
 * the options do not forbid it), else buffered; read-write when rw. */
static tide_status open_home(tide_exec *ex, int t, const char *path, bool rw, home_ref *h) {
    int fd = -1;
    if (!ex->buffered_files && (rw ? tide_ssd_open_direct_rw(path, &fd) : tide_ssd_open_direct(path, &fd)) == TIDE_OK) {
        h->direct = true;
    } else {
        fd = open(path, (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC);
        if (fd < 0)
            return tide_err(ex->ctx, TIDE_E_IO, "cannot open %s%s for '%s': %s", path, rw ? " read-write" : "",
                            tname(ex, t), strerror(errno));
        h->direct = false;
    }
    h->fd = fd;
    h->writable = rw;
    struct stat sb;
    if (fstat(fd, &sb) == 0) {
        h->dev = sb.st_dev;
        h->ino = sb.st_ino;
    }
    return TIDE_OK;
}

tide_status tide_exec_bind_file(tide_exec *ex, int t, const char *path, uint64_t off) {
    if (t < 0 || t >= ex->g->n_tensors)
        return tide_err(ex->ctx, TIDE_E_INVALID, "binding tensor %d: no such tensor", t);
    const tide_tensor *T = &ex->g->tensors[t];
    if (T->role != TIDE_ROLE_WEIGHT && T->role != TIDE_ROLE_STATE)
        return tide_err(ex->ctx, TIDE_E_UNSUPPORTED, "only weights and state can be homed in a file ('%s' is %s)",
                        T->name, tide_role_name(T->role));
    bool rw = T->role == TIDE_ROLE_STATE; /* written back by the run */
    home_ref *h = &ex->home[t];
    release_fd(ex, t);
    struct stat sb;
    bool known = stat(path, &sb) == 0;
    /* a state's extent is read before it is written: it must be there (a
     * weight's tail past the end reads as zeros, ssd.h) */
    if (rw && known && (off > (uint64_t)sb.st_size || T->nbytes > (uint64_t)sb.st_size - off))
        return tide_err(ex->ctx, TIDE_E_INVALID, "'%s' is homed at bytes [%llu, %llu) of %s, past its end (%llu bytes)",
                        T->name, (unsigned long long)off, (unsigned long long)(off + T->nbytes), path,
                        (unsigned long long)sb.st_size);
    /* a checkpoint or state file holds many tensors: one descriptor for all
     * of them, so that a large model does not run out of descriptors; a
     * read-only one serves no state */
    if (known)
        for (int u = 0; u < ex->g->n_tensors; u++) {
            const home_ref *o = &ex->home[u];
            if (o->fd >= 0 && o->dev == sb.st_dev && o->ino == sb.st_ino && (o->writable || !rw)) {
                h->fd = o->fd;
                h->direct = o->direct;
                h->writable = o->writable;
                h->dev = o->dev;
                h->ino = o->ino;
                h->file_off = off;
                return TIDE_OK;
            }
        }
    tide_status st = open_home(ex, t, path, rw, h);
    if (!st) h->file_off = off;
    return st;
}

/* ---------------------------------------------------------------- computes */

/* Where operand k of COMPUTE in (tensor t) is: its arena range, or a host
 * copy, its home or a range of the host spill pool. */
static void *opnd_ptr(const tide_exec *ex, const tide_ins *in, int k, int t) {
    if (!tide_ins_host_opnd(in, k)) return ex->arena + in->dev_off[k];
    return in->dev_off[k] == TIDE_HOME ? ex->home[t].host : ex->host_pool + in->dev_off[k];
}

/* A COMPUTE on the device's backend, or, placed on the host, on the host
 * backend with its operands in host memory. */
static tide_status run_compute(worker *w, int i) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_op *op = &ex->g->ops[in->op];
    bool host = in->place == TIDE_PLACE_HOST;
    void *ip[TIDE_OP_MAX_IN], *op_out[TIDE_OP_MAX_OUT];
    for (int j = 0; j < op->n_in; j++) ip[j] = opnd_ptr(ex, in, j, op->in[j]);
    for (int j = 0; j < op->n_out; j++) op_out[j] = opnd_ptr(ex, in, op->n_in + j, op->out[j]);
    void *scratch = !op->scratch_bytes ? NULL : host ? ex->host_scratch : ex->arena + in->scratch_off;
    tide_backend *be = host ? ex->host_be : ex->be;
    void *q = host ? w->hq : w->q;
    tide_status st = be->vt->compute(be, q, ex->g, op, ip, op_out, scratch);
    if (st)
        return tide_err(w->ctx, st, "instruction %d (%s, op %d%s, iteration %d): %s", i, tide_op_name(op->kind),
                        in->op, host ? " on the host" : "", in->iter, tide_ctx_last_error(tide_backend_queue_ctx(be, q)));
    return TIDE_OK;
}

/* A collective (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER) on the net stream:
 * the graph's op on its device copies with the other ranks (net/comm.h).
 * Where the backend's device memory is host memory, on the host
 * collectives (MPI); else on the communicator's device collectives (NCCL),
 * with the arena's device pointers, on the net stream's queue, whose stream
 * has already waited for what the instruction waits on (worker_run). */
static tide_status run_collective(worker *w, int i) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_op *op = &ex->g->ops[in->op];
    const tide_tensor *x = &ex->g->tensors[op->in[0]], *y = &ex->g->tensors[op->out[0]];
    void *src = ex->arena + in->dev_off[0], *dst = ex->arena + in->dev_off[1];
    char what[300];
    snprintf(what, sizeof what, "'%s' (instruction %d)", x->name, i);
    void *dev_st = NULL;
    const tide_comm_dev *dev = ex->be->vt->device_is_host ? NULL : tide_comm_get_dev(ex->comm, &dev_st);
    if (dev) {
        const tide_tensor *whole = in->kind == TIDE_INS_ALL_GATHER ? y : x;
        int64_t rows = whole->ndim ? whole->shape[0] : 1;
        uint64_t per = rows ? (uint64_t)rows : 1;
        switch (in->kind) {
        case TIDE_INS_ALL_REDUCE:
            return dev->allreduce_f32(dev_st, w->ctx, src, dst, x->nbytes / sizeof(float), w->q, what);
        case TIDE_INS_REDUCE_SCATTER:
            return dev->reduce_scatter_f32(dev_st, w->ctx, src, dst, rows, (uint64_t)tide_tensor_numel(x) / per,
                                           w->q, what);
        case TIDE_INS_ALL_GATHER:
            snprintf(what, sizeof what, "'%s' (instruction %d)", y->name, i);
            return dev->allgather_rows(dev_st, w->ctx, src, dst, rows, y->nbytes / per, w->q, what);
        default: return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d is no collective", i);
        }
    }
    switch (in->kind) {
    case TIDE_INS_ALL_REDUCE:
        if (src != dst) memcpy(dst, src, x->nbytes);
        return tide_comm_allreduce_f32(ex->comm, w->ctx, dst, x->nbytes / sizeof(float), what);
    case TIDE_INS_REDUCE_SCATTER: {
        int64_t rows = x->ndim ? x->shape[0] : 1;
        return tide_comm_reduce_scatter_f32(ex->comm, w->ctx, src, dst, rows,
                                            (uint64_t)tide_tensor_numel(x) / (uint64_t)(rows ? rows : 1), what);
    }
    case TIDE_INS_ALL_GATHER: {
        int64_t rows = y->ndim ? y->shape[0] : 1;
        snprintf(what, sizeof what, "'%s' (instruction %d)", y->name, i);
        return tide_comm_allgather_rows(ex->comm, w->ctx, src, dst, rows, y->nbytes / (uint64_t)(rows ? rows : 1),
                                        what);
    }
    default: return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d is no collective", i);
    }
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
    case TIDE_INS_LOAD: return exec_load(w, i);
    case TIDE_INS_STORE: return exec_store(w, i);
    case TIDE_INS_MOVE: return exec_move(w, i);
    case TIDE_INS_DROP: return TIDE_OK; /* the arena range is free once this completes */
    case TIDE_INS_ALL_REDUCE:
    case TIDE_INS_REDUCE_SCATTER:
    case TIDE_INS_ALL_GATHER: return run_collective(w, i);
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
    /* the io and host streams' work is done by the host: synchronous */
    bool async = ex->async && w->stream != TIDE_STREAM_IO && w->stream != TIDE_STREAM_HOST;
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
    /* a rank's collectives give up when another of its streams fails */
    if (ex->comm) tide_comm_set_cancel(ex->comm, &ex->failed);
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
    /* the run's start, read before the timeline's base event is recorded:
     * the base completes after it, so every measured end (relative to the
     * base) lies within the wall time (relative to this), however late the
     * caller's thread runs on a loaded machine */
    ex->t0 = tide_now();
    if (timeline && ex->async) {
        if (!ex->ev_time)
            return tide_err(ex->ctx, TIDE_E_INVALID, "a timeline was asked of an executor made without "
                            "timing events (tide_exec_opts.timed)");
        /* the base every timing event is measured from, on the first
         * stream's queue before anything is queued (its worker is idle) */
        if (base_w && (st = ex->be->vt->event_record(ex->be, base_w->q, ex->ev_time[2 * p->n_ins])))
            return tide_err(ex->ctx, st, "starting the run's timeline: %s", tide_ctx_last_error(queue_ctx(base_w)));
    }
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
#ifdef TIDE_TEST_HOOKS
    apply_test_timing(p, timeline, &wall);
#endif
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
