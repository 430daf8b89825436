/*
 * train_plan.c - the training planner benchmark: `tide plan --train`'s
 * figures for large models, every policy at every budget, in one run.
 *
 *   bench_train_plan [--quick] [--configs A,B] [--hw A,B] [--policies A,B]
 *                    [--batch B] [--seq T] [--accum N] [--ssds N]
 *                    [--host-mem BYTES] [--largest PCT] [--json FILE]
 *
 * A step of --accum micro-batches of (batch, seq) tokens (default 8 x 2048 x
 * 4) is planned as the CLI plans it: two iterations of the step graph as a
 * steady state, persistent tensors (parameters, f32 masters, AdamW moments)
 * starting and ending at their homes in host memory (on SSD for what the
 * host memory cannot hold). A config is a built-in name, or one scaled:
 * NAME:LAYERS or NAME:LAYERSxHIDDEN (the head size, the query to key/value
 * head ratio and the MLP to hidden ratio kept). --ssds and --host-mem set
 * the profiles' SSD count and host memory (the CLI takes them from a
 * profile JSON and --host-budget). Per model, profile, budget and policy:
 *   x LB        predicted makespan of the two steps over tide_plan_bounds'
 *               lower bound at that budget (compute, or the bytes that must
 *               cross the busiest link, whichever is longer; spills of what
 *               the host memory cannot hold are not counted)
 *   step s      the steady step: end of the second iteration's last
 *               instruction minus the end of the first's
 *   ideal s     the same steady step with every persistent tensor warm on
 *               the device and no budget (only the batch moves)
 *   % of ideal  ideal / step
 *   bytes       what one steady step moves per link
 *   plan s      wall time of planning: for tide, the placement of the AdamW
 *               updates (device or host CPU, searched by planning
 *               candidates, src/train/optim_place.c) and the plan
 *   AdamW on CPU  tide: updates placed on the host CPU, of all; beside it
 *               the step with every update on the device, and its ratio;
 *               zero-offload: all of them, always
 * Table 1b: tide's speed-up over zero-offload (ZeRO-Offload's placement in
 * the same engine: every AdamW on the host CPU, gradients stored after each
 * layer's backward, activations checkpointed per layer) at each budget both
 * plan; the target is 1.5x or more at 25% and below. Table 1c: tide's
 * speed-up over every baseline, budget by budget (at "min", each policy at
 * its own minimum). Table 2b: tide's minimum budget with row tiles
 * (tide_train_tiling: the level with the smallest minimum, updates on the
 * device, and with every update on the CPU) against the untiled step's and
 * zero-offload's, and tide's step at that minimum.
 * Budgets: 100, 50, 25 and 10% of the step's unconstrained peak, capped at
 * the profile's device memory when the peak is larger (as the CLI does), and
 * each policy's own minimum. Every plan is verified before it is counted.
 * Last, the planning time of a llama-2-70b step on h100-80g (target < 60 s,
 * Training II's; TERAIO's plans take 397 s).
 *
 * --largest PCT replaces all of that: per config shape and profile, the
 * largest layer count whose tide step at the device-memory budget reaches
 * PCT% of ideal (largest_search); every count tried is printed with its
 * lower bound's compute and link terms and the SSDs' busy time per step.
 *
 * The step, ideal step and bytes per link are src/train/train_plan.c's, the
 * figures `tide plan --train` prints.
 * Output: one JSON line per plan as soon as it is made (also to --json FILE),
 * markdown tables at the end. Exit status 0 when every plan made verifies and
 * the 70b step plans in under 60 s (with --largest: when every plan made
 * verifies, whatever the largest count); 1 otherwise; 2 for a usage error.
 */
#include "core/core.h"
#include "ir/plan.h"
#include "planner/planner.h"
#include "train/optim_place.h"
#include "train/train_plan.h"
#include "verify/verify.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB 1073741824.0
#define MAX_LIST 8
#define N_BUDGETS 5 /* 100, 50, 25, 10 %, min */
#define PLAN_S_TARGET 60.0 /* the llama-2-70b step's planning time, seconds (Training II) */

static const double budget_frac[N_BUDGETS] = {1.0, 0.5, 0.25, 0.10, 0};

/* One plan of one (model, profile, policy, budget). */
typedef struct row {
    bool ok;            /* planned and verified */
    bool over_device;   /* the policy's minimum is above the device memory */
    uint64_t budget;
    int n_ins;
    double step_s, makespan_s, lb_s, plan_s, verify_s;
    double lb_compute_s, lb_link_s; /* the lower bound's two terms */
    int n_host, n_groups;  /* tide: AdamW updates placed on the host CPU, of all */
    double dev_step_s;     /* tide with updates on the host: the step with all on the device */
    tide_step_bytes bytes;
    int tile_level;     /* tide: the row tiling level planned (0: untiled) */
    tide_status st;     /* the planner's status when !ok (0 for a failed verification) */
    char why[200];      /* the planner's message when !ok */
} row;

/* What does not depend on the policy or budget. */
typedef struct setup {
    const char *config, *hw_name; /* hw_name: the profile, with --ssds / --host-mem said */
    tide_hw hw;
    tide_graph *g;
    uint64_t peak, base; /* unconstrained peak; the percentages' base (peak capped at the device) */
    double ideal_s;
    uint64_t cls[TIDE_TRAIN_CLASS_COUNT];
    char label[96];      /* hw_name's storage in the main tables */
    tide_llama_config cfg;
    tide_llama_train_opts step; /* g's step options (untiled) */
} setup;

static tide_ctx *ctx;
static FILE *json_file;
static int failures;

static void jprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void jprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (json_file) {
        va_start(ap, fmt);
        vfprintf(json_file, fmt, ap);
        va_end(ap);
        fflush(json_file);
    }
}

/* Plans, verifies and simulates one (policy, budget). A plan that fails
 * verification counts as a failure of the run. */
/* The figures of plan p of g (made under po, its updates placed as oc says,
 * in plan_s): verified, simulated, against the bound; for tide with updates
 * on the host, the step with all of them on the device beside it. Frees p. */
