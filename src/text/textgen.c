/*
 * textgen.c - text generation's text side (tide.h, "text generation"): a
 * prompt encoded into ids, the ids a generation stops on, and generated ids
 * turned into text as they come, cut at stop strings, handed out in pieces
 * that never split a UTF-8 character; and the loop that runs a model's
 * generation through it.
 *
 * Stop strings. After every id the text is searched for a stop string from
 * the first byte a new match could start at (the longest stop string's
 * length back from the end before the id's text was added). A match cuts the
 * text where it begins and stops the generation. Otherwise the longest
 * suffix of the text that is a proper prefix of some stop string is held
 * back and everything before it is handed out (emit). Invariants:
 *   T1. the pieces handed out, joined, are always a prefix of the final
 *       text, and equal it once tide_textgen_finish has run: nothing of a
 *       stop string is ever handed out, nor is anything after one;
 *   T2. every piece is whole UTF-8 characters: the stream decoder
 *       (tide_detok) gives only complete sequences, and stop strings are
 *       valid UTF-8 (checked by tide_textgen_new), so a held-back suffix
 *       starts on a character boundary;
 *   T3. after a failure (a bad id, memory) the text is what it was before
 *       the failing id, and the failure is kept (tide_textgen_status) until
 *       the next reset.
 *
 *   EMPTY --push--> GENERATING --push: a stop string matched--> STOPPED
 *   GENERATING --finish (held-back text and decoder tail handed out)--> DONE
 *   STOPPED --finish--> DONE          any --reset--> EMPTY
 */
#include "core/core.h"
#include "text/tok_int.h"

#include <stdlib.h>
#include <string.h>

struct tide_textgen {
    tide_ctx *ctx;
    const tide_tokenizer *tok;
    tide_detok *dt;
    char **stops;              /* (n_stops) copies, NUL-terminated */
    size_t *stop_len;
    int n_stops;
    size_t max_stop;           /* the longest stop string's length */
    void (*emit)(void *user, const char *piece, size_t len);
    void *emit_user;
    char *text;                /* (cap) the text so far, NUL-terminated at len */
    size_t len, cap;
    size_t shown;              /* text[0..shown) has been handed out */
    bool stopped, finished;
    tide_status err;           /* the first failure since the reset (T3) */
    /* tide_textgen_generate's caller's callback, called after each id */
    int (*user_on_token)(void *user, int32_t id);
    void *user;
};

tide_textgen_opts tide_textgen_opts_default(void) {
    return (tide_textgen_opts){.decode_flags = TIDE_DECODE_SKIP_SPECIAL};
}

/* Whether s[0..n) is valid UTF-8 (shortest forms, no surrogates). */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!k || i + k > n) return false;
        uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < least[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += k;
    }
    return true;
}

tide_status tide_textgen_new(tide_ctx *ctx, const tide_tokenizer *tok, const tide_textgen_opts *o,
                             tide_textgen **out) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "tide_textgen_new: NULL out");
    *out = NULL;
    tide_textgen_opts d = tide_textgen_opts_default();
    if (!o) o = &d;
    if (!tok) return tide_err(ctx, TIDE_E_INVALID, "tide_textgen_new: NULL tokenizer");
    if (o->n_stops < 0 || (o->n_stops > 0 && !o->stops))
        return tide_err(ctx, TIDE_E_INVALID, "tide_textgen_new: %d stop strings at %p", o->n_stops,
                        (const void *)o->stops);
    if (o->decode_flags & ~(unsigned)TIDE_DECODE_SKIP_SPECIAL)
        return tide_err(ctx, TIDE_E_INVALID, "tide_textgen_new: unknown decode flags 0x%x", o->decode_flags);
    for (int i = 0; i < o->n_stops; i++) {
        if (!o->stops[i] || !o->stops[i][0])
            return tide_err(ctx, TIDE_E_INVALID, "stop string %d is empty (a stop string needs at least one byte)", i);
        if (!valid_utf8((const unsigned char *)o->stops[i], strlen(o->stops[i])))
            return tide_err(ctx, TIDE_E_INVALID, "stop string %d is not valid UTF-8 (generated text always is)", i);
    }
    tide_textgen *t = tide_calloc(1, sizeof *t);
    if (!t) return tide_err(ctx, TIDE_E_NOMEM, "out of memory making a text generation");
    t->ctx = ctx;
    t->tok = tok;
    t->emit = o->emit;
    t->emit_user = o->emit_user;
    t->cap = 256;
    bool ok = (t->text = tide_malloc(t->cap)) != NULL;
    if (ok && o->n_stops) {
        ok = (t->stops = tide_calloc((size_t)o->n_stops, sizeof *t->stops)) &&
             (t->stop_len = tide_calloc((size_t)o->n_stops, sizeof *t->stop_len));
        for (int i = 0; ok && i < o->n_stops; i++, t->n_stops++) {
            ok = (t->stops[i] = tide_strdup(o->stops[i])) != NULL;
            t->stop_len[i] = strlen(o->stops[i]);
            if (t->stop_len[i] > t->max_stop) t->max_stop = t->stop_len[i];
        }
    }
    tide_status st = ok ? tide_detok_new(tok, o->decode_flags, &t->dt) : TIDE_E_NOMEM;
    if (st) {
        tide_textgen_free(t);
        return tide_err(ctx, st, "out of memory making a text generation");
    }
    t->text[0] = '\0';
    *out = t;
    return TIDE_OK;
}

