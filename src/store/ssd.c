/*
 * ssd.c - the SSD tier store (contract in ssd.h): spill files, striping, the
 * request loop shared by both engines, reads and writes of callers' files,
 * registered regions, and the raw bandwidth helpers.
 *
 * Invariants:
 *   1. Spill files never have a name once tide_ssd_open() returns (O_TMPFILE,
 *      or unlinked right after creation), so neither a crash nor a failed open
 *      leaves one behind.
 *   2. At most queue_depth requests are in flight, and a call returns only when
 *      none of its requests is (xfer_run drains on error too), so the caller's
 *      buffer is never touched after a call returns. The one exception is an
 *      engine that itself fails (the store is then marked broken and refuses
 *      further calls).
 *   3. Every request lies inside one spill file stripe unit (or one
 *      stripe_bytes window of a caller's file) and, when fixed, inside one
 *      registered iovec; its offset, length and buffer stay 4096-aligned across
 *      resubmission (a short transfer of an unaligned count is end of file).
 *      A caller's file opened without O_DIRECT is written outside the engine
 *      (buffered_write), at any alignment.
 *   4. Only the first failure of a call is recorded on the context.
 */
#include "store/ssd_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define DEFAULT_QD 32
#define DEFAULT_STRIPE ((uint64_t)1 << 20)
#define DEFAULT_THREADS 4
#define MAX_QD 4096
#define MAX_STRIPE ((uint64_t)256 << 20)
#define MAX_THREADS 64
#define RAW_BLOCK ((size_t)4 << 20)

static bool aligned(uint64_t v) { return v % TIDE_SSD_ALIGN == 0; }

/* ------------------------------------------------------------ files */

/* Creates a nameless file in dir: O_TMPFILE, or where the filesystem lacks it a
 * named file unlinked at once. Then asks for O_DIRECT (*direct says whether it
 * was granted). Returns the fd, or -1 with errno set. */
static int create_nameless(const char *dir, bool want_direct, bool *direct) {
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
        size_t n = strlen(dir) + 32;
        char *path = tide_malloc(n);
        if (!path) {
            errno = ENOMEM;
            return -1;
        }
        snprintf(path, n, "%s/.tide-spill-XXXXXX", dir);
        fd = mkostemp(path, O_CLOEXEC);
        if (fd >= 0 && unlink(path) != 0) {
            int e = errno;
            close(fd);
            fd = -1;
            errno = e;
        }
        tide_free(path);
    }
    if (fd < 0) return -1;
    *direct = false;
    if (want_direct) {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0) *direct = true;
    }
    return fd;
}

