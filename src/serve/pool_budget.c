/*
 * pool_budget.c - the budget `auto` means for a pool (tide.h,
 * tide_pool_auto_budget): a GPU's free memory less the margin the runtime
 * keeps (TIDE_AUTO_MARGIN, runtime/runner.h), as a model's
 * TIDE_BUDGET_AUTO leaves it; a pool is one budget for every model, so it is
 * read once, when the pool is made.
 */
#include "backend/backend.h"
#include "core/core.h"
#include "runtime/session.h"

tide_status tide_pool_auto_budget(tide_ctx *ctx, tide_backend *be, uint64_t *out) {
    if (!be || !out) return tide_err(ctx, TIDE_E_INVALID, "tide_pool_auto_budget: NULL argument");
    *out = 0;
    uint64_t b = 0;
    /* the same reading and margin as a model's --budget auto (src/runtime/session.c) */
    tide_status st = tide_backend_auto_budget(be, &b);
    if (st == TIDE_E_NOMEM) /* no more free than the margin: no budget can be made */
        return tide_err(ctx, TIDE_E_INFEASIBLE, "%s", tide_ctx_last_error(be->ctx));
    if (st == TIDE_E_UNSUPPORTED) return tide_err(ctx, st, "%s", tide_ctx_last_error(be->ctx));
    if (st) return tide_err(ctx, st, "reading the device's free memory: %s", tide_ctx_last_error(be->ctx));
    *out = b & ~(uint64_t)255;
    return TIDE_OK;
}
