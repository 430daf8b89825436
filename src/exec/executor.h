/*
 * executor.h - runs a verified plan on a backend (docs/design.md sections 2-3, 8).
 *
 * The executor decides nothing: it allocates the device arena of exactly the
 * plan's budget once, a host spill pool and an SSD spill store of the sizes the
 * plan states, and then runs each instruction on its stream's worker thread,
 * waiting on the instructions the plan says it waits on. Nothing is allocated
 * while the plan runs.
 *
 * Issue. On a backend without events (the CPU) every call completes before it
 * returns, so an instruction is complete when its worker marks it done. On a
 * backend with events (CUDA) the compute, h2d and d2h workers issue without
 * waiting: each plan edge between streams is an event recorded after the
 * producer and waited on by the consumer's queue, so the host never waits on
 * the hot path; the io and host workers, whose work is done by the host (SSD
 * reads and writes, host copies; computes placed on the host CPU), wait for
 * their producers' events on the host. The
 * compute worker keeps at most two layers issued ahead of the GPU, so progress
 * reports stay true.
 *
 * Sharing a backend. Each worker issues on a queue of its own, made from the
 * backend (queue_new, backend.h) by tide_exec_new, and records its errors in
 * a context of its own; the first failure is reported once, on the
 * executor's context, by tide_exec_run. So several executors (several models)
 * may share one backend instance and run at the same time from different
 * threads, each with its own tide_ctx; one executor runs on one thread at a
 * time.
 *
 * Homes: before running, every WEIGHT, STATE, INPUT and OUTPUT tensor of the
 * graph is bound to its home copy: host memory (a pointer the caller owns) or a
 * file extent (weights homed on SSD are read straight from the checkpoint;
 * STATE homed on SSD is read from and written back to a file the caller
 * made). A home on SSD is reached through the SSD store on the io stream:
 * reads count in bytes_ssd_read, writes in bytes_ssd_write.
 */
#ifndef TIDE_EXECUTOR_H
#define TIDE_EXECUTOR_H

#include "backend/backend.h"
#include "ir/plan.h"

typedef struct tide_exec tide_exec;

typedef struct tide_exec_opts {
    const char *ssd_dirs;     /* comma-separated spill directories (NULL: $TMPDIR or /tmp) */
    bool force_pread;         /* SSD store without io_uring */
    bool no_pin;              /* do not try to pin the host pool */
    bool direct_storage;      /* read SSD-homed weights straight into device memory
                                 (be->vt->file_read: GPUDirect Storage) where the
                                 backend can; else through the bounce buffer */
    bool buffered_files;      /* open file homes without O_DIRECT, as where the
                                 filesystem refuses it (tests of that path) */
    void *arena;              /* device memory of at least the plan's budget to use
                                 instead of allocating one (shared by several
                                 executors that never run at once); not freed */
    uint64_t arena_bytes;
    bool timed;               /* runs will be given a timeline: on a backend with
                                 events, its timing events are made here */
    bool sync_issue;          /* issue each instruction only after the previous one
                                 completed, even where the backend has events (the
                                 slower mode, for comparison and diagnosis) */
    tide_comm *comm;          /* a data-parallel rank's plan (p->ranks > 1): the
                                 ranks' communicator its collectives run on
                                 (net/comm.h), of exactly p->ranks ranks; the
                                 backend's device memory must be host memory */
} tide_exec_opts;

typedef struct tide_exec_stats {
    double wall_s;
    uint64_t bytes_h2d, bytes_d2h, bytes_ssd_read, bytes_ssd_write;
    double ssd_read_s;        /* time the io stream spent reading from SSD */
    bool host_pinned;
    const char *ssd_backend;  /* "io_uring", "pread" or "none" */
    bool async;               /* the device streams were issued ahead with events */
} tide_exec_stats;

/* Prepares to run p (already verified) on be: allocates the arena (exactly
 * p->device_budget bytes), the host spill pool, the SSD store when the plan
 * spills to SSD or moves a home on SSD (its spill files in opts->ssd_dirs),
 * the bounce buffers, and a queue of be for each stream with instructions.
 * Returns TIDE_OK, TIDE_E_NOMEM (arena or pool refused), TIDE_E_IO (spill
 * directory unusable or full), or what queue_new returns
 * (TIDE_E_UNSUPPORTED: the backend has no queues left), with the message on
 * ctx. */
tide_status tide_exec_new(tide_ctx *ctx, tide_backend *be, const tide_plan *p,
                          const tide_exec_opts *opts, tide_exec **out);
void tide_exec_free(tide_exec *ex);

/* Binds tensor t's home to host memory (read-write for STATE and OUTPUT). */
tide_status tide_exec_bind_host(tide_exec *ex, int t, void *data);
/* Binds tensor t's home to bytes [off, off + nbytes) of the file at path:
 *   - a WEIGHT homed on SSD: opened read-only, never written;
 *   - a STATE homed on SSD: opened read-write (neither created nor
 *     truncated). The caller makes the file, writes the initial contents of
 *     the extent before the first run and may read the latest ones after any
 *     run that returned TIDE_OK (between runs, never during one); the run
 *     reads the extent where the plan LOADs or MOVEs the state from home and
 *     writes it where the plan STOREs or MOVEs it home. The extent must lie
 *     inside the file when it is bound. A write that fails fails the run
 *     (TIDE_E_IO, the message naming the instruction, the tensor, the file
 *     and the system's reason); the extents that run wrote then hold
 *     unspecified bytes. Writes are not synced: the caller syncs what must
 *     be durable.
 * Files are opened with O_DIRECT | O_CLOEXEC where the filesystem allows it,
 * else buffered. One descriptor serves every tensor homed in one file (a
 * read-only one only weights), so the path may be unlinked once every tensor
 * of that file is bound; it is closed by tide_exec_free. On a direct
 * descriptor a write of an extent that does not start or end on a 4 KiB
 * boundary reads and rewrites the 4 KiB pages at its edges: bytes beside the
 * extent in those pages are kept, as long as the plan's other transfers of
 * that file are ordered with it (they are: every SSD transfer runs on the io
 * stream), but the caller must not write those pages during a run, and a
 * file that ends inside the last page of an extent grows to that page's end.
 * Extents at 4 KiB-aligned offsets, in a file covering each one rounded up
 * to 4 KiB, avoid both. Returns TIDE_OK; TIDE_E_INVALID (no such tensor, or
 * a STATE extent past the end of the file); TIDE_E_UNSUPPORTED (another
 * role); TIDE_E_IO (the file cannot be opened; the message names it and
 * why). */
tide_status tide_exec_bind_file(tide_exec *ex, int t, const char *path, uint64_t off);

/* Runs the whole plan once. On failure every worker stops, the status and the
 * message of the first failure are returned, and the outputs must not be used;
 * nothing the run queued is still running when it returns. timeline (may be
 * NULL) receives one event per instruction (start and end in seconds from the
 * start of the run); it must hold p->n_ins events, and on a backend with
 * events the executor must have been made with opts.timed. */
tide_status tide_exec_run(tide_exec *ex, tide_sim_event *timeline, tide_exec_stats *stats);

/* Notice printed once by the caller when pinning was refused ("" when pinned). */
const char *tide_exec_notice(const tide_exec *ex);

#endif
