/*
 * pool_budget.c - the budget `auto` means for a pool (tide.h,
 * tide_pool_auto_budget): a GPU's free memory less the margin the runtime
 * keeps (TIDE_AUTO_MARGIN, runtime/runner.h), as a model's
 * TIDE_BUDGET_AUTO leaves it; a pool is one budget for every model, so it is
 * read once, when the pool is made.
 */
#include "backend/backend.h"
#include "core/core.h"
#include "runtime/runner.h"

tide_status tide_pool_auto_budget(tide_ctx *ctx, tide_backend *be, uint64_t *out) {
    if (!be || !out) return tide_err(ctx, TIDE_E_INVALID, "tide_pool_auto_budget: NULL argument");
    *out = 0;
    if (!be->vt->mem_info)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "an automatic budget reads a GPU's free memory; the %s backend has "
                        "none", tide_backend_name(be));
    uint64_t fr = 0, tot = 0;
    tide_status st = be->vt->mem_info(be, &fr, &tot);
    if (st) return tide_err(ctx, st, "reading the device's free memory: %s", tide_ctx_last_error(be->ctx));
    uint64_t margin = TIDE_AUTO_MARGIN(tot);
    if (fr <= margin)
        return tide_err(ctx, TIDE_E_INFEASIBLE, "the device has %llu bytes free, no more than the %llu-byte margin "
                        "kept for the runtime", (unsigned long long)fr, (unsigned long long)margin);
    *out = (fr - margin) & ~(uint64_t)255;
    return TIDE_OK;
}
