/*
 * cuda_backend.c - the CUDA backend: device memory is cudaMalloc'ed memory of
 * GPU 0, transfers are cudaMemcpyAsync, compute launches the kernels of
 * cuda_kernels.cu (MATMUL through cuBLAS); events are CUDA events.
 *
 * Streams. The backend owns four CUDA streams, one per plan stream ("lanes":
 * 0 compute, 1 h2d, 2 d2h, 3 io), each with its own cuBLAS handle (made on the
 * lane's first MATMUL; lane 0's at creation), its own range-check flag and
 * its own mutex. The executor runs one worker thread per plan stream, and each
 * calls stream_begin once, which binds the thread (thread-local) to that
 * lane; a thread that never called it (the resident runner in model.c) uses
 * lane 0. A call enqueues its work on the thread's lane; in the synchronous
 * mode it then synchronizes that stream only, in the asynchronous mode
 * (stream_begin's async, used by the executor's compute, h2d and d2h workers
 * and by the resident runner) it returns at once, and the ordering between
 * lanes is the executor's: CUDA events recorded after a producer and waited on
 * by the consumer's stream (cudaStreamWaitEvent), so the host waits on
 * nothing while a plan runs. Either way a copy on lane 1 overlaps a kernel on
 * lane 0 (the copy engines and the SMs run side by side). The lane mutex
 * serializes two threads that share a lane (uncontended in the executor).
 * Nothing calls cudaDeviceSynchronize; `synchronize` waits for the four
 * streams and returns the first error found there. Streams are non-blocking:
 * no implicit ordering with the legacy default stream, which nothing here
 * uses.
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
 * for 16-bit ones) with atomics off, each handle
 * on a fixed stream with its own fixed workspace, so results are
 * bit-reproducible run to run on one GPU model and toolkit.
 *
 * Range errors (EMBED token ids, ATTENTION positions) are found on the GPU.
 * Synchronous mode: a check kernel leaves the smallest bad index in the
 * lane's flag, which is read back before anything is written, so an
 * out-of-range op writes nothing and fails, as on the CPU. Asynchronous mode
 * (nothing may wait): the check claims the lane's record instead, the op's
 * kernels, which stay inside their buffers whatever the ids, run anyway, and
 * `synchronize` reads the records and fails with the first one's message;
 * what ran after the bad op is wrong but wrote only its own outputs.
 *
 * Errors: every CUDA or cuBLAS failure becomes TIDE_E_BACKEND (TIDE_E_NOMEM
 * for an allocation) with a message naming the call and the error; nothing
 * aborts.
 */
#include "backend/backend.h"
#include "backend/cuda/cuda_file.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>

#define CU_LANES 4

typedef struct cu_lane {
    cudaStream_t stream;
    cublasHandle_t blas; /* NULL until the lane's first MATMUL (lane 0: from the start) */
    void *blas_ws;       /* the handle's workspace (ws_bytes of device memory) */
    int32_t *flag;       /* device (2): range-check result */
    int32_t *rec;        /* device (4): deferred range-check record (asynchronous mode) */
    bool rec_armed;      /* a deferred check was queued since synchronize last read rec */
    int32_t *hbuf;       /* pinned host (4): their read-back */
    pthread_mutex_t mu;
    bool mu_ready;
} cu_lane;

typedef struct cu_impl {
    int device;
    int cc_major, cc_minor;
    size_t ws_bytes;
    size_t mem_pitch; /* the largest pitch cudaMemcpy2DAsync takes (cudaDeviceProp.memPitch) */
    cu_lane lane[CU_LANES];
} cu_impl;

/* The lane of the calling thread and its mode (stream_begin); lane 0,
 * synchronous, until it is set. */
static _Thread_local int tl_lane;
static _Thread_local bool tl_async;

static cu_impl *impl_of(tide_backend *be) { return be->impl; }

static cu_lane *lane_of(tide_backend *be) { return &impl_of(be)->lane[tl_lane]; }

/* Records a CUDA failure: "cuda: <what>: <error string> (<name>, error N)".
 * Clears the (non-sticky) error state so that later calls start clean. */
static tide_status cu_fail(tide_ctx *ctx, tide_status st, cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static tide_status cu_fail(tide_ctx *ctx, tide_status st, cudaError_t e, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    (void)cudaGetLastError();
    return tide_err(ctx, st, "cuda: %s: %s (%s, error %d)", what, cudaGetErrorString(e), cudaGetErrorName(e),
                    (int)e);
}

static tide_status blas_fail(tide_ctx *ctx, cublasStatus_t s, const char *what) {
    return tide_err(ctx, TIDE_E_BACKEND, "cuda: %s: %s (%s, status %d)", what, cublasGetStatusString(s),
                    cublasGetStatusName(s), (int)s);
}

/* Evaluates a CUDA call; on failure returns TIDE_E_BACKEND naming it. */
#define CU_TRY(ctx, call, ...)                                                        \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) return cu_fail((ctx), TIDE_E_BACKEND, e_, __VA_ARGS__); \
    } while (0)

