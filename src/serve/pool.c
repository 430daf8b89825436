/*
 * pool.c - the device-budget arbiter: one budget of device bytes shared by
 * several workloads (models) on one backend instance, each run offloaded
 * within a share of it (tide.h, "several workloads").
 *
 * Shares. A workload's minimum is the smallest budget its longest request
 * (a prefill of ctx_len tokens) and its decode step can be planned at,
 * untiled, so that no request it accepts fails to plan and every request
 * computes what a resident run computes. Its curve is the predicted time of
 * its typical request (a prefill of `prompt` tokens and new_tokens - 1 decode
 * steps, simulated by the planner's own cost model) at POOL_POINTS budgets
 * from the minimum to its need (the unconstrained peak, beyond which plans
 * gain nothing; where the models keep weights warm across requests, that
 * plus all its weights), each priced with the weights the model keeps warm
 * at that share, and the time to load those once; both are found by
 * planning (pool_predict.c). A partition (partition()) sets every
 * workload's share:
 *   tide    the combination of the curves' points that fits the budget
 *           with the least predicted time of the queued work (every one
 *           searched where there are few, pool_predict_partition; a share
 *           other than the one held costs loading its warm weights again),
 *           then the bytes left to the move of the largest predicted saving
 *           per byte while one helps. The pool is time-sliced instead when
 *           the minimums do not fit together, or when time-slicing is
 *           predicted cheaper by a margin (10%, either way: changes of regime
 *           reload weights): every queued request priced at its turn's
 *           share, loading its warm weights again unless the turns' shares
 *           fit together, against the shares' cost (pool_predict_choose).
 *   equal   the budget over the workloads present, in TIDE_PLAN_ALIGN units.
 *   serial  time-sliced always.
 * Time-sliced, one workload runs at a time, whose turn it is (first come,
 * first served): under serial with the whole budget, the others holding
 * nothing; under tide at its knee of the budget (the smallest point of its
 * curve predicted as fast as the whole budget), the others keeping what they
 * hold until a turn needs the room (evict_one: the idle workload that frees
 * it holding the least), so warm weights that fit together stay loaded.
 *
 * Measured times feed the curves: a request that drifts more than 30% from
 * its prediction refits its workload's profile, plans its curve again and
 * re-partitions (pool_refit.c, rules F1-F5; the state both files share is
 * pool_state.h).
 *
 * Invariants (check_state() in debug builds, and the test hook):
 *   P1. sum over workloads of held <= budget, at every instant: a share
 *       grows only by reserving first (set_held) and shrinks only after the
 *       model's arena is gone (set_offload frees it, set_held after).
 *   P2. a model allocates its arena only while it runs a request, at its
 *       configured budget, and only with held == configured: its arena is
 *       never larger than what it holds.
 *   P3. a model is used by one thread at a time: model_busy marks it (a
 *       request running, or another thread changing its budget).
 *   P4. a running request's share is not changed: new shares are applied
 *       when a request starts (acquire) or ends (release_after), or to an
 *       idle workload by a thread that needs the room (evict_one).
 *
 * A workload's budget, and the function that moves it:
 *
 *   RELEASED (held 0) --acquire: reserve, set_offload--> HELD (held = b)
 *   HELD --acquire (model_busy)--> RUNNING --release_after--> HELD
 *   HELD (idle, held > target) --evict_one / acquire / release_after:
 *        set_offload, then held = target--> HELD (smaller) or RELEASED
 *
 * Locks: mu guards every field the threads share (shares, held, flags,
 * counters) and cv is broadcast on every change a waiter may want; models
 * are reconfigured and run outside mu, under model_busy. mgmt serialises the
 * management calls (add, remove, set_demand), which plan outside mu and
 * record errors on the pool's context.
 */
#include "serve/pool_state.h"

#include "backend/backend.h"  /* device_is_host: predictions where device memory is host memory */
#include "probe/probe.h"      /* the machine measured once, when no profile is named */
#include "runtime/model_ext.h" /* the model's profile (refits), not its layout */

#include <assert.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const policy_names[] = {"tide", "equal", "serial"};

const char *tide_pool_policy_name(tide_pool_policy p) {
    return (unsigned)p < sizeof policy_names / sizeof policy_names[0] ? policy_names[p] : NULL;
}

tide_status tide_pool_policy_parse(tide_ctx *ctx, const char *s, tide_pool_policy *out) {
    for (unsigned i = 0; s && i < sizeof policy_names / sizeof policy_names[0]; i++)
        if (!strcmp(s, policy_names[i])) {
            *out = (tide_pool_policy)i;
            return TIDE_OK;
        }
    return tide_err(ctx, TIDE_E_INVALID, "unknown pool policy '%s' (tide, equal or serial)", s ? s : "(null)");
}

/* ---------------------------------------------------------------- bookkeeping (under mu) */

void pool_log_locked(tide_pool *p, const char *fmt, ...) {
    if (!p->log) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    p->log(p->log_user, line);
}

#ifndef NDEBUG
static bool check_state(const tide_pool *p) {
    uint64_t sum = 0;
    for (int i = 0; i < p->n; i++) {
        const tide_pool_workload *w = p->w[i];
        if (w->held && w->held != w->configured && !w->model_busy) return false; /* P2 */
        sum += w->held;
    }
    return sum == p->held_sum && sum <= p->total; /* P1 */
}
#endif

static void set_held(tide_pool *p, tide_pool_workload *w, uint64_t bytes) {
    p->held_sum = p->held_sum - w->held + bytes;
    w->held = bytes;
    if (p->held_sum > p->peak_held) p->peak_held = p->held_sum;
    if (p->hook) p->hook(p->hook_user, p->held_sum, p->total);
    assert(check_state(p));
}

