/*
 * backend.h - the backend vtable. A backend computes ops on data it holds in
 * its own memory ("device" memory: host RAM for the CPU backend) and moves
 * bytes between that memory and host memory. Which backend runs is chosen at
 * run time; one binary serves with or without a GPU.
 *
 * Queues. Work (compute, copies, events) is issued on a queue of the backend
 * instance, passed to each call as `q`:
 *   - q == NULL: the instance's default queue. Synchronous (a call returns
 *     with its work complete); its errors are recorded on be->ctx. Calls from
 *     several threads are serialized, but be->ctx is one context: threads
 *     that may fail at the same time each use a queue of their own.
 *   - a queue made by queue_new: the instance's own object (on a GPU a CUDA
 *     stream with its own cuBLAS handle), issuing synchronously or
 *     asynchronously as asked, whose errors are recorded on the context given
 *     to queue_new, never on be->ctx. One thread issues on it at a time.
 * Queues are what make one instance shareable in a process: two executors
 * (two models) on one backend each make their own queues, so neither issues
 * into the other's stream, and each worker's failures land in its own
 * context. Nothing about queues is bound to a thread.
 *
 * Errors: a slot that takes q records its failure on q's context (be->ctx for
 * NULL); every other slot on be->ctx. Every slot returns TIDE_OK or a status
 * with that message. Optional slots may be NULL; the caller then uses the
 * fallback named beside the slot.
 */
#ifndef TIDE_BACKEND_H
#define TIDE_BACKEND_H

#include "graph/graph.h"

typedef struct tide_backend_vt {
    const char *name;
    /* True when device memory is ordinary host memory (the CPU backend): host
     * data such as memory-mapped weights can then be used in place. */
    bool device_is_host;
    /* Frees the instance and every queue it still has. */
    void (*destroy)(tide_backend *be);
    /* Device memory. alloc returns TIDE_E_NOMEM when it cannot. dealloc waits
     * for queued work first (as cudaFree does). */
    tide_status (*alloc)(tide_backend *be, size_t n, void **ptr);
    void (*dealloc)(tide_backend *be, void *ptr);
    /* Optional, both or none: queues (see above). queue_new makes a queue of
     * this instance into *q: async false, every call on it completes before
     * it returns; async true (only where the event slots below exist,
     * TIDE_E_UNSUPPORTED otherwise), a call returns once its work is queued:
     * the queue runs it after everything queued on it before, its completion
     * is seen through an event, queue_sync or synchronize, and an error found
     * while it runs is returned by those. Every error of a call on *q,
     * queue_new's own included, is recorded on ctx, which must outlive the
     * queue (and is the first member of what *q points at: see
     * tide_backend_queue_ctx). Returns TIDE_OK, TIDE_E_UNSUPPORTED (async without events, or
     * the instance's limit on queues reached: the message says which),
     * TIDE_E_NOMEM or TIDE_E_BACKEND. queue_free waits for the queue's work,
     * drops any error it still holds and releases it (the instance may keep
     * its resources for a later queue_new); NULL is a no-op. Queues left are
     * freed with the instance. NULL slots: only the default queue exists,
     * and every call is synchronous. */
    tide_status (*queue_new)(tide_backend *be, tide_ctx *ctx, bool async, void **q);
    void (*queue_free)(tide_backend *be, void *q);
    /* Optional: waits until all work issued on q so far is complete and
     * returns the first error q's asynchronous calls met since they were
     * last reported, recorded on q's context (and clears it). NULL: use
     * synchronize (NULL too: nothing is ever pending). */
    tide_status (*queue_sync)(tide_backend *be, void *q);
    /* Copies between host and device memory, on q. On the CPU backend both
     * are memcpy. */
    tide_status (*to_device)(tide_backend *be, void *q, void *dst, const void *src, size_t n);
    tide_status (*to_host)(tide_backend *be, void *q, void *dst, const void *src, size_t n);
    /* Computes one op of g on q. in[i] / out[i] point at the device data of
     * op->in[i] / op->out[i]; scratch is op->scratch_bytes of device memory
     * (NULL when that is 0). Returns TIDE_E_RANGE for data out of its range
     * (a token id >= vocab); on an asynchronous queue that error may come
     * from queue_sync or synchronize instead. */
    tide_status (*compute)(tide_backend *be, void *q, const tide_graph *g, const tide_op *op,
                           void *const *in, void *const *out, void *scratch);
    /* Waits until all work issued so far, on every queue of the instance, is
     * complete, and returns the first error an asynchronous call met on any
     * of them, recorded on be->ctx (NULL: nothing to wait). */
    tide_status (*synchronize)(tide_backend *be);
    /* Optional, all six or none: events mark a point in a queue, as CUDA
     * events do, and order queues of the instance. event_record marks the
     * end of what q holds now (the event is complete when that work is);
     * event_wait makes q hold later work until the event's latest record is
     * complete, without blocking the thread; event_sync blocks the calling
     * thread until then (q only names the context its error goes to; may be
     * NULL); event_elapsed gives the seconds between two complete records of
     * events made with timing. An event never recorded counts as complete.
     * event_new, event_free and event_elapsed record errors on be->ctx. */
    tide_status (*event_new)(tide_backend *be, bool timing, void **ev);
    void (*event_free)(tide_backend *be, void *ev);
    tide_status (*event_record)(tide_backend *be, void *q, void *ev);
    tide_status (*event_wait)(tide_backend *be, void *q, void *ev);
    tide_status (*event_sync)(tide_backend *be, void *q, void *ev);
    tide_status (*event_elapsed)(tide_backend *be, void *from, void *to, double *seconds);
    /* Optional: page-locked host memory for the host pool and bounce buffers
     * (CUDA: anonymous pages registered with cudaHostRegister, which O_DIRECT
     * can read into). NULL, or TIDE_E_UNSUPPORTED: the caller pins with mlock
     * or uses pageable memory. */
    tide_status (*host_alloc)(tide_backend *be, size_t n, void **ptr);
    void (*host_free)(tide_backend *be, void *ptr);
    /* Optional: free and total bytes of device memory now (cudaMemGetInfo).
     * NULL: device memory is host memory, sized by the hardware profile. */
    tide_status (*mem_info)(tide_backend *be, uint64_t *free_bytes, uint64_t *total_bytes);
    /* Optional: reads n bytes at offset off of file fd straight into device
     * memory dst (GPUDirect Storage), synchronously; errors on q's context.
     * TIDE_E_UNSUPPORTED when not usable here: the caller reads through host
     * memory instead. */
    tide_status (*file_read)(tide_backend *be, void *q, int fd, uint64_t off, void *dst, size_t n);
    /* Optional: a description of the kernels the instance runs now (its
     * matmul mode's, the instruction sets they use), valid until the
     * calling thread's next call. NULL: the backend's name stands for it. */
    const char *(*kernels)(tide_backend *be);
} tide_backend_vt;

