/*
 * exec_transfer.c - the executor's transfers (exec_int.h): LOAD, STORE and
 * MOVE instructions. Host <-> device copies go straight through the
 * backend; SSD transfers (spills, and homes on SSD: weights read, state read
 * and written back to its file) go through 4 KiB-aligned bounce buffers: an
 * extent that does not start or end on a 4 KiB boundary is
 * read-modify-written at its edges, so tier offsets need no alignment (a
 * home file opened without O_DIRECT is written as it is). All SSD
 * instructions run on the io stream, one at a time, which makes the edge
 * read-modify-write safe.
 * A read into device memory (a GPU's) longer than half the bounce buffer is
 * double buffered: a reader thread fills one half while the io stream copies
 * the other to the device.
 */
#include "exec/exec_int.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A failed SSD store call (its message is on ex->ssd_ctx), recorded on w's
 * context; the store is idle, so its context is not being written. */
static tide_status ssd_fail(worker *w, tide_status st) {
    return tide_err(w->ctx, st, "%s", tide_ctx_last_error(w->ex->ssd_ctx));
}

static tide_status fail_io(worker *w, int i, const char *what) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    return tide_err(w->ctx, tide_ctx_last_status(w->ctx) ? tide_ctx_last_status(w->ctx) : TIDE_E_IO,
                    "instruction %d (%s '%s', iteration %d): %s: %s", i, tide_ins_name(in->kind),
                    tname(ex, in->tensor), in->iter, what, tide_ctx_last_error(w->ctx));
}

/* One bounce-buffer read: the 4 KiB-aligned span holding the start of
 * [off, off+n), at most cap bytes, into buf; *skip is where off lies in buf and
 * *take how many of its bytes belong to the extent. Errors on ex->ssd_ctx. */
static tide_status read_chunk(tide_exec *ex, int fd, bool direct, uint64_t off, uint64_t n, unsigned char *buf,
                              uint64_t cap, uint64_t *skip, uint64_t *take) {
    uint64_t a0 = off & ~(uint64_t)(ALIGN - 1);
    *skip = off - a0;
    uint64_t span = TIDE_MIN(cap, (*skip + n + ALIGN - 1) & ~(uint64_t)(ALIGN - 1));
    *take = TIDE_MIN(n, span - *skip);
    if (fd < 0) return tide_ssd_read(ex->ssd, a0, buf, span);
    if (direct) return tide_ssd_read_file(ex->ssd, fd, a0, buf, span);
    ssize_t r = pread(fd, buf + *skip, *take, (off_t)off);
    return r == (ssize_t)*take ? TIDE_OK
                               : tide_err(ex->ssd_ctx, TIDE_E_IO, "read of %llu bytes at %llu: %s",
                                          (unsigned long long)*take, (unsigned long long)off,
                                          r < 0 ? strerror(errno) : "short read");
}

/* A read from SSD to device memory through the two halves of the bounce
 * buffer: a reader thread fills one half while this thread copies the other
 * to the device, so the drive and the host link work at the same time. The
 * reader's errors go to ex->ssd_ctx (which nothing else uses meanwhile), the
 * copies' to w's. */
typedef struct dbuf {
    tide_exec *ex;
    int fd;
    bool direct;
    uint64_t off, n;            /* what is left to read */
    unsigned char *half[2];
    uint64_t skip[2], take[2];
    int filled, copied;         /* chunks read, chunks copied */
    bool done, stop;            /* the reader read everything / must stop */
    tide_status st;             /* the reader's failure */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} dbuf;

#define HALF_BYTES ((uint64_t)BOUNCE_BYTES / 2)

static void *dbuf_reader(void *arg) {
    dbuf *d = arg;
    for (int k = 0;; k++) {
        pthread_mutex_lock(&d->mu);
        while (!d->stop && k - d->copied >= 2) pthread_cond_wait(&d->cv, &d->mu); /* both halves busy */
        bool stop = d->stop;
        pthread_mutex_unlock(&d->mu);
        if (stop) return NULL;
        uint64_t skip = 0, take = 0;
        tide_status st = read_chunk(d->ex, d->fd, d->direct, d->off, d->n, d->half[k & 1], HALF_BYTES, &skip, &take);
        pthread_mutex_lock(&d->mu);
        if (st) {
            d->st = st;
        } else {
            d->skip[k & 1] = skip;
            d->take[k & 1] = take;
            d->off += take;
            d->n -= take;
            d->filled = k + 1;
            d->done = d->n == 0;
        }
        bool end = st || d->done;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        if (end) return NULL;
    }
}

