/*
 * test_tok_gguf.c - tokenizers and chat templates read from GGUF metadata.
 *
 * $TIDE_FIXTURES/gguf-tok (made by scripts/make_gguf_tok_fixtures.py) holds,
 * for each tokenizer of text/ and chat/, a tokenizer-only GGUF file (the
 * vocabulary extracted as llama.cpp's converter does) and what Hugging Face
 * `tokenizers` computes with the tokenizer its keys describe. Through the
 * public API (tide_tokenizer_open on the .gguf path) this test checks:
 *   - for every string of text/cases.json: the ids (special tokens recognised,
 *     read as text, with BOS), the decoding with and without special tokens,
 *     a stream fed one id at a time; mixed.txt's ids (count and FNV-1a hash);
 *   - that those ids are the source fixture's own (tokenizer.json's) ids on
 *     every case the script did not record as differing, and that the
 *     recorded differences are the ones GGUF cannot express (bpe-gpt2's
 *     lstrip token, sp-metaspace's prepend scheme "first");
 *   - BOS, EOS, EOT, special flags and pieces from the keys;
 *   - the chat template from tokenizer.chat_template: detected as its family,
 *     every case renders exactly as transformers does (chat/<family>), and
 *     the render's ids equal the recorded ones;
 *   - malformed metadata (an in-memory description, tok_gguf.h, and GGUF
 *     files written here) fails naming the key; failed allocations are
 *     TIDE_E_NOMEM with nothing leaked.
 * TIDE_FIXTURES unset is a failure, not a skip: the fixtures are committed.
 */
#include "tide.h"
#include "core/alloc_test.h"
#include "text/tok_gguf.h"

#include <cjson/cJSON.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static char fix_dir[2048];

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

static cJSON *load_json(const char *fmt, const char *a, const char *b) {
    char path[4200];
    snprintf(path, sizeof path, fmt, fix_dir, a, b);
    char *s = slurp(path, NULL);
    if (!s) fail_msg("cannot read %s", path);
    cJSON *j = cJSON_Parse(s);
    free(s);
    if (!j) fail_msg("cannot parse %s", path);
    return j;
}

/* A string field: key, or key_hex / hex (the bytes in hex). */
static char *field_bytes(const cJSON *c, const char *key, size_t *len) {
    char hk[64];
    snprintf(hk, sizeof hk, "%s_hex", key);
    const cJSON *t = cJSON_GetObjectItem(c, key), *h = cJSON_GetObjectItem(c, hk);
    if (!t && !h) h = cJSON_GetObjectItem(c, "hex");
    if (!cJSON_IsString(t) && !cJSON_IsString(h)) fail_msg("no field %s", key);
    if (cJSON_IsString(t)) {
        *len = strlen(t->valuestring);
        return strdup(t->valuestring);
    }
    size_t n = strlen(h->valuestring) / 2;
    char *b = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h->valuestring + 2 * i, "%2x", &v);
        b[i] = (char)v;
    }
    b[n] = 0;
    *len = n;
    return b;
}

static int32_t *encode(tide_tokenizer *t, const char *s, size_t len, unsigned flags, size_t *n) {
    assert_int_equal(tide_tokenizer_encode(t, s, len, flags, NULL, 0, n), TIDE_OK);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    size_t again;
    assert_int_equal(tide_tokenizer_encode(t, s, len, flags, ids, *n, &again), TIDE_OK);
    assert_int_equal(again, *n);
    return ids;
}

static char *decode(tide_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, size_t *len) {
    assert_int_equal(tide_tokenizer_decode(t, ids, n, flags, NULL, 0, len), TIDE_OK);
    char *b = malloc(*len + 1);
    size_t again;
    assert_int_equal(tide_tokenizer_decode(t, ids, n, flags, b, *len + 1, &again), TIDE_OK);
    assert_int_equal(again, *len);
    return b;
}

