/*
 * kernels_train.c - the CPU kernels of the training ops (kernels.h, after
 * tk_generic): the backward of each forward op, the loss, the gradients' sum
 * of squares and the optimizer step. ATTENTION_BWD lives in attention.c, the
 * matmul forms in matmul.c.
 *
 * Determinism: every result is the same bits for any thread count. Products
 * go to tide's sgemm (sgemm.c) through tk_gemm, whose tiles are fixed by the
 * shape; a sum over rows is either inside one sgemm or a loop in row order
 * over a column block one thread owns (EMBED_BWD, RMSNORM_BWD's dw); a sum
 * over a whole tensor (SUMSQ, the loss) adds partial sums of fixed-size blocks
 * in block order. Threads take whole blocks, never a share cut by their
 * number.
 */
#include "backend/cpu/kernels_int.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>

/* ------------------------------------------------------------- softmax rows */

#ifdef TK_X86
/* s[j] = exp(s[j] - m) for s[j] <= m; returns their sum in double. */
TK_AVX2 static double exp_shift_avx2(float *s, int64_t n, float m) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 vm = _mm256_set1_ps(m);
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;
    int64_t j;
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 e = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    if (j < n) {
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lane);
        __m256 e = exp_neg_avx2(_mm256_sub_ps(_mm256_maskload_ps(s + j, mask), vm));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(s + j, mask, e);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double part[4];
    _mm256_storeu_pd(part, _mm256_add_pd(a0, a1));
    return (part[0] + part[1]) + (part[2] + part[3]);
}

TK_AVX2 static double exp_row_avx2(float *s, int64_t n, float *mx) {
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(s + j));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmx), _mm256_extractf128_ps(vmx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float m = _mm_cvtss_f32(h);
    for (; j < n; j++) m = s[j] > m ? s[j] : m;
    *mx = m;
    return exp_shift_avx2(s, n, m);
}
#endif

/* s[j] = exp(s[j] - m) (every s[j] <= m), their sum in double. */
static double exp_shift(float *s, int64_t n, float m, bool avx) {
#ifdef TK_X86
    if (avx) return exp_shift_avx2(s, n, m);
#endif
    double sum = 0;
    for (int64_t j = 0; j < n; j++) {
        float e = expf(s[j] - m);
        s[j] = e;
        sum += e;
    }
    return sum;
}

double tk_exp_row(float *s, int64_t n, float *mx, bool avx) {
#ifdef TK_X86
    if (avx) return exp_row_avx2(s, n, mx);
#endif
    float m = s[0];
    for (int64_t j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
    *mx = m;
    return exp_shift(s, n, m, false);
}

/* ------------------------------------------------------------- embed, norm */

/* Columns a thread owns at once in the row-ordered sums. */
#define TK_COLS 256

tide_status tk_embed_bwd(const float *dy, const int32_t *tokens, int64_t R, int64_t D, int64_t V,
                         bool accumulate, float *dtable, int64_t *bad, int nt) {
    return tk_embed_bwd_block(dy, tokens, R, D, V, 0, V, accumulate, dtable, bad, nt);
}

tide_status tk_embed_bwd_block(const float *dy, const int32_t *tokens, int64_t R, int64_t D, int64_t V,
                               int64_t vocab0, int64_t vocab, bool accumulate, float *dtable, int64_t *bad, int nt) {
    for (int64_t r = 0; r < R; r++)
        if (tokens[r] < 0 || tokens[r] >= vocab) {
            *bad = r;
            return TIDE_E_RANGE;
        }
    if (!accumulate) {
#pragma omp parallel for schedule(static) num_threads(nt) if (V * D >= TK_PAR_MIN)
        for (int64_t v = 0; v < V; v++) memset(dtable + v * D, 0, (size_t)D * sizeof(float));
    }
    int64_t ncb = (D + TK_COLS - 1) / TK_COLS;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * D >= TK_PAR_MIN && ncb > 1)
    for (int64_t cb = 0; cb < ncb; cb++) {
        int64_t c0 = cb * TK_COLS, n = TIDE_MIN(TK_COLS, D - c0);
        for (int64_t r = 0; r < R; r++) {
            int64_t id = (int64_t)tokens[r] - vocab0;
            if (id < 0 || id >= V) continue; /* another block's row */
            float *dst = dtable + id * D + c0;
            const float *src = dy + r * D + c0;
#pragma omp simd
            for (int64_t i = 0; i < n; i++) dst[i] += src[i];
        }
    }
    return TIDE_OK;
}

