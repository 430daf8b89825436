/*
 * matmul_avx512.c - MATMUL (out = x . w^T, w (N, K) as stored) with AVX-512,
 * chosen at run time (cpu_features.h); built for baseline x86-64 with the
 * instruction sets named per function, so one binary runs everywhere.
 *
 * Two families, both in the inner-product form: every output element has its
 * own 16-lane f32 accumulator that runs over K in order, 32 (bf16) or 16
 * (f32) elements a step, the tail by masked loads (zeros), and is summed at
 * the end by one fixed tree (hsum16). Register tiles group MR rows of x with
 * NR rows of w only to share loads; no output's arithmetic depends on its
 * neighbours, on MR or NR, on R, on N, on the thread count or on which
 * thread runs it. So a row's result is the same bits whether it is decoded
 * alone, multiplied in a prompt of 512 rows, or in a tile of any size.
 *
 *   FAST (tk_mm_bf16): x rounded to bf16 once per matmul (tk_round_bf16,
 *   round to nearest even, the same bits on every code path), multiplied by
 *   bf16 weights with VDPBF16PS (AVX512_BF16): each step adds two products
 *   per lane into f32. Weights are read as stored: at decode the weight
 *   stream is the whole cost, and it runs at memory bandwidth.
 *
 *   F32 (tk_mm_f32w): x in f32, weights widened in registers (bf16: a shift;
 *   f16: VCVTPH2PS; f32: as they are), one FMA per element. Exact widening,
 *   so only the order of the f32 sums differs from any other f32 matmul.
 *
 * Threads split the output columns (rows of w) into contiguous ranges, so
 * each weight is read by one thread; prompts are cut into row blocks whose
 * bf16 activations stay in L2 while a thread's weight rows stream past.
 */
#include "backend/cpu/kernels_int.h"

#include <omp.h>
#include <string.h>

/* ------------------------------------------------------------- rounding */

typedef union { float f; uint32_t u; } mm_bits;

/* f32 -> bf16, round to nearest even; NaN stays NaN (quiet, sign kept). */
static inline uint16_t round_bf16(float f) {
    mm_bits b = {.f = f};
    if ((b.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b.u >> 16) | 0x40u);
    return (uint16_t)((b.u + 0x7fffu + ((b.u >> 16) & 1u)) >> 16);
}

#ifdef TK_X86
#define TK_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define TK_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define TK_INLINE inline __attribute__((always_inline))

/* 16 floats -> 16 bf16, exactly round_bf16's bits. */
TK_512 static TK_INLINE __m256i round16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

TK_512 static void round_row_avx512(const float *x, uint16_t *d, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(d + i), round16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(d + i, m, round16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}
#endif

void tk_round_bf16(const float *x, int64_t ldx, int64_t R, int64_t K, uint16_t *xb, int64_t ldb, int nt) {
#ifdef TK_X86
    bool avx = tk_cpu_has(TK_CPU_AVX512F | TK_CPU_AVX512BW);
#endif
#pragma omp parallel for schedule(static) num_threads(nt) if (R * K >= 4 * TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
#ifdef TK_X86
        if (avx) {
            round_row_avx512(x + r * ldx, xb + r * ldb, K);
            continue;
        }
#endif
        for (int64_t k = 0; k < K; k++) xb[r * ldb + k] = round_bf16(x[r * ldx + k]);
    }
}

#ifdef TK_X86

/* The sum of the 16 lanes by a fixed tree: halves, quarters, pairs, then
 * the last two. Every kernel in this file ends each output with it. */