struct tide_backend {
    const tide_backend_vt *vt;
    tide_ctx *ctx;
    tide_backend_kind kind;
    tide_matmul_mode matmul; /* in effect (never AUTO): read by compute */
    void *impl;
};

/* Whether be has the asynchronous mode: queues and all six event slots. */
static inline bool tide_backend_has_events(const tide_backend *be) {
    const tide_backend_vt *vt = be->vt;
    return vt->queue_new && vt->queue_free && vt->event_new && vt->event_free && vt->event_record &&
           vt->event_wait && vt->event_sync && vt->event_elapsed;
}

/* The context errors of calls on q are recorded on (be->ctx for NULL). Every
 * queue queue_new makes points at a struct whose first member is the
 * tide_ctx * it was given, so that code wrapping a backend's slots (a test's
 * injected failures) can record its errors where the queue's go. */
static inline tide_ctx *tide_backend_queue_ctx(const tide_backend *be, void *q) {
    return q ? *(tide_ctx *const *)q : be->ctx;
}

/* Waits for q's work (queue_sync, else synchronize) and returns its first
 * error: on q's context with queue_sync, on be->ctx with synchronize. */
static inline tide_status tide_backend_queue_sync(tide_backend *be, void *q) {
    if (be->vt->queue_sync) return be->vt->queue_sync(be, q);
    return be->vt->synchronize ? be->vt->synchronize(be) : TIDE_OK;
}

/* Constructors of the built-in backends. tide_cuda_backend_new exists only in
 * builds with TIDE_HAVE_CUDA; it returns TIDE_E_NO_DEVICE when no GPU is
 * usable (driver or device absent: CUDA errors 35 and 100). */
tide_status tide_cpu_backend_new(tide_ctx *ctx, tide_backend **out);
tide_status tide_cuda_backend_new(tide_ctx *ctx, tide_backend **out);

/* Makes the ranks' communicator c run its collectives on be's device memory
 * (net/comm.h, tide_comm_dev): nothing to do where that memory is host
 * memory (MPI carries it); NCCL on CUDA where this build has it
 * (TIDE_HAVE_NCCL: src/net/comm_nccl.c), else TIDE_E_UNSUPPORTED saying so;
 * nothing either where c has device collectives already (tide_comm_set_dev).
 * Compiled with each library (the emulated GPU's has no NCCL). */
tide_status tide_backend_comm_attach(tide_backend *be, tide_comm *c, tide_ctx *ctx);

#endif
