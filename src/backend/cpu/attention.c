/*
 * attention.c - causal grouped-query attention on the CPU: the ATTENTION op
 * of tide.h over the KV cache or, without one, over k and v themselves, and
 * its gradient ATTENTION_BWD.
 *
 * Tiled flash-style: a task is (batch b, kv head g, a few query heads of that
 * group, a block of queries); its rows (head, query) share each key tile,
 * which is transposed once into a stack tile; scores, an online softmax
 * (running max m, running sum l) and P.V are accumulated tile by tile into an
 * output tile. Each row reads only keys j <= its position, so stale cache rows
 * are never touched. A task's result does not depend on which thread runs it,
 * so tasks are handed out dynamically, heaviest first; the output bits do not
 * depend on the thread count. Without a cache the same tasks read k and v in
 * place of the cache rows they would have been copied to, so the output is
 * the fresh-cache form's bit for bit.
 *
 * Three paths, chosen at run time: AVX-512, AVX2, portable. The AVX-512
 * kernels are the AVX2 ones on 16 lanes: every score and every P.V element
 * is the same FMA sequence (d, then j, in order) and exp is the same
 * polynomial, so they give the AVX2 bits there; only the softmax's sum over
 * a key tile adds 16 lanes instead of 8. Each row's arithmetic depends on
 * that row and the key tiling (fixed by head_dim) alone, never on which
 * rows share a task, so a plan that tiles query rows gets the untiled bits.
 *
 * The backward recomputes the softmax instead of storing it: a task is (batch
 * b, kv head g) and owns dq of the group's query heads and dk, dv of g, so no
 * two tasks write one element. Per head and block of bq queries (keys 0..the
 * block's last) five sgemm calls on the task's thread: S = scale Q K^T (then
 * P, masked past each query's position), dV += P^T dO, dP = dO V^T, dS = P
 * (dP - rowsum(dO O)) in place, dQ = scale dS K, dK += scale dS^T Q. dk and
 * dv sum over heads then query blocks in that order whatever the thread
 * count. The memory is two bq x T buffers per thread (tk_attention_bwd_work).
 */
#include "backend/cpu/kernels_int.h"
#include "backend/cpu/kernels_avx512.h"
#include "core/quant.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>

/* ------------------------------------------------------------- attention */

/* Tile budget: the transposed key tile and the output tile hold at most
 * ATT_BUF floats each, so a task's stack is < 96 KiB for any head_dim. */
#define ATT_BUF 8192
#define ATT_MAX_ROWS 64
#define ATT_MAX_KEYS 64

enum { ATT_PORTABLE, ATT_AVX2, ATT_AVX512 };

/* The forward's code path, from the instruction sets tk_cpu allows. */
static int att_path(void) {
    if (tk_have_avx512()) return ATT_AVX512;
    return tk_have_avx2() ? ATT_AVX2 : ATT_PORTABLE;
}

typedef struct att_task {
    int nrows;
    const float *qrow[ATT_MAX_ROWS];
    float *orow[ATT_MAX_ROWS];
    int64_t rpos[ATT_MAX_ROWS];
} att_task;

/* S[i][j] = scale * q_i . Kt[:, j] for rows i, keys j < jmax[i] rounded up to
 * 8 or 16. Kt (hd, ldk) holds keys as columns, zero past the tile's keys. */
static void att_scores_generic(const att_task *tk, const float *Kt, int ldk, const int *jmax,
                               int hd, float scale, float *S, int lds) {
    for (int i = 0; i < tk->nrows; i++) {
        float *s = S + i * lds;
        int n = jmax[i];
        for (int j = 0; j < n; j++) s[j] = 0;
        for (int d = 0; d < hd; d++) {
            float qd = tk->qrow[i][d];
            const float *kt = Kt + d * ldk;
#pragma omp simd
            for (int j = 0; j < n; j++) s[j] += qd * kt[j];
        }
        for (int j = 0; j < n; j++) s[j] *= scale;
    }
}

/* O[i] += sum_{ja <= j < jb} P[i][j] * V_j; V_j = vb + j * vs. */
static void att_pv_row_generic(const float *p, int ja, int jb, const float *vb, int64_t vs,
                               int hd, float *o) {
    for (int j = ja; j < jb; j++) {
        float pj = p[j];
        const float *vr = vb + j * vs;
#pragma omp simd
        for (int d = 0; d < hd; d++) o[d] += pj * vr[d];
    }
}

