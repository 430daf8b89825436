/*
 * test_textgen.c - text generation's text side (tide.h, "text generation";
 * src/text/textgen.c), through the public header only, on the built-in
 * model's tokenizer (data/tokenizer: byte-level BPE, 4092 pieces, chatml).
 *
 * What is checked:
 *   - stop strings: one that begins inside one token and ends inside a later
 *     one stops the text where it begins, on the id that completes it, and
 *     nothing of it is ever handed out; the ids after it add nothing; a
 *     prefix of a stop string that never completes is held back and handed
 *     out by tide_textgen_finish; the earliest of several matches wins;
 *   - UTF-8: a character whose bytes come in several tokens is handed out
 *     whole, never half (every piece is valid UTF-8), also as a stop
 *     string; an unfinished character at the end becomes U+FFFD;
 *   - after every id the pieces handed out, joined, are a prefix of the
 *     final text, and equal it after finish; they equal
 *     tide_tokenizer_decode of the same ids without stop strings;
 *   - a chat prompt built from messages (tide_chat_format, then
 *     tide_tokenizer_encode_prompt) is the chatml text byte for byte, whose
 *     ids are those of tide_tokenizer_encode; the stop ids are the EOS ids
 *     and the template's end of turn; tide_sampler_start is reset + accept;
 *   - errors: empty or invalid UTF-8 stop strings, NULL arguments, unknown
 *     flags (TIDE_E_INVALID with a message); an id out of range
 *     (TIDE_E_RANGE, the text unchanged, the failure kept until the reset);
 *     an empty prompt; failed allocations (TIDE_E_NOMEM, nothing leaked).
 */
#include "tide.h"
#include "core/alloc_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static tide_ctx *ctx;
static tide_tokenizer *tok;

static int setup(void **state) {
    (void)state;
    ctx = tide_ctx_new();
    if (!ctx) return -1;
    if (tide_tokenizer_open(ctx, TIDE_DATA_PATH "/tokenizer", &tok)) {
        fprintf(stderr, "the built-in tokenizer: %s\n", tide_ctx_last_error(ctx));
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tide_tokenizer_free(tok);
    tide_ctx_free(ctx);
    return 0;
}

/* ------------------------------------------------------------ helpers */

static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return false;
        i += k;
    }
    return true;
}

/* What an emit callback receives: the pieces joined, and whether each was
 * whole UTF-8. */
typedef struct sink {
    char buf[4096];
    size_t len;
    int pieces;
    bool all_valid;
} sink;

static void on_piece(void *user, const char *piece, size_t n) {
    sink *k = user;
    assert_true(n > 0);
    assert_true(k->len + n < sizeof k->buf);
    memcpy(k->buf + k->len, piece, n);
    k->len += n;
    k->buf[k->len] = '\0';
    k->pieces++;
    if (!valid_utf8((const unsigned char *)piece, n)) k->all_valid = false;
}

static int encode(const char *text, int32_t *ids, int cap) {
    size_t n = 0;
    assert_int_equal(tide_tokenizer_encode(tok, text, strlen(text), 0, ids, (size_t)cap, &n), TIDE_OK);
    assert_true(n <= (size_t)cap);
    return (int)n;
}

static tide_textgen *make(const char *const *stops, int n_stops, sink *k) {
    tide_textgen_opts o = tide_textgen_opts_default();
    o.stops = stops;
    o.n_stops = n_stops;
    o.emit = on_piece;
    o.emit_user = k;
    memset(k, 0, sizeof *k);
    k->all_valid = true;
    tide_textgen *tg = NULL;
    if (tide_textgen_new(ctx, tok, &o, &tg)) fail_msg("tide_textgen_new: %s", tide_ctx_last_error(ctx));
    return tg;
}

/* Byte offsets where each id's text ends when ids[0..n) are decoded one by
 * one (ends[i] after ids[0..i]). */
static void token_ends(const int32_t *ids, int n, size_t *ends) {
    tide_detok *d;
    assert_int_equal(tide_detok_new(tok, TIDE_DECODE_SKIP_SPECIAL, &d), TIDE_OK);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const char *s;
        size_t len;
        assert_int_equal(tide_detok_push(d, ids[i], &s, &len), TIDE_OK);
        at += len;
        ends[i] = at;
    }
    tide_detok_free(d);
}

