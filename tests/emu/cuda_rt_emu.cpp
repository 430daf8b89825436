/*
 * cuda_rt_emu.cpp - an emulated CUDA device: the part of the CUDA runtime and
 * of cuBLAS that src/backend/cuda/cuda_backend.c calls, implemented on the
 * host, so that the whole CUDA backend (its streams, events, copies, pinned
 * memory, range records, cuBLAS calls, and the executor and model code
 * above it) runs in CI, which has no GPU. Compiled against the toolkit's
 * own cuda_runtime_api.h and cublas_v2.h, so that every function here has
 * the signature (and the versioned symbol name) the backend is built
 * against. The kernels come from cuda_kern_emu.cpp (the .cu sources on the
 * emulation of cuda_emu.h).
 *
 * The device. One thread runs the queued work of every stream, one item at
 * a time (a kernel, a copy, a memset, a GEMM, an event record or wait). It
 * picks at random among the streams whose next item may run (a wait runs
 * once the event's recorded work has run), so streams interleave in orders
 * that change with TIDE_EMU_SEED, and it may sleep before an item
 * (TIDE_EMU_JITTER_US, default 20: up to that many microseconds before one
 * item in four), so the device lags behind the host by varying amounts.
 * TIDE_EMU_LAZY=1 makes it lag as far as it can: it runs nothing until some
 * host thread waits for it (a synchronize, cudaFree, ...), so a host that
 * reads what a queued copy will write, or writes what it will read, before
 * waiting always sees the wrong bytes.
 * The host waits only where CUDA promises to wait: cudaStreamSynchronize,
 * cudaEventSynchronize, cudaDeviceSynchronize, cudaFree, cublasDestroy.
 * Everything else is queued, copies to pageable (unregistered) host memory
 * included, which CUDA "might" make synchronous but does not promise to; a
 * copy from pageable host memory takes a copy of its source at the call, as
 * the runtime stages it. Copies from or to pinned memory (cudaHostAlloc,
 * cudaHostRegister) run when the device gets to them, and a copy from pinned
 * memory checks that the host has not written its source since it was
 * queued (unless a copy from the device wrote there meanwhile).
 *
 * What a GPU would fault on, and what CUDA leaves undefined, stops the
 * program with "EMULATED GPU FAULT" and the reason: a copy, memset or GEMM
 * operand outside the device allocations, a kernel's pointer argument
 * outside them (cuda_emu.h), overlapping copy ranges, unregistering or
 * freeing pinned memory that a queued copy still uses, the host writing a
 * pinned copy source before the copy ran, a stream or event used after it
 * was destroyed. The kernels' own accesses are checked by guard pages: every
 * allocation starts right after an inaccessible page, and its last page's
 * unused bytes are checked when it is freed.
 *
 * Memory. TIDE_EMU_MEM bytes of device memory (default 2 GiB, reserved
 * lazily); TIDE_EMU_MEM_PITCH the largest pitch of a 2-D copy (memPitch,
 * default INT_MAX; tests lower it to reach the paths for larger ones); allocations are 256-byte aligned and their first 16 MiB are
 * filled with 0xff bytes (NaN as f32), as a GPU's memory is not zeroed.
 *
 * Failures, for the tests of tide's error paths:
 *   - TIDE_EMU_GPU=35 or 100: cudaGetDeviceCount fails with that error (no
 *     driver, no device); 0: it reports no device;
 *   - TIDE_EMU_FAIL=what:N[,what:N...]: the Nth call (from 1) of `malloc`
 *     (cudaMalloc: out of memory), `hostreg` (cudaHostRegister: refused),
 *     `kernel` (the Nth kernel or GEMM to run faults: the device's error becomes
 *     sticky, cudaErrorLaunchFailure, as after a real fault: every later
 *     call returns it and queued work is dropped).
 *
 * cuBLAS: handles, streams, workspaces, modes; cublasSgemm and cublasGemmEx
 * (f32, f16 and bf16 operands, f32 compute) computed on the device thread in
 * column-major order as documented, with the documented argument checks
 * (CUBLAS_STATUS_INVALID_VALUE for a bad leading dimension, ...). Sums run
 * in f32 in a fixed order, so results are reproducible; cuBLAS's own
 * summation order is not known here, so bits are not a GPU's.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "emu_rt.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

struct CUstream_st;
struct CUevent_st;
struct cublasContext;

namespace {

[[noreturn]] void fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void fault(const char *fmt, ...) {
    fflush(stdout);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "EMULATED GPU FAULT: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    _exit(1);
}

using Clock = std::chrono::steady_clock;

struct Stream;

/* An event's state; shared with the queued records of it, which may outlive
 * cudaEventDestroy (CUDA releases it once the record has run). */
