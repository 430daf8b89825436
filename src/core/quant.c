/*
 * quant.c - reference dequantizers and quantizers of the block types
 * (src/core/quant.h says what each computes). Compiled with
 * -ffp-contract=off (CMakeLists.txt) so that no product and sum is fused:
 * every operation rounds to f32 as written, as in ggml's C reference and in
 * numpy.
 */
#include "core/quant.h"

#include "core/core.h"
#include "core/quant_blocks.h"

#include <math.h>
#include <string.h>

/* Round to nearest, ties to even (ggml's nearest_int for |v| < 2^22, where
 * adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits).
 * Larger magnitudes are clamped and NaN gives 0, so that the result is always
 * defined; the callers clamp it further to their ranges. */
static inline int round_even(float v) {
    if (!(v == v)) return 0;
    if (v > 4194303.f) v = 4194303.f;
    if (v < -4194303.f) v = -4194303.f;
    float t = v + 12582912.f;
    int32_t bits;
    memcpy(&bits, &t, sizeof bits);
    return (int)(bits & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

bool tide_quant_all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

/* ---------------------------------------------------------------- dequantization */

static void dequant_q8_0(const tide_block_q8_0 *b, float *y) {
    float d = tide_f16_to_f32(b->d);
    for (int i = 0; i < TIDE_QK8_0; i++) y[i] = (float)b->qs[i] * d;
}

static void dequant_q4_0(const tide_block_q4_0 *b, float *y) {
    float d = tide_f16_to_f32(b->d);
    for (int i = 0; i < TIDE_QK4_0 / 2; i++) {
        y[i] = (float)((b->qs[i] & 15) - 8) * d;
        y[i + TIDE_QK4_0 / 2] = (float)((b->qs[i] >> 4) - 8) * d;
    }
}

/* Q4_K and Q5_K: qh NULL for Q4_K. */
static void dequant_qk_min(uint16_t d16, uint16_t dmin16, const uint8_t *scales, const uint8_t *qs,
                           const uint8_t *qh, float *y) {
    float d = tide_f16_to_f32(d16), dmin = tide_f16_to_f32(dmin16);
    for (int g = 0; g < 4; g++) {
        for (int half = 0; half < 2; half++) {
            int j = 2 * g + half;
            uint8_t sc, m;
            tide_q4k_scale_min(j, scales, &sc, &m);
            float ds = d * (float)sc, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q = half ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 15;
                if (qh && (qh[l] >> j & 1)) q += 16;
                y[32 * j + l] = ds * (float)q - dm;
            }
        }
    }
}

static void dequant_q6_k(const tide_block_q6_k *b, float *y) {
    float d = tide_f16_to_f32(b->d);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            int q[4] = {
                (ql[l] & 15) | ((qh[l] >> 0 & 3) << 4),
                (ql[l + 32] & 15) | ((qh[l] >> 2 & 3) << 4),
                (ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4),
                (ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4),
            };
            for (int k = 0; k < 4; k++) {
                float ds = d * (float)b->scales[8 * h + l / 16 + 2 * k];
                y[128 * h + l + 32 * k] = ds * (float)(q[k] - 32);
            }
        }
    }
}