/* Pushes ids one by one, checking after each that what was handed out is a
 * prefix of `final` (the expected whole text). Returns the index of the id
 * that stopped the text, or n. */
static int push_all(tide_textgen *tg, const sink *k, const int32_t *ids, int n, const char *final) {
    int stopped_at = n;
    for (int i = 0; i < n; i++) {
        bool stop = false;
        assert_int_equal(tide_textgen_push(tg, ids[i], &stop), TIDE_OK);
        assert_true(k->len <= strlen(final));
        assert_memory_equal(k->buf, final, k->len);
        if (stop && stopped_at == n) stopped_at = i;
        if (stopped_at < n) assert_true(stop); /* stays stopped */
    }
    return stopped_at;
}

/* ------------------------------------------------------------ stop strings */

static void test_stop_across_tokens(void **state) {
    (void)state;
    const char *text = "the quick brown fox jumps over the lazy dog";
    int32_t ids[64];
    int n = encode(text, ids, 64);
    size_t ends[64];
    token_ends(ids, n, ends);
    assert_int_equal(ends[n - 1], strlen(text));
    /* a boundary between two tokens of at least 2 bytes each, and a stop
     * string of the byte before it and the byte after: it begins inside one
     * token and ends inside the next (its first occurrence in the text) */
    int b = 1;
    char stop[8];
    for (; b < n - 1; b++) {
        if (ends[b] - ends[b - 1] < 2 || ends[b + 1] - ends[b] < 2) continue;
        memcpy(stop, text + ends[b] - 1, 2);
        stop[2] = '\0';
        if (strstr(text, stop) == text + ends[b] - 1) break;
    }
    assert_true(b < n - 1);
    const char *stops[] = {"zzqq", stop};
    sink k;
    tide_textgen *tg = make(stops, 2, &k);
    char want[128];
    size_t cut = ends[b] - 1;
    memcpy(want, text, cut);
    want[cut] = '\0';
    int at = push_all(tg, &k, ids, n, want);
    /* the id that completes it stops the text, cut where the stop begins */
    assert_int_equal(at, b + 1);
    assert_true(tide_textgen_stopped(tg));
    size_t len = 0;
    assert_string_equal(tide_textgen_text(tg, &len), want);
    assert_int_equal(len, cut);
    assert_int_equal(tide_textgen_finish(tg), TIDE_OK);
    assert_int_equal(k.len, cut);
    assert_string_equal(k.buf, want);
    assert_null(strstr(k.buf, stop));
    /* a new text after the reset: without a stop, the whole of it */
    tide_textgen_reset(tg);
    assert_false(tide_textgen_stopped(tg));
    assert_string_equal(tide_textgen_text(tg, NULL), "");
    tide_textgen_free(tg);

    /* a prefix of a stop string at the end, never completed: held back while
     * it might complete, handed out by finish */
    char tail_stop[64];
    snprintf(tail_stop, sizeof tail_stop, "%sXYZ", text + ends[n - 2]); /* the last token's text + XYZ */
    const char *stops2[] = {tail_stop};
    tg = make(stops2, 1, &k);
    assert_int_equal(push_all(tg, &k, ids, n, text), n);
    assert_int_equal(k.len, ends[n - 2]); /* the last token's text held back */
    assert_int_equal(tide_textgen_finish(tg), TIDE_OK);
    assert_string_equal(k.buf, text);
    assert_string_equal(tide_textgen_text(tg, NULL), text);
    assert_false(tide_textgen_stopped(tg));
    tide_textgen_free(tg);

    /* several stop strings: the earliest match in the text wins, whichever
     * completes first */
    const char *stops3[] = {"lazy", "fox"};
    tg = make(stops3, 2, &k);
    push_all(tg, &k, ids, n, "the quick brown ");
    assert_string_equal(tide_textgen_text(tg, NULL), "the quick brown ");
    tide_textgen_free(tg);
}

/* The pieces joined equal tide_tokenizer_decode of the same ids, text after
 * text, with no stop strings. */
