/*
 * test_cuda_emu_quant.cpp - the CUDA kernels for block-quantized weights
 * (src/backend/cuda/cuda_quant.cu, cuda_quant.h) on the host emulation of
 * cuda_emu.h, against the tests' own reading of the block layouts
 * (tests/quant_ref.h, itself bit-identical to the library's reference
 * tide_dequantize_row on every weight made here), for every type (Q8_0,
 * Q4_0, Q4_K, Q5_K, Q6_K):
 *
 *   - tcu_qdequant: rows of a weight as f32 tiles, bit for bit the
 *     reference's values; as bf16 tiles, bit for bit those values rounded
 *     to nearest even (tide_f32_to_bf16); aligned (vector stores) and not;
 *   - tcu_qgemv for R in {1, 3, 17, 64}, into a block of a wider output:
 *     within 2e-5 * sum_k |x_k w_k| of the product in double of x and the
 *     reference's weights; the output's other columns keep their bits; and
 *     every row bit-identical to that row run alone (R = 1), which is the
 *     GEMV's contract (an output depends on its x row, weight row and K);
 *   - tcu_qembed: rows bit for bit the reference's dequantized rows, for a
 *     block of the vocabulary (ids outside it zeroed as a first chunk, kept
 *     as a later one);
 *   - the launchers' contracts: a type that is not a block type or K not a
 *     whole number of blocks is cudaErrorInvalidValue, empty work launches
 *     nothing.
 * Every case runs under the three schedules of emu_check.h (threads and
 * blocks reordered, grid caps lowered so the grid-stride loops go round,
 * shared memory poisoned), which must give the same bits, and every
 * __global__ kernel of cuda_quant.cu must have been launched.
 *
 * `--quick` is accepted (sanitizer builds) and changes nothing; -v prints
 * every case with its time; an argument naming an op runs only its cases.
 */
#include "tide.h"
#include "backend/cuda/cuda_quant.h"

#include <vector>

#include "quant_ref.h"

#include "cuda_emu.h"

namespace emu {
#include "cuda_quant.inc"
} /* namespace emu */

#include "emu_check.h"

namespace {

const tide_dtype qtypes[] = {TIDE_Q8_0, TIDE_Q4_0, TIDE_Q4_K, TIDE_Q5_K, TIDE_Q6_K};

uint64_t rnd64() { return rnd(); }

/* A random (N, K) weight of dt and its reference values. */
Bytes qweight(tide_dtype dt, int64_t N, int64_t K, std::vector<float> &wf) {
    Bytes w((size_t)(tide_dtype_bytes(dt, (uint64_t)K) * (uint64_t)N));
    qref_fill(dt, w.data(), w.size(), rnd64);
    wf.assign((size_t)(N * K), 0.0f);
    const size_t rb = (size_t)tide_dtype_bytes(dt, (uint64_t)K);
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++) bad += qref_dequant_row(dt, w.data() + n * rb, K, wf.data() + n * K);
    if (bad) fail("tests/quant_ref.h and tide_dequantize_row differ in %lld elements", (long long)bad);
    return w;
}

/* ------------------------------------------------------------- dequant */

void test_dequant() {
    for (tide_dtype dt : qtypes)
        for (int bf = 0; bf < 2; bf++)
            for (unsigned off : {0u, 4u}) {
                const int64_t N = 5, K = 512, n0 = 1, cnt = 3;
                begin_case("%s K=%lld rows %lld..%lld %s dst%%16=%u", dtn(dt), (long long)K, (long long)n0,
                           (long long)(n0 + cnt - 1), bf ? "bf16" : "f32", off);
                std::vector<float> wf;
                Bytes w = qweight(dt, N, K, wf);
                const size_t es = bf ? 2 : 4;
                Bytes want((size_t)(cnt * K) * es);
                for (int64_t i = 0; i < cnt * K; i++) {
                    float v = wf[(size_t)(n0 * K + i)];
                    if (bf) {
                        uint16_t h = tide_f32_to_bf16(v);
                        memcpy(&want[(size_t)i * 2], &h, 2);
                    } else {
                        memcpy(&want[(size_t)i * 4], &v, 4);
                    }
                }
                std::vector<Bytes> got = under_schedules([&](int) {
                    Dev d;
                    void *dw = d.put(w.data(), w.size(), 0, "w");
                    void *o = d.put(nullptr, want.size(), off, "tile");
                    expect_status(emu::tcu_qdequant(nullptr, dw, dt, K, n0, cnt, o, bf != 0), cudaSuccess,
                                  "tcu_qdequant");
                    return std::vector<Bytes>{as_bytes((const uint8_t *)o, want.size())};
                });
                expect_same("tile", got[0], want, es);
                end_case();
            }
}