/* ---------------------------------------------------------------- lanes */

/* Makes the lane's cuBLAS handle: fixed stream, fixed workspace, FP32 math
 * without TF32, no atomics. Called with the lane's mutex held. */
static tide_status lane_blas(tide_backend *be, cu_lane *ln) {
    if (ln->blas) return TIDE_OK;
    cu_impl *im = impl_of(be);
    cublasHandle_t h = NULL;
    cublasStatus_t bs = cublasCreate(&h);
    if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(be->ctx, bs, "cublasCreate");
    cudaError_t e = cudaMalloc(&ln->blas_ws, im->ws_bytes);
    if (e != cudaSuccess) {
        ln->blas_ws = NULL;
        cublasDestroy(h);
        return cu_fail(be->ctx, e == cudaErrorMemoryAllocation ? TIDE_E_NOMEM : TIDE_E_BACKEND, e,
                       "cudaMalloc of the %zu-byte cuBLAS workspace", im->ws_bytes);
    }
    const char *what = "cublasSetStream";
    bs = cublasSetStream(h, ln->stream);
    if (bs == CUBLAS_STATUS_SUCCESS) what = "cublasSetWorkspace", bs = cublasSetWorkspace(h, ln->blas_ws, im->ws_bytes);
    if (bs == CUBLAS_STATUS_SUCCESS) what = "cublasSetMathMode", bs = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    if (bs == CUBLAS_STATUS_SUCCESS)
        what = "cublasSetAtomicsMode", bs = cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        cudaFree(ln->blas_ws);
        ln->blas_ws = NULL;
        return blas_fail(be->ctx, bs, what);
    }
    ln->blas = h;
    return TIDE_OK;
}

static tide_status lane_sync(tide_backend *be, cu_lane *ln, const char *what) {
    CU_TRY(be->ctx, cudaStreamSynchronize(ln->stream), "cudaStreamSynchronize after %s", what);
    return TIDE_OK;
}

static void lane_release(cu_lane *ln) {
    if (ln->stream) cudaStreamSynchronize(ln->stream);
    if (ln->blas) cublasDestroy(ln->blas);
    if (ln->blas_ws) cudaFree(ln->blas_ws);
    if (ln->flag) cudaFree(ln->flag);
    if (ln->rec) cudaFree(ln->rec);
    if (ln->hbuf) cudaFreeHost(ln->hbuf);
    if (ln->stream) cudaStreamDestroy(ln->stream);
    if (ln->mu_ready) pthread_mutex_destroy(&ln->mu);
    memset(ln, 0, sizeof *ln);
}

/* ---------------------------------------------------------------- memory */

static void cu_destroy(tide_backend *be) {
    cu_impl *im = impl_of(be);
    if (im) {
        cudaSetDevice(im->device);
        for (int i = 0; i < CU_LANES; i++) lane_release(&im->lane[i]);
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
    return cu_fail(be->ctx, TIDE_E_BACKEND, e, "cudaMalloc of %zu bytes", n);
}

static void cu_dealloc(tide_backend *be, void *ptr) {
    if (ptr) cudaFree(ptr);
}

static tide_status cu_copy(tide_backend *be, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    if (!n) return TIDE_OK;
    cu_lane *ln = lane_of(be);
    const char *what = kind == cudaMemcpyHostToDevice ? "host to device" : "device to host";
    pthread_mutex_lock(&ln->mu);
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, ln->stream);
    tide_status st = TIDE_OK;
    if (e != cudaSuccess)
        st = cu_fail(be->ctx, TIDE_E_BACKEND, e, "cudaMemcpyAsync %s of %zu bytes (stream %d)", what, n, tl_lane);
    else if (!tl_async && (e = cudaStreamSynchronize(ln->stream)) != cudaSuccess)
        st = cu_fail(be->ctx, TIDE_E_BACKEND, e, "cudaStreamSynchronize after a %s copy of %zu bytes (stream %d)",
                     what, n, tl_lane);
    pthread_mutex_unlock(&ln->mu);
    return st;
}

