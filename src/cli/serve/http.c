/*
 * http.c - `tide serve`'s HTTP server on libmicrohttpd: routing,
 * authorization, request bodies, streams, /metrics and the run loop.
 *
 * Threads. The daemon runs a few event-loop threads (epoll, --http-threads),
 * never a thread per connection, so thousands of idle connections cost a
 * descriptor each and no thread. No daemon thread waits for a model: a
 * generation request is parsed on the daemon's thread, then its connection is
 * suspended while a job thread of its own prepares it (acquires the model,
 * maybe loading it; encodes the prompt) and, when it is not streamed, runs
 * it; the job resumes the connection and the daemon queues the answer. A
 * stream has a producer thread of its own, which generates and turns each
 * piece of text into a server-sent event, and a bounded queue of events
 * (STREAM_QUEUE) that the daemon drains into the socket (stream_read): when
 * the queue is empty the connection is suspended and the producer's next
 * event resumes it, so a slow client holds back its own producer only.
 *
 * A stream's life:
 *   handle_generate: prepared, producer started, response queued
 *   producer: events pushed (waiting while the queue is full), then the
 *     last chunk (and the usage chunk when asked for) and "data: [DONE]",
 *     done set
 *   stream_read: events popped; the connection suspended while the queue
 *     is empty (wake() resumes it); end of stream once done and empty
 *   stream_free (the daemon, when the response is destroyed: answer
 *     complete, or the client gone): cancel set, so the producer's next
 *     token ends its generation and a full queue stops blocking it; the
 *     producer joined; everything freed.
 * A client that leaves mid-stream therefore costs at most one token of its
 * model's time, and never blocks another connection.
 *
 * Shutdown (SIGINT/SIGTERM, taken by sigwait on the main thread): the
 * daemon stops accepting (quiesced); the requests in flight run on for up to
 * --shutdown-grace seconds; then stopping is set, so every generation still
 * running ends at its next token (a stream with its last chunk,
 * finish_reason "length", and [DONE]), and those last events get up to
 * SHUTDOWN_DRAIN seconds to reach their clients; then the daemon is stopped
 * (idle keep-alive connections closed), and the pool and the models are
 * freed. A second signal during either wait skips the rest of it.
 */
#include "cli/serve/http_int.h"

#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STREAM_QUEUE 64 /* events a stream's producer may be ahead of its client */

/* ---------------------------------------------------------------- text buffers */

/* A growing text (malloc'd: the daemon frees bodies with free()), p[len]
 * NUL once anything was added; a failed allocation sets oom and stops
 * appending. Start from {0}. */
typedef struct textbuf {
    char *p;
    size_t len, cap;
    bool oom;
} textbuf;

