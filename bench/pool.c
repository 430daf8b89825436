/*
 * pool.c - several workloads sharing one device budget (tide_pool), each
 * policy on the same trace, side by side in one process.
 *
 *   bench_pool [--quick] [--simulate] [--log] [--dir DIR] [--ssd DIR] [--json FILE]
 *
 * The trace: three workloads arriving at staggered times, each issuing its
 * requests one after another from its own thread (a closed loop) and leaving
 * after its last: two chat workloads of different sizes (prompt 32, a few
 * new tokens) and a batch of long prompts (one new token each).
 *
 * Default (measured): on the CPU backend, with weights homed on SSD (so that
 * the shares bound the weights too), models made by the synthetic model
 * maker from tinyllama-1.1b's shapes cut to 1, 3 and 2 layers with an
 * 8192-token vocabulary, under a budget of the largest workload's need (its
 * unconstrained peak: about one of them fits whole). The profile is this
 * machine's, measured once at the start (2 s) and given to every pool. Per
 * policy (tide, equal, serial): the makespan (first arrival to last request
 * end), each request's latency (from its issue to its end, waiting
 * included) at the median and the 99th percentile (nearest rank), and the
 * pool's counters; every request's logits hash is compared across the
 * policies (bit-identical results).
 *
 * --simulate: the same trace on paper, on the h100-80g profile with
 * llama-7b and llama-13b shapes (no weights): each workload's minimum, need
 * and request time at 8 budgets are the predictions the pool computes
 * (serve/pool_predict.h), the shares are each policy's (tide's partition is
 * the pool's own function), and requests running at once share the device's
 * time evenly (processor sharing: no gain is assumed from overlapping one
 * workload's transfers with another's compute). A request starts when its
 * share fits beside those of the requests running. Time-sliced, a serial
 * turn takes the whole budget and every other workload's warm weights are
 * lost; a tide turn runs at its knee (pool_predict_knee) and the others'
 * stay loaded while they fit beside it, evicted as the pool evicts.
 */
#include "serve/pool_predict.h"
#include "backend/backend.h"
#include "probe/probe.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { N_WL = 3, N_POL = 3, MAX_REQ = 16 };

typedef struct wl_spec {
    const char *name, *base; /* built-in configuration the shapes come from */
    int layers, vocab;       /* cut to (0: as the configuration) */
    int prompt, gen, n_req;
    double arrive_s;
} wl_spec;

static const wl_spec cpu_trace[N_WL] = {
    {"chat-s", "tinyllama-1.1b", 1, 8192, 32, 32, 12, 0.0},
    {"chat-l", "tinyllama-1.1b", 3, 8192, 32, 32, 8, 0.5},
    {"batch", "tinyllama-1.1b", 2, 8192, 384, 1, 6, 1.0},
};
static const wl_spec cpu_quick[N_WL] = {
    {"chat-s", "tinyllama-1.1b", 1, 8192, 32, 4, 3, 0.0},
    {"chat-l", "tinyllama-1.1b", 3, 8192, 32, 4, 2, 0.5},
    {"batch", "tinyllama-1.1b", 2, 8192, 256, 1, 2, 1.0},
};
static const wl_spec sim_trace[N_WL] = {
    {"chat-7b", "llama-7b", 0, 0, 32, 16, 6, 0.0},
    {"chat-13b", "llama-13b", 0, 0, 32, 16, 4, 1.5},
    {"batch-7b", "llama-7b", 0, 0, 1536, 1, 4, 3.0},
};
static const int cpu_ctx_len = 512, sim_ctx_len = 2048;
static const tide_pool_policy policies[N_POL] = {TIDE_POOL_TIDE, TIDE_POOL_EQUAL, TIDE_POOL_SERIAL};

static tide_ctx *ctx;
static bool show_log; /* --log: the pools' lines on stderr */
static bool roomy;    /* --roomy: the budget of the largest need with every weight warm */

static void on_log(void *user, const char *line) {
    fprintf(stderr, "    [%s] %s\n", (const char *)user, line);
}

