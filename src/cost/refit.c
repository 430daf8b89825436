/*
 * refit.c - the cost model refitted from a measured run (refit.h), as
 * TERAIO estimates lifetimes from the first iterations: the executor's
 * measured instruction times against the cost model's, class by class.
 *
 * A class is what one knob of the profile prices: the device computes of one
 * op kind (op_scale[kind]: matmul-like kinds are priced by FLOPs, element-wise
 * ones by bytes, and a per-kind factor corrects either without knowing
 * which bound it), the host computes (host_flops, host_mem_bw), and each
 * transfer direction (h2d_bw, d2h_bw, ssd_read_bw, ssd_write_bw). Sums of
 * durations, not per-instruction ratios: an instruction whose measured time
 * is mostly noise weighs by its time, not by its count. The sums follow the
 * instruction order, so the result does not depend on anything but the
 * inputs.
 */
#include "cost/refit.h"

#include <math.h>
#include <string.h>

const char *tide_refit_link_name(tide_refit_link l) {
    static const char *const names[] = {"h2d", "d2h", "ssd read", "ssd write", "host compute"};
    return (unsigned)l < TIDE_REFIT_LINK_COUNT ? names[l] : "?";
}

/* The class of instruction in: an op kind (>= 0), a link (-1 - link), or
 * INT32_MIN (a DROP: no time). */
static int class_of(const tide_graph *g, const tide_ins *in) {
    switch (in->kind) {
    case TIDE_INS_COMPUTE:
        if (in->place == TIDE_PLACE_HOST) return -1 - TIDE_REFIT_HOST;
        return (int)g->ops[in->op].kind;
    case TIDE_INS_LOAD: return -1 - (in->src == TIDE_TIER_SSD ? TIDE_REFIT_SSD_READ : TIDE_REFIT_H2D);
    case TIDE_INS_STORE: return -1 - (in->dst == TIDE_TIER_SSD ? TIDE_REFIT_SSD_WRITE : TIDE_REFIT_D2H);
    case TIDE_INS_MOVE: return -1 - (in->dst == TIDE_TIER_SSD ? TIDE_REFIT_SSD_WRITE : TIDE_REFIT_SSD_READ);
    default: return INT32_MIN;
    }
}

/* The bandwidth that makes a transfer class's predicted sum its measured
 * one, latencies kept (refit.h). */
static double refit_bw(double bw, const tide_refit_class *c, double latency_s) {
    double lat = latency_s * c->n;
    if (c->measured_s > lat && c->predicted_s > lat) return bw * (c->predicted_s - lat) / (c->measured_s - lat);
    return bw / c->ratio;
}

/* Adds `runs` runs of plan p, measured as `measured` (one run's timeline),
 * into r's class sums, and runs x its span (last end less first start) into
 * *span. */
static tide_status add_run(const tide_plan *p, const tide_sim_event *measured, const tide_hw *hw, int runs,
                           tide_refit *r, double *span) {
    if (!measured) return tide_err(p->ctx, TIDE_E_INVALID, "refit: no measured timeline");
    double first = INFINITY, last = -INFINITY;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_sim_event *ev = &measured[i];
        if (ev->ins != i)
            return tide_err(p->ctx, TIDE_E_INVALID, "refit: event %d of the timeline is instruction %d's", i, ev->ins);
        int c = class_of(p->g, &p->ins[i]);
        if (c == INT32_MIN) continue;
        tide_refit_class *k = c >= 0 ? &r->op[c] : &r->link[-1 - c];
        double d = ev->end_s > ev->start_s ? ev->end_s - ev->start_s : 0;
        k->n += runs;
        k->measured_s += runs * d;
        k->predicted_s += runs * tide_cost_ins(hw, p->g, &p->ins[i], p->host_addressable, NULL);
        first = fmin(first, ev->start_s);
        last = fmax(last, ev->end_s);
    }
    if (last > first) *span += runs * (last - first);
    return TIDE_OK;
}

tide_status tide_hw_refit(const tide_plan *p, const tide_sim_event *measured, const tide_hw *hw, tide_hw *out,
                          tide_refit *info) {
    const int one = 1;
    return tide_hw_refit_runs(1, &p, &measured, &one, hw, out, info);
}