struct EventState {
    bool timing = true;
    Stream *s = nullptr; /* recorded on s (null: never recorded) */
    uint64_t seq = 0;    /* ... after s's first seq items */
    uint64_t gen = 0;    /* records so far */
    double t_ms = -1;    /* when the latest record ran; -1 not yet */
};

enum ItemKind { WORK, WAIT, MARK };

struct Item {
    ItemKind kind = WORK;
    std::function<void()> fn;
    bool kernel = false;
    const char *host = nullptr; /* pinned host bytes the work reads or writes */
    size_t host_n = 0;
    struct Pinned *to_pinned = nullptr; /* a copy into pinned memory: counted there when it runs */
    Stream *ws = nullptr; /* WAIT: until ws has run ws_seq items */
    uint64_t ws_seq = 0;
    std::shared_ptr<EventState> ev; /* MARK */
    uint64_t gen = 0;
};

struct Stream {
    std::deque<Item> q;
    uint64_t enq = 0, done = 0;
    int id = 0;
    bool destroyed = false;
};

struct Alloc {
    char *map, *p;
    size_t maplen, n, body;
};

struct Pinned {
    char *p;
    size_t n;
    bool hostalloc;
    uint64_t dev_writes = 0; /* copies from the device into it that have run */
};

struct Device {
    std::mutex mu;
    std::condition_variable cv_work, cv_done;
    std::vector<Stream *> streams; /* every stream ever made (kept: queued waits and events point at them) */
    Stream *legacy = nullptr;
    std::map<uintptr_t, Alloc> allocs;
    std::map<uintptr_t, Pinned> pinned;
    std::set<void *> events; /* live event handles */
    size_t cap = (size_t)2 << 30, used = 0;
    size_t mem_pitch = INT_MAX;
    cudaError_t sticky = cudaSuccess;
    const Item *running = nullptr; /* the item the device is running */
    bool started = false;
    std::mt19937_64 rng;
    unsigned jitter_us = 20;
    bool lazy = false; /* TIDE_EMU_LAZY: run only while a host thread waits */
    int waiters = 0;   /* host threads blocked in a wait for the device */
    long fail_at[3] = {0, 0, 0}, count[3] = {0, 0, 0}; /* malloc, hostreg, kernel */
    Clock::time_point t0 = Clock::now();
};

enum { F_MALLOC, F_HOSTREG, F_KERNEL };

size_t env_size(const char *name, size_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 0);
    if (*end) fault("%s=%s is not a number", name, v);
    return (size_t)x;
}

/* Made once, never freed: the device thread runs until the process ends. */
Device &dev() {
    static Device *d = [] {
        Device *x = new Device;
        x->cap = env_size("TIDE_EMU_MEM", x->cap);
        x->mem_pitch = env_size("TIDE_EMU_MEM_PITCH", x->mem_pitch);
        x->jitter_us = (unsigned)env_size("TIDE_EMU_JITTER_US", 20);
        x->lazy = env_size("TIDE_EMU_LAZY", 0) != 0;
        x->rng.seed(env_size("TIDE_EMU_SEED", 1));
        if (const char *f = getenv("TIDE_EMU_FAIL")) {
            std::string s = f;
            size_t at = 0;
            while (at < s.size()) {
                size_t comma = s.find(',', at);
                std::string one = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
                size_t colon = one.find(':');
                std::string what = one.substr(0, colon);
                long n = colon == std::string::npos ? 0 : atol(one.c_str() + colon + 1);
                int k = what == "malloc" ? F_MALLOC : what == "hostreg" ? F_HOSTREG : what == "kernel" ? F_KERNEL : -1;
                if (k < 0 || n < 1) fault("TIDE_EMU_FAIL: '%s' is not malloc:N, hostreg:N or kernel:N", one.c_str());
                x->fail_at[k] = n;
                at = comma == std::string::npos ? s.size() : comma + 1;
            }
        }
        x->legacy = new Stream;
        x->streams.push_back(x->legacy);
        return x;
    }();
    return *d;
}

