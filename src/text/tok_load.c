/*
 * tok_load.c - a Hugging Face tokenizer.json (and the config files beside it)
 * into a tide_tokenizer.
 *
 * What is read, and what each part becomes (tok_int.h):
 *   model            BPE only: vocab (string -> id), merges ("a b" strings or
 *                    [a, b] pairs; rank = position), unk_token, fuse_unk,
 *                    byte_fallback, ignore_merges. dropout, a continuing
 *                    subword prefix or an end-of-word suffix are refused.
 *   added_tokens     content, special, lstrip, rstrip, single_word, normalized
 *                    (normalized contents are passed through the normalizer, as
 *                    `tokenizers` matches them on normalized text); the id is
 *                    the one `tokenizers` assigns on loading (read_added), which
 *                    the file's "id" equals in every file it writes
 *   normalizer       Sequence, NFC (utf8proc), Prepend, Replace (String or
 *                    Regex pattern); NFD, NFKC, NFKD and the rest are refused
 *   pre_tokenizer    Sequence, Split (Regex or String; every behavior; invert),
 *                    Digits (a Split on \p{N}, Isolated or Contiguous),
 *                    ByteLevel (last: the model then works on bytes, see
 *                    below), Metaspace
 *   post_processor   TemplateProcessing (single template), Roberta/Bert
 *                    (cls ... sep), ByteLevel (nothing for ids), Sequence
 *   decoder          Sequence, ByteLevel, Replace (String), ByteFallback, Fuse,
 *                    Strip (from the start only, after Fuse), Metaspace
 *   truncation, padding: ignored, as transformers' fast tokenizers reset them.
 * Every other type is TIDE_E_UNSUPPORTED naming it and where it sits.
 *
 * Byte-level vocabularies spell each byte as a printable character (GPT-2's
 * table, utf8.c). The model here works on the bytes themselves: the symbol
 * map (t->vocab) holds each entry's bytes, so a word needs no translation to
 * the table's characters and back. Entries that are not spelled in the table
 * (added tokens' own strings) cannot come out of BPE on bytes and are kept out
 * of the symbol map; the names map (every piece, for tide_tokenizer_find and
 * the merges) keeps them.
 * The config files beside it (BOS, EOS, stop ids): tok_config.c.
 */
#include "text/tok_int.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TOKENIZER_JSON_MAX (512ull << 20)

/* State of one load: the tokenizer, its file, and the names map. */
typedef struct loader {
    tide_tokenizer *t;
    const char *file;
    tok_smap names;       /* every piece -> id (vocabulary and added tokens) */
    int32_t model_n;      /* entries of the model's vocabulary */
    bool has_template;    /* the post-processor adds tokens */
    bool explicit_ids;    /* added tokens keep their "id" (a tree built by tok_gguf.c) */
} loader;

