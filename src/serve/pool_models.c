/*
 * pool_models.c - the models a pool loads itself (tide.h, "several
 * workloads: models a pool loads"). A model offered to the pool
 * (tide_pool_offer_model: a name and a directory) is loaded on its first
 * tide_pool_acquire (checkpoint, then tide_pool_add_model) and kept while
 * there is room; when an acquire needs a model that is not loaded and there
 * is no room, the least recently used loaded model that nobody holds is
 * evicted (tide_pool_remove) and the load goes on. Which models stay on the
 * shared device is thus the pool's decision, for every client of it.
 *
 * Room runs out when:
 *   R1. max_loaded models are loaded or being loaded already;
 *   R2. the pool refuses the model beside the others: TIDE_E_INFEASIBLE
 *       under policy equal (an equal share would fall below some model's
 *       minimum). Under the other policies that status means the model
 *       alone needs more than the budget, which no eviction cures;
 *   R3. policy tide: the loaded models' minimums and the new one's exceed
 *       the budget, so that the pool would time-slice them (each request
 *       taking the whole budget and replanning every model in turn). The
 *       model is added, then idle models evicted until the minimums fit; if
 *       none is idle, the pool time-slices. Under policy serial
 *       time-slicing is what was asked for: R3 does not apply.
 * When every model that would have to go is held, R1 and R2 are
 * TIDE_E_BUSY naming the budget (or the limit) and the models holding it.
 * Each eviction is logged (tide_pool_opts.log) with its reason and counted
 * (tide_pool_model_info_get, tide_pool_stats.evictions).
 *
 * A model's states (under pool_models.mu) and the function that moves it:
 *
 *   UNLOADED --tide_pool_acquire: claims it--> LOADING
 *   LOADING --load() done--> LOADED        LOADING --load() failed--> UNLOADED
 *   LOADED (users 0) --pick_victim--> EVICTING --evict--> UNLOADED
 *
 * Invariants:
 *   C1. a model's workload and checkpoint are used only by a thread that
 *       holds it (users > 0, taken while LOADED) or that moved it to
 *       LOADING or EVICTING: a model is never evicted under a holder and
 *       never loaded twice at once.
 *   C2. a thread that finds a model LOADING or EVICTING waits on cv; the
 *       thread that moved it there moves it out and broadcasts.
 *   C3. mu is held for bookkeeping only: never while loading, evicting or
 *       calling the pool's management, except around
 *       tide_pool_workload_stats_get (the pool's lock, briefly), so
 *       mu -> the pool's lock is the only nesting. mgmt serialises this
 *       file's management calls on the pool (add, remove) with the reading
 *       of the message they leave on the pool's context.
 */
#include "serve/pool_state.h"

#include "core/core.h"

#include <stdio.h>
#include <string.h>

#define POOL_MODELS_BATCH 4   /* a model's batch rows by default (fewer where its KV cache would not fit, below) */
#define POOL_MODELS_CTX 4096  /* a model's context by default: its positions, at most this */

typedef enum model_state { MODEL_UNLOADED = 0, MODEL_LOADING, MODEL_LOADED, MODEL_EVICTING } model_state;

typedef struct pool_model {
    char *name, *dir;
    tide_pool_model_opts o;
    model_state state;         /* under mu, as users and last_used */
    int users;                 /* holders (tide_pool_acquire .. tide_pool_release) */
    uint64_t last_used;        /* pool_models.tick at its last use */
    int64_t evictions;         /* under mu */
    tide_ctx *ctx;             /* loading's errors */
    tide_checkpoint *ck;
    tide_pool_workload *w;
    int ctx_len;               /* its KV cache's positions, once loaded */
} pool_model;

struct pool_models {
    pthread_mutex_t mu, mgmt;
    pthread_cond_t cv;         /* broadcast when a model leaves LOADING or EVICTING */
    pool_model **m;
    int n, cap;
    int max_loaded;            /* 0: no limit */
    uint64_t tick;
};

static const char *fmt_bytes(uint64_t n, char *buf, size_t len) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, len, "%llu B", (unsigned long long)n);
    else snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

/* One line to the pool's log (outside its lock: taken here). */
static void plog(tide_pool *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void plog(tide_pool *p, const char *fmt, ...) {
    if (!p->log) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&p->mu);
    p->log(p->log_user, line);
    pthread_mutex_unlock(&p->mu);
}

