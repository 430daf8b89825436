/*
 * cuda_emu.h - runs the CUDA backend's kernels on the host, so that they are
 * tested on machines without a GPU (CI has none).
 *
 * tests/emu/extract.cmake turns each .cu file of src/backend/cuda into C++
 * (launch syntax, __shared__ declarations: see there); test_cuda_emu.cpp
 * includes the result inside namespace emu, after this header. Everything a
 * kernel or launcher takes from CUDA is defined here in namespace emu, so
 * that unqualified names in the kernels (expf, max, float4, cudaGetLastError)
 * find these definitions before the host's.
 *
 * Execution. A launch runs its blocks one after another; inside a block
 * every CUDA thread is a coroutine with a stack of its own, which runs until
 * it reaches a barrier:
 *   - __syncthreads (and _or, _and, _count) releases when every thread of
 *     the block has arrived;
 *   - a warp operation (__shfl*_sync, __ballot_sync, __any_sync, __all_sync,
 *     __syncwarp) releases when all lanes of the warp have arrived, and only
 *     then exchanges the values.
 * Between barriers the threads run one at a time in an order given by the
 * schedule (emu::sched): in index order, warp by warp from the last one, or
 * at random; blocks go forward, backward or shuffled. A kernel whose result
 * depends on that order (a missing barrier, a read of what another thread
 * writes in the same phase) gives different bits under different schedules,
 * which the test compares. Compared with a GPU:
 *   - lanes of a warp are not in lockstep, as on Volta and later, so code
 *     relying on implicit warp synchronisation fails here as it may there;
 *   - only interleavings at barrier granularity are tried; a race that gives
 *     the same bits under the three orders goes unseen.
 * What would fault or hang on a GPU stops the program with a message naming
 * the kernel, block and thread: a barrier that some threads never reach
 * (they exited, or wait at another one), a full-mask warp operation with a
 * lane missing, a misaligned vector access, a launch the device refuses
 * (block size, more than 48 KiB of shared memory without the opt-in, more
 * than the opt-in limit).
 *
 * Memory. Device buffers (emu::Buffer) are mmap'd between two inaccessible
 * pages and placed against one of them (which one depends on the schedule);
 * the few bytes between the buffer and the other page hold a canary that is
 * checked when the buffer is freed. So reads past one end fault, and writes
 * past either end are found. Shared memory, static and dynamic, is filled
 * before every block with a byte that depends on the schedule (0xff: NaN
 * as float or double, -1 as an integer; 0x7f, 0xcb: huge values of either
 * sign), so reading an element no thread of the block wrote shows up.
 *
 * Arithmetic is the host's, with the semantics the CUDA C++ Programming
 * Guide (appendix "Mathematical Functions") gives the device's:
 *   - + - * / and sqrtf round to nearest on both (nvcc's default
 *     -prec-div=true -prec-sqrt=true), as do the __f*_rn and __d*_rn
 *     intrinsics and fmaf; the test is built with -ffp-contract=off so the
 *     host does not fuse what the source does not. nvcc does contract a plain
 *     a * b + c into an FMA (--fmad=true); the emulation rounds twice there,
 *     so such results may differ from a GPU's in the last bit, which the
 *     tests' tolerances absorb (kernels that must be exact use _rn forms);
 *   - expf, exp, pow, sin, cos, ... are not correctly rounded in CUDA (the
 *     guide bounds them: expf 2 ulp, exp 1 ulp, pow 2 ulp, sin/cos 2 ulp);
 *     the host's libm (glibc: within 1 ulp) stands in for them, and for the
 *     fast intrinsics (__expf, ...) whose device error is larger;
 *   - conversions to f16/bf16 are exact emulations (round to nearest even,
 *     NaN to the canonical NaN 0x7fff, as cvt.rn.f16.f32 / cvt.rn.bf16.f32),
 *     bit-identical to the toolkit's host versions for every f32 input.
 */
#ifndef TIDE_CUDA_EMU_H
#define TIDE_CUDA_EMU_H

#include <cuda_runtime_api.h> /* tests/emu/stub: types only */

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <csignal>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

/* Function qualifiers: every function is an ordinary host function. */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
/* __shared__ is deliberately not defined: extract.cmake rewrites every
 * declaration, and one it does not know must fail to compile. */

namespace emu {

/* ---------------------------------------------------------------- errors */

inline const char *cur_kernel = nullptr; /* the launch in progress, for messages */
inline unsigned cur_block;
inline int cur_thread = -1;

/* An error a GPU would fault or hang on, or a misuse of the emulation: the
 * test cannot go on, so report and exit at once (also from inside a
 * coroutine, where nothing else would unwind properly). */
[[noreturn]] inline void die(const char *fmt, ...) {
    fflush(stdout);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "EMULATION ERROR: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (cur_kernel) fprintf(stderr, "\n  in %s, block %u", cur_kernel, cur_block);
    if (cur_kernel && cur_thread >= 0) fprintf(stderr, ", thread %d", cur_thread);
    fprintf(stderr, "\n");
    fflush(stderr);
    _exit(1);
}

/* ---------------------------------------------------------------- schedule */

/* How a launch is run; the test sets it before each run of a case. order:
 * 0 threads in index order, blocks forward; 1 warp by warp (each warp runs
 * through its warp operations up to a block barrier before the next starts)
 * from the last warp and lane, blocks backward; 2 threads and blocks in a
 * random order from seed. at_end: Buffers end against their guard page
 * (else they start against the one before them). grid_cap > 0 lowers the
 * launchers' grid limits (the *_MAX_GRID macros, see extract.cmake) so that
 * grid-stride loops go round more than once at test sizes. poison: shared
 * memory's fill before every block; the test varies it (0xff: NaN, -1;
 * 0x7f: a huge positive value; 0xcb: a large negative one), so that a read
 * of memory no thread wrote changes the result even where a NaN would be
 * dropped (fmaxf, comparisons). */
struct Schedule {
    int order = 0;
    uint64_t seed = 1;
    bool at_end = false;
    long long grid_cap = 0;
    uint8_t poison = 0xff; /* the byte shared memory is filled with */
};
inline Schedule sched;

inline long long emu_grid_cap(long long v) { return sched.grid_cap > 0 && sched.grid_cap < v ? sched.grid_cap : v; }

/* The largest dynamic shared memory a kernel may opt in to: 99 KiB, the
 * smallest limit among the GPUs the backend supports (sm_86, sm_89, sm_120;
 * sm_80 and sm_90 allow more). Tests lower it to check fallbacks (clearing
 * func_attrs, the opt-ins made on the previous "device"). */
inline size_t optin_limit = 99 * 1024;
inline const size_t default_smem_limit = 48 * 1024;

/* ---------------------------------------------------------------- types */

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline uint3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0};
inline dim3 blockDim, gridDim;

