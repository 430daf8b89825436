/*
 * cuda_backend.c - the CUDA backend: device memory is cudaMalloc'ed memory of
 * GPU 0, transfers are cudaMemcpyAsync, compute launches the kernels of
 * cuda_kernels.cu and, for the training ops, cuda_train.cu (the products
 * through cuBLAS; the per-op code is cuda_ops.c and cuda_ops_train.c);
 * events are CUDA events. This file holds the instance: its queues, memory,
 * events and synchronization.
 *
 * Queues. Each queue (backend.h) is a CUDA stream of this instance with its
 * own cuBLAS handle (made on the queue's first MATMUL; the default queue's at
 * creation), its own range-check flag and record, its own mutex, and the
 * context its errors go to. The instance owns them all: the default queue
 * (q == NULL: synchronous, errors on be->ctx) made with it, and those made by
 * queue_new, at most CU_MAX_QUEUES in all. queue_free keeps a queue (idle,
 * its record cleared) for the next queue_new to reuse, so a caller that makes
 * a queue per run (the resident runner) pays for a stream and a cuBLAS
 * handle once; all are released with the instance. The executor makes one
 * queue per plan stream it uses (0 compute, 1 h2d, 2 d2h, 3 io, 4 host; the
 * io and host streams' are synchronous, and the host stream's only records
 * the events others wait on: its computes run on a CPU backend of the
 * executor's own), so two executors on one instance never share a stream. A call enqueues its work on its queue;
 * on a synchronous queue it then synchronizes that stream only, on an
 * asynchronous one (used by the executor's compute, h2d and d2h workers and
 * by the resident runner) it returns at once, and the ordering between
 * queues is the caller's: CUDA events recorded after a producer and waited
 * on by the consumer's stream (cudaStreamWaitEvent), so the host waits on
 * nothing while a plan runs. Either way a copy on one queue overlaps a kernel
 * on another (the copy engines and the SMs run side by side). The queue's
 * mutex serializes two threads that share a queue (the default queue; the
 * executor's are uncontended). Nothing calls cudaDeviceSynchronize:
 * `synchronize` waits for every queue's stream and returns the first error
 * found there, queue_sync for one queue's. Streams are non-blocking: no
 * implicit ordering with the legacy default stream, which nothing here uses.
 * The instance uses GPU 0 (a rank of a launch: its local rank modulo the
 * device count, tide_cuda_backend_new), and every call that needs it sets it
 * on the calling thread; queue_new sets it on the creating thread.
 *
 * MATMUL. out (R, N) = x (R, K) . w (N, K)^T. Row-major out is column-major
 * out^T (N, R) = w (N, K) . x^T (K, R); in column-major terms w is a (K, N)
 * matrix with leading dimension K used transposed and x a (K, R) matrix used
 * as is: cublasSgemm(T, N, m=N, n=R, k=K, w, lda=K, x, ldb=K, out, ldc=N).
 *   - f32 weights: that call directly.
 *   - f16/bf16 weights in the f32 mode (TIDE_MATMUL_F32): converted exactly
 *     to f32 in the op's scratch (as many
 *     rows of w as fit, equal blocks, as the CPU does) and multiplied block by
 *     block: cublasSgemm(T, N, cnt, R, K, scratch, K, x, K, out + n0, N).
 *     The activations are never rounded to 16 bits, so results match the CPU
 *     within f32 summation error.
 *   - f16/bf16 in the fast mode (TIDE_MATMUL_FAST, the default here): x
 *     rounded to the weight's dtype in the scratch, chunk of rows by chunk,
 *     then cublasGemmEx on tensor cores with f32 accumulation and f32
 *     output (see gemm_fast).
 *   - f16/bf16 with R < TCU_MATMUL_FUSED_R (decoding) or a scratch too small
 *     for one row: tcu_matmul_fused, which reads each weight once (in either
 *     mode: decoding is bound by reading the weights, not by arithmetic).
 * cuBLAS runs in CUBLAS_DEFAULT_MATH (no TF32 for f32 operands; tensor cores
 * for 16-bit ones) with atomics off and no workspace (so no split-K), each
 * handle on a fixed stream, so results are bit-reproducible run to run on
 * one GPU model and toolkit, and tiles repeat the untiled product's bits.
 *
 * Range errors (EMBED and EMBED_BWD token ids, ATTENTION positions,
 * CROSS_ENTROPY, CE_STATS and CE_BLOCK targets, the positions of fresh
 * sequences that ATTENTION without a cache and ATTENTION_BWD need) are
 * found on the GPU.
 * Synchronous queue: a check kernel leaves the smallest bad index in the
 * queue's flag, which is read back before anything is written, so an
 * out-of-range op writes nothing and fails, as on the CPU. Asynchronous
 * queue (nothing may wait): the check claims the queue's record instead, the
 * op's kernels, which stay inside their buffers whatever the ids, run anyway,
 * and queue_sync (or `synchronize`) reads the record and fails with the first
 * one's message; what ran after the bad op is wrong but wrote only its own
 * outputs.
 *
 * Environment: TIDE_CUDA_ATTENTION=rows is read once, when the instance is
 * made, and handed to the attention launcher.
 *
 * Errors: every CUDA or cuBLAS failure becomes TIDE_E_BACKEND (TIDE_E_NOMEM
 * for an allocation) with a message naming the call and the error, on the
 * context of the queue the call was made on; nothing aborts.
 */
