/*
 * pool_refit.c - measured times feed a pool's cost model: a workload whose
 * request measured far from its prediction has its profile refitted from
 * that request's measured instructions (cost/refit.h, as the trainer does,
 * train/train_refit.c), its predictions planned again with it, and the
 * shares re-partitioned on the corrected predictions (TENSILE: replan when
 * a job's measured times drift).
 *
 * Rules:
 *   F1. A request drifts when its measured executor time is more than
 *       POOL_DRIFT (30%) away from its plans' predicted time (both summed
 *       over its prefill and decode steps, tide_gen_stats exec_s and
 *       predicted_s).
 *   F2. Bounded: a drifted request refits when the workload has never
 *       tried, or when at least POOL_REFIT_EVERY of its requests have
 *       completed since its last try (a refit that failed counts). A refit costs planning the curve
 *       (2 graphs at up to POOL_POINTS budgets) and the model's plans again
 *       at its next request; it never runs while a request of the workload
 *       does (it is done by the request's own thread, before it lets go of
 *       the model).
 *   F3. The profile refitted is the workload's own (its model's): the
 *       request's prefill plan (run once) and decode plan (run n times,
 *       its last run's timeline standing for each) against the profile they
 *       were priced with. Other workloads keep theirs: their op mix, and so
 *       the classes a refit corrects, differ.
 *   F4. Plans change, results do not: every plan is verified and computes
 *       what the resident run computes, so a refit leaves every request's
 *       tokens bit-identical; the minimum (from sizes, not rates) and the
 *       budget invariant P1 are untouched (the new shares are applied at safe
 *       points, as any partition's).
 *   F5. A refit that cannot be made (no timeline measured, a refit or a
 *       plan that fails) changes nothing and is logged once per workload;
 *       the request's result stands.
 *
 * Locks: the decision and the counters under mu; the refit, the model's new
 * profile and the curve's planning outside mu with the request's claim and
 * model_busy held (P3), under mgmt (which orders it with set_demand, the
 * other writer of the curve); the new curve, profile and partition under mgmt and mu.
 */
#include "serve/pool_state.h"

#include "cost/refit.h"
#include "runtime/model_ext.h"

#include <math.h>
#include <stdio.h>

/* A refit made but not yet taken by the pool. */
typedef struct refit_result {
    tide_hw hw;
    pool_curve cv;
} refit_result;

/* F5: says once per workload why its drift could not refit (mu held). */
static void log_failure(tide_pool *p, tide_pool_workload *w, const char *why) {
    if (w->drift_logged) return;
    w->drift_logged = true;
    pool_log_locked(p, "pool: '%s' drifted beyond %.0f%% but its cost model cannot be refitted: %s", w->name,
                    POOL_DRIFT * 100, why);
}

/* The refitted profile and curve of w from the request just run (outside
 * mu, mgmt held). TIDE_OK, or the failure (message on w->ctx). */
static tide_status refit_curve(tide_pool *p, tide_pool_workload *w, refit_result *r) {
    const tide_plan *plans[TIDE_MODEL_GEN_PLANS];
    const tide_sim_event *tls[TIDE_MODEL_GEN_PLANS];
    int runs[TIDE_MODEL_GEN_PLANS];
    int n = tide_model_gen_runs(w->m, plans, tls, runs);
    if (!n) return tide_err(w->ctx, TIDE_E_INVALID, "no measured timeline of the request's runs");
    /* F3: against the profile the plans were priced with, the model's */
    tide_status st = tide_hw_refit_runs(n, plans, tls, runs, tide_model_hw(w->m), &r->hw, NULL);
    if (st) return st;
    pool_predict pp = pool_predictor(p, w, w->ctx);
    pp.hw = &r->hw;
    if ((st = pool_predict_curve(&pp, w->min, w->need, w->prompt, w->gen, &r->cv))) return st;
    /* the model plans with it from its next request on */
    return tide_model_set_hw(w->m, &r->hw);
}

void pool_refit_after(tide_pool *p, tide_pool_workload *w, const tide_gen_stats *gs) {
    double pred = gs->predicted_s, meas = gs->exec_s;
    if (p->no_refit || !(pred > 0) || !(fabs(meas - pred) > POOL_DRIFT * pred)) return; /* F1 */
    pthread_mutex_lock(&p->mu);
    int64_t nth = w->requests + 1; /* this request, counted after this returns */
    bool due = !w->refit_tried || nth - w->refit_at >= POOL_REFIT_EVERY; /* F2 */
    pthread_mutex_unlock(&p->mu);
    if (!due) return;
    pthread_mutex_lock(&p->mgmt); /* w stays: the request's thread is one of its users */
    refit_result r;
    tide_status st = refit_curve(p, w, &r);
    pthread_mutex_lock(&p->mu);
    w->refit_tried = true;
    w->refit_at = nth;
    if (st) {
        log_failure(p, w, tide_ctx_last_error(w->ctx));
        tide_err_clear(w->ctx); /* the request succeeded: its context says so */
    } else {
        uint64_t share = p->sliced ? p->total : w->share;
        double before = pool_predicted_at(w, share);
        w->hw = r.hw;
        w->cv = r.cv;
        w->refits++;
        p->refits++;
        char why[400];
        snprintf(why, sizeof why, "at %.2f s, '%.100s' measured %.3g s vs predicted %.3g s (%+.0f%%) in its "
                 "request %lld: cost model refit (its typical request at %llu bytes: %.3g s, was %.3g s), shares "
                 "re-partitioned", tide_now() - p->t0, w->name, meas, pred, 100 * (meas / pred - 1), (long long)nth,
                 (unsigned long long)share, pool_predicted_at(w, share), before);
        pool_partition(p, why);
    }
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->mgmt);
}