/* Counts a call of kind k; true when it is the one to fail. mu held. */
bool inject(Device &d, int k) { return ++d.count[k] == d.fail_at[k]; }

thread_local cudaError_t tl_err = cudaSuccess;

cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) tl_err = e;
    return e;
}

double now_ms(const Device &d) { return std::chrono::duration<double, std::milli>(Clock::now() - d.t0).count(); }

/* ---------------------------------------------------------------- the device's thread */

void device_main() {
    Device &d = dev();
    std::unique_lock<std::mutex> lk(d.mu);
    std::vector<Stream *> ready;
    for (;;) {
        ready.clear();
        for (Stream *s : d.streams) {
            if (s->q.empty()) continue;
            const Item &h = s->q.front();
            if (h.kind == WAIT && h.ws->done < h.ws_seq) continue;
            ready.push_back(s);
        }
        if (ready.empty() || (d.lazy && d.waiters == 0)) {
            d.cv_work.wait(lk);
            continue;
        }
        Stream *s = ready[d.rng() % ready.size()];
        Item it = std::move(s->q.front());
        s->q.pop_front();
        bool run = it.kind == WORK && d.sticky == cudaSuccess;
        if (run && it.kernel && inject(d, F_KERNEL)) {
            fprintf(stderr, "emulated GPU: kernel %ld fails (TIDE_EMU_FAIL)\n", d.count[F_KERNEL]);
            d.sticky = cudaErrorLaunchFailure;
            run = false;
        }
        bool nap = run && d.jitter_us && d.rng() % 4 == 0;
        unsigned us = nap ? (unsigned)(d.rng() % (d.jitter_us + 1)) : 0;
        d.running = &it;
        lk.unlock();
        if (us) std::this_thread::sleep_for(std::chrono::microseconds(us));
        if (run) it.fn();
        lk.lock();
        d.running = nullptr;
        if (run && it.to_pinned) it.to_pinned->dev_writes++;
        if (it.kind == MARK && it.ev->gen == it.gen) it.ev->t_ms = now_ms(d);
        s->done++;
        d.cv_done.notify_all();
    }
}

void wait_idle(Device &d, std::unique_lock<std::mutex> &lk);

/* At exit the device finishes what it runs before static destructors (the
 * emulation's) run under it. */
void drain_at_exit() {
    Device &d = dev();
    std::unique_lock<std::mutex> lk(d.mu);
    wait_idle(d, lk);
}

