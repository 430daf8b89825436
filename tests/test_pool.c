/*
 * test_pool.c - the device-budget arbiter (tide_pool, src/serve/pool.c) on
 * the CPU backend with the three committed fixtures (tests/fixtures):
 *
 *   - random arrival and departure traces of 2 to 5 workloads (seeded,
 *     bounded), requests issued from three threads at once, under each
 *     policy: every request's ids and logits hash equal the same request run
 *     alone on a resident model (bit for bit), every request succeeds (a plan
 *     the verifier rejects would fail it with TIDE_E_VERIFY), each plan's
 *     peak within the share it ran at; the budget never exceeded at any
 *     instant, seen three ways: the pool's hook on every change of the shares
 *     in use, the peak in its stats, and the device memory the backend
 *     actually hands out (every alloc counted before it is made); nothing
 *     left allocated once every workload has left;
 *   - each workload's minimum plannable and its plan verified there;
 *   - tide's partition predicted no slower than equal shares;
 *   - tide's fallback to time-slicing when the minimums do not fit, and back;
 *   - removing a workload with a request in flight waits for it, and refuses
 *     the request queued behind it;
 *   - requests of one workload run as one batch (the traces' workloads take
 *     up to three), those queued while a batch runs joining it between its
 *     steps, each equal to its run alone;
 *   - bad input: no budget, unknown policy, duplicate name, a minimum above
 *     the budget, equal shares below a minimum, unknown workloads,
 *     continuation requests.
 *
 * What it proves: the device-budget arbiter on the three fixtures, CPU
 * backend: random arrival and departure traces of 2-5 workloads (seeded, two
 * budgets per policy) with requests from three threads, under `tide` (one
 * budget time-slices at times), `equal` and `serial`: every request's ids and
 * logits hash equal to the same request run alone on a resident model, each
 * plan's peak within the share it ran at, the budget never exceeded at any
 * instant (the pool's hook on every change of the shares in use, and every
 * device allocation of the backend counted before it is made), nothing leaked
 * once all have left; the same traces where device memory is not host memory
 * (the asynchronous test backend taking the GPU paths: weights loaded into
 * each share's arena), every request still equal to the CPU's run alone; the
 * same again with every workload's weights homed on SSD on the CPU backend
 * (the minimums grow: the weights stream through the shares); each workload's
 * minimum planned and verified at exactly that budget; `tide` shares
 * predicted no slower than `equal` ones (both priced from the same planned
 * points of each workload's curve); the fallback to time-slicing and back;
 * removing a workload with a request in flight (waits for it, refuses the one
 * queued behind it); bad input (no budget, unknown policy or profile,
 * duplicate name, a minimum above the budget, equal shares below a minimum,
 * unknown or foreign workloads, continuation requests, bad tokens); with no
 * profile given, the machine measured once and its temporary profile file
 * gone with the pool; the traces' workloads batch up to three waiting
 * requests (every batched request equal to its run alone); three requests
 * queued behind a running one run as one batch, each equal to its run alone.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "async_backend.h"
#include "test_select.h"
#include "backend/backend.h"
#include "core/alloc_test.h"
#include "planner/planner.h"
#include "serve/pool_int.h"
#include "verify/verify.h"

#include <dirent.h>
#include <stdatomic.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { N_FIX = 3, N_KIND = 4, CTX_LEN = 64, MAX_NEW = 12, MAX_SLOTS = 16, N_THREADS = 3 };

static const char *const fixture_names[N_FIX] = {"tiny-bf16-gqa", "tiny-f32-mha", "tiny-f16-sharded"};
static const int kind_prompt[N_KIND] = {5, 11, 24, 40};
static const int kind_new[N_KIND] = {6, 10, 3, 12};

static tide_ctx *ctx;          /* the pools' and the test's */
static tide_ctx *be_ctx;       /* the backends': executors running at once write it */
static tide_checkpoint *ck[N_FIX];
static tide_backend *be;      /* the pools' backend, its allocations counted */
static char spill_dir[64];
static uint64_t min_b[N_FIX], need_b[N_FIX];

/* A request kind's prompt and what it gives alone on a resident model. */
typedef struct reference {
    int32_t prompt[64];
    int32_t tok[MAX_NEW];
    int n_out;
    uint64_t hash;
} reference;
static reference refs[N_FIX][N_KIND];

/* up to N_THREADS requests of a workload waiting together run as one batch */
static const tide_model_opts model_opts = {.max_batch = N_THREADS, .ctx_len = CTX_LEN};

/* ---------------------------------------------------------------- counted device memory */

/* Every live device allocation of the pools' backend, counted before it is
 * made (and uncounted after it is freed), so the count is never below what
 * is really held; over_limit records a moment it passed `limit`. */
enum { MAX_LIVE = 256 };
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t n; } live[MAX_LIVE];
static uint64_t live_bytes, live_peak, live_limit;
static bool over_limit;
static const tide_backend_vt *inner_vt;
static tide_backend_vt counted_vt;

static tide_status counted_alloc(tide_backend *b, size_t n, void **ptr) {
    pthread_mutex_lock(&live_mu);
    live_bytes += n;
    if (live_bytes > live_peak) live_peak = live_bytes;
    if (live_limit && live_bytes > live_limit) over_limit = true;
    pthread_mutex_unlock(&live_mu);
    tide_status st = inner_vt->alloc(b, n, ptr);
    pthread_mutex_lock(&live_mu);
    int i = 0;
    while (!st && i < MAX_LIVE && live[i].p) i++;
    if (!st && i < MAX_LIVE) live[i].p = *ptr, live[i].n = n;
    else live_bytes -= n;
    if (!st && i == MAX_LIVE) over_limit = true; /* table full: fail loudly */
    pthread_mutex_unlock(&live_mu);
    return st;
}

