/*
 * api_plan.c - the planning section of tide.h: planning options, plans and
 * their figures, predicted timelines and their traces, the tiling and
 * minimum-budget searches, and planned training steps.
 *
 * Thin wrappers: each function turns the public tide_planner_opts into the
 * planner's tide_plan_opts (planner/planner.h) and calls the planner, the
 * simulator (sim/sim.h), the trace writers (trace/trace.h), the tiling search
 * (runtime/tiling.h) or the training-step planning (train/train_plan.h),
 * passing their status and message up unchanged. The public tide_plan is the
 * planner's own plan (ir/plan.h); tide_timeline and tide_train_plan are
 * defined here. Nothing here plans, checks or simulates by itself.
 */
#include "planner/planner.h"
#include "runtime/tiling.h"
#include "sim/sim.h"
#include "trace/trace.h"
#include "train/optim_place.h"
#include "train/train_plan.h"

#include <string.h>

struct tide_timeline {
    const tide_plan *p;           /* the plan replayed (not owned) */
    tide_sim_result sim;          /* one event per instruction */
    double step_s;                /* tide_plan_steady_step's */
};

struct tide_train_plan {
    tide_ctx *ctx;
    tide_train_planned tp;        /* graph, plan, level, host placement, figures */
    tide_plan_opts po;            /* what tp.p was planned under, its placement included
                                     (host_ops: tp.host_ops; hw: the caller's) */
    double plan_seconds;
};

tide_planner_opts tide_planner_opts_default(void) {
    return (tide_planner_opts){.policy = TIDE_POLICY_TIDE, .n_iter = 1, .tile = TIDE_TILE_AUTO,
                               .optimizer = TIDE_OPTIM_AUTO};
}

/* The planner's options for o, without a host placement. */
static tide_plan_opts plan_opts(const tide_planner_opts *o) {
    return (tide_plan_opts){.policy = o->policy, .device_budget = o->device_budget, .host_budget = o->host_budget,
                            .n_iter = o->n_iter, .hw = o->hw, .weights_on_ssd = o->weights_on_ssd};
}

static tide_status bad_args(tide_ctx *ctx, const char *fn) {
    return tide_err(ctx, TIDE_E_INVALID, "%s: a graph or configuration, options with a hardware profile, and "
                    "somewhere for the result are required", fn);
}

/* Whether o asks for co-offload of an inference graph and its profile has a
 * host side to price it. */
static bool co_offload(const tide_planner_opts *o) {
    return o->host_compute == TIDE_HOST_COMPUTE_AUTO && o->policy == TIDE_POLICY_TIDE && !o->weights_on_ssd &&
           o->hw->host_flops > 0 && o->hw->host_mem_bw > 0;
}

/* The host placement o asks for on g into *host (NULL: none; the caller
 * frees it): every update of a training graph with host_updates, the
 * co-offload search's with host_compute auto. TIDE_OK, TIDE_E_NOMEM, or the
 * search's failure. */
static tide_status host_ops(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o, bool **host) {
    *host = NULL;
    if (o->host_updates) {
        *host = train_optim_all_host(ctx, g);
        if (!*host) return TIDE_E_NOMEM;
        for (int i = 0; i < g->n_ops; i++)
            if ((*host)[i]) return TIDE_OK;
        tide_free(*host); /* no update to place: the co-offload search may */
        *host = NULL;
    }
    if (!co_offload(o)) return TIDE_OK;
    tide_plan_opts po = plan_opts(o);
    tide_host_place_info info;
    return tide_plan_host_place(ctx, g, &po, host, &info);
}

uint64_t tide_planner_peak(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o) {
    if (!g || !o || !o->hw) {
        bad_args(ctx, "tide_planner_peak");
        return 0;
    }
    return tide_plan_unconstrained_peak(ctx, g, o->hw, o->n_iter);
}

tide_status tide_planner_min_budget(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o,
                                    uint64_t *min_budget) {
    if (!g || !o || !o->hw || !min_budget) return bad_args(ctx, "tide_planner_min_budget");
    tide_plan_opts po = plan_opts(o);
    bool *host;
    tide_status st = host_ops(ctx, g, o, &host);
    po.host_ops = host;
    if (!st) st = tide_plan_min_budget(ctx, g, &po, min_budget);
    tide_free(host);
    return st;
}

