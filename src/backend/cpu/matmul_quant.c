/*
 * matmul_quant.c - MATMUL (out = x . w^T) with block-quantized weights
 * (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K as stored: src/core/quant_blocks.h), and the
 * dequantization of rows for EMBED (the reference's, src/core/quant.h);
 * chosen at run time (cpu_features.h) among AVX-512 VNNI, AVX2 and portable
 * code, one binary for every machine.
 *
 * Each row of x is quantized once per call into 8-bit blocks of 32 (tq_act:
 * q = rint(x * 127 / amax), scale amax / 127 in f32, and the sum of q over
 * each 16) in the caller's workspace. Then every output is, per 32 elements
 * of K (a chunk c):
 *   - an exact integer I_c: the dot product of the chunk's weight integers
 *     and activation integers, times the weight's integer sub-block scale(s),
 *     less the weight's integer offset (Q4_0 8, Q6_K 32) times the
 *     activation sums; for Q4_K / Q5_K also M_c = the 6-bit min times the
 *     chunk's activation sum. Every |I_c| < 2^24, so (float)I_c is exact;
 *   - accumulated in f32 into lane c mod 8 of eight accumulators, chunks in
 *     increasing order: acc = fma((float)I_c, da_c * dw_c, acc), and for
 *     Q4_K / Q5_K then acc = fma(-(float)M_c, da_c * dmin, acc) (da_c the
 *     activation scale, dw_c the weight block's f16 scale d);
 *   - summed at the end by one fixed tree, ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)).
 * The integers are exact and the float operations are the same on every
 * path (the portable one calls fmaf), so each output's bits depend on its
 * row of x, its row of w and K alone: not on R, the row chunk, the column
 * range, the thread count, nor on which of the three paths runs it.
 *
 * The weights of a superchunk (8 chunks: one K-type block, or eight Q8_0 /
 * Q4_0 blocks) are unpacked once into 8-bit integers and their scales
 * (tq_sup, on the stack), then multiplied with every row of a block of rows
 * whose quantized activations stay in L2; at decode (a row or a few) that
 * is one pass over the weights. Threads take contiguous ranges of output
 * columns (rows of w), so each weight is read by one thread.
 *
 * From TQ_IL_ROWS rows on (and always on the portable path) the integers of
 * a superchunk, activations and unpacked weights alike, lie interleaved
 * (tk_q_pos, kernels_int.h): vector i of its 8 holds elements 4i..4i+3 of
 * each chunk, so a 32-bit multiply-add over the 8 vectors leaves chunk c's
 * dot product in lane c, with no sum across lanes, and output columns go in
 * pairs. Below, for decode, each chunk's 32 bytes stay in element order (no
 * transpose of the weights) and each chunk's lanes are summed instead. AVX2:
 * VPMADDUBSW (unsigned weights x signed activations; Q8_0's signed weights
 * by the sign trick) then VPMADDWD; AVX-512 VNNI: VPDPBUSD, on 256-bit
 * vectors for prefill and on 512-bit ones for decode (dot_z: two chunks a
 * vector, the weights unpacked in registers, one transposing reduction of
 * the lanes), where the weights, read once from memory, are also prefetched
 * ahead (prefetch_sup).
 */
#include "backend/cpu/kernels_int.h"
#include "core/quant.h"
#include "core/quant_blocks.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#define TK_INLINE inline __attribute__((always_inline))

/* ------------------------------------------------------------- weights */

/* 6-bit scale and min j of a Q4_K / Q5_K block. */
static void scale_min(int j, const uint8_t *s, int *sc, int *m) {
    uint8_t a, b;
    tide_q4k_scale_min(j, s, &a, &b);
    *sc = a;
    *m = b;
}

bool tk_dequant_row(const void *src, tide_dtype dt, float *dst, int64_t n) {
    return tide_dtype_is_quantized(dt) && tide_dequantize_row(dt, src, dst, n) == 0;
}

/* ------------------------------------------------------------- activations */

/* A quantized row of K elements, K padded to Kp (a multiple of 256, zeros
 * beyond K): Kp int8, Kp / 32 f32 scales, Kp / 16 int16 sums. */
static int64_t pad_k(int64_t K) { return (K + 255) / 256 * 256; }

size_t tk_matmul_q_row_bytes(int64_t K) {
    int64_t kp = pad_k(K);
    return (size_t)(kp + kp / 32 * 4 + kp / 16 * 2);
}

typedef struct tq_act {
    const int8_t *q;
    const float *d;
    const int16_t *bs;
} tq_act;

static tq_act act_of(const void *row, int64_t K) {
    int64_t kp = pad_k(K);
    const uint8_t *p = row;
    return (tq_act){(const int8_t *)p, (const float *)(p + kp), (const int16_t *)(p + kp + kp / 32 * 4)};
}

/* The chunk's scale and its integers: d = amax / 127, q = rint(x * (127 /
 * amax)) (to nearest even), 0 for an all-zero chunk. */
static void quant_chunk_portable(const float *x, int8_t *q, float *d, int16_t *bs) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float id = amax > 0 ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    int s0 = 0, s1 = 0;
    for (int i = 0; i < 32; i++) {
        float v = x[i] * id;
        int qi = v == v ? (int)nearbyintf(TIDE_MAX(-127.0f, TIDE_MIN(127.0f, v))) : 0;
        q[i] = (int8_t)qi;
        if (i < 16) s0 += qi;
        else s1 += qi;
    }
    bs[0] = (int16_t)s0;
    bs[1] = (int16_t)s1;
}

#ifdef TK_X86
#define TK_A2 __attribute__((target("avx2,fma,f16c")))
#define TK_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* quant_chunk_portable's bits with AVX2 (VCVTPS2DQ rounds to nearest even). */
TK_A2 static void quant_chunk_avx2(const float *x, int8_t *q, float *d, int16_t *bs) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), m); /* a NaN lane keeps m, as fmaxf */
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    float id = amax > 0 ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    __m256 idv = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i i[4];
    for (int k = 0; k < 4; k++) {
        __m256 t = _mm256_mul_ps(v[k], idv);
        __m256 ok = _mm256_cmp_ps(t, t, _CMP_ORD_Q);
        t = _mm256_and_ps(ok, _mm256_min_ps(hi, _mm256_max_ps(lo, t)));
        i[k] = _mm256_cvtps_epi32(t);
    }
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    __m256i s0 = _mm256_add_epi32(i[0], i[1]), s1 = _mm256_add_epi32(i[2], i[3]);
    __m256i s = _mm256_hadd_epi32(s0, s1);
    s = _mm256_hadd_epi32(s, s); /* each 128-bit half: its share of s0's sum, of s1's, twice */
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    bs[0] = (int16_t)_mm_extract_epi32(t, 0);
    bs[1] = (int16_t)_mm_extract_epi32(t, 1);
}

