/*
 * comm.h - the data-parallel ranks' communicator inside the library (the
 * public half is tide.h, "data-parallel ranks": tide_comm_open and its
 * accessors). Built on MPI where CMake found it (TIDE_HAVE_MPI); without it
 * tide_comm_open says so and nothing here is reached. Collectives on a GPU's
 * memory are device collectives attached to it (tide_comm_dev below: NCCL,
 * net/comm_nccl.c).
 *
 * Every collective is the same call on every rank in the same order: the
 * executor's net stream issues a plan's collectives in list order, and every
 * rank runs the same plan (the trainer proves it by comparing hashes,
 * tide_comm_same). Each waits at most the communicator's timeout
 * (TIDE_NET_TIMEOUT seconds, default 300) for the other ranks, polling a
 * non-blocking MPI call, so a rank that stopped answering fails the call with
 * a message instead of hanging it. Errors go on the context passed in (the
 * executor's net worker has its own, docs/design.md E4).
 *
 * Calls from several threads are serialised by the caller: during a run only
 * the net stream's worker calls, between runs only the trainer.
 */
#ifndef TIDE_NET_COMM_H
#define TIDE_NET_COMM_H

#include "tide.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* x (n f32) in place: the sum over the ranks. */
tide_status tide_comm_allreduce_f32(tide_comm *c, tide_ctx *ctx, float *x, uint64_t n, const char *what);
/* x (n doubles) in place: the sum over the ranks (host values: a step's
 * loss, its counted targets). */
tide_status tide_comm_allreduce_f64(tide_comm *c, tide_ctx *ctx, double *x, int n, const char *what);
/* The rows of this rank of the sum of every rank's x (rows x row_elems f32):
 * rows [r c, min(rows, (r + 1) c)) with c = ceil(rows / size), into shard
 * (c x row_elems); the rows a short last shard lacks are zeroed. */
tide_status tide_comm_reduce_scatter_f32(tide_comm *c, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                         uint64_t row_elems, const char *what);
/* Every rank's shard (c x row_bytes, its valid rows as above) into x
 * (rows x row_bytes). */
tide_status tide_comm_allgather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                     uint64_t row_bytes, const char *what);
/* Every rank's shard as above into x on rank 0 (x unused elsewhere). */
tide_status tide_comm_gather_rows(tide_comm *c, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                  uint64_t row_bytes, const char *what);
/* buf (n bytes) from rank 0 to every rank. */
tide_status tide_comm_bcast(tide_comm *c, tide_ctx *ctx, void *buf, size_t n, const char *what);
/* Whether every rank holds the same 64-bit value (a hash of what each
 * decided): TIDE_OK, or TIDE_E_INVALID naming the first rank that differs
 * from rank 0. */
tide_status tide_comm_same(tide_comm *c, tide_ctx *ctx, uint64_t v, const char *what);
/* While *flag is set, a collective in progress gives up (another stream of
 * this rank failed: its message is the run's); clear: only while it is flag. */
void tide_comm_set_cancel(tide_comm *c, const atomic_bool *flag);
void tide_comm_clear_cancel(tide_comm *c, const atomic_bool *flag);
/* Rows [*r0, *r0 + *n) of a tensor of `rows` rows that rank r's shard
 * holds (n may be 0). */
void tide_comm_shard_rows(int64_t rows, int size, int r, int64_t *r0, int64_t *n);

/* Collectives on a backend's device memory (NCCL on CUDA: net/comm_nccl.c,
 * attached by tide_backend_comm_attach). The executor's net stream calls
 * them with device pointers and its queue of the backend (q): each is
 * enqueued on that queue's stream and waited for as the host collectives
 * are (the timeout, the cancel flag, a peer's failure), and returns only
 * once complete or failed. The host values (the loss, the plans' hashes,
 * the checkpoint's gather) stay on the collectives above. */
typedef struct tide_comm_dev {
    const char *name; /* "nccl" */
    tide_status (*allreduce_f32)(void *st, tide_ctx *ctx, const float *src, float *dst, uint64_t n, void *q,
                                 const char *what);
    tide_status (*reduce_scatter_f32)(void *st, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                      uint64_t row_elems, void *q, const char *what);
    tide_status (*allgather_rows)(void *st, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                  uint64_t row_bytes, void *q, const char *what);
    void (*close)(void *st); /* before the host communicator closes */
} tide_comm_dev;
/* Attaches dev (state st, closed with c) to c; NULL detaches. */
void tide_comm_set_dev(tide_comm *c, const tide_comm_dev *dev, void *st);
/* c's device collectives (NULL: none), their state in *st. */
const tide_comm_dev *tide_comm_get_dev(const tide_comm *c, void **st);
/* For the device collectives: c's timeout, whether the running executor
 * failed (the cancel flag set), and the ring bytes a collective sent. */
double tide_comm_timeout_s(const tide_comm *c);
bool tide_comm_cancelled(const tide_comm *c);
void tide_comm_count_sent(tide_comm *c, uint64_t bytes);

#endif
