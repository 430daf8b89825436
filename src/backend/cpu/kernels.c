/*
 * kernels.c - the CPU kernels of kernels.h but the products: the code-path
 * dispatch, the dtype conversions, EMBED, RMSNORM, ROPE, the elementwise ops
 * and the generic op.
 *
 * Threads: each kernel opens its own OpenMP region with nt threads and splits
 * only independent outputs (rows, elements, attention tiles) between them.
 *
 * MATMUL and the fixed-tile sgemm live in matmul.c, attention in attention.c,
 * the training ops' kernels in kernels_train.c.
 *
 * Code paths chosen at run time: AVX-512 (F, BW, VL) and AVX2+FMA for the
 * hot loops (the conversions, RMSNORM, ADD and SILU_MUL have both, ROPE's
 * rotation AVX2 alone; the matmuls their own kernels), portable loops
 * (vectorised by `omp simd`) elsewhere. Within one path the order of every
 * floating-point reduction is fixed by the code alone; elementwise results
 * are the same bits on every path (conversion, ROPE's rotation, ADD) or on
 * both SIMD paths (SILU_MUL: one exp polynomial on 8 or 16 lanes).
 */
#include "backend/cpu/kernels.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/kernels_int.h"
#include "backend/cpu/kernels_avx512.h"

/* ------------------------------------------------------------- dispatch */

/* The instruction sets come from cpu_features.c; forcing the portable paths
 * there (tk_force_generic, defined there: test builds only) forces them here
 * too. */
void tk_init(void) { (void)tk_cpu_detected(); }

bool tk_have_avx2(void) { return tk_cpu_has(TK_CPU_AVX2); }

bool tk_have_avx512(void) { return tk_cpu_has(TK_CPU_AVX512F | TK_CPU_AVX512BW | TK_CPU_AVX512VL); }

/* ------------------------------------------------------------- conversion */

typedef union { float f; uint32_t u; } tk_bits;

static inline float u2f(uint32_t u) { tk_bits b = {.u = u}; return b.f; }
static inline uint32_t f2u(float f) { tk_bits b = {.f = f}; return b.u; }

/* binary16 -> binary32 without branches (so that loops vectorise): rebias the
 * exponent; exponent 31 (inf/NaN) maps to 255 keeping the payload; exponent 0
 * (zero/subnormal) is renormalised exactly by one subtraction of 2^-14. */
static inline float h2f(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t o = (h & 0x7fffu) << 13;
    uint32_t e = o & 0x0f800000u;
    o += 0x38000000u;                                    /* (127 - 15) << 23 */
    uint32_t special = o + 0x38000000u;                  /* exponent -> 255 */
    uint32_t sub = f2u(u2f(o + 0x00800000u) - u2f(0x38800000u));
    /* select by masks, not branches: the form the vectoriser takes */
    uint32_t ms = -(uint32_t)(e == 0x0f800000u), mz = -(uint32_t)(e == 0);
    uint32_t r = (o & ~(ms | mz)) | (special & ms) | (sub & mz);
    return u2f(r | sign);
}

/* The loops are written once and compiled per path: portable, AVX2, AVX-512
 * (integer moves and one exact subtraction: the same bits on each). */
#define TK_CONVERT_LOOPS(NAME, ATTR)                                                 \
    ATTR static void NAME##_bf16(const uint16_t *s, float *d, size_t n) {            \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) d[i] = u2f((uint32_t)s[i] << 16); \
    }                                                                                \
    ATTR static void NAME##_f16(const uint16_t *s, float *d, size_t n) {             \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) d[i] = h2f(s[i]);         \
    }

TK_CONVERT_LOOPS(conv_generic, )
#ifdef TK_X86
TK_CONVERT_LOOPS(conv_avx2, TK_AVX2)
TK_CONVERT_LOOPS(conv_avx512, TK_AVX512)
#endif