static void test_pieces_join_to_decode(void **state) {
    (void)state;
    const char *texts[] = {"Hello, world! 1234 tokens\n  spaced\tout", "caf\xc3\xa9 \xe2\x82\xac\xf0\x9f\x99\x82 na\xc3\xafve",
                           "<|im_start|>user\nhi<|im_end|>"};
    sink k;
    tide_textgen *tg = make(NULL, 0, &k);
    for (int t = 0; t < 3; t++) {
        int32_t ids[128];
        size_t n = 0;
        assert_int_equal(tide_tokenizer_encode(tok, texts[t], strlen(texts[t]), 0, ids, 128, &n), TIDE_OK);
        char dec[512];
        size_t dl = 0;
        assert_int_equal(tide_tokenizer_decode(tok, ids, n, TIDE_DECODE_SKIP_SPECIAL, dec, sizeof dec, &dl), TIDE_OK);
        tide_textgen_reset(tg);
        memset(&k, 0, sizeof k);
        k.all_valid = true;
        for (size_t i = 0; i < n; i++) assert_int_equal(tide_textgen_on_token(tg, ids[i]), 0);
        assert_int_equal(tide_textgen_finish(tg), TIDE_OK);
        assert_int_equal(k.len, dl);
        assert_memory_equal(k.buf, dec, dl);
        assert_string_equal(tide_textgen_text(tg, NULL), dec);
        assert_true(k.all_valid);
        assert_int_equal(tide_textgen_status(tg), TIDE_OK);
    }
    /* special tokens give no text (the third text is the markers' and "user\nhi") */
    assert_string_equal(tide_textgen_text(tg, NULL), "user\nhi");
    tide_textgen_free(tg);
}

/* ------------------------------------------------------------ UTF-8 */

/* A character whose UTF-8 bytes the tokenizer splits over several ids: its
 * ids in ids (n of them, > 1). */
static const char *split_char(int32_t *ids, int *n) {
    static const char *const cands[] = {"\xf0\x9d\x84\x9e", "\xf0\x9f\x99\x82", "\xe2\x82\xac", "\xe6\xbc\xa2",
                                        "\xc3\xa9"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        *n = encode(cands[i], ids, 16);
        if (*n > 1) return cands[i];
    }
    fail_msg("no candidate character is split over several ids by this tokenizer");
    return NULL;
}

static void test_utf8_never_half(void **state) {
    (void)state;
    int32_t cids[16];
    int nc = 0;
    const char *c = split_char(cids, &nc);
    size_t cl = strlen(c);
    /* "a" C "b" C, built from ids (so that C comes split whatever a merge
     * of its neighbours would do) */
    int32_t a = -1, bb = -1, ids[40];
    int32_t t[4];
    assert_int_equal(encode("a", t, 4), 1);
    a = t[0];
    assert_int_equal(encode("b", t, 4), 1);
    bb = t[0];
    int n = 0;
    ids[n++] = a;
    for (int i = 0; i < nc; i++) ids[n++] = cids[i];
    ids[n++] = bb;
    for (int i = 0; i < nc; i++) ids[n++] = cids[i];
    char whole[32];
    snprintf(whole, sizeof whole, "a%sb%s", c, c);
    sink k;
    tide_textgen *tg = make(NULL, 0, &k);
    for (int i = 0; i < n; i++) {
        assert_int_equal(tide_textgen_push(tg, ids[i], NULL), TIDE_OK);
        /* between the ids of C, nothing of it has been handed out */
        if (i >= 1 && i < nc) assert_int_equal(k.len, 1);
    }
    assert_int_equal(tide_textgen_finish(tg), TIDE_OK);
    assert_string_equal(k.buf, whole);
    assert_true(k.all_valid);
    tide_textgen_free(tg);

    /* C as a stop string: cut before its first byte, never half of it out */
    const char *stops[] = {c};
    tg = make(stops, 1, &k);
    int at = push_all(tg, &k, ids, n, "a");
    assert_int_equal(at, nc); /* the id completing C */
    assert_string_equal(tide_textgen_text(tg, NULL), "a");
    assert_int_equal(tide_textgen_finish(tg), TIDE_OK);
    assert_string_equal(k.buf, "a");
    tide_textgen_free(tg);

    /* "b" + C as a stop string, C's bytes also the first ones in the text:
     * the first C is handed out whole once it cannot begin the stop */
    char bc[16];
    snprintf(bc, sizeof bc, "b%s", c);
    const char *stops2[] = {bc};
    tg = make(stops2, 1, &k);
    char want[16];
    snprintf(want, sizeof want, "a%s", c);
    push_all(tg, &k, ids, n, want);
    assert_string_equal(tide_textgen_text(tg, NULL), want);
    assert_true(tide_textgen_stopped(tg));
    assert_true(k.all_valid);
    tide_textgen_free(tg);

    /* a character left unfinished at the end: U+FFFD, handed out by finish */
    tg = make(NULL, 0, &k);
    assert_int_equal(tide_textgen_push(tg, a, NULL), TIDE_OK);
    assert_int_equal(tide_textgen_push(tg, cids[0], NULL), TIDE_OK);
    assert_string_equal(k.buf, "a");
    assert_int_equal(tide_textgen_finish(tg), TIDE_OK);
    assert_string_equal(k.buf, "a\xef\xbf\xbd");
    assert_true(k.all_valid);
    (void)cl;
    tide_textgen_free(tg);
}