#ifdef TK_X86
TK_AVX2 static void att_scores_avx2(const att_task *tk, const float *Kt, int ldk, const int *jmax,
                                    int hd, float scale, float *S, int lds) {
    __m256 sc = _mm256_set1_ps(scale);
    int i = 0;
    for (; i + 4 <= tk->nrows; i += 4) {
        int n = TIDE_MAX(TIDE_MAX(jmax[i], jmax[i + 1]), TIDE_MAX(jmax[i + 2], jmax[i + 3]));
        const float *q0 = tk->qrow[i], *q1 = tk->qrow[i + 1], *q2 = tk->qrow[i + 2],
                    *q3 = tk->qrow[i + 3];
        for (int j = 0; j < n; j += 16) {
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00,
                   a21 = a00, a30 = a00, a31 = a00;
            const float *kt = Kt + j;
            for (int d = 0; d < hd; d++, kt += ldk) {
                __m256 k0 = _mm256_load_ps(kt), k1 = _mm256_load_ps(kt + 8), b;
                b = _mm256_broadcast_ss(q0 + d);
                a00 = _mm256_fmadd_ps(b, k0, a00);
                a01 = _mm256_fmadd_ps(b, k1, a01);
                b = _mm256_broadcast_ss(q1 + d);
                a10 = _mm256_fmadd_ps(b, k0, a10);
                a11 = _mm256_fmadd_ps(b, k1, a11);
                b = _mm256_broadcast_ss(q2 + d);
                a20 = _mm256_fmadd_ps(b, k0, a20);
                a21 = _mm256_fmadd_ps(b, k1, a21);
                b = _mm256_broadcast_ss(q3 + d);
                a30 = _mm256_fmadd_ps(b, k0, a30);
                a31 = _mm256_fmadd_ps(b, k1, a31);
            }
            float *s = S + i * lds + j;
            _mm256_store_ps(s, _mm256_mul_ps(a00, sc));
            _mm256_store_ps(s + 8, _mm256_mul_ps(a01, sc));
            _mm256_store_ps(s + lds, _mm256_mul_ps(a10, sc));
            _mm256_store_ps(s + lds + 8, _mm256_mul_ps(a11, sc));
            _mm256_store_ps(s + 2 * lds, _mm256_mul_ps(a20, sc));
            _mm256_store_ps(s + 2 * lds + 8, _mm256_mul_ps(a21, sc));
            _mm256_store_ps(s + 3 * lds, _mm256_mul_ps(a30, sc));
            _mm256_store_ps(s + 3 * lds + 8, _mm256_mul_ps(a31, sc));
        }
    }
    for (; i < tk->nrows; i++) {
        const float *q0 = tk->qrow[i];
        for (int j = 0; j < jmax[i]; j += 16) {
            __m256 a00 = _mm256_setzero_ps(), a01 = a00;
            const float *kt = Kt + j;
            for (int d = 0; d < hd; d++, kt += ldk) {
                __m256 b = _mm256_broadcast_ss(q0 + d);
                a00 = _mm256_fmadd_ps(b, _mm256_load_ps(kt), a00);
                a01 = _mm256_fmadd_ps(b, _mm256_load_ps(kt + 8), a01);
            }
            _mm256_store_ps(S + i * lds + j, _mm256_mul_ps(a00, sc));
            _mm256_store_ps(S + i * lds + j + 8, _mm256_mul_ps(a01, sc));
        }
    }
}

/* One row, keys ja..jb-1, hd % 16 == 0; per element the same FMA sequence as
 * the 4-row kernel, so grouping never changes a bit. */
TK_AVX2 static void att_pv_row_avx2(const float *p, int ja, int jb, const float *vb, int64_t vs,
                                    int hd, float *o) {
    for (int d = 0; d < hd; d += 16) {
        __m256 o0 = _mm256_loadu_ps(o + d), o1 = _mm256_loadu_ps(o + d + 8);
        for (int j = ja; j < jb; j++) {
            __m256 b = _mm256_broadcast_ss(p + j);
            const float *vr = vb + j * vs + d;
            o0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(vr), o0);
            o1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(vr + 8), o1);
        }
        _mm256_storeu_ps(o + d, o0);
        _mm256_storeu_ps(o + d + 8, o1);
    }
}

TK_AVX2 static void att_pv_avx2(const float *P, int lds, const int *lim, int nrows,
                                const float *vb, int64_t vs, int hd, float *O) {
    int i = 0;
    for (; i + 4 <= nrows; i += 4) {
        int jc = TIDE_MIN(TIDE_MIN(lim[i], lim[i + 1]), TIDE_MIN(lim[i + 2], lim[i + 3]));
        const float *p0 = P + i * lds, *p1 = p0 + lds, *p2 = p1 + lds, *p3 = p2 + lds;
        for (int d = 0; d < hd; d += 16) {
            float *o = O + i * hd + d;
            __m256 a00 = _mm256_loadu_ps(o), a01 = _mm256_loadu_ps(o + 8);
            __m256 a10 = _mm256_loadu_ps(o + hd), a11 = _mm256_loadu_ps(o + hd + 8);
            __m256 a20 = _mm256_loadu_ps(o + 2 * hd), a21 = _mm256_loadu_ps(o + 2 * hd + 8);
            __m256 a30 = _mm256_loadu_ps(o + 3 * hd), a31 = _mm256_loadu_ps(o + 3 * hd + 8);
            for (int j = 0; j < jc; j++) {
                const float *vr = vb + j * vs + d;
                __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8), b;
                b = _mm256_broadcast_ss(p0 + j);
                a00 = _mm256_fmadd_ps(b, v0, a00);
                a01 = _mm256_fmadd_ps(b, v1, a01);
                b = _mm256_broadcast_ss(p1 + j);
                a10 = _mm256_fmadd_ps(b, v0, a10);
                a11 = _mm256_fmadd_ps(b, v1, a11);
                b = _mm256_broadcast_ss(p2 + j);
                a20 = _mm256_fmadd_ps(b, v0, a20);
                a21 = _mm256_fmadd_ps(b, v1, a21);
                b = _mm256_broadcast_ss(p3 + j);
                a30 = _mm256_fmadd_ps(b, v0, a30);
                a31 = _mm256_fmadd_ps(b, v1, a31);
            }
            _mm256_storeu_ps(o, a00);
            _mm256_storeu_ps(o + 8, a01);
            _mm256_storeu_ps(o + hd, a10);
            _mm256_storeu_ps(o + hd + 8, a11);
            _mm256_storeu_ps(o + 2 * hd, a20);
            _mm256_storeu_ps(o + 2 * hd + 8, a21);
            _mm256_storeu_ps(o + 3 * hd, a30);
            _mm256_storeu_ps(o + 3 * hd + 8, a31);
        }
        for (int r = 0; r < 4; r++)
            if (lim[i + r] > jc)
                att_pv_row_avx2(P + (i + r) * lds, jc, lim[i + r], vb, vs, hd, O + (i + r) * hd);
    }
    for (; i < nrows; i++) att_pv_row_avx2(P + i * lds, 0, lim[i], vb, vs, hd, O + i * hd);
}
#endif