static int index_of(const tide_pool *p, const tide_pool_workload *w) {
    for (int i = 0; i < p->n; i++)
        if (p->w[i] == w) return i;
    return -1;
}

/* The share w runs a time-sliced turn at: the whole budget (serial), or
 * (tide) its knee of it, the smallest point of its curve predicted as fast
 * as the whole budget, so that the rest stays with the warm weights other
 * workloads keep loaded between their turns. */
static uint64_t turn_share(const tide_pool *p, const tide_pool_workload *w) {
    if (p->policy != TIDE_POOL_TIDE) return p->total;
    int k = pool_predict_knee(&w->cv, p->total);
    return k >= 0 ? w->cv.b[k] : p->total;
}

/* The share w should hold now (time-sliced and idle: none, though under
 * policy tide it keeps what it holds until another turn needs the room). */
static uint64_t target(const tide_pool *p, const tide_pool_workload *w) {
    if (p->sliced) return w->running_turn ? turn_share(p, w) : 0;
    return w->share;
}

static uint64_t equal_share(const tide_pool *p, int n) {
    uint64_t s = n ? p->total / (uint64_t)n : p->total;
    return n > 1 ? s / TIDE_PLAN_ALIGN * TIDE_PLAN_ALIGN : s;
}

double pool_predicted_at(const tide_pool_workload *w, uint64_t share) {
    double t = 0;
    for (int k = 0; k < w->cv.n && w->cv.b[k] <= share; k++) t = w->cv.t[k];
    return isfinite(t) ? t : 0;
}

void pool_partition(tide_pool *p, const char *why) {
    p->partitions++;
    int n = p->n;
    uint64_t sum_min = 0;
    for (int i = 0; i < n; i++) sum_min += p->w[i]->min;
    bool was = p->sliced, by_cost = false;
    uint64_t sh[n ? n : 1];
    for (int i = 0; i < n; i++) sh[i] = 0;
    double part_s = 0, slice_s = 0;
    if (p->policy == TIDE_POOL_TIDE && sum_min <= p->total) {
        const pool_curve *cvs[n ? n : 1];
        double wts[n ? n : 1];
        uint64_t cur[n ? n : 1];
        for (int i = 0; i < n; i++) {
            cvs[i] = &p->w[i]->cv, wts[i] = p->w[i]->weight;
            cur[i] = p->w[i]->held ? p->w[i]->configured : 0; /* its warm weights are loaded */
        }
        by_cost = pool_predict_choose(n, cvs, wts, cur, p->total, was && p->sliced_by_cost, sh, &part_s, &slice_s);
    }
    p->sliced = p->policy == TIDE_POOL_SERIAL || (p->policy == TIDE_POOL_TIDE && (sum_min > p->total || by_cost));
    p->sliced_by_cost = p->sliced && by_cost;
    for (int i = 0; i < n; i++) p->w[i]->share = 0;
    if (p->sliced) {
        if (by_cost)
            pool_log_locked(p, "pool: %s: time-slicing the %d workloads, one at a time, each turn at its knee of the "
                            "budget of %llu bytes: predicted queued work %.6g s, against %.6g s in shares", why, n,
                            (unsigned long long)p->total, slice_s, part_s);
        else if (p->policy == TIDE_POOL_TIDE && !was)
            pool_log_locked(p, "pool: %s: the minimums of the %d workloads (%llu bytes) exceed the budget of %llu "
                            "bytes: time-slicing, one workload at a time, each turn at its knee of the budget", why,
                            n, (unsigned long long)sum_min, (unsigned long long)p->total);
        else
            pool_log_locked(p, "pool: %s: time-sliced among %d workloads, %llu bytes each in turn", why, n,
                            (unsigned long long)p->total);
        pthread_cond_broadcast(&p->cv);
        return;
    }
    if (was) pool_log_locked(p, "pool: %s: shares replace time-slicing (the minimums fit: %llu of %llu bytes; "
                             "predicted queued work %.6g s in shares, %.6g s time-sliced)", why,
                             (unsigned long long)sum_min, (unsigned long long)p->total, part_s, slice_s);
    for (int i = 0; i < n; i++) p->w[i]->share = p->policy == TIDE_POOL_EQUAL ? equal_share(p, n) : sh[i];
    char line[900];
    int len = 0;
    double total_s = 0;
    for (int i = 0; i < p->n && len < (int)sizeof line - 80; i++) {
        const tide_pool_workload *w = p->w[i];
        total_s += w->weight * pool_predicted_at(w, w->share);
        len += snprintf(line + len, sizeof line - (size_t)len, "%s%s %llu", i ? ", " : "", w->name,
                        (unsigned long long)w->share);
    }
    pool_log_locked(p, "pool: %s: %s shares of %llu bytes: %s%s; predicted queued work %.6g s", why,
                    policy_names[p->policy], (unsigned long long)p->total, p->n ? line : "(no workloads)",
                    len >= (int)sizeof line - 80 ? ", ..." : "", total_s);
    pthread_cond_broadcast(&p->cv);
}

/* ---------------------------------------------------------------- budgets of models */

/* Sets w's model to run under exactly `bytes` (which frees its arena and
 * drops its plans). Outside mu, with w->model_busy set. */
static tide_status apply_budget(tide_pool *p, tide_pool_workload *w, uint64_t bytes) {
    tide_offload_opts o = {.budget_kind = TIDE_BUDGET_BYTES, .bytes = bytes, .policy = "tide",
                           .host_budget = p->host_budget, .ssd_dirs = p->ssd_dirs, .hw = p->hw_arg,
                           .weights_on_ssd = p->weights_on_ssd,
                           .tile = TIDE_TILE_NONE,
                           /* measured for refits: free on the CPU, timing events on a GPU */
                           .timeline = !p->no_refit};
    tide_status st = tide_model_set_offload(w->m, &o);
    /* a refitted profile outlives the share change (the model loaded the pool's) */
    if (!st && w->refits) st = tide_model_set_hw(w->m, &w->hw);
    return st;
}

