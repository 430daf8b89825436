/*
 * test_cuda_emu_train.cpp - the CUDA backend's training kernels
 * (cuda_train.h), run on the host by the emulation of cuda_emu.h and
 * compared with the CPU's training kernels (src/backend/cpu/kernels.h), as
 * test_cuda_emu.cpp does for the forward kernels (the same harness,
 * emu_check.h): every case under the three schedules (threads, blocks and
 * buffer placement reordered, grid caps lowered so that grid-stride loops
 * go round, shared memory poisoned), which must give the same bits, then
 * against the CPU with the bounds of tests/test_kernels_train.c:
 *
 *   - EMBED_BWD (f32 sums in row order; the whole gradient or a block of
 *     it), ADAMW (every operation rounded as the CPU's, the 16-bit
 *     roundings included), widening columns, the id checks: exact;
 *   - RMSNORM_BWD, SILU_MUL_BWD: 1e-5 of the scale of the element's terms
 *     (dw's sums in double over blocks of rows, added in order: rounded
 *     once, so one block gives the CPU's bits);
 *   - ATTENTION_BWD: 5e-6 * max|ref| of each gradient;
 *   - MATMUL's forms without BLAS: 2e-5 * sum |x_k w_k| (+ |previous|);
 *   - CROSS_ENTROPY's rows: the CPU's row arithmetic (ce_row, transcribed
 *     here) within 2 ulp of each gradient element (the sum of the
 *     exponentials in double runs in another order), the loss terms within
 *     1e-12 relative, the loss 1e-6 relative;
 *   - CE_STATS' rows: the CPU's arithmetic (tk_ce_stats' row, transcribed)
 *     with each row's max and target logit exact, its sum of exponentials
 *     within 1 ulp (a double sum in another order, rounded once), the loss
 *     terms those of the rounded statistics; CE_BLOCK's rows (tk_ce_block's,
 *     transcribed; no sums): exact;
 *   - SUMSQ: 1e-6 relative (a double sum rounded once).
 * Launcher contracts (invalid arguments, empty work, too small a
 * workspace) are checked, and every __global__ kernel of cuda_train.cu must
 * have been launched by some case.
 *
 * `--quick` is accepted (sanitizer builds) and changes nothing: the cases
 * are small. -v prints every case with its time; an argument naming an op
 * runs only that op's cases.
 */
#include "tide.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_train.h"

#include <algorithm>

extern "C" {
#include "backend/cpu/kernels.h"
}

#include "cuda_emu.h"

namespace emu {
#include "cuda_train.inc"
} /* namespace emu */

#include "emu_check.h"

namespace {

/* ------------------------------------------------------------- id checks */

/* The check flags the smallest bad index; the record is claimed by a bad
 * one (which one depends on the schedule), or left alone. */
void test_ids() {
    struct C {
        int64_t n, lo, hi;
        bool iota;
        std::vector<int64_t> bad;
    } cs[] = {{1000, 0, 500, false, {}},         {1000, 0, 500, false, {700, 900}}, {70000, INT64_MIN, 30, false, {65537}},
              {40, 0, 40, true, {}},              {40, 0, 40, true, {39, 17}},        {300, INT64_MIN, 7, false, {}},
              {5, 0, 1LL << 40, false, {4}}};
    for (const C &c : cs) {
        begin_case("n=%lld lo=%s hi=%lld%s bad=%zu", (long long)c.n, c.lo == INT64_MIN ? "-inf" : "0", (long long)c.hi,
                   c.iota ? " iota" : "", c.bad.size());
        std::vector<int32_t> ids(c.n);
        for (int64_t i = 0; i < c.n; i++)
            ids[i] = c.iota ? (int32_t)i : c.lo == INT64_MIN ? (int32_t)(rnd() % 60) - 30 : (int32_t)(rnd() % (uint64_t)std::min(c.hi, (int64_t)1 << 30));
        if (c.lo == INT64_MIN)
            for (auto &v : ids) v = std::min(v, (int32_t)c.hi - 1); /* any negative id is good */
        int32_t want = TCU_FLAG_OK;
        for (int64_t b : c.bad) {
            ids[b] = c.iota                                   ? (int32_t)b + 1
                     : c.lo == 0 && (b % 2 || c.hi > INT32_MAX) ? -1 /* below */
                                                                : (int32_t)c.hi; /* at the end */
            want = std::min(want, (int32_t)b);
        }
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            int32_t *di = d.put(ids, 4, "ids");
            int32_t *flag = d.put(std::vector<int32_t>{0}, 0, "flag");
            std::vector<int32_t> rec0 = {0, 0, 0, 0};
            int32_t *rec = d.put(rec0, 0, "record");
            expect_status(emu::tcu_ids_check(nullptr, di, c.n, c.lo, c.hi, c.iota, flag), cudaSuccess, "tcu_ids_check");
            expect_status(emu::tcu_ids_record(nullptr, di, c.n, c.lo, c.hi, c.iota, 4, 100, rec), cudaSuccess,
                          "tcu_ids_record");
            std::vector<int32_t> r = from_bytes<int32_t>(as_bytes(rec, 4));
            int32_t ok = c.bad.empty() ? r == rec0
                                       : r[0] == 4 && r[3] == (int32_t)std::min(c.hi, (int64_t)INT32_MAX) &&
                                             std::find(c.bad.begin(), c.bad.end(), (int64_t)r[1] - 100) != c.bad.end() &&
                                             ids[r[1] - 100] == r[2];
            return std::vector<Bytes>{as_bytes(flag, 1), as_bytes(&ok, 1)};
        });
        if (from_bytes<int32_t>(got[0])[0] != want) fail("flag %#x, want %#x", from_bytes<int32_t>(got[0])[0], want);
        if (!from_bytes<int32_t>(got[1])[0]) fail("the record does not name a bad id (or changed when it must not)");
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer flag(4), rec(16);
        memset(flag.p, 0, 4);
        expect_status(emu::tcu_ids_check(nullptr, nullptr, 0, 0, 5, false, flag.as<int32_t>()), cudaSuccess, "n=0");
        if (*flag.as<int32_t>() != TCU_FLAG_OK) fail("flag not reset for n=0");
        expect_status(emu::tcu_ids_record(nullptr, nullptr, 0, 0, 5, false, 1, 0, rec.as<int32_t>()), cudaSuccess, "n=0");
        expect_status(emu::tcu_ids_record(nullptr, nullptr, 4, 0, 5, false, 0, 0, rec.as<int32_t>()),
                      cudaErrorInvalidValue, "kind 0");
    }
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- matmul forms */