/* Online-softmax step for one row: s holds n > 0 scores of this key tile;
 * replaces them with p_j = exp(s_j - m'), m' = max(*m, max s), updates the
 * running max *m and sum *l, and returns the factor exp(*m - m') that earlier
 * accumulations must be scaled by. */
static float att_softmax_generic(float *s, int n, float *m, float *l) {
    float mx = s[0];
    for (int j = 1; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    float mnew = mx > *m ? mx : *m;
    float corr = expf(*m - mnew), sum = 0;
    for (int j = 0; j < n; j++) {
        float pj = expf(s[j] - mnew);
        s[j] = pj;
        sum += pj;
    }
    *l = *l * corr + sum;
    *m = mnew;
    return corr;
}

/* Kt[d * ldk + j] = key j's element d, for keys j < nk (key j at kb + j * vs). */
static void att_transpose_generic(const float *kb, int64_t vs, int nk, int hd, float *Kt, int ldk) {
    for (int j = 0; j < nk; j++) {
        const float *kr = kb + j * vs;
        for (int d = 0; d < hd; d++) Kt[d * ldk + j] = kr[d];
    }
}

#ifdef TK_X86
/* att_softmax_generic in 8-float blocks; s has room for n rounded up to 8
 * (lanes past n become 0). */
TK_AVX2 static float att_softmax_avx2(float *s, int n, float *m, float *l) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmx = ninf;
    for (int j = 0; j < n; j += 8) {
        __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lane));
        vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + j), valid));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmx), _mm256_extractf128_ps(vmx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float mx = _mm_cvtss_f32(h);
    float mnew = mx > *m ? mx : *m;
    __m256 vm = _mm256_set1_ps(mnew), vsum = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lane));
        __m256 p = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        p = _mm256_and_ps(p, valid);
        _mm256_storeu_ps(s + j, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    float corr = _mm_cvtss_f32(_mm256_castps256_ps128(exp_neg_avx2(_mm256_set1_ps(*m - mnew))));
    *l = *l * corr + hsum8(vsum);
    *m = mnew;
    return corr;
}