TK_A2 static void transpose8(const __m256i c[8], __m256i v[8]);

/* The chunks of a superchunk, in element order, stored interleaved. */
TK_A2 static void quant_store_avx2(int8_t ch[8][32], int8_t *q) {
    __m256i c[8], v[8];
    for (int k = 0; k < 8; k++) c[k] = _mm256_load_si256((const __m256i *)ch[k]);
    transpose8(c, v);
    for (int k = 0; k < 8; k++) _mm256_storeu_si256((__m256i *)(q + 32 * k), v[k]);
}
#endif

#ifdef TK_X86
/* v[i] = dword i of each of c[0..8): an 8 x 8 transpose of 32-bit elements,
 * from chunk order (c[k] the 32 bytes of chunk k) to the interleaved one. */
TK_A2 static void transpose8(const __m256i c[8], __m256i v[8]) {
    __m256i t[8], u[8];
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_epi32(c[k], c[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(c[k], c[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        v[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}
#endif

/* tk_quantize_act; il false (AVX2 CPUs only): each chunk's 32 bytes in
 * element order instead, the decode kernels' layout. */
static void quantize_rows(const float *x, int64_t ldx, int64_t R, int64_t K, void *dst, bool il, int nt) {
    int64_t kp = pad_k(K);
    size_t rb = tk_matmul_q_row_bytes(K);
#ifdef TK_X86
    bool avx = tk_have_avx2();
#endif
#pragma omp parallel for schedule(static) num_threads(nt) if (R * K >= 4 * TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        uint8_t *row = (uint8_t *)dst + (size_t)r * rb;
        int8_t *q = (int8_t *)row;
        float *d = (float *)(row + kp);
        int16_t *bs = (int16_t *)(row + kp + kp / 32 * 4);
        const float *xr = x + r * ldx;
        for (int64_t s = 0; s < kp / 256; s++) {
            _Alignas(32) int8_t ch[8][32]; /* the superchunk's chunks in element order */
            for (int c = 0; c < 8; c++) {
                int64_t j = 8 * s + c;
                if (j >= K / 32) {
                    memset(ch[c], 0, 32);
                    d[j] = 0, bs[2 * j] = bs[2 * j + 1] = 0;
                    continue;
                }
#ifdef TK_X86
                if (avx) {
                    quant_chunk_avx2(xr + 32 * j, ch[c], d + j, bs + 2 * j);
                    continue;
                }
#endif
                quant_chunk_portable(xr + 32 * j, ch[c], d + j, bs + 2 * j);
            }
#ifdef TK_X86
            if (avx && il) {
                quant_store_avx2(ch, q + 256 * s);
                continue;
            }
#endif
            if (!il) {
                memcpy(q + 256 * s, ch, 256);
                continue;
            }
            for (int c = 0; c < 8; c++)
                for (int e = 0; e < 32; e++) q[256 * s + tk_q_pos(32 * c + e)] = ch[c][e];
        }
    }
}

void tk_quantize_act(const float *x, int64_t ldx, int64_t R, int64_t K, void *dst, int nt) {
    quantize_rows(x, ldx, R, K, dst, true, nt);
}

/* ------------------------------------------------------------- unpacked weights */

/* A superchunk of a weight row (256 elements: 8 chunks of 32) unpacked:
 * q the element integers in order (Q8_0 signed, the others unsigned: Q4_0
 * 0..15, Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), interleaved as the
 * activations are (tk_q_pos); sc8 chunk c's integer scale (Q4_K / Q5_K),
 * scp the scale of each 16 (Q6_K), sce / sco chunk c's scale of its first /
 * last 16 (Q6_K: scp[2c], scp[2c + 1]), scv chunk c's VPMADDWD vector in
 * element order (Q6_K: scp[2c] 8 times, then scp[2c + 1]), mn the min of chunk c
 * twice (Q4_K / Q5_K), dA chunk c's f16 scale d, dM its dmin. Chunks past
 * the row's end are zeros. */
typedef struct tq_sup {
    _Alignas(64) uint8_t q[256];
    int32_t sce[8], sco[8];
    int16_t scv[8][16];
    int32_t sc8[8];
    int16_t scp[16];
    int16_t mn[16];
    float dA[8];
    float dM[8];
} tq_sup;

/* Chunks of superchunk s of a row of K elements (8 but for a Q8_0 / Q4_0
 * row's last). */
static int sup_chunks(int64_t K, int64_t s) { return (int)TIDE_MIN(8, K / 32 - 8 * s); }

/* Q6_K's and the K types' scales, shared by the unpackers. */
static void sup_scales_k(tide_dtype dt, const void *blk, tq_sup *u) {
    if (dt == TIDE_Q6_K) {
        const tide_block_q6_k *x = blk;
        float d = tide_f16_to_f32(x->d);
        for (int c = 0; c < 8; c++) {
            u->scp[2 * c] = x->scales[2 * c];
            u->scp[2 * c + 1] = x->scales[2 * c + 1];
            u->sce[c] = x->scales[2 * c], u->sco[c] = x->scales[2 * c + 1];
            u->dA[c] = d;
            u->dM[c] = 0;
        }
        return;
    }
    const tide_block_q4_k *x = blk; /* Q5_K begins as Q4_K does */
    float d = tide_f16_to_f32(x->d), dmin = tide_f16_to_f32(x->dmin);
    for (int c = 0; c < 8; c++) {
        int sc, m;
        scale_min(c, x->scales, &sc, &m);
        u->sc8[c] = sc;
        u->mn[2 * c] = u->mn[2 * c + 1] = (int16_t)m;
        u->dA[c] = d;
        u->dM[c] = dmin;
    }
}

/* Superchunk s of weight row w (nc chunks) into u, plain C. */
static void unpack_portable(tide_dtype dt, const uint8_t *w, int64_t s, int nc, tq_sup *u) {
    switch (dt) {
    case TIDE_Q8_0:
    case TIDE_Q4_0:
        memset(u->q, 0, sizeof u->q);
        for (int c = 0; c < 8; c++) u->dA[c] = 0;
        for (int c = 0; c < nc; c++) {
            if (dt == TIDE_Q8_0) {
                const tide_block_q8_0 *x = (const tide_block_q8_0 *)w + 8 * s + c;
                for (int i = 0; i < 32; i++) u->q[tk_q_pos(32 * c + i)] = (uint8_t)x->qs[i];
                u->dA[c] = tide_f16_to_f32(x->d);
            } else {
                const tide_block_q4_0 *x = (const tide_block_q4_0 *)w + 8 * s + c;
                for (int i = 0; i < 16; i++)
                    u->q[tk_q_pos(32 * c + i)] = x->qs[i] & 15, u->q[tk_q_pos(32 * c + 16 + i)] = x->qs[i] >> 4;
                u->dA[c] = tide_f16_to_f32(x->d);
            }
        }
        break;
    case TIDE_Q4_K:
    case TIDE_Q5_K: {
        const uint8_t *qs, *qh = NULL;
        const void *blk;
        if (dt == TIDE_Q4_K) {
            const tide_block_q4_k *x = (const tide_block_q4_k *)w + s;
            blk = x, qs = x->qs;
        } else {
            const tide_block_q5_k *x = (const tide_block_q5_k *)w + s;
            blk = x, qs = x->qs, qh = x->qh;
        }
        sup_scales_k(dt, blk, u);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * g + l] & 15, hi = qs[32 * g + l] >> 4;
                if (qh) lo |= (qh[l] >> (2 * g) & 1) << 4, hi |= (qh[l] >> (2 * g + 1) & 1) << 4;
                u->q[tk_q_pos(64 * g + l)] = (uint8_t)lo;
                u->q[tk_q_pos(64 * g + 32 + l)] = (uint8_t)hi;
            }
        break;
    }
    case TIDE_Q6_K: {
        const tide_block_q6_k *x = (const tide_block_q6_k *)w + s;
        sup_scales_k(dt, x, u);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *ql = x->ql + 64 * h, qh = x->qh[32 * h + l];
                u->q[tk_q_pos(128 * h + l)] = (uint8_t)((ql[l] & 15) | (qh & 3) << 4);
                u->q[tk_q_pos(128 * h + l + 32)] = (uint8_t)((ql[l + 32] & 15) | (qh >> 2 & 3) << 4);
                u->q[tk_q_pos(128 * h + l + 64)] = (uint8_t)((ql[l] >> 4) | (qh >> 4 & 3) << 4);
                u->q[tk_q_pos(128 * h + l + 96)] = (uint8_t)((ql[l + 32] >> 4) | (qh >> 6 & 3) << 4);
            }
        break;
    }
    default:
        break;
    }
}

/* The eight lanes summed by the fixed tree every path uses (hsum8's). */
static float sum8_portable(const float *a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

/* acc[0..8) += superchunk u times activation superchunk s of a, plain C. */
static void dot_portable(tide_dtype dt, const tq_sup *u, tq_act a, int64_t s, int nc, float *acc) {
    const int8_t *aq = a.q + 256 * s;
    const int16_t *bs = a.bs + 16 * s;
    const float *da = a.d + 8 * s;
    for (int c = 0; c < nc; c++) {
        int32_t dot[2] = {0, 0};
        for (int h = 0; h < 2; h++)
            for (int i = 16 * h; i < 16 * h + 16; i++) {
                int p = (int)tk_q_pos(32 * c + i);
                int wv = dt == TIDE_Q8_0 ? (int8_t)u->q[p] : u->q[p];
                dot[h] += wv * aq[p];
            }
        int32_t I, M = 0;
        int32_t b0 = bs[2 * c], b1 = bs[2 * c + 1];
        switch (dt) {
        case TIDE_Q4_0: I = dot[0] + dot[1] - 8 * (b0 + b1); break;
        case TIDE_Q4_K:
        case TIDE_Q5_K:
            I = u->sc8[c] * (dot[0] + dot[1]);
            M = u->mn[2 * c] * (b0 + b1);
            break;
        case TIDE_Q6_K: I = u->scp[2 * c] * (dot[0] - 32 * b0) + u->scp[2 * c + 1] * (dot[1] - 32 * b1); break;
        default: I = dot[0] + dot[1]; break;
        }
        acc[c] = fmaf((float)I, da[c] * u->dA[c], acc[c]);
        if (dt == TIDE_Q4_K || dt == TIDE_Q5_K) acc[c] = fmaf(-(float)M, da[c] * u->dM[c], acc[c]);
    }
}

#ifdef TK_X86
/* ------------------------------------------------------------- AVX2 / VNNI */

/* The 6-bit scales and mins of a Q4_K / Q5_K block as tq_sup's sc8 (int32
 * per chunk) and mn (int16, twice per chunk), from one 16-byte load of its
 * 12 bytes of scales (and 4 bytes after them, unused). */
TK_A2 static TK_INLINE void k_scales_v(const uint8_t *scales, __m256i *sc8, __m256i *mn) {
    __m128i b = _mm_loadu_si128((const __m128i *)scales);
    /* low bits of scale / min j: bytes 0..3 / 4..7 for j < 4, the nibbles of
     * bytes 8..11 for j >= 4; their top 2 bits: those of bytes 0..3 / 4..7 */
    __m128i a = _mm_shuffle_epi8(b, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    __m128i t = _mm_shuffle_epi8(b, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    __m128i lo = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    __m128i hn = _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    __m128i top = _mm_and_si128(_mm_srli_epi16(t, 2), _mm_set1_epi8(0x30));
    __m128i r = _mm_or_si128(_mm_or_si128(lo, hn), top);
    *sc8 = _mm256_cvtepu8_epi32(r);
    *mn = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(r, r));
}

/* sup_scales_k with F16C conversions and the 6-bit scales and mins of a
 * Q4_K / Q5_K block unpacked four at a time (tide_q4k_scale_min's packing:
 * bytes 0..3 scales 0..3, bytes 4..7 mins 0..3, bytes 8..11 the low 4 bits of
 * scales / mins 4..7, whose top 2 bits are those of bytes 0..3 / 4..7). */
TK_A2 static TK_INLINE void sup_scales_avx2(tide_dtype dt, const void *blk, tq_sup *u, const bool il) {
    if (dt == TIDE_Q6_K) {
        const tide_block_q6_k *x = blk;
        __m128i sc = _mm_loadu_si128((const __m128i *)x->scales);
        _mm256_storeu_si256((__m256i *)u->scp, _mm256_cvtepi8_epi16(sc));
        const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
        const __m128i odd = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
        _mm256_storeu_si256((__m256i *)u->sce, _mm256_cvtepi8_epi32(_mm_shuffle_epi8(sc, even)));
        _mm256_storeu_si256((__m256i *)u->sco, _mm256_cvtepi8_epi32(_mm_shuffle_epi8(sc, odd)));
        if (!il) {
            const __m128i base = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++)
                _mm256_storeu_si256((__m256i *)u->scv[c], _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                                                              sc, _mm_add_epi8(base, _mm_set1_epi8((char)(2 * c))))));
        }
        __m256 d = _mm256_set1_ps(_cvtsh_ss(x->d));
        _mm256_storeu_ps(u->dA, d);
        return;
    }
    const tide_block_q4_k *x = blk;
    __m256i sc8, mn;
    k_scales_v(x->scales, &sc8, &mn);
    _mm256_storeu_si256((__m256i *)u->sc8, sc8);
    _mm256_storeu_si256((__m256i *)u->mn, mn);
    _mm256_storeu_ps(u->dA, _mm256_set1_ps(_cvtsh_ss(x->d)));
    _mm256_storeu_ps(u->dM, _mm256_set1_ps(_cvtsh_ss(x->dmin)));
}