/* Changes idle workload v (model_busy set by the caller, mu held) to hold
 * `bytes` (0: nothing): the model is set again outside mu, and only then is
 * the smaller share recorded (P1). A failure leaves it holding nothing. */
static tide_status shrink_locked(tide_pool *p, tide_pool_workload *v, uint64_t bytes, const char *why) {
    uint64_t was = v->held;
    pthread_mutex_unlock(&p->mu);
    /* releasing keeps the budget set and frees the arena; the next request
     * of v reserves that budget again before it runs */
    tide_status st = apply_budget(p, v, bytes ? bytes : v->configured);
    pthread_mutex_lock(&p->mu);
    if (st) {
        v->configured = 0;
        set_held(p, v, 0);
        return st;
    }
    v->configured = bytes ? bytes : v->configured;
    set_held(p, v, bytes);
    if (v->planned) {
        v->replans++;
        p->replans++;
    }
    v->planned = false;
    pool_log_locked(p, "pool: %s: '%s' %s from %llu to %llu bytes", why, v->name, bytes ? "shrinks" : "releases",
                    (unsigned long long)was, (unsigned long long)bytes);
    return TIDE_OK;
}

/* Shrinks one idle workload other than w that holds more than its target,
 * w needing `need` more bytes: the one that frees them holding the fewest
 * bytes (the fewest warm weights to load again), else the one that frees the
 * most. Returns true when it changed something (mu was dropped meanwhile). */
static bool evict_one(tide_pool *p, tide_pool_workload *w, uint64_t need) {
    tide_pool_workload *v = NULL;
    for (int i = 0; i < p->n; i++) {
        tide_pool_workload *c = p->w[i];
        uint64_t t = target(p, c);
        if (c == w || c->model_busy || c->held <= t) continue;
        uint64_t frees = c->held - t, vf = v ? v->held - target(p, v) : 0;
        if (!v || (frees >= need ? vf < need || c->held < v->held : vf < need && frees > vf)) v = c;
    }
    if (v) {
        uint64_t t = target(p, v);
        v->model_busy = true;
        if (shrink_locked(p, v, t, p->sliced ? "another workload's turn" : "room for another workload"))
            pool_log_locked(p, "pool: '%s' could not be set to %llu bytes: %s", v->name, (unsigned long long)t,
                            tide_ctx_last_error(v->ctx));
        v->model_busy = false;
        pthread_cond_broadcast(&p->cv);
        return true;
    }
    return false;
}

/* Whether w is first among the workloads waiting for a turn. */
static bool first_in_turn(const tide_pool *p, const tide_pool_workload *w) {
    for (int i = 0; i < p->n; i++)
        if (p->w[i]->turn && p->w[i]->turn < w->turn) return false;
    return true;
}

/* Whether a time-sliced turn is running (one at a time, though the turns'
 * shares may leave room for another). */
static bool turn_running(const tide_pool *p) {
    for (int i = 0; i < p->n; i++)
        if (p->w[i]->running_turn) return true;
    return false;
}

/* Gives w (claimed, mu held) the share it should run with and marks its
 * model busy: waits for a turn (time-sliced) and for room, shrinking idle
 * workloads that hold more than theirs. *waited is set when it waited. */
static tide_status acquire(tide_pool *p, tide_pool_workload *w, bool *waited) {
    for (;;) {
        if (w->leaving) { /* refused: the caller says so on the pool's context */
            w->turn = 0;
            pthread_cond_broadcast(&p->cv);
            return TIDE_E_INVALID;
        }
        uint64_t want;
        if (p->sliced) {
            if (!w->turn) w->turn = ++p->turn_next;
            if (!first_in_turn(p, w) || turn_running(p)) goto wait;
            want = turn_share(p, w);
        } else {
            if (w->turn) {
                w->turn = 0;
                pthread_cond_broadcast(&p->cv);
            }
            want = w->share;
        }
        if (w->model_busy) goto wait; /* another thread is shrinking it */
        if (want <= w->held || p->held_sum - w->held + want <= p->total) {
            /* busy before the reservation: a held share other than the
             * configured one is a running model's (P2, check_state) */
            w->model_busy = true;
            if (want > w->held) set_held(p, w, want); /* reserve first */
            w->running_turn = p->sliced;
            tide_status st = TIDE_OK;
            if (w->configured != want) {
                pthread_mutex_unlock(&p->mu);
                st = apply_budget(p, w, want);
                pthread_mutex_lock(&p->mu);
                if (!st) {
                    if (w->planned) {
                        w->replans++;
                        p->replans++;
                        pool_log_locked(p, "pool: '%s' runs at %llu bytes (was %llu): %s", w->name,
                                        (unsigned long long)want, (unsigned long long)w->configured,
                                        p->sliced ? "its turn" : "its new share");
                    }
                    w->configured = want;
                    w->planned = false;
                } else {
                    w->configured = 0;
                }
            }
            if (st || want < w->held) set_held(p, w, st ? 0 : want); /* the old arena is gone */
            if (st) {
                w->model_busy = false;
                w->running_turn = false;
                w->turn = 0;
                pthread_cond_broadcast(&p->cv);
                return st;
            }
            if (w->turn) {
                w->turn = 0;
                pthread_cond_broadcast(&p->cv);
            }
            return TIDE_OK;
        }
        if (evict_one(p, w, want - w->held - (p->total - p->held_sum))) continue;
    wait:
        *waited = true;
        w->acquiring = true; /* a running batch of another admits no more (pool_admit) */
        pthread_cond_wait(&p->cv, &p->mu);
        w->acquiring = false;
    }
}

