/*
 * http_int.h - the pieces of `tide serve` (http.c, http_json.c, http_gen.c)
 * that they share: the server, its models, a parsed request, an error.
 *
 * The HTTP front end is part of the command-line program, not of libtide:
 * it uses the CLI's text options (cli/textgen.h) and libmicrohttpd, and the
 * library only through tide.h (the pool, which loads and evicts the models;
 * the tokenizer, the text generation, the sampler). It translates requests
 * and answers.
 */
#ifndef TIDE_SERVE_HTTP_INT_H
#define TIDE_SERVE_HTTP_INT_H

#include "cli/textgen.h"
#include "cli/serve/http.h"
#include "tide.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define SERVE_MAX_BODY ((size_t)1 << 20) /* request bodies above this: 413 */
#define SERVE_DEFAULT_MAX_TOKENS 16      /* /v1/completions without max_tokens */
#define SERVE_MAX_BATCH 4                /* --max-batch by default (fewer where the KV cache's rows would
                                            take over a quarter of the host memory available) */
#define SERVE_CHAT_MAX_TOKENS 256        /* /v1/chat/completions without it */

/* One --model NAME=DIR: offered to the pool, which loads it on its first
 * request and evicts it when another needs the room (src/serve/pool_models.c).
 * Its text (tokenizer, chat template, stop ids) is the server's, opened on
 * its first request and kept. */
typedef struct serve_model {
    const char *name, *dir;
    pthread_mutex_t mu;           /* its text's opening, and the tokenizer's encoder (one thread) */
    tide_ctx *ctx;                /* the tokenizer's errors */
    tide_tokenizer *tok;          /* NULL until its first request */
    tide_chat_template *tmpl;     /* NULL: no chat template (chat gets 400) */
    char tmpl_err[256];           /* why there is none */
    int32_t *stop_ids, *chat_stop_ids; /* EOS ids; and the end of turn too */
    int n_stop_ids, n_chat_stop_ids;
    atomic_int inflight;          /* requests accepted and not yet answered */
    atomic_llong requests, prompt_tokens, gen_tokens;
} serve_model;

/* Counters of /metrics: requests by endpoint and status. */
#define SERVE_MAX_COUNTERS 64
typedef struct serve_counter {
    const char *endpoint;
    int status;
    long long n;
} serve_counter;

/* The deadline of a whole request (http_watch.c). */
typedef struct serve_watch serve_watch;
typedef struct serve_watched serve_watched;
serve_watch *serve_watch_start(double timeout, int per_client); /* NULL: out of memory or threads */
void serve_watch_stop(serve_watch *w);
struct sockaddr;
serve_watched *serve_watch_add(serve_watch *w, int fd, const struct sockaddr *client); /* accepted; NULL: unwatched */
bool serve_watch_over(serve_watch *w, serve_watched *c);  /* past the per-client limit */
void serve_watch_remove(serve_watch *w, serve_watched *c);
void serve_watch_busy(serve_watch *w, serve_watched *c, bool busy); /* request whole / answered */
long long serve_watch_cut(serve_watch *w);               /* connections cut off so far */

typedef struct serve_server {
    serve_opts o;
    serve_watch *watch;
    serve_model *models;
    int n_models;
    struct MHD_Daemon *d;
    atomic_bool stopping;         /* shutting down: generations stop at their next token */
    atomic_llong next_id;
    atomic_int streams;           /* producer threads alive */
    atomic_int requests_open;     /* requests begun (headers read) and not yet completed */
    atomic_int suspended;         /* connections suspended (a job, or a stream waiting for an event) */
    pthread_mutex_t mmu;          /* the counters */
    serve_counter counters[SERVE_MAX_COUNTERS];
    int n_counters;
} serve_server;

/* An error answer: status, OpenAI's error type, message. */
typedef struct serve_error {
    int status;
    const char *type;             /* "invalid_request_error", "not_found_error", ... */
    char msg[512];
} serve_error;

