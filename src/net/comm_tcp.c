/*
 * comm_tcp.c - the ranks' collectives over TCP (comm_tcp.h).
 *
 * Joining. Every rank opens a listening socket of its own on a port the
 * system picks (the ring's). Ranks 1..N-1 connect to rank 0 at MASTER_ADDR
 * and the rendezvous port, retrying until rank 0 listens, and say who they
 * are (a hello: the ranks they were started with, their rank, their ring
 * port). Rank 0 waits for every rank, refuses a hello whose number of
 * ranks differs from its own or whose rank is taken (the refused rank is
 * told why), and sends every rank the table of the ring's addresses: each
 * rank's as rank 0 sees its connection, rank 0's own as the address that
 * rank reached it at, and a job number drawn for this run. Each rank then
 * connects to the next rank's ring port and accepts the previous one's
 * (which proves itself with the job number and its rank), and closes its
 * listening sockets. Connections that do not speak this protocol are
 * closed and ignored.
 *
 * Collectives. All-reduce is a ring reduce-scatter then a ring all-gather;
 * the reduce-scatter goes in segments of TCP_SEG bytes a part, so its
 * scratch stays 2 TCP_SEG whatever the size. Broadcast and gather go
 * between rank 0 and each rank over the rendezvous connections. Every
 * transfer is non-blocking, polled with a send and a receive at once (a
 * ring step sends to the next rank while receiving from the previous one).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "net/comm_tcp.h"
#include "net/comm.h"
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define TCP_SEG ((size_t)4 << 20)
#define HELLO_BYTES 24
#define RING_HELLO_BYTES 24
#define ENTRY_BYTES 64 /* port (2), host (62, NUL-terminated) */
static const char MAGIC[8] = {'T', 'I', 'D', 'E', 'n', 'e', 't', '1'};