uint64_t fnv1a(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* Queues an item on s (null: the legacy stream). mu held. */
cudaError_t push(Device &d, Stream *s, Item &&it) {
    if (d.sticky != cudaSuccess) return d.sticky;
    if (!s) s = d.legacy;
    if (s->destroyed) fault("work queued on stream %d after cudaStreamDestroy", s->id);
    s->q.push_back(std::move(it));
    s->enq++;
    if (!d.started) {
        d.started = true;
        std::thread(device_main).detach();
        atexit(drain_at_exit);
    }
    d.cv_work.notify_one();
    return cudaSuccess;
}

/* A host thread waits until pred holds; a lazy device runs meanwhile. */
template <class P> void host_wait(Device &d, std::unique_lock<std::mutex> &lk, P pred) {
    if (pred()) return;
    d.waiters++;
    d.cv_work.notify_one();
    d.cv_done.wait(lk, pred);
    d.waiters--;
}

void wait_stream(Device &d, std::unique_lock<std::mutex> &lk, Stream *s, uint64_t seq) {
    host_wait(d, lk, [&] { return s->done >= seq; });
}

void wait_idle(Device &d, std::unique_lock<std::mutex> &lk) {
    host_wait(d, lk, [&] {
        for (Stream *s : d.streams)
            if (s->done < s->enq) return false;
        return true;
    });
}

/* The entry of m (allocations or pinned regions, by start) holding
 * [p, p + n), or null. mu held. */
template <class T> const T *find_in(const std::map<uintptr_t, T> &m, const void *p, size_t n) {
    auto it = m.upper_bound((uintptr_t)p);
    if (it == m.begin()) return nullptr;
    --it;
    const T &r = it->second;
    const char *c = (const char *)p;
    return c >= r.p && n <= r.n && c - r.p <= (ptrdiff_t)(r.n - n) ? &r : nullptr;
}
const Alloc *find_alloc(Device &d, const void *p, size_t n) { return find_in(d.allocs, p, n); }
const Pinned *find_pinned(Device &d, const void *p, size_t n) { return find_in(d.pinned, p, n); }

/* Pinned memory about to be released must not be used by queued copies. */
void check_unused(Device &d, const char *p, size_t n, const char *what) {
    auto uses = [&](const Item &it) { return it.host_n && it.host < p + n && p < it.host + it.host_n; };
    if (d.running && uses(*d.running))
        fault("%s of pinned host memory [%p, +%zu) while a copy from or to it runs", what, (const void *)p, n);
    for (Stream *s : d.streams)
        for (const Item &it : s->q)
            if (uses(it))
                fault("%s of pinned host memory [%p, +%zu) that a copy queued on stream %d still uses", what,
                      (const void *)p, n, s->id);
}

const unsigned char pad_byte = 0xa5;

} // namespace

/* ---------------------------------------------------------------- what the kernels use */

namespace emu_rt {

int enqueue(CUstream_st *s, std::function<void()> &&work, bool kernel) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    Item it;
    it.fn = std::move(work);
    it.kernel = kernel;
    return push(d, (Stream *)s, std::move(it));
}

bool is_device(const void *p, size_t n) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    return find_alloc(d, p, n) != nullptr;
}

int synchronize(CUstream_st *s) { return cudaStreamSynchronize((cudaStream_t)s); }

size_t optin_limit() { return 99 * 1024; }

int get_error(bool clear) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    if (d.sticky != cudaSuccess) return d.sticky;
    cudaError_t e = tl_err;
    if (clear) tl_err = cudaSuccess;
    return e;
}

void set_error(int e) { ret((cudaError_t)e); }

} // namespace emu_rt

/* ---------------------------------------------------------------- runtime API */

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define N(x) \
    case x: return #x;
        N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInvalidPitchValue)
        N(cudaErrorInsufficientDriver) N(cudaErrorNoDevice) N(cudaErrorInvalidDevice)
        N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady) N(cudaErrorIllegalAddress)
        N(cudaErrorHostMemoryAlreadyRegistered) N(cudaErrorHostMemoryNotRegistered) N(cudaErrorLaunchFailure)
        N(cudaErrorInvalidConfiguration) N(cudaErrorInvalidDeviceFunction) N(cudaErrorNoKernelImageForDevice)
#undef N
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    default: return "unrecognized error code";
    }
}