/* att_transpose_generic with 8x8 register transposes (hd % 8 == 0). */
TK_AVX2 static void att_transpose_avx2(const float *kb, int64_t vs, int nk, int hd, float *Kt, int ldk) {
    int j = 0;
    for (; j + 8 <= nk; j += 8) {
        for (int d = 0; d < hd; d += 8) {
            __m256 r0 = _mm256_loadu_ps(kb + (j + 0) * vs + d), r1 = _mm256_loadu_ps(kb + (j + 1) * vs + d);
            __m256 r2 = _mm256_loadu_ps(kb + (j + 2) * vs + d), r3 = _mm256_loadu_ps(kb + (j + 3) * vs + d);
            __m256 r4 = _mm256_loadu_ps(kb + (j + 4) * vs + d), r5 = _mm256_loadu_ps(kb + (j + 5) * vs + d);
            __m256 r6 = _mm256_loadu_ps(kb + (j + 6) * vs + d), r7 = _mm256_loadu_ps(kb + (j + 7) * vs + d);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
            __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
            __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
            float *o = Kt + d * ldk + j;
            _mm256_store_ps(o + 0 * ldk, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_store_ps(o + 1 * ldk, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_store_ps(o + 2 * ldk, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_store_ps(o + 3 * ldk, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_store_ps(o + 4 * ldk, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_store_ps(o + 5 * ldk, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_store_ps(o + 6 * ldk, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_store_ps(o + 7 * ldk, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    }
    if (j < nk) att_transpose_generic(kb + j * vs, vs, nk - j, hd, Kt + j, ldk);
}
#endif

#ifdef TK_X86
/* att_scores_avx2 on 16 lanes: a key's score is the same FMA chain over d
 * (from 0, then times scale), so the bits are the AVX2 path's. Four rows
 * share each key load; 32 keys at a time where the rows reach that far. */
TK_AVX512 static void att_scores_avx512(const att_task *tk, const float *Kt, int ldk, const int *jmax,
                                        int hd, float scale, float *S, int lds) {
    const __m512 sc = _mm512_set1_ps(scale);
    int i = 0;
    for (; i + 4 <= tk->nrows; i += 4) {
        int n = TIDE_MAX(TIDE_MAX(jmax[i], jmax[i + 1]), TIDE_MAX(jmax[i + 2], jmax[i + 3]));
        const float *q0 = tk->qrow[i], *q1 = tk->qrow[i + 1], *q2 = tk->qrow[i + 2],
                    *q3 = tk->qrow[i + 3];
        float *s = S + i * lds;
        int j = 0;
        for (; j + 32 <= n; j += 32) {
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00,
                   a21 = a00, a30 = a00, a31 = a00;
            const float *kt = Kt + j;
            for (int d = 0; d < hd; d++, kt += ldk) {
                __m512 k0 = _mm512_load_ps(kt), k1 = _mm512_load_ps(kt + 16), b;
                b = _mm512_set1_ps(q0[d]);
                a00 = _mm512_fmadd_ps(b, k0, a00);
                a01 = _mm512_fmadd_ps(b, k1, a01);
                b = _mm512_set1_ps(q1[d]);
                a10 = _mm512_fmadd_ps(b, k0, a10);
                a11 = _mm512_fmadd_ps(b, k1, a11);
                b = _mm512_set1_ps(q2[d]);
                a20 = _mm512_fmadd_ps(b, k0, a20);
                a21 = _mm512_fmadd_ps(b, k1, a21);
                b = _mm512_set1_ps(q3[d]);
                a30 = _mm512_fmadd_ps(b, k0, a30);
                a31 = _mm512_fmadd_ps(b, k1, a31);
            }
            _mm512_store_ps(s + j, _mm512_mul_ps(a00, sc));
            _mm512_store_ps(s + j + 16, _mm512_mul_ps(a01, sc));
            _mm512_store_ps(s + lds + j, _mm512_mul_ps(a10, sc));
            _mm512_store_ps(s + lds + j + 16, _mm512_mul_ps(a11, sc));
            _mm512_store_ps(s + 2 * lds + j, _mm512_mul_ps(a20, sc));
            _mm512_store_ps(s + 2 * lds + j + 16, _mm512_mul_ps(a21, sc));
            _mm512_store_ps(s + 3 * lds + j, _mm512_mul_ps(a30, sc));
            _mm512_store_ps(s + 3 * lds + j + 16, _mm512_mul_ps(a31, sc));
        }
        for (; j < n; j += 16) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            const float *kt = Kt + j;
            for (int d = 0; d < hd; d++, kt += ldk) {
                __m512 k0 = _mm512_load_ps(kt);
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[d]), k0, a0);
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(q1[d]), k0, a1);
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(q2[d]), k0, a2);
                a3 = _mm512_fmadd_ps(_mm512_set1_ps(q3[d]), k0, a3);
            }
            _mm512_store_ps(s + j, _mm512_mul_ps(a0, sc));
            _mm512_store_ps(s + lds + j, _mm512_mul_ps(a1, sc));
            _mm512_store_ps(s + 2 * lds + j, _mm512_mul_ps(a2, sc));
            _mm512_store_ps(s + 3 * lds + j, _mm512_mul_ps(a3, sc));
        }
    }
    for (; i < tk->nrows; i++) {
        const float *q0 = tk->qrow[i];
        for (int j = 0; j < jmax[i]; j += 16) {
            __m512 a0 = _mm512_setzero_ps();
            const float *kt = Kt + j;
            for (int d = 0; d < hd; d++, kt += ldk) a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[d]), _mm512_load_ps(kt), a0);
            _mm512_store_ps(S + i * lds + j, _mm512_mul_ps(a0, sc));
        }
    }
}

/* att_pv_row_avx2 on 16 lanes (hd % 16 == 0): the same FMA per element. */
TK_AVX512 static void att_pv_row_avx512(const float *p, int ja, int jb, const float *vb, int64_t vs,
                                        int hd, float *o) {
    for (int d = 0; d < hd; d += 16) {
        __m512 o0 = _mm512_loadu_ps(o + d);
        for (int j = ja; j < jb; j++)
            o0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_loadu_ps(vb + j * vs + d), o0);
        _mm512_storeu_ps(o + d, o0);
    }
}

/* att_pv_avx2 on 16 lanes: four rows share each value load, 32 elements of
 * d at a time where hd allows; per element the row kernel's FMA sequence. */
TK_AVX512 static void att_pv_avx512(const float *P, int lds, const int *lim, int nrows,
                                    const float *vb, int64_t vs, int hd, float *O) {
    int i = 0;
    for (; i + 4 <= nrows; i += 4) {
        int jc = TIDE_MIN(TIDE_MIN(lim[i], lim[i + 1]), TIDE_MIN(lim[i + 2], lim[i + 3]));
        const float *p0 = P + i * lds, *p1 = p0 + lds, *p2 = p1 + lds, *p3 = p2 + lds;
        int d = 0;
        for (; d + 32 <= hd; d += 32) {
            float *o = O + i * hd + d;
            __m512 a00 = _mm512_loadu_ps(o), a01 = _mm512_loadu_ps(o + 16);
            __m512 a10 = _mm512_loadu_ps(o + hd), a11 = _mm512_loadu_ps(o + hd + 16);
            __m512 a20 = _mm512_loadu_ps(o + 2 * hd), a21 = _mm512_loadu_ps(o + 2 * hd + 16);
            __m512 a30 = _mm512_loadu_ps(o + 3 * hd), a31 = _mm512_loadu_ps(o + 3 * hd + 16);
            for (int j = 0; j < jc; j++) {
                const float *vr = vb + j * vs + d;
                __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16), b;
                b = _mm512_set1_ps(p0[j]);
                a00 = _mm512_fmadd_ps(b, v0, a00);
                a01 = _mm512_fmadd_ps(b, v1, a01);
                b = _mm512_set1_ps(p1[j]);
                a10 = _mm512_fmadd_ps(b, v0, a10);
                a11 = _mm512_fmadd_ps(b, v1, a11);
                b = _mm512_set1_ps(p2[j]);
                a20 = _mm512_fmadd_ps(b, v0, a20);
                a21 = _mm512_fmadd_ps(b, v1, a21);
                b = _mm512_set1_ps(p3[j]);
                a30 = _mm512_fmadd_ps(b, v0, a30);
                a31 = _mm512_fmadd_ps(b, v1, a31);
            }
            _mm512_storeu_ps(o, a00);
            _mm512_storeu_ps(o + 16, a01);
            _mm512_storeu_ps(o + hd, a10);
            _mm512_storeu_ps(o + hd + 16, a11);
            _mm512_storeu_ps(o + 2 * hd, a20);
            _mm512_storeu_ps(o + 2 * hd + 16, a21);
            _mm512_storeu_ps(o + 3 * hd, a30);
            _mm512_storeu_ps(o + 3 * hd + 16, a31);
        }
        for (; d < hd; d += 16) {
            float *o = O + i * hd + d;
            __m512 a0 = _mm512_loadu_ps(o), a1 = _mm512_loadu_ps(o + hd);
            __m512 a2 = _mm512_loadu_ps(o + 2 * hd), a3 = _mm512_loadu_ps(o + 3 * hd);
            for (int j = 0; j < jc; j++) {
                __m512 v0 = _mm512_loadu_ps(vb + j * vs + d);
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[j]), v0, a0);
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(p1[j]), v0, a1);
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(p2[j]), v0, a2);
                a3 = _mm512_fmadd_ps(_mm512_set1_ps(p3[j]), v0, a3);
            }
            _mm512_storeu_ps(o, a0);
            _mm512_storeu_ps(o + hd, a1);
            _mm512_storeu_ps(o + 2 * hd, a2);
            _mm512_storeu_ps(o + 3 * hd, a3);
        }
        for (int r = 0; r < 4; r++)
            if (lim[i + r] > jc)
                att_pv_row_avx512(P + (i + r) * lds, jc, lim[i + r], vb, vs, hd, O + (i + r) * hd);
    }
    for (; i < nrows; i++) att_pv_row_avx512(P + i * lds, 0, lim[i], vb, vs, hd, O + i * hd);
}