/* After w's request (mu held, model_busy still set): its share, if smaller
 * now, is applied at once; time-sliced, the budget is left held until
 * another workload's turn needs it (the plans stay while no one waits). */
static void release_after(tide_pool *p, tide_pool_workload *w) {
    w->running_turn = false;
    uint64_t t = target(p, w);
    bool others_wait = false;
    for (int i = 0; i < p->n; i++)
        if (p->w[i] != w && p->w[i]->waiting) others_wait = true;
    /* time-sliced: the share is left held until another turn needs its room
     * (evict_one), at once under serial when others wait (a whole-model
     * loader's turn takes the whole budget anyway) */
    if (w->held > t && (!p->sliced || (others_wait && p->policy != TIDE_POOL_TIDE)))
        if (shrink_locked(p, w, t, "its request ended"))
            pool_log_locked(p, "pool: '%s' could not be set to %llu bytes: %s", w->name, (unsigned long long)t,
                            tide_ctx_last_error(w->ctx));
    w->model_busy = false;
}

/* ---------------------------------------------------------------- predictions */

pool_predict pool_predictor(const tide_pool *p, const tide_pool_workload *w, tide_ctx *ctx) {
    return (pool_predict){.ctx = ctx, .hw = &w->hw, .host_budget = p->host_budget,
                          .host_addressable = p->be->vt->device_is_host, .weights_on_ssd = p->weights_on_ssd,
                          /* as the models' offloaded runs (policy tide) keep weights warm: place.c */
                          .warm = !p->be->vt->device_is_host || p->weights_on_ssd,
                          .cfg = &w->cfg, .ck = w->ck, .total = p->total, .ctx_len = w->ctx_len,
                          .cache_dtype = w->cache_dtype,
                          .name = w->name};
}

static tide_status find_bounds(tide_pool *p, tide_pool_workload *w) {
    pool_predict pp = pool_predictor(p, w, p->ctx);
    return pool_predict_bounds(&pp, &w->min, &w->need);
}

static tide_status plan_curve(const tide_pool *p, const tide_pool_workload *w, int prompt, int gen, pool_curve *cv) {
    pool_predict pp = pool_predictor(p, w, p->ctx);
    return pool_predict_curve(&pp, w->min, w->need, prompt, gen, cv);
}

/* ---------------------------------------------------------------- the pool */

tide_status tide_pool_new(tide_ctx *ctx, tide_backend *be, const tide_pool_opts *o, tide_pool **out) {
    *out = NULL;
    TIDE_OPTS_SIZE_CHECK(ctx, tide_pool_opts, o);
    if (!be || !o || !o->budget_bytes)
        return tide_err(ctx, TIDE_E_INVALID, "a pool needs a backend and a budget of at least one byte");
    if (!tide_pool_policy_name(o->policy))
        return tide_err(ctx, TIDE_E_INVALID, "unknown pool policy %d (tide, equal or serial)", (int)o->policy);
    tide_pool *p = tide_calloc(1, sizeof *p);
    if (!p) return tide_err(ctx, TIDE_E_NOMEM, "out of memory making a pool");
    p->ctx = ctx;
    p->be = be;
    p->policy = o->policy;
    p->total = o->budget_bytes;
    p->host_budget = o->host_budget;
    p->weights_on_ssd = o->weights_on_ssd;
    p->no_refit = o->no_refit;
    p->t0 = tide_now();
    p->log = o->log;
    p->log_user = o->log_user;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->mgmt, NULL);
    pthread_cond_init(&p->cv, NULL);
    tide_status st = TIDE_OK;
    if (o->ssd_dirs && !(p->ssd_dirs = tide_strdup(o->ssd_dirs))) st = tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    if (!st && o->hw) {
        if (!(p->hw_arg = tide_strdup(o->hw))) st = tide_err(ctx, TIDE_E_NOMEM, "out of memory");
        else st = tide_hw_load(ctx, o->hw, &p->hw);
    } else if (!st) {
        /* measured once; every model loads the same profile from a file of
         * the pool's, removed with it */
        char path[4096];
        const char *tmp = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/tide-pool-hw-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        int fd = -1;
        if (!(st = tide_probe_backend(ctx, be, p->ssd_dirs, 1.0, NULL, &p->hw))) {
            if ((fd = mkstemp(path)) < 0)
                st = tide_err(ctx, TIDE_E_IO, "cannot make '%s' for the measured profile", path);
            else close(fd);
        }
        if (!st && !(p->hw_arg = tide_strdup(path))) {
            unlink(path);
            st = tide_err(ctx, TIDE_E_NOMEM, "out of memory");
        }
        if (!st) {
            p->hw_tmp = true;
            st = tide_hw_save(ctx, &p->hw, p->hw_arg);
        }
    }
    if (!st && !be->vt->device_is_host && tide_backend_matmul(be) == TIDE_MATMUL_F32) {
        /* as the models' own plans assume: 16-bit weights at the f32 rate */
        for (int d = 0; d < TIDE_DTYPE_COUNT; d++)
            if (d == TIDE_F16 || d == TIDE_BF16) p->hw.flops[d] = TIDE_MIN(p->hw.flops[d], p->hw.flops[TIDE_F32]);
    }
    if (st) {
        tide_pool_free(p);
        return st;
    }
    p->sliced = p->policy == TIDE_POOL_SERIAL;
    *out = p;
    return TIDE_OK;
}

static void workload_stop(tide_pool *p, tide_pool_workload *w);
static void *worker_main(void *arg);