/* Superchunk s of weight row w into u, with AVX2 where it pays. */
TK_A2 static TK_INLINE void unpack_avx2(tide_dtype dt, const uint8_t *w, int64_t s, int nc, tq_sup *u, const bool il) {
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i C[8], V[8]; /* the chunks in element order, then interleaved */
    switch (dt) {
    case TIDE_Q8_0:
    case TIDE_Q4_0:
        if (nc == 8) {
            uint16_t h[8];
            if (dt == TIDE_Q8_0) {
                const tide_block_q8_0 *x = (const tide_block_q8_0 *)w + 8 * s;
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) C[c] = _mm256_loadu_si256((const __m256i *)x[c].qs), h[c] = x[c].d;
            } else {
                const tide_block_q4_0 *x = (const tide_block_q4_0 *)w + 8 * s;
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) {
                    __m128i b = _mm_loadu_si128((const __m128i *)x[c].qs);
                    C[c] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), m4);
                    h[c] = x[c].d;
                }
            }
            _mm256_storeu_ps(u->dA, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
            break;
        }
        for (int c = 0; c < 8; c++) {
            __m256i v = _mm256_setzero_si256();
            float d = 0;
            if (c < nc && dt == TIDE_Q8_0) {
                const tide_block_q8_0 *x = (const tide_block_q8_0 *)w + 8 * s + c;
                v = _mm256_loadu_si256((const __m256i *)x->qs);
                d = _cvtsh_ss(x->d);
            } else if (c < nc) {
                const tide_block_q4_0 *x = (const tide_block_q4_0 *)w + 8 * s + c;
                __m128i b = _mm_loadu_si128((const __m128i *)x->qs);
                v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), m4);
                d = _cvtsh_ss(x->d);
            }
            C[c] = v;
            u->dA[c] = d;
        }
        break;
    case TIDE_Q4_K:
    case TIDE_Q5_K: {
        const uint8_t *qs, *qh = NULL;
        const void *blk;
        if (dt == TIDE_Q4_K) {
            const tide_block_q4_k *x = (const tide_block_q4_k *)w + s;
            blk = x, qs = x->qs;
        } else {
            const tide_block_q5_k *x = (const tide_block_q5_k *)w + s;
            blk = x, qs = x->qs, qh = x->qh;
        }
        sup_scales_avx2(dt, blk, u, il);
        __m256i h = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        const __m256i one = _mm256_set1_epi8(1);
        for (int g = 0; g < 4; g++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (qh) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * g), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * g + 1), one), 4));
            }
            C[2 * g] = lo;
            C[2 * g + 1] = hi;
        }
        break;
    }
    case TIDE_Q6_K: {
        const tide_block_q6_k *x = (const tide_block_q6_k *)w + s;
        sup_scales_avx2(dt, x, u, il);
        const __m256i m2 = _mm256_set1_epi8(3 << 4);
        for (int hf = 0; hf < 2; hf++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * hf));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * hf + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * hf));
            __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m2));
            __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(h, 2), m2));
            C[4 * hf] = q0;
            C[4 * hf + 1] = q1;
            C[4 * hf + 2] = q2;
            C[4 * hf + 3] = q3;
        }
        break;
    }
    default:
        return;
    }
    if (il) {
        transpose8(C, V);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) _mm256_store_si256((__m256i *)(u->q + 32 * k), V[k]);
        return;
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) _mm256_store_si256((__m256i *)(u->q + 32 * k), C[k]);
}