void tide_textgen_free(tide_textgen *t) {
    if (!t) return;
    tide_detok_free(t->dt);
    for (int i = 0; i < t->n_stops; i++) tide_free(t->stops[i]);
    tide_free(t->stops);
    tide_free(t->stop_len);
    tide_free(t->text);
    tide_free(t);
}

void tide_textgen_set_emit(tide_textgen *t, void (*emit)(void *user, const char *piece, size_t len), void *user) {
    if (!t) return;
    t->emit = emit;
    t->emit_user = user;
}

void tide_textgen_reset(tide_textgen *t) {
    if (!t) return;
    tide_detok_reset(t->dt);
    t->len = t->shown = 0;
    t->text[0] = '\0';
    t->stopped = t->finished = false;
    t->err = TIDE_OK;
}

/* Hands text[shown..upto) out. */
static void show(tide_textgen *t, size_t upto) {
    if (upto <= t->shown) return;
    if (t->emit) t->emit(t->emit_user, t->text + t->shown, upto - t->shown);
    t->shown = upto;
}

/* Appends s[0..n), then cuts at a stop string or hands out what can no
 * longer begin one. Returns TIDE_OK or TIDE_E_NOMEM (the text unchanged). */
static tide_status add_text(tide_textgen *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap;
        while (t->len + n + 1 > cap) cap *= 2;
        char *p = tide_realloc(t->text, cap);
        if (!p) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory holding %zu bytes of generated text", t->len + n);
        t->text = p;
        t->cap = cap;
    }
    size_t from = t->len >= t->max_stop ? t->len - t->max_stop + 1 : 0;
    memcpy(t->text + t->len, s, n);
    t->len += n;
    t->text[t->len] = '\0';
    size_t cut = SIZE_MAX;
    for (int i = 0; i < t->n_stops; i++) {
        const char *hit = strstr(t->text + from, t->stops[i]);
        if (hit && (size_t)(hit - t->text) < cut) cut = (size_t)(hit - t->text);
    }
    if (cut != SIZE_MAX) {
        t->len = cut;
        t->text[cut] = '\0';
        show(t, cut);
        t->stopped = true;
        return TIDE_OK;
    }
    size_t hold = 0;
    for (int i = 0; i < t->n_stops; i++)
        for (size_t k = t->stop_len[i] - 1; k > hold; k--)
            if (k <= t->len && !memcmp(t->text + t->len - k, t->stops[i], k)) {
                hold = k;
                break;
            }
    show(t, t->len - hold);
    return TIDE_OK;
}

tide_status tide_textgen_push(tide_textgen *t, int32_t id, bool *stop) {
    if (stop) *stop = false;
    if (!t) return tide_err(NULL, TIDE_E_INVALID, "tide_textgen_push: NULL text generation");
    if (t->err) return t->err;
    if (t->stopped || t->finished) {
        if (stop) *stop = t->stopped;
        return t->finished && !t->stopped
                   ? (t->err = tide_err(t->ctx, TIDE_E_INVALID, "tide_textgen_push after tide_textgen_finish "
                                        "(reset it to start a new text)"))
                   : TIDE_OK;
    }
    const char *s;
    size_t n;
    tide_status st = tide_detok_push(t->dt, id, &s, &n);
    if (st) return t->err = tide_err(t->ctx, st, "turning generated id %d into text: %s", (int)id,
                                     tide_ctx_last_error(t->tok->ctx));
    if (n && (st = add_text(t, s, n))) return t->err = st;
    if (stop) *stop = t->stopped;
    return TIDE_OK;
}

int tide_textgen_on_token(void *user, int32_t id) {
    bool stop = false;
    return tide_textgen_push(user, id, &stop) != TIDE_OK || stop;
}

tide_status tide_textgen_finish(tide_textgen *t) {
    if (!t) return tide_err(NULL, TIDE_E_INVALID, "tide_textgen_finish: NULL text generation");
    if (t->err) return t->err;
    if (t->finished) return TIDE_OK;
    if (!t->stopped) {
        const char *s;
        size_t n;
        tide_status st = tide_detok_finish(t->dt, &s, &n);
        if (!st && n) st = add_text(t, s, n);
        if (st) return t->err = st;
    }
    show(t, t->len);
    t->finished = true;
    return TIDE_OK;
}

