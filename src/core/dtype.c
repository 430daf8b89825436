/*
 * dtype.c - storage dtypes and their conversion to and from f32.
 * bf16 is the top half of an f32; f16 is IEEE 754 binary16. Conversions to the
 * narrow types round to nearest, ties to even, as PyTorch does.
 */
#include "core/core.h"

#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    int block;
    size_t bytes;
} dtypes[TIDE_DTYPE_COUNT] = {
    [TIDE_F32] = {"f32", 1, 4},      [TIDE_F16] = {"f16", 1, 2},      [TIDE_BF16] = {"bf16", 1, 2},
    [TIDE_I32] = {"i32", 1, 4},      [TIDE_Q8_0] = {"q8_0", 32, 34},  [TIDE_Q4_0] = {"q4_0", 32, 18},
    [TIDE_Q4_K] = {"q4_k", 256, 144}, [TIDE_Q5_K] = {"q5_k", 256, 176}, [TIDE_Q6_K] = {"q6_k", 256, 210},
};

size_t tide_dtype_size(tide_dtype dt) {
    return (unsigned)dt < TIDE_DTYPE_COUNT && dtypes[dt].block == 1 ? dtypes[dt].bytes : 0;
}

int tide_dtype_block(tide_dtype dt) { return (unsigned)dt < TIDE_DTYPE_COUNT ? dtypes[dt].block : 0; }

size_t tide_dtype_block_bytes(tide_dtype dt) { return (unsigned)dt < TIDE_DTYPE_COUNT ? dtypes[dt].bytes : 0; }

uint64_t tide_dtype_bytes(tide_dtype dt, uint64_t n) {
    if ((unsigned)dt >= TIDE_DTYPE_COUNT || n % (uint64_t)dtypes[dt].block) return 0;
    uint64_t blocks = n / (uint64_t)dtypes[dt].block;
    if (blocks > UINT64_MAX / dtypes[dt].bytes) return 0;
    return blocks * dtypes[dt].bytes;
}

bool tide_dtype_is_quantized(tide_dtype dt) { return (unsigned)dt < TIDE_DTYPE_COUNT && dtypes[dt].block > 1; }

const char *tide_dtype_name(tide_dtype dt) {
    return (unsigned)dt < TIDE_DTYPE_COUNT ? dtypes[dt].name : "?";
}

int tide_dtype_parse(const char *s, tide_dtype *out) {
    static const struct { const char *name; tide_dtype dt; } aliases[] = {
        {"float32", TIDE_F32}, {"float16", TIDE_F16}, {"bfloat16", TIDE_BF16}, {"int32", TIDE_I32},
    };
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++)
        if (strcasecmp(s, dtypes[d].name) == 0) {
            *out = (tide_dtype)d;
            return 0;
        }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(s, aliases[i].name) == 0) {
            *out = aliases[i].dt;
            return 0;
        }
    return -1;
}

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float tide_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t tide_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float tide_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return u2f(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (man << 13));
    return u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t tide_f32_to_f16(float f) {
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;     /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;    /* overflow to inf (>= 65520) */
    if (a < 0x38800000u) {                          /* subnormal or zero in f16 */
        if (a < 0x33000000u) return sign;           /* below half the smallest subnormal */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;                   /* 14 + (113 - e) - 1 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return sign | (uint16_t)(r >> 13);
}

void tide_convert_to_f32(const void *src, tide_dtype dt, float *dst, size_t n) {
    switch (dt) {
    case TIDE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case TIDE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = u2f((uint32_t)s[i] << 16);
        break;
    }
    case TIDE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = tide_f16_to_f32(s[i]);
        break;
    }
    default:
        break;
    }
}