void tk_rmsnorm_bwd(const float *x, const void *w, tide_dtype wdt, const float *dy, int64_t R, int64_t D,
                    float eps, bool accumulate, float *dx, float *dw, float *work, int nt) {
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
    int64_t ncb = (D + TK_COLS - 1) / TK_COLS;
#pragma omp parallel num_threads(nt) if (R * D >= TK_PAR_MIN)
    {
        /* rows: rs as tk_rmsnorm, then dx through g = dy * w held in dx */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            const float *xr = x + r * D, *dyr = dy + r * D;
            float *dxr = dx + r * D;
            double ss = 0;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < D; i++) ss += (double)xr[i] * (double)xr[i];
            float rs = 1.0f / sqrtf((float)(ss / (double)D) + eps);
            work[r] = rs;
            double dot = 0;
            float wf[TK_CHUNK];
            for (int64_t i0 = 0; i0 < D; i0 += TK_CHUNK) {
                int64_t n = TIDE_MIN(TK_CHUNK, D - i0);
                tk_convert(wb + (size_t)i0 * es, wdt, wf, (size_t)n);
#pragma omp simd reduction(+ : dot)
                for (int64_t i = 0; i < n; i++) {
                    float g = dyr[i0 + i] * wf[i];
                    dxr[i0 + i] = g;
                    dot += (double)g * (double)xr[i0 + i];
                }
            }
            double r3 = (double)rs * (double)rs * (double)rs;
            float c = (float)(r3 * dot / (double)D);
#pragma omp simd
            for (int64_t i = 0; i < D; i++) dxr[i] = rs * dxr[i] - c * xr[i];
        }
        /* dw: a column block per thread, rows in order, in double */
#pragma omp for schedule(static)
        for (int64_t cb = 0; cb < ncb; cb++) {
            int64_t c0 = cb * TK_COLS, n = TIDE_MIN(TK_COLS, D - c0);
            double acc[TK_COLS] = {0};
            for (int64_t r = 0; r < R; r++) {
                const float *xr = x + r * D + c0, *dyr = dy + r * D + c0;
                float rs = work[r];
#pragma omp simd
                for (int64_t i = 0; i < n; i++) acc[i] += (double)dyr[i] * (double)(xr[i] * rs);
            }
            float *d = dw + c0;
            for (int64_t i = 0; i < n; i++) d[i] = accumulate ? d[i] + (float)acc[i] : (float)acc[i];
        }
    }
}

/* ------------------------------------------------------------- matmul, rope, silu */

tide_status tk_matmul_gradw(const float *dy, const float *x, int64_t R, int64_t N, int64_t K, bool accumulate,
                            float *dw, int nt) {
    if (R > INT_MAX || N > INT_MAX || K > INT_MAX) return TIDE_E_UNSUPPORTED;
    tk_gemm(true, false, N, K, R, 1.0f, dy, N, x, K, accumulate ? 1.0f : 0.0f, dw, K, nt);
    return TIDE_OK;
}

tide_status tk_matmul_gradw_bf16(const void *dy, tide_dtype dydt, const void *x, tide_dtype xdt, int64_t R,
                                 int64_t N, int64_t K, bool accumulate, float *dw, int nt) {
    if (R > INT_MAX || N > INT_MAX || K > INT_MAX) return TIDE_E_UNSUPPORTED;
    tk_gemm_bf16(true, false, N, K, R, dy, dydt, N, x, xdt, K, accumulate, dw, K, nt);
    return TIDE_OK;
}

void tk_rope_bwd(const float *dy, const int32_t *pos, int64_t R, int64_t T, int H, int hd, float theta,
                 float *dx, int nt) {
    tk_rope_rotate(dy, pos, R, T, H, hd, theta, true, false, dx, nt);
}