static tide_status cu_to_device(tide_backend *be, void *dst, const void *src, size_t n) {
    return cu_copy(be, dst, src, n, cudaMemcpyHostToDevice);
}

static tide_status cu_to_host(tide_backend *be, void *dst, const void *src, size_t n) {
    return cu_copy(be, dst, src, n, cudaMemcpyDeviceToHost);
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
        return cu_fail(be->ctx, TIDE_E_NOMEM, e, "cudaHostRegister of %zu bytes of host memory", n);
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

static tide_status cu_file_read(tide_backend *be, int fd, uint64_t off, void *dst, size_t n) {
    CU_TRY(be->ctx, cudaSetDevice(impl_of(be)->device), "cudaSetDevice(%d)", impl_of(be)->device);
    return tide_cuda_file_read(be, fd, off, dst, n);
}

enum { REC_EMBED = 1, REC_ATTENTION = 2 };

/* Reads and clears lane i's deferred range-check record (its stream is
 * idle); TIDE_E_RANGE naming the first bad id when one was found. */
static tide_status read_record(tide_backend *be, cu_lane *ln, int i) {
    if (!ln->rec_armed) return TIDE_OK;
    ln->rec_armed = false;
    cudaError_t e = cudaMemcpyAsync(ln->hbuf, ln->rec, 4 * sizeof(int32_t), cudaMemcpyDeviceToHost, ln->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ln->stream);
    if (e != cudaSuccess) {
        tide_status st = cu_fail(be->ctx, TIDE_E_BACKEND, e, "reading stream %d's range record", i);
        cudaMemsetAsync(ln->rec, 0, 4 * sizeof(int32_t), ln->stream); /* not reported later either */
        (void)cudaGetLastError();
        return st;
    }
    int32_t r[4];
    memcpy(r, ln->hbuf, sizeof r);
    if (!r[0]) return TIDE_OK;
    CU_TRY(be->ctx, cudaMemsetAsync(ln->rec, 0, 4 * sizeof(int32_t), ln->stream), "cudaMemsetAsync of a range record");
    CU_TRY(be->ctx, cudaStreamSynchronize(ln->stream), "cudaStreamSynchronize after clearing a range record");
    if (r[0] == REC_EMBED)
        return tide_err(be->ctx, TIDE_E_RANGE, "embed: token id %d at position %d is outside the vocabulary (size %d); "
                        "found by a queued op (stream %d), so what ran after it is not valid", r[2], r[1], r[3], i);
    return tide_err(be->ctx, TIDE_E_RANGE, "attention: position %d at index %d is outside the cache (capacity %d); "
                    "found by a queued op (stream %d), so what ran after it is not valid", r[2], r[1], r[3], i);
}

static tide_status cu_synchronize(tide_backend *be) {
    cu_impl *im = impl_of(be);
    tide_status first = TIDE_OK;
    char msg[TIDE_ERRMSG_MAX] = "";
    /* every stream is waited for, whatever failed first */
    for (int i = 0; i < CU_LANES; i++) {
        cudaError_t e = cudaStreamSynchronize(im->lane[i].stream);
        if (e != cudaSuccess && !first) {
            first = cu_fail(be->ctx, TIDE_E_BACKEND, e, "cudaStreamSynchronize (stream %d)", i);
            snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(be->ctx));
        }
    }
    if (first) {
        /* the records cannot be read now: clear them, so that no later run
         * reports this one's range error */
        for (int i = 0; i < CU_LANES; i++) {
            cu_lane *ln = &im->lane[i];
            pthread_mutex_lock(&ln->mu);
            if (ln->rec_armed) cudaMemsetAsync(ln->rec, 0, 4 * sizeof(int32_t), ln->stream);
            ln->rec_armed = false;
            pthread_mutex_unlock(&ln->mu);
        }
        (void)cudaGetLastError();
    }
    for (int i = 0; i < CU_LANES && !first; i++) {
        cu_lane *ln = &im->lane[i];
        pthread_mutex_lock(&ln->mu);
        tide_status st = read_record(be, ln, i);
        pthread_mutex_unlock(&ln->mu);
        if (st && !first) {
            first = st;
            snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(be->ctx));
        }
    }
    return first ? tide_err(be->ctx, first, "%s", msg) : TIDE_OK;
}

