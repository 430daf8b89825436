/*
 * tok_decode.c - ids to text: whole (tide_tokenizer_decode) and streaming
 * (tide_detok), one implementation, so a stream prints exactly what a decode
 * of the same ids returns.
 *
 * Each token's piece goes through the decoder's per-token steps, in
 * tokenizer.json's order, to bytes:
 *   Replace       every occurrence of a string by another
 *   ByteFallback  "<0xNN>" -> the byte NN
 *   ByteLevel     a piece spelled in GPT-2's byte table -> its bytes (a piece
 *                 with a character outside the table stays as it is)
 *   Metaspace     the marker -> ' ', or nothing in the stream's first token
 *                 (prepend_scheme first/always)
 *   Fuse          nothing: tokens are concatenated anyway
 *   (no decoder)  pieces joined by single spaces, as `tokenizers` does
 * The bytes of all tokens form one sequence, turned into UTF-8 text as it
 * grows: a complete character is printed at once, a valid prefix of one waits
 * for its next byte, and each maximal invalid subpart becomes U+FFFD. Strip
 * (after Fuse) then drops up to `start` leading copies of its character from
 * the text as a whole.
 *
 * States of a stream: EMPTY (index 0) --push--> STREAMING (index > 0, maybe
 * bytes of an unfinished character pending) --finish/reset--> EMPTY.
 */
#include "text/tok_int.h"

#include <string.h>

struct tide_detok {
    const tide_tokenizer *t;
    unsigned flags;
    size_t index;          /* tokens decoded so far (skipped ones not counted) */
    uint8_t pend[4];       /* bytes of an unfinished character */
    size_t n_pend;
    int strip_left;        /* leading Strip characters still to drop */
    char strip[8];         /* the Strip character ("" when none) */
    char *out;             /* text of the current call */
    size_t n_out, cap_out;
    uint8_t *buf[2];       /* token bytes, ping-pong */
    size_t cap_buf[2];
};

static int reserve(uint8_t **b, size_t *cap, size_t n) {
    if (n <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < n) c *= 2;
    uint8_t *p = tide_realloc(*b, c);
    if (!p) return -1;
    *b = p;
    *cap = c;
    return 0;
}

static int out_put(tide_detok *d, const void *s, size_t n) {
    if (reserve((uint8_t **)&d->out, &d->cap_out, d->n_out + n + 1)) return -1;
    memcpy(d->out + d->n_out, s, n);
    d->n_out += n;
    d->out[d->n_out] = 0;
    return 0;
}

static void stream_reset(tide_detok *d) {
    d->index = 0;
    d->n_pend = 0;
    d->strip_left = 0;
    d->strip[0] = 0;
    for (int i = 0; i < d->t->n_dec; i++)
        if (d->t->dec[i].kind == TOK_DEC_STRIP) {
            d->strip_left = d->t->dec[i].strip_start;
            memcpy(d->strip, d->t->dec[i].strip, sizeof d->strip);
        }
}

tide_status tide_detok_new(const tide_tokenizer *t, unsigned flags, tide_detok **out) {
    if (!t || !out) return tide_err(t ? t->ctx : NULL, TIDE_E_INVALID, "tide_detok_new: NULL argument");
    tide_detok *d = tide_calloc(1, sizeof *d);
    if (!d) return tide_err(t->ctx, TIDE_E_NOMEM, "tokenizer: out of memory");
    d->t = t;
    d->flags = flags;
    stream_reset(d);
    if (out_put(d, "", 0)) {
        tide_detok_free(d);
        return tide_err(t->ctx, TIDE_E_NOMEM, "tokenizer: out of memory");
    }
    *out = d;
    return TIDE_OK;
}

void tide_detok_free(tide_detok *d) {
    if (!d) return;
    tide_free(d->out);
    tide_free(d->buf[0]);
    tide_free(d->buf[1]);
    tide_free(d);
}

void tide_detok_reset(tide_detok *d) {
    stream_reset(d);
    d->n_out = 0;
    d->out[0] = 0;
}