void tk_convert(const void *src, tide_dtype dt, float *dst, size_t n) {
    bool avx = tk_have_avx2(), avx512 = tk_have_avx512();
    switch (dt) {
    case TIDE_F32:
        memmove(dst, src, n * sizeof(float));
        break;
    case TIDE_BF16:
#ifdef TK_X86
        if (avx512) {
            conv_avx512_bf16(src, dst, n);
            break;
        }
        if (avx) {
            conv_avx2_bf16(src, dst, n);
            break;
        }
#endif
        conv_generic_bf16(src, dst, n);
        break;
    case TIDE_F16:
#ifdef TK_X86
        if (avx512) {
            conv_avx512_f16(src, dst, n);
            break;
        }
        if (avx) {
            conv_avx2_f16(src, dst, n);
            break;
        }
#endif
        conv_generic_f16(src, dst, n);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------- small loops */


/* ------------------------------------------------------------- embed, norm */

tide_status tk_embed(const void *table, tide_dtype dt, int64_t V, int64_t D, int64_t vocab0,
                     int64_t vocab, bool first, const int32_t *tokens, int64_t R, float *out,
                     int64_t *bad, int nt) {
    if (!vocab) vocab = V;
    for (int64_t r = 0; r < R; r++)
        if (tokens[r] < 0 || tokens[r] >= vocab) {
            *bad = r;
            return TIDE_E_RANGE;
        }
    size_t rowb = (size_t)tide_dtype_bytes(dt, (uint64_t)D); /* a block type's rows are whole blocks */
    bool q = tide_dtype_is_quantized(dt);
    const uint8_t *tab = table;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * D >= TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        int64_t id = (int64_t)tokens[r] - vocab0;
        if (id >= 0 && id < V && q)
            tk_dequant_row(tab + (size_t)id * rowb, dt, out + r * D, D);
        else if (id >= 0 && id < V)
            tk_convert(tab + (size_t)id * rowb, dt, out + r * D, (size_t)D);
        else if (first)
            memset(out + r * D, 0, (size_t)D * sizeof(float));
    }
    return TIDE_OK;
}

/* The row loops of RMSNORM and ADD, written once and compiled per code path
 * (portable, AVX2, AVX-512) so that each vectorises at its width whatever
 * the build's -march: the sum of squares' order is fixed by the path's code;
 * the products and sums are elementwise, the same bits on every path. */
#define TK_ROW_LOOPS(NAME, ATTR)                                                                   \
    ATTR static double NAME##_sumsq(const float *x, int64_t n) {                                   \
        double ss = 0;                                                                             \
        _Pragma("omp simd reduction(+ : ss)") for (int64_t i = 0; i < n; i++) ss +=                \
            (double)x[i] * (double)x[i];                                                           \
        return ss;                                                                                 \
    }                                                                                              \
    ATTR static void NAME##_scale(const float *x, const float *w, float rs, float *o, int64_t n) { \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = w[i] * (x[i] * rs);             \
    }                                                                                              \
    ATTR static void NAME##_add(const float *a, const float *b, float *o, int64_t n) {             \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i];                    \
    }

TK_ROW_LOOPS(rows_generic, )
#ifdef TK_X86
TK_ROW_LOOPS(rows_avx2, TK_AVX2)
TK_ROW_LOOPS(rows_avx512, TK_AVX512)
#endif

typedef struct tk_rows {
    double (*sumsq)(const float *, int64_t);
    void (*scale)(const float *, const float *, float, float *, int64_t);
    void (*add)(const float *, const float *, float *, int64_t);
} tk_rows;

static tk_rows rows_path(void) {
#ifdef TK_X86
    if (tk_have_avx512()) return (tk_rows){rows_avx512_sumsq, rows_avx512_scale, rows_avx512_add};
    if (tk_have_avx2()) return (tk_rows){rows_avx2_sumsq, rows_avx2_scale, rows_avx2_add};
#endif
    return (tk_rows){rows_generic_sumsq, rows_generic_scale, rows_generic_add};
}

void tk_rmsnorm(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t D, float eps,
                float *out, int nt) {
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
    const tk_rows k = rows_path();
#pragma omp parallel for schedule(static) num_threads(nt) if (R * D >= TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D;
        float *orow = out + r * D;
        double ss = k.sumsq(xr, D);
        float rs = 1.0f / sqrtf((float)(ss / (double)D) + eps);
        _Alignas(64) float wf[TK_CHUNK];
        for (int64_t i0 = 0; i0 < D; i0 += TK_CHUNK) {
            int64_t n = TIDE_MIN(TK_CHUNK, D - i0);
            const float *wp = (const float *)w + i0; /* f32 weights as they are */
            if (wdt != TIDE_F32) {
                tk_convert(wb + (size_t)i0 * es, wdt, wf, (size_t)n);
                wp = wf;
            }
            k.scale(xr + i0, wp, rs, orow + i0, n);
        }
    }
}

/* ------------------------------------------------------------- rope */

#define TK_ROPE_CHUNK 128

/* One head's rotation of n pairs (i, i + half) by the angles' cos c and sin
 * s; no contraction (ISO C mode), so the same bits on every path. */
