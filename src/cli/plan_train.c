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
 * Both, and the bytes a step moves per link, come from the library
 * (tide_planner_ideal_step, tide_train_plan_new, tide_plan_info_get).
 */
#include "cli.h"
#include "plan_int.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What one `tide plan --train` works on. */
typedef struct train_job {
    tide_ctx *ctx;
    tide_llama_config cfg;
    tide_hw *hw;
    tide_hw_info hwi;
    tide_llama_train_opts to;
    tide_planner_opts po;         /* policy, budget, host budget, 2 steps, profile */
    tide_graph *g;                /* the untiled step (until it is planned) */
    tide_train_plan *tp;          /* the step planned */
    tide_plan_info s;             /* its plan's figures */
    tide_train_plan_info ti;      /* its tiling and optimizer placement */
    tide_timeline *tl;            /* its predicted timeline */
    tide_bounds bounds;
    uint64_t peak;                /* unconstrained peak of the untiled step */
    uint64_t untiled_min, untiled_ws, ws;
    double ideal, step, dev_step;
    uint64_t net_intra, net_inter; /* bytes a rank sends per step (--ranks) */
    int tile, level;
    bool min_budget;
    char note[96];                /* how the budget was chosen */
} train_job;

/* The configuration, the profile, the untiled step graph, its unconstrained
 * peak, the ideal step and the untiled step's largest working set. Returns 0
 * or the exit status. */
static int load_step(const plan_args *a, train_job *j) {
    if (a->model ? cli_model_config(j->ctx, a->model, &j->cfg) : tide_llama_config_named(j->ctx, a->config, &j->cfg))
        return cli_fail(j->ctx, "config");
    /* QLoRA: --base-type, or a quantized (GGUF) base as stored */
    if (a->lora_r && (a->base_type || j->cfg.wtypes_set || tide_dtype_is_quantized(j->cfg.dtype) ||
                      j->cfg.qk_interleaved)) {
        tide_llama_config q;
        if (tide_qlora_config(j->ctx, &j->cfg, a->base_type, &q)) return cli_fail(j->ctx, "--base-type");
        j->cfg = q;
    }
    if (tide_hw_open(j->ctx, a->hw_name, &j->hw)) return cli_fail(j->ctx, "hardware profile");
    tide_hw_info_get(j->hw, &j->hwi);
    j->to = (tide_llama_train_opts){.batch = (int)a->batch, .seq = (int)a->seq, .accum = (int)a->accum,
                                    .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                    .grad_clip = 1.0f, .lora_r = (int)a->lora_r, .lora_alpha = 2.0f * (float)a->lora_r,
                                    .lora_targets = a->lora_targets, .ranks = (int)a->ranks, .zero = (int)a->zero,
                                    .precision = a->precision};
    if (tide_llama_build_train(j->ctx, &j->cfg, &j->to, &j->g)) return cli_fail(j->ctx, "building the training graph");
    j->po = tide_planner_opts_default();
    j->po.policy = a->policy;
    j->po.host_budget = a->host_budget;
    j->po.n_iter = 2;
    j->po.hw = j->hw;
    if (!(j->peak = tide_planner_peak(j->ctx, j->g, &j->po))) return cli_fail(j->ctx, "sizing the unconstrained step");
    /* the ideal: the untiled step with unlimited memory (tiles only add ops) */
    if (tide_planner_ideal_step(j->ctx, j->g, &j->po, &j->ideal)) return cli_fail(j->ctx, "simulating");
    /* row tiles: auto for the tide policy; the baselines untiled unless forced */
    j->tile = a->tile == TIDE_TILE_AUTO && a->policy != TIDE_POLICY_TIDE ? TIDE_TILE_NONE : a->tile;
    j->min_budget = !strcmp(a->budget, "min");
    /* the untiled step's largest device working set (updates on the host
     * need none, as with --optimizer cpu) */
    tide_planner_opts pw = j->po;
    pw.host_updates = a->optim == TIDE_OPTIM_CPU;
    if (tide_planner_max_working_set(j->ctx, j->g, &pw, &j->untiled_ws))
        j->untiled_ws = tide_graph_max_working_set(j->g, NULL);
    return 0;
}

/* The budget of --budget: the minimum (which also fixes the tiling level),
 * a percentage of the unconstrained peak, or bytes. Returns 0 or the exit
 * status. */