TK_512 static TK_INLINE float hsum16(__m512 v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* ------------------------------------------------------------- bf16 tiles */

/* o[r][n] (+)= x_r . w_n for MR rows of x (bf16, stride ldx) and NR rows of
 * w (bf16, stride ldw), over K. MR <= 4, NR <= 8, MR * NR <= 24. */
TK_BF16 static TK_INLINE void bf16_tile(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw, int64_t K,
                                        const int MR, const int NR, float *o, int64_t ldo, bool add) {
    __m512 c[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) c[r][n] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512i xv[4];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) xv[r] = _mm512_loadu_si512(x + r * ldx + k);
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) {
            __m512i wv = _mm512_loadu_si512(w + n * ldw + k);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) c[r][n] = _mm512_dpbf16_ps(c[r][n], (__m512bh)xv[r], (__m512bh)wv);
        }
    }
    if (k < K) {
        __mmask32 m = (__mmask32)((1ull << (K - k)) - 1);
        __m512i xv[4];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) xv[r] = _mm512_maskz_loadu_epi16(m, x + r * ldx + k);
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) {
            __m512i wv = _mm512_maskz_loadu_epi16(m, w + n * ldw + k);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) c[r][n] = _mm512_dpbf16_ps(c[r][n], (__m512bh)xv[r], (__m512bh)wv);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) {
            float s = hsum16(c[r][n]);
            o[r * ldo + n] = add ? o[r * ldo + n] + s : s;
        }
}

/* The tiles instantiated: MR x NR for every MR 1..4 at the widest NR the
 * registers take, and every narrower NR for the last columns of a range. */
#define BF16_TILE(MR, NR)                                                                                        \
    TK_BF16 static void bf16_tile_##MR##x##NR(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw,  \
                                             int64_t K, float *o, int64_t ldo, bool add) {                    \
        bf16_tile(x, ldx, w, ldw, K, MR, NR, o, ldo, add);                                                     \
    }
#define BF16_ROW(MR) BF16_TILE(MR, 1) BF16_TILE(MR, 2) BF16_TILE(MR, 3) BF16_TILE(MR, 4) BF16_TILE(MR, 5) \
    BF16_TILE(MR, 6)
BF16_ROW(1) BF16_ROW(2) BF16_ROW(3) BF16_ROW(4)
BF16_TILE(1, 7) BF16_TILE(1, 8) BF16_TILE(2, 7) BF16_TILE(2, 8)

typedef void (*bf16_tile_fn)(const uint16_t *, int64_t, const uint16_t *, int64_t, int64_t, float *, int64_t, bool);
#define BF16_ROWFN(MR)                                                                                            \
    {NULL, bf16_tile_##MR##x1, bf16_tile_##MR##x2, bf16_tile_##MR##x3, bf16_tile_##MR##x4, bf16_tile_##MR##x5, \
     bf16_tile_##MR##x6
static const bf16_tile_fn bf16_tiles[5][9] = {
    {NULL},
    BF16_ROWFN(1), bf16_tile_1x7, bf16_tile_1x8},
    BF16_ROWFN(2), bf16_tile_2x7, bf16_tile_2x8},
    BF16_ROWFN(3)},
    BF16_ROWFN(4)},
};
/* The widest NR per MR. */
static const int bf16_nr[5] = {0, 8, 8, 6, 6};

/* ------------------------------------------------------------- f32 tiles */

/* 16 weights as f32: bf16 shifted, f16 converted, f32 loaded (masked: the
 * first m of them, zeros after). */
TK_512 static TK_INLINE __m512 wload(const void *w, int64_t i, tide_dtype dt) {
    if (dt == TIDE_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i))), 16));
    if (dt == TIDE_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
    return _mm512_loadu_ps((const float *)w + i);
}

TK_512 static TK_INLINE __m512 wload_mask(const void *w, int64_t i, tide_dtype dt, __mmask16 m) {
    if (dt == TIDE_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i)), 16));
    if (dt == TIDE_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i));
    return _mm512_maskz_loadu_ps(m, (const float *)w + i);
}

