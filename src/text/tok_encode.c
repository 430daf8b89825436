/*
 * tok_encode.c - text to ids, as Hugging Face `tokenizers` computes them.
 *
 * The pipeline, each stage feeding the next piece by piece (no list of the
 * whole input's words is ever built):
 *
 *   input --(invalid UTF-8: each maximal invalid subpart -> U+FFFD)
 *     -> added tokens that are not "normalized", on the raw text  (match_added)
 *     -> each text segment: normalizer                           (tok_normalize)
 *     -> added tokens that are "normalized", on the normalized text
 *     -> each text piece: pre-tokenizer steps, in order          (pre_run)
 *     -> each word: BPE                                          (bpe_word)
 *     -> post-processor template around the whole               (encode)
 *
 * Invariants the stages keep, as `tokenizers` does:
 *   T1  Empty pieces are dropped at every stage: a normalizer never sees an
 *       empty segment (so Prepend adds nothing to it), nor a model an empty word.
 *   T2  Added tokens are matched leftmost-longest; a match that is skipped
 *       (special tokens read as text, single_word failing) is not searched
 *       again for shorter tokens inside it.
 *   T3  A piece's at_start flag is set only on the piece that begins at offset
 *       0 of the original input (Metaspace's prepend_scheme "first").
 *   T4  BPE merges the adjacent pair of lowest rank, leftmost first, until no
 *       pair has a merge (a heap of candidate pairs, entries checked when
 *       popped); with ignore_merges a word found whole in the vocabulary is
 *       that token.
 *   T5  The byte-level model works on bytes (tok_load.c): a word's initial
 *       symbols are its bytes' tokens, which is exactly the vocabulary's
 *       character-per-byte spelling read back.
 *   T6  A SentencePiece-style word (a whole normalized segment) is cut before
 *       each run of U+2581 only when no vocabulary entry could span the cut
 *       (tok_load.c, sp_cut): the same merges happen either way.
 *
 * Words of at most TOK_CACHE_WORD bytes are cached (direct-mapped, by hash)
 * with their ids: natural text repeats most words.
 */
#include "text/tok_int.h"

#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------ arena */

void *tok_arena_alloc(tok_arena *a, size_t n) {
    if (a->n && a->used + n <= a->sizes[a->n - 1]) {
        void *p = a->blocks[a->n - 1] + a->used;
        a->used += n;
        return p;
    }
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 8;
        uint8_t **b = tide_realloc(a->blocks, (size_t)cap * sizeof *b);
        if (!b) return NULL;
        a->blocks = b;
        size_t *s = tide_realloc(a->sizes, (size_t)cap * sizeof *s);
        if (!s) return NULL;
        a->sizes = s;
        a->cap = cap;
    }
    size_t size = n > (64u << 10) ? n : (64u << 10);
    uint8_t *p = tide_malloc(size);
    if (!p) return NULL;
    a->blocks[a->n] = p;
    a->sizes[a->n++] = size;
    a->used = n;
    return p;
}

/* Keeps the first block. */
void tok_arena_reset(tok_arena *a) {
    for (int i = 1; i < a->n; i++) tide_free(a->blocks[i]);
    a->n = a->n ? 1 : 0;
    a->used = 0;
}

void tok_arena_free(tok_arena *a) {
    for (int i = 0; i < a->n; i++) tide_free(a->blocks[i]);
    tide_free(a->blocks);
    tide_free(a->sizes);
    memset(a, 0, sizeof *a);
}

static tide_status oom(tide_tokenizer *t) { return tide_err(t->ctx, TIDE_E_NOMEM, "tokenizer: out of memory"); }

static tide_status regex_fail(tide_tokenizer *t, const char *what, int rc) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(rc, buf, sizeof buf);
    return tide_err(t->ctx, TIDE_E_INVALID, "%s: %s failed on the input: %s", t->json_path, what,
                    (const char *)buf);
}

static tide_status emit_id(tide_tokenizer *t, int32_t id) {
    if (t->n_out == t->cap_out) {
        size_t cap = t->cap_out ? t->cap_out * 2 : 1024;
        int32_t *p = tide_realloc(t->out, cap * sizeof *p);
        if (!p) return oom(t);
        t->out = p;
        t->cap_out = cap;
    }
    t->out[t->n_out++] = id;
    return TIDE_OK;
}