static int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Replaces every occurrence of from by to in src[0..n) into d->buf[dst]. */
static long replace_all(tide_detok *d, int dst, const uint8_t *src, size_t n, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to);
    if (reserve(&d->buf[dst], &d->cap_buf[dst], n / fl * tl + n + 1)) return -1;
    uint8_t *o = d->buf[dst];
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (i + fl <= n && !memcmp(src + i, from, fl)) {
            memcpy(o + k, to, tl);
            k += tl;
            i += fl;
        } else {
            o[k++] = src[i++];
        }
    }
    return (long)k;
}

/* The bytes token id decodes to, at position index of the stream. */
static tide_status token_bytes(tide_detok *d, int32_t id, const uint8_t **bytes, size_t *len) {
    const tide_tokenizer *t = d->t;
    const uint8_t *s = (const uint8_t *)t->pieces[id];
    size_t n = t->piece_len[id];
    if (t->dec_join_space) {
        if (reserve(&d->buf[0], &d->cap_buf[0], n + 2)) goto oom;
        size_t k = 0;
        if (d->index) d->buf[0][k++] = ' ';
        memcpy(d->buf[0] + k, s, n);
        *bytes = d->buf[0];
        *len = n + k;
        return TIDE_OK;
    }
    for (int i = 0; i < t->n_dec; i++) {
        const tok_dec *dc = &t->dec[i];
        int dst = s == d->buf[0] ? 1 : 0;
        long k;
        switch (dc->kind) {
        case TOK_DEC_REPLACE:
            if ((k = replace_all(d, dst, s, n, dc->from, dc->to)) < 0) goto oom;
            s = d->buf[dst];
            n = (size_t)k;
            break;
        case TOK_DEC_METASPACE:
            if ((k = replace_all(d, dst, s, n, dc->rep,
                                 d->index == 0 && dc->scheme != TOK_PREPEND_NEVER ? "" : " ")) < 0)
                goto oom;
            s = d->buf[dst];
            n = (size_t)k;
            break;
        case TOK_DEC_BYTEFALLBACK:
            if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' && hexval(s[3]) >= 0 &&
                hexval(s[4]) >= 0) {
                if (reserve(&d->buf[dst], &d->cap_buf[dst], 1)) goto oom;
                d->buf[dst][0] = (uint8_t)(hexval(s[3]) * 16 + hexval(s[4]));
                s = d->buf[dst];
                n = 1;
            }
            break;
        case TOK_DEC_BYTELEVEL: {
            if (reserve(&d->buf[dst], &d->cap_buf[dst], n + 1)) goto oom;
            uint8_t *o = d->buf[dst];
            size_t j = 0, kk = 0, m;
            bool inc, all = true;
            while (j < n) {
                int l = tok_utf8_next(s + j, n - j, &m, &inc);
                int b = l ? tok_char_byte(tok_utf8_decode(s + j, l)) : -1;
                if (b < 0) {
                    all = false;
                    break;
                }
                o[kk++] = (uint8_t)b;
                j += (size_t)l;
            }
            if (all) {
                s = o;
                n = kk;
            }
            break;
        }
        case TOK_DEC_FUSE:
        case TOK_DEC_STRIP: break;
        }
    }
    *bytes = s;
    *len = n;
    return TIDE_OK;
oom:
    return tide_err(t->ctx, TIDE_E_NOMEM, "tokenizer: out of memory");
}

/* Appends one character of text to the output, through Strip. */
static int put_char(tide_detok *d, const uint8_t *c, size_t l) {
    if (d->strip_left > 0) {
        if (strlen(d->strip) == l && !memcmp(d->strip, c, l)) {
            d->strip_left--;
            return 0;
        }
        d->strip_left = 0;
    }
    return out_put(d, c, l);
}

static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};

