/*
 * tok_map.c - the tokenizer's hash maps: strings to ids (vocabulary and added
 * tokens) and id pairs to merges, both open addressing with linear probing at
 * a load of at most one half; and the hash the word cache shares.
 */
#include "text/tok_int.h"

#include <string.h>

/* FNV-1a over 8-byte words, then a final mix: cheap for the short keys a
 * vocabulary holds, and well spread in the low bits the tables index by. */
uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xCBF29CE484222325ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001B3ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n) memcpy(&w, s, n);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int tok_smap_init(tok_smap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expect * 2 + 1);
    m->slots = tide_malloc(m->cap * sizeof *m->slots);
    if (!m->slots) return -1;
    for (size_t i = 0; i < m->cap; i++) m->slots[i].len = UINT32_MAX;
    return 0;
}

void tok_smap_free(tok_smap *m) {
    tide_free(m->slots);
    tide_free(m->keys);
    memset(m, 0, sizeof *m);
}

static int smap_grow(tok_smap *m) {
    size_t cap = m->cap * 2;
    struct tok_sslot *s = tide_malloc(cap * sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < cap; i++) s[i].len = UINT32_MAX;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].len == UINT32_MAX) continue;
        size_t j = m->slots[i].hash & (cap - 1);
        while (s[j].len != UINT32_MAX) j = (j + 1) & (cap - 1);
        s[j] = m->slots[i];
    }
    tide_free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

int tok_smap_put(tok_smap *m, const void *key, size_t len, int32_t val) {
    if (len >= UINT32_MAX) return -1;
    if ((m->n + 1) * 2 > m->cap && smap_grow(m)) return -1;
    uint64_t h = tok_hash(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].len != UINT32_MAX) {
        struct tok_sslot *e = &m->slots[j];
        if (e->hash == h && e->len == len && (!len || !memcmp(m->keys + e->off, key, len))) {
            e->val = val;
            return 0;
        }
        j = (j + 1) & (m->cap - 1);
    }
    if (m->keys_len + len > m->keys_cap) {
        size_t cap = m->keys_cap ? m->keys_cap : 4096;
        while (cap < m->keys_len + len) cap *= 2;
        char *k = tide_realloc(m->keys, cap);
        if (!k) return -1;
        m->keys = k;
        m->keys_cap = cap;
    }
    if (len) memcpy(m->keys + m->keys_len, key, len);
    m->slots[j] = (struct tok_sslot){h, (uint32_t)m->keys_len, (uint32_t)len, val};
    m->keys_len += len;
    m->n++;
    return 0;
}

int32_t tok_smap_get(const tok_smap *m, const void *key, size_t len) {
    uint64_t h = tok_hash(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].len != UINT32_MAX) {
        const struct tok_sslot *e = &m->slots[j];
        if (e->hash == h && e->len == len && (!len || !memcmp(m->keys + e->off, key, len))) return e->val;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

#define MMAP_EMPTY UINT64_MAX

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static size_t pair_slot(uint64_t k, size_t cap) {
    k *= 0x9E3779B97F4A7C15ull;
    return (size_t)(k >> 20) & (cap - 1);
}

int tok_mmap_init(tok_mmap *m, size_t expect) {
    m->n = 0;
    m->cap = pow2_at_least(expect * 2 + 1);
    m->slots = tide_malloc(m->cap * sizeof *m->slots);
    if (!m->slots) return -1;
    for (size_t i = 0; i < m->cap; i++) m->slots[i].key = MMAP_EMPTY;
    return 0;
}

void tok_mmap_free(tok_mmap *m) {
    tide_free(m->slots);
    memset(m, 0, sizeof *m);
}

int tok_mmap_put(tok_mmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap * 2;
        struct tok_mslot *s = tide_malloc(cap * sizeof *s);
        if (!s) return -1;
        for (size_t i = 0; i < cap; i++) s[i].key = MMAP_EMPTY;
        for (size_t i = 0; i < m->cap; i++) {
            if (m->slots[i].key == MMAP_EMPTY) continue;
            size_t j = pair_slot(m->slots[i].key, cap);
            while (s[j].key != MMAP_EMPTY) j = (j + 1) & (cap - 1);
            s[j] = m->slots[i];
        }
        tide_free(m->slots);
        m->slots = s;
        m->cap = cap;
    }
    uint64_t k = pair_key(a, b);
    size_t j = pair_slot(k, m->cap);
    while (m->slots[j].key != MMAP_EMPTY) {
        if (m->slots[j].key == k) { /* a repeated merge: the later one holds */
            m->slots[j].rank = rank;
            m->slots[j].id = id;
            return 1;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j] = (struct tok_mslot){k, rank, id};
    m->n++;
    return 0;
}

const struct tok_mslot *tok_mmap_get(const tok_mmap *m, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    size_t j = pair_slot(k, m->cap);
    while (m->slots[j].key != MMAP_EMPTY) {
        if (m->slots[j].key == k) return &m->slots[j];
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}
