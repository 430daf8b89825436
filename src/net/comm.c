/*
 * comm.c - the data-parallel ranks' communicator (comm.h, tide.h): the
 * launch read from the environment, and the collectives on MPI where the
 * build has it (TIDE_HAVE_MPI).
 *
 * Launches. MPI joins the ranks, so they are started by a launcher MPI_Init
 * understands: Open MPI's mpirun or mpiexec (OMPI_COMM_WORLD_SIZE), or srun
 * with PMIx or PMI-2 (PMIX_RANK or SLURM_PROCID with a job step's
 * SLURM_STEP_NUM_TASKS, or PMI_SIZE). The
 * torchrun-style variables (TIDE_WORLD_SIZE / TIDE_RANK, or WORLD_SIZE /
 * RANK with MASTER_ADDR) name a launch too, but MPI cannot rendezvous at a
 * MASTER_ADDR: tide_comm_open refuses them with a message saying to start
 * the ranks with mpirun.
 *
 * Timeouts. Every collective is a non-blocking MPI call polled until it
 * completes or the timeout passes (TIDE_NET_TIMEOUT seconds, default 300):
 * a rank that died or stopped answering fails the others' call with a
 * message; the program then ends every rank (tide_comm_abort). Open MPI's
 * mpirun ends the job by itself as soon as one rank's process dies, naming
 * the rank; the timeout covers a rank that lives but never arrives.
 */
#include "net/comm.h"
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

/* The launch, if MPI can join it. */
static tide_status check_launch(tide_ctx *ctx) {
    const char *launcher = NULL;
    int n = tide_comm_launch_env(NULL, &launcher);
    if (n < 0) return tide_err(ctx, TIDE_E_INVALID, "the launcher's rank variables are malformed (%s)", launcher);
    if (n > 1 && !strcmp(launcher, "torchrun"))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "the environment names %d ranks torchrun-style (TIDE_WORLD_SIZE or "
                        "WORLD_SIZE), but tide's ranks are joined by MPI, which cannot meet at a MASTER_ADDR: start "
                        "them with mpirun -np %d (or srun --mpi=pmix)", n, n);
    return TIDE_OK;
}

#ifndef TIDE_HAVE_MPI

bool tide_comm_available(void) { return false; }

static tide_status check_launch(tide_ctx *ctx);

tide_status tide_comm_open(tide_ctx *ctx, tide_comm **out) {
    *out = NULL;
    tide_status st = check_launch(ctx);
    if (st) return st;
    return tide_err(ctx, TIDE_E_UNSUPPORTED, "data-parallel ranks need MPI, and this tide was built without it "
                    "(install Open MPI's development files, libopenmpi-dev, and rebuild)");
}
int tide_comm_rank(const tide_comm *c) { return 0; }
int tide_comm_size(const tide_comm *c) { return 1; }
void tide_comm_close(tide_comm *c) {}
void tide_comm_abort(tide_comm *c, int code) {}
uint64_t tide_comm_bytes_sent(const tide_comm *c) { return 0; }

#define NO_MPI(ctx) tide_err(ctx, TIDE_E_UNSUPPORTED, "data-parallel ranks need MPI (not built)")
tide_status tide_comm_allreduce_f32(tide_comm *c, tide_ctx *ctx, float *x, uint64_t n, const char *what) {
    return NO_MPI(ctx);
}
tide_status tide_comm_allreduce_f64(tide_comm *c, tide_ctx *ctx, double *x, int n, const char *what) {
    return NO_MPI(ctx);
}
tide_status tide_comm_reduce_scatter_f32(tide_comm *c, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                         uint64_t row_elems, const char *what) {
    return NO_MPI(ctx);
}
tide_status tide_comm_allgather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                     uint64_t row_bytes, const char *what) {
    return NO_MPI(ctx);
}
tide_status tide_comm_bcast(tide_comm *c, tide_ctx *ctx, void *buf, size_t n, const char *what) { return NO_MPI(ctx); }
tide_status tide_comm_gather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                  uint64_t row_bytes, const char *what) {
    return NO_MPI(ctx);
}
tide_status tide_comm_same(tide_comm *c, tide_ctx *ctx, uint64_t v, const char *what) { return NO_MPI(ctx); }
void tide_comm_set_cancel(tide_comm *c, const atomic_bool *flag) {}
void tide_comm_clear_cancel(tide_comm *c, const atomic_bool *flag) {}
void tide_comm_set_dev(tide_comm *c, const tide_comm_dev *dev, void *st) {}
const tide_comm_dev *tide_comm_get_dev(const tide_comm *c, void **st) { return NULL; }
double tide_comm_timeout_s(const tide_comm *c) { return 300; }
bool tide_comm_cancelled(const tide_comm *c) { return false; }
void tide_comm_count_sent(tide_comm *c, uint64_t bytes) {}

#else

#include <mpi.h>
#include <limits.h>

