/*
 * quant_ref.h - the tests' own reading of the block-quantized types
 * (src/core/quant_blocks.h): random blocks with finite scales, and each
 * element's f32 value in ggml's order of operations, every product and
 * difference rounded on its own (volatile stores keep a compiler from
 * fusing them, whatever its contraction setting):
 *   Q8_0, Q4_0: d * q;  Q4_K, Q5_K: (d * sc) * q - dmin * m;  Q6_K: (d * sc) * q.
 * Written from the layout comments of quant_blocks.h, element by element
 * (not by the 8-element units of the CUDA decoder); the tests that use it
 * also hold it to the library's reference (tide_dequantize_row,
 * src/core/quant.h), bit for bit, on the blocks they make. Header-only, C
 * and C++.
 */
#ifndef TIDE_TESTS_QUANT_REF_H
#define TIDE_TESTS_QUANT_REF_H

#include "tide.h"
#ifdef __cplusplus
extern "C" {
#endif
#include "core/core.h" /* tide_f16_to_f32 */
#include "core/quant.h"
#ifdef __cplusplus
}
#endif
#if defined(__cplusplus) && !defined(_Static_assert)
#define _Static_assert static_assert /* quant_blocks.h is C */
#endif
#include "core/quant_blocks.h"

#include <stdint.h>
#include <string.h>

/* Fills n bytes (whole blocks of dt) with random quants and scales: every
 * f16 scale finite, of magnitude in [2^-9, 2^-5) with a random sign (dmin
 * positive, as a quantizer writes it). */
static inline void qref_fill(tide_dtype dt, void *dst, uint64_t n, uint64_t (*rnd)(void)) {
    uint8_t *b = (uint8_t *)dst;
    for (uint64_t i = 0; i < n; i++) b[i] = (uint8_t)rnd();
    uint64_t bb = tide_dtype_block_bytes(dt);
    for (uint64_t o = 0; o + bb <= n; o += bb) {
        uint8_t *blk = b + o;
        /* exponent 6..9 of 15 (2^-9 .. 2^-6, times 1.mantissa), random mantissa and sign */
        uint16_t h1 = (uint16_t)((rnd() & 0x83ffu) | ((6u + rnd() % 4u) << 10));
        uint16_t h2 = (uint16_t)((rnd() & 0x03ffu) | ((6u + rnd() % 4u) << 10));
        switch (dt) {
        case TIDE_Q8_0:
        case TIDE_Q4_0: memcpy(blk, &h1, 2); break;
        case TIDE_Q4_K:
        case TIDE_Q5_K:
            memcpy(blk, &h1, 2);
            memcpy(blk + 2, &h2, 2);
            break;
        case TIDE_Q6_K: memcpy(blk + 208, &h1, 2); break;
        default: break;
        }
    }
}

static inline float qref_mul(float a, float b) {
    volatile float p = a * b;
    return p;
}
static inline float qref_sub(float a, float b) {
    volatile float p = a - b;
    return p;
}

static inline float qref_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return tide_f16_to_f32(h);
}

/* Element j (< the block's size) of one block of dt. */
static inline float qref_elem(tide_dtype dt, const uint8_t *blk, int j) {
    switch (dt) {
    case TIDE_Q8_0: return qref_mul((float)(int8_t)blk[2 + j], qref_half(blk));
    case TIDE_Q4_0: {
        int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
        return qref_mul((float)(q - 8), qref_half(blk));
    }
    case TIDE_Q4_K:
    case TIDE_Q5_K: {
        int g = j / 64, l = j % 64 % 32, hi = j % 64 >= 32, sub = 2 * g + hi;
        uint8_t sc, m;
        tide_q4k_scale_min(sub, blk + 4, &sc, &m);
        const uint8_t *qs = blk + (dt == TIDE_Q4_K ? 16 : 48);
        int q = hi ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 15;
        if (dt == TIDE_Q5_K && (blk[16 + l] >> sub & 1)) q += 16;
        float d1 = qref_mul(qref_half(blk), (float)sc), m1 = qref_mul(qref_half(blk + 2), (float)m);
        return qref_sub(qref_mul(d1, (float)q), m1);
    }
    case TIDE_Q6_K: {
        int h = j / 128, l = j % 128 % 32, k = j % 128 / 32;
        const uint8_t *ql = blk, *qh = blk + 128;
        int lo = ql[64 * h + l + (k % 2) * 32];
        lo = k >= 2 ? lo >> 4 : lo & 15;
        int q = (lo | ((qh[32 * h + l] >> (2 * k) & 3) << 4)) - 32;
        int sc = (int8_t)blk[192 + 8 * h + l / 16 + 2 * k];
        return qref_mul(qref_mul(qref_half(blk + 208), (float)sc), (float)q);
    }
    default: return 0.0f;
    }
}

/* The n elements (whole blocks) of a row of dt, as f32; returns the number
 * of them whose bits differ from tide_dequantize_row's (0, or n when it
 * refuses the row). */
static inline int64_t qref_dequant_row(tide_dtype dt, const void *row, int64_t n, float *out) {
    const uint8_t *b = (const uint8_t *)row;
    int64_t qk = (int64_t)tide_dtype_block(dt), bb = (int64_t)tide_dtype_block_bytes(dt), bad = 0;
    for (int64_t i = 0; i < n; i++) out[i] = qref_elem(dt, b + i / qk * bb, (int)(i % qk));
    for (int64_t i0 = 0; i0 < n; i0 += qk) {
        float lib[256];
        if (tide_dequantize_row(dt, b + i0 / qk * bb, lib, qk)) return n;
        for (int64_t i = 0; i < qk; i++) bad += memcmp(&lib[i], &out[i0 + i], sizeof(float)) != 0;
    }
    return bad;
}

#endif