/* got equals the JSON list want; returns false (and says where) if not. */
static bool ids_match(const int32_t *got, size_t ng, const cJSON *want, char *why, size_t wl) {
    size_t nw = (size_t)cJSON_GetArraySize(want), i = 0;
    while (i < ng && i < nw && got[i] == (int32_t)cJSON_GetArrayItem(want, (int)i)->valuedouble) i++;
    if (i == ng && i == nw) return true;
    snprintf(why, wl, "%zu ids, expected %zu; first difference at %zu: %d, expected %d", ng, nw, i,
             i < ng ? got[i] : -1, i < nw ? (int)cJSON_GetArrayItem(want, (int)i)->valuedouble : -1);
    return false;
}

static tide_tokenizer *open_gguf(tide_ctx *ctx, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/gguf-tok/%s/tokenizer.gguf", fix_dir, name);
    tide_tokenizer *t = NULL;
    if (tide_tokenizer_open(ctx, path, &t)) fail_msg("%s: %s", name, tide_ctx_last_error(ctx));
    return t;
}

static bool listed(const cJSON *differs, const char *name) {
    const cJSON *e;
    cJSON_ArrayForEach(e, differs) if (!strcmp(cJSON_GetObjectItem(e, "name")->valuestring, name)) return true;
    return false;
}