static pool_models *models_of(tide_pool *p, tide_status *st) {
    pthread_mutex_lock(&p->mgmt);
    if (!p->models) {
        pool_models *c = tide_calloc(1, sizeof *c);
        if (c) {
            pthread_mutex_init(&c->mu, NULL);
            pthread_mutex_init(&c->mgmt, NULL);
            pthread_cond_init(&c->cv, NULL);
            p->models = c;
        } else {
            *st = tide_err(p->ctx, TIDE_E_NOMEM, "out of memory");
        }
    }
    pthread_mutex_unlock(&p->mgmt);
    return p->models;
}

static pool_model *find(pool_models *c, const char *name) {
    for (int i = 0; name && i < c->n; i++)
        if (!strcmp(c->m[i]->name, name)) return c->m[i];
    return NULL;
}

/* What m holds of its own (its workload out of the pool already, or the
 * pool's workloads freed). */
static void unload(pool_model *m) {
    tide_checkpoint_free(m->ck);
    m->ck = NULL;
    m->w = NULL;
}

void pool_models_free(tide_pool *p) {
    pool_models *c = p->models;
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        unload(c->m[i]);
        tide_ctx_free(c->m[i]->ctx);
        tide_free(c->m[i]->name);
        tide_free(c->m[i]->dir);
        tide_free((char *)c->m[i]->o.lora);
        tide_free(c->m[i]);
    }
    tide_free(c->m);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mgmt);
    pthread_mutex_destroy(&c->mu);
    tide_free(c);
    p->models = NULL;
}

tide_pool_model_opts tide_pool_model_opts_default(void) { return (tide_pool_model_opts){0}; }

tide_status tide_pool_offer_model(tide_pool *p, const char *name, const char *dir, const tide_pool_model_opts *o) {
    if (!p) return tide_err(NULL, TIDE_E_INVALID, "tide_pool_offer_model: NULL pool");
    if (!name || !*name || !dir || !*dir)
        return tide_err(p->ctx, TIDE_E_INVALID, "a model offered to the pool needs a name and a directory");
    tide_pool_model_opts d = tide_pool_model_opts_default();
    if (!o) o = &d;
    if (o->ctx_len < 0 || o->ctx_len == 1 || o->max_batch < 0 || o->max_batch > TIDE_MAX_BATCH || o->threads < 0)
        return tide_err(p->ctx, TIDE_E_INVALID, "model '%s': context %d, batch %d, threads %d (a context of at "
                        "least 2, a batch of at most %d)", name, o->ctx_len, o->max_batch, o->threads, TIDE_MAX_BATCH);
    if (o->cache_dtype != TIDE_F32 && o->cache_dtype != TIDE_F16 && o->cache_dtype != TIDE_BF16 &&
        o->cache_dtype != TIDE_Q8_0)
        return tide_err(p->ctx, TIDE_E_INVALID, "model '%s': a KV cache is f32, f16, bf16 or q8_0, not %s", name,
                        tide_dtype_name(o->cache_dtype));
    /* a context beyond the model's positions could never be served: refused
     * now, not on every request (a config that cannot be read is reported
     * when the model is loaded, as before) */
    if (o->ctx_len > 0) {
        char path[4096];
        tide_llama_config cf;
        tide_ctx *cc = tide_ctx_new();
        if (!cc) return tide_err(p->ctx, TIDE_E_NOMEM, "out of memory offering model '%s'", name);
        snprintf(path, sizeof path, "%s/config.json", dir);
        bool known = !tide_llama_config_load(cc, path, &cf);
        tide_ctx_free(cc);
        if (known && cf.max_position_embeddings < o->ctx_len)
            return tide_err(p->ctx, TIDE_E_INVALID, "the model '%s' (%s) has %d positions, fewer than the context "
                            "of %d tokens asked for", name, dir, cf.max_position_embeddings, o->ctx_len);
    }
    tide_status st = TIDE_OK;
    pool_models *c = models_of(p, &st);
    if (!c) return st;
    pthread_mutex_lock(&c->mu);
    pool_model *m = NULL;
    char *lora = NULL;
    if (find(c, name)) {
        st = TIDE_E_INVALID;
    } else if (tide_grow((void **)&c->m, &c->cap, c->n + 1, sizeof *c->m) || !(m = tide_calloc(1, sizeof *m)) ||
               !(m->name = tide_strdup(name)) || !(m->dir = tide_strdup(dir)) || !(m->ctx = tide_ctx_new()) ||
               (o->lora && !(lora = tide_strdup(o->lora)))) {
        st = TIDE_E_NOMEM;
    } else {
        m->o = *o;
        m->o.lora = lora; /* the pool's own copy */
        lora = NULL;
        c->m[c->n++] = m;
        m = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    tide_free(lora);
    if (m) {
        tide_ctx_free(m->ctx);
        tide_free(m->name);
        tide_free(m->dir);
        tide_free(m);
    }
    if (st == TIDE_E_INVALID) return tide_err(p->ctx, st, "the pool was already offered a model named '%s'", name);
    if (st) return tide_err(p->ctx, st, "out of memory offering model '%s'", name);
    return TIDE_OK;
}

tide_status tide_pool_set_max_loaded(tide_pool *p, int n) {
    if (!p) return tide_err(NULL, TIDE_E_INVALID, "tide_pool_set_max_loaded: NULL pool");
    if (n < 0) return tide_err(p->ctx, TIDE_E_INVALID, "at most %d models loaded (0 for no limit)", n);
    tide_status st = TIDE_OK;
    pool_models *c = models_of(p, &st);
    if (!c) return st;
    pthread_mutex_lock(&c->mu);
    c->max_loaded = n;
    pthread_mutex_unlock(&c->mu);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- eviction */

/* The least recently used model other than self that is loaded and held by
 * nobody, moved to EVICTING; NULL when there is none (mu held). */
static pool_model *pick_victim(pool_models *c, const pool_model *self) {
    pool_model *v = NULL;
    for (int i = 0; i < c->n; i++) {
        pool_model *m = c->m[i];
        if (m == self || m->state != MODEL_LOADED || m->users) continue;
        if (!v || m->last_used < v->last_used) v = m;
    }
    if (v) v->state = MODEL_EVICTING;
    return v;
}

/* Removes v (EVICTING, claimed by pick_victim) from the pool and unloads it. */
static void evict(tide_pool *p, pool_models *c, pool_model *v, const char *why) {
    pthread_mutex_lock(&c->mgmt);
    char msg[TIDE_ERRMSG_MAX] = "";
    tide_status st = tide_pool_remove(p, v->w);
    if (st) snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(p->ctx));
    pthread_mutex_unlock(&c->mgmt);
    if (st) plog(p, "removing %s from the pool: %s", v->name, msg); /* C1: it is in the pool */
    unload(v);
    pthread_mutex_lock(&c->mu);
    v->state = MODEL_UNLOADED;
    v->evictions++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&p->mu);
    p->evictions++;
    pthread_mutex_unlock(&p->mu);
    plog(p, "evicted %s (least recently used, no request): %s", v->name, why);
}