struct tide_tcp {
    int rank, size;
    double timeout_s;
    const atomic_bool *_Atomic *cancel;
    int next, prev;   /* the ring: to rank + 1, from rank - 1 */
    int *star;        /* rank 0: star[k] rank k's rendezvous connection; others: star[0] rank 0's */
    uint64_t *off, *len; /* per rank: the part of the collective at hand */
    unsigned char *scratch; /* 2 TCP_SEG: the running sum and the part received */
};

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}
static uint64_t get64(const unsigned char *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

/* Where the ranks meet (comm_tcp.h, tide_tcp_open): MASTER_ADDR into host
 * (host_n bytes) and the port. */
static tide_status rendezvous_env(tide_ctx *ctx, char *host, size_t host_n, int *port) {
    const char *a = getenv("MASTER_ADDR");
    if (!a || !*a)
        return tide_err(ctx, TIDE_E_INVALID, "a torchrun-style launch needs MASTER_ADDR (the host of rank 0) and "
                        "MASTER_PORT");
    if (strlen(a) >= host_n) return tide_err(ctx, TIDE_E_INVALID, "MASTER_ADDR '%.40s...' is too long", a);
    snprintf(host, host_n, "%s", a);
    const char *name = "TIDE_MASTER_PORT", *p = getenv(name);
    int plus = 0;
    if (!p || !*p) {
        name = "MASTER_PORT";
        p = getenv(name);
        const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        plus = agent && (!strcmp(agent, "True") || !strcmp(agent, "1") || !strcmp(agent, "true"));
    }
    if (!p || !*p)
        return tide_err(ctx, TIDE_E_INVALID, "a torchrun-style launch needs MASTER_PORT (rank 0's port; "
                        "TIDE_MASTER_PORT overrides it)");
    char *end;
    long v = strtol(p, &end, 10);
    if (*end || v < 1 || v + plus > 65535)
        return tide_err(ctx, TIDE_E_INVALID, "%s '%s' is not a port (1 to 65535)", name, p);
    *port = (int)v + plus;
    return TIDE_OK;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_nonblock(fd);
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* One side of a transfer: len bytes at p, to or from fd (fd < 0: none). */
typedef struct tcp_io {
    int fd, peer;
    unsigned char *p;
    size_t left;
} tcp_io;

static bool cancelled(const tide_tcp *t) {
    if (!t->cancel) return false;
    const atomic_bool *f = atomic_load(t->cancel);
    return f && atomic_load(f);
}

/* Moves s (sent) and r (received) until both are done; fails when a peer
 * closes its end, on a socket error, when nothing moves for `limit` seconds
 * (the timeout, but for the joining's waits), or when the cancel flag is
 * set. */
static tide_status move(tide_tcp *t, tide_ctx *ctx, tcp_io *s, tcp_io *r, double limit, const char *call,
                        const char *what) {
    double last = tide_now();
    for (;;) {
        bool sd = !s || s->fd < 0 || !s->left, rd = !r || r->fd < 0 || !r->left;
        if (sd && rd) return TIDE_OK;
        struct pollfd pf[2];
        int n = 0, si = -1, ri = -1;
        if (!sd) {
            pf[n] = (struct pollfd){.fd = s->fd, .events = POLLOUT};
            si = n++;
        }
        if (!rd) {
            if (si >= 0 && pf[si].fd == r->fd) {
                pf[si].events |= POLLIN;
                ri = si;
            } else {
                pf[n] = (struct pollfd){.fd = r->fd, .events = POLLIN};
                ri = n++;
            }
        }
        int pr = poll(pf, (nfds_t)n, 50);
        if (pr < 0 && errno != EINTR)
            return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %s of %s: poll failed: %s", t->rank, t->size, call, what,
                            strerror(errno));
        bool moved = false;
        if (pr > 0 && ri >= 0 && (pf[ri].revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t k = recv(r->fd, r->p, r->left, 0);
            if (k == 0)
                return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %s of %s failed: rank %d closed its connection "
                                "(it failed or died)", t->rank, t->size, call, what, r->peer);
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %s of %s failed: receiving from rank %d: %s",
                                t->rank, t->size, call, what, r->peer, strerror(errno));
            if (k > 0) {
                r->p += k;
                r->left -= (size_t)k;
                moved = true;
            }
        }
        if (pr > 0 && si >= 0 && (pf[si].revents & (POLLOUT | POLLHUP | POLLERR)) && s->left) {
            ssize_t k = send(s->fd, s->p, s->left, MSG_NOSIGNAL);
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %s of %s failed: sending to rank %d: %s%s", t->rank,
                                t->size, call, what, s->peer, strerror(errno),
                                errno == EPIPE || errno == ECONNRESET ? " (it failed or died)" : "");
            if (k > 0) {
                s->p += k;
                s->left -= (size_t)k;
                moved = true;
            }
        }
        double tn = tide_now();
        if (moved) last = tn;
        if (cancelled(t))
            return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %s of %s abandoned: another stream of this rank failed",
                            t->rank, t->size, call, what);
        if (tn - last > limit)
            return tide_err(ctx, TIDE_E_IO, "rank %d of %d: %s of %s timed out after %.0f s: rank %d stopped "
                            "answering (died, or is stuck; TIDE_NET_TIMEOUT sets the limit)", t->rank, t->size, call,
                            what, tn - last, !rd ? r->peer : s->peer);
    }
}

static tide_status send_all(tide_tcp *t, tide_ctx *ctx, int fd, int peer, const void *p, size_t n, const char *call,
                            const char *what) {
    tcp_io s = {fd, peer, (unsigned char *)p, n};
    return move(t, ctx, &s, NULL, t->timeout_s, call, what);
}
static tide_status recv_all(tide_tcp *t, tide_ctx *ctx, int fd, int peer, void *p, size_t n, const char *call,
                            const char *what) {
    tcp_io r = {fd, peer, p, n};
    return move(t, ctx, NULL, &r, t->timeout_s, call, what);
}

/* ---- joining ---- */