static void silu_mul_bwd_generic(const float *gate, const float *up, const float *dy, float *dgate, float *dup,
                                 int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
        float g = gate[i], u = up[i], d = dy[i];
        float e1 = 1.0f + expf(-g), s = 1.0f / e1;
        dup[i] = d * (g / e1);
        dgate[i] = d * u * (s * (1.0f + g * (1.0f - s)));
    }
}

#ifdef TK_X86
/* The sigmoid from exp(-|g|) (exp_neg_avx2's range): 1 / (1 + e) for g >= 0,
 * e / (1 + e) below; the tail as the generic loop. */
TK_AVX2 static void silu_mul_bwd_avx2(const float *gate, const float *up, const float *dy, float *dgate,
                                      float *dup, int64_t i0, int64_t i1) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i), d = _mm256_loadu_ps(dy + i);
        __m256 e = exp_neg_avx2(_mm256_or_ps(g, sign));
        __m256 den = _mm256_add_ps(one, e);
        __m256 s = _mm256_blendv_ps(_mm256_div_ps(one, den), _mm256_div_ps(e, den),
                                    _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ));
        __m256 ds = _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(g, _mm256_sub_ps(one, s))));
        _mm256_storeu_ps(dup + i, _mm256_mul_ps(d, _mm256_mul_ps(g, s)));
        _mm256_storeu_ps(dgate + i, _mm256_mul_ps(_mm256_mul_ps(d, u), ds));
    }
    silu_mul_bwd_generic(gate, up, dy, dgate, dup, i, i1);
}
#endif

#define TK_ELEM_BLOCK 4096

void tk_silu_mul_bwd(const float *gate, const float *up, const float *dy, float *dgate, float *dup, int64_t n,
                     int nt) {
    const bool avx = tk_have_avx2();
    int64_t nblk = (n + TK_ELEM_BLOCK - 1) / TK_ELEM_BLOCK;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TK_PAR_MIN)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t i0 = b * TK_ELEM_BLOCK, i1 = TIDE_MIN(n, i0 + TK_ELEM_BLOCK);
#ifdef TK_X86
        if (avx) {
            silu_mul_bwd_avx2(gate, up, dy, dgate, dup, i0, i1);
            continue;
        }
#endif
        silu_mul_bwd_generic(gate, up, dy, dgate, dup, i0, i1);
    }
}

/* ------------------------------------------------------------- cross-entropy */

/* One row of logits l (V) with target t: replaced by its gradient, scale *
 * (softmax - onehot), and its loss term logsumexp - l[t] returned (0 and a
 * zero row for t < 0). */
static double ce_row(float *l, int64_t V, int32_t t, float scale, bool avx) {
    if (t < 0) {
        memset(l, 0, (size_t)V * sizeof(float));
        return 0;
    }
    float lt = l[t], mx;
    double sum = tk_exp_row(l, V, &mx, avx);
    float et = l[t], inv = (float)(1.0 / sum);
#pragma omp simd
    for (int64_t j = 0; j < V; j++) l[j] = scale * (l[j] * inv);
    l[t] = (float)((double)scale * ((double)et / sum - 1.0));
    return (double)mx + log(sum) - (double)lt;
}

/* Rows whose loss terms are summed on one thread; their partial sums are
 * then added in order. */
#define CE_GROUP 256

static double ce_rows(float *L, int64_t cr, int64_t V, const int32_t *tg, float scale, bool avx, int nt) {
    double total = 0;
    for (int64_t g0 = 0; g0 < cr; g0 += CE_GROUP) {
        int n = (int)TIDE_MIN(CE_GROUP, cr - g0);
        double part[CE_GROUP];
#pragma omp parallel for schedule(static) num_threads(nt) if (n * V >= TK_PAR_MIN)
        for (int i = 0; i < n; i++) part[i] = ce_row(L + (g0 + i) * V, V, tg[g0 + i], scale, avx);
        for (int i = 0; i < n; i++) total += part[i];
    }
    return total;
}