static void check_text(const char *fx, const char *const *may_differ) {
    tide_ctx *ctx = tide_ctx_new();
    tide_tokenizer *t = open_gguf(ctx, fx);
    cJSON *cases = load_json("%s/text/cases.json%s%s", "", "");
    cJSON *exp = load_json("%s/gguf-tok/%s/expected.json%s", fx, "");
    cJSON *src = load_json("%s/text/%s/expected.json%s", fx, "");
    const cJSON *cl = cJSON_GetObjectItem(cases, "cases"), *el = cJSON_GetObjectItem(exp, "cases");
    const cJSON *sl = cJSON_GetObjectItem(src, "cases"), *differs = cJSON_GetObjectItem(exp, "differs_from_source");
    assert_int_equal(cJSON_GetArraySize(cl), cJSON_GetArraySize(el));
    /* the recorded differences are exactly the expected ones */
    int n_may = 0;
    while (may_differ[n_may]) {
        if (!listed(differs, may_differ[n_may])) fail_msg("%s: '%s' is not recorded as differing", fx, may_differ[n_may]);
        n_may++;
    }
    assert_int_equal(cJSON_GetArraySize(differs), n_may);
    tide_detok *d;
    assert_int_equal(tide_detok_new(t, 0, &d), TIDE_OK);
    char why[256];
    int same_as_source = 0;
    for (int k = 0; k < cJSON_GetArraySize(cl); k++) {
        const cJSON *c = cJSON_GetArrayItem(cl, k), *e = cJSON_GetArrayItem(el, k), *s = cJSON_GetArrayItem(sl, k);
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        size_t len, n, np, nb;
        char *text = field_bytes(c, "text", &len);
        int32_t *ids = encode(t, text, len, 0, &n);
        int32_t *plain = encode(t, text, len, TIDE_TOKENIZE_SPECIAL_AS_TEXT, &np);
        int32_t *bos = encode(t, text, len, TIDE_TOKENIZE_ADD_SPECIAL, &nb);
        const char *modes[3] = {"ids", "ids_plain", "ids_bos"};
        const int32_t *got[3] = {ids, plain, bos};
        size_t ng[3] = {n, np, nb};
        for (int m = 0; m < 3; m++) {
            if (!ids_match(got[m], ng[m], cJSON_GetObjectItem(e, modes[m]), why, sizeof why))
                fail_msg("%s, case '%s' (%s): %s", fx, name, modes[m], why);
            /* tokenizer.json's own ids, wherever the script found no difference */
            if (!listed(differs, name) && !ids_match(got[m], ng[m], cJSON_GetObjectItem(s, modes[m]), why, sizeof why))
                fail_msg("%s, case '%s' (%s) against text/%s: %s", fx, name, modes[m], fx, why);
        }
        same_as_source += !listed(differs, name);
        size_t dl, dsl, wl, wsl;
        char *want = field_bytes(e, "text", &wl), *want_skip = field_bytes(e, "text_skip", &wsl);
        char *dec = decode(t, ids, n, 0, &dl), *dec_skip = decode(t, ids, n, TIDE_DECODE_SKIP_SPECIAL, &dsl);
        if (dl != wl || memcmp(dec, want, dl)) fail_msg("%s, case '%s': decoded '%s', expected '%s'", fx, name, dec, want);
        if (dsl != wsl || memcmp(dec_skip, want_skip, dsl))
            fail_msg("%s, case '%s': decoded skipping specials '%s', expected '%s'", fx, name, dec_skip, want_skip);
        /* streamed one id at a time */
        char *buf = malloc(dl + 16);
        size_t bl = 0;
        for (size_t i = 0; i < n; i++) {
            const char *p;
            size_t l;
            assert_int_equal(tide_detok_push(d, ids[i], &p, &l), TIDE_OK);
            memcpy(buf + bl, p, l);
            bl += l;
        }
        const char *p;
        size_t l;
        assert_int_equal(tide_detok_finish(d, &p, &l), TIDE_OK);
        memcpy(buf + bl, p, l);
        bl += l;
        if (bl != dl || memcmp(buf, dec, dl)) fail_msg("%s, case '%s': streamed '%.*s'", fx, name, (int)bl, buf);
        free(buf);
        free(want);
        free(want_skip);
        free(dec);
        free(dec_skip);
        free(ids);
        free(plain);
        free(bos);
        free(text);
    }
    assert_true(same_as_source >= 39);
    /* mixed.txt: count and hash, both modes; decoding round-trips */
    char path[4200];
    snprintf(path, sizeof path, "%s/text/mixed.txt", fix_dir);
    size_t ml;
    char *mixed = slurp(path, &ml);
    assert_non_null(mixed);
    for (int mode = 0; mode < 2; mode++) {
        const cJSON *w = cJSON_GetObjectItem(cJSON_GetObjectItem(exp, "mixed"), mode ? "ids_plain" : "ids");
        const cJSON *ws = cJSON_GetObjectItem(cJSON_GetObjectItem(src, "mixed"), mode ? "ids_plain" : "ids");
        size_t n;
        int32_t *ids = encode(t, mixed, ml, mode ? TIDE_TOKENIZE_SPECIAL_AS_TEXT : 0, &n);
        uint64_t h = 0xCBF29CE484222325ull;
        for (size_t i = 0; i < n; i++)
            for (int b = 0; b < 4; b++) h = (h ^ (((uint32_t)ids[i] >> (8 * b)) & 0xFF)) * 0x100000001B3ull;
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
        if ((double)n != cJSON_GetObjectItem(w, "count")->valuedouble ||
            strcmp(hex, cJSON_GetObjectItem(w, "fnv")->valuestring))
            fail_msg("%s: mixed.txt: %zu ids (hash %s), expected %g (hash %s)", fx, n, hex,
                     cJSON_GetObjectItem(w, "count")->valuedouble, cJSON_GetObjectItem(w, "fnv")->valuestring);
        /* the same as tokenizer.json's on every fixture */
        assert_string_equal(hex, cJSON_GetObjectItem(ws, "fnv")->valuestring);
        if (!mode) {
            size_t dl;
            char *back = decode(t, ids, n, 0, &dl);
            assert_true(dl == ml && !memcmp(back, mixed, ml));
            free(back);
        }
        free(ids);
    }
    free(mixed);
    tide_detok_free(d);
    cJSON_Delete(cases);
    cJSON_Delete(exp);
    cJSON_Delete(src);
    tide_tokenizer_free(t);
    tide_ctx_free(ctx);
}

static const char *const none[] = {NULL};
static void test_bpe_llama3(void **state) { check_text("bpe-llama3", none); }
static void test_bpe_qwen2(void **state) { check_text("bpe-qwen2", none); }
static void test_sp_llama2(void **state) { check_text("sp-llama2", none); }
/* "<mask>" strips the spaces before it in tokenizer.json; GGUF has no lstrip */
static void test_bpe_gpt2(void **state) { check_text("bpe-gpt2", (const char *const[]){"mask lstrip", NULL}); }
/* Metaspace with prepend_scheme "first" (and no prefix before a leading
 * marker or space) has no GGUF form: add_space_prefix prefixes every piece of
 * text between added tokens, as llama.cpp does */
