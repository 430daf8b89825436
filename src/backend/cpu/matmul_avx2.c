/*
 * matmul_avx2.c - MATMUL (out = x . w^T, w (N, K) as stored) on CPUs without
 * AVX-512: AVX2+FMA register tiles (tk_mm_f32w_avx2) and their plain C form
 * (tk_mm_f32w_portable), chosen at run time (cpu_features.h) by matmul.c.
 *
 * The same inner-product form as matmul_avx512.c's tk_mm_f32w, on 8 lanes:
 * every output element has its own 8-lane f32 accumulator that runs over K
 * in order, 8 elements a step (the last 1..7 padded with zeros), and is
 * summed at the end by one fixed tree (hsum8's). Weights are widened exactly
 * (bf16: a shift; f16: VCVTPH2PS or tide_f16_to_f32; f32: as they are).
 * Register tiles group MR rows of x with NR rows of w only to share loads;
 * no output's arithmetic depends on MR, NR, R, N, the thread count or the
 * thread that runs it. So a row's result is the same bits whether it is
 * decoded alone, multiplied in a prompt, or in a planner's tile of any size,
 * on any number of threads. (A BLAS sgemm gives no such promise: OpenBLAS's
 * sums for one element change with the call's rows and columns, which is why
 * these paths no longer use it.)
 *
 * The portable form computes lane by lane what the AVX2 one computes
 * vector by vector, with a multiply and an add (ISO C: no contraction)
 * where AVX2 has one FMA; its bits are its own, as invariant.
 *
 * Threads and row blocks are matmul_avx512.c's: contiguous column ranges
 * per thread (each weight read by one thread), rows in blocks that stay in
 * L2 while a thread's weight rows stream past.
 */
#include "backend/cpu/kernels_int.h"

#include <omp.h>
#include <string.h>

#define TK_INLINE inline __attribute__((always_inline))

/* Bytes per weight, a constant where the tiles are instantiated (a call to
 * tide_dtype_size in the inner loop would spill every accumulator). */
#define W_SIZE(dt) ((dt) == TIDE_F32 ? (size_t)4 : (size_t)2)

/* A tile: o[r][n] (+)= x_r . w_n for its MR rows of x (f32, stride ldx) and
 * NR rows of w (stride K elements), over K. */
typedef void (*mm_tile_fn)(const float *x, int64_t ldx, const void *w, int64_t K, float *o, int64_t ldo, bool add);

/* ------------------------------------------------------------- AVX2 tiles */

#ifdef TK_X86
#define TK_A2 __attribute__((target("avx2,fma,f16c")))

/* 8 weights from element k of row w, widened exactly to f32. */
TK_A2 static TK_INLINE __m256 wload8(const void *w, int64_t k, tide_dtype dt) {
    if (dt == TIDE_BF16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k))), 16));
    if (dt == TIDE_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k)));
    return _mm256_loadu_ps((const float *)w + k);
}

/* One step of the tile over 8 elements of K: xs[r] and ws[n] point at them
 * (rows of x ldx apart, rows of w ldw elements apart). With MR > NR the w
 * vectors are held and x streamed, else the x vectors are held: either way
 * the accumulators and the held vectors fit the 16 registers. */
TK_A2 static TK_INLINE void step8(__m256 c[4][8], const float *x, int64_t ldx, const void *w, int64_t ldw,
                                  tide_dtype dt, int64_t k, const int MR, const int NR) {
    size_t es = W_SIZE(dt);
    const uint8_t *wb = w;
    if (MR > NR) {
        __m256 wv[8];
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) wv[n] = wload8(wb + (size_t)(n * ldw) * es, k, dt);
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 8
            for (int n = 0; n < NR; n++) c[r][n] = _mm256_fmadd_ps(xv, wv[n], c[r][n]);
        }
    } else {
        __m256 xv[4];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) xv[r] = _mm256_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) {
            __m256 wv = wload8(wb + (size_t)(n * ldw) * es, k, dt);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) c[r][n] = _mm256_fmadd_ps(xv[r], wv, c[r][n]);
        }
    }
}

