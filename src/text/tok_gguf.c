/*
 * tok_gguf.c - a tokenizer from GGUF metadata (tok_gguf.h says which keys and
 * what they mean).
 *
 * The description is checked here, each problem named by its key; then it
 * becomes the tokenizer.json tree of the Hugging Face tokenizer it stands for,
 * which tok_load.c reads as it reads a file (one pipeline, one encoder):
 *
 * The model's vocabulary holds every token (a string repeated in the
 * vocabulary at its first id), so that every id is the file's.
 *
 *   llama  model BPE, byte_fallback, unk fused; merges from the scores: every split of a normal token into
 *          two tokens (normal or user-defined) is a merge giving it, ranked by
 *          the token's score (highest first; equal scores share a rank, so the
 *          leftmost pair merges first, as llama.cpp's SentencePiece tokenizer
 *          does); normalizer Prepend("\u2581") when add_space_prefix (default
 *          on) + Replace(" ", "\u2581"); decoder Replace("\u2581", " "),
 *          ByteFallback, Fuse, and Strip(" ", 1) when add_space_prefix
 *   gpt2   model BPE with the merges in their order; pre-tokenizer Split
 *          (the family's regex, Isolated) + ByteLevel; decoder ByteLevel; the
 *          family's extras (NFC for qwen2; ignore_merges and BOS for Llama 3
 *          and tekken, as llama.cpp sets them)
 *   both   added tokens: control and unknown tokens special, user-defined ones
 *          not, none normalized, stripping nothing (GGUF keeps no such flags);
 *          post-processor: BOS when add_bos_token (default: on for llama and
 *          the Llama 3 and tekken families), EOS when add_eos_token (default
 *          off).
 */
#include "text/tok_gguf.h"
#include "text/tok_int.h"
#include "model/gguf.h"

#include <cjson/cJSON.h>

#include <stdlib.h>
#include <string.h>

#define K "tokenizer.ggml."

/* The pre-tokenizers of llama.cpp's names that tide reads: the regex the
 * Hugging Face tokenizer of that family splits with, and its extras. */
typedef struct pre_family {
    const char *names[4];
    const char *regex;
    bool nfc, ignore_merges, add_bos;
} pre_family;