static void test_sp_metaspace(void **state) {
    check_text("sp-metaspace", (const char *const[]){"space", "spaces", "leading space", "mixed whitespace",
                                                     "sp marker in text", "special bos", "special inside",
                                                     "added non-special", "chatml", NULL});
}

static void test_specials(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    tide_tokenizer *t = open_gguf(ctx, "bpe-llama3");
    const int32_t *eos;
    assert_int_equal(tide_tokenizer_n_vocab(t), 1205);
    assert_int_equal(tide_tokenizer_bos(t), 1200);
    assert_int_equal(tide_tokenizer_eos(t), 1204);
    assert_int_equal(tide_tokenizer_eos_ids(t, &eos), 2); /* eos_token_id, eot_token_id */
    assert_true(tide_tokenizer_is_eos(t, 1201) && tide_tokenizer_is_eos(t, 1204) && !tide_tokenizer_is_eos(t, 1200));
    assert_string_equal(tide_tokenizer_piece(t, 1204), "<|eot_id|>");
    assert_true(tide_tokenizer_is_special(t, 1204) && !tide_tokenizer_is_special(t, 5));
    assert_int_equal(tide_tokenizer_find(t, "<|eot_id|>"), 1204);
    assert_null(tide_tokenizer_piece(t, 1205));
    assert_null(tide_tokenizer_chat_template(t));
    tide_tokenizer_free(t);

    t = open_gguf(ctx, "bpe-gpt2");
    int32_t m = tide_tokenizer_find(t, "<mask>"), u = tide_tokenizer_find(t, "tidetoken");
    assert_true(m > 0 && u > 0);
    assert_true(tide_tokenizer_is_special(t, m) && !tide_tokenizer_is_special(t, u)); /* control, user-defined */
    assert_int_equal(tide_tokenizer_eos(t), tide_tokenizer_find(t, "<|endoftext|>"));
    tide_tokenizer_free(t);

    t = open_gguf(ctx, "sp-llama2");
    assert_int_equal(tide_tokenizer_bos(t), 1);
    assert_int_equal(tide_tokenizer_eos(t), 2);
    assert_string_equal(tide_tokenizer_piece(t, 3), "<0x00>");
    assert_true(tide_tokenizer_is_special(t, 0)); /* <unk>: unknown */
    tide_tokenizer_free(t);
    tide_ctx_free(ctx);
}