#include "backend/cuda/cuda_file.h"
#include "backend/cuda/cuda_int.h"
#include "backend/cuda/cuda_kernels.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Queues of one instance, the default one included: 4 per executor, so room
 * for a dozen models' executors and their resident runs. */
#define CU_MAX_QUEUES 64

tide_status tide_cuda_fail(tide_ctx *ctx, tide_status st, cudaError_t e, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    (void)cudaGetLastError();
    return tide_err(ctx, st, "cuda: %s: %s (%s, error %d)", what, cudaGetErrorString(e), cudaGetErrorName(e),
                    (int)e);
}

tide_status tide_cuda_blas_fail(tide_ctx *ctx, cublasStatus_t s, const char *what) {
    return tide_err(ctx, TIDE_E_BACKEND, "cuda: %s: %s (%s, status %d)", what, cublasGetStatusString(s),
                    cublasGetStatusName(s), (int)s);
}

/* ---------------------------------------------------------------- queues */

tide_status tide_cuda_queue_blas(tide_backend *be, cu_queue *q, tide_ctx *ctx) {
    if (q->blas) return TIDE_OK;
    cu_impl *im = impl_of(be);
    cublasHandle_t h = NULL;
    cublasStatus_t bs = cublasCreate(&h);
    if (bs != CUBLAS_STATUS_SUCCESS) return tide_cuda_blas_fail(ctx, bs, "cublasCreate");
    cudaError_t e = im->ws_bytes ? cudaMalloc(&q->blas_ws, im->ws_bytes) : cudaSuccess;
    if (e != cudaSuccess) {
        q->blas_ws = NULL;
        cublasDestroy(h);
        return tide_cuda_fail(ctx, e == cudaErrorMemoryAllocation ? TIDE_E_NOMEM : TIDE_E_BACKEND, e,
                              "cudaMalloc of the %zu-byte cuBLAS workspace", im->ws_bytes);
    }
    const char *what = "cublasSetStream";
    bs = cublasSetStream(h, q->stream);
    if (bs == CUBLAS_STATUS_SUCCESS) what = "cublasSetWorkspace", bs = cublasSetWorkspace(h, q->blas_ws, im->ws_bytes);
    if (bs == CUBLAS_STATUS_SUCCESS) what = "cublasSetMathMode", bs = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    if (bs == CUBLAS_STATUS_SUCCESS)
        what = "cublasSetAtomicsMode", bs = cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        cudaFree(q->blas_ws);
        q->blas_ws = NULL;
        return tide_cuda_blas_fail(ctx, bs, what);
    }
    q->blas = h;
    return TIDE_OK;
}

