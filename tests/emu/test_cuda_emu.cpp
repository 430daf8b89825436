/*
 * test_cuda_emu.cpp - every launcher of the CUDA backend (cuda_kernels.h,
 * cuda_gemm.h), run on the host by the emulation of cuda_emu.h and compared
 * with the CPU kernels (src/backend/cpu/kernels.h), so that the kernels are
 * checked on machines without a GPU. The kernels compiled here are the
 * current .cu files of src/backend/cuda, rewritten at build time by
 * extract.cmake.
 *
 * Every case runs under three schedules (cuda_emu.h): threads in index
 * order, warps from the last one eagerly, random; blocks forward, backward,
 * shuffled; buffers against the guard page before them, then after them;
 * the launchers' grid caps lowered to 3 and 7 blocks in the second and
 * third runs, so that grid-stride loops go round; shared memory filled with
 * a different byte each time. The three results must be the same bits (a
 * difference is a race, a read of shared memory nobody wrote, or a
 * dependence on the grid), then match the CPU with the bounds of
 * tests/test_backends.c:
 *
 *   - convert, EMBED (incl. a block of the vocabulary, first or later
 *     chunk), ADD, ARGMAX, GENERIC, the caches written by ATTENTION: exact;
 *   - the range check: exact, against the smallest bad index worked out here;
 *   - RMSNORM, SILU_MUL: 1e-6 relative + 1e-7 absolute;
 *   - MATMUL (fused, also into a block of a wider output: ldo): 2e-5 *
 *     sum_k |x_k w_k| inside the block; outside it the output's bits stay;
 *   - ROPE and ROPE_BWD's inverse rotation: 1e-6 * (1 + 0.24 pos) * max|x|;
 *   - ATTENTION output: 1e-5 absolute (values in [-1, 1]); NaN where the
 *     CPU gives NaN (a NaN in a cache row in range), nowhere else. Both
 *     kernels, chosen as cuda_kernels.h documents it (query-tiled for
 *     prefill, per-row for decoding and hd > 128, per-row on a device whose
 *     opt-in limit refuses the tiled kernel's shared memory, per-row with
 *     rows_only, the backend's TIDE_CUDA_ATTENTION=rows), which the test
 *     checks launch by launch; without a cache (k and v as the caches of
 *     T positions, as the backend runs a training forward) against
 *     tk_attention_nocache;
 *   - tcu_round_to_16: exact against tide_f32_to_bf16 / tide_f32_to_f16
 *     for every non-NaN input (a NaN must give a NaN: the device gives the
 *     canonical 0x7fff, tide's functions keep sign and payload).
 * Some launcher contracts too: status for invalid arguments, nothing
 * launched for empty work. At the end, every __global__ kernel of the
 * sources must have been launched by some case. (The training kernels,
 * cuda_train.cu, have their own test: test_cuda_emu_train.cpp; the harness
 * both use is emu_check.h.)
 *
 * Before all that, the emulation checks itself: FP contraction off, a racy
 * toy kernel caught by the schedule comparison, and (in child processes) a
 * divergent barrier, a partial-warp shuffle, a misaligned float4 load and an
 * out-of-bounds write each stopping the run.
 *
 * A plain main rather than cmocka: cmocka reports a failure by longjmp-ing
 * out of the failing function, which from inside an emulated thread (a
 * coroutine on its own stack) would abandon the scheduler. Failures are
 * printed as they happen (the first few per case); the exit status is 0 when
 * everything passed, 1 otherwise. `--quick` runs a quarter of the attention
 * shapes (sanitizer builds, where the emulation runs 5 times slower), -v
 * prints every case with its time, and an argument naming an op runs only
 * that op's cases.
 *
 * What it proves: the CUDA kernels without a GPU: the current
 * `cuda_kernels.cu` and `cuda_gemm.cu`, rewritten at build time into C++ that
 * runs every CUDA thread as a coroutine (barriers wait for the block,
 * shuffles for the warp), each case under three schedules that must give the
 * same bits, buffers against guard pages; every launcher against the CPU
 * kernel with `test_backends`' tolerances (178 attention shapes on both
 * kernels, all f16/bf16 bit patterns); shown to catch 39 planted bugs (a
 * missing barrier, an off-by-one mask, an ignored leading dimension, wrong
 * rounding, ...).
 */
#include "tide.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"

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

extern "C" {
#include "backend/cpu/kernels.h"
}

#include "cuda_emu.h"

namespace emu {
#include "cuda_kernels.inc"
#include "cuda_gemm.inc"

/* Toy kernels for the emulation's self-check. */
__global__ void k_selftest_neighbour(float *out, bool sync) {
    static float s[64];
    emu_shared(&s, sizeof s);
    s[threadIdx.x] = (float)threadIdx.x;
    if (sync) __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}
__global__ void k_selftest_early_exit() {
    if (threadIdx.x == 5) return;
    __syncthreads();
}
__global__ void k_selftest_partial_shuffle(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) v += __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}
__global__ void k_selftest_misaligned(const float *in, float *out) {
    float4 v = *(const float4 *)(in + 1);
    out[threadIdx.x] = v.x;
}
__global__ void k_selftest_overrun(float *out, int n) { out[n + threadIdx.x] = 1.0f; }
} /* namespace emu */

#include "emu_check.h"

