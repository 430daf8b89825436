/*
 * quant_blocks.h - the block layouts of the quantized weight types
 * (TIDE_Q8_0, TIDE_Q4_0, TIDE_Q4_K, TIDE_Q5_K, TIDE_Q6_K), byte for byte those
 * of ggml's GGUF files, so that a file's tensor data is used where it lies.
 * Every scale is IEEE binary16 (tide_f16_to_f32). A row of n elements is
 * n / QK blocks laid end to end; element j of a row is in block j / QK.
 *
 * Q8_0 (32 elements): x[i] = d * qs[i].
 * Q4_0 (32): x[i] = d * ((qs[i] & 15) - 8), x[i + 16] = d * ((qs[i] >> 4) - 8),
 *   i < 16.
 * Q4_K (256, 8 sub-blocks of 32): scales holds eight 6-bit scales sc[j] and
 *   eight 6-bit mins m[j] (tide_q4k_scale_min gives the packing); the 256
 *   elements are 4 groups of 64, group g using qs[32g .. 32g+31]: its first 32
 *   the low nibbles (sub-block 2g), its last 32 the high nibbles (sub-block
 *   2g+1); x = d * sc[j] * q - dmin * m[j].
 * Q5_K (256): as Q4_K, and bit (2g) of qh[l] is the fifth bit of the low
 *   nibble element l of group g, bit (2g+1) of the high one; q in 0..31.
 * Q6_K (256, 16 sub-blocks of 16): two halves of 128; in half h, for l < 32,
 *   q0 = (ql[64h + l] & 15) | ((qh[32h + l] >> 0 & 3) << 4),
 *   q1 = (ql[64h + l + 32] & 15) | ((qh[32h + l] >> 2 & 3) << 4),
 *   q2 = (ql[64h + l] >> 4) | ((qh[32h + l] >> 4 & 3) << 4),
 *   q3 = (ql[64h + l + 32] >> 4) | ((qh[32h + l] >> 6 & 3) << 4),
 *   and x[128h + l + 32k] = d * scales[8h + l/16 + 2k] * (qk - 32).
 */
#ifndef TIDE_QUANT_BLOCKS_H
#define TIDE_QUANT_BLOCKS_H

#include <stdint.h>

#define TIDE_QK8_0 32
#define TIDE_QK4_0 32
#define TIDE_QK_K 256
#define TIDE_K_SCALE_SIZE 12

typedef struct tide_block_q8_0 {
    uint16_t d;
    int8_t qs[TIDE_QK8_0];
} tide_block_q8_0;

typedef struct tide_block_q4_0 {
    uint16_t d;
    uint8_t qs[TIDE_QK4_0 / 2];
} tide_block_q4_0;

typedef struct tide_block_q4_k {
    uint16_t d, dmin;
    uint8_t scales[TIDE_K_SCALE_SIZE];
    uint8_t qs[TIDE_QK_K / 2];
} tide_block_q4_k;

typedef struct tide_block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[TIDE_K_SCALE_SIZE];
    uint8_t qh[TIDE_QK_K / 8];
    uint8_t qs[TIDE_QK_K / 2];
} tide_block_q5_k;

typedef struct tide_block_q6_k {
    uint8_t ql[TIDE_QK_K / 2];
    uint8_t qh[TIDE_QK_K / 4];
    int8_t scales[TIDE_QK_K / 16];
    uint16_t d;
} tide_block_q6_k;

_Static_assert(sizeof(tide_block_q8_0) == 34, "Q8_0 block");
_Static_assert(sizeof(tide_block_q4_0) == 18, "Q4_0 block");
_Static_assert(sizeof(tide_block_q4_k) == 144, "Q4_K block");
_Static_assert(sizeof(tide_block_q5_k) == 176, "Q5_K block");
_Static_assert(sizeof(tide_block_q6_k) == 210, "Q6_K block");

/* Sub-block j's (j < 8) 6-bit scale and min of a Q4_K / Q5_K block: j < 4
 * in the low 6 bits of bytes j and j + 4; above, the low nibbles of byte
 * j + 4 and the top 2 bits of bytes j - 4 (scale) and j (min). */
static inline void tide_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

#endif
