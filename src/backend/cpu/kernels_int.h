/*
 * kernels_int.h - pieces shared by the CPU kernel files (kernels.c,
 * matmul.c, attention.c, kernels_train.c): the AVX2 code-path markers, small
 * helpers, and the sgemm every training product goes through (sgemm.c).
 */
#ifndef TIDE_KERNELS_INT_H
#define TIDE_KERNELS_INT_H

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TK_X86 1
#define TK_AVX2 __attribute__((target("avx2,fma")))
#define TK_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#endif

/* Work below this many elements runs on the calling thread only. */
#define TK_PAR_MIN 16384

/* Floats of a row of 16-bit weights widened at a time into a stack buffer. */
#define TK_CHUNK 512

/* The AVX-512 paths (F, BW and VL) may run (cpu_features.h; false when the
 * portable paths are forced). */
bool tk_have_avx512(void);

#ifdef TK_X86
/* Sum of the 8 lanes, in a fixed order. */
TK_AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= 0 (softmax arguments): Cody-Waite reduction by ln 2 and a
 * degree-6 polynomial, within 2 ulp of expf; results below the smallest
 * normal float flush to 0; NaN stays NaN. */
TK_AVX2 static inline __m256 exp_neg_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x); /* keeps NaN: MAXPS returns the second operand */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif

/* Packs n (<= mr) rows of kc 32-bit words (row r at X + r * ld, along k),
 * times alpha unless alpha is 1 (then moved bit for bit), into d[k * mr +
 * r], rows n .. mr - 1 zeros: the along-k panels of sgemm.c (floats) and
 * sgemm_bf16.c (bf16 pairs), through 16 x 16 register transposes
 * (gemm_drive.c). AVX-512 only: the callers check tk_have_avx512. */
void tk_pack_t16(const float *X, int64_t ld, int64_t n, int64_t kc, float alpha, int mr, float *d);

/* C (M, N; row stride ldc) = alpha * op(A) . op(B) + beta * C, row-major, op
 * the transpose where ta / tb: A is (M, K) or, transposed, stored (K, M); B
 * is (K, N) or, transposed, stored (N, K). With beta 0, C's old contents are
 * not read. Each element's bits are fixed by its row of op(A), its column of
 * op(B), K, alpha, beta and the code path (sgemm.c gives the order).
 *   tk_sgemm: one product on the calling thread (sgemm.c's packed kernels,
 *             the path tk_sgemm_path names).
 *   tk_gemm:  the same on nt threads (gemm_drive.c: each packed block of
 *             op(B) shared by the threads, the blocks of rows handed out). */
/* The block of K whose sum tk_sgemm forms on its own before adding it to
 * the blocks' running sum (sgemm.c gives the order). */
#define TK_SGEMM_KC 256
void tk_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void tk_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc, int nt);
/* The blocked, threaded driver of sgemm.c and sgemm_bf16.c (gemm_drive.c):
 * a code path's register tiles and packing. A packed element is 4 bytes (an
 * f32, or with pairs a bf16 pair: a block of kc elements of K is then
 * (kc + 1) / 2 deep). pack_a packs rows [i0, i0 + n) x k in [p0, p0 + kc)
 * of op(A) into panels of r rows, pack_b k in [p0, p0 + kc) x columns
 * [i0, i0 + n) of op(B) into panels of r columns, kd deep, zeros past the
 * edges (the callers' files give the layouts). tile sums a register tile
 * over kd (c = t, or with add c = c + t); half (or NULL) the same over the
 * first nr / 2 columns. */
#define TK_GEMM_MR_MAX 12
#define TK_GEMM_NR_MAX 32
typedef void (*tk_gemm_tile_fn)(int64_t kd, const void *a, const void *b, float *c, int64_t ldc, bool add);
typedef void (*tk_gemm_pack_fn)(const void *ctx, int64_t i0, int64_t n, int64_t p0, int64_t kc, int r, int64_t kd,
                                uint32_t *dst);
typedef struct {
    int mr, nr;
    bool pairs;
    tk_gemm_tile_fn tile, half;
    tk_gemm_pack_fn pack_a, pack_b;
    const void *a_ctx, *b_ctx;
} tk_gemm_kern;
/* C (M x N, row stride ldc) = the sums s of the caller's header over K
 * (blocks of TK_SGEMM_KC), C not read; with add_c (K at most one block)
 * C = C + s. nt threads share each packed block of op(B); the bits are
 * those of one thread. */
void tk_gemm_sums(const tk_gemm_kern *kn, int64_t M, int64_t N, int64_t K, float *C, int64_t ldc, bool add_c,
                  int nt);