void test_convert_cols() {
    struct C {
        tide_dtype dt;
        int64_t K, N, n0, cnt;
    } cs[] = {{TIDE_F16, 256, 256, 0, 256}, {TIDE_BF16, 256, 300, 17, 100}, {TIDE_F16, 3, 70, 69, 1},
              {TIDE_BF16, 1000, 9, 2, 5}};
    for (const C &c : cs) {
        begin_case("%s K=%lld N=%lld columns %lld..+%lld", dtn(c.dt), (long long)c.K, (long long)c.N, (long long)c.n0,
                   (long long)c.cnt);
        Bytes w = random_bytes((size_t)(c.K * c.N) * 2); /* every bit pattern: NaN payloads, subnormals */
        std::vector<float> want((size_t)(c.K * c.cnt));
        for (int64_t k = 0; k < c.K; k++) tk_convert(&w[(size_t)(k * c.N + c.n0) * 2], c.dt, &want[k * c.cnt], (size_t)c.cnt);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            void *dw = d.put(w.data(), w.size(), 2, "w");
            float *o = (float *)d.put(nullptr, want.size() * 4, 4, "dst");
            expect_status(emu::tcu_convert_cols(nullptr, dw, c.dt, c.K, c.N, c.n0, c.cnt, o), cudaSuccess,
                          "tcu_convert_cols");
            return std::vector<Bytes>{as_bytes(o, want.size())};
        });
        expect_same("dst", got[0], as_bytes(want.data(), want.size()), 4);
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer w(64), o(64);
        expect_status(emu::tcu_convert_cols(nullptr, w.p, TIDE_F32, 2, 2, 0, 2, o.as<float>()), cudaErrorInvalidValue,
                      "f32");
        expect_status(emu::tcu_convert_cols(nullptr, w.p, TIDE_BF16, 2, 2, 0, 0, o.as<float>()), cudaSuccess, "cnt=0");
    }
    expect_launches({});
    end_case();
}

/* The kernel without BLAS against tk_matmul_ex (whose fused path it
 * mirrors for few rows), into a block of a wider output. */
void test_matmul_small() {
    struct C {
        tide_dtype dt;
        int64_t R, K, N, extra;
        bool kn, acc;
    } cs[] = {{TIDE_F32, 1, 64, 40, 0, true, false},   {TIDE_F16, 5, 37, 19, 3, true, true},
              {TIDE_BF16, 16, 72, 24, 0, false, true}, {TIDE_BF16, 20, 96, 300, 5, true, false},
              {TIDE_F32, 3, 13, 9, 1, false, true},    {TIDE_F16, 33, 40, 10, 0, false, true}};
    for (const C &c : cs) {
        const int64_t ldo = c.N + c.extra;
        begin_case("%s R=%lld K=%lld N=%lld ldo=%lld%s%s", dtn(c.dt), (long long)c.R, (long long)c.K, (long long)c.N,
                   (long long)ldo, c.kn ? " no_transpose" : "", c.acc ? " accumulate" : "");
        std::vector<float> x = frands((size_t)(c.R * c.K));
        Bytes w = weights(c.dt, (size_t)(c.N * c.K));
        std::vector<float> out0 = frands((size_t)(c.R * ldo), 10.0f), want = out0;
        if (tk_matmul_ex(x.data(), w.data(), c.dt, c.R, c.K, c.N, c.kn, c.acc, want.data(), ldo, nullptr, 0, 1))
            fail("tk_matmul_ex failed");
        std::vector<float> wf((size_t)(c.N * c.K));
        tk_convert(w.data(), c.dt, wf.data(), wf.size());
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dx = d.put(x, 0, "x");
            void *dw = d.put(w.data(), w.size(), 0, "w");
            float *o = d.put(out0, 0, "out");
            expect_status(emu::tcu_matmul_small(nullptr, dx, dw, c.dt, c.R, c.K, c.N, c.kn, c.acc, o, ldo), cudaSuccess,
                          "tcu_matmul_small");
            return std::vector<Bytes>{as_bytes(o, out0.size())};
        });
        std::vector<float> g = from_bytes<float>(got[0]);
        expect_near("out", g.data(), want.data(), g.size(), [&](size_t i) {
            int64_t r = (int64_t)i / ldo, n = (int64_t)i % ldo;
            if (n >= c.N) return 0.0; /* past the block: untouched */
            double s = c.acc ? std::fabs((double)out0[i]) : 0;
            for (int64_t k = 0; k < c.K; k++) s += std::fabs((double)x[r * c.K + k] * wf[c.kn ? k * c.N + n : n * c.K + k]);
            return 2e-5 * s;
        });
        end_case();
    }
}

/* ------------------------------------------------------------- embed_bwd */