static tide_status fail(loader *L, tide_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static tide_status fail(loader *L, tide_status st, const char *fmt, ...) {
    char msg[TIDE_ERRMSG_MAX - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tide_err(L->t->ctx, st, "%s: %s", L->file, msg);
}

static tide_status nomem(loader *L) { return fail(L, TIDE_E_NOMEM, "out of memory"); }

/* ------------------------------------------------------------ JSON helpers */

static const char *type_of(const cJSON *o) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static bool get_bool(const cJSON *o, const char *k, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static const char *get_str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A pattern object {"String": s} or {"Regex": r}. */
static tide_status get_pattern(loader *L, const cJSON *o, const char *where, const char **pat, bool *literal) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *s;
    if ((s = get_str(p, "String"))) {
        *pat = s;
        *literal = true;
    } else if ((s = get_str(p, "Regex"))) {
        *pat = s;
        *literal = false;
    } else {
        return fail(L, TIDE_E_FORMAT, "%s: missing pattern (an object with \"String\" or \"Regex\")", where);
    }
    return TIDE_OK;
}

/* One character, as a UTF-8 string of at most 4 bytes, into out[8]. */
static tide_status get_char(loader *L, const char *s, const char *where, char out[8]) {
    size_t n = s ? strlen(s) : 0, m;
    bool inc;
    if (!n || tok_utf8_next((const uint8_t *)s, n, &m, &inc) != (int)n)
        return fail(L, TIDE_E_FORMAT, "%s: expected one character, got '%s'", where, s ? s : "(none)");
    memcpy(out, s, n + 1);
    return TIDE_OK;
}

static tide_status get_scheme(loader *L, const cJSON *o, const char *where, tok_prepend_scheme *sc) {
    const char *s = get_str(o, "prepend_scheme");
    if (!s) { /* the older form */
        *sc = get_bool(o, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        return TIDE_OK;
    }
    if (!strcmp(s, "always")) *sc = TOK_PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *sc = TOK_PREPEND_FIRST;
    else if (!strcmp(s, "never")) *sc = TOK_PREPEND_NEVER;
    else return fail(L, TIDE_E_UNSUPPORTED, "%s: prepend_scheme '%s' is not supported", where, s);
    return TIDE_OK;
}

/* Calls fn on every element of a Sequence (key names its list) or on o. */
typedef tide_status (*part_fn)(loader *L, const cJSON *o);
static tide_status each_part(loader *L, const cJSON *o, const char *what, const char *key, part_fn fn) {
    if (!cJSON_IsObject(o)) return fail(L, TIDE_E_FORMAT, "%s is not an object", what);
    const char *ty = type_of(o);
    if (ty && !strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, key);
        if (!cJSON_IsArray(list)) return fail(L, TIDE_E_FORMAT, "%s Sequence without a \"%s\" list", what, key);
        const cJSON *e;
        cJSON_ArrayForEach(e, list) {
            tide_status st = each_part(L, e, what, key, fn);
            if (st) return st;
        }
        return TIDE_OK;
    }
    if (!ty) return fail(L, TIDE_E_FORMAT, "%s without a \"type\"", what);
    return fn(L, o);
}

static int grow_array(void **arr, int n, size_t elem) {
    void *p = tide_realloc(*arr, (size_t)(n + 1) * elem);
    if (!p) return -1;
    *arr = p;
    return 0;
}

/* ------------------------------------------------------------ normalizer */

static tide_status add_norm(loader *L, const cJSON *o) {
    tide_tokenizer *t = L->t;
    const char *ty = type_of(o);
    tok_norm nm = {0};
    if (!strcmp(ty, "Prepend")) {
        const char *p = get_str(o, "prepend");
        if (!p) return fail(L, TIDE_E_FORMAT, "normalizer Prepend without a \"prepend\" string");
        if (!tok_utf8_valid((const uint8_t *)p, strlen(p)))
            return fail(L, TIDE_E_FORMAT, "normalizer Prepend: \"prepend\" is not valid UTF-8");
        nm.kind = TOK_NORM_PREPEND;
        if (!(nm.str = tide_strdup(p))) return nomem(L);
    } else if (!strcmp(ty, "Replace")) {
        const char *pat = NULL, *content = get_str(o, "content");
        bool lit = false;
        tide_status st = get_pattern(L, o, "normalizer Replace", &pat, &lit);
        if (st) return st;
        if (!content) return fail(L, TIDE_E_FORMAT, "normalizer Replace without a \"content\" string");
        if (!tok_utf8_valid((const uint8_t *)content, strlen(content)))
            return fail(L, TIDE_E_FORMAT, "normalizer Replace: \"content\" is not valid UTF-8");
        nm.kind = TOK_NORM_REPLACE;
        if (!(nm.str = tide_strdup(content))) return nomem(L);
        if ((st = tok_regex_compile(t, "normalizer Replace pattern", pat, lit, &nm.re))) {
            tide_free(nm.str);
            return st;
        }
    } else if (!strcmp(ty, "NFC")) {
        nm.kind = TOK_NORM_NFC;
    } else {
        return fail(L, TIDE_E_UNSUPPORTED,
                    "normalizer %s is not supported (tide supports Sequence, NFC, Prepend and Replace)", ty);
    }
    if (grow_array((void **)&t->norm, t->n_norm, sizeof *t->norm)) {
        tide_free(nm.str);
        tok_regex_free(&nm.re);
        return nomem(L);
    }
    t->norm[t->n_norm++] = nm;
    return TIDE_OK;
}

/* ------------------------------------------------------------ pre-tokenizer */

/* GPT-2's split, which ByteLevel applies when use_regex is set. */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static tide_status add_pre(loader *L, const cJSON *o) {
    tide_tokenizer *t = L->t;
    const char *ty = type_of(o);
    tok_pre p = {0};
    tide_status st;
    if (t->n_pre && t->pre[t->n_pre - 1].kind == TOK_PRE_BYTELEVEL)
        return fail(L, TIDE_E_UNSUPPORTED, "pre_tokenizer %s after ByteLevel is not supported (ByteLevel must be last)",
                    ty);
    if (!strcmp(ty, "Split")) {
        const char *pat = NULL, *beh = get_str(o, "behavior");
        bool lit = false;
        if ((st = get_pattern(L, o, "pre_tokenizer Split", &pat, &lit))) return st;
        p.kind = TOK_PRE_SPLIT;
        p.invert = get_bool(o, "invert", false);
        if (!beh) return fail(L, TIDE_E_FORMAT, "pre_tokenizer Split without a \"behavior\"");
        if (!strcmp(beh, "Removed")) p.behavior = TOK_SPLIT_REMOVED;
        else if (!strcmp(beh, "Isolated")) p.behavior = TOK_SPLIT_ISOLATED;
        else if (!strcmp(beh, "MergedWithPrevious")) p.behavior = TOK_SPLIT_MERGED_PREV;
        else if (!strcmp(beh, "MergedWithNext")) p.behavior = TOK_SPLIT_MERGED_NEXT;
        else if (!strcmp(beh, "Contiguous")) p.behavior = TOK_SPLIT_CONTIGUOUS;
        else return fail(L, TIDE_E_UNSUPPORTED, "pre_tokenizer Split behavior '%s' is not supported", beh);
        if ((st = tok_regex_compile(t, "pre_tokenizer Split pattern", pat, lit, &p.re))) return st;
    } else if (!strcmp(ty, "ByteLevel")) {
        p.kind = TOK_PRE_BYTELEVEL;
        p.add_prefix_space = get_bool(o, "add_prefix_space", true);
        p.use_regex = get_bool(o, "use_regex", true);
        p.behavior = TOK_SPLIT_ISOLATED;
        if (p.use_regex && (st = tok_regex_compile(t, "pre_tokenizer ByteLevel regex", gpt2_regex, false, &p.re)))
            return st;
        t->byte_level = true;
    } else if (!strcmp(ty, "Digits")) {
        /* numeric characters (char::is_numeric: \p{N}) split off, each alone or in runs */
        p.kind = TOK_PRE_SPLIT;
        p.behavior = get_bool(o, "individual_digits", false) ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS;
        if ((st = tok_regex_compile(t, "pre_tokenizer Digits", "\\p{N}", false, &p.re))) return st;
    } else if (!strcmp(ty, "Metaspace")) {
        p.kind = TOK_PRE_METASPACE;
        if ((st = get_char(L, get_str(o, "replacement"), "pre_tokenizer Metaspace replacement", p.rep))) return st;
        if ((st = get_scheme(L, o, "pre_tokenizer Metaspace", &p.scheme))) return st;
        p.split = get_bool(o, "split", true);
    } else {
        return fail(L, TIDE_E_UNSUPPORTED,
                    "pre_tokenizer %s is not supported (tide supports Sequence, Split, Digits, ByteLevel and "
                    "Metaspace)",
                    ty);
    }
    if (grow_array((void **)&t->pre, t->n_pre, sizeof *t->pre)) {
        tok_regex_free(&p.re);
        return nomem(L);
    }
    t->pre[t->n_pre++] = p;
    return TIDE_OK;
}

/* ------------------------------------------------------------ decoder */

static tide_status add_dec(loader *L, const cJSON *o) {
    tide_tokenizer *t = L->t;
    const char *ty = type_of(o);
    tok_dec d = {0};
    tide_status st;
    if (!strcmp(ty, "ByteLevel")) {
        d.kind = TOK_DEC_BYTELEVEL;
    } else if (!strcmp(ty, "ByteFallback")) {
        d.kind = TOK_DEC_BYTEFALLBACK;
    } else if (!strcmp(ty, "Fuse")) {
        d.kind = TOK_DEC_FUSE;
    } else if (!strcmp(ty, "Replace")) {
        const char *pat = NULL, *content = get_str(o, "content");
        bool lit = false;
        if ((st = get_pattern(L, o, "decoder Replace", &pat, &lit))) return st;
        if (!lit) return fail(L, TIDE_E_UNSUPPORTED, "decoder Replace with a Regex pattern is not supported");
        if (!content || !*pat) return fail(L, TIDE_E_FORMAT, "decoder Replace without a pattern or content");
        d.kind = TOK_DEC_REPLACE;
        d.from = tide_strdup(pat);
        d.to = tide_strdup(content);
        if (!d.from || !d.to) {
            tide_free(d.from);
            tide_free(d.to);
            return nomem(L);
        }
    } else if (!strcmp(ty, "Metaspace")) {
        d.kind = TOK_DEC_METASPACE;
        if ((st = get_char(L, get_str(o, "replacement"), "decoder Metaspace replacement", d.rep))) return st;
        if ((st = get_scheme(L, o, "decoder Metaspace", &d.scheme))) return st;
    } else if (!strcmp(ty, "Strip")) {
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(o, "start");
        const cJSON *stop = cJSON_GetObjectItemCaseSensitive(o, "stop");
        d.kind = TOK_DEC_STRIP;
        if ((st = get_char(L, get_str(o, "content"), "decoder Strip content", d.strip))) return st;
        if (!cJSON_IsNumber(start) || start->valuedouble < 0 || start->valuedouble > 1e6)
            return fail(L, TIDE_E_FORMAT, "decoder Strip without a valid \"start\"");
        if (cJSON_IsNumber(stop) && stop->valuedouble != 0)
            return fail(L, TIDE_E_UNSUPPORTED, "decoder Strip from the end (stop %g) is not supported",
                        stop->valuedouble);
        bool fused = false;
        for (int i = 0; i < t->n_dec; i++) fused |= t->dec[i].kind == TOK_DEC_FUSE;
        if (!fused) return fail(L, TIDE_E_UNSUPPORTED, "decoder Strip before a Fuse (per token) is not supported");
        d.strip_start = (int)start->valuedouble;
    } else {
        return fail(L, TIDE_E_UNSUPPORTED,
                    "decoder %s is not supported (tide supports Sequence, ByteLevel, Replace, ByteFallback, Fuse, "
                    "Strip and Metaspace)",
                    ty);
    }
    if (grow_array((void **)&t->dec, t->n_dec, sizeof *t->dec)) {
        tide_free(d.from);
        tide_free(d.to);
        return nomem(L);
    }
    t->dec[t->n_dec++] = d;
    return TIDE_OK;
}

/* ------------------------------------------------------------ post-processor */

static tide_status append_ids(loader *L, int32_t **arr, int *n, const int32_t *ids, int k) {
    int32_t *p = tide_realloc(*arr, (size_t)(*n + k + 1) * sizeof *p);
    if (!p) return nomem(L);
    memcpy(p + *n, ids, (size_t)k * sizeof *ids);
    *arr = p;
    *n += k;
    return TIDE_OK;
}

static tide_status add_post(loader *L, const cJSON *o) {
    tide_tokenizer *t = L->t;
    const char *ty = type_of(o);
    tide_status st;
    if (!strcmp(ty, "ByteLevel")) return TIDE_OK; /* offsets only */
    if (L->has_template)
        return fail(L, TIDE_E_UNSUPPORTED, "post_processor: a second post-processor adding tokens (%s)", ty);
    if (!strcmp(ty, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single");
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
        if (!cJSON_IsArray(single)) return fail(L, TIDE_E_FORMAT, "post_processor TemplateProcessing without \"single\"");
        bool seen_a = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, single) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
            if (sq) {
                if (seen_a) return fail(L, TIDE_E_UNSUPPORTED, "post_processor template with two sequences");
                seen_a = true;
                continue;
            }
            const char *name = get_str(sp, "id");
            if (!name) return fail(L, TIDE_E_FORMAT, "post_processor template item is neither a Sequence nor a SpecialToken");
            const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
            if (!cJSON_IsArray(ids))
                return fail(L, TIDE_E_FORMAT, "post_processor template names '%s', which special_tokens does not define",
                            name);
            const cJSON *x;
            cJSON_ArrayForEach(x, ids) {
                if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= INT32_MAX)
                    return fail(L, TIDE_E_FORMAT, "post_processor special token '%s': bad id", name);
                int32_t id = (int32_t)x->valuedouble;
                if ((st = seen_a ? append_ids(L, &t->suffix, &t->n_suffix, &id, 1)
                                 : append_ids(L, &t->prefix, &t->n_prefix, &id, 1)))
                    return st;
            }
        }
        if (!seen_a) return fail(L, TIDE_E_FORMAT, "post_processor template without the sequence $A");
    } else if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(o, "cls");
        const cJSON *sep = cJSON_GetObjectItemCaseSensitive(o, "sep");
        const cJSON *ci = cJSON_GetArrayItem(cls, 1), *si = cJSON_GetArrayItem(sep, 1);
        if (!cJSON_IsNumber(ci) || !cJSON_IsNumber(si))
            return fail(L, TIDE_E_FORMAT, "post_processor %s without [token, id] pairs for cls and sep", ty);
        int32_t c = (int32_t)ci->valuedouble, s = (int32_t)si->valuedouble;
        if ((st = append_ids(L, &t->prefix, &t->n_prefix, &c, 1))) return st;
        if ((st = append_ids(L, &t->suffix, &t->n_suffix, &s, 1))) return st;
    } else {
        return fail(L, TIDE_E_UNSUPPORTED,
                    "post_processor %s is not supported (tide supports TemplateProcessing, RobertaProcessing, "
                    "BertProcessing, ByteLevel and Sequence)",
                    ty);
    }
    L->has_template = true;
    return TIDE_OK;
}