#define TK_ROPE_PAIRS(NAME, ATTR)                                                                  \
    ATTR static void NAME(const float *xr, float *orow, const float *c, const float *s, int n,      \
                          int half) {                                                              \
        _Pragma("omp simd") for (int i = 0; i < n; i++) {                                          \
            float x0 = xr[i], x1 = xr[i + half];                                                   \
            orow[i] = x0 * c[i] - x1 * s[i];                                                       \
            orow[i + half] = x1 * c[i] + x0 * s[i];                                                \
        }                                                                                          \
    }

TK_ROPE_PAIRS(rope_pairs_generic, )
#ifdef TK_X86
TK_ROPE_PAIRS(rope_pairs_avx2, TK_AVX2)
#endif

/* The same with the input's pairs adjacent, (2i, 2i + 1) (llama.cpp's GGUF
 * q/k order; xr is the head's start): the same products, so the same bits. */
static void rope_pairs_interleaved(const float *xr, float *orow, const float *c, const float *s, int n, int half) {
    for (int i = 0; i < n; i++) {
        float x0 = xr[2 * i], x1 = xr[2 * i + 1];
        orow[i] = x0 * c[i] - x1 * s[i];
        orow[i + half] = x1 * c[i] + x0 * s[i];
    }
}

typedef void (*tk_rope_pairs)(const float *, float *, const float *, const float *, int, int);

/* AVX2 on AVX-512 machines too: the cos/sin of the angles (scalar libm)
 * bound ROPE, and the 16-lane rotation measured no faster (1.01x). */
static tk_rope_pairs rope_path(void) {
#ifdef TK_X86
    if (tk_have_avx2()) return rope_pairs_avx2;
#endif
    return rope_pairs_generic;
}

void tk_rope_rotate(const float *x, const int32_t *pos, int64_t R, int64_t T, int H, int hd, float theta,
                    bool inverse, bool interleaved, float *out, int nt) {
    /* the inverse negates sin exactly: a rotation by minus the same angle */
    const float sgn = inverse ? -1.0f : 1.0f;
    int half = hd / 2;
    int64_t D = (int64_t)H * hd;
    const tk_rope_pairs pairs = interleaved ? rope_pairs_interleaved : rope_path();
    const int64_t xstep = interleaved ? 2 : 1; /* input offset of pair i0 */
#pragma omp parallel for schedule(static) num_threads(nt) if (R * D >= TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        float p = (float)pos[r % T];
        float c[TK_ROPE_CHUNK], s[TK_ROPE_CHUNK];
        for (int i0 = 0; i0 < half; i0 += TK_ROPE_CHUNK) {
            int n = TIDE_MIN(TK_ROPE_CHUNK, half - i0);
            for (int i = 0; i < n; i++) {
                /* as HF: inv_freq = 1 / theta ** (arange(0, hd, 2).float() / hd), in f32 */
                float inv = 1.0f / powf(theta, (float)(2 * (i0 + i)) / (float)hd);
                float a = p * inv;
                c[i] = cosf(a);
                s[i] = sgn * sinf(a);
            }
            for (int h = 0; h < H; h++)
                pairs(x + r * D + (int64_t)h * hd + xstep * i0, out + r * D + (int64_t)h * hd + i0, c, s, n, half);
        }
    }
}

void tk_rope(const float *x, const int32_t *pos, int64_t R, int64_t T, int H, int hd,
             float theta, bool interleaved, float *out, int nt) {
    tk_rope_rotate(x, pos, R, T, H, hd, theta, false, interleaved, out, nt);
}

/* ------------------------------------------------------------- elementwise */

static void silu_mul_generic(const float *gate, const float *up, float *out, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

#ifdef TK_X86
/* The sigmoid from exp(-|g|) (exp_neg_avx2's range, within 2 ulp of expf),
 * as the backward's AVX2 path: 1 / (1 + e) for g >= 0, e / (1 + e) below;
 * out = (g * s) * up. The tail as the generic loop. */
TK_AVX2 static void silu_mul_avx2(const float *gate, const float *up, float *out, int64_t i0, int64_t i1) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp_neg_avx2(_mm256_or_ps(g, sign));
        __m256 den = _mm256_add_ps(one, e);
        __m256 sg = _mm256_blendv_ps(_mm256_div_ps(one, den), _mm256_div_ps(e, den),
                                     _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sg), _mm256_loadu_ps(up + i)));
    }
    silu_mul_generic(gate, up, out, i, i1);
}

/* silu_mul_avx2 on 16 lanes, the tail under a mask: the same bits per
 * element as the AVX2 loop's (its generic tail aside). */