/* A listening socket on port (0: the system picks), every address. */
static int listen_on(int port, char *why, size_t why_n) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    int rc = getaddrinfo(NULL, ps, &hints, &res);
    if (rc) {
        snprintf(why, why_n, "%s", gai_strerror(rc));
        return -1;
    }
    /* IPv6 first where the system has it (dual-stack takes IPv4 too) */
    int fd = -1, err = 0;
    for (int pass = 0; pass < 2 && fd < 0; pass++)
        for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
            if ((a->ai_family == AF_INET6) != (pass == 0)) continue;
            fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) {
                err = errno;
                continue;
            }
            int one = 1, zero = 0;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 256)) {
                err = errno;
                close(fd);
                fd = -1;
            }
        }
    freeaddrinfo(res);
    if (fd < 0) snprintf(why, why_n, "%s", strerror(err ? err : EADDRNOTAVAIL));
    else set_nonblock(fd);
    return fd;
}

static int local_port(int fd) {
    struct sockaddr_storage ss;
    socklen_t n = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &n)) return -1;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

/* The numeric address of fd's peer (peer) or of its own end. */
static void addr_of(int fd, bool peer, char *host, size_t n) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int rc = peer ? getpeername(fd, (struct sockaddr *)&ss, &len) : getsockname(fd, (struct sockaddr *)&ss, &len);
    if (rc || getnameinfo((struct sockaddr *)&ss, len, host, (socklen_t)n, NULL, 0, NI_NUMERICHOST))
        snprintf(host, n, "127.0.0.1");
}

/* A connection to host:port, retried until it is taken or the deadline
 * passes (the other side may not listen yet). */
static int dial(const char *host, int port, double deadline, char *why, size_t why_n) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int rc = getaddrinfo(host, ps, &hints, &res);
        if (rc) {
            snprintf(why, why_n, "cannot resolve '%s': %s", host, gai_strerror(rc));
            if (rc != EAI_AGAIN || tide_now() > deadline) return -1;
            sleep_ms(100);
            continue;
        }
        int err = 0;
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
            if (fd < 0) {
                err = errno;
                continue;
            }
            if (connect(fd, a->ai_addr, a->ai_addrlen) && errno != EINPROGRESS) {
                err = errno;
                close(fd);
                continue;
            }
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            double left = deadline - tide_now();
            int ms = left > 2 ? 2000 : left > 0 ? (int)(left * 1000) + 1 : 1;
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (poll(&pf, 1, ms) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) && !soerr) {
                freeaddrinfo(res);
                tune(fd);
                return fd;
            }
            err = soerr ? soerr : ETIMEDOUT;
            close(fd);
        }
        freeaddrinfo(res);
        snprintf(why, why_n, "cannot connect to %s port %d: %s", host, port, strerror(err));
        if (tide_now() > deadline) return -1;
        sleep_ms(50);
    }
}

/* The next connection on the listening socket lfd before the deadline (-1:
 * none came). */
static int take(int lfd, double deadline) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            tune(fd);
            return fd;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) return -1;
        double left = deadline - tide_now();
        if (left <= 0) return -1;
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        poll(&pf, 1, left > 0.2 ? 200 : (int)(left * 1000) + 1);
    }
}

/* Reads n bytes from a connection that has not proved itself yet, for at
 * most `limit` seconds: false (and nothing said) when it does not. */
static bool read_hello(int fd, unsigned char *buf, size_t n, double limit) {
    double end = tide_now() + limit;
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, buf + got, n - got, 0);
        if (k == 0) return false;
        if (k > 0) {
            got += (size_t)k;
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
        double left = end - tide_now();
        if (left <= 0) return false;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        poll(&pf, 1, left > 0.2 ? 200 : (int)(left * 1000) + 1);
    }
    return true;
}

static uint64_t draw_job(void) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
        close(fd);
    }
    if (!v) v = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    return v | 1; /* 0 means "refused" */
}