static tide_status cu_stream_begin(tide_backend *be, int stream, bool async) {
    if (stream < 0 || stream >= CU_LANES)
        return tide_err(be->ctx, TIDE_E_INVALID, "cuda: stream %d does not exist (0 to %d)", stream, CU_LANES - 1);
    /* set first: a thread going back to synchronous issue must get there even
     * when the device has failed */
    tl_lane = stream;
    tl_async = async;
    CU_TRY(be->ctx, cudaSetDevice(impl_of(be)->device), "cudaSetDevice(%d) on stream %d's thread",
           impl_of(be)->device, stream);
    return TIDE_OK;
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

static tide_status cu_event_record(tide_backend *be, void *ev) {
    cu_lane *ln = lane_of(be);
    pthread_mutex_lock(&ln->mu);
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, ln->stream);
    pthread_mutex_unlock(&ln->mu);
    return e == cudaSuccess ? TIDE_OK : cu_fail(be->ctx, TIDE_E_BACKEND, e, "cudaEventRecord (stream %d)", tl_lane);
}

static tide_status cu_event_wait(tide_backend *be, void *ev) {
    cu_lane *ln = lane_of(be);
    pthread_mutex_lock(&ln->mu);
    cudaError_t e = cudaStreamWaitEvent(ln->stream, (cudaEvent_t)ev, 0);
    pthread_mutex_unlock(&ln->mu);
    return e == cudaSuccess ? TIDE_OK : cu_fail(be->ctx, TIDE_E_BACKEND, e, "cudaStreamWaitEvent (stream %d)", tl_lane);
}

static tide_status cu_event_sync(tide_backend *be, void *ev) {
    CU_TRY(be->ctx, cudaEventSynchronize((cudaEvent_t)ev), "cudaEventSynchronize (stream %d)", tl_lane);
    return TIDE_OK;
}

static tide_status cu_event_elapsed(tide_backend *be, void *from, void *to, double *seconds) {
    float ms = 0;
    CU_TRY(be->ctx, cudaEventElapsedTime(&ms, (cudaEvent_t)from, (cudaEvent_t)to), "cudaEventElapsedTime");
    *seconds = ms * 1e-3;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- compute */

static const tide_tensor *tin(const tide_graph *g, const tide_op *op, int i) { return &g->tensors[op->in[i]]; }
static const tide_tensor *tout(const tide_graph *g, const tide_op *op, int i) { return &g->tensors[op->out[i]]; }

/* Runs the range check of ids (n) against [0, hi) on the lane and waits for
 * it: *bad = -1 when all are in range, else the first bad index and *value
 * its id. */
static tide_status range_check(tide_backend *be, cu_lane *ln, const int32_t *ids, int64_t n, int64_t hi,
                               int64_t *bad, int32_t *value, const char *what) {
    *bad = -1;
    if (n >= TCU_FLAG_OK)
        return tide_err(be->ctx, TIDE_E_UNSUPPORTED, "cuda %s: %lld ids are more than the range check takes", what,
                        (long long)n);
    CU_TRY(be->ctx, tcu_range_check(ln->stream, ids, n, hi, ln->flag), "%s range check kernel", what);
    CU_TRY(be->ctx, cudaMemcpyAsync(ln->hbuf, ln->flag, sizeof(int32_t), cudaMemcpyDeviceToHost, ln->stream),
           "cudaMemcpyAsync of the %s range flag", what);
    CU_TRY(be->ctx, cudaStreamSynchronize(ln->stream), "cudaStreamSynchronize after the %s range check", what);
    if (ln->hbuf[0] == TCU_FLAG_OK) return TIDE_OK;
    *bad = ln->hbuf[0];
    CU_TRY(be->ctx, cudaMemcpyAsync(ln->hbuf + 1, ids + *bad, sizeof(int32_t), cudaMemcpyDeviceToHost, ln->stream),
           "cudaMemcpyAsync of a bad %s id", what);
    CU_TRY(be->ctx, cudaStreamSynchronize(ln->stream), "cudaStreamSynchronize after reading a bad %s id", what);
    *value = ln->hbuf[1];
    return TIDE_OK;
}

/* cublasSgemm of row-major out (R, N) (leading dimension ldo) = x (R, K) .
 * w (N, K)^T, as column-major out^T = w^T^T . x^T (see the note at the top). */
static tide_status sgemm_rows(tide_backend *be, cu_lane *ln, const float *x, const float *w, int R, int K, int N,
                              float *out, int ldo, const char *wname) {
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t bs =
        cublasSgemm(ln->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, R, K, &one, w, K, x, K, &zero, out, ldo);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        char what[300];
        snprintf(what, sizeof what, "cublasSgemm of matmul '%s' (%d x %d x %d)", wname, R, N, K);
        return blas_fail(be->ctx, bs, what);
    }
    return TIDE_OK;
}