/* att_softmax_avx2 in 16-float blocks; s has room for n rounded up to 16
 * (lanes past n become 0). The same p_j bits; the sum adds 16 lanes. */
TK_AVX512 static float att_softmax_avx512(float *s, int n, float *m, float *l) {
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16) {
        __mmask16 valid = (__mmask16)(n - j >= 16 ? 0xffff : (1u << (n - j)) - 1);
        vmx = _mm512_mask_max_ps(vmx, valid, vmx, _mm512_loadu_ps(s + j));
    }
    float mx = _mm512_reduce_max_ps(vmx);
    float mnew = mx > *m ? mx : *m;
    __m512 vm = _mm512_set1_ps(mnew), vsum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 valid = (__mmask16)(n - j >= 16 ? 0xffff : (1u << (n - j)) - 1);
        __m512 p = _mm512_maskz_mov_ps(valid, exp_neg_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm)));
        _mm512_storeu_ps(s + j, p);
        vsum = _mm512_add_ps(vsum, p);
    }
    float corr = _mm512_cvtss_f32(exp_neg_avx512(_mm512_set1_ps(*m - mnew)));
    *l = *l * corr + hsum16(vsum);
    *m = mnew;
    return corr;
}
#endif

/* Rows j0..j0+nk-1 of a head's keys or values in a cache of type dt (rows
 * rb bytes apart from base), converted to f32 at dst (hd floats apart):
 * exact for f16 and bf16, q8_0 dequantized block by block. */
static void att_load_rows(const char *base, int64_t rb, tide_dtype dt, int64_t j0, int nk, int hd, float *dst) {
    for (int j = 0; j < nk; j++) tide_dequantize_row(dt, base + (j0 + j) * rb, dst + (int64_t)j * hd, hd);
}