static void queue_release(cu_queue *q) {
    if (q->stream) cudaStreamSynchronize(q->stream);
    if (q->blas) cublasDestroy(q->blas);
    if (q->blas_ws) cudaFree(q->blas_ws);
    if (q->flag) cudaFree(q->flag);
    if (q->rec) cudaFree(q->rec);
    if (q->hbuf) cudaFreeHost(q->hbuf);
    if (q->stream) cudaStreamDestroy(q->stream);
    if (q->mu_ready) pthread_mutex_destroy(&q->mu);
    tide_free(q);
}

/* ---------------------------------------------------------------- memory */

static void cu_destroy(tide_backend *be) {
    cu_impl *im = impl_of(be);
    if (im) {
        cudaSetDevice(im->device);
        for (cu_queue *q = im->queues, *nx; q; q = nx) {
            nx = q->next;
            queue_release(q);
        }
        pthread_mutex_destroy(&im->mu);
        tide_free(im);
    }
    tide_free(be);
}

static tide_status cu_alloc(tide_backend *be, size_t n, void **ptr) {
    *ptr = NULL;
    cudaError_t e = cudaMalloc(ptr, n ? n : 1);
    if (e == cudaSuccess) return TIDE_OK;
    *ptr = NULL;
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return tide_err(be->ctx, TIDE_E_NOMEM,
                        "cuda: out of device memory allocating %zu bytes (%zu of %zu bytes free)", n, fr, tot);
    }
    return tide_cuda_fail(be->ctx, TIDE_E_BACKEND, e, "cudaMalloc of %zu bytes", n);
}

static void cu_dealloc(tide_backend *be, void *ptr) {
    if (ptr) cudaFree(ptr);
}

/* Whether host memory p is page-locked (cudaHostAlloc'ed or registered):
 * copies from it read it when they run. Unknown counts as pageable. */
