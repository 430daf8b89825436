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
 *
 * The watch also counts each client address's connections: past
 * `per_client` (0: no limit; 127.0.0.1 and ::1 never limited, so loopback
 * health checks are never locked out) a connection is marked over: its first
 * request is answered 503 and the connection closed, and its deadline runs
 * from the accept, so that one that sends nothing does not hold a slot.
 */
#include "cli/serve/http_int.h"

#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_received */
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <string.h>
#include <time.h>

#define WATCH_TICK_NS 200000000L

struct serve_watched {
    struct serve_watched *prev, *next;
    int fd;
    bool busy;            /* the request has arrived whole: running or answering */
    bool began;           /* bytes of a request seen since the last answer */
    bool cut;             /* shut down */
    bool over;            /* past the per-client limit: answered 503 */
    struct client *client;
    uint64_t baseline;    /* bytes received when the connection last became idle */
    double began_at;
};

struct client {
    struct client *next;
    char addr[INET6_ADDRSTRLEN];
    int n;
};

struct serve_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool stop;
    double timeout;
    int per_client;
    struct serve_watched *head;
    struct client *clients;
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

serve_watch *serve_watch_start(double timeout, int per_client) {
    serve_watch *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->timeout = timeout;
    w->per_client = per_client;
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
    while (w->clients) {
        struct client *k = w->clients;
        w->clients = k->next;
        free(k);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* The client's address as text; "" when it is loopback's own (never limited). */
static void client_addr(const struct sockaddr *sa, char *buf, size_t n) {
    buf[0] = '\0';
    if (!sa) return;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        if (ntohl(a->sin_addr.s_addr) == INADDR_LOOPBACK) return;
        inet_ntop(AF_INET, &a->sin_addr, buf, (socklen_t)n);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr)) return;
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127 && !a->sin6_addr.s6_addr[13] &&
            !a->sin6_addr.s6_addr[14] && a->sin6_addr.s6_addr[15] == 1)
            return;
        inet_ntop(AF_INET6, &a->sin6_addr, buf, (socklen_t)n);
    }
}

serve_watched *serve_watch_add(serve_watch *w, int fd, const struct sockaddr *addr) {
    serve_watched *c = calloc(1, sizeof *c);
    if (!c) return NULL; /* unwatched: the daemon's own timeout still applies */
    c->fd = fd;
    char a[INET6_ADDRSTRLEN];
    client_addr(w->per_client ? addr : NULL, a, sizeof a);
    pthread_mutex_lock(&w->mu);
    if (a[0]) {
        struct client *k = w->clients;
        while (k && strcmp(k->addr, a)) k = k->next;
        if (!k && (k = calloc(1, sizeof *k))) {
            memcpy(k->addr, a, sizeof a);
            k->next = w->clients;
            w->clients = k;
        }
        if (k) {
            c->client = k;
            if (++k->n > w->per_client) { /* answered 503; its deadline runs from now */
                c->over = true;
                c->began = true;
                c->began_at = mono();
            }
        }
    }
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
    if (c->client && --c->client->n == 0) { /* the client's last connection: forgotten */
        struct client **pk = &w->clients;
        while (*pk != c->client) pk = &(*pk)->next;
        *pk = c->client->next;
        free(c->client);
    }
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

bool serve_watch_over(serve_watch *w, serve_watched *c) {
    if (!c) return false;
    pthread_mutex_lock(&w->mu);
    bool over = c->over;
    pthread_mutex_unlock(&w->mu);
    return over;
}

long long serve_watch_cut(serve_watch *w) { return w ? atomic_load(&w->cut) : 0; }