/* Runs one task: its rows against cache positions 0..max rpos of kv head g
 * (kb/vb point at position 0 of that head, rb bytes between positions, in a
 * cache of type dt); path is ATT_PORTABLE, ATT_AVX2 or ATT_AVX512. A 16-bit
 * or q8_0 cache's key and value tiles are converted to f32 first and then go
 * through the f32 arithmetic, so a task computes what it computes over an
 * f32 cache holding the converted values. */
static void att_run_task(const att_task *tk, const char *kbytes, const char *vbytes, int64_t rb, tide_dtype dt,
                         int hd, int BK, int path) {
    _Alignas(64) float Kt[ATT_BUF];
    _Alignas(64) float O[ATT_BUF];
    _Alignas(64) float S[ATT_MAX_ROWS * ATT_MAX_KEYS];
    _Alignas(64) float Kf[ATT_BUF];
    _Alignas(64) float Vf[ATT_BUF];
    const bool conv = dt != TIDE_F32;
    const float *kb = (const float *)kbytes, *vb = (const float *)vbytes;
    const int64_t vs = conv ? hd : rb / (int64_t)sizeof(float);
    float m[ATT_MAX_ROWS], l[ATT_MAX_ROWS];
    int lim[ATT_MAX_ROWS], jmax[ATT_MAX_ROWS];
    int nr = tk->nrows;
    int64_t maxp = 0;
    for (int i = 0; i < nr; i++) {
        maxp = TIDE_MAX(maxp, tk->rpos[i]);
        m[i] = -INFINITY;
        l[i] = 0;
    }
    memset(O, 0, (size_t)nr * (size_t)hd * sizeof(float));
    float scale = 1.0f / sqrtf((float)hd);
    const bool avx = path != ATT_PORTABLE, avx_pv = avx && hd % 16 == 0;
    for (int64_t j0 = 0; j0 <= maxp; j0 += BK) {
        int nk = (int)TIDE_MIN((int64_t)BK, maxp + 1 - j0);
        int nkp = (nk + 15) & ~15;
        /* the tile's keys and values: in the cache, or converted into Kf, Vf */
        const float *kt = kb + j0 * vs, *vt = vb + j0 * vs;
        if (conv) {
            att_load_rows(kbytes, rb, dt, j0, nk, hd, Kf);
            att_load_rows(vbytes, rb, dt, j0, nk, hd, Vf);
            kt = Kf;
            vt = Vf;
        }
#ifdef TK_X86
        if (avx && hd % 8 == 0)
            att_transpose_avx2(kt, vs, nk, hd, Kt, BK);
        else
#endif
            att_transpose_generic(kt, vs, nk, hd, Kt, BK);
        for (int d = 0; d < hd; d++)
            for (int j = nk; j < nkp; j++) Kt[d * BK + j] = 0;
        for (int i = 0; i < nr; i++) {
            int64_t n = tk->rpos[i] - j0 + 1;
            lim[i] = n <= 0 ? 0 : (int)TIDE_MIN(n, (int64_t)nk);
            jmax[i] = (lim[i] + 15) & ~15;
        }
#ifdef TK_X86
        if (path == ATT_AVX512)
            att_scores_avx512(tk, Kt, BK, jmax, hd, scale, S, BK);
        else if (avx)
            att_scores_avx2(tk, Kt, BK, jmax, hd, scale, S, BK);
        else
#endif
            att_scores_generic(tk, Kt, BK, jmax, hd, scale, S, BK);
        /* online softmax: rescale what was accumulated to the new running max */
        for (int i = 0; i < nr; i++) {
            if (lim[i] == 0) continue;
            float corr;
#ifdef TK_X86
            if (path == ATT_AVX512)
                corr = att_softmax_avx512(S + i * BK, lim[i], &m[i], &l[i]);
            else if (avx)
                corr = att_softmax_avx2(S + i * BK, lim[i], &m[i], &l[i]);
            else
#endif
                corr = att_softmax_generic(S + i * BK, lim[i], &m[i], &l[i]);
            if (corr != 1.0f) {
                float *o = O + i * hd;
#pragma omp simd
                for (int d = 0; d < hd; d++) o[d] *= corr;
            }
        }
#ifdef TK_X86
        if (avx_pv) {
            if (path == ATT_AVX512)
                att_pv_avx512(S, BK, lim, nr, vt, vs, hd, O);
            else
                att_pv_avx2(S, BK, lim, nr, vt, vs, hd, O);
            continue;
        }
#endif
        for (int i = 0; i < nr; i++) att_pv_row_generic(S + i * BK, 0, lim[i], vt, vs, hd, O + i * hd);
    }
    for (int i = 0; i < nr; i++) {
        const float *o = O + i * hd;
        float *dst = tk->orow[i], li = l[i];
#pragma omp simd
        for (int d = 0; d < hd; d++) dst[d] = o[d] / li;
    }
}

/* The query tasks of tk_attention over keys and values already in place:
 * batch row b's key for position j is row b * C + j of keys, a cache of C
 * positions of type dt (or k itself, f32, with C = T). */