/* o[r][n] (+)= x_r . w_n, x f32 (stride ldx), w of dt (stride ldw elements). */
TK_512 static TK_INLINE void f32_tile(const float *x, int64_t ldx, const void *w, int64_t ldw, tide_dtype dt,
                                      int64_t K, const int MR, const int NR, float *o, int64_t ldo, bool add) {
    size_t es = tide_dtype_size(dt);
    const uint8_t *wb = w;
    __m512 c[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) c[r][n] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 xv[4];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) xv[r] = _mm512_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) {
            __m512 wv = wload(wb + (size_t)(n * ldw) * es, k, dt);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) c[r][n] = _mm512_fmadd_ps(xv[r], wv, c[r][n]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 xv[4];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) xv[r] = _mm512_maskz_loadu_ps(m, x + r * ldx + k);
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) {
            __m512 wv = wload_mask(wb + (size_t)(n * ldw) * es, k, dt, m);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) c[r][n] = _mm512_fmadd_ps(xv[r], wv, c[r][n]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) {
            float s = hsum16(c[r][n]);
            o[r * ldo + n] = add ? o[r * ldo + n] + s : s;
        }
}

typedef void (*f32_tile_fn)(const float *, int64_t, const void *, int64_t, int64_t, float *, int64_t, bool);
#define F32_TILE(DT, TAG, MR, NR)                                                                                \
    TK_512 static void f32_tile_##TAG##_##MR##x##NR(const float *x, int64_t ldx, const void *w, int64_t ldw,     \
                                                   int64_t K, float *o, int64_t ldo, bool add) {               \
        f32_tile(x, ldx, w, ldw, DT, K, MR, NR, o, ldo, add);                                                  \
    }
#define F32_ROW(DT, TAG, MR) F32_TILE(DT, TAG, MR, 1) F32_TILE(DT, TAG, MR, 2) F32_TILE(DT, TAG, MR, 3) \
    F32_TILE(DT, TAG, MR, 4) F32_TILE(DT, TAG, MR, 5) F32_TILE(DT, TAG, MR, 6)
#define F32_DT(DT, TAG) F32_ROW(DT, TAG, 1) F32_ROW(DT, TAG, 2) F32_ROW(DT, TAG, 3) F32_ROW(DT, TAG, 4) \
    F32_TILE(DT, TAG, 1, 7) F32_TILE(DT, TAG, 1, 8) F32_TILE(DT, TAG, 2, 7) F32_TILE(DT, TAG, 2, 8)
F32_DT(TIDE_BF16, bf16)
F32_DT(TIDE_F16, f16)
F32_DT(TIDE_F32, f32)
#define F32_ROWFN(TAG, MR)                                                                                \
    {NULL, f32_tile_##TAG##_##MR##x1, f32_tile_##TAG##_##MR##x2, f32_tile_##TAG##_##MR##x3,                 \
     f32_tile_##TAG##_##MR##x4, f32_tile_##TAG##_##MR##x5, f32_tile_##TAG##_##MR##x6
#define F32_TABLE(TAG)                                                                                    \
    {{NULL},                                                                                              \
     F32_ROWFN(TAG, 1), f32_tile_##TAG##_1x7, f32_tile_##TAG##_1x8},                                      \
     F32_ROWFN(TAG, 2), f32_tile_##TAG##_2x7, f32_tile_##TAG##_2x8},                                      \
     F32_ROWFN(TAG, 3)},                                                                                  \
     F32_ROWFN(TAG, 4)}}
static const f32_tile_fn f32_tiles[3][5][9] = {F32_TABLE(bf16), F32_TABLE(f16), F32_TABLE(f32)};

/* ------------------------------------------------------------- drivers */

/* Rows of x per block: as many as keep a block of x within ~384 KiB (L2),
 * a multiple of 4, at least 4. */
static int64_t row_block(int64_t K, size_t es) {
    int64_t rb = (int64_t)((384u << 10) / ((size_t)K * es + 1)) & ~(int64_t)3;
    return TIDE_MAX(rb, 4);
}

/* Thread t's range [*n0, *n1) of N columns: contiguous, cut at multiples of
 * 8 (whole register tiles where N allows). */
static void col_range(int t, int nt, int64_t N, int64_t *n0, int64_t *n1) {
    *n0 = t == 0 ? 0 : (N * t / nt) & ~(int64_t)7;
    *n1 = t == nt - 1 ? N : (N * (t + 1) / nt) & ~(int64_t)7;
}