/* Bytes free for an unprivileged writer on fd's filesystem. */
static uint64_t free_bytes(int fd) {
    struct statvfs v;
    if (fstatvfs(fd, &v) != 0) return UINT64_MAX; /* unknown: let fallocate say */
    return (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
}

/* Bytes of spill file i: the stripe units k with k % n == i, the last unit of
 * the whole space cut to the capacity. */
static uint64_t file_size(uint64_t capacity, uint64_t stripe, int n, int i) {
    uint64_t units = (capacity + stripe - 1) / stripe;
    uint64_t mine = units / (uint64_t)n + ((uint64_t)i < units % (uint64_t)n ? 1 : 0);
    uint64_t size = mine * stripe;
    if (units > 0 && (units - 1) % (uint64_t)n == (uint64_t)i) size -= units * stripe - capacity;
    return size;
}

/* Creates spill file i of s (nameless) in dir. Returns TIDE_OK, or TIDE_E_IO /
 * TIDE_E_NOMEM with the message set. */
static tide_status create_spill(tide_ssd *s, int i, const char *dir, uint64_t size) {
    struct ssd_file *f = &s->files[i];
    f->dir = tide_strdup(dir);
    if (!f->dir) return tide_err(s->ctx, TIDE_E_NOMEM, "out of memory");
    f->size = size;
#ifdef TIDE_TEST_HOOKS
    bool want_direct = !s->faults.refuse_direct;
#else
    bool want_direct = true;
#endif
    f->fd = create_nameless(dir, want_direct, &f->direct);
    if (f->fd < 0)
        return tide_err(s->ctx, errno == ENOMEM ? TIDE_E_NOMEM : TIDE_E_IO,
                        "cannot create a spill file in %s: %s", dir, strerror(errno));
    return TIDE_OK;
}

/* Checks that spill file i fits in its filesystem's free space, together with
 * the files before it on the same filesystem. All files are checked before any
 * space is reserved, so a store too large for its disks never fills them. */
static tide_status check_space(tide_ssd *s, int i) {
    struct ssd_file *f = &s->files[i];
    struct stat st;
    uint64_t need = f->size;
    if (fstat(f->fd, &st) == 0) {
        for (int j = 0; j < i; j++) {
            struct stat sj;
            if (fstat(s->files[j].fd, &sj) == 0 && sj.st_dev == st.st_dev) need += s->files[j].size;
        }
    }
    uint64_t avail = free_bytes(f->fd);
    if (need > avail)
        return tide_err(s->ctx, TIDE_E_IO,
                        "no space for %llu bytes of spill in %s: %llu bytes free on its filesystem",
                        (unsigned long long)need, f->dir, (unsigned long long)avail);
    return TIDE_OK;
}

/* Reserves the space of spill file i. Returns TIDE_OK or TIDE_E_IO. */
static tide_status reserve_spill(tide_ssd *s, int i) {
    struct ssd_file *f = &s->files[i];
    if (f->size == 0) return TIDE_OK;
    int rc;
#ifdef TIDE_TEST_HOOKS
    if (s->faults.fallocate_enospc_dir == i + 1) {
        rc = -1;
        errno = ENOSPC;
    } else
#endif
    {
        do rc = fallocate(f->fd, 0, 0, (off_t)f->size);
        while (rc != 0 && errno == EINTR);
    }
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
        /* No preallocation on this filesystem: a sparse file of the size. */
        rc = ftruncate(f->fd, (off_t)f->size);
    }
    if (rc != 0) {
        int e = errno;
        if (e == ENOSPC || e == EDQUOT)
            return tide_err(s->ctx, TIDE_E_IO, "no space for %llu bytes of spill in %s: %s",
                            (unsigned long long)f->size, f->dir, strerror(e));
        return tide_err(s->ctx, TIDE_E_IO, "cannot reserve %llu bytes of spill in %s: %s",
                        (unsigned long long)f->size, f->dir, strerror(e));
    }
    return TIDE_OK;
}

/* ------------------------------------------------------------ open, close */

void tide_ssd_close(tide_ssd *s) {
    if (!s) return;
    if (s->ops && s->ops->close) s->ops->close(s);
    for (int i = 0; s->files && i < s->n_files; i++) {
        if (s->files[i].fd >= 0) close(s->files[i].fd);
        tide_free(s->files[i].dir);
    }
    tide_free(s->files);
    tide_free(s->done);
    tide_free(s->free_slots);
    tide_free(s->slots);
    tide_free(s);
}

#ifdef TIDE_TEST_HOOKS
static tide_ssd_faults test_faults; /* store/ssd_test.h */

void tide_ssd_test_set_faults(const tide_ssd_faults *f) {
    test_faults = f ? *f : (tide_ssd_faults){0};
}
#endif