/* "a (2 requests), b (minimum 12.0 MiB, 1 request)": the models other than
 * self that are loaded or loading (mu held). */
static void list_holders(tide_pool *p, pool_models *c, const pool_model *self, bool mins, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->n && n < len; i++) {
        pool_model *m = c->m[i];
        if (m == self || (m->state != MODEL_LOADED && m->state != MODEL_LOADING)) continue;
        char b[32] = "";
        tide_pool_workload_stats ws = {0};
        if (mins && m->state == MODEL_LOADED) {
            tide_pool_workload_stats_get(p, m->w, &ws);
            fmt_bytes(ws.min_bytes, b, sizeof b);
        }
        int k = m->users;
        n += (size_t)snprintf(buf + n, len - n, "%s%s (%s%s%s%d request%s%s)", n ? ", " : "", m->name,
                              b[0] ? "minimum " : "", b, b[0] ? ", " : "", k, k == 1 ? "" : "s",
                              m->state == MODEL_LOADING ? ", loading" : "");
    }
}

/* R1: evicts until fewer than max_loaded other models are loaded or
 * loading. TIDE_OK, or TIDE_E_BUSY on ctx. */
static tide_status room_by_count(tide_pool *p, pool_models *c, pool_model *m, tide_ctx *ctx) {
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int n = 0, limit = c->max_loaded;
        for (int i = 0; i < c->n; i++)
            n += c->m[i] != m && (c->m[i]->state == MODEL_LOADED || c->m[i]->state == MODEL_LOADING);
        if (!limit || n < limit) {
            pthread_mutex_unlock(&c->mu);
            return TIDE_OK;
        }
        pool_model *v = pick_victim(c, m);
        if (!v) {
            char who[300];
            list_holders(p, c, m, false, who, sizeof who);
            pthread_mutex_unlock(&c->mu);
            return tide_err(ctx, TIDE_E_BUSY, "the model '%s' is not loaded and --max-loaded %d models are, each "
                            "with requests running or waiting: %s; try again later", m->name, limit, who);
        }
        pthread_mutex_unlock(&c->mu);
        char why[160];
        snprintf(why, sizeof why, "--max-loaded %d reached, loading %.100s", limit, m->name);
        evict(p, c, v, why);
    }
}

/* R3 (m added, LOADING): evicts idle models while the loaded minimums and
 * m's exceed the budget; with none idle the pool time-slices (it logs so). */
