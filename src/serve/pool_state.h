/*
 * pool_state.h - the pool's own state, shared by its files: pool.c (shares,
 * requests, management) and pool_refit.c (the cost model refitted from a
 * workload's measured requests). Which lock guards each field is said
 * beside it; pool.c's design note gives the invariants P1-P4.
 */
#ifndef TIDE_SERVE_POOL_STATE_H
#define TIDE_SERVE_POOL_STATE_H

#include "serve/pool_int.h"
#include "serve/pool_predict.h"

#include <pthread.h>

#define POOL_DRIFT 0.30      /* measured this far from predicted is drift (TENSILE's threshold) */
#define POOL_REFIT_EVERY 8   /* a workload's refits are at least this many of its requests apart */
#define POOL_PROMPT 32       /* the default typical request */
#define POOL_NEW 16

/* A request of a workload: queued until a leader admits it into a batch
 * (pool.c, "requests"), fields under mu except what the leader fills while
 * it runs (gr, n_out, st, stats), which the request's thread reads once
 * done is set (the leader touches it no more). */
typedef struct pool_req {
    struct pool_req *next;
    const int32_t *prompt;
    int n_prompt, max_new;
    const tide_gen_opts *g;
    int32_t *out_tokens;
    tide_ctx *ctx;             /* where its failure is recorded (NULL: the workload's) */
    bool taken, done, waited;
    int n_out;
    tide_status st;
    tide_gen_stats stats;
    tide_gen_request gr;       /* in the batch that took it (the leader's) */
} pool_req;

struct tide_pool_workload {
    tide_pool *pool;
    char *name;
    tide_ctx *ctx;             /* the model's, and generate's failures */
    tide_model *m;
    tide_checkpoint *ck;       /* its model's (the caller's, or pool_models.c's) */
    tide_llama_config cfg;
    int ctx_len;
    tide_dtype cache_dtype;    /* its KV cache's type */
    /* written under mgmt and mu; read under either, or by the holder of
     * model_busy (hw: apply_budget) */
    int prompt, gen;           /* the typical request */
    double weight;             /* requests queued */
    uint64_t min, need;
    pool_curve cv;
    tide_hw hw;                /* the profile its predictions and plans use: the pool's,
                                  or its own refit of it (refits > 0) */
    /* under mu */
    uint64_t share;            /* from the last partition (time-sliced: unused) */
    uint64_t held;             /* reserved now: 0 or configured (P2) */
    uint64_t configured;       /* the model's budget (0: none set) */
    bool claimed;              /* its worker leads a batch (pool.c lead) */
    pthread_t worker;          /* runs its batches (pool.c worker_main) */
    bool worker_on;            /* started (and not yet joined) */
    bool stop;                 /* the worker is to end */
    bool model_busy;           /* P3 */
    bool running_turn;         /* time-sliced: its turn, at its turn share (pool.c turn_share) */
    bool leaving;
    bool acquiring;            /* a request of it waits in acquire for room or its turn */
    bool drift_logged;
    bool planned;              /* a request ran at the configured budget (its plans exist) */
    int users;                 /* threads inside tide_pool_generate for it */
    int waiting;
    pool_req *q_head, *q_tail; /* its requests not yet taken, in arrival order */
    int max_batch;             /* requests one batch takes (its model's max_batch) */
    int64_t batches, batched;  /* batches of several requests, and the requests in them */
    uint64_t turn;             /* time-sliced queue position (0: not queued) */
    int64_t requests, drifted, replans, refits;
    bool refit_tried;          /* a refit was tried (pool_refit.c, F2) */
    int64_t refit_at;          /* its request that last tried */
    double pred_s, meas_s;
    uint64_t peak_dev;
};

struct tide_pool {
    tide_ctx *ctx;
    tide_backend *be;
    tide_pool_policy policy;
    uint64_t total;
    tide_hw hw;
    char *hw_arg;              /* what each model's set_offload loads */
    bool hw_tmp;               /* hw_arg is a file of ours (a measured profile) */
    uint64_t host_budget;
    char *ssd_dirs;
    bool weights_on_ssd;
    bool no_refit;             /* tide_pool_opts.no_refit */
    double t0;                 /* when it was made (tide_now), for the log */
    void (*log)(void *user, const char *line);
    void *log_user;
    tide_pool_held_hook hook;
    void *hook_user;
    pthread_mutex_t mu, mgmt;
    pthread_cond_t cv;
    tide_pool_workload **w;
    int n, cap;
    bool sliced;
    bool sliced_by_cost;       /* sliced because predicted faster (not for the minimums) */
    uint64_t turn_next;
    uint64_t held_sum, peak_held;
    int64_t partitions, replans, waits, requests, drifted, refits, batches, batched;
    int64_t evictions;         /* models pool_models.c evicted */
    double pred_s, meas_s;
    struct pool_models *models; /* the models offered to it (pool_models.c; NULL: none yet) */
};

/* pool.c. With mu held: one line to opts.log (when given). */
void pool_log_locked(tide_pool *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* With mu held: sets every share (policy and budget as they are now) and
 * logs one line that begins with why. */
void pool_partition(tide_pool *p, const char *why);
/* The predicted time of w's typical request at a share (its curve, from the
 * last point at or below the share; 0 unknown). */
double pool_predicted_at(const tide_pool_workload *w, uint64_t share);
/* How w's predictions are planned (pool_predict.h), failures on ctx. */
pool_predict pool_predictor(const tide_pool *p, const tide_pool_workload *w, tide_ctx *ctx);

/* pool_models.c. Frees the models offered (their workloads already freed). */
typedef struct pool_models pool_models;
void pool_models_free(tide_pool *p);

/* pool_refit.c. Called by the thread of w's request that just succeeded
 * with statistics gs, outside mu, with w's claim and model_busy still set:
 * when its measured time drifted and a refit is due (pool_refit.c, rules),
 * refits w's profile from the request's measured runs, sets it on w's
 * model, plans w's curve again and re-partitions, logging one line. A
 * refit that cannot be made changes nothing (and is logged); the request's
 * result stands either way. */
void pool_refit_after(tide_pool *p, tide_pool_workload *w, const tide_gen_stats *gs);

#endif