static tide_status ssd_read_to_device_pipelined(worker *w, int fd, bool direct, uint64_t off,
                                                unsigned char *dst, uint64_t n) {
    tide_exec *ex = w->ex;
    dbuf d = {.ex = ex, .fd = fd, .direct = direct, .off = off, .n = n,
              .half = {ex->bounce, ex->bounce + HALF_BYTES}};
    pthread_mutex_init(&d.mu, NULL);
    pthread_cond_init(&d.cv, NULL);
    pthread_t th;
    int rc = pthread_create(&th, NULL, dbuf_reader, &d);
    if (rc != 0) {
        pthread_cond_destroy(&d.cv);
        pthread_mutex_destroy(&d.mu);
        return tide_err(w->ctx, TIDE_E_NOMEM, "cannot start the SSD reader thread: %s", strerror(rc));
    }
    tide_status st = TIDE_OK;
    for (int k = 0; !st; k++) {
        pthread_mutex_lock(&d.mu);
        while (d.filled <= k && !d.st) pthread_cond_wait(&d.cv, &d.mu);
        bool have = d.filled > k;
        uint64_t skip = d.skip[k & 1], take = d.take[k & 1];
        bool last = have && d.done && d.filled == k + 1;
        pthread_mutex_unlock(&d.mu);
        if (!have) break;
        st = ex->be->vt->to_device(ex->be, w->q, dst, d.half[k & 1] + skip, take);
        if (st) st = queue_fail(w, st);
        dst += take;
        pthread_mutex_lock(&d.mu);
        d.copied = k + 1;
        if (st) d.stop = true;
        pthread_cond_broadcast(&d.cv);
        pthread_mutex_unlock(&d.mu);
        if (last) break;
    }
    pthread_join(th, NULL);
    if (!st && d.st) st = ssd_fail(w, d.st); /* the reader is done: its message is final */
    pthread_cond_destroy(&d.cv);
    pthread_mutex_destroy(&d.mu);
    return st;
}

/* Reads [off, off+n) of a file or the SSD store into dst (host memory, or
 * device memory when to_device), via the bounce buffer when dst or the extent
 * is not 4 KiB aligned. gds: the file may be read by direct storage (it is
 * opened O_DIRECT or never written: a state home written through the page
 * cache may have newer bytes there than on the drive). Errors on w's
 * context. */
static tide_status ssd_read_into(worker *w, int fd, bool direct, bool gds, uint64_t off, unsigned char *dst,
                                 uint64_t n, bool to_device) {
    tide_exec *ex = w->ex;
    /* Host-addressable destination with aligned extents: the store reads the
     * whole aligned part straight into it, many requests in flight; only a
     * partial last page goes through the bounce buffer. */
    bool host_dst = !to_device || ex->be->vt->device_is_host;
    if (host_dst && direct && !(off & (ALIGN - 1)) && !((uintptr_t)dst & (ALIGN - 1)) && n >= ALIGN) {
        uint64_t bulk = n & ~(uint64_t)(ALIGN - 1);
        tide_status st = fd < 0 ? tide_ssd_read(ex->ssd, off, dst, bulk)
                                : tide_ssd_read_file(ex->ssd, fd, off, dst, bulk);
        if (st) return ssd_fail(w, st);
        off += bulk;
        dst += bulk;
        n -= bulk;
    }
    /* a file straight into device memory (GPUDirect Storage) where it works;
     * the first refusal turns it off for this executor, with a notice */
    if (!host_dst && fd >= 0 && gds && ex->direct_storage && n > 0) {
        tide_status st = ex->be->vt->file_read(ex->be, w->q, fd, off, dst, n);
        if (st != TIDE_E_UNSUPPORTED) return st ? queue_fail(w, st) : TIDE_OK;
        ex->direct_storage = false;
        snprintf(ex->notice, sizeof ex->notice, "direct storage reads are off: %s",
                 tide_ctx_last_error(queue_ctx(w)));
    }
    /* device memory, more than one half of the bounce buffer: pipelined */
    if (!host_dst && n > HALF_BYTES) return ssd_read_to_device_pipelined(w, fd, direct, off, dst, n);
    while (n > 0) {
        uint64_t skip = 0, take = 0;
        tide_status st = read_chunk(ex, fd, direct, off, n, ex->bounce, BOUNCE_BYTES, &skip, &take);
        if (st) return ssd_fail(w, st);
        if (to_device && (st = ex->be->vt->to_device(ex->be, w->q, dst, ex->bounce + skip, take)))
            return queue_fail(w, st);
        if (!to_device) memcpy(dst, ex->bounce + skip, take);
        off += take;
        dst += take;
        n -= take;
    }
    return TIDE_OK;
}

