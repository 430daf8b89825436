/*
 * http.h - `tide serve`'s HTTP server: an OpenAI-compatible API over a
 * tide_pool, several models under one device budget (http.c).
 */
#ifndef TIDE_SERVE_HTTP_H
#define TIDE_SERVE_HTTP_H

#include "tide.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct serve_model_spec {
    const char *name, *dir;
    const char *lora; /* --lora NAME=DIR: its adapter directory, or NULL */
} serve_model_spec;

typedef struct serve_opts {
    const serve_model_spec *models;
    int n_models;
    tide_pool *pool;              /* offered the models (tide_pool_offer_model): it loads them */
    const char *host;             /* address to bind (default 127.0.0.1) */
    int port;                     /* 0: any free port (printed) */
    const char *api_key;          /* NULL: no authorization asked */
    int max_queue;                /* requests accepted per model at once (running and
                                     waiting); more get 503 */
    double shutdown_grace;        /* seconds the requests in flight get on SIGTERM/SIGINT */
    double timeout;               /* seconds a request's headers and body may take from its first byte */
    int keep_alive;               /* seconds an idle connection is kept */
    int max_connections;          /* open connections at once (more are closed unanswered) */
    int threads;                  /* the daemon's event-loop threads */
    int per_client;               /* connections per client address (0: no limit; loopback never limited) */
    bool quiet;
} serve_opts;

/* Serves until SIGINT or SIGTERM (which the caller has blocked in every
 * thread: the server waits for them with sigwait), then stops accepting,
 * lets the requests in flight finish for up to shutdown_grace seconds (a
 * second signal cuts that short), cancels those still running at their next
 * token (streams end with a last chunk and [DONE]), and frees the pool (with
 * the models it loaded). Returns the
 * process exit status: 0 after a signal, 1 when the server cannot start
 * (the message printed). */
int serve_http_run(const serve_opts *o, const sigset_t *signals);

#endif