/* Feeds bytes through the UTF-8 assembler. */
static int feed_bytes(tide_detok *d, const uint8_t *s, size_t n) {
    size_t i = 0, m;
    bool inc;
    while (d->n_pend && i < n) { /* complete the pending character first */
        uint8_t tmp[4];
        memcpy(tmp, d->pend, d->n_pend);
        size_t k = d->n_pend;
        tmp[k++] = s[i];
        int l = tok_utf8_next(tmp, k, &m, &inc);
        if (l) {
            if (put_char(d, tmp, (size_t)l)) return -1;
            d->n_pend = 0;
            i++;
        } else if (inc) {
            memcpy(d->pend, tmp, k);
            d->n_pend = k;
            i++;
        } else {
            /* the pending bytes are a maximal subpart on their own (m == n_pend):
             * s[i] starts afresh */
            if (put_char(d, fffd, 3)) return -1;
            d->n_pend = 0;
        }
    }
    while (i < n) {
        if (s[i] < 0x80) {
            if (put_char(d, s + i, 1)) return -1;
            i++;
            continue;
        }
        int l = tok_utf8_next(s + i, n - i, &m, &inc);
        if (l) {
            if (put_char(d, s + i, (size_t)l)) return -1;
            i += (size_t)l;
        } else if (inc) {
            memcpy(d->pend, s + i, n - i);
            d->n_pend = n - i;
            i = n;
        } else {
            if (put_char(d, fffd, 3)) return -1;
            i += m;
        }
    }
    return 0;
}

/* Appends id's text to d->out. */
static tide_status detok_feed(tide_detok *d, int32_t id) {
    const tide_tokenizer *t = d->t;
    if (id < 0 || id >= t->n_vocab || !t->pieces[id])
        return tide_err(t->ctx, TIDE_E_RANGE, "token id %d is not in the vocabulary (%d ids)", (int)id,
                        (int)t->n_vocab);
    if ((d->flags & TIDE_DECODE_SKIP_SPECIAL) && (t->flags[id] & TOK_F_SPECIAL)) return TIDE_OK;
    const uint8_t *b = NULL;
    size_t n = 0;
    tide_status st = token_bytes(d, id, &b, &n);
    if (st) return st;
    d->index++;
    if (feed_bytes(d, b, n)) return tide_err(t->ctx, TIDE_E_NOMEM, "tokenizer: out of memory");
    return TIDE_OK;
}

static tide_status detok_end(tide_detok *d) {
    if (d->n_pend) {
        d->n_pend = 0;
        if (put_char(d, fffd, 3)) return tide_err(d->t->ctx, TIDE_E_NOMEM, "tokenizer: out of memory");
    }
    stream_reset(d);
    return TIDE_OK;
}

tide_status tide_detok_push(tide_detok *d, int32_t id, const char **text, size_t *len) {
    d->n_out = 0;
    d->out[0] = 0;
    tide_status st = detok_feed(d, id);
    if (st) d->n_out = 0; /* the pieces of one token are put only when it decodes */
    d->out[d->n_out] = 0;
    if (text) *text = d->out;
    if (len) *len = d->n_out;
    return st;
}

tide_status tide_detok_finish(tide_detok *d, const char **text, size_t *len) {
    d->n_out = 0;
    d->out[0] = 0;
    tide_status st = detok_end(d);
    if (text) *text = d->out;
    if (len) *len = d->n_out;
    return st;
}

tide_status tide_tokenizer_decode(const tide_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char *buf,
                                  size_t cap, size_t *len) {
    if (!t || (!ids && n) || !len || (!buf && cap))
        return tide_err(t ? t->ctx : NULL, TIDE_E_INVALID, "tide_tokenizer_decode: NULL argument");
    tide_detok *d;
    tide_status st = tide_detok_new(t, flags, &d);
    if (st) return st;
    d->n_out = 0;
    for (size_t i = 0; i < n && !st; i++) st = detok_feed(d, ids[i]);
    if (!st) st = detok_end(d);
    if (!st) {
        *len = d->n_out;
        if (cap) {
            size_t k = TIDE_MIN(cap - 1, d->n_out);
            memcpy(buf, d->out, k);
            buf[k] = 0;
        }
    }
    tide_detok_free(d);
    return st;
}