const char *tide_textgen_text(const tide_textgen *t, size_t *len) {
    if (len) *len = t ? t->len : 0;
    return t ? t->text : "";
}

bool tide_textgen_stopped(const tide_textgen *t) { return t && t->stopped; }

tide_status tide_textgen_status(const tide_textgen *t) { return t ? t->err : TIDE_E_INVALID; }

/* tide_gen_opts.on_token of tide_textgen_generate: the text, then the
 * caller's own callback. */
static int generate_on_token(void *user, int32_t id) {
    tide_textgen *t = user;
    if (tide_textgen_on_token(t, id)) return 1;
    return t->user_on_token ? t->user_on_token(t->user, id) : 0;
}

tide_status tide_textgen_generate(tide_textgen *t, tide_model *m, const int32_t *prompt, int n_prompt,
                                  int max_new, const tide_gen_opts *g, int32_t *out_tokens, int *n_out,
                                  tide_gen_stats *stats) {
    if (n_out) *n_out = 0;
    if (!t || !m) return tide_err(t ? t->ctx : NULL, TIDE_E_INVALID, "tide_textgen_generate: NULL %s",
                                  t ? "model" : "text generation");
    tide_textgen_reset(t);
    tide_gen_opts go = g ? *g : (tide_gen_opts){0};
    t->user_on_token = go.on_token;
    t->user = go.user;
    go.on_token = generate_on_token;
    go.user = t;
    tide_status st = tide_model_generate_ex(m, prompt, n_prompt, max_new, &go, out_tokens, n_out, stats);
    t->user_on_token = NULL;
    t->user = NULL;
    if (st) return st;
    if (t->err) return tide_err(t->ctx, t->err, "decoding the generated tokens: %s", tide_ctx_last_error(t->ctx));
    return tide_textgen_finish(t);
}

/* ------------------------------------------------------------ prompts and stops */

tide_status tide_sampler_start(tide_sampler *s, uint64_t seed, const int32_t *prompt, int n_prompt) {
    if (!s) return tide_err(NULL, TIDE_E_INVALID, "tide_sampler_start: NULL sampler");
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return tide_err(NULL, TIDE_E_INVALID, "tide_sampler_start: a prompt of %d ids at %p", n_prompt,
                        (const void *)prompt);
    tide_sampler_reset(s, seed);
    for (int i = 0; i < n_prompt; i++) {
        tide_status st = tide_sampler_accept(s, prompt[i]);
        if (st) return st;
    }
    return TIDE_OK;
}

int tide_tokenizer_stop_ids(const tide_tokenizer *tok, const tide_chat_template *c, int32_t *ids, int cap) {
    if (!tok) return 0;
    const int32_t *eos = NULL;
    int ne = tide_tokenizer_eos_ids(tok, &eos), n = 0;
    for (int i = 0; i < ne; i++, n++)
        if (ids && n < cap) ids[n] = eos[i];
    int32_t eot = c ? tide_tokenizer_find(tok, tide_chat_template_end_of_turn(c)) : -1;
    bool have = eot < 0;
    for (int i = 0; i < ne && !have; i++) have = eos[i] == eot;
    if (!have) {
        if (ids && n < cap) ids[n] = eot;
        n++;
    }
    return n;
}

tide_status tide_tokenizer_encode_prompt(tide_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                         int32_t **ids, int *n_ids) {
    tide_ctx *ctx = tok ? tok->ctx : NULL;
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!tok || !ids || !n_ids || (!text && len))
        return tide_err(ctx, TIDE_E_INVALID, "tide_tokenizer_encode_prompt: NULL argument");
    size_t cnt = 0;
    tide_status st = len ? tide_tokenizer_encode(tok, text, len, flags, NULL, 0, &cnt) : TIDE_OK;
    if (st) return tide_err(ctx, st, "cannot encode the prompt: %s", tide_ctx_last_error(ctx));
    if (cnt == 0 || len == 0) return tide_err(ctx, TIDE_E_INVALID, "the prompt is empty");
    if (cnt > INT32_MAX / 2) return tide_err(ctx, TIDE_E_RANGE, "the prompt is too long (%zu tokens)", cnt);
    int32_t *v = tide_malloc(cnt * sizeof *v);
    if (!v) return tide_err(ctx, TIDE_E_NOMEM, "out of memory encoding the prompt (%zu tokens)", cnt);
    if ((st = tide_tokenizer_encode(tok, text, len, flags, v, cnt, &cnt))) {
        tide_free(v);
        return tide_err(ctx, st, "cannot encode the prompt: %s", tide_ctx_last_error(ctx));
    }
    *ids = v;
    *n_ids = (int)cnt;
    return TIDE_OK;
}

void tide_free_ids(int32_t *ids) { tide_free(ids); }