static void counted_dealloc(tide_backend *b, void *ptr) {
    inner_vt->dealloc(b, ptr);
    pthread_mutex_lock(&live_mu);
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i].p == ptr) {
            live_bytes -= live[i].n;
            live[i].p = NULL;
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

static void limit_live(uint64_t limit) {
    pthread_mutex_lock(&live_mu);
    live_limit = limit;
    live_peak = live_bytes;
    over_limit = false;
    pthread_mutex_unlock(&live_mu);
}

/* ---------------------------------------------------------------- the pool's hook */

typedef struct held_watch {
    pthread_mutex_t mu;
    uint64_t peak, changes;
    bool over;
} held_watch;

static void on_held(void *user, uint64_t held, uint64_t budget) {
    held_watch *h = user; /* called under the pool's lock: one at a time per pool */
    pthread_mutex_lock(&h->mu);
    h->changes++;
    if (held > h->peak) h->peak = held;
    if (held > budget) h->over = true;
    pthread_mutex_unlock(&h->mu);
}

typedef struct log_count {
    pthread_mutex_t mu;
    int lines, sliced, unsliced;
} log_count;

static void on_log(void *user, const char *line) {
    log_count *l = user;
    pthread_mutex_lock(&l->mu);
    l->lines++;
    if (strstr(line, "time-slicing, one workload")) l->sliced++;
    if (strstr(line, "shares replace time-slicing")) l->unsliced++;
    pthread_mutex_unlock(&l->mu);
    if (getenv("TIDE_TEST_VERBOSE")) fprintf(stderr, "  %s\n", line);
}

/* ---------------------------------------------------------------- setup */

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static bool weights_ssd; /* the pools' workloads home their weights on SSD */

static tide_pool *pool_make(tide_pool_policy policy, uint64_t budget, log_count *lc) {
    tide_pool_opts o = {.budget_bytes = budget, .policy = policy, .hw = "h100-80g", .ssd_dirs = spill_dir,
                        .weights_on_ssd = weights_ssd, .log = lc ? on_log : NULL, .log_user = lc};
    tide_pool *p = NULL;
    tide_status st = tide_pool_new(ctx, be, &o, &p);
    if (st) fail_msg("tide_pool_new: %s", tide_ctx_last_error(ctx));
    return p;
}

/* Every fixture's minimum and need on the current backend, from a pool with
 * room for all, into min_b and need_b. */
static bool measure_bounds(void) {
    tide_pool *p = pool_make(TIDE_POOL_TIDE, UINT64_C(1) << 30, NULL);
    bool ok = true;
    for (int f = 0; f < N_FIX && ok; f++) {
        tide_pool_workload *w = NULL;
        if (tide_pool_add_model(p, fixture_names[f], ck[f], &model_opts, &w)) {
            fprintf(stderr, "test_pool: %s\n", tide_ctx_last_error(ctx));
            ok = false;
            break;
        }
        tide_pool_workload_stats ws;
        tide_pool_workload_stats_get(p, w, &ws);
        min_b[f] = ws.min_bytes;
        need_b[f] = ws.need_bytes;
        if (getenv("TIDE_TEST_VERBOSE"))
            fprintf(stderr, "  %s on %s: minimum %llu, need %llu, predicted %.3g s\n", fixture_names[f],
                    tide_backend_name(be), (unsigned long long)min_b[f], (unsigned long long)need_b[f],
                    ws.predicted_request_s);
    }
    tide_pool_free(p);
    return ok;
}

static int group_setup(void **state) {
    (void)state;
    const char *root = getenv("TIDE_FIXTURES");
    if (!root) {
        fprintf(stderr, "test_pool: TIDE_FIXTURES is not set (ctest sets it to tests/fixtures)\n");
        return -1;
    }
    snprintf(spill_dir, sizeof spill_dir, "/tmp/tide-pool-spill-XXXXXX");
    if (!mkdtemp(spill_dir) || !(ctx = tide_ctx_new()) || !(be_ctx = tide_ctx_new())) return -1;
    tide_backend *ref_be = NULL;
    if (tide_backend_new(be_ctx, TIDE_BACKEND_CPU, &ref_be) || tide_backend_new(be_ctx, TIDE_BACKEND_CPU, &be))
        return -1;
    inner_vt = be->vt;
    counted_vt = *be->vt;
    counted_vt.alloc = counted_alloc;
    counted_vt.dealloc = counted_dealloc;
    be->vt = &counted_vt;
    uint64_t seed = 17;
    for (int f = 0; f < N_FIX; f++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", root, fixture_names[f]);
        if (tide_checkpoint_open(ctx, dir, &ck[f])) {
            fprintf(stderr, "test_pool: %s\n", tide_ctx_last_error(ctx));
            return -1;
        }
        /* each request kind alone, on a resident model of its own backend */
        tide_model *m = NULL;
        if (tide_model_new(ctx, ck[f], ref_be, &model_opts, &m)) return -1;
        int v = tide_checkpoint_config(ck[f])->vocab_size;
        for (int k = 0; k < N_KIND; k++) {
            reference *r = &refs[f][k];
            for (int i = 0; i < kind_prompt[k]; i++) r->prompt[i] = (int32_t)(rng_next(&seed) % (uint64_t)v);
            tide_gen_stats gs;
            if (tide_model_generate_ex(m, r->prompt, kind_prompt[k], kind_new[k], NULL, r->tok, &r->n_out, &gs)) {
                fprintf(stderr, "test_pool: reference: %s\n", tide_ctx_last_error(ctx));
                return -1;
            }
            r->hash = gs.logits_hash;
        }
        tide_model_free(m);
    }
    tide_backend_free(ref_be);
    return measure_bounds() ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    for (int f = 0; f < N_FIX; f++) tide_checkpoint_free(ck[f]);
    tide_backend_free(be);
    tide_ctx_free(be_ctx);
    tide_ctx_free(ctx);
    nftw(spill_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    return 0;
}

static uint64_t max_of(const uint64_t *a) {
    uint64_t m = 0;
    for (int f = 0; f < N_FIX; f++) m = a[f] > m ? a[f] : m;
    return m;
}

/* ---------------------------------------------------------------- requests */

/* A workload of the test: which fixture it runs, and who is using its handle. */
typedef struct slot {
    tide_pool_workload *w;
    int fix;
    int refs;     /* threads holding the handle */
    int running;  /* of them, inside a running request (past its first id) */
    bool removing;
} slot;

typedef struct trace {
    tide_pool *p;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    slot s[MAX_SLOTS];
    bool stop;
    int requests, per_thread;
    char fail[512];
} trace;

typedef struct req_arg {
    trace *t;
    int si;
    bool marked;
} req_arg;

static int mark_running(void *user, int32_t id) {
    (void)id;
    req_arg *a = user;
    if (!a->marked) {
        a->marked = true;
        pthread_mutex_lock(&a->t->mu);
        a->t->s[a->si].running++;
        pthread_cond_broadcast(&a->t->cv);
        pthread_mutex_unlock(&a->t->mu);
    }
    return 0;
}

static void trace_fail(trace *t, const char *fmt, ...) {
    pthread_mutex_lock(&t->mu);
    if (!t->fail[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->fail, sizeof t->fail, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&t->mu);
}

/* Runs request kind k of slot si's fixture through the pool and checks it. */
static void one_request(trace *t, int si, int k) {
    slot *s = &t->s[si];
    tide_pool_workload *w = s->w;
    const reference *r = &refs[s->fix][k];
    req_arg a = {.t = t, .si = si};
    tide_gen_opts go = {.on_token = mark_running, .user = &a};
    int32_t tok[MAX_NEW];
    int n = 0;
    tide_gen_stats gs;
    tide_status st = tide_pool_generate(t->p, w, r->prompt, kind_prompt[k], kind_new[k], &go, tok, &n, &gs);
    if (st) trace_fail(t, "request %s of kind %d: %s: %s", fixture_names[s->fix], k, tide_status_str(st),
                       tide_ctx_last_error(tide_pool_workload_ctx(w)));
    else if (n != r->n_out || memcmp(tok, r->tok, (size_t)n * sizeof *tok) || gs.logits_hash != r->hash)
        trace_fail(t, "request %s of kind %d differs from its run alone", fixture_names[s->fix], k);
    else if (!gs.budget_bytes || gs.peak_device_bytes > gs.budget_bytes)
        trace_fail(t, "request %s of kind %d: plan peak %llu above its share %llu", fixture_names[s->fix], k,
                   (unsigned long long)gs.peak_device_bytes, (unsigned long long)gs.budget_bytes);
    pthread_mutex_lock(&t->mu);
    if (a.marked) s->running--;
    s->refs--;
    t->requests++;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

typedef struct worker_arg {
    trace *t;
    uint64_t seed;
} worker_arg;

static void *worker(void *p) {
    worker_arg *wa = p;
    trace *t = wa->t;
    for (int done = 0; done < t->per_thread;) {
        pthread_mutex_lock(&t->mu);
        int live[MAX_SLOTS], n = 0;
        for (int i = 0; i < MAX_SLOTS; i++)
            if (t->s[i].w && !t->s[i].removing) live[n++] = i;
        if (t->stop) {
            pthread_mutex_unlock(&t->mu);
            break;
        }
        if (!n) {
            pthread_mutex_unlock(&t->mu);
            usleep(1000);
            continue;
        }
        int si = live[rng_next(&wa->seed) % (uint64_t)n];
        t->s[si].refs++;
        pthread_mutex_unlock(&t->mu);
        one_request(t, si, (int)(rng_next(&wa->seed) % N_KIND));
        done++;
    }
    return NULL;
}

/* Adds a workload of a random fixture into a free slot. */
static void trace_add(trace *t, uint64_t *seed, int serial) {
    int si = 0;
    pthread_mutex_lock(&t->mu);
    while (si < MAX_SLOTS && (t->s[si].w || t->s[si].removing)) si++;
    pthread_mutex_unlock(&t->mu);
    if (si == MAX_SLOTS) return;
    int f = (int)(rng_next(seed) % N_FIX);
    char name[32];
    snprintf(name, sizeof name, "w%d-%s", serial, fixture_names[f]);
    tide_pool_workload *w = NULL;
    tide_status st = tide_pool_add_model(t->p, name, ck[f], &model_opts, &w);
    if (st) fail_msg("adding %s: %s", name, tide_ctx_last_error(ctx));
    pthread_mutex_lock(&t->mu);
    t->s[si] = (slot){.w = w, .fix = f};
    pthread_mutex_unlock(&t->mu);
}

/* Removes slot si's workload once every thread holding its handle is inside
 * a running request (the pool waits for those) or has let it go. */
static void trace_remove(trace *t, int si) {
    pthread_mutex_lock(&t->mu);
    t->s[si].removing = true;
    while (t->s[si].refs != t->s[si].running) pthread_cond_wait(&t->cv, &t->mu);
    tide_pool_workload *w = t->s[si].w;
    pthread_mutex_unlock(&t->mu);
    tide_status st = tide_pool_remove(t->p, w);
    if (st) fail_msg("removing: %s", tide_ctx_last_error(ctx));
    pthread_mutex_lock(&t->mu);
    /* the requests in flight ended inside the pool before it returned; their
     * threads let go of the handle just after */
    while (t->s[si].refs) pthread_cond_wait(&t->cv, &t->mu);
    t->s[si] = (slot){0};
    pthread_mutex_unlock(&t->mu);
}

static int live_slots(trace *t, int *which) {
    int n = 0;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < MAX_SLOTS; i++)
        if (t->s[i].w) which[n++] = i;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* A random trace: arrivals and departures of 2 to 5 workloads while three
 * threads issue requests, then every workload leaves. */
static void run_trace(tide_pool_policy policy, uint64_t budget, uint64_t seed, int events) {
    int64_t base = tide_alloc_live_bytes();
    limit_live(budget);
    log_count lc = {.mu = PTHREAD_MUTEX_INITIALIZER};
    held_watch hw = {.mu = PTHREAD_MUTEX_INITIALIZER};
    trace *t = calloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->p = pool_make(policy, budget, &lc);
    tide_pool_set_held_hook(t->p, on_held, &hw);
    t->per_thread = 16;
    int serial = 0;
    trace_add(t, &seed, serial++);
    trace_add(t, &seed, serial++);
    pthread_t th[N_THREADS];
    worker_arg wa[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        wa[i] = (worker_arg){.t = t, .seed = seed * 31 + (uint64_t)i};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &wa[i]), 0);
    }
    for (int e = 0; e < events; e++) {
        usleep((useconds_t)(rng_next(&seed) % 20000));
        int which[MAX_SLOTS], n = live_slots(t, which);
        bool add = n < 2 || (n < 5 && rng_next(&seed) % 100 < 55);
        if (add) trace_add(t, &seed, serial++);
        else trace_remove(t, which[rng_next(&seed) % (uint64_t)n]);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    if (t->fail[0]) fail_msg("%s policy: %s", tide_pool_policy_name(policy), t->fail);
    tide_pool_stats ps;
    tide_pool_stats_get(t->p, &ps);
    int which[MAX_SLOTS], n = live_slots(t, which);
    for (int i = 0; i < n; i++) trace_remove(t, which[i]);
    tide_pool_stats end;
    tide_pool_stats_get(t->p, &end);
    print_message("  %s: budget %llu, %d requests, %lld partitions, %lld replans, %lld waits, peak held %llu, "
                  "peak device %llu, drifted %lld of %lld (measured %.3g s, predicted %.3g s), %lld batches of "
                  "%lld requests, %d log lines\n",
                  tide_pool_policy_name(policy), (unsigned long long)budget, t->requests,
                  (long long)end.partitions, (long long)end.replans, (long long)end.waits,
                  (unsigned long long)end.peak_held_bytes, (unsigned long long)live_peak, (long long)end.drifted,
                  (long long)end.requests, end.measured_s, end.predicted_s, (long long)end.batches,
                  (long long)end.batched_requests, lc.lines);
    assert_int_equal(t->requests, N_THREADS * t->per_thread);
    assert_int_equal(end.requests, t->requests);
    assert_int_equal(end.n_workloads, 0);
    assert_int_equal(end.held_bytes, 0);
    assert_true(end.peak_held_bytes <= budget);
    assert_false(hw.over);
    assert_true(hw.changes > 0);
    assert_int_equal(hw.peak, end.peak_held_bytes);
    assert_false(over_limit);
    assert_true(live_peak <= budget);
    assert_int_equal(live_bytes, 0);
    assert_true(lc.lines >= end.partitions);
    tide_pool_free(t->p);
    limit_live(0);
    assert_int_equal(tide_alloc_live_bytes(), base); /* nothing leaked */
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* Budgets: tide's between one workload's need and the minimums of five
 * (sometimes time-sliced); equal's with room for five equal shares; serial's
 * the largest need. */
static void test_trace_tide(void **state) {
    (void)state;
    run_trace(TIDE_POOL_TIDE, 2 * max_of(need_b) + max_of(min_b), 101, 20);
    run_trace(TIDE_POOL_TIDE, 3 * max_of(min_b), 202, 20);
}

static void test_trace_equal(void **state) {
    (void)state;
    run_trace(TIDE_POOL_EQUAL, 5 * (tide_plan_align(max_of(min_b)) + TIDE_PLAN_ALIGN), 303, 20);
    run_trace(TIDE_POOL_EQUAL, 6 * (tide_plan_align(max_of(min_b)) + TIDE_PLAN_ALIGN), 313, 20);
}

static void test_trace_serial(void **state) {
    (void)state;
    run_trace(TIDE_POOL_SERIAL, max_of(need_b), 404, 20);
    run_trace(TIDE_POOL_SERIAL, max_of(min_b), 414, 20);
}

/* ---------------------------------------------------------------- deterministic cases */

/* A workload's minimum is plannable: its longest prefill and its decode step
 * at exactly that budget give plans the verifier accepts, within it. */
static void test_minimum_verified(void **state) {
    (void)state;
    tide_hw h;
    assert_int_equal(tide_hw_load(ctx, "h100-80g", &h), TIDE_OK);
    for (int f = 0; f < N_FIX; f++)
        for (int k = 0; k < 2; k++) {
            tide_llama_graph_opts go = {.batch = 1, .seq = k ? 1 : CTX_LEN, .ctx_len = CTX_LEN, .fresh_cache = !k};
            tide_graph *g = NULL;
            assert_int_equal(tide_llama_build(ctx, tide_checkpoint_config(ck[f]), &go, &g), TIDE_OK);
            tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .device_budget = min_b[f], .n_iter = 1, .hw = &h,
                                 .host_addressable = true};
            tide_plan *p = NULL;
            tide_status st = tide_plan_make(ctx, g, &po, &p);
            if (st) fail_msg("%s at its minimum %llu: %s", fixture_names[f], (unsigned long long)min_b[f],
                             tide_ctx_last_error(ctx));
            assert_int_equal(tide_plan_verify(p), TIDE_OK);
            assert_true(p->stats.peak_device_bytes <= min_b[f]);
            tide_plan_free(p);
            tide_graph_free(g);
        }
}

/* The sum over workloads of the predicted request time at their shares. */
static double predicted_total(tide_pool *p, tide_pool_workload **w, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) {
        tide_pool_workload_stats ws;
        assert_int_equal(tide_pool_workload_stats_get(p, w[i], &ws), TIDE_OK);
        assert_true(ws.share_bytes >= ws.min_bytes);
        s += ws.predicted_request_s;
    }
    return s;
}

/* Tide's shares: each at least its minimum, together within the budget, and
 * predicted no slower than equal shares of the same budget; a heavier demand
 * never loses bytes. */
static void test_partition(void **state) {
    (void)state;
    uint64_t budget = 0;
    for (int f = 0; f < N_FIX; f++) budget += (min_b[f] + need_b[f]) / 2;
    budget = TIDE_MAX(budget, 3 * (tide_plan_align(max_of(min_b)) + TIDE_PLAN_ALIGN));
    double total[2];
    for (int pol = 0; pol < 2; pol++) {
        tide_pool *p = pool_make(pol ? TIDE_POOL_EQUAL : TIDE_POOL_TIDE, budget, NULL);
        tide_pool_workload *w[N_FIX];
        for (int f = 0; f < N_FIX; f++)
            assert_int_equal(tide_pool_add_model(p, fixture_names[f], ck[f], &model_opts, &w[f]), TIDE_OK);
        tide_pool_stats ps;
        tide_pool_stats_get(p, &ps);
        assert_false(ps.time_sliced);
        assert_true(ps.shares_bytes <= budget);
        total[pol] = predicted_total(p, w, N_FIX);
        if (pol == 0) {
            tide_pool_workload_stats before, after;
            assert_int_equal(tide_pool_workload_stats_get(p, w[0], &before), TIDE_OK);
            assert_int_equal(tide_pool_set_demand(p, w[0], 40, 12, 8), TIDE_OK);
            assert_int_equal(tide_pool_workload_stats_get(p, w[0], &after), TIDE_OK);
            assert_true(after.share_bytes >= before.share_bytes);
            tide_pool_stats_get(p, &ps);
            assert_true(ps.shares_bytes <= budget);
            assert_int_equal(ps.partitions, N_FIX + 1);
            assert_int_equal(tide_pool_set_demand(p, w[0], -1, 0, 0), TIDE_E_INVALID);
        }
        tide_pool_free(p);
    }
    print_message("  predicted request time summed: tide %.4g s, equal %.4g s (budget %llu)\n", total[0], total[1],
                  (unsigned long long)budget);
    assert_true(total[0] <= total[1] * (1 + 1e-9));
}

typedef struct gen_arg {
    tide_pool *p;
    tide_pool_workload *w;
    int fix, kind;
    tide_status st;
    int32_t tok[MAX_NEW];
    int n;
    uint64_t hash;
    /* pausing inside the request */
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *tokens_seen;
    bool *go;
    int (*on_token)(void *user, int32_t id); /* instead of pause_first */
    atomic_bool *back;                       /* set once the request has returned */
    int calls;                               /* of on_token */
} gen_arg;

static int pause_first(void *user, int32_t id) {
    (void)id;
    gen_arg *a = user;
    pthread_mutex_lock(a->mu);
    ++*a->tokens_seen;
    pthread_cond_broadcast(a->cv);
    while (!*a->go) pthread_cond_wait(a->cv, a->mu);
    pthread_mutex_unlock(a->mu);
    return 0;
}

static void *gen_thread(void *p) {
    gen_arg *a = p;
    const reference *r = &refs[a->fix][a->kind];
    tide_gen_opts go = {.on_token = a->on_token ? a->on_token : a->mu ? pause_first : NULL, .user = a};
    tide_gen_stats gs = {0};
    a->st = tide_pool_generate(a->p, a->w, r->prompt, kind_prompt[a->kind], kind_new[a->kind], &go, a->tok, &a->n,
                               &gs);
    a->hash = gs.logits_hash;
    if (a->back) atomic_store(a->back, true);
    return NULL;
}

static void check_alone(const gen_arg *a) {
    const reference *r = &refs[a->fix][a->kind];
    assert_int_equal(a->st, TIDE_OK);
    assert_int_equal(a->n, r->n_out);
    assert_memory_equal(a->tok, r->tok, (size_t)r->n_out * sizeof *r->tok);
    assert_true(a->hash == r->hash);
}

/* Tide with two workloads whose minimums do not fit together: time-sliced
 * (logged), requests from two threads still right; one leaves and shares
 * come back. */
static void test_fallback(void **state) {
    (void)state;
    int64_t base = tide_alloc_live_bytes();
    uint64_t budget = min_b[0] + min_b[1] - 1;
    budget = TIDE_MAX(budget, TIDE_MAX(min_b[0], min_b[1]));
    limit_live(budget);
    log_count lc = {.mu = PTHREAD_MUTEX_INITIALIZER};
    tide_pool *p = pool_make(TIDE_POOL_TIDE, budget, &lc);
    tide_pool_workload *w[2];
    for (int f = 0; f < 2; f++)
        assert_int_equal(tide_pool_add_model(p, fixture_names[f], ck[f], &model_opts, &w[f]), TIDE_OK);
    tide_pool_stats ps;
    tide_pool_stats_get(p, &ps);
    assert_true(ps.time_sliced);
    assert_int_equal(lc.sliced, 1);
    for (int round = 0; round < 3; round++) {
        gen_arg a[2];
        pthread_t th[2];
        for (int f = 0; f < 2; f++) {
            a[f] = (gen_arg){.p = p, .w = w[f], .fix = f, .kind = (round + f) % N_KIND};
            assert_int_equal(pthread_create(&th[f], NULL, gen_thread, &a[f]), 0);
        }
        for (int f = 0; f < 2; f++) pthread_join(th[f], NULL);
        for (int f = 0; f < 2; f++) check_alone(&a[f]);
    }
    tide_pool_stats_get(p, &ps);
    assert_true(ps.peak_held_bytes <= budget);
    assert_false(over_limit);
    assert_int_equal(tide_pool_remove(p, w[1]), TIDE_OK);
    tide_pool_stats_get(p, &ps);
    assert_false(ps.time_sliced);
    assert_int_equal(lc.unsliced, 1);
    gen_arg a = {.p = p, .w = w[0], .fix = 0, .kind = 1};
    gen_thread(&a);
    check_alone(&a);
    tide_pool_free(p);
    limit_live(0);
    assert_int_equal(live_bytes, 0);
    assert_int_equal(tide_alloc_live_bytes(), base);
}

/* The batch's first request: pauses at its first id (as pause_first) and,
 * at its sixth, waits for the shortest request of the batch to have
 * returned to its thread: a request is handed back as soon as it ends, not
 * when its batch does. Decided by that event, not by time: the bound of
 * HANG_GUARD_MS only turns a request held until its batch ends (which would
 * never come while this one waits) into a failure instead of a hang, and is
 * never reached while the pool hands requests back, however loaded the
 * machine. */
#define HANG_GUARD_MS 120000
static atomic_bool shortest_back;
static bool shortest_late;

static int pause_then_wait(void *user, int32_t id) {
    gen_arg *a = user;
    int n = ++a->calls;
    if (n == 1) return pause_first(user, id);
    for (int i = 0; n == 6 && i < HANG_GUARD_MS && !atomic_load(&shortest_back); i++) usleep(1000);
    if (n == 6 && !atomic_load(&shortest_back)) shortest_late = true;
    return 0;
}

/* Three requests queued while one runs join its batch at its next step:
 * each equal to its run alone, the batch counted once; the shortest
 * returns before the batch ends. */
static void test_batching(void **state) {
    (void)state;
    int64_t base = tide_alloc_live_bytes();
    tide_pool *p = pool_make(TIDE_POOL_TIDE, 2 * max_of(need_b), NULL);
    tide_model_opts mo = {.max_batch = 4, .ctx_len = CTX_LEN};
    tide_pool_workload *w = NULL;
    assert_int_equal(tide_pool_add_model(p, fixture_names[0], ck[0], &mo, &w), TIDE_OK);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int seen = 0;
    bool go = false;
    gen_arg a[4];
    pthread_t th[4];
    atomic_store(&shortest_back, false);
    shortest_late = false;
    a[0] = (gen_arg){.p = p, .w = w, .fix = 0, .kind = 3, .mu = &mu, .cv = &cv, .tokens_seen = &seen, .go = &go,
                     .on_token = pause_then_wait};
    assert_int_equal(pthread_create(&th[0], NULL, gen_thread, &a[0]), 0);
    pthread_mutex_lock(&mu);
    while (!seen) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    for (int i = 1; i < 4; i++) { /* kind 2: 3 new ids, the shortest */
        a[i] = (gen_arg){.p = p, .w = w, .fix = 0, .kind = i - 1, .back = i == 3 ? &shortest_back : NULL};
        assert_int_equal(pthread_create(&th[i], NULL, gen_thread, &a[i]), 0);
    }
    tide_pool_workload_stats ws;
    for (int tries = 0; tries < HANG_GUARD_MS; tries++) { /* until they wait (the guard: a hang) */
        assert_int_equal(tide_pool_workload_stats_get(p, w, &ws), TIDE_OK);
        if (ws.waiting == 3) break;
        usleep(1000);
    }
    assert_int_equal(ws.waiting, 3);
    pthread_mutex_lock(&mu);
    go = true;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) check_alone(&a[i]);
    assert_false(shortest_late);
    assert_int_equal(tide_pool_workload_stats_get(p, w, &ws), TIDE_OK);
    assert_int_equal(ws.requests, 4);
    assert_int_equal(ws.batches, 1);
    assert_int_equal(ws.batched_requests, 4);
    assert_int_equal(ws.max_batch, 4);
    tide_pool_stats ps;
    tide_pool_stats_get(p, &ps);
    assert_int_equal(ps.batches, 1);
    tide_pool_free(p);
    assert_int_equal(tide_alloc_live_bytes(), base);
}

typedef struct rm_arg {
    tide_pool *p;
    tide_pool_workload *w;
    pthread_mutex_t *mu;
    int *tokens_seen;
    tide_status st;
    bool done;
    int tokens_at_return;
} rm_arg;

static void *rm_thread(void *p) {
    rm_arg *a = p;
    tide_status st = tide_pool_remove(a->p, a->w);
    pthread_mutex_lock(a->mu);
    a->st = st;
    a->done = true;
    a->tokens_at_return = *a->tokens_seen;
    pthread_mutex_unlock(a->mu);
    return NULL;
}

/* Removing a workload while its request runs: tide_pool_remove waits for the
 * request, which completes with the right ids; the request queued behind it
 * on the same workload is refused; the handle's requests after that fail. */
static void test_remove_inflight(void **state) {
    (void)state;
    int64_t base = tide_alloc_live_bytes();
    tide_pool *p = pool_make(TIDE_POOL_TIDE, 2 * max_of(need_b), NULL);
    tide_pool_workload *w = NULL, *other = NULL;
    assert_int_equal(tide_pool_add_model(p, "a", ck[2], &model_opts, &w), TIDE_OK);
    assert_int_equal(tide_pool_add_model(p, "b", ck[1], &model_opts, &other), TIDE_OK);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int seen = 0;
    bool go = false;
    gen_arg first = {.p = p, .w = w, .fix = 2, .kind = 3, .mu = &mu, .cv = &cv, .tokens_seen = &seen, .go = &go};
    gen_arg queued = {.p = p, .w = w, .fix = 2, .kind = 0};
    pthread_t t1, t2, tr;
    assert_int_equal(pthread_create(&t1, NULL, gen_thread, &first), 0);
    pthread_mutex_lock(&mu);
    while (!seen) pthread_cond_wait(&cv, &mu); /* the first request is running, paused */
    pthread_mutex_unlock(&mu);
    assert_int_equal(pthread_create(&t2, NULL, gen_thread, &queued), 0);
    for (;;) { /* the second waits behind it */
        tide_pool_workload_stats ws;
        assert_int_equal(tide_pool_workload_stats_get(p, w, &ws), TIDE_OK);
        if (ws.waiting == 1) break;
        usleep(1000);
    }
    rm_arg ra = {.p = p, .w = w, .mu = &mu, .tokens_seen = &seen};
    assert_int_equal(pthread_create(&tr, NULL, rm_thread, &ra), 0);
    pthread_join(t2, NULL); /* refused once the removal began */
    assert_int_equal(queued.st, TIDE_E_INVALID);
    usleep(20000);
    pthread_mutex_lock(&mu);
    assert_false(ra.done); /* still waiting for the paused request */
    go = true;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(tr, NULL);
    assert_int_equal(ra.st, TIDE_OK);
    assert_int_equal(ra.tokens_at_return, kind_new[3]); /* the request ran to its end first */
    pthread_join(t1, NULL);
    check_alone(&first);
    assert_null(tide_pool_find(p, "a"));
    tide_pool_stats ps;
    tide_pool_stats_get(p, &ps);
    assert_int_equal(ps.n_workloads, 1);
    gen_arg b = {.p = p, .w = other, .fix = 1, .kind = 2};
    gen_thread(&b);
    check_alone(&b);
    tide_pool_free(p);
    assert_int_equal(tide_alloc_live_bytes(), base);
}

/* Bad input, each refused with a status and a message. */
static void test_bad_input(void **state) {
    (void)state;
    int64_t base = tide_alloc_live_bytes();
    tide_pool *p = NULL;
    tide_pool_opts o = {.budget_bytes = 0, .hw = "h100-80g"};
    assert_int_equal(tide_pool_new(ctx, be, &o, &p), TIDE_E_INVALID);
    o.budget_bytes = 1 << 20;
    o.policy = (tide_pool_policy)7;
    assert_int_equal(tide_pool_new(ctx, be, &o, &p), TIDE_E_INVALID);
    o.policy = TIDE_POOL_TIDE;
    o.hw = "no-such-profile";
    assert_int_equal(tide_pool_new(ctx, be, &o, &p), TIDE_E_NOT_FOUND);
    tide_pool_policy pol;
    assert_int_equal(tide_pool_policy_parse(ctx, "equal", &pol), TIDE_OK);
    assert_int_equal(pol, TIDE_POOL_EQUAL);
    assert_int_equal(tide_pool_policy_parse(ctx, "fair", &pol), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "fair"));

    /* a minimum above the budget */
    p = pool_make(TIDE_POOL_TIDE, min_b[0] - 1, NULL);
    tide_pool_workload *w = NULL;
    assert_int_equal(tide_pool_add_model(p, "big", ck[0], &model_opts, &w), TIDE_E_INFEASIBLE);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "needs at least"));
    assert_null(w);
    tide_pool_free(p);

    /* equal shares below a minimum: the second workload is refused, the
     * first keeps running */
    uint64_t budget = min_b[0] + min_b[1] / 2;
    p = pool_make(TIDE_POOL_EQUAL, budget, NULL);
    tide_pool_workload *a = NULL, *b = NULL;
    assert_int_equal(tide_pool_add_model(p, "a", ck[0], &model_opts, &a), TIDE_OK);
    assert_int_equal(tide_pool_add_model(p, "b", ck[1], &model_opts, &b), TIDE_E_INFEASIBLE);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "policy equal"));
    assert_null(b);
    tide_pool_stats ps;
    tide_pool_stats_get(p, &ps);
    assert_int_equal(ps.n_workloads, 1);
    gen_arg g = {.p = p, .w = a, .fix = 0, .kind = 2};
    gen_thread(&g);
    check_alone(&g);

    /* names, checkpoints, handles */
    assert_int_equal(tide_pool_add_model(p, "a", ck[1], &model_opts, &b), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "already has"));
    assert_int_equal(tide_pool_add_model(p, "c", NULL, &model_opts, &b), TIDE_E_INVALID);
    assert_int_equal(tide_pool_add_model(p, NULL, ck[1], &model_opts, &b), TIDE_E_INVALID);
    assert_ptr_equal(tide_pool_find(p, "a"), a);
    assert_null(tide_pool_find(p, "zz"));
    int32_t tok[MAX_NEW];
    int n = 0;
    const reference *r = &refs[0][0];
    assert_int_equal(tide_pool_generate(p, NULL, r->prompt, 5, 3, NULL, tok, &n, NULL), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "no such workload"));
    tide_pool *q = pool_make(TIDE_POOL_TIDE, budget, NULL);
    tide_pool_workload *foreign = NULL;
    assert_int_equal(tide_pool_add_model(q, "a", ck[0], &model_opts, &foreign), TIDE_OK);
    assert_int_equal(tide_pool_generate(p, foreign, r->prompt, 5, 3, NULL, tok, &n, NULL), TIDE_E_INVALID);
    assert_int_equal(tide_pool_remove(p, foreign), TIDE_E_INVALID);
    assert_int_equal(tide_pool_workload_stats_get(p, foreign, &(tide_pool_workload_stats){0}), TIDE_E_INVALID);
    assert_int_equal(tide_pool_set_demand(p, foreign, 10, 10, 1), TIDE_E_INVALID);
    tide_pool_free(q);
    /* continuation and a bad token: on the workload's context */
    tide_gen_opts cont = {.start_pos = 2};
    assert_int_equal(tide_pool_generate(p, a, r->prompt, 5, 3, &cont, tok, &n, NULL), TIDE_E_UNSUPPORTED);
    assert_non_null(strstr(tide_ctx_last_error(tide_pool_workload_ctx(a)), "position 0"));
    int32_t bad[2] = {1, 1 << 20};
    assert_int_equal(tide_pool_generate(p, a, bad, 2, 3, NULL, tok, &n, NULL), TIDE_E_RANGE);
    assert_non_null(strstr(tide_ctx_last_error(tide_pool_workload_ctx(a)), "outside the vocabulary"));
    gen_thread(&g); /* and the workload still runs */
    check_alone(&g);
    assert_int_equal(tide_pool_remove(p, a), TIDE_OK);
    tide_pool_free(p);
    tide_pool_free(NULL);
    assert_int_equal(tide_alloc_live_bytes(), base);
}