/* Widens rows [v0, v0 + cnt) of w (V, D) into wf. */
static void ce_widen(const void *w, tide_dtype wdt, int64_t D, int64_t v0, int64_t cnt, float *wf, int nt) {
    size_t es = tide_dtype_size(wdt);
    const uint8_t *wb = w;
#pragma omp parallel for schedule(static) num_threads(nt) if (cnt * D >= TK_PAR_MIN)
    for (int64_t i = 0; i < cnt; i++) tk_convert(wb + (size_t)((v0 + i) * D) * es, wdt, wf + i * D, (size_t)D);
}

/* The work of CROSS_ENTROPY, CE_STATS and CE_BLOCK over a head w (Vb, D),
 * whole or a block of one: logits of a chunk of rows (cr, Vb) in scratch,
 * then (16-bit heads) rows of w widened to f32: all of them, once, when they
 * fit, else equal blocks of vb rows widened at each use. */
typedef struct ce_work {
    const void *w;
    tide_dtype wdt;
    int64_t Vb, D, CR, vb;
    bool whole;
    float *L, *wf;
    const float *W;
    /* a bf16 step's products (tk_ce_prec): h of hdt; an f32 or bf16 head is
     * read as stored (Wb), an f16 one widened as above */
    bool bf16;
    tide_dtype hdt;
    const void *Wb;
} ce_work;

/* Row r of h (D wide, of c->hdt). */
static const void *ce_h(const ce_work *c, const void *h, int64_t r) {
    return (const uint8_t *)h + (size_t)(r * c->D) * tide_dtype_size(c->hdt);
}

/* Lays the work out; TIDE_E_RANGE with *bad the first row whose target is
 * >= vocab (nothing written), TIDE_E_INVALID for too small a scratch,
 * TIDE_E_UNSUPPORTED for a dimension above INT_MAX. */
static tide_status ce_work_init(ce_work *c, const void *w, tide_dtype wdt, const int32_t *targets, int64_t vocab,
                                int64_t R, int64_t Vb, int64_t D, int64_t chunk_rows, void *scratch,
                                size_t scratch_bytes, int64_t *bad, const tk_ce_prec *prec, int nt) {
    if (R > INT_MAX || Vb > INT_MAX || D > INT_MAX) return TIDE_E_UNSUPPORTED;
    for (int64_t r = 0; r < R; r++)
        if (targets[r] >= vocab) {
            *bad = r;
            return TIDE_E_RANGE;
        }
    *c = (ce_work){.w = w, .wdt = wdt, .Vb = Vb, .D = D, .CR = TIDE_MAX(1, TIDE_MIN(chunk_rows, R)), .vb = Vb,
                   .bf16 = prec && prec->bf16, .hdt = prec && prec->bf16 ? prec->hdt : TIDE_F32};
    const size_t lbytes = (size_t)(c->CR * Vb) * sizeof(float);
    if (!scratch || scratch_bytes < lbytes) return TIDE_E_INVALID;
    c->L = scratch;
    if (c->bf16 && (wdt == TIDE_F32 || wdt == TIDE_BF16)) {
        c->whole = true;
        c->Wb = w;
        return TIDE_OK;
    }
    if (wdt != TIDE_F32) {
        int64_t vb = (int64_t)((scratch_bytes - lbytes) / ((size_t)D * sizeof(float)));
        if (vb < 1) return TIDE_E_INVALID;
        vb = TIDE_MIN(vb, Vb);
        int64_t nblk = (Vb + vb - 1) / vb;
        c->vb = (Vb + nblk - 1) / nblk;
        c->wf = (float *)((uint8_t *)scratch + lbytes);
    }
    c->whole = c->vb == Vb;
    c->W = wdt == TIDE_F32 ? w : c->wf;
    if (wdt != TIDE_F32 && c->whole) ce_widen(w, wdt, D, 0, Vb, c->wf, nt);
    c->Wb = c->W;
    return TIDE_OK;
}

/* The dtype the products read rows of the head in. */
static tide_dtype ce_wdt(const ce_work *c) { return c->Wb == c->w ? c->wdt : TIDE_F32; }