static int char_len(const uint8_t *s, size_t n) {
    size_t m;
    bool inc;
    int l = tok_utf8_next(s, n, &m, &inc);
    return l ? l : 1;
}

/* ------------------------------------------------------------ BPE */

static void heap_push(struct tok_heap_ent *h, size_t *n, struct tok_heap_ent e) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < e.rank || (h[p].rank == e.rank && h[p].pos <= e.pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct tok_heap_ent heap_pop(struct tok_heap_ent *h, size_t *n) {
    struct tok_heap_ent top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos)))
            c++;
        if (last.rank < h[c].rank || (last.rank == h[c].rank && last.pos <= h[c].pos)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

/* Appends a symbol; unknown ones (id < 0) become unk per fuse_unk, or are
 * dropped when the model has no unk token (as `tokenizers` drops them). */
static size_t add_sym(tide_tokenizer *t, size_t n, int32_t id, bool *last_unk) {
    if (id < 0) {
        if (t->unk_id < 0) return n;
        if (t->fuse_unk && *last_unk) return n;
        id = t->unk_id;
        *last_unk = true;
    } else {
        *last_unk = false;
    }
    t->syms[n] = (struct tok_sym){id, (int32_t)n - 1, (int32_t)n + 1, 0};
    return n + 1;
}

static tide_status bpe_word(tide_tokenizer *t, const uint8_t *w, size_t n) {
    tok_cache_slot *slot = NULL;
    uint64_t h = 0;
    tide_status st;
    if (n <= TOK_CACHE_WORD) {
        h = tok_hash(w, n);
        slot = &t->cache[h & (TOK_CACHE_SLOTS - 1)];
        if (slot->len == n && slot->hash == h && !memcmp(slot->word, w, n)) {
            for (int i = 0; i < slot->n_ids; i++)
                if ((st = emit_id(t, slot->ids[i]))) return st;
            return TIDE_OK;
        }
    }
    if (n >= INT32_MAX / 4) /* symbol positions are int32 */
        return tide_err(t->ctx, TIDE_E_INVALID, "tokenizer: a word of %zu bytes is too long", n);
    size_t first = t->n_out;
    int32_t whole = t->ignore_merges ? tok_smap_get(&t->vocab, w, n) : -1;
    if (whole >= 0) {
        if ((st = emit_id(t, whole))) return st;
        goto cache;
    }
    if (n + 1 > t->cap_syms) {
        size_t cap = (n + 1) * 2;
        struct tok_sym *sy = tide_realloc(t->syms, cap * sizeof *sy);
        if (!sy) return oom(t);
        t->syms = sy;
        t->cap_syms = cap;
    }
    size_t ns = 0;
    bool last_unk = false;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) ns = add_sym(t, ns, t->byte_id[w[i]], &last_unk);
    } else {
        for (size_t i = 0; i < n;) {
            int l = char_len(w + i, n - i);
            int32_t id = tok_smap_get(&t->vocab, w + i, (size_t)l);
            if (id < 0 && t->byte_fallback) {
                bool all = true;
                for (int k = 0; k < l; k++) all &= t->byte_id[w[i + k]] >= 0;
                if (all) {
                    for (int k = 0; k < l; k++) ns = add_sym(t, ns, t->byte_id[w[i + k]], &last_unk);
                    i += (size_t)l;
                    continue;
                }
            }
            ns = add_sym(t, ns, id, &last_unk);
            i += (size_t)l;
        }
    }
    if (!ns) goto cache;
    t->syms[ns - 1].next = -1;
    /* heap room: the initial pairs plus at most two per merge */
    if (ns * 3 > t->cap_heap) {
        struct tok_heap_ent *he = tide_realloc(t->heap, ns * 6 * sizeof *he);
        if (!he) return oom(t);
        t->heap = he;
        t->cap_heap = ns * 6;
    }
    struct tok_sym *sy = t->syms;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const struct tok_mslot *m = tok_mmap_get(&t->merges, sy[i].id, sy[i + 1].id);
        if (m) heap_push(t->heap, &nh, (struct tok_heap_ent){m->rank, (int32_t)i, m->id});
    }
    while (nh) {
        struct tok_heap_ent e = heap_pop(t->heap, &nh);
        struct tok_sym *a = &sy[e.pos];
        if (a->id < 0 || a->next < 0) continue;
        struct tok_sym *b = &sy[a->next];
        const struct tok_mslot *m = tok_mmap_get(&t->merges, a->id, b->id);
        if (!m || m->id != e.id) continue;
        a->id = e.id;
        b->id = -1;
        a->next = b->next;
        if (a->next >= 0) sy[a->next].prev = e.pos;
        if (a->prev >= 0 && (m = tok_mmap_get(&t->merges, sy[a->prev].id, a->id)))
            heap_push(t->heap, &nh, (struct tok_heap_ent){m->rank, a->prev, m->id});
        if (a->next >= 0 && (m = tok_mmap_get(&t->merges, a->id, sy[a->next].id)))
            heap_push(t->heap, &nh, (struct tok_heap_ent){m->rank, e.pos, m->id});
    }
    for (int32_t i = 0; i >= 0; i = sy[i].next)
        if ((st = emit_id(t, sy[i].id))) return st;
