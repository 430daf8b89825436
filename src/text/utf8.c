/*
 * utf8.c - UTF-8 sequences as the Unicode standard bounds them (Table 3-7),
 * with the "maximal subpart" rule for ill-formed input: each maximal subpart
 * becomes one U+FFFD, as Python's errors="replace" and Rust's
 * from_utf8_lossy do.
 */
#include "text/tok_int.h"

#include <string.h>

int tok_utf8_next(const uint8_t *s, size_t n, size_t *maximal, bool *incomplete) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF; /* bounds of the second byte */
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c == 0xE0) need = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) need = 3;
    else if (c == 0xED) need = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) need = 3;
    else if (c == 0xF0) need = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 4;
    else if (c == 0xF4) need = 4, hi = 0x8F;
    else {
        *maximal = 1;
        *incomplete = false;
        return 0;
    }
    int k = 1;
    while (k < need) {
        if ((size_t)k >= n) {
            *maximal = (size_t)k;
            *incomplete = true;
            return 0;
        }
        uint8_t b = s[k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *maximal = (size_t)k;
            *incomplete = false;
            return 0;
        }
        k++;
    }
    return need;
}

bool tok_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0, m;
    bool inc;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int l = tok_utf8_next(s + i, n - i, &m, &inc);
        if (!l) return false;
        i += (size_t)l;
    }
    return true;
}

int tok_utf8_put(uint32_t c, uint8_t *o) {
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | c >> 6);
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12);
        o[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18);
    o[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

uint32_t tok_utf8_decode(const uint8_t *s, int len) {
    switch (len) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    default:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
               (s[3] & 0x3F);
    }
}

/* GPT-2's table: printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand
 * for themselves; the other 68, in byte order, for U+0100 onwards. */
static bool byte_is_self(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t tok_byte_char(uint8_t b) {
    if (byte_is_self(b)) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 33 + (b - 0x7F);
    return 0x100 + 67; /* 0xAD */
}

int tok_char_byte(uint32_t c) {
    if (c < 0x100) return byte_is_self(c) ? (int)c : -1;
    uint32_t k = c - 0x100;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(0x7F + k - 33);
    return k == 67 ? 0xAD : -1;
}

/* The bytes a byte-level vocabulary entry spells, into out (room for strlen(s));
 * returns their count, or -1 when a character is not in the byte table. */
long tok_bytelevel_bytes(const char *s, uint8_t *out) {
    const uint8_t *p = (const uint8_t *)s;
    size_t n = strlen(s), i = 0, m;
    long k = 0;
    bool inc;
    while (i < n) {
        int l = tok_utf8_next(p + i, n - i, &m, &inc);
        if (!l) return -1;
        int b = tok_char_byte(tok_utf8_decode(p + i, l));
        if (b < 0) return -1;
        out[k++] = (uint8_t)b;
        i += (size_t)l;
    }
    return k;
}