namespace {

/* ------------------------------------------------------------- self-check */

void test_selfcheck() {
    begin_case("fp contraction");
    volatile float a = 1.0f + 0x1p-12f, c = -(1.0f + 0x1p-11f);
    if (emu::__fadd_rn(emu::__fmul_rn(a, a), c) != 0.0f || emu::fmaf(a, a, c) != 0x1p-24f)
        fail("a * b + c and fmaf round alike: the test must be built with -ffp-contract=off");
    end_case();

    begin_case("race caught");
    /* each thread reads its neighbour's shared value: racy without the
     * barrier (in index order the neighbour has not written yet, warp-reverse
     * it has), and the same under every schedule with it */
    auto neighbour = [](int sched, bool sync) {
        emu::sched = schedule(sched);
        Dev d;
        float *o = (float *)d.put(nullptr, 64 * 4, 0, "out");
        emu::emu_launch<&emu::k_selftest_neighbour>(emu::emu_cfg(1, 64), o, sync);
        return as_bytes(o, 64);
    };
    if (neighbour(0, false) == neighbour(1, false))
        fail("a kernel missing a barrier gave the same bits under two schedules");
    for (int sc = 0; sc < 3; sc++) {
        std::vector<float> r = from_bytes<float>(neighbour(sc, true));
        for (int i = 0; i < 64; i++)
            if (r[i] != (float)((i + 1) % 64)) fail("schedule %d, with the barrier: out[%d] = %g", sc, i, r[i]);
    }
    emu::sched = schedule(0);
    end_case();

    begin_case("faults caught");
    expect_emulation_error("exited without reaching",
                           [] { emu::emu_launch<&emu::k_selftest_early_exit>(emu::emu_cfg(1, 64)); });
    expect_emulation_error("deadlock", [] {
        emu::Buffer o(64 * 4);
        emu::emu_launch<&emu::k_selftest_partial_shuffle>(emu::emu_cfg(1, 64), o.as<float>());
    });
    expect_emulation_error("misaligned", [] { /* ours, or UBSan's in sanitizer builds */
        emu::Buffer i(64 * 4), o(64 * 4);
        emu::emu_launch<&emu::k_selftest_misaligned>(emu::emu_cfg(1, 32), i.as<const float>(), o.as<float>());
    });
    expect_emulation_error("after the end", [] {
        emu::sched.at_end = false; /* the write lands in the canary, not in the guard page */
        emu::Buffer o(10 * 4);
        emu::emu_launch<&emu::k_selftest_overrun>(emu::emu_cfg(1, 32), o.as<float>(), 0);
    });
    end_case();
}

/* ------------------------------------------------------------- convert */

void test_convert() {
    struct C {
        tide_dtype dt;
        size_t n;
        unsigned src_off, dst_off;
    } cs[] = {{TIDE_F16, 65536, 0, 0}, {TIDE_BF16, 65535, 2, 4}, {TIDE_F32, 1001, 4, 8}};
    for (const C &c : cs) {
        begin_case("%s n=%zu", dtn(c.dt), c.n);
        size_t es = tide_dtype_size(c.dt);
        Bytes src(c.n * es);
        for (size_t i = 0; i < c.n; i++) {
            if (es == 2) {
                uint16_t h = (uint16_t)i; /* every bit pattern */
                memcpy(&src[2 * i], &h, 2);
            } else {
                uint32_t u = (uint32_t)rnd(); /* random bits: NaN payloads, subnormals */
                memcpy(&src[4 * i], &u, 4);
            }
        }
        std::vector<float> want(c.n);
        tk_convert(src.data(), c.dt, want.data(), c.n);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            void *s = d.put(src.data(), src.size(), c.src_off, "src");
            float *o = (float *)d.put(nullptr, c.n * 4, c.dst_off, "dst");
            expect_status(emu::tcu_convert(nullptr, s, c.dt, o, (int64_t)c.n), cudaSuccess, "tcu_convert");
            return std::vector<Bytes>{as_bytes(o, c.n)};
        });
        expect_same("dst", got[0], as_bytes(want.data(), c.n), 4);
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    expect_status(emu::tcu_convert(nullptr, nullptr, TIDE_F16, nullptr, 0), cudaSuccess, "tcu_convert n=0");
    expect_status(emu::tcu_probe(), cudaSuccess, "tcu_probe"); /* only queries: nothing more to check here */
    {
        emu::Buffer s(16), o(16);
        expect_status(emu::tcu_convert(nullptr, s.p, TIDE_I32, o.as<float>(), 4), cudaErrorInvalidValue,
                      "tcu_convert of i32");
    }
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- range check */

void test_range_check() {
    struct C {
        int64_t n, hi;
        std::vector<int64_t> bad; /* positions given an id out of range */
    } cs[] = {{1000, 500, {}}, {1000, 500, {900, 700}}, {70000, 3, {69999, 65537}}, {1, 10, {0}},
              {300, 1 << 30, {299}}};
    for (const C &c : cs) {
        begin_case("n=%lld hi=%lld bad=%zu", (long long)c.n, (long long)c.hi, c.bad.size());
        std::vector<int32_t> ids(c.n);
        for (auto &v : ids) v = (int32_t)(rnd() % (uint64_t)c.hi);
        int32_t want = TCU_FLAG_OK;
        for (size_t j = 0; j < c.bad.size(); j++) {
            ids[c.bad[j]] = j % 2 ? -1 - irand(5) : (int32_t)c.hi + irand(3); /* above and below */
            want = std::min(want, (int32_t)c.bad[j]);
        }
        ids[0] = c.bad.empty() || c.bad[0] != 0 ? (int32_t)c.hi - 1 : ids[0]; /* the largest good id */
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            int32_t *di = d.put(ids, 4, "ids");
            int32_t *flag = d.put(std::vector<int32_t>{0}, 0, "flag"); /* a stale flag: 0 is a bad index */
            expect_status(emu::tcu_range_check(nullptr, di, c.n, c.hi, flag), cudaSuccess, "tcu_range_check");
            return std::vector<Bytes>{as_bytes(flag, 1)};
        });
        int32_t g = from_bytes<int32_t>(got[0])[0];
        if (g != want) fail("flag %#x, want %#x", g, want);
        end_case();
    }
    begin_case("n=0");
    emu::launch_log.clear();
    {
        emu::Buffer flag(4);
        memset(flag.p, 0, 4);
        expect_status(emu::tcu_range_check(nullptr, nullptr, 0, 5, flag.as<int32_t>()), cudaSuccess, "n=0");
        if (*flag.as<int32_t>() != TCU_FLAG_OK) fail("flag not reset for n=0");
    }
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- embed */

void test_embed() {
    struct C {
        tide_dtype dt;
        int64_t V, D, vocab0, vocab;
        bool first;
        int64_t R;
        unsigned off; /* of the table (out's is 4) */
    } cs[] = {
        {TIDE_F32, 50, 64, 0, 50, true, 7, 0},     {TIDE_F16, 40, 300, 0, 40, true, 5, 0},
        {TIDE_BF16, 30, 17, 0, 30, true, 9, 2},    {TIDE_F16, 25, 40, 25, 100, true, 12, 0},
        {TIDE_BF16, 25, 40, 50, 100, false, 12, 4}, {TIDE_F32, 30, 33, 70, 100, false, 6, 4},
        {TIDE_F32, 7, 600, 0, 7, true, 1, 0},
    };
    for (const C &c : cs) {
        begin_case("%s V=%lld D=%lld vocab0=%lld vocab=%lld %s R=%lld", dtn(c.dt), (long long)c.V, (long long)c.D,
                   (long long)c.vocab0, (long long)c.vocab, c.first ? "first" : "later", (long long)c.R);
        Bytes table = random_bytes((size_t)(c.V * c.D) * tide_dtype_size(c.dt)); /* any bits: exact copies */
        std::vector<int32_t> tok(c.R);
        for (auto &t : tok) t = irand((int)c.vocab);
        tok[0] = (int32_t)c.vocab0; /* the block's first and last ids */
        if (c.R > 1) tok[c.R - 1] = (int32_t)(c.vocab0 + c.V - 1);
        std::vector<float> out0 = frands((size_t)(c.R * c.D)), want = out0;
        int64_t bad = -1;
        if (tk_embed(table.data(), c.dt, c.V, c.D, c.vocab0, c.vocab, c.first, tok.data(), c.R, want.data(), &bad,
                     1) != TIDE_OK)
            fail("tk_embed failed");
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            void *t = d.put(table.data(), table.size(), c.off, "table");
            int32_t *dt = d.put(tok, 0, "tokens");
            float *o = d.put(out0, 4, "out");
            expect_status(emu::tcu_embed(nullptr, t, c.dt, c.V, c.D, c.vocab0, c.first, dt, c.R, o), cudaSuccess,
                          "tcu_embed");
            return std::vector<Bytes>{as_bytes(o, out0.size())};
        });
        expect_same("out", got[0], as_bytes(want.data(), want.size()), 4);
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer t(64), k(4), o(64);
        expect_status(emu::tcu_embed(nullptr, t.p, TIDE_I32, 4, 4, 0, true, k.as<int32_t>(), 1, o.as<float>()),
                      cudaErrorInvalidValue, "tcu_embed of i32");
        expect_status(emu::tcu_embed(nullptr, t.p, TIDE_F32, 4, 4, 0, true, k.as<int32_t>(), 0, o.as<float>()),
                      cudaSuccess, "tcu_embed R=0");
    }
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- rmsnorm */