tide_status tide_ssd_open(tide_ctx *ctx, const char *const *dirs, int n_dirs,
                          uint64_t capacity, const tide_ssd_opts *opts, tide_ssd **out) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "ssd store: out is NULL");
    *out = NULL;
    tide_ssd_opts o = {0};
    if (opts) o = *opts;
    if (o.queue_depth == 0) o.queue_depth = DEFAULT_QD;
    if (o.stripe_bytes == 0) o.stripe_bytes = DEFAULT_STRIPE;
    if (o.fallback_threads == 0) o.fallback_threads = DEFAULT_THREADS;

    if (n_dirs < 0 || (n_dirs > 0 && !dirs))
        return tide_err(ctx, TIDE_E_INVALID, "ssd store: bad directory list (n_dirs %d)", n_dirs);
    if (n_dirs == 0 && capacity > 0)
        return tide_err(ctx, TIDE_E_INVALID,
                        "ssd store: %llu bytes of spill asked with no directory",
                        (unsigned long long)capacity);
    for (int i = 0; i < n_dirs; i++)
        if (!dirs[i] || !dirs[i][0])
            return tide_err(ctx, TIDE_E_INVALID, "ssd store: directory %d is empty", i);
    if (o.queue_depth < 1 || o.queue_depth > MAX_QD)
        return tide_err(ctx, TIDE_E_INVALID, "ssd store: queue depth %d not in 1..%d",
                        o.queue_depth, MAX_QD);
    if (!aligned(o.stripe_bytes) || o.stripe_bytes > MAX_STRIPE)
        return tide_err(ctx, TIDE_E_INVALID,
                        "ssd store: stripe of %llu bytes is not a multiple of %u up to %llu",
                        (unsigned long long)o.stripe_bytes, TIDE_SSD_ALIGN,
                        (unsigned long long)MAX_STRIPE);
    if (o.fallback_threads < 1 || o.fallback_threads > MAX_THREADS)
        return tide_err(ctx, TIDE_E_INVALID, "ssd store: %d fallback threads not in 1..%d",
                        o.fallback_threads, MAX_THREADS);
    if (capacity > UINT64_MAX - TIDE_SSD_ALIGN)
        return tide_err(ctx, TIDE_E_INVALID, "ssd store: capacity %llu too large",
                        (unsigned long long)capacity);
    capacity = (capacity + TIDE_SSD_ALIGN - 1) / TIDE_SSD_ALIGN * TIDE_SSD_ALIGN;

    tide_ssd *s = tide_calloc(1, sizeof *s);
    if (!s) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    s->ctx = ctx;
    s->capacity = capacity;
    s->stripe = o.stripe_bytes;
    s->qd = o.queue_depth;
#ifdef TIDE_TEST_HOOKS
    s->faults = test_faults;
#endif
    s->direct = true;
    tide_status st = TIDE_OK;

    s->slots = tide_calloc((size_t)s->qd, sizeof *s->slots);
    s->free_slots = tide_calloc((size_t)s->qd, sizeof *s->free_slots);
    s->done = tide_calloc((size_t)s->qd, sizeof *s->done);
    s->files = tide_calloc(n_dirs > 0 ? (size_t)n_dirs : 1, sizeof *s->files);
    if (!s->slots || !s->free_slots || !s->done || !s->files) {
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < s->qd; i++) s->free_slots[i] = &s->slots[i];
    s->n_free = s->qd;
    for (int i = 0; i < n_dirs; i++) s->files[i].fd = -1;
    s->n_files = n_dirs;

    for (int i = 0; i < n_dirs; i++) {
        st = create_spill(s, i, dirs[i], file_size(capacity, s->stripe, n_dirs, i));
        if (st != TIDE_OK) goto fail;
        s->direct = s->direct && s->files[i].direct;
    }
    for (int i = 0; i < n_dirs; i++)
        if ((st = check_space(s, i)) != TIDE_OK) goto fail;
    for (int i = 0; i < n_dirs; i++)
        if ((st = reserve_spill(s, i)) != TIDE_OK) goto fail;

    /* TIDE_SSD_PREAD (set, not "0"): the pread path for every store of the
     * process, the route by which a program (`tide run --pread`) or a test
     * takes it without an option of the public API. */
    const char *env = getenv("TIDE_SSD_PREAD");
    bool by_env = env && *env && strcmp(env, "0");
    char why[sizeof s->fallback_reason] = "forced";
    if (by_env && !o.force_fallback) snprintf(why, sizeof why, "forced by TIDE_SSD_PREAD");
    int rc = o.force_fallback || by_env ? -1 : tide_ssd_uring_init(s, why, sizeof why);
    if (rc == 1) {
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory");
        goto fail;
    }
    if (rc != 0) {
        snprintf(s->fallback_reason, sizeof s->fallback_reason, "%s", why);
        char why2[128] = "";
        rc = tide_ssd_pool_init(s, o.fallback_threads, why2, sizeof why2);
        if (rc != 0) {
            st = tide_err(ctx, rc == -ENOMEM ? TIDE_E_NOMEM : TIDE_E_IO, "ssd store: %s", why2);
            goto fail;
        }
    }
    *out = s;
    return TIDE_OK;
