/*
 * kernels_avx512.h - AVX-512 (F, BW, VL) helpers shared by the CPU kernel
 * files that have an AVX-512 path (attention.c, kernels.c). Each is the
 * 16-lane form of an AVX2 helper of kernels_int.h with the same operations
 * per lane, so that a lane's bits are those of the AVX2 helper; only
 * horizontal sums see a different (still fixed) order.
 */
#ifndef TIDE_KERNELS_AVX512_H
#define TIDE_KERNELS_AVX512_H

#include "backend/cpu/kernels_int.h"

#ifdef TK_X86
/* Sum of the 16 lanes in a fixed order: the two halves added, then hsum8. */
TK_AVX512 static inline float hsum16(__m512 v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum8(_mm256_add_ps(lo, hi));
}

/* exp_neg_avx2 on 16 lanes: exp(x) for x <= 0, within 2 ulp of expf, the
 * same bits per lane; below the smallest normal 0; NaN stays NaN. */
TK_AVX512 static inline __m512 exp_neg_avx512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(lo, x); /* keeps NaN: VMAXPS returns the second operand */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}
#endif

#endif