void test_rmsnorm() {
    struct C {
        tide_dtype wdt;
        int64_t R, D;
        float eps;
        bool inplace;
    } cs[] = {{TIDE_F32, 3, 64, 1e-5f, false}, {TIDE_F16, 2, 1000, 1e-6f, true}, {TIDE_BF16, 5, 17, 1e-5f, false},
              {TIDE_F32, 1, 4096, 1e-5f, true}, {TIDE_F16, 9, 256, 1e-5f, false}, {TIDE_BF16, 4, 33, 1e-2f, true}};
    for (const C &c : cs) {
        begin_case("%s R=%lld D=%lld eps=%g%s", dtn(c.wdt), (long long)c.R, (long long)c.D, c.eps,
                   c.inplace ? " in place" : "");
        std::vector<float> x((size_t)(c.R * c.D));
        const float amps[] = {1.0f, 1e-3f, 30.0f};
        for (int64_t r = 0; r < c.R; r++)
            for (int64_t i = 0; i < c.D; i++) x[r * c.D + i] = amps[r % 3] * frand();
        Bytes w = weights(c.wdt, (size_t)c.D, 2.0f);
        std::vector<float> want(x.size());
        tk_rmsnorm(x.data(), w.data(), c.wdt, c.R, c.D, c.eps, want.data(), 1);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dx = d.put(x, 0, "x");
            void *dw = d.put(w.data(), w.size(), 0, "w");
            float *o = c.inplace ? dx : (float *)d.put(nullptr, x.size() * 4, 4, "out");
            expect_status(emu::tcu_rmsnorm(nullptr, dx, dw, c.wdt, c.R, c.D, c.eps, o), cudaSuccess, "tcu_rmsnorm");
            return std::vector<Bytes>{as_bytes(o, x.size())};
        });
        std::vector<float> g = from_bytes<float>(got[0]);
        expect_near("out", g.data(), want.data(), g.size(), [&](size_t i) { return 1e-7 + 1e-6 * std::fabs(want[i]); });
        end_case();
    }
}

/* ------------------------------------------------------------- matmul */

void test_matmul() {
    struct C {
        tide_dtype wdt;
        int64_t R, K, N, col0, extra; /* out: a block at column col0 of rows col0 + N + extra wide */
        unsigned xoff;
    } cs[] = {
        {TIDE_F32, 1, 64, 40, 0, 0, 0},   {TIDE_F16, 5, 256, 33, 0, 0, 0},  {TIDE_BF16, 16, 72, 24, 3, 5, 0},
        {TIDE_F32, 20, 136, 17, 2, 7, 0}, {TIDE_F16, 3, 13, 9, 0, 0, 0},   {TIDE_BF16, 7, 64, 12, 1, 3, 4},
        {TIDE_F32, 2, 1000, 70, 0, 0, 0}, {TIDE_F16, 33, 40, 10, 0, 2, 0},  {TIDE_BF16, 1, 8, 1, 0, 0, 0},
        {TIDE_F32, 4, 30, 20, 1, 1, 0},   {TIDE_F32, 17, 96, 9, 0, 0, 8},
    };
    for (const C &c : cs) {
        const int64_t ldo = c.col0 + c.N + c.extra;
        begin_case("%s R=%lld K=%lld N=%lld ldo=%lld col0=%lld x%%16=%u", dtn(c.wdt), (long long)c.R, (long long)c.K,
                   (long long)c.N, (long long)ldo, (long long)c.col0, c.xoff);
        std::vector<float> x = frands((size_t)(c.R * c.K));
        Bytes w = weights(c.wdt, (size_t)(c.N * c.K));
        std::vector<float> out0 = frands((size_t)(c.R * ldo), 100.0f), want = out0;
        if (tk_matmul(x.data(), w.data(), c.wdt, c.R, c.K, c.N, want.data() + c.col0, ldo, nullptr, 0, 1) != TIDE_OK)
            fail("tk_matmul failed");
        std::vector<float> wf((size_t)(c.N * c.K));
        tk_convert(w.data(), c.wdt, wf.data(), wf.size());
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dx = d.put(x, c.xoff, "x");
            void *dw = d.put(w.data(), w.size(), 0, "w");
            float *o = d.put(out0, 0, "out");
            expect_status(emu::tcu_matmul_fused(nullptr, dx, dw, c.wdt, c.R, c.K, c.N, o + c.col0, ldo), cudaSuccess,
                          "tcu_matmul_fused");
            return std::vector<Bytes>{as_bytes(o, out0.size())};
        });
        std::vector<float> g = from_bytes<float>(got[0]);
        /* outside the block: untouched; inside: the bound */
        std::vector<float> gin, win;
        std::vector<double> bound;
        for (int64_t r = 0; r < c.R; r++)
            for (int64_t j = 0; j < ldo; j++) {
                size_t i = (size_t)(r * ldo + j);
                if (j < c.col0 || j >= c.col0 + c.N) {
                    if (f_bits(g[i]) != f_bits(out0[i]))
                        fail("out[%lld][%lld], outside the block, changed from %g to %g", (long long)r, (long long)j,
                             out0[i], g[i]);
                    continue;
                }
                double s = 0;
                for (int64_t k = 0; k < c.K; k++) s += std::fabs((double)x[r * c.K + k] * wf[(j - c.col0) * c.K + k]);
                gin.push_back(g[i]);
                win.push_back(want[i]);
                bound.push_back(2e-5 * s);
            }
        expect_near("out", gin.data(), win.data(), gin.size(), [&](size_t i) { return bound[i]; });
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer x(64), w(64), o(64);
        expect_status(emu::tcu_matmul_fused(nullptr, x.as<float>(), w.p, TIDE_I32, 1, 4, 4, o.as<float>(), 4),
                      cudaErrorInvalidValue, "i32 weights");
        expect_status(emu::tcu_matmul_fused(nullptr, x.as<float>(), w.p, TIDE_F32, 0, 4, 4, o.as<float>(), 4),
                      cudaSuccess, "R=0");
    }
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- rope */

