/*
 * ssd_engine.h - inside the SSD store (ssd.c): the store's state, one I/O
 * request, and the engine vtable that io_uring (ssd_uring.c) and the pread
 * thread pool (ssd_pool.c) implement. Nothing outside src/store/ includes it.
 *
 * Division of work: ssd.c splits a call into requests, keeps at most
 * queue_depth of them in flight, and interprets completions (short transfer,
 * EAGAIN, error, end of file). An engine only starts requests and reports each
 * one's raw result (bytes moved or -errno), so the retry logic exists once.
 *
 * Request life: free slot -> prep (queued in the engine) -> run() returns it
 * done with r->res set -> back to free, or prep again for the remainder.
 */
#ifndef TIDE_STORE_SSD_ENGINE_H
#define TIDE_STORE_SSD_ENGINE_H

#include "store/ssd.h"
#include "store/ssd_test.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* io_uring refuses registered iovecs longer than 1 GiB: regions are split. */
#define SSD_IOV_MAX_LEN ((size_t)1 << 30)

struct ssd_req {
    int fd;
    int file;             /* index of the spill file, -1 for a caller's fd */
    bool write;
    bool fixed;           /* buf lies in registered iovec buf_index */
    bool eof_zero;        /* a read past end of file reads zeros (read_file) */
#ifdef TIDE_TEST_HOOKS
    bool inject_eio;      /* fault injection: report EIO when done */
    bool inject_eagain;   /* fault injection: report EAGAIN once when done */
#endif
    int buf_index;
    uint64_t off;         /* file offset of the remaining part */
    unsigned char *buf;   /* remaining part */
    size_t len;           /* remaining bytes */
    size_t issue;         /* bytes asked of the engine this time (<= len) */
    int res;              /* set by the engine: bytes moved or -errno */
};

struct ssd_engine_ops {
    const char *name;
    /* Queues r; it starts no later than the next run(). Returns 0 or -errno. */
    int (*prep)(tide_ssd *s, struct ssd_req *r);
    /* Starts what is queued and waits until at least one request is done;
     * stores up to max of them in done[]. Returns their count (> 0) or -errno
     * when the engine itself failed. */
    int (*run)(tide_ssd *s, struct ssd_req **done, int max);
    /* Replaces the table of fixed buffers (n == 0: none). Returns 0 or -errno.
     * NULL when the engine has no fixed buffers. */
    int (*set_buffers)(tide_ssd *s, const struct iovec *iov, int n);
    /* Releases the engine; no request is in flight. */
    void (*close)(tide_ssd *s);
};

struct ssd_file {
    int fd;
    char *dir;
    uint64_t size;
    bool direct;
};

struct ssd_region {
    unsigned char *base;
    size_t len;
    int first_iov;
};

struct tide_ssd {
    tide_ctx *ctx;
    uint64_t capacity;
    uint64_t stripe;
    int qd;
    int n_files;
    struct ssd_file *files;
    bool direct;

    const struct ssd_engine_ops *ops;
    void *eng;
    char fallback_reason[128];
    bool broken;          /* the engine failed with requests in flight */

    struct ssd_region regions[TIDE_SSD_MAX_REGIONS];
    int n_regions;

    struct ssd_req *slots; /* qd requests */
    struct ssd_req **free_slots;
    int n_free;
    struct ssd_req **done; /* qd, filled by run() */

#ifdef TIDE_TEST_HOOKS
    tide_ssd_faults faults; /* store/ssd_test.h */
    long n_reads, n_writes, n_requests; /* for fault injection */
#endif
    tide_ssd_stats stats;
};

/* Each returns 0, or -errno with a reason in why: the kernel refused (the
 * store then uses the pool, or fails to open if the pool was refused too).
 * tide_ssd_uring_init returns 1 when the library's own allocation failed, so
 * that running out of memory is reported, not taken for a refusal. */
int tide_ssd_uring_init(tide_ssd *s, char *why, size_t why_len);
int tide_ssd_pool_init(tide_ssd *s, int n_threads, char *why, size_t why_len);

#endif
