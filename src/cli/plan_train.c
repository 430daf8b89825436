/*
 * plan_train.c - `tide plan --train`: plan, verify and simulate a training
 * step of a LLaMA-style model under a device memory budget.
 *
 * Steps are planned as a steady state: two iterations of the step graph in
 * one plan, persistent tensors (parameters, master weights, moments) starting
 * and ending at their homes. A step's time is the second iteration's: the
 * end of its last instruction minus the end of the first iteration's last.
 * The ideal is what TERAIO calls the speed with unlimited memory: the same
 * steady step with every persistent tensor resident on the device (warm at
 * fixed offsets, never loaded or stored) and no budget; only the batch moves.
 * Both, and the bytes a step moves per link, come from train/train_plan.c.
 */
#include "cli.h"
#include "plan_int.h"
#include "trace/trace.h"
#include "train/train_plan.h"
#include "runtime/tiling.h"
#include "verify/verify.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of the activations a micro-batch keeps from its forward for its
 * backward: those of the first micro-batch written before its (first row
 * tile's) loss and read after it. */
static uint64_t kept_activations(const tide_graph *g) {
    int ce = -1, next = g->n_ops; /* the first loss, the next micro-batch's first (row tiles share a loss) */
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].kind == TIDE_OP_CROSS_ENTROPY) {
            if (ce < 0) ce = i;
            else if (g->ops[i].out[0] != g->ops[ce].out[0]) {
                next = i;
                break;
            }
        }
    char *mark = tide_calloc((size_t)(g->n_tensors ? g->n_tensors : 1), 1);
    if (ce < 0 || !mark) {
        tide_free(mark);
        return 0;
    }
    for (int i = 0; i <= ce; i++)
        for (int k = 0; k < g->ops[i].n_out; k++) mark[g->ops[i].out[k]] |= 1;
    for (int i = ce + 1; i < next; i++)
        for (int k = 0; k < g->ops[i].n_in; k++) mark[g->ops[i].in[k]] |= 2;
    uint64_t sum = 0;
    for (int t = 0; t < g->n_tensors; t++)
        if (mark[t] == 3 && g->tensors[t].role == TIDE_ROLE_TEMP && tide_train_tensor_class(g, t) == TIDE_TRAIN_ACT)
            sum += g->tensors[t].nbytes;
    tide_free(mark);
    return sum;
}

