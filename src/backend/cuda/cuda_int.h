/*
 * cuda_int.h - the CUDA backend's internals, shared by cuda_backend.c (the
 * instance: queues, memory, events, synchronization), cuda_ops.c and
 * cuda_ops_train.c (the op kernels of compute). See cuda_backend.c's note for
 * how they work.
 */
#ifndef TIDE_CUDA_INT_H
#define TIDE_CUDA_INT_H

#include "backend/backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

/* A queue (backend.h): a CUDA stream of the instance and what goes with it. */
typedef struct cu_queue {
    /* first, as backend.h asks; set by queue_new (under the instance's mutex) */
    tide_ctx *ctx;       /* where errors of calls on it go (the default queue: be->ctx) */
    cudaStream_t stream;
    cublasHandle_t blas; /* NULL until the queue's first MATMUL (default queue: from the start) */
    void *blas_ws;       /* the handle's workspace (ws_bytes of device memory) */
    int32_t *flag;       /* device (2): range-check result */
    int32_t *rec;        /* device (4): deferred range-check record (asynchronous queues) */
    bool rec_armed;      /* a deferred check was queued since the record was last read */
    int32_t *hbuf;       /* pinned host (4): their read-back */
    pthread_mutex_t mu;  /* held by every call on the queue */
    bool mu_ready;
    bool async;          /* set by queue_new (under the instance's mutex) too */
    bool in_use;         /* handed out (false: kept by queue_free for reuse) */
    int id;              /* 0 the default queue, then 1, 2, ... in order of creation */
    struct cu_queue *next;
} cu_queue;

typedef struct cu_impl {
    int device;
    int cc_major, cc_minor;
    size_t ws_bytes;
    size_t mem_pitch; /* the largest pitch cudaMemcpy2DAsync takes (cudaDeviceProp.memPitch) */
    bool attn_rows;   /* TIDE_CUDA_ATTENTION=rows when the instance was made */
    pthread_mutex_t mu; /* guards the list below and the queues' in_use */
    cu_queue *queues;   /* every queue, newest first; the default one is `def` */
    cu_queue *def;
    int n_queues, next_id;
} cu_impl;

static inline cu_impl *impl_of(tide_backend *be) { return be->impl; }

/* The queue of a call: q, or the default queue for NULL. */
static inline cu_queue *queue_of(tide_backend *be, void *q) { return q ? (cu_queue *)q : impl_of(be)->def; }

/* What a deferred range record (cu_queue.rec) found: rec[0]. */
enum {
    REC_EMBED = 1,     /* a token id outside the vocabulary */
    REC_ATTENTION = 2, /* a position outside the cache */
    REC_EMBED_BWD = 3, /* a token id outside the gradient's rows */
    REC_TARGET = 4,    /* a target at or past the vocabulary */
    REC_POSITIONS = 5, /* a position other than its index (fresh sequences) */
    REC_CE_STATS = 6,  /* a CE_STATS target at or past the vocabulary */
    REC_CE_BLOCK = 7,  /* a CE_BLOCK target at or past the vocabulary */
};

/* Records a CUDA failure on ctx: "cuda: <what>: <error string> (<name>,
 * error N)", and clears the (non-sticky) error state so that later calls
 * start clean. Returns st. */
tide_status tide_cuda_fail(tide_ctx *ctx, tide_status st, cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Records a cuBLAS failure on ctx; returns TIDE_E_BACKEND. */
tide_status tide_cuda_blas_fail(tide_ctx *ctx, cublasStatus_t s, const char *what);

/* Evaluates a CUDA call; on failure returns TIDE_E_BACKEND naming it. */
#define CU_TRY(ctx, call, ...)                                                               \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) return tide_cuda_fail((ctx), TIDE_E_BACKEND, e_, __VA_ARGS__); \
    } while (0)

/* Makes q's cuBLAS handle unless it has one: q's stream, a fixed workspace,
 * FP32 math without TF32, no atomics. Called with q's mutex held (or before q
 * is handed out). Returns TIDE_OK, or TIDE_E_NOMEM / TIDE_E_BACKEND on ctx. */
tide_status tide_cuda_queue_blas(tide_backend *be, cu_queue *q, tide_ctx *ctx);

/* An op kind's kernels: enqueued on q (q's mutex held); the caller
 * synchronizes. cuda_ops.c holds the table; the training ops' entries and
 * ATTENTION without a cache are in cuda_ops_train.c. */
typedef tide_status (*tide_cuda_op)(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                    void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_attention_nocache(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                        void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_embed_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_rmsnorm_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                  void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_matmul_gradw(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                   void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_rope_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_attention_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                    void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_silu_mul_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                   void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_cross_entropy(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                    void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_ce_stats(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_ce_block(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_sumsq(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                            void *const *in, void *const *out, void *scratch);
tide_status tide_cuda_adamw(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                            void *const *in, void *const *out, void *scratch);

/* The compute slot (backend.h), in cuda_ops.c. */
tide_status tide_cuda_compute(tide_backend *be, void *q, const tide_graph *g, const tide_op *op, void *const *in,
                              void *const *out, void *scratch);

#endif
