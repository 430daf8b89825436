/*
 * comm_tcp.h - the ranks' collectives over TCP sockets, for a torchrun-style
 * launch (TIDE_WORLD_SIZE / TIDE_RANK, or WORLD_SIZE / RANK, with
 * MASTER_ADDR and MASTER_PORT): net/comm.c opens it in place of MPI. Needs
 * no MPI. The ranks meet at rank 0's rendezvous port, then form a ring (each
 * rank connected to the next); rank 0 also keeps each rank's rendezvous
 * connection (broadcast and gather go over those).
 *
 * Results are the same bits on every rank, and the same for the same inputs
 * run after run: a ring reduce-scatter sums each part in ring order (the
 * part of rank j: rank j+1's, plus j+2's, ..., plus j's own), and the
 * all-gather copies. With 2 ranks that is a + b, the bits MPI's sum gives.
 *
 * Every transfer waits at most the timeout for progress: a rank that stops
 * answering, or closes its connections (it died or failed), fails the call
 * with a message naming it.
 */
#ifndef TIDE_NET_COMM_TCP_H
#define TIDE_NET_COMM_TCP_H

#include "tide.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tide_tcp tide_tcp;

/* Joins rank `rank` of `size` (size 1: no connection), meeting at
 * MASTER_ADDR and the port (TIDE_MASTER_PORT, else MASTER_PORT, plus one
 * under torchrun, whose agent holds MASTER_PORT with its own store:
 * TORCHELASTIC_USE_AGENT_STORE). cancel, when not
 * NULL, is polled during transfers (*cancel set: give up). */
tide_status tide_tcp_open(tide_ctx *ctx, int rank, int size, double timeout_s, const atomic_bool *_Atomic *cancel,
                          tide_tcp **out);
/* Closes every connection (a failed rank: the others' transfers fail at
 * once, naming it). */
void tide_tcp_shutdown(tide_tcp *t);
void tide_tcp_close(tide_tcp *t);

/* The collectives of comm.h on host memory; elem is 4 (f32) or 8 (f64). */
tide_status tide_tcp_allreduce(tide_tcp *t, tide_ctx *ctx, void *x, uint64_t n, int elem, const char *what);
tide_status tide_tcp_reduce_scatter_f32(tide_tcp *t, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                        uint64_t row_elems, const char *what);
tide_status tide_tcp_allgather_rows(tide_tcp *t, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                    uint64_t row_bytes, const char *what);
tide_status tide_tcp_gather_rows(tide_tcp *t, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                 uint64_t row_bytes, const char *what);
tide_status tide_tcp_bcast(tide_tcp *t, tide_ctx *ctx, void *buf, size_t n, const char *what);

#endif