inline void check_align(const void *p, size_t a, const char *what) {
    uintptr_t u = (uintptr_t)p;
    /* opaque to the optimiser, which may otherwise assume that the address
     * of a float4 is aligned, as the language says it is, and drop the test */
    __asm__("" : "+r"(u));
    if (u % a) die("misaligned %s at %p (needs %zu-byte alignment; a GPU faults)", what, p, a);
}

/* Vector types. Copying one from or to memory is the vector load or store,
 * which a GPU only does at its natural alignment: the copy operations check. */
#define EMU_VEC4(T, E)                                                                                           \
    struct alignas(4 * sizeof(E)) T {                                                                             \
        E x, y, z, w;                                                                                             \
        T() = default;                                                                                            \
        T(E a, E b, E c, E d) : x(a), y(b), z(c), w(d) {}                                                         \
        T(const T &o) : x(o.x), y(o.y), z(o.z), w(o.w) { check_align(&o, sizeof(T), #T " load"); }               \
        T &operator=(const T &o) {                                                                                \
            check_align(this, sizeof(T), #T " store");                                                            \
            check_align(&o, sizeof(T), #T " load");                                                               \
            x = o.x, y = o.y, z = o.z, w = o.w;                                                                   \
            return *this;                                                                                         \
        }                                                                                                         \
    };
#define EMU_VEC2(T, E)                                                                                           \
    struct alignas(2 * sizeof(E)) T {                                                                             \
        E x, y;                                                                                                   \
        T() = default;                                                                                            \
        T(E a, E b) : x(a), y(b) {}                                                                               \
        T(const T &o) : x(o.x), y(o.y) { check_align(&o, sizeof(T), #T " load"); }                               \
        T &operator=(const T &o) {                                                                                \
            check_align(this, sizeof(T), #T " store");                                                            \
            check_align(&o, sizeof(T), #T " load");                                                               \
            x = o.x, y = o.y;                                                                                     \
            return *this;                                                                                         \
        }                                                                                                         \
    };
EMU_VEC4(float4, float)
EMU_VEC4(int4, int)
EMU_VEC4(uint4, unsigned)
EMU_VEC2(float2, float)
EMU_VEC2(int2, int)
EMU_VEC2(uint2, unsigned)
EMU_VEC2(double2, double)
#undef EMU_VEC4
#undef EMU_VEC2
inline float4 make_float4(float a, float b, float c, float d) { return float4(a, b, c, d); }
inline int4 make_int4(int a, int b, int c, int d) { return int4(a, b, c, d); }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4(a, b, c, d); }
inline float2 make_float2(float a, float b) { return float2(a, b); }
inline int2 make_int2(int a, int b) { return int2(a, b); }
inline uint2 make_uint2(unsigned a, unsigned b) { return uint2(a, b); }
inline double2 make_double2(double a, double b) { return double2(a, b); }

/* ---------------------------------------------------------------- coroutines */

/* One coroutine per thread index of a block, created on first use and kept:
 * fiber i runs thread i of every block. The first entry goes through
 * makecontext/setcontext, every later switch through the compiler's
 * __builtin_setjmp/__builtin_longjmp: they save only what the compiler needs
 * (frame and stack pointers, resume address; callee-saved registers are
 * spilled around the setjmp), touch no signal mask (no system call per
 * switch) and, unlike _longjmp, are not intercepted by AddressSanitizer,
 * whose interceptor would unpoison the stack being left, as if its frames
 * were abandoned, at the cost of a memset and a sigaltstack call per switch.
 * Under AddressSanitizer each switch is announced instead, so that it knows
 * which stack is in use, and the functions that switch are not instrumented:
 * the instrumentation would call __asan_handle_no_return before the
 * (noreturn) longjmp, with the same cost and effect as the interceptor. */
typedef void *jump_buf[5];
#define EMU_SETJMP(b) __builtin_setjmp(b)
#define EMU_SWITCHES __attribute__((no_sanitize_address))
/* Out of line: GCC wants __builtin_longjmp outside the function that called
 * __builtin_setjmp. */
[[gnu::noinline]] EMU_SWITCHES inline void emu_longjmp(jump_buf b) { __builtin_longjmp(b, 1); }

struct Fiber {
    jump_buf ctx;
    ucontext_t uc;
    char *lo = nullptr; /* usable stack [lo, lo + size) */
    size_t size = 0;
    bool started = false;
    void *fake = nullptr;
};
inline const int max_threads = 1024;
inline Fiber fibers[max_threads];
inline jump_buf sched_ctx;
inline const void *sched_stack_lo; /* the scheduler's (main) stack, learnt on the first switch */
inline size_t sched_stack_size;
inline void *sched_fake;

inline void asan_start(void **fake, const void *lo, size_t size) {
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(fake, lo, size);
#else
    (void)fake, (void)lo, (void)size;
#endif
}
inline void asan_finish(void *fake, const void **old_lo = nullptr, size_t *old_size = nullptr) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, old_lo, old_size);
#else
    (void)fake, (void)old_lo, (void)old_size;
#endif
}

enum : uint8_t { T_READY, T_RUNNING, T_AT_BAR, T_AT_WARP, T_DONE };

struct Warp {
    int lanes;          /* threads in this warp (32 but in a partial last warp) */
    int arrived, phase; /* at the current warp operation; slot set in use */
    int kind;
    uint64_t slot[2][32]; /* values of the operation, alternately: a lane may be in the
                             next operation while others still read this one's */
};

/* The block being run. */
struct Block {
    int n = 0, live = 0, cur = 0;
    uint8_t st[max_threads];
    int bar_arrived = 0, bar_phase = 0, bar_kind = 0, bar_count[2] = {0, 0};
    Warp warp[max_threads / 32];
    uint64_t serial = 0; /* counts blocks: shared memory is refilled when it changes */
};
inline Block blk;

/* The kernel body to run: a trampoline and its argument tuple. */
inline void (*body_fn)(void *);
inline void *body_arg;

inline void yield_thread();

EMU_SWITCHES inline void fiber_entry() {
    asan_finish(nullptr, &sched_stack_lo, &sched_stack_size);
    for (;;) {
        body_fn(body_arg);
        blk.st[blk.cur] = T_DONE;
        blk.live--;
        yield_thread(); /* parked until the next block needs this thread */
    }
}

inline void make_fiber(Fiber &f) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    f.size = 256 * 1024; /* generous: sanitizers enlarge frames */
    char *m = (char *)mmap(nullptr, f.size + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap of a coroutine stack failed");
    mprotect(m, pg, PROT_NONE); /* stack overflow faults */
    f.lo = m + pg;
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.lo;
    f.uc.uc_stack.ss_size = f.size;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, fiber_entry, 0);
}

/* Scheduler side: runs thread i until it blocks or ends. */
EMU_SWITCHES inline void run_thread(int i) {
    Fiber &f = fibers[i];
    blk.cur = i;
    cur_thread = i;
    threadIdx.x = (unsigned)i;
    blk.st[i] = T_RUNNING;
    if (!EMU_SETJMP(sched_ctx)) {
        asan_start(&sched_fake, f.lo, f.size);
        if (!f.started) {
            f.started = true;
            setcontext(&f.uc);
        }
        emu_longjmp(f.ctx);
    }
    asan_finish(sched_fake);
}

/* Thread side: back to the scheduler (the caller has set its state). */
EMU_SWITCHES inline void yield_thread() {
    Fiber &f = fibers[blk.cur];
    if (!EMU_SETJMP(f.ctx)) {
        asan_start(&f.fake, sched_stack_lo, sched_stack_size);
        emu_longjmp(sched_ctx);
    }
    asan_finish(f.fake);
}

/* ---------------------------------------------------------------- barriers */

inline const char *bar_name(int kind) {
    static const char *n[] = {"__syncthreads", "__syncthreads_or", "__syncthreads_and", "__syncthreads_count"};
    return n[kind];
}

/* Block barrier; returns how many threads arrived with pred != 0. */
inline int block_barrier(int kind, int pred) {
    const int ph = blk.bar_phase;
    if (blk.bar_arrived == 0)
        blk.bar_kind = kind;
    else if (blk.bar_kind != kind)
        die("threads of one block wait at different barriers (%s and %s)", bar_name(blk.bar_kind), bar_name(kind));
    blk.bar_count[ph] += pred != 0;
    if (++blk.bar_arrived == blk.n) {
        blk.bar_arrived = 0;
        blk.bar_phase ^= 1;
        blk.bar_count[ph ^ 1] = 0;
        for (int i = 0; i < blk.n; i++)
            if (i != blk.cur) blk.st[i] = T_READY;
    } else {
        blk.st[blk.cur] = T_AT_BAR;
        yield_thread();
    }
    return blk.bar_count[ph];
}

inline void __syncthreads() { block_barrier(0, 0); }
inline int __syncthreads_or(int p) { return block_barrier(1, p) != 0; }
inline int __syncthreads_and(int p) { return block_barrier(2, p) == blk.n; }
inline int __syncthreads_count(int p) { return block_barrier(3, p); }

enum { W_SHFL = 1, W_BALLOT, W_SYNC };

/* Warp operation: publishes v, waits for every lane of the warp, returns the
 * 32 published values. Only the full mask of the warp's lanes is supported
 * (all the kernels use); a warp operation reached by some lanes only is a
 * deadlock here and undefined behaviour on a GPU. */
inline const uint64_t *warp_op(int kind, unsigned mask, uint64_t v) {
    const int wi = blk.cur >> 5, lane = blk.cur & 31;
    Warp &w = blk.warp[wi];
    const unsigned full = w.lanes == 32 ? 0xffffffffu : (1u << w.lanes) - 1;
    if (mask != full)
        die("warp operation with mask %#x in a warp of %d lanes (only the full mask is emulated)", mask, w.lanes);
    const int ph = w.phase;
    if (w.arrived == 0)
        w.kind = kind;
    else if (w.kind != kind)
        die("lanes of warp %d are at different kinds of warp operation (divergence)", wi);
    w.slot[ph][lane] = v;
    if (++w.arrived == w.lanes) {
        w.arrived = 0;
        w.phase ^= 1;
        for (int l = 0; l < w.lanes; l++)
            if (l != lane) blk.st[wi * 32 + l] = T_READY;
    } else {
        blk.st[blk.cur] = T_AT_WARP;
        yield_thread();
    }
    return w.slot[ph];
}

template <class T> inline uint64_t to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && (sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 2),
                  "shuffles move 16, 32 or 64-bit values");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T> inline T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}

inline void check_width(int width) {
    if (width < 1 || width > 32 || (width & (width - 1))) die("shuffle width %d is not a power of two <= 32", width);
}

/* The shuffles, as the programming guide defines them for `width`: lanes in
 * segments of width; a source outside the caller's segment (past it for
 * xor and down, before it for up) returns the caller's own value. */
template <class T> inline T __shfl_sync(unsigned mask, T var, int src, int width = 32) {
    check_width(width);
    const uint64_t *s = warp_op(W_SHFL, mask, to_bits(var));
    const int lane = blk.cur & 31, base = lane & ~(width - 1);
    return from_bits<T>(s[base + (src & (width - 1))]);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    check_width(width);
    const uint64_t *s = warp_op(W_SHFL, mask, to_bits(var));
    const int lane = blk.cur & 31, base = lane & ~(width - 1), src = lane ^ lane_mask;
    return from_bits<T>(src >= base + width || src < 0 || src > 31 ? s[lane] : s[src]);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    check_width(width);
    const uint64_t *s = warp_op(W_SHFL, mask, to_bits(var));
    const int lane = blk.cur & 31, base = lane & ~(width - 1), src = lane + (int)delta;
    return from_bits<T>(src >= base + width ? s[lane] : s[src]);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    check_width(width);
    const uint64_t *s = warp_op(W_SHFL, mask, to_bits(var));
    const int lane = blk.cur & 31, base = lane & ~(width - 1), src = lane - (int)delta;
    return from_bits<T>(src < base ? s[lane] : s[src]);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    const uint64_t *s = warp_op(W_BALLOT, mask, pred != 0);
    unsigned r = 0;
    for (int l = 0; l < blk.warp[blk.cur >> 5].lanes; l++) r |= (unsigned)s[l] << l;
    return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
inline void __syncwarp(unsigned mask = 0xffffffffu) { warp_op(W_SYNC, mask, 0); }
inline void __threadfence() {}
inline void __threadfence_block() {}
[[noreturn]] inline void __trap() { die("__trap()"); }

/* Atomics: threads run one at a time, so a plain read-modify-write is atomic. */
inline int atomicMin(int *p, int v) { int o = *p; *p = std::min(o, v); return o; }
inline int atomicMax(int *p, int v) { int o = *p; *p = std::max(o, v); return o; }
inline unsigned atomicMin(unsigned *p, unsigned v) { unsigned o = *p; *p = std::min(o, v); return o; }
inline unsigned atomicMax(unsigned *p, unsigned v) { unsigned o = *p; *p = std::max(o, v); return o; }
inline int atomicAdd(int *p, int v) { int o = *p; *p = (int)((unsigned)o + (unsigned)v); return o; }
inline unsigned atomicAdd(unsigned *p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
inline float atomicAdd(float *p, float v) { float o = *p; *p = o + v; return o; }
inline int atomicExch(int *p, int v) { int o = *p; *p = v; return o; }
inline int atomicCAS(int *p, int cmp, int v) { int o = *p; if (o == cmp) *p = v; return o; }

template <class T> inline T __ldg(const T *p) { return *p; }

/* ---------------------------------------------------------------- shared memory */

/* Static __shared__ arrays are function statics (one block runs at a time);
 * extract.cmake follows each declaration with a call of this, which refills
 * the array with sched.poison the first time a thread of a new block passes. */
struct SharedVar {
    void *p;
    size_t bytes;
    uint64_t serial;
};
inline std::vector<SharedVar> shared_vars;
inline size_t shared_static_bytes; /* of the launch in progress, seen in its first block */

inline void emu_shared(void *p, size_t bytes) {
    for (SharedVar &v : shared_vars)
        if (v.p == p) {
            if (v.serial != blk.serial) {
                v.serial = blk.serial;
                memset(p, sched.poison, bytes);
                shared_static_bytes += bytes;
            }
            return;
        }
    shared_vars.push_back({p, bytes, blk.serial});
    memset(p, sched.poison, bytes);
    shared_static_bytes += bytes;
}

inline char *dyn_smem; /* extern __shared__ of the launch in progress */
inline void *emu_dyn_smem() { return dyn_smem; }

/* ---------------------------------------------------------------- device memory */

inline const unsigned char canary = 0xa5;

/* A device buffer of `bytes` whose address is `off` mod 16 (vector paths
 * depend on alignment; the test picks it), between two PROT_NONE pages:
 * against the one after it when sched.at_end, else against the one before
 * it (then the first `off` bytes of the page are canary). One thread makes
 * and looks up Buffers: the test's, or with the hooks set the emulated
 * device's (for a launch's shared memory; device allocations are then the
 * runtime's own), so the registry needs no lock. */
struct Buffer {
    char *map = nullptr, *lo = nullptr, *hi = nullptr, *p = nullptr;
    size_t maplen = 0, bytes = 0;
    const char *name;

    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    Buffer(size_t n, unsigned off = 0, const char *what = "buffer") : bytes(n), name(what) {
        const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        size_t body = (n + 32 + pg - 1) / pg * pg;
        maplen = body + 2 * pg;
        map = (char *)mmap(nullptr, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED) die("mmap of %zu bytes failed", maplen);
        mprotect(map, pg, PROT_NONE);
        mprotect(map + pg + body, pg, PROT_NONE);
        lo = map + pg;
        hi = lo + body;
        memset(lo, canary, body);
        off %= 16;
        if (sched.at_end) {
            size_t slack = (32 - n % 16 - off) % 16; /* hi - n - slack == off mod 16 */
            p = hi - n - slack;
        } else {
            p = lo + off;
        }
        registry().push_back(this);
    }
    ~Buffer() {
        check();
        auto &r = registry();
        r.erase(std::find(r.begin(), r.end(), this));
        munmap(map, maplen);
    }
    /* Out-of-bounds writes: the canary around the buffer must be intact. */
    void check() const {
        for (const char *c = lo; c < hi; c++) {
            if (c == p) c += bytes;
            if (c < hi && (unsigned char)*c != canary)
                die("a kernel wrote %td bytes %s %s (%zu bytes)", c < p ? p - c : c - (p + bytes) + 1,
                    c < p ? "before" : "after the end of", name, bytes);
        }
    }
    template <class T> T *as() const { return (T *)p; }
    void upload(const void *src) { memcpy(p, src, bytes); }
    void download(void *dst) const { memcpy(dst, p, bytes); }

    static std::vector<Buffer *> &registry() {
        static std::vector<Buffer *> r;
        return r;
    }
    /* The buffer holding [q, q + n), or null. */
    static const Buffer *find(const void *q, size_t n) {
        for (Buffer *b : registry())
            if ((const char *)q >= b->p && (const char *)q + n <= b->p + b->bytes) return b;
        return nullptr;
    }
};

/* An access to a guard page (a kernel reading or writing past a buffer, or a
 * coroutine overflowing its stack): say where, then stop. Under
 * AddressSanitizer its own report (with a stack trace) is kept instead. */
inline void fault_handler(int sig, siginfo_t *si, void *) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const char *a = (const char *)si->si_addr;
    for (const Buffer *b : Buffer::registry()) {
        if (a >= b->lo - pg && a < b->lo)
            die("invalid access at %p, in the guard page %td bytes before %s (%zu bytes at %p)", (const void *)a,
                b->p - a, b->name, b->bytes, (const void *)b->p);
        if (a >= b->hi && a < b->hi + pg)
            die("invalid access at %p, in the guard page %td bytes after the end of %s (%zu bytes at %p)",
                (const void *)a, a - (b->p + b->bytes) + 1, b->name, b->bytes, (const void *)b->p);
    }
    die("%s at address %p", sig == SIGSEGV ? "invalid memory access" : "bus error", (const void *)a);
}
inline void install_fault_handler() {
#ifndef EMU_ASAN
    static bool done;
    if (done) return;
    done = true;
    static char alt[64 * 1024]; /* the faulting stack may be the one that overflowed */
    stack_t ss = {};
    ss.ss_sp = alt;
    ss.ss_size = sizeof alt;
    sigaltstack(&ss, nullptr);
    struct sigaction sa = {};
    sa.sa_sigaction = fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
#endif
}

/* ---------------------------------------------------------------- streams */

/* Where the launchers' work goes. Unset (test_cuda_emu), a launch, copy or
 * memset runs at once on the calling thread. Set (the emulated CUDA runtime
 * of tests/emu/cuda_rt_emu.cpp), the call is checked at once as the real
 * runtime checks it, and the work is queued on its stream and run later by
 * the emulated device's thread: `enqueue` (kernel: the work is a launch)
 * returns the sticky error of a failed device (the work is then dropped) or
 * cudaSuccess; `is_device` says whether [p, p + n) lies inside one device
 * allocation; a launch whose pointer arguments are not device memory stops
 * the program (a GPU would fault). */
struct StreamHooks {
    cudaError_t (*enqueue)(cudaStream_t s, std::function<void()> &&work, bool kernel) = nullptr;
    bool (*is_device)(const void *p, size_t n) = nullptr;
    cudaError_t (*synchronize)(cudaStream_t s) = nullptr;
    /* the runtime's per-thread last error (and sticky error), which the
     * launchers share with every other runtime call, as on a GPU */
    cudaError_t (*get_error)(bool clear) = nullptr;
    void (*set_error)(cudaError_t e) = nullptr;
};
inline StreamHooks hooks;
/* Serializes what launchers do on the host (launch checks, statistics,
 * opt-ins) when several host threads launch at once (hooks set). */
inline std::mutex host_mu;

inline bool is_device_range(const void *p, size_t n) {
    return hooks.is_device ? hooks.is_device(p, n) : Buffer::find(p, n) != nullptr;
}

/* ---------------------------------------------------------------- runtime API */

/* Per host thread, as the runtime's. */
inline thread_local cudaError_t last_error = cudaSuccess;

inline cudaError_t cudaGetLastError() {
    if (hooks.get_error) return hooks.get_error(true);
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError() { return hooks.get_error ? hooks.get_error(false) : last_error; }
inline void set_last_error(cudaError_t e) {
    if (hooks.set_error)
        hooks.set_error(e);
    else
        last_error = e;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) { return hooks.synchronize ? hooks.synchronize(s) : cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

/* Runs work now, or queues it on s (hooks set); the status of queueing. */
inline cudaError_t run_or_queue(cudaStream_t s, std::function<void()> &&work, bool kernel = false) {
    if (!hooks.enqueue) {
        work();
        return cudaSuccess;
    }
    cudaError_t e = hooks.enqueue(s, std::move(work), kernel);
    if (e != cudaSuccess) set_last_error(e);
    return e;
}

/* Device-to-device copies and memsets must stay inside one device buffer
 * (emu::Buffer), as an out-of-range one would fault; copies between
 * overlapping ranges are undefined in CUDA and refused here. */
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s = nullptr) {
    if (n == 0) return cudaSuccess;
    bool dd = is_device_range(dst, n), sd = is_device_range(src, n);
    bool ok = kind == cudaMemcpyDeviceToDevice ? dd && sd
              : kind == cudaMemcpyHostToDevice ? dd
              : kind == cudaMemcpyDeviceToHost ? sd
              : kind == cudaMemcpyDefault;
    if (!ok) die("cudaMemcpyAsync of %zu bytes (kind %d): a pointer is not in a device buffer of that size", n, kind);
    if ((const char *)dst < (const char *)src + n && (const char *)src < (const char *)dst + n)
        die("cudaMemcpyAsync between overlapping ranges");
    return run_or_queue(s, [=] { memcpy(dst, src, n); });
}
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, n, kind);
}
inline cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s = nullptr) {
    if (n && !is_device_range(dst, n)) die("cudaMemsetAsync of %zu bytes outside any device buffer", n);
    return run_or_queue(s, [=] { memset(dst, v, n); });
}
inline cudaError_t cudaMemset(void *dst, int v, size_t n) { return cudaMemsetAsync(dst, v, n); }

struct FuncAttr {
    const void *k;
    int max_dyn;
};
inline std::vector<FuncAttr> func_attrs;

/* Opting in to more dynamic shared memory: refused above the device's
 * limit (optin_limit), as cudaFuncSetAttribute does. */
template <class F> inline cudaError_t cudaFuncSetAttribute(F *k, cudaFuncAttribute attr, int v) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    std::lock_guard<std::mutex> g(host_mu);
    if (v < 0 || (size_t)v > optin_limit) return cudaErrorInvalidValue;
    for (FuncAttr &a : func_attrs)
        if (a.k == (const void *)k) return a.max_dyn = v, cudaSuccess;
    func_attrs.push_back({(const void *)k, v});
    return cudaSuccess;
}
template <class F> inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, F *) {
    memset(a, 0, sizeof *a);
    a->maxThreadsPerBlock = max_threads;
    return cudaSuccess;
}
inline const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    default: return "error";
    }
}