/* Rank 0: every other rank's hello, then the table to each. */
static tide_status meet_as_root(tide_tcp *t, tide_ctx *ctx, int lfd, int ring_port, double deadline, char *table,
                                uint64_t *job, const char *where) {
    int n = t->size, have = 1;
    while (have < n) {
        int fd = take(lfd, deadline);
        if (fd < 0)
            return tide_err(ctx, TIDE_E_IO, "rank 0 of %d: %d of the %d ranks joined at %s within %.0f s "
                            "(TIDE_NET_TIMEOUT sets the limit): start every rank with the same MASTER_ADDR, "
                            "MASTER_PORT and WORLD_SIZE", n, have, n, where, t->timeout_s);
        unsigned char h[HELLO_BYTES];
        if (!read_hello(fd, h, sizeof h, 10) || memcmp(h, MAGIC, 8)) {
            close(fd); /* not a rank of tide's */
            continue;
        }
        uint32_t sz = get32(h + 8), rk = get32(h + 12), port = get32(h + 16);
        char why[160] = "";
        if (sz != (uint32_t)n)
            snprintf(why, sizeof why, "rank %u was started with %u ranks, rank 0 with %d", rk, sz, n);
        else if (rk == 0 || rk >= (uint32_t)n || port == 0 || port > 65535)
            snprintf(why, sizeof why, "a process said it is rank %u of %u", rk, sz);
        else if (t->star[rk] >= 0)
            snprintf(why, sizeof why, "two processes said they are rank %u", rk);
        if (*why) {
            /* tell it why (job 0: refused), then fail this rank too */
            unsigned char r[16 + 160] = {0};
            memcpy(r, MAGIC, 8);
            snprintf((char *)r + 16, 160, "%s", why);
            tcp_io s = {fd, (int)rk, r, sizeof r};
            move(t, ctx, &s, NULL, 2, "joining", "the ranks");
            close(fd);
            return tide_err(ctx, TIDE_E_INVALID, "rank 0 of %d: %s: every rank needs the same WORLD_SIZE and a "
                            "rank of its own", n, why);
        }
        t->star[rk] = fd;
        char *e = table + 16 + (size_t)rk * ENTRY_BYTES;
        e[0] = (char)(port & 0xff);
        e[1] = (char)(port >> 8);
        addr_of(fd, true, e + 2, ENTRY_BYTES - 2);
        have++;
    }
    *job = draw_job();
    memcpy(table, MAGIC, 8);
    put64((unsigned char *)table + 8, *job);
    table[16] = (char)(ring_port & 0xff);
    table[17] = (char)(ring_port >> 8);
    for (int k = 1; k < n; k++) {
        /* rank 0's ring address: the one this rank reached it at */
        addr_of(t->star[k], false, table + 18, ENTRY_BYTES - 2);
        tide_status st = send_all(t, ctx, t->star[k], k, table, 16 + (size_t)n * ENTRY_BYTES, "joining",
                                  "the ranks' table");
        if (st) return st;
    }
    return TIDE_OK;
}

/* Ranks 1..N-1: the hello to rank 0, then its table. */
static tide_status meet_as_rank(tide_tcp *t, tide_ctx *ctx, const char *host, int port, int ring_port,
                                double deadline, char *table, uint64_t *job, const char *where) {
    char why[256];
    int fd = dial(host, port, deadline, why, sizeof why);
    if (fd < 0)
        return tide_err(ctx, TIDE_E_IO, "rank %d of %d: rank 0 did not answer at %s within %.0f s: %s "
                        "(TIDE_NET_TIMEOUT sets the limit)", t->rank, t->size, where, t->timeout_s, why);
    t->star[0] = fd;
    unsigned char h[HELLO_BYTES] = {0};
    memcpy(h, MAGIC, 8);
    put32(h + 8, (uint32_t)t->size);
    put32(h + 12, (uint32_t)t->rank);
    put32(h + 16, (uint32_t)ring_port);
    tide_status st = send_all(t, ctx, fd, 0, h, sizeof h, "joining", "the ranks");
    if (st) return st;
    /* rank 0 answers once every rank has come: wait up to the deadline */
    unsigned char head[16];
    const double left = deadline - tide_now();
    tcp_io r = {fd, 0, head, sizeof head};
    st = move(t, ctx, NULL, &r, left > 1 ? left : 1, "joining", "the ranks' table");
    if (st) return st;
    if (memcmp(head, MAGIC, 8))
        return tide_err(ctx, TIDE_E_IO, "rank %d of %d: the process at %s is not a rank 0 of tide's", t->rank,
                        t->size, where);
    *job = get64(head + 8);
    if (!*job) {
        char msg[161] = {0};
        recv_all(t, ctx, fd, 0, msg, 160, "joining", "rank 0's refusal");
        return tide_err(ctx, TIDE_E_INVALID, "rank %d of %d: rank 0 refused this rank: %s", t->rank, t->size, msg);
    }
    memcpy(table, head, 16);
    return recv_all(t, ctx, fd, 0, table + 16, (size_t)t->size * ENTRY_BYTES, "joining", "the ranks' table");
}

