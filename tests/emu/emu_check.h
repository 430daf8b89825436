/*
 * emu_check.h - the harness of the emulated-kernel tests (test_cuda_emu.cpp
 * for the forward kernels, test_cuda_emu_train.cpp for the training ones):
 * cases and their reports, seeded data, device buffers, runs under the
 * three schedules of cuda_emu.h, comparisons with the CPU kernels, the
 * check that every kernel of a source was launched, and the program's
 * main loop. Included once by each test, after cuda_emu.h and the kernels.
 */
#ifndef TIDE_EMU_CHECK_H
#define TIDE_EMU_CHECK_H

#include "tide.h"

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "cuda_emu.h"

namespace {

using Bytes = std::vector<uint8_t>;

/* ------------------------------------------------------------- reporting */

struct OpStat {
    std::string op;
    int cases = 0, failed = 0;
    double worst = 0; /* error / bound */
    bool exact = true;
    double seconds = 0;
};
std::string fmt_g(double v) {
    char b[32];
    snprintf(b, sizeof b, "%.3g", v);
    return b;
}

double now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

std::vector<OpStat> ops;
char cur_case[256];
int msgs_in_case;
bool case_failed;
int total_failed;
bool quick, verbose;
double case_t0;

void begin_case(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cur_case, sizeof cur_case, fmt, ap);
    va_end(ap);
    msgs_in_case = 0;
    case_failed = false;
    ops.back().cases++;
    case_t0 = now();
}

void end_case() {
    if (verbose)
        printf("  %-12s %-70s %7.3f s%s\n", ops.back().op.c_str(), cur_case, now() - case_t0,
               case_failed ? "  FAILED" : "");
    if (case_failed) {
        ops.back().failed++;
        total_failed++;
    }
}

__attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...) {
    case_failed = true;
    if (++msgs_in_case > 4) return;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s (%s): ", ops.back().op.c_str(), cur_case);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

void note_worst(double r) {
    ops.back().exact = false;
    if (r > ops.back().worst) ops.back().worst = r;
}

/* ------------------------------------------------------------- data */

uint64_t rng_state = 0x9e3779b97f4a7c15ull;
uint64_t rnd() {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
float frand() { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); } /* [-1, 1) */
int irand(int n) { return (int)(rnd() % (uint64_t)n); }
float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

std::vector<float> frands(size_t n, float amp = 1.0f) {
    std::vector<float> v(n);
    for (float &x : v) x = amp * frand();
    return v;
}

/* n weights of dt, values amp * uniform[-1, 1) rounded to dt; as bytes. */
Bytes weights(tide_dtype dt, size_t n, float amp = 1.0f) {
    Bytes b(n * tide_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float f = amp * frand();
        if (dt == TIDE_F32) memcpy(&b[4 * i], &f, 4);
        else {
            uint16_t h = dt == TIDE_F16 ? tide_f32_to_f16(f) : tide_f32_to_bf16(f);
            memcpy(&b[2 * i], &h, 2);
        }
    }
    return b;
}

Bytes random_bytes(size_t n) {
    Bytes b(n);
    for (uint8_t &x : b) x = (uint8_t)rnd();
    return b;
}

template <class T> Bytes as_bytes(const T *p, size_t n) {
    return Bytes((const uint8_t *)p, (const uint8_t *)(p + n));
}
template <class T> std::vector<T> from_bytes(const Bytes &b) {
    std::vector<T> v(b.size() / sizeof(T));
    memcpy(v.data(), b.data(), v.size() * sizeof(T));
    return v;
}

const char *dtn(tide_dtype dt) { return tide_dtype_name(dt); }

/* ------------------------------------------------------------- runs */

/* Device buffers of one run, freed (canaries checked) together. */
struct Dev {
    std::vector<std::unique_ptr<emu::Buffer>> bufs;
    void *put(const void *data, size_t bytes, unsigned off, const char *name) {
        bufs.emplace_back(new emu::Buffer(bytes, off, name));
        if (data) bufs.back()->upload(data);
        return bufs.back()->p;
    }
    template <class T> T *put(const std::vector<T> &h, unsigned off = 0, const char *name = "buffer") {
        return (T *)put(h.data(), h.size() * sizeof(T), off, name);
    }
};

uint64_t case_seed = 1;

emu::Schedule schedule(int s) {
    emu::Schedule c;
    c.order = s;
    c.seed = case_seed * 0x9e3779b97f4a7c15ull + (uint64_t)s;
    c.at_end = s != 0;
    c.grid_cap = s == 0 ? 0 : s == 1 ? 3 : 7;
    c.poison = s == 0 ? 0xff : s == 1 ? 0x7f : 0xcb;
    return c;
}

/* Runs `run` (device buffers in, launches, outputs out as bytes) under the
 * three schedules; every output must be the same bits each time. Returns
 * the first run's outputs. */
template <class F> std::vector<Bytes> under_schedules(F run) {
    std::vector<Bytes> first;
    case_seed++;
    for (int s = 0; s < 3; s++) {
        emu::sched = schedule(s);
        emu::launch_log.clear();
        std::vector<Bytes> got = run(s);
        if (s == 0) {
            first = got;
            continue;
        }
        for (size_t k = 0; k < got.size(); k++)
            if (got[k] != first[k]) {
                size_t i = 0;
                while (i < got[k].size() && got[k][i] == first[k][i]) i++;
                fail("output %zu differs between schedule 0 and schedule %d from byte %zu on: the result "
                     "depends on the order of threads or blocks (a race: a missing barrier?), on shared "
                     "memory no thread wrote, or on the grid size",
                     k, s, i);
            }
    }
    emu::sched = schedule(0);
    return first;
}

void expect_status(cudaError_t got, cudaError_t want, const char *what) {
    if (got != want) fail("%s returned %d, want %d", what, (int)got, (int)want);
}

std::string kernel_names(const std::vector<const void *> &ks) {
    std::string r;
    for (const void *k : ks) {
        const char *n = "(a kernel never tried)";
        for (auto &s : emu::kernel_stats)
            if (s.k == k) n = s.name.c_str();
        r += std::string(r.empty() ? "" : ", ") + n;
    }
    return r.empty() ? "nothing" : r;
}

/* Checks that the launches (tried) since the log was cleared are `want`. */
void expect_launches(std::initializer_list<const void *> want) {
    std::vector<const void *> w(want);
    if (emu::launch_log != w)
        fail("launched %s; want %s", kernel_names(emu::launch_log).c_str(), kernel_names(w).c_str());
}

/* Exact comparison of n elements of `es` bytes. */
void expect_same(const char *what, const Bytes &got, const Bytes &want, size_t es) {
    if (got.size() != want.size()) {
        fail("%s: %zu bytes, want %zu", what, got.size(), want.size());
        return;
    }
    if (got == want) return;
    size_t i = 0;
    while (got[i] == want[i]) i++;
    size_t e = i / es;
    uint64_t g = 0, w = 0;
    memcpy(&g, &got[e * es], es);
    memcpy(&w, &want[e * es], es);
    fail("%s differs at element %zu: got %#llx, want %#llx", what, e, (unsigned long long)g, (unsigned long long)w);
}

/* |got - want| <= bound(i) for every i; NaN wherever want is NaN and only
 * there. Returns the worst error / bound. */
template <class B> double expect_near(const char *what, const float *got, const float *want, size_t n, B bound) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (f_bits(got[i]) == f_bits(want[i])) continue; /* infinities included */
        if (std::isnan(want[i]) || std::isnan(got[i])) {
            if (std::isnan(want[i]) != std::isnan(got[i])) fail("%s[%zu] = %.9g, want %.9g", what, i, got[i], want[i]);
            continue;
        }
        double b = bound(i), err = std::fabs((double)got[i] - (double)want[i]);
        if (!(err <= b)) fail("%s[%zu] = %.9g, want %.9g (error %.3g > bound %.3g)", what, i, got[i], want[i], err, b);
        if (b > 0 && err / b > worst) worst = err / b;
    }
    note_worst(worst);
    return worst;
}

