/*
 * comm_nccl.c - the data-parallel ranks' collectives on CUDA device memory:
 * NCCL, attached to the ranks' host communicator (net/comm.h,
 * tide_comm_dev: MPI, or TCP for a torchrun-style launch). Built where CMake
 * found NCCL beside the CUDA backend (TIDE_HAVE_NCCL);
 * src/backend/backend.c's tide_backend_comm_attach is the way in.
 *
 * Bootstrap. Rank 0 makes the ncclUniqueId and broadcasts it over the host
 * communicator (the launch it joined: mpirun -np N, torchrun, or one process
 * alone over MPI); every rank then
 * joins on the CUDA backend's device (the backend chose it: the launch's
 * local rank modulo the device count, src/backend/cuda/cuda_backend.c), and
 * the ranks all-reduce whether each joined, so that one that failed fails
 * them all.
 *
 * Collectives. The communicator is non-blocking (ncclConfig_t.blocking 0):
 * a call returns at once, and each collective is enqueued on the CUDA
 * stream of the executor's net stream (its queue of the backend, q), whose
 * work already waits, on the device, for the computes the plan orders before
 * it (executor.c's event waits). The call then polls ncclCommGetAsyncError
 * and cudaStreamQuery until the collective completes, as comm.c polls MPI:
 * a failure NCCL reports (a peer that died: its proxy connection breaks),
 * the timeout (TIDE_NET_TIMEOUT) or another stream's failure (the cancel
 * flag) aborts the communicator (ncclCommAbort, which ends its kernels), so
 * no rank waits forever on a dead one; later calls fail at once naming the
 * first cause.
 *
 * Uneven shards. ncclReduceScatter and ncclAllGather take one count per
 * rank; when the rows do not divide by the ranks (the last shard short,
 * comm.h), the reduce-scatter is one ncclReduce per rank's rows and the
 * all-gather one ncclBroadcast per rank's rows, in one group, and the rows
 * a short shard lacks are zeroed as comm.c does.
 */
#include "net/comm.h"
#include "backend/cuda/cuda_int.h"
#include "core/core.h"

#include <nccl.h>

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

tide_status tide_nccl_attach(tide_comm *c, tide_backend *be, tide_ctx *ctx);

typedef struct nccl_state {
    tide_comm *c;
    ncclComm_t comm; /* NULL once aborted */
    int device, rank, size;
    char broken[256]; /* why it was aborted ("" while it runs) */
} nccl_state;

static void nccl_abort(nccl_state *s, const char *why) {
    if (!s->broken[0]) snprintf(s->broken, sizeof s->broken, "%s", why);
    if (s->comm) {
        cudaSetDevice(s->device);
        ncclCommAbort(s->comm);
        s->comm = NULL;
    }
}

static tide_status nccl_fail(nccl_state *s, tide_ctx *ctx, ncclResult_t r, const char *call, const char *what) {
    const char *detail = s->comm ? ncclGetLastError(s->comm) : NULL;
    bool more = detail && *detail;
    tide_status st = tide_err(ctx, TIDE_E_IO, "rank %d of %d: NCCL %s of %s failed: %s%s%s%s", s->rank, s->size,
                              call, what, ncclGetErrorString(r), more ? " (" : "", more ? detail : "",
                              more ? ")" : "");
    nccl_abort(s, tide_ctx_last_error(ctx));
    return st;
}

/* Waits for the communicator's pending work (r: what the call returned)
 * and, with stream, for the stream's work, polling as comm.c does. */
static tide_status nccl_wait(nccl_state *s, tide_ctx *ctx, ncclResult_t r, cudaStream_t stream, const char *call,
                             const char *what) {
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(s, ctx, r, call, what);
    double t0 = tide_now(), limit = tide_comm_timeout_s(s->c);
    long ns = 20000;
    for (;;) {
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(s->comm, &a);
        if (q != ncclSuccess) return nccl_fail(s, ctx, q, call, what);
        if (a != ncclSuccess && a != ncclInProgress) return nccl_fail(s, ctx, a, call, what);
        if (a == ncclSuccess) {
            if (!stream) return TIDE_OK;
            cudaError_t e = cudaStreamQuery(stream);
            if (e == cudaSuccess) return TIDE_OK;
            if (e != cudaErrorNotReady) {
                (void)cudaGetLastError();
                tide_status st = tide_err(ctx, TIDE_E_BACKEND, "rank %d of %d: NCCL %s of %s: the stream failed: "
                                          "%s (error %d)", s->rank, s->size, call, what, cudaGetErrorString(e),
                                          (int)e);
                nccl_abort(s, tide_ctx_last_error(ctx));
                return st;
            }
        }
        if (tide_comm_cancelled(s->c)) {
            tide_status st = tide_err(ctx, TIDE_E_IO, "rank %d of %d: NCCL %s of %s abandoned: another stream of "
                                      "this rank failed", s->rank, s->size, call, what);
            nccl_abort(s, tide_ctx_last_error(ctx));
            return st;
        }
        double el = tide_now() - t0;
        if (el > limit) {
            tide_status st = tide_err(ctx, TIDE_E_IO, "rank %d of %d: NCCL %s of %s timed out after %.0f s: another "
                                      "rank stopped answering (died, or is stuck; TIDE_NET_TIMEOUT sets the limit)",
                                      s->rank, s->size, call, what, el);
            nccl_abort(s, tide_ctx_last_error(ctx));
            return st;
        }
        if (el < 1e-3) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 200000) ns += ns / 4;
    }
}