/* ---------------------------------------------------------------- launches */

struct LaunchCfg {
    unsigned long long grid, block;
    size_t smem;
    cudaStream_t stream;
};
inline unsigned long long dim_of(unsigned long long v) { return v; }
inline unsigned long long dim_of(dim3 d) {
    if (d.y != 1 || d.z != 1) die("a launch with a 2-D or 3-D grid or block (only 1-D is emulated)");
    return d.x;
}
template <class G, class B>
inline LaunchCfg emu_cfg(G g, B b, size_t smem = 0, cudaStream_t s = nullptr) {
    return LaunchCfg{dim_of(g), dim_of(b), smem, s};
}

/* Per kernel (instantiation) launched or tried: what ran. */
struct KernelStat {
    const void *k;
    std::string name;
    long long launches = 0, blocks = 0, threads = 0;
};
inline std::vector<KernelStat> kernel_stats;
inline std::vector<const void *> launch_log; /* kernels launched, in order; tests clear it */

template <class F> struct kernel_args;
template <class... P> struct kernel_args<void (*)(P...)> {
    using tuple = std::tuple<std::decay_t<P>...>;
};

/* "k_convert<1>" from the compiler's name of this instantiation. */
template <auto K> inline const char *kernel_name() {
    static const std::string n = [](std::string f) {
        size_t a = f.find("K = ");
        std::string s = a == std::string::npos ? f : f.substr(a + 4);
        s = s.substr(0, s.find_first_of("];"));
        for (const char *drop : {"&", "emu::"})
            for (size_t i; (i = s.find(drop)) != std::string::npos;) s.erase(i, strlen(drop));
        return s;
    }(__PRETTY_FUNCTION__);
    return n.c_str();
}