/* Decode reads each weight once, from memory: the lines of the superchunk
 * TQ_PF bytes past superchunk s of row wr (the rows lie one after another)
 * asked for ahead, the hardware's prefetch alone leaving the read short of
 * the memory's rate (about 0.75 of it for Q4_K at one thread). */
#define TQ_PF 8192
TK_A2 static TK_INLINE void prefetch_sup(tide_dtype dt, const uint8_t *wr, int64_t s) {
    const size_t sb = dt == TIDE_Q8_0   ? 8 * sizeof(tide_block_q8_0)
                      : dt == TIDE_Q4_0 ? 8 * sizeof(tide_block_q4_0)
                      : dt == TIDE_Q4_K ? sizeof(tide_block_q4_k)
                      : dt == TIDE_Q5_K ? sizeof(tide_block_q5_k)
                                        : sizeof(tide_block_q6_k);
    const char *p = (const char *)wr + (size_t)s * sb + TQ_PF;
    for (size_t o = 0; o < sb; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

/* Eight vectors of 8 int32 -> one: lane c the sum of d[c]'s lanes (exact). */
TK_A2 static TK_INLINE __m256i reduce8(const __m256i d[8]) {
    __m256i a = _mm256_hadd_epi32(d[0], d[1]), b = _mm256_hadd_epi32(d[2], d[3]);
    __m256i c = _mm256_hadd_epi32(d[4], d[5]), e = _mm256_hadd_epi32(d[6], d[7]);
    a = _mm256_hadd_epi32(a, b); /* each 128-bit half: its share of d[0..4)'s sums */
    c = _mm256_hadd_epi32(c, e);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20), _mm256_permute2x128_si256(a, c, 0x31));
}

