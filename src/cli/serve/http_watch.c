/*
 * http_watch.c - `tide serve`'s deadline for a whole request (--timeout).
 *
 * libmicrohttpd's connection timeout counts from a connection's last byte,
 * so a client sending a header byte a second would hold its connection for
 * ever. The watch keeps every open connection (added when the daemon
 * accepts it, removed when it closes) and a thread that, every
 * WATCH_TICK_NS, reads each connection's count of bytes received from the
 * kernel (TCP_INFO): the first byte since the connection opened or since its
 * previous answer begins a request, and a request whose headers and body
 * have not all arrived `timeout` seconds later is cut off with
 * shutdown(2) (the daemon owns the descriptor and closes it). While a
 * request runs and its answer is sent (busy), no deadline applies; an idle
 * connection is the daemon's keep-alive timeout's.
 */
#include "cli/serve/http_int.h"

#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_received */
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define WATCH_TICK_NS 200000000L

struct serve_watched {
    struct serve_watched *prev, *next;
    int fd;
    bool busy;            /* the request has arrived whole: running or answering */
    bool began;           /* bytes of a request seen since the last answer */
    bool cut;             /* shut down */
    uint64_t baseline;    /* bytes received when the connection last became idle */
    double began_at;
};

struct serve_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool stop;
    double timeout;
    struct serve_watched *head;
    atomic_llong cut;
};

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t bytes_received(int fd) {
    struct tcp_info ti;
    socklen_t n = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &n) != 0 || n < offsetof(struct tcp_info, tcpi_bytes_received) + 8)
        return 0;
    return ti.tcpi_bytes_received;
}

static void *watch_main(void *arg) {
    serve_watch *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += WATCH_TICK_NS;
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&w->cv, &w->mu, &t);
        double now = mono();
        for (struct serve_watched *c = w->head; c && !w->stop; c = c->next) {
            if (c->busy || c->cut) continue;
            if (!c->began) {
                if (bytes_received(c->fd) > c->baseline) c->began = true, c->began_at = now;
            } else if (now - c->began_at > w->timeout) {
                shutdown(c->fd, SHUT_RDWR);
                c->cut = true;
                atomic_fetch_add(&w->cut, 1);
            }
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

serve_watch *serve_watch_start(double timeout) {
    serve_watch *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->timeout = timeout;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->th, NULL, watch_main, w)) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    return w;
}

void serve_watch_stop(serve_watch *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    while (w->head) {
        struct serve_watched *c = w->head;
        w->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

serve_watched *serve_watch_add(serve_watch *w, int fd) {
    serve_watched *c = calloc(1, sizeof *c);
    if (!c) return NULL; /* unwatched: the daemon's own timeout still applies */
    c->fd = fd;
    pthread_mutex_lock(&w->mu);
    c->next = w->head;
    if (w->head) w->head->prev = c;
    w->head = c;
    pthread_mutex_unlock(&w->mu);
    return c;
}

void serve_watch_remove(serve_watch *w, serve_watched *c) {
    if (!c) return;
    pthread_mutex_lock(&w->mu);
    if (c->prev) c->prev->next = c->next;
    else w->head = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&w->mu);
    free(c);
}

void serve_watch_busy(serve_watch *w, serve_watched *c, bool busy) {
    if (!c) return;
    pthread_mutex_lock(&w->mu);
    c->busy = busy;
    if (!busy) { /* answered: the next request's bytes start its deadline */
        c->began = false;
        c->baseline = bytes_received(c->fd);
    }
    pthread_mutex_unlock(&w->mu);
}

long long serve_watch_cut(serve_watch *w) { return w ? atomic_load(&w->cut) : 0; }