/* The fast mode (TIDE_MATMUL_FAST) for f16/bf16 weights: the rows of x are
 * rounded to the weights' dtype in the op's scratch, as many as fit, in
 * equal chunks, and each chunk is multiplied on tensor cores:
 * cublasGemmEx(T, N, m=N, n=cnt, k=K, w (16-bit), lda=K, x16, ldb=K,
 * out + r0*ldo (f32), ldc=ldo), f32 compute. The chunking depends on the
 * scratch size alone (a property of the graph, not of the budget), so an
 * offloaded run repeats the unconstrained run's arithmetic. */
static tide_status gemm_fast(tide_backend *be, cu_lane *ln, const tide_op *op, const float *x, const void *w,
                             const tide_tensor *wt, int R, int K, int N, float *out, int ldo, void *scratch) {
    tide_status st = lane_blas(be, ln);
    if (st) return st;
    const cudaDataType dt = wt->dtype == TIDE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    int64_t rows = (int64_t)(op->scratch_bytes / ((uint64_t)K * 2));
    rows = TIDE_MIN(rows, (int64_t)R);
    int64_t nchunk = (R + rows - 1) / rows;
    rows = (R + nchunk - 1) / nchunk;
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
        int64_t cnt = TIDE_MIN(rows, (int64_t)R - r0);
        CU_TRY(be->ctx, tcu_round_to_16(ln->stream, x + r0 * K, wt->dtype, scratch, cnt * K),
               "matmul '%s' activation rounding kernel", wt->name);
        cublasStatus_t bs = cublasGemmEx(ln->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, (int)cnt, K, &one, w, dt, K,
                                         scratch, dt, K, &zero, out + r0 * ldo, CUDA_R_32F, ldo,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            char what[300];
            snprintf(what, sizeof what, "cublasGemmEx of matmul '%s' (%lld x %d x %d, %s)", wt->name,
                     (long long)cnt, N, K, tide_dtype_name(wt->dtype));
            return blas_fail(be->ctx, bs, what);
        }
    }
    return TIDE_OK;
}

static tide_status op_matmul(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                             void *const *in, void *const *out, void *scratch) {
    const tide_tensor *xt = tin(g, op, 0), *wt = tin(g, op, 1);
    int64_t R = xt->shape[0], K = xt->shape[1], N = wt->shape[0];
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX)
        return tide_err(be->ctx, TIDE_E_UNSUPPORTED, "matmul '%s': dimensions beyond what cuBLAS takes", wt->name);
    const tide_tensor *ot = tout(g, op, 0);
    int64_t ldo = ot->shape[1];
    if (ldo > INT_MAX)
        return tide_err(be->ctx, TIDE_E_UNSUPPORTED, "matmul '%s': dimensions beyond what cuBLAS takes", wt->name);
    const float *x = in[0];
    float *o = (float *)out[0] + op->p.row0 * ldo + op->p.col0; /* a tile writes its block */
    if (wt->dtype == TIDE_F32) {
        tide_status st = lane_blas(be, ln);
        return st ? st : sgemm_rows(be, ln, x, in[1], (int)R, (int)K, (int)N, o, (int)ldo, wt->name);
    }
    if (be->matmul == TIDE_MATMUL_FAST && R >= TCU_MATMUL_FUSED_R && scratch && K > 0 &&
        op->scratch_bytes / ((uint64_t)K * 2) >= 1)
        return gemm_fast(be, ln, op, x, in[1], wt, (int)R, (int)K, (int)N, o, (int)ldo, scratch);
    int64_t nb = scratch && K > 0 ? (int64_t)(op->scratch_bytes / ((uint64_t)K * sizeof(float))) : 0;
    if (R < TCU_MATMUL_FUSED_R || nb < 1) {
        CU_TRY(be->ctx, tcu_matmul_fused(ln->stream, x, in[1], wt->dtype, R, K, N, o, ldo), "matmul '%s' kernel",
               wt->name);
        return TIDE_OK;
    }
    tide_status st = lane_blas(be, ln);
    if (st) return st;
    nb = TIDE_MIN(nb, N);
    int64_t nblk = (N + nb - 1) / nb;
    nb = (N + nblk - 1) / nblk; /* equal blocks, as the CPU cuts them */
    size_t es = tide_dtype_size(wt->dtype);
    const uint8_t *wb = in[1];
    for (int64_t n0 = 0; n0 < N && !st; n0 += nb) {
        int64_t cnt = TIDE_MIN(nb, N - n0);
        CU_TRY(be->ctx, tcu_convert(ln->stream, wb + (size_t)n0 * (size_t)K * es, wt->dtype, scratch, cnt * K),
               "matmul '%s' weight conversion kernel", wt->name);
        st = sgemm_rows(be, ln, x, scratch, (int)R, (int)K, (int)cnt, o + n0, (int)ldo, wt->name);
    }
    return st;
}

