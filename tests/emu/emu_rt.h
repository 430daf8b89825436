/*
 * emu_rt.h - what the emulated CUDA runtime (cuda_rt_emu.cpp, compiled
 * against the toolkit's headers) offers the emulated kernels
 * (cuda_kern_emu.cpp, compiled against tests/emu/stub): the two files see
 * different declarations of the CUDA types, so they meet only here, in
 * terms both agree on (a stream is a `struct CUstream_st *` in both; a
 * status is returned as an int holding a cudaError_t value).
 */
#ifndef TIDE_EMU_RT_H
#define TIDE_EMU_RT_H

#include <cstddef>
#include <functional>

struct CUstream_st;

namespace emu_rt {

/* Queues work on stream s (null: the legacy default stream) to run on the
 * emulated device's thread; `kernel` marks a kernel launch (the unit that
 * TIDE_EMU_FAIL=kernel:N counts). Returns 0, or the device's sticky error
 * (the work is then dropped). */
int enqueue(CUstream_st *s, std::function<void()> &&work, bool kernel);

/* Whether [p, p + n) lies inside one device allocation. */
bool is_device(const void *p, size_t n);

/* Waits until everything queued on s has run: 0, or the sticky error. */
int synchronize(CUstream_st *s);

/* The calling thread's last error (the device's sticky error, if it has
 * one), cleared when `clear` and not sticky; set_error records one. Shared
 * by the runtime calls and the kernels' launchers, as in CUDA. */
int get_error(bool clear);
void set_error(int e);

/* The device's dynamic shared memory opt-in limit (cudaDeviceProp's
 * sharedMemPerBlockOptin), which the kernels' emulation enforces. */
size_t optin_limit();

} // namespace emu_rt

#endif