/* ------------------------------------------------------------ model */

static tide_status set_piece(loader *L, int32_t id, const char *s) {
    tide_tokenizer *t = L->t;
    char *c = tide_strdup(s);
    if (!c) return nomem(L);
    tide_free(t->pieces[id]);
    t->pieces[id] = c;
    t->piece_len[id] = (uint32_t)strlen(s);
    return TIDE_OK;
}

static tide_status read_vocab(loader *L, const cJSON *vocab) {
    tide_tokenizer *t = L->t;
    int64_t max_id = -1;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (1 << 30) ||
            e->valuedouble != (double)(int64_t)e->valuedouble)
            return fail(L, TIDE_E_FORMAT, "model.vocab: entry '%s' has no valid id", e->string);
        if ((int64_t)e->valuedouble > max_id) max_id = (int64_t)e->valuedouble;
        n++;
    }
    if (n == 0) return fail(L, TIDE_E_FORMAT, "model.vocab is empty");
    t->n_vocab = (int32_t)(max_id + 1);
    if (tok_smap_init(&t->vocab, (size_t)n) || tok_smap_init(&L->names, (size_t)n)) return nomem(L);
    uint8_t *buf = NULL;
    size_t cap = 0;
    tide_status st = TIDE_OK;
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = (int32_t)e->valuedouble;
        const char *s = e->string;
        size_t len = strlen(s);
        if (tok_smap_put(&L->names, s, len, id)) goto oom;
        if (!t->byte_level) {
            if (tok_smap_put(&t->vocab, s, len, id)) goto oom;
        } else {
            if (len > cap) {
                uint8_t *b = tide_realloc(buf, len);
                if (!b) goto oom;
                buf = b;
                cap = len;
            }
            long k = tok_bytelevel_bytes(s, buf);
            if (k >= 0 && tok_smap_put(&t->vocab, buf, (size_t)k, id)) goto oom;
        }
    }
    tide_free(buf);
    L->model_n = (int32_t)L->names.n;
    return st;