static tide_status op_attention(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                                void *const *in, void *const *out, void *scratch) {
    const tide_op_params *p = &op->p;
    /* the caches are outputs 1 and 2 (also inputs 4 and 5 unless fresh; a fresh
     * cache's positions 0..T-1 are the caller's guarantee, see tide.h) */
    const tide_tensor *pos = tin(g, op, 3), *kc = &g->tensors[op->out[1]];
    int64_t B = p->batch, T = tin(g, op, 0)->shape[0] / p->batch, C = kc->shape[1];
    const int32_t *pp = (const int32_t *)in[3] + p->idx0; /* a tile's positions */
    int H = p->n_heads, KV = p->n_kv_heads, hd = p->head_dim;
    if (hd > TCU_ATTN_MAX_HD)
        return tide_err(be->ctx, TIDE_E_UNSUPPORTED, "attention: head_dim %d is above the cuda backend's limit %d",
                        hd, TCU_ATTN_MAX_HD);
    if (KV <= 0 || H % KV || B * T * H > INT_MAX)
        return tide_err(be->ctx, TIDE_E_UNSUPPORTED, "attention: %lld x %lld x %d heads (%d kv heads) is beyond "
                        "the cuda kernel's grid", (long long)B, (long long)T, H, KV);
    int64_t bad = -1;
    int32_t val = 0;
    tide_status st = TIDE_OK;
    if (tl_async) {
        CU_TRY(be->ctx, tcu_range_record(ln->stream, pp, T, C, REC_ATTENTION, p->idx0, ln->rec),
               "attention range record kernel");
        ln->rec_armed = true;
    } else if ((st = range_check(be, ln, pp, T, C, &bad, &val, "attention"))) {
        return st;
    }
    if (bad >= 0)
        return tide_err(be->ctx, TIDE_E_RANGE, "attention: position %d at index %lld of '%s' is outside the cache "
                        "'%s' (capacity %lld)", val, (long long)(p->idx0 + bad), pos->name, kc->name, (long long)C);
    CU_TRY(be->ctx, tcu_cache_write(ln->stream, in[1], in[2], pp, B, T, C, (int64_t)KV * hd, out[1], out[2]),
           "attention cache write kernel");
    CU_TRY(be->ctx, tcu_attention(ln->stream, in[0], pp, out[1], out[2], out[0], B, T, C, H, KV, hd),
           "attention kernel");
    return TIDE_OK;
}

static tide_status op_embed(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                            void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = be->ctx;
    const tide_op_params *p = &op->p;
    cudaStream_t s = ln->stream;
    const tide_tensor *tab = tin(g, op, 0), *tok = tin(g, op, 1);
    const int32_t *ids = (const int32_t *)in[1] + p->idx0; /* a tile's tokens */
    int64_t R = tout(g, op, 0)->shape[0], bad = -1, vocab = p->vocab ? p->vocab : tab->shape[0];
    int32_t val = 0;
    tide_status st = TIDE_OK;
    if (tl_async) {
        CU_TRY(ctx, tcu_range_record(s, ids, R, vocab, REC_EMBED, p->idx0, ln->rec), "embed range record kernel");
        ln->rec_armed = true;
    } else if ((st = range_check(be, ln, ids, R, vocab, &bad, &val, "embed"))) {
        return st;
    }
    if (bad >= 0)
        return tide_err(ctx, TIDE_E_RANGE, "embed: token id %d at position %lld of '%s' is outside the "
                        "vocabulary (size %lld)", val, (long long)(p->idx0 + bad), tok->name, (long long)vocab);
    CU_TRY(ctx, tcu_embed(s, in[0], tab->dtype, tab->shape[0], tab->shape[1], p->vocab0, op->n_in == 2, ids, R,
                          out[0]),
           "embed kernel");
    return TIDE_OK;
}

static tide_status op_rmsnorm(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                              void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = be->ctx;
    const tide_op_params *p = &op->p;
    cudaStream_t s = ln->stream;
    const tide_tensor *x = tin(g, op, 0);
    CU_TRY(ctx, tcu_rmsnorm(s, in[0], in[1], tin(g, op, 1)->dtype, x->shape[0], x->shape[1], p->eps, out[0]),
           "rmsnorm kernel");
    return TIDE_OK;
}

