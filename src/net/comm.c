/*
 * comm.c - the data-parallel ranks' communicator (comm.h, tide.h): the
 * launch read from the environment, and the collectives on its carrier:
 * MPI where the build has it (TIDE_HAVE_MPI) for the launches MPI joins, TCP
 * sockets (net/comm_tcp.c) for a torchrun-style one.
 *
 * Launches. Open MPI's mpirun or mpiexec (OMPI_COMM_WORLD_SIZE), or srun
 * with PMIx or PMI-2 (PMIX_RANK or SLURM_PROCID with a job step's
 * SLURM_STEP_NUM_TASKS, or PMI_SIZE): MPI joins the ranks. torchrun, or any
 * launcher that sets TIDE_WORLD_SIZE / TIDE_RANK (or WORLD_SIZE / RANK) with
 * MASTER_ADDR and MASTER_PORT: the ranks meet over TCP at rank 0
 * (comm_tcp.h), with no MPI.
 *
 * Timeouts. Every collective waits at most TIDE_NET_TIMEOUT seconds
 * (default 300) for the other ranks: on MPI a non-blocking call polled until
 * it completes, on TCP the time without progress. A rank that died or
 * stopped answering fails the others' call with a message; the program then
 * ends every rank (tide_comm_abort). Open MPI's mpirun ends the job by itself
 * as soon as one rank's process dies, naming the rank; on TCP a dead rank's
 * closed connections fail the others' next transfer at once, naming it.
 */
#include "net/comm.h"
#include "net/comm_tcp.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

void tide_comm_shard_rows(int64_t rows, int size, int r, int64_t *r0, int64_t *n) {
    int64_t c = (rows + size - 1) / size;
    int64_t a = (int64_t)r * c, b = a + c;
    if (a > rows) a = rows;
    if (b > rows) b = rows;
    *r0 = a;
    *n = b - a;
}

/* The launch the environment describes: its ranks (1: none) and this
 * process's rank. */
static long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return *end ? -1 : x;
}

int tide_comm_launch_env(int *rank, const char **launcher) {
    static const struct {
        const char *size, *rank, *name;
    } kinds[] = {
        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "mpirun"},
        {"PMI_SIZE", "PMI_RANK", "pmi"},
        {"SLURM_STEP_NUM_TASKS", "PMIX_RANK", "srun"},
        {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun"},
        {"TIDE_WORLD_SIZE", "TIDE_RANK", "torchrun"},
        {"WORLD_SIZE", "RANK", "torchrun"},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        long n = env_long(kinds[k].size, 0), r = env_long(kinds[k].rank, -2);
        if (n == 0 || r == -2) continue;
        if (rank) *rank = r < 0 ? 0 : (int)r;
        if (launcher) *launcher = kinds[k].name;
        return n < 1 || n > (1 << 20) ? -1 : (int)n;
    }
    if (rank) *rank = 0;
    if (launcher) *launcher = "none";
    return 1;
}

static tide_status check_launch(tide_ctx *ctx, int *n, int *rank, const char **launcher) {
    *n = tide_comm_launch_env(rank, launcher);
    if (*n < 0) return tide_err(ctx, TIDE_E_INVALID, "the launcher's rank variables are malformed (%s)", *launcher);
    return TIDE_OK;
}

#ifdef TIDE_HAVE_MPI
#include <mpi.h>
#include <limits.h>
#endif

struct tide_comm {
    int rank, size;
    double timeout_s;
    uint64_t bytes_sent;  /* ring algorithms' bytes this rank sent (the formula, docs/training.md section 12) */
    const atomic_bool *_Atomic cancel; /* the running executor's failure flag, or NULL */
    const tide_comm_dev *dev;          /* collectives on device memory (NCCL), or NULL */
    void *dev_st;
    tide_tcp *tcp; /* the TCP carrier (a torchrun-style launch), or NULL: MPI */
#ifdef TIDE_HAVE_MPI
    MPI_Comm comm;
    bool inited_here;   /* MPI_Init_thread was ours: finalize on close */
    int *counts, *displs; /* per rank, for the v-collectives */
#endif
};