cudaError_t cudaGetLastError(void) { return (cudaError_t)emu_rt::get_error(true); }

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 0;
    const char *g = getenv("TIDE_EMU_GPU");
    if (g && *g) {
        int v = atoi(g);
        if (v == 35 || v == 100) return ret((cudaError_t)v);
        if (v == 0) return cudaSuccess;
    }
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device != 0) return ret(cudaErrorInvalidDevice);
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    return d.sticky != cudaSuccess ? ret(d.sticky) : cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return ret(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "tide emulated GPU");
    prop->totalGlobalMem = dev().cap;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = emu_rt::optin_limit();
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->memPitch = dev().mem_pitch; /* the largest pitch cudaMemcpy2D takes */
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 4;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    if (d.sticky != cudaSuccess) return ret(d.sticky);
    *free_bytes = d.cap - d.used;
    *total = d.cap;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t n) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    *ptr = nullptr;
    if (d.sticky != cudaSuccess) return ret(d.sticky);
    if (n == 0) return cudaSuccess;
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (n + pg - 1) / pg * pg;
    if (inject(d, F_MALLOC) || body > d.cap - d.used) return ret(cudaErrorMemoryAllocation);
    size_t maplen = body + 2 * pg;
    char *map = (char *)mmap(nullptr, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                             -1, 0);
    if (map == MAP_FAILED) return ret(cudaErrorMemoryAllocation);
    mprotect(map, pg, PROT_NONE);
    mprotect(map + pg + body, pg, PROT_NONE);
    char *p = map + pg;
    memset(p, 0xff, std::min(n, (size_t)16 << 20));
    memset(p + n, pad_byte, body - n);
    d.allocs[(uintptr_t)p] = Alloc{map, p, maplen, n, body};
    d.used += body;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    if (!ptr) return cudaSuccess;
    Device &d = dev();
    std::unique_lock<std::mutex> lk(d.mu);
    wait_idle(d, lk); /* cudaFree synchronizes with the device */
    auto it = d.allocs.find((uintptr_t)ptr);
    if (it == d.allocs.end()) return ret(cudaErrorInvalidValue);
    Alloc a = it->second;
    for (size_t i = a.n; i < a.body; i++)
        if ((unsigned char)a.p[i] != pad_byte)
            fault("something wrote %zu bytes past the end of a %zu-byte device allocation", i - a.n + 1, a.n);
    d.allocs.erase(it);
    d.used -= a.body;
    munmap(a.map, a.maplen);
    return d.sticky != cudaSuccess ? ret(d.sticky) : cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t n, unsigned int flags) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    *ptr = nullptr;
    if (d.sticky != cudaSuccess) return ret(d.sticky);
    if (!n) n = 1;
    void *p = nullptr;
    if (posix_memalign(&p, 4096, n)) return ret(cudaErrorMemoryAllocation);
    d.pinned[(uintptr_t)p] = Pinned{(char *)p, n, true};
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
    if (!ptr) return cudaSuccess;
    Device &d = dev();
    std::unique_lock<std::mutex> lk(d.mu);
    auto it = d.pinned.find((uintptr_t)ptr);
    if (it == d.pinned.end() || !it->second.hostalloc) return ret(cudaErrorInvalidValue);
    /* CUDA does not promise to wait here: memory a queued copy uses is a bug */
    check_unused(d, it->second.p, it->second.n, "cudaFreeHost");
    d.pinned.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *ptr, size_t n, unsigned int flags) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    if (d.sticky != cudaSuccess) return ret(d.sticky);
    if (!ptr || !n) return ret(cudaErrorInvalidValue);
    const char *c = (const char *)ptr;
    for (auto &kv : d.pinned)
        if (kv.second.p < c + n && c < kv.second.p + kv.second.n) return ret(cudaErrorHostMemoryAlreadyRegistered);
    if (inject(d, F_HOSTREG)) return ret(cudaErrorMemoryAllocation);
    d.pinned[(uintptr_t)ptr] = Pinned{(char *)ptr, n, false};
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    auto it = d.pinned.find((uintptr_t)ptr);
    if (it == d.pinned.end() || it->second.hostalloc) return ret(cudaErrorHostMemoryNotRegistered);
    check_unused(d, it->second.p, it->second.n, "cudaHostUnregister");
    d.pinned.erase(it);
    return cudaSuccess;
}

/* Device allocations, pinned host memory (cudaHostAlloc, cudaHostRegister)
 * and other host memory (unregistered), as CUDA 11 and later tell them. */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr) {
    if (!a) return ret(cudaErrorInvalidValue);
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    memset(a, 0, sizeof *a);
    if (find_alloc(d, ptr, 1)) {
        a->type = cudaMemoryTypeDevice;
        a->devicePointer = const_cast<void *>(ptr);
    } else if (find_pinned(d, ptr, 1)) {
        a->type = cudaMemoryTypeHost;
        a->devicePointer = a->hostPointer = const_cast<void *>(ptr);
    } else {
        a->type = cudaMemoryTypeUnregistered;
        a->device = -2;
        a->hostPointer = const_cast<void *>(ptr);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    *out = nullptr;
    if (d.sticky != cudaSuccess) return ret(d.sticky);
    Stream *s = new Stream;
    s->id = (int)d.streams.size();
    d.streams.push_back(s);
    *out = (cudaStream_t)s;
    return cudaSuccess;
}

/* The stream's queued work still runs; the object stays (queued waits may
 * name it), marked so that any later use of it faults. */
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    Stream *st = (Stream *)s;
    if (st->destroyed) fault("cudaStreamDestroy of stream %d, already destroyed", st->id);
    st->destroyed = true;
    return cudaSuccess;
}