tide_status tide_planner_max_working_set(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o,
                                         uint64_t *ws) {
    if (!g || !o || !o->hw || !ws) return bad_args(ctx, "tide_planner_max_working_set");
    tide_plan_opts po = plan_opts(o);
    bool *host;
    tide_status st = host_ops(ctx, g, o, &host);
    po.host_ops = host;
    if (!st) st = tide_plan_max_working_set(ctx, g, &po, ws);
    tide_free(host);
    return st;
}

tide_status tide_planner_bounds(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o, tide_bounds *out) {
    if (!g || !o || !o->hw || !out) return bad_args(ctx, "tide_planner_bounds");
    tide_plan_opts po = plan_opts(o);
    bool *host;
    tide_status st = host_ops(ctx, g, o, &host);
    po.host_ops = host;
    if (!st) st = tide_plan_bounds(ctx, g, &po, out);
    tide_free(host);
    return st;
}

tide_status tide_planner_ideal_step(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o, double *step) {
    if (!g || !o || !o->hw || !step) return bad_args(ctx, "tide_planner_ideal_step");
    return tide_plan_ideal_step(ctx, g, o->hw, step);
}

/* ---------------------------------------------------------------- plans */

tide_status tide_plan_new(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o, tide_plan **out) {
    if (!g || !o || !o->hw || !out) return bad_args(ctx, "tide_plan_new");
    *out = NULL;
    tide_plan_opts po = plan_opts(o);
    bool *host;
    tide_status st = host_ops(ctx, g, o, &host);
    po.host_ops = host;
    if (!st) st = tide_plan_make(ctx, g, &po, out); /* the plan keeps no pointer to host */
    tide_free(host);
    return st;
}

void tide_plan_info_get(const tide_plan *p, tide_plan_info *out) {
    const tide_plan_stats *s = &p->stats;
    tide_step_bytes sb = tide_plan_step_bytes(p);
    *out = (tide_plan_info){
        .policy = p->policy, .n_iter = p->n_iter, .n_instructions = p->n_ins, .device_budget = p->device_budget,
        .peak_device_bytes = s->peak_device_bytes, .peak_host_bytes = s->peak_host_bytes,
        .peak_ssd_bytes = s->peak_ssd_bytes, .bytes_h2d = s->bytes_h2d, .bytes_d2h = s->bytes_d2h,
        .bytes_ssd_read = s->bytes_ssd_read, .bytes_ssd_write = s->bytes_ssd_write, .step_bytes_h2d = sb.h2d,
        .step_bytes_d2h = sb.d2h, .step_bytes_ssd_read = sb.ssd_read, .step_bytes_ssd_write = sb.ssd_write,
        .compute_s = s->compute_s, .makespan_s = s->makespan_s, .plan_seconds = s->plan_seconds,
        .ranks = p->ranks,
    };
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (tide_ins_is_collective(in->kind) && in->iter == (p->n_iter >= 2 ? 1 : 0)) out->step_collectives++;
        if (in->kind != TIDE_INS_COMPUTE || in->iter != 0 || in->place != TIDE_PLACE_HOST) continue;
        const tide_op *op = &p->g->ops[in->op];
        out->host_computes++;
        if (op->kind == TIDE_OP_MATMUL) out->host_compute_weight_bytes += p->g->tensors[op->in[1]].nbytes;
    }
}

void tide_plan_net_bytes(const tide_plan *p, const tide_hw *hw, uint64_t *intra, uint64_t *inter) {
    double a = 0, b = 0;
    int iter = p->n_iter >= 2 ? 1 : 0;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (!tide_ins_is_collective(in->kind) || in->iter != iter) continue;
        const tide_op *op = &p->g->ops[in->op];
        int full = op->kind == TIDE_OP_ALL_GATHER ? op->out[0] : op->in[0];
        double x, y;
        tide_cost_collective(hw, (int)op->kind, p->g->tensors[full].nbytes, op->p.ranks, &x, &y);
        a += x;
        b += y;
    }
    *intra = (uint64_t)(a + 0.5);
    *inter = (uint64_t)(b + 0.5);
}

/* ---------------------------------------------------------------- timelines */