void tide_comm_set_dev(tide_comm *c, const tide_comm_dev *dev, void *st) {
    c->dev = dev;
    c->dev_st = st;
}
const tide_comm_dev *tide_comm_get_dev(const tide_comm *c, void **st) {
    if (st) *st = c && c->dev ? c->dev_st : NULL;
    return c ? c->dev : NULL;
}
double tide_comm_timeout_s(const tide_comm *c) { return c->timeout_s; }
bool tide_comm_cancelled(const tide_comm *c) {
    const atomic_bool *f = atomic_load(&c->cancel);
    return f && atomic_load(f);
}
void tide_comm_count_sent(tide_comm *c, uint64_t bytes) { c->bytes_sent += bytes; }

void tide_comm_set_cancel(tide_comm *c, const atomic_bool *flag) { atomic_store(&c->cancel, flag); }
void tide_comm_clear_cancel(tide_comm *c, const atomic_bool *flag) {
    const atomic_bool *want = flag;
    atomic_compare_exchange_strong(&c->cancel, &want, NULL);
}

/* Ranks are always possible: over TCP without MPI. */
bool tide_comm_available(void) { return true; }
bool tide_comm_mpi_available(void) {
#ifdef TIDE_HAVE_MPI
    return true;
#else
    return false;
#endif
}

int tide_comm_rank(const tide_comm *c) { return c ? c->rank : 0; }
int tide_comm_size(const tide_comm *c) { return c ? c->size : 1; }
uint64_t tide_comm_bytes_sent(const tide_comm *c) { return c ? c->bytes_sent : 0; }
const char *tide_comm_carrier(const tide_comm *c) { return !c ? "none" : c->tcp ? "tcp" : "mpi"; }

static tide_status mpi_open(tide_ctx *ctx, tide_comm *c, int n, const char *launcher);

tide_status tide_comm_open(tide_ctx *ctx, tide_comm **out) {
    *out = NULL;
    int n = 1, rank = 0;
    const char *launcher = NULL;
    tide_status st = check_launch(ctx, &n, &rank, &launcher);
    if (st) return st;
    double timeout = 300;
    const char *to = getenv("TIDE_NET_TIMEOUT");
    if (to && *to) {
        char *end;
        double v = strtod(to, &end);
        if (*end || !(v > 0))
            return tide_err(ctx, TIDE_E_INVALID, "TIDE_NET_TIMEOUT '%s' is not a positive number of seconds", to);
        timeout = v;
    }
    tide_comm *c = tide_calloc(1, sizeof *c);
    if (!c) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    c->timeout_s = timeout;
    if (!strcmp(launcher, "torchrun")) {
        if (rank >= n) {
            tide_free(c);
            return tide_err(ctx, TIDE_E_INVALID, "the launch names rank %d of %d ranks (RANK must be below "
                            "WORLD_SIZE)", rank, n);
        }
        c->rank = rank;
        c->size = n;
        st = tide_tcp_open(ctx, rank, n, timeout, &c->cancel, &c->tcp);
    } else {
        st = mpi_open(ctx, c, n, launcher);
    }
    if (st) {
        tide_free(c);
        return st;
    }
    *out = c;
    return TIDE_OK;
}

static void mpi_close(tide_comm *c);
static void mpi_abort(tide_comm *c, int code);

void tide_comm_close(tide_comm *c) {
    if (!c) return;
    if (c->dev && c->dev->close) c->dev->close(c->dev_st);
    if (c->tcp) tide_tcp_close(c->tcp);
    else mpi_close(c);
    tide_free(c);
}

void tide_comm_abort(tide_comm *c, int code) {
    if (c && c->tcp) {
        tide_tcp_shutdown(c->tcp); /* the others' transfers fail at once */
        exit(code ? code : 1);
    }
    mpi_abort(c, code ? code : 1);
}