/* The stream s names (null: the legacy stream); faults if destroyed. */
static Stream *stream_of(Device &d, cudaStream_t s, const char *what) {
    Stream *st = s ? (Stream *)s : d.legacy;
    if (st->destroyed) fault("%s on stream %d after cudaStreamDestroy", what, st->id);
    return st;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    Device &d = dev();
    std::unique_lock<std::mutex> lk(d.mu);
    Stream *st = stream_of(d, s, "cudaStreamSynchronize");
    wait_stream(d, lk, st, st->enq);
    return d.sticky != cudaSuccess ? ret(d.sticky) : cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    Device &d = dev();
    std::unique_lock<std::mutex> lk(d.mu);
    wait_idle(d, lk);
    return d.sticky != cudaSuccess ? ret(d.sticky) : cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    *out = nullptr;
    if (d.sticky != cudaSuccess) return ret(d.sticky);
    auto *h = new std::shared_ptr<EventState>(std::make_shared<EventState>());
    (*h)->timing = !(flags & cudaEventDisableTiming);
    d.events.insert(h);
    *out = (cudaEvent_t)h;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    if (!d.events.erase(e)) fault("cudaEventDestroy of an event that is not live (destroyed already?)");
    delete (std::shared_ptr<EventState> *)e;
    return cudaSuccess;
}

/* A live event's state; faults on a destroyed one. mu held. */
static EventState &ev_of(Device &d, cudaEvent_t e, const char *what) {
    if (!d.events.count(e)) fault("%s of an event that is not live (used after cudaEventDestroy?)", what);
    return **(std::shared_ptr<EventState> *)e;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    Stream *st = stream_of(d, s, "cudaEventRecord");
    EventState &ev = ev_of(d, e, "cudaEventRecord");
    Item it;
    it.kind = MARK;
    it.ev = *(std::shared_ptr<EventState> *)e;
    it.gen = ev.gen + 1;
    cudaError_t r = push(d, st, std::move(it));
    if (r != cudaSuccess) return ret(r);
    ev.gen++;
    ev.s = st;
    ev.seq = st->enq;
    ev.t_ms = -1;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    EventState &ev = ev_of(d, e, "cudaStreamWaitEvent");
    Stream *st = stream_of(d, s, "cudaStreamWaitEvent");
    if (!ev.s) return d.sticky != cudaSuccess ? ret(d.sticky) : cudaSuccess; /* never recorded: nothing to wait for */
    Item it;
    it.kind = WAIT;
    it.ws = ev.s;
    it.ws_seq = ev.seq;
    return ret(push(d, st, std::move(it)));
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    Device &d = dev();
    std::unique_lock<std::mutex> lk(d.mu);
    EventState &ev = ev_of(d, e, "cudaEventSynchronize");
    if (ev.s) wait_stream(d, lk, ev.s, ev.seq);
    return d.sticky != cudaSuccess ? ret(d.sticky) : cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a || !b) return ret(cudaErrorInvalidResourceHandle);
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    if (d.sticky != cudaSuccess) return ret(d.sticky);
    EventState &x = ev_of(d, a, "cudaEventElapsedTime"), &y = ev_of(d, b, "cudaEventElapsedTime");
    if (!x.timing || !y.timing || !x.s || !y.s) return ret(cudaErrorInvalidResourceHandle);
    if (x.t_ms < 0 || y.t_ms < 0) return ret(cudaErrorNotReady);
    *ms = (float)(y.t_ms - x.t_ms);
    return cudaSuccess;
}

/* The host side of a copy: which pointer is on the host, and whether it is
 * pinned. kind is resolved for cudaMemcpyDefault. */
