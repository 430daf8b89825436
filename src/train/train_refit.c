/*
 * train_refit.c - the profiled cost model of offloaded training: the
 * trainer's second step, measured instruction by instruction, refits the
 * profile its plan was priced with (cost/refit.h) when the step is off its
 * prediction by more than TIDE_TRAIN_REFIT_MARGIN, and the step is replanned
 * on the refitted profile for the steps after it.
 *
 * Rules:
 *   R1. Decided once, after the trainer's second step. The first includes
 *       warm-up a steady step does not have (the stream workers' start, the
 *       first touch of the arena and the spill pools, cold caches), so it
 *       measures the machine less well than the second.
 *   R2. The margin is the 15% the refitted predictions are held to: a step
 *       predicted within it is what the cost model is asked for; beyond it a
 *       replan costs one planning, once.
 *   R3. The new plan is made under the same budget, policy and host budget
 *       as the first. Where the first placement of the AdamW updates was
 *       chosen by the rates (policy tide, --optimizer auto, on a GPU), it is
 *       chosen again on the refitted ones (a GPU's measured host AdamW and
 *       link rates can move the best split far); otherwise the same. The
 *       planner chooses homes from the host budget, the SSD's presence and
 *       the host computes' staging room, not from rates, so the homes come out
 *       the same. They are compared all the same: a plan that would home any
 *       tensor elsewhere is not taken (the homes hold the training state
 *       between steps), nor one whose arena would not fit the one allocated.
 *   R4. Every plan computes exactly what the unconstrained step computes
 *       (the verifier proves it of each), so the steps after a replan stay
 *       bit-identical to the unconstrained run.
 *   R5. A refit never fails a step: a plan that cannot be made, verified or
 *       bound keeps the old one (replan -1), with the refitted profile
 *       pricing it from then on.
 */
#include "train/trainer_int.h"
#include "cost/refit.h"
#include "sim/sim.h"

#include <math.h>
#include <stdio.h>

/* Whether plan b homes every tensor where a does. */
static bool same_homes(const tide_plan *a, const tide_plan *b) {
    for (int i = 0; i < a->g->n_tensors; i++) {
        tide_role r = a->g->tensors[i].role;
        if (r != TIDE_ROLE_TEMP && a->home[i] != b->home[i]) return false;
    }
    return true;
}

/* A new plan of the step on hw, as prepare made the first (R3), and its
 * runner bound to the same homes. TIDE_OK and *out, or why not. */
static tide_status replan(tide_trainer *t, const tide_hw *hw, tide_runner **out, int *host_before) {
    tide_ctx *ctx = t->ctx;
    tide_graph *g = NULL;
    tide_plan *p = NULL;
    *out = NULL;
    *host_before = -1;
    tide_status st = tide_llama_build_train(ctx, &t->cfg, &t->o.step, &g);
    if (st) return st;
    tide_plan_opts po = train_offload_opts(t, t->budget); /* as the first plan's */
    po.hw = hw;
    po.consider_zero_offload = true;
    const tide_plan *old = tide_runner_plan(t->run);
    /* R3: the updates placed again on the refitted rates, where the first
     * placement was chosen by them (a placement that moves a home is not
     * taken: the first one's plan instead) */
    bool *ops = NULL;
    train_optim_choice ch = t->optim_choice;
    bool placed = t->policy == TIDE_POLICY_TIDE && t->optim == TRAIN_OPTIM_AUTO && !t->be->vt->device_is_host;
    if (placed && train_optim_place(ctx, g, &po, TRAIN_OPTIM_AUTO, &ops, &ch)) {
        tide_err_clear(ctx);
        placed = false;
    }
    bool took_new = false; /* the plan kept is the new placement's (pass 0) */
    for (int pass = placed ? 0 : 1; pass < 2; pass++) {
        po.host_ops = pass == 0 ? ops : t->host_ops;
        if ((st = tide_plan_make(ctx, g, &po, &p))) {
            if (pass == 0) {
                tide_err_clear(ctx);
                continue;
            }
            tide_free(ops);
            tide_graph_free(g);
            return st;
        }
        if (same_homes(old, p) && p->device_budget <= t->arena_bytes) {
            took_new = pass == 0;
            break;
        }
        tide_plan_free(p);
        p = NULL;
    }
    if (!p) {
        tide_free(ops);
        tide_graph_free(g);
        return tide_err(ctx, TIDE_E_INVALID, "the refitted plan homes the training state differently");
    }
    if (took_new) {
        *host_before = t->optim_choice.n_host;
        if (ops != t->host_ops) tide_free(t->host_ops);
        t->host_ops = ops;
        t->optim_choice = ch;
    } else {
        tide_free(ops);
    }
    train_optim_sync(g, p, &t->optim_choice);
    tide_runner_opts ro = train_runner_opts(t, false);
    if ((st = tide_runner_new(ctx, t->be, g, p, &ro, out))) return st;
    /* the state file's name is gone (unlinked once the first runner held
     * it): the new executor opens it through the trainer's descriptor */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", t->state_fd);
    if ((st = train_bind_runner(t, *out, t->state_fd >= 0 ? path : NULL))) {
        tide_runner_free(*out);
        *out = NULL;
    }
    return st;
}

void train_refit_after_step(tide_trainer *t, double measured_s, tide_train_stats *out) {
    if (!t->offload || t->off.no_refit || t->refit_done || t->runs < 2) return;
    t->refit_done = true; /* R1 */
    const tide_sim_event *tl = tide_runner_timeline(t->run);
    double before = t->predicted_s;
    if (!tl || !(before > 0) || fabs(measured_s / before - 1) <= TIDE_TRAIN_REFIT_MARGIN) return; /* R2 */
    tide_hw hw;
    if (tide_hw_refit(tide_runner_plan(t->run), tl, &t->hw, &hw, NULL)) return;
    tide_runner *run = NULL;
    int host_before = -1;
    int replanned = replan(t, &hw, &run, &host_before) == TIDE_OK ? 1 : -1;
    t->hw = hw;
    if (replanned > 0) {
        tide_runner_free(t->run);
        t->run = run;
        const tide_plan *p = tide_runner_plan(run);
        t->predicted_s = p->stats.makespan_s;
        t->peak_device = p->stats.peak_device_bytes;
    } else {
        /* R5: the kept plan, priced on the refitted profile */
        tide_sim_result sim;
        if (!tide_simulate(tide_runner_plan(t->run), &t->hw, &sim)) {
            t->predicted_s = sim.makespan_s;
            tide_sim_result_free(&sim);
        }
    }
    if (out) {
        out->replan = replanned;
        out->refit_measured_s = measured_s;
        out->refit_predicted_s = before;
        out->refit_new_predicted_s = t->predicted_s;
        out->refit_host_groups_before = replanned > 0 ? host_before : -1;
    }
}