/* The chat template from tokenizer.chat_template renders as transformers'. */
static void check_chat(const char *fam) {
    tide_ctx *ctx = tide_ctx_new();
    char name[64];
    snprintf(name, sizeof name, "chat-%s", fam);
    tide_tokenizer *t = open_gguf(ctx, name);
    assert_non_null(tide_tokenizer_chat_template(t));
    tide_chat_template *c = NULL;
    if (tide_chat_template_get(ctx, t, NULL, &c)) fail_msg("%s: %s", fam, tide_ctx_last_error(ctx));
    assert_string_equal(tide_chat_template_name(c), fam);
    cJSON *src = load_json("%s/chat/%s/expected.json%s", fam, "");
    cJSON *exp = load_json("%s/gguf-tok/%s/expected.json%s", name, "");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(exp, "differs_from_source")), 0);
    const cJSON *e;
    int n_text = 0;
    char why[256];
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(src, "cases")) {
        const cJSON *want = cJSON_GetObjectItem(e, "text");
        if (!want) continue;
        const char *cname = cJSON_GetObjectItem(e, "name")->valuestring;
        const cJSON *ms = cJSON_GetObjectItem(e, "messages");
        int n = cJSON_GetArraySize(ms);
        tide_chat_msg *m = calloc((size_t)n + 1, sizeof *m);
        for (int i = 0; i < n; i++) {
            m[i].role = cJSON_GetObjectItem(cJSON_GetArrayItem(ms, i), "role")->valuestring;
            m[i].content = cJSON_GetObjectItem(cJSON_GetArrayItem(ms, i), "content")->valuestring;
        }
        char *out = NULL;
        size_t len = 0;
        bool gen = cJSON_IsTrue(cJSON_GetObjectItem(e, "add_generation_prompt"));
        if (tide_chat_format(ctx, c, m, n, gen, &out, &len)) fail_msg("%s, %s: %s", fam, cname, tide_ctx_last_error(ctx));
        if (len != strlen(want->valuestring) || memcmp(out, want->valuestring, len))
            fail_msg("%s, case '%s':\n got '%s'\nwant '%s'", fam, cname, out, want->valuestring);
        size_t ni;
        int32_t *ids = encode(t, out, len, 0, &ni);
        const cJSON *r = NULL, *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(exp, "cases"))
            if (!strcmp(cJSON_GetObjectItem(x, "name")->valuestring, cname)) r = x;
        assert_non_null(r);
        if (!ids_match(ids, ni, cJSON_GetObjectItem(r, "ids"), why, sizeof why))
            fail_msg("%s, case '%s': %s", fam, cname, why);
        if (!ids_match(ids, ni, cJSON_GetObjectItem(e, "ids"), why, sizeof why)) /* transformers' own */
            fail_msg("%s, case '%s' against chat/%s: %s", fam, cname, fam, why);
        free(ids);
        tide_free_text(out);
        free(m);
        n_text++;
    }
    assert_true(n_text >= 6);
    cJSON_Delete(src);
    cJSON_Delete(exp);
    tide_chat_template_free(c);
    tide_tokenizer_free(t);
    tide_ctx_free(ctx);
}

static void test_chat(void **state) {
    const char *fams[] = {"llama2", "llama3", "chatml", "mistral", "zephyr", "gemma"};
    for (int i = 0; i < 6; i++) check_chat(fams[i]);
}

/* ------------------------------------------------------------ malformed metadata */

/* A small valid description: "llama" over a b c ab abc, or "gpt2" with merges. */
typedef struct desc_store {
    tok_gguf_desc d;
    const char *tokens[8];
    float scores[8];
    int32_t types[8];
    const char *merges[4];
} desc_store;

static void make_desc(desc_store *s, bool gpt2) {
    memset(s, 0, sizeof *s);
    const char *tok[] = {"<unk>", "<s>", "</s>", "a", "b", "c", "ab", "abc"};
    const int32_t ty[] = {2, 3, 3, 1, 1, 1, 1, 1};
    for (int i = 0; i < 8; i++) {
        s->tokens[i] = tok[i];
        s->types[i] = ty[i];
        s->scores[i] = -(float)i;
    }
    s->merges[0] = "a b";
    s->merges[1] = "ab c";
    s->d = (tok_gguf_desc){.source = "mem.gguf", .model = gpt2 ? "gpt2" : "llama", .pre = gpt2 ? "gpt-2" : NULL,
                           .n_tokens = 8, .tokens = s->tokens, .n_scores = 8, .scores = s->scores,
                           .n_types = 8, .types = s->types, .n_merges = gpt2 ? 2 : 0,
                           .merges = gpt2 ? s->merges : NULL, .bos = 1, .eos = 2, .eot = TOK_GGUF_ABSENT,
                           .unk = 0, .pad = TOK_GGUF_ABSENT, .add_bos = -1, .add_eos = -1, .add_space_prefix = 0};
}

static void expect_fail(const tok_gguf_desc *d, tide_status want, const char *needle) {
    tide_ctx *ctx = tide_ctx_new();
    tide_tokenizer *t = (tide_tokenizer *)&t;
    tide_status st = tok_gguf_build(ctx, d, &t);
    if (st != want || !strstr(tide_ctx_last_error(ctx), needle))
        fail_msg("status %s, message '%s'; expected %s with '%s'", tide_status_str(st), tide_ctx_last_error(ctx),
                 tide_status_str(want), needle);
    assert_null(t);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "mem.gguf"));
    tide_ctx_free(ctx);
}