static row eval_plan(const setup *s, const tide_graph *g, const tide_plan_opts *po, tide_plan *p,
                     const train_optim_choice *oc, double plan_s) {
    row r = {.budget = po->device_budget, .plan_s = plan_s, .n_host = oc->n_host};
    r.n_groups = po->policy == TIDE_POLICY_TIDE || po->policy == TIDE_POLICY_ZERO_OFFLOAD ? oc->n_groups : 0;
    double t0 = tide_now();
    tide_status st = tide_plan_verify(p);
    r.verify_s = tide_now() - t0;
    tide_bounds b;
    if (st) {
        snprintf(r.why, sizeof r.why, "verification failed: %s", tide_ctx_last_error(ctx));
        failures++;
    } else if (tide_plan_steady_step(p, &s->hw, &r.step_s, NULL) || tide_plan_bounds(ctx, g, po, &b)) {
        snprintf(r.why, sizeof r.why, "simulating: %s", tide_ctx_last_error(ctx));
        failures++;
    } else {
        r.ok = true;
        r.makespan_s = p->stats.makespan_s;
        r.lb_s = b.lower_bound_s;
        r.lb_compute_s = b.compute_s;
        r.lb_link_s = b.link_s;
        r.bytes = tide_plan_step_bytes(p);
        r.n_ins = p->n_ins;
        if (r.n_host && po->policy == TIDE_POLICY_TIDE) {
            /* the same step with every update on the device, side by side */
            tide_plan_opts pd = *po;
            pd.host_ops = NULL;
            pd.consider_zero_offload = false;
            tide_plan *q = NULL;
            if (tide_plan_make(ctx, g, &pd, &q) || tide_plan_steady_step(q, &s->hw, &r.dev_step_s, NULL))
                r.dev_step_s = 0;
            tide_plan_free(q);
        }
    }
    tide_plan_free(p);
    return r;
}

/* A failed plan's row. */
static row no_plan(uint64_t budget, tide_status st, double plan_s) {
    row r = {.budget = budget, .st = st, .plan_s = plan_s};
    snprintf(r.why, sizeof r.why, "%s", tide_ctx_last_error(ctx));
    if (st != TIDE_E_INFEASIBLE && st != TIDE_E_UNSUPPORTED) failures++;
    return r;
}

/* Plans policy pol at budget as `tide plan --train` does: the baselines the
 * untiled step; tide with its row tiling searched (tide_train_plan_tiled:
 * the untiled step where its largest op fits, finer tilings while faster). */
static row plan_one(const setup *s, tide_policy pol, uint64_t budget) {
    tide_plan_opts po = {.policy = pol, .device_budget = budget, .n_iter = 2, .hw = &s->hw};
    double t0 = tide_now();
    if (pol == TIDE_POLICY_TIDE) {
        tide_llama_train_opts o = s->step;
        tide_train_planned tp;
        tide_status st = tide_train_plan_tiled(ctx, &s->cfg, &o, &po, TRAIN_OPTIM_AUTO, TRAIN_OPTIM_AUTO,
                                               TIDE_TILE_AUTO, &tp);
        double plan_s = tide_now() - t0;
        if (st) return no_plan(budget, st, plan_s);
        po.host_ops = tp.host_ops;
        po.consider_zero_offload = true;
        row r = eval_plan(s, tp.g, &po, tp.p, &tp.oc, plan_s);
        r.tile_level = tp.level;
        tp.p = NULL;
        tide_train_planned_free(&tp);
        return r;
    }
    tide_plan *p = NULL;
    bool *host_ops = NULL;
    train_optim_choice oc = {0};
    tide_status st = train_optim_place(ctx, s->g, &po, TRAIN_OPTIM_AUTO, &host_ops, &oc);
    po.host_ops = host_ops;
    po.consider_zero_offload = true; /* as the CLI plans it */
    if (!st) st = tide_plan_make(ctx, s->g, &po, &p);
    if (!st) train_optim_sync(s->g, p, &oc);
    double plan_s = tide_now() - t0;
    row r = st ? no_plan(budget, st, plan_s) : eval_plan(s, s->g, &po, p, &oc, plan_s);
    if (st) r.n_groups = pol == TIDE_POLICY_ZERO_OFFLOAD ? oc.n_groups : 0;
    tide_free(host_ops);
    return r;
}

static void json_str(const char *key, const char *s) {
    jprintf("\"%s\":\"", key);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') jprintf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) jprintf(" ");
        else jprintf("%c", *s);
    }
    jprintf("\"");
}

static void print_json_row(const setup *s, int bi, tide_policy pol, const row *r, int batch, int seq, int accum) {
    double tokens = (double)batch * seq * accum;
    jprintf("{\"bench\":\"train_plan\",\"config\":\"%s\",\"hw\":\"%s\",\"ssd_count\":%d,\"host_mem_bytes\":%llu,"
            "\"batch\":%d,\"seq\":%d,\"accum\":%d,\"policy\":\"%s\",",
            s->config, s->hw.name, s->hw.ssd_count, (unsigned long long)s->hw.host_mem_bytes, batch, seq, accum,
            tide_policy_name(pol));
    if (budget_frac[bi] > 0)
        jprintf("\"budget\":\"%.0f%%\",\"budget_base\":\"%s\",", budget_frac[bi] * 100,
                s->peak > s->hw.device_mem_bytes ? "device_memory" : "unconstrained_peak");
    else jprintf("\"budget\":\"min\",");
    jprintf("\"budget_bytes\":%llu,\"unconstrained_peak_bytes\":%llu,\"device_mem_bytes\":%llu,\"feasible\":%s,"
            "\"tile_level\":%d,",
            (unsigned long long)r->budget, (unsigned long long)s->peak, (unsigned long long)s->hw.device_mem_bytes,
            r->ok ? "true" : "false", r->tile_level);
    if (r->ok)
        jprintf("\"x_lower_bound\":%.4f,\"pct_of_ideal\":%.2f,\"step_s\":%.4f,\"ideal_step_s\":%.4f,"
                "\"makespan_s\":%.4f,\"lower_bound_s\":%.4f,\"lb_compute_s\":%.4f,\"lb_link_s\":%.4f,"
                "\"tokens_per_s\":%.1f,\"step_bytes_h2d\":%llu,"
                "\"step_bytes_d2h\":%llu,\"step_bytes_ssd_read\":%llu,\"step_bytes_ssd_write\":%llu,"
                "\"plan_s\":%.4f,\"verify_s\":%.4f,\"adamw_host_groups\":%d,\"adamw_groups\":%d,"
                "\"device_adamw_step_s\":%.4f}\n",
                r->lb_s > 0 ? r->makespan_s / r->lb_s : 0, r->step_s > 0 ? 100 * s->ideal_s / r->step_s : 0,
                r->step_s, s->ideal_s, r->makespan_s, r->lb_s, r->lb_compute_s, r->lb_link_s,
                r->step_s > 0 ? tokens / r->step_s : 0,
                (unsigned long long)r->bytes.h2d, (unsigned long long)r->bytes.d2h,
                (unsigned long long)r->bytes.ssd_read, (unsigned long long)r->bytes.ssd_write, r->plan_s,
                r->verify_s, r->n_host, r->n_groups, r->n_host ? r->dev_step_s : r->step_s);
    else {
        jprintf("\"over_device_memory\":%s,\"plan_s\":%.4f,", r->over_device ? "true" : "false", r->plan_s);
        json_str("error", r->why);
        jprintf("}\n");
    }
}

/* Splits a comma-separated list in place; returns the count. */
static int split(char *s, const char **out) {
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(s, ",", &save); tok && n < MAX_LIST; tok = strtok_r(NULL, ",", &save)) out[n++] = tok;
    return n;
}

