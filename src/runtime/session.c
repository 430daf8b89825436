/*
 * session.c - the resident profile and plan, the offloaded profile and the
 * budget a model and a trainer share (runtime/session.h).
 */
#include "runtime/session.h"
#include "probe/probe.h"
#include "runtime/runner.h"

const tide_hw *tide_session_resident_hw(void) {
    static const tide_hw hw = {
        .name = "resident", .device_mem_bytes = UINT64_C(1) << 40,
        .flops = {1e13, 1e13, 1e13, 1e13}, .matmul_efficiency = 1, .mem_bw = 1e11,
        .h2d_bw = 1e10, .d2h_bw = 1e10, .host_mem_bytes = UINT64_C(1) << 40,
    };
    return &hw;
}

tide_status tide_session_check_offload(tide_ctx *ctx, const tide_offload_opts *o) {
    if (o->budget_kind == TIDE_BUDGET_FRACTION && !(o->fraction > 0 && o->fraction <= 1))
        return tide_err(ctx, TIDE_E_INVALID, "budget fraction %g is not in (0, 1]", o->fraction);
    if (o->budget_kind == TIDE_BUDGET_BYTES && !o->bytes)
        return tide_err(ctx, TIDE_E_INVALID, "a budget of 0 bytes");
    return TIDE_OK;
}

tide_status tide_session_hw(tide_ctx *ctx, tide_backend *be, const char *hw_path, const char *ssd_dirs,
                            uint32_t blocks, tide_hw *hw) {
    tide_status st = hw_path ? tide_hw_load(ctx, hw_path, hw)
                             /* a quick measurement of this machine, so predictions mean something */
                             : tide_probe_backend_blocks(ctx, be, ssd_dirs, 1.0, NULL, blocks, hw);
    if (st) return st;
    if (!be->vt->device_is_host && be->matmul == TIDE_MATMUL_F32) {
        /* 16-bit weights are widened and multiplied at the f32 rate */
        for (int d = 0; d < TIDE_DTYPE_COUNT; d++)
            if (d == TIDE_F16 || d == TIDE_BF16) hw->flops[d] = TIDE_MIN(hw->flops[d], hw->flops[TIDE_F32]);
    }
    return TIDE_OK;
}

tide_status tide_session_plan_resident(tide_ctx *ctx, const tide_backend *be, const tide_graph *g,
                                       const uint64_t *warm_off, uint64_t warm_region, tide_plan **out) {
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = tide_session_resident_hw(),
                         .host_addressable = be->vt->device_is_host, .shared_scratch = true};
    if (warm_off) {
        po.warm_off = warm_off;
        po.warm_region = warm_region;
    }
    uint64_t peak = 0;
    tide_status st = tide_plan_peak_unbounded(ctx, g, &po, &peak);
    if (st) return st;
    po.device_budget = po.warm_region + peak + TIDE_PLAN_ALIGN;
    if ((st = tide_plan_make(ctx, g, &po, out))) return st;
    /* what it uses is all it needs: the plan holds no byte above its peak
     * (the warm region is reserved whole) */
    uint64_t used = TIDE_MAX((*out)->stats.peak_device_bytes, po.warm_region);
    (*out)->device_budget = TIDE_MAX(used, (uint64_t)TIDE_PLAN_ALIGN);
    return TIDE_OK;
}

tide_status tide_backend_auto_budget(tide_backend *be, uint64_t *bytes) {
    uint64_t fr = 0, tot = 0;
    if (!be->vt->mem_info)
        return tide_err(be->ctx, TIDE_E_UNSUPPORTED, "--budget auto reads a GPU's free memory; the %s backend has "
                        "none", tide_backend_name(be));
    /* the device's free memory less a margin for the runtime's own
     * allocations (cuBLAS workspaces, kernels, streams) */
    tide_status st = be->vt->mem_info(be, &fr, &tot);
    if (st) return st;
    uint64_t margin = TIDE_AUTO_MARGIN(tot);
    if (fr <= margin)
        return tide_err(be->ctx, TIDE_E_NOMEM, "--budget auto: the device has %llu bytes free, no more than the "
                        "%llu-byte margin kept for the runtime", (unsigned long long)fr, (unsigned long long)margin);
    *bytes = fr - margin;
    return TIDE_OK;
}

tide_status tide_session_budget(tide_ctx *ctx, tide_backend *be, const tide_offload_opts *o, const tide_hw *hw,
                                const tide_graph *g, const char *what, tide_session_min_fn min, void *user,
                                uint64_t *out) {
    uint64_t peak = tide_plan_unconstrained_peak(ctx, g, hw, 1);
    if (!peak)
        return tide_err(ctx, TIDE_E_INVALID, "cannot size the unconstrained %s: %s", what, tide_ctx_last_error(ctx));
    uint64_t b = 0;
    tide_status st = TIDE_OK;
    switch (o->budget_kind) {
    case TIDE_BUDGET_BYTES: b = o->bytes; break;
    case TIDE_BUDGET_FRACTION: b = (uint64_t)((double)peak * o->fraction); break;
    case TIDE_BUDGET_AUTO:
        if (!be->vt->mem_info) {
            b = TIDE_MIN(peak, hw->device_mem_bytes / 10 * 9);
            break;
        }
        if ((st = tide_backend_auto_budget(be, &b))) {
            if (st == TIDE_E_NOMEM) return tide_err(ctx, st, "%s", tide_ctx_last_error(be->ctx));
            return tide_err(ctx, st, "--budget auto: cannot read the device's free memory: %s",
                            tide_ctx_last_error(tide_backend_queue_ctx(be, NULL)));
        }
        b = TIDE_MIN(peak, b);
        break;
    case TIDE_BUDGET_MIN:
        if ((st = min(user, &b))) return st;
        break;
    default: return tide_err(ctx, TIDE_E_INVALID, "no budget");
    }
    if (o->budget_kind != TIDE_BUDGET_BYTES) b = (b + 255) & ~(uint64_t)255; /* BYTES is exact */
    *out = b;
    return TIDE_OK;
}