/* The stream of the net stream's queue, the device set on this thread;
 * NULL (the error set) when the communicator was aborted. */
static cudaStream_t begin(nccl_state *s, tide_ctx *ctx, void *q, const char *call, const char *what) {
    if (!s->comm) {
        tide_err(ctx, TIDE_E_IO, "rank %d of %d: NCCL %s of %s: the communicator was aborted after an earlier "
                 "failure (%s)", s->rank, s->size, call, what, s->broken);
        return NULL;
    }
    if (!q) {
        tide_err(ctx, TIDE_E_INVALID, "NCCL %s of %s: no queue (the executor's net stream issues it)", call, what);
        return NULL;
    }
    cudaError_t e = cudaSetDevice(s->device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        tide_err(ctx, TIDE_E_BACKEND, "NCCL %s of %s: cudaSetDevice(%d): %s", call, what, s->device,
                 cudaGetErrorString(e));
        return NULL;
    }
    return ((cu_queue *)q)->stream;
}

static tide_status n_allreduce(void *vs, tide_ctx *ctx, const float *src, float *dst, uint64_t n, void *q,
                               const char *what) {
    nccl_state *s = vs;
    cudaStream_t st = begin(s, ctx, q, "all-reduce", what);
    if (!st) return tide_ctx_last_status(ctx);
    ncclResult_t r = ncclAllReduce(src, dst, (size_t)n, ncclFloat32, ncclSum, s->comm, st);
    tide_status rc = nccl_wait(s, ctx, r, st, "all-reduce", what);
    if (!rc) tide_comm_count_sent(s->c, 2 * n * sizeof(float) * (uint64_t)(s->size - 1) / (uint64_t)s->size);
    return rc;
}