void test_rope() {
    struct C {
        int B, T, H, hd;
        float theta;
        int pos0; /* -1: random positions */
        bool inplace;
    } cs[] = {{2, 5, 4, 16, 10000.0f, 0, false},   {1, 1, 8, 64, 10000.0f, 37, true},
              {2, 3, 2, 128, 500000.0f, 1000, false}, {1, 4, 3, 6, 10000.0f, 2, true},
              {1, 7, 2, 96, 10000.0f, -1, false}};
    const size_t n_cs = sizeof cs / sizeof cs[0];
    for (size_t ci = 0; ci < 2 * n_cs; ci++) { /* ROPE, then ROPE_BWD's inverse rotation */
        const C &c = cs[ci % n_cs];
        const bool inv = ci >= n_cs;
        begin_case("%sB=%d T=%d H=%d hd=%d theta=%g pos0=%d%s", inv ? "inverse " : "", c.B, c.T, c.H, c.hd, c.theta,
                   c.pos0, c.inplace ? " in place" : "");
        const int64_t R = (int64_t)c.B * c.T, D = (int64_t)c.H * c.hd;
        std::vector<float> x = frands((size_t)(R * D));
        std::vector<int32_t> pos(c.T);
        for (int t = 0; t < c.T; t++) pos[t] = c.pos0 >= 0 ? c.pos0 + t : irand(4000);
        std::vector<float> want(x.size());
        if (inv) tk_rope_bwd(x.data(), pos.data(), R, c.T, c.H, c.hd, c.theta, want.data(), 1);
        else tk_rope(x.data(), pos.data(), R, c.T, c.H, c.hd, c.theta, false, want.data(), 1);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dx = d.put(x, 0, "x");
            int32_t *dp = d.put(pos, 0, "pos");
            float *o = c.inplace ? dx : (float *)d.put(nullptr, x.size() * 4, 0, "out");
            expect_status(inv ? emu::tcu_rope_inverse(nullptr, dx, dp, R, c.T, c.H, c.hd, c.theta, o)
                              : emu::tcu_rope(nullptr, dx, dp, R, c.T, c.H, c.hd, c.theta, false, o),
                          cudaSuccess, "tcu_rope");
            return std::vector<Bytes>{as_bytes(o, x.size())};
        });
        std::vector<float> g = from_bytes<float>(got[0]);
        expect_near("out", g.data(), want.data(), g.size(), [&](size_t i) {
            int64_t r = (int64_t)i / D;
            double mx = 0;
            for (int64_t e = 0; e < D; e++) mx = std::max(mx, (double)std::fabs(x[r * D + e]));
            return 1e-6 * (1.0 + 0.24 * pos[r % c.T]) * mx;
        });
        end_case();
    }
}

/* The deferred check of asynchronous issue: the first bad id claims an empty
 * record (any bad one: which thread finds it first is not fixed, but every
 * schedule must leave a bad one, with its value and the range), a claimed
 * record is kept, and all-good ids leave the record alone. */
void test_range_record() {
    struct C {
        int64_t n, hi, base;
        std::vector<int64_t> bad;
        int32_t kind0; /* the record's kind before the launch (0: empty) */
    } cs[] = {{1000, 500, 0, {}, 0},          {1000, 500, 7, {900, 700, 3}, 0}, {70000, 3, 40, {69999}, 0},
              {300, (int64_t)1 << 40, 0, {299}, 0}, {100, 50, 0, {10}, 2}};
    for (const C &c : cs) {
        begin_case("n=%lld hi=%lld bad=%zu record %s", (long long)c.n, (long long)c.hi, c.bad.size(),
                   c.kind0 ? "claimed" : "empty");
        std::vector<int32_t> ids(c.n);
        for (auto &v : ids) v = (int32_t)(rnd() % (uint64_t)std::min(c.hi, (int64_t)INT32_MAX));
        for (size_t j = 0; j < c.bad.size(); j++)
            ids[c.bad[j]] = j % 2 ? -1 - irand(5) : (int32_t)std::min(c.hi, (int64_t)INT32_MAX - 3) + irand(3);
        if (c.hi > INT32_MAX) ids[c.bad.empty() ? 0 : c.bad[0]] = -9; /* the only way below a range that large */
        std::vector<int32_t> rec0 = {c.kind0, 11, 22, 33};
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            int32_t *di = d.put(ids, 4, "ids");
            int32_t *rec = d.put(rec0, 0, "record");
            expect_status(emu::tcu_range_record(nullptr, di, c.n, c.hi, 1, c.base, rec), cudaSuccess,
                          "tcu_range_record");
            expect_launches({(const void *)emu::k_range_record});
            std::vector<int32_t> r = from_bytes<int32_t>(as_bytes(rec, 4));
            /* which bad id claims the record may differ between schedules:
             * return only what every schedule must agree on */
            int32_t ok = c.kind0 || c.bad.empty() ? r == rec0
                                               : r[0] == 1 && r[3] == (int32_t)std::min(c.hi, (int64_t)INT32_MAX) &&
                                                     r[1] >= c.base && r[1] < c.base + c.n &&
                                                     ids[r[1] - c.base] == r[2] &&
                                                     std::find(c.bad.begin(), c.bad.end(), r[1] - c.base) !=
                                                         c.bad.end();
            return std::vector<Bytes>{as_bytes(&ok, 1)};
        });
        if (!from_bytes<int32_t>(got[0])[0]) fail("the record does not name a bad id (or changed when it must not)");
        end_case();
    }
    begin_case("kind 0 refused, n=0 launches nothing");
    emu::launch_log.clear();
    {
        emu::Buffer rec(16);
        expect_status(emu::tcu_range_record(nullptr, nullptr, 0, 5, 1, 0, rec.as<int32_t>()), cudaSuccess, "n=0");
        expect_status(emu::tcu_range_record(nullptr, nullptr, 4, 5, 0, 0, rec.as<int32_t>()), cudaErrorInvalidValue,
                      "kind 0");
    }
    expect_launches({});
    end_case();
}

/* Positions out of the cache reach the kernels when their range check is
 * still queued (asynchronous issue): the cache write skips those rows and
 * both attention kernels read no key past the cache (buffers end at guard
 * pages), whatever they compute; rows with good positions are written as
 * usual. */
void test_attention_bad_positions() {
    for (int tiled = 0; tiled < 2; tiled++) {
        const int64_t B = 1, T = tiled ? 64 : 3, C = 80, H = 2, KV = 1, hd = 64, kd = KV * hd, qd = H * hd;
        begin_case("%s kernel, positions -4 and C+9 among good ones", tiled ? "tiled" : "per-row");
        std::vector<int32_t> pos(T);
        for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t;
        pos[1] = -4;
        pos[T - 1] = (int32_t)C + 9;
        std::vector<float> q = frands((size_t)(T * qd)), k = frands((size_t)(T * kd)), v = frands((size_t)(T * kd));
        std::vector<float> kc = frands((size_t)(C * kd)), vc = frands((size_t)(C * kd));
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dq = d.put(q, 0, "q"), *dk = d.put(k, 0, "k"), *dv = d.put(v, 0, "v");
            int32_t *dp = d.put(pos, 0, "pos");
            float *dkc = d.put(kc, 0, "kcache"), *dvc = d.put(vc, 0, "vcache");
            float *o = (float *)d.put(nullptr, q.size() * 4, 0, "o");
            expect_status(emu::tcu_cache_write(nullptr, dk, dv, dp, B, T, C, kd, dkc, dvc), cudaSuccess,
                          "tcu_cache_write");
            expect_status(emu::tcu_attention(nullptr, dq, dp, dkc, dvc, o, B, T, C, (int)H, (int)KV, (int)hd,
                                             !tiled),
                          cudaSuccess, "tcu_attention");
            return std::vector<Bytes>{as_bytes(dkc, kc.size()), as_bytes(dvc, vc.size())};
        });
        /* the caches: rows of good positions written, the rest untouched */
        std::vector<float> kw = kc, vw = vc;
        for (int64_t t = 0; t < T; t++)
            if (pos[t] >= 0 && pos[t] < C)
                for (int64_t e = 0; e < kd; e++) {
                    kw[pos[t] * kd + e] = k[t * kd + e];
                    vw[pos[t] * kd + e] = v[t * kd + e];
                }
        expect_same("kcache", got[0], as_bytes(kw.data(), kw.size()), 4);
        expect_same("vcache", got[1], as_bytes(vw.data(), vw.size()), 4);
        end_case();
    }
}