static int usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--quick] [--configs A,B] [--hw A,B]\n"
            "       [--policies tide,static-layer,lru,checkpoint-layer,zero-offload]\n"
            "       [--batch B] [--seq T] [--accum N] [--ssds N] [--host-mem BYTES]\n"
            "       [--largest PCT] [--json FILE]\n"
            "defaults: llama-7b,llama-13b,llama-65b on a100-80g,h100-80g,v100-32g, batch 8,\n"
            "seq 2048, accum 4; --quick: llama-7b on h100-80g only.\n"
            "A config is NAME, NAME:LAYERS or NAME:LAYERSxHIDDEN (scaled, e.g. llama-65b:96x12288).\n"
            "--ssds, --host-mem: the profiles' SSD count and host memory (e.g. 512G).\n"
            "--largest PCT: instead of the tables, the largest layer count of each config's\n"
            "shape whose tide step at the device-memory budget reaches PCT%% of ideal\n",
            argv0);
    return 2;
}

static const char *fmt_gb(uint64_t n, char *buf, size_t len) {
    snprintf(buf, len, "%.1f", n / 1e9);
    return buf;
}

/* A built-in config by name, or scaled: NAME:LAYERS or NAME:LAYERSxHIDDEN.
 * A new hidden size keeps the head size (heads = hidden / head size), the
 * query to key/value head ratio, and the MLP's ratio to the hidden size
 * (intermediate rounded to a multiple of 256). Returns TIDE_OK, or
 * TIDE_E_NOT_FOUND / TIDE_E_INVALID with the context's message set. */
static tide_status config_scaled(const char *spec, tide_llama_config *cfg) {
    char name[64];
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    snprintf(name, sizeof name, "%.*s", (int)TIDE_MIN(n, sizeof name - 1), spec);
    tide_status st = tide_llama_config_named(ctx, name, cfg);
    if (st || !colon) return st;
    char *end;
    long layers = strtol(colon + 1, &end, 10), hidden = cfg->hidden_size;
    if (*end == 'x') hidden = strtol(end + 1, &end, 10);
    if (*end || layers < 1 || layers > 4096 || hidden < 64 || hidden > 65536)
        return tide_err(ctx, TIDE_E_INVALID, "config '%s': expected NAME:LAYERS or NAME:LAYERSxHIDDEN", spec);
    int head = cfg->hidden_size / cfg->num_attention_heads;
    int group = cfg->num_attention_heads / cfg->num_key_value_heads;
    if (hidden % head || (hidden / head) % group)
        return tide_err(ctx, TIDE_E_INVALID, "config '%s': hidden %ld is not a whole number of %d-wide heads "
                        "in groups of %d", spec, hidden, head, group);
    double ffn = (double)cfg->intermediate_size / cfg->hidden_size;
    cfg->intermediate_size = (int)(ffn * (double)hidden / 256 + 0.5) * 256;
    cfg->num_attention_heads = (int)hidden / head;
    cfg->num_key_value_heads = cfg->num_attention_heads / group;
    cfg->hidden_size = (int)hidden;
    cfg->num_hidden_layers = (int)layers;
    snprintf(cfg->name, sizeof cfg->name, "%s", spec);
    return tide_llama_config_check(ctx, cfg);
}

/* Bytes from "N", "NK", "NM", "NG" or "NT" (binary units, an optional
 * "iB" or "B" after the letter); 0 when malformed. */
static uint64_t parse_bytes(const char *s) {
    char *end;
    double v = strtod(s, &end), mul = 1;
    const char *units = "KMGT", *u = *end ? strchr(units, *end & ~0x20) : NULL;
    if (u) {
        for (const char *k = units; k <= u; k++) mul *= 1024;
        end++;
        if (*end == 'i') end++;
        if (*end == 'B') end++;
    }
    return end == s || *end || !(v > 0) || v * mul >= 1.8e19 ? 0 : (uint64_t)(v * mul);
}