oom:
    tide_free(buf);
    return nomem(L);
}

static int32_t name_id(loader *L, const char *s) { return tok_smap_get(&L->names, s, strlen(s)); }

static tide_status read_merges(loader *L, const cJSON *merges) {
    tide_tokenizer *t = L->t;
    int n = cJSON_GetArraySize(merges);
    if (tok_mmap_init(&t->merges, (size_t)n)) return nomem(L);
    char *joined = NULL;
    size_t cap = 0;
    int rank = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || sp == e->valuestring || !sp[1] || strchr(sp + 1, ' ')) {
                tide_free(joined);
                return fail(L, TIDE_E_FORMAT, "model.merges[%d] '%s' is not two tokens separated by a space", rank,
                            e->valuestring);
            }
            a = e->valuestring;
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring;
            b = cJSON_GetArrayItem(e, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            tide_free(joined);
            return fail(L, TIDE_E_FORMAT, "model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", rank);
        }
        if (la + lb + 1 > cap) {
            cap = (la + lb + 1) * 2;
            char *j = tide_realloc(joined, cap);
            if (!j) {
                tide_free(joined);
                return nomem(L);
            }
            joined = j;
        }
        memcpy(joined, a, la);
        joined[la] = 0;
        int32_t ia = tok_smap_get(&L->names, joined, la);
        int32_t ib = tok_smap_get(&L->names, b, lb);
        memcpy(joined + la, b, lb);
        joined[la + lb] = 0;
        int32_t ij = tok_smap_get(&L->names, joined, la + lb);
        if (ia < 0 || ib < 0 || ij < 0) {
            joined[la] = 0;
            tide_status st = fail(L, TIDE_E_FORMAT, "model.merges[%d]: '%s' is not in the vocabulary", rank,
                                  ia < 0 ? joined : ib < 0 ? b : joined);
            if (ij < 0 && ia >= 0 && ib >= 0) {
                memcpy(joined + la, b, lb);
                joined[la + lb] = 0;
                st = fail(L, TIDE_E_FORMAT, "model.merges[%d]: the merged token '%s' is not in the vocabulary", rank,
                          joined);
            }
            tide_free(joined);
            return st;
        }
        if (tok_mmap_put(&t->merges, ia, ib, rank, ij) < 0) {
            tide_free(joined);
            return nomem(L);
        }
        rank++;
    }
    tide_free(joined);
    return TIDE_OK;
}

