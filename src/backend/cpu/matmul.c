/*
 * matmul.c - MATMUL on the CPU (tk_matmul, tk_matmul_fast, tk_matmul_ex of
 * kernels.h) and the sgemm drivers of kernels_int.h (tk_sgemm, tk_gemm).
 *
 * MATMUL with w as (N, K) (the inference form, and the accumulating one) is
 * the inner-product register tiles of matmul_avx512.c (tk_mm_f32w,
 * tk_mm_bf16) or, without AVX-512, of matmul_avx2.c (AVX2 or portable), for
 * every row count: each output's bits depend on its row of x, its row of w
 * and K alone, never on R, on the tile a planner cut, or on the thread
 * count. The choice of path is here (mm_f32w).
 *
 * MATMUL's training form (w as (K, N)), a training step's forward on an f32
 * weight (cpu_backend.c) and every product of the training kernels go
 * through tk_gemm instead (sgemm.c): tide's own packed f32 GEMM,
 * its path chosen from cpuid, each output's bits fixed by its row, its
 * column and K, never by the blocking or the thread count.
 */
#include "backend/cpu/kernels_int.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <string.h>

/* ------------------------------------------------------------- matmul */

/* out (R, N) (+)= x . w^T, w (N, K) of wdt: the inner-product kernels of the
 * CPU's instruction sets (matmul_avx512.c, matmul_avx2.c), each output's bits
 * a function of its row of x, its row of w and K alone. */
static void mm_f32w(const float *x, int64_t ldx, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                    float *out, int64_t ldo, bool add, int nt) {
    if (tk_have_avx512())
        tk_mm_f32w(x, ldx, w, wdt, R, K, N, out, ldo, add, nt);
    else if (tk_have_avx2())
        tk_mm_f32w_avx2(x, ldx, w, wdt, R, K, N, out, ldo, add, nt);
    else
        tk_mm_f32w_portable(x, ldx, w, wdt, R, K, N, out, ldo, add, nt);
}

/* Rows of x (or of its bf16 rounding) are this many bytes longer in scratch
 * than they are: with K a multiple of 1024 rows would lie a multiple of 4 KiB
 * apart, and a register tile's rows of x and w would all fall in one L1 set. */
#define TK_ROW_PAD 64

/* mm_f32w on x copied a chunk of rows at a time into scratch with padded
 * rows (the same values: the bits do not change), or on x in place when
 * scratch holds less than one padded row. */
static void mm_f32w_padded(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                           float *out, int64_t ldo, bool add, void *scratch, size_t scratch_bytes, int nt) {
    int64_t ld = K + TK_ROW_PAD / (int64_t)sizeof(float);
    int64_t rows = scratch ? (int64_t)(scratch_bytes / ((size_t)ld * sizeof(float))) : 0;
    if (rows < 1) {
        mm_f32w(x, K, w, wdt, R, K, N, out, ldo, add, nt);
        return;
    }
    float *xp = scratch;
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
        int64_t n = TIDE_MIN(rows, R - r0);
#pragma omp parallel for schedule(static) num_threads(nt) if (n * K >= 4 * TK_PAR_MIN)
        for (int64_t r = 0; r < n; r++) memcpy(xp + r * ld, x + (r0 + r) * K, (size_t)K * sizeof(float));
        mm_f32w(xp, ld, w, wdt, n, K, N, out + r0 * ldo, ldo, add, nt);
    }
}

tide_status tk_matmul(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                      int64_t N, float *out, int64_t ldo, void *scratch, size_t scratch_bytes, int nt) {
    if (tide_dtype_is_quantized(wdt)) return tk_matmul_q(x, w, wdt, R, K, N, out, ldo, scratch, scratch_bytes, nt);
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX || ldo > INT_MAX) return TIDE_E_UNSUPPORTED;
    /* every row count, every path: the weights widened in registers */
    mm_f32w_padded(x, w, wdt, R, K, N, out, ldo, false, scratch, scratch_bytes, nt);
    return TIDE_OK;
}

size_t tk_matmul_fast_min_scratch(int64_t K) { return (size_t)K * sizeof(uint16_t); }

bool tk_matmul_fast_native(tide_dtype wdt) { return wdt == TIDE_BF16 && tk_cpu_has(TK_CPU_AVX512BF16); }

tide_status tk_matmul_fast(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                           bool accumulate, float *out, int64_t ldo, void *scratch, size_t scratch_bytes, int nt) {
    if (!tk_matmul_fast_native(wdt))
        return tk_matmul_ex(x, w, wdt, R, K, N, false, accumulate, out, ldo, scratch, scratch_bytes, nt);
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX || ldo > INT_MAX) return TIDE_E_UNSUPPORTED;
    int64_t ld = K + TK_ROW_PAD / (int64_t)sizeof(uint16_t);
    if (!scratch || scratch_bytes < (size_t)ld * sizeof(uint16_t)) ld = K;
    int64_t rows = scratch ? (int64_t)(scratch_bytes / ((size_t)ld * sizeof(uint16_t))) : 0;
    if (rows < 1) return TIDE_E_INVALID;
    /* the activations rounded to bf16 a chunk of rows at a time: a row's
     * result does not depend on the chunk it is in */
    uint16_t *xb = scratch;
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
        int64_t n = TIDE_MIN(rows, R - r0);
        tk_round_bf16(x + r0 * K, K, n, K, xb, ld, nt);
        tk_mm_bf16(xb, ld, w, n, K, N, out + r0 * ldo, ldo, accumulate, nt);
    }
    return TIDE_OK;
}

