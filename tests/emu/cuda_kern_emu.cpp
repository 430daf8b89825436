/*
 * cuda_kern_emu.cpp - the CUDA backend's kernels and launchers for the
 * emulated CUDA runtime (cuda_rt_emu.cpp): the current .cu files of
 * src/backend/cuda (forward kernels, the fast mode's rounding, the training
 * kernels, the kernels for quantized weights), rewritten by extract.cmake with their extern "C" kept,
 * so that the launchers (tcu_*) are the C functions cuda_backend.c calls.
 * Their launches, copies and memsets go to the emulated device's streams
 * (cuda_emu.h's hooks) instead of running at once.
 *
 * Each kernel runs under the emulation's random schedule (threads and
 * blocks shuffled), seeded by TIDE_EMU_SEED (default 1).
 */
#include "tide.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_quant.h"
#include "backend/cuda/cuda_train.h"

#include "cuda_emu.h"
#include "emu_rt.h"

namespace emu {
#include "cuda_kernels.inc"
#include "cuda_gemm.inc"
#include "cuda_train.inc"
#include "cuda_quant.inc"
} // namespace emu

namespace {

cudaError_t hook_enqueue(cudaStream_t s, std::function<void()> &&work, bool kernel) {
    return (cudaError_t)emu_rt::enqueue(s, std::move(work), kernel);
}
cudaError_t hook_sync(cudaStream_t s) { return (cudaError_t)emu_rt::synchronize(s); }
cudaError_t hook_get_error(bool clear) { return (cudaError_t)emu_rt::get_error(clear); }
void hook_set_error(cudaError_t e) { emu_rt::set_error((int)e); }

const bool installed = [] {
    emu::hooks.enqueue = hook_enqueue;
    emu::hooks.is_device = emu_rt::is_device;
    emu::hooks.synchronize = hook_sync;
    emu::hooks.get_error = hook_get_error;
    emu::hooks.set_error = hook_set_error;
    emu::optin_limit = emu_rt::optin_limit();
    emu::sched.order = 2;
    const char *seed = getenv("TIDE_EMU_SEED");
    emu::sched.seed = seed && *seed ? strtoull(seed, nullptr, 0) : 1;
    return true;
}();

} // namespace