void test_embed_bwd() {
    struct C {
        int64_t V, D, R, vocab0, vocab; /* the gradient's rows: ids [vocab0, vocab0 + V) of vocab */
        bool acc;
    } cs[] = {{50, 33, 12, 0, 50, false},   {300, 300, 40, 0, 300, true},   {7, 600, 9, 0, 7, false},
              {200, 64, 1500, 0, 200, true}, {1, 8, 5, 0, 1, false},        {17, 40, 30, 20, 50, false},
              {100, 300, 200, 150, 250, true}, {3, 8, 40, 0, 10, true}};
    for (const C &c : cs) {
        begin_case("V=%lld D=%lld R=%lld ids %lld.. of %lld%s (ids out of range among them)", (long long)c.V,
                   (long long)c.D, (long long)c.R, (long long)c.vocab0, (long long)c.vocab, c.acc ? " accumulate" : "");
        std::vector<float> dy = frands((size_t)(c.R * c.D));
        std::vector<int32_t> tok(c.R);
        for (auto &t : tok) t = irand((int)c.vocab);
        tok[0] = (int32_t)c.vocab0;
        if (c.R > 3) tok[1] = tok[3] = (int32_t)(c.vocab0 + c.V - 1); /* repeated ids: rows in order */
        std::vector<float> dt0 = c.acc ? frands((size_t)(c.V * c.D), 5.0f) : std::vector<float>((size_t)(c.V * c.D), 0.0f);
        /* the reference runs on the ids of the vocabulary only: the kernel skips the others */
        std::vector<int32_t> good_tok;
        std::vector<float> good_dy;
        std::vector<int32_t> with_bad = tok;
        if (c.R > 4) with_bad[2] = -1, with_bad[4] = (int32_t)c.vocab;
        for (int64_t r = 0; r < c.R; r++)
            if (with_bad[r] >= 0 && with_bad[r] < c.vocab) {
                good_tok.push_back(with_bad[r]);
                good_dy.insert(good_dy.end(), dy.begin() + r * c.D, dy.begin() + (r + 1) * c.D);
            }
        std::vector<float> want = dt0;
        int64_t bad = -1;
        if (tk_embed_bwd_block(good_dy.data(), good_tok.data(), (int64_t)good_tok.size(), c.D, c.V, c.vocab0, c.vocab,
                               true, want.data(), &bad, 1))
            fail("tk_embed_bwd_block failed");
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *ddy = d.put(dy, 4, "dy");
            int32_t *dtk = d.put(with_bad, 0, "tokens");
            float *o = d.put(dt0, 0, "dtable");
            expect_status(emu::tcu_embed_bwd(nullptr, ddy, dtk, c.R, c.D, c.vocab0, c.V, o), cudaSuccess,
                          "tcu_embed_bwd");
            return std::vector<Bytes>{as_bytes(o, dt0.size())};
        });
        expect_same("dtable", got[0], as_bytes(want.data(), want.size()), 4);
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    expect_status(emu::tcu_embed_bwd(nullptr, nullptr, nullptr, 0, 4, 0, 4, nullptr), cudaSuccess, "R=0");
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- rmsnorm_bwd */

void test_rmsnorm_bwd() {
    struct C {
        tide_dtype wdt;
        int64_t R, D;
        size_t blocks; /* dw's row blocks the workspace holds (0: ops.c's ceil(R / 256)) */
        bool acc;
    } cs[] = {{TIDE_F32, 7, 64, 0, false},  {TIDE_F16, 300, 100, 0, true}, {TIDE_BF16, 3, 1000, 0, false},
              {TIDE_F32, 10, 17, 3, true},  {TIDE_BF16, 600, 33, 0, false}, {TIDE_F16, 1, 300, 0, true},
              {TIDE_F32, 40, 300, 7, false}};
    for (const C &c : cs) {
        const size_t nrb = c.blocks ? c.blocks : (size_t)((c.R + 255) / 256);
        const size_t rsb = ((size_t)c.R * 4 + 255) / 256 * 256, wbytes = rsb + nrb * (size_t)c.D * 8;
        begin_case("%s R=%lld D=%lld %zu row block(s)%s", dtn(c.wdt), (long long)c.R, (long long)c.D, nrb,
                   c.acc ? " accumulate" : "");
        std::vector<float> x((size_t)(c.R * c.D)), dy = frands((size_t)(c.R * c.D));
        const float amps[] = {2.0f, 1e-3f, 30.0f};
        for (int64_t r = 0; r < c.R; r++)
            for (int64_t i = 0; i < c.D; i++) x[r * c.D + i] = amps[r % 3] * frand();
        Bytes w = weights(c.wdt, (size_t)c.D, 1.5f);
        std::vector<float> wf((size_t)c.D), dw0 = frands((size_t)c.D), dx_want(x.size()), dw_want = dw0,
                                            rs((size_t)c.R);
        tk_convert(w.data(), c.wdt, wf.data(), wf.size());
        const float eps = 1e-5f;
        tk_rmsnorm_bwd(x.data(), w.data(), c.wdt, dy.data(), c.R, c.D, eps, c.acc, dx_want.data(), dw_want.data(),
                       rs.data(), 1);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dxi = d.put(x, 0, "x"), *ddy = d.put(dy, 4, "dy");
            void *dwt = d.put(w.data(), w.size(), 0, "w");
            float *ddx = (float *)d.put(nullptr, x.size() * 4, 0, "dx"), *ddw = d.put(dw0, 0, "dw");
            void *work = d.put(nullptr, wbytes, 0, "work");
            expect_status(emu::tcu_rmsnorm_bwd(nullptr, dxi, dwt, c.wdt, ddy, c.R, c.D, eps, c.acc, ddx, ddw, work,
                                               wbytes),
                          cudaSuccess, "tcu_rmsnorm_bwd");
            return std::vector<Bytes>{as_bytes(ddx, x.size()), as_bytes(ddw, dw0.size())};
        });
        /* scales of the terms, as test_kernels_train's */
        std::vector<double> mdx(x.size()), mdw((size_t)c.D);
        for (int64_t r = 0; r < c.R; r++) {
            double ss = 0, adot = 0;
            for (int64_t i = 0; i < c.D; i++) ss += (double)x[r * c.D + i] * x[r * c.D + i];
            double rsd = 1 / std::sqrt(ss / (double)c.D + eps);
            for (int64_t i = 0; i < c.D; i++) adot += std::fabs((double)dy[r * c.D + i] * wf[i] * x[r * c.D + i]);
            for (int64_t i = 0; i < c.D; i++) {
                mdx[r * c.D + i] = rsd * std::fabs(dy[r * c.D + i] * wf[i]) +
                                   rsd * rsd * rsd * adot / (double)c.D * std::fabs(x[r * c.D + i]) + rsd;
                mdw[i] += std::fabs((double)dy[r * c.D + i] * x[r * c.D + i] * rsd);
            }
        }
        for (int64_t i = 0; i < c.D; i++) mdw[i] += c.acc ? std::fabs(dw0[i]) : 0;
        std::vector<float> gdx = from_bytes<float>(got[0]), gdw = from_bytes<float>(got[1]);
        expect_near("dx", gdx.data(), dx_want.data(), gdx.size(), [&](size_t i) { return 1e-5 * mdx[i]; });
        if (nrb == 1) /* one block of rows: the CPU's sums in the CPU's order */
            expect_same("dw", got[1], as_bytes(dw_want.data(), dw_want.size()), 4);
        else
            expect_near("dw", gdw.data(), dw_want.data(), gdw.size(), [&](size_t i) { return 1e-5 * mdw[i]; });
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer b(4096);
        float *f = b.as<float>();
        expect_status(emu::tcu_rmsnorm_bwd(nullptr, f, f, TIDE_F32, f, 4, 8, 1e-5f, false, f, f, b.p, 256 + 8 * 7),
                      cudaErrorInvalidValue, "no room for a row of partial sums");
        expect_status(emu::tcu_rmsnorm_bwd(nullptr, f, f, TIDE_I32, f, 4, 8, 1e-5f, false, f, f, b.p, 4096),
                      cudaErrorInvalidValue, "i32 weight");
        expect_status(emu::tcu_rmsnorm_bwd(nullptr, f, f, TIDE_F32, f, 0, 8, 1e-5f, false, f, f, b.p, 0), cudaSuccess,
                      "R=0");
    }
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- silu_mul_bwd */