/* ------------------------------------------------------------- the BLAS, for the record */

/* OpenBLAS is linked for the hardware probe's reference rate
 * (src/probe/probe_cpu.c); no kernel here calls it. */
const char *tk_blas_corename(void) { return openblas_get_corename(); }

/* ------------------------------------------------------------- matmul, training forms */

/* Columns [c0, c0 + n) of row k of w (K, N) as f32 into dst: converted, or
 * for a block type (rows of whole blocks; c0 and n whole blocks but at the
 * row's end) dequantized as the reference does. */
static void w_kn_cols(const void *w, tide_dtype wdt, int64_t N, int64_t k, int64_t c0, int64_t n, float *dst) {
    const uint8_t *wb = w;
    if (tide_dtype_is_quantized(wdt)) {
        int64_t blk = tide_dtype_block(wdt);
        tk_dequant_row(wb + (size_t)tide_dtype_bytes(wdt, (uint64_t)N) * (size_t)k +
                           (size_t)(c0 / blk) * tide_dtype_block_bytes(wdt),
                       wdt, dst, n);
    } else {
        tk_convert(wb + (size_t)(k * N + c0) * tide_dtype_size(wdt), wdt, dst, (size_t)n);
    }
}

/* out (R, N) (+)= x (R, K) . w for w (K, N) of wdt and a few rows: each task
 * owns a block of output columns and runs k in order, converting (or
 * dequantizing: 256 columns are whole blocks of every block type) w's rows a
 * chunk at a time into a stack buffer. */
#define TK_NT_COLS 256
static void matmul_nt_fused(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                            int64_t N, float *out, int64_t ldo, bool add, int nt) {
    int64_t ncb = (N + TK_NT_COLS - 1) / TK_NT_COLS;
    for (int64_t r0 = 0; r0 < R; r0 += TK_MATMUL_FUSED_R) {
        int nr = (int)TIDE_MIN(TK_MATMUL_FUSED_R, R - r0);
#pragma omp parallel for schedule(static) num_threads(nt) if (N * K >= TK_PAR_MIN)
        for (int64_t cb = 0; cb < ncb; cb++) {
            int64_t c0 = cb * TK_NT_COLS;
            int n = (int)TIDE_MIN(TK_NT_COLS, N - c0);
            _Alignas(32) float buf[TK_NT_COLS];
            _Alignas(32) float acc[TK_MATMUL_FUSED_R][TK_NT_COLS];
            memset(acc, 0, sizeof acc);
            for (int64_t k = 0; k < K; k++) {
                const float *wf = buf;
                if (wdt == TIDE_F32)
                    wf = (const float *)w + k * N + c0;
                else
                    w_kn_cols(w, wdt, N, k, c0, n, buf);
                for (int r = 0; r < nr; r++) {
                    float xv = x[(r0 + r) * K + k];
                    float *a = acc[r];
#pragma omp simd
                    for (int j = 0; j < n; j++) a[j] += xv * wf[j];
                }
            }
            for (int r = 0; r < nr; r++) {
                float *dst = out + (r0 + r) * ldo + c0;
                if (add) {
#pragma omp simd
                    for (int j = 0; j < n; j++) dst[j] += acc[r][j];
                } else {
                    memcpy(dst, acc[r], (size_t)n * sizeof(float));
                }
            }
        }
    }
}