TK_AVX512 static void silu_mul_avx512(const float *gate, const float *up, float *out, int64_t i0, int64_t i1) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = i0; i < i1; i += 16) {
        __mmask16 m = (__mmask16)(i1 - i >= 16 ? 0xffff : (1u << (i1 - i)) - 1);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 e = exp_neg_avx512(_mm512_castsi512_ps(
            _mm512_or_si512(_mm512_castps_si512(g), _mm512_set1_epi32((int)0x80000000u))));
        __m512 den = _mm512_add_ps(one, e);
        __m512 sg = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ),
                                         _mm512_div_ps(one, den), _mm512_div_ps(e, den));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(g, sg), _mm512_maskz_loadu_ps(m, up + i)));
    }
}
#endif

#define TK_ELEM_BLOCK 4096

void tk_silu_mul(const float *gate, const float *up, float *out, int64_t n, int nt) {
    const bool avx = tk_have_avx2(), avx512 = tk_have_avx512();
    int64_t nblk = (n + TK_ELEM_BLOCK - 1) / TK_ELEM_BLOCK;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TK_PAR_MIN)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t i0 = b * TK_ELEM_BLOCK, i1 = TIDE_MIN(n, i0 + TK_ELEM_BLOCK);
#ifdef TK_X86
        if (avx512) {
            silu_mul_avx512(gate, up, out, i0, i1);
            continue;
        }
        if (avx) {
            silu_mul_avx2(gate, up, out, i0, i1);
            continue;
        }
#endif
        silu_mul_generic(gate, up, out, i0, i1);
    }
}

tide_status tk_add_bias(const float *x, const void *b, tide_dtype bdt, int64_t R, int64_t N, float *out, int nt) {
    /* a 16-bit bias widened once for all rows */
    float *wide = bdt == TIDE_F32 ? NULL : tide_malloc((size_t)N * sizeof(float));
    if (bdt != TIDE_F32 && !wide) return TIDE_E_NOMEM;
    if (wide) tk_convert(b, bdt, wide, (size_t)N);
    const float *bf = wide ? wide : b;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * N >= TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * N;
        float *o = out + r * N;
        for (int64_t j = 0; j < N; j++) o[j] = xr[j] + bf[j];
    }
    tide_free(wide);
    return TIDE_OK;
}

void tk_add(const float *a, const float *b, float *out, int64_t n, int nt) {
    const tk_rows k = rows_path();
    int64_t nb = (n + TK_PAR_MIN - 1) / TK_PAR_MIN;
#pragma omp parallel for schedule(static) num_threads(nt) if (nb > 1)
    for (int64_t blk = 0; blk < nb; blk++) {
        int64_t i0 = blk * TK_PAR_MIN;
        k.add(a + i0, b + i0, out + i0, TIDE_MIN((int64_t)TK_PAR_MIN, n - i0));
    }
}

void tk_take_last(const float *x, int64_t B, int64_t T, int64_t D, float *out) {
    for (int64_t b = 0; b < B; b++)
        memcpy(out + b * D, x + (b * T + T - 1) * D, (size_t)D * sizeof(float));
}

void tk_argmax(const float *x, int64_t R, int64_t V, int32_t *out, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt) if (R * V >= TK_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * V;
        int64_t best = 0;
        for (int64_t j = 0; j < V; j++) {
            if (isnan(xr[j])) {
                best = j;
                break;
            }
            if (xr[j] > xr[best]) best = j;
        }
        out[r] = (int32_t)best;
    }
}

/* ------------------------------------------------------------- generic */

#define TK_GEN_CHUNK 65536

void tk_generic(int n_in, const uint8_t *const *in, const uint64_t *in_bytes, int n_out,
                uint8_t *const *out, const uint64_t *out_bytes, int nt) {
    for (int k = 0; k < n_out; k++) {
        uint64_t n = out_bytes[k];
        int64_t nchunk = (int64_t)((n + TK_GEN_CHUNK - 1) / TK_GEN_CHUNK);
        uint8_t *dst = out[k];
#pragma omp parallel for schedule(static) num_threads(nt) if (nchunk > 1)
        for (int64_t c = 0; c < nchunk; c++) {
            uint64_t j0 = (uint64_t)c * TK_GEN_CHUNK, j1 = TIDE_MIN(n, j0 + TK_GEN_CHUNK);
            uint64_t idx[TIDE_OP_MAX_IN];
            for (int i = 0; i < n_in; i++) idx[i] = j0 % in_bytes[i];
            for (uint64_t j = j0; j < j1; j++) {
                uint32_t s = 31u * (uint32_t)j + 17u * (uint32_t)k;
                for (int i = 0; i < n_in; i++) {
                    s += (uint32_t)(i + 1) * in[i][idx[i]];
                    if (++idx[i] == in_bytes[i]) idx[i] = 0;
                }
                dst[j] = (uint8_t)s;
            }
        }
    }
}