static void workload_free(tide_pool_workload *w) {
    if (!w) return;
    tide_model_free(w->m);
    tide_ctx_free(w->ctx);
    tide_free(w->name);
    tide_free(w);
}

void tide_pool_free(tide_pool *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        workload_stop(p, p->w[i]);
        workload_free(p->w[i]);
    }
    tide_free(p->w);
    pool_models_free(p); /* the checkpoints the workloads used: after them */
    if (p->hw_tmp) unlink(p->hw_arg);
    tide_free(p->hw_arg);
    tide_free(p->ssd_dirs);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mgmt);
    pthread_mutex_destroy(&p->mu);
    tide_free(p);
}

void tide_pool_set_held_hook(tide_pool *p, tide_pool_held_hook fn, void *user) {
    pthread_mutex_lock(&p->mu);
    p->hook = fn;
    p->hook_user = user;
    pthread_mutex_unlock(&p->mu);
}

/* The typical request clamped to w's context: prompt + gen - 1 positions. */
static void clamp_demand(const tide_pool_workload *w, int *prompt, int *gen) {
    *prompt = TIDE_MAX(1, TIDE_MIN(*prompt, w->ctx_len));
    *gen = TIDE_MAX(1, TIDE_MIN(*gen, w->ctx_len - *prompt + 1));
}

tide_status tide_pool_add_model(tide_pool *p, const char *name, tide_checkpoint *ck, const tide_model_opts *mo,
                                tide_pool_workload **out) {
    if (out) *out = NULL;
    if (!name || !*name || !ck || !out)
        return tide_err(p->ctx, TIDE_E_INVALID, "a workload needs a name, a checkpoint and somewhere to return it");
    pthread_mutex_lock(&p->mgmt);
    tide_status st = TIDE_OK;
    tide_pool_workload *w = tide_calloc(1, sizeof *w);
    if (!w || !(w->name = tide_strdup(name)) || !(w->ctx = tide_ctx_new())) {
        st = tide_err(p->ctx, TIDE_E_NOMEM, "out of memory adding workload '%s'", name);
        goto fail;
    }
    pthread_mutex_lock(&p->mu);
    bool dup = false;
    for (int i = 0; i < p->n; i++) dup |= !strcmp(p->w[i]->name, name);
    pthread_mutex_unlock(&p->mu);
    if (dup) {
        st = tide_err(p->ctx, TIDE_E_INVALID, "the pool already has a workload named '%s'", name);
        goto fail;
    }
    w->pool = p;
    w->ck = ck;
    w->cfg = *tide_checkpoint_config(ck);
    w->hw = p->hw;
    if ((st = tide_model_new(w->ctx, ck, p->be, mo, &w->m))) {
        st = tide_err(p->ctx, st, "workload '%s': %s", name, tide_ctx_last_error(w->ctx));
        goto fail;
    }
    w->ctx_len = mo && mo->ctx_len > 0 ? mo->ctx_len : w->cfg.max_position_embeddings;
    w->cache_dtype = mo ? mo->cache_dtype : TIDE_F32;
    w->max_batch = TIDE_MAX(1, TIDE_MIN(mo && mo->max_batch > 0 ? mo->max_batch : 1, TIDE_MAX_BATCH));
    w->prompt = POOL_PROMPT;
    w->gen = POOL_NEW;
    w->weight = 1;
    clamp_demand(w, &w->prompt, &w->gen);
    if ((st = find_bounds(p, w)) || (st = plan_curve(p, w, w->prompt, w->gen, &w->cv))) goto fail;
    /* checks the offload options once, now; nothing is planned or allocated yet */
    if ((st = apply_budget(p, w, w->min))) {
        st = tide_err(p->ctx, st, "workload '%s': %s", name, tide_ctx_last_error(w->ctx));
        goto fail;
    }
    w->configured = w->min;
    pthread_mutex_lock(&p->mu);
    if (w->min > p->total) {
        pthread_mutex_unlock(&p->mu);
        st = tide_err(p->ctx, TIDE_E_INFEASIBLE, "workload '%s' needs at least %llu bytes, more than the pool's "
                      "budget of %llu bytes", name, (unsigned long long)w->min, (unsigned long long)p->total);
        goto fail;
    }
    if (p->policy == TIDE_POOL_EQUAL) {
        uint64_t s = equal_share(p, p->n + 1);
        const tide_pool_workload *worst = w;
        for (int i = 0; i < p->n; i++)
            if (p->w[i]->min > worst->min) worst = p->w[i];
        if (worst->min > s) {
            pthread_mutex_unlock(&p->mu);
            st = tide_err(p->ctx, TIDE_E_INFEASIBLE, "policy equal: a share of %llu bytes (%llu bytes over %d "
                          "workloads) is below workload '%s''s minimum of %llu bytes: '%s' is not added",
                          (unsigned long long)s, (unsigned long long)p->total, p->n + 1, worst->name,
                          (unsigned long long)worst->min, name);
            goto fail;
        }
    }
    if (tide_grow((void **)&p->w, &p->cap, p->n + 1, sizeof *p->w)) {
        pthread_mutex_unlock(&p->mu);
        st = tide_err(p->ctx, TIDE_E_NOMEM, "out of memory adding workload '%s'", name);
        goto fail;
    }
    /* its worker waits on mu, held here, until the workload is in the pool */
    if (pthread_create(&w->worker, NULL, worker_main, w)) {
        pthread_mutex_unlock(&p->mu);
        st = tide_err(p->ctx, TIDE_E_NOMEM, "cannot start a thread for workload '%s'", name);
        goto fail;
    }
    w->worker_on = true;
    p->w[p->n++] = w;
    char why[160];
    snprintf(why, sizeof why, "'%.100s' arrived (minimum %llu bytes)", name, (unsigned long long)w->min);
    pool_partition(p, why);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->mgmt);
    *out = w;
    return TIDE_OK;