/* "k_convert" from "k_convert<1>" or "k_convert #2". */
inline std::string kernel_base(const std::string &n) { return n.substr(0, n.find_first_of("< ")); }

template <auto K, class Tup> inline void trampoline(void *args) { std::apply(K, *static_cast<Tup *>(args)); }

inline void deadlock();

/* Runs one block of n threads to completion under sched.order. */
inline void run_block(int n, std::mt19937_64 &rng) {
    blk.n = n;
    blk.live = n;
    blk.bar_arrived = blk.bar_phase = 0;
    blk.bar_count[0] = blk.bar_count[1] = 0;
    blk.serial++;
    const int nw = (n + 31) / 32;
    for (int w = 0; w < nw; w++) {
        blk.warp[w].lanes = std::min(32, n - 32 * w);
        blk.warp[w].arrived = blk.warp[w].phase = 0;
    }
    for (int i = 0; i < n; i++) {
        blk.st[i] = T_READY;
        if (!fibers[i].lo) make_fiber(fibers[i]);
    }
    static std::vector<int> perm;
    while (blk.live > 0) {
        bool ran = false;
        if (sched.order == 0) {
            for (int i = 0; i < n; i++)
                if (blk.st[i] == T_READY) run_thread(i), ran = true;
        } else if (sched.order == 1) {
            for (int w = nw - 1; w >= 0; w--)
                for (bool any = true; any;) {
                    any = false;
                    for (int l = blk.warp[w].lanes - 1; l >= 0; l--)
                        if (blk.st[w * 32 + l] == T_READY) run_thread(w * 32 + l), any = ran = true;
                }
        } else {
            perm.resize(n);
            for (int i = 0; i < n; i++) perm[i] = i;
            std::shuffle(perm.begin(), perm.end(), rng);
            for (int i : perm)
                if (blk.st[i] == T_READY) run_thread(i), ran = true;
        }
        if (!ran && blk.live > 0) deadlock();
    }
    cur_thread = -1;
}