void test_silu_mul_bwd() {
    const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 20.0f, -20.0f, 88.0f, -88.0f, 89.0f, -89.0f, 200.0f, -200.0f};
    for (size_t n : {(size_t)5000, (size_t)1, (size_t)70001}) {
        const bool inplace = n == 5000;
        begin_case("n=%zu%s", n, inplace ? " in place" : "");
        std::vector<float> g = frands(n, 6.0f), u = frands(n), dy = frands(n);
        for (size_t i = 0; i < sizeof specials / sizeof *specials && i < n; i++) g[i] = specials[i];
        std::vector<float> wg(n), wu(n);
        tk_force_generic(true); /* the portable path: the sigmoid from expf(-g), as the kernel */
        tk_silu_mul_bwd(g.data(), u.data(), dy.data(), wg.data(), wu.data(), (int64_t)n, 1);
        tk_force_generic(false);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dg = d.put(g, 4, "gate"), *du = d.put(u, 0, "up"), *ddy = d.put(dy, 8, "dy");
            float *og = inplace ? dg : (float *)d.put(nullptr, n * 4, 0, "dgate");
            float *ou = inplace ? du : (float *)d.put(nullptr, n * 4, 4, "dup");
            expect_status(emu::tcu_silu_mul_bwd(nullptr, dg, du, ddy, og, ou, (int64_t)n), cudaSuccess,
                          "tcu_silu_mul_bwd");
            return std::vector<Bytes>{as_bytes(og, n), as_bytes(ou, n)};
        });
        std::vector<double> mg(n), mu(n);
        for (size_t i = 0; i < n; i++) {
            double x = g[i], sg = 1 / (1 + std::exp(-x));
            mu[i] = std::fabs(dy[i] * x * sg) + 1e-3;
            mg[i] = std::fabs(dy[i] * u[i]) * (sg + std::fabs(x) * sg * (1 - sg)) + 1e-3;
        }
        std::vector<float> gg = from_bytes<float>(got[0]), gu = from_bytes<float>(got[1]);
        expect_near("dgate", gg.data(), wg.data(), n, [&](size_t i) { return 1e-5 * mg[i]; });
        expect_near("dup", gu.data(), wu.data(), n, [&](size_t i) { return 1e-5 * mu[i]; });
        end_case();
    }
    begin_case("n=0");
    emu::launch_log.clear();
    expect_status(emu::tcu_silu_mul_bwd(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0), cudaSuccess, "n=0");
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- attention_bwd */