TK_A2 static TK_INLINE void tile_avx2(const float *x, int64_t ldx, const void *w, int64_t K, tide_dtype dt,
                                      const int MR, const int NR, float *o, int64_t ldo, bool add) {
    __m256 c[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) c[r][n] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) step8(c, x, ldx, w, K, dt, k, MR, NR);
    if (k < K) { /* the last 1..7: copies padded with zeros, the same step */
        size_t m = (size_t)(K - k), es = W_SIZE(dt);
        _Alignas(32) float xt[4][8], wt[8][8];
        memset(xt, 0, sizeof xt);
        memset(wt, 0, sizeof wt);
        for (int r = 0; r < MR; r++) memcpy(xt[r], x + r * ldx + k, m * sizeof(float));
        for (int n = 0; n < NR; n++) tk_convert((const uint8_t *)w + (size_t)(n * K + k) * es, dt, wt[n], m);
        step8(c, xt[0], 8, wt[0], 8, TIDE_F32, 0, MR, NR);
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) {
            float s = hsum8(c[r][n]);
            o[r * ldo + n] = add ? o[r * ldo + n] + s : s;
        }
}

#define A2_TILE(DT, TAG, MR, NR)                                                                                \
    TK_A2 static void a2_##TAG##_##MR##x##NR(const float *x, int64_t ldx, const void *w, int64_t K, float *o,  \
                                             int64_t ldo, bool add) {                                          \
        tile_avx2(x, ldx, w, K, DT, MR, NR, o, ldo, add);                                                      \
    }
#define A2_DT(DT, TAG)                                                                                          \
    A2_TILE(DT, TAG, 1, 1) A2_TILE(DT, TAG, 1, 2) A2_TILE(DT, TAG, 1, 3) A2_TILE(DT, TAG, 1, 4)                 \
    A2_TILE(DT, TAG, 1, 5) A2_TILE(DT, TAG, 1, 6) A2_TILE(DT, TAG, 1, 7) A2_TILE(DT, TAG, 1, 8)                 \
    A2_TILE(DT, TAG, 2, 1) A2_TILE(DT, TAG, 2, 2) A2_TILE(DT, TAG, 2, 3) A2_TILE(DT, TAG, 2, 4)                 \
    A2_TILE(DT, TAG, 2, 5) A2_TILE(DT, TAG, 2, 6) A2_TILE(DT, TAG, 3, 1) A2_TILE(DT, TAG, 3, 2)                 \
    A2_TILE(DT, TAG, 3, 3) A2_TILE(DT, TAG, 3, 4) A2_TILE(DT, TAG, 4, 1) A2_TILE(DT, TAG, 4, 2)                 \
    A2_TILE(DT, TAG, 4, 3)