/* SentencePiece-style words are whole normalized texts: BPE over megabytes
 * at once. When no vocabulary entry holds the marker U+2581 after another
 * character, no merge can join a character to a marker that follows it, so
 * cutting the word before each run of markers changes nothing (each part's
 * merges are the ones the whole would make there) and lets the parts be
 * cached as words are. */
#define SP_MARK "\xe2\x96\x81"
static bool marks_lead(const char *s, size_t n) {
    size_t i = 0;
    while (i + 3 <= n && !memcmp(s + i, SP_MARK, 3)) i += 3;
    for (; i + 3 <= n; i++)
        if (!memcmp(s + i, SP_MARK, 3)) return false;
    return true;
}

static tide_status read_model(loader *L, const cJSON *m) {
    tide_tokenizer *t = L->t;
    if (!cJSON_IsObject(m)) return fail(L, TIDE_E_FORMAT, "no \"model\" object");
    const char *ty = type_of(m);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (ty && strcmp(ty, "BPE"))
        return fail(L, TIDE_E_UNSUPPORTED, "model type %s is not supported (tide reads BPE models)", ty);
    if (!ty && !cJSON_IsArray(merges))
        return fail(L, TIDE_E_UNSUPPORTED, "model without a type or merges is not supported (tide reads BPE models)");
    if (!cJSON_IsObject(vocab)) return fail(L, TIDE_E_FORMAT, "model.vocab is not an object");
    if (!cJSON_IsArray(merges)) return fail(L, TIDE_E_FORMAT, "model.merges is not a list");
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble != 0)
        return fail(L, TIDE_E_UNSUPPORTED, "model.dropout %g is not supported (encoding would be random)",
                    drop->valuedouble);
    const char *pre = get_str(m, "continuing_subword_prefix"), *suf = get_str(m, "end_of_word_suffix");
    if (pre && *pre) return fail(L, TIDE_E_UNSUPPORTED, "model.continuing_subword_prefix '%s' is not supported", pre);
    if (suf && *suf) return fail(L, TIDE_E_UNSUPPORTED, "model.end_of_word_suffix '%s' is not supported", suf);
    t->byte_fallback = get_bool(m, "byte_fallback", false);
    t->fuse_unk = get_bool(m, "fuse_unk", false);
    t->ignore_merges = get_bool(m, "ignore_merges", false);
    tide_status st = read_vocab(L, vocab);
    if (st) return st;
    t->pieces = tide_calloc((size_t)t->n_vocab, sizeof *t->pieces);
    t->piece_len = tide_calloc((size_t)t->n_vocab, sizeof *t->piece_len);
    t->flags = tide_calloc((size_t)t->n_vocab, 1);
    if (!t->pieces || !t->piece_len || !t->flags) return nomem(L);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) if ((st = set_piece(L, (int32_t)e->valuedouble, e->string))) return st;
    if ((st = read_merges(L, merges))) return st;
    t->sp_cut = !t->byte_level && !t->ignore_merges && tok_smap_get(&t->vocab, SP_MARK, 3) >= 0;
    for (size_t i = 0; t->sp_cut && i < t->vocab.cap; i++) {
        const struct tok_sslot *e = &t->vocab.slots[i];
        if (e->len != UINT32_MAX && !marks_lead(t->vocab.keys + e->off, e->len)) t->sp_cut = false;
    }
    const char *unk = get_str(m, "unk_token");
    t->unk_id = -1;
    if (unk && (t->unk_id = tok_smap_get(&L->names, unk, strlen(unk))) < 0)
        return fail(L, TIDE_E_FORMAT, "model.unk_token '%s' is not in the vocabulary", unk);
    for (int b = 0; b < 256; b++) {
        char s[8];
        if (t->byte_level) {
            s[tok_utf8_put(tok_byte_char((uint8_t)b), (uint8_t *)s)] = 0;
        } else {
            snprintf(s, sizeof s, "<0x%02X>", b);
        }
        t->byte_id[b] = (t->byte_level || t->byte_fallback) ? name_id(L, s) : -1;
    }
    return TIDE_OK;
}