static void test_desc(void **state) {
    desc_store s;
    tide_ctx *ctx = tide_ctx_new();
    /* the valid ones encode by their merges: "abc" is one token either way */
    for (int g = 0; g < 2; g++) {
        make_desc(&s, g);
        tide_tokenizer *t;
        if (tok_gguf_build(ctx, &s.d, &t)) fail_msg("%s", tide_ctx_last_error(ctx));
        int32_t ids[8];
        size_t n;
        assert_int_equal(tide_tokenizer_encode(t, "abcab", 5, TIDE_TOKENIZE_ADD_SPECIAL, ids, 8, &n), TIDE_OK);
        assert_int_equal(n, g ? 2 : 3); /* llama adds BOS by default */
        assert_int_equal(ids[g ? 0 : 1], 7);
        assert_int_equal(ids[g ? 1 : 2], 6);
        tide_tokenizer_free(t);
    }
    /* llama: every split of a token into two is a merge ("abc" = "a" + "bc") */
    make_desc(&s, false);
    s.tokens[6] = "bc"; /* a b c bc abc: "abc" is reached through "bc" only */
    tide_tokenizer *t;
    assert_int_equal(tok_gguf_build(ctx, &s.d, &t), TIDE_OK);
    int32_t ids[8];
    size_t n;
    assert_int_equal(tide_tokenizer_encode(t, "abc", 3, 0, ids, 8, &n), TIDE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 7);
    tide_tokenizer_free(t);
    /* equal scores: the leftmost pair merges first, whichever token's id is
     * lower ("bc" comes before "ab" here; "abc" is no token) */
    make_desc(&s, false);
    s.tokens[6] = "bc";
    s.tokens[7] = "ab";
    s.scores[6] = s.scores[7] = -1.0f;
    assert_int_equal(tok_gguf_build(ctx, &s.d, &t), TIDE_OK);
    assert_int_equal(tide_tokenizer_encode(t, "abc", 3, 0, ids, 8, &n), TIDE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 7);
    assert_int_equal(ids[1], 5);
    assert_int_equal(tide_tokenizer_encode(t, "bcab", 4, 0, ids, 8, &n), TIDE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 7);
    tide_tokenizer_free(t);
    /* every supported pre-tokenizer name builds (its regex compiles) */
    const char *pres[] = {"gpt-2", "llama-bpe", "llama3", "llama-v3", "qwen2", "tekken"};
    for (int i = 0; i < 6; i++) {
        make_desc(&s, true);
        s.d.pre = pres[i];
        if (tok_gguf_build(ctx, &s.d, &t)) fail_msg("pre %s: %s", pres[i], tide_ctx_last_error(ctx));
        assert_int_equal(tide_tokenizer_encode(t, "abc", 3, 0, ids, 8, &n), TIDE_OK);
        assert_int_equal(n, 1);
        assert_int_equal(ids[0], 7);
        tide_tokenizer_free(t);
    }
    tide_ctx_free(ctx);

    make_desc(&s, false);
    s.d.n_scores = 7;
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.scores has 7 entries, tokenizer.ggml.tokens 8");
    make_desc(&s, false);
    s.d.n_types = 9;
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.token_type has 9 entries");
    make_desc(&s, false);
    s.types[4] = 7;
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.token_type[4] is 7");
    make_desc(&s, false);
    s.d.bos = 8;
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.bos_token_id 8 is outside the vocabulary");
    make_desc(&s, false);
    s.d.eot = -3;
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.eot_token_id -3 is outside");
    make_desc(&s, false);
    s.d.model = "bert";
    expect_fail(&s.d, TIDE_E_UNSUPPORTED, "tokenizer.ggml.model 'bert' is not supported");
    make_desc(&s, false);
    s.d.model = NULL;
    expect_fail(&s.d, TIDE_E_FORMAT, "no key tokenizer.ggml.model");
    make_desc(&s, false);
    s.d.tokens = NULL;
    expect_fail(&s.d, TIDE_E_FORMAT, "no key tokenizer.ggml.tokens");
    make_desc(&s, false);
    s.tokens[5] = "\xff";
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.tokens[5] is not valid UTF-8");
    make_desc(&s, false);
    s.d.add_bos = 1;
    s.d.bos = TOK_GGUF_ABSENT;
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.add_bos_token is set but there is no tokenizer.ggml.bos_token_id");
    make_desc(&s, true);
    s.merges[1] = "ab d";
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.merges[1] 'ab d': 'd' is not in tokenizer.ggml.tokens");
    make_desc(&s, true);
    s.merges[0] = "b c"; /* "bc" is no token */
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.merges[0] 'b c': 'bc' is not in tokenizer.ggml.tokens");
    make_desc(&s, true);
    s.merges[0] = "abc";
    expect_fail(&s.d, TIDE_E_FORMAT, "tokenizer.ggml.merges[0] 'abc' is not two tokens");
    make_desc(&s, true);
    s.d.merges = NULL;
    expect_fail(&s.d, TIDE_E_FORMAT, "no key tokenizer.ggml.merges");
    make_desc(&s, true);
    s.d.pre = "default";
    expect_fail(&s.d, TIDE_E_UNSUPPORTED, "tokenizer.ggml.pre 'default' is not supported (tide reads gpt-2, llama-bpe");
    make_desc(&s, true);
    s.d.pre = NULL;
    expect_fail(&s.d, TIDE_E_UNSUPPORTED, "no key tokenizer.ggml.pre");
}