static const pre_family pre_families[] = {
    {{"gpt-2"}, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", false, false,
     false},
    {{"llama-bpe", "llama3", "llama-v3"},
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
     "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     false, true, true},
    {{"qwen2"},
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
     "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     true, false, false},
    {{"tekken"},
     "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?"
     "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
     "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     false, true, true},
};
#define PRE_NAMES "gpt-2, llama-bpe, llama3, llama-v3, qwen2, tekken"

static const pre_family *find_pre(const char *name) {
    for (size_t i = 0; i < sizeof pre_families / sizeof *pre_families; i++)
        for (int k = 0; k < 4 && pre_families[i].names[k]; k++)
            if (!strcmp(pre_families[i].names[k], name)) return &pre_families[i];
    return NULL;
}

/* State of one build. */
typedef struct builder {
    tide_ctx *ctx;
    const tok_gguf_desc *d;
    bool spm;
    int32_t n;
    char **tok;         /* NUL-terminated copies of the tokens */
    uint32_t *len;
    uint8_t *type;      /* TOK_GGUF_TYPE_*, undefined read as normal */
    tok_smap all;       /* token -> id (the first id of a repeated string) */
} builder;

static tide_status bfail(builder *B, tide_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static tide_status bfail(builder *B, tide_status st, const char *fmt, ...) {
    char msg[TIDE_ERRMSG_MAX - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tide_err(B->ctx, st, "%s: %s", B->d->source ? B->d->source : "GGUF metadata", msg);
}

static tide_status bnomem(builder *B) { return bfail(B, TIDE_E_NOMEM, "out of memory building the tokenizer"); }

static void builder_free(builder *B) {
    for (int32_t i = 0; B->tok && i < B->n; i++) tide_free(B->tok[i]);
    tide_free(B->tok);
    tide_free(B->len);
    tide_free(B->type);
    tok_smap_free(&B->all);
}

/* ------------------------------------------------------------ checks */

static tide_status check_id(builder *B, const char *key, int64_t id) {
    if (id == TOK_GGUF_ABSENT) return TIDE_OK;
    if (id < 0 || id >= B->n)
        return bfail(B, TIDE_E_FORMAT, "%s %lld is outside the vocabulary (%d tokens in " K "tokens)", key,
                     (long long)id, (int)B->n);
    return TIDE_OK;
}

static tide_status read_tokens(builder *B) {
    const tok_gguf_desc *d = B->d;
    if (!d->tokens) return bfail(B, TIDE_E_FORMAT, "no key " K "tokens (the vocabulary)");
    if (d->n_tokens <= 0 || d->n_tokens >= (1 << 30))
        return bfail(B, TIDE_E_FORMAT, K "tokens holds %lld tokens (expected 1 to 2^30 - 1)", (long long)d->n_tokens);
    B->n = (int32_t)d->n_tokens;
    if (d->scores && d->n_scores != d->n_tokens)
        return bfail(B, TIDE_E_FORMAT, K "scores has %lld entries, " K "tokens %lld", (long long)d->n_scores,
                     (long long)d->n_tokens);
    if (d->types && d->n_types != d->n_tokens)
        return bfail(B, TIDE_E_FORMAT, K "token_type has %lld entries, " K "tokens %lld", (long long)d->n_types,
                     (long long)d->n_tokens);
    B->tok = tide_calloc((size_t)B->n, sizeof *B->tok);
    B->len = tide_calloc((size_t)B->n, sizeof *B->len);
    B->type = tide_calloc((size_t)B->n, 1);
    if (!B->tok || !B->len || !B->type || tok_smap_init(&B->all, (size_t)B->n)) return bnomem(B);
    for (int32_t i = 0; i < B->n; i++) {
        const char *s = d->tokens[i];
        uint64_t l = d->tokens_len ? d->tokens_len[i] : (s ? strlen(s) : 0);
        if (!s || l >= UINT32_MAX) return bfail(B, TIDE_E_FORMAT, K "tokens[%d] is missing", (int)i);
        if (memchr(s, 0, l)) return bfail(B, TIDE_E_FORMAT, K "tokens[%d] holds a NUL byte", (int)i);
        if (!tok_utf8_valid((const uint8_t *)s, l))
            return bfail(B, TIDE_E_FORMAT, K "tokens[%d] is not valid UTF-8", (int)i);
        if (!(B->tok[i] = tide_malloc(l + 1))) return bnomem(B);
        memcpy(B->tok[i], s, l);
        B->tok[i][l] = 0;
        B->len[i] = (uint32_t)l;
        int32_t ty = d->types ? d->types[i] : TOK_GGUF_TYPE_NORMAL;
        if (ty < 0 || ty > TOK_GGUF_TYPE_BYTE)
            return bfail(B, TIDE_E_FORMAT, K "token_type[%d] is %d (token types are 0 to 6)", (int)i, (int)ty);
        B->type[i] = (uint8_t)(ty == TOK_GGUF_TYPE_UNDEFINED ? TOK_GGUF_TYPE_NORMAL : ty);
        if ((B->type[i] == TOK_GGUF_TYPE_CONTROL || B->type[i] == TOK_GGUF_TYPE_USER_DEFINED ||
             B->type[i] == TOK_GGUF_TYPE_UNKNOWN) && !l)
            return bfail(B, TIDE_E_FORMAT, K "tokens[%d]: a control, unknown or user-defined token is empty", (int)i);
        if (tok_smap_get(&B->all, s, l) < 0 && tok_smap_put(&B->all, s, l, i)) return bnomem(B);
    }
    tide_status st;
    if ((st = check_id(B, K "bos_token_id", d->bos)) || (st = check_id(B, K "eos_token_id", d->eos)) ||
        (st = check_id(B, K "eot_token_id", d->eot)) || (st = check_id(B, K "unknown_token_id", d->unk)) ||
        (st = check_id(B, K "padding_token_id", d->pad)))
        return st;
    return TIDE_OK;
}

/* ------------------------------------------------------------ the tree */

/* Each helper attaches what it makes to its parent (so deleting the root frees
 * everything) and returns NULL when out of memory. */
static cJSON *add_obj(cJSON *parent, const char *key, const char *type) {
    cJSON *o = cJSON_CreateObject();
    bool ok = o && (key ? cJSON_AddItemToObject(parent, key, o) : cJSON_AddItemToArray(parent, o));
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return type && !cJSON_AddStringToObject(o, "type", type) ? NULL : o;
}

static bool add_str(cJSON *arr, const char *s) {
    cJSON *x = cJSON_CreateString(s);
    if (x && cJSON_AddItemToArray(arr, x)) return true;
    cJSON_Delete(x);
    return false;
}

static bool add_pair(cJSON *merges, const char *a, const char *b) {
    cJSON *p = cJSON_CreateArray();
    if (!p || !cJSON_AddItemToArray(merges, p)) {
        cJSON_Delete(p);
        return false;
    }
    return add_str(p, a) && add_str(p, b);
}

/* A Sequence object under parent[key] with its list named list_key. */
static cJSON *add_seq(cJSON *parent, const char *key, const char *list_key) {
    cJSON *o = add_obj(parent, key, "Sequence");
    return o ? cJSON_AddArrayToObject(o, list_key) : NULL;
}

static bool add_replace(cJSON *arr, const char *from, const char *to) {
    cJSON *o = add_obj(arr, NULL, "Replace");
    cJSON *p = o ? cJSON_AddObjectToObject(o, "pattern") : NULL;
    return p && cJSON_AddStringToObject(p, "String", from) && cJSON_AddStringToObject(o, "content", to);
}

/* The merges of a llama vocabulary from its scores (top of this file), as
 * [a, b] pairs in rank order; rank_of gets each token's rank (by score). */
typedef struct cand { float score; int32_t id; } cand;
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool merge_part(const builder *B, int32_t id) {
    return id >= 0 && (B->type[id] == TOK_GGUF_TYPE_NORMAL || B->type[id] == TOK_GGUF_TYPE_USER_DEFINED);
}

static tide_status spm_merges(builder *B, cJSON *merges, int32_t *rank_of) {
    cand *c = tide_malloc((size_t)B->n * sizeof *c);
    if (!c) return bnomem(B);
    int32_t nc = 0;
    for (int32_t i = 0; i < B->n; i++) {
        rank_of[i] = -1;
        if (B->type[i] == TOK_GGUF_TYPE_NORMAL && B->len[i] > 1)
            c[nc++] = (cand){B->d->scores ? B->d->scores[i] : 0.0f, i};
    }
    qsort(c, (size_t)nc, sizeof *c, cand_cmp);
    int32_t rank = -1;
    for (int32_t k = 0; k < nc; k++) {
        if (!k || c[k].score != c[k - 1].score) rank++;
        rank_of[c[k].id] = rank;
        const char *s = B->tok[c[k].id];
        uint32_t n = B->len[c[k].id];
        for (uint32_t i = 1; i < n; i++) {
            if (((uint8_t)s[i] & 0xC0) == 0x80) continue; /* inside a character */
            int32_t a = tok_smap_get(&B->all, s, i), b = tok_smap_get(&B->all, s + i, n - i);
            if (!merge_part(B, a) || !merge_part(B, b)) continue;
            if (!add_pair(merges, B->tok[a], B->tok[b])) {
                tide_free(c);
                return bnomem(B);
            }
        }
    }
    tide_free(c);
    return TIDE_OK;
}

/* The gpt2 merges, each checked against the tokens. */
static tide_status bpe_merges(builder *B, cJSON *merges) {
    const tok_gguf_desc *d = B->d;
    if (!d->merges) return bfail(B, TIDE_E_FORMAT, "no key " K "merges (a gpt2 tokenizer needs its merges)");
    char *buf = NULL;
    size_t cap = 0;
    tide_status st = TIDE_OK;
    for (int64_t m = 0; m < d->n_merges && !st; m++) {
        const char *s = d->merges[m];
        uint64_t l = d->merges_len ? d->merges_len[m] : (s ? strlen(s) : 0);
        if (!s || l >= UINT32_MAX) {
            st = bfail(B, TIDE_E_FORMAT, K "merges[%lld] is missing", (long long)m);
            break;
        }
        /* split at the first space after the first byte, as llama.cpp does */
        const char *sp = l > 1 ? memchr(s + 1, ' ', l - 1) : NULL;
        if (!sp || sp + 1 == s + l) {
            st = bfail(B, TIDE_E_FORMAT, K "merges[%lld] '%.*s' is not two tokens separated by a space", (long long)m,
                       (int)TIDE_MIN(l, 200), s);
            break;
        }
        size_t la = (size_t)(sp - s), lb = l - la - 1;
        if (la + lb + 1 > cap) {
            cap = (la + lb + 1) * 2;
            char *nb = tide_realloc(buf, cap);
            if (!nb) {
                st = bnomem(B);
                break;
            }
            buf = nb;
        }
        memcpy(buf, s, la);
        memcpy(buf + la, sp + 1, lb);
        int32_t ia = tok_smap_get(&B->all, s, la), ib = tok_smap_get(&B->all, sp + 1, lb);
        int32_t ij = tok_smap_get(&B->all, buf, la + lb);
        const char *bad = NULL;
        size_t badl = 0;
        if (ia < 0) bad = s, badl = la;
        else if (ib < 0) bad = sp + 1, badl = lb;
        else if (ij < 0) bad = buf, badl = la + lb;
        if (bad) {
            st = bfail(B, TIDE_E_FORMAT, K "merges[%lld] '%.*s': '%.*s' is not in " K "tokens",
                       (long long)m, (int)TIDE_MIN(l, 200), s, (int)TIDE_MIN(badl, 200), bad);
            break;
        }
        if (!add_pair(merges, B->tok[ia], B->tok[ib])) st = bnomem(B);
    }
    tide_free(buf);
    return st;
}

/* TemplateProcessing [bos] $A [eos] under root. */
static bool add_template(cJSON *root, int32_t bos, int32_t eos) {
    cJSON *o = add_obj(root, "post_processor", "TemplateProcessing");
    cJSON *single = o ? cJSON_AddArrayToObject(o, "single") : NULL;
    cJSON *specials = single ? cJSON_AddObjectToObject(o, "special_tokens") : NULL;
    if (!specials) return false;
    const char *names[3] = {"bos", "A", "eos"};
    int32_t ids[3] = {bos, 0, eos};
    for (int k = 0; k < 3; k++) {
        if (k != 1 && ids[k] < 0) continue;
        cJSON *item = add_obj(single, NULL, NULL);
        cJSON *inner = item ? cJSON_AddObjectToObject(item, k == 1 ? "Sequence" : "SpecialToken") : NULL;
        if (!inner || !cJSON_AddStringToObject(inner, "id", names[k])) return false;
        if (k == 1) continue;
        cJSON *def = cJSON_AddObjectToObject(specials, names[k]);
        cJSON *idl = def ? cJSON_AddArrayToObject(def, "ids") : NULL;
        cJSON *x = idl ? cJSON_CreateNumber(ids[k]) : NULL;
        if (!x || !cJSON_AddItemToArray(idl, x)) {
            cJSON_Delete(x);
            return false;
        }
    }
    return true;
}

static tide_status build_tree(builder *B, cJSON *root, const pre_family *fam, int32_t *rank_of) {
    const tok_gguf_desc *d = B->d;
    cJSON *model = add_obj(root, "model", "BPE");
    cJSON *vocab = model ? cJSON_AddObjectToObject(model, "vocab") : NULL;
    cJSON *merges = vocab ? cJSON_AddArrayToObject(model, "merges") : NULL;
    if (!merges) return bnomem(B);
    /* every token, a repeated string at its first id (the others get their
     * piece in finish) */
    for (int32_t i = 0; i < B->n; i++)
        if (tok_smap_get(&B->all, B->tok[i], B->len[i]) == i && !cJSON_AddNumberToObject(vocab, B->tok[i], i))
            return bnomem(B);
    tide_status st = B->spm ? spm_merges(B, merges, rank_of) : bpe_merges(B, merges);
    if (st) return st;
    bool ok = true;
    if (B->spm) {
        bool prefix = d->add_space_prefix != 0;
        int32_t unk = d->unk != TOK_GGUF_ABSENT ? (int32_t)d->unk : -1;
        for (int32_t i = 0; unk < 0 && i < B->n; i++)
            if (B->type[i] == TOK_GGUF_TYPE_UNKNOWN) unk = i;
        ok = cJSON_AddBoolToObject(model, "byte_fallback", true) && cJSON_AddBoolToObject(model, "fuse_unk", true) &&
             (unk < 0 || cJSON_AddStringToObject(model, "unk_token", B->tok[unk]));
        cJSON *norms = ok ? add_seq(root, "normalizer", "normalizers") : NULL;
        cJSON *decs = norms ? add_seq(root, "decoder", "decoders") : NULL;
        cJSON *p = decs && prefix ? add_obj(norms, NULL, "Prepend") : NULL;
        ok = decs && (!prefix || (p && cJSON_AddStringToObject(p, "prepend", "\xe2\x96\x81"))) &&
             add_replace(norms, " ", "\xe2\x96\x81") && add_replace(decs, "\xe2\x96\x81", " ") &&
             add_obj(decs, NULL, "ByteFallback") && add_obj(decs, NULL, "Fuse");
        cJSON *strip = ok && prefix ? add_obj(decs, NULL, "Strip") : NULL;
        ok = ok && (!prefix || (strip && cJSON_AddStringToObject(strip, "content", " ") &&
                                cJSON_AddNumberToObject(strip, "start", 1) && cJSON_AddNumberToObject(strip, "stop", 0)));
    } else {
        ok = (!fam->ignore_merges || cJSON_AddBoolToObject(model, "ignore_merges", true)) &&
             (!fam->nfc || add_obj(root, "normalizer", "NFC"));
        cJSON *pres = ok ? add_seq(root, "pre_tokenizer", "pretokenizers") : NULL;
        cJSON *split = pres ? add_obj(pres, NULL, "Split") : NULL;
        cJSON *pat = split ? cJSON_AddObjectToObject(split, "pattern") : NULL;
        cJSON *bl = pat && cJSON_AddStringToObject(pat, "Regex", fam->regex) &&
                            cJSON_AddStringToObject(split, "behavior", "Isolated") &&
                            cJSON_AddBoolToObject(split, "invert", false)
                        ? add_obj(pres, NULL, "ByteLevel")
                        : NULL;
        ok = bl && cJSON_AddBoolToObject(bl, "add_prefix_space", false) &&
             cJSON_AddBoolToObject(bl, "use_regex", false) && add_obj(root, "decoder", "ByteLevel");
    }
    if (!ok) return bnomem(B);
    /* added tokens */
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    if (!added) return bnomem(B);
    for (int32_t i = 0; i < B->n; i++) {
        uint8_t ty = B->type[i];
        if (ty != TOK_GGUF_TYPE_CONTROL && ty != TOK_GGUF_TYPE_UNKNOWN && ty != TOK_GGUF_TYPE_USER_DEFINED) continue;
        cJSON *a = add_obj(added, NULL, NULL);
        if (!a || !cJSON_AddNumberToObject(a, "id", i) || !cJSON_AddStringToObject(a, "content", B->tok[i]) ||
            !cJSON_AddBoolToObject(a, "special", ty != TOK_GGUF_TYPE_USER_DEFINED) ||
            !cJSON_AddBoolToObject(a, "normalized", false))
            return bnomem(B);
    }
    /* BOS / EOS around the text */
    bool add_bos = d->add_bos >= 0 ? d->add_bos != 0 : (B->spm || fam->add_bos);
    bool add_eos = d->add_eos > 0;
    if (d->add_bos > 0 && d->bos == TOK_GGUF_ABSENT)
        return bfail(B, TIDE_E_FORMAT, K "add_bos_token is set but there is no " K "bos_token_id");
    if (add_eos && d->eos == TOK_GGUF_ABSENT)
        return bfail(B, TIDE_E_FORMAT, K "add_eos_token is set but there is no " K "eos_token_id");
    int32_t bos = add_bos && d->bos != TOK_GGUF_ABSENT ? (int32_t)d->bos : -1;
    int32_t eos = add_eos ? (int32_t)d->eos : -1;
    if ((bos >= 0 || eos >= 0) && !add_template(root, bos, eos)) return bnomem(B);
    return TIDE_OK;
}

/* ------------------------------------------------------------ build */

static tide_status finish(builder *B, tide_tokenizer *t, const int32_t *rank_of) {
    const tok_gguf_desc *d = B->d;
    /* llama: a token's splits share its rank (equal scores: leftmost first) */
    if (B->spm) {
        for (size_t i = 0; i < t->merges.cap; i++) {
            struct tok_mslot *m = &t->merges.slots[i];
            if (m->key != UINT64_MAX && m->id >= 0 && m->id < B->n) m->rank = rank_of[m->id];
        }
    }
    for (int32_t i = 0; i < B->n && i < t->n_vocab; i++) {
        if (t->pieces[i]) continue;
        if (!(t->pieces[i] = tide_strdup(B->tok[i]))) return bnomem(B);
        t->piece_len[i] = B->len[i];
    }
    t->bos = d->bos != TOK_GGUF_ABSENT ? (int32_t)d->bos : -1;
    t->eos = d->eos != TOK_GGUF_ABSENT ? (int32_t)d->eos : -1;
    int32_t stops[2] = {t->eos, d->eot != TOK_GGUF_ABSENT ? (int32_t)d->eot : -1};
    for (int k = 0; k < 2; k++) {
        if (stops[k] < 0 || (k && stops[k] == stops[0])) continue;
        int32_t *p = tide_realloc(t->eos_ids, (size_t)(t->n_eos + 1) * sizeof *p);
        if (!p) return bnomem(B);
        p[t->n_eos++] = stops[k];
        t->eos_ids = p;
    }
    if (t->eos < 0 && t->n_eos) t->eos = t->eos_ids[0];
    if (d->chat_template && !(t->chat_template = tide_strdup(d->chat_template))) return bnomem(B);
    return TIDE_OK;
}

tide_status tok_gguf_build(tide_ctx *ctx, const tok_gguf_desc *d, tide_tokenizer **out) {
    if (!d || !out) return tide_err(ctx, TIDE_E_INVALID, "tok_gguf_build: NULL argument");
    *out = NULL;
    builder B = {.ctx = ctx, .d = d};
    const pre_family *fam = NULL;
    tide_status st;
    if (!d->model) return bfail(&B, TIDE_E_FORMAT, "no key " K "model (the tokenizer's kind)");
    if (!strcmp(d->model, "llama")) {
        B.spm = true;
    } else if (!strcmp(d->model, "gpt2")) {
        if (!d->pre) return bfail(&B, TIDE_E_UNSUPPORTED, "no key " K "pre: the gpt2 tokenizer's pre-tokenizer is "
                                  "unknown (tide reads " PRE_NAMES ")");
        if (!(fam = find_pre(d->pre)))
            return bfail(&B, TIDE_E_UNSUPPORTED, K "pre '%s' is not supported (tide reads " PRE_NAMES ")", d->pre);
    } else {
        return bfail(&B, TIDE_E_UNSUPPORTED, K "model '%s' is not supported (tide reads 'llama' and 'gpt2')",
                     d->model);
    }
    if ((st = read_tokens(&B))) {
        builder_free(&B);
        return st;
    }
    int32_t *rank_of = B.spm ? tide_malloc((size_t)B.n * sizeof *rank_of) : NULL;
    cJSON *root = cJSON_CreateObject();
    tide_tokenizer *t = NULL;
    if (!root || (B.spm && !rank_of)) st = bnomem(&B);
    if (!st) st = build_tree(&B, root, fam, rank_of);
    if (!st) st = tok_new(ctx, d->source ? d->source : "GGUF metadata", &t);
    if (!st) st = tok_load_tree(t, root, true);
    if (!st) st = finish(&B, t, rank_of);
    cJSON_Delete(root);
    tide_free(rank_of);
    builder_free(&B);
    if (st) {
        tide_tokenizer_free(t);
        return st;
    }
    *out = t;
    return TIDE_OK;
}

/* ------------------------------------------------------------ from a file */

/* State of one read: the file, and the arrays the description points into. */
typedef struct reader {
    tide_ctx *ctx;
    tide_gguf *g;
    const char *path;
    const char **tokens, **merges;
    uint64_t *tokens_len, *merges_len;
    float *scores;
    int32_t *types;
    char *model, *pre, *chat_template;
} reader;

static tide_status rfail(reader *R, tide_status st, const char *key, const char *what) {
    return tide_err(R->ctx, st, "%s: key '%s' %s", R->path, key, what);
}

/* An optional array of elem_type: *n = -1 when absent. */
static tide_status opt_array(reader *R, const char *key, tide_gguf_type elem, const char *what, tide_gguf_value *arr,
                             int64_t *n) {
    uint64_t len;
    tide_gguf_type et;
    *n = -1;
    if (!tide_gguf_get(R->g, key, arr)) return TIDE_OK;
    if (!tide_gguf_value_array(arr, &len, &et) || len > (uint64_t)INT32_MAX) return rfail(R, TIDE_E_FORMAT, key, what);
    /* an empty array's element type is whatever the writer chose */
    if (len && et != elem && !(elem == TIDE_GGUF_I32 && (et == TIDE_GGUF_U32 || et == TIDE_GGUF_I8 ||
                                                         et == TIDE_GGUF_U8 || et == TIDE_GGUF_I16 ||
                                                         et == TIDE_GGUF_U16 || et == TIDE_GGUF_I64)) &&
        !(elem == TIDE_GGUF_F32 && et == TIDE_GGUF_F64))
        return rfail(R, TIDE_E_FORMAT, key, what);
    *n = (int64_t)len;
    return TIDE_OK;
}

static tide_status read_strings(reader *R, const char *key, const char ***out, uint64_t **lens, int64_t *n) {
    tide_gguf_value arr, e;
    tide_status st = opt_array(R, key, TIDE_GGUF_STRING, "is not an array of strings", &arr, n);
    if (st || *n < 0) return st;
    *out = tide_malloc((size_t)(*n ? *n : 1) * sizeof **out);
    *lens = tide_malloc((size_t)(*n ? *n : 1) * sizeof **lens);
    if (!*out || !*lens) return tide_err(R->ctx, TIDE_E_NOMEM, "%s: out of memory reading '%s'", R->path, key);
    for (int64_t i = 0; i < *n; i++)
        if (!tide_gguf_value_elem(&arr, (uint64_t)i, &e) || !tide_gguf_value_str(&e, &(*out)[i], &(*lens)[i]))
            return rfail(R, TIDE_E_FORMAT, key, "holds an element that is not a string");
    return TIDE_OK;
}

static tide_status opt_int(reader *R, const char *key, int64_t *out) {
    tide_gguf_value v;
    *out = TOK_GGUF_ABSENT;
    if (!tide_gguf_get(R->g, key, &v)) return TIDE_OK;
    if (!tide_gguf_value_int(&v, out) || *out == TOK_GGUF_ABSENT) return rfail(R, TIDE_E_FORMAT, key, "is not an integer");
    return TIDE_OK;
}

static tide_status opt_bool(reader *R, const char *key, int *out) {
    tide_gguf_value v;
    bool b;
    *out = -1;
    if (!tide_gguf_get(R->g, key, &v)) return TIDE_OK;
    if (!tide_gguf_value_bool(&v, &b)) return rfail(R, TIDE_E_FORMAT, key, "is not a bool");
    *out = b;
    return TIDE_OK;
}

static tide_status opt_str(reader *R, const char *key, char **out) {
    tide_gguf_value v;
    *out = NULL;
    if (!tide_gguf_get(R->g, key, &v)) return TIDE_OK;
    return tide_gguf_get_str_dup(R->g, key, out);
}

static tide_status read_desc(reader *R, tok_gguf_desc *d) {
    tide_status st;
    tide_gguf_value arr, e;
    int64_t n;
    d->source = R->path;
    if ((st = opt_str(R, K "model", &R->model)) || (st = opt_str(R, K "pre", &R->pre)) ||
        (st = opt_str(R, "tokenizer.chat_template", &R->chat_template)))
        return st;
    d->model = R->model;
    d->pre = R->pre;
    d->chat_template = R->chat_template;
    if ((st = read_strings(R, K "tokens", &R->tokens, &R->tokens_len, &d->n_tokens))) return st;
    if (d->n_tokens >= 0) {
        d->tokens = R->tokens;
        d->tokens_len = R->tokens_len;
    }
    if ((st = read_strings(R, K "merges", &R->merges, &R->merges_len, &d->n_merges))) return st;
    if (d->n_merges >= 0) {
        d->merges = R->merges;
        d->merges_len = R->merges_len;
    }
    if ((st = opt_array(R, K "scores", TIDE_GGUF_F32, "is not an array of floats", &arr, &n))) return st;
    if (n >= 0) {
        if (!(R->scores = tide_malloc((size_t)(n ? n : 1) * sizeof *R->scores)))
            return tide_err(R->ctx, TIDE_E_NOMEM, "%s: out of memory reading the scores", R->path);
        for (int64_t i = 0; i < n; i++) {
            double f;
            if (!tide_gguf_value_elem(&arr, (uint64_t)i, &e) || !tide_gguf_value_float(&e, &f))
                return rfail(R, TIDE_E_FORMAT, K "scores", "holds an element that is not a float");
            R->scores[i] = (float)f;
        }
        d->scores = R->scores;
        d->n_scores = n;
    }
    if ((st = opt_array(R, K "token_type", TIDE_GGUF_I32, "is not an array of integers", &arr, &n))) return st;
    if (n >= 0) {
        if (!(R->types = tide_malloc((size_t)(n ? n : 1) * sizeof *R->types)))
            return tide_err(R->ctx, TIDE_E_NOMEM, "%s: out of memory reading the token types", R->path);
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            if (!tide_gguf_value_elem(&arr, (uint64_t)i, &e) || !tide_gguf_value_int(&e, &v))
                return rfail(R, TIDE_E_FORMAT, K "token_type", "holds an element that is not an integer");
            R->types[i] = v < INT32_MIN || v > INT32_MAX ? -1 : (int32_t)v;
        }
        d->types = R->types;
        d->n_types = n;
    }
    if ((st = opt_int(R, K "bos_token_id", &d->bos)) || (st = opt_int(R, K "eos_token_id", &d->eos)) ||
        (st = opt_int(R, K "eot_token_id", &d->eot)) || (st = opt_int(R, K "unknown_token_id", &d->unk)) ||
        (st = opt_int(R, K "padding_token_id", &d->pad)) || (st = opt_bool(R, K "add_bos_token", &d->add_bos)) ||
        (st = opt_bool(R, K "add_eos_token", &d->add_eos)) ||
        (st = opt_bool(R, K "add_space_prefix", &d->add_space_prefix)))
        return st;
    return TIDE_OK;
}

tide_status tok_gguf_open(tide_ctx *ctx, const char *path, tide_tokenizer **out) {
    *out = NULL;
    reader R = {.ctx = ctx, .path = path};
    tok_gguf_desc d = {0};
    tide_status st = tide_gguf_open(ctx, path, &R.g);
    if (!st) st = read_desc(&R, &d);
    if (!st) st = tok_gguf_build(ctx, &d, out);
    tide_free(R.tokens);
    tide_free(R.tokens_len);
    tide_free(R.merges);
    tide_free(R.merges_len);
    tide_free(R.scores);
    tide_free(R.types);
    tide_free(R.model);
    tide_free(R.pre);
    tide_free(R.chat_template);
    tide_gguf_close(R.g);
    return st;
}
