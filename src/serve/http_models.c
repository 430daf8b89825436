/*
 * http_models.c - which of `tide serve`'s models are loaded. A model is
 * loaded on its first request (checkpoint, tokenizer, chat template, then
 * tide_pool_add_model) and kept while there is room; when a request needs a
 * model that is not loaded and there is no room, the least recently used
 * loaded model with no request running or waiting is evicted
 * (tide_pool_remove) and the load goes on.
 *
 * Room runs out when:
 *   R1. --max-loaded N models are loaded or being loaded already;
 *   R2. the pool refuses the model beside the others: TIDE_E_INFEASIBLE
 *       under policy equal (an equal share would fall below some model's
 *       minimum). Under the other policies that status means the model
 *       alone needs more than the budget, which no eviction cures (500);
 *   R3. policy tide: the loaded models' minimums and the new one's exceed
 *       the budget, so that the pool would time-slice them (each request
 *       taking the whole budget and replanning every model in turn). The
 *       model is added, then idle models evicted until the minimums fit;
 *       if none is idle, the pool time-slices. Under policy serial
 *       time-slicing is what was asked for: R3 does not apply.
 * When every model that would have to go has requests running or waiting,
 * R1 and R2 answer 503 naming the budget (or the limit) and the models
 * holding it. Each eviction is logged with its reason and counted
 * (/metrics, /v1/models).
 *
 * A model's states (under serve_server.lru) and the function that moves it:
 *
 *   UNLOADED --serve_model_acquire: claims it--> LOADING
 *   LOADING --load() done--> LOADED        LOADING --load() failed--> UNLOADED
 *   LOADED (users 0, inflight 0) --pick_victim--> EVICTING --evict--> UNLOADED
 *
 * Invariants:
 *   M1. a model's workload, checkpoint and tokenizer are used only by a
 *       thread that holds it (users > 0, taken while LOADED) or that moved
 *       it to LOADING or EVICTING: a model is never evicted under a request
 *       and never loaded twice at once.
 *   M2. a thread that finds a model LOADING or EVICTING waits on lru_cv; the
 *       thread that moved it there moves it out and broadcasts.
 *   M3. lru is held for bookkeeping only: never while loading, evicting or
 *       calling the pool, except around tide_pool_workload_stats_get (the
 *       pool's lock, briefly), so lru -> the pool's lock is the only nesting.
 */
#include "cli/cli.h"
#include "core/core.h"
#include "serve/http_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void serve_model_unload(serve_model *m) {
    free(m->stop_ids);
    free(m->chat_stop_ids);
    tide_chat_template_free(m->tmpl);
    tide_tokenizer_free(m->tok);
    tide_checkpoint_free(m->ck);
    m->stop_ids = m->chat_stop_ids = NULL;
    m->n_stop_ids = m->n_chat_stop_ids = 0;
    m->tmpl = NULL;
    m->tok = NULL;
    m->ck = NULL;
    m->w = NULL;
}

/* The least recently used model other than self that is loaded with no
 * request running or waiting, moved to EVICTING; NULL when there is none
 * (lru held). */
static serve_model *pick_victim(serve_server *s, const serve_model *self) {
    serve_model *v = NULL;
    for (int i = 0; i < s->n_models; i++) {
        serve_model *m = &s->models[i];
        if (m == self || m->state != MODEL_LOADED || m->users || atomic_load(&m->inflight)) continue;
        if (!v || m->last_used < v->last_used) v = m;
    }
    if (v) v->state = MODEL_EVICTING;
    return v;
}

/* Removes v (EVICTING, claimed by pick_victim) from the pool and unloads it. */
static void evict(serve_server *s, serve_model *v, const char *why) {
    pthread_mutex_lock(&s->mgmt);
    tide_status st = tide_pool_remove(s->o.pool, v->w);
    if (st && !s->o.quiet) /* M1: it is in the pool; said, should that ever break */
        fprintf(stderr, "tide serve: removing %s from the pool: %s\n", v->name, tide_ctx_last_error(s->o.pool_ctx));
    pthread_mutex_unlock(&s->mgmt);
    serve_model_unload(v);
    pthread_mutex_lock(&s->lru);
    v->state = MODEL_UNLOADED;
    pthread_cond_broadcast(&s->lru_cv);
    pthread_mutex_unlock(&s->lru);
    atomic_fetch_add(&v->evictions, 1);
    atomic_fetch_add(&s->evictions, 1);
    if (!s->o.quiet) fprintf(stderr, "tide serve: evicted %s (least recently used, no request): %s\n", v->name, why);
}