tide_status tide_tcp_open(tide_ctx *ctx, int rank, int size, double timeout_s, const atomic_bool *_Atomic *cancel,
                          tide_tcp **out) {
    *out = NULL;
    tide_tcp *t = tide_calloc(1, sizeof *t);
    if (!t) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    t->rank = rank;
    t->size = size;
    t->timeout_s = timeout_s;
    t->cancel = cancel;
    t->next = t->prev = -1;
    t->star = tide_malloc((size_t)size * sizeof *t->star);
    t->off = tide_malloc((size_t)size * sizeof *t->off);
    t->len = tide_malloc((size_t)size * sizeof *t->len);
    if (!t->star || !t->off || !t->len) {
        tide_tcp_close(t);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    }
    for (int k = 0; k < size; k++) t->star[k] = -1;
    if (size == 1) {
        *out = t;
        return TIDE_OK;
    }
    char host[256], where[300], why[160];
    int port = 0;
    tide_status st = rendezvous_env(ctx, host, sizeof host, &port);
    if (st) {
        tide_tcp_close(t);
        return st;
    }
    snprintf(where, sizeof where, "%s port %d", host, port);
    char *table = tide_calloc(1, 16 + (size_t)size * ENTRY_BYTES);
    t->scratch = tide_malloc(2 * TCP_SEG);
    if (!table || !t->scratch) {
        tide_free(table);
        tide_tcp_close(t);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    }
    double deadline = tide_now() + timeout_s;
    int ring = listen_on(0, why, sizeof why), root = -1;
    uint64_t job = 0;
    if (ring < 0) {
        st = tide_err(ctx, TIDE_E_IO, "rank %d of %d: cannot listen for the ring: %s", rank, size, why);
    } else if (rank == 0) {
        root = listen_on(port, why, sizeof why);
        if (root < 0)
            st = tide_err(ctx, TIDE_E_IO, "rank 0 of %d: cannot listen on port %d for the other ranks: %s%s", size,
                          port, why, strstr(why, "in use") ? " (another job holds it: set MASTER_PORT, or "
                          "TIDE_MASTER_PORT, to a free port)" : "");
        else
            st = meet_as_root(t, ctx, root, local_port(ring), deadline, table, &job, where);
    } else {
        st = meet_as_rank(t, ctx, host, port, local_port(ring), deadline, table, &job, where);
    }
    /* the ring: connect to the next rank, take the previous one */
    if (!st) {
        int nx = (rank + 1) % size, pv = (rank + size - 1) % size;
        const char *e = table + 16 + (size_t)nx * ENTRY_BYTES;
        int nport = (unsigned char)e[0] | (unsigned char)e[1] << 8;
        char nhost[ENTRY_BYTES];
        snprintf(nhost, sizeof nhost, "%s", e + 2);
        t->next = dial(nhost, nport, deadline, why, sizeof why);
        if (t->next < 0) {
            st = tide_err(ctx, TIDE_E_IO, "rank %d of %d: cannot reach rank %d for the ring: %s", rank, size, nx, why);
        } else {
            unsigned char h[RING_HELLO_BYTES] = {0};
            memcpy(h, MAGIC, 8);
            put64(h + 8, job);
            put32(h + 16, (uint32_t)rank);
            st = send_all(t, ctx, t->next, nx, h, sizeof h, "joining", "the ring");
        }
        while (!st && t->prev < 0) {
            int fd = take(ring, deadline);
            if (fd < 0) {
                st = tide_err(ctx, TIDE_E_IO, "rank %d of %d: rank %d did not join the ring within %.0f s", rank,
                              size, pv, timeout_s);
                break;
            }
            unsigned char h[RING_HELLO_BYTES];
            if (read_hello(fd, h, sizeof h, 10) && !memcmp(h, MAGIC, 8) && get64(h + 8) == job &&
                get32(h + 16) == (uint32_t)pv)
                t->prev = fd;
            else
                close(fd);
        }
    }
    if (ring >= 0) close(ring);
    if (root >= 0) close(root);
    tide_free(table);
    if (st) {
        tide_tcp_close(t);
        return st;
    }
    *out = t;
    return TIDE_OK;
}

