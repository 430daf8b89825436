/*
 * ssd_pool.c - the SSD store's fallback engine: a small pool of threads doing
 * one pread/pwrite each per request, for kernels or containers (seccomp) that
 * refuse io_uring. Several threads keep several requests in flight, which is
 * what an NVMe device needs to reach its bandwidth.
 *
 * Two queues under one mutex: jobs (filled by prep, emptied by the workers)
 * and finished (filled by the workers, emptied by run). Each holds at most
 * queue_depth requests, since no more are ever in flight. All hand-over of a
 * request between threads goes through the mutex, so a request's fields and
 * the caller's buffer are ordered for ThreadSanitizer as for the hardware.
 */
#include "store/ssd_engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct pool_eng {
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was queued, or stop */
    pthread_cond_t fin;  /* a request finished */
    struct ssd_req **jobs;
    int jobs_head, jobs_count;
    struct ssd_req **done;
    int done_head, done_count;
    int cap;
    bool stop;
    pthread_t *threads;
    int n_threads;
};

static struct pool_eng *eng_of(tide_ssd *s) { return s->eng; }

static void *pool_worker(void *arg) {
    struct pool_eng *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->jobs_count == 0) pthread_cond_wait(&p->work, &p->mu);
        if (p->jobs_count == 0) break; /* stop, and nothing left */
        struct ssd_req *r = p->jobs[p->jobs_head];
        p->jobs_head = (p->jobs_head + 1) % p->cap;
        p->jobs_count--;
        pthread_mutex_unlock(&p->mu);

        ssize_t k = r->write ? pwrite(r->fd, r->buf, r->issue, (off_t)r->off)
                             : pread(r->fd, r->buf, r->issue, (off_t)r->off);
        int res = k < 0 ? -errno : (int)k;

        pthread_mutex_lock(&p->mu);
        r->res = res;
        p->done[(p->done_head + p->done_count) % p->cap] = r;
        p->done_count++;
        pthread_cond_signal(&p->fin);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static int pool_prep(tide_ssd *s, struct ssd_req *r) {
    struct pool_eng *p = eng_of(s);
    pthread_mutex_lock(&p->mu);
    if (p->jobs_count == p->cap) { /* cannot happen: in flight <= cap */
        pthread_mutex_unlock(&p->mu);
        return -EBUSY;
    }
    p->jobs[(p->jobs_head + p->jobs_count) % p->cap] = r;
    p->jobs_count++;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static int pool_run(tide_ssd *s, struct ssd_req **done, int max) {
    struct pool_eng *p = eng_of(s);
    pthread_mutex_lock(&p->mu);
    while (p->done_count == 0) pthread_cond_wait(&p->fin, &p->mu);
    int n = 0;
    while (n < max && p->done_count > 0) {
        done[n++] = p->done[p->done_head];
        p->done_head = (p->done_head + 1) % p->cap;
        p->done_count--;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Stops and joins the first n_started threads and frees the pool. */
static void pool_destroy(struct pool_eng *p, int n_started) {
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n_started; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->fin);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    tide_free(p->threads);
    tide_free(p->done);
    tide_free(p->jobs);
    tide_free(p);
}

static void pool_close(tide_ssd *s) {
    struct pool_eng *p = eng_of(s);
    if (!p) return;
    pool_destroy(p, p->n_threads);
    s->eng = NULL;
}

static const struct ssd_engine_ops pool_ops = {
    .name = "pread",
    .prep = pool_prep,
    .run = pool_run,
    .set_buffers = NULL,
    .close = pool_close,
};

int tide_ssd_pool_init(tide_ssd *s, int n_threads, char *why, size_t why_len) {
    struct pool_eng *p = tide_calloc(1, sizeof *p);
    if (!p) goto nomem;
    p->cap = s->qd;
    p->jobs = tide_calloc((size_t)p->cap, sizeof *p->jobs);
    p->done = tide_calloc((size_t)p->cap, sizeof *p->done);
    p->threads = tide_calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->jobs || !p->done || !p->threads) {
        tide_free(p->threads);
        tide_free(p->done);
        tide_free(p->jobs);
        tide_free(p);
        goto nomem;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->fin, NULL);
    for (int i = 0; i < n_threads; i++) {
        int err = pthread_create(&p->threads[i], NULL, pool_worker, p);
        if (err) {
            snprintf(why, why_len, "cannot start an I/O thread: %s", strerror(err));
            pool_destroy(p, i);
            return -err;
        }
    }
    p->n_threads = n_threads;
    s->eng = p;
    s->ops = &pool_ops;
    return 0;
nomem:
    snprintf(why, why_len, "out of memory");
    return -ENOMEM;
}