/* The integers of superchunk u against activations (bs: the sums of each
 * 16) and the float step, shared by both paths: D lane c chunk c's dot
 * product (Q6_K's already scaled per 16). */
/* finish on the weight's scales in registers: sc the Q4_K / Q5_K integer
 * scales (sc8) or Q6_K's of each 16 (scp), mn the mins (mn), dA and dM. */
TK_A2 static TK_INLINE __m256 finish_v(tide_dtype dt, __m256i D, __m256i sc, __m256i mn, __m256 dA, __m256 dM,
                                       const int16_t *bs, const float *da, __m256 acc) {
    __m256i b = _mm256_loadu_si256((const __m256i *)bs);
    __m256i I = D, M = _mm256_setzero_si256();
    if (dt == TIDE_Q4_0) I = _mm256_sub_epi32(D, _mm256_slli_epi32(_mm256_madd_epi16(b, _mm256_set1_epi16(1)), 3));
    if (dt == TIDE_Q4_K || dt == TIDE_Q5_K) {
        I = _mm256_mullo_epi32(D, sc);
        M = _mm256_madd_epi16(b, mn);
    }
    if (dt == TIDE_Q6_K) I = _mm256_sub_epi32(D, _mm256_slli_epi32(_mm256_madd_epi16(b, sc), 5));
    __m256 dav = _mm256_loadu_ps(da);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(dav, dA), acc);
    if (dt == TIDE_Q4_K || dt == TIDE_Q5_K) acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(dav, dM), acc);
    return acc;
}

TK_A2 static TK_INLINE __m256 finish(tide_dtype dt, const tq_sup *u, __m256i D, const int16_t *bs, const float *da,
                                     __m256 acc) {
    __m256i sc = _mm256_loadu_si256((const __m256i *)(dt == TIDE_Q6_K ? (const void *)u->scp : (const void *)u->sc8));
    return finish_v(dt, D, sc, _mm256_loadu_si256((const __m256i *)u->mn), _mm256_loadu_ps(u->dA),
                    _mm256_loadu_ps(u->dM), bs, da, acc);
}

/* Q6_K's chunk dot products of its first and last 16 (d[0], d[1]), each
 * times its scale. */
TK_A2 static TK_INLINE __m256i q6_scaled(const tq_sup *u, const __m256i d[2]) {
    return _mm256_add_epi32(_mm256_mullo_epi32(d[0], _mm256_loadu_si256((const __m256i *)u->sce)),
                            _mm256_mullo_epi32(d[1], _mm256_loadu_si256((const __m256i *)u->sco)));
}

/* The superchunk's chunk dot products: vector k of u and of the activations
 * holds 4 elements of every chunk (tk_q_pos), so lane c of the sum over k
 * is chunk c's (Q6_K: its two 16s each times its scale), no reduction
 * across lanes; two chains of 4 steps, added (exact integers). */
TK_A2 static TK_INLINE __m256 dot_avx2(tide_dtype dt, const tq_sup *u, tq_act a, int64_t s, __m256 acc) {
    const int8_t *aq = a.q + 256 * s;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i d[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        __m256i w = _mm256_load_si256((const __m256i *)(u->q + 32 * k));
        __m256i x = _mm256_loadu_si256((const __m256i *)(aq + 32 * k));
        __m256i p = dt == TIDE_Q8_0 ? _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
                                    : _mm256_maddubs_epi16(w, x);
        /* Q6_K: the first 16 of each chunk in k < 4, the last 16 in k >= 4 */
        int h = dt == TIDE_Q6_K ? k >= 4 : k & 1;
        d[h] = _mm256_add_epi32(d[h], _mm256_madd_epi16(p, ones));
    }
    __m256i D = dt == TIDE_Q6_K ? q6_scaled(u, d) : _mm256_add_epi32(d[0], d[1]);
    return finish(dt, u, D, a.bs + 16 * s, a.d + 8 * s, acc);
}

TK_VNNI static TK_INLINE __m256 dot_vnni(tide_dtype dt, const tq_sup *u, tq_act a, int64_t s, __m256 acc) {
    const int8_t *aq = a.q + 256 * s;
    __m256i d[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        __m256i w = _mm256_load_si256((const __m256i *)(u->q + 32 * k));
        __m256i x = _mm256_loadu_si256((const __m256i *)(aq + 32 * k));
        int h = dt == TIDE_Q6_K ? k >= 4 : k & 1;
        d[h] = dt == TIDE_Q8_0 ? _mm256_dpbusd_epi32(d[h], _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
                               : _mm256_dpbusd_epi32(d[h], w, x);
    }
    __m256i D = dt == TIDE_Q6_K ? q6_scaled(u, d) : _mm256_add_epi32(d[0], d[1]);
    return finish(dt, u, D, a.bs + 16 * s, a.d + 8 * s, acc);
}

/* The same integers from chunks in element order (the decode layout: no
 * transpose when unpacking, a sum across lanes per chunk instead; Q6_K's
 * scales of each 16 ride in VPMADDWD). */
TK_A2 static TK_INLINE __m256 dot_nat_avx2(tide_dtype dt, const tq_sup *u, tq_act a, int64_t s, __m256 acc) {
    const int8_t *aq = a.q + 256 * s;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i d[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        __m256i w = _mm256_load_si256((const __m256i *)(u->q + 32 * c));
        __m256i x = _mm256_loadu_si256((const __m256i *)(aq + 32 * c));
        __m256i p = dt == TIDE_Q8_0 ? _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
                                    : _mm256_maddubs_epi16(w, x);
        d[c] = _mm256_madd_epi16(p, dt == TIDE_Q6_K ? _mm256_loadu_si256((const __m256i *)u->scv[c]) : ones);
    }
    return finish(dt, u, reduce8(d), a.bs + 16 * s, a.d + 8 * s, acc);
}

TK_VNNI static TK_INLINE __m256 dot_nat_vnni(tide_dtype dt, const tq_sup *u, tq_act a, int64_t s, __m256 acc) {
    if (dt == TIDE_Q6_K) return dot_nat_avx2(dt, u, a, s, acc);
    const int8_t *aq = a.q + 256 * s;
    __m256i d[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        __m256i w = _mm256_load_si256((const __m256i *)(u->q + 32 * c));
        __m256i x = _mm256_loadu_si256((const __m256i *)(aq + 32 * c));
        __m256i z = _mm256_setzero_si256();
        d[c] = dt == TIDE_Q8_0 ? _mm256_dpbusd_epi32(z, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
                               : _mm256_dpbusd_epi32(z, w, x);
    }
    return finish(dt, u, reduce8(d), a.bs + 16 * s, a.d + 8 * s, acc);
}

/* The decode kernels on 512-bit vectors (AVX-512 VNNI): a superchunk's
 * weights unpacked in registers as four vectors, chunks 2z and 2z + 1 in
 * element order in the halves of vector z (the activations' decode layout
 * as it lies: one load each), four VPDPBUSD, and the lanes of each chunk
 * summed by one transposing reduction; the integers are those of the paths
 * above, and finish_v's float steps theirs. */

/* z[i]'s 4 dword sums per 128-bit lane L, in lane 4L + i: per 128 bits,
 * half a chunk's (16 elements) dot product. */
TK_VNNI static TK_INLINE __m512i z_quads(const __m512i z[4]) {
    __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]), _mm512_unpackhi_epi32(z[0], z[1]));
    __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]), _mm512_unpackhi_epi32(z[2], z[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}

/* z_quads' sums of the two halves of each chunk, lane c chunk c's. */
TK_VNNI static TK_INLINE __m256i z_chunks(__m512i q) {
    __m512i v = _mm512_add_epi32(q, _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512i idx = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, v));
}