/* ------------------------------------------------------------ prompts */

static void test_chat_prompt(void **state) {
    (void)state;
    tide_chat_template *c = NULL;
    assert_int_equal(tide_chat_template_get(ctx, tok, NULL, &c), TIDE_OK);
    assert_string_equal(tide_chat_template_name(c), "chatml");
    tide_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hello"}, {"assistant", "Hi."}, {"user", "Why?"}};
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(tide_chat_format(ctx, c, msgs, 4, true, &text, &len), TIDE_OK);
    const char *want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                       "<|im_start|>assistant\nHi.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
                       "<|im_start|>assistant\n";
    assert_string_equal(text, want);
    int32_t *ids = NULL;
    int n = 0;
    assert_int_equal(tide_tokenizer_encode_prompt(tok, text, len, 0, &ids, &n), TIDE_OK);
    int32_t ref[256];
    size_t nr = 0;
    assert_int_equal(tide_tokenizer_encode(tok, text, len, 0, ref, 256, &nr), TIDE_OK);
    assert_int_equal(n, (int)nr);
    assert_memory_equal(ids, ref, nr * sizeof *ref);
    int32_t im_start = tide_tokenizer_find(tok, "<|im_start|>"), im_end = tide_tokenizer_find(tok, "<|im_end|>");
    assert_true(im_start >= 0 && im_end >= 0);
    assert_int_equal(ids[0], im_start);
    int markers = 0;
    for (int i = 0; i < n; i++) markers += ids[i] == im_start || ids[i] == im_end;
    assert_int_equal(markers, 9); /* each a special token, none spelt out */
    tide_free_ids(ids);
    tide_free_text(text);

    /* the stop ids: EOS ids, then the end of turn */
    const int32_t *eos = NULL;
    int ne = tide_tokenizer_eos_ids(tok, &eos);
    assert_true(ne >= 1);
    int32_t st[16];
    assert_int_equal(tide_tokenizer_stop_ids(tok, NULL, st, 16), ne);
    assert_memory_equal(st, eos, (size_t)ne * sizeof *eos);
    int ns = tide_tokenizer_stop_ids(tok, c, st, 16);
    bool in_eos = false;
    for (int i = 0; i < ne; i++) in_eos |= eos[i] == im_end;
    assert_int_equal(ns, in_eos ? ne : ne + 1);
    assert_memory_equal(st, eos, (size_t)ne * sizeof *eos);
    if (!in_eos) assert_int_equal(st[ne], im_end);
    assert_int_equal(tide_tokenizer_stop_ids(tok, c, NULL, 0), ns);
    int32_t one[1] = {-7};
    assert_int_equal(tide_tokenizer_stop_ids(tok, c, one, 1), ns);
    assert_int_equal(one[0], eos[0]);
    tide_chat_template_free(c);
}