/* ------------------------------------------------------------- attention */

enum { P_PREFILL, P_CONTINUE, P_RANDOM, P_DESCENDING, P_DECODE, P_POISONED };
const char *pmode_name[] = {"0..T-1", "continuing", "random", "descending", "decode", "NaN in range"};

struct AttnCase {
    int B, T, C, H, KV, hd, pmode;
    bool rows_only = false;           /* the launcher's rows_only (TIDE_CUDA_ATTENTION=rows) */
    size_t optin = 99 * 1024;         /* the device's opt-in limit */
    unsigned qoff = 0;                /* q's address mod 16 */
};

void attention_case(const AttnCase &c) {
    begin_case("B=%d T=%d C=%d H=%d KV=%d hd=%d pos %s%s%s q%%16=%u", c.B, c.T, c.C, c.H, c.KV, c.hd,
               pmode_name[c.pmode], c.rows_only ? " rows_only" : "",
               c.optin < 96 * 1024 ? " opt-in 48 KiB" : "", c.qoff);
    const int64_t B = c.B, T = c.T, C = c.C, R = B * T, qd = (int64_t)c.H * c.hd, kd = (int64_t)c.KV * c.hd;
    std::vector<int32_t> pos(T);
    for (int64_t t = 0; t < T; t++) {
        switch (c.pmode) {
        case P_PREFILL: pos[t] = (int32_t)t; break;
        case P_CONTINUE: pos[t] = (int32_t)(C - T - 3 + t); break;
        case P_RANDOM:
        case P_POISONED: pos[t] = t % 5 == 3 ? pos[t - 1] : irand(c.C); break; /* repeats: the last t wins */
        case P_DESCENDING: pos[t] = (int32_t)(C - 1 - t); break;
        case P_DECODE: pos[t] = (int32_t)(C - T + t); break;
        }
    }
    int maxpos = *std::max_element(pos.begin(), pos.end());
    std::vector<float> q = frands((size_t)(R * qd)), k = frands((size_t)(R * kd)), v = frands((size_t)(R * kd));
    /* the caches: earlier tokens' rows, NaN past every position (never
     * written: reading them would show) */
    std::vector<float> kc = frands((size_t)(B * C * kd)), vc = frands((size_t)(B * C * kd));
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = maxpos + 1; j < C; j++)
            for (int64_t e = 0; e < kd; e++) kc[(b * C + j) * kd + e] = vc[(b * C + j) * kd + e] = NAN;
    if (c.pmode == P_POISONED) {
        /* a NaN in the key of one row no token writes and in the value of
         * another, below some positions only: the rows whose range covers
         * them give NaN, the others must not see them (a masked score is
         * replaced, never computed on; P.V stops at each row's last key,
         * as 0 * NaN would be NaN) */
        std::vector<bool> written(C);
        for (int32_t p : pos) written[p] = true;
        int n = 0;
        for (int64_t j = maxpos / 2; j > 0 && n < 2; j--)
            if (!written[j]) {
                for (int64_t b = 0; b < B; b++) (n ? vc : kc)[(b * C + j) * kd + irand((int)kd)] = NAN;
                n++;
            }
    }
    std::vector<float> kc_want = kc, vc_want = vc, o_want((size_t)(R * qd));
    tk_attn_dims dims = {B, T, C, c.H, c.KV, c.hd, TIDE_F32};
    int64_t bad = -1;
    if (tk_attention(q.data(), k.data(), v.data(), pos.data(), kc_want.data(), vc_want.data(), o_want.data(), &dims,
                     &bad, 1) != TIDE_OK)
        fail("tk_attention failed");

    const size_t smem = (size_t)3 * 64 * (c.hd <= 64 ? 64 : 128) * 4;
    const bool tiled = !c.rows_only && T >= TCU_ATTN_TILED_MIN_T && c.hd <= TCU_ATTN_TILED_MAX_HD &&
                       (smem <= emu::default_smem_limit || smem <= c.optin);
    const void *want_k = !tiled       ? (const void *)emu::k_attention<TIDE_F32>
                         : c.hd <= 64 ? (const void *)emu::k_attention_tiled<64, TIDE_F32>
                                      : (const void *)emu::k_attention_tiled<128, TIDE_F32>;
    emu::optin_limit = c.optin; /* another device: its opt-ins start afresh */
    emu::func_attrs.clear();
    std::vector<Bytes> got = under_schedules([&](int) {
        Dev d;
        float *dq = d.put(q, c.qoff, "q"), *dk = d.put(k, 0, "k"), *dv = d.put(v, 0, "v");
        int32_t *dp = d.put(pos, 0, "pos");
        float *dkc = d.put(kc, 0, "kcache"), *dvc = d.put(vc, 0, "vcache");
        float *o = (float *)d.put(nullptr, q.size() * 4, 0, "o");
        expect_status(emu::tcu_cache_write(nullptr, dk, dv, dp, B, T, C, kd, dkc, dvc), cudaSuccess,
                      "tcu_cache_write");
        expect_launches({(const void *)emu::k_cache_write<TIDE_F32>});
        emu::launch_log.clear();
        expect_status(emu::tcu_attention(nullptr, dq, dp, dkc, dvc, o, B, T, C, c.H, c.KV, c.hd, c.rows_only),
                      cudaSuccess, "tcu_attention");
        expect_launches({want_k});
        return std::vector<Bytes>{as_bytes(dkc, kc.size()), as_bytes(dvc, vc.size()), as_bytes(o, q.size())};
    });
    emu::optin_limit = 99 * 1024;
    emu::func_attrs.clear();
    expect_same("kcache", got[0], as_bytes(kc_want.data(), kc.size()), 4);
    expect_same("vcache", got[1], as_bytes(vc_want.data(), vc.size()), 4);
    std::vector<float> g = from_bytes<float>(got[2]);
    expect_near("o", g.data(), o_want.data(), g.size(), [](size_t) { return 1e-5; });
    end_case();
}

