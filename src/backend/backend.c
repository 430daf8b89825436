/*
 * backend.c - backend selection at run time: one binary runs with or without a
 * GPU. AUTO takes CUDA when the build has it and a GPU answers, else the CPU.
 * A GPU that answers but cannot be used (no kernels for its architecture, no
 * memory left for the backend's streams, a driver error) is an error under
 * AUTO too, naming the cause: falling back to the CPU would leave a user
 * who has a GPU running hundreds of times slower without knowing why.
 *
 * Matmul mode AUTO is FAST on CUDA (tensor cores) and on a CPU that
 * multiplies bf16 natively (AVX512_BF16: about twice the f32 kernels' rate
 * at prefill and half the bytes per weight at decode, the precision of a
 * bf16 PyTorch model); F32 on other CPUs, where FAST would run the f32
 * kernels anyway.
 */
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "net/comm.h"

#include <stdio.h>
#include <string.h>

tide_status tide_backend_new(tide_ctx *ctx, tide_backend_kind kind, tide_backend **out) {
    *out = NULL;
    switch (kind) {
    case TIDE_BACKEND_AUTO:
#ifdef TIDE_HAVE_CUDA
    {
        tide_status st = tide_cuda_backend_new(ctx, out);
        if (st == TIDE_OK) return TIDE_OK;
        if (st != TIDE_E_NO_DEVICE) {
            char why[TIDE_ERRMSG_MAX];
            snprintf(why, sizeof why, "%s", tide_ctx_last_error(ctx));
            return tide_err(ctx, st, "%s; the GPU is present but unusable (the cpu backend runs without it)", why);
        }
        tide_err_clear(ctx);
    }
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

#ifdef TIDE_HAVE_NCCL
tide_status tide_nccl_attach(tide_comm *c, tide_backend *be, tide_ctx *ctx);
bool tide_comm_nccl_available(void) { return true; }
#else
bool tide_comm_nccl_available(void) { return false; }
#endif

tide_status tide_backend_comm_attach(tide_backend *be, tide_comm *c, tide_ctx *ctx) {
    /* host memory: MPI carries it; or device collectives already attached */
    if (be->vt->device_is_host || tide_comm_get_dev(c, NULL)) return TIDE_OK;
#ifdef TIDE_HAVE_NCCL
    if (be->kind == TIDE_BACKEND_CUDA) return tide_nccl_attach(c, be, ctx);
#endif
    return tide_err(ctx, TIDE_E_UNSUPPORTED, "data-parallel ranks on the %s backend need its collectives on device "
                    "memory (NCCL), and this tide was built without NCCL (CMake found no nccl.h and libnccl with "
                    "the CUDA toolkit and MPI): run the ranks on the CPU backend (--backend cpu)", be->vt->name);
}

void tide_backend_free(tide_backend *be) {
    if (be) be->vt->destroy(be);
}

const char *tide_backend_name(const tide_backend *be) { return be->vt->name; }

const char *tide_backend_kernels(const tide_backend *be) {
    return be->vt->kernels ? be->vt->kernels((tide_backend *)be) : be->vt->name;
}

tide_status tide_backend_set_matmul(tide_backend *be, tide_matmul_mode mode) {
    switch (mode) {
    case TIDE_MATMUL_AUTO:
        be->matmul = be->kind == TIDE_BACKEND_CUDA || tk_matmul_fast_native(TIDE_BF16) ? TIDE_MATMUL_FAST
                                                                                     : TIDE_MATMUL_F32;
        return TIDE_OK;
    case TIDE_MATMUL_F32:
        be->matmul = mode;
        return TIDE_OK;
    case TIDE_MATMUL_FAST:
        be->matmul = mode;
        return TIDE_OK;
    }
    return tide_err(be->ctx, TIDE_E_INVALID, "unknown matmul mode %d", (int)mode);
}

tide_matmul_mode tide_backend_matmul(const tide_backend *be) { return be->matmul; }

const char *tide_matmul_name(tide_matmul_mode mode) {
    switch (mode) {
    case TIDE_MATMUL_AUTO: return "auto";
    case TIDE_MATMUL_F32: return "f32";
    case TIDE_MATMUL_FAST: return "fast";
    }
    return NULL;
}

tide_status tide_matmul_parse(tide_ctx *ctx, const char *s, tide_matmul_mode *out) {
    static const tide_matmul_mode all[] = {TIDE_MATMUL_AUTO, TIDE_MATMUL_F32, TIDE_MATMUL_FAST};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(s, tide_matmul_name(all[i]))) {
            *out = all[i];
            return TIDE_OK;
        }
    return ctx ? tide_err(ctx, TIDE_E_INVALID, "unknown matmul mode '%s' (auto, f32 or fast)", s ? s : "")
               : TIDE_E_INVALID;
}