/* The collectives: the carrier's, and the ring formula's bytes counted. */
static tide_status mpi_allreduce(tide_comm *c, tide_ctx *ctx, void *x, uint64_t n, int elem, const char *what);
static tide_status mpi_reduce_scatter_f32(tide_comm *c, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                          uint64_t row_elems, const char *what);
static tide_status mpi_allgather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                      uint64_t row_bytes, const char *what);
static tide_status mpi_gather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                   uint64_t row_bytes, const char *what);
static tide_status mpi_bcast(tide_comm *c, tide_ctx *ctx, void *buf, size_t n, const char *what);

tide_status tide_comm_allreduce_f32(tide_comm *c, tide_ctx *ctx, float *x, uint64_t n, const char *what) {
    tide_status st = c->tcp ? tide_tcp_allreduce(c->tcp, ctx, x, n, 4, what) : mpi_allreduce(c, ctx, x, n, 4, what);
    if (!st) c->bytes_sent += 2 * n * sizeof(float) * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return st;
}

tide_status tide_comm_allreduce_f64(tide_comm *c, tide_ctx *ctx, double *x, int n, const char *what) {
    if (n < 0) return tide_err(ctx, TIDE_E_INVALID, "all-reduce of %s: %d values", what, n);
    return c->tcp ? tide_tcp_allreduce(c->tcp, ctx, x, (uint64_t)n, 8, what)
                  : mpi_allreduce(c, ctx, x, (uint64_t)n, 8, what);
}

tide_status tide_comm_reduce_scatter_f32(tide_comm *c, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                         uint64_t row_elems, const char *what) {
    tide_status st = c->tcp ? tide_tcp_reduce_scatter_f32(c->tcp, ctx, x, shard, rows, row_elems, what)
                            : mpi_reduce_scatter_f32(c, ctx, x, shard, rows, row_elems, what);
    if (!st)
        c->bytes_sent += (uint64_t)rows * row_elems * sizeof(float) * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return st;
}

tide_status tide_comm_allgather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                     uint64_t row_bytes, const char *what) {
    tide_status st = c->tcp ? tide_tcp_allgather_rows(c->tcp, ctx, shard, x, rows, row_bytes, what)
                            : mpi_allgather_rows(c, ctx, shard, x, rows, row_bytes, what);
    if (!st) c->bytes_sent += (uint64_t)rows * row_bytes * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return st;
}

tide_status tide_comm_gather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                  uint64_t row_bytes, const char *what) {
    return c->tcp ? tide_tcp_gather_rows(c->tcp, ctx, shard, x, rows, row_bytes, what)
                  : mpi_gather_rows(c, ctx, shard, x, rows, row_bytes, what);
}

tide_status tide_comm_bcast(tide_comm *c, tide_ctx *ctx, void *buf, size_t n, const char *what) {
    return c->tcp ? tide_tcp_bcast(c->tcp, ctx, buf, n, what) : mpi_bcast(c, ctx, buf, n, what);
}

tide_status tide_comm_same(tide_comm *c, tide_ctx *ctx, uint64_t v, const char *what) {
    uint64_t *all = tide_malloc((size_t)c->size * sizeof *all);
    if (!all) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    /* every rank's value on every rank (the bytes are not the step's) */
    tide_status st = c->tcp ? tide_tcp_allgather_rows(c->tcp, ctx, &v, all, c->size, sizeof v, what)
                            : mpi_allgather_rows(c, ctx, &v, all, c->size, sizeof v, what);
    for (int r = 1; !st && r < c->size; r++)
        if (all[r] != all[0])
            st = tide_err(ctx, TIDE_E_INVALID, "rank %d's %s differs from rank 0's (hash %016llx, not %016llx): every "
                          "rank must be started with the same options, model and data", r, what,
                          (unsigned long long)all[r], (unsigned long long)all[0]);
    tide_free(all);
    return st;
}

#ifndef TIDE_HAVE_MPI