int tide_dequantize_row(tide_dtype dt, const void *src, float *dst, int64_t n) {
    if (n < 0) return -1;
    switch (dt) {
    case TIDE_F32:
    case TIDE_F16:
    case TIDE_BF16:
        tide_convert_to_f32(src, dt, dst, (size_t)n);
        return 0;
    case TIDE_Q8_0:
    case TIDE_Q4_0:
    case TIDE_Q4_K:
    case TIDE_Q5_K:
    case TIDE_Q6_K:
        break;
    default:
        return -1;
    }
    int qk = tide_dtype_block(dt);
    if (n % qk) return -1;
    const uint8_t *p = src;
    size_t bb = tide_dtype_block_bytes(dt);
    for (int64_t i = 0; i < n / qk; i++, p += bb) {
        float *y = dst + i * qk;
        switch (dt) {
        case TIDE_Q8_0: {
            tide_block_q8_0 b;
            memcpy(&b, p, sizeof b);
            dequant_q8_0(&b, y);
            break;
        }
        case TIDE_Q4_0: {
            tide_block_q4_0 b;
            memcpy(&b, p, sizeof b);
            dequant_q4_0(&b, y);
            break;
        }
        case TIDE_Q4_K: {
            tide_block_q4_k b;
            memcpy(&b, p, sizeof b);
            dequant_qk_min(b.d, b.dmin, b.scales, b.qs, NULL, y);
            break;
        }
        case TIDE_Q5_K: {
            tide_block_q5_k b;
            memcpy(&b, p, sizeof b);
            dequant_qk_min(b.d, b.dmin, b.scales, b.qs, b.qh, y);
            break;
        }
        default: {
            tide_block_q6_k b;
            memcpy(&b, p, sizeof b);
            dequant_q6_k(&b, y);
            break;
        }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- quantization */

static void quant_q8_0(const float *x, tide_block_q8_0 *b) {
    float amax = 0.f;
    for (int i = 0; i < TIDE_QK8_0; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.f;
    float id = d != 0.f ? 1.f / d : 0.f;
    b->d = tide_f32_to_f16(d);
    for (int i = 0; i < TIDE_QK8_0; i++) {
        float r = roundf(x[i] * id);
        if (!(r == r)) r = 0.f;
        b->qs[i] = (int8_t)fmaxf(-127.f, fminf(127.f, r));
    }
}

static void quant_q4_0(const float *x, tide_block_q4_0 *b) {
    float amax = 0.f, m = 0.f;
    for (int i = 0; i < TIDE_QK4_0; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            m = x[i];
        }
    }
    float d = m / -8.f;
    float id = d != 0.f ? 1.f / d : 0.f;
    b->d = tide_f32_to_f16(d);
    uint8_t q[TIDE_QK4_0];
    for (int i = 0; i < TIDE_QK4_0; i++) {
        float t = x[i] * id + 8.5f; /* >= 0.5 for finite x: truncation is floor */
        if (!(t >= 0.f)) t = 0.f;
        q[i] = (uint8_t)(t >= 15.f ? 15 : (int)t);
    }
    for (int i = 0; i < TIDE_QK4_0 / 2; i++) b->qs[i] = (uint8_t)(q[i] | q[i + TIDE_QK4_0 / 2] << 4);
}

/* The sub-block fit of Q4_K and Q5_K: x[0..n) ~ scale * L + lo with
 * L in 0..nmax and lo <= 0, weights w. Starts from the grid spanning
 * [min(x, 0), max(x)], then tries nstep + 1 step counts
 * (nmax + rmin + rdelta * k steps over the span): each gives levels L,
 * whose weighted least-squares scale and offset (offset clamped to <= 0) are
 * kept when their weighted squared error is lower. Returns the scale; *neg_lo
 * = -lo. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_lo,
                           float rmin, float rdelta, int nstep) {
    float lo = x[0], hi = x[0];
    float sw = w[0], swx = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        swx += w[i] * x[i];
    }
    if (lo > 0.f) lo = 0.f;
    if (!(hi > lo)) {
        memset(L, 0, (size_t)n);
        *neg_lo = -lo;
        return 0.f;
    }
    float inv = (float)nmax / (hi - lo);
    float scale = 1.f / inv;
    float best = 0.f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(round_even(inv * (x[i] - lo)), 0, nmax);
        float e = scale * (float)L[i] + lo - x[i];
        best += w[i] * (e * e);
    }
    uint8_t trial[32];
    for (int k = 0; k <= nstep; k++) {
        inv = (rmin + rdelta * (float)k + (float)nmax) / (hi - lo);
        float sl = 0.f, sl2 = 0.f, sxl = 0.f;
        for (int i = 0; i < n; i++) {
            int l = clampi(round_even(inv * (x[i] - lo)), 0, nmax);
            trial[i] = (uint8_t)l;
            float wl = w[i] * (float)l;
            sl += wl;
            sl2 += wl * (float)l;
            sxl += wl * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0.f)) continue;
        float s = (sw * sxl - swx * sl) / det;
        float o = (sl2 * swx - sl * sxl) / det;
        if (o > 0.f) {
            o = 0.f;
            s = sxl / sl2;
        }
        float err = 0.f;
        for (int i = 0; i < n; i++) {
            float e = s * (float)trial[i] + o - x[i];
            err += w[i] * (e * e);
        }
        if (err < best) {
            memcpy(L, trial, (size_t)n);
            best = err;
            scale = s;
            lo = o;
        }
    }
    *neg_lo = -lo;
    return scale;
}

/* Q4_K (nmax 15, qh NULL) and Q5_K (nmax 31). */
static void quant_qk_min(const float *x, int nmax, uint16_t *d16, uint16_t *dmin16, uint8_t *scales, uint8_t *qs,
                         uint8_t *qh) {
    uint8_t L[TIDE_QK_K];
    float sc[8], mn[8], w[32];
    float max_sc = 0.f, max_mn = 0.f;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float s2 = 0.f;
        for (int l = 0; l < 32; l++) s2 += xs[l] * xs[l];
        float av = sqrtf(s2 / 32.f);
        for (int l = 0; l < 32; l++) w[l] = av + fabsf(xs[l]);
        sc[j] = nmax == 15 ? fit_scale_min(32, 15, xs, w, L + 32 * j, &mn[j], -1.f, 0.1f, 20)
                           : fit_scale_min(32, 31, xs, w, L + 32 * j, &mn[j], -0.5f, 0.1f, 15);
        if (sc[j] > max_sc) max_sc = sc[j];
        if (mn[j] > max_mn) max_mn = mn[j];
    }
    float isc = max_sc > 0.f ? 63.f / max_sc : 0.f;
    float imn = max_mn > 0.f ? 63.f / max_mn : 0.f;
    memset(scales, 0, TIDE_K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        /* a negative fit (possible when the least squares slope is < 0) wraps
         * as ggml's uint8_t conversion does, then is capped at 63 */
        int ls = (uint8_t)round_even(isc * sc[j]), lm = (uint8_t)round_even(imn * mn[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            scales[j] = (uint8_t)ls;
            scales[j + 4] = (uint8_t)lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d16 = tide_f32_to_f16(max_sc / 63.f);
    *dmin16 = tide_f32_to_f16(max_mn / 63.f);
    float d = tide_f16_to_f32(*d16), dmin = tide_f16_to_f32(*dmin16);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        tide_q4k_scale_min(j, scales, &s, &m);
        float ds = d * (float)s;
        if (ds == 0.f) continue;
        float dm = dmin * (float)m;
        for (int l = 0; l < 32; l++) L[32 * j + l] = (uint8_t)clampi(round_even((x[32 * j + l] + dm) / ds), 0, nmax);
    }
    if (qh) memset(qh, 0, TIDE_QK_K / 8);
    for (int g = 0; g < 4; g++) {
        for (int l = 0; l < 32; l++) {
            int a = L[64 * g + l], b = L[64 * g + 32 + l];
            if (qh) {
                if (a > 15) qh[l] |= (uint8_t)(1u << (2 * g));
                if (b > 15) qh[l] |= (uint8_t)(2u << (2 * g));
            }
            qs[32 * g + l] = (uint8_t)((a & 15) | (b & 15) << 4);
        }
    }
}

/* The sub-block fit of Q6_K: x[0..16) ~ scale * (L - 32), L in 0..63,
 * weights x^2. Starts from the grid on which the largest-magnitude element m
 * is -32 steps, then tries 18 more step counts (32 + k / 10, k = -9..9 but
 * 0); each trial's least-squares scale is kept when it explains more of the
 * weighted sum of squares. Returns the scale (its sign that of the grid). */
static float fit_scale_sym(const float *x, int8_t *L) {
    const int n = 16, nmax = 32;
    float amax = 0.f, m = 0.f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            m = x[i];
        }
    }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float inv = -(float)nmax / m;
    float slx = 0.f, sl2 = 0.f;
    for (int i = 0; i < n; i++) {
        int l = clampi(round_even(inv * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        slx += w * x[i] * (float)l;
        sl2 += w * (float)l * (float)l;
    }
    float scale = sl2 != 0.f ? slx / sl2 : 0.f;
    float best = scale * slx;
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        inv = -((float)nmax + 0.1f * (float)k) / m;
        slx = sl2 = 0.f;
        for (int i = 0; i < n; i++) {
            int l = clampi(round_even(inv * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            slx += w * x[i] * (float)l;
            sl2 += w * (float)l * (float)l;
        }
        if (sl2 > 0.f && slx * slx > best * sl2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(clampi(round_even(inv * x[i]), -nmax, nmax - 1) + nmax);
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    return scale;
}

static void quant_q6_k(const float *x, tide_block_q6_k *b) {
    int8_t L[TIDE_QK_K];
    float sc[16];
    float max_abs = 0.f, max_sc = 0.f;
    for (int j = 0; j < 16; j++) {
        sc[j] = fit_scale_sym(x + 16 * j, L + 16 * j);
        if (fabsf(sc[j]) > max_abs) {
            max_abs = fabsf(sc[j]);
            max_sc = sc[j];
        }
    }
    memset(b, 0, sizeof *b);
    if (max_abs < 1e-15f) return; /* d = +0 */
    float isc = -128.f / max_sc;
    b->d = tide_f32_to_f16(1.f / isc);
    for (int j = 0; j < 16; j++) {
        int s = round_even(isc * sc[j]);
        b->scales[j] = (int8_t)clampi(s, -128, 127);
    }
    float d = tide_f16_to_f32(b->d);
    for (int j = 0; j < 16; j++) {
        float ds = d * (float)b->scales[j];
        if (ds == 0.f) continue;
        for (int l = 0; l < 16; l++) L[16 * j + l] = (int8_t)(clampi(round_even(x[16 * j + l] / ds), -32, 31) + 32);
    }
    for (int h = 0; h < 2; h++) {
        const int8_t *Lh = L + 128 * h;
        uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            int q0 = Lh[l], q1 = Lh[l + 32], q2 = Lh[l + 64], q3 = Lh[l + 96];
            ql[l] = (uint8_t)((q0 & 15) | (q2 & 15) << 4);
            ql[l + 32] = (uint8_t)((q1 & 15) | (q3 & 15) << 4);
            qh[l] = (uint8_t)((q0 >> 4) | (q1 >> 4) << 2 | (q2 >> 4) << 4 | (q3 >> 4) << 6);
        }
    }
}

int tide_quantize_row(tide_dtype dt, const float *src, void *dst, int64_t n) {
    if (n < 0) return -1;
    switch (dt) {
    case TIDE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    case TIDE_F16:
    case TIDE_BF16: {
        uint8_t *p = dst;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = dt == TIDE_F16 ? tide_f32_to_f16(src[i]) : tide_f32_to_bf16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return 0;
    }
    case TIDE_Q8_0:
    case TIDE_Q4_0:
    case TIDE_Q4_K:
    case TIDE_Q5_K:
    case TIDE_Q6_K:
        break;
    default:
        return -1;
    }
    int qk = tide_dtype_block(dt);
    if (n % qk) return -1;
    uint8_t *p = dst;
    size_t bb = tide_dtype_block_bytes(dt);
    for (int64_t i = 0; i < n / qk; i++, p += bb) {
        const float *x = src + i * qk;
        switch (dt) {
        case TIDE_Q8_0: {
            tide_block_q8_0 b;
            quant_q8_0(x, &b);
            memcpy(p, &b, sizeof b);
            break;
        }
        case TIDE_Q4_0: {
            tide_block_q4_0 b;
            quant_q4_0(x, &b);
            memcpy(p, &b, sizeof b);
            break;
        }
        case TIDE_Q4_K: {
            tide_block_q4_k b;
            quant_qk_min(x, 15, &b.d, &b.dmin, b.scales, b.qs, NULL);
            memcpy(p, &b, sizeof b);
            break;
        }
        case TIDE_Q5_K: {
            tide_block_q5_k b;
            quant_qk_min(x, 31, &b.d, &b.dmin, b.scales, b.qs, b.qh);
            memcpy(p, &b, sizeof b);
            break;
        }
        default: {
            tide_block_q6_k b;
            quant_q6_k(x, &b);
            memcpy(p, &b, sizeof b);
            break;
        }
        }
    }
    return 0;
}