cache:
    if (slot && t->n_out - first <= TOK_CACHE_IDS) {
        slot->hash = h;
        slot->len = (uint8_t)n;
        slot->n_ids = (uint8_t)(t->n_out - first);
        memcpy(slot->word, w, n);
        if (t->n_out > first) /* t->out is NULL until an id is emitted */
            memcpy(slot->ids, t->out + first, (t->n_out - first) * sizeof *t->out);
    }
    return TIDE_OK;
}

/* A word to the model: whole, or cut before each run of U+2581 (sp_cut). */
static tide_status model_word(tide_tokenizer *t, const uint8_t *w, size_t n) {
    if (!t->sp_cut) return bpe_word(t, w, n);
    static const uint8_t mark[3] = {0xE2, 0x96, 0x81};
    size_t start = 0, i = 0;
    tide_status st;
    while (i < n) {
        if (i + 3 <= n && !memcmp(w + i, mark, 3)) {
            if (i > start && (st = bpe_word(t, w + start, i - start))) return st;
            start = i;
            while (i + 3 <= n && !memcmp(w + i, mark, 3)) i += 3;
        } else {
            i++;
        }
    }
    return start < n ? bpe_word(t, w + start, n - start) : TIDE_OK;
}

/* ------------------------------------------------------------ pre-tokenizer */

/* The splitting state of one step over one piece (tok_split_behavior). */
typedef struct splitter {
    tide_tokenizer *t;
    int step;
    const tok_piece *in;
    tok_split_behavior behavior;
    bool invert;
    bool have, pending_match; /* a pending part [pa, pb) and whether it was a match */
    size_t pa, pb;
    bool prev_match;
} splitter;

static tide_status pre_run(tide_tokenizer *t, int step, const tok_piece *p);

static tide_status split_emit(splitter *s, size_t a, size_t b) {
    if (a >= b) return TIDE_OK;
    tok_piece q = {s->in->p + a, b - a, s->in->at_start && a == 0};
    return pre_run(s->t, s->step + 1, &q);
}

static tide_status split_part(splitter *s, size_t a, size_t b, bool match) {
    tide_status st = TIDE_OK;
    if (s->invert) match = !match;
    switch (s->behavior) {
    case TOK_SPLIT_ISOLATED: return split_emit(s, a, b);
    case TOK_SPLIT_REMOVED: return match ? TIDE_OK : split_emit(s, a, b);
    case TOK_SPLIT_MERGED_PREV:
        if (match && !s->prev_match && s->have) {
            s->pb = b;
        } else {
            if (s->have) st = split_emit(s, s->pa, s->pb);
            s->have = true;
            s->pa = a;
            s->pb = b;
        }
        s->prev_match = match;
        return st;
    case TOK_SPLIT_MERGED_NEXT:
        /* a match joins the part after it when that part is not a match */
        if (s->have) {
            if (!match) {
                st = split_emit(s, s->pa, b);
                s->have = false;
                return st;
            }
            st = split_emit(s, s->pa, s->pb);
            s->have = false;
        }
        if (match) {
            s->have = true;
            s->pa = a;
            s->pb = b;
            return st;
        }
        return st ? st : split_emit(s, a, b);
    case TOK_SPLIT_CONTIGUOUS:
        if (s->have && match == s->prev_match) {
            s->pb = b;
        } else {
            if (s->have) st = split_emit(s, s->pa, s->pb);
            s->have = true;
            s->pa = a;
            s->pb = b;
        }
        s->prev_match = match;
        return st;
    }
    return TIDE_OK;
}