static bool host_pinned(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

/* A copy from pageable host memory may be staged by the driver when it is
 * issued ("the driver may synchronize with the stream and stage the copy":
 * it may not), before the work queued ahead of it has run: an event wait
 * for the copy into that memory from another queue (an executor's STORE to
 * a home, then its LOAD back). The queue's contract (backend.h) is that a
 * call runs after everything queued on it before, so such a copy first
 * waits for the queue's stream (nothing when the queue is idle); copies from
 * pinned memory (the executor's host pool) are read when they run, without
 * a wait. */
/* Makes the instance's device current on the calling thread (a thread
 * starts on GPU 0; the instance may be on another, tide_cuda_backend_new):
 * the calls that launch or enqueue work on its streams, remembered per
 * thread. */
static _Thread_local int bound_device = -1;
static void bind_device(tide_backend *be) {
    int d = impl_of(be)->device;
    if (bound_device != d && cudaSetDevice(d) == cudaSuccess) bound_device = d;
}

static tide_status cu_compute(tide_backend *be, void *q, const tide_graph *g, const tide_op *op, void *const *in,
                              void *const *out, void *scratch) {
    bind_device(be);
    return tide_cuda_compute(be, q, g, op, in, out, scratch);
}

static tide_status cu_copy(tide_backend *be, void *vq, void *dst, const void *src, size_t n,
                           enum cudaMemcpyKind kind) {
    if (!n) return TIDE_OK;
    bind_device(be);
    cu_queue *q = queue_of(be, vq);
    const char *what = kind == cudaMemcpyHostToDevice ? "host to device" : "device to host";
    pthread_mutex_lock(&q->mu);
    cudaError_t e = cudaSuccess;
    if (kind == cudaMemcpyHostToDevice && !host_pinned(src)) e = cudaStreamSynchronize(q->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, n, kind, q->stream);
    tide_status st = TIDE_OK;
    if (e != cudaSuccess)
        st = tide_cuda_fail(q->ctx, TIDE_E_BACKEND, e, "cudaMemcpyAsync %s of %zu bytes (queue %d)", what, n, q->id);
    else if (!q->async && (e = cudaStreamSynchronize(q->stream)) != cudaSuccess)
        st = tide_cuda_fail(q->ctx, TIDE_E_BACKEND, e,
                            "cudaStreamSynchronize after a %s copy of %zu bytes (queue %d)", what, n, q->id);
    pthread_mutex_unlock(&q->mu);
    return st;
}

static tide_status cu_to_device(tide_backend *be, void *q, void *dst, const void *src, size_t n) {
    return cu_copy(be, q, dst, src, n, cudaMemcpyHostToDevice);
}

static tide_status cu_to_host(tide_backend *be, void *q, void *dst, const void *src, size_t n) {
    return cu_copy(be, q, dst, src, n, cudaMemcpyDeviceToHost);
}
/* Pinned host memory: anonymous pages from mmap, registered with
 * cudaHostRegister, rather than cudaHostAlloc. Both are page-locked and
 * mapped for the GPU's copy engines, but memory a driver allocates and maps
 * itself may be refused by the kernel's pinning for I/O (O_DIRECT reads into
 * such mappings can fail with EFAULT), while registered pages are ordinary
 * anonymous pages: the SSD store reads straight into the same buffers the
 * copy engines read from. The region's first page holds its length. */
#define CU_HOST_HDR ((size_t)4096)

static tide_status cu_host_alloc(tide_backend *be, size_t n, void **ptr) {
    *ptr = NULL;
    if (!n) n = 1;
    size_t total = (n + CU_HOST_HDR + CU_HOST_HDR - 1) & ~(CU_HOST_HDR - 1);
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return tide_err(be->ctx, TIDE_E_NOMEM, "cuda: cannot map %zu bytes of host memory to pin: %s", n,
                        strerror(errno));
    *(size_t *)base = total;
    cudaError_t e = cudaHostRegister(base, total, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        munmap(base, total);
        return tide_cuda_fail(be->ctx, TIDE_E_NOMEM, e, "cudaHostRegister of %zu bytes of host memory", n);
    }
    *ptr = (char *)base + CU_HOST_HDR;
    return TIDE_OK;
}

static void cu_host_free(tide_backend *be, void *ptr) {
    (void)be;
    if (!ptr) return;
    char *base = (char *)ptr - CU_HOST_HDR;
    size_t total = *(size_t *)base;
    cudaHostUnregister(base);
    (void)cudaGetLastError();
    munmap(base, total);
}

static tide_status cu_mem_info(tide_backend *be, uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t fr = 0, tot = 0;
    CU_TRY(be->ctx, cudaSetDevice(impl_of(be)->device), "cudaSetDevice(%d)", impl_of(be)->device);
    CU_TRY(be->ctx, cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
    *free_bytes = fr;
    *total_bytes = tot;
    return TIDE_OK;
}

static tide_status cu_file_read(tide_backend *be, void *vq, int fd, uint64_t off, void *dst, size_t n) {
    tide_ctx *ctx = queue_of(be, vq)->ctx;
    CU_TRY(ctx, cudaSetDevice(impl_of(be)->device), "cudaSetDevice(%d)", impl_of(be)->device);
    return tide_cuda_file_read(be, ctx, fd, off, dst, n);
}

/* Reads and clears q's deferred range-check record (q's mutex held, its
 * stream idle); TIDE_E_RANGE naming the first bad id when one was found.
 * Errors on ctx. */
static tide_status read_record(tide_ctx *ctx, cu_queue *q) {
    if (!q->rec_armed) return TIDE_OK;
    q->rec_armed = false;
    cudaError_t e = cudaMemcpyAsync(q->hbuf, q->rec, 4 * sizeof(int32_t), cudaMemcpyDeviceToHost, q->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(q->stream);
    if (e != cudaSuccess) {
        tide_status st = tide_cuda_fail(ctx, TIDE_E_BACKEND, e, "reading queue %d's range record", q->id);
        cudaMemsetAsync(q->rec, 0, 4 * sizeof(int32_t), q->stream); /* not reported later either */
        (void)cudaGetLastError();
        return st;
    }
    int32_t r[4];
    memcpy(r, q->hbuf, sizeof r);
    if (!r[0]) return TIDE_OK;
    CU_TRY(ctx, cudaMemsetAsync(q->rec, 0, 4 * sizeof(int32_t), q->stream), "cudaMemsetAsync of a range record");
    CU_TRY(ctx, cudaStreamSynchronize(q->stream), "cudaStreamSynchronize after clearing a range record");
    char what[160];
    switch (r[0]) {
    case REC_EMBED:
        snprintf(what, sizeof what, "embed: token id %d at position %d is outside the vocabulary (size %d)", r[2],
                 r[1], r[3]);
        break;
    case REC_EMBED_BWD:
        snprintf(what, sizeof what, "embed_bwd: token id %d at position %d is outside the gradient (vocabulary %d)",
                 r[2], r[1], r[3]);
        break;
    case REC_TARGET:
        snprintf(what, sizeof what, "cross_entropy: target %d of row %d is outside the vocabulary (%d ids)", r[2],
                 r[1], r[3]);
        break;
    case REC_CE_STATS:
    case REC_CE_BLOCK:
        snprintf(what, sizeof what, "%s: target %d of row %d is outside the vocabulary of %d ids",
                 r[0] == REC_CE_STATS ? "ce_stats" : "ce_block", r[2], r[1], r[3]);
        break;
    case REC_POSITIONS:
        snprintf(what, sizeof what, "attention of fresh sequences needs positions 0..%d, but index %d is %d",
                 r[3] - 1, r[1], r[2]);
        break;
    default:
        snprintf(what, sizeof what, "attention: position %d at index %d is outside the cache (capacity %d)", r[2],
                 r[1], r[3]);
        break;
    }
    return tide_err(ctx, TIDE_E_RANGE, "%s; found by a queued op (queue %d), so what ran after it is not valid", what,
                    q->id);
}

/* Forgets q's record unread (q's mutex held): no later wait reports it. */
static void drop_record(cu_queue *q) {
    if (q->rec_armed) cudaMemsetAsync(q->rec, 0, 4 * sizeof(int32_t), q->stream);
    q->rec_armed = false;
}

/* The first queue of the list, taken under the instance's mutex: queues are
 * never unlinked before destroy and new ones go in front, so what follows it
 * can be walked without the mutex. */
static cu_queue *queue_list(cu_impl *im) {
    pthread_mutex_lock(&im->mu);
    cu_queue *q = im->queues;
    pthread_mutex_unlock(&im->mu);
    return q;
}

static tide_status cu_synchronize(tide_backend *be) {
    cu_impl *im = impl_of(be);
    cu_queue *all = queue_list(im);
    tide_status first = TIDE_OK;
    char msg[TIDE_ERRMSG_MAX] = "";
    /* every stream is waited for, whatever failed first */
    for (cu_queue *q = all; q; q = q->next) {
        cudaError_t e = cudaStreamSynchronize(q->stream);
        if (e != cudaSuccess && !first) {
            first = tide_cuda_fail(be->ctx, TIDE_E_BACKEND, e, "cudaStreamSynchronize (queue %d)", q->id);
            snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(be->ctx));
        }
    }
    if (first) {
        /* the records cannot be read now: clear them, so that no later run
         * reports this one's range error */
        for (cu_queue *q = all; q; q = q->next) {
            pthread_mutex_lock(&q->mu);
            drop_record(q);
            pthread_mutex_unlock(&q->mu);
        }
        (void)cudaGetLastError();
    }
    for (cu_queue *q = all; q && !first; q = q->next) {
        pthread_mutex_lock(&q->mu);
        tide_status st = read_record(be->ctx, q);
        pthread_mutex_unlock(&q->mu);
        if (st && !first) {
            first = st;
            snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(be->ctx));
        }
    }
    return first ? tide_err(be->ctx, first, "%s", msg) : TIDE_OK;
}

static tide_status cu_queue_sync(tide_backend *be, void *vq) {
    cu_queue *q = queue_of(be, vq);
    pthread_mutex_lock(&q->mu);
    cudaError_t e = cudaStreamSynchronize(q->stream);
    tide_status st;
    if (e != cudaSuccess) {
        st = tide_cuda_fail(q->ctx, TIDE_E_BACKEND, e, "cudaStreamSynchronize (queue %d)", q->id);
        drop_record(q); /* cannot be read now: not reported later either */
        (void)cudaGetLastError();
    } else {
        st = read_record(q->ctx, q);
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}

/* Makes q's stream, flag, record and mutex (not handed out yet); errors on
 * ctx. On failure q holds what was made, for queue_release. */
static tide_status queue_init(cu_queue *q, tide_ctx *ctx) {
    if (pthread_mutex_init(&q->mu, NULL) != 0)
        return tide_err(ctx, TIDE_E_NOMEM, "cuda: cannot create queue %d's mutex", q->id);
    q->mu_ready = true;
    CU_TRY(ctx, cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking), "cudaStreamCreate (queue %d)", q->id);
    CU_TRY(ctx, cudaMalloc((void **)&q->flag, 2 * sizeof(int32_t)), "cudaMalloc of queue %d's flag", q->id);
    CU_TRY(ctx, cudaMalloc((void **)&q->rec, 4 * sizeof(int32_t)), "cudaMalloc of queue %d's range record", q->id);
    /* on the queue's own stream: the queues do not wait for the legacy stream */
    CU_TRY(ctx, cudaMemsetAsync(q->rec, 0, 4 * sizeof(int32_t), q->stream),
           "cudaMemsetAsync of queue %d's range record", q->id);
    CU_TRY(ctx, cudaHostAlloc((void **)&q->hbuf, 4 * sizeof(int32_t), cudaHostAllocPortable),
           "cudaHostAlloc of queue %d's flag", q->id);
    return TIDE_OK;
}

/* A queue kept by queue_free if there is one, else a new one while the
 * instance has fewer than CU_MAX_QUEUES. */
static tide_status cu_queue_new(tide_backend *be, tide_ctx *ctx, bool async, void **out) {
    cu_impl *im = impl_of(be);
    *out = NULL;
    CU_TRY(ctx, cudaSetDevice(im->device), "cudaSetDevice(%d) for a new queue", im->device);
    pthread_mutex_lock(&im->mu);
    cu_queue *q = im->queues;
    while (q && q->in_use) q = q->next;
    int id = -1;
    if (q) {
        q->in_use = true;
        q->ctx = ctx;
        q->async = async;
    } else if (im->n_queues < CU_MAX_QUEUES) {
        im->n_queues++; /* reserved while it is made */
        id = im->next_id++;
    }
    pthread_mutex_unlock(&im->mu);
    if (q) {
        *out = q;
        return TIDE_OK;
    }
    if (id < 0)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "cuda: this backend has its %d queues already (the most it "
                        "makes); free some, or share the backend among fewer models", CU_MAX_QUEUES);
    q = tide_calloc(1, sizeof *q);
    tide_status st = q ? TIDE_OK : tide_err(ctx, TIDE_E_NOMEM, "cuda: out of memory creating a queue");
    if (q) {
        q->id = id;
        st = queue_init(q, ctx);
    }
    pthread_mutex_lock(&im->mu);
    if (st) {
        im->n_queues--;
    } else {
        q->ctx = ctx;
        q->async = async;
        q->in_use = true;
        q->next = im->queues;
        im->queues = q;
    }
    pthread_mutex_unlock(&im->mu);
    if (st) {
        if (q) queue_release(q);
        return st;
    }
    *out = q;
    return TIDE_OK;
}

