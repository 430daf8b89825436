/*
 * ssd.h - the SSD tier store: spill space on NVMe files, direct reads of
 * checkpoint files and reads and writes of the files persistent state lives
 * in, with many requests in flight.
 *
 * A store owns one spill file per directory it is given. The files are created
 * with O_TMPFILE (never named, so a crash leaves nothing behind; where the
 * filesystem lacks O_TMPFILE a named file is unlinked right after creation),
 * opened with O_DIRECT and preallocated with fallocate. Together they form one
 * logical address space of `capacity` bytes, striped round-robin over the files
 * in units of stripe_bytes:
 *
 *     logical unit k = off / stripe  ->  file k % n_files,
 *                                        file offset (k / n_files) * stripe + off % stripe
 *
 * so a large transfer keeps every device busy. Each read or write is split at
 * stripe boundaries into requests of at most stripe_bytes, and up to
 * queue_depth of them are kept in flight by an I/O engine chosen at open:
 *   - "io_uring": one ring per store; buffers inside a region given to
 *     tide_ssd_register() use READ_FIXED/WRITE_FIXED (no per-request page
 *     pinning), other buffers plain READ/WRITE;
 *   - "pread": a small pool of threads doing pread/pwrite, used when the kernel
 *     or a seccomp filter refuses io_uring, or when asked to (force_fallback,
 *     or the environment variable TIDE_SSD_PREAD set to anything but "0").
 * Short transfers are resubmitted for the remainder, EAGAIN/EINTR retried; every
 * call drains all of its requests before it returns, even on failure, so the
 * caller's buffer is never touched after a call returns.
 *
 * Alignment: offsets, lengths and buffer addresses are multiples of
 * TIDE_SSD_ALIGN (4096), as O_DIRECT needs; anything else is TIDE_E_INVALID.
 *
 * Errors are recorded on the context given to tide_ssd_open() (tide_ctx_last_error)
 * and name the directory or file and the system's reason. The store prints
 * nothing: when it fell back to threads (tide_ssd_backend_name() == "pread") or
 * to buffered files (tide_ssd_direct() == false), the caller may say so.
 *
 * Threads: a store is used by one thread at a time. Its calls (read, write,
 * read_file, write_file, register, unregister, close) may come from a thread other than the
 * opener's, provided the caller orders them (thread creation, a mutex or a queue
 * between the threads). Distinct stores share nothing. The context given at
 * open receives error messages from whichever thread is calling, so the caller
 * must not use that context concurrently from another thread during a call.
 */
#ifndef TIDE_STORE_SSD_H
#define TIDE_STORE_SSD_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TIDE_SSD_ALIGN 4096u

typedef struct tide_ssd tide_ssd;

typedef struct tide_ssd_opts {
    bool force_fallback;    /* use the pread thread pool even if io_uring works */
    int queue_depth;        /* requests in flight per call; 0: 32 (max 4096) */
    uint64_t stripe_bytes;  /* stripe unit and largest request; 0: 1 MiB;
                               a multiple of 4096, at most 256 MiB */
    int fallback_threads;   /* threads of the pread pool; 0: 4 (max 64) */

    /* fault injection: only in test builds, store/ssd_test.h */
} tide_ssd_opts;

/* Opens a store of `capacity` bytes (rounded up to a multiple of 4096) striped
 * over one new spill file in each of dirs[0..n_dirs-1] (a directory may appear
 * twice). opts may be NULL (defaults). n_dirs may be 0 only when capacity is 0:
 * such a store serves tide_ssd_read_file() alone.
 * Each spill file's space is reserved up front (fallocate; a sparse file where
 * the filesystem has no fallocate), after checking the filesystem's free space.
 * Returns TIDE_OK with *out set;
 *   TIDE_E_INVALID for a bad argument (named in the message);
 *   TIDE_E_IO when a directory is missing or not writable ("cannot create a
 *     spill file in DIR: reason") or has too little space ("no space for N bytes
 *     of spill in DIR: ..."); nothing is left in any directory;
 *   TIDE_E_NOMEM.
 * io_uring being refused is not an error: the store falls back to threads
 * (tide_ssd_fallback_reason() says why). */
tide_status tide_ssd_open(tide_ctx *ctx, const char *const *dirs, int n_dirs,
                          uint64_t capacity, const tide_ssd_opts *opts, tide_ssd **out);

/* Closes the spill files (which have no name, so they vanish), stops the
 * engine and frees the store. NULL is a no-op. */
void tide_ssd_close(tide_ssd *s);

/* Writes n bytes from buf at logical offset off; reads n bytes at off into buf.
 * off, n and buf must be multiples of 4096 and off + n <= capacity; n == 0 is a
 * no-op. Returns TIDE_OK;
 *   TIDE_E_INVALID for a misaligned value or a range past the capacity (the
 *     message names the value);
 *   TIDE_E_IO when a request fails ("read of spill file in DIR at offset X
 *     failed: reason"); the other requests of the call have finished, the bytes
 *     of the range are then unspecified (for a read, in buf; for a write, on
 *     the store). */
tide_status tide_ssd_write(tide_ssd *s, uint64_t off, const void *buf, size_t n);
tide_status tide_ssd_read(tide_ssd *s, uint64_t off, void *buf, size_t n);