static tide_status split_end(splitter *s) {
    if (!s->have) return TIDE_OK;
    s->have = false;
    return split_emit(s, s->pa, s->pb);
}

/* Splits p at the matches of re (or of the literal lit, when re is NULL). */
static tide_status split_piece(tide_tokenizer *t, int step, const tok_piece *p, const tok_regex *re, const char *lit,
                               tok_split_behavior behavior, bool invert, const char *what) {
    splitter s = {.t = t, .step = step, .in = p, .behavior = behavior, .invert = invert};
    size_t prev = 0, from = 0, ll = lit ? strlen(lit) : 0;
    tide_status st;
    while (from <= p->n) {
        size_t ms, me;
        if (re) {
            int rc = tok_regex_find(t, re, p->p, p->n, from, &ms, &me);
            if (rc < 0) return regex_fail(t, what, rc);
            if (rc == 0) break;
        } else {
            const uint8_t *f = memmem(p->p + from, p->n - from, lit, ll);
            if (!f) break;
            ms = (size_t)(f - p->p);
            me = ms + ll;
        }
        if (me == ms) { /* an empty match splits nothing */
            if (ms >= p->n) break;
            from = ms + (size_t)char_len(p->p + ms, p->n - ms);
            continue;
        }
        if (prev < ms && (st = split_part(&s, prev, ms, false))) return st;
        if ((st = split_part(&s, ms, me, true))) return st;
        prev = from = me;
    }
    if (prev < p->n && (st = split_part(&s, prev, p->n, false))) return st;
    return split_end(&s);
}

/* Runs pre-tokenizer steps step.. on p, then the model on what comes out. */
static tide_status pre_run(tide_tokenizer *t, int step, const tok_piece *p) {
    if (!p->n) return TIDE_OK;
    if (step == t->n_pre) return model_word(t, p->p, p->n);
    const tok_pre *pr = &t->pre[step];
    switch (pr->kind) {
    case TOK_PRE_SPLIT:
        return split_piece(t, step, p, &pr->re, NULL, pr->behavior, pr->invert, "pre_tokenizer Split regex");
    case TOK_PRE_BYTELEVEL: {
        tok_piece q = *p;
        if (pr->add_prefix_space && p->p[0] != ' ') {
            uint8_t *b = tok_arena_alloc(&t->arena, p->n + 1);
            if (!b) return oom(t);
            b[0] = ' ';
            memcpy(b + 1, p->p, p->n);
            q.p = b;
            q.n = p->n + 1;
        }
        if (!pr->use_regex) return pre_run(t, step + 1, &q);
        return split_piece(t, step, &q, &pr->re, NULL, TOK_SPLIT_ISOLATED, false, "pre_tokenizer ByteLevel regex");
    }
    case TOK_PRE_METASPACE: {
        size_t rl = strlen(pr->rep), spaces = 0;
        for (size_t i = 0; i < p->n; i++) spaces += p->p[i] == ' ';
        uint8_t *b = tok_arena_alloc(&t->arena, p->n + spaces * rl + rl);
        if (!b) return oom(t);
        size_t k = 0;
        for (size_t i = 0; i < p->n; i++) {
            if (p->p[i] == ' ') {
                memcpy(b + k, pr->rep, rl);
                k += rl;
            } else {
                b[k++] = p->p[i];
            }
        }
        bool starts = k >= rl && !memcmp(b, pr->rep, rl);
        bool prepend = !starts && (pr->scheme == TOK_PREPEND_ALWAYS || (pr->scheme == TOK_PREPEND_FIRST && p->at_start));
        if (prepend) {
            memmove(b + rl, b, k);
            memcpy(b, pr->rep, rl);
            k += rl;
        }
        tok_piece q = {b, k, p->at_start};
        if (!pr->split) return pre_run(t, step + 1, &q);
        return split_piece(t, step, &q, NULL, pr->rep, TOK_SPLIT_MERGED_NEXT, false, "pre_tokenizer Metaspace");
    }
    }
    return TIDE_OK;
}

/* ------------------------------------------------------------ normalizer */