/* Waits for q's work and keeps it, idle and with its record cleared, for a
 * later queue_new. */
static void cu_queue_free(tide_backend *be, void *vq) {
    if (!vq) return;
    cu_impl *im = impl_of(be);
    cu_queue *q = vq;
    pthread_mutex_lock(&q->mu);
    cudaStreamSynchronize(q->stream);
    drop_record(q);
    cudaStreamSynchronize(q->stream);
    (void)cudaGetLastError();
    pthread_mutex_unlock(&q->mu);
    pthread_mutex_lock(&im->mu);
    q->in_use = false;
    q->ctx = NULL;
    pthread_mutex_unlock(&im->mu);
}

/* ---------------------------------------------------------------- events */

static tide_status cu_event_new(tide_backend *be, bool timing, void **ev) {
    cudaEvent_t e = NULL;
    *ev = NULL;
    CU_TRY(be->ctx, cudaSetDevice(impl_of(be)->device), "cudaSetDevice(%d)", impl_of(be)->device);
    CU_TRY(be->ctx, cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
           "cudaEventCreate");
    *ev = e;
    return TIDE_OK;
}

static void cu_event_free(tide_backend *be, void *ev) {
    (void)be;
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
    (void)cudaGetLastError();
}

static tide_status cu_event_record(tide_backend *be, void *vq, void *ev) {
    bind_device(be);
    cu_queue *q = queue_of(be, vq);
    pthread_mutex_lock(&q->mu);
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, q->stream);
    pthread_mutex_unlock(&q->mu);
    return e == cudaSuccess ? TIDE_OK : tide_cuda_fail(q->ctx, TIDE_E_BACKEND, e, "cudaEventRecord (queue %d)", q->id);
}