tide_status tk_matmul_ex(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                         bool w_kn, bool accumulate, float *out, int64_t ldo, void *scratch,
                         size_t scratch_bytes, int nt) {
    if (!w_kn && !accumulate) return tk_matmul(x, w, wdt, R, K, N, out, ldo, scratch, scratch_bytes, nt);
    /* a block type: the input gradient's form only (a frozen quantized base) */
    if (tide_dtype_is_quantized(wdt) && (!w_kn || N % tide_dtype_block(wdt))) return TIDE_E_UNSUPPORTED;
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX || ldo > INT_MAX) return TIDE_E_UNSUPPORTED;
    if (!w_kn) {
        mm_f32w_padded(x, w, wdt, R, K, N, out, ldo, true, scratch, scratch_bytes, nt);
        return TIDE_OK;
    }
    /* w (K, N) from here */
    float beta = accumulate ? 1.0f : 0.0f;
    if (wdt == TIDE_F32) {
        tk_gemm(false, false, R, N, K, 1.0f, x, K, w, N, beta, out, ldo, nt);
        return TIDE_OK;
    }
    /* 16-bit or block-quantized weights: widened (dequantized) a block of
     * whole columns (whole quantization blocks) at a time into scratch, so
     * each output element is still one sum over all of K */
    int64_t gran = tide_dtype_is_quantized(wdt) ? tide_dtype_block(wdt) : 1;
    int64_t nb = scratch ? (int64_t)(scratch_bytes / ((size_t)K * sizeof(float))) / gran * gran : 0;
    if (R < TK_MATMUL_FUSED_R || nb < 1) {
        matmul_nt_fused(x, w, wdt, R, K, N, out, ldo, accumulate, nt);
        return TIDE_OK;
    }
    nb = TIDE_MIN(nb, N);
    int64_t nblk = (N + nb - 1) / nb;
    nb = ((N + nblk - 1) / nblk + gran - 1) / gran * gran;
    float *wf = scratch;
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t cnt = TIDE_MIN(nb, N - n0);
#pragma omp parallel for schedule(static) num_threads(nt) if (K * cnt >= TK_PAR_MIN)
        for (int64_t k = 0; k < K; k++) w_kn_cols(w, wdt, N, k, n0, cnt, wf + k * cnt);
        tk_gemm(false, false, R, cnt, K, 1.0f, x, K, wf, cnt, beta, out + n0, ldo, nt);
    }
    return TIDE_OK;
}

/* ------------------------------------------------------------- matmul, a bf16 step's */

/* Rows of a bf16 output formed at once in f32: at most 4 MiB of them. */
#define TK_BF16_OUT_BYTES ((size_t)4 << 20)

tide_status tk_matmul_bf16(const void *x, tide_dtype xdt, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                           int64_t N, bool w_kn, bool accumulate, void *out, tide_dtype odt, int64_t ldo,
                           void *scratch, size_t scratch_bytes, int nt) {
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX || ldo > INT_MAX) return TIDE_E_UNSUPPORTED;
    if (R <= 0 || N <= 0) return TIDE_OK;
    /* w (N, K) is the transposed operand; w (K, N) the plain one */
    const int64_t ldw = w_kn ? N : K;
    if (odt == TIDE_F32) {
        tk_gemm_bf16(false, !w_kn, R, N, K, x, xdt, K, w, wdt, ldw, accumulate, out, ldo, nt);
        return TIDE_OK;
    }
    /* a bf16 output: blocks of rows summed in f32, then rounded */
    const size_t row = (size_t)N * sizeof(float);
    int64_t rows;
    float *buf, *own = NULL;
    if (scratch && scratch_bytes >= row) {
        buf = scratch;
        rows = (int64_t)TIDE_MIN(scratch_bytes / row, (size_t)R);
    } else {
        rows = (int64_t)TIDE_MAX((size_t)1, TIDE_MIN(TK_BF16_OUT_BYTES / row, (size_t)R));
        if (!(buf = own = tide_malloc((size_t)rows * row))) return TIDE_E_NOMEM;
    }
    const size_t xs = tide_dtype_size(xdt);
    uint16_t *o = out;
    /* Too few rows at once for all of them, and fewer rows than columns:
     * blocks of columns instead, so that each call packs the smaller x
     * again rather than w (an element's bits do not depend on the block). */
    const int64_t cols = (int64_t)((size_t)rows * row / ((size_t)R * sizeof(float))) / 32 * 32;
    if (rows < R && R < N && cols >= 32) {
        const size_t ws = tide_dtype_size(wdt);
        for (int64_t n0 = 0; n0 < N; n0 += cols) {
            const int64_t n = TIDE_MIN(cols, N - n0);
            if (accumulate) {
#pragma omp parallel for schedule(static) num_threads(nt) if (R * n >= TK_PAR_MIN)
                for (int64_t r = 0; r < R; r++) tk_convert(o + r * ldo + n0, TIDE_BF16, buf + r * n, (size_t)n);
            }
            const uint8_t *wb = (const uint8_t *)w + (size_t)(w_kn ? n0 : n0 * K) * ws;
            tk_gemm_bf16(false, !w_kn, R, n, K, x, xdt, K, wb, wdt, ldw, accumulate, buf, n, nt);
            tk_round_bf16(buf, n, R, n, o + n0, ldo, nt);
        }
        tide_free(own);
        return TIDE_OK;
    }
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
        const int64_t n = TIDE_MIN(rows, R - r0);
        if (accumulate) {
#pragma omp parallel for schedule(static) num_threads(nt) if (n * N >= TK_PAR_MIN)
            for (int64_t r = 0; r < n; r++) tk_convert(o + (r0 + r) * ldo, TIDE_BF16, buf + r * N, (size_t)N);
        }
        tk_gemm_bf16(false, !w_kn, n, N, K, (const uint8_t *)x + (size_t)(r0 * K) * xs, xdt, K, w, wdt, ldw,
                     accumulate, buf, N, nt);
        tk_round_bf16(buf, N, n, N, o + r0 * ldo, ldo, nt);
    }
    tide_free(own);
    return TIDE_OK;
}