void test_attention_bwd() {
    struct C {
        int B, T, H, KV, hd;
    } cs[] = {{2, 5, 4, 2, 16},  {1, 40, 2, 1, 64}, {2, 17, 4, 4, 80}, {1, 20, 4, 2, 128}, {1, 9, 2, 1, 200},
              {1, 6, 2, 2, 300}, {1, 5, 2, 1, 512}, {1, 65, 2, 1, 33}, {2, 33, 6, 2, 8},   {1, 1, 2, 2, 64}};
    for (const C &c : cs) {
        begin_case("B=%d T=%d H=%d KV=%d hd=%d", c.B, c.T, c.H, c.KV, c.hd);
        const int64_t R = (int64_t)c.B * c.T, qd = (int64_t)c.H * c.hd, kd = (int64_t)c.KV * c.hd;
        std::vector<float> q = frands((size_t)(R * qd)), k = frands((size_t)(R * kd)), v = frands((size_t)(R * kd));
        std::vector<float> o = frands((size_t)(R * qd)), dout = frands((size_t)(R * qd));
        std::vector<float> wq(q.size()), wk(k.size()), wv(v.size());
        tk_attn_dims dims = {c.B, c.T, c.T, c.H, c.KV, c.hd, TIDE_F32};
        std::vector<float> work(tk_attention_bwd_work(&dims, 1) / sizeof(float) + 16);
        if (tk_attention_bwd(q.data(), k.data(), v.data(), o.data(), dout.data(), wq.data(), wk.data(), wv.data(), &dims,
                             work.data(), 1))
            fail("tk_attention_bwd failed");
        const size_t nstats = (size_t)TCU_ATTN_BWD_STATS * (size_t)(R * c.H);
        std::vector<Bytes> got = under_schedules([&](int s) {
            Dev d;
            float *dq = d.put(q, 0, "q"), *dk = d.put(k, 4, "k"), *dv = d.put(v, 0, "v");
            float *dO = d.put(o, 0, "o"), *ddo = d.put(dout, 8, "do");
            float *gq = (float *)d.put(nullptr, q.size() * 4, 0, "dq");
            float *gk = (float *)d.put(nullptr, k.size() * 4, (unsigned)(4 * s), "dk");
            float *gv = (float *)d.put(nullptr, v.size() * 4, 0, "dv");
            float *st = (float *)d.put(nullptr, nstats * 4, 0, "stats");
            expect_status(emu::tcu_attention_bwd(nullptr, dq, dk, dv, dO, ddo, gq, gk, gv, c.B, c.T, c.H, c.KV, c.hd, st),
                          cudaSuccess, "tcu_attention_bwd");
            expect_launches({(const void *)emu::k_attn_bwd_stats, (const void *)emu::k_attn_bwd_dkv,
                             (const void *)emu::k_attn_bwd_dq});
            return std::vector<Bytes>{as_bytes(gq, q.size()), as_bytes(gk, k.size()), as_bytes(gv, v.size())};
        });
        const char *names[3] = {"dq", "dk", "dv"};
        const std::vector<float> *want[3] = {&wq, &wk, &wv};
        for (int j = 0; j < 3; j++) {
            double mx = 0;
            for (float f : *want[j]) mx = std::max(mx, (double)std::fabs(f));
            std::vector<float> g = from_bytes<float>(got[j]);
            expect_near(names[j], g.data(), want[j]->data(), g.size(), [&](size_t) { return 5e-6 * mx; });
        }
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer b(4096);
        float *f = b.as<float>();
        expect_status(emu::tcu_attention_bwd(nullptr, f, f, f, f, f, f, f, f, 1, 1, 2, 1, 513, f), cudaErrorInvalidValue,
                      "hd=513");
        expect_status(emu::tcu_attention_bwd(nullptr, f, f, f, f, f, f, f, f, 1, 1, 3, 2, 8, f), cudaErrorInvalidValue,
                      "H%KV");
        expect_status(emu::tcu_attention_bwd(nullptr, f, f, f, f, f, f, f, f, 0, 4, 2, 1, 8, f), cudaSuccess, "B=0");
    }
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- cross_entropy */

/* The CPU's ce_row (kernels_train.c, its portable path), transcribed: the
 * gradient row in place, the loss term returned. */
double ce_row_ref(float *l, int64_t V, int32_t t, float scale) {
    if (t < 0 || t >= V) {
        std::fill(l, l + V, 0.0f);
        return 0;
    }
    float lt = l[t], m = l[0];
    for (int64_t j = 1; j < V; j++) m = l[j] > m ? l[j] : m;
    double sum = 0;
    for (int64_t j = 0; j < V; j++) {
        float e = expf(l[j] - m);
        l[j] = e;
        sum += e;
    }
    float et = l[t], inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < V; j++) l[j] = scale * (l[j] * inv);
    l[t] = (float)((double)scale * ((double)et / sum - 1.0));
    return (double)m + log(sum) - (double)lt;
}

void test_ce_rows() {
    struct C {
        int64_t R, V;
        float amp, scale;
    } cs[] = {{6, 50, 3.0f, 1.0f / 6}, {9, 1000, 10.0f, 0.01f}, {3, 5000, 30.0f, -2.0f}, {70, 300, 1.0f, 1.0f},
              {2, 1, 1.0f, 1.0f}};
    for (const C &c : cs) {
        begin_case("R=%lld V=%lld logits in +-%g scale %g", (long long)c.R, (long long)c.V, c.amp, c.scale);
        std::vector<float> l = frands((size_t)(c.R * c.V), c.amp);
        std::vector<int32_t> tg(c.R);
        for (int64_t r = 0; r < c.R; r++) tg[r] = r % 5 == 2 ? -1 : r % 7 == 3 ? (int32_t)c.V : irand((int)c.V);
        tg[0] = (int32_t)c.V - 1;
        std::vector<float> want = l;
        std::vector<double> terms((size_t)c.R);
        double total = 0;
        for (int64_t r = 0; r < c.R; r++) total += terms[r] = ce_row_ref(&want[r * c.V], c.V, tg[r], c.scale);
        const float loss_want = (float)((double)c.scale * total);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dl = d.put(l, 0, "logits");
            int32_t *dt = d.put(tg, 0, "targets");
            double *dterms = (double *)d.put(nullptr, terms.size() * 8, 0, "terms");
            float *loss = (float *)d.put(nullptr, 4, 0, "loss");
            expect_status(emu::tcu_ce_rows(nullptr, dl, c.R, c.V, dt, c.scale, dterms), cudaSuccess, "tcu_ce_rows");
            expect_status(emu::tcu_ce_loss(nullptr, dterms, c.R, c.scale, false, loss), cudaSuccess, "tcu_ce_loss");
            return std::vector<Bytes>{as_bytes(dl, l.size()), as_bytes(dterms, terms.size()), as_bytes(loss, 1)};
        });
        std::vector<float> g = from_bytes<float>(got[0]);
        /* 2 ulp of the element (its inverse sum differs by the sum's order) */
        expect_near("gradient", g.data(), want.data(), g.size(), [&](size_t i) {
            return 2 * std::ldexp(1.0, std::ilogb(std::max(std::fabs(want[i]), 1e-30f)) - 23);
        });
        std::vector<double> gt = from_bytes<double>(got[1]);
        for (int64_t r = 0; r < c.R; r++)
            if (!(std::fabs(gt[r] - terms[r]) <= 1e-12 * std::fabs(terms[r]) + 1e-300))
                fail("term %lld = %.17g, want %.17g", (long long)r, gt[r], terms[r]);
        float lg = from_bytes<float>(got[2])[0];
        if (!(std::fabs((double)lg - loss_want) <= 1e-6 * std::fabs((double)loss_want)))
            fail("loss %.9g, want %.9g", lg, loss_want);
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    expect_status(emu::tcu_ce_rows(nullptr, nullptr, 0, 5, nullptr, 1.0f, nullptr), cudaSuccess, "R=0");
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- cross_entropy in vocabulary blocks */