/* 4 KiB-aligned reads and writes of the SSD store (fd < 0) or of a file
 * home opened O_DIRECT. Errors on ex->ssd_ctx. */
static tide_status pages_read(tide_exec *ex, int fd, uint64_t off, void *buf, uint64_t n) {
    return fd < 0 ? tide_ssd_read(ex->ssd, off, buf, n) : tide_ssd_read_file(ex->ssd, fd, off, buf, n);
}

static tide_status pages_write(tide_exec *ex, int fd, uint64_t off, const void *buf, uint64_t n) {
    return fd < 0 ? tide_ssd_write(ex->ssd, off, buf, n) : tide_ssd_write_file(ex->ssd, fd, off, buf, n);
}

/* Writes src (device memory when from_device) to [off, off+n) of the SSD
 * store (fd < 0) or of a file home (fd, O_DIRECT when direct). On the store
 * and a direct file, partial 4 KiB pages at the edges are read first and
 * merged; a buffered file takes the bytes as they are, straight from src
 * where the host can address it. Errors on w's context. */
static tide_status ssd_write_from(worker *w, int fd, bool direct, uint64_t off, const unsigned char *src,
                                  uint64_t n, bool from_device) {
    tide_exec *ex = w->ex;
    tide_status st = TIDE_OK;
    if (fd >= 0 && !direct) {
        if (!from_device || ex->be->vt->device_is_host) {
            st = tide_ssd_write_file(ex->ssd, fd, off, src, n);
            return st ? ssd_fail(w, st) : TIDE_OK;
        }
        while (n > 0) {
            uint64_t take = TIDE_MIN(n, (uint64_t)BOUNCE_BYTES);
            if ((st = ex->be->vt->to_host(ex->be, w->q, ex->bounce, src, take))) return queue_fail(w, st);
            if ((st = tide_ssd_write_file(ex->ssd, fd, off, ex->bounce, take))) return ssd_fail(w, st);
            off += take;
            src += take;
            n -= take;
        }
        return TIDE_OK;
    }
    while (n > 0) {
        uint64_t a0 = off & ~(uint64_t)(ALIGN - 1);
        uint64_t skip = off - a0;
        uint64_t span = TIDE_MIN((uint64_t)BOUNCE_BYTES, (skip + n + ALIGN - 1) & ~(uint64_t)(ALIGN - 1));
        uint64_t take = TIDE_MIN(n, span - skip);
        /* keep the bytes of partly covered edge pages: read them first */
        uint64_t end = skip + take, last = end & ~(uint64_t)(ALIGN - 1);
        if (skip) st = pages_read(ex, fd, a0, ex->bounce, ALIGN);
        if (!st && (end & (ALIGN - 1)) && (last != 0 || !skip))
            st = pages_read(ex, fd, a0 + last, ex->bounce + last, ALIGN);
        if (st) return ssd_fail(w, st);
        if (from_device && (st = ex->be->vt->to_host(ex->be, w->q, ex->bounce + skip, src, take)))
            return queue_fail(w, st);
        if (!from_device) memcpy(ex->bounce + skip, src, take);
        if ((st = pages_write(ex, fd, a0, ex->bounce, span))) return ssd_fail(w, st);
        off += take;
        src += take;
        n -= take;
    }
    return TIDE_OK;
}

/* Writes src (device memory when from_device) to the SSD home of the
 * tensor of instruction i: its file extent (a STATE's), or the host memory
 * that home was bound to. Errors on w's context. */
static tide_status home_write(worker *w, int i, const unsigned char *src, bool from_device) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_tensor *t = &ex->g->tensors[in->tensor];
    const home_ref *h = &ex->home[in->tensor];
    tide_status st = TIDE_OK;
    if (t->role != TIDE_ROLE_STATE)
        return tide_err(w->ctx, TIDE_E_UNSUPPORTED, "instruction %d: '%s' would be written to its SSD home; "
                        "a %s's home is never written", i, t->name, tide_role_name(t->role));
    if (h->fd >= 0) {
        st = ssd_write_from(w, h->fd, h->direct, h->file_off, src, t->nbytes, from_device);
    } else if (!h->host) {
        return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no SSD home bound", i, t->name);
    } else if (from_device) { /* the home mapped in memory */
        if ((st = ex->be->vt->to_host(ex->be, w->q, h->host, src, t->nbytes))) st = queue_fail(w, st);
    } else if (src != h->host) {
        memcpy(h->host, src, t->nbytes);
    }
    ex->bytes[3] += t->nbytes;
    return st ? fail_io(w, i, "write to its SSD home") : TIDE_OK;
}