fail:
    workload_free(w);
    pthread_mutex_unlock(&p->mgmt);
    return st;
}

tide_status tide_pool_remove(tide_pool *p, tide_pool_workload *w) {
    pthread_mutex_lock(&p->mu);
    if (index_of(p, w) < 0 || w->leaving) {
        pthread_mutex_unlock(&p->mu);
        pthread_mutex_lock(&p->mgmt);
        tide_status st = tide_err(p->ctx, TIDE_E_INVALID, "no such workload in the pool (or being removed)");
        pthread_mutex_unlock(&p->mgmt);
        return st;
    }
    /* mgmt is not held while the requests drain: a refused request records
     * its message under it */
    w->leaving = true;
    pthread_cond_broadcast(&p->cv);
    while (w->users > 0 || w->model_busy) pthread_cond_wait(&p->cv, &p->mu);
    w->model_busy = true; /* nothing else touches it now; its arena goes with the model */
    pthread_mutex_unlock(&p->mu);
    workload_stop(p, w);
    pthread_mutex_lock(&p->mgmt); /* a set_demand of w planning now finishes first */
    tide_model_free(w->m);
    w->m = NULL;
    pthread_mutex_lock(&p->mu);
    set_held(p, w, 0);
    int i = index_of(p, w);
    memmove(&p->w[i], &p->w[i + 1], (size_t)(p->n - i - 1) * sizeof *p->w);
    p->n--;
    char why[160];
    snprintf(why, sizeof why, "'%.100s' left", w->name);
    pool_partition(p, why);
    pthread_mutex_unlock(&p->mu);
    workload_free(w);
    pthread_mutex_unlock(&p->mgmt);
    return TIDE_OK;
}

tide_pool_workload *tide_pool_find(tide_pool *p, const char *name) {
    tide_pool_workload *r = NULL;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; name && i < p->n && !r; i++)
        if (!strcmp(p->w[i]->name, name) && !p->w[i]->leaving) r = p->w[i];
    pthread_mutex_unlock(&p->mu);
    return r;
}

tide_ctx *tide_pool_workload_ctx(tide_pool_workload *w) { return w ? w->ctx : NULL; }

tide_status tide_pool_set_demand(tide_pool *p, tide_pool_workload *w, int prompt_tokens, int new_tokens,
                                 double weight) {
    pthread_mutex_lock(&p->mgmt);
    pthread_mutex_lock(&p->mu);
    bool in = index_of(p, w) >= 0 && !w->leaving;
    pthread_mutex_unlock(&p->mu);
    tide_status st = TIDE_OK;
    if (!in) st = tide_err(p->ctx, TIDE_E_INVALID, "no such workload in the pool");
    else if (prompt_tokens < 0 || new_tokens < 0 || weight < 0 || !isfinite(weight))
        st = tide_err(p->ctx, TIDE_E_INVALID, "a demand of %d prompt tokens, %d new tokens and weight %g",
                      prompt_tokens, new_tokens, weight);
    if (st) {
        pthread_mutex_unlock(&p->mgmt);
        return st;
    }
    /* w stays: only a management call removes it, and mgmt is held */
    int prompt = prompt_tokens ? prompt_tokens : w->prompt, gen = new_tokens ? new_tokens : w->gen;
    clamp_demand(w, &prompt, &gen);
    pool_curve cv;
    if ((st = plan_curve(p, w, prompt, gen, &cv))) {
        pthread_mutex_unlock(&p->mgmt);
        return st;
    }
    pthread_mutex_lock(&p->mu);
    w->prompt = prompt;
    w->gen = gen;
    if (weight > 0) w->weight = weight;
    w->cv = cv;
    char why[200];
    snprintf(why, sizeof why, "'%.100s' expects %d + %d tokens x %g", w->name, prompt, gen, w->weight);
    pool_partition(p, why);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->mgmt);
    return TIDE_OK;
}

/* Counts n completed requests (one batch, statistics gs) into w and the pool
 * (mu held). */
static void record(tide_pool *p, tide_pool_workload *w, const tide_gen_stats *gs, int n) {
    double pred = gs->predicted_s, meas = gs->exec_s;
    w->requests += n;
    p->requests += n;
    w->pred_s += pred;
    w->meas_s += meas;
    p->pred_s += pred;
    p->meas_s += meas;
    w->peak_dev = TIDE_MAX(w->peak_dev, gs->peak_device_bytes);
    if (n > 1) {
        w->batches++;
        p->batches++;
        w->batched += n;
        p->batched += n;
    }
    if (pred > 0 && fabs(meas - pred) > POOL_DRIFT * pred) {
        w->drifted++;
        p->drifted++;
        if (p->no_refit && !w->drift_logged) { /* else pool_refit_after says what it did */
            w->drift_logged = true;
            pool_log_locked(p, "pool: '%s' measured %.6g s against %.6g s predicted (%.2fx): drift beyond %.0f%% "
                            "(counted in the stats; no_refit: the cost model is not refitted)", w->name, meas, pred,
                            meas / pred, POOL_DRIFT * 100);
        }
    }
}

/* ---------------------------------------------------------------- requests
 *
 * A request joins its workload's queue and its thread waits. The
 * workload's worker thread (worker_main) leads while requests are queued:
 * it claims the workload, takes its share (acquire, which may wait;
 * requests arriving meanwhile join the queue), then runs one batch outside
 * mu (tide_model_generate_batch_ex): before each decode step the batch
 * admits queued requests into its free rows (pool_admit, while admit_ok:
 * never past a re-partition of its share or another workload waiting for
 * room or a turn), and each request is handed back to its thread the
 * moment it ends (pool_done). The batch's measurements are recorded, and
 * may refit the cost model, when it ends. */