static tide_status cu_event_wait(tide_backend *be, void *vq, void *ev) {
    bind_device(be);
    cu_queue *q = queue_of(be, vq);
    pthread_mutex_lock(&q->mu);
    cudaError_t e = cudaStreamWaitEvent(q->stream, (cudaEvent_t)ev, 0);
    pthread_mutex_unlock(&q->mu);
    return e == cudaSuccess ? TIDE_OK
                            : tide_cuda_fail(q->ctx, TIDE_E_BACKEND, e, "cudaStreamWaitEvent (queue %d)", q->id);
}

static tide_status cu_event_sync(tide_backend *be, void *vq, void *ev) {
    cu_queue *q = queue_of(be, vq);
    CU_TRY(q->ctx, cudaEventSynchronize((cudaEvent_t)ev), "cudaEventSynchronize (queue %d)", q->id);
    return TIDE_OK;
}

static tide_status cu_event_elapsed(tide_backend *be, void *from, void *to, double *seconds) {
    float ms = 0;
    CU_TRY(be->ctx, cudaEventElapsedTime(&ms, (cudaEvent_t)from, (cudaEvent_t)to), "cudaEventElapsedTime");
    *seconds = ms * 1e-3;
    return TIDE_OK;
}

static const tide_backend_vt cuda_vt = {
    .name = "cuda",
    .device_is_host = false,
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .dealloc = cu_dealloc,
    .queue_new = cu_queue_new,
    .queue_free = cu_queue_free,
    .queue_sync = cu_queue_sync,
    .to_device = cu_to_device,
    .to_host = cu_to_host,
    .compute = cu_compute,
    .synchronize = cu_synchronize,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .mem_info = cu_mem_info,
    .file_read = cu_file_read,
    .event_new = cu_event_new,
    .event_free = cu_event_free,
    .event_record = cu_event_record,
    .event_wait = cu_event_wait,
    .event_sync = cu_event_sync,
    .event_elapsed = cu_event_elapsed,
};