void test_attention() {
    const size_t k48 = 48 * 1024;
    std::vector<AttnCase> cs = {
        /* the query-tiled kernel */
        {1, 16, 16, 2, 1, 64, P_PREFILL},
        {2, 17, 40, 4, 2, 33, P_PREFILL},
        {1, 64, 100, 2, 2, 128, P_CONTINUE},
        {1, 65, 70, 3, 1, 80, P_PREFILL},
        {1, 100, 300, 2, 1, 64, P_RANDOM},
        {2, 20, 150, 2, 2, 32, P_DESCENDING},
        {1, 40, 200, 2, 2, 128, P_POISONED},
        {1, 16, 30, 2, 1, 8, P_CONTINUE},
        {1, 30, 30, 2, 1, 128, P_PREFILL, false, 99 * 1024, 4},
        {1, 130, 140, 1, 1, 64, P_PREFILL},
        {1, 16, 20, 2, 1, 64, P_PREFILL, false, k48}, /* 48 KiB needs no opt-in */
        /* the per-row kernel */
        {2, 1, 300, 4, 2, 64, P_DECODE},
        {1, 3, 200, 2, 1, 256, P_DECODE},
        {1, 2, 50, 2, 2, 512, P_RANDOM},
        {1, 5, 10, 3, 1, 100, P_PREFILL},
        {1, 20, 64, 2, 1, 200, P_CONTINUE},
        {1, 17, 40, 2, 1, 64, P_POISONED, true},
        {1, 16, 20, 2, 1, 96, P_PREFILL, false, k48}, /* the tiled kernel's 96 KiB refused */
        {1, 4, 150, 1, 1, 7, P_RANDOM},
    };
    const size_t listed = cs.size();
    {
        /* a grid of shapes (a quarter of it with --quick): query counts
         * around the tiled kernel's threshold and tiles, grouped-query
         * ratios, head dims of both kernels and both load paths, every kind
         * of positions */
        int i = 0;
        for (int T : {1, 2, 16, 17, 33, 64, 100})
            for (auto hk : {std::make_pair(4, 4), std::make_pair(4, 2), std::make_pair(8, 1)})
                for (int hd : {32, 64, 80, 128, 33}) {
                    int pm = i % 6, B = 1 + i % 2, C = 0;
                    switch (pm) {
                    case P_PREFILL: C = T + i % 40; break;
                    case P_CONTINUE: C = T + 3 + i % 150; break;
                    case P_DESCENDING: C = T + i % 20; break;
                    case P_DECODE: C = T + 100 + i % 100; break;
                    default: C = 300; break;
                    }
                    cs.push_back({B, T, C, hk.first, hk.second, hd, pm});
                    i++;
                }
        /* edge head dims: of the tiled kernel (padding to 32, scalar loads)
         * at and past its threshold, beyond it for the per-row one */
        for (int hd : {1, 2, 7, 8, 63, 65, 127, 129, 160, 256, 512})
            for (int T : {hd <= 128 ? 16 : 2, hd <= 128 ? 70 : 16})
                for (int pm : {P_PREFILL, P_RANDOM})
                    cs.push_back({1 + (hd & 1), T, pm == P_RANDOM ? 150 : T + 3, 4, 2, hd, pm});
        /* just below the tiled kernel's threshold */
        for (int hd : {32, 128}) cs.push_back({2, 15, 40, 4, 2, hd, P_RANDOM});
        /* long prefills: several key tiles per block, rows of one query tile
         * ending in different key tiles */
        for (int pm : {P_PREFILL, P_CONTINUE, P_RANDOM, P_DESCENDING, P_POISONED})
            cs.push_back({1, 200, 400, 2, 1, 64, pm});
        cs.push_back({1, 130, 1000, 2, 2, 128, P_RANDOM});
        cs.push_back({2, 65, 65, 2, 1, 96, P_PREFILL});
    }
    for (size_t i = 0; i < cs.size(); i++)
        if (!quick || i < listed || i % 4 == 0) attention_case(cs[i]);
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer b(4096);
        float *f = b.as<float>();
        int32_t *p = b.as<int32_t>();
        expect_status(emu::tcu_attention(nullptr, f, p, f, f, f, 1, 1, 4, 2, 1, 513, false), cudaErrorInvalidValue,
                      "hd=513");
        expect_status(emu::tcu_attention(nullptr, f, p, f, f, f, 1, 1, 4, 3, 2, 8, false), cudaErrorInvalidValue,
                      "H%KV");
        expect_status(emu::tcu_attention(nullptr, f, p, f, f, f, 1, 1, 4, 2, 0, 8, false), cudaErrorInvalidValue,
                      "KV=0");
        expect_status(emu::tcu_attention(nullptr, f, p, f, f, f, 0, 1, 4, 2, 1, 8, false), cudaSuccess, "B=0");
        expect_status(emu::tcu_cache_write(nullptr, f, f, p, 1, 0, 4, 8, f, f), cudaSuccess, "T=0");
    }
    expect_launches({});
    end_case();
}

/* ATTENTION without a cache (a training forward): the backend passes k and v
 * as the caches of T positions (positions 0..T-1), and the result is the
 * CPU's tk_attention_nocache within attention's bound, on both kernels. */
void test_attention_nocache() {
    struct C {
        int B, T, H, KV, hd;
        bool rows_only;
    } cs[] = {{2, 5, 4, 2, 16, false},   {1, 40, 2, 1, 64, false}, {2, 17, 4, 4, 80, false},
              {1, 20, 4, 2, 128, false}, {1, 9, 2, 1, 200, false}, {1, 33, 4, 2, 64, true}};
    for (const C &c : cs) {
        begin_case("B=%d T=%d H=%d KV=%d hd=%d%s", c.B, c.T, c.H, c.KV, c.hd, c.rows_only ? " rows_only" : "");
        const int64_t R = (int64_t)c.B * c.T, qd = (int64_t)c.H * c.hd, kd = (int64_t)c.KV * c.hd;
        std::vector<float> q = frands((size_t)(R * qd)), k = frands((size_t)(R * kd)), v = frands((size_t)(R * kd));
        std::vector<int32_t> pos(c.T);
        for (int t = 0; t < c.T; t++) pos[t] = t;
        std::vector<float> want((size_t)(R * qd));
        tk_attn_dims dims = {c.B, c.T, c.T, c.H, c.KV, c.hd, TIDE_F32};
        int64_t bad = -1;
        if (tk_attention_nocache(q.data(), k.data(), v.data(), pos.data(), want.data(), &dims, &bad, 1) != TIDE_OK)
            fail("tk_attention_nocache failed");
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dq = d.put(q, 0, "q"), *dk = d.put(k, 0, "k"), *dv = d.put(v, 0, "v");
            int32_t *dp = d.put(pos, 0, "pos");
            float *o = (float *)d.put(nullptr, q.size() * 4, 0, "o");
            expect_status(emu::tcu_attention(nullptr, dq, dp, dk, dv, o, c.B, c.T, c.T, c.H, c.KV, c.hd, c.rows_only),
                          cudaSuccess, "tcu_attention");
            return std::vector<Bytes>{as_bytes(o, q.size()), as_bytes(dk, k.size()), as_bytes(dv, v.size())};
        });
        expect_same("k", got[1], as_bytes(k.data(), k.size()), 4); /* read only */
        expect_same("v", got[2], as_bytes(v.data(), v.size()), 4);
        std::vector<float> g = from_bytes<float>(got[0]);
        expect_near("o", g.data(), want.data(), g.size(), [](size_t) { return 1e-5; });
        end_case();
    }
}