/* The rows [v0, v0 + cnt) of w as f32, widened into the scratch if need be. */
static const void *ce_rows_of(ce_work *c, int64_t v0, int64_t cnt, int nt) {
    if (c->whole) return (const uint8_t *)c->Wb + (size_t)(v0 * c->D) * tide_dtype_size(ce_wdt(c));
    ce_widen(c->w, c->wdt, c->D, v0, cnt, c->wf, nt);
    return c->wf;
}

/* logits (cr, Vb) = h[chunk] . w^T into c->L (a bf16 step: from bf16
 * operands, each logit then rounded to bf16) */
static void ce_logits(ce_work *c, const void *hc, int64_t cr, int nt) {
    for (int64_t v0 = 0; v0 < c->Vb; v0 += c->vb) {
        int64_t cnt = TIDE_MIN(c->vb, c->Vb - v0);
        const void *wr = ce_rows_of(c, v0, cnt, nt);
        if (!c->bf16) {
            tk_gemm(false, true, cr, cnt, c->D, 1.0f, hc, c->D, wr, c->D, 0.0f, c->L + v0, c->Vb, nt);
            continue;
        }
        tk_gemm_bf16(false, true, cr, cnt, c->D, hc, c->hdt, c->D, wr, ce_wdt(c), c->D, false, c->L + v0, c->Vb, nt);
#pragma omp parallel for schedule(static) num_threads(nt) if (cr * cnt >= TK_PAR_MIN)
        for (int64_t i = 0; i < cr; i++) {
            float *l = c->L + i * c->Vb + v0;
            for (int64_t j = 0; j < cnt; j++) l[j] = tide_bf16_to_f32(tide_f32_to_bf16(l[j]));
        }
    }
}

/* With G (cr, Vb) in place of the logits: dh[chunk] (+)= G . w over the
 * blocks of w in order (adding past the first block, or with dh_add), and
 * dw[block] (+)= G^T . h[chunk] (adding past the first chunk r0, or with
 * dw_add; none with dw NULL). */
static void ce_grads(ce_work *c, const void *hc, int64_t r0, int64_t cr, bool dh_add, bool dw_add, float *dh,
                     float *dw, int nt) {
    const int64_t Vb = c->Vb, D = c->D;
    float beta_w = dw_add || r0 > 0 ? 1.0f : 0.0f;
    for (int64_t v0 = 0; v0 < Vb; v0 += c->vb) {
        int64_t cnt = TIDE_MIN(c->vb, Vb - v0);
        const void *wblk = ce_rows_of(c, v0, cnt, nt);
        if (c->bf16) {
            tk_gemm_bf16(false, false, cr, D, cnt, c->L + v0, TIDE_F32, Vb, wblk, ce_wdt(c), D, v0 || dh_add,
                         dh + r0 * D, D, nt);
            if (dw)
                tk_gemm_bf16(true, false, cnt, D, cr, c->L + v0, TIDE_F32, Vb, hc, c->hdt, D, beta_w != 0.0f,
                             dw + v0 * D, D, nt);
            continue;
        }
        tk_gemm(false, false, cr, D, cnt, 1.0f, c->L + v0, Vb, wblk, D, v0 || dh_add ? 1.0f : 0.0f, dh + r0 * D,
                D, nt);
        if (dw) tk_gemm(true, false, cnt, D, cr, 1.0f, c->L + v0, Vb, hc, D, beta_w, dw + v0 * D, D, nt);
    }
}