/* NFC through utf8proc. Characters below U+0300 are their own NFC, never
 * reorder, and never compose with the character before them (every second
 * element of a composition, a combining mark or a jamo, is at U+0300 or
 * above), so the text is cut before each of them: only runs of characters from
 * U+0300 up, with the character before each run (a base a mark may compose
 * with), go through utf8proc (canonical decomposition, then composition). In
 * UTF-8 a character below U+0300 is a byte below 0x80 or starts with 0xC2 to
 * 0xCB. */
static bool nfc_stable(uint8_t lead) { return lead < 0x80 || (lead >= 0xC2 && lead <= 0xCB); }

/* The next run [*a, *b) at or after *i that needs utf8proc; false when none.
 * *i moves past it. */
static bool nfc_run(const uint8_t *s, size_t n, size_t *i, size_t *a, size_t *b) {
    size_t prev = SIZE_MAX, k = *i;
    while (k < n && nfc_stable(s[k])) {
        prev = k;
        k += (size_t)char_len(s + k, n - k);
    }
    if (k >= n) return false;
    *a = prev != SIZE_MAX ? prev : k;
    while (k < n && !nfc_stable(s[k])) k += (size_t)char_len(s + k, n - k);
    *b = *i = k;
    return true;
}

static tide_status nfc(tide_tokenizer *t, const uint8_t **sp, size_t *np) {
    const uint8_t *s = *sp;
    size_t n = *np, i = 0, a, b, out_max = n, cps_max = 0;
    utf8proc_option_t o = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    bool any = false;
    while (nfc_run(s, n, &i, &a, &b)) { /* sizes */
        utf8proc_ssize_t cps = utf8proc_decompose(s + a, (utf8proc_ssize_t)(b - a), NULL, 0, o);
        if (cps < 0) return tide_err(t->ctx, TIDE_E_INVALID, "normalizer NFC: %s", utf8proc_errmsg(cps));
        out_max += (size_t)cps * 4;
        if ((size_t)cps > cps_max) cps_max = (size_t)cps;
        any = true;
    }
    if (!any) return TIDE_OK;
    uint8_t *out = tok_arena_alloc(&t->arena, out_max);
    utf8proc_int32_t *cp = tok_arena_alloc(&t->arena, cps_max * 4 + 4);
    if (!out || !cp) return oom(t);
    size_t k = 0, done = 0;
    i = 0;
    while (nfc_run(s, n, &i, &a, &b)) {
        memcpy(out + k, s + done, a - done);
        k += a - done;
        utf8proc_ssize_t cps = utf8proc_decompose(s + a, (utf8proc_ssize_t)(b - a), cp, (utf8proc_ssize_t)cps_max, o);
        utf8proc_ssize_t len = cps < 0 ? cps : utf8proc_reencode(cp, cps, o);
        if (len < 0) return tide_err(t->ctx, TIDE_E_INVALID, "normalizer NFC: %s", utf8proc_errmsg(len));
        memcpy(out + k, cp, (size_t)len);
        k += (size_t)len;
        done = b;
    }
    memcpy(out + k, s + done, n - done);
    *sp = out;
    *np = k + n - done;
    return TIDE_OK;
}

tide_status tok_normalize(tide_tokenizer *t, const uint8_t *s, size_t n, const uint8_t **out, size_t *out_n) {
    for (int i = 0; i < t->n_norm && n; i++) {
        const tok_norm *nm = &t->norm[i];
        if (nm->kind == TOK_NORM_NFC) {
            tide_status st = nfc(t, &s, &n);
            if (st) return st;
            continue;
        }
        size_t sl = strlen(nm->str);
        if (nm->kind == TOK_NORM_PREPEND) {
            uint8_t *b = tok_arena_alloc(&t->arena, n + sl);
            if (!b) return oom(t);
            memcpy(b, nm->str, sl);
            memcpy(b + sl, s, n);
            s = b;
            n += sl;
            continue;
        }
        /* REPLACE: count the matches, then write */
        size_t from = 0, count = 0, removed = 0, ms, me;
        int rc;
        while (from < n && (rc = tok_regex_find(t, &nm->re, s, n, from, &ms, &me)) == 1) {
            if (me == ms) {
                from = ms + (size_t)char_len(s + ms, n - ms);
                continue;
            }
            count++;
            removed += me - ms;
            from = me;
        }
        if (from < n && rc < 0) return regex_fail(t, "normalizer Replace pattern", rc);
        if (!count) continue;
        uint8_t *b = tok_arena_alloc(&t->arena, n - removed + count * sl);
        if (!b) return oom(t);
        size_t k = 0, prev = 0;
        from = 0;
        while (from < n && tok_regex_find(t, &nm->re, s, n, from, &ms, &me) == 1) {
            if (me == ms) {
                from = ms + (size_t)char_len(s + ms, n - ms);
                continue;
            }
            memcpy(b + k, s + prev, ms - prev);
            k += ms - prev;
            memcpy(b + k, nm->str, sl);
            k += sl;
            prev = from = me;
        }
        memcpy(b + k, s + prev, n - prev);
        k += n - prev;
        s = b;
        n = k;
    }
    *out = s;
    *out_n = n;
    return TIDE_OK;
}