/* The products of a bf16 training step (sgemm_bf16.c): C (M, N; row stride
 * ldc) = op(A) . op(B), or with beta C + op(A) . op(B), every element of A
 * (of adt) and B (of bdt: f32, rounded to bf16 to nearest even; bf16 as
 * stored; f16 widened, then rounded) taken as bf16, products exact, sums in
 * f32 in the order sgemm_bf16.c gives (VDPBF16PS's), the same bits on every
 * code path but for subnormals, for any thread count. Shapes as tk_gemm's. */
void tk_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, tide_dtype adt, int64_t lda,
                  const void *B, tide_dtype bdt, int64_t ldb, bool beta, float *C, int64_t ldc, int nt);

/* ROPE (inverse false) and ROPE_BWD (inverse true: sin negated, the rotation
 * by minus the same angle, so the exact transpose): tk_rope's contract. */
void tk_rope_rotate(const float *x, const int32_t *pos, int64_t R, int64_t T, int H, int hd, float theta,
                    bool inverse, bool interleaved, float *out, int nt);

/* Replaces s[0..n) (n >= 1) by exp(s_j - max s) and returns their sum, in
 * double; *mx receives the max. AVX2 (exp_neg_avx2) when avx, expf else. */
double tk_exp_row(float *s, int64_t n, float *mx, bool avx);

/* ------------------------------------------------------------- matmul_avx512.c */

/* xb (R, K; row stride ldb) = x (R, K; row stride ldx) rounded to bf16 (to
 * nearest even; NaN stays NaN), the same bits on every code path. */
void tk_round_bf16(const float *x, int64_t ldx, int64_t R, int64_t K, uint16_t *xb, int64_t ldb, int nt);
/* out (R, N; row stride ldo) (+)= xb . w^T: xb (R, K) bf16 rows ldx apart,
 * w (N, K) bf16. AVX512_BF16 only (tk_cpu_has(TK_CPU_AVX512BF16)). Each
 * output's bits depend on its row of xb, its row of w and K alone. */
void tk_mm_bf16(const uint16_t *xb, int64_t ldx, const uint16_t *w, int64_t R, int64_t K, int64_t N, float *out,
                int64_t ldo, bool add, int nt);
/* out (R, N) (+)= x . w^T: x f32, w (N, K) of wdt (f32, f16, bf16) widened
 * exactly in registers. AVX-512 F/BW/VL only. Each output's bits depend on
 * its row of x, its row of w and K alone. */
void tk_mm_f32w(const float *x, int64_t ldx, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                float *out, int64_t ldo, bool add, int nt);

/* ------------------------------------------------------------- matmul_avx2.c */

/* tk_mm_f32w's contract without AVX-512: _avx2 on AVX2+FMA+F16C
 * (tk_have_avx2 only), _portable anywhere. Each output's bits depend on its
 * row of x, its row of w, K and the path alone. */
void tk_mm_f32w_avx2(const float *x, int64_t ldx, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                     float *out, int64_t ldo, bool add, int nt);
void tk_mm_f32w_portable(const float *x, int64_t ldx, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                         float *out, int64_t ldo, bool add, int nt);

/* ------------------------------------------------------------- matmul_quant.c */

/* Bytes of one row of K activations quantized by tk_quantize_act: K padded
 * to a multiple of 256 (Kp) int8 (element k at tk_q_pos(k)), Kp / 32 f32 scales, Kp / 16 int16 sums of
 * the integers of each 16 (zeros past K). */
size_t tk_matmul_q_row_bytes(int64_t K);
/* Where element k of a row sits among its int8s (and element k of a weight
 * row among an unpacked superchunk's, k < 256): each 256 in 8 vectors of 32
 * bytes, vector i holding elements 4i..4i+3 of each chunk of 32 in turn, so
 * that lane c of a 32-bit multiply-add over the vectors sums chunk c. */
static inline int64_t tk_q_pos(int64_t k) {
    int64_t c = k / 32 % 8, e = k % 32;
    return k / 256 * 256 + e / 4 * 32 + c * 4 + e % 4;
}
/* R rows of x (row stride ldx) quantized into dst, tk_matmul_q_row_bytes(K)
 * bytes a row: per 32 elements d = amax / 127 and q = rint(x * (127 /
 * amax)), clamped to [-127, 127] (NaN 0); the same bits on every path. */
void tk_quantize_act(const float *x, int64_t ldx, int64_t R, int64_t K, void *dst, int nt);

#endif