tide_status tk_cross_entropy(const void *h, const void *w, tide_dtype wdt, const int32_t *targets, int64_t R,
                             int64_t V, int64_t D, float scale, bool accumulate, int64_t chunk_rows, float *loss,
                             float *dh, float *dw, void *scratch, size_t scratch_bytes, int64_t *bad,
                             const tk_ce_prec *prec, int nt) {
    ce_work c;
    tide_status st = ce_work_init(&c, w, wdt, targets, V, R, V, D, chunk_rows, scratch, scratch_bytes, bad, prec, nt);
    if (st) return st;
    const bool avx = tk_have_avx2();
    double total = 0;
    for (int64_t r0 = 0; r0 < R; r0 += c.CR) {
        const int64_t cr = TIDE_MIN(c.CR, R - r0);
        const void *hc = ce_h(&c, h, r0);
        ce_logits(&c, hc, cr, nt);
        total += ce_rows(c.L, cr, V, targets + r0, scale, avx, nt);
        ce_grads(&c, hc, r0, cr, false, accumulate, dh, dw, nt);
    }
    *loss = (float)((double)scale * total);
    return TIDE_OK;
}

/* ------------------------------------------------------------- cross-entropy in vocabulary blocks */

tide_status tk_ce_stats(const void *h, const void *w, tide_dtype wdt, const int32_t *targets, int64_t R,
                        int64_t Vb, int64_t D, int64_t vocab0, int64_t vocab, float scale, const float *stats_in,
                        float *stats, float *loss, int64_t chunk_rows, void *scratch, size_t scratch_bytes,
                        int64_t *bad, const tk_ce_prec *prec, int nt) {
    ce_work c;
    tide_status st =
        ce_work_init(&c, w, wdt, targets, vocab, R, Vb, D, chunk_rows, scratch, scratch_bytes, bad, prec, nt);
    if (st) return st;
    const bool avx = tk_have_avx2();
    for (int64_t r0 = 0; r0 < R; r0 += c.CR) {
        const int64_t cr = TIDE_MIN(c.CR, R - r0);
        ce_logits(&c, ce_h(&c, h, r0), cr, nt);
#pragma omp parallel for schedule(static) num_threads(nt) if (cr * Vb >= TK_PAR_MIN)
        for (int64_t i = 0; i < cr; i++) {
            const int64_t r = r0 + i;
            float *l = c.L + i * Vb, mx;
            int64_t t = (int64_t)targets[r] - vocab0;
            float tl = t >= 0 && t < Vb ? l[t] : 0.0f;
            double sum = tk_exp_row(l, Vb, &mx, avx);
            float *o = stats + r * 3;
            if (!stats_in) {
                o[0] = mx, o[1] = (float)sum, o[2] = tl;
                continue;
            }
            const float *in = stats_in + r * 3;
            float M = in[0] > mx ? in[0] : mx;
            double S = (double)in[1] * exp((double)in[0] - (double)M) + sum * exp((double)mx - (double)M);
            o[0] = M, o[1] = (float)S, o[2] = in[2] + tl;
        }
    }
    if (loss) {
        double total = 0;
        for (int64_t r = 0; r < R; r++)
            if (targets[r] >= 0)
                total += (double)stats[r * 3] + log((double)stats[r * 3 + 1]) - (double)stats[r * 3 + 2];
        *loss = (float)((double)scale * total);
    }
    return TIDE_OK;
}

tide_status tk_ce_block(const void *h, const void *w, tide_dtype wdt, const int32_t *targets, int64_t R,
                        int64_t Vb, int64_t D, int64_t vocab0, int64_t vocab, float scale, const float *stats,
                        bool dh_add, bool dw_add, float *dh, float *dw, int64_t chunk_rows, void *scratch,
                        size_t scratch_bytes, int64_t *bad, const tk_ce_prec *prec, int nt) {
    ce_work c;
    tide_status st =
        ce_work_init(&c, w, wdt, targets, vocab, R, Vb, D, chunk_rows, scratch, scratch_bytes, bad, prec, nt);
    if (st) return st;
    const bool avx = tk_have_avx2();
    for (int64_t r0 = 0; r0 < R; r0 += c.CR) {
        const int64_t cr = TIDE_MIN(c.CR, R - r0);
        const void *hc = ce_h(&c, h, r0);
        ce_logits(&c, hc, cr, nt);
        /* g = scale * (softmax - onehot) in place of the logits */
#pragma omp parallel for schedule(static) num_threads(nt) if (cr * Vb >= TK_PAR_MIN)
        for (int64_t i = 0; i < cr; i++) {
            const int64_t r = r0 + i;
            float *l = c.L + i * Vb;
            if (targets[r] < 0) {
                memset(l, 0, (size_t)Vb * sizeof(float));
                continue;
            }
            const float *sr = stats + r * 3;
            double S = (double)sr[1];
            exp_shift(l, Vb, sr[0], avx);
            float inv = (float)(1.0 / S);
            int64_t t = (int64_t)targets[r] - vocab0;
            float et = t >= 0 && t < Vb ? l[t] : 0.0f;
#pragma omp simd
            for (int64_t j = 0; j < Vb; j++) l[j] = scale * (l[j] * inv);
            if (t >= 0 && t < Vb) l[t] = (float)((double)scale * ((double)et / S - 1.0));
        }
        ce_grads(&c, hc, r0, cr, dh_add, dw_add, dh, dw, nt);
    }
    return TIDE_OK;
}