static void att_run(const float *q, const void *keys, const void *vals, int64_t C, tide_dtype dt,
                    const int32_t *pos, float *o, const tk_attn_dims *dm, int nt) {
    const int64_t B = dm->B, T = dm->T;
    const int H = dm->H, KV = dm->KV, hd = dm->hd;
    const int64_t kd = (int64_t)KV * hd, qd = (int64_t)H * hd;
    const int BK = TIDE_MIN(ATT_MAX_KEYS, (ATT_BUF / hd) & ~15);
    const int NQ = TIDE_MIN(ATT_MAX_ROWS, ATT_BUF / hd);
    const int G = H / KV;
    const int HB = TIDE_MIN(G, NQ);          /* query heads per task */
    const int n_hb = (G + HB - 1) / HB;
    const int64_t BQ = TIDE_MAX(1, NQ / HB); /* queries per task */
    const int64_t n_qb = (T + BQ - 1) / BQ;
    const int64_t n_task = B * KV * n_hb * n_qb;
    const int path = att_path();
    /* dynamic: a task's output does not depend on which thread runs it */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (n_task > 1)
    for (int64_t task = 0; task < n_task; task++) {
        int64_t qb = n_qb - 1 - task % n_qb; /* later queries see more keys: first */
        int64_t rest = task / n_qb;
        int hb = (int)(rest % n_hb);
        rest /= n_hb;
        int g = (int)(rest % KV);
        int64_t b = rest / KV;
        att_task tk;
        tk.nrows = 0;
        int64_t t0 = qb * BQ, t1 = TIDE_MIN(T, t0 + BQ);
        int h0 = g * G + hb * HB, h1 = TIDE_MIN(g * G + G, h0 + HB);
        for (int h = h0; h < h1; h++)
            for (int64_t t = t0; t < t1; t++) {
                int64_t row = b * T + t;
                tk.qrow[tk.nrows] = q + row * qd + (int64_t)h * hd;
                tk.orow[tk.nrows] = o + row * qd + (int64_t)h * hd;
                tk.rpos[tk.nrows] = pos[t];
                tk.nrows++;
            }
        const int64_t rb = (int64_t)tide_dtype_bytes(dt, (uint64_t)kd);
        const int64_t off = b * C * rb + (int64_t)tide_dtype_bytes(dt, (uint64_t)g * (uint64_t)hd);
        att_run_task(&tk, (const char *)keys + off, (const char *)vals + off, rb, dt, hd, BK, path);
    }
}

tide_status tk_attention(const float *q, const float *k, const float *v, const int32_t *pos,
                         void *kcache, void *vcache, float *o, const tk_attn_dims *dm,
                         int64_t *bad, int nt) {
    const int64_t B = dm->B, T = dm->T, C = dm->C;
    if (dm->hd > TK_ATTN_MAX_HD) return TIDE_E_UNSUPPORTED;
    for (int64_t t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= C) {
            *bad = t;
            return TIDE_E_RANGE;
        }
    const tide_dtype dt = dm->cache_dtype;
    const int64_t kd = (int64_t)dm->KV * dm->hd, rb = (int64_t)tide_dtype_bytes(dt, (uint64_t)kd);
    if (rb == 0) return TIDE_E_UNSUPPORTED;
    /* cache write, rounded to the cache's type row by row (each row on its
     * own, so the bits do not depend on the threads); t in order within b,
     * so a repeated position keeps its last row */
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * kd >= TK_PAR_MIN)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            char *kdst = (char *)kcache + (b * C + pos[t]) * rb, *vdst = (char *)vcache + (b * C + pos[t]) * rb;
            const float *ks = k + (b * T + t) * kd, *vsrc = v + (b * T + t) * kd;
            if (dt == TIDE_F32) {
                memcpy(kdst, ks, (size_t)rb);
                memcpy(vdst, vsrc, (size_t)rb);
            } else {
                tide_quantize_row(dt, ks, kdst, kd);
                tide_quantize_row(dt, vsrc, vdst, kd);
            }
        }
    /* then every position, the ones just written too, read back from the cache */
    att_run(q, kcache, vcache, C, dt, pos, o, dm, nt);
    return TIDE_OK;
}

tide_status tk_attention_nocache(const float *q, const float *k, const float *v, const int32_t *pos, float *o,
                                 const tk_attn_dims *dm, int64_t *bad, int nt) {
    if (dm->hd > TK_ATTN_MAX_HD) return TIDE_E_UNSUPPORTED;
    for (int64_t t = 0; t < dm->T; t++)
        if (pos[t] != t) {
            *bad = t;
            return TIDE_E_RANGE;
        }
    att_run(q, k, v, dm->T, TIDE_F32, pos, o, dm, nt);
    return TIDE_OK;
}

/* ------------------------------------------------------------- attention backward */

/* Query rows a backward step takes at once: about T/8 (the keys past the
 * diagonal within a block, computed and masked, stay an eighth of the work),
 * 16 to 128, and fewer where T is long so that the two score buffers stay
 * near 2 MiB each. A function of T alone. */