static void die(const char *what) {
    fprintf(stderr, "bench_pool: %s: %s\n", what, tide_ctx_last_error(ctx));
    exit(1);
}

static tide_llama_config spec_config(const wl_spec *s, int ctx_len) {
    tide_llama_config cfg;
    if (tide_llama_config_named(ctx, s->base, &cfg)) die("configuration");
    if (s->layers) cfg.num_hidden_layers = s->layers;
    if (s->vocab) cfg.vocab_size = s->vocab;
    cfg.max_position_embeddings = ctx_len;
    snprintf(cfg.name, sizeof cfg.name, "%s", s->name);
    return cfg;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile q (0..1] of n sorted values. */
static double pct(const double *v, int n, double q) {
    int k = (int)ceil(q * n);
    return n ? v[(k < 1 ? 1 : k) - 1] : 0;
}

typedef struct pol_result {
    double makespan, p50, p99, lat[N_WL * MAX_REQ];
    int n_lat;
    tide_pool_stats ps;
    bool refused;            /* the policy could not hold the trace */
    char why[256];
} pol_result;

/* ---------------------------------------------------------------- measured */

typedef struct run_ctx {
    tide_pool *p;
    tide_checkpoint *ck;
    const wl_spec *s;
    int wi, ctx_len;
    const char *pol; /* the policy's name, for --log */
    double t0;
    double lat[MAX_REQ], end;
    uint64_t hash[MAX_REQ];
    tide_status st;
    char err[300];
} run_ctx;

static void sleep_until(double t) {
    double d = t - tide_now();
    if (d <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - floor(d)) * 1e9)};
    nanosleep(&ts, NULL);
}

static void *wl_thread(void *arg) {
    run_ctx *r = arg;
    const wl_spec *s = r->s;
    sleep_until(r->t0 + s->arrive_s);
    tide_model_opts mo = {.max_batch = 1, .ctx_len = r->ctx_len};
    tide_pool_workload *w = NULL;
    /* management calls record on the pool's context, shared by the threads:
     * their messages are read only when the bench fails */
    if ((r->st = tide_pool_add_model(r->p, s->name, r->ck, &mo, &w)) ||
        (r->st = tide_pool_set_demand(r->p, w, s->prompt, s->gen, s->n_req))) {
        snprintf(r->err, sizeof r->err, "adding %s: %s", s->name, tide_status_str(r->st));
        return NULL;
    }
    int32_t prompt[1024], out[64];
    for (int k = 0; k < s->n_req && !r->st; k++) {
        for (int i = 0; i < s->prompt; i++)
            prompt[i] = (int32_t)((7u + (uint32_t)(r->wi * 1000 + k * 37 + i) * 2654435761u) % (uint32_t)s->vocab);
        tide_gen_stats gs;
        int n = 0;
        double a = tide_now();
        r->st = tide_pool_generate(r->p, w, prompt, s->prompt, s->gen, NULL, out, &n, &gs);
        r->end = tide_now();
        r->lat[k] = r->end - a;
        r->hash[k] = gs.logits_hash;
        if (show_log && !r->st)
            fprintf(stderr, "    [%s] request %s %d: issued %.3f s, ended %.3f s: share %.1f MiB, warm %.1f MiB, "
                    "executor %.3f s (predicted %.3f s), SSD read %.1f MiB in %.3f s\n", r->pol, s->name, k,
                    a - r->t0, r->end - r->t0, (double)gs.budget_bytes / 1048576.0,
                    (double)gs.warm_weight_bytes / 1048576.0, gs.exec_s, gs.predicted_s,
                    (double)gs.bytes_ssd_read / 1048576.0, gs.ssd_read_s);
        if (r->st) snprintf(r->err, sizeof r->err, "%s request %d: %s", s->name, k,
                            tide_ctx_last_error(tide_pool_workload_ctx(w)));
    }
    tide_pool_remove(r->p, w);
    return NULL;
}