/* "a (2 requests), b (minimum 12.0 MiB, 1 request)": the models other than
 * self that are loaded or loading (lru held). */
static void list_holders(serve_server *s, const serve_model *self, bool mins, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < s->n_models && n < len; i++) {
        serve_model *m = &s->models[i];
        if (m == self || (m->state != MODEL_LOADED && m->state != MODEL_LOADING)) continue;
        char b[32] = "";
        tide_pool_workload_stats ws = {0};
        if (mins && m->state == MODEL_LOADED) {
            tide_pool_workload_stats_get(s->o.pool, m->w, &ws);
            cli_fmt_bytes(ws.min_bytes, b, sizeof b);
        }
        int k = atomic_load(&m->inflight);
        n += (size_t)snprintf(buf + n, len - n, "%s%s (%s%s%s%d request%s%s)", n ? ", " : "", m->name,
                              b[0] ? "minimum " : "", b, b[0] ? ", " : "", k, k == 1 ? "" : "s",
                              m->state == MODEL_LOADING ? ", loading" : "");
    }
}

/* R1: evicts until fewer than --max-loaded other models are loaded or
 * loading. Returns 0, or -1 with *e filled (503). */
static int room_by_count(serve_server *s, serve_model *m, serve_error *e) {
    for (;;) {
        pthread_mutex_lock(&s->lru);
        int n = 0;
        for (int i = 0; i < s->n_models; i++)
            n += &s->models[i] != m && (s->models[i].state == MODEL_LOADED || s->models[i].state == MODEL_LOADING);
        if (n < s->o.max_loaded) {
            pthread_mutex_unlock(&s->lru);
            return 0;
        }
        serve_model *v = pick_victim(s, m);
        if (!v) {
            char who[300];
            list_holders(s, m, false, who, sizeof who);
            pthread_mutex_unlock(&s->lru);
            return serve_fail(e, 503, "server_overloaded", "the model '%s' is not loaded and --max-loaded %d models "
                              "are, each with requests running or waiting: %s; try again later", m->name,
                              s->o.max_loaded, who);
        }
        pthread_mutex_unlock(&s->lru);
        char why[160];
        snprintf(why, sizeof why, "--max-loaded %d reached, loading %.100s", s->o.max_loaded, m->name);
        evict(s, v, why);
    }
}

/* R3 (m added, LOADING): evicts idle models while the loaded minimums and
 * m's exceed the budget; with none idle the pool time-slices (it logs so). */
static void room_by_minimums(serve_server *s, serve_model *m) {
    tide_pool_stats ps;
    tide_pool_stats_get(s->o.pool, &ps);
    for (;;) {
        tide_pool_workload_stats ws = {0};
        tide_pool_workload_stats_get(s->o.pool, m->w, &ws);
        uint64_t sum = ws.min_bytes;
        pthread_mutex_lock(&s->lru);
        for (int i = 0; i < s->n_models; i++) {
            serve_model *o = &s->models[i];
            if (o == m || o->state != MODEL_LOADED) continue;
            tide_pool_workload_stats_get(s->o.pool, o->w, &ws);
            sum += ws.min_bytes;
        }
        serve_model *v = sum > ps.budget_bytes ? pick_victim(s, m) : NULL;
        pthread_mutex_unlock(&s->lru);
        if (!v) return;
        char why[200], a[32], b[32];
        snprintf(why, sizeof why, "the loaded models' minimums with %.80s's come to %s, over the budget of %s",
                 m->name, cli_fmt_bytes(sum, a, sizeof a), cli_fmt_bytes(ps.budget_bytes, b, sizeof b));
        evict(s, v, why);
    }
}