fail:
    tide_ssd_close(s);
    return st;
}

/* ------------------------------------------------------------ requests */

enum xfer_kind { XFER_SPILL, XFER_FILE };

/* What is left of one call. */
struct xfer {
    enum xfer_kind kind;
    bool write;
    int fd;               /* XFER_FILE */
    uint64_t off;
    unsigned char *buf;
    size_t left;
};

/* Makes r the next request of x and advances x (invariant 3). */
static void next_req(tide_ssd *s, struct xfer *x, struct ssd_req *r) {
    size_t len = x->left;
    if (x->kind == XFER_SPILL) {
        uint64_t unit = x->off / s->stripe, within = x->off % s->stripe;
        int f = (int)(unit % (uint64_t)s->n_files);
        r->file = f;
        r->fd = s->files[f].fd;
        r->off = unit / (uint64_t)s->n_files * s->stripe + within;
        if (len > s->stripe - within) len = (size_t)(s->stripe - within);
        r->eof_zero = false;
    } else {
        r->file = -1;
        r->fd = x->fd;
        r->off = x->off;
        if (len > s->stripe) len = (size_t)s->stripe;
        r->eof_zero = !x->write;
    }
    r->fixed = false;
    r->buf_index = 0;
    if (s->ops->set_buffers) {
        for (int i = 0; i < s->n_regions; i++) {
            const struct ssd_region *g = &s->regions[i];
            if (x->buf < g->base || x->buf >= g->base + g->len) continue;
            size_t rel = (size_t)(x->buf - g->base);
            size_t iov = rel / SSD_IOV_MAX_LEN;
            size_t iov_end = TIDE_MIN((iov + 1) * SSD_IOV_MAX_LEN, g->len);
            if (len > iov_end - rel) len = iov_end - rel;
            r->fixed = true;
            r->buf_index = g->first_iov + (int)iov;
            break;
        }
    }
    r->write = x->write;
    r->buf = x->buf;
    r->len = r->issue = len;
    r->res = 0;
    x->off += len;
    x->buf += len;
    x->left -= len;

#ifdef TIDE_TEST_HOOKS
    /* Fault injection (store/ssd_test.h): counted once per request. */
    long nth = x->write ? ++s->n_writes : ++s->n_reads;
    long any = ++s->n_requests;
    r->inject_eio = nth == (x->write ? s->faults.fail_write_nth : s->faults.fail_read_nth);
    r->inject_eagain = any == s->faults.eagain_nth;
    if (any == s->faults.short_nth && len > TIDE_SSD_ALIGN)
        r->issue = len / 2 / TIDE_SSD_ALIGN * TIDE_SSD_ALIGN;
#endif
    s->stats.requests++;
    if (r->fixed) s->stats.fixed_requests++;
}