/* A GGUF file of key/value pairs written here: each kv is (key, type, payload). */
typedef struct gbuf { unsigned char *p; size_t n, cap; } gbuf;
static void put(gbuf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void put_u32(gbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(gbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(gbuf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_str(gbuf *b, const char *k, const char *v) {
    put_str(b, k);
    put_u32(b, 8);
    put_str(b, v);
}
static void kv_strs(gbuf *b, const char *k, const char *const *v, int n) {
    put_str(b, k);
    put_u32(b, 9);
    put_u32(b, 8);
    put_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) put_str(b, v[i]);
}
static void kv_u32s(gbuf *b, const char *k, const uint32_t *v, int n) {
    put_str(b, k);
    put_u32(b, 9);
    put_u32(b, 4);
    put_u64(b, (uint64_t)n);
    put(b, v, (size_t)n * 4);
}

/* Writes a file of the 3 or 4 keys given and opens it; returns the status. */
static tide_status open_written(tide_ctx *ctx, int variant) {
    static const char *const toks[] = {"<s>", "a", "b", "ab"};
    static const uint32_t types[] = {3, 1, 1, 1};
    gbuf kv = {0};
    int nkv = 0;
    kv_str(&kv, "tokenizer.ggml.model", "llama"), nkv++;
    if (variant == 0) kv_strs(&kv, "tokenizer.ggml.tokens", toks, 4), nkv++;
    if (variant == 1) kv_u32s(&kv, "tokenizer.ggml.tokens", types, 4), nkv++; /* not strings */
    if (variant == 2) {
        kv_strs(&kv, "tokenizer.ggml.tokens", toks, 4), nkv++;
        kv_str(&kv, "tokenizer.ggml.bos_token_id", "one"), nkv++; /* not an integer */
    }
    kv_u32s(&kv, "tokenizer.ggml.token_type", types, 4), nkv++;
    if (variant == 3) kv_strs(&kv, "tokenizer.ggml.tokens", toks, 4), kv_u32s(&kv, "tokenizer.ggml.scores", types, 4),
        nkv += 2; /* scores not floats */
    gbuf f = {0};
    put(&f, "GGUF", 4);
    put_u32(&f, 3);
    put_u64(&f, 0);
    put_u64(&f, (uint64_t)nkv);
    put(&f, kv.p, kv.n);
    char path[] = "/tmp/tide-tokgguf-XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, f.p, f.n), (ssize_t)f.n);
    close(fd);
    free(kv.p);
    free(f.p);
    tide_tokenizer *t = NULL;
    tide_status st = tide_tokenizer_open(ctx, path, &t);
    if (!st) {
        size_t n;
        int32_t ids[4];
        assert_int_equal(tide_tokenizer_encode(t, "ab", 2, 0, ids, 4, &n), TIDE_OK);
        assert_int_equal(n, 1); /* the space prefix is no token (and no unk): dropped */
        assert_int_equal(ids[0], 3);
    }
    tide_tokenizer_free(t);
    unlink(path);
    return st;
}

static void test_bad_files(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    if (open_written(ctx, 0)) fail_msg("%s", tide_ctx_last_error(ctx));
    assert_int_equal(open_written(ctx, 1), TIDE_E_FORMAT);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "key 'tokenizer.ggml.tokens' is not an array of strings"));
    assert_int_equal(open_written(ctx, 2), TIDE_E_FORMAT);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "key 'tokenizer.ggml.bos_token_id' is not an integer"));
    assert_int_equal(open_written(ctx, 3), TIDE_E_FORMAT);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "key 'tokenizer.ggml.scores' is not an array of floats"));
    /* a missing file, and a file that is not GGUF */
    tide_tokenizer *t = NULL;
    assert_int_equal(tide_tokenizer_open(ctx, "/nonexistent/x.gguf", &t), TIDE_E_NOT_FOUND);
    assert_null(t);
    char path[4200];
    snprintf(path, sizeof path, "%s/text/bpe-gpt2/tokenizer.json", fix_dir);
    char dst[] = "/tmp/tide-tokgguf-XXXXXX.gguf";
    int fd = mkstemps(dst, 5);
    size_t n;
    char *j = slurp(path, &n);
    assert_int_equal(write(fd, j, n), (ssize_t)n);
    close(fd);
    free(j);
    assert_int_equal(tide_tokenizer_open(ctx, dst, &t), TIDE_E_FORMAT);
    assert_non_null(strstr(tide_ctx_last_error(ctx), dst));
    unlink(dst);
    tide_ctx_free(ctx);
}