void tide_tcp_shutdown(tide_tcp *t) {
    if (!t) return;
    if (t->next >= 0) shutdown(t->next, SHUT_RDWR);
    if (t->prev >= 0) shutdown(t->prev, SHUT_RDWR);
    for (int k = 0; t->star && k < t->size; k++)
        if (t->star[k] >= 0) shutdown(t->star[k], SHUT_RDWR);
}

void tide_tcp_close(tide_tcp *t) {
    if (!t) return;
    close_fd(&t->next);
    close_fd(&t->prev);
    for (int k = 0; t->star && k < t->size; k++) close_fd(&t->star[k]);
    tide_free(t->star);
    tide_free(t->off);
    tide_free(t->len);
    tide_free(t->scratch);
    tide_free(t);
}

/* ---- collectives ---- */

/* Parts of `total` units: ceil(total / size) each, the last short or
 * empty (tide_comm_shard_rows), in units of `unit`. */
static void parts(tide_tcp *t, int64_t total, uint64_t unit) {
    for (int k = 0; k < t->size; k++) {
        int64_t r0, n;
        tide_comm_shard_rows(total, t->size, k, &r0, &n);
        t->off[k] = (uint64_t)r0 * unit;
        t->len[k] = (uint64_t)n * unit;
    }
}

static void add_elems(void *dst, const void *a, const void *b, uint64_t n, int elem) {
    if (elem == 8) {
        double *d = dst;
        const double *x = a, *y = b;
        for (uint64_t i = 0; i < n; i++) d[i] = x[i] + y[i];
    } else {
        float *d = dst;
        const float *x = a, *y = b;
        for (uint64_t i = 0; i < n; i++) d[i] = x[i] + y[i];
    }
}

static uint64_t clamp_seg(uint64_t len, uint64_t at, uint64_t seg) {
    return len > at ? (len - at < seg ? len - at : seg) : 0;
}

/* Ring reduce-scatter of the parts t->off/len (elements of elem bytes) of
 * in: this rank's part of the sum into own_out (which may be its part of
 * in). Step s of each segment sends part rank-s-1 (from in at step 0, else
 * the running sum) to the next rank and receives part rank-s-2 from the
 * previous one, adding this rank's own. */
static tide_status ring_rs(tide_tcp *t, tide_ctx *ctx, const void *in, void *own_out, int elem, const char *call,
                           const char *what) {
    int n = t->size, r = t->rank;
    uint64_t seg = TCP_SEG / (uint64_t)elem, most = 0;
    for (int k = 0; k < n; k++) most = t->len[k] > most ? t->len[k] : most;
    unsigned char *acc = t->scratch, *tmp = t->scratch + TCP_SEG;
    const unsigned char *src = in;
    for (uint64_t at = 0; at < most; at += seg)
        for (int s = 0; s < n - 1; s++) {
            int sc = ((r - s - 1) % n + n) % n, rc = ((r - s - 2) % n + n) % n;
            uint64_t sn = clamp_seg(t->len[sc], at, seg), rn = clamp_seg(t->len[rc], at, seg);
            tcp_io so = {t->next, (r + 1) % n,
                         s == 0 ? (unsigned char *)src + (t->off[sc] + at) * (uint64_t)elem : acc,
                         sn * (uint64_t)elem};
            tcp_io ri = {t->prev, (r + n - 1) % n, tmp, rn * (uint64_t)elem};
            tide_status st = move(t, ctx, &so, &ri, t->timeout_s, call, what);
            if (st) return st;
            const unsigned char *mine = src + (t->off[rc] + at) * (uint64_t)elem;
            void *dst = s == n - 2 ? (unsigned char *)own_out + at * (uint64_t)elem : (void *)acc;
            add_elems(dst, tmp, mine, rn, elem);
        }
    return TIDE_OK;
}