/* Bytes of one row of m's KV cache (one request): f32 k and v of every
 * layer for ctx_len positions, in host memory. */
static uint64_t kv_row_bytes(const serve_model *m) {
    const tide_llama_config *c = tide_checkpoint_config(m->ck);
    uint64_t kd = (uint64_t)c->num_key_value_heads * (uint64_t)(c->hidden_size / c->num_attention_heads);
    return 2 * (uint64_t)c->num_hidden_layers * (uint64_t)m->ctx_len * kd * sizeof(float);
}

/* How many requests of m run at once: --max-batch, else SERVE_MAX_BATCH or
 * fewer, so that the KV cache's rows take at most a quarter of the host
 * memory available now; at least 1. */
static int batch_rows(const serve_server *s, const serve_model *m) {
    if (s->o.max_batch > 0) return s->o.max_batch;
    uint64_t row = kv_row_bytes(m), avail = tide_host_available();
    int n = SERVE_MAX_BATCH;
    while (n > 1 && avail && (uint64_t)n * row > avail / 4) n--;
    return n;
}

/* Adds m's workload to the pool, evicting for R2. Returns 0 or -1 with *e
 * filled. */
static int add_to_pool(serve_server *s, serve_model *m, serve_error *e) {
    tide_model_opts mo = {.max_batch = batch_rows(s, m), .ctx_len = m->ctx_len};
    for (;;) {
        char msg[400];
        pthread_mutex_lock(&s->mgmt);
        tide_status st = tide_pool_add_model(s->o.pool, m->name, m->ck, &mo, &m->w);
        if (st) snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(s->o.pool_ctx));
        pthread_mutex_unlock(&s->mgmt);
        if (!st) return 0;
        m->w = NULL;
        if (st != TIDE_E_INFEASIBLE || s->o.policy != TIDE_POOL_EQUAL)
            return serve_fail(e, 500, "server_error", "cannot add the model '%s' to the pool: %s", m->name, msg);
        pthread_mutex_lock(&s->lru);
        serve_model *v = pick_victim(s, m);
        char who[300];
        if (!v) list_holders(s, m, true, who, sizeof who);
        pthread_mutex_unlock(&s->lru);
        if (v) {
            char why[300];
            snprintf(why, sizeof why, "the pool refused %.80s beside it: %.180s", m->name, msg);
            evict(s, v, why);
            continue;
        }
        if (!who[0])
            return serve_fail(e, 500, "server_error", "cannot add the model '%s' to the pool: %s", m->name, msg);
        char b[32];
        tide_pool_stats ps;
        tide_pool_stats_get(s->o.pool, &ps);
        return serve_fail(e, 503, "server_overloaded", "the model '%s' does not fit beside the loaded models (%s); "
                          "the budget of %s is held by %s, each with requests running or waiting; try again later",
                          m->name, msg, cli_fmt_bytes(ps.budget_bytes, b, sizeof b), who);
    }
}

/* Loads m (LOADING, claimed by this thread). Returns 0 or -1 with *e filled;
 * on failure nothing is kept, so that a later request tries again. */