/* Reads n bytes at file_off of an open file (a checkpoint shard opened with
 * tide_ssd_open_direct, or a state home) into buf, through the same engine, in requests of at
 * most stripe_bytes. Alignment rules as tide_ssd_read. Bytes past the end of
 * the file read as zeros, so a caller may round a tensor's tail up to 4096
 * (the checkpoint's size is validated when it is opened). Returns TIDE_OK,
 * TIDE_E_INVALID (misaligned, negative fd) or TIDE_E_IO naming the file. */
tide_status tide_ssd_read_file(tide_ssd *s, int fd, uint64_t file_off, void *buf, size_t n);

/* Writes n bytes of buf at file_off of an open file (a persistent tensor's
 * home, opened with tide_ssd_open_direct_rw or buffered), the counterpart of
 * tide_ssd_read_file. A descriptor opened with O_DIRECT goes through the
 * same engine in the same requests of at most stripe_bytes, with the
 * alignment rules of tide_ssd_write; a buffered one (no O_DIRECT in its
 * flags) takes any offset, length and buffer and is written with pwrite,
 * in windows of stripe_bytes that count as write requests for fault injection (fail_write_nth, store/ssd_test.h)
 * (short_nth and eagain_nth do not apply there). A write past the end of
 * the file extends it. Nothing is synced: the bytes are in the file for
 * every later read of it, not yet durable. Returns TIDE_OK, TIDE_E_INVALID
 * (misaligned on a direct descriptor, negative fd) or TIDE_E_IO naming the
 * file and the system's reason; after a failure the bytes of the range are
 * unspecified. */
tide_status tide_ssd_write_file(tide_ssd *s, int fd, uint64_t file_off, const void *buf, size_t n);

/* Opens path read-only with O_DIRECT | O_CLOEXEC into *fd (the caller closes
 * it; *fd is -1 on failure). Returns TIDE_OK; TIDE_E_UNSUPPORTED when the
 * filesystem refuses O_DIRECT (the caller may then read it buffered);
 * TIDE_E_NOT_FOUND when it does not exist; TIDE_E_IO otherwise (errno tells
 * why). It takes no context and records no message: the caller, who knows
 * what the file is for, words it. */
tide_status tide_ssd_open_direct(const char *path, int *fd);
/* The same, read-write (O_RDWR | O_DIRECT | O_CLOEXEC; the file is neither
 * created nor truncated): a home the run writes back. */
tide_status tide_ssd_open_direct_rw(const char *path, int *fd);

/* Registers [base, base+len) (4096-aligned, e.g. the host pool or the bounce
 * buffers) so requests whose buffer lies inside it use io_uring's fixed buffers.
 * Up to TIDE_SSD_MAX_REGIONS regions, not overlapping. The memory must stay
 * mapped until it is unregistered or the store closed. Returns TIDE_OK (also on
 * the pread engine, where it changes nothing); TIDE_E_INVALID (misaligned, an
 * overlap, too many regions); TIDE_E_UNSUPPORTED when the kernel refuses to pin
 * the memory (RLIMIT_MEMLOCK): the store then goes on without fixed buffers for
 * that region, so the caller may ignore it; TIDE_E_NOMEM. */
#define TIDE_SSD_MAX_REGIONS 16
tide_status tide_ssd_register(tide_ssd *s, void *base, size_t len);
/* Forgets the region that starts at base. Returns TIDE_OK, or TIDE_E_INVALID
 * when no region starts there. */
tide_status tide_ssd_unregister(tide_ssd *s, void *base);

/* "io_uring" or "pread". */
const char *tide_ssd_backend_name(const tide_ssd *s);
/* Why io_uring was not used ("io_uring_queue_init: Operation not permitted",
 * "forced"), or "" when it is. */
const char *tide_ssd_fallback_reason(const tide_ssd *s);
/* true when every spill file is opened with O_DIRECT; false when a filesystem
 * refused it and the store reads and writes through the page cache. */
bool tide_ssd_direct(const tide_ssd *s);
/* Logical capacity in bytes (rounded up to 4096). */
uint64_t tide_ssd_capacity(const tide_ssd *s);

typedef struct tide_ssd_stats {
    uint64_t bytes_read;     /* spill and file reads */
    uint64_t bytes_written;
    uint64_t requests;       /* requests issued, retries excluded */
    uint64_t resubmits;      /* short transfers and EAGAIN retried */
    uint64_t fixed_requests; /* requests that used a registered buffer */
} tide_ssd_stats;
void tide_ssd_get_stats(const tide_ssd *s, tide_ssd_stats *st);

/* Raw bandwidth of a directory, the baseline a store's bandwidth is compared
 * with: a temporary file (O_TMPFILE, or unlinked at once) of `bytes` (rounded up
 * to 4 MiB) is written with O_DIRECT and then read back with plain sequential
 * O_DIRECT pread/pwrite of 4 MiB, one request at a time. The read helper writes
 * the file first (untimed) and times the read; the write helper times writing
 * it, fdatasync included. Returns TIDE_OK with *bytes_per_s set; TIDE_E_IO
 * (the message names dir); TIDE_E_UNSUPPORTED when dir refuses O_DIRECT;
 * TIDE_E_INVALID (bytes == 0); TIDE_E_NOMEM. */
tide_status tide_ssd_raw_read_bw(tide_ctx *ctx, const char *dir, uint64_t bytes,
                                 double *bytes_per_s);
tide_status tide_ssd_raw_write_bw(tide_ctx *ctx, const char *dir, uint64_t bytes,
                                  double *bytes_per_s);

#endif