/* ------------------------------------------------------------- gemv */

void test_gemv() {
    for (tide_dtype dt : qtypes)
        for (int64_t R : {1, 3, 17, 64}) {
            const int64_t K = 512, N = 12, col0 = 2, ldo = N + 5;
            const unsigned xoff = R == 3 ? 4 : 0; /* one case on the scalar loads of x */
            begin_case("%s R=%lld K=%lld N=%lld col0=%lld ldo=%lld x%%16=%u", dtn(dt), (long long)R, (long long)K,
                       (long long)N, (long long)col0, (long long)ldo, xoff);
            std::vector<float> wf;
            Bytes w = qweight(dt, N, K, wf);
            std::vector<float> x = frands((size_t)(R * K)), out0 = frands((size_t)(R * ldo), 100.0f);
            auto run = [&](int64_t r0, int64_t nr) {
                return under_schedules([&](int) {
                    Dev d;
                    float *dx = d.put(std::vector<float>(x.begin() + r0 * K, x.begin() + (r0 + nr) * K), xoff, "x");
                    void *dw = d.put(w.data(), w.size(), 0, "w");
                    float *o = d.put(std::vector<float>(out0.begin() + r0 * ldo, out0.begin() + (r0 + nr) * ldo), 0,
                                     "out");
                    expect_status(emu::tcu_qgemv(nullptr, dx, dw, dt, nr, K, N, o + col0, ldo), cudaSuccess,
                                  "tcu_qgemv");
                    return std::vector<Bytes>{as_bytes(o, (size_t)(nr * ldo))};
                })[0];
            };
            std::vector<float> g = from_bytes<float>(run(0, R));
            std::vector<float> gin, win;
            std::vector<double> bound;
            for (int64_t r = 0; r < R; r++)
                for (int64_t j = 0; j < ldo; j++) {
                    size_t i = (size_t)(r * ldo + j);
                    if (j < col0 || j >= col0 + N) {
                        if (f_bits(g[i]) != f_bits(out0[i]))
                            fail("out[%lld][%lld], outside the block, changed", (long long)r, (long long)j);
                        continue;
                    }
                    double s = 0, a = 0;
                    for (int64_t k = 0; k < K; k++) {
                        double p = (double)x[(size_t)(r * K + k)] * (double)wf[(size_t)((j - col0) * K + k)];
                        s += p;
                        a += std::fabs(p);
                    }
                    gin.push_back(g[i]);
                    win.push_back((float)s);
                    bound.push_back(2e-5 * a);
                }
            expect_near("out", gin.data(), win.data(), gin.size(), [&](size_t i) { return bound[i]; });
            /* the row alone gives the same bits */
            for (int64_t r : {(int64_t)0, R / 2, R - 1}) {
                if (R == 1) break;
                Bytes alone = run(r, 1);
                expect_same("a row run alone", alone, as_bytes(g.data() + r * ldo, (size_t)ldo), 4);
            }
            end_case();
        }
}

/* ------------------------------------------------------------- embed */