/* tk_ce_stats' row (kernels_train.c, its portable path), transcribed: the
 * block's statistics of l (Vb) merged into in (NULL: the first block) at o;
 * returns the row's loss term from the rounded statistics. */
double ce_stats_row_ref(const float *l, int64_t Vb, int64_t t, const float *in, float *o) {
    float m = l[0];
    for (int64_t j = 1; j < Vb; j++) m = l[j] > m ? l[j] : m;
    double sum = 0;
    for (int64_t j = 0; j < Vb; j++) sum += expf(l[j] - m);
    const float tl = t >= 0 && t < Vb ? l[t] : 0.0f;
    if (!in) {
        o[0] = m, o[1] = (float)sum, o[2] = tl;
    } else {
        float M = in[0] > m ? in[0] : m;
        double S = (double)in[1] * exp((double)in[0] - (double)M) + sum * exp((double)m - (double)M);
        o[0] = M, o[1] = (float)S, o[2] = in[2] + tl;
    }
    return (double)o[0] + log((double)o[1]) - (double)o[2];
}

void test_ce_stats_rows() {
    struct C {
        int64_t R, Vb, vocab0, vocab;
        float amp;
        bool first, last, in_place;
    } cs[] = {{6, 50, 0, 120, 3.0f, true, false, false},       {9, 1000, 1000, 3000, 10.0f, false, true, true},
              {3, 5000, 200, 5200, 30.0f, false, true, false},  {70, 300, 0, 300, 1.0f, true, true, false},
              {2, 1, 5, 6, 1.0f, false, false, true},           {40, 129, 64, 400, 5.0f, false, false, true}};
    for (const C &c : cs) {
        begin_case("R=%lld ids %lld..+%lld of %lld logits in +-%g%s%s%s", (long long)c.R, (long long)c.vocab0,
                   (long long)c.Vb, (long long)c.vocab, c.amp, c.first ? " first" : "", c.last ? " last" : "",
                   c.in_place ? " in place" : "");
        std::vector<float> l = frands((size_t)(c.R * c.Vb), c.amp);
        std::vector<int32_t> tg(c.R);
        /* ignored rows, targets in the block, elsewhere, and past the vocabulary (not checked here) */
        for (int64_t r = 0; r < c.R; r++)
            tg[r] = r % 5 == 2 ? -1 : r % 7 == 3 ? (int32_t)c.vocab : r % 3 ? (int32_t)(c.vocab0 + irand((int)c.Vb))
                                                                             : irand((int)c.vocab);
        tg[0] = (int32_t)(c.vocab0 + c.Vb - 1);
        std::vector<float> in((size_t)(c.R * 3));
        for (int64_t r = 0; r < c.R; r++) {
            in[r * 3] = c.amp * frand();
            in[r * 3 + 1] = 1.0f + 50.0f * std::fabs(frand());
            in[r * 3 + 2] = c.amp * frand();
        }
        std::vector<float> want((size_t)(c.R * 3));
        std::vector<double> terms((size_t)c.R, 0.0);
        for (int64_t r = 0; r < c.R; r++) {
            const float *prev = c.first ? nullptr : &in[r * 3];
            double term = ce_stats_row_ref(&l[r * c.Vb], c.Vb, (int64_t)tg[r] - c.vocab0, prev, &want[r * 3]);
            if (tg[r] >= 0) terms[r] = term;
        }
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dl = d.put(l, 0, "logits");
            int32_t *dt = d.put(tg, 0, "targets");
            float *din = c.first ? nullptr : d.put(in, 4, "stats in");
            float *dst = c.in_place ? din : (float *)d.put(nullptr, want.size() * 4, 0, "stats");
            double *dterms = c.last ? (double *)d.put(nullptr, terms.size() * 8, 0, "terms") : nullptr;
            expect_status(emu::tcu_ce_stats_rows(nullptr, dl, c.R, c.Vb, dt, c.vocab0, din, dst, dterms), cudaSuccess,
                          "tcu_ce_stats_rows");
            return std::vector<Bytes>{as_bytes(dl, l.size()), as_bytes(dst, want.size()),
                                      c.last ? as_bytes(dterms, terms.size()) : Bytes()};
        });
        expect_same("logits (only read)", got[0], as_bytes(l.data(), l.size()), 4);
        std::vector<float> st = from_bytes<float>(got[1]);
        /* max and target logit exact; the sum of exponentials in double in another order, rounded once: 1 ulp */
        expect_near("stats", st.data(), want.data(), st.size(), [&](size_t i) {
            return i % 3 == 1 ? std::ldexp(1.0, std::ilogb(std::max(std::fabs(want[i]), 1e-30f)) - 23) : 0.0;
        });
        if (c.last) {
            std::vector<double> gt = from_bytes<double>(got[2]);
            for (int64_t r = 0; r < c.R; r++) {
                /* from the statistics as the kernel rounded them */
                double w = tg[r] >= 0 ? (double)st[r * 3] + log((double)st[r * 3 + 1]) - (double)st[r * 3 + 2] : 0.0;
                if (!(std::fabs(gt[r] - w) <= 1e-12 * std::fabs(w) + 1e-300))
                    fail("term %lld = %.17g, want %.17g", (long long)r, gt[r], w);
                if (!(std::fabs(gt[r] - terms[r]) <= 1e-6 * (std::fabs(terms[r]) + 1.0)))
                    fail("term %lld = %.17g, the reference's %.17g", (long long)r, gt[r], terms[r]);
            }
        }
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer b(64);
        expect_status(emu::tcu_ce_stats_rows(nullptr, nullptr, 0, 5, nullptr, 0, nullptr, nullptr, nullptr),
                      cudaSuccess, "R=0");
        expect_status(emu::tcu_ce_stats_rows(nullptr, b.as<float>(), 2, 0, b.as<int32_t>(), 0, nullptr, b.as<float>(),
                                             nullptr),
                      cudaErrorInvalidValue, "Vb=0");
    }
    expect_launches({});
    end_case();
}