static void queue_remove(tide_pool_workload *w, pool_req *r) {
    pool_req **pp = &w->q_head, *prev = NULL;
    while (*pp && *pp != r) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = r->next;
    if (w->q_tail == r) w->q_tail = prev;
    r->next = NULL;
}

/* Records the failure st of request r: its own context gets the message
 * of src (the workload's, where the run recorded it). */
static void req_fail(pool_req *r, tide_ctx *src, tide_status st) {
    r->st = st;
    if (r->ctx && r->ctx != src) tide_err(r->ctx, st, "%s", tide_ctx_last_error(src));
}

/* A batch being led: what its hooks need. */
typedef struct lead_state {
    tide_pool *p;
    tide_pool_workload *w;
    int admitted, ran;
    int live;                        /* admitted and not yet ended */
    pool_req *held[TIDE_MAX_BATCH];  /* ended last of the batch so far: handed back
                                        once the batch is counted, or when another
                                        joins (release_held) */
    int n_held;
} lead_state;

/* Hands the held requests back to their threads (mu held). */
static void release_held(tide_pool *p, lead_state *ls) {
    for (int i = 0; i < ls->n_held; i++) ls->held[i]->done = true; /* not touched from here on */
    if (ls->n_held) pthread_cond_broadcast(&p->cv);
    ls->n_held = 0;
}

/* Whether w's running batch may take one more request from its queue (mu
 * held): its first always; then only while w is not leaving, its share is
 * the one it runs at (a re-partition waits for the batch to end), no other
 * workload waits for room, and, time-sliced, none waits for its turn: a
 * batch fed without end must not hold the budget from the others. */
static bool admit_ok(const tide_pool *p, const tide_pool_workload *w, int admitted) {
    if (w->leaving || !w->q_head) return false;
    if (!admitted) return true;
    if (!p->sliced && w->share != w->configured) return false;
    for (int i = 0; i < p->n; i++) {
        const tide_pool_workload *v = p->w[i];
        if (v != w && (v->acquiring || (p->sliced && v->waiting))) return false;
    }
    return true;
}

/* tide_batch_hooks.admit: the next request of w's queue, checked on its own
 * context (a refused one ends at once). */