A2_DT(TIDE_BF16, bf16)
A2_DT(TIDE_F16, f16)
A2_DT(TIDE_F32, f32)
#define A2_TABLE(TAG)                                                                                          \
    {{NULL},                                                                                                   \
     {NULL, a2_##TAG##_1x1, a2_##TAG##_1x2, a2_##TAG##_1x3, a2_##TAG##_1x4, a2_##TAG##_1x5, a2_##TAG##_1x6,    \
      a2_##TAG##_1x7, a2_##TAG##_1x8},                                                                         \
     {NULL, a2_##TAG##_2x1, a2_##TAG##_2x2, a2_##TAG##_2x3, a2_##TAG##_2x4, a2_##TAG##_2x5, a2_##TAG##_2x6},   \
     {NULL, a2_##TAG##_3x1, a2_##TAG##_3x2, a2_##TAG##_3x3, a2_##TAG##_3x4},                                   \
     {NULL, a2_##TAG##_4x1, a2_##TAG##_4x2, a2_##TAG##_4x3}}
static const mm_tile_fn a2_tiles[3][5][9] = {A2_TABLE(bf16), A2_TABLE(f16), A2_TABLE(f32)};
#endif

/* The widest NR per MR (accumulators and held vectors within 16 registers). */
static const int a2_nr[5] = {0, 8, 6, 4, 3};

/* ------------------------------------------------------------- portable tiles */

/* Element k of row w widened exactly to f32. */
static TK_INLINE float wget(const void *w, int64_t k, tide_dtype dt) {
    if (dt == TIDE_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)w)[k] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    if (dt == TIDE_F16) return tide_f16_to_f32(((const uint16_t *)w)[k]);
    return ((const float *)w)[k];
}

/* tile_avx2 lane by lane: c[r][n][l] += x_r[k + l] * w_n[k + l] for l < m,
 * lanes from m on adding 0 * 0 as AVX2's padded step does. */
static TK_INLINE void pt_step(float c[2][4][8], const float *x, int64_t ldx, const void *w, int64_t K, tide_dtype dt,
                              int64_t k, int m, const int MR, const int NR) {
    size_t es = W_SIZE(dt);
    float wv[4][8], xv[2][8];
    for (int n = 0; n < NR; n++)
        for (int l = 0; l < 8; l++) wv[n][l] = l < m ? wget((const uint8_t *)w + (size_t)(n * K) * es, k + l, dt) : 0.0f;
    for (int r = 0; r < MR; r++)
        for (int l = 0; l < 8; l++) xv[r][l] = l < m ? x[r * ldx + k + l] : 0.0f;
    for (int r = 0; r < MR; r++)
        for (int n = 0; n < NR; n++)
            for (int l = 0; l < 8; l++) c[r][n][l] += xv[r][l] * wv[n][l];
}

static TK_INLINE void tile_portable(const float *x, int64_t ldx, const void *w, int64_t K, tide_dtype dt, const int MR,
                                    const int NR, float *o, int64_t ldo, bool add) {
    float c[2][4][8] = {{{0}}};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) pt_step(c, x, ldx, w, K, dt, k, 8, MR, NR);
    if (k < K) pt_step(c, x, ldx, w, K, dt, k, (int)(K - k), MR, NR);
    for (int r = 0; r < MR; r++)
        for (int n = 0; n < NR; n++) {
            const float *v = c[r][n]; /* hsum8's tree */
            float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
            o[r * ldo + n] = add ? o[r * ldo + n] + s : s;
        }
}

#define PT_TILE(DT, TAG, MR, NR)                                                                                   \
    static void pt_##TAG##_##MR##x##NR(const float *x, int64_t ldx, const void *w, int64_t K, float *o, int64_t ldo, \
                                       bool add) {                                                                \
        tile_portable(x, ldx, w, K, DT, MR, NR, o, ldo, add);                                                     \
    }
#define PT_DT(DT, TAG)                                                                                            \
    PT_TILE(DT, TAG, 1, 1) PT_TILE(DT, TAG, 1, 2) PT_TILE(DT, TAG, 1, 3) PT_TILE(DT, TAG, 1, 4)                   \
    PT_TILE(DT, TAG, 2, 1) PT_TILE(DT, TAG, 2, 2)
PT_DT(TIDE_BF16, bf16)
PT_DT(TIDE_F16, f16)
PT_DT(TIDE_F32, f32)
#define PT_TABLE(TAG)                                                                                    \
    {{NULL},                                                                                             \
     {NULL, pt_##TAG##_1x1, pt_##TAG##_1x2, pt_##TAG##_1x3, pt_##TAG##_1x4},                             \
     {NULL, pt_##TAG##_2x1, pt_##TAG##_2x2}}
static const mm_tile_fn pt_tiles[3][3][5] = {PT_TABLE(bf16), PT_TABLE(f16), PT_TABLE(f32)};
static const int pt_nr[3] = {0, 4, 2};

/* ------------------------------------------------------------- driver */

/* Rows of x per block: as many as keep a block of x within ~384 KiB (L2),
 * a multiple of 4, at least 4. */
static int64_t row_block(int64_t K) {
    int64_t rb = (int64_t)((384u << 10) / ((size_t)K * sizeof(float) + 1)) & ~(int64_t)3;
    return TIDE_MAX(rb, 4);
}

/* Thread t's range [*n0, *n1) of N columns: contiguous, cut at multiples of
 * 8 (whole register tiles where N allows). */
static void col_range(int t, int nt, int64_t N, int64_t *n0, int64_t *n1) {
    *n0 = t == 0 ? 0 : (N * t / nt) & ~(int64_t)7;
    *n1 = t == nt - 1 ? N : (N * (t + 1) / nt) & ~(int64_t)7;
}

/* The tiles of one thread's columns [n0, n1) over rows [r0, r1): rows in
 * tiles of mr_max, then the last ones; columns at the widest NR for the
 * rows' MR, then narrower. tile(mr, nr) picks the kernel. */
typedef struct mm_kind {
    int mr_max;
    const int *nr;
    mm_tile_fn (*tile)(int di, int mr, int nr);
} mm_kind;

#ifdef TK_X86
static mm_tile_fn a2_tile(int di, int mr, int nr) { return a2_tiles[di][mr][nr]; }
#endif
static mm_tile_fn pt_tile(int di, int mr, int nr) { return pt_tiles[di][mr][nr]; }

static void mm_run(const mm_kind *kd, const float *x, int64_t ldx, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                   int64_t N, float *out, int64_t ldo, bool add, int nt) {
    int di = wdt == TIDE_BF16 ? 0 : wdt == TIDE_F16 ? 1 : 2;
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
    int64_t rb = row_block(K);
    if ((double)R * (double)K * (double)N < 5e5) nt = 1; /* below ~1 MFLOP, one thread */
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), nth = omp_get_num_threads();
        int64_t n0, n1;
        col_range(t, nth, N, &n0, &n1);
        for (int64_t r0 = 0; r0 < R; r0 += rb) {
            int64_t r1 = TIDE_MIN(R, r0 + rb);
            int mr_main = (int)TIDE_MIN((int64_t)kd->mr_max, r1 - r0);
            int nr = kd->nr[mr_main];
            for (int64_t n = n0; n < n1; n += nr) {
                int cn = (int)TIDE_MIN((int64_t)nr, n1 - n);
                for (int64_t r = r0; r < r1;) {
                    int mr = (int)TIDE_MIN((int64_t)mr_main, r1 - r);
                    int c = TIDE_MIN(cn, kd->nr[mr]);
                    for (int64_t nn = n; nn < n + cn; nn += c) {
                        int cc = (int)TIDE_MIN((int64_t)c, n + cn - nn);
                        kd->tile(di, mr, cc)(x + r * ldx, ldx, wb + (size_t)(nn * K) * es, K, out + r * ldo + nn, ldo,
                                             add);
                    }
                    r += mr;
                }
            }
        }
    }
}

void tk_mm_f32w_avx2(const float *x, int64_t ldx, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                     float *out, int64_t ldo, bool add, int nt) {
#ifdef TK_X86
    static const mm_kind kd = {4, a2_nr, a2_tile};
    mm_run(&kd, x, ldx, w, wdt, R, K, N, out, ldo, add, nt);
#else /* the callers check tk_have_avx2 first */
    (void)x, (void)ldx, (void)w, (void)wdt, (void)R, (void)K, (void)N, (void)out, (void)ldo, (void)add, (void)nt;
    (void)a2_nr;
#endif
}

void tk_mm_f32w_portable(const float *x, int64_t ldx, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                         float *out, int64_t ldo, bool add, int nt) {
    static const mm_kind kd = {2, pt_nr, pt_tile};
    mm_run(&kd, x, ldx, w, wdt, R, K, N, out, ldo, add, nt);
}