static int choose_budget(const plan_args *a, train_job *j) {
    if (j->min_budget) {
        tide_planner_opts o = j->po;
        o.host_updates = a->optim == TIDE_OPTIM_CPU && a->policy == TIDE_POLICY_TIDE;
        o.tile = j->tile;
        if (tide_train_min_budget(j->ctx, &j->cfg, &j->to, &o, &j->level, &j->po.device_budget))
            return cli_fail(j->ctx, "finding the minimum budget");
        snprintf(j->note, sizeof j->note, "(the minimum for %s)", tide_policy_name(a->policy));
        o.device_budget = j->po.device_budget;
        if (j->level > 0 && tide_planner_min_budget(j->ctx, j->g, &o, &j->untiled_min))
            j->untiled_min = 0; /* the untiled step's own minimum, for comparison */
    } else if (a->budget[0] && a->budget[strlen(a->budget) - 1] == '%') {
        char *end;
        double pct = strtod(a->budget, &end);
        if (end == a->budget || *end != '%' || !(pct > 0 && pct <= 100))
            return cli_usage_error("plan", "bad --budget '%s' (a percentage in (0, 100])", a->budget);
        uint64_t base = j->peak < j->hwi.device_mem_bytes ? j->peak : j->hwi.device_mem_bytes;
        j->po.device_budget = (uint64_t)((double)base * pct / 100.0);
        snprintf(j->note, sizeof j->note, "(%g%% of %s)", pct,
                 j->peak > j->hwi.device_mem_bytes ? "the device memory" : "the unconstrained peak");
    } else if (cli_parse_bytes(a->budget, &j->po.device_budget) || !j->po.device_budget) {
        return cli_usage_error("plan", "bad --budget '%s' (bytes such as 20G, a percentage, or min)", a->budget);
    }
    if (j->po.device_budget > j->hwi.device_mem_bytes) {
        char b1[32], b2[32];
        fprintf(stderr, "tide: plan: budget %s is more than %s's device memory %s\n",
                cli_fmt_bytes(j->po.device_budget, b1, sizeof b1), j->hwi.name,
                cli_fmt_bytes(j->hwi.device_mem_bytes, b2, sizeof b2));
        return 1;
    }
    return 0;
}

/* The row tiling (at the minimum: the level found), where the AdamW updates
 * run (the search plans candidates itself) and the plan; then its largest
 * working set and its verification. Returns 0 or the exit status. */
static int plan_step(const plan_args *a, train_job *j) {
    tide_planner_opts o = j->po;
    o.tile = j->min_budget ? (j->level > 0 ? j->level : TIDE_TILE_NONE) : j->tile;
    o.optimizer = a->optim;
    tide_status st = tide_train_plan_new(j->ctx, &j->cfg, &j->to, &o, &j->tp);
    if (st) {
        if (a->json && st == TIDE_E_INFEASIBLE)
            printf("{\"feasible\":false,\"policy\":\"%s\",\"budget_bytes\":%llu}\n", tide_policy_name(a->policy),
                   (unsigned long long)j->po.device_budget);
        return cli_fail(j->ctx, "planning");
    }
    tide_graph_free(j->g);
    j->g = NULL;
    tide_plan_info_get(tide_train_plan_get_plan(j->tp), &j->s);
    tide_train_plan_info_get(j->tp, &j->ti);
    j->level = j->ti.tile_level;
    /* the planned graph's largest device working set, as planned */
    if (tide_train_plan_max_working_set(j->tp, &j->ws)) j->ws = tide_graph_max_working_set(tide_train_plan_graph(j->tp), NULL);
    if (tide_plan_verify(tide_train_plan_get_plan(j->tp)))
        return cli_fail(j->ctx, "the plan failed verification and was not used");
    return 0;
}

/* The steady step, the bounds, the step with every update on the device
 * (for comparison), and the files asked for. Returns 0 or the exit status. */
static int simulate_step(const plan_args *a, train_job *j) {
    const tide_plan *p = tide_train_plan_get_plan(j->tp);
    if (tide_plan_simulate(p, j->hw, &j->tl) || tide_train_plan_bounds(j->tp, &j->bounds))
        return cli_fail(j->ctx, "simulating");
    j->step = tide_timeline_step(j->tl);
    if (j->ti.optimizer_host_groups && j->ti.device_optimizer_makespan_s > 0) {
        tide_plan *q = NULL;
        tide_timeline *qt = NULL;
        if (tide_plan_new(j->ctx, tide_train_plan_graph(j->tp), &j->po, &q) || tide_plan_simulate(q, j->hw, &qt))
            j->dev_step = 0;
        else
            j->dev_step = tide_timeline_step(qt);
        tide_timeline_free(qt);
        tide_plan_free(q);
    }
    tide_plan_net_bytes(p, j->hw, &j->net_intra, &j->net_inter);
    if (a->trace && tide_plan_write_trace(p, j->tl, a->trace, NULL)) return cli_fail(j->ctx, "writing the trace");
    if (a->out && tide_plan_save_json(p, a->out)) return cli_fail(j->ctx, "writing the plan");
    return 0;
}

