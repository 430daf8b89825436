/*
 * ssd_uring.c - the SSD store's io_uring engine: one ring per store, sized to
 * the queue depth, so the submission queue never fills (at most queue_depth
 * requests are in flight and each holds one entry until submitted) and the
 * completion queue (twice as large) never overflows.
 *
 * The ring is made without IORING_SETUP_SINGLE_ISSUER, because the thread that
 * opens a store is often not the one that uses it. Opening checks, before the
 * store commits to io_uring, that the kernel knows READ and WRITE (5.6+) and
 * that a NOP goes round: some seccomp filters allow io_uring_setup but refuse
 * io_uring_enter.
 */
#include "store/ssd_engine.h"

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct uring_eng {
    struct io_uring ring;
    bool has_buffers;
};

static struct uring_eng *eng_of(tide_ssd *s) { return s->eng; }

static int uring_prep(tide_ssd *s, struct ssd_req *r) {
    struct io_uring *ring = &eng_of(s)->ring;
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe) return -EBUSY; /* cannot happen while in flight <= entries */
    unsigned n = (unsigned)r->issue;
    if (r->write) {
        if (r->fixed)
            io_uring_prep_write_fixed(sqe, r->fd, r->buf, n, r->off, r->buf_index);
        else
            io_uring_prep_write(sqe, r->fd, r->buf, n, r->off);
    } else {
        if (r->fixed)
            io_uring_prep_read_fixed(sqe, r->fd, r->buf, n, r->off, r->buf_index);
        else
            io_uring_prep_read(sqe, r->fd, r->buf, n, r->off);
    }
    io_uring_sqe_set_data(sqe, r);
    return 0;
}

/* Moves the completions at hand into done[]; returns their count. */
static int uring_reap(struct io_uring *ring, struct ssd_req **done, int max) {
    unsigned head;
    struct io_uring_cqe *cqe;
    int n = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
        if (n == max) break;
        struct ssd_req *r = io_uring_cqe_get_data(cqe);
        r->res = cqe->res;
        done[n++] = r;
    }
    io_uring_cq_advance(ring, (unsigned)n);
    return n;
}

static int uring_run(tide_ssd *s, struct ssd_req **done, int max) {
    struct io_uring *ring = &eng_of(s)->ring;
    int busy = 0;
    for (;;) {
        int n = uring_reap(ring, done, max);
        if (n > 0 && io_uring_sq_ready(ring) == 0) return n;
        if (n > 0) {
            /* Start what is queued, but do not wait: completions are at hand. */
            int ret = io_uring_submit(ring);
            if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) return ret;
            return n;
        }
        int ret = io_uring_submit_and_wait(ring, 1);
        if (ret >= 0 || ret == -EINTR) continue;
        if (ret == -EAGAIN || ret == -EBUSY) {
            /* The kernel is short of resources for new requests: the ones in
             * flight will free some. Give up only if nothing ever moves. */
            if (++busy > 100000) return ret;
            struct io_uring_cqe *cqe;
            if (io_uring_sq_ready(ring) < (unsigned)s->qd - (unsigned)s->n_free) {
                int w = io_uring_wait_cqe(ring, &cqe);
                if (w < 0 && w != -EINTR && w != -EAGAIN) return w;
            } else {
                usleep(50);
            }
            continue;
        }
        return ret;
    }
}

static int uring_set_buffers(tide_ssd *s, const struct iovec *iov, int n) {
    struct uring_eng *e = eng_of(s);
    if (e->has_buffers) {
        int ret = io_uring_unregister_buffers(&e->ring);
        if (ret < 0) return ret;
        e->has_buffers = false;
    }
    if (n == 0) return 0;
    int ret = io_uring_register_buffers(&e->ring, iov, (unsigned)n);
    if (ret < 0) return ret;
    e->has_buffers = true;
    return 0;
}

static void uring_close(tide_ssd *s) {
    struct uring_eng *e = eng_of(s);
    if (!e) return;
    io_uring_queue_exit(&e->ring); /* also drops the registered buffers */
    tide_free(e);
    s->eng = NULL;
}

static const struct ssd_engine_ops uring_ops = {
    .name = "io_uring",
    .prep = uring_prep,
    .run = uring_run,
    .set_buffers = uring_set_buffers,
    .close = uring_close,
};

/* Runs one NOP through the ring: returns 0 or -errno. */
static int uring_nop(struct io_uring *ring) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe) return -EBUSY;
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, NULL);
    int ret;
    do ret = io_uring_submit_and_wait(ring, 1);
    while (ret == -EINTR);
    if (ret < 0) return ret;
    struct io_uring_cqe *cqe;
    do ret = io_uring_wait_cqe(ring, &cqe);
    while (ret == -EINTR);
    if (ret < 0) return ret;
    int res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    return res < 0 ? res : 0;
}

int tide_ssd_uring_init(tide_ssd *s, char *why, size_t why_len) {
    struct uring_eng *e = tide_calloc(1, sizeof *e);
    if (!e) {
        snprintf(why, why_len, "out of memory");
        return 1;
    }
    int ret = io_uring_queue_init((unsigned)s->qd, &e->ring, 0);
    if (ret < 0) {
        snprintf(why, why_len, "io_uring_queue_init: %s", strerror(-ret));
        tide_free(e);
        return ret;
    }
    struct io_uring_probe *probe = io_uring_get_probe_ring(&e->ring);
    if (!probe || !io_uring_opcode_supported(probe, IORING_OP_READ) ||
        !io_uring_opcode_supported(probe, IORING_OP_WRITE)) {
        snprintf(why, why_len, "io_uring: the kernel lacks IORING_OP_READ/WRITE");
        if (probe) io_uring_free_probe(probe);
        io_uring_queue_exit(&e->ring);
        tide_free(e);
        return -ENOSYS;
    }
    io_uring_free_probe(probe);
    ret = uring_nop(&e->ring);
    if (ret < 0) {
        snprintf(why, why_len, "io_uring_enter: %s", strerror(-ret));
        io_uring_queue_exit(&e->ring);
        tide_free(e);
        return ret;
    }
    s->eng = e;
    s->ops = &uring_ops;
    return 0;
}