/* No thread can run but some have not finished: say why. */
inline void deadlock() {
    int bar = 0, warp = 0, done = 0;
    for (int i = 0; i < blk.n; i++) {
        bar += blk.st[i] == T_AT_BAR;
        warp += blk.st[i] == T_AT_WARP;
        done += blk.st[i] == T_DONE;
    }
    cur_thread = -1;
    for (int w = 0; w < (blk.n + 31) / 32; w++) {
        const Warp &x = blk.warp[w];
        if (x.arrived > 0 && x.arrived < x.lanes) {
            int wb = 0, wd = 0;
            for (int l = 0; l < x.lanes; l++) {
                wb += blk.st[w * 32 + l] == T_AT_BAR;
                wd += blk.st[w * 32 + l] == T_DONE;
            }
            die("deadlock: %d lanes of warp %d wait at a warp operation that %d lanes have exited without "
                "reaching and %d wait at %s instead",
                x.arrived, w, wd, wb, bar_name(blk.bar_kind));
        }
    }
    die("deadlock: %d threads wait at %s, %d have exited without reaching it, %d wait at a warp operation", bar,
        bar_name(blk.bar_kind), done, warp);
}

/* Runs the grid of a launch that passed its checks. */
template <auto K, class Tup> inline void run_grid(const LaunchCfg &c, size_t smem_limit, Tup &args) {
    const char *name = kernel_name<K>();
    install_fault_handler();
    Buffer dyn(c.smem, 0, "dynamic shared memory");
    dyn_smem = dyn.p;
    body_fn = trampoline<K, Tup>;
    body_arg = &args;
    blockDim = dim3((unsigned)c.block);
    gridDim = dim3((unsigned)c.grid);
    cur_kernel = name;
    std::mt19937_64 rng(sched.seed);
    std::vector<unsigned> order;
    if (sched.order == 2) {
        order.resize(c.grid);
        for (unsigned i = 0; i < c.grid; i++) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
    }
    for (unsigned long long i = 0; i < c.grid; i++) {
        unsigned b = sched.order == 0 ? (unsigned)i : sched.order == 1 ? (unsigned)(c.grid - 1 - i) : order[i];
        blockIdx.x = cur_block = b;
        memset(dyn.p, sched.poison, c.smem);
        shared_static_bytes = 0;
        run_block((int)c.block, rng);
        if (i == 0 && shared_static_bytes + c.smem > smem_limit)
            die("%zu bytes of static and %zu of dynamic shared memory exceed the %zu a block may use",
                shared_static_bytes, c.smem, smem_limit);
    }
    cur_kernel = nullptr;
    dyn_smem = nullptr;
}