/* The trace on a fresh pool of the policy; hashes of every request out. */
static void run_measured(tide_backend *be, tide_checkpoint **ck, const wl_spec *tr, const char *hw, const char *ssd,
                         uint64_t budget, tide_pool_policy pol, pol_result *o, uint64_t hash[N_WL][MAX_REQ]) {
    memset(o, 0, sizeof *o);
    tide_pool_opts po = {.budget_bytes = budget, .policy = pol, .hw = hw, .ssd_dirs = ssd, .weights_on_ssd = true,
                         .log = show_log ? on_log : NULL, .log_user = (void *)tide_pool_policy_name(pol)};
    tide_pool *p = NULL;
    if (tide_pool_new(ctx, be, &po, &p)) die("pool");
    run_ctx r[N_WL];
    pthread_t th[N_WL];
    double t0 = tide_now() + 0.05;
    for (int i = 0; i < N_WL; i++) {
        r[i] = (run_ctx){.p = p, .ck = ck[i], .s = &tr[i], .wi = i, .ctx_len = cpu_ctx_len, .t0 = t0,
                         .pol = tide_pool_policy_name(pol)};
        if (pthread_create(&th[i], NULL, wl_thread, &r[i])) die("thread");
    }
    double end = t0;
    for (int i = 0; i < N_WL; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N_WL; i++) {
        if (r[i].st) {
            o->refused = true;
            snprintf(o->why, sizeof o->why, "%s (%s)", r[i].err, tide_ctx_last_error(ctx));
            continue;
        }
        end = fmax(end, r[i].end);
        for (int k = 0; k < tr[i].n_req; k++) {
            o->lat[o->n_lat++] = r[i].lat[k];
            hash[i][k] = r[i].hash[k];
        }
    }
    tide_pool_stats_get(p, &o->ps);
    tide_pool_free(p);
    o->makespan = end - t0;
    qsort(o->lat, (size_t)o->n_lat, sizeof o->lat[0], cmp_double);
    o->p50 = pct(o->lat, o->n_lat, 0.5);
    o->p99 = pct(o->lat, o->n_lat, 0.99);
}

/* ---------------------------------------------------------------- simulated */

typedef struct sim_wl {
    pool_curve cv;
    uint64_t min, need, share, held;
    uint64_t loaded;         /* the share its warm weights were loaded at (0: none) */
    int done;                /* requests completed */
    bool present, running, left;
    double work, ready;      /* the running request's remaining work; when it was issued */
} sim_wl;

/* A request's predicted seconds at a share, its warm weights loaded first
 * when they were loaded at another share (or not at all). */
static bool sim_by_cost; /* the simulated pool is time-sliced because predicted faster */

static double curve_at(const pool_curve *cv, uint64_t share, uint64_t loaded) {
    double t = INFINITY;
    for (int k = 0; k < cv->n && cv->b[k] <= share; k++) t = cv->t[k] + (share == loaded ? 0 : cv->u[k]);
    return t;
}

/* Shares of the workloads present, as the pool's partition gives them. */
static void sim_partition(sim_wl *w, const wl_spec *tr, tide_pool_policy pol, uint64_t total, bool *sliced,
                          pol_result *o) {
    int idx[N_WL], n = 0;
    uint64_t sum_min = 0;
    for (int i = 0; i < N_WL; i++)
        if (w[i].present) idx[n++] = i, sum_min += w[i].min;
    uint64_t sh[N_WL];
    bool by_cost = false;
    if (pol == TIDE_POOL_TIDE && sum_min <= total) {
        const pool_curve *cvs[N_WL];
        double wt[N_WL], part_s, slice_s;
        uint64_t cur[N_WL];
        for (int j = 0; j < n; j++) cvs[j] = &w[idx[j]].cv, wt[j] = tr[idx[j]].n_req, cur[j] = w[idx[j]].loaded;
        by_cost = pool_predict_choose(n, cvs, wt, cur, total, *sliced && sim_by_cost, sh, &part_s, &slice_s);
    }
    *sliced = pol == TIDE_POOL_SERIAL || (pol == TIDE_POOL_TIDE && (sum_min > total || by_cost));
    sim_by_cost = *sliced && by_cost;
    if (*sliced || !n) return;
    if (pol == TIDE_POOL_EQUAL) {
        uint64_t s = n > 1 ? total / (uint64_t)n / TIDE_PLAN_ALIGN * TIDE_PLAN_ALIGN : total;
        for (int j = 0; j < n; j++) {
            w[idx[j]].share = s;
            if (s < w[idx[j]].min && !o->refused) {
                o->refused = true;
                snprintf(o->why, sizeof o->why, "an equal share of %.1f GiB is below %s's minimum of %.1f GiB",
                         s / 1073741824.0, tr[idx[j]].name, w[idx[j]].min / 1073741824.0);
            }
        }
        return;
    }
    for (int j = 0; j < n; j++) w[idx[j]].share = sh[j];
}