static int load(serve_server *s, serve_model *m, serve_error *e) {
    if (!m->ctx && !(m->ctx = tide_ctx_new())) return serve_fail(e, 500, "server_error", "out of memory");
    if (s->o.max_loaded && room_by_count(s, m, e)) goto fail;
    if (tide_checkpoint_open(m->ctx, m->dir, &m->ck) || tide_checkpoint_prefetch(m->ck)) {
        serve_fail(e, 500, "server_error", "cannot load the model '%s' from %s: %s", m->name, m->dir,
                   tide_ctx_last_error(m->ctx));
        goto fail;
    }
    const tide_llama_config *cfg = tide_checkpoint_config(m->ck);
    if (tide_tokenizer_open(m->ctx, m->dir, &m->tok)) {
        serve_fail(e, 500, "server_error", "the model '%s' has no usable tokenizer: %s", m->name,
                   tide_ctx_last_error(m->ctx));
        goto fail;
    }
    if (tide_tokenizer_n_vocab(m->tok) > cfg->vocab_size) {
        serve_fail(e, 500, "server_error", "the model '%s': the tokenizer's %d ids exceed the model's vocabulary of "
                   "%d: they do not belong together", m->name, tide_tokenizer_n_vocab(m->tok), cfg->vocab_size);
        goto fail;
    }
    if (tide_chat_template_get(m->ctx, m->tok, NULL, &m->tmpl)) {
        snprintf(m->tmpl_err, sizeof m->tmpl_err, "%s", tide_ctx_last_error(m->ctx));
        m->tmpl = NULL;
    }
    int max_pos = cfg->max_position_embeddings;
    m->ctx_len = s->o.ctx_len ? s->o.ctx_len : max_pos < 4096 ? max_pos : 4096;
    if (m->ctx_len > max_pos) {
        serve_fail(e, 500, "server_error", "the model '%s' has %d positions, fewer than --ctx %d", m->name, max_pos,
                   m->ctx_len);
        goto fail;
    }
    if (cli_stop_ids(m->tok, NULL, &m->stop_ids, &m->n_stop_ids) ||
        cli_stop_ids(m->tok, m->tmpl, &m->chat_stop_ids, &m->n_chat_stop_ids)) {
        serve_fail(e, 500, "server_error", "out of memory");
        goto fail;
    }
    if (add_to_pool(s, m, e)) goto fail;
    tide_ctx_set_threads(tide_pool_workload_ctx(m->w), s->o.threads);
    if (!s->o.quiet) {
        tide_pool_workload_stats ws;
        tide_pool_workload_stats_get(s->o.pool, m->w, &ws);
        char kv[32];
        fprintf(stderr, "tide serve: loaded %s from %s (context %d, batches of up to %d requests, KV cache %s in host "
                "memory)\n", m->name, m->dir, m->ctx_len, ws.max_batch,
                cli_fmt_bytes(kv_row_bytes(m) * (uint64_t)ws.max_batch, kv, sizeof kv));
    }
    if (s->o.policy == TIDE_POOL_TIDE) room_by_minimums(s, m);
    return 0;
fail:
    if (!s->o.quiet) fprintf(stderr, "tide serve: %s\n", e->msg);
    serve_model_unload(m);
    return -1;
}

int serve_model_acquire(serve_server *s, serve_model *m, serve_error *e) {
    pthread_mutex_lock(&s->lru);
    while (m->state == MODEL_LOADING || m->state == MODEL_EVICTING) pthread_cond_wait(&s->lru_cv, &s->lru);
    if (m->state == MODEL_LOADED) {
        m->users++;
        m->last_used = ++s->tick;
        pthread_mutex_unlock(&s->lru);
        return 0;
    }
    m->state = MODEL_LOADING;
    pthread_mutex_unlock(&s->lru);
    int rc = load(s, m, e);
    pthread_mutex_lock(&s->lru);
    m->state = rc ? MODEL_UNLOADED : MODEL_LOADED;
    if (!rc) {
        m->users++;
        m->last_used = ++s->tick;
    }
    pthread_cond_broadcast(&s->lru_cv);
    pthread_mutex_unlock(&s->lru);
    return rc;
}

void serve_model_release(serve_server *s, serve_model *m) {
    pthread_mutex_lock(&s->lru);
    m->users--;
    m->last_used = ++s->tick;
    pthread_mutex_unlock(&s->lru);
}

bool serve_model_loaded(serve_server *s, serve_model *m) {
    pthread_mutex_lock(&s->lru);
    bool r = m->state == MODEL_LOADED;
    pthread_mutex_unlock(&s->lru);
    return r;
}

void serve_models_free(serve_server *s) {
    for (int i = 0; i < s->n_models; i++) {
        serve_model *m = &s->models[i];
        serve_model_unload(m);
        tide_ctx_free(m->ctx);
        m->ctx = NULL;
        pthread_mutex_destroy(&m->mu);
    }
}