/* The same traces where device memory is not host memory: the asynchronous
 * test double taking the executor's GPU paths (weights loaded into each
 * share's arena, the KV cache homed in host memory), its queues running
 * behind the caller with random delays; every request still equal to the
 * CPU's run alone. */
static void test_trace_device(void **state) {
    (void)state;
    tide_backend *cpu = be, *ab = NULL;
    const tide_backend_vt *cpu_inner = inner_vt;
    uint64_t cpu_min[N_FIX], cpu_need[N_FIX];
    memcpy(cpu_min, min_b, sizeof min_b);
    memcpy(cpu_need, need_b, sizeof need_b);
    tide_async_opts ao = {.jitter_us = 50, .seed = 5, .device_is_host = false};
    assert_int_equal(tide_async_backend_new(be_ctx, &ao, &ab), TIDE_OK);
    static tide_backend_vt dev_vt;
    inner_vt = ab->vt;
    dev_vt = *ab->vt;
    dev_vt.alloc = counted_alloc;
    dev_vt.dealloc = counted_dealloc;
    ab->vt = &dev_vt;
    be = ab;
    assert_true(measure_bounds());
    assert_true(min_b[0] > cpu_min[0]); /* the weights now pass through the arena */
    run_trace(TIDE_POOL_TIDE, max_of(need_b) + max_of(min_b), 505, 12);
    run_trace(TIDE_POOL_EQUAL, 5 * (tide_plan_align(max_of(min_b)) + TIDE_PLAN_ALIGN), 606, 12);
    run_trace(TIDE_POOL_SERIAL, max_of(min_b), 707, 12);
    be = cpu;
    inner_vt = cpu_inner;
    memcpy(min_b, cpu_min, sizeof min_b);
    memcpy(need_b, cpu_need, sizeof need_b);
    tide_backend_free(ab);
}