tide_status exec_load(worker *w, int i) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_tensor *t = &ex->g->tensors[in->tensor];
    unsigned char *dst = ex->arena + in->dev_off[0];
    tide_backend *be = ex->be;
    tide_status st;
    if (in->src == TIDE_TIER_HOST) {
        const void *src = in->tier_off == TIDE_HOME ? ex->home[in->tensor].host : ex->host_pool + in->tier_off;
        if (!src) return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no host home bound", i, t->name);
        if ((st = be->vt->to_device(be, w->q, dst, src, t->nbytes))) st = queue_fail(w, st);
        ex->bytes[0] += t->nbytes;
        return st ? fail_io(w, i, "host to device copy") : TIDE_OK;
    }
    double t0 = tide_now();
    const home_ref *h = &ex->home[in->tensor];
    if (in->tier_off == TIDE_HOME) {
        if (h->fd >= 0)
            st = ssd_read_into(w, h->fd, h->direct, h->direct || !h->writable, h->file_off, dst, t->nbytes, true);
        else if (!h->host)
            return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no SSD home bound", i, t->name);
        else if ((st = be->vt->to_device(be, w->q, dst, h->host, t->nbytes))) /* home mapped in memory */
            st = queue_fail(w, st);
    } else {
        st = ssd_read_into(w, -1, true, false, in->tier_off, dst, t->nbytes, true);
    }
    ex->ssd_read_s += tide_now() - t0;
    ex->bytes[2] += t->nbytes;
    return st ? fail_io(w, i, "SSD read") : TIDE_OK;
}

tide_status exec_store(worker *w, int i) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_tensor *t = &ex->g->tensors[in->tensor];
    const unsigned char *src = ex->arena + in->dev_off[0];
    tide_status st;
    if (in->dst == TIDE_TIER_HOST) {
        void *dst = in->tier_off == TIDE_HOME ? ex->home[in->tensor].host : ex->host_pool + in->tier_off;
        if (!dst) return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no host home bound", i, t->name);
        if ((st = ex->be->vt->to_host(ex->be, w->q, dst, src, t->nbytes))) st = queue_fail(w, st);
        ex->bytes[1] += t->nbytes;
        return st ? fail_io(w, i, "device to host copy") : TIDE_OK;
    }
    if (in->tier_off == TIDE_HOME) return home_write(w, i, src, true);
    st = ssd_write_from(w, -1, true, in->tier_off, src, t->nbytes, true);
    ex->bytes[3] += t->nbytes;
    return st ? fail_io(w, i, "SSD write") : TIDE_OK;
}

tide_status exec_move(worker *w, int i) {
    tide_exec *ex = w->ex;
    const tide_ins *in = &ex->p->ins[i];
    const tide_tensor *t = &ex->g->tensors[in->tensor];
    const home_ref *h = &ex->home[in->tensor];
    tide_status st;
    if (in->src == TIDE_TIER_HOST && in->dst == TIDE_TIER_SSD) {
        const unsigned char *src = in->src_off == TIDE_HOME ? h->host : ex->host_pool + in->src_off;
        if (!src) return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no host home bound", i, t->name);
        if (in->tier_off == TIDE_HOME) return home_write(w, i, src, false);
        st = ssd_write_from(w, -1, true, in->tier_off, src, t->nbytes, false);
        ex->bytes[3] += t->nbytes;
    } else {
        unsigned char *dst = in->tier_off == TIDE_HOME ? h->host : ex->host_pool + in->tier_off;
        if (!dst) return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no host home bound", i, t->name);
        if (in->src_off != TIDE_HOME) st = ssd_read_into(w, -1, true, false, in->src_off, dst, t->nbytes, false);
        else if (h->fd >= 0) st = ssd_read_into(w, h->fd, h->direct, false, h->file_off, dst, t->nbytes, false);
        else if (h->host) memcpy(dst, h->host, t->nbytes), st = TIDE_OK; /* the SSD home mapped in memory */
        else return tide_err(w->ctx, TIDE_E_INVALID, "instruction %d: '%s' has no SSD home bound", i, t->name);
        ex->bytes[2] += t->nbytes;
    }
    return st ? fail_io(w, i, "move between host and SSD") : TIDE_OK;
}