static void run_simulated(sim_wl *init, const wl_spec *tr, uint64_t total, tide_pool_policy pol, pol_result *o) {
    memset(o, 0, sizeof *o);
    sim_by_cost = false;
    sim_wl w[N_WL];
    memcpy(w, init, sizeof w);
    bool sliced = false;
    double now = 0;
    for (int guard = 0; guard < 100000; guard++) {
        /* arrivals and departures due now, then requests that can start */
        bool changed = false;
        for (int i = 0; i < N_WL; i++) {
            if (!w[i].present && !w[i].left && tr[i].arrive_s <= now + 1e-12) {
                w[i].present = changed = true;
                w[i].ready = tr[i].arrive_s;
            }
            if (w[i].present && !w[i].running && w[i].done == tr[i].n_req) {
                w[i].present = false;
                w[i].left = changed = true;
            }
        }
        if (changed) sim_partition(w, tr, pol, total, &sliced, o);
        if (o->refused) return;
        int running = 0;
        uint64_t held = 0;
        for (int i = 0; i < N_WL; i++)
            if (w[i].running) running++, held += w[i].held;
        for (;;) { /* the waiting workload issued first, when its share fits */
            int bi = -1;
            for (int i = 0; i < N_WL; i++)
                if (w[i].present && !w[i].running && w[i].done < tr[i].n_req && (bi < 0 || w[i].ready < w[bi].ready))
                    bi = i;
            if (bi < 0) break;
            /* time-sliced: serial's turn takes the whole budget, tide's its knee */
            int kn = pol == TIDE_POOL_TIDE ? pool_predict_knee(&w[bi].cv, total) : -1;
            uint64_t s = !sliced ? w[bi].share : kn >= 0 ? w[bi].cv.b[kn] : total;
            if ((sliced && running) || held + s > total) break;
            w[bi].running = true;
            w[bi].held = s;
            w[bi].work = curve_at(&w[bi].cv, s, w[bi].loaded);
            w[bi].loaded = s;
            if (sliced) { /* the others' arenas made room: all (serial), or as the pool evicts (tide) */
                uint64_t res = 0;
                for (int i = 0; i < N_WL; i++)
                    if (i != bi) res += pol == TIDE_POOL_TIDE ? w[i].loaded : 0;
                for (int i = 0; pol != TIDE_POOL_TIDE && i < N_WL; i++)
                    if (i != bi) w[i].loaded = 0;
                while (res + s > total) {
                    int v = -1;
                    uint64_t need = res + s - total;
                    for (int i = 0; i < N_WL; i++) {
                        if (i == bi || !w[i].loaded) continue;
                        uint64_t f = w[i].loaded, vf = v >= 0 ? w[v].loaded : 0;
                        if (v < 0 || (f >= need ? vf < need || f < vf : vf < need && f > vf)) v = i;
                    }
                    if (v < 0) break;
                    res -= w[v].loaded;
                    w[v].loaded = 0;
                }
            }
            held += s;
            running++;
        }
        /* the next event: a request's end (each of `running` at 1/running
         * of the device) or an arrival */
        double next = INFINITY;
        for (int i = 0; i < N_WL; i++) {
            if (w[i].running) next = fmin(next, now + w[i].work * running);
            if (!w[i].present && !w[i].left) next = fmin(next, tr[i].arrive_s);
        }
        if (!isfinite(next)) break;
        double dt = next - now;
        for (int i = 0; i < N_WL; i++) {
            if (!w[i].running) continue;
            w[i].work -= dt / running;
            if (w[i].work <= 1e-12 * fmax(1, next)) {
                w[i].running = false;
                w[i].held = 0;
                w[i].done++;
                o->lat[o->n_lat++] = next - w[i].ready;
                w[i].ready = next;
                o->makespan = next;
            }
        }
        now = next;
    }
    qsort(o->lat, (size_t)o->n_lat, sizeof o->lat[0], cmp_double);
    o->p50 = pct(o->lat, o->n_lat, 0.5);
    o->p99 = pct(o->lat, o->n_lat, 0.99);
}