/* acc[r] += weight superchunk s (8 chunks) times activation row r's, r < nr. */
TK_VNNI static TK_INLINE void dot_z(tide_dtype dt, const uint8_t *wr, int64_t s, const uint8_t *act, size_t ab,
                                    int64_t K, int64_t nr, __m256 *acc) {
    const __m512i m4 = _mm512_set1_epi8(15);
    prefetch_sup(dt, wr, s);
    __m512i W[4];
    __m256i sc = _mm256_setzero_si256(), mn = _mm256_setzero_si256();
    __m256 dA, dM = _mm256_setzero_ps();
    if (dt == TIDE_Q8_0) {
        const tide_block_q8_0 *x = (const tide_block_q8_0 *)wr + 8 * s;
        uint16_t h[8];
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) {
            __m256i lo = _mm256_loadu_si256((const __m256i *)x[2 * z].qs);
            W[z] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256((const __m256i *)x[2 * z + 1].qs),
                                      1);
            h[2 * z] = x[2 * z].d, h[2 * z + 1] = x[2 * z + 1].d;
        }
        dA = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
    } else if (dt == TIDE_Q4_K || dt == TIDE_Q5_K) {
        const uint8_t *qs, *qh = NULL;
        const tide_block_q4_k *k4 = (const tide_block_q4_k *)wr + s;
        const tide_block_q5_k *k5 = (const tide_block_q5_k *)wr + s;
        const tide_block_q4_k *x = dt == TIDE_Q4_K ? k4 : (const tide_block_q4_k *)(const void *)k5;
        qs = dt == TIDE_Q4_K ? k4->qs : k5->qs;
        if (dt == TIDE_Q5_K) qh = k5->qh;
        k_scales_v(x->scales, &sc, &mn);
        dA = _mm256_set1_ps(_cvtsh_ss(x->d));
        dM = _mm256_set1_ps(_cvtsh_ss(x->dmin));
        const __m512i nib = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0); /* chunk 2g: low nibbles, 2g + 1: high */
        __m512i H = qh ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh)) : _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * g)));
            W[g] = _mm512_and_si512(_mm512_srlv_epi64(b, nib), m4);
            if (qh) {
                __m512i sh = _mm512_add_epi64(_mm512_set_epi64(1, 1, 1, 1, 0, 0, 0, 0), _mm512_set1_epi64(2 * g));
                __m512i hb = _mm512_and_si512(_mm512_srlv_epi64(H, sh), _mm512_set1_epi8(1));
                W[g] = _mm512_or_si512(W[g], _mm512_slli_epi64(hb, 4));
            }
        }
    } else { /* Q6_K */
        const tide_block_q6_k *x = (const tide_block_q6_k *)wr + s;
        __m128i s8 = _mm_loadu_si128((const __m128i *)x->scales);
        sc = _mm256_cvtepi8_epi16(s8);
        dA = _mm256_set1_ps(_cvtsh_ss(x->d));
        const __m512i m2 = _mm512_set1_epi8(3 << 4);
        const __m512i up = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4), dn = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; hf++) {
            __m512i l = _mm512_loadu_si512((const void *)(x->ql + 64 * hf)); /* [chunk 4hf | 4hf + 1] low 4 bits */
            __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * hf)));
            W[2 * hf] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi64(H, up), m2));
            W[2 * hf + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(l, 4), m4),
                                            _mm512_and_si512(_mm512_srlv_epi64(H, dn), m2));
        }
    }
    __m512i S = _mm512_setzero_si512(), WA[4];
    __mmask64 neg[4] = {0, 0, 0, 0};
    if (dt == TIDE_Q6_K) { /* lane 4L + z of z_quads: scale 4z + L */
        const tide_block_q6_k *x = (const tide_block_q6_k *)wr + s;
        const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        S = _mm512_permutexvar_epi32(tr, _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x->scales)));
    }
#pragma GCC unroll 4
    for (int z = 0; z < 4; z++) {
        WA[z] = W[z];
        if (dt == TIDE_Q8_0) neg[z] = _mm512_movepi8_mask(W[z]), WA[z] = _mm512_abs_epi8(W[z]);
    }
    for (int64_t r = 0; r < nr; r++) {
        tq_act a = act_of(act + (size_t)r * ab, K);
        const int8_t *aq = a.q + 256 * s;
        __m512i Z[4];
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) {
            __m512i x = _mm512_loadu_si512((const void *)(aq + 64 * z));
            if (dt == TIDE_Q8_0) x = _mm512_mask_sub_epi8(x, neg[z], _mm512_setzero_si512(), x);
            Z[z] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), WA[z], x);
        }
        __m512i q = z_quads(Z);
        if (dt == TIDE_Q6_K) q = _mm512_mullo_epi32(q, S);
        acc[r] = finish_v(dt, z_chunks(q), sc, mn, dA, dM, a.bs + 16 * s, a.d + 8 * s, acc[r]);
    }
}
#endif

/* ------------------------------------------------------------- drivers */