struct tide_comm {
    MPI_Comm comm;
    int rank, size;
    bool inited_here;   /* MPI_Init_thread was ours: finalize on close */
    double timeout_s;
    int *counts, *displs; /* per rank, for the v-collectives */
    uint64_t bytes_sent;  /* ring algorithms' bytes this rank sent (the formula, docs/training.md section 12) */
    const atomic_bool *_Atomic cancel; /* the running executor's failure flag, or NULL */
    const tide_comm_dev *dev;          /* collectives on device memory (NCCL), or NULL */
    void *dev_st;
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

bool tide_comm_available(void) { return true; }

tide_status tide_comm_open(tide_ctx *ctx, tide_comm **out) {
    *out = NULL;
    tide_status st0 = check_launch(ctx);
    if (st0) return st0;
    int flag = 0;
    MPI_Initialized(&flag);
    bool here = false;
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
    tide_comm *c = tide_calloc(1, sizeof *c);
    if (!c) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    c->inited_here = here;
    c->timeout_s = 300;
    const char *to = getenv("TIDE_NET_TIMEOUT");
    if (to && *to) {
        char *end;
        double v = strtod(to, &end);
        if (*end || !(v > 0)) {
            tide_comm_close(c);
            return tide_err(ctx, TIDE_E_INVALID, "TIDE_NET_TIMEOUT '%s' is not a positive number of seconds", to);
        }
        c->timeout_s = v;
    }
    c->counts = tide_malloc((size_t)c->size * sizeof *c->counts);
    c->displs = tide_malloc((size_t)c->size * sizeof *c->displs);
    if (!c->counts || !c->displs) {
        tide_comm_close(c);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    }
    *out = c;
    return TIDE_OK;
}

int tide_comm_rank(const tide_comm *c) { return c ? c->rank : 0; }
int tide_comm_size(const tide_comm *c) { return c ? c->size : 1; }
uint64_t tide_comm_bytes_sent(const tide_comm *c) { return c ? c->bytes_sent : 0; }

void tide_comm_close(tide_comm *c) {
    if (!c) return;
    if (c->dev && c->dev->close) c->dev->close(c->dev_st);
    MPI_Comm_free(&c->comm);
    if (c->inited_here) MPI_Finalize();
    tide_free(c->counts);
    tide_free(c->displs);
    tide_free(c);
}

void tide_comm_abort(tide_comm *c, int code) { MPI_Abort(c ? c->comm : MPI_COMM_WORLD, code ? code : 1); }

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

tide_status tide_comm_allreduce_f32(tide_comm *c, tide_ctx *ctx, float *x, uint64_t n, const char *what) {
    for (uint64_t at = 0; at < n;) {
        uint64_t k = n - at > (uint64_t)INT_MAX ? (uint64_t)INT_MAX : n - at;
        MPI_Request req;
        CALL(MPI_Iallreduce(MPI_IN_PLACE, x + at, (int)k, MPI_FLOAT, MPI_SUM, c->comm, &req), "all-reduce");
        at += k;
    }
    c->bytes_sent += 2 * n * sizeof(float) * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return TIDE_OK;
}

tide_status tide_comm_allreduce_f64(tide_comm *c, tide_ctx *ctx, double *x, int n, const char *what) {
    MPI_Request req;
    CALL(MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, c->comm, &req), "all-reduce");
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

tide_status tide_comm_reduce_scatter_f32(tide_comm *c, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                         uint64_t row_elems, const char *what) {
    if (!fill_counts(c, rows, row_elems))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "reduce-scatter of %s: a rank's part is over 2^31 - 1 elements",
                        what);
    MPI_Request req;
    CALL(MPI_Ireduce_scatter(x, shard, c->counts, MPI_FLOAT, MPI_SUM, c->comm, &req), "reduce-scatter");
    int64_t c_rows = (rows + c->size - 1) / c->size;
    uint64_t have = (uint64_t)c->counts[c->rank], want = (uint64_t)c_rows * row_elems;
    if (have < want) memset(shard + have, 0, (want - have) * sizeof *shard);
    c->bytes_sent += (uint64_t)rows * row_elems * sizeof(float) * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return TIDE_OK;
}

tide_status tide_comm_allgather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                     uint64_t row_bytes, const char *what) {
    if (!fill_counts(c, rows, row_bytes))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "all-gather of %s: a rank's part is over 2^31 - 1 bytes", what);
    MPI_Request req;
    CALL(MPI_Iallgatherv(shard, c->counts[c->rank], MPI_BYTE, x, c->counts, c->displs, MPI_BYTE, c->comm, &req),
         "all-gather");
    c->bytes_sent += (uint64_t)rows * row_bytes * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return TIDE_OK;
}

tide_status tide_comm_gather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                  uint64_t row_bytes, const char *what) {
    if (!fill_counts(c, rows, row_bytes))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "gather of %s: a rank's part is over 2^31 - 1 bytes", what);
    MPI_Request req;
    CALL(MPI_Igatherv(shard, c->counts[c->rank], MPI_BYTE, x, c->counts, c->displs, MPI_BYTE, 0, c->comm, &req),
         "gather");
    return TIDE_OK;
}

tide_status tide_comm_bcast(tide_comm *c, tide_ctx *ctx, void *buf, size_t n, const char *what) {
    if (n > INT_MAX) return tide_err(ctx, TIDE_E_UNSUPPORTED, "broadcast of %s: over 2^31 - 1 bytes", what);
    MPI_Request req;
    CALL(MPI_Ibcast(buf, (int)n, MPI_BYTE, 0, c->comm, &req), "broadcast");
    return TIDE_OK;
}

tide_status tide_comm_same(tide_comm *c, tide_ctx *ctx, uint64_t v, const char *what) {
    uint64_t *all = tide_malloc((size_t)c->size * sizeof *all);
    if (!all) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    MPI_Request req;
    int rc = MPI_Iallgather(&v, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, c->comm, &req);
    tide_status st = rc != MPI_SUCCESS ? mpi_fail(c, ctx, rc, "all-gather", what)
                                       : wait_req(c, ctx, &req, "all-gather", what);
    for (int r = 1; !st && r < c->size; r++)
        if (all[r] != all[0])
            st = tide_err(ctx, TIDE_E_INVALID, "rank %d's %s differs from rank 0's (hash %016llx, not %016llx): every "
                          "rank must be started with the same options, model and data", r, what,
                          (unsigned long long)all[r], (unsigned long long)all[0]);
    tide_free(all);
    return st;
}

#endif