static void room_by_minimums(tide_pool *p, pool_models *c, pool_model *m) {
    for (;;) {
        tide_pool_workload_stats ws = {0};
        tide_pool_workload_stats_get(p, m->w, &ws);
        uint64_t sum = ws.min_bytes;
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < c->n; i++) {
            pool_model *o = c->m[i];
            if (o == m || o->state != MODEL_LOADED) continue;
            tide_pool_workload_stats_get(p, o->w, &ws);
            sum += ws.min_bytes;
        }
        pool_model *v = sum > p->total ? pick_victim(c, m) : NULL;
        pthread_mutex_unlock(&c->mu);
        if (!v) return;
        char why[256], a[32], b[32];
        snprintf(why, sizeof why, "the loaded models' minimums with %.80s's come to %s, over the budget of %s",
                 m->name, fmt_bytes(sum, a, sizeof a), fmt_bytes(p->total, b, sizeof b));
        evict(p, c, v, why);
    }
}

/* ---------------------------------------------------------------- loading */

/* Bytes of one row of m's KV cache (one request): k and v of every layer
 * for ctx_len positions at the cache's type, in host memory. */
static uint64_t kv_row_bytes(const pool_model *m) {
    const tide_llama_config *cf = tide_checkpoint_config(m->ck);
    uint64_t kd = (uint64_t)cf->num_key_value_heads * (uint64_t)(cf->hidden_size / cf->num_attention_heads);
    return 2 * (uint64_t)cf->num_hidden_layers * (uint64_t)m->ctx_len * tide_dtype_bytes(m->o.cache_dtype, kd);
}

/* How many requests of m run at once: its max_batch, else
 * POOL_MODELS_BATCH or fewer, so that the KV cache's rows take at most a
 * quarter of the host memory available now; at least 1. */
static int batch_rows(const pool_model *m) {
    if (m->o.max_batch > 0) return m->o.max_batch;
    uint64_t row = kv_row_bytes(m), avail = tide_host_available();
    int n = POOL_MODELS_BATCH;
    while (n > 1 && avail && (uint64_t)n * row > avail / 4) n--;
    return n;
}

/* Adds m's workload to the pool, evicting for R2. TIDE_OK, or the failure
 * on ctx (TIDE_E_BUSY: the budget is held). */
static tide_status add_to_pool(tide_pool *p, pool_models *c, pool_model *m, tide_ctx *ctx) {
    tide_model_opts mo = {.max_batch = batch_rows(m), .ctx_len = m->ctx_len, .cache_dtype = m->o.cache_dtype};
    for (;;) {
        char msg[400];
        pthread_mutex_lock(&c->mgmt);
        tide_status st = tide_pool_add_model(p, m->name, m->ck, &mo, &m->w);
        if (st) snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(p->ctx));
        pthread_mutex_unlock(&c->mgmt);
        if (!st) return TIDE_OK;
        m->w = NULL;
        if (st != TIDE_E_INFEASIBLE || p->policy != TIDE_POOL_EQUAL)
            return tide_err(ctx, st, "cannot add the model '%s' to the pool: %s", m->name, msg);
        pthread_mutex_lock(&c->mu);
        pool_model *v = pick_victim(c, m);
        char who[300];
        if (!v) list_holders(p, c, m, true, who, sizeof who);
        pthread_mutex_unlock(&c->mu);
        if (v) {
            char why[300];
            snprintf(why, sizeof why, "the pool refused %.80s beside it: %.180s", m->name, msg);
            evict(p, c, v, why);
            continue;
        }
        if (!who[0]) return tide_err(ctx, st, "cannot add the model '%s' to the pool: %s", m->name, msg);
        char b[32];
        return tide_err(ctx, TIDE_E_BUSY, "the model '%s' does not fit beside the loaded models (%s); the budget of "
                        "%s is held by %s, each with requests running or waiting; try again later", m->name, msg,
                        fmt_bytes(p->total, b, sizeof b), who);
    }
}

/* Loads m (LOADING, claimed by this thread). TIDE_OK or the failure on ctx;
 * on failure nothing is kept, so that a later acquire tries again. */