/* Fills *e and returns -1. */
int serve_fail(serve_error *e, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A parsed /v1/completions or /v1/chat/completions request. */
typedef struct serve_request {
    bool chat, stream;
    bool include_usage;           /* stream_options.include_usage */
    serve_model *model;
    char *prompt;                 /* completions: the prompt (malloc'd) */
    tide_chat_msg *msgs;          /* chat: roles and contents (malloc'd) */
    int n_msgs;
    int max_tokens;               /* 0: the endpoint's default */
    tide_sampler_opts so;
    bool seed_given;
    char *stops[CLI_MAX_STOPS];   /* malloc'd */
    int n_stops;
} serve_request;

/* http_json.c: parses body (len bytes) as a request of the chat endpoint or
 * the completions one. Returns 0, or -1 with *e filled (400 malformed JSON or
 * a field of the wrong type or value, naming it; 404 unknown model). */
int serve_parse_request(serve_server *s, const char *body, size_t len, bool chat, serve_request *r, serve_error *e);
void serve_request_free(serve_request *r);

/* JSON texts (malloc'd, NULL when out of memory). */
char *serve_error_json(const serve_error *e);
char *serve_models_json(serve_server *s);
/* A whole answer (stream false). */
char *serve_answer_json(const serve_request *r, const char *id, time_t created, const char *text,
                        const char *finish, int n_prompt, int n_gen);
/* One event of a stream: a piece of text (finish NULL), or the last one
 * (text NULL, finish set); `first` adds the chat delta's role. */
char *serve_chunk_json(const serve_request *r, const char *id, time_t created, const char *text, const char *finish,
                       bool first);
/* With stream_options.include_usage, OpenAI's last chunk before [DONE]: no
 * choices, the request's usage (the chunks before carry "usage": null). */
char *serve_usage_chunk_json(const serve_request *r, const char *id, time_t created, int n_prompt, int n_gen);

/* A request made ready to run (http_gen.c): the prompt's ids, its sampler. */
typedef struct serve_prepared {
    serve_server *s;
    serve_model *m;
    tide_pool_workload *w;        /* m's, held loaded (tide_pool_acquire) until
                                     serve_prepared_free */
    int ctx_len;                  /* its KV cache's positions */
    int32_t *ids;
    int n_ids;
    int max_new;
    tide_sampler *sampler;
    tide_ctx *ctx;                /* the sampler's */
    const int32_t *stop_ids;
    int n_stop_ids;
    tide_textgen *out;            /* the answer's text, stop strings cut */
} serve_prepared;

/* What a run gives. */
typedef struct serve_result {
    const char *text;             /* the answer (prep->out's, valid while prep lives) */
    const char *finish;           /* "stop" or "length" */
    int n_prompt, n_gen;
    bool cancelled;               /* stopped by the client leaving or by shutdown */
} serve_result;

/* Acquires the request's model from the pool (tide_pool_acquire: 503 when
 * there is no room, 500 when it cannot be loaded), renders
 * and encodes its prompt, checks it against the context and makes its
 * sampler. Returns 0, or -1 with *e filled. */
int serve_prepare(serve_server *s, const serve_request *r, serve_prepared *p, serve_error *e);
/* Runs a prepared request through the pool. Pieces of text go to emit (may
 * be NULL) as they come; *cancel (may be NULL) or the server stopping ends
 * it at the next token. Returns 0, or -1 with *e filled (500). */
int serve_run(serve_server *s, serve_prepared *p, void (*emit)(void *user, const char *piece, size_t n), void *user,
              const atomic_bool *cancel, serve_result *res, serve_error *e);
void serve_prepared_free(serve_prepared *p);
/* Frees the models' text. */
void serve_models_free(serve_server *s);

/* http.c: counts one answer for /metrics. */
void serve_count(serve_server *s, const char *endpoint, int status);
/* The Prometheus text of /metrics (malloc'd). */
char *serve_metrics_text(serve_server *s);

#endif