static tide_status mpi_open(tide_ctx *ctx, tide_comm *c, int n, const char *launcher) {
    (void)c, (void)n, (void)launcher;
    return tide_err(ctx, TIDE_E_UNSUPPORTED, "ranks launched by mpirun or srun are joined by MPI, and this tide "
                    "was built without it (install Open MPI's development files, libopenmpi-dev, and rebuild; or "
                    "start the ranks torchrun-style: WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT)");
}
static void mpi_close(tide_comm *c) { (void)c; }
static void mpi_abort(tide_comm *c, int code) {
    (void)c;
    exit(code);
}
#define NO_MPI(ctx) tide_err(ctx, TIDE_E_UNSUPPORTED, "MPI's collectives: not built")
static tide_status mpi_allreduce(tide_comm *c, tide_ctx *ctx, void *x, uint64_t n, int elem, const char *what) {
    return NO_MPI(ctx);
}
static tide_status mpi_reduce_scatter_f32(tide_comm *c, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                          uint64_t row_elems, const char *what) {
    return NO_MPI(ctx);
}
static tide_status mpi_allgather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                      uint64_t row_bytes, const char *what) {
    return NO_MPI(ctx);
}
static tide_status mpi_gather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                   uint64_t row_bytes, const char *what) {
    return NO_MPI(ctx);
}
static tide_status mpi_bcast(tide_comm *c, tide_ctx *ctx, void *buf, size_t n, const char *what) {
    return NO_MPI(ctx);
}

#else

static tide_status mpi_open(tide_ctx *ctx, tide_comm *c, int n, const char *launcher) {
    int flag = 0;
    MPI_Initialized(&flag);
    bool here = false;
#ifdef OMPI_MAJOR_VERSION
    /* Open MPI joins the ranks srun starts through PMIx (srun --mpi=pmix);
     * without it MPI_Init_thread would end each rank with Open MPI's own
     * message, before tide could say which option is missing */
    const char *pmix = getenv("PMIX_RANK");
    if (!flag && n > 1 && !strcmp(launcher, "srun") && !(pmix && *pmix))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "srun started %d ranks without PMIx, through which Open MPI joins "
                        "them: start them with srun --mpi=pmix (or set MpiDefault=pmix in slurm.conf)", n);
#endif
    if (!flag) {
        int provided = 0;
        /* the net stream's worker and the trainer call MPI from different
         * threads, never at once */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return tide_err(ctx, TIDE_E_BACKEND, "MPI_Init_thread failed");
        if (provided < MPI_THREAD_SERIALIZED) {
            MPI_Finalize();
            return tide_err(ctx, TIDE_E_UNSUPPORTED, "this MPI cannot be called from more than one thread "
                            "(MPI_THREAD_SERIALIZED; it provides level %d)", provided);
        }
        here = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    c->inited_here = here;
    c->counts = tide_malloc((size_t)c->size * sizeof *c->counts);
    c->displs = tide_malloc((size_t)c->size * sizeof *c->displs);
    if (!c->counts || !c->displs) {
        mpi_close(c);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    }
    return TIDE_OK;
}

static void mpi_close(tide_comm *c) {
    MPI_Comm_free(&c->comm);
    if (c->inited_here) MPI_Finalize();
    tide_free(c->counts);
    tide_free(c->displs);
    c->counts = c->displs = NULL;
}

static void mpi_abort(tide_comm *c, int code) { MPI_Abort(c ? c->comm : MPI_COMM_WORLD, code); }

static tide_status mpi_fail(tide_comm *c, tide_ctx *ctx, int rc, const char *call, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %s of %s failed: %s", c->rank, c->size, call, what, msg);
}

/* Polls req until it completes or the timeout passes. */
static tide_status wait_req(tide_comm *c, tide_ctx *ctx, MPI_Request *req, const char *call, const char *what) {
    double t0 = tide_now();
    long ns = 20000;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(c, ctx, rc, call, what);
        if (done) return TIDE_OK;
        const atomic_bool *cancel = atomic_load(&c->cancel);
        if (cancel && atomic_load(cancel))
            return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %s of %s abandoned: another stream of this rank failed",
                            c->rank, c->size, call, what);
        double el = tide_now() - t0;
        if (el > c->timeout_s)
            return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %s of %s timed out after %.0f s: another rank stopped "
                            "answering (died, or is stuck; TIDE_NET_TIMEOUT sets the limit)", c->rank, c->size,
                            call, what, el);
        /* the first millisecond: yield (MPI_Test moves the transfer on; a
         * compute of this rank takes the core when it wants it); then sleep,
         * longer and longer up to 200 us */
        if (el < 1e-3) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 200000) ns += ns / 4;
    }
}