/* ------------------------------------------------------------- elementwise */

/* SILU_MUL (add false) or ADD, out of place and in place, with the extremes
 * of expf's range, infinities and NaN among the inputs. */
void test_elementwise(bool add) {
    const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 20.0f, -20.0f, 88.0f, -88.0f, 89.0f, -89.0f, 100.0f,
                              -100.0f, 1e-30f, -1e-30f, INFINITY, -INFINITY, NAN, 3.4e38f, -3.4e38f, 1e-45f};
    for (size_t n : {(size_t)5000, (size_t)1, (size_t)70001}) {
        const bool inplace = n == 5000;
        begin_case("n=%zu%s", n, inplace ? " in place" : "");
        std::vector<float> g = frands(n, 20.0f), u = frands(n, 3.0f);
        for (size_t i = 0; i < sizeof specials / sizeof *specials && i < n; i++) g[i] = specials[i];
        std::vector<float> want(n);
        if (add) tk_add(g.data(), u.data(), want.data(), (int64_t)n, 1);
        else tk_silu_mul(g.data(), u.data(), want.data(), (int64_t)n, 1);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dg = d.put(g, 4, "a"), *du = d.put(u, 0, "b");
            float *o = inplace ? (add ? du : dg) : (float *)d.put(nullptr, n * 4, 8, "out");
            expect_status(add ? emu::tcu_add(nullptr, dg, du, o, (int64_t)n)
                              : emu::tcu_silu_mul(nullptr, dg, du, o, (int64_t)n),
                          cudaSuccess, add ? "tcu_add" : "tcu_silu_mul");
            return std::vector<Bytes>{as_bytes(o, n)};
        });
        if (add) {
            expect_same("out", got[0], as_bytes(want.data(), n), 4);
        } else {
            std::vector<float> r = from_bytes<float>(got[0]);
            expect_near("out", r.data(), want.data(), n, [&](size_t i) { return 1e-7 + 1e-6 * std::fabs(want[i]); });
        }
        end_case();
    }
    begin_case("n=0");
    emu::launch_log.clear();
    expect_status(add ? emu::tcu_add(nullptr, nullptr, nullptr, nullptr, 0)
                      : emu::tcu_silu_mul(nullptr, nullptr, nullptr, nullptr, 0),
                  cudaSuccess, "n=0");
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- add_bias */

/* ADD_BIAS: rows plus a bias of each weight dtype (any bits: the same float
 * adds on both sides), the same bits as the CPU kernel. */
void test_add_bias() {
    struct C {
        tide_dtype dt;
        int64_t R, N;
    } cs[] = {{TIDE_F32, 7, 96}, {TIDE_F16, 1, 513}, {TIDE_BF16, 5, 1030}, {TIDE_BF16, 1, 1}};
    for (const C &c : cs) {
        begin_case("%s R=%lld N=%lld", dtn(c.dt), (long long)c.R, (long long)c.N);
        Bytes bias = random_bytes((size_t)c.N * tide_dtype_size(c.dt));
        std::vector<float> x = frands((size_t)(c.R * c.N), 4.0f), want(x.size());
        tk_add_bias(x.data(), bias.data(), c.dt, c.R, c.N, want.data(), 1);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dx = d.put(x, 4, "x");
            void *db = d.put(bias.data(), bias.size(), 2, "bias");
            float *o = (float *)d.put(nullptr, x.size() * 4, 8, "out");
            expect_status(emu::tcu_add_bias(nullptr, dx, db, c.dt, c.R, c.N, o), cudaSuccess, "tcu_add_bias");
            return std::vector<Bytes>{as_bytes(o, x.size())};
        });
        expect_same("out", got[0], as_bytes(want.data(), want.size()), 4);
        end_case();
    }
}

/* ------------------------------------------------------------- argmax */

void test_argmax() {
    struct C {
        int64_t R, V;
    } cs[] = {{3, 1}, {4, 31}, {6, 1000}, {2, 256}, {3, 5000}, {9, 300}};
    for (const C &c : cs) {
        begin_case("R=%lld V=%lld", (long long)c.R, (long long)c.V);
        std::vector<float> x = frands((size_t)(c.R * c.V));
        for (int64_t r = 0; r < c.R; r++) {
            float *row = &x[r * c.V];
            switch (r % 6) {
            case 0: break;
            case 1: /* the maximum at several places: the first wins */
                for (int i = 0; i < 3; i++) row[irand((int)c.V)] = 2.0f;
                break;
            case 2: /* NaNs: the first NaN wins over everything */
                row[irand((int)c.V)] = NAN;
                row[irand((int)c.V)] = bits_f(0xffc00001u);
                row[irand((int)c.V)] = INFINITY;
                break;
            case 3: /* all -inf: index 0 */
                for (int64_t i = 0; i < c.V; i++) row[i] = -INFINITY;
                break;
            case 4: /* +inf twice, -0 and +0 ties elsewhere */
                row[irand((int)c.V)] = INFINITY;
                row[irand((int)c.V)] = INFINITY;
                break;
            case 5: /* all equal */
                for (int64_t i = 0; i < c.V; i++) row[i] = i % 2 ? 0.0f : -0.0f;
                break;
            }
        }
        std::vector<int32_t> want(c.R);
        tk_argmax(x.data(), c.R, c.V, want.data(), 1);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dx = d.put(x, 0, "x");
            int32_t *o = (int32_t *)d.put(nullptr, (size_t)c.R * 4, 0, "out");
            expect_status(emu::tcu_argmax(nullptr, dx, c.R, c.V, o), cudaSuccess, "tcu_argmax");
            return std::vector<Bytes>{as_bytes(o, (size_t)c.R)};
        });
        expect_same("out", got[0], as_bytes(want.data(), want.size()), 4);
        end_case();
    }
}

/* ------------------------------------------------------------- generic */