/* tk_ce_block's row (its portable path), transcribed. */
void ce_block_row_ref(float *l, int64_t Vb, int32_t target, int64_t vocab0, const float *st, float scale) {
    if (target < 0) {
        std::fill(l, l + Vb, 0.0f);
        return;
    }
    const double S = (double)st[1];
    for (int64_t j = 0; j < Vb; j++) l[j] = expf(l[j] - st[0]);
    const float inv = (float)(1.0 / S);
    const int64_t t = (int64_t)target - vocab0;
    const float et = t >= 0 && t < Vb ? l[t] : 0.0f;
    for (int64_t j = 0; j < Vb; j++) l[j] = scale * (l[j] * inv);
    if (t >= 0 && t < Vb) l[t] = (float)((double)scale * ((double)et / S - 1.0));
}

void test_ce_block_rows() {
    struct C {
        int64_t R, Vb, vocab0, vocab;
        float amp, scale;
    } cs[] = {{6, 50, 0, 120, 3.0f, 1.0f / 6}, {9, 1000, 1000, 3000, 10.0f, 0.01f}, {3, 5000, 200, 5200, 30.0f, -2.0f},
              {70, 300, 0, 300, 1.0f, 1.0f},   {2, 1, 5, 6, 1.0f, 1.0f}};
    for (const C &c : cs) {
        begin_case("R=%lld ids %lld..+%lld of %lld logits in +-%g scale %g", (long long)c.R, (long long)c.vocab0,
                   (long long)c.Vb, (long long)c.vocab, c.amp, c.scale);
        std::vector<float> l = frands((size_t)(c.R * c.Vb), c.amp);
        std::vector<int32_t> tg(c.R);
        for (int64_t r = 0; r < c.R; r++)
            tg[r] = r % 5 == 2 ? -1 : r % 7 == 3 ? (int32_t)c.vocab : r % 3 ? (int32_t)(c.vocab0 + irand((int)c.Vb))
                                                                             : irand((int)c.vocab);
        tg[0] = (int32_t)c.vocab0;
        /* the whole head's statistics: a max at or above the block's, a sum of at least the block's */
        std::vector<float> st((size_t)(c.R * 3));
        for (int64_t r = 0; r < c.R; r++) {
            float m = l[r * c.Vb];
            for (int64_t j = 1; j < c.Vb; j++) m = std::max(m, l[r * c.Vb + j]);
            st[r * 3] = m + (r % 2 ? 0.0f : std::fabs(frand()));
            double sum = 0;
            for (int64_t j = 0; j < c.Vb; j++) sum += expf(l[r * c.Vb + j] - st[r * 3]);
            st[r * 3 + 1] = (float)(sum * (1.0 + 3.0 * std::fabs(frand())));
            st[r * 3 + 2] = frand();
        }
        std::vector<float> want = l;
        for (int64_t r = 0; r < c.R; r++) ce_block_row_ref(&want[r * c.Vb], c.Vb, tg[r], c.vocab0, &st[r * 3], c.scale);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dl = d.put(l, 0, "logits");
            int32_t *dt = d.put(tg, 0, "targets");
            float *ds = d.put(st, 4, "stats");
            expect_status(emu::tcu_ce_block_rows(nullptr, dl, c.R, c.Vb, dt, c.vocab0, ds, c.scale), cudaSuccess,
                          "tcu_ce_block_rows");
            return std::vector<Bytes>{as_bytes(dl, l.size())};
        });
        /* no sums: every element rounded as the CPU's */
        expect_same("gradient", got[0], as_bytes(want.data(), want.size()), 4);
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    expect_status(emu::tcu_ce_block_rows(nullptr, nullptr, 0, 5, nullptr, 0, nullptr, 1.0f), cudaSuccess, "R=0");
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- sumsq */

void test_sumsq() {
    struct C {
        int64_t n;
        size_t parts;
        int acc; /* 0: none, 1: a separate value, 2: in place */
    } cs[] = {{1000, 1, 0}, {20000, 3, 1}, {70001, 9, 2}, {1, 4, 1}, {0, 1, 1}, {8192 * 3 + 5, 4, 0}};
    for (const C &c : cs) {
        begin_case("n=%lld %zu part(s)%s", (long long)c.n, c.parts,
                   c.acc == 1 ? " accumulate" : c.acc == 2 ? " accumulate in place" : "");
        std::vector<float> g = frands((size_t)c.n, 3.0f);
        const float acc = 123.25f;
        const float want = tk_sumsq(g.data(), c.n, c.acc ? acc : 0.0f, 1);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            float *dg = c.n ? d.put(g, 4, "g") : nullptr;
            float *a = d.put(std::vector<float>{acc}, 0, "acc");
            float *out = c.acc == 2 ? a : (float *)d.put(nullptr, 4, 0, "out");
            double *parts = (double *)d.put(nullptr, c.parts * 8, 0, "parts");
            expect_status(emu::tcu_sumsq(nullptr, dg, c.n, c.acc ? a : nullptr, out, parts, c.parts * 8), cudaSuccess,
                          "tcu_sumsq");
            return std::vector<Bytes>{as_bytes(out, 1)};
        });
        float v = from_bytes<float>(got[0])[0];
        if (!(std::fabs((double)v - want) <= 1e-6 * std::fabs((double)want))) fail("sumsq %.9g, want %.9g", v, want);
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer b(64);
        expect_status(emu::tcu_sumsq(nullptr, b.as<float>(), 4, nullptr, b.as<float>(), b.as<double>(), 4),
                      cudaErrorInvalidValue, "no room for one partial sum");
    }
    expect_launches({});
    end_case();
}

/* ------------------------------------------------------------- adamw */