static void tb_add(textbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void tb_printf(textbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(textbuf *b, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line) b->oom = true; /* no line of /metrics is this long */
    else tb_add(b, line, (size_t)n);
}

/* ---------------------------------------------------------------- counters and /metrics */

void serve_count(serve_server *s, const char *endpoint, int status) {
    pthread_mutex_lock(&s->mmu);
    int i = 0;
    while (i < s->n_counters && !(s->counters[i].status == status && !strcmp(s->counters[i].endpoint, endpoint))) i++;
    if (i == s->n_counters && i < SERVE_MAX_COUNTERS) s->counters[s->n_counters++] = (serve_counter){endpoint, status, 0};
    if (i < s->n_counters) s->counters[i].n++;
    pthread_mutex_unlock(&s->mmu);
}

/* One metric's HELP and TYPE lines. */
static void tb_head(textbuf *b, const char *name, const char *type, const char *help) {
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

char *serve_metrics_text(serve_server *s) {
    textbuf b = {0};
    tb_head(&b, "tide_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
    pthread_mutex_lock(&s->mmu);
    for (int i = 0; i < s->n_counters; i++)
        tb_printf(&b, "tide_requests_total{endpoint=\"%s\",status=\"%d\"} %lld\n", s->counters[i].endpoint,
                  s->counters[i].status, s->counters[i].n);
    pthread_mutex_unlock(&s->mmu);
    static const struct {
        const char *name, *type, *help;
    } per_model[] = {
        {"tide_model_loaded", "gauge", "1 when the model is loaded (on its first request, until evicted)."},
        {"tide_model_evictions_total", "counter", "Times the model was evicted to make room for another."},
        {"tide_tokens_generated_total", "counter", "Tokens generated."},
        {"tide_prompt_tokens_total", "counter", "Prompt tokens prefilled."},
        {"tide_model_requests_total", "counter", "Generations completed."},
        {"tide_queue_depth", "gauge", "Requests accepted and not yet answered (running or waiting)."},
        {"tide_model_waiting", "gauge", "Requests waiting for the model's previous ones, room or a turn."},
        {"tide_model_share_bytes", "gauge", "Device bytes the pool's last partition gave the model."},
        {"tide_model_held_bytes", "gauge", "Device bytes the model holds now."},
        {"tide_model_min_bytes", "gauge", "The model's minimum device bytes."},
        {"tide_model_replans_total", "counter", "Share changes applied to the model (its plans made again)."},
        {"tide_model_drifted_total", "counter", "Requests whose measured time was over 30% from the prediction."},
        {"tide_model_batches_total", "counter", "Batches of several of its requests run together (one forward per step)."},
        {"tide_model_batched_requests_total", "counter", "Requests that ran in those batches."},
    };
    enum { N_PER = sizeof per_model / sizeof per_model[0] };
    /* a snapshot of each model (the pool's: loaded, evictions, its workload) */
    tide_pool_model_info info[s->n_models ? s->n_models : 1];
    for (int i = 0; i < s->n_models; i++) tide_pool_model_info_get(s->o.pool, s->models[i].name, &info[i]);
    for (int k = 0; k < N_PER; k++) {
        tb_head(&b, per_model[k].name, per_model[k].type, per_model[k].help);
        for (int i = 0; i < s->n_models; i++) {
            serve_model *m = &s->models[i];
            const tide_pool_workload_stats ws = info[i].stats;
            double v = 0;
            switch (k) {
            case 0: v = info[i].loaded; break;
            case 1: v = (double)info[i].evictions; break;
            case 2: v = (double)atomic_load(&m->gen_tokens); break;
            case 3: v = (double)atomic_load(&m->prompt_tokens); break;
            case 4: v = (double)atomic_load(&m->requests); break;
            case 5: v = atomic_load(&m->inflight); break;
            case 6: v = ws.waiting; break;
            case 7: v = (double)ws.share_bytes; break;
            case 8: v = (double)ws.held_bytes; break;
            case 9: v = (double)ws.min_bytes; break;
            case 10: v = (double)ws.replans; break;
            case 11: v = (double)ws.drifted; break;
            case 12: v = (double)ws.batches; break;
            default: v = (double)ws.batched_requests; break;
            }
            tb_printf(&b, "%s{model=\"%s\"} %.17g\n", per_model[k].name, m->name, v);
        }
    }
    tide_pool_stats ps;
    tide_pool_stats_get(s->o.pool, &ps);
    const struct {
        const char *name, *type, *help;
        double v;
    } pool[] = {
        {"tide_pool_budget_bytes", "gauge", "The device budget shared by every model.", (double)ps.budget_bytes},
        {"tide_pool_held_bytes", "gauge", "Device bytes held by the models now.", (double)ps.held_bytes},
        {"tide_pool_peak_held_bytes", "gauge", "The most device bytes held at any instant.", (double)ps.peak_held_bytes},
        {"tide_pool_workloads", "gauge", "Models in the pool (loaded).", ps.n_workloads},
        {"tide_evictions_total", "counter", "Models evicted to make room for another (--max-loaded, the budget).",
         (double)ps.evictions},
        {"tide_pool_time_sliced", "gauge", "1 when one model holds the budget at a time.", ps.time_sliced},
        {"tide_pool_partitions_total", "counter", "Re-partitions of the budget.", (double)ps.partitions},
        {"tide_replans_total", "counter", "Share changes applied to a model.", (double)ps.replans},
        {"tide_drifted_total", "counter", "Requests whose measured time was over 30% from the prediction.",
         (double)ps.drifted},
        {"tide_pool_waits_total", "counter", "Requests that waited for room or their turn.", (double)ps.waits},
        {"tide_pool_requests_total", "counter", "Requests the pool completed.", (double)ps.requests},
        {"tide_pool_batches_total", "counter", "Batches of several requests of one model run together.",
         (double)ps.batches},
    };
    for (size_t k = 0; k < sizeof pool / sizeof pool[0]; k++) {
        tb_head(&b, pool[k].name, pool[k].type, pool[k].help);
        tb_printf(&b, "%s %.17g\n", pool[k].name, pool[k].v);
    }
    if (b.oom) free(b.p);
    return b.oom ? NULL : b.p;
}

/* ---------------------------------------------------------------- answers */

/* Queues a response with body (taken: freed by the daemon) and counts it. */
static enum MHD_Result answer(serve_server *s, struct MHD_Connection *c, const char *endpoint, int status,
                              char *body, const char *type) {
    if (!body) {
        status = 500;
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
        type = "application/json";
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    serve_count(s, endpoint, status);
    return rc;
}

static enum MHD_Result answer_error(serve_server *s, struct MHD_Connection *c, const char *endpoint,
                                    const serve_error *e) {
    return answer(s, c, endpoint, e->status, serve_error_json(e), "application/json");
}

/* An error answer after which the connection is closed. */
static enum MHD_Result answer_close(serve_server *s, struct MHD_Connection *c, const char *endpoint,
                                    const serve_error *e) {
    char *body = serve_error_json(e);
    if (!body) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)e->status, r);
    MHD_destroy_response(r);
    serve_count(s, endpoint, e->status);
    return rc;
}

/* ---------------------------------------------------------------- streams */

typedef struct event {
    struct event *next;
    size_t len;
    char data[];
} event;

typedef struct stream {
    serve_server *s;
    serve_request req;
    serve_prepared prep;
    char id[48];
    time_t created;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    event *head, *tail;
    int n_events;
    size_t off;                   /* bytes of head already read */
    bool done;                    /* the producer pushed its last event */
    bool first;                   /* no chunk sent yet */
    bool suspended;               /* the connection waits for an event (stream_read suspended it) */
    struct MHD_Connection *c;
    atomic_bool cancel;
} stream;

/* Resumes st's connection if stream_read suspended it for want of an event
 * (st->mu held). */
static void wake(stream *st) {
    if (!st->suspended) return;
    st->suspended = false;
    atomic_fetch_sub(&st->s->suspended, 1);
    MHD_resume_connection(st->c);
}

/* Appends "data: JSON\n\n" (json taken), waiting while the queue is full;
 * dropped once the stream is cancelled. */
static void push(stream *st, char *json) {
    size_t n = json ? strlen(json) : 0;
    event *ev = json ? malloc(sizeof *ev + n + 9) : NULL;
    if (ev) {
        ev->next = NULL;
        ev->len = (size_t)sprintf(ev->data, "data: %s\n\n", json);
    }
    free(json);
    pthread_mutex_lock(&st->mu);
    /* a client that reads nothing holds its producer here; on shutdown the
     * event is dropped after a tenth of a second (the daemon then closes the
     * connection, which cancels the stream) */
    bool drop = false;
    while (st->n_events >= STREAM_QUEUE && !atomic_load(&st->cancel) && !drop) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 100000000;
        if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&st->cv, &st->mu, &t);
        drop = atomic_load(&st->s->stopping);
    }
    if (ev && !atomic_load(&st->cancel) && !drop) {
        if (st->tail) st->tail->next = ev;
        else st->head = ev;
        st->tail = ev;
        st->n_events++;
        ev = NULL;
        wake(st);
    }
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    free(ev);
}