static tide_status op_rope(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                           void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = be->ctx;
    const tide_op_params *p = &op->p;
    cudaStream_t s = ln->stream;
    const tide_tensor *x = tin(g, op, 0);
    CU_TRY(ctx, tcu_rope(s, in[0], (const int32_t *)in[1] + p->idx0, x->shape[0], x->shape[0] / p->batch, p->n_heads,
                         p->head_dim, p->rope_theta, out[0]),
           "rope kernel");
    return TIDE_OK;
}

static tide_status op_silu_mul(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = be->ctx;
    cudaStream_t s = ln->stream;
    CU_TRY(ctx, tcu_silu_mul(s, in[0], in[1], out[0], tide_tensor_numel(tin(g, op, 0))), "silu_mul kernel");
    return TIDE_OK;
}

static tide_status op_add(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                          void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = be->ctx;
    cudaStream_t s = ln->stream;
    CU_TRY(ctx, tcu_add(s, in[0], in[1], out[0], tide_tensor_numel(tin(g, op, 0))), "add kernel");
    return TIDE_OK;
}

static tide_status op_take_last(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                                void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = be->ctx;
    const tide_op_params *p = &op->p;
    cudaStream_t s = ln->stream;
    const tide_tensor *x = tin(g, op, 0);
    int64_t B = p->batch, T = x->shape[0] / p->batch, D = x->shape[1];
    size_t row = (size_t)D * sizeof(float);
    float *dst = (float *)out[0] + p->row0 * D;
    const float *src = (const float *)in[0] + (T - 1) * D;
    if (B <= 0 || row == 0) return TIDE_OK;
    if ((size_t)T * row <= impl_of(be)->mem_pitch) {
        CU_TRY(ctx, cudaMemcpy2DAsync(dst, row, src, (size_t)T * row, row, (size_t)B, cudaMemcpyDeviceToDevice, s),
               "cudaMemcpy2DAsync of take_last");
        return TIDE_OK;
    }
    /* sequences longer than the largest pitch: a copy per sequence */
    for (int64_t b = 0; b < B; b++)
        CU_TRY(ctx, cudaMemcpyAsync(dst + b * D, src + b * T * D, row, cudaMemcpyDeviceToDevice, s),
               "cudaMemcpyAsync of take_last (sequence %lld)", (long long)b);
    return TIDE_OK;
}

static tide_status op_argmax(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                             void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = be->ctx;
    cudaStream_t s = ln->stream;
    const tide_tensor *x = tin(g, op, 0);
    if (x->shape[0] > INT_MAX)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "argmax: %lld rows are beyond the cuda kernel's grid",
                        (long long)x->shape[0]);
    CU_TRY(ctx, tcu_argmax(s, in[0], x->shape[0], x->shape[1], out[0]), "argmax kernel");
    return TIDE_OK;
}

static tide_status op_generic(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                              void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = be->ctx;
    cudaStream_t s = ln->stream;
    const uint8_t *ip[TIDE_OP_MAX_IN];
    uint64_t ib[TIDE_OP_MAX_IN];
    for (int i = 0; i < op->n_in; i++) {
        ip[i] = in[i];
        ib[i] = tin(g, op, i)->nbytes;
        if (!ib[i]) return tide_err(ctx, TIDE_E_INVALID, "generic: input %d has no bytes", i);
    }
    for (int k = 0; k < op->n_out; k++)
        CU_TRY(ctx, tcu_generic(s, op->n_in, ip, ib, k, out[k], tout(g, op, k)->nbytes),
               "generic kernel (output %d)", k);
    return TIDE_OK;
}

/* The kernel of each op kind (graph/ops.c has the kinds' contracts): each
 * enqueues its work on the lane; the caller synchronizes. A kind without one
 * here is unsupported on CUDA. */
typedef tide_status (*cu_kernel)(tide_backend *be, cu_lane *ln, const tide_graph *g, const tide_op *op,
                                 void *const *in, void *const *out, void *scratch);
static const cu_kernel cu_kernels[TIDE_OP_COUNT] = {
    [TIDE_OP_EMBED] = op_embed,
    [TIDE_OP_RMSNORM] = op_rmsnorm,
    [TIDE_OP_MATMUL] = op_matmul,
    [TIDE_OP_ROPE] = op_rope,
    [TIDE_OP_ATTENTION] = op_attention,
    [TIDE_OP_SILU_MUL] = op_silu_mul,
    [TIDE_OP_ADD] = op_add,
    [TIDE_OP_TAKE_LAST] = op_take_last,
    [TIDE_OP_ARGMAX] = op_argmax,
    [TIDE_OP_GENERIC] = op_generic,
};