static tide_status n_reduce_scatter(void *vs, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                    uint64_t row_elems, void *q, const char *what) {
    nccl_state *s = vs;
    cudaStream_t st = begin(s, ctx, q, "reduce-scatter", what);
    if (!st) return tide_ctx_last_status(ctx);
    int64_t c_rows = (rows + s->size - 1) / s->size, r0, n;
    tide_comm_shard_rows(rows, s->size, s->rank, &r0, &n);
    ncclResult_t r;
    if (c_rows * s->size == rows) {
        r = ncclReduceScatter(x, shard, (size_t)((uint64_t)c_rows * row_elems), ncclFloat32, ncclSum, s->comm, st);
    } else {
        r = ncclGroupStart();
        for (int k = 0; k < s->size && r == ncclSuccess; k++) {
            int64_t k0, kn;
            tide_comm_shard_rows(rows, s->size, k, &k0, &kn);
            if (kn > 0)
                r = ncclReduce(x + (uint64_t)k0 * row_elems, shard, (size_t)((uint64_t)kn * row_elems), ncclFloat32,
                               ncclSum, k, s->comm, st);
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
        uint64_t have = (uint64_t)n * row_elems, want = (uint64_t)c_rows * row_elems;
        if ((r == ncclSuccess || r == ncclInProgress) && have < want) {
            cudaError_t ce = cudaMemsetAsync(shard + have, 0, (want - have) * sizeof *shard, st);
            if (ce != cudaSuccess) {
                (void)cudaGetLastError();
                tide_status rc = tide_err(ctx, TIDE_E_BACKEND, "reduce-scatter of %s: zeroing the short shard: %s",
                                          what, cudaGetErrorString(ce));
                nccl_abort(s, tide_ctx_last_error(ctx));
                return rc;
            }
        }
    }
    tide_status rc = nccl_wait(s, ctx, r, st, "reduce-scatter", what);
    if (!rc)
        tide_comm_count_sent(s->c, (uint64_t)rows * row_elems * sizeof(float) * (uint64_t)(s->size - 1) /
                                       (uint64_t)s->size);
    return rc;
}

static tide_status n_allgather(void *vs, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                               uint64_t row_bytes, void *q, const char *what) {
    nccl_state *s = vs;
    cudaStream_t st = begin(s, ctx, q, "all-gather", what);
    if (!st) return tide_ctx_last_status(ctx);
    int64_t c_rows = (rows + s->size - 1) / s->size;
    ncclResult_t r;
    if (c_rows * s->size == rows) {
        r = ncclAllGather(shard, x, (size_t)((uint64_t)c_rows * row_bytes), ncclUint8, s->comm, st);
    } else {
        r = ncclGroupStart();
        for (int k = 0; k < s->size && r == ncclSuccess; k++) {
            int64_t k0, kn;
            tide_comm_shard_rows(rows, s->size, k, &k0, &kn);
            if (kn > 0)
                r = ncclBroadcast(shard, (char *)x + (uint64_t)k0 * row_bytes, (size_t)((uint64_t)kn * row_bytes),
                                  ncclUint8, k, s->comm, st);
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
    }
    tide_status rc = nccl_wait(s, ctx, r, st, "all-gather", what);
    if (!rc) tide_comm_count_sent(s->c, (uint64_t)rows * row_bytes * (uint64_t)(s->size - 1) / (uint64_t)s->size);
    return rc;
}

static void n_close(void *vs) {
    nccl_state *s = vs;
    if (!s) return;
    if (s->comm) {
        cudaSetDevice(s->device);
        /* the runs are over: nothing is pending, so finalize and destroy;
         * a communicator that cannot finalize is aborted */
        ncclResult_t r = ncclCommFinalize(s->comm);
        if (r == ncclSuccess || r == ncclInProgress) {
            ncclResult_t a = ncclInProgress;
            double t0 = tide_now();
            while (a == ncclInProgress && tide_now() - t0 < tide_comm_timeout_s(s->c))
                if (ncclCommGetAsyncError(s->comm, &a) != ncclSuccess) break;
            if (a == ncclSuccess) ncclCommDestroy(s->comm);
            else ncclCommAbort(s->comm);
        } else {
            ncclCommAbort(s->comm);
        }
        s->comm = NULL;
    }
    tide_free(s);
}

static const tide_comm_dev nccl_dev = {
    .name = "nccl",
    .allreduce_f32 = n_allreduce,
    .reduce_scatter_f32 = n_reduce_scatter,
    .allgather_rows = n_allgather,
    .close = n_close,
};

tide_status tide_nccl_attach(tide_comm *c, tide_backend *be, tide_ctx *ctx) {
    if (tide_comm_get_dev(c, NULL)) return TIDE_OK;
    nccl_state *s = tide_calloc(1, sizeof *s);
    if (!s) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    s->c = c;
    s->device = impl_of(be)->device;
    s->rank = tide_comm_rank(c);
    s->size = tide_comm_size(c);
    /* rank 0's id, with whether it could make one */
    struct {
        int32_t ok;
        ncclUniqueId id;
    } boot;
    memset(&boot, 0, sizeof boot);
    char why[TIDE_ERRMSG_MAX] = "";
    if (s->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&boot.id);
        boot.ok = r == ncclSuccess;
        if (!boot.ok) snprintf(why, sizeof why, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    }
    tide_status st = tide_comm_bcast(c, ctx, &boot, sizeof boot, "NCCL's unique id");
    if (st) {
        tide_free(s);
        return st;
    }
    bool joined = false;
    if (!boot.ok) {
        if (!why[0]) snprintf(why, sizeof why, "rank 0 could not make NCCL's unique id");
    } else if (cudaSetDevice(s->device) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, sizeof why, "cudaSetDevice(%d) failed", s->device);
    } else {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t r = ncclCommInitRankConfig(&s->comm, s->size, boot.id, s->rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            snprintf(why, sizeof why, "ncclCommInitRankConfig: %s", ncclGetErrorString(r));
            if (s->comm) ncclCommAbort(s->comm);
            s->comm = NULL;
        } else if (nccl_wait(s, ctx, r, NULL, "initialisation", "the communicator")) {
            snprintf(why, sizeof why, "%s", tide_ctx_last_error(ctx));
        } else {
            joined = true;
        }
    }
    /* every rank learns whether all joined */
    double bad = joined ? 0 : 1;
    if ((st = tide_comm_allreduce_f64(c, ctx, &bad, 1, "NCCL's initialisation"))) {
        if (s->comm) ncclCommAbort(s->comm);
        tide_free(s);
        return st;
    }
    if (bad > 0) {
        if (s->comm) ncclCommAbort(s->comm);
        tide_free(s);
        if (joined)
            return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %.0f other rank(s) could not join NCCL",
                            tide_comm_rank(c), tide_comm_size(c), bad);
        return tide_err(ctx, TIDE_E_IO, "rank %d of %d: joining NCCL on device %d: %s", tide_comm_rank(c),
                        tide_comm_size(c), impl_of(be)->device, why);
    }
    tide_comm_set_dev(c, &nccl_dev, s);
    return TIDE_OK;
}