static void on_piece(void *user, const char *piece, size_t n) {
    stream *st = user;
    char *text = malloc(n + 1);
    if (!text) return;
    memcpy(text, piece, n);
    text[n] = '\0';
    push(st, serve_chunk_json(&st->req, st->id, st->created, text, NULL, st->first));
    st->first = false;
    free(text);
}

static void *producer(void *arg) {
    stream *st = arg;
    serve_result res;
    serve_error e;
    if (serve_run(st->s, &st->prep, on_piece, st, &st->cancel, &res, &e)) {
        push(st, serve_error_json(&e));
    } else {
        push(st, serve_chunk_json(&st->req, st->id, st->created, NULL, res.finish, st->first));
        if (st->req.include_usage)
            push(st, serve_usage_chunk_json(&st->req, st->id, st->created, res.n_prompt, res.n_gen));
    }
    char *done = strdup("[DONE]");
    if (done) {
        /* "data: [DONE]" is not JSON: pushed as it is */
        push(st, done);
    }
    pthread_mutex_lock(&st->mu);
    st->done = true;
    wake(st);
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *st = cls;
    pthread_mutex_lock(&st->mu);
    if (!st->head && !st->done) {
        /* nothing yet: the connection waits, suspended, without holding
         * the daemon's thread; the producer's next event resumes it */
        st->suspended = true;
        atomic_fetch_add(&st->s->suspended, 1);
        MHD_suspend_connection(st->c);
        pthread_mutex_unlock(&st->mu);
        return 0;
    }
    if (!st->head) {
        pthread_mutex_unlock(&st->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    event *ev = st->head;
    size_t n = ev->len - st->off < max ? ev->len - st->off : max;
    memcpy(buf, ev->data + st->off, n);
    st->off += n;
    if (st->off == ev->len) {
        st->head = ev->next;
        if (!st->head) st->tail = NULL;
        st->n_events--;
        st->off = 0;
        free(ev);
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    pthread_mutex_lock(&st->mu);
    atomic_store(&st->cancel, true);
    if (st->suspended) { /* the connection is going: never resumed after this */
        st->suspended = false;
        atomic_fetch_sub(&st->s->suspended, 1);
    }
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->th, NULL);
    while (st->head) {
        event *ev = st->head;
        st->head = ev->next;
        free(ev);
    }
    atomic_fetch_sub(&st->req.model->inflight, 1);
    atomic_fetch_sub(&st->s->streams, 1);
    serve_prepared_free(&st->prep);
    serve_request_free(&st->req);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* ---------------------------------------------------------------- generation endpoints */

static void request_id(serve_server *s, bool chat, char *buf, size_t len) {
    snprintf(buf, len, "%s-%lld-%lld", chat ? "chatcmpl" : "cmpl", (long long)time(NULL),
             (long long)atomic_fetch_add(&s->next_id, 1));
}

static enum MHD_Result start_stream(serve_server *s, struct MHD_Connection *c, const char *endpoint,
                                    serve_request *req, serve_prepared *prep) {
    stream *st = calloc(1, sizeof *st);
    serve_error e;
    if (!st) {
        serve_fail(&e, 500, "server_error", "out of memory");
        goto fail;
    }
    st->s = s;
    st->c = c;
    st->req = *req;
    st->prep = *prep;
    st->first = true;
    st->created = time(NULL);
    request_id(s, req->chat, st->id, sizeof st->id);
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    atomic_fetch_add(&s->streams, 1);
    if (pthread_create(&st->th, NULL, producer, st)) {
        atomic_fetch_sub(&s->streams, 1);
        pthread_cond_destroy(&st->cv);
        pthread_mutex_destroy(&st->mu);
        free(st);
        serve_fail(&e, 500, "server_error", "cannot start a thread for the stream");
        goto fail;
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
    if (!r) {
        stream_free(st); /* cancels and joins the producer, frees the request */
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    serve_count(s, endpoint, 200);
    return rc;
fail:
    atomic_fetch_sub(&req->model->inflight, 1);
    serve_prepared_free(prep);
    serve_request_free(req);
    return answer_error(s, c, endpoint, &e);
}

/* A generation request's preparation (the model acquired, maybe loaded; the
 * prompt encoded) and, when it is not streamed, its run: on a thread of its
 * own while the connection is suspended, so that the daemon's threads never
 * wait for a model. */
typedef struct job {
    serve_server *s;
    struct MHD_Connection *c;
    pthread_t th;
    bool started;                 /* th runs (joined before the job is freed) */
    serve_request req;
    serve_prepared prep;
    serve_error e;
    bool failed;                  /* the preparation failed: e */
    char *out;                    /* not streamed: the answer or the error's JSON */
    int status;
} job;

static void *job_main(void *arg) {
    job *j = arg;
    serve_server *s = j->s;
    if (serve_prepare(s, &j->req, &j->prep, &j->e)) {
        j->failed = true;
    } else if (!j->req.stream) {
        serve_result res;
        char id[48];
        j->status = 200;
        if (serve_run(s, &j->prep, NULL, NULL, NULL, &res, &j->e)) {
            j->out = serve_error_json(&j->e);
            j->status = j->e.status;
        } else {
            request_id(s, j->req.chat, id, sizeof id);
            j->out = serve_answer_json(&j->req, id, time(NULL), res.text, res.finish, res.n_prompt, res.n_gen);
        }
    }
    atomic_fetch_sub(&s->suspended, 1);
    MHD_resume_connection(j->c);
    return NULL;
}

/* Frees a job whose answer was not started (its request still counted in
 * its model's inflight). */
static void job_free(job *j) {
    if (j->started) pthread_join(j->th, NULL);
    atomic_fetch_sub(&j->req.model->inflight, 1);
    serve_prepared_free(&j->prep);
    serve_request_free(&j->req);
    free(j->out);
    free(j);
}

/* The first call parses the request and starts its job (the connection
 * suspended); the call after the job resumes it answers. */
static enum MHD_Result handle_generate(serve_server *s, struct MHD_Connection *c, job **slot, const char *endpoint,
                                       bool chat, const char *body, size_t len) {
    serve_error e;
    job *j = *slot;
    if (!j) {
        serve_request req;
        if (serve_parse_request(s, body, len, chat, &req, &e)) {
            serve_request_free(&req);
            return answer_error(s, c, endpoint, &e);
        }
        serve_model *m = req.model;
        if (atomic_fetch_add(&m->inflight, 1) >= s->o.max_queue) {
            atomic_fetch_sub(&m->inflight, 1);
            serve_request_free(&req);
            serve_fail(&e, 503, "server_overloaded", "the model '%s' has %d requests queued (--queue): try again "
                       "later", m->name, s->o.max_queue);
            return answer_error(s, c, endpoint, &e);
        }
        if (!(j = calloc(1, sizeof *j))) {
            atomic_fetch_sub(&m->inflight, 1);
            serve_request_free(&req);
            serve_fail(&e, 500, "server_error", "out of memory");
            return answer_error(s, c, endpoint, &e);
        }
        j->s = s;
        j->c = c;
        j->req = req;
        *slot = j;
        atomic_fetch_add(&s->suspended, 1);
        MHD_suspend_connection(c);
        if (pthread_create(&j->th, NULL, job_main, j)) {
            j->failed = true;
            serve_fail(&j->e, 500, "server_error", "cannot start a thread for the request");
            atomic_fetch_sub(&s->suspended, 1);
            MHD_resume_connection(c);
        } else {
            j->started = true;
        }
        return MHD_YES;
    }
    *slot = NULL;
    if (j->started) pthread_join(j->th, NULL);
    j->started = false;
    enum MHD_Result rc;
    if (j->failed) {
        rc = answer_error(s, c, endpoint, &j->e);
        job_free(j);
    } else if (j->req.stream) {
        rc = start_stream(s, c, endpoint, &j->req, &j->prep); /* takes the request and its preparation */
        free(j);
    } else {
        rc = answer(s, c, endpoint, j->status, j->out, "application/json"); /* takes out */
        j->out = NULL;
        job_free(j);
    }
    return rc;
}

/* ---------------------------------------------------------------- routing */

typedef struct conn {
    serve_watched *watched;       /* the connection's deadline (NULL: unwatched) */
    job *job;                     /* a generation being prepared or run (the connection suspended) */
    textbuf body;
    bool too_large;
    bool framing_bad;             /* answered 400 on the first call */
} conn;

static bool authorized(serve_server *s, struct MHD_Connection *c) {
    if (!s->o.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    const char *k = h + 7, *want = s->o.api_key;
    size_t n = strlen(k), w = strlen(want);
    unsigned diff = n != w;
    for (size_t i = 0; i < w; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < n ? k[i] : 0);
    return diff == 0;
}

/* Appends a piece of the body (dropped past SERVE_MAX_BODY: 413 at the end). */
static void add_body(conn *cn, const char *data, size_t n) {
    if (cn->too_large || cn->body.len + n > SERVE_MAX_BODY) {
        cn->too_large = true;
        return;
    }
    tb_add(&cn->body, data, n);
    if (cn->body.oom) cn->too_large = true;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls) {
    serve_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        atomic_fetch_add(&s->requests_open, 1);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        cn->watched = ci ? ci->socket_context : NULL;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (serve_watch_over(s->watch, cn->watched)) {
            /* past --per-client: answered at its headers, then closed */
            serve_error e;
            serve_fail(&e, 503, "server_overloaded", "this client has more than %d connections open "
                       "(--per-client): close some and try again", s->o.per_client);
            cn->framing_bad = true; /* the body, if any, is dropped */
            serve_watch_busy(s->watch, cn->watched, true);
            return answer_close(s, c, "other", &e);
        }
        if (cl && MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding")) {
            /* two framings of one body (RFC 9112 6.3): refused, never guessed */
            serve_error e;
            serve_fail(&e, 400, "invalid_request_error", "the request has both 'Transfer-Encoding' and "
                       "'Content-Length' headers: send one");
            cn->framing_bad = true;
            serve_watch_busy(s->watch, cn->watched, true);
            return answer_error(s, c, "other", &e);
        }
        if (cl && strtoull(cl, NULL, 10) > SERVE_MAX_BODY) cn->too_large = true;
        return MHD_YES;
    }
    if (cn->framing_bad) {
        *upload_data_size = 0; /* answered already: the body is dropped */
        return MHD_YES;
    }
    if (*upload_data_size) {
        add_body(cn, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    serve_watch_busy(s->watch, cn->watched, true); /* arrived whole: no deadline while it runs */
    bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET");
    bool is_comp = !strcmp(url, "/v1/completions"), is_chat = !strcmp(url, "/v1/chat/completions");
    const char *endpoint = is_comp ? "/v1/completions" : is_chat ? "/v1/chat/completions"
                           : !strcmp(url, "/v1/models") ? "/v1/models" : !strcmp(url, "/health") ? "/health"
                           : !strcmp(url, "/metrics") ? "/metrics" : "other";
    serve_error e;
    if (!strcmp(endpoint, "/health") && get) return answer(s, c, endpoint, 200, strdup("{\"status\":\"ok\"}"), "application/json");
    if (!authorized(s, c)) {
        serve_fail(&e, 401, "authentication_error", "missing or wrong API key: send the header 'Authorization: "
                   "Bearer KEY' with the key given to tide serve --api-key");
        return answer_error(s, c, endpoint, &e);
    }
    if (!strcmp(endpoint, "other")) {
        serve_fail(&e, 404, "not_found_error", "no endpoint %.200s %.200s (POST /v1/completions, POST "
                   "/v1/chat/completions, GET /v1/models, GET /health, GET /metrics)", method, url);
        return answer_error(s, c, endpoint, &e);
    }
    if ((is_comp || is_chat) ? !post : !get) {
        serve_fail(&e, 405, "invalid_request_error", "%.200s takes %s, not %.32s", endpoint,
                   is_comp || is_chat ? "POST" : "GET", method);
        return answer_error(s, c, endpoint, &e);
    }
    if (!strcmp(endpoint, "/v1/models")) return answer(s, c, endpoint, 200, serve_models_json(s), "application/json");
    if (!strcmp(endpoint, "/metrics"))
        return answer(s, c, endpoint, 200, serve_metrics_text(s), "text/plain; version=0.0.4; charset=utf-8");
    if (cn->too_large) {
        serve_fail(&e, 413, "invalid_request_error", "the request body is larger than the %zu bytes taken",
                   SERVE_MAX_BODY);
        return answer_error(s, c, endpoint, &e);
    }
    return handle_generate(s, c, &cn->job, endpoint, is_chat, cn->body.p ? cn->body.p : "", cn->body.len);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn *cn = *con_cls;
    serve_server *s = cls;
    if (cn) {
        if (cn->job) job_free(cn->job); /* closed before the job's answer was queued */
        serve_watch_busy(s->watch, cn->watched, false);
        free(cn->body.p);
        atomic_fetch_sub(&s->requests_open, 1);
    }
    free(cn);
    *con_cls = NULL;
}

/* Connections accepted and closed: watched for their requests' deadline. */
static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe) {
    serve_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ca = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        *socket_context = ci ? serve_watch_add(s->watch, ci->connect_fd, ca ? ca->client_addr : NULL) : NULL;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        serve_watch_remove(s->watch, *socket_context);
        *socket_context = NULL;
    }
}

/* ---------------------------------------------------------------- run */

#define SERVE_SPARE_FDS 256 /* descriptors kept for model files, spill files, pipes */
#define SHUTDOWN_DRAIN 2.0 /* seconds for the last chunks of streams once generation stops */

/* Requests begun and not yet completed: their bodies arriving, running,
 * waiting, or their answers (a stream's last events) being sent. */
static int in_flight(serve_server *s) { return atomic_load(&s->requests_open); }

/* Waits up to `seconds` for every request in flight to be answered; true
 * when a further signal came first (stop at once). */
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static bool wait_idle(serve_server *s, const sigset_t *signals, double seconds) {
    double until = now_s() + seconds;
    while (in_flight(s) > 0 && now_s() < until) {
        struct timespec t = {0, 50 * 1000 * 1000};
        if (sigtimedwait(signals, NULL, &t) > 0) return true;
    }
    return false;
}

int serve_http_run(const serve_opts *o, const sigset_t *signals) {
    serve_server *s = calloc(1, sizeof *s);
    serve_model *models = calloc((size_t)o->n_models, sizeof *models);
    if (!s || !models) {
        free(s);
        free(models);
        tide_pool_free(o->pool);
        fprintf(stderr, "tide serve: out of memory\n");
        return 1;
    }
    s->o = *o;
    s->models = models;
    s->n_models = o->n_models;
    pthread_mutex_init(&s->mmu, NULL);
    for (int i = 0; i < o->n_models; i++) {
        models[i].name = o->models[i].name;
        models[i].dir = o->models[i].dir;
        pthread_mutex_init(&models[i].mu, NULL);
    }
    int rc = 1;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    if (!(s->watch = serve_watch_start(o->timeout, o->per_client))) {
        fprintf(stderr, "tide serve: cannot start the request-deadline thread\n");
        goto done;
    }
    /* a descriptor per connection: the soft limit raised toward the hard one */
    unsigned max_conn = (unsigned)o->max_connections;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rlim_t want = (rlim_t)max_conn + SERVE_SPARE_FDS;
        if (rl.rlim_cur < want) {
            rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
            getrlimit(RLIMIT_NOFILE, &rl);
        }
        if (rl.rlim_cur < want) {
            max_conn = rl.rlim_cur > 2 * SERVE_SPARE_FDS ? (unsigned)(rl.rlim_cur - SERVE_SPARE_FDS) : SERVE_SPARE_FDS;
            fprintf(stderr, "tide serve: warning: the open-file limit (%llu) holds %u connections, not the %d asked "
                    "(--max-connections)\n", (unsigned long long)rl.rlim_cur, max_conn, o->max_connections);
        }
    }
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) {
        fprintf(stderr, "tide serve: cannot use --host '%s': %s\n", o->host, gai_strerror(gai));
        goto done;
    }
    /* a few event-loop threads (epoll), never a thread per connection:
     * generations run on threads of their own, their connections suspended */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (!o->quiet) flags |= MHD_USE_ERROR_LOG;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_NOTIFY_CONNECTION,
                            notify_connection, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->keep_alive,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)o->threads, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)max_conn, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        fprintf(stderr, "tide serve: cannot listen on %s port %d (in use, or not an address of this machine?)\n",
                o->host, o->port);
        goto done;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    printf("tide serve: listening on http://%s%s%s:%u/v1 (%d models)\n", strchr(o->host, ':') ? "[" : "", o->host,
           strchr(o->host, ':') ? "]" : "", info ? (unsigned)info->port : (unsigned)o->port, o->n_models);
    fflush(stdout);
    int sig = 0;
    while (sigwait(signals, &sig)) {}
    if (!o->quiet)
        fprintf(stderr, "tide serve: %s: stopping: no new connections; %d requests in flight (%d streams) get up to "
                "%g s to finish (a second signal stops at once)\n", strsignal(sig), in_flight(s),
                atomic_load(&s->streams), o->shutdown_grace);
    /* no new connections; the requests in flight run on for the grace */
    MHD_socket ls = MHD_quiesce_daemon(s->d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    bool hard = wait_idle(s, signals, o->shutdown_grace);
    /* then every generation ends at its next token: a stream with its last
     * chunk (finish_reason "length") and data: [DONE], sent before the
     * connections close (a client that reads nothing is not waited for past
     * SHUTDOWN_DRAIN seconds) */
    atomic_store(&s->stopping, true);
    if (!hard) hard = wait_idle(s, signals, SHUTDOWN_DRAIN);
    if (hard && !o->quiet) fprintf(stderr, "tide serve: stopping at once\n");
    /* the daemon may not be stopped with a connection suspended: the jobs
     * and producers still running end at their next token and resume theirs */
    while (atomic_load(&s->suspended) > 0) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    MHD_stop_daemon(s->d);
    if (!o->quiet && serve_watch_cut(s->watch))
        fprintf(stderr, "tide serve: %lld connections were cut off by --timeout\n", serve_watch_cut(s->watch));
    rc = 0;
done:
    serve_watch_stop(s->watch);
    tide_pool_free(o->pool);
    serve_models_free(s);
    pthread_mutex_destroy(&s->mmu);
    free(models);
    free(s);
    return rc;
}