/* ------------------------------------------------------------ added tokens */

static tide_status grow_vocab(loader *L, int32_t id) {
    tide_tokenizer *t = L->t;
    if (id < t->n_vocab) return TIDE_OK;
    size_t n = (size_t)id + 1;
    char **p = tide_realloc(t->pieces, n * sizeof *p);
    if (!p) return nomem(L);
    t->pieces = p;
    uint32_t *pl = tide_realloc(t->piece_len, n * sizeof *pl);
    if (!pl) return nomem(L);
    t->piece_len = pl;
    uint8_t *f = tide_realloc(t->flags, n);
    if (!f) return nomem(L);
    t->flags = f;
    for (size_t i = (size_t)t->n_vocab; i < n; i++) {
        p[i] = NULL;
        pl[i] = 0;
        f[i] = 0;
    }
    t->n_vocab = (int32_t)n;
    return TIDE_OK;
}

static tide_status read_added(loader *L, const cJSON *list) {
    tide_tokenizer *t = L->t;
    if (!list || cJSON_IsNull(list)) return TIDE_OK;
    if (!cJSON_IsArray(list)) return fail(L, TIDE_E_FORMAT, "added_tokens is not a list");
    int n = cJSON_GetArraySize(list);
    t->added = tide_calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added) return nomem(L);
    const cJSON *e;
    int i = 0;
    int32_t max_added = -1;
    tide_status st;
    cJSON_ArrayForEach(e, list) {
        const char *content = get_str(e, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!content || !*content || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 30))
            return fail(L, TIDE_E_FORMAT, "added_tokens[%d] without a content or a valid id", i);
        /* text is cut at its matches before PCRE2 reads it unchecked: it must
         * cut between characters */
        if (!tok_utf8_valid((const uint8_t *)content, strlen(content)))
            return fail(L, TIDE_E_FORMAT, "added_tokens[%d]: content is not valid UTF-8", i);
        tok_added *a = &t->added[t->n_added];
        /* the id `tokenizers` gives it, whatever the file says (they agree in
         * every file it writes): the id its content already has, else one past
         * the largest added id, or the vocabulary's size for the first */
        int32_t known = tok_smap_get(&L->names, content, strlen(content));
        if (L->explicit_ids) a->id = (int32_t)id->valuedouble;
        else if (known >= 0) a->id = known;
        else if (max_added < 0 || (max_added < L->model_n && L->model_n)) a->id = L->model_n;
        else a->id = max_added + 1;
        if (a->id > max_added) max_added = a->id;
        a->special = get_bool(e, "special", false);
        a->lstrip = get_bool(e, "lstrip", false);
        a->rstrip = get_bool(e, "rstrip", false);
        a->single_word = get_bool(e, "single_word", false);
        a->normalized = get_bool(e, "normalized", !a->special);
        if (!(a->content = tide_strdup(content))) return nomem(L);
        a->len = strlen(content);
        t->n_added++;
        if ((st = grow_vocab(L, a->id))) return st;
        if ((st = set_piece(L, a->id, content))) return st;
        t->flags[a->id] |= TOK_F_ADDED | (a->special ? TOK_F_SPECIAL : 0);
        if (tok_smap_put(&L->names, content, a->len, a->id)) return nomem(L);
        i++;
    }
    /* normalized contents are matched on normalized text */
    for (int k = 0; k < t->n_added; k++) {
        tok_added *a = &t->added[k];
        if (!a->normalized || !t->n_norm) continue;
        const uint8_t *out;
        size_t on;
        tok_arena_reset(&t->arena);
        if ((st = tok_normalize(t, (const uint8_t *)a->content, a->len, &out, &on))) return st;
        char *c = tide_malloc(on + 1);
        if (!c) return nomem(L);
        memcpy(c, out, on);
        c[on] = 0;
        tide_free(a->content);
        a->content = c;
        a->len = on;
    }
    if (tok_added_pass_build(t, &t->pass_raw, false) || tok_added_pass_build(t, &t->pass_norm, true))
        return nomem(L);
    return TIDE_OK;
}