/* ------------------------------------------------------------- sumsq, adamw */

/* SUMSQ's blocks (elements summed on one thread) and groups (blocks whose
 * partial sums one parallel region produces before they are added). */
#define SS_BLOCK 8192
#define SS_GROUP 4096

float tk_sumsq(const float *g, int64_t n, float acc_in, int nt) {
    double total = acc_in;
    int64_t nblk = (n + SS_BLOCK - 1) / SS_BLOCK;
    for (int64_t b0 = 0; b0 < nblk; b0 += SS_GROUP) {
        int cnt = (int)TIDE_MIN(SS_GROUP, nblk - b0);
        double part[SS_GROUP];
#pragma omp parallel for schedule(static) num_threads(nt) if (cnt > 1)
        for (int i = 0; i < cnt; i++) {
            int64_t s0 = (b0 + i) * SS_BLOCK, s1 = TIDE_MIN(n, s0 + SS_BLOCK);
            double s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t j = s0; j < s1; j++) s += (double)g[j] * (double)g[j];
            part[i] = s;
        }
        for (int i = 0; i < cnt; i++) total += part[i];
    }
    return (float)total;
}

typedef union { float f; uint32_t u; } tk_bits;

/* Round to nearest even, NaN kept a quiet NaN: tide_f32_to_bf16, inlined. */
static inline uint16_t to_bf16(float f) {
    tk_bits b = {.f = f};
    uint32_t u = b.u;
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* One AdamW step's operands and scalars (tk_adamw). */
typedef struct adamw_k {
    float clip, decay, w1, w1m, b2, omb2, nstep, bc2s, eps;
    bool small, bf16;
    float *p32, *pf, *m, *v;
    uint16_t *p16;
    const float *grad;
} adamw_k;

/* Elements [i0, i1): torch's operations in torch's order, each rounded to
 * f32 (C17 leaves a * b + c uncontracted), so every instruction set gives
 * the same bits; TO16 rounds a value to the 16-bit parameter's dtype. */
#define ADAMW_RANGE(k, i0, i1, TO16, PF, P16)                                                                        \
    const float clip = (k)->clip, decay = (k)->decay, w1 = (k)->w1, w1m = (k)->w1m, b2 = (k)->b2;                   \
    const float omb2 = (k)->omb2, nstep = (k)->nstep, bc2s = (k)->bc2s, eps = (k)->eps;                             \
    const bool small = (k)->small;                                                                                   \
    float *restrict p32 = (k)->p32, *restrict pf = (k)->pf, *restrict m = (k)->m, *restrict v = (k)->v;            \
    uint16_t *restrict p16 = (k)->p16;                                                                               \
    const float *restrict grad = (k)->grad;                                                                          \
    _Pragma("omp simd") for (int64_t i = (i0); i < (i1); i++) {                                                     \
        float g = grad[i] * clip;                                                                                    \
        float p = p32[i] * decay;                                                                                    \
        float mi = m[i], d = g - mi;                                                                                 \
        mi = small ? fmaf(w1, d, mi) : fmaf(w1m, d, g);                                                              \
        float vi = fmaf(omb2 * g, g, v[i] * b2);                                                                     \
        float denom = sqrtf(vi) / bc2s + eps;                                                                        \
        p = p + nstep * mi / denom;                                                                                  \
        m[i] = mi;                                                                                                   \
        v[i] = vi;                                                                                                   \
        p32[i] = p;                                                                                                  \
        if (PF) pf[i] = p;                                                                                           \
        if (P16) p16[i] = TO16(p);                                                                                   \
    }

static inline uint16_t to_f16(float f) { return tide_f32_to_f16(f); }

/* The loops' three forms: a 16-bit parameter rounded from its master, an
 * f32 master copied to its f32 parameter, an f32 parameter alone. The file
 * is built without errno from the math functions (CMakeLists.txt), so sqrtf
 * is one instruction and the loop vectorises; sqrtf never sees a negative
 * value here. */
#define ADAMW_FORMS(k, i0, i1, TO16)                                                                                 \
    if ((k)->p16) {                                                                                                  \
        ADAMW_RANGE(k, i0, i1, TO16, 0, 1)                                                                           \
    } else if ((k)->pf) {                                                                                            \
        ADAMW_RANGE(k, i0, i1, TO16, 1, 0)                                                                           \
    } else {                                                                                                         \
        ADAMW_RANGE(k, i0, i1, TO16, 0, 0)                                                                           \
    }

static void adamw_range(const adamw_k *k, int64_t i0, int64_t i1) {
    if (k->bf16) {
        ADAMW_FORMS(k, i0, i1, to_bf16)
    } else {
        ADAMW_FORMS(k, i0, i1, to_f16)
    }
}

#ifdef TK_X86
/* The same with FMA and 8-wide registers (without them fmaf is a call and
 * the loop stays scalar); f16 parameters keep the portable loop. */
TK_AVX2 static void adamw_range_avx2(const adamw_k *k, int64_t i0, int64_t i1) {
    ADAMW_FORMS(k, i0, i1, to_bf16)
}
#endif

void tk_adamw(void *param, tide_dtype pdt, float *master, float *m, float *v, const float *grad, int64_t n,
              const tk_adamw_args *a, int nt) {
    /* torch.nn.utils.clip_grad_norm_: f32 norm, coefficient clamped at 1 */
    if (a->grad_scale < 0) return; /* a step that only measures its loss */
    /* the gradients times gs (a masked step's count of targets), clipped on
     * the norm of that; gs 1 is exactly the unscaled arithmetic */
    const float gs = a->grad_scale > 0 ? a->grad_scale : 1.0f;
    float clip = 1.0f;
    if (a->max_norm > 0) {
        float c = a->max_norm / (sqrtf(a->sumsq) * gs + 1e-6f);
        clip = c > 1.0f ? 1.0f : c;
    }
    clip *= gs;
    adamw_k k = {.clip = clip, .decay = (float)(1.0 - (double)a->lr * (double)a->weight_decay),
                 .w1 = (float)(1.0 - (double)a->beta1), .b2 = a->beta2, .omb2 = (float)(1.0 - (double)a->beta2),
                 .nstep = -a->step, .bc2s = a->bc2_sqrt, .eps = a->eps, .bf16 = pdt == TIDE_BF16,
                 .p32 = master ? master : param, .m = m, .v = v, .grad = grad};
    k.w1m = k.w1 - 1.0f;
    k.small = fabsf(k.w1) < 0.5f; /* torch's lerp: from the nearer end */
    k.pf = master && pdt == TIDE_F32 ? param : NULL;   /* an f32 copy of an f32 master */
    k.p16 = master && pdt != TIDE_F32 ? param : NULL;
#ifdef TK_X86
    const bool avx = tk_have_avx2() && pdt != TIDE_F16;
#endif
    int64_t nblk = (n + TK_ELEM_BLOCK - 1) / TK_ELEM_BLOCK;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TK_PAR_MIN)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t i0 = b * TK_ELEM_BLOCK, i1 = TIDE_MIN(n, i0 + TK_ELEM_BLOCK);
#ifdef TK_X86
        if (avx) {
            adamw_range_avx2(&k, i0, i1);
            continue;
        }
#endif
        adamw_range(&k, i0, i1);
    }
}