/* Rows per block: as many quantized rows as fit ~256 KiB (L2), 1..TQ_RB. */
#define TQ_RB 64
/* Rows from which a call lays its integers out interleaved: a weight's
 * transpose then pays for itself over the rows, each sparing its sums
 * across lanes. */
#define TQ_IL_ROWS 4

typedef enum { TQ_PORTABLE, TQ_AVX2, TQ_VNNI } tq_path;

static tq_path q_path(void) {
    if (tk_cpu_has(TK_CPU_AVX512VNNI | TK_CPU_AVX2)) return TQ_VNNI;
    return tk_have_avx2() ? TQ_AVX2 : TQ_PORTABLE;
}

const char *tk_matmul_q_path(void) {
    static const char *names[] = {"portable", "avx2", "avx512_vnni"};
    return names[q_path()];
}

/* The shared arguments of a thread's share: columns [n0, n1), rows
 * [0, R) of quantized activations act (row stride ab bytes). */
typedef struct tq_job {
    tide_dtype dt;
    const uint8_t *w;
    size_t wrow;
    const uint8_t *act;
    size_t ab;
    int64_t R, K, n0, n1;
    float *out;
    int64_t ldo;
} tq_job;

static void cols_portable(const tq_job *j) {
    int64_t ns = pad_k(j->K) / 256, rb = TIDE_MAX(1, TIDE_MIN(TQ_RB, (int64_t)((256u << 10) / j->ab)));
    float acc[TQ_RB][8];
    tq_sup u;
    for (int64_t r0 = 0; r0 < j->R; r0 += rb) {
        int64_t nr = TIDE_MIN(rb, j->R - r0);
        for (int64_t n = j->n0; n < j->n1; n++) {
            memset(acc, 0, sizeof(float) * 8 * (size_t)nr);
            for (int64_t s = 0; s < ns; s++) {
                int nc = sup_chunks(j->K, s);
                unpack_portable(j->dt, j->w + (size_t)n * j->wrow, s, nc, &u);
                for (int64_t r = 0; r < nr; r++)
                    dot_portable(j->dt, &u, act_of(j->act + (size_t)(r0 + r) * j->ab, j->K), s, nc, acc[r]);
            }
            for (int64_t r = 0; r < nr; r++) j->out[(r0 + r) * j->ldo + n] = sum8_portable(acc[r]);
        }
    }
}

#ifdef TK_X86
/* The AVX2 and VNNI drivers, one per weight type: the type a constant so
 * that the unpacker and the dot product fold to its code. */
/* The interleaved (prefill) drivers take columns in pairs where two are
 * left: two weight rows' superchunks unpacked side by side, each row of
 * activations loaded once for both (about 1.4x); the decode ones one at a
 * time (pairs were slower there). Either way each output is its own chain. */