tide_status tide_hw_refit_runs(int n, const tide_plan *const *plans, const tide_sim_event *const *measured,
                               const int *runs, const tide_hw *hw, tide_hw *out, tide_refit *info) {
    tide_refit r;
    memset(&r, 0, sizeof r);
    for (int j = 0; j < n; j++) {
        if (runs[j] < 0) return tide_err(plans[j]->ctx, TIDE_E_INVALID, "refit: %d runs of a plan", runs[j]);
        tide_status st = add_run(plans[j], measured[j], hw, runs[j], &r, &r.span_s);
        if (st) return st;
    }
    r.min_s = fmax(TIDE_REFIT_MIN_S, TIDE_REFIT_MIN_FRACTION * r.span_s);
    /* the classes with too little time of their own, pooled; where even
     * the pool has too little, the whole run */
    double pool_m = 0, pool_p = 0, all_m = 0, all_p = 0;
    for (int k = 0; k < TIDE_OP_COUNT + TIDE_REFIT_LINK_COUNT; k++) {
        const tide_refit_class *c = k < TIDE_OP_COUNT ? &r.op[k] : &r.link[k - TIDE_OP_COUNT];
        all_m += c->measured_s;
        all_p += c->predicted_s;
        if (c->measured_s < r.min_s && c->predicted_s > 0) pool_m += c->measured_s, pool_p += c->predicted_s;
    }
    r.pool_ratio = pool_m >= r.min_s && pool_p > 0 ? pool_m / pool_p : all_m > 0 && all_p > 0 ? all_m / all_p : 0;
    tide_hw h = *hw;
    for (int k = 0; k < TIDE_OP_COUNT; k++) {
        tide_refit_class *c = &r.op[k];
        if (!(c->predicted_s > 0)) continue;
        c->ratio = c->measured_s >= r.min_s ? c->measured_s / c->predicted_s : r.pool_ratio;
        if (c->ratio > 0) h.op_scale[k] = (hw->op_scale[k] > 0 ? hw->op_scale[k] : 1) * c->ratio;
    }
    for (int l = 0; l < TIDE_REFIT_LINK_COUNT; l++) {
        tide_refit_class *c = &r.link[l];
        if (!(c->predicted_s > 0)) continue;
        bool own = c->measured_s >= r.min_s;
        c->ratio = own ? c->measured_s / c->predicted_s : r.pool_ratio;
        if (!(c->ratio > 0)) continue;
        switch ((tide_refit_link)l) {
        case TIDE_REFIT_H2D:
            h.h2d_bw = own ? refit_bw(hw->h2d_bw, c, hw->link_latency_s) : hw->h2d_bw / c->ratio;
            break;
        case TIDE_REFIT_D2H:
            h.d2h_bw = own ? refit_bw(hw->d2h_bw, c, hw->link_latency_s) : hw->d2h_bw / c->ratio;
            break;
        case TIDE_REFIT_SSD_READ:
            h.ssd_read_bw = own ? refit_bw(hw->ssd_read_bw, c, hw->ssd_latency_s) : hw->ssd_read_bw / c->ratio;
            break;
        case TIDE_REFIT_SSD_WRITE:
            h.ssd_write_bw = own ? refit_bw(hw->ssd_write_bw, c, hw->ssd_latency_s) : hw->ssd_write_bw / c->ratio;
            break;
        case TIDE_REFIT_HOST:
            h.host_flops = (hw->host_flops > 0 ? hw->host_flops : TIDE_HOST_FLOPS_DEFAULT) / c->ratio;
            h.host_mem_bw = (hw->host_mem_bw > 0 ? hw->host_mem_bw : TIDE_HOST_MEM_BW_DEFAULT) / c->ratio;
            break;
        default: break;
        }
    }
    *out = h;
    if (info) *info = r;
    return TIDE_OK;
}

tide_hw tide_hw_scaled(const tide_hw *hw, double f) {
    tide_hw h = *hw;
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) {
        h.flops[d] *= f;
        h.matvec_bw[d] *= f;
    }
    h.mem_bw *= f;
    h.h2d_bw *= f;
    h.d2h_bw *= f;
    h.ssd_read_bw *= f;
    h.ssd_write_bw *= f;
    h.host_flops *= f;
    h.host_mem_bw *= f;
    snprintf(h.name, sizeof h.name, "scaled-%g", f);
    return h;
}