/* kernel<<<cfg>>>(args...): checked now; run now, or queued on the stream
 * (hooks set). */
template <auto K, class... A> inline void emu_launch(LaunchCfg c, A... a) {
    using Tup = typename kernel_args<decltype(K)>::tuple;
    const void *kp = (const void *)K;
    const char *name = kernel_name<K>();
    std::unique_lock<std::mutex> g(host_mu);
    launch_log.push_back(kp);
    KernelStat *ks = nullptr;
    for (KernelStat &s : kernel_stats)
        if (s.k == kp) ks = &s;
    if (!ks) {
        /* Clang names no template arguments: number the instantiations */
        std::string n = name;
        int same = 0;
        for (KernelStat &s : kernel_stats) same += kernel_base(s.name) == n;
        if (same) n += " #" + std::to_string(same + 1);
        kernel_stats.push_back({kp, n});
        ks = &kernel_stats.back();
    }
    if (c.grid < 1 || c.grid > 0x7fffffffull || c.block < 1 || c.block > (unsigned long long)max_threads) {
        set_last_error(cudaErrorInvalidConfiguration);
        return;
    }
    size_t smem_limit = default_smem_limit;
    for (const FuncAttr &fa : func_attrs)
        if (fa.k == kp) smem_limit = std::max(smem_limit, (size_t)fa.max_dyn);
    if (c.smem > smem_limit || c.smem > std::max(default_smem_limit, optin_limit)) {
        set_last_error(cudaErrorInvalidValue); /* what the runtime answers */
        return;
    }
    Tup args(a...);
    ks->launches++;
    ks->blocks += (long long)c.grid;
    ks->threads += (long long)(c.grid * c.block);
    g.unlock();
    if (!hooks.enqueue) {
        run_grid<K>(c, smem_limit, args);
        return;
    }
    /* pointer arguments must point into device memory (structs holding
     * pointers are not looked into) */
    int argi = 0;
    std::apply(
        [&](const auto &...v) {
            auto one = [&](const auto &x) {
                using T = std::decay_t<decltype(x)>;
                if constexpr (std::is_pointer_v<T>)
                    if (x && !hooks.is_device((const void *)x, 1))
                        die("%s: argument %d (%p) is not device memory (a GPU faults)", name, argi, (const void *)x);
                argi++;
            };
            (void)one;
            (one(v), ...);
        },
        args);
    run_or_queue(
        c.stream, [c, smem_limit, args]() mutable { run_grid<K>(c, smem_limit, args); }, true);
}