#define TQ_COLS(NAME, ATTR, DOT, DT, IL)                                                                         \
    ATTR static void NAME(const tq_job *j) {                                                                   \
        int64_t ns = pad_k(j->K) / 256, rb = TIDE_MAX(1, TIDE_MIN(TQ_RB, (int64_t)((256u << 10) / j->ab)));     \
        __m256 acc[2][TQ_RB];                                                                                  \
        tq_sup u[2];                                                                                           \
        for (int64_t r0 = 0; r0 < j->R; r0 += rb) {                                                            \
            int64_t nr = TIDE_MIN(rb, j->R - r0);                                                              \
            for (int64_t n = j->n0; n < j->n1; n += 1 + (IL && n + 1 < j->n1)) {                               \
                bool two = IL && n + 1 < j->n1;                                                                \
                for (int64_t r = 0; r < nr; r++) acc[0][r] = acc[1][r] = _mm256_setzero_ps();                  \
                for (int64_t s = 0; s < ns; s++) {                                                             \
                    int nc = sup_chunks(j->K, s);                                                              \
                    if (!IL) prefetch_sup(DT, j->w + (size_t)n * j->wrow, s);                                  \
                    unpack_avx2(DT, j->w + (size_t)n * j->wrow, s, nc, &u[0], IL);                             \
                    if (two) {                                                                                 \
                        unpack_avx2(DT, j->w + (size_t)(n + 1) * j->wrow, s, nc, &u[1], IL);                   \
                        for (int64_t r = 0; r < nr; r++) {                                                     \
                            tq_act a = act_of(j->act + (size_t)(r0 + r) * j->ab, j->K);                        \
                            acc[0][r] = DOT(DT, &u[0], a, s, acc[0][r]);                                       \
                            acc[1][r] = DOT(DT, &u[1], a, s, acc[1][r]);                                       \
                        }                                                                                      \
                    } else {                                                                                   \
                        for (int64_t r = 0; r < nr; r++)                                                       \
                            acc[0][r] = DOT(DT, &u[0], act_of(j->act + (size_t)(r0 + r) * j->ab, j->K), s,     \
                                            acc[0][r]);                                                        \
                    }                                                                                          \
                }                                                                                              \
                for (int64_t r = 0; r < nr; r++) {                                                             \
                    j->out[(r0 + r) * j->ldo + n] = hsum8(acc[0][r]);                                          \
                    if (two) j->out[(r0 + r) * j->ldo + n + 1] = hsum8(acc[1][r]);                             \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }
TQ_COLS(cols_avx2_q8_0, TK_A2, dot_avx2, TIDE_Q8_0, true)
TQ_COLS(cols_avx2_q4_0, TK_A2, dot_avx2, TIDE_Q4_0, true)
TQ_COLS(cols_avx2_q4_k, TK_A2, dot_avx2, TIDE_Q4_K, true)
TQ_COLS(cols_avx2_q5_k, TK_A2, dot_avx2, TIDE_Q5_K, true)
TQ_COLS(cols_avx2_q6_k, TK_A2, dot_avx2, TIDE_Q6_K, true)
TQ_COLS(cols_vnni_q8_0, TK_VNNI, dot_vnni, TIDE_Q8_0, true)
TQ_COLS(cols_vnni_q4_0, TK_VNNI, dot_vnni, TIDE_Q4_0, true)
TQ_COLS(cols_vnni_q4_k, TK_VNNI, dot_vnni, TIDE_Q4_K, true)
TQ_COLS(cols_vnni_q5_k, TK_VNNI, dot_vnni, TIDE_Q5_K, true)
TQ_COLS(cols_vnni_q6_k, TK_VNNI, dot_vnni, TIDE_Q6_K, true)
TQ_COLS(nat_avx2_q8_0, TK_A2, dot_nat_avx2, TIDE_Q8_0, false)
TQ_COLS(nat_avx2_q4_0, TK_A2, dot_nat_avx2, TIDE_Q4_0, false)
TQ_COLS(nat_avx2_q4_k, TK_A2, dot_nat_avx2, TIDE_Q4_K, false)
TQ_COLS(nat_avx2_q5_k, TK_A2, dot_nat_avx2, TIDE_Q5_K, false)
TQ_COLS(nat_vnni_q4_0, TK_VNNI, dot_nat_vnni, TIDE_Q4_0, false)
TQ_COLS(nat_avx2_q6_k, TK_A2, dot_nat_avx2, TIDE_Q6_K, false)

/* The 512-bit decode drivers: a column at a time, its superchunks
 * unpacked once for the rows (fewer than TQ_IL_ROWS); a Q8_0 row's last
 * superchunk of under 8 blocks by the 256-bit kernel. */
#define TQ_ZCOLS(NAME, DT)                                                                                     \
    TK_VNNI static void NAME(const tq_job *j) {                                                                \
        int64_t ns = pad_k(j->K) / 256;                                                                        \
        __m256 acc[TQ_IL_ROWS];                                                                                \
        tq_sup u;                                                                                              \
        for (int64_t n = j->n0; n < j->n1; n++) {                                                              \
            const uint8_t *wr = j->w + (size_t)n * j->wrow;                                                    \
            int64_t s = 0;                                                                                     \
            if (j->R == 1) { /* the usual decode: the sum in a register */                                     \
                __m256 a1 = _mm256_setzero_ps();                                                               \
                for (; s < ns && sup_chunks(j->K, s) == 8; s++) dot_z(DT, wr, s, j->act, j->ab, j->K, 1, &a1); \
                acc[0] = a1;                                                                                   \
            } else {                                                                                           \
                for (int64_t r = 0; r < j->R; r++) acc[r] = _mm256_setzero_ps();                               \
                for (; s < ns && sup_chunks(j->K, s) == 8; s++) dot_z(DT, wr, s, j->act, j->ab, j->K, j->R, acc); \
            }                                                                                                  \
            for (; s < ns; s++) {                                                                              \
                unpack_avx2(DT, wr, s, sup_chunks(j->K, s), &u, false);                                        \
                for (int64_t r = 0; r < j->R; r++)                                                             \
                    acc[r] = dot_nat_vnni(DT, &u, act_of(j->act + (size_t)r * j->ab, j->K), s, acc[r]);        \
            }                                                                                                  \
            for (int64_t r = 0; r < j->R; r++) j->out[r * j->ldo + n] = hsum8(acc[r]);                         \
        }                                                                                                      \
    }
TQ_ZCOLS(z_vnni_q8_0, TIDE_Q8_0)
TQ_ZCOLS(z_vnni_q4_k, TIDE_Q4_K)
TQ_ZCOLS(z_vnni_q5_k, TIDE_Q5_K)
TQ_ZCOLS(z_vnni_q6_k, TIDE_Q6_K)

/* il: the interleaved layout (prefill), else the element order (decode). */
static void cols_x86(tq_path p, bool il, const tq_job *j) {
    bool v = p == TQ_VNNI;
    switch (j->dt) {
    case TIDE_Q8_0: (il ? v ? cols_vnni_q8_0 : cols_avx2_q8_0 : v ? z_vnni_q8_0 : nat_avx2_q8_0)(j); break;
    case TIDE_Q4_0: (il ? v ? cols_vnni_q4_0 : cols_avx2_q4_0 : v ? nat_vnni_q4_0 : nat_avx2_q4_0)(j); break;
    case TIDE_Q4_K: (il ? v ? cols_vnni_q4_k : cols_avx2_q4_k : v ? z_vnni_q4_k : nat_avx2_q4_k)(j); break;
    case TIDE_Q5_K: (il ? v ? cols_vnni_q5_k : cols_avx2_q5_k : v ? z_vnni_q5_k : nat_avx2_q5_k)(j); break;
    case TIDE_Q6_K: (il ? v ? cols_vnni_q6_k : cols_avx2_q6_k : v ? z_vnni_q6_k : nat_avx2_q6_k)(j); break;
    default: break;
    }
}
#endif

size_t tk_matmul_q_min_scratch(int64_t K) { return tk_matmul_q_row_bytes(K); }

tide_status tk_matmul_q(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N, float *out,
                        int64_t ldo, void *scratch, size_t scratch_bytes, int nt) {
    if (!tide_dtype_is_quantized(wdt)) return TIDE_E_INVALID;
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX || ldo > INT_MAX) return TIDE_E_UNSUPPORTED;
    if (K % tide_dtype_block(wdt)) return TIDE_E_INVALID;
    size_t ab = tk_matmul_q_row_bytes(K);
    int64_t rows = scratch ? (int64_t)(scratch_bytes / ab) : 0;
    if (rows < 1) return TIDE_E_INVALID;
    if (R <= 0 || N <= 0) return TIDE_OK;
    tq_path path = q_path();
    size_t wrow = (size_t)tide_dtype_bytes(wdt, (uint64_t)K);
    /* one thread below ~1 MFLOP */
    if ((double)TIDE_MIN(R, rows) * (double)K * (double)N < 5e5) nt = 1;
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
        int64_t nr = TIDE_MIN(rows, R - r0);
        /* the layout: interleaved from TQ_IL_ROWS rows on (and always on the
         * portable path), else in element order; the integers, and so the
         * bits, are the same */
        bool il = path == TQ_PORTABLE || nr >= TQ_IL_ROWS;
        quantize_rows(x + r0 * K, K, nr, K, scratch, il, nt);
#pragma omp parallel num_threads(nt)
        {
            int t = omp_get_thread_num(), nth = omp_get_num_threads();
            tq_job j = {.dt = wdt, .w = w, .wrow = wrow, .act = scratch, .ab = ab, .R = nr, .K = K,
                        .n0 = N * t / nth, .n1 = N * (t + 1) / nth, .out = out + r0 * ldo, .ldo = ldo};
#ifdef TK_X86
            if (path != TQ_PORTABLE)
                cols_x86(path, il, &j);
            else
#endif
                cols_portable(&j);
        }
    }
    (void)path;
    return TIDE_OK;
}