/* The traces with every workload's weights homed on SSD on the CPU backend:
 * the weights stream through each share's arena (read from the checkpoint
 * files), so the shares bound them too; every request still equal to the
 * resident run alone. */
static void test_trace_weights_on_ssd(void **state) {
    (void)state;
    uint64_t cpu_min[N_FIX], cpu_need[N_FIX];
    memcpy(cpu_min, min_b, sizeof min_b);
    memcpy(cpu_need, need_b, sizeof need_b);
    weights_ssd = true;
    assert_true(measure_bounds());
    assert_true(min_b[0] > cpu_min[0]); /* the weights now pass through the arena */
    run_trace(TIDE_POOL_TIDE, max_of(need_b) + max_of(min_b), 808, 12);
    run_trace(TIDE_POOL_EQUAL, 5 * (tide_plan_align(max_of(min_b)) + TIDE_PLAN_ALIGN), 909, 12);
    run_trace(TIDE_POOL_SERIAL, max_of(min_b), 1010, 12);
    weights_ssd = false;
    memcpy(min_b, cpu_min, sizeof min_b);
    memcpy(need_b, cpu_need, sizeof need_b);
}

/* No profile given: the machine is measured once and its profile handed to
 * the models through a temporary file, gone with the pool. */
static void test_measured_profile(void **state) {
    (void)state;
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/tmp/tide-pool-tmp-XXXXXX");
    assert_non_null(mkdtemp(tmp));
    const char *old = getenv("TMPDIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("TMPDIR", tmp, 1);
    tide_pool_opts o = {.budget_bytes = 2 * max_of(need_b), .ssd_dirs = spill_dir};
    tide_pool *p = NULL;
    tide_status st = tide_pool_new(ctx, be, &o, &p);
    if (saved) setenv("TMPDIR", saved, 1);
    else unsetenv("TMPDIR");
    free(saved);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    int files = 0;
    DIR *d = opendir(tmp);
    for (struct dirent *e; d && (e = readdir(d));) files += e->d_name[0] != '.';
    if (d) closedir(d);
    assert_int_equal(files, 1);
    tide_pool_workload *w = NULL;
    assert_int_equal(tide_pool_add_model(p, "m", ck[1], &model_opts, &w), TIDE_OK);
    gen_arg g = {.p = p, .w = w, .fix = 1, .kind = 1};
    gen_thread(&g);
    check_alone(&g);
    tide_pool_free(p);
    assert_int_equal(rmdir(tmp), 0); /* empty: the profile went with the pool */
}

int main(int argc, char **argv) {
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimum_verified), cmocka_unit_test(test_partition),
        cmocka_unit_test(test_bad_input),        cmocka_unit_test(test_fallback),
        cmocka_unit_test(test_remove_inflight),  cmocka_unit_test(test_trace_tide),
        cmocka_unit_test(test_batching),
        cmocka_unit_test(test_trace_equal),      cmocka_unit_test(test_trace_serial),
        cmocka_unit_test(test_measured_profile), cmocka_unit_test(test_trace_device),
        cmocka_unit_test(test_trace_weights_on_ssd),
    };
    size_t n = test_select(tests, sizeof tests / sizeof tests[0], argc, argv);
    if (!n) return 1;
    return _cmocka_run_group_tests("test_pool", tests, n, group_setup, group_teardown);
}