/* ---------------------------------------------------------------- math */

/* Correctly rounded operations: plain host arithmetic (-ffp-contract=off). */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float fmaf(float a, float b, float c) { return std::fma(a, b, c); }
inline double fma(double a, double b, double c) { return std::fma(a, b, c); }
inline float sqrtf(float a) { return std::sqrt(a); }
inline double sqrt(double a) { return std::sqrt(a); }
inline float fabsf(float a) { return std::fabs(a); }
inline double fabs(double a) { return std::fabs(a); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); } /* NaN loses, as on the device */
inline float fminf(float a, float b) { return std::fmin(a, b); }
inline double fmax(double a, double b) { return std::fmax(a, b); }
inline double fmin(double a, double b) { return std::fmin(a, b); }
inline float floorf(float a) { return std::floor(a); }
inline float ceilf(float a) { return std::ceil(a); }
inline float truncf(float a) { return std::trunc(a); }
inline float rintf(float a) { return std::nearbyint(a); }
inline float roundf(float a) { return std::round(a); }
inline float copysignf(float a, float b) { return std::copysign(a, b); }
inline bool isnan(float a) { return std::isnan(a); }
inline bool isnan(double a) { return std::isnan(a); }
inline bool isinf(float a) { return std::isinf(a); }
inline bool isinf(double a) { return std::isinf(a); }
inline bool isfinite(float a) { return std::isfinite(a); }
inline bool isfinite(double a) { return std::isfinite(a); }
inline bool signbit(float a) { return std::signbit(a); }
inline bool signbit(double a) { return std::signbit(a); }