/* Records the failure of r as the call's error (first one only). */
static tide_status req_fail(tide_ssd *s, tide_status st, const struct ssd_req *r,
                            const char *why) {
    if (st != TIDE_OK) return st;
    const char *op = r->write ? "write" : "read";
    if (r->file >= 0)
        return tide_err(s->ctx, TIDE_E_IO, "%s of spill file in %s at offset %llu failed: %s", op,
                        s->files[r->file].dir, (unsigned long long)r->off, why);
    char link[64], name[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", r->fd);
    ssize_t k = readlink(link, name, sizeof name - 1);
    if (k > 0)
        name[k] = '\0';
    else
        snprintf(name, sizeof name, "fd %d", r->fd);
    return tide_err(s->ctx, TIDE_E_IO, "%s of %s at offset %llu failed: %s", op, name,
                    (unsigned long long)r->off, why);
}

/* Interprets one completion. Returns true when r goes back in flight. */
static bool req_done(tide_ssd *s, struct ssd_req *r, tide_status *st) {
    int res = r->res;
#ifdef TIDE_TEST_HOOKS
    if (r->inject_eio) {
        r->inject_eio = false;
        res = -EIO;
    } else if (r->inject_eagain && res >= 0) {
        r->inject_eagain = false;
        res = -EAGAIN; /* it ran, but is redone: idempotent */
    }
#endif
    if (res == -EAGAIN || res == -EINTR) {
        if (*st != TIDE_OK) return false;
        r->issue = r->len;
        s->stats.resubmits++;
        return true;
    }
    if (res < 0) {
        *st = req_fail(s, *st, r, strerror(-res));
        return false;
    }
    if (r->write)
        s->stats.bytes_written += (uint64_t)res;
    else
        s->stats.bytes_read += (uint64_t)res;
    size_t got = (size_t)res;
    if (got >= r->len) return false;
    if (got == 0 || !aligned(got)) {
        /* End of file: O_DIRECT returns an unaligned count only there. */
        if (r->eof_zero) {
            memset(r->buf + got, 0, r->len - got);
            return false;
        }
        *st = req_fail(s, *st, r, got == 0 ? "no progress (end of file?)"
                                           : "short transfer of unaligned length");
        return false;
    }
    r->off += got;
    r->buf += got;
    r->len -= got;
    if (*st != TIDE_OK) return false;
    r->issue = r->len;
    s->stats.resubmits++;
    return true;
}

/* Runs the whole of x with up to qd requests in flight (invariant 2). */
static tide_status xfer_run(tide_ssd *s, struct xfer *x) {
    if (s->broken)
        return tide_err(s->ctx, TIDE_E_IO, "ssd store: unusable after an earlier %s failure",
                        s->ops->name);
    tide_status st = TIDE_OK;
    int in_flight = 0;
    for (;;) {
        while (st == TIDE_OK && x->left > 0 && s->n_free > 0) {
            struct ssd_req *r = s->free_slots[--s->n_free];
            next_req(s, x, r);
            int rc = s->ops->prep(s, r);
            if (rc < 0) {
                s->free_slots[s->n_free++] = r;
                st = req_fail(s, st, r, strerror(-rc));
                break;
            }
            in_flight++;
        }
        if (in_flight == 0) break;
        int n = s->ops->run(s, s->done, s->qd);
        if (n < 0) {
            s->broken = true;
            return tide_err(s->ctx, TIDE_E_IO, "ssd store: %s failed with %d requests in flight: %s",
                            s->ops->name, in_flight, strerror(-n));
        }
        for (int i = 0; i < n; i++) {
            struct ssd_req *r = s->done[i];
            if (req_done(s, r, &st)) {
                int rc = s->ops->prep(s, r);
                if (rc == 0) continue;
                st = req_fail(s, st, r, strerror(-rc));
            }
            in_flight--;
            s->free_slots[s->n_free++] = r;
        }
    }
    return st;
}

static tide_status check_args(tide_ssd *s, const char *what, uint64_t off, const void *buf,
                              size_t n) {
    if (!aligned(off))
        return tide_err(s->ctx, TIDE_E_INVALID, "ssd %s: offset %llu is not a multiple of %u",
                        what, (unsigned long long)off, TIDE_SSD_ALIGN);
    if (!aligned(n))
        return tide_err(s->ctx, TIDE_E_INVALID, "ssd %s: length %zu is not a multiple of %u",
                        what, n, TIDE_SSD_ALIGN);
    if (!aligned((uintptr_t)buf) || (!buf && n > 0))
        return tide_err(s->ctx, TIDE_E_INVALID,
                        "ssd %s: buffer %p is not aligned to %u bytes", what, buf,
                        TIDE_SSD_ALIGN);
    return TIDE_OK;
}

static tide_status spill_io(tide_ssd *s, bool write, uint64_t off, const void *buf, size_t n) {
    const char *what = write ? "write" : "read";
    tide_status st = check_args(s, what, off, buf, n);
    if (st != TIDE_OK) return st;
    if (off > s->capacity || n > s->capacity - off)
        return tide_err(s->ctx, TIDE_E_INVALID,
                        "ssd %s: range [%llu, %llu) is past the capacity of %llu bytes", what,
                        (unsigned long long)off, (unsigned long long)off + n,
                        (unsigned long long)s->capacity);
    if (n == 0) return TIDE_OK;
    struct xfer x = {.kind = XFER_SPILL, .write = write, .fd = -1, .off = off,
                     .buf = (unsigned char *)buf, .left = n};
    return xfer_run(s, &x);
}

tide_status tide_ssd_write(tide_ssd *s, uint64_t off, const void *buf, size_t n) {
    return spill_io(s, true, off, buf, n);
}

tide_status tide_ssd_read(tide_ssd *s, uint64_t off, void *buf, size_t n) {
    return spill_io(s, false, off, buf, n);
}

tide_status tide_ssd_read_file(tide_ssd *s, int fd, uint64_t file_off, void *buf, size_t n) {
    tide_status st = check_args(s, "file read", file_off, buf, n);
    if (st != TIDE_OK) return st;
    if (fd < 0) return tide_err(s->ctx, TIDE_E_INVALID, "ssd file read: bad fd %d", fd);
    if (file_off > (uint64_t)INT64_MAX - n)
        return tide_err(s->ctx, TIDE_E_INVALID, "ssd file read: offset %llu too large",
                        (unsigned long long)file_off);
    if (n == 0) return TIDE_OK;
    struct xfer x = {.kind = XFER_FILE, .write = false, .fd = fd, .off = file_off,
                     .buf = buf, .left = n};
    return xfer_run(s, &x);
}

/* A write to a descriptor without O_DIRECT: pwrite, window by window, each
 * window a write request for fault injection (store/ssd_test.h). */
static tide_status buffered_write(tide_ssd *s, int fd, uint64_t off, const unsigned char *buf, size_t n) {
    while (n > 0) {
        size_t len = n > s->stripe ? (size_t)s->stripe : n;
        struct ssd_req r = {.fd = fd, .file = -1, .write = true, .off = off};
        s->stats.requests++;
#ifdef TIDE_TEST_HOOKS
        s->n_requests++;
        if (++s->n_writes == s->faults.fail_write_nth) return req_fail(s, TIDE_OK, &r, strerror(EIO));
#endif
        for (size_t done = 0; done < len;) {
            ssize_t k = pwrite(fd, buf + done, len - done, (off_t)(off + done));
            if (k < 0 && (errno == EINTR || errno == EAGAIN)) {
                s->stats.resubmits++;
                continue;
            }
            if (k <= 0) {
                r.off = off + done;
                return req_fail(s, TIDE_OK, &r, k < 0 ? strerror(errno) : "no progress");
            }
            done += (size_t)k;
            s->stats.bytes_written += (uint64_t)k;
            if (done < len) s->stats.resubmits++;
        }
        off += len;
        buf += len;
        n -= len;
    }
    return TIDE_OK;
}

tide_status tide_ssd_write_file(tide_ssd *s, int fd, uint64_t file_off, const void *buf, size_t n) {
    if (fd < 0) return tide_err(s->ctx, TIDE_E_INVALID, "ssd file write: bad fd %d", fd);
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return tide_err(s->ctx, TIDE_E_INVALID, "ssd file write: fd %d: %s", fd, strerror(errno));
    bool direct = (fl & O_DIRECT) != 0;
    tide_status st = direct ? check_args(s, "file write", file_off, buf, n) : TIDE_OK;
    if (st != TIDE_OK) return st;
    if (!buf && n > 0) return tide_err(s->ctx, TIDE_E_INVALID, "ssd file write: no buffer");
    if (file_off > (uint64_t)INT64_MAX - n)
        return tide_err(s->ctx, TIDE_E_INVALID, "ssd file write: offset %llu too large",
                        (unsigned long long)file_off);
    if (n == 0) return TIDE_OK;
    if (!direct) return buffered_write(s, fd, file_off, buf, n);
    struct xfer x = {.kind = XFER_FILE, .write = true, .fd = fd, .off = file_off,
                     .buf = (unsigned char *)buf, .left = n};
    return xfer_run(s, &x);
}

static tide_status open_direct(const char *path, int flags, int *fd) {
    *fd = open(path, flags | O_DIRECT | O_CLOEXEC);
    if (*fd >= 0) return TIDE_OK;
    if (errno == EINVAL) return TIDE_E_UNSUPPORTED;
    if (errno == ENOENT) return TIDE_E_NOT_FOUND;
    return TIDE_E_IO;
}

tide_status tide_ssd_open_direct(const char *path, int *fd) { return open_direct(path, O_RDONLY, fd); }
tide_status tide_ssd_open_direct_rw(const char *path, int *fd) { return open_direct(path, O_RDWR, fd); }

/* ------------------------------------------------------------ regions */

/* Hands the table of all regions to the engine. Returns 0, -errno from the
 * engine, or 1 when the table itself could not be allocated (the engine's
 * table is then unchanged). */
static int push_regions(tide_ssd *s) {
    int n_iov = 0;
    for (int i = 0; i < s->n_regions; i++) {
        s->regions[i].first_iov = n_iov;
        n_iov += (int)((s->regions[i].len + SSD_IOV_MAX_LEN - 1) / SSD_IOV_MAX_LEN);
    }
    struct iovec *iov = tide_calloc(n_iov > 0 ? (size_t)n_iov : 1, sizeof *iov);
    if (!iov) return 1;
    int k = 0;
    for (int i = 0; i < s->n_regions; i++) {
        for (size_t at = 0; at < s->regions[i].len; at += SSD_IOV_MAX_LEN) {
            iov[k].iov_base = s->regions[i].base + at;
            iov[k].iov_len = TIDE_MIN(SSD_IOV_MAX_LEN, s->regions[i].len - at);
            k++;
        }
    }
    int rc = s->ops->set_buffers(s, iov, n_iov);
    tide_free(iov);
    return rc;
}

tide_status tide_ssd_register(tide_ssd *s, void *base, size_t len) {
    unsigned char *b = base;
    if (!b || !aligned((uintptr_t)b) || len == 0 || !aligned(len))
        return tide_err(s->ctx, TIDE_E_INVALID,
                        "ssd register: region %p of %zu bytes is not %u-aligned", base, len,
                        TIDE_SSD_ALIGN);
    if (s->n_regions == TIDE_SSD_MAX_REGIONS)
        return tide_err(s->ctx, TIDE_E_INVALID, "ssd register: already %d regions",
                        TIDE_SSD_MAX_REGIONS);
    for (int i = 0; i < s->n_regions; i++) {
        const struct ssd_region *g = &s->regions[i];
        if (b < g->base + g->len && g->base < b + len)
            return tide_err(s->ctx, TIDE_E_INVALID,
                            "ssd register: region %p of %zu bytes overlaps region %p", base, len,
                            (void *)g->base);
    }
    s->regions[s->n_regions++] = (struct ssd_region){.base = b, .len = len};
    if (!s->ops->set_buffers) return TIDE_OK;
    int rc = push_regions(s);
    if (rc == 0) return TIDE_OK;
    s->n_regions--;
    if (rc == 1) return tide_err(s->ctx, TIDE_E_NOMEM, "out of memory");
    /* The engine dropped its table: put the old one back, or use none. */
    if (push_regions(s) != 0) s->n_regions = 0;
    return tide_err(s->ctx, TIDE_E_UNSUPPORTED,
                    "ssd register: io_uring cannot register %zu bytes at %p: %s", len, base,
                    strerror(-rc));
}

tide_status tide_ssd_unregister(tide_ssd *s, void *base) {
    int i = 0;
    while (i < s->n_regions && s->regions[i].base != base) i++;
    if (i == s->n_regions)
        return tide_err(s->ctx, TIDE_E_INVALID, "ssd unregister: no region starts at %p", base);
    memmove(&s->regions[i], &s->regions[i + 1],
            (size_t)(s->n_regions - i - 1) * sizeof s->regions[0]);
    s->n_regions--;
    if (!s->ops->set_buffers) return TIDE_OK;
    int rc = push_regions(s);
    if (rc != 0) {
        /* The memory must not stay pinned: drop every region rather. */
        s->n_regions = 0;
        rc = s->ops->set_buffers(s, NULL, 0);
        if (rc != 0)
            return tide_err(s->ctx, TIDE_E_IO, "ssd unregister: io_uring: %s", strerror(-rc));
    }
    return TIDE_OK;
}

/* ------------------------------------------------------------ queries */

const char *tide_ssd_backend_name(const tide_ssd *s) { return s->ops->name; }
const char *tide_ssd_fallback_reason(const tide_ssd *s) { return s->fallback_reason; }
bool tide_ssd_direct(const tide_ssd *s) { return s->direct; }
uint64_t tide_ssd_capacity(const tide_ssd *s) { return s->capacity; }
void tide_ssd_get_stats(const tide_ssd *s, tide_ssd_stats *st) { *st = s->stats; }

/* ------------------------------------------------------------ raw bandwidth */

/* Writes `bytes` to fd from offset 0 in RAW_BLOCK pwrites, then fdatasync.
 * Returns 0 or an errno. */
static int raw_write_all(int fd, unsigned char *blk, uint64_t bytes) {
    for (uint64_t at = 0; at < bytes;) {
        size_t n = RAW_BLOCK;
        ssize_t k = pwrite(fd, blk, n, (off_t)at);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return errno;
        if (k == 0 || k % TIDE_SSD_ALIGN) return EIO;
        at += (uint64_t)k;
    }
    return fdatasync(fd) == 0 ? 0 : errno;
}

/* Runs one raw measurement: write (timed when !read) then read (timed). */
static tide_status raw_bw(tide_ctx *ctx, const char *dir, uint64_t bytes, bool read,
                          double *bytes_per_s) {
    if (bytes == 0) return tide_err(ctx, TIDE_E_INVALID, "raw bandwidth: 0 bytes");
    if (bytes > UINT64_MAX - RAW_BLOCK) return tide_err(ctx, TIDE_E_INVALID, "raw bandwidth: too many bytes");
    bytes = (bytes + RAW_BLOCK - 1) / RAW_BLOCK * RAW_BLOCK;
    bool direct = false;
    int fd = create_nameless(dir, true, &direct);
    if (fd < 0)
        return tide_err(ctx, TIDE_E_IO, "cannot create a file in %s: %s", dir, strerror(errno));
    if (!direct) {
        close(fd);
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: the filesystem refuses O_DIRECT", dir);
    }
    unsigned char *blk = tide_malloc_aligned(RAW_BLOCK, TIDE_SSD_ALIGN);
    if (!blk) {
        close(fd);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < RAW_BLOCK; i++) blk[i] = (unsigned char)(i * 131u + (i >> 12) * 7u + 1u);

    tide_status st = TIDE_OK;
    if (free_bytes(fd) < bytes) {
        st = tide_err(ctx, TIDE_E_IO, "no space for %llu bytes in %s",
                      (unsigned long long)bytes, dir);
        goto done;
    }
    if (fallocate(fd, 0, 0, (off_t)bytes) != 0 && errno != EOPNOTSUPP) {
        st = tide_err(ctx, TIDE_E_IO, "cannot reserve %llu bytes in %s: %s",
                      (unsigned long long)bytes, dir, strerror(errno));
        goto done;
    }
    double t0 = tide_now();
    int e = raw_write_all(fd, blk, bytes);
    double t1 = tide_now();
    if (e) {
        st = tide_err(ctx, TIDE_E_IO, "write of a file in %s failed: %s", dir, strerror(e));
        goto done;
    }
    if (read) {
        t0 = tide_now();
        for (uint64_t at = 0; at < bytes;) {
            ssize_t k = pread(fd, blk, RAW_BLOCK, (off_t)at);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0 || k % TIDE_SSD_ALIGN) {
                st = tide_err(ctx, TIDE_E_IO, "read of a file in %s failed: %s", dir,
                              k < 0 ? strerror(errno) : "short read");
                goto done;
            }
            at += (uint64_t)k;
        }
        t1 = tide_now();
    }
    *bytes_per_s = t1 > t0 ? (double)bytes / (t1 - t0) : 0.0;
done:
    tide_free_aligned(blk);
    close(fd);
    return st;
}

tide_status tide_ssd_raw_read_bw(tide_ctx *ctx, const char *dir, uint64_t bytes,
                                 double *bytes_per_s) {
    return raw_bw(ctx, dir, bytes, true, bytes_per_s);
}

tide_status tide_ssd_raw_write_bw(tide_ctx *ctx, const char *dir, uint64_t bytes,
                                  double *bytes_per_s) {
    return raw_bw(ctx, dir, bytes, false, bytes_per_s);
}