/* Ring all-gather in place of the parts t->off/len (bytes) of buf, this
 * rank's already there: step s sends part rank-s, receives part rank-s-1. */
static tide_status ring_ag(tide_tcp *t, tide_ctx *ctx, void *buf, const char *call, const char *what) {
    int n = t->size, r = t->rank;
    unsigned char *b = buf;
    for (int s = 0; s < n - 1; s++) {
        int sc = ((r - s) % n + n) % n, rc = ((r - s - 1) % n + n) % n;
        tcp_io so = {t->next, (r + 1) % n, b + t->off[sc], t->len[sc]};
        tcp_io ri = {t->prev, (r + n - 1) % n, b + t->off[rc], t->len[rc]};
        tide_status st = move(t, ctx, &so, &ri, t->timeout_s, call, what);
        if (st) return st;
    }
    return TIDE_OK;
}

tide_status tide_tcp_allreduce(tide_tcp *t, tide_ctx *ctx, void *x, uint64_t n, int elem, const char *what) {
    if (t->size == 1 || !n) return TIDE_OK;
    parts(t, (int64_t)n, 1);
    tide_status st = ring_rs(t, ctx, x, (unsigned char *)x + t->off[t->rank] * (uint64_t)elem, elem, "all-reduce",
                             what);
    if (st) return st;
    for (int k = 0; k < t->size; k++) {
        t->off[k] *= (uint64_t)elem;
        t->len[k] *= (uint64_t)elem;
    }
    return ring_ag(t, ctx, x, "all-reduce", what);
}

tide_status tide_tcp_reduce_scatter_f32(tide_tcp *t, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                        uint64_t row_elems, const char *what) {
    parts(t, rows, row_elems);
    uint64_t have = t->len[t->rank], want = (uint64_t)((rows + t->size - 1) / t->size) * row_elems;
    if (t->size == 1) {
        memmove(shard, x, have * sizeof *x);
    } else {
        tide_status st = ring_rs(t, ctx, x, shard, 4, "reduce-scatter", what);
        if (st) return st;
    }
    if (have < want) memset(shard + have, 0, (want - have) * sizeof *shard);
    return TIDE_OK;
}

tide_status tide_tcp_allgather_rows(tide_tcp *t, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                    uint64_t row_bytes, const char *what) {
    parts(t, rows, row_bytes);
    memmove((unsigned char *)x + t->off[t->rank], shard, t->len[t->rank]);
    return t->size == 1 ? TIDE_OK : ring_ag(t, ctx, x, "all-gather", what);
}

tide_status tide_tcp_gather_rows(tide_tcp *t, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                                 uint64_t row_bytes, const char *what) {
    parts(t, rows, row_bytes);
    if (t->rank > 0)
        return send_all(t, ctx, t->star[0], 0, shard, t->len[t->rank], "gather", what);
    memmove(x, shard, t->len[0]);
    for (int k = 1; k < t->size; k++) {
        tide_status st = recv_all(t, ctx, t->star[k], k, (unsigned char *)x + t->off[k], t->len[k], "gather", what);
        if (st) return st;
    }
    return TIDE_OK;
}

tide_status tide_tcp_bcast(tide_tcp *t, tide_ctx *ctx, void *buf, size_t n, const char *what) {
    if (t->rank > 0) return recv_all(t, ctx, t->star[0], 0, buf, n, "broadcast", what);
    for (int k = 1; k < t->size; k++) {
        tide_status st = send_all(t, ctx, t->star[k], k, buf, n, "broadcast", what);
        if (st) return st;
    }
    return TIDE_OK;
}