static tide_status load(tide_pool *p, pool_models *c, pool_model *m, tide_ctx *ctx) {
    tide_status st = room_by_count(p, c, m, ctx);
    if (st) goto fail;
    if ((st = tide_checkpoint_open(m->ctx, m->dir, &m->ck)) ||
        (m->o.lora && (st = tide_checkpoint_add_lora(m->ck, m->o.lora))) || (st = tide_checkpoint_prefetch(m->ck))) {
        st = tide_err(ctx, st, "cannot load the model '%s' from %s: %s", m->name, m->dir, tide_ctx_last_error(m->ctx));
        goto fail;
    }
    const tide_llama_config *cf = tide_checkpoint_config(m->ck);
    int max_pos = cf->max_position_embeddings;
    m->ctx_len = m->o.ctx_len ? m->o.ctx_len : max_pos < POOL_MODELS_CTX ? max_pos : POOL_MODELS_CTX;
    if (m->ctx_len > max_pos) {
        st = tide_err(ctx, TIDE_E_INVALID, "the model '%s' has %d positions, fewer than --ctx %d", m->name, max_pos,
                      m->ctx_len);
        goto fail;
    }
    if ((st = add_to_pool(p, c, m, ctx))) goto fail;
    tide_ctx_set_threads(tide_pool_workload_ctx(m->w), m->o.threads);
    tide_pool_workload_stats ws;
    tide_pool_workload_stats_get(p, m->w, &ws);
    char kv[32];
    plog(p, "loaded %s from %s (context %d, batches of up to %d requests, KV cache %s in host memory)", m->name,
         m->dir, m->ctx_len, ws.max_batch, fmt_bytes(kv_row_bytes(m) * (uint64_t)ws.max_batch, kv, sizeof kv));
    if (p->policy == TIDE_POOL_TIDE) room_by_minimums(p, c, m);
    return TIDE_OK;
fail:
    plog(p, "%s", tide_ctx_last_error(ctx));
    unload(m);
    return st;
}

tide_status tide_pool_acquire(tide_pool *p, const char *name, tide_ctx *ctx, tide_pool_workload **out) {
    if (out) *out = NULL;
    if (!p || !out) return tide_err(ctx, TIDE_E_INVALID, "tide_pool_acquire: NULL argument");
    pool_models *c = p->models;
    pool_model *m = NULL;
    if (c) {
        pthread_mutex_lock(&c->mu);
        m = find(c, name);
        pthread_mutex_unlock(&c->mu);
    }
    if (!m) return tide_err(ctx, TIDE_E_NOT_FOUND, "the pool was offered no model named '%s'", name ? name : "");
    tide_ctx *ec = ctx ? ctx : m->ctx;
    pthread_mutex_lock(&c->mu);
    while (m->state == MODEL_LOADING || m->state == MODEL_EVICTING) pthread_cond_wait(&c->cv, &c->mu);
    if (m->state == MODEL_LOADED) {
        m->users++;
        m->last_used = ++c->tick;
        *out = m->w;
        pthread_mutex_unlock(&c->mu);
        return TIDE_OK;
    }
    m->state = MODEL_LOADING;
    pthread_mutex_unlock(&c->mu);
    tide_status st = load(p, c, m, ec);
    pthread_mutex_lock(&c->mu);
    m->state = st ? MODEL_UNLOADED : MODEL_LOADED;
    if (!st) {
        m->users++;
        m->last_used = ++c->tick;
        *out = m->w;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return st;
}

void tide_pool_release(tide_pool *p, tide_pool_workload *w) {
    pool_models *c = p && w ? p->models : NULL;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (c->m[i]->w == w && c->m[i]->state == MODEL_LOADED && c->m[i]->users > 0) {
            c->m[i]->users--;
            c->m[i]->last_used = ++c->tick;
            break;
        }
    pthread_mutex_unlock(&c->mu);
}

tide_checkpoint *tide_pool_workload_checkpoint(tide_pool_workload *w) { return w ? w->ck : NULL; }

int tide_pool_workload_ctx_len(const tide_pool_workload *w) { return w ? w->ctx_len : 0; }

tide_status tide_pool_model_info_get(tide_pool *p, const char *name, tide_pool_model_info *out) {
    if (!p || !out) return tide_err(NULL, TIDE_E_INVALID, "tide_pool_model_info_get: NULL argument");
    memset(out, 0, sizeof *out);
    pool_models *c = p->models;
    if (!c) return TIDE_E_NOT_FOUND;
    pthread_mutex_lock(&c->mu);
    pool_model *m = find(c, name);
    if (m) {
        out->loaded = m->state == MODEL_LOADED;
        out->holders = m->users;
        out->evictions = m->evictions;
        out->ctx_len = out->loaded ? m->ctx_len : 0;
        /* mu held: a loaded model's workload is not removed under the read (C3) */
        if (out->loaded) tide_pool_workload_stats_get(p, m->w, &out->stats);
    }
    pthread_mutex_unlock(&c->mu);
    return m ? TIDE_OK : TIDE_E_NOT_FOUND;
}