static tide_llama_train_opts step_opts(int batch, int seq, int accum) {
    return (tide_llama_train_opts){.batch = batch, .seq = seq, .accum = accum, .beta1 = 0.9f, .beta2 = 0.95f,
                                   .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
}

static tide_status build_step(const tide_llama_config *cfg, int batch, int seq, int accum, tide_graph **g) {
    tide_llama_train_opts o = step_opts(batch, seq, accum);
    return tide_llama_build_train(ctx, cfg, &o, g);
}

/* Loads a profile and applies --ssds / --host-mem (0: as shipped); label
 * names what was changed. */
static tide_status load_hw(const char *name, int ssds, uint64_t host_mem, tide_hw *hw, char *label, size_t len) {
    tide_status st = tide_hw_load(ctx, name, hw);
    if (st) return st;
    if (ssds > 0) hw->ssd_count = ssds;
    if (host_mem) hw->host_mem_bytes = host_mem;
    if (ssds > 0 || host_mem)
        snprintf(label, len, "%s, %d SSD%s, %.0f GiB host", name, hw->ssd_count, hw->ssd_count == 1 ? "" : "s",
                 hw->host_mem_bytes / GIB);
    else snprintf(label, len, "%s", name);
    return TIDE_OK;
}

/* One layer count of a --largest search. */
typedef struct probe {
    int layers;
    uint64_t params;
    double pct;
    setup s;
    row r;
} probe;

/* Plans cfg with `layers` layers on hw at the device-memory budget (or the
 * unconstrained peak when smaller) with the tide policy. Returns 0, or -1
 * when the step could not be set up (message printed). */
static int largest_probe(const tide_llama_config *base, const char *spec, const tide_hw *hw, const char *label,
                         int layers, int batch, int seq, int accum, probe *out) {
    tide_llama_config cfg = *base;
    cfg.num_hidden_layers = layers;
    *out = (probe){.layers = layers, .params = tide_llama_config_params(&cfg)};
    setup *s = &out->s;
    *s = (setup){.config = spec, .hw_name = label, .hw = *hw, .cfg = cfg, .step = step_opts(batch, seq, accum)};
    fprintf(stderr, "bench: %s with %d layers (%.1fB parameters) on %s ...\n", spec, layers, out->params / 1e9, label);
    tide_status st = build_step(&cfg, batch, seq, accum, &s->g);
    if (!st && !(s->peak = tide_plan_unconstrained_peak(ctx, s->g, &s->hw, 2))) st = TIDE_E_INFEASIBLE;
    if (!st) st = tide_plan_ideal_step(ctx, s->g, &s->hw, &s->ideal_s);
    if (st) {
        snprintf(out->r.why, sizeof out->r.why, "%s", tide_ctx_last_error(ctx));
        fprintf(stderr, "bench: %s, %d layers: %s\n", spec, layers, out->r.why);
        if (st != TIDE_E_INFEASIBLE) failures++;
        tide_graph_free(s->g);
        s->g = NULL;
        return -1;
    }
    s->base = TIDE_MIN(s->peak, s->hw.device_mem_bytes);
    out->r = plan_one(s, TIDE_POLICY_TIDE, s->base);
    out->pct = out->r.ok && out->r.step_s > 0 ? 100 * s->ideal_s / out->r.step_s : 0;
    const row *r = &out->r;
    jprintf("{\"bench\":\"train_plan\",\"table\":\"largest\",\"config\":\"%s\",\"hw\":\"%s\",\"ssd_count\":%d,"
            "\"host_mem_bytes\":%llu,\"layers\":%d,\"hidden\":%d,\"params\":%llu,\"budget_bytes\":%llu,"
            "\"feasible\":%s,\"pct_of_ideal\":%.2f,\"x_lower_bound\":%.4f,\"step_s\":%.4f,\"ideal_step_s\":%.4f,"
            "\"lb_compute_s\":%.4f,\"lb_link_s\":%.4f,\"step_bytes_h2d\":%llu,\"step_bytes_d2h\":%llu,"
            "\"step_bytes_ssd_read\":%llu,\"step_bytes_ssd_write\":%llu,\"plan_s\":%.4f}\n",
            spec, s->hw.name, s->hw.ssd_count, (unsigned long long)s->hw.host_mem_bytes, layers, cfg.hidden_size,
            (unsigned long long)out->params, (unsigned long long)s->base, r->ok ? "true" : "false", out->pct,
            r->lb_s > 0 ? r->makespan_s / r->lb_s : 0, r->step_s, s->ideal_s, r->lb_compute_s, r->lb_link_s,
            (unsigned long long)r->bytes.h2d, (unsigned long long)r->bytes.d2h,
            (unsigned long long)r->bytes.ssd_read, (unsigned long long)r->bytes.ssd_write, r->plan_s);
    tide_graph_free(s->g);
    s->g = NULL;
    return 0;
}

/* SSD busy seconds of one step's bytes: the drives serve reads and writes
 * alike (cost.c), striped over ssd_count. */
static double ssd_busy_s(const tide_hw *hw, const tide_step_bytes *b) {
    double k = hw->ssd_count > 0 ? hw->ssd_count : 1;
    return hw->ssd_read_bw <= 0 || hw->ssd_write_bw <= 0 ? 0
           : (double)b->ssd_read / (hw->ssd_read_bw * k) + (double)b->ssd_write / (hw->ssd_write_bw * k);
}

/* --largest: per config shape and profile, the largest layer count whose
 * tide step at the device-memory budget reaches pct% of ideal. The count
 * doubles from the config's own until it falls short (or 1024), halves
 * until it reaches the target (or 1), then bisects to within 2% (the
 * figure is not smooth enough in the layer count for more); a count that
 * cannot be set up counts as short. Prints every count tried, then the
 * result. */
static void largest_search(const char *spec, const tide_hw *hw, const char *label, double pct, int batch, int seq,
                           int accum) {
    tide_llama_config cfg;
    if (config_scaled(spec, &cfg)) {
        fprintf(stderr, "bench: %s: %s\n", spec, tide_ctx_last_error(ctx));
        failures++;
        return;
    }
    enum { MAX_PROBES = 40 };
    probe pr[MAX_PROBES];
    int n = 0, good = -1, bad = -1; /* indices: the largest passing, the smallest failing */
#define TRY(L)                                                                                              \
    do {                                                                                                    \
        probe *p_ = &pr[n++];                                                                               \
        bool ok_ = !largest_probe(&cfg, spec, hw, label, (L), batch, seq, accum, p_) && p_->pct >= pct;     \
        if (ok_ && (good < 0 || p_->layers > pr[good].layers)) good = n - 1;                                \
        if (!ok_ && (bad < 0 || p_->layers < pr[bad].layers)) bad = n - 1;                                  \
    } while (0)
    TRY(cfg.num_hidden_layers);
    while (n < MAX_PROBES && bad < 0 && pr[good].layers < 1024) TRY(TIDE_MIN(pr[good].layers * 2, 1024));
    while (n < MAX_PROBES && good < 0 && pr[bad].layers > 1) TRY(pr[bad].layers / 2);
    while (n < MAX_PROBES && good >= 0 && bad >= 0 && pr[bad].layers - pr[good].layers > 1 &&
           (pr[bad].layers - pr[good].layers) * 50 > pr[good].layers)
        TRY((pr[good].layers + pr[bad].layers) / 2);
#undef TRY
    printf("\n## Largest model: %s's shape (hidden %d, intermediate %d, %d heads, %d kv heads) on %s, "
           "tide at the device-memory budget; target %.0f%% of ideal\n\n",
           spec, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads, label, pct);
    printf("| layers | parameters | budget GiB | %% of ideal | x LB | step s | ideal step s | LB compute s | "
           "LB link s | SSD busy s/step | h2d GB | d2h GB | SSD read GB | SSD write GB | plan s |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < n; k++) {
        const probe *p = &pr[k];
        const row *r = &p->r;
        char b1[32], b2[32], b3[32], b4[32];
        if (!r->ok) {
            printf("| %d | %.1fB | %.2f | no plan: %s | | | | | | | | | | | %.3f |\n", p->layers, p->params / 1e9,
                   p->s.base / GIB, r->why, r->plan_s);
            continue;
        }
        printf("| %d | %.1fB | %.2f | %.1f | %.3f | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %s | %s | %s | %.3f |\n",
               p->layers, p->params / 1e9, p->s.base / GIB, p->pct, r->makespan_s / r->lb_s, r->step_s, p->s.ideal_s,
               r->lb_compute_s / 2, r->lb_link_s / 2, ssd_busy_s(&p->s.hw, &r->bytes),
               fmt_gb(r->bytes.h2d, b1, sizeof b1), fmt_gb(r->bytes.d2h, b2, sizeof b2),
               fmt_gb(r->bytes.ssd_read, b3, sizeof b3), fmt_gb(r->bytes.ssd_write, b4, sizeof b4), r->plan_s);
    }
    if (good >= 0)
        printf("\nlargest: %d layers, %.1fB parameters, at %.1f%% of ideal (%s)\n", pr[good].layers,
               pr[good].params / 1e9, pr[good].pct,
               bad < 0 ? "the search's cap of 1024 layers" : pr[bad].layers == pr[good].layers + 1
                   ? "one layer more falls short" : "to within 2%: more layers were not tried");
    else printf("\nlargest: none; even %d layer%s falls short of %.0f%%\n", pr[bad].layers,
                pr[bad].layers == 1 ? "" : "s", pct);
    printf("(LB terms per step, half the two-step bound; the LB counts no spills of what host memory cannot hold, "
           "so where the SSD busy time exceeds the LB it is the drives that bound the step)\n");
}

int main(int argc, char **argv) {
    bool quick = false;
    char *configs_arg = NULL, *hw_arg = NULL, *pol_arg = NULL;
    int batch = 8, seq = 2048, accum = 4, ssds = 0;
    uint64_t host_mem = 0;
    double largest = 0;
    for (int i = 1; i < argc; i++) {
        bool more = i + 1 < argc;
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--configs") && more) configs_arg = argv[++i];
        else if (!strcmp(argv[i], "--hw") && more) hw_arg = argv[++i];
        else if (!strcmp(argv[i], "--policies") && more) pol_arg = argv[++i];
        else if (!strcmp(argv[i], "--batch") && more) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && more) seq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--accum") && more) accum = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ssds") && more) {
            if ((ssds = atoi(argv[++i])) < 1) return usage(argv[0]);
        } else if (!strcmp(argv[i], "--host-mem") && more) {
            if (!(host_mem = parse_bytes(argv[++i]))) return usage(argv[0]);
        } else if (!strcmp(argv[i], "--largest") && more) {
            if (!((largest = atof(argv[++i])) > 0 && largest <= 100)) return usage(argv[0]);
        }
        else if (!strcmp(argv[i], "--json") && more) {
            if (!(json_file = fopen(argv[++i], "w"))) {
                perror(argv[i]);
                return 1;
            }
        } else return usage(argv[0]);
    }
    if (batch < 1 || seq < 1 || accum < 1) return usage(argv[0]);
    char def_configs[] = "llama-7b,llama-13b,llama-65b", def_hw[] = "a100-80g,h100-80g,v100-32g",
         def_pol[] = "tide,static-layer,lru,checkpoint-layer,zero-offload",
         q_configs[] = "llama-7b", q_hw[] = "h100-80g";
    const char *configs[MAX_LIST], *hws[MAX_LIST], *pol_names[MAX_LIST];
    int nc = split(configs_arg ? configs_arg : quick ? q_configs : def_configs, configs);
    int nh = split(hw_arg ? hw_arg : quick ? q_hw : def_hw, hws);
    int np = split(pol_arg ? pol_arg : def_pol, pol_names);
    tide_policy pols[MAX_LIST];
    for (int k = 0; k < np; k++) {
        int found = -1;
        for (int q = 0; q < TIDE_POLICY_COUNT; q++)
            if (!strcmp(pol_names[k], tide_policy_name((tide_policy)q))) found = q;
        if (found < 0) return usage(argv[0]);
        pols[k] = (tide_policy)found;
    }
    if (!(ctx = tide_ctx_new())) return 1;
    if (largest > 0) {
        for (int ci = 0; ci < nc; ci++)
            for (int hi = 0; hi < nh; hi++) {
                tide_hw hw;
                char label[96];
                if (load_hw(hws[hi], ssds, host_mem, &hw, label, sizeof label)) {
                    fprintf(stderr, "bench: %s: %s\n", hws[hi], tide_ctx_last_error(ctx));
                    return 1;
                }
                largest_search(configs[ci], &hw, label, largest, batch, seq, accum);
            }
        printf("\nsummary: failures (unverified plans, errors): %d\n", failures);
        if (json_file) fclose(json_file);
        tide_ctx_free(ctx);
        return failures ? 1 : 0;
    }

    int n_setups = nc * nh;
    setup *S = calloc((size_t)n_setups, sizeof *S);
    row *R = calloc((size_t)n_setups * N_BUDGETS * np, sizeof *R);
    double *min_search_s = calloc((size_t)n_setups * np, sizeof *min_search_s);
    if (!S || !R || !min_search_s) return 1;
