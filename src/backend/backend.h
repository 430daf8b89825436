/*
 * backend.h - the backend vtable. A backend computes ops on data it holds in
 * its own memory ("device" memory: host RAM for the CPU backend) and moves
 * bytes between that memory and host memory. Which backend runs is chosen at
 * run time; one binary serves with or without a GPU.
 *
 * Every slot returns TIDE_OK or a status with a message on be->ctx. Optional
 * slots may be NULL; the caller then uses the fallback named beside the slot.
 */
#ifndef TIDE_BACKEND_H
#define TIDE_BACKEND_H

#include "graph/graph.h"

typedef struct tide_backend_vt {
    const char *name;
    /* True when device memory is ordinary host memory (the CPU backend): host
     * data such as memory-mapped weights can then be used in place. */
    bool device_is_host;
    void (*destroy)(tide_backend *be);
    /* Device memory. alloc returns TIDE_E_NOMEM when it cannot. */
    tide_status (*alloc)(tide_backend *be, size_t n, void **ptr);
    void (*dealloc)(tide_backend *be, void *ptr);
    /* Copies between host and device memory (synchronous). On the CPU backend
     * both are memcpy. */
    tide_status (*to_device)(tide_backend *be, void *dst, const void *src, size_t n);
    tide_status (*to_host)(tide_backend *be, void *dst, const void *src, size_t n);
    /* Computes one op of g. in[i] / out[i] point at the device data of
     * op->in[i] / op->out[i]; scratch is op->scratch_bytes of device memory
     * (NULL when that is 0). Returns TIDE_E_RANGE for data out of its range
     * (a token id >= vocab). */
    tide_status (*compute)(tide_backend *be, const tide_graph *g, const tide_op *op,
                           void *const *in, void *const *out, void *scratch);
    /* Waits until all work issued so far, by every thread, is complete, and
     * returns the first error an asynchronous call met (NULL: nothing to
     * wait). */
    tide_status (*synchronize)(tide_backend *be);
    /* Optional: the calling thread will issue the work of plan stream `stream`
     * (0 compute, 1 h2d, 2 d2h, 3 io) from now on; the backend binds it to
     * its own queue for that stream (a CUDA stream). With async false, every
     * call made by that thread afterwards (compute, to_device, to_host)
     * completes before it returns. With async true (only where the event
     * slots below exist; TIDE_E_UNSUPPORTED otherwise) a call returns once
     * its work is queued: the queue runs it after everything queued before
     * it, and its completion is seen through an event or synchronize; an
     * error found while it runs is returned by synchronize. A thread that
     * never called it issues on queue 0, synchronously. NULL: nothing to
     * do, every call is synchronous. */
    tide_status (*stream_begin)(tide_backend *be, int stream, bool async);
    /* Optional, all six or none: events mark a point in a queue, as CUDA
     * events do. event_record marks the end of what the calling thread's
     * queue holds now (the event is complete when that work is);
     * event_wait makes the calling thread's queue hold later work until the
     * event's latest record is complete, without blocking the thread;
     * event_sync blocks the thread until then; event_elapsed gives the
     * seconds between two complete records of events made with timing. An
     * event never recorded counts as complete. */
    tide_status (*event_new)(tide_backend *be, bool timing, void **ev);
    void (*event_free)(tide_backend *be, void *ev);
    tide_status (*event_record)(tide_backend *be, void *ev);
    tide_status (*event_wait)(tide_backend *be, void *ev);
    tide_status (*event_sync)(tide_backend *be, void *ev);
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
     * memory dst (GPUDirect Storage). TIDE_E_UNSUPPORTED when not usable here:
     * the caller reads through host memory instead. */
    tide_status (*file_read)(tide_backend *be, int fd, uint64_t off, void *dst, size_t n);
} tide_backend_vt;

struct tide_backend {
    const tide_backend_vt *vt;
    tide_ctx *ctx;
    tide_backend_kind kind;
    tide_matmul_mode matmul; /* in effect (never AUTO): read by compute */
    void *impl;
};

/* Whether be has the asynchronous mode: stream_begin and all six event slots. */
static inline bool tide_backend_has_events(const tide_backend *be) {
    const tide_backend_vt *vt = be->vt;
    return vt->stream_begin && vt->event_new && vt->event_free && vt->event_record && vt->event_wait &&
           vt->event_sync && vt->event_elapsed;
}

/* Constructors of the built-in backends. tide_cuda_backend_new exists only in
 * builds with TIDE_HAVE_CUDA; it returns TIDE_E_NO_DEVICE when no GPU is
 * usable (driver or device absent: CUDA errors 35 and 100). */
tide_status tide_cpu_backend_new(tide_ctx *ctx, tide_backend **out);
tide_status tide_cuda_backend_new(tide_ctx *ctx, tide_backend **out);

#endif