int plan_train(const plan_args *a) {
    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) return 1;
    int rc = 1;
    tide_llama_config cfg;
    tide_hw hw;
    tide_graph *g = NULL;
    tide_plan *p = NULL;
    tide_sim_result sim = {0};
    bool *host_ops = NULL;
    train_optim_choice oc = {0};
    char path[4096], b1[32], b2[32], note[96] = "";
    if (a->model) snprintf(path, sizeof path, "%s/config.json", a->model);
    if (a->model ? tide_llama_config_load(ctx, path, &cfg) : tide_llama_config_named(ctx, a->config, &cfg)) {
        rc = cli_fail(ctx, "config");
        goto done;
    }
    if (tide_hw_load(ctx, a->hw_name, &hw)) {
        rc = cli_fail(ctx, "hardware profile");
        goto done;
    }
    tide_llama_train_opts to = {.batch = (int)a->batch, .seq = (int)a->seq, .accum = (int)a->accum, .beta1 = 0.9f,
                                .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    if (tide_llama_build_train(ctx, &cfg, &to, &g)) {
        rc = cli_fail(ctx, "building the training graph");
        goto done;
    }
    tide_plan_opts po = {.policy = a->policy, .host_budget = a->host_budget, .n_iter = 2, .hw = &hw};
    uint64_t peak = tide_plan_unconstrained_peak(ctx, g, &hw, 2);
    if (!peak) {
        rc = cli_fail(ctx, "sizing the unconstrained step");
        goto done;
    }
    /* the ideal: the untiled step with unlimited memory (tiles only add ops) */
    double ideal = 0;
    if (tide_plan_ideal_step(ctx, g, &hw, &ideal)) {
        rc = cli_fail(ctx, "simulating");
        goto done;
    }
    /* row tiles: auto for the tide policy; the baselines untiled unless forced */
    const int tile = a->tile == TIDE_TILE_AUTO && a->policy != TIDE_POLICY_TIDE ? TIDE_TILE_NONE : a->tile;
    int level = 0;
    uint64_t untiled_min = 0, untiled_ws = 0;
    const bool min_budget = !strcmp(a->budget, "min");
    {
        /* the untiled step's largest device working set (updates on the host
         * need none, as with --optimizer cpu) */
        tide_plan_opts pw = po;
        bool *host = a->optim == TRAIN_OPTIM_CPU ? train_optim_all_host(ctx, g) : NULL;
        pw.host_ops = host;
        if (tide_plan_max_working_set(ctx, g, &pw, &untiled_ws)) untiled_ws = tide_graph_max_working_set(g, NULL);
        tide_err_clear(ctx);
        tide_free(host);
    }
    if (min_budget) {
        tide_graph *tg = NULL;
        bool all = a->optim == TRAIN_OPTIM_CPU && a->policy == TIDE_POLICY_TIDE;
        if (tide_train_tiling(ctx, &cfg, &to, &po, all, tile, 0, &tg, &level, &po.device_budget)) {
            rc = cli_fail(ctx, "finding the minimum budget");
            goto done;
        }
        tide_graph_free(tg); /* planned below at that level */
        snprintf(note, sizeof note, "(the minimum for %s)", tide_policy_name(a->policy));
        if (level > 0) { /* the untiled step's own minimum (g), for comparison */
            tide_plan_opts pu = po;
            bool *host = all ? train_optim_all_host(ctx, g) : NULL;
            pu.host_ops = host;
            if (tide_plan_min_budget(ctx, g, &pu, &untiled_min)) untiled_min = 0;
            tide_err_clear(ctx);
            tide_free(host);
        }
    } else if (a->budget[0] && a->budget[strlen(a->budget) - 1] == '%') {
        char *end;
        double pct = strtod(a->budget, &end);
        if (end == a->budget || *end != '%' || !(pct > 0 && pct <= 100)) {
            rc = cli_usage_error("plan", "bad --budget '%s' (a percentage in (0, 100])", a->budget);
            goto done;
        }
        uint64_t base = TIDE_MIN(peak, hw.device_mem_bytes);
        po.device_budget = (uint64_t)((double)base * pct / 100.0);
        snprintf(note, sizeof note, "(%g%% of %s)", pct,
                 peak > hw.device_mem_bytes ? "the device memory" : "the unconstrained peak");
    } else if (cli_parse_bytes(a->budget, &po.device_budget) || !po.device_budget) {
        rc = cli_usage_error("plan", "bad --budget '%s' (bytes such as 20G, a percentage, or min)", a->budget);
        goto done;
    }
    if (po.device_budget > hw.device_mem_bytes) {
        fprintf(stderr, "tide: plan: budget %s is more than %s's device memory %s\n",
                cli_fmt_bytes(po.device_budget, b1, sizeof b1), hw.name,
                cli_fmt_bytes(hw.device_mem_bytes, b2, sizeof b2));
        goto done;
    }
    double t0 = tide_now();
    /* the row tiling (at the minimum: the level found above), where the
     * AdamW updates run (the search plans candidates itself) and the plan */
    tide_train_planned tp;
    int ptile = min_budget ? (level > 0 ? level : TIDE_TILE_NONE) : tile;
    tide_status st = tide_train_plan_tiled(ctx, &cfg, &to, &po, a->optim, a->optim, ptile, &tp);
    if (!st) {
        tide_graph_free(g);
        g = tp.g;
        p = tp.p;
        host_ops = tp.host_ops;
        oc = tp.oc;
        level = tp.level;
        po.host_ops = host_ops;
        po.consider_zero_offload = true;
    }
    if (st) {
        if (a->json && st == TIDE_E_INFEASIBLE)
            printf("{\"feasible\":false,\"policy\":\"%s\",\"budget_bytes\":%llu}\n", tide_policy_name(a->policy),
                   (unsigned long long)po.device_budget);
        rc = cli_fail(ctx, "planning");
        goto done;
    }
    double plan_s = tide_now() - t0;
    uint64_t ws = 0; /* the planned graph's largest device working set, as planned */
    if (tide_plan_max_working_set(ctx, g, &po, &ws)) ws = tide_graph_max_working_set(g, NULL);
    if (tide_plan_verify(p)) {
        rc = cli_fail(ctx, "the plan failed verification and was not used");
        goto done;
    }
    double step = 0, dev_step = 0;
    tide_bounds bounds;
    if (tide_plan_steady_step(p, &hw, &step, &sim) ||
        tide_plan_bounds(ctx, g, &po, &bounds)) {
        rc = cli_fail(ctx, "simulating");
        goto done;
    }
    if (oc.n_host && oc.device_makespan_s > 0) {
        /* the same step with every update on the device, for comparison */
        tide_plan_opts pd = po;
        pd.host_ops = NULL;
        pd.consider_zero_offload = false;
        tide_plan *q = NULL;
        if (tide_plan_make(ctx, g, &pd, &q) || tide_plan_steady_step(q, &hw, &dev_step, NULL)) dev_step = 0;
        tide_plan_free(q);
    }
    if (a->trace && tide_trace_write(p, sim.events, sim.n_events, a->trace)) {
        rc = cli_fail(ctx, "writing the trace");
        goto done;
    }
    if (a->out && tide_plan_save_json(p, a->out)) {
        rc = cli_fail(ctx, "writing the plan");
        goto done;
    }
    uint64_t cls[TIDE_TRAIN_CLASS_COUNT] = {0};
    for (int t = 0; t < g->n_tensors; t++) cls[tide_train_tensor_class(g, t)] += g->tensors[t].nbytes;
    uint64_t act = kept_activations(g);
    tide_step_bytes lb = tide_plan_step_bytes(p);
    const tide_plan_stats *s = &p->stats;
    double tokens = (double)a->batch * (double)a->seq * (double)a->accum;
    if (a->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "feasible", 1);
        cJSON_AddBoolToObject(o, "verified", 1);
        cJSON_AddStringToObject(o, "config", cfg.name);
        cJSON_AddStringToObject(o, "workload", "train");
        cJSON_AddNumberToObject(o, "batch", (double)a->batch);
        cJSON_AddNumberToObject(o, "seq", (double)a->seq);
        cJSON_AddNumberToObject(o, "accum", (double)a->accum);
        cJSON_AddStringToObject(o, "hw", hw.name);
        cJSON_AddStringToObject(o, "policy", tide_policy_name(p->policy));
        cJSON_AddNumberToObject(o, "budget_bytes", (double)p->device_budget);
        cJSON_AddNumberToObject(o, "unconstrained_peak_bytes", (double)peak);
        cJSON_AddNumberToObject(o, "peak_device_bytes", (double)s->peak_device_bytes);
        cJSON_AddNumberToObject(o, "peak_host_spill_bytes", (double)s->peak_host_bytes);
        cJSON_AddNumberToObject(o, "peak_ssd_spill_bytes", (double)s->peak_ssd_bytes);
        cJSON_AddNumberToObject(o, "weight_bytes", (double)cls[TIDE_TRAIN_PARAM]);
        cJSON_AddNumberToObject(o, "master_bytes", (double)cls[TIDE_TRAIN_MASTER]);
        cJSON_AddNumberToObject(o, "moment_bytes", (double)cls[TIDE_TRAIN_MOMENT]);
        cJSON_AddNumberToObject(o, "gradient_bytes", (double)cls[TIDE_TRAIN_GRAD]);
        cJSON_AddNumberToObject(o, "kept_activation_bytes", (double)act);
        cJSON_AddNumberToObject(o, "step_bytes_h2d", (double)lb.h2d);
        cJSON_AddNumberToObject(o, "step_bytes_d2h", (double)lb.d2h);
        cJSON_AddNumberToObject(o, "step_bytes_ssd_read", (double)lb.ssd_read);
        cJSON_AddNumberToObject(o, "step_bytes_ssd_write", (double)lb.ssd_write);
        cJSON_AddNumberToObject(o, "n_instructions", p->n_ins);
        cJSON_AddNumberToObject(o, "n_ops", g->n_ops);
        cJSON_AddNumberToObject(o, "tile_level", level);
        cJSON_AddNumberToObject(o, "tile_seqs", to.tile_seqs ? to.tile_seqs : to.batch);
        cJSON_AddNumberToObject(o, "vocab_blocks", to.vocab_blocks > 1 ? to.vocab_blocks : 1);
        cJSON_AddNumberToObject(o, "max_working_set_bytes", (double)ws);
        cJSON_AddNumberToObject(o, "untiled_max_working_set_bytes", (double)untiled_ws);
        if (untiled_min) cJSON_AddNumberToObject(o, "untiled_min_budget_bytes", (double)untiled_min);
        cJSON_AddNumberToObject(o, "makespan_s", s->makespan_s);
        cJSON_AddNumberToObject(o, "step_s", step);
        cJSON_AddNumberToObject(o, "ideal_step_s", ideal);
        cJSON_AddNumberToObject(o, "pct_of_ideal", step > 0 ? 100.0 * ideal / step : 0);
        cJSON_AddNumberToObject(o, "lower_bound_s", bounds.lower_bound_s);
        cJSON_AddNumberToObject(o, "x_lower_bound", bounds.lower_bound_s > 0 ? s->makespan_s / bounds.lower_bound_s : 0);
        cJSON_AddNumberToObject(o, "tokens_per_s", step > 0 ? tokens / step : 0);
        cJSON_AddNumberToObject(o, "plan_seconds", plan_s);
        cJSON_AddNumberToObject(o, "optimizer_groups", oc.n_groups);
        cJSON_AddNumberToObject(o, "optimizer_host_groups", oc.n_host);
        cJSON_AddNumberToObject(o, "optimizer_host_state_bytes", (double)oc.host_state_bytes);
        if (oc.n_host) cJSON_AddNumberToObject(o, "device_optimizer_step_s", dev_step);
        char *js = cJSON_PrintUnformatted(o);
        if (js) puts(js);
        free(js);
        cJSON_Delete(o);
    } else {
        printf("plan        %s training step, batch %ld x seq %ld x accum %ld, policy %s, hw %s\n", cfg.name,
               a->batch, a->seq, a->accum, tide_policy_name(p->policy), hw.name);
        printf("verified    yes (%d instructions, %d ops x %d steps)\n", p->n_ins, g->n_ops, p->n_iter);
        if (level > 0) {
            char b3[32];
            printf("tiling      level %d: row tiles of %d of the %ld sequences", level,
                   to.tile_seqs ? to.tile_seqs : (int)a->batch, a->batch);
            if (to.vocab_blocks > 1) printf(", embedding and head in %d vocabulary blocks", to.vocab_blocks);
            printf("; largest op %s (untiled %s)", cli_fmt_bytes(ws, b1, sizeof b1),
                   cli_fmt_bytes(untiled_ws, b2, sizeof b2));
            if (untiled_min) printf("; untiled minimum %s", cli_fmt_bytes(untiled_min, b3, sizeof b3));
            printf("\n");
        } else {
            printf("tiling      none (largest op %s)\n", cli_fmt_bytes(ws, b1, sizeof b1));
        }
        printf("budget      %s %s; unconstrained peak %s\n", cli_fmt_bytes(p->device_budget, b1, sizeof b1), note,
               cli_fmt_bytes(peak, b2, sizeof b2));
        printf("memory      weights %s, master weights %s, moments %s, gradients %s, activations %s kept "
               "per micro-batch\n", cli_fmt_bytes(cls[TIDE_TRAIN_PARAM], b1, sizeof b1),
               cli_fmt_bytes(cls[TIDE_TRAIN_MASTER], b2, sizeof b2), cli_fmt_bytes(cls[TIDE_TRAIN_MOMENT], path, 32),
               cli_fmt_bytes(cls[TIDE_TRAIN_GRAD], path + 32, 32), cli_fmt_bytes(act, path + 64, 32));
        printf("\n%-24s %14s\n", "", "value");
        printf("%-24s %14s\n", "peak device", cli_fmt_bytes(s->peak_device_bytes, b1, sizeof b1));
        printf("%-24s %14s\n", "peak host spill", cli_fmt_bytes(s->peak_host_bytes, b1, sizeof b1));
        printf("%-24s %14s\n", "peak ssd spill", cli_fmt_bytes(s->peak_ssd_bytes, b1, sizeof b1));
        printf("%-24s %14s\n", "bytes host->device/step", cli_fmt_bytes(lb.h2d, b1, sizeof b1));
        printf("%-24s %14s\n", "bytes device->host/step", cli_fmt_bytes(lb.d2h, b1, sizeof b1));
        printf("%-24s %14s\n", "bytes ssd read/step", cli_fmt_bytes(lb.ssd_read, b1, sizeof b1));
        printf("%-24s %14s\n", "bytes ssd write/step", cli_fmt_bytes(lb.ssd_write, b1, sizeof b1));
        printf("%-24s %13.4fs  (%.0f tokens/s)\n", "predicted step", step, step > 0 ? tokens / step : 0);
        printf("%-24s %13.4fs  (%.1f%% of ideal)\n", "ideal step (no limit)", ideal, step > 0 ? 100.0 * ideal / step : 0);
        printf("%-24s %13.4fs  (2 steps; %.3fx of lower bound %.4fs)\n", "predicted makespan", s->makespan_s,
               bounds.lower_bound_s > 0 ? s->makespan_s / bounds.lower_bound_s : 0, bounds.lower_bound_s);
        printf("%-24s %13.4fs\n", "planning time", plan_s);
        printf("optimizer   AdamW: %d of %d updates on the host CPU (%s of %s state)", oc.n_host, oc.n_groups,
               cli_fmt_bytes(oc.host_state_bytes, b1, sizeof b1), cli_fmt_bytes(oc.state_bytes, b2, sizeof b2));
        if (oc.n_host && dev_step > 0) printf("; all on the device: step %.4fs (%.2fx)", dev_step, dev_step / step);
        else if (oc.n_host && a->policy != TIDE_POLICY_ZERO_OFFLOAD)
            printf("; all on the device: not plannable at this budget");
        printf(" [%s, %d plans]\n", train_optim_name(a->optim), oc.plans_tried);
    }
    rc = 0;
done:
    tide_free(host_ops);
    tide_sim_result_free(&sim);
    tide_plan_free(p);
    tide_graph_free(g);
    tide_ctx_free(ctx);
    return rc;
}