/* Threads for a product of R x K x N: one below ~1 MFLOP, else nt. */
static int mm_threads(int64_t R, int64_t K, int64_t N, int nt) {
    return (double)R * (double)K * (double)N < 5e5 ? 1 : nt;
}

void tk_mm_bf16(const uint16_t *xb, int64_t ldx, const uint16_t *w, int64_t R, int64_t K, int64_t N, float *out,
                int64_t ldo, bool add, int nt) {
    int64_t rb = row_block(K, 2);
    nt = mm_threads(R, K, N, nt);
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), nth = omp_get_num_threads();
        int64_t n0, n1;
        col_range(t, nth, N, &n0, &n1);
        for (int64_t r0 = 0; r0 < R; r0 += rb) {
            int64_t r1 = TIDE_MIN(R, r0 + rb);
            /* rows in register tiles of 4, then the last 1..3 */
            int mr_main = r1 - r0 >= 4 ? 4 : (int)(r1 - r0);
            int nr = bf16_nr[mr_main];
            for (int64_t n = n0; n < n1; n += nr) {
                int cn = (int)TIDE_MIN((int64_t)nr, n1 - n);
                for (int64_t r = r0; r < r1;) {
                    int mr = (int)TIDE_MIN((int64_t)mr_main, r1 - r);
                    int c = cn;
                    if (c > bf16_nr[mr]) c = bf16_nr[mr];
                    for (int64_t nn = n; nn < n + cn; nn += c) {
                        int cc = (int)TIDE_MIN((int64_t)c, n + cn - nn);
                        bf16_tiles[mr][cc](xb + r * ldx, ldx, w + nn * K, K, K, out + r * ldo + nn, ldo, add);
                    }
                    r += mr;
                }
            }
        }
    }
}

void tk_mm_f32w(const float *x, int64_t ldx, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                float *out, int64_t ldo, bool add, int nt) {
    int di = wdt == TIDE_BF16 ? 0 : wdt == TIDE_F16 ? 1 : 2;
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
    int64_t rb = row_block(K, 4);
    nt = mm_threads(R, K, N, nt);
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), nth = omp_get_num_threads();
        int64_t n0, n1;
        col_range(t, nth, N, &n0, &n1);
        for (int64_t r0 = 0; r0 < R; r0 += rb) {
            int64_t r1 = TIDE_MIN(R, r0 + rb);
            int mr_main = r1 - r0 >= 4 ? 4 : (int)(r1 - r0);
            int nr = bf16_nr[mr_main];
            for (int64_t n = n0; n < n1; n += nr) {
                int cn = (int)TIDE_MIN((int64_t)nr, n1 - n);
                for (int64_t r = r0; r < r1;) {
                    int mr = (int)TIDE_MIN((int64_t)mr_main, r1 - r);
                    int c = cn;
                    if (c > bf16_nr[mr]) c = bf16_nr[mr];
                    for (int64_t nn = n; nn < n + cn; nn += c) {
                        int cc = (int)TIDE_MIN((int64_t)c, n + cn - nn);
                        f32_tiles[di][mr][cc](x + r * ldx, ldx, wb + (size_t)(nn * K) * es, K, K, out + r * ldo + nn,
                                              ldo, add);
                    }
                    r += mr;
                }
            }
        }
    }
}

#else /* not x86-64: the callers check tk_cpu_has first */

void tk_mm_bf16(const uint16_t *xb, int64_t ldx, const uint16_t *w, int64_t R, int64_t K, int64_t N, float *out,
                int64_t ldo, bool add, int nt) {
    (void)xb, (void)ldx, (void)w, (void)R, (void)K, (void)N, (void)out, (void)ldo, (void)add, (void)nt;
}

void tk_mm_f32w(const float *x, int64_t ldx, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                float *out, int64_t ldo, bool add, int nt) {
    (void)x, (void)ldx, (void)w, (void)wdt, (void)R, (void)K, (void)N, (void)out, (void)ldo, (void)add, (void)nt;
}

#endif