void test_embed() {
    for (tide_dtype dt : qtypes)
        for (int first = 1; first >= 0; first--) {
            const int64_t V = 6, D = 512, vocab0 = 10, R = 9;
            begin_case("%s V=%lld D=%lld ids from %lld, %s chunk", dtn(dt), (long long)V, (long long)D,
                       (long long)vocab0, first ? "first" : "later");
            std::vector<float> tf;
            Bytes tab = qweight(dt, V, D, tf);
            std::vector<int32_t> ids(R);
            for (int64_t r = 0; r < R; r++) ids[r] = (int32_t)(r % 3 == 2 ? irand(10) : vocab0 + irand((int)V));
            ids[0] = (int32_t)(vocab0 + V - 1);
            std::vector<float> out0 = frands((size_t)(R * D), 10.0f), want = out0;
            for (int64_t r = 0; r < R; r++) {
                int64_t id = ids[r] - vocab0;
                for (int64_t i = 0; i < D; i++)
                    if (id >= 0 && id < V) want[(size_t)(r * D + i)] = tf[(size_t)(id * D + i)];
                    else if (first) want[(size_t)(r * D + i)] = 0.0f;
            }
            std::vector<Bytes> got = under_schedules([&](int) {
                Dev d;
                void *dt_ = d.put(tab.data(), tab.size(), 0, "table");
                int32_t *di = d.put(ids, 0, "tokens");
                float *o = d.put(out0, 0, "out");
                expect_status(emu::tcu_qembed(nullptr, dt_, dt, V, D, vocab0, first != 0, di, R, o), cudaSuccess,
                              "tcu_qembed");
                return std::vector<Bytes>{as_bytes(o, out0.size())};
            });
            expect_same("out", got[0], as_bytes(want.data(), want.size()), 4);
            end_case();
        }
}

/* ------------------------------------------------------------- contracts */

void test_contract() {
    begin_case("contract");
    emu::launch_log.clear();
    {
        emu::Buffer x(4096), w(4096), o(4096);
        int32_t *ids = (int32_t *)x.p;
        expect_status(emu::tcu_qgemv(nullptr, x.as<float>(), w.p, TIDE_BF16, 1, 32, 4, o.as<float>(), 4),
                      cudaErrorInvalidValue, "gemv bf16");
        expect_status(emu::tcu_qgemv(nullptr, x.as<float>(), w.p, TIDE_Q4_K, 1, 32, 4, o.as<float>(), 4),
                      cudaErrorInvalidValue, "gemv q4_k K=32");
        expect_status(emu::tcu_qgemv(nullptr, x.as<float>(), w.p, TIDE_Q8_0, 0, 32, 4, o.as<float>(), 4),
                      cudaSuccess, "gemv R=0");
        expect_status(emu::tcu_qdequant(nullptr, w.p, TIDE_F32, 32, 0, 1, o.p, false), cudaErrorInvalidValue,
                      "dequant f32");
        expect_status(emu::tcu_qdequant(nullptr, w.p, TIDE_Q4_0, 48, 0, 1, o.p, false), cudaErrorInvalidValue,
                      "dequant q4_0 K=48");
        expect_status(emu::tcu_qdequant(nullptr, w.p, TIDE_Q6_K, 256, 0, 0, o.p, true), cudaSuccess,
                      "dequant cnt=0");
        expect_status(emu::tcu_qembed(nullptr, w.p, TIDE_I32, 1, 32, 0, true, ids, 1, o.as<float>()),
                      cudaErrorInvalidValue, "embed i32");
        expect_status(emu::tcu_qembed(nullptr, w.p, TIDE_Q5_K, 1, 256, 0, true, ids, 0, o.as<float>()), cudaSuccess,
                      "embed R=0");
    }
    expect_launches({});
    end_case();
}

} /* namespace */

int main(int argc, char **argv) {
    return run_tests(argc, argv, "CUDA kernels for quantized weights (src/backend/cuda/cuda_quant.cu) on the host "
                                 "emulation, against tests/quant_ref.h",
                     {
                         {"qdequant", test_dequant},
                         {"qgemv", test_gemv},
                         {"qembed", test_embed},
                         {"contract", test_contract},
                     },
                     {emu::emu_kernels_cuda_quant}, "test_cuda_emu_quant.cpp");
}
