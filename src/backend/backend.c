/*
 * backend.c - backend selection at run time: one binary runs with or without a
 * GPU. AUTO takes CUDA when the build has it and a GPU answers, else the CPU.
 */
#include "backend/backend.h"

tide_status tide_backend_new(tide_ctx *ctx, tide_backend_kind kind, tide_backend **out) {
    *out = NULL;
    switch (kind) {
    case TIDE_BACKEND_AUTO:
#ifdef TIDE_HAVE_CUDA
        if (tide_cuda_backend_new(ctx, out) == TIDE_OK) return TIDE_OK;
        tide_err_clear(ctx);
#endif
        return tide_cpu_backend_new(ctx, out);
    case TIDE_BACKEND_CPU:
        return tide_cpu_backend_new(ctx, out);
    case TIDE_BACKEND_CUDA:
#ifdef TIDE_HAVE_CUDA
        return tide_cuda_backend_new(ctx, out);
#else
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "this build of tide has no CUDA backend "
                        "(configure with nvcc available and -DTIDE_CUDA=ON)");
#endif
    }
    return tide_err(ctx, TIDE_E_INVALID, "unknown backend kind %d", (int)kind);
}

void tide_backend_free(tide_backend *be) {
    if (be) be->vt->destroy(be);
}

const char *tide_backend_name(const tide_backend *be) { return be->vt->name; }