static void test_sampler_start(void **state) {
    (void)state;
    tide_sampler_opts so = {.repetition_penalty = 1.7, .presence_penalty = 0.5};
    int32_t nv = tide_tokenizer_n_vocab(tok);
    tide_sampler *a = NULL, *b = NULL;
    assert_int_equal(tide_sampler_new(ctx, &so, nv, &a), TIDE_OK);
    assert_int_equal(tide_sampler_new(ctx, &so, nv, &b), TIDE_OK);
    int32_t prompt[] = {5, 9, 9, 100, 7};
    assert_int_equal(tide_sampler_accept(a, 33), TIDE_OK); /* forgotten by the start */
    assert_int_equal(tide_sampler_start(a, 11, prompt, 5), TIDE_OK);
    tide_sampler_reset(b, 11);
    for (int i = 0; i < 5; i++) assert_int_equal(tide_sampler_accept(b, prompt[i]), TIDE_OK);
    float *logits = malloc((size_t)nv * sizeof *logits);
    double *pa = malloc((size_t)nv * sizeof *pa), *pb = malloc((size_t)nv * sizeof *pb);
    assert_non_null(logits);
    for (int32_t i = 0; i < nv; i++) logits[i] = (float)((i * 37) % 101) / 10.0f;
    logits[33] = 50; /* the most likely, unpenalised once 33 is forgotten */
    assert_int_equal(tide_sampler_probs(a, logits, pa), TIDE_OK);
    assert_int_equal(tide_sampler_probs(b, logits, pb), TIDE_OK);
    assert_memory_equal(pa, pb, (size_t)nv * sizeof *pa);
    assert_true(pa[33] == 1.0);
    int32_t bad[] = {1, nv};
    assert_int_equal(tide_sampler_start(a, 1, bad, 2), TIDE_E_RANGE);
    assert_int_equal(tide_sampler_start(a, 1, NULL, 2), TIDE_E_INVALID);
    assert_int_equal(tide_sampler_start(NULL, 1, prompt, 1), TIDE_E_INVALID);
    free(logits);
    free(pa);
    free(pb);
    tide_sampler_free(a);
    tide_sampler_free(b);
}

/* ------------------------------------------------------------ errors */

static void test_errors(void **state) {
    (void)state;
    tide_textgen *tg = (tide_textgen *)1;
    const char *empty[] = {""};
    tide_textgen_opts o = tide_textgen_opts_default();
    o.stops = empty;
    o.n_stops = 1;
    assert_int_equal(tide_textgen_new(ctx, tok, &o, &tg), TIDE_E_INVALID);
    assert_null(tg);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "empty"));
    const char *bad_utf8[] = {"ok", "\xe2\x82"};
    o.stops = bad_utf8;
    o.n_stops = 2;
    assert_int_equal(tide_textgen_new(ctx, tok, &o, &tg), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "stop string 1 is not valid UTF-8"));
    o.stops = NULL;
    assert_int_equal(tide_textgen_new(ctx, tok, &o, &tg), TIDE_E_INVALID);
    o.n_stops = -1;
    assert_int_equal(tide_textgen_new(ctx, tok, &o, &tg), TIDE_E_INVALID);
    o = tide_textgen_opts_default();
    o.decode_flags = 0x80;
    assert_int_equal(tide_textgen_new(ctx, tok, &o, &tg), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "flags"));
    assert_int_equal(tide_textgen_new(ctx, NULL, NULL, &tg), TIDE_E_INVALID);
    assert_int_equal(tide_textgen_new(ctx, tok, NULL, NULL), TIDE_E_INVALID);

    /* an id out of range: the text unchanged, the failure kept until the reset */
    sink k;
    tg = make(NULL, 0, &k);
    int32_t ids[8];
    int n = encode("Hello", ids, 8);
    for (int i = 0; i < n; i++) assert_int_equal(tide_textgen_push(tg, ids[i], NULL), TIDE_OK);
    size_t before = 0;
    tide_textgen_text(tg, &before);
    assert_int_equal(tide_textgen_push(tg, tide_tokenizer_n_vocab(tok) + 5, NULL), TIDE_E_RANGE);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "turning generated id"));
    assert_int_equal(tide_textgen_status(tg), TIDE_E_RANGE);
    assert_int_equal(tide_textgen_on_token(tg, ids[0]), 1);
    assert_int_equal(tide_textgen_finish(tg), TIDE_E_RANGE);
    size_t after = 0;
    tide_textgen_text(tg, &after);
    assert_int_equal(after, before);
    tide_textgen_reset(tg);
    assert_int_equal(tide_textgen_status(tg), TIDE_OK);
    assert_int_equal(tide_textgen_push(tg, ids[0], NULL), TIDE_OK);
    assert_int_equal(tide_textgen_finish(tg), TIDE_OK);
    assert_int_equal(tide_textgen_finish(tg), TIDE_OK); /* once is enough */
    assert_int_equal(tide_textgen_push(tg, ids[0], NULL), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "after tide_textgen_finish"));
    assert_int_equal(tide_textgen_generate(tg, NULL, ids, n, 4, NULL, ids, NULL, NULL), TIDE_E_INVALID);
    tide_textgen_free(tg);
    tide_textgen_free(NULL);
    assert_int_equal(tide_textgen_push(NULL, 1, NULL), TIDE_E_INVALID);
    assert_false(tide_textgen_stopped(NULL));

    /* prompts */
    int32_t *p = (int32_t *)1;
    int np = 7;
    assert_int_equal(tide_tokenizer_encode_prompt(tok, "", 0, 0, &p, &np), TIDE_E_INVALID);
    assert_null(p);
    assert_int_equal(np, 0);
    assert_string_equal(tide_ctx_last_error(ctx), "the prompt is empty");
    assert_int_equal(tide_tokenizer_encode_prompt(tok, "x", 1, 0x40, &p, &np), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "cannot encode the prompt"));
    assert_int_equal(tide_tokenizer_encode_prompt(NULL, "x", 1, 0, &p, &np), TIDE_E_INVALID);
    assert_int_equal(tide_tokenizer_encode_prompt(tok, NULL, 3, 0, &p, &np), TIDE_E_INVALID);
    assert_int_equal(tide_tokenizer_stop_ids(NULL, NULL, NULL, 0), 0);
}