void test_adamw() {
    struct C {
        tide_dtype pdt;
        bool master;
        float beta1, wd, max_norm, sumsq;
        float gs; /* hyper[3]: the gradients' factor (0: 1; < 0: no update) */
    } cs[] = {
        {TIDE_F32, false, 0.9f, 0.1f, 1.0f, 9.0f, 0.0f},  {TIDE_F32, true, 0.9f, 0.0f, 1.0f, 0.25f, 0.0f},
        {TIDE_BF16, true, 0.9f, 0.1f, 1.0f, 9.0f, 0.0f},  {TIDE_F16, true, 0.3f, 0.1f, 0.0f, 9.0f, 0.0f},
        {TIDE_BF16, true, 0.3f, 0.0f, 2.0f, 1e-8f, 0.0f}, {TIDE_F16, true, 0.9f, 0.01f, 1.0f, 0.0f, 0.0f},
        {TIDE_BF16, true, 0.9f, 0.1f, 1.0f, 0.09f, 7.5f}, {TIDE_F32, false, 0.9f, 0.1f, 0.0f, 9.0f, 1.3f},
        {TIDE_F32, true, 0.9f, 0.1f, 1.0f, 9.0f, -1.0f},
    };
    for (const C &c : cs) {
        begin_case("%s%s beta1 %g wd %g max_norm %g sumsq %g gs %g", dtn(c.pdt), c.master ? " with master" : "",
                   c.beta1, c.wd, c.max_norm, c.sumsq, c.gs);
        const size_t n = 70001;
        std::vector<float> p32 = frands(n), m = frands(n, 0.01f), v = frands(n, 1e-4f), g = frands(n, 0.1f);
        for (float &x : v) x = std::fabs(x);
        /* extremes: the 16-bit roundings' edges (overflow, subnormals, ties, NaN) */
        const float specials[] = {65519.0f, 65520.0f, -70000.0f, 6e-8f, 3e-5f, 1e-9f, -1e-41f, NAN, -NAN, INFINITY,
                                  bits_f(0x3f808000u), bits_f(0x3f818000u), bits_f(0x477ff000u), 3.4e38f};
        for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) p32[7 * i] = specials[i];
        g[5] = NAN;
        Bytes param(n * tide_dtype_size(c.pdt));
        for (size_t i = 0; i < n; i++) {
            float f = frand();
            if (c.pdt == TIDE_F32) memcpy(&param[4 * i], c.master ? &f : &p32[i], 4);
            else {
                uint16_t h = c.pdt == TIDE_F16 ? tide_f32_to_f16(f) : tide_f32_to_bf16(f);
                memcpy(&param[2 * i], &h, 2);
            }
        }
        const double lr = 1e-3, b2 = 0.95, t = 3;
        const float hyper[4] = {(float)lr, (float)(lr / (1 - std::pow((double)c.beta1, t))),
                                (float)std::sqrt(1 - std::pow(b2, t)), c.gs};
        tk_adamw_args a = {hyper[0], hyper[1], hyper[2], c.beta1, (float)b2, 1e-8f, c.wd, c.max_norm, c.sumsq, c.gs};
        Bytes wparam = param;
        std::vector<float> wmaster = p32, wm = m, wv = v;
        tk_adamw(wparam.data(), c.pdt, c.master ? wmaster.data() : nullptr, wm.data(), wv.data(), g.data(), (int64_t)n,
                 &a, 1);
        std::vector<Bytes> got = under_schedules([&](int) {
            Dev d;
            void *dp = d.put(param.data(), param.size(), 0, "param");
            float *dmst = c.master ? d.put(p32, 4, "master") : nullptr;
            float *dm = d.put(m, 0, "m"), *dv = d.put(v, 8, "v"), *dg = d.put(g, 0, "grad");
            float *dh = d.put(std::vector<float>(hyper, hyper + 4), 0, "hyper");
            float *ds = d.put(std::vector<float>{c.sumsq}, 0, "sumsq");
            expect_status(emu::tcu_adamw(nullptr, dp, c.pdt, dmst, dm, dv, dg, (int64_t)n, dh, ds, c.beta1, (float)b2,
                                         1e-8f, c.wd, c.max_norm),
                          cudaSuccess, "tcu_adamw");
            return std::vector<Bytes>{Bytes((uint8_t *)dp, (uint8_t *)dp + param.size()),
                                      c.master ? as_bytes(dmst, n) : Bytes(), as_bytes(dm, n), as_bytes(dv, n)};
        });
        expect_same("param", got[0], wparam, tide_dtype_size(c.pdt));
        if (c.master) expect_same("master", got[1], as_bytes(wmaster.data(), n), 4);
        expect_same("m", got[2], as_bytes(wm.data(), n), 4);
        expect_same("v", got[3], as_bytes(wv.data(), n), 4);
        end_case();
    }
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer b(64);
        float *f = b.as<float>();
        expect_status(emu::tcu_adamw(nullptr, b.p, TIDE_BF16, nullptr, f, f, f, 4, f, f, 0.9f, 0.95f, 1e-8f, 0, 0),
                      cudaErrorInvalidValue, "16-bit without a master");
        expect_status(emu::tcu_adamw(nullptr, b.p, TIDE_I32, f, f, f, f, 4, f, f, 0.9f, 0.95f, 1e-8f, 0, 0),
                      cudaErrorInvalidValue, "i32");
        expect_status(emu::tcu_adamw(nullptr, b.p, TIDE_F32, nullptr, f, f, f, 0, f, f, 0.9f, 0.95f, 1e-8f, 0, 0),
                      cudaSuccess, "n=0");
    }
    expect_launches({});
    end_case();
}

} /* namespace */

int main(int argc, char **argv) {
    return run_tests(argc, argv, "CUDA training kernels (src/backend/cuda/cuda_train.cu) on the host emulation, "
                                 "against the CPU kernels",
                     {
                         {"ids", test_ids},
                         {"convert_cols", test_convert_cols},
                         {"matmul_small", test_matmul_small},
                         {"embed_bwd", test_embed_bwd},
                         {"rmsnorm_bwd", test_rmsnorm_bwd},
                         {"silu_mul_bwd", test_silu_mul_bwd},
                         {"attention_bwd", test_attention_bwd},
                         {"ce_rows", test_ce_rows},
                         {"ce_stats_rows", test_ce_stats_rows},
                         {"ce_block_rows", test_ce_block_rows},
                         {"sumsq", test_sumsq},
                         {"adamw", test_adamw},
                     },
                     {emu::emu_kernels_cuda_train}, "test_cuda_emu_train.cpp");
}