static int pool_admit(void *user, tide_gen_request **req) {
    lead_state *ls = user;
    tide_pool *p = ls->p;
    tide_pool_workload *w = ls->w;
    pthread_mutex_lock(&p->mu);
    while (admit_ok(p, w, ls->admitted)) {
        pool_req *r = w->q_head;
        queue_remove(w, r);
        r->taken = true;
        w->waiting--;
        ls->admitted++;
        pthread_mutex_unlock(&p->mu);
        tide_ctx *ec = r->ctx ? r->ctx : w->ctx;
        tide_status st = TIDE_OK;
        if (r->g && r->g->start_pos)
            st = tide_err(ec, TIDE_E_UNSUPPORTED, "a pool's requests start at position 0: a workload's cache is "
                          "not kept between requests (its share may change, and batches use its rows)");
        else
            st = tide_model_check_generate(w->m, ec, r->prompt, r->n_prompt, r->max_new, r->g, r->out_tokens);
        if (!st) {
            r->gr = (tide_gen_request){.prompt = r->prompt, .n_prompt = r->n_prompt, .max_new = r->max_new,
                                       .opts = r->g, .out_tokens = r->out_tokens};
            *req = &r->gr;
            ls->live++;
            pthread_mutex_lock(&p->mu);
            release_held(p, ls); /* the batch goes on: they need not wait for its end */
            pthread_mutex_unlock(&p->mu);
            return 1;
        }
        pthread_mutex_lock(&p->mu);
        r->st = st;
        r->done = true; /* r is its thread's from here on */
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* tide_batch_hooks.done: request gr's results to its thread, which may
 * return at once; the last one of the batch so far only once the batch is
 * counted (record, refit: a request alone returns with its statistics in
 * the pool's), or when another joins. */
static void pool_done(void *user, tide_gen_request *gr) {
    lead_state *ls = user;
    pool_req *r = (pool_req *)((char *)gr - offsetof(pool_req, gr));
    r->n_out = gr->n_out;
    r->stats = gr->stats;
    if (gr->status) req_fail(r, ls->w->ctx, gr->status);
    else ls->ran++;
    ls->live--;
    pthread_mutex_lock(&ls->p->mu);
    ls->held[ls->n_held++] = r;
    if (ls->live > 0) release_held(ls->p, ls);
    pthread_mutex_unlock(&ls->p->mu);
}

/* Leads w (mu held, w->claimed set by its worker): its share, then one
 * batch, whose requests come from the queue (pool_admit) and go back to
 * their threads as each ends (pool_done). When the share cannot be had,
 * the first queued request fails (while w is leaving, the queued requests
 * refuse themselves). */
static void lead(tide_pool *p, tide_pool_workload *w) {
    bool waited = false;
    tide_status st = acquire(p, w, &waited);
    if (waited && w->q_head) w->q_head->waited = true;
    if (st) {
        pool_req *r = w->q_head;
        if (w->leaving || !r) return;
        queue_remove(w, r);
        w->waiting--;
        r->taken = true;
        req_fail(r, w->ctx, st);
        r->done = true; /* r is its thread's from here on */
        return;
    }
    pthread_mutex_unlock(&p->mu);
    lead_state ls = {.p = p, .w = w};
    tide_batch_hooks h = {.admit = pool_admit, .done = pool_done, .user = &ls};
    tide_gen_stats bs;
    st = tide_model_generate_batch_ex(w->m, NULL, 0, &h, &bs);
    bool measured = !st && ls.ran > 0; /* a failed run's measurements are not a request's */
    if (measured) pool_refit_after(p, w, &bs); /* claim and model_busy still held */
    pthread_mutex_lock(&p->mu);
    w->planned = true;
    if (measured) record(p, w, &bs, ls.ran);
    release_after(p, w);
    release_held(p, &ls);
}

/* A workload's worker: runs its batches while it has queued requests,
 * until told to stop (workload_stop). Its requests' threads only queue and
 * wait, so each returns the moment its request ends, whatever the batch
 * still runs. */
static void *worker_main(void *arg) {
    tide_pool_workload *w = arg;
    tide_pool *p = w->pool;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!w->stop && (!w->q_head || w->leaving)) pthread_cond_wait(&p->cv, &p->mu);
        if (w->stop) break;
        w->claimed = true;
        lead(p, w);
        w->claimed = false;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Stops w's worker and waits for it (mu not held; no batch of w running). */
static void workload_stop(tide_pool *p, tide_pool_workload *w) {
    if (!w->worker_on) return;
    pthread_mutex_lock(&p->mu);
    w->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(w->worker, NULL);
    w->worker_on = false;
}

tide_status tide_pool_generate_on(tide_pool *p, tide_pool_workload *w, tide_ctx *ctx, const int32_t *prompt,
                                  int n_prompt, int max_new, const tide_gen_opts *g, int32_t *out_tokens,
                                  int *n_out, tide_gen_stats *stats) {
    if (n_out) *n_out = 0;
    pthread_mutex_lock(&p->mu);
    if (index_of(p, w) < 0 || w->leaving) {
        pthread_mutex_unlock(&p->mu);
        pthread_mutex_lock(&p->mgmt);
        tide_status st = tide_err(p->ctx, TIDE_E_INVALID, "no such workload in the pool (or being removed)");
        if (ctx) tide_err(ctx, st, "%s", tide_ctx_last_error(p->ctx));
        pthread_mutex_unlock(&p->mgmt);
        return st;
    }
    w->users++;
    w->waiting++;
    pool_req r = {.prompt = prompt, .n_prompt = n_prompt, .max_new = max_new, .g = g, .out_tokens = out_tokens,
                  .ctx = ctx};
    if (w->q_tail) w->q_tail->next = &r;
    else w->q_head = &r;
    w->q_tail = &r;
    if (w->claimed) r.waited = true; /* behind a batch (it may join it) */
    pthread_cond_broadcast(&p->cv);  /* the worker */
    bool refused = false;
    while (!r.done) {
        if (!r.taken && w->leaving) { /* refused: w is being removed */
            queue_remove(w, &r);
            w->waiting--;
            r.done = refused = true;
            r.st = TIDE_E_INVALID;
            break;
        }
        pthread_cond_wait(&p->cv, &p->mu);
    }
    if (r.waited) p->waits++;
    w->users--; /* w may be freed from here on */
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (refused) {
        pthread_mutex_lock(&p->mgmt);
        tide_err(p->ctx, TIDE_E_INVALID, "the workload is being removed: request refused");
        if (ctx) tide_err(ctx, TIDE_E_INVALID, "the workload is being removed: request refused");
        pthread_mutex_unlock(&p->mgmt);
    }
    if (n_out) *n_out = r.n_out;
    if (!r.st && stats) *stats = r.stats;
    return r.st;
}

tide_status tide_pool_generate(tide_pool *p, tide_pool_workload *w, const int32_t *prompt, int n_prompt,
                               int max_new, const tide_gen_opts *g, int32_t *out_tokens, int *n_out,
                               tide_gen_stats *stats) {
    return tide_pool_generate_on(p, w, NULL, prompt, n_prompt, max_new, g, out_tokens, n_out, stats);
}

void tide_pool_stats_get(tide_pool *p, tide_pool_stats *s) {
    pthread_mutex_lock(&p->mu);
    *s = (tide_pool_stats){.budget_bytes = p->total, .n_workloads = p->n, .time_sliced = p->sliced,
                           .held_bytes = p->held_sum, .peak_held_bytes = p->peak_held,
                           .partitions = p->partitions, .replans = p->replans, .waits = p->waits,
                           .requests = p->requests, .drifted = p->drifted, .refits = p->refits,
                           .batches = p->batches, .batched_requests = p->batched,
                           .evictions = p->evictions, .predicted_s = p->pred_s,
                           .measured_s = p->meas_s};
    for (int i = 0; i < p->n; i++) s->shares_bytes += p->w[i]->share;
    pthread_mutex_unlock(&p->mu);
}

tide_status tide_pool_workload_stats_get(tide_pool *p, tide_pool_workload *w, tide_pool_workload_stats *s) {
    pthread_mutex_lock(&p->mu);
    if (index_of(p, w) < 0) {
        pthread_mutex_unlock(&p->mu);
        memset(s, 0, sizeof *s);
        return TIDE_E_INVALID;
    }
    *s = (tide_pool_workload_stats){.share_bytes = target(p, w), .held_bytes = w->held, .min_bytes = w->min,
                                    .need_bytes = w->need, .waiting = w->waiting, .requests = w->requests,
                                    .drifted = w->drifted, .replans = w->replans, .refits = w->refits,
                                    .batches = w->batches, .batched_requests = w->batched,
                                    .max_batch = w->max_batch,
                                    .predicted_s = w->pred_s,
                                    .measured_s = w->meas_s, .peak_device_bytes = w->peak_dev};
    s->predicted_request_s = pool_predicted_at(w, p->sliced ? p->total : w->share);
    pthread_mutex_unlock(&p->mu);
    return TIDE_OK;
}