void test_generic() {
    struct C {
        std::vector<uint64_t> in_bytes;
        int k;
        uint64_t n;
        int inplace; /* the input the output is (in_bytes == n), or -1 */
    } cs[] = {
        {{}, 0, 100, -1},
        {{1}, 3, 1000, -1},
        {{7, 1000, 5000}, 2, 1000, -1},
        {{1, 2, 3, 64, 255, 256, 257, 70000}, 5, 70000, -1},
        {{500, 13}, 1, 500, 0},
    };
    static_assert(TIDE_OP_MAX_IN == 8, "the case with every input assumes 8");
    for (const C &c : cs) {
        int n_in = (int)c.in_bytes.size();
        begin_case("n_in=%d k=%d n=%llu%s", n_in, c.k, (unsigned long long)c.n, c.inplace >= 0 ? " in place" : "");
        std::vector<Bytes> in(n_in);
        for (int i = 0; i < n_in; i++) in[i] = random_bytes(c.in_bytes[i]);
        /* the reference: outputs 0..k-1 to scratch, output k as the case says */
        Bytes want = c.inplace >= 0 ? in[c.inplace] : random_bytes(c.n);
        Bytes out0 = want;
        std::vector<Bytes> scratch(c.k, Bytes(c.n));
        std::vector<const uint8_t *> ip(n_in);
        for (int i = 0; i < n_in; i++) ip[i] = i == c.inplace ? want.data() : in[i].data();
        std::vector<uint8_t *> op(c.k + 1);
        std::vector<uint64_t> ob(c.k + 1, c.n);
        for (int j = 0; j < c.k; j++) op[j] = scratch[j].data();
        op[c.k] = want.data();
        tk_generic(n_in, ip.data(), c.in_bytes.data(), c.k + 1, op.data(), ob.data(), 1);
        std::vector<Bytes> got = under_schedules([&](int s) {
            Dev d;
            std::vector<const uint8_t *> dp(n_in);
            for (int i = 0; i < n_in; i++) dp[i] = d.put(in[i], (unsigned)(i + s) % 16, "in");
            uint8_t *o = c.inplace >= 0 ? (uint8_t *)dp[c.inplace] : d.put(out0, 3, "out");
            expect_status(emu::tcu_generic(nullptr, n_in, dp.data(), c.in_bytes.data(), c.k, o, c.n), cudaSuccess,
                          "tcu_generic");
            return std::vector<Bytes>{as_bytes(o, c.n)};
        });
        expect_same("out", got[0], want, 1);
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    expect_status(emu::tcu_generic(nullptr, 9, nullptr, nullptr, 0, nullptr, 5), cudaErrorInvalidValue, "n_in=9");
    expect_status(emu::tcu_generic(nullptr, 1, nullptr, nullptr, 0, nullptr, 0), cudaSuccess, "n=0");
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- round to 16 */

void test_round16() {
    /* values around every boundary of both formats, then random bits and
     * random magnitudes */
    std::vector<float> src = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN, bits_f(0x7f800001u),
                              bits_f(0xffbfffffu), 65504.0f, -65504.0f, 65519.99f, 65520.0f, -65520.0f, 65536.0f,
                              3.4e38f, bits_f(0x7f7fffffu), bits_f(0x7f7f8000u), bits_f(0x7f7f7fffu), 1e-45f,
                              bits_f(0x00800000u), 0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1.8p-24f, 0x1p-14f,
                              0x1.ffcp-15f, 0x1.ffep-15f, 0x1.002p0f, 0x1.001p0f, 0x1.003p0f, 0x1.0001p0f,
                              0x1.00018p0f, 0x1.00008p0f};
    for (size_t i = 0; i < 30000; i++) src.push_back(bits_f((uint32_t)rnd()));
    for (size_t i = 0; i < 10000; i++) src.push_back(frand() * std::ldexp(1.0f, irand(60) - 30));
    for (size_t i = 0; i < 2000; i++) { /* exact ties of both formats */
        uint32_t u = (uint32_t)rnd() & 0x4fffe000u;
        src.push_back(bits_f(u | 0x1000u));
        src.push_back(bits_f((u & 0xffff0000u) | 0x8000u));
    }
    struct C {
        tide_dtype dt;
        size_t n;
        unsigned soff, doff;
    } cs[] = {{TIDE_BF16, src.size() & ~(size_t)1, 0, 0}, {TIDE_BF16, (src.size() - 1) | 1, 4, 0},
              {TIDE_F16, src.size() | 1, 4, 0},            {TIDE_F16, src.size() & ~(size_t)1, 0, 2},
              {TIDE_F16, (src.size() - 1) | 1, 0, 0},       {TIDE_BF16, 3, 4, 2},
              {TIDE_F16, 1, 0, 0}};
    for (const C &c : cs) {
        begin_case("%s n=%zu src%%16=%u dst%%16=%u", dtn(c.dt), c.n, c.soff, c.doff);
        std::vector<float> s(src.begin(), src.begin() + (std::ptrdiff_t)c.n);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *ds = d.put(s, c.soff, "src");
            uint16_t *o = (uint16_t *)d.put(nullptr, c.n * 2, c.doff, "dst");
            expect_status(emu::tcu_round_to_16(nullptr, ds, c.dt, o, (int64_t)c.n), cudaSuccess, "tcu_round_to_16");
            bool paired = c.soff % 8 == 0 && c.doff % 4 == 0;
            const void *want_k = c.dt == TIDE_BF16 ? (paired ? (const void *)emu::k_round16<TIDE_BF16>
                                                             : (const void *)emu::k_round16_unaligned<TIDE_BF16>)
                                                   : (paired ? (const void *)emu::k_round16<TIDE_F16>
                                                             : (const void *)emu::k_round16_unaligned<TIDE_F16>);
            expect_launches({want_k});
            return std::vector<Bytes>{as_bytes(o, c.n)};
        });
        std::vector<uint16_t> g = from_bytes<uint16_t>(got[0]);
        for (size_t i = 0; i < c.n; i++) {
            uint16_t w = c.dt == TIDE_BF16 ? tide_f32_to_bf16(s[i]) : tide_f32_to_f16(s[i]);
            bool nan_in = std::isnan(s[i]);
            bool nan_out = c.dt == TIDE_BF16 ? (g[i] & 0x7fff) > 0x7f80 : (g[i] & 0x7fff) > 0x7c00;
            if (nan_in ? !nan_out : g[i] != w)
                fail("dst[%zu] = %#06x for %a (bits %#010x), want %#06x", i, g[i], (double)s[i], f_bits(s[i]), w);
        }
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer s(16), o(16);
        expect_status(emu::tcu_round_to_16(nullptr, s.as<float>(), TIDE_F32, o.p, 2), cudaErrorInvalidValue, "f32");
        expect_status(emu::tcu_round_to_16(nullptr, s.as<float>(), TIDE_BF16, o.p, 0), cudaSuccess, "n=0");
    }
    expect_launches({});
    end_case();
}

} /* namespace */

int main(int argc, char **argv) {
    return run_tests(argc, argv, "CUDA kernels (src/backend/cuda) on the host emulation, against the CPU kernels",
                     {
                         {"emulation", test_selfcheck},
                         {"convert", test_convert},
                         {"range_check", test_range_check},
                         {"range_record", test_range_record},
                         {"embed", test_embed},
                         {"rmsnorm", test_rmsnorm},
                         {"matmul_fused", test_matmul},
                         {"rope", test_rope},
                         {"attention", test_attention},
                         {"attention_bad_pos", test_attention_bad_positions},
                         {"attention_nocache", test_attention_nocache},
                         {"silu_mul", [] { test_elementwise(false); }},
                         {"add", [] { test_elementwise(true); }},
                         {"add_bias", test_add_bias},
                         {"argmax", test_argmax},
                         {"generic", test_generic},
                         {"round_to_16", test_round16},
                     },
                     {emu::emu_kernels_cuda_kernels, emu::emu_kernels_cuda_gemm}, "test_cuda_emu.cpp");
}