/* --ranks: the data-parallel fields of --json. */
static void add_ranks_json(cJSON *o, const plan_args *a, const train_job *j) {
    cJSON_AddNumberToObject(o, "ranks", j->s.ranks);
    cJSON_AddNumberToObject(o, "zero", (double)a->zero);
    cJSON_AddNumberToObject(o, "collectives_per_step", j->s.step_collectives);
    cJSON_AddNumberToObject(o, "net_bytes_per_rank", (double)(j->net_intra + j->net_inter));
    cJSON_AddNumberToObject(o, "net_bytes_intra_node_per_rank", (double)j->net_intra);
    cJSON_AddNumberToObject(o, "net_bytes_inter_node_per_rank", (double)j->net_inter);
    cJSON_AddNumberToObject(o, "state_bytes_this_rank", (double)(j->ti.master_bytes + j->ti.moment_bytes));
    cJSON_AddNumberToObject(o, "tokens_per_s_all_ranks",
                            j->step > 0 ? (double)a->batch * a->seq * a->accum * j->s.ranks / j->step : 0);
}

static void print_json(const plan_args *a, const train_job *j) {
    const tide_plan_info *s = &j->s;
    const tide_train_plan_info *ti = &j->ti;
    double tokens = (double)a->batch * (double)a->seq * (double)a->accum, step = j->step;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "feasible", 1);
    cJSON_AddBoolToObject(o, "verified", 1);
    cJSON_AddStringToObject(o, "config", j->cfg.name);
    cJSON_AddStringToObject(o, "workload", "train");
    cJSON_AddNumberToObject(o, "batch", (double)a->batch);
    cJSON_AddNumberToObject(o, "seq", (double)a->seq);
    cJSON_AddNumberToObject(o, "accum", (double)a->accum);
    cJSON_AddStringToObject(o, "hw", j->hwi.name);
    cJSON_AddStringToObject(o, "policy", tide_policy_name(s->policy));
    cJSON_AddNumberToObject(o, "budget_bytes", (double)s->device_budget);
    cJSON_AddNumberToObject(o, "unconstrained_peak_bytes", (double)j->peak);
    cJSON_AddNumberToObject(o, "peak_device_bytes", (double)s->peak_device_bytes);
    cJSON_AddNumberToObject(o, "peak_host_spill_bytes", (double)s->peak_host_bytes);
    cJSON_AddNumberToObject(o, "peak_ssd_spill_bytes", (double)s->peak_ssd_bytes);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)ti->weight_bytes);
    cJSON_AddNumberToObject(o, "master_bytes", (double)ti->master_bytes);
    cJSON_AddNumberToObject(o, "moment_bytes", (double)ti->moment_bytes);
    cJSON_AddNumberToObject(o, "gradient_bytes", (double)ti->gradient_bytes);
    cJSON_AddNumberToObject(o, "kept_activation_bytes", (double)ti->kept_activation_bytes);
    cJSON_AddStringToObject(o, "precision", tide_train_precision_name(a->precision));
    cJSON_AddNumberToObject(o, "step_bytes_h2d", (double)s->step_bytes_h2d);
    cJSON_AddNumberToObject(o, "step_bytes_d2h", (double)s->step_bytes_d2h);
    cJSON_AddNumberToObject(o, "step_bytes_ssd_read", (double)s->step_bytes_ssd_read);
    cJSON_AddNumberToObject(o, "step_bytes_ssd_write", (double)s->step_bytes_ssd_write);
    cJSON_AddNumberToObject(o, "n_instructions", s->n_instructions);
    cJSON_AddNumberToObject(o, "n_ops", tide_graph_n_ops(tide_train_plan_graph(j->tp)));
    cJSON_AddNumberToObject(o, "tile_level", j->level);
    cJSON_AddNumberToObject(o, "tile_seqs", j->to.tile_seqs ? j->to.tile_seqs : j->to.batch);
    cJSON_AddNumberToObject(o, "vocab_blocks", j->to.vocab_blocks > 1 ? j->to.vocab_blocks : 1);
    cJSON_AddNumberToObject(o, "max_working_set_bytes", (double)j->ws);
    cJSON_AddNumberToObject(o, "untiled_max_working_set_bytes", (double)j->untiled_ws);
    if (j->untiled_min) cJSON_AddNumberToObject(o, "untiled_min_budget_bytes", (double)j->untiled_min);
    cJSON_AddNumberToObject(o, "makespan_s", s->makespan_s);
    cJSON_AddNumberToObject(o, "step_s", step);
    cJSON_AddNumberToObject(o, "ideal_step_s", j->ideal);
    cJSON_AddNumberToObject(o, "pct_of_ideal", step > 0 ? 100.0 * j->ideal / step : 0);
    cJSON_AddNumberToObject(o, "lower_bound_s", j->bounds.lower_bound_s);
    cJSON_AddNumberToObject(o, "x_lower_bound",
                            j->bounds.lower_bound_s > 0 ? s->makespan_s / j->bounds.lower_bound_s : 0);
    cJSON_AddNumberToObject(o, "tokens_per_s", step > 0 ? tokens / step : 0);
    cJSON_AddNumberToObject(o, "plan_seconds", ti->plan_seconds);
    cJSON_AddNumberToObject(o, "optimizer_groups", ti->optimizer_groups);
    cJSON_AddNumberToObject(o, "optimizer_host_groups", ti->optimizer_host_groups);
    cJSON_AddNumberToObject(o, "optimizer_host_state_bytes", (double)ti->optimizer_host_state_bytes);
    if (ti->optimizer_host_groups) cJSON_AddNumberToObject(o, "device_optimizer_step_s", j->dev_step);
    if (s->ranks > 1) add_ranks_json(o, a, j);
    char *js = cJSON_PrintUnformatted(o);
    if (js) puts(js);
    free(js);
    cJSON_Delete(o);
}