static void test_alloc_failures(void **state) {
    const char *fxs[] = {"sp-llama2", "bpe-gpt2"};
    tide_ctx *ctx = tide_ctx_new();
    for (int f = 0; f < 2; f++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/gguf-tok/%s/tokenizer.gguf", fix_dir, fxs[f]);
        int64_t base = tide_alloc_live_bytes();
        int failures = 0;
        for (long n = 1; n < 1000000; n++) {
            tide_tokenizer *t = NULL;
            long before = tide_alloc_count();
            tide_alloc_fail_nth(n);
            tide_status st = tide_tokenizer_open(ctx, path, &t);
            bool hit = tide_alloc_count() - before >= n;
            tide_alloc_fail_nth(0);
            tide_tokenizer_free(t);
            assert_int_equal(tide_alloc_live_bytes(), base);
            if (!hit) {
                assert_int_equal(st, TIDE_OK);
                break;
            }
            if (st) {
                assert_int_equal(st, TIDE_E_NOMEM);
                failures++;
            }
            /* every allocation up to the vocabulary's, then a sample */
            if (n > 200) n += n / 8;
        }
        assert_true(failures > 10);
    }
    tide_ctx_free(ctx);
}

int main(void) {
    const char *root = getenv("TIDE_FIXTURES");
    if (!root) {
        fprintf(stderr, "test_tok_gguf: TIDE_FIXTURES is not set (ctest sets it to tests/fixtures)\n");
        return 1;
    }
    snprintf(fix_dir, sizeof fix_dir, "%s", root);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_llama3), cmocka_unit_test(test_bpe_gpt2),     cmocka_unit_test(test_bpe_qwen2),
        cmocka_unit_test(test_sp_llama2),  cmocka_unit_test(test_sp_metaspace), cmocka_unit_test(test_specials),
        cmocka_unit_test(test_chat),       cmocka_unit_test(test_desc),         cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