static cudaError_t memcpy_impl(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                               cudaMemcpyKind kind, cudaStream_t s, const char *what) {
    Device &d = dev();
    std::unique_lock<std::mutex> lk(d.mu);
    if (d.sticky != cudaSuccess) return ret(d.sticky);
    if (!width || !height) return cudaSuccess;
    if (width > dpitch || width > spitch) return ret(cudaErrorInvalidPitchValue);
    if (height > 1 && (dpitch > d.mem_pitch || spitch > d.mem_pitch)) return ret(cudaErrorInvalidPitchValue);
    size_t dext = dpitch * (height - 1) + width, sext = spitch * (height - 1) + width;
    if ((const char *)dst < (const char *)src + sext && (const char *)src < (const char *)dst + dext)
        fault("%s: the destination [%p, +%zu) overlaps the source [%p, +%zu) (CUDA: \"may not overlap\")", what,
              dst, dext, src, sext);
    bool dd = find_alloc(d, dst, dext), sd = find_alloc(d, src, sext);
    if (kind == cudaMemcpyDefault)
        kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                  : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice) return ret(cudaErrorInvalidValue);
    if (want_dd && !dd)
        fault("%s (kind %d): destination [%p, +%zu) is not inside a device allocation", what, (int)kind, dst, dext);
    if (want_sd && !sd)
        fault("%s (kind %d): source [%p, +%zu) is not inside a device allocation", what, (int)kind, src, sext);
    if (!want_dd && find_alloc(d, dst, 1))
        fault("%s (kind %d): destination %p is device memory, the kind says host", what, (int)kind, dst);
    if (!want_sd && find_alloc(d, src, 1))
        fault("%s (kind %d): source %p is device memory, the kind says host", what, (int)kind, src);

    Item it;
    const char *host = want_sd ? (const char *)dst : (const char *)src;
    size_t host_n = want_sd ? dext : sext;
    bool host_side = kind != cudaMemcpyDeviceToDevice;
    Pinned *pin = host_side ? const_cast<Pinned *>(find_pinned(d, host, host_n)) : nullptr;
    std::shared_ptr<std::vector<char>> staged;
    if (host_side && !pin && !want_sd) {
        /* pageable source: the runtime stages it before returning */
        staged = std::make_shared<std::vector<char>>(sext);
        memcpy(staged->data(), src, sext);
        src = staged->data();
    }
    /* a pinned source must not change between the call and the copy, but
     * for what a copy from the device writes there meanwhile */
    uint64_t hash = 0, writes = 0;
    if (pin && !want_sd) hash = fnv1a(src, sext), writes = pin->dev_writes;
    if (pin) it.host = host, it.host_n = host_n;
    if (pin && want_sd) it.to_pinned = pin;
    it.fn = [=] {
        (void)staged;
        if (pin && !want_sd && pin->dev_writes == writes && fnv1a(src, sext) != hash)
            fault("%s: the host wrote the pinned source [%p, +%zu) after queueing the copy and before it ran", what,
                  src, sext);
        for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    };
    Stream *st = stream_of(d, s, what);
    return ret(push(d, st, std::move(it)));
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
    return memcpy_impl(dst, n, src, n, n, 1, kind, s, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t s) {
    return memcpy_impl(dst, dpitch, src, spitch, width, height, kind, s, "cudaMemcpy2DAsync");
}

cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s) {
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    if (d.sticky != cudaSuccess) return ret(d.sticky);
    if (!n) return cudaSuccess;
    if (!find_alloc(d, dst, n)) fault("cudaMemsetAsync: [%p, +%zu) is not inside a device allocation", dst, n);
    Item it;
    it.fn = [=] { memset(dst, v, n); };
    return ret(push(d, stream_of(d, s, "cudaMemsetAsync"), std::move(it)));
}

} // extern "C"

/* ---------------------------------------------------------------- cuBLAS */

struct cublasContext {
    Stream *stream = nullptr;
    void *ws = nullptr;
    size_t ws_n = 0;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
    cublasAtomicsMode_t atomics = CUBLAS_ATOMICS_NOT_ALLOWED;
};