/* ------------------------------------------------------------ added tokens */

static int cmp_len_desc(const void *a, const void *b, void *arg) {
    const tok_added *ad = arg;
    const tok_added *x = &ad[*(const int *)a], *y = &ad[*(const int *)b];
    if ((uint8_t)x->content[0] != (uint8_t)y->content[0])
        return (uint8_t)x->content[0] < (uint8_t)y->content[0] ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

int tok_added_pass_build(tide_tokenizer *t, tok_added_pass *pass, bool normalized) {
    pass->n = 0;
    pass->order = tide_malloc(((size_t)t->n_added + 1) * sizeof *pass->order);
    if (!pass->order) return -1;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].len) pass->order[pass->n++] = i;
    qsort_r(pass->order, (size_t)pass->n, sizeof *pass->order, cmp_len_desc, t->added);
    memset(pass->first, 0, sizeof pass->first);
    int k = 0;
    for (int b = 0; b < 256; b++) {
        pass->first[b] = k;
        while (k < pass->n && (uint8_t)t->added[pass->order[k]].content[0] == b) k++;
    }
    pass->first[256] = k;
    return 0;
}

static bool is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Start of the run of whitespace that ends s[0..n). */
static size_t space_run_start(const uint8_t *s, size_t n) {
    while (n) {
        size_t k = n - 1;
        while (k && (s[k] & 0xC0) == 0x80) k--;
        size_t m;
        bool inc;
        int l = tok_utf8_next(s + k, n - k, &m, &inc);
        if (!l || !is_space(tok_utf8_decode(s + k, l))) break;
        n = k;
    }
    return n;
}

static size_t space_run_len(const uint8_t *s, size_t n) {
    size_t i = 0, m;
    bool inc;
    while (i < n) {
        int l = tok_utf8_next(s + i, n - i, &m, &inc);
        if (!l || !is_space(tok_utf8_decode(s + i, l))) break;
        i += (size_t)l;
    }
    return i;
}

static bool word_char_at(tide_tokenizer *t, const uint8_t *s, size_t n, size_t at) {
    int l = char_len(s + at, n - at);
    int rc = t->word_re.jit
                 ? pcre2_jit_match(t->word_re.code, s + at, (size_t)l, 0, PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, t->md, NULL)
                 : pcre2_match(t->word_re.code, s + at, (size_t)l, 0, PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, t->md, NULL);
    return rc >= 0;
}

static bool ends_with_word(tide_tokenizer *t, const uint8_t *s, size_t n) {
    if (!n) return false;
    size_t k = n - 1;
    while (k && (s[k] & 0xC0) == 0x80) k--;
    return word_char_at(t, s, n, k);
}

static tide_status process_segment(tide_tokenizer *t, const uint8_t *s, size_t n, bool at_start, unsigned flags);

/* Splits s[0..n) at the added tokens of pass; text between them goes to
 * process_segment (pass_raw) or to the pre-tokenizer (pass_norm). */