/* Not correctly rounded on the device (see the top): host libm stands in. */
inline float expf(float a) { return ::expf(a); }
inline float exp2f(float a) { return ::exp2f(a); }
inline float logf(float a) { return ::logf(a); }
inline float log2f(float a) { return ::log2f(a); }
inline float powf(float a, float b) { return ::powf(a, b); }
inline float sinf(float a) { return ::sinf(a); }
inline float cosf(float a) { return ::cosf(a); }
inline float tanhf(float a) { return ::tanhf(a); }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline void sincosf(float a, float *s, float *c) { *s = ::sinf(a), *c = ::cosf(a); }
inline double exp(double a) { return ::exp(a); }
inline double log(double a) { return ::log(a); }
inline double pow(double a, double b) { return ::pow(a, b); }
inline double sin(double a) { return ::sin(a); }
inline double cos(double a) { return ::cos(a); }
inline double tanh(double a) { return ::tanh(a); }
inline void sincos(double a, double *s, double *c) { *s = ::sin(a), *c = ::cos(a); }
inline float __expf(float a) { return ::expf(a); }
inline float __logf(float a) { return ::logf(a); }
inline float __powf(float a, float b) { return ::powf(a, b); }
inline float __sinf(float a) { return ::sinf(a); }
inline float __cosf(float a) { return ::cosf(a); }
inline float __fdividef(float a, float b) { return a / b; }

/* min/max: the device overloads for the types the kernels use (a mixed call
 * that CUDA would resolve and this does not fails to compile: add it). */
#define EMU_MINMAX(T)                                                                                            \
    inline T min(T a, T b) { return a < b ? a : b; }                                                             \
    inline T max(T a, T b) { return a > b ? a : b; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
#undef EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

/* Reinterpretations. */
inline unsigned __float_as_uint(float f) { return from_bits<unsigned>(to_bits(f)); }
inline float __uint_as_float(unsigned u) { return from_bits<float>(to_bits(u)); }
inline int __float_as_int(float f) { return from_bits<int>(to_bits(f)); }
inline float __int_as_float(int u) { return from_bits<float>(to_bits(u)); }
inline long long __double_as_longlong(double d) { return from_bits<long long>(to_bits(d)); }
inline double __longlong_as_double(long long u) { return from_bits<double>(to_bits(u)); }

/* ---------------------------------------------------------------- f16, bf16 */

struct __half {
    unsigned short x;
};
struct __nv_bfloat16 {
    unsigned short x;
};
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }

/* f32 -> bf16: keep the high half, rounding by the low half (to nearest
 * even, or toward zero); a NaN becomes 0x7fff whatever its sign and payload
 * (cvt.rn.bf16.f32 and the toolkit's host fallback alike). */
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
    uint32_t hi = u >> 16, rem = u & 0xffffu;
    if (rem > 0x8000u || (rem == 0x8000u && (hi & 1))) hi++;
    return {(unsigned short)hi};
}
inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
    return {(unsigned short)(u >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((uint32_t)h.x << 16); }

/* f32 -> f16: NaN -> 0x7fff, infinities kept, beyond the f16 range inf
 * (nearest) or the largest finite value (toward zero); otherwise the
 * significand shifted down to the f16 unit (2^(E-10) for a normal result of
 * exponent E, 2^-24 for a subnormal one), the dropped bits deciding the
 * rounding. A carry out of the significand moves to the next exponent (up
 * to inf), or from the largest subnormal to the smallest normal. */
inline __half f32_to_f16(float f, bool nearest) {
    const uint32_t u = __float_as_uint(f), a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
    if (a > 0x7f800000u) return {0x7fff};
    if (a == 0x7f800000u) return {(unsigned short)(sign | 0x7c00u)};
    int e = (int)(a >> 23);
    uint32_t m = a & 0x7fffffu; /* f = m * 2^(e - 150) */
    if (e)
        m |= 0x800000u;
    else
        e = 1;
    const int E = e - 127;
    if (E > 15) return {(unsigned short)(sign | (nearest ? 0x7c00u : 0x7bffu))};
    const int shift = E >= -14 ? 13 : 126 - e;
    if (shift > 24) return {(unsigned short)sign}; /* below half the smallest subnormal */
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (nearest && (rem > half || (rem == half && (q & 1)))) q++;
    const uint32_t r = E >= -14 ? ((uint32_t)(E + 15) << 10) + q - 0x400u : q;
    return {(unsigned short)(sign | r)};
}
inline __half __float2half_rn(float f) { return f32_to_f16(f, true); }
inline __half __float2half_rz(float f) { return f32_to_f16(f, false); }
inline __half __float2half(float f) { return f32_to_f16(f, true); }
/* Exact; a NaN becomes 0x7fffffff, as in the toolkit's host version. */
inline float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu;
    if (e == 31) return __uint_as_float(m ? 0x7fffffffu : sign | 0x7f800000u);
    if (e == 0) return std::copysign((float)m * 0x1p-24f, sign ? -1.0f : 1.0f);
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

} /* namespace emu */

#endif