tide_status tide_plan_simulate(const tide_plan *p, const tide_hw *hw, tide_timeline **out) {
    if (!p || !hw || !out)
        return tide_err(p ? p->ctx : NULL, TIDE_E_INVALID, "tide_plan_simulate: a plan, a profile and somewhere "
                        "for the timeline are required");
    *out = NULL;
    tide_timeline *t = tide_calloc(1, sizeof *t);
    if (!t) return tide_err(p->ctx, TIDE_E_NOMEM, "out of memory");
    tide_status st = tide_plan_steady_step(p, hw, &t->step_s, &t->sim);
    if (st) {
        tide_free(t);
        return st;
    }
    t->p = p;
    *out = t;
    return TIDE_OK;
}

void tide_timeline_free(tide_timeline *t) {
    if (!t) return;
    tide_sim_result_free(&t->sim);
    tide_free(t);
}

double tide_timeline_makespan(const tide_timeline *t) { return t->sim.makespan_s; }

double tide_timeline_step(const tide_timeline *t) { return t->step_s; }

tide_status tide_plan_write_trace(const tide_plan *p, const tide_timeline *t, const char *json_path,
                                  const char *svg_path) {
    if (!p || !t || t->p != p)
        return tide_err(p ? p->ctx : NULL, TIDE_E_INVALID, "tide_plan_write_trace: a plan and a timeline of it "
                        "are required");
    tide_status st = TIDE_OK;
    if (json_path) st = tide_trace_write(p, t->sim.events, t->sim.n_events, json_path);
    if (!st && svg_path) {
        const tide_sim_event *const timelines[1] = {t->sim.events};
        const char *const labels[1] = {"predicted"};
        st = tide_trace_svg_write(p, timelines, labels, 1, svg_path);
    }
    return st;
}

/* ---------------------------------------------------------------- searches */

tide_status tide_llama_plan(tide_ctx *ctx, const tide_llama_config *cfg, const tide_llama_graph_opts *base,
                            const tide_planner_opts *o, tide_graph **g, int *level, tide_plan **plan) {
    if (!cfg || !base || !o || !o->hw || !g || !level) return bad_args(ctx, "tide_llama_plan");
    *g = NULL;
    if (plan) *plan = NULL;
    tide_plan_opts po = plan_opts(o);
    tide_status st = tide_llama_plan_tiled(ctx, cfg, base, &po, o->tile, g, level, plan, NULL);
    if (st || !plan || !co_offload(o)) return st;
    /* co-offload on the graph the tiling chose (host ops only shrink what
     * the device needs, so it still fits) */
    bool *host = NULL;
    tide_host_place_info info;
    if ((st = tide_plan_host_place(ctx, *g, &po, &host, &info)) || !host) {
        tide_free(host);
        return st;
    }
    po.host_ops = host;
    tide_plan *hp = NULL;
    st = tide_plan_make(ctx, *g, &po, &hp);
    tide_free(host);
    if (st) return st;
    tide_plan_free(*plan);
    *plan = hp;
    return TIDE_OK;
}

tide_status tide_llama_min_budget(tide_ctx *ctx, const tide_llama_config *cfg, const tide_llama_graph_opts *base,
                                  const tide_planner_opts *o, tide_graph **g, int *level, uint64_t *min_budget) {
    if (!cfg || !base || !o || !o->hw || !g || !level || !min_budget) return bad_args(ctx, "tide_llama_min_budget");
    *g = NULL;
    tide_plan_opts po = plan_opts(o);
    return tide_llama_plan_tiled(ctx, cfg, base, &po, o->tile, g, level, NULL, min_budget);
}

tide_status tide_train_min_budget(tide_ctx *ctx, const tide_llama_config *cfg, tide_llama_train_opts *to,
                                  const tide_planner_opts *o, int *level, uint64_t *min_budget) {
    if (!cfg || !to || !o || !o->hw || !level || !min_budget) return bad_args(ctx, "tide_train_min_budget");
    tide_plan_opts po = plan_opts(o);
    tide_graph *g = NULL;
    tide_status st = tide_train_tiling(ctx, cfg, to, &po, o->host_updates, o->tile, 0, &g, level, min_budget);
    tide_graph_free(g);
    return st;
}

/* ---------------------------------------------------------------- optimizer */