static tide_status match_added(tide_tokenizer *t, const tok_added_pass *pass, const uint8_t *s, size_t n, bool at_start,
                               unsigned flags, bool raw) {
    size_t start_off = 0, pos = 0;
    tide_status st;
    while (pass->n && pos < n) {
        size_t ms = 0, me = 0;
        const tok_added *hit = NULL;
        for (size_t i = pos; i < n && !hit; i++) {
            int lo = pass->first[s[i]], hi = pass->first[s[i] + 1];
            for (int k = lo; k < hi; k++) {
                const tok_added *a = &t->added[pass->order[k]];
                if (a->len <= n - i && !memcmp(s + i, a->content, a->len)) {
                    hit = a;
                    ms = i;
                    me = i + a->len;
                    break;
                }
            }
        }
        if (!hit) break;
        pos = me;
        if (hit->special && (flags & TIDE_TOKENIZE_SPECIAL_AS_TEXT)) continue;
        if (hit->single_word &&
            ((ms > 0 && ends_with_word(t, s, ms)) || (me < n && word_char_at(t, s, n, me))))
            continue;
        size_t a = ms, b = me;
        if (hit->lstrip) {
            a = space_run_start(s, ms);
            if (a < start_off) a = start_off;
        }
        if (hit->rstrip) b += space_run_len(s + me, n - me);
        if (start_off < a) {
            st = raw ? process_segment(t, s + start_off, a - start_off, at_start && start_off == 0, flags)
                     : pre_run(t, 0, &(tok_piece){s + start_off, a - start_off, at_start && start_off == 0});
            if (st) return st;
        }
        if ((st = emit_id(t, hit->id))) return st;
        start_off = b;
    }
    if (start_off >= n) return TIDE_OK;
    return raw ? process_segment(t, s + start_off, n - start_off, at_start && start_off == 0, flags)
               : pre_run(t, 0, &(tok_piece){s + start_off, n - start_off, at_start && start_off == 0});
}

static tide_status process_segment(tide_tokenizer *t, const uint8_t *s, size_t n, bool at_start, unsigned flags) {
    const uint8_t *ns;
    size_t nn;
    tide_status st = tok_normalize(t, s, n, &ns, &nn);
    if (st) return st;
    return match_added(t, &t->pass_norm, ns, nn, at_start, flags, false);
}

/* ------------------------------------------------------------ encode */

/* text with each maximal invalid subpart replaced by U+FFFD, in the arena */
static const uint8_t *lossy(tide_tokenizer *t, const uint8_t *s, size_t n, size_t *out_n) {
    uint8_t *b = n < SIZE_MAX / 4 ? tok_arena_alloc(&t->arena, n * 3 + 1) : NULL;
    if (!b) return NULL;
    size_t i = 0, k = 0, m;
    bool inc;
    while (i < n) {
        int l = tok_utf8_next(s + i, n - i, &m, &inc);
        if (l) {
            memcpy(b + k, s + i, (size_t)l);
            k += (size_t)l;
            i += (size_t)l;
        } else {
            k += (size_t)tok_utf8_put(0xFFFD, b + k);
            i += m;
        }
    }
    *out_n = k;
    return b;
}

tide_status tide_tokenizer_encode(tide_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t *ids,
                                  size_t cap, size_t *n_ids) {
    if (!t || (!text && len) || !n_ids || (!ids && cap))
        return tide_err(t ? t->ctx : NULL, TIDE_E_INVALID, "tide_tokenizer_encode: NULL argument");
    if (flags & ~(unsigned)(TIDE_TOKENIZE_ADD_SPECIAL | TIDE_TOKENIZE_SPECIAL_AS_TEXT))
        return tide_err(t->ctx, TIDE_E_INVALID, "tide_tokenizer_encode: unknown flags 0x%x", flags);
    *n_ids = 0;
    t->n_out = 0;
    tok_arena_reset(&t->arena);
    tide_status st = TIDE_OK;
    const uint8_t *s = (const uint8_t *)(text ? text : "");
    size_t n = len;
    if (!tok_utf8_valid(s, n) && !(s = lossy(t, s, n, &n))) return oom(t);
    if (flags & TIDE_TOKENIZE_ADD_SPECIAL)
        for (int i = 0; i < t->n_prefix && !st; i++) st = emit_id(t, t->prefix[i]);
    if (!st && n) st = match_added(t, &t->pass_raw, s, n, true, flags, true);
    if (flags & TIDE_TOKENIZE_ADD_SPECIAL)
        for (int i = 0; i < t->n_suffix && !st; i++) st = emit_id(t, t->suffix[i]);
    if (st) return st;
    *n_ids = t->n_out;
    if (ids && cap && t->n_out) memcpy(ids, t->out, TIDE_MIN(cap, t->n_out) * sizeof *ids);
    return TIDE_OK;
}