/* ---------------------------------------------------------------- report */

static int report(const char *mode, const wl_spec *tr, uint64_t budget, const pol_result *r, const char *json,
                  bool same, bool measured) {
    printf("\n| policy | makespan (s) | latency p50 (s) | latency p99 (s) | requests |%s\n", measured ?
           " waits | replans | refits | peak held / budget |" : "");
    printf("|---|---|---|---|---|%s\n", measured ? "---|---|---|---|" : "");
    for (int k = 0; k < N_POL; k++) {
        const pol_result *o = &r[k];
        if (o->refused) {
            printf("| %s | refused: %s | | | |%s\n", tide_pool_policy_name(policies[k]), o->why,
                   measured ? " | | | |" : "");
            continue;
        }
        printf("| %s | %.3f | %.3f | %.3f | %d |", tide_pool_policy_name(policies[k]), o->makespan, o->p50, o->p99,
               o->n_lat);
        if (measured)
            printf(" %lld | %lld | %lld | %.2f |", (long long)o->ps.waits, (long long)o->ps.replans,
                   (long long)o->ps.refits, (double)o->ps.peak_held_bytes / (double)o->ps.budget_bytes);
        printf("\n");
    }
    int best = -1;
    for (int k = 1; k < N_POL; k++)
        if (!r[k].refused && (best < 0 || r[k].makespan < r[best].makespan)) best = k;
    double mk = best > 0 && !r[0].refused ? r[0].makespan / r[best].makespan : NAN;
    double p99 = best > 0 && !r[0].refused ? r[0].p99 / r[best].p99 : NAN;
    printf("\ntide makespan / best baseline (%s) makespan = %.3f (target <= 0.8); tide p99 / %s p99 = %.3f "
           "(target <= 1)%s\n", best > 0 ? tide_pool_policy_name(policies[best]) : "none", mk,
           best > 0 ? tide_pool_policy_name(policies[best]) : "none", p99,
           measured ? (same ? "; every request bit-identical across the policies" : "; REQUESTS DIFFER") : "");
    char line[2048];
    int n = snprintf(line, sizeof line, "{\"bench\":\"pool\",\"mode\":\"%s\",\"budget_bytes\":%llu,\"workloads\":[",
                     mode, (unsigned long long)budget);
    for (int i = 0; i < N_WL; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s{\"name\":\"%s\",\"prompt\":%d,\"new\":%d,\"requests\":%d,"
                      "\"arrive_s\":%.2f}", i ? "," : "", tr[i].name, tr[i].prompt, tr[i].gen, tr[i].n_req,
                      tr[i].arrive_s);
    n += snprintf(line + n, sizeof line - (size_t)n, "],\"policies\":{");
    for (int k = 0; k < N_POL; k++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s\"%s\":{\"refused\":%s,\"makespan_s\":%.4f,"
                      "\"p50_s\":%.4f,\"p99_s\":%.4f}", k ? "," : "", tide_pool_policy_name(policies[k]),
                      r[k].refused ? "true" : "false", r[k].makespan, r[k].p50, r[k].p99);
    snprintf(line + n, sizeof line - (size_t)n, "},\"makespan_ratio\":%.4f,\"p99_ratio\":%.4f%s}", mk, p99,
             measured ? (same ? ",\"bit_identical\":true" : ",\"bit_identical\":false") : "");
    printf("%s\n", line);
    if (json) {
        FILE *f = fopen(json, "a");
        if (!f) {
            fprintf(stderr, "bench_pool: cannot open %s\n", json);
            return 1;
        }
        fprintf(f, "%s\n", line);
        fclose(f);
    }
    return measured && !same;
}

static int simulate(const char *json) {
    tide_hw hw;
    if (tide_hw_load(ctx, "h100-80g", &hw)) die("profile h100-80g");
    const wl_spec *tr = sim_trace;
    sim_wl w[N_WL];
    memset(w, 0, sizeof w);
    tide_llama_config cfg[N_WL];
    uint64_t budget = 0;
    double t0 = tide_now();
    for (int i = 0; i < N_WL; i++) {
        cfg[i] = spec_config(&tr[i], sim_ctx_len);
        pool_predict pp = {.ctx = ctx, .hw = &hw, .warm = true, .cfg = &cfg[i], .ctx_len = sim_ctx_len,
                           .name = tr[i].name};
        if (pool_predict_bounds(&pp, &w[i].min, &w[i].need) ||
            pool_predict_curve(&pp, w[i].min, w[i].need, tr[i].prompt, tr[i].gen, &w[i].cv))
            die("predicting");
        budget = budget > w[i].need ? budget : w[i].need;
    }
    printf("bench pool --simulate: h100-80g profile, weights homed in host memory, budget %.2f GiB (the largest "
           "need), %.1f s of planning\n", budget / 1073741824.0, tide_now() - t0);
    printf("\n| workload | shapes | arrives (s) | requests | prompt + new | minimum (GiB) | need (GiB) | request at "
           "minimum / need (s) |\n|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < N_WL; i++)
        printf("| %s | %s | %.1f | %d | %d + %d | %.2f | %.2f | %.3f / %.3f |\n", tr[i].name, tr[i].base,
               tr[i].arrive_s, tr[i].n_req, tr[i].prompt, tr[i].gen, w[i].min / 1073741824.0,
               w[i].need / 1073741824.0, w[i].cv.t[0], w[i].cv.t[w[i].cv.n - 1]);
    pol_result r[N_POL];
    for (int k = 0; k < N_POL; k++) run_simulated(w, tr, budget, policies[k], &r[k]);
    return report("simulate", tr, budget, r, json, true, false);
}

int main(int argc, char **argv) {
    const char *dir = NULL, *ssd = NULL, *json = NULL;
    bool quick = false, sim = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--simulate")) sim = true;
        else if (!strcmp(argv[i], "--log")) show_log = true;
        else if (!strcmp(argv[i], "--roomy")) roomy = true;
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--ssd") && i + 1 < argc) ssd = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--simulate] [--roomy] [--log] [--dir DIR] [--ssd DIR] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* in order with the progress lines on stderr */
    ctx = tide_ctx_new();
    if (sim) return simulate(json);
    const wl_spec *tr = quick ? cpu_quick : cpu_trace;
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char root[1024];
    snprintf(root, sizeof root, "%s", dir ? dir : tmp);
    if (!ssd) ssd = root;
    tide_checkpoint *ck[N_WL];
    for (int i = 0; i < N_WL; i++) {
        char d[1200], path[1300];
        snprintf(d, sizeof d, "%s/tide-bench-pool-%s", root, tr[i].name);
        snprintf(path, sizeof path, "%s/config.json", d);
        struct stat sb;
        tide_llama_config cfg = spec_config(&tr[i], cpu_ctx_len);
        if (stat(path, &sb) && tide_checkpoint_make_synthetic(ctx, &cfg, (uint64_t)i, 0, d)) die("making a model");
        if (tide_checkpoint_open(ctx, d, &ck[i])) die("opening a model");
    }
    tide_backend *be = NULL;
    if (tide_backend_new(ctx, TIDE_BACKEND_CPU, &be)) die("backend");
    /* one profile of this machine for every pool (each pool refits it per
     * workload from what the workload measures) */
    tide_hw hw;
    if (tide_probe_backend(ctx, be, ssd, 2.0, NULL, &hw)) die("probe");
    char hw_path[1100];
    snprintf(hw_path, sizeof hw_path, "%s/tide-bench-pool-hw-%d.json", tmp, (int)getpid());
    if (tide_hw_save(ctx, &hw, hw_path)) die("saving the profile");
    /* each workload's minimum, need and predicted request time at both, as
     * the pools predict them (the need with every weight kept warm); the
     * budget: the largest unconstrained peak (a run streaming its weights
     * through the arena: about one workload fits), --roomy the largest need */
    uint64_t budget = 0;
    for (int i = 0; i < N_WL; i++) {
        tide_llama_config cfg = spec_config(&tr[i], cpu_ctx_len);
        pool_predict pp = {.ctx = ctx, .hw = &hw, .host_addressable = be->vt->device_is_host, .weights_on_ssd = true,
                           .warm = true,
                           .cfg = &cfg, .ctx_len = cpu_ctx_len, .name = tr[i].name};
        uint64_t mn = 0, nd = 0;
        pool_curve cv;
        if (pool_predict_bounds(&pp, &mn, &nd) || pool_predict_curve(&pp, mn, nd, tr[i].prompt, tr[i].gen, &cv))
            die("predicting");
        pool_predict cold = pp;
        cold.warm = false;
        uint64_t cn = 0;
        if (pool_predict_bounds(&cold, &mn, &cn)) die("predicting");
        uint64_t b = roomy ? nd : cn;
        budget = budget > b ? budget : b;
        printf("%s %s: minimum %.1f MiB, unconstrained peak %.1f MiB, need (every weight warm) %.1f MiB; a request "
               "predicted at %.3f s at the minimum, %.3f s at the need\n", i ? "" : "workloads (weights on SSD):",
               tr[i].name, mn / 1048576.0, cn / 1048576.0, nd / 1048576.0, cv.t[0], cv.t[cv.n - 1]);
    }
    double load[1] = {0};
    if (getloadavg(load, 1) != 1) load[0] = NAN;
    printf("bench pool: CPU backend, %d threads, weights on SSD (%s), budget %.1f MiB (the largest %s); "
           "probe: bf16 %.1f GFLOP/s, ssd read %.2f GB/s; load average %.2f\n", tide_ctx_threads(ctx), ssd,
           budget / 1048576.0, roomy ? "need" : "unconstrained peak", hw.flops[TIDE_BF16] / 1e9, hw.ssd_read_bw / 1e9, load[0]);
    for (int i = 0; i < N_WL; i++)
        printf("  %s: %s cut to %d layers, vocab %d; arrives at %.1f s; %d requests of %d + %d tokens\n",
               tr[i].name, tr[i].base, tr[i].layers, tr[i].vocab, tr[i].arrive_s, tr[i].n_req, tr[i].prompt,
               tr[i].gen);
    pol_result r[N_POL];
    static uint64_t hash[N_POL][N_WL][MAX_REQ];
    for (int k = 0; k < N_POL; k++) {
        double a = tide_now();
        run_measured(be, ck, tr, hw_path, ssd, budget, policies[k], &r[k], hash[k]);
        fprintf(stderr, "  %s: %.1f s\n", tide_pool_policy_name(policies[k]), tide_now() - a);
    }
    bool same = true;
    for (int k = 1; k < N_POL; k++)
        if (!r[k].refused && !r[0].refused) same = same && !memcmp(hash[0], hash[k], sizeof hash[0]);
    unlink(hw_path);
    int rc = report(quick ? "cpu-quick" : "cpu", tr, budget, r, json, same, true);
    for (int i = 0; i < N_WL; i++) tide_checkpoint_free(ck[i]);
    tide_backend_free(be);
    tide_ctx_free(ctx);
    return rc;
}