/* ---------------------------------------------------------------- creation */

/* This process's rank among a launch's on this machine (0 outside one):
 * Open MPI's mpirun, srun, or a torchrun-style launcher's LOCAL_RANK. */
static int local_rank(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const char *v = getenv(names[k]);
        if (!v || !*v) continue;
        char *end;
        long r = strtol(v, &end, 10);
        if (!*end && r >= 0 && r < (1 << 20)) return (int)r;
    }
    return 0;
}

/* Returns TIDE_OK with *out a CUDA backend on GPU 0 (a rank of a launch:
 * its local rank modulo the devices, so the ranks of one machine take one
 * GPU each); TIDE_E_NO_DEVICE when
 * the driver or the device is absent or unusable; TIDE_E_UNSUPPORTED when
 * this build has no kernels for the GPU; TIDE_E_BACKEND or TIDE_E_NOMEM when
 * setting it up fails. */
tide_status tide_cuda_backend_new(tide_ctx *ctx, tide_backend **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tide_err(ctx, TIDE_E_NO_DEVICE, "no CUDA device: %s (error %d)", cudaGetErrorString(e), (int)e);
    }
    if (n < 1) return tide_err(ctx, TIDE_E_NO_DEVICE, "no CUDA device: the driver reports none");
    const int dev = local_rank() % n;
    if ((e = cudaSetDevice(dev)) != cudaSuccess)
        return tide_cuda_fail(ctx, TIDE_E_NO_DEVICE, e, "device %d is not usable (cudaSetDevice)", dev);
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
        return tide_cuda_fail(ctx, TIDE_E_NO_DEVICE, e, "cudaGetDeviceProperties of device %d", dev);
    if ((e = tcu_probe()) != cudaSuccess)
        return tide_cuda_fail(ctx, e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction
                                       ? TIDE_E_UNSUPPORTED : TIDE_E_BACKEND,
                              e, "this build has no kernels for %s (compute capability %d.%d); reconfigure with "
                              "-DCMAKE_CUDA_ARCHITECTURES=%d%d", prop.name, prop.major, prop.minor, prop.major,
                              prop.minor);

    tide_backend *be = tide_calloc(1, sizeof *be);
    cu_impl *im = tide_calloc(1, sizeof *im);
    cu_queue *def = tide_calloc(1, sizeof *def);
    if (!be || !im || !def || pthread_mutex_init(&im->mu, NULL) != 0) {
        tide_free(be);
        tide_free(im);
        tide_free(def);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory creating the cuda backend");
    }
    be->vt = &cuda_vt;
    be->ctx = ctx;
    be->kind = TIDE_BACKEND_CUDA;
    be->matmul = TIDE_MATMUL_FAST;
    be->impl = im;
    im->device = dev;
    im->cc_major = prop.major;
    im->cc_minor = prop.minor;
    im->mem_pitch = prop.memPitch;
    /* No cuBLAS workspace: without one cuBLAS never splits a product's K
     * over blocks, so every output element is summed over K in one order
     * whatever the call's rows and columns, and a row tile or a weight block
     * gives the bits of the whole product. On an H100 with 32 MiB (cuBLAS's
     * advice) split-K kernels made 1024-row tiles and 32 MiB weight blocks
     * differ from the untiled run; without it a bf16 product of
     * 2048 x 11008 x 4096 ran as fast (0.256 ms against 0.263 ms). */
    im->ws_bytes = 0;
    /* TIDE_CUDA_ATTENTION=rows keeps every attention launch on the per-row
     * kernel, to compare the two on a GPU */
    const char *attn = getenv("TIDE_CUDA_ATTENTION");
    im->attn_rows = attn && !strcmp(attn, "rows");
    /* the default queue: synchronous, errors on be->ctx, its cuBLAS handle
     * made now (a failure shows at creation, not at the first MATMUL) */
    def->ctx = ctx;
    def->in_use = true;
    def->id = im->next_id++;
    im->queues = im->def = def;
    im->n_queues = 1;
    tide_status st = queue_init(def, ctx);
    if (!st) st = tide_cuda_queue_blas(be, def, ctx);
    if (st) {
        cu_destroy(be);
        return st;
    }
    *out = be;
    return TIDE_OK;
}
