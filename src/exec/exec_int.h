/*
 * exec_int.h - the executor's internal layout, shared by its two files:
 * executor.c (set-up, the stream workers, computes, the run) and
 * exec_transfer.c (LOAD, STORE and MOVE, through bounce buffers where the SSD
 * is involved). The design note is at the top of executor.c.
 */
#ifndef TIDE_EXEC_INT_H
#define TIDE_EXEC_INT_H

#include "exec/executor.h"
#include "store/ssd.h"
#include "net/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#define ALIGN 4096u
#define BOUNCE_BYTES (8u << 20)

typedef struct home_ref {
    void *host;          /* host home, or NULL */
    int fd;              /* file home (O_DIRECT when direct), or -1; one descriptor
                            per file and mode, shared by the tensors homed in it */
    bool direct;
    bool writable;       /* fd is read-write (a STATE's home, written back; a
                            weight may share it); else read-only */
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
    void *hq;      /* the host stream's: its queue on the host backend */
    tide_ctx *ctx; /* its own (E4): its queue's errors and its own messages */
} worker;

struct tide_exec {
    tide_ctx *ctx;
    tide_backend *be;
    const tide_plan *p;
    const tide_graph *g;
    tide_comm *comm;            /* a rank's plan: the ranks' communicator, else NULL */
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
    bool buffered_files;        /* file homes opened without O_DIRECT (opts) */
    bool bounce_by_backend;     /* pinned, from be->vt->host_alloc */
    home_ref *home;
    /* computes placed on the host (the host stream) */
    tide_backend *host_be;      /* a CPU backend of the executor's own, or NULL */
    void *host_scratch;         /* the largest scratch of a host-placed op */
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

static inline const char *tname(const tide_exec *ex, int t) { return ex->g->tensors[t].name; }

/* The context a backend call on w's queue recorded its error on. */
static inline tide_ctx *queue_ctx(const worker *w) { return tide_backend_queue_ctx(w->ex->be, w->q); }

/* A failed backend call on w's queue, on w's context. */
static inline tide_status queue_fail(worker *w, tide_status st) {
    return w->q ? st : tide_err(w->ctx, st, "%s", tide_ctx_last_error(queue_ctx(w)));
}

/* LOAD, STORE and MOVE instruction i on w's stream (exec_transfer.c).
 * Errors on w's context. */
tide_status exec_load(worker *w, int i);
tide_status exec_store(worker *w, int i);
tide_status exec_move(worker *w, int i);

#endif