#define CALL(expr, name)                                                                                         \
    do {                                                                                                         \
        int rc_ = (expr);                                                                                        \
        if (rc_ != MPI_SUCCESS) return mpi_fail(c, ctx, rc_, name, what);                                        \
        tide_status st_ = wait_req(c, ctx, &req, name, what);                                                    \
        if (st_) return st_;                                                                                     \
    } while (0)

static tide_status mpi_allreduce(tide_comm *c, tide_ctx *ctx, void *x, uint64_t n, int elem, const char *what) {
    MPI_Datatype type = elem == 8 ? MPI_DOUBLE : MPI_FLOAT;
    for (uint64_t at = 0; at < n;) {
        uint64_t k = n - at > (uint64_t)INT_MAX ? (uint64_t)INT_MAX : n - at;
        MPI_Request req;
        CALL(MPI_Iallreduce(MPI_IN_PLACE, (char *)x + at * (uint64_t)elem, (int)k, type, MPI_SUM, c->comm, &req),
             "all-reduce");
        at += k;
    }
    return TIDE_OK;
}

/* The per-rank counts and displacements of rows x unit elements; false when
 * one exceeds an int. */
static bool fill_counts(tide_comm *c, int64_t rows, uint64_t unit) {
    for (int r = 0; r < c->size; r++) {
        int64_t r0, n;
        tide_comm_shard_rows(rows, c->size, r, &r0, &n);
        uint64_t cnt = (uint64_t)n * unit, dsp = (uint64_t)r0 * unit;
        if (cnt > INT_MAX || dsp > INT_MAX) return false;
        c->counts[r] = (int)cnt;
        c->displs[r] = (int)dsp;
    }
    return true;
}

static tide_status mpi_reduce_scatter_f32(tide_comm *c, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                          uint64_t row_elems, const char *what) {
    if (!fill_counts(c, rows, row_elems))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "reduce-scatter of %s: a rank's part is over 2^31 - 1 elements",
                        what);
    MPI_Request req;
    CALL(MPI_Ireduce_scatter(x, shard, c->counts, MPI_FLOAT, MPI_SUM, c->comm, &req), "reduce-scatter");
    int64_t c_rows = (rows + c->size - 1) / c->size;
    uint64_t have = (uint64_t)c->counts[c->rank], want = (uint64_t)c_rows * row_elems;
    if (have < want) memset(shard + have, 0, (want - have) * sizeof *shard);
    return TIDE_OK;
}

static tide_status mpi_allgather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                      uint64_t row_bytes, const char *what) {
    if (!fill_counts(c, rows, row_bytes))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "all-gather of %s: a rank's part is over 2^31 - 1 bytes", what);
    MPI_Request req;
    CALL(MPI_Iallgatherv(shard, c->counts[c->rank], MPI_BYTE, x, c->counts, c->displs, MPI_BYTE, c->comm, &req),
         "all-gather");
    return TIDE_OK;
}

static tide_status mpi_gather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                   uint64_t row_bytes, const char *what) {
    if (!fill_counts(c, rows, row_bytes))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "gather of %s: a rank's part is over 2^31 - 1 bytes", what);
    MPI_Request req;
    CALL(MPI_Igatherv(shard, c->counts[c->rank], MPI_BYTE, x, c->counts, c->displs, MPI_BYTE, 0, c->comm, &req),
         "gather");
    return TIDE_OK;
}

static tide_status mpi_bcast(tide_comm *c, tide_ctx *ctx, void *buf, size_t n, const char *what) {
    if (n > INT_MAX) return tide_err(ctx, TIDE_E_UNSUPPORTED, "broadcast of %s: over 2^31 - 1 bytes", what);
    MPI_Request req;
    CALL(MPI_Ibcast(buf, (int)n, MPI_BYTE, 0, c->comm, &req), "broadcast");
    return TIDE_OK;
}

#endif