/* Every allocation of making a text generation and of running it, failed in
 * turn: TIDE_E_NOMEM and nothing leaked. */
static void test_alloc_failures(void **state) {
    (void)state;
    const char *stops[] = {"brown", "dog"};
    int32_t ids[512];
    const char *text = "the quick brown fox jumps over the lazy dog, and again and again and again and again"
                       " and again, the text longer than 256 bytes so that it grows: the quick brown fox jumps over"
                       " the lazy dog, the quick brown fox jumps over the lazy dog, the quick brown fox jumps over"
                       " the lazy dog";
    size_t nn = 0;
    assert_int_equal(tide_tokenizer_encode(tok, text, strlen(text), 0, NULL, 0, &nn), TIDE_OK);
    assert_true(nn <= 512);
    tide_tokenizer_encode(tok, text, strlen(text), 0, ids, 512, &nn);
    int hits = 0;
    for (long k = 1; k < 200; k++) {
        int64_t base = tide_alloc_live_bytes();
        long before = tide_alloc_count();
        tide_alloc_fail_nth(k);
        tide_textgen_opts o = tide_textgen_opts_default();
        o.stops = stops + 1; /* "dog": the text runs long before it */
        o.n_stops = 1;
        tide_textgen *tg = NULL;
        tide_status st = tide_textgen_new(ctx, tok, &o, &tg);
        for (size_t i = 0; !st && i < nn; i++) st = tide_textgen_push(tg, ids[i], NULL);
        int32_t *p = NULL;
        int np = 0;
        tide_status st2 = tide_tokenizer_encode_prompt(tok, text, strlen(text), 0, &p, &np);
        bool hit = tide_alloc_count() - before >= k;
        tide_alloc_fail_nth(0);
        if (!hit) {
            assert_int_equal(st, TIDE_OK);
            tide_textgen_free(tg);
            tide_free_ids(p);
            break;
        }
        hits++;
        assert_true(st == TIDE_E_NOMEM || st2 == TIDE_E_NOMEM);
        if (st) assert_int_equal(st, TIDE_E_NOMEM);
        tide_textgen_free(tg);
        tide_free_ids(p);
        assert_int_equal(tide_alloc_live_bytes(), base);
    }
    assert_true(hits >= 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_across_tokens), cmocka_unit_test(test_pieces_join_to_decode),
        cmocka_unit_test(test_utf8_never_half),    cmocka_unit_test(test_chat_prompt),
        cmocka_unit_test(test_sampler_start),      cmocka_unit_test(test_errors),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