#define ROW(si, bi, pk) R[((size_t)(si) * N_BUDGETS + (bi)) * np + (pk)]

    for (int ci = 0; ci < nc; ci++) {
        tide_llama_config cfg;
        tide_graph *g = NULL;
        if (config_scaled(configs[ci], &cfg) || build_step(&cfg, batch, seq, accum, &g)) {
            fprintf(stderr, "bench: %s: %s\n", configs[ci], tide_ctx_last_error(ctx));
            return 1;
        }
        for (int hi = 0; hi < nh; hi++) {
            int si = ci * nh + hi;
            setup *s = &S[si];
            s->config = configs[ci];
            s->hw_name = s->label;
            s->g = g;
            s->cfg = cfg;
            s->step = step_opts(batch, seq, accum);
            if (load_hw(hws[hi], ssds, host_mem, &s->hw, s->label, sizeof s->label)) {
                fprintf(stderr, "bench: %s: %s\n", hws[hi], tide_ctx_last_error(ctx));
                return 1;
            }
            fprintf(stderr, "bench: %s on %s ...\n", s->config, s->hw_name);
            if (!(s->peak = tide_plan_unconstrained_peak(ctx, g, &s->hw, 2)) ||
                tide_plan_ideal_step(ctx, g, &s->hw, &s->ideal_s)) {
                fprintf(stderr, "bench: %s on %s: %s\n", s->config, s->hw_name, tide_ctx_last_error(ctx));
                return 1;
            }
            s->base = TIDE_MIN(s->peak, s->hw.device_mem_bytes);
            for (int t = 0; t < g->n_tensors; t++) s->cls[tide_train_tensor_class(g, t)] += g->tensors[t].nbytes;
            for (int bi = 0; bi < N_BUDGETS; bi++)
                for (int pk = 0; pk < np; pk++) {
                    row *r = &ROW(si, bi, pk);
                    uint64_t b = (uint64_t)((double)s->base * budget_frac[bi]);
                    if (budget_frac[bi] == 0) {
                        tide_plan_opts po = {.policy = pols[pk], .n_iter = 2, .hw = &s->hw};
                        double t0 = tide_now();
                        tide_status st = tide_plan_min_budget(ctx, g, &po, &b);
                        min_search_s[si * np + pk] = tide_now() - t0;
                        if (st) {
                            *r = (row){0};
                            snprintf(r->why, sizeof r->why, "%s", tide_ctx_last_error(ctx));
                            print_json_row(s, bi, pols[pk], r, batch, seq, accum);
                            continue;
                        }
                        if (b > s->hw.device_mem_bytes) {
                            *r = (row){.budget = b, .over_device = true};
                            snprintf(r->why, sizeof r->why, "the minimum %.2f GiB is more than the device's %.2f GiB",
                                     b / GIB, s->hw.device_mem_bytes / GIB);
                            print_json_row(s, bi, pols[pk], r, batch, seq, accum);
                            continue;
                        }
                    }
                    *r = plan_one(s, pols[pk], b);
                    print_json_row(s, bi, pols[pk], r, batch, seq, accum);
                }
        }
    }

    /* llama-2-70b: planning time of a steady step pair on h100-80g; the last
     * row is tide's minimum budget (its search time reported apart) */
    struct {
        const char *label;
        double frac;
        row r;
    } big[] = {{"100% (device memory)", 1.0, {0}}, {"25%", 0.25, {0}}, {"10%", 0.10, {0}}, {"min", 0, {0}}};
    int n_big = quick ? 1 : 4;
    setup bs = {.config = "llama-2-70b", .hw_name = "h100-80g"};
    double big_build_s = 0, big_worst = 0, big_min_search_s = 0;
    {
        tide_llama_config cfg;
        double t0 = tide_now();
        bs.step = step_opts(batch, seq, accum);
        if (tide_llama_config_named(ctx, bs.config, &cfg) || build_step(&cfg, batch, seq, accum, &bs.g) ||
            tide_hw_load(ctx, bs.hw_name, &bs.hw)) {
            fprintf(stderr, "bench: llama-2-70b: %s\n", tide_ctx_last_error(ctx));
            return 1;
        }
        big_build_s = tide_now() - t0;
        bs.cfg = cfg;
        fprintf(stderr, "bench: llama-2-70b on h100-80g ...\n");
        if (!(bs.peak = tide_plan_unconstrained_peak(ctx, bs.g, &bs.hw, 2)) ||
            tide_plan_ideal_step(ctx, bs.g, &bs.hw, &bs.ideal_s)) {
            fprintf(stderr, "bench: llama-2-70b: %s\n", tide_ctx_last_error(ctx));
            return 1;
        }
        bs.base = TIDE_MIN(bs.peak, bs.hw.device_mem_bytes);
        for (int k = 0; k < n_big; k++) {
            uint64_t b = (uint64_t)((double)bs.base * big[k].frac);
            if (big[k].frac == 0) {
                tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 2, .hw = &bs.hw};
                double t1 = tide_now();
                if (tide_plan_min_budget(ctx, bs.g, &po, &b)) {
                    fprintf(stderr, "bench: llama-2-70b minimum: %s\n", tide_ctx_last_error(ctx));
                    failures++;
                    break;
                }
                big_min_search_s = tide_now() - t1;
            }
            big[k].r = plan_one(&bs, TIDE_POLICY_TIDE, b);
            if (big[k].r.plan_s > big_worst) big_worst = big[k].r.plan_s;
            jprintf("{\"bench\":\"train_plan\",\"table\":\"plan_time\",\"config\":\"llama-2-70b\",\"hw\":\"h100-80g\","
                    "\"batch\":%d,\"seq\":%d,\"accum\":%d,\"budget\":\"%s\",\"budget_bytes\":%llu,"
                    "\"feasible\":%s,\"n_ops\":%d,\"n_instructions\":%d,\"plan_s\":%.4f,\"verify_s\":%.4f,"
                    "\"x_lower_bound\":%.4f,\"step_s\":%.4f,\"ideal_step_s\":%.4f,\"step_bytes_h2d\":%llu,"
                    "\"step_bytes_d2h\":%llu,\"step_bytes_ssd_read\":%llu,\"step_bytes_ssd_write\":%llu}\n",
                    batch, seq, accum, big[k].label, (unsigned long long)big[k].r.budget,
                    big[k].r.ok ? "true" : "false", bs.g->n_ops, big[k].r.n_ins, big[k].r.plan_s, big[k].r.verify_s,
                    big[k].r.lb_s > 0 ? big[k].r.makespan_s / big[k].r.lb_s : 0, big[k].r.step_s, bs.ideal_s,
                    (unsigned long long)big[k].r.bytes.h2d, (unsigned long long)big[k].r.bytes.d2h,
                    (unsigned long long)big[k].r.bytes.ssd_read, (unsigned long long)big[k].r.bytes.ssd_write);
        }
    }

    /* ---- tables ---- */
    char b1[32], b2[32], b3[32], b4[32];
    printf("\n## Training step: batch %d x seq %d x accum %d (%d tokens), two steps planned as a steady state\n\n",
           batch, seq, accum, batch * seq * accum);
    printf("| model | hw | unconstrained peak GiB | device GiB | budgets are %% of | weights GiB | masters GiB | "
           "moments GiB | gradients GiB | ideal step s |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < n_setups; si++) {
        const setup *s = &S[si];
        printf("| %s | %s | %.1f | %.1f | %s | %.1f | %.1f | %.1f | %.1f | %.2f |\n", s->config, s->hw_name,
               s->peak / GIB, s->hw.device_mem_bytes / GIB,
               s->peak > s->hw.device_mem_bytes ? "device memory (peak is larger)" : "unconstrained peak",
               s->cls[TIDE_TRAIN_PARAM] / GIB, s->cls[TIDE_TRAIN_MASTER] / GIB, s->cls[TIDE_TRAIN_MOMENT] / GIB,
               s->cls[TIDE_TRAIN_GRAD] / GIB, s->ideal_s);
    }

    printf("\n## Table 1: predicted steady step per policy and budget (bytes per link per step in GB)\n\n");
    printf("| model | hw | budget | GiB | policy | x LB | %% of ideal | step s | ideal step s | tokens/s | "
           "h2d GB | d2h GB | SSD read GB | SSD write GB | plan s | AdamW on CPU | all-device AdamW step s |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    double worst_pct_xlb = 0;
    int slower = 0;
    for (int si = 0; si < n_setups; si++) {
        const setup *s = &S[si];
        for (int bi = 0; bi < N_BUDGETS; bi++)
            for (int pk = 0; pk < np; pk++) {
                const row *r = &ROW(si, bi, pk);
                char label[48];
                if (budget_frac[bi] > 0)
                    snprintf(label, sizeof label, "%.0f%%%s", budget_frac[bi] * 100,
                             s->peak > s->hw.device_mem_bytes ? " (capped)" : "");
                else snprintf(label, sizeof label, "min (own)");
                if (r->tile_level > 0) { /* tide planned row tiles */
                    size_t n = strlen(label);
                    snprintf(label + n, sizeof label - n, ", tiled %d", r->tile_level);
                }
                if (!r->ok) {
                    printf("| %s | %s | %s | %s | %s | infeasible: %s | | | | | | | | | %s | | |\n", s->config,
                           s->hw_name, label, r->budget ? (snprintf(b2, sizeof b2, "%.2f", r->budget / GIB), b2) : "",
                           tide_policy_name(pols[pk]), r->why,
                           r->plan_s > 0 ? (snprintf(b1, sizeof b1, "%.3f", r->plan_s), b1) : "");
                    continue;
                }
                double tokens = (double)batch * seq * accum;
                char adam[32] = "", devs[32] = "";
                if (r->n_groups) snprintf(adam, sizeof adam, "%d/%d", r->n_host, r->n_groups);
                if (r->n_host && r->dev_step_s > 0)
                    snprintf(devs, sizeof devs, "%.2f (%.2fx)", r->dev_step_s, r->dev_step_s / r->step_s);
                printf("| %s | %s | %s | %.2f | %s | %.3f | %.1f | %.2f | %.2f | %.0f | %s | %s | %s | %s | %.3f | %s | %s |\n",
                       s->config, s->hw_name, label, r->budget / GIB, tide_policy_name(pols[pk]),
                       r->makespan_s / r->lb_s, 100 * s->ideal_s / r->step_s, r->step_s, s->ideal_s,
                       tokens / r->step_s, fmt_gb(r->bytes.h2d, b1, sizeof b1), fmt_gb(r->bytes.d2h, b2, sizeof b2),
                       fmt_gb(r->bytes.ssd_read, b3, sizeof b3), fmt_gb(r->bytes.ssd_write, b4, sizeof b4),
                       r->plan_s, adam, devs);
                if (pols[pk] == TIDE_POLICY_TIDE && budget_frac[bi] > 0)
                    worst_pct_xlb = TIDE_MAX(worst_pct_xlb, r->makespan_s / r->lb_s);
                /* tide against each baseline that plans the same budget */
                if (pols[pk] != TIDE_POLICY_TIDE && budget_frac[bi] > 0)
                    for (int q = 0; q < np; q++)
                        if (pols[q] == TIDE_POLICY_TIDE && ROW(si, bi, q).ok &&
                            ROW(si, bi, q).step_s > r->step_s * 1.0005)
                            slower++;
            }
    }

    /* tide over zero-offload, budget by budget */
    int zk = -1, tk = -1, zo_rows = 0, zo_missed = 0;
    for (int pk = 0; pk < np; pk++) {
        if (pols[pk] == TIDE_POLICY_ZERO_OFFLOAD) zk = pk;
        if (pols[pk] == TIDE_POLICY_TIDE) tk = pk;
    }
    if (zk >= 0 && tk >= 0) {
        printf("\n## Table 1b: tide over zero-offload (steady step s; target: 1.5x or more at 25%% and below)\n\n");
        printf("| model | hw | budget | GiB | tide step s | zero-offload step s | tide speed-up | target |\n");
        printf("|---|---|---|---|---|---|---|---|\n");
        for (int si = 0; si < n_setups; si++)
            for (int bi = 0; bi < N_BUDGETS - 1; bi++) {
                const row *t = &ROW(si, bi, tk), *z = &ROW(si, bi, zk);
                if (!t->ok || !z->ok) {
                    printf("| %s | %s | %.0f%% | %.2f | %s | %s | | |\n", S[si].config, S[si].hw_name,
                           budget_frac[bi] * 100, t->budget / GIB,
                           t->ok ? (snprintf(b1, sizeof b1, "%.2f", t->step_s), b1) : "no plan",
                           z->ok ? (snprintf(b2, sizeof b2, "%.2f", z->step_s), b2) : "no plan");
                    continue;
                }
                double x = z->step_s / t->step_s;
                bool target = budget_frac[bi] <= 0.25;
                zo_rows += target;
                zo_missed += target && x < 1.5;
                printf("| %s | %s | %.0f%% | %.2f | %.2f | %.2f | %.2fx | %s |\n", S[si].config, S[si].hw_name,
                       budget_frac[bi] * 100, t->budget / GIB, t->step_s, z->step_s, x,
                       !target ? "" : x >= 1.5 ? "met" : "missed");
            }
        printf("\n(tide at or above 1.5x zero-offload on %d of %d rows at 25%% and below)\n\n", zo_rows - zo_missed,
               zo_rows);
        for (int si = 0; si < n_setups; si++)
            for (int bi = 0; bi < N_BUDGETS - 1; bi++) {
                const row *t = &ROW(si, bi, tk), *z = &ROW(si, bi, zk);
                if (t->ok && z->ok)
                    jprintf("{\"bench\":\"train_plan\",\"table\":\"tide_over_zero_offload\",\"config\":\"%s\","
                            "\"hw\":\"%s\",\"budget_frac\":%.2f,\"tide_step_s\":%.4f,\"zero_offload_step_s\":%.4f,"
                            "\"speedup\":%.4f}\n", S[si].config, S[si].hw.name, budget_frac[bi], t->step_s, z->step_s,
                            z->step_s / t->step_s);
            }
    }

    if (tk >= 0) {
        printf("\n## Table 1c: tide's speed-up over each baseline at the same budget (baseline step / tide step; at "
               "min, each policy at its own minimum, given when it differs from tide's)\n\n"
               "| model | hw | budget | GiB | tide %% of ideal | tide x LB |");
        for (int pk = 0; pk < np; pk++)
            if (pk != tk) printf(" over %s |", tide_policy_name(pols[pk]));
        printf("\n|---|---|---|---|---|---|");
        for (int pk = 0; pk < np; pk++)
            if (pk != tk) printf("---|");
        printf("\n");
        for (int si = 0; si < n_setups; si++)
            for (int bi = 0; bi < N_BUDGETS; bi++) {
                const row *t = &ROW(si, bi, tk);
                char label[32] = "min";
                if (budget_frac[bi] > 0) snprintf(label, sizeof label, "%.0f%%", budget_frac[bi] * 100);
                if (t->tile_level > 0) {
                    size_t n = strlen(label);
                    snprintf(label + n, sizeof label - n, ", tiled %d", t->tile_level);
                }
                if (!t->ok)
                    printf("| %s | %s | %s | %.2f | no plan | |", S[si].config, S[si].hw_name, label, t->budget / GIB);
                else printf("| %s | %s | %s | %.2f | %.1f | %.3f |", S[si].config, S[si].hw_name, label,
                            t->budget / GIB, 100 * S[si].ideal_s / t->step_s, t->makespan_s / t->lb_s);
                for (int pk = 0; pk < np; pk++) {
                    if (pk == tk) continue;
                    const row *r = &ROW(si, bi, pk);
                    if (!r->ok) printf(" no plan |");
                    else if (!t->ok) printf(" |");
                    else if (r->budget != t->budget)
                        printf(" %.2fx (own min %.2f GiB) |", r->step_s / t->step_s, r->budget / GIB);
                    else printf(" %.2fx |", r->step_s / t->step_s);
                }
                printf("\n");
            }
    }

    printf("\n## Table 2: minimum budget per policy (GiB; search time s)\n\n| model | hw |");
    for (int pk = 0; pk < np; pk++) printf(" %s min |", tide_policy_name(pols[pk]));
    printf("\n|---|---|");
    for (int pk = 0; pk < np; pk++) printf("---|");
    printf("\n");
    for (int si = 0; si < n_setups; si++) {
        printf("| %s | %s |", S[si].config, S[si].hw_name);
        for (int pk = 0; pk < np; pk++) {
            const row *r = &ROW(si, N_BUDGETS - 1, pk);
            double t = min_search_s[si * np + pk];
            if (r->ok) printf(" %.2f (%.2f s) |", r->budget / GIB, t);
            else if (r->over_device)
                printf(" %.1f: above the device's %.0f (%.2f s) |", r->budget / GIB, S[si].hw.device_mem_bytes / GIB, t);
            else printf(" no plan (%.2f s) |", t);
        }
        printf("\n");
    }

    /* Table 2b: tide's minimum with row tiles (tide_train_tiling, as `tide
     * plan --train --budget min` finds it) against the untiled step's and
     * zero-offload's (untiled: ZeRO-Offload does not tile) */
    if (tk >= 0) {
        printf("\n## Table 2b: training minimum budget with row tiles (GiB): tide tiled against the untiled step "
               "and zero-offload\n\n| model | hw | tide untiled | tide tiled (level: sequences per tile) | "
               "zero-offload | zero-offload / tide tiled | tide tiled, every AdamW on the CPU | zero-offload / that | "
               "tide step at each tiled minimum: %% of ideal | search s |\n|---|---|---|---|---|---|---|---|---|---|\n");
        for (int si = 0; si < n_setups; si++) {
            setup *s = &S[si];
            tide_llama_config cfg;
            if (config_scaled(s->config, &cfg)) continue;
            double t0 = tide_now();
            uint64_t m[2] = {0, 0};
            int lvl[2] = {-1, -1}, seqs[2] = {0, 0};
            tide_graph *tg[2] = {NULL, NULL};
            for (int h = 0; h < 2; h++) {
                tide_llama_train_opts o = {.batch = batch, .seq = seq, .accum = accum, .beta1 = 0.9f,
                                           .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
                tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 2, .hw = &s->hw};
                tide_graph *g = NULL;
                if (tide_train_tiling(ctx, &cfg, &o, &po, h == 1, 0, 0, &g, &lvl[h], &m[h])) {
                    fprintf(stderr, "bench: %s on %s: tiled minimum: %s\n", s->config, s->hw_name,
                            tide_ctx_last_error(ctx));
                    failures++;
                    continue;
                }
                seqs[h] = o.tile_seqs ? o.tile_seqs : batch;
                tg[h] = g;
            }
            double search_s = tide_now() - t0;
            row at[2] = {{0}, {0}};
            char b5[32], b6[32];
            for (int h = 0; h < 2; h++)
                if (tg[h]) { /* tide's step at each tiled minimum (tiling and updates placed by the plan) */
                    tide_graph_free(tg[h]);
                    at[h] = plan_one(s, TIDE_POLICY_TIDE, m[h]);
                }
            const row *un = &ROW(si, N_BUDGETS - 1, tk), *z = zk >= 0 ? &ROW(si, N_BUDGETS - 1, zk) : NULL;
            printf("| %s | %s | %s | %.2f (%d: %d) | %s | %s | %.2f (%d: %d) | %s | %s | %.1f |\n", s->config,
                   s->hw_name, un->budget ? (snprintf(b1, sizeof b1, "%.2f", un->budget / GIB), b1) : "-",
                   m[0] / GIB, lvl[0], seqs[0], z && z->budget ? (snprintf(b2, sizeof b2, "%.2f", z->budget / GIB), b2) : "-",
                   z && z->budget && m[0] ? (snprintf(b3, sizeof b3, "%.2fx", (double)z->budget / m[0]), b3) : "-",
                   m[1] / GIB, lvl[1], seqs[1],
                   z && z->budget && m[1] ? (snprintf(b4, sizeof b4, "%.2fx", (double)z->budget / m[1]), b4) : "-",
                   at[0].ok && at[1].ok ? (snprintf(b5, sizeof b5, "%.1f / %.1f", 100 * s->ideal_s / at[0].step_s,
                                                    100 * s->ideal_s / at[1].step_s), b5)
                   : at[0].ok ? (snprintf(b6, sizeof b6, "%.1f / no plan", 100 * s->ideal_s / at[0].step_s), b6)
                              : "no plan",
                   search_s);
            jprintf("{\"bench\":\"train_plan\",\"table\":\"tiled_min\",\"config\":\"%s\",\"hw\":\"%s\","
                    "\"untiled_min_bytes\":%llu,\"tiled_min_bytes\":%llu,\"tiled_level\":%d,\"tile_seqs\":%d,"
                    "\"tiled_min_host_updates_bytes\":%llu,\"tiled_level_host_updates\":%d,"
                    "\"zero_offload_min_bytes\":%llu,\"step_at_tiled_min_s\":%.4f,\"step_at_tiled_min_host_updates_s\":%.4f,"
                    "\"ideal_step_s\":%.4f}\n",
                    s->config, s->hw.name, (unsigned long long)un->budget, (unsigned long long)m[0], lvl[0],
                    seqs[0], (unsigned long long)m[1], lvl[1], z ? (unsigned long long)z->budget : 0ULL,
                    at[0].ok ? at[0].step_s : 0, at[1].ok ? at[1].step_s : 0, s->ideal_s);
        }
    }

    printf("\n## Table 3: planning time of a llama-2-70b training step on h100-80g (batch %d x seq %d x accum %d, "
           "two steps; target < 60 s)\n\n", batch, seq, accum);
    printf("| budget | GiB | ops per step | instructions | plan s | verify s | x LB | step s | %% of ideal | h2d GB | "
           "d2h GB | SSD read GB | SSD write GB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < n_big; k++) {
        const row *r = &big[k].r;
        if (r->ok)
            printf("| %s | %.2f | %d | %d | %.3f | %.3f | %.3f | %.1f | %.1f | %s | %s | %s | %s |\n", big[k].label,
                   r->budget / GIB, bs.g->n_ops, r->n_ins, r->plan_s, r->verify_s, r->makespan_s / r->lb_s, r->step_s,
                   100 * bs.ideal_s / r->step_s, fmt_gb(r->bytes.h2d, b1, sizeof b1), fmt_gb(r->bytes.d2h, b2, sizeof b2),
                   fmt_gb(r->bytes.ssd_read, b3, sizeof b3), fmt_gb(r->bytes.ssd_write, b4, sizeof b4));
        else printf("| %s | %.2f | %d | infeasible: %s | %.3f | | | | | | | | |\n", big[k].label, r->budget / GIB, bs.g->n_ops,
                    r->why, r->plan_s);
    }
    printf("\n(unconstrained peak %.1f GiB, host memory of the profile %.1f GiB; ideal step %.1f s; graph build %.3f s "
           "and the minimum's search %.2f s not counted in plan s. The lower bound counts no spills: where the state "
           "and kept activations exceed the host memory, the SSD traffic makes x LB large)\n",
           bs.peak / GIB, bs.hw.host_mem_bytes / GIB, bs.ideal_s, big_build_s, big_min_search_s);

    bool big_ok = big_worst < PLAN_S_TARGET && big[0].r.ok;
    printf("\nsummary: worst tide x lower bound over the percentage rows %.3f; rows where tide's step is slower than "
           "a baseline's at the same budget: %d; llama-2-70b step planned in at most %.3f s (target < 60 s: %s); "
           "failures (unverified plans, errors): %d\n",
           worst_pct_xlb, slower, big_worst, big_ok ? "met" : "MISSED", failures);
    jprintf("{\"bench\":\"train_plan\",\"table\":\"summary\",\"worst_tide_x_lower_bound\":%.4f,\"tide_slower_rows\":%d,"
            "\"llama_2_70b_plan_s\":%.4f,\"plan_time_target_met\":%s,\"failures\":%d}\n",
            worst_pct_xlb, slower, big_worst, big_ok ? "true" : "false", failures);

    for (int ci = 0; ci < nc; ci++) tide_graph_free(S[ci * nh].g);
    tide_graph_free(bs.g);
    free(S);
    free(R);
    free(min_search_s);
    if (json_file) fclose(json_file);
    tide_ctx_free(ctx);
    return failures || !big_ok ? 1 : 0;
}