bool want_op(const char *filter, const char *op) {
    if (filter && !strstr(op, filter)) return false;
    ops.push_back(OpStat{op});
    return true;
}

/* ------------------------------------------------------------- emulation errors */

/* Runs f in a child process, which must stop with an emulation error
 * whose message holds `needle`. */
template <class F> void expect_emulation_error(const char *needle, F f) {
    int fds[2];
    if (pipe(fds)) {
        fail("pipe");
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        f();
        _exit(0);
    }
    close(fds[1]);
    std::string msg;
    char buf[512];
    for (ssize_t r; (r = read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, (size_t)r);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || msg.find(needle) == std::string::npos)
        fail("expected an emulation error with \"%s\", got status %#x and: %s", needle, st, msg.c_str());
}

/* ------------------------------------------------------------- coverage, main */

/* Every __global__ kernel of the sources (the lists extract.cmake appends)
 * must have run in some case: a new kernel needs a case in `test`. */
void test_coverage(bool all_ops, std::initializer_list<const char *const *> lists, const char *test) {
    begin_case("every kernel launched");
    for (const char *const *list : lists)
        for (const char *const *k = list; *k; k++) {
            bool seen = false;
            for (auto &s : emu::kernel_stats) seen |= s.launches > 0 && emu::kernel_base(s.name) == *k;
            if (!seen && all_ops) fail("kernel %s was never launched: add a case to tests/emu/%s", *k, test);
        }
    end_case();
}

struct TestEntry {
    const char *op;
    void (*run)();
};

/* The tests' main: `--quick` (sanitizer builds), `-v` (every case with its
 * time), an argument naming an op (only its cases). Runs the tests, checks
 * that the sources' kernels all ran, prints a summary per op and per kernel;
 * returns 0 when every case passed, else 1. */
int run_tests(int argc, char **argv, const char *title, const std::vector<TestEntry> &tests,
              std::initializer_list<const char *const *> kernels, const char *test) {
    const char *filter = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "-v")) verbose = true;
        else filter = argv[i];
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);
    printf("%s%s\n", title, quick ? " (quick)" : "");
    for (const auto &t : tests)
        if (want_op(filter, t.op)) {
            double t0 = now();
            t.run();
            ops.back().seconds = now() - t0;
        }
    ops.push_back(OpStat{"coverage"});
    test_coverage(!filter, kernels, test);

    printf("\n%-14s %6s %6s %8s  %s\n", "op", "cases", "failed", "seconds", "worst error/bound");
    for (const OpStat &s : ops)
        if (s.cases) printf("%-14s %6d %6d %8.2f  %s\n", s.op.c_str(), s.cases, s.failed, s.seconds,
                            s.exact ? "exact" : fmt_g(s.worst).c_str());
    printf("\n%-34s %9s %9s %11s\n", "kernel", "launches", "blocks", "threads");
    for (const auto &s : emu::kernel_stats)
        if (s.name.compare(0, 11, "k_selftest_"))
            printf("%-34s %9lld %9lld %11lld\n", s.name.c_str(), s.launches, s.blocks, s.threads);
    printf("\n%s: %d failed case(s)\n", total_failed ? "FAILED" : "passed", total_failed);
    return total_failed ? 1 : 0;
}

} /* namespace */

#endif