static train_optim_mode optim_mode(tide_optim_mode m) {
    switch (m) {
    case TIDE_OPTIM_DEVICE: return TRAIN_OPTIM_DEVICE;
    case TIDE_OPTIM_CPU: return TRAIN_OPTIM_CPU;
    default: return TRAIN_OPTIM_AUTO;
    }
}

const char *tide_optim_mode_name(tide_optim_mode m) { return train_optim_name(optim_mode(m)); }

tide_status tide_optim_mode_parse(tide_ctx *ctx, const char *s, tide_optim_mode *out) {
    train_optim_mode m;
    if (!s || !out || train_optim_parse(s, &m))
        return tide_err(ctx, TIDE_E_INVALID, "optimizer placement '%s' is not auto, device or cpu", s ? s : "");
    *out = m == TRAIN_OPTIM_DEVICE ? TIDE_OPTIM_DEVICE : m == TRAIN_OPTIM_CPU ? TIDE_OPTIM_CPU : TIDE_OPTIM_AUTO;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- training steps */

tide_status tide_train_plan_new(tide_ctx *ctx, const tide_llama_config *cfg, tide_llama_train_opts *to,
                                const tide_planner_opts *o, tide_train_plan **out) {
    if (!cfg || !to || !o || !o->hw || !out) return bad_args(ctx, "tide_train_plan_new");
    *out = NULL;
    tide_train_plan *t = tide_calloc(1, sizeof *t);
    if (!t) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    t->ctx = ctx;
    t->po = plan_opts(o);
    train_optim_mode mode = optim_mode(o->optimizer);
    double t0 = tide_now();
    tide_status st = tide_train_plan_tiled(ctx, cfg, to, &t->po, mode, mode, o->tile, &t->tp);
    t->plan_seconds = tide_now() - t0;
    if (st) {
        tide_free(t);
        return st;
    }
    /* what the kept plan was planned under: its placement, and the
     * zero-offload baseline among the candidates */
    t->po.host_ops = t->tp.host_ops;
    t->po.consider_zero_offload = true;
    *out = t;
    return TIDE_OK;
}

void tide_train_plan_free(tide_train_plan *t) {
    if (!t) return;
    tide_train_planned_free(&t->tp);
    tide_free(t);
}

const tide_graph *tide_train_plan_graph(const tide_train_plan *t) { return t->tp.g; }

const tide_plan *tide_train_plan_get_plan(const tide_train_plan *t) { return t->tp.p; }

tide_status tide_train_plan_max_working_set(const tide_train_plan *t, uint64_t *ws) {
    return tide_plan_max_working_set(t->ctx, t->tp.g, &t->po, ws);
}

tide_status tide_train_plan_bounds(const tide_train_plan *t, tide_bounds *out) {
    return tide_plan_bounds(t->ctx, t->tp.g, &t->po, out);
}

/* Bytes of the activations a micro-batch keeps from its forward for its
 * backward: those of the first micro-batch written before its (first row
 * tile's) loss and read after it, up to the next micro-batch's first loss
 * (row tiles share a loss). 0 without a loss, or when memory is exhausted. */
static uint64_t kept_activations(const tide_graph *g) {
    int ce = -1, next = g->n_ops;
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

void tide_train_plan_info_get(const tide_train_plan *t, tide_train_plan_info *out) {
    const tide_graph *g = t->tp.g;
    const train_optim_choice *oc = &t->tp.oc;
    uint64_t cls[TIDE_TRAIN_CLASS_COUNT] = {0};
    for (int i = 0; i < g->n_tensors; i++) cls[tide_train_tensor_class(g, i)] += g->tensors[i].nbytes;
    *out = (tide_train_plan_info){
        .tile_level = t->tp.level, .optimizer_groups = oc->n_groups, .optimizer_host_groups = oc->n_host,
        .optimizer_host_state_bytes = oc->host_state_bytes, .optimizer_state_bytes = oc->state_bytes,
        .device_optimizer_makespan_s = oc->device_makespan_s, .plans_tried = oc->plans_tried,
        .plan_seconds = t->plan_seconds, .weight_bytes = cls[TIDE_TRAIN_PARAM],
        .master_bytes = cls[TIDE_TRAIN_MASTER], .moment_bytes = cls[TIDE_TRAIN_MOMENT],
        .gradient_bytes = cls[TIDE_TRAIN_GRAD], .kept_activation_bytes = kept_activations(g),
    };
}
