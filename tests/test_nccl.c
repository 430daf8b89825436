/*
 * test_nccl.c - the ranks' collectives on CUDA device memory (NCCL,
 * src/net/comm_nccl.c) over a communicator of one rank (one GPU, one
 * process: MPI's singleton), called as the executor's net stream calls them:
 * device pointers and an asynchronous queue of the CUDA backend.
 *
 *   - all-reduce out of place and in place: the sum over one rank is the
 *     input, bit for bit, in the output;
 *   - reduce-scatter of 5 rows x 3 into the rank's shard, all-gather of the
 *     shard back into 5 rows: both the input's bits;
 *   - the bytes sent stay 0 (the ring formulas with one rank);
 *   - attaching twice keeps the first communicator.
 *
 * Exit 77 (skipped) without a GPU, in a build without NCCL, or without MPI.
 * The whole training step over NCCL is tests/cli_comm.sh --gpu.
 */
#include "backend/backend.h"
#include "net/comm.h"

#include <stdio.h>
#include <string.h>

static int fails;
#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, "\n");                                                                                \
            fails++;                                                                                              \
        }                                                                                                         \
    } while (0)

int main(void) {
    if (!tide_comm_nccl_available() || !tide_comm_mpi_available()) {
        printf("skipped: this tide has no NCCL (or no MPI)\n");
        return 77;
    }
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = NULL;
    tide_status st = tide_backend_new(ctx, TIDE_BACKEND_CUDA, &be);
    if (st == TIDE_E_NO_DEVICE) {
        printf("skipped: %s\n", tide_ctx_last_error(ctx));
        tide_ctx_free(ctx);
        return 77;
    }
    if (st) {
        fprintf(stderr, "FAIL: the CUDA backend: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    tide_comm *c = NULL;
    if (tide_comm_open(ctx, &c)) {
        fprintf(stderr, "FAIL: tide_comm_open: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    CHECK(tide_comm_size(c) == 1, "one process is one rank (%d)", tide_comm_size(c));
    CHECK(!tide_comm_get_dev(c, NULL), "no device collectives before attaching");
    if (tide_backend_comm_attach(be, c, ctx)) {
        fprintf(stderr, "FAIL: attaching NCCL: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    void *st1 = NULL, *st2 = NULL;
    const tide_comm_dev *dev = tide_comm_get_dev(c, &st1);
    CHECK(dev && !strcmp(dev->name, "nccl"), "NCCL attached");
    CHECK(!tide_backend_comm_attach(be, c, ctx), "attaching again: %s", tide_ctx_last_error(ctx));
    CHECK(tide_comm_get_dev(c, &st2) == dev && st1 == st2, "attaching again keeps the communicator");
    if (!dev) return 1;

    enum { ROWS = 5, COLS = 3, N = ROWS * COLS };
    float h[N], out[N];
    for (int i = 0; i < N; i++) h[i] = 1.0f / (float)(i + 3) - 0.25f * (float)i; /* inexact values */
    void *q = NULL;
    float *a = NULL, *b = NULL, *shard = NULL;
    CHECK(!be->vt->queue_new(be, ctx, true, &q), "queue: %s", tide_ctx_last_error(ctx));
    CHECK(!be->vt->alloc(be, sizeof h, (void **)&a) && !be->vt->alloc(be, sizeof h, (void **)&b) &&
              !be->vt->alloc(be, sizeof h, (void **)&shard),
          "device memory: %s", tide_ctx_last_error(ctx));
    if (fails) return 1;
    CHECK(!be->vt->to_device(be, q, a, h, sizeof h), "to device");
    uint64_t sent0 = tide_comm_bytes_sent(c);

    /* all-reduce, out of place then in place */
    CHECK(!dev->allreduce_f32(st1, ctx, a, b, N, q, "'test' (out of place)"), "all-reduce: %s",
          tide_ctx_last_error(ctx));
    CHECK(!be->vt->to_host(be, q, out, b, sizeof out) && !be->vt->queue_sync(be, q), "to host");
    CHECK(!memcmp(out, h, sizeof h), "all-reduce over one rank, out of place, is the input");
    CHECK(!dev->allreduce_f32(st1, ctx, b, b, N, q, "'test' (in place)"), "all-reduce: %s",
          tide_ctx_last_error(ctx));
    CHECK(!be->vt->to_host(be, q, out, b, sizeof out) && !be->vt->queue_sync(be, q), "to host");
    CHECK(!memcmp(out, h, sizeof h), "all-reduce over one rank, in place, is the input");

    /* reduce-scatter into the shard (all rows: one rank), all-gather back */
    CHECK(!dev->reduce_scatter_f32(st1, ctx, a, shard, ROWS, COLS, q, "'test' (shard)"), "reduce-scatter: %s",
          tide_ctx_last_error(ctx));
    CHECK(!be->vt->to_host(be, q, out, shard, sizeof out) && !be->vt->queue_sync(be, q), "to host");
    CHECK(!memcmp(out, h, sizeof h), "reduce-scatter over one rank is the input");
    float zero[N] = {0};
    CHECK(!be->vt->to_device(be, q, b, zero, sizeof zero), "to device");
    CHECK(!dev->allgather_rows(st1, ctx, shard, b, ROWS, COLS * sizeof(float), q, "'test' (whole)"),
          "all-gather: %s", tide_ctx_last_error(ctx));
    CHECK(!be->vt->to_host(be, q, out, b, sizeof out) && !be->vt->queue_sync(be, q), "to host");
    CHECK(!memcmp(out, h, sizeof h), "all-gather over one rank is the shard");
    CHECK(tide_comm_bytes_sent(c) == sent0, "one rank sends nothing (%llu bytes)",
          (unsigned long long)(tide_comm_bytes_sent(c) - sent0));

    be->vt->dealloc(be, a);
    be->vt->dealloc(be, b);
    be->vt->dealloc(be, shard);
    be->vt->queue_free(be, q);
    tide_backend_free(be);
    tide_comm_close(c);
    tide_ctx_free(ctx);
    if (!fails) printf("test_nccl: every check passed\n");
    return fails ? 1 : 0;
}