namespace {

float from16(const void *p, size_t i, cudaDataType t) {
    uint16_t h = ((const uint16_t *)p)[i];
    uint32_t u;
    if (t == CUDA_R_16BF) {
        u = (uint32_t)h << 16;
    } else { /* IEEE half, exactly */
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
        if (e == 31) {
            u = sign | 0x7f800000u | (m << 13);
        } else if (e == 0) {
            float f = (float)m * 0x1p-24f;
            return sign ? -f : f;
        } else {
            u = sign | ((e + 112u) << 23) | (m << 13);
        }
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float elem(const void *p, size_t i, cudaDataType t) { return t == CUDA_R_32F ? ((const float *)p)[i] : from16(p, i, t); }

size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/* Column-major C (m x n, ldc) = alpha op(A) op(B) + beta C with op(A) m x k
 * and op(B) k x n; beta 0 does not read C. */
void gemm_host(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void *A,
               cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, float beta, float *C, int ldc) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int l = 0; l < k; l++) {
                size_t ai = ta == CUBLAS_OP_N ? (size_t)i + (size_t)l * lda : (size_t)l + (size_t)i * lda;
                size_t bi = tb == CUBLAS_OP_N ? (size_t)l + (size_t)j * ldb : (size_t)j + (size_t)l * ldb;
                acc += elem(A, ai, at) * elem(B, bi, bt);
            }
            float *c = C + (size_t)i + (size_t)j * ldc;
            *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
        }
}

cublasStatus_t gemm_call(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                         float alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                         int ldb, float beta, float *C, int ldc, const char *what) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    auto op_ok = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; };
    if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k) || ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) ||
        ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    Device &d = dev();
    std::lock_guard<std::mutex> g(d.mu);
    if (d.sticky != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    /* the elements each operand spans, first to last */
    size_t aext = k ? (ta == CUBLAS_OP_N ? (size_t)(k - 1) * lda + m : (size_t)(m - 1) * lda + k) : 0;
    size_t bext = k ? (tb == CUBLAS_OP_N ? (size_t)(n - 1) * ldb + k : (size_t)(k - 1) * ldb + n) : 0;
    size_t cext = (size_t)(n - 1) * ldc + m;
    if (aext && !find_alloc(d, A, aext * type_size(at)))
        fault("%s: A (%zu elements from %p) is not inside a device allocation", what, aext, A);
    if (bext && !find_alloc(d, B, bext * type_size(bt)))
        fault("%s: B (%zu elements from %p) is not inside a device allocation", what, bext, B);
    if (!find_alloc(d, C, cext * sizeof(float)))
        fault("%s: C (%zu elements from %p) is not inside a device allocation", what, cext, (void *)C);
    if (h->ws_n && !find_alloc(d, h->ws, h->ws_n))
        fault("%s: the handle's workspace (%zu bytes at %p) was freed", what, h->ws_n, h->ws);
    Item it;
    it.fn = [=] { gemm_host(ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ldc); };
    it.kernel = true;
    return push(d, stream_of(d, (cudaStream_t)h->stream, what), std::move(it)) == cudaSuccess
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    cudaDeviceSynchronize();
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = (Stream *)s;
    h->ws = nullptr; /* "unconditionally resets the cuBLAS library workspace" to the default pool */
    h->ws_n = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t n) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (n && (!ws || (uintptr_t)ws % 256 || !emu_rt::is_device(ws, n))) return CUBLAS_STATUS_INVALID_VALUE;
    h->ws = ws;
    h->ws_n = n;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetAtomicsMode(cublasHandle_t h, cublasAtomicsMode_t mode) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->atomics = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "unknown error";
    }
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc) {
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    return gemm_call(h, ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, ldc,
                     "cublasSgemm");
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    bool f32 = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_16F ||
               compute == CUBLAS_COMPUTE_32F_FAST_16BF || compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    bool types = at == bt && (at == CUDA_R_32F || at == CUDA_R_16F || at == CUDA_R_16BF) && ct == CUDA_R_32F;
    if (!f32 || !types) return CUBLAS_STATUS_NOT_SUPPORTED; /* only what tide asks for is emulated */
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    return gemm_call(h, ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb, *(const float *)beta,
                     (float *)C, ldc, "cublasGemmEx");
}

} // extern "C"