/* ------------------------------------------------------------ open / free */

static tide_status load(loader *L, const cJSON *root) {
    tide_tokenizer *t = L->t;
    tide_status st;
    const cJSON *o;
    o = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (o && !cJSON_IsNull(o) && (st = each_part(L, o, "normalizer", "normalizers", add_norm))) return st;
    o = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (o && !cJSON_IsNull(o) && (st = each_part(L, o, "pre_tokenizer", "pretokenizers", add_pre))) return st;
    o = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (o && !cJSON_IsNull(o)) {
        if ((st = each_part(L, o, "decoder", "decoders", add_dec))) return st;
    } else {
        t->dec_join_space = true;
    }
    o = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (o && !cJSON_IsNull(o) && (st = each_part(L, o, "post_processor", "processors", add_post))) return st;
    if ((st = read_model(L, cJSON_GetObjectItemCaseSensitive(root, "model")))) return st;
    if ((st = read_added(L, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")))) return st;
    for (int i = 0; i < t->n_prefix; i++)
        if (t->prefix[i] >= t->n_vocab) return fail(L, TIDE_E_FORMAT, "post_processor id %d outside the vocabulary", t->prefix[i]);
    for (int i = 0; i < t->n_suffix; i++)
        if (t->suffix[i] >= t->n_vocab) return fail(L, TIDE_E_FORMAT, "post_processor id %d outside the vocabulary", t->suffix[i]);
    return TIDE_OK;
}

tide_status tok_new(tide_ctx *ctx, const char *path, tide_tokenizer **out) {
    *out = NULL;
    tide_tokenizer *t = tide_calloc(1, sizeof *t);
    if (!t) return tide_err(ctx, TIDE_E_NOMEM, "out of memory opening the tokenizer %s", path);
    t->ctx = ctx;
    t->bos = t->eos = t->unk_id = -1;
    snprintf(t->json_path, sizeof t->json_path, "%s", path);
    t->md = pcre2_match_data_create(1, NULL);
    t->cache = tide_calloc(TOK_CACHE_SLOTS, sizeof *t->cache);
    if (!t->md || !t->cache) {
        tide_tokenizer_free(t);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory opening the tokenizer %s", path);
    }
    if (tok_regex_compile(t, "word characters", "\\w", false, &t->word_re)) {
        tide_tokenizer_free(t);
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "PCRE2 without Unicode support");
    }
    *out = t;
    return TIDE_OK;
}

tide_status tok_load_tree(tide_tokenizer *t, const cJSON *root, bool explicit_ids) {
    loader L = {.t = t, .file = t->json_path, .explicit_ids = explicit_ids};
    tide_status st = load(&L, root);
    tok_smap_free(&L.names);
    return st;
}

/* A GGUF file: named *.gguf (so that a missing one is named as such), or a
 * regular file that starts with GGUF's magic. */
static bool is_gguf_path(const char *path) {
    size_t n = strlen(path);
    if (n > 5 && !strcmp(path + n - 5, ".gguf")) return true;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return false;
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    bool gguf = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f) fclose(f);
    return gguf;
}

tide_status tide_tokenizer_open(tide_ctx *ctx, const char *path, tide_tokenizer **out) {
    if (!path || !out) return tide_err(ctx, TIDE_E_INVALID, "tide_tokenizer_open: NULL argument");
    *out = NULL;
    if (is_gguf_path(path)) return tok_gguf_open(ctx, path, out);
    char dir[4096], json[4096];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(json, sizeof json, "%s/tokenizer.json", path);
    } else if (stat(path, &sb) != 0 && (strlen(path) < 5 || strcmp(path + strlen(path) - 5, ".json"))) {
        /* neither a directory nor a file: name the file a directory would hold */
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(json, sizeof json, "%s/tokenizer.json", path);
    } else {
        snprintf(json, sizeof json, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    tide_tokenizer *t;
    tide_status st = tok_new(ctx, json, &t);
    if (st) return st;
    cJSON *root;
    if ((st = tok_read_json(ctx, t->json_path, TOKENIZER_JSON_MAX, false, &root))) {
        tide_tokenizer_free(t);
        return st;
    }
    st = tok_load_tree(t, root, false);
    cJSON_Delete(root);
    if (!st) st = tok_read_configs(t, dir);
    if (st) {
        tide_tokenizer_free(t);
        return st;
    }
    *out = t;
    return TIDE_OK;
}

void tide_tokenizer_free(tide_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; t->pieces && i < t->n_vocab; i++) tide_free(t->pieces[i]);
    tide_free(t->pieces);
    tide_free(t->piece_len);
    tide_free(t->flags);
    tok_smap_free(&t->vocab);
    tok_mmap_free(&t->merges);
    for (int i = 0; i < t->n_norm; i++) {
        tide_free(t->norm[i].str);
        tok_regex_free(&t->norm[i].re);
    }
    tide_free(t->norm);
    for (int i = 0; i < t->n_pre; i++) tok_regex_free(&t->pre[i].re);
    tide_free(t->pre);
    for (int i = 0; i < t->n_dec; i++) {
        tide_free(t->dec[i].from);
        tide_free(t->dec[i].to);
    }
    tide_free(t->dec);
    for (int i = 0; i < t->n_added; i++) tide_free(t->added[i].content);
    tide_free(t->added);
    tide_free(t->pass_raw.order);
    tide_free(t->pass_norm.order);
    tok_regex_free(&t->word_re);
    tide_free(t->prefix);
    tide_free(t->suffix);
    tide_free(t->eos_ids);
    tide_free(t->chat_template);
    if (t->md) pcre2_match_data_free(t->md);
    tide_free(t->cache);
    tok_arena_free(&t->arena);
    tide_free(t->out);
    tide_free(t->syms);
    tide_free(t->heap);
    tide_free(t);
}