/* The tiling line of the table. */
static void print_tiling(const plan_args *a, const train_job *j) {
    char b1[32], b2[32], b3[32];
    if (j->level <= 0) {
        printf("tiling      none (largest op %s)\n", cli_fmt_bytes(j->ws, b1, sizeof b1));
        return;
    }
    printf("tiling      level %d: row tiles of %d of the %ld sequences", j->level,
           j->to.tile_seqs ? j->to.tile_seqs : (int)a->batch, a->batch);
    if (j->to.vocab_blocks > 1) printf(", embedding and head in %d vocabulary blocks", j->to.vocab_blocks);
    printf("; largest op %s (untiled %s)", cli_fmt_bytes(j->ws, b1, sizeof b1),
           cli_fmt_bytes(j->untiled_ws, b2, sizeof b2));
    if (j->untiled_min) printf("; untiled minimum %s", cli_fmt_bytes(j->untiled_min, b3, sizeof b3));
    printf("\n");
}

static void print_human(const plan_args *a, const train_job *j) {
    const tide_plan_info *s = &j->s;
    const tide_train_plan_info *ti = &j->ti;
    double tokens = (double)a->batch * (double)a->seq * (double)a->accum, step = j->step, ideal = j->ideal;
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    printf("plan        %s training step, batch %ld x seq %ld x accum %ld, policy %s, hw %s\n", j->cfg.name,
           a->batch, a->seq, a->accum, tide_policy_name(s->policy), j->hwi.name);
    printf("verified    yes (%d instructions, %d ops x %d steps)\n", s->n_instructions,
           tide_graph_n_ops(tide_train_plan_graph(j->tp)), s->n_iter);
    print_tiling(a, j);
    printf("budget      %s %s; unconstrained peak %s\n", cli_fmt_bytes(s->device_budget, b1, sizeof b1), j->note,
           cli_fmt_bytes(j->peak, b2, sizeof b2));
    printf("memory      weights %s, master weights %s, moments %s, gradients %s, activations %s kept "
           "per micro-batch\n", cli_fmt_bytes(ti->weight_bytes, b1, sizeof b1),
           cli_fmt_bytes(ti->master_bytes, b2, sizeof b2), cli_fmt_bytes(ti->moment_bytes, b3, sizeof b3),
           cli_fmt_bytes(ti->gradient_bytes, b4, sizeof b4), cli_fmt_bytes(ti->kept_activation_bytes, b5, sizeof b5));
    if (a->precision == TIDE_PRECISION_BF16)
        printf("precision   bf16: bf16 products with f32 sums; activations kept in bf16, the residual stream in "
               "f32\n");
    if (s->ranks > 1)
        printf("ranks       %d data-parallel, ZeRO-%ld: this rank's master weights and moments %s; "
               "%d collectives a step on the net stream\n", s->ranks, a->zero,
               cli_fmt_bytes(ti->master_bytes + ti->moment_bytes, b1, sizeof b1), s->step_collectives);
    printf("\n%-24s %14s\n", "", "value");
    printf("%-24s %14s\n", "peak device", cli_fmt_bytes(s->peak_device_bytes, b1, sizeof b1));
    printf("%-24s %14s\n", "peak host spill", cli_fmt_bytes(s->peak_host_bytes, b1, sizeof b1));
    printf("%-24s %14s\n", "peak ssd spill", cli_fmt_bytes(s->peak_ssd_bytes, b1, sizeof b1));
    printf("%-24s %14s\n", "bytes host->device/step", cli_fmt_bytes(s->step_bytes_h2d, b1, sizeof b1));
    printf("%-24s %14s\n", "bytes device->host/step", cli_fmt_bytes(s->step_bytes_d2h, b1, sizeof b1));
    printf("%-24s %14s\n", "bytes ssd read/step", cli_fmt_bytes(s->step_bytes_ssd_read, b1, sizeof b1));
    printf("%-24s %14s\n", "bytes ssd write/step", cli_fmt_bytes(s->step_bytes_ssd_write, b1, sizeof b1));
    if (s->ranks > 1) {
        printf("%-24s %14s\n", "bytes net/step/rank", cli_fmt_bytes(j->net_intra + j->net_inter, b1, sizeof b1));
        printf("%-24s %14s\n", "  inside a node", cli_fmt_bytes(j->net_intra, b1, sizeof b1));
        printf("%-24s %14s\n", "  between nodes", cli_fmt_bytes(j->net_inter, b1, sizeof b1));
        tokens *= s->ranks; /* every rank's */
    }
    printf("%-24s %13.4fs  (%.0f tokens/s)\n", "predicted step", step, step > 0 ? tokens / step : 0);
    printf("%-24s %13.4fs  (%.1f%% of ideal)\n", s->ranks > 1 ? "ideal step (no limit)*" : "ideal step (no limit)",
           ideal, step > 0 ? 100.0 * ideal / step : 0);
    if (s->ranks > 1) printf("%-24s  * perfect scaling: this rank's step, unlimited memory, a free network\n", "");
    printf("%-24s %13.4fs  (2 steps; %.3fx of lower bound %.4fs)\n", "predicted makespan", s->makespan_s,
           j->bounds.lower_bound_s > 0 ? s->makespan_s / j->bounds.lower_bound_s : 0, j->bounds.lower_bound_s);
    printf("%-24s %13.4fs\n", "planning time", ti->plan_seconds);
    printf("optimizer   AdamW: %d of %d updates on the host CPU (%s of %s state)", ti->optimizer_host_groups,
           ti->optimizer_groups, cli_fmt_bytes(ti->optimizer_host_state_bytes, b1, sizeof b1),
           cli_fmt_bytes(ti->optimizer_state_bytes, b2, sizeof b2));
    if (ti->optimizer_host_groups && j->dev_step > 0)
        printf("; all on the device: step %.4fs (%.2fx)", j->dev_step, j->dev_step / step);
    else if (ti->optimizer_host_groups && a->policy != TIDE_POLICY_ZERO_OFFLOAD)
        printf("; all on the device: not plannable at this budget");
    printf(" [%s, %d plans]\n", tide_optim_mode_name(a->optim), ti->plans_tried);
}

int plan_train(const plan_args *a) {
    train_job j = {.ctx = tide_ctx_new()};
    if (!j.ctx) return 1;
    int rc;
    if (!(rc = load_step(a, &j)) && !(rc = choose_budget(a, &j)) && !(rc = plan_step(a, &j)) &&
        !(rc = simulate_step(a, &j))) {
        if (a->json) print_json(a, &j);
        else print_human(a, &j);
    }
    tide_timeline_free(j.tl);
    tide_train_plan_free(j.tp);
    tide_graph_free(j.g);
    tide_hw_free(j.hw);
    tide_ctx_free(j.ctx);
    return rc;
}
