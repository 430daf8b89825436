/*
 * kernels_int.h - pieces shared by the CPU kernel files (kernels.c,
 * attention.c): the AVX2 code-path markers and small helpers.
 */
#ifndef TIDE_KERNELS_INT_H
#define TIDE_KERNELS_INT_H

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TK_X86 1
#define TK_AVX2 __attribute__((target("avx2,fma")))
#endif

/* Work below this many elements runs on the calling thread only. */
#define TK_PAR_MIN 16384

#ifdef TK_X86
/* Sum of the 8 lanes, in a fixed order. */
TK_AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#endif