static tide_status cu_compute(tide_backend *be, const tide_graph *g, const tide_op *op, void *const *in,
                              void *const *out, void *scratch) {
    const char *nm = tide_op_name(op->kind);
    for (int i = 0; i < op->n_in; i++)
        if (!in[i]) return tide_err(be->ctx, TIDE_E_INVALID, "cuda %s: input %d has no data", nm, i);
    for (int i = 0; i < op->n_out; i++)
        if (!out[i]) return tide_err(be->ctx, TIDE_E_INVALID, "cuda %s: output %d has no data", nm, i);
    cu_kernel k = (unsigned)op->kind < TIDE_OP_COUNT ? cu_kernels[op->kind] : NULL;
    if (!k) return tide_err(be->ctx, TIDE_E_UNSUPPORTED, "cuda backend: op kind %d is not supported", (int)op->kind);
    cu_lane *ln = lane_of(be);
    pthread_mutex_lock(&ln->mu);
    tide_status st = k(be, ln, g, op, in, out, scratch);
    if (st == TIDE_OK) {
        if (!tl_async) st = lane_sync(be, ln, nm);
    } else {
        /* leave the lane idle: work enqueued before the failure must not run on */
        cudaStreamSynchronize(ln->stream);
        (void)cudaGetLastError();
    }
    pthread_mutex_unlock(&ln->mu);
    return st;
}

static const tide_backend_vt cuda_vt = {
    .name = "cuda",
    .device_is_host = false,
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .dealloc = cu_dealloc,
    .to_device = cu_to_device,
    .to_host = cu_to_host,
    .compute = cu_compute,
    .synchronize = cu_synchronize,
    .stream_begin = cu_stream_begin,
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

static tide_status lane_init(tide_backend *be, cu_lane *ln, int i) {
    if (pthread_mutex_init(&ln->mu, NULL) != 0)
        return tide_err(be->ctx, TIDE_E_NOMEM, "cuda: cannot create stream %d's mutex", i);
    ln->mu_ready = true;
    CU_TRY(be->ctx, cudaStreamCreateWithFlags(&ln->stream, cudaStreamNonBlocking), "cudaStreamCreate (stream %d)", i);
    CU_TRY(be->ctx, cudaMalloc((void **)&ln->flag, 2 * sizeof(int32_t)), "cudaMalloc of stream %d's flag", i);
    CU_TRY(be->ctx, cudaMalloc((void **)&ln->rec, 4 * sizeof(int32_t)), "cudaMalloc of stream %d's range record", i);
    /* on the lane's own stream: the lanes do not wait for the legacy stream */
    CU_TRY(be->ctx, cudaMemsetAsync(ln->rec, 0, 4 * sizeof(int32_t), ln->stream),
           "cudaMemsetAsync of stream %d's range record", i);
    CU_TRY(be->ctx, cudaHostAlloc((void **)&ln->hbuf, 4 * sizeof(int32_t), cudaHostAllocPortable),
           "cudaHostAlloc of stream %d's flag", i);
    return TIDE_OK;
}

/* Returns TIDE_OK with *out a CUDA backend on GPU 0; TIDE_E_NO_DEVICE when
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
    const int dev = 0;
    if ((e = cudaSetDevice(dev)) != cudaSuccess)
        return cu_fail(ctx, TIDE_E_NO_DEVICE, e, "device %d is not usable (cudaSetDevice)", dev);
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
        return cu_fail(ctx, TIDE_E_NO_DEVICE, e, "cudaGetDeviceProperties of device %d", dev);
    if ((e = tcu_probe()) != cudaSuccess)
        return cu_fail(ctx, e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction
                                ? TIDE_E_UNSUPPORTED : TIDE_E_BACKEND,
                       e, "this build has no kernels for %s (compute capability %d.%d); reconfigure with "
                       "-DCMAKE_CUDA_ARCHITECTURES=%d%d", prop.name, prop.major, prop.minor, prop.major, prop.minor);

    tide_backend *be = tide_calloc(1, sizeof *be);
    cu_impl *im = tide_calloc(1, sizeof *im);
    if (!be || !im) {
        tide_free(be);
        tide_free(im);
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
    /* cuBLAS's advice: 32 MiB of workspace on Hopper and later, 4 MiB before */
    im->ws_bytes = prop.major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
    tide_status st = TIDE_OK;
    for (int i = 0; i < CU_LANES && !st; i++) st = lane_init(be, &im->lane[i], i);
    if (!st) st = lane_blas(be, &im->lane[0]);
    if (st) {
        cu_destroy(be);
        return st;
    }
    *out = be;
    return TIDE_OK;
}