static int64_t att_bwd_rows(int64_t T) {
    int64_t bq = TIDE_MAX(16, TIDE_MIN(128, T / 8));
    bq = TIDE_MIN(bq, TIDE_MAX(16, (INT64_C(1) << 19) / T));
    return TIDE_MIN(bq, T);
}

size_t tk_attention_bwd_work(const tk_attn_dims *dm, int nt) {
    int64_t bq = att_bwd_rows(dm->T), ld = (dm->T + 15) & ~(int64_t)15;
    return (size_t)nt * 2 * (size_t)(bq * ld) * sizeof(float);
}

/* One (batch row b, kv head g) of tk_attention_bwd: every query head of the
 * group, a block of bq queries at a time, in a fixed order. S and P2 hold
 * bq x T floats each. */
static void att_bwd_task(const float *q, const float *k, const float *v, const float *o, const float *dout,
                         float *dq, float *dk, float *dv, const tk_attn_dims *dm, int64_t b, int g, float *S,
                         float *P2, bool avx) {
    const int64_t T = dm->T, hd = dm->hd, qd = (int64_t)dm->H * hd, kd = (int64_t)dm->KV * hd;
    const int G = dm->H / dm->KV;
    const int64_t BQ = att_bwd_rows(T), ld = (T + 15) & ~(int64_t)15;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *kb = k + b * T * kd + g * hd, *vb = v + b * T * kd + g * hd; /* (T, hd), stride kd */
    float *dkb = dk + b * T * kd + g * hd, *dvb = dv + b * T * kd + g * hd;
    for (int64_t t = 0; t < T; t++) {
        memset(dkb + t * kd, 0, (size_t)hd * sizeof(float));
        memset(dvb + t * kd, 0, (size_t)hd * sizeof(float));
    }
    for (int h = g * G; h < g * G + G; h++) {
        for (int64_t i0 = 0; i0 < T; i0 += BQ) {
            const int64_t bq = TIDE_MIN(BQ, T - i0), nk = i0 + bq; /* keys 0..nk-1 */
            const int64_t row0 = (b * T + i0) * qd + h * hd;
            const float *qi = q + row0, *oi = o + row0, *doi = dout + row0; /* (bq, hd), stride qd */
            float *dqi = dq + row0;
            /* P = softmax(scale * Qi K^T) over keys j <= t, zero past t */
            tk_sgemm(false, true, bq, nk, hd, scale, qi, qd, kb, kd, 0.0f, S, ld);
            for (int64_t r = 0; r < bq; r++) {
                float *s = S + r * ld, mx;
                int64_t n = i0 + r + 1;
                float inv = (float)(1.0 / tk_exp_row(s, n, &mx, avx));
#pragma omp simd
                for (int64_t j = 0; j < n; j++) s[j] *= inv;
                for (int64_t j = n; j < nk; j++) s[j] = 0;
            }
            /* dV += P^T dO; dP = dO V^T */
            tk_sgemm(true, false, nk, hd, bq, 1.0f, S, ld, doi, qd, 1.0f, dvb, kd);
            tk_sgemm(false, true, bq, nk, hd, 1.0f, doi, qd, vb, kd, 0.0f, P2, ld);
            /* dS = P * (dP - rowsum(dO * O)), in place of P */
            for (int64_t r = 0; r < bq; r++) {
                const float *dor = doi + r * qd, *orow = oi + r * qd;
                double dd = 0;
                for (int64_t d = 0; d < hd; d++) dd += (double)dor[d] * (double)orow[d];
                float D = (float)dd, *s = S + r * ld;
                const float *dp = P2 + r * ld;
#pragma omp simd
                for (int64_t j = 0; j < nk; j++) s[j] = s[j] * (dp[j] - D);
            }
            /* dQ = scale * dS K; dK += scale * dS^T Q */
            tk_sgemm(false, false, bq, hd, nk, scale, S, ld, kb, kd, 0.0f, dqi, qd);
            tk_sgemm(true, false, nk, hd, bq, scale, S, ld, qi, qd, 1.0f, dkb, kd);
        }
    }
}

tide_status tk_attention_bwd(const float *q, const float *k, const float *v, const float *o, const float *dout,
                             float *dq, float *dk, float *dv, const tk_attn_dims *dm, float *work, int nt) {
    const int64_t B = dm->B, T = dm->T;
    const int KV = dm->KV;
    const int64_t qd = (int64_t)dm->H * dm->hd, kd = (int64_t)KV * dm->hd;
    if (T > INT_MAX || qd > INT_MAX || kd > INT_MAX) return TIDE_E_UNSUPPORTED;
    const int64_t per = (int64_t)(tk_attention_bwd_work(dm, 1) / sizeof(float) / 2);
    const int64_t n_task = B * KV;
    const bool avx = tk_have_avx2();
    /* a task owns dq of its group's heads and dk, dv of its kv head: no
     * two tasks write one element, so any thread may run any task */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (n_task > 1)
    for (int64_t task = 0; task < n_task; task++) {
        float *S = work + (int64_t)omp_get_thread_num() * 2 * per;
        att_bwd_task(q, k, v, o, dout, dq, dk, dv, dm, task / KV, (int)(task % KV), S, S + per, avx);
    }
    return TIDE_OK;
}
